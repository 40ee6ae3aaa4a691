//! The index's holder table: sequence hash → slots holding that prefix.
//!
//! An open-addressing table with ordered linear probing, written for this
//! one use instead of taking `HashMap` because a block's bucket must be
//! known by address before it is read: `prefetch` asks the CPU for it
//! without waiting, so a lookup can start the cache misses of all its jump
//! points at once (a live router's holder table is tens of MB and churned,
//! so most probes miss; perf/README.md, "cold probes").
//!
//! Layout: one array of 24-byte buckets (a key and a [`SlotSet`]). A key is
//! the sequence hash times an odd constant (a bijection, so structured
//! hashes spread too), and its home bucket is the key's top bits. Buckets
//! are kept sorted by key, each at or after its home with no empty bucket
//! in between, so a lookup scans from the home while keys are smaller and
//! stops at the first key not smaller: a miss costs what a hit does, even
//! at 7/8 full. An empty bucket holds the largest key, which stops every
//! scan; the sequence hash that maps to it lives beside the array.

use crate::hashing::SequenceHash;
use crate::slot_set::{Slot, SlotSet};

/// Odd, so multiplying by it is a bijection on u64 (2^64 / golden ratio).
const SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;

/// The key of an empty bucket.
const EMPTY: u64 = u64::MAX;

/// Fewest home buckets; the array has `ROOM` more at its end.
const MIN_HOMES: usize = 64;

/// Buckets past the last home: a run of displaced keys may spill there.
/// An insert that would need more adds as many again.
const ROOM: usize = 64;

#[derive(Clone, Debug)]
struct Bucket {
    key: u64,
    set: SlotSet,
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 24);

impl Bucket {
    const VACANT: Bucket = Bucket { key: EMPTY, set: SlotSet::Bits(0) };
}

#[derive(Debug)]
pub(super) struct HolderMap {
    /// `homes + ROOM` buckets, or more where runs spilled further.
    buckets: Vec<Bucket>,
    /// log2 of the number of home buckets.
    bits: u32,
    /// Occupied buckets, not counting `at_empty`.
    len: usize,
    /// Holders of the one sequence hash whose key is `EMPTY`.
    at_empty: Option<SlotSet>,
}

impl Default for HolderMap {
    fn default() -> Self {
        HolderMap::with_homes(MIN_HOMES)
    }
}

fn key_of(seq: SequenceHash) -> u64 {
    seq.0.wrapping_mul(SPREAD)
}

impl HolderMap {
    fn with_homes(homes: usize) -> Self {
        debug_assert!(homes.is_power_of_two());
        HolderMap { buckets: vec![Bucket::VACANT; homes + ROOM], bits: homes.trailing_zeros(), len: 0, at_empty: None }
    }

    fn homes(&self) -> usize {
        1 << self.bits
    }

    fn home(&self, key: u64) -> usize {
        // `bits` ≥ 6: the shift is below 64.
        (key >> (64 - self.bits)) as usize
    }

    /// Distinct sequence hashes held.
    pub(super) fn len(&self) -> usize {
        self.len + usize::from(self.at_empty.is_some())
    }

    /// Where `key` is, or where it would go: the first bucket from its
    /// home whose key is not smaller.
    fn position(&self, key: u64) -> usize {
        let mut i = self.home(key);
        // The last bucket is always vacant (inserts never fill it), and a
        // vacant key is the largest: the scan stops inside the array.
        while self.buckets[i].key < key {
            i += 1;
        }
        i
    }

    pub(super) fn get(&self, seq: SequenceHash) -> Option<&SlotSet> {
        let key = key_of(seq);
        if key == EMPTY {
            return self.at_empty.as_ref();
        }
        let bucket = &self.buckets[self.position(key)];
        (bucket.key == key).then_some(&bucket.set)
    }

    /// Starts loading `seq`'s home bucket into the cache, without waiting.
    pub(super) fn prefetch(&self, seq: SequenceHash) {
        let bucket: *const Bucket = &self.buckets[self.home(key_of(seq))];
        // SAFETY: a prefetch is a hint: it never faults or reads into the
        // program, whatever the address; SSE is part of every x86-64 CPU.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(bucket.cast())
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = bucket;
    }

