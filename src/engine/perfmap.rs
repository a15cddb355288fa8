//! A traced process's perf map and jitdump, read as hostile input.
//!
//! JITs name their code in `/tmp/perf-PID.map` (perf's JIT interface:
//! `START SIZE name` per line, START and SIZE in hex, PID as the process
//! sees it), or in a jitdump file (`jit-PID.dump`, perf's binary format:
//! a header, then records, of which code loads give an address, a size and
//! a name), which the process maps so that perf sees it (Python 3.13's
//! `-X perf_jit`, Node's `--perf-prof`, JVM agents). The process writes
//! those files and sonde, as root, reads them, so the process decides what
//! sonde opens and reads. Here:
//! - the map is opened inside the process's root ([`super::procroot`]:
//!   `..` and absolute symlinks on the way stay inside it), the map itself
//!   must not be a symlink, and a FIFO cannot block the open; a jitdump is
//!   opened as the process maps it (`/proc/PID/map_files`), no path
//!   followed;
//! - it must be a regular file owned by one of the process's uids (real,
//!   effective, saved or filesystem, from `/proc/PID/status`), so a process
//!   cannot hand sonde a file of another user through a hard link; a root
//!   process's maps are root's;
//! - at most [`MAX_BYTES`] and [`MAX_LINES`] are read, lines over
//!   [`MAX_LINE_BYTES`] are skipped without being held, and a name must be
//!   printable UTF-8 (no control or bidirectional-override characters), so
//!   nothing the process wrote can drive a terminal or an SVG;
//! - every refusal, cut and skipped line is counted ([`Note`], [`Tally`]).
use std::{
    fmt,
    fs::File,
    io::{BufRead, BufReader, Read},
    os::unix::fs::MetadataExt,
    path::Path,
};

use thiserror::Error;

use super::procroot::{LastSymlink, OpenError, Root};

/// Most bytes read of one perf map (64 MiB: a JIT's map with a million
/// symbols of 60 characters is about that size); the rest is ignored.
pub const MAX_BYTES: u64 = 64 << 20;
/// Most lines read of one perf map; the rest is ignored.
pub const MAX_LINES: u64 = 1_000_000;
/// Longest line kept (4 KiB, far above any real symbol name); longer lines
/// are skipped.
pub const MAX_LINE_BYTES: usize = 4096;

/// Bounds on what is read of one map ([`MAX_BYTES`], [`MAX_LINES`],
/// [`MAX_LINE_BYTES`] unless a test sets smaller ones).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes read at most.
    pub bytes: u64,
    /// Lines read at most (kept or skipped).
    pub lines: u64,
    /// Longest line kept, without its newline.
    pub line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { bytes: MAX_BYTES, lines: MAX_LINES, line_bytes: MAX_LINE_BYTES }
    }
}

/// A range of JIT code and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitSymbol {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// The name, printable UTF-8.
    pub name: String,
}

/// Why the rest of a map was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// The byte bound was reached (its value).
    Bytes(u64),
    /// The line bound was reached (its value).
    Lines(u64),
    /// Reading failed part way.
    ReadError(String),
}

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cut::Bytes(n) if n % (1 << 20) == 0 => write!(f, "cut at {} MiB", n >> 20),
            Cut::Bytes(n) => write!(f, "cut at {n} bytes"),
            Cut::Lines(n) => write!(f, "cut at {n} lines"),
            Cut::ReadError(e) => write!(f, "cut by a read error ({e})"),
        }
    }
}

/// What was read of a map.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PerfMap {
    /// Named ranges, sorted by start.
    pub symbols: Vec<JitSymbol>,
    /// Lines read but not kept: not `START SIZE name` in hex, a range past
    /// the end of the address space, over the line bound, or a name that is
    /// not printable UTF-8.
    pub skipped: u64,
    /// Why reading stopped before the end of the file, if it did.
    pub cut: Option<Cut>,
    /// Bytes read through the last whole line (newline included).
    pub whole: u64,
    /// Bytes read in all (an unfinished last line's too).
    pub read: u64,
    /// Lines read through it (kept or skipped).
    pub lines: u64,
    /// The symbol read from a last line with no newline (the writer may be
    /// half way through it), if one was kept.
    pub unfinished: Option<JitSymbol>,
}

/// A file's device and inode.
type FileId = (u64, u64);

/// Where reading one process's map stopped, to go on from there while the
/// process writes more (JITs append to their maps as they compile).
#[derive(Debug, Clone)]
pub struct Cursor {
    /// The file read: another file at the path is not the one read on from.
    file: FileId,
    /// Its path inside the process's root.
    path: String,
    /// Bytes and lines read through the last whole line.
    whole: u64,
    lines: u64,
    /// Bytes read in all: past `whole`, an unfinished line's.
    read: u64,
    /// A bound was reached, or reading failed: nothing more is read.
    done: bool,
    /// A symbol read from an unfinished line (read again when whole).
    unfinished: Option<JitSymbol>,
}

impl Cursor {
    /// The map's path inside the process's root.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The unfinished line is already over the line bound: reading goes on
    /// from `read` (it is skipped), not from its start again.
    fn over(&self) -> bool {
        self.read - self.whole > MAX_LINE_BYTES as u64
    }
}

/// Why a map was not read at all.
#[derive(Debug, Error)]
pub enum Refusal {
    /// It could not be opened safely (a symlink, not a regular file, no
    /// `openat2`, ...).
    #[error("{0}")]
    Open(#[from] OpenError),
    /// Owned by a uid that is none of the process's.
    #[error("owned by uid {owner}, not by the process's uid {uid}")]
    Owner {
        /// The file's owner.
        owner: u32,
        /// The process's real uid.
        uid: u32,
    },
    /// Last written before the process started: an earlier process's, of
    /// the same pid (its names would be wrong).
    #[error(
        "last written {secs:.1} s before the process started, by an earlier process of that pid (read once the process writes it)"
    )]
    Stale {
        /// How long before the start.
        secs: f64,
        /// What the file held then.
        earlier: Earlier,
    },
}

