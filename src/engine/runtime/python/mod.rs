//! CPython: find the interpreter in a process, tell the kernel how to read
//! its threads' frames (`python.h`, `python_walk.h`), and name the code
//! objects the kernel met (qualified name, file, line).
//!
//! Versions 3.8 to 3.13, GIL builds, glibc, on x86-64 and AArch64 (which lay
//! CPython's structures out alike; only where a thread's pthread lies from
//! its thread pointer differs: [`from_thread_pointer`]). The structure
//! offsets below were read from each version's own debug information (pyenv's
//! builds on the development machine, `gdb`'s `&((T*)0)->field`); a 3.13+
//! interpreter carries its offsets in `_PyRuntime.debug_offsets`, which are
//! used instead (a test checks the table against them). Anything else (2.x,
//! 3.7 and older, 3.14 and newer, free-threaded or debug builds) is reported,
//! once per process, as not read: its stacks stay native.
use std::{collections::HashMap, rc::Rc};

use super::{
    elfsym::{bias_of, ElfSyms, Sym},
    layout::rt_kind,
    plugin::{About, CodeInfo, CodeLines, Detected, Instance, Lang, ProcConfig, Runtime, Seen, SrcFrame},
    RtFrame,
};
use crate::engine::process::{
    mem::{le, Mem},
    MapLine, Process,
};

crate::skeleton!("python");
use skel::types::py_proc;
crate::pod!(py_proc);

/// CPython, as the registry knows it.
pub struct CPython;

/// The registry's entry.
pub static CPYTHON: CPython = CPython;

static LANG: Lang = Lang {
    kind: "python",
    folded: "_[py]",
    top: "[py]",
    inlined_keeps_mark: true,
    colour: [(60, 2), (120, 2), (230, -1)],
};

impl Runtime for CPython {
    fn kind(&self) -> u8 {
        rt_kind::RT_PYTHON.0 as u8
    }

    fn name(&self) -> &'static str {
        "python"
    }

    fn lang(&self) -> &'static Lang {
        &LANG
    }

    fn versions(&self) -> &'static str {
        VERSIONS
    }

    fn by_file_name(&self, base: &str) -> Option<String> {
        name_version(base).map(|(ma, mi, fl)| format!("Python {ma}.{mi}{fl}"))
    }

    fn detect(&self, p: &Process) -> Option<Detected> {
        detect(p.pid, &p.maps, p.mem()?)
    }
}

/// How frames are chained (`enum py_model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// 3.8-3.10: `PyFrameObject`, one per interpreter-loop call.
    FrameObject = 0,
    /// 3.11: `_PyInterpreterFrame` through `tstate->cframe`, `is_entry`.
    CFrameEntry = 1,
    /// 3.12: through `tstate->cframe`, C-stack-owned shim frames.
    CFrameOwner = 2,
    /// 3.13: `tstate->current_frame`, shim frames.
    DirectOwner = 3,
}

/// Offsets of one CPython minor version (x86-64, release build).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Minor version (3.x).
    pub minor: u32,
    /// Frame model.
    pub model: Model,
    /// `_PyRuntimeState.interpreters.head`.
    pub rt_interp_head: u64,
    /// `_PyRuntimeState`'s autoTSSkey (`Py_tss_t`: initialized flag, then the key).
    pub rt_autotss: u64,
    /// `PyInterpreterState`: its first thread (`tstate_head`, `threads.head`).
    pub interp_threads: u64,
    /// `PyThreadState.next`.
    pub ts_next: u64,
    /// `PyThreadState.thread_id` (the `pthread_t`).
    pub ts_thread_id: u64,
    /// `PyThreadState`: frame, cframe or current_frame.
    pub ts_frame: u64,
    /// `_PyCFrame.current_frame`.
    pub cf_frame: u64,
    /// Frame: code object.
    pub f_code: u64,
    /// Frame: caller.
    pub f_back: u64,
    /// Frame: `f_lasti` (an int) or the instruction pointer.
    pub f_instr: u64,
    /// Frame: `is_entry` (3.11) or `owner` (3.12+); unused before.
    pub f_entry: u64,
    /// Bytes of a frame the kernel reads.
    pub frame_read: u64,
    /// `PyCodeObject.co_argcount`.
    pub co_argcount: u64,
    /// `PyCodeObject.co_firstlineno`.
    pub co_firstlineno: u64,
    /// `PyCodeObject.co_flags`.
    pub co_flags: u64,
    /// `PyCodeObject.co_filename`.
    pub co_filename: u64,
    /// `co_qualname` (3.11+) or `co_name`.
    pub co_name: u64,
    /// `co_linetable` (3.10+) or `co_lnotab`.
    pub co_linetable: u64,
    /// `co_code_adaptive` (3.11+: where the instructions start).
    pub co_code: u64,
    /// `sizeof(PyASCIIObject)`: ASCII text follows it.
    pub ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: other compact text follows it.
    pub compact_size: u64,
}

