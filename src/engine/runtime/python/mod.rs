//! CPython: find the interpreter in a process, tell the kernel how to read
//! its threads' frames (`python.h`, `python_walk.h`), and name the code
//! objects the kernel met (qualified name, file, line).
//!
//! GIL builds, glibc, on x86-64 and AArch64 (which lay CPython's structures
//! out alike; only where a thread's pthread lies from its thread pointer
//! differs: [`pthread_below_tp`]):
//!
//! - From 3.13 every offset comes from the interpreter's own description of
//!   itself ([`describe`]: `_Py_DebugOffsets`), so a new version that
//!   describes itself as a known one does is read, said to be untested.
//!   3.8 to 3.12 take a table read from each version's debug information.
//! - A thread's state is found where `PyGILState_GetThisThreadState` finds
//!   it: a thread-local variable when that function is a plain load of one
//!   (3.15), else the autoTSSkey pthread key (up to 3.14).
//! - The interpreter loop is `_PyEval_EvalFrameDefault` and its `.cold`
//!   part, found by its unwind description where a stripped build (Debian's)
//!   names none.
//!
//! Anything else (2.x, 3.7 and older, free-threaded or debug builds, a
//! newer version that describes itself otherwise) is reported, once per
//! process, as not read: its stacks stay native.
use std::{collections::HashMap, rc::Rc};

pub mod describe;

use describe::Described;

use super::{
    elfsym::{bias_of, ElfSyms, Sym},
    layout::rt_kind,
    plugin::{About, CodeInfo, CodeLines, Detected, Instance, Lang, ProcConfig, Runtime, Seen, SrcFrame},
    RtFrame, MAX_RANGES,
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

    fn library_frame(&self, _name: &str, file: Option<&str>) -> bool {
        // The standard library: DIR/lib/pythonX.Y/... (lib64 on Fedora and
        // SUSE; X.Yt free-threaded), not its site-packages or
        // dist-packages; frozen modules ("<frozen ...>").
        let Some(f) = file else { return false };
        if f.starts_with("<frozen") {
            return true;
        }
        f.split('/').collect::<Vec<_>>().windows(3).any(|w| {
            (w[0] == "lib" || w[0] == "lib64")
                && w[1]
                    .strip_prefix("python")
                    .map(|v| v.strip_suffix('t').unwrap_or(v))
                    .is_some_and(|v| v.contains('.') && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
                && w[2] != "site-packages"
                && w[2] != "dist-packages"
        })
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
    /// 3.13 on: `tstate->current_frame`, shim frames.
    DirectOwner = 3,
}

/// Offsets of one CPython (x86-64 and AArch64 lay them out alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Minor version (3.x).
    pub minor: u32,
    /// Frame model.
    pub model: Model,
    /// `_PyRuntimeState.interpreters.head`.
    pub rt_interp_head: u64,
    /// `_PyRuntimeState`'s autoTSSkey (`Py_tss_t`: initialized flag, then
    /// the key), up to 3.14 (3.15 keeps the thread's state in a TLS variable).
    pub rt_autotss: Option<u64>,
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
    /// Frame: code object (3.14 on: a tagged `_PyStackRef`).
    pub f_code: u64,
    /// Frame: caller.
    pub f_back: u64,
    /// Frame: `f_lasti` (an int) or the instruction pointer.
    pub f_instr: u64,
    /// Frame: `is_entry` (3.11) or `owner` (3.12+); unused before.
    pub f_entry: u64,
    /// Bytes of a frame the kernel reads.
    pub frame_read: u64,
    /// Low bits of the frame's code pointer that tag it (3.14's
    /// `_PyStackRef`), 0 where it is a plain pointer.
    pub exec_tag: u64,
    /// `PyCodeObject.co_argcount`.
    pub co_argcount: u64,
    /// `PyCodeObject.co_firstlineno`.
    pub co_firstlineno: u64,
    /// A third field of the code object in its cookie: `co_flags` where the
    /// layout comes from the table, the low half of `co_name`'s address
    /// where it comes from the interpreter's own description.
    pub co_extra: u64,
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

/// The built-in offsets of 3.`minor` for the versions before CPython
/// described itself (3.8 to 3.12; None otherwise), read from each version's
/// own debug information (pyenv's builds, `gdb`'s `&((T*)0)->field`).
pub fn layout(minor: u32) -> Option<Layout> {
    let old = |autotss, f_lasti, frame_read| Layout {
        minor,
        model: Model::FrameObject,
        rt_interp_head: 32,
        rt_autotss: Some(autotss),
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
        exec_tag: 0,
        co_argcount: 16,
        co_firstlineno: 40,
        co_extra: 36,
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
            rt_autotss: Some(592),
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
            exec_tag: 0,
            co_argcount: 56,
            co_firstlineno: 72,
            co_extra: 48,
            co_filename: 112,
            co_name: 128,
            co_linetable: 136,
            co_code: 184,
            ascii_size: 48,
            compact_size: 72,
        },
        12 => Layout {
            minor,
            model: Model::CFrameOwner,
            rt_interp_head: 40,
            rt_autotss: Some(1544),
            interp_threads: 72,
            ts_next: 8,
            ts_thread_id: 136,
            ts_frame: 56,
            cf_frame: 0,
            f_code: 0,
            f_back: 8,
            f_instr: 56,
            f_entry: 70,
            frame_read: 72,
            exec_tag: 0,
            co_argcount: 52,
            co_firstlineno: 68,
            co_extra: 48,
            co_filename: 112,
            co_name: 128,
            co_linetable: 136,
            co_code: 192,
            ascii_size: 40,
            compact_size: 56,
        },
        _ => return None,
    })
}

