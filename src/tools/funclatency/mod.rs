//! `sonde funclatency`: latency histograms of user functions, syscalls and
//! softirqs (kernel functions where the kernel allows fentry or kprobes).
//!
//! [`run_with`] goes through the lifecycle in order: `validate` the arguments
//! into probes, `load` (load and attach, by the first way the kernel allows),
//! `poll` until the stop (printing each `-i` interval), `read_at_stop` before
//! anything is detached, then `detach` and build the typed [`Summary`]. [`run`]
//! prints the results with `print_json` or `print_text`, both from typed data.
pub mod collect;
pub mod slow;
pub mod targets;

use std::{
    mem::MaybeUninit,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use libbpf_rs::{
    skel::{OpenSkel, SkelBuilder},
    KprobeMultiOpts, KprobeOpts, MapCore, MapFlags, OpenObject, TracepointCategory, TracepointOpts, UprobeMultiOpts,
    UprobeOpts,
};

use crate::engine::caps::Caps;
use crate::engine::hist::{human, Hist};
use crate::engine::{
    error::usage,
    features,
    kfunc::{fentry_clone, indexed_clone, Attachment, PerfProbe, VmlinuxBtf},
    output::{RunArgs, Sink},
    record::percpu_sum,
    ringbuf::poll_until_stop,
    run::{duration_arg, RunControl, Stop},
    stacktool,
    taskfilter::{Targets, TaskFilter},
};
use serde::Serialize;
use serde_json::{json, Value};
use targets::{Probe, ProbeKind};

crate::skeleton!("funclatency");
use skel::{FunclatencySkel, FunclatencySkelBuilder, OpenFunclatencySkel};

const FL_TOO_DEEP: u32 = 0;
const FL_THREADS_FULL: u32 = 1;
const FL_UNMATCHED: u32 = 2;
const FL_SLOW_LOST: u32 = 3;
const FL_SAMPLES: u32 = 4;
const FL_SAMPLES_OUTSIDE: u32 = 5;
/// Calls not counted per cgroup (serve's cgroup labels): `cg_hists` full.
const FL_GROUPS_FULL: u32 = 6;
const FL_STACKS: u32 = 7;
/// FL_DEPTH: calls in flight per thread that are timed.
const DEPTH: usize = 32;
/// FL_IDX_MAGIC of funclatency.h: the immediate each per-target copy of a
/// probe program gets its target's index in (kernels without cookies).
const FL_IDX_MAGIC: i32 = 0x5d1d_c0de;

/// Latency histograms of user and kernel functions, syscalls and softirqs.
///
/// TARGET is one of:
///   BINARY:GLOB    user functions (uprobe + uretprobe), e.g. libc:getnameinfo,
///                  /usr/lib/x86_64-linux-gnu/libmariadb.so.3:mysql_*; a short
///                  library name is looked up like the dynamic linker does,
///                  with -p in that process's mappings
///   syscall:GLOB   syscalls (syscalls:sys_enter_*/sys_exit_* tracepoints)
///   softirq:NAME   softirqs (irq:softirq_entry/exit): HI TIMER NET_TX NET_RX
///                  BLOCK IRQ_POLL TASKLET SCHED HRTIMER RCU
///   kernel:GLOB    kernel functions (fentry/fexit or kprobes; refused with
///                  the reason where the kernel has neither)
///
/// Each function gets its own log2 histogram (ns/us/ms), count, average,
/// p50/p90/p99 estimates and maximum. A per-thread stack of entries pairs
/// every return with its own entry, so recursion and nested targets are
/// timed right. Calls still running at the end are counted as in flight,
/// with the oldest one's age. -p and --cgroup do not apply to softirqs.
///
/// OVERHEAD (bench/funclatency/run, tight loops): a traced user function
/// costs ~5.2 us more per call (two uprobe traps; sonde's BPF is 0.2 us of
/// it; a bpftrace one-liner costs the same; uprobe.multi links cost the same
/// per call), a traced syscall 150-170 ns more (bpftrace: 270-390 ns).
/// Trace hot user functions with -p, for short periods. Kernel functions:
/// not measured (refused on the machine we benchmark on).
#[derive(Debug, Args)]
#[command(mut_arg("json", |a| a.help("One JSON object per target and interval, then a summary line")))]
#[command(mut_arg("output", |a| a.help("Write to this file instead of stdout: .json (JSON lines; implies --json) or .txt")))]
pub struct FunclatencyArgs {
    /// Targets, filters and duration.
    #[command(flatten)]
    pub scope: Scope,
    /// Also print each interval's histograms this often (e.g. 5s).
    #[arg(short = 'i', long, value_parser = duration_arg)]
    pub interval: Option<Duration>,
}

/// What to time, whose calls and for how long: shared by funclatency and slow.
#[derive(Debug, Args)]
pub struct Scope {
    /// What to time (repeatable; see above).
    #[arg(required = true, value_name = "TARGET")]
    pub targets: Vec<String>,
    /// Only this process (repeatable). User-function probes are placed in
    /// these processes only.
    #[arg(short = 'p', long = "pid")]
    pub pid: Vec<u32>,
    /// Only tasks in this cgroup or below it: a cgroup v2 directory, or a
    /// cgroup v1 controller's (/sys/fs/cgroup/cpu/...).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
    /// Most functions a glob may expand to.
    #[arg(long, default_value_t = 64)]
    pub max_probes: usize,
    /// How kernel functions are probed (default: the first that works of
    /// fentry, kprobe-multi, kprobe).
    #[arg(long, value_enum)]
    pub kernel_mechanism: Option<KernelMechanism>,
    /// A uprobe link per function even where one uprobe.multi link per
    /// binary is possible.
    #[arg(long)]
    pub single_uprobes: bool,
    /// serve's cgroup labels: calls also counted per cgroup (`cg_hists`).
    #[arg(skip)]
    pub by_cgroup: bool,
}

/// Ways to probe kernel functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelMechanism {
    /// fentry/fexit trampolines: one program per function and direction.
    Fentry,
    /// One kprobe.multi and one kretprobe.multi link for all functions.
    KprobeMulti,
    /// A kprobe and a kretprobe per function.
    Kprobe,
}

