//! `sonde offcpu`: where threads wait. Blocked time per (thread, kernel +
//! user stack at the moment it went off CPU), from sched_switch, in
//! microseconds; the same outputs as `profile`.
use std::{mem::MaybeUninit, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{Args, ValueEnum};
use libbpf_rs::{
    skel::{OpenSkel, SkelBuilder},
    Link, MapCore, OpenObject,
};

use crate::engine::caps::{cannot, Caps};
use crate::engine::{
    attach::{self, with_fallbacks, Mechanism, Mechanisms},
    error::usage,
    features,
    output::RunArgs,
    pprof::Weight,
    record::percpu_sum,
    render::Format,
    run::{duration_arg, duration_or_zero_arg, RunControl, Stop},
    stacks::Stack,
    stacktool::{self, StackLoss, StackSummary},
    taskfilter::{Targets, TaskArgs, TaskFilter},
    unwind::{self, UnwindArgs},
};
use serde::Serialize;
use serde_json::{json, Value};

crate::skeleton!("offcpu");
use skel::{OffcpuSkel, OffcpuSkelBuilder};

const OS_SWITCHES: u32 = 0;
const OS_RECORDED: u32 = 1;
const OS_SHORT: u32 = 2;
const OS_LONG: u32 = 3;
const OS_STARTS_FULL: u32 = 4;
const OS_SAMPLED: u32 = 5;
const OS_SAMPLED_OUT: u32 = 6;
const OS_NOT_WALKED: u32 = 7;
const OS_IRQ_WAKERS: u32 = 8;
const OS_STACKS: u32 = 9;

/// Which blocked states to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "kebab-case")]
pub enum State {
    /// Preempted while runnable (waiting for a CPU).
    Running,
    /// Sleeping, wakeable by signals (poll, read, futex, nanosleep...).
    Interruptible,
    /// Sleeping, not wakeable by signals (mostly disk I/O).
    Uninterruptible,
}

/// Where threads wait: time off CPU per stack.
///
/// A traced thread going off CPU (after the filters) gets a start time. Where
/// the kernel has sched_exit_tp, the period ends right after the thread is
/// switched back in, in its own context: only periods within
/// --min-block/--max-block and kept by sampling (--sample-below) get their
/// kernel and user stacks walked. Elsewhere the stacks are walked at every
/// switch-out. Outputs as for `profile`, weights in microseconds: .folded,
/// .svg, .html, .pb.gz (sample type offcpu/nanoseconds), .json, or the top
/// table.
///
/// OVERHEAD: two small programs on every context switch (can be >1M/s on busy
/// hosts). bench/offcpu/run, pipe ping-pong, all tasks traced, defaults:
/// 137-254 ns per switch in BPF. That is 1.1% fewer round trips at ~125k
/// switches/s, and 6-15% at 400k-800k switches/s. With the ping-pong filtered
/// out: ~110 ns. Exact (--sample-below 0): 1.4-2.1 us per switch and 12-60%
/// fewer round trips. User stacks walked from unwind tables (--unwind auto,
/// the default) cost the same per switch as frame pointers within the noise
/// (bench/unwind/run, two-CPU ping-pong: 479-620 ns against 503-625 ns per
/// switch at the default sampling). A blocked Python thread's stack adds
/// 64-152 ns per Python frame to its walk (bench/python/run: a 1 KiB read
/// serves several frames, one read per distinct code object); a blocked
/// Java thread's, 175 ns per Java frame (bench/java/run); a blocked Node
/// thread's, 98-124 ns per JavaScript frame (bench/node/run).
#[derive(Debug, Args)]
#[command(mut_arg("output", |a| a.help("Write here, repeatable; the extension picks the format: .folded, .svg, .html (interactive), .json or .pb.gz (pprof)")))]
#[command(mut_arg("json", |a| a.help("Print every stack as a JSON line on stdout, then a summary line")))]
pub struct OffcpuArgs {
    /// Which tasks.
    #[command(flatten)]
    pub task: TaskArgs,
    /// Ignore blocks shorter than this (e.g. 1ms, 100us).
    #[arg(long, value_parser = duration_arg, default_value = "1us")]
    pub min_block: Duration,
    /// Ignore blocks longer than this.
    #[arg(long, value_parser = duration_arg)]
    pub max_block: Option<Duration>,
    /// Blocks shorter than this are sampled: kept with probability
    /// (block / this) and then counted as this long, so each stack's total is
    /// an unbiased estimate while stack walks for short blocks stay bounded.
    /// 0 keeps every block (exact, at full cost). Needs the sched_exit_tp
    /// hook (see `sonde doctor`); without it every block is kept.
    #[arg(long, value_parser = duration_or_zero_arg, default_value = "1ms")]
    pub sample_below: Duration,
    /// Only these states when going off CPU (repeatable; default all).
    #[arg(long, value_enum)]
    pub state: Vec<State>,
    /// User stacks only.
    #[arg(long, conflicts_with = "kernel_only")]
    pub user_only: bool,
    /// Kernel stacks only.
    #[arg(long)]
    pub kernel_only: bool,
    /// Merge the threads of a process (default: one stack set per thread).
    #[arg(long)]
    pub per_process: bool,
    /// Rows of the top table.
    #[arg(long, default_value_t = 25)]
    pub top: usize,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
    /// Force one attach mechanism instead of the best available.
    #[arg(long, value_parser = attach::parser(MECHANISMS))]
    pub mechanism: Option<Mechanism>,
    /// Take the stacks at sched_switch, as on kernels without the
    /// sched_exit_tp hook (every block's stacks, no sampling), to compare.
    #[arg(long)]
    pub switch_only: bool,
    /// How user stacks are walked.
    #[command(flatten)]
    pub unwind: UnwindArgs,
}

/// offcpu's and wakeup's mechanisms in fallback order (`--mechanism` forces
/// one; doctor reports the first that loads).
pub const MECHANISMS: &Mechanisms = &[
    (
        Mechanism::TpBtf,
        "BTF-typed tracepoints; start records in task storage where the kernel allocates it with bpf_mem_alloc, else a hash",
    ),
    (Mechanism::RawTp, "raw tracepoints; start records in a hash by thread id"),
];

/// What a finished run saw.
pub struct Outcome {
    /// Stacks weighted by blocked microseconds.
    pub stacks: Vec<Stack>,
    /// The summary.
    pub summary: Summary,
    /// Summary text.
    pub text: String,
    /// Why it stopped.
    pub stop: Stop,
}

struct Loaded {
    skel: OffcpuSkel<'static>,
    session: unwind::Session,
    _links: Vec<Link>,
}

fn load(
    a: &OffcpuArgs,
    tf: &TaskFilter,
    plan: &unwind::Plan,
    mech: Mechanism,
    wake: bool,
    at_exit: bool,
) -> anyhow::Result<Loaded> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = OffcpuSkelBuilder::default().open(storage).context("opening BPF object")?;
    crate::set_unwind!(&mut open, plan, tf.processes_now().is_some());
    crate::set_task_follow!(&mut open, tf);
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    ro.want_kernel = !a.user_only;
    ro.want_user = !a.kernel_only;
    ro.per_thread = !a.per_process;
    crate::set_task_filter!(&mut *ro, tf);
    ro.state_mask = a
        .state
        .iter()
        .map(|s| match s {
            State::Running => 1,
            State::Interruptible => 2,
            State::Uninterruptible => 4,
        })
        .fold(0, |m, b| m | b);
    ro.min_block_ns = a.min_block.as_nanos() as u64;
    ro.max_block_ns = a.max_block.map(|d| d.as_nanos() as u64).unwrap_or(u64::MAX);
    ro.want_waker = wake;
    if wake && !a.kernel_only {
        // Wake-ups from interrupt context: no user stack of the interrupted task.
        for (i, (lo, hi)) in crate::engine::symbols::interrupt_entry_ranges().into_iter().take(4).enumerate() {
            ro.irq_lo[i] = lo;
            ro.irq_hi[i] = hi;
        }
    }
    ro.at_exit = at_exit;
    ro.sample_ns = if at_exit { a.sample_below.as_nanos() as u64 } else { 0 };
    let typed = mech == Mechanism::TpBtf;
    open.progs.btf_switch.set_autoload(typed);
    open.progs.raw_switch.set_autoload(!typed);
    open.progs.btf_exit.set_autoload(typed && at_exit);
    open.progs.raw_exit.set_autoload(!typed && at_exit);
    open.progs.btf_waking.set_autoload(typed && wake);
    open.progs.raw_waking.set_autoload(!typed && wake);
    // Start records live in task storage only where the BPF half uses it
    // (task_storage_ok: tp_btf, and local storage allocated by bpf_mem_alloc);
    // elsewhere the map is not created at all: kernels before 5.11 have no
    // task storage, and creating it there fails the whole load.
    if !(typed && features::btf_struct_has_member("bpf_local_storage_map", "selem_ma")) {
        open.maps.task_starts.set_autocreate(false)?;
    }
    let skel = open.load().with_context(|| format!("loading {mech} programs"))?;
    tf.fill_pids(&skel.maps.tf_pids)?;
    let session = unwind::Session::start(plan, &crate::unw_maps!(skel), tf);
    let mut links = Vec::new();
    if plan.tables {
        links.push(skel.progs.unw_exec.attach().context("attaching sched_process_exec")?);
    }
    if tf.follow {
        links.push(skel.progs.tf_fork.attach().context("attaching sched_process_fork")?);
    }
    links.push(if typed { skel.progs.btf_switch.attach()? } else { skel.progs.raw_switch.attach()? });
    if at_exit {
        links.push(if typed { skel.progs.btf_exit.attach()? } else { skel.progs.raw_exit.attach()? });
    }
    if wake {
        links.push(if typed { skel.progs.btf_waking.attach()? } else { skel.progs.raw_waking.attach()? });
    }
    Ok(Loaded { skel, session, _links: links })
}

