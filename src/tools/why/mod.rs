//! `sonde why`: where all of a process's time goes, exactly, and what each
//! wait was for. The kernel half (why.bpf.c) keeps, per traced thread, every
//! nanosecond of its window in one slot (on CPU, run queue, throttled, or
//! blocked by class) and each wait by (class, object, waker); this half
//! reads them at the end (or every `-i`), names the objects (sockets, files,
//! pipes, futexes, kernel functions), and reports per process and per group
//! of same-named threads, ending in a verdict and the next command.
mod report;
pub mod syscalls;

use std::{collections::HashMap, mem::MaybeUninit, time::Duration};

use anyhow::Context;
use clap::Args;
use libbpf_rs::{
    skel::{OpenSkel, SkelBuilder},
    Link, OpenObject,
};

use crate::engine::{
    error::usage,
    features,
    output::RunArgs,
    record::{decode, for_each_entry, percpu_sum},
    run::{duration_arg, RunControl, Stop},
    symbols::KernelSymbols,
    taskfilter::{Targets, TaskArgs, TaskFilter},
    time::clock_ns,
};
pub use report::{Class, Report, Thread, Wait};

crate::skeleton!("why");
use skel::{WhySkel, WhySkelBuilder};

crate::pod!(skel::types::why_thread, skel::types::why_wait_key, skel::types::why_wait, skel::types::why_obj);

/// Slots of the kernel half's stats map (enum why_stat).
const WT_SWITCHES: u32 = 0;
const WT_WAKEUPS: u32 = 1;
const WT_THREADS_FULL: u32 = 2;
const WT_WAITS_FULL: u32 = 3;
const WT_OBJECTS_FULL: u32 = 4;
const WT_KSTACKS_FULL: u32 = 5;
const WT_KSTACK_ERRORS: u32 = 6;
const WT_REGS_UNREAD: u32 = 7;
const WT_UNSEEN_WAKEUPS: u32 = 8;
const WT_UNSEEN_SWITCHES: u32 = 9;
#[cfg(test)]
const WT_MAX: u32 = 10;

/// Size of the kernel half's system call table (WHY_NSYS).
const NSYS: usize = 512;

/// Where all of a thread's time goes, exactly, and what each wait was for.
///
/// Every nanosecond of each traced thread's time in the window is in one
/// category: on CPU; runnable but waiting for a CPU (the run queue); runnable
/// while its cgroup's CPU quota is spent (throttled); or blocked, by what
/// it waits for: disk, network, lock, sleep, poll (waiting for work), pipe
/// (and other local IPC), memory (page faults, reclaim), io_uring, other
/// (named by the kernel function it waits in). Each wait is named by its
/// object (the socket's addresses, the file, the pipe, the futex, the kernel
/// function) and who woke it. The categories of each thread sum to its time
/// in the window: waits that began before the run or are still open at its
/// end count, and so do threads that start or exit in it.
///
/// Reported per process and per group of same-named threads, sorted by time
/// lost, ending in a verdict and the command that tells more. With no
/// -p/--tid/--cgroup/--comm, every process is traced and the --top processes
/// that lost the most time are shown.
///
/// OVERHEAD: eleven small programs on the scheduler's, irq and softirq
/// tracepoints (every context switch and wake-up on the host), records kept
/// in the kernel, no event per switch. bench/why/run, a pipe ping-pong at
/// 263k, 101k and 10k switches/s: 448-675 ns of BPF per switch traced (13%,
/// 4.9% and 1.1% fewer round trips; perf sched record: 35%, 17% and 2.5%),
/// 218-253 ns per switch of a thread not traced; sonde's own process under
/// 0.25% of a core.
#[derive(Debug, Args)]
pub struct WhyArgs {
    /// Which tasks (none: every process on the host).
    #[command(flatten)]
    pub task: TaskArgs,
    /// Also report every interval (e.g. 5s), each on its own.
    #[arg(short = 'i', long, value_parser = duration_arg)]
    pub interval: Option<Duration>,
    /// Processes shown when every process is traced (those that lost the most time).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// One row per thread instead of per group of same-named threads.
    #[arg(long)]
    pub per_thread: bool,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Formats `-o` can write.
const FORMATS: &crate::engine::output::Formats<Format> =
    &[(".json", Format::Json), (".txt", Format::Text), (".log", Format::Text)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Text,
}

struct Loaded {
    skel: WhySkel<'static>,
    links: Vec<Link>,
}

fn load(tf: &TaskFilter) -> anyhow::Result<Loaded> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = WhySkelBuilder::default().open(storage).context("opening BPF object")?;
    crate::set_task_follow!(&mut open, tf);
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    crate::set_task_filter!(&mut *ro, tf);
    for (nr, kind) in syscalls::kinds(NSYS) {
        ro.sys_kind[nr] = kind;
    }
    ro.has_task_regs = features::has_task_regs();
    ro.skip_init = features::init_hides_tracing();
    let skel = open.load().context("loading the scheduler programs (tp_btf)")?;
    tf.fill_pids(&skel.maps.tf_pids)?;
    Ok(Loaded { skel, links: Vec::new() })
}