/// The offsets of 3.`minor` (None: not a version this build reads).
pub fn layout(minor: u32) -> Option<Layout> {
    let old = |autotss, f_lasti, frame_read| Layout {
        minor,
        model: Model::FrameObject,
        rt_interp_head: 32,
        rt_autotss: autotss,
        interp_threads: 8,
        ts_next: 8,
        ts_thread_id: 176,
        ts_frame: 24,
        cf_frame: 0,
        f_code: 32,
        f_back: 24,
        f_instr: f_lasti,
        f_entry: 0,
        frame_read,
        co_argcount: 16,
        co_firstlineno: 40,
        co_flags: 36,
        co_filename: 104,
        co_name: 112,
        co_linetable: 120,
        co_code: 0,
        ascii_size: 48,
        compact_size: 72,
    };
    Some(match minor {
        8 => old(1392, 104, 112),
        9 => old(584, 104, 112),
        10 => old(584, 96, 104),
        11 => Layout {
            minor,
            model: Model::CFrameEntry,
            rt_interp_head: 40,
            rt_autotss: 592,
            interp_threads: 16,
            ts_next: 8,
            ts_thread_id: 152,
            ts_frame: 56,
            cf_frame: 8,
            f_code: 32,
            f_back: 48,
            f_instr: 56,
            f_entry: 68,
            frame_read: 72,
            co_argcount: 56,
            co_firstlineno: 72,
            co_flags: 48,
            co_filename: 112,
            co_name: 128,
            co_linetable: 136,
            co_code: 184,
            ascii_size: 48,
            compact_size: 72,
        },
        12 | 13 => Layout {
            minor,
            model: if minor == 12 { Model::CFrameOwner } else { Model::DirectOwner },
            rt_interp_head: if minor == 12 { 40 } else { 632 },
            rt_autotss: if minor == 12 { 1544 } else { 2160 },
            interp_threads: if minor == 12 { 72 } else { 7344 },
            ts_next: 8,
            ts_thread_id: if minor == 12 { 136 } else { 152 },
            ts_frame: if minor == 12 { 56 } else { 72 },
            cf_frame: 0,
            f_code: 0,
            f_back: 8,
            f_instr: 56,
            f_entry: 70,
            frame_read: 72,
            co_argcount: 52,
            co_firstlineno: 68,
            co_flags: 48,
            co_filename: 112,
            co_name: 128,
            co_linetable: 136,
            co_code: if minor == 12 { 192 } else { 200 },
            ascii_size: 40,
            compact_size: 56,
        },
        _ => return None,
    })
}

/// The versions this build reads, for `doctor` and the docs.
pub const VERSIONS: &str = "CPython 3.8 to 3.13 (GIL builds, glibc; x86-64 and AArch64)";

/// `_Py_DebugOffsets` (3.13): the cookie at the start of `_PyRuntime`.
const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Replaces the table's offsets by those the interpreter carries (3.13's
/// `_PyRuntime.debug_offsets`, laid out as in its pycore_runtime.h); None
/// when `d` is not such a block. Also says whether the build is free-threaded.
pub fn from_debug_offsets(base: &Layout, d: &[u8]) -> Option<(Layout, bool)> {
    if d.len() < 584 || &d[..8] != DEBUG_COOKIE {
        return None;
    }
    let at = |o: usize| le::<8>(d, o);
    let version = at(8);
    if (version >> 24, (version >> 16) & 0xff) != (3, base.minor as u64) {
        return None;
    }
    let free_threaded = at(16) != 0;
    // Each block starts with its struct's size; a field past it is not one.
    let field = |size_at: usize, o: usize| {
        let v = at(o);
        (v < at(size_at) && v < 1 << 20).then_some(v)
    };
    let mut l = base.clone();
    l.rt_interp_head = field(24, 40)?;
    l.interp_threads = field(48, 72)?;
    l.ts_next = field(152, 168)?;
    l.ts_frame = field(152, 184)?;
    l.ts_thread_id = field(152, 192)?;
    l.f_back = field(224, 232)?;
    l.f_code = field(224, 240)?;
    l.f_instr = field(224, 248)?;
    l.f_entry = field(224, 264)?;
    l.co_filename = field(272, 280)?;
    l.co_name = field(272, 296)?;
    l.co_linetable = field(272, 304)?;
    l.co_firstlineno = field(272, 312)?;
    l.co_argcount = field(272, 320)?;
    l.co_code = field(272, 344)?;
    l.ascii_size = at(560);
    Some((l, free_threaded))
}