fn validate(a: &OffcpuArgs) -> anyhow::Result<(Vec<(PathBuf, Format)>, TaskFilter)> {
    let outs = stacktool::check_outputs(&a.run.output)?;
    if let Some(m) = a.max_block {
        if m < a.min_block {
            return Err(usage(format!(
                "--max-block {m:?} is below --min-block {:?}; raise it or drop it",
                a.min_block
            )));
        }
    }
    if a.sample_below > Duration::from_secs(1) {
        return Err(usage(format!("--sample-below {:?}: at most 1s (0 turns sampling off)", a.sample_below)));
    }
    let tf = a.task.validate()?;
    Ok((outs, tf))
}

fn us(v: u64) -> String {
    match v {
        v if v >= 10_000_000 => format!("{:.1}s", v as f64 / 1e6),
        v if v >= 10_000 => format!("{:.1}ms", v as f64 / 1e3),
        v => format!("{v}us"),
    }
}

/// Runs offcpu (or, with `wake`, wakeup); `ready` is called once tracing runs.
pub fn run_with(a: &OffcpuArgs, ctl: &RunControl, wake: bool, ready: impl FnOnce()) -> anyhow::Result<Outcome> {
    let (outs, mut tf) = validate(a)?;
    features::require_tracing_privileges()?;
    let plan = unwind::Plan::new(&a.unwind)?;
    stacktool::raise_open_files();
    let launched = a.task.launch(&mut tf)?;
    let mut targets = Targets::new(&tf, launched);
    let order = &attach::order(MECHANISMS, a.mechanism);
    // Best: sched_exit_tp, right after the switch in the context of the
    // thread that runs again; else everything at sched_switch.
    let exit = if a.switch_only {
        Err(anyhow::anyhow!("--switch-only"))
    } else {
        with_fallbacks("sched:sched_switch and sched_exit_tp", order, |m| load(a, &tf, &plan, m, wake, true))
    };
    let (loaded, mech, at_exit) = match exit {
        Ok((l, m, _)) => (l, m, true),
        Err(_) => {
            let (l, m, _) = with_fallbacks("sched:sched_switch", order, |m| load(a, &tf, &plan, m, wake, false))?;
            (l, m, false)
        }
    };
    let attached = std::time::Instant::now();
    let Loaded { skel, mut session, _links } = loaded;
    let skel = &skel;
    let um = crate::unw_maps!(skel);
    ready();
    let counts: &dyn MapCore = if wake { &skel.maps.wake_counts } else { &skel.maps.stk_counts };
    // Processes that exec or start wake the poll to load their tables.
    let wake_rb = session.wake_ring(um.wake)?;
    let (stop, images) = stacktool::run_until_stop(
        counts,
        ctl,
        a.run.duration,
        wake_rb.as_ref(),
        (&mut session, &um),
        (&mut targets, &skel.maps.tf_pids),
        Vec::new,
        || {
            Ok(format!(
                "sonde {}: {} blocked periods",
                if wake { "wakeup" } else { "offcpu" },
                percpu_sum(&skel.maps.stats, OS_RECORDED)?
            ))
        },
    )?;
    drop(_links);
    let unwind = session.report(&um)?;
    // The window the programs were attached: what the counts cover.
    let elapsed = attached.elapsed();
    let st = |slot| percpu_sum(&skel.maps.stats, slot);
    let (switches, recorded, short, long, full) =
        (st(OS_SWITCHES)?, st(OS_RECORDED)?, st(OS_SHORT)?, st(OS_LONG)?, st(OS_STARTS_FULL)?);
    let (sampled, sampled_out, not_walked) = (st(OS_SAMPLED)?, st(OS_SAMPLED_OUT)?, st(OS_NOT_WALKED)?);
    let irq_wakers = st(OS_IRQ_WAKERS)?;
    let hook = if at_exit { "sched_exit_tp" } else { "sched_switch" };
    let sample_below_us = if at_exit { a.sample_below.as_micros() as u64 } else { 0 };
    let loss = StackLoss::read(&skel.maps.stats, OS_STACKS)?;
    let tool = if wake { "wakeup" } else { "offcpu" };
    let finish = if wake { stacktool::finish_wakeup } else { stacktool::finish };
    let mut f = finish(
        counts,
        crate::stack_maps!(skel),
        images,
        &stacktool::Outputs {
            outs: &outs,
            title: format!("sonde {tool}, {:.1} s", elapsed.as_secs_f64()),
            count_name: "us",
            divisor: 1000,
            weight: Weight::Micros { name: "offcpu" },
            elapsed,
            comment: format!("sonde {tool} --min-block {:?}", a.min_block),
            relabel: None,
        },
    )?;
    f.command = stacktool::CommandSummary::of(&targets, &skel.maps.tf_pids, &skel.maps.tf_lost);
    let summary = Summary {
        kind: "summary",
        mechanism: mech,
        hook,
        duration_s: elapsed.as_secs_f64(),
        switches,
        blocked_periods: recorded,
        sample_below_us,
        sampled_periods: sampled,
        sampled_out,
        blocked_us: f.stacks.iter().map(|s| s.count).sum(),
        shorter_than_min: short,
        longer_than_max: long,
        unique_stacks: f.unique,
        lost: Lost { stacks: loss, starts_full: full },
        stacks: StackSummary::of(&f, &unwind),
        waker_not_walked: wake.then_some(not_walked),
        interrupt_wakers: wake.then_some(irq_wakers),
    };
    let text = summary_text(&summary, &stacktool::sym_summary(&f, "us", Some(&unwind)));
    Ok(Outcome { stacks: f.stacks, summary, text, stop })
}

