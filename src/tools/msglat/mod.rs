//! `sonde msglat`: per-message latency through an unmodified process (seed
//! 004's T2): from a message's receive to its send, paired and counted in
//! the kernel.
use std::{
    cell::RefCell,
    collections::BTreeMap,
    mem::MaybeUninit,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    Link, MapCore, MapFlags, OpenObject,
};
use serde::Serialize;

use crate::engine::{
    attach::run_stats,
    error::usage,
    features,
    hist::{human, read_percpu, Hist},
    output::{table, RunArgs, Sink},
    record,
    record::percpu_sum,
    ringbuf::{self, poll_until_stop, PerCpuRings},
    run::{RunControl, Stop},
    time::{epoch_secs, mono_to_epoch},
};

crate::skeleton!("msglat");
crate::pod!(types::ml_event, types::ml_waiting, types::ml_flow, types::ml_flow_key, types::ml_flow_slot);
use skel::{types, MsglatSkel, MsglatSkelBuilder};

const MSGLAT_MAX_PIDS: usize = 8;
const MAX_PORTS: usize = 8;
const MAX_FD: u32 = 65536;
const FLOW_WAYS: usize = 32;
// Counters, in the order of enum ml_stat in msglat.h.
const RECVS: usize = 0;
const UNMATCHED_SEND: usize = 1;
const SHORT_RECV: usize = 2;
const SHORT_SEND: usize = 3;
const ID_FAULT: usize = 4;
const SEND_ID_FAULT: usize = 5;
const REPLACED: usize = 6;
const FIFO_OVERFLOW: usize = 7;
const LOST: usize = 8;
const FLOW_FULL: usize = 9;
const FDS_FULL: usize = 10;
const NEW_FDS: usize = 11;
const OTHER_CALL: usize = 12;
const ENTRY_NOT_SEEN: usize = 13;
const STAT_MAX: usize = 14;
/// ml_event/ml_flow_key's descriptor for a send not made by a write or send call.
const NO_FD: u32 = u32::MAX;

/// Per-message latency through a broker, proxy or relay process.
///
/// For a process that receives messages on some sockets and sends them on
/// others: the time from each message's receive (its read/recv returns) to its send (its
/// write/send is entered), paired in the kernel by a message id in the
/// payload (--id OFFSET:LEN, default 0:8) or in FIFO order (--fifo), as a
/// histogram with p50/p90/p99/max and a per-flow breakdown.
///
/// Hooks (--hooks): by default the socket tracepoints where the kernel has
/// them (sock:sock_recv_length at the end of each receive,
/// tcp:tcp_sendmsg_locked at the start of each TCP send; nothing else on the
/// host runs a program), else the tracepoints of the message syscalls
/// (sends at entry of write, writev, sendto, sendmsg; receives at exit of
/// read, readv, recvfrom, recvmsg), or raw_syscalls sys_enter/sys_exit.
/// Only the process's sockets count. x86_64 syscall numbers.
///
/// OVERHEAD (bench/msglat/run, warm tight loops, 2-core VM): per message
/// through the traced process +222 ns with the default socket hooks (+418
/// syscalls, +304 raw); other processes: getppid and write +0 (syscalls
/// +17/+45), a loopback TCP write+read +64 ns (syscalls +348). Through
/// bench/broker's message broker that is about 286 ns per message (syscalls 766).
/// bench/broker/run (sender, broker, receiver; messages 60 us apart, so caches
/// are cold; the three processes on one CPU): +471..+507 ns end to end
/// (syscalls +686), of which +234..+263 is reaching four empty programs at
/// the same tracepoints (the sender's send, the broker's receive and send,
/// the receiver's receive); logging times into memory +60..+67, to a file
/// +518..+564.
#[derive(Debug, Args, Clone, Default)]
#[command(mut_arg("duration", |a| a.help("Stop after this long (e.g. 10s); default: until Ctrl-C or the process exits")))]
#[command(mut_arg("json", |a| a.help("One JSON object per line (messages with --per-message, then a summary)")))]
#[command(mut_arg("output", |a| a.help("Write to this file: .json (JSON lines; implies --json) or .txt")))]
pub struct MsglatArgs {
    /// The process to trace (repeatable, up to 8).
    #[arg(short = 'p', long = "pid", required = true)]
    pub pid: Vec<u32>,
    /// Pair receive and send by the message id at byte OFFSET, LEN bytes
    /// (1-8, read as a little-endian integer); the default is 0:8.
    #[arg(long, value_parser = id_arg, conflicts_with = "fifo")]
    pub id: Option<(u32, u32)>,
    /// Pair in FIFO order: each send takes the process's oldest receive not
    /// yet sent (for protocols without ids; one stream in, one out).
    #[arg(long)]
    pub fifo: bool,
    /// Only sockets with this local or remote port (repeatable, up to 8).
    #[arg(long, value_parser = crate::engine::flowfilter::port_arg)]
    pub port: Vec<u16>,
    /// Where to hook: `sockets` (the default where the kernel has the
    /// tracepoints sock:sock_recv_length and tcp:tcp_sendmsg_locked: only
    /// socket calls run a program; TCP sends), `syscalls` (the message
    /// syscalls' own tracepoints, each message syscall runs one program) or
    /// `raw` (raw_syscalls sys_enter/sys_exit as BTF tracepoints: every
    /// syscall on the host runs two, each returning after one compare unless
    /// it is the traced process's).
    #[arg(long, value_enum)]
    pub hooks: Option<Hooks>,
    /// Also one JSON record (or line) per message.
    #[arg(long)]
    pub per_message: bool,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
    /// The lab's bpf_stats run: also an empty program on a message
    /// tracepoint, to take the statistics' own cost out.
    #[arg(long, hide = true)]
    pub calibrate: bool,
    /// The lab's floor row: empty programs on the socket hooks'
    /// tracepoints in place of msglat's (what reaching a program costs).
    #[arg(long, hide = true)]
    pub floor: bool,
}

