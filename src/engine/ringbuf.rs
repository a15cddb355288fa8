//! Polling: a ring buffer (or nothing, in count mode) until a stop, with a
//! periodic tick for interval output.
//!
//! Wake-ups are batched: BPF programs submit with `BPF_RB_NO_WAKEUP` unless the
//! buffer holds at least [`wake_bytes`] (see `rb_submit_flags` in
//! `src/bpf/sonde.h`), and this loop drains the buffer every [`BATCH`]
//! whatever happened. One wake-up per event costs a context switch each; at
//! 20k events/s that alone was several percent of a core.
use std::cell::RefCell;
use std::os::fd::{AsFd, AsRawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// One record callback shared by the rings of every CPU.
type Shared<'a> = Rc<RefCell<dyn FnMut(&[u8]) + 'a>>;

use anyhow::Context;
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType, RingBuffer, RingBufferBuilder};

use super::run::{RunControl, Stop};

/// How often the reader drains the buffer without being woken.
pub const BATCH: Duration = Duration::from_millis(50);

/// How often a loop with no ring buffer wakes when nothing asks it to
/// (a 10 s `--count` run wakes 20 times, not 200).
pub const IDLE_WAKE: Duration = Duration::from_millis(500);

/// Fill level at which a BPF program wakes the reader early: a quarter of
/// the buffer, so a burst never fills it between two drains.
pub fn wake_bytes(ringbuf_bytes: u64) -> u64 {
    ringbuf_bytes / 4
}

/// Bytes per CPU ring: 8 MiB shared out over the CPUs, at least 256 KiB and
/// at most 2 MiB each, a power of two (`override_kib` replaces it).
pub fn ring_bytes_per_cpu(ncpus: usize, override_kib: Option<u32>) -> u32 {
    let b = match override_kib {
        Some(k) => k.max(16) as u64 * 1024,
        None => ((8u64 << 20) / ncpus.max(1) as u64).clamp(256 << 10, 2 << 20),
    };
    (b.next_power_of_two() as u32).min(1 << 30)
}

/// One BPF ring buffer per CPU behind an object's `sonde_rings` array of maps
/// (`src/bpf/sonde.h`). Before load: [`PerCpuRings::size_outer`]; after
/// load and before attaching: [`PerCpuRings::create`] makes the rings and
/// puts them in place (an event finding no ring is counted as lost).
pub struct PerCpuRings {
    rings: Vec<MapHandle>,
}

impl PerCpuRings {
    /// Sizes the outer map to the possible CPUs (call on the open object).
    pub fn size_outer(outer: &mut libbpf_rs::OpenMapMut<'_>) -> anyhow::Result<usize> {
        let n = libbpf_rs::num_possible_cpus().context("counting possible CPUs")?;
        outer.set_max_entries(n as u32).context("sizing the per-CPU ring table")?;
        Ok(n)
    }

    /// Creates a ring of `bytes` for every CPU and stores it in `outer`.
    pub fn create(outer: &dyn MapCore, bytes: u32) -> anyhow::Result<Self> {
        let n = outer.max_entries();
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        };
        let mut rings = Vec::with_capacity(n as usize);
        for cpu in 0..n {
            let m = MapHandle::create(MapType::RingBuf, Some(format!("sonde_rb{cpu}")), 0, 0, bytes, &opts)
                .with_context(|| format!("creating the ring buffer of CPU {cpu} ({} KiB)", bytes / 1024))?;
            let fd = m.as_fd().as_raw_fd() as u32;
            outer
                .update(&cpu.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
                .with_context(|| format!("installing the ring buffer of CPU {cpu}"))?;
            rings.push(m);
        }
        Ok(Self { rings })
    }

    /// A reader over every ring calling `f` for each record. Records of one
    /// CPU come in order; across CPUs only within a drain (sort if it matters).
    pub fn reader<'a>(&'a self, f: impl FnMut(&[u8]) + 'a) -> anyhow::Result<RingBuffer<'a>> {
        let f: Shared<'a> = Rc::new(RefCell::new(f));
        let mut b = RingBufferBuilder::new();
        for m in &self.rings {
            let f = f.clone();
            b.add(m, move |data: &[u8]| {
                (f.borrow_mut())(data);
                0
            })?;
        }
        Ok(b.build()?)
    }

    /// Returns once every program run that started before now has ended,
    /// so that after detaching, one more drain reads every event they made.
    /// Storing an inner map in an array of maps makes the kernel wait for
    /// running programs (synchronize_rcu, which tracing programs' read-side
    /// sections end); this stores CPU 0's ring again.
    pub fn wait_for_programs(&self, outer: &dyn MapCore) -> anyhow::Result<()> {
        if let Some(m) = self.rings.first() {
            let fd = m.as_fd().as_raw_fd() as u32;
            outer
                .update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
                .context("waiting for running BPF programs")?;
        }
        Ok(())
    }
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
        // With no ring to drain, the loop wakes for a stop (RunControl::wait
        // returns at once), the interval or IDLE_WAKE (a tool's `after`
        // checks, such as a traced process having exited).
        let mut wait = ctl.next_wait(if rb.is_some() { BATCH } else { IDLE_WAKE });
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
            None => ctl.wait(wait),
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
