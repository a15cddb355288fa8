//! Count slots the kernel fills and user space reads in place: an mmapable
//! BPF array of `struct { key; u64 state; ...counts }` values, claimed by
//! the BPF programs with compare-and-exchange (state 0 free, 1 being
//! claimed, 2 published after its key) and read through a shared
//! read-only mapping, with no system call per entry. `drops` keeps one per
//! CPU in front of its count hash; `retrans --count` one open-addressed
//! table in front of its flow hash.
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use libbpf_rs::MapCore;

/// A published slot's state.
pub const PUBLISHED: u64 = 2;

/// `len` values of type `T` of an mmapable BPF array, mapped read-only.
pub struct Slots<T> {
    ptr: *const T,
    len: usize,
    bytes: usize,
}

impl<T: Copy> Slots<T> {
    /// Maps the first `len` values of `map` (an mmapable array of `T`).
    pub fn map(map: &dyn MapCore, len: usize) -> anyhow::Result<Slots<T>> {
        use std::os::fd::AsRawFd;
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        // SAFETY: a shared read-only mapping of an mmapable BPF array of
        // at least `len` values of this layout (the kernel rounds up to a
        // page); unmapped on drop.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ, libc::MAP_SHARED, map.as_fd().as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping the count slots");
        }
        Ok(Slots { ptr: p.cast(), len, bytes })
    }

    /// Calls `f` with each published slot (a copy) and a reader of the
    /// slot's `u64` at a byte offset (atomic: the counts may still be
    /// rising). `state` is the offset of the slot's `u64` state, which the
    /// kernel sets to PUBLISHED after writing the key, never to write the
    /// key again.
    pub fn each_published(&self, state: usize, mut f: impl FnMut(&T, &dyn Fn(usize) -> u64)) {
        for i in 0..self.len {
            // SAFETY: i < len values of the mapping.
            let s = unsafe { self.ptr.add(i) };
            // SAFETY: `off` is the offset of an 8-byte aligned u64 inside
            // the mapped T, read atomically because the kernel writes it.
            let word = |off: usize| unsafe {
                AtomicU64::from_ptr(s.cast::<u8>().add(off).cast::<u64>().cast_mut()).load(Ordering::Acquire)
            };
            if word(state) != PUBLISHED {
                continue;
            }
            // SAFETY: a published slot's key is written before its state
            // and never again; its counts are read again through `word`.
            let copy = unsafe { std::ptr::read_volatile(s) };
            f(&copy, &word);
        }
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this size.
        unsafe { libc::munmap(self.ptr.cast_mut().cast(), self.bytes) };
    }
}
