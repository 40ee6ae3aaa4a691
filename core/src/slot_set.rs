//! Sets of shard-local worker slots: the one each KV block carries, and the
//! one a lookup narrows down.
//!
//! Every block in a shard's index carries the set of slots holding it, so
//! that set must be small: most blocks have one or two holders. A shard of
//! at most 64 slots keeps it as one word of bits (8 bytes; a shard hands
//! out the lowest free slot first). A wider shard keeps a [`SlotSet`]: 16
//! bytes inline for any number of holders below slot 64 and for up to
//! seven holders below slot 65,536 (a sorted list: a block of a 256-worker
//! shard with few holders stays inline), otherwise a heap bitmap. Both are
//! a [`HolderSet`].
//!
//! A lookup's working set ([`Live`]) is a bitmap as wide as the shard:
//! copying, intersecting and comparing it never allocates while the shard
//! has at most 1,024 slots (the index picks the width per lookup).

use crate::hashing::SequenceHash;

/// Index of a worker inside one shard; dense, reused after a worker leaves.
pub type Slot = u32;

/// Slots a list holds before the set spills to a heap bitmap: as many `u16`
/// as fit beside the tag and the length in 16 bytes.
const FEW: usize = 7;

/// A spilled set shrinks back inline at this many holders, not at `FEW`, so
/// a block whose eighth holder comes and goes does not allocate each time.
const UNSPILL_AT: usize = 4;

#[derive(Clone, Debug)]
pub enum SlotSet {
    /// Every holder is below slot 64.
    Bits(u64),
    /// Up to `FEW` holders of any slot below 65,536, sorted, `len` used.
    Few {
        len: u8,
        slots: [u16; FEW],
    },
    Spilled(Box<Vec<u64>>),
}

const _: () = assert!(std::mem::size_of::<SlotSet>() == 16);

impl Default for SlotSet {
    fn default() -> Self {
        SlotSet::Bits(0)
    }
}

impl PartialEq for SlotSet {
    fn eq(&self, other: &SlotSet) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for SlotSet {}

impl FromIterator<Slot> for SlotSet {
    fn from_iter<I: IntoIterator<Item = Slot>>(slots: I) -> Self {
        let mut set = SlotSet::default();
        slots.into_iter().for_each(|slot| set.insert(slot));
        set
    }
}

impl SlotSet {
    pub fn single(slot: Slot) -> Self {
        let mut set = SlotSet::default();
        set.insert(slot);
        set
    }

    /// The bitmap words, empty for a list.
    fn words(&self) -> &[u64] {
        match self {
            SlotSet::Bits(word) => std::slice::from_ref(word),
            SlotSet::Few { .. } => &[],
            SlotSet::Spilled(words) => words,
        }
    }

    /// The list's slots, empty for a bitmap.
    fn few(&self) -> &[u16] {
        match self {
            SlotSet::Few { len, slots } => &slots[..*len as usize],
            _ => &[],
        }
    }

    pub fn insert(&mut self, slot: Slot) {
        let (word, bit) = (slot as usize / 64, slot % 64);
        match self {
            SlotSet::Bits(w) if word == 0 => *w |= 1 << bit,
            SlotSet::Spilled(words) => {
                if words.len() <= word {
                    words.resize(word + 1, 0);
                }
                words[word] |= 1 << bit;
            }
            _ if self.contains(slot) => {}
            _ => match u16::try_from(slot) {
                Ok(narrow) if self.len() < FEW => {
                    let mut slots = [0; FEW];
                    let mut len = 0;
                    for held in self.iter().chain(std::iter::once(slot)) {
                        // Every slot here fits: `narrow` does, and a list or
                        // a word of bits holds nothing above 65,535.
                        slots[len] = held as u16;
                        len += 1;
                    }
                    slots[..len].sort_unstable();
                    debug_assert!(slots[..len].contains(&narrow));
                    *self = SlotSet::Few { len: len as u8, slots };
                }
                _ => {
                    // Spill: the bitmap arm above sets every slot.
                    let mut spilled = SlotSet::Spilled(Box::new(vec![0; word + 1]));
                    for held in self.iter().chain(std::iter::once(slot)) {
                        spilled.insert(held);
                    }
                    *self = spilled;
                }
            },
        }
    }

