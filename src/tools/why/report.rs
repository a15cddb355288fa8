//! `sonde why`'s report: threads with their time by category and their
//! waits named, grouped per process and per same-named threads, a verdict
//! per process and the next command; as text or JSON lines.
use std::collections::HashMap;

use serde::Serialize;
use serde_json::{json, Value};

use crate::engine::{output::Sink, symbols::KernelSymbols, taskfilter::TaskFilter};

/// Number of blocked classes (enum why_class).
pub const CLASSES: usize = 9;

/// What a blocked thread waited for (enum why_class in why.h, same order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Block I/O and files.
    Disk,
    /// TCP and UDP sockets.
    Network,
    /// Futexes, kernel mutexes and rwsems.
    Lock,
    /// nanosleep and timers.
    Sleep,
    /// epoll, poll, select, accept: waiting for work.
    Poll,
    /// Pipes and other local IPC (Unix sockets, message queues).
    Pipe,
    /// Page faults, reclaim, compaction, swap-in.
    Memory,
    /// io_uring_enter waiting for completions.
    IoUring,
    /// Anything else, named by the kernel function it waits in.
    Other,
}

impl Class {
    /// Every class, in the kernel half's order.
    pub const ALL: [Class; CLASSES] = [
        Class::Disk,
        Class::Network,
        Class::Lock,
        Class::Sleep,
        Class::Poll,
        Class::Pipe,
        Class::Memory,
        Class::IoUring,
        Class::Other,
    ];

    /// The class of the kernel half's number (Other for one out of range).
    pub fn of(n: u8) -> Class {
        Class::ALL.get(usize::from(n)).copied().unwrap_or(Class::Other)
    }

    /// Its JSON key and display name.
    pub fn name(self) -> &'static str {
        match self {
            Class::Disk => "disk",
            Class::Network => "network",
            Class::Lock => "lock",
            Class::Sleep => "sleep",
            Class::Poll => "poll",
            Class::Pipe => "pipe",
            Class::Memory => "memory",
            Class::IoUring => "io_uring",
            Class::Other => "other",
        }
    }

    /// Waiting for work rather than for a resource: not time lost.
    pub fn idle(self) -> bool {
        matches!(self, Class::Poll | Class::Sleep | Class::IoUring)
    }
}

/// One wait (or all waits of a thread on one object, woken by one thread).
#[derive(Debug, Clone, Serialize)]
pub struct Wait {
    /// Its class.
    pub class: Class,
    /// Time blocked.
    pub ns: u64,
    /// Waits counted (an open one included).
    pub count: u64,
    /// What it waited on, in words.
    pub object: String,
    /// The system call it waited in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    /// The kernel function it waited in, where that was taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_function: Option<String>,
    /// A socket's local and remote address, `ADDR:PORT`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// See `local`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// receive, send or connect (sockets, pipes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<&'static str>,
    /// A futex's address in the process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// What woke it: "thread" (waker_tid, waker_comm), "softirq" (work run
    /// on waker_tid's time, named in `softirq`), "timer", "interrupt", or
    /// "" (none seen: a wait still open at the end).
    pub woken_by: &'static str,
    /// The softirq that woke it (NET_RX, BLOCK, TIMER...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softirq: Option<&'static str>,
    /// The thread that woke it (0: none, or a timer or interrupt).
    pub waker_tid: u32,
    /// That thread's name.
    pub waker_comm: String,
    /// Whether a wait was still open at the end of the window.
    pub open: bool,
    /// The class the kernel half counted it in (before a kernel stack
    /// showed it to be a lock).
    #[serde(skip)]
    pub counted_as: Class,
}

/// One traced thread's window.
#[derive(Debug, Clone)]
pub struct Thread {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub comm: String,
    /// Its time in the window.
    pub window_ns: u64,
    /// On CPU.
    pub on_cpu_ns: u64,
    /// Of the time on CPU: taken by the hypervisor (steal time).
    pub on_cpu_steal_ns: u64,
    /// Of the time on CPU: serving interrupts (where the kernel keeps irq time).
    pub on_cpu_irq_ns: u64,
    /// Runnable, waiting for a CPU.
    pub runqueue_ns: u64,
    /// Runnable, its cgroup's CPU quota spent.
    pub throttled_ns: u64,
    /// Blocked, by class.
    pub blocked_ns: [u64; CLASSES],
    /// The share of on-CPU time in user mode (the kernel's own split).
    pub user_share: Option<f64>,
    /// Its waits, longest first.
    pub waits: Vec<Wait>,
    /// It exited in the window.
    pub exited: bool,
    /// It started in the window.
    pub started: bool,
}

