//! The boundary a runtime plugs into (its user half; its kernel half plugs
//! into `runtimes.h`). A runtime is a folder: `NAME/mod.rs` implements
//! [`Runtime`] (what it is, and how it finds itself in a process), and what
//! detection returns implements [`Instance`] (one process's runtime: what
//! the kernel needs, and naming the code objects the kernel met); one line
//! in [`super::registry::RUNTIMES`] plugs it in. Nothing outside the folder
//! matches on which runtime it is: the engine ([`super::Runtimes`]), the
//! symbolizer and the renderers go through these traits and [`Lang`].
use std::{collections::BTreeMap, fmt::Debug, rc::Rc};

use super::{layout, RtFrame};
use crate::engine::process::{mem::Mem, Process};

/// How a runtime's frames are shown: the name of their kind in JSON, and
/// their marks in folded stacks and in the terminal's top list.
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lang {
    /// In `--json` (`"kind": "python"`) and pprof.
    pub kind: &'static str,
    /// Ends a frame's label in folded output (`_[py]`).
    pub folded: &'static str,
    /// Ends a frame's name in the top list (`[py]`).
    pub top: &'static str,
    /// Whether an inlined frame keeps its own mark rather than `_[i]`.
    pub inlined_keeps_mark: bool,
    /// Its colour in flame graphs: per channel (red, green, blue) a base
    /// and a slope in halves, the name's hash (0 to 59) times the slope
    /// added, so that neighbours differ.
    pub colour: [(u8, i8); 3],
}

/// One runtime's user half, registered once ([`super::registry::RUNTIMES`]).
pub trait Runtime: Sync {
    /// Its `enum rt_kind` value (contract.h).
    fn kind(&self) -> u8;
    /// Its short name (`doctor`'s list, the docs): "python", "java", "node".
    fn name(&self) -> &'static str;
    /// How its frames are shown.
    fn lang(&self) -> &'static Lang;
    /// The versions this build reads, in words.
    fn versions(&self) -> &'static str;
    /// The frame flags that are part of what names a code object (its
    /// frames of one object are named apart by kind), and of those the
    /// ones whose location is too: `rt_proc.key_flags`, `key_loc`.
    fn name_key(&self) -> (u8, u8) {
        (0, 0)
    }
    /// What the runtime is, by the base name of a file a process maps,
    /// alone ("Python 3.11"): for an architecture whose layouts sonde does
    /// not know, where its frames are said not to be read.
    fn by_file_name(&self, base: &str) -> Option<String>;
    /// Looks for itself in a process; None: not this runtime.
    fn detect(&self, p: &Process) -> Option<Detected>;
    /// Whether a frame (its name and file) is the runtime's own library
    /// (its standard library, its internals): code every program's waits
    /// and releases pass through, passed over where sonde names the
    /// program's own frame (`why`'s lock releasers).
    fn library_frame(&self, _name: &str, _file: Option<&str>) -> bool {
        false
    }
}

/// What a runtime found in a process.
pub enum Detected {
    /// A runtime this build reads.
    Read(Box<dyn Instance>),
    /// A runtime this build does not read: what it is and why.
    NotRead {
        /// "Python 3.14.0".
        what: String,
        /// Why, for the user.
        why: String,
    },
    /// Not ready yet (the runtime is starting): look again later.
    Later(String),
}

impl Detected {
    /// Not read, for `why`.
    pub fn not_read(what: impl Into<String>, why: impl Into<String>) -> Detected {
        Detected::NotRead { what: what.into(), why: why.into() }
    }
}

/// What the report, the summary and `doctor` say of a runtime found.
#[derive(Debug, Clone, Default)]
pub struct About {
    /// "Python 3.12.1", "Java 17.0.15+6 (HotSpot)".
    pub runtime: String,
    /// The file holding it, as the process shows it.
    pub image: String,
    /// Where its layout came from ("_Py_DebugOffsets", "gHotSpotVMStructs").
    pub offsets: &'static str,
    /// The module its frames are shown in (`python3.12`, `java`, `node`).
    pub module: String,
    /// A version newer than those this build was tested on, read because it
    /// describes itself as they do: the tested ones, in words.
    pub untested: Option<String>,
    /// For `doctor --pid`: a sentence on what was learnt, and the same as
    /// fields.
    pub detail: String,
    /// Fields for `doctor --pid --json`.
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// What the kernel needs of one process's runtime (`struct rt_proc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcConfig {
    /// The interpreter loop's ranges (frames there are marked).
    pub ranges: Vec<(u64, u64)>,
    /// Generated code the runtime's stepper steps.
    pub jit: Vec<(u64, u64)>,
    /// The runtime's own part (its `NAME_proc`, from its layout type).
    pub part: Vec<u8>,
}

