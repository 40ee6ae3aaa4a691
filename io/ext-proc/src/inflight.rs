//! The in-flight limit: how many requests may be between their headers and
//! their answer (pick or error) at once. Past it a request is refused at
//! once with 429 instead of buffering its body, tokenizing and queueing.
//!
//! Only the request path counts: a request whose pick was sent holds
//! nothing but a small record until its response ends, while one being
//! picked holds its buffered body (up to the body limit) and a tokenizer
//! call. This bounds that memory and the tokenizer's concurrency.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::metrics::ExtProcMetrics;

#[derive(Debug)]
pub struct InflightLimiter {
    current: AtomicUsize,
    max: usize,
    metrics: Arc<ExtProcMetrics>,
}

impl InflightLimiter {
    pub fn new(max: usize, metrics: Arc<ExtProcMetrics>) -> Arc<Self> {
        Arc::new(InflightLimiter { current: AtomicUsize::new(0), max, metrics })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A permit, or `None` when `max` requests are already in flight.
    pub fn try_acquire(self: &Arc<Self>) -> Option<InflightPermit> {
        self.current.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1)).ok().map(
            |_| {
                self.metrics.inflight_add(1);
                InflightPermit(self.clone())
            },
        )
    }
}

/// Held while one request is in flight; released on drop.
#[derive(Debug)]
pub struct InflightPermit(Arc<InflightLimiter>);

impl Drop for InflightPermit {
    fn drop(&mut self) {
        self.0.current.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.inflight_add(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_limit_and_frees_on_drop() {
        let limiter = InflightLimiter::new(2, Arc::default());
        let a = limiter.try_acquire();
        let b = limiter.try_acquire();
        assert!(a.is_some() && b.is_some());
        assert!(limiter.try_acquire().is_none());
        drop(a);
        assert!(limiter.try_acquire().is_some());
    }
}
