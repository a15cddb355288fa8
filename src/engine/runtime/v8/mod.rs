//! V8 (Node.js): find V8 in a process, tell the kernel where its generated
//! code and interpreter lie and which JSFunction and Code fields name a
//! frame (`v8.h`, `v8_walk.h`), and name what the kernel recorded:
//! JavaScript functions with script and line, and in optimized code the
//! functions the JIT inlined at the pc, from the Code's own source
//! positions and deoptimization data (the same data V8's own profiler
//! reads).
//!
//! Offsets come from the postmortem metadata V8 builds into Node's binary
//! (the `v8dbg_` symbols, a class's field found whatever type its name
//! gives it), and what the metadata does not say from the binary's other
//! symbols: the dispatch table functions reach their code through from V8
//! 13 (leaptiering: its size from its table type's template argument, its
//! place in the process found in the isolate group and checked on its own
//! entries), and how source position tables write code offsets (V8 14.x's
//! table builder takes two flags). Where neither says, the field's place is
//! the V8 lines' (each checked on the Node.js releases the tests run: 18
//! to 26, V8 10.2 to 14.6). Another V8 from 10 on is read when its metadata
//! describes every field, and said to be untested; an older one, or one
//! whose metadata lacks a field, is reported, once per process, as not
//! read: its stacks stay native.
pub mod heap;
pub mod tables;

use std::{
    collections::{BTreeMap, HashMap},
    rc::Rc,
};

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
use heap::{smi, untag, Heap, StringLayout};

crate::skeleton!("v8");
use skel::types::v8_proc;
crate::pod!(v8_proc);

/// V8 (Node.js), as the registry knows it.
pub struct NodeRuntime;

/// The registry's entry.
pub static NODE: NodeRuntime = NodeRuntime;

static LANG: Lang = Lang {
    kind: "javascript",
    folded: "_[js]",
    top: "[js]",
    inlined_keeps_mark: false,
    colour: [(195, 2), (170, 1), (30, 1)],
};

impl Runtime for NodeRuntime {
    fn kind(&self) -> u8 {
        rt_kind::RT_V8.0 as u8
    }

    fn name(&self) -> &'static str {
        "node"
    }

    fn library_frame(&self, _name: &str, file: Option<&str>) -> bool {
        // Node's own modules (node:internal/..., node:events).
        file.is_some_and(|f| f.starts_with("node:"))
    }

    fn lang(&self) -> &'static Lang {
        &LANG
    }

    fn versions(&self) -> &'static str {
        VERSIONS
    }

    /// A frame's kind names it apart (an interpreted frame names a
    /// function, an optimized one its code), and a frame in code other than
    /// its function's current code is named by its pc.
    fn name_key(&self) -> (u8, u8) {
        (FLAG_INTERP | FLAG_CODE | FLAG_BASELINE | FLAG_PC, FLAG_PC)
    }

    fn by_file_name(&self, base: &str) -> Option<String> {
        is_node(base).then(|| "Node.js".to_string())
    }

    fn detect(&self, p: &Process) -> Option<Detected> {
        detect(p)
    }
}

/// What this build reads.
pub const VERSIONS: &str = "Node.js 18 and newer (V8 10.2 on; tested: Node.js 18, 20, 22, 24 and 26, V8 10.2, 11.3, \
                            12.4, 13.6 and 14.6, on x86-64 and arm64; others are read where their metadata describes \
                            every field the walk reads, and said to be untested)";
/// The V8 lines tested.
const TESTED: [(u32, u32); 5] = [(10, 2), (11, 3), (12, 4), (13, 6), (14, 6)];
/// The versions tested, for the word on an untested one.
const TESTED_WORDS: &str = "Node.js 18 to 26 (V8 10.2, 11.3, 12.4, 13.6, 14.6)";
/// The name of a function whose name V8 holds as empty.
pub const ANONYMOUS: &str = "(anonymous)";

/// `V8_INTERP`, `V8_BLOBS`.
const INTERP: usize = 8;
const BLOBS: usize = 2;
/// `V8_F_*`.
pub const FLAG_INTERP: u8 = 2;
/// An optimized frame: addr is the Code.
pub const FLAG_CODE: u8 = 4;
/// A baseline frame: addr is the SharedFunctionInfo.
pub const FLAG_BASELINE: u8 = 8;
/// A frame in code other than its function's current code.
pub const FLAG_PC: u8 = 16;
/// The sampled instruction.
pub const FLAG_LEAF: u8 = 32;
/// Longest function or file name read (UTF-16 units).
const MAX_NAME: usize = 4096;
/// Longest script source read to find its lines (units).
const MAX_SOURCE: usize = 32 << 20;
/// Most lines kept of a script.
const MAX_LINES: usize = 4 << 20;
/// Largest table read of one function or code object.
const MAX_TABLE: usize = 1 << 20;
/// Most inlined functions read per code object.
const MAX_INLINED: usize = 4096;
/// Deepest inlining chain followed.
const MAX_CHAIN: usize = 64;
/// How far below a pc the start of its code is looked for (bytes).
const MAX_SCAN: u64 = 1 << 20;

/// The frame slots the kernel reads (`V8_FP_*`; x86-64's and arm64's), as the binary's
/// `v8dbg_off_fp_*` must give them.
const FP_SLOTS: [(&str, i32); 4] =
    [("off_fp_context", -8), ("off_fp_function", -16), ("off_fp_bytecode_array", -32), ("off_fp_bytecode_offset", -40)];

/// Where each field the walk and the naming read lies (bytes), for one V8.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// `Map::instance_type`.
    pub map_type: u64,
    /// Strings.
    pub strings: StringLayout,
    /// Instance types: SharedFunctionInfo, ScopeInfo, Script, Code,
    /// BytecodeArray, InstructionStream (V8 11+), InterpreterData.
    pub t_sfi: u16,
    /// `SCOPE_INFO_TYPE`.
    pub t_scope: u16,
    /// `SCRIPT_TYPE`.
    pub t_script: u16,
    /// `CODE_TYPE`.
    pub t_code: u16,
    /// `BYTECODE_ARRAY_TYPE`.
    pub t_bytecode: u16,
    /// `INSTRUCTION_STREAM_TYPE` (V8 11 and later).
    pub t_istream: Option<u16>,
    /// `INTERPRETER_DATA_TYPE`.
    pub t_interp_data: Option<u16>,
    /// `JSFunction::shared`, `code`.
    pub fn_shared: u64,
    /// `JSFunction::code`, or None where a function reaches its code
    /// through the dispatch table (V8 13 on: leaptiering).
    pub fn_code: Option<u64>,
    /// `JSFunction::dispatch_handle` (a 32-bit handle) with leaptiering.
    pub fn_dispatch: u64,
    /// The dispatch table, as its binary describes it.
    pub dispatch: Option<Dispatch>,
    /// Code: the instructions' address, or (V8 10) where they start in it.
    pub code_start: u64,
    /// Whether the instructions are inside the Code (V8 10).
    pub code_inline: bool,
    /// Code: instruction size.
    pub code_size: u64,
    /// Code: flags.
    pub code_flags: u64,
    /// `CodeKind` in the flags: mask, shift, and BASELINE's value.
    pub kind: (u32, u8, u8),
    /// Code: deoptimization data (baseline: its bytecode or interpreter data).
    pub code_deopt: u64,
    /// Code: source position table (baseline: its bytecode offset table).
    pub code_spt: u64,
    /// Code: its InstructionStream (V8 11+).
    pub code_istream: Option<u64>,
    /// Bytes from an InstructionStream (or V8 10's Code) to its instructions.
    pub istream_hdr: u64,
    /// Deoptimization data indices: inlined function count, literal
    /// array, the code's SharedFunctionInfo, inlining positions.
    pub dd: (u64, u64, u64, u64),
    /// Where the code's SharedFunctionInfo is wrapped (V8 13 on): the
    /// wrapper's `shared_info`.
    pub dd_wrapped: Option<u64>,
    /// Arrays: length (a Smi) and first element.
    pub arr: (u64, u64),
    /// SharedFunctionInfo: function data, name or scope info, script.
    pub sfi: (u64, u64, u64),
    /// Script: source, name, line ends.
    pub script: (u64, u64, u64),
    /// BytecodeArray: length, source position table, first bytecode.
    pub ba: (u64, u64, u64),
    /// ScopeInfo: index of the context-local count, of the first variable part.
    pub scope: (u64, u64),
    /// How source position tables write code offsets.
    pub positions: tables::Encoding,
}

/// V8's table of functions' entry points (leaptiering, V8 13 on): an
/// entry per function, its code at `code_word`, shifted by `code_shift`,
/// found by a handle shifted by `handle_shift`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dispatch {
    /// Bytes the table reserves.
    pub reserved: u64,
    /// Bytes of an entry.
    pub entry: u64,
    /// A handle is the entry's index shifted left by this.
    pub handle_shift: u8,
    /// The entry's word holding the code, from its start.
    pub code_word: u64,
    /// ... shifted left by this.
    pub code_shift: u8,
}

