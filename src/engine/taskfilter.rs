//! `-p`, `--tid`, `--cgroup`, `--comm` as the task-sampling tools take them;
//! the kernel half is `src/bpf/taskfilter.h`.
use libbpf_rs::{MapCore, MapFlags};

use super::{cgroup::CgroupTarget, error::usage, launch::Launched};

/// Most processes `-p` takes (TF_MAX_PIDS).
pub const TASK_MAX_PIDS: usize = 64;
/// Most threads `--tid` takes (TF_MAX_TIDS).
pub const TASK_MAX_TIDS: usize = 16;
/// Processes a run that follows a command's children holds (`tf_pids`).
pub const FOLLOW_MAX_PIDS: u32 = 16384;

/// `-p`, `--tid`, `--cgroup`, `--comm` as every task-sampling tool takes them
/// (flattened into profile, offcpu and wakeup).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TaskArgs {
    /// Only this process and all its threads (repeatable, up to 64).
    #[arg(short = 'p', long = "pid")]
    pub pid: Vec<u32>,
    /// Only this thread (repeatable, up to 16).
    #[arg(long)]
    pub tid: Vec<u32>,
    /// Only tasks in this cgroup or below it: a cgroup v2 directory, or a
    /// cgroup v1 controller's (/sys/fs/cgroup/cpu/...).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Only threads with this name (as in /proc/PID/comm, up to 15 bytes).
    #[arg(long)]
    pub comm: Option<String>,
    /// Start this command and watch it and the processes it starts, from
    /// their first instruction; the run ends when they have all exited
    /// (give it last, after `--`: `-- make -j8`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl TaskArgs {
    /// Checks the filters (usage errors, exit 2) and resolves the cgroup.
    pub fn validate(&self) -> anyhow::Result<TaskFilter> {
        if !self.command.is_empty() && (!self.pid.is_empty() || !self.tid.is_empty()) {
            return Err(usage("-- CMD watches the command it starts: give it without -p or --tid"));
        }
        TaskFilter::new(&self.pid, &self.tid, self.cgroup.as_deref(), self.comm.as_deref())
    }

    /// Starts `-- CMD` ([`launch`]).
    pub fn launch(&self, tf: &mut TaskFilter) -> anyhow::Result<Option<Launched>> {
        launch(&self.command, tf)
    }
}

/// Starts `command` (`-- CMD`; none when empty), held before its exec
/// ([`Launched::release`]), and makes `tf` watch it and the processes it
/// starts.
pub fn launch(command: &[String], tf: &mut TaskFilter) -> anyhow::Result<Option<Launched>> {
    if command.is_empty() {
        return Ok(None);
    }
    let l = super::launch::spawn(command)?;
    tf.pids = vec![l.pid];
    tf.follow = true;
    Ok(Some(l))
}

/// The processes a run watches, to end it when they have all exited: the
/// command it started, the processes of -p, and those the kernel half
/// followed into (their children).
#[derive(Debug, Default)]
pub struct Targets {
    pids: Vec<u32>,
    /// The command the run started.
    pub launched: Option<Launched>,
}

impl Targets {
    /// The targets of `tf` (none: a run over every process, ended by -d or
    /// a signal only) and the command started.
    pub fn new(tf: &TaskFilter, launched: Option<Launched>) -> Targets {
        Targets { pids: tf.pids.clone(), launched }
    }

    /// Whether every target has exited: the command reaped, and no process
    /// of `tf_pids` (-p's and those followed into) alive.
    pub fn all_gone(&mut self, tf_pids: &dyn MapCore) -> bool {
        if self.pids.is_empty() {
            return false;
        }
        if let Some(l) = &mut self.launched {
            if !l.reap(false) {
                return false;
            }
        }
        let followed = tf_pids.keys().filter(|k| k.len() == 4).map(|k| u32::from_ne_bytes(k[..4].try_into().unwrap()));
        !self.pids.iter().copied().chain(followed).any(super::process_alive)
    }
}

/// Validated task filters.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// Processes (tgids).
    pub pids: Vec<u32>,
    /// Threads.
    pub tids: Vec<u32>,
    /// `--cgroup`: tasks in this cgroup or below it.
    pub cgroup: Option<CgroupTarget>,
    /// Thread name, up to 15 bytes.
    pub comm: Option<String>,
    /// Whether the kernel half adds the processes they start to `pids`.
    pub follow: bool,
}

