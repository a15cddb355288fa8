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
//! maps it. When the last process that maps it is gone (or has unmapped
//! it), its rows and pages go back to free lists, and a chunk left empty
//! is dropped: on a busy host, wakers and samples meet one short-lived
//! binary after another, and kernel memory must follow the processes
//! alive, not every binary the run ever met.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    os::{fd::AsFd, unix::fs::MetadataExt},
    time::{Duration, Instant},
};

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use super::{
    super::process::{MapLine, Process},
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
    /// The table's content key (None: the file has no usable table).
    key: Option<Key>,
}

/// A table in the kernel's maps and who uses it.
#[derive(Debug)]
struct Loaded {
    /// None: it did not fit the budget (tried again once unloaded).
    placed: Option<Placed>,
    /// Its rows: (first global row, count), each inside one chunk.
    rows: Vec<(u32, u32)>,
    /// The entries of `unw_pages` it wrote (the others stayed 0).
    pages_written: Vec<u32>,
    /// Distinct mapped files (and the vDSO) with this content.
    files: u32,
}

/// A process given to the walk.
#[derive(Debug)]
struct Proc {
    /// Hash of its executable lines in maps when loaded.
    maps_hash: u64,
    at: Instant,
    /// Refreshes in a row that found its maps unchanged (a JIT's code);
    /// None: none since it was loaded.
    quiet: Option<u32>,
    /// The mapped files it holds a reference on, one per mapping.
    files: Vec<FileId>,
}

/// First-fit free list of index ranges, merged when adjacent unless the
/// seam between them is a multiple of `1 << seam_shift` (a chunk's end:
/// rows of one page must stay in one chunk).
#[derive(Debug, Default)]
struct FreeList {
    free: BTreeMap<u32, u32>,
    seam_shift: u32,
}

impl FreeList {
    fn new(seam_shift: u32) -> FreeList {
        FreeList { free: BTreeMap::new(), seam_shift }
    }

    fn joins(&self, a: u32, b: u32) -> bool {
        self.seam_shift >= 32 || (a as u64 >> self.seam_shift) == (b as u64 >> self.seam_shift)
    }

    /// The start of `n` free indexes, taken from the first range that holds them.
    fn take(&mut self, n: u32) -> Option<u32> {
        let (&at, &len) = self.free.iter().find(|(_, &len)| len >= n)?;
        self.free.remove(&at);
        if len > n {
            self.free.insert(at + n, len - n);
        }
        Some(at)
    }

    /// Gives `[at, at + n)` back; returns the free range it is now part of.
    fn give(&mut self, mut at: u32, mut n: u32) -> (u32, u32) {
        if let Some((&p, &pn)) = self.free.range(..at).next_back() {
            if p + pn == at && self.joins(p, at) {
                self.free.remove(&p);
                at = p;
                n += pn;
            }
        }
        let end = at + n;
        if let Some(&nn) = self.free.get(&end) {
            if self.joins(at, end) {
                self.free.remove(&end);
                n += nn;
            }
        }
        self.free.insert(at, n);
        (at, n)
    }

    fn remove(&mut self, at: u32) {
        self.free.remove(&at);
    }

    #[cfg(test)]
    fn free_total(&self) -> u64 {
        self.free.values().map(|&n| n as u64).sum()
    }
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
    /// Tables unloaded because no process mapped them any more.
    pub unloaded: u64,
    /// Chunks dropped once all their rows were free.
    pub chunks_dropped: u64,
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
    /// Chunk slots of `unw_chunks` (None: dropped, free for a new one).
    chunks: Vec<Option<Chunk>>,
    free_rows: FreeList,
    free_pages: FreeList,
    pages_cap: u32,
    by_key: HashMap<Key, Loaded>,
    /// Mapped files, with the number of process mappings holding each.
    by_file: HashMap<FileId, (FileTable, u32)>,
    procs: HashMap<u32, Proc>,
    /// The vDSO's table (the same image in every process, never unloaded).
    vdso: Option<Option<FileTable>>,
    /// What it cost and found.
    pub stats: TableStats,
}