/// A script's name and where its lines end.
#[derive(Debug, PartialEq, Eq)]
pub struct Script {
    /// Its file name or URL ("" for an eval).
    pub name: String,
    /// Offsets of its line terminators (empty: not known).
    pub ends: Vec<u32>,
}

/// A JavaScript function, named.
#[derive(Debug, PartialEq, Eq)]
pub struct JsFn {
    /// Its name, "(anonymous)" when it has none.
    pub name: String,
    /// Its script.
    pub script: Rc<Script>,
    /// Where it starts in the script (a script offset).
    pub start: Option<u32>,
    /// Its bytecode's source positions (empty: V8 has not made them).
    pub positions: Vec<(u32, u64)>,
    /// Its BytecodeArray (tagged; 0 when it has none).
    pub bytecode: u64,
    /// Its name-or-scope-info word when read (a V8_F_PC frame's cookie).
    nos: u64,
    /// Its script and function-data words when read: with `nos`, they
    /// tell a SharedFunctionInfo moved away and another put in its place.
    ident: (u64, u64),
}

impl JsFn {
    /// A function named `name` in a script whose lines end at `ends`, with
    /// bytecode positions `positions` (for tests and the fuzzer).
    pub fn named(name: &str, ends: Vec<u32>, positions: Vec<(u32, u64)>) -> JsFn {
        JsFn {
            name: name.into(),
            script: Rc::new(Script { name: String::new(), ends }),
            start: Some(0),
            positions,
            bytecode: 0,
            nos: 0,
            ident: (0, 0),
        }
    }

    /// The line of script offset `off`.
    pub fn line(&self, off: Option<u32>) -> Option<u32> {
        tables::line_of(&self.script.ends, off?)
    }

    /// The line of its first line.
    pub fn first_line(&self) -> Option<u32> {
        self.line(self.start)
    }

    /// The line of bytecode offset `off` (-1: the function's entry).
    pub fn line_at_bytecode(&self, off: i64) -> Option<u32> {
        if off < 0 {
            return self.first_line();
        }
        let pos = tables::position_at(&self.positions, off.min(u32::MAX as i64) as u32)?;
        self.line(tables::script_offset(pos)).or_else(|| self.first_line())
    }

    fn bytes(&self) -> usize {
        96 + self.name.len() + 12 * self.positions.len()
    }
}

/// What a JavaScript frame's code is.
#[derive(Debug, PartialEq, Eq)]
pub enum JsCode {
    /// An interpreted function; the location is the bytecode-offset slot's
    /// value, `hdr` more than the offset.
    Interpreted {
        /// The function.
        func: Rc<JsFn>,
        /// What the slot adds to the offset.
        hdr: u32,
    },
    /// Baseline code: (pc offset where each bytecode's code starts, bytecode offset).
    Baseline {
        /// The function.
        func: Rc<JsFn>,
        /// By pc offset.
        offsets: Vec<(u32, i32)>,
    },
    /// Optimized code: its source positions by pc offset, and per inlined
    /// call its position in the caller and the function inlined.
    Optimized {
        /// The function compiled.
        func: Rc<JsFn>,
        /// (pc offset, source position).
        positions: Vec<(u32, u64)>,
        /// (the call's source position, the inlined function; None: the
        /// code's own).
        inlined: Vec<(u64, Option<Rc<JsFn>>)>,
        /// What the location adds to the pc offset (V8_F_PC frames' loc is
        /// from pc_base, not from the code's start).
        shift: u32,
    },
    /// A function whose code at the pc could not be found: its name only.
    Function(Rc<JsFn>),
}

impl JsCode {
    /// The source frames at `loc`, innermost first: (function, line).
    pub fn frames(&self, loc: u32, flags: u8) -> Vec<(Rc<JsFn>, Option<u32>)> {
        // A return address stands after its call: look up the call.
        let back = |x: u32| if flags & FLAG_LEAF != 0 { x } else { x.saturating_sub(1) };
        match self {
            JsCode::Interpreted { func, hdr } => {
                vec![(func.clone(), func.line_at_bytecode(loc as i64 - *hdr as i64))]
            }
            JsCode::Baseline { func, offsets } => {
                let bc = tables::bytecode_at(offsets, back(loc)).unwrap_or(-1);
                vec![(func.clone(), func.line_at_bytecode(bc as i64))]
            }
            JsCode::Optimized { func, positions, inlined, shift } => {
                let Some(mut pos) = loc.checked_sub(*shift).and_then(|o| tables::position_at(positions, back(o)))
                else {
                    return vec![(func.clone(), func.first_line())];
                };
                let mut out = Vec::new();
                for _ in 0..MAX_CHAIN {
                    let id = tables::inlining_id(pos) as usize;
                    let off = tables::script_offset(pos);
                    if id == 0 || id > inlined.len() {
                        break;
                    }
                    let (call, f) = &inlined[id - 1];
                    let f = f.clone().unwrap_or_else(|| func.clone());
                    out.push((f.clone(), f.line(off)));
                    // Inlined calls are numbered after their callers'.
                    if tables::inlining_id(*call) as usize >= id {
                        pos = 0;
                        break;
                    }
                    pos = *call;
                }
                let off = tables::script_offset(pos);
                out.push((func.clone(), func.line(off).or_else(|| func.first_line())));
                out
            }
            JsCode::Function(func) => vec![(func.clone(), None)],
        }
    }

    fn bytes(&self) -> usize {
        match self {
            JsCode::Optimized { positions, inlined, .. } => 64 + 12 * positions.len() + 24 * inlined.len(),
            JsCode::Baseline { offsets, .. } => 64 + 8 * offsets.len(),
            _ => 32,
        }
    }
}

/// A V8 sonde reads, in one process.
#[derive(Debug)]
pub struct V8 {
    /// "11.3.244.8".
    pub version: String,
    /// The binary that holds V8 as the process maps it.
    pub image: String,
    /// Field offsets.
    pub l: Layout,
    /// The embedded builtins (in the binary; V8's copy in its code range).
    pub blobs: Vec<(u64, u64)>,
    /// The interpreter's code in them.
    pub interp: Vec<(u64, u64)>,
    /// V8's code range, where it generates code.
    pub code_range: Option<(u64, u64)>,
    /// V8_F_PC frames count from here.
    pub pc_base: u64,
    /// `Bytecodes::kBytecodeSizes` (empty when the binary names none).
    sizes: Vec<u8>,
    /// Map → instance type.
    types: HashMap<u64, u16>,
    /// Functions named, by SharedFunctionInfo.
    fns: HashMap<u64, Rc<JsFn>>,
    /// Scripts read, by (Script, its source string).
    scripts: HashMap<(u64, u64), Rc<Script>>,
    /// Code found, by instructions' start: (end, the Code).
    codes: BTreeMap<u64, (u64, u64)>,
    /// Pages of generated code the search for a pc's code may still read
    /// in this drain.
    scan_pages: u32,
    /// Frames in code other than their function's current code named by
    /// the function alone: its code was not found below the pc, or the
    /// drain's search budget was spent.
    pub code_not_found: u64,
    /// ... of those, because the budget was spent.
    pub search_budget_spent: u64,
    /// Where the dispatch table is in this process (leaptiering), once found.
    pub dispatch_base: Option<u64>,
    /// `IsolateGroup::default_isolate_group_` in this process: the object
    /// that holds the dispatch table's base.
    group: Option<u64>,
    /// Read although not tested: the versions tested.
    untested: Option<String>,
}

/// Pages of generated code read per drain looking for the code at a pc.
const SCAN_PAGES: u32 = 4096;

/// Whether a mapped file's name is a Node.js binary or library.
pub fn is_node(base: &str) -> bool {
    let b = base.trim_end_matches(" (deleted)");
    b == "node" || b == "nodejs" || b.starts_with("node1") || b.starts_with("node2") || b.starts_with("libnode.so")
}

/// The v8dbg_ values of a binary, by name without the prefix.
type Dbg = HashMap<String, i64>;

fn dbg_values(elf: &ElfSyms, syms: &HashMap<String, Sym>) -> Dbg {
    let mut out = Dbg::new();
    for (name, s) in syms.iter().filter(|(n, _)| n.starts_with("v8dbg_")) {
        if let Some(b) = elf.read_vaddr(s.addr, 4) {
            out.insert(name["v8dbg_".len()..].to_string(), le::<4>(&b, 0) as u32 as i32 as i64);
        }
    }
    out
}

/// The symbols detection reads, besides the `v8dbg_` and `Builtins_` ones.
const SYMBOLS: &[&str] = &[
    GROUP,
    "_ZN2v88internal7Version6major_E",
    "_ZN2v88internal7Version6minor_E",
    "_ZN2v88internal7Version6build_E",
    "_ZN2v88internal7Version6patch_E",
    "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE",
    "v8_Default_embedded_blob_code_data_",
    "v8_Default_embedded_blob_code_",
    "v8_Default_embedded_blob_code_size_",
];

