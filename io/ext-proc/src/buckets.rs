//! A histogram with fixed bucket bounds, recorded with relaxed atomics:
//! what a Prometheus histogram is, and cheap enough for the request path
//! (one binary search and two adds).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Seconds, from 50 µs (a selection on an idle shard) to 60 s (a long
/// streamed generation): the same for every latency family.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
];

/// Token counts: the GAIE reference EPP's powers-of-two-ish ladder.
pub const TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0,
    131072.0, 262144.0, 524288.0, 1048576.0,
];

#[derive(Debug)]
pub struct Buckets {
    bounds: &'static [f64],
    /// One per bound plus the `+Inf` bucket; not cumulative.
    counts: Box<[AtomicU64]>,
    /// The sum in millionths, so it stays an integer atomic.
    sum_micros: AtomicU64,
}

impl Buckets {
    pub fn new(bounds: &'static [f64]) -> Self {
        Buckets {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        let value = if value.is_finite() { value.max(0.0) } else { 0.0 };
        let i = self.bounds.partition_point(|bound| *bound < value);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add((value * 1e6) as u64, Relaxed);
    }

    pub fn observe_duration(&self, elapsed: std::time::Duration) {
        self.observe(elapsed.as_secs_f64());
    }

    pub fn snapshot(&self) -> BucketSnapshot {
        let mut cumulative = 0;
        let counts = self
            .counts
            .iter()
            .map(|c| {
                cumulative += c.load(Relaxed);
                cumulative
            })
            .collect();
        BucketSnapshot { bounds: self.bounds, cumulative: counts, sum: self.sum_micros.load(Relaxed) as f64 / 1e6 }
    }
}

/// Cumulative counts, as the exposition format wants them.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketSnapshot {
    pub bounds: &'static [f64],
    /// `cumulative[i]`: observations ≤ `bounds[i]`; the last is the count.
    pub cumulative: Vec<u64>,
    pub sum: f64,
}

impl BucketSnapshot {
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_cumulatively() {
        let b = Buckets::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0, f64::NAN] {
            b.observe(v);
        }
        let s = b.snapshot();
        // NaN counts as 0; a value equal to a bound is in that bucket.
        assert_eq!(s.cumulative, vec![3, 4, 5]);
        assert_eq!(s.count(), 5);
        assert!((s.sum - 6.0).abs() < 1e-9);
    }
}
