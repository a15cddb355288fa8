//! Stacks that name the program, not its runtime: the runtime-frames engine
//! shared by every stack tool (profile, offcpu, wakeup, slow, and serve's
//! profiles). Its kernel half is `runtime.h` beside this file.
//!
//! Per process, when the unwinder first loads its tables ([`Runtimes::on_load`]),
//! each runtime's user half looks for itself in the process's mappings
//! (also in another mount namespace, through `/proc/PID/map_files`, and
//! embedded in another program) and, when found, learns what the kernel
//! needs (version, structure offsets, the interpreter loop's address
//! ranges, how the thread's state is found) and writes it to `rt_procs`.
//! The kernel walk marks native frames in the interpreter loop and records
//! the language frames the thread was running; code objects met in new
//! stacks are handed over in `rt_seen`, and named here while the process
//! lives ([`Runtimes::drain`]: name, file, line table), so a process that
//! exits mid-run keeps its names. At the end, [`merge`] replaces each marked
//! native frame by the language frames it was running.
//!
//! A runtime is one folder: `NAME/mod.rs` (detection, naming) and
//! `NAME/NAME.h` (its kernel walker), plugged in at [`detect`] and at
//! `rt_walk` in `runtime.h`.
pub mod elfsym;
pub mod go;
pub mod java;
pub mod mem;
pub mod python;
pub mod v8;

use std::{
    collections::{BTreeMap, HashMap},
    rc::Rc,
    time::{Duration, Instant},
};

use clap::ValueEnum;
use libbpf_rs::{MapCore, MapFlags};

use mem::Mem;

/// Language frames kept per stack (`RT_MAX_FRAMES`).
pub const MAX_FRAMES: usize = 128;
/// Interpreter-loop ranges per process (`RT_MAX_RANGES`).
pub const MAX_RANGES: usize = 4;
/// `UNW_HOW_RT`: the walked stack has language frames in `rt_walked`.
pub const HOW_RT: u8 = 4;
/// `RT_F_ENTRY`.
const FLAG_ENTRY: u8 = 1;
/// `enum rt_kind`.
pub const KIND_PYTHON: u8 = 1;
/// `enum rt_kind`: HotSpot.
pub const KIND_JAVA: u8 = 2;
/// `enum rt_kind`: V8.
pub const KIND_V8: u8 = 3;
/// Ranges of generated code a runtime steps itself (`RT_JIT`).
pub const JIT_RANGES: usize = 2;
/// Where `struct rt_proc`'s runtime-specific part starts.
const PROC_CFG: usize = 8 + 16 * MAX_RANGES + 16 * JIT_RANGES;
/// Bytes of `struct rt_proc`.
pub const PROC_BYTES: usize =
    PROC_CFG + if java::CONFIG_BYTES > v8::CONFIG_BYTES { java::CONFIG_BYTES } else { v8::CONFIG_BYTES };
/// Bytes of `struct rt_stack`'s head (before the frames).
const STACK_HEAD: usize = 24;
/// Bytes of `struct rt_seen_key`.
const SEEN_KEY: usize = 24;

/// Writes a process's ranges of generated code (`rt_proc.jit_lo`, `jit_hi`).
fn set_jit(v: &mut [u8], ranges: &[(u64, u64)]) {
    let at = 8 + 16 * MAX_RANGES;
    for (i, (lo, hi)) in ranges.iter().take(JIT_RANGES).enumerate() {
        v[at + 8 * i..at + 8 * i + 8].copy_from_slice(&lo.to_ne_bytes());
        v[at + 8 * JIT_RANGES + 8 * i..at + 8 * JIT_RANGES + 8 * i + 8].copy_from_slice(&hi.to_ne_bytes());
    }
}

/// Processes whose runtime the kernel can hold (`rt_procs`).
pub const MAX_PROCS: u32 = 4096;
/// Walked stacks with language frames kept (`rt_walked`, allocated as used).
pub const MAX_WALKED: u32 = 16384;
/// Code objects handed over between two drains (`rt_seen`).
pub const MAX_SEEN: u32 = 16384;
/// Most bytes of names and line tables kept for the run.
const MAX_NAME_BYTES: usize = 64 << 20;

/// `--frames`: what a stack shows of language runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Frames {
    /// Each interpreter-loop frame replaced by the language frames it ran;
    /// native callers and callees (C extensions, the kernel) stay.
    #[default]
    Mixed,
    /// Only the language frames, where a stack has any.
    Lang,
    /// Native frames only, as the CPU sees them (no language frames read).
    Native,
}

