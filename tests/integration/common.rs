//! Helpers every module shares: running sonde, workloads, JSON pickers, and
//! the checks that nothing of ours stays attached.
#![allow(unused_imports)]
pub(crate) use serde_json::Value;
pub(crate) use sonde::{
    lab::netns::{Mib, Pair},
    lab::{
        retrans::{drop_all, hidden_synack_allowance, settled_mib, undrop, workload, PORT_SYN},
        traffic::{connect_attempt, Mode, Server},
    },
};
pub(crate) use std::{
    io::{BufRead, BufReader},
    net::{IpAddr, SocketAddr},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

pub(crate) const SONDE: &str = env!("CARGO_BIN_EXE_sonde");

/// A running `sonde retrans --json`, its stdout collected line by line.
pub(crate) struct Tracer {
    pub(crate) child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl Tracer {
    pub(crate) fn start(args: &[&str]) -> Tracer {
        Tracer::start_tool("retrans", "tracing TCP retransmissions", args)
    }

    /// `sonde TOOL --json ARGS`, once its stderr says `ready`.
    pub(crate) fn start_tool(tool: &str, ready: &str, args: &[&str]) -> Tracer {
        let mut child = Command::new(SONDE)
            .arg(tool)
            .arg("--json")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sonde");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let l2 = lines.clone();
        let reader = thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                l2.lock().unwrap().push(l);
            }
        });
        let mut r = BufReader::new(child.stderr.take().unwrap());
        wait_for_stderr_line(&mut r, ready);
        thread::spawn(move || for _ in r.lines() {});
        Tracer { child, lines, reader: Some(reader) }
    }

    /// Waits until the JSON lines so far satisfy `done`, or `limit` passed
    /// (a busy host delays the traffic, not the verdict); true if they did.
    pub(crate) fn wait_until(&self, limit: Duration, done: impl Fn(&[Value]) -> bool) -> bool {
        let t0 = Instant::now();
        loop {
            let vals: Vec<Value> =
                self.lines.lock().unwrap().iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
            if done(&vals) {
                return true;
            }
            if t0.elapsed() > limit {
                return false;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGINT, then the exit code and every JSON line.
    pub(crate) fn stop(self) -> (i32, Vec<Value>) {
        self.end(libc::SIGINT)
    }

    /// Sends `sig`, waits, returns the exit code and every JSON line.
    pub(crate) fn end(mut self, sig: i32) -> (i32, Vec<Value>) {
        // SAFETY: kill takes no pointers.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let status = self.child.wait().unwrap();
        self.reader.take().unwrap().join().unwrap();
        let lines = self.lines.lock().unwrap();
        let vals =
            lines.iter().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l}: {e}"))).collect();
        (status.code().unwrap_or(-1), vals)
    }
}

/// Reads sonde's stderr up to the line containing `ready` (its readiness
/// line: everything is attached); returns what it read.
pub(crate) fn wait_for_stderr_line(r: &mut BufReader<std::process::ChildStderr>, ready: &str) -> String {
    let mut text = String::new();
    let t0 = Instant::now();
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "sonde exited before it was ready: {text}");
        text.push_str(&line);
        if line.contains(ready) {
            return text;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "sonde did not start: {text}");
    }
}

/// Every line of `--json` output (stdout bytes or a file's text), parsed.
pub(crate) fn json_lines(out: impl AsRef<[u8]>) -> Vec<Value> {
    String::from_utf8_lossy(out.as_ref()).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Messages a summary's histogram holds in the buckets above `ns`.
pub(crate) fn count_above(summary: &Value, ns: u64) -> u64 {
    summary["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["le_ns"].as_u64().unwrap() > ns)
        .map(|b| b["count"].as_u64().unwrap())
        .sum()
}

pub(crate) fn summary(v: &[Value]) -> &Value {
    let s = v.last().expect("no output");
    assert_eq!(s["type"], "summary", "last line must be the summary: {s}");
    s
}

pub(crate) fn events<'a>(v: &'a [Value], kind: &str) -> Vec<&'a Value> {
    v.iter().filter(|e| e["type"] == "retrans" && e["kind"] == kind).collect()
}

