//! Tables in the kernel: lays built tables out in `unwind.h`'s maps and
//! tells the walk which executable each process has mapped where.
//!
//! - Rows live in chunks of [`CHUNK_ROWS`] 8-byte rows (1 MiB), each a
//!   BPF array made here with `BPF_F_MMAPABLE`, filled through a shared
//!   mapping (no syscall per row) and put into the `unw_chunks` array of
//!   maps; chunks are made as tables arrive, so kernel memory follows use.
//! - Each table is split into 64 KiB pages of code; `unw_pages` holds, per
//!   page, where its rows start and how many there are. The row covering a
//!   page's start is repeated as its first row, so a lookup never leaves
//!   its page.
//! - `unw_procs` holds each process's executable mappings, sorted by start,
//!   with the load bias and the pages of each mapping's table.
//!
//! A table is built once per run for each distinct content (keyed as the
//! disk cache is, see [`super::cache`]) and shared by every process that
//! maps it. Tables stay loaded until the run ends.
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::{fd::AsFd, unix::fs::MetadataExt},
    time::{Duration, Instant},
};

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use super::{
    cache::{self, Cache, Key},
    elf::{self, Segment},
    table::{self, Table},
    UnwindError,
};

/// Rows per chunk (UNW_CHUNK_ROWS).
pub const CHUNK_SHIFT: u32 = 17;
/// Rows per chunk.
pub const CHUNK_ROWS: usize = 1 << CHUNK_SHIFT;
/// Most chunks (UNW_MAX_CHUNKS).
pub const MAX_CHUNKS: usize = 512;
/// Executable mappings per process the walk knows (UNW_MAX_MAPS).
pub const MAX_MAPS: usize = 256;
/// Bytes of one `struct unw_map`.
const MAP_BYTES: usize = 40;
/// Bytes of `struct unw_proc`.
pub const PROC_BYTES: usize = 8 + MAX_MAPS * MAP_BYTES;
const PAGE_SHIFT: u32 = 16;

/// Where a table sits in the kernel's maps.
#[derive(Debug, Clone, Copy)]
struct Placed {
    first_page: u32,
    n_pages: u32,
    lo_page: u64,
}

/// A mapped file's identity: see [`Tables::file_table`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// A mapped file, as opened once.
#[derive(Debug, Clone)]
struct FileTable {
    segments: Vec<Segment>,
    placed: Option<Placed>,
}

/// What loading tables cost and found, for the summary.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct TableStats {
    /// Processes whose mappings were given to the walk.
    pub processes: u64,
    /// Distinct executables (by content) with a table loaded.
    pub executables: u64,
    /// Executables without a usable table, by reason (frame pointers there).
    pub without_table: HashMap<String, u64>,
    /// Rows loaded into the kernel.
    pub rows: u64,
    /// Bytes of `.eh_frame` / `.debug_frame` those rows came from.
    pub cfi_bytes: u64,
    /// Tables built (not from the disk cache).
    pub built: u64,
    /// Tables read from the disk cache.
    pub cache_hits: u64,
    /// Why the disk cache is not used, if it is not.
    pub cache_disabled: Option<String>,
    /// Time spent building, reading and loading tables.
    #[serde(serialize_with = "ser_ms")]
    pub load_time: Duration,
    /// Kernel memory of rows (chunks), the page index and process entries.
    pub kernel_bytes: u64,
    /// Executable mappings left out because a process had more than MAX_MAPS.
    pub maps_dropped: u64,
    /// Processes not given to the walk because unw_procs was full.
    pub procs_full: u64,
    /// Tables not loaded because the chunk or page budget ran out.
    pub budget_full: u64,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1e6).round() / 1e3)
}

/// One chunk: its map and a writable mapping of its rows.
struct Chunk {
    _map: MapHandle,
    rows: *mut u64,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: `rows` is the mapping made in `new_chunk`, of this size.
        unsafe { libc::munmap(self.rows.cast(), CHUNK_ROWS * 8) };
    }
}

/// The maps of a loaded object the tables go into.
pub struct Maps<'a> {
    /// `unw_procs`.
    pub procs: &'a dyn MapCore,
    /// `unw_pages`.
    pub pages: &'a dyn MapCore,
    /// `unw_chunks`.
    pub chunks: &'a dyn MapCore,
}

