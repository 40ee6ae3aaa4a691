//! Where the shard threads read time: the system's monotonic clock, or a
//! manual one that tests move by hand (then shards run no timers).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvpick_core::clock::Millis;

#[derive(Clone, Debug)]
pub enum Clock {
    System { origin: Instant },
    Manual(Arc<AtomicU64>),
}

impl Clock {
    pub fn system() -> Self {
        Clock::System { origin: Instant::now() }
    }

    pub fn manual(start: Millis) -> Self {
        Clock::Manual(Arc::new(AtomicU64::new(start.0)))
    }

    pub fn now(&self) -> Millis {
        match self {
            Clock::System { origin } => Millis(origin.elapsed().as_millis() as u64),
            Clock::Manual(ms) => Millis(ms.load(Ordering::Acquire)),
        }
    }

    /// Moves a manual clock; does nothing to the system clock.
    pub fn set(&self, now: Millis) {
        if let Clock::Manual(ms) = self {
            ms.store(now.0, Ordering::Release);
        }
    }

    /// When a shard should wake for `at`; none on a manual clock.
    pub(crate) fn instant_of(&self, at: Millis) -> Option<Instant> {
        match self {
            Clock::System { origin } => Some(*origin + Duration::from_millis(at.0)),
            Clock::Manual(_) => None,
        }
    }
}