/// Where `_PyRuntime.autoTSSkey` is in the versions that describe
/// themselves but not it (3.13 and 3.14: x86-64's; AArch64's may be further
/// on, see [`read_interpreter`]). 3.15 has none.
fn autotss(minor: u32) -> Option<u64> {
    match minor {
        13 => Some(2160),
        14 => Some(2336),
        _ => None,
    }
}

/// The layout an interpreter describes (3.13 on).
pub fn from_described(d: &Described, minor: u32) -> Layout {
    let g = |n: &str| d.get(n);
    let frame_fields = ["interpreter_frame.previous", "interpreter_frame.executable", "interpreter_frame.instr_ptr"];
    let frame_read = frame_fields.iter().map(|n| g(n) + 8).chain([g("interpreter_frame.owner") + 1]).max().unwrap_or(0);
    let ascii = g("unicode_object.asciiobject_size");
    Layout {
        minor,
        model: Model::DirectOwner,
        rt_interp_head: g("runtime_state.interpreters_head"),
        rt_autotss: autotss(minor),
        interp_threads: g("interpreter_state.threads_head"),
        ts_next: g("thread_state.next"),
        ts_thread_id: g("thread_state.thread_id"),
        ts_frame: g("thread_state.current_frame"),
        cf_frame: 0,
        f_code: g("interpreter_frame.executable"),
        f_back: g("interpreter_frame.previous"),
        f_instr: g("interpreter_frame.instr_ptr"),
        f_entry: g("interpreter_frame.owner"),
        frame_read: (frame_read + 7) & !7,
        // 3.14's format describes the frame's stack pointer: its frames
        // hold tagged references (Py_TAG_BITS).
        exec_tag: if d.has("interpreter_frame.stackpointer") { 3 } else { 0 },
        co_argcount: g("code_object.argcount"),
        co_firstlineno: g("code_object.firstlineno"),
        co_extra: g("code_object.name"),
        co_filename: g("code_object.filename"),
        co_name: g("code_object.qualname"),
        co_linetable: g("code_object.linetable"),
        co_code: g("code_object.co_code_adaptive"),
        ascii_size: ascii,
        compact_size: if d.has("unicode_object.compactunicodeobject_size") {
            g("unicode_object.compactunicodeobject_size")
        } else {
            ascii + 16
        },
    }
}