impl Thread {
    /// A thread with the kernel half's slots (enum why_acc).
    pub fn new(pid: u32, tid: u32, comm: String, window_ns: u64, acc: [u64; 3 + CLASSES]) -> Thread {
        let mut blocked_ns = [0; CLASSES];
        blocked_ns.copy_from_slice(&acc[3..]);
        Thread {
            pid,
            tid,
            comm,
            window_ns,
            on_cpu_ns: acc[0],
            on_cpu_steal_ns: 0,
            on_cpu_irq_ns: 0,
            runqueue_ns: acc[1],
            throttled_ns: acc[2],
            blocked_ns,
            user_share: None,
            waits: Vec::new(),
            exited: false,
            started: false,
        }
    }

    /// All blocked time.
    pub fn blocked(&self) -> u64 {
        self.blocked_ns.iter().sum()
    }

    /// Every slot together: equals the window.
    pub fn accounted(&self) -> u64 {
        self.on_cpu_ns + self.runqueue_ns + self.throttled_ns + self.blocked()
    }

    /// Time not on CPU and not waiting for work.
    pub fn lost(&self) -> u64 {
        self.runqueue_ns
            + self.throttled_ns
            + Class::ALL.iter().filter(|c| !c.idle()).map(|c| self.blocked_ns[*c as usize]).sum::<u64>()
    }

    /// Merges waits on one (class, object, waker), moves waits the kernel
    /// stack shows to be on a kernel lock to that class, sorts them.
    pub fn finish(&mut self) {
        let mut merged: Vec<Wait> = Vec::new();
        let waits: Vec<Wait> = self.waits.drain(..).collect();
        for mut w in waits {
            if w.counted_as != w.class {
                reclass(self, w.counted_as, w.class, w.ns);
                w.counted_as = w.class;
            }
            match merged.iter_mut().find(|m| {
                m.class == w.class && m.object == w.object && m.waker_tid == w.waker_tid && m.woken_by == w.woken_by
            }) {
                Some(m) => {
                    m.ns += w.ns;
                    m.count += w.count;
                    m.open |= w.open;
                }
                None => merged.push(w),
            }
        }
        merged.sort_by_key(|w| std::cmp::Reverse(w.ns));
        self.waits = merged;
    }
}

/// Moves a wait's time between classes (the user half's reclassification).
fn reclass(t: &mut Thread, from: Class, to: Class, ns: u64) {
    let n = ns.min(t.blocked_ns[from as usize]);
    t.blocked_ns[from as usize] -= n;
    t.blocked_ns[to as usize] += n;
}

/// The kernel's name of softirq `n` (include/linux/interrupt.h).
fn softirq_name(n: u8) -> &'static str {
    const NAMES: [&str; 10] =
        ["HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"];
    NAMES.get(usize::from(n)).copied().unwrap_or("softirq")
}

impl Wait {
    /// ", woken by ..." for the text report ("" when nothing woke it).
    pub fn waker_text(&self) -> String {
        match self.woken_by {
            "thread" => format!(", woken by {} ({})", self.waker_comm, self.waker_tid),
            "softirq" if self.waker_tid != 0 => {
                format!(
                    ", woken by {} softirq work on {} ({})",
                    self.softirq.unwrap_or(""),
                    self.waker_comm,
                    self.waker_tid
                )
            }
            "softirq" => format!(", woken by {} softirq work", self.softirq.unwrap_or("")),
            "timer" => ", woken by a timer".into(),
            "interrupt" => ", woken by an interrupt".into(),
            _ => String::new(),
        }
    }
}

/// Names kernel stacks and objects, cached across reads.
#[derive(Default)]
pub struct Namer {
    stacks: HashMap<u64, (String, bool)>,
    paths: HashMap<(u32, u32, u64), Option<String>>,
}

/// Frames that say how a thread waits, not what for: skipped when naming
/// where it waits.
fn scheduler_frame(f: &str) -> bool {
    const SKIP: &[&str] = &[
        "bpf_",
        "__bpf_",
        "__traceiter_",
        "trace_",
        "__schedule",
        "schedule",
        "preempt_schedule",
        "io_schedule",
        "__cond_resched",
        "__probestub_",
        "do_nanosleep",
        "hrtimer_nanosleep",
        "__sched_text",
        "rt_mutex_schedule",
        "__x64_sys_",
        "__arm64_sys_",
        "do_syscall_",
        "el0_",
        "entry_SYSCALL",
        "[unknown]",
    ];
    SKIP.iter().any(|p| f.starts_with(p))
}

