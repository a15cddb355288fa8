//! JavaScript frames on V8, read from Node's own structures with no flag
//! and no agent, on Node.js 18, 20, 22, 24 and 26 (V8 10.2 to 14.6; 25 read
//! as an untested line): the 2:1 split that
//! nodesplit.js builds in (with V8 inlining heavy() and light() into their
//! callers, and without; baseline and interpreted), the (function, caller)
//! pairs and the shares against V8's own profiler (`node --cpu-prof`) of the
//! same process, a loop V8 replaces on the stack (OSR), off-CPU waits under
//! an async function, and a Node sonde does not read.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::common::*;

/// The Node.js builds the test runs: the machine's Node 20, and 18, 22,
/// 24 and 26 from the npm registry's official builds (scripts/setup).
fn nodes() -> Vec<(&'static str, PathBuf)> {
    ["18", "20", "22", "24", "26"].iter().map(|v| (*v, node_bin(v))).collect()
}

/// Node `v`'s binary.
fn node_bin(v: &str) -> PathBuf {
    let p =
        PathBuf::from(if v == "20" { "/usr/bin/node".to_string() } else { format!("/opt/sonde-node/{v}/bin/node") });
    assert!(p.exists(), "Node.js {v} at {} (scripts/setup installs it)", p.display());
    p
}

fn script() -> String {
    format!("{}/tests/workloads/nodesplit.js", env!("CARGO_MANIFEST_DIR"))
}

/// The line of the workload's source holding `marker`.
fn line_of(marker: &str) -> u64 {
    let src = std::fs::read_to_string(script()).unwrap();
    src.lines().position(|l| l.contains(marker)).expect("marker") as u64 + 1
}

fn node(bin: &Path, flags: &[&str], args: &[&str]) -> KillOnDrop {
    let mut c = Command::new(bin);
    c.args(flags).arg(script()).args(args).stdout(Stdio::null()).stderr(Stdio::null());
    KillOnDrop(c.spawn().unwrap())
}

/// Node `bin` running the workload with `flags`, V8's trace of what it
/// optimizes (`--trace-opt`) on its standard output, written to `log`.
fn node_traced(bin: &Path, flags: &[&str], args: &[&str], log: &Path) -> KillOnDrop {
    let mut c = Command::new(bin);
    c.arg("--trace-opt").args(flags).arg(script()).args(args);
    c.stdout(std::fs::File::create(log).unwrap()).stderr(Stdio::null());
    KillOnDrop(c.spawn().unwrap())
}

/// Whether V8's trace says it finished optimizing `name` with TurboFan
/// (V8 10.2 prints `[optimizing ... - took` for a compilation on the main
/// thread; all print `[completed optimizing` for one done beside it).
fn turbofan_done(trace: &str, name: &str) -> bool {
    let tag = format!("<JSFunction {name} ");
    trace.lines().any(|l| {
        l.contains(&tag)
            && l.contains("(target TURBOFAN")
            && (l.starts_with("[completed optimizing") || (l.starts_with("[optimizing") && l.contains(" took ")))
    })
}

/// Compilations V8's trace says it finished of the functions in `watch`
/// (any tier).
fn compiled(trace: &str, watch: &[&str]) -> usize {
    trace
        .lines()
        .filter(|l| l.starts_with("[completed") || (l.starts_with("[optimizing") && l.contains(" took ")))
        .filter(|l| watch.iter().any(|f| l.contains(&format!("<JSFunction {f} "))))
        .count()
}