/// The versions this build reads, for `doctor` and the docs.
pub const VERSIONS: &str = "CPython 3.8 to 3.15 (GIL builds, glibc; x86-64 and AArch64), and newer ones that describe \
                            themselves as 3.15 does";
/// The versions tested, for the word on an untested one.
const TESTED: &str = "CPython 3.8 to 3.15";

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

/// How the kernel finds a thread's `PyThreadState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadState {
    /// Through glibc's thread-specific data for pthread key `key` (the
    /// interpreter's autoTSSkey, up to 3.14), `tsd` bytes from the thread
    /// pointer.
    Key {
        /// The key.
        key: u32,
        /// Where `specific_1stblock` is from the thread pointer.
        tsd: u64,
    },
    /// The word `off` bytes from the thread pointer (3.15's
    /// `_Py_tss_gilstate`, a thread-local variable of the executable).
    Tls {
        /// Its offset from the thread pointer.
        off: i64,
    },
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
    /// Read although newer than the versions tested: those.
    pub untested: Option<String>,
    /// `&PyCode_Type`.
    pub code_type: u64,
    /// The interpreter loop's ranges.
    pub ranges: Vec<(u64, u64)>,
    /// How a thread's state is found.
    pub ts: ThreadState,
    /// The file holding the interpreter, as the process shows it.
    pub image: String,
}

const WANT: &[&str] =
    &["_PyRuntime", "_PyEval_EvalFrameDefault", "PyCode_Type", "Py_Version", "PyGILState_GetThisThreadState"];

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
        if major != 3 || minor < 8 {
            return Some(Detected::not_read(what, format!("this sonde reads {VERSIONS}")));
        }
        if flags.contains('t') {
            return Some(Detected::not_read(what, FREE_THREADED));
        }
        if flags.contains('d') {
            return Some(Detected::not_read(what, "a debug build (its objects are laid out apart)"));
        }
        let Some(elf) = m.open(pid).and_then(|f| ElfSyms::open(f).ok()) else { continue };
        let syms = elf.find(WANT);
        if !(syms.contains_key("_PyRuntime") && syms.contains_key("_PyEval_EvalFrameDefault")) {
            named = Some(what);
            continue;
        }
        let bias = maps.iter().filter(|x| x.path == m.path).find_map(|x| bias_of(&elf.segments, x.start, x.offset))?;
        // Where a thread's pthread lies below its thread pointer (AArch64).
        let below = if elf.is_x86_64() {
            Ok(0)
        } else {
            pthread_below(pid, maps, &elf).ok_or_else(|| {
                Detected::not_read(
                    what.clone(),
                    "where its threads' pthread lies from the thread pointer is not known: its libc's pthread_self \
                     is not glibc's `mrs x0, tpidr_el0; sub x0, x0, #N`",
                )
            })
        };
        let found = below.and_then(|below| read_interpreter(pid, m, &elf, &syms, bias, minor, mem, below));
        return Some(match found {
            Ok(p) => Detected::Read(Box::new(p)),
            Err(d) => d,
        });
    }
    // A python-named file without the interpreter's symbols (e.g. the
    // executable of a shared build whose libpython is not mapped yet).
    named.map(|what| Detected::Later(format!("{what}: its interpreter library is not mapped yet")))
}

const FREE_THREADED: &str = "a free-threaded build (no GIL: its objects have another header, its threads run copies \
                             of the bytecode; this sonde reads builds with the GIL)";

