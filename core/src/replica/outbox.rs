//! This replica's side: numbering its own booking changes for its peers
//! and answering their resync and digest checks.

use std::collections::HashMap;

use crate::booking::{Booking, BookingEvent, ReservationId};
use crate::clock::Millis;

use super::digest::LiveDigest;
use super::{Batch, Digest, Incarnation, PeerBooking, PeerEvent, ReplicaId, Snapshot};

#[derive(Debug)]
struct Live {
    booking: Booking,
    prefill_done: bool,
}

/// Every change to this replica's own bookings, numbered from 1 in this
/// incarnation, plus the live set they add up to (for snapshots).
#[derive(Debug)]
pub struct Outbox {
    origin: ReplicaId,
    incarnation: Incarnation,
    last_seq: u64,
    live: HashMap<ReservationId, Live>,
    digest: LiveDigest,
    pending: Vec<PeerEvent>,
}

impl Outbox {
    pub fn new(origin: ReplicaId, incarnation: Incarnation) -> Self {
        Outbox {
            origin,
            incarnation,
            last_seq: 0,
            live: HashMap::new(),
            digest: LiveDigest::default(),
            pending: Vec::new(),
        }
    }

    pub fn origin(&self) -> ReplicaId {
        self.origin
    }

    /// Takes one of this replica's booking changes, as applied to its own
    /// shards; a lease that expires here is recorded as `Freed`. Returns
    /// false for a change peers need not hear of (a repeat, or about a
    /// booking this replica does not hold).
    pub fn record(&mut self, event: &BookingEvent, now: Millis) -> bool {
        let peer_event = match event {
            BookingEvent::Reserved(booking) => {
                if self.live.contains_key(&booking.id) {
                    return false;
                }
                self.digest.add(booking.id, booking.worker, false);
                self.live.insert(booking.id, Live { booking: booking.clone(), prefill_done: false });
                PeerEvent::Reserved(to_peer(booking, false, now))
            }
            BookingEvent::PrefillComplete(id) => {
                let Some(live) = self.live.get_mut(id).filter(|live| !live.prefill_done) else { return false };
                self.digest.complete_prefill(*id, live.booking.worker);
                live.prefill_done = true;
                PeerEvent::PrefillComplete(*id)
            }
            BookingEvent::Renewed { id, lease_until } => {
                let Some(live) = self.live.get_mut(id) else { return false };
                if *lease_until <= live.booking.lease_until {
                    return false;
                }
                live.booking.lease_until = *lease_until;
                PeerEvent::Renewed { id: *id, lease_left_ms: lease_until.0.saturating_sub(now.0) }
            }
            BookingEvent::Freed(id) => {
                let Some(live) = self.live.remove(id) else { return false };
                self.digest.remove(*id, live.booking.worker, live.prefill_done);
                PeerEvent::Freed(*id)
            }
        };
        self.last_seq += 1;
        self.pending.push(peer_event);
        true
    }

    /// The changes recorded since the last call, as one numbered batch.
    pub fn take_batch(&mut self) -> Option<Batch> {
        if self.pending.is_empty() {
            return None;
        }
        let events = std::mem::take(&mut self.pending);
        Some(Batch {
            origin: self.origin,
            incarnation: self.incarnation,
            first_seq: self.last_seq + 1 - events.len() as u64,
            events,
            sent_unix_micros: 0,
        })
    }

    /// The live set right after the last recorded change, for a peer that
    /// lost track. Sent in the same ordered stream as the batches, it
    /// stands between the batches before it and those after.
    pub fn snapshot(&self, now: Millis) -> Snapshot {
        let mut bookings: Vec<PeerBooking> =
            self.live.values().map(|live| to_peer(&live.booking, live.prefill_done, now)).collect();
        bookings.sort_unstable_by_key(|b| b.id);
        Snapshot { origin: self.origin, incarnation: self.incarnation, last_seq: self.last_seq, bookings }
    }

    pub fn digest(&self) -> Digest {
        Digest { origin: self.origin, incarnation: self.incarnation, last_seq: self.last_seq, live: self.digest }
    }

    pub fn live(&self) -> usize {
        self.live.len()
    }
}

fn to_peer(booking: &Booking, prefill_done: bool, now: Millis) -> PeerBooking {
    PeerBooking {
        id: booking.id,
        worker: booking.worker,
        seq_hashes: booking.seq_hashes.clone(),
        unhashed_blocks: booking.unhashed_blocks,
        prefill_tokens: booking.prefill_tokens,
        lease_left_ms: booking.lease_until.0.saturating_sub(now.0),
        prefill_done,
    }
}