/// Which tracepoints msglat attaches to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Hooks {
    /// sock:sock_recv_length and tcp:tcp_sendmsg_locked (tp_btf).
    Sockets,
    /// syscalls:sys_enter_write, ..., syscalls:sys_exit_read, ...
    Syscalls,
    /// raw_syscalls:sys_enter and sys_exit (tp_btf).
    Raw,
}

/// Whether the kernel has the tracepoints of `--hooks sockets`.
pub fn socket_tracepoints_exist() -> bool {
    features::tracepoint_exists("sock", "sock_recv_length") && features::tracepoint_exists("tcp", "tcp_sendmsg_locked")
}

impl Hooks {
    /// The hooks to use: those asked for, else sockets where the kernel has
    /// their tracepoints, else syscalls.
    pub fn pick(asked: Option<Hooks>) -> anyhow::Result<Hooks> {
        let socket_tps = socket_tracepoints_exist();
        match asked {
            Some(Hooks::Sockets) if !socket_tps => Err(usage(
                "--hooks sockets: this kernel lacks the tracepoint sock:sock_recv_length or tcp:tcp_sendmsg_locked (6.16 has both); use --hooks syscalls",
            )),
            Some(h) => Ok(h),
            None if socket_tps => Ok(Hooks::Sockets),
            None => Ok(Hooks::Syscalls),
        }
    }
}

fn id_arg(s: &str) -> Result<(u32, u32), String> {
    let bad =
        || format!("--id '{s}': write OFFSET:LEN, e.g. 0:8 (an 8-byte id at the start of the payload); LEN is 1 to 8");
    let (o, l) = s.split_once(':').ok_or_else(bad)?;
    let (o, l) = (o.parse::<u32>().map_err(|_| bad())?, l.parse::<u32>().map_err(|_| bad())?);
    if !(1..=8).contains(&l) || o > 1 << 20 {
        return Err(bad());
    }
    Ok((o, l))
}

/// A socket of a traced process, from /proc/PID/fd.
#[derive(Debug, Clone)]
pub struct SockFd {
    /// Process.
    pub pid: u32,
    /// Descriptor.
    pub fd: u32,
    /// Local address:port, or "unix".
    pub local: String,
    /// Remote address:port.
    pub remote: String,
    /// Local port (0: not inet).
    pub lport: u16,
    /// Remote port.
    pub rport: u16,
    /// Inode number (socket:[N]): the kernel half's id of the socket with
    /// the syscall hooks.
    pub ino: u32,
    /// Cookie (SO_COOKIE; 0: unknown): its low half is the kernel half's id
    /// of the socket with the socket hooks.
    pub cookie: u64,
}

impl SockFd {
    /// The id under which the kernel half counts this socket's flows (see
    /// ml_flow_key in msglat.h).
    fn id(&self, hooks: Hooks) -> u32 {
        if hooks == Hooks::Sockets {
            self.cookie as u32
        } else {
            self.ino
        }
    }
}

fn sockaddr_str(ss: &libc::sockaddr_storage) -> Option<(String, u16)> {
    let sa: std::net::SocketAddr = match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            (std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)), u16::from_be(a.sin_port)).into()
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            (std::net::Ipv6Addr::from(a.sin6_addr.s6_addr), u16::from_be(a.sin6_port)).into()
        }
        _ => return None,
    };
    Some((sa.to_string(), sa.port()))
}