/// The JSON lines of one "type".
pub(crate) fn of_type<'a>(v: &'a [Value], ty: &str) -> Vec<&'a Value> {
    v.iter().filter(|e| e["type"] == ty).collect()
}

pub(crate) fn seg_sum(v: &[&Value]) -> i64 {
    v.iter().map(|e| e["segs"].as_i64().unwrap()).sum()
}

/// A child process killed when the test ends, also by a failed assertion.
pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn our_prog_ids() -> Vec<u64> {
    let out = Command::new("bpftool").args(["prog", "show", "-j"]).output().expect("bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(vec![]));
    v.as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            let n = p["name"].as_str().unwrap_or("");
            [
                "ml_",
                "unw_",
                "btf_probe",
                "raw_probe",
                "btf_send",
                "raw_send",
                "btf_destroy",
                "raw_destroy",
                "btf_retrans",
                "raw_retrans",
                "tp_retrans",
                "tp_set_state",
                "btf_set_state",
                "btf_synack",
                "btf_sendmsg",
                "tp_accept4",
                "on_sample",
                "btf_switch",
                "raw_switch",
                "btf_waking",
                "raw_waking",
                "btf_exit",
                "raw_exit",
                "fl_",
                "drop_",
                "owner_",
                "why_",
            ]
            .iter()
            .any(|x| n.starts_with(x))
        })
        .map(|p| p["id"].as_u64().unwrap())
        .collect()
}

/// Ids of the `unw_chunk` maps process `pid` holds an fd of.
pub(crate) fn unwind_chunks_of(pid: u32) -> Vec<u64> {
    let held: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .map(|d| {
            d.flatten()
                .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
                .filter_map(|info| info.lines().find_map(|l| l.strip_prefix("map_id:")?.trim().parse::<u64>().ok()))
                .collect()
        })
        .unwrap_or_default();
    let out = Command::new("bpftool").args(["map", "show", "-j"]).output().expect("bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(vec![]));
    v.as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == "unw_chunk")
        .filter_map(|m| m["id"].as_u64())
        .filter(|id| held.contains(id))
        .collect()
}

/// Whether any of these map ids still exists.
pub(crate) fn maps_alive(ids: &[u64]) -> bool {
    let out = Command::new("bpftool").args(["map", "show", "-j"]).output().expect("bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(vec![]));
    v.as_array().unwrap().iter().any(|m| ids.contains(&m["id"].as_u64().unwrap_or(0)))
}

/// Neither programs `ours` nor links held by `pid` (killed) remain.
pub(crate) fn assert_gone(pid: u32, ours: &[u64]) {
    // Program teardown after the last fd closes is asynchronous: allow a moment.
    let t0 = Instant::now();
    loop {
        let still: Vec<u64> = our_prog_ids().into_iter().filter(|id| ours.contains(id)).collect();
        if still.is_empty() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "programs {still:?} outlived a SIGKILLed sonde");
        thread::sleep(Duration::from_millis(100));
    }
    let links = Command::new("bpftool").args(["link", "show", "-j"]).output().unwrap();
    let lv: Value = serde_json::from_slice(&links.stdout).unwrap_or(Value::Array(vec![]));
    for l in lv.as_array().unwrap() {
        let pid_hits = l["pids"].as_array().map(|ps| ps.iter().any(|p| p["pid"] == pid)).unwrap_or(false);
        assert!(!pid_hits, "link {l} still held by the killed sonde");
        assert!(!ours.contains(&l["prog_id"].as_u64().unwrap_or(0)), "link {l} of our program survives");
    }
}

/// Programs some process holds an fd (program or link) of, from /proc/*/fdinfo.
pub(crate) fn held_prog_ids() -> Vec<u64> {
    std::fs::read_dir("/proc").unwrap().flatten().flat_map(|p| fd_prog_ids(&p.path())).collect()
}

