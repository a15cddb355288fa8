//! HotSpot (OpenJDK's JVM): find the JVM in a process, tell the kernel how
//! to step through its interpreted and compiled frames (`hotspot.h`,
//! `hotspot_walk.h`), and name what the kernel recorded: a method and
//! bytecode index for an interpreted frame; an nmethod and a pc in it for a
//! compiled one, whose debug information gives the chain of methods the
//! JIT inlined there, each with its bytecode index, hence its line.
//!
//! Every structure offset comes from the JVM's own exported tables
//! ([`vmstructs`]); only the interpreter's frame slots (method and bytecode
//! pointer, `frame_x86.hpp`, `frame_aarch64.hpp`) are HotSpot's fixed
//! layouts, which the tables do not carry. JDK 11 to 27 are tested on
//! x86-64, JDK 11, 17, 21, 25 and 27 on AArch64; another JDK from 11 on is
//! read when its tables describe every field the walk reads, and said to be
//! untested; a JDK before 11, or one whose tables lack a field, is
//! reported, once per process, as not read.
pub mod vmstructs;

use std::{collections::HashMap, rc::Rc};

use super::{
    elfsym::{bias_of, ElfSyms},
    layout::rt_kind,
    plugin::{About, CodeInfo, CodeLines, Detected, Instance, Lang, ProcConfig, Runtime, Seen, SrcFrame},
    RtFrame,
};
use crate::engine::process::{
    mem::{le, Mem},
    MapLine, Process,
};
use vmstructs::VmStructs;

crate::skeleton!("java");
use skel::types::hs_proc;
crate::pod!(hs_proc);

/// HotSpot, as the registry knows it.
pub struct HotspotRuntime;

/// The registry's entry.
pub static HOTSPOT: HotspotRuntime = HotspotRuntime;

/// Java methods end in `_[j]` as async-profiler and flamegraph.pl's java
/// palette have them (inlined ones `_[i]`).
static LANG: Lang = Lang {
    kind: "java",
    folded: "_[j]",
    top: "[java]",
    inlined_keeps_mark: false,
    colour: [(50, 1), (165, 2), (40, 1)],
};

impl Runtime for HotspotRuntime {
    fn kind(&self) -> u8 {
        rt_kind::RT_JAVA.0 as u8
    }

    fn name(&self) -> &'static str {
        "java"
    }

    fn library_frame(&self, name: &str, _file: Option<&str>) -> bool {
        // The JDK's own packages (and a lambda's or a stub's frame).
        ["java.", "javax.", "jdk.", "sun.", "com.sun."].iter().any(|p| name.starts_with(p))
    }

    fn lang(&self) -> &'static Lang {
        &LANG
    }

    fn versions(&self) -> &'static str {
        VERSIONS
    }

    fn by_file_name(&self, base: &str) -> Option<String> {
        (base == "libjvm.so").then(|| "a Java VM (libjvm.so)".to_string())
    }

    fn detect(&self, p: &Process) -> Option<Detected> {
        detect(p.pid, &p.maps, p.mem()?)
    }
}

/// What this build reads.
pub const VERSIONS: &str = "HotSpot JVMs of JDK 11 and newer (tested: 11 to 27 on x86-64; 11, 17, 21, 25 and 27 on \
                            arm64; others are read where their structure tables describe every field the walk \
                            reads, and said to be untested)";
/// The versions tested, for the word on an untested one.
const TESTED: &str = "JDK 11 to 27 (x86-64), 11, 17, 21, 25 and 27 (arm64)";
/// Code heaps the kernel knows per process (`HS_HEAPS`).
pub const HEAPS: usize = 4;
/// `HS_F_INTERP`: an interpreted frame (addr: Method*, loc: bytecode index).
pub const FLAG_INTERP: u8 = 2;
/// `HS_F_LEAF`: a compiled frame's sampled instruction.
pub const FLAG_LEAF: u8 = 4;
/// Largest structure the tables may describe (bytes).
const MAX_TYPE: u64 = 4096;
/// Largest debug-information table read per nmethod.
const MAX_TABLE: u64 = 4 << 20;
/// Deepest inlining chain followed.
const MAX_INLINE: usize = 64;

/// One code heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heap {
    /// Reserved range.
    pub lo: u64,
    /// Its end.
    pub hi: u64,
    /// Its segment map.
    pub segmap: u64,
    /// log2 of its segment size.
    pub log2: u8,
}