/// The tables of a run.
pub struct Tables {
    cache: Cache,
    chunks: Vec<Chunk>,
    chunk_used: usize,
    pages_cap: u32,
    next_page: u32,
    by_key: HashMap<Key, Option<Placed>>,
    by_file: HashMap<FileId, FileTable>,
    /// Per process: the exec lines of its maps when loaded, and when.
    procs: HashMap<u32, (u64, Instant)>,
    /// The vDSO's table (the same image in every process).
    vdso: Option<Option<FileTable>>,
    /// What it cost and found.
    pub stats: TableStats,
}

/// A process's executable mapping.
struct ExecMapping {
    start: u64,
    end: u64,
    offset: u64,
    /// `/proc/PID/maps`'s range field, for map_files.
    range: String,
    vdso: bool,
}

fn exec_mappings(pid: u32) -> Option<(Vec<ExecMapping>, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mut out = Vec::new();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms), Some(off), Some(_dev), Some(_ino)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let path = it.next().unwrap_or("");
        if !perms.contains('x') || !(path.starts_with('/') || path == "[vdso]") {
            continue;
        }
        let Some((s, e)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end), Ok(offset)) =
            (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16), u64::from_str_radix(off, 16))
        else {
            continue;
        };
        for b in line.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        // map_files names ranges without the zero padding maps shows.
        out.push(ExecMapping { start, end, offset, range: format!("{start:x}-{end:x}"), vdso: path == "[vdso]" });
    }
    Some((out, h))
}

impl Tables {
    /// Tables for a run whose `unw_pages` holds `pages_cap` pages.
    pub fn new(pages_cap: u32) -> Tables {
        let cache = Cache::open();
        let stats = TableStats { cache_disabled: cache.disabled.clone(), ..Default::default() };
        Tables {
            cache,
            chunks: Vec::new(),
            chunk_used: CHUNK_ROWS,
            pages_cap,
            next_page: 0,
            by_key: HashMap::new(),
            by_file: HashMap::new(),
            procs: HashMap::new(),
            vdso: None,
            stats,
        }
    }