/// sonde's programs that process `pid` holds (so not those of tests alongside).
pub(crate) fn programs_of(pid: u32) -> Vec<u64> {
    let held = fd_prog_ids(std::path::Path::new(&format!("/proc/{pid}")));
    our_prog_ids().into_iter().filter(|id| held.contains(id)).collect()
}

pub(crate) fn fd_prog_ids(proc_dir: &std::path::Path) -> Vec<u64> {
    let Ok(fds) = std::fs::read_dir(proc_dir.join("fdinfo")) else { return Vec::new() };
    fds.flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .flat_map(|info| {
            info.lines().filter_map(|l| l.strip_prefix("prog_id:")?.trim().parse::<u64>().ok()).collect::<Vec<_>>()
        })
        .collect()
}

/// Runs sonde as nobody with no capabilities at all.
pub(crate) fn unprivileged(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", SONDE])
        .args(args)
        .output()
        .unwrap()
}

/// Builds tests/workloads/NAME.c with `flags` into a fresh temp dir.
pub(crate) fn build_workload(name: &str, flags: &[&str]) -> std::path::PathBuf {
    // Once per process and flags: tests run in parallel, and rewriting a
    // binary another test is running fails with ETXTBSY.
    static BUILT: Mutex<Vec<(String, std::path::PathBuf)>> = Mutex::new(Vec::new());
    let key = format!("{name} {}", flags.join(" "));
    let mut built = BUILT.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    let p = build_fresh(name, flags);
    built.push((key, p.clone()));
    p
}

/// Compiles `tests/workloads/NAME.c` with `flags` into a directory of its own.
fn build_fresh(name: &str, flags: &[&str]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sonde-wl-{}-{name}-{}",
        std::process::id(),
        flags.join("").replace(['-', '='], "")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join(name);
    let src = format!("{}/tests/workloads/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let st = Command::new("clang").args(flags).arg("-o").arg(&bin).arg(&src).status().expect("clang");
    assert!(st.success(), "building {src}");
    bin
}

/// The line of `tests/workloads/NAME.c` that contains `marker`.
pub(crate) fn workload_line(name: &str, marker: &str) -> u32 {
    let src = std::fs::read_to_string(format!("{}/tests/workloads/{name}.c", env!("CARGO_MANIFEST_DIR"))).unwrap();
    src.lines().position(|l| l.contains(marker)).expect("marker") as u32 + 1
}

pub(crate) const FP: &[&str] = &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"];

/// Runs `sonde profile ARGS`; returns (exit code, stderr).
pub(crate) fn profile(args: &[&str]) -> (i32, String) {
    let out = Command::new(SONDE).arg("profile").args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// What [`profile_window`] saw: sonde's exit code, stdout and stderr, and
/// the CPU seconds the workload used while sonde sampled.
pub(crate) struct Window {
    pub(crate) code: i32,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: String,
    pub(crate) cpu: f64,
}

/// Reads `out` to its end on a thread of its own (a child's pipe that must
/// not fill while the test waits on the child); joined for the bytes.
pub(crate) fn drain(mut out: impl std::io::Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    })
}

/// `sonde profile ARGS` sampling from its ready line until process `pid`
/// has used `cpu_secs` of CPU by the kernel's account (or 40 s have
/// passed, or it has exited), ended with SIGINT; that CPU time is the
/// oracle for sample counts. A host busy with other work gives the
/// workload less of a CPU, and the window grows to match: a window of
/// fixed wall time gave one beside two CPU hogs and a build 1.35 s of CPU
/// in 4 s (263 samples). A `-d` run would also count the CPU the workload
/// used while sonde loaded and wrote its files, which under load was 0.8 s
/// of 4.8.
pub(crate) fn profile_window(args: &[&str], pid: u32, cpu_secs: f64) -> Window {
    let mut child =
        Command::new(SONDE).arg("profile").args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let reader = drain(child.stdout.take().unwrap());
    let mut r = BufReader::new(child.stderr.take().unwrap());
    let mut err = wait_for_stderr_line(&mut r, "sampling CPU stacks");
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // None once the process has exited (a zombie until its parent reaps it).
    let ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
        (state != "Z" && state != "X").then(|| cpu_ticks(pid))
    };
    let (cpu0, t0) = (cpu_ticks(pid), Instant::now());
    let mut cpu1 = cpu0;
    while let Some(t) = ticks() {
        cpu1 = t;
        if (t - cpu0) as f64 >= cpu_secs * hz || t0.elapsed() > Duration::from_secs(40) {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill takes no pointers.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let code = child.wait().unwrap().code().unwrap_or(-1);
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut r, &mut rest);
    err.push_str(&rest);
    Window { code, stdout: reader.join().unwrap(), stderr: err, cpu: (cpu1 - cpu0) as f64 / hz }
}

