//! Attach safety: `sonde funclatency` and `sonde slow` attached to and
//! detached from a live target over and over, ended every way a run can
//! end (its duration, SIGTERM, SIGINT, SIGKILL at any moment, also in the
//! middle of attaching), and `sonde serve` restarted the same way, while
//! the target checks its own results (tests/workloads/selfcheck.c: two
//! threads, each round's checksum of 20,000 calls of the probed function
//! compared with the first's).
//!
//! After the cycles the target must still run and have computed nothing
//! wrong, and nothing of ours may remain: every BPF link and program a
//! cycle held (read from its fds while it ran) must be gone from the
//! kernel, and `uprobe_events` must be as before.
//!
//! `SONDE_CYCLES` (default 1000) sets the cycles per tool, run two at a time.
use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use crate::common::{build_workload, SONDE};

/// The BPF programs and links whose fds process `pid` holds now.
fn bpf_objects(pid: u32) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let (mut progs, mut links) = (BTreeSet::new(), BTreeSet::new());
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return (progs, links) };
    for fd in fds.flatten() {
        let Ok(info) = std::fs::read_to_string(fd.path()) else { continue };
        for l in info.lines() {
            if let Some(v) = l.strip_prefix("link_id:") {
                links.extend(v.trim().parse::<u32>().ok());
            } else if let Some(v) = l.strip_prefix("prog_id:") {
                progs.extend(v.trim().parse::<u32>().ok());
            }
        }
    }
    (progs, links)
}

/// Whether the kernel still has BPF object `id` of `kind` ("prog", "link").
fn exists(kind: &str, id: u32) -> bool {
    Command::new("bpftool").args([kind, "show", "id", &id.to_string()]).output().unwrap().status.success()
}

fn uprobe_events() -> String {
    std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default()
}

/// Kills the target if a test fails before [`finish`] (which takes it).
struct Target(Option<Child>);

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The target, started and ready.
fn target() -> (Target, std::path::PathBuf) {
    let bin = build_workload("selfcheck", &["-O2", "-g", "-pthread"]);
    let mut c = Command::new(&bin).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    (Target(Some(c)), bin)
}

/// Ends the target with SIGTERM; returns (rounds, mismatches) it reported.
fn finish(mut t: Target) -> (u64, u64, Option<i32>) {
    let c = t.0.take().unwrap();
    // SAFETY: kill with a pid we spawned.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let out = c.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let nums: Vec<u64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (nums.first().copied().unwrap_or(0), nums.get(1).copied().unwrap_or(u64::MAX), out.status.code())
}

/// A small deterministic generator for the moment each cycle is ended.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// How one cycle ends.
#[derive(Debug, Clone, Copy)]
enum End {
    Duration,
    Term,
    Int,
    Kill,
}

/// Runs `args` once and ends it with `end`; waits for "attached" (the
/// tool's first stderr line) unless the end is a kill at a random moment.
/// Returns the BPF objects it held once attached, and its exit status.
fn cycle(args: &[String], end: End, rng: &mut Rng) -> (BTreeSet<u32>, BTreeSet<u32>, Option<i32>) {
    let mut c = Command::new(SONDE).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = c.id();
    let mut held = (BTreeSet::new(), BTreeSet::new());
    let mut stderr = BufReader::new(c.stderr.take().unwrap());
    match end {
        End::Kill if rng.below(2) == 0 => {
            // Any moment: often while the programs load and attach.
            std::thread::sleep(Duration::from_micros(rng.below(250_000)));
        }
        _ => {
            let mut line = String::new();
            stderr.read_line(&mut line).unwrap();
            assert!(line.starts_with("sonde: "), "{args:?}: {line}");
            held = bpf_objects(pid);
        }
    }
    let sig = match end {
        End::Duration => None,
        End::Term => Some(libc::SIGTERM),
        End::Int => Some(libc::SIGINT),
        End::Kill => Some(libc::SIGKILL),
    };
    if let Some(s) = sig {
        // SAFETY: kill with a pid we spawned and have not reaped.
        unsafe { libc::kill(pid as i32, s) };
    }
    // Drain stderr so the tool never blocks on it.
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    let st = c.wait().unwrap();
    (held.0, held.1, st.code())
}