/// offcpu's and wakeup's `{"type":"summary",...}` line (schema in the README).
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Always "summary".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// How sched_switch was reached.
    pub mechanism: Mechanism,
    /// Where periods end: sched_exit_tp or sched_switch.
    pub hook: &'static str,
    /// Length of the run.
    pub duration_s: f64,
    /// Context switches seen.
    pub switches: u64,
    /// Blocked periods recorded.
    pub blocked_periods: u64,
    /// Periods shorter than this were sampled (0: none).
    pub sample_below_us: u64,
    /// Sampled periods kept (and weighted up).
    pub sampled_periods: u64,
    /// Sampled periods left out.
    pub sampled_out: u64,
    /// Blocked time in all stacks.
    pub blocked_us: u64,
    /// Periods under --min-block.
    pub shorter_than_min: u64,
    /// Periods over --max-block.
    pub longer_than_max: u64,
    /// Distinct stacks.
    pub unique_stacks: u64,
    /// What the kernel half could not keep.
    pub lost: Lost,
    /// Symbolization and unwinding.
    #[serde(flatten)]
    pub stacks: StackSummary,
    /// wakeup only: periods counted without the waker's stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waker_not_walked: Option<u64>,
    /// wakeup only: wake-ups in interrupt context, found in the kernel,
    /// whose interrupted task's user stack was not walked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupt_wakers: Option<u64>,
}