/// Where each field the walk and the naming read lies (bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offsets {
    /// `sizeof(HeapBlock)`.
    pub heap_block: u64,
    /// `CodeBlob::_size`.
    pub cb_size: u64,
    /// `CodeBlob::_code_begin` (an address) or `_code_offset` (from the blob).
    pub cb_code: u64,
    /// Whether `cb_code` is an address.
    pub code_abs: bool,
    /// `CodeBlob::_frame_size`.
    pub cb_frame_size: u64,
    /// `CodeBlob::_frame_complete_offset`, and its width.
    pub cb_frame_complete: u64,
    /// 4, or 2 where it is an `int16_t`.
    pub fc_bytes: u8,
    /// `CodeBlob::_name`.
    pub cb_name: u64,
    /// `CodeBlob::_kind` and `CodeBlobKind::Nmethod` (JDK 23+).
    pub cb_kind: Option<(u64, u8)>,
    /// `nmethod::_compile_id`.
    pub nm_compile_id: u64,
    /// `nmethod::_verified_entry_point` (an address: true) or
    /// `_verified_entry_offset` (from the code, JDK 23+), when exported.
    pub nm_vep: Option<(u64, bool)>,
    /// `nmethod::_osr_entry_point`, when exported.
    pub nm_osr: Option<u64>,
    /// `nmethod::_method`.
    pub nm_method: u64,
    /// Where the debug information lies (by JDK).
    pub nm_layout: NmLayout,
    /// `sizeof(nmethod)`.
    pub nm_size: u64,
    /// `Method::_constMethod`, `sizeof(Method)`.
    pub m_const: u64,
    /// `sizeof(Method)`.
    pub m_size: u64,
    /// `ConstMethod`: `_constants`, `_flags` (and width), `_code_size`,
    /// `_name_index`, `_constMethod_size`, size.
    pub cm_constants: u64,
    /// `_flags`.
    pub cm_flags: u64,
    /// Bytes of `_flags`.
    pub cm_flags_bytes: u8,
    /// `_code_size`.
    pub cm_code_size: u64,
    /// `_name_index`.
    pub cm_name_index: u64,
    /// `_constMethod_size` (words).
    pub cm_words: u64,
    /// `sizeof(ConstMethod)`: the bytecodes follow it.
    pub cm_size: u64,
    /// The "has a line number table" flag.
    pub cm_has_lines: u64,
    /// `ConstantPool`: `_pool_holder`, `_source_file_name_index`, `_length`, size.
    pub cp_holder: u64,
    /// `_source_file_name_index`: in the `ConstantPool` (JDK 15+), else
    /// in the `InstanceKlass`.
    pub cp_source: u64,
    /// Whether `cp_source` is the `InstanceKlass`'s.
    pub source_in_klass: bool,
    /// `_length`.
    pub cp_length: u64,
    /// `sizeof(ConstantPool)`: its entries follow it.
    pub cp_size: u64,
    /// `Klass::_name`.
    pub k_name: u64,
    /// `Symbol::_length`, `Symbol::_body`.
    pub sym_length: u64,
    /// `_body`.
    pub sym_body: u64,
}

/// Where an nmethod keeps its debug information.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NmLayout {
    /// JDK 11-22: in the nmethod, at offsets from its start
    /// (`_metadata_offset`, `_scopes_pcs_offset`, `_dependencies_offset`),
    /// the scopes at `_scopes_data_begin`.
    #[default]
    Inline,
    /// JDK 23+: scopes in `_immutable_data` (`_scopes_pcs_offset`,
    /// `_scopes_data_offset`, `_immutable_data_size`), metadata after the
    /// relocations in `_mutable_data`.
    Split,
}

/// Offsets of the nmethod layout's fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct NmFields {
    metadata: u64,
    scopes_pcs: u64,
    scopes_data: u64,
    dependencies: u64,
    immutable: u64,
    immutable_size: u64,
    mutable: u64,
    mutable_size: u64,
    relocation_size: u64,
}

/// A JVM sonde reads.
#[derive(Debug)]
pub struct Hotspot {
    /// "17.0.15+6-Debian-1deb12u1".
    pub version: String,
    /// The JDK's feature release (17).
    pub major: u32,
    /// libjvm.so as the process maps it.
    pub image: String,
    /// Its code heaps.
    pub heaps: Vec<Heap>,
    /// The whole code cache.
    pub jit: (u64, u64),
    /// The template interpreter's code.
    pub interp: (u64, u64),
    /// Field offsets.
    pub o: Offsets,
    nm: NmFields,
    /// UNSIGNED5's excluded bytes: 0 before JDK 21, 1 since.
    x: u8,
    /// An AArch64 JVM (its interpreter keeps the bytecode pointer elsewhere).
    aarch64: bool,
    /// Read although not tested: the versions tested.
    untested: Option<String>,
    /// Methods named, by address and ConstMethod.
    methods: HashMap<(u64, u64), Rc<JMethod>>,
}

/// A Java method, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JMethod {
    /// `java.util.HashMap.get`.
    pub name: String,
    /// `HashMap.java`, or "" when the class names none.
    pub file: String,
    /// (bytecode index, line), as the class file's line number table.
    pub lines: Vec<(u32, u32)>,
}

impl JMethod {
    /// The line of bytecode index `bci`: the entry with the largest index
    /// not past it, as `Method::line_number_from_bci`.
    pub fn line(&self, bci: u32) -> Option<u32> {
        let mut best: Option<(u32, u32)> = None;
        for &(b, l) in &self.lines {
            if b <= bci && best.is_none_or(|(bb, _)| b >= bb) {
                best = Some((b, l));
            }
        }
        best.map(|(_, l)| l).or_else(|| self.lines.first().map(|&(_, l)| l))
    }

    fn bytes(&self) -> usize {
        48 + self.name.len() + self.file.len() + 8 * self.lines.len()
    }
}