/// One language frame as the kernel recorded it (`struct rt_frame`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtFrame {
    /// The code object.
    pub addr: u64,
    /// Where in it (runtime-specific).
    pub loc: u32,
    /// Tells a reused code object apart.
    pub cookie: u16,
    /// `RT_F_*`.
    pub flags: u8,
    /// `enum rt_kind`.
    pub kind: u8,
}

/// The language frames of a walked stack (`struct rt_stack`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtStack {
    /// How the walk ended (`enum rt_end`).
    pub end: u8,
    /// Bit i: native frame i (leaf first) is in the interpreter loop.
    pub marks: [u64; 2],
    /// Leaf first.
    pub frames: Vec<RtFrame>,
}

impl RtStack {
    /// Decodes `rt_walked`'s value.
    pub fn decode(b: &[u8]) -> Option<RtStack> {
        if b.len() < STACK_HEAD {
            return None;
        }
        let n = (u16::from_ne_bytes([b[0], b[1]]) as usize).min(MAX_FRAMES).min((b.len() - STACK_HEAD) / 16);
        let frames = (0..n)
            .map(|i| {
                let f = &b[STACK_HEAD + 16 * i..STACK_HEAD + 16 * i + 16];
                RtFrame {
                    addr: u64::from_ne_bytes(f[..8].try_into().unwrap()),
                    loc: u32::from_ne_bytes(f[8..12].try_into().unwrap()),
                    cookie: u16::from_ne_bytes([f[12], f[13]]),
                    flags: f[14],
                    kind: f[15],
                }
            })
            .collect();
        Some(RtStack {
            end: b[2],
            marks: [
                u64::from_ne_bytes(b[8..16].try_into().unwrap()),
                u64::from_ne_bytes(b[16..24].try_into().unwrap()),
            ],
            frames,
        })
    }

    /// Whether native frame `i` (leaf first) ran the interpreter loop.
    pub fn marked(&self, i: usize) -> bool {
        i < 128 && self.marks[i / 64] & (1 << (i % 64)) != 0
    }

    /// The frames in groups, leaf first: each group is what one
    /// interpreter-loop frame ran, leaf first.
    pub fn groups(&self) -> Vec<&[RtFrame]> {
        let mut out = Vec::new();
        let mut start = 0;
        for (i, f) in self.frames.iter().enumerate() {
            if f.flags & FLAG_ENTRY != 0 {
                out.push(&self.frames[start..=i]);
                start = i + 1;
            }
        }
        if start < self.frames.len() {
            out.push(&self.frames[start..]);
        }
        out
    }
}

/// How a code object's lines are found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lines {
    /// CPython 3.`minor`: its line table; `code` is where the instructions
    /// start in the code object (3.11+).
    Python {
        /// Minor version.
        minor: u8,
        /// `co_lnotab` or `co_linetable`.
        table: Vec<u8>,
        /// `co_code_adaptive`'s offset.
        code: u32,
    },
    /// A Java method or nmethod.
    Java(Rc<java::JavaCode>),
    /// JavaScript: a function, or V8's code for one.
    V8(Rc<v8::JsCode>),
}

/// A named code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    /// Qualified name where the runtime has one.
    pub name: String,
    /// Source file.
    pub file: String,
    /// Its first line.
    pub first_line: u32,
    /// How to find the line of a location in it.
    pub lines: Lines,
}

impl CodeInfo {
    /// The source line at `loc` (the kernel's location in the code object).
    pub fn line(&self, loc: u32) -> Option<u32> {
        match &self.lines {
            Lines::Python { minor, table, code } => python::line_at(*minor, table, *code, self.first_line, loc),
            Lines::Java(c) => c.frames(loc, 0).first().and_then(|f| f.1),
            Lines::V8(c) => c.frames(loc, 0).first().and_then(|f| f.1),
        }
    }

