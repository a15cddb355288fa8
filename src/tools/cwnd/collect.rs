//! cwnd as a `sonde serve` collector: sends after idle per congestion
//! control and the kernel's decision, counted in the kernel at the decision
//! (tcp_slow_start_after_idle_check's order), read at scrape time.
use libbpf_rs::{skel::Skel, MapCore, MapFlags};

use super::{kernel_hz, load, read_totals, CwndArgs, Loaded, MECHANISMS, REASONS};
use crate::{
    engine::{
        attach::{self, with_fallbacks, Mechanism},
        record::{cstr, decode},
    },
    tools::serve::{
        collector::Collector,
        expo::{Expo, Type},
        labels::CgroupLabels,
    },
};

/// The attached send-path programs, counting only.
pub struct CwndCollector {
    loaded: Loaded,
    mech: Mechanism,
}

impl CwndCollector {
    /// Loads and attaches with `argv` as `sonde cwnd` takes its filters.
    pub fn start(argv: &[String]) -> anyhow::Result<Self> {
        let a: CwndArgs = crate::engine::cli::parse("cwnd", argv)?;
        let flow = a.flow.validate()?;
        let hz = kernel_hz()?;
        let order = attach::order(MECHANISMS, a.mechanism);
        let (loaded, mech, _) = with_fallbacks("the TCP send path", &order, |m| load(&a, &flow, hz, m, true))?;
        Ok(Self { loaded, mech })
    }

    /// (congestion control, reason index) -> idle sends.
    fn counts(&self) -> anyhow::Result<Vec<(String, usize, u64)>> {
        let m = &self.loaded.skel.maps.idle_counts;
        let mut out = Vec::new();
        for k in m.keys() {
            let Some(v) = m.lookup(&k, MapFlags::ANY)? else { continue };
            let key: super::types::cw_idle_key = decode(&k).ok_or_else(|| anyhow::anyhow!("short map entry"))?;
            let n = u64::from_ne_bytes(v[..8].try_into()?);
            let cc = cstr(&key.cc);
            out.push((if cc.is_empty() { "unknown".into() } else { cc }, key.reason as usize, n));
        }
        // Keys may differ past the name's NUL (a socket whose congestion
        // control changed): summed by what the labels show.
        out.sort();
        out.dedup_by(|b, a| {
            let same = a.0 == b.0 && a.1 == b.1;
            if same {
                a.2 += b.2;
            }
            same
        });
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

    fn collect(&mut self, e: &mut Expo, _labels: &mut CgroupLabels) -> anyhow::Result<()> {
        let rows = self.counts()?;
        e.family(
            "sonde_tcp_idle_sends_total",
            Type::Counter,
            "Sends after an idle period (longer than the RTO, or with nothing in flight), by congestion control and whether the kernel restarted slow start (reason idle_over_rto) or why not",
        );
        for (cc, r, n) in &rows {
            e.sample("", &[("cc", cc), ("reason", REASONS.get(*r).copied().unwrap_or("unknown"))], *n as f64);
        }
        e.family(
            "sonde_tcp_slow_start_restarts_total",
            Type::Counter,
            "Sends after idle that restarted slow start (tcp_cwnd_restart: cwnd back to the initial window), by congestion control",
        );
        let mut ccs: Vec<&String> = rows.iter().map(|r| &r.0).collect();
        ccs.dedup();
        for cc in ccs {
            let n: u64 = rows.iter().filter(|r| &r.0 == cc && r.1 == 0).map(|r| r.2).sum();
            e.sample("", &[("cc", cc)], n as f64);
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
