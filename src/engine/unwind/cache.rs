//! Built tables on disk, so a second run starts fast.
//!
//! A table is stored under the SHA-256 of what it is built from (the
//! format version, the architecture, `.eh_frame`'s address and bytes, `.debug_frame`'s bytes,
//! the text address and the PLT sections), not under the file's build ID: a traced process
//! can give any file any build ID, and a table keyed by a forged one would
//! then unwind every other process that maps the real file. Hashing the
//! sections costs ~2 ms per MB; building the table costs 10-20 times that.
//!
//! The directory is `$SONDE_CACHE_DIR` or `/var/cache/sonde/unwind`,
//! created mode 0700; it is not used when it is a symlink, not a directory,
//! not ours, or writable by others. Files are written to a temporary name
//! and renamed, opened without following symlinks, and checked for size
//! before they are read. The oldest files (by last use) are removed once the
//! directory holds more than [`CAP_BYTES`].
use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::PathBuf,
    time::SystemTime,
};

use sha2::{Digest, Sha256};

use super::{
    elf::ElfUnwindInfo,
    table::{BuildStats, Row, Table, MAX_ROWS},
};

/// Bumped whenever the row encoding or the builder's output changes.
pub const FORMAT: u32 = 6;
const MAGIC: &[u8; 8] = b"SONDEUW\0";
const HEADER: usize = 8 + 4 + 4 + 32 + 8 + 6 * 8;
/// Most bytes the cache directory may hold.
pub const CAP_BYTES: u64 = 256 << 20;

/// What a table is keyed by: see the module documentation.
pub type Key = [u8; 32];

/// The key of the table `info` would build.
pub fn key(info: &ElfUnwindInfo) -> Key {
    let mut h = Sha256::new();
    h.update(FORMAT.to_le_bytes());
    h.update(info.arch.name().as_bytes());
    for a in &info.sigreturn {
        h.update(a.to_le_bytes());
    }
    let text = info.segments.iter().find(|s| s.exec).map(|s| s.vaddr).unwrap_or(0);
    h.update(text.to_le_bytes());
    for (a, n, lazy) in &info.plt {
        h.update(a.to_le_bytes());
        h.update(n.to_le_bytes());
        h.update([*lazy as u8]);
    }
    // Go's rows count from where its text starts.
    h.update(info.text.to_le_bytes());
    h.update(format!("{:?}", info.go_cgo).as_bytes());
    for s in [&info.eh_frame, &info.debug_frame, &info.gopclntab] {
        match s {
            Some(s) => {
                h.update([1]);
                h.update(s.addr.to_le_bytes());
                h.update((s.data.len() as u64).to_le_bytes());
                h.update(&s.data);
            }
            None => h.update([0]),
        }
    }
    h.finalize().into()
}

/// The on-disk cache (or none, when its directory is unusable).
#[derive(Debug, Default)]
pub struct Cache {
    dir: Option<PathBuf>,
    /// Why there is no cache, when there is none.
    pub disabled: Option<String>,
    /// Tables read from the cache.
    pub hits: u64,
    /// Tables not found there.
    pub misses: u64,
}

fn hex(k: &Key) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}

