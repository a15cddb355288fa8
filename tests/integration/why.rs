//! `sonde why`: every thread's time against the kernel's own accounting
//! (schedstat, delay accounting, the cgroup's throttled time), sampled
//! beside the run and read at the window's own edges, and each wait's class,
//! object and waker against a workload whose threads each wait on one thing.
use std::collections::HashMap;

use super::common::*;

fn mono_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Each thread's samples: (CLOCK_MONOTONIC ns, [on CPU, run delay, block
/// I/O delay ticks, major page faults, bytes read from storage, voluntary
/// context switches]).
type Series = HashMap<String, Vec<(u64, [f64; 6])>>;

/// Per-thread counters read every 2 ms, with CLOCK_MONOTONIC stamps: a value
/// at any moment of the run is interpolated between its two neighbours.
struct Sampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: thread::JoinHandle<Series>,
}

impl Sampler {
    /// Samples schedstat (on CPU, run delay), delay accounting's block I/O
    /// ticks, major faults and the bytes read from storage (io's
    /// read_bytes) and voluntary context switches (each time it slept) of
    /// each thread of `pid`, and as "disk" the requests a block
    /// device completed and their time (its `stat`: reads and writes, ms).
    fn start(pid: u32, disk: Option<std::path::PathBuf>) -> Sampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let handle = thread::spawn(move || {
            // SCHED_FIFO: on a saturated host a sampler at normal priority
            // was seen to miss tens of ms around a window's edge.
            let p = libc::sched_param { sched_priority: 1 };
            // SAFETY: a valid sched_param for the calling thread.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
            let mut out: Series = HashMap::new();
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                let t = mono_ns();
                for e in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
                    let tid = e.file_name().to_string_lossy().into_owned();
                    let ss = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
                    let st = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                    let f: Vec<f64> = ss.split_whitespace().filter_map(|x| x.parse().ok()).collect();
                    // Field 42 of stat, counted after the command's closing parenthesis.
                    let rest: Vec<&str> = st.rsplit(')').next().unwrap_or("").split_whitespace().collect();
                    let blkio = rest.get(39).and_then(|x| x.parse().ok());
                    // Field 12 of stat: major faults.
                    let majflt = rest.get(9).and_then(|x| x.parse().ok());
                    // The bytes its reads asked of the block layer (io's
                    // read_bytes: counted per bio as it is submitted).
                    let io = std::fs::read_to_string(e.path().join("io")).unwrap_or_default();
                    let rb = io.lines().find_map(|l| l.strip_prefix("read_bytes:")).and_then(|v| v.trim().parse().ok());
                    let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
                    let nvcsw = status
                        .lines()
                        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                        .and_then(|v| v.trim().parse().ok());
                    if let (Some(a), Some(b), Some(c), Some(m), Some(r), Some(v)) =
                        (f.first(), f.get(1), blkio, majflt, rb, nvcsw)
                    {
                        out.entry(tid).or_default().push((t, [*a, *b, c, m, r, v]));
                    }
                }
                if let Some(d) = &disk {
                    let f: Vec<f64> = std::fs::read_to_string(d)
                        .unwrap_or_default()
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    if f.len() >= 8 {
                        out.entry("disk".into()).or_default().push((t, [f[0] + f[4], f[3] + f[7], 0.0, 0.0, 0.0, 0.0]));
                    }
                }
                thread::sleep(Duration::from_millis(2));
            }
            out
        });
        Sampler { stop, handle }
    }

    fn finish(self) -> Samples {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        Samples(self.handle.join().unwrap())
    }
}

struct Samples(Series);

impl Samples {
    /// Counter `i` of `who` at time `t`, interpolated; None outside the samples.
    fn at(&self, who: &str, i: usize, t: u64) -> Option<f64> {
        let s = self.0.get(who)?;
        let k = s.partition_point(|e| e.0 < t);
        if k == 0 || k >= s.len() {
            return None;
        }
        let (a, b) = (&s[k - 1], &s[k]);
        Some(a.1[i] + (b.1[i] - a.1[i]) * (t - a.0) as f64 / (b.0 - a.0) as f64)
    }

    /// The change of counter `i` of `who` over [from, to].
    fn delta(&self, who: &str, i: usize, from: u64, to: u64) -> Option<f64> {
        Some(self.at(who, i, to)? - self.at(who, i, from)?)
    }
}

fn field(t: &Value, k: &str) -> f64 {
    t[k].as_u64().unwrap_or_else(|| panic!("{k} in {t}")) as f64
}

fn blocked(t: &Value, class: &str) -> f64 {
    field(&t["blocked_ns"], class)
}

fn sum_of(t: &Value) -> f64 {
    ["on_cpu_ns", "runqueue_ns", "throttled_ns"].iter().map(|k| field(t, k)).sum::<f64>()
        + t["blocked_ns"].as_object().unwrap().values().map(|v| v.as_u64().unwrap() as f64).sum::<f64>()
}

