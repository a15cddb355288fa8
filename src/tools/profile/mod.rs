//! `sonde profile`: CPU samples of every CPU (a perf event per CPU) with
//! kernel and user stacks, counted in the kernel, symbolized once per unique
//! address, written as folded stacks, SVG flame graphs or a top table.
use std::{mem::MaybeUninit, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{Args, ValueEnum};
use libbpf_rs::{
    skel::{OpenSkel, SkelBuilder},
    Link, OpenObject,
};

use crate::engine::caps::{cannot, Caps};
use crate::engine::{
    error::{env, usage},
    features,
    output::RunArgs,
    perf::Counter,
    pprof::Weight,
    record::percpu_sum,
    render::Format,
    run::{RunControl, Stop},
    stacks::SymStats,
    stacktool::{self, StackLoss, StackSummary},
    taskfilter::{Targets, TaskArgs, TaskFilter},
    unwind::{self, UnwindArgs},
};
use serde::Serialize;
use serde_json::{json, Value};

crate::skeleton!("profile");
use skel::{ProfileSkel, ProfileSkelBuilder};

const PS_SAMPLES: u32 = 0;
const PS_IDLE: u32 = 1;
const PS_FILTERED: u32 = 2;
const PS_STACKS: u32 = 3;

/// What the perf event counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "kebab-case")]
pub enum Event {
    /// CPU time (a software timer; works everywhere, also in VMs).
    CpuClock,
    /// CPU cycles (the PMU; often missing in VMs).
    Cycles,
}

/// Sample on-CPU stacks at a fixed rate and show where CPU time goes.
///
/// Without -o: the hottest functions (self and total) in the terminal. With
/// -o FILE (repeatable), by extension: .folded (flamegraph.pl / inferno
/// input, the process name as root frame, kernel frames ending in _[k],
/// inlined ones in _[i], Python functions in _[py], Go functions in _[go],
/// Java methods and JIT code in _[j], JavaScript functions in _[js]),
/// .svg (flame graph) or .json (stacks with file and
/// line per frame) or .pb.gz (pprof, for `go tool pprof`). User stacks are
/// walked from each executable's unwind tables (.eh_frame), so programs built
/// without frame pointers get whole stacks (--unwind); stacks that still do
/// not reach a program's start are marked [truncated] and counted with why.
/// Python (CPython 3.8-3.15), Go (stripped too), Java (HotSpot, JDK 11-27:
/// interpreted, compiled and inlined methods) and Node.js (18-26:
/// interpreted, baseline, optimized and inlined functions) programs show
/// their own functions, files and lines, read in the kernel without stopping them and
/// with no flag or agent (--frames; `sonde doctor --pid PID` says what sonde
/// finds in a process); a newer version that describes itself as a known
/// one does is read and said to be untested. Other JITs' code is named from
/// the process's perf map or mapped jitdump. `-- CMD ARGS` starts a command
/// and follows it and what it starts to their end.
///
/// OVERHEAD: one perf-event interrupt per CPU per sample period, a user-stack
/// walk and one in-kernel hash update per sample; nothing per sample in user
/// space. bench/profile/run, 2-core VM, CPU-bound spinner per CPU: throughput
/// loss within noise at 49 and 99 Hz, 1.6% at 999 Hz; 19,388 unique stacks
/// symbolized and rendered in 450 ms; peak RSS 66 MiB. bench/unwind/run, a
/// build without frame pointers 35 frames deep: the table walk costs 2.8-4.6
/// us per sample in BPF (the frame-pointer walk, cut at 1 frame: 2.0-2.5 us);
/// target throughput loss 0.5-1.5% at 99 Hz and 2.4-3.2% at 999 Hz, the same
/// as perf record --call-graph dwarf within noise, with 0.22 s of CPU in
/// sonde's process per 8 s run against perf's 0.46-0.55 s. Unwind tables:
/// 1.1-1.4 bytes of kernel memory per byte of .eh_frame (libc: 187 KB),
/// built in 3-90 ms per file, read from the disk cache in under 15 ms.
/// Python frames (bench/python/run, 33 Python frames deep): in BPF 64 ns per
/// Python frame per sample on a recursion (0.64x the native walk), 152 ns
/// on as many distinct functions (1.37x: one read per code object); naming
/// 151-181 ms per 10,000 code objects, once each; 0.18 s of sonde's CPU per
/// 8 s at 99 Hz (0.16 s with --frames native), 0.23 s at 999 Hz where
/// py-spy --nonblocking takes 8.3 s. Go frames cost nothing beyond the
/// table walk. Java frames (bench/java/run, JIT-compiled, 30 deep): in BPF
/// 175 ns per Java frame (0.41x a frame-pointer walk of the same depth);
/// target throughput loss 0.65% at 99 Hz and 2.0% at 999 Hz, where
/// async-profiler (an agent in the JVM) costs 0.79% and 5.4%. JavaScript
/// frames (bench/node/run, Node 20, 29 frames deep): in BPF 98-124 ns per
/// JavaScript frame (0.58-0.81x the frame-pointer walk of the same depth);
/// at 99 Hz the target's throughput stays within this VM's run-to-run
/// noise (-1.4% and 2.0% in two runs; node --cpu-prof 1.3-2.2%), the
/// sampling itself 0.08% of its CPU; 0.6 s of sonde's CPU per 9 s run.
#[derive(Debug, Args)]
#[command(mut_arg("output", |a| a.help("Write here, repeatable; the extension picks the format: .folded, .svg, .html (interactive), .json or .pb.gz (pprof)")))]
#[command(mut_arg("json", |a| a.help("Print every stack as a JSON line on stdout, then a summary line")))]
pub struct ProfileArgs {
    /// Samples per second per CPU.
    #[arg(short = 'F', long = "frequency", default_value_t = 49)]
    pub frequency: u64,
    /// Which tasks.
    #[command(flatten)]
    pub task: TaskArgs,
    /// User stacks only.
    #[arg(long, conflicts_with = "kernel_only")]
    pub user_only: bool,
    /// Kernel stacks only.
    #[arg(long)]
    pub kernel_only: bool,
    /// Include samples of idle CPUs (the swapper tasks).
    #[arg(long)]
    pub include_idle: bool,
    /// Keep threads apart (the thread id becomes part of each stack).
    #[arg(long)]
    pub per_thread: bool,
    /// What to sample on.
    #[arg(long, value_enum, default_value_t = Event::CpuClock)]
    pub event: Event,
    /// Rows of the top table.
    #[arg(long, default_value_t = 25)]
    pub top: usize,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
    /// How user stacks are walked.
    #[command(flatten)]
    pub unwind: UnwindArgs,
}

/// What a finished profile saw (labs and tests use it).
pub struct Outcome {
    /// Symbolized stacks.
    pub stacks: Vec<crate::engine::stacks::Stack>,
    /// Totals.
    pub totals: Totals,
    /// Why it stopped.
    pub stop: Stop,
    /// The summary's symbolization lines.
    pub sym_line: String,
    /// How user stacks were walked.
    pub unwind: unwind::Report,
    /// The summary's figures about truncation and unwinding.
    pub stack_summary: StackSummary,
}

/// Summary numbers of a run.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    /// Samples counted.
    pub samples: u64,
    /// Idle samples skipped.
    pub idle: u64,
    /// Samples of other tasks skipped by filters.
    pub filtered: u64,
    /// Stacks (and samples) the kernel half could not keep.
    pub loss: StackLoss,
    /// Unique stacks.
    pub unique_stacks: u64,
    /// Symbolization figures.
    pub sym: SymStats,
    /// Time spent symbolizing and rendering.
    pub render_time: Duration,
}

