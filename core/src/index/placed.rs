//! Hash tables whose buckets can be prefetched: `Placed`, the holder table
//! (sequence hash → holders), and `Place`, which the per-worker id tables
//! (`worker_table`) use as well.
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
//! never a wrong answer, since nothing is read through those addresses
//! (a unit test below checks the aim).

use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use rustc_hash::FxBuildHasher;

use super::shrunk_capacity;
use crate::event::EngineBlockHash;
use crate::hashing::SequenceHash;

pub(super) trait Key: Copy + Eq {
    fn hash(self) -> u64;
}

/// Our xxh3 outputs, uniform already: a sequence hash hashes as itself.
/// (A warm start imports a peer's sequence hashes as they are; peers are
/// authenticated, and skewed ones would only slow the table.)
impl Key for SequenceHash {
    fn hash(self) -> u64 {
        self.0
    }
}

/// An engine's hash is its scheme, not ours (not always uniform): mixed.
impl Key for EngineBlockHash {
    fn hash(self) -> u64 {
        FxBuildHasher.hash_one(self)
    }
}

#[derive(Debug)]
pub(super) struct Placed<K, V> {
    table: HashTable<(K, V)>,
    /// Where the table's buckets were when last placed (`None`: never
    /// filled, or emptied by a shrink).
    place: Option<Place>,
}

impl<K, V> Default for Placed<K, V> {
    fn default() -> Self {
        Placed { table: HashTable::new(), place: None }
    }
}

impl<K: Key, V> Placed<K, V> {
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Heap bytes: buckets and one control byte each.
    pub(super) fn table_bytes(&self) -> usize {
        self.table.num_buckets() * (std::mem::size_of::<(K, V)>() + 1)
    }

    pub(super) fn get(&self, key: &K) -> Option<&V> {
        self.table.find(key.hash(), |(k, _)| k == key).map(|(_, v)| v)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.table.iter().map(|(k, v)| (k, v))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|(_, v)| v)
    }

    /// Room for `additional` more; placed again by the next insert.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.table.reserve(additional, |(k, _)| k.hash());
        self.place = None;
    }

    /// The value under `key`, inserted by `new` if absent.
    pub(super) fn get_or_insert_with(&mut self, key: K, new: impl FnOnce() -> V) -> &mut V {
        let index = match self.table.entry(key.hash(), |(k, _)| *k == key, |(k, _)| k.hash()) {
            Entry::Occupied(entry) => entry.bucket_index(),
            Entry::Vacant(entry) => entry.insert((key, new())).bucket_index(),
        };
        &mut self.place_by(index).1
    }

    /// Places the table by the full bucket `index` (cheap, and done after
    /// every insert: a grown table moves) and hands that bucket back.
    fn place_by(&mut self, index: usize) -> &mut (K, V) {
        let (place, bucket) = Place::of(&mut self.table, index);
        self.place = Some(place);
        bucket
    }

    /// Changes `key`'s value, if held, and removes it if `change` says it
    /// is not to be kept: one probe, where `get_mut` and then `remove`
    /// took two (removals at 64 workers +0.5-8%, perf/README, "A one-word
    /// holder table").
    pub(super) fn change_or_remove(&mut self, key: &K, change: impl FnOnce(&mut V) -> bool) {
        let Ok(mut entry) = self.table.find_entry(key.hash(), |(k, _)| k == key) else { return };
        if !change(&mut entry.get_mut().1) {
            entry.remove();
            self.shrink_if_sparse();
        }
    }

    fn shrink_if_sparse(&mut self) {
        if let Some(capacity) = shrunk_capacity(self.table.len(), self.table.capacity()) {
            self.table.shrink_to(capacity, |(k, _)| k.hash());
            // Moved: placed again by any bucket left (`None` if none is).
            self.place = None;
            if let Some(index) = self.table.iter_buckets().next() {
                self.place_by(index);
            }
        }
    }

    /// Asks the CPU for the control byte and the bucket `key` hashes to
    /// (its home): where a lookup of a held key starts. Lookups take only
    /// the home: also fetching the next bucket (as `prefetch_run` does) made
    /// a warm `find_matches` 8-10% slower and a cold one no faster.
    #[inline(always)]
    pub(super) fn prefetch_home(&self, key: K) {
        if let Some(place) = self.place {
            place.prefetch_home::<(K, V)>(key.hash());
        }
    }

    /// See [`Place::prefetch_run`].
    #[inline(always)]
    pub(super) fn prefetch_run(&self, key: K) {
        if let Some(place) = self.place {
            place.prefetch_run::<(K, V)>(key.hash());
        }
    }
}

impl<K: Key, V: Default> Placed<K, V> {
    /// The value under `key`, inserted as the default if absent.
    pub(super) fn entry_or_default(&mut self, key: K) -> &mut V {
        self.get_or_insert_with(key, V::default)
    }
}

/// Where a `HashTable`'s buckets are, read off one full bucket: hashbrown
/// stores bucket `i` at `data_end - (i + 1) × size`, control byte `i` at
/// `data_end + i` (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(super) struct Place {
    data_end: usize,
    mask: usize,
}

