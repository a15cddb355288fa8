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

use crate::engine::{
    attach::{with_fallbacks, Mechanism},
    error::usage,
    features,
    perf::percpu_sum,
    pprof::Weight,
    render::Format,
    run::{duration_arg, RunControl, Stop},
    stacks::Stack,
    stacktool::{self, StackLoss},
    taskfilter::TaskFilter,
};

mod skel {
    #![allow(clippy::all, unused_imports, non_camel_case_types, dead_code)]
    include!(concat!(env!("OUT_DIR"), "/offcpu.skel.rs"));
}
use skel::{OffcpuSkel, OffcpuSkelBuilder};

const OS_SWITCHES: u32 = 0;
const OS_RECORDED: u32 = 1;
const OS_SHORT: u32 = 2;
const OS_LONG: u32 = 3;
const OS_STARTS_FULL: u32 = 4;
const OS_STACKS: u32 = 5;

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
/// At each context switch, a thread going off CPU that passes the filters has
/// its kernel and user stacks saved; when it runs again the time in between
/// is added to that stack (if within --min-block/--max-block). Outputs as for
/// `profile`, weights in microseconds: .folded, .svg, .html, .pb.gz (sample
/// type offcpu/nanoseconds), .json, or the top table.
///
/// OVERHEAD: runs on every context switch (can be >1M/s on busy hosts); the
/// filters run before any stack walk. bench/offcpu/run (pipe ping-pong, ~800k
/// switches/s on one CPU): tracing all tasks 1,793 ns per switch in BPF and
/// 60% fewer round trips; with the ping-pong filtered out (-p of another
/// process) 83 ns per switch and 9% fewer. Filter on busy hosts.
#[derive(Debug, Args)]
pub struct OffcpuArgs {
    /// Only this process and its threads (repeatable).
    #[arg(short = 'p', long = "pid")]
    pub pid: Vec<u32>,
    /// Only this thread (repeatable, up to 16).
    #[arg(long)]
    pub tid: Vec<u32>,
    /// Only tasks in this cgroup (v2 path).
    #[arg(long)]
    pub cgroup: Option<String>,
    /// Only threads with this name.
    #[arg(long)]
    pub comm: Option<String>,
    /// Ignore blocks shorter than this (e.g. 1ms, 100us).
    #[arg(long, value_parser = duration_arg, default_value = "1us")]
    pub min_block: Duration,
    /// Ignore blocks longer than this.
    #[arg(long, value_parser = duration_arg)]
    pub max_block: Option<Duration>,
    /// Only these states when going off CPU (repeatable; default all).
    #[arg(long, value_enum)]
    pub state: Vec<State>,
    /// Stop after this long (e.g. 10s); default: until Ctrl-C.
    #[arg(short = 'd', long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// User stacks only.
    #[arg(long, conflicts_with = "kernel_only")]
    pub user_only: bool,
    /// Kernel stacks only.
    #[arg(long)]
    pub kernel_only: bool,
    /// Merge the threads of a process (default: one stack set per thread).
    #[arg(long)]
    pub per_process: bool,
    /// Write here; the extension picks the format (repeatable).
    #[arg(short = 'o', long = "output")]
    pub output: Vec<PathBuf>,
    /// Rows of the top table.
    #[arg(long, default_value_t = 25)]
    pub top: usize,
    /// Print every stack as a JSON line on stdout, then a summary line.
    #[arg(long)]
    pub json: bool,
}

/// What a finished run saw.
pub struct Outcome {
    /// Stacks weighted by blocked microseconds.
    pub stacks: Vec<Stack>,
    /// Summary JSON.
    pub summary: serde_json::Value,
    /// Summary text.
    pub text: String,
    /// Why it stopped.
    pub stop: Stop,
}

struct Loaded {
    skel: OffcpuSkel<'static>,
    _links: Vec<Link>,
}

fn load(a: &OffcpuArgs, tf: &TaskFilter, mech: Mechanism, wake: bool) -> anyhow::Result<Loaded> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = OffcpuSkelBuilder::default().open(storage).context("opening BPF object")?;
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
    let typed = mech == Mechanism::TpBtf;
    open.progs.btf_switch.set_autoload(typed);
    open.progs.raw_switch.set_autoload(!typed);
    open.progs.btf_waking.set_autoload(typed && wake);
    open.progs.raw_waking.set_autoload(!typed && wake);
    let skel = open.load().with_context(|| format!("loading {mech} programs"))?;
    tf.fill_pids(&skel.maps.tf_pids)?;
    let mut links = vec![if typed { skel.progs.btf_switch.attach()? } else { skel.progs.raw_switch.attach()? }];
    if wake {
        links.push(if typed { skel.progs.btf_waking.attach()? } else { skel.progs.raw_waking.attach()? });
    }
    Ok(Loaded { skel, _links: links })
}

