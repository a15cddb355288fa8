//! The runtimes of a run's processes: which runtime each process runs (from
//! the look at its mappings the unwinder took), what the kernel is told,
//! the code objects named while the processes live, and the report. Knows
//! runtimes only through [`super::plugin`] and [`super::registry`].
use std::{
    collections::{BTreeMap, HashMap},
    rc::Rc,
    time::{Duration, Instant},
};

use libbpf_rs::{MapCore, MapFlags};

use super::{
    layout::{self, rt_end, rt_seen_key, rt_stat},
    plugin::{CodeInfo, Detected, Instance, Runtime, Seen},
    registry, Frames, RtFrame,
};
use crate::engine::{
    process::{mem::Mem, Process},
    record::decode,
};

/// Most bytes of names and line tables kept for the run.
const MAX_NAME_BYTES: usize = 64 << 20;
/// Reads of a name that asked to be read again ([`Instance::read_again`]).
const RECHECKS: u8 = 3;
/// How long a runtime that is starting is waited for (looks, 500 ms apart).
const LATER_TRIES: u32 = 60;

/// How long a runtime that is starting is left before the next look after
/// `tries` looks: 10 ms, doubled each time up to 500 ms (a process that
/// just started is read within about 10 ms of its runtime being ready, so
/// that a call it makes at once has its frames; one that never gets ready
/// is given up on after about 28 s).
fn later_wait(tries: u32) -> Duration {
    Duration::from_millis((10u64 << tries.clamp(1, 7).saturating_sub(1)).min(500))
}

/// A code object as the kernel saw it: process, kind, address, cookie, and
/// the frame's flags and location where they are part of its name.
pub type NameKey = (u32, u8, u64, u16, u8, u32);

/// The key of language frame `f` of process `pid` (as `rt_note` makes it).
fn key_of(pid: u32, f: &RtFrame) -> NameKey {
    let (key_flags, key_loc) = registry::by_kind(f.kind).map(|r| r.name_key()).unwrap_or((0, 0));
    let sel = f.flags & key_flags;
    (pid, f.kind, f.addr, f.cookie, sel, if sel & key_loc != 0 { f.loc } else { 0 })
}

/// Code objects named during the run, and what could not be.
#[derive(Debug, Default)]
pub struct Names {
    map: HashMap<NameKey, Rc<CodeInfo>>,
    bytes: usize,
    /// Why code objects were not named, by reason: `gone` (the process
    /// exited before it was read), `reused` (its memory held another object
    /// by then), `unreadable`, `not_code`, `names_full` (the run's name
    /// memory was used up), `unsupported` (no runtime known for the process).
    pub failed: BTreeMap<&'static str, u64>,
    /// Per process: the module name language frames get (`python3.12`).
    modules: HashMap<u32, Rc<str>>,
    /// Names to read again the next times their code is seen (how often
    /// they were since).
    recheck: HashMap<NameKey, u8>,
}

impl Names {
    /// The name of a code object, when it was read.
    pub fn get(&self, pid: u32, f: &RtFrame) -> Option<&Rc<CodeInfo>> {
        self.map.get(&key_of(pid, f))
    }

    /// The module language frames of `pid` are shown in.
    pub fn module(&self, pid: u32) -> Option<&Rc<str>> {
        self.modules.get(&pid)
    }

    /// Code objects named.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none was named.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// What sonde found of a process's runtime, for the summary and `doctor --pid`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProcReport {
    /// The process.
    pub pid: u32,
    /// "Python 3.12.1".
    pub runtime: String,
    /// Whether its frames are read.
    pub read: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The file holding the runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Where its structure offsets came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offsets: Option<&'static str>,
    /// Read although newer than the versions this sonde was tested on (it
    /// describes itself as they do): those versions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untested: Option<String>,
}

/// What the kernel walk counted (`enum rt_stat`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct WalkCounts {
    /// Stacks whose native walk met an interpreter loop.
    pub walks: u64,
    /// Language frames recorded.
    pub frames: u64,
    /// Walks that read up to the outermost frame.
    pub complete: u64,
    /// Walks cut short, by why: `no_thread_state` (a thread running no
    /// interpreted code, or not yet known to the interpreter), `bad_read`,
    /// `depth` (more than 128 language frames), `bad_frame`.
    pub cut: BTreeMap<&'static str, u64>,
    /// Language frames not kept: the map of walked stacks was full.
    pub store_full: u64,
    /// Code objects not handed over: the hand-over map was full.
    pub seen_full: u64,
    /// Pcs in a runtime's generated code that no code blob held (code the
    /// JIT freed, or was writing, as the sample was taken): the walk ended
    /// there rather than guess.
    pub jit_unknown: u64,
    /// Interpreted frames whose method could not be read (kept unnamed).
    pub jit_bad: u64,
}

