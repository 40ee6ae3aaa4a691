//! Session affinity: which worker served each client session last.
//!
//! Bounded without a clock or a scan: two generations of at most
//! `capacity / 2` keys each. A key found in the old generation moves to the
//! new one; when the new one is full it becomes the old one and the oldest
//! keys go. A session idle for about `capacity` other sessions' picks is
//! forgotten, which for affinity (a cache's lifetime) is what matters.
//! Keys are stored as 64-bit hashes: a session key is client-chosen text,
//! and this keeps the table's memory independent of it.

use std::collections::HashMap;

use kvpick_core::WorkerId;

pub struct Sessions {
    hasher: ahash::RandomState,
    current: HashMap<u64, WorkerId>,
    previous: HashMap<u64, WorkerId>,
    generation: usize,
}

impl Sessions {
    /// At most `capacity` sessions remembered (at least 2).
    pub fn new(capacity: usize) -> Self {
        Sessions {
            hasher: ahash::RandomState::new(),
            current: HashMap::new(),
            previous: HashMap::new(),
            generation: (capacity / 2).max(1),
        }
    }

    /// The worker that served `key` last.
    pub fn get(&mut self, key: &str) -> Option<WorkerId> {
        let hash = self.hasher.hash_one(key);
        if let Some(worker) = self.current.get(&hash) {
            return Some(*worker);
        }
        let worker = self.previous.remove(&hash)?;
        self.insert_hash(hash, worker);
        Some(worker)
    }

    /// `key` was served by `worker`.
    pub fn insert(&mut self, key: &str, worker: WorkerId) {
        let hash = self.hasher.hash_one(key);
        self.previous.remove(&hash);
        self.insert_hash(hash, worker);
    }

    fn insert_hash(&mut self, hash: u64, worker: WorkerId) {
        if self.current.len() >= self.generation && !self.current.contains_key(&hash) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(hash, worker);
    }

    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_last_worker_and_stays_bounded() {
        let mut s = Sessions::new(4);
        assert_eq!(s.get("a"), None);
        s.insert("a", WorkerId(1));
        s.insert("a", WorkerId(2));
        assert_eq!(s.get("a"), Some(WorkerId(2)));
        for (i, key) in ["b", "c", "d", "e", "f"].into_iter().enumerate() {
            s.insert(key, WorkerId(i as u64));
            assert!(s.len() <= 4, "{} sessions", s.len());
        }
        // The oldest went; the most recent stay.
        assert_eq!(s.get("a"), None);
        assert_eq!(s.get("f"), Some(WorkerId(4)));
        assert_eq!(s.get("e"), Some(WorkerId(3)));
    }

    #[test]
    fn a_session_in_use_survives_generations() {
        let mut s = Sessions::new(4);
        s.insert("kept", WorkerId(7));
        for i in 0..100 {
            s.insert(&format!("other {i}"), WorkerId(1));
            assert_eq!(s.get("kept"), Some(WorkerId(7)), "after {i} others");
        }
        assert!(s.len() <= 4);
    }
}
