//! Unwind tables: for every address of an executable's code, how to find
//! its caller's frame, reduced from DWARF call-frame information (CFI) to
//! the few rules the kernel walk (`src/bpf/unwind.h`) evaluates.
//!
//! For x86-64 and AArch64 (the ELF file's machine picks: [`Arch`]). A
//! frame's caller is found from the CFA (canonical frame address: the stack
//! pointer before the call), which is the caller's stack pointer. The rules
//! kept, naming x86-64's registers (on AArch64 the stack pointer is sp and
//! the frame pointer x29):
//!
//! - CFA = rsp + n or rbp + n (nearly every row of compiled code);
//! - CFA of a PLT stub (GCC/binutils' expression on rip & 15; x86-64);
//! - CFA = *(rsp + n) or *(rbp + n) (functions that realign their stack);
//! - rbp saved at CFA + n, saved at rbp + n, or unchanged;
//! - the return address at CFA - 8 (always, on x86-64); on AArch64 saved
//!   at CFA + n (with x29 saved just below it, as `stp x29, x30` does, or
//!   not saved) or still in the link register x30 (a prologue that has not
//!   saved it yet, a leaf function);
//! - the outermost frame (return address undefined: `_start`, `clone3`);
//! - a signal trampoline (`__restore_rt`, AArch64's `__kernel_rt_sigreturn`
//!   in the vDSO: registers in the signal frame);
//! - a gap (no CFI: the walk uses the frame pointer there).
//!
//! Anything else (other registers, other expressions) becomes an
//! "unsupported" row: the walk ends there and says why. Pointer
//! authentication codes in AArch64 return addresses are the walk's to strip
//! (`DW_CFA_AARCH64_negate_ra_state` only says they are there).
//!
//! FDEs are visited in the order of their own start addresses (collected,
//! 16 bytes each, and sorted), so rows stream straight into the output, which
//! is the only memory that grows with the file (16 bytes per row).
//! `.eh_frame_hdr`'s search table is not used for this: a copy of a library
//! with an edited header but the same `.eh_frame` would otherwise build a
//! different table under the same cache key.
//!
//! A crafted file can make CFI costly to evaluate (a CIE whose initial
//! instructions are megabytes of no-ops, run again for every FDE): the bytes
//! of instructions evaluated are budgeted ([`WORK_PER_BYTE`] times the
//! section's size) and a build stops after [`MAX_BUILD`].
use gimli::{
    AArch64, BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Operation, Register,
    RegisterRule, UnwindContext, UnwindSection, Vendor, X86_64,
};

use super::{elf::ElfUnwindInfo, UnwindError};

/// Most rows one table may have (16 bytes each here, 8 in the kernel).
pub const MAX_ROWS: usize = 16 << 20;
/// Bytes of call-frame instructions a build may evaluate per byte of the
/// section (CIE initial instructions count once per FDE using them).
pub const WORK_PER_BYTE: u64 = 8;
/// Longest a build may take.
pub const MAX_BUILD: std::time::Duration = std::time::Duration::from_secs(5);

/// The instruction set a table is for: the ELF file's machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Arch {
    /// x86-64.
    #[default]
    X86_64,
    /// AArch64 (arm64).
    Aarch64,
}

impl Arch {
    /// The architecture sonde is built for, when the walk knows its rules.
    pub fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// Its name, as users know it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86-64",
            Arch::Aarch64 => "AArch64",
        }
    }

    /// How gimli reads vendor call-frame instructions (AArch64's
    /// `DW_CFA_AARCH64_negate_ra_state` shares its number with SPARC's
    /// `DW_CFA_GNU_window_save`).
    fn vendor(self) -> Vendor {
        match self {
            Arch::X86_64 => Vendor::Default,
            Arch::Aarch64 => Vendor::AArch64,
        }
    }

    /// DWARF numbers of the stack pointer, frame pointer and the register
    /// that holds the return address.
    pub fn regs(self) -> [Register; 3] {
        match self {
            Arch::X86_64 => [X86_64::RSP, X86_64::RBP, X86_64::RA],
            Arch::Aarch64 => [AArch64::SP, AArch64::X29, AArch64::X30],
        }
    }
}

/// How to find the CFA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cfa {
    /// No CFI covers this address.
    Gap,
    /// CFA = rsp + n.
    Rsp(i32),
    /// CFA = rbp + n.
    Rbp(i32),
    /// A PLT stub: CFA = rsp + 8, plus 8 when (rip & 15) >= the threshold
    /// (the stub has pushed its relocation index by then).
    Plt(u8),
    /// CFA = *(rsp + n).
    DerefRsp(i32),
    /// CFA = *(rbp + n).
    DerefRbp(i32),
    /// The outermost frame: there is no caller.
    Stop,
    /// A signal trampoline: the interrupted frame's registers are saved in
    /// the signal frame at the stack pointer.
    Signal,
    /// Go's `asmcgocall` once it has switched to the system stack to run
    /// C: its own frame (saved rbp and return address; on arm64 the return
    /// address with x29 below it) is on the goroutine's stack at
    /// `g.stack.hi - [rsp + d]`, with the goroutine `g` at `[rsp + g]` (or
    /// at `[rsp + d]` itself where `g` is 0: it was on the system stack
    /// already); CFA = that + 16. The value packs d (low byte) and g.
    GoCgo(u16),
    /// Go's `cgocallback`, returned to on the goroutine's stack: the C that
    /// called back into Go is on the system stack, whose pointer the walk
    /// finds through the thread's `g`, its `m`, and `m.g0.sched.sp`; the
    /// packed offsets are [`crate::engine::runtime::go::CgoSwitch::Callback`]'s
    /// (packed per architecture: `ARCH_GO_CB_*` in the kernel's arch.h).
    GoCallback(u32),
    /// A rule the kernel walk does not evaluate.
    Unsupported,
}

/// Where the caller's rbp is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SavedRbp {
    /// Not changed by this frame.
    Same,
    /// Saved at CFA + n.
    AtCfa(i32),
    /// Saved at rbp + n (functions that realign their stack).
    AtRbp(i32),
    /// Not recoverable here (a rule the walk does not evaluate).
    Unknown,
}

/// Where the return address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ra {
    /// At CFA - 8 (x86-64's call pushes it there).
    Cfa8,
    /// Still in the link register (AArch64's x30): only the innermost frame
    /// (or one a signal interrupted) knows it.
    Lr,
    /// Saved at CFA + n (AArch64).
    AtCfa(i32),
}

/// One row's rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    /// How to find the CFA.
    pub cfa: Cfa,
    /// Where the caller's rbp (x29) is.
    pub rbp: SavedRbp,
    /// Where the return address is.
    pub ra: Ra,
}

impl Rule {
    /// No CFI here.
    pub const GAP: Rule = Rule { cfa: Cfa::Gap, rbp: SavedRbp::Same, ra: Ra::Cfa8 };

    /// A rule whose return address is at CFA - 8.
    pub const fn new(cfa: Cfa, rbp: SavedRbp) -> Rule {
        Rule { cfa, rbp, ra: Ra::Cfa8 }
    }
}

// The kernel's row: bits 0-15 the address within its 64 KiB page (added when
// pages are laid out), then these fields. Keep in sync with unwind.h and
// arch.h (ARCH_ROW_OFF, ARCH_ROW_FP_OFF, ARCH_ROW_RA_OFF). x86-64: the CFA
// offset is bits 32-63, rbp's bits 24-31 (in 8s). AArch64: the CFA offset
// is bits 40-63; bits 22-23 say whether the return address is saved or in
// x30; bits 24-39 are a save slot (in 8s): the return address's when it is
// saved, with x29, when saved, 8 below it (compilers save the two as a
// pair); x29's otherwise.
const CFA_SHIFT: u32 = 16;
const RBP_SHIFT: u32 = 20;
const RA_SHIFT: u32 = 22;
const RBP_OFF_SHIFT: u32 = 24;
const OFF_SHIFT: u32 = 32;
const A64_OFF_SHIFT: u32 = 40;
/// The largest CFA offset an AArch64 row holds (24 bits, signed).
const A64_OFF_MAX: i32 = (1 << 23) - 1;
/// The largest save slot offset an AArch64 row holds (16 bits of 8s).
const A64_SLOT_MAX: i32 = 32767 * 8;