/// How kernel functions are probed, in fallback order, with what each
/// attaches: loading tries them in turn (`--kernel-mechanism` forces one) and
/// doctor reports the ones this kernel allows from the same list.
pub const KERNEL_MECHANISMS: &[(KernelMechanism, &str)] = &[
    (KernelMechanism::Fentry, "fentry/fexit"),
    (KernelMechanism::KprobeMulti, "kprobe-multi"),
    (KernelMechanism::Kprobe, "a kprobe/kretprobe per function"),
];

impl KernelMechanism {
    /// Which of doctor's probes says this kernel allows it.
    fn needs(self) -> &'static str {
        match self {
            KernelMechanism::Fentry => "fentry",
            KernelMechanism::KprobeMulti | KernelMechanism::Kprobe => "kprobe",
        }
    }

    fn name(self) -> &'static str {
        match self {
            KernelMechanism::Fentry => "fentry",
            KernelMechanism::KprobeMulti => "kprobe-multi",
            KernelMechanism::Kprobe => "kprobe",
        }
    }
}

impl Scope {
    /// Checks the options and resolves the targets into probes.
    fn resolve(&self) -> anyhow::Result<(TaskFilter, Vec<Probe>)> {
        if self.max_probes == 0 || self.max_probes > 4096 {
            return Err(usage(format!("--max-probes {}: pick 1 to 4096", self.max_probes)));
        }
        let tf = TaskFilter::new(&self.pid, &[], self.cgroup.as_deref(), None)?;
        let probes = targets::resolve(&self.targets, &self.pid, self.max_probes)?;
        Ok((tf, probes))
    }
}

/// One target's result.
pub struct TargetResult {
    /// The probe.
    pub probe: Probe,
    /// Its calls.
    pub hist: Hist,
    /// Calls still running when tracing stopped.
    pub in_flight: u64,
    /// Age of the oldest of those, ns.
    pub oldest_in_flight_ns: u64,
}

/// Calls that were not timed, counted at the stop (struct fl_stack has
/// `DEPTH` slots per thread; the thread map has a fixed size).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct NotTimed {
    /// Calls nested deeper than the per-thread stack holds.
    pub too_deep: u64,
    /// Calls entered while the thread map was full.
    pub threads_full: u64,
    /// Returns whose entry was not seen.
    pub unmatched_returns: u64,
}

/// The last `--json` line of a run; the text summary is printed from it too.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    #[serde(rename = "type")]
    ty: &'static str,
    /// Time from attaching to the stop.
    pub duration_s: f64,
    /// Targets timed.
    pub targets: usize,
    /// Calls timed, over every target.
    pub calls: u64,
    /// Calls still running at the stop, over every target.
    pub in_flight: u64,
    /// Calls that were not timed.
    pub not_timed: NotTimed,
    /// "uprobe-multi" or "uprobe" when there are user functions (else null).
    pub uprobe_mechanism: Option<&'static str>,
    /// "fentry", "kprobe-multi" or "kprobe" when there are kernel functions (else null).
    pub kernel_mechanism: Option<&'static str>,
    /// Functions the kernel refused a probe on, not traced.
    pub unprobeable: Vec<String>,
}

/// What a run saw.
pub struct Outcome {
    /// Per target, in target order.
    pub targets: Vec<TargetResult>,
    /// The summary.
    pub summary: Summary,
    /// Why it stopped.
    pub stop: Stop,
}

/// A target's `--json` line: its calls overall, or in one `-i` interval.
#[derive(Serialize)]
struct LatencyLine<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    target: &'a str,
    count: u64,
    in_flight: u64,
    oldest_in_flight_ns: u64,
    buckets: Vec<serde_json::Value>,
    avg_ns: u64,
    p50_ns: u64,
    p90_ns: u64,
    p99_ns: u64,
    max_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    interval: Option<u64>,
}

impl<'a> LatencyLine<'a> {
    fn new(r: &'a TargetResult, interval: Option<u64>) -> Self {
        let h = &r.hist;
        LatencyLine {
            ty: "latency",
            target: &r.probe.name,
            count: h.count,
            in_flight: r.in_flight,
            oldest_in_flight_ns: r.oldest_in_flight_ns,
            buckets: h.json_buckets(),
            avg_ns: h.avg_ns(),
            p50_ns: h.quantile_ns(0.5),
            p90_ns: h.quantile_ns(0.9),
            p99_ns: h.quantile_ns(0.99),
            max_ns: h.max_ns,
            interval,
        }
    }
}

/// Where funclatency writes (stdout or `-o`) and whether as JSON lines.
pub struct Output {
    sink: Sink,
    json: bool,
}

impl Output {
    /// stdout, or the `-o` file: .json (JSON lines, as --json) or .txt.
    pub fn open(a: &FunclatencyArgs) -> anyhow::Result<Output> {
        let run = &a.scope.run;
        let out = run.output("funclatency", &[(".json", true), (".txt", false)])?;
        Ok(Output { sink: Sink::open(run.path())?, json: run.json || out.is_some_and(|(_, json)| json) })
    }
}

/// A loaded and attached kernel half.
struct Loaded {
    skel: FunclatencySkel<'static>,
    links: Vec<Attachment>,
    /// How the targets were probed.
    probing: Probing,
    /// slow: the unwinder of its stacks.
    session: crate::engine::unwind::Session,
}

/// How the targets were probed, for the summary.
struct Probing {
    /// How kernel functions were probed, if there were any.
    kernel: Option<KernelMechanism>,
    /// User functions: by uprobe.multi links (else a uprobe per function).
    umulti: bool,
    /// Functions the kernel refused a probe on, not traced.
    unprobeable: Vec<String>,
}

/// `slow`'s additions to the kernel half.
struct SlowCfg {
    over_ns: u64,
    hz: u64,
    want_kernel: bool,
    want_user: bool,
    unwind: crate::engine::unwind::Plan,
}

/// How to load: tp_btf softirqs (`typed`), the kernel-function mechanism,
/// uprobe.multi for user functions, and whether probes learn their target
/// from the attach cookie (else each target gets its own program copy).
#[derive(Clone, Copy, Debug)]
struct Way {
    typed: bool,
    kmech: Option<KernelMechanism>,
    umulti: bool,
    cookie: bool,
}

/// The kernel-function targets: (cookie = target index, function name).
fn kernel_functions(probes: &[Probe]) -> Vec<(u64, &str)> {
    probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| if let ProbeKind::Kernel(f) = &p.kind { Some((i as u64, f.as_str())) } else { None })
        .collect()
}