/// The ends of a process's socket `fd` and its cookie, from a duplicate
/// taken with pidfd_getfd (the socket itself is not touched).
fn sock_ends(pidfd: &OwnedFd, fd: u32) -> Option<(String, u16, String, u16, u64)> {
    // SAFETY: plain syscalls; the duplicate is owned and closed here.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as libc::c_int, 0) };
    if dup < 0 {
        return None;
    }
    // SAFETY: pidfd_getfd returned a new descriptor that nothing else owns.
    let dup = unsafe { OwnedFd::from_raw_fd(dup as i32) };
    let name = |peer: bool| {
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: ss and len are a buffer and its length, as both calls take them.
        let r = unsafe {
            if peer {
                libc::getpeername(dup.as_raw_fd(), &mut ss as *mut _ as *mut libc::sockaddr, &mut len)
            } else {
                libc::getsockname(dup.as_raw_fd(), &mut ss as *mut _ as *mut libc::sockaddr, &mut len)
            }
        };
        if r == 0 {
            sockaddr_str(&ss)
        } else {
            None
        }
    };
    let (l, lp) = name(false).unwrap_or_else(|| ("unix".into(), 0));
    let (r, rp) = name(true).unwrap_or_else(|| ("-".into(), 0));
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    let (opt, p) = (libc::SO_COOKIE, (&mut cookie as *mut u64).cast());
    // SAFETY: a u64 and its length, what SO_COOKIE writes.
    let got = unsafe { libc::getsockopt(dup.as_raw_fd(), libc::SOL_SOCKET, opt, p, &mut len) } == 0;
    Some((l, lp, r, rp, if got { cookie } else { 0 }))
}

fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Every socket `pid` holds now, with its ends.
pub fn sockets_of(pid: u32) -> Vec<SockFd> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let pfd = pidfd(pid);
    let mut out = Vec::new();
    for e in rd.flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(target) = std::fs::read_link(e.path()) else { continue };
        let Some((crate::engine::procfd::Kind::Socket, ino)) =
            target.to_str().and_then(crate::engine::procfd::parse_link)
        else {
            continue;
        };
        // (an inode past 32 bits is passed over, as before)
        let Ok(ino) = u32::try_from(ino) else { continue };
        let ends = pfd.as_ref().and_then(|p| sock_ends(p, fd));
        let (local, lport, remote, rport, cookie) = ends.unwrap_or_else(|| ("?".into(), 0, "?".into(), 0, 0));
        out.push(SockFd { pid, fd, local, remote, lport, rport, ino, cookie });
    }
    out.sort_by_key(|s| s.fd);
    out
}

struct Loaded {
    skel: MsglatSkel<'static>,
    _links: Vec<Link>,
    rings: Option<PerCpuRings>,
}

fn load(a: &MsglatArgs, hooks: Hooks, socks: &[SockFd]) -> anyhow::Result<Loaded> {
    let has_fetch = features::has_atomic_fetch();
    load_with(a, hooks, socks, has_fetch, !has_fetch, features::has_task_regs())
}

