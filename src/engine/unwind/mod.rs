//! User stacks without frame pointers: unwind tables built in user space
//! from each executable's call-frame information, loaded into BPF maps, and
//! walked in the kernel by `src/bpf/unwind.h` at every sample.
//!
//! - [`elf`] reads an executable's segments, build ID and unwind sections;
//! - [`table`] reduces its CFI to compact rows;
//! - [`cache`] keeps built tables on disk by build ID;
//! - [`kernel`] lays tables out in the kernel's maps and tells the walk which
//!   executable each process has mapped where.
pub mod cache;
pub mod elf;
pub mod kernel;
pub mod table;

use thiserror::Error;

/// Why an executable has no table.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum UnwindError {
    /// Not an ELF file of an architecture the walk knows (x86-64, AArch64),
    /// or not of this host's.
    #[error("not an x86-64 or AArch64 ELF file of this host: {0}")]
    NotElf(String),
    /// No `.eh_frame` and no `.debug_frame`.
    #[error("no .eh_frame or .debug_frame")]
    NoUnwindInfo,
    /// A header or section could not be parsed.
    #[error("malformed: {0}")]
    Malformed(String),
    /// Over a size bound.
    #[error("too big: {0}")]
    TooBig(String),
    /// Could not be read.
    #[error("unreadable: {0}")]
    Io(String),
}

use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use libbpf_rs::{MapCore, MapFlags};

use super::{
    error::env,
    process::Process,
    record::percpu_sum,
    runtime::{Frames, RtMaps, Runtimes},
    taskfilter::TaskFilter,
};

/// How user stacks are walked (`--unwind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnwindMode {
    /// Unwind tables where an executable has them, frame pointers elsewhere;
    /// frame pointers only when this kernel cannot walk tables.
    #[default]
    Auto,
    /// Frame pointers only (the kernel's own walk): cheapest; stacks through
    /// code built without frame pointers are cut short.
    Fp,
    /// As auto, but refuse to run when this kernel cannot walk tables.
    Dwarf,
}

/// `--unwind`, shared by the stack tools.
#[derive(Debug, Clone, Args, Default)]
pub struct UnwindArgs {
    /// How to walk user stacks: auto (unwind tables from each executable's
    /// .eh_frame where it has one, frame pointers elsewhere), fp (frame
    /// pointers only), dwarf (as auto, but exit 2 when this kernel cannot).
    #[arg(long, value_enum, default_value_t = UnwindMode::Auto)]
    pub unwind: UnwindMode,
    /// What stacks show of language runtimes (Python, Go, Java, Node.js; see
    /// the README's "Language frames"): mixed (each interpreter-loop or JIT
    /// frame replaced by the functions it ran, native callers kept), lang
    /// (only those functions), native (the runtime's own frames, nothing
    /// read of the runtime).
    /// Needs the table walk (Linux 5.15+).
    #[arg(long, value_enum, default_value_t = Frames::Mixed)]
    pub frames: Frames,
}

/// Whether this kernel can run the walk (`unwind.h`): the helpers it calls
/// from sampling and tracing programs. `Err` names what is missing.
pub fn kernel_can_walk() -> Result<(), String> {
    if table::Arch::host().is_none() {
        return Err(format!(
            "the table walk knows x86-64's and AArch64's unwind rules only; this {} build follows frame pointers",
            std::env::consts::ARCH
        ));
    }
    for (f, name, since) in [
        (libbpf_sys::BPF_FUNC_get_current_task_btf, "bpf_get_current_task_btf", "5.11"),
        (libbpf_sys::BPF_FUNC_task_pt_regs, "bpf_task_pt_regs", "5.15"),
    ] {
        if !crate::engine::features::has_helper(libbpf_sys::BPF_PROG_TYPE_PERF_EVENT, f) {
            return Err(format!("this kernel has no {name} helper (Linux {since}+)"));
        }
    }
    Ok(())
}

