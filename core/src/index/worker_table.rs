//! One worker's blocks by engine hash: the blocks themselves in a slab,
//! and a hash table of 4-byte slab ids.
//!
//! Why not a `Placed<EngineBlockHash, StoredBlock>` (until 2026-12-05):
//! its 32-byte buckets and control bytes, at the 44-88% load a doubling
//! hash table keeps, cost 38-75 bytes per block, 69 of the index's 87
//! bytes per entry at the bench's 1,000,000 entries. Here a block costs its
//! 28-byte record in a slab of 256-record chunks that never move (all full
//! but a worker's last; a removed record's place is reused first; see
//! `slab`), plus a 5-byte bucket (id and control byte) at that load
//! (perf/results/2026-12-05-tables-tried.md).
//!
//! The price is a second place in memory per lookup of a held block: the
//! table finds candidate ids by hashbrown's 7-bit tags, and the record says
//! whether the engine hash is the one asked for. A new block (most stores)
//! should not read a record at all, but a lookup scans a group of 16
//! buckets, about 8 of them full, so 1 in 16 matched a tag by chance and
//! read a record no prefetch had asked for: a cache miss, 55% of the
//! store's own time in a profile of 16-block stores. Each id therefore
//! carries 4 more bits of its engine hash (`Tagged`), checked before the
//! record: 1 in 256 lookups reads one by chance. Ids keep 28 bits, 2^28
//! records per worker (7.5 GB of records on one worker; a worker at the
//! limit stores no more blocks, as when the index's budget is spent).
//!
//! A record names its parent by slab id, not engine hash: 4 bytes instead
//! of 8, and a removal reaches the parent without a hash lookup. Ids must
//! then stay valid while a child points at them, so a removed block that
//! still has held children keeps its record, marked gone: found by its
//! engine hash (a re-stored block takes its record and children back), not
//! held (`get`, `len` and the iterators leave it out). It is freed with
//! its last child. Rebuilding the slab renumbers the parents with it.

use hashbrown::HashTable;

use super::placed::{Key, Place};
use super::slab::{BlockId, CHUNK, Slab};
use crate::event::EngineBlockHash;
use crate::hashing::SequenceHash;

/// Bits of a `Tagged` entry that are the id; the rest are hash bits.
const ID_BITS: u32 = 28;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
/// Records one worker's slab can hold: every id fits in `ID_BITS`.
pub(super) const MAX_RECORDS: usize = ID_MASK as usize + 1;

/// An id in the table, with 4 bits of its engine hash above it (see the
/// module docs). The bits are below hashbrown's tag (the top 7) and above
/// the bucket index (the low bits), so they tell apart what those did not.
/// Fx makes them from the engine hash's low 27 bits: the engines' hashes
/// (sha256, xxh3, Python's) are uniform there; hashes alike in those bits
/// only lose the filter, never an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tagged(u32);

impl Tagged {
    fn new(id: BlockId, hash: u64) -> Tagged {
        debug_assert!(id <= ID_MASK);
        Tagged(id | Tagged::bits(hash))
    }

    fn bits(hash: u64) -> u32 {
        ((hash >> 49) as u32 & 0xF) << ID_BITS
    }

    fn id(self) -> BlockId {
        self.0 & ID_MASK
    }

    /// Whether the entry may name a record of this hash.
    fn may_be(self, hash: u64) -> bool {
        self.0 & !ID_MASK == Tagged::bits(hash)
    }
}

const NO_PARENT: BlockId = BlockId::MAX;
/// In `children`: the block is not held; its record is kept for its held
/// children (see module docs). A record has fewer than 2^31 children: a
/// worker has at most `MAX_RECORDS` (2^28) records.
const GONE: u32 = 1 << 31;

/// One block of a worker. 28 bytes, packed to 4-byte alignment (x86 and
/// ARM read the unaligned 8-byte fields at full speed): the slabs hold one
/// per (block, worker) entry, most of the index's memory, and 8-byte
/// alignment would pad it to 32.
#[repr(C, packed(4))]
#[derive(Clone, Copy, Debug)]
pub(super) struct StoredBlock {
    engine: EngineBlockHash,
    seq: SequenceHash,
    /// The parent's id, or `NO_PARENT`. Read through `parent`.
    parent: BlockId,
    /// Held blocks whose parent is this one, and the `GONE` bit.
    children: u32,
    /// Its newest entry in the eviction queue (0 with no budget).
    pub stamp: u32,
}