impl TaskFilter {
    /// Checks the filters as given on the command line (usage errors, exit 2).
    pub fn new(pids: &[u32], tids: &[u32], cgroup: Option<&str>, comm: Option<&str>) -> anyhow::Result<Self> {
        if pids.len() > TASK_MAX_PIDS {
            return Err(usage(format!("at most {TASK_MAX_PIDS} -p; use --cgroup for a group of processes")));
        }
        if tids.len() > TASK_MAX_TIDS {
            return Err(usage(format!("at most {TASK_MAX_TIDS} --tid; use -p for whole processes")));
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
        let cgroup = cgroup.map(CgroupTarget::resolve).transpose()?;
        Ok(TaskFilter {
            pids: pids.to_vec(),
            tids: tids.to_vec(),
            cgroup,
            comm: comm.map(str::to_string),
            follow: false,
        })
    }

    /// The processes these filters select now, or None when they select
    /// every process (no -p, --tid, --cgroup or --comm). A process matches
    /// every filter given, as in the kernel half.
    pub fn processes_now(&self) -> Option<Vec<u32>> {
        // A command started: held before its exec, it runs nothing to load yet.
        if self.follow {
            return Some(Vec::new());
        }
        if self.pids.is_empty() && self.tids.is_empty() && self.cgroup.is_none() && self.comm.is_none() {
            return None;
        }
        let tgid_of = |tid: u32| -> Option<u32> {
            let s = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
            s.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok())
        };
        // The group's processes: one walk of its tree serves both uses.
        let in_group = self.cgroup.as_ref().map(|cg| cg.processes());
        let mut v: Vec<u32> = if !self.pids.is_empty() {
            self.pids.clone()
        } else if !self.tids.is_empty() {
            self.tids.iter().filter_map(|t| tgid_of(*t)).collect()
        } else if let Some(procs) = &in_group {
            procs.iter().copied().collect()
        } else {
            all_pids()
        };
        if let Some(procs) = &in_group {
            v.retain(|p| procs.contains(p));
        }
        if let Some(c) = &self.comm {
            v.retain(|p| {
                std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten().any(|t| {
                    std::fs::read_to_string(t.path().join("comm")).is_ok_and(|s| s.trim_end_matches('\n') == c)
                })
            });
        }
        v.sort_unstable();
        v.dedup();
        Some(v)
    }
}

/// Every process now (the numeric entries of /proc).
fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

impl TaskFilter {
    /// Fills the `tf_pids` map of a loaded object.
    pub fn fill_pids(&self, map: &dyn MapCore) -> anyhow::Result<()> {
        for p in &self.pids {
            map.update(&p.to_ne_bytes(), &[1u8], MapFlags::ANY)?;
        }
        Ok(())
    }
}

/// Sizes `tf_pids` of an open skeleton (`$open`) for a run that follows a
/// command's children, and tells the kernel half to ([`TaskFilter::follow`]).
#[macro_export]
macro_rules! set_task_follow {
    ($open:expr, $f:expr) => {{
        let (open, f) = ($open, $f);
        if f.follow {
            open.maps.tf_pids.set_max_entries($crate::engine::taskfilter::FOLLOW_MAX_PIDS)?;
        }
        open.maps.rodata_data.as_deref_mut().expect("rodata present").tf_follow = f.follow;
        open.progs.tf_fork.set_autoload(f.follow);
    }};
}

/// Sets the `tf_*` read-only data of an open skeleton (`$ro`, the generated
/// rodata struct) from a [`TaskFilter`].
#[macro_export]
macro_rules! set_task_filter {
    ($ro:expr, $f:expr) => {{
        let (ro, f) = ($ro, $f);
        ro.tf_filter_pids = !f.pids.is_empty();
        // A fixed set that fits: inline, compared without a map lookup.
        if !f.follow && f.pids.len() <= ro.tf_pid_list.len() {
            ro.tf_n_pids = f.pids.len() as u32;
            for (i, p) in f.pids.iter().enumerate() {
                ro.tf_pid_list[i] = *p;
            }
        }
        ro.tf_n_tids = f.tids.len() as u32;
        for (i, t) in f.tids.iter().enumerate() {
            ro.tf_tids[i] = *t;
        }
        $crate::set_cgroup_filter!(&mut *ro, f.cgroup.as_ref());
        if let Some(c) = &f.comm {
            ro.tf_filter_comm = true;
            for (i, b) in c.bytes().enumerate() {
                ro.tf_comm[i] = b as _;
            }
        }
    }};
}

/// Sets the `cg_filter_*` read-only data (`src/bpf/cgroupfilter.h`) of an
/// open skeleton (`$ro`) from an `Option<&CgroupTarget>`.
#[macro_export]
macro_rules! set_cgroup_filter {
    ($ro:expr, $cg:expr) => {{
        let (ro, cg): (_, Option<&$crate::engine::cgroup::CgroupTarget>) = ($ro, $cg);
        if let Some(cg) = cg {
            ro.cg_filter_id = cg.id;
            ro.cg_filter_level = cg.level.unwrap_or(u32::MAX);
            ro.cg_filter_ssid = cg.ssid.map_or(-1, |s| s as i32);
        }
    }};
}