/// A map refused as an earlier process's, as it was then: should the new
/// process append to it (CPython opens its map with `O_APPEND`), the
/// earlier lines are not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Earlier {
    file: FileId,
    len: u64,
    /// A hash of its first [`EARLIER_HEAD`] bytes: the same file at least as
    /// long with the same head was appended to, not written over.
    head: u64,
}

/// Bytes of an earlier process's map compared to tell an append from a
/// rewrite.
const EARLIER_HEAD: u64 = 64 << 10;

/// The hash of the first `n` bytes of `f` (None when they cannot be read).
fn head_hash(f: &File, n: u64) -> Option<u64> {
    use std::hash::Hasher;
    use std::io::{Seek, SeekFrom};
    let mut r = f;
    r.seek(SeekFrom::Start(0)).ok()?;
    let mut buf = Vec::with_capacity(n as usize);
    r.take(n).read_to_end(&mut buf).ok()?;
    if buf.len() as u64 != n {
        return None;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(&buf);
    Some(h.finish())
}

/// What came of one process's perf map: the summary's figures and the
/// warning line.
#[derive(Debug, Default, Clone)]
pub struct Note {
    /// Which files named its JIT code: (what, symbols), e.g.
    /// ("/tmp/perf-42.map", 1200) or ("jitdump /tmp/jit-42.dump", 30).
    pub sources: Vec<(String, usize)>,
    /// Why the map was refused, if it was.
    pub refused: Option<String>,
    /// Refused as an earlier process's (older than the process), as it was
    /// then: looked at again, as the process may write its own there.
    pub stale: Option<Earlier>,
    /// Why reading stopped early, if it did.
    pub cut: Option<Cut>,
    /// Lines skipped.
    pub skipped: u64,
}

impl Note {
    /// Adds what came of another file of the same process.
    pub fn absorb(&mut self, other: Note) {
        self.sources.extend(other.sources);
        if self.refused.is_none() {
            self.stale = other.stale;
        }
        self.refused = self.refused.take().or(other.refused);
        self.cut = self.cut.take().or(other.cut);
        self.skipped += other.skipped;
    }

    /// The one-line warning for process `pid` (None when all was well).
    pub fn warning(&self, pid: u32) -> Option<String> {
        if let Some(why) = &self.refused {
            if self.stale.is_some() {
                return Some(format!("sonde: perf map of pid {pid} refused: {why}"));
            }
            return Some(format!(
                "sonde: perf map of pid {pid} refused: {why} (perf maps must be regular files owned by the process)"
            ));
        }
        let mut parts = Vec::new();
        if let Some(c) = &self.cut {
            parts.push(format!("{c} (the rest is ignored)"));
        }
        if self.skipped > 0 {
            parts.push(format!(
                "{} line{} skipped (not `START SIZE name` in hex, over {} KiB, or a name that is not printable UTF-8)",
                self.skipped,
                if self.skipped == 1 { "" } else { "s" },
                MAX_LINE_BYTES / 1024
            ));
        }
        (!parts.is_empty()).then(|| format!("sonde: perf map of pid {pid}: {}", parts.join("; ")))
    }
}

/// The perf maps of a run, for the summary.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// Per process whose JIT code a perf map or jitdump named: pid and
    /// what named it (file, symbols).
    #[serde(rename = "jit_named_by", skip_serializing_if = "Vec::is_empty")]
    pub named_by: Vec<(u32, String)>,
    /// Maps not read at all.
    #[serde(rename = "perf_maps_refused")]
    pub refused: u64,
    /// Maps read only up to a bound (or a read error).
    #[serde(rename = "perf_maps_cut")]
    pub cut: u64,
    /// Lines of maps skipped.
    #[serde(rename = "perf_map_lines_skipped")]
    pub lines_skipped: u64,
}

impl Tally {
    /// Counts one process's map.
    pub fn add(&mut self, pid: u32, n: &Note) {
        for (what, syms) in &n.sources {
            self.named_by.push((pid, format!("{what}, {syms} symbols")));
        }
        self.refused += u64::from(n.refused.is_some());
        self.cut += u64::from(n.cut.is_some());
        self.lines_skipped += n.skipped;
    }

    /// The summary's text line, when there is anything to say.
    pub fn text(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.named_by.is_empty() {
            let by: Vec<String> = self.named_by.iter().map(|(p, w)| format!("{p} by {w}")).collect();
            parts.push(format!("JIT code named by the process's own files: {}", by.join("; ")));
        }
        if self.refused + self.cut + self.lines_skipped > 0 {
            parts.push(format!(
                "perf maps: {} refused, {} cut short, {} lines skipped (see the warnings above)",
                self.refused, self.cut, self.lines_skipped
            ));
        }
        (!parts.is_empty()).then(|| parts.join("\n"))
    }
}

/// The perf map and jitdump of process `pid` (none when it has none), what
/// came of them, and where reading the map stopped.
/// `earlier`: the map as it was when refused as an earlier process's, if
/// it was (see [`Note::stale`]).
pub fn load(pid: u32, earlier: Option<Earlier>) -> (Vec<JitSymbol>, Note, Option<Cursor>) {
    let (mut syms, mut note, cursor) = load_map(pid, earlier);
    // A jitdump the process maps: its code loads, where the map has none.
    if let Some((path, d)) = read_jitdump(pid, &Limits::default()) {
        let sources = if d.symbols.is_empty() { vec![] } else { vec![(format!("jitdump {path}"), d.symbols.len())] };
        note.absorb(Note { sources, cut: d.cut, skipped: d.skipped, ..Note::default() });
        let known = syms.len();
        syms.extend(d.symbols);
        if known > 0 {
            syms.sort_by_key(|s| s.start);
        }
    }
    (syms, note, cursor)
}