/// A kernel function a thread waits in for a lock another thread holds.
fn lock_frame(f: &str) -> bool {
    const LOCKS: &[&str] = &[
        "mutex_lock",
        "__mutex_lock",
        "rwsem_down_",
        "down_read",
        "down_write",
        "rt_mutex",
        "percpu_rwsem_wait",
        "__down",
        "down_killable",
        "down_interruptible",
        "rwbase_",
    ];
    LOCKS.iter().any(|p| f.starts_with(p))
}

impl Namer {
    /// Names the kernel stacks not yet named.
    pub fn add_stacks(&mut self, stacks: &HashMap<u64, Vec<u64>>, ksyms: &KernelSymbols) {
        for (id, frames) in stacks {
            if self.stacks.contains_key(id) {
                continue;
            }
            let names = ksyms.names(frames);
            let plain: Vec<&str> = names.iter().map(|n| n.split('+').next().unwrap_or(n)).collect();
            let lock = plain.iter().any(|f| lock_frame(f));
            let name = plain
                .iter()
                .find(|f| if lock { lock_frame(f) } else { !scheduler_frame(f) })
                .map(|s| s.to_string())
                .unwrap_or_else(|| "an unknown kernel function".to_string());
            self.stacks.insert(*id, (name, lock));
        }
    }

    /// The path of descriptor `fd` of `pid` if it still names inode `ino`.
    fn path(&mut self, pid: u32, fd: u32, ino: u64) -> Option<String> {
        self.paths
            .entry((pid, fd, ino))
            .or_insert_with(|| {
                let link = format!("/proc/{pid}/fd/{fd}");
                let meta = std::fs::metadata(&link).ok()?;
                use std::os::unix::fs::MetadataExt;
                if meta.ino() != ino {
                    return None;
                }
                std::fs::read_link(&link).ok().map(|p| p.to_string_lossy().into_owned())
            })
            .clone()
    }

    /// Finished waits as the kernel half keeps them by key (the `waits`
    /// map, and those still held in a thread's record), named.
    pub fn wait_of(
        &mut self,
        k: &super::skel::types::why_wait_key,
        waker_comm: String,
        ns: u64,
        count: u64,
        objects: &HashMap<u64, super::skel::types::why_obj>,
    ) -> Wait {
        self.wait(k.cls, k.obj, k.kstack, k.sys, k.waker, k.wctx, waker_comm, ns, count, false, objects)
    }