/// `python3.11`, `libpython3.12.so.1.0`, `python3.13t`: (major, minor,
/// ABI flags) of an interpreter image's file name.
pub fn name_version(base: &str) -> Option<(u32, u32, String)> {
    let rest = base.strip_prefix("lib").unwrap_or(base).strip_prefix("python")?;
    let (major, rest) = rest.split_once('.')?;
    let major: u32 = major.parse().ok()?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let minor: u32 = rest[..digits].parse().ok()?;
    let tail = &rest[digits..];
    let flags: String = tail.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
    let after = &tail[flags.len()..];
    if !(after.is_empty() || after.starts_with(".so")) || flags.len() > 3 {
        return None;
    }
    Some((major, minor, flags))
}

/// What the kernel needs and user space keeps for one Python process.
#[derive(Debug, Clone)]
pub struct Python {
    /// "3.12.1".
    pub version: String,
    /// The offsets used.
    pub layout: Layout,
    /// Whether they came from the interpreter's own debug offsets.
    pub from_debug_offsets: bool,
    /// `&PyCode_Type`.
    pub code_type: u64,
    /// The interpreter loop's ranges.
    pub ranges: Vec<(u64, u64)>,
    /// autoTSSkey's pthread key.
    pub key: u32,
    /// glibc's `specific_1stblock` from the thread pointer.
    pub tsd: u64,
    /// The file holding the interpreter, as the process shows it.
    pub image: String,
}

const WANT: &[&str] = &["_PyRuntime", "_PyEval_EvalFrameDefault", "PyCode_Type", "Py_Version"];

/// Looks for a CPython interpreter among `pid`'s mappings. None: none there.
fn detect(pid: u32, maps: &[MapLine], mem: &Mem) -> Option<Detected> {
    // Interpreter images by file name; a shared build's executable names
    // no symbols of its own, its libpython does.
    let mut seen: Vec<&str> = Vec::new();
    let mut named = None;
    for m in maps.iter().filter(|m| m.exec && m.is_file()) {
        let Some((major, minor, flags)) = name_version(m.base()) else { continue };
        if seen.contains(&m.path.as_str()) {
            continue;
        }
        seen.push(&m.path);
        let what = format!("Python {major}.{minor}{flags}");
        if major != 3 || !(8..=13).contains(&minor) {
            return Some(Detected::not_read(what, format!("this sonde reads {VERSIONS}")));
        }
        let Some(elf) = m.open(pid).and_then(|f| ElfSyms::open(f).ok()) else { continue };
        let syms = elf.find(WANT);
        if !(syms.contains_key("_PyRuntime") && syms.contains_key("_PyEval_EvalFrameDefault")) {
            named = Some(what);
            continue;
        }
        if flags.contains('t') {
            return Some(Detected::not_read(what, "a free-threaded build (its frames are laid out apart)"));
        }
        if flags.contains('d') {
            return Some(Detected::not_read(what, "a debug build (its objects are laid out apart)"));
        }
        let bias = maps.iter().filter(|x| x.path == m.path).find_map(|x| bias_of(&elf.segments, x.start, x.offset))?;
        let found = read_interpreter(pid, m, &elf, &syms, bias, minor, mem).and_then(|p| {
            if elf.is_x86_64() {
                Ok(p)
            } else {
                from_thread_pointer(p, pid, maps, &elf)
            }
        });
        return Some(match found {
            Ok(p) => Detected::Read(Box::new(p)),
            Err(d) => d,
        });
    }
    // A python-named file without the interpreter's symbols (e.g. the
    // executable of a shared build whose libpython is not mapped yet).
    named.map(|what| Detected::Later(format!("{what}: its interpreter library is not mapped yet")))
}

