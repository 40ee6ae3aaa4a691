//! The pick: one decision, made by the same code whichever driver runs it.
//!
//! A driver (the single-threaded [`SelectionService`], the thread-per-core
//! runtime's scatter–gather, or a shard thread that owns every worker)
//! gathers the candidates of a request from its shards, in any order, and
//! hands them to [`PickPolicy::decide`]. The policy sorts them into the
//! one order every pick is made in (by worker id), so the same seed gives
//! the same pick in every driver, then either books the cheapest, asks
//! for the request to queue, or says no worker can take it. Drivers keep
//! only what is theirs: where shards live and how they are reached.
//!
//! The policy also hashes prompts ([`PickPolicy::prompt`]): the engines'
//! block size is known here and nowhere else.
//!
//! [`SelectionService`]: crate::SelectionService

use std::net::SocketAddr;

use crate::booking::Booking;
use crate::clock::Millis;
use crate::cost::{Candidate, CostModel, RouterConfig, pick};
use crate::hashing::HashSeed;
use crate::prompt::Prompt;
use crate::request::{SelectRequest, Selection, WorkerError};
use crate::worker::WorkerSpec;

/// The router's settings and the engines' block size: everything a pick
/// reads besides the candidates and the random generator.
#[derive(Clone, Debug, PartialEq)]
pub struct PickPolicy {
    cfg: RouterConfig,
    block_size: u32,
}

/// What the policy decided for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Book `booking` on the worker of `selection`.
    Book { selection: Selection, booking: Booking },
    /// Every candidate is past the queueing threshold: the request waits.
    Saturated,
    /// No worker may serve the request.
    NoEligible,
}

impl PickPolicy {
    /// `block_size` is the engines' `--block-size`.
    pub fn new(cfg: RouterConfig, block_size: u32) -> Self {
        PickPolicy { cfg, block_size }
    }