/// `v8::internal::IsolateGroup::default_isolate_group_`.
const GROUP: &str = "_ZN2v88internal12IsolateGroup22default_isolate_group_E";
/// `SourcePositionTableBuilder::AddPosition(...)`: its arguments tell how
/// the binary writes source position tables.
const ADD_POSITION: &str = "_ZN2v88internal26SourcePositionTableBuilder11AddPosition";
/// A symbol whose template arguments give the dispatch table's size.
const DISPATCH_TABLE: &str = "_ZN2v88internal14SegmentedTableINS0_15JSDispatchEntryELm";

/// The dispatch table as the binary describes it: its reservation, from
/// the template argument of its table type (`SegmentedTable<JSDispatchEntry,
/// SIZE>`); an entry is 16 bytes, its code at +8 shifted left by 16, and a
/// handle is the index shifted left by 32 less the index's bits (V8's
/// js-dispatch-table.h; checked on the process's own entries before use).
fn dispatch_table(elf: &ElfSyms, syms: &HashMap<String, Sym>) -> Option<Dispatch> {
    let _ = elf;
    let name = syms.keys().find(|k| k.starts_with(DISPATCH_TABLE))?;
    let digits: String = name[DISPATCH_TABLE.len()..].chars().take_while(|c| c.is_ascii_digit()).collect();
    let reserved: u64 = digits.parse().ok()?;
    let entries = reserved / 16;
    if !reserved.is_power_of_two() || !(1 << 16..=1 << 32).contains(&entries) {
        return None;
    }
    Some(Dispatch {
        reserved,
        entry: 16,
        handle_shift: 32 - entries.trailing_zeros() as u8,
        code_word: 8,
        code_shift: 16,
    })
}

/// What a Node binary tells of its V8, read once per file (a host runs
/// many processes of one binary).
#[derive(Debug, Clone)]
struct Image {
    /// "11.3.244.8".
    version: String,
    l: Layout,
    sizes: Vec<u8>,
    segments: Vec<crate::engine::unwind::elf::Segment>,
    /// The embedded builtins: virtual address, size, file offset.
    blob: (u64, u64, u64),
    /// The interpreter's code in them (virtual addresses).
    ranges: Ranges,
    /// Read although not tested: the versions tested.
    untested: Option<String>,
    /// `IsolateGroup::default_isolate_group_`'s virtual address.
    group: Option<u64>,
}

/// Images read, by the file's device, inode, size and modification time.
type ImageKey = (u64, u64, u64, i64);

fn images() -> &'static std::sync::Mutex<HashMap<ImageKey, Result<Image, String>>> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<HashMap<ImageKey, Result<Image, String>>>> =
        std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Reads a Node binary: its V8's version, layout and builtins; Err says
/// why it is not read (the version, when known, first).
fn read_image(file: std::fs::File) -> Result<Image, String> {
    let elf = ElfSyms::open(file).ok().ok_or("Node.js (V8)\0its binary cannot be read as an ELF file")?;
    // One pass over the binary's symbols (a Node has some 300,000).
    let syms = elf.collect(SYMBOLS, &["v8dbg_", "Builtins_", DISPATCH_TABLE, ADD_POSITION], 1 << 15);
    let d = dbg_values(&elf, &syms);
    if d.is_empty() {
        return Err("Node.js (V8)\0its binary carries no V8 postmortem metadata (v8dbg_ symbols)".into());
    }
    let part = |n: &str| {
        syms.get(&format!("_ZN2v88internal7Version6{n}_E"))
            .and_then(|s| elf.read_vaddr(s.addr, 4))
            .map(|b| le::<4>(&b, 0) as u32)
    };
    let (Some(major), Some(minor), Some(build)) = (part("major"), part("minor"), part("build")) else {
        return Err("Node.js (V8)\0its binary does not say which V8 it is".into());
    };
    let version = format!("{major}.{minor}.{build}.{}", part("patch").unwrap_or(0));
    let what = format!("Node.js (V8 {version})\0");
    if major < 10 {
        return Err(format!("{what}this sonde reads {VERSIONS}"));
    }
    // Every other V8 is read from its metadata; one whose metadata lacks
    // a field, or describes a layout this sonde does not walk, is not.
    let mut l = layout(&d, (major, minor)).map_err(|e| format!("{what}{e}"))?;
    l.dispatch = dispatch_table(&elf, &syms);
    // Source position tables: V8 14.x writes code offsets unsigned with two
    // flags below them, and its table builder takes both flags.
    l.positions = if syms.keys().any(|k| k.starts_with(ADD_POSITION) && k.ends_with("SourcePositionEbb")) {
        tables::Encoding::Flagged
    } else {
        tables::Encoding::Signed
    };
    if l.fn_code.is_none() && l.dispatch.is_none() {
        return Err(format!(
            "{what}its functions' code is reached through a dispatch table its binary does not describe"
        ));
    }
    let sizes = syms
        .get("_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE")
        .copied()
        .filter(|s| s.size % 3 == 0 && s.size > 0 && s.size <= 3 * 256)
        .and_then(|s| elf.read_vaddr(s.addr, s.size))
        .filter(|b| b.iter().all(|&x| (1..32).contains(&x)))
        .unwrap_or_default();
    let (blob, ranges) = builtins(&elf, &syms)
        .ok_or_else(|| format!("{what}its binary names no embedded builtins (v8_Default_embedded_blob_code_)"))?;
    let untested = (!TESTED.contains(&(major, minor))).then(|| TESTED_WORDS.to_string());
    let group = syms.get(GROUP).map(|s| s.addr);
    Ok(Image { version, l, sizes, segments: elf.segments.clone(), blob, ranges, untested, group })
}

/// The V8 in `pid`, if it runs one.
fn detect(p: &Process) -> Option<Detected> {
    let (pid, maps) = (p.pid, &p.maps);
    let m = maps.iter().find(|m| m.exec && m.is_file() && is_node(m.base()))?;
    let unsupported = |e: &str| {
        let (what, why) = e.split_once('\0').unwrap_or(("Node.js (V8)", e));
        Detected::not_read(what, why)
    };
    let Some(file) = m.open(pid) else {
        return Some(unsupported("its binary cannot be opened"));
    };
    let key = file.metadata().ok().map(|md| {
        use std::os::unix::fs::MetadataExt;
        (md.dev(), md.ino(), md.size(), md.mtime())
    });
    let cached = key.and_then(|k| images().lock().ok()?.get(&k).cloned());
    let image = match cached {
        Some(r) => r,
        None => {
            let r = read_image(file);
            if let (Some(k), Ok(mut c)) = (key, images().lock()) {
                if c.len() >= 64 {
                    c.clear();
                }
                c.insert(k, r.clone());
            }
            r
        }
    };
    let img = match image {
        Ok(i) => i,
        Err(e) => return Some(unsupported(&e)),
    };
    let bias = maps.iter().filter(|x| x.path == m.path).find_map(|x| bias_of(&img.segments, x.start, x.offset))?;
    let (blobs, interp) = placed(&img, m, maps, bias);
    let code_range = code_range(maps, &blobs);
    let pc_base = code_range.map(|r| r.0).unwrap_or(0);
    let group = img.group.map(|g| g.wrapping_add(bias));
    let mut v = V8 {
        version: img.version,
        image: m.path.clone(),
        l: img.l,
        blobs,
        interp,
        code_range,
        pc_base,
        sizes: img.sizes,
        types: HashMap::new(),
        fns: HashMap::new(),
        scripts: HashMap::new(),
        codes: BTreeMap::new(),
        scan_pages: SCAN_PAGES,
        code_not_found: 0,
        search_budget_spent: 0,
        dispatch_base: None,
        group,
        untested: img.untested,
    };
    if let Some(mem) = p.mem() {
        v.find_dispatch(mem, maps);
    }
    Some(Detected::Read(Box::new(v)))
}

