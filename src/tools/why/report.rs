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
    /// TCP retransmissions on its connection in the window, when counted
    /// (a TCP socket with a peer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<Retransmits>,
    /// Packets the kernel dropped on its connection in the window, both
    /// directions, when counted (a TCP or UDP socket with a peer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drops: Option<Drops>,
    /// What a wait for memory was for, from its kernel stack: `file_fault`
    /// (a page fault reading a file), `swap_in`, `reclaim`, `cgroup_reclaim`
    /// (reclaim for its memory cgroup's limit), `compaction`, `migration`,
    /// or `fault` (a page fault, otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<&'static str>,
    /// The block device of the file waited on, with every request it
    /// completed in the window (a disk wait on a file of a block device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<super::disks::Device>,
    /// The processes at the other end on this host: a TCP or UDP
    /// connection's peer socket's holders, or those holding a pipe's other
    /// end (its write end for a reader, its read end for a writer).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<Peer>,
    /// Who released a lock waited for: the threads that woke it, with
    /// their stacks at the release (the three that ended the most of its
    /// time; the final report only, not each `-i` interval's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub released_by: Vec<super::stacks::Releaser>,
    /// What the other end is looked up by (see [`super::peers`]).
    #[serde(skip)]
    pub far: Option<Far>,
    /// The object as the kernel half keys it.
    #[serde(skip)]
    pub obj: u64,
    /// The kernel stack it waited in, as the kernel half keys it (0: none).
    #[serde(skip)]
    pub kstack: u64,
    /// The class the kernel half counted it in (before a kernel stack
    /// showed it to be a lock).
    #[serde(skip)]
    pub counted_as: Class,
}

/// A process at the other end of a socket or pipe waited on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Peer {
    /// Its process id.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// It holds the listening socket of a connection it has not accepted
    /// (in JSON only when true).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unaccepted: bool,
}

/// What a wait's other end is looked up by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Far {
    /// A connected TCP or UDP socket: its endpoints as it sees them, and its
    /// network namespace's inode.
    Socket {
        /// (local address, port, remote address, port).
        tuple: crate::engine::procfd::Tuple,
        /// UDP (else TCP).
        udp: bool,
        /// Its network namespace.
        netns: u64,
    },
    /// An anonymous pipe or a named FIFO, by its device (the kernel's
    /// number) and inode.
    Pipe {
        /// The device of the inode's file system (the pipe file system for
        /// an anonymous pipe).
        dev: u64,
        /// The pipe's inode.
        ino: u64,
    },
    /// A connected Unix socket, by its peer's socket inode (the kernel's
    /// own link between the two).
    Unix {
        /// The peer socket's inode.
        peer: u64,
    },
}

impl Far {
    /// What the kernel half's description of a socket or pipe is looked up
    /// by (None: a file, a listening or unconnected socket).
    pub fn of(o: &super::skel::types::why_obj) -> Option<Far> {
        match o.kind {
            2 => Some(Far::Pipe { dev: o.dev, ino: o.ino }),
            3 if o.family == 1 && o.peer != 0 => Some(Far::Unix { peer: o.peer }),
            3 if (o.family == 2 || o.family == 10) && o.dport != 0 && (o.proto == 6 || o.proto == 17) => {
                // ip_of gives an IPv4-mapped address as IPv4, as procfd's
                // lookups compare them.
                let (la, ra) = (ip_of(o.family, &o.saddr)?, ip_of(o.family, &o.daddr)?);
                Some(Far::Socket { tuple: (la, o.sport, ra, o.dport), udp: o.proto == 17, netns: u64::from(o.netns) })
            }
            _ => None,
        }
    }
}

/// The TCP retransmissions of one connection in the window, both ends' (the
/// other end's when it is on this host too), by cause as `sonde retrans`
/// names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Retransmits {
    /// Retransmissions.
    pub total: u64,
    /// The segments they carried (what the MIB's RetransSegs counts).
    pub segments: u64,
    /// After a retransmission timeout (RFC 6298): the first of a timeout.
    pub rto: u64,
    /// Tail loss probes (RFC 8985).
    pub tlp: u64,
    /// Fast retransmits (RFC 5681, or RACK's).
    pub fast: u64,
    /// Further retransmits in loss recovery after a timeout.
    pub loss_recovery: u64,
    /// Of the SYN.
    pub syn: u64,
    /// Of the SYN-ACK.
    pub synack: u64,
    /// Attempts that failed to go out.
    pub failed: u64,
    /// Of `total`, those the other end sent.
    pub by_peer: u64,
    /// Sends after idle on which either end restarted slow start (RFC 5681
    /// 4.1: the congestion window back to its initial size), the other
    /// end's when it is on this host.
    pub slow_start_restarts: u64,
}

impl Retransmits {
    /// Adds one end's counts: its retransmissions (`count` and `segs` by
    /// cause, in `enum retrans_kind`'s order) and slow-start restarts.
    fn add(&mut self, c: &FlowCounts, peer: bool) {
        let (count, segs) = (&c.count, &c.segs);
        self.slow_start_restarts += c.restarts;
        let n: u64 = count.iter().sum();
        self.total += n;
        self.segments += segs.iter().sum::<u64>();
        // The causes, in counts_mut's order after total and segments.
        for (slot, c) in self.counts_mut()[2..9].iter_mut().zip(count) {
            **slot += c;
        }
        if peer {
            self.by_peer += n;
        }
    }

    /// Every count, in one order.
    fn counts_mut(&mut self) -> [&mut u64; 11] {
        [
            &mut self.total,
            &mut self.segments,
            &mut self.rto,
            &mut self.tlp,
            &mut self.fast,
            &mut self.loss_recovery,
            &mut self.syn,
            &mut self.synack,
            &mut self.failed,
            &mut self.by_peer,
            &mut self.slow_start_restarts,
        ]
    }

    /// Adds another connection's.
    fn plus(&mut self, b: &Retransmits) {
        let mut b = *b;
        for (x, y) in self.counts_mut().into_iter().zip(b.counts_mut()) {
            *x += *y;
        }
    }