/// What a Java frame's code is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JavaCode {
    /// An interpreted method (the location is a bytecode index).
    Interpreted(Rc<JMethod>),
    /// An nmethod: per pc offset (sorted) the chain of (method, bytecode
    /// index) it runs there, innermost first.
    Compiled {
        /// The method compiled.
        method: Rc<JMethod>,
        /// (pc offset, index into `scopes`), by pc offset.
        pcs: Vec<(u32, u32)>,
        /// Inlining chains, innermost first.
        scopes: Vec<Vec<(Rc<JMethod>, i32)>>,
    },
    /// Code of the JVM's own (a stub, an adapter): its name.
    Stub,
}

impl JavaCode {
    /// The frames at `loc`, innermost first: (method, line, inlined).
    pub fn frames(&self, loc: u32, flags: u8) -> Vec<(Rc<JMethod>, Option<u32>)> {
        match self {
            JavaCode::Interpreted(m) => vec![(m.clone(), if loc == u32::MAX { None } else { m.line(loc) })],
            JavaCode::Compiled { method, pcs, scopes } => {
                // A return address has its own PcDesc; a sampled
                // instruction takes the next one (its safepoint or call).
                // Past the last one (an epilogue), the last.
                let i = pcs.partition_point(|&(o, _)| o < loc);
                let hit = match pcs.get(i) {
                    Some(&(o, s)) if o == loc || flags & FLAG_LEAF != 0 => Some(s),
                    None if flags & FLAG_LEAF != 0 => pcs.last().map(|&(_, s)| s),
                    _ => None,
                };
                match hit.and_then(|s| scopes.get(s as usize)) {
                    Some(chain) if !chain.is_empty() => chain
                        .iter()
                        .map(|(m, bci)| (m.clone(), if *bci < 0 { m.line(0) } else { m.line(*bci as u32) }))
                        .collect(),
                    _ => vec![(method.clone(), None)],
                }
            }
            JavaCode::Stub => Vec::new(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            JavaCode::Compiled { pcs, scopes, .. } => {
                64 + 8 * pcs.len() + scopes.iter().map(|s| 24 + 16 * s.len()).sum::<usize>()
            }
            _ => 32,
        }
    }
}

/// UNSIGNED5 (HotSpot's CompressedStream): up to five bytes, six bits of
/// value in each byte past the first, a byte below `x + 192 - x` ending
/// it; `x` bytes below which no byte is (1 since JDK 21).
struct U5<'a> {
    b: &'a [u8],
    pos: usize,
    x: u32,
}

impl U5<'_> {
    fn byte(&mut self) -> Option<u8> {
        let v = *self.b.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }

    fn uint(&mut self) -> Option<u32> {
        let l = 192 - self.x;
        let mut sum: u32 = 0;
        let mut shift = 0;
        for i in 0..5 {
            let b = self.byte()? as u32;
            if b < self.x {
                return None;
            }
            sum = sum.wrapping_add((b - self.x) << shift);
            if b < self.x + l || i == 4 {
                return Some(sum);
            }
            shift += 6;
        }
        None
    }

    fn sint(&mut self) -> Option<i32> {
        let v = self.uint()?;
        Some(((v >> 1) as i32) ^ -((v & 1) as i32))
    }
}

/// Decodes a compressed line number table (bytecode index, line), as
/// `CompressedLineNumberReadStream`: a byte of (index delta << 3 | line
/// delta), or 0xff and two signed UNSIGNED5 deltas; 0 ends it.
pub fn line_table(b: &[u8], x: u8) -> Vec<(u32, u32)> {
    let mut s = U5 { b, pos: 0, x: x as u32 };
    let (mut bci, mut line) = (0i32, 0i32);
    let mut out = Vec::new();
    while out.len() < 65536 {
        let Some(n) = s.byte() else { break };
        match n {
            0 => break,
            0xff => {
                let (Some(db), Some(dl)) = (s.sint(), s.sint()) else { break };
                bci = bci.wrapping_add(db);
                line = line.wrapping_add(dl);
            }
            n => {
                bci += (n >> 3) as i32;
                line += (n & 7) as i32;
            }
        }
        if bci >= 0 && line >= 0 {
            out.push((bci as u32, line as u32));
        }
    }
    out
}

/// Decodes the inlining chain at `off` of an nmethod's scopes: per scope,
/// the sender's offset, the method (a 1-based index into the metadata
/// table) and the bytecode index + 1 (`ScopeDesc::decode_body`).
pub fn scope_chain(data: &[u8], metadata: &[u64], mut off: u32, x: u8) -> Vec<(u64, i32)> {
    let mut out = Vec::new();
    while off != 0 && (off as usize) < data.len() && out.len() < MAX_INLINE {
        let mut s = U5 { b: data, pos: off as usize, x: x as u32 };
        let (Some(sender), Some(mi), Some(bci)) = (s.uint(), s.uint(), s.uint()) else { break };
        let method = match mi {
            0 => 0,
            i => metadata.get(i as usize - 1).copied().unwrap_or(0),
        };
        out.push((method, bci as i32 - 1));
        if sender >= off {
            break; // senders are written before their callees
        }
        off = sender;
    }
    out
}

