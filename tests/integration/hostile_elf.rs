//! ELF files and perf maps as hostile input: a corpus of crafted and
//! truncated files through the unwind-table builder and the symbolizer, and
//! a bounded fuzzer over both and the perf-map reader; and a second one over
//! the language runtimes' decoders (Go's function table, CPython's line
//! tables and code objects crafted in memory).
//!
//! The code under test is the tools' own: `unwind::elf::read` and
//! `unwind::table::build` (what `--unwind auto` runs on every executable a
//! traced process maps), `stacks::Symbols::file_frames` (what every stack
//! tool runs on every mapped file a sample lands in) and `perfmap::parse`.
//! What each must do with any input: return (a table, or an error that
//! names why, which the tools count per reason), never panic, never hang,
//! and hold bounded memory.
//!
//! The fuzzer is a seeded mutator (stable Rust, no instrumentation): byte
//! flips, random values written over header fields and section contents,
//! truncations and splices of three real seeds (a binary with DWARF, one
//! with compressed `.debug_*` and `.debug_frame` instead of `.eh_frame`, a
//! stripped one). It runs `SONDE_FUZZ_SECS` seconds (default 20; CI sets
//! more) from seed `SONDE_FUZZ_SEED` (default: the time), prints the seed,
//! and writes every input that panics or runs long to
//! `target/fuzz-findings/`; move such a file into `tests/corpus/elf/` or
//! `tests/corpus/perfmap/` and every later run replays it first.
use std::{
    io::Cursor,
    path::{Path, PathBuf},
    rc::Rc,
    time::{Duration, Instant},
};

use object::{Object, ObjectSection};
use sonde::engine::{
    perfmap,
    stacks::{FileFailure, Symbols},
    unwind::{elf, table, UnwindError},
};

use crate::common::build_workload;

/// Longest any one input may take through the builder and the symbolizer.
/// Far above what any case here needs (milliseconds); a hang is what it
/// catches, not slowness.
const HANG: Duration = Duration::from_secs(20);

/// xorshift64*: reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// What one input came to.
#[derive(Debug)]
struct Outcome {
    /// The table builder's result: rows, FDEs skipped as bad, or the reason
    /// the file has no table (as the tools count it).
    table: Result<(usize, u64), String>,
    /// The symbolizer's: frames named and whether the DWARF was skipped,
    /// or why the file was not symbolized.
    symbols: Result<(usize, bool), FileFailure>,
    took: Duration,
}

/// The reason the tools count for a file without a table
/// (`unwind::kernel`'s `without_table` keys).
fn reason(e: &UnwindError) -> String {
    match e {
        UnwindError::NotElf(_) => "not ELF of this architecture",
        UnwindError::NoUnwindInfo => "no .eh_frame or .debug_frame",
        UnwindError::Malformed(_) => "malformed",
        UnwindError::TooBig(_) => "too big",
        UnwindError::Io(_) => "unreadable",
    }
    .into()
}

/// Runs `bytes` through the table builder (from memory) and the
/// symbolizer (from a file, as the tools read a mapped file), with
/// `offsets` looked up.
fn run_one(bytes: &[u8], dir: &Path, offsets: &[u64]) -> Outcome {
    let t0 = Instant::now();
    let table = elf::read(Cursor::new(bytes))
        .and_then(|info| table::build(&info))
        .map(|t| (t.rows.len(), t.stats.bad_fdes))
        .map_err(|e| reason(&e));
    // A new name each time: the symbolizer caches parsed files by path.
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let path = dir.join(format!("case-{}.elf", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    std::fs::write(&path, bytes).unwrap();
    let mut syms = Symbols::default();
    let module: Rc<str> = Rc::from("case");
    let symbols = syms.file_frames(&path, &module, offsets).and_then(|ff| {
        let named = ff.frames.iter().flatten().filter(|f| f.name != "[unknown]").count();
        match ff.no_debug {
            // Caught, and named from the symbol table after all: still a
            // panic of the symbolizer's for the fuzzer to list.
            Some(why) if why.starts_with("panicked: ") => Err(FileFailure::Panicked(why)),
            d => Ok((named, d.is_some())),
        }
    });
    let _ = std::fs::remove_file(&path);
    Outcome { table, symbols, took: t0.elapsed() }
}

/// The seeds: a binary with DWARF and `.eh_frame`; one with compressed
/// DWARF and `.debug_frame` only; a stripped one (no section headers'
/// names, found through `PT_GNU_EH_FRAME`). With the file offsets of some
/// of its functions.
fn seeds() -> Vec<(&'static str, Vec<u8>, Vec<u64>)> {
    let plain = build_workload("slowfn", &["-O2", "-g", "-fno-inline"]);
    let debug_frame =
        build_workload("slowfn", &["-O2", "-g", "-gz=zlib", "-fno-inline", "-fno-asynchronous-unwind-tables"]);
    let stripped = build_workload("slowfn", &["-O2", "-fno-inline", "-s"]);
    let offsets_of = |bytes: &[u8]| -> Vec<u64> {
        let f = object::File::parse(bytes).unwrap();
        let text = f.section_by_name(".text").unwrap();
        let (off, size) = text.file_range().unwrap();
        (0..8).map(|i| off + size * i / 8).collect()
    };
    let plain = std::fs::read(plain).unwrap();
    let offs = offsets_of(&plain);
    let debug_frame = std::fs::read(debug_frame).unwrap();
    let offs_df = offsets_of(&debug_frame);
    let stripped = std::fs::read(stripped).unwrap();
    let offs_s = offsets_of(&stripped);
    vec![("plain", plain, offs), ("debug_frame", debug_frame, offs_df), ("stripped", stripped, offs_s)]
}

fn dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-elf-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Overwrites bytes with a fixed pattern.
fn garble(b: &mut [u8]) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(37) ^ 0x5a;
    }
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if at + v.len() <= b.len() {
        b[at..at + v.len()].copy_from_slice(v);
    }
}

