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