/// The mappings the walk is told of: executable files and the vDSO.
fn exec_mappings(p: &Process) -> impl Iterator<Item = &MapLine> {
    p.maps.iter().filter(|m| m.exec && (m.is_file() || m.path == "[vdso]"))
}

impl Tables {
    /// Tables for a run whose `unw_pages` holds `pages_cap` pages.
    pub fn new(pages_cap: u32) -> Tables {
        let cache = Cache::open();
        let stats = TableStats { cache_disabled: cache.disabled.clone(), ..Default::default() };
        let mut free_pages = FreeList::new(32);
        if pages_cap > 0 {
            free_pages.give(0, pages_cap);
        }
        Tables {
            cache,
            chunks: Vec::new(),
            free_rows: FreeList::new(CHUNK_SHIFT),
            free_pages,
            pages_cap,
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

    /// Whether a refresh of `pid` is due. The first after a load is due
    /// at once (a process that just exec'd maps its libraries right after
    /// it was loaded); then a process whose code has no file (a JIT) asks
    /// again and again, so its maps are read at most every 100 ms, and less
    /// often (up to every 3.2 s) while they stay the same.
    pub fn refresh_due(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_none_or(|p| match p.quiet {
            None => p.at.elapsed() >= Duration::from_millis(2),
            Some(q) => p.at.elapsed() >= Duration::from_millis(100 << q.min(5)),
        })
    }

    /// Loads the tables of the executables `p` maps and gives the walk its
    /// mappings. With `refresh`, only if its executable mappings changed
    /// since (dlopen). Returns whether the process was loaded (again).
    pub fn load_process(&mut self, m: &Maps<'_>, p: &Process, refresh: bool, gen: u32) -> bool {
        let pid = p.pid;
        let t0 = Instant::now();
        let h = p.exec_hash();
        if refresh {
            if let Some(p) = self.procs.get_mut(&pid).filter(|p| p.maps_hash == h) {
                p.at = Instant::now();
                p.quiet = Some(p.quiet.map_or(0, |q| q + 1));
                return false;
            }
        }
        let mut entries: Vec<[u64; 5]> = Vec::new();
        // References are taken on what the new maps hold before those of
        // the old ones are dropped, so a table both hold stays loaded.
        let mut files = Vec::new();
        for mp in exec_mappings(p) {
            let ft = if mp.path == "[vdso]" {
                self.vdso_table(m)
            } else {
                self.file_table(m, pid, &mp.range()).map(|(id, ft)| {
                    files.push(id);
                    ft
                })
            };
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
        v[4..8].copy_from_slice(&gen.to_ne_bytes());
        for (i, e) in entries.iter().enumerate() {
            let o = 8 + i * MAP_BYTES;
            for (j, w) in e.iter().enumerate() {
                v[o + 8 * j..o + 8 * j + 8].copy_from_slice(&w.to_ne_bytes());
            }
        }
        if m.procs.update(&pid.to_ne_bytes(), &v, MapFlags::ANY).is_err() {
            self.stats.procs_full += 1;
            self.release(m, files);
        } else {
            match self.procs.insert(pid, Proc { maps_hash: h, at: Instant::now(), quiet: None, files }) {
                Some(old) => self.release(m, old.files),
                None => self.stats.processes += 1,
            }
        }
        self.stats.load_time += t0.elapsed();
        true
    }

    /// Forgets processes that are gone (their entries, if the exit hook
    /// missed them, and our record), unloading tables no one maps now.
    pub fn forget_gone(&mut self, m: &Maps<'_>) {
        let gone: Vec<u32> = self.procs.keys().copied().filter(|p| !super::super::pid_exists(*p)).collect();
        for p in gone {
            let _ = m.procs.delete(&p.to_ne_bytes());
            if let Some(old) = self.procs.remove(&p) {
                self.release(m, old.files);
            }
        }
    }

    /// Drops one reference on each of `files`; a file no mapping holds is
    /// forgotten, and a table no file holds is unloaded.
    fn release(&mut self, m: &Maps<'_>, files: Vec<FileId>) {
        for id in files {
            let Some((ft, refs)) = self.by_file.get_mut(&id) else { continue };
            *refs -= 1;
            if *refs > 0 {
                continue;
            }
            let key = ft.key;
            self.by_file.remove(&id);
            if let Some(k) = key {
                self.unref_key(m, &k);
            }
        }
    }

    fn unref_key(&mut self, m: &Maps<'_>, k: &Key) {
        let Some(l) = self.by_key.get_mut(k) else { return };
        l.files -= 1;
        if l.files > 0 {
            return;
        }
        let l = self.by_key.remove(k).expect("looked up above");
        if l.placed.is_some() {
            self.stats.unloaded += 1;
        }
        self.unplace(m, l.placed, l.rows, l.pages_written);
    }

    /// Gives a table's pages and rows back. Its pages are zeroed first, so
    /// no walk finds rows that a later table may reuse.
    fn unplace(&mut self, m: &Maps<'_>, placed: Option<Placed>, rows: Vec<(u32, u32)>, pages_written: Vec<u32>) {
        for p in pages_written {
            let _ = m.pages.update(&p.to_ne_bytes(), &0u64.to_ne_bytes(), MapFlags::ANY);
        }
        for (at, n) in rows {
            let (start, len) = self.free_rows.give(at, n);
            if len as usize == CHUNK_ROWS {
                self.drop_chunk(m, start >> CHUNK_SHIFT);
            }
        }
        if let Some(p) = placed {
            self.free_pages.give(p.first_page, p.n_pages);
        }
    }

    fn drop_chunk(&mut self, m: &Maps<'_>, idx: u32) {
        self.free_rows.remove(idx << CHUNK_SHIFT);
        let _ = m.chunks.delete(&idx.to_ne_bytes());
        if let Some(slot) = self.chunks.get_mut(idx as usize) {
            if slot.take().is_some() {
                self.stats.kernel_bytes -= (CHUNK_ROWS * 8) as u64;
                self.stats.chunks_dropped += 1;
            }
        }
    }

    /// The vDSO's table; the reference `table_of` takes is never dropped.
    fn vdso_table(&mut self, m: &Maps<'_>) -> Option<FileTable> {
        if self.vdso.is_none() {
            let t = crate::engine::stacks::own_vdso().and_then(|f| self.table_of(m, f).ok());
            self.vdso = Some(t);
        }
        self.vdso.clone().flatten()
    }

    /// The table of the file `pid` maps at `range`, with one more reference
    /// on it for the caller.
    fn file_table(&mut self, m: &Maps<'_>, pid: u32, range: &str) -> Option<(FileId, FileTable)> {
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
        if let Some((t, refs)) = self.by_file.get_mut(&id) {
            *refs += 1;
            return Some((id, t.clone()));
        }
        // A file without a usable table is remembered too (while mapped), so
        // a process that maps it is not read again at every refresh.
        let t = self.table_of(m, f).unwrap_or_else(|e| {
            *self.stats.without_table.entry(reason(&e)).or_default() += 1;
            FileTable { segments: Vec::new(), placed: None, key: None }
        });
        self.by_file.insert(id, (t.clone(), 1));
        Some((id, t))
    }

    /// Reads `f`, finds or builds its table and places it; the caller owns
    /// one reference on the table's key.
    fn table_of(&mut self, m: &Maps<'_>, f: File) -> Result<FileTable, UnwindError> {
        let info = elf::read_file(f)?;
        if Some(info.arch) != table::Arch::host() {
            return Err(UnwindError::NotElf(format!(
                "{} code on this {} host",
                info.arch.name(),
                std::env::consts::ARCH
            )));
        }
        let segments = info.segments.clone();
        if !info.has_unwind_info() {
            *self.stats.without_table.entry(reason(&UnwindError::NoUnwindInfo)).or_default() += 1;
            return Ok(FileTable { segments, placed: None, key: None });
        }
        let key = cache::key(&info);
        if let Some(l) = self.by_key.get_mut(&key) {
            l.files += 1;
            return Ok(FileTable { segments, placed: l.placed, key: Some(key) });
        }
        let cfi =
            info.eh_frame.as_ref().map_or(0, |s| s.data.len()) + info.debug_frame.as_ref().map_or(0, |s| s.data.len());
        let table = match self.cache.get(&key) {
            Some(mut t) => {
                self.stats.cache_hits += 1;
                t.arch = info.arch;
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
        let loaded = self.place(m, &table);
        if loaded.placed.is_some() {
            self.stats.executables += 1;
            self.stats.rows += table.rows.len() as u64;
            self.stats.cfi_bytes += cfi as u64;
        }
        let placed = loaded.placed;
        self.by_key.insert(key, loaded);
        Ok(FileTable { segments, placed, key: Some(key) })
    }

    /// Makes a chunk in the first free slot and gives its rows to the free list.
    fn new_chunk(&mut self, m: &Maps<'_>) -> Option<()> {
        let idx = match self.chunks.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.chunks.len() < MAX_CHUNKS => self.chunks.len(),
            None => return None,
        };
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
        let fd = map.as_fd().as_raw_fd() as u32;
        let chunk = Chunk { _map: map, rows: p.cast() };
        m.chunks.update(&(idx as u32).to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY).ok()?;
        if idx == self.chunks.len() {
            self.chunks.push(Some(chunk));
        } else {
            self.chunks[idx] = Some(chunk);
        }
        self.free_rows.give((idx << CHUNK_SHIFT) as u32, CHUNK_ROWS as u32);
        self.stats.kernel_bytes += (CHUNK_ROWS * 8) as u64;
        Some(())
    }

    /// Rows for `n` entries in one chunk: (global index of the first row).
    fn alloc_rows(&mut self, m: &Maps<'_>, n: usize) -> Option<u32> {
        if n > CHUNK_ROWS {
            return None;
        }
        if let Some(at) = self.free_rows.take(n as u32) {
            return Some(at);
        }
        self.new_chunk(m)?;
        self.free_rows.take(n as u32)
    }

    /// Lays `t` out in pages and rows. When the budget runs out, what was
    /// taken goes back and the result holds no placement.
    fn place(&mut self, m: &Maps<'_>, t: &Table) -> Loaded {
        let mut l = Loaded { placed: None, rows: Vec::new(), pages_written: Vec::new(), files: 1 };
        // The pages its span needs, before laying anything out: a crafted
        // table spanning 2^62 bytes must not allocate a page list for it.
        let Some(n_pages) = page_span(t).and_then(|n| u32::try_from(n).ok()) else { return l };
        let Some(pages) = layout(t) else { return l };
        let Some(lo_page) = pages.first().map(|p| p.0) else { return l };
        let Some(first_page) = self.free_pages.take(n_pages) else {
            self.stats.budget_full += 1;
            return l;
        };
        let mut ok = true;
        for (page, rows) in pages {
            if rows.is_empty() {
                continue;
            }
            let idx = first_page + (page - lo_page) as u32;
            let Some(at) = self.alloc_rows(m, rows.len()) else {
                self.stats.budget_full += 1;
                ok = false;
                break;
            };
            match l.rows.last_mut() {
                Some((a, n)) if *a + *n == at && (*a >> CHUNK_SHIFT) == (at >> CHUNK_SHIFT) => *n += rows.len() as u32,
                _ => l.rows.push((at, rows.len() as u32)),
            }
            let chunk = self.chunks[(at >> CHUNK_SHIFT) as usize].as_ref().expect("rows come from live chunks");
            let off = (at as usize) & (CHUNK_ROWS - 1);
            // SAFETY: alloc_rows keeps [off, off + len) inside the chunk's mapping.
            let dst = unsafe { std::slice::from_raw_parts_mut(chunk.rows.add(off), rows.len()) };
            dst.copy_from_slice(&rows);
            let val = (at as u64) | ((rows.len() as u64) << 32);
            if m.pages.update(&idx.to_ne_bytes(), &val.to_ne_bytes(), MapFlags::ANY).is_err() {
                ok = false;
                break;
            }
            l.pages_written.push(idx);
        }
        let placed = Placed { first_page, n_pages, lo_page };
        if ok {
            l.placed = Some(placed);
        } else {
            let (rows, written) = (std::mem::take(&mut l.rows), std::mem::take(&mut l.pages_written));
            self.unplace(m, Some(placed), rows, written);
        }
        l
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
    // A gap encodes alike on every architecture.
    let gap = table::Rule::GAP.encode(table::Arch::X86_64);
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
pub fn layout_lookup(pages: &[(u64, Vec<u64>)], vaddr: u64, arch: table::Arch) -> table::Rule {
    let Some(lo) = pages.first().map(|p| p.0) else { return table::Rule::GAP };
    let page = (vaddr >> PAGE_SHIFT).wrapping_sub(lo);
    let Some((_, rows)) = pages.get(page as usize) else { return table::Rule::GAP };
    let target = vaddr & 0xffff;
    let i = rows.partition_point(|r| r & 0xffff <= target);
    if i == 0 {
        return table::Rule::GAP;
    }
    table::Rule::decode(rows[i - 1], arch)
}

fn reason(e: &UnwindError) -> String {
    match e {
        UnwindError::NotElf(_) => "not ELF of this architecture",
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
    use crate::engine::unwind::table::{Arch, Cfa, Row, Rule, SavedRbp};

    #[test]
    fn page_layout_gives_the_table_rule_at_every_address() {
        let r = |n| Rule::new(Cfa::Rsp(n), SavedRbp::Same).encode(Arch::X86_64);
        let gap = Rule::GAP.encode(Arch::X86_64);
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
            assert_eq!(layout_lookup(&pages, a, t.arch), t.lookup(a), "at {a:#x}");
        }
    }

    #[test]
    fn a_table_spanning_the_address_space_is_refused_before_any_allocation() {
        let r = Rule::new(Cfa::Rsp(8), SavedRbp::Same).encode(Arch::X86_64);
        let t = Table {
            rows: vec![
                Row { addr: 0x1000, rule: r },
                Row { addr: 0x4000_0000_0000_0000, rule: r },
                Row { addr: 0x4000_0000_0000_0010, rule: Rule::GAP.encode(Arch::X86_64) },
            ],
            ..Default::default()
        };
        assert_eq!(page_span(&t), None);
        assert!(layout(&t).is_none());
        let top = Table {
            rows: vec![
                Row { addr: u64::MAX - 0x100, rule: r },
                Row { addr: u64::MAX, rule: Rule::GAP.encode(Arch::X86_64) },
            ],
            ..Default::default()
        };
        assert_eq!(page_span(&top), Some(1));
        assert_eq!(layout(&top).unwrap().len(), 1, "no overflow at the top page");
    }

    #[test]
    fn free_ranges_merge_but_never_across_a_chunk_seam() {
        let mut f = FreeList::new(4); // chunks of 16
        f.give(0, 16);
        f.give(16, 16);
        assert_eq!(f.free.len(), 2, "the seam at 16 keeps two ranges: {:?}", f.free);
        let a = f.take(10).unwrap();
        let b = f.take(6).unwrap();
        let c = f.take(7).unwrap();
        assert_eq!((a, b, c), (0, 10, 16));
        assert_eq!(f.take(10), None, "9 left, in one range");
        // Given back out of order, they join into the whole chunk again.
        assert_eq!(f.give(10, 6), (10, 6));
        assert_eq!(f.give(0, 10), (0, 16));
        assert_eq!(f.give(16, 7), (16, 16));
        assert_eq!(f.free_total(), 32);
        let mut pages = FreeList::new(32);
        pages.give(0, 100);
        let x = pages.take(60).unwrap();
        let y = pages.take(40).unwrap();
        assert_eq!(pages.take(1), None);
        pages.give(x, 60);
        assert_eq!(pages.take(61), None);
        assert_eq!(pages.give(y, 40), (0, 100), "page ranges have no seam");
    }

    /// Kernel maps shaped as `unwind.h`'s, made by hand.
    fn maps(pages_cap: u32) -> (MapHandle, MapHandle, MapHandle) {
        use std::os::fd::AsRawFd;
        let o = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        };
        let procs = MapHandle::create(MapType::Hash, Some("t_procs"), 4, PROC_BYTES as u32, 64, &o).unwrap();
        let pages = MapHandle::create(MapType::Array, Some("t_pages"), 4, 8, pages_cap, &o).unwrap();
        let inner_o = libbpf_sys::bpf_map_create_opts { map_flags: libbpf_sys::BPF_F_MMAPABLE, ..o };
        let inner = MapHandle::create(MapType::Array, Some("t_inner"), 4, 8, CHUNK_ROWS as u32, &inner_o).unwrap();
        let outer_o = libbpf_sys::bpf_map_create_opts { inner_map_fd: inner.as_fd().as_raw_fd() as u32, ..o };
        let chunks =
            MapHandle::create(MapType::ArrayOfMaps, Some("t_chunks"), 4, 4, MAX_CHUNKS as u32, &outer_o).unwrap();
        (procs, pages, chunks)
    }

    fn bpf_map_fds() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy() == "anon_inode:bpf-map")
            .count()
    }

    fn nonzero_pages(pages: &MapHandle) -> usize {
        (0..pages.max_entries())
            .filter(|i| pages.lookup(&i.to_ne_bytes(), MapFlags::ANY).unwrap().unwrap() != [0u8; 8])
            .count()
    }

    #[test]
    fn tables_are_unloaded_when_no_process_maps_them_and_empty_chunks_dropped() {
        use std::process::{Child, Command, Stdio};
        let (procs, pages, chunks) = maps(1 << 16);
        let m = Maps { procs: &procs, pages: &pages, chunks: &chunks };
        let spawn = |cmd: &[&str]| -> Child {
            let c = Command::new(cmd[0]).args(&cmd[1..]).stdout(Stdio::null()).spawn().unwrap();
            // Until exec has replaced the fork's maps and the dynamic
            // loader has mapped libc (a busy host can take its time).
            let exe = std::fs::canonicalize(cmd[0]).unwrap();
            let t0 = Instant::now();
            let ready = || {
                std::fs::read_link(format!("/proc/{}/exe", c.id())).ok().as_ref() == Some(&exe)
                    && std::fs::read_to_string(format!("/proc/{}/maps", c.id())).is_ok_and(|m| m.contains("/libc.so"))
            };
            while !ready() {
                assert!(t0.elapsed() < Duration::from_secs(30), "{cmd:?} did not start");
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(50));
            c
        };
        let end = |mut c: Child| {
            c.kill().unwrap();
            c.wait().unwrap();
        };
        let base_fds = bpf_map_fds();
        let mut t = Tables::new(pages.max_entries());
        // The vDSO's table is loaded with the first process and kept.
        let perl = spawn(&["/usr/bin/perl", "-e", "sleep 60"]);
        assert!(t.load_process(&m, &Process::read(perl.id()).unwrap(), false, 0));
        let with_perl = (t.by_key.len(), t.chunks.iter().flatten().count(), nonzero_pages(&pages));
        assert!(with_perl.0 >= 3, "perl, libc, vdso and more: {with_perl:?}");
        let sleep_a = spawn(&["/usr/bin/sleep", "60"]);
        let sleep_b = spawn(&["/usr/bin/sleep", "60"]);
        assert!(t.load_process(&m, &Process::read(sleep_a.id()).unwrap(), false, 0));
        let with_sleep = t.by_key.len();
        assert_eq!(with_sleep, with_perl.0 + 1, "sleep adds only its own table (libc is shared)");
        assert!(t.load_process(&m, &Process::read(sleep_b.id()).unwrap(), false, 0));
        assert_eq!(t.by_key.len(), with_sleep, "a second sleep shares every table");
        let rows_all = t.free_rows.free_total();

        end(sleep_a);
        t.forget_gone(&m);
        assert_eq!(t.by_key.len(), with_sleep, "sleep B still maps sleep");
        assert_eq!(t.stats.unloaded, 0);
        end(sleep_b);
        t.forget_gone(&m);
        assert_eq!(t.by_key.len(), with_perl.0, "sleep's table went with the last sleep");
        assert_eq!(t.stats.unloaded, 1);
        assert_eq!(nonzero_pages(&pages), with_perl.2, "its pages are zeroed");
        assert!(t.free_rows.free_total() > rows_all, "its rows are free again");

        // A new process reuses the freed rows and pages: no chunk is added.
        let chunks_before = t.chunks.iter().flatten().count();
        let sleep_c = spawn(&["/usr/bin/sleep", "60"]);
        assert!(t.load_process(&m, &Process::read(sleep_c.id()).unwrap(), false, 0));
        assert_eq!(t.chunks.iter().flatten().count(), chunks_before);
        end(sleep_c);
        end(perl);
        t.forget_gone(&m);
        // Only the vDSO is left: at most one chunk, its pages only.
        assert_eq!(t.by_key.len(), 1, "the vDSO's table stays");
        assert!(t.chunks.iter().flatten().count() <= 1);
        assert_eq!(t.by_file.len(), 0, "no mapped file is remembered");
        let live = t.chunks.iter().flatten().count();
        assert_eq!(t.stats.kernel_bytes, (live * CHUNK_ROWS * 8) as u64);
        assert_eq!(bpf_map_fds(), base_fds + live, "dropped chunks closed their maps");
        let vdso_pages = nonzero_pages(&pages);
        assert!(vdso_pages >= 1 && vdso_pages < with_perl.2);
        let vdso_span: u64 = t.by_key.values().filter_map(|l| l.placed).map(|p| p.n_pages as u64).sum();
        assert_eq!(
            t.free_pages.free_total() + vdso_span,
            pages.max_entries() as u64,
            "every page is free or the vDSO's"
        );

        // A table of 300,000 rows takes more chunks; unloaded, they are
        // dropped and their maps closed.
        let r = |n| Rule::new(Cfa::Rsp(n), SavedRbp::Same).encode(Arch::X86_64);
        let mut rows: Vec<Row> =
            (0..300_000u64).map(|i| Row { addr: 0x4000_0000 + i * 16, rule: r(8 + (i % 2) as i32 * 8) }).collect();
        rows.push(Row { addr: 0x4000_0000 + 300_000 * 16, rule: Rule::GAP.encode(Arch::X86_64) });
        let big = Table { rows, ..Default::default() };
        let l = t.place(&m, &big);
        assert!(l.placed.is_some() && l.rows.len() >= 3, "{:?}", l.rows);
        let key = [7u8; 32];
        t.by_key.insert(key, l);
        // 300,000 rows need 2 chunks beside what the first one has free.
        let added = t.chunks.iter().flatten().count() - live;
        assert!(added >= 2, "{added}");
        assert_eq!(bpf_map_fds(), base_fds + live + added);
        t.unref_key(&m, &key);
        assert_eq!(t.chunks.iter().flatten().count(), live);
        assert_eq!(t.stats.chunks_dropped, added as u64);
        assert_eq!(bpf_map_fds(), base_fds + live);
        assert_eq!(nonzero_pages(&pages), vdso_pages);
        assert_eq!(t.free_pages.free_total() + vdso_span, pages.max_entries() as u64);
    }

    #[test]
    fn libc_pages_agree_with_the_table() {
        let info = elf::read(File::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap()).unwrap();
        let t = table::build(&info).unwrap();
        let pages = layout(&t).unwrap();
        let (lo, hi) = (t.rows[0].addr, t.rows.last().unwrap().addr);
        for a in lo - 16..hi + 16 {
            assert_eq!(layout_lookup(&pages, a, t.arch), t.lookup(a), "at {a:#x}");
        }
        let n: usize = pages.iter().map(|p| p.1.len()).sum();
        // One repeated row per page at most.
        assert!(n <= t.rows.len() + pages.len(), "{n} rows in pages for {} in the table", t.rows.len());
        assert!(pages.iter().all(|p| p.1.len() <= 1 << 16));
    }
}