/// The offsets of V8 `ver` from its metadata, with the fields it lacks
/// placed as the V8 lines it is like lay them out.
fn layout(d: &Dbg, ver: (u32, u32)) -> Result<Layout, String> {
    let get = |names: &[&str]| names.iter().find_map(|n| d.get(*n).copied());
    let need = |names: &[&str]| get(names).ok_or_else(|| format!("its V8 metadata lacks v8dbg_{}", names[0]));
    let off = |names: &[&str]| -> Result<u64, String> {
        let v = need(names)?;
        if (0..=4096).contains(&v) {
            Ok(v as u64)
        } else {
            Err(format!("its V8 metadata gives v8dbg_{} as {v}", names[0]))
        }
    };
    let ty = |names: &[&str]| -> Result<u16, String> { Ok(need(names)? as u16) };
    // A class's field, whatever type the metadata gives it (the type in
    // its name changes from line to line).
    let field = |class: &str, name: &str| -> Option<u64> {
        let prefix = format!("class_{class}__{name}__");
        let mut v: Vec<(&String, &i64)> = d.iter().filter(|(k, _)| k.starts_with(&prefix)).collect();
        v.sort();
        v.first().map(|(_, &x)| x).filter(|x| (0..=4096).contains(x)).map(|x| x as u64)
    };
    let need_field = |class: &str, name: &str| {
        field(class, name).ok_or_else(|| format!("its V8 metadata lacks v8dbg_class_{class}__{name}"))
    };
    // The tagging scheme the kernel assumes: heap objects tagged 01, Smis
    // in the upper half of a word (no pointer compression).
    if get(&["HeapObjectTag"]) != Some(1)
        || get(&["HeapObjectTagMask"]) != Some(3)
        || get(&["SmiTag"]).unwrap_or(0) != 0
        || get(&["SmiTagMask"]) != Some(1)
        || get(&["SmiShiftSize"]) != Some(31)
    {
        return Err("it tags values as this sonde does not read (a build with pointer compression)".into());
    }
    for (n, want) in FP_SLOTS {
        if get(&[n]) != Some(want as i64) {
            return Err(format!("its frames keep v8dbg_{n} at {:?}, not {want}", get(&[n])));
        }
    }
    let strings = StringLayout {
        first_nonstring: ty(&["FirstNonstringType"])?,
        len: off(&["class_String__length__int32_t"])?,
        chars: off(&["class_SeqOneByteString__chars__char"])?,
        cons: (off(&["class_ConsString__first__String"])?, off(&["class_ConsString__second__String"])?),
        thin: off(&["class_ThinString__actual__String"])?,
        sliced: (off(&["class_SlicedString__parent__String"])?, off(&["class_SlicedString__offset__SMI"])?),
        // The characters' address, cached after the resource's.
        external_data: off(&["class_ExternalString__resource__Object"])? + 8,
        repr: (
            get(&["SeqStringTag"]).unwrap_or(0) as u16,
            ty(&["ConsStringTag"])?,
            ty(&["ExternalStringTag"])?,
            ty(&["SlicedStringTag"])?,
            ty(&["ThinStringTag"])?,
        ),
        repr_mask: ty(&["StringRepresentationMask"])?,
        encoding: (ty(&["StringEncodingMask"])?, ty(&["OneByteStringTag"])?),
    };
    let fn_shared = need_field("JSFunction", "shared")?;
    // JSFunction::code: named in 10.2 and 12.4's metadata; in 11.3 three
    // words after `shared`; from 13 there is none: the word before
    // `shared` holds the function's handle in the dispatch table.
    let (fn_code, fn_dispatch) = match field("JSFunction", "code") {
        Some(v) => (Some(v), 0),
        None if ver == (11, 3) => (Some(fn_shared + 24), 0),
        None => (None, fn_shared.checked_sub(8).ok_or("JSFunction::shared is its first field")?),
    };
    let arr = (off(&["class_FixedArrayBase__length__SMI"])?, off(&["class_FixedArray__data__uintptr_t"])?);
    let kind = (
        need(&["CodeKindFieldMask"])? as u32,
        get(&["CodeKindFieldShift"]).unwrap_or(0) as u8,
        need(&["CodeKindBaseline"])? as u8,
    );
    // Code: V8 10 holds the instructions in it; V8 11 names its tables in
    // the metadata; from 12, the tables are the two words after the map
    // (before the wrapper) and the instructions are elsewhere.
    let form = if get(&["type_InstructionStream__INSTRUCTION_STREAM_TYPE"]).is_none() {
        10
    } else if get(&["class_Code__source_position_table__ByteArray"]).is_some() {
        11
    } else {
        12
    };
    let (code_start, code_inline, code_size, code_flags, code_deopt, code_spt, code_istream, istream_hdr) = match form {
        10 => {
            // Code holds its instructions; the position table and the
            // deoptimization data are the two words before its size's.
            let start = off(&["class_Code__instruction_start__uintptr_t"])?;
            let size = off(&["class_Code__instruction_size__int"])?;
            let before =
                |n: u64| size.checked_sub(n).ok_or_else(|| format!("its V8 metadata gives Code's size at {size}"));
            (start, true, size, off(&["class_Code__flags__uint32_t"])?, before(24)?, before(16)?, None, start)
        }
        11 => {
            // The metadata names the tables; the instruction start follows
            // the InstructionStream, then flags and (before 11.4) two
            // 16-bit fields, then the size.
            let spt = off(&["class_Code__source_position_table__ByteArray"])?;
            let deopt = off(&["class_Code__deoptimization_data__FixedArray"])?;
            let hdr = off(&["class_InstructionStream__instruction_start__uintptr_t"])?;
            (spt + 16, false, spt + 32, spt + 24, deopt, spt, Some(spt + 8), hdr)
        }
        _ => {
            // 12.4 on: the tables are the two words after the map.
            let wrapper = need_field("Code", "wrapper")?;
            (
                need_field("Code", "instruction_start")?,
                false,
                need_field("Code", "instruction_size")?,
                need_field("Code", "flags")?,
                wrapper.checked_sub(16).ok_or("Code::wrapper is among its first fields")?,
                wrapper - 8,
                Some(need_field("Code", "instruction_stream")?),
                need_field("InstructionStream", "instruction_start")?,
            )
        }
    };
    // The deoptimization data's indices (V8 10's metadata has none: its
    // places then). From 13 the code's SharedFunctionInfo is wrapped.
    let old = get(&["DeoptimizationDataInlinedFunctionCountIndex"]).is_none();
    let index = |name: &str, before: i64| -> Result<u64, String> {
        match get(&[name]) {
            Some(v) if (0..64).contains(&v) => Ok(v as u64),
            None if old => Ok(before as u64),
            _ => Err(format!("its V8 metadata lacks v8dbg_{name}")),
        }
    };
    let (sfi_index, dd_wrapped) = match get(&["DeoptimizationDataSharedFunctionInfoIndex"]) {
        Some(v) => (v as u64, None),
        None if old => (6, None),
        None => (
            index("DeoptimizationDataWrappedSharedFunctionInfoIndex", 0)?,
            Some(need_field("SharedFunctionInfoWrapper", "shared_info")?),
        ),
    };
    let dd = (
        index("DeoptimizationDataInlinedFunctionCountIndex", 1)?,
        index("DeoptimizationDataLiteralArrayIndex", 2)?,
        sfi_index,
        index("DeoptimizationDataInliningPositionsIndex", 7)?,
    );
    let sfi = (
        // The function data (the trusted one in 12.4) is the word after the map.
        get(&["class_SharedFunctionInfo__function_data__Object"]).unwrap_or(8) as u64,
        need_field("SharedFunctionInfo", "name_or_scope_info")?,
        off(&[
            "class_SharedFunctionInfo__script_or_debug_info__HeapObject",
            "class_SharedFunctionInfo__script__Tagged_HeapObject_",
            "class_SharedFunctionInfo__raw_script__Tagged_Object_",
        ])?,
    );
    let script = (
        off(&["class_Script__source__Object"])?,
        off(&["class_Script__name__Object"])?,
        off(&["class_Script__line_ends__Object"])?,
    );
    // BytecodeArray: its position table is the fourth word in 10.2 and
    // 11.3 (after the constant pool and handler table), the third in 12.4
    // (after its wrapper).
    let ba = (
        get(&["class_BytecodeArray__length__SMI"]).map(|v| v as u64).unwrap_or(arr.0),
        match field("BytecodeArray", "wrapper") {
            Some(w) => w + 8,
            None => 32,
        },
        off(&["class_BytecodeArray__data__uintptr_t"])?,
    );
    Ok(Layout {
        map_type: off(&["class_Map__instance_type__uint16_t"])?,
        strings,
        t_sfi: ty(&["type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE"])?,
        t_scope: ty(&["type_ScopeInfo__SCOPE_INFO_TYPE"])?,
        t_script: ty(&["type_Script__SCRIPT_TYPE"])?,
        t_code: ty(&["type_Code__CODE_TYPE"])?,
        t_bytecode: ty(&["type_BytecodeArray__BYTECODE_ARRAY_TYPE"])?,
        t_istream: get(&["type_InstructionStream__INSTRUCTION_STREAM_TYPE"]).map(|v| v as u16),
        t_interp_data: get(&["type_InterpreterData__INTERPRETER_DATA_TYPE"]).map(|v| v as u16),
        fn_shared,
        fn_code,
        fn_dispatch,
        dispatch: None,
        code_start,
        code_inline,
        code_size,
        code_flags,
        kind,
        code_deopt,
        code_spt,
        code_istream,
        istream_hdr,
        dd,
        dd_wrapped,
        arr,
        sfi,
        script,
        ba,
        scope: (
            get(&["scopeinfo_idx_ncontextlocals"]).unwrap_or(2) as u64,
            get(&["scopeinfo_idx_first_vars"]).unwrap_or(3) as u64,
        ),
        positions: tables::Encoding::Signed,
    })
}

