//! The watches' back-off: exponential with jitter, reset by the stream's
//! next success (kube-runtime's `StreamBackoff` calls `reset`).
//!
//! Own type rather than kube's `DefaultBackoff` so the delays are
//! configurable (tests use milliseconds) without depending on `backon`.

use std::time::Duration;

use kube::runtime::utils::Backoff;

pub(crate) struct WatchBackoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl WatchBackoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        WatchBackoff { min, max, next: min }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    /// Never ends: a watch is retried for as long as discovery runs.
    fn next(&mut self) -> Option<Duration> {
        let base = self.next;
        self.next = base.saturating_mul(2).min(self.max);
        // Jitter in [base/2, base]: replicas restarted together do not hit
        // the API server in lockstep.
        let half = base / 2;
        Some(half + half.mul_f64(fastrand::f64()))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter_and_resets() {
        let mut b = WatchBackoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let bounds = [(50, 100), (100, 200), (175, 350), (175, 350)];
        for (lo, hi) in bounds {
            let d = b.next().unwrap_or_default();
            assert!(d >= Duration::from_millis(lo) && d <= Duration::from_millis(hi), "{d:?} not in {lo}..={hi} ms");
        }
        b.reset();
        let d = b.next().unwrap_or_default();
        assert!(d <= Duration::from_millis(100));
    }
}