/// The JVM in `pid`, if it runs one.
fn detect(pid: u32, maps: &[MapLine], mem: &Mem) -> Option<Detected> {
    let m = maps.iter().find(|m| m.exec && m.is_file() && m.base() == "libjvm.so")?;
    let unsupported = |why: &str| Detected::not_read("a Java VM (libjvm.so)", why);
    let Some(elf) = m.open(pid).and_then(|f| ElfSyms::open(f).ok()) else {
        return Some(unsupported("its libjvm.so cannot be read as an ELF file"));
    };
    let aarch64 = !elf.is_x86_64();
    let found = elf.find(vmstructs::SYMBOLS);
    if !found.contains_key("gHotSpotVMStructs") {
        return Some(unsupported("its libjvm.so exports no gHotSpotVMStructs (not a HotSpot VM)"));
    }
    let bias = maps.iter().filter(|x| x.path == m.path).find_map(|x| bias_of(&elf.segments, x.start, x.offset))?;
    let syms: vmstructs::Symbols = found.into_iter().map(|(n, s)| (n, s.addr.wrapping_add(bias))).collect();
    let Some(vm) = vmstructs::read(mem, &syms) else {
        return Some(Detected::Later("Java: the VM is starting (its structure tables are not filled in yet)".into()));
    };
    Some(read_vm(&vm, mem, &m.path, aarch64))
}

fn read_vm(vm: &VmStructs, mem: &Mem, image: &str, aarch64: bool) -> Detected {
    let int = |name: &str| vm.address(&[name]).and_then(|a| mem.u32(a));
    let major = int("Abstract_VM_Version::_vm_major_version").unwrap_or(0);
    let release = vm
        .address(&["Abstract_VM_Version::_s_vm_release"])
        .and_then(|a| mem.u64(a))
        .and_then(|p| vmstructs::c_string(mem, p, 128))
        .unwrap_or_else(|| major.to_string());
    let what = format!("Java {release} (HotSpot)");
    let unsupported = |why: String| Detected::not_read(what.clone(), why);
    if major < 11 {
        return unsupported(format!("this sonde reads {VERSIONS}"));
    }
    // Every offset comes from the JVM's tables (a field they lack is said
    // below); the interpreter's frame slots, which they do not carry, are
    // checked on every frame (the bytecode pointer must point into the
    // method's bytecodes).
    let tested = if aarch64 { [11, 17, 21, 25, 27].contains(&major) } else { (11..=27).contains(&major) };
    let o = match offsets(vm) {
        Ok(o) => o,
        Err(missing) => return unsupported(format!("its structure tables lack {missing}")),
    };
    let nm = match nm_fields(vm, o.nm_layout) {
        Ok(f) => f,
        Err(missing) => return unsupported(format!("its structure tables lack {missing}")),
    };
    // The code heaps, once the code cache is set up.
    let later = || Detected::Later("Java: the VM is starting (its code cache is not set up yet)".into());
    let Some(heaps_at) = vm.address(&["CodeCache::_heaps"]) else {
        return unsupported("its structure tables lack CodeCache::_heaps".into());
    };
    let Some(arr) = mem.u64(heaps_at).filter(|&a| a != 0) else { return later() };
    let (Some(len_off), Some(data_off)) = (
        vm.offset(&["GrowableArrayBase::_len", "GenericGrowableArray::_len"], 64),
        vm.offset(&["GrowableArray<int>::_data"], 64),
    ) else {
        return unsupported("its structure tables lack GrowableArray's fields".into());
    };
    let n = mem.u32(arr + len_off).unwrap_or(0) as usize;
    let Some(data) = mem.u64(arr + data_off) else { return later() };
    if n == 0 || n > HEAPS {
        return if n == 0 {
            later()
        } else {
            unsupported(format!("it has {n} code heaps (sonde reads up to {HEAPS})"))
        };
    }
    let (Some(mem_off), Some(segmap_off), Some(log2_off), Some(low_b), Some(high_b)) = (
        vm.offset(&["CodeHeap::_memory"], MAX_TYPE),
        vm.offset(&["CodeHeap::_segmap"], MAX_TYPE),
        vm.offset(&["CodeHeap::_log2_segment_size"], MAX_TYPE),
        vm.offset(&["VirtualSpace::_low_boundary"], 256),
        vm.offset(&["VirtualSpace::_high_boundary"], 256),
    ) else {
        return unsupported("its structure tables lack CodeHeap's fields".into());
    };
    let mut heaps = Vec::new();
    for i in 0..n as u64 {
        let Some(h) = mem.u64(data + 8 * i).filter(|&h| h != 0) else { return later() };
        let (Some(lo), Some(hi), Some(segmap), Some(log2)) = (
            mem.u64(h + mem_off + low_b),
            mem.u64(h + mem_off + high_b),
            mem.u64(h + segmap_off + low_b),
            mem.u32(h + log2_off),
        ) else {
            return later();
        };
        if lo == 0 || hi <= lo || segmap == 0 || !(4..=16).contains(&log2) {
            return later();
        }
        heaps.push(Heap { lo, hi, segmap, log2: log2 as u8 });
    }
    heaps.sort_by_key(|h| h.lo);
    let jit = (heaps[0].lo, heaps.iter().map(|h| h.hi).max().unwrap_or(0));
    // The template interpreter's code: AbstractInterpreter::_code, a StubQueue.
    let interp = (|| {
        let q = mem.u64(vm.address(&["AbstractInterpreter::_code"])?)?;
        let buf = mem.u64(q + vm.offset(&["StubQueue::_stub_buffer"], 256)?)?;
        let limit = mem.u32(q + vm.offset(&["StubQueue::_buffer_limit"], 256)?)?;
        (buf != 0 && limit > 0).then_some((buf, buf + limit as u64))
    })();
    let Some(interp) = interp else { return later() };
    Detected::Read(Box::new(Hotspot {
        version: release,
        major,
        image: image.to_string(),
        heaps,
        jit,
        interp,
        o,
        nm,
        x: if major >= 21 { 1 } else { 0 },
        aarch64,
        untested: (!tested).then(|| TESTED.to_string()),
        methods: HashMap::new(),
    }))
}