    /// A wait as the kernel half recorded it, named.
    #[allow(clippy::too_many_arguments)]
    pub fn wait(
        &mut self,
        cls: u8,
        obj: u64,
        kstack: u64,
        sys: u16,
        waker: u32,
        wctx: u8,
        waker_comm: String,
        ns: u64,
        count: u64,
        open: bool,
        objects: &HashMap<u64, super::skel::types::why_obj>,
    ) -> Wait {
        let class = Class::of(cls);
        let syscall = (sys > 0).then(|| super::syscalls::name(u32::from(sys) - 1));
        let kfn = self.stacks.get(&kstack).cloned();
        let mut w = Wait {
            class,
            ns,
            count,
            object: String::new(),
            syscall: syscall.clone(),
            kernel_function: kfn.as_ref().map(|k| k.0.clone()),
            local: None,
            remote: None,
            op: None,
            address: None,
            woken_by: match wctx {
                0 => "",
                2 => "timer",
                3 => "interrupt",
                n if n >= 4 => "softirq",
                _ => "thread",
            },
            softirq: (wctx >= 4).then(|| softirq_name(wctx - 4)),
            waker_tid: waker,
            waker_comm: if waker == 0 { String::new() } else { waker_comm },
            open,
            counted_as: class,
        };
        if let Some((f, true)) = &kfn {
            // Uninterruptible in a kernel lock: a lock, whatever the call.
            w.class = Class::Lock;
            w.object = format!("a kernel lock ({f})");
            return w;
        }
        let op = match obj & 3 {
            1 => "send",
            2 | 3 => "connect",
            _ => "receive",
        };
        match class {
            Class::Lock if obj != 0 => {
                w.address = Some(format!("{obj:#x}"));
                w.object = format!("futex {obj:#x}");
            }
            Class::Sleep => w.object = syscall.clone().unwrap_or_else(|| "a timer".into()),
            Class::Memory => {
                w.object = kfn
                    .map(|k| format!("page fault or reclaim ({})", k.0))
                    .unwrap_or_else(|| "page fault or reclaim".into())
            }
            _ => {}
        }
        if !w.object.is_empty() {
            return w;
        }
        if let Some(o) = objects.get(&(obj & !3)) {
            let path = self.path(o.tgid, o.fd, o.ino);
            match o.kind {
                3 => {
                    let addr = |a: &[u8; 16], port: u16| match o.family {
                        2 => format!("{}:{port}", std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3])),
                        10 => format!("[{}]:{port}", std::net::Ipv6Addr::from(*a)),
                        _ => String::new(),
                    };
                    let proto = match (o.family, o.proto) {
                        (1, _) => "unix socket",
                        (_, 6) => "tcp",
                        (_, 17) => "udp",
                        _ => "socket",
                    };
                    if o.family == 2 || o.family == 10 {
                        let (l, r) = (addr(&o.saddr, o.sport), addr(&o.daddr, o.dport));
                        w.object = if class == Class::Poll {
                            format!("{proto} {l} (accepting connections)")
                        } else {
                            format!("{op} {proto} {l} {} {r}", if op == "receive" { "<-" } else { "->" })
                        };
                        w.local = Some(l);
                        if o.dport != 0 {
                            w.remote = Some(r);
                        }
                    } else {
                        w.object = format!("{op} {proto} ({})", path.unwrap_or_else(|| format!("inode {}", o.ino)));
                    }
                    w.op = Some(op);
                }
                2 => {
                    w.object = format!("{op} pipe:[{}]", o.ino);
                    w.op = Some(op);
                }
                _ => {
                    let dev = format!("{}:{}", o.dev >> 20, o.dev & 0xfffff);
                    w.object = path.unwrap_or_else(|| format!("file on device {dev}, inode {}", o.ino));
                }
            }
            return w;
        }
        w.object = match (&w.kernel_function, &syscall) {
            (_, Some(s)) if class != Class::Other => s.clone(),
            (Some(f), Some(s)) => format!("{s} in {f}"),
            (Some(f), None) => f.clone(),
            (None, Some(s)) => s.clone(),
            (None, None) => "not known".into(),
        };
        w
    }
}

/// Per-interval view: `now` minus `base` per thread (threads new since are whole).
pub fn diff(now: &HashMap<u32, Thread>, base: &HashMap<u32, Thread>) -> HashMap<u32, Thread> {
    now.iter()
        .map(|(tid, t)| {
            let mut d = t.clone();
            if let Some(b) = base.get(tid) {
                d.window_ns = t.window_ns.saturating_sub(b.window_ns);
                d.on_cpu_ns = t.on_cpu_ns.saturating_sub(b.on_cpu_ns);
                d.on_cpu_steal_ns = t.on_cpu_steal_ns.saturating_sub(b.on_cpu_steal_ns);
                d.on_cpu_irq_ns = t.on_cpu_irq_ns.saturating_sub(b.on_cpu_irq_ns);
                d.runqueue_ns = t.runqueue_ns.saturating_sub(b.runqueue_ns);
                d.throttled_ns = t.throttled_ns.saturating_sub(b.throttled_ns);
                for c in 0..CLASSES {
                    d.blocked_ns[c] = t.blocked_ns[c].saturating_sub(b.blocked_ns[c]);
                }
                for w in &mut d.waits {
                    if let Some(bw) = b.waits.iter().find(|x| {
                        x.class == w.class
                            && x.object == w.object
                            && x.waker_tid == w.waker_tid
                            && x.woken_by == w.woken_by
                    }) {
                        w.ns = w.ns.saturating_sub(bw.ns);
                        w.count = w.count.saturating_sub(bw.count);
                    }
                }
                d.waits.retain(|w| w.ns > 0);
            }
            (*tid, d)
        })
        .filter(|(_, t)| t.window_ns > 0)
        .collect()
}

