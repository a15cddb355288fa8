//! The command line as a whole: bad input, signals, a closed stdout, privileges,
//! help texts, doctor.
use super::common::*;

#[test]
fn sigkill_leaves_no_program_or_link_behind() {
    let t = Tracer::start(&["--addr", "192.0.2.0/24"]);
    let pid = t.child.id();
    let ours = programs_of(pid);
    assert!(!ours.is_empty(), "programs of the running sonde are visible");
    let (code, _) = t.end(libc::SIGKILL);
    assert_ne!(code, 0);
    assert_gone(pid, &ours);

    // profile (programs on perf events, one per CPU), offcpu and wakeup (tp_btf),
    // with unwind tables loaded for a process (maps sonde made itself).
    // funclatency (uprobe.multi links, syscall tracepoints, softirq tp_btf).
    // A process built without frame pointers that mostly sleeps.
    let nofp = build_workload("libcblock", &["-O2", "-g", "-fomit-frame-pointer", "-pthread"]);
    let w = KillOnDrop(Command::new(&nofp).args(["60"]).spawn().unwrap());
    let wp = w.0.id().to_string();
    for (tool, ready, targets) in [
        ("profile", "sampling CPU stacks", &["-p", wp.as_str()][..]),
        ("offcpu", "tracing off-CPU time", &["-p", wp.as_str()][..]),
        ("profile", "sampling CPU stacks", &[][..]),
        ("offcpu", "tracing off-CPU time", &[]),
        ("wakeup", "tracing off-CPU time and its wakers", &[]),
        ("funclatency", "timing calls", &["libc:getpid", "syscall:read", "softirq:TIMER"]),
        ("slow", "watching for calls over", &["syscall:read", "--over", "1ms"]),
        ("cwnd", "tracing TCP congestion windows", &[]),
        ("cwnd", "tracing TCP congestion windows", &["--mechanism", "raw_tp"]),
        ("why", "accounting for every thread's time", &[]),
        ("why", "accounting for every thread's time", &["-p", wp.as_str()][..]),
    ] {
        let mut p = Command::new(SONDE)
            .args([tool, "-d", "60s"])
            .args(targets)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(p.stderr.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.contains(ready), "{tool}: {line}");
        let pid = p.id();
        let ours = programs_of(pid);
        assert!(!ours.is_empty(), "the {tool} program is visible");
        let chunks = unwind_chunks_of(pid);
        if targets.first() == Some(&"-p") && tool != "why" {
            assert!(!chunks.is_empty(), "{tool} -p loaded unwind tables");
        }
        p.kill().unwrap();
        let _ = p.wait();
        assert_gone(pid, &ours);
        // The table chunks sonde made (held only by its fds and by its
        // programs' maps) go with it.
        let t0 = Instant::now();
        while maps_alive(&chunks) {
            assert!(t0.elapsed() < Duration::from_secs(10), "unwind table maps {chunks:?} outlived a SIGKILLed {tool}");
            thread::sleep(Duration::from_millis(100));
        }
    }
    drop(w);
}

