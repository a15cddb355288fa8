//! The stack engine's user half (the kernel half is `src/bpf/stacks.h`):
//! read the in-kernel counts and stacks, keep what symbolization needs while
//! processes live, symbolize each unique address once, and hand out stacks
//! of [`Frame`]s, root first, for the renderers in [`super::render`].
//!
//! User addresses are resolved through a snapshot of the process's mappings
//! taken while it lives ([`Images`]): each mapped file is opened through
//! `/proc/PID/map_files` (works for containers and deleted files) and kept
//! open, so a process that exits before the end of the run is still
//! symbolized from the same inode. JIT code is looked up in the process's
//! `/tmp/perf-PID.map`, read as hostile input by [`super::perfmap`].
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    rc::Rc,
};

use blazesym::symbolize::{
    source::{Elf, Kernel, Source},
    Input, Symbolized, Symbolizer,
};
use libbpf_rs::{MapCore, MapFlags};

use super::{
    perfmap::{self, JitSymbol, Tally},
    procroot::{LastSymlink, Root},
    runtime::{self, Frames, Names, Part, RtStack},
};

/// Deepest stack the kernel records (PERF_MAX_STACK_DEPTH).
pub const MAX_DEPTH: usize = 127;
/// offcpu.h's OC_WAKER_NOT_WALKED: a waker whose stack was not walked.
const WAKER_NOT_WALKED: i32 = -2;

/// How a walked user stack was made (`struct unw_stack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    /// How the walk ended (`enum unw_end`).
    pub end: u8,
    /// `UNW_HOW_*` bits: frames from tables, frames from frame pointers.
    pub how: u8,
    /// 1 + the index (leaf first) of the first signal trampoline frame, or 0.
    pub sigframe: u16,
    /// Which image of its process it was walked in (how often the process
    /// had exec'd: [`super::unwind::Session::generation`]).
    pub gen: u32,
}

/// One row of the in-kernel count map with its stacks resolved to addresses.
#[derive(Debug, Clone)]
pub struct RawSample {
    /// Process (tgid).
    pub pid: u32,
    /// Thread, or 0 when samples are not split by thread.
    pub tid: u32,
    /// The thread's name at the sample.
    pub comm: String,
    /// Kernel stack, leaf first (empty when not captured).
    pub kstack: Vec<u64>,
    /// User stack, leaf first (empty when not captured).
    pub ustack: Vec<u64>,
    /// For a user stack walked from unwind tables: how the walk went.
    pub walk: Option<Walk>,
    /// Language frames the kernel read beside the walk (`runtime.h`).
    pub lang: Option<Rc<RtStack>>,
    /// Sampled while the kernel rewrote the thread's user registers to
    /// enter or leave a signal handler: no user stack was taken.
    pub in_signal: bool,
    /// Samples (or the tool's weight) with these stacks.
    pub count: u64,
}

fn comm_of(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The maps stacks are read from: the stack-trace map of frame-pointer
/// stacks and the kernel's, and the walked user stacks (`unw_walked`).
#[derive(Clone, Copy)]
pub struct StackMaps<'a> {
    /// `stk_traces`.
    pub traces: &'a dyn MapCore,
    /// `unw_walked`.
    pub walked: &'a dyn MapCore,
    /// `rt_walked`: language frames of walked stacks.
    pub rt_walked: &'a dyn MapCore,
}

/// The [`StackMaps`] of a loaded skeleton `$skel`.
#[macro_export]
macro_rules! stack_maps {
    ($skel:expr) => {{
        let m = &$skel.maps;
        $crate::engine::stacks::StackMaps { traces: &m.stk_traces, walked: &m.unw_walked, rt_walked: &m.rt_walked }
    }};
}

/// Sets the kernel code a perf-event sample takes no user stack in
/// (`stk_sig_code`, stacks.h: the functions that rewrite a thread's user
/// registers for a signal) on an open skeleton `$open` whose sampler uses
/// `STK_CAPTURE_SAMPLE`. Costs one read of `/proc/kallsyms` per run
/// (about 50 ms), so only samplers call it.
#[macro_export]
macro_rules! set_sample_stacks {
    ($open:expr) => {{
        let rodata = $open.maps.rodata_data.as_deref_mut().expect("rodata present");
        let n = rodata.stk_sig_code.len() / 2;
        for (i, (lo, hi)) in $crate::engine::symbols::signal_register_ranges(n).into_iter().enumerate() {
            rodata.stk_sig_code[2 * i] = lo;
            rodata.stk_sig_code[2 * i + 1] = hi;
        }
    }};
}

/// The `ustack` id of a sample taken while the kernel rewrote the thread's
/// user registers for a signal (stacks.h, `STK_SIGNAL`).
const USTACK_SIGNAL: i32 = -2;

/// Reads every `stk_key` -> count of `counts` and the stacks they name.
/// Stacks are read once per id.
pub fn read_samples(counts: &dyn MapCore, maps: StackMaps<'_>) -> anyhow::Result<Vec<RawSample>> {
    Ok(read_keyed(counts, maps)?.into_iter().map(|(s, _)| s).collect())
}

/// For keys that carry a waker after the `stk_key` (offcpu's `oc_wake_key`:
/// `struct oc_waker` at byte 40): (blocked, waker, whether the waker's stack
/// was walked) triples; the waker's count is the blocked one's.
pub fn read_wake_pairs(counts: &dyn MapCore, maps: StackMaps<'_>) -> anyhow::Result<Vec<(RawSample, RawSample, bool)>> {
    read_keyed(counts, maps)?
        .into_iter()
        .map(|(b, w)| {
            w.map(|(w, walked)| (b, w, walked)).ok_or_else(|| anyhow::anyhow!("count map key without a waker"))
        })
        .collect()
}

/// The addresses (leaf first) of stack `id` in a stack-trace map; empty for
/// a negative id (not captured) or one the map no longer holds.
pub fn read_stack(traces: &dyn MapCore, id: i32) -> anyhow::Result<Vec<u64>> {
    if id < 0 {
        return Ok(Vec::new());
    }
    let v = traces.lookup(&id.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
    Ok(v.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).take_while(|&a| a != 0).collect())
}

