//! A Rust release workload (no frame pointers by default) with a known
//! call chain: main -> top -> (closure) -> middle -> leaf, pure computation.
//!   rustwork [SECONDS=10]
use std::hint::black_box;
use std::time::{Duration, Instant};

#[inline(never)]
fn leaf(n: u64) -> u64 {
    let mut s = 0u64;
    for i in 0..n {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(black_box(i));
    }
    s
}

#[inline(never)]
fn middle(n: u64) -> u64 {
    leaf(n).wrapping_add(black_box(1))
}

#[inline(never)]
fn top(n: u64) -> u64 {
    (0..4).map(|k| middle(n + k)).fold(0, u64::wrapping_add)
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10.0);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        black_box(top(black_box(200_000)));
    }
}
