//! The holder table, `sequence hash → slots holding it`, with prefetch.
//!
//! A lookup through a map is a full probe that keeps the core waiting for
//! its load, so a round of lookups has only about two cache misses in
//! flight (perf/results/2026-12-05-halves-and-event-window.md). A prefetch
//! of the bucket a key hashes to retires at once: a round prefetches all
//! its keys first, and their misses overlap.
//!
//! hashbrown's `HashTable` gives bucket indices but not addresses; the
//! address of one full bucket and its index place the others (hashbrown
//! stores bucket `i` at `data_end - (i + 1) × size`, control byte `i` at
//! `data_end + i`). That is hashbrown's layout, not its API: were it to
//! change, prefetches would miss their target and cost a wasted load,
//! never a wrong answer, since nothing is read through those addresses.

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::hashing::SequenceHash;
use crate::slot_set::SlotSet;

type Bucket = (SequenceHash, SlotSet);

/// Sequence hashes are xxh3 outputs, uniform already: the table hashes
/// with the key itself.
fn hash(seq: SequenceHash) -> u64 {
    seq.0
}

#[derive(Default, Debug)]
pub(super) struct Holders {
    table: HashTable<Bucket>,
    /// `data_end` and the bucket mask of the table's allocation when last
    /// placed (`None`: empty, or not placed since it moved).
    place: Option<(usize, usize)>,
}

impl Holders {
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Heap bytes: buckets and one control byte each.
    pub(super) fn table_bytes(&self) -> usize {
        self.table.num_buckets() * (std::mem::size_of::<Bucket>() + 1)
    }

    pub(super) fn get(&self, seq: &SequenceHash) -> Option<&SlotSet> {
        self.table.find(hash(*seq), |(key, _)| key == seq).map(|(_, set)| set)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &SlotSet> {
        self.table.iter().map(|(_, set)| set)
    }

    /// The set under `seq`, inserted empty if absent. Places the table
    /// by its bucket: cheap, and done whenever an insert may have moved it.
    pub(super) fn entry_or_default(&mut self, seq: SequenceHash) -> &mut SlotSet {
        let index = match self.table.entry(hash(seq), |(key, _)| *key == seq, |(key, _)| hash(*key)) {
            Entry::Occupied(entry) => entry.bucket_index(),
            Entry::Vacant(entry) => entry.insert((seq, SlotSet::default())).bucket_index(),
        };
        let mask = self.table.num_buckets() - 1;
        let bucket = self.table.get_bucket_mut(index).expect("the index was just found or filled");
        let data_end = (std::ptr::from_mut(bucket) as usize) + (index + 1) * std::mem::size_of::<Bucket>();
        self.place = Some((data_end, mask));
        &mut bucket.1
    }

    /// `slot` leaves `seq`'s holders; the entry goes with its last one.
    pub(super) fn release(&mut self, seq: SequenceHash, slot: crate::slot_set::Slot) {
        let Ok(mut entry) = self.table.find_entry(hash(seq), |(key, _)| *key == seq) else { return };
        entry.get_mut().1.remove(slot);
        if entry.get().1.is_empty() {
            entry.remove();
            // A quarter full, it halves to twice its length (see
            // `shrink_if_sparse`); a moved table is placed again later.
            if self.table.capacity() > 1024 && self.table.len() * 4 < self.table.capacity() {
                self.table.shrink_to(self.table.len() * 2, |(key, _)| hash(*key));
                self.place = None;
            }
        }
    }

    /// Asks the CPU for the control byte and the bucket `seq` hashes to.
    #[inline(always)]
    pub(super) fn prefetch(&self, seq: SequenceHash) {
        let Some((data_end, mask)) = self.place else { return };
        let index = hash(seq) as usize & mask;
        prefetch_line(data_end.wrapping_add(index));
        prefetch_line(data_end.wrapping_sub((index + 1) * std::mem::size_of::<Bucket>()));
    }
}

#[inline(always)]
fn prefetch_line(address: usize) {
    // SAFETY: a prefetch reads nothing the program sees and never faults,
    // whatever the address; SSE is in every x86-64 CPU.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `prefetch` aims for every key, against where the table keeps
    /// it: if hashbrown lays buckets out otherwise, this says so.
    fn assert_placed(holders: &Holders) {
        let (data_end, mask) = holders.place.expect("placed by the last insert");
        assert_eq!(mask + 1, holders.table.num_buckets());
        for bucket in holders.table.iter() {
            let key = bucket.0;
            let index = holders.table.find_bucket_index(hash(key), |(k, _)| *k == key).expect("a key it holds");
            let aimed = data_end - (index + 1) * std::mem::size_of::<Bucket>();
            assert_eq!(aimed, std::ptr::from_ref(bucket) as usize, "bucket {index} of {}", mask + 1);
        }
    }

    #[test]
    fn prefetches_aim_at_the_buckets_the_table_keeps_through_growth_and_shrinking() {
        let mut holders = Holders::default();
        let key = |i: u64| SequenceHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for i in 0..10_000 {
            holders.entry_or_default(key(i)).insert((i % 300) as u32);
            if i.is_power_of_two() {
                assert_placed(&holders);
            }
        }
        assert_placed(&holders);
        for i in 0..9_900 {
            holders.release(key(i), (i % 300) as u32);
        }
        assert_eq!(holders.len(), 100);
        assert!(holders.table.num_buckets() <= 1024, "released to a quarter, the table shrinks");
        // Moved by the shrink: not placed until the next insert places it.
        assert_eq!(holders.place, None);
        holders.entry_or_default(key(20_000)).insert(1);
        assert_placed(&holders);
        assert!(holders.get(&key(9_950)).is_some_and(|set| set.contains((9_950 % 300) as u32)));
        assert!(holders.get(&key(5)).is_none());
    }
}
