//! A traced process as sonde reads it: its mappings, read once per look
//! ([`Process::read`]) and shared by everyone who needs them at that moment
//! (the unwinder's tables, the runtimes' detection, the symbolizer's
//! snapshot), and its memory ([`mem`]). The process controls all of it:
//! lines that do not parse are skipped, files are opened through
//! `/proc/PID/map_files` (no path the process controls is followed), and
//! every read of its memory is bounded.
pub mod mem;

use std::fs::File;

use mem::Mem;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapLine {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// Whether the mapping is executable.
    pub exec: bool,
    /// The path as the process sees it (in its mount namespace), a
    /// pseudo-name such as `[vdso]`, or empty (anonymous memory).
    pub path: String,
}

impl MapLine {
    /// The file's base name.
    pub fn base(&self) -> &str {
        self.path.trim_end_matches(" (deleted)").rsplit('/').next().unwrap_or("")
    }

    /// Whether a file backs it (its path is absolute).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }

    /// Whether it is anonymous memory.
    pub fn is_anon(&self) -> bool {
        self.path.is_empty()
    }

    /// `/proc/PID/maps`'s range without the zero padding, as `map_files`
    /// names it.
    pub fn range(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }

    /// The file, opened through `/proc/PID/map_files` (works in other mount
    /// namespaces and for deleted files, and follows no path the process
    /// controls).
    pub fn open(&self, pid: u32) -> Option<File> {
        File::open(format!("/proc/{pid}/map_files/{}", self.range())).ok()
    }
}

/// One line of `/proc/PID/maps` (any mapping: the path may be empty or a
/// pseudo-name like `[vdso]`); None for a line that is not one.
pub fn parse_maps_line(line: &str) -> Option<MapLine> {
    let mut it = line.split_whitespace();
    let (range, perms, off, _dev, _ino) = (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    let path: String = it.collect::<Vec<_>>().join(" ");
    let (s, e) = range.split_once('-')?;
    let (start, end, offset) =
        (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?, u64::from_str_radix(off, 16).ok()?);
    Some(MapLine { start, end, offset, exec: perms.contains('x'), path })
}

/// Every mapping of `pid`, in address order (None: gone, or not readable).
pub fn read_maps(pid: u32) -> Option<Vec<MapLine>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(maps.lines().filter_map(parse_maps_line).collect())
}

/// The file-backed mappings of `pid`, in address order.
pub fn map_lines(pid: u32) -> Option<Vec<MapLine>> {
    Some(read_maps(pid)?.into_iter().filter(MapLine::is_file).collect())
}

/// A process's mappings at one moment, and its memory.
pub struct Process {
    /// The process.
    pub pid: u32,
    /// Every mapping, in address order.
    pub maps: Vec<MapLine>,
    mem: Option<Mem>,
}

impl Process {
    /// Reads `pid`'s mappings and opens its memory; None when it is gone.
    pub fn read(pid: u32) -> Option<Process> {
        let maps = read_maps(pid)?;
        Some(Process { pid, maps, mem: Mem::open(pid) })
    }

    /// A process made of these mappings (tests).
    pub fn from_maps(pid: u32, maps: Vec<MapLine>) -> Process {
        Process { pid, maps, mem: None }
    }

    /// The file-backed mappings.
    pub fn files(&self) -> impl Iterator<Item = &MapLine> {
        self.maps.iter().filter(|m| m.is_file())
    }

    /// The executable file-backed mappings.
    pub fn exec_files(&self) -> impl Iterator<Item = &MapLine> {
        self.files().filter(|m| m.exec)
    }

    /// Its memory, when it could be opened.
    pub fn mem(&self) -> Option<&Mem> {
        self.mem.as_ref()
    }

    /// Its memory, for whoever keeps reading it after this look.
    pub fn take_mem(&mut self) -> Option<Mem> {
        self.mem.take()
    }

    /// Its name (the main thread's comm), or "" when gone.
    pub fn comm(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/comm", self.pid)).unwrap_or_default().trim_end().to_string()
    }

    /// A hash of its executable mappings (a change means code was mapped
    /// or unmapped since).
    pub fn exec_hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for m in self.maps.iter().filter(|m| m.exec && (m.is_file() || m.path == "[vdso]")) {
            for w in [m.start, m.end, m.offset] {
                h = (h ^ w).wrapping_mul(0x100_0000_01b3);
            }
            for b in m.path.bytes() {
                h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse_with_spaces_pseudo_names_and_garbage() {
        let m = parse_maps_line("7f00-7f10 r-xp 00001000 08:01 1234   /opt/my lib/libx.so (deleted)").unwrap();
        assert_eq!((m.start, m.end, m.offset, m.exec), (0x7f00, 0x7f10, 0x1000, true));
        assert_eq!(m.path, "/opt/my lib/libx.so (deleted)");
        assert_eq!(m.base(), "libx.so");
        assert_eq!(m.range(), "7f00-7f10");
        let v = parse_maps_line("7fff0000-7fff2000 r-xp 00000000 00:00 0 [vdso]").unwrap();
        assert_eq!(v.path, "[vdso]");
        assert!(!v.is_file() && !v.is_anon());
        assert!(parse_maps_line("1000-2000 rw-p 00000000 00:00 0").unwrap().is_anon());
        assert!(parse_maps_line("zz-2000 r-xp 0 0 0").is_none());
        assert!(parse_maps_line("1000-2000 r-xp").is_none());
    }

    #[test]
    fn our_own_process_reads_with_its_executable() {
        let p = Process::read(std::process::id()).unwrap();
        assert!(p.exec_files().any(|m| m.open(p.pid).is_some()));
        assert!(p.mem().is_some());
        assert_ne!(p.exec_hash(), 0);
    }
}
