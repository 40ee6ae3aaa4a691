//! The demo's stand-in for the GAIE default picker (the reference EPP's
//! approximate prefix scorer): a guess of each engine's cache from what
//! was sent there, next to a queue scorer, weights as GAIE's defaults.
//!
//! GAIE hashes the prompt's characters in blocks (4 characters a token,
//! 16 tokens a block: 64 bytes), chained, at most 256 blocks, and keeps an
//! LRU of 31,250 block hashes per server, updated with the chosen server.
//! Score = 3 × matched/hashed blocks + 2 × queue, queue =
//! `(max − q)/(max − min)` over requests in flight (1 if all equal), the
//! highest wins, ties to the first. The KV-utilization scorer (weight 2)
//! is left out: the demo's engines never fill their caches' capacity
//! enough for it to tell them apart.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

const BLOCK_BYTES: usize = 64;
const MAX_BLOCKS: usize = 256;
const LRU_CAPACITY: usize = 31_250;
const WEIGHT_PREFIX: f64 = 3.0;
const WEIGHT_QUEUE: f64 = 2.0;

#[derive(Default)]
struct Lru {
    stamp_of: HashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
}

impl Lru {
    fn touch(&mut self, hash: u64, stamp: u64) {
        if let Some(old) = self.stamp_of.insert(hash, stamp) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(stamp, hash);
        while self.stamp_of.len() > LRU_CAPACITY {
            let Some((_, oldest)) = self.by_stamp.pop_first() else { break };
            self.stamp_of.remove(&oldest);
        }
    }

    fn matched(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.stamp_of.contains_key(h)).count()
    }
}

#[derive(Default)]
struct State {
    lrus: Vec<Lru>,
    in_flight: Vec<u32>,
    stamp: u64,
}

pub struct ApproxPrefix {
    state: Mutex<State>,
}

/// Counts a request in flight on its engine until dropped.
pub struct InFlight<'a> {
    picker: &'a ApproxPrefix,
    engine: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut state = self.picker.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.in_flight[self.engine] = state.in_flight[self.engine].saturating_sub(1);
    }
}

/// Chained hashes of the body's full 64-byte blocks, at most 256.
fn block_hashes(body: &[u8]) -> Vec<u64> {
    let mut parent = 0u64;
    body.chunks_exact(BLOCK_BYTES)
        .take(MAX_BLOCKS)
        .map(|block| {
            // SipHash with fixed keys: the same bytes, the same hash.
            let mut h = std::hash::DefaultHasher::new();
            (parent, block).hash(&mut h);
            parent = h.finish();
            parent
        })
        .collect()
}

impl ApproxPrefix {
    pub fn new(engines: usize) -> Self {
        let state =
            State { lrus: (0..engines).map(|_| Lru::default()).collect(), in_flight: vec![0; engines], stamp: 0 };
        ApproxPrefix { state: Mutex::new(state) }
    }

    /// The engine for a request body, counted in flight until the guard drops.
    pub fn pick(&self, body: &[u8]) -> InFlight<'_> {
        let hashes = block_hashes(body);
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (min, max) = state.in_flight.iter().fold((u32::MAX, 0), |(lo, hi), &n| (lo.min(n), hi.max(n)));
        let score = |k: usize, state: &State| {
            let q = state.in_flight[k];
            let queue = if max == min { 1.0 } else { f64::from(max - q) / f64::from(max - min) };
            let prefix =
                if hashes.is_empty() { 0.0 } else { state.lrus[k].matched(&hashes) as f64 / hashes.len() as f64 };
            WEIGHT_PREFIX * prefix + WEIGHT_QUEUE * queue
        };
        let mut engine = 0;
        for k in 1..state.lrus.len() {
            if score(k, &state) > score(engine, &state) {
                engine = k;
            }
        }
        for hash in hashes {
            state.stamp += 1;
            let stamp = state.stamp;
            state.lrus[engine].touch(hash, stamp);
        }
        state.in_flight[engine] += 1;
        InFlight { picker: self, engine }
    }
}

impl InFlight<'_> {
    pub fn engine(&self) -> usize {
        self.engine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_longer_history_follows_its_prefix_and_new_prompts_spread_by_queue() {
        let picker = ApproxPrefix::new(3);
        let first = vec![b'a'; 640];
        let held = picker.pick(&first);
        let home = held.engine();
        // A new prompt goes where nothing is in flight.
        let other = picker.pick(&[b'z'; 640]);
        assert_ne!(other.engine(), home);
        drop((held, other));
        // The next turn (the same history, longer) goes home.
        let mut next = first.clone();
        next.extend_from_slice(&[b'b'; 256]);
        assert_eq!(picker.pick(&next).engine(), home);
    }
}