/// What the kernel half could not keep, and state changes it did not see.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Losses {
    /// Context switches seen.
    pub switches: u64,
    /// Wake-ups of traced threads.
    pub wakeups: u64,
    /// Threads not traced: the thread map was full.
    pub threads_full: u64,
    /// Waits counted in their thread's class but not by object: the wait map was full.
    pub waits_full: u64,
    /// Objects not described: the object map was full.
    pub objects_full: u64,
    /// Kernel stacks not kept: the stack map was full.
    pub kstacks_full: u64,
    /// Kernel stacks not captured.
    pub kstack_errors: u64,
    /// Blocked threads whose registers could not be read (no system call known).
    pub regs_unread: u64,
    /// Switch-ins with no wake-up seen before (placed by the thread's own schedstat).
    pub unseen_wakeups: u64,
    /// Switch-outs with no switch-in seen before (placed likewise).
    pub unseen_switches: u64,
}

/// Threads of one name in a process.
#[derive(Debug, Clone)]
pub struct Group {
    /// The name.
    pub comm: String,
    /// Its threads' sum.
    pub sum: Thread,
    /// How many threads.
    pub threads: usize,
}

/// One process.
#[derive(Debug, Clone)]
pub struct Process {
    /// Its id.
    pub pid: u32,
    /// Its main thread's name (or its first thread's).
    pub comm: String,
    /// Every thread's sum.
    pub sum: Thread,
    /// Threads by name (or each thread with --per-thread), most time lost first.
    pub groups: Vec<Group>,
    /// Its threads.
    pub threads: Vec<Thread>,
    /// The verdict sentence.
    pub verdict: String,
    /// The command that tells more.
    pub next: Option<String>,
}

/// The sum of threads (waits merged).
fn sum(pid: u32, comm: &str, ts: &[&Thread]) -> Thread {
    let mut s = Thread::new(pid, 0, comm.to_string(), 0, [0; 3 + CLASSES]);
    for t in ts {
        s.window_ns += t.window_ns;
        s.on_cpu_ns += t.on_cpu_ns;
        s.on_cpu_steal_ns += t.on_cpu_steal_ns;
        s.on_cpu_irq_ns += t.on_cpu_irq_ns;
        s.runqueue_ns += t.runqueue_ns;
        s.throttled_ns += t.throttled_ns;
        for c in 0..CLASSES {
            s.blocked_ns[c] += t.blocked_ns[c];
        }
        s.waits.extend(t.waits.iter().cloned());
    }
    let (mut u, mut cpu) = (0.0, 0u64);
    for t in ts {
        if let Some(sh) = t.user_share {
            u += sh * t.on_cpu_ns as f64;
            cpu += t.on_cpu_ns;
        }
    }
    if cpu > 0 {
        s.user_share = Some(u / cpu as f64);
    }
    s.finish();
    s
}

/// The report.
#[derive(Debug, Clone)]
pub struct Report {
    /// The window's length.
    pub window_ns: u64,
    /// Processes, most time lost first.
    pub processes: Vec<Process>,
    /// Whether every process was traced.
    pub host: bool,
    /// What was lost or placed.
    pub losses: Losses,
    /// The run's end (not an interval).
    pub last: bool,
    /// One group per thread (--per-thread).
    pub per_thread: bool,
    /// The window's start and end, CLOCK_MONOTONIC nanoseconds.
    pub start_mono_ns: u64,
    /// See `start_mono_ns`.
    pub end_mono_ns: u64,
}

fn pct(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        100.0 * n as f64 / of as f64
    }
}

fn secs(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s >= 10.0 {
        format!("{s:.1} s")
    } else if s >= 0.01 {
        format!("{s:.2} s")
    } else {
        format!("{:.2} ms", ns as f64 / 1e6)
    }
}

/// The largest category: its name, time, and its top wait. `idle`: among
/// the waits for work (poll, sleep, io_uring) only; else among the others
/// and time on CPU.
fn biggest(t: &Thread, idle: bool) -> (&'static str, u64, Option<&Wait>) {
    let mut best = ("on_cpu", if idle { 0 } else { t.on_cpu_ns }, None);
    if !idle {
        for (name, v) in [("runqueue", t.runqueue_ns), ("throttled", t.throttled_ns)] {
            if v > best.1 {
                best = (name, v, None);
            }
        }
    }
    for c in Class::ALL.into_iter().filter(|c| c.idle() == idle) {
        let v = t.blocked_ns[c as usize];
        if v > best.1 {
            best = (c.name(), v, t.waits.iter().find(|w| w.class == c));
        }
    }
    best
}