/// [`load`] with the choice made: `has_fetch` goes to `.rodata`, and
/// `poison` replaces the atomic fetch instructions (kernels before 5.12
/// reject them even where `has_fetch` false makes them dead).
/// `has_task_regs` false: receive arguments are kept from entry (the
/// ml_args_* programs) instead of read from the task's registers at exit.
fn load_with(
    a: &MsglatArgs,
    hooks: Hooks,
    socks: &[SockFd],
    has_fetch: bool,
    poison: bool,
    has_task_regs: bool,
) -> anyhow::Result<Loaded> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = MsglatSkelBuilder::default().open(storage).context("opening BPF object")?;
    let ncpus = PerCpuRings::size_outer(&mut open.maps.sonde_rings)?;
    let ring_bytes = ringbuf::ring_bytes_per_cpu(ncpus, None);
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    ro.n_pids = a.pid.len() as u32;
    for (i, p) in a.pid.iter().enumerate() {
        ro.pids[i] = *p;
    }
    ro.n_ports = a.port.len() as u32;
    for (i, p) in a.port.iter().enumerate() {
        ro.ports[i] = *p;
    }
    let (off, len) = a.id.unwrap_or((0, 8));
    ro.id_off = off;
    ro.id_len = len;
    ro.fifo = a.fifo;
    ro.has_fetch = has_fetch;
    ro.has_task_regs = has_task_regs;
    // The syscall numbers of the architecture this binary is built for.
    (ro.nr_read, ro.nr_write, ro.nr_close, ro.nr_readv, ro.nr_writev, ro.nr_connect) =
        (libc::SYS_read, libc::SYS_write, libc::SYS_close, libc::SYS_readv, libc::SYS_writev, libc::SYS_connect);
    (ro.nr_accept, ro.nr_accept4, ro.nr_sendto, ro.nr_recvfrom, ro.nr_sendmsg, ro.nr_recvmsg) = (
        libc::SYS_accept,
        libc::SYS_accept4,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_sendmsg,
        libc::SYS_recvmsg,
    );
    ro.per_message = a.per_message;
    ro.rb_wake_bytes = ringbuf::wake_bytes(ring_bytes as u64);
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let on = match name.as_str() {
            "ml_enter" | "ml_exit" => hooks == Hooks::Raw,
            "ml_sock_recv" | "ml_tcp_send" => hooks == Hooks::Sockets && !a.floor,
            "ml_null" => (a.calibrate || a.floor) && features::tracepoint_exists("sock", "sock_recv_length"),
            "ml_null_send" => a.floor && features::tracepoint_exists("tcp", "tcp_sendmsg_locked"),
            // ml_in_write, ml_out_read, ...: kernels without a syscall's
            // tracepoint (no accept4 on some arches) skip it. ml_args_read,
            // ...: only where exit cannot read the task's registers.
            _ => {
                hooks == Hooks::Syscalls
                    && name.split_once('_').map(|(_, r)| r).and_then(|r| r.split_once('_')).is_some_and(|(dir, sc)| {
                        (dir != "args" || !has_task_regs)
                            && features::tracepoint_exists(
                                "syscalls",
                                &format!("sys_{}_{sc}", if dir == "out" { "exit" } else { "enter" }),
                            )
                    })
            }
        };
        prog.set_autoload(on);
        if on && poison {
            features::poison_atomic_fetch(&mut prog)
                .with_context(|| format!("rewriting {name} for a kernel without atomic fetch"))?;
        }
    }
    let what = match hooks {
        Hooks::Sockets => "tp_btf sock:sock_recv_length and tcp:tcp_sendmsg_locked",
        Hooks::Syscalls => "syscalls:sys_enter_*/sys_exit_* tracepoints",
        Hooks::Raw => "tp_btf raw_syscalls:sys_enter/sys_exit",
    };
    let skel = open.load().with_context(|| format!("loading the msglat programs ({what})"))?;
    // The socket table serves the syscall hooks; the socket hooks decide
    // per socket in the kernel.
    if hooks != Hooks::Sockets {
        for s in socks {
            let slot = a.pid.iter().position(|p| *p == s.pid).unwrap_or(0) as u32;
            if s.fd >= MAX_FD {
                anyhow::bail!("pid {} fd {}: sockets past descriptor {MAX_FD} are not traced", s.pid, s.fd);
            }
            skel.maps
                .fds
                .update(&(slot * MAX_FD + s.fd).to_ne_bytes(), &s.ino.to_ne_bytes(), MapFlags::ANY)
                .context("filling the socket table")?;
        }
    }
    let rings = if a.per_message { Some(PerCpuRings::create(&skel.maps.sonde_rings, ring_bytes)?) } else { None };
    let mut links = Vec::new();
    for prog in skel.object().progs_mut() {
        if prog.autoload() {
            links.push(prog.attach().with_context(|| format!("attaching {}", prog.name().to_string_lossy()))?);
        }
    }
    Ok(Loaded { skel, _links: links, rings })
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// T2 of every paired message.
    pub hist: Hist,
    /// Receives never sent (still waiting at the end, replaced or dropped).
    pub unmatched_recv: u64,
    /// Sends with no receive waiting.
    pub unmatched_send: u64,
    /// The summary line as printed with --json.
    pub summary: Summary,
    /// In-kernel time of the programs and their runs (with
    /// kernel.bpf_stats_enabled=1; else zeros).
    pub bpf_ns: u64,
    /// See bpf_ns.
    pub bpf_runs: u64,
    /// With `calibrate`: an empty program's time and runs.
    pub null_ns: u64,
    /// See null_ns.
    pub null_runs: u64,
    /// Why it stopped.
    pub stop: Stop,
}

/// msglat's `{"type":"summary",...}` line (schema in the README); the text
/// summary is printed from it too.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Always "summary".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Messages paired.
    pub count: u64,
    /// Receives never sent.
    pub unmatched_recv: u64,
    /// Sends with no receive waiting.
    pub unmatched_send: u64,
    /// T2 quantiles, maximum and mean.
    pub p50_ns: u64,
    /// See p50_ns.
    pub p90_ns: u64,
    /// See p50_ns.
    pub p99_ns: u64,
    /// See p50_ns.
    pub max_ns: u64,
    /// See p50_ns.
    pub avg_ns: u64,
    /// The histogram's non-empty range of buckets.
    pub buckets: Vec<serde_json::Value>,
    /// Records lost with the ring full.
    pub lost: u64,
    /// "fifo" or "id OFFSET:LEN".
    pub pairing: String,
    /// The hooks used.
    pub hooks: Hooks,
    /// Receives recorded.
    pub received: u64,
    /// Sends seen.
    pub sends: u64,
    /// Receives still waiting at the end.
    pub waiting_at_end: u64,
    /// Receives replaced by a later one with their id (or table slot).
    pub replaced: u64,
    /// Receives dropped from a full FIFO.
    pub fifo_overflow: u64,
    /// Receives shorter than the id's end.
    pub short_recv: u64,
    /// Sends shorter than the id's end.
    pub short_send: u64,
    /// Ids that could not be read.
    pub id_fault: u64,
    /// Tables that filled up.
    pub map_full: MapFull,
    /// Sockets traced.
    pub sockets: Sockets,
    /// Message calls without a buffer to read the id from.
    pub calls_without_buffer: u64,
    /// Kernels before 5.15 (arguments kept from entry): receives and
    /// connects whose entry sonde did not see (begun before it attached, or
    /// the per-thread table full); not timed.
    pub entry_not_seen: u64,
    /// Per flow (received-on socket, sent-on socket), busiest first.
    pub flows: Vec<FlowLine>,
    /// Whether every traced process exited (the run ended with them).
    pub process_exited: bool,
    /// Length of the run.
    pub duration_s: f64,
}