const _: () = assert!(std::mem::size_of::<StoredBlock>() == 28);

/// What fills a slab's room before a record takes it (no id names it).
const UNUSED: StoredBlock = StoredBlock { engine: 0, seq: SequenceHash(0), parent: NO_PARENT, children: 0, stamp: 0 };

impl StoredBlock {
    pub(super) fn new(engine: EngineBlockHash, seq: SequenceHash, parent: Option<BlockId>, stamp: u32) -> Self {
        StoredBlock { engine, seq, parent: parent.unwrap_or(NO_PARENT), children: 0, stamp }
    }

    pub(super) fn engine(&self) -> EngineBlockHash {
        self.engine
    }

    /// The sequence hash of the prefix this block ends (for a gone block:
    /// the one its held children were chained from).
    pub(super) fn seq(&self) -> SequenceHash {
        self.seq
    }

    pub(super) fn parent(&self) -> Option<BlockId> {
        let parent = self.parent;
        (parent != NO_PARENT).then_some(parent)
    }

    pub(super) fn set_parent(&mut self, parent: BlockId) {
        self.parent = parent;
    }

    /// This block, held, with `children` held children.
    pub(super) fn with_children(self, children: u32) -> Self {
        debug_assert!(children < GONE);
        StoredBlock { children, ..self }
    }

    /// Held blocks whose parent is this one.
    pub(super) fn children(&self) -> u32 {
        self.children & !GONE
    }

    pub(super) fn is_held(&self) -> bool {
        self.children & GONE == 0
    }

    pub(super) fn add_child(&mut self) {
        debug_assert!(self.children() < GONE - 1);
        self.children += 1;
    }

    pub(super) fn remove_child(&mut self) {
        debug_assert!(self.children() > 0);
        self.children -= 1;
    }
}

#[derive(Debug)]
pub(super) struct WorkerTable {
    /// Slab ids, found by the engine hash of the record they name.
    ids: HashTable<Tagged>,
    /// Every record, held, gone or free (`free` lists the free ones).
    records: Slab<StoredBlock>,
    /// Records of removed blocks, reused first.
    free: Vec<BlockId>,
    /// Records in `ids` marked gone.
    gone: usize,
    /// Where `ids`' buckets were when last placed, for prefetching.
    place: Option<Place>,
    /// Records the slab may hold: `MAX_RECORDS` but in tests.
    most_records: usize,
}

impl Default for WorkerTable {
    fn default() -> Self {
        WorkerTable {
            ids: HashTable::new(),
            records: Slab::default(),
            free: Vec::new(),
            gone: 0,
            place: None,
            most_records: MAX_RECORDS,
        }
    }
}

impl WorkerTable {
    /// Blocks held.
    pub(super) fn len(&self) -> usize {
        self.ids.len() - self.gone
    }

    /// Heap bytes: the id table (a control byte each), records, free list.
    pub(super) fn table_bytes(&self) -> usize {
        self.ids.num_buckets() * (std::mem::size_of::<Tagged>() + 1)
            + self.records.capacity() * std::mem::size_of::<StoredBlock>()
            + self.free.capacity() * std::mem::size_of::<BlockId>()
    }

    /// The record under `engine`, held or gone.
    pub(super) fn find(&self, engine: EngineBlockHash) -> Option<BlockId> {
        let hash = engine.hash();
        self.ids.find(hash, names(&self.records, engine, hash)).map(|tagged| tagged.id())
    }

    /// `engine`'s block, if held.
    pub(super) fn held_id(&self, engine: EngineBlockHash) -> Option<BlockId> {
        self.find(engine).filter(|&id| self.records[id].is_held())
    }

    pub(super) fn get(&self, engine: &EngineBlockHash) -> Option<&StoredBlock> {
        self.held_id(*engine).map(|id| &self.records[id])
    }

