//! The transport's counters (the sync's own are `sync::SyncStats`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use kvpick_core::replica::ReplicaId;

#[derive(Debug, Default)]
pub struct TransportMetrics {
    /// Peers dialed, and of those the links streaming now.
    pub links: AtomicU64,
    pub links_up: AtomicU64,
    /// Peers' streams open on this replica's peer port.
    pub streams_in: AtomicU64,
    pub reconnects: AtomicU64,
    pub frames_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub frames_out: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Warm start: this replica's index served to a replica starting up.
    pub indexes_served: AtomicU64,
    /// This replica's own warm start: 0 under way (or off), 1 warm (a
    /// peer's whole index taken), 2 cold.
    pub warm_outcome: AtomicU64,
    pub warm_workers_seeded: AtomicU64,
    /// Workers of a peer's index refused here (their shard or stream).
    pub warm_workers_refused: AtomicU64,
    pub warm_blocks_imported: AtomicU64,
    /// From start to the warm start's end.
    pub warm_took_ms: AtomicU64,
    /// Frames and calls refused, by reason.
    refused: Mutex<BTreeMap<&'static str, u64>>,
    /// The peer each streaming link reaches, by link, as the peer named
    /// itself answering the call (a peer too old to name itself is absent).
    reached: Mutex<BTreeMap<u64, ReplicaId>>,
}

impl TransportMetrics {
    pub fn refused(&self, reason: &'static str) {
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner).entry(reason).or_default() += 1;
    }

    pub fn refusals(&self) -> BTreeMap<&'static str, u64> {
        self.refused.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The peers this replica's links stream to now (warm start waits for
    /// each one's live bookings).
    pub fn reached(&self) -> Vec<ReplicaId> {
        self.reached.lock().unwrap_or_else(PoisonError::into_inner).values().copied().collect()
    }

    pub(crate) fn link_reached(&self, link: u64, peer: Option<ReplicaId>) {
        let mut reached = self.reached.lock().unwrap_or_else(PoisonError::into_inner);
        match peer {
            Some(peer) => reached.insert(link, peer),
            None => reached.remove(&link),
        };
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
