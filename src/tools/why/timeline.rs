//! Each thread's time by category over the window, for the HTML report's
//! timeline: the kernel half's running totals read every tick, kept as
//! cumulative samples (so a coarser timeline is every other sample), in
//! bounded memory: at most [`MAX_SAMPLES`] samples (past that, every other
//! one goes and the tick doubles) of at most [`MAX_THREADS`] threads.
use std::collections::HashMap;

use super::report::CLASSES;

/// Categories per sample: on CPU, run queue, throttled, then the classes.
pub const SLOTS: usize = 3 + CLASSES;
/// Samples kept (the timeline's resolution: about this many columns).
pub const MAX_SAMPLES: usize = 600;
/// Threads followed (those first seen); the others are counted.
pub const MAX_THREADS: usize = 1000;

/// Cumulative time per category, in microseconds, wrapping (differences of
/// neighbouring samples are what is used).
type Cum = [u32; SLOTS];

/// The samples.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// How often to sample.
    pub tick: std::time::Duration,
    /// When each sample was taken.
    times: Vec<u64>,
    /// Per thread: its sample at each of `times` (None before it was seen).
    rows: HashMap<u32, Vec<Option<Cum>>>,
    /// Threads not followed: MAX_THREADS were already.
    pub threads_dropped: u64,
}

/// One thread's timeline: for each column (from, to, ns per category).
pub type Columns = Vec<(u64, u64, [u64; SLOTS])>;

impl Timeline {
    /// An empty timeline from `start`, sampled every `tick`.
    pub fn new(start: u64, tick: std::time::Duration) -> Timeline {
        Timeline { tick, times: vec![start], rows: HashMap::new(), threads_dropped: 0 }
    }

    /// Adds a sample taken at `now`: each thread's running totals (ns).
    pub fn add(&mut self, now: u64, threads: impl Iterator<Item = (u32, [u64; SLOTS])>) {
        if now <= *self.times.last().unwrap_or(&0) {
            return;
        }
        let n = self.times.len();
        self.times.push(now);
        for (tid, acc) in threads {
            if !self.rows.contains_key(&tid) && self.rows.len() >= MAX_THREADS {
                self.threads_dropped += 1;
                continue;
            }
            let row = self.rows.entry(tid).or_insert_with(|| vec![None; n]);
            row.resize(n, None);
            let mut c = [0u32; SLOTS];
            for (d, s) in c.iter_mut().zip(acc) {
                *d = (s / 1000) as u32; // wraps: only differences are used
            }
            row.push(Some(c));
        }
        for row in self.rows.values_mut() {
            if row.len() < n + 1 {
                let last = row.last().copied().flatten();
                row.push(last);
            }
        }
        if self.times.len() > MAX_SAMPLES {
            self.halve();
        }
    }

    /// Every other sample (the first and the last kept), and the tick doubled.
    fn halve(&mut self) {
        let n = self.times.len();
        let keep: Vec<usize> = (0..n).filter(|i| i % 2 == 0 || *i == n - 1).collect();
        self.times = keep.iter().map(|&i| self.times[i]).collect();
        for row in self.rows.values_mut() {
            *row = keep.iter().map(|&i| row[i]).collect();
        }
        self.tick *= 2;
    }

