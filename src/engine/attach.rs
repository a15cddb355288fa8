//! Loading with fallbacks: try each mechanism in order and remember why the
//! others failed, so `doctor` and error messages can say exactly why.
use std::fmt;

/// What [`with_fallbacks`] returns: the loaded value, the mechanism that
/// loaded it, and each mechanism tried before it with its failure.
pub type Chosen<T> = (T, Mechanism, Vec<(Mechanism, String)>);

/// How a program reaches its hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// BTF-typed tracepoint (BPF_TRACE_RAW_TP with BTF).
    TpBtf,
    /// Raw tracepoint, untyped arguments.
    RawTp,
    /// Classic perf tracepoint, reading the trace record.
    Tracepoint,
    /// fentry/fexit trampolines.
    Fentry,
    /// kprobe/kretprobe.
    Kprobe,
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mechanism::TpBtf => "tp_btf",
            Mechanism::RawTp => "raw_tp",
            Mechanism::Tracepoint => "tracepoint",
            Mechanism::Fentry => "fentry",
            Mechanism::Kprobe => "kprobe",
        })
    }
}

/// Tries `load` with each mechanism in turn; returns the first success and the
/// failures before it, or an error listing every failure.
pub fn with_fallbacks<T>(
    what: &str,
    order: &[Mechanism],
    mut load: impl FnMut(Mechanism) -> anyhow::Result<T>,
) -> anyhow::Result<Chosen<T>> {
    let mut failures = Vec::new();
    for &m in order {
        match load(m) {
            Ok(t) => return Ok((t, m, failures)),
            Err(e) => failures.push((m, format!("{e:#}"))),
        }
    }
    let why: Vec<String> = failures.iter().map(|(m, e)| format!("{m}: {e}")).collect();
    Err(super::error::env(format!(
        "cannot attach {what} by any mechanism ({}); run `sonde doctor` for what this kernel allows",
        why.join("; ")
    )))
}

/// The kernel's information on a loaded program (None if it cannot say).
fn prog_info(prog: &impl std::os::fd::AsFd) -> Option<libbpf_sys::bpf_prog_info> {
    use std::os::fd::AsRawFd;
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: info is a plain struct of the size we pass; the kernel fills it.
    let r = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(prog.as_fd().as_raw_fd(), &mut info, &mut len) };
    (r == 0).then_some(info)
}

/// Times the kernel skipped `prog` because it was already running on that CPU
/// (a softirq interrupting it, or another tracing program of the classic kind
/// running there). Those events never reach the program, so tools add this to
/// what they report as missed. 0 if the kernel does not count them.
pub fn recursion_misses(prog: &impl std::os::fd::AsFd) -> u64 {
    prog_info(prog).map(|i| i.recursion_misses).unwrap_or(0)
}

/// (run_time_ns, run_cnt) of `prog` while kernel.bpf_stats_enabled was 1.
pub fn run_stats(prog: &impl std::os::fd::AsFd) -> (u64, u64) {
    prog_info(prog).map(|i| (i.run_time_ns, i.run_cnt)).unwrap_or((0, 0))
}
