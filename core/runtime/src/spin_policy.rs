//! Whether an idle shard polls its rings before it parks.
//!
//! A spin pays only when work comes back within it: then it saves a park
//! and a wake-up (tens of µs on each side on a VM, a futex call for the
//! producer). When work comes back later it burns the whole budget for
//! nothing, and on a small machine takes that core from the I/O thread.
//! So the shard spins while its recent idle gaps were shorter than the
//! budget: a closed loop of selections keeps it spinning, a server with
//! hundreds of µs between picks lets it park at once.

use std::time::{Duration, Instant};

pub(crate) struct SpinPolicy {
    budget: Duration,
    /// Moving average of recent idle gaps (new ones weigh a quarter).
    recent_gap: Duration,
}

impl SpinPolicy {
    pub(crate) fn new(budget: Duration) -> Self {
        SpinPolicy { budget, recent_gap: Duration::ZERO }
    }

    /// How long to spin now.
    pub(crate) fn budget(&self) -> Duration {
        if self.recent_gap < self.budget { self.budget } else { Duration::ZERO }
    }

    /// The shard went idle at `since`; work arrived at `at` (a ring's
    /// time, not the wake-up's, so a parked shard can learn that gaps got
    /// short again).
    pub(crate) fn work_arrived(&mut self, since: Instant, at: Instant) {
        let gap = at.saturating_duration_since(since);
        self.recent_gap = (self.recent_gap * 3 + gap) / 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_while_gaps_are_short_and_parks_once_they_are_long() {
        let budget = Duration::from_micros(50);
        let mut policy = SpinPolicy::new(budget);
        let t = Instant::now();
        assert_eq!(policy.budget(), budget, "a new shard spins");
        for _ in 0..8 {
            policy.work_arrived(t, t + Duration::from_micros(5));
        }
        assert_eq!(policy.budget(), budget);
        for _ in 0..4 {
            policy.work_arrived(t, t + Duration::from_micros(400));
        }
        assert_eq!(policy.budget(), Duration::ZERO, "long gaps stop the spin");
        for _ in 0..12 {
            policy.work_arrived(t, t + Duration::from_micros(2));
        }
        assert_eq!(policy.budget(), budget, "short gaps bring it back");
        assert_eq!(SpinPolicy::new(Duration::ZERO).budget(), Duration::ZERO, "a zero budget never spins");
    }
}