fn verdict(p: &Process, per_thread: bool) -> (String, Option<String>) {
    let s = &p.sum;
    // The cause: the largest time on CPU or lost; only when that is small
    // (under 5% of the time), the largest wait for work.
    let (mut what, mut ns, mut wait) = biggest(s, false);
    if pct(ns, s.window_ns) < 5.0 {
        (what, ns, wait) = biggest(s, true);
    }
    let share = pct(ns, s.window_ns);
    let who = match p.groups.iter().max_by_key(|g| match what {
        "on_cpu" => g.sum.on_cpu_ns,
        "runqueue" => g.sum.runqueue_ns,
        "throttled" => g.sum.throttled_ns,
        _ => Class::ALL.iter().find(|c| c.name() == what).map(|c| g.sum.blocked_ns[*c as usize]).unwrap_or(0),
    }) {
        Some(g) if p.groups.len() > 1 && per_thread => g.comm.clone(),
        Some(g) if p.groups.len() > 1 => {
            format!("{} ({} thread{})", g.comm, g.threads, if g.threads == 1 { "" } else { "s" })
        }
        _ => format!("{} ({})", p.comm, p.pid),
    };
    let pid = p.pid;
    let obj = wait.map(|w| w.object.clone()).unwrap_or_default();
    let waker = wait.map(Wait::waker_text).unwrap_or_default();
    match what {
        "on_cpu" => (
            format!("{who} spent {share:.0}% of its time on CPU: it is busy, not waiting"),
            Some(format!("sonde profile -p {pid}")),
        ),
        "runqueue" => (
            format!("{who} spent {share:.0}% runnable but waiting for a CPU: more runnable threads than CPUs"),
            Some("sonde profile -d 10s (every process: what ran instead)".into()),
        ),
        "throttled" => (
            format!("{who} spent {share:.0}% runnable but throttled by its cgroup's CPU quota: raise the quota (cpu.max, or cpu.cfs_quota_us) or use less CPU"),
            Some(format!("sonde profile -p {pid}")),
        ),
        "network" => {
            let port = wait.and_then(|w| w.remote.as_deref()).and_then(|r| r.rsplit(':').next()).unwrap_or("");
            (
                format!("{who} spent {share:.0}% blocked on the network: {obj}{waker}"),
                Some(if port.is_empty() || port == "0" { format!("sonde retrans -p {pid}") } else { format!("sonde retrans --port {port}") }),
            )
        }
        "lock" => (
            format!("{who} spent {share:.0}% blocked on a lock: {obj}{waker}"),
            Some(format!("sonde wakeup -p {pid}")),
        ),
        "disk" => (
            format!("{who} spent {share:.0}% blocked on disk: {obj}"),
            Some(format!("sonde offcpu -p {pid} --state uninterruptible")),
        ),
        "memory" => (
            format!("{who} spent {share:.0}% waiting for memory: {obj}"),
            Some(format!("sonde offcpu -p {pid} --state uninterruptible")),
        ),
        "pipe" => (
            format!("{who} spent {share:.0}% blocked on a pipe or local socket: {obj}{waker}"),
            Some(format!("sonde wakeup -p {pid}")),
        ),
        "sleep" => (format!("{who} spent {share:.0}% sleeping by its own choice ({obj})"), Some(format!("sonde offcpu -p {pid}"))),
        "poll" => (format!("{who} spent {share:.0}% waiting for work ({obj}): idle, not slow"), None),
        "io_uring" => (format!("{who} spent {share:.0}% waiting for io_uring completions"), Some(format!("sonde offcpu -p {pid}"))),
        _ => (format!("{who} spent {share:.0}% blocked in the kernel: {obj}"), Some(format!("sonde offcpu -p {pid}"))),
    }
}

