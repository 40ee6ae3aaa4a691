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
    /// Each dialed link's state, by link.
    links_state: Mutex<BTreeMap<u64, LinkState>>,
}

/// Where a `direct` link stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Connecting, or about to (after a stream ended).
    Dialing,
    /// Streaming, to the peer that named itself answering the call (`None`:
    /// a peer too old to name itself).
    Up(Option<ReplicaId>),
    /// The address is this replica's own: parked.
    Itself,
    /// Its last try failed; backing off.
    Failing,
}

impl TransportMetrics {
    pub fn refused(&self, reason: &'static str) {
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner).entry(reason).or_default() += 1;
    }

    pub fn refusals(&self) -> BTreeMap<&'static str, u64> {
        self.refused.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every dialed link's state now (warm start waits until none is
    /// still dialing, and for the live bookings of each peer reached).
    pub fn links_state(&self) -> Vec<LinkState> {
        self.links_state.lock().unwrap_or_else(PoisonError::into_inner).values().copied().collect()
    }

    /// Sets a link's state (`None`: the link is gone), keeping `links_up`
    /// in step with it.
    pub(crate) fn set_link(&self, link: u64, state: Option<LinkState>) {
        let mut states = self.links_state.lock().unwrap_or_else(PoisonError::into_inner);
        let was_up = matches!(states.get(&link), Some(LinkState::Up(_)));
        let is_up = matches!(state, Some(LinkState::Up(_)));
        match state {
            Some(state) => states.insert(link, state),
            None => states.remove(&link),
        };
        match (was_up, is_up) {
            (false, true) => self.links_up.fetch_add(1, Ordering::Relaxed),
            (true, false) => self.links_up.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