/// The summary's `"map_full"` object.
#[derive(Debug, Clone, Serialize)]
pub struct MapFull {
    /// Flows not counted: the flow table was full.
    pub flows: u64,
    /// Sockets not traced: their descriptor was past the table's end.
    pub sockets_past_fd_limit: u64,
}

/// The summary's `"sockets"` object.
#[derive(Debug, Clone, Serialize)]
pub struct Sockets {
    /// Sockets found at the start.
    pub at_start: usize,
    /// Sockets opened (accepted, connected) during the run.
    pub added: u64,
}

/// One flow of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct FlowLine {
    /// The process.
    pub pid: u32,
    /// Descriptor received on.
    pub in_fd: u32,
    /// Descriptor sent on.
    pub out_fd: u32,
    /// The receiving socket's label.
    #[serde(rename = "in")]
    pub input: String,
    /// The sending socket's label.
    pub out: String,
    /// Messages.
    pub count: u64,
    /// Mean T2.
    pub avg_ns: u64,
    /// Largest T2.
    pub max_ns: u64,
}

/// A `--per-message --json` line.
#[derive(Serialize)]
struct MessageLine {
    #[serde(rename = "type")]
    kind: &'static str,
    id: u64,
    t2_ns: u64,
    recv_time: f64,
    send_time: f64,
    pid: u32,
    tid: u32,
    in_fd: u32,
    out_fd: u32,
}

/// The label of descriptor `fd` of a flow, whose socket is `sock` (its id in
/// the kernel half); `socks` by (pid, id).
fn label(socks: &BTreeMap<(u32, u32), SockFd>, pid: u32, fd: u32, sock: u32) -> String {
    match socks.get(&(pid, sock)) {
        _ if fd == NO_FD => "? (not a write or send call)".into(),
        Some(s) => format!("fd {fd} {} <- {}", s.local, s.remote),
        None => format!("fd {fd}"),
    }
}

/// Runs `sonde msglat`; `ready` is called once everything is attached.
pub fn run_with(a: &MsglatArgs, ctl: &RunControl, ready: impl FnOnce()) -> anyhow::Result<Outcome> {
    let json_out = validate(a)?;
    features::require_tracing_privileges()?;
    let socks = sockets(a)?;
    let hooks = Hooks::pick(a.hooks)?;
    let mut sink = Sink::open(a.run.path())?;
    let loaded = load(a, hooks, &socks)?;
    ctl.start_clock();
    let start = Instant::now();
    ready();
    let (stop, gone) = stream(a, &loaded, ctl, &mut sink, json_out)?;
    let elapsed = start.elapsed();
    let counts = read_counts(a, &loaded.skel)?;
    let labels = labels(&socks, hooks, &counts.flows);
    let summary = summarize(a, hooks, &counts, &labels, socks.len(), gone, elapsed);
    if json_out {
        sink.json(&summary)?;
    } else {
        sink.line(&summary_text(&summary, &counts.hist))?;
    }
    sink.flush()?;
    check_id_reach(a, &summary, counts.max_recv)?;
    Ok(Outcome {
        hist: counts.hist,
        unmatched_recv: summary.unmatched_recv,
        unmatched_send: summary.unmatched_send,
        summary,
        bpf_ns: counts.bpf_ns,
        bpf_runs: counts.bpf_runs,
        null_ns: counts.null_ns,
        null_runs: counts.null_runs,
        stop: if gone { Stop::Done } else { stop },
    })
}

/// Checks the options (usage errors, before anything needs privileges);
/// whether output is JSON.
fn validate(a: &MsglatArgs) -> anyhow::Result<bool> {
    if a.pid.len() > MSGLAT_MAX_PIDS {
        return Err(usage(format!("at most {MSGLAT_MAX_PIDS} --pid; trace the processes in groups")));
    }
    if a.port.len() > MAX_PORTS {
        return Err(usage(format!("at most {MAX_PORTS} --port filters")));
    }
    for p in &a.pid {
        if !crate::engine::pid_exists(*p) {
            return Err(usage(format!("--pid {p}: no such process; check the pid with `pgrep`")));
        }
    }
    let out = a.run.output("msglat", &[(".json", true), (".txt", false)])?;
    Ok(a.run.json || out.is_some_and(|(_, json)| json))
}

/// The sockets of the traced processes now, by `--port`.
fn sockets(a: &MsglatArgs) -> anyhow::Result<Vec<SockFd>> {
    let mut socks = Vec::new();
    for &p in &a.pid {
        let mine = sockets_of(p);
        if mine.is_empty() {
            return Err(usage(format!(
                "--pid {p}: the process has no sockets; give the pid of the process that relays the messages"
            )));
        }
        socks.extend(
            mine.into_iter().filter(|s| a.port.is_empty() || a.port.contains(&s.lport) || a.port.contains(&s.rport)),
        );
    }
    Ok(socks)
}

