//! An outage of something kvpick depends on (the tokenizer service, an
//! engine's KV-event drain): it starts on the first failure and ends after
//! [`ANSWERS_TO_RECOVER`] answers in a row, so a service that fails every
//! other call is one outage, not many. Callers log its start and end, once
//! each, instead of a line per failure; the failures are counted in their
//! own metrics.
//!
//! Atomics, so a shared one can be told from any task; the common case (no
//! outage, an answer) is one load and writes nothing shared.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Answers in a row that end an outage.
pub const ANSWERS_TO_RECOVER: u64 = 8;

#[derive(Debug, Default)]
pub struct Outage {
    failing: AtomicBool,
    /// Failures in the outage under way.
    failures: AtomicU64,
    /// Answers since the last failure, while failing.
    answers: AtomicU64,
}

impl Outage {
    /// A call failed: `true` when this failure starts an outage.
    pub fn failed(&self) -> bool {
        self.failures.fetch_add(1, Relaxed);
        self.answers.store(0, Relaxed);
        !self.failing.swap(true, Relaxed)
    }

    /// A call answered: the outage's failure count when this answer ends
    /// one.
    pub fn answered(&self) -> Option<u64> {
        if !self.failing.load(Relaxed) {
            return None;
        }
        let ends = self.answers.fetch_add(1, Relaxed) + 1 >= ANSWERS_TO_RECOVER && self.failing.swap(false, Relaxed);
        ends.then(|| self.failures.swap(0, Relaxed))
    }

    pub fn is_failing(&self) -> bool {
        self.failing.load(Relaxed)
    }

    /// Failures in the outage under way (0 when there is none).
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_starts_once_and_ends_after_answers_in_a_row() {
        let outage = Outage::default();
        assert_eq!(outage.answered(), None, "an answer without an outage changes nothing");
        assert!(outage.failed(), "the first failure starts it");
        assert!(!outage.failed() && !outage.failed(), "later ones do not");
        assert_eq!(outage.failures(), 3);
        // Failing every other call is still the same outage.
        for _ in 0..2 * ANSWERS_TO_RECOVER {
            assert_eq!(outage.answered(), None);
            assert!(!outage.failed());
        }
        for _ in 0..ANSWERS_TO_RECOVER - 1 {
            assert_eq!(outage.answered(), None);
        }
        assert_eq!(outage.answered(), Some(3 + 2 * ANSWERS_TO_RECOVER), "ended, with its failures");
        assert!(!outage.is_failing());
        assert_eq!(outage.failures(), 0, "the next outage counts from 0");
        assert!(outage.failed(), "and starts on its first failure");
    }
}
