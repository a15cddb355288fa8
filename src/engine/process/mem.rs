//! Reads of a traced process's memory, for the runtimes' user halves. The
//! process controls every byte read here: each read has a fixed upper bound,
//! and a failed or short read is an answer ("not there"), never a panic.
use std::{fs::File, os::unix::fs::FileExt};

/// The most one read may ask for (a line table, a long name).
pub const MAX_READ: usize = 1 << 20;

/// A process's memory, read through `/proc/PID/mem` (no ptrace stop: the
/// process runs on; sonde is root and reads as the kernel allows it).
pub struct Mem {
    file: File,
}

impl Mem {
    /// Opens `pid`'s memory; None when the process is gone or not readable.
    pub fn open(pid: u32) -> Option<Mem> {
        File::open(format!("/proc/{pid}/mem")).ok().map(|file| Mem { file })
    }

    /// `len` bytes at `addr` (at most [`MAX_READ`]), or None if any is unreadable.
    pub fn bytes(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        if len > MAX_READ || addr == 0 || addr.checked_add(len as u64).is_none() {
            return None;
        }
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match self.file.read_at(&mut buf[done..], addr + done as u64) {
                Ok(0) | Err(_) => return None,
                Ok(n) => done += n,
            }
        }
        Some(buf)
    }

    /// `want` bytes at `addr` when they are all readable, else `min` (an
    /// object near the end of its mapping): one read instead of two for a
    /// header whose size it gives and the data that follows it.
    pub fn prefix(&self, addr: u64, want: usize, min: usize) -> Option<Vec<u8>> {
        self.bytes(addr, want).or_else(|| self.bytes(addr, min))
    }

    /// The u64 at `addr`.
    pub fn u64(&self, addr: u64) -> Option<u64> {
        self.bytes(addr, 8).map(|b| u64::from_ne_bytes(b[..8].try_into().unwrap()))
    }

    /// The u32 at `addr`.
    pub fn u32(&self, addr: u64) -> Option<u32> {
        self.bytes(addr, 4).map(|b| u32::from_ne_bytes(b[..4].try_into().unwrap()))
    }
}

/// The little-endian integer of `N` bytes at `off` in `b`, or 0 past its end.
pub fn le<const N: usize>(b: &[u8], off: usize) -> u64 {
    let Some(s) = b.get(off..off.saturating_add(N)) else { return 0 };
    let mut v = [0u8; 8];
    v[..N].copy_from_slice(s);
    u64::from_le_bytes(v)
}
