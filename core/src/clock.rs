//! Time as the core sees it: injected by the caller, never read from the OS,
//! so tests and the single-threaded reference control it exactly.

use std::time::Duration;

/// Milliseconds on a monotonic clock with an arbitrary origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Millis {
    pub fn after(self, duration: Duration) -> Millis {
        Millis(self.0.saturating_add(duration.as_millis() as u64))
    }
}