fn max_sample_rate() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100_000)
}

fn validate(a: &ProfileArgs) -> anyhow::Result<(Vec<(PathBuf, Format)>, TaskFilter)> {
    let outs = stacktool::check_outputs(&a.run.output)?;
    if a.frequency == 0 {
        return Err(usage("-F 0: the sampling frequency must be at least 1 Hz (default 49)"));
    }
    let max = max_sample_rate();
    if a.frequency > max {
        return Err(usage(format!(
            "-F {}: above this kernel's limit of {max} Hz (kernel.perf_event_max_sample_rate); use a lower rate",
            a.frequency
        )));
    }
    let tf = a.task.validate()?;
    Ok((outs, tf))
}

struct Loaded {
    skel: ProfileSkel<'static>,
    _links: Vec<Link>,
}

fn load(a: &ProfileArgs, tf: &TaskFilter, plan: &unwind::Plan) -> anyhow::Result<(Loaded, unwind::Session)> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = ProfileSkelBuilder::default().open(storage).context("opening BPF object")?;
    crate::set_unwind!(&mut open, plan, tf.processes_now().is_some());
    crate::set_sample_stacks!(&mut open);
    crate::set_task_follow!(&mut open, tf);
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    ro.include_idle = a.include_idle;
    ro.want_kernel = !a.user_only;
    ro.want_user = !a.kernel_only;
    ro.per_thread = a.per_thread;
    crate::set_task_filter!(&mut *ro, tf);
    let skel = open.load().context("loading the profile program")?;
    tf.fill_pids(&skel.maps.tf_pids)?;
    // Tables of the targets before the first sample.
    let session = unwind::Session::start(plan, &crate::unw_maps!(skel), tf);
    let mut links = Vec::new();
    if plan.tables {
        links.push(skel.progs.unw_exec.attach().context("attaching sched_process_exec")?);
    }
    if tf.follow {
        links.push(skel.progs.tf_fork.attach().context("attaching sched_process_fork")?);
    }
    let counter = match a.event {
        Event::CpuClock => Counter::CpuClock,
        Event::Cycles => Counter::Cycles,
    };
    links.extend(crate::engine::perf::attach_sampling(&skel.progs.on_sample, counter, a.frequency, |cpu, e| match (a.event, e.raw_os_error()) {
        (Event::Cycles, Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV)) => {
            env("--event cycles: this machine has no usable cycles counter (no PMU, e.g. in a VM); use the default cpu-clock")
        }
        _ => anyhow::Error::new(e).context(format!("opening a perf event on CPU {cpu}")),
    })?);
    Ok((Loaded { skel, _links: links }, session))
}