/// CFA kinds, as `unwind.h` names them.
pub mod kind {
    /// No CFI.
    pub const GAP: u64 = 0;
    /// rsp + off.
    pub const RSP: u64 = 1;
    /// rbp + off.
    pub const RBP: u64 = 2;
    /// PLT stub, off = threshold.
    pub const PLT: u64 = 3;
    /// *(rsp + off).
    pub const DEREF_RSP: u64 = 4;
    /// *(rbp + off).
    pub const DEREF_RBP: u64 = 5;
    /// Outermost frame.
    pub const STOP: u64 = 6;
    /// Signal trampoline.
    pub const SIGNAL: u64 = 7;
    /// Not evaluated.
    pub const UNSUPPORTED: u64 = 8;
    /// Go's asmcgocall on the system stack.
    pub const GO_CGO: u64 = 9;
    /// Go's cgocallback on the goroutine's stack.
    pub const GO_CALLBACK: u64 = 10;
    /// rbp unchanged.
    pub const RBP_SAME: u64 = 0;
    /// rbp at CFA + rbp_off * 8.
    pub const RBP_AT_CFA: u64 = 1;
    /// rbp at rbp + rbp_off * 8.
    pub const RBP_AT_RBP: u64 = 2;
    /// rbp unknown.
    pub const RBP_UNKNOWN: u64 = 3;
    /// Return address saved (x86-64: at CFA - 8; AArch64: at CFA + slot).
    pub const RA_SAVED: u64 = 0;
    /// Return address in the link register.
    pub const RA_LR: u64 = 1;
}

impl Rule {
    /// Whether `arch`'s row holds this rule (an AArch64 row has 24 bits for
    /// the CFA's offset, one save slot, and not x86-64's PLT kind; Go's
    /// cgocallback packs its offsets to fit, [`crate::engine::runtime::go::callback_how_arm64`]).
    pub fn fits(self, arch: Arch) -> bool {
        match arch {
            Arch::X86_64 => self.ra == Ra::Cfa8,
            Arch::Aarch64 => {
                let slot = |n: i32| n % 8 == 0 && (-A64_SLOT_MAX - 8..=A64_SLOT_MAX).contains(&n);
                let cfa = match self.cfa {
                    // No caller's registers to find.
                    Cfa::Gap | Cfa::Stop | Cfa::Signal | Cfa::Unsupported => return true,
                    Cfa::Plt(_) => false,
                    Cfa::GoCgo(_) => true,
                    Cfa::GoCallback(how) => how >> 23 == 0,
                    Cfa::Rsp(n) | Cfa::Rbp(n) | Cfa::DerefRsp(n) | Cfa::DerefRbp(n) => {
                        (-A64_OFF_MAX..=A64_OFF_MAX).contains(&n)
                    }
                };
                let saves = match (self.ra, self.rbp) {
                    (Ra::Cfa8, _) => false,
                    (Ra::AtCfa(n), SavedRbp::Same | SavedRbp::Unknown) => slot(n),
                    (Ra::AtCfa(n), SavedRbp::AtCfa(f)) => slot(n) && f == n - 8,
                    (Ra::AtCfa(_), SavedRbp::AtRbp(_)) => false,
                    (Ra::Lr, SavedRbp::AtCfa(f) | SavedRbp::AtRbp(f)) => slot(f),
                    (Ra::Lr, _) => true,
                };
                cfa && saves
            }
        }
    }

    /// The row bits above the page offset (bits 16-63) for `arch`; a rule
    /// that does not [`fit`](Rule::fits) is encoded as unsupported.
    pub fn encode(self, arch: Arch) -> u64 {
        let r =
            if self.fits(arch) { self } else { Rule { cfa: Cfa::Unsupported, rbp: SavedRbp::Unknown, ra: Ra::Cfa8 } };
        let (k, off) = match r.cfa {
            Cfa::Gap => (kind::GAP, 0),
            Cfa::Rsp(n) => (kind::RSP, n),
            Cfa::Rbp(n) => (kind::RBP, n),
            Cfa::Plt(t) => (kind::PLT, t as i32),
            Cfa::DerefRsp(n) => (kind::DEREF_RSP, n),
            Cfa::DerefRbp(n) => (kind::DEREF_RBP, n),
            Cfa::Stop => (kind::STOP, 0),
            Cfa::Signal => (kind::SIGNAL, 0),
            Cfa::GoCgo(n) => (kind::GO_CGO, n as i32),
            Cfa::GoCallback(how) => (kind::GO_CALLBACK, how as i32),
            Cfa::Unsupported => (kind::UNSUPPORTED, 0),
        };
        let (rk, roff) = match r.rbp {
            SavedRbp::Same => (kind::RBP_SAME, 0i32),
            SavedRbp::AtCfa(n) => (kind::RBP_AT_CFA, n),
            SavedRbp::AtRbp(n) => (kind::RBP_AT_RBP, n),
            SavedRbp::Unknown => (kind::RBP_UNKNOWN, 0),
        };
        let (ra, slot) = match r.ra {
            Ra::Cfa8 => (kind::RA_SAVED, roff),
            Ra::AtCfa(n) => (kind::RA_SAVED, n),
            Ra::Lr => (kind::RA_LR, roff),
        };
        let kinds = (k << CFA_SHIFT) | (rk << RBP_SHIFT) | (ra << RA_SHIFT);
        match arch {
            Arch::X86_64 => {
                kinds | ((((roff / 8) as i8) as u8 as u64) << RBP_OFF_SHIFT) | ((off as u32 as u64) << OFF_SHIFT)
            }
            Arch::Aarch64 => {
                kinds
                    | ((((slot / 8) as i16) as u16 as u64) << RBP_OFF_SHIFT)
                    | (((off as u32 as u64) & 0xff_ffff) << A64_OFF_SHIFT)
            }
        }
    }

    /// The inverse of [`Rule::encode`] (the page offset bits are ignored).
    pub fn decode(row: u64, arch: Arch) -> Rule {
        let ra_saved = (row >> RA_SHIFT) & 0x3 == kind::RA_SAVED;
        let (off, roff, ra) = match arch {
            Arch::X86_64 => {
                ((row >> OFF_SHIFT) as u32 as i32, ((row >> RBP_OFF_SHIFT) as u8 as i8 as i32) * 8, Ra::Cfa8)
            }
            Arch::Aarch64 => {
                let slot = ((row >> RBP_OFF_SHIFT) as u16 as i16 as i32) * 8;
                let off = ((row as i64) >> A64_OFF_SHIFT) as i32;
                if ra_saved {
                    (off, slot - 8, Ra::AtCfa(slot))
                } else {
                    (off, slot, Ra::Lr)
                }
            }
        };
        let cfa = match (row >> CFA_SHIFT) & 0xf {
            kind::GAP => Cfa::Gap,
            kind::RSP => Cfa::Rsp(off),
            kind::RBP => Cfa::Rbp(off),
            kind::PLT => Cfa::Plt(off as u8),
            kind::DEREF_RSP => Cfa::DerefRsp(off),
            kind::DEREF_RBP => Cfa::DerefRbp(off),
            kind::STOP => Cfa::Stop,
            kind::SIGNAL => Cfa::Signal,
            kind::GO_CGO => Cfa::GoCgo(off as u16),
            kind::GO_CALLBACK => Cfa::GoCallback(off as u32),
            _ => Cfa::Unsupported,
        };
        let rbp = match (row >> RBP_SHIFT) & 0x3 {
            kind::RBP_SAME => SavedRbp::Same,
            kind::RBP_AT_CFA => SavedRbp::AtCfa(roff),
            kind::RBP_AT_RBP => SavedRbp::AtRbp(roff),
            _ => SavedRbp::Unknown,
        };
        // Rules without a return address decode as the builder makes them.
        let ra = match (arch, cfa) {
            (Arch::Aarch64, Cfa::Gap | Cfa::Stop | Cfa::Signal | Cfa::Unsupported) => Ra::Cfa8,
            _ => ra,
        };
        Rule { cfa, rbp, ra }
    }
}

/// A row: from `addr` (ELF virtual address) up to the next row's, `rule`
/// holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// First address.
    pub addr: u64,
    /// Encoded rule ([`Rule::encode`]).
    pub rule: u64,
}

/// What building a table found, for `sonde doctor`-style reports and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BuildStats {
    /// FDEs read.
    pub fdes: u64,
    /// CFI rows before merging.
    pub cfi_rows: u64,
    /// Rows with a CFA rule the walk does not evaluate.
    pub unsupported_cfa: u64,
    /// Rows whose saved rbp the walk cannot recover.
    pub unknown_rbp: u64,
    /// FDEs that could not be parsed (skipped).
    pub bad_fdes: u64,
    /// Rows taken from `.debug_frame`.
    pub debug_frame_rows: u64,
}

/// An executable's table: rows sorted by address; the last one is a gap
/// that ends the covered range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// The rows.
    pub rows: Vec<Row>,
    /// What the build found.
    pub stats: BuildStats,
    /// The instruction set its rows are encoded for.
    pub arch: Arch,
}

impl Table {
    /// The rule at virtual address `addr` (a binary search; what the kernel
    /// walk does through its page index).
    pub fn lookup(&self, addr: u64) -> Rule {
        let i = self.rows.partition_point(|r| r.addr <= addr);
        if i == 0 {
            return Rule::GAP;
        }
        Rule::decode(self.rows[i - 1].rule, self.arch)
    }
}

/// Appends rows in address order, merging equal neighbours and filling the
/// space between FDEs with gaps.
struct Builder {
    rows: Vec<Row>,
    end: Option<u64>,
    stats: BuildStats,
    arch: Arch,
}