/// The perf map of process `pid` alone (none when it has none), what came
/// of it, and where reading stopped; `earlier` as for [`load`].
pub fn load_map(pid: u32, earlier: Option<Earlier>) -> (Vec<JitSymbol>, Note, Option<Cursor>) {
    match read(pid, &Limits::default(), earlier) {
        Ok(None) => (Vec::new(), Note::default(), None),
        Ok(Some((path, file, m))) => {
            let sources = if m.symbols.is_empty() { vec![] } else { vec![(path.clone(), m.symbols.len())] };
            let cursor = Cursor {
                file,
                path,
                whole: m.whole,
                lines: m.lines,
                read: m.read,
                done: m.cut.is_some(),
                unfinished: m.unfinished,
            };
            (m.symbols, Note { sources, cut: m.cut.clone(), skipped: m.skipped, ..Note::default() }, Some(cursor))
        }
        Err(r) => {
            let stale = match r {
                Refusal::Stale { earlier, .. } => Some(earlier),
                _ => None,
            };
            (Vec::new(), Note { refused: Some(r.to_string()), stale, ..Note::default() }, None)
        }
    }
}

/// What process `pid` added to its map since `cur` (advanced past it): the
/// new lines' symbols, sorted, the symbol read earlier from an unfinished
/// line (now read again whole or skipped, so to be dropped), and what came
/// of them. None when nothing was added, the process is gone, or the path
/// holds another file now. Each byte is read once, but for an unfinished
/// line within the line bound (read again when whole), and the bounds
/// count from the map's start: a map growing without end costs no more
/// than one read of [`MAX_BYTES`]. A map that shrank is not read on (its
/// lines would be read from the middle).
pub fn read_more(pid: u32, cur: &mut Cursor) -> Option<(PerfMap, Option<JitSymbol>)> {
    let limits = Limits::default();
    if cur.done {
        return None;
    }
    let st = Status::read(pid)?;
    // Accepted when first read: not judged by its age again.
    let (mut f, md) = open_map(pid, &st, &cur.path, false).ok()??;
    if file_id(&md) != cur.file {
        return None;
    }
    if md.len() < cur.read {
        cur.done = true;
        return None;
    }
    if md.len() == cur.read {
        return None;
    }
    use std::io::{Seek, SeekFrom};
    let mut m = PerfMap::default();
    if cur.over() {
        // The rest of a line over the bound: stepped over, never held.
        f.seek(SeekFrom::Start(cur.read)).ok()?;
        let mut r = BufReader::with_capacity(64 << 10, (&f).take(limits.bytes - cur.read));
        let (n, whole) = skip_line(&mut r).unwrap_or((0, false));
        cur.read += n;
        if !whole {
            if cur.read >= limits.bytes && md.len() > limits.bytes {
                // Cut at the bound in that line: counted once, here.
                (cur.done, m.skipped, m.cut) = (true, 1, Some(Cut::Bytes(limits.bytes)));
                return Some((m, cur.unfinished.take()));
            }
            return None;
        }
        (cur.whole, cur.lines, m.skipped) = (cur.read, cur.lines + 1, 1);
    }
    f.seek(SeekFrom::Start(cur.whole)).ok()?;
    // The file itself (not a bounded reader of it): parse looks past its
    // bound to tell a cut from the end.
    let rest = Limits { bytes: limits.bytes - cur.whole, lines: limits.lines.saturating_sub(cur.lines), ..limits };
    let more = parse(&f, &rest);
    m.skipped += more.skipped;
    m.symbols = more.symbols;
    m.cut = match more.cut {
        // The bounds on the whole map.
        Some(Cut::Bytes(_)) => Some(Cut::Bytes(limits.bytes)),
        Some(Cut::Lines(_)) => Some(Cut::Lines(limits.lines)),
        c => c,
    };
    cur.done = m.cut.is_some();
    cur.read = cur.read.max(cur.whole + more.read);
    if more.whole == 0 && m.skipped == 0 && m.cut.is_none() {
        // No whole line yet (an unfinished one is read when whole).
        return None;
    }
    // A line read before while unfinished is whole now (or was skipped).
    let redone = std::mem::replace(&mut cur.unfinished, more.unfinished.clone());
    cur.whole += more.whole;
    cur.lines += more.lines;
    (m.whole, m.read, m.lines, m.unfinished) = (more.whole, more.read, more.lines, more.unfinished);
    Some((m, redone))
}

/// Consumes `r` through its next newline: the bytes consumed and whether
/// the newline was among them (else `r` ended first).
fn skip_line(r: &mut impl BufRead) -> Option<(u64, bool)> {
    let mut n = 0u64;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        if buf.is_empty() {
            return Some((n, false));
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                r.consume(i + 1);
                return Some((n + i as u64 + 1, true));
            }
            None => {
                let len = buf.len();
                r.consume(len);
                n += len as u64;
            }
        }
    }
}

/// jitdump's magic, as the writing process's byte order has it.
const JITDUMP_MAGIC: u32 = 0x4A69_5444;
/// Bytes of a jitdump record's header (id, total size, timestamp).
const JITDUMP_RECORD: usize = 16;

/// The jitdump file process `pid` maps (`jit-N.dump`), read within
/// `limits`: its path as the process sees it and its code loads.
fn read_jitdump(pid: u32, limits: &Limits) -> Option<(String, PerfMap)> {
    let st = Status::read(pid)?;
    let maps = super::process::map_lines(pid)?;
    let m = maps.iter().find(|m| {
        let b = m.base();
        b.starts_with("jit-") && b.ends_with(".dump")
    })?;
    let f = m.open(pid)?;
    if check_owner(&f, &st.uids).is_err() {
        return Some((m.path.clone(), PerfMap { skipped: 1, ..PerfMap::default() }));
    }
    Some((m.path.clone(), parse_jitdump(f, limits)))
}