fn offsets(vm: &VmStructs) -> Result<Offsets, String> {
    let need = |names: &[&str]| vm.offset(names, MAX_TYPE).ok_or_else(|| names[0].to_string());
    let size = |t: &str| vm.size(t).filter(|&s| s > 0 && s <= MAX_TYPE).ok_or_else(|| format!("the size of {t}"));
    let (cb_code, code_abs) = match vm.offset(&["CodeBlob::_code_begin"], 128) {
        Some(o) => (o, true),
        None => (need(&["CodeBlob::_code_offset"])?, false),
    };
    let fc = vm.field(&["CodeBlob::_frame_complete_offset"]).ok_or("CodeBlob::_frame_complete_offset")?;
    let cb_kind = match (vm.offset(&["CodeBlob::_kind"], 128), vm.constant("CodeBlobKind::Nmethod")) {
        (Some(o), Some(k)) => Some((o, k as u8)),
        _ => None,
    };
    let flags = vm.field(&["ConstMethod::_flags._flags", "ConstMethod::_flags"]).ok_or("ConstMethod::_flags")?;
    let o = Offsets {
        heap_block: size("HeapBlock")?,
        cb_size: need(&["CodeBlob::_size"])?,
        cb_code,
        code_abs,
        cb_frame_size: need(&["CodeBlob::_frame_size"])?,
        cb_frame_complete: fc.offset,
        fc_bytes: if fc.type_string.contains("16") { 2 } else { 4 },
        cb_name: need(&["CodeBlob::_name"])?,
        cb_kind,
        nm_compile_id: need(&["nmethod::_compile_id"])?,
        nm_vep: match (
            vm.offset(&["nmethod::_verified_entry_point"], MAX_TYPE),
            vm.field(&["nmethod::_verified_entry_offset"]),
        ) {
            (Some(o), _) => Some((o, true)),
            // A 16-bit offset ("u2" in JDK 23 to 27).
            (None, Some(f))
                if ["u2", "uint16_t", "int16_t", "jushort", "jshort"].contains(&f.type_string.as_str())
                    && f.offset < MAX_TYPE =>
            {
                Some((f.offset, false))
            }
            _ => None,
        },
        nm_osr: vm.offset(&["nmethod::_osr_entry_point"], MAX_TYPE),
        nm_method: need(&["nmethod::_method", "CompiledMethod::_method"])?,
        nm_layout: if vm.field(&["nmethod::_immutable_data"]).is_some() { NmLayout::Split } else { NmLayout::Inline },
        nm_size: size("nmethod")?,
        m_const: need(&["Method::_constMethod"])?,
        m_size: size("Method")?,
        cm_constants: need(&["ConstMethod::_constants"])?,
        cm_flags: flags.offset,
        cm_flags_bytes: if flags.type_string.contains("u4") || flags.type_string.contains("32") { 4 } else { 2 },
        cm_code_size: need(&["ConstMethod::_code_size"])?,
        cm_name_index: need(&["ConstMethod::_name_index"])?,
        cm_words: need(&["ConstMethod::_constMethod_size"])?,
        cm_size: size("ConstMethod")?,
        cm_has_lines: vm
            .constant("ConstMethodFlags::_misc_has_linenumber_table")
            .or_else(|| vm.constant("ConstMethod::_has_linenumber_table"))
            .ok_or("ConstMethod's has_linenumber_table flag")? as u64,
        cp_holder: need(&["ConstantPool::_pool_holder"])?,
        cp_source: vm
            .offset(&["ConstantPool::_source_file_name_index"], MAX_TYPE)
            .or_else(|| vm.offset(&["InstanceKlass::_source_file_name_index"], MAX_TYPE))
            .ok_or("ConstantPool::_source_file_name_index")?,
        source_in_klass: vm.field(&["ConstantPool::_source_file_name_index"]).is_none(),
        cp_length: need(&["ConstantPool::_length"])?,
        cp_size: size("ConstantPool")?,
        k_name: need(&["Klass::_name"])?,
        sym_length: need(&["Symbol::_length"])?,
        sym_body: need(&["Symbol::_body"])?,
    };
    // The kernel reads these in a blob's first 128 bytes.
    if [o.cb_size, o.cb_code, o.cb_frame_size, o.cb_frame_complete].iter().any(|&x| x + 8 > 128) {
        return Err("CodeBlob fields within its first 128 bytes".into());
    }
    Ok(o)
}

