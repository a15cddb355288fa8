//! cgroups: `--cgroup PATH` as the kernel half matches it, the cgroup2 and
//! cpu controller mounts, a thread's CPU quota.
use std::{
    collections::HashSet,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::error::usage;

/// The cgroup file systems mounted here (/proc/self/mountinfo).
fn mounted() -> Vec<CgroupMount> {
    cgroup_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// Mount point of the unified (v2) hierarchy: /sys/fs/cgroup, or
/// /sys/fs/cgroup/unified on hybrid hosts.
pub fn cgroup2_root() -> Option<String> {
    mounted().into_iter().find(|m| m.v2).map(|m| m.point.to_string_lossy().into_owned())
}

/// A `--cgroup` argument resolved: the cgroup (a directory of the unified
/// hierarchy, cgroup v2, or of a cgroup v1 controller's), as the kernel half
/// (`src/bpf/cgroupfilter.h`) matches a task against it and its descendants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupTarget {
    /// Its kernfs id: the directory's inode number.
    pub id: u64,
    /// Its depth below its hierarchy's root (the root is 0); None where a
    /// cgroup namespace hides it (the kernel half then learns it from the
    /// first task it finds in the group).
    pub level: Option<u32>,
    /// The subsystem id (enum cgroup_subsys_id) of a controller of its
    /// cgroup v1 hierarchy; None for the unified hierarchy.
    pub ssid: Option<u32>,
    /// Its directory.
    pub dir: PathBuf,
}

/// A cgroup file system mounted here, from /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq)]
struct CgroupMount {
    /// Where it is mounted.
    point: PathBuf,
    /// The directory of its hierarchy mounted there ("/" for the root).
    root: String,
    /// True for cgroup2.
    v2: bool,
    /// Its controllers (cgroup v1: cpu, memory, ...; empty for a named
    /// hierarchy such as name=systemd, and for v2).
    controllers: Vec<String>,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let Some(v) = oct.and_then(|d| u8::try_from(d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'))).ok()) {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup file systems of a mountinfo text.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            let (fstype, _source, opts) = (post.next()?, post.next()?, post.next().unwrap_or(""));
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            let controllers = if v2 {
                Vec::new()
            } else {
                opts.split(',')
                    .filter(|o| {
                        !o.contains('=') && !matches!(*o, "rw" | "ro" | "xattr" | "noprefix" | "clone_children")
                    })
                    .map(str::to_string)
                    .collect()
            };
            Some(CgroupMount {
                point: PathBuf::from(unescape(pre.get(4)?)),
                root: unescape(pre.get(3)?),
                v2,
                controllers,
            })
        })
        .collect()
}

/// The enumerator of `enum cgroup_subsys_id` that a cgroup v1 controller's
/// mount option names (`cpu` -> `cpu_cgrp_id`; the io controller's v1
/// name is `blkio`).
fn subsys_enumerator(controller: &str) -> String {
    let c = if controller == "blkio" { "io" } else { controller };
    format!("{c}_cgrp_id")
}

/// The kernel's subsystem id of a cgroup v1 controller, from its BTF (the
/// rows of /proc/cgroups are not the ids: Linux 6.12 leaves out controllers
/// without v1 files).
fn subsys_id(controller: &str) -> Option<u32> {
    super::features::btf_enum_value("cgroup_subsys_id", &subsys_enumerator(controller))
        .and_then(|v| u32::try_from(v).ok())
}

/// Number of components of a path below "/".
fn depth(p: &Path) -> usize {
    p.components().filter(|c| matches!(c, std::path::Component::Normal(_))).count()
}

impl CgroupTarget {
    /// Resolves `path`: an absolute directory in any cgroup file system
    /// (v2, or a v1 controller's such as /sys/fs/cgroup/cpu/...), or a path
    /// relative to the cgroup2 mount, else to the cpu controller's mount,
    /// else to another v1 controller's. Usage errors (exit 2) name the fix.
    pub fn resolve(path: &str) -> anyhow::Result<Self> {
        let mounts = mounted();
        // The initial cgroup namespace's inode is the kernel's constant
        // (PROC_CGROUP_INIT_INO).
        let initial = std::fs::metadata("/proc/self/ns/cgroup").is_ok_and(|m| m.ino() == 0xEFFF_FFFB);
        Self::resolve_in(path, &mounts, &subsys_id, initial)
    }

    /// [`resolve`](Self::resolve) with the mounts, the controllers'
    /// subsystem ids and whether sonde runs in the initial cgroup namespace
    /// given.
    fn resolve_in(
        path: &str,
        mounts: &[CgroupMount],
        ssid_of: &dyn Fn(&str) -> Option<u32>,
        initial: bool,
    ) -> anyhow::Result<Self> {
        if mounts.is_empty() {
            return Err(super::error::env(
                "--cgroup: no cgroup file system is mounted here; mount one (cgroup2 or a v1 controller) or drop --cgroup",
            ));
        }
        let listed = || mounts.iter().map(|m| m.point.display().to_string()).collect::<Vec<_>>().join(", ");
        let p = Path::new(path);
        let (full, mount) = if p.is_absolute() {
            let full = std::fs::canonicalize(p).map_err(|e| {
                usage(format!("--cgroup {path}: {e}; give a cgroup directory under one of {}", listed()))
            })?;
            let m = mounts.iter().filter(|m| full.starts_with(&m.point)).max_by_key(|m| depth(&m.point)).ok_or_else(
                || {
                    usage(format!(
                        "--cgroup {path}: {} is in no cgroup file system; give a directory under one of {}",
                        full.display(),
                        listed()
                    ))
                },
            )?;
            (full, m)
        } else {
            // The unified hierarchy first, then cpu's (where CPU quotas are),
            // then the other controllers'.
            let mut order: Vec<&CgroupMount> = mounts.iter().filter(|m| m.v2).collect();
            order.extend(mounts.iter().filter(|m| m.controllers.iter().any(|c| c == "cpu")));
            order.extend(mounts.iter().filter(|m| !m.v2 && !m.controllers.is_empty()));
            order
                .into_iter()
                .find_map(|m| {
                    // Resolved (`a/../b`), and within the mount.
                    let full = std::fs::canonicalize(m.point.join(p)).ok()?;
                    (full.starts_with(&m.point) && full.join("cgroup.procs").is_file()).then_some((full, m))
                })
                .ok_or_else(|| {
                    usage(format!("--cgroup {path}: no such cgroup under {}; give an absolute path", listed()))
                })?
        };
        let md = std::fs::metadata(&full)
            .map_err(|e| usage(format!("--cgroup {path}: {} ({e}); give a cgroup directory", full.display())))?;
        if !md.is_dir() || !full.join("cgroup.procs").is_file() {
            return Err(usage(format!(
                "--cgroup {path}: {} is not a cgroup (no cgroup.procs); give a directory under {}",
                full.display(),
                mount.point.display()
            )));
        }
        // In a cgroup namespace of its own, the mount's root is shown
        // relative to the namespace's (as /../.. when above it, as / when
        // it is the namespace's own, however deep that is): how deep the
        // group is is then learnt in the kernel.
        let level = if !initial || mount.root.split('/').any(|c| c == "..") {
            None
        } else {
            let rel = full.strip_prefix(&mount.point).unwrap_or(Path::new(""));
            Some((depth(Path::new(&mount.root)) + depth(rel)) as u32)
        };
        let ssid = if mount.v2 {
            None
        } else {
            let id = mount.controllers.iter().find_map(|c| ssid_of(c)).ok_or_else(|| {
                let name = mount.controllers.first().cloned().unwrap_or_else(|| "a named hierarchy".to_string());
                usage(format!(
                    "--cgroup {path}: the cgroup v1 hierarchy at {} has no controller the kernel lists ({name}), so its groups cannot be told apart in the kernel; give the same group under a controller's mount (cpu, memory, ...)",
                    mount.point.display()
                ))
            })?;
            Some(id)
        };
        Ok(CgroupTarget { id: md.ino(), level, ssid, dir: full })
    }

    /// The processes in this cgroup and below it now (their cgroup.procs):
    /// a walk of at most 100,000 directories, 32 deep, never following a
    /// symbolic link.
    pub fn processes(&self) -> HashSet<u32> {
        let mut out = HashSet::new();
        walk(&self.dir, |dir, _| {
            if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(t.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
            true
        });
        out
    }
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
    mounted()
        .into_iter()
        .find(|m| m.controllers.iter().any(|c| c == "cpu"))
        .map(|m| m.point.to_string_lossy().into_owned())
        .or_else(cgroup2_root)
}

/// The paths (relative to `root`, "/" for the root) of the cgroups whose
/// kernfs ids (their directories' inode numbers) are in `ids`: a walk of
/// at most 100,000 directories, 32 deep, never following a symbolic link.
pub fn paths_of(root: &str, ids: &std::collections::HashSet<u64>) -> std::collections::HashMap<u64, String> {
    let mut found = std::collections::HashMap::new();
    walk(Path::new(root), |dir, md| {
        if ids.contains(&md.ino()) {
            let rel = dir.strip_prefix(root).map(|p| format!("/{}", p.display())).unwrap_or_default();
            found.insert(md.ino(), rel);
        }
        found.len() < ids.len()
    });
    found
}

/// Calls `each` on `top` and the directories below it (its path and
/// metadata; it returns false to stop): at most 100,000 directories, 32
/// deep, never following a symbolic link.
fn walk(top: &Path, mut each: impl FnMut(&Path, &std::fs::Metadata) -> bool) {
    let mut todo = vec![(top.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = todo.pop() {
        seen += 1;
        if seen > 100_000 {
            break;
        }
        let Ok(md) = std::fs::symlink_metadata(&dir) else { continue };
        if !md.is_dir() {
            continue;
        }
        if !each(&dir, &md) {
            break;
        }
        if depth >= 32 {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push((e.path(), depth + 1));
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 30 0:29 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
37 30 0:33 /docker/abc /sys/fs/cgroup/my\\040mem rw - cgroup cgroup rw,memory
";

    #[test]
    fn cgroup_mounts_are_read_with_their_controllers_and_roots() {
        let m = cgroup_mounts(MOUNTINFO);
        assert_eq!(m.len(), 4, "{m:?}");
        assert!(m[0].v2 && m[0].controllers.is_empty() && m[0].point == Path::new("/sys/fs/cgroup/unified"));
        assert!(!m[1].v2 && m[1].controllers.is_empty(), "name=systemd is no controller: {:?}", m[1]);
        assert_eq!(m[2].controllers, ["cpu", "cpuacct"]);
        assert_eq!(m[3].point, Path::new("/sys/fs/cgroup/my mem"));
        assert_eq!((m[3].root.as_str(), m[3].controllers.as_slice()), ("/docker/abc", &["memory".to_string()][..]));
    }

    /// The kernel's own ids (this kernel's BTF), and the io controller by
    /// its v1 name.
    #[test]
    fn a_controllers_subsystem_id_is_the_kernels() {
        assert_eq!(subsys_enumerator("blkio"), "io_cgrp_id");
        assert_eq!(subsys_enumerator("cpu"), "cpu_cgrp_id");
        let cpu = subsys_id("cpu").expect("cpu_cgrp_id in this kernel's BTF");
        let cpuset = subsys_id("cpuset").expect("cpuset_cgrp_id");
        assert_eq!((cpuset, cpu), (0, 1), "enum cgroup_subsys_id starts with cpuset, cpu");
        assert!(subsys_id("blkio").is_some() && subsys_id("nonesuch").is_none());
    }

    #[test]
    fn escapes_are_undone_and_bad_ones_kept() {
        assert_eq!(unescape("a\\040b\\011c"), "a b\tc");
        assert_eq!(unescape("x\\777\\04"), "x\\777\\04");
        assert_eq!(unescape("\\"), "\\");
    }

    /// The cgroups of this host (privileged tests run here and in CI): a
    /// group of the unified hierarchy and one of the cpu controller's, at
    /// the depth the kernel gives them.
    #[test]
    fn targets_resolve_on_this_host() {
        let name = format!("sonde-unit-cg-{}", std::process::id());
        for root in [cgroup2_root(), cpu_root()].into_iter().flatten() {
            let dir = Path::new(&root).join(&name).join("inner");
            std::fs::create_dir_all(&dir).unwrap();
            let t = CgroupTarget::resolve(dir.to_str().unwrap());
            let _ = std::fs::remove_dir(&dir);
            let _ = std::fs::remove_dir(dir.parent().unwrap());
            let t = t.unwrap();
            assert_eq!(t.level, Some(2), "{t:?}");
            assert_eq!(t.ssid.is_none(), Some(root.as_str()) == cgroup2_root().as_deref(), "{t:?}");
        }
    }
}