/// Whether this kernel loads profile's program with the table walk (the
/// walk every stack tool shares), for `sonde doctor`.
pub fn table_walk_loads() -> anyhow::Result<()> {
    unwind::kernel_can_walk().map_err(anyhow::Error::msg)?;
    let plan = unwind::Plan {
        tables: true,
        asked: unwind::UnwindMode::Dwarf,
        fallback: None,
        frames: crate::engine::runtime::Frames::Mixed,
    };
    let mut storage = MaybeUninit::uninit();
    let mut open = ProfileSkelBuilder::default().open(&mut storage).context("opening BPF object")?;
    crate::set_unwind!(&mut open, &plan, true);
    open.load().context("loading the profile program with the table walk")?;
    Ok(())
}

/// Runs a profile; `ready` is called once sampling runs.
pub fn run_with(a: &ProfileArgs, ctl: &RunControl, ready: impl FnOnce()) -> anyhow::Result<Outcome> {
    let (outs, mut tf) = validate(a)?;
    crate::engine::symbols::prefetch_signal_register_ranges();
    features::require_tracing_privileges()?;
    let plan = unwind::Plan::new(&a.unwind)?;
    stacktool::raise_open_files();
    let launched = a.task.launch(&mut tf)?;
    let (loaded, mut session) = load(a, &tf, &plan)?;
    let mut targets = Targets::new(&tf, launched);
    let attached = std::time::Instant::now();
    let skel = &loaded.skel;
    let um = crate::unw_maps!(skel);
    ready();
    // Processes that exec or start wake the poll to load their tables.
    let wake_rb = session.wake_ring(um.wake)?;
    let (stop, images) = stacktool::run_until_stop(
        &skel.maps.stk_counts,
        ctl,
        a.run.duration,
        wake_rb.as_ref(),
        (&mut session, &um),
        (&mut targets, &skel.maps.tf_pids),
        Vec::new,
        || Ok(format!("sonde profile: {} samples", percpu_sum(&skel.maps.stats, PS_SAMPLES)?)),
    )?;
    drop(loaded._links);
    let unwind = session.report(&um)?;
    // The window the programs were attached: what the counts cover.
    let elapsed = attached.elapsed();
    let st = |slot| percpu_sum(&skel.maps.stats, slot);
    let mut totals = Totals {
        samples: st(PS_SAMPLES)?,
        idle: st(PS_IDLE)?,
        filtered: st(PS_FILTERED)?,
        loss: StackLoss::read(&skel.maps.stats, PS_STACKS)?,
        ..Default::default()
    };
    let mut f = stacktool::finish(
        &skel.maps.stk_counts,
        crate::stack_maps!(skel),
        images,
        &stacktool::Outputs {
            outs: &outs,
            title: format!("sonde profile, {} Hz, {:.1} s", a.frequency, elapsed.as_secs_f64()),
            count_name: "samples",
            divisor: 1,
            weight: Weight::Samples { period_ns: (1e9 / a.frequency as f64) as i64 },
            elapsed,
            comment: format!("sonde profile -F {} ({:?})", a.frequency, a.event),
            relabel: None,
        },
    )?;
    f.command = stacktool::CommandSummary::of(&targets, &skel.maps.tf_pids, &skel.maps.tf_lost);
    let sym_line = stacktool::sym_summary(&f, "samples", Some(&unwind));
    let stack_summary = StackSummary::of(&f, &unwind);
    totals.unique_stacks = f.unique;
    totals.sym = f.sym;
    totals.render_time = f.render_time;
    Ok(Outcome { stacks: f.stacks, totals, stop, sym_line, unwind, stack_summary })
}