/// The addresses (leaf first) of kernel stack `id` taken in a return probe
/// (kretprobe): as [`read_stack`], but a first frame of 0 is the return
/// probe's trampoline, `trampoline` (its kallsyms address, or 0: unnamed).
/// Before 5.15, arm64's trampoline handed its handler registers without a
/// pc, so the stack starts with 0 and goes on from the caller's frame
/// record (x86-64's ends at the trampoline instead).
pub fn read_return_probe_stack(traces: &dyn MapCore, id: i32, trampoline: u64) -> anyhow::Result<Vec<u64>> {
    if id < 0 {
        return Ok(Vec::new());
    }
    let v = traces.lookup(&id.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
    Ok(return_probe_stack(&v, trampoline))
}

fn return_probe_stack(v: &[u8], trampoline: u64) -> Vec<u64> {
    let a: Vec<u64> = v.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    match a.as_slice() {
        [0, rest @ ..] if rest.first().is_some_and(|&x| x != 0) => {
            std::iter::once(trampoline).chain(rest.iter().copied().take_while(|&x| x != 0)).collect()
        }
        _ => a.into_iter().take_while(|&x| x != 0).collect(),
    }
}

/// A walked user stack (`struct unw_stack`): pcs leaf first and how the
/// walk went; None when `walked` does not hold `hash`.
pub fn read_walked(walked: &dyn MapCore, hash: u64) -> anyhow::Result<Option<(Vec<u64>, Walk)>> {
    if hash == 0 {
        return Ok(None);
    }
    let Some(v) = walked.lookup(&hash.to_ne_bytes(), MapFlags::ANY)? else { return Ok(None) };
    // struct unw_stack: len, end, how, sigframe, gen, pad, then the pcs.
    const HEAD: usize = 16;
    if v.len() < HEAD {
        return Ok(None);
    }
    let len = (u32::from_ne_bytes(v[..4].try_into().unwrap()) as usize).min(MAX_DEPTH).min((v.len() - HEAD) / 8);
    let pcs = v[HEAD..HEAD + len * 8].chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    let gen = u32::from_ne_bytes(v[8..12].try_into().unwrap());
    Ok(Some((pcs, Walk { end: v[4], how: v[5], sigframe: u16::from_ne_bytes([v[6], v[7]]), gen })))
}

/// A user stack as a tool's record names it (frame-pointer stack id,
/// walked hash): addresses leaf first, how the walk went, language frames.
pub fn read_user_stack(maps: StackMaps<'_>, id: i32, hash: u64) -> anyhow::Result<UserStack> {
    StackReader { maps, ids: HashMap::new(), walked: HashMap::new() }.user(id, hash)
}

/// What [`read_user_stack`] gives.
pub type UserStack = (Vec<u64>, Option<Walk>, Option<Rc<RtStack>>);

/// A count-map row: the sample, and for wakeup keys the waker and whether
/// its stack was walked.
type Keyed = (RawSample, Option<(RawSample, bool)>);

/// Bytes of `struct stk_key`; `struct oc_waker` follows it in wakeup keys.
const KEY_BYTES: usize = 40;

/// Reads stacks once per id or hash.
struct StackReader<'a> {
    maps: StackMaps<'a>,
    ids: HashMap<i32, Vec<u64>>,
    walked: HashMap<u64, Option<UserStack>>,
}

impl StackReader<'_> {
    fn id(&mut self, id: i32) -> anyhow::Result<Vec<u64>> {
        if id < 0 {
            return Ok(Vec::new());
        }
        if let Some(s) = self.ids.get(&id) {
            return Ok(s.clone());
        }
        let s = read_stack(self.maps.traces, id)?;
        self.ids.insert(id, s.clone());
        Ok(s)
    }

    /// The user stack of (frame-pointer id, walked hash), with its
    /// language frames.
    fn user(&mut self, id: i32, hash: u64) -> anyhow::Result<UserStack> {
        if hash == 0 {
            return Ok((self.id(id)?, None, None));
        }
        if !self.walked.contains_key(&hash) {
            let w = match read_walked(self.maps.walked, hash)? {
                Some((pcs, w)) => {
                    let rt = if w.how & runtime::HOW_RT != 0 {
                        self.maps
                            .rt_walked
                            .lookup(&hash.to_ne_bytes(), MapFlags::ANY)?
                            .and_then(|v| RtStack::decode(&v))
                            .map(Rc::new)
                    } else {
                        None
                    };
                    Some((pcs, Some(w), rt))
                }
                None => None,
            };
            self.walked.insert(hash, w);
        }
        Ok(match &self.walked[&hash] {
            Some((pcs, w, rt)) => (pcs.clone(), *w, rt.clone()),
            None => (Vec::new(), None, None),
        })
    }
}

fn read_keyed(counts: &dyn MapCore, maps: StackMaps<'_>) -> anyhow::Result<Vec<Keyed>> {
    let mut rd = StackReader { maps, ids: HashMap::new(), walked: HashMap::new() };
    let mut out = Vec::new();
    for key in counts.keys() {
        if key.len() < KEY_BYTES {
            continue;
        }
        let Some(val) = counts.lookup(&key, MapFlags::ANY)? else { continue };
        let u32_at = |o: usize| u32::from_ne_bytes(key[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(key[o..o + 8].try_into().unwrap());
        let count = u64::from_ne_bytes(val[..8].try_into().unwrap());
        let (ustack, walk, lang) = rd.user(u32_at(12) as i32, u64_at(16))?;
        let blocked = RawSample {
            pid: u32_at(0),
            tid: u32_at(4),
            comm: comm_of(&key[24..40]),
            kstack: rd.id(u32_at(8) as i32)?,
            ustack,
            walk,
            lang,
            in_signal: u32_at(12) as i32 == USTACK_SIGNAL,
            count,
        };
        // struct oc_waker: kstack, ustack, uhash, pid, comm.
        let w = KEY_BYTES;
        let waker = if key.len() >= w + 36 {
            let wk = u32_at(w) as i32;
            let (ustack, walk, lang) = rd.user(u32_at(w + 4) as i32, u64_at(w + 8))?;
            Some((
                RawSample {
                    pid: u32_at(w + 16),
                    tid: 0,
                    comm: comm_of(&key[w + 20..w + 36]),
                    kstack: rd.id(wk)?,
                    ustack,
                    walk,
                    lang,
                    in_signal: false,
                    count,
                },
                wk != WAKER_NOT_WALKED,
            ))
        } else {
            None
        };
        out.push((blocked, waker));
    }
    Ok(out)
}

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// Kernel code (kallsyms).
    Kernel,
    /// Code from an ELF file mapped by the process.
    User,
    /// Code named by the process's perf map (JIT).
    Jit,
    /// A Go function, named from the binary's own function table.
    Go,
    /// A function of a language runtime (Python, Java, JavaScript), read
    /// from the runtime's own frames ([`runtime::plugin::Lang`]).
    Lang(&'static runtime::plugin::Lang),
    /// An address nothing could name.
    Unknown,
    /// Marks a user stack cut short (no frame pointers, or deeper than the
    /// kernel records): the frames above it are missing.
    Truncated,
}

impl FrameKind {
    /// Its name in `--json` (`"kind"`).
    pub fn name(&self) -> &'static str {
        match self {
            FrameKind::Kernel => "kernel",
            FrameKind::User => "user",
            FrameKind::Jit => "jit",
            FrameKind::Go => "go",
            FrameKind::Lang(l) => l.kind,
            FrameKind::Unknown => "unknown",
            FrameKind::Truncated => "truncated",
        }
    }
}

/// One symbolized frame. Inlined functions are frames of their own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name (demangled), or `[unknown]` / `[truncated]`.
    pub name: String,
    /// Source file, when debug info has it.
    pub file: Option<String>,
    /// Source line, when debug info has it.
    pub line: Option<u32>,
    /// Which kind of code.
    pub kind: FrameKind,
    /// The ELF file or `[kernel]` / `[jit]` it came from.
    pub module: Rc<str>,
    /// Whether it was inlined into the frame below it (its caller).
    pub inlined: bool,
}

