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
pub struct Lru {
    capacity: usize,
    stamp_of: HashMap<SequenceHash, u64>,
    by_stamp: BTreeMap<u64, SequenceHash>,
}

impl Lru {
    pub fn new(capacity: usize) -> Self {
        Lru { capacity, stamp_of: HashMap::new(), by_stamp: BTreeMap::new() }
    }

    pub fn touch(&mut self, hash: SequenceHash, stamp: u64) {
        if let Some(old) = self.stamp_of.insert(hash, stamp) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(stamp, hash);
        while self.stamp_of.len() > self.capacity {
            let Some((_, oldest)) = self.by_stamp.pop_first() else { break };
            self.stamp_of.remove(&oldest);
        }
    }

    pub fn matched(&self, hashes: &[SequenceHash]) -> usize {
        hashes.iter().take_while(|h| self.stamp_of.contains_key(h)).count()
    }

    pub fn len(&self) -> usize {
        self.stamp_of.len()
    }
}

/// Engine metrics as a scraper sees them: (waiting, KV usage) per engine,
/// refreshed every 50 ms of virtual time.
#[derive(Default)]
pub struct Scraper {
    metrics: Vec<(usize, f64)>,
    scraped_at: Option<u64>,
}

impl Scraper {
    pub fn metrics(&mut self, fleet: &FleetView<'_>, now_ns: u64) -> &[(usize, f64)] {
        if self.scraped_at.is_none_or(|at| now_ns >= at + SCRAPE_INTERVAL_NS) {
            self.metrics = (0..fleet.len()).map(|k| (fleet.waiting(k), fleet.kv_usage(k))).collect();
            self.scraped_at = Some(now_ns);
        }
        &self.metrics
    }
}

/// GAIE's weighted sum for one engine: `2 × queue + 2 × (1 − KV usage) +
/// 3 × prefix`, with queue = `(max − q)/(max − min)` over `metrics` (1 if
/// all equal). Shared by the approximate and the precise prefix profiles.
pub fn gaie_score(metrics: &[(usize, f64)], k: usize, prefix: f64) -> f64 {
    let (min_q, max_q) = metrics.iter().fold((usize::MAX, 0), |(lo, hi), &(q, _)| (lo.min(q), hi.max(q)));
    let (q, usage) = metrics[k];
    let queue = if max_q == min_q { 1.0 } else { (max_q - q) as f64 / (max_q - min_q) as f64 };
    WEIGHT_QUEUE * queue + WEIGHT_KV * (1.0 - usage) + WEIGHT_PREFIX * prefix
}

pub struct ApproxPrefix {
    block_size: u32,
    indexes: Vec<Lru>,
    stamp: u64,
    scraper: Scraper,
    rng: fastrand::Rng,
}

impl ApproxPrefix {
    pub fn new(engines: usize, block_size: u32, seed: u64) -> Self {
        ApproxPrefix {
            block_size,
            indexes: (0..engines).map(|_| Lru::new(LRU_CAPACITY)).collect(),
            stamp: 0,
            scraper: Scraper::default(),
            rng: fastrand::Rng::with_seed(seed),
        }
    }
}

impl Policy for ApproxPrefix {
    fn route(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        let metrics = self.scraper.metrics(fleet, arrival.now_ns);
        let bs = self.block_size as usize;
        let hashed = &arrival.tokens[..(arrival.tokens.len() / bs).min(MAX_PREFIX_BLOCKS) * bs];
        let hashes = sequence_hashes(hashed, self.block_size, HashSeed::default());
        let scores = self.indexes.iter().enumerate().map(|(k, index)| {
            let prefix = if hashes.is_empty() { 0.0 } else { index.matched(&hashes) as f64 / hashes.len() as f64 };
            // Negated: the helper picks the smallest.
            -gaie_score(metrics, k, prefix)
        });
        let k = super::baselines::argmin_random(scores, &mut self.rng);
        for hash in hashes {
            self.stamp += 1;
            self.indexes[k].touch(hash, self.stamp);
        }
        k
    }
}