impl Builder {
    fn new(arch: Arch) -> Builder {
        Builder { rows: Vec::new(), end: None, stats: BuildStats::default(), arch }
    }

    fn push_one(&mut self, addr: u64, rule: u64) -> Result<(), UnwindError> {
        if let Some(last) = self.rows.last_mut() {
            if last.addr == addr {
                last.rule = rule;
                let n = self.rows.len();
                // The replaced row may now equal the one before it.
                if n >= 2 && self.rows[n - 2].rule == rule {
                    self.rows.pop();
                }
                return Ok(());
            }
            if last.rule == rule {
                return Ok(());
            }
        }
        if self.rows.len() >= MAX_ROWS {
            return Err(UnwindError::TooBig(format!("more than {MAX_ROWS} unwind rows")));
        }
        self.rows.push(Row { addr, rule });
        Ok(())
    }

    /// Adds `rule` over [start, end); the part of it already covered is
    /// dropped (the first source wins).
    fn add(&mut self, mut start: u64, end: u64, rule: Rule) -> Result<(), UnwindError> {
        if let Some(e) = self.end {
            if start < e {
                if end <= e {
                    return Ok(());
                }
                start = e;
            } else if start > e && !(start - e < 16 && start % 16 == 0) {
                // A gap, unless it is only the padding that aligns the next
                // function (never executed, never a return address: those
                // are looked up at pc - 1): the row before covers it, which
                // saves a row per function (~10% of the table).
                self.push_one(e, Rule::GAP.encode(self.arch))?;
            }
        }
        if end <= start {
            return Ok(());
        }
        self.push_one(start, rule.encode(self.arch))?;
        self.end = Some(end);
        Ok(())
    }

    fn finish(mut self) -> Result<Table, UnwindError> {
        if let Some(e) = self.end {
            self.push_one(e, Rule::GAP.encode(self.arch))?;
        }
        Ok(Table { rows: self.rows, stats: self.stats, arch: self.arch })
    }
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Matches a CFA expression against the patterns the walk knows.
fn cfa_expression(expr: gimli::Expression<Slice<'_>>, encoding: gimli::Encoding, arch: Arch) -> Cfa {
    let mut ops = Vec::new();
    let mut it = expr.operations(encoding);
    while let Ok(Some(op)) = it.next() {
        if ops.len() > 12 {
            return Cfa::Unsupported;
        }
        ops.push(op);
    }
    let [sp, fp, _] = arch.regs();
    use Operation::*;
    match ops.as_slice() {
        // GCC/binutils PLT: rsp + 8 + (((rip & 15) >= T) << 3).
        [RegisterOffset { register: X86_64::RSP, offset: 8, .. }, RegisterOffset { register: X86_64::RA, offset: 0, .. }, UnsignedConstant { value: 15 }, And, UnsignedConstant { value: t }, Ge, UnsignedConstant { value: 3 }, Shl, Plus]
            if *t < 16 && arch == Arch::X86_64 =>
        {
            Cfa::Plt(*t as u8)
        }
        [RegisterOffset { register, offset, .. }, Deref { .. }] => match (*register, i32::try_from(*offset)) {
            (r, Ok(n)) if r == sp => Cfa::DerefRsp(n),
            (r, Ok(n)) if r == fp => Cfa::DerefRbp(n),
            _ => Cfa::Unsupported,
        },
        _ => Cfa::Unsupported,
    }
}

/// The range of frame-pointer save offsets a row holds (8-byte slots: i8 on
/// x86-64, i16 on AArch64).
fn fp_offset_fits(n: i64, arch: Arch) -> bool {
    let max = match arch {
        Arch::X86_64 => 127i64,
        Arch::Aarch64 => 32767,
    };
    n % 8 == 0 && (-(max + 1) * 8..=max * 8).contains(&n)
}

/// The caller's rbp (x29) from a register rule.
fn saved_rbp<'a>(
    rule: Option<RegisterRule<usize>>,
    expr: &dyn Fn(gimli::UnwindExpression<usize>) -> Option<gimli::Expression<Slice<'a>>>,
    encoding: gimli::Encoding,
    arch: Arch,
) -> SavedRbp {
    let fits = |n: i64| fp_offset_fits(n, arch);
    let fp = arch.regs()[1];
    match rule {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => SavedRbp::Same,
        Some(RegisterRule::Offset(n)) if fits(n) => SavedRbp::AtCfa(n as i32),
        Some(RegisterRule::Expression(e)) => {
            let Some(expr) = expr(e) else { return SavedRbp::Unknown };
            let mut it = expr.operations(encoding);
            match (it.next(), it.next()) {
                (Ok(Some(Operation::RegisterOffset { register, offset, .. })), Ok(None))
                    if register == fp && fits(offset) =>
                {
                    SavedRbp::AtRbp(offset as i32)
                }
                _ => SavedRbp::Unknown,
            }
        }
        Some(_) => SavedRbp::Unknown,
    }
}

/// Where the return address is, from its register's rule; `None` for the
/// outermost frame (undefined), `Err` for a rule the walk does not follow.
fn saved_ra(rule: Option<RegisterRule<usize>>, arch: Arch) -> Result<Option<Ra>, ()> {
    match (arch, rule) {
        (_, Some(RegisterRule::Undefined)) => Ok(None),
        (Arch::X86_64, None | Some(RegisterRule::Offset(-8))) => Ok(Some(Ra::Cfa8)),
        (Arch::Aarch64, None | Some(RegisterRule::SameValue)) => Ok(Some(Ra::Lr)),
        (Arch::Aarch64, Some(RegisterRule::Offset(n))) => i32::try_from(n).map(|n| Some(Ra::AtCfa(n))).map_err(|_| ()),
        _ => Err(()),
    }
}

/// The compact rule of one CFI row.
fn rule_of<'a, S: UnwindSection<Slice<'a>>>(
    row: &gimli::UnwindTableRow<usize>,
    section: &S,
    encoding: gimli::Encoding,
    signal: bool,
    stats: &mut BuildStats,
    arch: Arch,
) -> Rule {
    let expr = |e: gimli::UnwindExpression<usize>| e.get(section).ok();
    if signal {
        return Rule::new(Cfa::Signal, SavedRbp::Unknown);
    }
    let [sp, fp, ra] = arch.regs();
    let unsupported = Rule::new(Cfa::Unsupported, SavedRbp::Unknown);
    let rbp = saved_rbp(row.register(fp), &expr, encoding, arch);
    let ra = match saved_ra(row.register(ra), arch) {
        Ok(Some(r)) => r,
        Ok(None) => return Rule::new(Cfa::Stop, SavedRbp::Same),
        Err(()) => {
            stats.unsupported_cfa += 1;
            return unsupported;
        }
    };
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => match (*register, i32::try_from(*offset)) {
            (r, Ok(n)) if r == sp => Cfa::Rsp(n),
            (r, Ok(n)) if r == fp => Cfa::Rbp(n),
            _ => Cfa::Unsupported,
        },
        CfaRule::Expression(e) => match expr(*e) {
            Some(x) => cfa_expression(x, encoding, arch),
            None => Cfa::Unsupported,
        },
    };
    if cfa == Cfa::Unsupported {
        stats.unsupported_cfa += 1;
        return unsupported;
    }
    if rbp == SavedRbp::Unknown {
        stats.unknown_rbp += 1;
    }
    let r = Rule { cfa, rbp, ra };
    if !r.fits(arch) {
        stats.unsupported_cfa += 1;
        return unsupported;
    }
    r
}

