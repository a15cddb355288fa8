//! User stacks without frame pointers: the table walk against workloads
//! whose call structure is built in, against the frame-pointer walk, and
//! against `perf record --call-graph dwarf`.
use super::common::*;

/// Most optimised C: no frame pointers (as Debian builds its packages).
const NOFP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer"];
/// The same code with frame pointers.
const WITHFP: &[&str] = &["-O2", "-g", "-fno-omit-frame-pointer"];

/// The expected stacks of calltree.c from main down (DEPTH 3) and their
/// shares of its work.
fn calltree_expected() -> Vec<(String, f64)> {
    let top = "main;descend;descend;descend;descend;round_";
    vec![
        (format!("{top};alpha;beta;gamma_;work"), 0.5),
        (format!("{top};alpha;delta;work"), 0.3),
        (format!("{top};epsilon;work"), 0.2),
    ]
}

/// Folded rows cut to the part from `main` down; rows without main are
/// `[no main]`.
fn from_main(rows: &[(Vec<String>, u64)]) -> std::collections::BTreeMap<String, u64> {
    let mut m = std::collections::BTreeMap::new();
    for (f, n) in rows {
        let key = match f.iter().position(|x| x == "main") {
            Some(i) => f[i..].join(";"),
            None => "[no main]".into(),
        };
        *m.entry(key).or_default() += n;
    }
    m
}

/// `sonde profile --user-only -F 999 -p PID --unwind MODE` until the process
/// has had 2 s of CPU (3 s of wall time on a quiet host; beside CPU hogs a
/// fixed 3 s window got the workload 0.4 s of CPU: 377 samples): the folded
/// rows and the summary line printed with --json. The workloads run for
/// 600 s and are killed when their test ends: on a busy host a window can
/// take many times its CPU time (a 60 s workload ended before its third).
fn profile_user(pid: u32, mode: &str, dir: &std::path::Path, tag: &str) -> (Vec<(Vec<String>, u64)>, Value) {
    let folded = dir.join(format!("{tag}.folded"));
    let args = ["-p", &pid.to_string(), "-F", "999", "--user-only", "--unwind", mode, "--json", "-o"];
    let w = profile_window(&[&args[..], &[folded.to_str().unwrap()]].concat(), pid, 2.0);
    assert_eq!(w.code, 130, "SIGINT ends the run: {}", w.stderr);
    let lines: Vec<Value> = json_lines(&w.stdout);
    (read_folded(&folded), summary(&lines).clone())
}

#[test]
fn table_and_frame_pointer_walks_agree_on_a_known_call_tree() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let fp = build_workload("calltree", WITHFP);
    let nofp = build_workload("calltree", NOFP);
    let dir = nofp.parent().unwrap().to_path_buf();
    let want = calltree_expected();
    let check = |tag: &str, rows: &[(Vec<String>, u64)], s: &Value| {
        let m = from_main(rows);
        let total: u64 = m.values().sum();
        assert!(total > 500, "{tag}: {total} samples: {s}");
        // The same stack set: every stack of 1% or more is one of the
        // built-in three, each at its built-in share.
        for (k, n) in &m {
            assert!(
                *n as f64 <= 0.01 * total as f64 || want.iter().any(|(w, _)| w == k),
                "{tag}: unexpected stack {k} ({n} of {total})"
            );
        }
        for (w, share) in &want {
            let got = *m.get(w).unwrap_or(&0) as f64 / total as f64;
            assert!((got - share).abs() < 0.05, "{tag}: {w} has {got:.3} of the samples, built in {share}: {m:?}");
        }
        assert_eq!(s["truncated_stacks"], 0, "{tag}: {s}");
        // It takes no signal: no sample is in the kernel's signal delivery.
        assert_eq!(s["signal_delivery_samples"], 0, "{tag}: {s}");
    };
    let mut a = KillOnDrop(Command::new(&fp).args(["600", "3"]).spawn().unwrap());
    let mut b = KillOnDrop(Command::new(&nofp).args(["600", "3"]).spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let (rows, s) = profile_user(a.0.id(), "fp", &dir, "tree-fp-fp");
    check("frame pointers, --unwind fp", &rows, &s);
    let (rows, s) = profile_user(a.0.id(), "dwarf", &dir, "tree-fp-dwarf");
    check("frame pointers, --unwind dwarf", &rows, &s);
    assert!(s["unwind"]["walks"]["tables"].as_u64().unwrap() > 500, "{s}");
    let (rows, s) = profile_user(b.0.id(), "dwarf", &dir, "tree-nofp-dwarf");
    check("no frame pointers, --unwind dwarf", &rows, &s);
    // Walked by tables, every one to the program's start.
    let w = &s["unwind"]["walks"];
    assert_eq!(w["complete"], w["tables"], "{s}");
    // Proof that the check can fail: frame pointers on the build without.
    let (rows, s) = profile_user(b.0.id(), "fp", &dir, "tree-nofp-fp");
    let m = from_main(&rows);
    let total: u64 = m.values().sum();
    let reached: u64 = m.iter().filter(|(k, _)| *k != "[no main]").map(|(_, n)| n).sum();
    assert!((reached as f64) < 0.1 * total as f64, "frame pointers cannot walk this build: {m:?} {s}");
    let _ = (a.0.kill(), b.0.kill());
}

