//! What producers ask of a shard thread, and how it answers.

use std::sync::Arc;

use crate::booking::{BookingEvent, ReservationId};
use crate::clock::Millis;
use crate::cost::Candidate;
use crate::event::KvEvent;
use crate::hashing::SequenceHash;
use crate::shard::{BookingError, LoadSnapshot, ShardStats};
use crate::worker::{EndpointFilter, WorkerId, WorkerSpec};

/// Filled exactly once by the shard thread; the awaiting task is woken on
/// whatever runtime it runs.
pub(crate) type Reply<T> = oneshot::Sender<T>;

/// A candidate query owned so one copy can be shared by every shard.
#[derive(Debug)]
pub(crate) struct Query {
    pub seq_hashes: Arc<[SequenceHash]>,
    pub model: Option<String>,
    pub allowed: Option<EndpointFilter>,
}

pub(crate) enum Command {
    Upsert(WorkerSpec, Reply<()>),
    Delete(WorkerId, Reply<Option<Vec<ReservationId>>>),
    /// No reply: events are fire-and-forget, ordered per producer ring.
    Event(WorkerId, KvEvent),
    Candidates(Arc<Query>, Reply<Vec<Candidate>>),
    Booking(BookingEvent, Reply<Result<(), BookingError>>),
    Expire(Millis, Reply<Vec<ReservationId>>),
    Loads(Reply<Vec<LoadSnapshot>>),
    Overlaps(Arc<[SequenceHash]>, Reply<Vec<(WorkerId, u32)>>),
    Stats(Reply<ShardStats>),
}