/// Polls until the stop (or every traced process exited), writing the
/// `--per-message` records after every drain; why it stopped and whether
/// the processes exited.
fn stream(
    a: &MsglatArgs,
    loaded: &Loaded,
    ctl: &RunControl,
    sink: &mut Sink,
    json_out: bool,
) -> anyhow::Result<(Stop, bool)> {
    let mono_epoch = mono_to_epoch();
    let pending: Rc<RefCell<Vec<types::ml_event>>> = Rc::default();
    let flush = |sink: &mut Sink| -> std::io::Result<()> {
        let mut evs = pending.borrow_mut();
        evs.sort_by_key(|e| e.send_ns);
        for e in evs.drain(..) {
            let t2 = e.send_ns.saturating_sub(e.recv_ns);
            if json_out {
                sink.json(&MessageLine {
                    kind: "message",
                    id: e.id,
                    t2_ns: t2,
                    recv_time: epoch_secs(e.recv_ns, mono_epoch),
                    send_time: epoch_secs(e.send_ns, mono_epoch),
                    pid: e.tgid,
                    tid: e.tid,
                    in_fd: e.in_fd,
                    out_fd: e.out_fd,
                })?;
            } else {
                sink.line(&format!(
                    "id {:<12} T2 {:>10}  pid {} fd {} -> fd {}",
                    e.id,
                    human(t2),
                    e.tgid,
                    e.in_fd,
                    e.out_fd
                ))?;
            }
        }
        sink.flush()
    };
    let rb = match &loaded.rings {
        Some(r) => {
            let p = pending.clone();
            Some(r.reader(move |d: &[u8]| {
                if let Some(e) = record::decode::<types::ml_event>(d) {
                    p.borrow_mut().push(e);
                }
            })?)
        }
        None => None,
    };
    let mut gone = false;
    let stop = poll_until_stop(rb.as_ref(), ctl, None, |_| {
        if a.pid.iter().all(|p| !crate::engine::process_alive(*p)) {
            gone = true;
            ctl.request_stop();
        }
        flush(sink)?;
        Ok(())
    })?;
    drop(rb);
    flush(sink)?;
    Ok((stop, gone))
}

/// A flow: its key, messages, sum and maximum of T2.
type Flow = (types::ml_flow_key, u64, u64, u64);

/// What the maps hold at the end.
struct Counts {
    st: [u64; STAT_MAX],
    hist: Hist,
    /// The longest receive seen (for the --id error).
    max_recv: u64,
    /// Receives still waiting to be sent.
    waiting: u64,
    flows: Vec<Flow>,
    bpf_ns: u64,
    bpf_runs: u64,
    null_ns: u64,
    null_runs: u64,
}

/// Reads every counter, the histogram and the flows.
fn read_counts(a: &MsglatArgs, skel: &MsglatSkel<'static>) -> anyhow::Result<Counts> {
    let (mut bpf_ns, mut bpf_runs, mut null_ns, mut null_runs) = (0, 0, 0, 0);
    for p in skel.object().progs() {
        let (ns, n) = run_stats(&p);
        if p.name() == "ml_null" {
            (null_ns, null_runs) = (ns, n);
        } else {
            bpf_ns += ns;
            bpf_runs += n;
        }
    }
    let mut st = [0u64; STAT_MAX];
    for (i, v) in st.iter_mut().enumerate() {
        *v = percpu_sum(&skel.maps.stats, i as u32)?;
    }
    let hist = read_percpu(&skel.maps.hist, 1)?.remove(0);
    let max_recv = skel
        .maps
        .max_recv
        .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)?
        .unwrap_or_default()
        .iter()
        .filter_map(|v| record::decode::<u64>(v))
        .max()
        .unwrap_or(0);
    // Every receive recorded was paired, replaced (its id or table slot
    // taken by a later one), dropped from a full FIFO, or is still waiting:
    // in the id table (counted here, so the receive path counts nothing),
    // or in the FIFO (the receives it counted less the others).
    let waiting = if a.fifo {
        st[RECVS].saturating_sub(hist.count + st[FIFO_OVERFLOW])
    } else {
        let mut n = 0;
        for i in 0..skel.maps.waiting.max_entries() {
            if let Some(v) = skel.maps.waiting.lookup(&i.to_ne_bytes(), MapFlags::ANY)? {
                n += record::decode::<types::ml_waiting>(&v).is_some_and(|w| w.tgid1 != 0) as u64;
            }
        }
        n
    };
    let flows = read_flows(a, skel)?;
    Ok(Counts { st, hist, max_recv, waiting, flows, bpf_ns, bpf_runs, null_ns, null_runs })
}