/// Waits, by the process's own CPU (a busy host does not shorten it),
/// until V8 (run by [`node_traced`], its trace in `log`) has optimized each
/// of `hot` with TurboFan, has finished no compilation of the functions in
/// `watch` for the last half second of that CPU, and `min_cpu` seconds of
/// it have passed (V8 compiles the callers, inlining the loops, later, on
/// budgets of their own: from 1.5 s of CPU on, Node 26's parent() and Node
/// 20's parentI() were sampled before it had). The built-in 2:1 of two loops holds only while both run
/// code of one tier: beside other work V8's compiler thread runs late, and
/// two CI runs sampled from a fixed 2 s on gave heavy's share 0.603 and
/// 0.615 (light still slower code). What V8 had done, for a failure's
/// message; after 60 s it goes on and says so.
fn wait_settled(pid: u32, log: &Path, hot: &[&str], watch: &[&str], min_cpu: f64) -> String {
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (c0, t0) = (cpu_ticks(pid), Instant::now());
    let (mut seen, mut since) = (usize::MAX, c0);
    loop {
        let trace = std::fs::read_to_string(log).unwrap_or_default();
        let (now, n) = (cpu_ticks(pid), compiled(&trace, watch));
        if n != seen {
            (seen, since) = (n, now);
        }
        let missing: Vec<&str> = hot.iter().filter(|f| !turbofan_done(&trace, f)).copied().collect();
        let cpu = (now - c0) as f64 / hz;
        if missing.is_empty() && cpu >= min_cpu && (now - since) as f64 >= 0.5 * hz {
            let said = format!(
                "V8 settled after {cpu:.1} s of the program's CPU, {:.1} s of the clock ({n} compilations of its functions)",
                t0.elapsed().as_secs_f64()
            );
            eprintln!("{}: {said}", log.display());
            return said;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return format!(
                "V8 had not settled after 60 s ({cpu:.1} s of CPU): not optimized by TurboFan: {missing:?}; \
                 {n} compilations, the last {:.1} s of CPU ago",
                (now - since) as f64 / hz
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The workload's functions that run in mode `cpu` (and `deopt`'s first
/// half), and the two whose 2:1 the tests check.
const CPU_FUNCS: [&str; 5] = ["heavy", "light", "parent", "batch", "tick"];
const SPLIT: [&str; 2] = ["heavy", "light"];

/// Ends a workload of nodesplit.js early by SIGTERM (on which it exits
/// through process.exit, and `--cpu-prof` writes its profile); it must
/// exit cleanly.
fn end_by_sigterm(w: &mut KillOnDrop, what: &str) {
    // SAFETY: kill takes no pointers.
    unsafe { libc::kill(w.0.id() as i32, libc::SIGTERM) };
    assert!(w.0.wait().unwrap().success(), "{what} exited badly");
}

/// (callee, caller) of consecutive frames of the workload's, by weight.
type Pairs = BTreeMap<(String, String), u64>;

fn ours(f: &Value) -> bool {
    f["kind"] == "javascript" && f["file"].as_str().is_some_and(|x| x.ends_with("nodesplit.js"))
}

fn sonde_pairs(stacks: &[(Vec<Value>, u64)]) -> Pairs {
    call_sites(stacks, ours).into_iter().fold(Pairs::new(), |mut m, ((a, b, _), n)| {
        *m.entry((a, b)).or_default() += n;
        m
    })
}

/// Each sample of V8's own profile (`--cpu-prof`) in `dir`: its node and
/// the node's parents, the workload's frames only, leaf first; a function
/// with no name is called `anon`.
fn cpu_prof_chains(dir: &Path, anon: &str) -> Vec<Vec<String>> {
    let f = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "cpuprofile"))
        .expect("node --cpu-prof wrote its profile");
    let p: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
    let mut parent: HashMap<u64, u64> = HashMap::new();
    let mut frame: HashMap<u64, Option<String>> = HashMap::new();
    for n in p["nodes"].as_array().unwrap() {
        let id = n["id"].as_u64().unwrap();
        for c in n["children"].as_array().into_iter().flatten() {
            parent.insert(c.as_u64().unwrap(), id);
        }
        let cf = &n["callFrame"];
        let name = cf["functionName"].as_str().filter(|s| !s.is_empty()).unwrap_or(anon).to_string();
        frame.insert(id, cf["url"].as_str().unwrap_or("").ends_with("nodesplit.js").then_some(name));
    }
    let mut out = Vec::new();
    for s in p["samples"].as_array().unwrap() {
        let mut chain = Vec::new(); // leaf first
        let mut id = s.as_u64();
        while let Some(i) = id {
            if let Some(Some(name)) = frame.get(&i) {
                chain.push(name.clone());
            }
            id = parent.get(&i).copied();
        }
        out.push(chain);
    }
    out
}

/// The same from V8's own profile (`--cpu-prof`).
fn cpu_prof_pairs(dir: &Path) -> Pairs {
    let mut out = Pairs::new();
    for chain in cpu_prof_chains(dir, "(anonymous)") {
        for w in chain.windows(2) {
            *out.entry((w[0].clone(), w[1].clone())).or_default() += 1;
        }
    }
    out
}

/// Pairs carrying at least 3% of the weight (a stray sample is noise).
fn sites(p: &Pairs) -> BTreeSet<(String, String)> {
    let total: u64 = p.iter().filter(|(k, _)| k.0 == "parent").map(|(_, n)| n).sum();
    p.iter().filter(|(_, &n)| n * 33 >= total).map(|(k, _)| k.clone()).collect()
}

/// heavy's share of heavy + light, each under parent.
fn heavy_share(p: &Pairs) -> (f64, u64) {
    let w = |f: &str| p.get(&(f.to_string(), "parent".to_string())).copied().unwrap_or(0);
    let (h, l) = (w("heavy"), w("light"));
    (h as f64 / (h + l).max(1) as f64, h + l)
}

/// The workload's stacks as `name(how)` paths from the root, most
/// sampled first: what a failure shows.
fn js_paths(stacks: &[(Vec<Value>, u64)]) -> String {
    let mut m: std::collections::BTreeMap<String, u64> = Default::default();
    for (f, n) in stacks {
        let p: Vec<String> = f
            .iter()
            .filter(|x| ours(x))
            .map(|x| format!("{}({})", x["name"].as_str().unwrap_or("?"), x["how"].as_str().unwrap_or("")))
            .collect();
        *m.entry(p.join(";")).or_default() += n;
    }
    let mut v: Vec<(String, u64)> = m.into_iter().collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.1));
    v.iter().take(12).map(|(p, n)| format!("\n  {n} {p}")).collect()
}

