//! Reservations: the load a selection books on its worker until freed.
//!
//! Every change to a booking is a `BookingEvent`, so a peer replica can
//! apply exactly what this one did.

use std::sync::Arc;

use crate::clock::Millis;
use crate::hashing::SequenceHash;
use crate::worker::WorkerId;

/// Chosen by the caller, unique per request across replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReservationId(pub u64);

#[derive(Clone, Debug, PartialEq)]
pub struct Booking {
    pub id: ReservationId,
    pub worker: WorkerId,
    /// The prompt's blocks, booked as decode blocks until freed.
    pub seq_hashes: Arc<[SequenceHash]>,
    /// Blocks the prompt fills that have no sequence hash.
    pub unhashed_blocks: u32,
    /// Prompt tokens the worker must still compute (not cached there),
    /// booked as prefill load until prefill completes.
    pub prefill_tokens: u32,
    /// Past this, the booking frees itself: a lost free must not leak load.
    pub lease_until: Millis,
}

#[derive(Clone, Debug, PartialEq)]
pub enum BookingEvent {
    Reserved(Booking),
    PrefillComplete(ReservationId),
    Freed(ReservationId),
    /// The request is still answering (a long stream): its lease now ends
    /// at `lease_until`, if that is later than before.
    Renewed {
        id: ReservationId,
        lease_until: Millis,
    },
}

impl BookingEvent {
    pub fn id(&self) -> ReservationId {
        match self {
            BookingEvent::Reserved(b) => b.id,
            BookingEvent::PrefillComplete(id) | BookingEvent::Freed(id) => *id,
            BookingEvent::Renewed { id, .. } => *id,
        }
    }
}