impl Frame {
    fn simple(name: &str, kind: FrameKind, module: Rc<str>) -> Frame {
        Frame { name: name.to_string(), file: None, line: None, kind, module, inlined: false }
    }
}

/// A mapped file held open so it can be read after its process exits.
struct MappedFile {
    /// The path as the process's maps show it.
    shown: Rc<str>,
    /// A path we can always open: /proc/self/fd/N of `_file`.
    open_path: PathBuf,
    _file: File,
}

struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    file: Rc<MappedFile>,
}

/// What we keep of a process while it lives.
struct Image {
    name: String,
    maps: Vec<Mapping>,
    /// Named ranges from the perf map, sorted by start.
    jit: Vec<JitSymbol>,
    /// What came of the perf map.
    jit_note: perfmap::Note,
    /// Where reading the perf map stopped (a process alive goes on writing).
    jit_cursor: Option<perfmap::Cursor>,
    /// When the perf map was last looked for (one made later is found).
    jit_looked: std::time::Instant,
}

/// How often a process with no perf map is looked at again for one (a JIT
/// may make it after sonde's first look, e.g. right after its exec).
const JIT_LOOK_AGAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Where an address of a process lies.
enum Place {
    Elf { file: Rc<MappedFile>, offset: u64 },
    Jit(String),
    Unknown,
}

/// Snapshots of processes' mappings, taken while they live.
#[derive(Default)]
pub struct Images {
    /// By process and image (its generation: an exec makes a new one).
    by_pid: HashMap<(u32, u32), Image>,
    /// Per process, the newest image seen.
    latest: HashMap<u32, u32>,
    files: HashMap<(u64, u64), Rc<MappedFile>>,
    /// The kernel's vDSO image (the same in every process of an
    /// architecture), copied once from our own process into a memfd.
    vdso: Option<Option<Rc<MappedFile>>>,
    /// Processes whose perf map was warned about (once each).
    warned: HashSet<u32>,
    /// Code objects of language runtimes named during the run.
    lang: Names,
    /// What stacks show of them (`--frames`).
    frames: Frames,
}

