//! drops as a `sonde serve` collector: packets dropped by reason and
//! protocol, counted in the kernel and read at scrape time; per owner
//! cgroup with `labels = ["cgroup"]`. Labels are bounded: reasons are the
//! kernel's enum (about 125 on 6.18, only those seen are written),
//! protocols the IP protocol numbers seen (at most 256) or "other" for
//! packets that are not IP, and cgroups as serve bounds them.
use std::collections::BTreeMap;

use super::{load, proto_of, read_counts, read_totals, reasons::Reasons, validate, DropsArgs, Loaded, MECHANISMS};
use crate::{
    engine::attach::{self, with_fallbacks, Mechanism},
    tools::serve::{
        collector::Collector,
        expo::{Expo, Type},
        labels::{self, CgroupLabels, LabelSet},
    },
};

/// The attached drop programs in count mode.
pub struct DropsCollector {
    loaded: Loaded,
    mech: Mechanism,
    by_cgroup: bool,
    reasons: Reasons,
}

impl DropsCollector {
    /// Loads and attaches with `argv` as `sonde drops` takes its filters
    /// (--reason, --proto, --iface, --netns, --port, --addr, -4/-6).
    pub fn start(argv: &[String], by_cgroup: bool) -> anyhow::Result<Self> {
        let mut args: Vec<String> = vec!["--count".into()];
        args.extend(argv.iter().cloned());
        let a: DropsArgs = crate::engine::cli::parse("drops", &args)?;
        let reasons = Reasons::load();
        let mut cfg = validate(&a, &reasons)?;
        cfg.by_cgroup = by_cgroup;
        let order = attach::order(MECHANISMS, a.mechanism);
        let (loaded, mech, _) = with_fallbacks("skb:kfree_skb", &order, |m| load(None, &cfg, m, true))?;
        Ok(Self { loaded, mech, by_cgroup, reasons })
    }
}

/// The protocol label: the IP protocol's name, or "other".
fn proto_label(ethertype: u16, l4: u8) -> String {
    match ethertype {
        0x0800 | 0x86dd => proto_of(ethertype, l4, false),
        _ => "other".into(),
    }
}

impl Collector for DropsCollector {
    fn name(&self) -> &'static str {
        "drops"
    }

    fn mechanism(&self) -> String {
        self.mech.to_string()
    }

    fn collect(&mut self, e: &mut Expo, labels: &mut CgroupLabels) -> anyhow::Result<()> {
        e.family(
            "sonde_packet_drops_total",
            Type::Counter,
            "Packets the kernel dropped, by its reason (skb:kfree_skb; the kernel's names) and IP protocol",
        );
        let mut series: BTreeMap<(String, String, LabelSet), u64> = BTreeMap::new();
        for r in read_counts(&self.loaded)? {
            let l = if self.by_cgroup { labels.of(r.key.cgroup) } else { LabelSet::default() };
            *series.entry((self.reasons.name(r.key.reason), proto_label(r.key.ethertype, r.key.l4), l)).or_default() +=
                r.n;
        }
        for ((reason, proto, l), n) in series {
            let base = [("reason", reason.as_str()), ("protocol", proto.as_str())];
            if self.by_cgroup {
                e.sample("", &labels::with(&base, &l), n as f64);
            } else {
                e.sample("", &base, n as f64);
            }
        }
        Ok(())
    }

    fn lost(&self) -> anyhow::Result<u64> {
        let t = read_totals(&self.loaded, &[])?;
        Ok(t.count_full + t.owner_full)
    }

    fn run_time_ns(&self) -> u64 {
        use libbpf_rs::skel::Skel;
        attach::object_run_time_ns(self.loaded.skel.object())
    }
}
