//! The Prometheus text exposition format (version 0.0.4), written at scrape
//! time from values read out of BPF maps.
//!
//! Hand-written rather than through `prometheus-client`: that crate's text
//! encoder writes OpenMetrics only (a counter family `x` whose samples are
//! `x_total`, and `# EOF`), and the metrics here are built once per scrape
//! from kernel counters, never held as instruments, so all that is needed is
//! correct escaping, one HELP/TYPE per family and its samples kept together.
use std::{collections::BTreeSet, fmt::Write};

use crate::engine::hist::{self, Hist};

/// The content type of this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// Only goes up (names end in `_total`).
    Counter,
    /// A value now.
    Gauge,
    /// Cumulative `_bucket{le}`, `_sum` and `_count`.
    Histogram,
}

/// One scrape's text.
#[derive(Default)]
pub struct Expo {
    out: String,
    families: BTreeSet<String>,
    current: String,
    /// Series written.
    pub series: usize,
}

/// Label pairs of one sample.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

impl Expo {
    /// Starts family `name` (its samples follow). A family named twice is a
    /// bug in sonde: its second start is ignored in release builds.
    pub fn family(&mut self, name: &str, ty: Type, help: &str) {
        debug_assert!(valid_name(name), "{name}");
        debug_assert!(!self.families.contains(name), "family {name} written twice");
        self.current = name.to_string();
        if !self.families.insert(name.to_string()) {
            return;
        }
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let t = match ty {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {t}");
    }

    /// One sample of the current family (`suffix`: "" or `_bucket`, `_sum`,
    /// `_count`).
    pub fn sample(&mut self, suffix: &str, labels: Labels<'_>, value: f64) {
        self.out.push_str(&self.current);
        self.out.push_str(suffix);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                debug_assert!(valid_name(k), "{k}");
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.out.push_str("\\\\"),
                        '"' => self.out.push_str("\\\""),
                        '\n' => self.out.push_str("\\n"),
                        c => self.out.push(c),
                    }
                }
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        write_value(&mut self.out, value);
        self.out.push('\n');
        self.series += 1;
    }

    /// A family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, ty: Type, help: &str, value: f64) {
        self.family(name, ty, help);
        self.sample("", &[], value);
    }

    /// One histogram of the current family from sonde's in-kernel buckets,
    /// at the boundaries `les` picked (bucket indexes; see [`Range`]).
    pub fn histogram(&mut self, labels: Labels<'_>, h: &Hist, range: &Range) {
        let les: Vec<String> = range.ends.iter().map(|&b| le_seconds(b)).collect();
        let mut cum = 0u64;
        let mut b = 0usize;
        for (&last, le) in range.ends.iter().zip(les.iter().map(String::as_str).chain(std::iter::once("+Inf"))) {
            while b <= last {
                cum += h.buckets[b];
                b += 1;
            }
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", le));
            self.sample("_bucket", &with_le, cum as f64);
        }
        // +Inf and _count from the buckets themselves: the kernel adds to a
        // bucket before the count, so a read between the two would put a
        // finite bucket above +Inf.
        let total: u64 = h.buckets.iter().sum();
        let mut with_le: Vec<(&str, &str)> = labels.to_vec();
        with_le.push(("le", "+Inf"));
        self.sample("_bucket", &with_le, total as f64);
        self.sample("_sum", labels, h.sum_ns as f64 * 1e-9);
        self.sample("_count", labels, total as f64);
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// The `le` of sonde's bucket `b` in seconds: every latency in it is an
/// integer number of ns at most high(b) - 1, so the boundary is exact.
fn le_seconds(b: usize) -> String {
    let ns = hist::high(b) - 1;
    // Nine decimals are exact for ns; trailing zeros trimmed.
    let s = format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

/// A metric or label name as the format allows.
fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// Which of sonde's 252 buckets a histogram exposes: the last bucket of every
/// power of two between `min` and `max` (or of every quarter), about 25
/// series instead of 252, each boundary still exact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// Bucket indexes whose upper edge is exposed, ascending.
    pub ends: Vec<usize>,
}

impl Range {
    /// Boundaries from `min_ns` to `max_ns` (inclusive of the power of two
    /// holding each); `quarters` exposes all four buckets of each octave.
    pub fn new(min_ns: u64, max_ns: u64, quarters: bool) -> Self {
        let first = hist::bucket(min_ns.max(1));
        // To the end of the power of two holding max.
        let last = (hist::bucket(max_ns.max(min_ns.max(1))) | 3).min(hist::LAST - 1);
        let ends = (first..=last).filter(|b| quarters || b % 4 == 3 || *b < 4).collect();
        Self { ends }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_escape_and_histograms_are_cumulative_and_exact() {
        let mut e = Expo::default();
        e.family("sonde_x_total", Type::Counter, "a \\ help\nline");
        e.sample("", &[("kind", "a\"b\\c\nd")], 3.0);
        e.family("sonde_lat_seconds", Type::Histogram, "lat");
        let mut h = Hist::default();
        // 10 calls of exactly 1023 ns, 5 of 1024 ns, 1 of 1 s.
        h.buckets[hist::bucket(1023)] += 10;
        h.buckets[hist::bucket(1024)] += 5;
        h.buckets[hist::bucket(1_000_000_000)] += 1;
        h.count = 16;
        h.sum_ns = 10 * 1023 + 5 * 1024 + 1_000_000_000;
        let r = Range::new(512, 2048, false);
        e.histogram(&[("target", "t")], &h, &r);
        let text = e.finish();
        assert!(text.contains("# HELP sonde_x_total a \\\\ help\\nline\n# TYPE sonde_x_total counter\n"), "{text}");
        assert!(text.contains("sonde_x_total{kind=\"a\\\"b\\\\c\\nd\"} 3\n"), "{text}");
        // 1023 ns is the last ns of the octave ending at 1024: le=1.023e-6 holds the 10.
        assert!(text.contains("sonde_lat_seconds_bucket{target=\"t\",le=\"0.000001023\"} 10\n"), "{text}");
        assert!(text.contains("sonde_lat_seconds_bucket{target=\"t\",le=\"0.000002047\"} 15\n"), "{text}");
        assert!(text.contains("sonde_lat_seconds_bucket{target=\"t\",le=\"+Inf\"} 16\n"), "{text}");
        assert!(text.contains("sonde_lat_seconds_count{target=\"t\"} 16\n"), "{text}");
        assert_eq!(r.ends.len(), 3, "{r:?}");
    }

    #[test]
    fn a_default_range_is_about_25_series() {
        let r = Range::new(1_000, 10_000_000_000, false);
        assert!((23..=27).contains(&r.ends.len()), "{}", r.ends.len());
        let q = Range::new(1_000, 10_000_000_000, true);
        assert_eq!(q.ends.len(), (hist::bucket(10_000_000_000) | 3) - hist::bucket(1_000) + 1);
        assert_eq!(r.ends.len(), 25, "2^10 ns to 2^34 ns: 25 octaves");
        for w in r.ends.windows(2) {
            assert!(hist::high(w[0]) < hist::high(w[1]));
        }
    }
}
