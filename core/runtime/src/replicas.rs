//! What the shards need to share bookings with peer replicas: an observer
//! told of every change to this replica's own bookings as a shard applies
//! it (what the replica sync publishes), and the map of peers' bookings
//! held here (whose each is, and on which shard), so an expiry or a
//! worker's removal can tell a peer's booking from one of ours.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kvpick_core::booking::{BookingEvent, ReservationId};
use kvpick_core::clock::Millis;
use kvpick_core::replica::ReplicaId;

/// Told of booking changes from the shard threads: must not block (the
/// replica sync hands them to its own task).
pub trait BookingObserver: Send + Sync + 'static {
    /// A change to one of this replica's own bookings, applied by a shard
    /// at `now`; an expired lease or a removed worker's booking comes as
    /// `Freed`.
    fn own(&self, event: &BookingEvent, now: Millis);
    /// A peer's booking the shards let go of on their own (its lease ran
    /// out here, or its worker was removed).
    fn peer_dropped(&self, origin: ReplicaId, id: ReservationId);
}

/// Shared by a service and its shard loops.
#[derive(Default)]
pub(crate) struct ReplicaHooks {
    observer: OnceLock<Arc<dyn BookingObserver>>,
    /// Peers' bookings held here: their origin and shard.
    pub peers: Mutex<HashMap<ReservationId, (ReplicaId, usize)>>,
}

impl ReplicaHooks {
    pub(crate) fn observer(&self) -> Option<&dyn BookingObserver> {
        self.observer.get().map(|o| &**o)
    }

    /// False if an observer was already set.
    pub(crate) fn set_observer(&self, observer: Arc<dyn BookingObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// A change a shard just applied to one of our own bookings.
    pub(crate) fn own(&self, event: &BookingEvent, now: Millis) {
        if let Some(observer) = self.observer() {
            observer.own(event, now);
        }
    }

    /// Bookings a shard dropped by itself (expired, worker removed): a
    /// peer's leaves the peer map and its sync hears of it; one of ours is
    /// published as freed.
    pub(crate) fn dropped(&self, ids: &[ReservationId], now: Millis) {
        if ids.is_empty() {
            return;
        }
        let observer = self.observer();
        let mut peers = super::lock(&self.peers);
        for id in ids {
            match (peers.remove(id), observer) {
                (Some((origin, _)), Some(observer)) => observer.peer_dropped(origin, *id),
                (None, Some(observer)) => observer.own(&BookingEvent::Freed(*id), now),
                _ => {}
            }
        }
    }
}