/// `perf script` output as stacks, leaf first, function names only.
fn perf_stacks(data: &std::path::Path) -> Vec<Vec<String>> {
    let out = Command::new("perf")
        .args(["script", "-F", "ip,sym", "-i"])
        .arg(data)
        .output()
        .expect("perf (Debian package linux-perf)");
    assert!(out.status.success(), "perf script: {}", String::from_utf8_lossy(&out.stderr));
    let mut stacks = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let l = l.trim();
        if l.is_empty() {
            if !cur.is_empty() {
                stacks.push(std::mem::take(&mut cur));
            }
            continue;
        }
        // "ADDR SYMBOL (inlined)": the symbol; [unknown] kept as is.
        let sym = l.split_once(' ').map(|(_, s)| s.trim_end_matches(" (inlined)").to_string()).unwrap_or_default();
        cur.push(sym);
    }
    if !cur.is_empty() {
        stacks.push(cur);
    }
    stacks
}

/// (leaf, caller) pairs holding at least `min` of `stacks` (leaf first).
fn leaf_callers(stacks: &[(Vec<String>, u64)], min: f64) -> std::collections::BTreeSet<(String, String)> {
    let total: u64 = stacks.iter().map(|s| s.1).sum();
    let mut m: std::collections::BTreeMap<(String, String), u64> = Default::default();
    for (s, n) in stacks {
        if s.len() >= 2 {
            *m.entry((s[0].clone(), s[1].clone())).or_default() += n;
        }
    }
    m.into_iter().filter(|(_, n)| *n as f64 >= min * total as f64).map(|(k, _)| k).collect()
}

