//! Reads of V8 heap objects in a traced process: tagged values, an
//! object's instance type (through its map), strings of every shape V8
//! keeps (sequential, cons, thin, sliced, external), and the header and
//! elements of its array kinds. The process controls every byte: reads are
//! bounded in size and count, recursion in depth, and a value of the wrong
//! type is an answer ("not there"), never a panic.
use std::collections::HashMap;

use crate::engine::process::mem::{le, Mem, MAX_READ};

/// Most map types remembered per process.
const MAX_TYPES: usize = 4096;
/// Deepest nesting of cons, thin and sliced strings followed.
const MAX_DEPTH: usize = 32;
/// Most string objects visited for one string.
const MAX_PARTS: usize = 4096;

/// The untagged address of a heap object's tagged pointer (V8's tag: the
/// low two bits 01; a weak reference's 11 is the same object).
pub fn untag(v: u64) -> Option<u64> {
    // Below 2^57: no user address is above, and a field's offset added to
    // one never wraps (the words are the process's own, any value).
    (v & 1 == 1 && v > 0xffff && v < USER_TOP).then_some(v & !3)
}

/// Above every user-space address (x86-64 with 5-level paging: 2^56).
pub const USER_TOP: u64 = 1 << 57;

/// A Smi's value (x86-64 without pointer compression: the upper 32 bits).
pub fn smi(v: u64) -> Option<i32> {
    (v as u32 == 0).then_some((v >> 32) as i32)
}

/// Where strings keep their parts (from the binary's v8dbg_ symbols).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StringLayout {
    /// Instance types below this are strings.
    pub first_nonstring: u16,
    /// `String::length` (int32).
    pub len: u64,
    /// Sequential strings' characters.
    pub chars: u64,
    /// `ConsString::first`, `second`.
    pub cons: (u64, u64),
    /// `ThinString::actual`.
    pub thin: u64,
    /// `SlicedString::parent`, `offset` (a Smi).
    pub sliced: (u64, u64),
    /// `ExternalString`: the cached pointer to its characters.
    pub external_data: u64,
    /// Representation tags under `repr_mask`: sequential, cons, external, sliced, thin.
    pub repr: (u16, u16, u16, u16, u16),
    /// `StringRepresentationMask`.
    pub repr_mask: u16,
    /// `StringEncodingMask` and its one-byte value.
    pub encoding: (u16, u16),
}

/// A process's V8 heap, read with a cache of map types.
pub struct Heap<'a> {
    /// The process's memory.
    pub mem: &'a Mem,
    /// `Map::instance_type` (uint16).
    pub map_type: u64,
    /// Map address → instance type.
    pub types: &'a mut HashMap<u64, u16>,
}

