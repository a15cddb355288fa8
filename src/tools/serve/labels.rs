//! Labels from a cgroup: its path, and where the path shows them, the
//! Kubernetes pod UID and container ID, with no API server and no runtime
//! socket (the kubelet's cgroup names carry both, under either driver).
//!
//! A cgroup v2 id is its directory's inode number, so an id the kernel
//! counted under is found by walking the hierarchy (bounded), and cached.
use std::{collections::HashMap, os::unix::fs::MetadataExt, path::Path};

/// A series' cgroup labels, as [`CgroupLabels::of`] returns them; series
/// are summed by these (a cgroup made again at the same path has a new id).
pub type LabelSet = Vec<(&'static str, String)>;

/// `base` labels followed by a cgroup label set, as a sample takes them.
pub fn with<'a>(base: &[(&'a str, &'a str)], l: &'a LabelSet) -> Vec<(&'a str, &'a str)> {
    base.iter().copied().chain(l.iter().map(|(k, v)| (*k, v.as_str()))).collect()
}

/// Label names, in the order [`CgroupLabels::of`] returns values.
pub const NAMES: [&str; 3] = ["cgroup", "pod_uid", "container_id"];

/// Directories walked per refresh at most, and how deep.
const MAX_DIRS: usize = 100_000;
const MAX_DEPTH: usize = 32;

/// id -> labels, refreshed by a walk when an id is not known yet.
pub struct CgroupLabels {
    root: Option<String>,
    known: HashMap<u64, [String; 3]>,
    /// Walks done (one at most per scrape that met an unknown id).
    pub walks: u64,
    walked_this_scrape: bool,
}

impl Default for CgroupLabels {
    fn default() -> Self {
        Self { root: crate::engine::cgroup::cgroup2_root(), known: HashMap::new(), walks: 0, walked_this_scrape: false }
    }
}

impl CgroupLabels {
    /// Call at the start of each scrape: allows one walk.
    pub fn new_scrape(&mut self) {
        self.walked_this_scrape = false;
    }

    /// The labels of cgroup `id` (0, or an id gone before it was seen: the
    /// cgroup label says so and the others are empty).
    pub fn of(&mut self, id: u64) -> LabelSet {
        let v = if id == 0 {
            ["unknown".to_string(), String::new(), String::new()]
        } else {
            if !self.known.contains_key(&id) && !self.walked_this_scrape {
                self.walk();
            }
            self.known.get(&id).cloned().unwrap_or_else(|| [format!("id:{id}"), String::new(), String::new()])
        };
        NAMES.iter().copied().zip(v).collect()
    }

    fn walk(&mut self) {
        self.walked_this_scrape = true;
        self.walks += 1;
        let Some(root) = self.root.clone() else { return };
        let mut stack = vec![(std::path::PathBuf::from(&root), 0usize)];
        let mut seen = 0usize;
        while let Some((dir, depth)) = stack.pop() {
            seen += 1;
            if seen > MAX_DIRS {
                break;
            }
            // symlink_metadata: cgroupfs has no links, and none is followed.
            let Ok(md) = std::fs::symlink_metadata(&dir) else { continue };
            if !md.is_dir() {
                continue;
            }
            let rel = dir.strip_prefix(&root).map(|p| format!("/{}", p.display())).unwrap_or_default();
            self.known.entry(md.ino()).or_insert_with(|| {
                let (pod, ctr) = kubernetes(&rel);
                [rel.clone(), pod, ctr]
            });
            if depth >= MAX_DEPTH {
                continue;
            }
            let Ok(rd) = std::fs::read_dir(&dir) else { continue };
            for ent in rd.flatten() {
                if ent.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((ent.path(), depth + 1));
                }
            }
        }
    }
}

/// (pod UID, container ID) from a kubelet cgroup path, empty where absent.
/// systemd driver: `.../kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
/// (also `crio-`, `docker-`); cgroupfs driver: `.../kubepods/burstable/pod<uid>/<id>`.
pub fn kubernetes(path: &str) -> (String, String) {
    let mut pod = String::new();
    let mut ctr = String::new();
    let parts: Vec<&str> = Path::new(path).iter().filter_map(|c| c.to_str()).filter(|c| *c != "/").collect();
    // Only the kubelet's top-level hierarchy: a delegated subtree elsewhere
    // (user@UID.service/...) must not pass for a pod.
    let in_kubepods = parts.first().is_some_and(|p| p.starts_with("kubepods"));
    if !in_kubepods {
        return (pod, ctr);
    }
    for (i, p) in parts.iter().enumerate() {
        if let Some(rest) = p.strip_suffix(".slice").and_then(|s| s.rsplit_once("-pod")).map(|(_, u)| u) {
            if is_uid(&rest.replace('_', "-")) {
                pod = rest.replace('_', "-");
            }
        } else if let Some(u) = p.strip_prefix("pod") {
            if is_uid(u) {
                pod = u.to_string();
            }
        } else if let Some(scope) = p.strip_suffix(".scope") {
            for (prefix, runtime) in [("cri-containerd-", "containerd"), ("crio-", "cri-o"), ("docker-", "docker")] {
                if let Some(id) = scope.strip_prefix(prefix) {
                    if is_hex_id(id) {
                        ctr = format!("{runtime}://{id}");
                    }
                }
            }
        } else if !pod.is_empty() && i + 1 == parts.len() && is_hex_id(p) {
            ctr = p.to_string();
        }
    }
    (pod, ctr)
}

fn is_uid(s: &str) -> bool {
    s.len() == 36 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-') && s.matches('-').count() == 4
}

fn is_hex_id(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1b2c3d4e-0000-4a5b-8c9d-0123456789ab";
    const ID: &str = "4f0a1e2d3c4b5a6978896a5b4c3d2e1f00112233445566778899aabbccddeeff";

    #[test]
    fn kubelet_paths_under_both_drivers_give_pod_and_container() {
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        );
        assert_eq!(kubernetes(&systemd), (UID.to_string(), format!("containerd://{ID}")));
        let crio = format!("/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope", UID.replace('-', "_"));
        assert_eq!(kubernetes(&crio), (UID.to_string(), format!("cri-o://{ID}")));
        let cgroupfs = format!("/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(kubernetes(&cgroupfs), (UID.to_string(), ID.to_string()));
        // Not under kubepods, or malformed: nothing.
        assert_eq!(kubernetes("/system.slice/sshd.service"), (String::new(), String::new()));
        assert_eq!(kubernetes("/kubepods/podnot-a-uid/xyz"), (String::new(), String::new()));
        // A look-alike inside a delegated user subtree is no pod.
        let spoof = format!("/user.slice/user-1000.slice/user@1000.service/{}", &systemd[1..]);
        assert_eq!(kubernetes(&spoof), (String::new(), String::new()));
    }
}