/// Attaches every hook, after setting the window's start.
fn attach(l: &mut Loaded, tf: &TaskFilter) -> anyhow::Result<u64> {
    let start = mono_ns();
    l.skel.maps.bss_data.as_deref_mut().expect("bss present").t_start = start;
    let p = &l.skel.progs;
    if tf.follow {
        l.links.push(p.tf_fork.attach().context("attaching sched_process_fork")?);
    }
    // The exits before the entries: an interrupt entered between the two
    // would otherwise count as never left (an exit with no entry seen is
    // passed over).
    for (prog, name) in [
        (&p.why_irq_exit, "irq_handler_exit"),
        (&p.why_timer_exit, "hrtimer_expire_exit"),
        (&p.why_softirq_exit, "softirq_exit"),
        (&p.why_irq_entry, "irq_handler_entry"),
        (&p.why_timer_entry, "hrtimer_expire_entry"),
        (&p.why_softirq_entry, "softirq_entry"),
        (&p.why_switch, "sched_switch"),
        (&p.why_waking, "sched_waking"),
        (&p.why_wakeup, "sched_wakeup"),
        (&p.why_wakeup_new, "sched_wakeup_new"),
        (&p.why_exit, "sched_process_exit"),
    ] {
        l.links.push(prog.attach().with_context(|| format!("attaching the tracepoint {name}"))?);
    }
    Ok(start)
}

/// Runs the task iterator once (`phase` 0: every thread's state at the
/// start; 1: every thread's user and system time at the end).
fn iterate(skel: &mut WhySkel<'static>, phase: u32) -> anyhow::Result<()> {
    use std::io::Read;
    skel.maps.bss_data.as_deref_mut().expect("bss present").iter_phase = phase;
    let link = skel.progs.why_iter.attach().context("attaching the task iterator")?;
    let mut it = libbpf_rs::Iter::new(&link).context("creating the task iterator")?;
    let mut sink = Vec::new();
    it.read_to_end(&mut sink).context("running the task iterator")?;
    Ok(())
}

fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC) as u64
}