/// Every flow, busiest first: those in the hash (their slot was taken) and
/// those holding a slot of the flow table (never in the hash).
fn read_flows(a: &MsglatArgs, skel: &MsglatSkel<'static>) -> anyhow::Result<Vec<Flow>> {
    let mut flows: Vec<Flow> = Vec::new();
    for k in skel.maps.flows.keys() {
        let Some(per_cpu) = skel.maps.flows.lookup_percpu(&k, MapFlags::ANY)? else { continue };
        let Some(key) = record::decode::<types::ml_flow_key>(&k) else { continue };
        let (mut c, mut s, mut m) = (0, 0, 0);
        for f in per_cpu.iter().filter_map(|v| record::decode::<types::ml_flow>(v)) {
            c += f.count;
            s += f.sum_ns;
            m = m.max(f.max_ns);
        }
        flows.push((key, c, s, m));
    }
    for i in 0..skel.maps.flow_slots.max_entries() {
        let Some(v) = skel.maps.flow_slots.lookup(&i.to_ne_bytes(), MapFlags::ANY)? else { continue };
        let Some(f) = record::decode::<types::ml_flow_slot>(&v) else { continue };
        if f.key1 == 0 || f.count == 0 {
            continue;
        }
        let pslot = i as usize / (FLOW_WAYS * FLOW_WAYS);
        let (in_sock, out_sock) = (((f.key1 - 1) >> 32) as u32, (f.key1 - 1) as u32);
        let fds = match skel.maps.flow_fds.lookup(&i.to_ne_bytes(), MapFlags::ANY)? {
            Some(v) => record::decode::<u64>(&v).unwrap_or(0),
            None => 0,
        };
        let key = types::ml_flow_key {
            tgid: a.pid.get(pslot).copied().unwrap_or(0),
            in_sock,
            out_sock,
            in_fd: (fds >> 32) as u32,
            out_fd: fds as u32,
            ..Default::default()
        };
        flows.push((key, f.count, f.sum_ns, f.max_ns));
    }
    flows.sort_by_key(|f| std::cmp::Reverse(f.1));
    Ok(flows)
}

/// Labels by socket, not descriptor (a descriptor may be another socket by
/// the end): the sockets at the start, overwritten by those of the flows'
/// processes now (the ends of those opened after the start, and of those
/// connected since, while still open). Closed ones keep their ends from the
/// start, if open then.
fn labels(socks: &[SockFd], hooks: Hooks, flows: &[Flow]) -> BTreeMap<(u32, u32), SockFd> {
    let mut labels: BTreeMap<(u32, u32), SockFd> = socks.iter().map(|s| ((s.pid, s.id(hooks)), s.clone())).collect();
    let pids: std::collections::BTreeSet<u32> = flows.iter().map(|(k, ..)| k.tgid).collect();
    for pid in pids {
        for s in sockets_of(pid).into_iter().filter(|s| s.id(hooks) != 0) {
            labels.insert((pid, s.id(hooks)), s);
        }
    }
    labels
}