/// Samples whose stacks hold a frame named `name`.
fn under(stacks: &[(Vec<Value>, u64)], name: &str) -> u64 {
    stacks.iter().filter(|(f, _)| f.iter().any(|x| ours(x) && x["name"] == name)).map(|s| s.1).sum()
}

/// Samples where `name` is a frame V8 inlined into its caller.
fn inlined(stacks: &[(Vec<Value>, u64)], name: &str) -> u64 {
    stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| ours(x) && x["name"] == name && x["inlined"] == true))
        .map(|s| s.1)
        .sum()
}

/// Profiles the workload in mode `cpu` beside V8's own profiler, with
/// `flags`: the pairs agree, the split is the workload's, parent() is on
/// every sample of the loop, and the call sites are the source's lines.
fn against_cpu_prof(v: &str, bin: &Path, what: &str, flags: &[&str], dir: &Path) -> Vec<(Vec<Value>, u64)> {
    let prof = dir.join(format!("prof-{v}-{}", flags.join("").replace('-', "")));
    let _ = std::fs::remove_dir_all(&prof);
    let cp = format!("--cpu-prof-dir={}", prof.display());
    let mut all: Vec<&str> = flags.to_vec();
    all.extend(["--cpu-prof", cp.as_str(), "--cpu-prof-interval=500"]);
    // Long enough for the window below beside other work (a 10-s run
    // beside two CPU hogs ended after 2.5 s of its CPU in the window),
    // then ended by SIGTERM, on which V8 writes its profile.
    let log = dir.join(format!("opt-{v}-{}.log", flags.join("").replace('-', "")));
    let mut w = node_traced(bin, &all, &["cpu", "40"], &log);
    let pid = w.0.id();
    // Warm: V8 has optimized (or, held back, compiled) what runs.
    let hot: &[&str] = if flags.contains(&"--no-opt") { &[] } else { &SPLIT };
    let settled = wait_settled(pid, &log, hot, &CPU_FUNCS, 2.5);
    let (stacks, err) = profile_json(pid, dir, &[]);
    let err = format!("{settled}; {err}");
    end_by_sigterm(&mut w, &format!("Node {v} ({what})"));
    let (a, b) = (sonde_pairs(&stacks), cpu_prof_pairs(&prof));
    assert_eq!(sites(&a), sites(&b), "Node {v} ({what}): sonde's (function, caller) pairs against --cpu-prof's; {err}");
    let ((sa, na), (sb, _)) = (heavy_share(&a), heavy_share(&b));
    // Beside other tests the shares spread wider than their counts explain,
    // V8's own too (CI runs of this stop: sonde 0.719 of 1,473 samples, and
    // in another run sonde 0.673 where --cpu-prof gave 0.741): each is held
    // to the built-in 2:1 within 0.08 (sonde) and 0.10 (V8).
    assert!(
        na > 300 && (sa - 2.0 / 3.0).abs() < 0.08,
        "Node {v} ({what}): heavy's share {sa:.3} of {na}, --cpu-prof's {sb:.3}; {err}"
    );
    assert!((sb - 2.0 / 3.0).abs() < 0.10, "Node {v} ({what}): --cpu-prof's own share {sb:.3}");
    let (batch, parent) = (under(&stacks, "batch"), under(&stacks, "parent"));
    assert!(parent as f64 >= 0.95 * batch as f64, "Node {v} ({what}): parent on {parent} of {batch}; {err}");
    // The call sites are the source's (every tier keeps its positions
    // while V8's profiler runs).
    let sites = call_sites(&stacks, ours);
    for (callee, marker) in [("heavy", "sink += heavy("), ("light", "sink += light(")] {
        let want = line_of(marker);
        let lines: BTreeSet<u64> =
            sites.iter().filter(|(k, &n)| k.0 == callee && k.1 == "parent" && n >= 10).map(|(k, _)| k.2).collect();
        assert_eq!(lines, BTreeSet::from([want]), "Node {v} ({what}): lines of parent's call of {callee}; {err}");
    }
    stacks
}

/// The split and pairs against `--cpu-prof` on Node `v`, V8 inlining
/// heavy() and light() into parent() and not.
fn split_matches_cpu_prof(v: &str) {
    let dir = scratch_dir(&format!("node-{v}"));
    {
        let bin = node_bin(v);
        let s = against_cpu_prof(v, &bin, "inlined", &[], &dir);
        // V8 inlines what its budget allows: heavy() and light() into
        // parent() (18 to 22, 26), or parent() and batch() into tick() (24).
        let all = under(&s, "parent");
        let most = ["heavy", "light", "parent", "batch"].iter().map(|f| inlined(&s, f)).max().unwrap_or(0);
        assert!(most * 10 >= all * 9, "Node {v}: V8 inlined some of the workload's functions: {}", js_paths(&s));
        // Maglev inlines too (V8 11.3 on, Node 20): beside other work
        // Node 26 was sampled in Maglev's code before TurboFan's, with
        // heavy() and light() inlined (237 samples).
        let no_inline: &[&str] =
            if v == "18" { &["--no-turbo-inlining"] } else { &["--no-turbo-inlining", "--no-maglev-inlining"] };
        let s = against_cpu_prof(v, &bin, "not inlined", no_inline, &dir);
        assert_eq!(inlined(&s, "heavy") + inlined(&s, "light"), 0, "Node {v}: nothing inlined with {no_inline:?}");
    }
}

