//! One worker's part of the index as a value: what a replica starting up
//! takes from a peer instead of relearning every engine's cache (warm
//! start, issue #22).
//!
//! The index keeps no token ids, only the sequence hashes they chained
//! to, so an export cannot be replayed as `Stored` events: it carries each
//! held block's engine hash, parent, sequence hash and (when not the
//! default) seed, plus the removed blocks that still have held children
//! (with the sequence hash those children were chained from, which a
//! re-stored parent is checked against). Everything derived (children
//! counts, orphans, duplicate references, holders, the scan flag) is
//! rebuilt on import, never taken on trust: an imported worker behaves
//! exactly as the exporting one under every later event (tested).

use std::collections::HashSet;

use super::worker_table::MAX_RECORDS;
use super::{KvIndex, StoredBlock, U64Map, WorkerBlocks};
use crate::event::EngineBlockHash;
use crate::hashing::{HashSeed, SequenceHash};
use crate::slot_set::Slot;

/// One held block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRecord {
    pub engine: EngineBlockHash,
    pub parent: Option<EngineBlockHash>,
    pub seq: SequenceHash,
    /// `None`: the default seed (no LoRA adapter, no cache salt).
    pub seed: Option<HashSeed>,
}

/// A block no longer held whose children still are: the sequence hash
/// they were chained from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrphanRecord {
    pub engine: EngineBlockHash,
    pub chained_from: SequenceHash,
}

/// One worker's blocks, oldest first in the eviction order (an importing
/// index with a budget gives up the same blocks first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerExport {
    pub blocks: Vec<BlockRecord>,
    pub orphaned: Vec<OrphanRecord>,
    /// An engine hash came back with other content: scanned block by block
    /// until the worker's cache is cleared.
    pub tainted: bool,
}

impl WorkerExport {
    /// Blocks and orphan records in hash order: two exports of equal
    /// indexes compare equal whatever order their tables kept.
    pub fn sorted(mut self) -> Self {
        self.blocks.sort_unstable_by_key(|b| b.engine);
        self.orphaned.sort_unstable_by_key(|o| o.engine);
        self
    }
}

/// Why an import was refused (the worker is left as it was).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("worker is not known to this shard")]
    UnknownWorker,
    #[error("block {0:#x} is listed twice")]
    DuplicateBlock(EngineBlockHash),
    #[error("blocks hashed at {snapshot} tokens, the worker's block size is {worker}")]
    BlockSizeMismatch { snapshot: u32, worker: u32 },
    #[error("block {0:#x} names itself as its parent")]
    OwnParent(EngineBlockHash),
    #[error("orphan record {0:#x} is listed twice or names a held block")]
    BadOrphan(EngineBlockHash),
    #[error("{records} block records (blocks and the parents they name) are more than one worker holds ({most})")]
    TooManyRecords { records: usize, most: usize },
}

impl WorkerExport {
    /// What an import refuses (a duplicate block, a block its own parent,
    /// a bad orphan record, more records than a worker's slab has ids for),
    /// found without an index: a peer's export is checked before anything
    /// is done with it.
    pub fn check(&self) -> Result<(), ImportError> {
        self.check_within(MAX_RECORDS)
    }

    /// `check`, with a worker holding at most `most` records.
    pub(super) fn check_within(&self, most: usize) -> Result<(), ImportError> {
        let mut engines: HashSet<EngineBlockHash> = HashSet::with_capacity(self.blocks.len());
        for block in &self.blocks {
            if !engines.insert(block.engine) {
                return Err(ImportError::DuplicateBlock(block.engine));
            }
            // No event can make a block its own parent (the index would
            // count it as its own child and an orphan at once).
            if block.parent == Some(block.engine) {
                return Err(ImportError::OwnParent(block.engine));
            }
        }
        let mut orphans: HashSet<EngineBlockHash> = HashSet::with_capacity(self.orphaned.len());
        for orphan in &self.orphaned {
            if engines.contains(&orphan.engine) || !orphans.insert(orphan.engine) {
                return Err(ImportError::BadOrphan(orphan.engine));
            }
        }
        // An import gives each block a record, and each parent it names
        // that is not among them a gone one.
        let missing: HashSet<EngineBlockHash> =
            self.blocks.iter().filter_map(|block| block.parent).filter(|parent| !engines.contains(parent)).collect();
        let records = engines.len() + missing.len();
        if records > most {
            return Err(ImportError::TooManyRecords { records, most });
        }
        Ok(())
    }
}

