//! Stacks that name the program, not its runtime: the runtime-frames engine
//! shared by every stack tool (profile, offcpu, wakeup, slow, and serve's
//! profiles). Its kernel half is `contract.h` and `runtimes.h` beside this
//! file.
//!
//! - [`plugin`]: the boundary a runtime plugs into ([`plugin::Runtime`],
//!   [`plugin::Instance`]), and [`registry`]: the runtimes plugged in. Each
//!   runtime is a folder: [`python`] (CPython), [`java`] (HotSpot), [`v8`]
//!   (Node.js). Go is read apart, from its binary's own tables, by the
//!   unwinder and the symbolizer ([`go`]).
//! - `manager`: per process, when the unwinder first loads its tables
//!   ([`Runtimes::on_load`], from the same look at its mappings), each
//!   runtime looks for itself (also in another mount namespace, through
//!   `/proc/PID/map_files`, and embedded in another program) and, when
//!   found, learns what the kernel needs (version, structure offsets from the
//!   runtime's own description of itself, the interpreter loop's address
//!   ranges, how the thread's state is found) and writes it to `rt_procs`.
//!   The kernel walk marks native frames in the interpreter loop and
//!   records the language frames the thread was running; code objects met in
//!   new stacks are handed over in `rt_seen`, and named while the process
//!   lives ([`Runtimes::drain`]: name, file, line table), so a process that
//!   exits mid-run keeps its names.
//! - [`merge`] replaces each marked native frame by the language frames it
//!   was running, at the end.
//! - [`layout`]: the layouts both halves share, generated from `contract.h`.
pub mod elfsym;
pub mod go;
pub mod java;
pub mod layout;
mod manager;
pub mod plugin;
pub mod python;
pub mod registry;
pub mod v8;

use std::collections::HashMap;

use clap::ValueEnum;

use crate::engine::record::decode_prefix;
use layout::{rt_frame, rt_stack};
pub use layout::{JIT_RANGES, MAX_FRAMES, MAX_RANGES};
pub use manager::{Names, ProcReport, Report, RtMaps, Runtimes, WalkCounts};
pub use plugin::{CodeInfo, CodeLines, SrcFrame};
pub use registry::{inspect, supported};

/// `UNW_HOW_RT`: the walked stack has language frames in `rt_walked`.
pub const HOW_RT: u8 = 4;
/// `RT_F_ENTRY`: the outermost frame run by one interpreter-loop frame.
pub const FLAG_ENTRY: u8 = 1;
/// Processes whose runtime the kernel can hold (`rt_procs`).
pub const MAX_PROCS: u32 = 4096;
/// Walked stacks with language frames kept (`rt_walked`, allocated as used).
pub const MAX_WALKED: u32 = 16384;
/// Code objects handed over between two drains (`rt_seen`).
pub const MAX_SEEN: u32 = 16384;

/// `--frames`: what a stack shows of language runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Frames {
    /// Each interpreter-loop frame replaced by the language frames it ran;
    /// native callers and callees (C extensions, the kernel) stay.
    #[default]
    Mixed,
    /// Only the language frames, where a stack has any.
    Lang,
    /// Native frames only, as the CPU sees them (no language frames read).
    Native,
}

/// One language frame as the kernel recorded it (`struct rt_frame`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtFrame {
    /// The code object.
    pub addr: u64,
    /// Where in it (runtime-specific).
    pub loc: u32,
    /// Tells a reused code object apart.
    pub cookie: u16,
    /// `RT_F_*`.
    pub flags: u8,
    /// `enum rt_kind`.
    pub kind: u8,
}

/// The language frames of a walked stack (`struct rt_stack`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtStack {
    /// How the walk ended (`enum rt_end`).
    pub end: u8,
    /// Bit i: native frame i (leaf first) is in the interpreter loop.
    pub marks: [u64; 2],
    /// Leaf first.
    pub frames: Vec<RtFrame>,
}

