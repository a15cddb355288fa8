//! HotSpot's exported structure tables, read from a live JVM's memory.
//!
//! `libjvm.so` exports `gHotSpotVMStructs` (per field: type, name, offset
//! or, for a static, its address), `gHotSpotVMTypes` (per type: its size)
//! and `gHotSpotVMIntConstants` / `gHotSpotVMLongConstants`, with the
//! layout of their entries in `gHotSpotVM*EntryArrayStride` and
//! `gHotSpot*Offset` variables. The JVM fills some of those at start (they
//! are in `.bss`), so they are read from the process, not from the file.
//! This is what the JDK's own serviceability agent reads: no offset needs
//! to be known in advance. The process controls every byte: counts, string
//! lengths and offsets are bounded, and a table that does not parse is an
//! answer ("not readable"), never a panic.
use std::collections::HashMap;

use crate::engine::process::mem::{le, Mem};

/// Most entries read per table (a JDK 17 has about 2,000 fields).
const MAX_ENTRIES: usize = 20_000;
/// Longest type or field name read.
const MAX_NAME: usize = 256;
/// Largest stride of an entry accepted.
const MAX_STRIDE: u64 = 256;

/// One field: its offset in its type, or its address when static.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Offset in the type (instance fields).
    pub offset: u64,
    /// Address (static fields), else 0.
    pub address: u64,
    /// The declared C++ type ("int16_t", "address").
    pub type_string: String,
}

/// The tables of one JVM.
#[derive(Debug, Default, Clone)]
pub struct VmStructs {
    /// By "Type::field".
    pub fields: HashMap<String, Field>,
    /// Type sizes, by type name.
    pub types: HashMap<String, u64>,
    /// Integer and long constants, by name.
    pub constants: HashMap<String, i64>,
}

/// Addresses of the exported symbols (already biased), by name.
pub type Symbols = HashMap<String, u64>;

/// The symbols [`read`] needs.
pub const SYMBOLS: &[&str] = &[
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryTypeStringOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMIntConstants",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
    "gHotSpotVMLongConstants",
    "gHotSpotVMLongConstantEntryArrayStride",
    "gHotSpotVMLongConstantEntryNameOffset",
    "gHotSpotVMLongConstantEntryValueOffset",
];

/// A NUL-terminated name at `addr`, at most [`MAX_NAME`] bytes.
pub fn c_string(mem: &Mem, addr: u64, max: usize) -> Option<String> {
    if addr == 0 {
        return None;
    }
    // Short reads first: most names are short, and a name near the end of
    // its mapping must not make the read fail.
    for len in [64usize, max] {
        if let Some(b) = mem.bytes(addr, len) {
            if let Some(n) = b.iter().position(|&c| c == 0) {
                return String::from_utf8(b[..n].to_vec()).ok();
            }
        }
    }
    let mut out = Vec::new();
    for i in 0..max as u64 {
        let b = mem.bytes(addr + i, 1)?[0];
        if b == 0 {
            return String::from_utf8(out).ok();
        }
        out.push(b);
    }
    None
}

/// The entries of one table: `stride` bytes each from `base`, ending at
/// the first whose name (at `name_off`) is NULL.
fn entries(mem: &Mem, base: u64, stride: u64, name_off: u64) -> Option<Vec<Vec<u8>>> {
    if base == 0 || !(8..=MAX_STRIDE).contains(&stride) || name_off > stride - 8 {
        return None;
    }
    let mut out = Vec::new();
    let per_read = 256u64;
    let mut at = base;
    while out.len() < MAX_ENTRIES {
        let block = mem.bytes(at, (stride * per_read) as usize).or_else(|| mem.bytes(at, stride as usize))?;
        for e in block.chunks_exact(stride as usize) {
            if le::<8>(e, name_off as usize) == 0 {
                return Some(out);
            }
            out.push(e.to_vec());
        }
        at += block.len() as u64;
    }
    None
}

