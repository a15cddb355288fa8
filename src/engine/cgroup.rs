//! Resolve `--cgroup PATH` to the cgroup v2 id that `bpf_get_current_cgroup_id` returns.
use std::{os::unix::fs::MetadataExt, path::Path};

use super::error::usage;

/// Mount point of the unified (v2) hierarchy: /sys/fs/cgroup, or
/// /sys/fs/cgroup/unified on hybrid hosts; from /proc/self/mounts.
pub fn cgroup2_root() -> Option<String> {
    let m = std::fs::read_to_string("/proc/self/mounts").ok()?;
    m.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[2] == "cgroup2").then(|| f[1].to_string())
    })
}

/// Accepts an absolute path under the cgroup2 mount or a path relative to it.
pub fn cgroup_id(path: &str) -> anyhow::Result<u64> {
    cgroup_dir(path).map(|(id, _)| id)
}

/// The cgroup v2 directory `path` names (as [`cgroup_id`] takes it): its id
/// and full path.
pub fn cgroup_dir(path: &str) -> anyhow::Result<(u64, std::path::PathBuf)> {
    let root = cgroup2_root().ok_or_else(|| {
        super::error::env("--cgroup needs cgroup v2, and no cgroup2 file system is mounted; mount one or drop --cgroup")
    })?;
    let p = Path::new(path);
    let full = if p.is_absolute() { p.to_path_buf() } else { Path::new(&root).join(p) };
    let md = std::fs::metadata(&full).map_err(|e| {
        usage(format!("--cgroup {path}: {} ({e}); give a cgroup v2 directory under {root}", full.display()))
    })?;
    if !md.is_dir() || !full.join("cgroup.procs").exists() {
        return Err(usage(format!(
            "--cgroup {path}: {} is not a cgroup v2 directory (no cgroup.procs); pick one under {root}",
            full.display()
        )));
    }
    Ok((md.ino(), full))
}

/// The cgroup v2 id of process `pid` (its `0::PATH` line in
/// /proc/PID/cgroup, under the cgroup2 mount); None where that is unknown.
pub fn of_pid(pid: u32) -> Option<u64> {
    let root = cgroup2_root()?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let full = Path::new(&root).join(path.trim_start_matches('/'));
    // The path is the process's, as its cgroup namespace shows it: only a
    // directory under the mount, never followed out of it.
    if path.split('/').any(|c| c == "..") {
        return None;
    }
    std::fs::metadata(full).ok().filter(|m| m.is_dir()).map(|m| m.ino())
}

/// Mount point of the hierarchy holding the cpu controller: a cgroup v1
/// mount with the `cpu` option, else the unified (v2) one.
pub fn cpu_root() -> Option<String> {
    let m = std::fs::read_to_string("/proc/self/mounts").ok()?;
    m.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpu")).then(|| f[1].to_string())
        })
        .or_else(cgroup2_root)
}

/// The paths (relative to `root`, "/" for the root) of the cgroups whose
/// kernfs ids (their directories' inode numbers) are in `ids`: a walk of
/// at most 100,000 directories, 32 deep, never following a symbolic link.
pub fn paths_of(root: &str, ids: &std::collections::HashSet<u64>) -> std::collections::HashMap<u64, String> {
    let mut found = std::collections::HashMap::new();
    let mut todo = vec![(std::path::PathBuf::from(root), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = todo.pop() {
        seen += 1;
        if seen > 100_000 || found.len() == ids.len() {
            break;
        }
        let Ok(md) = std::fs::symlink_metadata(&dir) else { continue };
        if !md.is_dir() {
            continue;
        }
        if ids.contains(&md.ino()) {
            let rel = dir.strip_prefix(root).map(|p| format!("/{}", p.display())).unwrap_or_default();
            found.insert(md.ino(), rel);
        }
        if depth >= 32 {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                todo.push((e.path(), depth + 1));
            }
        }
    }
    found
}

/// A CPU quota that limits a thread: the cgroup holding it (relative to
/// the cpu controller's mount), the quota in CPUs, and its files' words.
#[derive(Debug, Clone, PartialEq)]
pub struct Quota {
    /// The cgroup with the quota (the thread's own or an ancestor).
    pub path: String,
    /// The quota over the period: CPUs' worth.
    pub cpus: f64,
    /// e.g. "cpu.cfs_quota_us 50000 of cpu.cfs_period_us 100000".
    pub files: String,
}

/// The CPU quota that limits thread `tid` of `pid`: its cpu cgroup (from
/// /proc/PID/task/TID/cgroup, under the cpu controller's mount, never out
/// of it) or the nearest ancestor with a quota; None without one.
pub fn quota_of(pid: u32, tid: u32) -> Option<Quota> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/cgroup")).ok()?;
    let root = cpu_root()?;
    let v1 = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        ctl.split(',').any(|c| c == "cpu").then(|| path.to_string())
    });
    let path = v1.clone().or_else(|| text.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string))?;
    if path.split('/').any(|c| c == "..") {
        return None;
    }
    let mut rel = Path::new(path.trim_start_matches('/')).to_path_buf();
    loop {
        let dir = Path::new(&root).join(&rel);
        let shown = format!("/{}", rel.display());
        if v1.is_some() {
            let q =
                std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).ok().and_then(|s| s.trim().parse::<i64>().ok());
            let p =
                std::fs::read_to_string(dir.join("cpu.cfs_period_us")).ok().and_then(|s| s.trim().parse::<i64>().ok());
            if let (Some(q), Some(p)) = (q, p) {
                if q > 0 && p > 0 {
                    let files = format!("cpu.cfs_quota_us {q} of cpu.cfs_period_us {p}");
                    return Some(Quota { path: shown, cpus: q as f64 / p as f64, files });
                }
            }
        } else if let Ok(m) = std::fs::read_to_string(dir.join("cpu.max")) {
            let f: Vec<&str> = m.split_whitespace().collect();
            if let (Some(Ok(q)), Some(Ok(p))) =
                (f.first().map(|s| s.parse::<i64>()), f.get(1).map(|s| s.parse::<i64>()))
            {
                if q > 0 && p > 0 {
                    return Some(Quota { path: shown, cpus: q as f64 / p as f64, files: format!("cpu.max {q} {p}") });
                }
            }
        }
        if !rel.pop() {
            return None;
        }
    }
}
