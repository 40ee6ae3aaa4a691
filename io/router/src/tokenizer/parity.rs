//! The local tokenizer, checked against the engine's own.
//!
//! A wrong tokenizer or template does not fail loudly: every prompt's
//! blocks hash differently from the engine's, nothing ever matches, and
//! KV-aware routing silently becomes load balancing. So for a sampled
//! fraction of requests (`--tokenizer-parity-ratio`) the engine's tokenizer
//! (render or `/tokenize`, the configured protocol) is asked too, in the
//! background, after the pick: the request never waits for it. A mismatch
//! is counted, the first one is logged with the first differing position
//! and the tokens around it, and with `--tokenizer-parity-fallback` (on by
//! default) every later request is tokenized by the engine instead, until
//! restart. Bodies the local path cannot handle (multimodal parts, a
//! request's own template) are handed to the engine per request.
//!
//! At most [`MAX_CHECKS_IN_FLIGHT`] checks run at once; a sample drawn
//! while they do is skipped and counted, so a slow engine cannot pile up
//! background work.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};

use super::local::LocalTokenizer;
use super::metrics::{ParityOutcome, TokenizerMetrics};
use super::{TokenizeError, TokenizeFuture, TokenizeRequest, Tokenizer};

/// Parity checks running at once, at most.
pub const MAX_CHECKS_IN_FLIGHT: usize = 4;

/// The parity sampler's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParityConfig {
    /// Fraction of tokenized requests checked against the engine, 0 to 1.
    pub ratio: f64,
    /// After a mismatch, tokenize every request with the engine.
    pub fallback_on_mismatch: bool,
}

impl Default for ParityConfig {
    fn default() -> Self {
        ParityConfig { ratio: 0.01, fallback_on_mismatch: true }
    }
}

/// [`LocalTokenizer`] with the engine's tokenizer beside it.
pub struct ParityChecked {
    /// The engine's tokenizer for hand-offs and, after a mismatch with the
    /// fallback on, every request (records into the request path's
    /// metrics).
    engine: Arc<dyn Tokenizer>,
    shared: Arc<Shared>,
}

struct Shared {
    config: ParityConfig,
    /// The engine's tokenizer for the background checks, with metrics of
    /// its own so checks do not count as request-path round trips.
    checker: Arc<dyn Tokenizer>,
    metrics: Arc<TokenizerMetrics>,
    in_flight: AtomicUsize,
    /// A mismatch was seen (and, with the fallback, the engine tokenizes).
    diverged: AtomicBool,
    /// The tokenizer checked (its decoder also writes the mismatch log).
    local: LocalTokenizer,
}

impl ParityChecked {
    /// `engine` serves requests (hand-offs, fallback); `checker` is the
    /// same engine tokenizer for background checks.
    pub fn new(
        local: LocalTokenizer,
        engine: Arc<dyn Tokenizer>,
        checker: Arc<dyn Tokenizer>,
        config: ParityConfig,
        metrics: Arc<TokenizerMetrics>,
    ) -> ParityChecked {
        let shared = Arc::new(Shared {
            config,
            checker,
            metrics,
            in_flight: AtomicUsize::new(0),
            diverged: AtomicBool::new(false),
            local,
        });
        ParityChecked { engine, shared }
    }

    /// Whether a mismatch has been seen.
    pub fn diverged(&self) -> bool {
        self.shared.diverged.load(Acquire)
    }

    async fn call(&self, request: TokenizeRequest) -> Result<Vec<u32>, TokenizeError> {
        if self.shared.config.fallback_on_mismatch && self.diverged() {
            return self.engine.tokenize(request).await;
        }
        match self.shared.local.tokenize(request.clone()).await {
            Err(TokenizeError::Unsupported(what)) => {
                self.shared.metrics.record_local_handoff();
                tracing::debug!(what, "local tokenizer cannot handle this body: asking the engine");
                self.engine.tokenize(request).await
            }
            Ok(tokens) => {
                self.maybe_check(request, &tokens);
                Ok(tokens)
            }
            Err(error) => Err(error),
        }
    }

    fn maybe_check(&self, request: TokenizeRequest, tokens: &[u32]) {
        let ratio = self.shared.config.ratio;
        if ratio <= 0.0 || (ratio < 1.0 && fastrand::f64() >= ratio) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        let shared = &self.shared;
        if shared.in_flight.fetch_add(1, AcqRel) >= MAX_CHECKS_IN_FLIGHT {
            shared.in_flight.fetch_sub(1, AcqRel);
            shared.metrics.record_parity(ParityOutcome::Skipped);
            return;
        }
        let shared = shared.clone();
        let local = tokens.to_vec();
        handle.spawn(async move {
            let outcome = shared.check(request, &local).await;
            shared.metrics.record_parity(outcome);
            shared.in_flight.fetch_sub(1, AcqRel);
        });
    }
}

impl Shared {
    async fn check(&self, request: TokenizeRequest, local: &[u32]) -> ParityOutcome {
        let model = request.model.clone();
        let engine = match self.checker.tokenize(request).await {
            Ok(engine) => engine,
            Err(TokenizeError::Unsupported(_)) => return ParityOutcome::Unsupported,
            Err(error) => {
                tracing::debug!(%error, "tokenizer parity check: the engine could not tokenize");
                return ParityOutcome::EngineError;
            }
        };
        let Some(at) = first_difference(local, &engine) else { return ParityOutcome::Match };
        // Logged once: the first mismatch says what is wrong; the counter
        // says how often.
        if !self.diverged.swap(true, Release) {
            if self.config.fallback_on_mismatch {
                self.metrics.set_engine_fallback();
            }
            let window = |ids: &[u32]| ids[at.saturating_sub(4)..(at + 4).min(ids.len())].to_vec();
            tracing::warn!(
                model,
                position = at,
                local_tokens = local.len(),
                engine_tokens = engine.len(),
                local_ids = ?window(local),
                engine_ids = ?window(&engine),
                local_text = %self.local.decode(&window(local)),
                fallback = self.config.fallback_on_mismatch,
                "local tokenizer disagrees with the engine's: check that the model directory and chat template are the engine's own (tokenizer.json, tokenizer_config.json, --chat-template); {}",
                if self.config.fallback_on_mismatch {
                    "every request is now tokenized by the engine"
                } else {
                    "local tokens are still used (--tokenizer-parity-fallback is off)"
                }
            );
        }
        ParityOutcome::Mismatch
    }
}

/// The first index where the two differ, counting a length difference.
fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(at) => Some(at),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

impl Tokenizer for ParityChecked {
    fn tokenize(&self, request: TokenizeRequest) -> TokenizeFuture<'_> {
        Box::pin(self.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_difference(&[1, 2, 3], &[1, 9, 3]), Some(1));
        assert_eq!(first_difference(&[1, 2], &[1, 2, 3]), Some(2));
        assert_eq!(first_difference(&[], &[]), None);
    }
}