impl Cache {
    /// The cache at `$SONDE_CACHE_DIR` or `/var/cache/sonde/unwind`
    /// (`SONDE_CACHE_DIR=off`: none).
    pub fn open() -> Cache {
        let dir = std::env::var_os("SONDE_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/sonde/unwind"));
        if dir.as_os_str() == "off" {
            return Cache { disabled: Some("SONDE_CACHE_DIR=off".into()), ..Default::default() };
        }
        Self::open_at(&dir)
    }

    /// The cache in `dir` (made if missing).
    pub fn open_at(dir: &std::path::Path) -> Cache {
        let dir = dir.to_path_buf();
        match Self::prepare(&dir) {
            Ok(()) => Cache { dir: Some(dir), ..Default::default() },
            Err(why) => Cache { disabled: Some(format!("{}: {why}", dir.display())), ..Default::default() },
        }
    }

    fn prepare(dir: &PathBuf) -> Result<(), String> {
        if fs::symlink_metadata(dir).is_err() {
            if let Some(parent) = dir.parent() {
                fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            fs::DirBuilder::new().mode(0o700).create(dir).map_err(|e| e.to_string())?;
        }
        let md = fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !md.file_type().is_dir() {
            return Err("not a directory (or a symlink)".into());
        }
        if md.uid() != me || md.permissions().mode() & 0o022 != 0 {
            return Err(format!(
                "owned by uid {} with mode {:o}; want uid {me}, not writable by others",
                md.uid(),
                md.permissions().mode() & 0o777
            ));
        }
        // Every directory above it too: nobody else may swap a component
        // (a sticky directory such as /tmp protects our own entries).
        let mut up = dir.parent();
        while let Some(a) = up.filter(|a| !a.as_os_str().is_empty()) {
            let md = fs::symlink_metadata(a).map_err(|e| format!("{}: {e}", a.display()))?;
            let mode = md.permissions().mode();
            let others_write = mode & 0o022 != 0 && mode & 0o1000 == 0;
            if !md.file_type().is_dir() || (md.uid() != me && md.uid() != 0) || others_write {
                return Err(format!("{} is a symlink, or can be changed by another user", a.display()));
            }
            up = a.parent();
        }
        Ok(())
    }

    fn path(&self, k: &Key) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{}.tbl", hex(k))))
    }

    /// The table stored under `k`, if any (a damaged file is ignored).
    pub fn get(&mut self, k: &Key) -> Option<Table> {
        let path = self.path(k)?;
        let t = read_table(&path, k);
        match &t {
            Some(_) => {
                self.hits += 1;
                // Last use, for pruning.
                if let Ok(f) = OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
            }
            None => self.misses += 1,
        }
        t
    }

    /// Stores `t` under `k`; failures only cost the next run a rebuild.
    pub fn put(&mut self, k: &Key, t: &Table) {
        let Some(path) = self.path(k) else { return };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut buf = Vec::with_capacity(HEADER + t.rows.len() * 16);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&FORMAT.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        buf.extend_from_slice(k);
        buf.extend_from_slice(&(t.rows.len() as u64).to_le_bytes());
        let s = &t.stats;
        for v in [s.fdes, s.cfi_rows, s.unsupported_cfa, s.unknown_rbp, s.bad_fdes, s.debug_frame_rows] {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        for r in &t.rows {
            buf.extend_from_slice(&r.addr.to_le_bytes());
            buf.extend_from_slice(&r.rule.to_le_bytes());
        }
        let wrote = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&buf))
            .and_then(|()| fs::rename(&tmp, &path));
        if wrote.is_err() {
            let _ = fs::remove_file(&tmp);
            return;
        }
        self.prune();
    }

    /// Removes the least recently used tables while the directory holds
    /// more than [`CAP_BYTES`].
    fn prune(&self) {
        let Some(dir) = &self.dir else { return };
        let Ok(rd) = fs::read_dir(dir) else { return };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = rd
            .filter_map(|e| {
                let e = e.ok()?;
                let md = e.metadata().ok()?;
                let ext = e.path().extension()?.to_string_lossy().into_owned();
                // Leftovers of a run killed while writing.
                if md.is_file()
                    && ext.starts_with("tmp")
                    && md.modified().ok()?.elapsed().ok()? > std::time::Duration::from_secs(3600)
                {
                    let _ = fs::remove_file(e.path());
                    return None;
                }
                (md.is_file() && ext == "tbl").then_some(())?;
                Some((md.modified().ok()?, md.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, p) in files {
            if total <= CAP_BYTES {
                break;
            }
            if fs::remove_file(&p).is_ok() {
                total -= len;
            }
        }
    }
}

fn read_table(path: &PathBuf, k: &Key) -> Option<Table> {
    let mut f: File = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let len = f.metadata().ok()?.len();
    if len < HEADER as u64 || len > (HEADER + MAX_ROWS * 16) as u64 || (len - HEADER as u64) % 16 != 0 {
        return None;
    }
    let mut buf = Vec::with_capacity(len as usize);
    f.read_to_end(&mut buf).ok()?;
    let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap());
    if &buf[..8] != MAGIC || u32_at(8) != FORMAT || &buf[16..48] != k {
        return None;
    }
    let n = u64_at(48) as usize;
    if buf.len() != HEADER + n * 16 {
        return None;
    }
    let st: Vec<u64> = (0..6).map(|i| u64_at(56 + 8 * i)).collect();
    let stats = BuildStats {
        fdes: st[0],
        cfi_rows: st[1],
        unsupported_cfa: st[2],
        unknown_rbp: st[3],
        bad_fdes: st[4],
        debug_frame_rows: st[5],
    };
    let rows =
        (0..n).map(|i| Row { addr: u64_at(HEADER + 16 * i), rule: u64_at(HEADER + 16 * i + 8) }).collect::<Vec<_>>();
    // Sorted, or not ours.
    if rows.windows(2).any(|w| w[0].addr >= w[1].addr) {
        return None;
    }
    Some(Table { rows, stats, arch: Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_cache(name: &str) -> (Cache, PathBuf) {
        let dir = std::env::temp_dir().join(format!("sonde-cache-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let c = match Cache::prepare(&dir) {
            Ok(()) => Cache { dir: Some(dir.clone()), ..Default::default() },
            Err(e) => panic!("{e}"),
        };
        (c, dir)
    }

    #[test]
    fn a_table_round_trips_and_a_damaged_file_is_ignored() {
        let (mut c, dir) = temp_cache("rt");
        let t = Table {
            rows: vec![Row { addr: 0x1000, rule: 1 << 16 }, Row { addr: 0x1010, rule: 0 }],
            stats: BuildStats { fdes: 1, ..Default::default() },
            arch: Default::default(),
        };
        let k = [7u8; 32];
        assert!(c.get(&k).is_none());
        c.put(&k, &t);
        assert_eq!(c.get(&k), Some(t.clone()));
        assert_eq!((c.hits, c.misses), (1, 1));
        // Another key never reads this file.
        assert!(c.get(&[8u8; 32]).is_none());
        // Truncated: ignored.
        let p = c.path(&k).unwrap();
        let data = fs::read(&p).unwrap();
        fs::write(&p, &data[..data.len() - 3]).unwrap();
        assert!(c.get(&k).is_none());
        // A symlink in its place is not followed.
        fs::remove_file(&p).unwrap();
        let other = dir.join("other");
        fs::write(&other, &data).unwrap();
        std::os::unix::fs::symlink(&other, &p).unwrap();
        assert!(c.get(&k).is_none());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_writable_by_others_is_not_used() {
        let dir = std::env::temp_dir().join(format!("sonde-cache-test-mode-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Cache::prepare(&dir).unwrap_err().contains("mode 777"));
        let _ = fs::remove_dir_all(&dir);
    }
}
