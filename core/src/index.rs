//! A shard's KV-block index: which of its workers hold which prefixes.
//!
//! A sequence hash names a whole prefix, so the "radix tree" is a flat map
//! `sequence hash → slots holding it` plus, per worker, the engine's own
//! block hashes mapped to ours (removals arrive as engine hashes).
//!
//! Lookups jump instead of walking. For a worker whose held blocks are
//! closed under "parent of" (every held block's parent is held too),
//! holding block `i` of a prompt implies holding blocks `0..i`, so its
//! overlap is found by probing every `JUMP`-th block and bisecting where a
//! worker drops out: about `n / JUMP + log2(JUMP)` probes instead of `n`,
//! issued in rounds so their cache misses overlap (see `search`).
//! A worker whose engine evicted a block while keeping a child ("holes")
//! is tracked exactly (count of orphaned blocks) and scanned block by block
//! until the hole is gone, so results never depend on the shortcut.
//!
//! A memory budget caps the shard's (block, worker) entries: past it, the
//! index evicts leaves, the longest-stored first (see `eviction`). An
//! evicted block stops matching, and so do blocks the engine stores after
//! it (their parent is unknown): they could not have matched past it
//! anyway, since only a prefix held from its first block matches.

use std::collections::HashMap;

use rustc_hash::FxBuildHasher;

use crate::event::{EngineBlockHash, KvEvent};
use crate::hashing::{HashSeed, SequenceHash, chain, local_block_hash};
use crate::slot_set::{Slot, SlotSet};

mod eviction;
mod holders;
mod placed;
mod prefetch;
mod search;
mod slab;
mod snapshot;
mod worker_table;

use eviction::EvictionQueue;
use holders::Holders;
pub use snapshot::{BlockRecord, ImportError, OrphanRecord, WorkerExport};
use worker_table::{StoredBlock, WorkerTable};

/// Probe distance of the jump search. 32 keeps a 512-block prompt at 16
/// probes plus 5 per drop-out group (perf/ measures 16, 32 and 64).
pub const JUMP: usize = 32;

/// Bytes one (block, worker) entry costs, for turning a memory budget into
/// an entry cap: resident memory per held entry under eviction churn (the
/// tables, the eviction queue, allocator slack), 120-159 bytes at 100,000
/// to 4,000,000 entries on 2026-12-07, with a fifth for margin
/// (perf/README.md, "Index memory budget").
pub const ENTRY_BYTES: u64 = 192;

/// Bytes a worker may cost its shard's index beyond its entries, at most:
/// a worker holding a few blocks keeps a whole slab chunk of records
/// (256 of them, 7 KiB; beyond one chunk it keeps at most four times what
/// it holds, and nothing once empty, see `worker_table`), an id table and
/// a free list sized for that chunk (3.5 KiB), and the allocator's
/// rounding. Left out of the budget, 256 workers on a budget of 4.8 MB
/// took 1.35 times it; counted, RSS growth stays at most 0.73 of the
/// budget at 64 to 1,024 workers (perf/README.md, "Index memory budget").
pub const WORKER_BYTES: u64 = 12 << 10;

/// A shard's share of a memory budget of `max_bytes` shared by `shards`
/// shards.
pub fn max_bytes_per_shard(max_bytes: Option<u64>, shards: usize) -> Option<u64> {
    max_bytes.map(|bytes| bytes / shards.max(1) as u64)
}

/// The entries a budget of `max_bytes` leaves room for beside `workers`
/// workers' fixed costs; at least one.
fn entries_within(max_bytes: u64, workers: u64) -> u64 {
    (max_bytes.saturating_sub(workers.saturating_mul(WORKER_BYTES)) / ENTRY_BYTES).max(1)
}

// Keys are engine or xxh3 hashes, uniformly distributed already: a
// one-multiply hasher (FxHash) is enough and cheaper than SipHash or aHash.
type U64Map<K, V> = HashMap<K, V, FxBuildHasher>;