    /// "14 TCP retransmissions (9 after a retransmission timeout, RFC 6298;
    /// ...)", or that there were none.
    pub fn text(&self) -> String {
        let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let restarts = if self.slow_start_restarts > 0 {
            format!(
                "; {} after idle (RFC 5681 4.1)",
                plural(self.slow_start_restarts, "slow-start restart", "slow-start restarts")
            )
        } else {
            String::new()
        };
        if self.total == 0 {
            return format!("no TCP retransmissions{restarts}");
        }
        let parts: Vec<String> = [
            (self.rto, "after a retransmission timeout (RFC 6298)", "after a retransmission timeout (RFC 6298)"),
            (self.tlp, "tail loss probe (RFC 8985)", "tail loss probes (RFC 8985)"),
            (self.fast, "fast retransmit (RFC 5681)", "fast retransmits (RFC 5681)"),
            (self.loss_recovery, "in loss recovery", "in loss recovery"),
            (self.syn, "of the SYN", "of the SYN"),
            (self.synack, "of the SYN-ACK", "of the SYN-ACK"),
            (self.failed, "failed to go out", "failed to go out"),
        ]
        .into_iter()
        .filter(|(n, ..)| *n > 0)
        .map(|(n, one, many)| plural(n, one, many))
        .collect();
        let peer = if self.by_peer > 0 { format!("; {} by the other end", self.by_peer) } else { String::new() };
        format!(
            "{} ({}{peer}){restarts}",
            plural(self.total, "TCP retransmission", "TCP retransmissions"),
            parts.join(", ")
        )
    }
}

/// Packets the kernel dropped on one connection in the window, both
/// directions (UDP too), by the kernel's reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Drops {
    /// Packets dropped.
    pub total: u64,
    /// By reason (`skb_drop_reason` without its prefix: `NETFILTER_DROP`,
    /// `TCP_OLD_DATA`...; `UNKNOWN` before Linux 5.17).
    pub by_reason: std::collections::BTreeMap<String, u64>,
}

impl Drops {
    /// "12 packets dropped (NETFILTER_DROP 12)".
    pub fn text(&self) -> String {
        let reasons: Vec<String> = {
            let mut v: Vec<(&String, &u64)> = self.by_reason.iter().collect();
            v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            v.into_iter().take(3).map(|(r, n)| format!("{r} {n}")).collect()
        };
        format!("{} packet{} dropped ({})", self.total, if self.total == 1 { "" } else { "s" }, reasons.join(", "))
    }

    /// The packets dropped for a reason that may have cost the wait: all
    /// but [`HARMLESS_DROPS`].
    pub fn costly(&self) -> u64 {
        self.by_reason.iter().filter(|(r, _)| !HARMLESS_DROPS.contains(&r.as_str())).map(|(_, n)| n).sum()
    }

    fn plus(&mut self, b: &Drops) {
        self.total += b.total;
        for (r, n) in &b.by_reason {
            *self.by_reason.entry(r.clone()).or_default() += n;
        }
    }
}

/// Drop reasons (`skb_drop_reason`) that cost a waiting reader or writer
/// nothing: packets freed with a socket at its close (its queues purged,
/// or arriving once it closed), and data, sequence numbers or
/// acknowledgements already received (a peer's spurious retransmission,
/// which its own `retrans` counts). Told in the report, never chosen as
/// the cause.
const HARMLESS_DROPS: &[&str] =
    &["QUEUE_PURGE", "SOCKET_CLOSE", "TCP_CLOSE", "TCP_OLD_DATA", "TCP_OLD_SEQUENCE", "TCP_OLD_ACK", "TCP_TOO_OLD_ACK"];

/// Drops by the packet's (source address and port, destination address
/// and port), by reason's number.
pub type FlowDrops = HashMap<FlowKey, HashMap<u32, u64>>;

/// The drops in `now` since `before` (both running totals): an interval's own.
pub fn drops_since(now: &FlowDrops, before: Option<&FlowDrops>) -> FlowDrops {
    now.iter()
        .map(|(k, rs)| {
            let b = before.and_then(|b| b.get(k));
            let d = rs
                .iter()
                .map(|(r, n)| (*r, n.saturating_sub(b.and_then(|b| b.get(r)).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .collect();
            (*k, d)
        })
        .collect()
}

/// A flow as the retransmitting socket (or the dropped packet) sees it:
/// local address and port, remote address and port, and the network
/// namespace it was seen in (its inode).
pub type FlowKey = (std::net::IpAddr, u16, std::net::IpAddr, u16, u32);

/// The counts of `map` on the flow `(l, lp, r, rp)` as a socket in network
/// namespace `netns` sees it, with `each` (entry, the flow reversed): in
/// its own namespace only where both ends are loopback addresses (two
/// containers' loopback connections may have the same addresses and
/// ports); in any namespace otherwise (a path through veths and bridges
/// crosses namespaces).
fn on_flow<V>(
    map: &HashMap<FlowKey, V>,
    (l, lp, r, rp): (std::net::IpAddr, u16, std::net::IpAddr, u16),
    netns: u32,
    mut each: impl FnMut(&V, bool),
) {
    let local = l.to_canonical().is_loopback() && r.to_canonical().is_loopback();
    for (key, reversed) in [((l, lp, r, rp), false), ((r, rp, l, lp), true)] {
        if local {
            if let Some(v) = map.get(&(key.0, key.1, key.2, key.3, netns)) {
                each(v, reversed);
            }
        } else {
            for (_, v) in map.iter().filter(|(k, _)| (k.0, k.1, k.2, k.3) == key) {
                each(v, reversed);
            }
        }
    }
}

/// One flow's retransmissions by cause (counts, then segments) and its
/// slow-start restarts after idle.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowCounts {
    pub count: [u64; 7],
    pub segs: [u64; 7],
    pub restarts: u64,
}

/// Each flow's retransmissions and slow-start restarts.
pub type FlowRetransmits = HashMap<FlowKey, FlowCounts>;

/// The retransmissions in `now` since `before` (both running totals), by
/// flow: an interval's own.
pub fn flows_since(now: &FlowRetransmits, before: Option<&FlowRetransmits>) -> FlowRetransmits {
    now.iter()
        .map(|(k, c)| {
            let b = before.and_then(|b| b.get(k)).copied().unwrap_or_default();
            let mut d = FlowCounts { restarts: c.restarts.saturating_sub(b.restarts), ..Default::default() };
            for i in 0..7 {
                d.count[i] = c.count[i].saturating_sub(b.count[i]);
                d.segs[i] = c.segs[i].saturating_sub(b.segs[i]);
            }
            (*k, d)
        })
        .collect()
}

/// An address as the kernel holds it (`family` AF_INET or AF_INET6; an
/// IPv4-mapped IPv6 address is the IPv4 one).
pub fn ip_of(family: u16, a: &[u8; 16]) -> Option<std::net::IpAddr> {
    use std::net::IpAddr;
    matches!(family, 2 | 10).then(|| match crate::engine::flowfilter::addr(family, a) {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    })
}

/// A thread that ran on a CPU while a traced thread waited in its run queue.
#[derive(Debug, Clone, Serialize)]
pub struct Instead {
    /// Its process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// Its name (at the time it ran).
    pub comm: String,
    /// Its CPU cgroup, relative to the cpu controller's mount ("" unknown).
    pub cgroup: String,
    /// The time it ran while the traced thread waited.
    pub ns: u64,
}

/// Merges entries on one (pid, tid, cgroup), longest first.
fn merge_instead(v: &mut Vec<Instead>) {
    let mut out: Vec<Instead> = Vec::new();
    for i in v.drain(..) {
        match out.iter_mut().find(|o| o.tid == i.tid && o.pid == i.pid && o.cgroup == i.cgroup) {
            Some(o) => o.ns += i.ns,
            None => out.push(i),
        }
    }
    out.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.tid.cmp(&b.tid)));
    *v = out;
}

