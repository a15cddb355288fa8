//! `sonde msglat`: per-message latency through an unmodified process (seed
//! 004's T2): from a message's receive to its send, paired and counted in
//! the kernel.
use std::{
    cell::RefCell,
    collections::BTreeMap,
    mem::MaybeUninit,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    Link, MapCore, MapFlags, OpenObject,
};
use serde_json::json;

use crate::engine::{
    attach::run_stats,
    error::usage,
    features,
    hist::{human, read_percpu, Hist},
    output::{table, Sink},
    perf::percpu_sum,
    ringbuf::{self, poll_until_stop, PerCpuRings},
    run::{duration_arg, RunControl, Stop},
    time::{epoch_secs, mono_to_epoch},
};

crate::skeleton!("msglat");
use skel::{types, MsglatSkel, MsglatSkelBuilder};

const MAX_PIDS: usize = 8;
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
const STAT_MAX: usize = 13;
/// ml_event/ml_flow_key's descriptor for a send not made by a write or send call.
const NO_FD: u32 = u32::MAX;

/// Per-message latency through a process that receives messages on some
/// sockets and sends them on others (a broker, a proxy, a relay): the time
/// from each message's receive (its read/recv returns) to its send (its
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
/// seed 004's broker that is about 286 ns per message (syscalls 766).
/// bench/broker/run (seed 004's harness, messages 60 us apart, so caches
/// are cold; the three processes on one CPU): +471..+507 ns end to end
/// (syscalls +686), of which +234..+263 is reaching four empty programs at
/// the same tracepoints (the sender's send, the broker's receive and send,
/// the receiver's receive); logging times into memory +60..+67, to a file
/// +518..+564.
#[derive(Debug, Args, Clone, Default)]
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
    /// Stop after this long (e.g. 10s); default: until Ctrl-C or the process exits.
    #[arg(short = 'd', long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// One JSON object per line (messages with --per-message, then a summary).
    #[arg(long)]
    pub json: bool,
    /// Write to this file (.json implies --json; or .txt).
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// The lab's bpf_stats run: also an empty program on a message
    /// tracepoint, to take the statistics' own cost out.
    #[arg(skip)]
    pub calibrate: bool,
    /// The lab's floor row: empty programs on the socket hooks'
    /// tracepoints in place of msglat's (what reaching a program costs).
    #[arg(skip)]
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
    let dup = unsafe { OwnedFd::from_raw_fd(dup as i32) };
    let name = |peer: bool| {
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
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
        let Some(ino) = target.to_str().and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        else {
            continue;
        };
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
            // tracepoint (no accept4 on some arches) skip it.
            _ => {
                hooks == Hooks::Syscalls
                    && name.split_once('_').map(|(_, r)| r).and_then(|r| r.split_once('_')).is_some_and(|(dir, sc)| {
                        features::tracepoint_exists(
                            "syscalls",
                            &format!("sys_{}_{sc}", if dir == "in" { "enter" } else { "exit" }),
                        )
                    })
            }
        };
        prog.set_autoload(on);
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
    pub summary: serde_json::Value,
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

/// The label of descriptor `fd` of a flow, whose socket is `sock` (its id in
/// the kernel half); `socks` by (pid, id).
fn label(socks: &BTreeMap<(u32, u32), SockFd>, pid: u32, fd: u32, sock: u32) -> String {
    match socks.get(&(pid, sock)) {
        _ if fd == NO_FD => "? (not a write or send call)".into(),
        Some(s) => format!("fd {fd} {} <- {}", s.local, s.remote),
        None => format!("fd {fd}"),
    }
}

/// A value of a layout mirrored from msglat.h out of a map value or ring
/// record at least its size (the callers check or the map guarantees it).
fn pod<T: Copy>(bytes: &[u8]) -> T {
    assert!(bytes.len() >= std::mem::size_of::<T>(), "short record");
    // SAFETY: T is plain old data generated from msglat.h (any bit pattern
    // is valid), and the length was checked.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) }
}