    /// Adds `slot` to `seq`'s holders; false if it was one already.
    pub(super) fn add(&mut self, seq: SequenceHash, slot: Slot) -> bool {
        let key = key_of(seq);
        if key == EMPTY {
            let set = self.at_empty.get_or_insert_with(SlotSet::default);
            return add_to(set, slot);
        }
        let at = self.position(key);
        if self.buckets[at].key == key {
            return add_to(&mut self.buckets[at].set, slot);
        }
        if (self.len + 1) * 8 > self.homes() * 7 {
            self.resize(self.homes() * 2);
            return self.add(seq, slot);
        }
        // The run from `at` moves one bucket right into the first vacant
        // one; the last bucket must stay vacant (it ends every scan).
        let Some(vacant) = self.buckets[at..self.buckets.len() - 1].iter().position(|b| b.key == EMPTY) else {
            // The run reaches the end: more spill room (only keys crowding
            // the last homes do this; hashes almost never).
            let more = self.buckets.len() + ROOM;
            self.buckets.resize(more, Bucket::VACANT);
            return self.add(seq, slot);
        };
        self.buckets[at..=at + vacant].rotate_right(1);
        let mut set = SlotSet::default();
        set.insert(slot);
        self.buckets[at] = Bucket { key, set };
        self.len += 1;
        true
    }

    /// Takes `slot` out of `seq`'s holders, forgetting `seq` once none is
    /// left; false if `slot` did not hold it.
    pub(super) fn remove(&mut self, seq: SequenceHash, slot: Slot) -> bool {
        let key = key_of(seq);
        if key == EMPTY {
            let Some(set) = &mut self.at_empty else { return false };
            let held = set.contains(slot);
            set.remove(slot);
            if set.is_empty() {
                self.at_empty = None;
            }
            return held;
        }
        let at = self.position(key);
        let bucket = &mut self.buckets[at];
        if bucket.key != key || !bucket.set.contains(slot) {
            return false;
        }
        bucket.set.remove(slot);
        if bucket.set.is_empty() {
            self.vacate(at);
            self.shrink_if_sparse();
        }
        true
    }

    /// Empties bucket `at`, moving back the displaced keys after it so no
    /// vacant bucket lies between a key's home and the key.
    fn vacate(&mut self, at: usize) {
        let mut end = at + 1;
        while self.buckets[end].key != EMPTY && self.home(self.buckets[end].key) < end {
            end += 1;
        }
        self.buckets[at..end].rotate_left(1);
        self.buckets[end - 1] = Bucket::VACANT;
        self.len -= 1;
    }

    /// A table a quarter full halves, as `shrink_if_sparse` does for the
    /// index's other tables (a burst's memory is given back).
    fn shrink_if_sparse(&mut self) {
        const SMALL: usize = 1024;
        if self.homes() > SMALL && self.len * 4 < self.homes() {
            self.resize(self.homes() / 2);
        }
    }

    /// Rebuilds with `homes` home buckets. The keys are sorted already, so
    /// each goes at its home or right after the previous one.
    fn resize(&mut self, homes: usize) {
        let mut next = HolderMap::with_homes(homes.max(MIN_HOMES));
        let needed = next.end_of(self.buckets.iter().map(|b| b.key).filter(|key| *key != EMPTY)) + 1;
        if needed > next.buckets.len() {
            next.buckets.resize(needed, Bucket::VACANT);
        }
        let mut free = 0;
        for bucket in std::mem::take(&mut self.buckets) {
            if bucket.key != EMPTY {
                let at = next.home(bucket.key).max(free);
                next.buckets[at] = bucket;
                next.len += 1;
                free = at + 1;
            }
        }
        next.at_empty = self.at_empty.take();
        *self = next;
    }

    /// One past the last bucket `keys` (sorted) take in this table.
    fn end_of(&self, keys: impl Iterator<Item = u64>) -> usize {
        keys.fold(0, |free, key| self.home(key).max(free) + 1)
    }

    /// Every holder set, in no particular order.
    pub(super) fn sets(&self) -> impl Iterator<Item = &SlotSet> {
        self.buckets.iter().filter(|b| b.key != EMPTY).map(|b| &b.set).chain(self.at_empty.as_ref())
    }

    /// Bytes the table holds: its buckets, and the sets spilled to the heap.
    pub(super) fn bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<Bucket>() + self.sets().map(SlotSet::heap_bytes).sum::<usize>()
    }
}