    /// Whether `pid`'s tables were loaded.
    pub fn has(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Loads the tables of `pid`'s executables and gives the walk its
    /// mappings. Returns false when the process is gone. With `refresh`,
    /// only if its executable mappings changed since (dlopen); a process
    /// whose code has no file (a JIT) asks again and again, so its maps are
    /// read at most every 100 ms.
    pub fn load_process(&mut self, m: &Maps<'_>, pid: u32, refresh: bool) -> bool {
        if refresh {
            if let Some((_, at)) = self.procs.get(&pid) {
                if at.elapsed() < Duration::from_millis(100) {
                    return true;
                }
            }
        }
        let t0 = Instant::now();
        let Some((mappings, h)) = exec_mappings(pid) else { return false };
        if refresh && self.procs.get(&pid).is_some_and(|(old, _)| *old == h) {
            self.procs.insert(pid, (h, Instant::now()));
            return true;
        }
        let mut entries: Vec<[u64; 5]> = Vec::new();
        for mp in &mappings {
            let ft = if mp.vdso { self.vdso_table(m) } else { self.file_table(m, pid, &mp.range) };
            // Known to the walk either way: a mapping without a table is
            // walked by frame pointers and asks for no refresh.
            let placed =
                ft.as_ref().and_then(|ft| Some((ft.placed?, elf::bias_of(&ft.segments, mp.start, mp.offset)?)));
            let (first_page, n_pages, lo_page, bias) =
                placed.map(|(p, b)| (p.first_page, p.n_pages, p.lo_page, b)).unwrap_or((0, 0, 0, 0));
            entries.push([mp.start, mp.end, bias, lo_page, (first_page as u64) | ((n_pages as u64) << 32)]);
        }
        entries.sort_by_key(|e| e[0]);
        if entries.len() > MAX_MAPS {
            self.stats.maps_dropped += (entries.len() - MAX_MAPS) as u64;
            entries.truncate(MAX_MAPS);
        }
        let mut v = vec![0u8; PROC_BYTES];
        v[..4].copy_from_slice(&(entries.len() as u32).to_ne_bytes());
        for (i, e) in entries.iter().enumerate() {
            let o = 8 + i * MAP_BYTES;
            for (j, w) in e.iter().enumerate() {
                v[o + 8 * j..o + 8 * j + 8].copy_from_slice(&w.to_ne_bytes());
            }
        }
        if m.procs.update(&pid.to_ne_bytes(), &v, MapFlags::ANY).is_err() {
            self.stats.procs_full += 1;
        } else if self.procs.insert(pid, (h, Instant::now())).is_none() {
            self.stats.processes += 1;
        }
        self.stats.load_time += t0.elapsed();
        true
    }

    /// Forgets processes that are gone (their entries, if the exit hook
    /// missed them, and our record).
    pub fn forget_gone(&mut self, m: &Maps<'_>) {
        let gone: Vec<u32> = self.procs.keys().copied().filter(|p| !super::super::pid_exists(*p)).collect();
        for p in gone {
            self.procs.remove(&p);
            let _ = m.procs.delete(&p.to_ne_bytes());
        }
    }

    /// Drops our record of `pid` (its entry was deleted by an exec).
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    fn vdso_table(&mut self, m: &Maps<'_>) -> Option<FileTable> {
        if self.vdso.is_none() {
            let t = crate::engine::stacks::own_vdso().and_then(|f| self.table_of(m, f).ok());
            self.vdso = Some(t);
        }
        self.vdso.clone().flatten()
    }

    fn file_table(&mut self, m: &Maps<'_>, pid: u32, range: &str) -> Option<FileTable> {
        // map_files opens the very inode mapped (also in other mount
        // namespaces, also when deleted) without resolving a path.
        let Some((f, md)) = File::open(format!("/proc/{pid}/map_files/{range}"))
            .ok()
            .and_then(|f| Some((f.metadata().ok()?, f)))
            .map(|(m, f)| (f, m))
        else {
            *self.stats.without_table.entry("unreadable".into()).or_default() += 1;
            return None;
        };
        // The inode alone is not the file: a deleted file's inode number is
        // reused at once, and `cp` over a library keeps it. Size and the
        // modification and change times make a new version a new key.
        let id = FileId {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        };
        if let Some(t) = self.by_file.get(&id) {
            return Some(t.clone());
        }
        // A file without a usable table is remembered too, so a process
        // that maps it is not read again at every refresh.
        let t = self.table_of(m, f).unwrap_or_else(|e| {
            *self.stats.without_table.entry(reason(&e)).or_default() += 1;
            FileTable { segments: Vec::new(), placed: None }
        });
        self.by_file.insert(id, t.clone());
        Some(t)
    }

    /// Reads `f`, finds or builds its table and places it.
    fn table_of(&mut self, m: &Maps<'_>, f: File) -> Result<FileTable, UnwindError> {
        let info = elf::read(f)?;
        let segments = info.segments.clone();
        if info.eh_frame.is_none() && info.debug_frame.is_none() {
            *self.stats.without_table.entry(reason(&UnwindError::NoUnwindInfo)).or_default() += 1;
            return Ok(FileTable { segments, placed: None });
        }
        let key = cache::key(&info);
        if let Some(p) = self.by_key.get(&key) {
            return Ok(FileTable { segments, placed: *p });
        }
        let cfi =
            info.eh_frame.as_ref().map_or(0, |s| s.data.len()) + info.debug_frame.as_ref().map_or(0, |s| s.data.len());
        let table = match self.cache.get(&key) {
            Some(t) => {
                self.stats.cache_hits += 1;
                t
            }
            None => {
                let t = table::build(&info)?;
                self.stats.built += 1;
                self.cache.put(&key, &t);
                t
            }
        };
        drop(info);
        let placed = self.place(m, &table);
        if placed.is_some() {
            self.stats.executables += 1;
            self.stats.rows += table.rows.len() as u64;
            self.stats.cfi_bytes += cfi as u64;
        }
        self.by_key.insert(key, placed);
        Ok(FileTable { segments, placed })
    }

    fn new_chunk(&mut self, m: &Maps<'_>) -> Option<()> {
        if self.chunks.len() >= MAX_CHUNKS {
            return None;
        }
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            map_flags: libbpf_sys::BPF_F_MMAPABLE,
            ..Default::default()
        };
        let map = MapHandle::create(MapType::Array, Some("unw_chunk"), 4, 8, CHUNK_ROWS as u32, &opts).ok()?;
        use std::os::fd::AsRawFd;
        // SAFETY: a shared, writable mapping of an mmapable BPF array of
        // exactly this size; unmapped when the chunk is dropped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHUNK_ROWS * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let idx = self.chunks.len() as u32;
        let fd = map.as_fd().as_raw_fd() as u32;
        let chunk = Chunk { _map: map, rows: p.cast() };
        m.chunks.update(&idx.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY).ok()?;
        self.chunks.push(chunk);
        self.chunk_used = 0;
        self.stats.kernel_bytes += (CHUNK_ROWS * 8) as u64;
        Some(())
    }

