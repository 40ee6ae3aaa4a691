//! Lost and repeated events of a drained TensorRT-LLM stream, from their ids.
//!
//! Each attention-DP rank's KV cache manager numbers its events from 0, one
//! by one (`mEventId++`), and keeps at most `event_buffer_max_size` of them
//! until drained: when the buffer is full the **oldest** are discarded. So,
//! per rank, ids answered by successive drains must follow on; a jump
//! forward is events the engine threw away before anyone drained them (the
//! poller was too slow, or another client drained them), and a step back is
//! a new KV cache manager: the engine restarted.
//!
//! The first answer seen of a rank only sets where its stream stands: what
//! came before kvpick started is not known to be lost.
//!
//! Pure: no I/O and no clock; never panics.

use std::collections::HashMap;

use super::trtllm_json::EventMark;

/// What one answer's ids say about the stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdVerdict {
    /// Events skipped over: never seen, never to be seen.
    pub lost: u64,
    /// Jumps forward (each one a run of lost events).
    pub gaps: u32,
    /// Steps back: a rank's engine started counting again.
    pub restarts: u32,
}

impl IdVerdict {
    /// Whether the worker's blocks can no longer be trusted: a lost removal
    /// would leave a block the engine evicted in the index, a restart leaves
    /// all of them.
    pub fn index_is_stale(&self) -> bool {
        self.gaps > 0 || self.restarts > 0
    }
}

/// The next id expected from each rank of one engine.
#[derive(Clone, Debug, Default)]
pub struct EventIdTracker {
    next: HashMap<Option<u32>, u64>,
}

impl EventIdTracker {
    /// Checks one answer's ids, in answer order, and moves the stream on.
    pub fn check(&mut self, marks: &[EventMark]) -> IdVerdict {
        let mut verdict = IdVerdict::default();
        for mark in marks {
            if let Some(&expected) = self.next.get(&mark.rank) {
                if mark.id > expected {
                    verdict.gaps += 1;
                    verdict.lost = verdict.lost.saturating_add(mark.id - expected);
                } else if mark.id < expected {
                    verdict.restarts += 1;
                }
            }
            self.next.insert(mark.rank, mark.id.saturating_add(1));
        }
        verdict
    }

    /// Forgets every rank's position (the engine is polled afresh).
    pub fn reset(&mut self) {
        self.next.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(ids: &[(Option<u32>, u64)]) -> Vec<EventMark> {
        ids.iter().map(|&(rank, id)| EventMark { rank, id }).collect()
    }

    #[test]
    fn consecutive_answers_lose_nothing() {
        let mut t = EventIdTracker::default();
        // The first answer starts anywhere: earlier events are not "lost".
        assert_eq!(t.check(&marks(&[(None, 40), (None, 41)])), IdVerdict::default());
        assert_eq!(t.check(&[]), IdVerdict::default());
        assert_eq!(t.check(&marks(&[(None, 42)])), IdVerdict::default());
    }

    #[test]
    fn ranks_count_apart() {
        let mut t = EventIdTracker::default();
        let first = marks(&[(Some(0), 0), (Some(1), 0), (Some(0), 1), (Some(1), 1)]);
        assert_eq!(t.check(&first), IdVerdict::default());
        // Rank 1 overflowed: 2..=4 discarded.
        let v = t.check(&marks(&[(Some(0), 2), (Some(1), 5)]));
        assert_eq!(v, IdVerdict { lost: 3, gaps: 1, restarts: 0 });
        assert!(v.index_is_stale());
    }

    #[test]
    fn a_step_back_is_a_restart() {
        let mut t = EventIdTracker::default();
        t.check(&marks(&[(None, 7), (None, 8)]));
        let v = t.check(&marks(&[(None, 0), (None, 1)]));
        assert_eq!(v, IdVerdict { lost: 0, gaps: 0, restarts: 1 });
        // A repeat of the same id is a step back too (a new manager that
        // happens to be at the same count cannot be told apart otherwise).
        assert_eq!(t.check(&marks(&[(None, 1)])).restarts, 1);
        t.reset();
        assert_eq!(t.check(&marks(&[(None, 99)])), IdVerdict::default());
    }

    #[test]
    fn extreme_ids_do_not_overflow() {
        let mut t = EventIdTracker::default();
        t.check(&marks(&[(None, 0)]));
        let v = t.check(&marks(&[(None, u64::MAX), (None, u64::MAX)]));
        assert_eq!(v.lost, u64::MAX - 1);
        // The next id saturates at the top: a repeat there is not a step back.
        assert_eq!((v.gaps, v.restarts), (1, 0));
    }
}