#[allow(clippy::too_many_arguments)]
fn read_interpreter(
    pid: u32,
    m: &MapLine,
    elf: &ElfSyms,
    syms: &HashMap<String, Sym>,
    bias: u64,
    minor: u32,
    mem: &Mem,
    below: u64,
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
    // 3.14 gives _PyRuntime a section of its own.
    let runtime = elf
        .section_range(".PyRuntime")
        .map(|(a, _)| a)
        .or_else(|| syms.get("_PyRuntime").map(|s| s.addr))
        .unwrap_or(0)
        .wrapping_add(bias);
    let (mut layout, described, untested) = if minor >= 13 {
        let block = mem
            .prefix(runtime, describe::READ_BYTES, 584)
            .ok_or_else(|| Detected::Later(format!("{what}: its _PyRuntime cannot be read yet")))?;
        if describe::head(&block).is_some_and(|(_, ft)| ft) {
            return Err(unsupported(&what, FREE_THREADED));
        }
        let (d, tested) = describe::describe(&block, minor).map_err(|e| unsupported(&what, &e))?;
        if (d.version().0, d.version().1) != (3, minor as u64) {
            let (ma, mi, _) = d.version();
            return Err(unsupported(&what, &format!("its _Py_DebugOffsets say {ma}.{mi}, its file name 3.{minor}")));
        }
        (from_described(&d, minor), true, (!tested).then(|| TESTED.to_string()))
    } else {
        let l = layout(minor).ok_or_else(|| unsupported(&what, &format!("this sonde reads {VERSIONS}")))?;
        (l, false, None)
    };
    let Some(code_type) = syms.get("PyCode_Type").map(|s| s.addr.wrapping_add(bias)) else {
        return Err(unsupported(&what, "PyCode_Type is not in its symbol tables"));
    };
    // A code object's instructions follow its fixed part: the type's size
    // (tp_basicsize, the word after tp_name) is where they start.
    if layout.co_code > 0 {
        let basic = mem.u64(code_type.wrapping_add(32));
        if basic != Some(layout.co_code) {
            return Err(unsupported(
                &what,
                &format!(
                    "its code objects are {} bytes before their instructions, not the {} its layout says",
                    basic.map_or("?".into(), |b| b.to_string()),
                    layout.co_code
                ),
            ));
        }
    }
    let eval = &syms["_PyEval_EvalFrameDefault"];
    if eval.size == 0 {
        return Err(unsupported(&what, "its symbol table gives no size for _PyEval_EvalFrameDefault"));
    }
    let hot = (eval.addr, eval.addr.wrapping_add(eval.size));
    let mut parts = vec![hot];
    for (_, s) in elf.with_prefix("_PyEval_EvalFrameDefault.cold", 3) {
        if s.size > 0 {
            parts.push((s.addr, s.addr.wrapping_add(s.size)));
        }
    }
    if parts.len() == 1 {
        // A stripped build (Debian's) names no .cold part: the code its
        // hot part jumps to, which no function's entry starts.
        if let Some(f) = m.open(pid) {
            parts.extend(cold_parts(elf, f, hot));
        }
    }
    let ranges: Vec<(u64, u64)> =
        parts.iter().take(MAX_RANGES).map(|&(a, b)| (a.wrapping_add(bias), b.wrapping_add(bias))).collect();
    // The thread state: a thread-local variable where
    // PyGILState_GetThisThreadState reads one (3.15), else through the
    // autoTSSkey pthread key (up to 3.14).
    // 64 bytes: sid's arm64 build takes 44 (its frame record around the load).
    let accessor = syms
        .get("PyGILState_GetThisThreadState")
        .and_then(|s| elf.read_vaddr(s.addr, 64).or_else(|| elf.read_vaddr(s.addr, 32)));
    let tls = accessor.as_deref().and_then(|c| tls_offset(c, elf.is_x86_64()));
    let threads = thread_list(mem, runtime, &layout);
    if threads.as_ref().is_none_or(|t| t.is_empty()) {
        return Err(Detected::Later(format!("{what}: the interpreter is not initialized yet")));
    }
    let threads = threads.unwrap_or_default();
    let ts = if let Some(off) = tls {
        // Every thread's slot holds its own state (one at least).
        let holds = |(ts, id): &(u64, u64)| mem.u64(id.wrapping_add(below).wrapping_add_signed(off)) == Some(*ts);
        if !threads.iter().all(holds) {
            return Err(Detected::Later(format!(
                "{what}: its threads' states are not yet where PyGILState_GetThisThreadState reads them"
            )));
        }
        ThreadState::Tls { off }
    } else {
        let Some(at) = layout.rt_autotss else {
            return Err(unsupported(
                &what,
                "where a thread's state is kept is not known: PyGILState_GetThisThreadState reads no thread-local \
                 variable this sonde recognises, and the version has no autoTSSkey",
            ));
        };
        // On AArch64 the offset of autoTSSkey (x86-64's) can be short of the
        // real one: _PyRuntimeState embeds the GIL's pthread mutexes (40
        // bytes on x86-64, 48 on AArch64) before it. There the candidates up
        // to 64 bytes on are tried, and one counts only if a thread's own
        // pthread slot for its key holds that thread's state.
        let shifts: &[u64] = if elf.is_x86_64() { &[0] } else { &[0, 8, 16, 24, 32, 40, 48, 56, 64] };
        let mut initialized = false;
        let mut found = None;
        for &shift in shifts {
            let Some(tss) = mem.bytes(runtime.wrapping_add(at + shift), 8) else {
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
            // Where glibc keeps thread-specific data: found from a thread
            // whose state we know (the interpreter's thread list) and its
            // pthread.
            if let Some(tsd) = threads.iter().find_map(|&(ts, id)| tsd_offset(mem, id, key, ts)) {
                layout.rt_autotss = Some(at + shift);
                // An offset from the pthread: from the thread pointer on
                // AArch64, where the pthread lies below it.
                found = Some(ThreadState::Key { key, tsd: tsd.wrapping_sub(below) });
                break;
            }
        }
        if !initialized {
            return Err(Detected::Later(format!("{what}: the interpreter is not initialized yet")));
        }
        found.ok_or_else(|| {
            Detected::Later(format!(
                "{what}: no thread's state found through its pthread key (not glibc, or no thread has started)"
            ))
        })?
    };
    Ok(Python {
        version,
        layout,
        from_debug_offsets: described,
        untested,
        code_type,
        ranges,
        ts,
        image: m.path.clone(),
    })
}

/// The interpreter's threads: (thread state, pthread), at most 256.
fn thread_list(mem: &Mem, runtime: u64, l: &Layout) -> Option<Vec<(u64, u64)>> {
    let interp = mem.u64(runtime.wrapping_add(l.rt_interp_head)).filter(|&p| p != 0)?;
    let mut ts = mem.u64(interp.wrapping_add(l.interp_threads))?;
    let mut out = Vec::new();
    for _ in 0..256 {
        if ts == 0 {
            break;
        }
        let me = mem.u64(ts.wrapping_add(l.ts_thread_id))?;
        if me != 0 {
            out.push((ts, me));
        }
        ts = mem.u64(ts.wrapping_add(l.ts_next))?;
    }
    Some(out)
}

/// The thread-pointer offset of the thread-local variable an accessor
/// returns, when it is a plain load of one: on x86-64 `mov %fs:OFF,%rax`
/// (or `mov %fs:0,%rax` then `mov OFF(%rax),%rax`), on AArch64
/// `mrs xN, tpidr_el0`, then `add` of the offset's high and low parts and
/// an `ldr` (the local-exec forms an executable's own TLS takes), after
/// `endbr64`, `bti c` or `paciasp`. On AArch64 the frame record a build with
/// branch protection saves and restores around them (`paciasp`, `stp x29,
/// x30, [sp, #-16]!`, `mov x29, sp`, `ldp x29, x30, [sp], #16`, `autiasp`)
/// and the `nop` the linker leaves of a relaxed high part are passed over
/// (Debian sid's arm64 python3.15).
pub fn tls_offset(code: &[u8], x86_64: bool) -> Option<i64> {
    if x86_64 {
        let c = code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code);
        let d32 = |b: &[u8]| b.get(..4).map(|x| i32::from_le_bytes([x[0], x[1], x[2], x[3]]) as i64);
        // mov %fs:disp32,%rax
        let c = c.strip_prefix(&[0x64, 0x48, 0x8b, 0x04, 0x25])?;
        let off = d32(c)?;
        let rest = &c[4..];
        if off != 0 {
            return rest.first().is_some_and(|&b| b == 0xc3).then_some(off);
        }
        // mov disp32(%rax),%rax; ret
        let r = rest.strip_prefix(&[0x48, 0x8b, 0x80])?;
        let off = d32(r)?;
        return (r.get(4) == Some(&0xc3)).then_some(off);
    }
    let words: Vec<u32> = code.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
    const HINTS: [u32; 3] = [0xd503_245f, 0xd503_233f, 0xd503_201f]; // bti c, paciasp, nop
    let mut i = words.iter().position(|w| !HINTS.contains(w))?;
    // mrs xN, tpidr_el0
    let mrs = *words.get(i)?;
    if mrs & !0x1f != 0xd53b_d040 {
        return None;
    }
    let mut reg = mrs & 0x1f;
    let mut off: i64 = 0;
    i += 1;
    // paciasp, autiasp, nop; stp x29, x30, [sp, #-16]!; mov x29, sp;
    // ldp x29, x30, [sp], #16: none writes the register followed (x0..x28).
    const FRAME: [u32; 6] = [0xd503_233f, 0xd503_23bf, 0xd503_201f, 0xa9bf_7bfd, 0x9100_03fd, 0xa8c1_7bfd];
    loop {
        let w = *words.get(i)?;
        let (rd, rn) = (w & 0x1f, (w >> 5) & 0x1f);
        if FRAME.contains(&w) && reg < 29 {
            i += 1;
        } else if w & 0xff80_0000 == 0x9100_0000 && rn == reg {
            // add xD, xN, #imm{, lsl #12}
            let imm = ((w >> 10) & 0xfff) as i64;
            off += if w & (1 << 22) != 0 { imm << 12 } else { imm };
            reg = rd;
            i += 1;
        } else if w & 0xffc0_0000 == 0xf940_0000 && rn == reg {
            // ldr xT, [xN, #imm]: the load, and its result is returned
            off += (((w >> 10) & 0xfff) as i64) * 8;
            let next = *words.get(i + 1)?;
            let ret = next == 0xd65f_03c0 || next == 0xd65f_0bff; // ret, retaa
            return (rd == 0 && ret).then_some(off);
        } else {
            return None;
        }
    }
}