#[test]
fn perf_dwarf_unwinding_finds_the_same_callers_of_the_hottest_leaves() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let nofp = build_workload("calltree", NOFP);
    let dir = nofp.parent().unwrap().to_path_buf();
    let w = KillOnDrop(Command::new(&nofp).args(["600", "3"]).spawn().unwrap());
    let pid = w.0.id();
    thread::sleep(Duration::from_millis(200));
    // Both on the same process over the same window: perf until sonde's
    // run has ended.
    let data = dir.join("perf.data");
    let perf = Command::new("perf")
        .args(["record", "-q", "-F", "499", "--call-graph", "dwarf", "-p", &pid.to_string(), "-o"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perf (Debian package linux-perf)");
    let (rows, _) = profile_user(pid, "dwarf", &dir, "perf-oracle");
    // SAFETY: kill takes no pointers.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let out = perf.wait_with_output().unwrap();
    // perf writes its data, then ends by the signal it was stopped with.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGINT),
        "perf record: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: Vec<(Vec<String>, u64)> =
        rows.into_iter().map(|(f, n)| (f.into_iter().skip(1).rev().collect(), n)).collect();
    let theirs: Vec<(Vec<String>, u64)> = perf_stacks(&data).into_iter().map(|s| (s, 1)).collect();
    assert!(theirs.len() > 300, "perf took {} samples", theirs.len());
    let (a, b) = (leaf_callers(&ours, 0.05), leaf_callers(&theirs, 0.05));
    assert_eq!(a, b, "callers of the hottest leaves: sonde {a:?}, perf {b:?}");
    let want: std::collections::BTreeSet<(String, String)> =
        [("work", "gamma_"), ("work", "delta"), ("work", "epsilon")]
            .iter()
            .map(|(x, y)| (x.to_string(), y.to_string()))
            .collect();
    assert_eq!(a, want);
    // And the whole chain of each, from main down (perf names glibc's
    // start differently; compare from main).
    let chains = |v: &[(Vec<String>, u64)]| -> std::collections::BTreeSet<String> {
        let total: u64 = v.iter().map(|s| s.1).sum();
        let m = from_main(&v.iter().map(|(s, n)| (s.iter().rev().cloned().collect(), *n)).collect::<Vec<_>>());
        m.into_iter().filter(|(k, n)| k != "[no main]" && *n as f64 >= 0.05 * total as f64).map(|(k, _)| k).collect()
    };
    assert_eq!(chains(&ours), chains(&theirs));
}

/// Blocked microseconds under each named function of libcblock's main
/// thread, and the stacks.
fn blocked_under(rows: &[(Vec<String>, u64)], name: &str) -> u64 {
    rows.iter().filter(|(f, _)| f.iter().any(|x| x == name)).map(|r| r.1).sum()
}

#[test]
fn offcpu_attributes_blocking_libc_calls_to_their_callers() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let bin = build_workload("libcblock", &["-O2", "-g", "-fomit-frame-pointer", "-pthread"]);
    let dir = bin.parent().unwrap().to_path_buf();
    // Under SCHED_FIFO: beside CPU hogs the main thread was preempted while
    // it waited for the helper to take the mutex, and then blocked in
    // pthread_mutex_lock for only the rest of the helper's 24 ms (in_mutex
    // 0.238 of the blocked time, built in 0.267).
    let w = KillOnDrop(sonde::lab::realtime_command(&mut Command::new(&bin)).arg("20").spawn().unwrap());
    let tid = w.0.id().to_string();
    thread::sleep(Duration::from_millis(200));
    let run = |mode: &str| {
        let folded = dir.join(format!("libc-{mode}.folded"));
        // Sleeps only: time the thread spends preempted (the CPUs are shared
        // with the tests beside it) is not part of the built-in split.
        let out = Command::new(SONDE)
            .args([
                "offcpu",
                "--tid",
                &tid,
                "-d",
                "3s",
                "--state",
                "interruptible",
                "--unwind",
                mode,
                "-o",
                folded.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        read_folded(&folded)
    };
    let rows = run("auto");
    let total: u64 = rows.iter().map(|r| r.1).sum();
    assert!(total > 2_000_000, "main thread blocked {total} us of 3 s");
    // Built in: 6:12:18:24:30 ms per 90 ms round, each through its libc call.
    for (caller, ms, libc_fn) in [
        ("in_usleep", 6.0, "usleep"),
        ("in_poll", 12.0, "poll"),
        ("in_read", 18.0, "read"),
        ("in_mutex", 24.0, "mutex_lock"),
        ("in_cond", 30.0, "cond_wait"),
    ] {
        let share = blocked_under(&rows, caller) as f64 / total as f64;
        assert!(
            (share - ms / 90.0).abs() < 0.025,
            "{caller}: {share:.3} of the blocked time, built in {:.3}: {rows:?}",
            ms / 90.0
        );
        // The libc function sits right under its caller, and the stacks reach main.
        let through = rows
            .iter()
            .filter(|(f, _)| {
                f.iter().position(|x| x == caller).is_some_and(|i| {
                    f.get(i + 1).is_some_and(|g| g.contains(libc_fn)) && f[..i].iter().any(|x| x == "main")
                })
            })
            .map(|r| r.1)
            .sum::<u64>();
        assert!(through as f64 > 0.95 * blocked_under(&rows, caller) as f64, "{caller} -> *{libc_fn}*: {rows:?}");
    }
    // Proof the check can fail: the kernel's frame-pointer walk starts in
    // libc and finds none of the callers.
    let rows = run("fp");
    let named: u64 =
        ["in_usleep", "in_poll", "in_read", "in_mutex", "in_cond"].iter().map(|c| blocked_under(&rows, c)).sum();
    let total: u64 = rows.iter().map(|r| r.1).sum();
    assert!((named as f64) < 0.05 * total as f64, "frame pointers found {named} of {total} us under the callers");
}

#[test]
fn rust_and_cxx_release_builds_reach_main() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    // Rust, release (rustc -O: no frame pointers on x86-64 Linux).
    let dir = std::env::temp_dir().join(format!("sonde-wl-{}-rust", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rust = dir.join("rustwork");
    let st = Command::new("rustc")
        .args(["-O", "-C", "debuginfo=1", "-o"])
        .arg(&rust)
        .arg(format!("{}/tests/workloads/rustwork.rs", env!("CARGO_MANIFEST_DIR")))
        .status()
        .expect("rustc");
    assert!(st.success());
    let cxx = dir.join("cxxwork");
    let st = Command::new("g++")
        .args(["-O2", "-g", "-o"])
        .arg(&cxx)
        .arg(format!("{}/tests/workloads/cxxwork.cpp", env!("CARGO_MANIFEST_DIR")))
        .status()
        .expect("g++");
    assert!(st.success());
    for (bin, needles) in [
        (&rust, vec![vec!["rustwork::main", "rustwork::top", "rustwork::middle", "rustwork::leaf"]]),
        (
            &cxx,
            vec![
                vec!["main", "catcher(int)", "middle(int)", "thrower(int)", "__cxa_throw", "_Unwind_RaiseException"],
                vec!["main", "sorter(", "by_key("],
            ],
        ),
    ] {
        let w = KillOnDrop(Command::new(bin).arg("600").spawn().unwrap());
        thread::sleep(Duration::from_millis(300));
        let (rows, s) = profile_user(w.0.id(), "auto", &dir, "lang");
        let total: u64 = rows.iter().map(|r| r.1).sum();
        let main: u64 = rows
            .iter()
            .filter(|(f, _)| f.iter().any(|x| x == "main") && !f.iter().any(|x| x == "[truncated]"))
            .map(|r| r.1)
            .sum();
        assert!(main as f64 > 0.95 * total as f64, "{bin:?}: {main} of {total} samples reach main: {s}");
        // Each chain, in order (names may carry arguments or closures between).
        for chain in needles {
            let hits: u64 = rows
                .iter()
                .filter(|(f, _)| {
                    let mut at = 0;
                    chain.iter().all(|c| {
                        match f[at..].iter().position(|x| x == c || (c.ends_with('(') && x.starts_with(c))) {
                            Some(i) => {
                                at += i + 1;
                                true
                            }
                            None => false,
                        }
                    })
                })
                .map(|r| r.1)
                .sum();
            assert!(
                hits as f64 > 0.02 * total as f64,
                "{bin:?}: chain {chain:?} in {hits} of {total} samples: {rows:?}"
            );
        }
        // Frame pointers alone lose them.
        let (rows, _) = profile_user(w.0.id(), "fp", &dir, "lang-fp");
        let total: u64 = rows.iter().map(|r| r.1).sum();
        let cut: u64 = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "[truncated]")).map(|r| r.1).sum();
        assert!(cut as f64 > 0.5 * total as f64, "{bin:?} by frame pointers: {cut} of {total} cut");
    }
}

/// Runs edges.c in `mode` and profiles it ([`profile_user`], `--unwind
/// auto`): folded rows and summary.
fn edges(mode: &[&str]) -> (Vec<(Vec<String>, u64)>, Value) {
    let bin = build_workload("edges", NOFP);
    let dir = bin.parent().unwrap().to_path_buf();
    let w = KillOnDrop(Command::new(&bin).args(mode).spawn().unwrap());
    thread::sleep(Duration::from_millis(100));
    profile_user(w.0.id(), "auto", &dir, &format!("edges-{}", mode[0]))
}

fn index_of(f: &[String], name: &str) -> Option<usize> {
    f.iter().position(|x| x == name)
}

/// `edges MODE`: its SIGPROF handler's samples continue from `root` to the
/// interrupted function, through the trampoline, into the handler
/// (`root -> interrupted -> (where it was) -> trampoline -> on_signal`),
/// and no stack is cut.
fn handler_continues_to(mode: &str, root: &str) {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let (rows, s) = edges(&[mode, "600"]);
    let handler: Vec<&(Vec<String>, u64)> = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "on_signal")).collect();
    let n: u64 = handler.iter().map(|r| r.1).sum();
    assert!(n > 20, "samples in the handler: {rows:?}");
    let through: u64 = handler
        .iter()
        .filter(|(f, _)| {
            let (m, i, t, h) = (
                index_of(f, root),
                index_of(f, "interrupted"),
                index_of(f, "[signal trampoline]"),
                index_of(f, "on_signal"),
            );
            matches!((m, i, t, h), (Some(m), Some(i), Some(t), Some(h)) if m < i && i < t && t < h)
        })
        .map(|r| r.1)
        .sum();
    assert!(through as f64 > 0.95 * n as f64, "{through} of {n} handler samples continue to {root}: {handler:?}");
    assert_eq!(s["truncated_stacks"], 0, "{s}");
}

