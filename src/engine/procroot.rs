//! Opening a file inside a traced process's root directory as that process
//! would find it, and never outside it.
//!
//! sonde runs as root and reads files traced processes name (their perf
//! maps, the paths their mappings show). A plain `open` of
//! `/proc/PID/root/PATH` resolves an absolute symlink or a `..` inside PATH
//! against sonde's own root, so a process could point sonde at any host
//! file. Here the walk is done by `openat2(2)` from a directory fd of the
//! root with `RESOLVE_IN_ROOT` (absolute symlinks and `..` stay inside it)
//! and `RESOLVE_NO_MAGICLINKS` (no `/proc/*/fd`-style jumps), with
//! `O_NONBLOCK` so a FIFO cannot hang the open, and only regular files are
//! handed out. Without `openat2` (kernels before 5.6, or a seccomp filter
//! that refuses it) nothing is opened: a file that is there is refused.
use std::{
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::FileTypeExt},
    },
    path::{Path, PathBuf},
};

use thiserror::Error;

/// Why a file inside a process's root was not opened.
#[derive(Debug, Error)]
pub enum OpenError {
    /// Nothing at that path (or a directory on the way is missing).
    #[error("not there")]
    Missing,
    /// The last component is a symlink and the caller asked not to follow
    /// one.
    #[error("a symlink")]
    Symlink,
    /// Symlinks on the way loop (or go deeper than the kernel follows), or
    /// one is a `/proc` magic link.
    #[error("its path has symlinks that loop, or a /proc magic link")]
    Loop,
    /// Not a regular file; what it is instead.
    #[error("a {0}, not a regular file")]
    NotRegular(&'static str),
    /// This kernel has no `openat2(2)`, so the walk could not be kept inside
    /// the process's root; the file is there but was not opened.
    #[error("openat2(2) is missing (kernel before 5.6, or a seccomp filter refuses it), so it cannot be opened without following its symlinks out of the process's root")]
    NoOpenat2,
    /// Any other failure.
    #[error("{0}")]
    Io(io::Error),
}

/// Whether the last component of a path may be a symlink (followed inside
/// the root) or must not be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastSymlink {
    /// Follow it, inside the root.
    Follow,
    /// Refuse it ([`OpenError::Symlink`]).
    Refuse,
}

/// A directory that paths are resolved in as if it were `/`: a process's
/// `/proc/PID/root`, or any directory (tests).
pub struct Root {
    dir: OwnedFd,
    /// The directory by path, for the existence check without `openat2`.
    path: PathBuf,
    /// Whether `openat2` is used; false only where the kernel lacks it (and
    /// in tests of that case).
    openat2: bool,
}

/// `struct open_how` of `linux/openat2.h` (libc's is `non_exhaustive`).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// How every walk resolves: inside the root, and no magic links.
const RESOLVE: u64 = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;

/// Times a walk is retried when `openat2` returns EAGAIN (a rename or mount
/// raced with it, which `RESOLVE_IN_ROOT` will not paper over).
const EAGAIN_RETRIES: usize = 8;

impl Root {
    /// The root directory of process `pid` as the process sees it.
    pub fn of_process(pid: u32) -> io::Result<Root> {
        Root::dir(Path::new(&format!("/proc/{pid}/root")))
    }