    pub fn remove(&mut self, slot: Slot) {
        let (word, bit) = (slot as usize / 64, slot % 64);
        match self {
            SlotSet::Bits(w) => {
                if word == 0 {
                    *w &= !(1 << bit);
                }
            }
            SlotSet::Few { len, slots } => {
                let held = &slots[..*len as usize];
                if let Some(at) = held.iter().position(|&s| Slot::from(s) == slot) {
                    slots.copy_within(at + 1..*len as usize, at);
                    *len -= 1;
                    if slots[..*len as usize].iter().all(|&s| s < 64) {
                        *self = self.iter().collect();
                    }
                }
            }
            SlotSet::Spilled(words) => {
                if let Some(w) = words.get_mut(word) {
                    *w &= !(1 << bit);
                }
                if self.len() <= UNSPILL_AT {
                    *self = self.iter().collect();
                }
            }
        }
    }

    pub fn contains(&self, slot: Slot) -> bool {
        let (word, bit) = (slot as usize / 64, slot % 64);
        match self {
            SlotSet::Few { .. } => self.few().iter().any(|&s| Slot::from(s) == slot),
            _ => self.words().get(word).is_some_and(|w| w & (1 << bit) != 0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.few().is_empty() && self.words().iter().all(|w| *w == 0)
    }

    pub fn len(&self) -> usize {
        self.few().len() + self.words().iter().map(|w| w.count_ones() as usize).sum::<usize>()
    }

    /// Heap bytes the set holds besides its 16 inline ones.
    pub fn heap_bytes(&self) -> usize {
        match self {
            SlotSet::Spilled(words) => words.capacity() * 8 + std::mem::size_of::<Vec<u64>>(),
            _ => 0,
        }
    }

    /// Ascending.
    pub fn iter(&self) -> impl Iterator<Item = Slot> + '_ {
        self.few().iter().map(|&s| Slot::from(s)).chain(bits(self.words()))
    }

    /// `among ∩ self`, as wide as `among`.
    pub fn and<B: Bitmap>(&self, among: &Live<B>) -> Live<B> {
        let mut out = Live(B::zeroed(among.0.words().len()));
        let (theirs, ours) = (among.0.words(), out.0.words_mut());
        match self {
            SlotSet::Few { .. } => {
                for &slot in self.few() {
                    let (word, bit) = (slot as usize / 64, slot % 64);
                    if let Some(t) = theirs.get(word) {
                        ours[word] |= t & (1 << bit);
                    }
                }
            }
            _ => {
                for ((o, t), w) in ours.iter_mut().zip(theirs).zip(self.words()) {
                    *o = t & w;
                }
            }
        }
        out
    }
}

/// The slots holding one block of the index, as a lookup reads them.
/// [`SlotSet`] serves any shard. A shard of at most 64 slots keeps a bare
/// word of bits (`u64`) instead: its holder table's buckets are then 16
/// bytes instead of 24, and intersecting is one `&`.
pub trait HolderSet: Default {
    fn insert(&mut self, slot: Slot);
    fn remove(&mut self, slot: Slot);
    fn contains(&self, slot: Slot) -> bool;
    fn is_empty(&self) -> bool;
    /// `among ∩ self`, as wide as `among`.
    fn and<B: Bitmap>(&self, among: &Live<B>) -> Live<B>;
}

impl HolderSet for SlotSet {
    fn insert(&mut self, slot: Slot) {
        SlotSet::insert(self, slot)
    }
    fn remove(&mut self, slot: Slot) {
        SlotSet::remove(self, slot)
    }
    fn contains(&self, slot: Slot) -> bool {
        SlotSet::contains(self, slot)
    }
    fn is_empty(&self) -> bool {
        SlotSet::is_empty(self)
    }
    #[inline(always)]
    fn and<B: Bitmap>(&self, among: &Live<B>) -> Live<B> {
        SlotSet::and(self, among)
    }
}

/// Slots 0 to 63 as bits. The index widens a shard's table to [`SlotSet`]s
/// when it hands out slot 64, before any block can name that slot, so no
/// slot here is past 63. One that were would not be held: its block would
/// keep an empty set and match no one (a debug build asserts instead).
impl HolderSet for u64 {
    fn insert(&mut self, slot: Slot) {
        debug_assert!(slot < 64, "slot {slot} in a one-word holder set");
        *self |= 1u64.checked_shl(slot).unwrap_or(0);
    }
    fn remove(&mut self, slot: Slot) {
        *self &= !1u64.checked_shl(slot).unwrap_or(0);
    }
    fn contains(&self, slot: Slot) -> bool {
        *self & 1u64.checked_shl(slot).unwrap_or(0) != 0
    }
    fn is_empty(&self) -> bool {
        *self == 0
    }
    #[inline(always)]
    fn and<B: Bitmap>(&self, among: &Live<B>) -> Live<B> {
        let mut out = Live(B::zeroed(among.0.words().len()));
        if let (Some(o), Some(t)) = (out.0.words_mut().first_mut(), among.0.words().first()) {
            *o = t & self;
        }
        out
    }
}

/// The slots of a bitmap, ascending.
fn bits(words: &[u64]) -> impl Iterator<Item = Slot> + '_ {
    words.iter().enumerate().flat_map(|(i, &word)| {
        let mut rest = word;
        std::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let bit = rest.trailing_zeros();
            rest &= rest - 1;
            Some(i as Slot * 64 + bit)
        })
    })
}