fn read_interpreter(
    _pid: u32,
    m: &MapLine,
    elf: &ElfSyms,
    syms: &HashMap<String, Sym>,
    bias: u64,
    minor: u32,
    mem: &Mem,
) -> Result<Python, Detected> {
    let mut what = format!("Python 3.{minor}");
    let unsupported = |what: &str, why: &str| Detected::not_read(what, why);
    // Py_Version (3.11+) says the version exactly.
    let mut version = format!("3.{minor}");
    if let Some(v) = syms.get("Py_Version").and_then(|s| elf.read_vaddr(s.addr, 4)) {
        let v = le::<4>(&v, 0);
        let (ma, mi, mc) = (v >> 24, (v >> 16) & 0xff, (v >> 8) & 0xff);
        if (ma, mi) != (3, minor as u64) {
            return Err(unsupported(&what, &format!("its Py_Version says {ma}.{mi}, its file name 3.{minor}")));
        }
        version = format!("{ma}.{mi}.{mc}");
        what = format!("Python {version}");
    }
    let Some(mut layout) = layout(minor) else {
        return Err(unsupported(&what, &format!("this sonde reads {VERSIONS}")));
    };
    let runtime = syms["_PyRuntime"].addr.wrapping_add(bias);
    let mut debug_offsets = false;
    if minor >= 13 {
        match mem.bytes(runtime, 584).and_then(|d| from_debug_offsets(&layout, &d)) {
            Some((_, true)) => return Err(unsupported(&what, "a free-threaded build (its frames are laid out apart)")),
            Some((l, false)) => {
                layout = l;
                debug_offsets = true;
            }
            None => return Err(unsupported(&what, "its _PyRuntime carries no debug offsets this sonde understands")),
        }
    }
    let Some(code_type) = syms.get("PyCode_Type").map(|s| s.addr.wrapping_add(bias)) else {
        return Err(unsupported(&what, "PyCode_Type is not in its symbol tables"));
    };
    let eval = &syms["_PyEval_EvalFrameDefault"];
    if eval.size == 0 {
        return Err(unsupported(&what, "its symbol table gives no size for _PyEval_EvalFrameDefault"));
    }
    let mut ranges = vec![(eval.addr.wrapping_add(bias), eval.addr.wrapping_add(bias).wrapping_add(eval.size))];
    for (_, s) in elf.with_prefix("_PyEval_EvalFrameDefault.cold", 3) {
        if s.size > 0 {
            ranges.push((s.addr.wrapping_add(bias), s.addr.wrapping_add(bias).wrapping_add(s.size)));
        }
    }
    // The thread-state key, once the runtime has made it. On AArch64 the
    // table's offset of autoTSSkey (x86-64's) can be short of the real one:
    // _PyRuntimeState embeds the GIL's pthread mutexes (40 bytes on x86-64,
    // 48 on AArch64) before it. There the candidates up to 64 bytes on are
    // tried, and one counts only if a thread's own pthread slot for its key
    // holds that thread's state (the calibration below).
    let shifts: &[u64] = if elf.is_x86_64() || debug_offsets { &[0] } else { &[0, 8, 16, 24, 32, 40, 48, 56, 64] };
    let mut initialized = false;
    let mut found = None;
    for &shift in shifts {
        let Some(tss) = mem.bytes(runtime.wrapping_add(layout.rt_autotss + shift), 8) else {
            return Err(unsupported(&what, "its runtime state cannot be read"));
        };
        if le::<4>(&tss, 0) != 1 {
            continue;
        }
        initialized = true;
        let key = le::<4>(&tss, 4) as u32;
        if key >= 1024 {
            if shifts.len() == 1 {
                return Err(unsupported(&what, &format!("its thread-state key {key} is not a pthread key")));
            }
            continue;
        }
        // Where glibc keeps thread-specific data: found from a thread whose
        // state we know (the interpreter's thread list) and its pthread.
        if let Some(tsd) = calibrate(mem, runtime, &layout, key) {
            layout.rt_autotss += shift;
            found = Some((key, tsd));
            break;
        }
    }
    if !initialized {
        return Err(Detected::Later(format!("{what}: the interpreter is not initialized yet")));
    }
    let Some((key, tsd)) = found else {
        return Err(Detected::Later(format!(
            "{what}: no thread's state found through its pthread key (not glibc, or no thread has started)"
        )));
    };
    Ok(Python {
        version,
        layout,
        from_debug_offsets: debug_offsets,
        code_type,
        ranges,
        key,
        tsd,
        image: m.path.clone(),
    })
}