    pub fn config(&self) -> &RouterConfig {
        &self.cfg
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Hashes a prompt's tokens the way the index hashes the engines'
    /// blocks (the seed folds in a LoRA name and a cache salt).
    pub fn prompt(&self, tokens: &[u32], seed: HashSeed) -> Prompt {
        Prompt::from_tokens(tokens, self.block_size, seed)
    }

    /// A worker whose blocks are hashed with another size could never
    /// match a prompt: refused before it is placed.
    pub fn check_worker(&self, spec: &WorkerSpec) -> Result<(), WorkerError> {
        if spec.block_size != self.block_size {
            return Err(WorkerError::BlockSizeMismatch { worker: spec.block_size, service: self.block_size });
        }
        Ok(())
    }

    /// Books the cheapest candidate, or queues, or refuses. `candidates`
    /// come from every shard in any order and are sorted here; `costs` is
    /// a buffer the caller reuses; `rng` is the service's one generator.
    pub fn decide(
        &self,
        request: &SelectRequest,
        candidates: &mut [Candidate],
        costs: &mut Vec<f64>,
        rng: &mut fastrand::Rng,
        now: Millis,
    ) -> Decision {
        if candidates.is_empty() {
            return Decision::NoEligible;
        }
        if let Some(threshold) = self.cfg.queue_threshold {
            if candidates.iter().all(|c| c.saturated(threshold)) {
                return Decision::Saturated;
            }
        }
        let selection = self.choose(request, candidates, costs, rng);
        let booking = Booking {
            id: request.id,
            worker: selection.worker,
            seq_hashes: request.prompt.seq_hashes.clone(),
            unhashed_blocks: request.prompt.unhashed_blocks(self.block_size),
            prefill_tokens: selection.prefill_tokens,
            lease_until: now.after(self.cfg.lease),
        };
        Decision::Book { selection, booking }
    }

    /// The cheapest candidate, without a queue check or a booking.
    /// `candidates` must not be empty.
    pub fn choose(
        &self,
        request: &SelectRequest,
        candidates: &mut [Candidate],
        costs: &mut Vec<f64>,
        rng: &mut fastrand::Rng,
    ) -> Selection {
        // Stable: it finds the runs the shards' lists arrive in and merges
        // them, where the unstable sort moved these 128-byte candidates
        // many times (2 shards: reserve + free p50 4-7% lower, perf/results/
        // 2026-12-07-huge-pages-hash-floor-256.md). It allocates its merge
        // buffer even for a sorted list: one shard's usually is.
        if !candidates.is_sorted_by_key(|c| c.worker) {
            candidates.sort_by_key(|c| c.worker);
        }
        let prompt = &request.prompt;
        let unhashed = prompt.unhashed_blocks(self.block_size);
        costs.clear();
        costs.extend(candidates.iter().map(|c| c.cost_under(prompt.isl_tokens, unhashed, &self.cfg)));
        if let CostModel::Latency(rates) = &self.cfg.cost {
            // What the best placed worker already holds (or has booked).
            let best = candidates.iter().map(Candidate::cached_or_booked_blocks).max().unwrap_or(0);
            for (c, cost) in candidates.iter().zip(costs.iter_mut()) {
                *cost +=
                    c.copy_penalty_ns(best, rates, self.cfg.copy_weight) + c.tpot_guard_ns(rates, self.cfg.tpot_target);
            }
        }
        let chosen = match sticky_within_margin(request, candidates, costs, self.cfg.session_margin) {
            Some(i) => i,
            None => pick(costs, self.cfg.temperature, rng),
        };
        let c = &candidates[chosen];
        let past_tpot_target = match &self.cfg.cost {
            CostModel::Latency(rates) => c.tpot_guard_ns(rates, self.cfg.tpot_target) > 0.0,
            CostModel::Dynamo => false,
        };
        Selection {
            id: request.id,
            worker: c.worker,
            endpoint: c.endpoint,
            overlap_blocks: c.overlap_blocks,
            prefill_tokens: match &self.cfg.cost {
                CostModel::Latency(_) => c.uncached_tokens(prompt.isl_tokens),
                CostModel::Dynamo => c.effective_prefill_tokens(prompt.isl_tokens),
            },
            isl_tokens: prompt.isl_tokens,
            cost: costs[chosen],
            // A load-only prompt's length is a guess: no sample to learn from.
            predicted_ttft_ns: match &self.cfg.cost {
                CostModel::Latency(rates) if prompt.tokens_known => Some(c.prior_ttft_ns(prompt.isl_tokens, rates)),
                _ => None,
            },
            candidates: candidates.len(),
            fallbacks: ranked_others(candidates, costs, chosen, self.cfg.fallbacks),
            past_tpot_target,
        }
    }
}

/// The session's worker, when it is a candidate and costs at most
/// `margin` more than the cheapest.
fn sticky_within_margin(
    request: &SelectRequest,
    candidates: &[Candidate],
    costs: &[f64],
    margin: f64,
) -> Option<usize> {
    let sticky = request.sticky?;
    let i = candidates.iter().position(|c| c.worker == sticky)?;
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    (costs[i] <= min + margin * min.abs()).then_some(i)
}

/// Up to `n` other candidates by cost, then by their (deterministic) order.
fn ranked_others(candidates: &[Candidate], costs: &[f64], chosen: usize, n: usize) -> Vec<SocketAddr> {
    if n == 0 {
        return Vec::new();
    }
    let mut others: Vec<usize> = (0..candidates.len()).filter(|i| *i != chosen).collect();
    others.sort_by(|a, b| costs[*a].total_cmp(&costs[*b]).then(a.cmp(b)));
    others.into_iter().take(n).map(|i| candidates[i].endpoint).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::booking::ReservationId;
    use crate::worker::WorkerId;

    fn candidate(worker: u64, active_prefill_tokens: u64) -> Candidate {
        Candidate {
            worker: WorkerId(worker),
            endpoint: SocketAddr::from(([10, 0, 0, worker as u8], 8000)),
            block_size: 16,
            overlap_blocks: (worker % 5) as u32,
            active_prefill_tokens,
            active_blocks: worker % 7,
            new_blocks: 4,
            active_requests: 1,
            max_num_batched_tokens: Some(2048),
            total_kv_blocks: None,
            booked_prefix_blocks: 0,
            speed: 1.0,
            eviction_pressure: 0.0,
        }
    }

    /// However the shards' lists arrive (one run, two runs interleaved,
    /// reversed, shuffled), the same seed makes the same pick, ties and
    /// sampling included: every order is sorted into worker order first.
    #[test]
    fn the_gathering_order_never_changes_the_pick() {
        let request = SelectRequest {
            id: ReservationId(1),
            prompt: Prompt::load_only(64),
            model: None,
            allowed: None,
            priority: 0,
            sticky: None,
        };
        // Pairs of equal loads make ties; 64 candidates, as at 64 workers.
        let sorted: Vec<Candidate> = (0..64).map(|w| candidate(w, 32 * (w / 2))).collect();
        let two_runs: Vec<Candidate> =
            sorted.iter().step_by(2).chain(sorted.iter().skip(1).step_by(2)).cloned().collect();
        let reversed: Vec<Candidate> = sorted.iter().rev().cloned().collect();
        let mut shuffled = sorted.clone();
        let mut next = crate::test_rng::xorshift(0xfeed);
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        for temperature in [0.0, 0.5] {
            let policy = PickPolicy::new(RouterConfig { temperature, ..RouterConfig::default() }, 16);
            for seed in 0..8 {
                let choose = |candidates: &[Candidate]| {
                    let mut candidates = candidates.to_vec();
                    policy.choose(&request, &mut candidates, &mut Vec::new(), &mut fastrand::Rng::with_seed(seed))
                };
                let expected = choose(&sorted);
                for order in [&two_runs, &reversed, &shuffled] {
                    assert_eq!(choose(order), expected, "temperature {temperature}, seed {seed}");
                }
            }
        }
    }
}
