//! The holder table: each sequence hash a shard holds, and the slots
//! holding it.
//!
//! It is one of the index's two big tables (at the bench's 64 workers, 26
//! of 95.4 bytes per entry with `SlotSet`s, 18 of 87 with words; the
//! per-worker tables took the rest, before their slab), and the only one a
//! lookup reads. A shard of at most 64 slots keeps each
//! block's holders as one word of bits: 16-byte buckets instead of the
//! 24 a [`SlotSet`] takes, so 4 buckets to a cache line instead of 2.7
//! (perf/README, "A one-word holder table"). The shard's 65th slot widens
//! the table once, O(blocks). It is not narrowed again when workers leave:
//! their slots are handed out again first, and a fleet that once had 65
//! workers on a shard is likely to have them again.

use super::placed::Placed;
use crate::hashing::SequenceHash;
use crate::slot_set::{HolderSet, Slot, SlotSet};

/// Slots a one-word table can hold.
const NARROW_SLOTS: usize = 64;

#[derive(Debug)]
pub(super) enum Holders {
    /// Every slot of the shard is below 64.
    Narrow(Placed<SequenceHash, u64>),
    Wide(Placed<SequenceHash, SlotSet>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders::Narrow(Placed::default())
    }
}

impl Holders {
    /// Makes room for a shard of `slots` slots: widens a one-word table
    /// for slot 64 and above.
    pub(super) fn fit(&mut self, slots: usize) {
        let Holders::Narrow(narrow) = self else { return };
        if slots <= NARROW_SLOTS {
            return;
        }
        let mut wide = Placed::default();
        wide.reserve(narrow.len());
        for (&seq, &bits) in narrow.iter() {
            *wide.entry_or_default(seq) = SlotSet::Bits(bits);
        }
        *self = Holders::Wide(wide);
    }

    /// Distinct sequence hashes held.
    pub(super) fn len(&self) -> usize {
        match self {
            Holders::Narrow(table) => table.len(),
            Holders::Wide(table) => table.len(),
        }
    }

    /// Heap bytes: the table, and the sets spilled out of it.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Holders::Narrow(table) => table.table_bytes(),
            Holders::Wide(table) => table.table_bytes() + table.values().map(SlotSet::heap_bytes).sum::<usize>(),
        }
    }

    #[inline]
    pub(super) fn contains(&self, seq: SequenceHash, slot: Slot) -> bool {
        match self {
            Holders::Narrow(table) => table.get(&seq).is_some_and(|set| set.contains(slot)),
            Holders::Wide(table) => table.get(&seq).is_some_and(|set| set.contains(slot)),
        }
    }

    /// Adds `slot` to `seq`'s holders; false if it held it already.
    #[inline]
    pub(super) fn insert(&mut self, seq: SequenceHash, slot: Slot) -> bool {
        fn insert<H: HolderSet>(table: &mut Placed<SequenceHash, H>, seq: SequenceHash, slot: Slot) -> bool {
            let set = table.entry_or_default(seq);
            let new = !set.contains(slot);
            set.insert(slot);
            new
        }
        match self {
            Holders::Narrow(table) => insert(table, seq, slot),
            Holders::Wide(table) => insert(table, seq, slot),
        }
    }

    /// Takes `slot` out of `seq`'s holders, and `seq` out of the table
    /// when none is left.
    #[inline]
    pub(super) fn release(&mut self, seq: SequenceHash, slot: Slot) {
        fn release<H: HolderSet>(table: &mut Placed<SequenceHash, H>, seq: SequenceHash, slot: Slot) {
            table.change_or_remove(&seq, |set| {
                set.remove(slot);
                !set.is_empty()
            });
        }
        match self {
            Holders::Narrow(table) => release(table, seq, slot),
            Holders::Wide(table) => release(table, seq, slot),
        }
    }

    /// See [`Placed::prefetch_run`].
    #[inline(always)]
    pub(super) fn prefetch_run(&self, seq: SequenceHash) {
        match self {
            Holders::Narrow(table) => table.prefetch_run(seq),
            Holders::Wide(table) => table.prefetch_run(seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sixty_fifth_slot_widens_the_table_and_keeps_every_holder() {
        let mut holders = Holders::default();
        let key = |i: u64| SequenceHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for i in 0..5_000u64 {
            assert!(holders.insert(key(i), (i % 64) as Slot));
            assert!(holders.insert(key(i), ((i + 1) % 64) as Slot));
        }
        assert!(!holders.insert(key(7), 7), "held already");
        holders.release(key(3), 3);
        holders.fit(64);
        assert!(matches!(holders, Holders::Narrow(_)), "64 slots fit one word");
        let narrow_bytes = holders.bytes();
        holders.fit(65);
        assert!(matches!(holders, Holders::Wide(_)));
        assert!(holders.bytes() > narrow_bytes, "24-byte buckets");
        assert_eq!(holders.len(), 5_000);
        for i in 0..5_000u64 {
            let (a, b) = ((i % 64) as Slot, ((i + 1) % 64) as Slot);
            assert_eq!((holders.contains(key(i), a), holders.contains(key(i), b)), (i != 3, true), "{i}");
            assert!(!holders.contains(key(i), (i + 2) as Slot % 64));
        }
        assert!(holders.insert(key(9), 200));
        assert!(holders.contains(key(9), 200) && holders.contains(key(9), 9));
        holders.release(key(9), 9);
        holders.release(key(9), 10);
        holders.release(key(9), 200);
        assert_eq!(holders.len(), 4_999, "a block with no holder left goes");
    }
}