/// On AArch64 the thread pointer (`tpidr_el0`, what the walk reads) is
/// not the `struct pthread` as on x86-64: glibc puts that struct just below
/// it (TLS variant I), `sizeof(struct pthread)` bytes (0x740 in 2.36), which
/// its `pthread_self` subtracts. `p.tsd` becomes an offset from the thread
/// pointer.
fn from_thread_pointer(mut p: Python, pid: u32, maps: &[MapLine], interp: &ElfSyms) -> Result<Python, Detected> {
    let what = format!("Python {}", p.version);
    let libc =
        maps.iter().filter(|m| m.exec).find(|m| m.base().starts_with("libc.so") || m.base().starts_with("libc-"));
    let own;
    let elf = match libc.and_then(|m| m.open(pid)).and_then(|f| ElfSyms::open(f).ok()) {
        Some(e) => {
            own = e;
            &own
        }
        None => interp, // a static build: its own glibc
    };
    let code = elf.find(&["pthread_self"]).get("pthread_self").and_then(|s| elf.read_vaddr(s.addr, 24));
    match code.as_deref().and_then(pthread_below_tp) {
        Some(below) => {
            p.tsd = p.tsd.wrapping_sub(below);
            Ok(p)
        }
        None => Err(Detected::not_read(
            what,
            "where its threads' pthread lies from the thread pointer is not known: its libc's pthread_self \
             is not glibc's `mrs x0, tpidr_el0; sub x0, x0, #N`",
        )),
    }
}

/// The N of AArch64 glibc's `pthread_self`: `mrs x0, tpidr_el0`, then
/// `sub x0, x0, #N` (N may be shifted by 12), after any `bti c`,
/// `paciasp` or `nop`.
pub fn pthread_below_tp(code: &[u8]) -> Option<u64> {
    let words: Vec<u32> = code.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
    const HINTS: [u32; 3] = [0xd503_245f, 0xd503_233f, 0xd503_201f]; // bti c, paciasp, nop
    let at = words.iter().position(|w| !HINTS.contains(w))?;
    let (mrs, sub) = (*words.get(at)?, *words.get(at + 1)?);
    // SUB (immediate), 64-bit, x0 from x0.
    if mrs != 0xd53b_d040 || sub & 0xff80_03ff != 0xd100_0000 {
        return None;
    }
    let imm = ((sub >> 10) & 0xfff) as u64;
    Some(if sub & (1 << 22) != 0 { imm << 12 } else { imm })
}

/// glibc's `struct pthread` keeps the first 32 keys' values in
/// `specific_1stblock` (a `{seq, data}` pair each) and further ones behind
/// `specific[key / 32]` right after it. Its offset from the thread pointer
/// is found on a live thread: the offset at which the thread's slot for
/// `key` holds its own thread state (0x310 on glibc 2.26 to 2.41).
fn calibrate(mem: &Mem, runtime: u64, l: &Layout, key: u32) -> Option<u64> {
    let interp = mem.u64(runtime.wrapping_add(l.rt_interp_head)).filter(|&p| p != 0)?;
    let mut ts = mem.u64(interp.wrapping_add(l.interp_threads))?;
    for _ in 0..256 {
        if ts == 0 {
            break;
        }
        let me = mem.u64(ts.wrapping_add(l.ts_thread_id))?;
        if me != 0 {
            if let Some(x) = tsd_offset(mem, me, key, ts) {
                return Some(x);
            }
        }
        ts = mem.u64(ts.wrapping_add(l.ts_next))?;
    }
    None
}

fn tsd_offset(mem: &Mem, me: u64, key: u32, ts: u64) -> Option<u64> {
    let block = mem.bytes(me, 0x1000).or_else(|| mem.bytes(me, 0x800))?;
    let k = key as usize;
    let holds = |x: usize| -> bool {
        if k < 32 {
            let at = x + k * 16;
            le::<8>(&block, at + 8) == ts && le::<8>(&block, at) & 1 == 1
        } else {
            let p = le::<8>(&block, x + 0x200 + (k / 32) * 8);
            p != 0 && mem.u64(p.wrapping_add((k % 32) as u64 * 16 + 8)) == Some(ts)
        }
    };
    let last = block.len().saturating_sub(0x200 + 32 * 8);
    std::iter::once(0x310)
        .chain((0x100..last).step_by(8))
        .find(|&x| x + 0x200 <= block.len() && holds(x))
        .map(|x| x as u64)
}

/// The kernel's `struct py_proc` (python.h).
pub fn bpf_config(p: &Python) -> py_proc {
    let l = &p.layout;
    py_proc {
        tsd: p.tsd,
        code_type: p.code_type,
        key: p.key,
        model: l.model as u8,
        frame_read: l.frame_read as u8,
        ts_frame: l.ts_frame as u16,
        cf_frame: l.cf_frame as u16,
        f_code: l.f_code as u16,
        f_back: l.f_back as u16,
        f_instr: l.f_instr as u16,
        f_entry: l.f_entry as u16,
        co_argcount: l.co_argcount as u16,
        co_firstlineno: l.co_firstlineno as u16,
        co_flags: l.co_flags as u16,
    }
}