    /// Rows for `n` entries in one chunk: (global index of the first row).
    fn alloc_rows(&mut self, m: &Maps<'_>, n: usize) -> Option<u32> {
        if n > CHUNK_ROWS {
            return None;
        }
        if self.chunk_used + n > CHUNK_ROWS {
            self.new_chunk(m)?;
        }
        let at = ((self.chunks.len() - 1) << CHUNK_SHIFT) + self.chunk_used;
        self.chunk_used += n;
        Some(at as u32)
    }

    /// Lays `t` out in pages and rows; None when the budget ran out.
    fn place(&mut self, m: &Maps<'_>, t: &Table) -> Option<Placed> {
        // The pages its span needs, before laying anything out: a crafted
        // table spanning 2^62 bytes must not allocate a page list for it.
        let n_pages = page_span(t)?;
        if self.next_page as u64 + n_pages > self.pages_cap as u64 {
            self.stats.budget_full += 1;
            return None;
        }
        let n_pages = n_pages as u32;
        let pages = layout(t)?;
        let lo_page = pages.first()?.0;
        let first_page = self.next_page;
        self.next_page += n_pages;
        for (page, rows) in pages {
            let idx = first_page + (page - lo_page) as u32;
            let val = if rows.is_empty() {
                0
            } else {
                let Some(at) = self.alloc_rows(m, rows.len()) else {
                    self.stats.budget_full += 1;
                    return None;
                };
                let chunk = &self.chunks[(at >> CHUNK_SHIFT) as usize];
                let off = (at as usize) & (CHUNK_ROWS - 1);
                // SAFETY: alloc_rows keeps [off, off + len) inside the chunk's mapping.
                let dst = unsafe { std::slice::from_raw_parts_mut(chunk.rows.add(off), rows.len()) };
                dst.copy_from_slice(&rows);
                (at as u64) | ((rows.len() as u64) << 32)
            };
            if val != 0 && m.pages.update(&idx.to_ne_bytes(), &val.to_ne_bytes(), MapFlags::ANY).is_err() {
                return None;
            }
        }
        Some(Placed { first_page, n_pages, lo_page })
    }

    /// Kernel memory in use now: chunks, the page index, process entries.
    pub fn kernel_bytes(&self) -> u64 {
        self.stats.kernel_bytes + self.pages_cap as u64 * 8 + self.procs.len() as u64 * PROC_BYTES as u64
    }

    /// Distinct processes loaded so far.
    pub fn loaded(&self) -> HashSet<u32> {
        self.procs.keys().copied().collect()
    }
}

/// Most 64 KiB pages one table may span (16 GiB of code).
pub const MAX_SPAN_PAGES: u64 = 1 << 18;

/// Pages from a table's first row to its last (None: empty, or wider than
/// [`MAX_SPAN_PAGES`]).
pub fn page_span(t: &Table) -> Option<u64> {
    let (first, last) = (t.rows.first()?.addr, t.rows.last()?.addr);
    // The last row is the gap that ends the covered range.
    let n = ((last.checked_sub(1)? >> PAGE_SHIFT).checked_sub(first >> PAGE_SHIFT)?).checked_add(1)?;
    (n <= MAX_SPAN_PAGES).then_some(n)
}

/// A table split into 64 KiB pages: (page number, its rows as the kernel
/// reads them: page offset | rule), for every page from the first to the
/// last row's; a page with no CFI gets no rows. None for a table
/// [`page_span`] refuses.
pub fn layout(t: &Table) -> Option<Vec<(u64, Vec<u64>)>> {
    let rows = &t.rows;
    if rows.len() < 2 {
        return None;
    }
    let n = page_span(t)?;
    let gap = table::Rule::GAP.encode();
    let lo = rows[0].addr >> PAGE_SHIFT;
    let hi = lo + n - 1;
    let mut out = Vec::with_capacity(n as usize);
    let mut i = 0; // first row with addr >= page start
    for page in lo..=hi {
        let start = page << PAGE_SHIFT;
        let end = start.saturating_add(1 << PAGE_SHIFT);
        while i < rows.len() && rows[i].addr < start {
            i += 1;
        }
        let mut v = Vec::new();
        // The row in force at the page's start, if it began before.
        if (i == rows.len() || rows[i].addr > start) && i > 0 {
            v.push(rows[i - 1].rule & !0xffff);
        }
        let mut j = i;
        while j < rows.len() && rows[j].addr < end {
            v.push(((rows[j].addr - start) & 0xffff) | rows[j].rule);
            j += 1;
        }
        if v.iter().all(|r| r & !0xffff == gap) {
            v.clear();
        }
        out.push((page, v));
    }
    Some(out)
}