/// `ran_instead` by process and thread name: (pid, comm, cgroup, ns), longest first.
fn instead_by_process(v: &[Instead]) -> Vec<(u32, String, String, u64)> {
    let mut out: Vec<(u32, String, String, u64)> = Vec::new();
    for i in v {
        match out.iter_mut().find(|o| o.0 == i.pid && o.1 == i.comm) {
            Some(o) => o.3 += i.ns,
            None => out.push((i.pid, i.comm.clone(), i.cgroup.clone(), i.ns)),
        }
    }
    out.sort_by(|a, b| b.3.cmp(&a.3).then(a.0.cmp(&b.0)));
    out
}

/// "ran instead: hog (4242) 1.20 s 61% in /batch, ...; 97% of the wait seen"
/// (empty when nothing was seen).
fn instead_text(t: &Thread, n: usize) -> String {
    let waited = t.runqueue_ns + t.throttled_ns;
    let by = instead_by_process(&t.ran_instead);
    if by.is_empty() || waited == 0 {
        return String::new();
    }
    let parts: Vec<String> = by
        .iter()
        .take(n)
        .map(|(pid, comm, cg, ns)| {
            let cg = if cg.is_empty() || cg == "/" { String::new() } else { format!(" in {cg}") };
            format!("{comm} ({pid}) {:.0}%{cg}", pct(*ns, waited))
        })
        .collect();
    format!("ran instead: {}", parts.join(", "))
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
    /// What ran on its CPU while it waited runnable (run queue or
    /// throttled), longest first.
    pub ran_instead: Vec<Instead>,
    /// The CPU quota that throttled it (read at the end; a thread gone by
    /// then has none).
    pub quota: Option<crate::engine::cgroup::Quota>,
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
            ran_instead: Vec::new(),
            quota: None,
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
                    if !w.released_by.is_empty() {
                        m.released_by.extend(w.released_by);
                        super::stacks::merge(&mut m.released_by);
                    }
                }
                None => merged.push(w),
            }
        }
        merged.sort_by_key(|w| std::cmp::Reverse(w.ns));
        self.waits = merged;
        merge_instead(&mut self.ran_instead);
    }

    /// The time of `ran_instead` (what the run queue's ring saw of its
    /// runnable time).
    pub fn instead_seen(&self) -> u64 {
        self.ran_instead.iter().map(|i| i.ns).sum()
    }
}