/// Address ranges, [start, end).
type Ranges = Vec<(u64, u64)>;

/// The embedded builtins in the binary (virtual address, size, file
/// offset) and the interpreter's code in them: its entry trampolines and
/// bytecode handlers, from the binary's symbols (the whole builtins where
/// it names none).
fn builtins(elf: &ElfSyms, s: &HashMap<String, Sym>) -> Option<((u64, u64, u64), Ranges)> {
    let in_exec = |a: u64| elf.segments.iter().any(|g| g.exec && g.vaddr <= a && a < g.vaddr.saturating_add(g.filesz));
    let start = s
        .get("v8_Default_embedded_blob_code_data_")
        .or_else(|| s.get("v8_Default_embedded_blob_code_"))
        .map(|x| x.addr)
        .filter(|&a| in_exec(a))?;
    let size =
        s.get("v8_Default_embedded_blob_code_size_").and_then(|x| elf.read_vaddr(x.addr, 4)).map(|b| le::<4>(&b, 0))?;
    if size == 0 || size > 256 << 20 {
        return None;
    }
    let end = start.checked_add(size)?;
    let file_off = elf
        .segments
        .iter()
        .find(|g| g.vaddr <= start && start < g.vaddr.saturating_add(g.filesz))
        .and_then(|g| (start - g.vaddr).checked_add(g.offset))?;
    let mut syms: Vec<(u64, &String)> = s
        .iter()
        .filter(|(n, x)| n.starts_with("Builtins_") && x.addr >= start && x.addr < end)
        .map(|(n, x)| (x.addr, n))
        .collect();
    syms.sort();
    let after = |name: &str| -> Option<(u64, u64)> {
        let i = syms.iter().position(|(_, n)| *n == name)?;
        Some((syms[i].0, syms.get(i + 1).map(|x| x.0).unwrap_or(end)))
    };
    let mut ranges: Ranges = Vec::new();
    for group in [
        &["Builtins_InterpreterEntryTrampoline", "Builtins_InterpreterEntryTrampolineForProfiling"][..],
        &["Builtins_InterpreterEnterAtBytecode", "Builtins_InterpreterEnterAtNextBytecode"][..],
    ] {
        let parts: Vec<(u64, u64)> = group.iter().filter_map(|n| after(n)).collect();
        if let (Some(lo), Some(hi)) = (parts.iter().map(|p| p.0).min(), parts.iter().map(|p| p.1).max()) {
            // Only where the group's builtins are next to each other.
            if hi - lo < 0x4000 {
                ranges.push((lo, hi));
            }
        }
    }
    // The bytecode handlers: a run of `*Handler` builtins from the first
    // one, `WideHandler` (other builtins end in "Handler" too: Node 24 has
    // a thousand builtins between AtomicsMutexAsyncUnlockResolveHandler and
    // it).
    let first = syms
        .iter()
        .position(|(_, n)| *n == "Builtins_WideHandler")
        .or_else(|| syms.iter().position(|(_, n)| n.ends_with("Handler")));
    if let Some(i) = first {
        let stop = syms[i..].iter().find(|(_, n)| !n.ends_with("Handler")).map(|x| x.0).unwrap_or(end);
        ranges.push((syms[i].0, stop));
    }
    if ranges.len() < 3 {
        ranges = vec![(start, end)];
    }
    Some(((start, size, file_off), ranges))
}

/// The builtins and the interpreter's code where a process maps them: the
/// binary's copy, and V8's own (the same file's pages mapped again,
/// elsewhere).
fn placed(img: &Image, m: &MapLine, maps: &[MapLine], bias: u64) -> (Ranges, Ranges) {
    let (start, size, fo) = img.blob;
    let mut blobs = vec![(start.wrapping_add(bias), start.wrapping_add(size).wrapping_add(bias))];
    let mut interp: Ranges = img.ranges.iter().map(|&(a, b)| (a.wrapping_add(bias), b.wrapping_add(bias))).collect();
    for x in maps.iter().filter(|x| x.path == m.path && x.exec) {
        if x.offset <= fo && fo < x.offset + (x.end - x.start) {
            let at = x.start + (fo - x.offset);
            if at != start.wrapping_add(bias) && at.saturating_add(size) <= x.end {
                blobs.push((at, at + size));
                interp.extend(img.ranges.iter().map(|&(a, b)| (a - start + at, b - start + at)));
                break;
            }
        }
    }
    blobs.truncate(BLOBS);
    interp.truncate(INTERP);
    (blobs, interp)
}

/// V8's code range: the anonymous executable mappings (and V8's copy of
/// its builtins) with the reservation around them (the anonymous mappings
/// next to them, inaccessible ones included).
pub fn code_range(maps: &[MapLine], blobs: &[(u64, u64)]) -> Option<(u64, u64)> {
    let all: Vec<(u64, u64, bool, bool)> = maps.iter().map(|m| (m.start, m.end, m.exec, m.is_anon())).collect();
    let copy = blobs.get(1).copied();
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (i, &(s, e, exec, anon)) in all.iter().enumerate() {
        let is_copy = copy.is_some_and(|(a, _)| s <= a && a < e);
        if !(is_copy || exec && anon) {
            continue;
        }
        let (mut lo, mut hi) = (s, e);
        let mut j = i;
        while j > 0 && all[j - 1].3 && all[j - 1].1 == lo {
            j -= 1;
            lo = all[j].0;
        }
        let mut k = i;
        while k + 1 < all.len() && all[k + 1].0 == hi {
            let (ns, ne, _, nanon) = all[k + 1];
            if !(nanon || copy.is_some_and(|(a, _)| ns <= a && a < ne)) {
                break;
            }
            k += 1;
            hi = ne;
        }
        spans.push((lo, hi));
    }
    spans.sort();
    // Join spans close to each other; keep the one with V8's copy of the
    // builtins, else the largest.
    let mut joined: Vec<(u64, u64)> = Vec::new();
    for (a, b) in spans {
        match joined.last_mut() {
            Some(l) if a <= l.1.saturating_add(64 << 20) && b.saturating_sub(l.0) <= 4 << 30 => l.1 = l.1.max(b),
            _ => joined.push((a, b)),
        }
    }
    if let Some((a, _)) = copy {
        if let Some(r) = joined.iter().find(|r| r.0 <= a && a < r.1) {
            return Some(*r);
        }
    }
    joined.into_iter().max_by_key(|r| r.1 - r.0)
}

/// `struct v8_proc`.
pub fn bpf_config(v: &V8) -> v8_proc {
    let l = &v.l;
    let mut c = v8_proc {
        pc_base: v.pc_base,
        fn_shared: l.fn_shared as u16,
        fn_code: l.fn_code.unwrap_or(0) as u16,
        fn_dispatch: l.fn_dispatch as u16,
        code_start: l.code_start as u16,
        code_size: l.code_size as u16,
        code_flags: l.code_flags as u16,
        sfi_name: l.sfi.1 as u16,
        code_inline: l.code_inline as u8,
        kind_shift: l.kind.1,
        kind_mask: l.kind.0 as u8,
        kind_baseline: l.kind.2,
        ninterp: v.interp.len().min(INTERP) as u8,
        nblobs: v.blobs.len().min(BLOBS) as u8,
        ..Default::default()
    };
    if let (Some(base), Some(d)) = (v.dispatch_base, l.dispatch) {
        c.dispatch_base = base;
        c.dispatch_entries = (d.reserved / d.entry) as u32;
        c.dispatch_entry = d.entry as u8;
        c.dispatch_code = d.code_word as u8;
        c.handle_shift = d.handle_shift;
        c.code_shift = d.code_shift;
    }
    for (i, &(lo, hi)) in v.interp.iter().take(INTERP).enumerate() {
        c.interp_lo[i] = lo;
        c.interp_hi[i] = hi;
    }
    for (i, &(lo, hi)) in v.blobs.iter().take(BLOBS).enumerate() {
        c.blob_lo[i] = lo;
        c.blob_hi[i] = hi;
    }
    c
}

impl Instance for V8 {
    fn about(&self) -> About {
        let fmt = |r: &[(u64, u64)]| r.iter().map(|(a, b)| format!("{a:#x}-{b:#x}")).collect::<Vec<_>>();
        let code = self.code_range.map(|(a, b)| format!("{a:#x}-{b:#x}"));
        let mut fields = serde_json::Map::new();
        fields.insert("code_range".into(), code.clone().into());
        fields.insert("builtins".into(), fmt(&self.blobs).into());
        fields.insert("interpreter".into(), fmt(&self.interp).into());
        About {
            runtime: format!("Node.js (V8 {})", self.version),
            image: self.image.clone(),
            offsets: "v8dbg_ metadata",
            module: "node".into(),
            untested: self.untested.clone(),
            detail: format!(
                "code range {}; builtins {}; interpreter {}",
                code.as_deref().unwrap_or("not found"),
                fmt(&self.blobs).join(", "),
                fmt(&self.interp).join(", ")
            ),
            fields,
        }
    }

