//! One log line when the tokenizer starts failing and one when it answers
//! again, not one per request: a tokenizer that is down fails every
//! request, and a warning each would bury the log (the count of each is in
//! `kvpick_tokenizer_errors_total` and `kvpick_load_only_picks_total`).
//! The outage itself is [`kvpick_core::outage`] (it ends after
//! [`outage::ANSWERS_TO_RECOVER`] answers in a row); this decides which
//! failures are the tokenizer's.

use kvpick_core::outage;

use super::TokenizeError;

/// Whether the tokenizer is failing, and for how many requests so far.
#[derive(Debug, Default)]
pub struct Outage(outage::Outage);

impl Outage {
    /// A tokenize call failed. An unsupported body or one the engine
    /// refused (4xx) is not the tokenizer failing and starts no outage.
    pub fn failed(&self, error: &TokenizeError, load_only: bool) {
        if matches!(error, TokenizeError::Unsupported(_) | TokenizeError::Rejected { .. }) {
            return;
        }
        if self.0.failed() {
            let then = if load_only { "routing by load alone" } else { "requests refused" };
            tracing::warn!(%error, "tokenizer failing: {then} until it answers again (further failures counted, not logged)");
        }
    }

    /// A tokenize call answered.
    pub fn answered(&self) {
        if let Some(failures) = self.0.answered() {
            tracing::info!(failures, "tokenizer answering again");
        }
    }

    pub fn is_failing(&self) -> bool {
        self.0.is_failing()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpick_core::outage::ANSWERS_TO_RECOVER;

    #[test]
    fn an_outage_starts_on_the_first_failure_and_ends_after_answers_in_a_row() {
        let outage = Outage::default();
        assert!(!outage.is_failing());
        outage.answered();
        assert!(!outage.is_failing(), "an answer without an outage changes nothing");
        outage.failed(&TokenizeError::Unsupported("multimodal"), true);
        outage.failed(&TokenizeError::Rejected { status: 400, message: "too long".into() }, true);
        assert!(!outage.is_failing(), "an unsupported or refused body is not the tokenizer failing");
        for _ in 0..3 {
            outage.failed(&TokenizeError::Timeout, true);
        }
        assert!(outage.is_failing());
        assert_eq!(outage.0.failures(), 3);
        // Failing every other request is still the same outage.
        for _ in 0..2 * ANSWERS_TO_RECOVER {
            outage.answered();
            outage.failed(&TokenizeError::Upstream("500".into()), true);
        }
        assert!(outage.is_failing());
        for _ in 0..ANSWERS_TO_RECOVER - 1 {
            outage.answered();
        }
        assert!(outage.is_failing());
        outage.answered();
        assert!(!outage.is_failing());
        assert_eq!(outage.0.failures(), 0, "the next outage counts from 0");
        outage.failed(&TokenizeError::Timeout, true);
        assert!(outage.is_failing(), "and starts on its first failure");
    }
}
