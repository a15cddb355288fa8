//! What the unwinder needs from an ELF file: its loadable segments (to turn
//! a process address into the file's virtual address), its build ID, and the
//! bytes of its unwind sections (`.eh_frame`, `.eh_frame_hdr`,
//! `.debug_frame`), found through the section headers or, when those are
//! stripped, through the `PT_GNU_EH_FRAME` program header.
//!
//! The file is read through `object`'s [`ReadCache`]: only the headers and
//! the sections asked for are read, never the whole file, and every read is
//! bounded (the file belongs to a traced process and may be crafted).
use std::{borrow::Cow, fs::File};

use object::{
    elf,
    read::{
        elf::{ElfFile64, FileHeader, ProgramHeader},
        ReadCache,
    },
    Endianness, Object, ObjectSection,
};

use super::UnwindError;

/// Largest unwind section read (bytes). libxul's `.eh_frame` is ~10 MB.
pub const MAX_SECTION: u64 = 256 << 20;
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
}

type Elf<'a> = ElfFile64<'a, Endianness, &'a ReadCache<File>>;

fn section(elf: &Elf<'_>, name: &str) -> Result<Option<Section>, UnwindError> {
    let Some(s) = elf.section_by_name(name) else { return Ok(None) };
    if s.size() > MAX_SECTION {
        return Err(UnwindError::TooBig(format!("{name} is {} bytes", s.size())));
    }
    let data: Cow<'_, [u8]> = s.uncompressed_data().map_err(|e| UnwindError::Malformed(format!("{name}: {e}")))?;
    if data.len() as u64 > MAX_SECTION {
        return Err(UnwindError::TooBig(format!("{name} decompresses to {} bytes", data.len())));
    }
    if data.is_empty() {
        return Ok(None);
    }
    Ok(Some(Section { addr: if name == ".debug_frame" { 0 } else { s.address() }, data: data.into_owned() }))
}

/// Reads `len` bytes at virtual address `vaddr` from the file part of the
/// segment holding it (fewer when the segment ends first).
fn read_vaddr(cache: &ReadCache<File>, segments: &[Segment], vaddr: u64, len: u64) -> Option<Vec<u8>> {
    use object::ReadRef;
    let s = segments.iter().find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)?;
    let off = s.offset.checked_add(vaddr - s.vaddr)?;
    let len = len.min(s.filesz - (vaddr - s.vaddr)).min(MAX_SECTION);
    cache.read_bytes_at(off, len).ok().map(<[u8]>::to_vec)
}

/// Reads what the unwinder needs from `file` (an open ELF file).
pub fn read(file: File) -> Result<ElfUnwindInfo, UnwindError> {
    let cache = ReadCache::new(file);
    // Header sanity before object allocates tables for them.
    let hdr = elf::FileHeader64::<Endianness>::parse(&cache).map_err(|e| UnwindError::NotElf(e.to_string()))?;
    let endian = hdr.endian().map_err(|e| UnwindError::NotElf(e.to_string()))?;
    if hdr.e_machine(endian) != elf::EM_X86_64 {
        return Err(UnwindError::NotElf(format!("machine {} is not x86-64", hdr.e_machine(endian))));
    }
    if hdr.e_phnum(endian) as usize > MAX_HEADERS || hdr.e_shnum(endian) as usize > MAX_HEADERS {
        return Err(UnwindError::Malformed("too many headers".into()));
    }
    let elf: Elf<'_> = ElfFile64::parse(&cache).map_err(|e| UnwindError::Malformed(e.to_string()))?;
    let phdrs = elf.elf_program_headers();
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
    let build_id = elf.build_id().ok().flatten().map(<[u8]>::to_vec);
    let mut eh_frame = section(&elf, ".eh_frame")?;
    let mut eh_frame_hdr = section(&elf, ".eh_frame_hdr")?;
    let debug_frame = section(&elf, ".debug_frame")?;
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
    Ok(ElfUnwindInfo { segments, build_id, eh_frame, eh_frame_hdr, debug_frame, via_program_headers })
}

impl ElfUnwindInfo {
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
    let seg = segments
        .iter()
        .find(|s| s.exec && (s.offset & !0xfff) <= offset && offset < s.offset + s.filesz.max(1))
        .or_else(|| segments.iter().find(|s| (s.offset & !0xfff) <= offset && offset < s.offset + s.filesz.max(1)))?;
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
