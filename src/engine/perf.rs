//! Sampling perf events (for `profile`, `slow` and doctor's probe).

/// What a sampling perf event counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// CPU time: a software timer, works everywhere (also in VMs).
    CpuClock,
    /// CPU cycles from the PMU (often missing in VMs).
    Cycles,
}

/// Opens a perf event sampling `hz` times a second on `cpu`, for all tasks.
/// The fd is close-on-exec; attach a BPF program to it (the link owns it).
pub fn open_sampling(cpu: u32, counter: Counter, hz: u64) -> std::io::Result<i32> {
    let mut attr = libbpf_sys::perf_event_attr {
        size: std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32,
        ..Default::default()
    };
    match counter {
        Counter::CpuClock => {
            attr.type_ = libbpf_sys::PERF_TYPE_SOFTWARE;
            attr.config = libbpf_sys::PERF_COUNT_SW_CPU_CLOCK as u64;
        }
        Counter::Cycles => {
            attr.type_ = libbpf_sys::PERF_TYPE_HARDWARE;
            attr.config = libbpf_sys::PERF_COUNT_HW_CPU_CYCLES as u64;
        }
    }
    attr.__bindgen_anon_1.sample_freq = hz;
    attr.set_freq(1);
    // SAFETY: attr is a valid perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const _,
            -1i32,
            cpu as i32,
            -1i32,
            libbpf_sys::PERF_FLAG_FD_CLOEXEC as u64,
        )
    };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fd as i32)
    }
}

/// Whether this machine has a cycles counter to sample on.
pub fn has_cycles() -> bool {
    match open_sampling(0, Counter::Cycles, 49) {
        Ok(fd) => {
            // SAFETY: our own fd, closed once.
            unsafe { libc::close(fd) };
            true
        }
        Err(_) => false,
    }
}

/// The online CPUs (/sys/devices/system/cpu/online).
pub fn online_cpus() -> anyhow::Result<Vec<u32>> {
    use anyhow::Context;
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").context("reading online CPUs")?;
    let mut v = Vec::new();
    for part in s.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<u32>()?..=b.parse::<u32>()?),
            None => v.push(part.parse()?),
        }
    }
    Ok(v)
}

/// Opens a sampling event on every online CPU and attaches `prog` to each;
/// the links own the event fds. `open_err` turns an open failure on a CPU
/// into the error to report.
pub fn attach_sampling(
    prog: &libbpf_rs::ProgramMut<'_>,
    counter: Counter,
    hz: u64,
    open_err: impl Fn(u32, std::io::Error) -> anyhow::Error,
) -> anyhow::Result<Vec<libbpf_rs::Link>> {
    let mut links = Vec::new();
    for cpu in online_cpus()? {
        let fd = open_sampling(cpu, counter, hz).map_err(|e| open_err(cpu, e))?;
        // The link owns the event fd (closes it when dropped); on failure it is ours.
        match prog.attach_perf_event(fd) {
            Ok(l) => links.push(l),
            Err(e) => {
                // SAFETY: our own fd, not taken by a link.
                unsafe { libc::close(fd) };
                return Err(anyhow::Error::new(e).context(format!("attaching to the perf event of CPU {cpu}")));
            }
        }
    }
    Ok(links)
}

/// `PERF_EVENT_IOC_ENABLE`: `_IO('$', 0)`.
pub const IOC_ENABLE: u64 = 0x2400;
/// `PERF_EVENT_IOC_SET_BPF`: `_IOW('$', 8, __u32)`.
pub const IOC_SET_BPF: u64 = 0x4004_2408;

/// A dynamic PMU's type and the config bit that makes a return probe, from
/// /sys/bus/event_source/devices/{uprobe,kprobe}.
fn probe_pmu(pmu: &str) -> anyhow::Result<(u32, u64)> {
    use anyhow::Context;
    let dir = format!("/sys/bus/event_source/devices/{pmu}");
    let ty = std::fs::read_to_string(format!("{dir}/type")).with_context(|| format!("reading {dir}/type"))?;
    let bit = std::fs::read_to_string(format!("{dir}/format/retprobe"))
        .with_context(|| format!("reading {dir}/format/retprobe"))?;
    // "config:0"
    let bit: u32 = bit.trim().strip_prefix("config:").and_then(|b| b.parse().ok()).unwrap_or(0);
    Ok((ty.trim().parse().with_context(|| format!("{dir}/type: not a number"))?, 1u64 << bit.min(63)))
}

/// Opens a perf event for a uprobe, kprobe (return probes with `ret`) or
/// tracepoint, for a BPF program to be attached to (disabled until
/// `IOC_ENABLE`). Close-on-exec.
pub fn open_probe(probe: &super::kfunc::PerfProbe<'_>, ret: bool) -> anyhow::Result<std::os::fd::OwnedFd> {
    use super::kfunc::PerfProbe;
    use anyhow::Context;
    use std::{ffi::CString, os::fd::FromRawFd, os::unix::ffi::OsStrExt};
    let mut attr = libbpf_sys::perf_event_attr {
        size: std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32,
        ..Default::default()
    };
    let mut pid = -1i32;
    // Kept alive until the syscall: the attr points at them.
    let name: CString;
    match probe {
        PerfProbe::Uprobe { path, offset, pid: p } => {
            let (ty, retbit) = probe_pmu("uprobe")?;
            name = CString::new(path.as_os_str().as_bytes()).context("a path with a NUL byte")?;
            attr.type_ = ty;
            attr.config = if ret { retbit } else { 0 };
            attr.__bindgen_anon_3.config1 = name.as_ptr() as u64;
            attr.__bindgen_anon_4.config2 = *offset;
            pid = *p;
        }
        PerfProbe::Kprobe(func) => {
            let (ty, retbit) = probe_pmu("kprobe")?;
            name = CString::new(*func).context("a function name with a NUL byte")?;
            attr.type_ = ty;
            attr.config = if ret { retbit } else { 0 };
            attr.__bindgen_anon_3.config1 = name.as_ptr() as u64;
        }
        PerfProbe::Tracepoint(cat, tp) => {
            name = CString::default();
            let id = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
                .iter()
                .find_map(|t| std::fs::read_to_string(format!("{t}/events/{cat}/{tp}/id")).ok())
                .with_context(|| format!("no tracepoint {cat}:{tp} in tracefs"))?;
            attr.type_ = libbpf_sys::PERF_TYPE_TRACEPOINT;
            attr.config = id.trim().parse().with_context(|| format!("tracepoint {cat}:{tp}: a bad id"))?;
            attr.__bindgen_anon_1.sample_period = 1;
            attr.__bindgen_anon_2.wakeup_events = 1;
        }
    }
    attr.set_disabled(1);
    // Every process on any CPU (cpu 0 is what the kernel asks for with pid
    // -1; probe events fire on every CPU), or one process on any CPU.
    let cpu = if pid == -1 { 0 } else { -1 };
    // SAFETY: attr is a valid perf_event_attr of the size it declares; the
    // strings it points at live until the call returns.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const _,
            pid,
            cpu,
            -1i32,
            libbpf_sys::PERF_FLAG_FD_CLOEXEC as u64,
        )
    };
    drop(name);
    if fd < 0 {
        return Err(anyhow::Error::new(std::io::Error::last_os_error()).context("opening the probe's perf event"));
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}
