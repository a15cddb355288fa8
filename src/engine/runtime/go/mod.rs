//! Go: the runtime's own function table (`.gopclntab`), which every Go
//! binary keeps, stripped ones (`-ldflags=-s -w`) too, because the runtime
//! needs it for its tracebacks and garbage collector. From it come names,
//! source files, lines and inlined calls ([`Pclntab::frames`]), and the
//! stack-pointer delta of every instruction ([`Pclntab::sp_rows`]), which
//! the unwinder turns into table rows: Go code has no `.eh_frame`, and a
//! leaf that sets up no frame would hide its caller from a frame-pointer
//! walk.
//!
//! Formats of Go 1.16 to the newest (the header's magic says which); the
//! table is the traced program's, so every offset, count and varint is
//! checked against the bytes there are, and a malformed table is an error or
//! a frame without a name, never a panic or an endless loop.
use crate::engine::process::mem::le;

/// Table formats (by the header's magic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// Go 1.16 and 1.17 (0xfffffffa).
    Go116,
    /// Go 1.18 and 1.19 (0xfffffff0).
    Go118,
    /// Go 1.20 and later (0xfffffff1).
    Go120,
}

/// Function flags (`abi.FuncFlag`).
const FLAG_TOPFRAME: u8 = 1;
const FLAG_SPWRITE: u8 = 2;
/// `abi.PCDATA_InlTreeIndex`, `abi.FUNCDATA_InlTree`.
const PCDATA_INLTREE: u32 = 2;
const FUNCDATA_INLTREE: u32 = 3;
/// Longest name or path read.
const MAX_STR: usize = 4096;
/// Most inlined calls followed at one pc.
const MAX_INLINE: usize = 64;

/// A function's entry in the table.
#[derive(Debug, Clone, Copy)]
struct Func {
    /// Offset of its `_func` in `pclntable`.
    off: usize,
    entry: u64,
    name_off: u32,
    pcsp: u32,
    pcfile: u32,
    pcln: u32,
    npcdata: u32,
    cu_offset: u32,
    flag: u8,
    nfuncdata: u8,
    /// Where pcdata begins (bytes from `off`).
    pcdata_at: usize,
}

/// One frame at a pc: a function, its file and line; `inlined` for calls
/// the compiler inlined into the function below (their caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFrame {
    /// Function name as the Go runtime prints it (`main.work`).
    pub name: String,
    /// Source file.
    pub file: Option<String>,
    /// Source line.
    pub line: Option<u32>,
    /// Inlined into the frame outside it.
    pub inlined: bool,
}

/// A parsed `.gopclntab` (and, for inlined calls, the `go:func.*` data).
#[derive(Debug, Clone)]
pub struct Pclntab {
    data: Vec<u8>,
    /// The format.
    pub version: Version,
    ptrsize: usize,
    quantum: u64,
    nfunc: usize,
    text_start: u64,
    funcnametab: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    pclntable: usize,
    functab: usize,
    /// `go:func.*` (1.18+: funcdata are offsets from it): its address and
    /// the bytes of the section holding it, from that address on.
    gofunc: Option<(u64, Vec<u8>)>,
}

/// What a run of [`Pclntab::sp_rows`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpKind {
    /// An ordinary frame: CFA = stack pointer + delta (+ 8 on x86-64).
    Frame,
    /// The walk ends here.
    Stop,
    /// A signal handler returns through here: the interrupted registers are
    /// in the signal frame at the stack pointer.
    Signal,
    /// `runtime.asmcgocall`: C runs above it on the system stack, where it
    /// keeps the goroutine's stack depth and `g` at these byte offsets from
    /// the stack pointer (low byte the depth's, high byte g's), as
    /// [`cgo_switches`] found them (see
    /// [`crate::engine::unwind::table::Cfa::GoCgo`]).
    CgoCall(u16),
    /// `runtime.cgocallback`'s call of cgocallbackg, on the goroutine's
    /// stack: the C that called back into Go is on the system stack, where
    /// `g0.sched.sp` says (see [`CgoSwitch::Callback`]).
    CgoCallback(u32),
    /// A frame whose return address is this many bytes above the stack
    /// pointer (x29 8 below it), not at it: arm64's crosscall2
    /// ([`CgoSwitch::Crosscall2`]).
    FrameRa(u16),
}

/// A cgo stack switch the walk follows, found in the Go runtime's own code
/// ([`cgo_switches`]): where the switch keeps what leads to the other stack
/// changes between Go versions, so it is read from the instructions that
/// store it, and code that does not match keeps the walk's old end there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgoSwitch {
    /// `runtime.asmcgocall` (Go calling C).
    AsmCgoCall {
        /// Its entry.
        entry: u64,
        /// The goroutine stack's depth below `g.stack.hi` is this many
        /// bytes above the system stack's pointer...
        depth: u8,
        /// ... and `g` this many (8 above the depth on x86-64, 8 below it
        /// on arm64).
        g: u8,
    },
    /// `runtime.cgocallback` (C calling Go).
    Callback {
        /// Its entry.
        entry: u64,
        /// Its call of cgocallbackg on the goroutine's stack...
        call: u64,
        /// ... this many bytes long (x86-64: 2, arm64: 4).
        len: u8,
        /// Packed: its frame's CFA from the stack pointer, the offsets of
        /// `g.m` and of `g0.sched.sp`, and the thread-local `g`'s offset
        /// from the thread pointer; `m.g0` is m's first word. x86-64: a
        /// byte each, low byte first, the last signed. arm64 (to fit its
        /// row's 24 bits): each in 8s, 6 bits each, the last 5 bits and
        /// not negative ([`callback_how_arm64`]).
        how: u32,
    },
    /// arm64's `crosscall2` (C calling Go enters here), whose hand-written
    /// frame keeps x29 and x30 at its top, not at its stack pointer as Go's
    /// functions do.
    Crosscall2 {
        /// Its entry.
        entry: u64,
        /// From this instruction (after its `stp x29, x30, [sp, #k]`)...
        saved: u64,
        /// ... up to this one (its `ldp x29, x30, [sp, #k]`, included)...
        restored: u64,
        /// ... the return address is k + 8 bytes above the stack pointer.
        ra: u16,
    },
}

