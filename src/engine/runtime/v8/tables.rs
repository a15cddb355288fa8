//! V8's compact tables, decoded from bytes a traced process controls: the
//! source position table (code offset → source position, for bytecode and
//! for generated code), a source position's fields, the baseline code's
//! bytecode offset table, and a script's line ends. Every decoder is
//! bounded by its input and never panics.

/// Most entries kept of one table.
const MAX_ENTRIES: usize = 1 << 20;

/// A LEB128-style unsigned number (V8's `VLQDecodeUnsigned`): seven bits a
/// byte, low first, the top bit saying another byte follows.
fn uvlq(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let c = *b.get(*i)?;
        *i += 1;
        v |= ((c & 0x7f) as u64) << shift;
        if c & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// A zig-zag signed number (the source position table's `DecodeInt`).
fn svlq(b: &[u8], i: &mut usize) -> Option<i64> {
    let v = uvlq(b, i)?;
    Some(((v >> 1) as i64) ^ -((v & 1) as i64))
}

/// How a source position table writes a code offset's difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Signed (zigzag), its sign telling statements from expressions (V8
    /// to 14.x).
    #[default]
    Signed,
    /// Unsigned, shifted left by two flag bits (is_breakable,
    /// is_statement), since V8 14.x (its table builder's AddPosition takes
    /// both flags).
    Flagged,
}

/// The entries of a source position table, by code offset: (code offset,
/// source position). Each entry is the difference from the one before,
/// starting from offset -1 (a function's entry) and position 0; the code
/// offset as `enc` writes it. A table cut short keeps what was whole.
pub fn positions(b: &[u8], enc: Encoding) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    let (mut i, mut code, mut pos) = (0usize, -1i64, 0i64);
    while i < b.len() && out.len() < MAX_ENTRIES {
        let d = match enc {
            Encoding::Signed => match svlq(b, &mut i) {
                Some(d) if d >= 0 => d,
                Some(d) => -(d + 1),
                None => break,
            },
            Encoding::Flagged => match uvlq(b, &mut i) {
                Some(d) => (d >> 2) as i64,
                None => break,
            },
        };
        let Some(p) = svlq(b, &mut i) else { break };
        code = code.saturating_add(d);
        pos = pos.wrapping_add(p);
        // Bytecode's first entry is the function's entry (offset -1).
        if code < 0 {
            continue;
        }
        if code > u32::MAX as i64 {
            break;
        }
        out.push((code as u32, pos as u64));
    }
    out
}

/// The source position at code offset `at`: the last entry not past it.
pub fn position_at(table: &[(u32, u64)], at: u32) -> Option<u64> {
    let i = table.partition_point(|&(o, _)| o <= at);
    (i > 0).then(|| table[i - 1].1)
}

/// A source position's script offset (None: unknown, or a position in
/// another file that V8 calls external).
pub fn script_offset(pos: u64) -> Option<u32> {
    if pos & 1 != 0 {
        return None;
    }
    let off = (pos >> 1) & ((1 << 30) - 1);
    (off > 0).then(|| off as u32 - 1)
}

/// A source position's inlining id: 0 for the code's own function, else
/// 1 + the index of the inlined call in the code's inlining positions.
pub fn inlining_id(pos: u64) -> u16 {
    (pos >> 31) as u16
}

/// Baseline code's bytecode offset table against its bytecodes: per
/// bytecode, the size of its machine code. Returns (pc offset where the
/// bytecode's code starts, bytecode offset), starting with the prologue
/// (bytecode offset -1). `sizes` is V8's `Bytecodes::kBytecodeSizes`
/// (three tables of `sizes.len() / 3` entries: single, double and
/// quadruple operands).
pub fn baseline_offsets(table: &[u8], bytecode: &[u8], sizes: &[u8]) -> Vec<(u32, i32)> {
    let n = sizes.len() / 3;
    let mut out = Vec::new();
    let mut i = 0usize;
    let Some(first) = uvlq(table, &mut i) else { return out };
    out.push((0, -1));
    let mut pc = first;
    let mut bc = 0usize;
    while i < table.len() && bc < bytecode.len() && out.len() < MAX_ENTRIES {
        let Some(len) = uvlq(table, &mut i) else { break };
        out.push((pc.min(u32::MAX as u64) as u32, bc as i32));
        pc = pc.saturating_add(len);
        // One bytecode, with its operand-scale prefix if it has one
        // (Wide, ExtraWide, and their debug-break forms: 0 to 3).
        let op = bytecode[bc] as usize;
        let (scale, at) = match op {
            0 | 2 => (1, bc + 1),
            1 | 3 => (2, bc + 1),
            _ => (0, bc),
        };
        let Some(&code) = bytecode.get(at) else { break };
        let size = match sizes.get(scale * n + code as usize) {
            Some(&s) if s > 0 && (code as usize) < n => s as usize,
            _ => break,
        };
        bc = at + size;
    }
    out
}

/// The bytecode offset whose machine code holds pc offset `at`.
pub fn bytecode_at(offsets: &[(u32, i32)], at: u32) -> Option<i32> {
    let i = offsets.partition_point(|&(o, _)| o <= at);
    (i > 0).then(|| offsets[i - 1].1)
}

/// Where each line of `source` ends (the offset of its line terminator),
/// as V8's `String::CalculateLineEnds` counts them; at most `max`.
pub fn line_ends(source: impl Iterator<Item = u16>, max: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut prev = 0u16;
    let mut n = 0u32;
    for c in source {
        if out.len() >= max {
            break;
        }
        // \n, \r not before \n, and the Unicode line and paragraph separators.
        if c == 0x0a || c == 0x2028 || c == 0x2029 {
            if !(c == 0x0a && prev == 0x0d) {
                out.push(n);
            } else if let Some(last) = out.last_mut() {
                *last = n; // \r\n: the line ends at the \n
            }
        } else if c == 0x0d {
            out.push(n);
        }
        prev = c;
        n = n.saturating_add(1);
    }
    out.push(n);
    out
}

