//! Kernel address symbolization (kallsyms) through blazesym, one cached symbolizer.
use blazesym::symbolize::{
    source::{Kernel, Source},
    Input, Symbolized, Symbolizer,
};

/// Symbolizes kernel addresses; cheap to call repeatedly.
pub struct KernelSymbols {
    symbolizer: Symbolizer,
}

impl Default for KernelSymbols {
    fn default() -> Self {
        Self { symbolizer: Symbolizer::new() }
    }
}

impl KernelSymbols {
    /// `name+0xoff` for each address, `[unknown]` where kallsyms has nothing.
    pub fn names(&self, addrs: &[u64]) -> Vec<String> {
        let src = Source::Kernel(Kernel::default());
        match self.symbolizer.symbolize(&src, Input::AbsAddr(addrs)) {
            Ok(syms) => syms
                .into_iter()
                .map(|s| match s {
                    Symbolized::Sym(sym) => format!("{}+{:#x}", sym.name, sym.offset),
                    Symbolized::Unknown(_) => "[unknown]".to_string(),
                })
                .collect(),
            Err(_) => addrs.iter().map(|a| format!("{a:#x}")).collect(),
        }
    }
}

/// Kernel functions that only run on entry from a hardware interrupt: a
/// wake-up below one is the interrupt's doing, not the interrupted task's.
/// Softirq work run by a task itself (`local_bh_enable` after it queued a
/// packet, e.g. a loopback send) keeps the task as the waker.
pub fn is_interrupt_entry(name: &str) -> bool {
    name.starts_with("asm_sysvec_") || name.starts_with("asm_common_interrupt") || name.starts_with("irq_exit")
}

/// The kernel text of [`is_interrupt_entry`] functions as merged address
/// ranges, from `/proc/kallsyms` (empty when its addresses are hidden).
/// Each function ends where the next symbol starts; the 16-byte `__pfx_`
/// padding between two of them joins their ranges.
pub fn interrupt_entry_ranges() -> Vec<(u64, u64)> {
    let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else { return Vec::new() };
    interrupt_ranges_in(&text)
}

/// The text of kernel function `name` (core kernel, not a module's), from
/// its `/proc/kallsyms` address to the next symbol's; None when it is not
/// there (inlined, a module's) or addresses are hidden.
pub fn kernel_function_range(name: &str) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    function_range_in(&text, name)
}

fn function_range_in(kallsyms: &str, name: &str) -> Option<(u64, u64)> {
    let mut start = None;
    let mut addrs: Vec<u64> = Vec::new();
    for (a, n) in text_symbols(kallsyms) {
        if n == name {
            if start.is_some() {
                return None; // two functions of that name: which one is unknown
            }
            start = Some(a);
        }
        addrs.push(a);
    }
    let start = start?;
    let end = addrs.into_iter().filter(|&a| a > start).min()?;
    Some((start, end))
}

/// Kernel functions that do nothing but rewrite a thread's user registers
/// for a signal, always taken: the return from a handler, which copies them
/// back from the signal frame one by one (x86-64's restore_sigcontext
/// writes bp, sp, then ip; arm64's restore_sigframe, x0 to x30, sp, then
/// pc), with the rt_sigreturn system call they are inlined into where they
/// are; and both ways for 32-bit tasks (x86-64's ia32 and x32, arm64's
/// compat). A sample taken in them may see a pc and a stack pointer of two
/// different frames (stacks.h, `STK_CAPTURE_SAMPLE`).
const SIGNAL_OWN: &[&str] = &[
    "restore_sigcontext",
    "__do_sys_rt_sigreturn",
    "__x64_sys_rt_sigreturn",
    "restore_sigframe",
    "__arm64_sys_rt_sigreturn",
    "ia32_setup_frame",
    "ia32_setup_rt_frame",
    "x32_setup_rt_frame",
    "ia32_restore_sigcontext",
    "__ia32_compat_sys_sigreturn",
    "__ia32_compat_sys_rt_sigreturn",
    "__x32_compat_sys_rt_sigreturn",
    "compat_setup_frame",
    "compat_setup_rt_frame",
    "compat_restore_sigframe",
    "__arm64_compat_sys_sigreturn",
    "__arm64_compat_sys_rt_sigreturn",
];