/// The cgo switches of a Go binary (`arm64`: built for arm64, else for
/// x86-64): `code(entry, end)` reads a function's first bytes.
pub fn cgo_switches(t: &Pclntab, code: &dyn Fn(u64, u64) -> Option<Vec<u8>>, arm64: bool) -> Vec<CgoSwitch> {
    let mut out = Vec::new();
    for (a, b) in t.entries_of("runtime.asmcgocall") {
        let Some(c) = code(a, (b - a).min(512)) else { continue };
        let slots = if arm64 { cgo_slots_arm64(&c) } else { cgo_depth_slot(&c).map(|d| (d, d + 8)) };
        if let Some((depth, g)) = slots {
            out.push(CgoSwitch::AsmCgoCall { entry: a, depth, g });
        }
    }
    // arm64 keeps g in x28, and in thread-local storage at an offset
    // runtime.load_g's code says.
    let tls = if arm64 {
        t.entries_of("runtime.load_g").into_iter().find_map(|(a, b)| load_g_tls_arm64(&code(a, (b - a).min(64))?))
    } else {
        None
    };
    if arm64 {
        for (a, b) in t.entries_of("crosscall2") {
            if let Some((saved, restored, ra)) = code(a, (b - a).min(256)).and_then(|c| crosscall2_arm64(&c)) {
                out.push(CgoSwitch::Crosscall2 { entry: a, saved: a + saved, restored: a + restored, ra });
            }
        }
    }
    for (a, b) in t.entries_of("runtime.cgocallback") {
        let Some(c) = code(a, (b - a).min(1024)) else { continue };
        let found = match (arm64, tls) {
            (false, _) => cgo_callback(&c).map(|(call, how)| (call, 2, how)),
            (true, Some(tls)) => cgo_callback_arm64(&c, tls).map(|(call, how)| (call, 4, how)),
            (true, None) => None,
        };
        if let Some((call, len, how)) = found {
            out.push(CgoSwitch::Callback { entry: a, call: a + call, len, how });
        }
    }
    out
}