/// Storage for a [`Live`] set: a fixed array (no allocation, loops the
/// compiler unrolls) or, for shards past the widest array, a vector.
pub trait Bitmap: Clone + PartialEq {
    fn zeroed(words: usize) -> Self;
    fn words(&self) -> &[u64];
    fn words_mut(&mut self) -> &mut [u64];
}

impl<const W: usize> Bitmap for [u64; W] {
    fn zeroed(_: usize) -> Self {
        [0; W]
    }
    fn words(&self) -> &[u64] {
        self
    }
    fn words_mut(&mut self) -> &mut [u64] {
        self
    }
}

impl Bitmap for Vec<u64> {
    fn zeroed(words: usize) -> Self {
        vec![0; words]
    }
    fn words(&self) -> &[u64] {
        self
    }
    fn words_mut(&mut self) -> &mut [u64] {
        self
    }
}

/// A prefix matcher that can work on [`Live`] sets of any width; which one
/// is [`find_matches_by_width`]'s choice.
pub trait MatchByWidth {
    /// Appends `(slot, n)` for every slot holding the first `n ≥ 1` blocks
    /// of `seq`, following slots in sets of type `B` (`words` words wide).
    fn find_matches_in<B: Bitmap>(&self, seq: &[SequenceHash], words: usize, out: &mut Vec<(Slot, u32)>);
}

/// Runs `matcher` with sets wide enough for `slots` slots: on the stack up
/// to 1,024 of them, and the narrowest such width, so the usual shard
/// (≤ 64 workers) works on one word.
pub fn find_matches_by_width<M: MatchByWidth>(
    matcher: &M,
    slots: usize,
    seq: &[SequenceHash],
    out: &mut Vec<(Slot, u32)>,
) {
    match slots.div_ceil(64) {
        0 | 1 => matcher.find_matches_in::<[u64; 1]>(seq, 1, out),
        2..=4 => matcher.find_matches_in::<[u64; 4]>(seq, 4, out),
        5..=16 => matcher.find_matches_in::<[u64; 16]>(seq, 16, out),
        words => matcher.find_matches_in::<Vec<u64>>(seq, words, out),
    }
}

/// The slots a lookup is still following: a bitmap of a fixed width.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Live<B>(B);

impl<B: Bitmap> Live<B> {
    /// Slots of `set` that fit the bitmap (`words` words for a vector; an
    /// array is as wide as its type).
    #[inline]
    pub fn of<H: HolderSet>(set: &H, words: usize) -> Self {
        let mut all = Live(B::zeroed(words));
        all.0.words_mut().fill(u64::MAX);
        set.and(&all)
    }

    pub fn is_empty(&self) -> bool {
        self.0.words().iter().all(|w| *w == 0)
    }

    /// `self −= other`.
    pub fn subtract(&mut self, other: &Live<B>) {
        for (w, t) in self.0.words_mut().iter_mut().zip(other.0.words()) {
            *w &= !t;
        }
    }

