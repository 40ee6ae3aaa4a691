//! The publisher's bounded memory of sent batches, for replay (vLLM's
//! `deque(maxlen=buffer_steps)`).

use std::collections::VecDeque;

/// The last `capacity` batches, by sequence number.
#[derive(Debug)]
pub(crate) struct ReplayBuffer {
    capacity: usize,
    batches: VecDeque<(u64, Vec<u8>)>,
}

impl ReplayBuffer {
    pub(crate) fn new(capacity: usize) -> Self {
        ReplayBuffer { capacity, batches: VecDeque::new() }
    }

    /// Remembers a batch, forgetting the oldest when full.
    pub(crate) fn push(&mut self, seq: u64, payload: Vec<u8>) {
        if self.batches.len() == self.capacity {
            self.batches.pop_front();
        }
        self.batches.push_back((seq, payload));
    }

    /// Every remembered batch with a sequence number ≥ `start`, in order.
    pub(crate) fn since(&self, start: u64) -> impl Iterator<Item = &(u64, Vec<u8>)> {
        self.batches.iter().filter(move |(seq, _)| *seq >= start)
    }

    pub(crate) fn len(&self) -> usize {
        self.batches.len()
    }

    pub(crate) fn clear(&mut self) {
        self.batches.clear();
    }
}
