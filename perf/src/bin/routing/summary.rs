//! A run's numbers: prefix hit rate (the engines' own count, vLLM's
//! `prefix_cache_hits / prefix_cache_queries`), TTFT percentiles,
//! throughput, goodput and load imbalance.

use super::fleet::{Record, RunResult};

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub completed: usize,
    pub rejected: usize,
    /// Cached prompt tokens / prompt tokens, over completed requests.
    pub hit_rate: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    /// Time per output token after the first (decode speed, which an
    /// overloaded engine pays for).
    pub tpot_p90_ms: f64,
    /// Output tokens per virtual second, first arrival to last finish.
    pub output_tokens_per_s: f64,
    pub requests_per_s: f64,
    /// Requests per second that met the TTFT SLO, first arrival to last
    /// finish (refused and too-slow requests count against it).
    pub goodput_per_s: f64,
    /// Busiest engine's computed tokens (uncached prompt + output) over the
    /// mean: 1 is perfectly even.
    pub imbalance: f64,
    /// Every completed request's TTFT in ms, sorted (for the plots).
    pub ttfts_ms: Vec<f64>,
}

pub fn summarise(run: &RunResult, ttft_slo_ms: f64) -> Summary {
    let done: Vec<_> = run.records.iter().filter(|r| r.finished_ns.is_some()).collect();
    let ttfts_ms = sorted_ttfts_ms(&done);
    let mut tpots_ms: Vec<f64> = done
        .iter()
        .filter(|r| r.output_tokens > 1)
        .filter_map(|r| Some((r.finished_ns? - r.first_token_ns?) as f64 / 1e6 / f64::from(r.output_tokens - 1)))
        .collect();
    tpots_ms.sort_by(f64::total_cmp);
    let output: u64 = done.iter().map(|r| u64::from(r.output_tokens)).sum();
    let start = run.records.iter().map(|r| r.arrival_ns).min().unwrap_or(0);
    let end = done.iter().filter_map(|r| r.finished_ns).max().unwrap_or(start);
    let secs = (end - start) as f64 / 1e9;
    let mean = run.engine_tokens.iter().sum::<u64>() as f64 / run.engine_tokens.len().max(1) as f64;
    let max = run.engine_tokens.iter().copied().max().unwrap_or(0) as f64;
    Summary {
        completed: done.len(),
        rejected: run.records.iter().filter(|r| r.rejected).count(),
        hit_rate: hit_rate(&done),
        ttft_p50_ms: percentile(&ttfts_ms, 0.50),
        ttft_p90_ms: percentile(&ttfts_ms, 0.90),
        ttft_p99_ms: percentile(&ttfts_ms, 0.99),
        tpot_p90_ms: percentile(&tpots_ms, 0.90),
        output_tokens_per_s: if secs > 0.0 { output as f64 / secs } else { 0.0 },
        requests_per_s: if secs > 0.0 { done.len() as f64 / secs } else { 0.0 },
        goodput_per_s: if secs > 0.0 {
            ttfts_ms.iter().filter(|t| **t <= ttft_slo_ms).count() as f64 / secs
        } else {
            0.0
        },
        imbalance: if mean > 0.0 { max / mean } else { 1.0 },
        ttfts_ms,
    }
}

/// Cached prompt tokens over prompt tokens, of completed requests.
pub fn hit_rate(done: &[&Record]) -> f64 {
    let prompt: u64 = done.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let cached: u64 = done.iter().map(|r| u64::from(r.cached_tokens)).sum();
    cached as f64 / prompt.max(1) as f64
}

/// The TTFTs of completed requests, in ms, sorted.
pub fn sorted_ttfts_ms(done: &[&Record]) -> Vec<f64> {
    let mut ttfts: Vec<f64> =
        done.iter().filter_map(|r| r.first_token_ns.map(|t| (t - r.arrival_ns) as f64 / 1e6)).collect();
    ttfts.sort_by(f64::total_cmp);
    ttfts
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