#[test]
fn node_18_split_matches_cpu_prof_inlined_or_not() {
    split_matches_cpu_prof("18");
}

#[test]
fn node_20_split_matches_cpu_prof_inlined_or_not() {
    split_matches_cpu_prof("20");
}

#[test]
fn node_22_split_matches_cpu_prof_inlined_or_not() {
    split_matches_cpu_prof("22");
}

/// V8 13.6: functions reach their code through the dispatch table
/// (leaptiering), the code's SharedFunctionInfo is wrapped.
#[test]
fn node_24_split_matches_cpu_prof_inlined_or_not() {
    split_matches_cpu_prof("24");
}

/// V8 14.6: as 13.6, and source position tables written unsigned.
#[test]
fn node_26_split_matches_cpu_prof_inlined_or_not() {
    split_matches_cpu_prof("26");
}

/// V8's baseline compiler (Sparkplug) and its interpreter, on Node 20
/// and 26 (whose bytecode position tables are written unsigned: the call
/// sites' lines tell).
#[test]
fn node_baseline_and_interpreted_frames_match_cpu_prof() {
    let dir = scratch_dir("node-tiers");
    for v in ["20", "26"] {
        let bin = node_bin(v);
        against_cpu_prof(v, &bin, "baseline", &["--no-opt", "--no-maglev"], &dir);
        against_cpu_prof(v, &bin, "interpreted", &["--no-opt", "--no-maglev", "--no-sparkplug"], &dir);
    }
}

/// One long loop that V8 optimizes while it runs (on-stack replacement),
/// with no flag at all: the built-in split is the oracle (V8's own profiler
/// puts the OSR code's samples on main() itself).
#[test]
fn node_loop_replaced_on_the_stack_keeps_the_split() {
    let dir = scratch_dir("node-osr");
    for (v, bin) in nodes() {
        let log = dir.join(format!("opt-{v}.log"));
        let w = node_traced(&bin, &[], &["osr", "60"], &log);
        // main()'s loop replaced by TurboFan's code, heavy() and light()
        // optimized.
        let settled =
            wait_settled(w.0.id(), &log, &["heavy", "light", "main"], &["heavy", "light", "parent", "main"], 2.0);
        let (stacks, err) = profile_json(w.0.id(), &dir, &[]);
        let err = format!("{settled}; {err}");
        drop(w);
        let p = sonde_pairs(&stacks);
        let (share, n) = heavy_share(&p);
        assert!(n > 300 && (share - 2.0 / 3.0).abs() < 0.05, "Node {v}: heavy's share {share:.3} of {n}; {err}");
        let want: BTreeSet<(String, String)> = [("heavy", "parent"), ("light", "parent"), ("parent", "main")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert!(want.is_subset(&sites(&p)), "Node {v}: {:?} against {want:?}; {err}", sites(&p));
        let (main, parent) = (under(&stacks, "main"), under(&stacks, "parent"));
        assert!(parent as f64 >= 0.95 * main as f64, "Node {v}: parent on {parent} of main's {main}; {err}");
    }
}

#[test]
fn node_frames_switched_off_leave_the_javascript_unnamed() {
    let dir = scratch_dir("node-off");
    let w = node(Path::new("/usr/bin/node"), &[], &["cpu", "30"]);
    thread::sleep(Duration::from_millis(1500));
    for (frames, want) in [("mixed", true), ("native", false)] {
        let (stacks, err) = profile_json(w.0.id(), &dir, &["--frames", frames]);
        let js: u64 = stacks.iter().filter(|(f, _)| f.iter().any(|x| x["kind"] == "javascript")).map(|s| s.1).sum();
        let total: u64 = stacks.iter().map(|s| s.1).sum();
        if want {
            assert!(js * 10 >= total * 9, "--frames mixed: {js} of {total} samples name JavaScript; {err}");
        } else {
            assert_eq!(js, 0, "--frames native names no JavaScript; {err}");
        }
    }
}

/// An async function awaits a 10 ms timer (the main thread waits in the
/// event loop, where no JavaScript is on its stack), then blocks 20 and
/// 30 ms in two functions (Atomics.wait): 1:2:3, the blocking calls under
/// the async function as V8 resumed it.
#[test]
fn node_offcpu_splits_a_timer_await_and_two_blocking_waits() {
    let dir = scratch_dir("node-offcpu");
    for (v, bin) in nodes().into_iter().filter(|(v, _)| ["20", "26"].contains(v)) {
        let w = node(&bin, &[], &["off", "30"]);
        thread::sleep(Duration::from_millis(1500));
        let (stacks, err) = stacks_of(&["offcpu", "-p", &w.0.id().to_string(), "-d", "4s"], &dir.join("o.json"));
        drop(w);
        let js = |f: &[Value], name: &str| f.iter().any(|x| ours(x) && x["name"] == name);
        let (mut a, mut b, mut timer) = (0u64, 0u64, 0u64);
        for (f, n) in &stacks {
            if js(f, "waitA") {
                assert!(js(f, "cycle"), "Node {v}: waitA under cycle: {f:?}");
                a += n;
            } else if js(f, "waitB") {
                assert!(js(f, "cycle"), "Node {v}: waitB under cycle: {f:?}");
                b += n;
            } else if f.iter().any(|x| x["name"] == "uv_run") && f.iter().any(|x| x["name"] == "do_epoll_wait") {
                timer += n;
            }
        }
        let all = (a + b + timer).max(1) as f64;
        let shares = [timer as f64 / all, a as f64 / all, b as f64 / all];
        assert!(all > 2e6, "Node {v}: {all} us of waits; {err}");
        for (s, want) in shares.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
            assert!((s - want).abs() < 0.03, "Node {v}: timer:waitA:waitB {shares:?}; {err}");
        }
    }
}