/// Rows of the FDEs at `offsets` (sorted by address) of one section.
fn rows_of<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    offsets: &[usize],
    b: &mut Builder,
    ctx: &mut UnwindContext<usize>,
    section_len: usize,
) -> Result<(), UnwindError>
where
    S: UnwindSection<Slice<'a>>,
{
    let budget = (section_len as u64).saturating_mul(WORK_PER_BYTE).saturating_add(1 << 20);
    let (mut work, t0) = (0u64, std::time::Instant::now());
    for (i, &off) in offsets.iter().enumerate() {
        if i % 256 == 255 && t0.elapsed() > MAX_BUILD {
            return Err(UnwindError::TooBig(format!("building the table took over {} s", MAX_BUILD.as_secs())));
        }
        let fde = match section.fde_from_offset(bases, S::Offset::from(off), S::cie_from_offset) {
            Ok(f) => f,
            Err(_) => {
                b.stats.bad_fdes += 1;
                continue;
            }
        };
        b.stats.fdes += 1;
        work = work.saturating_add(fde.cie().entry_len() as u64).saturating_add(fde.entry_len() as u64);
        if work > budget {
            return Err(UnwindError::TooBig(format!(
                "CFI instructions to evaluate exceed {WORK_PER_BYTE} times the section's {section_len} bytes"
            )));
        }
        let encoding = fde.cie().encoding();
        let signal = fde.is_signal_trampoline();
        let mut table = match fde.rows(section, bases, ctx) {
            Ok(t) => t,
            Err(_) => {
                b.stats.bad_fdes += 1;
                continue;
            }
        };
        loop {
            match table.next_row() {
                Ok(Some(row)) => {
                    b.stats.cfi_rows += 1;
                    let (s, e) = (row.start_address(), row.end_address());
                    let rule = rule_of(row, section, encoding, signal, &mut b.stats, b.arch);
                    b.add(s, e, rule)?;
                }
                Ok(None) => break,
                Err(_) => {
                    b.stats.bad_fdes += 1;
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Every FDE of a section as (address, offset), sorted by address, and
/// how many entries could not be parsed (a CIE pointer that leads to no
/// CIE, a bad length or encoding): those are counted as bad FDEs.
fn sorted_fdes<'a, S>(section: &S, bases: &BaseAddresses) -> (Vec<(u64, usize)>, u64)
where
    S: UnwindSection<Slice<'a>>,
{
    let (mut v, mut bad) = (Vec::new(), 0u64);
    let mut entries = section.entries(bases);
    loop {
        match entries.next() {
            Ok(Some(CieOrFde::Fde(p))) => {
                let off: usize = p.offset();
                match p.parse(S::cie_from_offset) {
                    Ok(f) if f.len() > 0 => v.push((f.initial_address(), off)),
                    Ok(_) => {}
                    Err(_) => bad += 1,
                }
            }
            Ok(Some(CieOrFde::Cie(_))) => {}
            Ok(None) => break,
            // The rest of the section cannot be walked.
            Err(_) => {
                bad += 1;
                break;
            }
        }
        if v.len() > MAX_ROWS {
            break;
        }
    }
    v.sort_unstable();
    (v, bad)
}

/// The code each `.eh_frame` description covers, as (start, end, whether
/// its first row is a function's entry: the return address just pushed, at
/// the stack pointer, on x86-64; still in the link register, the CFA the
/// stack pointer, on AArch64). A part of a function split off from it (GCC's
/// `.cold`) starts with the function's frame already built.
pub fn fde_spans(info: &ElfUnwindInfo) -> Vec<(u64, u64, bool)> {
    let Some(eh) = &info.eh_frame else { return Vec::new() };
    let text = info.segments.iter().find(|s| s.exec).map(|s| s.vaddr).unwrap_or(0);
    let mut sec = EhFrame::new(&eh.data, LittleEndian);
    sec.set_address_size(8);
    sec.set_vendor(info.arch.vendor());
    let bases = BaseAddresses::default().set_eh_frame(eh.addr).set_text(text);
    let (fdes, _) = sorted_fdes(&sec, &bases);
    let mut ctx = Box::new(UnwindContext::<usize>::new());
    let [sp, _, _] = info.arch.regs();
    let entry = match info.arch {
        Arch::X86_64 => 8,
        Arch::Aarch64 => 0,
    };
    let mut out = Vec::with_capacity(fdes.len());
    for (_, off) in fdes {
        let Ok(fde) = sec.fde_from_offset(&bases, off.into(), EhFrame::cie_from_offset) else { continue };
        let (start, len) = (fde.initial_address(), fde.len());
        let first = fde.rows(&sec, &bases, &mut ctx).ok().and_then(|mut t| {
            t.next_row().ok().flatten().map(|r| {
                matches!(r.cfa(), CfaRule::RegisterAndOffset { register, offset } if *register == sp && *offset == entry)
            })
        });
        out.push((start, start.saturating_add(len), first.unwrap_or(true)));
    }
    out
}

/// Builds the table of an ELF file from its unwind sections: `.eh_frame`
/// first, then `.debug_frame` for the addresses `.eh_frame` leaves out, then
/// rules for PLT stubs no CFI covers (`.plt.sec`, `.plt.got`: the return
/// address is at rsp; lazy `.plt`: GCC's PLT rule). Other code without CFI
/// stays a gap, walked by its frame pointer.
pub fn build(info: &ElfUnwindInfo) -> Result<Table, UnwindError> {
    let arch = info.arch;
    let t = match build_cfi(info) {
        // No CFI, but Go's table or signal trampolines give rows.
        Err(UnwindError::NoUnwindInfo) if info.has_unwind_info() => {
            Table { rows: Vec::new(), stats: BuildStats::default(), arch }
        }
        t => t?,
    };
    // Go's own table first: the DWARF .debug_frame of an unstripped Go
    // binary says the same of each frame but not where stacks start, and
    // stripped and unstripped builds must walk alike. CFI covers the rest
    // (a cgo binary's C code).
    let t = match &info.gopclntab {
        Some(g) => {
            let stats = t.stats;
            let mut merged = merge(go_rows(g, info.text, &info.go_cgo, arch)?, t);
            merged.stats = stats;
            merged
        }
        None => t,
    };
    // AArch64's signal trampolines (the vDSO's __kernel_rt_sigreturn, musl's
    // __restore_rt) have no CFI since Linux 5.9; the return from a handler
    // lands on the `mov x8, #139`, looked up at the instruction before.
    let t = if info.sigreturn.is_empty() {
        t
    } else {
        let mut sig = info.sigreturn.clone();
        sig.sort_unstable();
        let mut b = Builder::new(arch);
        for a in sig {
            b.add(a.saturating_sub(4), a.saturating_add(8), Rule::new(Cfa::Signal, SavedRbp::Unknown))?;
        }
        let stats = t.stats;
        let mut merged = merge(b.finish()?, t);
        merged.stats = stats;
        merged
    };
    if info.plt.is_empty() {
        return Ok(t);
    }
    let mut plt: Vec<(u64, u64, bool)> = info.plt.clone();
    plt.sort_unstable();
    let mut b = Builder::new(arch);
    for (addr, size, lazy) in plt {
        let rule = match (arch, lazy) {
            (Arch::X86_64, true) => Rule::new(Cfa::Plt(11), SavedRbp::Same),
            (Arch::X86_64, false) => Rule::new(Cfa::Rsp(8), SavedRbp::Same),
            // AArch64's stubs touch neither sp nor x30 (the lazy .plt's
            // first stub saves x30 for the resolver: a sample there is
            // read as if it had not).
            (Arch::Aarch64, _) => Rule { cfa: Cfa::Rsp(0), rbp: SavedRbp::Same, ra: Ra::Lr },
        };
        b.add(addr, addr.saturating_add(size), rule)?;
    }
    let stats = t.stats;
    let mut merged = merge(t, b.finish()?);
    merged.stats = stats;
    Ok(merged)
}

/// Rows for Go code from its function table (Go emits no `.eh_frame`): at
/// each instruction the stack pointer is the entry's minus the table's
/// delta. Functions where a stack starts or is switched (goexit, mstart,
/// systemstack, mcall, morestack) end the walk; asmcgocall, which runs C on
/// the system stack, leads back to the goroutine's stack (and, on x86-64,
/// cgocallback from Go called back to the C that called).
///
/// - x86-64: CFA = rsp + delta + 8; a function that has pushed anything has
///   saved its caller's rbp at CFA - 16 (Go's frame layout, both the old
///   `SUBQ; MOVQ BP` and the newer `PUSHQ BP` prologues), one that has not
///   left it alone.
/// - arm64: CFA = sp + delta. With delta 0 the return address is still in
///   x30; a function with a frame saved x30 at its new sp (`MOVD.W R30,
///   -n(RSP)`, or `STP (R29, R30), -8(R20)` for a large frame), at CFA -
///   delta, and x29 just below it (Go saves x30 even in a leaf that has a
///   frame, so that its traceback works).
fn go_rows(
    g: &super::elf::Section,
    text: u64,
    cgo: &[crate::engine::runtime::go::CgoSwitch],
    arch: Arch,
) -> Result<Table, UnwindError> {
    let t = crate::engine::runtime::go::Pclntab::parse(g.data.clone(), text)
        .map_err(|e| UnwindError::Malformed(format!(".gopclntab: {e}")))?;
    let machine = match arch {
        Arch::X86_64 => object::elf::EM_X86_64,
        Arch::Aarch64 => object::elf::EM_AARCH64,
    };
    if !t.fits_machine(machine) {
        return Err(UnwindError::Malformed(format!(
            ".gopclntab: its instruction quantum {} is not {}'s",
            t.quantum(),
            arch.name()
        )));
    }
    let mut b = Builder::new(arch);
    use crate::engine::runtime::go::SpKind;
    for (start, end, delta, kind) in t.sp_rows(cgo) {
        let rule = match (kind, arch) {
            (SpKind::Stop, _) => Rule::new(Cfa::Stop, SavedRbp::Same),
            (SpKind::Signal, _) => Rule::new(Cfa::Signal, SavedRbp::Same),
            (SpKind::CgoCall(slots), Arch::X86_64) => Rule::new(Cfa::GoCgo(slots), SavedRbp::AtCfa(-16)),
            (SpKind::CgoCall(slots), Arch::Aarch64) => {
                Rule { cfa: Cfa::GoCgo(slots), rbp: SavedRbp::AtCfa(-24), ra: Ra::AtCfa(-16) }
            }
            (SpKind::CgoCallback(how), Arch::X86_64) => Rule::new(Cfa::GoCallback(how), SavedRbp::AtCfa(-16)),
            (SpKind::CgoCallback(how), Arch::Aarch64) => {
                // The return address at the frame's stack pointer, x29
                // below it (cgocallback's own prologue).
                let d = (how & 0x3f) as i32 * 8;
                Rule { cfa: Cfa::GoCallback(how), rbp: SavedRbp::AtCfa(-d - 8), ra: Ra::AtCfa(-d) }
            }
            (SpKind::FrameRa(ra), Arch::Aarch64) => {
                let ra = ra as i32 - delta;
                Rule { cfa: Cfa::Rsp(delta), rbp: SavedRbp::AtCfa(ra - 8), ra: Ra::AtCfa(ra) }
            }
            (SpKind::Frame | SpKind::FrameRa(_), Arch::X86_64) if delta == 0 => Rule::new(Cfa::Rsp(8), SavedRbp::Same),
            (SpKind::Frame | SpKind::FrameRa(_), Arch::X86_64) => {
                Rule::new(Cfa::Rsp(delta.saturating_add(8)), SavedRbp::AtCfa(-16))
            }
            (SpKind::Frame, Arch::Aarch64) if delta == 0 => Rule { cfa: Cfa::Rsp(0), rbp: SavedRbp::Same, ra: Ra::Lr },
            (SpKind::Frame, Arch::Aarch64) => {
                Rule { cfa: Cfa::Rsp(delta), rbp: SavedRbp::AtCfa(-delta.saturating_add(8)), ra: Ra::AtCfa(-delta) }
            }
        };
        b.stats.fdes += 1;
        // Runs come in address order; one a crafted table overlaps is cut.
        b.add(start, end, rule)?;
    }
    b.finish()
}

fn build_cfi(info: &ElfUnwindInfo) -> Result<Table, UnwindError> {
    if info.eh_frame.is_none() && info.debug_frame.is_none() {
        return Err(UnwindError::NoUnwindInfo);
    }
    let text = info.segments.iter().find(|s| s.exec).map(|s| s.vaddr).unwrap_or(0);
    let mut ctx = Box::new(UnwindContext::<usize>::new());
    let mut eh_rows = Builder::new(info.arch);
    if let Some(eh) = &info.eh_frame {
        let mut sec = EhFrame::new(&eh.data, LittleEndian);
        sec.set_address_size(8);
        sec.set_vendor(info.arch.vendor());
        let bases = BaseAddresses::default().set_eh_frame(eh.addr).set_text(text);
        let (fdes, bad) = sorted_fdes(&sec, &bases);
        eh_rows.stats.bad_fdes += bad;
        let order: Vec<usize> = fdes.into_iter().map(|(_, o)| o).collect();
        rows_of(&sec, &bases, &order, &mut eh_rows, &mut ctx, eh.data.len())?;
    }
    let Some(df) = &info.debug_frame else { return eh_rows.finish() };
    let mut sec = DebugFrame::new(&df.data, LittleEndian);
    sec.set_address_size(8);
    sec.set_vendor(info.arch.vendor());
    let bases = BaseAddresses::default();
    let (fdes, bad) = sorted_fdes(&sec, &bases);
    let order: Vec<usize> = fdes.into_iter().map(|(_, o)| o).collect();
    let mut dbg = Builder::new(info.arch);
    dbg.stats.bad_fdes += bad;
    rows_of(&sec, &bases, &order, &mut dbg, &mut ctx, df.data.len())?;
    let eh = eh_rows.finish()?;
    let dbg = dbg.finish()?;
    Ok(merge(eh, dbg))
}

/// `primary`'s rows, with `secondary`'s filling primary's gaps.
fn merge(mut primary: Table, secondary: Table) -> Table {
    if secondary.rows.is_empty() {
        primary.stats.bad_fdes += secondary.stats.bad_fdes;
        return primary;
    }
    let mut stats = primary.stats;
    stats.fdes += secondary.stats.fdes;
    stats.cfi_rows += secondary.stats.cfi_rows;
    stats.unsupported_cfa += secondary.stats.unsupported_cfa;
    stats.unknown_rbp += secondary.stats.unknown_rbp;
    stats.bad_fdes += secondary.stats.bad_fdes;
    // Every boundary of either table; at each, primary's rule unless it is
    // a gap there.
    let mut addrs: Vec<u64> = primary.rows.iter().chain(&secondary.rows).map(|r| r.addr).collect();
    addrs.sort_unstable();
    addrs.dedup();
    let arch = primary.arch;
    let gap = Rule::GAP.encode(arch);
    let mut out: Vec<Row> = Vec::with_capacity(addrs.len());
    for a in addrs {
        let p = primary.lookup(a).encode(arch);
        let rule = if p == gap {
            let s = secondary.lookup(a).encode(arch);
            if s != gap {
                stats.debug_frame_rows += 1;
            }
            s
        } else {
            p
        };
        if out.last().is_some_and(|r| r.rule == rule) {
            continue;
        }
        out.push(Row { addr: a, rule });
    }
    Table { rows: out, stats, arch }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_round_trip_through_the_row_encoding() {
        let rules = [
            Rule::GAP,
            Rule::new(Cfa::Rsp(8), SavedRbp::Same),
            Rule::new(Cfa::Rsp(70_000), SavedRbp::AtCfa(-16)),
            Rule::new(Cfa::Rbp(16), SavedRbp::AtCfa(-1024)),
            Rule::new(Cfa::Plt(11), SavedRbp::Same),
            Rule::new(Cfa::DerefRbp(-8), SavedRbp::AtRbp(0)),
            Rule::new(Cfa::DerefRsp(-2_000_000), SavedRbp::AtCfa(1016)),
            Rule::new(Cfa::Stop, SavedRbp::Same),
            Rule::new(Cfa::Signal, SavedRbp::Unknown),
            Rule::new(Cfa::Unsupported, SavedRbp::Unknown),
        ];
        for r in rules {
            let e = r.encode(Arch::X86_64);
            assert_eq!(e & 0xffff, 0, "{r:?} leaves the page offset bits free");
            assert_eq!(Rule::decode(e | 0x1234, Arch::X86_64), r);
        }
        let a64 = [
            Rule { cfa: Cfa::Rsp(0), rbp: SavedRbp::Same, ra: Ra::Lr },
            Rule { cfa: Cfa::Rsp(272), rbp: SavedRbp::AtCfa(-272), ra: Ra::AtCfa(-264) },
            Rule { cfa: Cfa::Rsp(112), rbp: SavedRbp::Same, ra: Ra::AtCfa(-56) },
            Rule { cfa: Cfa::Rbp(A64_OFF_MAX), rbp: SavedRbp::AtCfa(-262_152), ra: Ra::AtCfa(-262_144) },
            Rule { cfa: Cfa::Rsp(-A64_OFF_MAX), rbp: SavedRbp::AtCfa(262_136), ra: Ra::Lr },
            Rule { cfa: Cfa::DerefRsp(-8), rbp: SavedRbp::AtRbp(0), ra: Ra::Lr },
            Rule { cfa: Cfa::Rsp(48), rbp: SavedRbp::Unknown, ra: Ra::AtCfa(-8) },
            Rule::new(Cfa::Signal, SavedRbp::Unknown),
            Rule::new(Cfa::Stop, SavedRbp::Same),
        ];
        for r in a64 {
            let e = r.encode(Arch::Aarch64);
            assert_eq!(e & 0xffff, 0, "{r:?} leaves the page offset bits free");
            assert_eq!(Rule::decode(e | 0xfff4, Arch::Aarch64), r);
        }
        // What an AArch64 row cannot hold is unsupported, never wrong.
        let unsupported =
            Rule::decode(Rule::new(Cfa::Rsp(1 << 23), SavedRbp::Same).encode(Arch::Aarch64), Arch::Aarch64);
        assert_eq!(unsupported.cfa, Cfa::Unsupported);
        let plt = Rule::decode(Rule::new(Cfa::Plt(11), SavedRbp::Same).encode(Arch::Aarch64), Arch::Aarch64);
        assert_eq!(plt.cfa, Cfa::Unsupported);
        // x29 and x30 saved apart: one slot cannot say both.
        let apart = Rule { cfa: Cfa::Rsp(64), rbp: SavedRbp::AtCfa(-64), ra: Ra::AtCfa(-16) };
        assert_eq!(Rule::decode(apart.encode(Arch::Aarch64), Arch::Aarch64).cfa, Cfa::Unsupported);
        assert_eq!(Rule::new(Cfa::Rsp(8), SavedRbp::Same).encode(Arch::X86_64) >> 22 & 3, 0, "x86-64 rows unchanged");
    }

    /// A synthetic machine state: registers, and memory whose every word is
    /// a function of its address (so a wrong address gives a wrong value).
    const RSP: u64 = 0x7ffc_0000_1000;
    const RBP: u64 = 0x7ffc_0000_2000;
    /// AArch64's link register x30.
    const LR: u64 = 0x0000_aaaa_0000_1234;
    fn mem(a: u64) -> u64 {
        a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555
    }

    /// Runs a DWARF expression with gimli's evaluator on the synthetic state.
    fn gimli_eval(expr: gimli::Expression<Slice<'_>>, enc: gimli::Encoding, pc: u64, arch: Arch) -> Option<u64> {
        let [sp, fp, ra] = arch.regs();
        let mut ev = expr.evaluation(enc);
        let mut r = ev.evaluate().ok()?;
        loop {
            match r {
                gimli::EvaluationResult::Complete => break,
                gimli::EvaluationResult::RequiresMemory { address, .. } => {
                    r = ev.resume_with_memory(gimli::Value::Generic(mem(address))).ok()?
                }
                gimli::EvaluationResult::RequiresRegister { register, .. } => {
                    let v = match register {
                        r if r == sp => RSP,
                        r if r == fp => RBP,
                        // x86-64's "return address" column is rip.
                        r if r == ra && arch == Arch::X86_64 => pc,
                        _ => return None,
                    };
                    r = ev.resume_with_register(gimli::Value::Generic(v)).ok()?
                }
                _ => return None,
            }
        }
        match ev.result().first()?.location {
            gimli::Location::Address { address } => Some(address),
            _ => None,
        }
    }

    /// What a frame's caller is on the synthetic state: its CFA (stack
    /// pointer), frame pointer (None when not recoverable) and return
    /// address; or the outermost frame.
    #[derive(Debug, PartialEq, Eq)]
    enum Says {
        Caller { cfa: u64, fp: Option<u64>, ra: u64 },
        Outermost,
    }

    /// What gimli says at `pc` on the synthetic state (None: a rule gimli's
    /// row states in a form this model does not evaluate).
    fn gimli_says<R: UnwindSection<Slice<'static>>>(
        row: &gimli::UnwindTableRow<usize>,
        sec: &R,
        enc: gimli::Encoding,
        pc: u64,
        arch: Arch,
    ) -> Option<Says> {
        let [sp, fp, ra_reg] = arch.regs();
        let ra_rule = row.register(ra_reg);
        if matches!(ra_rule, Some(RegisterRule::Undefined)) {
            return Some(Says::Outermost);
        }
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } if *register == sp => RSP.wrapping_add(*offset as u64),
            CfaRule::RegisterAndOffset { register, offset } if *register == fp => RBP.wrapping_add(*offset as u64),
            CfaRule::Expression(e) => gimli_eval(e.get(sec).ok()?, enc, pc, arch)?,
            _ => return None,
        };
        let ra = match (arch, ra_rule) {
            (Arch::X86_64, None) => mem(cfa.wrapping_sub(8)),
            (Arch::Aarch64, None | Some(RegisterRule::SameValue)) => LR,
            (_, Some(RegisterRule::Offset(n))) => mem(cfa.wrapping_add(n as u64)),
            _ => return None,
        };
        let fp = match row.register(fp) {
            None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => Some(RBP),
            Some(RegisterRule::Offset(n)) => Some(mem(cfa.wrapping_add(n as u64))),
            Some(RegisterRule::Expression(e)) => gimli_eval(e.get(sec).ok()?, enc, pc, arch).map(mem),
            _ => None,
        };
        Some(Says::Caller { cfa, fp, ra })
    }

    /// The table's rule on the same state (what unwind.h computes). None:
    /// the walk ends there (unsupported), or a rule for which the model has
    /// no state (signal frames, Go's stack switches).
    fn table_says(rule: Rule, pc: u64) -> Option<Says> {
        let cfa = match rule.cfa {
            Cfa::Rsp(n) => RSP.wrapping_add(n as i64 as u64),
            Cfa::Rbp(n) => RBP.wrapping_add(n as i64 as u64),
            Cfa::Plt(t) => RSP + 8 + if pc & 15 >= t as u64 { 8 } else { 0 },
            Cfa::DerefRsp(n) => mem(RSP.wrapping_add(n as i64 as u64)),
            Cfa::DerefRbp(n) => mem(RBP.wrapping_add(n as i64 as u64)),
            Cfa::Stop => return Some(Says::Outermost),
            Cfa::Gap | Cfa::Signal | Cfa::GoCgo(_) | Cfa::GoCallback(_) | Cfa::Unsupported => return None,
        };
        let fp = match rule.rbp {
            SavedRbp::Same => Some(RBP),
            SavedRbp::AtCfa(n) => Some(mem(cfa.wrapping_add(n as i64 as u64))),
            SavedRbp::AtRbp(n) => Some(mem(RBP.wrapping_add(n as i64 as u64))),
            SavedRbp::Unknown => None,
        };
        let ra = match rule.ra {
            Ra::Cfa8 => mem(cfa.wrapping_sub(8)),
            Ra::AtCfa(n) => mem(cfa.wrapping_add(n as i64 as u64)),
            Ra::Lr => LR,
        };
        Some(Says::Caller { cfa, fp, ra })
    }

    /// Every address of every FDE of `path`: where the table has a rule,
    /// it computes what gimli's row evaluation there does
    /// (`unwind_info_for_address`, which runs the FDE's instructions up to
    /// the address); where it has none (unsupported), gimli's row is one
    /// the model cannot evaluate or one counted as missed; addresses no FDE
    /// covers are gaps. Returns (checked, gimli cannot say, missed).
    fn check_against_gimli(path: &str) -> (u64, u64, u64) {
        let info = super::super::elf::read(std::fs::File::open(path).unwrap()).unwrap();
        let arch = info.arch;
        let table = build(&info).unwrap();
        let eh = info.eh_frame.as_ref().unwrap();
        // 'static for the generic helper: a test leaks its copy.
        let data: &'static [u8] = Box::leak(eh.data.clone().into_boxed_slice());
        let mut sec = EhFrame::new(data, LittleEndian);
        sec.set_address_size(8);
        sec.set_vendor(arch.vendor());
        let text = info.segments.iter().find(|s| s.exec).unwrap().vaddr;
        let bases = BaseAddresses::default().set_eh_frame(eh.addr).set_text(text);
        let mut ctx = Box::new(UnwindContext::<usize>::new());
        let mut entries = sec.entries(&bases);
        let (mut checked, mut skipped, mut missed) = (0u64, 0u64, 0u64);
        let mut covered: Vec<(u64, u64)> = Vec::new();
        while let Some(e) = entries.next().unwrap() {
            let CieOrFde::Fde(p) = e else { continue };
            let fde = p.parse(EhFrame::cie_from_offset).unwrap();
            covered.push((fde.initial_address(), fde.end_address()));
            let enc = fde.cie().encoding();
            for a in fde.initial_address()..fde.end_address() {
                if arch == Arch::Aarch64 && a % 4 != 0 {
                    continue; // no instruction starts there
                }
                let row = fde.unwind_info_for_address(&sec, &bases, &mut ctx, a).unwrap();
                let got = table.lookup(a);
                if fde.is_signal_trampoline() {
                    assert_eq!(got.cfa, Cfa::Signal, "{path} at {a:#x}");
                    checked += 1;
                    continue;
                }
                let mine = table_says(got, a);
                match (gimli_says(row, &sec, enc, a, arch), mine) {
                    (Some(want), Some(mine)) => {
                        assert_eq!(
                            mine,
                            want,
                            "{path} at {a:#x}: table {got:?}, gimli {:?} fp {:?} ra {:?}",
                            row.cfa(),
                            row.register(arch.regs()[1]),
                            row.register(arch.regs()[2]),
                        );
                        checked += 1;
                    }
                    (Some(_), None) => {
                        assert_eq!(got.cfa, Cfa::Unsupported, "{path} at {a:#x}: {got:?}");
                        missed += 1;
                    }
                    (None, _) => {
                        assert_eq!(
                            got.cfa,
                            Cfa::Unsupported,
                            "{path} at {a:#x}: gimli cannot say, so neither may the table"
                        );
                        skipped += 1;
                    }
                }
            }
        }
        // Between FDEs: gaps, but for the padding before an aligned function
        // and PLT stubs without CFI.
        covered.sort_unstable();
        let in_plt = |a: u64| info.plt.iter().any(|(s, n, _)| (*s..s + n).contains(&a));
        for w in covered.windows(2) {
            if w[1].0 > w[0].1 && !(w[1].0 - w[0].1 < 16 && w[1].0 % 16 == 0) {
                for a in [w[0].1, w[1].0 - 1] {
                    let want = if in_plt(a) { table.lookup(a).cfa } else { Cfa::Gap };
                    assert!(
                        matches!(want, Cfa::Gap | Cfa::Rsp(8) | Cfa::Rsp(0) | Cfa::Plt(11))
                            && table.lookup(a).cfa == want,
                        "{path}: at {a:#x} {:?}",
                        table.lookup(a)
                    );
                }
            }
        }
        eprintln!(
            "{path}: {} rows, {:?}; {checked} addresses checked, {skipped} with rules gimli's model does not \
             evaluate, {missed} the table does not follow",
            table.rows.len(),
            table.stats
        );
        (checked, skipped, missed)
    }

    #[test]
    fn libc_table_matches_gimli_at_every_address() {
        let libc = "/lib/x86_64-linux-gnu/libc.so.6";
        let (checked, other, missed) = check_against_gimli(libc);
        // libc.so.6 of Debian 12: ~1.4 MB of text under FDEs, nearly all
        // of it in forms the walk evaluates.
        assert!(checked > 1_000_000, "{checked} addresses checked");
        assert!(other + missed < checked / 1000, "{other} + {missed} addresses with rules the walk does not evaluate");
    }

    /// Debian's arm64 libc (multiarch `libc6:arm64`, which `scripts/setup`
    /// installs): every instruction of it, with AArch64's rules (the return
    /// address in x30 or in the frame record, pointer authentication).
    #[test]
    fn arm64_libc_table_matches_gimli_at_every_instruction() {
        let libc = "/lib/aarch64-linux-gnu/libc.so.6";
        assert!(std::path::Path::new(libc).exists(), "{libc} is missing: scripts/setup installs Debian's libc6:arm64");
        let (checked, other, missed) = check_against_gimli(libc);
        assert!(checked > 200_000, "{checked} instructions checked");
        assert!(other + missed < checked / 1000, "{other} + {missed} instructions with rules the walk does not follow");
        let info = super::super::elf::read(std::fs::File::open(libc).unwrap()).unwrap();
        let t = build(&info).unwrap();
        assert_eq!(t.arch, Arch::Aarch64);
        // The return address in x30, saved in a frame record with x29, and
        // saved without it all occur.
        let rules: Vec<Rule> = t.rows.iter().map(|r| Rule::decode(r.rule, t.arch)).collect();
        assert!(rules.iter().any(|r| r.ra == Ra::Lr && r.cfa != Cfa::Gap), "no rule with x30 in {libc}");
        assert!(rules.iter().any(|r| matches!((r.ra, r.rbp), (Ra::AtCfa(n), SavedRbp::AtCfa(f)) if f == n - 8)));
        assert!(rules.iter().any(|r| matches!((r.ra, r.rbp), (Ra::AtCfa(_), SavedRbp::Same))));
    }

    /// tests/workloads/NAME.go built for arm64 by `go` (which
    /// `scripts/setup` installs), with cgo by Debian's cross compiler
    /// (`cgo`), read as the unwinder reads it.
    fn arm64_go_build(name: &str, cgo: bool) -> super::super::elf::ElfUnwindInfo {
        let dir = std::env::temp_dir().join(format!("sonde-{name}-arm64-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join(name);
        let src = format!("{}/tests/workloads/{name}.go", env!("CARGO_MANIFEST_DIR"));
        let go = if std::path::Path::new("/usr/local/go/bin/go").exists() { "/usr/local/go/bin/go" } else { "go" };
        let out = std::process::Command::new(go)
            .args(["build", "-o", bin.to_str().unwrap(), &src])
            .current_dir(&dir)
            .envs([("GOARCH", "arm64"), ("GO111MODULE", "off"), ("GOTOOLCHAIN", "local")])
            .envs(if cgo {
                [("CGO_ENABLED", "1"), ("CC", "aarch64-linux-gnu-gcc")]
            } else {
                [("CGO_ENABLED", "0"), ("CC", "cc")]
            })
            .output()
            .expect("go and aarch64-linux-gnu-gcc: scripts/setup installs them");
        assert!(out.status.success(), "go build: {}", String::from_utf8_lossy(&out.stderr));
        let info = super::super::elf::read_file(std::fs::File::open(&bin).unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        info
    }

    /// gosplit.go built for arm64 (`go`, which `scripts/setup` installs,
    /// cross-compiles): the rows from Go's function table agree with the
    /// `.debug_frame` Go's linker writes for the same binary, at every
    /// instruction of every ordinary function: the CFA's offset from sp, and
    /// the return address in x30 or at its slot.
    #[test]
    fn arm64_go_table_matches_gos_debug_frame_at_every_instruction() {
        let info = arm64_go_build("gosplit", false);
        assert_eq!(info.arch, Arch::Aarch64);
        let go = go_rows(info.gopclntab.as_ref().unwrap(), info.text, &[], Arch::Aarch64).unwrap();
        // Built whole, Go's rows come first.
        assert_eq!(
            build(&info).unwrap().lookup(go.rows[go.rows.len() / 2].addr),
            go.lookup(go.rows[go.rows.len() / 2].addr)
        );
        let df = info.debug_frame.as_ref().expect("an unstripped Go binary has .debug_frame");
        let data: &'static [u8] = Box::leak(df.data.clone().into_boxed_slice());
        let mut sec = DebugFrame::new(data, LittleEndian);
        sec.set_address_size(8);
        sec.set_vendor(Arch::Aarch64.vendor());
        let bases = BaseAddresses::default();
        let mut ctx = Box::new(UnwindContext::<usize>::new());
        let mut entries = sec.entries(&bases);
        let (mut checked, mut lr, mut stops, mut big) = (0u64, 0u64, 0u64, 0u64);
        let (sp, x30) = (gimli::AArch64::SP, gimli::AArch64::X30);
        while let Some(e) = entries.next().unwrap() {
            let CieOrFde::Fde(p) = e else { continue };
            let fde = p.parse(DebugFrame::cie_from_offset).unwrap();
            for a in (fde.initial_address()..fde.end_address()).step_by(4) {
                let row = fde.unwind_info_for_address(&sec, &bases, &mut ctx, a).unwrap();
                let got = go.lookup(a);
                if got.cfa == Cfa::Stop || got.cfa == Cfa::Signal {
                    stops += 1; // where stacks start or switch: Go's traceback stops too
                    continue;
                }
                let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else { panic!("{a:#x}: {row:?}") };
                assert_eq!(register, sp, "{a:#x}");
                if offset < 0 {
                    // Hand-written runtime code above its entry's sp (the
                    // debugger call's return path): Go's table says so, the
                    // walk clamps it to the entry's.
                    assert_eq!(got, Rule { cfa: Cfa::Rsp(0), rbp: SavedRbp::Same, ra: Ra::Lr }, "{a:#x}");
                    big += 1;
                    continue;
                }
                let want = match row.register(x30).unwrap_or(RegisterRule::Undefined) {
                    RegisterRule::SameValue | RegisterRule::Undefined => {
                        lr += 1;
                        Rule { cfa: Cfa::Rsp(offset as i32), rbp: SavedRbp::Same, ra: Ra::Lr }
                    }
                    RegisterRule::Offset(n) => Rule {
                        cfa: Cfa::Rsp(offset as i32),
                        rbp: SavedRbp::AtCfa(n as i32 - 8),
                        ra: Ra::AtCfa(n as i32),
                    },
                    r => panic!("{a:#x}: x30 {r:?}"),
                };
                if !want.fits(Arch::Aarch64) {
                    // A frame beyond the row's 256 KiB slot: said, not guessed.
                    assert_eq!(got.cfa, Cfa::Unsupported, "{a:#x}");
                    big += 1;
                    continue;
                }
                assert_eq!(got, want, "{a:#x}");
                assert_eq!(Rule::decode(want.encode(Arch::Aarch64), Arch::Aarch64), want, "{a:#x}");
                checked += 1;
            }
        }
        eprintln!(
            "{checked} instructions checked ({lr} with the return address in x30), {stops} in stopping functions, \
             {big} in frames too large for a row or above the entry's sp"
        );
        assert!(
            checked > 50_000 && lr > 1000 && checked > 5 * stops && big < checked / 100,
            "{checked} / {lr} / {stops} / {big}"
        );
    }

    /// A cgo program built for arm64: asmcgocall's and cgocallback's
    /// switches are found in their code (asmcgocall: g at sp, the depth 8
    /// above), and their rows lead to the other stack's frame (the return
    /// address at the switch's stack pointer, x29 below it).
    #[test]
    fn arm64_cgo_binary_has_its_stack_switches() {
        let info = arm64_go_build("gocgo", true);
        let calls: Vec<_> = info
            .go_cgo
            .iter()
            .filter_map(|c| match *c {
                crate::engine::runtime::go::CgoSwitch::AsmCgoCall { entry, depth, g } => Some((entry, depth, g)),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 1, "{:?}", info.go_cgo);
        let (entry, depth, g) = calls[0];
        assert_eq!((depth, g), (8, 0));
        let t = build(&info).unwrap();
        let want = Rule { cfa: Cfa::GoCgo(8), rbp: SavedRbp::AtCfa(-24), ra: Ra::AtCfa(-16) };
        assert_eq!(t.lookup(entry + 0x78), want);
        assert_eq!(Rule::decode(want.encode(Arch::Aarch64), Arch::Aarch64), want);
        // cgocallback: its call of cgocallbackg leads to the system stack,
        // where its frame of 48 bytes starts at g0.sched.sp (g.m at 48,
        // g0.sched.sp at 56, g 16 above the thread pointer).
        let backs: Vec<_> = info
            .go_cgo
            .iter()
            .filter_map(|c| match *c {
                crate::engine::runtime::go::CgoSwitch::Callback { call, len, how, .. } => Some((call, len, how)),
                _ => None,
            })
            .collect();
        assert_eq!(backs.len(), 1, "{:?}", info.go_cgo);
        let (call, len, how) = backs[0];
        assert_eq!((len, Some(how)), (4, crate::engine::runtime::go::callback_how_arm64(48, 48, 56, 16)));
        let want = Rule { cfa: Cfa::GoCallback(how), rbp: SavedRbp::AtCfa(-56), ra: Ra::AtCfa(-48) };
        assert_eq!(t.lookup(call), want);
        assert_eq!(Rule::decode(want.encode(Arch::Aarch64), Arch::Aarch64), want);
        assert_ne!(t.lookup(call + 4), want);
        // crosscall2 (C calling Go enters there): its frame of 192 bytes
        // keeps x29 and x30 at its top, where its call of cgocallback
        // returns.
        let cc: Vec<_> = info
            .go_cgo
            .iter()
            .filter_map(|c| match *c {
                crate::engine::runtime::go::CgoSwitch::Crosscall2 { entry, saved, restored, ra } => {
                    Some((entry, saved, restored, ra))
                }
                _ => None,
            })
            .collect();
        assert_eq!(cc.len(), 1, "{:?}", info.go_cgo);
        let (entry, saved, restored, ra) = cc[0];
        assert_eq!((saved - entry, restored - entry, ra), (0x34, 0x60, 184));
        let want = Rule { cfa: Cfa::Rsp(192), rbp: SavedRbp::AtCfa(-16), ra: Ra::AtCfa(-8) };
        assert_eq!(t.lookup(entry + 0x38), want);
        assert_eq!(Rule::decode(want.encode(Arch::Aarch64), Arch::Aarch64), want);
    }

    #[test]
    fn libstdcxx_table_matches_gimli_at_every_address() {
        let (checked, other, missed) = check_against_gimli("/lib/x86_64-linux-gnu/libstdc++.so.6");
        assert!(checked > 500_000 && other + missed < checked / 1000, "{checked} / {other} / {missed}");
    }

    /// An .eh_frame of one CIE whose initial instructions end in `pad`
    /// no-ops, and `fdes` FDEs of 16 bytes of code each.
    fn crafted_eh_frame(pad: usize, fdes: usize) -> Vec<u8> {
        let mut v = Vec::new();
        let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b, 0x0c, 7, 8, 0x90, 1];
        cie.extend(std::iter::repeat_n(0u8, pad));
        while (cie.len() + 4) % 4 != 0 {
            cie.push(0);
        }
        v.extend((cie.len() as u32).to_le_bytes());
        v.extend(&cie);
        for i in 0..fdes {
            let at = v.len();
            let mut fde = Vec::new();
            fde.extend(((at + 4) as u32).to_le_bytes()); // back to the CIE at 0
                                                         // pc_begin, pcrel sdata4: code at 0x10000 + 16 i (section at 0).
            let field = at + 8;
            fde.extend(((0x10000 + 16 * i as i64 - field as i64) as i32).to_le_bytes());
            fde.extend(16i32.to_le_bytes());
            fde.push(0); // augmentation data length
            while (fde.len() + 4) % 4 != 0 {
                fde.push(0);
            }
            v.extend((fde.len() as u32).to_le_bytes());
            v.extend(&fde);
        }
        v.extend(0u32.to_le_bytes());
        v
    }

    fn info_of(eh: Vec<u8>) -> super::super::elf::ElfUnwindInfo {
        use super::super::elf::{ElfUnwindInfo, Section, Segment};
        ElfUnwindInfo {
            arch: Arch::X86_64,
            sigreturn: Vec::new(),
            segments: vec![Segment { offset: 0, vaddr: 0, filesz: 1 << 30, exec: true }],
            build_id: None,
            eh_frame: Some(Section { addr: 0, data: eh }),
            eh_frame_hdr: None,
            debug_frame: None,
            via_program_headers: false,
            plt: Vec::new(),
            gopclntab: None,
            text: 0,
            go_cgo: Vec::new(),
        }
    }

    #[test]
    fn crafted_cfi_is_read_like_real_cfi() {
        let t = build(&info_of(crafted_eh_frame(0, 3))).unwrap();
        assert_eq!(t.stats.fdes, 3);
        assert_eq!(t.lookup(0x10000 + 20), Rule::new(Cfa::Rsp(8), SavedRbp::Same));
        assert_eq!(t.lookup(0x10000 + 48), Rule::GAP);
    }

    #[test]
    fn plt_stubs_without_cfi_get_their_own_rules_and_other_gaps_stay_gaps() {
        // FDEs cover 0x10000..0x10030; .plt.sec at 0x10040 and a lazy .plt
        // at 0x10080 have none; 0x100c0.. is code without CFI.
        let mut info = info_of(crafted_eh_frame(0, 3));
        info.plt = vec![(0x10040, 0x20, false), (0x10080, 0x40, true)];
        let t = build(&info).unwrap();
        assert_eq!(t.lookup(0x10010).cfa, Cfa::Rsp(8));
        assert_eq!(t.lookup(0x10044), Rule::new(Cfa::Rsp(8), SavedRbp::Same));
        assert_eq!(t.lookup(0x1008c), Rule::new(Cfa::Plt(11), SavedRbp::Same));
        assert_eq!(t.lookup(0x100c4), Rule::GAP);
        assert_eq!(t.lookup(0x10034), Rule::GAP, "between the FDEs and the PLT");
        // A PLT its FDE covers keeps the FDE's rule.
        info.plt = vec![(0x10000, 0x10, false)];
        assert_eq!(build(&info).unwrap().lookup(0x10004), t.lookup(0x10004));
    }

    #[test]
    fn a_cie_made_costly_to_evaluate_is_refused_quickly() {
        // A CIE with 2 MB of no-ops that 4,000 FDEs make gimli run again
        // each time: 8 GB of instructions (hours) unless bounded.
        let eh = crafted_eh_frame(2 << 20, 4000);
        let t0 = std::time::Instant::now();
        let r = build(&info_of(eh));
        assert!(matches!(r, Err(UnwindError::TooBig(_))), "{:?}", r.map(|t| t.stats));
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "took {:?}", t0.elapsed());
    }

    #[test]
    fn the_search_header_does_not_change_the_table() {
        // A copy of libc with an edited .eh_frame_hdr builds the same table
        // (the cache key covers .eh_frame, not the header).
        let mut info =
            super::super::elf::read(std::fs::File::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap()).unwrap();
        let real = build(&info).unwrap();
        if let Some(h) = info.eh_frame_hdr.as_mut() {
            h.data[8..12].copy_from_slice(&10u32.to_le_bytes()); // fde_count
        }
        assert_eq!(build(&info).unwrap(), real);
    }

    #[test]
    fn builder_fills_gaps_merges_neighbours_and_keeps_the_first_source() {
        let r = |n| Rule::new(Cfa::Rsp(n), SavedRbp::Same);
        let mut b = Builder::new(Arch::X86_64);
        b.add(0x100, 0x104, r(8)).unwrap();
        b.add(0x104, 0x110, r(16)).unwrap();
        b.add(0x110, 0x120, r(16)).unwrap(); // same rule: merged
        b.add(0x130, 0x140, r(8)).unwrap(); // gap before
        b.add(0x138, 0x150, r(24)).unwrap(); // overlaps: only 0x140.. kept
        b.add(0x160, 0x168, r(8)).unwrap(); // after 16 bytes of gap: a gap
        b.add(0x170, 0x180, r(16)).unwrap(); // after alignment padding: none
        let t = b.finish().unwrap();
        let want = [
            (0x100, r(8)),
            (0x104, r(16)),
            (0x120, Rule::GAP),
            (0x130, r(8)),
            (0x140, r(24)),
            (0x150, Rule::GAP),
            (0x160, r(8)),
            (0x170, r(16)),
            (0x180, Rule::GAP),
        ];
        let got: Vec<(u64, Rule)> = t.rows.iter().map(|x| (x.addr, Rule::decode(x.rule, Arch::X86_64))).collect();
        assert_eq!(got, want);
        assert_eq!(t.lookup(0xff), Rule::GAP);
        assert_eq!(t.lookup(0x10f), r(16));
        assert_eq!(t.lookup(0x12f), Rule::GAP);
        assert_eq!(t.lookup(0x14f), r(24));
        assert_eq!(t.lookup(0x150), Rule::GAP);
        assert_eq!(t.lookup(0x16c), r(8), "padding belongs to the function before");
    }
}