impl ProcConfig {
    /// The runtime's part from its generated layout type.
    pub fn part_of<T: crate::engine::record::Pod>(t: &T) -> Vec<u8> {
        layout::bytes_of(t).to_vec()
    }
}

/// A code object as the kernel handed it over (`struct rt_seen_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Its address.
    pub addr: u64,
    /// Its cookie.
    pub cookie: u16,
    /// The frame's flags in the runtime's name key.
    pub flags: u8,
    /// The frame's location, where its flags say it names it.
    pub loc: u32,
}

/// One process's runtime, as detection found it.
pub trait Instance {
    /// What it is.
    fn about(&self) -> About;
    /// What the kernel needs.
    fn config(&self) -> ProcConfig;
    /// The process mapped or unmapped code: a new configuration if the
    /// runtime's ranges moved (V8's code range grows).
    fn remapped(&mut self, _p: &Process) -> Option<ProcConfig> {
        None
    }
    /// Whether all the kernel needs was found. Until then the manager
    /// looks at the process again ([`Instance::remapped`]) every 50 ms or
    /// so, slowing to once a second: a runtime starting up (V8 makes its
    /// code range and dispatch table after its binary is mapped, and code
    /// there lies in mappings the unwinder knows already, so nothing else
    /// asks for a look).
    fn settled(&self) -> bool {
        true
    }
    /// Names a code object the kernel met, reading the process's memory;
    /// an error says why not (`gone`, `reused`, `unreadable`, `not_code`).
    fn code_info(&mut self, mem: &Mem, s: &Seen) -> Result<CodeInfo, &'static str>;
    /// Whether a name read should be read again the next times its code is
    /// seen (a JavaScript function read while V8 was changing it).
    fn read_again(&self, _info: &CodeInfo) -> bool {
        false
    }
    /// Called once all code objects handed over so far were named.
    fn end_drain(&mut self) {}
    /// Code objects named in part, by reason (the summary's `partly_named`).
    fn partly_named(&self, _out: &mut BTreeMap<&'static str, u64>) {}
}

/// One source frame of a language frame: (name, file, line, inlined).
pub type SrcFrame = (String, String, Option<u32>, bool);

/// How a named code object's frames are found from where in it the
/// kernel saw a thread.
pub trait CodeLines: Debug {
    /// The source frames at language frame `f`, innermost first: one,
    /// except where a JIT inlined callees into the code (their frames come
    /// first); none for a runtime's own stub code (named as the code
    /// object itself).
    fn frames(&self, info: &CodeInfo, f: &RtFrame) -> Vec<SrcFrame>;
    /// Bytes it holds, for the run's name budget.
    fn bytes(&self) -> usize;
}

/// A named code object.
#[derive(Debug, Clone)]
pub struct CodeInfo {
    /// Qualified name where the runtime has one.
    pub name: String,
    /// Source file.
    pub file: String,
    /// Its first line.
    pub first_line: u32,
    /// How to find the frames (and lines) of a location in it.
    pub lines: Rc<dyn CodeLines>,
}

impl CodeInfo {
    /// The source frames of language frame `f` of this code, innermost
    /// first; a code object the runtime gives no frames for is named as
    /// itself.
    pub fn frames(&self, f: &RtFrame) -> Vec<SrcFrame> {
        let v = self.lines.frames(self, f);
        if v.is_empty() {
            return vec![(self.name.clone(), self.file.clone(), None, false)];
        }
        v
    }

    /// The line of the innermost source frame at `loc`.
    pub fn line(&self, f: &RtFrame) -> Option<u32> {
        self.frames(f).first().and_then(|x| x.2)
    }

    /// Bytes it holds, for the run's name budget.
    pub fn bytes(&self) -> usize {
        64 + self.name.len() + self.file.len() + self.lines.bytes()
    }
}