fn nm_fields(vm: &VmStructs, layout: NmLayout) -> Result<NmFields, String> {
    let need = |names: &[&str]| vm.offset(names, MAX_TYPE).ok_or_else(|| names[0].to_string());
    Ok(match layout {
        NmLayout::Inline => NmFields {
            metadata: need(&["nmethod::_metadata_offset"])?,
            scopes_pcs: need(&["nmethod::_scopes_pcs_offset"])?,
            scopes_data: need(&["CompiledMethod::_scopes_data_begin", "nmethod::_scopes_data_begin"])?,
            dependencies: need(&["nmethod::_dependencies_offset"])?,
            ..Default::default()
        },
        NmLayout::Split => NmFields {
            scopes_pcs: need(&["nmethod::_scopes_pcs_offset"])?,
            scopes_data: need(&["nmethod::_scopes_data_offset"])?,
            immutable: need(&["nmethod::_immutable_data"])?,
            immutable_size: need(&["nmethod::_immutable_data_size"])?,
            mutable: need(&["CodeBlob::_mutable_data"])?,
            mutable_size: need(&["CodeBlob::_mutable_data_size"])?,
            relocation_size: need(&["CodeBlob::_relocation_size"])?,
            ..Default::default()
        },
    })
}

/// `struct hs_proc` for the kernel.
pub fn bpf_config(h: &Hotspot) -> hs_proc {
    let o = &h.o;
    let mut c = hs_proc {
        interp_lo: h.interp.0,
        interp_hi: h.interp.1,
        nheaps: h.heaps.len().min(HEAPS) as u8,
        code_abs: o.code_abs as u8,
        fc_bytes: o.fc_bytes,
        blob_head: o.heap_block as u8,
        cb_size: o.cb_size as u16,
        cb_code: o.cb_code as u16,
        cb_frame_size: o.cb_frame_size as u16,
        cb_frame_complete: o.cb_frame_complete as u16,
        nm_compile_id: o.nm_compile_id as u16,
        m_const: o.m_const as u16,
        cm_size: o.cm_size as u16,
        cm_code_size: o.cm_code_size as u16,
        // The interpreter's bytecode pointer: 8 words below fp on x86-64
        // (frame_x86.hpp); on AArch64 8 or 9 (a later JDK's
        // frame_aarch64.hpp adds extended_sp above it), the kernel taking the
        // slot that points into the method's bytecodes.
        bcp_slot: if h.aarch64 { 9 } else { 8 },
        bcp_alt: if h.aarch64 { 8 } else { 0 },
        nm_vep: o.nm_vep.map_or(0, |v| v.0 as u16),
        vep_abs: o.nm_vep.is_some_and(|v| v.1) as u8,
        nm_osr: o.nm_osr.unwrap_or(0) as u16,
        ..Default::default()
    };
    for (i, hp) in h.heaps.iter().take(HEAPS).enumerate() {
        c.heap_lo[i] = hp.lo;
        c.heap_hi[i] = hp.hi;
        c.segmap[i] = hp.segmap;
        c.log2seg[i] = hp.log2;
    }
    c
}

impl Instance for Hotspot {
    fn about(&self) -> About {
        let heaps: Vec<String> = self.heaps.iter().map(|x| format!("{:#x}-{:#x}", x.lo, x.hi)).collect();
        let interp = format!("{:#x}-{:#x}", self.interp.0, self.interp.1);
        let mut fields = serde_json::Map::new();
        fields.insert("code_heaps".into(), heaps.clone().into());
        fields.insert("interpreter".into(), interp.clone().into());
        About {
            runtime: format!("Java {} (HotSpot)", self.version),
            image: self.image.clone(),
            offsets: "gHotSpotVMStructs",
            module: "java".into(),
            untested: self.untested.clone(),
            detail: format!("code heaps {}; template interpreter {interp}", heaps.join(", ")),
            fields,
        }
    }

    fn config(&self) -> ProcConfig {
        ProcConfig { ranges: Vec::new(), jit: vec![self.jit], part: ProcConfig::part_of(&bpf_config(self)) }
    }

    fn code_info(&mut self, mem: &Mem, s: &Seen) -> Result<CodeInfo, &'static str> {
        self.name_code(mem, s.addr, s.cookie)
    }
}

/// The class-file text of a `Symbol` (modified UTF-8, read as UTF-8).
fn symbol(h: &Hotspot, mem: &Mem, sym: u64) -> Option<String> {
    let len = mem.bytes(sym + h.o.sym_length, 2).map(|b| le::<2>(&b, 0))?;
    let b = mem.bytes(sym + h.o.sym_body, len as usize)?;
    Some(String::from_utf8_lossy(&b).into_owned())
}