impl RtStack {
    /// Decodes `rt_walked`'s value (a value cut short keeps the frames it
    /// holds).
    pub fn decode(b: &[u8]) -> Option<RtStack> {
        const HEAD: usize = std::mem::size_of::<rt_stack>() - MAX_FRAMES * std::mem::size_of::<rt_frame>();
        let s: rt_stack = decode_prefix(b, HEAD)?;
        let n = (s.n as usize).min(MAX_FRAMES).min((b.len() - HEAD) / std::mem::size_of::<rt_frame>());
        let frames = s.f[..n]
            .iter()
            .map(|f| RtFrame { addr: f.addr, loc: f.loc, cookie: f.cookie, flags: f.flags, kind: f.kind })
            .collect();
        Some(RtStack { end: s.end, marks: s.marks, frames })
    }

    /// Whether native frame `i` (leaf first) ran the interpreter loop.
    pub fn marked(&self, i: usize) -> bool {
        i < 128 && self.marks[i / 64] & (1 << (i % 64)) != 0
    }

    /// The frames in groups, leaf first: each group is what one
    /// interpreter-loop frame ran, leaf first.
    pub fn groups(&self) -> Vec<&[RtFrame]> {
        let mut out = Vec::new();
        let mut start = 0;
        for (i, f) in self.frames.iter().enumerate() {
            if f.flags & FLAG_ENTRY != 0 {
                out.push(&self.frames[start..=i]);
                start = i + 1;
            }
        }
        if start < self.frames.len() {
            out.push(&self.frames[start..]);
        }
        out
    }
}

/// Sets the runtime maps' sizes and `rt_mode` of an open skeleton (part of
/// `set_unwind!`).
#[macro_export]
macro_rules! set_runtimes {
    ($open:expr, $plan:expr) => {{
        let (open, plan) = ($open, $plan);
        let on = plan.tables && plan.frames != $crate::engine::runtime::Frames::Native;
        open.maps.rodata_data.as_deref_mut().expect("rodata present").rt_mode = on as u32;
        if on {
            open.maps.rt_procs.set_max_entries($crate::engine::runtime::MAX_PROCS)?;
            open.maps.rt_walked.set_max_entries($crate::engine::runtime::MAX_WALKED)?;
            open.maps.rt_walked.set_map_flags(libbpf_sys::BPF_F_NO_PREALLOC)?;
            open.maps.rt_seen.set_max_entries($crate::engine::runtime::MAX_SEEN)?;
        }
    }};
}

/// Where a merged stack's user frames come from, root first.
pub enum Part<'a> {
    /// Native frame `i` (leaf-first index into the walked stack).
    Native(usize),
    /// A language frame.
    Lang(&'a RtFrame),
}