/// The runtimes part of a stack tool's summary.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    /// `--frames`.
    pub frames: Frames,
    /// Processes with a runtime, read or not.
    pub processes: Vec<ProcReport>,
    /// The kernel walk's counts.
    pub walks: WalkCounts,
    /// Code objects named.
    pub named: u64,
    /// Code objects not named, by reason (see [`Names::failed`]).
    pub unnamed: BTreeMap<&'static str, u64>,
    /// Code objects named in part, by reason: `code_not_found` (a V8
    /// frame in code other than its function's current code, named by the
    /// function alone: no inlined functions, no line).
    pub partly_named: BTreeMap<&'static str, u64>,
    /// Milliseconds spent handing code objects over and naming them.
    pub naming_ms: f64,
}

/// The runtime maps of a loaded object.
pub struct RtMaps<'a> {
    /// `rt_procs`.
    pub procs: &'a dyn MapCore,
    /// `rt_seen`.
    pub seen: &'a dyn MapCore,
    /// `rt_stats`.
    pub stats: &'a dyn MapCore,
}

/// What is known of a process.
enum State {
    /// A runtime this build reads, and the process's memory while it lives.
    Read { rt: &'static dyn Runtime, inst: Box<dyn Instance>, mem: Option<Mem> },
    /// No runtime (with the hash of the executable mappings it was looked
    /// for in: a process that maps more, as one that just exec'd and then
    /// maps its libraries, is looked at again), or one this build does not
    /// read (None: said once, never looked at again).
    Other(Option<u64>),
    /// A runtime that is starting: look again at `.0` (try `.1` of
    /// [`LATER_TRIES`]).
    Later(Instant, u32),
}

/// The runtimes of a run's processes.
pub struct Runtimes {
    frames: Frames,
    procs: HashMap<u32, State>,
    reports: BTreeMap<u32, ProcReport>,
    names: Names,
    /// Code objects named, and not, when the names were taken.
    named: u64,
    unnamed: BTreeMap<&'static str, u64>,
    /// Time spent reading names from processes' memory.
    naming: Duration,
    /// Processes whose runtime is not settled ([`Instance::settled`]):
    /// when they were last looked at, and how often.
    unsettled: HashMap<u32, (Instant, u32)>,
}

impl Runtimes {
    /// For a run with `--frames frames`.
    pub fn new(frames: Frames) -> Runtimes {
        Runtimes {
            frames,
            procs: HashMap::new(),
            reports: BTreeMap::new(),
            names: Names::default(),
            named: 0,
            unnamed: BTreeMap::new(),
            naming: Duration::ZERO,
            unsettled: HashMap::new(),
        }
    }

    /// Whether language frames are read at all.
    pub fn enabled(&self) -> bool {
        self.frames != Frames::Native
    }

    /// When the next process whose runtime was starting is due another look.
    pub fn next_look(&self) -> Option<Instant> {
        self.procs
            .values()
            .filter_map(|k| match k {
                State::Later(at, n) => Some(*at + later_wait(*n)),
                _ => None,
            })
            .min()
    }

    /// Forgets what was known of `pid` (it ran another program since: an
    /// exec); its next look detects its runtime afresh. Its names stay.
    pub fn forget(&mut self, m: &RtMaps<'_>, pid: u32) {
        self.unsettled.remove(&pid);
        if self.procs.remove(&pid).is_some() {
            let _ = m.procs.delete(&pid.to_ne_bytes());
        }
    }