/// This process's `[vdso]` as a file: a memfd holding a copy of it (the
/// vDSO is one image for every process on this kernel). Read at offset 0.
pub fn own_vdso() -> Option<File> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let (s, e) = line.split_whitespace().next()?.split_once('-')?;
    let (start, end) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
    let mut mem = File::open("/proc/self/mem").ok()?;
    mem.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = vec![0u8; end.checked_sub(start)? as usize];
    mem.read_exact(&mut buf).ok()?;
    // SAFETY: memfd_create with a valid C string.
    let fd = unsafe { libc::memfd_create(c"sonde-vdso".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd was just created and is owned by nothing else.
    let mut f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    f.write_all(&buf).ok()?;
    f.seek(SeekFrom::Start(0)).ok()?;
    Some(f)
}

/// [`own_vdso`] as a mapped file blazesym can read.
fn copy_own_vdso() -> Option<Rc<MappedFile>> {
    let f = own_vdso()?;
    Some(Rc::new(MappedFile {
        shown: Rc::from("[vdso]"),
        open_path: PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
        _file: f,
    }))
}

impl Images {
    /// Takes a snapshot of `pid` unless there is one; call it as soon as a
    /// process shows up in the samples. Fails quietly if the process is gone.
    pub fn observe(&mut self, pid: u32) {
        let gen = self.latest.get(&pid).copied().unwrap_or(0);
        self.observe_image(pid, gen);
    }

    /// Takes a snapshot of image `gen` of `pid` (what it runs now, which the
    /// caller knows to be that image) unless there is one.
    pub fn observe_image(&mut self, pid: u32, gen: u32) {
        if pid == 0 || self.by_pid.contains_key(&(pid, gen)) {
            return;
        }
        if let Some(img) = self.snapshot(pid) {
            self.by_pid.insert((pid, gen), img);
            let l = self.latest.entry(pid).or_insert(gen);
            *l = (*l).max(gen);
        }
    }

    /// Keeps image `gen` of `pid` (what it runs now) up to date while it
    /// lives: snapshots it if new, else reads what the process added to its
    /// perf map since (a JIT names code it compiles later there: V8's
    /// regular expressions, a JVM agent's methods), or looks again, every
    /// [`JIT_LOOK_AGAIN`], for a map it had none of; call it every few
    /// hundred ms. A process that exits before the end is then named from
    /// its map as it was at most that long before.
    pub fn keep_up(&mut self, pid: u32, gen: u32) {
        if pid == 0 {
            return;
        }
        let Some(mut img) = self.by_pid.remove(&(pid, gen)) else {
            self.observe_image(pid, gen);
            return;
        };
        if img.jit_cursor.is_some() {
            self.read_on(pid, &mut img);
        } else if (img.jit_note.refused.is_none() || img.jit_note.stale.is_some())
            && img.jit_looked.elapsed() >= JIT_LOOK_AGAIN
        {
            // The map alone (a jitdump was read with the mappings).
            let (jit, note, cursor) = perfmap::load_map(pid, img.jit_note.stale);
            img.jit_looked = std::time::Instant::now();
            if img.jit_note.stale.is_some() && note.stale.is_none() {
                // An earlier process's map, refused, gone or written to by
                // this one since: that refusal no longer stands, and what
                // comes of the map now is said anew.
                img.jit_note.refused = None;
                img.jit_note.stale = None;
                self.warned.remove(&pid);
            }
            // Found now, read or refused (a refusal is said and counted,
            // and not looked for again, but for an earlier process's map).
            if cursor.is_some() || (note.refused.is_some() && img.jit_note.stale.is_none()) {
                img.jit.extend(jit);
                img.jit.sort_by_key(|j| j.start);
                img.jit_note.absorb(note);
                img.jit_cursor = cursor;
                self.warn_once(pid, &img.jit_note);
            }
        }
        self.by_pid.insert((pid, gen), img);
    }

    /// Reads what `pid` appended to the perf map `img` read (it has a cursor).
    fn read_on(&mut self, pid: u32, img: &mut Image) {
        let Some(cur) = img.jit_cursor.as_mut() else { return };
        let Some((m, redone)) = perfmap::read_more(pid, cur) else { return };
        let path = cur.path().to_string();
        let note = &mut img.jit_note;
        let source = |note: &mut perfmap::Note| -> usize {
            match note.sources.iter().position(|(what, _)| *what == path) {
                Some(i) => i,
                None => {
                    note.sources.insert(0, (path.clone(), 0));
                    0
                }
            }
        };
        if let Some(old) = redone {
            // Read from an unfinished line: the whole line replaces it (or
            // it is gone, skipped). Only that very symbol: another may
            // start at the same address.
            if let Some(i) = img.jit.iter().position(|j| *j == old) {
                img.jit.remove(i);
                let k = source(note);
                note.sources[k].1 = note.sources[k].1.saturating_sub(1);
            }
        }
        if !m.symbols.is_empty() {
            let k = source(note);
            note.sources[k].1 += m.symbols.len();
        }
        note.sources.retain(|(_, n)| *n > 0);
        note.skipped += m.skipped;
        note.cut = note.cut.take().or(m.cut);
        img.jit.extend(m.symbols);
        img.jit.sort_by_key(|j| j.start);
        self.warn_once(pid, &img.jit_note);
    }

    /// Prints `note`'s warning for `pid`, once per process.
    fn warn_once(&mut self, pid: u32, note: &perfmap::Note) {
        if let Some(w) = note.warning(pid) {
            if self.warned.insert(pid) {
                eprintln!("{w}");
            }
        }
    }

    /// Snapshots image `gen` of `pid` whose executable mappings were just
    /// read by the unwinder: taken if new, read again if it was (a library
    /// loaded since).
    pub fn observe_loaded(&mut self, pid: u32, gen: u32) {
        if pid == 0 {
            return;
        }
        if self.by_pid.contains_key(&(pid, gen)) {
            self.snapshot_again(pid, gen);
        } else {
            self.observe_image(pid, gen);
        }
    }

    /// Re-reads the mappings of a live process (code loaded since): its
    /// newest image, which is what it runs.
    pub fn refresh(&mut self, pid: u32) {
        let gen = self.latest.get(&pid).copied().unwrap_or(0);
        self.snapshot_again(pid, gen);
    }

    /// Takes image `gen` of `pid` again, unless the process has no mapping
    /// left: one that exited and that its parent has not reaped yet (a
    /// zombie) still has a /proc entry, with empty maps, and its samples
    /// are named from what was taken while it ran.
    ///
    /// A perf map read before is read on from where it stopped, not again
    /// from its start: its bounds hold for all of a run's reads of it.
    fn snapshot_again(&mut self, pid: u32, gen: u32) {
        let Some(mut img) = self.snapshot_maps(pid) else { return };
        let old = self.by_pid.remove(&(pid, gen));
        match old {
            Some(old) if img.maps.is_empty() && !old.maps.is_empty() => {
                self.by_pid.insert((pid, gen), old);
                return;
            }
            Some(old) if old.jit_cursor.is_some() => {
                (img.jit, img.jit_note, img.jit_cursor, img.jit_looked) =
                    (old.jit, old.jit_note, old.jit_cursor, old.jit_looked);
                self.read_on(pid, &mut img);
            }
            Some(old) => {
                let earlier = old.jit_note.stale;
                self.load_jit(pid, &mut img, earlier);
            }
            None => self.load_jit(pid, &mut img, None),
        }
        self.by_pid.insert((pid, gen), img);
    }

    /// The image a stack of `pid` walked in image `gen` is named from: that
    /// one, else the newest (a stack the kernel's frame-pointer walk took
    /// carries none).
    fn image(&self, pid: u32, gen: Option<u32>) -> Option<&Image> {
        let newest = || self.latest.get(&pid).and_then(|g| self.by_pid.get(&(pid, *g)));
        match gen {
            Some(g) => self.by_pid.get(&(pid, g)).or_else(newest),
            None => newest(),
        }
    }

    /// Hands over the language runtimes' names read during the run
    /// ([`super::unwind::Session::finish_names`]) and the `--frames` view.
    pub fn set_lang(&mut self, names: Names, frames: Frames) {
        self.lang = names;
        self.frames = frames;
    }

    /// The process's name (its main thread's comm) when we saw it alive.
    pub fn name(&self, pid: u32) -> Option<&str> {
        self.image(pid, None).map(|i| i.name.as_str())
    }

    /// What came of the perf maps of every process seen (each as last read).
    pub fn perf_maps(&self) -> Tally {
        let mut t = Tally::default();
        self.by_pid.iter().for_each(|((pid, _), i)| t.add(*pid, &i.jit_note));
        t
    }

    /// A snapshot of `pid`: its mappings and its perf map.
    fn snapshot(&mut self, pid: u32) -> Option<Image> {
        let mut img = self.snapshot_maps(pid)?;
        self.load_jit(pid, &mut img, None);
        Some(img)
    }

    /// Reads `pid`'s perf map (and jitdump) into `img`, from the start (or,
    /// appended to an `earlier` process's map, from that one's end).
    fn load_jit(&mut self, pid: u32, img: &mut Image, earlier: Option<perfmap::Earlier>) {
        (img.jit, img.jit_note, img.jit_cursor) = perfmap::load(pid, earlier);
        img.jit_looked = std::time::Instant::now();
        if earlier.is_some() && img.jit_note.stale.is_none() {
            // What comes of the process's own map is said anew.
            self.warned.remove(&pid);
        }
        self.warn_once(pid, &img.jit_note);
    }

    /// `pid`'s mappings and name, no perf map read yet.
    fn snapshot_maps(&mut self, pid: u32) -> Option<Image> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?.trim_end().to_string();
        let mut out = Vec::new();
        for line in maps.lines() {
            let Some(super::process::MapLine { start, end, offset, exec, path }) =
                super::process::parse_maps_line(line)
            else {
                continue;
            };
            if !exec || !(path.starts_with('/') || path == "[vdso]") {
                continue;
            }
            let file = if path == "[vdso]" {
                self.vdso.get_or_insert_with(copy_own_vdso).clone()
            } else {
                // map_files names ranges without the zero padding maps shows.
                self.open_mapped(pid, &format!("{start:x}-{end:x}"), &path)
            };
            let Some(file) = file else { continue };
            out.push(Mapping { start, end, offset, file });
        }
        Some(Image {
            name,
            maps: out,
            jit: Vec::new(),
            jit_note: perfmap::Note::default(),
            jit_cursor: None,
            jit_looked: std::time::Instant::now(),
        })
    }

    fn open_mapped(&mut self, pid: u32, range: &str, shown: &str) -> Option<Rc<MappedFile>> {
        // map_files works through mount namespaces and for deleted files;
        // the path inside the process's root is the fallback (opened so that
        // its symlinks and `..` cannot lead out of that root).
        let f = File::open(format!("/proc/{pid}/map_files/{range}")).ok().or_else(|| {
            let path = Path::new(shown.trim_end_matches(" (deleted)"));
            Root::of_process(pid).ok()?.open(path, LastSymlink::Follow).ok()
        })?;
        let md = f.metadata().ok()?;
        let key = (md.dev(), md.ino());
        if let Some(m) = self.files.get(&key) {
            return Some(m.clone());
        }
        let m = Rc::new(MappedFile {
            shown: Rc::from(shown),
            open_path: PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
            _file: f,
        });
        self.files.insert(key, m.clone());
        Some(m)
    }

    fn place(&self, pid: u32, gen: Option<u32>, addr: u64) -> Place {
        let Some(img) = self.image(pid, gen) else { return Place::Unknown };
        if let Some(m) = img.maps.iter().find(|m| (m.start..m.end).contains(&addr)) {
            return Place::Elf { file: m.file.clone(), offset: addr - m.start + m.offset };
        }
        let i = img.jit.partition_point(|j| j.start <= addr);
        if i > 0 {
            let j = &img.jit[i - 1];
            if (j.start..j.end).contains(&addr) {
                return Place::Jit(j.name.clone());
            }
        }
        Place::Unknown
    }

    fn covers(&self, pid: u32, gen: Option<u32>, addr: u64) -> bool {
        !matches!(self.place(pid, gen, addr), Place::Unknown)
    }
}