/// The bits of a user return address that are its address, for the walk
/// (`unw_ra_mask`). On AArch64 with pointer authentication a signed return
/// address carries its code in the bits above the address space (bits
/// 48-54 with 48-bit addresses, 52-54 with 52-bit ones): `xpaclri` strips
/// them as the running kernel set up user address spaces, so the mask is
/// what it leaves of an all-ones user address. Without pointer
/// authentication `xpaclri` does nothing and the mask keeps every bit below
/// the top byte; on x86-64 it keeps every bit.
pub fn return_address_mask() -> u64 {
    #[cfg(target_arch = "aarch64")]
    {
        let probe: u64 = (1 << 55) - 1; // bit 55 clear: a user address
        let out: u64;
        // SAFETY: `hint #7` is xpaclri (a no-op on CPUs without pointer
        // authentication); it reads and writes x30 only, declared clobbered.
        unsafe {
            std::arch::asm!(
                "mov x30, {p}",
                "hint #7",
                "mov {o}, x30",
                p = in(reg) probe,
                o = lateout(reg) out,
                out("x30") _,
                options(nomem, nostack, preserves_flags),
            );
        }
        user_address_mask(out)
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        u64::MAX
    }
}

/// The mask from what stripping an all-ones user address (bits 0-54) left:
/// its low bits up to the first one cleared.
pub fn user_address_mask(stripped: u64) -> u64 {
    (1u64 << stripped.trailing_ones().min(55)) - 1
}

/// What a run does about user stacks, decided before its programs load.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Whether tables are walked (unw_mode = 1).
    pub tables: bool,
    /// The mode asked for.
    pub asked: UnwindMode,
    /// Why tables are not walked in auto mode, if they are not.
    pub fallback: Option<String>,
    /// `--frames`.
    pub frames: Frames,
}

impl Plan {
    /// Frame pointers only (for programs that take no user stacks).
    pub fn fp() -> Plan {
        Plan { tables: false, asked: UnwindMode::Fp, fallback: None, frames: Frames::Native }
    }

    /// Decides from `--unwind` and the kernel; `--unwind dwarf` on a kernel
    /// that cannot walk tables is an environment error (exit 2).
    pub fn new(a: &UnwindArgs) -> anyhow::Result<Plan> {
        match a.unwind {
            UnwindMode::Fp => Ok(Plan { tables: false, asked: a.unwind, fallback: None, frames: a.frames }),
            m => match kernel_can_walk() {
                Ok(()) => Ok(Plan { tables: true, asked: m, fallback: None, frames: a.frames }),
                Err(why) if m == UnwindMode::Dwarf => Err(env(format!(
                    "--unwind dwarf: {why}, so user stacks cannot be walked from unwind tables; use --unwind fp"
                ))),
                Err(why) => Ok(Plan { tables: false, asked: m, fallback: Some(why), frames: a.frames }),
            },
        }
    }

    /// Pages of code the page index holds: 4 GiB of text for runs with
    /// targets, 16 GiB system-wide (8 bytes each).
    pub fn pages(&self, targeted: bool) -> u32 {
        match (self.tables, targeted) {
            (false, _) => 1,
            (true, true) => 1 << 16,
            (true, false) => 1 << 18,
        }
    }
}

/// Processes the walk can hold tables for at once (`unw_procs`).
pub const MAX_PROCS: u32 = 8192;
/// Distinct walked user stacks kept (`unw_walked`, 1 KiB each, allocated as
/// used).
pub const MAX_WALKED: u32 = 32768;

/// Sets the unwinder's read-only data and map sizes of an open skeleton:
/// `$open` is the `Open*Skel`, `$plan` a [`Plan`], `$targeted` whether the
/// run has task filters. Without tables every unwinder map has one entry.
#[macro_export]
macro_rules! set_unwind {
    ($open:expr, $plan:expr, $targeted:expr) => {{
        let (open, plan) = ($open, $plan);
        let rodata = open.maps.rodata_data.as_deref_mut().expect("rodata present");
        rodata.unw_mode = plan.tables as u32;
        rodata.unw_ra_mask = $crate::engine::unwind::return_address_mask();
        open.maps.unw_pages.set_max_entries(plan.pages($targeted))?;
        open.progs.unw_exec.set_autoload(plan.tables);
        if plan.tables {
            let np = libbpf_sys::BPF_F_NO_PREALLOC;
            open.maps.unw_procs.set_max_entries($crate::engine::unwind::MAX_PROCS)?;
            open.maps.unw_procs.set_map_flags(np)?;
            open.maps.unw_walked.set_max_entries($crate::engine::unwind::MAX_WALKED)?;
            open.maps.unw_walked.set_map_flags(np)?;
        } else {
            open.maps.unw_need.set_max_entries(1)?;
            open.maps.unw_chunks.set_max_entries(1)?;
        }
        $crate::set_runtimes!(open, plan);
    }};
}