    pub(super) fn contains_key(&self, engine: &EngineBlockHash) -> bool {
        self.held_id(*engine).is_some()
    }

    /// The record behind an id this table gave (held or gone).
    pub(super) fn at(&self, id: BlockId) -> &StoredBlock {
        &self.records[id]
    }

    pub(super) fn at_mut(&mut self, id: BlockId) -> &mut StoredBlock {
        &mut self.records[id]
    }

    /// Held blocks.
    pub(super) fn values(&self) -> impl Iterator<Item = &StoredBlock> {
        self.ids.iter().map(|tagged| &self.records[tagged.id()]).filter(|block| block.is_held())
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = EngineBlockHash> + '_ {
        self.values().map(|block| block.engine)
    }

    /// Records kept only for their held children.
    pub(super) fn gone(&self) -> impl Iterator<Item = &StoredBlock> {
        self.ids.iter().map(|tagged| &self.records[tagged.id()]).filter(|block| !block.is_held())
    }

    /// Room for `additional` more blocks.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.ids.reserve(additional, hash_of(&self.records));
        self.records.reserve(additional.saturating_sub(self.free.len()), UNUSED);
        self.place = None;
    }

    /// Whether `insert_new` has no room: every id is taken (2^28 records,
    /// 7.5 GB of them on one worker, which only a budget of tens of GB
    /// lets a broken or hostile engine reach).
    pub(super) fn is_full(&self) -> bool {
        self.free.is_empty() && self.records.len() >= self.most_records
    }

    /// Stores a block whose engine hash has no record (held or gone): a
    /// store that just looked it up, an import of distinct hashes.
    pub(super) fn insert_new(&mut self, block: StoredBlock) -> BlockId {
        debug_assert!(self.find(block.engine).is_none(), "{:#x} has a record already", { block.engine });
        let id = match self.free.pop() {
            Some(id) => {
                self.records[id] = block;
                id
            }
            None => {
                // Callers stop at `is_full` (a store drops the rest of its
                // chain; an import refuses the export).
                let id = BlockId::try_from(self.records.len())
                    .ok()
                    .filter(|&id| id <= ID_MASK && (id as usize) < self.most_records)
                    .expect("a free id: callers check is_full");
                self.records.push(block);
                id
            }
        };
        let hash = block.engine.hash();
        let bucket = self.ids.insert_unique(hash, Tagged::new(id, hash), hash_of(&self.records)).bucket_index();
        self.place = Some(Place::of(&mut self.ids, bucket).0);
        id
    }

    /// A gone record, with no children yet, for a block whose engine hash
    /// has no record: an imported block's missing parent.
    pub(super) fn insert_gone(&mut self, engine: EngineBlockHash, seq: SequenceHash) -> BlockId {
        let id = self.insert_new(StoredBlock::new(engine, seq, None, 0));
        self.records[id].children = GONE;
        self.gone += 1;
        id
    }

    /// Holds a gone record's block again, as `block` (same engine hash).
    pub(super) fn revive(&mut self, id: BlockId, block: StoredBlock) {
        let record = &mut self.records[id];
        debug_assert!(!record.is_held() && { record.engine } == { block.engine });
        debug_assert!(block.is_held());
        *record = block;
        self.gone -= 1;
    }

    /// Marks a held block gone: its record stays for its held children.
    pub(super) fn retire(&mut self, id: BlockId) {
        let record = &mut self.records[id];
        debug_assert!(record.is_held() && record.children() > 0);
        record.children |= GONE;
        record.parent = NO_PARENT;
        self.gone += 1;
    }

    /// Frees a record (held or gone) for reuse; no record may name it as
    /// parent. Call `compact_if_sparse` once the caller holds no id.
    pub(super) fn remove(&mut self, id: BlockId) {
        let record = self.records[id];
        let hash = record.engine.hash();
        let Ok(entry) = self.ids.find_entry(hash, |&other| other == Tagged::new(id, hash)) else {
            debug_assert!(false, "id {id} is not in the table");
            return;
        };
        entry.remove();
        if !record.is_held() {
            self.gone -= 1;
        }
        self.free.push(id);
    }

    /// A table left a quarter full is rebuilt dense: records in a fresh
    /// slab (whole chunks), renumbered (parents with them), ids to match,
    /// the free list gone. Every id given out before is void.
    ///
    /// Unlike the index's other tables (`shrunk_capacity`), one past a
    /// single chunk of records is rebuilt, not one past 1,024: a worker
    /// whose cache once held a few hundred blocks would otherwise keep up
    /// to 1,024 records and their ids (38 KiB) for ever, at any budget.
    /// That bounds what a worker costs beyond its blocks (`WORKER_BYTES`);
    /// a rebuild of a few hundred records is a few microseconds.
    pub(super) fn compact_if_sparse(&mut self) {
        if self.ids.is_empty() && self.records.len() > 0 {
            // Nothing held, nothing gone: all of it goes, the last chunk too
            // (a budget too small for its workers' chunks empties them).
            *self = WorkerTable { most_records: self.most_records, ..WorkerTable::default() };
            return;
        }
        if self.records.len() <= CHUNK || self.ids.len() * 4 >= self.records.len() {
            return;
        }
        let live = self.ids.len();
        let mut renumbered = vec![NO_PARENT; self.records.len()];
        let mut records = Slab::with_capacity(live, UNUSED);
        for tagged in self.ids.iter() {
            renumbered[tagged.id() as usize] = records.len() as BlockId;
            records.push(self.records[tagged.id()]);
        }
        for record in records.iter_mut() {
            if let Some(parent) = record.parent() {
                // A parent has a record while a child names it.
                debug_assert_ne!(renumbered[parent as usize], NO_PARENT);
                record.parent = renumbered[parent as usize];
            }
        }
        self.records = records;
        self.free = Vec::new();
        self.ids = HashTable::with_capacity(live + live / 4);
        let mut last = None;
        for (id, record) in self.records.iter().enumerate() {
            let hash = record.engine.hash();
            last = Some(
                self.ids.insert_unique(hash, Tagged::new(id as BlockId, hash), hash_of(&self.records)).bucket_index(),
            );
        }
        self.place = last.map(|bucket| Place::of(&mut self.ids, bucket).0);
    }

    /// See [`Place::prefetch_run`]: the id buckets a lookup of `engine`
    /// starts at (not the record: its id is not known yet).
    #[inline(always)]
    pub(super) fn prefetch_run(&self, engine: EngineBlockHash) {
        if let Some(place) = self.place {
            place.prefetch_run::<Tagged>(engine.hash());
        }
    }
}