    /// Any directory as the root (the path itself is trusted).
    pub fn dir(path: &Path) -> io::Result<Root> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Root { dir: f.into(), path: path.to_path_buf(), openat2: true })
    }

    /// The same root, treated as on a kernel without `openat2` (tests).
    #[cfg(test)]
    fn without_openat2(mut self) -> Root {
        self.openat2 = false;
        self
    }

    /// Opens `path` (absolute or not, always taken from this root) read-only
    /// as a regular file. Symlinks and `..` on the way resolve inside the
    /// root; the last component is followed only with [`LastSymlink::Follow`].
    pub fn open(&self, path: &Path, last: LastSymlink) -> Result<File, OpenError> {
        let rel = path.strip_prefix("/").unwrap_or(path);
        let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        let c = CString::new(rel.as_os_str().as_bytes()).map_err(|e| OpenError::Io(e.into()))?;
        // The walk yields an O_PATH fd: nothing is opened yet, so a device
        // node planted at the path (whose open could act: a watchdog, a
        // tape) is looked at, never opened. Only a regular file is then
        // opened for reading, through that very fd.
        let mut flags = libc::O_PATH | libc::O_CLOEXEC;
        if last == LastSymlink::Refuse {
            flags |= libc::O_NOFOLLOW;
        }
        let fd = match self.openat2 {
            true => openat2(&self.dir, &c, flags as u64, RESOLVE),
            false => Err(io::Error::from_raw_os_error(libc::ENOSYS)),
        };
        let pinned = match fd {
            Ok(fd) => File::from(fd),
            Err(e) => return Err(self.why_not(e, &c, rel)),
        };
        let ft = pinned.metadata().map_err(OpenError::Io)?.file_type();
        if ft.is_symlink() {
            return Err(OpenError::Symlink);
        }
        if !ft.is_file() {
            return Err(OpenError::NotRegular(kind_of(&ft)));
        }
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", pinned.as_raw_fd()))
            .map_err(OpenError::Io)
    }

    fn why_not(&self, e: io::Error, c: &CString, rel: &Path) -> OpenError {
        match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => OpenError::Missing,
            // The last component itself, or the walk to it? The same walk
            // with O_PATH stops at the last component without following it.
            Some(libc::ELOOP) => {
                let last = openat2(&self.dir, c, (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64, RESOLVE)
                    .and_then(|fd| File::from(fd).metadata());
                match last {
                    Ok(md) if md.file_type().is_symlink() => OpenError::Symlink,
                    _ => OpenError::Loop,
                }
            }
            // Only whether something is there is looked up (lstat through
            // the path, which may leave the root); nothing is opened.
            Some(libc::ENOSYS) => match std::fs::symlink_metadata(self.path.join(rel)) {
                Ok(_) => OpenError::NoOpenat2,
                Err(_) => OpenError::Missing,
            },
            _ => OpenError::Io(e),
        }
    }
}