#[test]
fn sigterm_and_duration_end_cleanly_with_a_summary() {
    let (code, out) = Tracer::start(&["--addr", "192.0.2.0/24"]).end(libc::SIGTERM);
    assert_eq!(code, 0, "SIGTERM is a clean stop");
    summary(&out);

    let out = Command::new(SONDE).args(["retrans", "-d", "1s", "--json", "--addr", "192.0.2.0/24"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let last: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "summary");
    assert_eq!(last["lost"], 0);
}

#[test]
fn bad_input_is_one_line_exit_2_and_attaches_nothing() {
    let before = our_prog_ids();
    let cases: &[&[&str]] = &[
        &["retrans", "--bogus"],
        &["retrans", "--port", "0"],
        &["retrans", "--port", "http"],
        &["retrans", "--addr", "10.0.0.0/33"],
        &["retrans", "--addr", "not-an-ip"],
        &["retrans", "--kind", "lost"],
        &["retrans", "-d", "-5s"],
        &["retrans", "-d", "soon"],
        &["retrans", "--cgroup", "/nonexistent/cgroup"],
        &["retrans", "--netns", "no-such-namespace"],
        &["retrans", "--netns", "/etc/hostname"],
        &["retrans", "-p", "999999999"],
        &["retrans", "-o", "/nonexistent-dir/out.json"],
        &["retrans", "-o", "out.svg"],
        &["retrans", "-i", "5s"],
        &["retrans", "--top", "3"],
        &["retrans", "--count", "--top", "-1"],
        &["lab", "retrans", "--loss", "90"],
        &["lab", "dns", "-d", "0s"],
        &["lab", "slow", "-d", "0s"],
        &["lab", "dns", "--delay", "200ms-100ms"],
        &["lab", "dns", "--workers", "0"],
        &["lab", "dns", "--prefix", "/nonexistent-dir/x"],
        &["profile", "-F", "0"],
        &["profile", "-F", "100000000"],
        &["profile", "-p", "999999999"],
        &["profile", "-o", "/nonexistent-dir/p.svg"],
        &["profile", "-o", "p.png"],
        &["profile", "--user-only", "--kernel-only"],
        &["profile", "--unwind", "lbr"],
        &["offcpu", "--unwind", "frame-pointers"],
        &["slow", "syscall:read", "--over", "1ms", "--unwind", "orc"],
        &["doctor", "--unwind", "/nonexistent-file"],
        &["doctor", "--unwind", "/etc/passwd"],
        &["doctor", "--unwind", "/tmp"],
        &["offcpu", "-p", "999999999"],
        &["offcpu", "--min-block", "soon"],
        &["offcpu", "--min-block", "10ms", "--max-block", "1ms"],
        &["offcpu", "--state", "asleep"],
        &["offcpu", "-o", "out.png"],
        &["wakeup", "-p", "999999999"],
        &["funclatency"],
        &["funclatency", "no-such-binary-xyz:main"],
        &["funclatency", "libc:no_such_function_xyz*"],
        &["funclatency", "syscall:no_such_syscall"],
        &["funclatency", "softirq:BOGUS"],
        &["funclatency", "kernel:tcp_*"],
        &["funclatency", "-p", "999999999", "syscall:read"],
        &["funclatency", "nocolon"],
        &["funclatency", "libc:*", "--max-probes", "8"],
        &["slow", "syscall:read"],
        &["slow", "syscall:read", "--over", "0"],
        &["slow", "syscall:read", "--over", "1ms", "-o", "x.png"],
        &["slow", "kernel:tcp_v4_connect", "--over", "1ms"],
        &["cwnd", "--every", "soon"],
        &["cwnd", "--min-idle", "-1ms"],
        &["cwnd", "-o", "out.png"],
        &["cwnd", "-o", "/nonexistent-dir/c.svg"],
        &["cwnd", "-p", "999999999"],
        &["cwnd", "--port", "0"],
        &["cwnd", "--mechanism", "kprobe"],
        &["cwnd", "--mechanism", "fentry"],
        &["cwnd", "--mechanism", "bpftrace"],
        &["lab", "idle-restart", "--responses", "1"],
        &["lab", "idle-restart", "--gap", "100ms"],
        &["lab", "idle-restart", "-o", "chart.png"],
        &["msglat", "-p", "999999999"],
        &["msglat", "-p", "1", "--id", "0:9"],
        &["msglat", "-p", "1", "--id", "abc"],
        &["msglat", "-p", "1", "--id", "0:8", "--fifo"],
        &["msglat", "-p", "1", "-o", "x.svg"],
        &["msglat", "-p", "1", "--hooks", "kprobe"],
        &["msglat", "-p", "1", "--port", "0"],
        &["msglat"],
        &["lab", "msglat", "--size", "8"],
        &["lab", "msglat", "--messages", "0"],
        &["lab", "msglat", "--cpu", "4096"],
        &["profile", "-p", "1", "--", "true"],
        &["profile", "--", "no-such-command-xyz"],
        &["offcpu", "--", "/nonexistent-dir/cmd"],
        &["wakeup", "--tid", "1", "--", "true"],
        &["slow", "syscall:read", "--over", "1ms", "-p", "1", "--", "true"],
        &["why", "-p", "999999999"],
        &["why", "-o", "why.png"],
        &["why", "-i", "1ms"],
        &["why", "--top", "0"],
        &["why", "--tid", "1", "--", "true"],
        &["frobnicate"],
    ];
    for c in cases {
        let out = Command::new(SONDE).args(*c).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{c:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{c:?} must print one line: {err}");
        assert!(err.starts_with("sonde: "), "{c:?}: {err}");
    }
    assert_none_left(&before, "bad input");
}

#[test]
fn closed_stdout_ends_quietly_with_status_0_and_attaches_nothing() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let before = our_prog_ids();
    let cases: &[&[&str]] = &[
        &["doctor"],
        &["doctor", "--json"],
        &["profile", "-d", "1", "-F", "49"],
        &["profile", "-d", "1", "-F", "49", "--json"],
        &["offcpu", "-d", "1", "--json"],
        &["retrans", "-d", "1", "--json"],
        &["funclatency", "-d", "1", "--json", "syscall:nanosleep"],
        &["why", "-d", "1", "--json"],
        &["why", "-d", "1"],
    ];
    for c in cases {
        // A pipe whose reader is gone before sonde starts: its first write fails.
        let mut fds = [0; 2];
        // SAFETY: fds is a valid out-parameter of two ints.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 just returned these two fds, owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(r);
        let out = Command::new(SONDE).args(*c).stdout(Stdio::from(w)).stderr(Stdio::piped()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{c:?}: {err}");
        assert!(!err.contains("pipe") && !err.contains("panicked") && !err.contains("error"), "{c:?}: {err}");
    }
    assert_none_left(&before, "a closed stdout");
}

#[test]
fn unprivileged_run_is_refused_with_exit_2() {
    let out = unprivileged(&["retrans", "-d", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("CAP_BPF"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1);
    let doc = unprivileged(&["doctor"]);
    assert_eq!(doc.status.code(), Some(2), "doctor: sonde cannot run unprivileged");
}

#[test]
fn doctor_reports_the_mechanism_retrans_uses() {
    let out = Command::new(SONDE).args(["doctor", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["usable"], true);
    for f in
        ["btf", "tp_btf", "raw_tp", "tracepoint", "kprobe", "fentry", "uprobe", "perf_event", "ringbuf", "bpf_stats"]
    {
        assert!(v["features"][f]["ok"].is_boolean(), "feature {f}");
    }
    // The kernel's own answer: kprobes exist iff the kprobe PMU does.
    let kprobe_pmu = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    assert_eq!(v["features"]["kprobe"]["ok"], kprobe_pmu);
    let tp_btf = v["features"]["tp_btf"]["ok"] == true;
    assert_eq!(v["tools"]["retrans"]["mechanism"], if tp_btf { "tp_btf" } else { "raw_tp" });
}

#[test]
fn every_tool_help_has_an_overhead_paragraph() {
    // Every tool `sonde --help` lists (a new tool is checked without an edit here).
    let top = Command::new(SONDE).arg("--help").output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    let tools: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|t| !["lab", "help"].contains(t))
        .collect();
    assert!(tools.len() >= 8 && tools.contains(&"retrans") && tools.contains(&"msglat"), "{top}");
    // One line per command in `sonde --help`.
    let block: Vec<&str> =
        top.lines().skip_while(|l| !l.starts_with("Commands:")).skip(1).take_while(|l| l.starts_with("  ")).collect();
    assert!(block.iter().all(|l| !l.starts_with("   ")), "a command's summary runs past one line: {top}");
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for tool in tools {
        let out = Command::new(SONDE).args([tool, "--help"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("OVERHEAD"), "{tool} --help: {text}");
        // The figures have one source: the docs page repeats the help's
        // OVERHEAD paragraph word for word.
        let para = text.split("\n\n").find(|p| p.trim_start().starts_with("OVERHEAD")).unwrap();
        let page = std::fs::read_to_string(root.join(format!("docs/{tool}.md"))).unwrap();
        assert!(
            squash(&page).contains(&squash(para)),
            "docs/{tool}.md does not repeat `sonde {tool} --help`'s OVERHEAD paragraph:\n{para}"
        );
    }
    // A missing required option is named in the one-line error.
    let out = Command::new(SONDE).args(["slow", "syscall:read"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && err.contains("--over"), "{err}");
}

/// The man pages and completions in docs/ are what the flag definitions
/// give today (`make docs` writes them), and bash completes with them.
#[test]
fn man_pages_and_completions_are_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let dir = std::env::temp_dir().join(format!("sonde-generate-{}", std::process::id()));
    let st = Command::new(SONDE).args(["generate", "all", dir.to_str().unwrap()]).status().unwrap();
    assert!(st.success());
    let mut made: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    made.sort();
    assert!(made.contains(&"sonde.1".to_string()) && made.contains(&"sonde-drops.1".to_string()), "{made:?}");
    let mut stale = Vec::new();
    for f in &made {
        let sub = if f.ends_with(".1") { "man" } else { "completions" };
        let new = std::fs::read(dir.join(f)).unwrap();
        if std::fs::read(root.join(sub).join(f)).ok() != Some(new) {
            stale.push(format!("docs/{sub}/{f}"));
        }
    }
    let page = std::fs::read_to_string(dir.join("sonde-drops.1")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(stale.is_empty(), "out of date (run `make docs`): {stale:?}");
    assert!(page.starts_with(".ie") || page.contains(".TH sonde-drops 1"), "{page}");
    assert!(page.contains("OVERHEAD") && page.contains("\\-\\-not\\-reason"), "{page}");
    // bash, given the completion, completes a command and a flag.
    let complete = |line: &str| -> String {
        let words: Vec<&str> = line.split(' ').collect();
        let script = format!(
            "source {}; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; _sonde sonde '{}' '{}'; echo \"${{COMPREPLY[@]}}\"",
            root.join("completions/sonde.bash").display(),
            words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" "),
            words.len() - 1,
            line.len(),
            words[words.len() - 1],
            words[words.len() - 2],
        );
        let out = Command::new("bash").args(["-c", &script]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(complete("sonde dr").trim(), "drops");
    assert!(complete("sonde drops --not-r").contains("--not-reason"));
}

/// No program of ours that was not there `before` stays without a holder:
/// new programs held by a live process belong to tests running alongside,
/// one nobody holds that does not go away was left attached by `what`.
fn assert_none_left(before: &[u64], what: &str) {
    let mut left: Vec<u64> = Vec::new();
    for _ in 0..20 {
        let held = held_prog_ids();
        left = our_prog_ids().into_iter().filter(|id| !before.contains(id) && !held.contains(id)).collect();
        if left.is_empty() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    assert!(left.is_empty(), "{what} left programs attached: {left:?}");
}
