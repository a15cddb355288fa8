//! What this kernel offers, found by probing (never by kernel version).
use std::{
    fs,
    path::{Path, PathBuf},
};

use super::btfnames::{kind, BtfNames};

/// Where vmlinux BTF lives.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// True when vmlinux BTF is present (needed for CO-RE and tp_btf).
pub fn has_btf() -> bool {
    Path::new(VMLINUX_BTF).exists()
}

fn with_btf<R>(f: impl FnOnce(&BtfNames) -> R) -> Option<R> {
    // Read once per process: vmlinux BTF is several MB.
    static BTF: std::sync::OnceLock<Option<BtfNames>> = std::sync::OnceLock::new();
    BTF.get_or_init(|| BtfNames::read(VMLINUX_BTF)).as_ref().map(f)
}

/// True when vmlinux BTF has a type of this name (any kind).
pub fn btf_has_type(name: &str) -> bool {
    with_btf(|b| b.find(name, None).is_some()).unwrap_or(false)
}

/// The value of enumerator `name` of enum `ty` in vmlinux BTF.
pub fn btf_enum_value(ty: &str, name: &str) -> Option<i64> {
    with_btf(|b| b.find(ty, Some(super::btfnames::kind::ENUM)).and_then(|t| b.enum_value(&t, name))).flatten()
}

/// True when vmlinux BTF has a struct `ty` with a direct member `member`.
pub fn btf_struct_has_member(ty: &str, member: &str) -> bool {
    with_btf(|b| b.find(ty, Some(kind::STRUCT)).is_some_and(|s| b.members(&s).any(|m| m == member.as_bytes())))
        .unwrap_or(false)
}

/// True when programs of type `prog` may call helper `func` here (libbpf
/// loads a tiny program that calls it).
pub fn has_helper(prog: libbpf_sys::bpf_prog_type, func: libbpf_sys::bpf_func_id) -> bool {
    // SAFETY: a probe with no options; it loads and frees a tiny program.
    unsafe { libbpf_sys::libbpf_probe_bpf_helper(prog, func, std::ptr::null()) == 1 }
}

/// Socket storage from tracing programs (tp_btf, fentry): Linux 5.11
/// added `bpf_sk_storage_get` for them, and with it the kernel function
/// `bpf_sk_storage_get_tracing` that BTF names. `Err` says what is missing.
pub fn sk_storage_in_tracing() -> Result<(), String> {
    if btf_has_type("bpf_sk_storage_get_tracing") {
        Ok(())
    } else {
        Err("this kernel has no socket storage in tracing programs (bpf_sk_storage_get from tp_btf and fentry: Linux 5.11+)".into())
    }
}

/// `bpf_get_attach_cookie` from kprobe, uprobe and tracepoint programs
/// (Linux 5.15): how funclatency's probes know which target they time (else
/// each target gets a copy of its program).
pub fn has_attach_cookie() -> bool {
    has_helper(libbpf_sys::BPF_PROG_TYPE_KPROBE, libbpf_sys::BPF_FUNC_get_attach_cookie)
}

/// Whether tracepoint programs can read the current task's saved user
/// registers: `bpf_get_current_task_btf` (Linux 5.11) and
/// `bpf_task_pt_regs` (5.15). msglat reads a receive's arguments so at its
/// exit; without them it keeps them from the call's entry.
pub fn has_task_regs() -> bool {
    [libbpf_sys::BPF_FUNC_get_current_task_btf, libbpf_sys::BPF_FUNC_task_pt_regs]
        .into_iter()
        .all(|f| has_helper(libbpf_sys::BPF_PROG_TYPE_TRACEPOINT, f))
}

