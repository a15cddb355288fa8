//! `sonde doctor`: what this kernel allows, found by trying, and which
//! mechanism each tool will use (or exactly why it cannot run).
use std::mem::MaybeUninit;

use clap::Args;
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

/// What this kernel allows and which mechanism each tool uses.
///
/// What this kernel offers (BTF, tracepoints, tp_btf, raw_tp, kprobes,
/// fentry, uprobes, perf_event sampling, ring buffer, bpf_stats, privileges)
/// and which mechanism each sonde tool uses here.
///
/// Each program type is checked by loading (and where cheap attaching) a tiny
/// program, never by kernel version. Exit status 2 when sonde cannot run at all.
///
/// OVERHEAD: the test programs it attaches are detached before it exits,
/// nothing stays; a run takes 0.25-0.33 s of wall time, 0.07-0.08 s of CPU
/// and 9 MiB of memory (2-core VM, kernel 6.18, three runs).
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Instead of the kernel checks: the unwind table of this executable or
    /// library (repeatable): FDEs, rows, rules the walk cannot evaluate,
    /// kernel memory, and how long building it takes, cold and from the
    /// disk cache.
    #[arg(long, value_name = "FILE")]
    pub unwind: Vec<std::path::PathBuf>,
    /// Instead of the kernel checks: what sonde finds of the language
    /// runtime in this process (repeatable): which one, whether its frames
    /// are read, and what was learnt to read them.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Vec<u32>,
}

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
    r.map(|_| "loads and attaches".into()).map_err(|e| format!("attach: {e:#}"))
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

/// Runs every check; returns the exit status.
pub fn run(a: &DoctorArgs) -> anyhow::Result<i32> {
    if !a.unwind.is_empty() {
        return unwind_report(a);
    }
    if !a.pid.is_empty() {
        return runtime_report(a);
    }
    let caps = Caps::probe();
    let tools: Vec<(&str, Value)> = TOOLS
        .iter()
        .map(|(name, report)| (*name, if caps.privileged { report(&caps) } else { cannot("not privileged") }))
        .collect();
    let usable = caps.privileged && ["tp_btf", "raw_tp", "tracepoint"].iter().any(|n| caps.ok(n));
    if a.json {
        print_json(&caps, &tools, usable)?;
    } else {
        print_text(&caps, &tools)?;
    }
    Ok(if usable { 0 } else { 2 })
}

/// Each tool's report of how it runs on this kernel, in doctor's order. A
/// tool's function reads the tool's own `MECHANISMS` list, so its fallback
/// order is written once.
const TOOLS: &[(&str, Report)] = &[
    ("retrans", crate::tools::retrans::doctor),
    ("drops", crate::tools::drops::doctor),
    ("cwnd", crate::tools::cwnd::doctor),
    ("msglat", msglat_report),
    ("profile", crate::tools::profile::doctor),
    ("offcpu", crate::tools::offcpu::doctor),
    ("wakeup", crate::tools::offcpu::doctor_wakeup),
    ("funclatency", crate::tools::funclatency::doctor),
    ("slow", crate::tools::funclatency::slow::doctor),
];

/// A tool's report of how it runs on this kernel, from what doctor found.
type Report = fn(&Caps) -> Value;

/// What doctor found this kernel allows, handed to each tool's report.
pub struct Caps {
    /// Whether sonde may trace at all.
    pub privileged: bool,
    checks: Vec<Check>,
}

impl Caps {
    /// Runs every check (the probes load real programs when privileged).
    fn probe() -> Caps {
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
                crate::tools::profile::table_walk_loads()
                    .map(|()| {
                        "user stacks walk .eh_frame tables in BPF (profile's program with the walk loads)".to_string()
                    })
                    .map_err(|e| format!("{e:#}; stack tools use frame pointers only (--unwind dwarf refused)")),
            ));
        }
        Caps { privileged, checks }
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

/// `doctor --pid`: the runtime of each process; exit 2 when one is gone.
fn runtime_report(a: &DoctorArgs) -> anyhow::Result<i32> {
    features::require_tracing_privileges()?;
    let mut code = 0;
    for &pid in &a.pid {
        let v = crate::engine::runtime::inspect(pid);
        if v.get("error").is_some() {
            code = 2;
        }
        if a.json {
            crate::outln!("{v}")?;
            continue;
        }
        let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
        if let Some(e) = v.get("error") {
            crate::outln!("process {pid}: {}", e.as_str().unwrap_or("?"))?;
        } else if v["runtime"].is_null() {
            crate::outln!("process {pid} ({}): {}", s("comm"), s("detail"))?;
        } else if v["read"] == json!(true) {
            crate::outln!(
                "process {pid} ({}): {} in {}: its frames are read (offsets: {}; {})",
                s("comm"),
                s("runtime"),
                s("image"),
                s("offsets"),
                s("detail")
            )?;
        } else {
            crate::outln!(
                "process {pid} ({}): {} NOT READ: {}; its stacks stay native",
                s("comm"),
                s("runtime"),
                s("why")
            )?;
        }
    }
    Ok(code)
}