/// Folded lines as (frames, count).
pub(crate) fn read_folded(p: &std::path::Path) -> Vec<(Vec<String>, u64)> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| {
            let (st, n) = l.rsplit_once(' ').unwrap();
            (st.split(';').map(str::to_string).collect(), n.parse().unwrap())
        })
        .collect()
}

/// utime + stime of a process, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    cpu_ticks_of(pid).unwrap_or_else(|| panic!("no CPU times of process {pid}"))
}

/// [`cpu_ticks`], or None once the process is gone.
fn cpu_ticks_of(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Waits until process `pid` has had `secs` more of CPU; false if it had
/// not within 30 s, or is gone (a busy host delays the program, not the
/// verdict).
pub(crate) fn cpu_wait(pid: u32, secs: f64) -> bool {
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (Some(c0), t0) = (cpu_ticks_of(pid), Instant::now()) else { return false };
    loop {
        match cpu_ticks_of(pid) {
            Some(c) if (c - c0) as f64 >= secs * hz => return true,
            None => return false,
            _ if t0.elapsed() > Duration::from_secs(30) => return false,
            _ => thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// `sonde profile -p PID -F 499 -o JSON` across a switch the program makes
/// when told: `secs` of the program's CPU sampled, then `switch()`, then
/// `secs` more, then SIGINT. Returns sonde's stderr, and whether the
/// program had its CPU in time on both sides.
pub(crate) fn profile_across_switch(
    pid: u32,
    json: &std::path::Path,
    secs: f64,
    switch: impl FnOnce(),
) -> (String, bool) {
    let mut p = Command::new(SONDE)
        .args(["profile", "-p", &pid.to_string(), "-F", "499", "-o"])
        .arg(json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = BufReader::new(p.stderr.take().unwrap());
    let mut err = wait_for_stderr_line(&mut r, "sampling CPU stacks");
    let before = cpu_wait(pid, secs);
    switch();
    let after = cpu_wait(pid, secs);
    // SAFETY: kill takes no pointers.
    unsafe { libc::kill(p.id() as i32, libc::SIGINT) };
    assert_eq!(p.wait().unwrap().code(), Some(130), "SIGINT ends the profile: {err}");
    let _ = std::io::Read::read_to_string(&mut r, &mut err);
    (err, before && after)
}

/// `go`, from PATH or Go's default install directory.
pub(crate) fn go_bin() -> String {
    if Command::new("go").arg("version").output().is_ok_and(|o| o.status.success()) {
        return "go".into();
    }
    "/usr/local/go/bin/go".into()
}

/// Runs `sonde lab NAME -d 2s --json` with its files under a fresh temporary
/// directory (prefix DIR/NAME); it must succeed. Its JSON object and DIR.
pub(crate) fn lab_json(name: &str) -> (Value, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("sonde-lab{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join(name);
    let out = Command::new(SONDE)
        .args(["lab", name, "-d", "2s", "--json", "--prefix", prefix.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_str(text.trim()).unwrap(), dir)
}

/// Tests whose oracles are exact counters or timings hold this shared; a
/// test that saturates the CPUs holds it alone.
pub(crate) static QUIET: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The stacks of a `-o X.json`: frames root first, and counts.
pub(crate) fn json_stacks(p: &std::path::Path) -> Vec<(Vec<Value>, u64)> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["frames"].as_array().unwrap().clone(), v["count"].as_u64().unwrap())
        })
        .collect()
}

/// A fresh directory `sonde-NAME-PID` under the temporary directory.
///
/// Kept after the test (a failure's files are there to read), and removed
/// by the next run of the tests once the process that made it is gone: each
/// holds an empty mark file, and only dirs so marked, both ours, are swept
/// (scratch dirs had filled /tmp with a hundred 64 MiB files of `why`'s
/// disk test).
pub(crate) fn scratch_dir(name: &str) -> std::path::PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(sweep_scratch_dirs);
    let d = std::env::temp_dir().join(format!("sonde-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    // Made here, not found: what another user planted at the path fails.
    std::fs::create_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    std::fs::OpenOptions::new().write(true).create_new(true).open(d.join(SCRATCH_MARK)).unwrap();
    d
}

/// The file that marks a [`scratch_dir`].
const SCRATCH_MARK: &str = ".sonde-test-scratch";

/// Removes the scratch dirs of test runs whose process has ended.
fn sweep_scratch_dirs() {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    // SAFETY: geteuid takes no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("sonde-").and_then(|n| n.rsplit('-').next()) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        // Ours: the dir and its mark (a plain file, not a link), so that no
        // other user can have root remove a tree by planting a mark.
        let marked = e.metadata().is_ok_and(|m| m.uid() == me)
            && std::fs::symlink_metadata(e.path().join(SCRATCH_MARK))
                .is_ok_and(|m| m.uid() == me && m.file_type().is_file());
        if marked && pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Runs `sonde ARGS -o JSON` to its end (ARGS give the duration) and
/// returns the stacks written and stderr; the run must succeed.
pub(crate) fn stacks_of(args: &[&str], json: &std::path::Path) -> (Vec<(Vec<Value>, u64)>, String) {
    let out = Command::new(SONDE).args(args).arg("-o").arg(json).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (json_stacks(json), err)
}

/// (callee, caller, caller's line) of consecutive frames, by weight.
pub(crate) type Calls = std::collections::BTreeMap<(String, String, u64), u64>;

/// The call sites of sonde's stacks among the frames `ours` keeps.
pub(crate) fn call_sites(stacks: &[(Vec<Value>, u64)], ours: impl Fn(&Value) -> bool) -> Calls {
    let mut out = Calls::new();
    for (frames, n) in stacks {
        let kept: Vec<&Value> = frames.iter().filter(|f| ours(f)).collect();
        for w in kept.windows(2) {
            let key = (
                w[1]["name"].as_str().unwrap().to_string(),
                w[0]["name"].as_str().unwrap().to_string(),
                w[0]["line"].as_u64().unwrap_or(0),
            );
            *out.entry(key).or_default() += n;
        }
    }
    out
}

/// Profiles `pid` at 499 Hz with `args` for 3 s of its CPU
/// ([`profile_window`]): about 1,500 samples, so a 2:1 split's share has a
/// standard error of 1.2 points, and the tests' ±5 points stand 4 of them
/// clear (in 2 s, 3.3: across the suite's ~50 such checks, one run in 20
/// would fail by chance alone). The stacks and stderr.
pub(crate) fn profile_json(pid: u32, dir: &std::path::Path, args: &[&str]) -> (Vec<(Vec<Value>, u64)>, String) {
    profile_json_for(pid, dir, args, 3.0)
}

/// [`profile_json`] over `cpu_secs` of the process's CPU, for checks
/// whose functions get a small part of it.
pub(crate) fn profile_json_for(
    pid: u32,
    dir: &std::path::Path,
    args: &[&str],
    cpu_secs: f64,
) -> (Vec<(Vec<Value>, u64)>, String) {
    let json = dir.join("p.json");
    let pid_arg = pid.to_string();
    let base = ["-p", pid_arg.as_str(), "-F", "499", "-o", json.to_str().unwrap()];
    let w = profile_window(&[&base[..], args].concat(), pid, cpu_secs);
    assert_eq!(w.code, 130, "{}", w.stderr);
    (json_stacks(&json), w.stderr)
}

/// The Debian sid root `scripts/setup` makes (CPython 3.14 and 3.15,
/// OpenJDK 26 and 27), with /proc mounted in it (the JDKs need it). Its
/// processes run from another root, as a container's do: sonde reads their
/// files through /proc/PID/map_files.
pub(crate) fn sid_root() -> std::path::PathBuf {
    static MOUNT: std::sync::Once = std::sync::Once::new();
    let root = std::path::PathBuf::from("/opt/sonde-sid/current");
    assert!(root.join(".sonde-ready").exists(), "the Debian sid root at {} (scripts/setup makes it)", root.display());
    MOUNT.call_once(|| {
        let proc_dir = root.join("proc");
        let mounted = Command::new("mountpoint").arg("-q").arg(&proc_dir).status().is_ok_and(|s| s.success());
        if !mounted {
            let st = Command::new("mount").args(["-t", "proc", "proc"]).arg(&proc_dir).status().unwrap();
            assert!(st.success(), "mounting /proc in the sid root");
        }
    });
    root
}

/// `prog` (a path inside the sid root, or a name on its PATH) as a command
/// run in the sid root.
pub(crate) fn in_sid(prog: &str) -> Command {
    let mut c = Command::new("chroot");
    c.arg(sid_root()).arg(prog);
    c
}

/// Copies tests/workloads/`name` into the sid root; its path there.
pub(crate) fn into_sid(name: &str) -> String {
    let dir = sid_root().join("tmp/sonde-workloads");
    std::fs::create_dir_all(&dir).unwrap();
    let src = format!("{}/tests/workloads/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(&src, dir.join(name)).unwrap_or_else(|e| panic!("{src}: {e}"));
    format!("/tmp/sonde-workloads/{name}")
}

/// Samples by leaf function.
pub(crate) type Leaves = std::collections::BTreeMap<String, u64>;

/// How closely two samplers' leaf-function distributions agree, as a share
/// of the agreement two honest samplers of one distribution reach with the
/// same sample counts: the overlap of the two (the sum over functions of
/// the smaller share) over the mean overlap of two multinomial draws of
/// those sizes from the pooled distribution (400 draws, a fixed seed).
/// 1.0: as close as sampling noise allows; less: one of the two puts
/// samples where the other does not. Returns (that ratio, the overlap, the
/// overlap noise allows).
pub(crate) fn agreement(a: &Leaves, b: &Leaves) -> (f64, f64, f64) {
    let (na, nb) = (a.values().sum::<u64>(), b.values().sum::<u64>());
    assert!(na > 0 && nb > 0, "no samples to compare: {na} and {nb}");
    let overlap = |x: &Leaves, nx: u64, y: &Leaves, ny: u64| -> f64 {
        x.iter().map(|(k, &n)| (n as f64 / nx as f64).min(*y.get(k).unwrap_or(&0) as f64 / ny as f64)).sum()
    };
    let seen = overlap(a, na, b, nb);
    // The pooled distribution, as a cumulative table to draw from.
    let mut pooled = a.clone();
    for (k, n) in b {
        *pooled.entry(k.clone()).or_default() += n;
    }
    let keys: Vec<&String> = pooled.keys().collect();
    let mut cum = Vec::with_capacity(keys.len());
    let mut acc = 0u64;
    for k in &keys {
        acc += pooled[*k];
        cum.push(acc);
    }
    // SplitMix64: reproducible draws without a dependency.
    let mut state = 0x5eed_u64;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut draw = |n: u64| -> Leaves {
        let mut m = Leaves::new();
        for _ in 0..n {
            let r = next() % acc;
            let i = cum.partition_point(|&c| c <= r);
            *m.entry(keys[i].clone()).or_default() += 1;
        }
        m
    };
    const DRAWS: usize = 400;
    let noise: f64 = (0..DRAWS).map(|_| overlap(&draw(na), na, &draw(nb), nb)).sum::<f64>() / DRAWS as f64;
    (seen / noise, seen, noise)
}

/// The `n` heaviest leaves of each side, for a failure's message.
pub(crate) fn leaves_side_by_side(a: &Leaves, b: &Leaves, n: usize) -> String {
    let (na, nb) = (a.values().sum::<u64>().max(1) as f64, b.values().sum::<u64>().max(1) as f64);
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.sort_by(|x, y| {
        let w = |k: &String| a.get(k).copied().unwrap_or(0) as f64 / na + b.get(k).copied().unwrap_or(0) as f64 / nb;
        w(y).total_cmp(&w(x))
    });
    keys.iter()
        .take(n)
        .map(|k| {
            format!(
                "\n  {:6.2}% {:6.2}%  {k}",
                100.0 * a.get(*k).copied().unwrap_or(0) as f64 / na,
                100.0 * b.get(*k).copied().unwrap_or(0) as f64 / nb
            )
        })
        .collect()
}

/// The first line a workload started with its stdout piped prints (its
/// stdout is taken: read nothing else from it).
pub(crate) fn first_line(w: &mut KillOnDrop) -> String {
    let mut line = String::new();
    BufReader::new(w.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    line
}

/// The native thread ids a producer/consumer workload prints first
/// ("producer TID consumer TID": pyqueue.py, JQueue.java).
pub(crate) fn producer_and_consumer(w: &mut KillOnDrop) -> (u64, u64) {
    let line = first_line(w);
    let ids: Vec<u64> = line.split_whitespace().filter_map(|s| s.parse().ok()).collect();
    assert_eq!(ids.len(), 2, "{line}");
    (ids[0], ids[1])
}

/// A cgroup of the test's own with a child, `NAME-PID/inner`, under the
/// mount `root` (cgroup v2's, or a v1 controller's); removed on drop.
pub(crate) struct TestCgroup {
    /// The parent: what `--cgroup` is given.
    pub(crate) dir: std::path::PathBuf,
    /// The child the workloads join.
    pub(crate) inner: std::path::PathBuf,
}

impl TestCgroup {
    pub(crate) fn new(root: &str, name: &str) -> TestCgroup {
        let dir = std::path::Path::new(root).join(format!("{name}-{}", std::process::id()));
        let inner = dir.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        TestCgroup { dir, inner }
    }

    /// The cgroup mounts of this host to test: the unified one (v2) and the
    /// cpu controller's when it is a cgroup v1 one.
    pub(crate) fn roots() -> Vec<String> {
        let mut v: Vec<String> = sonde::engine::cgroup::cgroup2_root().into_iter().collect();
        if let Some(cpu) = sonde::engine::cgroup::cpu_root().filter(|r| !v.contains(r)) {
            v.push(cpu);
        }
        v
    }

    /// The processes in the child now.
    pub(crate) fn processes_in_child(&self) -> Vec<u32> {
        std::fs::read_to_string(self.inner.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// `bash -c` text that moves the shell into the child, then runs `cmd`.
    pub(crate) fn joined(&self, cmd: &str) -> String {
        format!("echo $$ > {}/cgroup.procs && exec {cmd}", self.inner.display())
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for d in [&self.inner, &self.dir] {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// `sonde why -p PID -d DURATION --json`, which must succeed: its lines.
pub(crate) fn why_json(pid: u32, duration: &str) -> Vec<Value> {
    let run = Command::new(SONDE).args(["why", "-p", &pid.to_string(), "-d", duration, "--json"]).output().unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    json_lines(&run.stdout)
}

/// The line of type `ty` ("thread", "process") whose `key` ("tid", "pid")
/// is `id`, in `sonde why`'s lines.
pub(crate) fn line_of(v: &[Value], ty: &str, key: &str, id: u32) -> Value {
    of_type(v, ty)
        .into_iter()
        .find(|t| t[key].as_u64() == Some(id.into()))
        .unwrap_or_else(|| panic!("no {ty} line with {key} {id}: {v:?}"))
        .clone()
}