    /// The source frames of language frame `f` of this code, innermost
    /// first: (name, file, line, inlined). One, except where a JIT inlined
    /// callees into the code (their frames come first), or none for a
    /// runtime's own stub code (named as the code object itself).
    pub fn frames(&self, f: &RtFrame) -> Vec<(String, String, Option<u32>, bool)> {
        match &self.lines {
            Lines::Java(c) => {
                let fr = c.frames(f.loc, f.flags);
                if fr.is_empty() {
                    return vec![(self.name.clone(), self.file.clone(), None, false)];
                }
                let n = fr.len();
                fr.into_iter()
                    .enumerate()
                    .map(|(i, (m, line))| (m.name.clone(), m.file.clone(), line, i + 1 < n))
                    .collect()
            }
            Lines::V8(c) => {
                let fr = c.frames(f.loc, f.flags);
                let n = fr.len();
                fr.into_iter()
                    .enumerate()
                    .map(|(i, (func, line))| (func.name.clone(), func.script.name.clone(), line, i + 1 < n))
                    .collect()
            }
            _ => vec![(self.name.clone(), self.file.clone(), self.line(f.loc), false)],
        }
    }

    fn bytes(&self) -> usize {
        64 + self.name.len()
            + self.file.len()
            + match &self.lines {
                Lines::Python { table, .. } => table.len(),
                Lines::Java(c) => java::bytes(c),
                Lines::V8(c) => v8::bytes(c),
            }
    }
}

/// A code object as the kernel saw it: process, kind, address, cookie, and
/// for V8 the frame's kind (`V8_F_*`) and, for a frame in code other than
/// its function's current code, the pc (whose name depends on it).
pub type NameKey = (u32, u8, u64, u16, u8, u32);

/// The parts of a language frame that choose its name (`rt_seen_key`'s
/// flags and loc, as `rt_note` fills them).
fn key_parts(kind: u8, flags: u8, loc: u32) -> (u8, u32) {
    if kind != KIND_V8 {
        return (0, 0);
    }
    let sel = flags & (v8::FLAG_INTERP | v8::FLAG_CODE | v8::FLAG_BASELINE | v8::FLAG_PC);
    (sel, if sel & v8::FLAG_PC != 0 { loc } else { 0 })
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
    /// JavaScript functions named "(anonymous)", and how often they were
    /// read again since: V8 may have been changing the function (its
    /// ScopeInfo, while it compiled it) as sonde read it, so such a name
    /// is read again the next times the code is seen (RECHECKS at most).
    recheck: HashMap<NameKey, u8>,
}

/// Reads of a JavaScript function's name that came out "(anonymous)".
const RECHECKS: u8 = 3;

impl Names {
    /// The name of a code object, when it was read.
    pub fn get(&self, pid: u32, f: &RtFrame) -> Option<&Rc<CodeInfo>> {
        let (sel, loc) = key_parts(f.kind, f.flags, f.loc);
        self.map.get(&(pid, f.kind, f.addr, f.cookie, sel, loc))
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
}

/// What a runtime's user half found in a process.
pub enum Found {
    /// A Python this build reads.
    Python(Box<python::Python>),
    /// A JVM this build reads.
    Java(Box<java::Hotspot>),
    /// A V8 (Node.js) this build reads.
    V8(Box<v8::V8>),
    /// A runtime this build does not read: what it is and why.
    Unsupported {
        /// "Python 3.14.0".
        what: String,
        /// Why, for the user.
        why: String,
    },
    /// Not ready yet (the runtime is starting): look again later.
    Later(String),
}

enum Known {
    Python(Box<python::Python>, Option<Mem>),
    Java(Box<java::Hotspot>, Option<Mem>),
    V8(Box<v8::V8>, Option<Mem>),
    /// Not a runtime we know, or one we do not read.
    Other,
    /// To look again at `.0` (try `.1` of at most 60).
    Later(Instant, u32),
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

/// The runtimes of a run's processes.
pub struct Runtimes {
    frames: Frames,
    procs: HashMap<u32, Known>,
    reports: BTreeMap<u32, ProcReport>,
    names: Names,
    /// Code objects named, and not, when the names were taken.
    named: u64,
    unnamed: BTreeMap<&'static str, u64>,
    /// Time spent reading names from processes' memory.
    naming: Duration,
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
        }
    }

    /// Whether language frames are read at all.
    pub fn enabled(&self) -> bool {
        self.frames != Frames::Native
    }

