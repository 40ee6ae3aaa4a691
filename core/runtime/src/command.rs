//! What producers ask of a shard thread, and how it answers.

use std::sync::{Arc, Mutex};

use kvpick_core::booking::{Booking, BookingEvent, ReservationId};
use kvpick_core::clock::Millis;
use kvpick_core::cost::Candidate;
use kvpick_core::event::KvEvent;
use kvpick_core::hashing::SequenceHash;
use kvpick_core::index::{Applied, ImportError};
use kvpick_core::pick::{Decision, PickPolicy};
use kvpick_core::request::{SelectError, SelectRequest, Selection};
use kvpick_core::shard::{BookingError, LoadSnapshot, ShardStats, WorkerSnapshot};
use kvpick_core::worker::{EndpointFilter, WorkerId, WorkerSpec};

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

/// What picking needs besides the candidates; shared by the service and,
/// for one-visit picks, the shard thread (same rng, so the same seed gives
/// the same picks either way).
pub(crate) struct Picking {
    pub policy: PickPolicy,
    pub rng: Mutex<fastrand::Rng>,
}

impl Picking {
    pub(crate) fn new(policy: PickPolicy) -> Self {
        let seed = policy.config().seed;
        Picking { policy, rng: Mutex::new(fastrand::Rng::with_seed(seed)) }
    }

    /// The policy's decision with the service's one generator.
    pub(crate) fn decide(
        &self,
        request: &SelectRequest,
        candidates: &mut [Candidate],
        costs: &mut Vec<f64>,
        now: Millis,
    ) -> Decision {
        let mut rng = super::lock(&self.rng);
        self.policy.decide(request, candidates, costs, &mut rng, now)
    }
}

/// A whole selection for a shard that owns every worker: candidates,
/// pick and booking in one visit instead of two.
pub(crate) struct PickJob {
    pub request: SelectRequest,
    pub now: Millis,
}

pub(crate) enum Picked {
    Booked(Selection),
    /// Every candidate is saturated: the caller queues the request.
    Saturated(SelectRequest),
    Failed(SelectError),
}

pub(crate) enum Command {
    Upsert(WorkerSpec, Reply<()>),
    Delete(WorkerId, Reply<Option<Vec<ReservationId>>>),
    /// No reply: events are fire-and-forget, ordered per producer ring.
    Event(WorkerId, KvEvent),
    Candidates(Arc<Query>, Reply<Vec<Candidate>>),
    /// Boxed: a request is several times the size of the other commands.
    Pick(Box<PickJob>, Reply<Picked>),
    Booking(BookingEvent, Reply<Result<(), BookingError>>),
    /// Frees a booking and answers what it was (moving it elsewhere).
    Take(ReservationId, Reply<Result<(Booking, bool), BookingError>>),
    /// A booking change nobody waits for (`prefill_complete`, `free`): see
    /// `ShardedService` for why it cannot be overtaken by what it follows.
    Posted(BookingEvent),
    /// A peer replica's booking change; the sync waits for each answer.
    Peer(BookingEvent, Reply<Result<(), BookingError>>),
    /// A worker's calibrated speed (see `kvpick_core::Calibration`); no
    /// reply, and a worker gone meanwhile is simply not there to slow.
    Speed(WorkerId, f64),
    Expire(Millis, Reply<Vec<ReservationId>>),
    Loads(Reply<Vec<LoadSnapshot>>),
    Overlaps(Arc<[SequenceHash]>, Reply<Vec<(WorkerId, u32)>>),
    Stats(Reply<ShardStats>),
    /// A worker's index after every event its ring carried before this
    /// (warm start: the cut a peer continues from).
    Export(WorkerId, Reply<Option<WorkerSnapshot>>),
    /// A peer's export of a worker, applied before every event its ring
    /// carries after this. Boxed: an export is large.
    Import(WorkerId, Box<WorkerSnapshot>, Reply<Result<Applied, ImportError>>),
}

impl Command {
    /// Nobody waits for its answer: the shard may run it ahead of other
    /// rings' commands (never ahead of its own ring's).
    /// An export or import rides with the events: what matters is its
    /// place among them, and no selection waits on it.
    pub(crate) fn is_fire_and_forget(&self) -> bool {
        matches!(
            self,
            Command::Event(..) | Command::Posted(_) | Command::Speed(..) | Command::Export(..) | Command::Import(..)
        )
    }

    /// A KV event: throughput work, which a glommio shard runs on its
    /// background task queue, behind selections.
    pub(crate) fn is_event(&self) -> bool {
        matches!(self, Command::Event(..) | Command::Export(..) | Command::Import(..))
    }
}