/// Runs `sonde msglat`; `ready` is called once everything is attached.
pub fn run_with(a: &MsglatArgs, ctl: &RunControl, ready: impl FnOnce()) -> anyhow::Result<Outcome> {
    if a.pid.len() > MAX_PIDS {
        return Err(usage(format!("at most {MAX_PIDS} --pid; trace the processes in groups")));
    }
    if a.port.len() > MAX_PORTS {
        return Err(usage(format!("at most {MAX_PORTS} --port filters")));
    }
    for p in &a.pid {
        if !crate::engine::pid_exists(*p) {
            return Err(usage(format!("--pid {p}: no such process; check the pid with `pgrep`")));
        }
    }
    if let Some(p) = &a.output {
        if !p.extension().is_some_and(|e| e == "json" || e == "txt") {
            return Err(usage(format!("-o {}: msglat writes .json (JSON lines) or .txt", p.display())));
        }
    }
    let json_out = a.json || a.output.as_ref().is_some_and(|p| p.extension().is_some_and(|e| e == "json"));
    features::require_tracing_privileges()?;
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
    let hooks = Hooks::pick(a.hooks)?;
    let mut sink = Sink::open(a.output.as_deref())?;
    let loaded = load(a, hooks, &socks)?;
    // Labels by socket, not descriptor: a descriptor may be another socket by the end.
    let mut labels: BTreeMap<(u32, u32), SockFd> = socks.iter().map(|s| ((s.pid, s.id(hooks)), s.clone())).collect();
    ctl.start_clock();
    let start = Instant::now();
    ready();

    // --per-message records, written after every drain of the rings.
    let mono_epoch = mono_to_epoch();
    let pending: Rc<RefCell<Vec<types::ml_event>>> = Rc::default();
    let flush = |sink: &mut Sink| -> std::io::Result<()> {
        let mut evs = pending.borrow_mut();
        evs.sort_by_key(|e| e.send_ns);
        for e in evs.drain(..) {
            let t2 = e.send_ns.saturating_sub(e.recv_ns);
            if json_out {
                sink.json(&json!({
                    "type": "message", "id": e.id, "t2_ns": t2,
                    "recv_time": epoch_secs(e.recv_ns, mono_epoch),
                    "send_time": epoch_secs(e.send_ns, mono_epoch),
                    "pid": e.tgid, "tid": e.tid, "in_fd": e.in_fd, "out_fd": e.out_fd,
                }))?;
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
                if d.len() >= std::mem::size_of::<types::ml_event>() {
                    p.borrow_mut().push(pod::<types::ml_event>(d));
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
        flush(&mut sink)?;
        Ok(())
    })?;
    drop(rb);
    flush(&mut sink)?;
    let elapsed = start.elapsed();

    let skel = &loaded.skel;
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
        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap()))
        .max()
        .unwrap_or(0);
    // Every receive recorded was paired, replaced (its id or table slot
    // taken by a later one), dropped from a full FIFO, or is still waiting:
    // in the id table (counted here, so the receive path counts nothing),
    // or in the FIFO (the receives it counted less the others).
    let matched = hist.count;
    let waiting = if a.fifo {
        st[RECVS].saturating_sub(matched + st[FIFO_OVERFLOW])
    } else {
        let mut n = 0;
        for i in 0..skel.maps.waiting.max_entries() {
            if let Some(v) = skel.maps.waiting.lookup(&i.to_ne_bytes(), MapFlags::ANY)? {
                n += (pod::<types::ml_waiting>(&v).tgid1 != 0) as u64;
            }
        }
        n
    };
    let received = if a.fifo { st[RECVS] } else { matched + st[REPLACED] + waiting };
    let sends = matched + st[UNMATCHED_SEND] + st[SHORT_SEND] + st[SEND_ID_FAULT];
    let unmatched_recv = waiting + st[REPLACED] + st[FIFO_OVERFLOW];
    let mut flows: Vec<(types::ml_flow_key, u64, u64, u64)> = Vec::new();
    for k in skel.maps.flows.keys() {
        let Some(per_cpu) = skel.maps.flows.lookup_percpu(&k, MapFlags::ANY)? else { continue };
        let (mut c, mut s, mut m) = (0, 0, 0);
        for v in per_cpu {
            let f = pod::<types::ml_flow>(&v);
            c += f.count;
            s += f.sum_ns;
            m = m.max(f.max_ns);
        }
        flows.push((pod::<types::ml_flow_key>(&k), c, s, m));
    }
    // The flow table's claimed slots (a flow holding a slot is never in the
    // hash: only flows that find their slot taken go there).
    for i in 0..skel.maps.flow_slots.max_entries() {
        let Some(v) = skel.maps.flow_slots.lookup(&i.to_ne_bytes(), MapFlags::ANY)? else { continue };
        let f = pod::<types::ml_flow_slot>(&v);
        if f.key1 == 0 || f.count == 0 {
            continue;
        }
        let pslot = i as usize / (FLOW_WAYS * FLOW_WAYS);
        let (in_sock, out_sock) = (((f.key1 - 1) >> 32) as u32, (f.key1 - 1) as u32);
        let fds = match skel.maps.flow_fds.lookup(&i.to_ne_bytes(), MapFlags::ANY)? {
            Some(v) => u64::from_ne_bytes(v[..8].try_into().unwrap()),
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
    // The sockets of the flows' processes now: the ends of those opened
    // after the start, and of those connected since, while still open.
    // Closed ones keep their ends from the start, if open then.
    let pids: std::collections::BTreeSet<u32> = flows.iter().map(|(k, ..)| k.tgid).collect();
    for pid in pids {
        for s in sockets_of(pid).into_iter().filter(|s| s.id(hooks) != 0) {
            labels.insert((pid, s.id(hooks)), s);
        }
    }

    let (off, len) = a.id.unwrap_or((0, 8));
    let summary = json!({
        "type": "summary",
        "count": hist.count,
        "unmatched_recv": unmatched_recv,
        "unmatched_send": st[UNMATCHED_SEND],
        "p50_ns": hist.quantile_ns(0.5),
        "p90_ns": hist.quantile_ns(0.9),
        "p99_ns": hist.quantile_ns(0.99),
        "max_ns": hist.max_ns,
        "avg_ns": hist.avg_ns(),
        "buckets": hist.json_buckets(),
        "lost": st[LOST],
        "pairing": if a.fifo { "fifo".to_string() } else { format!("id {off}:{len}") },
        "hooks": hooks,
        "received": received,
        "sends": sends,
        "waiting_at_end": waiting,
        "replaced": st[REPLACED],
        "fifo_overflow": st[FIFO_OVERFLOW],
        "short_recv": st[SHORT_RECV],
        "short_send": st[SHORT_SEND],
        "id_fault": st[ID_FAULT] + st[SEND_ID_FAULT],
        "map_full": {"flows": st[FLOW_FULL], "sockets_past_fd_limit": st[FDS_FULL]},
        "sockets": {"at_start": socks.len(), "added": st[NEW_FDS]},
        "calls_without_buffer": st[OTHER_CALL],
        "flows": flows.iter().map(|(k, c, s, m)| json!({
            "pid": k.tgid, "in_fd": k.in_fd, "out_fd": k.out_fd,
            "in": label(&labels, k.tgid, k.in_fd, k.in_sock), "out": label(&labels, k.tgid, k.out_fd, k.out_sock),
            "count": c, "avg_ns": s.checked_div(*c).unwrap_or(0), "max_ns": m,
        })).collect::<Vec<_>>(),
        "process_exited": gone,
        "duration_s": (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
    });
    if json_out {
        sink.json(&summary)?;
    } else {
        let mut s = format!(
            "\nT2, receive to send ({:.1}s, {} messages, pairing {}):\n",
            elapsed.as_secs_f64(),
            hist.count,
            summary["pairing"].as_str().unwrap_or("")
        );
        s.push_str(&hist.render());
        s.push_str(&format!(
            "p50 {}  p90 {}  p99 {}  max {}  avg {}\n",
            human(hist.quantile_ns(0.5)),
            human(hist.quantile_ns(0.9)),
            human(hist.quantile_ns(0.99)),
            human(hist.max_ns),
            human(hist.avg_ns())
        ));
        let rows: Vec<Vec<String>> = flows
            .iter()
            .map(|(k, c, sum, m)| {
                vec![
                    k.tgid.to_string(),
                    label(&labels, k.tgid, k.in_fd, k.in_sock),
                    label(&labels, k.tgid, k.out_fd, k.out_sock),
                    c.to_string(),
                    human(sum.checked_div(*c).unwrap_or(0)),
                    human(*m),
                ]
            })
            .collect();
        s.push_str(&format!(
            "\nper flow:\n{}\n",
            table(&["PID", "RECEIVED ON", "SENT ON", "MESSAGES", "AVG", "MAX"], &rows)
        ));
        s.push_str(&format!(
            "unmatched: {unmatched_recv} receives never sent ({waiting} waiting at the end, {} replaced by a later one with their id, {} FIFO overflow), {} sends with no receive\nnot paired: {} receives and {} sends shorter than the id's end, {} ids unreadable  lost records: {}  map full: flows {}, sockets past fd {MAX_FD} {}{}",
            st[REPLACED], st[FIFO_OVERFLOW], st[UNMATCHED_SEND], st[SHORT_RECV], st[SHORT_SEND], st[ID_FAULT] + st[SEND_ID_FAULT], st[LOST], st[FLOW_FULL], st[FDS_FULL],
            if gone { "\nthe process exited" } else { "" }
        ));
        if hooks == Hooks::Sockets && sends == 0 && received > 0 {
            s.push_str("\nno TCP send seen: if the process sends over UDP or another protocol, use --hooks syscalls");
        }
        sink.line(&s)?;
    }
    sink.flush()?;
    // Every receive too short for the id: the offset is wrong for this protocol.
    if !a.fifo && received == 0 && st[SHORT_RECV] > 0 {
        return Err(usage(format!(
            "--id {off}:{len} lies beyond every message received ({} receives, the longest {max_recv} bytes); give an offset inside the message, or --fifo",
            st[SHORT_RECV]
        )));
    }
    Ok(Outcome {
        hist,
        unmatched_recv,
        unmatched_send: st[UNMATCHED_SEND],
        summary,
        bpf_ns,
        bpf_runs,
        null_ns,
        null_runs,
        stop: if gone { Stop::Done } else { stop },
    })
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &MsglatArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.duration)?;
    let out = run_with(a, &ctl, || {
        eprintln!("sonde: timing messages from receive to send; Ctrl-C ends with a summary");
    })?;
    Ok(out.stop.exit_code())
}