    /// Looks at a process the unwinder just loaded (again: `refresh`).
    pub fn on_load(&mut self, m: &RtMaps<'_>, pid: u32) {
        if !self.enabled() {
            return;
        }
        match self.procs.get_mut(&pid) {
            Some(Known::V8(v, Some(_))) => {
                // New mappings (the unwinder reloads on a pc outside every
                // one): V8's code range may have grown.
                let r = v8::code_range(pid, &v.blobs);
                if r.is_some() && r != v.code_range {
                    v.code_range = r;
                    let cfg = Self::v8_config(v);
                    let _ = m.procs.update(&pid.to_ne_bytes(), &cfg, MapFlags::ANY);
                }
                return;
            }
            Some(Known::Python(..)) | Some(Known::Java(..)) | Some(Known::V8(..)) | Some(Known::Other) => return,
            Some(Known::Later(at, _)) if at.elapsed() < Duration::from_millis(500) => return,
            _ => {}
        }
        let tries = match self.procs.get(&pid) {
            Some(Known::Later(_, n)) => *n + 1,
            _ => 1,
        };
        let found = elfsym::map_lines(pid).and_then(|maps| {
            let mem = Mem::open(pid)?;
            detect(pid, &maps, &mem).map(|f| (f, mem))
        });
        let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_string();
        match found {
            None => {
                self.procs.insert(pid, Known::Other);
            }
            Some((Found::Java(h), mem)) => {
                let mut v = vec![0u8; PROC_BYTES];
                v[..4].copy_from_slice(&(KIND_JAVA as u32).to_ne_bytes());
                set_jit(&mut v, &[h.jit]);
                v[PROC_CFG..PROC_CFG + java::CONFIG_BYTES].copy_from_slice(&java::bpf_config(&h));
                let runtime = format!("Java {} (HotSpot)", h.version);
                self.install(m, pid, &v, "java", runtime, &h.image, "gHotSpotVMStructs");
                self.procs.insert(pid, Known::Java(h, Some(mem)));
            }
            Some((Found::V8(x), mem)) => {
                let v = Self::v8_config(&x);
                let runtime = format!("Node.js (V8 {})", x.version);
                self.install(m, pid, &v, "node", runtime, &x.image, "v8dbg_ metadata");
                self.procs.insert(pid, Known::V8(x, Some(mem)));
            }
            Some((Found::Python(p), mem)) => {
                let mut v = vec![0u8; PROC_BYTES];
                v[..4].copy_from_slice(&(KIND_PYTHON as u32).to_ne_bytes());
                let n = p.ranges.len().min(MAX_RANGES);
                v[4..8].copy_from_slice(&(n as u32).to_ne_bytes());
                for (i, (lo, hi)) in p.ranges.iter().take(n).enumerate() {
                    v[8 + 8 * i..16 + 8 * i].copy_from_slice(&lo.to_ne_bytes());
                    v[8 + 8 * MAX_RANGES + 8 * i..16 + 8 * MAX_RANGES + 8 * i].copy_from_slice(&hi.to_ne_bytes());
                }
                v[PROC_CFG..PROC_CFG + 40].copy_from_slice(&python::bpf_config(&p));
                let module = p.image.rsplit('/').next().unwrap_or("python").split(".so").next().unwrap_or("python");
                let offsets = if p.from_debug_offsets { "_Py_DebugOffsets" } else { "built-in table" };
                self.install(m, pid, &v, module, format!("Python {}", p.version), &p.image, offsets);
                self.procs.insert(pid, Known::Python(p, Some(mem)));
            }
            Some((Found::Unsupported { what, why }, _)) => {
                eprintln!("sonde: process {pid} ({}): {what} is not read ({why}); its stacks stay native", comm());
                self.reports.insert(
                    pid,
                    ProcReport { pid, runtime: what, read: false, why: Some(why), image: None, offsets: None },
                );
                self.procs.insert(pid, Known::Other);
            }
            Some((Found::Later(why), _)) => {
                if tries >= 60 {
                    eprintln!("sonde: process {pid} ({}): {why}; its stacks stay native", comm());
                    self.reports.insert(
                        pid,
                        ProcReport {
                            pid,
                            runtime: why.split(':').next().unwrap_or("a runtime").to_string(),
                            read: false,
                            why: Some(why),
                            image: None,
                            offsets: None,
                        },
                    );
                    self.procs.insert(pid, Known::Other);
                } else {
                    self.procs.insert(pid, Known::Later(Instant::now(), tries));
                }
            }
        }
    }

