//! The cost of sending a request to a worker, and the pick among costs.
//!
//! Knob names and defaults follow Dynamo's `KvRouterConfig`, so a user
//! moving between the two keeps their tuning.

use std::net::SocketAddr;
use std::time::Duration;

use crate::calibration::CalibrationConfig;
use crate::worker::WorkerId;

#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    /// Weight of prefill work against decode blocks (Dynamo's
    /// `prefill_load_scale`; its older name is `overlap_score_weight`).
    pub prefill_load_scale: f64,
    /// 0 picks the cheapest (ties uniformly at random); above 0 samples a
    /// softmax over range-normalised costs.
    pub temperature: f64,
    /// Queue while every eligible worker has more than this many times its
    /// `max_num_batched_tokens` in prefill. `None`: never queue.
    pub queue_threshold: Option<f64>,
    /// Requests that may wait at once; more are refused.
    pub queue_capacity: usize,
    /// How long a request may wait in the queue.
    pub queue_timeout: Duration,
    /// Lifetime of a reservation from admission.
    pub lease: Duration,
    /// Seed of the tie-break and sampling generator.
    pub seed: u64,
    /// Fallback endpoints a selection carries after its pick (0: none).
    pub fallbacks: usize,
    /// What a candidate costs.
    pub cost: CostModel,
    /// How the latency cost learns each worker's speed.
    pub calibration: CalibrationConfig,
    /// Latency cost: recomputations a copied block is charged, times the
    /// worker's eviction pressure (see [`Candidate::copy_penalty_ns`]).
    pub copy_weight: f64,
    /// Latency cost: a worker where the request's decode steps are
    /// predicted slower than this is chosen only when every worker is
    /// (see [`Candidate::predicted_tpot_ns`]). `None`: no guard.
    pub tpot_target: Option<Duration>,
    /// Session affinity: a request's `sticky` worker is chosen while its
    /// cost is at most this fraction above the cheapest (0: only on a tie).
    pub session_margin: f64,
    /// Memory budget of the KV index, shared evenly by the shards; each
    /// shard's workers take their fixed cost out of its share first
    /// (`index::WORKER_BYTES`), and past the rest the coldest blocks are
    /// evicted. `None`: no budget (the serve command always sets one).
    pub index_max_bytes: Option<u64>,
}

/// How a candidate worker is costed for a request.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum CostModel {
    /// Dynamo's `KvRouterConfig` formula, in blocks ([`Candidate::cost`]).
    #[default]
    Dynamo,
    /// The request's predicted time to first token on the worker, in ns
    /// ([`Candidate::predicted_ttft_ns`]), from these engine rates.
    Latency(EngineRates),
}

/// How fast an engine computes, as a continuous-batching scheduler step
/// costs: `step_ns + prefill_ns_per_token · prefill tokens in the step +
/// decode_ns_per_seq · sequences decoding in it`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineRates {
    pub step_ns: f64,
    pub prefill_ns_per_token: f64,
    pub decode_ns_per_seq: f64,
    /// Prefill tokens one step takes, when the worker does not say
    /// (`max_num_batched_tokens`).
    pub batched_tokens: u64,
}

impl Default for EngineRates {
    /// A mid-size model on one current GPU, roughly: 5 ms per step, 50 µs
    /// per prefill token, 250 µs per decoding sequence, 8,192 tokens a step.
    fn default() -> Self {
        EngineRates { step_ns: 5e6, prefill_ns_per_token: 5e4, decode_ns_per_seq: 2.5e5, batched_tokens: 8192 }
    }
}

/// Added to the cost of a worker whose KV cache cannot hold the request's
/// blocks on top of what is booked there: it would preempt or evict, so it
/// is chosen only when every worker is that full.
const KV_OVERFLOW_PENALTY_NS: f64 = 1e15;

/// Added to the cost of a worker past the TPOT target: beyond any real
/// TTFT (about 17 minutes), so a worker within the target always wins,
/// and short of the KV overflow penalty, which guards the harder limit.
const TPOT_GUARD_PENALTY_NS: f64 = 1e12;

/// Chosen in `kvpick-bench-routing` (perf/README.md, routing): with caches
/// under pressure, 1 and 2 beat 0 on every workload and 2 held up best
/// past saturation; with room in the caches the penalty is zero anyway.
pub const DEFAULT_COPY_WEIGHT: f64 = 2.0;