/// Where a section's header is, and its contents' file range.
struct Sec {
    hdr: usize,
    off: usize,
    size: usize,
}

fn section(bytes: &[u8], name: &str) -> Sec {
    let f = object::File::parse(bytes).unwrap();
    let s = f.section_by_name(name).unwrap_or_else(|| panic!("no {name}"));
    let shoff = u64::from_le_bytes(bytes[0x28..0x30].try_into().unwrap()) as usize;
    let (off, size) = s.file_range().unwrap_or((0, 0));
    Sec { hdr: shoff + 64 * s.index().0, off: off as usize, size: size as usize }
}

/// The offsets of the FDEs of an `.eh_frame` (length, then CIE pointer;
/// a CIE has 0 there).
fn fdes(eh: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= eh.len() {
        let len = u32::from_le_bytes(eh[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || len == 0xffff_ffff {
            break;
        }
        if u32::from_le_bytes(eh[at + 4..at + 8].try_into().unwrap()) != 0 {
            out.push(at);
        }
        at += 4 + len;
    }
    out
}

/// Each crafted file, what the builder must say of it, and that the
/// symbolizer neither panics nor hangs on it.
#[test]
fn crafted_and_truncated_elf_files_are_skipped_with_a_counted_reason() {
    let seeds = seeds();
    let (_, plain, offs) = &seeds[0];
    let (_, dframe, offs_df) = &seeds[1];
    let d = dir("corpus");
    let eh = section(plain, ".eh_frame");
    let ehdr = section(plain, ".eh_frame_hdr");
    let good = run_one(plain, &d, offs);
    let (good_rows, _) = good.table.clone().expect("the seed builds a table");
    assert!(good_rows > 10, "{good:?}");
    assert!(matches!(good.symbols, Ok((n, false)) if n >= 4), "the seed symbolizes: {good:?}");

    // (name, file, what the builder must answer: Ok(None) = a table, any
    // rows; Ok(Some(n)) = a table with n bad FDEs counted; Err(reason);
    // Err("*") = either, so long as it returns).
    type Want = Result<Option<u64>, &'static str>;
    let mut cases: Vec<(String, Vec<u8>, Want)> = Vec::new();
    for cut in [0, 4, 16, 63, 64, 100, eh.off + eh.size / 2, plain.len() / 2, plain.len() - 1] {
        let want: Want = if cut < 64 { Err("not ELF of this architecture") } else { Err("*") };
        cases.push((format!("truncated at byte {cut}"), plain[..cut].to_vec(), want));
    }
    let mut b = plain.clone();
    put(&mut b, eh.hdr + 0x18, &(plain.len() as u64 + 4096).to_le_bytes());
    cases.push((".eh_frame's offset beyond the end of the file".into(), b, Err("malformed")));
    let mut b = plain.clone();
    put(&mut b, eh.hdr + 0x20, &(1u64 << 40).to_le_bytes());
    cases.push((".eh_frame of 1 TiB".into(), b, Err("too big")));
    let mut b = plain.clone();
    put(&mut b, 0x28, &(plain.len() as u64 * 4).to_le_bytes());
    put(&mut b, 0x3c, &0xffffu16.to_le_bytes());
    cases.push(("65535 section headers beyond the end of the file".into(), b, Err("malformed")));
    let mut b = plain.clone();
    put(&mut b, 0x3e, &0xfff0u16.to_le_bytes());
    cases.push(("section-name table index out of range".into(), b, Err("*")));
    // Every FDE's CIE pointer leads to the FDE itself: each is read as a
    // CIE, which it is not. And a cycle: each FDE's to the next FDE, the
    // last one's to the first.
    let fd = fdes(&plain[eh.off..eh.off + eh.size]);
    assert!(fd.len() > 3);
    let mut b = plain.clone();
    for &f in &fd {
        put(&mut b, eh.off + f + 4, &4u32.to_le_bytes());
    }
    cases.push(("every FDE's CIE pointer at itself".into(), b, Ok(Some(fd.len() as u64))));
    let mut b = plain.clone();
    for (i, &f) in fd.iter().enumerate() {
        let to = fd[(i + 1) % fd.len()];
        // The pointer is the distance back from the pointer field; a
        // forward target wraps (as a crafted file would write it).
        let ptr = ((f + 4) as i64 - to as i64) as u32;
        put(&mut b, eh.off + f + 4, &ptr.to_le_bytes());
    }
    // gimli stops walking the section at the first entry that leads to no
    // CIE: one counted, the rest of the section unread.
    cases.push(("FDEs' CIE pointers in a cycle through each other".into(), b, Ok(Some(1))));
    // 64-bit DWARF length escape with a length of 2^60 in the first entry.
    let mut b = plain.clone();
    put(&mut b, eh.off, &0xffff_ffffu32.to_le_bytes());
    put(&mut b, eh.off + 4, &(1u64 << 60).to_le_bytes());
    cases.push(("first CIE of 2^60 bytes (64-bit length)".into(), b, Ok(None)));
    // The search table claims 2^32 - 1 FDEs, with section headers gone so
    // the header is what leads to .eh_frame.
    let mut b = plain.clone();
    put(&mut b, ehdr.off + 8, &0xffff_ffffu32.to_le_bytes());
    put(&mut b, 0x28, &0u64.to_le_bytes());
    put(&mut b, 0x3c, &0u16.to_le_bytes());
    cases.push(("no section headers, .eh_frame_hdr claims 4 billion FDEs".into(), b, Ok(None)));
    // Zero-length tables: both unwind sections empty and PT_GNU_EH_FRAME
    // empty too.
    let mut b = plain.clone();
    put(&mut b, eh.hdr + 0x20, &0u64.to_le_bytes());
    put(&mut b, ehdr.hdr + 0x20, &0u64.to_le_bytes());
    let phoff = u64::from_le_bytes(plain[0x20..0x28].try_into().unwrap()) as usize;
    let phnum = u16::from_le_bytes(plain[0x38..0x3a].try_into().unwrap()) as usize;
    for i in 0..phnum {
        let p = phoff + 56 * i;
        if u32::from_le_bytes(plain[p..p + 4].try_into().unwrap()) == 0x6474_e550 {
            put(&mut b, p + 0x20, &0u64.to_le_bytes());
        }
    }
    cases.push((
        "zero-length .eh_frame, .eh_frame_hdr and PT_GNU_EH_FRAME".into(),
        b,
        Err("no .eh_frame or .debug_frame"),
    ));
    // Every FDE's address range as large as the address space: rows would
    // overlap everything.
    let mut b = plain.clone();
    for &f in &fd {
        put(&mut b, eh.off + f + 12, &0x7fff_ffffu32.to_le_bytes());
    }
    cases.push(("every FDE covering 2 GiB".into(), b, Ok(None)));
    // A compressed .debug_frame whose header claims more than it inflates
    // to, and one claiming 1 TiB.
    let df = section(dframe, ".debug_frame");
    let mut b = dframe.clone();
    put(&mut b, df.off + 8, &((64u64 << 20) - 1).to_le_bytes());
    cases.push(("compressed .debug_frame claiming 64 MiB".into(), b, Err("malformed")));
    let mut b = dframe.clone();
    put(&mut b, df.off + 8, &(1u64 << 40).to_le_bytes());
    cases.push(("compressed .debug_frame claiming 1 TiB".into(), b, Err("too big")));
    // Its zlib stream cut short and garbled.
    let mut b = dframe.clone();
    b[24 + df.off..(df.off + df.size).min(df.off + 64)].iter_mut().for_each(|x| *x = !*x);
    cases.push(("compressed .debug_frame garbled".into(), b, Err("malformed")));
    // DWARF for the symbolizer: .debug_info and .debug_line garbled.
    let mut b = plain.clone();
    for name in [".debug_info", ".debug_line", ".debug_abbrev", ".debug_str"] {
        let s = section(plain, name);
        garble(&mut b[s.off..s.off + s.size]);
    }
    cases.push(("DWARF sections garbled".into(), b, Ok(None)));
    // Compressed DWARF for the symbolizer: a .debug_info declaring 16 PB
    // (the allocation of that size aborted sonde before elfcheck), and a
    // zlib bomb: 64 MiB of zeroes declared as 4 KiB.
    let di = section(dframe, ".debug_info");
    let mut b = dframe.clone();
    put(&mut b, di.off + 8, &(1u64 << 54).to_le_bytes());
    cases.push(("compressed .debug_info declaring 16 PB".into(), b, Ok(None)));
    let mut bomb = Vec::new();
    {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(&mut bomb, flate2::Compression::best());
        let zeroes = vec![0u8; 1 << 20];
        for _ in 0..64 {
            z.write_all(&zeroes).unwrap();
        }
        z.finish().unwrap();
    }
    let mut b = dframe.clone();
    let at = b.len();
    b.extend_from_slice(&1u32.to_le_bytes()); // ch_type zlib
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&4096u64.to_le_bytes()); // ch_size
    b.extend_from_slice(&1u64.to_le_bytes()); // ch_addralign
    b.extend_from_slice(&bomb);
    put(&mut b, di.hdr + 0x18, &(at as u64).to_le_bytes());
    let n = (b.len() - at) as u64;
    put(&mut b, di.hdr + 0x20, &n.to_le_bytes());
    cases.push(("zlib bomb in .debug_info (64 MiB declared as 4 KiB)".into(), b, Ok(None)));

    let mut table = Vec::new();
    for (name, bytes, want) in &cases {
        let o = run_one(bytes, &d, if name.contains("debug_frame") { offs_df } else { offs });
        assert!(o.took < HANG, "{name}: {:?}", o.took);
        let got_ok = match (&o.table, want) {
            (Ok(_), Ok(None)) => true,
            (Ok((_, bad)), Ok(Some(n))) => bad >= n,
            (_, Err("*")) => true,
            (Err(r), Err(w)) => r == w,
            _ => false,
        };
        assert!(got_ok, "{name}: the builder said {:?}, wanted {want:?}", o.table);
        if let Err(FileFailure::Panicked(why)) = &o.symbols {
            panic!("{name}: the symbolizer panicked ({why}); the guard caught it, but this test wants to know");
        }
        if name.contains(".debug_info") {
            // Named from the symbol table, without reading the DWARF.
            assert!(matches!(o.symbols, Ok((n, true)) if n >= 4), "{name}: {:?}", o.symbols);
        }
        table.push(format!(
            "| {name} | {} | {} | {} ms |",
            match &o.table {
                Ok((rows, bad)) => format!("table, {rows} rows, {bad} bad FDEs counted"),
                Err(r) => format!("no table: {r}"),
            },
            match &o.symbols {
                Ok((n, false)) => format!("{n} frames named"),
                Ok((n, true)) => format!("{n} frames named from the symbol table, DWARF skipped"),
                Err(e) => format!("not symbolized: {}", e.reason()),
            },
            o.took.as_millis()
        ));
    }
    println!("| crafted input | table builder | symbolizer | time |\n|---|---|---|---|\n{}", table.join("\n"));
    let _ = std::fs::remove_dir_all(&d);
}

/// One mutation of `b`.
fn mutate(rng: &mut Rng, b: &mut Vec<u8>, donor: &[u8]) {
    if b.is_empty() {
        b.extend_from_slice(&donor[..donor.len().min(64)]);
        return;
    }
    let at = rng.below(b.len());
    match rng.below(10) {
        // Flip bits.
        0..=2 => {
            for _ in 0..=rng.below(8) {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
        }
        // A header field (the first 64 bytes, or a section or program
        // header) overwritten with an edge value.
        3 | 4 => {
            let edges = [0u64, 1, 0x7f, 0xff, 0xffff, 0xffff_ffff, 1 << 31, 1 << 40, u64::MAX, u64::MAX / 2];
            let v = edges[rng.below(edges.len())].to_le_bytes();
            let w = [1, 2, 4, 8][rng.below(4)];
            let i = if rng.below(2) == 0 { rng.below(64) } else { at };
            put(b, i & !(w - 1), &v[..w]);
        }
        // Random bytes.
        5 => {
            for _ in 0..=rng.below(32) {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
        }
        // Cut.
        6 => b.truncate(at),
        // A slice of the donor copied over (splice).
        7 => {
            let from = rng.below(donor.len());
            let n = rng.below(256).min(donor.len() - from).min(b.len() - at);
            b[at..at + n].copy_from_slice(&donor[from..from + n]);
        }
        // A run duplicated in place.
        8 => {
            let n = rng.below(64).min(b.len() - at);
            let run = b[at..at + n].to_vec();
            let to = rng.below(b.len());
            let n = n.min(b.len() - to);
            b[to..to + n].copy_from_slice(&run[..n]);
        }
        // Zeroes.
        _ => {
            let n = rng.below(128).min(b.len() - at);
            b[at..at + n].fill(0);
        }
    }
}

/// A perf map line, well formed or not.
fn perf_map_input(rng: &mut Rng) -> Vec<u8> {
    let mut s = Vec::new();
    for _ in 0..rng.below(200) {
        match rng.below(6) {
            0 => s.extend_from_slice(
                format!("{:x} {:x} jit_fn_{}\n", rng.next(), rng.next() >> 40, rng.below(99)).as_bytes(),
            ),
            1 => s.extend_from_slice(
                format!("{:x} {:x} {}\n", rng.next(), rng.below(64), "x".repeat(rng.below(5000))).as_bytes(),
            ),
            2 => (0..rng.below(300)).for_each(|_| s.push(rng.next() as u8)),
            3 => s.extend_from_slice(b"ffffffffffffffff 10 wraps\n0 0 \n\n zz 1 x\n1 1 \x1b[31mred\xe2\x80\xae\n"),
            4 => s.extend_from_slice(
                format!("{:x} {:x} name with spaces\r\n", rng.below(1 << 30), rng.below(1 << 12)).as_bytes(),
            ),
            _ => s.push(b'\n'),
        }
    }
    s
}

fn findings_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-findings")
}

/// Saves an input that misbehaved; returns where.
fn keep(kind: &str, bytes: &[u8]) -> PathBuf {
    let d = findings_dir();
    std::fs::create_dir_all(&d).unwrap();
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let p = d.join(format!("{kind}-{h:016x}"));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Runs one perf map through the reader with small bounds, checking what
/// it promises: no more lines or bytes than the bounds, names printable
/// and within the line bound, ranges that do not wrap.
fn check_perf_map(bytes: &[u8]) -> Result<(), String> {
    let limits = perfmap::Limits { bytes: 64 << 10, lines: 500, line_bytes: 1024 };
    let m =
        std::panic::catch_unwind(|| perfmap::parse(Cursor::new(bytes), &limits)).map_err(|_| "panicked".to_string())?;
    if m.symbols.len() as u64 + m.skipped > limits.lines {
        return Err(format!("{} symbols + {} skipped over the line bound", m.symbols.len(), m.skipped));
    }
    for s in &m.symbols {
        if s.name.len() > limits.line_bytes || s.name.chars().any(|c| c.is_control()) || s.end < s.start {
            return Err(format!("kept a bad symbol: {s:?}"));
        }
    }
    Ok(())
}

fn corpus(kind: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(kind);
    let mut v: Vec<_> = std::fs::read_dir(&d)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

fn max_rss_kib() -> i64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss
}

/// The bounded fuzzer: replays the kept findings, then mutates the seeds
/// for `SONDE_FUZZ_SECS`. Fails naming every input that panicked in
/// sonde's own code (table builder, perf-map reader), took over [`HANG`],
/// or broke a perf-map bound, with the file it was saved to. Panics inside
/// blazesym are caught by the symbolizer's guard (the file is counted, the
/// run goes on): they are listed by site, and one input per site is kept
/// in `tests/corpus/elf/` so every run checks the guard still holds.
#[test]
fn bounded_fuzz_of_the_table_builder_symbolizer_and_perf_map_reader() {
    let secs: u64 = std::env::var("SONDE_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let seed: u64 = std::env::var("SONDE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    }) | 1;
    println!("fuzz: {secs} s from SONDE_FUZZ_SEED={seed}");
    let seeds = seeds();
    let d = dir("fuzz");
    let rss0 = max_rss_kib();
    let mut findings: Vec<String> = Vec::new();
    // Panics inside blazesym that its guard caught, by site: the file is
    // then counted as `symbolizer_panicked` and the run goes on, which is
    // what the tools promise; the first input of each site is kept.
    let mut caught: std::collections::BTreeMap<String, (u64, PathBuf)> = std::collections::BTreeMap::new();
    let mut judge = |kind: &str, bytes: &[u8], offs: &[u64], findings: &mut Vec<String>| -> Outcome {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_one(bytes, &d, offs)));
        match r {
            Ok(o) => {
                if let Err(FileFailure::Panicked(why)) = &o.symbols {
                    let site = why.rsplit(" at ").next().unwrap_or("").to_string();
                    caught.entry(site).or_insert_with(|| (0, keep(&format!("{kind}-caught"), bytes))).0 += 1;
                }
                if o.took >= HANG {
                    findings.push(format!("{kind}: took {:?}: {}", o.took, keep(kind, bytes).display()));
                }
                o
            }
            Err(_) => {
                findings.push(format!("{kind}: the table builder panicked: {}", keep(kind, bytes).display()));
                Outcome { table: Err("panicked".into()), symbols: Ok((0, false)), took: Duration::ZERO }
            }
        }
    };
    // Kept findings first.
    let replayed_elf = corpus("elf");
    for (p, bytes) in &replayed_elf {
        let o = judge("elf", bytes, &seeds[0].2, &mut findings);
        println!("replayed {}: {:?}", p.file_name().unwrap().to_string_lossy(), o);
    }
    let replayed_map = corpus("perfmap");
    for (p, bytes) in &replayed_map {
        if let Err(why) = check_perf_map(bytes) {
            findings.push(format!("perfmap: {why}: {}", p.display()));
        }
    }
    let mut rng = Rng(seed);
    let (mut n_elf, mut n_map, mut tables, mut refused) = (0u64, 0u64, 0u64, std::collections::BTreeMap::new());
    let mut slowest = Duration::ZERO;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        let (name, seed_bytes, offs) = &seeds[rng.below(seeds.len())];
        let donor = &seeds[rng.below(seeds.len())].1;
        let mut b = seed_bytes.clone();
        for _ in 0..=rng.below(6) {
            mutate(&mut rng, &mut b, donor);
        }
        let o = judge(&format!("elf-{name}"), &b, offs, &mut findings);
        slowest = slowest.max(o.took);
        match &o.table {
            Ok(_) => tables += 1,
            Err(r) => *refused.entry(r.clone()).or_insert(0u64) += 1,
        }
        n_elf += 1;
        for _ in 0..4 {
            let m = perf_map_input(&mut rng);
            if let Err(why) = check_perf_map(&m) {
                findings.push(format!("perfmap: {why}: {}", keep("perfmap", &m).display()));
            }
            n_map += 1;
        }
    }
    let grew = max_rss_kib() - rss0;
    println!(
        "fuzz: {n_elf} ELF inputs ({tables} built a table, refused: {refused:?}; slowest {slowest:?}), \
         {n_map} perf maps, {} kept findings replayed; peak RSS grew {grew} KiB",
        replayed_elf.len() + replayed_map.len()
    );
    for (site, (n, p)) in &caught {
        println!("fuzz: blazesym panicked {n} times at {site}, caught (first input: {})", p.display());
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(n_elf > 0 && n_map > 0);
    // Inputs are at most a few hundred KiB; the builder's and reader's
    // bounds keep what they hold to a small multiple of that.
    assert!(grew < 512 << 10, "peak RSS grew {grew} KiB");
    assert!(findings.is_empty(), "seed {seed}:\n{}", findings.join("\n"));
}