/// Cycles run at once: most of a cycle's time is the kernel's wait for
/// uprobes to be unregistered when the tool exits (two closes of 30 to 60 ms
/// each), which a second cycle overlaps; two tools attaching to the same
/// function at once are also a case users meet.
const WORKERS: u64 = 2;

/// Sets its flag when the thread holding it panics.
struct FlagOnPanic<'a>(&'a AtomicBool);

impl Drop for FlagOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// Cycles of one tool; returns the objects held over all of them.
fn cycles_of(tool: &str, extra: &[&str], n: u64, seed: u64) -> (BTreeSet<u32>, BTreeSet<u32>, u64) {
    let (tgt, bin) = target();
    let before = uprobe_events();
    let mut args: Vec<String> =
        vec![tool.into(), "-p".into(), tgt.0.as_ref().unwrap().id().to_string(), format!("{}:mix", bin.display())];
    args.extend(extra.iter().map(|s| s.to_string()));
    let t0 = Instant::now();
    // A worker that fails stops the other at its next cycle (the scope
    // joins every thread before passing the panic on).
    let failed = AtomicBool::new(false);
    // Each worker ends its cycles every way in turn (its k-th by k % 4).
    let worker = |w: u64| {
        let _flag = FlagOnPanic(&failed);
        let mut rng = Rng(seed ^ w.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let (mut progs, mut links, mut attached) = (BTreeSet::new(), BTreeSet::new(), 0);
        for i in (w..n).step_by(WORKERS as usize) {
            if failed.load(Ordering::Relaxed) {
                break;
            }
            let end = [End::Duration, End::Term, End::Int, End::Kill][(i / WORKERS % 4) as usize];
            let mut a = args.clone();
            if matches!(end, End::Duration) {
                a.extend(["-d".into(), "50ms".into()]);
            }
            let (p, l, code) = cycle(&a, end, &mut rng);
            let want = match end {
                End::Duration | End::Term => Some(0),
                End::Int => Some(130),
                End::Kill => None,
            };
            assert_eq!(code, want, "{tool} cycle {i} ({end:?})");
            if !l.is_empty() {
                attached += 1;
            }
            progs.extend(p);
            links.extend(l);
        }
        (progs, links, attached)
    };
    let (mut progs, mut links, mut attached) = (BTreeSet::new(), BTreeSet::new(), 0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..WORKERS).map(|w| s.spawn(move || worker(w))).collect();
        for h in handles {
            let (p, l, a) = h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            progs.extend(p);
            links.extend(l);
            attached += a;
        }
    });
    let (rounds, mismatches, code) = finish(tgt);
    println!(
        "{tool}: {n} cycles ({WORKERS} at a time) in {:.0} s, {attached} seen attached ({} programs, {} links); target: {rounds} rounds, {mismatches} mismatches",
        t0.elapsed().as_secs_f64(),
        progs.len(),
        links.len()
    );
    assert_eq!(code, Some(0), "{tool}: the target ended with {code:?} (3: a round computed a wrong checksum)");
    assert_eq!(mismatches, 0);
    assert!(rounds > 0);
    assert_eq!(uprobe_events(), before, "{tool}: uprobe_events changed");
    (progs, links, attached)
}

fn n_cycles() -> u64 {
    std::env::var("SONDE_CYCLES").ok().and_then(|s| s.parse().ok()).unwrap_or(1000)
}

