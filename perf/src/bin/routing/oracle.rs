//! Two references kvpick is measured against.
//!
//! - [`Oracle`], a policy with perfect information: Dynamo's cost formula
//!   (`kvpick-dynamo`'s) on the same bookings, but with every engine's
//!   *true* cached prefix read from its cache at the instant of arrival (no
//!   event delay, nothing to learn or miss). The gap to `kvpick-dynamo` is
//!   what that cost loses by knowing caches only from events; it is not an optimal schedule (none
//!   is computable for an online stream), so kvpick can beat it by luck.
//! - [`hit_rate_bound`], an upper bound on the prefix hit rate of *any*
//!   policy on these engines: every request hits the longest prefix it
//!   shares with any earlier request, as on one engine with an infinite
//!   cache and no load limit. Each engine admits in arrival order and hits
//!   only blocks computed before, so no routing can do better.

use std::collections::{HashMap, HashSet};

use kvpick_core::hashing::{HashSeed, SequenceHash, sequence_hashes};

use super::baselines::argmin_random;
use super::fleet::{Arrival, FleetView, Policy};
use super::workload::Request;

pub struct Oracle {
    block_size: u32,
    /// Uncached prompt tokens routed to each engine and not yet prefilled.
    pending_prefill: Vec<u64>,
    /// Prompt blocks of each engine's requests in flight (refcounted by
    /// sequence hash, as kvpick books them) and their unhashed blocks.
    active: Vec<HashMap<SequenceHash, u32>>,
    unhashed: Vec<u64>,
    booked: Vec<Option<Booked>>,
    prefill_load_scale: f64,
    rng: fastrand::Rng,
}

#[derive(Clone)]
struct Booked {
    engine: usize,
    /// Uncached prompt tokens until the first token, then 0.
    prefill: u64,
    hashes: Vec<SequenceHash>,
    unhashed: u64,
}

impl Oracle {
    pub fn new(engines: usize, requests: usize, block_size: u32, prefill_load_scale: f64, seed: u64) -> Self {
        Oracle {
            block_size,
            pending_prefill: vec![0; engines],
            active: vec![HashMap::new(); engines],
            unhashed: vec![0; engines],
            booked: vec![None; requests],
            prefill_load_scale,
            rng: fastrand::Rng::with_seed(seed),
        }
    }
}

impl Policy for Oracle {
    fn route(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        let bs = f64::from(self.block_size);
        let isl = arrival.tokens.len() as f64;
        let hashes = sequence_hashes(arrival.tokens, self.block_size, HashSeed::default());
        let unhashed = arrival.tokens.len().div_ceil(self.block_size as usize) - hashes.len();
        let overlaps: Vec<f64> =
            (0..fleet.len()).map(|k| fleet.cached_prefix_blocks(k, arrival.tokens) as f64).collect();
        // kvpick's cost (core/src/cost.rs) on the same bookings, but with
        // the true cached prefix in place of the one learned from events.
        let costs = (0..fleet.len()).map(|k| {
            let active = &self.active[k];
            let prefill = ((self.pending_prefill[k] as f64 + isl) / bs - overlaps[k]).max(0.0);
            let already = hashes.partition_point(|h| active.contains_key(h));
            let decode = (active.len() as u64 + self.unhashed[k]) as f64 + (hashes.len() - already + unhashed) as f64;
            self.prefill_load_scale * prefill + decode
        });
        let k = argmin_random(costs, &mut self.rng);
        let prefill = (isl - overlaps[k] * bs).max(0.0) as u64;
        self.pending_prefill[k] += prefill;
        for h in &hashes {
            *self.active[k].entry(*h).or_default() += 1;
        }
        self.unhashed[k] += unhashed as u64;
        self.booked[arrival.id] = Some(Booked { engine: k, prefill, hashes, unhashed: unhashed as u64 });
        k
    }

    fn on_first_token(&mut self, id: usize, _: u64) {
        if let Some(b) = self.booked[id].as_mut() {
            self.pending_prefill[b.engine] -= std::mem::take(&mut b.prefill);
        }
    }

    fn on_finished(&mut self, id: usize, now_ns: u64) {
        self.on_first_token(id, now_ns);
        let Some(b) = self.booked[id].take() else { return };
        let active = &mut self.active[b.engine];
        for h in &b.hashes {
            if let Some(n) = active.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    active.remove(h);
                }
            }
        }
        self.unhashed[b.engine] -= b.unhashed;
    }
}

/// Prompt tokens any policy could at best serve from cache, over all
/// prompt tokens (see the module docs).
pub fn hit_rate_bound(requests: &[Request], block_size: u32) -> f64 {
    let bs = block_size as usize;
    let mut seen = HashSet::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for request in requests {
        let tokens = request.tokens.materialise();
        let hashes = sequence_hashes(&tokens, block_size, HashSeed::default());
        let cap = tokens.len().saturating_sub(1) / bs;
        let shared = hashes.iter().take(cap).take_while(|h| seen.contains(*h)).count();
        hit += (shared * bs) as u64;
        total += tokens.len() as u64;
        seen.extend(hashes);
    }
    hit as f64 / total.max(1) as f64
}
