//! How long the simulated GPU takes, in virtual time, and how virtual time
//! is paced against the wall clock.
//!
//! The engine runs in steps like vLLM's scheduler: each step computes some
//! prefill tokens (chunked, within `max_batched_tokens`) and one token for
//! every decoding request. A step lasts
//! `step_overhead + prefill_tokens × prefill_per_token + decoding × decode_per_seq`
//! of virtual time, so time to first token grows with the uncached prompt
//! tokens and with the prefill work queued ahead, and each running request
//! gets tokens at a fixed rate slowed by the batch size.
//!
//! Virtual time runs `time_scale` times faster than the wall clock (100:
//! a 1 s virtual step sleeps 10 ms). While the engine is idle virtual time
//! follows the wall clock; while busy it advances by step durations only
//! and the loop sleeps to each step's end, so durations measured in virtual
//! time are exact whatever the host's load.

use std::time::Duration;

use tokio::time::Instant;

use super::config::ConfigError;

/// Step costs, in virtual nanoseconds, and the pace of virtual time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimeModel {
    /// Fixed cost of every step (kernel launches, sampling).
    pub step_overhead_ns: u64,
    /// Cost of one uncached prompt token.
    pub prefill_ns_per_token: u64,
    /// Cost of one decoding request in a step.
    pub decode_ns_per_seq: u64,
    /// Virtual seconds per wall-clock second: 1 is real time, 100 is 100×
    /// faster, `f64::INFINITY` never sleeps (virtual time only).
    pub time_scale: f64,
}

impl Default for TimeModel {
    /// Roughly an 8B model on one GPU: 20k prefill tokens/s, 5.25 ms
    /// per output token alone, 21 ms in a batch of 64.
    fn default() -> Self {
        TimeModel {
            step_overhead_ns: 5_000_000,
            prefill_ns_per_token: 50_000,
            decode_ns_per_seq: 250_000,
            time_scale: 1.0,
        }
    }
}

impl TimeModel {
    /// Virtual duration of a step computing `prefill_tokens` prompt tokens
    /// and one token for each of `decoding` requests.
    pub fn step_ns(&self, prefill_tokens: u64, decoding: u64) -> u64 {
        self.step_overhead_ns
            .saturating_add(prefill_tokens.saturating_mul(self.prefill_ns_per_token))
            .saturating_add(decoding.saturating_mul(self.decode_ns_per_seq))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.time_scale.is_nan() || self.time_scale <= 0.0 {
            return Err(ConfigError { field: "time_scale", problem: format!("{} is not > 0", self.time_scale) });
        }
        if self.step_overhead_ns == 0 {
            // A zero-cost step would let an unpaced engine spin forever.
            return Err(ConfigError { field: "step_overhead_ns", problem: "must be at least 1".into() });
        }
        Ok(())
    }
}

/// Maps virtual time to the wall clock for one engine.
#[derive(Debug)]
pub(crate) struct Pacer {
    origin: Instant,
    scale: f64,
}

impl Pacer {
    pub(crate) fn new(scale: f64) -> Self {
        Pacer { origin: Instant::now(), scale }
    }

    /// Virtual time matching the wall clock now; `None` when unpaced.
    pub(crate) fn virtual_now_ns(&self) -> Option<u64> {
        if !self.scale.is_finite() {
            return None;
        }
        let ns = self.origin.elapsed().as_nanos() as f64 * self.scale;
        Some(if ns >= u64::MAX as f64 { u64::MAX } else { ns as u64 })
    }

    /// When virtual time `ns` is reached on the wall clock; `None` when
    /// unpaced.
    pub(crate) fn deadline(&self, ns: u64) -> Option<Instant> {
        if !self.scale.is_finite() {
            return None;
        }
        let real = ns as f64 / self.scale;
        // Past ~584 years there is nothing to wait for in a test.
        let real = Duration::try_from_secs_f64(real / 1e9).unwrap_or(Duration::MAX);
        self.origin.checked_add(real)
    }
}