/// `openat2(dir, path, {flags, 0, resolve})`, retried on EAGAIN.
fn openat2(dir: &OwnedFd, path: &CString, flags: u64, resolve: u64) -> io::Result<OwnedFd> {
    let how = OpenHow { flags, mode: 0, resolve };
    for _ in 0..EAGAIN_RETRIES {
        // SAFETY: a valid dir fd, a NUL-terminated path and a live open_how
        // of the size passed; the kernel only reads them.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel just returned this fd; nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// What a file that is not a regular one is, in words.
fn kind_of(ft: &std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "special file"
    }
}

/// Keeps `f` open for the rest of the run and names it by
/// `/proc/self/fd/N`: a path that reaches exactly the file opened, for
/// code that takes a path (uprobe attachment, ELF readers). A file pinned
/// before (same device and inode) keeps its first path and `f` is closed.
pub fn pinned_path(f: File) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    static PINNED: std::sync::Mutex<Vec<((u64, u64), PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let key = f.metadata().map(|m| (m.dev(), m.ino())).ok();
    let mut pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = key.and_then(|k| pinned.iter().find(|(pk, _)| *pk == k)) {
        return p.1.clone();
    }
    let path = PathBuf::from(format!("/proc/self/fd/{}", f.into_raw_fd()));
    if let Some(k) = key {
        pinned.push((k, path.clone()));
    }
    path
}

#[cfg(test)]
mod tests {
    use std::{io::Read, os::unix::fs::symlink};

    use super::*;

    /// A fake root with a secret outside it and a file inside it.
    fn setup(name: &str) -> (PathBuf, PathBuf) {
        let base = std::env::temp_dir().join(format!("sonde-procroot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(base.join("secret"), "outside").unwrap();
        std::fs::write(root.join("etc/inside"), "inside").unwrap();
        (base, root)
    }

    fn read(f: File) -> String {
        let mut s = String::new();
        let mut f = f;
        f.read_to_string(&mut s).unwrap();
        s
    }

    #[test]
    fn dot_dot_and_absolute_symlinks_stay_inside_the_root() {
        let (base, root) = setup("escape");
        let r = Root::dir(&root).unwrap();
        // `..` past the root stops at the root.
        assert!(matches!(r.open(Path::new("../secret"), LastSymlink::Follow), Err(OpenError::Missing)));
        assert!(matches!(r.open(Path::new("/../../secret"), LastSymlink::Follow), Err(OpenError::Missing)));
        assert_eq!(read(r.open(Path::new("/tmp/../../../etc/inside"), LastSymlink::Follow).unwrap()), "inside");
        // An absolute symlink to the host's secret names the root's path
        // instead (missing here), and one to /etc/inside is the root's file.
        let abs = base.join("secret");
        symlink(&abs, root.join("tmp/to-secret")).unwrap();
        assert!(matches!(r.open(Path::new("/tmp/to-secret"), LastSymlink::Follow), Err(OpenError::Missing)));
        symlink("/etc/inside", root.join("tmp/to-inside")).unwrap();
        assert_eq!(read(r.open(Path::new("/tmp/to-inside"), LastSymlink::Follow).unwrap()), "inside");
        // A directory symlink on the way resolves inside the root too.
        symlink(&base, root.join("hostdir")).unwrap();
        assert!(matches!(r.open(Path::new("/hostdir/secret"), LastSymlink::Follow), Err(OpenError::Missing)));
        symlink("../../..", root.join("tmp/up")).unwrap();
        assert!(matches!(r.open(Path::new("tmp/up/secret"), LastSymlink::Follow), Err(OpenError::Missing)));
        // Refusing the last symlink refuses even one that stays inside.
        assert!(matches!(r.open(Path::new("/tmp/to-inside"), LastSymlink::Refuse), Err(OpenError::Symlink)));
        // A directory that is an absolute symlink to itself loops.
        symlink("/loop/x", root.join("loop")).unwrap();
        assert!(matches!(r.open(Path::new("/loop/x"), LastSymlink::Refuse), Err(OpenError::Loop)));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn only_regular_files_are_opened_and_a_fifo_does_not_block() {
        let (base, root) = setup("kinds");
        let r = Root::dir(&root).unwrap();
        let fifo = CString::new(root.join("tmp/fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(matches!(r.open(Path::new("/tmp/fifo"), LastSymlink::Refuse), Err(OpenError::NotRegular("FIFO"))));
        assert!(matches!(r.open(Path::new("/tmp"), LastSymlink::Refuse), Err(OpenError::NotRegular("directory"))));
        // A device node is looked at through an O_PATH fd, never opened (an
        // open could act: a watchdog, a tape). /dev/full's numbers, 1:7.
        let dev = CString::new(root.join("tmp/dev").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; mknod needs root, as sonde's tests run.
        if unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 7)) } == 0 {
            let got = r.open(Path::new("/tmp/dev"), LastSymlink::Follow);
            assert!(matches!(got, Err(OpenError::NotRegular("character device"))), "{got:?}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn without_openat2_a_file_that_is_there_is_refused_not_followed() {
        let (base, root) = setup("noopenat2");
        symlink(base.join("secret"), root.join("tmp/to-secret")).unwrap();
        let r = Root::dir(&root).unwrap().without_openat2();
        assert!(matches!(r.open(Path::new("/etc/inside"), LastSymlink::Refuse), Err(OpenError::NoOpenat2)));
        assert!(matches!(r.open(Path::new("/tmp/to-secret"), LastSymlink::Follow), Err(OpenError::NoOpenat2)));
        assert!(matches!(r.open(Path::new("/tmp/none"), LastSymlink::Refuse), Err(OpenError::Missing)));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