/// Parses a jitdump from `r`: code loads (record 0: pid, tid, vma, code
/// address, size, index, name, code) become symbols, code moves (1) move
/// them; other records are stepped over by their size. A record that does
/// not fit, or a name that is not printable, is skipped and counted; at
/// most `limits.bytes` are read, and code bytes are never held.
pub fn parse_jitdump(r: impl Read, limits: &Limits) -> PerfMap {
    let mut out = PerfMap::default();
    let mut rd = BufReader::with_capacity(64 << 10, r.take(limits.bytes));
    let mut head = [0u8; 40];
    if rd.read_exact(&mut head).is_err() {
        out.skipped = 1;
        return out;
    }
    let u32_at = |b: &[u8], o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
    if u32_at(&head, 0) != JITDUMP_MAGIC {
        out.skipped = 1;
        return out;
    }
    // The header may be longer than the 40 bytes known.
    let hsize = u32_at(&head, 8) as u64;
    if hsize > 40 && std::io::copy(&mut (&mut rd).take(hsize - 40), &mut std::io::sink()).is_err() {
        return out;
    }
    let mut by_addr: std::collections::BTreeMap<u64, JitSymbol> = std::collections::BTreeMap::new();
    let mut records = 0u64;
    loop {
        if records == limits.lines {
            out.cut = Some(Cut::Lines(limits.lines));
            break;
        }
        let mut rh = [0u8; JITDUMP_RECORD];
        match rd.read_exact(&mut rh) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => {
                out.cut = Some(Cut::ReadError(e.to_string()));
                break;
            }
        }
        records += 1;
        let (id, size) = (u32_at(&rh, 0), u32_at(&rh, 4) as usize);
        if size < JITDUMP_RECORD {
            out.skipped += 1;
            break; // no way to the next record
        }
        let body_len = size - JITDUMP_RECORD;
        // Code loads and moves: their fixed part (and a load's name) only.
        let fixed = match id {
            0 => 40,
            1 => 48,
            _ => 0,
        };
        if fixed == 0 || body_len < fixed {
            if std::io::copy(&mut (&mut rd).take(body_len as u64), &mut std::io::sink()).ok() != Some(body_len as u64) {
                break;
            }
            if fixed != 0 {
                out.skipped += 1;
            }
            continue;
        }
        let keep = if id == 0 { body_len.min(fixed + limits.line_bytes + 1) } else { fixed };
        let mut body = vec![0u8; keep];
        if rd.read_exact(&mut body).is_err()
            || std::io::copy(&mut (&mut rd).take((body_len - keep) as u64), &mut std::io::sink()).ok()
                != Some((body_len - keep) as u64)
        {
            break;
        }
        if id == 0 {
            let (addr, len) = (u64_at(&body, 16), u64_at(&body, 24));
            let name = &body[fixed..];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            match std::str::from_utf8(name).ok().filter(|n| !n.is_empty() && printable(n)) {
                Some(n) if addr.checked_add(len).is_some() && len > 0 => {
                    by_addr.insert(addr, JitSymbol { start: addr, end: addr + len, name: n.to_string() });
                }
                _ => out.skipped += 1,
            }
        } else {
            let (old, new, len) = (u64_at(&body, 16), u64_at(&body, 24), u64_at(&body, 32));
            match (by_addr.remove(&old), new.checked_add(len)) {
                (Some(s), Some(end)) => {
                    by_addr.insert(new, JitSymbol { start: new, end, name: s.name });
                }
                _ => out.skipped += 1,
            }
        }
    }
    // Stopped at the byte bound with more behind it: cut.
    if out.cut.is_none() && rd.buffer().is_empty() {
        let take = rd.get_mut();
        if take.limit() == 0 && take.get_mut().read(&mut [0u8]).is_ok_and(|n| n > 0) {
            out.cut = Some(Cut::Bytes(limits.bytes));
        }
    }
    out.symbols = by_addr.into_values().collect();
    out
}

/// What of `/proc/PID/status` the map needs: the pid the process sees (last
/// `NSpid` field) and its four uids (`Uid:` real, effective, saved, fs).
struct Status {
    inner_pid: u32,
    uids: Vec<u32>,
}

impl Status {
    fn read(pid: u32) -> Option<Status> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| s.lines().find_map(|l| l.strip_prefix(name)).map(str::split_whitespace);
        let inner_pid = field("NSpid:").and_then(|f| f.last()?.parse().ok()).unwrap_or(pid);
        let uids: Vec<u32> = field("Uid:")?.filter_map(|u| u.parse().ok()).collect();
        (!uids.is_empty()).then_some(Status { inner_pid, uids })
    }
}

/// Reads process `pid`'s map within `limits`: None when it has none (or
/// has exited).
fn read(pid: u32, limits: &Limits, earlier: Option<Earlier>) -> Result<Option<(String, FileId, PerfMap)>, Refusal> {
    let Some(st) = Status::read(pid) else { return Ok(None) };
    let path = format!("/tmp/perf-{}.map", st.inner_pid);
    let Some((f, md)) = open_map(pid, &st, &path, true)? else { return Ok(None) };
    let id = file_id(&md);
    // An earlier process's map this one appended to: read from where that
    // one's ended (the same file, at least as long, with the same head).
    let from = earlier
        .filter(|e| e.file == id && md.len() >= e.len && head_hash(&f, e.len.min(EARLIER_HEAD)) == Some(e.head))
        .map_or(0, |e| e.len);
    // From there (the head's hash moved the file's offset).
    use std::io::{Seek, SeekFrom};
    (&f).seek(SeekFrom::Start(from)).map_err(|e| Refusal::Open(OpenError::Io(e)))?;
    let mut m = parse(f, &Limits { bytes: limits.bytes.saturating_sub(from), ..*limits });
    (m.whole, m.read) = (m.whole + from, m.read + from);
    if let Some(Cut::Bytes(_)) = m.cut {
        // The bound on the whole map.
        m.cut = Some(Cut::Bytes(limits.bytes));
    }
    Ok(Some((path, id, m)))
}