/// The model of `unwind.h`'s page lookup: the rule at `vaddr` from a
/// [`layout`] (for tests).
pub fn layout_lookup(pages: &[(u64, Vec<u64>)], vaddr: u64) -> table::Rule {
    let Some(lo) = pages.first().map(|p| p.0) else { return table::Rule::GAP };
    let page = (vaddr >> PAGE_SHIFT).wrapping_sub(lo);
    let Some((_, rows)) = pages.get(page as usize) else { return table::Rule::GAP };
    let target = vaddr & 0xffff;
    let i = rows.partition_point(|r| r & 0xffff <= target);
    if i == 0 {
        return table::Rule::GAP;
    }
    table::Rule::decode(rows[i - 1])
}

fn reason(e: &UnwindError) -> String {
    match e {
        UnwindError::NotElf(_) => "not x86-64 ELF",
        UnwindError::NoUnwindInfo => "no .eh_frame or .debug_frame",
        UnwindError::Malformed(_) => "malformed",
        UnwindError::TooBig(_) => "too big",
        UnwindError::Io(_) => "unreadable",
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::unwind::table::{Cfa, Row, Rule, SavedRbp};

    #[test]
    fn page_layout_gives_the_table_rule_at_every_address() {
        let r = |n| Rule { cfa: Cfa::Rsp(n), rbp: SavedRbp::Same }.encode();
        let gap = Rule::GAP.encode();
        // Rows crossing page boundaries, a page with no rows of its own,
        // a row starting exactly on a page, a gap spanning a whole page.
        let t = Table {
            rows: vec![
                Row { addr: 0x1_fff0, rule: r(8) },
                Row { addr: 0x2_0004, rule: r(16) },
                Row { addr: 0x3_0000, rule: r(24) },
                Row { addr: 0x4_8000, rule: gap },
                Row { addr: 0x6_0100, rule: r(8) },
                Row { addr: 0x6_0200, rule: gap },
            ],
            ..Default::default()
        };
        let pages = layout(&t).unwrap();
        assert_eq!(pages.len(), 6);
        assert!(pages[4].1.is_empty(), "page 0x5 is all gap: {:?}", pages[4]);
        for a in (0x1_0000..0x7_0000)
            .step_by(3)
            .chain([0x1_fff0, 0x2_0000, 0x2_0004, 0x3_0000, 0x4_7fff, 0x4_8000, 0x6_01ff, 0x6_0200])
        {
            assert_eq!(layout_lookup(&pages, a), t.lookup(a), "at {a:#x}");
        }
    }

    #[test]
    fn a_table_spanning_the_address_space_is_refused_before_any_allocation() {
        let r = Rule { cfa: Cfa::Rsp(8), rbp: SavedRbp::Same }.encode();
        let t = Table {
            rows: vec![
                Row { addr: 0x1000, rule: r },
                Row { addr: 0x4000_0000_0000_0000, rule: r },
                Row { addr: 0x4000_0000_0000_0010, rule: Rule::GAP.encode() },
            ],
            ..Default::default()
        };
        assert_eq!(page_span(&t), None);
        assert!(layout(&t).is_none());
        let top = Table {
            rows: vec![Row { addr: u64::MAX - 0x100, rule: r }, Row { addr: u64::MAX, rule: Rule::GAP.encode() }],
            ..Default::default()
        };
        assert_eq!(page_span(&top), Some(1));
        assert_eq!(layout(&top).unwrap().len(), 1, "no overflow at the top page");
    }

    #[test]
    fn libc_pages_agree_with_the_table() {
        let info = elf::read(File::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap()).unwrap();
        let t = table::build(&info).unwrap();
        let pages = layout(&t).unwrap();
        let (lo, hi) = (t.rows[0].addr, t.rows.last().unwrap().addr);
        for a in lo - 16..hi + 16 {
            assert_eq!(layout_lookup(&pages, a), t.lookup(a), "at {a:#x}");
        }
        let n: usize = pages.iter().map(|p| p.1.len()).sum();
        // One repeated row per page at most.
        assert!(n <= t.rows.len() + pages.len(), "{n} rows in pages for {} in the table", t.rows.len());
        assert!(pages.iter().all(|p| p.1.len() <= 1 << 16));
    }
}