impl Hotspot {
    /// Names the method at `m`, reading its ConstMethod's address first.
    fn method(&mut self, mem: &Mem, m: u64) -> Result<Rc<JMethod>, &'static str> {
        let cm = mem.u64(m + self.o.m_const).ok_or("unreadable")?;
        self.method_of(mem, m, cm)
    }

    /// Names the method at `m` whose ConstMethod is at `cm`: its class,
    /// name, source file and lines (cached by both addresses).
    fn method_of(&mut self, mem: &Mem, m: u64, cm: u64) -> Result<Rc<JMethod>, &'static str> {
        let o = &self.o;
        if cm == 0 {
            return Err("not_code");
        }
        if let Some(j) = self.methods.get(&(m, cm)) {
            return Ok(j.clone());
        }
        let c = mem.bytes(cm, o.cm_size as usize).ok_or("unreadable")?;
        let cp = le::<8>(&c, o.cm_constants as usize);
        let flags =
            if o.cm_flags_bytes == 4 { le::<4>(&c, o.cm_flags as usize) } else { le::<2>(&c, o.cm_flags as usize) };
        let code_size = le::<2>(&c, o.cm_code_size as usize);
        let name_index = le::<2>(&c, o.cm_name_index as usize);
        let words = le::<4>(&c, o.cm_words as usize);
        let p = mem.bytes(cp, o.cp_size as usize).ok_or("unreadable")?;
        let holder = le::<8>(&p, o.cp_holder as usize);
        let length = le::<4>(&p, o.cp_length as usize);
        let source_index = if o.source_in_klass {
            mem.bytes(holder + o.cp_source, 2).map_or(0, |b| le::<2>(&b, 0))
        } else {
            le::<2>(&p, o.cp_source as usize)
        };
        let entry = |i: u64| (i > 0 && i < length).then(|| mem.u64(cp + o.cp_size + 8 * i)).flatten();
        let name = entry(name_index).and_then(|s| symbol(self, mem, s)).ok_or("not_code")?;
        let class = mem.u64(holder + o.k_name).and_then(|s| symbol(self, mem, s)).ok_or("not_code")?;
        let file = entry(source_index).and_then(|s| symbol(self, mem, s)).unwrap_or_default();
        let mut lines = Vec::new();
        if flags & o.cm_has_lines != 0 {
            let at = o.cm_size + code_size;
            let avail = (words * 8).saturating_sub(at).min(1 << 20);
            if let Some(b) = mem.bytes(cm + at, avail as usize) {
                lines = line_table(&b, self.x);
            }
        }
        let j = Rc::new(JMethod { name: format!("{}.{name}", class.replace('/', ".")), file, lines });
        if self.methods.len() < 1 << 20 {
            self.methods.insert((m, cm), j.clone());
        }
        Ok(j)
    }

    /// Names what the kernel recorded at `addr` with cookie `ck`: a method
    /// (outside the code cache) or a code blob.
    fn name_code(&mut self, mem: &Mem, addr: u64, ck: u16) -> Result<CodeInfo, &'static str> {
        if !(self.jit.0..self.jit.1).contains(&addr) {
            let cm = mem.u64(addr + self.o.m_const).ok_or("unreadable")?;
            if (cm >> 3) as u16 != ck {
                return Err("reused");
            }
            let m = self.method_of(mem, addr, cm)?;
            return Ok(info(&m, JavaCode::Interpreted(m.clone())));
        }
        let o = self.o.clone();
        let h = mem.bytes(addr, o.nm_size as usize).ok_or("unreadable")?;
        let is_nm = match o.cb_kind {
            Some((off, k)) => h.get(off as usize) == Some(&k),
            // JDK 11-22 name them; native methods' wrappers too.
            None => matches!(
                vmstructs::c_string(mem, le::<8>(&h, o.cb_name as usize), 64).as_deref(),
                Some("nmethod" | "native nmethod")
            ),
        };
        if !is_nm {
            let name = vmstructs::c_string(mem, le::<8>(&h, o.cb_name as usize), 128).ok_or("not_code")?;
            return Ok(CodeInfo {
                name: format!("[jvm] {name}"),
                file: String::new(),
                first_line: 0,
                lines: Rc::new(JavaCode::Stub),
            });
        }
        if le::<4>(&h, o.nm_compile_id as usize) as u16 != ck {
            return Err("reused");
        }
        let root = self.method(mem, le::<8>(&h, o.nm_method as usize))?;
        let f = &self.nm;
        let field = |off: u64, w: usize| if w == 8 { le::<8>(&h, off as usize) } else { le::<4>(&h, off as usize) };
        let (pcs, data, meta) = match o.nm_layout {
            NmLayout::Inline => {
                let sd = field(f.scopes_data, 8);
                let pcs = addr + field(f.scopes_pcs, 4);
                ((pcs, addr + field(f.dependencies, 4)), (sd, pcs), (addr + field(f.metadata, 4), sd))
            }
            NmLayout::Split => {
                let imm = field(f.immutable, 8);
                let mutd = field(f.mutable, 8);
                let sp = imm + field(f.scopes_pcs, 4);
                let sd = imm + field(f.scopes_data, 4);
                (
                    (sp, sd),
                    (sd, imm + field(f.immutable_size, 4)),
                    (mutd + field(f.relocation_size, 4), mutd + field(f.mutable_size, 4)),
                )
            }
        };
        let read = |(a, b): (u64, u64)| -> Option<Vec<u8>> {
            if b < a || b - a > MAX_TABLE {
                return None;
            }
            if a == b {
                Some(Vec::new())
            } else {
                mem.bytes(a, (b - a) as usize)
            }
        };
        let (Some(pcs), Some(data), Some(meta)) = (read(pcs), read(data), read(meta)) else {
            return Err("unreadable");
        };
        let metadata: Vec<u64> = meta.chunks_exact(8).map(|c| le::<8>(c, 0)).collect();
        let mut by_off: HashMap<u32, u32> = HashMap::new();
        let mut scopes: Vec<Vec<(Rc<JMethod>, i32)>> = Vec::new();
        let mut table = Vec::new();
        for d in pcs.chunks_exact(16) {
            let (pc, so) = (le::<4>(d, 0) as i32, le::<4>(d, 4) as u32);
            if pc < 0 || so == 0 {
                continue;
            }
            let idx = match by_off.get(&so) {
                Some(&i) => i,
                None => {
                    let mut chain = Vec::new();
                    for (m, bci) in scope_chain(&data, &metadata, so, self.x) {
                        match self.method(mem, m) {
                            Ok(j) => chain.push((j, bci)),
                            Err(_) => break,
                        }
                    }
                    scopes.push(chain);
                    by_off.insert(so, scopes.len() as u32 - 1);
                    scopes.len() as u32 - 1
                }
            };
            table.push((pc as u32, idx));
        }
        table.sort_unstable();
        Ok(info(&root, JavaCode::Compiled { method: root.clone(), pcs: table, scopes }))
    }
}