impl Instance for Python {
    fn about(&self) -> About {
        let ranges: Vec<String> = self.ranges.iter().map(|(a, b)| format!("{a:#x}-{b:#x}")).collect();
        // Below the thread pointer on AArch64 (glibc's TLS variant I).
        let tsd = match self.tsd as i64 {
            n if n < 0 => format!("- {:#x}", n.unsigned_abs()),
            n => format!("+ {n:#x}"),
        };
        let mut fields = serde_json::Map::new();
        fields.insert("thread_state_key".into(), self.key.into());
        fields.insert("thread_specific_data".into(), tsd.trim_start_matches("+ ").replace("- ", "-").into());
        fields.insert("interpreter_loop".into(), ranges.clone().into());
        About {
            runtime: format!("Python {}", self.version),
            image: self.image.clone(),
            offsets: if self.from_debug_offsets { "_Py_DebugOffsets" } else { "built-in table" },
            module: self.image.rsplit('/').next().unwrap_or("python").split(".so").next().unwrap_or("python").into(),
            untested: None,
            detail: format!(
                "thread-state key {}, thread-specific data at thread pointer {tsd}; interpreter loop {}",
                self.key,
                ranges.join(", ")
            ),
            fields,
        }
    }

    fn config(&self) -> ProcConfig {
        ProcConfig { ranges: self.ranges.clone(), jit: Vec::new(), part: ProcConfig::part_of(&bpf_config(self)) }
    }

    fn code_info(&mut self, mem: &Mem, s: &Seen) -> Result<CodeInfo, &'static str> {
        code_info(self, mem, s.addr, s.cookie)
    }
}

/// How a code object's lines are found: its line table; `code` is where
/// the instructions start in the code object (3.11+).
#[derive(Debug)]
struct PyLines {
    minor: u8,
    table: Vec<u8>,
    code: u32,
}

impl CodeLines for PyLines {
    fn frames(&self, info: &CodeInfo, f: &RtFrame) -> Vec<SrcFrame> {
        let line = line_at(self.minor, &self.table, self.code, info.first_line, f.loc);
        vec![(info.name.clone(), info.file.clone(), line, false)]
    }

    fn bytes(&self) -> usize {
        self.table.len()
    }
}

/// The cookie of python.h's `py_cookie`.
pub fn cookie(argcount: u32, firstlineno: u32, flags: u32) -> u16 {
    let h =
        argcount.wrapping_mul(0x9e37_79b1) ^ firstlineno.wrapping_mul(0x85eb_ca6b) ^ flags.wrapping_mul(0xc2b2_ae35);
    (h ^ (h >> 16)) as u16
}

/// Longest name or file name kept (characters).
const MAX_TEXT: u64 = 4096;
/// Largest line table read (bytes).
const MAX_LINETABLE: u64 = 1 << 20;

/// Names the code object at `addr` whose kernel cookie was `ck`; an error
/// says why not (the process changed it, or it is not one).
pub fn code_info(p: &Python, mem: &Mem, addr: u64, ck: u16) -> Result<CodeInfo, &'static str> {
    let l = &p.layout;
    let head_len = [l.co_argcount, l.co_firstlineno, l.co_flags, l.co_filename, l.co_name, l.co_linetable]
        .into_iter()
        .max()
        .unwrap_or(0)
        + 8;
    let h = mem.bytes(addr, head_len as usize).ok_or("unreadable")?;
    if le::<8>(&h, 8) != p.code_type {
        return Err("not_code");
    }
    let first = le::<4>(&h, l.co_firstlineno as usize) as u32;
    let c = cookie(le::<4>(&h, l.co_argcount as usize) as u32, first, le::<4>(&h, l.co_flags as usize) as u32);
    if c != ck {
        return Err("reused");
    }
    let name = text(mem, l, le::<8>(&h, l.co_name as usize)).ok_or("unreadable")?;
    let file = text(mem, l, le::<8>(&h, l.co_filename as usize)).unwrap_or_else(|| "?".into());
    let table = bytes_object(mem, le::<8>(&h, l.co_linetable as usize)).unwrap_or_default();
    Ok(CodeInfo {
        name,
        file,
        first_line: first,
        lines: Rc::new(PyLines { minor: l.minor as u8, table, code: l.co_code as u32 }),
    })
}

