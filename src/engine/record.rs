//! Kernel records decoded in one audited place.
//!
//! The BPF programs hand user space raw bytes (ring-buffer records, map keys
//! and values) laid out as the tool's `NAME.h` declares them; the skeleton's
//! `types` module mirrors those structs. Every tool turns bytes into such a
//! struct through [`decode`] or [`decode_prefix`], never by its own pointer cast.

use anyhow::Context;

/// A type every byte pattern of its size is a valid value of: the C structs
/// the skeletons generate (integers, arrays of integers, padding; no
/// references, bools, enums with invalid values or pointers to follow).
///
/// # Safety
/// Implement it only for `#[repr(C)]` plain-old-data types with no invalid
/// bit patterns; [`pod!`](crate::pod) does so for the skeletons' types.
pub unsafe trait Pod: Copy + 'static {}

/// The bytes of a [`Pod`] value, as the kernel reads them (a map value or
/// key built in user space).
pub fn bytes_of<T: Pod>(t: &T) -> &[u8] {
    // SAFETY: T is Pod (#[repr(C)] integers and arrays of them, padding
    // included in their fields): viewing its size_of bytes is sound.
    unsafe { std::slice::from_raw_parts((t as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// Declares skeleton types as [`Pod`].
#[macro_export]
macro_rules! pod {
    ($($t:ty),+ $(,)?) => {
        $(
            // SAFETY: a skeleton type generated from the tool's C header: #[repr(C)]
            // integers and arrays of them, valid for any bytes.
            unsafe impl $crate::engine::record::Pod for $t {}
        )+
    };
}

// SAFETY: integers are valid for any bit pattern.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}

/// The record at the start of `bytes`, or None when `bytes` is shorter than it.
pub fn decode<T: Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: bytes holds at least size_of::<T>() bytes, read unaligned, and
    // T: Pod is valid for any bit pattern.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// A record whose tail may be cut (a variable-length event): the bytes given,
/// at least `min` of them, over a zeroed `T`; None when fewer than `min`.
pub fn decode_prefix<T: Pod>(bytes: &[u8], min: usize) -> Option<T> {
    let size = std::mem::size_of::<T>();
    if bytes.len() < min.min(size) {
        return None;
    }
    // SAFETY: T: Pod, so all-zero bytes are a valid T.
    let mut t: T = unsafe { std::mem::zeroed() };
    let n = bytes.len().min(size);
    // SAFETY: n <= size_of::<T>() bytes are copied from bytes (at least n
    // long) into t, which does not overlap it; any bytes are a valid T.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut t as *mut T).cast::<u8>(), n) };
    Some(t)
}

/// The sum over CPUs of a per-CPU array's u64 slot `key` (the tools' stats
/// maps; a value too short to hold a u64 counts 0).
pub fn percpu_sum(map: &dyn libbpf_rs::MapCore, key: u32) -> anyhow::Result<u64> {
    let vals = map.lookup_percpu(&key.to_ne_bytes(), libbpf_rs::MapFlags::ANY)?.unwrap_or_default();
    Ok(vals.iter().filter_map(|v| decode::<u64>(v)).sum())
}

/// Calls `each` with every (key, value) of a hash map, read in batches of
/// 4,096 (BPF_MAP_LOOKUP_BATCH, Linux 5.6+: one system call per batch, and
/// nothing allocated per entry), else key by key where the kernel cannot
/// batch. Not for per-CPU maps (a value per CPU: [`percpu_sum`]).
pub fn for_each_entry(map: &dyn libbpf_rs::MapCore, mut each: impl FnMut(&[u8], &[u8])) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    const BATCH: usize = 4096;
    anyhow::ensure!(!map.map_type().is_percpu(), "for_each_entry reads one value a key, not per-CPU maps");
    let (ks, vs) = (map.key_size() as usize, map.value_size() as usize);
    let (mut keys, mut vals) = (vec![0u8; BATCH * ks], vec![0u8; BATCH * vs]);
    // The kernel's position between calls (a bucket index for hashes).
    let (mut pos, mut next) = (vec![0u8; ks.max(8)], vec![0u8; ks.max(8)]);
    let opts = libbpf_sys::bpf_map_batch_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
        ..Default::default()
    };
    let mut first = true;
    loop {
        let mut count = BATCH as u32;
        // SAFETY: `keys` and `vals` hold BATCH keys and values of the map's
        // sizes, `pos` and `next` at least a key (the kernel's position is
        // a u32 for hashes); all outlive the call.
        let rc = unsafe {
            libbpf_sys::bpf_map_lookup_batch(
                map.as_fd().as_raw_fd(),
                if first { std::ptr::null_mut() } else { pos.as_mut_ptr().cast() },
                next.as_mut_ptr().cast(),
                keys.as_mut_ptr().cast(),
                vals.as_mut_ptr().cast(),
                &mut count,
                &opts,
            )
        };
        let done = rc == -libc::ENOENT;
        if rc < 0 && !done {
            if first {
                // No batches here (or a bucket larger than a batch): key by key.
                for k in map.keys() {
                    if let Ok(Some(v)) = map.lookup(&k, libbpf_rs::MapFlags::ANY) {
                        each(&k, &v);
                    }
                }
                return Ok(());
            }
            return Err(std::io::Error::from_raw_os_error(-rc)).context("reading a map in batches");
        }
        let n = (count as usize).min(BATCH);
        for (k, v) in keys.chunks_exact(ks).zip(vals.chunks_exact(vs)).take(n) {
            each(k, v);
        }
        if done {
            return Ok(());
        }
        std::mem::swap(&mut pos, &mut next);
        first = false;
    }
}

/// A NUL-terminated C char array (a task's comm, a congestion control's
/// name) as a string.
pub fn cstr(c: &[i8]) -> String {
    let bytes: Vec<u8> = c.iter().take_while(|&&b| b != 0).map(|&b| b as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A BPF array made with BPF_F_MMAPABLE (Linux 5.5+), mapped read-only:
/// its values read in place, without copying the whole array at each read
/// (`sonde why`'s thread records: 16-32 MiB, read up to 400 times a run).
pub struct MappedArray {
    base: std::ptr::NonNull<u8>,
    bytes: usize,
    stride: usize,
    n: usize,
}

impl MappedArray {
    /// Maps `map` (an array with BPF_F_MMAPABLE).
    pub fn new(map: &dyn libbpf_rs::MapCore) -> std::io::Result<MappedArray> {
        use std::os::fd::AsRawFd;
        let stride = (map.value_size() as usize).next_multiple_of(8);
        let n = map.max_entries() as usize;
        // SAFETY: sysconf has no memory effects.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let bytes = (stride * n).next_multiple_of(page);
        // SAFETY: a new read-only shared mapping of the map's fd, which the
        // kernel keeps alive while it is mapped; nothing else is touched.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ, libc::MAP_SHARED, map.as_fd().as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = std::ptr::NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap gave NULL"))?;
        Ok(MappedArray { base, bytes, stride, n })
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Value `i`, or its start, as a `T` (plain data: a skeleton's type or
    /// an integer) read now; None past the end or for a `T` larger than a
    /// value. The kernel may be writing it meanwhile, as with any read of a
    /// map's value.
    pub fn get<T: Copy>(&self, i: usize) -> Option<T> {
        if i >= self.n || std::mem::size_of::<T>() > self.stride {
            return None;
        }
        // SAFETY: value `i` lies within the mapping (i < n, n * stride <=
        // bytes) and holds at least size_of::<T>() bytes; the mapping is page
        // aligned and the stride a multiple of 8, so an unaligned read is
        // the only assumption made; any bit pattern is a valid T for the
        // plain-data types this is used with.
        Some(unsafe { std::ptr::read_unaligned(self.base.as_ptr().add(i * self.stride).cast::<T>()) })
    }

    /// The first 8 bytes of value `i` as a u64 read with acquire order
    /// (None past the end): where the kernel publishes a value by an
    /// atomic write of that word after filling the rest, the rest read
    /// after this is the value as published, on arm64 as on x86-64.
    pub fn first_word_acquire(&self, i: usize) -> Option<u64> {
        if i >= self.n || self.stride < 8 {
            return None;
        }
        // SAFETY: value `i` lies within the mapping and holds at least 8
        // bytes; its start is 8-byte aligned (a page-aligned mapping, a
        // stride that is a multiple of 8); the word is only read, here
        // atomically, while the kernel writes it atomically.
        let word =
            unsafe { std::sync::atomic::AtomicU64::from_ptr(self.base.as_ptr().add(i * self.stride).cast::<u64>()) };
        Some(word.load(std::sync::atomic::Ordering::Acquire))
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    #[repr(C)]
    struct Rec {
        a: u32,
        b: [u16; 2],
    }
    crate::pod!(Rec);

    #[test]
    fn short_records_are_refused_and_a_cut_tail_reads_as_zero() {
        let bytes = [1, 0, 0, 0, 2, 0, 3, 0, 99];
        assert_eq!(decode::<Rec>(&bytes), Some(Rec { a: 1, b: [2, 3] }));
        assert_eq!(decode::<Rec>(&bytes[..7]), None);
        assert_eq!(decode_prefix::<Rec>(&bytes[..6], 4), Some(Rec { a: 1, b: [2, 0] }));
        assert_eq!(decode_prefix::<Rec>(&bytes[..3], 4), None);
        // Unaligned input.
        assert_eq!(decode::<Rec>(&bytes[1..]).map(|r| r.b[0]), Some(0x0300));
    }
}