/// Loads the kernel half one way and attaches every probe: returns first,
/// then entries (so no call is entered without its return being caught: it
/// would sit in its thread's stack for ever), then softirqs, then slow's
/// sampler.
fn load_way(
    pids: &[u32],
    tf: &TaskFilter,
    probes: &[Probe],
    way: Way,
    slow: Option<&SlowCfg>,
    by_cgroup: bool,
) -> anyhow::Result<Loaded> {
    let fp = crate::engine::unwind::Plan::fp();
    let plan = slow.map(|c| &c.unwind).unwrap_or(&fp);
    let kfuncs = kernel_functions(probes);
    let (open, btf) = open_configured(tf, probes, way, slow, plan, &kfuncs, by_cgroup)?;
    let skel = open.load().context("loading BPF programs")?;
    tf.fill_pids(&skel.maps.tf_pids)?;
    let session = crate::engine::unwind::Session::start(plan, &crate::unw_maps!(skel), tf);
    let mut links = Vec::new();
    if plan.tables {
        links.push(Attachment::Lib(skel.progs.unw_exec.attach().context("attaching sched_process_exec")?));
    }
    if tf.follow {
        links.push(Attachment::Lib(skel.progs.tf_fork.attach().context("attaching sched_process_fork")?));
    }
    // Processes user-function probes are placed in (-1: every process; so
    // with `-- CMD`, whose children are not known yet: the kernel half's
    // task filter keeps the command's).
    let upids: Vec<i32> = if pids.is_empty() { vec![-1] } else { pids.iter().map(|&p| p as i32).collect() };
    let unprobeable = attach_calls(&skel, &upids, probes, way, btf.as_ref(), &kfuncs, &mut links)?;
    if probes.iter().any(|p| matches!(p.kind, ProbeKind::Softirq(_))) {
        attach_softirqs(&skel, way.typed, &mut links)?;
    }
    if let Some(c) = slow {
        attach_sampler(&skel, c.hz, &mut links)?;
    }
    check_refusals(probes, &kfuncs, &unprobeable)?;
    let unprobeable = unprobeable.into_iter().map(|i| probes[i].name.clone()).collect();
    let probing = Probing { kernel: way.kmech.filter(|_| !kfuncs.is_empty()), umulti: way.umulti, unprobeable };
    Ok(Loaded { skel, links, probing, session })
}

/// Attaches the return probes of every user function, syscall and kernel
/// function, then their entry probes, in target order within each kind of
/// link. Returns the targets the kernel refused a probe on.
fn attach_calls(
    skel: &FunclatencySkel<'_>,
    upids: &[i32],
    probes: &[Probe],
    way: Way,
    btf: Option<&VmlinuxBtf>,
    kfuncs: &[(u64, &str)],
    links: &mut Vec<Attachment>,
) -> anyhow::Result<Vec<usize>> {
    let mut unprobeable: Vec<usize> = Vec::new();
    for ret in [true, false] {
        if way.umulti {
            attach_user_multi(skel, upids, probes, ret, links)?;
        }
        for (i, p) in probes.iter().enumerate() {
            match &p.kind {
                ProbeKind::User { .. } if way.umulti || unprobeable.contains(&i) => {}
                ProbeKind::User { .. } => {
                    if !attach_uprobe(skel, upids, i, p, ret, way.cookie, links)? {
                        unprobeable.push(i);
                    }
                }
                ProbeKind::Syscall(name) => links.push(attach_syscall(skel, i, name, ret, way.cookie)?),
                ProbeKind::Softirq(_) | ProbeKind::Kernel(_) => {}
            }
        }
        if !kfuncs.is_empty() {
            attach_kernel(skel, way, btf, kfuncs, ret, links, &mut unprobeable)?;
        }
    }
    Ok(unprobeable)
}

/// Opens the BPF object and sets what must be set before loading: the
/// unwinder, task filter, softirq targets and slow's settings in rodata, map
/// sizes, which programs load (`set_autoload`), and fentry's template.
/// Returns the kernel's BTF when kernel functions go by fentry.
fn open_configured(
    tf: &TaskFilter,
    probes: &[Probe],
    way: Way,
    slow: Option<&SlowCfg>,
    plan: &crate::engine::unwind::Plan,
    kfuncs: &[(u64, &str)],
    by_cgroup: bool,
) -> anyhow::Result<(OpenFunclatencySkel<'static>, Option<VmlinuxBtf>)> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = FunclatencySkelBuilder::default().open(storage).context("opening BPF object")?;
    crate::set_unwind!(&mut open, plan, tf.processes_now().is_some());
    crate::set_task_follow!(&mut open, tf);
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    crate::set_task_filter!(&mut *ro, tf);
    for (i, p) in probes.iter().enumerate() {
        if let ProbeKind::Softirq(v) = p.kind {
            ro.softirq_target[v as usize] = i as u32 + 1;
        }
    }
    if let Some(c) = slow {
        ro.over_ns = c.over_ns;
        ro.want_kernel = c.want_kernel;
        ro.want_user = c.want_user;
    }
    ro.by_cgroup = by_cgroup;
    ro.has_cookie = way.cookie;
    open.progs.fl_sample.set_autoload(slow.is_some());
    if slow.is_some() {
        crate::set_sample_stacks!(&mut open);
    }
    // slow's sampler is a perf_event program, which kernels before 6.1
    // (before bpf_mem_alloc made run-time allocation safe in NMI) allow only
    // preallocated hashes: there the per-thread stacks are preallocated,
    // for 16,384 threads (6 MiB; more are counted in threads_full).
    if slow.is_some() && !features::btf_has_type("bpf_mem_alloc") {
        open.maps.stacks.set_map_flags(0)?;
        open.maps.stacks.set_max_entries(16_384)?;
    }
    open.maps.hists.set_max_entries(probes.len().max(1) as u32)?;
    if !by_cgroup {
        open.maps.cg_hists.set_max_entries(1)?;
    }
    set_autoload(&mut open, probes, way, kfuncs);
    // fentry: the kernel's BTF, read once, names each function's prototype.
    let fentry = way.kmech == Some(KernelMechanism::Fentry) && !kfuncs.is_empty();
    let btf = if fentry { Some(VmlinuxBtf::load()?) } else { None };
    if let Some(btf) = &btf {
        // The template is verified against one function, the one with the
        // fewest arguments (any trampoline takes it); the others get copies
        // of its instructions (kfunc::fentry_clone).
        let template =
            kfuncs.iter().filter_map(|f| Some((btf.func_args(f.1)?, f.1))).min().map(|(_, n)| n).unwrap_or(kfuncs[0].1);
        open.progs.fl_kentry.set_attach_target(0, Some(template.to_string()))?;
        open.progs.fl_kexit.set_attach_target(0, Some(template.to_string()))?;
    }
    Ok((open, btf))
}

