//! `sonde why`: where all of a process's time goes, exactly, and what each
//! wait was for. The kernel half (why.bpf.c) keeps, per traced thread, every
//! nanosecond of its window in one slot (on CPU, run queue, throttled, or
//! blocked by class) and each wait by (class, object, waker); this half
//! reads them at the end (or every `-i`), names the objects (sockets, files,
//! pipes, futexes, kernel functions), and reports per process and per group
//! of same-named threads, ending in a verdict and the next command.
mod disks;
mod html;
mod peers;
mod report;
mod stacks;
pub mod syscalls;
mod timeline;

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
    perf::Counter,
    record::{cstr, decode, for_each_entry, percpu_sum, MappedArray},
    run::{duration_arg, RunControl, Stop},
    symbols::KernelSymbols,
    taskfilter::{Targets, TaskArgs, TaskFilter},
    time::clock_ns,
    unwind::{self, UnwindArgs},
};
pub use report::{Class, Report, Thread, Wait};

crate::skeleton!("why");
use skel::{WhySkel, WhySkelBuilder};

crate::pod!(
    skel::types::why_thread,
    skel::types::why_wait_key,
    skel::types::why_wait,
    skel::types::why_obj,
    skel::types::why_instead_key,
    skel::types::why_instead,
    skel::types::rt_flow,
    skel::types::why_retrans,
    skel::types::why_disk,
    skel::types::why_release_key,
    skel::types::why_drop_key,
    skel::types::why_own_key,
    skel::types::why_own_disk,
    skel::types::why_release
);

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
const WT_INSTEAD_FULL: u32 = 10;
const WT_RETRANS_FULL: u32 = 11;
const WT_DISKS_FULL: u32 = 12;
const WT_RELEASERS_FULL: u32 = 13;
const WT_UNWALKED: u32 = 14;
const WT_SAMPLES: u32 = 15;
const WT_DROPS_FULL: u32 = 16;
const WT_OWN_DISKS_FULL: u32 = 17;
const WT_STATE_WOKEN: u32 = 18;
const WT_RECORD_BUSY: u32 = 19;
const WT_TID_REUSED: u32 = 20;
/// + enum stk_stat (src/bpf/stacks.h).
const WT_STACKS: u32 = 21;
#[cfg(test)]
const WT_MAX: u32 = WT_STACKS + 4;

/// On-CPU samples a second per CPU, for the hottest functions (a stack
/// walk each: 0.13-0.26% of a CPU beside a busy program).
const SAMPLE_HZ: u64 = 99;

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
/// that lost the most time are shown. Time a thread waited for a CPU names
/// what ran on that CPU instead. -o FILE.html also writes a page with each
/// thread's timeline of its states over the window.
///
/// OVERHEAD: small programs on the scheduler's, irq and softirq tracepoints
/// (every context switch and wake-up on the host), records kept in the
/// kernel, no event per switch. bench/why/run, a pipe ping-pong at 500k, 124k
/// and 10k switches/s: 129-136, 143-150 and 286-498 ns of BPF per switch
/// traced, beside 62-65, 60-61 and 71-94 ns for an empty program on each of
/// the same hooks (the floor here, the clock reads of the kernel's own count
/// included: 2.0-2.2x, 2.4-2.5x and 4.1-5.3x it; at 10k the caches are cold at
/// each switch, colder with other work on the host; the kernel's clock is
/// read once a millisecond per CPU, the scheduler's clock in between);
/// 7.3-7.6%, 1.4-2.0% and 0.24-0.46% fewer round trips (two runs of 2 rounds;
/// perf sched record: 21.5-22.5%, 6.3-7.7% and 0.85-0.92%), 85-231 ns per
/// switch of a thread not traced with -p; sonde's own process 0.76%, 0.35%
/// and 0.42% of a core once attached (perf sched's: 4.1%, 1.35% and 0.20%). Kernel
/// memory: the threads' records, 512 bytes a slot, 16 MiB here (pid_max
/// 32,768), 32 MiB at most.
/// -o FILE.html reads every thread's record about 400 times a run (10
/// ms to 1 s apart). The other ends of sockets and pipes waited on: a walk of
/// /proc/*/fd and a sock_diag lookup per connection, only when new ones were
/// waited on, at most once a second (2 ms a look here, 444 descriptors). One
/// more program per TCP retransmission and one per block request completed
/// (217 ns each, measured with kernel.bpf_stats_enabled beside 18,000 direct
/// reads a second), and one per packet the kernel drops (108 ns each, a UDP
/// flood to a closed port). One per skb a send queues (slow-start
/// restarts after idle): 80-96 ns, 1.1% of a CPU beside a 2.6 GB/s loopback
/// bulk transfer (115k skbs a second). One per bio queued: 61 ns, 475-561 ns for a
/// traced thread's, and 0.2-0.4 us more at its request's completion. One
/// per select or pselect6 call: 126 ns for a
/// traced thread, 59 ns for another. --cgroup: about 100 ns a switch more
/// than -p. A lock's releaser: its stack walked at the
/// wake-up, language frames included (bench/why/releases: 2.4 us a walk of a
/// C thread's stack at 4,000 walks a second; at 80 a second, with cold
/// caches, at most 20 us for C and 32 us for a Python thread 20 frames deep),
/// waits under 10 ms sampled, at most 100 walks a second per CPU (about 0.3%
/// of it at worst). The hottest functions: a CPU-clock sample 99 times a
/// second per CPU, a walk when a traced thread is on it (1.3-2.6 ms of BPF a
/// second beside a busy C or Python program: 0.13-0.26% of a CPU). Loading
/// the programs takes about 1.7 s of CPU (the kernel's verifier, 1.2 s of it
/// for the context switch's).
#[derive(Debug, Args)]
pub struct WhyArgs {
    /// Which tasks (none: every process on the host).
    #[command(flatten)]
    pub task: TaskArgs,
    /// Also report every interval (e.g. 5s), each on its own.
    #[arg(short = 'i', long, value_parser = duration_arg)]
    pub interval: Option<Duration>,
    /// Processes shown when every process is traced (those that lost the
    /// most time); --json carries every process.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// One row per thread instead of per group of same-named threads.
    #[arg(long)]
    pub per_thread: bool,
    /// How the stacks of the threads that release locks are walked.
    #[command(flatten)]
    pub unwind: UnwindArgs,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
    /// Tests only: slots for the threads' records (a power of two, 2 to
    /// 65536; default: pid_max, at most 65536), so that threads share them.
    #[arg(long, hide = true)]
    pub thread_slots: Option<u32>,
}

