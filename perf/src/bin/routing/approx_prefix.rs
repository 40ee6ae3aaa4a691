//! The GAIE reference EPP's default scheduling profile, approximated: the
//! prefix scorer guesses each server's cache from what the router itself
//! sent there (no engine events), next to queue and KV-usage scorers fed by
//! scraped metrics.
//!
//! As GAIE documents its approximate prefix scorer: score =
//! 2 × queue + 2 × KV usage + 3 × prefix, the highest wins, ties at random.
//! queue = `(max − q)/(max − min)` over waiting-queue lengths (1 if all
//! equal); KV = `1 − usage`; prefix = matched blocks / hashed blocks, where
//! a prompt hashes at most 256 blocks of 16 tokens and each server's index
//! is an LRU of 31,250 block hashes, updated with the chosen server after
//! each pick. The reference hashes characters (4 per token); hashing token
//! blocks here is the same idea without a tokenizer. Metrics are a snapshot
//! refreshed every 50 ms of virtual time, as a scraper would see them.

use std::collections::{BTreeMap, HashMap};

use kvpick_core::hashing::{HashSeed, SequenceHash, sequence_hashes};

use super::fleet::{Arrival, FleetView, Policy};

const MAX_PREFIX_BLOCKS: usize = 256;
const LRU_CAPACITY: usize = 31_250;
const SCRAPE_INTERVAL_NS: u64 = 50_000_000;
const WEIGHT_QUEUE: f64 = 2.0;
const WEIGHT_KV: f64 = 2.0;
const WEIGHT_PREFIX: f64 = 3.0;

/// One server's guessed cache: block hash → last use, and the reverse.
#[derive(Default)]
struct Lru {
    stamp_of: HashMap<SequenceHash, u64>,
    by_stamp: BTreeMap<u64, SequenceHash>,
}

impl Lru {
    fn touch(&mut self, hash: SequenceHash, stamp: u64) {
        if let Some(old) = self.stamp_of.insert(hash, stamp) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(stamp, hash);
        while self.stamp_of.len() > LRU_CAPACITY {
            let Some((_, oldest)) = self.by_stamp.pop_first() else { break };
            self.stamp_of.remove(&oldest);
        }
    }

    fn matched(&self, hashes: &[SequenceHash]) -> usize {
        hashes.iter().take_while(|h| self.stamp_of.contains_key(h)).count()
    }
}

pub struct ApproxPrefix {
    block_size: u32,
    indexes: Vec<Lru>,
    stamp: u64,
    /// (waiting, KV usage) per server, as last scraped.
    metrics: Vec<(usize, f64)>,
    scraped_at: Option<u64>,
    rng: fastrand::Rng,
}

impl ApproxPrefix {
    pub fn new(engines: usize, block_size: u32, seed: u64) -> Self {
        ApproxPrefix {
            block_size,
            indexes: (0..engines).map(|_| Lru::default()).collect(),
            stamp: 0,
            metrics: vec![(0, 0.0); engines],
            scraped_at: None,
            rng: fastrand::Rng::with_seed(seed),
        }
    }
}

impl Policy for ApproxPrefix {
    fn route(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        if self.scraped_at.is_none_or(|at| arrival.now_ns >= at + SCRAPE_INTERVAL_NS) {
            self.metrics = (0..fleet.len()).map(|k| (fleet.waiting(k), fleet.kv_usage(k))).collect();
            self.scraped_at = Some(arrival.now_ns);
        }
        let bs = self.block_size as usize;
        let hashed = &arrival.tokens[..(arrival.tokens.len() / bs).min(MAX_PREFIX_BLOCKS) * bs];
        let hashes = sequence_hashes(hashed, self.block_size, HashSeed::default());
        let (min_q, max_q) = self.metrics.iter().fold((usize::MAX, 0), |(lo, hi), &(q, _)| (lo.min(q), hi.max(q)));
        let scores = self.metrics.iter().zip(&self.indexes).map(|(&(q, usage), index)| {
            let queue = if max_q == min_q { 1.0 } else { (max_q - q) as f64 / (max_q - min_q) as f64 };
            let prefix = if hashes.is_empty() { 0.0 } else { index.matched(&hashes) as f64 / hashes.len() as f64 };
            // Negated: the helper picks the smallest.
            -(WEIGHT_QUEUE * queue + WEIGHT_KV * (1.0 - usage) + WEIGHT_PREFIX * prefix)
        });
        let k = super::baselines::argmin_random(scores, &mut self.rng);
        for hash in hashes {
            self.stamp += 1;
            self.indexes[k].touch(hash, self.stamp);
        }
        k
    }
}