/// The summary's `"lost"` object.
#[derive(Debug, Serialize)]
pub struct Lost {
    /// Stacks lost (collisions, capture errors, count map full).
    #[serde(flatten)]
    pub stacks: StackLoss,
    /// Periods lost because the start map was full.
    pub starts_full: u64,
}

/// The text summary, from the typed one (`sym` is the stack tools' shared lines).
fn summary_text(s: &Summary, sym: &str) -> String {
    let (recorded, mech, hook, switches) = (s.blocked_periods, s.mechanism, s.hook, s.switches);
    let (short, long, full) = (s.shorter_than_min, s.longer_than_max, s.lost.starts_full);
    let (sampled, sampled_out, not_walked) = (s.sampled_periods, s.sampled_out, s.waker_not_walked.unwrap_or(0));
    let (sample_below_us, loss) = (s.sample_below_us, &s.lost.stacks);
    format!(
        "{recorded} blocked periods, {} blocked, {} unique stacks ({mech}, {hook}); {switches} context switches seen; skipped: {short} shorter than --min-block, {long} longer than --max-block\n{}{}lost: {full} with the start map full, {} stacks to hash collisions, {} kernel and {} user stacks not captured, {} with the count map full\n{}",
        us(s.blocked_us),
        s.unique_stacks,
        if sampled + sampled_out > 0 {
            format!(
                "sampled (blocks under {}): {sampled} kept and weighted up, {sampled_out} left out; totals are estimates\n{}",
                us(sample_below_us),
                if not_walked > 0 {
                    format!("{not_walked} counted at their end without the waker's stack ([waker not walked]): short when woken, then long in the run queue\n")
                } else {
                    String::new()
                }
            )
        } else {
            String::new()
        },
        match s.interrupt_wakers {
            Some(n) if n > 0 => format!(
                "{n} wake-ups in interrupt context: kernel stack only, the interrupted task's user stack not walked ([interrupt] (waker))\n"
            ),
            _ => String::new(),
        },
        loss.collisions,
        loss.kernel_errors,
        loss.user_errors,
        loss.counts_full,
        sym
    )
}