fn assert_gone(tool: &str, progs: &BTreeSet<u32>, links: &BTreeSet<u32>) {
    // The kernel frees an object once its last fd is closed, from a
    // deferred work item: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left_p: Vec<u32> = progs.iter().copied().filter(|&id| exists("prog", id)).collect();
        let left_l: Vec<u32> = links.iter().copied().filter(|&id| exists("link", id)).collect();
        if left_p.is_empty() && left_l.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{tool}: still in the kernel: programs {left_p:?}, links {left_l:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn funclatency_attach_detach_cycles_leave_the_target_right_and_nothing_behind() {
    let (progs, links, attached) = cycles_of("funclatency", &[], n_cycles(), 0x9e37_79b9_7f4a_7c15);
    assert!(attached * 4 >= n_cycles() * 3 - 4, "{attached} cycles seen attached");
    assert!(!links.is_empty() && !progs.is_empty());
    assert_gone("funclatency", &progs, &links);
}

#[test]
fn slow_attach_detach_cycles_leave_the_target_right_and_nothing_behind() {
    let (progs, links, attached) = cycles_of("slow", &["--over", "1ms"], n_cycles(), 0xd1b5_4a32_d192_ed03);
    assert!(attached * 4 >= n_cycles() * 3 - 4, "{attached} cycles seen attached");
    assert!(!links.is_empty() && !progs.is_empty());
    assert_gone("slow", &progs, &links);
}

/// A plain HTTP GET of `path` from `addr`; the body.
fn get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// `sonde serve` with a funclatency collector on the target, started,
/// scraped (its histogram must count the target's calls) and ended by
/// SIGTERM or SIGKILL, 20 times.
#[test]
fn serve_restarts_leave_the_target_right_and_nothing_behind() {
    let (tgt, bin) = target();
    let before = uprobe_events();
    let target_name = format!("{}:mix", bin.display());
    let (mut progs, mut links) = (BTreeSet::new(), BTreeSet::new());
    for i in 0..20 {
        let mut guard = Target(None);
        let c = guard.0.insert(
            Command::new(SONDE)
                .args(["serve", "--listen", "127.0.0.1:0", "--disable", "retrans", "--disable", "cwnd"])
                .args(["--disable", "profiles", "--funclatency", &target_name])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut stderr = BufReader::new(c.stderr.take().unwrap());
        let mut addr = None;
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap() > 0 {
            if let Some(i) = line.find("listening on http://") {
                addr = line[i + 20..].split([':', ' ']).take(2).collect::<Vec<_>>().join(":").into();
                break;
            }
            line.clear();
        }
        let addr = addr.unwrap_or_else(|| panic!("serve did not start: {line}"));
        std::thread::spawn(move || for _ in stderr.lines() {});
        let (p, l) = bpf_objects(c.id());
        progs.extend(p);
        links.extend(l);
        // The histogram counts the target's calls (20,000 a round).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let m = get(&addr, "/metrics");
            let count = m
                .lines()
                .find(|l| l.starts_with("sonde_function_latency_seconds_count") && l.contains(&target_name))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or(0.0);
            if count >= 20_000.0 {
                break;
            }
            assert!(Instant::now() < deadline, "restart {i}: the histogram counted {count} calls");
            std::thread::sleep(Duration::from_millis(100));
        }
        let sig = if i % 2 == 0 { libc::SIGTERM } else { libc::SIGKILL };
        // SAFETY: kill with a pid we spawned and have not reaped.
        unsafe { libc::kill(c.id() as i32, sig) };
        let st = c.wait().unwrap();
        guard.0 = None;
        assert_eq!(st.code(), if sig == libc::SIGTERM { Some(0) } else { None }, "restart {i}");
    }
    let (rounds, mismatches, code) = finish(tgt);
    println!(
        "serve: 20 restarts ({} programs, {} links); target: {rounds} rounds, {mismatches} mismatches",
        progs.len(),
        links.len()
    );
    assert_eq!(code, Some(0));
    assert_eq!(mismatches, 0);
    assert_eq!(uprobe_events(), before);
    assert!(!links.is_empty());
    assert_gone("serve", &progs, &links);
}