#[test]
fn a_signal_handler_stack_continues_through_the_trampoline() {
    handler_continues_to("signal", "main");
}

/// A program that raises a signal at itself without pause spends most of
/// its time in the kernel entering and leaving its handler, where the
/// kernel rewrites the thread's user registers one at a time: a sample
/// there could see the pc of one frame beside the stack pointer of
/// another, and a walk from them named frames the program never had (5
/// to 11 of 39,000 samples at 9,999 Hz before). Those samples show
/// `[signal delivery]`, counted; every other stack reaches main with no
/// frame cut or unknown, but for one in 20,000 (at least one: a sample in
/// an interrupt taken inside that kernel code is not recognized).
#[test]
fn samples_taken_while_the_kernel_delivers_a_signal_name_no_frames_from_half_written_registers() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let bin = build_workload("edges", NOFP);
    let dir = bin.parent().unwrap().to_path_buf();
    let w = KillOnDrop(Command::new(&bin).args(["storm", "600"]).spawn().unwrap());
    thread::sleep(Duration::from_millis(100));
    let folded = dir.join("storm.folded");
    let pid = w.0.id().to_string();
    // The kernel lowers its limit where sampling interrupts run long.
    let limit: u64 = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(9999);
    let hz = 9999.min(limit * 9 / 10).to_string();
    let args = ["-p", &pid, "-F", &hz, "--user-only", "--unwind", "auto", "--json", "-o", folded.to_str().unwrap()];
    let win = profile_window(&args, w.0.id(), 4.0);
    assert_eq!(win.code, 130, "SIGINT ends the run: {}", win.stderr);
    let lines: Vec<Value> = json_lines(&win.stdout);
    let s = summary(&lines).clone();
    let rows = read_folded(&folded);
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let hz: u64 = hz.parse().unwrap();
    assert!(total > hz, "{total} samples at {hz} Hz in 4 s of the program's CPU: {s}");
    let delivery = |f: &[String]| f[1..] == ["[signal delivery]_[k]"];
    let wrong: Vec<_> = rows
        .iter()
        .filter(|(f, _)| !delivery(f))
        .filter(|(f, _)| index_of(f, "main").is_none() || f.iter().any(|x| x == "[truncated]" || x == "[unknown]"))
        .collect();
    let n: u64 = wrong.iter().map(|r| r.1).sum();
    assert!(n <= (total / 20_000).max(1), "{n} of {total} samples do not reach main or name unknown frames: {wrong:?}");
    assert!(s["truncated_samples"].as_u64().unwrap() <= n, "{s}");
    let signal: u64 = rows.iter().filter(|(f, _)| delivery(f)).map(|r| r.1).sum();
    assert!(signal > 0, "no sample seen in the kernel's signal delivery: {s}");
    assert_eq!(s["signal_delivery_samples"], signal, "{s}");
}