/// How offcpu runs on this kernel (`sonde doctor`): sched_switch by the first
/// of [`MECHANISMS`] that loads; periods end at sched_exit_tp where the kernel
/// has it (found in BTF).
pub fn doctor(cx: &Caps) -> Value {
    cx.with_unwind(report(cx, ""))
}

/// How wakeup runs on this kernel (`sonde doctor`): offcpu's hooks plus
/// sched_waking.
pub fn doctor_wakeup(cx: &Caps) -> Value {
    cx.with_unwind(report(cx, " + sched:sched_waking"))
}

fn report(cx: &Caps, extra: &str) -> Value {
    let Some((m, detail)) = cx.first(MECHANISMS) else {
        return cannot("neither tp_btf nor raw_tp programs load");
    };
    let exit_hook = features::btf_has_type("btf_trace_sched_exit_tp");
    let hook = if exit_hook {
        "sched:sched_switch + sched_exit_tp (stacks walked only for kept periods; short ones sampled)"
    } else {
        "sched:sched_switch only, no sched_exit_tp here (stacks walked at every switch-out of a traced thread)"
    };
    json!({"usable": true, "mechanism": m.to_string(), "exit_hook": exit_hook, "detail": format!("{hook}{extra}; {detail}")})
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &OffcpuArgs) -> anyhow::Result<i32> {
    run_tool(a, false)
}

/// Entry point for `sonde wakeup`; returns the exit status.
pub fn run_wakeup(a: &WakeupArgs) -> anyhow::Result<i32> {
    run_tool(&a.offcpu, true)
}

/// Who wakes waiting threads: blocked stacks joined to their wakers' stacks.
#[derive(Debug, Args)]
#[command(long_about = "Who wakes waiting threads: each blocked period (as in `offcpu`, same options) joined to \
the stack that woke the thread, taken at sched_waking in the waker's context. Rendered like BCC's offwaketime: \
blocked stack root first, a `--` frame, the waker's stack leaf first, `COMM (waker)` on top; a wake-up from a hardware \
interrupt context keeps only its kernel stack (`[interrupt] (waker)`), a preempted period ends in `[no waker]`.\n\n\
With sampling (--sample-below), the keep-or-leave decision for a period is made at its wake-up, so a period \
left out costs no waker stack walk either. One left out that then waits long for a CPU gets a second chance at its \
end (counted with chance min(length, T) / T in all, as in offcpu, weighing max(length, T)); counted that way it \
ends in `[waker not walked]`.\n\n\
OVERHEAD: offcpu's (see `sonde offcpu --help`) plus one lookup per wake-up of a traced thread, and a stack walk \
for the wake-ups of kept periods. bench/offcpu/run, pipe ping-pong, all tasks traced: 181-436 ns per switch in \
BPF, 3.7% fewer round trips at ~125k switches/s, 8-17% at 400k-800k switches/s.")]
pub struct WakeupArgs {
    /// offcpu's options, all of them.
    #[command(flatten)]
    pub offcpu: OffcpuArgs,
}

fn run_tool(a: &OffcpuArgs, wake: bool) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.run.duration)?;
    let what = if wake { "off-CPU time and its wakers" } else { "off-CPU time" };
    let out = run_with(a, &ctl, wake, || eprintln!("sonde: tracing {what}; Ctrl-C ends and writes the results"))?;
    if a.run.json {
        stacktool::print_json(&out.stacks, &out.summary)?;
        return Ok(out.stop.exit_code());
    }
    if a.run.output.is_empty() {
        stacktool::print_top(&out.stacks, a.top, "BLOCKED", us)?;
    }
    eprintln!("{}", out.text);
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
        let open = skel::OffcpuSkelBuilder::default().open(&mut storage).expect("open the object");
        assert_eq!(open.maps.stats.max_entries(), OS_STACKS + crate::engine::stacktool::STACK_STATS);
    }
}
