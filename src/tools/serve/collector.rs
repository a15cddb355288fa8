//! What `sonde serve` asks of each tool it runs headless: attach once, then
//! write its metric families from the kernel's maps at every scrape.
use super::expo::Expo;

/// A loaded and attached collector. Everything it reports is counted in the
/// kernel; `collect` only reads maps (no timers, no per-event work here).
pub trait Collector {
    /// Its name in `sonde_collector_up{collector}` and the config.
    fn name(&self) -> &'static str;
    /// The attach mechanism it uses (for `sonde_collector_up`'s `mechanism`).
    fn mechanism(&self) -> String;
    /// Writes its families.
    fn collect(&mut self, e: &mut Expo, labels: &mut super::labels::CgroupLabels) -> anyhow::Result<()>;
    /// Events it could not count (map full, ring full, kernel skipped).
    fn lost(&self) -> anyhow::Result<u64>;
    /// Time its programs ran in the kernel, in ns (counted while
    /// kernel.bpf_stats_enabled is 1): `sonde_bpf_run_seconds_total`.
    fn run_time_ns(&self) -> u64;
}
