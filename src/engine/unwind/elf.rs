//! What the unwinder needs from an ELF file: its loadable segments (to turn
//! a process address into the file's virtual address), its build ID, and the
//! bytes of its unwind sections (`.eh_frame`, `.eh_frame_hdr`,
//! `.debug_frame`), found through the section headers or, when those are
//! stripped, through the `PT_GNU_EH_FRAME` program header.
//!
//! The file is read through `object`'s [`ReadCache`]: only the headers and
//! the sections asked for are read, never the whole file, and every read is
//! bounded (the file belongs to a traced process and may be crafted).
use std::io::{Read, Seek};

use object::{
    elf,
    read::{
        elf::{FileHeader, ProgramHeader},
        ReadCache,
    },
    Endianness,
};

use super::UnwindError;

/// Largest unwind section read (bytes). libxul's `.eh_frame` is ~10 MB.
pub const MAX_SECTION: u64 = 64 << 20;
/// Most bytes of an AArch64 file's code searched for signal trampolines:
/// the vDSO's few KiB, musl's libc (under 1 MiB).
pub const MAX_SIGRETURN_SCAN: u64 = 2 << 20;
/// Most program headers and section headers accepted.
const MAX_HEADERS: usize = 1 << 16;

/// A `PT_LOAD` segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// File offset.
    pub offset: u64,
    /// Virtual address.
    pub vaddr: u64,
    /// Bytes in the file.
    pub filesz: u64,
    /// Whether it is executable.
    pub exec: bool,
}

/// An unwind section: its virtual address and bytes.
pub struct Section {
    /// Virtual address (0 for `.debug_frame`, which is not loaded).
    pub addr: u64,
    /// Contents.
    pub data: Vec<u8>,
}

/// The parts of an ELF file the table builder reads.
pub struct ElfUnwindInfo {
    /// The instruction set (the file's machine).
    pub arch: super::table::Arch,
    /// AArch64: virtual addresses of signal trampolines (`mov x8, #139;
    /// svc #0`, which have had no CFI since Linux 5.9), found in files
    /// with up to [`MAX_SIGRETURN_SCAN`] bytes of code.
    pub sigreturn: Vec<u64>,
    /// `PT_LOAD` segments, in program-header order.
    pub segments: Vec<Segment>,
    /// GNU build ID, when the file has one.
    pub build_id: Option<Vec<u8>>,
    /// `.eh_frame` (from its section header, or found through
    /// `PT_GNU_EH_FRAME` when section headers are stripped; then its end is
    /// the end of its segment and the parser stops at the terminator).
    pub eh_frame: Option<Section>,
    /// `.eh_frame_hdr`: its binary-search table lists FDEs by address.
    pub eh_frame_hdr: Option<Section>,
    /// `.debug_frame` (decompressed).
    pub debug_frame: Option<Section>,
    /// Whether section headers were missing and `PT_GNU_EH_FRAME` was used.
    pub via_program_headers: bool,
    /// PLT sections: (address, size, lazy). Their stubs often have no CFI;
    /// the table gives them rules of their own (see `table::build`).
    pub plt: Vec<(u64, u64, bool)>,
    /// A Go binary's function table (`.gopclntab`): its stack-pointer deltas
    /// give Go code, which has no CFI, rows of its own.
    pub gopclntab: Option<Section>,
    /// The `.text` section's address (where Go's table counts from).
    pub text: u64,
    /// Go's cgo stack switches, as the runtime's code shows them
    /// ([`crate::engine::runtime::go::cgo_switches`]).
    pub go_cgo: Vec<crate::engine::runtime::go::CgoSwitch>,
}

/// The sections that hold PLT stubs, and whether theirs push an index
/// before jumping (`.plt`, lazy binding) or jump at once. The unwinder gives
/// them rules of their own, the symbolizer names them `[plt]`.
pub const PLT_SECTIONS: [(&str, bool); 4] =
    [(".plt", true), (".plt.sec", false), (".plt.got", false), (".iplt", false)];

/// Most bytes of the section-name string table and of a note segment.
const MAX_SMALL: u64 = 1 << 20;

type Hdr = elf::FileHeader64<Endianness>;
type SectionHdr = elf::SectionHeader64<Endianness>;

