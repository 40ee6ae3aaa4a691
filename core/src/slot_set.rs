//! A set of shard-local worker slots.
//!
//! Every KV block in a shard's index carries the set of slots holding it, so
//! the set must be small: one inline word covers the first 64 slots (a shard
//! hands out the lowest free slot first, so most shards never spill), and a
//! heap bitmap takes over beyond that.

/// Index of a worker inside one shard; dense, reused after a worker leaves.
pub type Slot = u32;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotSet {
    Inline(u64),
    Spilled(Box<Vec<u64>>),
}

impl Default for SlotSet {
    fn default() -> Self {
        SlotSet::Inline(0)
    }
}

impl SlotSet {
    pub fn single(slot: Slot) -> Self {
        let mut set = SlotSet::default();
        set.insert(slot);
        set
    }

    fn words(&self) -> &[u64] {
        match self {
            SlotSet::Inline(word) => std::slice::from_ref(word),
            SlotSet::Spilled(words) => words,
        }
    }

    fn words_mut(&mut self, min_len: usize) -> &mut [u64] {
        if min_len > 1 {
            if let SlotSet::Inline(word) = *self {
                let mut words = vec![0; min_len];
                words[0] = word;
                *self = SlotSet::Spilled(Box::new(words));
            }
        }
        match self {
            SlotSet::Inline(word) => std::slice::from_mut(word),
            SlotSet::Spilled(words) => {
                if words.len() < min_len {
                    words.resize(min_len, 0);
                }
                words
            }
        }
    }

    pub fn insert(&mut self, slot: Slot) {
        let (word, bit) = (slot as usize / 64, slot % 64);
        self.words_mut(word + 1)[word] |= 1 << bit;
    }

    pub fn remove(&mut self, slot: Slot) {
        let (word, bit) = (slot as usize / 64, slot % 64);
        match self {
            SlotSet::Inline(w) if word == 0 => *w &= !(1 << bit),
            SlotSet::Inline(_) => {}
            SlotSet::Spilled(words) => {
                if let Some(w) = words.get_mut(word) {
                    *w &= !(1 << bit);
                }
            }
        }
    }

    pub fn contains(&self, slot: Slot) -> bool {
        let (word, bit) = (slot as usize / 64, slot % 64);
        self.words().get(word).is_some_and(|w| w & (1 << bit) != 0)
    }

    pub fn is_empty(&self) -> bool {
        self.words().iter().all(|w| *w == 0)
    }

    pub fn len(&self) -> usize {
        self.words().iter().map(|w| w.count_ones() as usize).sum()
    }

    /// `self ∩= other`.
    pub fn intersect(&mut self, other: &SlotSet) {
        let theirs = other.words();
        match self {
            SlotSet::Inline(w) => *w &= theirs[0],
            SlotSet::Spilled(words) => {
                for (i, w) in words.iter_mut().enumerate() {
                    *w &= theirs.get(i).copied().unwrap_or(0);
                }
            }
        }
    }

    /// `self −= other`.
    pub fn subtract(&mut self, other: &SlotSet) {
        let theirs = other.words();
        match self {
            SlotSet::Inline(w) => *w &= !theirs[0],
            SlotSet::Spilled(words) => {
                for (w, t) in words.iter_mut().zip(theirs) {
                    *w &= !t;
                }
            }
        }
    }

    /// `self ∩ other` as a new set.
    pub fn and(&self, other: &SlotSet) -> SlotSet {
        let mut out = self.clone();
        out.intersect(other);
        out
    }

    pub fn iter(&self) -> impl Iterator<Item = Slot> + '_ {
        self.words().iter().enumerate().flat_map(|(i, &word)| {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_spilled_sets_behave_alike() {
        let mut a = SlotSet::default();
        for slot in [0, 5, 63, 64, 200] {
            a.insert(slot);
        }
        assert!(matches!(a, SlotSet::Spilled(_)));
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 5, 63, 64, 200]);
        assert_eq!(a.len(), 5);
        let mut b = SlotSet::single(5);
        b.insert(200);
        assert_eq!(a.and(&b).iter().collect::<Vec<_>>(), vec![5, 200]);
        b.intersect(&a);
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![5, 200]);
        a.subtract(&b);
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 63, 64]);
        a.remove(64);
        a.remove(1000);
        assert!(a.contains(63) && !a.contains(64) && !a.contains(1000));
        let mut inline = SlotSet::single(3);
        inline.intersect(&a);
        assert!(inline.is_empty());
        inline.remove(70);
        assert!(inline.is_empty());
    }
}