/// Loads only the programs this run's targets and way need.
fn set_autoload(open: &mut OpenFunclatencySkel<'_>, probes: &[Probe], way: Way, kfuncs: &[(u64, &str)]) {
    let Way { typed, kmech, umulti, .. } = way;
    let has = |f: fn(&ProbeKind) -> bool| probes.iter().any(|p| f(&p.kind));
    let user = has(|k| matches!(k, ProbeKind::User { .. }));
    let sys = has(|k| matches!(k, ProbeKind::Syscall(_)));
    let softirq = has(|k| matches!(k, ProbeKind::Softirq(_)));
    open.progs.fl_uentry.set_autoload(user && !umulti);
    open.progs.fl_ureturn.set_autoload(user && !umulti);
    open.progs.fl_umentry.set_autoload(umulti);
    open.progs.fl_umexit.set_autoload(umulti);
    open.progs.fl_sys_enter.set_autoload(sys);
    open.progs.fl_sys_exit.set_autoload(sys);
    open.progs.fl_btf_softirq_entry.set_autoload(softirq && typed);
    open.progs.fl_btf_softirq_exit.set_autoload(softirq && typed);
    open.progs.fl_raw_softirq_entry.set_autoload(softirq && !typed);
    open.progs.fl_raw_softirq_exit.set_autoload(softirq && !typed);
    let km = |m| kmech == Some(m) && !kfuncs.is_empty();
    open.progs.fl_kentry.set_autoload(km(KernelMechanism::Fentry));
    open.progs.fl_kexit.set_autoload(km(KernelMechanism::Fentry));
    open.progs.fl_kmentry.set_autoload(km(KernelMechanism::KprobeMulti));
    open.progs.fl_kmexit.set_autoload(km(KernelMechanism::KprobeMulti));
    open.progs.fl_kpentry.set_autoload(km(KernelMechanism::Kprobe));
    open.progs.fl_kpexit.set_autoload(km(KernelMechanism::Kprobe));
}

/// A uprobe (or uretprobe: `ret`) on user function `p` (target `i`), in each
/// process of `pids`. Returns false when the kernel refuses the uretprobe
/// with ENOTSUPP (it cannot place a uprobe on the function's first
/// instruction): the function is then skipped, and reported when other
/// functions remain.
#[allow(clippy::too_many_arguments)]
fn attach_uprobe(
    skel: &FunclatencySkel<'_>,
    pids: &[i32],
    i: usize,
    p: &Probe,
    ret: bool,
    cookie: bool,
    links: &mut Vec<Attachment>,
) -> anyhow::Result<bool> {
    let ProbeKind::User { path, offset } = &p.kind else { return Ok(true) };
    let prog = if ret { &skel.progs.fl_ureturn } else { &skel.progs.fl_uentry };
    for &pid in pids {
        let attached = if cookie {
            let opts = UprobeOpts { cookie: i as u64, retprobe: ret, ..Default::default() };
            prog.attach_uprobe_with_opts(pid, path, *offset as usize, opts)
                .map(Attachment::Lib)
                .map_err(anyhow::Error::new)
        } else {
            let probe = PerfProbe::Uprobe { path, offset: *offset, pid };
            indexed_clone(prog, FL_IDX_MAGIC, i as u32, &probe, ret)
        };
        match attached {
            Ok(l) => links.push(l),
            Err(e) if ret && format!("{e:#}").contains("(os error 524)") => return Ok(false),
            Err(e) => {
                return Err(e.context(format!("attaching a uprobe to {} ({} at {offset:#x})", p.name, path.display())))
            }
        }
    }
    Ok(true)
}

/// The syscalls:sys_exit_NAME (`ret`) or sys_enter_NAME tracepoint of
/// target `i`.
fn attach_syscall(
    skel: &FunclatencySkel<'_>,
    i: usize,
    name: &str,
    ret: bool,
    cookie: bool,
) -> anyhow::Result<Attachment> {
    let (prog, tp) = if ret {
        (&skel.progs.fl_sys_exit, format!("sys_exit_{name}"))
    } else {
        (&skel.progs.fl_sys_enter, format!("sys_enter_{name}"))
    };
    if !cookie {
        return indexed_clone(prog, FL_IDX_MAGIC, i as u32, &PerfProbe::Tracepoint("syscalls", &tp), false)
            .with_context(|| format!("attaching syscalls:{tp}"));
    }
    let opts = TracepointOpts { cookie: i as u64, ..Default::default() };
    Ok(Attachment::Lib(
        prog.attach_tracepoint_with_opts(TracepointCategory::Syscalls, &tp, opts)
            .with_context(|| format!("attaching syscalls:{tp}"))?,
    ))
}

/// irq:softirq_exit, then irq:softirq_entry, by tp_btf (`typed`) or raw_tp.
fn attach_softirqs(skel: &FunclatencySkel<'_>, typed: bool, links: &mut Vec<Attachment>) -> anyhow::Result<()> {
    let (entry, exit) = if typed {
        (&skel.progs.fl_btf_softirq_entry, &skel.progs.fl_btf_softirq_exit)
    } else {
        (&skel.progs.fl_raw_softirq_entry, &skel.progs.fl_raw_softirq_exit)
    };
    links.push(Attachment::Lib(exit.attach().context("attaching irq:softirq_exit")?));
    links.push(Attachment::Lib(entry.attach().context("attaching irq:softirq_entry")?));
    Ok(())
}

