//! `sonde lab why`: a service whose time has a known mix, and `sonde why`
//! recovering each share and naming each cause. The service
//! (tests/workloads/whylab.c, embedded) runs in a network namespace: two
//! threads spin in a cpu cgroup with a quota of half a CPU (on CPU, then
//! throttled), one calls a peer in a second namespace across a link that
//! loses a share of its packets (blocked on the network, retransmission
//! timeouts), one does O_DIRECT reads of a file (disk), one waits for a mutex
//! that another thread holds 30 ms of every 31 (lock). The service measures
//! each thread's own split over the same window (its CPU clock, its time
//! inside the blocking call); the kernel counts the cgroup's throttled time
//! and the namespaces' retransmission timeouts. The lab prints sonde's share
//! beside each, and the cause sonde named.
use std::{
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context};
use clap::Args;

use super::{
    netns::Pair,
    retrans::{drop_random, undrop},
    traffic::{Mode, Server},
};
use crate::{
    engine::{
        cli,
        error::usage,
        features,
        run::{RunControl, Stop},
    },
    tools::why::{self, Class, WhyArgs},
};

/// The service, built static by build.rs.
const WHYLAB: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/whylab"));
/// The peer's port.
const PORT: u16 = 5010;
/// The spinners' quota: half a CPU (of a 100 ms period).
const QUOTA_US: u64 = 50_000;
const PERIOD_US: u64 = 100_000;
/// The spinners' group's CPU weight, cgroup v1 (`cpu.shares`, 1,024 a
/// task at nice 0) and v2 (`cpu.weight`, 100 by default, 10,000 at most).
const SHARES: u64 = 102_400;
const WEIGHT: u64 = 10_000;

/// Options of `sonde lab why`.
#[derive(Debug, Args)]
pub struct WhyLabArgs {
    /// Seconds `sonde why` accounts for the service.
    #[arg(short = 'd', long, default_value_t = 5)]
    pub seconds: u64,
    /// Packets lost on the way to the peer, percent.
    #[arg(long, default_value_t = 20)]
    pub loss: u32,
    /// The page with each thread's timeline.
    #[arg(short = 'o', long = "output", default_value = "sonde-lab-why.html")]
    pub output: PathBuf,
}

/// A cpu cgroup of the lab's with the quota, removed when dropped (v1's
/// `cpu` hierarchy; on cgroup v2 a threaded child of a group of the lab's,
/// so that single threads can be moved into it).
struct QuotaGroup {
    /// Removed in this order.
    dirs: Vec<PathBuf>,
    /// Where thread ids are written.
    threads_file: PathBuf,
    /// Its cpu.stat and the throttled key's unit in ns.
    stat: (PathBuf, &'static str, f64),
    /// Relative to the cpu controller's mount.
    path: String,
}

/// Sets a group's CPU weight, or says why not: the lab still runs, its
/// spinners less sure to reach the quota on a busy host.
fn weigh(file: &Path, value: u64) {
    if let Err(e) = std::fs::write(file, value.to_string()) {
        eprintln!(
            "lab: could not set {} to {value} ({e}): on a busy host the spinners may not reach their quota",
            file.display()
        );
    }
}

impl QuotaGroup {
    fn new(service_pid: u32) -> anyhow::Result<QuotaGroup> {
        let name = format!("sonde-lab-why-{}", std::process::id());
        let root = crate::engine::cgroup::cpu_root().ok_or_else(|| {
            crate::engine::error::env("no cpu cgroup controller is mounted; lab why needs one (v1 or v2)")
        })?;
        let root = Path::new(&root);
        if root.join("cpu.cfs_quota_us").exists() {
            let dir = root.join(&name);
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let g = QuotaGroup {
                dirs: vec![dir.clone()],
                threads_file: dir.join("tasks"),
                stat: (dir.join("cpu.stat"), "throttled_time", 1.0),
                path: format!("/{name}"),
            };
            std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())?;
            std::fs::write(dir.join("cpu.cfs_quota_us"), QUOTA_US.to_string())?;
            // Weighted far above the host's other work, so that the
            // spinners get their quota and are throttled as built on a busy
            // host too (beside a test suite they got 2.6% of a CPU, never
            // reached the quota); the quota caps what the weight can take.
            weigh(&dir.join("cpu.shares"), SHARES);
            return Ok(g);
        }
        // cgroup v2: the service in a domain group, the spinners in its
        // threaded child (the cpu controller works in threaded mode).
        let parent = root.join(&name);
        std::fs::create_dir(&parent).with_context(|| format!("creating {}", parent.display()))?;
        let child = parent.join("quota");
        let mut g = QuotaGroup {
            dirs: vec![parent.clone()],
            threads_file: child.join("cgroup.threads"),
            stat: (child.join("cpu.stat"), "throttled_usec", 1000.0),
            path: format!("/{name}/quota"),
        };
        let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
        if !enabled.split_whitespace().any(|c| c == "cpu") {
            return Err(crate::engine::error::env(format!(
                "the cpu controller is not enabled for {}'s children (cgroup.subtree_control); enable it (echo +cpu > {}/cgroup.subtree_control) to run lab why",
                root.display(),
                root.display()
            )));
        }
        std::fs::write(parent.join("cgroup.procs"), service_pid.to_string())?;
        std::fs::create_dir(&child)?;
        g.dirs.insert(0, child.clone());
        std::fs::write(child.join("cgroup.type"), "threaded")?;
        std::fs::write(parent.join("cgroup.subtree_control"), "+cpu")?;
        std::fs::write(child.join("cpu.max"), format!("{QUOTA_US} {PERIOD_US}"))?;
        // As cpu.shares above, at both levels (the quota caps it; the
        // service's other threads in the parent only block).
        weigh(&parent.join("cpu.weight"), WEIGHT);
        weigh(&child.join("cpu.weight"), WEIGHT);
        Ok(g)
    }

