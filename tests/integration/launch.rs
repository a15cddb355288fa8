//! Processes that change under a run: `-- CMD` started, watched from its
//! first instruction and followed into the processes it starts; a process
//! that execs while watched; runs that end when their targets have.
use std::collections::BTreeSet;

use super::common::*;
use super::python::{python, wl};

/// Runs `sonde ARGS`, which must end by itself within `limit` (it is given
/// no -d: only its targets' end stops it); its output.
fn ends_by_itself(args: &[&str], limit: Duration) -> std::process::Output {
    let child = Command::new(SONDE).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d2 = done.clone();
    let watchdog = thread::spawn(move || {
        let t0 = Instant::now();
        while !d2.load(std::sync::atomic::Ordering::Relaxed) {
            if t0.elapsed() > limit {
                // SAFETY: kill takes no pointers.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                return true;
            }
            thread::sleep(Duration::from_millis(50));
        }
        false
    });
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let killed = watchdog.join().unwrap();
    assert!(
        !killed,
        "sonde {args:?} ran past {limit:?} after its targets ended: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The stacks of a `-o X.json` with their pids: (pid, process, frames, count).
fn stacks_with_pids(p: &std::path::Path) -> Vec<(u32, String, Vec<Value>, u64)> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["pid"].as_u64().unwrap() as u32,
                v["process"].as_str().unwrap_or("").to_string(),
                v["frames"].as_array().unwrap().clone(),
                v["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Weight of the stacks holding a Python frame named `name`.
fn py_weight(stacks: &[(u32, String, Vec<Value>, u64)], name: &str) -> u64 {
    stacks.iter().filter(|s| s.2.iter().any(|f| f["kind"] == "python" && f["name"] == name)).map(|s| s.3).sum()
}

/// Samples of cut stacks, over every reason.
fn truncated_samples(s: &Value) -> u64 {
    s["truncated_by"].as_object().map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
}

/// The summary line of `--json` output.
fn json_summary(out: &std::process::Output) -> Value {
    let v = json_lines(&out.stdout);
    summary(&v).clone()
}

/// `sonde profile -- sh -c 'exec python3.12 pysplit.py 3'`: the command runs
/// once everything is attached, its new image (after the exec, in the same
/// process) is walked and read as Python, the run ends when it does, and
/// the summary says how it ended.
#[test]
fn profile_of_a_command_follows_its_exec_and_ends_with_it() {
    let dir = scratch_dir("launch-profile");
    let json = dir.join("p.json");
    let script = format!("exec {} {} 5", python("3.12"), wl("pysplit.py"));
    let out = ends_by_itself(
        &["profile", "--json", "-F", "499", "-o", json.to_str().unwrap(), "--", "sh", "-c", &script],
        Duration::from_secs(90),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let s = json_summary(&out);
    assert_eq!(s["command"]["exit_status"], 0, "{s}");
    assert_eq!(s["command"]["command"], format!("sh -c {script}"), "{s}");
    let stacks = stacks_with_pids(&json);
    let total: u64 = stacks.iter().map(|s| s.3).sum();
    // One process: sh became Python.
    let pids: BTreeSet<u32> = stacks.iter().map(|s| s.0).collect();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let (h, l) = (py_weight(&stacks, "heavy"), py_weight(&stacks, "light"));
    let share = h as f64 / (h + l).max(1) as f64;
    assert!(h + l > 500, "heavy {h}, light {l} of {total}: {err}");
    assert!((share - 2.0 / 3.0).abs() < 0.05, "heavy {h}, light {l} ({share:.3}): {err}");
    // Nearly all of its time is Python's (start-up and calibration aside),
    // walked whole from the new image's tables.
    let module = py_weight(&stacks, "<module>");
    assert!(module as f64 > 0.85 * total as f64, "<module> on {module} of {total}: {err}");
    let truncated = truncated_samples(&s);
    // The new image's first tens of ms run while its tables load (walked
    // by frame pointers, which this Python has none of): a few percent, up
    // to some 175 ms of samples on a busy host.
    assert!((truncated as f64) < 0.10 * total as f64, "{truncated} of {total} truncated: {s}");
}

/// `sonde offcpu -- sh -c '...'` follows the command into the processes it
/// forks (two `sleep`s and a Python, each blocked for a time built in), and
/// into nothing else: a process of the same program outside the command is
/// not watched. The command's exit status is reported.
#[test]
fn offcpu_of_a_command_follows_its_children_and_nothing_else() {
    let dir = scratch_dir("launch-offcpu");
    let json = dir.join("off.json");
    // Outside the command, the same sleep program blocks over and over.
    let mut outside = KillOnDrop(Command::new("sh").args(["-c", "while :; do sleep 0.05; done"]).spawn().unwrap());
    let py = python("3.12");
    // Python works a moment (its tables and runtime are read meanwhile:
    // tens of ms on a quiet host, more on a loaded one, where the CI once
    // saw the sleep begin before they were), sleeps, then works again (its
    // frames are named while it lives).
    let script = format!(
        "sleep 0.3; sleep 0.3; {py} -c 'import time\ndef work(s):\n    t = time.time() + s\n    while time.time() < t: pass\nwork(0.3); time.sleep(0.4); work(0.3)'; exit 7"
    );
    let out = ends_by_itself(
        &["offcpu", "--json", "-o", json.to_str().unwrap(), "--", "sh", "-c", &script],
        Duration::from_secs(90),
    );
    let _ = outside.0.kill();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let s = json_summary(&out);
    assert_eq!(s["command"]["exit_status"], 7, "{s}");
    // sh, two sleeps, Python (a shell may fork more, never fewer).
    assert!(s["command"]["processes"].as_u64().unwrap() >= 4, "{s}");
    assert_eq!(s["command"]["processes_not_followed"], 0, "{s}");
    let stacks = stacks_with_pids(&json);
    let sleeps: BTreeSet<u32> = stacks.iter().filter(|s| s.1 == "sleep").map(|s| s.0).collect();
    assert_eq!(sleeps.len(), 2, "the command's two sleeps, and not the other ones: {sleeps:?}; {err}");
    // Weights are microseconds off the CPU.
    let sleep_us: u64 = stacks.iter().filter(|s| s.1 == "sleep").map(|s| s.3).sum();
    assert!(sleep_us >= 590_000, "two sleeps of 0.3 s blocked {sleep_us} us: {err}");
    // Python's sleep, under the Python frame that called it.
    let py_us = py_weight(&stacks, "<module>");
    assert!(py_us >= 390_000, "Python's 0.4 s sleep: {py_us} us; {}; {err}", s["language_frames"]);
}

/// `sonde slow -- sh -c 'sleep 0.3; sleep 0.3'`: the syscall probes are
/// filtered to the command's processes, so exactly its two slow sleeps are
/// reported, whatever else sleeps on the host.
#[test]
fn slow_of_a_command_reports_exactly_its_calls() {
    let mut outside = KillOnDrop(Command::new("sh").args(["-c", "while :; do sleep 0.2; done"]).spawn().unwrap());
    let out = ends_by_itself(
        &["slow", "syscall:*nanosleep", "--over", "100ms", "--json", "--", "sh", "-c", "sleep 0.3; sleep 0.3"],
        Duration::from_secs(90),
    );
    let _ = outside.0.kill();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v = json_lines(&out.stdout);
    let calls = of_type(&v, "slow_call");
    assert_eq!(calls.len(), 2, "{calls:?}; {err}");
    let pids: BTreeSet<u64> = calls.iter().map(|c| c["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 2, "two sleep processes: {calls:?}");
    for c in &calls {
        assert!(c["latency_ns"].as_u64().unwrap() >= 300_000_000, "{c}");
        assert_eq!(c["comm"], "sleep", "{c}");
    }
    let s = summary(&v);
    assert_eq!(s["slow_calls"], 2, "{s}");
    assert_eq!(s["command"]["exit_status"], 0, "{s}");
}

/// A shell watched with -p that execs Python after the run began (as
/// pyenv's shim and every wrapper do): the new image is walked from its own
/// tables and read as Python, and the run ends when the process exits.
#[test]
fn a_process_that_execs_while_watched_is_read_as_its_new_program() {
    let dir = scratch_dir("launch-exec");
    let json = dir.join("p.json");
    let go = dir.join("go");
    let script =
        format!("while [ ! -e {} ]; do sleep 0.05; done; exec {} {} 5", go.display(), python("3.12"), wl("pysplit.py"));
    let w = KillOnDrop(Command::new("sh").args(["-c", &script]).spawn().unwrap());
    let pid = w.0.id().to_string();
    let mut child = Command::new(SONDE)
        .args(["profile", "-p", &pid, "-F", "499", "--json", "-o", json.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reader = drain(child.stdout.take().unwrap());
    let mut r = BufReader::new(child.stderr.take().unwrap());
    let mut err = wait_for_stderr_line(&mut r, "sampling CPU stacks");
    let rest = drain(r);
    std::fs::write(&go, "").unwrap();
    // No -d: it must end once the process has, within a generous bound.
    let t0 = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code().unwrap_or(-1);
        }
        if t0.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("sonde -p {pid} still ran 90 s after its target was released");
        }
        thread::sleep(Duration::from_millis(100));
    };
    err.push_str(&String::from_utf8_lossy(&rest.join().unwrap()));
    let stdout = reader.join().unwrap();
    assert_eq!(code, 0, "{err}");
    let s = summary(&json_lines(&stdout)).clone();
    let stacks = stacks_with_pids(&json);
    let total: u64 = stacks.iter().map(|s| s.3).sum();
    let (h, l) = (py_weight(&stacks, "heavy"), py_weight(&stacks, "light"));
    let share = h as f64 / (h + l).max(1) as f64;
    assert!(h + l > 500, "heavy {h}, light {l} of {total} after the exec: {err}");
    assert!((share - 2.0 / 3.0).abs() < 0.05, "heavy {h}, light {l} ({share:.3}): {err}");
    // Cut short only while the new image's tables load (85 ms of samples on
    // a quiet host, some 175 on a busy one; with the tables of the image
    // before, 843 of 1384 were).
    let truncated = truncated_samples(&s);
    assert!((truncated as f64) < 0.10 * total as f64, "{truncated} of {total} truncated after the exec: {s}");
}
