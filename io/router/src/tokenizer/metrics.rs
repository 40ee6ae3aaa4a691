//! Tokenizer counters and latency, kept in atomics (and one briefly locked
//! histogram) so the request path only adds to them and a later Prometheus
//! exporter reads a [`TokenizerMetricsSnapshot`].
//!
//! What is counted where: the clients record every call
//! ([`TokenizerMetrics::record_call`]: latency, success or error class); the
//! picker records each fallback to load-only routing
//! ([`TokenizerMetrics::record_fallback`]) because only it applies the
//! [`FallbackPolicy`](super::FallbackPolicy).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

use kvpick_ext_proc::TokenizeError;

/// A [`TokenizeError`] without its details: the label of the error and
/// fallback counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    Unsupported,
    Unreachable,
    Timeout,
    Rejected,
    Upstream,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 5] = [
        ErrorClass::Unsupported,
        ErrorClass::Unreachable,
        ErrorClass::Timeout,
        ErrorClass::Rejected,
        ErrorClass::Upstream,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Unsupported => "unsupported",
            ErrorClass::Unreachable => "unreachable",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Rejected => "rejected",
            ErrorClass::Upstream => "upstream",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The class of `error` (a free function: `TokenizeError` is
    /// `kvpick-ext-proc`'s).
    pub fn of(error: &TokenizeError) -> ErrorClass {
        match error {
            TokenizeError::Unsupported(_) => ErrorClass::Unsupported,
            TokenizeError::Unreachable(_) => ErrorClass::Unreachable,
            TokenizeError::Timeout => ErrorClass::Timeout,
            TokenizeError::Rejected { .. } => ErrorClass::Rejected,
            TokenizeError::Upstream(_) => ErrorClass::Upstream,
        }
    }
}

/// How one parity check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParityOutcome {
    Match,
    Mismatch,
    /// The engine could not answer (down, refused, failed).
    EngineError,
    /// The engine's tokenizer cannot take this body (chat on SGLang's
    /// `/tokenize`): not checkable there.
    Unsupported,
    /// Not run: too many checks in flight.
    Skipped,
}

impl ParityOutcome {
    pub const ALL: [ParityOutcome; 5] = [
        ParityOutcome::Match,
        ParityOutcome::Mismatch,
        ParityOutcome::EngineError,
        ParityOutcome::Unsupported,
        ParityOutcome::Skipped,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ParityOutcome::Match => "match",
            ParityOutcome::Mismatch => "mismatch",
            ParityOutcome::EngineError => "engine_error",
            ParityOutcome::Unsupported => "unsupported",
            ParityOutcome::Skipped => "skipped",
        }
    }
}

/// Latencies are recorded in microseconds, 1 µs to one hour, at 3
/// significant figures; longer ones count as one hour.
const MAX_TRACKED_MICROS: u64 = 3_600_000_000;

/// Shared by every tokenizer client and the ext_proc server (behind an
/// `Arc`). Updating never blocks on I/O; the histogram's lock is held for
/// one record.
#[derive(Debug)]
pub struct TokenizerMetrics {
    calls: AtomicU64,
    tokenized: AtomicU64,
    errors: [AtomicU64; 5],
    fallbacks: [AtomicU64; 5],
    multi_prompt: AtomicU64,
    retries: AtomicU64,
    local_handoffs: AtomicU64,
    parity: [AtomicU64; 5],
    engine_fallback: AtomicBool,
    latency_micros: Mutex<Histogram<u64>>,
}

impl Default for TokenizerMetrics {
    fn default() -> Self {
        TokenizerMetrics {
            calls: AtomicU64::new(0),
            tokenized: AtomicU64::new(0),
            errors: Default::default(),
            fallbacks: Default::default(),
            multi_prompt: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            local_handoffs: AtomicU64::new(0),
            parity: Default::default(),
            engine_fallback: AtomicBool::new(false),
            latency_micros: Mutex::new(
                Histogram::new_with_bounds(1, MAX_TRACKED_MICROS, 3)
                    .expect("1 µs to 1 h at 3 significant figures is a valid histogram range"),
            ),
        }
    }
}

impl TokenizerMetrics {
    pub fn new() -> TokenizerMetrics {
        TokenizerMetrics::default()
    }

    /// One tokenize call's outcome. `Unsupported` is counted but its
    /// latency is not (nothing was sent); every other call's is, failures
    /// included.
    pub fn record_call<T>(&self, elapsed: Duration, result: &Result<T, TokenizeError>) {
        match result {
            Ok(_) => {
                self.tokenized.fetch_add(1, Relaxed);
            }
            Err(error) => {
                self.errors[ErrorClass::of(error).index()].fetch_add(1, Relaxed);
                if ErrorClass::of(error) == ErrorClass::Unsupported {
                    return;
                }
            }
        }
        self.calls.fetch_add(1, Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX).max(1);
        self.latency_micros.lock().unwrap_or_else(PoisonError::into_inner).saturating_record(micros);
    }

    /// A request routed by load alone because tokenizing it failed (or was
    /// not supported) under the `load-only` policy.
    pub fn record_fallback(&self, error: &TokenizeError) {
        self.fallbacks[ErrorClass::of(error).index()].fetch_add(1, Relaxed);
    }

