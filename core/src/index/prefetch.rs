//! Prefetching what a window of events will touch before applying them.
//!
//! A one-block store misses the worker's table and then the holder table,
//! and nothing else is in flight; prefetching the next events' buckets
//! first (true prefetches, which retire at once) overlaps those misses.

use super::KvIndex;
use crate::event::{EngineBlockHash, KvEvent};
use crate::hashing::{HashSeed, SequenceHash, chain, local_block_hash};
use crate::slot_set::Slot;

/// A removal of this many blocks overlaps its own holder misses (`remove`
/// prefetches them all before it changes anything); reading its worker
/// table here too only costs: 9% of the rate with 16-block removals, where
/// one-block removals gained 47-65% (perf/results/2026-12-05-event-prefetch.md;
/// sizes between were not measured apart).
const LONG_REMOVAL: usize = 8;

/// The last block a stored event of the window chained: the next event of
/// the same chain hashes from it, though it is not stored yet.
#[derive(Clone, Copy)]
struct ChainEnd {
    slot: Slot,
    engine: EngineBlockHash,
    seq: SequenceHash,
    seed: HashSeed,
}

impl KvIndex {
    /// Prefetches what applying `events` in this order will read, changing
    /// nothing. An event `store` or `remove` would refuse costs at most a
    /// wasted prefetch.
    pub fn prefetch(&self, events: &[(Slot, &KvEvent)]) {
        // First the worker-table buckets: the blocks, and the parents whose
        // sequence hashes the second pass reads.
        for &(slot, event) in events {
            let Some(worker) = self.worker(slot) else { continue };
            match event {
                KvEvent::Stored { block_hashes, parent, .. } => {
                    if let Some(parent) = parent {
                        worker.blocks.prefetch_run(*parent);
                    }
                    for &engine in block_hashes {
                        worker.blocks.prefetch_run(engine);
                    }
                }
                KvEvent::Removed { block_hashes } => {
                    for &engine in block_hashes {
                        worker.blocks.prefetch_run(engine);
                    }
                }
                KvEvent::Cleared => {}
            }
        }
        // Then the holder-table buckets of the blocks' sequence hashes.
        self.holder_keys(events, |seq| self.holders.prefetch_run(seq));
    }

    /// The sequence hashes whose holder buckets applying `events` in this
    /// order reads: a stored chain's (hashed from its held parent, or from
    /// the end of the window's last stored event when it continues that
    /// event's chain: not stored yet) and a short removal's (from the
    /// worker's table). A chain continued past another chain's event is
    /// not followed; it only goes without prefetches.
    pub(super) fn holder_keys(&self, events: &[(Slot, &KvEvent)], mut key: impl FnMut(SequenceHash)) {
        let mut end: Option<ChainEnd> = None;
        for &(slot, event) in events {
            let Some(worker) = self.worker(slot) else { continue };
            match event {
                KvEvent::Stored { block_hashes, parent, token_ids, block_size, seed } => {
                    if *block_size == 0 || token_ids.len() != block_hashes.len() * *block_size as usize {
                        continue;
                    }
                    let (mut seq, seed) = match (*parent, end) {
                        (None, _) => (None, *seed),
                        (Some(parent), Some(end)) if end.slot == slot && end.engine == parent => {
                            (Some(end.seq), end.seed)
                        }
                        (Some(parent), _) => match worker.blocks.get(&parent) {
                            Some(held) => (Some(held.seq()), worker.seeds.get(&parent).copied().unwrap_or_default()),
                            None => continue,
                        },
                    };
                    for tokens in token_ids.chunks_exact(*block_size as usize) {
                        let hashed = chain(seq, local_block_hash(tokens, seed));
                        key(hashed);
                        seq = Some(hashed);
                    }
                    end = block_hashes.last().zip(seq).map(|(&engine, seq)| ChainEnd { slot, engine, seq, seed });
                }
                KvEvent::Removed { block_hashes } if block_hashes.len() < LONG_REMOVAL => {
                    for engine in block_hashes {
                        if let Some(held) = worker.blocks.get(engine) {
                            key(held.seq());
                        }
                    }
                }
                KvEvent::Removed { .. } | KvEvent::Cleared => {}
            }
        }
    }
}