/// "heavy (app.py) 66%, light (app.py) 33%": the first `n` with 1% or more.
fn hottest_text(h: &[super::stacks::Hot], n: usize) -> String {
    h.iter()
        .filter(|x| x.share >= 0.01)
        .take(n)
        .map(|x| format!("{} {:.0}%", x.function, 100.0 * x.share))
        .collect::<Vec<_>>()
        .join(", ")
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
    /// The object, with the processes at its other end (" (other end:
    /// nginx (812))"; a pipe's "(write end held by ...)"), `own` (the
    /// waiter's process) called "this process".
    pub fn described(&self, own: u32) -> String {
        if let Some(d) = &self.device {
            return format!("{} ({})", self.object, d.text());
        }
        if self.peers.is_empty() {
            return self.object.clone();
        }
        let mut names: Vec<String> = self
            .peers
            .iter()
            .take(3)
            .map(|p| if p.pid == own { "this process".to_string() } else { format!("{} ({})", p.comm, p.pid) })
            .collect();
        if self.peers.len() > 3 {
            names.push(format!("{} more", self.peers.len() - 3));
        }
        let whose = match self.far {
            Some(Far::Pipe { .. }) if self.op == Some("send") => "read end held by",
            Some(Far::Pipe { .. }) => "write end held by",
            _ => "other end:",
        };
        let queued = if self.peers.iter().any(|p| p.unaccepted) { ", which has not accepted it" } else { "" };
        format!("{} ({whose} {}{queued})", self.object, names.join(", "))
    }

    /// ", woken by ..." for the text report ("" when nothing woke it).
    pub fn waker_text(&self) -> String {
        match self.woken_by {
            "thread" => {
                // Where the one that ended the most of its time released it.
                let at = self
                    .released_by
                    .iter()
                    .find(|r| r.tid == self.waker_tid && r.at.is_some())
                    .and_then(|r| r.at.as_deref())
                    .map(|a| format!(" in {a}"))
                    .unwrap_or_default();
                format!(", woken by {} ({}){at}", self.waker_comm, self.waker_tid)
            }
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
    /// Per kernel stack: what it says of a wait.
    stacks: HashMap<u64, StackInfo>,
    paths: HashMap<(u32, u32, u64), Option<String>>,
    cgroups: HashMap<u64, String>,
    /// TCP retransmissions so far, by flow (None: not counted).
    retrans: Option<FlowRetransmits>,
    /// The packets dropped so far, by flow (None: not counted).
    drops: Option<FlowDrops>,
    /// The kernel's names of drop reasons (loaded with the first drops).
    reasons: Option<crate::tools::drops::reasons::Reasons>,
    /// The processes at the other end of sockets and pipes.
    pub peers: super::peers::Peers,
    /// The block devices' requests in the window, by dev_t.
    disks: HashMap<u32, super::disks::Device>,
    /// The traced threads' own requests, by (thread, dev_t), and whether
    /// for the whole run.
    own_disks: Option<(super::disks::OwnCounts, bool)>,
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

/// What a wait for memory was for: its JSON name and its words.
type MemoryKind = (&'static str, &'static str);

/// What a kernel stack says of a wait.
#[derive(Debug, Clone)]
struct StackInfo {
    /// The function it waits in (the first not of the scheduler's; a
    /// lock's where one is on the stack).
    name: String,
    /// In a kernel lock.
    lock: bool,
    /// What for, if a wait for memory (see [`memory_kind`]).
    memory: Option<MemoryKind>,
    /// In an I/O wait (io_schedule).
    io: bool,
}

/// What a wait for memory waits for, from the functions of its kernel stack
/// (innermost first): its JSON name and its words. A migration entry's
/// wait comes first, then reclaim and compaction, before swap-in and a
/// fault's read: a fault may have to reclaim first.
fn memory_kind(frames: &[&str]) -> Option<MemoryKind> {
    type Kind = (&'static [&'static str], &'static str, &'static str);
    const KINDS: &[Kind] = &[
        (
            &["migration_entry_wait", "migration_entry_wait_huge", "__migration_entry_wait"],
            "migration",
            "page migration",
        ),
        (
            &["compact_zone", "compact_zone_order", "try_to_compact_pages", "__alloc_pages_direct_compact"],
            "compaction",
            "compaction",
        ),
        (
            &["try_to_free_mem_cgroup_pages", "mem_cgroup_handle_over_high", "try_charge_memcg"],
            "cgroup_reclaim",
            "reclaim for its memory cgroup's limit",
        ),
        (
            &[
                "try_to_free_pages",
                "__alloc_pages_direct_reclaim",
                "__perform_reclaim",
                "throttle_direct_reclaim",
                "reclaim_throttle",
                "shrink_node",
            ],
            "reclaim",
            "reclaim",
        ),
        (
            &["do_swap_page", "swap_read_folio", "swap_readpage", "swapin_readahead", "swap_cluster_readahead"],
            "swap_in",
            "swap-in",
        ),
        (
            &["filemap_fault", "do_read_fault", "do_shared_fault", "do_cow_fault", "filemap_read_folio"],
            "file_fault",
            "a page fault reading a file",
        ),
        (
            &["handle_mm_fault", "do_user_addr_fault", "do_page_fault", "exc_page_fault", "do_mem_abort"],
            "fault",
            "a page fault",
        ),
    ];
    // A compiler's copy of a function keeps its name before the dot.
    let base = |f: &str| f.split('.').next().unwrap_or(f).to_string();
    let names: Vec<String> = frames.iter().map(|f| base(f)).collect();
    KINDS.iter().find(|(marks, ..)| names.iter().any(|n| marks.contains(&n.as_str()))).map(|(_, k, w)| (*k, *w))
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
    /// Finds the paths of CPU cgroups (kernfs ids) not yet named, in one walk
    /// of the cpu controller's hierarchy.
    pub fn add_cgroups(&mut self, ids: impl Iterator<Item = u64>) {
        let want: std::collections::HashSet<u64> = ids.filter(|i| *i != 0 && !self.cgroups.contains_key(i)).collect();
        if want.is_empty() {
            return;
        }
        let found =
            crate::engine::cgroup::cpu_root().map(|r| crate::engine::cgroup::paths_of(&r, &want)).unwrap_or_default();
        for id in want {
            // One gone since (or beyond the walk's bounds) keeps its id.
            let p = found.get(&id).cloned().unwrap_or_else(|| format!("cgroup id {id}"));
            self.cgroups.insert(id, p);
        }
    }

    /// The block requests of the window (None: not counted); `whole_run`:
    /// the run's report, not an interval's.
    /// The traced threads' own block requests (None: not counted).
    pub fn set_own_disks(&mut self, c: Option<super::disks::OwnCounts>, whole_run: bool) {
        self.own_disks = c.map(|c| (c, whole_run));
    }

    /// Each disk wait's device with the waiting thread's own requests on it.
    pub fn add_own_disks(&self, threads: &mut HashMap<u32, Thread>) {
        let Some((own, whole_run)) = &self.own_disks else { return };
        for t in threads.values_mut() {
            for d in t.waits.iter_mut().filter_map(|w| w.device.as_mut()) {
                let raw = own.get(&(t.tid, d.dev_t)).copied().unwrap_or_default();
                d.own = Some(super::disks::Own::of(&raw, *whole_run));
            }
        }
    }

    pub fn set_disks(&mut self, c: Option<super::disks::Counts>, whole_run: bool) {
        self.disks = c
            .iter()
            .flatten()
            .filter_map(|(dev, r)| Some((*dev, super::disks::Device::of(*dev, r, whole_run)?)))
            .collect();
    }

    /// The TCP retransmissions so far, by flow (None: not counted).
    pub fn set_retransmits(&mut self, r: Option<FlowRetransmits>) {
        self.retrans = r;
    }

    /// The packets dropped so far, by flow, and the kernel's names of the
    /// reasons (None: not counted).
    pub fn set_drops(&mut self, d: Option<FlowDrops>) {
        if d.is_some() && self.reasons.is_none() {
            self.reasons = Some(crate::tools::drops::reasons::Reasons::load());
        }
        self.drops = d;
    }

    /// The drops on a socket's connection: packets it sent (the flow as it
    /// sees it) and packets sent to it (the flow reversed); see [`on_flow`]
    /// for which network namespaces count.
    fn drops_of(&self, o: &super::skel::types::why_obj) -> Option<Drops> {
        let map = self.drops.as_ref()?;
        let names = self.reasons.as_ref()?;
        let (l, r) = (ip_of(o.family, &o.saddr)?, ip_of(o.family, &o.daddr)?);
        let mut out = Drops::default();
        on_flow(map, (l, o.sport, r, o.dport), o.netns, |rs, _| {
            for (reason, n) in rs {
                out.total += n;
                *out.by_reason.entry(names.name(*reason)).or_default() += n;
            }
        });
        Some(out)
    }

    /// The retransmissions of a TCP socket's connection: its own (the flow
    /// as it sees it) and its peer's (the flow reversed); see [`on_flow`]
    /// for which network namespaces count.
    fn retransmits_of(&self, o: &super::skel::types::why_obj) -> Option<Retransmits> {
        let map = self.retrans.as_ref()?;
        let (l, r) = (ip_of(o.family, &o.saddr)?, ip_of(o.family, &o.daddr)?);
        let mut out = Retransmits::default();
        on_flow(map, (l, o.sport, r, o.dport), o.netns, |c, peer| out.add(c, peer));
        Some(out)
    }

    /// A CPU cgroup's path ("" when its id is unknown, 0).
    pub fn cgroup(&self, id: u64) -> String {
        self.cgroups.get(&id).cloned().unwrap_or_default()
    }

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
            let io = plain.iter().any(|f| f.starts_with("io_schedule"));
            self.stacks.insert(*id, StackInfo { name, lock, memory: memory_kind(&plain), io });
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
            kernel_function: kfn.as_ref().map(|k| k.name.clone()),
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
            retransmits: None,
            drops: None,
            memory: None,
            device: None,
            peers: Vec::new(),
            released_by: Vec::new(),
            far: None,
            obj,
            kstack,
            counted_as: class,
        };
        if let Some(k) = kfn.as_ref().filter(|k| k.lock) {
            // Uninterruptible in a kernel lock: a lock, whatever the call.
            w.class = Class::Lock;
            w.object = format!("a kernel lock ({})", k.name);
            return w;
        }
        if class == Class::Other && matches!(syscall.as_deref(), Some("wait4" | "waitid")) {
            // A parent waiting for its children to exit (a shell, a
            // supervisor): their time is theirs, its own is idle.
            w.class = Class::Poll;
            w.object = format!("{} for its child processes", syscall.as_deref().unwrap_or("wait4"));
            return w;
        }
        if let Some(k) = kfn.as_ref().filter(|k| class == Class::Memory && k.memory.is_none() && k.io) {
            // Blocked outside a system call on I/O, with no fault on its
            // stack (work at a system call's exit): disk.
            w.class = Class::Disk;
            w.object = format!("{} in {}", syscall.clone().unwrap_or_else(|| "I/O".into()), k.name);
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
                w.object = match kfn {
                    Some(StackInfo { name, memory: Some((key, words)), .. }) => {
                        w.memory = Some(key);
                        format!("{words} ({name})")
                    }
                    Some(k) => format!("page fault or reclaim ({})", k.name),
                    None => "page fault or reclaim".into(),
                }
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
                    let proto = match (o.family, o.proto) {
                        (1, _) => "unix socket",
                        (_, 6) => "tcp",
                        (_, 17) => "udp",
                        _ => "socket",
                    };
                    if o.family == 2 || o.family == 10 {
                        use crate::engine::flowfilter::endpoint;
                        let (l, r) = (endpoint(o.family, &o.saddr, o.sport), endpoint(o.family, &o.daddr, o.dport));
                        w.object = if class == Class::Poll {
                            format!("{proto} {l} (accepting connections)")
                        } else {
                            format!("{op} {proto} {l} {} {r}", if op == "receive" { "<-" } else { "->" })
                        };
                        w.local = Some(l);
                        if o.dport != 0 {
                            w.remote = Some(r);
                            w.far = Far::of(o);
                            if o.proto == 6 {
                                w.retransmits = self.retransmits_of(o);
                            }
                            w.drops = self.drops_of(o);
                        }
                    } else {
                        w.object = format!("{op} {proto} ({})", path.unwrap_or_else(|| format!("inode {}", o.ino)));
                        w.far = Far::of(o);
                    }
                    w.op = Some(op);
                }
                2 => {
                    w.object = if super::peers::on_pipefs(o.dev) {
                        format!("{op} pipe:[{}]", o.ino)
                    } else {
                        let dev = super::disks::dev_text(o.dev);
                        format!("{op} FIFO {}", path.unwrap_or_else(|| format!("on device {dev}, inode {}", o.ino)))
                    };
                    w.op = Some(op);
                    w.far = Far::of(o);
                }
                _ => {
                    let dev = super::disks::dev_text(o.dev);
                    w.object = path.unwrap_or_else(|| format!("file on device {dev}, inode {}", o.ino));
                    if class == Class::Disk {
                        // A block device file's requests are on that device.
                        let dev = if o.rdev != 0 { u64::from(o.rdev) } else { o.dev };
                        w.device = u32::try_from(dev).ok().and_then(|d| self.disks.get(&d)).cloned();
                    }
                }
            }
            // epoll_wait, poll or select on this one socket or pipe: a wait
            // on that peer, not for work (the kernel half tells them apart).
            if let Some(s) = syscall
                .as_deref()
                .filter(|s| s.starts_with("epoll") || matches!(*s, "poll" | "ppoll" | "select" | "pselect6"))
            {
                if class != Class::Poll {
                    w.object = format!("{} ({s} on it alone)", w.object);
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
                for i in &mut d.ran_instead {
                    if let Some(bi) =
                        b.ran_instead.iter().find(|x| x.tid == i.tid && x.pid == i.pid && x.cgroup == i.cgroup)
                    {
                        i.ns = i.ns.saturating_sub(bi.ns);
                    }
                }
                d.ran_instead.retain(|i| i.ns > 0);
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
    /// Events of threads not traced (each event counts): no room for their
    /// records.
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
    /// Threads that ran instead of a waiting one not kept: the map was full.
    pub instead_full: u64,
    /// TCP retransmissions not counted: the flow map was full.
    pub retransmits_full: u64,
    /// TCP retransmissions the kernel did not run the counting program for
    /// (it was already running on that CPU).
    pub retransmits_missed: u64,
    /// Why retransmissions were not counted at all (None: they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retransmits_not_counted: Option<String>,
    /// Why slow-start restarts after idle were not counted (None: they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarts_not_counted: Option<String>,
    /// Block requests not counted: the device map was full.
    pub disks_full: u64,
    /// Block requests completed that the kernel did not run the counting
    /// program for (it was already running on that CPU: a completion in an
    /// interrupt of another's).
    pub disk_completions_missed: u64,
    /// Events of every kind the kernel did not run sonde's program for, for
    /// that reason (those of the switches and wake-ups are placed by the
    /// threads' own statistics).
    pub events_missed: u64,
    /// Why the block devices' latency was not measured (None: it was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disks_not_counted: Option<String>,
    /// Why the threads' own block requests were not counted (None: they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_disks_not_counted: Option<String>,
    /// Packet drops not counted: the drop map was full.
    pub drops_full: u64,
    /// A thread's own block requests not counted: their map was full.
    pub own_disks_full: u64,
    /// Waits whose state the kernel had already changed to waking when it
    /// was read (at the switch-out on kernels before 5.18, which pass no
    /// prev_state, or at the start): a user thread's taken as
    /// uninterruptible, a kernel thread's as such only on I/O.
    pub states_woken: u64,
    /// Events of threads passed over while another CPU made the thread's
    /// record (its first event and another hook's at once).
    pub records_busy: u64,
    /// Events of threads not traced because their id was an exited
    /// thread's, whose record holds it.
    pub tid_reused: u64,
    /// Why packet drops were not counted at all (None: they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drops_not_counted: Option<String>,
    /// Lock releases not kept: the releaser map was full.
    pub releasers_full: u64,
    /// Lock releases counted without their stacks: more than 100 a second
    /// on a CPU (each walk costs 2-32 us).
    pub releases_not_walked: u64,
    /// Releasers' and samples' stacks not captured (a stack map's bucket
    /// taken by another stack, or another error).
    pub stack_errors: u64,
    /// On-CPU samples of traced threads (for the hottest functions).
    pub samples: u64,
    /// Samples not counted: the sample map was full.
    pub samples_full: u64,
    /// Why no samples were taken (None: they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples_not_taken: Option<String>,
    /// Releases taken with their stacks, and of those how many stacks were
    /// cut short (the final report only).
    pub releases_taken: u64,
    /// See `releases_taken`.
    pub release_stacks_truncated: u64,
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
    /// Its hottest functions on CPU (the run's final report only).
    pub hottest: Vec<super::stacks::Hot>,
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
        s.ran_instead.extend(t.ran_instead.iter().cloned());
        if s.quota.is_none() && t.throttled_ns > 0 {
            s.quota = t.quota.clone();
        }
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

/// What `of` counts on the connections `t` waited on (each connection
/// counted once, whatever its waits), summed by `add`, and how many
/// connections: None when none was counted.
fn per_connection<'a, T: Default + 'a>(
    t: &'a Thread,
    of: impl Fn(&'a Wait) -> Option<&'a T>,
    add: impl Fn(&mut T, &T),
) -> Option<(usize, T)> {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    let mut sum = T::default();
    for w in t.waits.iter().filter(|w| w.class == Class::Network) {
        let (Some(x), Some(l), Some(rem)) = (of(w), &w.local, &w.remote) else { continue };
        if seen.contains(&(l.as_str(), rem.as_str())) {
            continue;
        }
        seen.push((l, rem));
        add(&mut sum, x);
    }
    (!seen.is_empty()).then_some((seen.len(), sum))
}

/// The retransmissions on the TCP connections `t` waited on.
fn connections_retransmits(t: &Thread) -> Option<(usize, Retransmits)> {
    per_connection(t, |w| w.retransmits.as_ref(), Retransmits::plus)
}

/// The packets dropped on the connections `t` waited on.
fn connections_drops(t: &Thread) -> Option<(usize, Drops)> {
    per_connection(t, |w| w.drops.as_ref(), Drops::plus)
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
    let of_group = |g: &Group| match what {
        "on_cpu" => g.sum.on_cpu_ns,
        "runqueue" => g.sum.runqueue_ns,
        "throttled" => g.sum.throttled_ns,
        _ => Class::ALL.iter().find(|c| c.name() == what).map(|c| g.sum.blocked_ns[*c as usize]).unwrap_or(0),
    };
    // Named after the group (or thread) that spent the most of it, a share
    // is of that group's own time, with the process's beside it.
    let group = p.groups.iter().max_by_key(|g| of_group(g)).filter(|_| p.groups.len() > 1);
    let who = match group {
        Some(g) if per_thread => g.comm.clone(),
        Some(g) => format!("{} ({} thread{})", g.comm, g.threads, if g.threads == 1 { "" } else { "s" }),
        None => format!("{} ({})", p.comm, p.pid),
    };
    let (share, of_its_time) = match group {
        Some(g) => (
            format!("{:.0}% of its time ({share:.0}% of the process's)", pct(of_group(g), g.sum.window_ns)),
            String::new(),
        ),
        None => (format!("{share:.0}%"), " of its time".to_string()),
    };
    let hottest_of = if group.is_some() { "the process's hottest" } else { "hottest" };
    let pid = p.pid;
    let obj = wait.map(|w| w.described(pid)).unwrap_or_default();
    let waker = wait.map(Wait::waker_text).unwrap_or_default();
    match what {
        "on_cpu" => (
            match hottest_text(&p.hottest, 2) {
                h if h.is_empty() => format!("{who} spent {share}{of_its_time} on CPU: it is busy, not waiting"),
                h => format!("{who} spent {share}{of_its_time} on CPU: it is busy, not waiting; {hottest_of}: {h}"),
            },
            Some(format!("sonde profile -p {pid}")),
        ),
        "runqueue" => {
            let top = instead_by_process(&s.ran_instead);
            let inst = instead_text(s, 3);
            (
                if inst.is_empty() {
                    format!("{who} spent {share} runnable but waiting for a CPU: more runnable threads than CPUs")
                } else {
                    format!("{who} spent {share} runnable but waiting for a CPU: more runnable threads than CPUs; {inst} of that time")
                },
                Some(match top.first() {
                    Some((rp, ..)) if *rp != pid && *rp != 0 => format!("sonde profile -p {rp}"),
                    _ => "sonde profile -d 10s".into(),
                }),
            )
        }
        "throttled" => (
            match &s.quota {
                Some(q) => format!(
                    "{who} spent {share} runnable but throttled by the CPU quota of {} ({:.2} CPU: {}): raise it or use less CPU",
                    q.path, q.cpus, q.files
                ),
                None => format!("{who} spent {share} runnable but throttled by its cgroup's CPU quota: raise the quota (cpu.max, or cpu.cfs_quota_us) or use less CPU"),
            },
            Some(format!("sonde profile -p {pid}")),
        ),
        "network" => {
            let port = wait.and_then(|w| w.remote.as_deref()).and_then(|r| r.rsplit(':').next()).unwrap_or("");
            let conns = connections_retransmits(s);
            let drop_conns = connections_drops(s).filter(|(_, d)| d.total > 0);
            let dropped = drop_conns.as_ref().map(|(_, d)| d.clone());
            let restarted = conns.map_or(0, |(_, r)| r.slow_start_restarts);
            let lost = [
                conns
                    .map(|(_, r)| r.text())
                    .filter(|_| conns.is_some_and(|(_, r)| r.total > 0) || restarted > 0 || dropped.is_none()),
                dropped.as_ref().map(Drops::text),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>();
            let n = conns.map(|(n, _)| n).max(drop_conns.as_ref().map(|(n, _)| *n)).unwrap_or(1);
            let loss = if lost.is_empty() {
                String::new()
            } else {
                format!(
                    "; on {} in the window: {}",
                    if n == 1 { "its connection".to_string() } else { format!("its {n} connections") },
                    lost.join(", ")
                )
            };
            let retransmitted = conns.is_some_and(|(_, r)| r.total > 0);
            // Drops that may have cost the wait (not a queue purged at a
            // close, not data already received).
            let costly = dropped.as_ref().is_some_and(|d| d.costly() > 0);
            // The other end on this host, and nothing lost on the way: the
            // wait is that process's time, which `why` of it tells.
            let local = wait
                .and_then(|w| w.peers.iter().find(|x| x.pid != pid))
                .filter(|_| !retransmitted && !costly && restarted == 0);
            (
                format!("{who} spent {share} blocked on the network: {obj}{waker}{loss}"),
                Some(match local {
                    Some(x) => format!("sonde why -p {}", x.pid),
                    // Nothing resent, but slow start began again after idle
                    // (RFC 5681 4.1): each such send and its window (a
                    // packet dropped without a retransmission cost the
                    // wait less).
                    None if restarted > 0 && !retransmitted && !port.is_empty() && port != "0" => {
                        format!("sonde cwnd --port {port} --idle-only")
                    }
                    // Dropped but not retransmitted (UDP, or packets the
                    // kernel dropped that TCP did not have to resend): where
                    // and why they were dropped.
                    None if costly && !retransmitted && !port.is_empty() && port != "0" => {
                        format!("sonde drops --port {port}")
                    }
                    None if port.is_empty() || port == "0" => format!("sonde retrans -p {pid}"),
                    None => format!("sonde retrans --port {port}"),
                }),
            )
        }
        "lock" => (
            format!("{who} spent {share} blocked on a lock: {obj}{waker}"),
            Some(format!("sonde wakeup -p {pid}")),
        ),
        "disk" => (
            format!("{who} spent {share} blocked on disk: {obj}"),
            Some(format!("sonde offcpu -p {pid} --state uninterruptible")),
        ),
        "memory" => (
            format!("{who} spent {share} waiting for memory: {obj}"),
            Some(format!("sonde offcpu -p {pid} --state uninterruptible")),
        ),
        "pipe" => {
            let peers = wait.map(|w| w.peers.as_slice()).unwrap_or_default();
            let other = peers.iter().find(|x| x.pid != pid);
            // Only its own process holds the other end: nobody else will
            // ever write (or read) it.
            let itself = if !peers.is_empty() && other.is_none() {
                let end = if wait.is_some_and(|w| w.op == Some("send")) { "read" } else { "write" };
                format!("; only this process holds its {end} end: it waits on itself")
            } else {
                String::new()
            };
            (
                format!("{who} spent {share} blocked on a pipe or local socket: {obj}{waker}{itself}"),
                Some(match other {
                    Some(x) => format!("sonde why -p {}", x.pid),
                    None => format!("sonde wakeup -p {pid}"),
                }),
            )
        }
        "sleep" => (format!("{who} spent {share} sleeping by its own choice ({obj})"), Some(format!("sonde offcpu -p {pid}"))),
        "poll" => (format!("{who} spent {share} waiting for work ({obj}): idle, not slow"), None),
        "io_uring" => (format!("{who} spent {share} waiting for io_uring completions"), Some(format!("sonde offcpu -p {pid}"))),
        _ => (format!("{who} spent {share} blocked in the kernel: {obj}"), Some(format!("sonde offcpu -p {pid}"))),
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
        hot: Option<&super::stacks::Hottest>,
    ) -> Report {
        let host = tf.pids.is_empty() && tf.tids.is_empty() && tf.cgroup.is_none() && tf.comm.is_none();
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
                let hottest = hot.and_then(|h| h.get(&pid)).cloned().unwrap_or_default();
                let mut p =
                    Process { pid, comm, sum: total, groups, threads: ts, verdict: String::new(), next: None, hottest };
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
        if self.processes.is_empty() && !self.host {
            out += "\nno thread matched the filters (-p, --tid, --comm and --cgroup must all match): check them with `ps -eLo pid,tid,comm`\n";
        }
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
            let mut split = s
                .user_share
                .map(|u| format!("  (user {:.0}%, system {:.0}%)", 100.0 * u, 100.0 * (1.0 - u)))
                .unwrap_or_default();
            let hot = hottest_text(&p.hottest, 3);
            if !hot.is_empty() {
                split += &format!("  hottest: {hot}");
            }
            let mut rows = vec![("on CPU".to_string(), s.on_cpu_ns, split)];
            let inst = instead_text(s, 3);
            rows.push((
                "run queue".into(),
                s.runqueue_ns,
                if inst.is_empty() || s.throttled_ns > s.runqueue_ns { String::new() } else { format!("  {inst}") },
            ));
            rows.push((
                "throttled".into(),
                s.throttled_ns,
                if inst.is_empty() || s.throttled_ns <= s.runqueue_ns { String::new() } else { format!("  {inst}") },
            ));
            for c in Class::ALL {
                let v = s.blocked_ns[c as usize];
                if v == 0 {
                    continue;
                }
                let mut told: Vec<&str> = Vec::new();
                let top_waits: Vec<String> = s
                    .waits
                    .iter()
                    .filter(|w| w.class == c)
                    .take(2)
                    .map(|w| {
                        let loss = [
                            w.retransmits.filter(|r| r.total > 0 || r.slow_start_restarts > 0).map(|r| r.text()),
                            w.drops.as_ref().filter(|d| d.total > 0).map(Drops::text),
                        ]
                        .into_iter()
                        .flatten()
                        .map(|t| format!(", {t}"))
                        .reduce(|a, b| a + &b);
                        // An object's other end or device, once per line.
                        let what = if told.contains(&w.object.as_str()) {
                            w.object.clone()
                        } else {
                            told.push(&w.object);
                            w.described(p.pid)
                        };
                        format!("{what} {}{}{}", secs(w.ns), w.waker_text(), loss.unwrap_or_default())
                    })
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
        // The kernel half's counts are the run's so far, in an interval's
        // report too.
        out += if self.last { "\n" } else { "\nsince the start: " };
        out += &format!(
            "{} context switches, {} wake-ups of traced threads seen; lost: {} events of threads not traced (no room for their records), {} waits by object (wait map full), {} objects waited on (object map full), {} kernel stacks (stack map full; {} not captured), {} threads' registers unread{}{}",
            l.switches,
            l.wakeups,
            l.threads_full,
            l.waits_full,
            l.objects_full,
            l.kstacks_full,
            l.kstack_errors,
            l.regs_unread,
            [
                (l.instead_full, "threads that ran instead (map full)"),
                (l.retransmits_full, "TCP retransmissions (flow map full)"),
                (l.retransmits_missed, "TCP retransmissions (the kernel skipped the program)"),
                (l.disk_completions_missed, "block request completions (the kernel skipped the program)"),
                (l.events_missed, "events in all (the kernel skipped the program)"),
                (l.releasers_full, "lock releases (releaser map full)"),
                (l.stack_errors, "stacks (not captured)"),
                (l.samples_full, "on-CPU samples (sample map full)"),
                (l.drops_full, "packet drops (drop map full)"),
                (l.own_disks_full, "threads' own block requests (map full)"),
                (l.states_woken, "waits' states (overwritten by their wake-up: taken as uninterruptible)"),
                (l.records_busy, "events of threads whose record another CPU was making"),
                (l.tid_reused, "events of threads not traced (their thread id was an exited thread's in this run)"),
                (l.releases_not_walked, "lock releasers' stacks (over 100 walks a second on a CPU)"),
                (l.release_stacks_truncated, "lock releasers' stacks cut short"),
            ]
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!(", {n} {what}"))
            .chain(l.retransmits_not_counted.iter().map(|w| format!("; TCP retransmissions not counted: {w}")))
            .chain(l.disks_not_counted.iter().map(|w| format!("; block devices' latency not measured: {w}")))
            .chain(l.own_disks_not_counted.iter().map(|w| format!("; threads' own block requests not counted: {w}")))
            .chain(l.samples_not_taken.iter().map(|w| format!("; hottest functions not sampled: {w}")))
            .chain(l.drops_not_counted.iter().map(|w| format!("; packet drops not counted: {w}")))
            .chain(l.restarts_not_counted.iter().map(|w| format!("; slow-start restarts not counted: {w}")))
            .collect::<String>(),
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
            "ran_instead": t.ran_instead.iter().take(10).collect::<Vec<_>>(),
        });
        if let Some(q) = &t.quota {
            v["quota"] = json!({"cgroup": q.path, "cpus": q.cpus, "files": q.files});
        }
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
            if !p.hottest.is_empty() {
                v["hottest"] = json!(p.hottest);
            }
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
    fn slow_start_restarts_are_told_with_or_without_retransmissions() {
        let mut r = Retransmits::default();
        let end = FlowCounts { restarts: 3, ..Default::default() };
        r.add(&end, false);
        r.add(&FlowCounts { restarts: 1, ..Default::default() }, true);
        assert_eq!(r.text(), "no TCP retransmissions; 4 slow-start restarts after idle (RFC 5681 4.1)");
        let mut rto = FlowCounts { restarts: 0, ..Default::default() };
        rto.count[0] = 2;
        rto.segs[0] = 2;
        r.add(&rto, false);
        assert!(r.text().starts_with("2 TCP retransmissions ("), "{}", r.text());
        assert!(r.text().ends_with("; 4 slow-start restarts after idle (RFC 5681 4.1)"), "{}", r.text());
        let mut sum = Retransmits::default();
        sum.plus(&r);
        assert_eq!(sum.slow_start_restarts, 4);
        let mut before: FlowRetransmits = HashMap::new();
        let k = (std::net::IpAddr::from([127, 0, 0, 1]), 1, std::net::IpAddr::from([127, 0, 0, 1]), 2, 0);
        before.insert(k, end);
        let now: FlowRetransmits = [(k, FlowCounts { restarts: 5, ..end })].into_iter().collect();
        assert_eq!(flows_since(&now, Some(&before))[&k].restarts, 2);
    }

    #[test]
    fn drops_at_a_close_or_of_old_data_cost_a_wait_nothing() {
        let d = |r: &[(&str, u64)]| Drops {
            total: r.iter().map(|x| x.1).sum(),
            by_reason: r.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        };
        assert_eq!(d(&[("QUEUE_PURGE", 2), ("TCP_OLD_DATA", 1)]).costly(), 0);
        assert_eq!(d(&[("QUEUE_PURGE", 2), ("NETFILTER_DROP", 3)]).costly(), 3);
        // A kernel that names no reason (before 5.17): it may have cost.
        assert_eq!(d(&[("UNKNOWN", 4)]).costly(), 4);
    }

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
    fn a_wait_for_memory_is_told_by_its_stack() {
        let k = |f: &[&str]| memory_kind(f).map(|m| m.0);
        // A fault's read, as this kernel's stack of the test's faulter shows it.
        assert_eq!(
            k(&[
                "__schedule",
                "io_schedule",
                "folio_wait_bit_common",
                "filemap_fault",
                "__do_fault",
                "do_read_fault",
                "handle_mm_fault",
                "do_user_addr_fault",
                "exc_page_fault"
            ]),
            Some("file_fault")
        );
        // Reclaim inside a fault: reclaim.
        assert_eq!(
            k(&[
                "shrink_node.isra.0",
                "do_try_to_free_pages",
                "try_to_free_pages",
                "__alloc_pages_slowpath",
                "handle_mm_fault"
            ]),
            Some("reclaim")
        );
        assert_eq!(k(&["try_to_free_mem_cgroup_pages", "try_charge_memcg", "filemap_fault"]), Some("cgroup_reclaim"));
        assert_eq!(k(&["swap_read_folio", "do_swap_page", "handle_mm_fault"]), Some("swap_in"));
        // Reclaim while swapping in: reclaim; a migration entry met in a
        // swap-in fault: migration.
        assert_eq!(k(&["shrink_node", "try_to_free_pages", "do_swap_page"]), Some("reclaim"));
        assert_eq!(k(&["migration_entry_wait", "do_swap_page", "handle_mm_fault"]), Some("migration"));
        assert_eq!(k(&["compact_zone", "__alloc_pages_direct_compact", "do_anonymous_page"]), Some("compaction"));
        assert_eq!(k(&["do_anonymous_page", "handle_mm_fault"]), Some("fault"));
        assert_eq!(k(&["pipe_read", "vfs_read"]), None);
    }

    #[test]
    fn a_lock_wait_names_where_its_releaser_let_go() {
        let mut n = Namer::default();
        let mut w = n.wait(2, 0x1000, 0, 0, 7, 1, "holder".into(), 30, 1, false, &HashMap::new());
        assert_eq!(w.waker_text(), ", woken by holder (7)");
        let r = |tid, at: Option<&str>| super::super::stacks::Releaser {
            tid,
            pid: 1,
            comm: "holder".into(),
            ns: 30,
            samples: 1,
            stack: vec![],
            at: at.map(str::to_string),
        };
        // Another thread's release (merged waits): not said of this waker.
        w.released_by = vec![r(8, Some("other"))];
        assert_eq!(w.waker_text(), ", woken by holder (7)");
        w.released_by = vec![r(7, Some("Condition.notify (threading.py:382)"))];
        assert_eq!(w.waker_text(), ", woken by holder (7) in Condition.notify (threading.py:382)");
    }

    #[test]
    fn a_verdict_named_after_one_group_gives_that_groups_share_and_the_processes() {
        // Thread "a" waits 70 of its 100 for a CPU; "b" sleeps 90 of its
        // 100: the process lost 70 of 200, all of it a's.
        let me = std::process::id();
        let a = Thread::new(me, 9, "a".into(), 100, [30, 70, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let b = Thread::new(me, 10, "b".into(), 100, [10, 0, 0, 0, 0, 0, 90, 0, 0, 0, 0, 0]);
        let tf = crate::engine::taskfilter::TaskFilter::new(&[me], &[], None, None).unwrap();
        let threads = HashMap::from([(9, a.clone()), (10, b)]);
        let r = Report::build(threads, 100, false, &tf, Losses::default(), true, None);
        let v = &r.processes[0].verdict;
        assert!(v.starts_with("a (1 thread) spent 70% of its time (35% of the process's) runnable"), "{v}");
        // One thread alone: its share, said once.
        let r = Report::build(HashMap::from([(9, a)]), 100, false, &tf, Losses::default(), true, None);
        let v = &r.processes[0].verdict;
        assert!(v.contains(") spent 70% runnable"), "{v}");
    }

    #[test]
    fn a_thread_sums_to_its_window() {
        let t = Thread::new(1, 1, "x".into(), 90, [10, 5, 5, 10, 10, 10, 10, 10, 10, 10, 0, 0]);
        assert_eq!(t.accounted(), 90);
        // Run queue, throttled, and disk, network, lock, pipe, memory, other.
        assert_eq!(t.lost(), 5 + 5 + 10 + 10 + 10 + 10 + 10);
    }
}