impl Place {
    /// The table's place, from its full bucket `index`, and that bucket.
    pub(super) fn of<T>(table: &mut HashTable<T>, index: usize) -> (Place, &mut T) {
        let mask = table.num_buckets() - 1;
        let bucket = table.get_bucket_mut(index).expect("the index was just found or filled");
        let data_end = (std::ptr::from_mut(bucket) as usize) + (index + 1) * std::mem::size_of::<T>();
        (Place { data_end, mask }, bucket)
    }

    /// Asks the CPU for the control byte and the bucket `hash` points to.
    #[inline(always)]
    pub(super) fn prefetch_home<T>(self, hash: u64) {
        let index = hash as usize & self.mask;
        prefetch_line(self.data_end.wrapping_add(index));
        prefetch_line(self.data_end.wrapping_sub((index + 1) * std::mem::size_of::<T>()));
    }

    /// `prefetch_home`, and the bucket after the home (below it in memory,
    /// often on another cache line): a new key goes to the first free
    /// bucket from its home, and a held key sits past its home whenever its
    /// home was taken when it came; at the tables' load that is often. For
    /// event apply at 64 workers: +11-24% on every row; at 256, +4-12% on
    /// most rows, one-block stores the same and 64-block stores 3-7% lower.
    /// A second bucket more added nothing (perf/README, "Prefetching the
    /// bucket after the home").
    /// (From the last bucket, a probe wraps to bucket 0; this prefetches
    /// the line below the table instead: a wasted prefetch, never a read.)
    #[inline(always)]
    pub(super) fn prefetch_run<T>(self, hash: u64) {
        const { assert!(2 * std::mem::size_of::<T>() <= 64, "two buckets fit in two cache lines") };
        let (data_end, mask) = (self.data_end, self.mask);
        let index = hash as usize & mask;
        prefetch_line(data_end.wrapping_add(index));
        let size = std::mem::size_of::<T>();
        // The two buckets span at most 64 bytes, so at most two lines.
        let home_end = data_end.wrapping_sub(index * size);
        prefetch_line(home_end.wrapping_sub(2 * size));
        prefetch_line(home_end.wrapping_sub(1));
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
    use crate::slot_set::SlotSet;

    /// Where `prefetch` aims for every key, against where the table keeps
    /// it: if hashbrown lays buckets out otherwise, this says so.
    fn assert_placed<K: Key, V>(placed: &Placed<K, V>) {
        let Place { data_end, mask } = placed.place.expect("placed by the last insert");
        assert_eq!(mask + 1, placed.table.num_buckets());
        for bucket in placed.table.iter() {
            let key = bucket.0;
            let index = placed.table.find_bucket_index(key.hash(), |(k, _)| *k == key).expect("a key it holds");
            let aimed = data_end - (index + 1) * std::mem::size_of::<(K, V)>();
            assert_eq!(aimed, std::ptr::from_ref(bucket) as usize, "bucket {index} of {}", mask + 1);
        }
    }

    #[test]
    fn prefetches_aim_at_the_buckets_the_table_keeps_through_growth_and_shrinking() {
        let mut holders: Placed<SequenceHash, SlotSet> = Placed::default();
        let key = |i: u64| SequenceHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for i in 0..10_000 {
            holders.entry_or_default(key(i)).insert((i % 300) as u32);
            if i.is_power_of_two() {
                assert_placed(&holders);
            }
        }
        assert_placed(&holders);
        for i in 0..9_900 {
            let mut held = false;
            holders.change_or_remove(&key(i), |set| {
                held = set.contains((i % 300) as u32);
                false
            });
            assert!(held, "{i}");
        }
        assert_eq!(holders.len(), 100);
        assert!(holders.table.num_buckets() <= 1024, "emptied to a quarter, the table shrinks");
        // Moved by the shrink, and placed again.
        assert_placed(&holders);
        holders.entry_or_default(key(20_000)).insert(1);
        assert_placed(&holders);
        assert!(holders.get(&key(9_950)).is_some_and(|set| set.contains((9_950 % 300) as u32)));
        assert!(holders.get(&key(5)).is_none());
    }

    #[test]
    fn a_value_changed_to_nothing_goes_in_the_same_probe_and_the_table_shrinks() {
        let mut counts: Placed<SequenceHash, u32> = Placed::default();
        let key = |i: u64| SequenceHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for i in 0..8_000 {
            *counts.entry_or_default(key(i)) = 2;
        }
        for i in 0..8_000 {
            let keep = |count: &mut u32| {
                *count -= 1;
                *count > 0
            };
            counts.change_or_remove(&key(i), keep);
            if i >= 100 {
                counts.change_or_remove(&key(i), keep);
            }
        }
        counts.change_or_remove(&key(9_000), |_| unreachable!("not held"));
        assert_eq!(counts.len(), 100);
        assert!((0..100).all(|i| counts.get(&key(i)) == Some(&1)));
        assert!(counts.table.num_buckets() <= 1024, "emptied to a quarter, the table shrinks");
        assert_placed(&counts);
    }
}