/// The code ranges of a function's parts its hot part jumps to: the `.cold`
/// part GCC splits out (the interpreter's loop, in Debian's builds), found
/// by the `.eh_frame` descriptions that start where a jump from `hot` lands
/// and whose first row is not a function's entry.
fn cold_parts(elf: &ElfSyms, file: std::fs::File, hot: (u64, u64)) -> Vec<(u64, u64)> {
    let Some(code) = elf.read_vaddr(hot.0, hot.1.saturating_sub(hot.0).min(1 << 20)) else { return Vec::new() };
    let targets = branch_targets(&code, hot.0, elf.is_x86_64());
    let Ok(info) = crate::engine::unwind::elf::read_file(file) else { return Vec::new() };
    let spans = crate::engine::unwind::table::fde_spans(&info);
    let mut out: Vec<(u64, u64)> = spans
        .into_iter()
        .filter(|&(s, e, entry)| !entry && targets.contains(&s) && !(hot.0 <= s && s < hot.1) && e > s)
        .map(|(s, e, _)| (s, e))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The targets of direct jumps in `code` (at address `at`): x86-64's
/// `jmp rel32` and `jcc rel32` (looked for at every byte: a target must
/// then also start a code part, which chance does not give), AArch64's
/// `b`, `b.cond`, `cbz`/`cbnz` and `tbz`/`tbnz`.
pub fn branch_targets(code: &[u8], at: u64, x86_64: bool) -> std::collections::HashSet<u64> {
    let mut out = std::collections::HashSet::new();
    let rel = |i: usize| code.get(i..i + 4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64);
    if x86_64 {
        for i in 0..code.len() {
            let (len, disp) = match (code[i], code.get(i + 1)) {
                (0xe9, _) => (5, rel(i + 1)),
                (0x0f, Some(&b)) if b & 0xf0 == 0x80 => (6, rel(i + 2)),
                _ => continue,
            };
            if let Some(d) = disp {
                out.insert((at + i as u64 + len).wrapping_add_signed(d));
            }
        }
        return out;
    }
    for (i, w) in code.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).enumerate() {
        let pc = at + 4 * i as u64;
        let sext = |v: u32, bits: u32| ((v << (32 - bits)) as i32 >> (32 - bits)) as i64 * 4;
        let d = if w & 0xfc00_0000 == 0x1400_0000 {
            sext(w & 0x03ff_ffff, 26) // b
        } else if w & 0xff00_0010 == 0x5400_0000 || w & 0x7e00_0000 == 0x3400_0000 {
            sext((w >> 5) & 0x7_ffff, 19) // b.cond, cbz, cbnz
        } else if w & 0x7e00_0000 == 0x3600_0000 {
            sext((w >> 5) & 0x3fff, 14) // tbz, tbnz
        } else {
            continue;
        };
        out.insert(pc.wrapping_add_signed(d));
    }
    out
}

