//! The admission half of a selection service: which requests are booked
//! (and on which shard), which wait in the queue for capacity, what became
//! of the queued ones, and the counts of it all. The pick itself is
//! [`PickPolicy::decide`](crate::PickPolicy::decide); together they are
//! the state machine every driver runs: the single-threaded
//! [`SelectionService`](crate::SelectionService) owns a ledger, the
//! thread-per-core runtime keeps one behind a lock.
//!
//! Invariant: an id is in at most one of the booked map and the queue, and
//! an id that has left both never comes back (ids are never reused).

use std::collections::HashMap;
use std::time::Duration;

use crate::booking::ReservationId;
use crate::clock::Millis;
use crate::queue::AdmissionQueue;
use crate::request::{Admission, AdmissionEvent, SelectError, SelectRequest, Selection, ServiceStats};

#[derive(Debug)]
pub struct AdmissionLedger {
    /// Booked requests and the shard holding each booking.
    booked: HashMap<ReservationId, usize>,
    queue: AdmissionQueue,
    /// Outcomes of queued requests nobody has collected yet.
    outcomes: Vec<AdmissionEvent>,
    stats: ServiceStats,
}

impl AdmissionLedger {
    /// `capacity`: requests that may wait at once.
    pub fn new(capacity: usize) -> Self {
        AdmissionLedger {
            booked: HashMap::new(),
            queue: AdmissionQueue::new(capacity),
            outcomes: Vec::new(),
            stats: ServiceStats::default(),
        }
    }

    pub fn stats(&self) -> ServiceStats {
        self.stats
    }

    /// Booked requests.
    pub fn active(&self) -> usize {
        self.booked.len()
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// A new request must carry an id neither booked nor waiting.
    pub fn check_new(&self, id: ReservationId) -> Result<(), SelectError> {
        if self.booked.contains_key(&id) || self.queue.contains(id) {
            return Err(SelectError::DuplicateReservation(id));
        }
        Ok(())
    }

    /// Queues a request every eligible worker is too busy for, until
    /// `now + timeout`; refused when the queue is full.
    pub fn enqueue(
        &mut self,
        request: SelectRequest,
        now: Millis,
        timeout: Duration,
    ) -> Result<Admission, SelectError> {
        match self.queue.push(request, now.after(timeout)) {
            Ok(()) => {
                self.stats.queued += 1;
                Ok(Admission::Queued)
            }
            Err(_) => {
                self.stats.refused_queue_full += 1;
                Err(SelectError::QueueFull)
            }
        }
    }

    /// Records `id` as booked on `shard` before the shard books it, so
    /// nothing pushed later can overtake the booking; `Duplicate` if the
    /// id is booked already.
    pub fn claim(&mut self, id: ReservationId, shard: usize) -> Result<(), SelectError> {
        match self.booked.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => Err(SelectError::DuplicateReservation(id)),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(shard);
                Ok(())
            }
        }
    }

    /// The shard booked a claimed request.
    pub fn booked(&mut self, selection: &Selection) {
        self.stats.selections += 1;
        self.stats.past_tpot_target += u64::from(selection.past_tpot_target);
    }

    /// The shard holding `id`'s booking.
    pub fn owner(&self, id: ReservationId) -> Option<usize> {
        self.booked.get(&id).copied()
    }

    /// Forgets `id`'s booking (freed, expired, or never made); returns the
    /// shard that held it.
    pub fn release(&mut self, id: ReservationId) -> Option<usize> {
        self.booked.remove(&id)
    }

    /// Takes `id` out of the queue; whether it was waiting.
    pub fn withdraw(&mut self, id: ReservationId) -> bool {
        self.queue.remove(id).is_some()
    }

    pub fn has_waiting(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Waiting ids in admission order.
    pub fn waiting_ids(&self) -> Vec<ReservationId> {
        self.queue.ids()
    }

    pub fn waiting(&self, id: ReservationId) -> Option<&SelectRequest> {
        self.queue.get(id).map(|w| &w.request)
    }

    /// Refuses every queued request whose deadline passed; returns their
    /// outcomes for the caller to deliver.
    pub fn expire_waiting(&mut self, now: Millis) -> Vec<AdmissionEvent> {
        let late = self.queue.expire(now);
        self.stats.refused_queue_timeout += late.len() as u64;
        late.into_iter()
            .map(|w| AdmissionEvent::Refused { id: w.request.id, error: SelectError::QueueTimeout })
            .collect()
    }

    /// A queued request was admitted with `selection` (its booking already
    /// claimed and made).
    pub fn admitted(&mut self, selection: Selection) -> AdmissionEvent {
        self.stats.admitted_from_queue += 1;
        AdmissionEvent::Admitted(selection)
    }

    /// Keeps an outcome nobody is waiting for, for `take_outcomes`.
    pub fn keep(&mut self, outcome: AdmissionEvent) {
        self.outcomes.push(outcome);
    }

    pub fn take_outcomes(&mut self) -> Vec<AdmissionEvent> {
        std::mem::take(&mut self.outcomes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::Prompt;

    fn request(id: u64) -> SelectRequest {
        SelectRequest {
            id: ReservationId(id),
            prompt: Prompt::load_only(16),
            model: None,
            allowed: None,
            priority: 0,
            sticky: None,
        }
    }

    #[test]
    fn an_id_is_booked_or_waiting_never_both_and_never_twice() {
        let mut ledger = AdmissionLedger::new(1);
        ledger.claim(ReservationId(1), 3).unwrap();
        assert_eq!(ledger.check_new(ReservationId(1)), Err(SelectError::DuplicateReservation(ReservationId(1))));
        assert_eq!(ledger.claim(ReservationId(1), 0), Err(SelectError::DuplicateReservation(ReservationId(1))));
        assert_eq!(ledger.enqueue(request(2), Millis(0), Duration::from_secs(1)), Ok(Admission::Queued));
        assert_eq!(ledger.check_new(ReservationId(2)), Err(SelectError::DuplicateReservation(ReservationId(2))));
        // Full: refused and counted, nothing changes.
        assert_eq!(ledger.enqueue(request(3), Millis(0), Duration::from_secs(1)), Err(SelectError::QueueFull));
        assert_eq!((ledger.active(), ledger.queue_len()), (1, 1));
        assert_eq!(ledger.owner(ReservationId(1)), Some(3));
        assert_eq!(ledger.release(ReservationId(1)), Some(3));
        assert_eq!(ledger.release(ReservationId(1)), None);
        assert!(ledger.withdraw(ReservationId(2)));
        assert!(!ledger.withdraw(ReservationId(2)));
        let stats = ledger.stats();
        assert_eq!((stats.queued, stats.refused_queue_full), (1, 1));
    }

    #[test]
    fn late_requests_are_refused_in_order_and_outcomes_are_kept_until_taken() {
        let mut ledger = AdmissionLedger::new(4);
        for id in 1..=3 {
            ledger.enqueue(request(id), Millis(id * 10), Duration::from_millis(100)).unwrap();
        }
        let refused = ledger.expire_waiting(Millis(125));
        let ids: Vec<ReservationId> = refused
            .iter()
            .map(|o| match o {
                AdmissionEvent::Refused { id, error: SelectError::QueueTimeout } => *id,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(ids, vec![ReservationId(1), ReservationId(2)]);
        assert_eq!(ledger.waiting_ids(), vec![ReservationId(3)]);
        assert_eq!(ledger.stats().refused_queue_timeout, 2);
        refused.into_iter().for_each(|o| ledger.keep(o));
        assert_eq!(ledger.take_outcomes().len(), 2);
        assert!(ledger.take_outcomes().is_empty());
    }
}