/// Opens `path` inside process `pid`'s root as a map is read: not through
/// a symlink, and a regular file owned by one of the process's uids (`st`);
/// with its metadata; with `check_age`, not last written before the process
/// started. None when the process or the file is gone.
fn open_map(pid: u32, st: &Status, path: &str, check_age: bool) -> Result<Option<(File, std::fs::Metadata)>, Refusal> {
    let Ok(root) = Root::of_process(pid) else { return Ok(None) };
    let f = match root.open(Path::new(path), LastSymlink::Refuse) {
        Ok(f) => f,
        Err(OpenError::Missing) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    check_owner(&f, &st.uids)?;
    let md = f.metadata().map_err(|e| Refusal::Open(OpenError::Io(e)))?;
    if let Some(secs) = check_age.then(|| written_before_start(&md, pid)).flatten() {
        let len = md.len();
        let head = head_hash(&f, len.min(EARLIER_HEAD)).unwrap_or(0);
        return Err(Refusal::Stale { secs, earlier: Earlier { file: file_id(&md), len, head } });
    }
    Ok(Some((f, md)))
}

/// When process `pid` started, on the wall clock: its start in clock ticks
/// after boot (stat's field 22), placed by the boot clock's distance from
/// the wall clock now (exact to a tick, 10 ms, as long as the wall clock is
/// not stepped meanwhile).
fn started(pid: u32) -> Option<std::time::SystemTime> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state is field 3.
    let ticks: u64 = st.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&h| h > 0)?;
    let since_boot = std::time::Duration::from_nanos(ticks.checked_mul(1_000_000_000)? / hz);
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let boot_now = std::time::Duration::new(ts.tv_sec.try_into().ok()?, ts.tv_nsec.try_into().ok()?);
    std::time::SystemTime::now().checked_sub(boot_now.checked_sub(since_boot)?)
}

/// How long before process `pid` started its map was last written, when
/// that is more than [`AGE_SLACK`]; None when it was written since, or
/// either is unknown.
fn written_before_start(md: &std::fs::Metadata, pid: u32) -> Option<f64> {
    let before = started(pid)?.duration_since(md.modified().ok()?).ok()?;
    (before > AGE_SLACK).then_some(before.as_secs_f64())
}

/// How much earlier than its process's start a map may seem written and
/// still be taken for its own: the start's ticks, file systems that keep
/// whole seconds (ext4 with small inodes), a small clock step. A pid comes
/// round again far later. A wall clock stepped forward further after the
/// map was last written makes it seem older: refused (and said), never
/// read for wrong names.
const AGE_SLACK: std::time::Duration = std::time::Duration::from_secs(2);

/// A file's device and inode.
fn file_id(md: &std::fs::Metadata) -> FileId {
    (md.dev(), md.ino())
}

fn check_owner(f: &File, uids: &[u32]) -> Result<(), Refusal> {
    let owner = f.metadata().map_err(|e| Refusal::Open(OpenError::Io(e)))?.uid();
    if uids.contains(&owner) {
        Ok(())
    } else {
        Err(Refusal::Owner { owner, uid: uids[0] })
    }
}

/// Parses a map from `r`, reading no more than `limits` allow and never
/// holding more than one line of `limits.line_bytes`.
pub fn parse(r: impl Read, limits: &Limits) -> PerfMap {
    let mut out = PerfMap::default();
    let mut rd = BufReader::with_capacity(64 << 10, r.take(limits.bytes));
    let mut line: Vec<u8> = Vec::new();
    // The line under way is over the bound: its bytes are dropped as read.
    let mut overlong = false;
    let mut lines = 0u64;
    // Bytes of the line under way read so far.
    let mut pending = 0u64;
    loop {
        let buf = match rd.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.cut = Some(Cut::ReadError(e.to_string()));
                break;
            }
        };
        if buf.is_empty() {
            // The end of the file, or of what the byte bound lets through.
            let take = rd.get_mut();
            let bound = take.limit() == 0 && take.get_mut().read(&mut [0u8]).is_ok_and(|n| n > 0);
            if bound {
                out.cut = Some(Cut::Bytes(limits.bytes));
            }
            if !line.is_empty() || overlong {
                if bound {
                    // Cut in the middle: not a whole line.
                    overlong = true;
                }
                if bound {
                    finish(&mut line, &mut overlong, &mut out);
                } else if let Some(sym) = (!overlong).then(|| parse_line(&line)).flatten() {
                    // A last line with no newline: the writer may be half
                    // way through it. Kept if it reads as a symbol, to be
                    // read again whole; not counted as skipped if not (nor
                    // when over the bound: counted once it ends).
                    out.unfinished = Some(sym.clone());
                    out.symbols.push(sym);
                }
            }
            break;
        }
        if lines == limits.lines {
            out.cut = Some(Cut::Lines(limits.lines));
            break;
        }
        let (chunk, newline) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        if !overlong && line.len() + chunk.len() <= limits.line_bytes {
            line.extend_from_slice(chunk);
        } else {
            overlong = true;
            line.clear();
        }
        let used = chunk.len() + usize::from(newline);
        rd.consume(used);
        pending += used as u64;
        if newline {
            lines += 1;
            out.whole += pending;
            pending = 0;
            finish(&mut line, &mut overlong, &mut out);
        }
    }
    out.lines = lines;
    out.read = out.whole + pending;
    out.symbols.sort_by_key(|s| s.start);
    out
}

/// Ends the line under way: kept, or skipped when over the bound or bad.
fn finish(line: &mut Vec<u8>, overlong: &mut bool, out: &mut PerfMap) {
    match (!*overlong).then(|| parse_line(line)).flatten() {
        Some(s) => out.symbols.push(s),
        None => out.skipped += 1,
    }
    line.clear();
    *overlong = false;
}

/// One `START SIZE name` line (hex, an optional `0x`), or None.
fn parse_line(l: &[u8]) -> Option<JitSymbol> {
    let s = std::str::from_utf8(l).ok()?;
    let s = s.strip_suffix('\r').unwrap_or(s);
    let mut it = s.splitn(3, ' ');
    let start = hex(it.next()?)?;
    let size = hex(it.next()?)?;
    let name = it.next()?.trim_matches(' ');
    if name.is_empty() || !printable(name) {
        return None;
    }
    Some(JitSymbol { start, end: start.checked_add(size)?, name: name.to_string() })
}