    fn config(&self) -> ProcConfig {
        ProcConfig { ranges: Vec::new(), jit: jit_ranges(self), part: ProcConfig::part_of(&bpf_config(self)) }
    }

    fn remapped(&mut self, p: &Process) -> Option<ProcConfig> {
        // V8's code range may have grown, or its dispatch table been made.
        let mut changed = false;
        let r = code_range(&p.maps, &self.blobs);
        if r.is_some() && r != self.code_range {
            self.code_range = r;
            changed = true;
        }
        if self.dispatch_base.is_none() && self.l.dispatch.is_some() {
            if let Some(mem) = p.mem() {
                self.find_dispatch(mem, &p.maps);
                changed |= self.dispatch_base.is_some();
            }
        }
        changed.then(|| self.config())
    }

    fn settled(&self) -> bool {
        self.code_range.is_some() && (self.l.dispatch.is_none() || self.dispatch_base.is_some())
    }

    fn code_info(&mut self, mem: &Mem, s: &Seen) -> Result<CodeInfo, &'static str> {
        self.name_code(mem, s.addr, s.cookie, s.flags, s.loc)
    }

    fn read_again(&self, info: &CodeInfo) -> bool {
        // V8 may have been changing the function (its ScopeInfo, while it
        // compiled it) as sonde read it: an "(anonymous)" is read again.
        info.name == ANONYMOUS
    }

    fn end_drain(&mut self) {
        self.reset_drain()
    }

    fn partly_named(&self, out: &mut std::collections::BTreeMap<&'static str, u64>) {
        *out.entry("code_not_found").or_default() += self.code_not_found;
    }
}

/// The ranges of code the kernel hands to the V8 stepper: the code range
/// (with V8's copy of the builtins) and the binary's builtins.
pub fn jit_ranges(v: &V8) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    if let Some(r) = v.code_range {
        out.push(r);
    }
    for &b in &v.blobs {
        if !out.iter().any(|r: &(u64, u64)| r.0 <= b.0 && b.1 <= r.1) {
            out.push(b);
        }
    }
    out.truncate(super::JIT_RANGES);
    out
}

/// A Code object's cookie (`v8_code_cookie` in v8.h).
pub fn code_cookie(start: u64, size: u32) -> u16 {
    let h = ((start >> 6) as u32).wrapping_mul(0x9e3779b1) ^ size.wrapping_mul(0x85ebca6b);
    (h ^ (h >> 16)) as u16
}

/// A Code object as read: (instructions' start, size, kind).
struct CodeHead {
    start: u64,
    size: u32,
    kind: u8,
    deopt: u64,
    spt: u64,
}

impl V8 {
    /// Finds the dispatch table of this process (leaptiering): a word of
    /// the isolate group that points at an anonymous mapping whose entries
    /// are functions' code, each entry's code starting at the entry point
    /// beside it. Left unfound (the kernel then records the function and
    /// the pc, and the code is looked for below the pc) until the table
    /// checks out.
    fn find_dispatch(&mut self, mem: &Mem, maps: &[MapLine]) {
        let (Some(d), None, Some(group)) = (self.l.dispatch, self.dispatch_base, self.group) else { return };
        let Some(obj) = mem.u64(group).filter(|&g| g != 0) else { return };
        // The group object: its first 1 MiB at most, 64 KiB at a time.
        let mut words = Vec::new();
        for i in 0..16u64 {
            let Some(b) = obj.checked_add(i * 0x10000).and_then(|a| mem.bytes(a, 0x10000)) else { break };
            words.extend(b.chunks_exact(8).map(|c| le::<8>(c, 0)));
        }
        let starts: std::collections::HashSet<u64> = maps.iter().filter(|m| m.is_anon()).map(|m| m.start).collect();
        let mut tried = std::collections::HashSet::new();
        for &w in words.iter().filter(|w| starts.contains(w)) {
            if tried.insert(w) && self.dispatch_checks(mem, w, &d) {
                self.dispatch_base = Some(w);
                return;
            }
        }
    }

    /// Whether the table at `base` holds functions' code: of the live
    /// entries in its first writable 64 KiB (after a read-only segment),
    /// at least 8, and 9 in 10 of those read, are Code objects whose
    /// instructions start at the entry point beside them.
    fn dispatch_checks(&mut self, mem: &Mem, base: u64, d: &Dispatch) -> bool {
        for seg in 0..4u64 {
            let Some(block) = base.checked_add(seg * 0x10000).and_then(|a| mem.bytes(a, 0x10000)) else {
                return false;
            };
            let (mut good, mut seen) = (0u32, 0u32);
            for e in block.chunks_exact(d.entry as usize) {
                let (entry, word) = (le::<8>(e, 0), le::<8>(e, d.code_word as usize));
                if entry == 0 || entry >> 48 == 0xffff || word == 0 {
                    continue;
                }
                seen += 1;
                let code = (word >> d.code_shift) | 1;
                if self.code_head(mem, code).is_ok_and(|h| h.start == entry) {
                    good += 1;
                }
                if seen >= 512 {
                    break;
                }
            }
            if seen > 0 {
                return good >= 8 && good * 10 >= seen * 9;
            }
        }
        false
    }

    /// Whether Code of kind `kind` is optimized (Maglev or TurboFan: the
    /// two kinds after baseline; wasm's follow them).
    fn is_optimized(&self, kind: u8) -> bool {
        let b = self.l.kind.2;
        kind > b && kind <= b.saturating_add(2)
    }

