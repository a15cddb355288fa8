//! `sonde lab dns`: seed 001 on real kernel traffic. An HTTP server whose
//! logging middleware resolves each client's address with getnameinfo()
//! (tests/workloads/dnsweb.c, embedded) answers a load generator across a
//! veth pair; its reverse DNS queries go to a PTR responder on the server
//! namespace's loopback that answers after a 30-130 ms delay. The lab runs
//! `profile`, `offcpu` and `wakeup` on the server, prints what each found,
//! checks it against the built-in cause, then removes the delay and shows the
//! request rate change.
use std::{
    collections::BinaryHeap,
    ffi::CString,
    io::{Read, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use clap::Args;

use super::netns::{Netns, Pair};
use super::traffic::Workers;
use crate::{
    engine::{
        cli,
        error::usage,
        features,
        run::{duration_arg, RunControl, Stop},
        stacks::{weight_where, Stack},
    },
    tools::{
        offcpu::{self, OffcpuArgs},
        profile::{self, ProfileArgs},
    },
};

/// The server, built static with frame pointers by build.rs.
const DNSWEB: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dnsweb"));
const PORT: u16 = 8080;

/// Options of `sonde lab dns`.
#[derive(Debug, Args)]
pub struct DnsLabArgs {
    /// How long each tool traces the server, and how long the rate is
    /// measured without the delay.
    #[arg(short = 'd', long, value_parser = duration_arg, default_value = "4s")]
    pub duration: Duration,
    /// The resolver's delay per reverse lookup: MIN-MAX (uniform), e.g. 30ms-130ms.
    #[arg(long, value_parser = delay_arg, default_value = "30ms-130ms")]
    pub delay: (Duration, Duration),
    /// Server worker threads (each handles one request at a time).
    #[arg(long, default_value_t = 4)]
    pub workers: u32,
    /// Concurrent clients of the load generator.
    #[arg(long, default_value_t = 32)]
    pub clients: u32,
    /// Profile sampling rate.
    #[arg(short = 'F', long = "frequency", default_value_t = 199)]
    pub frequency: u64,
    /// Flame graphs are written to PREFIX-{profile,offcpu,wakeup}.{html,svg}.
    #[arg(long, default_value = "sonde-lab-dns")]
    pub prefix: String,
    /// Print the findings as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

fn delay_arg(s: &str) -> Result<(Duration, Duration), String> {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let (lo, hi) = (duration_arg(lo)?, duration_arg(hi)?);
    if lo > hi || hi > Duration::from_secs(2) {
        return Err(format!(
            "{s}: give MIN-MAX with MIN <= MAX <= 2s (the resolver gives up after 2 s), e.g. 30ms-130ms"
        ));
    }
    Ok((lo, hi))
}

/// A tiny DNS server on 127.0.0.1:53 of a namespace: answers PTR queries for
/// in-addr.arpa names with `client-A-B-C-D.lab.sonde` after a delay drawn
/// uniformly from the current range; anything else gets NXDOMAIN. One thread
/// receives, another ("dns-reply") sends each answer when it is due, so the
/// delays overlap like a real slow upstream.
struct Responder {
    delay: Arc<(AtomicU64, AtomicU64)>,
    answered: Arc<AtomicU64>,
    /// Nanoseconds queries waited here before their answer went out, summed:
    /// the built-in resolver wait the tools must find.
    held_ns: Arc<AtomicU64>,
    _workers: Workers,
}

struct Due {
    got: Instant,
    at: Instant,
    to: SocketAddr,
    msg: Vec<u8>,
}

impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.at.cmp(&self.at) // earliest first in a max-heap
    }
}

impl Responder {
    fn start(ns: &Netns, delay: (Duration, Duration)) -> anyhow::Result<Self> {
        let mut workers = Workers::default();
        let stop = workers.stop_flag();
        let d = Arc::new((AtomicU64::new(delay.0.as_nanos() as u64), AtomicU64::new(delay.1.as_nanos() as u64)));
        let answered = Arc::new(AtomicU64::new(0));
        let sock =
            ns.run(|| UdpSocket::bind("127.0.0.1:53"))?.context("binding the lab's DNS responder to 127.0.0.1:53")?;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let send = sock.try_clone()?;
        let (tx, rx) = mpsc::channel::<Due>();
        let (st, dd) = (stop.clone(), d.clone());
        let recv = std::thread::Builder::new().name("dns-recv".into()).spawn(move || -> anyhow::Result<()> {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
            let mut buf = [0u8; 512];
            while !st.load(Ordering::Relaxed) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
                let Some(msg) = answer(&buf[..n]) else { continue };
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let (lo, hi) = (dd.0.load(Ordering::Relaxed), dd.1.load(Ordering::Relaxed));
                let wait = lo + if hi > lo { rng % (hi - lo + 1) } else { 0 };
                let got = Instant::now();
                if tx.send(Due { got, at: got + Duration::from_nanos(wait), to: from, msg }).is_err() {
                    break;
                }
            }
            Ok(())
        })?;
        let held_ns = Arc::new(AtomicU64::new(0));
        let (st, n, held) = (stop.clone(), answered.clone(), held_ns.clone());
        let reply = std::thread::Builder::new().name("dns-reply".into()).spawn(move || -> anyhow::Result<()> {
            let mut due = BinaryHeap::new();
            while !st.load(Ordering::Relaxed) {
                let wait = due
                    .peek()
                    .map(|d: &Due| d.at.saturating_duration_since(Instant::now()))
                    .unwrap_or(Duration::from_millis(50));
                match rx.recv_timeout(wait.min(Duration::from_millis(50))) {
                    Ok(d) => due.push(d),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
                while due.peek().is_some_and(|d| d.at <= Instant::now()) {
                    let d = due.pop().expect("peeked");
                    send.send_to(&d.msg, d.to)?;
                    n.fetch_add(1, Ordering::Relaxed);
                    held.fetch_add(d.got.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
            }
            Ok(())
        })?;
        workers.add(recv);
        workers.add(reply);
        Ok(Self { delay: d, answered, held_ns, _workers: workers })
    }

    fn set_delay(&self, lo: Duration, hi: Duration) {
        self.delay.0.store(lo.as_nanos() as u64, Ordering::Relaxed);
        self.delay.1.store(hi.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The answer to one DNS query, or None when it is not a query.
fn answer(q: &[u8]) -> Option<Vec<u8>> {
    if q.len() < 12 || q[2] & 0x80 != 0 || u16::from_be_bytes([q[4], q[5]]) != 1 {
        return None;
    }
    // The question: labels up to a zero byte, then type and class.
    let mut i = 12;
    let mut labels = Vec::new();
    while i < q.len() && q[i] != 0 {
        let l = q[i] as usize;
        if l > 63 || i + 1 + l > q.len() {
            return None;
        }
        labels.push(String::from_utf8_lossy(&q[i + 1..i + 1 + l]).to_ascii_lowercase());
        i += 1 + l;
    }
    let qend = i + 5;
    if qend > q.len() {
        return None;
    }
    let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
    let mut r = q[..qend].to_vec();
    r[2] = 0x80 | (q[2] & 0x01) | 0x04; // QR, authoritative, RD copied
    r[3] = 0x80; // RA
    r[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
    let is_v4_ptr = qtype == 12 && labels.len() == 6 && labels[4] == "in-addr" && labels[5] == "arpa";
    if !is_v4_ptr {
        r[3] |= 3; // NXDOMAIN
        return Some(r);
    }
    let host = format!("client-{}-{}-{}-{}", labels[3], labels[2], labels[1], labels[0]);
    let mut rdata = Vec::new();
    for l in [host.as_str(), "lab", "sonde"] {
        rdata.push(l.len() as u8);
        rdata.extend_from_slice(l.as_bytes());
    }
    rdata.push(0);
    r[7] = 1; // ANCOUNT
    r.extend_from_slice(&[0xc0, 0x0c, 0, 12, 0, 1, 0, 0, 0, 0]);
    r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    r.extend_from_slice(&rdata);
    Some(r)
}

/// The server process: in the server namespace, with a private /etc whose
/// resolv.conf names the lab's responder (nsswitch: hosts from DNS only), so
/// it never asks the host's resolver. Killed and removed when dropped.
struct Server {
    child: Child,
    dir: PathBuf,
}

impl Server {
    fn start(ns: &Netns, dir: &Path, workers: u32) -> anyhow::Result<Self> {
        let bin = super::install(dir, "dnsweb", DNSWEB)?;
        let etc = dir.join("etc");
        std::fs::create_dir_all(&etc)?;
        std::fs::write(etc.join("resolv.conf"), "nameserver 127.0.0.1\noptions timeout:2 attempts:1\n")?;
        std::fs::write(etc.join("nsswitch.conf"), "hosts: dns\n")?;
        std::fs::write(etc.join("hosts"), "")?;
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty)?;
        let net = std::fs::File::open(format!("/run/netns/{}", ns.name))
            .with_context(|| format!("opening namespace {}", ns.name))?;
        let c = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in temp paths");
        let (etc_c, empty_c, root, etc_dir, nscd) =
            (c(&etc), c(&empty), c(Path::new("/")), c(Path::new("/etc")), c(Path::new("/run/nscd")));
        let has_nscd = Path::new("/run/nscd").is_dir();
        let net_fd = net.as_raw_fd();
        let mut cmd = Command::new(&bin);
        cmd.arg(PORT.to_string())
            .arg(workers.to_string())
            .arg(dir.join("access.log"))
            .stdout(Stdio::piped())
            .stdin(Stdio::null());
        // SAFETY: only async-signal-safe system calls on memory prepared
        // before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let ok = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
                ok(libc::setns(net_fd, libc::CLONE_NEWNET))?;
                ok(libc::unshare(libc::CLONE_NEWNS))?;
                ok(libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                ok(libc::mount(etc_c.as_ptr(), etc_dir.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()))?;
                if has_nscd {
                    // A host nscd would answer from the host's resolver.
                    ok(libc::mount(
                        empty_c.as_ptr(),
                        nscd.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ))?;
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().context("starting the lab's HTTP server")?;
        drop(net);
        let mut line = [0u8; 10];
        let mut out = child.stdout.take().expect("piped");
        let s = Server { child, dir: dir.to_path_buf() };
        if out.read_exact(&mut line).is_err() || &line != b"listening\n" {
            bail!("the lab's HTTP server did not start");
        }
        Ok(s)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `clients` threads in a namespace, each sending GET /items on a new
/// connection and reading the answer, again and again, until dropped.
struct Load {
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    _workers: Workers,
}

impl Load {
    fn start(ns: &Netns, to: SocketAddr, clients: u32) -> Self {
        let mut workers = Workers::default();
        let done = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        for _ in 0..clients {
            let (st, d, f) = (workers.stop_flag(), done.clone(), failed.clone());
            workers.add(ns.spawn(move || {
                let mut buf = vec![0u8; 32768];
                while !st.load(Ordering::Relaxed) {
                    match get(to, &mut buf) {
                        Ok(true) => d.fetch_add(1, Ordering::Relaxed),
                        _ => f.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
        Self { done, failed, _workers: workers }
    }

    /// Requests answered per second over `d` from now.
    fn rate_over(&self, d: Duration) -> f64 {
        let (n0, t0) = (self.done.load(Ordering::Relaxed), Instant::now());
        std::thread::sleep(d);
        (self.done.load(Ordering::Relaxed) - n0) as f64 / t0.elapsed().as_secs_f64()
    }
}

/// One request; Ok(true) when a whole 200 answer came back.
fn get(to: SocketAddr, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /items HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
    let mut n = 0;
    loop {
        let r = s.read(&mut buf[n..])?;
        if r == 0 || n + r == buf.len() {
            n += r;
            break;
        }
        n += r;
    }
    Ok(buf[..n].starts_with(b"HTTP/1.1 200 OK") && buf[..n].ends_with(b"]"))
}

/// The blocked half of a wakeup stack (frames below the `--` separator).
fn blocked_part(s: &Stack) -> &[crate::engine::stacks::Frame] {
    let i = s.frames.iter().position(|f| f.name == "--").unwrap_or(s.frames.len());
    &s.frames[..i]
}

fn waker_part(s: &Stack) -> &[crate::engine::stacks::Frame] {
    let i = s.frames.iter().position(|f| f.name == "--").map(|i| i + 1).unwrap_or(s.frames.len());
    &s.frames[i..]
}

/// A one-line rendering of frames given root first: the first `head` and
/// the last `tail` names.
fn brief<'a>(frames: impl Iterator<Item = &'a crate::engine::stacks::Frame>, head: usize, tail: usize) -> String {
    let names: Vec<&str> = frames.map(|f| f.name.as_str()).collect();
    if names.len() <= head + tail {
        return names.join(";");
    }
    format!("{};...;{}", names[..head].join(";"), names[names.len() - tail..].join(";"))
}

/// The resolver's wait as a blocked stack: blocked in poll(). The server
/// calls poll() nowhere else.
fn resolver_wait(frames: &[crate::engine::stacks::Frame]) -> bool {
    frames.iter().any(|f| matches!(f.name.as_str(), "do_sys_poll" | "__x64_sys_poll" | "__x64_sys_ppoll"))
}

/// The functions the server's worker calls on the way to the resolver's
/// poll(), in order. glibc's resolver is built without frame pointers, so a
/// frame-pointer walk loses them ("78% in poll(), and no code that calls
/// it"); the unwind tables find them.
const RESOLVER_CHAIN: [&str; 4] = ["worker", "serve_connection", "log_request", "getnameinfo"];

/// Whether the stack passes through [`RESOLVER_CHAIN`] in order and then
/// into a user-space poll.
fn through_resolver_chain(frames: &[crate::engine::stacks::Frame]) -> bool {
    let mut at = 0;
    for name in RESOLVER_CHAIN {
        match frames[at..].iter().position(|f| f.name == name) {
            Some(i) => at += i + 1,
            None => return false,
        }
    }
    frames[at..].iter().any(|f| f.kind == crate::engine::stacks::FrameKind::User && f.name.contains("poll"))
}

/// The user frames of a stack from `worker` down, as one line.
fn user_chain(frames: &[crate::engine::stacks::Frame]) -> String {
    let user: Vec<&str> =
        frames.iter().filter(|f| f.kind == crate::engine::stacks::FrameKind::User).map(|f| f.name.as_str()).collect();
    let from = user.iter().position(|n| *n == "worker").unwrap_or(0);
    user[from..].join(";")
}

/// The UDP receive path in a waker stack.
fn udp_receive(frames: &[crate::engine::stacks::Frame]) -> bool {
    frames.iter().any(|f| {
        matches!(
            f.name.as_str(),
            "udp_rcv"
                | "__udp4_lib_rcv"
                | "udp_unicast_rcv_skb"
                | "udp_queue_rcv_skb"
                | "udp_queue_rcv_one_skb"
                | "__udp_enqueue_schedule_skb"
        )
    })
}

/// Runs the lab; returns the exit status.
pub fn run(a: &DnsLabArgs) -> anyhow::Result<i32> {
    check(a)?;
    features::require_tracing_privileges()?;
    let pair = Pair::new()?;
    let dir = std::env::temp_dir().join(format!("sonde-lab-dns-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let responder = Responder::start(&pair.b, a.delay)?;
    let server = Server::start(&pair.b, &dir, a.workers)?;
    let to: SocketAddr = format!("{}:{PORT}", pair.b4).parse()?;
    let load = Load::start(&pair.a, to, a.clients);
    let pid = server.pid();
    eprintln!(
        "lab: HTTP server pid {pid} ({} workers) logs each client's host name via getnameinfo(); its resolver answers after {:?}-{:?}; {} clients send requests",
        a.workers, a.delay.0, a.delay.1, a.clients
    );
    let m = match measure(a, pid, &responder, &load)? {
        Ok(m) => m,
        Err(status) => return Ok(status),
    };
    let sample_log =
        std::fs::read_to_string(dir.join("access.log")).ok().and_then(|l| l.lines().next().map(str::to_string));
    drop(load);
    drop(server);
    drop(responder);
    report(a, pid, &m, sample_log)
}

/// The flame graphs each tool writes.
fn outputs(a: &DnsLabArgs, tool: &str) -> Vec<PathBuf> {
    vec![PathBuf::from(format!("{}-{tool}.html", a.prefix)), PathBuf::from(format!("{}-{tool}.svg", a.prefix))]
}

/// Checks the options and the output paths (usage errors, before anything starts).
fn check(a: &DnsLabArgs) -> anyhow::Result<()> {
    if a.duration < Duration::from_secs(1) || a.duration > Duration::from_secs(600) {
        return Err(usage(format!("-d {:?}: pick 1s to 600s", a.duration)));
    }
    if a.workers == 0 || a.workers > 64 || a.clients == 0 || a.clients > 1000 {
        return Err(usage("--workers takes 1 to 64 and --clients 1 to 1000"));
    }
    for tool in ["profile", "offcpu", "wakeup"] {
        crate::engine::stacktool::check_outputs(&outputs(a, tool))?;
    }
    Ok(())
}

/// What the three tools and the request counts measured.
struct Measured {
    p: profile::Outcome,
    o: offcpu::Outcome,
    o_held: u64,
    w: offcpu::Outcome,
    w_held: u64,
    cpu_sampled: f64,
    cpu_proc: f64,
    slow_rate: f64,
    fast_rate: f64,
    failed: u64,
    answered: u64,
}

/// profile, offcpu and wakeup on the server in turn, then the request rate
/// once the resolver answers at once; Err(status) when interrupted.
fn measure(a: &DnsLabArgs, pid: u32, responder: &Responder, load: &Load) -> anyhow::Result<Result<Measured, i32>> {
    std::thread::sleep(Duration::from_millis(500));
    let phase = || RunControl::new(Some(a.duration));
    let ticks0 = cpu_ticks(pid)?;
    let t0 = Instant::now();
    let done0 = load.done.load(Ordering::Relaxed);

    // 1. profile: little CPU.
    let c = phase()?;
    let ms = format!("{}ms", a.duration.as_millis());
    let o_flags = |tool: &str| outputs(a, tool).into_iter().flat_map(|p| ["-o".into(), p.into_os_string()]);
    let pargs: ProfileArgs = cli::parse(
        "profile",
        ["-p", &pid.to_string(), "-F", &a.frequency.to_string(), "-d", &ms, "--top", "10"]
            .map(std::ffi::OsString::from)
            .into_iter()
            .chain(o_flags("profile")),
    )?;
    let p = profile::run_with(&pargs, &c, || {})?;
    let cpu_sampled = p.totals.samples as f64 / (a.frequency as f64 * a.duration.as_secs_f64());
    if let Some(s) = interrupted(&c) {
        return Ok(Err(s));
    }

    // 2. offcpu: blocked in the resolver's poll().
    let oargs = |tool: &str| -> anyhow::Result<OffcpuArgs> {
        cli::parse(
            tool,
            ["-p", &pid.to_string(), "-d", &ms, "--per-process", "--top", "10"]
                .map(std::ffi::OsString::from)
                .into_iter()
                .chain(o_flags(tool)),
        )
    };
    // offcpu, or with `wake` wakeup, and the responder's hold time over its window.
    let blocked_run = |wake: bool| -> anyhow::Result<(offcpu::Outcome, u64, RunControl)> {
        let c = phase()?;
        let held = Held::new(responder);
        let out = offcpu::run_with(&oargs(if wake { "wakeup" } else { "offcpu" })?, &c, wake, || held.start())?;
        Ok((out, held.in_window(a.duration), c))
    };
    let (o, o_held, c) = blocked_run(false)?;
    if let Some(s) = interrupted(&c) {
        return Ok(Err(s));
    }
    // 3. wakeup: woken by the UDP receive path.
    let (w, w_held, c) = blocked_run(true)?;
    if let Some(s) = interrupted(&c) {
        return Ok(Err(s));
    }
    let slow_elapsed = t0.elapsed().as_secs_f64();
    let slow_rate = (load.done.load(Ordering::Relaxed) - done0) as f64 / slow_elapsed;
    let cpu_proc = (cpu_ticks(pid)? - ticks0) as f64 / ticks_per_sec() / slow_elapsed;

    // 4. The fix: the resolver answers at once.
    responder.set_delay(Duration::ZERO, Duration::ZERO);
    std::thread::sleep(Duration::from_millis(300));
    let fast_rate = load.rate_over(a.duration);
    let failed = load.failed.load(Ordering::Relaxed);
    let answered = responder.answered.load(Ordering::Relaxed);
    Ok(Ok(Measured { p, o, o_held, w, w_held, cpu_sampled, cpu_proc, slow_rate, fast_rate, failed, answered }))
}

/// The findings from what was measured, checked and printed; 0 when every
/// check passes.
fn report(a: &DnsLabArgs, pid: u32, m: &Measured, sample_log: Option<String>) -> anyhow::Result<i32> {
    let Measured { p, o, o_held, w, w_held, cpu_sampled, cpu_proc, slow_rate, fast_rate, failed, answered } = m;
    let (o_held, w_held, cpu_sampled, cpu_proc, slow_rate, fast_rate, failed, answered) =
        (*o_held, *w_held, *cpu_sampled, *cpu_proc, *slow_rate, *fast_rate, *failed, *answered);
    let blocked = weight_where(&o.stacks, |_| true);
    let rw = weight_where(&o.stacks, |s| resolver_wait(&s.frames));
    let chain = weight_where(&o.stacks, |s| resolver_wait(&s.frames) && through_resolver_chain(&s.frames));
    let top_chain = o
        .stacks
        .iter()
        .filter(|s| through_resolver_chain(&s.frames))
        .max_by_key(|s| s.count)
        .map(|s| user_chain(&s.frames))
        .unwrap_or_default();
    let udp = weight_where(&w.stacks, |s| resolver_wait(blocked_part(s)) && udp_receive(waker_part(s)));
    let rw_w = weight_where(&w.stacks, |s| resolver_wait(blocked_part(s)));
    let pct = |x: u64, of: u64| 100.0 * x as f64 / of.max(1) as f64;
    let top_cpu = p.stacks.iter().max_by_key(|s| s.count).map(|s| brief(s.frames.iter(), 2, 5)).unwrap_or_default();
    let top_off = o.stacks.iter().max_by_key(|s| s.count).map(|s| brief(s.frames.iter(), 2, 5)).unwrap_or_default();
    let top_wake = w
        .stacks
        .iter()
        .filter(|s| resolver_wait(blocked_part(s)))
        .max_by_key(|s| s.count)
        .map(|s| brief(waker_part(s).iter().rev(), 3, 6))
        .unwrap_or_default();
    let speedup = fast_rate / slow_rate.max(0.001);
    let checks = [
        ("profile: the server uses less than half a core", cpu_proc < 0.5 && cpu_sampled < 0.5),
        ("offcpu: most blocked time is the resolver's wait in poll()", pct(rw, blocked) >= 70.0),
        ("offcpu: the wait in poll() matches the responder's delays (-20%..+10%)", near(rw, o_held)),
        (
            "offcpu: poll()'s callers are named, worker -> serve_connection -> log_request -> getnameinfo",
            pct(chain, rw) >= 90.0,
        ),
        (
            "wakeup: the resolver's wait is woken from the UDP receive path",
            near(rw_w, w_held) && pct(udp, rw_w) >= 90.0,
        ),
        ("without the delay the request rate rises at least 3x", speedup >= 3.0 && failed == 0),
    ];
    let ok = checks.iter().all(|c| c.1);
    if a.json {
        let j = serde_json::json!({
            "type": "lab_dns", "server_pid": pid, "delay_ms": [a.delay.0.as_millis() as u64, a.delay.1.as_millis() as u64],
            "rate_with_delay": slow_rate, "rate_without_delay": fast_rate, "speedup": speedup, "failed_requests": failed,
            "dns_answers": answered,
            "cpu_cores_proc": cpu_proc, "cpu_cores_sampled": cpu_sampled,
            "blocked_us": blocked, "resolver_wait_us": rw, "responder_delay_us": o_held,
            "resolver_chain_us": chain, "resolver_chain": top_chain,
            "wakeup_resolver_us": rw_w, "wakeup_udp_us": udp, "wakeup_responder_delay_us": w_held,
            "checks": checks.iter().map(|(n, v)| serde_json::json!({"check": n, "ok": v})).collect::<Vec<_>>(),
            "ok": ok,
        });
        crate::outln!("{j}")?;
    } else {
        crate::outln!("with a {:?}-{:?} resolver: {slow_rate:.1} requests/s; the server used {:.1}% of a core ({:.1}% by /proc/PID/stat)", a.delay.0, a.delay.1, 100.0 * cpu_sampled, 100.0 * cpu_proc)?;
        crate::outln!("  profile  top CPU stack: {top_cpu}")?;
        crate::outln!(
            "  offcpu   {:.1}% of {:.1} s blocked is in poll(): {:.2} s, the responder held queries {:.2} s; top: {top_off}",
            pct(rw, blocked),
            blocked as f64 / 1e6,
            rw as f64 / 1e6,
            o_held as f64 / 1e6
        )?;
        crate::outln!("  offcpu   {:.1}% of the wait in poll() is under its callers: {top_chain}", pct(chain, rw))?;
        crate::outln!(
            "  wakeup   {:.1}% of {:.2} s in poll() was woken from the UDP receive path (responder held {:.2} s); waker: {top_wake}",
            pct(udp, rw_w),
            rw_w as f64 / 1e6,
            w_held as f64 / 1e6
        )?;
        if let Some(l) = sample_log {
            crate::outln!("  access log: {l}")?;
        }
        crate::outln!("without the delay: {fast_rate:.1} requests/s ({speedup:.1}x); {failed} failed requests; {answered} DNS answers in all")?;
        for (n, v) in &checks {
            crate::outln!("{} {n}", if *v { "ok  " } else { "FAIL" })?;
        }
        crate::outln!("flame graphs: {}-{{profile,offcpu,wakeup}}.{{html,svg}}", a.prefix)?;
    }
    Ok(if ok { 0 } else { 1 })
}

/// The responder's hold time over one tool's tracing window: sampled from
/// the moment tracing starts to when the tool returns, scaled to the window.
struct Held<'a> {
    r: &'a Responder,
    at: std::cell::Cell<Option<(u64, Instant)>>,
}

impl<'a> Held<'a> {
    fn new(r: &'a Responder) -> Self {
        Self { r, at: std::cell::Cell::new(None) }
    }

    fn start(&self) {
        self.at.set(Some((self.r.held_ns.load(Ordering::Relaxed), Instant::now())));
    }

    /// Microseconds held in a window of `d`.
    fn in_window(&self, d: Duration) -> u64 {
        let Some((h0, t0)) = self.at.get() else { return 0 };
        let held = self.r.held_ns.load(Ordering::Relaxed) - h0;
        let f = d.as_secs_f64() / t0.elapsed().as_secs_f64();
        (held as f64 * f.min(1.0) / 1e3) as u64
    }
}

/// Measured blocked time against the responder's: -20% (blocked periods
/// under way when tracing started are not counted) to +10%.
fn near(measured_us: u64, held_us: u64) -> bool {
    let (m, h) = (measured_us as f64, held_us as f64);
    h > 0.0 && m >= 0.8 * h && m <= 1.1 * h
}

fn interrupted(c: &RunControl) -> Option<i32> {
    match c.should_stop() {
        Some(Stop::Interrupted) => Some(130),
        Some(Stop::Terminated) => Some(143),
        _ => None,
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &s[s.rfind(')').context("parsing /proc/PID/stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf takes no pointers.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}