    fn add(&self, tid: u32) -> anyhow::Result<()> {
        std::fs::write(&self.threads_file, tid.to_string())
            .with_context(|| format!("moving thread {tid} into {}", self.path))
    }

    /// Its throttled time so far, ns.
    fn throttled(&self) -> f64 {
        let text = std::fs::read_to_string(&self.stat.0).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix(self.stat.1)).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0)
            * self.stat.2
    }
}

impl Drop for QuotaGroup {
    fn drop(&mut self) {
        for d in &self.dirs {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// The service's process, killed however the lab ends.
struct Service(std::process::Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The service's own split of one thread over the window.
#[derive(Debug, Clone)]
struct Own {
    name: String,
    tid: u32,
    wall: f64,
    call: f64,
    cpu: f64,
}

/// A scratch directory on a file system that takes O_DIRECT (not tmpfs).
fn direct_dir() -> anyhow::Result<PathBuf> {
    for base in ["/var/tmp", "/tmp"] {
        let d = Path::new(base).join(format!("sonde-lab-why-{}", std::process::id()));
        std::fs::create_dir_all(&d)?;
        let probe = d.join("probe");
        let ok = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new().create(true).write(true).custom_flags(libc::O_DIRECT).open(&probe).is_ok()
        };
        let _ = std::fs::remove_file(&probe);
        if ok {
            return Ok(d);
        }
        let _ = std::fs::remove_dir_all(&d);
    }
    bail!("neither /var/tmp nor /tmp takes O_DIRECT reads (tmpfs?); lab why needs a disk-backed directory")
}

fn pct(n: f64, of: f64) -> f64 {
    if of > 0.0 {
        100.0 * n / of
    } else {
        0.0
    }
}

/// Runs the lab; returns the exit status.
pub fn run(a: &WhyLabArgs) -> anyhow::Result<i32> {
    if !(2..=120).contains(&a.seconds) {
        return Err(usage(format!("-d {}: pick 2 to 120 seconds", a.seconds)));
    }
    if !(1..=50).contains(&a.loss) {
        return Err(usage(format!("--loss {}: pick 1 to 50 percent", a.loss)));
    }
    crate::engine::output::pick(&a.output, "lab why", &[(".html", ())])?;
    features::require_tracing_privileges()?;
    super::netns::require_tools(&["ip", "nft"])?;
    let pair = Pair::new()?;
    let peer: SocketAddr = format!("{}:{PORT}", pair.b4).parse()?;
    let _server = Server::start(&pair.b, peer, Mode::Echo { req: 1, resp: 1 })?;
    drop_random(&pair.b, "sondewhylab", &format!("tcp dport {PORT}"), a.loss)?;
    let dir = direct_dir()?;
    let _rm = super::RemoveDir(dir.clone());
    let data = dir.join("data");
    {
        let mut f = std::fs::File::create(&data)?;
        let block: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
        for _ in 0..64 {
            f.write_all(&block)?;
        }
        f.sync_all()?;
    }
    let bin = super::install(&dir, "whylab", WHYLAB)?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", &pair.a.name])
        .arg(&bin)
        .args([&pair.b4, &PORT.to_string()])
        .arg(&data)
        .arg((a.seconds + 60).to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the service")?;
    let pid = child.id();
    let (mut out, go) = (BufReader::new(child.stdout.take().expect("stdout")), child.stdin.take().expect("stdin"));
    let service = Service(child);
    let mut line = String::new();
    out.read_line(&mut line)?;
    let crunch: Vec<u32> = line.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    if crunch.len() != 2 {
        bail!("the service did not start: {line:?}");
    }
    line.clear();
    out.read_line(&mut line)?;
    let group = QuotaGroup::new(pid)?;
    for (cpu, tid) in crunch.iter().enumerate() {
        group.add(*tid)?;
        pin(*tid, cpu % num_cpus());
    }
    std::thread::sleep(Duration::from_millis(300));
    eprintln!(
        "lab: service (pid {pid}) in namespace {}: two spinners under a quota of {:.2} CPU ({}), a caller of {peer} across {}% loss, O_DIRECT reads of {}, a mutex waiter; `sonde why` for {} s",
        pair.a.name,
        QUOTA_US as f64 / PERIOD_US as f64,
        group.path,
        a.loss,
        data.display(),
        a.seconds
    );
    let wargs: WhyArgs = cli::parse(
        "why",
        [
            "-p".to_string(),
            pid.to_string(),
            "-d".into(),
            format!("{}s", a.seconds),
            "-o".into(),
            a.output.display().to_string(),
        ],
    )?;
    let ctl = RunControl::new(wargs.run.duration)?;
    // The service's split and the cgroup's count from the window's start
    // (once sonde traces) to its end (sonde returns just after it).
    let go = std::cell::RefCell::new(go);
    let mark = |m: &[u8]| {
        let mut g = go.borrow_mut();
        g.write_all(m).and_then(|_| g.flush())
    };
    let mark_err: std::cell::RefCell<Option<std::io::Error>> = std::cell::RefCell::new(None);
    let (mut thr0, mut thr1) = (0.0, 0.0);
    let mib0 = pair.a.mib()?;
    let outcome = why::run_with(
        &wargs,
        &ctl,
        || {
            thr0 = group.throttled();
            *mark_err.borrow_mut() = mark(b"go\n").err();
        },
        |_| Ok(()),
        || {
            thr1 = group.throttled();
            if let Err(e) = mark(b"end\n") {
                mark_err.borrow_mut().get_or_insert(e);
            }
        },
    )?;
    let mib1 = pair.a.mib()?;
    if let Some(e) = mark_err.into_inner() {
        bail!("marking the window's start in the service: {e}");
    }
    let mut own: Vec<Own> = Vec::new();
    for l in out.lines().map_while(Result::ok) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() == 7 && f[0] == "thread" {
            let n = |i: usize| f[i].parse::<f64>().unwrap_or(0.0);
            own.push(Own { name: f[1].to_string(), tid: f[2].parse().unwrap_or(0), wall: n(3), call: n(4), cpu: n(5) });
        }
        if own.len() == 6 {
            break;
        }
    }
    drop(go);
    drop(service);
    let _ = undrop(&pair.b, "sondewhylab");
    why::write_page(&outcome, &a.output, 10)?;
    let rtos = mib1.delta(&mib0).get("TcpExtTCPTimeouts");
    let throttled_group = thr1 - thr0;
    report(&outcome, &own, pid, &group.path, peer, &data, rtos, throttled_group, a)
}

/// Compares and prints; the exit status.
#[allow(clippy::too_many_arguments)]
fn report(
    outcome: &why::Outcome,
    own: &[Own],
    pid: u32,
    quota_path: &str,
    peer: SocketAddr,
    data: &Path,
    rtos: i64,
    throttled_group: f64,
    a: &WhyLabArgs,
) -> anyhow::Result<i32> {
    let Some(p) = outcome.report.processes.iter().find(|p| p.pid == pid) else {
        bail!("sonde why saw no thread of the service (pid {pid})");
    };
    let by_name = |n: &str| own.iter().find(|o| o.name == n);
    let thread = |tid: u32| p.threads.iter().find(|t| t.tid == tid);
    let mut ok = true;
    let mut rows: Vec<[String; 5]> = Vec::new();
    let mut row = |name: &str, what: &str, sonde: f64, built: String, cause: String, good: bool| {
        ok &= good;
        rows.push([
            name.to_string(),
            what.to_string(),
            format!("{sonde:.1}%"),
            built,
            format!("{cause}{}", if good { "" } else { "  MISMATCH" }),
        ]);
    };
    let mut crunch_throttled = 0.0;
    for n in ["crunch-1", "crunch-2"] {
        let (Some(o), Some(t)) = (by_name(n), by_name(n).and_then(|o| thread(o.tid))) else {
            row(n, "-", 0.0, "-".into(), "not seen".into(), false);
            continue;
        };
        let w = t.window_ns as f64;
        let on = (t.on_cpu_ns - t.on_cpu_steal_ns - t.on_cpu_irq_ns) as f64;
        row(
            n,
            "on CPU",
            pct(on, w),
            format!("{:.1}% (its CPU clock)", pct(o.cpu, o.wall)),
            String::new(),
            (pct(on, w) - pct(o.cpu, o.wall)).abs() <= 3.0,
        );
        crunch_throttled += t.throttled_ns as f64;
        let named = t.quota.as_ref().map(|q| q.path == quota_path).unwrap_or(false);
        let cause = t
            .quota
            .as_ref()
            .map(|q| format!("quota of {} ({:.2} CPU)", q.path, q.cpus))
            .unwrap_or_else(|| "no quota named".into());
        row(
            n,
            "throttled",
            pct(t.throttled_ns as f64, w),
            "(the cgroup's, below)".into(),
            cause,
            named && t.throttled_ns > 0,
        );
    }
    let w = p.threads.iter().map(|t| t.window_ns).max().unwrap_or(1) as f64;
    // The cgroup counts a throttle when it ends: one in progress at either
    // edge of the window moves up to a period per CPU between the window
    // and the next.
    let slack = 100.0 * 2.0 * (2.0 * PERIOD_US as f64 * 1e3) / w;
    row(
        "crunch-*",
        "throttled",
        pct(crunch_throttled, w),
        format!("{:.1}% the cgroup's cpu.stat (both CPUs)", pct(throttled_group, w)),
        format!("(a throttle is counted when it ends: within {slack:.0} points)"),
        (pct(crunch_throttled, w) - pct(throttled_group, w)).abs() <= slack,
    );
    // A blocking call's own time holds the blocked time, and the CPU time
    // and run-queue wait around it: sonde's class lies in between.
    let mut blocked_row = |name: &str, class: Class, cause_ok: &dyn Fn(&why::Thread) -> (String, bool)| {
        let (Some(o), Some(t)) = (by_name(name), by_name(name).and_then(|o| thread(o.tid))) else {
            row(name, class.name(), 0.0, "-".into(), "not seen".into(), false);
            return;
        };
        let w = t.window_ns as f64;
        let ours = pct(t.blocked_ns[class as usize] as f64, w);
        let call = pct(o.call, o.wall);
        let around = pct((t.on_cpu_ns + t.runqueue_ns + t.throttled_ns) as f64, w);
        let (cause, named) = cause_ok(t);
        row(
            name,
            class.name(),
            ours,
            format!("{call:.1}% in its calls*"),
            cause,
            named && ours <= call + 3.0 && ours >= call - around - 3.0 && ours > 5.0,
        );
    };
    let peer_s = peer.to_string();
    blocked_row("fetch", Class::Network, &|t| {
        let w = t.waits.iter().find(|w| w.class == Class::Network);
        let named = w.is_some_and(|w| w.remote.as_deref() == Some(peer_s.as_str()));
        // The loss shows as retransmissions on that connection.
        let r = w.and_then(|w| w.retransmits);
        (
            format!(
                "{}; {} on it; {rtos} retransmission timeouts in the namespace over the lab (TcpTimeouts)",
                w.map(|w| w.object.clone()).unwrap_or_default(),
                r.map(|r| r.text()).unwrap_or_else(|| "retransmissions not counted".into())
            ),
            named && r.is_some_and(|r| r.total > 0),
        )
    });
    let data_s = data.display().to_string();
    blocked_row("scan", Class::Disk, &|t| {
        let w = t.waits.iter().find(|w| w.class == Class::Disk);
        (w.map(|w| w.object.clone()).unwrap_or_default(), w.is_some_and(|w| w.object == data_s))
    });
    let holder = by_name("holder").map(|o| o.tid).unwrap_or(0);
    blocked_row("locker", Class::Lock, &|t| {
        let w = t.waits.iter().find(|w| w.class == Class::Lock);
        (
            w.map(|w| format!("{}{}", w.object, w.waker_text())).unwrap_or_default(),
            w.is_some_and(|w| w.waker_tid == holder),
        )
    });
    let widths: Vec<usize> = (0..5).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    crate::outln!("{}", outcome.report.text(10))?;
    crate::outln!("\nthe service's own split beside sonde's (of each thread's time in the window):")?;
    for r in &rows {
        crate::outln!(
            "  {:<w0$}  {:<w1$}  {:>w2$}  {:<w3$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        )?;
    }
    crate::outln!("  * time inside its blocking calls holds its waits, and the CPU time and run-queue waits within them: sonde's class is at most that, and at least that less its time on CPU and runnable")?;
    crate::outln!(
        "{}\npage: {}",
        if ok {
            "every share within its bound of the service's own and the kernel's counts, every cause named"
        } else {
            "MISMATCH: a share or a cause differs (above)"
        },
        a.output.display()
    )?;
    if !ok {
        return Ok(1);
    }
    Ok(match outcome.stop {
        Stop::Interrupted => 130,
        _ => 0,
    })
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Pins thread `tid` to `cpu` (best effort: the spinners on different CPUs,
/// so the cgroup's throttled time, summed over its CPUs, is theirs summed).
fn pin(tid: u32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