/// sonde's stacks of a run: frames root first, and counts.
type Stacks = Vec<(Vec<Value>, u64)>;

/// Runs nodesplit.js in `mode` on Node `v` beside `--cpu-prof`, profiled
/// once V8 has optimized it: sonde's stacks and V8's (pairs of the
/// workload's frames and weights by path, root first).
fn mode_beside_cpu_prof(v: &str, mode: &str, dir: &Path) -> (Stacks, String, BTreeMap<String, u64>) {
    let prof = dir.join(format!("prof-{mode}-{v}"));
    let _ = std::fs::remove_dir_all(&prof);
    let cp = format!("--cpu-prof-dir={}", prof.display());
    // Long enough for the window below on a host busy with other work
    // (with two CPU hogs beside it, an 8-s run ended after 1.3 s of its
    // CPU: 256 of the 300 samples asked for), then ended by SIGTERM, on
    // which the workload exits and V8 writes its profile.
    let log = dir.join(format!("opt-{mode}-{v}.log"));
    let mut w = node_traced(&node_bin(v), &["--cpu-prof", cp.as_str(), "--cpu-prof-interval=500"], &[mode, "40"], &log);
    // Sampled once V8 has optimized and inlined what these modes check:
    // on a busy host its compiler thread gets less CPU, and from 2.5 s of
    // the clock on Node 20's make() and outerA() were sampled while not
    // yet inlined (the call sites' split then leans as on Node 24: 0.61).
    let (hot, watch): (&[&str], &[&str]) = if mode == "inline" {
        (&["inner"], &["inner", "outerA", "outerB", "parentI", "searchA", "searchB", "parentB", "batchI", "tickI"])
    } else {
        (&["make"], &["make", "parentC", "batchC", "tickC"])
    };
    let settled = wait_settled(w.0.id(), &log, hot, watch, 4.0);
    // 5 s of the process's CPU: on Node 20 inner() under parentI() gets a
    // fifth of it, and in 2 s (~180 samples) the tolerance of its 2:1
    // split was only 2.3 standard deviations of the sampling's own spread
    // (one CI run: 0.584; 8-s runs: 0.662 of 784 on Node 20, 0.671 of
    // 2,026 on 26).
    let (stacks, err) = profile_json_for(w.0.id(), dir, &[], 5.0);
    let err = format!("{settled}; {err}");
    end_by_sigterm(&mut w, &format!("Node {v} ({mode})"));
    (stacks, err, cpu_prof_paths(&prof))
}

/// `--cpu-prof`'s samples by path of the workload's frames, root first.
fn cpu_prof_paths(dir: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for mut chain in cpu_prof_chains(dir, "") {
        chain.reverse();
        *out.entry(chain.join(";")).or_default() += 1;
    }
    out
}

/// Weight of `paths` whose leaf is `leaf` right under `caller`.
fn leaf_under(paths: &BTreeMap<String, u64>, caller: &str, leaf: &str) -> u64 {
    paths.iter().filter(|(p, _)| p.ends_with(&format!("{caller};{leaf}"))).map(|(_, n)| n).sum()
}

/// sonde's stacks as paths of the workload's frames, root first.
fn sonde_paths(stacks: &[(Vec<Value>, u64)]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (f, n) in stacks {
        let p: Vec<&str> = f.iter().filter(|x| ours(x)).map(|x| x["name"].as_str().unwrap_or("")).collect();
        *out.entry(p.join(";")).or_default() += n;
    }
    out
}

