//! The block devices' own latency in the window: every read and write
//! request completed on each device (every process's), from its start in
//! the block layer to its completion, as the kernel's disk statistics
//! (`/sys/block/NAME/stat`) count them; a disk wait on a file of that
//! device is named with them.

use std::collections::HashMap;

use serde::Serialize;

/// One device's counts as the kernel half keeps them (cumulative): the
/// `disks` map's value (struct why_disk in why.h): requests completed
/// (`reqs`, reads and writes), their time from start to completion (`ns`),
/// those with an issue time and their time from issue (`dev_reqs`,
/// `dev_ns`), the longest (`max_ns`) and a log2 histogram of microseconds
/// (`hist`).
pub type Raw = super::skel::types::why_disk;

/// Every device's counts, by dev_t (major << 20 | minor).
pub type Counts = HashMap<u32, Raw>;

/// `now` less `before`, per device (the longest: not known for a part of
/// the run, 0).
pub fn since(now: &Counts, before: Option<&Counts>) -> Counts {
    let Some(before) = before else { return now.clone() };
    now.iter()
        .map(|(dev, n)| {
            let Some(b) = before.get(dev) else { return (*dev, *n) };
            let mut d = *n;
            for i in 0..2 {
                d.reqs[i] = n.reqs[i].saturating_sub(b.reqs[i]);
                d.ns[i] = n.ns[i].saturating_sub(b.ns[i]);
                d.dev_reqs[i] = n.dev_reqs[i].saturating_sub(b.dev_reqs[i]);
                d.dev_ns[i] = n.dev_ns[i].saturating_sub(b.dev_ns[i]);
            }
            for (h, was) in d.hist.iter_mut().zip(b.hist) {
                *h = h.saturating_sub(was);
            }
            d.max_ns = 0;
            (*dev, d)
        })
        .collect()
}

/// A traced thread's own requests on a device as the kernel half keeps them
/// (cumulative; struct why_own_disk): count, time, the longest.
pub type OwnRaw = super::skel::types::why_own_disk;

/// Every traced thread's own requests, by (thread, dev_t).
pub type OwnCounts = HashMap<(u32, u32), OwnRaw>;

/// `now` less `before` (the longest: not known for a part of the run, 0).
pub fn own_since(now: &OwnCounts, before: Option<&OwnCounts>) -> OwnCounts {
    now.iter()
        .map(|(k, n)| {
            let Some(b) = before.and_then(|b| b.get(k)) else { return (*k, *n) };
            let d = OwnRaw { reqs: n.reqs.saturating_sub(b.reqs), ns: n.ns.saturating_sub(b.ns), max_ns: 0 };
            (*k, d)
        })
        .collect()
}

/// The waiting thread's own requests among a device's: those holding a bio
/// it queued itself (a read it issued, not the page cache's readahead of
/// another thread or the flusher's writeback).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Own {
    /// Its requests completed in the window.
    pub requests: u64,
    /// Their mean time from start in the block layer to completion.
    pub avg_ns: u64,
    /// The longest (the whole run's report only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ns: Option<u64>,
}

impl Own {
    /// From the kernel half's counts (`whole_run`: the longest is known).
    pub fn of(r: &OwnRaw, whole_run: bool) -> Own {
        Own { requests: r.reqs, avg_ns: r.ns / r.reqs.max(1), max_ns: (whole_run && r.reqs > 0).then_some(r.max_ns) }
    }
}

/// A device's requests in the window, as a wait names them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Device {
    /// Its name in /sys/dev/block (`vda`, `nvme0n1p2`), else `MAJ:MIN`.
    pub name: String,
    /// `MAJ:MIN`.
    pub dev: String,
    /// The kernel's dev_t.
    #[serde(skip)]
    pub dev_t: u32,
    /// Of them, the waiting thread's own (None: not counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own: Option<Own>,
    /// Read requests completed in the window (every process's).
    pub reads: u64,
    /// Write requests completed.
    pub writes: u64,
    /// Their mean time from start in the block layer to completion.
    pub avg_ns: u64,
    /// Their mean time from issue to the device to completion, where the
    /// kernel stamps the issue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_avg_ns: Option<u64>,
    /// 99% of them took at most this (a power-of-two bound).
    pub p99_ns: u64,
    /// The longest (the whole run's report only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ns: Option<u64>,
}

/// `MAJ:MIN` of a kernel dev_t.
pub fn dev_text(dev: u64) -> String {
    format!("{}:{}", dev >> 20, dev & 0xfffff)
}