/// The bytes of one section, checked for size first; a compressed one
/// (`SHF_COMPRESSED`, zlib) is inflated through a reader capped at its
/// declared size, which must be within [`MAX_SECTION`] (a small file must
/// not inflate to gigabytes).
fn section_bytes<R: Read + Seek>(
    sh: &SectionHdr,
    endian: Endianness,
    cache: &ReadCache<R>,
    name: &str,
) -> Result<Option<Vec<u8>>, UnwindError> {
    use object::{read::elf::SectionHeader, ReadRef};
    if sh.sh_type(endian) == elf::SHT_NOBITS {
        return Ok(None);
    }
    let bad = |e: &dyn std::fmt::Display| UnwindError::Malformed(format!("{name}: {e}"));
    let Some((off, size)) = sh.file_range(endian) else { return Ok(None) };
    if size > MAX_SECTION {
        return Err(UnwindError::TooBig(format!("{name} is {size} bytes")));
    }
    let Some((chdr, coff, csize)) = sh.compression(endian, cache).map_err(|e| bad(&e))? else {
        let data = cache.read_bytes_at(off, size).map_err(|()| bad(&"beyond the end of the file"))?;
        return Ok((!data.is_empty()).then(|| data.to_vec()));
    };
    use object::read::elf::CompressionHeader;
    let (kind, want) = (chdr.ch_type(endian), chdr.ch_size(endian));
    if kind != elf::ELFCOMPRESS_ZLIB {
        return Err(UnwindError::Malformed(format!("{name}: compression type {kind} (only zlib is read)")));
    }
    if want > MAX_SECTION {
        return Err(UnwindError::TooBig(format!("{name} inflates to {want} bytes")));
    }
    let packed = cache.read_bytes_at(coff, csize).map_err(|()| bad(&"beyond the end of the file"))?;
    // zlib inflates at most ~1032:1: a tiny section claiming 64 MiB must not
    // reserve 64 MiB before the first byte inflates.
    let mut out = Vec::with_capacity(want.min(csize.saturating_mul(1032)) as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(flate2::read::ZlibDecoder::new(packed), want + 1), &mut out)
        .map_err(|e| bad(&e))?;
    if out.len() as u64 != want {
        return Err(bad(&format!("inflates to {} bytes, not the {want} its header says", out.len())));
    }
    Ok((!out.is_empty()).then_some(out))
}

/// Reads `len` bytes at virtual address `vaddr` from the file part of the
/// segment holding it (fewer when the segment ends first).
fn read_vaddr<R: Read + Seek>(cache: &ReadCache<R>, segments: &[Segment], vaddr: u64, len: u64) -> Option<Vec<u8>> {
    use object::ReadRef;
    let s = segments.iter().find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)?;
    let off = s.offset.checked_add(vaddr - s.vaddr)?;
    let len = len.min(s.filesz - (vaddr - s.vaddr)).min(MAX_SECTION);
    cache.read_bytes_at(off, len).ok().map(<[u8]>::to_vec)
}

