//! `sonde lab slow`: seed 003's second case. Short-lived loopback connections
//! closed by the client fill a narrow ephemeral port range with TIME_WAIT
//! sockets, so connect() spends its time in port selection
//! (`__inet_hash_connect`). `sonde slow syscall:connect --over 100us` shows
//! the kernel stacks inside the slow connects; then, with
//! net.ipv4.tcp_tw_reuse=1, ports in TIME_WAIT are reused and the slow calls
//! shrink. Both runs are shown side by side.
use std::{
    io::Read,
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use clap::Args;

use super::netns::{remove_stale, Netns, PREFIX};
use super::traffic::Workers;
use crate::{
    engine::{
        cli,
        error::usage,
        features,
        run::{duration_arg, RunControl, Stop},
        stacks::weight_under,
    },
    tools::funclatency::slow::{self, SlowArgs},
};

/// Options of `sonde lab slow`.
#[derive(Debug, Args)]
pub struct SlowLabArgs {
    /// How long `slow` watches connect() in each setting.
    #[arg(short = 'd', long, value_parser = duration_arg, default_value = "3s")]
    pub duration: Duration,
    /// The threshold given to `slow`.
    #[arg(long, value_parser = duration_arg, default_value = "100us")]
    pub over: Duration,
    /// Flame graphs go to PREFIX-{tw-reuse-0,tw-reuse-1}.{html,svg}.
    #[arg(long, default_value = "sonde-lab-slow")]
    pub prefix: String,
    /// Print the findings as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Ephemeral ports: a narrow range, so TIME_WAIT fills it in seconds.
const PORTS: (u32, u32) = (32768, 40959);

/// The client side: threads that connect to 127.0.0.1:8080 and close at
/// once (the client closes first, so its port goes to TIME_WAIT), again and
/// again; a server thread accepts and closes after the client's FIN.
struct Churn {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    _workers: Workers,
}

impl Churn {
    fn start(ns: &Netns) -> anyhow::Result<Self> {
        let mut workers = Workers::default();
        let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let addr: SocketAddr = "127.0.0.1:8080".parse()?;
        let l = ns.run(|| TcpListener::bind(addr))??;
        // A deep accept queue: an overflow costs a client a 1 s SYN retransmit.
        // SAFETY: listen() on our own listening socket, to raise its backlog.
        unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&l), 4096) };
        l.set_nonblocking(true)?;
        let st = workers.stop_flag();
        workers.add(std::thread::spawn(move || -> anyhow::Result<()> {
            let mut b = [0u8; 16];
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false)?;
                        s.set_read_timeout(Some(Duration::from_millis(200)))?;
                        let _ = s.read(&mut b);
                    }
                    Err(_) => std::thread::sleep(Duration::from_micros(50)),
                }
            }
            Ok(())
        }));
        for _ in 0..2 {
            let (st, o, f) = (workers.stop_flag(), ok.clone(), failed.clone());
            workers.add(ns.spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    match TcpStream::connect(addr) {
                        Ok(s) => {
                            o.fetch_add(1, Ordering::Relaxed);
                            drop(s);
                        }
                        Err(_) => {
                            f.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        Ok(Self { ok, failed, _workers: workers })
    }
}

/// One setting's findings.
struct Phase {
    calls: u64,
    slow_calls: u64,
    connects_ok: u64,
    connects_failed: u64,
    seconds: f64,
    samples: u64,
    in_port_selection: u64,
    top: String,
}

fn watch(a: &SlowLabArgs, churn: &Churn, tag: &str) -> anyhow::Result<(Phase, Stop)> {
    let sargs: SlowArgs = cli::parse(
        "slow",
        [
            "syscall:connect".to_string(),
            "-p".into(),
            std::process::id().to_string(),
            "-d".into(),
            format!("{}ns", a.duration.as_nanos()),
            "--max-probes".into(),
            "4".into(),
            "--over".into(),
            format!("{}ns", a.over.as_nanos()),
            "-F".into(),
            "999".into(),
            "-o".into(),
            format!("{}-{tag}.html", a.prefix),
            "-o".into(),
            format!("{}-{tag}.svg", a.prefix),
            "--top".into(),
            "10".into(),
            "--kernel-only".into(),
        ],
    )?;
    let ctl = RunControl::new(Some(a.duration))?;
    let (ok0, f0) = (churn.ok.load(Ordering::Relaxed), churn.failed.load(Ordering::Relaxed));
    let t0 = Instant::now();
    let out = slow::run_with(&sargs, &ctl, || {})?;
    let s = &out.summary;
    let samples: u64 = out.stacks.iter().map(|s| s.count).sum();
    let leafish =
        crate::engine::render::top(&out.stacks).0.into_iter().take(3).map(|r| r.name).collect::<Vec<_>>().join(", ");
    Ok((
        Phase {
            calls: s.calls,
            slow_calls: s.slow_calls,
            connects_ok: churn.ok.load(Ordering::Relaxed) - ok0,
            connects_failed: churn.failed.load(Ordering::Relaxed) - f0,
            seconds: t0.elapsed().as_secs_f64(),
            samples,
            in_port_selection: weight_under(&out.stacks, "__inet_hash_connect"),
            top: leafish,
        },
        out.stop,
    ))
}

/// Runs the lab; returns the exit status.
pub fn run(a: &SlowLabArgs) -> anyhow::Result<i32> {
    if a.duration < Duration::from_secs(1) || a.duration > Duration::from_secs(120) {
        return Err(usage(format!("-d {:?}: pick 1s to 120s", a.duration)));
    }
    for tag in ["tw-reuse-0", "tw-reuse-1"] {
        crate::engine::stacktool::check_outputs(&[PathBuf::from(format!("{}-{tag}.svg", a.prefix))])?;
    }
    features::require_tracing_privileges()?;
    remove_stale();
    let ns = Netns::create(&format!("{PREFIX}{}-slow", std::process::id()))?;
    ns.sysctl("net.ipv4.ip_local_port_range", &format!("{} {}", PORTS.0, PORTS.1))?;
    ns.sysctl("net.ipv4.tcp_tw_reuse", "0")?;
    let churn = Churn::start(&ns)?;
    eprintln!(
        "lab: connect/close to 127.0.0.1:8080 in a loop, ephemeral ports {}-{} (TIME_WAIT fills them), tcp_tw_reuse=0",
        PORTS.0, PORTS.1
    );
    // Let TIME_WAIT fill the range.
    let t = Instant::now();
    while churn.ok.load(Ordering::Relaxed) < (PORTS.1 - PORTS.0) as u64 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let (before, stop) = watch(a, &churn, "tw-reuse-0")?;
    if stop != Stop::Done {
        return Ok(stop.exit_code());
    }
    ns.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
    eprintln!("lab: net.ipv4.tcp_tw_reuse=1 (ports in TIME_WAIT for over 1 s may be reused)");
    std::thread::sleep(Duration::from_millis(1500));
    let (after, stop) = watch(a, &churn, "tw-reuse-1")?;
    drop(churn);
    drop(ns);
    if stop != Stop::Done {
        return Ok(stop.exit_code());
    }
    let share = |x: u64, of: u64| x as f64 / of.max(1) as f64;
    let (sb, sa) = (share(before.slow_calls, before.calls), share(after.slow_calls, after.calls));
    let checks = [
        ("tw_reuse=0: most connects are slow", sb >= 0.5),
        (
            "tw_reuse=0: at least 80% of the samples in slow connects are in port selection (__inet_hash_connect)",
            before.samples > 0 && share(before.in_port_selection, before.samples) >= 0.8,
        ),
        ("tw_reuse=1: the share of slow connects at least halves", sa <= sb / 2.0),
        (
            "tw_reuse=1: more connects succeed per second",
            after.connects_ok as f64 / after.seconds > before.connects_ok as f64 / before.seconds,
        ),
    ];
    let ok = checks.iter().all(|c| c.1);
    if a.json {
        let p = |x: &Phase| {
            serde_json::json!({"connect_calls": x.calls, "slow_calls": x.slow_calls, "connects_ok": x.connects_ok, "connects_failed": x.connects_failed,
                "seconds": x.seconds, "samples": x.samples, "samples_in_port_selection": x.in_port_selection})
        };
        let j = serde_json::json!({"type": "lab_slow", "over_ns": a.over.as_nanos() as u64, "tw_reuse_0": p(&before), "tw_reuse_1": p(&after),
            "checks": checks.iter().map(|(n, v)| serde_json::json!({"check": n, "ok": v})).collect::<Vec<_>>(), "ok": ok});
        crate::outln!("{j}")?;
    } else {
        for (name, x) in [("tcp_tw_reuse=0", &before), ("tcp_tw_reuse=1", &after)] {
            crate::outln!(
                "{name}: {} of {} connect() calls over {:?} ({:.0}%); {:.0} connects/s succeeded, {:.0}/s failed; {:.0}% of {} samples in __inet_hash_connect; top: {}",
                x.slow_calls,
                x.calls,
                a.over,
                100.0 * share(x.slow_calls, x.calls),
                x.connects_ok as f64 / x.seconds,
                x.connects_failed as f64 / x.seconds,
                100.0 * share(x.in_port_selection, x.samples),
                x.samples,
                x.top
            )?;
        }
        for (n, v) in &checks {
            crate::outln!("{} {n}", if *v { "ok  " } else { "FAIL" })?;
        }
        crate::outln!("flame graphs: {}-{{tw-reuse-0,tw-reuse-1}}.{{html,svg}}", a.prefix)?;
    }
    Ok(if ok { 0 } else { 1 })
}
