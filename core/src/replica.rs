//! Sharing bookings between kvpick replicas behind one gateway.
//!
//! Each replica sees only the requests that reach it; without sharing,
//! every replica thinks the fleet idler than it is and they herd onto the
//! same worker. So each replica publishes its own booking changes (its
//! `Outbox`) and mirrors every peer's (one `Inbox` per origin), applying
//! what the peer did to its own shards.
//!
//! The stream from an origin is numbered: a gap is noticed and answered
//! with a snapshot of the origin's live bookings (resync); a new
//! incarnation (the origin restarted) replaces everything its old one
//! booked; and a digest of the live set, sent now and then, catches what
//! numbering cannot (a bug, a lost snapshot). Nothing here does I/O or
//! reads a clock: the transport moves `Batch`, `Snapshot` and `Digest`
//! values and passes `now` in.
//!
//! Leases travel as time left, not as instants: replicas' monotonic
//! clocks have unrelated origins.

use std::sync::Arc;
use std::time::Duration;

use crate::booking::ReservationId;
use crate::hashing::SequenceHash;
use crate::worker::WorkerId;

mod digest;
mod exactly_once;
mod inbox;
mod outbox;
#[cfg(test)]
mod tests;

pub use digest::LiveDigest;
pub use exactly_once::ExactlyOnce;
pub use inbox::{Inbox, InboxStats, Received};
pub use outbox::Outbox;

/// A replica, named the same by all of them (e.g. a hash of its pod name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(pub u64);

/// One run of a replica: a restart picks a new, larger one (e.g. its start
/// time in nanoseconds), so peers know its old bookings are gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Incarnation(pub u64);

/// A booking as it travels between replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerBooking {
    pub id: ReservationId,
    pub worker: WorkerId,
    pub seq_hashes: Arc<[SequenceHash]>,
    pub unhashed_blocks: u32,
    pub prefill_tokens: u32,
    /// Milliseconds its lease had left when it was sent.
    pub lease_left_ms: u64,
    /// Its prefill is over (only snapshots say so; a `Reserved` event is
    /// always still in prefill).
    pub prefill_done: bool,
}

/// One booking change of the origin, as numbered in its stream.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerEvent {
    Reserved(PeerBooking),
    PrefillComplete(ReservationId),
    Renewed { id: ReservationId, lease_left_ms: u64 },
    Freed(ReservationId),
}

/// Consecutive events of one origin: `events[i]` has number `first_seq + i`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub origin: ReplicaId,
    pub incarnation: Incarnation,
    /// Numbers start at 1 in each incarnation.
    pub first_seq: u64,
    pub events: Vec<PeerEvent>,
    /// When the first change in it reached the origin's sync, in
    /// microseconds of its wall clock since the Unix epoch (0: not said):
    /// what a peer measures the propagation delay by. Never used to order
    /// anything.
    pub sent_unix_micros: u64,
}

/// The origin's live bookings right after its event `last_seq` (0: before
/// any).
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub origin: ReplicaId,
    pub incarnation: Incarnation,
    pub last_seq: u64,
    pub bookings: Vec<PeerBooking>,
}

/// What the origin's live set looked like right after event `last_seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest {
    pub origin: ReplicaId,
    pub incarnation: Incarnation,
    pub last_seq: u64,
    pub live: LiveDigest,
}

/// Limits a peer's claims are held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboxConfig {
    /// A peer's booking never holds load here longer than this from when
    /// it arrives, whatever lease it claims.
    pub max_lease: Duration,
}

impl Default for InboxConfig {
    fn default() -> Self {
        // Twice the default lease: a peer's renewals keep a long stream's
        // booking alive; a lying peer cannot pin load for longer.
        InboxConfig { max_lease: Duration::from_secs(600) }
    }
}