/// Reads what the unwinder needs from `file` (an open ELF file, or any
/// reader: the fuzz tests pass bytes): the headers, the notes for the build
/// ID, and the three unwind sections, never the symbol tables or anything
/// else.
pub fn read<R: Read + Seek>(file: R) -> Result<ElfUnwindInfo, UnwindError> {
    use object::read::elf::SectionHeader;
    let cache = ReadCache::new(file);
    let hdr = Hdr::parse(&cache).map_err(|e| UnwindError::NotElf(e.to_string()))?;
    let endian = hdr.endian().map_err(|e| UnwindError::NotElf(e.to_string()))?;
    use super::table::Arch;
    let arch = match hdr.e_machine(endian) {
        elf::EM_X86_64 => Arch::X86_64,
        elf::EM_AARCH64 => Arch::Aarch64,
        m => return Err(UnwindError::NotElf(format!("machine {m} is neither x86-64 nor AArch64"))),
    };
    if hdr.e_phnum(endian) as usize > MAX_HEADERS || hdr.e_shnum(endian) as usize > MAX_HEADERS {
        return Err(UnwindError::Malformed("too many headers".into()));
    }
    let malformed = |e: object::read::Error| UnwindError::Malformed(e.to_string());
    let phdrs = hdr.program_headers(endian, &cache).map_err(malformed)?;
    let segments: Vec<Segment> = phdrs
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| Segment {
            offset: p.p_offset(endian),
            vaddr: p.p_vaddr(endian),
            filesz: p.p_filesz(endian),
            exec: p.p_flags(endian) & elf::PF_X != 0,
        })
        .collect();
    let mut build_id = None;
    for p in phdrs.iter().filter(|p| p.p_type(endian) == elf::PT_NOTE && p.p_filesz(endian) <= MAX_SMALL) {
        if let Ok(Some(mut notes)) = p.notes(endian, &cache) {
            while let Ok(Some(n)) = notes.next() {
                if n.name() == elf::ELF_NOTE_GNU && n.n_type(endian) == elf::NT_GNU_BUILD_ID {
                    build_id = Some(n.desc().to_vec());
                }
            }
        }
    }
    let sections = hdr.sections(endian, &cache).map_err(malformed)?;
    // The section names live in one table; a crafted one could be huge.
    if let Ok(names) = sections.section(object::SectionIndex(hdr.e_shstrndx(endian) as usize)) {
        if names.sh_size(endian) > MAX_SMALL {
            return Err(UnwindError::TooBig(format!("section names: {} bytes", names.sh_size(endian))));
        }
    }
    let section = |name: &str| -> Result<Option<Section>, UnwindError> {
        let Some((_, sh)) = sections.section_by_name(endian, name.as_bytes()) else { return Ok(None) };
        let addr = if name == ".debug_frame" { 0 } else { sh.sh_addr(endian) };
        Ok(section_bytes(sh, endian, &cache, name)?.map(|data| Section { addr, data }))
    };
    let plt: Vec<(u64, u64, bool)> = PLT_SECTIONS
        .iter()
        .filter_map(|(n, lazy)| {
            let (_, sh) = sections.section_by_name(endian, n.as_bytes())?;
            (sh.sh_size(endian) > 0 && sh.sh_size(endian) < MAX_SECTION)
                .then(|| (sh.sh_addr(endian), sh.sh_size(endian), *lazy))
        })
        .collect();
    let mut eh_frame = section(".eh_frame")?;
    let mut eh_frame_hdr = section(".eh_frame_hdr")?;
    let debug_frame = section(".debug_frame")?;
    let mut via_program_headers = false;
    if eh_frame.is_none() {
        // Section headers stripped (or no .eh_frame section): the loader's
        // own way in, PT_GNU_EH_FRAME -> .eh_frame_hdr -> .eh_frame.
        if let Some(p) = phdrs.iter().find(|p| p.p_type(endian) == elf::PT_GNU_EH_FRAME) {
            let (addr, size) = (p.p_vaddr(endian), p.p_filesz(endian));
            if let Some(data) = read_vaddr(&cache, &segments, addr, size) {
                let bases = gimli::BaseAddresses::default().set_eh_frame_hdr(addr);
                let hdr = gimli::EhFrameHdr::new(&data, gimli::LittleEndian).parse(&bases, 8);
                if let Ok(ptr) = hdr.map(|h| h.eh_frame_ptr()) {
                    if let Ok(frame_addr) = ptr.direct() {
                        if let Some(frame) = read_vaddr(&cache, &segments, frame_addr, MAX_SECTION) {
                            eh_frame = Some(Section { addr: frame_addr, data: frame });
                            via_program_headers = true;
                        }
                    }
                }
                eh_frame_hdr = Some(Section { addr, data });
            }
        }
    }
    let gopclntab = match section(".gopclntab")? {
        Some(s) => Some(s),
        None => section(".data.rel.ro.gopclntab")?,
    };
    let text = sections.section_by_name(endian, b".text").map(|(_, sh)| sh.sh_addr(endian)).unwrap_or(0);
    let sigreturn = if arch == Arch::Aarch64 { sigreturns(&cache, &segments) } else { Vec::new() };
    Ok(ElfUnwindInfo {
        arch,
        sigreturn,
        segments,
        build_id,
        eh_frame,
        eh_frame_hdr,
        debug_frame,
        via_program_headers,
        plt,
        gopclntab,
        text,
        go_cgo: Vec::new(),
    })
}

/// AArch64's `mov x8, #__NR_rt_sigreturn` followed by `svc #0`.
const SIGRETURN: [u32; 2] = [0xd280_1168, 0xd400_0001];