impl Report {
    /// Groups `threads` per process, judges each.
    pub fn build(
        threads: HashMap<u32, Thread>,
        window_ns: u64,
        per_thread: bool,
        tf: &TaskFilter,
        losses: Losses,
        last: bool,
    ) -> Report {
        let host = tf.pids.is_empty() && tf.tids.is_empty() && tf.cgroup == 0 && tf.comm.is_none();
        let mut by_pid: HashMap<u32, Vec<Thread>> = HashMap::new();
        for t in threads.into_values() {
            by_pid.entry(t.pid).or_default().push(t);
        }
        let mut processes: Vec<Process> = by_pid
            .into_iter()
            .map(|(pid, mut ts)| {
                ts.sort_by_key(|t| t.tid);
                let comm = ts.iter().find(|t| t.tid == pid).or(ts.first()).map(|t| t.comm.clone()).unwrap_or_default();
                let refs: Vec<&Thread> = ts.iter().collect();
                let total = sum(pid, &comm, &refs);
                let mut groups: Vec<Group> = if per_thread {
                    ts.iter()
                        .map(|t| Group { comm: format!("{} ({})", t.comm, t.tid), sum: t.clone(), threads: 1 })
                        .collect()
                } else {
                    let mut names: Vec<&str> = ts.iter().map(|t| t.comm.as_str()).collect();
                    names.sort_unstable();
                    names.dedup();
                    names
                        .into_iter()
                        .map(|n| {
                            let g: Vec<&Thread> = ts.iter().filter(|t| t.comm == n).collect();
                            Group { comm: n.to_string(), sum: sum(pid, n, &g), threads: g.len() }
                        })
                        .collect()
                };
                groups.sort_by_key(|g| std::cmp::Reverse(g.sum.lost() + g.sum.on_cpu_ns));
                let mut p = Process { pid, comm, sum: total, groups, threads: ts, verdict: String::new(), next: None };
                let (v, n) = verdict(&p, per_thread);
                p.verdict = v;
                p.next = n;
                p
            })
            .collect();
        processes.sort_by(|a, b| b.sum.lost().cmp(&a.sum.lost()).then(a.pid.cmp(&b.pid)));
        Report { window_ns, processes, host, losses, last, per_thread, start_mono_ns: 0, end_mono_ns: 0 }
    }

    /// The terminal report (`top` processes when every process was traced).
    pub fn text(&self, top: usize) -> String {
        let mut out = String::new();
        let shown = if self.host { top } else { usize::MAX };
        let n_threads: usize = self.processes.iter().map(|p| p.threads.len()).sum();
        out += &format!(
            "sonde why: {} window{}, {} process{}, {} thread{}{}\n",
            secs(self.window_ns),
            if self.last { "" } else { " (interval)" },
            self.processes.len(),
            if self.processes.len() == 1 { "" } else { "es" },
            n_threads,
            if n_threads == 1 { "" } else { "s" },
            if self.host && self.processes.len() > top {
                format!("; the {top} that lost the most time")
            } else {
                String::new()
            }
        );
        for p in self.processes.iter().take(shown) {
            let s = &p.sum;
            out += &format!(
                "\nPID {} {}: {} thread{}, {} of thread time\n",
                p.pid,
                p.comm,
                p.threads.len(),
                if p.threads.len() == 1 { "" } else { "s" },
                secs(s.window_ns)
            );
            let split = s
                .user_share
                .map(|u| format!("  (user {:.0}%, system {:.0}%)", 100.0 * u, 100.0 * (1.0 - u)))
                .unwrap_or_default();
            let mut rows = vec![("on CPU".to_string(), s.on_cpu_ns, split)];
            rows.push(("run queue".into(), s.runqueue_ns, String::new()));
            rows.push(("throttled".into(), s.throttled_ns, String::new()));
            for c in Class::ALL {
                let v = s.blocked_ns[c as usize];
                if v == 0 {
                    continue;
                }
                let top_waits: Vec<String> = s
                    .waits
                    .iter()
                    .filter(|w| w.class == c)
                    .take(2)
                    .map(|w| format!("{} {}{}", w.object, secs(w.ns), w.waker_text()))
                    .collect();
                rows.push((
                    format!("blocked: {}", c.name()),
                    v,
                    if top_waits.is_empty() { String::new() } else { format!("  {}", top_waits.join("; ")) },
                ));
            }
            for (name, v, extra) in rows {
                if v == 0 && name != "on CPU" {
                    continue;
                }
                out += &format!("  {name:<18} {:>5.1}%  {:>9}{extra}\n", pct(v, s.window_ns), secs(v));
            }
            if p.groups.len() > 1 {
                out += "  threads:\n";
                for g in &p.groups {
                    let t = &g.sum;
                    let mut parts = vec![format!("on CPU {:.0}%", pct(t.on_cpu_ns, t.window_ns))];
                    for (n, v) in [("run queue", t.runqueue_ns), ("throttled", t.throttled_ns)] {
                        if pct(v, t.window_ns) >= 0.5 {
                            parts.push(format!("{n} {:.0}%", pct(v, t.window_ns)));
                        }
                    }
                    for c in Class::ALL {
                        let v = t.blocked_ns[c as usize];
                        if pct(v, t.window_ns) >= 0.5 {
                            parts.push(format!("{} {:.0}%", c.name(), pct(v, t.window_ns)));
                        }
                    }
                    let name = if self.per_thread { g.comm.clone() } else { format!("{} ({})", g.comm, g.threads) };
                    out += &format!("    {name:<24} {}\n", parts.join(", "));
                }
            }
            out += &format!("  => {}", p.verdict);
            if let Some(n) = &p.next {
                out += &format!("; next: `{n}`");
            }
            out += "\n";
        }
        let l = &self.losses;
        out += &format!(
            "\n{} context switches, {} wake-ups of traced threads seen; lost: {} threads (thread map full), {} waits by object (wait map full), {} objects, {} kernel stacks ({} not captured), {} registers unread{}",
            l.switches,
            l.wakeups,
            l.threads_full,
            l.waits_full,
            l.objects_full,
            l.kstacks_full,
            l.kstack_errors,
            l.regs_unread,
            if l.unseen_wakeups + l.unseen_switches > 0 {
                format!(
                    "; {} wake-ups and {} switch-ins not seen by the hooks, placed by the threads' own scheduler statistics",
                    l.unseen_wakeups, l.unseen_switches
                )
            } else {
                String::new()
            }
        );
        if self.host && crate::engine::features::init_hides_tracing() {
            out += "\nPID 1 is not traced: this kernel skips tracing programs while its threads run (`sonde doctor`: sees_pid1)";
        }
        out
    }