/// A 64 MiB file of bytes nothing compresses, on the disk (synced): for
/// reads the block layer serves.
fn data_file(path: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    for _ in 0..64 {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
    path.to_path_buf()
}

/// Sets a sysctl for the life of the value, then puts the old one back.
struct Sysctl(&'static str, String);

impl Sysctl {
    fn set(path: &'static str, v: &str) -> Sysctl {
        let old = std::fs::read_to_string(path).unwrap().trim().to_string();
        std::fs::write(path, v).unwrap();
        Sysctl(path, old)
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0, &self.1);
    }
}

#[test]
fn why_accounts_every_thread_exactly_and_names_what_it_waits_for() {
    // Delay accounting's disk time is a loose oracle that a saturated host
    // skews further (seen: 3.12 s against sonde's 2.02 s beside `lab why`).
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    // Delay accounting, on before the workload's threads start: the
    // oracle for the direct-I/O thread's disk time.
    let _acct = Sysctl::set("/proc/sys/kernel/task_delayacct", "1");
    let bin = build_workload("whysplit", &["-O2", "-g", "-pthread"]);
    let dir = scratch_dir("why-split");
    let data = data_file(&dir.join("direct.dat"));
    let mut w = KillOnDrop(
        Command::new(&bin).arg(&data).arg("30").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap(),
    );
    let pid = w.0.id();
    let mut go = w.0.stdin.take().unwrap();
    let mut out = BufReader::new(w.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addrs: Vec<String> = line.split_whitespace().skip(1).map(str::to_string).collect();
    assert_eq!(addrs.len(), 2, "{line}");
    line.clear();
    out.read_line(&mut line).unwrap();
    let addrs2: Vec<String> = line.split_whitespace().skip(1).map(str::to_string).collect();
    assert!(line.starts_with("epoller ") && addrs2.len() == 2, "{line}");
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // The block device the data file is on (its whole disk's or its
    // partition's stat, as /sys/dev/block names it).
    let dev = {
        use std::os::unix::fs::MetadataExt;
        let d = std::fs::metadata(&data).unwrap().dev();
        format!("{}:{}", libc::major(d), libc::minor(d))
    };
    let stat = std::path::PathBuf::from(format!("/sys/dev/block/{dev}/stat"));
    let sampler = Sampler::start(pid, stat.exists().then(|| stat.clone()));
    thread::sleep(Duration::from_millis(100));
    // 4 s; once sonde runs (however long it took to start), the workload
    // starts its short-lived threads: they start and end in the window.
    let mut sonde = Command::new(SONDE)
        .args(["why", "-p", &pid.to_string(), "-d", "4s", "--json", "-o"])
        .arg(dir.join("why.html"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sout = drain(sonde.stdout.take().unwrap());
    let mut serr = BufReader::new(sonde.stderr.take().unwrap());
    let said = wait_for_stderr_line(&mut serr, "accounting for every thread's time");
    {
        use std::io::Write;
        go.write_all(b"go\n").unwrap();
    }
    let status = sonde.wait().unwrap();
    let run = std::process::Output { status, stdout: sout.join().unwrap(), stderr: said.into_bytes() };
    thread::sleep(Duration::from_millis(50));
    let samples = sampler.finish();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    let v = json_lines(&run.stdout);
    let s = summary(&v);
    let (start, end) = (s["start_monotonic_ns"].as_u64().unwrap(), s["end_monotonic_ns"].as_u64().unwrap());
    let window = (end - start) as f64;
    eprintln!("summary: {s}");
    assert!((3.9e9..5.0e9).contains(&window), "window {window}: {s}");
    let threads = of_type(&v, "thread");
    let by_comm = |c: &str| -> &Value {
        threads.iter().copied().find(|t| t["comm"] == c).unwrap_or_else(|| panic!("no thread {c}: {threads:?}"))
    };
    let tid_of = |c: &str| by_comm(c)["tid"].as_u64().unwrap();
    let mut report = Vec::new();

    // Every thread: its slots sum to its window; on CPU and runnable agree
    // with its schedstat over the same window (1% of it, and 5 ms); its
    // waits with the times it slept.
    for t in &threads {
        let (tid, comm) = (t["tid"].as_u64().unwrap().to_string(), t["comm"].as_str().unwrap());
        let win = field(t, "window_ns");
        assert!((sum_of(t) - win).abs() <= win * 0.001 + 1000.0, "{comm}: slots {} != window {win}: {t}", sum_of(t));
        let (from, to) = if t["started"] == true || t["exited"] == true {
            continue; // its own window: checked below
        } else {
            (start, end)
        };
        assert!((win - window).abs() < 1e6, "{comm}: window {win} of {window}");
        let tol = window * 0.01 + 5e6;
        let cpu = samples.delta(&tid, 0, from, to).unwrap_or_else(|| panic!("{comm}: no schedstat samples"));
        let rq = samples.delta(&tid, 1, from, to).unwrap();
        // The kernel's CPU time leaves out what the hypervisor took (steal)
        // and irq time: sonde reports both as parts of on_cpu_ns.
        let on = field(t, "on_cpu_ns") - field(t, "on_cpu_steal_ns") - field(t, "on_cpu_irq_ns");
        let waiting = field(t, "runqueue_ns") + field(t, "throttled_ns");
        report.push(format!("{comm}: on CPU {on:.0} vs {cpu:.0}, runnable {waiting:.0} vs {rq:.0}"));
        assert!((on - cpu).abs() <= tol, "{comm}: on CPU {on} ns, schedstat {cpu} ns (window {window}): {t}");
        assert!((waiting - rq).abs() <= tol, "{comm}: runnable {waiting} ns, schedstat run delay {rq} ns: {t}");
        // Its waits, one each time it slept (voluntary context switches;
        // the counter is sampled, and a wait open at the start began before).
        let slept = samples.delta(&tid, 5, from, to).unwrap_or_else(|| panic!("{comm}: no samples of its switches"));
        let waits: f64 = t["waits"].as_array().unwrap().iter().map(|w| field(w, "count")).sum();
        report.push(format!("{comm}: {waits} waits, slept {slept:.1} times"));
        assert!((waits - slept).abs() <= slept * 0.005 + 5.0, "{comm}: {waits} waits, slept {slept} times: {t}");
    }

    // The short-lived threads: started and ended in the window, which is
    // their life (200 ms on CPU and 300 ms asleep, longer on a busy host).
    for c in ["short-1", "short-2"] {
        let t = by_comm(c);
        assert!(t["started"] == true && t["exited"] == true, "{c}: {t}");
        let win = field(t, "window_ns");
        assert!((4.9e8..2.0e9).contains(&win), "{c}: window {win}");
        // 200 ms spinning (on CPU or, on a busy host, waiting for one),
        // then 300 ms asleep.
        let spin = field(t, "on_cpu_ns") + field(t, "runqueue_ns");
        assert!((1.95e8..4.0e8).contains(&spin), "{c}: its 200 ms of spinning: {t}");
        assert!((2.95e8..4.0e8).contains(&blocked(t, "sleep")), "{c}: its 300 ms asleep: {t}");
    }

    // The classes, by construction. A share of each thread's window.
    let share = |c: &str, class: &str| blocked(by_comm(c), class) / field(by_comm(c), "window_ns");
    let top_wait = |c: &str, class: &str| -> Value {
        by_comm(c)["waits"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["class"] == class)
            .max_by_key(|w| w["ns"].as_u64())
            .cloned()
            .unwrap_or_else(|| panic!("{c}: no {class} wait: {}", by_comm(c)))
    };
    let spinner = by_comm("spinner");
    assert!(
        (field(spinner, "on_cpu_ns") + field(spinner, "runqueue_ns")) / window > 0.99,
        "the spinner is on CPU or runnable: {spinner}"
    );
    assert!(share("sleeper", "sleep") > 0.9, "{}", by_comm("sleeper"));
    assert_eq!(top_wait("sleeper", "sleep")["woken_by"], "timer");
    assert!(share("reader", "pipe") > 0.9, "{}", by_comm("reader"));
    let w = top_wait("reader", "pipe");
    assert!(w["woken_by"] == "thread" && w["waker_tid"].as_u64() == Some(tid_of("writer")), "reader: {w}");
    assert!(w["object"].as_str().unwrap().starts_with("receive pipe:["), "{w}");
    assert!(share("waiter", "lock") > 0.8, "{}", by_comm("waiter"));
    let w = top_wait("waiter", "lock");
    assert!(w["woken_by"] == "thread" && w["waker_tid"].as_u64() == Some(tid_of("holder")), "waiter: {w}");
    assert_eq!(w["syscall"], "futex");
    // Who released it, by construction: the holder, in holder() (its
    // pthread_mutex_unlock), for all of the wait's time (each wait lasts
    // about 30 ms, above the 10 ms under which releases are sampled).
    let rows = w["released_by"].as_array().unwrap_or_else(|| panic!("no releasers: {w}"));
    assert!(rows.iter().all(|r| r["tid"].as_u64() == Some(tid_of("holder"))), "waiter's releaser: {w}");
    // A release the CPU's walks were spent for counts without a stack.
    let r = rows
        .iter()
        .find(|r| r["stack"].as_array().is_some_and(|s| !s.is_empty()))
        .unwrap_or_else(|| panic!("no stack walked: {w}"));
    let frames: Vec<&str> = r["stack"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    // glibc names it by an alias (__GI___pthread_mutex_unlock_usercnt).
    let unlock = frames.iter().position(|f| f.contains("pthread_mutex_unlock"));
    let holder = frames.iter().position(|f| f.starts_with("holder (") && f.contains("whysplit.c:"));
    assert!(matches!((unlock, holder), (Some(u), Some(h)) if u < h), "released in holder() by unlocking: {frames:?}");
    let rns: f64 = rows.iter().map(|r| r["ns"].as_f64().unwrap()).sum();
    let wns = w["ns"].as_f64().unwrap();
    report.push(format!("waiter: lock {wns:.0} ns, released by the holder {rns:.0} ns"));
    assert!((rns - wns).abs() <= wns * 0.05, "the holder's releases {rns} ns, the waits {wns} ns: {w}");
    assert!(share("receiver", "network") > 0.9, "{}", by_comm("receiver"));
    let w = top_wait("receiver", "network");
    assert_eq!(
        (w["local"].as_str(), w["remote"].as_str(), w["op"].as_str()),
        (Some(addrs[0].as_str()), Some(addrs[1].as_str()), Some("receive")),
        "{w}"
    );
    // In epoll_wait on a set of one socket: waiting on that peer, named.
    assert!(share("epoller", "network") > 0.9, "{}", by_comm("epoller"));
    let w = top_wait("epoller", "network");
    assert_eq!(
        (w["local"].as_str(), w["remote"].as_str(), w["syscall"].as_str()),
        (Some(addrs2[0].as_str()), Some(addrs2[1].as_str()), Some("epoll_wait")),
        "{w}"
    );
    assert!(w["object"].as_str().unwrap().ends_with("(epoll_wait on it alone)"), "{w}");
    // The other ends, by construction: the sender is a thread of the
    // workload's own, and so is the only holder of the stuck pipe's write
    // end (the second connection's cross-process peer is checked with the
    // retransmissions below).
    let me = serde_json::json!([{"pid": pid, "comm": "whysplit"}]);
    assert_eq!(top_wait("receiver", "network")["peers"], me, "{}", by_comm("receiver"));
    assert!(share("stuck", "pipe") > 0.999, "blocked throughout: {}", by_comm("stuck"));
    let w = top_wait("stuck", "pipe");
    assert!(w["open"] == true);
    assert_eq!(w["peers"], me, "the write end is the workload's own: {w}");
    assert!(share("whysplit", "poll") > 0.95, "main waits for work: {}", by_comm("whysplit"));
    assert_eq!(top_wait("whysplit", "poll")["syscall"], "epoll_wait");
    for c in ["writer", "holder", "sender"] {
        assert!(share(c, "sleep") > 0.8, "{c}: {}", by_comm(c));
    }
    // Real block I/O: the file, all of the thread's blocked time (the
    // rest is on CPU or runnable, checked against schedstat above), and
    // near delay accounting's block I/O delay (clock ticks of 10 ms). Near,
    // not equal: from Linux 6.12 a task that blocks may stay queued (EEVDF's
    // delayed dequeue), and a wait that ends before that dequeue never
    // starts delay accounting's clock; runs here put delay accounting 6%
    // above sonde's disk time to 15% below it (of the window: +3% .. -7%).
    let direct = by_comm("direct");
    let w = top_wait("direct", "disk");
    assert_eq!(w["object"].as_str(), Some(data.to_str().unwrap()), "{w}");
    // Its device's requests in the window (every process's), against the
    // device's own statistics over the same window: the count within 1%;
    // their time (start in the block layer to completion) never above the
    // statistics' and at most 20 us a request below: the tracepoint runs as
    // the completion begins, the statistics' clock stops after it has ended
    // the request's bios and woken their waiters (seen: 2-5 us a request,
    // 5-13% of this virtual disk's 35-45 us requests).
    if stat.exists() {
        let d = &w["device"];
        assert_eq!(d["dev"], dev, "{w}");
        let n = field(d, "reads") + field(d, "writes");
        let want = samples.delta("disk", 0, start, end).unwrap();
        assert!((n - want).abs() <= want * 0.01 + 5.0, "{dev}: {n} requests, its stat {want:.0}: {d}");
        let ms = field(d, "avg_ns") * n / 1e6;
        let want_ms = samples.delta("disk", 1, start, end).unwrap();
        let short_ns = (want_ms - ms) * 1e6 / n.max(1.0);
        assert!(
            (-1000.0..=20_000.0).contains(&short_ns),
            "{dev}: {ms:.1} ms in requests, its stat {want_ms:.1} ms ({short_ns:.0} ns a request short): {d}"
        );
        report.push(format!("{dev}: {n} requests vs {want:.0}, {ms:.1} ms vs {want_ms:.1} ms"));
    }
    // Of the device's requests, the thread's own: one a read (4 KiB
    // O_DIRECT: one bio, one request), as many as the kernel's count of the
    // bytes its reads submitted (io's read_bytes, per bio) over the window
    // says (within 1%); not one more than its reads (a read that completes
    // before the thread leaves the CPU is no wait: so at least its waits).
    let own = &w["device"]["own"];
    let (own_n, waits_n) = (field(own, "requests"), field(&w, "count"));
    let tid = direct["tid"].as_u64().unwrap().to_string();
    let bios = samples.delta(&tid, 4, start, end).unwrap() / 4096.0;
    let own_ns = field(own, "avg_ns") * own_n;
    report.push(format!(
        "direct: its own {own_n} requests ({bios:.0} by its read_bytes), {:.1} ms; {waits_n} waits, {:.1} ms",
        own_ns / 1e6,
        field(&w, "ns") / 1e6
    ));
    assert!((own_n - bios).abs() <= bios * 0.01 + 5.0, "its own requests against its read_bytes ({bios:.0}): {w}");
    // Within half a percent, and the completions the kernel skipped the
    // program for: short by 16 of 72,390 once in CI (this kernel runs no
    // tracing program while a thread of PID 1 is on the CPU, and a
    // completion interrupting one is not seen), and by 81 of 68,596 here
    // beside two spinners started and stopped every 8 s, no program
    // skipped, the device's count as short (not explained yet).
    let lost = &of_type(&v, "summary")[0]["lost"];
    report.push(format!(
        "direct: {} completions and {} events in all the kernel skipped sonde's program for",
        lost["disk_completions_missed"], lost["events_missed"]
    ));
    let missed = lost["disk_completions_missed"].as_u64().unwrap() as f64;
    assert!(own_n + missed + 5.0 + waits_n * 0.005 >= waits_n, "fewer requests than waits: {w}; lost: {lost}");
    let disk = blocked(direct, "disk");
    let all_blocked: f64 = direct["blocked_ns"].as_object().unwrap().values().map(|v| v.as_u64().unwrap() as f64).sum();
    let ticks = samples.delta(&direct["tid"].as_u64().unwrap().to_string(), 2, start, end).unwrap();
    report
        .push(format!("direct: disk {disk:.0} ns of {all_blocked:.0} blocked, delay accounting {:.0} ns", ticks * 1e7));
    assert!(disk > window * 0.1, "direct: {direct}");
    assert!(disk >= all_blocked * 0.99, "direct: disk {disk} of {all_blocked} ns blocked: {direct}");
    // (On a loaded host also 1.31 s of delay accounting against sonde's
    // 1.94 s in a 4 s window: the bound is a fifth of the window.)
    assert!((disk - ticks * 1e7).abs() <= window * 0.2, "direct: disk {disk} ns, delay accounting {} ns", ticks * 1e7);
    // The process line: every thread's sum, and a verdict naming a cause.
    let p = of_type(&v, "process")[0];
    assert_eq!(p["threads"].as_u64(), Some(threads.len() as u64));
    assert!(!p["verdict"].as_str().unwrap().is_empty(), "{p}");
    eprintln!("{}", report.join("\n"));
    check_page(&dir, &threads, window);
}

/// The page's colours (docs/why.md): on CPU, run queue, throttled, then the
/// blocked classes in the JSON's order.
const PALETTE: [(&str, &str); 12] = [
    ("on_cpu", "#2ca02c"),
    ("runqueue", "#ffbf00"),
    ("throttled", "#d62728"),
    ("disk", "#1f77b4"),
    ("network", "#9467bd"),
    ("lock", "#e377c2"),
    ("sleep", "#17becf"),
    ("poll", "#bcbd22"),
    ("pipe", "#8c564b"),
    ("memory", "#ff7f0e"),
    ("io_uring", "#393b79"),
    ("other", "#7f7f7f"),
];

/// Reads a screenshot back: for each box `id left top right bottom` (CSS
/// px, device px here), the share of its pixels nearest each palette colour
/// (within 40 of it), and of its columns with any such pixel.
const MEASURE: &str = r#"
import json, sys
from PIL import Image
im = Image.open(sys.argv[1]).convert("RGB")
pal = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in json.loads(sys.argv[2])]
out = {}
for box in sys.argv[3].split(";"):
    f = box.split()
    if len(f) != 5:
        continue
    l, t, r, b = (int(x) for x in f[1:])
    # Inside the timeline's one-pixel borders (left and right only).
    l, r = l + 1, r - 1
    counts = [0] * len(pal)
    cols = set()
    for y in range(t, b):
        for x in range(l, r):
            p = im.getpixel((x, y))
            d, k = min((sum((p[i] - c[i]) ** 2 for i in range(3)), k) for k, c in enumerate(pal))
            if d <= 40 * 40:
                counts[k] += 1
                cols.add(x)
    n = max((r - l) * (b - t), 1)
    out[f[0]] = {"shares": [c / n for c in counts], "columns": len(cols) / max(r - l, 1), "width": r - l}
print(json.dumps(out))
"#;

/// Added to a copy of the page: each timeline's box once laid out.
const PROBE: &str = "<script>window.addEventListener('load',function(){var o=[];\
    document.querySelectorAll('svg.tl').forEach(function(e){var r=e.getBoundingClientRect();\
    o.push(e.id+' '+[r.left,r.top,r.right,r.bottom].map(Math.round).join(' '));});\
    document.body.setAttribute('data-boxes',o.join(';'));});</script>";

/// Page faults reading a file, outside any system call: memory, for a
/// fault's read (tests/workloads/whyfault.c, a thread that maps a file with
/// read-ahead off and touches pages of it at random, dropping the file's
/// cache each round). Checked: its time sums to its window, on CPU and
/// runnable against its schedstat, its blocked time memory and named where
/// the kernel reads the page, its waits against the times it slept
/// (voluntary context switches), and its memory waits against its major
/// faults (majflt: at most three waits each, for the page's lock, then its
/// read; none when the read completed before the fault waited). Not against
/// delay accounting: for these waits its block I/O delay ran on through the
/// run queue after the wake-up (3.24 s against 1.80 s blocked and 1.43 s
/// runnable), and beside them the direct reads' did too (3.4 s against
/// 1.7 s).
#[test]
fn why_counts_a_page_faults_read_as_memory() {
    // Alone: its faults and cache drops load a CPU and the disk, and beside
    // them the split test's delay accounting ran far from its disk time.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let bin = build_workload("whyfault", &["-O2", "-g", "-pthread"]);
    let dir = scratch_dir("why-fault");
    let data = data_file(&dir.join("mapped.dat"));
    let w = KillOnDrop(Command::new(&bin).arg(&data).arg("30").stdout(Stdio::piped()).spawn().unwrap());
    let pid = w.0.id();
    thread::sleep(Duration::from_millis(300));
    let sampler = Sampler::start(pid, None);
    thread::sleep(Duration::from_millis(100));
    let run = Command::new(SONDE).args(["why", "-p", &pid.to_string(), "-d", "3s", "--json"]).output().unwrap();
    thread::sleep(Duration::from_millis(50));
    let samples = sampler.finish();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let v = json_lines(&run.stdout);
    let s = summary(&v);
    let (start, end) = (s["start_monotonic_ns"].as_u64().unwrap(), s["end_monotonic_ns"].as_u64().unwrap());
    let window = (end - start) as f64;
    let threads = of_type(&v, "thread");
    let t = threads.iter().find(|t| t["comm"] == "faulter").unwrap_or_else(|| panic!("no faulter: {threads:?}"));
    let tid = t["tid"].as_u64().unwrap().to_string();
    assert!((sum_of(t) - field(t, "window_ns")).abs() <= window * 0.001 + 1000.0, "{t}");
    let tol = window * 0.01 + 5e6;
    let cpu = samples.delta(&tid, 0, start, end).unwrap();
    let on = field(t, "on_cpu_ns") - field(t, "on_cpu_steal_ns") - field(t, "on_cpu_irq_ns");
    assert!((on - cpu).abs() <= tol, "on CPU {on}, schedstat {cpu}: {t}");
    let rq = samples.delta(&tid, 1, start, end).unwrap();
    assert!((field(t, "runqueue_ns") - rq).abs() <= tol, "runnable vs schedstat {rq}: {t}");
    let mem = blocked(t, "memory");
    // Outside system calls, memory; in them, the calls it makes (dropping
    // the cache waits for other CPUs' work: 20 ms of 1.46 s blocked, with
    // 46% of its time on CPU stolen by the hypervisor).
    let ws = t["waits"].as_array().unwrap();
    let sys = |w: &Value| w.get("syscall").and_then(|s| s.as_str()).map(str::to_string);
    let outside: f64 = ws.iter().filter(|w| sys(w).is_none()).map(|w| field(w, "ns")).sum();
    assert!(mem > 0.2 * window && mem >= 0.99 * outside, "memory {mem} of {outside} blocked outside system calls: {t}");
    for w in ws.iter().filter(|w| sys(w).is_some()) {
        let s = sys(w).unwrap();
        assert!(["fadvise64", "munmap", "mmap", "madvise"].contains(&s.as_str()), "a wait in {s}: {w}");
    }
    let top = t["waits"].as_array().unwrap().iter().filter(|w| w["class"] == "memory").max_by_key(|w| w["ns"].as_u64());
    let top = top.unwrap_or_else(|| panic!("no memory wait: {t}"));
    assert_eq!(top["memory"], "file_fault", "{top}");
    assert!(top["object"].as_str().unwrap().starts_with("a page fault reading a file ("), "{top}");
    // The waits of those kinds.
    let count = |keep: &dyn Fn(&Value) -> bool| ws.iter().filter(|w| keep(w)).map(|w| field(w, "count")).sum::<f64>();
    let waits = count(&|w| w["class"] == "memory");
    let every = count(&|_| true);
    let majflt = samples.delta(&tid, 3, start, end).unwrap();
    let slept = samples.delta(&tid, 5, start, end).expect("samples of the faulter's switches");
    eprintln!(
        "faulter: memory {mem:.0} ns of {window:.0} in {waits} waits of {every}, slept {slept:.0} times, {majflt:.0} major faults"
    );
    // Each time it slept, one wait (the counter is sampled: edges within
    // 20), and all but a few of those outside its system calls its faults'.
    assert!((every - slept).abs() <= slept * 0.005 + 20.0, "{every} waits, slept {slept} times: {t}");
    let in_calls = count(&|w| sys(w).is_some());
    assert!(waits >= (slept - in_calls) * 0.98 - 20.0, "{waits} memory waits, slept {slept} times: {t}");
    // Outside a system call it sleeps in its faults alone (a wake-up racing
    // the switch-out once made a hundred of them disk waits of no function).
    let odd = count(&|w| w["class"] != "memory" && sys(w).is_none());
    assert!(odd <= 3.0, "{odd} waits outside system calls not memory: {t}");
    // A fault sleeps for its page's lock, then its read, or not at all: a
    // major fault whose read completed before it waited (CI, with 47% of
    // the faulter's time on CPU stolen: 23,193 waits for 27,385 faults).
    assert!(waits <= majflt * 3.0 + 5.0, "{waits} memory waits, {majflt} major faults: {t}");
    drop(w);
}

/// `-o why.html` of the run above, as headless Chromium paints it: every
/// thread's timeline spans the window (or, for a thread that started or
/// exited in it, its share of the window), and the colours painted in it
/// are the thread's categories in the JSON lines of the same run.
fn check_page(dir: &std::path::Path, threads: &[&Value], window: f64) {
    let html = dir.join("why.html");
    let page = std::fs::read_to_string(&html).expect("the -o page");
    let probe = dir.join("probe.html");
    std::fs::write(&probe, page.replace("</body>", &format!("{PROBE}</body>"))).unwrap();
    let chromium = |args: &[&str], file: &std::path::Path| {
        Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000"])
            .arg("--virtual-time-budget=2000")
            .args(args)
            .arg(format!("file://{}", file.display()))
            .output()
            .expect("chromium (Debian package chromium)")
    };
    let out = chromium(&["--dump-dom"], &probe);
    let dom = String::from_utf8_lossy(&out.stdout);
    let boxes = dom.split("data-boxes=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("").to_string();
    assert!(!boxes.is_empty(), "no timelines laid out: {}", String::from_utf8_lossy(&out.stderr));
    let png = dir.join("why.png");
    let out = chromium(&[&format!("--screenshot={}", png.display())], &html);
    assert!(png.exists(), "screenshot: {}", String::from_utf8_lossy(&out.stderr));
    let colours: Vec<&str> = PALETTE.iter().map(|p| p.1).collect();
    let out = Command::new("/usr/bin/python3")
        .args(["-c", MEASURE])
        .arg(&png)
        .arg(serde_json::to_string(&colours).unwrap())
        .arg(&boxes)
        .output()
        .expect("/usr/bin/python3 (Debian package python3)");
    assert!(out.status.success(), "measuring (needs python3-pil): {}", String::from_utf8_lossy(&out.stderr));
    let m: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (mut seen, mut worst_cols, mut worst_share) = (0, 0.0f64, 0.0f64);
    for t in threads {
        let (tid, comm) = (t["tid"].as_u64().unwrap(), t["comm"].as_str().unwrap());
        let Some(b) = m.get(format!("tl-{tid}")) else { panic!("{comm}: no timeline on the page ({boxes})") };
        seen += 1;
        let cols = b["columns"].as_f64().unwrap();
        let life = field(t, "window_ns") / window;
        // Painted across its life in the window: all of it, or its share.
        worst_cols = worst_cols.max((cols - life).abs());
        assert!(
            (cols - life).abs() <= 0.03,
            "{comm}: painted {cols:.3} of the width, alive {life:.3} of the window: {b}; {t}; page {}",
            dir.display()
        );
        // Each category's share of the painted area is its share of the
        // window (the page's columns are samples of the same totals).
        for (k, (name, _)) in PALETTE.iter().enumerate() {
            let ns = if k < 3 { field(t, &format!("{name}_ns")) } else { blocked(t, name) };
            let want = ns / window;
            let got = b["shares"][k].as_f64().unwrap();
            worst_share = worst_share.max((got - want).abs());
            // Each column's split is drawn to whole pixels (24 rows): seen
            // within 0.009, with two more spinners beside the tests.
            assert!(
                (got - want).abs() <= 0.03,
                "{comm}: {name} painted {got:.3} of its timeline, {want:.3} of the window: {b}"
            );
        }
    }
    assert_eq!(seen, threads.len());
    eprintln!(
        "page: {seen} timelines read back from the screenshot ({}): painted width within {worst_cols:.4} of each thread's life, colours within {worst_share:.4} of its categories",
        png.display()
    );
}

/// A v1 `cpu` cgroup of the test's own (v2's `cpu.max` where v1 has none),
/// with a quota of `pct`% of one CPU; removed on drop.
struct CpuGroup {
    dir: std::path::PathBuf,
    v1: bool,
}

impl CpuGroup {
    fn new(name: &str, pct: u32) -> CpuGroup {
        let v1 = std::path::Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists();
        let root = if v1 { "/sys/fs/cgroup/cpu" } else { "/sys/fs/cgroup" };
        let dir = std::path::Path::new(root).join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        if v1 {
            std::fs::write(dir.join("cpu.cfs_period_us"), "100000").unwrap();
            std::fs::write(dir.join("cpu.cfs_quota_us"), (pct * 1000).to_string()).unwrap();
        } else {
            std::fs::write(dir.join("cpu.max"), format!("{} 100000", pct * 1000)).unwrap();
        }
        CpuGroup { dir, v1 }
    }

    /// The group's throttled time: (file, key, to ns).
    fn throttled(&self) -> (std::path::PathBuf, &'static str, f64) {
        if self.v1 {
            (self.dir.join("cpu.stat"), "throttled_time", 1.0)
        } else {
            (self.dir.join("cpu.stat"), "throttled_usec", 1000.0)
        }
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The group's throttled time so far, in ns.
fn throttled_now(g: &CpuGroup) -> f64 {
    let (file, key, scale) = g.throttled();
    let text = std::fs::read_to_string(&file).unwrap();
    let v: f64 = text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok()).unwrap();
    v * scale
}

#[test]
fn why_throttled_time_matches_the_cgroups_own() {
    // Two spinners: alone, so that both oracles count the same throttles
    // (beside other tests the cgroup's count came out 4% below sonde's:
    // 6.18 throttles a task when it next returns to user mode, later under
    // contention) and the timing tests keep theirs.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    // Two spinners, one pinned to each CPU, in a group with half a CPU of
    // quota, started and ended inside the run (`-- CMD`): the group's
    // throttled time (summed over its CPUs, each with one spinner) over
    // their lives is the sum of theirs. No window edge cuts a throttle.
    let g = CpuGroup::new("sonde-why", 50);
    let burn = build_workload("burn", &["-O2", "-g", "-fno-inline"]);
    // Each spins for 0.75 s of its own CPU time (some 3 s at a quarter of
    // a CPU each) and ends by itself: one killed by a signal while throttled
    // waited, runnable, on its throttled group for up to a period more,
    // which sonde counts as throttled and the group's cpu.stat did not
    // (6.18: seen 4.73 s against 4.59 s).
    let script = format!(
        "echo $$ > {}/cgroup.procs; taskset -c 0 {b} 0.75 & taskset -c 1 {b} 0.75 & wait",
        g.dir.display(),
        b = burn.display()
    );
    let before = throttled_now(&g);
    let run = Command::new(SONDE).args(["why", "-d", "30s", "--json", "--", "sh", "-c", &script]).output().unwrap();
    let group = throttled_now(&g) - before;
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    let v = json_lines(&run.stdout);
    let threads = of_type(&v, "thread");
    let burns: Vec<&&Value> = threads.iter().filter(|t| t["comm"] == "burn").collect();
    assert_eq!(burns.len(), 2, "{v:?}");
    let ours: f64 = threads.iter().map(|t| field(t, "throttled_ns")).sum();
    let life: f64 = burns.iter().map(|t| field(t, "window_ns")).sum();
    eprintln!("throttled: sonde {ours:.0} ns, the cgroup {group:.0} ns, over {life:.0} ns of the spinners' lives");
    // Half a CPU of quota for two spinners: each is throttled about three
    // quarters of its life, less where it waits for a CPU anyway (on a host
    // busy with other tests and two more spinners, 4% of it was seen): some
    // throttling, so that the comparison below is not of nothing.
    assert!(ours > 2e7, "throttled {ours} ns of {life} ns: {v:?}");
    assert!((ours - group).abs() <= life * 0.02 + 1e7, "throttled: sonde {ours} ns, the cgroup's {group} ns");
    for t in &threads {
        assert!((sum_of(t) - field(t, "window_ns")).abs() <= 1e3 + field(t, "window_ns") * 0.001, "{t}");
    }
}

#[test]
fn why_names_what_ran_on_the_cpu_instead() {
    ran_instead_of_a_spinner(2);
}

/// One other thread only: the kernel half then holds all the time it ran in
/// the traced thread's record (no other runner comes to move it to its map).
#[test]
fn why_names_the_one_thread_that_ran_on_the_cpu_instead() {
    ran_instead_of_a_spinner(1);
}

fn ran_instead_of_a_spinner(n: usize) {
    // Spinners on one CPU: alone, so the timing tests keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    // Spinners pinned to CPU 0, the `n` not traced in a cgroup of their own
    // (a quota they never reach): while the traced one waits for the CPU
    // (half or two thirds of the time), the others run, and their own
    // schedstat says for how long.
    let burn = build_workload("burn", &["-O2", "-g", "-fno-inline"]);
    let g = CpuGroup::new(&format!("sonde-why-hog{n}"), 200);
    let hog_cmd = format!("echo $$ > {}/cgroup.procs; exec taskset -c 0 {} 30", g.dir.display(), burn.display());
    let mut hogs: Vec<KillOnDrop> =
        (0..n).map(|_| KillOnDrop(Command::new("sh").args(["-c", &hog_cmd]).spawn().unwrap())).collect();
    let traced = KillOnDrop(Command::new("taskset").args(["-c", "0"]).arg(&burn).arg("30").spawn().unwrap());
    thread::sleep(Duration::from_millis(300));
    let ids: Vec<u32> = hogs.iter().map(|h| h.0.id()).collect();
    let samplers: Vec<Sampler> = ids.iter().map(|&p| Sampler::start(p, None)).collect();
    let run =
        Command::new(SONDE).args(["why", "-p", &traced.0.id().to_string(), "-d", "2s", "--json"]).output().unwrap();
    let samples: Vec<Samples> = samplers.into_iter().map(Sampler::finish).collect();
    drop(traced);
    hogs.clear();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let v = json_lines(&run.stdout);
    let t = of_type(&v, "thread")[0].clone();
    let s = of_type(&v, "summary")[0].clone();
    let (from, to) = (s["start_monotonic_ns"].as_u64().unwrap(), s["end_monotonic_ns"].as_u64().unwrap());
    let inst = t["ran_instead"].as_array().unwrap();
    let window = field(&t, "window_ns");
    for (pid, smp) in ids.iter().zip(&samples) {
        let cpu = smp.delta(&pid.to_string(), 0, from, to).expect("the other spinner's schedstat over the window");
        let ours: f64 = inst.iter().filter(|i| i["pid"] == *pid).map(|i| field(i, "ns")).sum();
        eprintln!("ran instead: spinner {pid} {ours:.0} ns by sonde, {cpu:.0} ns on CPU by its schedstat");
        assert!((ours - cpu).abs() <= window * 0.03 + 2e6, "spinner {pid}: sonde {ours} ns, schedstat {cpu} ns: {t}");
    }
    let seen: f64 = inst.iter().map(|i| field(i, "ns")).sum();
    let waited = field(&t, "runqueue_ns") + field(&t, "throttled_ns");
    eprintln!("ran instead: {seen:.0} ns seen of {waited:.0} ns waited");
    assert!(waited > window * 0.25, "the traced spinner hardly waited: {t}");
    assert!(seen <= waited + 1e6, "{t}");
    let top = &inst[0];
    assert!(ids.iter().any(|p| top["pid"] == *p), "{t}");
    assert_eq!(top["comm"], "burn", "{t}");
    let name = g.dir.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(top["cgroup"], format!("/{name}"), "{t}");
    // When waiting for a CPU is its largest share (as on an idle host), the
    // verdict says so and names who ran.
    let p = of_type(&v, "process")[0].clone();
    let verdict = p["verdict"].as_str().unwrap();
    if field(&t, "runqueue_ns") > field(&t, "on_cpu_ns") {
        assert!(verdict.contains(&format!("burn ({})", top["pid"])), "{verdict}");
        assert_eq!(p["next"], format!("sonde profile -p {}", top["pid"]), "{p}");
    }
}

/// Threads whose ids share one slot of the kernel half's records (forced
/// with `--thread-slots 8`: four threads whose ids are multiples of 8, so
/// all but the first are kept in the next free slots) each keep a record of
/// their own: named, every nanosecond accounted for, and with their own
/// time on CPU as schedstat counts it (slot i spins i + 1 ms in every
/// i + 3, so records mixed up would show).
#[test]
fn why_keeps_the_records_of_threads_that_share_a_slot_apart() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let bin = build_workload("whyslots", &["-O2", "-g", "-pthread"]);
    let mut w = KillOnDrop(Command::new(&bin).args(["8", "4", "30"]).stdout(Stdio::piped()).spawn().unwrap());
    let pid = w.0.id();
    let line = first_line(&mut w);
    let tids: Vec<u32> = line.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    assert!(line.starts_with("ready") && tids.len() == 4 && tids.iter().all(|t| t % 8 == 0), "{line}");
    let sampler = Sampler::start(pid, None);
    thread::sleep(Duration::from_millis(50));
    let run = Command::new(SONDE)
        .args(["why", "-p", &pid.to_string(), "--thread-slots", "8", "-d", "2s", "--json"])
        .output()
        .unwrap();
    let samples = sampler.finish();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let v = json_lines(&run.stdout);
    let s = summary(&v);
    let (from, to) = (s["start_monotonic_ns"].as_u64().unwrap(), s["end_monotonic_ns"].as_u64().unwrap());
    assert_eq!(s["lost"]["threads_full"], 0, "{s}");
    for (i, tid) in tids.iter().enumerate() {
        let mine: Vec<&Value> = of_type(&v, "thread").into_iter().filter(|t| t["tid"] == *tid).collect();
        assert_eq!(mine.len(), 1, "thread {tid}: {mine:?}");
        let t = mine[0];
        assert_eq!(t["comm"], format!("slot{i}"), "{t}");
        let window = field(t, "window_ns");
        assert!((sum_of(t) - window).abs() <= window * 0.01, "{t}");
        let cpu = samples.delta(&tid.to_string(), 0, from, to).expect("its schedstat over the window");
        let ours = field(t, "on_cpu_ns");
        eprintln!("slot{i} ({tid}): on CPU {ours:.0} ns by sonde, {cpu:.0} ns by schedstat, {window:.0} ns window");
        assert!((ours - cpu).abs() <= window * 0.03 + 2e6, "slot{i}: sonde {ours} ns, schedstat {cpu} ns: {t}");
        assert!(blocked(t, "sleep") > window * 0.1, "{t}");
    }
}

/// The packets the rules of table `inet whyloss` in namespace `ns` dropped
/// (their counters).
fn rule_drops(ns: &str) -> i64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-j", "list", "table", "inet", "whyloss"])
        .output()
        .unwrap();
    let rules: Value = serde_json::from_slice(&out.stdout).unwrap();
    rules["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["rule"]["expr"].as_array())
        .flat_map(|e| e.iter().filter_map(|x| x["counter"]["packets"].as_i64()))
        .sum()
}

/// `sonde why -- CLIENT`: a client in one namespace asks a server in
/// another 30 times across nftables loss of data segments both ways. The
/// client's wait names the connection, and the retransmissions on it
/// (the server's too: the other end is on this host) equal the two
/// namespaces' own RetransSegs: all of the connection's traffic lies within
/// the command's life, and handshake and close are never dropped.
/// Every thread's network waits on `remote` ("ADDR:PORT").
fn network_waits(v: &[Value], remote: &str) -> Vec<Value> {
    of_type(v, "thread")
        .iter()
        .flat_map(|t| t["waits"].as_array().cloned().unwrap_or_default())
        .filter(|w| w["class"] == "network" && w["remote"] == remote)
        .collect()
}

/// A Python server in `pair.b` on `port`, ready, that answers each 64-byte
/// request with `size` bytes `delay` seconds later; and the program of a
/// client (to run in `pair.a`) that sends `rounds` requests and reads each
/// answer whole.
fn request_response(pair: &Pair, port: u16, rounds: usize, size: usize, delay: f64) -> (KillOnDrop, String) {
    let server = format!(
        "import socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('{b}', {port})); s.listen(1); print('ready', flush=True)\nc, _ = s.accept()\n\
         while True:\n    d = c.recv(64)\n    if not d: break\n    time.sleep({delay})\n    c.sendall(b'r' * {size})\nc.close()",
        b = pair.b4
    );
    let mut srv = KillOnDrop(
        Command::new("ip")
            .args(["netns", "exec", &pair.b.name, "python3", "-c", &server])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(first_line(&mut srv).trim(), "ready");
    let client = format!(
        "import socket\nc = socket.create_connection(('{b}', {port}))\n\
         for _ in range({rounds}):\n    c.sendall(b'q' * 64)\n    n = 0\n    while n < {size}: n += len(c.recv({size} - n))\nc.close()",
        b = pair.b4
    );
    (srv, client)
}

/// A client that waits on a server which answers each request after 500 ms
/// (more than the RTO, 200 ms and a little on a veth): each end's send after
/// that idle time restarts slow start (RFC 5681 4.1), as the kernel's
/// tcp_slow_start_after_idle says, in each namespace, with Reno. Built in: the
/// server's 4 answers, and the client's 3 requests after the first (its
/// first follows the connection's set-up at once); none with the sysctl off.
fn slow_start_restarts_on_the_connection(after_idle: bool) -> (Value, Value) {
    let pair = Pair::new().expect("namespaces");
    const PORT: u16 = 5013;
    for ns in [&pair.a, &pair.b] {
        ns.sysctl("net.ipv4.tcp_slow_start_after_idle", if after_idle { "1" } else { "0" }).unwrap();
        // Reno: BBR (this host's default) has a cong_control hook of its
        // own, which the kernel never restarts (and CUBIC is not in the
        // list a namespace may pick from here).
        ns.sysctl("net.ipv4.tcp_congestion_control", "reno").unwrap();
    }
    let (_srv, client) = request_response(&pair, PORT, 4, 4096, 0.5);
    let run = Command::new(SONDE)
        .args(["why", "--json", "--", "ip", "netns", "exec", &pair.a.name, "python3", "-c", &client])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    let v = json_lines(&run.stdout);
    let waits = network_waits(&v, &format!("{}:{PORT}", pair.b4));
    assert!(!waits.is_empty(), "no wait on the server's connection: {}", String::from_utf8_lossy(&run.stdout));
    let r = waits[0]["retransmits"].clone();
    assert!(waits.iter().all(|w| w["retransmits"] == r), "one connection, one count: {waits:?}");
    (r, of_type(&v, "process")[0].clone())
}

#[test]
fn why_counts_the_slow_start_restarts_of_the_connection_it_waits_on() {
    let _shared = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let (r, p) = slow_start_restarts_on_the_connection(true);
    eprintln!("with tcp_slow_start_after_idle=1: {r}; {}", p["verdict"]);
    assert_eq!(r["slow_start_restarts"], 4 + 3, "the server's 4 answers and the client's 3 later requests: {r}");
    assert_eq!(r["total"], 0, "{r}");
    let verdict = p["verdict"].as_str().unwrap();
    assert!(verdict.contains("7 slow-start restarts after idle (RFC 5681 4.1)"), "{verdict}");
    assert_eq!(p["next"], "sonde cwnd --port 5013 --idle-only", "{p}");
    // The kernel's switch: no restart, and the next command is another.
    let (r, p) = slow_start_restarts_on_the_connection(false);
    eprintln!("with tcp_slow_start_after_idle=0: {r}; {}", p["verdict"]);
    assert_eq!(r["slow_start_restarts"], 0, "{r}");
    assert!(!p["verdict"].as_str().unwrap().contains("slow-start"), "{p}");
    assert!(!p["next"].as_str().unwrap().starts_with("sonde cwnd"), "{p}");
    // Nor `sonde drops`: what the kernel drops there (the queues purged at
    // the close) cost the waits nothing.
    assert!(!p["next"].as_str().unwrap().starts_with("sonde drops"), "{p}");
}

#[test]
fn why_counts_the_retransmissions_of_the_connection_it_waits_on() {
    let _shared = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let pair = Pair::new().expect("namespaces");
    const PORT: u16 = 5012;
    pair.b
        .nft(&format!(
            "table inet whyloss {{
               chain in {{ type filter hook input priority 0; tcp dport {PORT} tcp flags & psh == psh numgen random mod 100 < 20 counter drop; }}
               chain out {{ type filter hook output priority 0; tcp sport {PORT} tcp flags & psh == psh numgen random mod 100 < 20 counter drop; }}
             }}"
        ))
        .unwrap();
    let (srv, client) = request_response(&pair, PORT, 30, 64, 0.0);
    let before = pair.mib().unwrap();
    let before_b = pair.b.mib().unwrap();
    let run = Command::new(SONDE)
        .args(["why", "--json", "--", "ip", "netns", "exec", &pair.a.name, "python3", "-c", &client])
        .output()
        .unwrap();
    let d = pair.mib().unwrap().delta(&before);
    let server = pair.b.mib().unwrap().delta(&before_b).get("TcpRetransSegs");
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    let v = json_lines(&run.stdout);
    let s = of_type(&v, "summary")[0].clone();
    let waits = network_waits(&v, &format!("{}:{PORT}", pair.b4));
    assert!(!waits.is_empty(), "no wait on the server's connection: {}", String::from_utf8_lossy(&run.stdout));
    let r = &waits[0]["retransmits"];
    assert!(waits.iter().all(|w| w["retransmits"] == *r), "one connection, one count: {waits:?}");
    // The other end: the server this test started, in the other namespace
    // (`ip netns exec` execs it: its pid is the server's).
    let peer = serde_json::json!([{"pid": srv.0.id(), "comm": "python3"}]);
    assert!(waits.iter().all(|w| w["peers"] == peer), "the server, {peer}, at the other end: {waits:?}");
    let kernel = d.get("TcpRetransSegs");
    let missed = s["lost"]["retransmits_missed"].as_i64().unwrap();
    eprintln!("retransmissions on the connection: {r}; the namespaces' RetransSegs: {kernel}; missed {missed}");
    assert!(kernel >= 1, "no loss happened (20% of 60 data segments): {d:?}");
    assert_eq!(s["lost"]["retransmits_full"], 0, "{s}");
    let ours = r["segments"].as_i64().unwrap();
    // Exact, unless the kernel skipped the program: on the same CPU as
    // itself (`missed`), or, on a kernel that runs no tracing program while
    // a thread of PID 1 is on the CPU (`unseen_switches` in the run), a
    // retransmission timer that fired then: one in a CI run (15 of 16).
    let pid1 = s["lost"]["unseen_switches"].as_i64().unwrap_or(0) > 0;
    // The server's retransmissions dropped by its own output chain did not
    // go out: the kernel counts them in RetransSegs and TCPRetransFail both.
    let (failed, kfailed) = (r["failed"].as_i64().unwrap(), d.get("TcpExtTCPRetransFail"));
    assert!(if missed == 0 && !pid1 { failed == kfailed } else { failed <= kfailed }, "{r} vs {kfailed} failed");
    if missed == 0 && !pid1 {
        assert_eq!(ours, kernel, "sonde's retransmitted segments vs the namespaces' RetransSegs: {r}; {d:?}");
    } else {
        let short = if missed == 0 { (kernel / 8).max(1) } else { kernel };
        assert!(ours <= kernel && kernel - ours <= short, "{r} vs {kernel} with {missed} missed, PID 1 hidden: {pid1}");
    }
    let kinds: i64 =
        ["rto", "tlp", "fast", "loss_recovery", "syn", "synack", "failed"].iter().map(|k| r[k].as_i64().unwrap()).sum();
    assert_eq!(kinds, r["total"].as_i64().unwrap(), "{r}");
    assert!(r["rto"].as_i64().unwrap() <= d.get("TcpExtTCPTimeouts"), "{r}; {d:?}");
    // The server's retransmissions (its namespace's own count; one segment
    // each, a response of 64 bytes) are the other end's.
    let by_peer = r["by_peer"].as_i64().unwrap();
    if missed == 0 && !pid1 {
        assert_eq!(by_peer, server, "the server's namespace's RetransSegs: {r}");
    } else if missed == 0 {
        assert!(by_peer <= server && server - by_peer <= (server / 8).max(1), "{r} vs the server's {server}");
    }
    // The packets dropped on the connection: those the two rules dropped
    // (the kernel's NETFILTER_DROP) against the rules' own counters, exact
    // unless the kernel skipped the program (PID 1 on the CPU). TCP drops
    // more itself, counted by their reasons: duplicates of data it had
    // (TCP_OLD_DATA, from retransmissions that were not needed, such as
    // tail loss probes), data left at close (QUEUE_PURGE).
    let counted = rule_drops(&pair.b.name);
    let dr = &waits[0]["drops"];
    assert!(waits.iter().all(|w| w["drops"] == *dr), "one connection, one count: {waits:?}");
    eprintln!("drops on the connection: {dr}; the rules' counters: {counted}");
    let total = dr["total"].as_i64().unwrap_or_else(|| panic!("no drops counted: {}", waits[0]));
    let by: i64 = dr["by_reason"].as_object().unwrap().values().map(|n| n.as_i64().unwrap()).sum();
    assert_eq!(by, total, "{dr}");
    let ours = dr["by_reason"]["NETFILTER_DROP"].as_i64().unwrap_or(0);
    if !pid1 {
        assert_eq!(ours, counted, "sonde's drops on the connection vs the rules' counters: {dr}");
    } else {
        assert!(ours <= counted && counted - ours <= (counted / 8).max(1), "{dr} vs {counted}, PID 1 hidden");
    }
    // The verdict, when the network is the client's largest share, says so.
    let p = of_type(&v, "process").into_iter().find(|p| p["comm"] == "python3").cloned();
    if let Some(p) = p {
        let verdict = p["verdict"].as_str().unwrap();
        if verdict.contains("blocked on the network") {
            assert!(verdict.contains("TCP retransmission"), "{verdict}");
            assert!(verdict.contains(&format!("{total} packets dropped (")), "{verdict}");
            assert!(verdict.contains(&format!("NETFILTER_DROP {ours}")), "{verdict}");
            assert_eq!(p["next"], format!("sonde retrans --port {PORT}"), "{p}");
        }
    }
}

/// A lock's releaser with its language frames: Python's own queue.Queue
/// (queue.py and threading.py, code nobody here wrote) between the program
/// and the lock. The consumer's waits are each ended by the producer in
/// Condition.notify(), called by Queue.put(), called by producer().
fn why_names_a_python_locks_releaser(mut cmd: Command, script: &str) {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let mut w = KillOnDrop(cmd.arg(script).arg("30").stdout(Stdio::piped()).spawn().unwrap());
    let pid = w.0.id();
    let (producer, consumer) = producer_and_consumer(&mut w);
    // The text report beside the JSON one, in a second sonde.
    let text =
        Command::new(SONDE).args(["why", "-p", &pid.to_string(), "-d", "3s"]).stdout(Stdio::piped()).spawn().unwrap();
    let run = Command::new(SONDE).args(["why", "-p", &pid.to_string(), "-d", "3s", "--json"]).output().unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let text = text.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    // The program's own frame, not the standard library's that it called.
    assert!(text.contains(&format!("({producer}) in producer (pyqueue.py:")), "{text}");
    let v = json_lines(&run.stdout);
    let threads = of_type(&v, "thread");
    let t = threads.iter().find(|t| t["tid"].as_u64() == Some(consumer)).unwrap_or_else(|| panic!("{threads:?}"));
    let lock = blocked(t, "lock");
    assert!(lock > 0.8 * field(t, "window_ns"), "the consumer waits on its lock: {t}");
    let w = t["waits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["class"] == "lock" && w["woken_by"] == "thread")
        .unwrap_or_else(|| panic!("no lock wait woken by a thread: {t}"));
    assert_eq!(w["waker_tid"].as_u64(), Some(producer), "{w}");
    // Its releasers: the producer's rows, one per stack; a release the
    // CPU's walks were spent for (a busy host) counts without a stack.
    let rows = w["released_by"].as_array().unwrap_or_else(|| panic!("no releasers: {w}"));
    assert!(rows.iter().all(|r| r["tid"].as_u64() == Some(producer)), "{w}");
    let r = rows
        .iter()
        .find(|r| r["stack"].as_array().is_some_and(|s| !s.is_empty()))
        .unwrap_or_else(|| panic!("no stack walked: {w}"));
    let frames: Vec<&str> = r["stack"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    let at = |name: &str, file: &str| {
        frames
            .iter()
            .position(|f| f.starts_with(&format!("{name} (")) && f.contains(file))
            .unwrap_or_else(|| panic!("no {name} in {file} among the releaser's frames: {frames:?}"))
    };
    // Innermost first: the lock's release, then its callers.
    let (notify, put, prod) =
        (at("Condition.notify", "threading.py:"), at("Queue.put", "queue.py:"), at("producer", script));
    assert!(notify < put && put < prod, "{frames:?}");
    // Every wait is about 20 ms (above the 10 ms under which releases are
    // sampled): the releases are its time.
    let rns: f64 = rows.iter().map(|r| r["ns"].as_f64().unwrap()).sum();
    let wns = w["ns"].as_f64().unwrap();
    let n: u64 = rows.iter().map(|r| r["samples"].as_u64().unwrap()).sum();
    eprintln!("consumer: lock {wns:.0} ns, released by the producer {rns:.0} ns in {n} releases");
    assert!((rns - wns).abs() <= wns * 0.05, "releases {rns} ns, waits {wns} ns: {w}");
}

#[test]
fn why_names_a_python_locks_releaser_debian_3_11() {
    why_names_a_python_locks_releaser(Command::new(super::python::python("debian")), &super::python::wl("pyqueue.py"));
}

#[test]
fn why_names_a_python_locks_releaser_sid_3_14() {
    why_names_a_python_locks_releaser(in_sid("python3.14"), &into_sid("pyqueue.py"));
}

/// The bound on the releasers' stack walks: 48 workers of a pool woken all
/// at once every 12 ms (about 4,000 lock releases a second, each ending a
/// wait of about 12 ms, so each would be walked): each CPU walks at most 200
/// a second, the rest are counted without their stacks, and every release
/// still counts its time.
#[test]
fn why_bounds_the_walks_of_lock_releasers() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let bin = build_workload("whypool", &["-O2", "-g", "-pthread"]);
    let mut w = KillOnDrop(Command::new(&bin).args(["48", "30"]).stdout(Stdio::piped()).spawn().unwrap());
    let pid = w.0.id();
    assert_eq!(first_line(&mut w).trim(), "ready");
    let v = why_json(pid, "3s");
    let s = summary(&v);
    let window = s["duration_s"].as_f64().unwrap();
    let lost = &s["lost"];
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    let (mut walked, mut unwalked, mut released_ns, mut woken_ns) = (0.0, 0.0, 0.0, 0.0);
    for t in of_type(&v, "thread").into_iter().filter(|t| t["comm"] == "worker") {
        for w in t["waits"].as_array().unwrap().iter().filter(|w| w["class"] == "lock" && w["woken_by"] == "thread") {
            woken_ns += w["ns"].as_f64().unwrap();
            for r in w["released_by"].as_array().into_iter().flatten() {
                released_ns += r["ns"].as_f64().unwrap();
                let n = r["samples"].as_f64().unwrap();
                if r["stack"].as_array().unwrap().is_empty() {
                    unwalked += n;
                } else {
                    walked += n;
                }
            }
        }
    }
    eprintln!(
        "releases walked {walked}, not walked {unwalked} (summary {}), their time {released_ns:.0} of the waits' {woken_ns:.0} ns, {window:.2} s",
        lost["releases_not_walked"]
    );
    // Each CPU's 100 a second over the window (and the time it took to
    // attach and detach, a second at most).
    assert!(walked <= 100.0 * cpus * (window + 1.0), "{walked} walks in {window} s on {cpus} CPUs: {s}");
    assert!(walked >= 100.0, "walks still taken: {walked}");
    assert!(unwalked > walked, "most releases go unwalked: {unwalked} against {walked}");
    // The summary counts every thread's (the dispatcher's waits for the
    // mutex too).
    assert!(lost["releases_not_walked"].as_f64().unwrap() >= unwalked, "{s}");
    // Only the three releasers that ended the most of a wait's time are
    // kept per wait: a worker's waits are released by the dispatcher
    // (with and without a stack) and by workers unlocking the mutex.
    assert!(released_ns >= 0.9 * woken_ns && released_ns <= 1.05 * woken_ns, "{released_ns} of {woken_ns}");
}

/// The hottest functions on CPU, language frames included: a Python
/// program whose heavy() and light() run loops of their own at 2:1 (the
/// split built in); `sonde why` names both with their shares of its
/// samples and says so in the verdict.
#[test]
fn why_names_the_hottest_functions_of_a_busy_process() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let script = super::python::wl("pyhot.py");
    let w = KillOnDrop(Command::new(super::python::python("debian")).arg(&script).arg("30").spawn().unwrap());
    let pid = w.0.id();
    thread::sleep(Duration::from_millis(300));
    let v = why_json(pid, "6s");
    let p = line_of(&v, "process", "pid", pid);
    let hot = p["hottest"].as_array().unwrap_or_else(|| panic!("no hottest functions: {p}"));
    let share = |f: &str| {
        hot.iter()
            .find(|h| h["function"] == format!("{f} (pyhot.py)"))
            .unwrap_or_else(|| panic!("no {f} among {hot:?}"))["share"]
            .as_f64()
            .unwrap()
    };
    let (heavy, light) = (share("heavy"), share("light"));
    let samples: u64 = hot.iter().map(|h| h["samples"].as_u64().unwrap()).sum();
    eprintln!("hottest: heavy {heavy:.3}, light {light:.3} of {samples} samples");
    // 99 a second over 6 s of one CPU: about 590 (a busy host runs it less).
    assert!(samples >= 200, "{samples} samples: {hot:?}");
    assert!((heavy - 2.0 / 3.0).abs() <= 0.07 && (light - 1.0 / 3.0).abs() <= 0.07, "2:1 built in: {hot:?}");
    assert!(p["verdict"].as_str().unwrap().contains("hottest: heavy (pyhot.py)"), "{}", p["verdict"]);
}

/// `sonde why -p PID` of a process whose only thread waits on local IPC
/// (class pipe) with process `peer` at the other end: the wait names
/// `peer`, and only it, and the process's next command is `peer`'s. The
/// wait, for its object to be checked.
fn waits_on_its_peer(pid: u32, peer: u32) -> Value {
    thread::sleep(Duration::from_millis(300));
    let v = why_json(pid, "2s");
    let t = line_of(&v, "thread", "tid", pid);
    assert!(blocked(&t, "pipe") > 0.9 * field(&t, "window_ns"), "{t}");
    let w = t["waits"].as_array().unwrap().iter().find(|w| w["class"] == "pipe").unwrap().clone();
    let peers: Vec<u64> = w["peers"].as_array().into_iter().flatten().map(|p| p["pid"].as_u64().unwrap()).collect();
    assert_eq!(peers, vec![u64::from(peer)], "the process at the other end: {w}");
    let p = line_of(&v, "process", "pid", pid);
    assert_eq!(p["next"], format!("sonde why -p {peer}"), "{p}");
    w
}

/// The other end of a named FIFO: a reader waits in read() on a FIFO that
/// another process opened for writing and writes to every 20 ms; `sonde
/// why` of the reader names the writer (found by the FIFO's device and
/// inode among every process's descriptors), and not the reader itself.
#[test]
fn why_names_the_writer_at_the_other_end_of_a_named_fifo() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    // As the reader's descriptor names it (no symbolic link on the way).
    let dir = scratch_dir("why-fifo").canonicalize().unwrap();
    let path = dir.join("jobs.fifo");
    let _ = std::fs::remove_file(&path);
    let st = Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(st.success());
    let p = path.to_str().unwrap();
    let reader = format!(
        "import os
f = os.open({p:?}, os.O_RDONLY)
while True:
    os.read(f, 1)"
    );
    let rd = KillOnDrop(Command::new("python3").args(["-c", &reader]).spawn().unwrap());
    let writer = format!(
        "import os, time
f = os.open({p:?}, os.O_WRONLY)
print('ready', flush=True)
while True:
    time.sleep(0.02)
    os.write(f, b'x')"
    );
    let mut wr = KillOnDrop(Command::new("python3").args(["-c", &writer]).stdout(Stdio::piped()).spawn().unwrap());
    // Open at both ends (the writer's open waits for the reader's).
    assert_eq!(first_line(&mut wr).trim(), "ready");
    let w = waits_on_its_peer(rd.0.id(), wr.0.id());
    assert_eq!(w["object"], format!("receive FIFO {p}"), "{w}");
}

/// The other end of a Unix socket: a client connected to a server's named
/// socket (as a program to a local daemon) waits in recv() for what the
/// server, another process, sends every 20 ms; `sonde why` of the client
/// names the server (by the kernel's own link between the two sockets)
/// and says to look at it next.
#[test]
fn why_names_the_process_at_the_other_end_of_a_unix_socket() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("why-unix");
    let path = dir.join("daemon.sock");
    let _ = std::fs::remove_file(&path);
    let server = format!(
        "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.bind({p:?}); s.listen(1)\nprint('ready', flush=True)\n\
         c, _ = s.accept()\nwhile True:\n    time.sleep(0.02)\n    c.send(b'x')",
        p = path.to_str().unwrap()
    );
    let mut srv = KillOnDrop(Command::new("python3").args(["-c", &server]).stdout(Stdio::piped()).spawn().unwrap());
    assert_eq!(first_line(&mut srv).trim(), "ready");
    let client = format!(
        "import socket\nc = socket.socket(socket.AF_UNIX)\nc.connect({p:?})\nwhile True:\n    c.recv(1)",
        p = path.to_str().unwrap()
    );
    let cli = KillOnDrop(Command::new("python3").args(["-c", &client]).spawn().unwrap());
    let w = waits_on_its_peer(cli.0.id(), srv.0.id());
    assert!(w["object"].as_str().unwrap().starts_with("receive unix socket"), "{w}");
}

/// select on one descriptor waits on that peer, not for work: a Python
/// program (CPython's select.select, which glibc makes pselect6; and the
/// select system call itself, through ctypes) waits on a pipe's read end,
/// put at descriptor 700 (past the set's first word), whose write end only
/// its child holds and writes to every 20 ms: `sonde why` names the child
/// as the other end and the wait `(pselect6 on it alone)`. With a second
/// descriptor in the set it is waiting for work (poll).
#[test]
fn why_counts_select_on_one_descriptor_as_a_wait_on_its_peer() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let script = "import ctypes, os, select, sys, time
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(r)
    while True:
        time.sleep(0.02)
        os.write(w, b'x')
os.close(w)
os.dup2(r, 700)
os.close(r)
idle_r, idle_w = os.pipe()
print(child, flush=True)
mode = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
rset = (ctypes.c_uint64 * 16)()
while True:
    if mode == 'raw':
        rset[700 // 64] = 1 << (700 % 64)
        tv = (ctypes.c_long * 2)(0, 500000)
        libc.syscall(23, 701, ctypes.byref(rset), None, None, ctypes.byref(tv))
        ready = rset[700 // 64] != 0
    else:
        fds = [700, idle_r] if mode == 'many' else [700]
        ready = 700 in select.select(fds, [], [], 0.5)[0]
    if ready:
        os.read(700, 1)";
    // The select system call (23) is x86-64's; arm64 has pselect6 alone.
    let modes = [("one", "pselect6"), ("raw", "select"), ("many", "pselect6")];
    for (mode, syscall) in modes.into_iter().filter(|(m, _)| *m != "raw" || cfg!(target_arch = "x86_64")) {
        let mut p =
            KillOnDrop(Command::new("python3").args(["-c", script, mode]).stdout(Stdio::piped()).spawn().unwrap());
        let child: u32 = first_line(&mut p).trim().parse().unwrap();
        // The child dies of SIGPIPE once the parent is gone.
        let pid = p.0.id();
        if mode == "many" {
            thread::sleep(Duration::from_millis(300));
            let t = line_of(&why_json(pid, "2s"), "thread", "tid", pid);
            assert!(blocked(&t, "poll") > 0.9 * field(&t, "window_ns"), "two descriptors: waiting for work: {t}");
            let w = t["waits"].as_array().unwrap().iter().find(|w| w["class"] == "poll").unwrap().clone();
            assert_eq!(w["syscall"], syscall, "{w}");
        } else {
            let w = waits_on_its_peer(pid, child);
            assert_eq!(w["syscall"], syscall, "{w}");
            assert!(w["object"].as_str().unwrap().ends_with(&format!("({syscall} on it alone)")), "{w}");
        }
        // SAFETY: a signal to a process of the test's own.
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
    }
}

/// Two namespaces, each with a loopback connection of the same addresses
/// and ports (as two containers' local connections can be): one loses data
/// segments to nftables, the other nothing. Each client's wait counts the
/// retransmissions and drops of its own namespace only: the lossy one's
/// equal that namespace's RetransSegs (client and server both in it), the
/// clean one's are none, as its namespace's counters say.
#[test]
fn why_keeps_two_namespaces_loopback_connections_of_the_same_addresses_apart() {
    let _shared = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let tag = std::process::id();
    let lossy = sonde::lab::netns::Netns::create(&format!("sonde-why-lo-a-{tag}")).unwrap();
    let clean = sonde::lab::netns::Netns::create(&format!("sonde-why-lo-b-{tag}")).unwrap();
    const PORT: u16 = 5013;
    const CPORT: u16 = 5014;
    lossy
        .nft(&format!(
            "table inet whyloss {{
               chain out {{ type filter hook output priority 0; tcp dport {PORT} tcp flags & psh == psh numgen random mod 100 < 25 counter drop; }}
             }}"
        ))
        .unwrap();
    // The server answers 10 ms after each request, so that each client
    // waits in recv (an answer already there when it asks is no wait: on a
    // busy host the clean client once had none).
    let server = format!(
        "import socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1', {PORT})); s.listen(1); print('ready', flush=True)\nc, _ = s.accept()\n\
         while True:\n    d = c.recv(64)\n    if not d: break\n    time.sleep(0.01)\n    c.sendall(b'r' * 64)\nc.close()"
    );
    let mut servers = Vec::new();
    for ns in [&lossy, &clean] {
        let mut srv = KillOnDrop(
            Command::new("ip")
                .args(["netns", "exec", &ns.name, "python3", "-c", &server])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        assert_eq!(first_line(&mut srv).trim(), "ready");
        servers.push(srv);
    }
    // Each client names itself (its comm) after its namespace.
    let client = format!(
        "import socket, sys\nopen('/proc/self/comm', 'w').write(sys.argv[1])\n\
         c = socket.create_connection(('127.0.0.1', {PORT}), source_address=('127.0.0.1', {CPORT}))\n\
         for _ in range(30):\n    c.sendall(b'q' * 64)\n    n = 0\n    while n < 64: n += len(c.recv(64 - n))\nc.close()"
    );
    let both = format!(
        "ip netns exec {a} python3 -c \"$0\" cli_lossy & ip netns exec {b} python3 -c \"$0\" cli_clean & wait",
        a = lossy.name,
        b = clean.name
    );
    let (before_a, before_b) = (lossy.mib().unwrap(), clean.mib().unwrap());
    let run = Command::new(SONDE).args(["why", "--json", "--", "sh", "-c", &both, &client]).output().unwrap();
    let (da, db) = (lossy.mib().unwrap().delta(&before_a), clean.mib().unwrap().delta(&before_b));
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let v = json_lines(&run.stdout);
    let s = of_type(&v, "summary")[0].clone();
    let waits_of = |comm: &str| -> Vec<Value> {
        of_type(&v, "thread")
            .iter()
            .filter(|t| t["comm"] == comm)
            .flat_map(|t| t["waits"].as_array().cloned().unwrap_or_default())
            .filter(|w| w["class"] == "network" && w["remote"] == format!("127.0.0.1:{PORT}"))
            .collect()
    };
    let (wa, wb) = (waits_of("cli_lossy"), waits_of("cli_clean"));
    assert!(!wa.is_empty() && !wb.is_empty(), "a wait in each namespace: {}", String::from_utf8_lossy(&run.stdout));
    let total = |ws: &[Value], k: &str| ws[0]["retransmits"][k].as_i64().unwrap_or(0);
    let kernel_a = da.get("TcpRetransSegs");
    let missed = s["lost"]["retransmits_missed"].as_i64().unwrap();
    let pid1 = s["lost"]["unseen_switches"].as_i64().unwrap_or(0) > 0;
    let ours_a = total(&wa, "segments");
    eprintln!(
        "lossy namespace: {} on the wait, RetransSegs {kernel_a}, drops {}; clean: {} and {}, RetransSegs {}",
        wa[0]["retransmits"],
        wa[0]["drops"],
        wb[0]["retransmits"],
        wb[0]["drops"],
        db.get("TcpRetransSegs")
    );
    assert!(kernel_a >= 1, "no loss happened: {da:?}");
    assert_eq!(db.get("TcpRetransSegs"), 0, "the clean namespace retransmitted");
    assert_eq!(total(&wb, "segments"), 0, "the clean connection took the lossy one's retransmissions: {wb:?}");
    // Drops by the lossy namespace's rule (NETFILTER_DROP) against its own
    // counter; none in the clean one, which drops only what TCP itself
    // does (QUEUE_PURGE: data left at close).
    let counted = rule_drops(&lossy.name);
    let nf = |w: &Value| w["drops"]["by_reason"]["NETFILTER_DROP"].as_i64().unwrap_or(0);
    assert_eq!(nf(&wb[0]), 0, "the clean connection took the lossy one's drops: {wb:?}");
    assert!(counted >= 1 && nf(&wa[0]) <= counted && nf(&wa[0]) >= 1, "{counted} dropped by the rule: {wa:?}");
    if missed == 0 && !pid1 {
        assert_eq!(ours_a, kernel_a, "{wa:?}");
        assert_eq!(nf(&wa[0]), counted, "{wa:?}");
    } else {
        assert!(ours_a <= kernel_a && ours_a >= 1, "{wa:?}");
    }
}

/// A block device read as a file (O_DIRECT reads of a loop device, as a
/// database on a raw partition does): the disk wait names that device and
/// its requests, not the device /dev is on; as many as the device's own
/// statistics count over the run (nothing else reads it), all the
/// reader's own.
#[test]
fn why_names_a_raw_block_devices_own_requests() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("why-raw");
    let img = dir.join("raw.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let out = Command::new("losetup").args(["--find", "--show", "--direct-io=on"]).arg(&img).output().unwrap();
    assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(loopdev.clone());
    let name = loopdev.trim_start_matches("/dev/").to_string();
    let reader = format!(
        "import mmap, os, random
fd = os.open('{loopdev}', os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
print('ready', flush=True)
while True:
    os.preadv(fd, [buf], random.randrange(16384) * 4096)"
    );
    let mut r = KillOnDrop(Command::new("python3").args(["-c", &reader]).stdout(Stdio::piped()).spawn().unwrap());
    assert_eq!(first_line(&mut r).trim(), "ready");
    let stat = || -> f64 {
        let s = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
        s.split_whitespace().next().unwrap().parse().unwrap()
    };
    let pid = r.0.id();
    let before = stat();
    let run = Command::new(SONDE).args(["why", "-p", &pid.to_string(), "-d", "2s", "--json"]).output().unwrap();
    let all = stat() - before;
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let v = json_lines(&run.stdout);
    let t = of_type(&v, "thread").into_iter().find(|t| t["tid"].as_u64() == Some(pid.into())).unwrap().clone();
    let w = t["waits"].as_array().unwrap().iter().find(|w| w["class"] == "disk").unwrap().clone();
    assert_eq!(w["object"], loopdev, "{w}");
    let d = &w["device"];
    assert_eq!(d["name"], name, "the device read, not the one /dev is on: {w}");
    let (reads, own) = (field(d, "reads"), field(&d["own"], "requests"));
    eprintln!("{name}: {reads} reads in the window, {own} its own; the device's stat {all} over the run");
    // The window lies within the stat's span: not more, and a good part of
    // it (sonde's start and end take the rest: seen 37%).
    assert!(reads > 0.0 && reads <= all && reads >= all * 0.1, "{reads} reads, the stat {all}: {w}");
    // All of them the reader's own, but for bios queued before the window
    // began and completed in it (seen: 3 of 191,836).
    assert!(own <= reads && reads - own <= reads * 0.001 + 5.0, "all of them the reader's own: {w}");
}

/// A client waits for the answer of a server that has not accepted its
/// connection (a server too slow to accept: the connection sits in its
/// listener's queue, held by no process): `sonde why` of the client names
/// the server, which holds the listener, and says it has not accepted it.
#[test]
fn why_names_the_server_that_has_not_accepted_the_connection() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let server = "import socket, time
s = socket.socket()
s.bind(('127.0.0.1', 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
time.sleep(60)";
    let mut srv = KillOnDrop(Command::new("python3").args(["-c", server]).stdout(Stdio::piped()).spawn().unwrap());
    let port: u16 = first_line(&mut srv).trim().parse().unwrap();
    let client = format!(
        "import socket
c = socket.create_connection(('127.0.0.1', {port}))
c.sendall(b'hello')
print('ready', flush=True)
c.recv(1)"
    );
    let mut cl = KillOnDrop(Command::new("python3").args(["-c", &client]).stdout(Stdio::piped()).spawn().unwrap());
    assert_eq!(first_line(&mut cl).trim(), "ready");
    let pid = cl.0.id();
    let v = why_json(pid, "2s");
    let t = line_of(&v, "thread", "tid", pid);
    assert!(blocked(&t, "network") > 0.9 * field(&t, "window_ns"), "{t}");
    let w = t["waits"].as_array().unwrap().iter().find(|w| w["class"] == "network").unwrap().clone();
    assert_eq!(w["remote"], format!("127.0.0.1:{port}"), "{w}");
    let want = serde_json::json!([{"pid": srv.0.id(), "comm": "python3", "unaccepted": true}]);
    assert_eq!(w["peers"], want, "the server, holding the listener: {w}");
    let p = line_of(&v, "process", "pid", pid);
    assert_eq!(p["next"], format!("sonde why -p {}", srv.0.id()), "{p}");
    let text = Command::new(SONDE).args(["why", "-p", &pid.to_string(), "-d", "1s"]).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("python3 ({}), which has not accepted it", srv.0.id())), "{text}");
}

/// A parent that only waits for its child to exit (a shell running one
/// command): its time is waiting for work, the wait named by its call, not
/// time lost, and its verdict sends no one to look at it.
#[test]
fn why_counts_a_parent_waiting_for_its_child_as_waiting_for_work() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let sh = KillOnDrop(Command::new("sh").args(["-c", "sleep 30; true"]).spawn().unwrap());
    thread::sleep(Duration::from_millis(300));
    let pid = sh.0.id();
    let v = why_json(pid, "2s");
    let t = line_of(&v, "thread", "tid", pid);
    assert!(blocked(&t, "poll") > 0.9 * field(&t, "window_ns"), "{t}");
    assert_eq!(blocked(&t, "other"), 0.0, "{t}");
    let w = t["waits"].as_array().unwrap().iter().find(|w| w["class"] == "poll").unwrap().clone();
    let o = w["object"].as_str().unwrap();
    assert!(o == "wait4 for its child processes" || o == "waitid for its child processes", "{w}");
    let p = line_of(&v, "process", "pid", pid);
    assert!(p["verdict"].as_str().unwrap().contains("waiting for work"), "{p}");
    assert!(p["next"].is_null(), "{p}");
}