fn info(m: &JMethod, code: JavaCode) -> CodeInfo {
    CodeInfo {
        name: m.name.clone(),
        file: m.file.clone(),
        first_line: m.lines.iter().map(|l| l.1).min().unwrap_or(0),
        lines: Rc::new(code),
    }
}

impl CodeLines for JavaCode {
    fn frames(&self, _info: &CodeInfo, f: &RtFrame) -> Vec<SrcFrame> {
        let fr = JavaCode::frames(self, f.loc, f.flags);
        let n = fr.len();
        fr.into_iter().enumerate().map(|(i, (m, line))| (m.name.clone(), m.file.clone(), line, i + 1 < n)).collect()
    }

    fn bytes(&self) -> usize {
        JavaCode::bytes(self)
            + match self {
                JavaCode::Interpreted(m) => m.bytes(),
                JavaCode::Compiled { method, .. } => method.bytes(),
                JavaCode::Stub => 0,
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned5_reads_both_encodings() {
        // Before JDK 21: bytes below 192 end a number.
        let mut s = U5 { b: &[5, 200, 3], pos: 0, x: 0 };
        assert_eq!(s.uint(), Some(5));
        assert_eq!(s.uint(), Some(200 + (3 << 6)));
        // Since JDK 21 every byte is one more, and 0 is never written.
        let mut s = U5 { b: &[6, 201, 4, 0], pos: 0, x: 1 };
        assert_eq!(s.uint(), Some(5));
        assert_eq!(s.uint(), Some(200 + (3 << 6)));
        assert_eq!(s.uint(), None);
        // Signed: zigzag.
        let mut s = U5 { b: &[3, 4], pos: 0, x: 0 };
        assert_eq!((s.sint(), s.sint()), (Some(-2), Some(2)));
    }

    #[test]
    fn line_tables_decode_short_and_long_pairs() {
        // (0, 7) short; (+40, +2) long; (+3, +1) short; end.
        let t = [7u8, 0xff, 80, 4, (3 << 3) | 1, 0, 9];
        assert_eq!(line_table(&t, 0), vec![(0, 7), (40, 9), (43, 10)]);
        let m = JMethod { name: "a.B.c".into(), file: "B.java".into(), lines: line_table(&t, 0) };
        assert_eq!(m.line(0), Some(7));
        assert_eq!(m.line(39), Some(7));
        assert_eq!(m.line(41), Some(9));
        assert_eq!(m.line(100), Some(10));
    }

    #[test]
    fn scope_chains_follow_senders_and_stop_on_garbage() {
        // Offset 1: outer (sender 0), method 1, bci 5 (+1). Offset 4:
        // inner, sender 1, method 2, bci 0.
        let data = [0u8, 0, 1, 6, 1, 2, 1];
        let meta = [0x1000u64, 0x2000];
        assert_eq!(scope_chain(&data, &meta, 4, 0), vec![(0x2000, 0), (0x1000, 5)]);
        // A sender that points forward (a loop) stops.
        let data = [0u8, 5, 1, 1];
        assert_eq!(scope_chain(&data, &meta, 1, 0).len(), 1);
        assert!(scope_chain(&[], &meta, 3, 0).is_empty());
    }
}