/// The unwinder's maps in a loaded object.
pub struct UnwMaps<'a> {
    /// `unw_procs`.
    pub procs: &'a dyn MapCore,
    /// `unw_pages`.
    pub pages: &'a dyn MapCore,
    /// `unw_chunks`.
    pub chunks: &'a dyn MapCore,
    /// `unw_need`.
    pub need: &'a dyn MapCore,
    /// `unw_stats`.
    pub stats: &'a dyn MapCore,
    /// `unw_walked`.
    pub walked: &'a dyn MapCore,
    /// The language runtimes' maps (`runtime.h`).
    pub rt: RtMaps<'a>,
    /// `rt_walked`.
    pub rt_walked: &'a dyn MapCore,
    /// `unw_wake`: a pid per process that asked for its tables.
    pub wake: &'a dyn MapCore,
}

/// The [`UnwMaps`] of a loaded skeleton `$skel`.
#[macro_export]
macro_rules! unw_maps {
    ($skel:expr) => {{
        let m = &$skel.maps;
        $crate::engine::unwind::UnwMaps {
            procs: &m.unw_procs,
            pages: &m.unw_pages,
            chunks: &m.unw_chunks,
            need: &m.unw_need,
            stats: &m.unw_stats,
            walked: &m.unw_walked,
            rt: $crate::engine::runtime::RtMaps { procs: &m.rt_procs, seen: &m.rt_seen, stats: &m.rt_stats },
            rt_walked: &m.rt_walked,
            wake: &m.unw_wake,
        }
    }};
}

/// The walk's counters (`enum unw_stat`).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct WalkCounts {
    /// User stacks taken by frame pointers (the kernel's walk).
    pub frame_pointer_stacks: u64,
    /// ... of which while the process's tables were loading.
    pub while_loading: u64,
    /// ... of which because a walk was running on the CPU.
    pub nested: u64,
    /// Walked with tables for every frame.
    pub tables: u64,
    /// Walked with tables and frame pointers.
    pub mixed: u64,
    /// Walked with frame pointers only (no frame had a table).
    pub fp_walked: u64,
    /// Walked but not stored (the walked-stack map was full).
    pub store_full: u64,
    /// Walks that reached the program's start (or a frame-pointer chain's end).
    pub complete: u64,
    /// Walks cut short, by reason.
    pub cut: CutReasons,
}

/// Why walks were cut short (`enum unw_end` after the first two).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct CutReasons {
    /// STK_MAX_DEPTH frames.
    pub depth: u64,
    /// Reading the stack failed.
    pub bad_read: u64,
    /// A frame without a table and without a usable frame pointer.
    pub no_table: u64,
    /// A gap in a table (code without CFI) without a usable frame pointer.
    pub table_gap: u64,
    /// A rule the walk does not evaluate.
    pub unsupported: u64,
    /// The stack pointer did not move up.
    pub no_progress: u64,
}

impl CutReasons {
    /// The reason of `enum unw_end` value `end`, or None for a complete walk.
    pub fn name(end: u8) -> Option<&'static str> {
        Some(match end {
            2 => "depth",
            3 => "bad_read",
            4 => "no_table",
            5 => "table_gap",
            6 => "unsupported",
            7 => "no_progress",
            _ => return None,
        })
    }
}

/// `enum unw_end`.
pub const END_ROOT: u8 = 0;
/// A frame-pointer step found the chain's end.
pub const END_FP_CHAIN: u8 = 1;

impl WalkCounts {
    /// Reads `unw_stats`.
    pub fn read(stats: &dyn MapCore) -> anyhow::Result<WalkCounts> {
        let s = |i: u32| percpu_sum(stats, i);
        const END: u32 = 7;
        Ok(WalkCounts {
            frame_pointer_stacks: s(0)?,
            while_loading: s(1)?,
            nested: s(2)?,
            tables: s(3)?,
            mixed: s(4)?,
            fp_walked: s(5)?,
            store_full: s(6)?,
            complete: s(END)? + s(END + 1)?,
            cut: CutReasons {
                depth: s(END + 2)?,
                bad_read: s(END + 3)?,
                no_table: s(END + 4)?,
                table_gap: s(END + 5)?,
                unsupported: s(END + 6)?,
                no_progress: s(END + 7)?,
            },
        })
    }