    fn heap<'a>(&'a mut self, mem: &'a Mem) -> (Heap<'a>, &'a Layout) {
        (Heap { mem, map_type: self.l.map_type, types: &mut self.types }, &self.l)
    }

    /// Reads the Code `code` (tagged) points at.
    fn code_head(&mut self, mem: &Mem, code: u64) -> Result<CodeHead, &'static str> {
        let (mut h, l) = self.heap(mem);
        if h.type_of(code) != Some(l.t_code) {
            return Err("not_code");
        }
        let b = h.object(code, 64).ok_or("unreadable")?;
        let start =
            if l.code_inline { untag(code).unwrap_or(0) + l.code_start } else { le::<8>(&b, l.code_start as usize) };
        let flags = le::<4>(&b, l.code_flags as usize) as u32;
        Ok(CodeHead {
            start,
            size: le::<4>(&b, l.code_size as usize) as u32,
            kind: (flags.checked_shr(l.kind.1 as u32).unwrap_or(0) & l.kind.0) as u8,
            deopt: le::<8>(&b, l.code_deopt as usize),
            spt: le::<8>(&b, l.code_spt as usize),
        })
    }

    /// A script's name and lines (cached by the script and its source).
    fn script(&mut self, mem: &Mem, s: u64) -> Rc<Script> {
        let empty = || Rc::new(Script { name: String::new(), ends: Vec::new() });
        let (mut h, l) = self.heap(mem);
        if h.type_of(s) != Some(l.t_script) {
            return empty();
        }
        let Some(b) = h.object(s, 64) else { return empty() };
        let (src, name, ends) =
            (le::<8>(&b, l.script.0 as usize), le::<8>(&b, l.script.1 as usize), le::<8>(&b, l.script.2 as usize));
        if let Some(x) = self.scripts.get(&(s, src)) {
            return x.clone();
        }
        let (mut h, l) = self.heap(mem);
        let strings = l.strings.clone();
        let name = h.string(&strings, name, MAX_NAME).unwrap_or_default();
        // The line ends V8 computed, else from the source.
        let mut lines: Vec<u32> = h
            .words(ends, l.arr.0, l.arr.1, MAX_LINES)
            .map(|w| w.into_iter().filter_map(smi).map(|x| x.max(0) as u32).collect())
            .unwrap_or_default();
        if lines.is_empty() {
            let mut units: Vec<u16> = Vec::new();
            if h.string_units(&strings, src, MAX_SOURCE, &mut |p| units.extend_from_slice(p)) {
                lines = tables::line_ends(units.into_iter(), MAX_LINES);
            }
        }
        let x = Rc::new(Script { name, ends: lines });
        if self.scripts.len() < 4096 {
            self.scripts.insert((s, src), x.clone());
        }
        x
    }

    /// The BytecodeArray behind a SharedFunctionInfo's function data (the
    /// array itself, interpreter data, or baseline code), and the baseline
    /// Code when that is what it holds.
    fn bytecode_of(&mut self, mem: &Mem, fdata: u64) -> (Option<u64>, Option<u64>) {
        let (mut h, l) = self.heap(mem);
        let t = h.type_of(fdata);
        if t == Some(l.t_bytecode) {
            return (Some(fdata), None);
        }
        let inner = |h: &mut Heap<'_>, l: &Layout, x: u64| -> Option<u64> {
            let t = h.type_of(x)?;
            if t == l.t_bytecode {
                return Some(x);
            }
            if Some(t) == l.t_interp_data {
                let b = h.word(untag(x)? + 8)?;
                return (h.type_of(b) == Some(l.t_bytecode)).then_some(b);
            }
            None
        };
        if t.is_some() && t == l.t_interp_data {
            return (inner(&mut h, l, fdata), None);
        }
        if t == Some(l.t_code) {
            let deopt = untag(fdata).and_then(|a| h.word(a + l.code_deopt));
            return (deopt.and_then(|d| inner(&mut h, l, d)), Some(fdata));
        }
        (None, None)
    }

    /// Names the function of SharedFunctionInfo `sfi` (tagged).
    fn func(&mut self, mem: &Mem, sfi: u64) -> Result<Rc<JsFn>, &'static str> {
        let (mut h, l) = self.heap(mem);
        if h.type_of(sfi) != Some(l.t_sfi) {
            return Err("not_code");
        }
        let b = h.object(sfi, 64).ok_or("unreadable")?;
        let (fdata, nos, script) =
            (le::<8>(&b, l.sfi.0 as usize), le::<8>(&b, l.sfi.1 as usize), le::<8>(&b, l.sfi.2 as usize));
        if let Some(f) = self.fns.get(&sfi) {
            if f.nos == nos && f.ident == (script, fdata) {
                return Ok(f.clone());
            }
        }
        let (name, start) = self.name_of(mem, nos)?;
        let script_word = script;
        let script = self.script(mem, script);
        let (bytecode, _) = self.bytecode_of(mem, fdata);
        let (h, l) = self.heap(mem);
        let positions = bytecode
            .and_then(|ba| h.word(untag(ba)? + l.ba.1))
            .and_then(|t| h.byte_array(t, l.arr.0, l.arr.1, MAX_TABLE))
            .map(|t| tables::positions(&t, l.positions))
            .unwrap_or_default();
        let f = Rc::new(JsFn {
            name: if name.is_empty() { ANONYMOUS.into() } else { name },
            script,
            start,
            positions,
            bytecode: bytecode.unwrap_or(0),
            nos,
            ident: (script_word, fdata),
        });
        // (An anonymous function is read again each time: see Names.)
        if self.fns.len() < 1 << 16 && f.name != ANONYMOUS {
            self.fns.insert(sfi, f.clone());
        }
        Ok(f)
    }

    /// A function's name and start position from its name-or-scope-info:
    /// a string, or a ScopeInfo whose first string after its context
    /// locals is the function's name (then its inferred name), and whose
    /// position info is the first pair of rising Smis after that.
    /// A name that cannot be read is an error, never "(anonymous)": a
    /// function is called anonymous only when V8 says its name is empty.
    fn name_of(&mut self, mem: &Mem, nos: u64) -> Result<(String, Option<u32>), &'static str> {
        let (mut h, l) = self.heap(mem);
        let strings = l.strings.clone();
        // A Smi: V8's "no shared name".
        if untag(nos).is_none() {
            return Ok((String::new(), None));
        }
        let t = h.type_of(nos).ok_or("unreadable")?;
        if t < strings.first_nonstring {
            return Ok((h.string(&strings, nos, MAX_NAME).ok_or("unreadable")?, None));
        }
        if t != l.t_scope {
            return Ok((String::new(), None));
        }
        let (nlocals_at, first) = l.scope;
        // (An object near the end of its mapping: the words that exist.)
        let slots = mem.prefix(untag(nos).ok_or("unreadable")?, 8 + 8 * 48, 8 + 8 * 8).ok_or("unreadable")?;
        let words = (slots.len() / 8 - 1) as u64;
        let slot = |i: u64| if i < words { le::<8>(&slots, 8 + 8 * i as usize) } else { 0 };
        let n = smi(slot(nlocals_at)).unwrap_or(0).max(0) as u64;
        // V8 12.8 on keep the start and end positions in the two slots
        // after the context-local count, before the variable part.
        let fixed = (first == nlocals_at.saturating_add(3))
            .then(|| (smi(slot(nlocals_at.saturating_add(1))), smi(slot(nlocals_at.saturating_add(2)))))
            .and_then(|(a, b)| match (a, b) {
                (Some(a), Some(b)) if a >= 0 && a <= b => Some(a as u32),
                _ => None,
            });
        // Fewer than 75 locals are named inline (a name and an info each);
        // more, in a hash table.
        let i = first.saturating_add(if n < 75 { 2 * n } else { 1 + n });
        // The function's name, then its inferred name (`obj.f = function
        // () {}`), where the name is empty: the first non-empty string.
        let mut name = None;
        let mut after = i;
        for j in i..i.saturating_add(4).min(words) {
            let v = slot(j);
            if h.type_of(v).is_some_and(|t| t < strings.first_nonstring) {
                after = j + 2;
                let s = h.string(&strings, v, MAX_NAME).ok_or("unreadable")?;
                let empty = s.is_empty();
                name = Some(s);
                if !empty {
                    break;
                }
            }
        }
        // No string there at all: a function V8 gave no name.
        let name = name.unwrap_or_default();
        if fixed.is_some() {
            return Ok((name, fixed));
        }
        let mut start = None;
        for j in after..(after + 4).min(47) {
            if let (Some(a), Some(b)) = (smi(slot(j)), smi(slot(j + 1))) {
                if a >= 0 && a < b {
                    start = Some(a as u32);
                    break;
                }
            }
        }
        Ok((name, start))
    }

    /// Reads the optimized Code `code` (tagged): its function, source
    /// positions and inlined functions.
    fn optimized(&mut self, mem: &Mem, head: &CodeHead, shift: u32) -> Result<(JsCode, u64), &'static str> {
        let (h, l) = self.heap(mem);
        let l = l.clone();
        let dd = h.words(head.deopt, l.arr.0, l.arr.1, (l.dd.3 + 1) as usize).ok_or("unreadable")?;
        if dd.len() <= l.dd.3 as usize {
            return Err("not_code");
        }
        let positions = h
            .byte_array(head.spt, l.arr.0, l.arr.1, MAX_TABLE)
            .map(|t| tables::positions(&t, l.positions))
            .ok_or("unreadable")?;
        let at = |i: u64| dd.get(i as usize).copied().unwrap_or(0);
        let count = smi(at(l.dd.0)).unwrap_or(0).clamp(0, MAX_INLINED as i32) as usize;
        let literals = if count > 0 { h.words(at(l.dd.1), l.arr.0, l.arr.1, count) } else { Some(Vec::new()) };
        let inl = h.byte_array(at(l.dd.3), l.arr.0, l.arr.1, MAX_TABLE).unwrap_or_default();
        let mut root = at(l.dd.2);
        if let Some(at) = l.dd_wrapped {
            // V8 13 on: a SharedFunctionInfoWrapper holds it.
            root = untag(root).and_then(|w| h.word(w + at)).ok_or("unreadable")?;
        }
        let func = self.func(mem, root)?;
        let literals = literals.unwrap_or_default();
        let mut inlined = Vec::new();
        for e in inl.chunks_exact(16).take(MAX_INLINED) {
            let (pos, id) = (le::<8>(e, 0), le::<4>(e, 8) as u32 as i32);
            // An inlined function that cannot be named fails the code (to
            // be read again), rather than lend it its caller's name.
            let f = if id >= 0 {
                Some(self.func(mem, (literals.get(id as usize).ok_or("unreadable")? & !3) | 1)?)
            } else {
                None
            };
            inlined.push((pos, f));
        }
        Ok((JsCode::Optimized { func, positions, inlined, shift }, root))
    }

    /// Finds the Code whose instructions hold `pc`: known code first, else
    /// the code's start below the pc (instructions start 64-byte aligned,
    /// right after their InstructionStream, or V8 10's Code, whose map
    /// says what it is and which points back at its Code).
    fn code_at(&mut self, mem: &Mem, pc: u64) -> Option<(u64, CodeHead)> {
        if let Some((&start, &(end, code))) = self.codes.range(..=pc).next_back() {
            if pc < end {
                if let Ok(hd) = self.code_head(mem, code) {
                    if hd.start == start && pc < start.saturating_add(hd.size as u64) {
                        return Some((code, hd));
                    }
                }
                self.codes.remove(&start);
            }
        }
        let want = self.l.t_istream.unwrap_or(self.l.t_code);
        let has_istream = self.l.t_istream.is_some();
        let hdr = self.l.istream_hdr;
        // Candidates (64-byte aligned starts at or below the pc) page by
        // page downwards: a candidate's header word lies `hdr` below it.
        let top = pc & !63;
        let mut page = top.checked_sub(hdr)? & !4095;
        let floor = pc.saturating_sub(MAX_SCAN);
        while page >= floor {
            if self.scan_pages == 0 {
                self.search_budget_spent += 1;
                return None;
            }
            self.scan_pages -= 1;
            let block = mem.bytes(page, 4096)?;
            let mut c = (page + 4096 + hdr - 64).min(top) & !63;
            while c >= page + hdr && c >= 64 {
                let map = le::<8>(&block, (c - hdr - page) as usize);
                if untag(map).is_some() {
                    let obj = (c - hdr) | 1;
                    let (mut h, _) = self.heap(mem);
                    if h.type_of(obj) == Some(want) {
                        let code = if has_istream { h.word(c - hdr + 8).unwrap_or(0) } else { obj };
                        if let Ok(hd) = self.code_head(mem, code) {
                            if hd.start == c {
                                // The first code below the pc: it holds
                                // the pc, or no code does.
                                if pc >= c.saturating_add(hd.size as u64) {
                                    return None;
                                }
                                if self.codes.len() < 1 << 16 {
                                    self.codes.insert(c, (c.saturating_add(hd.size as u64), code));
                                }
                                return Some((code, hd));
                            }
                        }
                    }
                }
                c -= 64;
            }
            page = page.checked_sub(4096)?;
        }
        None
    }

    /// Names what the kernel recorded: `addr` and `cookie` of a frame with
    /// flags `flags` (`loc` for V8_F_PC frames, whose name depends on it).
    fn name_code(&mut self, mem: &Mem, addr: u64, ck: u16, flags: u8, loc: u32) -> Result<CodeInfo, &'static str> {
        let code = if flags & FLAG_CODE != 0 {
            let hd = self.code_head(mem, addr)?;
            if code_cookie(hd.start, hd.size) != ck {
                return Err("reused");
            }
            if !self.is_optimized(hd.kind) {
                return Err("not_code");
            }
            if self.codes.len() < 1 << 16 {
                self.codes.insert(hd.start, (hd.start.saturating_add(hd.size as u64), addr));
            }
            self.optimized(mem, &hd, 0)?.0
        } else if flags & FLAG_INTERP != 0 {
            let func = self.func(mem, addr)?;
            if (func.bytecode >> 3) as u16 != ck {
                self.fns.remove(&addr);
                return Err("reused");
            }
            JsCode::Interpreted { func, hdr: self.l.ba.2.saturating_sub(1) as u32 }
        } else if flags & FLAG_BASELINE != 0 {
            let func = self.func(mem, addr)?;
            let (h, l) = self.heap(mem);
            let fdata = untag(addr).and_then(|a| h.word(a.wrapping_add(l.sfi.0))).unwrap_or(0);
            let (_, bcode) = self.bytecode_of(mem, fdata);
            let hd = self.code_head(mem, bcode.ok_or("reused")?)?;
            if code_cookie(hd.start, hd.size) != ck || hd.kind != self.l.kind.2 {
                return Err("reused");
            }
            let (h, l) = self.heap(mem);
            let table = h.byte_array(hd.spt, l.arr.0, l.arr.1, MAX_TABLE).unwrap_or_default();
            let bytes = untag(func.bytecode).and_then(|a| {
                let n = smi(mem.u64(a.wrapping_add(l.ba.0))?)?;
                (n > 0 && n as usize <= MAX_TABLE).then(|| mem.bytes(a.wrapping_add(l.ba.2), n as usize))?
            });
            let offsets = match bytes {
                Some(b) if !self.sizes.is_empty() => tables::baseline_offsets(&table, &b, &self.sizes),
                _ => Vec::new(),
            };
            JsCode::Baseline { func, offsets }
        } else if flags & FLAG_PC != 0 {
            let func = self.func(mem, addr)?;
            if (func.nos >> 3) as u16 != ck {
                self.fns.remove(&addr);
                return Err("reused");
            }
            let pc = self.pc_base.wrapping_add(loc as u64);
            match self.code_at(mem, pc) {
                Some((_, hd)) if self.is_optimized(hd.kind) => {
                    let shift = (hd.start.wrapping_sub(self.pc_base)) as u32;
                    match self.optimized(mem, &hd, shift) {
                        // The code must be the frame's function's.
                        Ok((c, root)) if root | 1 == addr | 1 => c,
                        _ => JsCode::Function(func),
                    }
                }
                _ => {
                    self.code_not_found += 1;
                    JsCode::Function(func)
                }
            }
        } else {
            return Err("not_code");
        };
        let (name, file, first_line) = match &code {
            JsCode::Interpreted { func, .. }
            | JsCode::Baseline { func, .. }
            | JsCode::Optimized { func, .. }
            | JsCode::Function(func) => (func.name.clone(), func.script.name.clone(), func.first_line().unwrap_or(0)),
        };
        Ok(CodeInfo { name, file, first_line, lines: Rc::new(code) })
    }

    /// Forgets what a drain learnt that a moving heap may change (the
    /// functions and scripts are checked again on their next use).
    fn reset_drain(&mut self) {
        self.scan_pages = SCAN_PAGES;
        if self.fns.len() > 1 << 15 {
            self.fns.clear();
        }
        if self.scripts.len() > 2048 {
            self.scripts.clear();
        }
    }
}

