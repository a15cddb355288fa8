//! `sonde offcpu` and `sonde wakeup`: blocked time against the kernel's own
//! schedstat, wakers against the workload.
use super::common::*;

#[test]
fn offcpu_attributes_blocked_time_to_the_right_stacks() {
    let bin = build_workload(
        "block",
        &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline", "-pthread"],
    );
    let dir = bin.parent().unwrap().to_path_buf();
    let mut w = KillOnDrop(Command::new(&bin).arg("8").spawn().unwrap());
    thread::sleep(Duration::from_millis(300));
    let (folded, pb) = (dir.join("off.folded"), dir.join("off.pb.gz"));
    let out = Command::new(SONDE)
        .args([
            "offcpu",
            "-p",
            &w.0.id().to_string(),
            "-d",
            "3s",
            "--min-block",
            "1ms",
            "-o",
            folded.to_str().unwrap(),
            "-o",
            pb.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let _ = w.0.kill();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let rows = read_folded(&folded);
    let us = |name: &str| rows.iter().filter(|(f, _)| f.iter().any(|x| x == name)).map(|r| r.1).sum::<u64>() as f64;
    // Built in: the sleeper sleeps 20 ms in sleep_long and 10 ms in sleep_short.
    let share = us("sleep_long") / (us("sleep_long") + us("sleep_short"));
    assert!((share - 2.0 / 3.0).abs() < 0.05, "sleep_long share {share:.3}: {rows:?}");
    // The sleeper and the reader are blocked nearly all of the 3 s traced.
    for f in ["sleeper_main", "reader_wait"] {
        let s = us(f) / 1e6;
        assert!((2.6..=3.1).contains(&s), "{f} blocked {s:.2} s of 3 s: {err}");
    }
    // Blocked where the workload blocks: in the kernel's sleep and pipe read.
    assert!(
        rows.iter().any(|(f, _)| f.iter().any(|x| x == "sleep_long") && f.iter().any(|x| x == "do_nanosleep_[k]")),
        "{rows:?}"
    );
    assert!(
        rows.iter().any(|(f, _)| f.iter().any(|x| x == "reader_wait") && f.iter().any(|x| x.contains("pipe_read"))),
        "{rows:?}"
    );
    // The stack engine's own frames are not in the stacks.
    assert!(
        rows.iter().all(|(f, _)| f.iter().all(|x| !x.starts_with("bpf_prog_") && !x.starts_with("bpf_trace_run"))),
        "{rows:?}"
    );
    // pprof: an offcpu sample type in nanoseconds with the same split.
    let top = Command::new(go_bin()).args(["tool", "pprof", "-top", "-cum"]).arg(&pb).output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(top.contains("Type: offcpu"), "{top}");
    assert!(top.lines().any(|l| l.ends_with(" sleep_long")), "{top}");
}

/// Minus the nanoseconds thread `tid` of `pid` has run on a CPU, by the
/// kernel's own schedstat, and the clock then: the change of the first plus
/// the time between is the time it spent off CPU (blocked, then waiting for a
/// CPU once woken, as offcpu counts it).
fn offcpu_ns(pid: u32, tid: u32) -> (f64, Instant) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).unwrap();
    let t = Instant::now();
    let on_cpu: f64 = s.split_whitespace().next().unwrap().parse().unwrap();
    (-on_cpu, t)
}