#[derive(Default, Debug)]
struct WorkerBlocks {
    blocks: WorkerTable,
    /// Extra engine blocks mapping to an already-held sequence hash (the
    /// engine hashed something we do not, e.g. a salt); usually empty.
    dup_refs: U64Map<SequenceHash, u32>,
    /// Seeds of held blocks hashed with a seed other than the default (a
    /// LoRA adapter or a cache salt); usually empty.
    seeds: U64Map<EngineBlockHash, HashSeed>,
    /// Held blocks whose parent is not held.
    orphans: u64,
    /// An engine hash came back with different content: the parent-closure
    /// shortcut cannot be trusted until the worker's cache is cleared.
    tainted: bool,
}

impl WorkerBlocks {
    fn needs_scan(&self) -> bool {
        self.orphans > 0 || self.tainted
    }
}

/// Why an event was not applied (the index is left as it was).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("worker is not known to this shard")]
    UnknownWorker,
    #[error("parent block {0:#x} is not held by this worker; event skipped")]
    UnknownParent(EngineBlockHash),
    #[error("{tokens} tokens do not fill {blocks} blocks of {block_size}")]
    TokenCountMismatch { blocks: usize, tokens: usize, block_size: u32 },
    #[error("event block size {event} differs from the worker's {worker}")]
    BlockSizeMismatch { event: u32, worker: u32 },
}

/// What applying one event changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub stored: u64,
    pub removed: u64,
    /// Removals of blocks the worker did not hold (already evicted, or
    /// stored by an event we skipped).
    pub unknown_removed: u64,
    /// Entries given up to stay within the memory budget, of any worker
    /// of the shard (the engine still holds them; kvpick forgets them).
    pub evicted: u64,
}

#[derive(Default, Debug)]
pub struct KvIndex {
    holders: Holders,
    workers: Vec<Option<WorkerBlocks>>,
    /// Slots whose blocks must be scanned one by one (see module docs).
    needs_scan: SlotSet,
    entries: u64,
    /// The most entries the index keeps; `None`: no budget.
    max_entries: Option<u64>,
    /// A budget given in bytes: `max_entries` is what it leaves beside the
    /// workers' fixed costs, and follows them as workers come and go.
    max_bytes: Option<u64>,
    eviction: EvictionQueue,
    /// Evicted (slot, engine hash) pairs, when asked to keep them.
    evicted_log: Option<Vec<(Slot, EngineBlockHash)>>,
    /// A stored chain's sequence hashes, hashed before it is applied (see
    /// `store`); kept so storing does not allocate.
    chain_scratch: Vec<SequenceHash>,
}

impl KvIndex {
    /// An index that keeps at most `max_entries` (block, worker) entries.
    pub fn with_max_entries(max_entries: Option<u64>) -> Self {
        KvIndex { max_entries, ..KvIndex::default() }
    }

    /// An index that keeps within `max_bytes` of memory: its entries, at
    /// `ENTRY_BYTES` each, and its workers, at `WORKER_BYTES` each.
    pub fn with_max_bytes(max_bytes: Option<u64>) -> Self {
        KvIndex { max_entries: max_bytes.map(|bytes| entries_within(bytes, 0)), max_bytes, ..KvIndex::default() }
    }

    /// The most entries the index keeps now; `None`: no budget.
    pub fn max_entries(&self) -> Option<u64> {
        self.max_entries
    }

    /// Keeps every eviction from now on for [`KvIndex::take_evicted`]:
    /// tests mirror them into a reference index.
    pub fn record_evictions(&mut self) {
        self.evicted_log.get_or_insert_with(Vec::new);
    }