/// A handler on an alternate signal stack (sigaltstack) mapped above the
/// interrupted thread's stack: the walk steps down from the handler's stack
/// to the thread's (once; a second step down would be a loop) and goes on
/// to the thread's start.
#[test]
fn a_signal_handler_on_an_alternate_stack_continues_to_the_thread() {
    handler_continues_to("altsignal", "alt_thread");
}

#[test]
fn recursion_deeper_than_the_walk_is_cut_and_counted() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let (rows, s) = edges(&["deep", "600", "300"]);
    let total: u64 = rows.iter().map(|r| r.1).sum();
    assert!(total > 500);
    // Every stack: [truncated], then only recurse frames down to the spin.
    for (f, _) in &rows {
        assert_eq!(f[1], "[truncated]", "{f:?}");
        let ok = ["recurse", "bottom", "spin_units", "now", "__GI___clock_gettime", "clock_gettime", "[plt]"];
        assert!(f[2..].iter().all(|x| ok.contains(&x.trim_end_matches("_[i]"))), "a wrong frame: {f:?}");
        assert!(f.len() >= 127, "{} frames: {f:?}", f.len());
    }
    assert_eq!(s["truncated_by"]["depth"].as_u64(), Some(total), "{s}");
    assert_eq!(s["unwind"]["walks"]["cut"]["depth"].as_u64(), s["samples"].as_u64(), "{s}");
}