/// The summary from what the maps hold.
fn summarize(
    a: &MsglatArgs,
    hooks: Hooks,
    c: &Counts,
    labels: &BTreeMap<(u32, u32), SockFd>,
    at_start: usize,
    gone: bool,
    elapsed: Duration,
) -> Summary {
    let (st, hist) = (&c.st, &c.hist);
    let (off, len) = a.id.unwrap_or((0, 8));
    Summary {
        kind: "summary",
        count: hist.count,
        unmatched_recv: c.waiting + st[REPLACED] + st[FIFO_OVERFLOW],
        unmatched_send: st[UNMATCHED_SEND],
        p50_ns: hist.quantile_ns(0.5),
        p90_ns: hist.quantile_ns(0.9),
        p99_ns: hist.quantile_ns(0.99),
        max_ns: hist.max_ns,
        avg_ns: hist.avg_ns(),
        buckets: hist.json_buckets(),
        lost: st[LOST],
        pairing: if a.fifo { "fifo".to_string() } else { format!("id {off}:{len}") },
        hooks,
        received: if a.fifo { st[RECVS] } else { hist.count + st[REPLACED] + c.waiting },
        sends: hist.count + st[UNMATCHED_SEND] + st[SHORT_SEND] + st[SEND_ID_FAULT],
        waiting_at_end: c.waiting,
        replaced: st[REPLACED],
        fifo_overflow: st[FIFO_OVERFLOW],
        short_recv: st[SHORT_RECV],
        short_send: st[SHORT_SEND],
        id_fault: st[ID_FAULT] + st[SEND_ID_FAULT],
        map_full: MapFull { flows: st[FLOW_FULL], sockets_past_fd_limit: st[FDS_FULL] },
        entry_not_seen: st[ENTRY_NOT_SEEN],
        sockets: Sockets { at_start, added: st[NEW_FDS] },
        calls_without_buffer: st[OTHER_CALL],
        flows: c
            .flows
            .iter()
            .map(|(k, n, sum, max)| FlowLine {
                pid: k.tgid,
                in_fd: k.in_fd,
                out_fd: k.out_fd,
                input: label(labels, k.tgid, k.in_fd, k.in_sock),
                out: label(labels, k.tgid, k.out_fd, k.out_sock),
                count: *n,
                avg_ns: sum.checked_div(*n).unwrap_or(0),
                max_ns: *max,
            })
            .collect(),
        process_exited: gone,
        duration_s: (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
    }
}

/// The text summary, from the typed one (and the histogram it summarizes).
fn summary_text(s: &Summary, hist: &Hist) -> String {
    let mut t = format!("\nT2, receive to send ({:.1}s, {} messages, pairing {}):\n", s.duration_s, s.count, s.pairing);
    t.push_str(&hist.render());
    t.push_str(&format!(
        "p50 {}  p90 {}  p99 {}  max {}  avg {}\n",
        human(s.p50_ns),
        human(s.p90_ns),
        human(s.p99_ns),
        human(s.max_ns),
        human(s.avg_ns)
    ));
    let rows: Vec<Vec<String>> = s
        .flows
        .iter()
        .map(|f| {
            vec![
                f.pid.to_string(),
                f.input.clone(),
                f.out.clone(),
                f.count.to_string(),
                human(f.avg_ns),
                human(f.max_ns),
            ]
        })
        .collect();
    t.push_str(&format!(
        "\nper flow:\n{}\n",
        table(&["PID", "RECEIVED ON", "SENT ON", "MESSAGES", "AVG", "MAX"], &rows)
    ));
    t.push_str(&format!(
        "unmatched: {} receives never sent ({} waiting at the end, {} replaced by a later one with their id, {} FIFO overflow), {} sends with no receive\nnot paired: {} receives and {} sends shorter than the id's end, {} ids unreadable  lost records: {}  map full: flows {}, sockets past fd {MAX_FD} {}{}{}",
        s.unmatched_recv, s.waiting_at_end, s.replaced, s.fifo_overflow, s.unmatched_send, s.short_recv, s.short_send, s.id_fault, s.lost, s.map_full.flows, s.map_full.sockets_past_fd_limit,
        if s.entry_not_seen > 0 { format!("\nnot timed: {} receives or connects begun before sonde attached (this kernel gives their arguments only at entry)", s.entry_not_seen) } else { String::new() },
        if s.process_exited { "\nthe process exited" } else { "" }
    ));
    if s.hooks == Hooks::Sockets && s.sends == 0 && s.received > 0 {
        t.push_str("\nno TCP send seen: if the process sends over UDP or another protocol, use --hooks syscalls");
    }
    t
}

/// Every receive too short for the id: the offset is wrong for this
/// protocol (a usage error, after the summary).
fn check_id_reach(a: &MsglatArgs, s: &Summary, max_recv: u64) -> anyhow::Result<()> {
    if !a.fifo && s.received == 0 && s.short_recv > 0 {
        let (off, len) = a.id.unwrap_or((0, 8));
        return Err(usage(format!(
            "--id {off}:{len} lies beyond every message received ({} receives, the longest {max_recv} bytes); give an offset inside the message, or --fifo",
            s.short_recv
        )));
    }
    Ok(())
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &MsglatArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.run.duration)?;
    let out = run_with(a, &ctl, || {
        eprintln!("sonde: timing messages from receive to send; Ctrl-C ends with a summary");
    })?;
    Ok(out.stop.exit_code())
}

#[cfg(test)]
mod tests {
    use libbpf_rs::skel::SkelBuilder;

    use super::*;

    /// The stats map has exactly the slots the constants copied from
    /// msglat.h name (no root needed: the object is opened, not loaded).
    #[test]
    fn stats_map_size_matches_the_slot_constants() {
        let mut storage = MaybeUninit::uninit();
        let open = MsglatSkelBuilder::default().open(&mut storage).expect("open the object");
        assert_eq!(open.maps.stats.max_entries() as usize, STAT_MAX);
    }

    /// The path for kernels before 5.12, checked by this kernel's verifier:
    /// with `has_fetch` false and every atomic fetch replaced by a call to
    /// no helper, the programs load (the replaced code is dead); with
    /// `has_fetch` true the same replacement is reached and the load fails.
    /// So the replacement only ever removes code that cannot run.
    #[test]
    fn without_atomic_fetch_the_programs_load_only_where_that_code_is_dead() {
        let a = MsglatArgs { pid: vec![std::process::id()], fifo: true, ..Default::default() };
        for hooks in [Hooks::Syscalls, Hooks::Raw] {
            for regs in [true, false] {
                load_with(&a, hooks, &[], false, true, regs)
                    .unwrap_or_else(|e| panic!("{hooks:?} without atomic fetch: {e:#}"));
            }
            assert!(
                load_with(&a, hooks, &[], true, true, true).is_err(),
                "{hooks:?}: a reachable poisoned call loaded"
            );
            load_with(&a, hooks, &[], true, false, true)
                .unwrap_or_else(|e| panic!("{hooks:?} with atomic fetch: {e:#}"));
        }
        let mut storage = MaybeUninit::uninit();
        let mut open = MsglatSkelBuilder::default().open(&mut storage).expect("open the object");
        let replaced: usize = open
            .open_object_mut()
            .progs_mut()
            .map(|mut p| features::poison_atomic_fetch(&mut p).expect("set_insns"))
            .sum();
        assert!(
            replaced >= 4,
            "the FIFO head and tail fetch-adds and the flow slots' compare-and-exchange: {replaced}"
        );
    }
}
