//! Perf maps as hostile input: processes in roots of their own (chroot, as
//! nobody) plant in their /tmp what sonde, as root, must not follow, block on,
//! read whole or print.
use std::os::unix::{ffi::OsStrExt, fs::symlink};

use super::common::*;

/// The uid the targets run as.
const NOBODY: u32 = 65534;

/// A JIT process in a root of its own: its pid, and where its code is.
struct Target {
    _proc: KillOnDrop,
    pid: u32,
    code: String,
}

/// Starts `jit --print` chrooted into `root` as nobody; `root` gets the
/// binary and, unless it exists, a /tmp.
fn start_in_root(jit: &std::path::Path, root: &std::path::Path) -> Target {
    std::fs::create_dir_all(root).unwrap();
    std::fs::copy(jit, root.join("jit")).unwrap();
    if std::fs::symlink_metadata(root.join("tmp")).is_err() {
        std::fs::create_dir(root.join("tmp")).unwrap();
        chown(&root.join("tmp"), NOBODY);
    }
    let mut child = Command::new("chroot")
        .arg(format!("--userspec={NOBODY}:{NOBODY}"))
        .arg(root)
        .args(["/jit", "--print"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let code = line.trim().to_string();
    assert!(code.contains(' '), "jit --print said {line:?}");
    Target { pid: child.id(), _proc: KillOnDrop(child), code }
}

fn chown(p: &std::path::Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
}

/// A map with one good line naming the target's code `name`, owned by `uid`.
fn write_map(p: &std::path::Path, t: &Target, name: &str, uid: u32) {
    std::fs::write(p, format!("{} {name}\n", t.code)).unwrap();
    chown(p, uid);
}

/// Bytes that look like nothing (xorshift, so the run is repeatable).
fn garbage(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn profile_refuses_hostile_perf_maps_and_names_jit_code_from_good_ones() {
    // Eight spinning processes on every CPU: alone.
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let jit = build_workload("jit", &["-O1", "-static", "-fno-omit-frame-pointer"]);
    let base = std::env::temp_dir().join(format!("sonde-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let root = |name: &str| base.join(name);
    let map = |t: &Target, name: &str| root(name).join(format!("tmp/perf-{}.map", t.pid));

    // (a) The map is an absolute symlink to a host file that would name the
    // code SECRET_SYMLINK (resolved from sonde's root, it would be read).
    let a = start_in_root(&jit, &root("a"));
    write_map(&base.join("secret.map"), &a, "SECRET_SYMLINK", NOBODY);
    symlink(base.join("secret.map"), map(&a, "a")).unwrap();
    // (b) A FIFO: a plain open would wait for a writer forever.
    let b = start_in_root(&jit, &root("b"));
    let fifo = std::ffi::CString::new(map(&b, "b").as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    chown(&map(&b, "b"), NOBODY);
    // (c) A 10 GB sparse file after one good line.
    let c = start_in_root(&jit, &root("c"));
    write_map(&map(&c, "c"), &c, "sparse_named", NOBODY);
    std::fs::OpenOptions::new().write(true).open(map(&c, "c")).unwrap().set_len(10 << 30).unwrap();
    // (d) Binary garbage, and a line naming the code with terminal escapes.
    let d = start_in_root(&jit, &root("d"));
    let mut g = garbage(256 << 10);
    g.extend_from_slice(format!("\n{} evil\x1b]0;pwned\x07\x1b[2J\n", d.code).as_bytes());
    std::fs::write(map(&d, "d"), &g).unwrap();
    chown(&map(&d, "d"), NOBODY);
    // (e) A good map, but owned by root, not by the process (nobody).
    let e = start_in_root(&jit, &root("e"));
    write_map(&map(&e, "e"), &e, "SECRET_OTHER_UID", 0);
    // (f) The process's /tmp is an absolute symlink to a host directory that
    // holds a map for its pid: inside its root, /tmp leads nowhere.
    // Not under /tmp: inside the root, a target under /tmp would lead back
    // through the /tmp symlink itself (a loop, also refused, but a different
    // warning), and the repository may be cloned under /tmp (CI).
    let hostdir = std::path::Path::new("/var/tmp").join(format!("sonde-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&hostdir).unwrap();
    std::fs::create_dir_all(root("f")).unwrap();
    symlink(&hostdir, root("f").join("tmp")).unwrap();
    let f = start_in_root(&jit, &root("f"));
    write_map(&hostdir.join(format!("perf-{}.map", f.pid)), &f, "SECRET_TMP_SYMLINK", NOBODY);
    // (g) A good map in a root of its own: still read.
    let gd = start_in_root(&jit, &root("g"));
    write_map(&map(&gd, "g"), &gd, "chroot_jitted", NOBODY);

    let targets = [&a, &b, &c, &d, &e, &f, &gd];
    let folded = base.join("out.folded");
    let mut args: Vec<String> = vec!["profile".into(), "-d".into(), "2s".into(), "-F".into(), "199".into()];
    for t in targets {
        args.extend(["-p".into(), t.pid.to_string()]);
    }
    args.extend(["--json".into(), "-o".into(), folded.to_str().unwrap().into()]);
    let t0 = Instant::now();
    let mut child = Command::new(SONDE).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // A hang (the FIFO) must fail the test, not stall it.
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let watchdog = {
        let pid = child.id() as i32;
        thread::spawn(move || {
            if wait.recv_timeout(Duration::from_secs(60)).is_err() {
                // SAFETY: kill takes no pointers; sonde is not reaped yet.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        })
    };
    let out = {
        let o = std::mem::take(&mut child.stdout);
        let e = std::mem::take(&mut child.stderr);
        let (mut so, mut se) = (Vec::new(), Vec::new());
        let et = thread::spawn(move || std::io::Read::read_to_end(&mut e.unwrap(), &mut se).map(|_| se));
        std::io::Read::read_to_end(&mut o.unwrap(), &mut so).unwrap();
        let se = et.join().unwrap().unwrap();
        let status = child.wait();
        let _ = done.send(());
        (status.unwrap(), so, se)
    };
    let took = t0.elapsed();
    watchdog.join().unwrap();
    let (status, stdout, stderr) = out;
    let err = String::from_utf8_lossy(&stderr).into_owned();
    assert_eq!(status.code(), Some(0), "sonde must finish (no hang on the FIFO): {err}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {err}");

    // Nothing the hostile maps named, nor their escapes, reached any output.
    let text = std::fs::read(&folded).unwrap();
    for out in [&text[..], &stdout[..], &stderr[..]] {
        let s = String::from_utf8_lossy(out);
        assert!(!s.contains("SECRET"), "a host file or another uid's file was read: {s}");
        assert!(!s.contains("evil") && !out.contains(&0x1b), "escapes reached the output: {s:?}");
    }
    // The good map (in its own root) and the good line before the sparse
    // file's hole name the code.
    let rows = read_folded(&folded);
    let named = |n: &str| rows.iter().any(|(fr, _)| fr.iter().any(|x| x == n));
    assert!(named("chroot_jitted_[j]"), "{rows:?}");
    assert!(named("sparse_named_[j]"), "{rows:?}");

    // One warning per refused or cut map, naming the reason.
    let warned = |t: &Target, what: &str| {
        let pre = format!("sonde: perf map of pid {}", t.pid);
        let l: Vec<&str> = err.lines().filter(|l| l.starts_with(&pre)).collect();
        assert!(l.len() == 1 && l[0].contains(what), "pid {}: want one line with {what:?}: {err}", t.pid);
    };
    warned(&a, "refused: a symlink (perf maps must be regular files owned by the process)");
    warned(&b, "refused: a FIFO, not a regular file");
    warned(&c, "cut at 64 MiB (the rest is ignored); 1 line skipped");
    warned(&d, "lines skipped");
    warned(&e, &format!("refused: owned by uid 0, not by the process's uid {NOBODY}"));
    for t in [&f, &gd] {
        assert!(!err.contains(&format!("perf map of pid {} ", t.pid)), "pid {}: {err}", t.pid);
    }
    let v = json_lines(&stdout);
    let s = summary(&v);
    assert_eq!(s["perf_maps_refused"], 3, "{s}");
    assert_eq!(s["perf_maps_cut"], 1, "{s}");
    assert!(s["perf_map_lines_skipped"].as_u64().unwrap() >= 3, "the sparse tail, garbage and the escapes: {s}");
    let _ = std::fs::remove_dir_all(&base);
    let _ = std::fs::remove_dir_all(&hostdir);
}