/// End to end: a process runs code from four crafted copies of a library
/// (the loader reads none of what was crafted) while `sonde profile`
/// samples it. sonde must finish, walk and name what it can, and count the
/// rest: the copy whose FDEs all lead to no CIE is walked by frame
/// pointers, the ones with garbled DWARF and with a compressed
/// `.debug_info` declaring 16 PB (which aborted sonde before the check of
/// compressed sections) are named from their symbol tables, and the one
/// without section headers is `[unknown]` in its module, each counted.
#[test]
fn profile_survives_a_process_running_code_from_crafted_libraries_and_counts_them() {
    let plain = std::fs::read(build_workload("spinlib", &["-shared", "-fPIC", "-O2", "-g", "-fno-omit-frame-pointer"]))
        .unwrap();
    let gz = std::fs::read(build_workload(
        "spinlib",
        &["-shared", "-fPIC", "-O2", "-g", "-gz=zlib", "-fno-omit-frame-pointer"],
    ))
    .unwrap();
    let d = dir("e2e");
    let eh = section(&plain, ".eh_frame");
    let mut a = plain.clone();
    for f in fdes(&plain[eh.off..eh.off + eh.size]) {
        put(&mut a, eh.off + f + 4, &4u32.to_le_bytes());
    }
    let mut b = plain.clone();
    for name in [".debug_info", ".debug_line", ".debug_abbrev"] {
        let s = section(&plain, name);
        garble(&mut b[s.off..s.off + s.size]);
    }
    let mut c = gz.clone();
    let di = section(&gz, ".debug_info");
    put(&mut c, di.off + 8, &(1u64 << 54).to_le_bytes());
    let mut e = plain.clone();
    put(&mut e, 0x28, &(plain.len() as u64 * 4).to_le_bytes());
    put(&mut e, 0x3c, &0xffffu16.to_le_bytes());
    let libs: Vec<PathBuf> = [("cie", a), ("dwarf", b), ("bomb", c), ("noshdr", e)]
        .into_iter()
        .map(|(n, bytes)| {
            let p = d.join(format!("libspin-{n}.so"));
            std::fs::write(&p, bytes).unwrap();
            p
        })
        .collect();
    let dlspin = build_workload("dlspin", &["-O2", "-g", "-fno-omit-frame-pointer"]);
    let mut w =
        std::process::Command::new(&dlspin).arg("30").args(&libs).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(w.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let out = std::process::Command::new(crate::common::SONDE)
        .args(["profile", "-p", &w.id().to_string(), "-d", "3s", "-F", "199", "--json"])
        .output()
        .unwrap();
    let alive = w.try_wait().unwrap().is_none();
    let _ = w.kill();
    let _ = w.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(alive, "the workload died while profiled");
    let lines = crate::common::json_lines(&out.stdout);
    let summary = lines.iter().find(|v| v["type"] == "summary").expect("a summary");
    // Samples per library, and how many of them name spin_in_lib.
    let mut per: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for s in lines.iter().filter(|v| v["type"] == "stack") {
        let count = s["count"].as_u64().unwrap();
        let frames = s["frames"].as_array().unwrap();
        for lib in ["cie", "dwarf", "bomb", "noshdr"] {
            let m = format!("libspin-{lib}.so");
            if let Some(f) = frames.iter().find(|f| f["module"].as_str().is_some_and(|x| x.ends_with(&m))) {
                let e = per.entry(lib.to_string()).or_default();
                e.0 += count;
                if f["name"] == "spin_in_lib" {
                    e.1 += count;
                }
            }
        }
    }
    println!("samples (all, naming spin_in_lib) per library: {per:?}\nsummary: {summary}");
    for lib in ["cie", "dwarf", "bomb", "noshdr"] {
        let (all, named) = per.get(lib).copied().unwrap_or_default();
        assert!(all >= 20, "{lib}: {all} samples in it: {per:?}");
        if lib == "noshdr" {
            assert_eq!(named, 0, "no section headers, no symbol table");
        } else {
            assert!(named * 10 >= all * 9, "{lib}: {named} of {all} name spin_in_lib");
        }
    }
    let files = &summary["unsymbolized_files"];
    assert!(files["dwarf_skipped"].as_u64().unwrap_or(0) >= 2, "{files}");
    assert!(files["malformed"].as_u64().unwrap_or(0) + files["unreadable"].as_u64().unwrap_or(0) >= 1, "{files}");
    // Every stack complete: the copy without usable FDEs is walked by its
    // frame pointers.
    assert_eq!(summary["truncated_stacks"], 0, "{summary}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The runtime decoders as hostile input, bounded like the ELF fuzzer
/// (`SONDE_FUZZ_SECS` / 4): Go's function table (a real one from a build of
/// gosplit.go, mutated: header words, offsets, counts, varints, truncation)
/// through parsing, naming at random pcs and the unwinder's rows; CPython's
/// line tables of every format, its description of itself
/// (`_Py_DebugOffsets`, every format) and its thread-state accessor's
/// instructions; HotSpot's compressed line tables and
/// inlining scopes (UNSIGNED5 before and since JDK 21); and code objects
/// crafted in this process's
/// own memory (lengths, string states, pointers and line-table sizes a
/// traced process controls) read back through `/proc/self/mem` as sonde
/// reads a Python process's. Each input must return, within `HANG`, without
/// a panic; findings are kept like the ELF fuzzer's.
#[test]
fn bounded_fuzz_of_the_go_table_and_python_decoders() {
    use sonde::engine::process::mem::{le, Mem};
    use sonde::engine::runtime::{go::Pclntab, java, python, v8, RtFrame};
    let secs: u64 = std::env::var("SONDE_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20) / 4;
    let seed: u64 = std::env::var("SONDE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    println!("runtime fuzz seed {seed}, {secs} s");
    let mut rng = Rng(seed);
    // A real table to mutate.
    let d = dir("gofuzz");
    let bin = d.join("gosplit");
    let st = std::process::Command::new(crate::common::go_bin())
        .args(["build", "-ldflags=-s -w", "-o"])
        .arg(&bin)
        .arg(format!("{}/tests/workloads/gosplit.go", env!("CARGO_MANIFEST_DIR")))
        .env("GO111MODULE", "off")
        .status()
        .unwrap();
    assert!(st.success());
    let file = std::fs::read(&bin).unwrap();
    let obj = object::File::parse(&*file).unwrap();
    let pcln = obj.section_by_name(".gopclntab").unwrap();
    let seed_table = pcln.data().unwrap().to_vec();
    let text = obj.section_by_name(".text").unwrap().address();
    let real = Pclntab::parse(seed_table.clone(), text).expect("the real table parses");
    let (lo, hi) = real.range();
    assert!(real.frames(lo + 16).is_some() && !real.sp_rows(&[]).is_empty());

    let mut findings = Vec::new();
    let (mut n_go, mut n_ok, mut n_lines, mut n_code, mut n_java) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut n_v8, mut n_js) = (0u64, 0u64);
    let start = Instant::now();
    let mut check = |kind: &str, bytes: &[u8], f: &mut dyn FnMut()| {
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        if r.is_err() || t0.elapsed() > HANG {
            findings.push(format!("{kind}: {} ({:?})", keep(kind, bytes).display(), t0.elapsed()));
        }
    };
    while start.elapsed() < Duration::from_secs(secs.max(2)) {
        // Go: mutate a copy of the table (a window of it, to keep it quick).
        let mut t = seed_table.clone();
        for _ in 0..1 + rng.below(8) {
            match rng.below(5) {
                0 if t.len() >= 72 => {
                    // a header word
                    let at = 8 + 8 * rng.below(8);
                    let v = [0u64, 1, u64::MAX, rng.next(), rng.next() % t.len() as u64][rng.below(5)];
                    t[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                1 => {
                    let at = rng.below(t.len());
                    t[at] = rng.next() as u8;
                }
                2 if t.len() >= 4 => {
                    let at = rng.below(t.len() - 3);
                    t[at..at + 4].copy_from_slice(&(rng.next() as u32).to_le_bytes());
                }
                3 => t.truncate(rng.below(t.len()).max(8)),
                0 | 2 => {}
                _ => {
                    // varint runs that never end
                    let at = rng.below(t.len());
                    for b in t.iter_mut().skip(at).take(64) {
                        *b = 0xff;
                    }
                }
            }
        }
        let bytes = t.clone();
        let mut ok = false;
        check("gopclntab", &bytes, &mut || {
            if let Ok(p) = Pclntab::parse(t.clone(), text) {
                ok = true;
                for _ in 0..64 {
                    let pc = lo + (rng.next() % (hi - lo + 64));
                    let _ = p.frames(pc);
                }
                let _ = p.sp_rows(&[]).len();
                // The cgo switches of both architectures, with the table's
                // own bytes as the code of every function.
                for arm64 in [false, true] {
                    let sw = sonde::engine::runtime::go::cgo_switches(
                        &p,
                        &|a, n| {
                            let at = (a.wrapping_sub(lo) as usize) % t.len().max(1);
                            Some(t[at..t.len().min(at + n as usize)].to_vec())
                        },
                        arm64,
                    );
                    let _ = p.sp_rows(&sw).len();
                }
            }
        });
        n_go += 1;
        n_ok += ok as u64;
        // Python line tables, every format, random locations.
        let table: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
        for minor in [8u8, 9, 10, 11, 12, 13, 14, 15] {
            let loc = [0, u32::MAX, rng.next() as u32, 200 + rng.below(400) as u32][rng.below(4)];
            check("pylines", &table, &mut || {
                let _ = python::line_at(minor, &table, 192, rng.next() as u32, loc);
            });
            n_lines += 1;
        }
        // CPython's description of itself (`_Py_DebugOffsets`), every
        // version's format and a newer one's, from random bytes or a real
        // block's header mutated; and the thread-state accessor's
        // instructions, both architectures.
        let mut dbg: Vec<u8> = (0..rng.below(1024)).map(|_| rng.next() as u8).collect();
        if rng.below(2) == 0 && dbg.len() >= 16 {
            dbg[..8].copy_from_slice(b"xdebugpy");
            let v = 0x030e_00f0u64 + ((rng.below(4) as u64) << 16);
            dbg[8..16].copy_from_slice(&v.to_le_bytes());
        }
        for minor in [13u32, 14, 15, 16] {
            check("pydescribe", &dbg, &mut || {
                let _ = python::describe::head(&dbg);
                if let Ok((d, _)) = python::describe::describe(&dbg, minor) {
                    let _ = d.version();
                    let _ = d.get("interpreter_frame.executable");
                }
            });
            n_lines += 1;
        }
        let ins: Vec<u8> = (0..rng.below(48)).map(|_| rng.next() as u8).collect();
        for x86 in [true, false] {
            check("pytls", &ins, &mut || {
                let _ = python::tls_offset(&ins, x86);
            });
        }
        // HotSpot: line tables and inlining scopes, both UNSIGNED5 forms.
        let jb: Vec<u8> = (0..rng.below(256)).map(|_| rng.next() as u8).collect();
        let meta: Vec<u64> = (0..rng.below(8)).map(|_| rng.next()).collect();
        for x in [0u8, 1] {
            let off = rng.next() as u32 % (jb.len() as u32 + 8);
            check("javadebug", &jb, &mut || {
                assert!(java::line_table(&jb, x).len() <= jb.len());
                assert!(java::scope_chain(&jb, &meta, off, x).len() <= 64);
            });
            n_java += 1;
        }
        // V8: source position tables, baseline offset tables, line ends and
        // inlining chains from random bytes.
        let vb: Vec<u8> = (0..rng.below(256)).map(|_| rng.next() as u8).collect();
        let code: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
        let sizes: Vec<u8> = (0..3 * rng.below(40)).map(|_| rng.next() as u8).collect();
        let (at, flags) = (rng.next() as u32 % 4096, rng.next() as u8);
        check("v8tables", &vb, &mut || {
            let t = v8::tables::positions(&vb, v8::tables::Encoding::Signed);
            assert!(v8::tables::positions(&vb, v8::tables::Encoding::Flagged).len() <= vb.len());
            assert!(t.len() <= vb.len());
            let _ = v8::tables::position_at(&t, at);
            let o = v8::tables::baseline_offsets(&vb, &code, &sizes);
            assert!(o.len() <= vb.len() + 1);
            let _ = v8::tables::bytecode_at(&o, at);
            let ends = v8::tables::line_ends(vb.iter().map(|&b| b as u16), 64);
            assert!(ends.len() <= 65);
            let f = std::rc::Rc::new(v8::JsFn::named("f", ends, t.clone()));
            let inlined: Vec<(u64, Option<std::rc::Rc<v8::JsFn>>)> =
                t.iter().map(|&(_, p)| (p, Some(f.clone()))).collect();
            let c = v8::JsCode::Optimized { func: f.clone(), positions: t, inlined, shift: at % 16 };
            assert!(c.frames(at, flags).len() <= 65);
            let c = v8::JsCode::Baseline { func: f.clone(), offsets: o };
            let _ = c.frames(at, flags);
        });
        n_v8 += 1;
        // V8 strings of every shape, in our own memory read as a traced
        // process's: maps with instance types, sequential, cons (pointing
        // anywhere, themselves included), thin, sliced and external
        // strings, with lengths and offsets of any size.
        {
            let lay = v8::heap::StringLayout {
                first_nonstring: 128,
                len: 12,
                chars: 16,
                cons: (16, 24),
                thin: 16,
                sliced: (16, 24),
                external_data: 24,
                repr: (0, 1, 2, 3, 5),
                repr_mask: 7,
                encoding: (8, 8),
            };
            let n = 8;
            let mut heap = vec![0u8; 64 * (2 * n)];
            let base = heap.as_ptr() as u64;
            let obj = |i: usize| base + 64 * i as u64;
            for i in 0..n {
                // map i: its instance type at +12
                let t = [0u16, 8, 1, 9, 2, 10, 3, 5, 200][rng.below(9)];
                heap[64 * i + 12..64 * i + 14].copy_from_slice(&t.to_le_bytes());
                // string n + i: map, length, two tagged words
                let s = 64 * (n + i);
                heap[s..s + 8].copy_from_slice(&(obj(rng.below(n)) | 1).to_le_bytes());
                let len = [3u32, 0, u32::MAX, 1 << 30, rng.next() as u32 % 64][rng.below(5)];
                heap[s + 12..s + 16].copy_from_slice(&len.to_le_bytes());
                for w in [16, 24] {
                    let v = [obj(n + rng.below(n)) | 1, 0, 7u64 << 32, rng.next(), obj(n + i) | 1][rng.below(5)];
                    heap[s + w..s + w + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
            let mem = Mem::open(std::process::id()).unwrap();
            let root = obj(n + rng.below(n)) | 1;
            let snapshot = heap.clone();
            check("v8strings", &snapshot, &mut || {
                let mut types = std::collections::HashMap::new();
                let mut h = v8::heap::Heap { mem: &mem, map_type: 12, types: &mut types };
                let mut units = 0usize;
                h.string_units(&lay, root, 4096, &mut |p| units += p.len());
                assert!(units <= 4096);
            });
            std::hint::black_box(&heap);
            n_js += 1;
        }
        // A code object in our own memory, read as a traced process's.
        let mut lay = python::layout([8, 10, 11, 12][rng.below(4)]).unwrap();
        lay.co_name = lay.co_name.min(200);
        let mut obj = vec![0u8; 256];
        let mut strbuf = vec![0u8; 128];
        let mut lt = vec![0u8; 64];
        let code_type = 0x1234_5678u64;
        obj[8..16].copy_from_slice(&code_type.to_le_bytes());
        let (sp, lp) = (strbuf.as_ptr() as u64, lt.as_ptr() as u64);
        let ptr = |r: &mut Rng, good: u64| [good, 0, 8, u64::MAX - 3, r.next(), good + (r.next() % 64)][r.below(6)];
        for off in [lay.co_name, lay.co_filename] {
            let p = ptr(&mut rng, sp);
            obj[off as usize..off as usize + 8].copy_from_slice(&p.to_le_bytes());
        }
        let p = ptr(&mut rng, lp);
        obj[lay.co_linetable as usize..lay.co_linetable as usize + 8].copy_from_slice(&p.to_le_bytes());
        // str: length, state (kind, compact, ascii bits), text.
        let len = [3u64, 0, u64::MAX, 1 << 40, rng.next() % 10_000][rng.below(5)];
        strbuf[16..24].copy_from_slice(&len.to_le_bytes());
        strbuf[32..36].copy_from_slice(&(rng.next() as u32).to_le_bytes());
        for b in strbuf.iter_mut().skip(40) {
            *b = b'a' + (rng.next() % 26) as u8;
        }
        // bytes: its size, then contents.
        let blen = [8u64, 0, u64::MAX, 1 << 30, rng.next()][rng.below(5)];
        lt[16..24].copy_from_slice(&blen.to_le_bytes());
        for b in lt.iter_mut().skip(32) {
            *b = rng.next() as u8;
        }
        let cookie = python::cookie(
            le::<4>(&obj, lay.co_argcount as usize) as u32,
            le::<4>(&obj, lay.co_firstlineno as usize) as u32,
            le::<4>(&obj, lay.co_extra as usize) as u32,
        );
        let py = python::Python {
            version: format!("3.{}", lay.minor),
            layout: lay,
            from_debug_offsets: false,
            untested: None,
            code_type,
            ranges: vec![],
            ts: python::ThreadState::Key { key: 0, tsd: 0 },
            image: String::new(),
        };
        let mem = Mem::open(std::process::id()).unwrap();
        let mut all = obj.clone();
        all.extend_from_slice(&strbuf);
        check("pycode", &all, &mut || {
            if let Ok(info) = python::code_info(&py, &mem, obj.as_ptr() as u64, cookie) {
                assert!(info.name.chars().count() <= 4096 && info.file.chars().count() <= 4096);
                let f = RtFrame { addr: 0, loc: rng.next() as u32, cookie: 0, flags: 0, kind: 1 };
                let _ = info.line(&f);
            }
        });
        n_code += 1;
        std::hint::black_box((&strbuf, &lt));
    }
    println!(
        "runtime fuzz: {n_go} Go tables ({n_ok} parsed), {n_lines} line tables, {n_code} code objects, \
         {n_java} HotSpot debug tables, {n_v8} V8 tables, {n_js} V8 string heaps"
    );
    assert!(n_go > 10 && n_code > 10 && n_java > 10 && n_v8 > 10 && n_js > 10);
    assert!(findings.is_empty(), "seed {seed}:\n{}", findings.join("\n"));
}
