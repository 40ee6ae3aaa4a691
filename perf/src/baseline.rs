//! Naive prefix matching, the baselines kvpick's jump search is measured
//! against: same answers as `KvIndex::find_matches`, no shortcuts.

use std::collections::HashMap;

use kvpick_core::KvIndex;
use kvpick_core::SequenceHash;
use kvpick_core::slot_set::{Bitmap, Live, MatchByWidth, Slot, SlotSet, find_matches_by_width};
use rustc_hash::FxBuildHasher;

/// A copy of a KV index's holder table (sequence hash → slots holding it,
/// the same map and set types as `KvIndex` uses), scanned block by block:
/// one lookup per prompt block until no worker is left. This isolates what
/// the jump search saves from everything else.
#[derive(Default)]
pub struct HolderTable {
    holders: HashMap<SequenceHash, SlotSet, FxBuildHasher>,
    /// One past the highest slot stored: the width of a lookup's sets.
    slots: usize,
}

impl HolderTable {
    pub fn store(&mut self, slot: Slot, hashes: impl IntoIterator<Item = SequenceHash>) {
        for hash in hashes {
            self.holders.entry(hash).or_default().insert(slot);
        }
        self.slots = self.slots.max(slot as usize + 1);
    }

    /// Appends `(slot, depth)` for every slot holding the first block, as
    /// `KvIndex::find_matches` does.
    pub fn find_matches(&self, seq: &[SequenceHash], out: &mut Vec<(Slot, u32)>) {
        find_matches_by_width(self, self.slots, seq, out)
    }
}

impl MatchByWidth for HolderTable {
    fn find_matches_in<B: Bitmap>(&self, seq: &[SequenceHash], words: usize, out: &mut Vec<(Slot, u32)>) {
        let Some(first) = seq.first().and_then(|first| self.holders.get(first)) else { return };
        let mut live = Live::<B>::of(first, words);
        for (depth, hash) in seq.iter().enumerate().skip(1) {
            let still = self.holders.get(hash).unwrap_or(&SlotSet::default()).and(&live);
            if still != live {
                let mut dropped = live;
                dropped.subtract(&still);
                dropped.emit(depth as u32, out);
                live = still;
                if live.is_empty() {
                    return;
                }
            }
        }
        live.emit(seq.len() as u32, out);
    }
}

/// Block-by-block matching through `KvIndex::holds` only: one lookup per
/// (block, still-matching worker). The public API allows nothing cheaper.
#[derive(Default)]
pub struct HoldsScan {
    live: Vec<Slot>,
}

impl HoldsScan {
    pub fn find_matches(&mut self, index: &KvIndex, slots: Slot, seq: &[SequenceHash], out: &mut Vec<(Slot, u32)>) {
        let Some(first) = seq.first() else { return };
        self.live.clear();
        self.live.extend((0..slots).filter(|&slot| index.holds(slot, *first)));
        for (depth, hash) in seq.iter().enumerate().skip(1) {
            if self.live.is_empty() {
                return;
            }
            self.live.retain(|&slot| {
                let holds = index.holds(slot, *hash);
                if !holds {
                    out.push((slot, depth as u32));
                }
                holds
            });
        }
        out.extend(self.live.iter().map(|&slot| (slot, seq.len() as u32)));
    }
}

#[cfg(test)]
mod tests {
    use kvpick_core::HashSeed;
    use kvpick_core::hashing::sequence_hashes;

    use super::*;

    #[test]
    fn naive_scans_agree_with_the_index() {
        let tokens: Vec<u32> = (0..16 * 100).collect();
        let seq = sequence_hashes(&tokens, 16, HashSeed::default());
        let depths = [0usize, 1, 5, 37, 64, 99, 100];
        let mut index = KvIndex::default();
        let mut table = HolderTable::default();
        for (slot, &depth) in depths.iter().enumerate() {
            let slot = slot as Slot;
            index.add_worker(slot);
            if depth > 0 {
                let engine: Vec<u64> = seq[..depth].iter().map(|s| s.0).collect();
                index
                    .store(slot, None, &engine, &tokens[..depth * 16], 16, HashSeed::default())
                    .expect("a chain from the root stores");
            }
            table.store(slot, seq[..depth].iter().copied());
        }
        let sorted = |mut v: Vec<(Slot, u32)>| {
            v.sort();
            v
        };
        let mut expected = Vec::new();
        index.find_matches(&seq, &mut expected);
        let expected = sorted(expected);
        assert_eq!(expected.len(), depths.len() - 1);
        let mut got = Vec::new();
        table.find_matches(&seq, &mut got);
        assert_eq!(sorted(got), expected);
        let mut got = Vec::new();
        HoldsScan::default().find_matches(&index, depths.len() as Slot, &seq, &mut got);
        assert_eq!(sorted(got), expected);
    }
}