/// The 32-bit instructions of `code`.
fn a64_words(code: &[u8]) -> Vec<u32> {
    code.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// In arm64's `runtime.load_g` (from its entry): the thread-local `g`'s
/// offset from the thread pointer, from `mrs x0, tpidr_el0; mov x27, #n
/// (or movz x27, #hi, lsl #16; movk x27, #lo); ldr x28, [x0, x27]`, the
/// local-exec form the linker writes into an executable. None otherwise (a
/// shared library's goes through its GOT).
pub fn load_g_tls_arm64(code: &[u8]) -> Option<u32> {
    let w = a64_words(code);
    let mrs = w.iter().position(|&x| x == 0xd53b_d040)?; // mrs x0, tpidr_el0
    let imm = |x: u32| (x >> 5) & 0xffff;
    let (n, ldr) = match w.get(mrs + 1..mrs + 4)? {
        // movz x27, #n (lsl 0)
        [a, l, ..] if a & 0xffe0_001f == 0xd280_001b => (imm(*a), *l),
        // movz x27, #hi, lsl #16; movk x27, #lo
        [a, b, l] if a & 0xffe0_001f == 0xd2a0_001b && b & 0xffe0_001f == 0xf280_001b => (imm(*a) << 16 | imm(*b), *l),
        _ => return None,
    };
    (ldr == 0xf87b_681c).then_some(n) // ldr x28, [x0, x27]
}

/// In arm64's `crosscall2` (from its entry): `sub sp, sp, #n`, then the
/// registers saved, `stp x29, x30, [sp, #k]` among them, and later `ldp
/// x29, x30, [sp, #k]`: the offsets of the instruction after the `stp` and
/// of the `ldp`, and k + 8 (where x30 is). None where the code is not that.
pub fn crosscall2_arm64(code: &[u8]) -> Option<(u64, u64, u16)> {
    let w = a64_words(code);
    let &first = w.first()?;
    if first & 0xff80_03ff != 0xd100_03ff || first & 0x0040_0000 != 0 {
        return None; // sub sp, sp, #n (unshifted)
    }
    let n = (first >> 10) & 0xfff;
    let k = |x: u32| ((x >> 15) & 0x7f) * 8; // imm7 (not negative here)
    let stp = w.iter().position(|&x| x & 0xffc0_7fff == 0xa900_7bfd && x & 0x0020_0000 == 0)?;
    let ldp = stp + w[stp..].iter().position(|&x| x & 0xffc0_7fff == 0xa940_7bfd)?;
    let at = k(w[stp]);
    (k(w[ldp]) == at && at + 16 <= n).then_some((stp as u64 * 4 + 4, ldp as u64 * 4, at as u16 + 8))
}

/// arm64's packing of [`CgoSwitch::Callback`]'s `how` (offsets in 8s):
/// the CFA's offset from the stack pointer (bits 0-5), g.m's (6-11),
/// g0.sched.sp's (12-17), the thread-local g's (18-22). None where one is
/// not a multiple of 8 or too large.
pub fn callback_how_arm64(cfa: u32, gm: u32, sched_sp: u32, tls: u32) -> Option<u32> {
    let f = |v: u32, bits: u32| (v % 8 == 0 && v / 8 < 1 << bits).then_some(v / 8);
    Some(f(cfa, 6)? | f(gm, 6)? << 6 | f(sched_sp, 6)? << 12 | f(tls, 5)? << 18)
}

/// In arm64's `runtime.cgocallback` (from its entry): the offset of its
/// call of cgocallbackg once on the goroutine's stack and `how`
/// ([`callback_how_arm64`]), from its prologue (`str x30, [sp, #-n]!;
/// stur x29, [sp, #-8]`: the return address at the stack pointer, the CFA
/// n above), the sequence that saves the system stack's pointer (`ldr x8,
/// [x28, #m]` for g.m; `ldr x3, [x8]; ldr x4, [x3, #s]; str x4, [sp, #k];
/// mov x0, sp; str x0, [x3, #s]` for g0.sched.sp) and the switch (`mov sp,
/// x0`) before `blr x0`; `tls` is the thread-local g's offset.
pub fn cgo_callback_arm64(code: &[u8], tls: u32) -> Option<(u64, u32)> {
    let w = a64_words(code);
    // str x30, [sp, #-n]! (pre-index, imm9 negative)
    let &[p0, p1, ..] = w.as_slice() else { return None };
    if p0 & 0xfff0_0fff != 0xf810_0ffe || p1 != 0xf81f_83fd {
        return None;
    }
    let n = 512 - ((p0 >> 12) & 0x1ff);
    let ldr_imm = |x: u32, rt_rn: u32| (x & 0xffc0_03ff == 0xf940_0000 | rt_rn).then(|| (x >> 10 & 0xfff) * 8);
    let gm = w.iter().find_map(|&x| ldr_imm(x, 28 << 5 | 8))?; // ldr x8, [x28, #m]
    let save = w.windows(5).position(|c| {
        c[0] == 0xf940_0103 // ldr x3, [x8]
            && ldr_imm(c[1], 3 << 5 | 4).is_some() // ldr x4, [x3, #s]
            && c[3] == 0x9100_03e0 // mov x0, sp
            && c[4] & 0xffc0_03ff == 0xf900_0060 // str x0, [x3, #s]
            && ldr_imm(c[1], 3 << 5 | 4) == Some((c[4] >> 10 & 0xfff) * 8)
    })?;
    let sched_sp = (w[save + 4] >> 10 & 0xfff) * 8;
    let switch = save + w[save..].iter().position(|&x| x == 0x9100_001f)?; // mov sp, x0
    let call = switch + w.get(switch..(switch + 12).min(w.len()))?.iter().position(|&x| x == 0xd63f_0000)?; // blr x0
    let how = callback_how_arm64(n, gm, sched_sp, tls)?;
    Some((call as u64 * 4, how))
}

/// In `runtime.cgocallback`'s code (from its entry): the offset of its
/// call of cgocallbackg once on the goroutine's stack, and how the walk
/// finds the system stack's frame ([`CgoSwitch::Callback`]'s `how`), from
/// its prologue (`PUSHQ BP; MOVQ SP, BP; SUBQ $n, SP`), the sequence that
/// saves the system stack's pointer (`MOVQ FS:tls, BX; MOVQ m(BX), BX;
/// MOVQ 0(BX), SI; MOVQ SP, sp(SI)`), and the switch (`SUBQ AX, DI; MOVQ
/// DI, SP`) before `CALL AX`.
pub fn cgo_callback(code: &[u8]) -> Option<(u64, u32)> {
    let &[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, n, ..] = code else { return None };
    if n % 8 != 0 || n > 0x60 {
        return None;
    }
    let (tls, gm, sp) = code.windows(20).find_map(|c| {
        let ok = c[..5] == [0x64, 0x48, 0x8b, 0x1c, 0x25]
            && c[9..12] == [0x48, 0x8b, 0x5b]
            && c[13..16] == [0x48, 0x8b, 0x33]
            && c[16..19] == [0x48, 0x89, 0x66];
        ok.then(|| (i32::from_le_bytes([c[5], c[6], c[7], c[8]]), c[12], c[19]))
    })?;
    if !(-128..0).contains(&tls) || gm % 8 != 0 || sp % 8 != 0 {
        return None;
    }
    let switch = code.windows(6).position(|w| w == [0x48, 0x29, 0xc7, 0x48, 0x89, 0xfc])? + 6;
    let after = &code[switch..code.len().min(switch + 48)];
    let call = switch + after.windows(2).position(|w| w == [0xff, 0xd0])?;
    let how = (n as u32 + 16) | (gm as u32) << 8 | (sp as u32) << 16 | (tls as i8 as u8 as u32) << 24;
    Some((call as u64, how))
}

/// Where `runtime.asmcgocall`'s code (`code`, from its entry) keeps the
/// goroutine stack's depth below `g.stack.hi` once it has switched to the
/// system stack: the byte offset from the stack pointer of its
/// `MOVQ DI, off(SP)` after `SUBQ DX, DI` (0 in 1.26, 40 in 1.21). Also
/// checks the frame-pointer prologue (`PUSHQ BP; MOVQ SP, BP`) the walk
/// relies on. None where the code is not the one known.
pub fn cgo_depth_slot(code: &[u8]) -> Option<u8> {
    if !code.starts_with(&[0x55, 0x48, 0x89, 0xe5]) {
        return None;
    }
    let sub = code.windows(3).position(|w| w == [0x48, 0x29, 0xd7])?; // SUBQ DX, DI
    let next = code.get(sub + 3..)?;
    if next.starts_with(&[0x48, 0x89, 0x3c, 0x24]) {
        return Some(0); // MOVQ DI, 0(SP)
    }
    match next {
        [0x48, 0x89, 0x7c, 0x24, off, ..] if *off < 0x80 && off % 8 == 0 => Some(*off), // MOVQ DI, off(SP)
        _ => None,
    }
}

/// Where arm64's `runtime.asmcgocall` (`code`, from its entry) keeps `g`
/// and the goroutine stack's depth below `g.stack.hi` once it has switched
/// to the system stack: (depth's, g's) byte offsets from the stack pointer,
/// from `MOVD R4, g(RSP); MOVD stack_hi(R4), R4; SUB R2, R4; MOVD R4,
/// depth(RSP)` (`str x4, [sp, #g]; ldr x4, [x4, #8]; sub x4, x4, x2; str
/// x4, [sp, #depth]`; (8, 0) in Go 1.21 to 1.26). Also checks the prologue
/// the walk relies on (`MOVD.W R30, -16(RSP); MOVD R29, -8(RSP)`: the
/// return address at the goroutine's stack pointer, x29 below it, the
/// caller's stack pointer 16 above). None where the code is not that.
pub fn cgo_slots_arm64(code: &[u8]) -> Option<(u8, u8)> {
    let w = a64_words(code);
    if w.get(..2)? != [0xf81f_0ffe, 0xf81f_83fd] {
        return None;
    }
    // str x4, [sp, #n] (64-bit, unsigned offset): n / 8 in bits 10-21.
    let str_x4_sp = |x: u32| (x & 0xffc0_03ff == 0xf900_03e4).then_some((x >> 10) & 0xfff).filter(|&n| n < 16);
    let sub = w.iter().position(|&x| x == 0xcb02_0084)?; // sub x4, x4, x2
    if sub < 2 || w[sub - 1] != 0xf940_0484 {
        return None; // ldr x4, [x4, #8]: stack.hi
    }
    let g = str_x4_sp(w[sub - 2])?;
    let depth = str_x4_sp(*w.get(sub + 1)?)?;
    (g != depth).then_some((depth as u8 * 8, g as u8 * 8))
}

/// The magic of each format.
pub fn version_of(magic: u32) -> Option<Version> {
    match magic {
        0xffff_fffa => Some(Version::Go116),
        0xffff_fff0 => Some(Version::Go118),
        0xffff_fff1 => Some(Version::Go120),
        _ => None,
    }
}

impl Pclntab {
    /// Parses a table (`data`, starting at its header). `text` is the
    /// address of the text segment's start (`runtime.text`, the `.text`
    /// section), used when the header's own is not relocated (PIE).
    pub fn parse(data: Vec<u8>, text: u64) -> Result<Pclntab, String> {
        if data.len() < 64 {
            return Err("too short for a header".into());
        }
        let version = version_of(le::<4>(&data, 0) as u32).ok_or("no Go 1.16+ magic")?;
        // The instruction size quantum: 1 on x86-64, 4 on arm64.
        let quantum = data[6] as u64;
        if data[4] != 0 || data[5] != 0 || !matches!(quantum, 1 | 4) || data[7] != 8 {
            return Err(format!(
                "not a Go table of x86-64 (quantum 1) or arm64 (quantum 4) with 8-byte pointers: quantum {}, pointer size {}",
                data[6], data[7]
            ));
        }
        let word = |i: usize| le::<8>(&data, 8 + 8 * i);
        let nfunc = word(0) as usize;
        let (text_start, first) = match version {
            Version::Go116 => (0, 2),
            _ => (if word(2) != 0 { word(2) } else { text }, 3),
        };
        let off = |i: usize| -> Result<usize, String> {
            let o = word(first + i) as usize;
            (o < data.len()).then_some(o).ok_or_else(|| format!("table offset {o} past its {} bytes", data.len()))
        };
        let t = Pclntab {
            version,
            ptrsize: 8,
            quantum,
            nfunc,
            text_start,
            funcnametab: off(0)?,
            cutab: off(1)?,
            filetab: off(2)?,
            pctab: off(3)?,
            pclntable: off(4)?,
            functab: off(4)?,
            gofunc: None,
            data,
        };
        let fs = t.field_size();
        let need = nfunc
            .checked_mul(2)
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_mul(fs))
            .ok_or("function count overflows")?;
        if nfunc == 0 || t.functab.checked_add(need).is_none_or(|e| e > t.data.len()) {
            return Err(format!("{nfunc} functions do not fit the table"));
        }
        Ok(t)
    }

    /// Gives the `go:func.*` data inlined calls are read from (1.18+).
    pub fn set_gofunc(&mut self, addr: u64, bytes: Vec<u8>) {
        self.gofunc = Some((addr, bytes));
    }

    /// The instruction size quantum of the table's architecture (1:
    /// x86-64, 4: arm64).
    pub fn quantum(&self) -> u64 {
        self.quantum
    }

    /// Whether the table is of the architecture of an ELF file's machine
    /// (`EM_X86_64`: quantum 1, `EM_AARCH64`: quantum 4).
    pub fn fits_machine(&self, machine: u16) -> bool {
        match machine {
            object::elf::EM_X86_64 => self.quantum == 1,
            object::elf::EM_AARCH64 => self.quantum == 4,
            _ => false,
        }
    }

    /// Functions in the table.
    pub fn len(&self) -> usize {
        self.nfunc
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.nfunc == 0
    }

    fn field_size(&self) -> usize {
        if self.version >= Version::Go118 {
            4
        } else {
            self.ptrsize
        }
    }

    /// Entry pc of functab slot `i` (`i == nfunc`: the end of the last).
    fn ft_pc(&self, i: usize) -> u64 {
        let fs = self.field_size();
        let at = self.functab + 2 * i * fs;
        if fs == 4 {
            self.text_start.wrapping_add(le::<4>(&self.data, at))
        } else {
            le::<8>(&self.data, at)
        }
    }

    fn ft_off(&self, i: usize) -> usize {
        let fs = self.field_size();
        let at = self.functab + (2 * i + 1) * fs;
        (if fs == 4 { le::<4>(&self.data, at) } else { le::<8>(&self.data, at) }) as usize
    }

    /// The (entry, end) of every function named `name` (an assembly
    /// function and its ABI wrapper share one).
    pub fn entries_of(&self, name: &str) -> Vec<(u64, u64)> {
        (0..self.nfunc)
            .filter_map(|i| {
                let f = self.func(i)?;
                (self.name(f.name_off).as_deref() == Some(name)).then(|| (f.entry, self.ft_pc(i + 1)))
            })
            .filter(|(a, b)| b > a)
            .collect()
    }

    /// The text the table covers: [first entry, end of the last function).
    pub fn range(&self) -> (u64, u64) {
        (self.ft_pc(0), self.ft_pc(self.nfunc))
    }

    fn func(&self, i: usize) -> Option<Func> {
        let off = self.pclntable.checked_add(self.ft_off(i))?;
        let d = &self.data;
        let sz0 = if self.version >= Version::Go118 { 4 } else { 8 };
        if off + sz0 + 44 > d.len() {
            return None;
        }
        let field = |n: usize| le::<4>(d, off + sz0 + (n - 1) * 4) as u32;
        let entry = if self.version >= Version::Go118 {
            self.text_start.wrapping_add(le::<4>(d, off))
        } else {
            le::<8>(d, off)
        };
        // funcID, flag, pad, nfuncdata after the u32 fields (8 of them, 9
        // from 1.20: startLine).
        let bytes = off + sz0 + if self.version >= Version::Go120 { 9 } else { 8 } * 4;
        // 1.16 has padding where 1.17 put the flags: 0 either way.
        let flag = d[bytes + 1];
        Some(Func {
            off,
            entry,
            name_off: field(1),
            pcsp: field(4),
            pcfile: field(5),
            pcln: field(6),
            npcdata: field(7),
            cu_offset: field(8),
            flag,
            nfuncdata: d[bytes + 3],
            pcdata_at: bytes + 4 - off,
        })
    }

    /// The function holding `pc` (a virtual address of the file).
    fn find(&self, pc: u64) -> Option<Func> {
        let (lo, hi) = self.range();
        if pc < lo || pc >= hi {
            return None;
        }
        // The last slot whose entry is <= pc.
        let (mut a, mut b) = (0usize, self.nfunc);
        while b - a > 1 {
            let m = (a + b) / 2;
            if self.ft_pc(m) <= pc {
                a = m;
            } else {
                b = m;
            }
        }
        self.func(a)
    }

    fn cstr(&self, at: usize) -> Option<String> {
        let s = self.data.get(at..)?;
        let end = s.iter().take(MAX_STR).position(|&c| c == 0)?;
        Some(String::from_utf8_lossy(&s[..end]).into_owned())
    }

    fn name(&self, off: u32) -> Option<String> {
        self.cstr(self.funcnametab.checked_add(off as usize)?)
    }

    /// The value of pc-value table `off` at `pc` in a function starting at
    /// `entry` (Go's `pcvalue`): varint pairs of (zig-zag value delta, pc
    /// delta), the value starting at -1.
    fn pcvalue(&self, off: u32, entry: u64, pc: u64) -> Option<i32> {
        let mut p = self.pctab.checked_add(off as usize)?;
        let (mut val, mut at) = (-1i32, entry);
        let mut first = true;
        loop {
            let uv = self.varint(&mut p)?;
            if uv == 0 && !first {
                return None;
            }
            first = false;
            let dv = if uv & 1 != 0 { !(uv >> 1) } else { uv >> 1 } as i32;
            let dpc = self.varint(&mut p)? as u64 * self.quantum;
            val = val.wrapping_add(dv);
            at = at.checked_add(dpc)?;
            if pc < at {
                return Some(val);
            }
        }
    }

    fn varint(&self, p: &mut usize) -> Option<u32> {
        let mut v = 0u32;
        for shift in (0..35).step_by(7) {
            let b = *self.data.get(*p)?;
            *p += 1;
            v |= ((b & 0x7f) as u32) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// Every (start, end, value) run of pc-value table `off` of `f`.
    fn runs(&self, off: u32, f: &Func, end: u64) -> Vec<(u64, u64, i32)> {
        let mut out = Vec::new();
        let Some(mut p) = self.pctab.checked_add(off as usize) else { return out };
        let (mut val, mut at) = (-1i32, f.entry);
        let mut first = true;
        while at < end {
            let Some(uv) = self.varint(&mut p) else { break };
            if uv == 0 && !first {
                break;
            }
            first = false;
            let dv = if uv & 1 != 0 { !(uv >> 1) } else { uv >> 1 } as i32;
            let Some(dpc) = self.varint(&mut p) else { break };
            val = val.wrapping_add(dv);
            let next = at.saturating_add(dpc as u64 * self.quantum).min(end);
            if next > at {
                out.push((at, next, val));
            }
            at = next;
        }
        out
    }

    fn pcdata_table(&self, f: &Func, table: u32) -> Option<u32> {
        if table >= f.npcdata {
            return None;
        }
        let v = le::<4>(&self.data, f.off + f.pcdata_at + 4 * table as usize) as u32;
        (v != 0).then_some(v)
    }

    /// The address of funcdata `i` of `f`, when it has one.
    fn funcdata(&self, f: &Func, i: u32) -> Option<u64> {
        if i >= f.nfuncdata as u32 {
            return None;
        }
        let after = f.off + f.pcdata_at + 4 * f.npcdata as usize;
        if self.version >= Version::Go118 {
            let v = le::<4>(&self.data, after + 4 * i as usize) as u32;
            let (base, _) = self.gofunc.as_ref()?;
            (v != u32::MAX).then(|| base.wrapping_add(v as u64))
        } else {
            // Pointer-aligned (the table is), absolute.
            let at = after.next_multiple_of(8);
            let v = le::<8>(&self.data, at + 8 * i as usize);
            (v != 0).then_some(v)
        }
    }

    fn gofunc_bytes(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (base, bytes) = self.gofunc.as_ref()?;
        let o = addr.checked_sub(*base)? as usize;
        bytes.get(o..o.checked_add(len)?)
    }

    fn file_line(&self, f: &Func, pc: u64) -> (Option<String>, Option<u32>) {
        let line = self.pcvalue(f.pcln, f.entry, pc).and_then(|l| u32::try_from(l).ok());
        let file = self.pcvalue(f.pcfile, f.entry, pc).and_then(|n| {
            let n = u32::try_from(n).ok()?;
            let at = self.cutab.checked_add((f.cu_offset as usize + n as usize) * 4)?;
            let off = le::<4>(&self.data, at) as u32;
            if off == u32::MAX {
                return None;
            }
            self.cstr(self.filetab.checked_add(off as usize)?)
        });
        (file, line)
    }

    /// The frames at `pc` (a virtual address of the file; a return address
    /// minus one for callers), outermost first: the function, then the
    /// calls inlined into it. None when no Go function holds `pc`.
    pub fn frames(&self, pc: u64) -> Option<Vec<GoFrame>> {
        let f = self.find(pc)?;
        let mut inner = Vec::new();
        let mut at = pc;
        if let (Some(tab), Some(tree)) = (self.pcdata_table(&f, PCDATA_INLTREE), self.funcdata(&f, FUNCDATA_INLTREE)) {
            let size = if self.version >= Version::Go120 { 16 } else { 20 };
            let (name_at, parent_at) = if self.version >= Version::Go120 { (4, 8) } else { (12, 16) };
            for _ in 0..MAX_INLINE {
                let Some(ix) = self.pcvalue(tab, f.entry, at).filter(|&i| i >= 0) else { break };
                let Some(ic) = self.gofunc_bytes(tree.wrapping_add(ix as u64 * size), size as usize) else { break };
                let name = self.name(le::<4>(ic, name_at) as u32).unwrap_or_else(|| "[unknown]".into());
                let (file, line) = self.file_line(&f, at);
                inner.push(GoFrame { name, file, line, inlined: true });
                let parent = le::<4>(ic, parent_at) as u32 as i32;
                at = f.entry.wrapping_add(parent as i64 as u64);
            }
        }
        let (file, line) = self.file_line(&f, at);
        let name = self.name(f.name_off).unwrap_or_else(|| "[unknown]".into());
        let mut out = vec![GoFrame { name, file, line, inlined: false }];
        out.extend(inner.into_iter().rev());
        Some(out)
    }

    /// For the unwinder: every function's runs of (start, end, stack
    /// pointer delta from the entry's, kind): [`SpKind::Stop`] where a stack
    /// starts (`TOPFRAME`: goexit, mstart, rt0_go) or is switched
    /// (`SPWRITE`: systemstack, mcall, morestack; as Go's own traceback,
    /// except cgocallback, which keeps both stacks walkable),
    /// [`SpKind::Signal`] for the signal handler's return trampoline,
    /// [`SpKind::CgoCall`] for asmcgocall (the C it calls leads back to the
    /// goroutine that called it, as Go's profiler shows it) and
    /// [`SpKind::CgoCallback`] for cgocallback's call into Go (it leads to
    /// the C that called), where `switches` has them ([`cgo_switches`]).
    /// Bounded by the table's own size.
    pub fn sp_rows(&self, switches: &[CgoSwitch]) -> Vec<(u64, u64, i32, SpKind)> {
        let mut out = Vec::new();
        for i in 0..self.nfunc {
            let Some(f) = self.func(i) else { continue };
            let end = self.ft_pc(i + 1);
            if end <= f.entry {
                continue;
            }
            let name = self.name(f.name_off).unwrap_or_default();
            if name.starts_with("runtime.sigreturn") {
                out.push((f.entry, end, 0, SpKind::Signal));
                continue;
            }
            let sw = |e: &CgoSwitch| match *e {
                CgoSwitch::AsmCgoCall { entry, .. }
                | CgoSwitch::Callback { entry, .. }
                | CgoSwitch::Crosscall2 { entry, .. } => entry == f.entry,
            };
            match switches.iter().find(|e| sw(e)) {
                Some(&CgoSwitch::AsmCgoCall { depth, g, .. }) => {
                    out.push((f.entry, end, 0, SpKind::CgoCall(depth as u16 | (g as u16) << 8)));
                    continue;
                }
                Some(&CgoSwitch::Callback { call, len, how, .. }) => {
                    // Its runs as any function's, but the call's own bytes
                    // (where a return address into it is looked up).
                    let len = len as u64;
                    for (a, b, v) in self.runs(f.pcsp, &f, end) {
                        let v = v.max(0);
                        if call >= a && call + len <= b {
                            out.extend([(a, call, v, SpKind::Frame), (call, call + len, v, SpKind::CgoCallback(how))]);
                            out.push((call + len, b, v, SpKind::Frame));
                        } else {
                            out.push((a, b, v, SpKind::Frame));
                        }
                    }
                    out.retain(|r| r.1 > r.0);
                    continue;
                }
                Some(&CgoSwitch::Crosscall2 { saved, restored, ra, .. }) => {
                    // Its runs as any function's, but from the save of x30
                    // to its restore (included).
                    for (a, b, v) in self.runs(f.pcsp, &f, end) {
                        let v = v.max(0);
                        let (lo, hi) = (a.max(saved), b.min(restored + 4));
                        if lo < hi {
                            out.extend([
                                (a, lo, v, SpKind::Frame),
                                (lo, hi, v, SpKind::FrameRa(ra)),
                                (hi, b, v, SpKind::Frame),
                            ]);
                        } else {
                            out.push((a, b, v, SpKind::Frame));
                        }
                    }
                    out.retain(|r| r.1 > r.0);
                    continue;
                }
                None => {}
            }
            let spwrite = f.flag & FLAG_SPWRITE != 0 && name != "runtime.cgocallback";
            let top = f.flag & FLAG_TOPFRAME != 0
                || spwrite
                || (self.version == Version::Go116
                    && matches!(name.as_str(), "runtime.goexit" | "runtime.mstart" | "runtime.rt0_go"));
            if top {
                out.push((f.entry, end, 0, SpKind::Stop));
                continue;
            }
            for (a, b, v) in self.runs(f.pcsp, &f, end) {
                out.push((a, b, v.max(0), SpKind::Frame));
            }
        }
        out
    }
}

/// Where a Go binary's table is: the `.gopclntab` section, the
/// `runtime.pclntab` symbol, or (section headers and symbols stripped) a
/// header's magic in a read-only segment. Its address and bytes.
pub fn locate(elf: &super::elfsym::ElfSyms) -> Option<(u64, Vec<u8>)> {
    if let Some(s) = elf.section(".gopclntab").or_else(|| elf.section(".data.rel.ro.gopclntab")) {
        return Some(s);
    }
    let syms = elf.find(&["runtime.pclntab", "runtime.epclntab"]);
    if let (Some(a), Some(b)) = (syms.get("runtime.pclntab"), syms.get("runtime.epclntab")) {
        if b.addr > a.addr {
            return elf.read_vaddr(a.addr, b.addr - a.addr).map(|d| (a.addr, d));
        }
    }
    // A header's magic, 8-aligned, in a segment that is not executable.
    for seg in elf.segments.iter().filter(|s| !s.exec) {
        let data = elf.read_vaddr(seg.vaddr, seg.filesz.min(super::elfsym::MAX_BYTES))?;
        let mut at = 0;
        while at + 64 <= data.len() {
            if version_of(le::<4>(&data, at) as u32).is_some() && matches!(data[at + 4..at + 8], [0, 0, 1 | 4, 8]) {
                let t = Pclntab::parse(data[at..].to_vec(), 0);
                if t.is_ok() {
                    return Some((seg.vaddr + at as u64, data[at..].to_vec()));
                }
            }
            at += 8;
        }
    }
    None
}

/// Where Go's text starts (`runtime.text`), which 1.18+ tables count
/// function entries from. The table's header says so in a binary Go linked
/// itself; linked externally (cgo) or as PIE the word is 0 in the file, and
/// C start-up code may precede Go's at the start of `.text`. In order: the
/// header, the `runtime.text` symbol, the module data's `text` word (the
/// 23rd word of the place in the data whose first word is the table's
/// address), the dynamic relocation that fills the header's word (PIE), and
/// last `.text`.
pub fn text_start(elf: &super::elfsym::ElfSyms, table: u64, data: &[u8]) -> u64 {
    let header = le::<8>(data, 24);
    if header != 0 && version_of(le::<4>(data, 0) as u32).is_some_and(|v| v >= Version::Go118) {
        return header;
    }
    if let Some(s) = elf.find(&["runtime.text"]).get("runtime.text") {
        return s.addr;
    }
    for seg in elf.segments.iter().filter(|s| !s.exec) {
        let Some(d) = elf.read_vaddr(seg.vaddr, seg.filesz.min(super::elfsym::MAX_BYTES)) else { continue };
        let mut at = 0;
        while at + 8 * 23 <= d.len() {
            if le::<8>(&d, at) == table && table != 0 {
                let text = le::<8>(&d, at + 8 * 22);
                if text != 0 {
                    return text;
                }
            }
            at += 8;
        }
    }
    // R_X86_64_RELATIVE (8) or R_AARCH64_RELATIVE (1027).
    let relative = if elf.is_x86_64() { 8 } else { 1027 };
    if let Some((_, rela)) = elf.section(".rela.dyn") {
        for r in rela.chunks_exact(24) {
            // The relocation of the header's textStart word.
            if le::<8>(r, 0) == table + 24 && le::<4>(r, 8) == relative {
                return le::<8>(r, 16);
            }
        }
    }
    elf.section(".text").map(|(a, _)| a).unwrap_or(0)
}

/// The Go table of an ELF file, with what inlined calls need, or None for a
/// file that is not Go.
pub fn load(elf: &super::elfsym::ElfSyms) -> Option<Pclntab> {
    let (addr, data) = locate(elf)?;
    let text = text_start(elf, addr, &data);
    let mut t = Pclntab::parse(data, text).ok().filter(|t| t.fits_machine(elf.machine))?;
    if t.version >= Version::Go118 {
        if let Some((base, bytes)) = find_gofunc(elf, addr, t.version, t.text_start) {
            t.set_gofunc(base, bytes);
        }
    }
    Some(t)
}

/// `runtime.firstmoduledata.gofunc`: the module data is the word-aligned
/// place in the writable data whose first word is the table's address and
/// whose `text` word is the text start; `gofunc` is the 41st word (the 39th
/// before 1.20, which added the coverage counters). The bytes from there to
/// the end of its segment. (A PIE binary's data words are relocated at load:
/// in the file they are not addresses, and inlined calls go unnamed.)
fn find_gofunc(elf: &super::elfsym::ElfSyms, table: u64, v: Version, text: u64) -> Option<(u64, Vec<u8>)> {
    let gofunc_word = if v >= Version::Go120 { 40 } else { 38 };
    for seg in elf.segments.iter().filter(|s| !s.exec) {
        let Some(data) = elf.read_vaddr(seg.vaddr, seg.filesz.min(super::elfsym::MAX_BYTES)) else { continue };
        let mut at = 0;
        while at + 8 * (gofunc_word + 1) <= data.len() {
            if le::<8>(&data, at) == table && le::<8>(&data, at + 8 * 22) == text {
                let gofunc = le::<8>(&data, at + 8 * gofunc_word);
                let holder = elf.segments.iter().find(|s| s.vaddr <= gofunc && gofunc < s.vaddr + s.filesz)?;
                let len = holder.vaddr + holder.filesz - gofunc;
                return elf.read_vaddr(gofunc, len.min(super::elfsym::MAX_BYTES)).map(|b| (gofunc, b));
            }
            at += 8;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asmcgocall_depth_slot_from_its_code() {
        // go1.26: PUSHQ BP; MOVQ SP, BP; ... SUBQ DX, DI; MOVQ DI, 0(SP)
        let new = [0x55, 0x48, 0x89, 0xe5, 0x90, 0x48, 0x29, 0xd7, 0x48, 0x89, 0x3c, 0x24, 0xe8];
        assert_eq!(cgo_depth_slot(&new), Some(0));
        // go1.21: ... SUBQ DX, DI; MOVQ DI, 40(SP)
        let old = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x29, 0xd7, 0x48, 0x89, 0x7c, 0x24, 0x28, 0x48];
        assert_eq!(cgo_depth_slot(&old), Some(40));
        // Another prologue, another store, an odd slot, cut short: unknown.
        assert_eq!(cgo_depth_slot(&old[1..]), None);
        assert_eq!(cgo_depth_slot(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x29, 0xd7, 0x48, 0x89, 0x7c, 0x24, 0x29]), None);
        assert_eq!(cgo_depth_slot(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x29, 0xd7, 0x48, 0x89]), None);
        assert_eq!(cgo_depth_slot(&[]), None);
    }

    #[test]
    fn arm64_asmcgocall_slots_from_its_code() {
        // go1.26's for linux/arm64, shortened: prologue, then the switch's
        // stores of g and of the depth below stack.hi.
        let words: [u32; 12] = [
            0xf81f0ffe, // str x30, [sp, #-16]!
            0xf81f83fd, // stur x29, [sp, #-8]
            0xd10023fd, // sub x29, sp, #0x8
            0xb400051c, // cbz x28, nosave
            0x910003e2, // mov x2, sp
            0xaa1c03e4, // mov x4, x28
            0x910001bf, // mov sp, x13
            0xf90003e4, // str x4, [sp]
            0xf9400484, // ldr x4, [x4, #8]
            0xcb020084, // sub x4, x4, x2
            0xf90007e4, // str x4, [sp, #8]
            0xd63f0020, // blr x1
        ];
        let code: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(cgo_slots_arm64(&code), Some((8, 0)));
        // Another prologue, the load of stack.hi missing, the depth's store
        // elsewhere or cut off: unknown.
        assert_eq!(cgo_slots_arm64(&code[4..]), None);
        let mut no_hi = code.clone();
        no_hi[32..36].copy_from_slice(&0xd503201fu32.to_le_bytes()); // nop
        assert_eq!(cgo_slots_arm64(&no_hi), None);
        let mut other = code.clone();
        other[40..44].copy_from_slice(&0xf90007e5u32.to_le_bytes()); // str x5, [sp, #8]
        assert_eq!(cgo_slots_arm64(&other), None);
        assert_eq!(cgo_slots_arm64(&code[..40]), None);
        for n in 0..code.len() {
            let _ = cgo_slots_arm64(&code[..n]);
        }
    }

    #[test]
    fn arm64_cgocallback_switch_and_tls_from_their_code() {
        let bytes = |w: &[u32]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        // go1.26's load_g, an executable's (local-exec) and a PIE's.
        let exe = bytes(&[0xd000075b, 0x39a91360, 0xb4000080, 0xd53bd040, 0xd280021b, 0xf87b681c, 0xd65f03c0]);
        assert_eq!(load_g_tls_arm64(&exe), Some(16));
        let pie = bytes(&[0xb000073b, 0x39a91360, 0xb40000a0, 0xd53bd040, 0xd2a0001b, 0xf280021b, 0xf87b681c]);
        assert_eq!(load_g_tls_arm64(&pie), Some(16));
        assert_eq!(load_g_tls_arm64(&exe[..20]), None);
        // go1.26's cgocallback for linux/arm64, shortened: prologue (frame
        // 48), g.m at 48, g0.sched.sp at 56 saved, the switch and blr x0.
        let mut w = vec![0xf81d0ffe, 0xf81f83fd, 0xd10023fd, 0x940004e5, 0xf9401b88, 0xf9000fe8];
        w.extend([0xf9400103, 0xf9401c64, 0xf9000be4, 0x910003e0, 0xf9001c60, 0xf9405d1c, 0x940004d9]);
        let switch = w.len();
        w.extend([0xd100c080, 0x9100001f, 0xf90007e1, 0xb0000000, 0x912ec000]);
        let call = w.len();
        w.extend([0xd63f0000, 0xf94003e5]);
        let code = bytes(&w);
        let (at, how) = cgo_callback_arm64(&code, 16).unwrap();
        assert_eq!(at, call as u64 * 4);
        assert_eq!(Some(how), callback_how_arm64(48, 48, 56, 16));
        assert_eq!(how, 6 | 6 << 6 | 7 << 12 | 2 << 18);
        // No switch, a call too far, another prologue, a TLS offset too far
        // or odd: unknown.
        assert!(cgo_callback_arm64(&code[..switch * 4], 16).is_none());
        let mut far = w[..call].to_vec();
        far.extend([0xd503201f; 12]);
        far.push(0xd63f0000);
        assert!(cgo_callback_arm64(&bytes(&far), 16).is_none());
        assert!(cgo_callback_arm64(&code[4..], 16).is_none());
        assert!(cgo_callback_arm64(&code, 256).is_none());
        assert!(cgo_callback_arm64(&code, 12).is_none());
        for n in 0..code.len() {
            let _ = cgo_callback_arm64(&code[..n], 16);
            let _ = load_g_tls_arm64(&code[..n]);
        }
    }

    #[test]
    fn arm64_crosscall2_frame_from_its_code() {
        let bytes = |w: &[u32]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        // go1.26's for linux/arm64, the float and callee-saved pairs cut.
        let w = [
            0xd10303ff, // sub sp, sp, #0xc0
            0xa90087e0, // stp x0, x1, [sp, #8]
            0xa90b7bfd, // stp x29, x30, [sp, #176]
            0x97ffec2f, // bl load_g
            0x97ffe742, // bl cgocallback
            0xa94253f3, // ldp x19, x20, [sp, #32]
            0xa94b7bfd, // ldp x29, x30, [sp, #176]
            0x910303ff, // add sp, sp, #0xc0
            0xd65f03c0, // ret
        ];
        assert_eq!(crosscall2_arm64(&bytes(&w)), Some((12, 24, 184)));
        // Another start, the pair above the frame, no restore: unknown.
        assert_eq!(crosscall2_arm64(&bytes(&w[1..])), None);
        let mut high = w;
        high[0] = 0xd102e3ff; // sub sp, sp, #0xb8
        assert_eq!(crosscall2_arm64(&bytes(&high)), None);
        assert_eq!(crosscall2_arm64(&bytes(&w[..6])), None);
    }

    #[test]
    fn cgocallback_switch_from_its_code() {
        // go1.26's and go1.21's cgocallback, shortened: prologue (frame
        // 0x18), the g0.sched.sp store, the switch and CALL AX.
        let mut code = vec![0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x18, 0x90];
        code.extend([0x64, 0x48, 0x8b, 0x1c, 0x25, 0xf8, 0xff, 0xff, 0xff]); // MOVQ FS:-8, BX
        code.extend([0x48, 0x8b, 0x5b, 0x30, 0x48, 0x8b, 0x33, 0x48, 0x89, 0x66, 0x38]); // m, g0, sched.sp
        code.extend([0x90; 7]);
        let switch = code.len();
        code.extend([0x48, 0x29, 0xc7, 0x48, 0x89, 0xfc, 0x48, 0x89, 0x1c, 0x24]);
        let call = code.len();
        code.extend([0xff, 0xd0, 0x90, 0x90]);
        let (at, how) = cgo_callback(&code).unwrap();
        assert_eq!(at, call as u64);
        assert_eq!(how, 0x28 | 0x30 << 8 | 0x38 << 16 | 0xf8 << 24);
        // No switch, a call too far, another prologue, a positive TLS offset.
        assert!(cgo_callback(&code[..switch]).is_none());
        let mut far = code[..call].to_vec();
        far.extend([0x90; 60]);
        far.extend([0xff, 0xd0]);
        assert!(cgo_callback(&far).is_none());
        assert!(cgo_callback(&code[1..]).is_none());
        let mut pos = code.clone();
        pos[14..18].copy_from_slice(&8i32.to_le_bytes());
        assert!(cgo_callback(&pos).is_none());
        for n in 0..code.len() {
            let _ = cgo_callback(&code[..n]);
        }
    }

    #[test]
    fn garbage_tables_are_errors_not_panics() {
        assert!(Pclntab::parse(vec![0; 10], 0).is_err());
        let mut h = vec![0u8; 128];
        h[..4].copy_from_slice(&0xffff_fff1u32.to_le_bytes());
        h[6] = 1;
        h[7] = 8;
        // A function count far past the bytes.
        h[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Pclntab::parse(h.clone(), 0).is_err());
        // Offsets past the end.
        h[8..16].copy_from_slice(&1u64.to_le_bytes());
        h[32..40].copy_from_slice(&9999u64.to_le_bytes());
        assert!(Pclntab::parse(h, 0).is_err());
    }
}

/// Per Go binary path (as its frames' `module` shows it), the module paths
/// without a dot in their first element (`go mod init myapp`) the binaries
/// seen there are built from (those of two containers' binaries at one
/// path, together): their packages look like the standard library's by
/// name, and are the program's own. At most [`MAX_DOTLESS`] paths, 64
/// module paths each of at most 256 bytes.
static DOTLESS_MODULES: std::sync::Mutex<std::collections::BTreeMap<String, Vec<String>>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());
/// Most binaries [`DOTLESS_MODULES`] keeps.
const MAX_DOTLESS: usize = 1024;