/// Names of functions where a complete user stack starts: a stack that
/// reaches none of them was cut short.
fn is_stack_root(name: &str) -> bool {
    const ROOTS: &[&str] = &[
        "_start",
        "__libc_start_main",
        "__libc_start_call_main",
        "start_thread",
        "clone",
        "__clone",
        "clone3",
        "__clone3",
        "thread_start",
        "_dl_start_user",
        "runtime.goexit",
        "runtime.goexit.abi0",
        "runtime.rt0_go",
        "runtime.rt0_go.abi0",
        "runtime.mstart",
    ];
    ROOTS.contains(&name)
}

/// A symbolized stack, root first, with what it weighs.
#[derive(Debug, Clone)]
pub struct Stack {
    /// Process (tgid).
    pub pid: u32,
    /// Thread, when split by thread.
    pub tid: u32,
    /// Process name (the root of a flame graph).
    pub process: String,
    /// Frames from the outermost user frame to the innermost kernel frame.
    pub frames: Vec<Frame>,
    /// Samples.
    pub count: u64,
}

/// Total weight of the stacks for which `pred` holds (labs and tests check
/// shares of a profile this way).
pub fn weight_where(stacks: &[Stack], pred: impl Fn(&Stack) -> bool) -> u64 {
    stacks.iter().filter(|s| pred(s)).map(|s| s.count).sum()
}

/// Total weight of the stacks with a frame named `name`.
pub fn weight_under(stacks: &[Stack], name: &str) -> u64 {
    weight_where(stacks, |s| s.frames.iter().any(|f| f.name == name))
}

/// What symbolization found, for the summary.
#[derive(Debug, Default, Clone)]
pub struct SymStats {
    /// Stacks (weighted by samples) whose user part was cut short.
    pub truncated_samples: u64,
    /// The same by why: `frame_pointers` (the kernel's frame-pointer walk
    /// found no program start), `fp_chain` (a table walk ended in a
    /// frame-pointer chain short of the start), or a walk's cut reason
    /// (`depth`, `bad_read`, `no_table`, `table_gap`, `unsupported`,
    /// `no_progress`).
    pub truncated_by: std::collections::BTreeMap<&'static str, u64>,
    /// Unique stacks whose user part was cut short.
    pub truncated_stacks: u64,
    /// Samples taken while the kernel rewrote the thread's user registers
    /// to enter or leave a signal handler: no user stack could be walked
    /// (shown as `[signal delivery]`, not cut short).
    pub signal_samples: u64,
    /// Frames no source could name.
    pub unknown_frames: u64,
    /// Unique user addresses symbolized.
    pub user_addrs: u64,
    /// Unique kernel addresses symbolized.
    pub kernel_addrs: u64,
    /// What came of the processes' perf maps.
    pub perf_maps: Tally,
    /// Mapped files the symbolizer could not read (malformed, crafted or
    /// gone), by reason: their frames are `[unknown]` in their module. Also
    /// `dwarf_skipped`: files named from their symbol tables only.
    pub unsymbolized_files: std::collections::BTreeMap<&'static str, u64>,
    /// Samples (weight) whose stack has language frames.
    pub lang_samples: u64,
    /// Language frames (in unique stacks) whose code object was not named.
    pub lang_unnamed_frames: u64,
    /// Unique stacks whose interpreter-loop frames and language frames did
    /// not pair up one to one (kept, see [`runtime::merge`]).
    pub lang_unpaired_stacks: u64,
}

/// One symbolizer for the whole run; each unique address is symbolized once.
pub struct Symbols {
    sym: Symbolizer,
    kernel: HashMap<u64, Vec<Frame>>,
    user: HashMap<(usize, u64), Vec<Frame>>,
    kmod: Rc<str>,
    jitmod: Rc<str>,
    unknown: Rc<str>,
    build_ids: HashMap<String, String>,
    /// Go binaries' function tables, by mapped file (None: not Go).
    go: HashMap<usize, Option<Rc<GoFile>>>,
    /// PLT stubs' file-offset ranges, by mapped file.
    plt: HashMap<usize, Vec<(u64, u64)>>,
}

/// A Go binary's table and where its segments lie in the file.
struct GoFile {
    table: runtime::go::Pclntab,
    segments: Vec<super::unwind::elf::Segment>,
}

impl GoFile {
    /// The file's virtual address at file offset `off`.
    fn vaddr(&self, off: u64) -> Option<u64> {
        let s = self.segments.iter().find(|s| s.offset <= off && off < s.offset + s.filesz)?;
        Some(off - s.offset + s.vaddr)
    }
}

/// The symbolizer every stack tool uses: code locations, inlined calls and
/// demangled names.
fn new_symbolizer() -> Symbolizer {
    Symbolizer::builder().enable_code_info(true).enable_inlined_fns(true).enable_demangling(true).build()
}

/// Why a mapped file was not symbolized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileFailure {
    /// The symbolizer returned an error (a malformed or unreadable file).
    Error(String),
    /// Not handed to the symbolizer: a compressed section it needs would
    /// inflate without bound ([`super::elfcheck`]).
    Refused(String),
    /// The symbolizer panicked on it (a crafted file): caught, the
    /// symbolizer replaced, the run goes on.
    Panicked(String),
}

impl FileFailure {
    /// The reason counted in [`SymStats::unsymbolized_files`].
    pub fn reason(&self) -> &'static str {
        match self {
            FileFailure::Error(_) => "unreadable",
            FileFailure::Refused(_) => "malformed",
            FileFailure::Panicked(_) => "symbolizer_panicked",
        }
    }
}