/// The order of a user stack's frames, root first, with each
/// interpreter-loop frame replaced by the language frames it ran (`Mixed`),
/// only the language frames (`Lang`; a stack without any keeps its native
/// frames), or the native frames (`Native`). `n` is the native frame count.
/// Returns the parts and whether the groups and loop frames matched up (a
/// mismatch keeps the extra loop frames native, or puts extra language
/// frames at the root).
pub fn merge(n: usize, rt: Option<&RtStack>, frames: Frames) -> (Vec<Part<'_>>, bool) {
    let native = || (0..n).rev().map(Part::Native).collect::<Vec<_>>();
    let Some(rt) = rt.filter(|r| !r.frames.is_empty() && frames != Frames::Native) else { return (native(), true) };
    let groups = rt.groups();
    // Leaf-first: the k-th marked native frame ran the k-th group.
    let mut by_native: HashMap<usize, &[RtFrame]> = HashMap::new();
    let mut g = groups.iter();
    for i in (0..n).filter(|&i| rt.marked(i)) {
        match g.next() {
            Some(grp) => {
                by_native.insert(i, grp);
            }
            None => break,
        }
    }
    let extra: Vec<&[RtFrame]> = g.copied().collect();
    let matched = extra.is_empty() && by_native.len() == (0..n).filter(|&i| rt.marked(i)).count();
    let mut out = Vec::new();
    // Groups the native walk did not reach sit at the root, outermost first.
    for grp in extra.iter().rev() {
        out.extend(grp.iter().rev().map(Part::Lang));
    }
    for i in (0..n).rev() {
        match by_native.get(&i) {
            Some(grp) => out.extend(grp.iter().rev().map(Part::Lang)),
            None if frames == Frames::Lang => {}
            None => out.push(Part::Native(i)),
        }
    }
    (out, matched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(addr: u64, entry: bool) -> RtFrame {
        RtFrame { addr, loc: 0, cookie: 0, flags: if entry { FLAG_ENTRY } else { 0 }, kind: 1 }
    }

    fn order(parts: &[Part<'_>]) -> Vec<String> {
        parts
            .iter()
            .map(|p| match p {
                Part::Native(i) => format!("n{i}"),
                Part::Lang(f) => format!("py{}", f.addr),
            })
            .collect()
    }

    #[test]
    fn each_loop_frame_takes_its_group_and_native_callers_stay() {
        // Native leaf first: 0 leaf C, 1 eval (runs py1, py2), 2 C callback
        // (sorted), 3 eval (runs py3), 4 main.
        let rt = RtStack { end: 0, marks: [0b1010, 0], frames: vec![f(1, false), f(2, true), f(3, true)] };
        let (p, ok) = merge(5, Some(&rt), Frames::Mixed);
        assert!(ok);
        assert_eq!(order(&p), ["n4", "py3", "n2", "py2", "py1", "n0"]);
        let (p, _) = merge(5, Some(&rt), Frames::Lang);
        assert_eq!(order(&p), ["py3", "py2", "py1"]);
        let (p, _) = merge(5, Some(&rt), Frames::Native);
        assert_eq!(order(&p), ["n4", "n3", "n2", "n1", "n0"]);
    }

    #[test]
    fn mismatches_keep_every_frame() {
        // Two loop frames, one group: the outer loop frame stays native.
        let rt = RtStack { end: 0, marks: [0b110, 0], frames: vec![f(1, true)] };
        let (p, ok) = merge(4, Some(&rt), Frames::Mixed);
        assert!(!ok);
        assert_eq!(order(&p), ["n3", "n2", "py1", "n0"]);
        // One loop frame, two groups (the native walk was cut): the
        // outer group goes to the root.
        let rt = RtStack { end: 0, marks: [0b1, 0], frames: vec![f(1, true), f(2, true)] };
        let (p, ok) = merge(2, Some(&rt), Frames::Mixed);
        assert!(!ok);
        assert_eq!(order(&p), ["py2", "n1", "py1"]);
    }

    #[test]
    fn stacks_decode_as_the_kernel_lays_them_out() {
        let mut s = rt_stack { n: 2, end: 3, marks: [0b10, 0], ..Default::default() };
        s.f[0] = rt_frame { addr: 0x1234, loc: 7, cookie: 0, flags: FLAG_ENTRY, kind: 1 };
        let b = layout::bytes_of(&s).to_vec();
        let d = RtStack::decode(&b).unwrap();
        assert_eq!(d.end, 3);
        assert!(d.marked(1) && !d.marked(0));
        assert_eq!(d.frames.len(), 2);
        assert_eq!(d.frames[0], RtFrame { addr: 0x1234, loc: 7, cookie: 0, flags: FLAG_ENTRY, kind: 1 });
        // A count past the value is cut to what it holds.
        let mut b = b;
        b[0] = 200;
        assert_eq!(RtStack::decode(&b[..24 + 32]).unwrap().frames.len(), 2);
        assert!(RtStack::decode(&b[..20]).is_none());
    }
}