    /// Walks cut short.
    pub fn cut_total(&self) -> u64 {
        let c = &self.cut;
        c.depth + c.bad_read + c.no_table + c.table_gap + c.unsupported + c.no_progress
    }
}

/// What a run did about user stacks, for its summary.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// `--unwind` as asked.
    pub mode: UnwindMode,
    /// Whether tables were walked.
    pub tables: bool,
    /// Why not, in auto mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The walk's counts.
    pub walks: WalkCounts,
    /// Table loading.
    pub table_stats: kernel::TableStats,
    /// Language runtimes (in the summary as `language_frames`).
    #[serde(skip)]
    pub runtimes: super::runtime::Report,
}

impl Report {
    /// The summary's text lines.
    pub fn text(&self) -> String {
        let w = &self.walks;
        if !self.tables {
            let why = match (&self.fallback, self.mode) {
                (Some(f), _) => format!("frame pointers ({f})"),
                _ => "frame pointers (--unwind fp)".to_string(),
            };
            return format!("user stacks: {why}: {} stacks", w.frame_pointer_stacks);
        }
        let t = &self.table_stats;
        let cut: Vec<String> = [
            ("depth", w.cut.depth),
            ("bad read", w.cut.bad_read),
            ("no table", w.cut.no_table),
            ("table gap", w.cut.table_gap),
            ("unsupported rule", w.cut.unsupported),
            ("no progress", w.cut.no_progress),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
        let mut s = format!(
            "user stacks walked: {} by tables, {} mixed, {} by frame pointers; {} complete, {} cut short{}; {} by the kernel's frame-pointer walk ({} while tables loaded, {} nested)",
            w.tables,
            w.mixed,
            w.fp_walked,
            w.complete,
            w.cut_total(),
            if cut.is_empty() { String::new() } else { format!(" ({})", cut.join(", ")) },
            w.frame_pointer_stacks,
            w.while_loading,
            w.nested,
        );
        s.push_str(&format!(
            "\nunwind tables: {} executables of {} processes, {} rows from {:.1} MB of CFI, {} built, {} from cache, {:.0} ms; kernel memory {:.1} MiB (charged to sonde's cgroup; the row chunks, mapped to fill them, also count in its RSS)",
            t.executables,
            t.processes,
            t.rows,
            t.cfi_bytes as f64 / 1e6,
            t.built,
            t.cache_hits,
            t.load_time.as_secs_f64() * 1e3,
            t.kernel_bytes as f64 / (1 << 20) as f64,
        ));
        if t.unloaded > 0 {
            s.push_str(&format!(
                "; {} unloaded once no process mapped them ({} chunks freed)",
                t.unloaded, t.chunks_dropped
            ));
        }
        if !t.without_table.is_empty() {
            let mut v: Vec<String> = t.without_table.iter().map(|(k, n)| format!("{n} {k}")).collect();
            v.sort();
            s.push_str(&format!("; without a table (frame pointers there): {}", v.join(", ")));
        }
        if let Some(d) = &t.cache_disabled {
            s.push_str(&format!("; no disk cache: {d}"));
        }
        if w.store_full + t.procs_full + t.budget_full + t.maps_dropped > 0 {
            s.push_str(&format!(
                "\nunwind limits hit: {} stacks not stored, {} processes and {} tables not loaded, {} mappings left out",
                w.store_full, t.procs_full, t.budget_full, t.maps_dropped
            ));
        }
        s
    }
}

/// The unwinder of a run: loads tables before sampling for targeted runs,
/// and as processes show up for system-wide ones.
pub struct Session {
    plan: Plan,
    tables: Option<kernel::Tables>,
    last_sweep: Instant,
    runtimes: Runtimes,
    /// Per process, which image it runs: how often it exec'd since the run
    /// met it (stacks walked carry it, to be named from that image).
    gens: std::collections::HashMap<u32, u32>,
    /// Set by `unw_wake`'s records: a process asked for its tables.
    woken: std::rc::Rc<std::cell::Cell<bool>>,
    /// When the last load ran.
    last_tick: Instant,
}

/// What one [`Session::tick`] loaded.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Processes that exec'd since they were loaded: a new image.
    pub execs: Vec<u32>,
    /// Processes whose executable mappings were read (first seen, or
    /// changed since: a library loaded). A process that exits soon after is
    /// named from what was read here.
    pub loaded: Vec<u32>,
}

