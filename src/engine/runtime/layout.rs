//! The layouts the runtimes' kernel and user halves share, as Rust types:
//! generated from `contract.h` (by `runtime.bpf.c`, a types-only object
//! whose skeleton build.rs makes), never packed by hand. Each runtime's own
//! part comes the same way from its folder's `NAME.bpf.c`.
crate::skeleton!("runtime");

pub use skel::types::{rt_end, rt_frame, rt_kind, rt_proc, rt_seen_key, rt_stack, rt_stat};

use super::plugin::ProcConfig;

crate::pod!(rt_proc, rt_stack, rt_frame, rt_seen_key);

pub use crate::engine::record::bytes_of;

/// Language frames kept per stack (`RT_MAX_FRAMES`).
pub const MAX_FRAMES: usize = 128;
/// Interpreter-loop ranges per process (`RT_MAX_RANGES`).
pub const MAX_RANGES: usize = 4;
/// Ranges of generated code a runtime steps itself (`RT_JIT`).
pub const JIT_RANGES: usize = 2;
/// Bytes of a runtime's own part (`RT_PART_BYTES`).
pub const PART_BYTES: usize = 256;

/// `struct rt_proc` for the kernel: the runtime's kind and name key, and
/// its configuration. Ranges past what the kernel holds are left out; a
/// part larger than the kernel's room is a bug in the runtime (its type
/// outgrew `RT_PART_BYTES`), refused.
pub fn proc_value(kind: u8, name_key: (u8, u8), c: &ProcConfig) -> Option<rt_proc> {
    if c.part.len() > PART_BYTES {
        return None;
    }
    let mut p = rt_proc { kind: kind as u32, key_flags: name_key.0, key_loc: name_key.1, ..Default::default() };
    let n = c.ranges.len().min(MAX_RANGES);
    p.nranges = n as u32;
    for (i, &(lo, hi)) in c.ranges.iter().take(n).enumerate() {
        p.lo[i] = lo;
        p.hi[i] = hi;
    }
    for (i, &(lo, hi)) in c.jit.iter().take(JIT_RANGES).enumerate() {
        p.jit_lo[i] = lo;
        p.jit_hi[i] = hi;
    }
    for (i, w) in c.part.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b[..w.len()].copy_from_slice(w);
        p.part[i] = u64::from_ne_bytes(b);
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_layouts_are_the_kernels() {
        // The constants here are the generated arrays' lengths.
        let (s, p) = (rt_stack::default(), rt_proc::default());
        assert_eq!(
            (s.f.len(), p.lo.len(), p.jit_lo.len(), 8 * p.part.len()),
            (MAX_FRAMES, MAX_RANGES, JIT_RANGES, PART_BYTES)
        );
        assert_eq!(std::mem::size_of::<rt_seen_key>(), 24);
        let c = ProcConfig { ranges: vec![(1, 2); 6], jit: vec![(3, 4)], part: vec![7; 9] };
        let p = proc_value(2, (6, 4), &c).unwrap();
        assert_eq!((p.kind, p.nranges, p.lo[3], p.hi[3], p.jit_lo[0], p.jit_hi[1]), (2, 4, 1, 2, 3, 0));
        assert_eq!((p.key_flags, p.key_loc), (6, 4));
        assert_eq!(&bytes_of(&p)[8 + 16 * MAX_RANGES + 16 * JIT_RANGES + 8..][..10], &[7, 7, 7, 7, 7, 7, 7, 7, 7, 0]);
        assert!(proc_value(1, (0, 0), &ProcConfig { part: vec![0; PART_BYTES + 1], ..Default::default() }).is_none());
    }
}