/// A session stays on its worker while that costs at most a quarter more
/// than the cheapest: a conversation's cache is there, and a small load
/// difference is not worth leaving it (llm-d's session-affinity scorer
/// sticks unconditionally; this yields when the worker is clearly worse).
pub const DEFAULT_SESSION_MARGIN: f64 = 0.25;

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            prefill_load_scale: 1.0,
            temperature: 0.0,
            queue_threshold: None,
            queue_capacity: 1024,
            queue_timeout: Duration::from_secs(30),
            lease: Duration::from_secs(300),
            seed: 0x6b76_7069_636b,
            fallbacks: 0,
            cost: CostModel::Dynamo,
            calibration: CalibrationConfig::default(),
            copy_weight: DEFAULT_COPY_WEIGHT,
            tpot_target: None,
            session_margin: DEFAULT_SESSION_MARGIN,
            index_max_bytes: None,
        }
    }
}

/// One eligible worker as a shard sees it for one prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub worker: WorkerId,
    pub endpoint: SocketAddr,
    pub block_size: u32,
    /// Leading prompt blocks already in the worker's KV cache.
    pub overlap_blocks: u32,
    pub active_prefill_tokens: u64,
    pub active_blocks: u64,
    /// Hashed prompt blocks not already active on the worker.
    pub new_blocks: u64,
    pub active_requests: u32,
    pub max_num_batched_tokens: Option<u64>,
    /// The worker's KV cache size in blocks, when known.
    pub total_kv_blocks: Option<u64>,
    /// Leading prompt blocks booked on the worker by requests in flight:
    /// computed there already or being computed, so cached by the time
    /// this request's prefill runs (its KV events may not have come yet).
    pub booked_prefix_blocks: u32,
    /// How much slower than the fleet the worker computes, as calibration
    /// learned it (1: as fast as the fleet, or not known).
    pub speed: f64,
    /// How hard the worker's cache churns, 0 (room to spare) to 1 (every
    /// block stored evicts one), from its KV events.
    pub eviction_pressure: f64,
}

impl Candidate {
    /// Prompt tokens the worker would have to compute.
    pub fn effective_prefill_tokens(&self, isl_tokens: u32) -> u32 {
        let cached = u64::from(self.overlap_blocks) * u64::from(self.block_size);
        isl_tokens - cached.min(u64::from(isl_tokens)) as u32
    }

    /// Prompt tokens the worker would have to compute, counting blocks
    /// booked there by requests in flight as cached: the latency cost's
    /// view. Without it, a burst of requests sharing a new prefix would be
    /// spread before the first one's KV events arrive.
    pub fn uncached_tokens(&self, isl_tokens: u32) -> u32 {
        let cached = u64::from(self.cached_or_booked_blocks()) * u64::from(self.block_size);
        isl_tokens - cached.min(u64::from(isl_tokens)) as u32
    }

    /// Leading prompt blocks cached on the worker or booked there by a
    /// request in flight.
    pub fn cached_or_booked_blocks(&self) -> u32 {
        self.overlap_blocks.max(self.booked_prefix_blocks)
    }

    /// What copying the prompt's prefix here costs the fleet, in ns: when
    /// another worker holds `best_blocks` leading blocks and this one
    /// fewer, computing the difference here makes a second copy, and a
    /// worker whose cache churns (eviction pressure near 1) makes room for
    /// it by evicting blocks someone will recompute. Charged `weight`
    /// recomputations of the copied tokens, times the pressure: nothing
    /// while the cache has room, so a hot prefix may still spread to an
    /// idle worker; a full recompute's worth when every store evicts, so
    /// a busy fleet keeps each prefix in one place instead of thrashing
    /// (the myopic TTFT would copy whenever a queue is shorter).
    pub fn copy_penalty_ns(&self, best_blocks: u32, rates: &EngineRates, weight: f64) -> f64 {
        let copied = best_blocks.saturating_sub(self.cached_or_booked_blocks());
        let tokens = f64::from(copied) * f64::from(self.block_size);
        weight * self.eviction_pressure * tokens * rates.prefill_ns_per_token * self.speed
    }