/// A `str` object's text (compact ASCII or compact UCS-1/2/4).
fn text(mem: &Mem, l: &Layout, addr: u64) -> Option<String> {
    // The header and, for most names, the text in one read.
    let h = mem.prefix(addr, 256, 40)?;
    let data = |off: u64, n: u64| -> Option<Vec<u8>> {
        let end = off.checked_add(n)? as usize;
        match h.get(off as usize..end) {
            Some(b) => Some(b.to_vec()),
            None => mem.bytes(addr.wrapping_add(off), n as usize),
        }
    };
    let len = le::<8>(&h, 16);
    let state = le::<4>(&h, 32);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || len > MAX_TEXT {
        return None;
    }
    if ascii == 1 {
        let b = data(l.ascii_size, len)?;
        return Some(String::from_utf8_lossy(&b).into_owned());
    }
    let width = match kind {
        1 | 2 | 4 => kind,
        _ => return None,
    };
    let b = data(l.compact_size, len * width)?;
    let unit = |c: &[u8]| match c.len() {
        1 => c[0] as u32,
        2 => u16::from_le_bytes([c[0], c[1]]) as u32,
        _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
    };
    Some(b.chunks_exact(width as usize).map(|c| char::from_u32(unit(c)).unwrap_or('\u{fffd}')).collect())
}

/// A `bytes` object's contents.
fn bytes_object(mem: &Mem, addr: u64) -> Option<Vec<u8>> {
    let h = mem.prefix(addr, 512, 32)?;
    let len = le::<8>(&h, 16);
    if len > MAX_LINETABLE {
        return None;
    }
    if let Some(b) = h.get(32..32 + len as usize) {
        return Some(b.to_vec());
    }
    mem.bytes(addr.wrapping_add(32), len as usize)
}

/// The line of a frame at `loc` (the kernel's: `f_lasti` before 3.11, the
/// instruction pointer's offset into the code object from 3.11) in a code
/// object starting at `first` with line table `table`.
pub fn line_at(minor: u8, table: &[u8], code: u32, first: u32, loc: u32) -> Option<u32> {
    let first = first as i64;
    let line = match minor {
        8 | 9 => {
            let lasti = loc as i32;
            if lasti < 0 {
                return Some(first as u32);
            }
            lnotab(table, first, lasti as i64)
        }
        10 => {
            let lasti = loc as i32;
            if lasti < 0 {
                return Some(first as u32);
            }
            linetable_310(table, first, lasti as i64 * 2)?
        }
        _ => {
            if loc == u32::MAX || loc < code {
                return Some(first as u32);
            }
            locations(table, first, ((loc - code) / 2) as i64)?
        }
    };
    u32::try_from(line).ok()
}

/// 3.8-3.9 `co_lnotab`: (bytecode increment, signed line increment) pairs.
fn lnotab(t: &[u8], first: i64, lasti: i64) -> i64 {
    let (mut addr, mut line) = (0i64, first);
    for p in t.chunks_exact(2) {
        addr += p[0] as i64;
        if addr > lasti {
            break;
        }
        line = line.wrapping_add(p[1] as i8 as i64);
    }
    line
}

/// 3.10 `co_linetable` (PEP 626): (bytes covered, signed line delta, -128
/// for none) pairs.
fn linetable_310(t: &[u8], first: i64, target: i64) -> Option<i64> {
    let (mut addr, mut line) = (0i64, first);
    for p in t.chunks_exact(2) {
        let here = if p[1] as i8 == -128 {
            None
        } else {
            line = line.wrapping_add(p[1] as i8 as i64);
            Some(line)
        };
        let end = addr.saturating_add(p[0] as i64);
        if (addr..end).contains(&target) {
            return here;
        }
        addr = end;
    }
    None
}

