//! One worker's blocks by engine hash: the blocks themselves in a slab,
//! and a hash table of 4-byte slab ids.
//!
//! Why not a `Placed<EngineBlockHash, StoredBlock>` (until 2026-12-05):
//! its 32-byte buckets and control bytes, at the 44-88% load a doubling
//! hash table keeps, cost 38-75 bytes per block, 69 of the index's 87
//! bytes per entry at the bench's 1,000,000 entries. Here a block costs its
//! 32-byte record in a slab that grows by a quarter (80-100% full while a
//! worker's cache grows; a removed record's place is reused first), plus a
//! 5-byte bucket (id and control byte) at that load: 87 -> 63 bytes per
//! entry at 1,000,000, 72 -> 66 on average over population sizes
//! (perf/results/2026-12-05-tables-tried.md).
//!
//! The price is a second place in memory per lookup of a held block: the
//! table finds candidate ids by hashbrown's 7-bit tags, and the record says
//! whether the engine hash is the one asked for. A new block (most stores)
//! rarely matches a tag (1 in 128 per full bucket scanned), so its lookup
//! rarely reads a record.

use hashbrown::HashTable;

use super::StoredBlock;
use super::placed::{Key, Place};
use super::shrunk_capacity;
use crate::event::EngineBlockHash;

/// A block and the engine hash it is held under.
type Record = (EngineBlockHash, StoredBlock);

#[derive(Debug, Default)]
pub(super) struct WorkerTable {
    /// Slab ids, found by the engine hash of the record they name.
    ids: HashTable<u32>,
    /// Every record, live or free (`free` lists the free ones).
    records: Vec<Record>,
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
            + self.records.capacity() * std::mem::size_of::<Record>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }

    fn id(&self, engine: EngineBlockHash) -> Option<u32> {
        self.ids.find(engine.hash(), names(&self.records, engine)).copied()
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
        self.ids.reserve(additional, hash_of(&self.records));
        self.records.reserve_exact(additional.saturating_sub(self.free.len()));
        self.place = None;
    }

    /// Inserts or replaces `engine`'s block.
    pub(super) fn insert(&mut self, engine: EngineBlockHash, block: StoredBlock) {
        match self.id(engine) {
            Some(id) => self.records[id as usize].1 = block,
            None => self.insert_new(engine, block),
        }
    }

    /// Inserts a block the caller knows is not held (a store that just
    /// looked it up, an import of distinct hashes, a rebuild): one probe
    /// fewer than `insert`.
    pub(super) fn insert_new(&mut self, engine: EngineBlockHash, block: StoredBlock) {
        debug_assert!(self.id(engine).is_none(), "{engine:#x} is held already");
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
                // 2^32 records are 128 GiB on one worker: the index's
                // budget (a quarter of the machine's memory by default)
                // stops a worker long before, whatever its engine sends.
                let id = u32::try_from(self.records.len()).expect("fewer than 2^32 records per worker");
                self.records.push((engine, block));
                id
            }
        };
        let bucket = self.ids.insert_unique(engine.hash(), id, hash_of(&self.records)).bucket_index();
        self.place = Some(Place::of(&mut self.ids, bucket).0);
    }

    /// Removes `engine`'s block; its record is reused by the next insert.
    pub(super) fn remove(&mut self, engine: &EngineBlockHash) -> Option<StoredBlock> {
        let Ok(entry) = self.ids.find_entry(engine.hash(), names(&self.records, *engine)) else {
            return None;
        };
        let (id, _) = entry.remove();
        let block = self.records[id as usize].1.clone();
        self.free.push(id);
        self.compact_if_sparse();
        Some(block)
    }

    /// A table left a quarter full (see `shrunk_capacity`) is rebuilt
    /// dense: records in a fresh slab with a quarter to spare, ids to
    /// match, the free list gone.
    fn compact_if_sparse(&mut self) {
        if shrunk_capacity(self.ids.len(), self.records.len()).is_none() {
            return;
        }
        let live: Vec<Record> = self.ids.iter().map(|&id| self.records[id as usize].clone()).collect();
        self.ids = HashTable::with_capacity(live.len() + live.len() / 4);
        self.records = Vec::with_capacity(live.len() + live.len() / 4);
        self.free = Vec::new();
        self.place = None;
        for (engine, block) in live {
            self.insert_new(engine, block);
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

/// Whether an id names `engine`'s record: the table's equality.
fn names(records: &[Record], engine: EngineBlockHash) -> impl Fn(&u32) -> bool + '_ {
    move |&id| records[id as usize].0 == engine
}

/// The hash of the record an id names: the table's hasher on growth.
fn hash_of(records: &[Record]) -> impl Fn(&u32) -> u64 + '_ {
    |&id| records[id as usize].0.hash()
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

    /// Every id is either in the table or free, never both, and every
    /// record is one or the other.
    fn assert_ids_partition_the_slab(table: &WorkerTable) {
        let mut seen = vec![false; table.records.len()];
        for &id in table.ids.iter().chain(&table.free) {
            assert!(!std::mem::replace(&mut seen[id as usize], true), "id {id} twice");
        }
        assert!(seen.iter().all(|&s| s), "an id lost");
    }

    #[test]
    fn random_stores_removals_and_restores_agree_with_a_map_through_growth_and_rebuilds() {
        // A small key space, so keys come back (with other content) after
        // their removal, and the table grows past 1,024 records and empties
        // to a quarter several times.
        let mut table = WorkerTable::default();
        let mut model = std::collections::HashMap::new();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut rebuilds = 0;
        for round in 0..120_000u64 {
            // Phases: mostly stores, then mostly removals.
            let storing = (round / 20_000) % 2 == 0;
            let key = next() % 3_000;
            if next() % 10 < if storing { 8 } else { 1 } {
                table.insert(key, block(round, None, key));
                model.insert(key, round);
            } else {
                let before = table.records.len();
                assert_eq!(table.remove(&key).map(|b| b.seq.0), model.remove(&key));
                rebuilds += usize::from(table.records.len() < before);
            }
            if round % 4_000 == 0 {
                assert_ids_partition_the_slab(&table);
            }
        }
        assert!(rebuilds >= 2, "{rebuilds} rebuilds");
        assert_ids_partition_the_slab(&table);
        assert_eq!(table.len(), model.len());
        for key in 0..3_000 {
            assert_eq!(table.get(&key).map(|b| b.seq.0), model.get(&key).copied(), "{key}");
        }
        let mut held: Vec<(u64, u64)> = table.iter().map(|(k, b)| (*k, b.seq.0)).collect();
        held.sort_unstable();
        let mut expected: Vec<(u64, u64)> = model.into_iter().collect();
        expected.sort_unstable();
        assert_eq!(held, expected);
    }
}