/// Formats `-o` can write.
const FORMATS: &crate::engine::output::Formats<Format> =
    &[(".json", Format::Json), (".txt", Format::Text), (".log", Format::Text), (".html", Format::Html)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Text,
    /// A page with each thread's timeline (the report still on stdout).
    Html,
}

struct Loaded {
    skel: WhySkel<'static>,
    links: Vec<Link>,
    /// What the run cannot measure, and why.
    no: Unmeasured,
    /// The retransmission tracepoint has `err`: failed ones are told apart.
    has_err: bool,
    /// The kfree_skb tracepoint passes the drop's reason (Linux 5.17+).
    drop_reason: bool,
}

/// What a run cannot measure, and why (None: it is measured): decided at
/// load and attach, told in the `lost` of every report.
#[derive(Debug, Default)]
struct Unmeasured {
    /// TCP retransmissions.
    retrans: Option<String>,
    /// The block devices' latency.
    disks: Option<String>,
    /// The threads' own block requests.
    own_disks: Option<String>,
    /// The on-CPU samples (the hottest functions).
    samples: Option<String>,
    /// Packet drops.
    drops: Option<String>,
    /// Slow-start restarts.
    restarts: Option<String>,
}

impl Unmeasured {
    /// Says so in `lost`. The hottest functions are the whole run's only
    /// (`at_end`): an interval's report has none to miss.
    fn tell(&self, lost: &mut report::Losses, at_end: bool) {
        lost.retransmits_not_counted.clone_from(&self.retrans);
        lost.disks_not_counted.clone_from(&self.disks);
        lost.own_disks_not_counted.clone_from(&self.own_disks);
        lost.drops_not_counted.clone_from(&self.drops);
        lost.restarts_not_counted.clone_from(&self.restarts);
        if at_end {
            lost.samples_not_taken.clone_from(&self.samples);
        }
    }
}

