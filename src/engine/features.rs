//! What this kernel offers, found by probing (never by kernel version).
use std::{
    fs,
    path::{Path, PathBuf},
};

use libbpf_rs::btf::{types::FuncProto, Btf, BtfType};

/// Where vmlinux BTF lives.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// True when vmlinux BTF is present (needed for CO-RE and tp_btf).
pub fn has_btf() -> bool {
    Path::new(VMLINUX_BTF).exists()
}

fn with_btf<R>(f: impl FnOnce(&Btf<'static>) -> R) -> Option<R> {
    // Parsed once per thread (in practice the main thread): vmlinux BTF is several MB.
    thread_local! {
        static BTF: Option<Btf<'static>> = Btf::from_vmlinux().ok();
    }
    BTF.with(|b| b.as_ref().map(f))
}

/// True when vmlinux BTF has a type of this name (any kind).
pub fn btf_has_type(name: &str) -> bool {
    with_btf(|b| b.type_by_name::<BtfType>(name).is_some()).unwrap_or(false)
}

/// True when vmlinux BTF has a struct `ty` with a direct member `member`.
pub fn btf_struct_has_member(ty: &str, member: &str) -> bool {
    with_btf(|b| {
        b.type_by_name::<libbpf_rs::btf::types::Struct<'_>>(ty)
            .is_some_and(|s| s.iter().any(|m| m.name.is_some_and(|n| n == member)))
    })
    .unwrap_or(false)
}

/// True when this kernel skips tracing programs while a thread of PID 1 is
/// on the CPU (unless PID 1 loaded them): a sandbox patch that marks each
/// program `bpf_prog_aux.init_owned`. Work in softirqs that interrupt PID 1
/// (timers, packet receive) then reaches no tracer, silently; sonde counts
/// what it can of it (retrans: `unseen_segs`). Found by reading the patched
/// bpf_trace_run*() here: `if current->tgid == 1 && !aux->init_owned: skip`.
pub fn init_hides_tracing() -> bool {
    btf_struct_has_member("bpf_prog_aux", "init_owned")
}

/// Number of arguments of a tracepoint as tp_btf/raw_tp see them (without the
/// leading context pointer), from the `btf_trace_<name>` typedef.
pub fn tracepoint_btf_args(name: &str) -> Option<usize> {
    with_btf(|btf| -> Option<usize> {
        let td = btf.type_by_name::<BtfType>(&format!("btf_trace_{name}"))?;
        let mut t = td.next_type()?;
        while t.is_mod() || t.kind() == libbpf_rs::btf::BtfKind::Ptr || t.kind() == libbpf_rs::btf::BtfKind::Typedef {
            t = t.next_type()?;
        }
        let proto = FuncProto::try_from(t).ok()?;
        Some(proto.len().saturating_sub(1))
    })
    .flatten()
}

/// The tracefs mount, mounting it at /sys/kernel/tracing if nothing is mounted.
pub fn tracefs() -> Option<PathBuf> {
    for p in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(p).join("events").is_dir() {
            return Some(PathBuf::from(p));
        }
    }
    // Root may mount it; failure just means classic tracepoints are unknown.
    let target = c"/sys/kernel/tracing";
    // SAFETY: all three are NUL-terminated C strings that outlive the call; data may be null.
    let rc = unsafe { libc::mount(c"nodev".as_ptr(), target.as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null()) };
    (rc == 0 && Path::new("/sys/kernel/tracing/events").is_dir()).then(|| PathBuf::from("/sys/kernel/tracing"))
}

/// True when the classic tracepoint `category:name` exists.
pub fn tracepoint_exists(category: &str, name: &str) -> bool {
    tracefs().is_some_and(|t| t.join("events").join(category).join(name).join("id").exists())
}

/// True when the classic tracepoint's record has a field of that name.
pub fn tracepoint_has_field(category: &str, name: &str, field: &str) -> bool {
    let Some(t) = tracefs() else { return false };
    let fmt = fs::read_to_string(t.join("events").join(category).join(name).join("format")).unwrap_or_default();
    fmt.lines().any(|l| {
        l.trim_start().starts_with("field:")
            && l.split(';').next().is_some_and(|d| d.split_whitespace().last() == Some(field))
    })
}

/// kprobes: the kprobe PMU or kprobe_events exists.
pub fn has_kprobes() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe/type").exists()
        || tracefs().is_some_and(|t| t.join("kprobe_events").exists())
}

/// uprobes: the uprobe PMU exists.
pub fn has_uprobes() -> bool {
    Path::new("/sys/bus/event_source/devices/uprobe/type").exists()
}

/// Effective capability bits of this process.
pub fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Capability numbers sonde cares about.
pub const CAP_NET_ADMIN: u32 = 12;
/// CAP_SYS_ADMIN.
pub const CAP_SYS_ADMIN: u32 = 21;
/// CAP_PERFMON.
pub const CAP_PERFMON: u32 = 38;
/// CAP_BPF.
pub const CAP_BPF: u32 = 39;

/// True when this process may load tracing BPF programs.
pub fn can_trace() -> bool {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// Fails with exit status 2 unless this process may trace.
pub fn require_tracing_privileges() -> anyhow::Result<()> {
    if can_trace() {
        return Ok(());
    }
    Err(super::error::env(
        "sonde needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) to load BPF programs; run it as root or with sudo",
    ))
}

/// The value of a sysctl under /proc/sys, e.g. "kernel/bpf_stats_enabled".
pub fn sysctl(path: &str) -> Option<String> {
    fs::read_to_string(Path::new("/proc/sys").join(path)).ok().map(|s| s.trim().to_string())
}

/// The running kernel's release (`uname -r`).
pub fn uname_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}
