//! A worker's index as a peer replica takes it (warm start): its blocks
//! with the block size they were hashed at and how hard its cache was
//! churning, so the cost weighs the imported worker as the peer did.

use super::{Churn, Shard};
use crate::index::{Applied, ImportError, WorkerExport};
use crate::worker::WorkerId;

/// One worker of a shard, exported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerSnapshot {
    /// The block size the sequence hashes were made at: an importer
    /// hashing prompts at another size could match none of them.
    pub block_size: u32,
    pub blocks: WorkerExport,
    /// The churn's decayed counts of blocks stored and removed.
    pub churn_stored: f64,
    pub churn_removed: f64,
}

impl Shard {
    /// `None` for a worker this shard does not have, or one whose events
    /// carry another block size than kvpick hashes with (nothing it holds
    /// can match: not worth sending).
    pub fn export_worker(&self, id: WorkerId) -> Option<WorkerSnapshot> {
        let slot = *self.by_id.get(&id)?;
        let entry = self.entry(slot);
        if entry.engine_block_size.is_some() {
            return None;
        }
        Some(WorkerSnapshot {
            block_size: entry.spec.block_size,
            blocks: self.index.export_worker(slot)?,
            churn_stored: entry.churn.stored,
            churn_removed: entry.churn.removed,
        })
    }

    /// Replaces what the worker holds with `snapshot` (see
    /// `KvIndex::import_worker`); refused, and nothing changed, for an
    /// unknown worker, another block size or malformed blocks.
    pub fn import_worker(&mut self, id: WorkerId, snapshot: &WorkerSnapshot) -> Result<Applied, ImportError> {
        let slot = *self.by_id.get(&id).ok_or(ImportError::UnknownWorker)?;
        let block_size = self.entry(slot).spec.block_size;
        if snapshot.block_size != block_size {
            return Err(ImportError::BlockSizeMismatch { snapshot: snapshot.block_size, worker: block_size });
        }
        let applied = self.index.import_worker(slot, &snapshot.blocks)?;
        let churn = |count: f64| if count.is_finite() && count >= 0.0 { count } else { 0.0 };
        if let Some(entry) = self.entry_of_mut(id) {
            entry.churn = Churn { stored: churn(snapshot.churn_stored), removed: churn(snapshot.churn_removed) };
            entry.engine_block_size = None;
        }
        self.stats.blocks_imported += applied.stored;
        self.stats.blocks_evicted += applied.evicted;
        Ok(applied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::KvEvent;
    use crate::hashing::{HashSeed, sequence_hashes};
    use crate::worker::WorkerSpec;

    fn shard_with(worker: WorkerId, block_size: u32) -> Shard {
        let mut shard = Shard::new();
        let endpoint = "10.0.0.1:8000".parse().unwrap_or_else(|e| panic!("{e}"));
        shard.upsert_worker(WorkerSpec::new(worker, endpoint, block_size));
        shard
    }

    fn stored(first: u64, tokens: &[u32], block_size: u32) -> KvEvent {
        let n = tokens.len() as u64 / u64::from(block_size);
        KvEvent::Stored {
            block_hashes: (first..first + n).collect(),
            parent: None,
            token_ids: tokens.to_vec(),
            block_size,
            seed: HashSeed::default(),
        }
    }

    #[test]
    fn a_worker_moves_between_shards_with_its_blocks_and_churn() {
        let id = WorkerId(7);
        let mut peer = shard_with(id, 4);
        let tokens: Vec<u32> = (0..32).collect();
        peer.apply_event(id, &stored(100, &tokens, 4)).unwrap_or_else(|e| panic!("{e}"));
        peer.apply_event(id, &KvEvent::Removed { block_hashes: vec![107] }).unwrap_or_else(|e| panic!("{e}"));
        let snapshot = peer.export_worker(id).unwrap_or_else(|| panic!("no export"));
        assert_eq!((snapshot.block_size, snapshot.blocks.blocks.len()), (4, 7));

        let mut replica = shard_with(id, 4);
        let applied = replica.import_worker(id, &snapshot).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(applied.stored, 7);
        let probe = sequence_hashes(&tokens, 4, HashSeed::default());
        assert_eq!(replica.overlaps(&probe), peer.overlaps(&probe));
        assert_eq!(replica.overlaps(&probe), vec![(id, 7)]);
        let pressure = |s: &Shard| s.slots[0].as_ref().map(|e| e.churn.pressure());
        assert_eq!(pressure(&replica), pressure(&peer));
        assert_eq!(replica.stats().blocks_imported, 7);
    }

    #[test]
    fn another_block_size_or_an_unknown_worker_is_refused() {
        let id = WorkerId(7);
        let mut peer = shard_with(id, 4);
        peer.apply_event(id, &stored(100, &(0..8).collect::<Vec<_>>(), 4)).unwrap_or_else(|e| panic!("{e}"));
        let snapshot = peer.export_worker(id).unwrap_or_else(|| panic!("no export"));
        let mut other_size = shard_with(id, 16);
        assert_eq!(
            other_size.import_worker(id, &snapshot),
            Err(ImportError::BlockSizeMismatch { snapshot: 4, worker: 16 })
        );
        assert_eq!(shard_with(WorkerId(8), 4).import_worker(id, &snapshot), Err(ImportError::UnknownWorker));
        assert_eq!(peer.export_worker(WorkerId(8)), None);
        // Events at another block size than kvpick's: nothing to send.
        let _ = peer.apply_event(id, &stored(200, &(0..16).collect::<Vec<_>>(), 16));
        assert_eq!(peer.export_worker(id), None);
    }
}
