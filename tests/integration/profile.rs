//! `sonde profile`: shares, names and source lines against workloads whose
//! split is built in.
use super::common::*;

#[test]
fn profile_shares_names_and_lines_match_the_workload() {
    let bin = build_workload("burn", FP);
    let dir = bin.parent().unwrap().to_path_buf();
    let mut w = KillOnDrop(Command::new(&bin).arg("8").spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let pid = w.0.id().to_string();
    let (folded, json, svg, pb, html) =
        (dir.join("p.folded"), dir.join("p.json"), dir.join("p.svg"), dir.join("p.pb.gz"), dir.join("p.html"));
    let o = |p: &std::path::Path| p.to_str().unwrap().to_string();
    // Until the workload has had 4 s of CPU (the 4 s window alone on a CPU).
    let Window { code, stderr: err, cpu, .. } = profile_window(
        &["-p", &pid, "-F", "199", "-o", &o(&folded), "-o", &o(&json), "-o", &o(&svg), "-o", &o(&pb), "-o", &o(&html)],
        w.0.id(),
        4.0,
    );
    let _ = w.0.kill();
    assert_eq!(code, 130, "SIGINT ends the run with 130 and the files: {err}");
    let rows = read_folded(&folded);
    let total: u64 = rows.iter().map(|r| r.1).sum();
    // The kernel's own account of the workload's CPU time, at 199 Hz.
    let want = cpu * 199.0;
    assert!(total > 300 && (total as f64 - want).abs() < 0.15 * want, "{total} samples for {cpu:.2} s of CPU; {err}");
    // The root frame is the process; everything else sits under main.
    assert!(rows.iter().all(|(f, _)| f[0] == "burn"), "root frame: {rows:?}");
    let under = |name: &str| rows.iter().filter(|(f, _)| f.iter().any(|x| x == name)).map(|r| r.1).sum::<u64>();
    let (h, l) = (under("heavy"), under("light"));
    let share = h as f64 / (h + l) as f64;
    // Built in: heavy burns 2/3 of the CPU time of heavy + light.
    assert!((share - 2.0 / 3.0).abs() < 0.04, "heavy share {share:.3} ({h} vs {l}); {err}");
    assert!(under("main") as f64 > 0.95 * total as f64, "{rows:?}");
    // DWARF inline info: light_inner() was inlined into light() and is its own frame.
    let inl: u64 =
        rows.iter().filter(|(f, _)| f.join(";").contains("main;light;light_inner_[i];spin")).map(|r| r.1).sum();
    assert!(inl as f64 > 0.9 * l as f64, "light's samples under the inlined light_inner: {inl} of {l}: {rows:?}");
    // Source lines from DWARF: the leaf in spin is its inner loop; heavy's frame is its call of spin.
    let burn_line = workload_line("burn", "BURN_LINE");
    let call_line = workload_line("burn", "spin(0.020);");
    let mut spin_lines: std::collections::HashMap<u64, u64> = Default::default();
    let mut heavy_lines: std::collections::HashMap<u64, u64> = Default::default();
    for l in std::fs::read_to_string(&json).unwrap().lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let frames = v["frames"].as_array().unwrap();
        let n = v["count"].as_u64().unwrap();
        if let Some(last) = frames.last() {
            if last["name"] == "spin" {
                assert!(last["file"].as_str().unwrap_or("").ends_with("burn.c"), "{last}");
                *spin_lines.entry(last["line"].as_u64().unwrap_or(0)).or_default() += n;
            }
        }
        for f in frames.iter().filter(|f| f["name"] == "heavy") {
            *heavy_lines.entry(f["line"].as_u64().unwrap_or(0)).or_default() += n;
        }
    }
    let top = |m: &std::collections::HashMap<u64, u64>| m.iter().max_by_key(|e| e.1).map(|e| *e.0);
    // The inner loop: its body or (sampling skid past the store) its increment.
    let loop_lines = [burn_line as u64, workload_line("burn", "BURN_LOOP") as u64];
    assert!(
        top(&spin_lines).is_some_and(|l| loop_lines.contains(&l)),
        "spin's hottest line {:?} not in {loop_lines:?}: {spin_lines:?}",
        top(&spin_lines)
    );
    assert_eq!(top(&heavy_lines), Some(call_line as u64), "heavy's line: {heavy_lines:?}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("heavy") && svg.contains("light"), "SVG names the functions");
    assert!(err.contains("truncated user stacks: 0"), "{err}");

    // go tool pprof reads the pprof file: same functions, same split, lines, build id.
    let go = |args: &[&str]| {
        let out = Command::new(go_bin()).args(["tool", "pprof"]).args(args).arg(&pb).output().expect("go tool pprof");
        assert!(out.status.success(), "go tool pprof {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = go(&["-top", "-cum"]);
    let cum_ms = |name: &str| -> f64 {
        let l = top
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("{name} in {top}"));
        let f: Vec<&str> = l.split_whitespace().collect();
        let v = f[3];
        let (num, unit) = v.split_at(v.find(|c: char| c.is_alphabetic()).unwrap());
        num.parse::<f64>().unwrap() * if unit == "s" { 1000.0 } else { 1.0 }
    };
    let (hm, lm) = (cum_ms("heavy"), cum_ms("light"));
    let pshare = hm / (hm + lm);
    assert!((pshare - 2.0 / 3.0).abs() < 0.04, "pprof heavy share {pshare:.3}: {top}");
    assert!(top.contains("Type: cpu"), "{top}");
    let lines = go(&["-top", "-lines"]);
    assert!(
        lines.contains(&format!("burn.c:{}", loop_lines[0])) || lines.contains(&format!("burn.c:{}", loop_lines[1])),
        "{lines}"
    );
    let raw = go(&["-raw"]);
    let exe =
        raw.lines().find(|l| l.contains(bin.to_str().unwrap())).unwrap_or_else(|| panic!("mapping of {bin:?}: {raw}"));
    let id = exe.split_whitespace().nth(3).unwrap_or("");
    // The build ID as `file` reads it from the ELF note.
    let file = Command::new("file").arg(&bin).output().unwrap();
    let file = String::from_utf8_lossy(&file.stdout);
    let want = file.split("BuildID[sha1]=").nth(1).and_then(|r| r.split(',').next()).unwrap_or("?");
    assert_eq!(id, want, "build id of {exe} vs `file`: {file}");

    // A browser opens the HTML offline: no console errors, the frames are
    // there, and its search (driven by ?s=) finds heavy's share.
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"), "the page fetches nothing");
    let out = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--dump-dom"])
        .arg(format!("file://{}?s=heavy", html.display()))
        .output()
        .expect("chromium (Debian package chromium)");
    let (dom, log) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!log.contains("Uncaught") && !log.contains(":ERROR:CONSOLE"), "console errors: {log}");
    let frames: u64 =
        dom.split("data-frames=\"").nth(1).and_then(|r| r.split('"').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(frames >= 5, "frames in the DOM: {frames}");
    let matched = dom
        .split("id=\"matched\"")
        .nth(1)
        .and_then(|r| r.split("Matched: ").nth(1))
        .and_then(|r| r.split('%').next())
        .and_then(|n| n.parse::<f64>().ok());
    assert!(matched.is_some_and(|m| (m - 66.7).abs() < 4.0), "search for heavy in the browser: {matched:?}");
}

#[test]
fn profile_marks_stacks_without_frame_pointers_truncated() {
    let bin = build_workload("burn", &["-O2", "-fomit-frame-pointer", "-fno-inline"]);
    let folded = bin.parent().unwrap().join("nofp.folded");
    let mut w = KillOnDrop(Command::new(&bin).arg("6").spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let (code, err) = profile(&[
        "-p",
        &w.0.id().to_string(),
        "-d",
        "3s",
        "-F",
        "199",
        "--user-only",
        "--unwind",
        "fp",
        "-o",
        folded.to_str().unwrap(),
    ]);
    let _ = w.0.kill();
    assert_eq!(code, 0, "{err}");
    let rows = read_folded(&folded);
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let cut: u64 = rows.iter().filter(|(f, _)| f.get(1).map(String::as_str) == Some("[truncated]")).map(|r| r.1).sum();
    // Every stack either reaches the program's start or says it does not.
    let whole: u64 = rows
        .iter()
        .filter(|(f, _)| f.get(1).is_some_and(|x| x.starts_with("__libc_start") || x == "_start"))
        .map(|r| r.1)
        .sum();
    assert_eq!(cut + whole, total, "{rows:?}");
    assert!(cut as f64 > 0.5 * total as f64, "without frame pointers most stacks are cut short: {cut} of {total}");
    let line = err.lines().find(|l| l.starts_with("truncated user stacks:")).unwrap();
    let n: u64 = line.split('(').nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(n, cut, "the summary counts them: {line}");
    assert!(err.contains("hint: [truncated]"), "{err}");
}

#[test]
fn profile_symbolizes_a_process_that_exits_early_and_honours_perf_maps() {
    let bin = build_workload("burn", FP);
    let jit = build_workload("jit", &["-O1", "-fno-omit-frame-pointer"]);
    let folded = bin.parent().unwrap().join("exit.folded");
    let mut w = Command::new(&bin).arg("1.5").spawn().unwrap();
    let mut j = KillOnDrop(Command::new(&jit).spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let (wp, jp) = (w.id().to_string(), j.0.id().to_string());
    let (code, err) = profile(&["-p", &wp, "-p", &jp, "-d", "3s", "-F", "199", "-o", folded.to_str().unwrap()]);
    let _ = j.0.kill();
    let _ = w.wait();
    let _ = std::fs::remove_file(format!("/tmp/perf-{jp}.map"));
    assert_eq!(code, 0, "{err}");
    let rows = read_folded(&folded);
    let has = |root: &str, name: &str| rows.iter().any(|(f, n)| f[0] == root && *n > 0 && f.iter().any(|x| x == name));
    // burn ran 1.5 s of the 3 s and was gone at the end: still named.
    assert!(has("burn", "heavy") && has("burn", "light"), "{rows:?}");
    // The JIT process's code is named by its /tmp/perf-PID.map.
    assert!(has("jit", "jitted_spin_[j]"), "{rows:?}");
    assert!(
        err.contains(&format!("JIT code named by the process's own files: {jp} by /tmp/perf-{jp}.map, 1 symbols")),
        "{err}"
    );
}

/// A JIT that names code in its perf map while it runs, then exits before
/// the end: the code named after sonde first read the map is named too
/// (the map is read on as it grows), each about as often as the workload
/// ran it (two equal phases of wall time), and little of the process stays
/// unnamed (code it never named, its first half second). Its map is made
/// after that half second, after sonde's first look, which finds none: it
/// is looked for again (every 2 s). The process is reaped only after the
/// run: at its end it is a zombie, and the unnamed code makes sonde look
/// at it again then; its empty maps must not replace what was read while
/// it ran (they once did: every frame was unknown).
#[test]
fn profile_names_jit_code_named_after_the_start_by_a_process_gone_at_the_end() {
    let jit = build_workload("jit", &["-O1", "-fno-omit-frame-pointer"]);
    let folded = jit.parent().unwrap().join("late.folded");
    let mut j = KillOnDrop(Command::new(&jit).args(["--late", "2"]).spawn().unwrap());
    thread::sleep(Duration::from_millis(100));
    let jp = j.0.id().to_string();
    let (code, err) = profile(&["-p", &jp, "-d", "6s", "-F", "199", "-o", folded.to_str().unwrap()]);
    let status = j.0.wait().unwrap();
    let _ = std::fs::remove_file(format!("/tmp/perf-{jp}.map"));
    assert_eq!(code, 0, "{err}");
    assert!(status.success(), "the JIT workload failed: {status}");
    let rows = read_folded(&folded);
    let of = |name: &str| -> u64 { rows.iter().filter(|(f, _)| f.iter().any(|x| x == name)).map(|r| r.1).sum() };
    let (early, late) = (of("jitted_early_[j]"), of("jitted_late_[j]"));
    let all: u64 = rows.iter().map(|r| r.1).sum();
    eprintln!("early {early}, late {late} of {all} samples: {rows:?}");
    assert!(all >= 200, "{all} samples: {rows:?}");
    // 0.4 s of code never named in the run, then 2 s and 2 s.
    let share = late as f64 / all as f64;
    assert!((0.3..=0.7).contains(&share), "late code {late} of {all} samples: {rows:?}");
    assert!(early + late >= all * 80 / 100, "unnamed: {} of {all}: {rows:?}", all - early - late);
    // Its native frames named too (from the snapshot taken while it ran).
    let native: u64 = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "_start")).map(|r| r.1).sum();
    assert!(native >= all * 95 / 100, "{native} of {all} samples reach _start: {rows:?}");
    assert!(
        err.contains(&format!("JIT code named by the process's own files: {jp} by /tmp/perf-{jp}.map, 2 symbols")),
        "{err}"
    );
}

/// A JIT that names its code in a jitdump it maps (perf's binary JIT
/// interface, as Python 3.13's -X perf_jit and Node's --perf-prof write):
/// a code load at a decoy address, then a code move to where it runs.
#[test]
fn profile_names_jit_code_from_a_mapped_jitdump() {
    let jit = build_workload("jit", &["-O1", "-fno-omit-frame-pointer"]);
    let folded = jit.parent().unwrap().join("jitdump.folded");
    let mut j = KillOnDrop(Command::new(&jit).arg("--jitdump").spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let jp = j.0.id().to_string();
    // 4 s: beside the late-JIT test (its spinner and sonde's start-up)
    // this one's spinner was seen to get a fifth of a CPU, 80 samples in 2 s.
    let (code, err) = profile(&["-p", &jp, "-d", "4s", "-F", "199", "-o", folded.to_str().unwrap()]);
    let _ = j.0.kill();
    let _ = std::fs::remove_file(format!("/tmp/jit-{jp}.dump"));
    assert_eq!(code, 0, "{err}");
    let rows = read_folded(&folded);
    let named: u64 = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "jitted_dump_spin_[j]")).map(|r| r.1).sum();
    let all: u64 = rows.iter().map(|r| r.1).sum();
    assert!(all > 100 && named as f64 > 0.95 * all as f64, "{named} of {all} named from the jitdump: {rows:?}");
    assert!(
        err.contains(&format!(
            "JIT code named by the process's own files: {jp} by jitdump /tmp/jit-{jp}.dump, 1 symbols"
        )),
        "{err}"
    );
}

#[test]
fn profile_json_and_top_table_agree_with_the_workload() {
    let bin = build_workload("burn", FP);
    let mut w = KillOnDrop(Command::new(&bin).arg("8").spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let pid = w.0.id().to_string();
    // --json: stack lines, then a summary whose sample count they add up to.
    let t0 = cpu_ticks(w.0.id());
    let out = Command::new(SONDE).args(["profile", "-p", &pid, "-d", "2s", "-F", "199", "--json"]).output().unwrap();
    // SAFETY: sysconf takes no pointers.
    let cpu = (cpu_ticks(w.0.id()) - t0) as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<Value> = json_lines(&out.stdout);
    let s = summary(&lines);
    let counted: u64 = lines.iter().filter(|v| v["type"] == "stack").map(|v| v["count"].as_u64().unwrap()).sum();
    assert_eq!(Some(counted), s["samples"].as_u64(), "{s}");
    // As many samples as the CPU the workload got (it competes with the
    // tests beside it): at most 199 per second of it, and some at all.
    assert!(
        counted > 50 && counted as f64 <= cpu * 199.0 * 1.15 + 10.0,
        "{counted} samples for {cpu:.2} s of CPU: {s}"
    );
    // No -o: the top table, spin first (the workload's only hot loop).
    let out = Command::new(SONDE).args(["profile", "-p", &pid, "-d", "2s", "-F", "199"]).output().unwrap();
    let _ = w.0.kill();
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().nth(1).unwrap_or("");
    let selfp: f64 = first.split('%').next().unwrap_or("0").trim().parse().unwrap_or(0.0);
    assert!(first.ends_with(" spin") && selfp > 75.0, "{text}");
}

#[test]
fn profile_symbolizes_a_process_in_its_own_mount_and_pid_namespace() {
    // A "container": the binary exists only on a tmpfs inside a new mount
    // namespace, and the process has its own pid namespace. Selected by --comm.
    let bin = build_workload("burn", FP);
    let script = format!("mount -t tmpfs none /mnt && cp {} /mnt/cburn && exec /mnt/cburn 6", bin.display());
    let mut c = KillOnDrop(
        Command::new("unshare")
            .args(["--mount", "--pid", "--fork", "--mount-proc", "sh", "-c", &script])
            .spawn()
            .unwrap(),
    );
    thread::sleep(Duration::from_millis(400));
    assert!(!std::path::Path::new("/mnt/cburn").exists(), "the binary must not be visible outside");
    let folded = bin.parent().unwrap().join("ns.folded");
    let (code, err) = profile(&["--comm", "cburn", "-d", "2s", "-F", "199", "-o", folded.to_str().unwrap()]);
    let _ = c.0.kill();
    assert_eq!(code, 0, "{err}");
    let rows = read_folded(&folded);
    assert!(!rows.is_empty() && rows.iter().all(|(f, _)| f[0] == "cburn"), "--comm keeps only it: {rows:?}");
    let named: u64 = rows.iter().filter(|(f, _)| f.iter().any(|x| x == "heavy" || x == "light")).map(|r| r.1).sum();
    let total: u64 = rows.iter().map(|r| r.1).sum();
    assert!(named as f64 > 0.9 * total as f64, "symbolized through /proc/PID/map_files: {rows:?}");
}