fn add_to(set: &mut SlotSet, slot: Slot) -> bool {
    if set.contains(slot) {
        return false;
    }
    set.insert(slot);
    true
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use super::*;

    /// The sequence hash whose key is `key` (SPREAD's inverse mod 2^64).
    fn seq_with_key(key: u64) -> SequenceHash {
        let mut inverse: u64 = SPREAD; // Newton: each step doubles the bits right.
        for _ in 0..6 {
            inverse = inverse.wrapping_mul(2u64.wrapping_sub(SPREAD.wrapping_mul(inverse)));
        }
        SequenceHash(key.wrapping_mul(inverse))
    }

    /// Random adds and removes of `keys` agree with a map of sets, and the
    /// table's invariants hold after each.
    fn agrees_with_a_plain_map(keys: &[SequenceHash], ops: usize, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut map = HolderMap::default();
        let mut model: HashMap<u64, BTreeSet<Slot>> = HashMap::new();
        for op in 0..ops {
            let seq = keys[rng.usize(..keys.len())];
            let slot = rng.u32(..100);
            // Mostly adds while growing, mostly removes after: both resizes.
            let adding = rng.usize(..ops) > op;
            if adding {
                let new = model.entry(seq.0).or_default().insert(slot);
                assert_eq!(map.add(seq, slot), new);
            } else {
                let held = model.get_mut(&seq.0).is_some_and(|set| set.remove(&slot));
                if model.get(&seq.0).is_some_and(BTreeSet::is_empty) {
                    model.remove(&seq.0);
                }
                assert_eq!(map.remove(seq, slot), held);
            }
            assert_eq!(map.len(), model.len());
            if op % 97 == 0 {
                check(&map, &model, keys);
            }
        }
        check(&map, &model, keys);
    }

    fn check(map: &HolderMap, model: &HashMap<u64, BTreeSet<Slot>>, keys: &[SequenceHash]) {
        for seq in keys {
            let got: Option<BTreeSet<Slot>> = map.get(*seq).map(|set| set.iter().collect());
            assert_eq!(got.as_ref(), model.get(&seq.0), "holders of {seq:?}");
        }
        let occupied: Vec<(usize, u64)> =
            map.buckets.iter().enumerate().filter(|(_, b)| b.key != EMPTY).map(|(i, b)| (i, b.key)).collect();
        assert!(occupied.windows(2).all(|w| w[0].1 < w[1].1), "keys sorted");
        for &(i, key) in &occupied {
            let home = map.home(key);
            assert!(home <= i, "a key sits at or after its home");
            assert!(map.buckets[home..i].iter().all(|b| b.key != EMPTY), "no hole between a key's home and it");
        }
        assert_eq!(map.buckets.last().map(|b| b.key), Some(EMPTY), "the last bucket stays vacant");
        assert!(occupied.iter().all(|(i, _)| !map.buckets[*i].set.is_empty()), "no empty set is kept");
    }

    #[test]
    fn random_hashes_agree_with_a_plain_map() {
        let keys: Vec<SequenceHash> = (0..5_000).map(|i| SequenceHash(fastrand::Rng::with_seed(i).u64(..))).collect();
        agrees_with_a_plain_map(&keys, 60_000, 1);
    }

    #[test]
    fn structured_keys_agree_too() {
        // Small integers, a key that is the vacant marker, and keys that
        // crowd the last homes (runs spill past them into the spare room).
        let mut keys: Vec<SequenceHash> = (0..2_000).map(SequenceHash).collect();
        keys.push(seq_with_key(EMPTY));
        keys.extend((1..300).map(|i| seq_with_key(EMPTY - i)));
        agrees_with_a_plain_map(&keys, 40_000, 2);
    }

    #[test]
    fn a_drained_table_gives_its_memory_back() {
        let mut map = HolderMap::default();
        let keys: Vec<SequenceHash> = (0..100_000).map(|i| SequenceHash(fastrand::Rng::with_seed(i).u64(..))).collect();
        for seq in &keys {
            map.add(*seq, 3);
        }
        let full = map.bytes();
        for seq in &keys[100..] {
            assert!(map.remove(*seq, 3));
        }
        assert_eq!(map.len(), 100);
        assert!(map.bytes() * 16 < full, "{} bytes left of {full}", map.bytes());
        assert!(keys[..100].iter().all(|seq| map.get(*seq).is_some_and(|set| set.contains(3))));
    }
}