    /// In blocks: `scale · max(0, (prefill + isl)/block_size − overlap) +
    /// potential decode blocks`, where the request's blocks that are not
    /// active on the worker yet (hashed or not) count as new decode blocks.
    pub fn cost(&self, isl_tokens: u32, unhashed_blocks: u32, cfg: &RouterConfig) -> f64 {
        let block_size = f64::from(self.block_size.max(1));
        let prefill_blocks = (self.active_prefill_tokens + u64::from(isl_tokens)) as f64 / block_size;
        let prefill = (prefill_blocks - f64::from(self.overlap_blocks)).max(0.0);
        let decode = (self.active_blocks + self.new_blocks + u64::from(unhashed_blocks)) as f64;
        cfg.prefill_load_scale * prefill + decode
    }

    /// The request's predicted time to first token here, in ns, at the
    /// priors' rates: the prefill booked ahead of it and its own uncached
    /// prefill, computed in steps of at most the step's token budget less
    /// one token per sequence decoding, each step also paying for those
    /// sequences. What calibration compares measured TTFTs with.
    pub fn prior_ttft_ns(&self, isl_tokens: u32, rates: &EngineRates) -> f64 {
        let prefill = self.active_prefill_tokens + u64::from(self.uncached_tokens(isl_tokens));
        let decoding = u64::from(self.active_requests);
        let budget = self.max_num_batched_tokens.unwrap_or(rates.batched_tokens);
        let per_step = budget.saturating_sub(decoding).max(1);
        let steps = prefill.div_ceil(per_step).max(1) as f64;
        steps * (rates.step_ns + decoding as f64 * rates.decode_ns_per_seq)
            + prefill as f64 * rates.prefill_ns_per_token
    }

    /// The prior prediction scaled by the worker's calibrated speed. A
    /// worker whose cache cannot hold the request's new blocks is costed
    /// past every one that can.
    pub fn predicted_ttft_ns(&self, isl_tokens: u32, unhashed_blocks: u32, rates: &EngineRates) -> f64 {
        let ttft = self.prior_ttft_ns(isl_tokens, rates) * self.speed;
        let needed = self.active_blocks + self.new_blocks + u64::from(unhashed_blocks);
        match self.total_kv_blocks {
            Some(total) if needed > total => ttft + KV_OVERFLOW_PENALTY_NS,
            _ => ttft,
        }
    }

    /// The time of one of the request's decode steps on the worker, in ns:
    /// a step's overhead plus one decode per sequence running there, the
    /// request's own included, at the worker's calibrated speed. Prefill
    /// booked now is done by the time this request decodes, so it is not
    /// counted; prefills arriving later are not known.
    pub fn predicted_tpot_ns(&self, rates: &EngineRates) -> f64 {
        let sequences = f64::from(self.active_requests) + 1.0;
        (rates.step_ns + sequences * rates.decode_ns_per_seq) * self.speed
    }

    /// What the TPOT guard adds to the latency cost: nothing within the
    /// target, a penalty past every worker within it otherwise.
    pub fn tpot_guard_ns(&self, rates: &EngineRates, target: Option<Duration>) -> f64 {
        match target {
            Some(target) if self.predicted_tpot_ns(rates) > target.as_nanos() as f64 => TPOT_GUARD_PENALTY_NS,
            _ => 0.0,
        }
    }

    /// The candidate's cost under `cfg.cost`.
    pub fn cost_under(&self, isl_tokens: u32, unhashed_blocks: u32, cfg: &RouterConfig) -> f64 {
        match &cfg.cost {
            CostModel::Dynamo => self.cost(isl_tokens, unhashed_blocks, cfg),
            CostModel::Latency(rates) => self.predicted_ttft_ns(isl_tokens, unhashed_blocks, rates),
        }
    }

    /// Past the queueing threshold (never, without capacity facts).
    pub fn saturated(&self, threshold: f64) -> bool {
        self.max_num_batched_tokens.is_some_and(|max| self.active_prefill_tokens as f64 > threshold * max as f64)
    }
}