/// Reads the tables of the JVM whose symbols are `syms`; None when they
/// are not there, not filled in yet, or do not parse.
pub fn read(mem: &Mem, syms: &Symbols) -> Option<VmStructs> {
    let word = |name: &str| syms.get(name).and_then(|a| mem.u64(*a));
    let mut vm = VmStructs::default();
    // Fields.
    let base = word("gHotSpotVMStructs")?;
    let stride = word("gHotSpotVMStructEntryArrayStride")?;
    let (tn, fname, ts, is_static, off, addr) = (
        word("gHotSpotVMStructEntryTypeNameOffset")?,
        word("gHotSpotVMStructEntryFieldNameOffset")?,
        word("gHotSpotVMStructEntryTypeStringOffset")?,
        word("gHotSpotVMStructEntryIsStaticOffset")?,
        word("gHotSpotVMStructEntryOffsetOffset")?,
        word("gHotSpotVMStructEntryAddressOffset")?,
    );
    if [tn, fname, ts, off, addr].iter().any(|&o| o + 8 > stride) || is_static + 4 > stride {
        return None;
    }
    for e in entries(mem, base, stride, tn)? {
        let (Some(t), Some(f)) =
            (c_string(mem, le::<8>(&e, tn as usize), MAX_NAME), c_string(mem, le::<8>(&e, fname as usize), MAX_NAME))
        else {
            continue;
        };
        let stat = le::<4>(&e, is_static as usize) != 0;
        let type_string = c_string(mem, le::<8>(&e, ts as usize), MAX_NAME).unwrap_or_default();
        vm.fields.insert(
            format!("{t}::{f}"),
            Field {
                offset: if stat { 0 } else { le::<8>(&e, off as usize) },
                address: if stat { le::<8>(&e, addr as usize) } else { 0 },
                type_string,
            },
        );
    }
    // Types.
    let base = word("gHotSpotVMTypes")?;
    let stride = word("gHotSpotVMTypeEntryArrayStride")?;
    let (tn, size) = (word("gHotSpotVMTypeEntryTypeNameOffset")?, word("gHotSpotVMTypeEntrySizeOffset")?);
    if tn + 8 > stride || size + 8 > stride {
        return None;
    }
    for e in entries(mem, base, stride, tn)? {
        if let Some(t) = c_string(mem, le::<8>(&e, tn as usize), MAX_NAME) {
            vm.types.insert(t, le::<8>(&e, size as usize));
        }
    }
    // Constants.
    for (kind, width) in [("Int", 4usize), ("Long", 8)] {
        let base = word(&format!("gHotSpotVM{kind}Constants"))?;
        let stride = word(&format!("gHotSpotVM{kind}ConstantEntryArrayStride"))?;
        let name = word(&format!("gHotSpotVM{kind}ConstantEntryNameOffset"))?;
        let value = word(&format!("gHotSpotVM{kind}ConstantEntryValueOffset"))?;
        if name + 8 > stride || value + width as u64 > stride {
            return None;
        }
        for e in entries(mem, base, stride, name)? {
            if let Some(n) = c_string(mem, le::<8>(&e, name as usize), MAX_NAME) {
                let v = if width == 4 {
                    le::<4>(&e, value as usize) as u32 as i32 as i64
                } else {
                    le::<8>(&e, value as usize) as i64
                };
                vm.constants.insert(n, v);
            }
        }
    }
    (!vm.fields.is_empty()).then_some(vm)
}

impl VmStructs {
    /// The first of `names` ("Type::field") the JVM exports.
    pub fn field(&self, names: &[&str]) -> Option<&Field> {
        names.iter().find_map(|n| self.fields.get(*n))
    }

    /// The offset of the first of `names`, bounded by `max`.
    pub fn offset(&self, names: &[&str], max: u64) -> Option<u64> {
        self.field(names).map(|f| f.offset).filter(|&o| o < max)
    }

    /// The address of the first static of `names`.
    pub fn address(&self, names: &[&str]) -> Option<u64> {
        self.field(names).map(|f| f.address).filter(|&a| a != 0)
    }

    /// The size of a type.
    pub fn size(&self, name: &str) -> Option<u64> {
        self.types.get(name).copied()
    }

    /// A constant.
    pub fn constant(&self, name: &str) -> Option<i64> {
        self.constants.get(name).copied()
    }
}