/// The entry into a signal handler, innermost first: the function that sets
/// the thread's user pc and stack pointer for the handler (x86-64's
/// x64_setup_rt_frame since 6.2, __setup_rt_frame before; arm64's
/// setup_return), then each function the one before is inlined into where
/// it is not in kallsyms (Debian's x86-64 5.10 and 6.1 have all of it in
/// arch_do_signal_or_restart, its arm64 6.1 in do_notify_resume). Only the
/// first one found is taken: the outer ones also run where no register is
/// rewritten (arm64's do_notify_resume on every return to user mode with
/// work pending, a sample's interrupt often taken right where it unmasks
/// interrupts).
const SIGNAL_SETUP: &[&str] = &[
    "x64_setup_rt_frame",
    "__setup_rt_frame",
    "setup_return",
    "setup_rt_frame",
    "handle_signal",
    "do_signal",
    "arch_do_signal",
    "arch_do_signal_or_restart",
    "do_notify_resume",
];

/// A kallsyms name without a compiler clone's suffix (`.isra.0`, `.cold`).
fn base_name(n: &str) -> &str {
    n.split('.').next().unwrap_or(n)
}

/// The core kernel's text symbols of `kallsyms`: (address, name).
fn text_symbols(kallsyms: &str) -> impl Iterator<Item = (u64, &str)> {
    kallsyms.lines().filter_map(|l| {
        let mut it = l.split_whitespace();
        let (a, t, n) = (it.next()?, it.next()?, it.next()?);
        if !matches!(t, "t" | "T") || it.next().is_some() {
            return None; // data, module text
        }
        Some((u64::from_str_radix(a, 16).ok().filter(|&a| a != 0)?, n))
    })
}

