//! Polling: a ring buffer (or nothing, in count mode) until a stop, with a
//! periodic tick for interval output.
//!
//! Wake-ups are batched: BPF programs submit with `BPF_RB_NO_WAKEUP` unless the
//! buffer holds at least [`wake_bytes`] (see `rb_submit_flags` in
//! `src/bpf/sonde.h`), and this loop drains the buffer every [`BATCH`]
//! whatever happened. One wake-up per event costs a context switch each; at
//! 20k events/s that alone was several percent of a core.
use std::time::{Duration, Instant};

use libbpf_rs::RingBuffer;

use super::run::{RunControl, Stop};

/// How often the reader drains the buffer without being woken.
pub const BATCH: Duration = Duration::from_millis(50);

/// Fill level at which a BPF program wakes the reader early: a quarter of
/// the buffer, so a burst never fills it between two drains.
pub fn wake_bytes(ringbuf_bytes: u64) -> u64 {
    ringbuf_bytes / 4
}

/// Polls `rb` (if any) until `ctl` says stop. After every drain it calls
/// `after(due)`, with `due` true once per `interval` (for periodic output; a
/// tool also flushes its output there). Returns why it stopped. Events are
/// handled by the ring buffer's callbacks.
pub fn poll_until_stop(
    rb: Option<&RingBuffer<'_>>,
    ctl: &RunControl,
    interval: Option<Duration>,
    mut after: impl FnMut(bool) -> anyhow::Result<()>,
) -> anyhow::Result<Stop> {
    let mut next_tick = interval.map(|i| Instant::now() + i);
    let stop = loop {
        if let Some(s) = ctl.should_stop() {
            break s;
        }
        let mut wait = ctl.next_wait(BATCH);
        if let Some(t) = next_tick {
            wait = wait.min(t.saturating_duration_since(Instant::now()));
        }
        match rb {
            Some(rb) => {
                if let Err(e) = rb.poll(wait) {
                    // EINTR from our own signal handler is a normal wake-up.
                    if e.kind() != libbpf_rs::ErrorKind::Interrupted {
                        return Err(anyhow::Error::new(e).context("polling the ring buffer"));
                    }
                }
                // A timeout returns without reading: drain what arrived unannounced.
                rb.consume().map_err(|e| anyhow::Error::new(e).context("reading the ring buffer"))?;
            }
            None => std::thread::sleep(wait),
        }
        let mut due = false;
        if let (Some(t), Some(i)) = (next_tick, interval) {
            if Instant::now() >= t {
                due = true;
                next_tick = Some(t + i);
            }
        }
        after(due)?;
    };
    // Drain what is already in the buffer so the summary and events agree.
    if let Some(rb) = rb {
        let _ = rb.consume();
    }
    Ok(stop)
}
