//! What this kernel allows, found by trying: tiny programs of each type
//! loaded (and attached where that is harmless), never a kernel version.
//! `sonde doctor` prints it; each tool reads it to say which mechanism it
//! would use here.
use std::mem::MaybeUninit;

use libbpf_rs::{
    skel::{OpenSkel, SkelBuilder},
    MapCore, MapFlags, MapHandle, MapType, OpenObject,
};
use serde_json::{json, Value};

use crate::engine::{
    attach::{Mechanism, Mechanisms},
    features,
};

crate::skeleton!("probe");
use skel::ProbeSkelBuilder;

/// Result of one check.
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

#[derive(Clone, Copy)]
enum Probe {
    Fentry,
    Kprobe,
    TpBtf,
    RawTp,
    Tracepoint,
    PerfEvent,
    Uprobe,
}

/// Whether an fentry program loads and attaches here (the detail, or why not).
pub fn fentry_attaches() -> Result<String, String> {
    try_probe(Probe::Fentry)
}

/// Loads one probe program alone and attaches it where that is harmless.
fn try_probe(which: Probe) -> Result<String, String> {
    let storage: &mut MaybeUninit<OpenObject> = &mut MaybeUninit::uninit();
    let mut open = ProbeSkelBuilder::default().open(storage).map_err(|e| format!("{e:#}"))?;
    {
        let p = &mut open.progs;
        for (prog, on) in [
            (&mut p.probe_fentry, matches!(which, Probe::Fentry)),
            (&mut p.probe_kprobe, matches!(which, Probe::Kprobe)),
            (&mut p.probe_tp_btf, matches!(which, Probe::TpBtf)),
            (&mut p.probe_raw_tp, matches!(which, Probe::RawTp)),
            (&mut p.probe_tracepoint, matches!(which, Probe::Tracepoint)),
            (&mut p.probe_perf_event, matches!(which, Probe::PerfEvent)),
            (&mut p.probe_uprobe, matches!(which, Probe::Uprobe)),
        ] {
            prog.set_autoload(on);
        }
    }
    let skel = open.load().map_err(|e| format!("load: {e:#}"))?;
    let p = &skel.progs;
    let r = match which {
        Probe::Fentry => p.probe_fentry.attach().map(drop),
        Probe::Kprobe => p.probe_kprobe.attach().map(drop),
        Probe::TpBtf => p.probe_tp_btf.attach().map(drop),
        Probe::RawTp => p.probe_raw_tp.attach().map(drop),
        Probe::Tracepoint => p.probe_tracepoint.attach().map(drop),
        Probe::PerfEvent => return perf_event_attach(&p.probe_perf_event),
        Probe::Uprobe => {
            return if features::has_uprobes() {
                Ok("program loads; uprobe PMU present".into())
            } else {
                Err("program loads but /sys/bus/event_source/devices/uprobe is missing".into())
            }
        }
    };
    r.map(|_| "loads and attaches".into()).map_err(|e| crate::engine::error::plain(&format!("attach: {e:#}")))
}

/// Opens a cpu-clock sampling event on CPU 0 and attaches the program to it.
fn perf_event_attach(prog: &libbpf_rs::ProgramMut<'_>) -> Result<String, String> {
    let fd = crate::engine::perf::open_sampling(0, crate::engine::perf::Counter::CpuClock, 49)
        .map_err(|e| format!("perf_event_open: {e}"))?;
    // A link owns the event fd and closes it when dropped; on failure it is ours.
    prog.attach_perf_event(fd).map(drop).map(|_| "cpu-clock sampling attaches".into()).map_err(|e| {
        // SAFETY: our own fd, not taken by a link.
        unsafe { libc::close(fd) };
        format!("attach: {e:#}")
    })
}

fn ringbuf_ok() -> Result<String, String> {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        ..Default::default()
    };
    MapHandle::create(MapType::RingBuf, Some("sonde_probe"), 0, 0, 4096, &opts)
        .map(|m| {
            let _ = m.lookup(&[], MapFlags::ANY);
            "BPF_MAP_TYPE_RINGBUF creates".to_string()
        })
        .map_err(|e| format!("{e:#}"))
}

fn check(name: &'static str, r: Result<String, String>) -> Check {
    match r {
        Ok(detail) => Check { name, ok: true, detail },
        Err(detail) => Check { name, ok: false, detail },
    }
}

fn yesno(name: &'static str, ok: bool, yes: &str, no: &str) -> Check {
    Check { name, ok, detail: if ok { yes.into() } else { no.into() } }
}