/// The 1-based line of script offset `off`, from the line ends.
pub fn line_of(ends: &[u32], off: u32) -> Option<u32> {
    if ends.is_empty() {
        return None;
    }
    let i = ends.partition_point(|&e| e < off);
    (i < ends.len()).then_some(i as u32 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: i64, out: &mut Vec<u8>) {
        let mut u = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let more = u > 0x7f;
            out.push((u & 0x7f) as u8 | if more { 0x80 } else { 0 });
            u >>= 7;
            if !more {
                break;
            }
        }
    }

    #[test]
    fn position_tables_decode_deltas_from_the_entry() {
        // (0, 171) expression, (0x27, 174) expression, (0x42, 26 | inlining 1) statement.
        let mut b = Vec::new();
        let entries = [(0i64, 2 * 172, false), (0x27, 2 * 175, false), (0x42, 2 * 27 + (1 << 31), true)];
        let (mut pc, mut pos) = (-1i64, 0i64);
        for (c, p, st) in entries {
            let d = c - pc;
            enc(if st { d } else { -d - 1 }, &mut b);
            enc(p - pos, &mut b);
            pc = c;
            pos = p;
        }
        let t = positions(&b, Encoding::Signed);
        assert_eq!(t.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 0x27, 0x42]);
        assert_eq!(script_offset(t[0].1), Some(171));
        assert_eq!(script_offset(t[2].1), Some(26));
        assert_eq!(inlining_id(t[2].1), 1);
        assert_eq!(position_at(&t, 0x30), Some(t[1].1));
        assert_eq!(position_at(&t, 0x42), Some(t[2].1));
        // Cut short, garbage, or empty: what was whole, never a panic.
        assert_eq!(positions(&b[..b.len() - 1], Encoding::Signed).len(), 2);
        assert!(positions(&[0xff; 20], Encoding::Signed).is_empty());
        assert!(positions(&[0xff; 20], Encoding::Flagged).is_empty());
        // A bytecode table starts at the function's entry (offset -1).
        let mut e = Vec::new();
        enc(-1, &mut e); // delta 0 from -1, an expression
        enc(2 * 9, &mut e);
        enc(-5, &mut e); // to offset 3
        enc(2, &mut e);
        assert_eq!(positions(&e, Encoding::Signed), [(3, 2 * 10)]);
        assert_eq!(position_at(&[], 3), None);
        assert_eq!(script_offset(1), None);
    }

    #[test]
    fn flagged_tables_take_the_offset_above_two_flag_bits() {
        // V8 14.x: (delta << 2 | breakable << 1 | statement), unsigned. The
        // first entries of Node 26's optimized batch(): deltas 12 (from
        // -1: offset 12... the entry is at 12 - 1 + 1), 39 and 9, each
        // breakable.
        let mut b = Vec::new();
        let u = |v: u64, b: &mut Vec<u8>| {
            let mut v = v;
            loop {
                let c = (v & 0x7f) as u8;
                v >>= 7;
                b.push(if v > 0 { c | 0x80 } else { c });
                if v == 0 {
                    break;
                }
            }
        };
        for (d, p) in [(13u64, 2 * 50i64), (39, 2), (9, -4)] {
            u(d << 2 | 0b10, &mut b);
            enc(p, &mut b);
        }
        let t = positions(&b, Encoding::Flagged);
        assert_eq!(t.iter().map(|e| e.0).collect::<Vec<_>>(), [12, 51, 60]);
        assert_eq!(t.iter().map(|e| script_offset(e.1)).collect::<Vec<_>>(), [Some(49), Some(50), Some(48)]);
        // Read as the signed form, the same bytes double every offset.
        assert!(positions(&b, Encoding::Signed)[1].0 > 2 * 51);
    }

    #[test]
    fn baseline_offsets_follow_the_bytecodes() {
        // Bytecode sizes: op 4 is two bytes, op 5 three; Wide (0) doubles operands.
        let n = 8;
        let mut sizes = vec![1u8; 3 * n];
        sizes[4] = 2;
        sizes[5] = 3;
        sizes[n + 5] = 5;
        // Prologue 10 bytes of code; then per bytecode 7, 4, 9.
        let table = [10u8, 7, 4, 9];
        let bytecode = [4u8, 0, 0, 5, 0, 0, 0, 0, 5, 0, 0];
        let o = baseline_offsets(&table, &bytecode, &sizes);
        assert_eq!(o, [(0, -1), (10, 0), (17, 2), (21, 8)]);
        assert_eq!(bytecode_at(&o, 5), Some(-1));
        assert_eq!(bytecode_at(&o, 18), Some(2));
        assert_eq!(bytecode_at(&o, 100), Some(8));
        assert!(baseline_offsets(&[], &bytecode, &sizes).is_empty());
        assert_eq!(baseline_offsets(&table, &[200], &sizes).len(), 2);
    }

    #[test]
    fn lines_end_at_every_terminator() {
        let src = "a\nbc\r\nd\re";
        let ends = line_ends(src.encode_utf16(), 100);
        assert_eq!(ends, [1, 5, 7, 9]);
        assert_eq!(line_of(&ends, 0), Some(1));
        assert_eq!(line_of(&ends, 2), Some(2));
        assert_eq!(line_of(&ends, 6), Some(3));
        assert_eq!(line_of(&ends, 8), Some(4));
        assert_eq!(line_of(&ends, 50), None);
    }
}
