//! Run control: duration, SIGINT/SIGTERM, and the exit status they imply.
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use super::error::usage;

/// Why a tracing loop stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `-d` elapsed (or the workload finished).
    Done,
    /// SIGINT: exit 130 after the summary.
    Interrupted,
    /// SIGTERM: a clean stop, exit 0 after the summary.
    Terminated,
}

impl Stop {
    /// The process exit status that goes with this stop.
    pub fn exit_code(self) -> i32 {
        match self {
            Stop::Interrupted => 130,
            _ => 0,
        }
    }
}

const STOP_REQUESTED: usize = usize::MAX;

/// Watches signals and an optional deadline.
#[derive(Clone)]
pub struct RunControl {
    signal: Arc<AtomicUsize>,
    duration: Option<Duration>,
    deadline: Arc<std::sync::Mutex<Option<Instant>>>,
    /// When the loop has something of its own to look at (see
    /// [`RunControl::look_at`]).
    look: Arc<std::sync::Mutex<Option<Instant>>>,
    wake: &'static Wake,
}

/// A socket pair a stop writes a byte to (the signal handlers and
/// [`RunControl::request_stop`]), so that [`RunControl::wait`] returns at
/// once instead of at its timeout. The byte is never read: once a stop is
/// asked for, every wait returns at once. Kept for the life of the process
/// (two descriptors per [`RunControl::new`]): the signal handlers hold the
/// write end's number, which must never be closed and reused, and a write
/// to it must never find its reader gone.
struct Wake {
    rx: std::os::unix::net::UnixStream,
    tx: std::os::fd::RawFd,
}

impl Wake {
    fn new() -> std::io::Result<Wake> {
        use std::os::fd::IntoRawFd;
        let (rx, tx) = std::os::unix::net::UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        Ok(Wake { rx, tx: tx.into_raw_fd() })
    }

    fn wake(&self) {
        // SAFETY: `tx` is an open socket for the life of the process; a
        // full buffer (EAGAIN) already wakes the reader.
        unsafe { libc::send(self.tx, [1u8].as_ptr().cast(), 1, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    }
}

impl RunControl {
    /// Installs SIGINT/SIGTERM handlers; `duration` of None runs until a signal.
    pub fn new(duration: Option<Duration>) -> anyhow::Result<Self> {
        let signal = Arc::new(AtomicUsize::new(0));
        let wake: &'static Wake = Box::leak(Box::new(Wake::new()?));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // The flag first: the handlers run in the order registered.
            signal_hook::flag::register_usize(sig, signal.clone(), sig as usize)?;
            signal_hook::low_level::pipe::register_raw(sig, wake.tx)?;
        }
        Ok(Self {
            signal,
            duration,
            deadline: Arc::new(std::sync::Mutex::new(duration.map(|d| Instant::now() + d))),
            look: Arc::default(),
            wake,
        })
    }

    /// A control for a run inside this process's (sonde serve's profiles):
    /// the same signals stop it, with its own `duration`.
    pub fn with_duration(&self, duration: Duration) -> Self {
        Self {
            signal: self.signal.clone(),
            duration: Some(duration),
            deadline: Arc::new(std::sync::Mutex::new(Some(Instant::now() + duration))),
            look: Arc::default(),
            wake: self.wake,
        }
    }

    /// Starts the duration over from now: tools call it once attached, so
    /// that a long attach (hundreds of probes) does not eat into `-d`.
    pub fn start_clock(&self) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = self.duration.map(|d| Instant::now() + d);
    }

    fn deadline(&self) -> Option<Instant> {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the loop to stop as if the duration had elapsed (labs, tests).
    pub fn request_stop(&self) {
        self.signal.store(STOP_REQUESTED, Ordering::Relaxed);
        self.wake.wake();
    }

    /// Sleeps for `d`, or less when a signal or [`RunControl::request_stop`]
    /// asks the run to stop (a stop asked for before the call returns at
    /// once): loops with nothing to read wake for a stop, not to look.
    pub fn wait(&self, d: Duration) {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd { fd: self.wake.rx.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // Rounded up: a wait under 1 ms must not become a poll that returns at once.
        let ms = d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call. EINTR (a
        // signal) returns early, which is what a stop wants.
        unsafe { libc::poll(&mut p, 1, ms) };
    }

    /// Some(reason) once the loop should stop.
    pub fn should_stop(&self) -> Option<Stop> {
        if self.signal.load(Ordering::Relaxed) == STOP_REQUESTED {
            return Some(Stop::Done);
        }
        match self.signal.load(Ordering::Relaxed) as i32 {
            signal_hook::consts::SIGINT => return Some(Stop::Interrupted),
            signal_hook::consts::SIGTERM => return Some(Stop::Terminated),
            _ => {}
        }
        match self.deadline() {
            Some(d) if Instant::now() >= d => Some(Stop::Done),
            _ => None,
        }
    }

    /// Time left before the deadline, capped at `max`.
    pub fn next_wait(&self, max: Duration) -> Duration {
        let look = *self.look.lock().unwrap_or_else(|e| e.into_inner());
        [self.deadline(), look]
            .into_iter()
            .flatten()
            .map(|d| d.saturating_duration_since(Instant::now()))
            .fold(max, Duration::min)
    }

    /// Wakes the loop's next wait by `at` (None: nothing to look at), as
    /// for the end of the duration, without stopping the run.
    pub fn look_at(&self, at: Option<Instant>) {
        *self.look.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h30m`; a bare number means seconds.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(usage(format!("duration '{s}' is negative; give a positive time such as 10s or 500ms")));
    }
    let d = if t.chars().all(|c| c.is_ascii_digit() || c == '.') && !t.is_empty() {
        t.parse::<f64>().ok().and_then(|f| Duration::try_from_secs_f64(f).ok())
    } else {
        humantime::parse_duration(t).ok()
    };
    match d {
        Some(d) if !d.is_zero() => Ok(d),
        Some(_) => Err(usage(format!("duration '{s}' is zero; give a positive time such as 10s"))),
        None => Err(usage(format!("duration '{s}' is not a time; write it like 10s, 500ms or 2m"))),
    }
}

/// clap value parser for durations that may be `0` (a switch turned off).
pub fn duration_or_zero_arg(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    duration_arg(s)
}

/// clap value parser for durations (keeps the one-line message).
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop asked for from another thread ends a long wait (a loop with
    /// nothing to read no longer wakes every 50 ms to look), and every
    /// wait after it returns at once (two 20 s waits that ran out would
    /// take 40 s).
    #[test]
    fn a_stop_ends_a_wait() {
        let ctl = RunControl::new(None).unwrap();
        let other = ctl.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            other.request_stop();
        });
        let start = Instant::now();
        ctl.wait(Duration::from_secs(20));
        ctl.wait(Duration::from_secs(20));
        t.join().unwrap();
        assert_eq!(ctl.should_stop(), Some(Stop::Done));
        assert!(start.elapsed() < Duration::from_secs(15), "{:?}", start.elapsed());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
