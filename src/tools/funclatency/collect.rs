//! funclatency as a `sonde serve` collector: latency histograms of user
//! functions, syscalls, kernel functions and softirqs, kept in the kernel's
//! buckets and exposed at scrape time on exact `le` boundaries.
use libbpf_rs::skel::Skel;

use super::{
    load, prune_dead_threads, targets::ProbeKind, FunclatencyArgs, Loaded, Probe, FL_THREADS_FULL, FL_TOO_DEEP,
    FL_UNMATCHED,
};
use crate::{
    engine::{attach, hist::read_percpu, record::percpu_sum},
    tools::serve::{
        collector::Collector,
        expo::{Expo, Range, Type},
        labels::CgroupLabels,
    },
};

/// The attached entry and return probes of every target.
pub struct FunclatencyCollector {
    loaded: Loaded,
    probes: Vec<Probe>,
    range: Range,
}

impl FunclatencyCollector {
    /// Loads and attaches `targets` as `sonde funclatency` names them
    /// (`extra`: its other flags, e.g. --cgroup); `range` picks the buckets.
    pub fn start(targets: &[String], extra: &[String], range: Range) -> anyhow::Result<Self> {
        let mut argv: Vec<String> = targets.to_vec();
        argv.extend(extra.iter().cloned());
        let a: FunclatencyArgs = crate::engine::cli::parse("funclatency", &argv)?;
        let (tf, probes) = a.scope.resolve()?;
        let loaded = load(&a, &tf, &probes)?;
        Ok(Self { loaded, probes, range })
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

    fn collect(&mut self, e: &mut Expo, _labels: &mut CgroupLabels) -> anyhow::Result<()> {
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
            for (p, h) in funcs {
                e.histogram(&[("target", &p.name)], h, &self.range);
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
        Ok(st(FL_TOO_DEEP)? + st(FL_THREADS_FULL)? + st(FL_UNMATCHED)?)
    }

    fn run_time_ns(&self) -> u64 {
        attach::object_run_time_ns(self.loaded.skel.object())
    }
}
