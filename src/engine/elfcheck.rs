//! A look at an ELF file before the symbolizer reads it.
//!
//! blazesym inflates a compressed section (`SHF_COMPRESSED`, zlib) into a
//! buffer of the size its header declares, then reads the stream to its
//! end: a crafted file that declares petabytes makes the allocation fail,
//! which aborts the process (no panic to catch), and a small stream of
//! zeroes inflates to gigabytes. Files mapped by traced processes are
//! theirs to craft, so every compressed section is checked here first: its
//! declared size within [`MAX_INFLATED`], and its stream inflating (into
//! nothing: counted, not kept) to exactly that size. Only headers and the
//! compressed sections are read, within [`MAX_CHECKED`] bytes of inflation
//! per file.
//!
//! [`guarded`] runs a call into such a library with its panics caught.
use std::{
    fs::File,
    io::{Read, Seek},
};

use object::{
    elf,
    read::elf::{CompressionHeader, FileHeader, SectionHeader},
    read::ReadCache,
    Endianness, ReadRef,
};

/// Largest section a compressed one may declare (bytes).
pub const MAX_INFLATED: u64 = 256 << 20;
/// Most bytes inflated to check one file.
pub const MAX_CHECKED: u64 = 1 << 30;

/// What the symbolizer may read of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// All of it.
    Whole,
    /// Its symbol tables but not its DWARF: a compressed `.debug_*`
    /// section is hostile (named).
    NoDebug(String),
    /// Nothing: a compressed section the symbol tables need is hostile, or
    /// the headers cannot be read (why).
    Refused(String),
    /// Not an ELF file (no magic, or a class that is neither 32- nor
    /// 64-bit): nothing to symbolize.
    NotElf,
}

/// Why a compressed section is not handed to the symbolizer, if it is not.
fn bad_section<R: Read + Seek, S: SectionHeader<Endian = Endianness>>(
    sh: &S,
    endian: Endianness,
    cache: &ReadCache<R>,
    budget: &mut u64,
) -> Option<String> {
    let (chdr, off, csize) = match sh.compression(endian, cache) {
        Ok(Some(c)) => c,
        Ok(None) => return None,
        Err(e) => return Some(e.to_string()),
    };
    if chdr.ch_type(endian) != elf::ELFCOMPRESS_ZLIB {
        // blazesym refuses other kinds with an error (zstd is not built in).
        return None;
    }
    let want: u64 = chdr.ch_size(endian).into();
    if want > MAX_INFLATED {
        return Some(format!("declares {want} bytes inflated (over {MAX_INFLATED})"));
    }
    if want > *budget {
        return Some(format!("over the {MAX_CHECKED}-byte inflation budget of one file"));
    }
    let Ok(packed) = cache.read_bytes_at(off, csize) else {
        return Some("beyond the end of the file".into());
    };
    let mut z = flate2::read::ZlibDecoder::new(packed).take(want + 1);
    let got = match std::io::copy(&mut z, &mut std::io::sink()) {
        Ok(n) => n,
        Err(e) => return Some(format!("does not inflate: {e}")),
    };
    *budget -= want.min(*budget);
    (got != want).then(|| {
        format!(
            "inflates to {} bytes, not the {want} declared",
            if got > want { "more".to_string() } else { got.to_string() }
        )
    })
}

/// Checks `file`'s compressed sections (see the module documentation).
pub fn check(file: File) -> Verdict {
    check_from(file)
}

/// [`check`] on any reader.
pub fn check_from<R: Read + Seek>(file: R) -> Verdict {
    let cache = ReadCache::new(file);
    // blazesym reads any file with the magic and class 1 (32-bit) or 2
    // (64-bit) as little-endian ELF, whatever the rest of the
    // identification says; so such a file is checked here, or refused when
    // its header cannot be.
    match cache.read_bytes_at(0, 5) {
        Ok([0x7f, b'E', b'L', b'F', 1]) => check_with::<elf::FileHeader32<Endianness>, R>(&cache),
        Ok([0x7f, b'E', b'L', b'F', 2]) => check_with::<elf::FileHeader64<Endianness>, R>(&cache),
        _ => Verdict::NotElf,
    }
}

fn check_with<H: FileHeader<Endian = Endianness>, R: Read + Seek>(cache: &ReadCache<R>) -> Verdict {
    let hdr = match H::parse(cache) {
        Ok(h) => h,
        Err(e) => return Verdict::Refused(format!("ELF header: {e}")),
    };
    match hdr.endian() {
        Ok(Endianness::Little) => {}
        _ => return Verdict::Refused("not a little-endian ELF file".into()),
    }
    let endian = Endianness::Little;
    let sections = match hdr.sections(endian, cache) {
        Ok(s) => s,
        Err(e) => return Verdict::Refused(format!("section headers: {e}")),
    };
    let mut budget = MAX_CHECKED;
    let mut no_debug = None;
    for sh in sections.iter() {
        let flags: u64 = sh.sh_flags(endian).into();
        if flags & u64::from(elf::SHF_COMPRESSED) == 0 {
            continue;
        }
        let Some(why) = bad_section(sh, endian, cache, &mut budget) else { continue };
        let name =
            sections.section_name(endian, sh).map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default();
        let shown: String = name.chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
        if name.starts_with(".debug_") {
            no_debug.get_or_insert(format!("compressed section {shown} {why}"));
        } else {
            return Verdict::Refused(format!("compressed section {shown} {why}"));
        }
    }
    match no_debug {
        Some(why) => Verdict::NoDebug(why),
        None => Verdict::Whole,
    }
}

thread_local! {
    /// Set while [`guarded`] runs: its panics are caught and counted, so the
    /// panic hook stays quiet about them.
    static GUARDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where the last guarded panic happened.
    static PANIC_AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Runs `f`, catching a panic (the message is returned, and not printed:
/// the caller counts it). For code that reads files traced processes
/// control through a library that may assert on them.
pub fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(|g| g.get()) {
                let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
                PANIC_AT.with(|p| *p.borrow_mut() = at);
            } else {
                prev(info);
            }
        }));
    });
    GUARDED.with(|g| g.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(false));
    r.map_err(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = PANIC_AT.with(|p| std::mem::take(&mut *p.borrow_mut()));
        // Only the file name and line of the library's source.
        let at = at.rsplit_once("/src/").map_or(at.as_str(), |(_, f)| f).to_string();
        format!("{what} at {at}")
    })
}