/// The language runtimes whose frames stack tools read, and whether this
/// kernel runs that reading (it rides on the table walk).
fn runtimes_report(caps: &Caps) -> Value {
    let walk = caps.ok("unwind");
    json!({
        "read_in_kernel": walk,
        "detail": if walk { "read beside the table walk of user stacks (--frames mixed, the default)".to_string() } else { "not here: language frames ride on the table walk, which does not load here (see unwind above)".to_string() },
        "runtimes": crate::engine::runtime::supported().into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

fn print_json(caps: &Caps, tools: &[(&str, Value)], usable: bool) -> anyhow::Result<()> {
    let mut feats = serde_json::Map::new();
    for c in &caps.checks {
        feats.insert(c.name.into(), json!({"ok": c.ok, "detail": c.detail}));
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let v = json!({
        "type": "doctor",
        "kernel": kernel,
        "usable": usable,
        "features": feats,
        "tools": tools.iter().map(|(n, v)| (n.to_string(), v.clone())).collect::<serde_json::Map<_, _>>(),
        "language_frames": runtimes_report(caps),
    });
    crate::outln!("{v}")?;
    Ok(())
}

fn print_text(caps: &Caps, tools: &[(&str, Value)]) -> anyhow::Result<()> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    crate::outln!("kernel {}", kernel.trim())?;
    for c in &caps.checks {
        crate::outln!("  {:<11} {:<4} {}", c.name, if c.ok { "yes" } else { "NO" }, c.detail)?;
    }
    crate::outln!("tools:")?;
    for (t, v) in tools {
        if v["usable"] == json!(true) {
            crate::outln!(
                "  {t:<11} uses {} ({})",
                v["mechanism"].as_str().unwrap_or("?"),
                v["detail"].as_str().unwrap_or("")
            )?;
        } else {
            crate::outln!("  {t:<11} CANNOT RUN: {}", v["why"].as_str().unwrap_or("?"))?;
        }
    }
    let rt = runtimes_report(caps);
    let names: Vec<String> = rt["runtimes"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    crate::outln!("language frames: {}: {}", names.join("; "), rt["detail"].as_str().unwrap_or(""))?;
    match crate::engine::cgroup::cgroup2_root() {
        Some(r) => crate::outln!("cgroup v2 at {r} (--cgroup paths are relative to it)")?,
        None => crate::outln!("note: no cgroup v2 mounted; --cgroup filters will not resolve")?,
    }

    Ok(())
}

/// msglat: the socket tracepoints as BTF tracepoints where the kernel has
/// them (the default hooks), else the syscall tracepoints.
fn msglat_report(cx: &Caps) -> Value {
    let fetch = features::has_atomic_fetch();
    let regs = features::has_task_regs();
    let mut limits = String::new();
    if !fetch {
        limits.push_str("; no BPF atomic fetch or compare-and-exchange (5.12): every flow in the per-CPU hash, --fifo positions taken by read-then-add");
    }
    if !regs {
        limits.push_str("; no bpf_task_pt_regs (5.15): a receive's arguments kept from its entry (one more program per receive; one already blocked at start is not timed)");
    }
    if cx.ok("tp_btf") && crate::tools::msglat::socket_tracepoints_exist() {
        json!({"usable": true, "mechanism": "tp_btf", "atomic_fetch": fetch, "task_regs": regs, "detail": format!("sock:sock_recv_length + tcp:tcp_sendmsg_locked (--hooks sockets); --hooks syscalls and raw also available{limits}")})
    } else if features::tracepoint_exists("syscalls", "sys_enter_write") {
        json!({"usable": true, "mechanism": "tracepoint", "atomic_fetch": fetch, "task_regs": regs, "detail": format!("syscalls:sys_enter_write/sys_exit_read ... (--hooks syscalls); the socket tracepoints are missing or tp_btf does not load{limits}")})
    } else {
        cannot("neither the socket tracepoints (tp_btf) nor the syscall tracepoints are available")
    }
}
/// `doctor --unwind FILE...`: each file's unwind table.
fn unwind_report(a: &DoctorArgs) -> anyhow::Result<i32> {
    use crate::engine::unwind::{cache, elf, kernel, table};
    use std::time::Instant;
    let mut out = Vec::new();
    for path in &a.unwind {
        let f = std::fs::File::open(path)
            .map_err(|e| crate::engine::error::usage(format!("--unwind {}: {e}; give an ELF file", path.display())))?;
        let t0 = Instant::now();
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            return Err(crate::engine::error::usage(format!(
                "--unwind {}: not a regular file; give an executable or library",
                path.display()
            )));
        }
        let info = match elf::read_file(f) {
            Ok(i) => i,
            Err(crate::engine::unwind::UnwindError::NotElf(e)) => {
                return Err(crate::engine::error::usage(format!(
                    "--unwind {}: not an x86-64 ELF file ({e}); give an executable or library",
                    path.display()
                )))
            }
            Err(e) => {
                out.push(json!({"file": path, "table": false, "why": e.to_string()}));
                continue;
            }
        };
        let built = table::build(&info);
        let cold = t0.elapsed();
        let t = match built {
            Ok(t) => t,
            Err(e) => {
                out.push(json!({"file": path, "table": false, "why": e.to_string()}));
                continue;
            }
        };
        // From a fresh cache directory: read the file and its sections,
        // hash them, read the stored table.
        let dir = std::env::temp_dir().join(format!("sonde-doctor-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = cache::Cache::open_at(&dir);
        let key = cache::key(&info);
        c.put(&key, &t);
        let t1 = Instant::now();
        let again = elf::read_file(std::fs::File::open(path)?).ok().and_then(|i| c.get(&cache::key(&i)));
        let warm = t1.elapsed();
        let _ = std::fs::remove_dir_all(&dir);
        let Some(pages) = kernel::layout(&t) else {
            out.push(json!({"file": path, "table": false, "why": "its rows span more than 16 GiB of addresses"}));
            continue;
        };
        let page_rows: usize = pages.iter().map(|p| p.1.len()).sum();
        let kbytes = (page_rows + pages.len()) * 8;
        let cfi = info.eh_frame.as_ref().map_or(0, |s| s.data.len())
            + info.debug_frame.as_ref().map_or(0, |s| s.data.len())
            + info.gopclntab.as_ref().map_or(0, |s| s.data.len());
        out.push(json!({
            "file": path, "table": true,
            "source": if info.gopclntab.is_some() && info.eh_frame.is_none() { "Go's .gopclntab" } else if info.eh_frame.is_some() { if info.via_program_headers { ".eh_frame (through PT_GNU_EH_FRAME: no section headers)" } else { ".eh_frame" } } else { ".debug_frame" },
            "debug_frame": info.debug_frame.is_some(),
            "build_id": info.build_id.as_ref().map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
            "cfi_bytes": cfi, "fdes": t.stats.fdes, "cfi_rows": t.stats.cfi_rows, "rows": t.rows.len(),
            "unsupported_rows": t.stats.unsupported_cfa, "unknown_rbp_rows": t.stats.unknown_rbp, "bad_fdes": t.stats.bad_fdes,
            "pages": pages.len(), "kernel_bytes": kbytes,
            "kernel_bytes_per_cfi_byte": kbytes as f64 / cfi.max(1) as f64,
            "build_ms": cold.as_secs_f64() * 1e3, "cached_ms": warm.as_secs_f64() * 1e3, "cache_round_trip": again.as_ref() == Some(&t),
        }));
    }
    if a.json {
        crate::outln!("{}", json!({"type": "doctor_unwind", "files": out}))?;
        return Ok(0);
    }
    for v in &out {
        if v["table"] == json!(true) {
            crate::outln!(
                "{}: {} rows from {} FDEs in {:.1} KB of {}; {} rows the walk cannot evaluate; kernel {:.1} KB ({:.2} bytes per byte of CFI, {} pages of 64 KiB); built in {:.1} ms, {:.1} ms from the disk cache",
                v["file"].as_str().unwrap_or("?"),
                v["rows"],
                v["fdes"],
                v["cfi_bytes"].as_f64().unwrap_or(0.0) / 1e3,
                v["source"].as_str().unwrap_or("?"),
                v["unsupported_rows"],
                v["kernel_bytes"].as_f64().unwrap_or(0.0) / 1e3,
                v["kernel_bytes_per_cfi_byte"].as_f64().unwrap_or(0.0),
                v["pages"],
                v["build_ms"].as_f64().unwrap_or(0.0),
                v["cached_ms"].as_f64().unwrap_or(0.0),
            )?;
        } else {
            crate::outln!(
                "{}: no table: {} (its frames are walked by frame pointers)",
                v["file"].as_str().unwrap_or("?"),
                v["why"].as_str().unwrap_or("?")
            )?;
        }
    }
    Ok(0)
}