/// Where glibc puts a thread's pthread below its thread pointer: 0 on
/// x86-64 (the thread pointer is the pthread); on AArch64 (TLS variant I)
/// `sizeof(struct pthread)` bytes (0x740 in 2.36), which its `pthread_self`
/// subtracts.
fn pthread_below(pid: u32, maps: &[MapLine], interp: &ElfSyms) -> Option<u64> {
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
    let code = elf.find(&["pthread_self"]).get("pthread_self").and_then(|s| elf.read_vaddr(s.addr, 24))?;
    pthread_below_tp(&code)
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
/// `specific[key / 32]` right after it. Its offset in the pthread is found
/// on a live thread (`me`, whose state is `ts`): the offset at which the
/// thread's slot for `key` holds its own state (0x310 on glibc 2.26 to 2.43).
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
    let (tsd, key, ts_tls) = match p.ts {
        ThreadState::Key { key, tsd } => (tsd, key, 0),
        ThreadState::Tls { off } => (off as u64, 0, 1),
    };
    // The code object's head the kernel reads: its type and the cookie's fields.
    let head = [l.co_argcount, l.co_firstlineno, l.co_extra].into_iter().max().unwrap_or(0) + 4;
    py_proc {
        tsd,
        code_type: p.code_type,
        key,
        ts_tls,
        code_read: head.clamp(16, 128) as u8,
        exec_tag: l.exec_tag as u8,
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
        co_extra: l.co_extra as u16,
        ..Default::default()
    }
}