    /// Ascending.
    pub fn iter(&self) -> impl Iterator<Item = Slot> + '_ {
        bits(self.0.words())
    }

    /// Appends `(slot, depth)` for every slot, ascending. One word is
    /// emitted by a plain loop: `extend` over [`Live::iter`], an iterator of
    /// unknown length, was an out-of-line call per settled group and 10% of
    /// a 64-worker warm `find_matches`. Wider sets keep `extend`: the loop
    /// over their words made a 256-worker lookup 5-20% slower (perf/README,
    /// "Emitting a lookup's answers").
    #[inline(always)]
    pub fn emit(&self, depth: u32, out: &mut Vec<(Slot, u32)>) {
        match self.0.words() {
            [word] => {
                let mut rest = *word;
                while rest != 0 {
                    out.push((rest.trailing_zeros(), depth));
                    rest &= rest - 1;
                }
            }
            words => out.extend(bits(words).map(|slot| (slot, depth))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(set: &SlotSet) -> Vec<Slot> {
        set.iter().collect()
    }

    #[test]
    fn a_set_stays_inline_until_an_eighth_holder_above_slot_63() {
        let mut set = SlotSet::default();
        for slot in [3, 63] {
            set.insert(slot);
        }
        assert!(matches!(set, SlotSet::Bits(_)));
        for slot in [255, 64, 1000, 65_535, 7] {
            set.insert(slot);
            assert!(matches!(set, SlotSet::Few { .. }), "{slot}");
        }
        set.insert(64);
        assert_eq!(set.len(), 7, "a repeated insert adds nothing");
        assert_eq!(slots(&set), vec![3, 7, 63, 64, 255, 1000, 65_535]);
        set.insert(100);
        assert!(matches!(set, SlotSet::Spilled(_)));
        assert_eq!(slots(&set), vec![3, 7, 63, 64, 100, 255, 1000, 65_535]);
        assert!(set.heap_bytes() > 0);
        for slot in [65_535, 1000, 255] {
            set.remove(slot);
        }
        assert!(matches!(set, SlotSet::Spilled(_)), "five holders: still spilled");
        set.remove(100);
        assert!(matches!(set, SlotSet::Few { .. }), "four holders: inline again");
        assert_eq!(slots(&set), vec![3, 7, 63, 64]);
        set.remove(64);
        assert!(matches!(set, SlotSet::Bits(_)), "all below 64: a word of bits again");
        assert_eq!(slots(&set), vec![3, 7, 63]);
        assert_eq!(set.heap_bytes(), 0);
    }

    #[test]
    fn slots_past_a_list_spill_to_bits_at_once() {
        let mut set = SlotSet::single(70_000);
        assert!(matches!(set, SlotSet::Spilled(_)));
        set.insert(2);
        assert!(set.contains(70_000) && set.contains(2) && !set.contains(3));
        set.remove(70_000);
        assert_eq!(set, SlotSet::single(2));
        assert!(matches!(set, SlotSet::Bits(_)));
    }

    #[test]
    fn removing_what_is_absent_changes_nothing() {
        for mut set in [SlotSet::single(5), [5, 300].into_iter().collect(), SlotSet::single(9_000)] {
            let before = set.clone();
            for slot in [0, 6, 64, 301, 8_999, 1 << 20] {
                set.remove(slot);
            }
            assert_eq!(set, before);
        }
        let mut empty = SlotSet::default();
        empty.remove(70);
        assert!(empty.is_empty());
        assert_eq!(empty.len(), 0);
    }

    #[test]
    fn live_sets_intersect_every_representation() {
        let wide = Live::<[u64; 4]>::of(&[0, 5, 63, 64, 200].into_iter().collect::<SlotSet>(), 4);
        assert_eq!(wide.iter().collect::<Vec<_>>(), vec![0, 5, 63, 64, 200]);
        let bits = SlotSet::single(5);
        let few: SlotSet = [5, 200, 201].into_iter().collect();
        let spilled: SlotSet = [0, 5, 64, 65, 66, 67, 68, 69, 200, 9_000].into_iter().collect();
        assert!(matches!(spilled, SlotSet::Spilled(_)));
        assert_eq!(bits.and(&wide).iter().collect::<Vec<_>>(), vec![5]);
        assert_eq!(few.and(&wide).iter().collect::<Vec<_>>(), vec![5, 200]);
        assert_eq!(spilled.and(&wide).iter().collect::<Vec<_>>(), vec![0, 5, 64, 200]);
        // A narrower lookup drops what it cannot hold; a vector is as good as an array.
        let narrow = Live::<[u64; 1]>::of(&few, 1);
        assert_eq!(narrow.iter().collect::<Vec<_>>(), vec![5]);
        let heap = Live::<Vec<u64>>::of(&spilled, 141);
        assert_eq!(heap.iter().collect::<Vec<_>>(), slots(&spilled));
        let mut rest = heap.clone();
        rest.subtract(&few.and(&heap));
        assert_eq!(rest.iter().collect::<Vec<_>>(), vec![0, 64, 65, 66, 67, 68, 69, 9_000]);
        assert!(!rest.is_empty() && SlotSet::default().and(&heap).is_empty());
        // A word of bits intersects any width in its first word.
        let word: u64 = (1 << 5) | (1 << 6) | (1 << 63);
        assert_eq!(HolderSet::and(&word, &wide).iter().collect::<Vec<_>>(), vec![5, 63]);
        assert_eq!(HolderSet::and(&word, &heap).iter().collect::<Vec<_>>(), vec![5]);
        assert_eq!(Live::<[u64; 1]>::of(&word, 1).iter().collect::<Vec<_>>(), vec![5, 6, 63]);
        assert!(HolderSet::and(&0u64, &wide).is_empty());
    }

    #[test]
    fn a_word_of_bits_is_a_holder_set_of_slots_below_64() {
        let mut word = 0u64;
        for slot in [0, 7, 63, 7] {
            HolderSet::insert(&mut word, slot);
        }
        assert_eq!(word, (1 << 0) | (1 << 7) | (1 << 63));
        assert!(HolderSet::contains(&word, 63) && !HolderSet::contains(&word, 8) && !HolderSet::contains(&word, 64));
        HolderSet::remove(&mut word, 64);
        HolderSet::remove(&mut word, 0);
        HolderSet::remove(&mut word, 7);
        assert_eq!(word, 1 << 63);
        HolderSet::remove(&mut word, 63);
        assert!(HolderSet::is_empty(&word));
    }

    /// Every sequence of inserts and removes agrees with a sorted set.
    #[test]
    fn sets_agree_with_a_plain_set() {
        let mut next = crate::test_rng::xorshift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..200 {
            let (mut set, mut plain) = (SlotSet::default(), std::collections::BTreeSet::new());
            for _ in 0..64 {
                let r = next();
                let slot = [r % 64, r % 300, r % 70_000][(r >> 40) as usize % 3] as Slot;
                if r >> 63 == 0 || plain.len() > 12 {
                    set.remove(slot);
                    plain.remove(&slot);
                } else {
                    set.insert(slot);
                    plain.insert(slot);
                }
                assert_eq!(slots(&set), plain.iter().copied().collect::<Vec<_>>());
                assert_eq!(set.len(), plain.len());
                assert!(plain.iter().all(|&s| set.contains(s)));
                let live = Live::<Vec<u64>>::of(&set, 70_000 / 64 + 1);
                assert_eq!(live.iter().collect::<Vec<_>>(), slots(&set));
                // Every width emits its slots, ascending, after what `out` held.
                let depth = r as u32;
                let expect = |below: Slot| -> Vec<(Slot, u32)> {
                    std::iter::once((9, 9)).chain(plain.range(..below).map(|&s| (s, depth))).collect()
                };
                let mut out = vec![(9, 9)];
                live.emit(depth, &mut out);
                assert_eq!(out, expect(Slot::MAX));
                out.truncate(1);
                Live::<[u64; 4]>::of(&set, 4).emit(depth, &mut out);
                assert_eq!(out, expect(256));
                out.truncate(1);
                Live::<[u64; 1]>::of(&set, 1).emit(depth, &mut out);
                assert_eq!(out, expect(64));
            }
        }
    }
}
