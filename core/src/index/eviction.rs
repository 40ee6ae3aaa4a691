//! The order in which a shard's index gives up blocks when it is over its
//! memory budget: leaves first, the longest-stored first.
//!
//! Why this order. Engines evict least-recently-used free blocks, and they
//! do not report a prefix hit, so a block kvpick stored long ago and never
//! saw again is the one most likely gone from the engine already (its
//! removal lost, or the worker's cache larger than the budget). Taking
//! leaves only keeps every worker's held blocks closed under "parent of":
//! the jump search stays exact, and a shared system prompt (a block with
//! held children) outlives every conversation hanging off it.
//!
//! Each held block carries the stamp of its newest queue entry; an entry
//! whose stamp no longer matches (the block was removed, re-stored or
//! re-queued) is skipped when popped. A block that becomes a leaf again is
//! queued at the front: its child was just evicted or removed by the
//! engine, so its chain is the coldest, and eviction walks it tail to root
//! before moving on.

use std::collections::VecDeque;

use crate::event::EngineBlockHash;
use crate::slot_set::Slot;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Queued {
    pub slot: Slot,
    pub stamp: u32,
    pub engine: EngineBlockHash,
}

#[derive(Debug, Default)]
pub(super) struct EvictionQueue {
    queue: VecDeque<Queued>,
    next_stamp: u32,
}

impl EvictionQueue {
    fn stamp(&mut self) -> u32 {
        self.next_stamp = self.next_stamp.wrapping_add(1);
        self.next_stamp
    }

    /// Queues a newly stored block behind every other; returns its stamp.
    pub fn push_back(&mut self, slot: Slot, engine: EngineBlockHash) -> u32 {
        let stamp = self.stamp();
        self.queue.push_back(Queued { slot, stamp, engine });
        stamp
    }

    /// Queues a block that just became a leaf ahead of every other.
    pub fn push_front(&mut self, slot: Slot, engine: EngineBlockHash) -> u32 {
        let stamp = self.stamp();
        self.queue.push_front(Queued { slot, stamp, engine });
        stamp
    }

    pub fn pop(&mut self) -> Option<Queued> {
        self.queue.pop_front()
    }

    /// Front (evicted first) to back.
    pub fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.queue.iter()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Drops the entries `keep` refuses. Without pressure nothing is
    /// popped, so stale entries would pile up: the index calls this once
    /// they outnumber the live ones, which keeps the cost amortised O(1).
    pub fn retain(&mut self, keep: impl FnMut(&Queued) -> bool) {
        self.queue.retain(keep);
        self.queue.shrink_to(self.queue.len() * 2);
    }

    pub fn capacity_bytes(&self) -> usize {
        self.queue.capacity() * std::mem::size_of::<Queued>()
    }
}