/// Functions V8 inlines, with their shares built in: outerA() and outerB()
/// (2:1) both running inner(), all three inlined into parentI(); searchA()
/// and searchB() (2:1), inlined into parentB(), each spending its time in
/// a call of the builtin String.prototype.indexOf, where parentB()'s frame
/// is found by the return address after the call (the last instruction of
/// the inlined function's code). sonde's shares are the program's on Node
/// 20 and 26; on 26, V8's own profiler agrees (Node 20's leaves out what
/// it inlined at the sampled instruction: inner()'s loop is credited to
/// the function it was inlined into).
#[test]
fn node_inlined_functions_keep_their_built_in_shares() {
    let dir = scratch_dir("node-inline");
    for v in ["20", "26"] {
        let (stacks, err, v8) = mode_beside_cpu_prof(v, "inline", &dir);
        let ours = sonde_paths(&stacks);
        let share = |p: &BTreeMap<String, u64>, caller: &str, a: &str, b: &str| {
            let (x, y) = (leaf_under(p, caller, a), leaf_under(p, caller, b));
            (x as f64 / (x + y).max(1) as f64, x + y)
        };
        let (a, b) = (leaf_under(&ours, "outerA", "inner"), leaf_under(&ours, "outerB", "inner"));
        let s_inner = a as f64 / (a + b).max(1) as f64;
        assert!(
            a + b > 100 && (s_inner - 2.0 / 3.0).abs() < 0.08,
            "Node {v}: inner() under outerA() {a}, outerB() {b}; {}{err}",
            js_paths(&stacks)
        );
        let (s_search, n_search) = share(&ours, "parentB", "searchA", "searchB");
        assert!(
            n_search > 300 && (s_search - 2.0 / 3.0).abs() < 0.05,
            "Node {v}: searchA()'s share {s_search:.3} of {n_search}; {}{err}",
            js_paths(&stacks)
        );
        // V8 inlined them (else this proves nothing about inlining), in
        // enough samples to check inner()'s split on those alone. V8 may
        // settle on running both code with them inlined and code without
        // (Node 20 here: inner() inlined in 278 of 585 samples, the rest
        // in frames of their own, outerA() and inner() unoptimized; a run
        // before, over 60%), and a frame not inlined is credited as such.
        for f in ["inner", "outerA", "searchA"] {
            let (i, u) = (inlined(&stacks, f), under(&stacks, f));
            assert!(i >= 100, "Node {v}: {f} inlined in {i} of {u} samples; {}{err}", js_paths(&stacks));
        }
        let inlined_under = |caller: &str| -> u64 {
            stacks
                .iter()
                .filter(|(f, _)| {
                    let o: Vec<&Value> = f.iter().filter(|x| self::ours(x)).collect();
                    o.windows(2).any(|w| w[0]["name"] == caller && w[1]["name"] == "inner" && w[1]["inlined"] == true)
                })
                .map(|s| s.1)
                .sum()
        };
        let (ai, bi) = (inlined_under("outerA"), inlined_under("outerB"));
        let s_inlined = ai as f64 / (ai + bi).max(1) as f64;
        assert!(
            (s_inlined - 2.0 / 3.0).abs() < 0.1,
            "Node {v}: inlined inner() under outerA() {ai}, outerB() {bi}; {}{err}",
            js_paths(&stacks)
        );
        if v == "26" {
            let (vs, _) = share(&v8, "parentB", "searchA", "searchB");
            let (va, vb) = (leaf_under(&v8, "outerA", "inner"), leaf_under(&v8, "outerB", "inner"));
            assert!((vs - s_search).abs() < 0.06, "Node 26: --cpu-prof's searchA share {vs:.3}, sonde's {s_search:.3}");
            let vi = va as f64 / (va + vb).max(1) as f64;
            assert!(
                (vi - s_inner).abs() < 0.1,
                "Node 26: --cpu-prof's inner() under outerA() {vi:.3}, sonde's {s_inner:.3}"
            );
        }
    }
}

/// parentC() calls make() twice, which calls Object.create() 2:1 times in
/// a loop: the builtin behind it runs without a frame of its own. sonde
/// finds make()'s frame by the return address at the top of the stack and
/// credits the two calls (make() inlined into parentC() on Node 20 and 26)
/// 2:1. V8's own profiler takes the frame it finds for the builtin's and
/// credits the samples to the function above: make() and what it was
/// inlined into left out. This is why, on terser, `--cpu-prof` gives its
/// small inlined methods (TreeWalker's push and pop, MAP) less than sonde
/// does and their callers' callers (_visit) more (real.rs). Node 24 (V8
/// 13.6) does not inline make() here, and its call sites' split comes out
/// 0.59 for 0.67: a known limit (docs/runtime-frames.md), left out.
#[test]
fn node_frameless_builtins_called_from_inlined_code_keep_their_caller() {
    let dir = scratch_dir("node-create");
    let (long, short) = (line_of("sinkO = make(px, 2000)"), line_of("sinkO = make(py, 1000)"));
    for v in ["20", "26"] {
        let (stacks, err, v8) = mode_beside_cpu_prof(v, "create", &dir);
        // The split of the samples taken while make() ran inlined (what this
        // checks; not inlined, its call sites lean as on Node 24).
        let inl: Stacks = stacks
            .iter()
            .filter(|(f, _)| f.iter().any(|x| ours(x) && x["name"] == "make" && x["inlined"] == true))
            .cloned()
            .collect();
        let sites = call_sites(&inl, ours);
        let at = |line: u64| -> u64 {
            sites
                .iter()
                .filter(|((callee, caller, l), _)| callee == "make" && caller == "parentC" && *l == line)
                .map(|(_, n)| n)
                .sum()
        };
        let (a, b) = (at(long), at(short));
        let share = a as f64 / (a + b).max(1) as f64;
        assert!(
            a + b > 400 && (share - 2.0 / 3.0).abs() < 0.05,
            "Node {v}: make() from parentC():{long} {a}, :{short} {b}; {}{err}",
            js_paths(&stacks)
        );
        // Most of the time (V8's compiler thread is late on a busy host).
        assert!(
            inlined(&stacks, "make") * 10 >= under(&stacks, "make") * 6,
            "Node {v}: make() inlined; {}",
            js_paths(&stacks)
        );
        let (parent, batch) = (under(&stacks, "parentC"), under(&stacks, "batchC"));
        assert!(
            parent as f64 >= 0.95 * batch as f64,
            "Node {v}: parentC() on {parent} of batchC()'s {batch}; {}",
            js_paths(&stacks)
        );
        // V8's profiler: most of those samples on a function above make().
        let v8_total: u64 = v8.iter().filter(|(p, _)| p.contains("batchC")).map(|(_, n)| n).sum();
        let v8_made = leaf_under(&v8, "parentC", "make");
        eprintln!("Node {v}: sonde make() {a}:{b}; --cpu-prof credits {v8_made} of {v8_total} samples under batchC() to make()");
        assert!(
            (v8_made as f64) < 0.75 * v8_total as f64,
            "Node {v}: --cpu-prof credits {v8_made} of {v8_total} to make(): V8's profiler changed, see the test's comment"
        );
    }
}