/// The first element of a package path (`net` of `net/http`).
fn first_element(path: &str) -> &str {
    path.split('/').next().unwrap_or("")
}

/// Notes the modules Go binary `elf`, shown as `module` in its frames, is
/// built from (its build information, `.go.buildinfo`, Go 1.18 and later)
/// so that [`library_frame`] tells their packages from the standard
/// library's.
pub fn note_modules(elf: &super::elfsym::ElfSyms, module: &str) {
    let Some(mods) = elf.section(".go.buildinfo").and_then(|(_, data)| buildinfo_modules(&data)) else { return };
    let dotless: Vec<String> = mods
        .into_iter()
        .filter(|m| !m.is_empty() && m.len() <= 256 && !first_element(m).contains('.'))
        .take(64)
        .collect();
    let mut map = DOTLESS_MODULES.lock().unwrap_or_else(|e| e.into_inner());
    if dotless.is_empty() || (map.len() >= MAX_DOTLESS && !map.contains_key(module)) {
        return;
    }
    // Added to, not replaced: two containers' binaries may show one path.
    let kept = map.entry(module.to_string()).or_default();
    for m in dotless {
        if kept.len() < 64 && !kept.contains(&m) {
            kept.push(m);
        }
    }
}

/// Reads a Go varint-prefixed string at `*at` (Go's binary.Uvarint).
fn varint_bytes<'a>(data: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let mut n: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *data.get(*at)?;
        *at += 1;
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            let end = at.checked_add(usize::try_from(n).ok()?)?;
            let s = data.get(*at..end)?;
            *at = end;
            return Some(s);
        }
    }
    None
}