#[cfg(test)]
impl WorkerTable {
    /// A table that holds at most `most` records, to reach the limit in a
    /// test.
    pub(super) fn with_most_records(most: usize) -> Self {
        WorkerTable { most_records: most.min(MAX_RECORDS), ..WorkerTable::default() }
    }

    /// Checks what the index relies on, from the records alone, and
    /// returns the held blocks whose parent is gone (the index's `orphans`):
    /// every record in the table is counted as held or gone, names a parent
    /// in the table, and has as many children as held records name it; a
    /// gone record names no parent and has at least one child.
    pub(super) fn assert_links_consistent(&self) -> u64 {
        let in_table: std::collections::HashSet<BlockId> = self.ids.iter().map(|tagged| tagged.id()).collect();
        let mut named = std::collections::HashMap::<BlockId, u32>::new();
        let mut orphans = 0;
        for &tagged in self.ids.iter() {
            let id = tagged.id();
            let record = &self.records[id];
            assert_eq!(tagged, Tagged::new(id, record.engine.hash()), "{:#x}'s hash bits", record.engine());
            assert_eq!(self.find(record.engine()), Some(id), "{:#x} found under its id", record.engine());
            let Some(parent) = record.parent() else { continue };
            assert!(record.is_held(), "gone record {:#x} names a parent", record.engine());
            assert!(in_table.contains(&parent), "{:#x}'s parent is not in the table", record.engine());
            *named.entry(parent).or_default() += 1;
            orphans += u64::from(!self.records[parent].is_held());
        }
        for tagged in self.ids.iter() {
            let id = tagged.id();
            let record = &self.records[id];
            let children = named.get(&id).copied().unwrap_or_default();
            assert_eq!(record.children(), children, "{:#x}'s children", record.engine());
            assert!(record.is_held() || children > 0, "gone record {:#x} has no child", record.engine());
        }
        assert_eq!(self.gone, self.gone().count());
        orphans
    }
}

