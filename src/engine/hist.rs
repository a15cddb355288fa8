//! Latency histograms as the kernel halves fill them (src/bpf/hist.h): four buckets per power
//! of two (each within 25%), their percentile estimates, and their text form
//! (one row per power of two, as log2 histograms are usually read).

/// Buckets per histogram (HIST_BUCKETS in src/bpf/hist.h).
pub const BUCKETS: usize = 256;

/// One target's latencies, summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hist {
    /// Calls per bucket.
    pub buckets: [u64; BUCKETS],
    /// Calls.
    pub count: u64,
    /// Sum of latencies.
    pub sum_ns: u64,
    /// Longest call.
    pub max_ns: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Self { buckets: [0; BUCKETS], count: 0, sum_ns: 0, max_ns: 0 }
    }
}

/// The bucket of a latency (as funclatency.bpf.c computes it).
pub fn bucket(ns: u64) -> usize {
    if ns < 4 {
        return ns as usize;
    }
    let l = 63 - ns.leading_zeros() as usize;
    (4 * (l - 1) + ((ns >> (l - 2)) & 3) as usize).min(LAST)
}

/// The last bucket a latency can fall in (2^63 and up); those above are
/// never used.
pub const LAST: usize = 251;

/// Lower bound of bucket `b` in ns.
pub fn low(b: usize) -> u64 {
    let b = b.min(LAST);
    if b < 4 {
        return b as u64;
    }
    let (l, sub) = (b / 4 + 1, (b % 4) as u64);
    (4 + sub) << (l - 2)
}

/// Upper bound (exclusive) of bucket `b` in ns.
pub fn high(b: usize) -> u64 {
    let b = b.min(LAST);
    if b < 4 {
        return b as u64 + 1;
    }
    let (l, sub) = (b / 4 + 1, (b % 4) as u64);
    if l >= 63 && sub == 3 {
        u64::MAX
    } else {
        (5 + sub) << (l - 2)
    }
}

/// The power of two a bucket lies in (its text row).
fn octave(b: usize) -> usize {
    if b < 4 {
        (b as u64).max(1).ilog2() as usize
    } else {
        (b / 4 + 1).min(63)
    }
}

impl Hist {
    /// Parses one CPU's `struct sonde_hist` and adds it.
    pub fn add_raw(&mut self, raw: &[u8]) {
        let u = |i: usize| u64::from_ne_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap());
        for b in 0..BUCKETS {
            self.buckets[b] += u(b);
        }
        self.count += u(BUCKETS);
        self.sum_ns += u(BUCKETS + 1);
        self.max_ns = self.max_ns.max(u(BUCKETS + 2));
    }

    /// Adds another histogram's calls.
    pub fn merge(&mut self, other: &Hist) {
        for b in 0..BUCKETS {
            self.buckets[b] += other.buckets[b];
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// `self - earlier` (an interval's calls; max is the run's so far).
    pub fn since(&self, earlier: &Hist) -> Hist {
        let mut h = self.clone();
        for b in 0..BUCKETS {
            h.buckets[b] -= earlier.buckets[b].min(h.buckets[b]);
        }
        h.count -= earlier.count.min(h.count);
        h.sum_ns -= earlier.sum_ns.min(h.sum_ns);
        h
    }

    /// Mean latency, ns.
    pub fn avg_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }

    /// The q-quantile (0..1), interpolated linearly inside its bucket and
    /// capped at the longest call seen.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = q * self.count as f64;
        let mut seen = 0.0;
        for b in 0..BUCKETS {
            let n = self.buckets[b] as f64;
            if n > 0.0 && seen + n >= rank {
                let frac = ((rank - seen) / n).clamp(0.0, 1.0);
                let (lo, hi) = (low(b) as f64, high(b).min(self.max_ns.saturating_add(1)) as f64);
                return (lo + frac * (hi - lo).max(0.0)) as u64;
            }
            seen += n;
        }
        self.max_ns
    }

    /// The text histogram: one row per power of two over the non-empty
    /// range, with a bar.
    pub fn render(&self) -> String {
        let mut rows = [0u64; 64];
        for (b, &c) in self.buckets.iter().enumerate() {
            rows[octave(b)] += c;
        }
        let Some(first) = rows.iter().position(|&c| c > 0) else { return "  (no calls)\n".into() };
        let last = rows.iter().rposition(|&c| c > 0).unwrap_or(first);
        let peak = *rows.iter().max().unwrap_or(&1);
        let mut s = format!("  {:>21}  {:>10}  distribution\n", "latency", "count");
        for (o, &c) in rows.iter().enumerate().take(last + 1).skip(first) {
            let (lo, hi) = (if o == 0 { 0 } else { 1u64 << o }, if o >= 63 { u64::MAX } else { 1u64 << (o + 1) });
            let bar = "*".repeat(((c as f64 / peak as f64) * 40.0).round() as usize);
            s.push_str(&format!("  {:>9} -> {:<9} {:>10}  |{bar:<40}|\n", human(lo), human(hi), c));
        }
        s
    }

    /// The JSON buckets: `[{"le_ns": upper bound, "count": n}, ...]` over the
    /// non-empty range.
    pub fn json_buckets(&self) -> Vec<serde_json::Value> {
        let Some(first) = self.buckets.iter().position(|&c| c > 0) else { return Vec::new() };
        let last = self.buckets.iter().rposition(|&c| c > 0).unwrap_or(first);
        (first..=last).map(|b| serde_json::json!({"le_ns": high(b), "count": self.buckets[b]})).collect()
    }
}

/// A latency in the unit that suits it: 850ns, 12.5us, 3.2ms, 1.50s.
pub fn human(ns: u64) -> String {
    match ns {
        u64::MAX => "inf".into(),
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => trim(n as f64 / 1e3, "us"),
        n if n < 1_000_000_000 => trim(n as f64 / 1e6, "ms"),
        n => trim(n as f64 / 1e9, "s"),
    }
}

fn trim(v: f64, unit: &str) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}{unit}")
    } else if v >= 10.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

/// Histograms 0..n of a per-CPU array of `struct sonde_hist`, summed over CPUs.
pub fn read_percpu(map: &dyn libbpf_rs::MapCore, n: usize) -> anyhow::Result<Vec<Hist>> {
    (0..n)
        .map(|i| {
            let mut h = Hist::default();
            if let Some(per_cpu) = map.lookup_percpu(&(i as u32).to_ne_bytes(), libbpf_rs::MapFlags::ANY)? {
                for raw in per_cpu {
                    h.add_raw(&raw);
                }
            }
            Ok(h)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_line_and_quantiles_stay_in_them() {
        for b in 0..LAST {
            assert_eq!(high(b), low(b + 1), "bucket {b}");
            assert_eq!(bucket(low(b)), b);
            assert_eq!(bucket(high(b) - 1), b);
        }
        let mut h = Hist::default();
        // 100 calls of 1.0-1.2 ms: all in the bucket [1048576, 1310720).
        let b = bucket(1_100_000);
        h.buckets[b] = 100;
        h.count = 100;
        h.max_ns = 1_200_000;
        let p50 = h.quantile_ns(0.5);
        assert!(p50 >= low(b) && p50 <= 1_200_001, "{p50}");
        assert!(h.quantile_ns(0.99) <= 1_200_001);
        assert_eq!(human(1_500_000), "1.50ms");
        assert_eq!(human(250), "250ns");
    }
}
