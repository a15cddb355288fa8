//! retrans as a `sonde serve` collector: segments per cause, failed attempts
//! per error and unseen segments, counted in the kernel and read at scrape
//! time; per owner cgroup with `labels = ["cgroup"]`.
use libbpf_rs::{MapCore, MapFlags};

use super::{load, read_totals, read_totals_with, validate, Loaded, RetransArgs, KINDS, KIND_MAX, MECHANISMS};
use crate::{
    engine::{
        attach::{self, with_fallbacks, Mechanism},
        record::decode,
    },
    tools::serve::{
        collector::Collector,
        expo::{Expo, Type},
        labels::{self, CgroupLabels, LabelSet},
    },
};

/// The attached retrans programs in count mode, without the per-flow table.
pub struct RetransCollector {
    loaded: Loaded,
    mech: Mechanism,
    by_cgroup: bool,
    /// This scrape's totals (read once per scrape: ~300 map lookups).
    last: Option<super::Totals>,
}

impl RetransCollector {
    /// Loads and attaches with `argv` as `sonde retrans` takes its filters
    /// (--port, --addr, --netns, --cgroup, -4/-6).
    pub fn start(argv: &[String], by_cgroup: bool) -> anyhow::Result<Self> {
        let mut args: Vec<String> = vec!["--count".into()];
        args.extend(argv.iter().cloned());
        let a: RetransArgs = crate::engine::cli::parse("retrans", &args)?;
        let mut cfg = validate(&a)?;
        cfg.flows_off = true;
        cfg.by_cgroup = by_cgroup;
        let order = attach::order(MECHANISMS, a.mechanism);
        let (loaded, mech, _) = with_fallbacks("tcp:tcp_retransmit_skb", &order, |m| load(&a, &cfg, m))?;
        Ok(Self { loaded, mech, by_cgroup, last: None })
    }

    /// (cgroup id, kind) -> segments, from the per-cgroup map.
    fn groups(&self) -> anyhow::Result<Vec<(u64, usize, u64)>> {
        let m = &self.loaded.skel.maps.groups;
        let mut out = Vec::new();
        for k in m.keys() {
            let Some(v) = m.lookup(&k, MapFlags::ANY)? else { continue };
            let key: super::types::rt_group = decode(&k).ok_or_else(|| anyhow::anyhow!("short map entry"))?;
            let val: super::types::rt_group_stats = decode(&v).ok_or_else(|| anyhow::anyhow!("short map entry"))?;
            out.push((key.cgroup, key.kind as usize, val.segs));
        }
        Ok(out)
    }
}

impl Collector for RetransCollector {
    fn name(&self) -> &'static str {
        "retrans"
    }

    fn mechanism(&self) -> String {
        self.mech.to_string()
    }

    fn collect(&mut self, e: &mut Expo, labels: &mut CgroupLabels) -> anyhow::Result<()> {
        let t = read_totals_with(&self.loaded.skel, false)?;
        self.last = Some(t.clone());
        e.family(
            "sonde_tcp_retransmit_segments_total",
            Type::Counter,
            "TCP segments retransmitted, by cause (tcp:tcp_retransmit_skb and tcp_retransmit_synack; failed attempts not included)",
        );
        if self.by_cgroup {
            // Summed by label set: a cgroup deleted and made again at the
            // same path has a new id, and both must be one series.
            let mut series: std::collections::BTreeMap<(usize, LabelSet), u64> = Default::default();
            for (cg, kind, segs) in self.groups()? {
                if kind < KIND_MAX - 1 {
                    *series.entry((kind, labels.of(cg))).or_default() += segs;
                }
            }
            for ((kind, l), segs) in series {
                e.sample("", &labels::with(&[("kind", KINDS[kind])], &l), segs as f64);
            }
        } else {
            for (k, name) in KINDS.iter().enumerate().take(KIND_MAX - 1) {
                e.sample("", &[("kind", name)], t.segs[k] as f64);
            }
        }
        e.single(
            "sonde_tcp_retransmit_unseen_segments_total",
            Type::Counter,
            "Retransmitted segments no tracepoint run saw, found in the sockets' own counters at their next state change",
            t.unseen_segs as f64,
        );
        e.family(
            "sonde_tcp_retransmit_failed_total",
            Type::Counter,
            "Retransmit attempts that failed, by error (tracepoints with the err field only)",
        );
        for (err, n) in &t.failed {
            e.sample("", &[("err", err)], *n as f64);
        }
        Ok(())
    }

    fn lost(&self) -> anyhow::Result<u64> {
        let t = match &self.last {
            Some(t) => t.clone(),
            None => read_totals(&self.loaded.skel)?,
        };
        Ok(t.owner_full + t.unreadable + super::missed(&self.loaded) + group_full(&self.loaded)?)
    }

    fn run_time_ns(&self) -> u64 {
        use libbpf_rs::skel::Skel;
        attach::object_run_time_ns(self.loaded.skel.object())
    }
}

fn group_full(l: &Loaded) -> anyhow::Result<u64> {
    crate::engine::record::percpu_sum(&l.skel.maps.stats, super::STAT_GROUP_FULL as u32)
}
