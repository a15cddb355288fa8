//! cwnd as a `sonde serve` collector: sends after idle per congestion
//! control and the kernel's decision, counted in the kernel at the decision
//! (tcp_slow_start_after_idle_check's order), read at scrape time.
use std::collections::BTreeMap;

use libbpf_rs::{skel::Skel, MapCore, MapFlags};

use super::{kernel_hz, load, read_totals, CwndArgs, Loaded, Mode, MECHANISMS, REASONS};
use crate::{
    engine::{
        attach::{self, with_fallbacks, Mechanism},
        record::{cstr, decode},
    },
    tools::serve::{
        collector::Collector,
        expo::{Expo, Type},
        labels::{self, CgroupLabels, LabelSet},
    },
};

/// The attached send-path programs, counting only.
pub struct CwndCollector {
    loaded: Loaded,
    mech: Mechanism,
    by_cgroup: bool,
}

impl CwndCollector {
    /// Loads and attaches with `argv` as `sonde cwnd` takes its filters;
    /// `by_cgroup` splits the counts by the socket owner's cgroup.
    pub fn start(argv: &[String], by_cgroup: bool) -> anyhow::Result<Self> {
        let a: CwndArgs = crate::engine::cli::parse("cwnd", argv)?;
        let flow = a.flow.validate()?;
        let hz = kernel_hz()?;
        let order = attach::order(MECHANISMS, a.mechanism);
        let mode = if by_cgroup { Mode::CountsByCgroup } else { Mode::Counts };
        let (loaded, mech, _) = with_fallbacks("the TCP send path", &order, |m| load(&a, &flow, hz, m, mode))?;
        Ok(Self { loaded, mech, by_cgroup })
    }

    /// (congestion control, reason index, cgroup labels) -> idle sends.
    /// Keys may differ past the name's NUL (a socket whose congestion
    /// control changed) or in cgroup ids behind one path (a cgroup made
    /// again): summed by what the labels show.
    fn counts(&self, labels: &mut CgroupLabels) -> anyhow::Result<BTreeMap<(String, usize, LabelSet), u64>> {
        let m = &self.loaded.skel.maps.idle_counts;
        let mut out = BTreeMap::new();
        for k in m.keys() {
            let Some(v) = m.lookup(&k, MapFlags::ANY)? else { continue };
            let key: super::types::cw_idle_key = decode(&k).ok_or_else(|| anyhow::anyhow!("short map entry"))?;
            let n = u64::from_ne_bytes(v[..8].try_into()?);
            let cc = cstr(&key.cc);
            let cc = if cc.is_empty() { "unknown".into() } else { cc };
            let l = if self.by_cgroup { labels.of(key.cgroup) } else { LabelSet::new() };
            *out.entry((cc, key.reason as usize, l)).or_default() += n;
        }
        Ok(out)
    }
}

impl Collector for CwndCollector {
    fn name(&self) -> &'static str {
        "cwnd"
    }

    fn mechanism(&self) -> String {
        self.mech.to_string()
    }

    fn collect(&mut self, e: &mut Expo, labels: &mut CgroupLabels) -> anyhow::Result<()> {
        let rows = self.counts(labels)?;
        e.family(
            "sonde_tcp_idle_sends_total",
            Type::Counter,
            "Sends after an idle period (longer than the RTO, or with nothing in flight), by congestion control and whether the kernel restarted slow start (reason idle_over_rto) or why not",
        );
        for ((cc, r, l), n) in &rows {
            let reason = REASONS.get(*r).copied().unwrap_or("unknown");
            e.sample("", &labels::with(&[("cc", cc), ("reason", reason)], l), *n as f64);
        }
        e.family(
            "sonde_tcp_slow_start_restarts_total",
            Type::Counter,
            "Sends after idle that restarted slow start (tcp_cwnd_restart: cwnd back to the initial window), by congestion control",
        );
        // Every (cc, cgroup) with idle sends has a series, 0 restarts too.
        let mut restarts: BTreeMap<(&String, &LabelSet), u64> = BTreeMap::new();
        for ((cc, r, l), n) in &rows {
            *restarts.entry((cc, l)).or_default() += if *r == 0 { *n } else { 0 };
        }
        for ((cc, l), n) in restarts {
            e.sample("", &labels::with(&[("cc", cc)], l), n as f64);
        }
        Ok(())
    }

    fn lost(&self) -> anyhow::Result<u64> {
        let t = read_totals(&self.loaded)?;
        Ok(t.conn_full + t.unreadable + t.missed)
    }

    fn run_time_ns(&self) -> u64 {
        attach::object_run_time_ns(self.loaded.skel.object())
    }
}