/// Whether the verifier takes atomic fetch operations (BPF_ATOMIC with
/// BPF_FETCH, compare-and-exchange: Linux 5.12): a four-instruction socket
/// filter that fetch-adds on its stack, loaded and closed.
pub fn has_atomic_fetch() -> bool {
    // code, dst | src << 4, off, imm (struct bpf_insn).
    let raw: [(u8, u8, i16, i32); 6] = [
        (0xb7, 1, 0, 0),            // r1 = 0
        (0x7b, 10 | 1 << 4, -8, 0), // *(u64 *)(r10 - 8) = r1
        (0xb7, 1, 0, 1),            // r1 = 1
        (0xdb, 10 | 1 << 4, -8, 1), // r1 = atomic_fetch_add((u64 *)(r10 - 8), r1)
        (0xb7, 0, 0, 0),            // r0 = 0
        (0x95, 0, 0, 0),            // exit
    ];
    let mut insns = Vec::with_capacity(raw.len() * 8);
    for (code, regs, off, imm) in raw {
        insns.push(code);
        insns.push(regs);
        insns.extend_from_slice(&off.to_le_bytes());
        insns.extend_from_slice(&imm.to_le_bytes());
    }
    let license = c"GPL";
    // SAFETY: `insns` holds 6 encoded instructions (8 bytes each, the
    // layout of struct bpf_insn) and outlives the call; no options.
    let fd = unsafe {
        libbpf_sys::bpf_prog_load(
            libbpf_sys::BPF_PROG_TYPE_SOCKET_FILTER,
            std::ptr::null(),
            license.as_ptr(),
            insns.as_ptr().cast(),
            raw.len() as _,
            std::ptr::null_mut(),
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: a program fd we own.
    unsafe { libc::close(fd) };
    true
}

/// The helper id libbpf itself calls in code it proves dead (its "poisoned"
/// CO-RE relocations): no such helper exists, so the verifier rejects the
/// program if that instruction is reachable and ignores it otherwise.
const POISON_HELPER: i32 = 0xbad2310;

/// Replaces, in a program not yet loaded, every atomic operation a kernel
/// before 5.12 rejects (BPF_ATOMIC other than plain add: fetch, exchange,
/// compare-and-exchange, and/or/xor) with a call to a helper that does not
/// exist. Such kernels reject those instructions before they look at which
/// code can run, even behind a constant in `.rodata` that makes them dead;
/// the program must keep them behind such a constant (msglat's
/// `has_fetch`). If one is reachable after all, the load fails with
/// "invalid func unknown#195896080" (`SONDE_DEBUG=1` prints the log)
/// instead of running wrong. Same length, so every relocation stays valid.
/// Returns how many were replaced.
pub fn poison_atomic_fetch(prog: &mut libbpf_rs::OpenProgramMut<'_>) -> Result<usize, std::io::Error> {
    use libbpf_rs::AsRawLibbpf;
    const BPF_STX_ATOMIC_W: u8 = 0xc3;
    const BPF_STX_ATOMIC_DW: u8 = 0xdb;
    const BPF_CALL: u8 = 0x85;
    let mut insns = prog.insns().to_vec();
    let mut n = 0;
    for i in insns.iter_mut() {
        if matches!(i.code, BPF_STX_ATOMIC_W | BPF_STX_ATOMIC_DW) && i.imm != 0 {
            i.code = BPF_CALL;
            i.set_dst_reg(0);
            i.set_src_reg(0);
            i.off = 0;
            i.imm = POISON_HELPER;
            n += 1;
        }
    }
    if n > 0 {
        // SAFETY: the program is open and not loaded (an OpenProgramMut);
        // libbpf copies the instructions.
        let rc = unsafe {
            libbpf_sys::bpf_program__set_insns(prog.as_libbpf_object().as_ptr(), insns.as_mut_ptr(), insns.len() as _)
        };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(-rc));
        }
    }
    Ok(n)
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
        let td = btf.find(&format!("btf_trace_{name}"), Some(kind::TYPEDEF))?;
        let mut t = btf.next(&td)?;
        // Pointers, typedefs and modifiers down to the prototype (bounded:
        // a malformed file could loop).
        for _ in 0..16 {
            if t.kind == kind::FUNC_PROTO {
                return Some((t.vlen as usize).saturating_sub(1));
            }
            t = btf.next(&t)?;
        }
        None
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

#[cfg(test)]
mod tests {
    use super::*;

    /// (major, minor) of the running kernel.
    fn release() -> (u32, u32) {
        let r = uname_release();
        let mut it = r.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok());
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    }

    #[test]
    fn probes_agree_with_the_release_that_brought_each_feature() {
        // Run as root (the test suite's rule); the probes load programs.
        assert_eq!(has_atomic_fetch(), release() >= (5, 12), "BPF_ATOMIC fetch on {}", uname_release());
        assert_eq!(has_attach_cookie(), release() >= (5, 15), "bpf_get_attach_cookie on {}", uname_release());
    }
}