/// slow's timer: a perf event per CPU at `hz` samples per second.
fn attach_sampler(skel: &FunclatencySkel<'_>, hz: u64, links: &mut Vec<Attachment>) -> anyhow::Result<()> {
    let samplers = crate::engine::perf::attach_sampling(
        &skel.progs.fl_sample,
        crate::engine::perf::Counter::CpuClock,
        hz,
        |cpu, e| anyhow::Error::new(e).context(format!("opening a perf event on CPU {cpu}")),
    )?;
    links.extend(samplers.into_iter().map(Attachment::Lib));
    Ok(())
}

/// Fails when the kernel refused every user function, or every kernel
/// function (target indexes in `unprobeable`): then nothing of that kind
/// would be timed.
fn check_refusals(probes: &[Probe], kfuncs: &[(u64, &str)], unprobeable: &[usize]) -> anyhow::Result<()> {
    let n_user = probes.iter().filter(|p| matches!(p.kind, ProbeKind::User { .. })).count();
    let user_refused = unprobeable.iter().filter(|&&i| matches!(probes[i].kind, ProbeKind::User { .. })).count();
    if n_user > 0 && user_refused == n_user {
        return Err(crate::engine::error::env(format!(
            "the kernel cannot place a uprobe on any of the {n_user} functions (first: {}; ENOTSUPP)",
            probes[unprobeable[0]].name
        )));
    }
    if !kfuncs.is_empty() && unprobeable.len() - user_refused == kfuncs.len() {
        anyhow::bail!("the kernel refuses every one of the {} kernel functions by this mechanism", kfuncs.len());
    }
    Ok(())
}

/// One uprobe.multi link per binary (and per -p process) for the entries or
/// the returns (`ret`) of every user function in it, cookies per function.
fn attach_user_multi(
    skel: &FunclatencySkel<'_>,
    pids: &[i32],
    probes: &[Probe],
    ret: bool,
    links: &mut Vec<Attachment>,
) -> anyhow::Result<()> {
    let mut by_path: Vec<(&std::path::Path, Vec<usize>, Vec<u64>)> = Vec::new();
    for (i, p) in probes.iter().enumerate() {
        if let ProbeKind::User { path, offset } = &p.kind {
            match by_path.iter_mut().find(|b| b.0 == path.as_path()) {
                Some(b) => {
                    b.1.push(*offset as usize);
                    b.2.push(i as u64);
                }
                None => by_path.push((path, vec![*offset as usize], vec![i as u64])),
            }
        }
    }
    let prog = if ret { &skel.progs.fl_umexit } else { &skel.progs.fl_umentry };
    for (path, offsets, cookies) in by_path {
        for &pid in pids {
            let opts = UprobeMultiOpts {
                offsets: offsets.clone(),
                cookies: cookies.clone(),
                retprobe: ret,
                ..Default::default()
            };
            links.push(Attachment::Lib(prog.attach_uprobe_multi_with_opts(pid, path, "", opts).with_context(
                || format!("attaching uprobe.multi to {} functions of {}", offsets.len(), path.display()),
            )?));
        }
    }
    Ok(())
}

/// Attaches the entry (`ret` false) or return probes of kernel functions
/// `kfuncs` (cookie = target index, name) by `kmech`.
fn attach_kernel(
    skel: &FunclatencySkel<'_>,
    way: Way,
    btf: Option<&VmlinuxBtf>,
    kfuncs: &[(u64, &str)],
    ret: bool,
    links: &mut Vec<Attachment>,
    unprobeable: &mut Vec<usize>,
) -> anyhow::Result<()> {
    match way.kmech {
        Some(KernelMechanism::Fentry) => {
            let btf = btf.context("fentry without the kernel's BTF")?;
            attach_fentry(skel, btf, kfuncs, ret, links, unprobeable)
        }
        Some(KernelMechanism::KprobeMulti) => attach_kprobe_multi(skel, kfuncs, ret, links),
        Some(KernelMechanism::Kprobe) => attach_kprobes(skel, kfuncs, ret, way.cookie, links),
        None => anyhow::bail!("kernel functions without a mechanism"),
    }
}

fn direction(ret: bool) -> &'static str {
    if ret {
        "return"
    } else {
        "entry"
    }
}

/// fentry (or fexit: `ret`) on each kernel function, a copy of the loaded
/// template per function. A function the kernel will not trampoline
/// (ENOTSUPP: e.g. more arguments than registers; or no BTF prototype) is
/// skipped and its target index put in `unprobeable`, when other functions
/// remain.
fn attach_fentry(
    skel: &FunclatencySkel<'_>,
    btf: &VmlinuxBtf,
    kfuncs: &[(u64, &str)],
    ret: bool,
    links: &mut Vec<Attachment>,
    unprobeable: &mut Vec<usize>,
) -> anyhow::Result<()> {
    let template = if ret { &skel.progs.fl_kexit } else { &skel.progs.fl_kentry };
    for &(cookie, name) in kfuncs {
        if unprobeable.contains(&(cookie as usize)) {
            continue;
        }
        let attached = match btf.func_id(name) {
            Some(id) => fentry_clone(template, ret, id, cookie),
            None => Err(anyhow::anyhow!(
                "{name}: the kernel's BTF has no prototype of it (a module's function, or one its build left out, \
                 as pahole does with a name two functions share with different prototypes), so no fentry; \
                 --kernel-mechanism kprobe traces it"
            )),
        };
        match attached {
            Ok(a) => links.push(a),
            // Returns are attached first: a refusal there skips the function.
            Err(e) if ret && kfuncs.len() > 1 => {
                if std::env::var_os("SONDE_DEBUG").is_some() {
                    eprintln!("sonde: kernel:{name}: {e:#}");
                }
                unprobeable.push(cookie as usize);
            }
            Err(e) => return Err(e.context(format!("kernel:{name} ({})", direction(ret)))),
        }
    }
    Ok(())
}

/// One kprobe.multi (or kretprobe.multi: `ret`) link for every kernel function.
fn attach_kprobe_multi(
    skel: &FunclatencySkel<'_>,
    kfuncs: &[(u64, &str)],
    ret: bool,
    links: &mut Vec<Attachment>,
) -> anyhow::Result<()> {
    let prog = if ret { &skel.progs.fl_kmexit } else { &skel.progs.fl_kmentry };
    let opts = KprobeMultiOpts {
        symbols: kfuncs.iter().map(|f| f.1.to_string()).collect(),
        cookies: kfuncs.iter().map(|f| f.0).collect(),
        retprobe: ret,
        ..Default::default()
    };
    links.push(Attachment::Lib(
        prog.attach_kprobe_multi_with_opts(opts)
            .with_context(|| format!("attaching kprobe.multi ({}) to {} functions", direction(ret), kfuncs.len()))?,
    ));
    Ok(())
}