/// What [`Symbols::file_frames`] found in one file.
#[derive(Debug, Clone)]
pub struct FileFrames {
    /// Its GNU build ID (hex), when it has one.
    pub build_id: Option<String>,
    /// The frames at each offset asked for, outermost first.
    pub frames: Vec<Vec<Frame>>,
    /// Why its DWARF was not read (names come from its symbol tables
    /// only); "panicked: ..." when the symbolizer panicked reading it.
    pub no_debug: Option<String>,
}

impl Default for Symbols {
    fn default() -> Self {
        Symbols {
            sym: new_symbolizer(),
            kernel: HashMap::new(),
            user: HashMap::new(),
            kmod: Rc::from("[kernel]"),
            jitmod: Rc::from("[jit]"),
            unknown: Rc::from("[unknown]"),
            build_ids: HashMap::new(),
            go: HashMap::new(),
            plt: HashMap::new(),
        }
    }
}

fn frames_of(s: Symbolized<'_>, module: &Rc<str>, kind: FrameKind, unknown: &Rc<str>) -> Vec<Frame> {
    match s {
        Symbolized::Sym(sym) => {
            let code = |c: &blazesym::symbolize::CodeInfo<'_>| {
                let file = match &c.dir {
                    Some(d) if !d.as_os_str().is_empty() => d.join(&c.file).to_string_lossy().into_owned(),
                    _ => c.file.to_string_lossy().into_owned(),
                };
                (Some(file), c.line)
            };
            // blazesym: `sym` is the outermost function; `inlined` lists the
            // calls inlined into it, outermost first. The location of the
            // address is the innermost's; each outer one is at its call site.
            let mut out = Vec::with_capacity(1 + sym.inlined.len());
            let (file, line) = sym.code_info.as_deref().map(code).unwrap_or((None, None));
            out.push(Frame { name: sym.name.to_string(), file, line, kind, module: module.clone(), inlined: false });
            for f in sym.inlined.iter() {
                let (file, line) = f.code_info.as_ref().map(code).unwrap_or((None, None));
                out.push(Frame { name: f.name.to_string(), file, line, kind, module: module.clone(), inlined: true });
            }
            out
        }
        // The file is known even when no symbol covers the address (a
        // stripped binary): keep it, as perf does.
        Symbolized::Unknown(_) => vec![Frame::simple(
            "[unknown]",
            FrameKind::Unknown,
            if kind == FrameKind::User { module.clone() } else { unknown.clone() },
        )],
    }
}

impl Symbols {
    /// Build IDs (hex) of the files symbolized so far, by the path the
    /// processes' maps show.
    pub fn build_ids(&self) -> &HashMap<String, String> {
        &self.build_ids
    }

    /// The frames at file offsets `offs` of the ELF file at `path` (a file
    /// a traced process mapped, so possibly crafted), its build ID (hex), and
    /// why its DWARF was not read if it was not. Never panics and never
    /// aborts: compressed sections are checked first ([`super::elfcheck`]),
    /// a panic inside the symbolizer is caught, the symbolizer (whose caches
    /// it may have left half-built) replaced, and the file reported as
    /// [`FileFailure::Panicked`].
    pub fn file_frames(&mut self, path: &Path, module: &Rc<str>, offs: &[u64]) -> Result<FileFrames, FileFailure> {
        let verdict = match File::open(path) {
            Ok(f) => super::elfcheck::check(f),
            Err(e) => return Err(FileFailure::Error(e.to_string())),
        };
        let no_debug = match verdict {
            super::elfcheck::Verdict::Whole => None,
            super::elfcheck::Verdict::NoDebug(why) => Some(why),
            super::elfcheck::Verdict::Refused(why) => return Err(FileFailure::Refused(why)),
            super::elfcheck::Verdict::NotElf => return Err(FileFailure::Error("not an ELF file".into())),
        };
        let unknown = self.unknown.clone();
        let sym = &self.sym;
        let run = || -> Result<FileFrames, FileFailure> {
            let build_id = match blazesym::helper::read_elf_build_id(path) {
                Ok(Some(id)) => Some(id.iter().map(|b| format!("{b:02x}")).collect()),
                _ => None,
            };
            let with = |debug: bool| {
                let mut elf = Elf::new(path);
                elf.debug_syms = debug;
                sym.symbolize(&Source::Elf(elf), Input::FileOffset(offs))
                    .map(|syms| syms.into_iter().map(|s| frames_of(s, module, FrameKind::User, &unknown)).collect())
            };
            let mut no_debug = no_debug.clone();
            let frames = match with(no_debug.is_none()) {
                Ok(f) => f,
                // DWARF the symbolizer cannot read fails the whole file:
                // the symbol tables may still name its functions.
                Err(e) if no_debug.is_none() => {
                    let f = with(false).map_err(|e| FileFailure::Error(format!("{e:#}")))?;
                    no_debug = Some(format!("{e:#}"));
                    f
                }
                Err(e) => return Err(FileFailure::Error(format!("{e:#}"))),
            };
            Ok(FileFrames { build_id, frames, no_debug })
        };
        match super::elfcheck::guarded(run) {
            Ok(r) => r,
            Err(what) => {
                self.sym = new_symbolizer();
                // Most such panics are in the DWARF reader: the symbol
                // tables alone may still name the file's functions.
                let sym = &self.sym;
                let unknown = self.unknown.clone();
                let retry = super::elfcheck::guarded(|| {
                    let mut elf = Elf::new(path);
                    elf.debug_syms = false;
                    sym.symbolize(&Source::Elf(elf), Input::FileOffset(offs)).map(|syms| {
                        syms.into_iter().map(|s| frames_of(s, module, FrameKind::User, &unknown)).collect::<Vec<_>>()
                    })
                });
                match retry {
                    Ok(Ok(frames)) => {
                        Ok(FileFrames { build_id: None, frames, no_debug: Some(format!("panicked: {what}")) })
                    }
                    Ok(Err(_)) => Err(FileFailure::Panicked(what)),
                    Err(_) => {
                        self.sym = new_symbolizer();
                        Err(FileFailure::Panicked(what))
                    }
                }
            }
        }
    }

    /// A language frame's source frames, outermost first, named from what
    /// was read of its code object (several where a JIT inlined callees).
    fn lang_frames(&self, pid: u32, f: &runtime::RtFrame, images: &Images, stats: &mut SymStats, out: &mut Vec<Frame>) {
        let module = images.lang.module(pid).cloned().unwrap_or_else(|| self.unknown.clone());
        let kind = FrameKind::Lang(runtime::registry::lang(f.kind));
        match images.lang.get(pid, f) {
            Some(c) => {
                for (name, file, line, inlined) in c.frames(f).into_iter().rev() {
                    out.push(Frame {
                        name,
                        file: (!file.is_empty()).then_some(file),
                        line,
                        kind,
                        module: module.clone(),
                        inlined,
                    });
                }
            }
            None => {
                stats.lang_unnamed_frames += 1;
                out.push(Frame::simple("[unknown]", kind, module));
            }
        }
    }

