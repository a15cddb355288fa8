//! What the runtimes read of an executable a traced process maps: its
//! `PT_LOAD` segments, a few named symbols, a named section, bytes at a
//! virtual address. The file is the process's (hostile): sizes are checked
//! before anything is read, reads go through a cache of the file (never the
//! whole file at once), and a malformed file is an error, never a panic.
use std::{collections::HashMap, fs::File};

use object::{
    elf,
    read::elf::{ElfFile64, FileHeader, ProgramHeader},
    Endianness, Object, ObjectSection, ObjectSymbol, ReadCache,
};

use crate::engine::unwind::elf::Segment;

/// Most symbols looked at per table (a large library has ~100,000).
const MAX_SYMBOLS: usize = 4 << 20;
/// Most bytes read of one section or at one address.
pub const MAX_BYTES: u64 = 64 << 20;

/// A symbol's virtual address and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sym {
    /// Virtual address in the file.
    pub addr: u64,
    /// Size in bytes (0 when the table does not say).
    pub size: u64,
}

/// An ELF file opened for symbol and data look-ups.
pub struct ElfSyms {
    data: ReadCache<File>,
    /// `PT_LOAD` segments.
    pub segments: Vec<Segment>,
    /// The file's machine (`EM_X86_64` or `EM_AARCH64`).
    pub machine: u16,
}

impl ElfSyms {
    /// Whether the file is x86-64 code (the layouts the runtimes read are
    /// x86-64's, but for CPython's, which AArch64 shares).
    pub fn is_x86_64(&self) -> bool {
        self.machine == elf::EM_X86_64
    }

    /// Reads the program headers of `file`; an error names what is wrong.
    pub fn open(file: File) -> Result<ElfSyms, String> {
        let data = ReadCache::new(file);
        let segments = {
            let elf = ElfFile64::<Endianness, _>::parse(&data).map_err(|e| format!("not a 64-bit ELF file: {e}"))?;
            let endian = elf.endian();
            let mut segs = Vec::new();
            for ph in elf.elf_program_headers() {
                if ph.p_type(endian) == elf::PT_LOAD {
                    segs.push(Segment {
                        offset: ph.p_offset(endian),
                        vaddr: ph.p_vaddr(endian),
                        filesz: ph.p_filesz(endian),
                        exec: ph.p_flags(endian) & elf::PF_X != 0,
                    });
                }
            }
            let machine = elf.elf_header().e_machine(endian);
            if machine != elf::EM_X86_64 && machine != elf::EM_AARCH64 {
                return Err("neither an x86-64 nor an AArch64 ELF file".into());
            }
            (segs, machine)
        };
        let (segments, machine) = segments;
        Ok(ElfSyms { data, segments, machine })
    }

    fn parse(&self) -> Option<ElfFile64<'_, Endianness, &ReadCache<File>>> {
        ElfFile64::parse(&self.data).ok()
    }

    /// The symbols named in `names` (dynamic table first, then the full
    /// one), by name; a name defined twice keeps its first definition.
    pub fn find(&self, names: &[&str]) -> HashMap<String, Sym> {
        let mut out = HashMap::new();
        let Some(elf) = self.parse() else { return out };
        for table in [elf.dynamic_symbols(), elf.symbols()] {
            for s in table.take(MAX_SYMBOLS) {
                if out.len() == names.len() {
                    return out;
                }
                if s.is_undefined() || s.address() == 0 {
                    continue;
                }
                let Ok(n) = s.name() else { continue };
                if names.contains(&n) && !out.contains_key(n) {
                    out.insert(n.to_string(), Sym { addr: s.address(), size: s.size() });
                }
            }
        }
        out
    }

    /// In one pass over both tables: the symbols named in `names` and those
    /// whose name starts with one of `prefixes` (at most `max` of those), by
    /// name; a name defined twice keeps its first definition.
    pub fn collect(&self, names: &[&str], prefixes: &[&str], max: usize) -> HashMap<String, Sym> {
        let mut out = HashMap::new();
        let mut with_prefix = 0usize;
        let Some(elf) = self.parse() else { return out };
        for table in [elf.dynamic_symbols(), elf.symbols()] {
            for s in table.take(MAX_SYMBOLS) {
                if s.is_undefined() || s.address() == 0 {
                    continue;
                }
                let Ok(n) = s.name() else { continue };
                let wanted = names.contains(&n) || (with_prefix < max && prefixes.iter().any(|p| n.starts_with(p)));
                if wanted && !out.contains_key(n) {
                    if !names.contains(&n) {
                        with_prefix += 1;
                    }
                    out.insert(n.to_string(), Sym { addr: s.address(), size: s.size() });
                }
            }
        }
        out
    }

    /// The symbols whose name starts with `prefix` (full table and dynamic),
    /// at most `max` of them.
    pub fn with_prefix(&self, prefix: &str, max: usize) -> Vec<(String, Sym)> {
        let mut out = Vec::new();
        let Some(elf) = self.parse() else { return out };
        for table in [elf.dynamic_symbols(), elf.symbols()] {
            for s in table.take(MAX_SYMBOLS) {
                if out.len() >= max {
                    return out;
                }
                if s.is_undefined() || s.address() == 0 {
                    continue;
                }
                if let Ok(n) = s.name() {
                    if n.starts_with(prefix) && !out.iter().any(|(m, _)| m == n) {
                        out.push((n.to_string(), Sym { addr: s.address(), size: s.size() }));
                    }
                }
            }
        }
        out
    }

    /// A section's virtual address and size, without reading it.
    pub fn section_range(&self, name: &str) -> Option<(u64, u64)> {
        let elf = self.parse()?;
        let s = elf.section_by_name(name)?;
        (s.size() > 0).then(|| (s.address(), s.size()))
    }

    /// A section's virtual address and bytes (at most [`MAX_BYTES`]).
    pub fn section(&self, name: &str) -> Option<(u64, Vec<u8>)> {
        let elf = self.parse()?;
        let s = elf.section_by_name(name)?;
        if s.size() > MAX_BYTES {
            return None;
        }
        Some((s.address(), s.data().ok()?.to_vec()))
    }

    /// `len` bytes of the file at virtual address `vaddr` (from the
    /// segment that holds them in the file).
    pub fn read_vaddr(&self, vaddr: u64, len: u64) -> Option<Vec<u8>> {
        if len > MAX_BYTES {
            return None;
        }
        let seg = self
            .segments
            .iter()
            .find(|s| s.vaddr <= vaddr && vaddr.saturating_add(len) <= s.vaddr.saturating_add(s.filesz))?;
        let off = seg.offset.checked_add(vaddr - seg.vaddr)?;
        use object::ReadRef;
        (&self.data).read_bytes_at(off, len).ok().map(|b| b.to_vec())
    }
}

/// Re-exported so runtimes need not reach into the unwinder.
pub use crate::engine::unwind::elf::bias_of;