/// The module paths (main module, dependencies, replacements) in a Go
/// binary's build information, or None where it is not the inline form of
/// Go 1.18 and later.
fn buildinfo_modules(data: &[u8]) -> Option<Vec<String>> {
    // 14 bytes of magic, the pointer size, flags (bit 1: strings inline),
    // padding to 32; then the Go version and the module text, each
    // varint-prefixed; the module text between two 16-byte sentinels.
    if data.len() < 32 || &data[..14] != b"\xff Go buildinf:" || data[15] & 2 == 0 {
        return None;
    }
    let mut at = 32;
    varint_bytes(data, &mut at)?;
    let mut mods = varint_bytes(data, &mut at)?;
    if mods.len() >= 33 && mods[mods.len() - 17] == b'\n' {
        mods = &mods[16..mods.len() - 16];
    }
    let text = std::str::from_utf8(mods).ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let mut f = l.split('\t');
                matches!(f.next()?, "mod" | "dep" | "=>").then(|| f.next()).flatten().map(str::to_string)
            })
            .collect(),
    )
}

/// Whether Go function `name` of binary `module` is the toolchain's own (its
/// runtime and standard library: a package path without a dot in its first
/// element, as `runtime.gopark`, `sync.(*Mutex).Unlock`,
/// `internal/poll.(*FD).Read`), not the program's or a module's
/// (`github.com/x/y.F`, `main.main`, and a package of a dotless module the
/// binary is built from, as `myapp/worker.Run`: see [`note_modules`]).
pub fn library_frame(name: &str, module: &str) -> bool {
    let pkg = match name.rfind('/') {
        Some(i) => &name[..i + name[i..].find('.').unwrap_or(name.len() - i)],
        None => name.split('.').next().unwrap_or(""),
    };
    let first = first_element(pkg);
    if first.is_empty() || first == "main" || first.contains('.') {
        return false;
    }
    let map = DOTLESS_MODULES.lock().unwrap_or_else(|e| e.into_inner());
    !map.get(module).is_some_and(|mods| {
        mods.iter().any(|m| pkg == m || pkg.strip_prefix(m.as_str()).is_some_and(|r| r.starts_with('/')))
    })
}