/// A kprobe (or kretprobe: `ret`) per kernel function.
fn attach_kprobes(
    skel: &FunclatencySkel<'_>,
    kfuncs: &[(u64, &str)],
    ret: bool,
    has_cookie: bool,
    links: &mut Vec<Attachment>,
) -> anyhow::Result<()> {
    let prog = if ret { &skel.progs.fl_kpexit } else { &skel.progs.fl_kpentry };
    for &(cookie, name) in kfuncs {
        if !has_cookie {
            links.push(
                indexed_clone(prog, FL_IDX_MAGIC, cookie as u32, &PerfProbe::Kprobe(name), ret)
                    .with_context(|| format!("kprobe on kernel:{name} ({})", direction(ret)))?,
            );
            continue;
        }
        let opts = KprobeOpts { cookie, ..Default::default() };
        links.push(Attachment::Lib(
            prog.attach_kprobe_with_opts(ret, name, opts)
                .with_context(|| format!("kprobe on kernel:{name} ({})", direction(ret)))?,
        ));
    }
    Ok(())
}

/// Detaches in the reverse order of attaching: samplers, then entries, then
/// returns, so no call is entered that no return probe will see (it would
/// sit in its thread's stack, and look slow to the sampler).
fn detach(links: Vec<Attachment>) {
    for l in links.into_iter().rev() {
        drop(l);
    }
}

/// Loads with tp_btf softirq programs, else raw_tp ones; kernel functions
/// with the forced mechanism, else the first of fentry, kprobe-multi and
/// kprobe that loads and attaches; user functions by uprobe.multi where the
/// kernel has it (its link type is in the kernel's BTF), else one uprobe each.
fn load_with_fallback(
    pids: &[u32],
    tf: &TaskFilter,
    probes: &[Probe],
    scope: &Scope,
    slow: Option<&SlowCfg>,
) -> anyhow::Result<Loaded> {
    let softirq = probes.iter().any(|p| matches!(p.kind, ProbeKind::Softirq(_)));
    let kernel = probes.iter().any(|p| matches!(p.kind, ProbeKind::Kernel(_)));
    let user = probes.iter().any(|p| matches!(p.kind, ProbeKind::User { .. }));
    // Without attach cookies (before 5.15) each target gets a copy of its
    // probe program; fentry and kprobe.multi links take a target's index
    // only as a cookie, so kernel functions go by kprobes there.
    let cookie = features::has_attach_cookie();
    let korder: Vec<Option<KernelMechanism>> = match (kernel, scope.kernel_mechanism) {
        (false, _) => vec![None],
        (true, Some(m)) if !cookie && m != KernelMechanism::Kprobe => {
            return Err(crate::engine::error::env(format!(
                "--kernel-mechanism {}: this kernel has no bpf_get_attach_cookie (Linux 5.15+), which that mechanism needs to tell functions apart; use --kernel-mechanism kprobe",
                m.name()
            )))
        }
        (true, Some(m)) => vec![Some(m)],
        (true, None) if !cookie => vec![Some(KernelMechanism::Kprobe)],
        (true, None) => KERNEL_MECHANISMS.iter().map(|(m, _)| Some(*m)).collect(),
    };
    let umulti = user && !scope.single_uprobes && features::btf_has_type("bpf_uprobe_multi_link");
    let mut failures = Vec::new();
    for &kmech in &korder {
        let mut ways = vec![Way { typed: true, kmech, umulti, cookie }];
        if softirq {
            ways.push(Way { typed: false, kmech, umulti, cookie });
        }
        if umulti {
            ways.push(Way { typed: true, kmech, umulti: false, cookie });
            if softirq {
                ways.push(Way { typed: false, kmech, umulti: false, cookie });
            }
        }
        let mut errs: Vec<anyhow::Error> = Vec::new();
        for way in ways {
            match load_way(pids, tf, probes, way, slow, scope.by_cgroup) {
                Ok(l) => return Ok(l),
                Err(e) => errs.push(e),
            }
        }
        let text: Vec<String> = errs.iter().map(|e| format!("{e:#}")).collect();
        if kmech.is_none() {
            // No other mechanism to try: the last failure, after the others.
            let last = errs.pop().expect("at least one way was tried");
            return Err(if errs.is_empty() {
                last
            } else {
                last.context(format!("(before: {})", text[..text.len() - 1].join("; ")))
            });
        }
        failures.push(format!("{}: {}", kmech.map(KernelMechanism::name).unwrap_or(""), text.join("; then ")));
    }
    Err(crate::engine::error::env(format!(
        "cannot probe the kernel functions ({}); see `sonde doctor`",
        failures.join("; ")
    )))
}

/// Calls in flight per target and the oldest start, from the per-thread
/// stacks (struct fl_stack) and the per-CPU softirq starts.
fn in_flight(skel: &FunclatencySkel<'_>, probes: &[Probe]) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut out = vec![(0u64, u64::MAX); probes.len()];
    let mut note = |idx: usize, ts: u64| {
        if let Some(o) = out.get_mut(idx) {
            o.0 += 1;
            o.1 = o.1.min(ts);
        }
    };
    for k in skel.maps.stacks.keys() {
        let Some(v) = skel.maps.stacks.lookup(&k, MapFlags::ANY)? else { continue };
        let depth = (u32::from_ne_bytes(v[0..4].try_into().unwrap()) as usize).min(DEPTH);
        for d in 0..depth {
            let ts = u64::from_ne_bytes(v[8 + d * 8..16 + d * 8].try_into().unwrap());
            let idx = u32::from_ne_bytes(v[8 + DEPTH * 8 + d * 4..12 + DEPTH * 8 + d * 4].try_into().unwrap());
            note(idx as usize, ts);
        }
    }
    if let Some(per_cpu) = skel.maps.softirq_start.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)? {
        for v in per_cpu {
            let ts = u64::from_ne_bytes(v[0..8].try_into().unwrap());
            let vec = u32::from_ne_bytes(v[8..12].try_into().unwrap());
            if let Some(i) = probes.iter().position(|p| p.kind == ProbeKind::Softirq(vec)).filter(|_| ts != 0) {
                note(i, ts);
            }
        }
    }
    let now = monotonic_ns();
    Ok(out.into_iter().map(|(c, ts)| (c, if c > 0 { now.saturating_sub(ts) } else { 0 })).collect())
}

/// CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Removes the per-thread stacks of threads that are gone (a thread that
/// exits inside a call never returns from it).
fn prune_dead_threads(map: &dyn MapCore) {
    for k in map.keys() {
        let tid = u32::from_ne_bytes(k[..4].try_into().unwrap());
        if !std::path::Path::new(&format!("/proc/{tid}")).exists() {
            let _ = map.delete(&k);
        }
    }
}

fn target_text(r: &TargetResult) -> String {
    let h = &r.hist;
    let mut s = format!(
        "{}: {} calls, avg {}, p50 {}, p90 {}, p99 {}, max {}",
        r.probe.name,
        h.count,
        human(h.avg_ns()),
        human(h.quantile_ns(0.5)),
        human(h.quantile_ns(0.9)),
        human(h.quantile_ns(0.99)),
        human(h.max_ns)
    );
    if r.in_flight > 0 {
        s.push_str(&format!("; {} in flight (oldest {})", r.in_flight, human(r.oldest_in_flight_ns)));
    }
    s.push('\n');
    if h.count > 0 {
        s.push_str(&h.render());
    }
    s
}

/// Says which functions the kernel refused a probe on, if any.
fn unprobeable_note(names: &[String]) {
    if !names.is_empty() {
        let more = if names.len() > 5 { format!(" and {} more", names.len() - 5) } else { String::new() };
        let fix = if names.iter().any(|n| n.starts_with("kernel:")) {
            "; --kernel-mechanism kprobe traces kernel functions fentry cannot"
        } else {
            ""
        };
        eprintln!(
            "not traced: the kernel refused a probe on {}{more} (a uprobe: ENOTSUPP; fentry: no trampoline for it, \
             or no prototype in the kernel's BTF){fix}",
            names[..names.len().min(5)].join(", ")
        );
    }
}

/// What the maps held when tracing stopped, read before anything is
/// detached (detaching makes returns without entries of their own).
struct AtStop {
    /// Every target's histogram, summed over CPUs.
    hists: Vec<Hist>,
    /// Per target: calls in flight and the oldest one's age.
    flight: Vec<(u64, u64)>,
    not_timed: NotTimed,
    /// From attaching to the stop.
    elapsed: Duration,
}

/// Reads the calls in flight, the histograms and the not-timed counts.
fn read_at_stop(skel: &FunclatencySkel<'_>, probes: &[Probe], attached: Instant) -> anyhow::Result<AtStop> {
    let flight = in_flight(skel, probes)?;
    let hists = crate::engine::hist::read_percpu(&skel.maps.hists, probes.len())?;
    let elapsed = attached.elapsed();
    let st = |slot| percpu_sum(&skel.maps.stats, slot);
    let not_timed = NotTimed {
        too_deep: st(FL_TOO_DEEP)?,
        threads_full: st(FL_THREADS_FULL)?,
        unmatched_returns: st(FL_UNMATCHED)?,
    };
    Ok(AtStop { hists, flight, not_timed, elapsed })
}

/// Step 1: checks the arguments and resolves the targets into probes.
fn validate(a: &FunclatencyArgs) -> anyhow::Result<(TaskFilter, Vec<Probe>)> {
    if a.interval.is_some_and(|i| i < Duration::from_millis(100)) {
        return Err(usage("-i: at least 100ms"));
    }
    a.scope.resolve()
}

/// Step 2: loads and attaches, by the first way the kernel allows.
fn load(a: &FunclatencyArgs, tf: &TaskFilter, probes: &[Probe]) -> anyhow::Result<Loaded> {
    features::require_tracing_privileges()?;
    stacktool::raise_open_files();
    load_with_fallback(&a.scope.pid, tf, probes, &a.scope, None)
}

/// Step 3: waits for the stop, pruning dead threads' stacks every second
/// and, with -i, printing each interval's calls.
fn poll(
    out: &mut Output,
    a: &FunclatencyArgs,
    ctl: &RunControl,
    skel: &FunclatencySkel<'_>,
    probes: &[Probe],
    attached: Instant,
    targets: &mut Targets,
) -> anyhow::Result<Stop> {
    let n = probes.len();
    let mut last = vec![Hist::default(); n];
    let mut next_prune = attached + Duration::from_secs(1);
    let mut interval_no = 0u64;
    poll_until_stop(None, ctl, a.interval, |due| {
        if Instant::now() >= next_prune {
            prune_dead_threads(&skel.maps.stacks);
            next_prune = Instant::now() + Duration::from_secs(1);
            // -p: the run ends with its targets.
            if targets.all_gone(&skel.maps.tf_pids) {
                ctl.request_stop();
            }
        }
        let Some(iv) = a.interval.filter(|_| due) else { return Ok(()) };
        interval_no += 1;
        let now = crate::engine::hist::read_percpu(&skel.maps.hists, n)?;
        print_interval(out, probes, &now, &last, interval_no, iv)?;
        out.sink.flush()?;
        last = now;
        Ok(())
    })
}

/// Prints the calls of interval `no` (histograms `now` less `last`).
fn print_interval(
    out: &mut Output,
    probes: &[Probe],
    now: &[Hist],
    last: &[Hist],
    no: u64,
    iv: Duration,
) -> anyhow::Result<()> {
    for (i, p) in probes.iter().enumerate() {
        let r = TargetResult { probe: p.clone(), hist: now[i].since(&last[i]), in_flight: 0, oldest_in_flight_ns: 0 };
        if out.json {
            out.sink.json(&LatencyLine::new(&r, Some(no)))?;
        } else if r.hist.count > 0 {
            let t = target_text(&r);
            out.sink.line(t.strip_suffix('\n').unwrap_or(&t))?;
        }
    }
    if !out.json {
        out.sink.line(&format!("-- interval {no} ({} s)", iv.as_secs_f64()))?;
    }
    Ok(())
}

