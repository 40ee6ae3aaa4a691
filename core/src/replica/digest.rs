//! An order-free summary of a live booking set, so two replicas can check
//! they agree without sending the set.

use xxhash_rust::xxh3::xxh3_64;

use crate::booking::ReservationId;
use crate::worker::WorkerId;

/// Count and wrapping sum of one hash per booking: adding and removing
/// are O(1), and the order bookings came in does not matter. The lease is
/// left out (it is counted differently on each clock); what a booking
/// loads is fixed by its id, worker and whether prefill is over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveDigest {
    pub live: u64,
    pub sum: u64,
}

impl LiveDigest {
    pub fn add(&mut self, id: ReservationId, worker: WorkerId, prefill_done: bool) {
        self.live += 1;
        self.sum = self.sum.wrapping_add(item(id, worker, prefill_done));
    }

    pub fn remove(&mut self, id: ReservationId, worker: WorkerId, prefill_done: bool) {
        self.live -= 1;
        self.sum = self.sum.wrapping_sub(item(id, worker, prefill_done));
    }

    /// A live booking's prefill is over.
    pub fn complete_prefill(&mut self, id: ReservationId, worker: WorkerId) {
        self.remove(id, worker, false);
        self.add(id, worker, true);
    }
}

fn item(id: ReservationId, worker: WorkerId, prefill_done: bool) -> u64 {
    let mut bytes = [0u8; 17];
    bytes[..8].copy_from_slice(&id.0.to_le_bytes());
    bytes[8..16].copy_from_slice(&worker.0.to_le_bytes());
    bytes[16] = u8::from(prefill_done);
    xxh3_64(&bytes)
}