/// The ranges of [`SIGNAL_OWN`] and of the first of [`SIGNAL_SETUP`]
/// that `kallsyms` has, merged. One pass that parses an address only where
/// a wanted function starts or ends (the whole file took 0.9 s in a debug
/// build with every line parsed, and a short-lived program's profile
/// started too late): the core kernel's symbols come by address (the
/// kernel bisects them), so a function ends at the next text symbol at a
/// higher address. An end that is not within 64 KiB is not trusted.
fn signal_ranges_in(kallsyms: &str) -> Vec<(u64, u64)> {
    // (start, end, index in SIGNAL_OWN then SIGNAL_SETUP); end 0 while open.
    let mut found: Vec<(u64, u64, usize)> = Vec::new();
    // found[open..] await their end.
    let mut open = 0;
    // Per first byte, the lengths of the wanted names (a bit each): most
    // lines are passed over on that alone.
    let mut lens = [0u64; 256];
    for w in SIGNAL_OWN.iter().chain(SIGNAL_SETUP) {
        lens[w.as_bytes()[0] as usize] |= 1 << w.len();
    }
    for l in kallsyms.lines() {
        let mut it = l.splitn(3, ' ');
        let (Some(a), Some(t), Some(n)) = (it.next(), it.next(), it.next()) else { continue };
        if !matches!(t, "t" | "T") || n.contains('\t') || n.starts_with("__pfx_") {
            continue; // data, a module's text, padding
        }
        let b = base_name(n);
        let maybe = b.len() < 64 && lens[b.as_bytes().first().copied().unwrap_or(0) as usize] >> b.len() & 1 == 1;
        let want = if maybe { SIGNAL_OWN.iter().chain(SIGNAL_SETUP).position(|w| *w == b) } else { None };
        if open == found.len() && want.is_none() {
            continue;
        }
        let Some(addr) = u64::from_str_radix(a, 16).ok().filter(|&a| a != 0) else { continue };
        for f in &mut found[open..] {
            if f.1 == 0 && addr > f.0 {
                f.1 = addr;
            }
        }
        while open < found.len() && found[open].1 != 0 {
            open += 1;
        }
        if let Some(i) = want {
            found.push((addr, 0, i));
        }
    }
    let setup = (0..SIGNAL_SETUP.len()).map(|i| SIGNAL_OWN.len() + i).find(|i| found.iter().any(|f| f.2 == *i));
    let mut r: Vec<(u64, u64)> = found
        .into_iter()
        .filter(|f| f.1 > f.0 && f.1 - f.0 <= 1 << 16 && (f.2 < SIGNAL_OWN.len() || Some(f.2) == setup))
        .map(|f| (f.0, f.1))
        .collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (lo, hi) in r {
        match out.last_mut() {
            Some(last) if lo <= last.1 + 16 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// [`signal_register_ranges`]' ranges, read once per run.
static SIGNAL_RANGES: std::sync::OnceLock<Vec<(u64, u64)>> = std::sync::OnceLock::new();

fn read_signal_ranges() -> Vec<(u64, u64)> {
    match std::fs::read_to_string("/proc/kallsyms") {
        Ok(text) => signal_ranges_in(&text),
        Err(_) => Vec::new(),
    }
}

/// Starts reading [`signal_register_ranges`] on a thread of its own: a
/// sampler calls it first, so that the read (50 ms of the kernel writing
/// /proc/kallsyms) overlaps the rest of its start-up.
pub fn prefetch_signal_register_ranges() {
    std::thread::spawn(|| SIGNAL_RANGES.get_or_init(read_signal_ranges));
}

/// The text of the kernel functions that rewrite a thread's user registers
/// for a signal ([`SIGNAL_OWN`], [`SIGNAL_SETUP`]), merged: at most `max`
/// ranges, the first ones by address (kernels here have two to four), from
/// `/proc/kallsyms`; empty when its addresses are hidden. Waits for a read
/// [`prefetch_signal_register_ranges`] started.
pub fn signal_register_ranges(max: usize) -> Vec<(u64, u64)> {
    SIGNAL_RANGES.get_or_init(read_signal_ranges).iter().take(max).copied().collect()
}

fn interrupt_ranges_in(kallsyms: &str) -> Vec<(u64, u64)> {
    ranges_in(kallsyms, is_interrupt_entry)
}

/// The text of the core kernel's functions whose names `want`, as merged
/// address ranges: each function ends where the next symbol starts, and
/// the 16-byte `__pfx_` padding between two of them joins their ranges.
fn ranges_in(kallsyms: &str, want: impl Fn(&str) -> bool) -> Vec<(u64, u64)> {
    let mut syms: Vec<(u64, bool)> =
        text_symbols(kallsyms).filter(|(_, n)| !n.starts_with("__pfx_")).map(|(a, n)| (a, want(n))).collect();
    syms.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for w in syms.windows(2) {
        let ((lo, want), (hi, _)) = (w[0], w[1]);
        if !want || hi <= lo {
            continue;
        }
        match out.last_mut() {
            Some(last) if lo <= last.1 + 16 => last.1 = hi,
            _ => out.push((lo, hi)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signal_register_writers_are_the_return_and_the_innermost_setup_found() {
        // 6.2 and later: x64_setup_rt_frame alone on the way in (not the
        // function it is called from); the return's clones and an alias at
        // one address; the __pfx_ padding joins neighbours; a part far
        // away (.cold) is a range of its own; a module's text is not the
        // kernel's.
        let ks = "\
ffffffff812fc120 T arch_do_signal_or_restart
ffffffff812fc400 T get_sigframe
ffffffff812fc470 t __pfx_restore_sigcontext
ffffffff812fc480 t restore_sigcontext.isra.0
ffffffff812fc640 t __pfx_x64_setup_rt_frame
ffffffff812fc650 T x64_setup_rt_frame
ffffffff812fc960 t __pfx___x64_sys_rt_sigreturn
ffffffff812fc970 t __do_sys_rt_sigreturn
ffffffff812fc970 T __x64_sys_rt_sigreturn
ffffffff812fca60 T signal_fault
ffffffff812fcb00 T fpu__restore_sig
ffffffff81b00000 t restore_sigcontext.cold
ffffffff81b00040 t other.cold
ffffffff81300000 t restore_sigframe\t[mod]
";
        assert_eq!(
            signal_ranges_in(ks),
            vec![(0xffffffff812fc480, 0xffffffff812fca60), (0xffffffff81b00000, 0xffffffff81b00040)]
        );
        // Debian's 6.1: the way in inlined into arch_do_signal_or_restart.
        let ks = "\
ffffffff812fc120 T arch_do_signal_or_restart
ffffffff812fc400 T get_sigframe
ffffffff812fc480 t restore_sigcontext
ffffffff812fc650 T something_else
";
        assert_eq!(
            signal_ranges_in(ks),
            vec![(0xffffffff812fc120, 0xffffffff812fc400), (0xffffffff812fc480, 0xffffffff812fc650)]
        );
        // Debian's arm64 6.1: in do_notify_resume, the last resort.
        let ks = "\
ffff80000801dd20 T __arm64_sys_rt_sigreturn
ffff80000801de00 T do_notify_resume
ffff80000801e000 T next
";
        assert_eq!(signal_ranges_in(ks), vec![(0xffff80000801dd20, 0xffff80000801e000)]);
        assert_eq!(signal_ranges_in("0000000000000000 T x64_setup_rt_frame\n0000000000000000 T x\n"), vec![]);
    }

    /// The one-pass reader against a parse of every line (each function
    /// ends at the next symbol above it, wherever that is listed), on this
    /// machine's kallsyms.
    #[test]
    fn the_one_pass_signal_reader_agrees_with_a_full_parse_here() {
        let Ok(ks) = std::fs::read_to_string("/proc/kallsyms") else { return };
        let present: std::collections::HashSet<&str> = text_symbols(&ks).map(|(_, n)| base_name(n)).collect();
        let setup = SIGNAL_SETUP.iter().find(|n| present.contains(*n));
        let full = ranges_in(&ks, |n| SIGNAL_OWN.contains(&base_name(n)) || setup == Some(&base_name(n)));
        assert_eq!(signal_ranges_in(&ks), full);
        // Addresses are shown to root: something was found.
        assert!(!full.is_empty() || ks.starts_with("0000000000000000"));
    }

    #[test]
    fn a_function_ends_where_the_next_symbol_starts() {
        let ks = "\
ffff800010b6cd44 T kfree_skb
ffff800010b6cc74 t kfree_skb.part.0
ffff800010b6cda0 T kfree_skb_list
ffff800010b6cd90 d some_data
ffff800008001000 t kfree_skb\t[mod]
";
        assert_eq!(function_range_in(ks, "kfree_skb"), Some((0xffff800010b6cd44, 0xffff800010b6cda0)));
        assert_eq!(function_range_in(ks, "kfree_skb.part.0"), Some((0xffff800010b6cc74, 0xffff800010b6cd44)));
        assert_eq!(function_range_in(ks, "consume_skb"), None);
        assert_eq!(function_range_in("0000000000000000 T kfree_skb\n0000000000000000 T x\n", "kfree_skb"), None);
        assert_eq!(function_range_in("ffff0001 t f\nffff0002 t f\nffff0003 t g\n", "f"), None);
        assert_eq!(function_range_in("ffff0001 t f\n", "f"), None);
    }

    #[test]
    fn interrupt_ranges_merge_neighbours_across_padding() {
        let ks = "\
ffffffff81000c60 T asm_exc_page_fault
ffffffff81000d40 T asm_common_interrupt
ffffffff81000d80 T asm_spurious_interrupt
ffffffff81000df0 T asm_sysvec_apic_timer_interrupt
ffffffff81000e10 T asm_sysvec_x86_platform_ipi
ffffffff81000f70 T __irqentry_text_end
ffffffff81362ce0 T irq_exit_rcu
ffffffff81362cf0 T __pfx_irq_exit
ffffffff81362d00 T irq_exit
ffffffff81362d40 T irq_enter
ffffffff81369000 d irq_exit_data
ffffffffc0001000 t irq_exit_mod\t[somemod]
";
        assert_eq!(
            interrupt_ranges_in(ks),
            vec![
                (0xffffffff81000d40, 0xffffffff81000d80),
                (0xffffffff81000df0, 0xffffffff81000f70),
                (0xffffffff81362ce0, 0xffffffff81362d40)
            ]
        );
        assert!(interrupt_ranges_in("0000000000000000 T asm_sysvec_x\n0000000000000000 T y\n").is_empty());
    }

    #[test]
    fn this_kernel_has_the_timer_interrupt_entry_in_a_range() {
        let ks = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let timer = ks
            .lines()
            .find(|l| l.ends_with(" asm_sysvec_apic_timer_interrupt"))
            .map(|l| u64::from_str_radix(l.split(' ').next().unwrap(), 16).unwrap())
            .expect("x86-64 kallsyms");
        let r = interrupt_entry_ranges();
        assert!(r.iter().any(|&(lo, hi)| lo <= timer && timer < hi), "{r:x?}");
        assert!(r.len() <= 4, "{r:x?}");
    }
}
