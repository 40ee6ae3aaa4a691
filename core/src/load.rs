//! A worker's slot table: the load booked on it by active reservations.

use std::collections::HashMap;

use rustc_hash::FxBuildHasher;

use crate::hashing::SequenceHash;

/// Prefill tokens still to compute and KV blocks held by active requests.
///
/// Every booking books a whole chain of sequence hashes from the prompt's
/// first block, so the set of active blocks is closed under "parent of" and
/// the active part of a prompt is always a prefix: found by bisection.
#[derive(Debug, Default)]
pub struct WorkerLoad {
    prefill_tokens: u64,
    /// Reference counts of prompt blocks shared between active requests.
    blocks: HashMap<SequenceHash, u32, FxBuildHasher>,
    /// Blocks with no sequence hash: trailing partial blocks and prompts
    /// booked without tokens. Never shared.
    unhashed_blocks: u64,
    requests: u32,
}

impl WorkerLoad {
    pub fn prefill_tokens(&self) -> u64 {
        self.prefill_tokens
    }

    pub fn active_blocks(&self) -> u64 {
        self.blocks.len() as u64 + self.unhashed_blocks
    }

    pub fn requests(&self) -> u32 {
        self.requests
    }

    pub fn is_idle(&self) -> bool {
        self.requests == 0 && self.prefill_tokens == 0 && self.active_blocks() == 0
    }

    /// How many leading blocks of `seq` are already active here.
    pub fn active_prefix(&self, seq: &[SequenceHash]) -> usize {
        if self.blocks.is_empty() {
            return 0;
        }
        seq.partition_point(|s| self.blocks.contains_key(s))
    }

    pub fn book(&mut self, seq: &[SequenceHash], unhashed_blocks: u32, prefill_tokens: u32) {
        for s in seq {
            *self.blocks.entry(*s).or_default() += 1;
        }
        self.unhashed_blocks += u64::from(unhashed_blocks);
        self.prefill_tokens += u64::from(prefill_tokens);
        self.requests += 1;
    }

    pub fn complete_prefill(&mut self, prefill_tokens: u32) {
        self.prefill_tokens -= u64::from(prefill_tokens);
    }

    /// Undoes `book`; `prefill_tokens` is what is still booked as prefill
    /// (zero once prefill completed).
    pub fn release(&mut self, seq: &[SequenceHash], unhashed_blocks: u32, prefill_tokens: u32) {
        for s in seq {
            if let Some(refs) = self.blocks.get_mut(s) {
                *refs -= 1;
                if *refs == 0 {
                    self.blocks.remove(s);
                }
            }
        }
        self.unhashed_blocks -= u64::from(unhashed_blocks);
        self.prefill_tokens -= u64::from(prefill_tokens);
        self.requests -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(n: u64) -> Vec<SequenceHash> {
        (1..=n).map(SequenceHash).collect()
    }

    #[test]
    fn shared_prefix_blocks_are_counted_once() {
        let mut load = WorkerLoad::default();
        let a = seqs(4);
        let b = [&a[..2], &[SequenceHash(100)]].concat();
        load.book(&a, 1, 70);
        load.book(&b, 0, 10);
        assert_eq!(load.active_blocks(), 4 + 1 + 1);
        assert_eq!(load.active_prefix(&b), 3);
        assert_eq!(load.active_prefix(&[SequenceHash(1), SequenceHash(7)]), 1);
        assert_eq!(load.prefill_tokens(), 80);
        load.complete_prefill(70);
        load.release(&a, 1, 0);
        assert_eq!(load.active_blocks(), 3);
        assert_eq!(load.requests(), 1);
        load.release(&b, 0, 10);
        assert!(load.is_idle());
    }
}
