//! Suspects a worker whose cache kvpick's hashes never match: the chat
//! template, tokenizer, LoRA or `cache_salt` seed kvpick hashes with is not
//! the engine's, or the worker's KV events never reach kvpick. Either way
//! KV-aware routing is blind for it while events may still flow, the most
//! common silent failure of KV routing besides a block-size mismatch
//! (which the shards detect from the events themselves).
//!
//! The sign: a prompt whose first block the worker was picked for before
//! comes back to it, and the index does not show that block there (the
//! pick saw no overlap on it). A worker that served a prefix holds its
//! first block unless it was evicted since, so a healthy worker answers
//! most such repeats with a hit; after [`MIN_REPEATS`] repeats without one
//! the worker is suspected, and the first hit clears it. Workloads that
//! never repeat a first block (no shared template or system prompt) make
//! no repeats and so no verdict.

use ahash::AHashMap;
use kvpick_core::{SequenceHash, WorkerId};

/// Repeats without a single hit before a worker is suspected.
pub const MIN_REPEATS: u64 = 20;
/// First blocks remembered per worker (the prefixes it was picked for
/// last).
const RECENT: usize = 32;

/// A worker's verdict changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `repeats` picks of a first block the worker served before, none of
    /// which found it in the index.
    Suspected { repeats: u64 },
    /// A repeat found its first block: the worker's cache matches.
    Cleared,
}

#[derive(Debug, Default)]
struct Watch {
    recent: Vec<SequenceHash>,
    next: usize,
    /// Repeats since the last hit (or the last verdict).
    repeats_without_hit: u64,
    suspected: bool,
}

/// Every worker's watch.
#[derive(Debug, Default)]
pub struct PrefixWatch {
    workers: AHashMap<WorkerId, Watch>,
}

impl PrefixWatch {
    /// A pick of `worker` for a prompt whose first block is `first`,
    /// which found `overlap_blocks` of the prompt on it.
    pub fn observe(&mut self, worker: WorkerId, first: SequenceHash, overlap_blocks: u32) -> Option<Verdict> {
        let watch = self.workers.entry(worker).or_default();
        if !watch.recent.contains(&first) {
            if watch.recent.len() < RECENT {
                watch.recent.push(first);
            } else {
                watch.recent[watch.next] = first;
                watch.next = (watch.next + 1) % RECENT;
            }
            return None;
        }
        if overlap_blocks > 0 {
            watch.repeats_without_hit = 0;
            return std::mem::replace(&mut watch.suspected, false).then_some(Verdict::Cleared);
        }
        watch.repeats_without_hit += 1;
        (!watch.suspected && watch.repeats_without_hit >= MIN_REPEATS).then(|| {
            watch.suspected = true;
            Verdict::Suspected { repeats: watch.repeats_without_hit }
        })
    }

    /// The worker left: forget it.
    pub fn remove(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
    }

    /// Workers suspected now.
    pub fn suspected(&self) -> usize {
        self.workers.values().filter(|w| w.suspected).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: WorkerId = WorkerId(1);

    #[test]
    fn repeats_without_a_hit_suspect_the_worker_and_a_hit_clears_it() {
        let mut watch = PrefixWatch::default();
        let first = SequenceHash(7);
        assert_eq!(watch.observe(W, first, 0), None, "first time: nothing to expect yet");
        for _ in 1..MIN_REPEATS {
            assert_eq!(watch.observe(W, first, 0), None);
        }
        assert_eq!(watch.observe(W, first, 0), Some(Verdict::Suspected { repeats: MIN_REPEATS }));
        assert_eq!(watch.suspected(), 1);
        assert_eq!(watch.observe(W, first, 0), None, "said once");
        assert_eq!(watch.observe(W, first, 3), Some(Verdict::Cleared));
        assert_eq!(watch.suspected(), 0);
    }

    #[test]
    fn a_healthy_worker_and_a_workload_without_repeats_give_no_verdict() {
        let mut watch = PrefixWatch::default();
        // Every repeat hits, bar the odd eviction.
        for i in 0..500u64 {
            let overlap = if i % 10 == 9 { 0 } else { 2 };
            assert_eq!(watch.observe(W, SequenceHash(1), overlap), None);
        }
        // Never the same first block twice: no repeats, no verdict.
        for i in 0..500u64 {
            assert_eq!(watch.observe(WorkerId(2), SequenceHash(100 + i), 0), None);
        }
        assert_eq!(watch.suspected(), 0);
    }

    #[test]
    fn the_recent_set_is_bounded_and_a_removed_worker_is_forgotten() {
        let mut watch = PrefixWatch::default();
        for i in 0..(RECENT as u64 * 4) {
            watch.observe(W, SequenceHash(i), 0);
        }
        assert_eq!(watch.workers[&W].recent.len(), RECENT);
        // The oldest are gone: seeing one again is not a repeat.
        assert_eq!(watch.observe(W, SequenceHash(0), 0), None);
        assert_eq!(watch.workers[&W].repeats_without_hit, 0);
        watch.remove(W);
        assert!(watch.workers.is_empty());
    }
}