/// 3.11+ location table: entries of a header byte (1, a 4-bit code, the
/// code units covered - 1) and varint data; the line moves by a delta per
/// entry. `index` is the instruction's index in code units.
fn locations(t: &[u8], first: i64, index: i64) -> Option<i64> {
    let mut i = 0usize;
    let mut line = first;
    let mut at = 0i64;
    let varint = |i: &mut usize| -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..60).step_by(6) {
            let b = *t.get(*i)?;
            *i += 1;
            v |= ((b & 63) as u64) << shift;
            if b & 64 == 0 {
                return Some(v);
            }
        }
        None
    };
    let svarint = |i: &mut usize| varint(i).map(|v| if v & 1 == 1 { -((v >> 1) as i64) } else { (v >> 1) as i64 });
    while i < t.len() {
        let h = t[i];
        i += 1;
        if h & 0x80 == 0 {
            return None;
        }
        let code = (h >> 3) & 15;
        let len = (h & 7) as i64 + 1;
        let here = match code {
            15 => None,
            14 => {
                line = line.wrapping_add(svarint(&mut i)?);
                varint(&mut i)?;
                varint(&mut i)?;
                varint(&mut i)?;
                Some(line)
            }
            13 => {
                line = line.wrapping_add(svarint(&mut i)?);
                Some(line)
            }
            10..=12 => {
                line = line.wrapping_add(code as i64 - 10);
                i += 2;
                Some(line)
            }
            _ => {
                i += 1;
                Some(line)
            }
        };
        if (at..at + len).contains(&index) {
            return here.or(Some(line));
        }
        at += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aarch64_glibc_puts_the_pthread_below_the_thread_pointer() {
        // Debian's arm64 libc (scripts/setup installs libc6:arm64).
        let f = std::fs::File::open("/lib/aarch64-linux-gnu/libc.so.6").expect("libc6:arm64 (scripts/setup)");
        let elf = ElfSyms::open(f).unwrap();
        assert!(!elf.is_x86_64());
        let s = elf.find(&["pthread_self"])["pthread_self"];
        let code = elf.read_vaddr(s.addr, 24).unwrap();
        assert_eq!(pthread_below_tp(&code), Some(0x740), "glibc 2.36's sizeof(struct pthread)");
        let w = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // bti c first, a shifted immediate, and what is not glibc's.
        assert_eq!(pthread_below_tp(&w(&[0xd503_245f, 0xd53b_d040, 0xd140_0400, 0xd65f_03c0])), Some(1 << 12));
        assert_eq!(pthread_below_tp(&w(&[0xd53b_d040, 0xd65f_03c0])), None);
        assert_eq!(pthread_below_tp(&w(&[0xd53b_d041, 0xd11d_0000])), None, "into x1");
        assert_eq!(pthread_below_tp(&w(&[0xd53b_d040, 0x911d_0000])), None, "an add");
    }

    #[test]
    fn file_names_give_versions() {
        assert_eq!(name_version("python3.11"), Some((3, 11, String::new())));
        assert_eq!(name_version("libpython3.12.so.1.0"), Some((3, 12, String::new())));
        assert_eq!(name_version("python3.13t"), Some((3, 13, "t".into())));
        assert_eq!(name_version("libpython3.9d.so"), Some((3, 9, "d".into())));
        assert_eq!(name_version("python2.7"), Some((2, 7, String::new())));
        assert_eq!(name_version("python3"), None);
        assert_eq!(name_version("python3.11-config"), None);
        assert_eq!(name_version("libpython3.so"), None);
    }

    #[test]
    fn lnotab_and_310_linetables_decode() {
        // 3.9: line 10 at 0, +1 at byte 4, +2 at byte 10.
        let t = [4u8, 1, 6, 2];
        assert_eq!(lnotab(&t, 10, 0), 10);
        assert_eq!(lnotab(&t, 10, 4), 11);
        assert_eq!(lnotab(&t, 10, 9), 11);
        assert_eq!(lnotab(&t, 10, 10), 13);
        // 3.10: bytes 0-1 no line, 2-5 line 11, 6-9 line 10.
        let t = [2u8, 0x80, 4, 1, 4, 0xff];
        assert_eq!(linetable_310(&t, 10, 0), None);
        assert_eq!(linetable_310(&t, 10, 3), Some(11));
        assert_eq!(linetable_310(&t, 10, 8), Some(10));
    }

    #[test]
    fn location_tables_decode() {
        // One unit with no column (code 13, line +2), two one-line units
        // (code 11: line +1, two column bytes), one unit with no location.
        let t = [0x80 | (13 << 3), 4, 0x80 | (11 << 3) | 1, 0, 5, 0x80 | (15 << 3)];
        assert_eq!(locations(&t, 20, 0), Some(22));
        assert_eq!(locations(&t, 20, 1), Some(23));
        assert_eq!(locations(&t, 20, 2), Some(23));
        assert_eq!(locations(&t, 20, 3), Some(23));
        assert_eq!(locations(&t, 20, 4), None);
        // Garbage (no header bit) is no answer, never a panic.
        assert_eq!(locations(&[0x05, 0xff], 1, 3), None);
        assert_eq!(line_at(12, &t, 192, 20, 192 + 2), Some(23));
        assert_eq!(line_at(12, &t, 192, 20, u32::MAX), Some(20));
    }
}