    /// Looks at a process the unwinder just loaded (again: `refresh`), from
    /// the same look at its mappings.
    pub fn on_load(&mut self, m: &RtMaps<'_>, p: &mut Process) {
        if !self.enabled() {
            return;
        }
        let pid = p.pid;
        match self.procs.get_mut(&pid) {
            Some(State::Read { rt, inst, mem: Some(_) }) => {
                // New mappings (the unwinder reloads on a pc outside every
                // one): the runtime's ranges may have moved.
                if let Some(cfg) = inst.remapped(p) {
                    if let Some(v) = layout::proc_value(rt.kind(), rt.name_key(), &cfg) {
                        let _ = m.procs.update(&pid.to_ne_bytes(), layout::bytes_of(&v), MapFlags::ANY);
                    }
                }
                return;
            }
            Some(State::Other(Some(h))) if *h != p.exec_hash() => {}
            Some(State::Read { .. }) | Some(State::Other(_)) => return,
            Some(State::Later(at, n)) if at.elapsed() < later_wait(*n) => return,
            _ => {}
        }
        let tries = match self.procs.get(&pid) {
            Some(State::Later(_, n)) => *n + 1,
            _ => 1,
        };
        let found = if p.mem().is_some() {
            // Its files and memory are the process's to craft: a reader's
            // panic says so, never takes the run down.
            crate::engine::elfcheck::guarded(|| registry::detect(p)).unwrap_or_else(|e| {
                let what = p
                    .exec_files()
                    .find_map(|m| registry::runtime_named(m.base()))
                    .unwrap_or_else(|| "a language runtime".to_string());
                Some((None, Detected::not_read(what, format!("sonde failed reading it (an internal error: {e})"))))
            })
        } else {
            None
        };
        // A process that exited while it was read: its memory went with it,
        // which says nothing of its runtime.
        if matches!(found, Some((_, Detected::NotRead { .. } | Detected::Later(_))))
            && !super::super::process_alive(pid)
        {
            self.procs.insert(pid, State::Other(None));
            return;
        }
        match found {
            None => {
                self.procs.insert(pid, State::Other(Some(p.exec_hash())));
            }
            Some((Some(rt), Detected::Read(inst))) => {
                let about = inst.about();
                if let Some(tested) = &about.untested {
                    eprintln!(
                        "sonde: process {pid} ({}): {} is newer than the versions this sonde was tested on ({tested}); it describes itself as they do, so its frames are read, checked as they are met",
                        p.comm(),
                        about.runtime
                    );
                }
                let ok = layout::proc_value(rt.kind(), rt.name_key(), &inst.config())
                    .is_some_and(|v| m.procs.update(&pid.to_ne_bytes(), layout::bytes_of(&v), MapFlags::ANY).is_ok());
                self.names.modules.insert(pid, Rc::from(about.module.as_str()));
                self.reports.insert(
                    pid,
                    ProcReport {
                        pid,
                        runtime: about.runtime,
                        read: ok,
                        why: (!ok).then(|| "the kernel's table of runtime processes is full".to_string()),
                        image: Some(about.image),
                        offsets: Some(about.offsets),
                        untested: about.untested,
                    },
                );
                self.procs.insert(pid, State::Read { rt, inst, mem: p.take_mem() });
            }
            Some((_, Detected::Read(_))) => {
                self.procs.insert(pid, State::Other(None));
            }
            Some((_, Detected::NotRead { what, why })) => {
                eprintln!("sonde: process {pid} ({}): {what} is not read ({why}); its stacks stay native", p.comm());
                self.reports.insert(pid, not_read(pid, what, why));
                self.procs.insert(pid, State::Other(None));
            }
            Some((_, Detected::Later(why))) => {
                if tries >= LATER_TRIES {
                    eprintln!("sonde: process {pid} ({}): {why}; its stacks stay native", p.comm());
                    let what = why.split(':').next().unwrap_or("a runtime").to_string();
                    self.reports.insert(pid, not_read(pid, what, why));
                    self.procs.insert(pid, State::Other(None));
                } else {
                    self.procs.insert(pid, State::Later(Instant::now(), tries));
                }
            }
        }
    }