#[test]
fn a_library_opened_later_is_picked_up() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let plugin = build_workload("plugin", &["-O2", "-g", "-fomit-frame-pointer", "-shared", "-fPIC"]);
    let (rows, s) = edges(&["dlopen", "600", plugin.to_str().unwrap()]);
    let inplug: Vec<&(Vec<String>, u64)> = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "plugin_work")).collect();
    let n: u64 = inplug.iter().map(|r| r.1).sum();
    let whole: u64 =
        inplug.iter().filter(|(f, _)| matches!((index_of(f, "main"), index_of(f, "call_plugin"), index_of(f, "plugin_spin")), (Some(a), Some(b), Some(c)) if a < b && b < c)).map(|r| r.1).sum();
    // Samples between the dlopen and the next mapping refresh are walked by
    // frame pointers (and cut, counted); the rest go through the library's table.
    assert!(n > 500 && whole as f64 > 0.6 * n as f64, "{whole} of {n} samples in the library reach main: {s}");
    for (f, _) in &inplug {
        assert!(index_of(f, "main").is_some() || f[1] == "[truncated]", "neither whole nor marked cut: {f:?}");
    }
}

#[test]
fn vdso_frames_keep_their_callers() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let (rows, s) = edges(&["vdso", "600"]);
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let in_vdso: u64 =
        rows.iter().filter(|(f, _)| f.last().is_some_and(|x| x.contains("clock_gettime"))).map(|r| r.1).sum();
    let whole: u64 = rows
        .iter()
        .filter(|(f, _)| {
            f.last().is_some_and(|x| x.contains("clock_gettime"))
                && matches!((index_of(f, "main"), index_of(f, "vdso_loop")), (Some(a), Some(b)) if a < b)
        })
        .map(|r| r.1)
        .sum();
    assert!(
        in_vdso as f64 > 0.3 * total as f64 && whole == in_vdso,
        "{whole} of {in_vdso} vDSO samples reach main: {rows:?} {s}"
    );
}

#[test]
fn a_binary_without_section_headers_is_walked_through_its_program_headers() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let nofp = build_workload("calltree", NOFP);
    let stripped = nofp.with_file_name("calltree-nosections");
    std::fs::copy(&nofp, &stripped).unwrap();
    let st = Command::new("llvm-objcopy")
        .arg("--strip-sections")
        .arg(&stripped)
        .status()
        .expect("llvm-objcopy (Debian package llvm)");
    assert!(st.success());
    let sh = Command::new("readelf").arg("-S").arg(&stripped).output().unwrap();
    assert!(String::from_utf8_lossy(&sh.stdout).contains("no sections"), "section headers are gone");
    let w = KillOnDrop(Command::new(&stripped).args(["600", "0"]).spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let dir = stripped.parent().unwrap().to_path_buf();
    let (rows, s) = profile_user(w.0.id(), "dwarf", &dir, "nosections");
    // No symbols, but complete stacks whose depths carry the built-in split:
    // _start, 2 libc frames, main, descend, round_, then 4, 3 or 2 frames.
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let depth =
        |d: usize| rows.iter().filter(|(f, _)| f.len() == d + 1).map(|r| r.1).sum::<u64>() as f64 / total as f64;
    assert_eq!(s["truncated_stacks"], 0, "{s}");
    // Every stack has one of the three depths; their shares are those of a
    // two-second window on a shared host (one CI run saw 0.44 for 0.5), and
    // a walk that loses or invents frames moves whole shares.
    let three: f64 = [10, 9, 8].iter().map(|&d| depth(d)).sum();
    assert!(three > 0.99, "{three:.3} of the samples have one of the three depths: {rows:?}");
    for (d, share) in [(10, 0.5), (9, 0.3), (8, 0.2)] {
        assert!(
            (depth(d) - share).abs() < 0.1,
            "{d} frames: {:.3} of the samples, built in {share}: {rows:?}",
            depth(d)
        );
    }
}

