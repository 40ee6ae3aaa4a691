//! One worker's blocks by engine hash: the blocks themselves in a dense
//! slab, and a hash table of 4-byte slab ids.
//!
//! Why not a `Placed<EngineBlockHash, StoredBlock>` (until 2026-12-05):
//! its 32-byte buckets, at the 44-88% load a doubling hash table keeps,
//! cost 36-73 bytes per block, 69 of the index's 87 bytes per entry at the
//! bench's 1,000,000 entries. Here a block costs its 32-byte record in a
//! slab kept 80-100% full (it grows by a quarter; a removed record's place
//! is reused first), plus a 5-byte bucket (id and control byte) at that
//! load: 87 → 63 bytes per entry at 1,000,000, 72 → 66 on average over
//! population sizes (perf/results/2026-12-05-tables-tried.md).
//!
//! The price is a second place in memory per lookup of a held block: the
//! table finds candidate ids by hashbrown's one-byte tags, and the record
//! says whether the engine hash is the one asked for. A new block (most
//! stores) matches no tag, so its lookup reads no record.

use hashbrown::HashTable;

use super::StoredBlock;
use super::placed::{Key, Place};
use super::shrunk_capacity;
use crate::event::EngineBlockHash;

#[derive(Debug, Default)]
pub(super) struct WorkerTable {
    /// Slab ids, found by the engine hash of the record they name.
    ids: HashTable<u32>,
    /// Every record, live or free (`free` lists the free ones).
    records: Vec<(EngineBlockHash, StoredBlock)>,
    /// Records of removed blocks, reused first.
    free: Vec<u32>,
    /// Where `ids`' buckets were when last placed, for prefetching.
    place: Option<Place>,
}

impl WorkerTable {
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Heap bytes: the id table (a control byte each), records, free list.
    pub(super) fn table_bytes(&self) -> usize {
        self.ids.num_buckets() * (std::mem::size_of::<u32>() + 1)
            + self.records.capacity() * std::mem::size_of::<(EngineBlockHash, StoredBlock)>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }

    fn id(&self, engine: EngineBlockHash) -> Option<u32> {
        let records = &self.records;
        self.ids.find(engine.hash(), |&id| records[id as usize].0 == engine).copied()
    }

    pub(super) fn get(&self, engine: &EngineBlockHash) -> Option<&StoredBlock> {
        self.id(*engine).map(|id| &self.records[id as usize].1)
    }

    pub(super) fn get_mut(&mut self, engine: &EngineBlockHash) -> Option<&mut StoredBlock> {
        self.id(*engine).map(|id| &mut self.records[id as usize].1)
    }