/// What this kernel allows, found by loading (and where harmless attaching)
/// tiny programs; each tool reads it to say how it would run here.
pub struct Caps {
    /// Whether sonde may trace at all.
    pub privileged: bool,
    checks: Vec<Check>,
}

impl Caps {
    /// Runs every check (the probes load real programs when privileged);
    /// `table_walk` tries to load the stack tools' program with the walk
    /// of unwind tables.
    pub fn probe(table_walk: impl FnOnce() -> anyhow::Result<()>) -> Caps {
        let privileged = features::can_trace();
        let mut checks = vec![
            yesno(
                "privileges",
                privileged,
                "CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN",
                "missing CAP_BPF/CAP_PERFMON (and CAP_SYS_ADMIN): run as root",
            ),
            yesno(
                "btf",
                features::has_btf(),
                features::VMLINUX_BTF,
                "no /sys/kernel/btf/vmlinux: CO-RE and tp_btf unavailable",
            ),
            check(
                "tracefs",
                features::tracefs()
                    .map(|p| p.display().to_string())
                    .ok_or_else(|| "not mounted and cannot mount".into()),
            ),
            yesno(
                "bpf_stats",
                features::sysctl("kernel/bpf_stats_enabled").is_some(),
                &format!(
                    "kernel.bpf_stats_enabled={}",
                    features::sysctl("kernel/bpf_stats_enabled").unwrap_or_default()
                ),
                "no kernel.bpf_stats_enabled sysctl",
            ),
            // A failing check that does not stop anything: it says what every
            // tracer on this kernel cannot see.
            yesno(
                "sees_pid1",
                !features::init_hides_tracing(),
                "tracing programs run whatever task is on the CPU",
                "this kernel skips tracing programs while a thread of PID 1 is on the CPU (bpf_prog_aux.init_owned): \
                 softirq work that interrupts PID 1 reaches no tracer; retrans counts it afterwards as unseen_segs",
            ),
        ];
        if privileged {
            checks.push(check("tp_btf", try_probe(Probe::TpBtf)));
            checks.push(check("raw_tp", try_probe(Probe::RawTp)));
            checks.push(check("tracepoint", try_probe(Probe::Tracepoint)));
            checks.push(check(
                "kprobe",
                if features::has_kprobes() {
                    try_probe(Probe::Kprobe)
                } else {
                    Err("kernel built without CONFIG_KPROBES (no kprobe PMU, no kprobe_events)".into())
                },
            ));
            checks.push(check("fentry", try_probe(Probe::Fentry)));
            checks.push(check("uprobe", try_probe(Probe::Uprobe)));
            checks.push(check("perf_event", try_probe(Probe::PerfEvent)));
            checks.push(check("ringbuf", ringbuf_ok()));
            checks.push(check(
                "unwind",
                table_walk()
                    .map(|()| {
                        "user stacks walk .eh_frame tables in BPF (profile's program with the walk loads)".to_string()
                    })
                    .map_err(|e| format!("{e:#}; stack tools use frame pointers only (--unwind dwarf refused)")),
            ));
        }
        Caps { privileged, checks }
    }

    /// Every check: its name, whether it passed, and the detail.
    pub fn checks(&self) -> impl Iterator<Item = (&'static str, bool, &str)> {
        self.checks.iter().map(|c| (c.name, c.ok, c.detail.as_str()))
    }

    /// Whether the check of this name passed (tp_btf, raw_tp, tracepoint,
    /// kprobe, fentry, uprobe, perf_event, ringbuf, unwind, ...).
    pub fn ok(&self, name: &str) -> bool {
        self.checks.iter().any(|c| c.name == name && c.ok)
    }

    /// The first of a tool's mechanisms whose probe program loads here.
    pub fn first(&self, list: &Mechanisms) -> Option<(Mechanism, &'static str)> {
        list.iter().copied().find(|(m, _)| self.ok(m.name()))
    }

    /// A stack tool's report with how user stacks are walked here.
    pub fn with_unwind(&self, mut v: Value) -> Value {
        let (mode, detail) = if self.ok("unwind") {
            ("tables", "unwind tables from each executable's .eh_frame/.debug_frame, frame pointers where a frame has none (--unwind auto)")
        } else {
            ("frame_pointers", "frame pointers only: the table walk does not load here (see unwind above)")
        };
        if v["usable"] == json!(true) {
            v["unwind"] = json!(mode);
            v["detail"] = json!(format!("{}; user stacks: {detail}", v["detail"].as_str().unwrap_or("")));
        }
        v
    }
}

/// A tool that cannot run here, and why.
pub fn cannot(why: impl Into<String>) -> Value {
    json!({"usable": false, "why": why.into()})
}
