//! `sonde funclatency` and `sonde slow`: latency histograms and slow-call
//! stacks against workloads with known latencies.
use super::common::*;

/// `--json` latency lines of a funclatency run, by target.
fn latency_lines(stdout: &[u8]) -> (std::collections::HashMap<String, Value>, Value) {
    let lines: Vec<Value> = json_lines(stdout);
    let s = summary(&lines).clone();
    let by = lines
        .iter()
        .filter(|v| v["type"] == "latency")
        .map(|v| (v["target"].as_str().unwrap().to_string(), v.clone()))
        .collect();
    (by, s)
}

/// The one bucket a target's calls fell in: (le_ns, count) of the non-empty ones.
fn filled(v: &Value) -> Vec<(u64, u64)> {
    v["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["le_ns"].as_u64().unwrap(), b["count"].as_u64().unwrap()))
        .filter(|b| b.1 > 0)
        .collect()
}

#[test]
fn funclatency_counts_and_buckets_match_the_workload() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let bin =
        build_workload("lat", &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"]);
    // Run 1, by uprobe.multi links (this kernel has them), then by a uprobe
    // per function: the calls, then hang() still running when tracing stops.
    for (extra, mechanism) in [(None, "uprobe-multi"), (Some("--single-uprobes"), "uprobe")] {
        let log = bin.parent().unwrap().join(format!("lat-{}.log", std::process::id()));
        let w = KillOnDrop(Command::new(&bin).args(["1", "3", log.to_str().unwrap()]).spawn().unwrap());
        let pid = w.0.id().to_string();
        // `libc` is found in the process's mappings (libc.so.6).
        let out = Command::new(SONDE)
            .args([
                "funclatency",
                "-p",
                &pid,
                "lat:one_ms",
                "lat:ten_ms",
                "lat:recurse",
                "lat:hang",
                "libc:nanosleep",
                "-d",
                "3s",
                "--json",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        let (t, s) = latency_lines(&out.stdout);
        assert_eq!(s["uprobe_mechanism"], mechanism, "{s}");
        // Built in: 100 calls of 1.2 ms, 10 of 12 ms. The oracle for each call is
        // the pair of durations the workload measured, inside the function and
        // around the call: the uprobes' window lies between them (a call
        // preempted at its start or end lasts longer outside). Each bucket
        // holds at least the calls whose two durations share it, and at most
        // those plus the calls whose two durations straddle it (buckets: 4 per
        // power of two).
        let bucket_le = |ns: u64| -> u64 {
            let l = 63 - ns.leading_zeros() as u64;
            let sub = (ns >> (l - 2)) & 3;
            (5 + sub) << (l - 2)
        };
        let measured = std::fs::read_to_string(&log).unwrap();
        for name in ["one_ms", "ten_ms"] {
            let v = &t[&format!("lat:{name}")];
            let calls: Vec<(u64, u64)> = measured
                .lines()
                .filter_map(|l| {
                    let mut f = l.strip_prefix(name)?.split_whitespace().map(|x| x.parse::<u64>().unwrap());
                    Some((bucket_le(f.next()?), bucket_le(f.next()?)))
                })
                .collect();
            let got: std::collections::BTreeMap<u64, u64> = filled(v).into_iter().collect();
            assert_eq!(v["count"].as_u64(), Some(calls.len() as u64), "{v}");
            let buckets: std::collections::BTreeSet<u64> =
                calls.iter().flat_map(|c| [c.0, c.1]).chain(got.keys().copied()).collect();
            let straddling = calls.iter().filter(|c| c.0 != c.1).count();
            for k in buckets {
                let sure = calls.iter().filter(|c| c.0 == k && c.1 == k).count() as u64;
                let maybe = calls.iter().filter(|c| c.0 != c.1 && c.0 <= k && k <= c.1).count() as u64;
                let n = got.get(&k).copied().unwrap_or(0);
                assert!((sure..=sure + maybe).contains(&n), "{name}: bucket {k}: sonde {n}, workload {sure} + {maybe} straddling; sonde {got:?}, workload (inside, around) {calls:?}");
            }
            // Unless the host is very busy, few calls straddle a boundary.
            assert!(
                straddling <= calls.len() / 4,
                "{name}: {straddling} of {} calls straddle a bucket boundary: {calls:?}",
                calls.len()
            );
        }
        // Recursion: five nested calls per recurse(4), each paired with its own
        // return (each at least its 1.2 ms spin), none left over.
        let r = &t["lat:recurse"];
        assert!(r["count"] == 50 && filled(r).iter().all(|(le, _)| *le >= 1_310_720), "{r}");
        let p50 = t["lat:one_ms"]["p50_ns"].as_u64().unwrap();
        assert!((1_048_576..=1_310_720).contains(&p50), "{}", t["lat:one_ms"]);
        // hang(0.2) is done; hang(3) is still running at the end.
        assert_eq!(t["lat:hang"]["count"], 1, "{}", t["lat:hang"]);
        assert_eq!(t["lat:hang"]["in_flight"], 1, "{}", t["lat:hang"]);
        assert!(t["lat:hang"]["oldest_in_flight_ns"].as_u64().unwrap() > 500_000_000, "{}", t["lat:hang"]);
        assert_eq!(s["not_timed"]["unmatched_returns"], 0, "{s}");
        assert_eq!(s["not_timed"]["too_deep"], 0, "{s}");
        // hang() sleeps in libc's nanosleep: the same two calls, nested inside.
        let libc = &t["libc:nanosleep"];
        assert!(
            libc["count"] == 1 && libc["in_flight"] == 1 && libc["max_ns"].as_u64().unwrap() >= 200_000_000,
            "{libc}"
        );
        drop(w);
    }

    // Run 2: the process exits mid-trace; tracing finishes cleanly.
    let w = KillOnDrop(Command::new(&bin).args(["0.5", "0.2"]).spawn().unwrap());
    let pid = w.0.id().to_string();
    let out =
        Command::new(SONDE).args(["funclatency", "-p", &pid, "lat:one_ms", "-d", "3s", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (t, s) = latency_lines(&out.stdout);
    assert_eq!(t["lat:one_ms"]["count"], 100, "{s}");
    assert_eq!(s["in_flight"], 0, "{s}");
}

#[test]
fn funclatency_times_syscalls_and_softirqs_here() {
    // The block workload's sleeper: nanosleep of 20 and 10 ms, alternately.
    let bin = build_workload(
        "block",
        &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline", "-pthread"],
    );
    let w = KillOnDrop(Command::new(&bin).arg("6").spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let pid = w.0.id().to_string();
    let out = Command::new(SONDE)
        .args(["funclatency", "-p", &pid, "syscall:nanosleep", "softirq:TIMER", "-d", "2s", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (t, _) = latency_lines(&out.stdout);
    let ns = &t["syscall:nanosleep"];
    // ~67 sleeps in 2 s: half 20 ms, half 10 ms, alternately (plus the
    // writer's 5 ms). A sleep never ends early, and on a busy host it may
    // end late: each is told apart by the range below the next nominal
    // length, not by the bucket its nominal length falls in.
    let in_range =
        |lo: u64, hi: u64| filled(ns).iter().filter(|(le, _)| *le > lo && *le <= hi).map(|b| b.1).sum::<u64>();
    let (tens, twenties) = (in_range(10_000_000, 20_000_000), in_range(20_000_000, u64::MAX));
    // A sleep ~9 ms late (the tests beside this one, a soak on the host)
    // moves into the next range: the halves are equal within a fifth of
    // them, not exactly.
    let slack = 2.max((tens + twenties) as i64 / 5);
    assert!(
        tens >= 15 && twenties >= 15 && (tens as i64 - twenties as i64).abs() <= slack,
        "10 ms: {tens}, 20 ms: {twenties}: {ns}"
    );
    assert!(t["softirq:TIMER"]["count"].as_u64().unwrap() > 0, "{}", t["softirq:TIMER"]);
}

#[test]
fn slow_samples_only_inside_slow_calls_and_names_their_callers() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let bin = build_workload(
        "slowfn",
        &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"],
    );
    let w = KillOnDrop(Command::new(&bin).arg("6").spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let pid = w.0.id().to_string();
    let dir = bin.parent().unwrap().to_path_buf();
    let folded = dir.join("slow.folded");
    let out = Command::new(SONDE)
        .args([
            "slow",
            "-p",
            &pid,
            "slowfn:handle",
            "--over",
            "1ms",
            "-d",
            "2s",
            "--json",
            "-o",
            folded.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = json_lines(&out.stdout);
    let s = summary(&lines);
    // Built in: one call in ten spends 5 ms in inner_slow(), the rest 50 us.
    // Every via_slow() call is slow; a via_fast() one only if preempted for
    // over 1 ms (tests run alongside), and then it must say so.
    let calls: Vec<&Value> = lines.iter().filter(|v| v["type"] == "slow_call").collect();
    let total = s["calls"].as_u64().unwrap();
    let from = |c: &Value, f: &str| c["stack"].as_array().unwrap().iter().any(|x| x == f);
    let via_slow = calls.iter().filter(|c| from(c, "via_slow")).count() as u64;
    assert!(via_slow * 10 + 20 >= total && via_slow * 10 <= total + 20, "{via_slow} via_slow of {total}: {s}");
    for c in &calls {
        let l = c["latency_ns"].as_u64().unwrap();
        assert!(l >= 1_000_000 && (from(c, "via_fast") || l >= 5_000_000) && !from(c, "handle"), "{c}");
    }
    let via_fast = calls.len() as u64 - via_slow;
    assert!(via_fast * 5 <= via_slow, "{via_fast} preempted fast calls against {via_slow} slow ones: {s}");
    // Call sites hold every slow call, each listed call in the site of its
    // stack; the via_slow site exactly the via_slow calls.
    let sites: Vec<&Value> = lines.iter().filter(|v| v["type"] == "slow_site").collect();
    let n = |v: &Value| v["calls"].as_u64().unwrap();
    assert_eq!(sites.iter().map(|x| n(x)).sum::<u64>(), s["slow_calls"].as_u64().unwrap(), "{s}");
    assert_eq!(s["slow_calls_listed"].as_u64().unwrap(), calls.len() as u64, "{s}");
    assert_eq!(sites.iter().filter(|x| from(x, "via_slow")).map(|x| n(x)).sum::<u64>(), via_slow, "{sites:?}");
    let slowest = calls.iter().map(|c| c["latency_ns"].as_u64().unwrap()).max().unwrap();
    assert_eq!(sites[0]["max_ns"].as_u64().unwrap(), slowest, "the slowest call's site first: {sites:?}");
    assert_eq!(s["lost"]["sites_full"], 0, "{s}");
    // The flame graph: what slow calls did once slow is inner_slow(); fast
    // calls are never sampled.
    let rows = read_folded(&folded);
    let all: u64 = rows.iter().map(|r| r.1).sum();
    let slow: u64 = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "inner_slow")).map(|r| r.1).sum();
    assert!(all > 200 && slow as f64 >= 0.9 * all as f64, "{slow} of {all}: {rows:?}");
    assert!(rows.iter().all(|(f, _)| f[0] == "slowfn:handle [slowfn]"), "{rows:?}");
    assert_eq!(s["lost"]["slow_calls"], 0, "{s}");
    assert!(s["not_timed"]["too_deep"] == 0 && s["not_timed"]["unmatched_returns"] == 0, "{s}");
}

#[test]
fn funclatency_writes_json_lines_to_an_o_file() {
    // A sleeper whose nanosleep calls the file must count, as --json would.
    let mut sleeper = KillOnDrop(Command::new("sh").args(["-c", "while :; do sleep 0.05; done"]).spawn().unwrap());
    let path = std::env::temp_dir().join(format!("sonde-fl-{}.json", std::process::id()));
    let out = Command::new(SONDE)
        .args(["funclatency", "syscall:*nanosleep", "-d", "1s", "-o", path.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = sleeper.0.kill();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "results go to the file, not stdout");
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let lines: Vec<Value> = json_lines(&text);
    let calls: u64 = lines.iter().filter(|l| l["type"] == "latency").map(|l| l["count"].as_u64().unwrap()).sum();
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary", "{text}");
    assert_eq!(summary["calls"].as_u64(), Some(calls), "{text}");
    assert!(calls >= 5, "the sleeper slept about 20 times: {text}");
}