    /// A completion body with several prompts: only the first prompt's
    /// tokens were used for the pick.
    pub fn record_multi_prompt(&self) {
        self.multi_prompt.fetch_add(1, Relaxed);
    }

    /// A request sent a second time after its connection closed before an
    /// answer.
    pub fn record_retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    /// A body the local tokenizer could not handle, tokenized by the engine.
    pub fn record_local_handoff(&self) {
        self.local_handoffs.fetch_add(1, Relaxed);
    }

    /// One parity check of the local tokenizer against the engine's.
    pub fn record_parity(&self, outcome: ParityOutcome) {
        self.parity[outcome as usize].fetch_add(1, Relaxed);
    }

    /// The local tokenizer disagreed with the engine's and the engine now
    /// tokenizes every request.
    pub fn set_engine_fallback(&self) {
        self.engine_fallback.store(true, Relaxed);
    }

    /// A consistent-enough copy for export (each counter is read once;
    /// counters are not read atomically together).
    pub fn snapshot(&self) -> TokenizerMetricsSnapshot {
        let read = |counters: &[AtomicU64; 5]| std::array::from_fn(|i| counters[i].load(Relaxed));
        TokenizerMetricsSnapshot {
            calls: self.calls.load(Relaxed),
            tokenized: self.tokenized.load(Relaxed),
            errors: read(&self.errors),
            fallbacks: read(&self.fallbacks),
            multi_prompt: self.multi_prompt.load(Relaxed),
            retries: self.retries.load(Relaxed),
            local_handoffs: self.local_handoffs.load(Relaxed),
            parity: std::array::from_fn(|i| self.parity[i].load(Relaxed)),
            engine_fallback: self.engine_fallback.load(Relaxed),
            latency_micros: self.latency_micros.lock().unwrap_or_else(PoisonError::into_inner).clone(),
        }
    }
}

/// Read-only copy of [`TokenizerMetrics`].
#[derive(Clone, Debug)]
pub struct TokenizerMetricsSnapshot {
    /// Calls sent to the tokenizer service (successes and failures;
    /// unsupported bodies excluded).
    pub calls: u64,
    /// Calls that returned token ids.
    pub tokenized: u64,
    errors: [u64; 5],
    fallbacks: [u64; 5],
    /// Completion bodies with several prompts (the first one's tokens used).
    pub multi_prompt: u64,
    /// Requests resent once after their connection closed unanswered.
    pub retries: u64,
    /// Bodies the local tokenizer handed to the engine's (multimodal parts,
    /// a request's own chat template).
    pub local_handoffs: u64,
    parity: [u64; 5],
    /// The local tokenizer disagreed with the engine and every request is
    /// now tokenized by the engine.
    pub engine_fallback: bool,
    /// Round-trip latency of every call in `calls`, in microseconds.
    pub latency_micros: Histogram<u64>,
}

impl TokenizerMetricsSnapshot {
    /// Calls that failed with this class (`Unsupported`: bodies this
    /// tokenizer cannot handle).
    pub fn errors(&self, class: ErrorClass) -> u64 {
        self.errors[class.index()]
    }

    /// Requests routed by load alone after an error of this class.
    pub fn fallbacks(&self, class: ErrorClass) -> u64 {
        self.fallbacks[class.index()]
    }

    /// Parity checks that ended this way.
    pub fn parity(&self, outcome: ParityOutcome) -> u64 {
        self.parity[outcome as usize]
    }

    pub fn total_errors(&self) -> u64 {
        self.errors.iter().sum()
    }

    pub fn total_fallbacks(&self) -> u64 {
        self.fallbacks.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_class() {
        let metrics = TokenizerMetrics::new();
        metrics.record_call(Duration::from_millis(2), &Ok::<_, TokenizeError>(vec![1u32]));
        metrics.record_call::<()>(Duration::from_secs(5), &Err(TokenizeError::Timeout));
        metrics.record_call::<()>(Duration::ZERO, &Err(TokenizeError::Unsupported("chat")));
        metrics.record_fallback(&TokenizeError::Timeout);
        metrics.record_fallback(&TokenizeError::Unsupported("chat"));
        metrics.record_multi_prompt();

        let snap = metrics.snapshot();
        assert_eq!((snap.calls, snap.tokenized, snap.multi_prompt), (2, 1, 1));
        assert_eq!(snap.errors(ErrorClass::Timeout), 1);
        assert_eq!(snap.errors(ErrorClass::Unsupported), 1);
        assert_eq!(snap.total_errors(), 2);
        assert_eq!(snap.fallbacks(ErrorClass::Unsupported), 1);
        assert_eq!(snap.total_fallbacks(), 2);
        // Unsupported calls have no latency: two recorded.
        assert_eq!(snap.latency_micros.len(), 2);
        assert!(snap.latency_micros.max() >= 4_990_000);
        let labels: Vec<_> = ErrorClass::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(labels, ["unsupported", "unreachable", "timeout", "rejected", "upstream"]);
    }
}