fn hex(s: &str) -> Option<u64> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// No control characters (C0, DEL, C1) and none of the characters that
/// reorder how text is shown (bidirectional marks, embeddings, overrides
/// and isolates).
fn printable(name: &str) -> bool {
    name.chars().all(|c| {
        !c.is_control()
            && !matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Limits {
        Limits { bytes: 1 << 20, lines: 1000, line_bytes: 64 }
    }

    fn names(m: &PerfMap) -> Vec<&str> {
        m.symbols.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn good_lines_are_kept_sorted_by_start() {
        let m = parse(&b"2000 10 b::second\n0x1000 0x20 a first (with spaces)\n3000 8 c"[..], &small());
        assert_eq!(names(&m), ["a first (with spaces)", "b::second", "c"]);
        assert_eq!(m.symbols[0], JitSymbol { start: 0x1000, end: 0x1020, name: "a first (with spaces)".into() });
        assert_eq!((m.skipped, m.cut.clone()), (0, None));
    }

    #[test]
    fn garbage_and_bad_lines_are_skipped_and_counted() {
        let mut text: Vec<u8> = b"1000 10 ok\n".to_vec();
        text.extend_from_slice(b"\xff\xfe\x00garbage\x01\n"); // not UTF-8
        text.extend_from_slice(b"zz 10 not_hex\n");
        text.extend_from_slice(b"+10 10 plus_sign\n");
        text.extend_from_slice(b"1000\n"); // no size
        text.extend_from_slice(b"1000 10\n"); // no name
        text.extend_from_slice(b"1000 10    \n"); // a blank name
        text.extend_from_slice(b"ffffffffffffffff 10 wraps\n");
        text.extend_from_slice(b"\n");
        text.extend_from_slice(b"2000 10 ok2\r\n"); // CRLF is fine
        let m = parse(&text[..], &small());
        assert_eq!(names(&m), ["ok", "ok2"]);
        assert_eq!(m.skipped, 8);
    }

    #[test]
    fn names_with_control_or_reordering_characters_are_skipped() {
        let text = "1000 10 \x1b]0;owned\x07\n1100 10 tab\there\n1200 10 del\x7f\n1300 10 c1\u{9b}31m\n\
                    1400 10 rtl\u{202e}gnp.exe\n1500 10 isolate\u{2066}x\n1600 10 ünïcødé_ok 名前\n";
        let m = parse(text.as_bytes(), &small());
        assert_eq!(names(&m), ["ünïcødé_ok 名前"]);
        assert_eq!(m.skipped, 6);
    }

    #[test]
    fn overlong_lines_are_skipped_without_being_held() {
        let long = "x".repeat(65);
        let text = format!("1000 10 {long}\n1100 10 {}\n2000 10 next\n", "y".repeat(64 - 8));
        let m = parse(text.as_bytes(), &small());
        assert_eq!(names(&m), ["y".repeat(56).as_str(), "next"]);
        assert_eq!(m.skipped, 1);
        // A line far longer than any buffer (1 MiB without a newline), then
        // a good one: only the good one is kept.
        let mut huge = vec![b'z'; 1 << 20];
        huge.extend_from_slice(b"\n3000 10 after\n");
        let m = parse(&huge[..], &Limits { bytes: 4 << 20, ..small() });
        assert_eq!((names(&m), m.skipped, m.cut.clone()), (vec!["after"], 1, None));
    }

    #[test]
    fn the_byte_bound_cuts_and_what_came_before_is_used() {
        let mut text = String::new();
        for i in 0..100 {
            text.push_str(&format!("{:x} 10 f{i:02}\n", 0x1000 + i * 0x10));
        }
        // Each line is 12 bytes; a 300-byte bound lets 25 whole lines through.
        let m = parse(text.as_bytes(), &Limits { bytes: 300, ..small() });
        assert_eq!(m.symbols.len(), 25);
        assert_eq!(m.cut, Some(Cut::Bytes(300)));
        assert_eq!(m.skipped, 0, "300 is a line boundary");
        let m = parse(text.as_bytes(), &Limits { bytes: 305, ..small() });
        assert_eq!((m.symbols.len(), m.skipped, m.cut), (25, 1, Some(Cut::Bytes(305))), "a cut line is skipped");
        // Exactly as long as the bound: read whole, not cut.
        let m = parse(text.as_bytes(), &Limits { bytes: text.len() as u64, ..small() });
        assert_eq!((m.symbols.len(), m.cut), (100, None));
        // A file of zeros (a sparse file): one overlong line, cut at the bound.
        let zeros = std::io::repeat(0).take(10 << 20);
        let m = parse(zeros, &Limits { bytes: 1 << 20, ..small() });
        assert_eq!((m.symbols.len(), m.skipped, m.cut), (0, 1, Some(Cut::Bytes(1 << 20))));
    }

    #[test]
    fn the_line_bound_cuts() {
        let text = "1000 10 a\nbad\n1100 10 b\n1200 10 c\n";
        let m = parse(text.as_bytes(), &Limits { lines: 3, ..small() });
        assert_eq!((names(&m), m.skipped, m.cut.clone()), (vec!["a", "b"], 1, Some(Cut::Lines(3))));
        let m = parse(text.as_bytes(), &Limits { lines: 4, ..small() });
        assert_eq!((names(&m).len(), m.cut), (3, None), "exactly at the bound is not a cut");
    }

    #[test]
    fn notes_make_one_warning_line_and_add_up() {
        let refused = Note { refused: Some("a symlink".into()), ..Note::default() };
        assert_eq!(
            refused.warning(7).unwrap(),
            "sonde: perf map of pid 7 refused: a symlink (perf maps must be regular files owned by the process)"
        );
        let cut = Note { cut: Some(Cut::Bytes(MAX_BYTES)), skipped: 1, ..Note::default() };
        let w = cut.warning(8).unwrap();
        assert!(w.starts_with("sonde: perf map of pid 8: cut at 64 MiB (the rest is ignored); 1 line skipped"), "{w}");
        assert!(!w.contains('\n'));
        assert_eq!(Note::default().warning(9), None);
        let mut t = Tally::default();
        [refused, cut, Note::default()].iter().for_each(|n| t.add(1, n));
        assert_eq!(t, Tally { named_by: vec![], refused: 1, cut: 1, lines_skipped: 1 });
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::json!({"perf_maps_refused": 1, "perf_maps_cut": 1, "perf_map_lines_skipped": 1})
        );
        assert_eq!(Tally::default().text(), None);
    }

    #[test]
    fn a_map_owned_by_another_uid_is_refused() {
        let p = std::env::temp_dir().join(format!("sonde-perfmap-owner-{}", std::process::id()));
        std::fs::write(&p, "1000 10 a\n").unwrap();
        let f = File::open(&p).unwrap();
        let me = f.metadata().unwrap().uid();
        assert!(check_owner(&f, &[me + 1, me + 1, me + 1, me + 1]).is_err());
        assert!(check_owner(&f, &[me + 1, me, me + 1, me + 1]).is_ok(), "any of the four uids");
        let e = check_owner(&f, &[me + 1]).unwrap_err().to_string();
        assert_eq!(e, format!("owned by uid {me}, not by the process's uid {}", me + 1));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_map_older_than_its_process_is_refused_until_the_process_writes_it() {
        use std::io::Write;
        /// The process and its map go whatever the test's outcome.
        struct Gone(std::process::Child, String);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
                let _ = std::fs::remove_file(&self.1);
            }
        }
        let child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let path = format!("/tmp/perf-{pid}.map");
        let _ = std::fs::remove_file(&path);
        let _gone = Gone(child, path.clone());
        // A map left at the path by an earlier process of the same pid:
        // last written before this one started.
        let open = || std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        let mut w = std::fs::OpenOptions::new().write(true).create_new(true).open(&path).unwrap();
        w.write_all(b"1000 10 earlier\n").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(30);
        w.set_modified(old).unwrap();
        let (syms, note, cur) = load(pid, None);
        assert!(syms.is_empty() && cur.is_none(), "{note:?}");
        let earlier = note.stale.expect("refused as an earlier process's");
        let why = note.warning(pid).unwrap();
        assert!(why.starts_with(&format!("sonde: perf map of pid {pid} refused: last written 3")), "{why}");
        assert!(why.ends_with("by an earlier process of that pid (read once the process writes it)"), "{why}");
        // The process appends to it (as CPython's O_APPEND does): its own
        // lines alone are read.
        open().write_all(b"2000 10 its_own\n").unwrap();
        let (syms, note, cur) = load(pid, Some(earlier));
        assert_eq!((names_of(&syms), note.refused, note.stale), (vec!["its_own"], None, None));
        let mut cur = cur.expect("a cursor");
        open().write_all(b"3000 10 later\n").unwrap();
        assert_eq!(names(&read_more(pid, &mut cur).unwrap().0), ["later"]);
        // Without what it was, the whole file (as before the process wrote).
        assert_eq!(names_of(&load(pid, None).0), ["earlier", "its_own", "later"]);
        // Written over (truncated) with more than the earlier held: all of it.
        let mut w = std::fs::OpenOptions::new().write(true).truncate(true).open(&path).unwrap();
        w.write_all(b"4000 10 rewritten\n5000 10 more\n").unwrap();
        assert_eq!(names_of(&load(pid, Some(earlier)).0), ["rewritten", "more"]);
        // The start time is the kernel's: a map written a second after it,
        // or a second before it (whole-second file times), is read; one 3 s
        // before is not.
        let started = started(pid).unwrap();
        let age = std::time::SystemTime::now().duration_since(started).unwrap();
        assert!(age < std::time::Duration::from_secs(5), "started {age:?} ago");
        for (at, refused) in [
            (started + std::time::Duration::from_secs(1), false),
            (started - std::time::Duration::from_secs(1), false),
            (started - std::time::Duration::from_secs(3), true),
        ] {
            w.set_modified(at).unwrap();
            assert_eq!(load(pid, None).1.stale.is_some(), refused, "{at:?} against {started:?}");
        }
    }

    fn names_of(s: &[JitSymbol]) -> Vec<&str> {
        s.iter().map(|j| j.name.as_str()).collect()
    }

    #[test]
    fn a_map_is_read_on_as_the_process_writes_it() {
        use std::io::Write;
        // A process of ours whose map this test writes, as a JIT would
        // (`read` opens /tmp/perf-PID.map inside the process's root).
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let path = format!("/tmp/perf-{pid}.map");
        let sym = |start: u64, size: u64, name: &str| JitSymbol { start, end: start + size, name: name.into() };
        let mut w = File::create(&path).unwrap();
        w.write_all(b"1000 10 first\n2000 10 sec").unwrap();
        let (syms, note, cur) = load(pid, None);
        let mut cur = cur.expect("a cursor");
        // The unfinished last line is read as it stands, and read again whole.
        assert_eq!(syms.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["first", "sec"]);
        assert_eq!((cur.whole, cur.lines, cur.unfinished.clone()), (14, 1, Some(sym(0x2000, 0x10, "sec"))));
        assert_eq!(note.sources[0].1, 2);
        assert!(read_more(pid, &mut cur).is_none(), "nothing written since");
        w.write_all(b"ond_longer").unwrap();
        assert!(read_more(pid, &mut cur).is_none(), "still no whole line");
        w.write_all(b"\nbad line\n3000 10 third\n4000 1").unwrap();
        let (m, redone) = read_more(pid, &mut cur).expect("more");
        assert_eq!(redone, Some(sym(0x2000, 0x10, "sec")));
        assert_eq!((names(&m), m.skipped), (vec!["second_longer", "third"], 1));
        assert_eq!((cur.lines, cur.unfinished.clone()), (4, None), "'4000 1' has no name: not kept");
        // Another file at the path is not read on from.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "1000 10 first\n2000 10 second_longer\nbad line\n3000 10 third\n5000 10 new\n").unwrap();
        assert!(read_more(pid, &mut cur).is_none(), "a new file");

        // A line over the bound is stepped over once and counted once, not
        // read again at each look while it grows.
        std::fs::remove_file(&path).unwrap();
        let mut w = File::create(&path).unwrap();
        w.write_all(b"1000 10 a\n2000 10 ").unwrap();
        w.write_all(&[b'x'; MAX_LINE_BYTES + 10]).unwrap();
        let (_, note, cur) = load(pid, None);
        let mut cur = cur.unwrap();
        assert_eq!((cur.whole, cur.over(), cur.unfinished.clone(), note.skipped), (10, true, None, 0));
        w.write_all(&[b'y'; 100]).unwrap();
        assert!(read_more(pid, &mut cur).is_none());
        assert_eq!(cur.read, 10 + 8 + MAX_LINE_BYTES as u64 + 10 + 100, "read on from where it stopped");
        w.write_all(b"yy\n3000 10 b\n").unwrap();
        let (m, _) = read_more(pid, &mut cur).unwrap();
        assert_eq!((names(&m), m.skipped, cur.lines, cur.over()), (vec!["b"], 1, 3, false));

        // A map growing past the byte bound: cut there once, counted, and
        // not read again.
        w.set_len(MAX_BYTES + 10).unwrap(); // sparse: zeros, no newline
        let (m, _) = read_more(pid, &mut cur).expect("the cut");
        assert_eq!((m.symbols.len(), m.skipped, m.cut, cur.done), (0, 1, Some(Cut::Bytes(MAX_BYTES)), true));
        w.set_len(MAX_BYTES + 20).unwrap();
        assert!(read_more(pid, &mut cur).is_none());

        // A map that shrank is not read on (its lines would start mid-way).
        std::fs::remove_file(&path).unwrap();
        let mut w = File::create(&path).unwrap();
        w.write_all(b"1000 10 a\n2000 10 b\n").unwrap();
        let (_, _, cur) = load(pid, None);
        let mut cur = cur.unwrap();
        w.set_len(5).unwrap();
        w.write_all(b"\n3000 10 c\n").unwrap(); // written at its old end: a hole
        w.set_len(12).unwrap();
        assert!(read_more(pid, &mut cur).is_none() && cur.done, "shrunk");

        // A map cut at the bound on the first read is not read again.
        std::fs::remove_file(&path).unwrap();
        let w = File::create(&path).unwrap();
        w.set_len(MAX_BYTES + 10).unwrap();
        let (_, note, cur) = load(pid, None);
        let cur = cur.unwrap();
        assert_eq!((note.cut, note.skipped, cur.done), (Some(Cut::Bytes(MAX_BYTES)), 1, true));

        // A live cursor, nothing read once the process is gone.
        std::fs::remove_file(&path).unwrap();
        let mut w = File::create(&path).unwrap();
        w.write_all(b"1000 10 a\n").unwrap();
        let (_, _, cur) = load(pid, None);
        let mut cur = cur.unwrap();
        let _ = child.kill();
        let _ = child.wait();
        w.write_all(b"2000 10 b\n").unwrap();
        assert!(!cur.done && read_more(pid, &mut cur).is_none(), "the process is gone");
        std::fs::remove_file(&path).unwrap();
    }

    fn jitdump_bytes(records: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = Vec::new();
        for w in [JITDUMP_MAGIC, 1, 40, 62, 0, 7] {
            b.extend_from_slice(&w.to_ne_bytes());
        }
        b.extend_from_slice(&[0u8; 16]);
        for (id, body) in records {
            b.extend_from_slice(&id.to_ne_bytes());
            b.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
            b.extend_from_slice(&[0u8; 8]);
            b.extend_from_slice(body);
        }
        b
    }

    fn load_record(addr: u64, size: u64, name: &[u8]) -> Vec<u8> {
        let mut r = vec![0u8; 8];
        for w in [addr, addr, size, 1] {
            r.extend_from_slice(&w.to_ne_bytes());
        }
        r.extend_from_slice(name);
        r.push(0);
        r.extend_from_slice(&[0x90; 3]); // the code, never held
        r
    }

    #[test]
    fn jitdumps_load_move_skip_and_stop_on_bad_records() {
        let mut mv = vec![0u8; 8];
        for w in [0x9000u64, 0x1000, 0x5000, 0x20, 1] {
            mv.extend_from_slice(&w.to_ne_bytes());
        }
        let b = jitdump_bytes(&[
            (0, load_record(0x1000, 0x20, b"moved")),
            (4, vec![1, 2, 3, 4, 5, 6, 7, 8]), // unwinding info: stepped over
            (0, load_record(0x2000, 0x10, b"kept")),
            (0, load_record(0x3000, 0x10, b"bad\x1b[31m")),
            (1, mv),
        ]);
        let m = parse_jitdump(&b[..], &Limits::default());
        let names: Vec<(u64, u64, &str)> = m.symbols.iter().map(|s| (s.start, s.end, s.name.as_str())).collect();
        assert_eq!(names, vec![(0x2000, 0x2010, "kept"), (0x5000, 0x5020, "moved")]);
        assert_eq!(m.skipped, 1, "the name with an escape sequence");
        // Cut anywhere: no panic, what came before is kept.
        for n in 0..b.len() {
            let _ = parse_jitdump(&b[..n], &Limits::default());
        }
        // A record smaller than its header: no way on.
        let mut bad = jitdump_bytes(&[(0, load_record(0x2000, 0x10, b"kept"))]);
        bad.extend_from_slice(&[0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let m = parse_jitdump(&bad[..], &Limits::default());
        assert_eq!((m.symbols.len(), m.skipped), (1, 1));
        // Not a jitdump, and the byte bound.
        assert_eq!(parse_jitdump(&b"JiTX and more bytes than a header has, surely"[..], &Limits::default()).skipped, 1);
        let m = parse_jitdump(&b[..], &Limits { bytes: 100, ..Limits::default() });
        assert_eq!(m.cut, Some(Cut::Bytes(100)));
    }
}
