//! The sharded service's admission state: kvpick-core's ledger (booked
//! requests and their shards, the queue, outcomes, counts) and the callers
//! awaiting their queued requests, behind one lock that the service and
//! the shard threads (which release what their leases expire) share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kvpick_core::{AdmissionEvent, AdmissionLedger, ReservationId};

pub(crate) type Admissions = Arc<Mutex<Ledger>>;

pub(crate) struct Ledger {
    pub ledger: AdmissionLedger,
    /// Callers of `select_and_wait` whose request is queued: their outcome
    /// goes to them instead of the ledger's outcomes.
    pub waiters: HashMap<ReservationId, oneshot::Sender<AdmissionEvent>>,
}

impl Ledger {
    pub(crate) fn new(queue_capacity: usize) -> Self {
        Ledger { ledger: AdmissionLedger::new(queue_capacity), waiters: HashMap::new() }
    }

    /// Delivers a queued request's outcome to its waiter, or keeps it.
    pub(crate) fn settle(&mut self, outcome: AdmissionEvent) {
        let id = match &outcome {
            AdmissionEvent::Admitted(selection) => selection.id,
            AdmissionEvent::Refused { id, .. } => *id,
        };
        match self.waiters.remove(&id) {
            Some(waiter) => {
                if let Err(unsent) = waiter.send(outcome) {
                    // The waiter gave up (its stream ended): keep the
                    // outcome visible so an admitted booking is not lost.
                    self.ledger.keep(unsent.into_inner());
                }
            }
            None => self.ledger.keep(outcome),
        }
    }
}