impl Heap<'_> {
    /// The word at `addr`.
    pub fn word(&self, addr: u64) -> Option<u64> {
        self.mem.u64(addr)
    }

    /// The instance type of the object `v` (a tagged pointer) points at.
    pub fn type_of(&mut self, v: u64) -> Option<u16> {
        let obj = untag(v)?;
        let map = untag(self.mem.u64(obj)?)?;
        if let Some(&t) = self.types.get(&map) {
            return Some(t);
        }
        let t = le::<2>(&self.mem.bytes(map + self.map_type, 2)?, 0) as u16;
        if self.types.len() < MAX_TYPES {
            self.types.insert(map, t);
        }
        Some(t)
    }

    /// `len` bytes of the object `v` points at, from its start.
    pub fn object(&self, v: u64, len: usize) -> Option<Vec<u8>> {
        self.mem.bytes(untag(v)?, len)
    }

    /// The length (a Smi at `len_off`) and elements (words from
    /// `data_off`) of an array-like object, at most `max` of them.
    pub fn words(&self, v: u64, len_off: u64, data_off: u64, max: usize) -> Option<Vec<u64>> {
        let a = untag(v)?;
        let n = smi(self.mem.u64(a + len_off)?)?;
        if n < 0 {
            return None;
        }
        let n = (n as usize).min(max);
        if n == 0 {
            return Some(Vec::new());
        }
        let b = self.mem.bytes(a + data_off, n * 8)?;
        Some(b.chunks_exact(8).map(|c| le::<8>(c, 0)).collect())
    }

    /// The bytes of a byte array (its length a Smi at `len_off`, data at
    /// `data_off`), at most `max`.
    pub fn byte_array(&self, v: u64, len_off: u64, data_off: u64, max: usize) -> Option<Vec<u8>> {
        let a = untag(v)?;
        let n = smi(self.mem.u64(a + len_off)?)?;
        if n < 0 || n as usize > max {
            return None;
        }
        if n == 0 {
            return Some(Vec::new());
        }
        self.mem.bytes(a + data_off, n as usize)
    }

    /// The string `v` points at, as UTF-16 code units, passed to `out` in
    /// pieces; at most `max` units in all. False when it is not a string
    /// or cannot be read whole.
    pub fn string_units(&mut self, s: &StringLayout, v: u64, max: usize, out: &mut dyn FnMut(&[u16])) -> bool {
        let mut budget = (max, MAX_PARTS);
        self.units(s, v, 0, usize::MAX, &mut budget, 0, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn units(
        &mut self,
        s: &StringLayout,
        v: u64,
        from: usize,
        count: usize,
        budget: &mut (usize, usize),
        depth: usize,
        out: &mut dyn FnMut(&[u16]),
    ) -> bool {
        if depth > MAX_DEPTH || budget.1 == 0 {
            return false;
        }
        budget.1 -= 1;
        let Some(t) = self.type_of(v) else { return false };
        if t >= s.first_nonstring {
            return false;
        }
        let Some(a) = untag(v) else { return false };
        let Some(len) = self.mem.u32(a + s.len) else { return false };
        let len = len as usize;
        if from > len {
            return false;
        }
        let n = count.min(len - from);
        let one_byte = t & s.encoding.0 == s.encoding.1;
        let repr = t & s.repr_mask;
        if repr == s.repr.1 {
            // Cons: first, then second, within [from, from + n).
            let (Some(first), Some(second)) = (self.mem.u64(a + s.cons.0), self.mem.u64(a + s.cons.1)) else {
                return false;
            };
            let Some(flen) = untag(first).and_then(|f| self.mem.u32(f + s.len)) else { return false };
            let flen = flen as usize;
            let mut ok = true;
            if from < flen {
                ok &= self.units(s, first, from, n.min(flen - from), budget, depth + 1, out);
            }
            if ok && from + n > flen {
                let s2 = from.max(flen);
                ok &= self.units(s, second, s2 - flen, from + n - s2, budget, depth + 1, out);
            }
            return ok;
        }
        if repr == s.repr.4 {
            let Some(actual) = self.mem.u64(a + s.thin) else { return false };
            return self.units(s, actual, from, n, budget, depth + 1, out);
        }
        if repr == s.repr.3 {
            let (Some(parent), Some(off)) = (self.mem.u64(a + s.sliced.0), self.mem.u64(a + s.sliced.1)) else {
                return false;
            };
            let Some(off) = smi(off).filter(|&o| o >= 0) else { return false };
            return self.units(s, parent, from + off as usize, n, budget, depth + 1, out);
        }
        let data = if repr == s.repr.0 {
            a + s.chars
        } else if repr == s.repr.2 {
            match self.mem.u64(a + s.external_data) {
                Some(p) if p != 0 && p < USER_TOP => p,
                _ => return false,
            }
        } else {
            return false;
        };
        if n > budget.0 {
            return false;
        }
        budget.0 -= n;
        let unit = if one_byte { 1 } else { 2 };
        let chunk = MAX_READ / 2;
        let mut done = 0;
        while done < n {
            let k = (n - done).min(chunk);
            let Some(b) = self.mem.bytes(data + ((from + done) * unit) as u64, k * unit) else { return false };
            let u: Vec<u16> = if one_byte {
                b.iter().map(|&c| c as u16).collect()
            } else {
                b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
            };
            out(&u);
            done += k;
        }
        true
    }

    /// A short string (a name, a file name) of at most `max` units.
    pub fn string(&mut self, s: &StringLayout, v: u64, max: usize) -> Option<String> {
        let mut u = Vec::new();
        self.string_units(s, v, max, &mut |p| u.extend_from_slice(p)).then(|| String::from_utf16_lossy(&u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> StringLayout {
        StringLayout {
            first_nonstring: 128,
            len: 12,
            chars: 16,
            cons: (16, 24),
            thin: 16,
            sliced: (16, 24),
            external_data: 24,
            repr: (0, 1, 2, 3, 5),
            repr_mask: 7,
            encoding: (8, 8),
        }
    }

    /// Objects in our own memory, read as a traced process's: `maps[i]`
    /// is a map of instance type `types[i]`; `objs` the objects' words.
    fn read(types: &[u16], objs: &[[u64; 4]], root: usize) -> (bool, String) {
        let mut maps = vec![0u8; 64 * types.len()];
        for (i, t) in types.iter().enumerate() {
            maps[64 * i + 12..64 * i + 14].copy_from_slice(&t.to_le_bytes());
        }
        let mut heap = vec![0u64; 4 * objs.len()];
        let base = heap.as_ptr() as u64;
        let mbase = maps.as_ptr() as u64;
        for (i, o) in objs.iter().enumerate() {
            for (j, w) in o.iter().enumerate() {
                // Small words are references: map k (0x100 + k) or object k (0x200 + k).
                heap[4 * i + j] = match *w {
                    x @ 0x100..=0x1ff => (mbase + 64 * (x - 0x100)) | 1,
                    x @ 0x200..=0x2ff => (base + 32 * (x - 0x200)) | 1,
                    x => x,
                };
            }
        }
        let mem = Mem::open(std::process::id()).unwrap();
        let mut types = HashMap::new();
        let mut h = Heap { mem: &mem, map_type: 12, types: &mut types };
        let mut u = Vec::new();
        let ok = h.string_units(&layout(), (base + 32 * root as u64) | 1, 1 << 20, &mut |p| u.extend_from_slice(p));
        std::hint::black_box((&maps, &heap));
        (ok, String::from_utf16_lossy(&u))
    }

    #[test]
    fn strings_of_every_shape_read_whole() {
        let abc = u64::from_le_bytes(*b"abcdefgh");
        // 0: "abc" (sequential, one byte); 1: thin → 0; 2: cons(0, 0);
        // 3: sliced(2, offset 2, length 3).
        let objs = [
            [0x100, 3u64 << 32, abc, 0],
            [0x101, 3u64 << 32, 0x200, 0],
            [0x102, 6u64 << 32, 0x200, 0x200],
            [0x103, 3u64 << 32, 0x202, 2u64 << 32],
        ];
        let types = [8u16, 8 | 5, 8 | 1, 8 | 3];
        assert_eq!(read(&types, &objs, 0), (true, "abc".into()));
        assert_eq!(read(&types, &objs, 1), (true, "abc".into()));
        assert_eq!(read(&types, &objs, 2), (true, "abcabc".into()));
        assert_eq!(read(&types, &objs, 3), (true, "cab".into()));
        // Not a string: a map of another type.
        assert!(!read(&[200], &[[0x100, 3u64 << 32, abc, 0]], 0).0);
    }

    #[test]
    fn a_rope_of_shared_halves_is_cut_short() {
        // 31 cons strings each made of the next twice, then "a": 2^31
        // characters from 32 objects, 2^31 pieces if followed whole.
        let mut objs: Vec<[u64; 4]> =
            (0..31u64).map(|k| [0x100, (1u64 << (31 - k)) << 32, 0x201 + k, 0x201 + k]).collect();
        objs.push([0x101, 1u64 << 32, u64::from_le_bytes(*b"a\0\0\0\0\0\0\0"), 0]);
        let (ok, s) = read(&[8 | 1, 8], &objs, 0);
        assert!(!ok);
        assert!(s.len() <= 4096, "{} pieces read", s.len());
        // A cons of itself ends too.
        let (ok, s) = read(&[8 | 1], &[[0x100, 1u64 << 62, 0x200, 0x200]], 0);
        assert!(!ok && s.is_empty());
    }

    #[test]
    fn tags_and_smis() {
        assert_eq!(untag(0x1234_5679), Some(0x1234_5678));
        assert_eq!(untag(0x1234_567b), Some(0x1234_5678));
        assert_eq!(untag(0x1234_5678), None);
        assert_eq!(untag(1), None);
        assert_eq!(smi(7u64 << 32), Some(7));
        assert_eq!(smi((-1i64 as u64) << 32), Some(-1));
        assert_eq!(smi(0x1_0000_0001), None);
    }
}