#[test]
fn offcpu_sampled_short_blocks_match_the_kernels_own_blocked_time() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let bin = build_workload(
        "block",
        &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline", "-pthread"],
    );
    let w = KillOnDrop(Command::new(&bin).args(["60", "tiny"]).spawn().unwrap());
    let pid = w.0.id();
    thread::sleep(Duration::from_millis(300));
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|t| std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm")).is_ok_and(|c| c.trim() == "ticker"))
        .expect("ticker thread");
    // Each way sonde can run: exact, sampled under 1 ms (default), start
    // records in a hash (raw_tp), stacks at sched_switch (no exit hook).
    // wakeup decides at the wake-up and weighs by the length then.
    //
    // sonde counts a period from the switch-out to the switch-in; schedstat
    // counts the context switches around it as run time. That difference is
    // a host's context-switch cost per period (here ~10 us of each ~300 us
    // block: sonde ~3.5% above schedstat), which a test must not depend on.
    // So: the exact run is checked against schedstat allowing up to 30 us
    // per period, and every other way against the exact run, each ratio to
    // its own window's schedstat share (the same offset cancels).
    let mut exact: Option<f64> = None;
    for (tool, extra) in [
        ("offcpu", &["--sample-below", "0"][..]),
        ("offcpu", &[]),
        ("offcpu", &["--mechanism", "raw_tp"]),
        ("offcpu", &["--switch-only"]),
        ("wakeup", &[]),
    ] {
        // Under the default 1 ms, ~30% of the ~300 us blocks are kept: a few
        // thousand in 3 s, a few percent of error.
        let d = "3s";
        let mut child = Command::new(SONDE)
            .args([tool, "--tid", &tid.to_string(), "-d", d, "--json"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = drain(child.stdout.take().unwrap());
        let mut r = BufReader::new(child.stderr.take().unwrap());
        // The kernel's count from the moment sonde traces, not from its
        // start: while a debug build loads on a busy host, the ticker also
        // waits for a CPU, and a window that held the load put its share
        // off CPU 10% above the traced seconds' (CI: raw_tp 0.932 of it
        // against the exact run's 1.033).
        let mut err = wait_for_stderr_line(&mut r, "sonde: tracing");
        let (b0, t0) = offcpu_ns(pid, tid);
        let rest = drain(r);
        let code = child.wait().unwrap().code();
        let (b1, t1) = offcpu_ns(pid, tid);
        err.push_str(&String::from_utf8_lossy(&rest.join().unwrap()));
        assert_eq!(code, Some(0), "{tool} {extra:?}: {err}");
        let lines: Vec<Value> = json_lines(stdout.join().unwrap());
        let s = summary(&lines);
        // The kernel's share of time off CPU over the run against sonde's
        // estimate over its traced window.
        let truth = (b1 - b0 + (t1 - t0).as_nanos() as f64) / (t1 - t0).as_nanos() as f64;
        let est = s["blocked_us"].as_f64().unwrap() / 1e6 / s["duration_s"].as_f64().unwrap();
        let periods = s["blocked_periods"].as_u64().unwrap() as f64;
        assert!(periods > 1500.0, "{tool} {extra:?}: {s}");
        let ratio = est / truth;
        match exact {
            None => {
                // At most 30 us of each period counted differently, and
                // never less than the kernel's own blocked time.
                let slack = 30e-6 * periods / s["duration_s"].as_f64().unwrap() / truth;
                assert!(
                    ratio > 0.98 && ratio < 1.0 + slack,
                    "exact: sonde {est:.3} of the time off CPU, schedstat {truth:.3} (allowed up to {:.3}): {s}",
                    1.0 + slack
                );
                exact = Some(ratio);
            }
            Some(x) => assert!(
                (ratio / x - 1.0).abs() < 0.06,
                "{tool} {extra:?}: {ratio:.3} of schedstat's share against the exact run's {x:.3}: {s}"
            ),
        }
        let sampled = s["sampled_periods"].as_u64().unwrap();
        if extra.is_empty() || extra[0] == "--mechanism" {
            assert!(
                s["hook"] == "sched_exit_tp" && sampled > 1500 && s["sampled_out"].as_u64().unwrap() > sampled,
                "{tool} {extra:?}: {s}"
            );
        } else {
            assert_eq!(sampled, 0, "{tool} {extra:?}: {s}");
        }
        // And the time is where the thread blocks.
        let in_tiny: u64 = lines
            .iter()
            .filter(|v| {
                v["type"] == "stack" && v["frames"].as_array().unwrap().iter().any(|f| f["name"] == "sleep_tiny")
            })
            .map(|v| v["count"].as_u64().unwrap())
            .sum();
        assert!(
            in_tiny as f64 > 0.97 * s["blocked_us"].as_f64().unwrap(),
            "{tool} {extra:?}: {in_tiny} us in sleep_tiny: {s}"
        );
    }
}

#[test]
fn wakeup_names_the_pipe_writer_as_the_readers_waker() {
    let bin = build_workload(
        "block",
        &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline", "-pthread"],
    );
    let folded = bin.parent().unwrap().join("wake.folded");
    let mut w = KillOnDrop(Command::new(&bin).arg("8").spawn().unwrap());
    thread::sleep(Duration::from_millis(300));
    let out = Command::new(SONDE)
        .args(["wakeup", "-p", &w.0.id().to_string(), "-d", "3s", "--min-block", "1ms", "-o", folded.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = w.0.kill();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = read_folded(&folded);
    // The reader's blocked periods: reader_wait below the separator.
    let blocked_in = |f: &[String], name: &str| f.iter().position(|x| x == name) < f.iter().position(|x| x == "--");
    let reader: Vec<&(Vec<String>, u64)> =
        rows.iter().filter(|(f, _)| f.iter().any(|x| x == "reader_wait") && blocked_in(f, "reader_wait")).collect();
    let total: u64 = reader.iter().map(|r| r.1).sum();
    // Built in: only writer_tick() writes the pipe the reader blocks on.
    let by_writer: u64 = reader
        .iter()
        .filter(|(f, _)| {
            let sep = f.iter().position(|x| x == "--").unwrap_or(f.len());
            let waker = &f[sep..];
            waker.iter().any(|x| x == "writer_tick")
                && waker.iter().any(|x| x.contains("pipe_write"))
                && waker.last().map(String::as_str) == Some("writer (waker)")
        })
        .map(|r| r.1)
        .sum();
    assert!(
        total > 2_000_000 && by_writer as f64 > 0.9 * total as f64,
        "reader blocked {total} us, {by_writer} woken by writer_tick: {reader:?}"
    );
    // The sleeper is woken by its timer, from interrupt context.
    let sleeper: Vec<&(Vec<String>, u64)> =
        rows.iter().filter(|(f, _)| f.iter().any(|x| x == "sleep_long") && blocked_in(f, "sleep_long")).collect();
    let by_timer: u64 = sleeper.iter().filter(|(f, _)| f.iter().any(|x| x == "hrtimer_wakeup_[k]")).map(|r| r.1).sum();
    let stotal: u64 = sleeper.iter().map(|r| r.1).sum();
    assert!(stotal > 0 && by_timer as f64 > 0.9 * stotal as f64, "{sleeper:?}");
}

/// A timer interrupt that wakes the sleeper runs on whatever task it hit:
/// here one of the spinners of another process. The kernel half finds the
/// interrupt entry below the wake-up and walks no user stack for it, so no
/// unwind table of the spinners' process is ever loaded. Task-context
/// wake-ups (the pipe writer) still get their user stack.
#[test]
fn wakeup_walks_no_user_stack_of_a_task_an_interrupt_hit() {
    let bin = build_workload(
        "block",
        &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline", "-pthread"],
    );
    let burn = build_workload("burn", &["-O2", "-g"]);
    // A spinner per CPU at the lowest priority: whenever the workload's
    // threads sleep, their CPU runs a spinner, and the timer hits it.
    let cpus = thread::available_parallelism().map_or(2, |n| n.get());
    let _spin: Vec<KillOnDrop> = (0..cpus)
        .map(|_| KillOnDrop(Command::new("nice").args(["-n", "19"]).arg(&burn).arg("20").spawn().unwrap()))
        .collect();
    let folded = bin.parent().unwrap().join("wake-irq.folded");
    let mut w = KillOnDrop(Command::new(&bin).arg("8").spawn().unwrap());
    thread::sleep(Duration::from_millis(300));
    let out = Command::new(SONDE)
        .args(["wakeup", "-p", &w.0.id().to_string(), "-d", "3s", "--min-block", "1ms", "--unwind", "dwarf", "--json"])
        .args(["-o", folded.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = w.0.kill();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_lines(&out.stdout);
    let s = summary(&v);
    // Built in: the sleeper wakes from nanosleep every 20 and 10 ms, the
    // writer every 5 ms: ~800 timer wake-ups in 3 s.
    let irq = s["interrupt_wakers"].as_u64().unwrap();
    assert!(irq > 400, "{s}");
    assert_eq!(s["unwind"]["table_stats"]["processes"], 1, "only the workload's own process has tables: {s}");
    let rows = read_folded(&folded);
    let waker_of = |f: &Vec<String>| f[f.iter().position(|x| x == "--").unwrap_or(f.len())..].to_vec();
    let sleeper: Vec<&(Vec<String>, u64)> = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "sleep_long")).collect();
    let total: u64 = sleeper.iter().map(|r| r.1).sum();
    let by_irq: u64 = sleeper
        .iter()
        .filter(|(f, _)| waker_of(f).last().map(String::as_str) == Some("[interrupt] (waker)"))
        .map(|r| r.1)
        .sum();
    assert!(total > 0 && by_irq as f64 > 0.9 * total as f64, "{sleeper:?}");
    let reader: Vec<&(Vec<String>, u64)> = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "reader_wait")).collect();
    let rtotal: u64 = reader.iter().map(|r| r.1).sum();
    let by_writer: u64 =
        reader.iter().filter(|(f, _)| waker_of(f).iter().any(|x| x == "writer_tick")).map(|r| r.1).sum();
    assert!(rtotal > 0 && by_writer as f64 > 0.9 * rtotal as f64, "the writer's user stack is walked: {reader:?}");
}
