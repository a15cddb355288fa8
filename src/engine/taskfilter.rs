//! `-p`, `--tid`, `--cgroup`, `--comm` as the task-sampling tools take them;
//! the kernel half is `src/bpf/taskfilter.h`.
use libbpf_rs::{MapCore, MapFlags};

use super::{cgroup::cgroup_id, error::usage};

/// Most processes `-p` takes (TF_MAX_PIDS).
pub const MAX_PIDS: usize = 64;
/// Most threads `--tid` takes (TF_MAX_TIDS).
pub const MAX_TIDS: usize = 16;

/// Validated task filters.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// Processes (tgids).
    pub pids: Vec<u32>,
    /// Threads.
    pub tids: Vec<u32>,
    /// cgroup v2 id, 0 for any.
    pub cgroup: u64,
    /// Thread name, up to 15 bytes.
    pub comm: Option<String>,
}

impl TaskFilter {
    /// Checks the filters as given on the command line (usage errors, exit 2).
    pub fn new(pids: &[u32], tids: &[u32], cgroup: Option<&str>, comm: Option<&str>) -> anyhow::Result<Self> {
        if pids.len() > MAX_PIDS {
            return Err(usage(format!("at most {MAX_PIDS} -p; use --cgroup for a group of processes")));
        }
        if tids.len() > MAX_TIDS {
            return Err(usage(format!("at most {MAX_TIDS} --tid; use -p for whole processes")));
        }
        for p in pids {
            if !super::pid_exists(*p) {
                return Err(usage(format!("-p {p}: no such process; check the pid with `pgrep`")));
            }
        }
        for t in tids {
            if !std::path::Path::new(&format!("/proc/{t}")).exists() {
                return Err(usage(format!("--tid {t}: no such thread; list threads with `ps -T -p PID`")));
            }
        }
        if let Some(c) = comm {
            if c.is_empty() || c.len() > 15 {
                return Err(usage(format!("--comm {c:?}: a thread name is 1 to 15 bytes (as in /proc/PID/comm)")));
            }
        }
        let cgroup = cgroup.map(cgroup_id).transpose()?.unwrap_or(0);
        Ok(TaskFilter { pids: pids.to_vec(), tids: tids.to_vec(), cgroup, comm: comm.map(str::to_string) })
    }

    /// Fills the `tf_pids` map of a loaded object.
    pub fn fill_pids(&self, map: &dyn MapCore) -> anyhow::Result<()> {
        for p in &self.pids {
            map.update(&p.to_ne_bytes(), &[1u8], MapFlags::ANY)?;
        }
        Ok(())
    }
}

/// Sets the `tf_*` read-only data of an open skeleton (`$ro`, the generated
/// rodata struct) from a [`TaskFilter`].
#[macro_export]
macro_rules! set_task_filter {
    ($ro:expr, $f:expr) => {{
        let (ro, f) = ($ro, $f);
        ro.tf_filter_pids = !f.pids.is_empty();
        ro.tf_n_tids = f.tids.len() as u32;
        for (i, t) in f.tids.iter().enumerate() {
            ro.tf_tids[i] = *t;
        }
        ro.tf_cgroup_id = f.cgroup;
        if let Some(c) = &f.comm {
            ro.tf_filter_comm = true;
            for (i, b) in c.bytes().enumerate() {
                ro.tf_comm[i] = b as _;
            }
        }
    }};
}