    fn thread_json(t: &Thread, kind: &str) -> Value {
        let mut blocked = serde_json::Map::new();
        for c in Class::ALL {
            blocked.insert(c.name().into(), json!(t.blocked_ns[c as usize]));
        }
        let mut v = json!({
            "type": kind, "pid": t.pid, "comm": t.comm, "window_ns": t.window_ns, "on_cpu_ns": t.on_cpu_ns,
            "on_cpu_steal_ns": t.on_cpu_steal_ns, "on_cpu_irq_ns": t.on_cpu_irq_ns,
            "runqueue_ns": t.runqueue_ns, "throttled_ns": t.throttled_ns, "blocked_ns": blocked,
            "waits": t.waits,
        });
        if kind == "thread" {
            v["tid"] = json!(t.tid);
            v["started"] = json!(t.started);
            v["exited"] = json!(t.exited);
        }
        if let Some(u) = t.user_share {
            let user = (u * t.on_cpu_ns as f64).round() as u64;
            v["on_cpu_user_ns"] = json!(user);
            v["on_cpu_system_ns"] = json!(t.on_cpu_ns.saturating_sub(user));
        }
        v
    }

    /// JSON lines: a thread line for each thread, a process line for each
    /// process (with its verdict), then (at the end) the summary.
    pub fn write_json(&self, sink: &mut Sink, last: bool) -> std::io::Result<()> {
        if !last {
            sink.json(&json!({"type": "interval", "window_ns": self.window_ns}))?;
        }
        for p in &self.processes {
            for t in &p.threads {
                sink.json(&Self::thread_json(t, "thread"))?;
            }
            let mut v = Self::thread_json(&p.sum, "process");
            v["threads"] = json!(p.threads.len());
            v["verdict"] = json!(p.verdict);
            v["next"] = json!(p.next);
            sink.json(&v)?;
        }
        if last {
            sink.json(&json!({
                "type": "summary", "duration_s": self.window_ns as f64 / 1e9,
                "start_monotonic_ns": self.start_mono_ns, "end_monotonic_ns": self.end_mono_ns,
                "processes": self.processes.len(),
                "threads": self.processes.iter().map(|p| p.threads.len()).sum::<usize>(),
                "lost": self.losses,
            }))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_frames_are_skipped_and_locks_found() {
        assert!(scheduler_frame("__schedule"));
        assert!(scheduler_frame("schedule_timeout"));
        assert!(!scheduler_frame("do_wait"));
        assert!(lock_frame("__mutex_lock"));
        assert!(lock_frame("rwsem_down_write_slowpath"));
        assert!(!lock_frame("pipe_read"));
    }

    #[test]
    fn a_thread_sums_to_its_window() {
        let t = Thread::new(1, 1, "x".into(), 90, [10, 5, 5, 10, 10, 10, 10, 10, 10, 10, 0, 0]);
        assert_eq!(t.accounted(), 90);
        // Run queue, throttled, and disk, network, lock, pipe, memory, other.
        assert_eq!(t.lost(), 5 + 5 + 10 + 10 + 10 + 10 + 10);
    }
}