impl Instance for Python {
    fn about(&self) -> About {
        let ranges: Vec<String> = self.ranges.iter().map(|(a, b)| format!("{a:#x}-{b:#x}")).collect();
        // From the thread pointer: below it on AArch64 (glibc's TLS
        // variant I) for thread-specific data, and on x86-64 (variant II)
        // for an executable's thread-local variables.
        let signed = |n: i64| if n < 0 { format!("- {:#x}", n.unsigned_abs()) } else { format!("+ {n:#x}") };
        let mut fields = serde_json::Map::new();
        let how = match self.ts {
            ThreadState::Key { key, tsd } => {
                let at = signed(tsd as i64);
                fields.insert("thread_state_key".into(), key.into());
                fields.insert("thread_specific_data".into(), at.trim_start_matches("+ ").replace("- ", "-").into());
                format!("thread-state key {key}, thread-specific data at thread pointer {at}")
            }
            ThreadState::Tls { off } => {
                let at = signed(off);
                fields.insert("thread_state_tls".into(), at.trim_start_matches("+ ").replace("- ", "-").into());
                format!("thread state in a thread-local variable at thread pointer {at}")
            }
        };
        fields.insert("interpreter_loop".into(), ranges.clone().into());
        About {
            runtime: format!("Python {}", self.version),
            image: self.image.clone(),
            offsets: if self.from_debug_offsets { "_Py_DebugOffsets" } else { "built-in table" },
            module: self.image.rsplit('/').next().unwrap_or("python").split(".so").next().unwrap_or("python").into(),
            untested: self.untested.clone(),
            detail: format!("{how}; interpreter loop {}", ranges.join(", ")),
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
pub fn cookie(argcount: u32, firstlineno: u32, extra: u32) -> u16 {
    let h =
        argcount.wrapping_mul(0x9e37_79b1) ^ firstlineno.wrapping_mul(0x85eb_ca6b) ^ extra.wrapping_mul(0xc2b2_ae35);
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
    let head_len = [l.co_argcount, l.co_firstlineno, l.co_extra, l.co_filename, l.co_name, l.co_linetable]
        .into_iter()
        .max()
        .unwrap_or(0)
        + 8;
    let h = mem.bytes(addr, head_len as usize).ok_or("unreadable")?;
    if le::<8>(&h, 8) != p.code_type {
        return Err("not_code");
    }
    let first = le::<4>(&h, l.co_firstlineno as usize) as u32;
    let c = cookie(le::<4>(&h, l.co_argcount as usize) as u32, first, le::<4>(&h, l.co_extra as usize) as u32);
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
    fn thread_local_accessors_give_their_offsets() {
        let w = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // Debian sid's arm64 python3.15, PyGILState_GetThisThreadState: the
        // frame record around a relaxed local-exec access (hi12 a nop).
        #[rustfmt::skip]
        let sid = [
            0xd503_245f, 0xd53b_d040, 0xd503_233f, 0xa9bf_7bfd, 0xd503_201f, 0x9100_8000, 0x9100_03fd, 0xa8c1_7bfd,
            0xd503_23bf, 0xf940_0000, 0xd65f_03c0,
        ];
        assert_eq!(tls_offset(&w(&sid), false), Some(32));
        // Unrelaxed: add x0, x0, #1, lsl #12; add x0, x0, #0x10; ldr x0, [x0, #8]; ret.
        assert_eq!(
            tls_offset(&w(&[0xd53b_d040, 0x9140_0400, 0x9100_4000, 0xf940_0400, 0xd65f_03c0]), false),
            Some(0x1000 + 0x10 + 8)
        );
        // Not a plain load: another instruction between, a load not
        // returned, a frame instruction when the register followed is x29.
        let mut odd = sid;
        odd[6] = 0x9100_0421; // add x1, x1, #1
        assert_eq!(tls_offset(&w(&odd), false), None);
        assert_eq!(tls_offset(&w(&[0xd53b_d040, 0xf940_0001, 0xd65f_03c0]), false), None, "into x1");
        assert_eq!(tls_offset(&w(&[0xd53b_d05d, 0x9100_03fd, 0xf940_03a0, 0xd65f_03c0]), false), None, "x29");
        // x86-64: mov %fs:-8,%rax; ret, after endbr64; and the two-step form.
        assert_eq!(
            tls_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x64, 0x48, 0x8b, 0x04, 0x25, 0xf8, 0xff, 0xff, 0xff, 0xc3], true),
            Some(-8)
        );
        assert_eq!(
            tls_offset(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0, 0x48, 0x8b, 0x80, 0x10, 0, 0, 0, 0xc3], true),
            Some(0x10)
        );
        assert_eq!(tls_offset(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0xf8, 0xff, 0xff, 0xff, 0x90], true), None);
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