    /// A V8 process's `struct rt_proc`.
    fn v8_config(x: &v8::V8) -> Vec<u8> {
        let mut v = vec![0u8; PROC_BYTES];
        v[..4].copy_from_slice(&(KIND_V8 as u32).to_ne_bytes());
        set_jit(&mut v, &v8::jit_ranges(x));
        v[PROC_CFG..PROC_CFG + v8::CONFIG_BYTES].copy_from_slice(&v8::bpf_config(x));
        v
    }

    /// Hands a process's `struct rt_proc` (`v`) to the kernel and records
    /// what its language frames are shown in and the report's line.
    #[allow(clippy::too_many_arguments)]
    fn install(
        &mut self,
        m: &RtMaps<'_>,
        pid: u32,
        v: &[u8],
        module: &str,
        runtime: String,
        image: &str,
        offsets: &'static str,
    ) {
        let ok = m.procs.update(&pid.to_ne_bytes(), v, MapFlags::ANY).is_ok();
        self.names.modules.insert(pid, Rc::from(module));
        self.reports.insert(
            pid,
            ProcReport {
                pid,
                runtime,
                read: ok,
                why: (!ok).then(|| "the kernel's table of runtime processes is full".to_string()),
                image: Some(image.to_string()),
                offsets: Some(offsets),
            },
        );
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
            .filter(|(_, k)| matches!(k, Known::Later(at, _) if at.elapsed() >= Duration::from_millis(500)))
            .map(|(p, _)| *p)
            .collect();
        for pid in later {
            self.on_load(m, pid);
        }
        let t0 = Instant::now();
        let keys: Vec<Vec<u8>> = m.seen.keys().filter(|k| k.len() == SEEN_KEY).collect();
        for k in keys {
            let _ = m.seen.delete(&k);
            let pid = u32::from_ne_bytes(k[..4].try_into().unwrap());
            let cookie = u16::from_ne_bytes([k[4], k[5]]);
            let kind = k[6];
            let flags = k[7];
            let addr = u64::from_ne_bytes(k[8..16].try_into().unwrap());
            let loc = u32::from_ne_bytes(k[16..20].try_into().unwrap());
            let (sel, loc) = key_parts(kind, flags, loc);
            let key = (pid, kind, addr, cookie, sel, loc);
            if self.names.map.contains_key(&key) {
                match self.names.recheck.get_mut(&key) {
                    Some(n) if *n < RECHECKS => *n += 1,
                    _ => continue,
                }
            }
            let r = match self.procs.get_mut(&pid) {
                _ if !super::pid_exists(pid) => Err("gone"),
                Some(Known::Python(p, Some(mem))) if kind == KIND_PYTHON => python::code_info(p, mem, addr, cookie),
                Some(Known::Java(h, Some(mem))) if kind == KIND_JAVA => h.code_info(mem, addr, cookie),
                Some(Known::V8(x, Some(mem))) if kind == KIND_V8 => x.code_info(mem, addr, cookie, sel, loc),
                _ => Err("unsupported"),
            };
            match r {
                Ok(info) if self.names.bytes + info.bytes() <= MAX_NAME_BYTES => {
                    if kind == KIND_V8 && info.name == v8::ANONYMOUS {
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
            if let Known::V8(x, _) = k {
                x.end_drain();
            }
        }
        self.naming += t0.elapsed();
    }

    /// Forgets processes that are gone: their memory handles and kernel
    /// entries (their names stay for the end of the run).
    pub fn sweep(&mut self, m: &RtMaps<'_>) {
        for (pid, k) in self.procs.iter_mut() {
            if let Known::Python(_, mem) | Known::Java(_, mem) | Known::V8(_, mem) = k {
                if mem.is_some() && !super::pid_exists(*pid) {
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
        let st = |i: u32| super::record::percpu_sum(m.stats, i);
        let mut walks = WalkCounts {
            walks: st(0)?,
            frames: st(1)?,
            store_full: st(2)?,
            seen_full: st(3)?,
            complete: st(4)?,
            jit_unknown: st(9)?,
            jit_bad: st(10)?,
            ..Default::default()
        };
        for (i, name) in ["no_thread_state", "bad_read", "depth", "bad_frame"].into_iter().enumerate() {
            let n = st(5 + i as u32)?;
            if n > 0 {
                walks.cut.insert(name, n);
            }
        }
        Ok(Report {
            frames: self.frames,
            processes: self.reports.values().cloned().collect(),
            walks,
            named: self.named,
            unnamed: self.unnamed.clone(),
            partly_named: {
                let n: u64 =
                    self.procs.values().map(|k| if let Known::V8(x, _) = k { x.code_not_found } else { 0 }).sum();
                if n > 0 {
                    BTreeMap::from([("code_not_found", n)])
                } else {
                    BTreeMap::new()
                }
            },
            naming_ms: self.naming.as_secs_f64() * 1e3,
        })
    }
}

/// The runtimes this build reads, for `doctor` and the docs.
pub fn supported() -> Vec<(&'static str, &'static str)> {
    vec![("python", python::VERSIONS), ("java", java::VERSIONS), ("node", v8::VERSIONS)]
}

/// What `doctor --pid` says of one process: its runtime, if any, whether
/// its frames are read, and what was learnt (offsets' source, thread-state
/// key, interpreter-loop ranges).
pub fn inspect(pid: u32) -> serde_json::Value {
    use serde_json::json;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim_end().to_string());
    let Ok(comm) = comm else { return json!({"pid": pid, "error": "no such process"}) };
    let (Some(maps), Some(mem)) = (elfsym::map_lines(pid), Mem::open(pid)) else {
        return json!({"pid": pid, "comm": comm, "error": "its maps or memory cannot be read"});
    };
    match detect(pid, &maps, &mem) {
        None => {
            json!({"pid": pid, "comm": comm, "runtime": null, "detail": "no runtime sonde reads (native frames only)"})
        }
        Some(Found::Java(h)) => {
            let heaps: Vec<String> = h.heaps.iter().map(|x| format!("{:#x}-{:#x}", x.lo, x.hi)).collect();
            let interp = format!("{:#x}-{:#x}", h.interp.0, h.interp.1);
            json!({
                "pid": pid, "comm": comm, "runtime": format!("Java {} (HotSpot)", h.version), "read": true,
                "image": h.image,
                "offsets": "gHotSpotVMStructs",
                "detail": format!("code heaps {}; template interpreter {interp}", heaps.join(", ")),
                "code_heaps": heaps,
                "interpreter": interp,
            })
        }
        Some(Found::V8(x)) => {
            let fmt = |r: &[(u64, u64)]| r.iter().map(|(a, b)| format!("{a:#x}-{b:#x}")).collect::<Vec<_>>();
            let code = x.code_range.map(|(a, b)| format!("{a:#x}-{b:#x}"));
            json!({
                "pid": pid, "comm": comm, "runtime": format!("Node.js (V8 {})", x.version), "read": true,
                "image": x.image,
                "offsets": "v8dbg_ metadata",
                "detail": format!(
                    "code range {}; builtins {}; interpreter {}",
                    code.as_deref().unwrap_or("not found"),
                    fmt(&x.blobs).join(", "),
                    fmt(&x.interp).join(", ")
                ),
                "code_range": code,
                "builtins": fmt(&x.blobs),
                "interpreter": fmt(&x.interp),
            })
        }
        Some(Found::Python(p)) => {
            let ranges: Vec<String> = p.ranges.iter().map(|(a, b)| format!("{a:#x}-{b:#x}")).collect();
            // Below the thread pointer on AArch64 (glibc's TLS variant I).
            let tsd = match p.tsd as i64 {
                n if n < 0 => format!("- {:#x}", n.unsigned_abs()),
                n => format!("+ {n:#x}"),
            };
            json!({
                "pid": pid, "comm": comm, "runtime": format!("Python {}", p.version), "read": true,
                "image": p.image,
                "offsets": if p.from_debug_offsets { "_Py_DebugOffsets" } else { "built-in table" },
                "thread_state_key": p.key,
                "thread_specific_data": tsd.trim_start_matches("+ ").replace("- ", "-"),
                "detail": format!(
                    "thread-state key {}, thread-specific data at thread pointer {tsd}; interpreter loop {}",
                    p.key,
                    ranges.join(", ")
                ),
                "interpreter_loop": ranges,
            })
        }
        Some(Found::Unsupported { what, why }) => {
            json!({"pid": pid, "comm": comm, "runtime": what, "read": false, "why": why})
        }
        Some(Found::Later(why)) => {
            json!({"pid": pid, "comm": comm, "runtime": why.split(':').next().unwrap_or("a runtime"), "read": false, "why": why})
        }
    }
}

/// The dispatch point of the user halves: which runtime, if any, `pid` runs.
fn detect(pid: u32, maps: &[elfsym::MapLine], mem: &Mem) -> Option<Found> {
    match std::env::consts::ARCH {
        // The runtimes' structures are laid out alike on AArch64; their
        // frames differ where each reader says (versions read: each
        // runtime's VERSIONS).
        "x86_64" | "aarch64" => java::detect(pid, maps, mem)
            .or_else(|| v8::detect(pid, maps, mem))
            .or_else(|| python::detect(pid, maps, mem)),
        arch => not_read_here(arch, maps),
    }
}

/// On an architecture whose runtimes' layouts this sonde does not know
/// (all but x86-64 and AArch64): the runtime a process runs, recognised by
/// the names of its files alone, reported as not read, so that its stacks
/// are said to stay native rather than silently left so.
fn not_read_here(arch: &str, maps: &[elfsym::MapLine]) -> Option<Found> {
    let what = maps.iter().filter(|m| m.exec).find_map(|m| {
        let base = m.base();
        if base == "libjvm.so" {
            Some("a Java VM (libjvm.so)".to_string())
        } else if v8::is_node(base) {
            Some("Node.js".to_string())
        } else {
            python::name_version(base).map(|(ma, mi, fl)| format!("Python {ma}.{mi}{fl}"))
        }
    })?;
    Some(Found::Unsupported {
        what,
        why: format!(
            "its frames are read on x86-64 and AArch64 only so far; this is an {arch} process (native frames only)"
        ),
    })
}

/// Sets the runtime maps' sizes and `rt_mode` of an open skeleton (part of
/// `set_unwind!`).
#[macro_export]
macro_rules! set_runtimes {
    ($open:expr, $plan:expr) => {{
        let (open, plan) = ($open, $plan);
        let on = plan.tables && plan.frames != $crate::engine::runtime::Frames::Native;
        open.maps.rodata_data.as_deref_mut().expect("rodata present").rt_mode = on as u32;
        if on {
            open.maps.rt_procs.set_max_entries($crate::engine::runtime::MAX_PROCS)?;
            open.maps.rt_walked.set_max_entries($crate::engine::runtime::MAX_WALKED)?;
            open.maps.rt_walked.set_map_flags(libbpf_sys::BPF_F_NO_PREALLOC)?;
            open.maps.rt_seen.set_max_entries($crate::engine::runtime::MAX_SEEN)?;
        }
    }};
}

/// Where a merged stack's user frames come from, root first.
pub enum Part<'a> {
    /// Native frame `i` (leaf-first index into the walked stack).
    Native(usize),
    /// A language frame.
    Lang(&'a RtFrame),
}

/// The order of a user stack's frames, root first, with each
/// interpreter-loop frame replaced by the language frames it ran (`Mixed`),
/// only the language frames (`Lang`; a stack without any keeps its native
/// frames), or the native frames (`Native`). `n` is the native frame count.
/// Returns the parts and whether the groups and loop frames matched up (a
/// mismatch keeps the extra loop frames native, or puts extra language
/// frames at the root).
pub fn merge(n: usize, rt: Option<&RtStack>, frames: Frames) -> (Vec<Part<'_>>, bool) {
    let native = || (0..n).rev().map(Part::Native).collect::<Vec<_>>();
    let Some(rt) = rt.filter(|r| !r.frames.is_empty() && frames != Frames::Native) else { return (native(), true) };
    let groups = rt.groups();
    // Leaf-first: the k-th marked native frame ran the k-th group.
    let mut by_native: HashMap<usize, &[RtFrame]> = HashMap::new();
    let mut g = groups.iter();
    for i in (0..n).filter(|&i| rt.marked(i)) {
        match g.next() {
            Some(grp) => {
                by_native.insert(i, grp);
            }
            None => break,
        }
    }
    let extra: Vec<&[RtFrame]> = g.copied().collect();
    let matched = extra.is_empty() && by_native.len() == (0..n).filter(|&i| rt.marked(i)).count();
    let mut out = Vec::new();
    // Groups the native walk did not reach sit at the root, outermost first.
    for grp in extra.iter().rev() {
        out.extend(grp.iter().rev().map(Part::Lang));
    }
    for i in (0..n).rev() {
        match by_native.get(&i) {
            Some(grp) => out.extend(grp.iter().rev().map(Part::Lang)),
            None if frames == Frames::Lang => {}
            None => out.push(Part::Native(i)),
        }
    }
    (out, matched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_on_another_architecture_are_named_as_not_read() {
        let line = |p: &str| elfsym::MapLine { start: 0x1000, end: 0x2000, offset: 0, exec: true, path: p.into() };
        for (path, what) in [
            ("/usr/bin/python3.11", "Python 3.11"),
            ("/usr/lib/jvm/java-17-openjdk-arm64/lib/server/libjvm.so", "a Java VM (libjvm.so)"),
            ("/usr/bin/node", "Node.js"),
        ] {
            match not_read_here("riscv64", &[line("/usr/lib/riscv64-linux-gnu/libc.so.6"), line(path)]) {
                Some(Found::Unsupported { what: w, why }) => {
                    assert_eq!(w, what);
                    assert!(why.contains("AArch64 only") && why.contains("riscv64"), "{why}");
                }
                _ => panic!("{path}: not reported"),
            }
        }
        assert!(not_read_here("riscv64", &[line("/usr/bin/bash")]).is_none());
    }

    fn f(addr: u64, entry: bool) -> RtFrame {
        RtFrame { addr, loc: 0, cookie: 0, flags: if entry { FLAG_ENTRY } else { 0 }, kind: KIND_PYTHON }
    }

    fn order(parts: &[Part<'_>]) -> Vec<String> {
        parts
            .iter()
            .map(|p| match p {
                Part::Native(i) => format!("n{i}"),
                Part::Lang(f) => format!("py{}", f.addr),
            })
            .collect()
    }

    #[test]
    fn each_loop_frame_takes_its_group_and_native_callers_stay() {
        // Native leaf first: 0 leaf C, 1 eval (runs py1, py2), 2 C callback
        // (sorted), 3 eval (runs py3), 4 main.
        let rt = RtStack { end: 0, marks: [0b1010, 0], frames: vec![f(1, false), f(2, true), f(3, true)] };
        let (p, ok) = merge(5, Some(&rt), Frames::Mixed);
        assert!(ok);
        assert_eq!(order(&p), ["n4", "py3", "n2", "py2", "py1", "n0"]);
        let (p, _) = merge(5, Some(&rt), Frames::Lang);
        assert_eq!(order(&p), ["py3", "py2", "py1"]);
        let (p, _) = merge(5, Some(&rt), Frames::Native);
        assert_eq!(order(&p), ["n4", "n3", "n2", "n1", "n0"]);
    }

    #[test]
    fn mismatches_keep_every_frame() {
        // Two loop frames, one group: the outer loop frame stays native.
        let rt = RtStack { end: 0, marks: [0b110, 0], frames: vec![f(1, true)] };
        let (p, ok) = merge(4, Some(&rt), Frames::Mixed);
        assert!(!ok);
        assert_eq!(order(&p), ["n3", "n2", "py1", "n0"]);
        // One loop frame, two groups (the native walk was cut): the
        // outer group goes to the root.
        let rt = RtStack { end: 0, marks: [0b1, 0], frames: vec![f(1, true), f(2, true)] };
        let (p, ok) = merge(2, Some(&rt), Frames::Mixed);
        assert!(!ok);
        assert_eq!(order(&p), ["py2", "n1", "py1"]);
    }

    #[test]
    fn stacks_decode_as_the_kernel_lays_them_out() {
        let mut b = vec![0u8; STACK_HEAD + 16 * MAX_FRAMES];
        b[0] = 2;
        b[2] = 3;
        b[8] = 0b10;
        b[STACK_HEAD..STACK_HEAD + 8].copy_from_slice(&0x1234u64.to_ne_bytes());
        b[STACK_HEAD + 8..STACK_HEAD + 12].copy_from_slice(&7u32.to_ne_bytes());
        b[STACK_HEAD + 14] = FLAG_ENTRY;
        b[STACK_HEAD + 15] = KIND_PYTHON;
        let s = RtStack::decode(&b).unwrap();
        assert_eq!(s.end, 3);
        assert!(s.marked(1) && !s.marked(0));
        assert_eq!(s.frames.len(), 2);
        assert_eq!(s.frames[0], RtFrame { addr: 0x1234, loc: 7, cookie: 0, flags: FLAG_ENTRY, kind: KIND_PYTHON });
        // A count past the value is cut to what it holds.
        b[0] = 200;
        assert_eq!(RtStack::decode(&b[..STACK_HEAD + 32]).unwrap().frames.len(), 2);
    }
}