/// Where a small file's executable segments hold [`SIGRETURN`] (4-byte
/// aligned virtual addresses of its first instruction).
fn sigreturns<R: Read + Seek>(cache: &ReadCache<R>, segments: &[Segment]) -> Vec<u64> {
    use object::ReadRef;
    let exec: Vec<&Segment> = segments.iter().filter(|s| s.exec).collect();
    if exec.iter().map(|s| s.filesz).sum::<u64>() > MAX_SIGRETURN_SCAN {
        return Vec::new();
    }
    let mut out = Vec::new();
    for s in exec {
        let Ok(code) = cache.read_bytes_at(s.offset, s.filesz) else { continue };
        // Instructions are 4-byte aligned in the file as in memory
        // (p_offset and p_vaddr agree modulo the page size).
        let skew = ((4 - (s.vaddr & 3)) & 3) as usize;
        let words: Vec<u32> = code
            .get(skew..)
            .unwrap_or(&[])
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        for (i, w) in words.windows(2).enumerate() {
            if w == SIGRETURN {
                out.push(s.vaddr + skew as u64 + 4 * i as u64);
            }
        }
    }
    out
}

/// [`read`] of an opened file, with `text` set where a Go binary's function
/// entries count from (not always `.text`: see `runtime::go::text_start`).
pub fn read_file(f: std::fs::File) -> Result<ElfUnwindInfo, UnwindError> {
    let dup = f.try_clone().ok();
    let mut info = read(f)?;
    if let (Some(g), Some(dup)) = (&info.gopclntab, dup) {
        if let Ok(e) = crate::engine::runtime::elfsym::ElfSyms::open(dup) {
            use crate::engine::runtime::go;
            info.text = go::text_start(&e, g.addr, &g.data);
            if let Ok(t) = go::Pclntab::parse(g.data.clone(), info.text) {
                let arm64 = info.arch == super::table::Arch::Aarch64;
                info.go_cgo = go::cgo_switches(&t, &|a, n| e.read_vaddr(a, n), arm64);
            }
        }
    }
    Ok(info)
}

impl ElfUnwindInfo {
    /// Whether anything gives this file rows: CFI, Go's table, or (AArch64)
    /// signal trampolines found by their instructions.
    pub fn has_unwind_info(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some() || self.gopclntab.is_some() || !self.sigreturn.is_empty()
    }

    /// The load bias of a mapping of this file at `start` from file offset
    /// `offset`: a process address `pc` in it is the file's virtual address
    /// `pc - bias`. `None` when no `PT_LOAD` segment maps that offset.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        bias_of(&self.segments, start, offset)
    }
}

/// See [`ElfUnwindInfo::bias`]: the segment whose page-aligned file range
/// holds `offset`; a byte at file offset x is mapped at start + (x - offset)
/// and has virtual address p_vaddr + (x - p_offset).
pub fn bias_of(segments: &[Segment], start: u64, offset: u64) -> Option<u64> {
    let holds = |s: &&Segment| (s.offset & !0xfff) <= offset && offset < s.offset.saturating_add(s.filesz.max(1));
    let seg = segments.iter().filter(|s| s.exec).find(holds).or_else(|| segments.iter().find(holds))?;
    Some(start.wrapping_sub(offset).wrapping_add(seg.offset).wrapping_sub(seg.vaddr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_maps_a_pie_text_segment() {
        // A typical PIE: text at file offset 0x1000 with vaddr 0x1000, mapped at 0x5555_5555_5000.
        let segs = [
            Segment { offset: 0, vaddr: 0, filesz: 0x800, exec: false },
            Segment { offset: 0x1000, vaddr: 0x1000, filesz: 0x2000, exec: true },
        ];
        let bias = bias_of(&segs, 0x5555_5555_5000, 0x1000).unwrap();
        assert_eq!(0x5555_5555_5123 - bias, 0x1123);
        // lld-style: vaddr and offset differ by a page.
        let segs = [Segment { offset: 0x1000, vaddr: 0x2000, filesz: 0x3000, exec: true }];
        let bias = bias_of(&segs, 0x7f00_0000_0000, 0x1000).unwrap();
        assert_eq!(0x7f00_0000_0010 - bias, 0x2010);
        assert_eq!(bias_of(&segs, 0x7f00_0000_0000, 0x9000), None);
    }
}