fn validate(a: &OffcpuArgs) -> anyhow::Result<(Vec<(PathBuf, Format)>, TaskFilter)> {
    let outs = stacktool::check_outputs(&a.output)?;
    if let Some(m) = a.max_block {
        if m < a.min_block {
            return Err(usage(format!("--max-block {m:?} is below --min-block {:?}; raise it or drop it", a.min_block)));
        }
    }
    let tf = TaskFilter::new(&a.pid, &a.tid, a.cgroup.as_deref(), a.comm.as_deref())?;
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
    let (outs, tf) = validate(a)?;
    features::require_tracing_privileges()?;
    stacktool::raise_open_files();
    let (loaded, mech, _) = with_fallbacks("sched:sched_switch", &[Mechanism::TpBtf, Mechanism::RawTp], |m| load(a, &tf, m, wake))?;
    let skel = &loaded.skel;
    ready();
    let counts: &dyn MapCore = if wake { &skel.maps.wake_counts } else { &skel.maps.stk_counts };
    let (stop, images, elapsed) = stacktool::run_until_stop(counts, ctl, a.duration, || {
        Ok(format!("sonde offcpu: {} blocked periods", percpu_sum(&skel.maps.stats, OS_RECORDED)?))
    })?;
    drop(loaded._links);
    let st = |slot| percpu_sum(&skel.maps.stats, slot);
    let (switches, recorded, short, long, full) = (st(OS_SWITCHES)?, st(OS_RECORDED)?, st(OS_SHORT)?, st(OS_LONG)?, st(OS_STARTS_FULL)?);
    let loss = StackLoss::read(&skel.maps.stats, OS_STACKS)?;
    let tool = if wake { "wakeup" } else { "offcpu" };
    let finish = if wake { stacktool::finish_wakeup } else { stacktool::finish };
    let f = finish(
        counts,
        &skel.maps.stk_traces,
        images,
        &stacktool::Outputs {
            outs: &outs,
            title: format!("sonde {tool}, {:.1} s", elapsed.as_secs_f64()),
            count_name: "us",
            weight: Weight::Micros { name: "offcpu" },
            elapsed,
            comment: format!("sonde {tool} --min-block {:?}", a.min_block),
        },
    )?;
    let total_us: u64 = f.stacks.iter().map(|s| s.count).sum();
    let mut lost = loss.json_fields();
    lost.insert("starts_full".into(), full.into());
    let summary = serde_json::json!({
        "type": "summary", "mechanism": mech.to_string(), "switches": switches, "blocked_periods": recorded,
        "blocked_us": total_us, "shorter_than_min": short, "longer_than_max": long,
        "unique_stacks": f.unique,
        "lost": lost,
        "truncated_stacks": f.sym.truncated_stacks, "unknown_frames": f.sym.unknown_frames,
    });
    let text = format!(
        "{recorded} blocked periods, {} blocked, {} unique stacks ({mech}); {switches} context switches seen; skipped: {short} shorter than --min-block, {long} longer than --max-block\nlost: {full} with the start map full, {} stacks to hash collisions, {} kernel and {} user stacks not captured, {} with the count map full\n{}",
        us(total_us),
        f.unique,
        loss.collisions,
        loss.kernel_errors,
        loss.user_errors,
        loss.counts_full,
        stacktool::sym_summary(&f, "us")
    );
    Ok(Outcome { stacks: f.stacks, summary, text, stop })
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &OffcpuArgs) -> anyhow::Result<i32> {
    run_tool(a, false)
}

/// Entry point for `sonde wakeup`; returns the exit status.
pub fn run_wakeup(a: &OffcpuArgs) -> anyhow::Result<i32> {
    run_tool(a, true)
}

fn run_tool(a: &OffcpuArgs, wake: bool) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.duration)?;
    let what = if wake { "off-CPU time and its wakers" } else { "off-CPU time" };
    let out = run_with(a, &ctl, wake, || eprintln!("sonde: tracing {what}; Ctrl-C ends and writes the results"))?;
    if a.json {
        stacktool::print_json(&out.stacks, &out.summary)?;
        return Ok(out.stop.exit_code());
    }
    if a.output.is_empty() {
        stacktool::print_top(&out.stacks, a.top, "BLOCKED", us);
    }
    eprintln!("{}", out.text);
    Ok(out.stop.exit_code())
}
