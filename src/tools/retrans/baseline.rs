//! Bench baselines (`sonde retrans --bench-baseline NAME`, hidden; used by
//! `bench/retrans/run`): one program of `baseline.bpf.c` on the same
//! tracepoint as sonde's handler, doing a known part of its work, so the
//! bench can split sonde's in-kernel cost per event on the host it runs on.
use std::{cell::Cell, mem::MaybeUninit};

use anyhow::Context;
use clap::ValueEnum;
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    OpenObject,
};

use crate::engine::{
    features,
    ringbuf::{self, poll_until_stop, PerCpuRings},
    run::RunControl,
};

crate::skeleton!("baseline");
use skel::BaselineSkelBuilder;

/// Which baseline program runs (see baseline.bpf.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Baseline {
    /// Returns at once.
    Empty,
    /// Reads and stamps the event, stores it in per-CPU memory.
    Fields,
    /// The same through sonde's per-CPU ring buffers, read by user space.
    Ring,
    /// The same with the socket's owner from socket storage made at connect.
    Owner,
}

impl Baseline {
    /// Its programs: the one on the tracepoint first.
    fn progs(self) -> &'static [&'static str] {
        match self {
            Baseline::Empty => &["base_empty"],
            Baseline::Fields => &["base_fields"],
            Baseline::Ring => &["base_ring"],
            Baseline::Owner => &["base_owner", "base_owner_made"],
        }
    }
}

/// Runs the baseline until `ctl` says stop; prints how many events user
/// space read (ring only). Returns the exit status.
pub fn run(b: Baseline, ctl: &RunControl) -> anyhow::Result<i32> {
    features::require_tracing_privileges()?;
    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let mut open = BaselineSkelBuilder::default().open(&mut storage).context("opening the baseline object")?;
    let ncpus = PerCpuRings::size_outer(&mut open.maps.sonde_rings)?;
    let ring_bytes = ringbuf::ring_bytes_per_cpu(ncpus, None);
    open.maps.rodata_data.as_deref_mut().expect("rodata present").rb_wake_bytes =
        ringbuf::wake_bytes(ring_bytes as u64);
    let ours = |name: &std::ffi::OsStr| b.progs().iter().any(|p| name.to_string_lossy() == *p);
    let name = b.progs()[0];
    for mut p in open.open_object_mut().progs_mut() {
        let on = ours(p.name());
        p.set_autoload(on);
    }
    let skel = open.load().with_context(|| format!("loading {name}"))?;
    let rings = PerCpuRings::create(&skel.maps.sonde_rings, ring_bytes)?;
    let mut links = Vec::new();
    for p in skel.object().progs_mut() {
        if ours(p.name()) {
            links.push(p.attach().with_context(|| format!("attaching {}", p.name().to_string_lossy()))?);
        }
    }
    eprintln!("sonde: baseline {name} attached");
    // Events read, and those that carried an owner (base_owner: its lookup found the record).
    let (events, owned) = (Cell::new(0u64), Cell::new(0u64));
    let at = std::mem::offset_of!(super::skel::types::rt_event, has_owner);
    let rb = rings.reader(|data| {
        events.set(events.get() + 1);
        owned.set(owned.get() + u64::from(data.get(at).is_some_and(|&b| b != 0)));
    })?;
    let stop = poll_until_stop(Some(&rb), ctl, None, |_| Ok(()))?;
    drop(rb);
    if matches!(b, Baseline::Ring | Baseline::Owner) {
        eprintln!("sonde: baseline {name}: {} events read, {} with an owner", events.get(), owned.get());
    }
    Ok(stop.exit_code())
}
