//! `sonde lab NAME`: one-command reproductions on real kernel traffic in
//! network namespaces that are always removed afterwards.
pub mod delay;
pub mod dns;
pub mod drops;
pub mod idle;
pub mod msglat;
pub mod netns;
pub mod profile;
pub mod retrans;
pub mod slow;
pub mod traffic;
pub mod why;

use clap::{Args, Subcommand};

/// Run a built-in reproduction of a sonde workflow.
#[derive(Debug, Args)]
pub struct LabArgs {
    /// Which lab.
    #[command(subcommand)]
    pub lab: Lab,
}

/// The labs.
#[derive(Debug, Subcommand)]
pub enum Lab {
    /// Retransmissions of every kind under nftables loss; sonde's per-kind
    /// totals side by side with the namespaces' own MIB counter deltas.
    Retrans(retrans::RetransLabArgs),
    /// Packets dropped for ten kinds of cause at once, IPv4 and IPv6; `sonde
    /// drops` counts each beside the namespaces' own counters.
    Drops(drops::DropsLabArgs),
    /// A bundled workload with a built-in 2:1 CPU split, profiled; the
    /// measured split beside the built-in one, and its flame graphs.
    Profile(profile::ProfileLabArgs),
    /// An HTTP server slowed by reverse DNS lookups in its
    /// logging; profile, offcpu and wakeup find the cause, then the rate
    /// without the resolver's delay.
    Dns(dns::DnsLabArgs),
    /// connect() slow in port selection with TIME_WAIT filling the
    /// ephemeral range; `slow` shows where, then tcp_tw_reuse=1 shrinks it.
    Slow(slow::SlowLabArgs),
    /// A response every few seconds on one connection; CUBIC
    /// restarts slow start after each idle gap, BBR and the sysctl at 0 do
    /// not; `sonde cwnd` shows each, `ss -ti` checks it, and the round trips
    /// each restart costs are measured.
    IdleRestart(idle::IdleLabArgs),
    /// Sender -> message broker -> receiver; end-to-end time with the
    /// broker untraced, logging to memory, logging to a file, and traced by
    /// `sonde msglat`, side by side, with the T2 distribution sonde saw.
    Msglat(msglat::MsglatLabArgs),
    /// A service whose time has a known mix (on CPU, throttled by a CPU
    /// quota, blocked on a lossy peer, on disk, on a lock another thread
    /// holds); `sonde why` recovers each share beside the service's own
    /// split and the kernel's counters, and names each cause.
    Why(why::WhyLabArgs),
}

/// Runs the chosen lab; returns the exit status.
pub fn run(a: &LabArgs) -> anyhow::Result<i32> {
    match &a.lab {
        Lab::Retrans(r) => retrans::run(r),
        Lab::Drops(r) => drops::run(r),
        Lab::Profile(p) => profile::run(p),
        Lab::Dns(d) => dns::run(d),
        Lab::Slow(s) => slow::run(s),
        Lab::IdleRestart(i) => idle::run(i),
        Lab::Msglat(m) => msglat::run(m),
        Lab::Why(w) => why::run(w),
    }
}

/// Writes an embedded workload binary to `dir/name`, executable.
pub fn install(dir: &std::path::Path, name: &str, bytes: &[u8]) -> anyhow::Result<std::path::PathBuf> {
    let bin = dir.join(name);
    std::fs::write(&bin, bytes)?;
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(bin)
}

/// Removes a directory when dropped.
pub struct RemoveDir(pub std::path::PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The median of `v` (the upper one of an even count; 0 when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// The SCHED_FIFO priority of lab workloads whose timing is what a lab or
/// test measures (a delayed path's relay, a broker's built-in hold): above
/// every normal task, so CPU hogs beside the lab cannot preempt them; the
/// lowest real-time priority, so the kernel's own real-time threads still
/// run first.
pub const RT_PRIORITY: i32 = 1;

/// Puts the calling thread (or a process between fork and exec) under
/// SCHED_FIFO at [`RT_PRIORITY`]; threads it starts inherit it. Needs
/// CAP_SYS_NICE and real-time time in the caller's cgroup.
pub fn realtime() -> std::io::Result<()> {
    let p = libc::sched_param { sched_priority: RT_PRIORITY };
    // SAFETY: p is a valid sched_param for the duration of the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// [`realtime`] for the calling thread of a lab; where it is refused, says
/// so once on stderr and the lab goes on at normal priority (its timings
/// then hold on a quiet host only).
pub fn realtime_or_warn() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if let Err(e) = realtime() {
        WARNED.call_once(|| {
            eprintln!("lab: SCHED_FIFO refused ({e}): the workload runs at normal priority, and CPU hogs beside it will skew its timings");
        });
    }
}

/// Makes `c`'s process run under SCHED_FIFO (see [`realtime`]): its spawn
/// fails where that is refused.
pub fn realtime_command(c: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only sched_setscheduler, a system call, between fork and exec.
    unsafe { c.pre_exec(realtime) }
}