/// The device's name from sysfs (which the traced processes do not
/// control), else `MAJ:MIN`.
fn name_of(dev: u32) -> String {
    let mm = dev_text(u64::from(dev));
    std::fs::read_link(format!("/sys/dev/block/{mm}"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or(mm)
}

impl Device {
    /// Named from its counts (None: no request completed).
    pub fn of(dev: u32, r: &Raw, whole_run: bool) -> Option<Device> {
        let n = r.reqs[0] + r.reqs[1];
        if n == 0 {
            return None;
        }
        let dn = r.dev_reqs[0] + r.dev_reqs[1];
        // Of the histogram's own count: the map is read while the kernel
        // half adds to it, so it may hold a request more or less than `n`.
        let in_hist: u64 = r.hist.iter().sum();
        let bound = |i: usize| (1u64 << (i + 1).min(52)) * 1000;
        let mut seen = 0;
        let mut p99 = r.hist.iter().rposition(|c| *c > 0).map(bound).unwrap_or(0);
        for (i, c) in r.hist.iter().enumerate() {
            seen += c;
            if seen * 100 >= in_hist * 99 && *c > 0 {
                p99 = bound(i);
                break;
            }
        }
        Some(Device {
            name: name_of(dev),
            dev: dev_text(u64::from(dev)),
            dev_t: dev,
            own: None,
            reads: r.reqs[0],
            writes: r.reqs[1],
            avg_ns: (r.ns[0] + r.ns[1]) / n,
            // Only where the kernel's stamps tell the two apart (a plug's
            // cached clock gives both the same time).
            device_avg_ns: (dn > 0 && r.dev_ns[0] + r.dev_ns[1] < r.ns[0] + r.ns[1])
                .then(|| (r.dev_ns[0] + r.dev_ns[1]) / dn),
            // The histogram's bound, at most the longest where it is known.
            p99_ns: if whole_run && r.max_ns > 0 { p99.min(r.max_ns) } else { p99 },
            max_ns: whole_run.then_some(r.max_ns),
        })
    }

    /// `vda: 59,812 requests in the window, 0.08 ms each (0.07 ms at the
    /// device), 99% within 0.26 ms, the longest 3.10 ms`.
    pub fn text(&self) -> String {
        let ms = |ns: u64| format!("{:.2} ms", ns as f64 / 1e6);
        let mut s =
            format!("{}: {} requests in the window, {} each", self.name, self.reads + self.writes, ms(self.avg_ns));
        if let Some(d) = self.device_avg_ns {
            s += &format!(" ({} at the device)", ms(d));
        }
        s += &format!(", 99% within {}", ms(self.p99_ns));
        if let Some(m) = self.max_ns {
            s += &format!(", the longest {}", ms(m));
        }
        match &self.own {
            Some(o) if o.requests == 0 => s += "; none of them its own",
            Some(o) => {
                s += &format!("; its own {} requests, {} each", o.requests, ms(o.avg_ns));
                if let Some(m) = o.max_ns {
                    s += &format!(", the longest {}", ms(m));
                }
            }
            None => {}
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_summed_and_its_interval_taken() {
        let mut a = Raw { reqs: [90, 10], ns: [90_000_000, 10_000_000], max_ns: 5_000_000, ..Default::default() };
        a.hist[9] = 99; // 512..1024 us
        a.hist[12] = 1;
        let d = Device::of(1, &a, true).unwrap();
        assert_eq!((d.reads, d.writes, d.avg_ns, d.device_avg_ns, d.p99_ns), (90, 10, 1_000_000, None, 1_024_000));
        assert_eq!(d.max_ns, Some(5_000_000));
        let mut b = a;
        b.reqs[0] += 10;
        b.ns[0] += 20_000_000;
        b.hist[11] += 10;
        let m: Counts = [(1u32, b)].into_iter().collect();
        let was: Counts = [(1u32, a)].into_iter().collect();
        let i = since(&m, Some(&was));
        let d = Device::of(1, &i[&1], false).unwrap();
        assert_eq!((d.reads, d.writes, d.avg_ns, d.p99_ns, d.max_ns), (10, 0, 2_000_000, 4_096_000, None));
        let mut d = Device::of(1, &a, true).unwrap();
        // A bound past the longest request: the longest.
        let mut c = a;
        c.max_ns = 900_000;
        assert_eq!(Device::of(1, &c, true).unwrap().p99_ns, 900_000);
        d.own = Some(Own::of(&OwnRaw { reqs: 4, ns: 4_000_000, max_ns: 2_000_000 }, true));
        assert!(d.text().ends_with("; its own 4 requests, 1.00 ms each, the longest 2.00 ms"), "{}", d.text());
        d.own = Some(Own::of(&OwnRaw::default(), true));
        assert!(d.text().ends_with("; none of them its own"), "{}", d.text());
        let o = own_since(
            &[((7u32, 1u32), OwnRaw { reqs: 10, ns: 50, max_ns: 9 })].into_iter().collect(),
            Some(&[((7u32, 1u32), OwnRaw { reqs: 4, ns: 20, max_ns: 9 })].into_iter().collect()),
        );
        assert_eq!((o[&(7, 1)].reqs, o[&(7, 1)].ns, o[&(7, 1)].max_ns), (6, 30, 0));
        assert_eq!(dev_text(0xfe00), "0:65024");
        assert_eq!(dev_text((254 << 20) | 1), "254:1");
    }
}