fn summary(t: &Totals, hz: u64, sym_line: &str) -> String {
    let mut s = format!(
        "{} samples ({:.2} s of CPU at {hz} Hz), {} unique stacks; skipped: {} idle, {} filtered",
        t.samples,
        t.samples as f64 / hz as f64,
        t.unique_stacks,
        t.idle,
        t.filtered
    );
    s.push_str(&format!(
        "\nstacks lost: {} to hash collisions, {} kernel and {} user not captured, {} samples with the count map full",
        t.loss.collisions, t.loss.kernel_errors, t.loss.user_errors, t.loss.counts_full
    ));
    s.push('\n');
    s.push_str(sym_line);
    if t.loss.collisions > 0 {
        s.push_str("\nhint: many unique stacks; profile a shorter time or fewer processes");
    }
    s
}

/// How profile runs on this kernel (`sonde doctor`): a BPF program on a
/// sampling perf event per CPU.
pub fn doctor(cx: &Caps) -> Value {
    if !cx.ok("perf_event") {
        return cannot("BPF programs cannot attach to perf events here (see perf_event above)");
    }
    let cycles = crate::engine::perf::has_cycles();
    cx.with_unwind(json!({
        "usable": true,
        "mechanism": "perf_event",
        "detail": if cycles { "cpu-clock; --event cycles available" } else { "cpu-clock; no cycles PMU (--event cycles unavailable)" },
        "cycles": cycles,
    }))
}

/// profile's `{"type":"summary",...}` line (schema in the README).
#[derive(Debug, Serialize)]
pub struct Summary<'a> {
    /// Always "summary".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Samples counted.
    pub samples: u64,
    /// Samples per second per CPU asked for.
    pub frequency_hz: u64,
    /// Samples of idle CPUs left out.
    pub idle: u64,
    /// Samples of tasks the filters left out.
    pub filtered: u64,
    /// Distinct stacks.
    pub unique_stacks: u64,
    /// Stacks the kernel half could not keep.
    pub lost: StackLoss,
    /// Samples whose stack was cut short.
    pub truncated_samples: u64,
    /// Symbolization and unwinding.
    #[serde(flatten)]
    pub stacks: &'a StackSummary,
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &ProfileArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.run.duration)?;
    let out = run_with(a, &ctl, || {
        eprintln!("sonde: sampling CPU stacks at {} Hz; Ctrl-C ends and writes the results", a.frequency);
    })?;
    let t = &out.totals;
    if a.run.json {
        let summary = Summary {
            kind: "summary",
            samples: t.samples,
            frequency_hz: a.frequency,
            idle: t.idle,
            filtered: t.filtered,
            unique_stacks: t.unique_stacks,
            lost: t.loss,
            truncated_samples: t.sym.truncated_samples,
            stacks: &out.stack_summary,
        };
        stacktool::print_json(&out.stacks, &summary)?;
        return Ok(out.stop.exit_code());
    }
    if a.run.output.is_empty() {
        stacktool::print_top(&out.stacks, a.top, "SAMPLES", |n| n.to_string())?;
    }
    eprintln!("{}", summary(t, a.frequency, &out.sym_line));
    Ok(out.stop.exit_code())
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
        let open = skel::ProfileSkelBuilder::default().open(&mut storage).expect("open the object");
        assert_eq!(open.maps.stats.max_entries(), PS_STACKS + crate::engine::stacktool::STACK_STATS);
    }
}