fn load(tf: &TaskFilter, plan: &unwind::Plan, slots: Option<u32>) -> anyhow::Result<(Loaded, stacks::Tracker)> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = WhySkelBuilder::default().open(storage).context("opening BPF object")?;
    crate::set_task_follow!(&mut open, tf);
    // The stack engine, for the threads that release locks and the
    // samples on CPU (counted by process, name and stacks).
    crate::set_unwind!(&mut open, plan, tf.processes_now().is_some());
    crate::set_sample_stacks!(&mut open);
    open.maps.stk_counts.set_max_entries(16384)?;
    open.maps.stk_traces.set_max_entries(8192)?;
    // The sampler is a perf_event program, which kernels before 6.1 (before
    // bpf_mem_alloc made run-time allocation safe in NMI) allow only
    // preallocated hashes, and the table walk's are allocated as used:
    // there the hottest functions are not sampled (said so).
    let no_samples = (plan.tables && !features::btf_has_type("bpf_mem_alloc")).then(|| {
        "this kernel (before Linux 6.1) lets a perf_event program use only preallocated maps, and the stack walk's are allocated as used; `sonde profile -p PID` samples them".to_string()
    });
    open.progs.why_sample.set_autoload(no_samples.is_none());
    let has_fetch = features::has_atomic_fetch();
    // The slots' number, and whether a thread's first slot is its id hashed
    // (pid_max above it; never for --thread-slots, whose test places
    // threads in chosen slots).
    let (slots, hashed) = match (has_fetch, slots) {
        (false, _) => (0, false),
        (true, Some(n)) => (n, false),
        (true, None) => thread_slots(),
    };
    open.maps.slots.set_max_entries(slots.max(1))?;
    // Hashed records only where there are no slots.
    open.maps.threads.set_max_entries(if has_fetch { 1 } else { 65536 })?;
    if !has_fetch {
        // Kernels before 5.12 reject the slots' atomics even where
        // slot_mask 0 makes them dead.
        for mut prog in open.open_object_mut().progs_mut() {
            features::poison_atomic_fetch(&mut prog)
                .context("preparing the programs for a kernel without BPF atomics")?;
        }
    }
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    crate::set_task_filter!(&mut *ro, tf);
    for (nr, kind) in syscalls::kinds(NSYS) {
        ro.sys_kind[nr] = kind;
    }
    ro.has_task_regs = features::has_task_regs();
    // The threads' records in slots by thread id where the kernel has BPF
    // compare-and-exchange (see `slots` in why.bpf.c), else all hashed.
    ro.slot_mask = slots.saturating_sub(1);
    ro.slot_hash_shift = if hashed { 32 - slots.trailing_zeros() } else { 0 };
    // sched_switch's prev_state: bool preempt, prev, next, prev_state.
    ro.has_prev_state = features::tracepoint_btf_args("sched_switch").is_some_and(|n| n >= 4);
    ro.skip_init = features::init_hides_tracing();
    // The tracepoint's `err` (a retransmission that failed to go out) where
    // it has one.
    let has_err = features::tracepoint_btf_args("tcp_retransmit_skb").is_some_and(|n| n >= 3);
    open.progs.why_retrans_err.set_autoload(has_err);
    open.progs.why_retrans.set_autoload(!has_err);
    // Packet drops: the reason where kfree_skb passes one (Linux 5.17+).
    let skb_args = features::tracepoint_btf_args("kfree_skb");
    let drop_reason = skb_args.is_some_and(|n| n >= 3);
    let no_drops =
        skb_args.filter(|&n| n >= 2).is_none().then(|| "this kernel's BTF has no skb:kfree_skb tracepoint".to_string());
    open.progs.why_drop_reason.set_autoload(drop_reason);
    open.progs.why_drop.set_autoload(no_drops.is_none() && !drop_reason);
    // Slow start restarted after idle, at the send that queues a new skb.
    let no_restarts = features::tracepoint_btf_args("tcp_sendmsg_locked").is_none().then(|| {
        "this kernel has no tcp_sendmsg_locked tracepoint (added to Linux in 2025); `sonde cwnd` finds them by fentry or a kprobe where the kernel allows either".to_string()
    });
    open.progs.why_send.set_autoload(no_restarts.is_none());
    // Whose bios a request holds: block_bio_queue passes the bio alone
    // (5.11+), or after its queue.
    let bio_args = features::tracepoint_btf_args("block_bio_queue");
    open.progs.why_bio.set_autoload(bio_args == Some(1));
    open.progs.why_bio_q.set_autoload(bio_args == Some(2));
    // select and pselect6 on one descriptor: their sets, read at the call
    // (arm64 has no select).
    open.progs.why_select.set_autoload(features::tracepoint_exists("syscalls", "sys_enter_select"));
    open.progs.why_pselect6.set_autoload(features::tracepoint_exists("syscalls", "sys_enter_pselect6"));
    let skel = open.load().context("loading the scheduler programs (tp_btf)")?;
    tf.fill_pids(&skel.maps.tf_pids)?;
    let session = unwind::Session::start(plan, &crate::unw_maps!(skel), tf);
    let mut links = Vec::new();
    if plan.tables {
        links.push(skel.progs.unw_exec.attach().context("attaching sched_process_exec")?);
    }
    Ok((
        Loaded {
            skel,
            links,
            no: Unmeasured { samples: no_samples, drops: no_drops, restarts: no_restarts, ..Default::default() },
            has_err,
            drop_reason,
        },
        stacks::Tracker::new(session),
    ))
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
    for (prog, name) in [(&p.why_select, "sys_enter_select"), (&p.why_pselect6, "sys_enter_pselect6")] {
        if prog.autoload() {
            l.links.push(prog.attach().with_context(|| format!("attaching the tracepoint {name}"))?);
        }
    }
    // The retransmissions of the connections waited on: the rest of the
    // accounting stands without them (said so in the summary).
    let prog = if l.has_err { &p.why_retrans_err } else { &p.why_retrans };
    match prog.attach() {
        Ok(link) => l.links.push(link),
        Err(e) => l.no.retrans = Some(format!("the tcp_retransmit_skb tracepoint could not be attached ({e})")),
    }
    // The block devices' own latency, likewise, and the threads' own
    // requests in it (not counted without the bios' hook: said so).
    match p.why_blk_done.attach() {
        Ok(link) => l.links.push(link),
        Err(e) => l.no.disks = Some(format!("the block_rq_complete tracepoint could not be attached ({e})")),
    }
    match [&p.why_bio, &p.why_bio_q].into_iter().find(|p| p.autoload()) {
        Some(prog) => match prog.attach() {
            Ok(link) => l.links.push(link),
            Err(e) => l.no.own_disks = Some(format!("the block_bio_queue tracepoint could not be attached ({e})")),
        },
        None => l.no.own_disks = Some("this kernel's BTF has no block_bio_queue tracepoint".to_string()),
    }
    // The packets dropped on the connections waited on, likewise.
    if l.no.drops.is_none() {
        let prog = if l.drop_reason { &p.why_drop_reason } else { &p.why_drop };
        match prog.attach() {
            Ok(link) => l.links.push(link),
            Err(e) => l.no.drops = Some(format!("the kfree_skb tracepoint could not be attached ({e})")),
        }
    }
    // Slow-start restarts, likewise.
    if l.no.restarts.is_none() {
        match p.why_send.attach() {
            Ok(link) => l.links.push(link),
            Err(e) => l.no.restarts = Some(format!("the tcp_sendmsg_locked tracepoint could not be attached ({e})")),
        }
    }
    // The hottest functions on CPU, likewise.
    if l.no.samples.is_none() {
        match crate::engine::perf::attach_sampling(&p.why_sample, Counter::CpuClock, SAMPLE_HZ, |cpu, e| {
            anyhow::anyhow!("a CPU-clock perf event could not be opened on CPU {cpu} ({e})")
        }) {
            Ok(links) => l.links.extend(links),
            Err(e) => l.no.samples = Some(format!("{e:#}")),
        }
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

/// The number of slots for threads' records (a power of two): at least
/// pid_max, so that no two threads share one, up to 65,536 (32 MiB); and
/// whether ids are hashed to their first slot (pid_max above that).
fn thread_slots() -> (u32, bool) {
    let pid_max = features::sysctl("kernel/pid_max").and_then(|s| s.trim().parse::<u32>().ok()).unwrap_or(u32::MAX);
    let n = pid_max.clamp(1024, 65536).next_power_of_two();
    (n, pid_max > n)
}

/// Every thread's record in the kernel half, by thread id: those in slots
/// (made whole: their id set), read in place, and those hashed.
fn records(skel: &WhySkel<'static>, slots: &MappedArray) -> anyhow::Result<Vec<(u32, skel::types::why_thread)>> {
    let mut recs = Vec::new();
    for i in 0..slots.len() {
        // A record is published by an atomic add of its thread id after it
        // is filled: read the id first, with acquire order (arm64 may
        // otherwise load the rest before it).
        if slots.first_word_acquire(i).is_some_and(|tid| tid != 0) {
            if let Some(t) = slots.get::<skel::types::why_thread>(i).filter(|t| t.tid != 0) {
                recs.push((t.tid as u32, t));
            }
        }
    }
    for_each_entry(&skel.maps.threads, |_, v| {
        if let Some(t) = decode::<skel::types::why_thread>(v).filter(|t| t.tid != 0) {
            recs.push((t.tid as u32, t));
        }
    })?;
    Ok(recs)
}

/// A thread's slots (enum why_acc) at `now`: its record's, with the state
/// still open counted up to `now` (a thread that exited is over).
fn totals(r: &skel::types::why_thread, now: u64) -> [u64; timeline::SLOTS] {
    let mut acc = r.acc;
    if r.end == 0 {
        let d = now.saturating_sub(r.since);
        match r.state {
            1 => acc[0] += d,
            2 => acc[1] += d,
            3 => acc[3 + usize::from(r.cls).min(report::CLASSES - 1)] += d,
            _ => {}
        }
    }
    acc
}

/// Every thread's slots now, for the timeline. The time is read before the
/// records, and a state still open is counted up to it (one that began
/// since, not at all): a state's time is never counted past its end, so a
/// slot goes back only where the kernel half places a switch it did not see
/// (`unseen_switches`), which the timeline moves back into the columns it
/// belongs to (see `Timeline::columns`). Read after them, an open state was
/// counted up to a time it may have ended before: with sonde's own thread
/// preempted between the two (beside a busy test), a spinner's timeline
/// showed 14-18% in the run queue against 5-7% in its totals.
fn sample(skel: &WhySkel<'static>, slots: &MappedArray, tl: &mut timeline::Timeline) -> anyhow::Result<()> {
    let now = mono_ns();
    let recs = records(skel, slots)?;
    tl.add(now, recs.iter().map(|(tid, r)| (*tid, totals(r, now.max(r.since)))));
    Ok(())
}

/// What the kernel half holds, read at `now` (open states counted up to it).
struct Snapshot {
    threads: HashMap<u32, Thread>,
}

/// Reads the records. `now`: the end of the window for threads alive (the
/// open state of each counts up to it).
fn read(
    skel: &WhySkel<'static>,
    slots: &MappedArray,
    now: u64,
    ksyms: &KernelSymbols,
    names: &mut report::Namer,
    flows: Option<report::FlowRetransmits>,
    mut released: Option<stacks::ByWait>,
) -> anyhow::Result<Snapshot> {
    let t_start = skel.maps.bss_data.as_deref().map(|b| b.t_start).unwrap_or(0);
    let recs = records(skel, slots)?;
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
    names.set_retransmits(flows);
    let mut threads: HashMap<u32, Thread> = HashMap::new();
    let mut instead: Vec<(u32, u64, report::Instead)> = Vec::new();
    for (tid, r) in &recs {
        if r.i_key.tid != 0 && r.i_ns > 0 {
            // What ran instead of it that the kernel half still holds in the record.
            let k = &r.i_key;
            let i =
                report::Instead { pid: k.rtgid, tid: k.rtid, comm: cstr(&r.i_comm), cgroup: String::new(), ns: r.i_ns };
            instead.push((k.tid, k.cg, i));
        }
        // A record changed after `now` was read (its state began after it)
        // is whole up to that change: read as of then, its slots sum to its
        // window, and the next interval's read takes on from there.
        let end = if r.end != 0 { r.end } else { now.max(r.since) };
        let acc = totals(r, end);
        let d = end.saturating_sub(r.since);
        let open = (r.state == 3 && r.end == 0).then_some((r.cls, r.obj, r.kstack, r.sys, d));
        let mut t = Thread::new(r.tgid, *tid, cstr(&r.comm), end.saturating_sub(r.start), acc);
        t.exited = r.end != 0;
        (t.on_cpu_steal_ns, t.on_cpu_irq_ns) = (r.on_steal.min(t.on_cpu_ns), r.on_irq.min(t.on_cpu_ns));
        t.started = r.start != t_start;
        let (du, ds) = (r.utime1.saturating_sub(r.utime0), r.stime1.saturating_sub(r.stime0));
        // Read at the end or the exit (a kernel thread's utime is 0: either
        // counter read says so); a split only where the kernel counted a
        // tick of it in the window.
        if (r.utime1 != 0 || r.stime1 != 0) && du + ds > 0 {
            t.user_share = Some(du as f64 / (du + ds) as f64);
        }
        if t.throttled_ns > 0 && !t.exited {
            t.quota = crate::engine::cgroup::quota_of(t.pid, t.tid);
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
    for_each_entry(&skel.maps.instead, |k, v| {
        let (Some(k), Some(v)) = (decode::<skel::types::why_instead_key>(k), decode::<skel::types::why_instead>(v))
        else {
            return;
        };
        let i = report::Instead { pid: k.rtgid, tid: k.rtid, comm: cstr(&v.comm), cgroup: String::new(), ns: v.ns };
        instead.push((k.tid, k.cg, i));
    })?;
    names.add_cgroups(instead.iter().map(|(_, cg, _)| *cg));
    for (tid, cg, mut i) in instead {
        if let Some(t) = threads.get_mut(&tid) {
            i.cgroup = names.cgroup(cg);
            t.ran_instead.push(i);
        }
    }
    names.peers.name(&mut threads);
    names.add_own_disks(&mut threads);
    // Each wait's releasers, before the merge of waits by what they name
    // (kernel locks on several files are one "kernel lock" row, whose
    // releasers the merge combines); taken once, as a thread's waits on
    // one key may be split between its record and the wait map.
    for t in threads.values_mut() {
        if let Some(by) = released.as_mut() {
            for w in t.waits.iter_mut().filter(|w| w.class == Class::Lock && w.woken_by == "thread") {
                if let Some(r) = by.remove(&(t.tid, w.obj, w.waker_tid, w.kstack)) {
                    w.released_by = r;
                }
            }
        }
        t.finish();
    }
    Ok(Snapshot { threads })
}

/// Looks up the other ends of the sockets and pipes the kernel half has
/// described so far (those not found yet).
fn look_peers(skel: &WhySkel<'static>, names: &mut report::Namer) -> anyhow::Result<()> {
    let mut fars = Vec::new();
    for_each_entry(&skel.maps.objects, |_, v| {
        if let Some(f) = decode::<skel::types::why_obj>(v).as_ref().and_then(report::Far::of) {
            fars.push(f);
        }
    })?;
    names.peers.ask(fars);
    Ok(())
}

/// The TCP retransmissions counted so far, by flow (over every network
/// namespace: a connection's two ends may be in two).
fn flow_retransmits(skel: &WhySkel<'static>) -> anyhow::Result<report::FlowRetransmits> {
    let mut out = report::FlowRetransmits::new();
    for_each_entry(&skel.maps.retrans, |k, v| {
        let (Some(f), Some(r)) = (decode::<skel::types::rt_flow>(k), decode::<skel::types::why_retrans>(v)) else {
            return;
        };
        let (Some(l), Some(rem)) = (report::ip_of(f.family, &f.saddr), report::ip_of(f.family, &f.daddr)) else {
            return;
        };
        let e = out.entry((l, f.sport, rem, f.dport, f.netns)).or_default();
        for i in 0..7 {
            e.count[i] += r.count[i];
            e.segs[i] += r.segs[i];
        }
        e.restarts += r.restarts;
    })?;
    Ok(out)
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
        instead_full: st(WT_INSTEAD_FULL)?,
        retransmits_full: st(WT_RETRANS_FULL)?,
        retransmits_missed: crate::engine::attach::recursion_misses(&skel.progs.why_retrans)
            + crate::engine::attach::recursion_misses(&skel.progs.why_retrans_err),
        retransmits_not_counted: None,
        restarts_not_counted: None,
        disks_full: st(WT_DISKS_FULL)?,
        disk_completions_missed: crate::engine::attach::recursion_misses(&skel.progs.why_blk_done),
        events_missed: crate::engine::attach::object_recursion_misses(libbpf_rs::skel::Skel::object(skel)),
        disks_not_counted: None,
        own_disks_not_counted: None,
        releasers_full: st(WT_RELEASERS_FULL)?,
        releases_not_walked: st(WT_UNWALKED)?,
        samples: st(WT_SAMPLES)?,
        samples_full: st(WT_STACKS + 3)?,
        samples_not_taken: None,
        drops_full: st(WT_DROPS_FULL)?,
        own_disks_full: st(WT_OWN_DISKS_FULL)?,
        states_woken: st(WT_STATE_WOKEN)?,
        records_busy: st(WT_RECORD_BUSY)?,
        tid_reused: st(WT_TID_REUSED)?,
        drops_not_counted: None,
        stack_errors: st(WT_STACKS)? + st(WT_STACKS + 1)? + st(WT_STACKS + 2)?,
        releases_taken: 0,
        release_stacks_truncated: 0,
    })
}

/// The packets dropped so far, by the packet's addresses and ports, the
/// network namespace it was dropped in and the reason.
fn flow_drops(skel: &WhySkel<'static>) -> anyhow::Result<report::FlowDrops> {
    let mut out = report::FlowDrops::new();
    for_each_entry(&skel.maps.drops, |k, v| {
        let (Some(k), Some(n)) = (decode::<skel::types::why_drop_key>(k), decode::<u64>(v)) else { return };
        let (Some(s), Some(d)) = (report::ip_of(k.family, &k.saddr), report::ip_of(k.family, &k.daddr)) else {
            return;
        };
        *out.entry((s, k.sport, d, k.dport, k.netns)).or_default().entry(k.reason).or_default() += n;
    })?;
    Ok(out)
}

/// The traced threads' own block requests completed so far, per (thread,
/// device).
fn own_disk_counts(skel: &WhySkel<'static>) -> anyhow::Result<disks::OwnCounts> {
    let mut out = disks::OwnCounts::new();
    for_each_entry(&skel.maps.own_disks, |k, v| {
        if let (Some(k), Some(d)) = (decode::<skel::types::why_own_key>(k), decode::<skel::types::why_own_disk>(v)) {
            out.insert((k.tid, k.dev), d);
        }
    })?;
    Ok(out)
}

/// The block requests completed so far, per device.
fn disk_counts(skel: &WhySkel<'static>) -> anyhow::Result<disks::Counts> {
    let mut out = disks::Counts::new();
    for_each_entry(&skel.maps.disks, |k, v| {
        if let (Some(dev), Some(d)) = (decode::<u32>(k), decode::<skel::types::why_disk>(v)) {
            out.insert(dev, d);
        }
    })?;
    Ok(out)
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
    if let Some(n) = a.thread_slots {
        if !(2..=65536).contains(&n) || !n.is_power_of_two() {
            return Err(usage(format!("--thread-slots {n}: a power of two from 2 to 65536")));
        }
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
    /// Each thread's time over the window (with `-o FILE.html`).
    timeline: Option<timeline::Timeline>,
}

/// Runs `why` until `ctl` stops it (or every target exits); `ready` is called
/// once tracing runs, `each` with every interval's report (-i), `ended` as
/// soon as the window has ended (nothing is counted after it).
pub fn run_with(
    a: &WhyArgs,
    ctl: &RunControl,
    ready: impl FnOnce(),
    mut each: impl FnMut(&Report) -> anyhow::Result<()>,
    ended: impl FnOnce(),
) -> anyhow::Result<Outcome> {
    let (mut tf, out) = validate(a)?;
    crate::engine::symbols::prefetch_signal_register_ranges();
    features::require_tracing_privileges()?;
    // The stacks' executables are kept open until they are named, as the
    // stack tools do, and the peers' walks open every process's fds.
    crate::engine::stacktool::raise_open_files();
    if !features::has_btf() {
        return Err(crate::engine::error::env(
            "sonde why needs the kernel's BTF (/sys/kernel/btf/vmlinux) for its tp_btf programs; use a kernel built with CONFIG_DEBUG_INFO_BTF",
        ));
    }
    let plan = unwind::Plan::new(&a.unwind)?;
    let launched = a.task.launch(&mut tf)?;
    let mut targets = Targets::new(&tf, launched);
    let (mut l, mut tracker) = load(&tf, &plan, a.thread_slots)?;
    let slots = MappedArray::new(&l.skel.maps.slots).context("mapping the threads' records")?;
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
    let mut prev_flows: Option<report::FlowRetransmits> = None;
    let mut prev_drops: Option<report::FlowDrops> = None;
    let mut prev_disks: Option<disks::Counts> = None;
    let mut prev_own: Option<disks::OwnCounts> = None;
    let mut next_at = a.interval.map(|i| std::time::Instant::now() + i);
    // The timeline's samples: about 400 over a known duration (10 ms to 1 s
    // apart), else every 100 ms (coarser as the run goes on: see Timeline).
    let mut tl = matches!(out, Some((_, Format::Html))).then(|| {
        let tick = a
            .run
            .duration
            .map(|d| (d / 400).clamp(Duration::from_millis(10), Duration::from_secs(1)))
            .unwrap_or(Duration::from_millis(100));
        timeline::Timeline::new(start, tick)
    });
    // When the next sample is due: a tick after the last, and at least 20
    // times as long as the last one took (a host's worth of threads costs
    // sonde under 5% of a core).
    let mut sample_at = std::time::Instant::now();
    let mut gap = tl.as_ref().map(|t| t.tick).unwrap_or_default();
    // The other ends of the sockets and pipes waited on: looked up (on a
    // thread of their own) 100 ms after the start, then twice as long apart
    // up to once a second (and at least 20 times as long apart as a look
    // takes), so that a connection closed before the report is named too.
    let mut peers_at = std::time::Instant::now();
    let mut peers_gap = Duration::from_millis(100);
    let stop = loop {
        if let Some(s) = ctl.should_stop() {
            break s;
        }
        if targets.all_gone(&l.skel.maps.tf_pids) {
            break Stop::Done;
        }
        // The walk's tables are loaded at the next turn after it asks (its
        // stacks are taken by frame pointers until then), and a runtime
        // that was starting is looked at again when due. A turn every 50
        // ms cost sonde 0.5% of a core here; every 200 ms, 0.1%.
        let mut wait = ctl.next_wait(Duration::from_millis(200));
        if let Some(t) = tracker.session.next_look() {
            wait = wait.min(t.saturating_duration_since(std::time::Instant::now()));
        }
        if let Some(n) = next_at {
            wait = wait.min(n.saturating_duration_since(std::time::Instant::now()));
        }
        if tl.is_some() {
            wait = wait.min((sample_at + gap).saturating_duration_since(std::time::Instant::now()));
        }
        ctl.wait(wait);
        // Ended while waiting: the window ends now, not after this turn's
        // work (loading a new process's unwinding tables can take long).
        if let Some(s) = ctl.should_stop() {
            break s;
        }
        tracker.tick(&crate::unw_maps!(l.skel), &l.skel.maps.releases, &l.skel.maps.stk_counts);
        if peers_at.elapsed() >= peers_gap {
            look_peers(&l.skel, &mut names)?;
            peers_at = std::time::Instant::now();
            peers_gap = (peers_gap * 2).min(Duration::from_secs(1)).max(names.peers.last_took() * 20);
        }
        if let Some(t) = &mut tl {
            if std::time::Instant::now() >= sample_at + gap {
                sample_at = std::time::Instant::now();
                sample(&l.skel, &slots, t)?;
                gap = t.tick.max(sample_at.elapsed() * 20);
            }
        }
        if let (Some(i), Some(n)) = (a.interval, next_at) {
            if std::time::Instant::now() >= n {
                next_at = Some(n + i);
                // The interval's own retransmissions: the counts so far
                // less the last interval's.
                let flows = l.no.retrans.is_none().then(|| flow_retransmits(&l.skel)).transpose()?;
                let own = flows.as_ref().map(|f| report::flows_since(f, prev_flows.as_ref()));
                prev_flows = flows;
                let dropped = l.no.drops.is_none().then(|| flow_drops(&l.skel)).transpose()?;
                names.set_drops(dropped.as_ref().map(|d| report::drops_since(d, prev_drops.as_ref())));
                prev_drops = dropped;
                let counts = l.no.disks.is_none().then(|| disk_counts(&l.skel)).transpose()?;
                names.set_disks(counts.as_ref().map(|c| disks::since(c, prev_disks.as_ref())), false);
                prev_disks = counts;
                let mine = l.no.own_disks.is_none().then(|| own_disk_counts(&l.skel)).transpose()?;
                names.set_own_disks(mine.as_ref().map(|c| disks::own_since(c, prev_own.as_ref())), false);
                prev_own = mine;
                // The interval ends as its records are read (the counts
                // above, the first read of the drop reasons' names
                // especially, may take a while): a state changed since
                // would otherwise have time past the end.
                let now = mono_ns();
                let snap = read(&l.skel, &slots, now, &ksyms, &mut names, own, None)?;
                let (from, base) = prev.take().unwrap_or((start, HashMap::new()));
                let mut lost = losses(&l.skel)?;
                l.no.tell(&mut lost, false);
                let mut r =
                    Report::build(report::diff(&snap.threads, &base), now - from, a.per_thread, &tf, lost, false, None);
                (r.start_mono_ns, r.end_mono_ns) = (from, now);
                each(&r)?;
                prev = Some((now, snap.threads));
            }
        }
    };
    // Nothing changes after `end` (t_end): every open state counts up to it.
    // The window ends now: the hooks stop changing records at once (t_end),
    // then they are detached (each waits for a grace period: on a busy host
    // that took tens of ms, in which states went on changing unseen).
    let mut skel = l.skel;
    let no = l.no;
    let end = mono_ns();
    skel.maps.bss_data.as_deref_mut().expect("bss present").t_end = end;
    ended();
    drop(l.links);
    iterate(&mut skel, 1)?;
    if let Some(t) = &mut tl {
        // Nothing changes after `end`: the last column ends there.
        let recs = records(&skel, &slots)?;
        t.add(end, recs.iter().map(|(tid, r)| (*tid, totals(r, end))));
    }
    let flows = no.retrans.is_none().then(|| flow_retransmits(&skel)).transpose()?;
    names.set_disks(no.disks.is_none().then(|| disk_counts(&skel)).transpose()?, true);
    names.set_own_disks(no.own_disks.is_none().then(|| own_disk_counts(&skel)).transpose()?, true);
    names.set_drops(no.drops.is_none().then(|| flow_drops(&skel)).transpose()?);
    let (released, rloss, hottest) = tracker.finish(&skel)?;
    let snap = read(&skel, &slots, end, &ksyms, &mut names, flows, Some(released))?;
    let mut lost = losses(&skel)?;
    (lost.releases_taken, lost.release_stacks_truncated) = (rloss.taken, rloss.truncated);
    no.tell(&mut lost, true);
    let mut report = Report::build(snap.threads, end - start, a.per_thread, &tf, lost, true, Some(&hottest));
    (report.start_mono_ns, report.end_mono_ns) = (start, end);
    Ok(Outcome { report, stop, timeline: tl })
}

/// Writes `-o FILE.html`'s page for a finished run (its `top` processes
/// when every process was traced).
pub fn write_page(o: &Outcome, path: &std::path::Path, top: usize) -> anyhow::Result<()> {
    let tl = o.timeline.as_ref().ok_or_else(|| anyhow::anyhow!("the run kept no timeline (no -o FILE.html)"))?;
    std::fs::write(path, html::render(&o.report, tl, top)).with_context(|| format!("writing {}", path.display()))
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &WhyArgs) -> anyhow::Result<i32> {
    let (_, out) = validate(a)?;
    let ctl = RunControl::new(a.run.duration)?;
    // The page is written at the end; its file is created now, so that an
    // unwritable path fails before anything is attached.
    let html = match &out {
        Some((p, Format::Html)) => {
            std::fs::File::create(p)
                .map_err(|e| usage(format!("-o {}: cannot write it ({e}); pick a writable path", p.display())))?;
            Some(p.clone())
        }
        _ => None,
    };
    let file = out.as_ref().filter(|(_, f)| *f != Format::Html).map(|(p, _)| p.as_path());
    let mut sink = crate::engine::output::Sink::open(file)?;
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
        || {},
    )?;
    if json {
        outcome.report.write_json(&mut sink, true)?;
    } else {
        sink.line(&outcome.report.text(top))?;
    }
    sink.flush()?;
    if let Some(path) = html {
        write_page(&outcome, &path, top)?;
    }
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
