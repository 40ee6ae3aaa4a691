//! SGLang's model gateway (SMG / sgl-router), cache-aware policy, as its
//! router documents it, with the CLI's defaults (what `python -m
//! sglang_router.launch_router` users run): `cache_threshold` 0.3,
//! `balance_abs_threshold` 64, `balance_rel_threshold` 1.5.
//!
//! Per request: when the router's own in-flight counts are imbalanced
//! (`max − min > 64` and `max > 1.5 × min`) it sends to the least loaded
//! worker; otherwise it matches the prompt against each worker's
//! approximate tree of what it was sent, and sends to the best match if
//! the match rate exceeds 0.3, else to the worker with the smallest tree.
//! Either way the prompt is inserted into the chosen worker's tree. The
//! real tree holds raw text at character granularity; here it holds token
//! blocks (as the approximate-prefix policy does), and its size is the CLI
//! default of 2^26 entries, which these runs never reach.

use kvpick_core::hashing::{HashSeed, sequence_hashes};

use super::approx_prefix::Lru;
use super::fleet::{Arrival, FleetView, Policy};

const CACHE_THRESHOLD: f64 = 0.3;
const BALANCE_ABS_THRESHOLD: u32 = 64;
const BALANCE_REL_THRESHOLD: f64 = 1.5;
const MAX_TREE_SIZE: usize = 1 << 26;

pub struct SglangCacheAware {
    block_size: u32,
    trees: Vec<Lru>,
    stamp: u64,
    in_flight: Vec<u32>,
    engine_of: Vec<usize>,
    rng: fastrand::Rng,
}

impl SglangCacheAware {
    pub fn new(engines: usize, requests: usize, block_size: u32, seed: u64) -> Self {
        SglangCacheAware {
            block_size,
            trees: (0..engines).map(|_| Lru::new(MAX_TREE_SIZE)).collect(),
            stamp: 0,
            in_flight: vec![0; engines],
            engine_of: vec![0; requests],
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    fn least_loaded(&mut self) -> usize {
        super::baselines::argmin_random(self.in_flight.iter().map(|&n| f64::from(n)), &mut self.rng)
    }
}

impl Policy for SglangCacheAware {
    fn route(&mut self, arrival: &Arrival<'_>, _: &FleetView<'_>) -> usize {
        let bs = self.block_size as usize;
        let hashes =
            sequence_hashes(&arrival.tokens[..arrival.tokens.len() / bs * bs], self.block_size, HashSeed::default());
        let (min, max) = self.in_flight.iter().fold((u32::MAX, 0), |(lo, hi), &n| (lo.min(n), hi.max(n)));
        let imbalanced = max - min > BALANCE_ABS_THRESHOLD && f64::from(max) > f64::from(min) * BALANCE_REL_THRESHOLD;
        let k = if imbalanced {
            self.least_loaded()
        } else {
            let matched: Vec<usize> = self.trees.iter().map(|t| t.matched(&hashes)).collect();
            let best = matched.iter().copied().max().unwrap_or(0);
            let rate = (best * bs) as f64 / arrival.tokens.len().max(1) as f64;
            if rate > CACHE_THRESHOLD {
                let ties = matched.iter().map(|&m| if m == best { 0.0 } else { 1.0 });
                super::baselines::argmin_random(ties, &mut self.rng)
            } else {
                let sizes = self.trees.iter().map(|t| t.len() as f64);
                super::baselines::argmin_random(sizes, &mut self.rng)
            }
        };
        for hash in hashes {
            self.stamp += 1;
            self.trees[k].touch(hash, self.stamp);
        }
        self.in_flight[k] += 1;
        self.engine_of[arrival.id] = k;
        k
    }

    fn on_finished(&mut self, id: usize, _: u64) {
        let k = self.engine_of[id];
        self.in_flight[k] = self.in_flight[k].saturating_sub(1);
    }
}
