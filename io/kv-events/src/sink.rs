//! Where decoded events go: the shard owning the worker.

use std::sync::{Arc, Mutex, PoisonError};

use kvpick_core::index::{Applied, EventError, ImportError};
use kvpick_core::shard::WorkerSnapshot;
use kvpick_core::{KvEvent, SelectionService, WorkerId};
use kvpick_runtime::{Producer, ShardedService};

/// What became of one event handed to a sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkOutcome {
    /// Applied at once, with what it changed.
    Applied(Applied),
    /// Queued for the owning shard, which applies and counts it itself.
    Queued,
    /// Refused; the index is unchanged.
    Rejected(EventError),
}

/// Receives every event the ingest thread decodes, per worker in sequence
/// order. Called on the ingest thread only; blocking in `apply` blocks every
/// publisher (a full shard ring is back-pressure, never a drop).
pub trait KvEventSink: Send {
    fn apply(&mut self, worker: WorkerId, event: KvEvent) -> SinkOutcome;

    /// Warm start: the worker's index once every event handed over before
    /// is applied (`None` when this sink cannot export).
    fn export(&mut self, worker: WorkerId) -> Option<Exported> {
        let _ = worker;
        None
    }

    /// Warm start: a peer's export of the worker, applied before every
    /// event handed over after it (`None` when this sink cannot import).
    fn import(&mut self, worker: WorkerId, snapshot: WorkerSnapshot) -> Option<Imported> {
        let _ = (worker, snapshot);
        None
    }
}

/// The shard's answer to an export: the worker's snapshot, `None` when it
/// has none to give (unknown, or its events at another block size).
pub type Exported = oneshot::Receiver<Option<WorkerSnapshot>>;
/// The shard's answer to an import.
pub type Imported = oneshot::Receiver<Result<Applied, ImportError>>;

/// An answer already known (the single-threaded service answers at once).
fn answered<T>(value: T) -> oneshot::Receiver<T> {
    let (reply, answer) = oneshot::channel();
    let _ = reply.send(value);
    answer
}

/// A [`SelectionService`] shared behind a mutex: the single-threaded
/// reference, for tests and tools (the thread-per-core runtime has its own
/// sink over SPSC rings).
#[derive(Clone)]
pub struct SharedService(pub Arc<Mutex<SelectionService>>);

impl KvEventSink for SharedService {
    fn apply(&mut self, worker: WorkerId, event: KvEvent) -> SinkOutcome {
        // A panic elsewhere while holding the lock leaves the index as
        // consistent as any single event leaves it: keep going.
        let mut service = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match service.apply_kv_event(worker, &event) {
            Ok(applied) => SinkOutcome::Applied(applied),
            Err(error) => SinkOutcome::Rejected(error),
        }
    }

    fn export(&mut self, worker: WorkerId) -> Option<Exported> {
        Some(answered(self.0.lock().unwrap_or_else(PoisonError::into_inner).export_worker(worker)))
    }

    fn import(&mut self, worker: WorkerId, snapshot: WorkerSnapshot) -> Option<Imported> {
        let mut service = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Some(answered(service.import_worker(worker, &snapshot)))
    }
}

/// The thread-per-core runtime: events go through the ingest thread's own
/// SPSC ring into the owning shard, in order, waiting (never dropping) when
/// the ring is full. The shard counts what it applies and rejects.
pub struct ShardSink {
    service: Arc<ShardedService>,
    producer: Producer,
}

impl ShardSink {
    pub fn new(service: Arc<ShardedService>) -> Self {
        let producer = service.producer();
        ShardSink { service, producer }
    }
}

/// A clone is another producing lane: its own rings into every shard, for
/// another thread (the drain thread's events go through their own).
impl Clone for ShardSink {
    fn clone(&self) -> Self {
        ShardSink::new(Arc::clone(&self.service))
    }
}

impl KvEventSink for ShardSink {
    fn apply(&mut self, worker: WorkerId, event: KvEvent) -> SinkOutcome {
        match self.service.apply_kv_event(&mut self.producer, worker, event) {
            Ok(()) => SinkOutcome::Queued,
            Err(error) => SinkOutcome::Rejected(error),
        }
    }

    /// On this sink's own ring: after every event it handed over before.
    fn export(&mut self, worker: WorkerId) -> Option<Exported> {
        self.service.export_worker(&mut self.producer, worker).ok()
    }

    fn import(&mut self, worker: WorkerId, snapshot: WorkerSnapshot) -> Option<Imported> {
        self.service.import_worker(&mut self.producer, worker, snapshot).ok()
    }
}

/// Two selection services side by side (a disaggregated fleet's decode and
/// prefill selectors): each event goes to the one that has its worker. A
/// worker the prefill side does not have goes to the decode side, which
/// rejects it when it does not have it either, as one service would. A
/// clone is another producing lane into both services.
#[derive(Clone)]
pub struct RoleSink {
    decode: ShardSink,
    prefill: ShardSink,
}

impl RoleSink {
    pub fn new(decode: Arc<ShardedService>, prefill: Arc<ShardedService>) -> Self {
        RoleSink { decode: ShardSink::new(decode), prefill: ShardSink::new(prefill) }
    }
}

impl KvEventSink for RoleSink {
    fn apply(&mut self, worker: WorkerId, event: KvEvent) -> SinkOutcome {
        self.side(worker).apply(worker, event)
    }

    fn export(&mut self, worker: WorkerId) -> Option<Exported> {
        self.side(worker).export(worker)
    }

    fn import(&mut self, worker: WorkerId, snapshot: WorkerSnapshot) -> Option<Imported> {
        self.side(worker).import(worker, snapshot)
    }
}

impl RoleSink {
    fn side(&mut self, worker: WorkerId) -> &mut ShardSink {
        if self.prefill.service.owns(worker) { &mut self.prefill } else { &mut self.decode }
    }
}