/// Least time between loads that `unw_wake` asks for (a process that
/// cannot be loaded asks again at its next sample).
const WAKE_GAP: Duration = Duration::from_millis(5);

impl Session {
    /// Starts the unwinder on a loaded object: with tables, loads those of
    /// the processes `tf` selects now (before anything is attached, so their
    /// first samples are walked).
    pub fn start(plan: &Plan, m: &UnwMaps<'_>, tf: &TaskFilter) -> Session {
        let frames = if plan.tables { plan.frames } else { Frames::Native };
        let mut s = Session {
            plan: plan.clone(),
            tables: None,
            last_sweep: Instant::now(),
            runtimes: Runtimes::new(frames),
            gens: Default::default(),
            woken: Default::default(),
            last_tick: Instant::now(),
        };
        if !plan.tables {
            return s;
        }
        let mut t = kernel::Tables::new(m.pages.max_entries());
        let km = kernel::Maps { procs: m.procs, pages: m.pages, chunks: m.chunks };
        for pid in tf.processes_now().unwrap_or_default() {
            if let Some(mut p) = Process::read(pid) {
                t.load_process(&km, &p, false, 0);
                s.runtimes.on_load(&m.rt, &mut p);
            }
        }
        s.tables = Some(t);
        s
    }

    /// Which image `pid` runs: how often it exec'd since the run met it.
    pub fn generation(&self, pid: u32) -> u32 {
        self.gens.get(&pid).copied().unwrap_or(0)
    }

