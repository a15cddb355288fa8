//! Polling: a ring buffer (or nothing, in count mode) until a stop, with a
//! periodic tick for interval output.
use std::time::{Duration, Instant};

use libbpf_rs::RingBuffer;

use super::run::{RunControl, Stop};

/// Polls `rb` (if any) until `ctl` says stop; calls `tick` every `interval`.
/// Returns why it stopped. Events are handled by the ring buffer's callbacks.
pub fn poll_until_stop(
    rb: Option<&RingBuffer<'_>>,
    ctl: &RunControl,
    interval: Option<Duration>,
    mut tick: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Stop> {
    let mut next_tick = interval.map(|i| Instant::now() + i);
    let stop = loop {
        if let Some(s) = ctl.should_stop() {
            break s;
        }
        let mut wait = ctl.next_wait(Duration::from_millis(100));
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
            }
            None => std::thread::sleep(wait),
        }
        if let (Some(t), Some(i)) = (next_tick, interval) {
            if Instant::now() >= t {
                tick()?;
                next_tick = Some(t + i);
            }
        }
    };
    // Drain what is already in the buffer so the summary and events agree.
    if let Some(rb) = rb {
        let _ = rb.consume();
    }
    Ok(stop)
}