/// A Node whose V8 this build does not read (Node 16, V8 9.4): said once,
/// and its stacks stay native. A V8 line not tested (Node 25, V8 14.1) that
/// describes itself as the tested ones do: read, the split right, said once
/// to be untested.
#[test]
fn node_not_read_is_said_and_untested_is_read_and_said() {
    let dir = scratch_dir("node-old");
    let w = node(&node_bin("16"), &[], &["cpu", "30"]);
    thread::sleep(Duration::from_millis(1000));
    let (stacks, err) = profile_json(w.0.id(), &dir, &[]);
    assert!(err.contains("Node.js (V8 9.4") && err.matches("is not read").count() == 1, "{err}");
    assert!(stacks.iter().all(|(f, _)| f.iter().all(|x| x["kind"] != "javascript")), "{err}");
    drop(w);
    let log = dir.join("opt-25.log");
    let w = node_traced(&node_bin("25"), &[], &["cpu", "60"], &log);
    let settled = wait_settled(w.0.id(), &log, &SPLIT, &CPU_FUNCS, 2.5);
    let (stacks, err) = profile_json(w.0.id(), &dir, &[]);
    let err = format!("{settled}; {err}");
    assert_eq!(err.matches("is newer than the versions this sonde was tested on").count(), 1, "{err}");
    assert!(err.contains("Node.js (V8 14.1"), "{err}");
    let (share, n) = heavy_share(&sonde_pairs(&stacks));
    assert!(n > 300 && (share - 2.0 / 3.0).abs() < 0.05, "Node 25: heavy's share {share:.3} of {n}; {err}");
    let out = Command::new(SONDE).args(["doctor", "--json", "--pid", &w.0.id().to_string()]).output().unwrap();
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(d["read"] == true && d["untested"].as_str().is_some_and(|t| t.contains("Node.js 18 to 26")), "{d}");
}