    /// The file-offset ranges of a mapped file's PLT sections, read once.
    fn plt_ranges(&mut self, id: usize, file: &MappedFile) -> Vec<(u64, u64)> {
        self.plt
            .entry(id)
            .or_insert_with(|| {
                let Some(elf) = File::open(&file.open_path).ok().and_then(|f| runtime::elfsym::ElfSyms::open(f).ok())
                else {
                    return Vec::new();
                };
                super::unwind::elf::PLT_SECTIONS
                    .iter()
                    .filter_map(|(n, _)| elf.section_range(n))
                    .filter_map(|(addr, size)| {
                        let s = elf.segments.iter().find(|s| s.vaddr <= addr && addr < s.vaddr + s.filesz)?;
                        let off = addr - s.vaddr + s.offset;
                        Some((off, off + size))
                    })
                    .collect()
            })
            .clone()
    }

    /// The Go table of a mapped file, read once (None: not a Go binary, or
    /// its table is unreadable).
    fn go_file(&mut self, id: usize, file: &MappedFile) -> Option<Rc<GoFile>> {
        self.go
            .entry(id)
            .or_insert_with(|| {
                let f = File::open(&file.open_path).ok()?;
                let elf = runtime::elfsym::ElfSyms::open(f).ok()?;
                let table = super::elfcheck::guarded(|| runtime::go::load(&elf)).ok().flatten()?;
                let _ = super::elfcheck::guarded(|| runtime::go::note_modules(&elf, &file.shown));
                Some(Rc::new(GoFile { table, segments: elf.segments.clone() }))
            })
            .clone()
    }

    /// Symbolizes every sample into a [`Stack`]. `images` must hold the
    /// processes' snapshots (taken while they lived).
    pub fn stacks(&mut self, samples: &[RawSample], images: &mut Images, stats: &mut SymStats) -> Vec<Stack> {
        self.symbolize_kernel(samples, stats);
        let placed = self.symbolize_user(samples, images, stats);
        samples.iter().zip(&placed).map(|(s, places)| self.stack(s, places, images, stats)).collect()
    }

    /// Kernel frames: every address not seen before, in one call.
    fn symbolize_kernel(&mut self, samples: &[RawSample], stats: &mut SymStats) {
        let adj = |i: usize, a: u64| if i == 0 { a } else { a.saturating_sub(1) };
        // Kernel: every new address in one call.
        let mut kaddrs: Vec<u64> = samples
            .iter()
            .flat_map(|s| s.kstack.iter().enumerate().map(|(i, &a)| adj(i, a)))
            .filter(|a| !self.kernel.contains_key(a))
            .collect();
        kaddrs.sort_unstable();
        kaddrs.dedup();
        if !kaddrs.is_empty() {
            stats.kernel_addrs += kaddrs.len() as u64;
            let src = Source::Kernel(Kernel::default());
            match self.sym.symbolize(&src, Input::AbsAddr(&kaddrs)) {
                Ok(syms) => {
                    for (a, s) in kaddrs.iter().zip(syms) {
                        let fr = frames_of(s, &self.kmod, FrameKind::Kernel, &self.unknown);
                        self.kernel.insert(*a, fr);
                    }
                }
                Err(_) => {
                    for a in &kaddrs {
                        self.kernel
                            .insert(*a, vec![Frame::simple(&format!("{a:#x}"), FrameKind::Unknown, self.kmod.clone())]);
                    }
                }
            }
        }
    }

    /// User frames: refreshes snapshots that miss an address (code loaded
    /// later), then groups new offsets per file and symbolizes each file
    /// once. Where each sample's addresses lie, leaf first like its ustack.
    fn symbolize_user(&mut self, samples: &[RawSample], images: &mut Images, stats: &mut SymStats) -> Vec<Vec<Place>> {
        let adj = |i: usize, a: u64| if i == 0 { a } else { a.saturating_sub(1) };
        let mut refreshed = std::collections::HashSet::new();
        let gen = |s: &RawSample| s.walk.map(|w| w.gen);
        for s in samples {
            images.observe(s.pid);
            // Once per process: code without a file or perf map (e.g. a JIT
            // with no map) stays uncovered however often we look. Only the
            // image it runs now can be read again.
            let now = images.latest.get(&s.pid).copied();
            if !refreshed.contains(&s.pid)
                && gen(s).is_none_or(|g| Some(g) == now)
                && s.ustack.iter().any(|&a| !images.covers(s.pid, gen(s), a))
            {
                images.refresh(s.pid);
                refreshed.insert(s.pid);
            }
        }
        // Where each user address lies, looked up once (leaf first, like ustack).
        let placed: Vec<Vec<Place>> = samples
            .iter()
            .map(|s| s.ustack.iter().enumerate().map(|(i, &a)| images.place(s.pid, gen(s), adj(i, a))).collect())
            .collect();
        let mut per_file: HashMap<usize, (Rc<MappedFile>, Vec<u64>)> = HashMap::new();
        for place in placed.iter().flatten() {
            if let Place::Elf { file, offset } = place {
                let id = Rc::as_ptr(file) as usize;
                if !self.user.contains_key(&(id, *offset)) {
                    per_file.entry(id).or_insert_with(|| (file.clone(), Vec::new())).1.push(*offset);
                }
            }
        }
        for (id, (file, mut offs)) in per_file {
            offs.sort_unstable();
            offs.dedup();
            stats.user_addrs += offs.len() as u64;
            let module: Rc<str> = file.shown.clone();
            // Go code is named from the binary's own function table (also
            // stripped ones); what it does not cover (cgo's C) goes on.
            if images.frames != Frames::Native {
                if let Some(g) = self.go_file(id, &file) {
                    offs.retain(|&o| match g.vaddr(o).and_then(|v| g.table.frames(v)) {
                        Some(fr) => {
                            let frames = fr
                                .into_iter()
                                .map(|f| Frame {
                                    name: f.name,
                                    file: f.file,
                                    line: f.line,
                                    kind: FrameKind::Go,
                                    module: module.clone(),
                                    inlined: f.inlined,
                                })
                                .collect();
                            self.user.insert((id, o), frames);
                            false
                        }
                        None => true,
                    });
                    if offs.is_empty() {
                        continue;
                    }
                }
            }
            match self.file_frames(&file.open_path, &module, &offs) {
                Ok(ff) => {
                    if let Some(id) = ff.build_id {
                        self.build_ids.insert(module.to_string(), id);
                    }
                    match &ff.no_debug {
                        Some(why) if why.starts_with("panicked: ") => {
                            *stats.unsymbolized_files.entry("dwarf_panicked").or_default() += 1;
                        }
                        Some(_) => *stats.unsymbolized_files.entry("dwarf_skipped").or_default() += 1,
                        None => {}
                    }
                    // A PLT stub lies past every symbol of its section's
                    // neighbours: the symbolizer names it after the last
                    // one before it (`_init`), which is wrong.
                    let plt = self.plt_ranges(id, &file);
                    for (o, mut fr) in offs.iter().zip(ff.frames) {
                        if plt.iter().any(|(a, b)| (*a..*b).contains(o)) {
                            fr = vec![Frame::simple("[plt]", FrameKind::User, module.clone())];
                        }
                        self.user.insert((id, *o), fr);
                    }
                }
                Err(e) => {
                    *stats.unsymbolized_files.entry(e.reason()).or_default() += 1;
                    for o in &offs {
                        self.user
                            .insert((id, *o), vec![Frame::simple("[unknown]", FrameKind::Unknown, module.clone())]);
                    }
                }
            }
        }
        placed
    }