    pub(super) fn contains_key(&self, engine: &EngineBlockHash) -> bool {
        self.id(*engine).is_some()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&EngineBlockHash, &StoredBlock)> {
        self.ids.iter().map(|&id| {
            let (engine, block) = &self.records[id as usize];
            (engine, block)
        })
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &EngineBlockHash> {
        self.iter().map(|(engine, _)| engine)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &StoredBlock> {
        self.iter().map(|(_, block)| block)
    }

    /// Room for `additional` more blocks.
    pub(super) fn reserve(&mut self, additional: usize) {
        let records = &self.records;
        self.ids.reserve(additional, |&id| records[id as usize].0.hash());
        self.place = None;
    }

    /// Inserts or replaces `engine`'s block.
    pub(super) fn insert(&mut self, engine: EngineBlockHash, block: StoredBlock) {
        if let Some(id) = self.id(engine) {
            self.records[id as usize].1 = block;
            return;
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.records[id as usize] = (engine, block);
                id
            }
            None => {
                if self.records.len() == self.records.capacity() {
                    // A quarter more, not double: a doubled slab just past
                    // its doubling is half empty, and across population
                    // sizes that cost more memory than the hash buckets it
                    // replaced (perf/results/2026-12-05-tables-tried.md).
                    // The copies (about four per record) are paid while a
                    // worker's cache grows, not at its steady size.
                    self.records.reserve_exact((self.records.len() / 4).max(16));
                }
                // A worker holds far fewer than 2^32 blocks: the index's
                // budget and memory (32 bytes a record) stop it long before.
                debug_assert!(self.records.len() < u32::MAX as usize);
                let id = u32::try_from(self.records.len()).unwrap_or(u32::MAX);
                self.records.push((engine, block));
                id
            }
        };
        let records = &self.records;
        let bucket = self.ids.insert_unique(engine.hash(), id, |&id| records[id as usize].0.hash()).bucket_index();
        self.place = Some(Place::of(&mut self.ids, bucket).0);
    }

    /// Removes `engine`'s block; its record is reused by the next insert.
    pub(super) fn remove(&mut self, engine: &EngineBlockHash) -> Option<StoredBlock> {
        let records = &self.records;
        let Ok(entry) = self.ids.find_entry(engine.hash(), |&id| records[id as usize].0 == *engine) else {
            return None;
        };
        let (id, _) = entry.remove();
        let block = self.records[id as usize].1.clone();
        self.free.push(id);
        self.compact_if_sparse();
        Some(block)
    }

    /// A table left a quarter full (see `shrunk_capacity`) is rebuilt
    /// dense: records in a fresh slab, ids to match, the free list gone.
    fn compact_if_sparse(&mut self) {
        if shrunk_capacity(self.ids.len(), self.records.len()).is_none() {
            return;
        }
        let live: Vec<(EngineBlockHash, StoredBlock)> =
            self.ids.iter().map(|&id| self.records[id as usize].clone()).collect();
        self.ids = HashTable::with_capacity(live.len() * 2);
        self.records = Vec::with_capacity(live.len() * 2);
        self.free = Vec::new();
        self.place = None;
        for (engine, block) in live {
            self.insert(engine, block);
        }
    }

    /// See [`Place::prefetch_run`]: the id buckets a lookup of `engine`
    /// starts at (not the record: its id is not known yet).
    #[inline(always)]
    pub(super) fn prefetch_run(&self, engine: EngineBlockHash) {
        if let Some(place) = self.place {
            place.prefetch_run::<u32>(engine.hash());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::SequenceHash;

    fn block(seq: u64, parent: Option<EngineBlockHash>, engine: EngineBlockHash) -> StoredBlock {
        StoredBlock::new(engine, SequenceHash(seq), parent, 0)
    }

    #[test]
    fn blocks_are_found_replaced_removed_and_their_records_reused() {
        let mut table = WorkerTable::default();
        for engine in 0..5_000u64 {
            table.insert(engine, block(engine + 1, engine.checked_sub(1), engine));
        }
        assert_eq!(table.len(), 5_000);
        assert_eq!(table.get(&7).map(|b| b.seq), Some(SequenceHash(8)));
        assert_eq!(table.get(&0).and_then(|b| b.parent(0)), None);
        assert_eq!(table.get(&9).and_then(|b| b.parent(9)), Some(8));
        table.insert(7, block(70, Some(6), 7));
        assert_eq!((table.get(&7).map(|b| b.seq), table.len()), (Some(SequenceHash(70)), 5_000));
        table.get_mut(&8).expect("held").children += 3;
        assert_eq!(table.get(&8).map(|b| b.children), Some(3));
        assert_eq!(table.remove(&9).map(|b| b.seq), Some(SequenceHash(10)));
        assert!(table.remove(&9).is_none() && !table.contains_key(&9));
        // The freed record is the next one used: the slab does not grow.
        let slab = table.records.len();
        table.insert(1_000_000, block(1, None, 1_000_000));
        assert_eq!(table.records.len(), slab);
        assert_eq!(table.get(&1_000_000).map(|b| b.seq), Some(SequenceHash(1)));
        let mut keys: Vec<u64> = table.keys().copied().collect();
        keys.sort_unstable();
        assert_eq!(keys.len(), 5_000);
        assert!(keys.binary_search(&9).is_err() && keys.binary_search(&1_000_000).is_ok());
    }

    #[test]
    fn a_table_emptied_to_a_quarter_is_rebuilt_dense_and_keeps_every_block() {
        let mut table = WorkerTable::default();
        let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for i in 0..10_000 {
            table.insert(key(i), block(i, None, key(i)));
        }
        let full = table.table_bytes();
        for i in 100..10_000 {
            assert_eq!(table.remove(&key(i)).map(|b| b.seq), Some(SequenceHash(i)));
        }
        assert_eq!(table.len(), 100);
        assert!(table.records.len() <= 1_024 && table.free.len() < 1_024, "{}", table.records.len());
        assert!((0..100).all(|i| table.get(&key(i)).map(|b| b.seq) == Some(SequenceHash(i))));
        assert!(table.values().all(|b| b.seq.0 < 100));
        assert!(table.table_bytes() * 4 < full, "{} of {full} bytes", table.table_bytes());
    }
}
