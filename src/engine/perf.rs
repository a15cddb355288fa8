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