/// Each probe with its histogram and calls in flight.
fn target_results(probes: Vec<Probe>, hists: Vec<Hist>, flight: Vec<(u64, u64)>) -> Vec<TargetResult> {
    probes
        .into_iter()
        .zip(hists)
        .zip(flight)
        .map(|((probe, hist), (in_flight, oldest))| TargetResult {
            probe,
            hist,
            in_flight,
            oldest_in_flight_ns: oldest,
        })
        .collect()
}

/// Step 4: the summary of the targets' results.
fn summary(targets: &[TargetResult], elapsed: Duration, not_timed: NotTimed, probing: Probing) -> Summary {
    let user = targets.iter().any(|t| matches!(t.probe.kind, ProbeKind::User { .. }));
    Summary {
        ty: "summary",
        duration_s: elapsed.as_secs_f64(),
        targets: targets.len(),
        calls: targets.iter().map(|t| t.hist.count).sum(),
        in_flight: targets.iter().map(|t| t.in_flight).sum(),
        not_timed,
        uprobe_mechanism: user.then_some(if probing.umulti { "uprobe-multi" } else { "uprobe" }),
        kernel_mechanism: probing.kernel.map(KernelMechanism::name),
        unprobeable: probing.unprobeable,
    }
}

/// Runs funclatency; `ready` is called once every probe is attached.
pub fn run_with(
    a: &FunclatencyArgs,
    ctl: &RunControl,
    out: &mut Output,
    ready: impl FnOnce(),
) -> anyhow::Result<Outcome> {
    let (tf, probes) = validate(a)?;
    let loaded = load(a, &tf, &probes)?;
    let mut targets = Targets::new(&tf, None);
    ctl.start_clock();
    let attached = Instant::now();
    ready();
    let stop = poll(out, a, ctl, &loaded.skel, &probes, attached, &mut targets)?;
    let at_stop = read_at_stop(&loaded.skel, &probes, attached)?;
    detach(loaded.links);
    let targets = target_results(probes, at_stop.hists, at_stop.flight);
    let summary = summary(&targets, at_stop.elapsed, at_stop.not_timed, loaded.probing);
    Ok(Outcome { targets, summary, stop })
}

/// How funclatency runs on this kernel (`sonde doctor`): uprobes for user functions, syscall tracepoints, softirq
/// tracepoints; kernel functions need fentry or kprobes.
pub fn doctor(cx: &Caps) -> Value {
    let ok = |n: &str| cx.ok(n);
    let cookie = features::has_attach_cookie();
    // Without cookies only kprobes take a per-target program copy.
    let allowed: Vec<&str> = KERNEL_MECHANISMS
        .iter()
        .filter(|(m, _)| ok(m.needs()) && (cookie || *m == KernelMechanism::Kprobe))
        .map(|(_, d)| *d)
        .collect();
    let kernel_fn = if allowed.is_empty() {
        "kernel:GLOB unavailable: neither fentry nor kprobes here".to_string()
    } else {
        format!("kernel:GLOB: {}", allowed.join(", else "))
    };
    let copies = if cookie {
        ""
    } else {
        "; no bpf_get_attach_cookie (5.15): a program copy per target, attached by perf event"
    };
    let multi = features::btf_has_type("bpf_uprobe_multi_link");
    let syscalls = features::tracepoint_exists("syscalls", "sys_enter_read");
    json!({
        "usable": ok("uprobe") || ok("tracepoint"),
        "mechanism": "uprobe + tracepoint",
        "user_functions": ok("uprobe"),
        "uprobe_multi": ok("uprobe") && multi,
        "syscalls": ok("tracepoint") && syscalls,
        "softirqs": ok("tp_btf") || ok("raw_tp"),
        "kernel_functions": (ok("fentry") && cookie) || ok("kprobe"),
        "attach_cookie": cookie,
        "detail": format!(
            "user functions: {}; syscalls: {}; softirqs: {}; {kernel_fn}{copies}",
            match (ok("uprobe"), multi) {
                (true, true) => "uprobe.multi links, one per binary",
                (true, false) => "a uprobe/uretprobe per function (no uprobe.multi here)",
                (false, _) => "no uprobes",
            },
            if syscalls { "syscalls:sys_enter_*/sys_exit_*" } else { "no syscall tracepoints" },
            if ok("tp_btf") {
                "tp_btf irq:softirq_entry/exit"
            } else if ok("raw_tp") {
                "raw_tp irq:softirq_entry/exit"
            } else {
                "unavailable"
            }
        ),
    })
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &FunclatencyArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.scope.run.duration)?;
    let mut out = Output::open(a)?;
    let res = run_with(a, &ctl, &mut out, || eprintln!("sonde: timing calls; Ctrl-C ends and prints the histograms"))?;
    if out.json {
        print_json(&mut out.sink, &res)?;
    } else {
        print_text(&mut out.sink, &res)?;
    }
    out.sink.flush()?;
    Ok(res.stop.exit_code())
}

/// A line per target, then the summary.
fn print_json(sink: &mut Sink, out: &Outcome) -> anyhow::Result<()> {
    for t in &out.targets {
        sink.json(&LatencyLine::new(t, None))?;
    }
    sink.json(&out.summary)?;
    Ok(())
}

/// Each target's histogram; the totals and what was not timed to stderr.
fn print_text(sink: &mut Sink, out: &Outcome) -> anyhow::Result<()> {
    for t in &out.targets {
        let text = target_text(t);
        sink.line(text.strip_suffix('\n').unwrap_or(&text))?;
    }
    let s = &out.summary;
    let nt = &s.not_timed;
    eprintln!(
        "{} calls in {} targets over {:.1} s; {} in flight at the end; not timed: {} nested deeper than {DEPTH}, {} with the thread map full, {} returns whose entry was not seen",
        s.calls, s.targets, s.duration_s, s.in_flight, nt.too_deep, nt.threads_full, nt.unmatched_returns
    );
    unprobeable_note(&s.unprobeable);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use libbpf_rs::skel::SkelBuilder;

    use super::*;

    /// The stats map ends with the stack slots right after the tool's own,
    /// as the slot constants copied from the C header say (no root needed:
    /// the object is opened, not loaded).
    #[test]
    fn stats_map_size_matches_the_slot_constants() {
        let mut storage = MaybeUninit::uninit();
        let open = skel::FunclatencySkelBuilder::default().open(&mut storage).expect("open the object");
        assert_eq!(open.maps.stats.max_entries(), FL_STACKS + crate::engine::stacktool::STACK_STATS);
    }
}