    pub fn take_evicted(&mut self) -> Vec<(Slot, EngineBlockHash)> {
        self.evicted_log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Adds a worker with nothing held (a known one is left as it is).
    /// Returns the entries evicted to make room for its fixed cost, under
    /// a budget in bytes.
    pub fn add_worker(&mut self, slot: Slot) -> u64 {
        let slot = slot as usize;
        if self.workers.len() <= slot {
            self.workers.resize_with(slot + 1, || None);
        }
        self.workers[slot].get_or_insert_with(WorkerBlocks::default);
        self.holders.fit(self.workers.len());
        self.fit_budget_to_workers()
    }

    pub fn remove_worker(&mut self, slot: Slot) {
        self.clear(slot);
        if let Some(entry) = self.workers.get_mut(slot as usize) {
            *entry = None;
        }
        self.fit_budget_to_workers();
    }

    /// Sets the entry cap a budget in bytes leaves beside the workers, and
    /// evicts down to it; returns how many went. (Counting the workers
    /// walks the slots: workers come and go rarely.)
    fn fit_budget_to_workers(&mut self) -> u64 {
        let Some(bytes) = self.max_bytes else { return 0 };
        let workers = self.workers.iter().flatten().count() as u64;
        self.max_entries = Some(entries_within(bytes, workers));
        self.enforce_budget()
    }

    /// (block, worker) pairs held.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Distinct prefixes held by any worker of the shard.
    pub fn distinct_blocks(&self) -> usize {
        self.holders.len()
    }

    pub fn holds(&self, slot: Slot, seq: SequenceHash) -> bool {
        self.holders.contains(seq, slot)
    }

    /// Blocks held by one worker.
    pub fn worker_blocks(&self, slot: Slot) -> usize {
        self.worker(slot).map_or(0, |w| w.blocks.len())
    }

    fn worker(&self, slot: Slot) -> Option<&WorkerBlocks> {
        self.workers.get(slot as usize).and_then(Option::as_ref)
    }

    pub fn store(
        &mut self,
        slot: Slot,
        parent: Option<EngineBlockHash>,
        block_hashes: &[EngineBlockHash],
        token_ids: &[u32],
        block_size: u32,
        seed: HashSeed,
    ) -> Result<Applied, EventError> {
        let Some(Some(worker)) = self.workers.get_mut(slot as usize) else {
            return Err(EventError::UnknownWorker);
        };
        if block_size == 0 || token_ids.len() != block_hashes.len() * block_size as usize {
            return Err(EventError::TokenCountMismatch {
                blocks: block_hashes.len(),
                tokens: token_ids.len(),
                block_size,
            });
        }
        let mut parent_id = None;
        let mut parent_seq = match parent {
            None => None,
            Some(hash) => match worker.blocks.held_id(hash) {
                Some(id) => {
                    parent_id = Some(id);
                    Some(worker.blocks.at(id).seq())
                }
                None => return Err(EventError::UnknownParent(hash)),
            },
        };
        // A continuation is hashed with its chain's seed, not the event's:
        // vLLM reports a cache salt only with a prompt's first block.
        let mut seed = match parent {
            None => seed,
            Some(hash) => worker.seeds.get(&hash).copied().unwrap_or_default(),
        };
        let mut applied = Applied::default();
        // Hash the whole chain first: the loop below then carries no hash
        // from block to block, so consecutive blocks' table misses (a
        // shard's holder table is tens of MB) overlap; most of the gain
        // (perf/results/2026-12-04-core-index-v2-steps.md). Looking every
        // block up before changing anything adds 5-9%; prefetching the
        // holder buckets instead of looking them up, more at 256 workers
        // (perf/results/2026-12-05-halves-and-event-window.md). The hashes
        // assume no block is held yet; the loop uses them while that holds
        // and hashes again from the first block it finds held under another
        // sequence hash or seed.
        let chunks = token_ids.chunks_exact(block_size as usize);
        let mut spec = std::mem::take(&mut self.chain_scratch);
        spec.clear();
        spec.extend(chunks.clone().scan(parent_seq, |parent, tokens| {
            *parent = Some(chain(*parent, local_block_hash(tokens, seed)));
            *parent
        }));
        for (&engine, &seq) in block_hashes.iter().zip(&spec) {
            worker.blocks.prefetch_run(engine);
            self.holders.prefetch_run(seq);
        }
        let spec_seed = seed;
        let mut on_spec = true;
        // One event never stores more than the whole budget: the tables
        // would grow past it before eviction could run. Nor more than the
        // worker's slab has ids for (`WorkerTable::is_full`). The chain's
        // head is kept (only a prefix can match); the rest counts as evicted.
        let most_new = self.max_entries.unwrap_or(u64::MAX);
        for (i, (&engine, tokens)) in block_hashes.iter().zip(chunks).enumerate() {
            // Over budget, a block not held is dropped. Full, only one with no
            // record: a gone record is revived in place and needs no new id.
            // (Most stores are neither, and look nothing up here.)
            let dropped_here = if applied.stored >= most_new {
                !worker.blocks.contains_key(&engine)
            } else {
                worker.blocks.is_full() && worker.blocks.find(engine).is_none()
            };
            if dropped_here {
                let mut dropped: Vec<EngineBlockHash> =
                    block_hashes[i..].iter().copied().filter(|hash| !worker.blocks.contains_key(hash)).collect();
                dropped.sort_unstable();
                dropped.dedup();
                applied.evicted += dropped.len() as u64;
                if let Some(log) = &mut self.evicted_log {
                    log.extend(dropped.into_iter().map(|hash| (slot, hash)));
                }
                break;
            }
            let record = worker.blocks.find(engine);
            if let Some(id) = record.filter(|&id| worker.blocks.at(id).is_held()) {
                // Already held: the chain continues from what we recorded, so
                // a child's parent sequence hash is always its parent's.
                let existing = worker.blocks.at(id);
                parent_seq = Some(existing.seq());
                parent_id = Some(id);
                seed = worker.seeds.get(&engine).copied().unwrap_or_default();
                on_spec &= existing.seq() == spec[i] && seed == spec_seed;
                continue;
            }
            let seq = if on_spec { spec[i] } else { chain(parent_seq, local_block_hash(tokens, seed)) };
            let stamp = if self.max_entries.is_some() { self.eviction.push_back(slot, engine) } else { 0 };
            let block = StoredBlock::new(engine, seq, parent_id, stamp);
            let id = match record {
                // Removed while children of it stayed held: it takes them
                // back, and its record (their parent id) with them.
                Some(gone) => {
                    let old = *worker.blocks.at(gone);
                    worker.orphans -= u64::from(old.children());
                    worker.tainted |= old.seq() != seq;
                    worker.blocks.revive(gone, block.with_children(old.children()));
                    gone
                }
                None => worker.blocks.insert_new(block),
            };
            if let Some(parent) = parent_id {
                worker.blocks.at_mut(parent).add_child();
            }
            if seed != HashSeed::default() {
                worker.seeds.insert(engine, seed);
            }
            if !self.holders.insert(seq, slot) {
                *worker.dup_refs.entry(seq).or_default() += 1;
            }
            applied.stored += 1;
            parent_seq = Some(seq);
            parent_id = Some(id);
        }
        self.chain_scratch = spec;
        self.entries += applied.stored;
        self.refresh_scan_flag(slot);
        applied.evicted += self.enforce_budget();
        Ok(applied)
    }

    /// Applies one event of the worker in `slot`. The caller checks the
    /// event's block size against the worker's (the index does not know it).
    pub fn apply(&mut self, slot: Slot, event: &KvEvent) -> Result<Applied, EventError> {
        match event {
            KvEvent::Stored { block_hashes, parent, token_ids, block_size, seed } => {
                self.store(slot, *parent, block_hashes, token_ids, *block_size, *seed)
            }
            KvEvent::Removed { block_hashes } => self.remove(slot, block_hashes),
            KvEvent::Cleared => Ok(self.clear(slot)),
        }
    }

    pub fn remove(&mut self, slot: Slot, block_hashes: &[EngineBlockHash]) -> Result<Applied, EventError> {
        let Some(Some(worker)) = self.workers.get(slot as usize) else {
            return Err(EventError::UnknownWorker);
        };
        if block_hashes.len() > 1 {
            // As in `store`: the lookups first, all of them independent, so
            // their cache misses overlap; the worker's table, then the
            // holder table at the sequence hashes it gave.
            for &engine in block_hashes {
                worker.blocks.prefetch_run(engine);
            }
            for engine in block_hashes {
                if let Some(block) = worker.blocks.get(engine) {
                    self.holders.prefetch_run(block.seq());
                }
            }
        }
        let mut applied = Applied::default();
        for &engine in block_hashes {
            if self.remove_block(slot, engine) {
                applied.removed += 1;
            } else {
                applied.unknown_removed += 1;
            }
        }
        self.refresh_scan_flag(slot);
        self.compact_queue();
        Ok(applied)
    }

    /// Forgets one block of one worker; false if it did not hold it.
    fn remove_block(&mut self, slot: Slot, engine: EngineBlockHash) -> bool {
        let Some(Some(worker)) = self.workers.get_mut(slot as usize) else { return false };
        let Some(id) = worker.blocks.held_id(engine) else { return false };
        let block = *worker.blocks.at(id);
        if worker.seeds.remove(&engine).is_some() {
            shrink_if_sparse(&mut worker.seeds);
        }
        if let Some(parent_id) = block.parent() {
            let parent = worker.blocks.at_mut(parent_id);
            parent.remove_child();
            if parent.is_held() {
                if parent.children() == 0 && self.max_entries.is_some() {
                    parent.stamp = self.eviction.push_front(slot, parent.engine());
                }
            } else {
                // This block was an orphan; one fewer hangs off `parent`,
                // whose record goes with its last child.
                worker.orphans -= 1;
                if parent.children() == 0 {
                    worker.blocks.remove(parent_id);
                }
            }
        }
        if block.children() > 0 {
            worker.orphans += u64::from(block.children());
            worker.blocks.retire(id);
        } else {
            worker.blocks.remove(id);
        }
        worker.blocks.compact_if_sparse();
        match worker.dup_refs.get_mut(&block.seq()) {
            Some(refs) => {
                *refs -= 1;
                if *refs == 0 {
                    worker.dup_refs.remove(&block.seq());
                }
            }
            None => self.holders.release(block.seq(), slot),
        }
        if worker.blocks.len() == 0 {
            // Empty now, as its table is: so are the maps of held blocks,
            // which keep their size otherwise (`WORKER_BYTES` counts none).
            worker.seeds = U64Map::default();
            worker.dup_refs = U64Map::default();
        }
        self.entries -= 1;
        true
    }

    /// Evicts until the index is within its budget; returns how many.
    fn enforce_budget(&mut self) -> u64 {
        let Some(max) = self.max_entries else { return 0 };
        let mut evicted = 0;
        while self.entries > max {
            let Some(slot) = self.tainted_worker() else { break };
            evicted += self.evict_worker(slot);
        }
        while self.entries > max {
            let Some((slot, engine)) = self.next_victim() else { break };
            self.remove_block(slot, engine);
            self.refresh_scan_flag(slot);
            if let Some(log) = &mut self.evicted_log {
                log.push((slot, engine));
            }
            evicted += 1;
        }
        self.compact_queue();
        evicted
    }

    /// Drops stale queue entries once they outnumber the live ones.
    fn compact_queue(&mut self) {
        if self.eviction.len() > 2 * self.entries as usize + 1024 {
            let workers = &self.workers;
            self.eviction.retain(|q| {
                workers
                    .get(q.slot as usize)
                    .and_then(Option::as_ref)
                    .and_then(|w| w.blocks.get(&q.engine))
                    .is_some_and(|b| b.stamp == q.stamp && b.children() == 0)
            });
        }
    }

    /// A worker whose engine reported a hash again with other content
    /// (`tainted`): what kvpick holds for it no longer describes its cache
    /// and may form cycles no leaf-first eviction reaches (a block
    /// re-stored under its own descendant). Under pressure it goes first.
    fn tainted_worker(&self) -> Option<Slot> {
        self.needs_scan.iter().find(|&slot| self.worker(slot).is_some_and(|w| w.tainted))
    }

    /// Forgets a whole worker's blocks as evictions.
    fn evict_worker(&mut self, slot: Slot) -> u64 {
        if let (Some(log), Some(worker)) =
            (&mut self.evicted_log, self.workers.get(slot as usize).and_then(Option::as_ref))
        {
            log.extend(worker.blocks.keys().map(|hash| (slot, hash)));
        }
        self.clear(slot).removed
    }

    /// The next block to evict: the queue's first live leaf.
    fn next_victim(&mut self) -> Option<(Slot, EngineBlockHash)> {
        while let Some(q) = self.eviction.pop() {
            let held = self.worker(q.slot).and_then(|w| w.blocks.get(&q.engine));
            if held.is_some_and(|b| b.stamp == q.stamp && b.children() == 0) {
                return Some((q.slot, q.engine));
            }
        }
        // No leaf is queued, yet entries remain: only blocks that are each
        // other's descendants are left, which hostile events can forge (a
        // block re-stored under its own child). Take any block of the
        // fullest worker; it is scanned block by block from then on.
        let (slot, worker) = self
            .workers
            .iter()
            .enumerate()
            .filter_map(|(slot, w)| Some((slot, w.as_ref()?)))
            .max_by_key(|(_, w)| w.blocks.len())?;
        let engine = worker.blocks.keys().next()?;
        Some((slot as Slot, engine))
    }

    /// Forgets everything the worker held.
    pub fn clear(&mut self, slot: Slot) -> Applied {
        let Some(Some(worker)) = self.workers.get_mut(slot as usize) else {
            return Applied::default();
        };
        let old = std::mem::take(worker);
        for block in old.blocks.values() {
            self.holders.release(block.seq(), slot);
        }
        let removed = old.blocks.len() as u64;
        self.entries -= removed;
        self.needs_scan.remove(slot);
        Applied { removed, ..Applied::default() }
    }

    fn refresh_scan_flag(&mut self, slot: Slot) {
        if self.worker(slot).is_some_and(WorkerBlocks::needs_scan) {
            self.needs_scan.insert(slot);
        } else {
            self.needs_scan.remove(slot);
        }
    }

    /// Appends `(slot, n)` for every worker holding the first `n ≥ 1` blocks
    /// of `seq` (and not block `n`). Workers holding nothing are left out.
    pub fn find_matches(&self, seq: &[SequenceHash], out: &mut Vec<(Slot, u32)>) {
        search::find_matches(self, seq, out)
    }

    /// Heap bytes of the index's tables (capacity, not length: what the
    /// allocator holds), for the bytes-per-entry metric.
    pub fn approx_bytes(&self) -> usize {
        fn table<K, V>(map: &U64Map<K, V>) -> usize {
            // hashbrown: one control byte per bucket; buckets ≈ capacity × 8/7.
            map.capacity() * 8 / 7 * (std::mem::size_of::<(K, V)>() + 1)
        }
        let workers: usize =
            self.workers.iter().flatten().map(|w| w.blocks.table_bytes() + table(&w.dup_refs) + table(&w.seeds)).sum();
        self.holders.bytes() + workers + self.eviction.capacity_bytes()
    }
}

/// Hash tables keep their largest size: one that once held a worker's
/// whole cache (a replay, a burst before eviction caught up) would keep
/// that memory after the blocks left. A quarter full, it halves to twice
/// its length, so shrinking costs O(1) amortised per removal. `None`: it
/// stays as it is.
fn shrunk_capacity(len: usize, capacity: usize) -> Option<usize> {
    const SMALL: usize = 1024;
    (capacity > SMALL && len * 4 < capacity).then_some(len * 2)
}

fn shrink_if_sparse<K: std::hash::Hash + Eq, V>(map: &mut U64Map<K, V>) {
    if let Some(capacity) = shrunk_capacity(map.len(), map.capacity()) {
        map.shrink_to(capacity);
    }
}

#[cfg(test)]
mod tests;