impl KvIndex {
    /// The worker's blocks; `None` for a slot with no worker.
    pub fn export_worker(&self, slot: Slot) -> Option<WorkerExport> {
        let worker = self.worker(slot)?;
        let record = |block: &StoredBlock| BlockRecord {
            engine: block.engine(),
            parent: block.parent().map(|id| worker.blocks.at(id).engine()),
            seq: block.seq(),
            seed: worker.seeds.get(&block.engine()).copied(),
        };
        let mut blocks = Vec::with_capacity(worker.blocks.len());
        if self.max_entries.is_some() {
            // The queue's live entries first, in its order; blocks whose
            // entry was compacted away (they had children then) after.
            let mut listed = HashSet::with_capacity(worker.blocks.len());
            for queued in self.eviction.iter().filter(|q| q.slot == slot) {
                if let Some(block) = worker.blocks.get(&queued.engine)
                    && block.stamp == queued.stamp
                    && listed.insert(queued.engine)
                {
                    blocks.push(record(block));
                }
            }
            let rest = worker.blocks.values().filter(|block| !listed.contains(&block.engine()));
            blocks.extend(rest.map(record));
        } else {
            blocks.extend(worker.blocks.values().map(record));
        }
        let orphaned = worker
            .blocks
            .gone()
            .map(|block| OrphanRecord { engine: block.engine(), chained_from: block.seq() })
            .collect();
        Some(WorkerExport { blocks, orphaned, tainted: worker.tainted })
    }

    /// Replaces what the worker holds with `export`; what it applied:
    /// `removed` (the blocks it held before), `stored`, and `evicted` when
    /// the budget could not keep them all (oldest leaves first, as if they
    /// had been stored in the export's order).
    pub fn import_worker(&mut self, slot: Slot, export: &WorkerExport) -> Result<super::Applied, ImportError> {
        if self.worker(slot).is_none() {
            return Err(ImportError::UnknownWorker);
        }
        export.check()?;
        let chained_from: U64Map<EngineBlockHash, SequenceHash> =
            export.orphaned.iter().map(|o| (o.engine, o.chained_from)).collect();

        let removed = self.clear(slot).removed;
        let budget = self.max_entries.is_some();
        let Some(Some(worker)) = self.workers.get_mut(slot as usize) else { return Err(ImportError::UnknownWorker) };
        let mut rebuilt = WorkerBlocks { tainted: export.tainted, ..WorkerBlocks::default() };
        rebuilt.blocks.reserve(export.blocks.len());
        let mut ids = Vec::with_capacity(export.blocks.len());
        for block in &export.blocks {
            let stamp = if budget { self.eviction.push_back(slot, block.engine) } else { 0 };
            // `check` proved the engine hashes distinct.
            ids.push(rebuilt.blocks.insert_new(StoredBlock::new(block.engine, block.seq, None, stamp)));
            if let Some(seed) = block.seed.filter(|s| *s != HashSeed::default()) {
                rebuilt.seeds.insert(block.engine, seed);
            }
            if !self.holders.insert(block.seq, slot) {
                *rebuilt.dup_refs.entry(block.seq).or_default() += 1;
            }
        }
        // Parent ids, children counts and orphans, from the parent links
        // alone. A missing parent gets a gone record (`worker_table`), with
        // the sequence hash its orphan record gives; an orphan record no
        // held block names describes nothing and is dropped.
        for (block, &id) in export.blocks.iter().zip(&ids) {
            let Some(parent) = block.parent else { continue };
            let parent_id = match rebuilt.blocks.find(parent) {
                Some(parent_id) => parent_id,
                None => {
                    let seq = chained_from.get(&parent).copied().unwrap_or_else(|| {
                        // No record (an export that lost it): the chain
                        // cannot be checked when the parent comes back,
                        // so the worker is scanned from now on.
                        rebuilt.tainted = true;
                        SequenceHash(0)
                    });
                    rebuilt.blocks.insert_gone(parent, seq)
                }
            };
            let parent_record = rebuilt.blocks.at_mut(parent_id);
            parent_record.add_child();
            if !parent_record.is_held() {
                rebuilt.orphans += 1;
            }
            rebuilt.blocks.at_mut(id).set_parent(parent_id);
        }
        *worker = rebuilt;
        let stored = export.blocks.len() as u64;
        self.entries += stored;
        self.refresh_scan_flag(slot);
        let evicted = self.enforce_budget();
        Ok(super::Applied { stored, removed, evicted, ..super::Applied::default() })
    }
}
