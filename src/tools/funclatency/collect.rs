//! funclatency as a `sonde serve` collector: latency histograms of user
//! functions, syscalls, kernel functions and softirqs, kept in the kernel's
//! buckets and exposed at scrape time on exact `le` boundaries; with
//! `labels = ["cgroup"]`, function histograms per cgroup of the caller
//! (softirqs run on behalf of no task, so theirs have no cgroup).
use std::collections::BTreeMap;

use libbpf_rs::{skel::Skel, MapCore, MapFlags};

use super::{
    load, prune_dead_threads, targets::ProbeKind, FunclatencyArgs, Loaded, Probe, FL_GROUPS_FULL, FL_THREADS_FULL,
    FL_TOO_DEEP, FL_UNMATCHED,
};
use crate::{
    engine::{
        attach,
        hist::{read_percpu, Hist},
        record::percpu_sum,
    },
    tools::serve::{
        collector::Collector,
        expo::{Expo, Range, Type},
        labels::{self, CgroupLabels, LabelSet},
    },
};

/// The attached entry and return probes of every target.
pub struct FunclatencyCollector {
    loaded: Loaded,
    probes: Vec<Probe>,
    range: Range,
    by_cgroup: bool,
}

impl FunclatencyCollector {
    /// Loads and attaches `targets` as `sonde funclatency` names them
    /// (`extra`: its other flags, e.g. --cgroup); `range` picks the buckets;
    /// `by_cgroup` splits function histograms by the caller's cgroup.
    pub fn start(targets: &[String], extra: &[String], range: Range, by_cgroup: bool) -> anyhow::Result<Self> {
        let mut argv: Vec<String> = targets.to_vec();
        argv.extend(extra.iter().cloned());
        let mut a: FunclatencyArgs = crate::engine::cli::parse("funclatency", &argv)?;
        a.scope.by_cgroup = by_cgroup;
        let (tf, probes) = a.scope.resolve()?;
        let loaded = load(&a, &tf, &probes)?;
        Ok(Self { loaded, probes, range, by_cgroup })
    }

    /// (target index, cgroup id) -> histogram, from `cg_hists`.
    fn by_cgroup(&self) -> anyhow::Result<Vec<(usize, u64, Hist)>> {
        let m = &self.loaded.skel.maps.cg_hists;
        let mut out = Vec::new();
        for k in m.keys() {
            let (Some(cg), Some(idx)) = (k.get(..8), k.get(8..12)) else { continue };
            let Some(v) = m.lookup(&k, MapFlags::ANY)? else { continue };
            let mut h = Hist::default();
            h.add_raw(&v);
            let idx = u32::from_ne_bytes(idx.try_into()?) as usize;
            out.push((idx, u64::from_ne_bytes(cg.try_into()?), h));
        }
        Ok(out)
    }

    /// The targets' names, as the metrics label them.
    pub fn targets(&self) -> Vec<String> {
        self.probes.iter().map(|p| p.name.clone()).collect()
    }
}

impl Collector for FunclatencyCollector {
    fn name(&self) -> &'static str {
        "funclatency"
    }

    fn mechanism(&self) -> String {
        let p = &self.loaded.probing;
        let mut m = Vec::new();
        if let Some(k) = p.kernel {
            m.push(k.name().to_string());
        }
        if self.probes.iter().any(|p| matches!(p.kind, ProbeKind::User { .. })) {
            m.push(if p.umulti { "uprobe.multi" } else { "uprobe" }.to_string());
        }
        if self.probes.iter().any(|p| matches!(p.kind, ProbeKind::Syscall(..))) {
            m.push("tracepoint".into());
        }
        if self.probes.iter().any(|p| matches!(p.kind, ProbeKind::Softirq(_))) {
            m.push("softirq tracepoints".into());
        }
        m.join("+")
    }

    fn collect(&mut self, e: &mut Expo, labels: &mut CgroupLabels) -> anyhow::Result<()> {
        // Threads that exit inside a call would keep their entry: pruned here,
        // at scrape time, as the one-shot tool does every second.
        prune_dead_threads(&self.loaded.skel.maps.stacks);
        let hists = read_percpu(&self.loaded.skel.maps.hists, self.probes.len())?;
        let refused = &self.loaded.probing.unprobeable;
        let (soft, funcs): (Vec<_>, Vec<_>) = self
            .probes
            .iter()
            .zip(&hists)
            .filter(|(p, _)| !refused.contains(&p.name))
            .partition(|(p, _)| matches!(p.kind, ProbeKind::Softirq(_)));
        if !funcs.is_empty() {
            e.family(
                "sonde_function_latency_seconds",
                Type::Histogram,
                "Latency of calls, from entry to return, per target as funclatency names it (user functions, syscalls, kernel functions)",
            );
            if self.by_cgroup {
                // Summed by label set, as the retrans collector does.
                let mut series: BTreeMap<(usize, LabelSet), Hist> = BTreeMap::new();
                for (idx, cg, h) in self.by_cgroup()? {
                    let Some(p) = self.probes.get(idx) else { continue };
                    if matches!(p.kind, ProbeKind::Softirq(_)) || refused.contains(&p.name) {
                        continue;
                    }
                    series.entry((idx, labels.of(cg))).or_default().merge(&h);
                }
                for ((idx, l), h) in &series {
                    e.histogram(&labels::with(&[("target", &self.probes[*idx].name)], l), h, &self.range);
                }
            } else {
                for (p, h) in funcs {
                    e.histogram(&[("target", &p.name)], h, &self.range);
                }
            }
        }
        if !soft.is_empty() {
            e.family(
                "sonde_softirq_latency_seconds",
                Type::Histogram,
                "Time from softirq entry to exit, per softirq vector",
            );
            for (p, h) in soft {
                let name = p.name.strip_prefix("softirq:").unwrap_or(&p.name);
                e.histogram(&[("softirq", name)], h, &self.range);
            }
        }
        Ok(())
    }

    fn lost(&self) -> anyhow::Result<u64> {
        let st = |slot| percpu_sum(&self.loaded.skel.maps.stats, slot);
        Ok(st(FL_TOO_DEEP)? + st(FL_THREADS_FULL)? + st(FL_UNMATCHED)? + st(FL_GROUPS_FULL)?)
    }

    fn run_time_ns(&self) -> u64 {
        attach::object_run_time_ns(self.loaded.skel.object())
    }
}
