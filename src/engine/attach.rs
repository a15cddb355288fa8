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

impl Mechanism {
    /// Every mechanism, in the order of their names in messages.
    pub const ALL: [Mechanism; 5] =
        [Mechanism::TpBtf, Mechanism::RawTp, Mechanism::Tracepoint, Mechanism::Fentry, Mechanism::Kprobe];

    /// The name `--mechanism` takes and messages use.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::TpBtf => "tp_btf",
            Mechanism::RawTp => "raw_tp",
            Mechanism::Tracepoint => "tracepoint",
            Mechanism::Fentry => "fentry",
            Mechanism::Kprobe => "kprobe",
        }
    }
}

/// A tool's mechanisms in its fallback order, each with what it attaches
/// (shown by `--mechanism`'s help and by doctor). The one list a tool
/// declares: loading, `--mechanism` and doctor all read it.
pub type Mechanisms = [(Mechanism, &'static str)];

/// The `--mechanism` value parser for a tool: only the tool's own
/// mechanisms, with their help; `tp-btf` and `raw-tp` are accepted too.
pub fn parser(list: &'static Mechanisms) -> impl clap::builder::TypedValueParser<Value = Mechanism> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(list.iter().map(|(m, help)| {
        let v = PossibleValue::new(m.name()).help(*help);
        match m {
            Mechanism::TpBtf => v.alias("tp-btf"),
            Mechanism::RawTp => v.alias("raw-tp"),
            _ => v,
        }
    }))
    .map(|s| Mechanism::ALL.into_iter().find(|m| m.name() == s.replace('-', "_")).expect("a listed mechanism"))
}

/// The fallback order to try: the one mechanism asked for, or the tool's list.
pub fn order(list: &Mechanisms, asked: Option<Mechanism>) -> Vec<Mechanism> {
    asked.map_or_else(|| list.iter().map(|(m, _)| *m).collect(), |m| vec![m])
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

/// [`recursion_misses`] of every program of `obj`.
pub fn object_recursion_misses(obj: &libbpf_rs::Object) -> u64 {
    obj.progs().map(|p| recursion_misses(&p)).sum()
}

/// Time every program of `obj` ran in the kernel, in ns (counted while
/// kernel.bpf_stats_enabled is 1; programs not loaded count 0).
pub fn object_run_time_ns(obj: &libbpf_rs::Object) -> u64 {
    obj.progs().map(|p| run_stats(&p).0).sum()
}

/// (run_time_ns, run_cnt) of `prog` while kernel.bpf_stats_enabled was 1.
pub fn run_stats(prog: &impl std::os::fd::AsFd) -> (u64, u64) {
    prog_info(prog).map(|i| (i.run_time_ns, i.run_cnt)).unwrap_or((0, 0))
}

#[cfg(test)]
mod tests {
    use clap::{Arg, Command};

    use super::*;

    #[test]
    fn mechanism_takes_only_the_tools_own_names_and_their_dashed_aliases() {
        static LIST: &Mechanisms = &[(Mechanism::TpBtf, "a"), (Mechanism::Kprobe, "b")];
        let cmd = || Command::new("t").arg(Arg::new("m").long("mechanism").value_parser(parser(LIST)));
        let get = |v: &str| {
            cmd().try_get_matches_from(["t", "--mechanism", v]).map(|m| *m.get_one::<Mechanism>("m").unwrap())
        };
        assert_eq!(get("tp_btf").unwrap(), Mechanism::TpBtf);
        assert_eq!(get("tp-btf").unwrap(), Mechanism::TpBtf);
        assert_eq!(get("kprobe").unwrap(), Mechanism::Kprobe);
        assert!(get("raw_tp").is_err(), "not this tool's");
        assert_eq!(order(LIST, None), vec![Mechanism::TpBtf, Mechanism::Kprobe]);
        assert_eq!(order(LIST, Some(Mechanism::Kprobe)), vec![Mechanism::Kprobe]);
    }
}