/// Index of the chosen cost. `costs` must be non-empty and in a fixed order
/// (by worker id), so that the same seed gives the same pick.
pub fn pick(costs: &[f64], temperature: f64, rng: &mut fastrand::Rng) -> usize {
    debug_assert!(!costs.is_empty());
    let (min, max) = costs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &c| (lo.min(c), hi.max(c)));
    if temperature <= 0.0 || max <= min {
        // Reservoir sampling over the minima: uniform without a second pass.
        let mut chosen = 0;
        let mut seen = 0;
        for (i, &c) in costs.iter().enumerate() {
            if c == min {
                seen += 1;
                if rng.usize(..seen) == 0 {
                    chosen = i;
                }
            }
        }
        return chosen;
    }
    let scale = (max - min) * temperature;
    let weights = costs.iter().map(|c| (-(c - min) / scale).exp());
    let total: f64 = weights.clone().sum();
    let mut target = rng.f64() * total;
    for (i, w) in weights.enumerate() {
        if target < w {
            return i;
        }
        target -= w;
    }
    costs.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(overlap: u32, prefill: u64, blocks: u64, new_blocks: u64) -> Candidate {
        Candidate {
            worker: WorkerId(1),
            endpoint: "10.0.0.1:8000".parse().unwrap(),
            block_size: 16,
            overlap_blocks: overlap,
            active_prefill_tokens: prefill,
            active_blocks: blocks,
            new_blocks,
            active_requests: 0,
            max_num_batched_tokens: Some(100),
            total_kv_blocks: None,
            booked_prefix_blocks: 0,
            speed: 1.0,
            eviction_pressure: 0.0,
        }
    }

    #[test]
    fn cost_follows_the_design_formula() {
        let cfg = RouterConfig::default();
        // (32 + 64)/16 − 2 = 4 prefill blocks, 10 + 2 + 1 decode blocks.
        assert_eq!(candidate(2, 32, 10, 2).cost(64, 1, &cfg), 4.0 + 13.0);
        // Overlap beyond the prefill work never makes the cost negative.
        assert_eq!(candidate(50, 0, 0, 0).cost(64, 0, &cfg), 0.0);
        let scaled = RouterConfig { prefill_load_scale: 2.0, ..cfg };
        assert_eq!(candidate(0, 0, 0, 4).cost(64, 0, &scaled), 8.0 + 4.0);
    }

    #[test]
    fn effective_prefill_is_what_is_not_cached() {
        assert_eq!(candidate(2, 0, 0, 0).effective_prefill_tokens(40), 8);
        assert_eq!(candidate(9, 0, 0, 0).effective_prefill_tokens(40), 0);
        // Blocks booked by a request in flight count for the latency cost
        // only (Dynamo's formula is kept exactly).
        let booked = Candidate { booked_prefix_blocks: 2, ..candidate(1, 0, 0, 0) };
        assert_eq!(booked.uncached_tokens(40), 8);
        assert_eq!(booked.effective_prefill_tokens(40), 24);
        assert!(
            booked.predicted_ttft_ns(40, 0, &EngineRates::default())
                < candidate(1, 0, 0, 0).predicted_ttft_ns(40, 0, &EngineRates::default())
        );
    }

    #[test]
    fn predicted_ttft_follows_the_physics() {
        let rates = EngineRates::default();
        let ttft = |c: &Candidate| c.predicted_ttft_ns(64, 0, &rates);
        // More of the prompt cached: cheaper.
        assert!(ttft(&candidate(3, 0, 0, 0)) < ttft(&candidate(1, 0, 0, 0)));
        // More prefill booked ahead: dearer.
        assert!(ttft(&candidate(0, 200, 0, 0)) > ttft(&candidate(0, 10, 0, 0)));
        // More sequences decoding: every step is slower.
        let busy = Candidate { active_requests: 20, ..candidate(0, 0, 0, 0) };
        assert!(ttft(&busy) > ttft(&candidate(0, 0, 0, 0)));
        // A slower engine: dearer, in proportion.
        let slow = Candidate { speed: 2.0, ..candidate(0, 0, 0, 0) };
        assert_eq!(ttft(&slow), 2.0 * ttft(&candidate(0, 0, 0, 0)));
        assert_eq!(slow.prior_ttft_ns(64, &rates), ttft(&candidate(0, 0, 0, 0)));
        // 64 uncached tokens at a budget of 100 a step: one step.
        let expected = rates.step_ns + 64.0 * rates.prefill_ns_per_token;
        assert_eq!(ttft(&candidate(0, 0, 0, 0)), expected);
        // 264 tokens (200 booked + 64): three steps.
        assert_eq!(ttft(&candidate(0, 200, 0, 0)), 3.0 * rates.step_ns + 264.0 * rates.prefill_ns_per_token);
    }

    #[test]
    fn a_worker_whose_cache_would_overflow_comes_after_every_one_that_fits() {
        let rates = EngineRates::default();
        let full = Candidate { total_kv_blocks: Some(10), ..candidate(4, 0, 8, 4) };
        let roomy_but_busy = Candidate { total_kv_blocks: Some(1000), ..candidate(0, 5_000, 8, 4) };
        assert!(full.predicted_ttft_ns(64, 0, &rates) > roomy_but_busy.predicted_ttft_ns(64, 0, &rates));
        let cfg = RouterConfig { cost: CostModel::Latency(rates), ..RouterConfig::default() };
        assert_eq!(full.cost_under(64, 0, &cfg), full.predicted_ttft_ns(64, 0, &rates));
        assert_eq!(full.cost_under(64, 0, &RouterConfig::default()), full.cost(64, 0, &RouterConfig::default()));
    }

    #[test]
    fn copying_a_prefix_costs_only_under_eviction_pressure() {
        let rates = EngineRates::default();
        let holder = candidate(4, 0, 0, 0);
        let empty = candidate(1, 0, 0, 0);
        // Room to spare: no charge, however much is copied.
        assert_eq!(empty.copy_penalty_ns(4, &rates, 2.0), 0.0);
        // Every store evicts: 3 blocks of 16 tokens, recomputed twice.
        let churning = Candidate { eviction_pressure: 1.0, ..empty };
        assert_eq!(churning.copy_penalty_ns(4, &rates, 2.0), 2.0 * 48.0 * rates.prefill_ns_per_token);
        // Half the pressure, half the charge; the holder pays nothing.
        let half = Candidate { eviction_pressure: 0.5, ..empty };
        assert_eq!(half.copy_penalty_ns(4, &rates, 2.0), 48.0 * rates.prefill_ns_per_token);
        assert_eq!(Candidate { eviction_pressure: 1.0, ..holder }.copy_penalty_ns(4, &rates, 2.0), 0.0);
    }

    #[test]
    fn the_tpot_guard_puts_workers_past_the_target_after_every_one_within_it() {
        let rates = EngineRates::default();
        // 5 ms + 250 µs per sequence, the request's own included.
        let busy = Candidate { active_requests: 15, ..candidate(4, 0, 0, 0) };
        assert_eq!(busy.predicted_tpot_ns(&rates), 5e6 + 16.0 * 2.5e5);
        let slow = Candidate { speed: 2.0, ..candidate(0, 0, 0, 0) };
        assert_eq!(slow.predicted_tpot_ns(&rates), 2.0 * (5e6 + 2.5e5));
        let target = Some(Duration::from_millis(8));
        assert!(busy.tpot_guard_ns(&rates, target) > 0.0);
        assert_eq!(candidate(0, 0, 0, 0).tpot_guard_ns(&rates, target), 0.0);
        // Off: never charged. Past it: beyond any TTFT, short of a KV overflow.
        assert_eq!(busy.tpot_guard_ns(&rates, None), 0.0);
        assert!(
            busy.tpot_guard_ns(&rates, target) > 1e11 && busy.tpot_guard_ns(&rates, target) < KV_OVERFLOW_PENALTY_NS
        );
    }

    #[test]
    fn saturation_needs_capacity_facts() {
        assert!(candidate(0, 201, 0, 0).saturated(2.0));
        assert!(!candidate(0, 200, 0, 0).saturated(2.0));
        let mut unknown = candidate(0, 10_000, 0, 0);
        unknown.max_num_batched_tokens = None;
        assert!(!unknown.saturated(0.0));
    }

    #[test]
    fn cheapest_wins_and_ties_are_uniform() {
        let mut rng = fastrand::Rng::with_seed(7);
        assert_eq!(pick(&[3.0, 1.0, 2.0], 0.0, &mut rng), 1);
        let mut counts = [0; 3];
        for _ in 0..3000 {
            counts[pick(&[1.0, 5.0, 1.0], 0.0, &mut rng)] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!(counts[0] > 1300 && counts[2] > 1300, "{counts:?}");
    }

    #[test]
    fn temperature_prefers_cheaper_but_explores() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut counts = [0; 2];
        for _ in 0..4000 {
            counts[pick(&[0.0, 10.0], 1.0, &mut rng)] += 1;
        }
        // p(expensive) = e^-1 / (1 + e^-1) ≈ 0.27.
        assert!(counts[1] > 900 && counts[1] < 1300, "{counts:?}");
        let mut counts = [0; 2];
        for _ in 0..2000 {
            counts[pick(&[4.0, 4.0], 1.0, &mut rng)] += 1;
        }
        assert!(counts[0] > 850 && counts[1] > 850, "{counts:?}");
    }
}