#[cfg(test)]
mod library_tests {
    #[test]
    fn the_toolchains_packages_are_library_frames() {
        for n in ["runtime.gopark", "sync.(*Mutex).Unlock", "internal/poll.(*FD).Read", "net/http.(*conn).serve"] {
            assert!(super::library_frame(n, "/bin/x"), "{n}");
        }
        for n in ["main.main", "main.worker.func1", "github.com/x/y.F", "golang.org/x/sync/errgroup.(*Group).Go"] {
            assert!(!super::library_frame(n, "/bin/x"), "{n}");
        }
    }

    /// The build information as Go 1.18+ writes it, with a dotless main
    /// module: its packages are the program's once noted.
    #[test]
    fn packages_of_a_dotless_module_are_the_programs() {
        let mods = "path\tsondeunit/cmd/x\nmod\tsondeunit\t(devel)\t\ndep\tgithub.com/a/b\tv1.0.0\th1:x=\n";
        let body = [&[0x30u8; 16][..], mods.as_bytes(), &[0x31u8; 16][..]].concat();
        let mut blob = b"\xff Go buildinf:".to_vec();
        blob.extend([8u8, 2]);
        blob.resize(32, 0);
        blob.extend([6u8]);
        blob.extend(b"go1.26");
        // The module text's length as a two-byte varint (its continuation followed).
        blob.extend([(body.len() as u8 & 0x7f) | 0x80, (body.len() >> 7) as u8]);
        blob.extend(&body);
        let got = super::buildinfo_modules(&blob).unwrap();
        assert_eq!(got, ["sondeunit", "github.com/a/b"]);
        let lib = |n: &str, m: &str| super::library_frame(n, m);
        assert!(lib("sondeunit/worker.Run", "/srv/app"));
        super::DOTLESS_MODULES.lock().unwrap().insert("/srv/app".into(), vec![got[0].clone()]);
        assert!(!lib("sondeunit/worker.Run", "/srv/app"));
        assert!(!lib("sondeunit.F", "/srv/app"));
        assert!(lib("sondeunit/worker.Run", "/srv/other"), "another binary's modules are its own");
        assert!(lib("sondeunitx/worker.Run", "/srv/app"), "a longer path is another module");
        assert!(lib("runtime.gopark", "/srv/app"));
        // Truncated or pre-1.18 blobs: nothing.
        assert!(super::buildinfo_modules(&blob[..40]).is_none());
        blob[15] = 0;
        assert!(super::buildinfo_modules(&blob).is_none());
    }
}