impl CodeLines for JsCode {
    fn frames(&self, _info: &CodeInfo, f: &RtFrame) -> Vec<SrcFrame> {
        let fr = JsCode::frames(self, f.loc, f.flags);
        let n = fr.len();
        fr.into_iter()
            .enumerate()
            .map(|(i, (func, line))| (func.name.clone(), func.script.name.clone(), line, i + 1 < n))
            .collect()
    }

    fn bytes(&self) -> usize {
        JsCode::bytes(self)
            + match self {
                JsCode::Interpreted { func, .. }
                | JsCode::Baseline { func, .. }
                | JsCode::Optimized { func, .. }
                | JsCode::Function(func) => func.bytes(),
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_cookies_match_the_kernels() {
        // v8_code_cookie in v8.h, by hand.
        let (start, size) = (0x7f29_a2fc_70c0u64, 1264u32);
        let h = ((start >> 6) as u32).wrapping_mul(0x9e37_79b1) ^ size.wrapping_mul(0x85eb_ca6b);
        assert_eq!(code_cookie(start, size), (h ^ (h >> 16)) as u16);
    }

    fn func(name: &str) -> Rc<JsFn> {
        Rc::new(JsFn {
            name: name.into(),
            script: Rc::new(Script { name: "/x.js".into(), ends: vec![10, 20, 30, 40, 50] }),
            start: Some(0),
            positions: vec![(0, 2 * 12), (5, 2 * 33)],
            bytecode: 0,
            nos: 0,
            ident: (0, 0),
        })
    }

    #[test]
    fn optimized_frames_expand_inlined_calls() {
        let (parent, heavy) = (func("parent"), func("heavy"));
        // pc 0x10: parent's own code at offset 5 (line 1); pc 0x20: heavy
        // (inlining id 1) at offset 25 (line 3), called at offset 45 (line 5).
        let pos = |off: u64, id: u64| ((off + 1) << 1) | (id << 31);
        let code = JsCode::Optimized {
            func: parent.clone(),
            positions: vec![(0x10, pos(5, 0)), (0x20, pos(25, 1))],
            inlined: vec![(pos(45, 0), Some(heavy.clone()))],
            shift: 0,
        };
        let f = code.frames(0x24, FLAG_LEAF);
        assert_eq!(
            f.iter().map(|x| (x.0.name.as_str(), x.1)).collect::<Vec<_>>(),
            [("heavy", Some(3)), ("parent", Some(5))]
        );
        // A return address right after the inlined range looks up the call.
        let f = code.frames(0x21, 0);
        assert_eq!(f[0].0.name, "heavy");
        let f = code.frames(0x20, 0);
        assert_eq!(f.iter().map(|x| x.0.name.as_str()).collect::<Vec<_>>(), ["parent"]);
        // An inlining id past the table, or a loop of ids, ends the chain.
        let bad = JsCode::Optimized {
            func: parent.clone(),
            positions: vec![(0, pos(5, 3))],
            inlined: vec![(pos(1, 1), None)],
            shift: 0,
        };
        assert_eq!(bad.frames(1, FLAG_LEAF).len(), 1);
        let cyc = JsCode::Optimized {
            func: parent,
            positions: vec![(0, pos(5, 1))],
            inlined: vec![(pos(1, 1), None)],
            shift: 0,
        };
        assert!(cyc.frames(1, FLAG_LEAF).len() <= 2);
    }

    #[test]
    fn interpreted_frames_take_the_line_of_their_bytecode() {
        let f = func("heavy");
        let code = JsCode::Interpreted { func: f, hdr: 53 };
        assert_eq!(code.frames(53 + 7, 0)[0].1, Some(4));
        assert_eq!(code.frames(53 + 2, 0)[0].1, Some(2));
        // The entry (offset -1): the function's first line.
        assert_eq!(code.frames(52, 0)[0].1, Some(1));
    }

    #[test]
    fn node_binaries_are_told_by_name() {
        for b in ["node", "nodejs", "node18", "libnode.so.108", "node (deleted)"] {
            assert!(is_node(b), "{b}");
        }
        for b in ["nodemon", "python3", "libnodejs-foo.so"] {
            assert!(!is_node(b), "{b}");
        }
    }
}