/// Code V8 throws away and makes again mid-run (a type its optimized code
/// did not expect: its own `--trace-deopt` says so after the switch): no
/// frame names a function the program does not run there, and both halves
/// keep the split.
#[test]
fn node_names_stay_right_across_deoptimization() {
    let dir = scratch_dir("node-deopt");
    for (v, bin) in nodes().into_iter().filter(|(v, _)| ["20", "22", "26"].contains(v)) {
        let log = dir.join(format!("deopt-{v}.log"));
        let mut c = Command::new(&bin);
        c.args(["--trace-deopt", "--trace-opt"]).arg(script()).args(["deopt", "60"]);
        c.stdout(std::fs::File::create(&log).unwrap());
        let w = KillOnDrop(c.spawn().unwrap());
        let pid = w.0.id();
        // Warm-up until V8 has optimized what runs (quiet, all of it in
        // 0.4 s). One CI run sampled from 2 s of the clock on saw heavy's
        // share at 0.603 before the switch: a failure shows the stacks,
        // what V8 had optimized and its deoptimizations before the switch.
        let settled = wait_settled(pid, &log, &SPLIT, &CPU_FUNCS, 2.0);
        // 1.5 s of the program's CPU on each side of the switch, sampled.
        let json = dir.join("d.json");
        let (err, _) = profile_across_switch(pid, &json, 1.5, || {
            // SAFETY: kill takes no pointers.
            unsafe { libc::kill(pid as i32, libc::SIGUSR2) };
        });
        let err = format!("{settled}; {err}");
        let stacks = json_stacks(&json);
        drop(w);
        let text = std::fs::read_to_string(&log).unwrap();
        let after = text.split("switching").nth(1).expect("the switch happened in the run");
        assert!(
            after
                .lines()
                .any(|l| l.contains("deoptimizing")
                    && ["parent", "heavy", "light", "batch"].iter().any(|f| l.contains(f))),
            "Node {v}: V8 threw the code away after the switch:\n{text}"
        );
        // (anonymous): the module itself and the signal handler.
        let known = ["tick", "batch", "batch2", "parent", "heavy", "light", "(anonymous)"];
        let bad: Vec<(String, u64)> = stacks
            .iter()
            .flat_map(|(f, n)| {
                f.iter().filter(|x| ours(x)).map(move |x| (x["name"].as_str().unwrap_or("").to_string(), *n))
            })
            .filter(|(name, _)| !known.contains(&name.as_str()))
            .collect();
        assert!(bad.is_empty(), "Node {v}: frames no function of the program runs: {bad:?}; {err}");
        // Every frame on a line of a named function carries that name
        // ("(anonymous)" or a caller's name there is a wrong name).
        let src = std::fs::read_to_string(script()).unwrap();
        let lines: Vec<&str> = src.lines().collect();
        // (first, last) line of each function's body: up to its closing brace.
        let owners: Vec<(u64, u64, &str)> = ["heavy", "light", "parent", "batch", "batch2", "tick"]
            .iter()
            .map(|f| {
                let def = line_of(&format!("function {f}("));
                let close = (def as usize..lines.len()).find(|&i| lines[i] == "}").expect("closing brace") as u64;
                (def + 1, close, *f)
            })
            .collect();
        let misnamed: u64 = stacks
            .iter()
            .flat_map(|(f, n)| f.iter().filter(|x| ours(x)).map(move |x| (x, *n)))
            .filter(|(x, _)| {
                let l = x["line"].as_u64().unwrap_or(0);
                owners.iter().any(|(a, b, name)| (*a..=*b).contains(&l) && x["name"] != *name)
            })
            .map(|(_, n)| n)
            .sum();
        assert_eq!(
            misnamed,
            0,
            "Node {v}: frames named for another function; {err}; the stacks: {}",
            js_paths(&stacks)
        );
        let all: u64 =
            stacks.iter().filter(|(f, _)| f.iter().any(|x| ours(x) && x["name"] == "tick")).map(|s| s.1).sum();
        for half in ["batch", "batch2"] {
            let mine: Vec<(Vec<Value>, u64)> =
                stacks.iter().filter(|(f, _)| f.iter().any(|x| ours(x) && x["name"] == half)).cloned().collect();
            let n: u64 = mine.iter().map(|s| s.1).sum();
            assert!(n * 5 > all, "Node {v}: {half} on {n} of {all} samples; {err}; the stacks: {}", js_paths(&stacks));
            let (share, hl) = heavy_share(&sonde_pairs(&mine));
            // After the switch V8 optimizes heavy() and light() again, each
            // at its own moment, and for a while one runs slower code than
            // the other: the built-in 2:1 holds more loosely there (names
            // swapped would give 1:2, a share of 0.33). Before it, two CI
            // runs beside other tests gave 0.603 and 0.736 of some 745
            // samples with no deoptimization: wider than the count alone
            // explains (0.06 held in every run alone).
            let within = if half == "batch" { 0.10 } else { 0.12 };
            let before = text.split("switching").next().unwrap_or("");
            let deopts = before.lines().filter(|l| l.contains("deoptimizing")).count();
            assert!(
                (share - 2.0 / 3.0).abs() < within,
                "Node {v}, {half}: heavy's share {share:.3} of {hl}; V8 deoptimized {deopts} times before the switch; \
                 {err}; the stacks: {}",
                js_paths(&mine)
            );
        }
    }
}

/// wakeup: the main thread's Atomics.wait in waitMain() is woken by a
/// worker thread's notifier() (its own V8 isolate), both named.
#[test]
fn node_wakeup_names_waiter_and_waker_across_isolates() {
    let dir = scratch_dir("node-wakeup");
    let w = node(Path::new("/usr/bin/node"), &[], &["wake", "30"]);
    thread::sleep(Duration::from_millis(1500));
    let folded = dir.join("w.folded");
    let out = Command::new(SONDE)
        .args(["wakeup", "-p", &w.0.id().to_string(), "-d", "3s", "-o", folded.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let rows = read_folded(&folded);
    let waiter = |f: &[String], name: &str| f.iter().take_while(|x| *x != "--").any(|x| x == name);
    let waker = |f: &[String], name: &str| f.iter().skip_while(|x| *x != "--").any(|x| x == name);
    let waits: Vec<&(Vec<String>, u64)> = rows.iter().filter(|(f, _)| waiter(f, "waitMain_[js]")).collect();
    let total: u64 = waits.iter().map(|r| r.1).sum();
    let by_notifier: u64 = waits.iter().filter(|(f, _)| waker(f, "notifier_[js]")).map(|r| r.1).sum();
    assert!(total > 1_000_000, "waitMain's waits: {total} us; {err}");
    assert!(
        by_notifier as f64 > 0.9 * total as f64,
        "waitMain's waits woken by notifier: {by_notifier} of {total} us; {err}"
    );
}