/// Whether an id names `engine`'s record: the table's equality.
/// The hash bits first: only an entry that has them reads its record.
fn names(records: &Slab<StoredBlock>, engine: EngineBlockHash, hash: u64) -> impl Fn(&Tagged) -> bool + '_ {
    move |&tagged| tagged.may_be(hash) && records[tagged.id()].engine == engine
}

/// The hash of the record an id names: the table's hasher on growth.
fn hash_of(records: &Slab<StoredBlock>) -> impl Fn(&Tagged) -> u64 + '_ {
    |tagged| records[tagged.id()].engine.hash()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(seq: u64, parent: Option<BlockId>, engine: EngineBlockHash) -> StoredBlock {
        StoredBlock::new(engine, SequenceHash(seq), parent, 0)
    }

    fn seq_of(table: &WorkerTable, engine: EngineBlockHash) -> Option<u64> {
        table.get(&engine).map(|b| b.seq.0)
    }

    #[test]
    fn blocks_are_found_removed_and_their_records_reused() {
        let mut table = WorkerTable::default();
        let mut parent = None;
        for engine in 0..5_000u64 {
            let id = table.insert_new(block(engine + 1, parent, engine));
            if let Some(parent) = parent {
                table.at_mut(parent).add_child();
            }
            parent = Some(id);
        }
        assert_eq!(table.len(), 5_000);
        assert_eq!(seq_of(&table, 7), Some(8));
        assert_eq!(table.get(&0).and_then(StoredBlock::parent), None);
        let parent_of_9 = table.get(&9).and_then(StoredBlock::parent).expect("a parent");
        assert_eq!(table.at(parent_of_9).engine(), 8);
        let eight = table.held_id(8).expect("held");
        table.at_mut(eight).add_child();
        assert_eq!(table.get(&8).map(StoredBlock::children), Some(2));
        table.at_mut(eight).remove_child();
        // The leaf goes (nothing names it); its parent loses a child.
        let leaf = table.held_id(4_999).expect("held");
        let parent = table.at(leaf).parent().expect("a parent");
        table.at_mut(parent).remove_child();
        table.remove(leaf);
        assert!(table.held_id(4_999).is_none() && table.find(4_999).is_none() && !table.contains_key(&4_999));
        // The freed record is the next one used: the slab does not grow.
        let slab = table.records.len();
        assert_eq!(table.insert_new(block(1, Some(parent), 1_000_000)), leaf);
        table.at_mut(parent).add_child();
        assert_eq!(table.records.len(), slab);
        assert_eq!(seq_of(&table, 1_000_000), Some(1));
        assert_eq!(table.assert_links_consistent(), 0);
        let mut keys: Vec<u64> = table.keys().collect();
        keys.sort_unstable();
        assert_eq!(keys.len(), 5_000);
        assert!(keys.binary_search(&4_999).is_err() && keys.binary_search(&1_000_000).is_ok());
    }

    #[test]
    fn an_entry_keeps_its_whole_id_and_hash_bits_that_tell_apart_hashes_sharing_a_bucket_and_tag() {
        // Hashes that differ only in the 4 bits an entry carries: same
        // bucket, same tag, told apart by the bits without a record read.
        let base = 0x0123_4567_89ab_cdef_u64;
        let bits = |n: u64| base.hash() & !(0xF << 49) | n << 49;
        assert_eq!(Tagged::new(7, bits(3)).id(), 7);
        assert!(Tagged::new(7, bits(3)).may_be(bits(3)));
        assert!(!Tagged::new(7, bits(3)).may_be(bits(4)));
        assert_eq!(Tagged::new(ID_MASK, u64::MAX).id(), ID_MASK);
        let mut table = WorkerTable::default();
        let ids: Vec<BlockId> = (0..300).map(|i| table.insert_new(block(i, None, 1_000 + i))).collect();
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(table.find(1_000 + i as u64), Some(id));
        }
        assert_eq!(table.find(5), None);
        table.assert_links_consistent();
    }

    #[test]
    fn a_full_table_takes_no_new_record_until_one_is_freed() {
        let mut table = WorkerTable::with_most_records(3);
        let a = table.insert_new(block(1, None, 10));
        let b = table.insert_new(block(2, Some(a), 11));
        assert!(!table.is_full());
        table.at_mut(a).add_child();
        let c = table.insert_new(block(3, Some(b), 12));
        table.at_mut(b).add_child();
        assert!(table.is_full());
        table.at_mut(b).remove_child();
        table.remove(c);
        assert!(!table.is_full(), "a freed record is reused");
        assert_eq!(table.insert_new(block(4, Some(b), 13)), c);
        table.at_mut(b).add_child();
        assert!(table.is_full());
        // A gone record keeps its id: still full.
        table.retire(b);
        assert!(table.is_full());
        assert!(WorkerTable::default().most_records == MAX_RECORDS && MAX_RECORDS == 1 << 28);
    }

    #[test]
    #[should_panic(expected = "a free id")]
    fn a_new_record_in_a_full_table_is_refused_loudly() {
        let mut table = WorkerTable::with_most_records(1);
        table.insert_new(block(1, None, 10));
        table.insert_new(block(2, None, 11));
    }

    #[test]
    fn a_gone_record_is_found_but_not_held_and_is_revived_in_place() {
        let mut table = WorkerTable::default();
        let root = table.insert_new(block(1, None, 10));
        let child = table.insert_new(block(2, Some(root), 11));
        table.at_mut(root).add_child();
        table.retire(root);
        assert_eq!((table.len(), table.find(10), table.held_id(10)), (1, Some(root), None));
        assert!(table.get(&10).is_none() && !table.contains_key(&10));
        assert_eq!(table.keys().collect::<Vec<_>>(), vec![11]);
        let gone: Vec<(u64, u32)> = table.gone().map(|b| (b.seq.0, b.children())).collect();
        assert_eq!(gone, vec![(1, 1)]);
        assert_eq!(table.at(child).parent(), Some(root), "the child still names it");
        assert_eq!(table.assert_links_consistent(), 1, "the child is an orphan");
        table.revive(root, block(5, None, 10).with_children(1));
        assert_eq!((table.len(), seq_of(&table, 10), table.gone().count()), (2, Some(5), 0));
        assert_eq!((table.held_id(10), table.at(child).parent()), (Some(root), Some(root)), "in place");
        assert_eq!(table.assert_links_consistent(), 0);
        // Gone again, then its last child goes: both records freed.
        table.retire(root);
        table.remove(child);
        table.at_mut(root).remove_child();
        table.remove(root);
        assert_eq!((table.len(), table.gone, table.ids.len(), table.free.len()), (0, 0, 0, 2));
    }

    #[test]
    fn a_table_emptied_to_a_quarter_is_rebuilt_dense_and_keeps_every_block_and_parent() {
        let mut table = WorkerTable::default();
        let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Chains of 10: block i's parent is block i - 1 unless i % 10 == 0.
        let mut ids = Vec::new();
        for i in 0..10_000u64 {
            let parent = (i % 10 != 0).then(|| ids[i as usize - 1]);
            ids.push(table.insert_new(block(i, parent, key(i))));
            if let Some(parent) = parent {
                table.at_mut(parent).add_child();
            }
        }
        // Block 5 of chain 0 goes while its child is held: kept, gone (as
        // the index does it: its parent loses a child first).
        table.at_mut(ids[4]).remove_child();
        table.retire(ids[5]);
        let full = table.table_bytes();
        // Whole chains go, leaves first.
        for &id in ids[100..].iter().rev() {
            if let Some(parent) = table.at(id).parent() {
                table.at_mut(parent).remove_child();
            }
            table.remove(id);
        }
        table.compact_if_sparse();
        assert_eq!(table.assert_links_consistent(), 1, "block 6 hangs off the gone block 5");
        assert_eq!((table.len(), table.gone().count()), (99, 1));
        assert_eq!((table.records.len(), table.records.capacity(), table.free.len()), (100, 256, 0));
        assert!((0..100).filter(|&i| i != 5).all(|i| seq_of(&table, key(i)) == Some(i)));
        for i in 0..100u64 {
            let id = table.find(key(i)).expect("a record");
            let parent = table.at(id).parent().map(|p| table.at(p).seq.0);
            let expected = (i % 10 != 0 && i != 5).then(|| i - 1);
            assert_eq!(parent, expected, "block {i}'s parent, renumbered");
        }
        assert!(table.table_bytes() * 4 < full, "{} of {full} bytes", table.table_bytes());
    }

    #[test]
    fn a_worker_that_held_a_few_hundred_blocks_gives_back_all_but_one_chunk() {
        let mut table = WorkerTable::default();
        for i in 0..600u64 {
            table.insert_new(block(i, None, i));
        }
        let full = table.table_bytes();
        // Rebuilt when 149 of the 600 records are left (under a quarter);
        // the ids it gave before are void, so later removals look up.
        for i in 0..460 {
            let id = table.held_id(i).expect("held");
            table.remove(id);
            table.compact_if_sparse();
        }
        assert_eq!((table.len(), table.records.len(), table.records.capacity()), (140, 149, CHUNK));
        assert!(table.table_bytes() * 3 < full, "{} of {full} bytes", table.table_bytes());
        assert!((460..600).all(|i| seq_of(&table, i) == Some(i)));
        // Within one chunk, nothing is rebuilt however empty.
        for i in 460..599 {
            let id = table.held_id(i).expect("held");
            table.remove(id);
            table.compact_if_sparse();
        }
        assert_eq!((table.len(), table.records.len(), table.records.capacity()), (1, 149, CHUNK));
        // Emptied, it keeps nothing.
        table.remove(table.held_id(599).expect("held"));
        table.compact_if_sparse();
        assert_eq!((table.len(), table.ids.capacity(), table.records.capacity(), table.free.capacity()), (0, 0, 0, 0));
        assert_eq!(table.insert_new(block(7, None, 7)), 0, "and starts again from id 0");
        assert_eq!(seq_of(&table, 7), Some(7));
    }

    /// Every id is either in the table or free, never both, and every
    /// record is one or the other; gone records are counted.
    fn assert_ids_partition_the_slab(table: &WorkerTable) {
        let mut seen = vec![false; table.records.len()];
        for id in table.ids.iter().map(|tagged| tagged.id()).chain(table.free.iter().copied()) {
            assert!(!std::mem::replace(&mut seen[id as usize], true), "id {id} twice");
        }
        assert!(seen.iter().all(|&s| s), "an id lost");
        assert_eq!(table.gone, table.gone().count());
    }

    #[test]
    fn random_stores_removals_and_restores_agree_with_a_map_through_growth_and_rebuilds() {
        // A small key space, so keys come back (with other content) after
        // their removal, and the table grows past 1,024 records and empties
        // to a quarter several times.
        let mut table = WorkerTable::default();
        let mut model = std::collections::HashMap::new();
        let mut next = crate::test_rng::xorshift(0x2545_F491_4F6C_DD1D);
        let mut rebuilds = 0;
        for round in 0..120_000u64 {
            // Phases: mostly stores, then mostly removals.
            let storing = (round / 20_000) % 2 == 0;
            let key = next() % 3_000;
            if next() % 10 < if storing { 8 } else { 1 } {
                if let Some(id) = table.held_id(key) {
                    table.remove(id);
                }
                table.insert_new(block(round, None, key));
                model.insert(key, round);
            } else {
                let before = table.records.len();
                let held = table.held_id(key);
                assert_eq!(held.map(|id| table.at(id).seq.0), model.remove(&key));
                if let Some(id) = held {
                    table.remove(id);
                    table.compact_if_sparse();
                }
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
            assert_eq!(seq_of(&table, key), model.get(&key).copied(), "{key}");
        }
        let mut held: Vec<(u64, u64)> = table.values().map(|b| (b.engine, b.seq.0)).collect();
        held.sort_unstable();
        let mut expected: Vec<(u64, u64)> = model.into_iter().collect();
        expected.sort_unstable();
        assert_eq!(held, expected);
    }
}
