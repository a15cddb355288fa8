//! What the runtimes read of an executable a traced process maps: its
//! `PT_LOAD` segments, a few named symbols, a named section, bytes at a
//! virtual address. The file is the process's (hostile): sizes are checked
//! before anything is read, reads go through a cache of the file (never the
//! whole file at once: [`Blocks`] keeps at most [`BLOCKS`] blocks of
//! [`BLOCK`] bytes, and a symbol or string table read whole is at most
//! [`MAX_BYTES`], kept while the `ElfSyms` lives), and a malformed file is
//! an error, never a panic.
use std::{
    collections::HashMap,
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::unix::fs::FileExt,
};

use object::{
    elf,
    read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader, Sym as _},
    Endianness, Object, ObjectSection, ReadCache,
};

use crate::engine::unwind::elf::Segment;

/// Most symbols looked at per table (a large library has ~100,000).
const MAX_SYMBOLS: usize = 4 << 20;
/// Most bytes read of one section or at one address.
pub const MAX_BYTES: u64 = 64 << 20;

/// Longest symbol name read (a longer one is passed over).
const MAX_NAME: usize = 4096;

/// Bytes per block [`Blocks`] reads.
const BLOCK: usize = 64 << 10;
/// Most blocks [`Blocks`] keeps (4 MiB).
const BLOCKS: usize = 64;

/// A file read in blocks of [`BLOCK`] bytes, the last [`BLOCKS`] of them
/// kept: the names of a symbol table lie close together, and `object`'s
/// cache reads each one with a seek and a read of its own (a library's
/// symbols cost thousands of system calls; through this, tens). Reads
/// larger than a block go to the file directly.
struct Blocks {
    file: File,
    pos: u64,
    kept: HashMap<u64, Box<[u8]>>,
    /// Blocks in the order they were read, to drop the oldest.
    order: std::collections::VecDeque<u64>,
}

impl Blocks {
    fn new(file: File) -> Blocks {
        Blocks { file, pos: 0, kept: HashMap::new(), order: Default::default() }
    }

    /// Block `n`'s bytes (short at the end of the file).
    fn block(&mut self, n: u64) -> std::io::Result<&[u8]> {
        if !self.kept.contains_key(&n) {
            let mut b = vec![0u8; BLOCK];
            let mut got = 0;
            while got < BLOCK {
                match self.file.read_at(&mut b[got..], n * BLOCK as u64 + got as u64)? {
                    0 => break,
                    k => got += k,
                }
            }
            b.truncate(got);
            if self.order.len() >= BLOCKS {
                if let Some(old) = self.order.pop_front() {
                    self.kept.remove(&old);
                }
            }
            self.order.push_back(n);
            self.kept.insert(n, b.into_boxed_slice());
        }
        Ok(&self.kept[&n])
    }
}

impl Read for Blocks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.len() >= BLOCK {
            let n = self.file.read_at(buf, self.pos)?;
            self.pos += n as u64;
            return Ok(n);
        }
        let (n, off) = (self.pos / BLOCK as u64, (self.pos % BLOCK as u64) as usize);
        let b = self.block(n)?;
        // A block is short at the end of the file (which its process may
        // have truncated since its length was taken): nothing past it.
        let src = b.get(off..).unwrap_or(&[]);
        let k = src.len().min(buf.len());
        buf[..k].copy_from_slice(&src[..k]);
        self.pos += k as u64;
        Ok(k)
    }
}

impl Seek for Blocks {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let at = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.file.metadata()?.len().checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = at.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

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
    data: ReadCache<Blocks>,
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
        let data = ReadCache::new(Blocks::new(file));
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

    fn parse(&self) -> Option<ElfFile64<'_, Endianness, &ReadCache<Blocks>>> {
        ElfFile64::parse(&self.data).ok()
    }

    /// Calls `f` with each defined symbol's name and value, the dynamic
    /// table first, then the full one, until it returns false: at most
    /// [`MAX_SYMBOLS`] per table, of tables and string tables at most
    /// [`MAX_BYTES`] each. Each table and its strings are read whole, once
    /// (a name read by itself costs a seek and a read).
    fn each_symbol(&self, mut f: impl FnMut(&str, Sym) -> bool) {
        let Some(elf) = self.parse() else { return };
        let endian = elf.endian();
        let sections = elf.elf_section_table();
        let bytes = |sh: &elf::SectionHeader64<Endianness>| {
            (sh.sh_size(endian) <= MAX_BYTES).then(|| sh.data(endian, &self.data).ok()).flatten()
        };
        for kind in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
            let Some(sh) = sections.iter().find(|sh| sh.sh_type(endian) == kind) else { continue };
            let Some(strs) = sections.section(object::SectionIndex(sh.sh_link(endian) as usize)).ok().and_then(bytes)
            else {
                continue;
            };
            let Some(syms) =
                bytes(sh).and_then(|d| object::pod::slice_from_all_bytes::<elf::Sym64<Endianness>>(d).ok())
            else {
                continue;
            };
            for sym in syms.iter().take(MAX_SYMBOLS) {
                let addr = sym.st_value(endian);
                if sym.st_shndx(endian) == elf::SHN_UNDEF || addr == 0 {
                    continue;
                }
                // A name ends within MAX_NAME bytes or is passed over: a
                // string table without its NULs costs no scan of it per
                // symbol.
                let Some(rest) = strs.get(sym.st_name(endian) as usize..) else { continue };
                let rest = &rest[..rest.len().min(MAX_NAME)];
                let Some(name) = rest.iter().position(|&b| b == 0).and_then(|e| std::str::from_utf8(&rest[..e]).ok())
                else {
                    continue;
                };
                if !f(name, Sym { addr, size: sym.st_size(endian) }) {
                    return;
                }
            }
        }
    }

    /// The symbols named in `names` (dynamic table first, then the full
    /// one), by name; a name defined twice keeps its first definition.
    pub fn find(&self, names: &[&str]) -> HashMap<String, Sym> {
        let mut out = HashMap::new();
        self.each_symbol(|n, s| {
            if names.contains(&n) && !out.contains_key(n) {
                out.insert(n.to_string(), s);
            }
            out.len() < names.len()
        });
        out
    }

    /// In one pass over both tables: the symbols named in `names` and those
    /// whose name starts with one of `prefixes` (at most `max` of those), by
    /// name; a name defined twice keeps its first definition.
    pub fn collect(&self, names: &[&str], prefixes: &[&str], max: usize) -> HashMap<String, Sym> {
        let mut out = HashMap::new();
        let mut with_prefix = 0usize;
        self.each_symbol(|n, s| {
            let wanted = names.contains(&n) || (with_prefix < max && prefixes.iter().any(|p| n.starts_with(p)));
            if wanted && !out.contains_key(n) {
                if !names.contains(&n) {
                    with_prefix += 1;
                }
                out.insert(n.to_string(), s);
            }
            true
        });
        out
    }

    /// The symbols whose name starts with `prefix` (dynamic table and
    /// full), at most `max` of them.
    pub fn with_prefix(&self, prefix: &str, max: usize) -> Vec<(String, Sym)> {
        let mut out: Vec<(String, Sym)> = Vec::new();
        if max == 0 {
            return out;
        }
        self.each_symbol(|n, s| {
            if n.starts_with(prefix) && !out.iter().any(|(m, _)| m == n) {
                out.push((n.to_string(), s));
            }
            out.len() < max
        });
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