#[test]
fn stacks_of_a_process_in_its_own_mount_namespace_and_one_that_exits() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    // A "container" running a build without frame pointers from a tmpfs
    // only it sees; selected by --comm.
    let bin = build_workload("calltree", NOFP);
    let script = format!("mount -t tmpfs none /mnt && cp {} /mnt/ctree && exec /mnt/ctree 6 3", bin.display());
    let c = KillOnDrop(
        Command::new("unshare")
            .args(["--mount", "--pid", "--fork", "--mount-proc", "sh", "-c", &script])
            .spawn()
            .unwrap(),
    );
    // And one that exits before the end of the run (2 s after its start,
    // the run ends after 3.4 s; 1.5 s left too little of a run beside the
    // other for a debug build's start-up on a busy host).
    let early = KillOnDrop(Command::new(&bin).args(["2", "3"]).spawn().unwrap());
    thread::sleep(Duration::from_millis(400));
    let dir = bin.parent().unwrap().to_path_buf();
    let run = |sel: Vec<String>, tag: &str| {
        let folded = dir.join(format!("{tag}.folded"));
        let mut args = sel;
        args.extend(["-d", "3s", "-F", "499", "--user-only", "-o", folded.to_str().unwrap()].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err) = profile(&args);
        assert_eq!(code, 0, "{err}");
        (read_folded(&folded), err)
    };
    let pid = early.0.id().to_string();
    let (ns, exited) = thread::scope(|sc| {
        let a = sc.spawn(|| run(vec!["--comm".into(), "ctree".into()], "ns-nofp"));
        let b = sc.spawn(|| run(vec!["-p".into(), pid.clone()], "early-nofp"));
        (a.join().unwrap(), b.join().unwrap())
    });
    drop(c);
    for (root, (rows, err)) in [("ctree", ns), ("calltree", exited)] {
        let n: u64 = rows.iter().filter(|(f, _)| f[0] == root).map(|r| r.1).sum();
        let whole: u64 = rows
            .iter()
            .filter(|(f, _)| f[0] == root && f.iter().any(|x| x == "main") && f.iter().any(|x| x == "round_"))
            .map(|r| r.1)
            .sum();
        assert!(n > 100 && whole as f64 > 0.95 * n as f64, "{root}: {whole} of {n} samples reach main: {rows:?} {err}");
    }
}

#[test]
fn go_binaries_are_walked_and_named_from_their_own_table() {
    // Spins the CPUs: alone, so the timing tests beside it keep their oracles.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    // Go code has no .eh_frame; every Go binary keeps its runtime's function
    // table (.gopclntab), which `-ldflags=-s -w` leaves in place while it
    // strips the symbols and the DWARF .debug_frame. Built both ways, every
    // stack goes main.main -> main.outer -> main.inner, walked by the rows
    // sonde makes from that table and named from it (tests/integration/
    // golang.rs checks names and lines against the program's own profile).
    let dir = std::env::temp_dir().join(format!("sonde-wl-{}-go", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, flags) in [("gowork", ""), ("gowork-stripped", "-s -w")] {
        let bin = dir.join(name);
        let st = Command::new(go_bin())
            .args(["build", "-ldflags", flags, "-o"])
            .arg(&bin)
            .arg(format!("{}/tests/workloads/gowork.go", env!("CARGO_MANIFEST_DIR")))
            .env("GOCACHE", dir.join("gocache"))
            .env("CGO_ENABLED", "0")
            .status()
            .expect("go");
        assert!(st.success());
        let w = KillOnDrop(Command::new(&bin).arg("600").spawn().unwrap());
        thread::sleep(Duration::from_millis(300));
        let (rows, s) = profile_user(w.0.id(), "auto", &dir, name);
        let rows: Vec<(Vec<String>, u64)> = rows
            .into_iter()
            .map(|(f, n)| (f.into_iter().map(|x| x.trim_end_matches("_[go]").to_string()).collect(), n))
            .collect();
        let total: u64 = rows.iter().map(|r| r.1).sum();
        let w = &s["unwind"]["walks"];
        let whole: u64 = rows
            .iter()
            .filter(|(f, _)| matches!((index_of(f, "main.main"), index_of(f, "main.outer"), index_of(f, "main.inner")), (Some(a), Some(b), Some(c)) if a < b && b < c))
            .map(|r| r.1)
            .sum();
        assert!(
            whole as f64 > 0.9 * total as f64,
            "{name}: {whole} of {total} samples through main.main -> outer -> inner: {rows:?}"
        );
        let cut: u64 = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "[truncated]")).map(|r| r.1).sum();
        assert!((cut as f64) < 0.02 * total as f64, "{name}: {cut} of {total} cut: {s}");
        assert!(w["tables"].as_u64().unwrap() as f64 > 0.9 * total as f64, "{name}: walked by tables: {s}");
    }
}