    /// Looks again at processes that were not ready; names the code objects
    /// the kernel handed over since the last call.
    pub fn drain(&mut self, m: &RtMaps<'_>) {
        if !self.enabled() {
            return;
        }
        let later: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, k)| matches!(k, State::Later(at, n) if at.elapsed() >= later_wait(*n)))
            .map(|(p, _)| *p)
            .collect();
        for pid in later {
            match Process::read(pid) {
                Some(mut p) => self.on_load(m, &mut p),
                // Gone: nothing to look at again (the loop wakes for a
                // look that is due).
                None => {
                    self.procs.insert(pid, State::Other(None));
                }
            }
        }
        // Runtimes still starting: looked at again, 10 ms apart at first,
        // up to a second apart.
        let unsettled: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, k)| matches!(k, State::Read { inst, mem: Some(_), .. } if !inst.settled()))
            .map(|(p, _)| *p)
            .filter(|p| {
                self.unsettled.get(p).is_none_or(|(at, n)| at.elapsed() >= later_wait(*n).min(Duration::from_secs(1)))
            })
            .collect();
        for pid in unsettled {
            let e = self.unsettled.entry(pid).or_insert((Instant::now(), 0));
            *e = (Instant::now(), e.1 + 1);
            if let Some(mut p) = Process::read(pid) {
                self.on_load(m, &mut p);
            }
        }
        let t0 = Instant::now();
        let keys: Vec<Vec<u8>> = m.seen.keys().collect();
        for k in keys {
            let _ = m.seen.delete(&k);
            let Some(s) = decode::<rt_seen_key>(&k) else { continue };
            let key = (s.pid, s.kind, s.addr, s.cookie, s.flags, s.loc);
            if self.names.map.contains_key(&key) {
                match self.names.recheck.get_mut(&key) {
                    Some(n) if *n < RECHECKS => *n += 1,
                    _ => continue,
                }
            }
            let seen = Seen { addr: s.addr, cookie: s.cookie, flags: s.flags, loc: s.loc };
            let (r, again) = match self.procs.get_mut(&s.pid) {
                _ if !super::super::pid_exists(s.pid) => (Err("gone"), false),
                Some(State::Read { rt, inst, mem: Some(mem) }) if rt.kind() == s.kind => {
                    // The process's memory is its own to craft: a reader's
                    // panic is a code object left unnamed and counted.
                    let r = crate::engine::elfcheck::guarded(|| inst.code_info(mem, &seen))
                        .unwrap_or(Err("internal_error"));
                    let again = r.as_ref().is_ok_and(|i| inst.read_again(i));
                    (r, again)
                }
                _ => (Err("unsupported"), false),
            };
            match r {
                Ok(info) if self.names.bytes + info.bytes() <= MAX_NAME_BYTES => {
                    if again {
                        self.names.recheck.entry(key).or_insert(0);
                    } else {
                        self.names.recheck.remove(&key);
                    }
                    self.names.bytes += info.bytes();
                    if let Some(old) = self.names.map.insert(key, Rc::new(info)) {
                        self.names.bytes -= old.bytes();
                    }
                }
                Ok(_) => *self.names.failed.entry("names_full").or_default() += 1,
                Err(why) => *self.names.failed.entry(why).or_default() += 1,
            }
        }
        for k in self.procs.values_mut() {
            if let State::Read { inst, .. } = k {
                inst.end_drain();
            }
        }
        self.naming += t0.elapsed();
    }

    /// Forgets processes that are gone: their memory handles and kernel
    /// entries (their names stay for the end of the run).
    pub fn sweep(&mut self, m: &RtMaps<'_>) {
        for (pid, k) in self.procs.iter_mut() {
            if let State::Read { mem, .. } = k {
                if mem.is_some() && !super::super::pid_exists(*pid) {
                    *mem = None;
                    let _ = m.procs.delete(&pid.to_ne_bytes());
                }
            }
        }
    }

    /// The names read, for symbolizing (leaves the runtimes without them).
    pub fn take_names(&mut self) -> Names {
        self.named = self.names.len() as u64;
        self.unnamed = self.names.failed.clone();
        std::mem::take(&mut self.names)
    }

    /// The run's report.
    pub fn report(&self, m: &RtMaps<'_>) -> anyhow::Result<Report> {
        let st = |s: rt_stat| crate::engine::record::percpu_sum(m.stats, s.0);
        let mut walks = WalkCounts {
            walks: st(rt_stat::RT_S_WALKS)?,
            frames: st(rt_stat::RT_S_FRAMES)?,
            store_full: st(rt_stat::RT_S_STORE_FULL)?,
            seen_full: st(rt_stat::RT_S_SEEN_FULL)?,
            complete: st(rt_stat(rt_stat::RT_S_END.0 + rt_end::RT_END_DONE.0))?,
            jit_unknown: st(rt_stat::RT_S_JIT_UNKNOWN)?,
            jit_bad: st(rt_stat::RT_S_JIT_BAD)?,
            ..Default::default()
        };
        for (end, name) in [
            (rt_end::RT_END_NO_THREAD, "no_thread_state"),
            (rt_end::RT_END_READ, "bad_read"),
            (rt_end::RT_END_DEPTH, "depth"),
            (rt_end::RT_END_BAD_FRAME, "bad_frame"),
        ] {
            let n = st(rt_stat(rt_stat::RT_S_END.0 + end.0))?;
            if n > 0 {
                walks.cut.insert(name, n);
            }
        }
        let mut partly_named = BTreeMap::new();
        for k in self.procs.values() {
            if let State::Read { inst, .. } = k {
                inst.partly_named(&mut partly_named);
            }
        }
        partly_named.retain(|_, n| *n > 0);
        Ok(Report {
            frames: self.frames,
            processes: self.reports.values().cloned().collect(),
            walks,
            named: self.named,
            unnamed: self.unnamed.clone(),
            partly_named,
            naming_ms: self.naming.as_secs_f64() * 1e3,
        })
    }
}

fn not_read(pid: u32, runtime: String, why: String) -> ProcReport {
    ProcReport { pid, runtime, read: false, why: Some(why), image: None, offsets: None, untested: None }
}
