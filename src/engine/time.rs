//! Clocks: the kernel's monotonic timestamps as wall-clock time.

/// Wall-clock seconds, to the microsecond, of a bpf_ktime_get_ns()
/// (CLOCK_MONOTONIC) time; `mono_to_epoch` from [`mono_to_epoch`].
pub fn epoch_secs(mono_ns: u64, mono_to_epoch: i128) -> f64 {
    ((mono_ns as i128 + mono_to_epoch) as f64 / 1e3).round() / 1e6
}

/// `HH:MM:SS.mmm` (UTC) of nanoseconds since the epoch.
pub fn hms(epoch_ns: u64) -> String {
    let s = epoch_ns / 1_000_000_000;
    let ms = (epoch_ns / 1_000_000) % 1000;
    format!("{:02}:{:02}:{:02}.{ms:03}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}

/// A clock's time in nanoseconds.
pub fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-parameter.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// What to add to bpf_ktime_get_ns() (CLOCK_MONOTONIC) to get wall-clock ns.
pub fn mono_to_epoch() -> i128 {
    clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC)
}