    /// Thread `tid`'s columns (empty if it was not followed).
    ///
    /// A sample counts a state still open up to its time. Where the kernel
    /// half later places a change it did not see when it happened (a
    /// switch-in from a thread it cannot trace: `unseen_switches`), a slot
    /// goes back: the time a sample counted as runnable was on CPU. That
    /// time is the open state's latest part, so it is moved back into the
    /// columns before, latest first, from the slot that went back to the
    /// ones it became, as much as each gained in the column (runnable to on
    /// CPU; blocked to runnable, then on CPU where the switch-in was unseen
    /// too). Each slot's sum over the columns stays its total; no column is
    /// left holding more than its length for what earlier columns showed
    /// wrongly (one did, when blocked time had become time on CPU: its
    /// thread was painted past its exit).
    pub fn columns(&self, tid: u32) -> Columns {
        let Some(row) = self.rows.get(&tid) else { return Vec::new() };
        let mut cols: Vec<(u64, u64, [i64; SLOTS])> = Vec::new();
        for i in 1..self.times.len().min(row.len()) {
            let Some(b) = row[i] else { continue };
            let a = row[i - 1].unwrap_or([0; SLOTS]);
            let mut d = [0i64; SLOTS];
            for k in 0..SLOTS {
                // Microseconds, wrapping: a difference is small either way.
                d[k] = i64::from(b[k].wrapping_sub(a[k]) as i32) * 1000;
            }
            cols.push((self.times[i - 1], self.times[i], d));
        }
        for i in 0..cols.len() {
            for k in 0..SLOTS {
                if cols[i].2[k] >= 0 {
                    continue;
                }
                let back = -cols[i].2[k];
                cols[i].2[k] = 0;
                // Where that time went: the slots that gained as much in
                // this column, in the order the states followed (a wake-up
                // no hook saw turns blocked time into the run queue, then,
                // with a switch-in also unseen, into time on CPU; a switch-in
                // alone, runnable time into time on CPU); others after,
                // largest first. The time moved back is the earliest of it.
                let order: &[usize] = match k {
                    k if k >= 3 => &[1, 2, 0],
                    1 | 2 => &[0],
                    _ => &[],
                };
                let mut gains: Vec<usize> = order.to_vec();
                let mut rest: Vec<usize> = (0..SLOTS).filter(|g| *g != k && !order.contains(g)).collect();
                rest.sort_by_key(|&g| std::cmp::Reverse(cols[i].2[g]));
                gains.extend(rest);
                let mut takes = Vec::new();
                let mut left = back;
                for g in gains {
                    let take = left.min(cols[i].2[g].max(0));
                    if take > 0 {
                        takes.push((g, take));
                        left -= take;
                    }
                }
                // Into the columns before, latest first: the state that came
                // last fills the latest of them.
                for &(g, take) in takes.iter().rev() {
                    let mut left = take;
                    for j in (0..i).rev() {
                        if left == 0 {
                            break;
                        }
                        let t = left.min(cols[j].2[k].max(0));
                        cols[j].2[k] -= t;
                        cols[j].2[g] += t;
                        left -= t;
                    }
                    cols[i].2[g] -= take - left;
                }
                // What no earlier column held (wraps, or a thread seen late)
                // stays where it is: the slot that went back shows nothing
                // here, and the slots that gained keep it.
            }
        }
        cols.into_iter().map(|(a, b, d)| (a, b, d.map(|v| v.max(0) as u64))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_the_differences_and_halving_keeps_totals() {
        let mut t = Timeline::new(0, std::time::Duration::from_millis(1));
        for i in 1..=(MAX_SAMPLES as u64 + 1) {
            let mut a = [0u64; SLOTS];
            a[0] = i * 1_000_000; // on CPU throughout
            t.add(i * 1_000_000, [(7u32, a)].into_iter());
        }
        assert!(t.times.len() <= MAX_SAMPLES);
        let cols = t.columns(7);
        let total: u64 = cols.iter().map(|c| c.2[0]).sum();
        assert_eq!(total, (MAX_SAMPLES as u64 + 1) * 1_000_000);
        assert!(cols.iter().all(|(a, b, d)| d[0] == b - a));
        assert_eq!(t.tick, std::time::Duration::from_millis(2));
    }

    #[test]
    fn a_switch_placed_later_moves_back_into_the_columns_it_belongs_to() {
        // Runnable (slot 1) from 0 as the samples at 10, 20 and 30 ms saw
        // it; then placed: on CPU (slot 0) from 5 ms. The sample at 40 ms
        // has 5 ms runnable and 35 ms on CPU in all.
        let mut t = Timeline::new(0, std::time::Duration::from_millis(10));
        let ms = 1_000_000u64;
        for (at, on, rq) in [(10, 0, 10), (20, 0, 20), (30, 0, 30), (40, 35, 5)] {
            let mut a = [0u64; SLOTS];
            (a[0], a[1]) = (on * ms, rq * ms);
            t.add(at * ms, [(3u32, a)].into_iter());
        }
        let cols = t.columns(3);
        let got: Vec<(u64, u64)> = cols.iter().map(|c| (c.2[0] / ms, c.2[1] / ms)).collect();
        assert_eq!(got, vec![(5, 5), (10, 0), (10, 0), (10, 0)]);
    }

    #[test]
    fn a_wake_up_and_switch_in_placed_later_leave_no_column_over_its_length() {
        // Asleep (slot 3) from 0 as the samples at 10, 20 and 30 ms saw it;
        // then placed: woken at 12 ms, on CPU from 14 ms (neither seen).
        // The sample at 40 ms: 12 ms asleep, 2 ms runnable, 26 ms on CPU.
        let mut t = Timeline::new(0, std::time::Duration::from_millis(10));
        let ms = 1_000_000u64;
        for (at, on, rq, sl) in [(10, 0, 0, 10), (20, 0, 0, 20), (30, 0, 0, 30), (40, 26, 2, 12)] {
            let mut a = [0u64; SLOTS];
            (a[0], a[1], a[3]) = (on * ms, rq * ms, sl * ms);
            t.add(at * ms, [(3u32, a)].into_iter());
        }
        let cols = t.columns(3);
        let got: Vec<(u64, u64, u64)> = cols.iter().map(|c| (c.2[0] / ms, c.2[1] / ms, c.2[3] / ms)).collect();
        // Each column holds its 10 ms, and each slot its total.
        assert_eq!(got, vec![(0, 0, 10), (6, 2, 2), (10, 0, 0), (10, 0, 0)]);
    }

    #[test]
    fn a_thread_seen_late_starts_from_nothing() {
        let mut t = Timeline::new(0, std::time::Duration::from_millis(1));
        t.add(10, std::iter::empty());
        let mut a = [0u64; SLOTS];
        a[4] = 5000;
        t.add(20, [(9u32, a)].into_iter());
        let cols = t.columns(9);
        assert_eq!(cols, vec![(10, 20, { a })]);
    }
}