    /// One sample's stack, root first: its user frames (cut short ones
    /// marked and counted), then its kernel frames without the tracing
    /// program's own.
    fn stack(&self, s: &RawSample, places: &[Place], images: &Images, stats: &mut SymStats) -> Stack {
        let adj = |i: usize, a: u64| if i == 0 { a } else { a.saturating_sub(1) };
        let mut frames: Vec<Frame> = Vec::new();
        // User part, outermost first.
        let mut user: Vec<Frame> = Vec::new();
        let sigframe = s.walk.map_or(0, |w| w.sigframe as usize);
        let (parts, paired) = runtime::merge(places.len(), s.lang.as_deref(), images.frames);
        let mut has_lang = false;
        for part in parts {
            let i = match part {
                Part::Native(i) => i,
                Part::Lang(f) => {
                    has_lang = true;
                    self.lang_frames(s.pid, f, images, stats, &mut user);
                    continue;
                }
            };
            let place = &places[i];
            match place {
                Place::Elf { file, offset } => {
                    let id = Rc::as_ptr(file) as usize;
                    let mut fr = self.user.get(&(id, *offset)).cloned().unwrap_or_default();
                    // The trampoline a signal handler returns through
                    // (glibc's __restore_rt has no exported symbol).
                    if i + 1 == sigframe && fr.len() == 1 && fr[0].kind == FrameKind::Unknown {
                        fr[0].name = "[signal trampoline]".into();
                        fr[0].kind = FrameKind::User;
                    }
                    user.extend(fr);
                }
                Place::Jit(name) => user.push(Frame::simple(name, FrameKind::Jit, self.jitmod.clone())),
                Place::Unknown => user.push(Frame::simple("[unknown]", FrameKind::Unknown, self.unknown.clone())),
            }
        }
        if has_lang {
            stats.lang_samples += s.count;
        }
        if !paired {
            stats.lang_unpaired_stacks += 1;
        }
        let lang_only = has_lang && images.frames == Frames::Lang;
        if !user.is_empty() && !lang_only {
            // A walk that reached a frame whose unwind row says it has
            // no caller is complete. Otherwise: frames outside the
            // outermost known root are leftovers of a frame-pointer walk
            // past it; a stack with no root (or as deep as the kernel
            // records) was cut short.
            let cut = match s.walk.map(|w| w.end) {
                Some(crate::engine::unwind::END_ROOT) => None,
                Some(end) if end != crate::engine::unwind::END_FP_CHAIN => {
                    Some(crate::engine::unwind::CutReasons::name(end).unwrap_or("walk"))
                }
                _ => match user.iter().position(|f| is_stack_root(&f.name)) {
                    Some(r) if s.ustack.len() < MAX_DEPTH => {
                        user.drain(..r);
                        None
                    }
                    _ if s.ustack.len() >= MAX_DEPTH => Some("depth"),
                    _ if s.walk.is_some() => Some("fp_chain"),
                    _ => Some("frame_pointers"),
                },
            };
            if let Some(why) = cut {
                stats.truncated_samples += s.count;
                stats.truncated_stacks += 1;
                *stats.truncated_by.entry(why).or_default() += s.count;
                user.insert(0, Frame::simple("[truncated]", FrameKind::Truncated, self.unknown.clone()));
            }
        }
        if s.in_signal && user.is_empty() {
            // The user registers were half rewritten: the thread stood in
            // the kernel, entering or leaving a signal handler. A kernel
            // frame (`_[k]` in folded output), so that no tool takes it for
            // the program's own code (why's hottest functions, pprof's
            // executable).
            stats.signal_samples += s.count;
            user.push(Frame::simple("[signal delivery]", FrameKind::Kernel, self.kmod.clone()));
        }
        frames.extend(user);
        if has_lang && images.frames == Frames::Lang {
            // Only the language frames: no kernel either.
            let process = images.name(s.pid).map(str::to_string).unwrap_or_else(|| s.comm.clone());
            return Stack { pid: s.pid, tid: s.tid, process, frames, count: s.count };
        }
        // The leaf kernel frames of a stack taken inside a tracing program
        // are the program and its dispatch: not the traced code.
        let own = |f: &Frame| {
            ["bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_"].iter().any(|p| f.name.starts_with(p))
        };
        let skip = s
            .kstack
            .iter()
            .enumerate()
            .take_while(|(i, &a)| self.kernel.get(&adj(*i, a)).is_some_and(|fr| fr.iter().all(own)))
            .count();
        for (i, &a) in s.kstack.iter().enumerate().skip(skip).rev() {
            frames.extend(self.kernel.get(&adj(i, a)).cloned().unwrap_or_default());
        }
        stats.unknown_frames += frames.iter().filter(|f| f.kind == FrameKind::Unknown).count() as u64;
        let process = images.name(s.pid).map(str::to_string).unwrap_or_else(|| s.comm.clone());
        Stack { pid: s.pid, tid: s.tid, process, frames, count: s.count }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_return_probe_stack_without_a_pc_starts_at_the_trampoline() {
        let bytes = |a: &[u64]| a.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        // arm64 5.10: no pc, then the caller's caller on to the syscall entry.
        assert_eq!(return_probe_stack(&bytes(&[0, 0x10, 0x20, 0, 0]), 0x99), vec![0x99, 0x10, 0x20]);
        // x86-64 5.10 and later kernels: as read_stack.
        assert_eq!(return_probe_stack(&bytes(&[0x99, 0, 0]), 0x99), vec![0x99]);
        assert_eq!(return_probe_stack(&bytes(&[0x30, 0x10, 0]), 0x99), vec![0x30, 0x10]);
        // Nothing there.
        assert!(return_probe_stack(&bytes(&[0, 0, 0]), 0x99).is_empty());
        assert!(return_probe_stack(&[], 0x99).is_empty());
    }
}