fn cstr(b: &[i8]) -> String {
    let bytes: Vec<u8> = b.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What the kernel half holds, read at `now` (open states counted up to it).
struct Snapshot {
    threads: HashMap<u32, Thread>,
}

/// Reads the records. `now`: the end of the window for threads alive (the
/// open state of each counts up to it).
fn read(
    skel: &WhySkel<'static>,
    now: u64,
    ksyms: &KernelSymbols,
    names: &mut report::Namer,
) -> anyhow::Result<Snapshot> {
    let t_start = skel.maps.bss_data.as_deref().map(|b| b.t_start).unwrap_or(0);
    let mut recs: Vec<(u32, skel::types::why_thread)> = Vec::new();
    for_each_entry(&skel.maps.threads, |k, v| {
        if let (Some(tid), Some(t)) = (decode::<u32>(k), decode::<skel::types::why_thread>(v)) {
            recs.push((tid, t));
        }
    })?;
    let mut objects: HashMap<u64, skel::types::why_obj> = HashMap::new();
    for_each_entry(&skel.maps.objects, |k, v| {
        if let (Some(id), Some(o)) = (decode::<u64>(k), decode::<skel::types::why_obj>(v)) {
            objects.insert(id, o);
        }
    })?;
    let mut stacks: HashMap<u64, Vec<u64>> = HashMap::new();
    for_each_entry(&skel.maps.kstacks, |k, v| {
        if let Some(id) = decode::<u64>(k) {
            let frames: Vec<u64> = v.chunks_exact(8).filter_map(decode::<u64>).take_while(|&a| a != 0).collect();
            stacks.insert(id, frames);
        }
    })?;
    names.add_stacks(&stacks, ksyms);
    let mut threads: HashMap<u32, Thread> = HashMap::new();
    for (tid, r) in &recs {
        let end = if r.end != 0 { r.end } else { now };
        let mut acc = r.acc;
        let mut open = None;
        // The state still open at `now`.
        let d = end.saturating_sub(r.since);
        match r.state {
            1 if r.end == 0 => acc[0] += d,
            2 if r.end == 0 => acc[1] += d,
            3 if r.end == 0 => {
                let c = usize::from(r.cls).min(report::CLASSES - 1);
                acc[3 + c] += d;
                open = Some((r.cls, r.obj, r.kstack, r.sys, d));
            }
            _ => {}
        }
        let mut t = Thread::new(r.tgid, *tid, cstr(&r.comm), end.saturating_sub(r.start), acc);
        t.exited = r.end != 0;
        (t.on_cpu_steal_ns, t.on_cpu_irq_ns) = (r.on_steal.min(t.on_cpu_ns), r.on_irq.min(t.on_cpu_ns));
        t.started = r.start != t_start;
        let (du, ds) = (r.utime1.saturating_sub(r.utime0), r.stime1.saturating_sub(r.stime0));
        if r.utime1 != 0 && du + ds > 0 {
            t.user_share = Some(du as f64 / (du + ds) as f64);
        }
        if r.p_count > 0 {
            // Finished waits the kernel half still holds in the record.
            let w = names.wait_of(&r.pk, cstr(&r.p_wcomm), r.p_ns, r.p_count, &objects);
            t.waits.push(w);
        }
        if let Some((cls, obj, kstack, sys, ns)) = open {
            t.waits.push(names.wait(cls, obj, kstack, sys, 0, 0, String::new(), ns, 1, true, &objects));
        }
        threads.insert(*tid, t);
    }
    for_each_entry(&skel.maps.waits, |k, v| {
        let (Some(k), Some(w)) = (decode::<skel::types::why_wait_key>(k), decode::<skel::types::why_wait>(v)) else {
            return;
        };
        if let Some(t) = threads.get_mut(&k.tid) {
            let wait = names.wait_of(&k, cstr(&w.waker_comm), w.ns, w.count, &objects);
            t.waits.push(wait);
        }
    })?;
    for t in threads.values_mut() {
        t.finish();
    }
    Ok(Snapshot { threads })
}

/// Counters of the kernel half.
fn losses(skel: &WhySkel<'static>) -> anyhow::Result<report::Losses> {
    let st = |s| percpu_sum(&skel.maps.stats, s);
    Ok(report::Losses {
        switches: st(WT_SWITCHES)?,
        wakeups: st(WT_WAKEUPS)?,
        threads_full: st(WT_THREADS_FULL)?,
        waits_full: st(WT_WAITS_FULL)?,
        objects_full: st(WT_OBJECTS_FULL)?,
        kstacks_full: st(WT_KSTACKS_FULL)?,
        kstack_errors: st(WT_KSTACK_ERRORS)?,
        regs_unread: st(WT_REGS_UNREAD)?,
        unseen_wakeups: st(WT_UNSEEN_WAKEUPS)?,
        unseen_switches: st(WT_UNSEEN_SWITCHES)?,
    })
}

fn validate(a: &WhyArgs) -> anyhow::Result<(TaskFilter, Option<(std::path::PathBuf, Format)>)> {
    let out = a.run.output("why", FORMATS)?;
    if let Some(i) = a.interval {
        if i < Duration::from_millis(100) {
            return Err(usage(format!("-i {i:?}: at least 100ms")));
        }
    }
    if a.top == 0 {
        return Err(usage("--top 0: show at least one process"));
    }
    let tf = a.task.validate()?;
    if tf.pids.contains(&1) && features::init_hides_tracing() {
        return Err(usage(
            "-p 1: this kernel skips tracing programs while a thread of PID 1 runs (`sonde doctor`: sees_pid1), so its time cannot be accounted for; trace another process",
        ));
    }
    Ok((tf, out))
}

/// The finished run: the report and why it stopped.
pub struct Outcome {
    /// Every thread traced, grouped and judged.
    pub report: Report,
    /// Why the run stopped.
    pub stop: Stop,
}

/// Runs `why` until `ctl` stops it (or every target exits); `ready` is called
/// once tracing runs, `each` with every interval's report (-i).
pub fn run_with(
    a: &WhyArgs,
    ctl: &RunControl,
    ready: impl FnOnce(),
    mut each: impl FnMut(&Report) -> anyhow::Result<()>,
) -> anyhow::Result<Outcome> {
    let (mut tf, _) = validate(a)?;
    features::require_tracing_privileges()?;
    if !features::has_btf() {
        return Err(crate::engine::error::env(
            "sonde why needs the kernel's BTF (/sys/kernel/btf/vmlinux) for its tp_btf programs; use a kernel built with CONFIG_DEBUG_INFO_BTF",
        ));
    }
    let launched = a.task.launch(&mut tf)?;
    let mut targets = Targets::new(&tf, launched);
    let mut l = load(&tf)?;
    let start = attach(&mut l, &tf)?;
    iterate(&mut l.skel, 0)?;
    ctl.start_clock();
    if let Some(t) = &mut targets.launched {
        t.release()?;
    }
    ready();
    let ksyms = KernelSymbols::default();
    let mut names = report::Namer::default();
    let mut prev: Option<(u64, HashMap<u32, Thread>)> = None;
    let mut next_at = a.interval.map(|i| std::time::Instant::now() + i);
    let stop = loop {
        if let Some(s) = ctl.should_stop() {
            break s;
        }
        if targets.all_gone(&l.skel.maps.tf_pids) {
            break Stop::Done;
        }
        let mut wait = ctl.next_wait(Duration::from_millis(200));
        if let Some(n) = next_at {
            wait = wait.min(n.saturating_duration_since(std::time::Instant::now()));
        }
        ctl.wait(wait);
        if let (Some(i), Some(n)) = (a.interval, next_at) {
            if std::time::Instant::now() >= n {
                next_at = Some(n + i);
                let now = mono_ns();
                let snap = read(&l.skel, now, &ksyms, &mut names)?;
                let (from, base) = prev.take().unwrap_or((start, HashMap::new()));
                let mut r = Report::build(
                    report::diff(&snap.threads, &base),
                    now - from,
                    a.per_thread,
                    &tf,
                    losses(&l.skel)?,
                    false,
                );
                (r.start_mono_ns, r.end_mono_ns) = (from, now);
                each(&r)?;
                prev = Some((now, snap.threads));
            }
        }
    };
    // Nothing changes once detached: every open state counts up to `end`.
    let mut skel = l.skel;
    drop(l.links);
    let end = mono_ns();
    iterate(&mut skel, 1)?;
    let snap = read(&skel, end, &ksyms, &mut names)?;
    let mut report = Report::build(snap.threads, end - start, a.per_thread, &tf, losses(&skel)?, true);
    (report.start_mono_ns, report.end_mono_ns) = (start, end);
    Ok(Outcome { report, stop })
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &WhyArgs) -> anyhow::Result<i32> {
    let (_, out) = validate(a)?;
    let ctl = RunControl::new(a.run.duration)?;
    let mut sink = crate::engine::output::Sink::open(out.as_ref().map(|(p, _)| p.as_path()))?;
    let json = a.run.json || matches!(out, Some((_, Format::Json)));
    let top = a.top;
    let outcome = run_with(
        a,
        &ctl,
        || eprintln!("sonde: accounting for every thread's time; Ctrl-C ends and reports"),
        |r| {
            if json {
                r.write_json(&mut sink, false)?;
            } else {
                sink.line(&r.text(top))?;
            }
            sink.flush()?;
            Ok(())
        },
    )?;
    if json {
        outcome.report.write_json(&mut sink, true)?;
    } else {
        sink.line(&outcome.report.text(top))?;
    }
    sink.flush()?;
    Ok(outcome.stop.exit_code())
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use libbpf_rs::skel::SkelBuilder;

    use super::*;

    /// The stats map has the slots the constants above name (no root needed:
    /// the object is opened, not loaded).
    #[test]
    fn stats_map_size_matches_the_slot_constants() {
        let mut storage = MaybeUninit::uninit();
        let open = skel::WhySkelBuilder::default().open(&mut storage).expect("open the object");
        assert_eq!(open.maps.stats.max_entries(), WT_MAX);
    }
}