    /// Adds `unw_wake` (`wake`, of [`UnwMaps`]) to a tool's ring buffer, so
    /// that a process asking for its tables wakes the run's poll
    /// ([`Session::due`]).
    pub fn wake_on<'a>(
        &self,
        rb: &mut libbpf_rs::RingBufferBuilder<'a, 'a>,
        wake: &'a dyn MapCore,
    ) -> anyhow::Result<()> {
        if self.tables.is_some() {
            let w = self.woken.clone();
            rb.add(wake, move |_: &[u8]| {
                w.set(true);
                0
            })?;
        }
        Ok(())
    }

    /// A ring buffer of `unw_wake` alone, for a tool that has none of its
    /// own ([`Session::wake_on`]); None without tables.
    pub fn wake_ring<'a>(&self, wake: &'a dyn MapCore) -> anyhow::Result<Option<libbpf_rs::RingBuffer<'a>>> {
        if self.tables.is_none() {
            return Ok(None);
        }
        let mut b = libbpf_rs::RingBufferBuilder::new();
        self.wake_on(&mut b, wake)?;
        Ok(Some(b.build()?))
    }

    /// Whether a load is due now: a process asked (`unw_wake`) and the last
    /// load is [`WAKE_GAP`] old, or a starting runtime is due another look.
    pub fn due(&self) -> bool {
        self.next_look().is_some_and(|t| t <= Instant::now())
    }

    /// Loads what the walk asked for since the last call; forgets exited
    /// processes every few seconds. Returns the processes that exec'd (a
    /// new image: new tables, their runtime looked for again) and those
    /// whose executable mappings were (re)loaded.
    pub fn tick(&mut self, m: &UnwMaps<'_>) -> Loaded {
        self.woken.set(false);
        self.last_tick = Instant::now();
        let mut execs = Vec::new();
        let mut loaded = Vec::new();
        let Some(t) = &mut self.tables else { return Loaded { execs, loaded } };
        let km = kernel::Maps { procs: m.procs, pages: m.pages, chunks: m.chunks };
        let asked: Vec<(u32, u32)> = m
            .need
            .keys()
            .filter(|k| k.len() == 4)
            .map(|k| {
                let pid = u32::from_ne_bytes(k[..4].try_into().unwrap());
                let v = m
                    .need
                    .lookup(&k, MapFlags::ANY)
                    .ok()
                    .flatten()
                    .map(|v| u32::from_ne_bytes(v[..4].try_into().unwrap()))
                    .unwrap_or(1);
                (pid, v)
            })
            .collect();
        let built = t.stats.built + t.stats.cache_hits;
        for (pid, what) in asked {
            // 1: no entry (new, or deleted by an exec): load afresh (the
            // record of an earlier image is replaced); 2: refresh. One look
            // at the process's mappings serves the tables and the runtimes.
            // A refresh not due yet keeps its entry: the walk asks (and
            // wakes the poll) again only once it is done.
            if what == 2 && !t.refresh_due(pid) {
                continue;
            }
            let _ = m.need.delete(&pid.to_ne_bytes());
            // Asked afresh for a process loaded before: its entry went with
            // an exec (unw_exec).
            if what == 1 && t.has(pid) {
                *self.gens.entry(pid).or_default() += 1;
                self.runtimes.forget(&m.rt, pid);
                execs.push(pid);
            }
            let Some(mut p) = Process::read(pid) else { continue };
            if t.load_process(&km, &p, what == 2, self.gens.get(&pid).copied().unwrap_or(0)) {
                loaded.push(pid);
            }
            self.runtimes.on_load(&m.rt, &mut p);
        }
        self.runtimes.drain(&m.rt);
        if t.stats.built + t.stats.cache_hits != built {
            // Building a table allocates ~16 bytes per row for a moment (a
            // large library: ~100 MB), all freed once the rows are in the
            // kernel's maps; glibc keeps freed memory, so a long run that
            // meets new executables grew by each build's peak (the 30-minute
            // soak of wakeup: +26 MiB). Give it back.
            // SAFETY: malloc_trim only releases free heap memory.
            unsafe { libc::malloc_trim(0) };
        }
        if self.last_sweep.elapsed() > Duration::from_secs(2) {
            self.last_sweep = Instant::now();
            t.forget_gone(&km);
            self.runtimes.sweep(&m.rt);
        }
        Loaded { execs, loaded }
    }

    /// When the next load is due: [`WAKE_GAP`] after the last one when a
    /// process asked, or when a runtime that was starting is to be looked at
    /// again. The loop wakes for it, so that a process that just started or
    /// exec'd is loaded, and its interpreter read, within milliseconds, not
    /// at the next periodic look: a call it makes at once has its frames.
    pub fn next_look(&self) -> Option<Instant> {
        let asked = self.woken.get().then(|| self.last_tick + WAKE_GAP);
        [asked, self.runtimes.next_look()].into_iter().flatten().min()
    }

    /// What stacks show of language runtimes (`--frames`, `native` when
    /// tables are not walked).
    pub fn frames(&self) -> Frames {
        if self.plan.tables {
            self.plan.frames
        } else {
            Frames::Native
        }
    }

    /// Whether tables are walked.
    pub fn tables(&self) -> bool {
        self.plan.tables
    }

    /// Names the code objects the kernel handed over since the last tick
    /// (call once more when the run stops, before the processes may exit),
    /// and gives them, with the `--frames` view, to the symbolizer.
    pub fn finish_names(&mut self, m: &UnwMaps<'_>) -> super::runtime::Names {
        self.runtimes.drain(&m.rt);
        self.runtimes.take_names()
    }

    /// The run's report (read after the programs are detached).
    pub fn report(&self, m: &UnwMaps<'_>) -> anyhow::Result<Report> {
        let mut table_stats = self.tables.as_ref().map(|t| t.stats.clone()).unwrap_or_default();
        if let Some(t) = &self.tables {
            table_stats.kernel_bytes = t.kernel_bytes();
        }
        Ok(Report {
            mode: self.plan.asked,
            tables: self.plan.tables,
            fallback: self.plan.fallback.clone(),
            walks: WalkCounts::read(m.stats)?,
            table_stats,
            runtimes: self.runtimes.report(&m.rt)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_return_address_mask_follows_the_address_space() {
        let probe: u64 = (1 << 55) - 1;
        // xpaclri on a 48-bit and a 52-bit user address space, and a CPU
        // without pointer authentication (it leaves the probe alone).
        assert_eq!(user_address_mask(probe & ((1 << 48) - 1)), 0x0000_ffff_ffff_ffff);
        assert_eq!(user_address_mask(probe & ((1 << 52) - 1)), 0x000f_ffff_ffff_ffff);
        assert_eq!(user_address_mask(probe), probe);
        // A return address signed under 48-bit addresses comes out whole.
        let signed = 0x003a_aaaa_dead_beef_u64 | (0x35 << 48);
        assert_eq!(signed & user_address_mask(probe & ((1 << 48) - 1)), 0x0000_aaaa_dead_beef);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(return_address_mask(), u64::MAX);
        }
    }
}
