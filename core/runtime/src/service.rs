//! `ShardedService`: the selection service over shard threads.
//!
//! Scatter–gather: the prompt is hashed once by the caller; the same
//! `Arc` of sequence hashes goes to every shard, each answers with its
//! candidates, the caller's task picks with the same code as the facade and
//! books on the owning shard. With a single shard the shard does all of it
//! in one visit (same code, same rng): one round trip instead of two.
//!
//! A reservation is acknowledged before its id is handed back, so nothing
//! pushed later, from any thread's ring, can overtake it. `prefill_complete`
//! and `free_reservation` are then posted without waiting for the shard
//! (their outcome is decided by the admission ledger, as the facade decides it):
//! - what the same producer pushes after them (the queue's re-gather, a
//!   `loads` query) comes later in the same ring, so it sees them;
//! - a free pushed from another thread's ring may overtake a posted
//!   `prefill_complete`: the free releases whatever prefill is left and
//!   the late `prefill_complete` finds nothing, the same end state;
//! - nothing follows a free (ids are never reused).
//!
//! A blocking caller whose command found the shard awake (polling its
//! rings) spins on the reply slot for up to
//! `RuntimeConfig::spin_before_park` before awaiting it: such a shard
//! answers within microseconds, while parking and waking the caller's
//! thread costs tens of µs on a busy VM. Against a sleeping shard the
//! caller awaits at once; async tasks never spin
//! (`ProducerSource::spins_for_replies`), and nobody spins when shards do
//! not (no core is left for them).
//!
//! A caller with a `RingScheduler` (an async I/O thread) pushes a
//! selection quietly when another is in flight, and its scheduler rings
//! the shard once for the batch (see `deferred_ring`). A selection with
//! none beside it rings at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::admissions::{Admissions, Ledger};
use super::clock::Clock;
use super::command::{Command, PickJob, Picked, Picking, Query, Reply};
use super::deferred_ring::{PendingRings, RingScheduler};
use super::producer::{Producer, ProducerSource, PushFail, RingCounters, ShardGone};
use super::replicas::{BookingObserver, ReplicaHooks};
use super::shard_loop::{LoopShared, ShardLoop, ShardShared};
use super::timing::SelectTiming;
use super::{RuntimeConfig, RuntimeError, RuntimeKind, SharedShards, choose_kind, lock, pin_current_thread};
use kvpick_core::booking::{Booking, BookingEvent, ReservationId};
use kvpick_core::calibration::{Calibration, SampleError, WorkerCalibration};
use kvpick_core::clock::Millis;
use kvpick_core::cost::{Candidate, RouterConfig};
use kvpick_core::directory::Directory;
use kvpick_core::event::KvEvent;
use kvpick_core::index::{Applied, EventError, ImportError};
use kvpick_core::pick::{Decision, PickPolicy};
use kvpick_core::prompt::Prompt;
use kvpick_core::replica::ReplicaId;
use kvpick_core::request::{
    Admission, AdmissionEvent, SelectError, SelectRequest, Selection, ServiceStats, WorkerError,
};
use kvpick_core::shard::{BookingError, LoadSnapshot, ShardStats, WorkerSnapshot, skip_avoided};
use kvpick_core::worker::{EndpointFilter, WorkerId, WorkerSpec};

/// What a free released: a queued request frees no capacity, a booking does.
#[derive(PartialEq, Eq)]
enum Freed {
    Withdrawn,
    Booking,
}

enum ShardThread {
    Glommio(glommio::ExecutorJoinHandle<()>),
    Std(std::thread::JoinHandle<()>),
}

pub struct ShardedService {
    runtime: RuntimeConfig,
    kind: RuntimeKind,
    shards: SharedShards,
    threads: Mutex<Vec<ShardThread>>,
    directory: RwLock<Directory>,
    /// Booked and queued requests (kvpick-core's ledger) and the callers
    /// awaiting queued ones; shard threads release what leases expire.
    admissions: Admissions,
    /// The policy and the rng every pick uses, wherever it is made.
    picking: Arc<Picking>,
    /// Every worker's speed as learned from observed TTFTs; changes are
    /// posted to the owning shard.
    calibration: Mutex<Calibration>,
    counters: Arc<RingCounters>,
    id: u64,
    /// How long shards poll before parking, and callers poll a reply slot
    /// before awaiting it; zero when shards outnumber the cores.
    spin: Duration,
    /// Selections pushed and not yet answered. A selection with none
    /// beside it rings at once even when its caller batches rings: alone,
    /// deferring only serializes the shard's wake-up after the caller's
    /// pass (at concurrency 1 in `kvpick-bench-extproc`, +100 µs).
    selections_in_flight: AtomicUsize,
    /// Peer replicas' bookings held here, and who hears of our own.
    replicas: Arc<ReplicaHooks>,
}

static NEXT_SERVICE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Hands a deferred ring to the caller's scheduler; without one, dropping
/// it rings at once.
fn schedule_ring(scheduler: Option<&RingScheduler>, pending: Option<PendingRings>) {
    if let (Some(schedule), Some(pending)) = (scheduler, pending) {
        schedule(pending);
    }
}

/// A selection between its push and its answer, counted while it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    /// Also returns how many other selections were in flight.
    fn enter(count: &'a AtomicUsize) -> (Self, usize) {
        let others = count.fetch_add(1, Ordering::Relaxed);
        (InFlight(count), others)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ShardedService {
    /// Starts `runtime.shards` shard threads.
    pub fn start(
        cfg: RouterConfig,
        block_size: u32,
        runtime: RuntimeConfig,
        clock: Clock,
    ) -> Result<Self, RuntimeError> {
        let (kind, reason) = choose_kind(&runtime)?;
        let count = runtime.shards.max(1);
        tracing::info!(shards = count, runtime = ?kind, reason = %reason, cpus = ?runtime.cpus, "shard runtime starting");
        // Spinning shards that outnumber the cores would starve the very
        // threads that feed them.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spin = if count < cores { runtime.spin_before_park } else { Duration::ZERO };
        if spin != runtime.spin_before_park {
            tracing::info!(
                shards = count,
                cores,
                "shards do not spin before parking: no core is left for their producers"
            );
        }
        let common = LoopShared {
            clock,
            admissions: Arc::new(Mutex::new(Ledger::new(cfg.queue_capacity))),
            picking: Arc::new(Picking::new(PickPolicy::new(cfg.clone(), block_size))),
            spin,
            max_index_bytes: kvpick_core::index::max_bytes_per_shard(cfg.index_max_bytes, count),
            replicas: Arc::default(),
        };
        let shards: SharedShards = (0..count).map(|_| Arc::new(ShardShared::default())).collect();
        let mut threads = Vec::with_capacity(count);
        for (i, shared) in shards.iter().enumerate() {
            let shard_loop = ShardLoop::new(shared.clone(), &common);
            let cpu = (!runtime.cpus.is_empty()).then(|| runtime.cpus[i % runtime.cpus.len()]);
            let name = format!("kvpick-shard-{i}");
            let thread = match kind {
                RuntimeKind::Glommio => {
                    let placement = cpu.map_or(glommio::Placement::Unbound, glommio::Placement::Fixed);
                    glommio::LocalExecutorBuilder::new(placement)
                        .name(&name)
                        .spawn(move || super::glommio_shard::run(shard_loop))
                        .map(ShardThread::Glommio)
                        .map_err(|e| RuntimeError::Spawn { shard: i, source: std::io::Error::other(e.to_string()) })
                }
                RuntimeKind::StdThreads => std::thread::Builder::new()
                    .name(name)
                    .spawn(move || {
                        if let Some(cpu) = cpu {
                            pin_current_thread(cpu);
                        }
                        shard_loop.run();
                    })
                    .map(ShardThread::Std)
                    .map_err(|source| RuntimeError::Spawn { shard: i, source }),
                RuntimeKind::Inline => {
                    shared.run_inline(shard_loop);
                    continue;
                }
            };
            match thread {
                Ok(thread) => threads.push(thread),
                Err(e) => {
                    shards.iter().for_each(|s| s.stop());
                    join_all(threads);
                    return Err(e);
                }
            }
        }
        let counters = Arc::<RingCounters>::default();
        if kind == RuntimeKind::Glommio {
            if let Err(error) = super::nudge::spawn_watchdog(shards.to_vec(), counters.clone()) {
                tracing::warn!(%error, "no glommio watchdog thread: a lost wake-up would stall a shard until the next one");
            }
        }
        Ok(ShardedService {
            calibration: Mutex::new(Calibration::new(common.picking.policy.config().calibration.clone())),
            picking: common.picking,
            id: NEXT_SERVICE_ID.fetch_add(1, Ordering::Relaxed),
            directory: RwLock::new(Directory::new(count)),
            runtime,
            kind,
            shards,
            threads: Mutex::new(threads),
            admissions: common.admissions,
            counters,
            spin,
            selections_in_flight: AtomicUsize::new(0),
            replicas: common.replicas,
        })
    }

    /// Unique per service in this process (keys per-thread producers).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn kind(&self) -> RuntimeKind {
        self.kind
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub fn block_size(&self) -> u32 {
        self.policy().block_size()
    }

    pub fn policy(&self) -> &PickPolicy {
        &self.picking.policy
    }

    fn cfg(&self) -> &RouterConfig {
        self.picking.policy.config()
    }

    pub fn counters(&self) -> &RingCounters {
        &self.counters
    }

    pub fn stats(&self) -> ServiceStats {
        lock(&self.admissions).ledger.stats()
    }

    pub fn active_reservations(&self) -> usize {
        lock(&self.admissions).ledger.active()
    }

    pub fn queue_len(&self) -> usize {
        lock(&self.admissions).ledger.queue_len()
    }

    /// A new producer with its own ring into every shard; one per
    /// producing thread.
    pub fn producer(&self) -> Producer {
        Producer::new(&self.shards, self.runtime.ring_capacity, self.counters.clone())
    }

    fn directory(&self) -> std::sync::RwLockReadGuard<'_, Directory> {
        self.directory.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard's answer. One that was awake when the command went in
    /// is polled for first (see the module docs); the spin is bounded, so
    /// a shard that is slow to answer costs at most `spin` extra CPU.
    async fn reply<T>(
        &self,
        source: &impl ProducerSource,
        rx: oneshot::Receiver<T>,
        shard_awake: bool,
    ) -> Result<T, ShardGone> {
        if shard_awake && source.spins_for_replies() {
            super::spin_until(self.spin, || rx.has_message() || rx.is_closed());
        }
        rx.await.map_err(|_| ShardGone)
    }

    async fn ask<T>(
        &self,
        source: &impl ProducerSource,
        shard: usize,
        command: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, ShardGone> {
        let (tx, rx) = oneshot::channel();
        let awake = source.with_producer(|p| p.push_waiting(shard, command(tx)))?;
        self.reply(source, rx, awake).await
    }

    async fn ask_all<T>(
        &self,
        source: &impl ProducerSource,
        command: impl Fn(Reply<T>) -> Command,
    ) -> Result<Vec<T>, ShardGone> {
        let receivers = source.with_producer(|p| {
            (0..p.shard_count())
                .map(|shard| {
                    let (tx, rx) = oneshot::channel();
                    p.push_waiting(shard, command(tx)).map(|awake| (rx, awake))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        let mut out = Vec::with_capacity(receivers.len());
        for (rx, awake) in receivers {
            out.push(self.reply(source, rx, awake).await?);
        }
        Ok(out)
    }

    pub async fn upsert_worker(
        &self,
        source: &impl ProducerSource,
        spec: WorkerSpec,
        now: Millis,
    ) -> Result<(), WorkerError> {
        self.policy().check_worker(&spec)?;
        let shard = self.directory.write().unwrap_or_else(PoisonError::into_inner).place(&spec);
        self.ask(source, shard, |r| Command::Upsert(spec, r)).await.map_err(|_| WorkerError::ShuttingDown)?;
        self.admit_waiting(source, now).await;
        Ok(())
    }

    /// Removes a worker; its bookings are dropped and returned.
    pub async fn delete_worker(
        &self,
        source: &impl ProducerSource,
        id: WorkerId,
    ) -> Result<Vec<ReservationId>, WorkerError> {
        let shard = self
            .directory
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id)
            .ok_or(WorkerError::NotFound(id))?;
        let freed = self
            .ask(source, shard, |r| Command::Delete(id, r))
            .await
            .map_err(|_| WorkerError::ShuttingDown)?
            .unwrap_or_default();
        lock(&self.calibration).forget(id);
        let mut admissions = lock(&self.admissions);
        for r in &freed {
            admissions.ledger.release(*r);
        }
        Ok(freed)
    }

    /// Whether `worker` is one of this service's.
    pub fn owns(&self, worker: WorkerId) -> bool {
        self.directory().shard_of(worker).is_some()
    }

    /// Workers this service selects from.
    pub fn worker_count(&self) -> usize {
        self.directory().len()
    }

    /// Of those, the ones that may take new requests now.
    pub fn schedulable_count(&self) -> usize {
        self.directory().schedulable_len()
    }

    /// Hands an event to the owning shard, in order with this producer's
    /// earlier events; waits while the ring is full.
    pub fn apply_kv_event(&self, producer: &mut Producer, worker: WorkerId, event: KvEvent) -> Result<(), EventError> {
        let shard = self.directory().shard_of(worker).ok_or(EventError::UnknownWorker)?;
        producer.push_waiting(shard, Command::Event(worker, event)).map(drop).map_err(|_| EventError::UnknownWorker)
    }

    /// The worker's index once the shard has applied every event this
    /// producer handed over before (warm start: the cut a peer replica
    /// continues from); in order with its events, so the events pushed
    /// after it are exactly the ones the export does not hold.
    pub fn export_worker(
        &self,
        producer: &mut Producer,
        worker: WorkerId,
    ) -> Result<oneshot::Receiver<Option<WorkerSnapshot>>, EventError> {
        let shard = self.directory().shard_of(worker).ok_or(EventError::UnknownWorker)?;
        let (reply, answer) = oneshot::channel();
        producer.push_waiting(shard, Command::Export(worker, reply)).map_err(|_| EventError::UnknownWorker)?;
        Ok(answer)
    }

    /// Replaces the worker's index with a peer's export, ahead of every
    /// event this producer hands over after it.
    pub fn import_worker(
        &self,
        producer: &mut Producer,
        worker: WorkerId,
        snapshot: WorkerSnapshot,
    ) -> Result<oneshot::Receiver<Result<Applied, ImportError>>, EventError> {
        let shard = self.directory().shard_of(worker).ok_or(EventError::UnknownWorker)?;
        let (reply, answer) = oneshot::channel();
        let command = Command::Import(worker, Box::new(snapshot), reply);
        producer.push_waiting(shard, command).map_err(|_| EventError::UnknownWorker)?;
        Ok(answer)
    }

    async fn gather(
        &self,
        source: &impl ProducerSource,
        prompt: &Prompt,
        model: Option<&str>,
        allowed: Option<&EndpointFilter>,
        mut timing: Option<&mut SelectTiming>,
    ) -> Result<Vec<Candidate>, SelectError> {
        self.directory().check(model)?;
        let query = Arc::new(Query {
            seq_hashes: prompt.seq_hashes.clone(),
            model: model.map(str::to_owned),
            allowed: allowed.cloned(),
        });
        let bound = self.runtime.selection_wait;
        let (_in_flight, others) = InFlight::enter(&self.selections_in_flight);
        let scheduler = source.ring_scheduler().filter(|_| others > 0);
        let (receivers, pending) = source.with_producer(|p| {
            let mut receivers = Vec::with_capacity(p.shard_count());
            let mut push_all = || {
                for shard in 0..p.shard_count() {
                    let (tx, rx) = oneshot::channel();
                    let command = Command::Candidates(query.clone(), tx);
                    let awake =
                        p.push_bounded(shard, command, bound, scheduler.is_some()).map_err(|fail| match fail {
                            PushFail::Full(_) => SelectError::Overloaded,
                            PushFail::Gone => SelectError::ShuttingDown,
                        })?;
                    receivers.push((rx, awake));
                }
                Ok::<_, SelectError>(())
            };
            let pushed = push_all();
            // Even when a later shard refused, the earlier pushes must ring.
            (pushed.map(|()| receivers), p.take_to_schedule())
        });
        schedule_ring(scheduler, pending);
        let receivers = receivers?;
        let mut candidates = Vec::new();
        for (shard, (rx, awake)) in receivers.into_iter().enumerate() {
            let answer = self.reply(source, rx, awake).await.map_err(|_| SelectError::ShuttingDown)?;
            SelectTiming::shard_answered(&mut timing, shard, Some(answer.len()));
            candidates.extend(answer);
        }
        skip_avoided(&mut candidates, allowed);
        Ok(candidates)
    }

    /// What a pick of `request` would see and choose, booking nothing (the
    /// debug view's "why that worker?"): every candidate, its cost under
    /// the policy, in worker order, and the selection. A generator of its
    /// own breaks ties, so explaining never shifts the real picks' draws.
    pub async fn explain(
        &self,
        source: &impl ProducerSource,
        request: &SelectRequest,
    ) -> Result<(Vec<Candidate>, Vec<f64>, Selection), SelectError> {
        let mut candidates =
            self.gather(source, &request.prompt, request.model.as_deref(), request.allowed.as_ref(), None).await?;
        if candidates.is_empty() {
            return Err(SelectError::NoEligibleWorkers);
        }
        let mut costs = Vec::with_capacity(candidates.len());
        let mut rng = fastrand::Rng::with_seed(0);
        let selection = self.picking.policy.choose(request, &mut candidates, &mut costs, &mut rng);
        Ok((candidates, costs, selection))
    }

    /// Picks and books, exactly as `SelectionService::select_and_reserve`.
    pub async fn select_and_reserve(
        &self,
        source: &impl ProducerSource,
        request: SelectRequest,
        now: Millis,
    ) -> Result<Admission, SelectError> {
        self.admit(source, request, now, Some(None), None).await
    }

    /// Picks and books, or, when every eligible worker is saturated,
    /// nothing (`None`): the request is not queued, so nothing is left to
    /// withdraw (a disaggregated plan's prefill leg, which goes elsewhere
    /// rather than wait).
    pub async fn reserve_unless_saturated(
        &self,
        source: &impl ProducerSource,
        request: SelectRequest,
        now: Millis,
    ) -> Result<Option<Selection>, SelectError> {
        Ok(match self.admit(source, request, now, None, None).await? {
            Admission::Reserved(selection) => Some(selection),
            Admission::Queued => None,
        })
    }

    /// Like `select_and_reserve`, but a queued request is awaited: the
    /// result is the booking once admitted, or the reason it was refused
    /// (queue full, deadline passed at a `tick`, workers gone). Dropping
    /// the future while queued leaves the request queued: withdraw it with
    /// `free_reservation`.
    pub async fn select_and_wait(
        &self,
        source: &impl ProducerSource,
        request: SelectRequest,
        now: Millis,
    ) -> Result<Selection, SelectError> {
        self.select_and_wait_timed(source, request, now, None).await
    }

    /// `select_and_wait`, noting in `timing` (when given) when each shard
    /// answered, when the pick was decided and booked, and any queue wait:
    /// a traced request's spans.
    pub async fn select_and_wait_timed(
        &self,
        source: &impl ProducerSource,
        request: SelectRequest,
        now: Millis,
        mut timing: Option<&mut SelectTiming>,
    ) -> Result<Selection, SelectError> {
        let id = request.id;
        let (tx, rx) = oneshot::channel();
        match self.admit(source, request, now, Some(Some(tx)), timing.as_deref_mut()).await? {
            Admission::Reserved(selection) => Ok(selection),
            Admission::Queued => {
                let queued = timing.is_some().then(Instant::now);
                let admitted = match rx.await {
                    Ok(AdmissionEvent::Admitted(selection)) => Ok(selection),
                    Ok(AdmissionEvent::Refused { error, .. }) => Err(error),
                    Err(_) => {
                        lock(&self.admissions).waiters.remove(&id);
                        Err(SelectError::ShuttingDown)
                    }
                };
                if let (Some(timing), Some(queued)) = (timing, queued) {
                    timing.queued = Some((queued, Instant::now()));
                }
                admitted
            }
        }
    }

    /// `queue`: what to do when every eligible worker is saturated: `None`
    /// queues nothing (and answers `Queued` without queueing), `Some`
    /// queues the request, with the waiter to tell when it is admitted.
    async fn admit(
        &self,
        source: &impl ProducerSource,
        request: SelectRequest,
        now: Millis,
        queue: Option<Option<oneshot::Sender<AdmissionEvent>>>,
        mut timing: Option<&mut SelectTiming>,
    ) -> Result<Admission, SelectError> {
        lock(&self.admissions).ledger.check_new(request.id)?;
        if self.shards.len() == 1 {
            let picked = self.pick_in_one_visit(source, request, now).await?;
            SelectTiming::shard_answered(&mut timing, 0, None);
            return match picked {
                Picked::Booked(selection) => Ok(Admission::Reserved(selection)),
                Picked::Saturated(request) => self.enqueue(request, now, queue),
                Picked::Failed(error) => Err(error),
            };
        }
        let allowed = request.allowed.as_ref();
        let mut candidates =
            self.gather(source, &request.prompt, request.model.as_deref(), allowed, timing.as_deref_mut()).await?;
        let decision = self.picking.decide(&request, &mut candidates, &mut Vec::new(), now);
        SelectTiming::mark(&mut timing, |t| &mut t.decided);
        match decision {
            Decision::Book { selection, booking } => {
                let booked = self.book(source, selection, booking).await;
                SelectTiming::mark(&mut timing, |t| &mut t.booked);
                booked.map(Admission::Reserved)
            }
            Decision::Saturated => self.enqueue(request, now, queue),
            Decision::NoEligible => Err(SelectError::NoEligibleWorkers),
        }
    }

    /// Queues a request every eligible worker is too busy for (with
    /// `queue` `Some`; see `admit`).
    fn enqueue(
        &self,
        request: SelectRequest,
        now: Millis,
        queue: Option<Option<oneshot::Sender<AdmissionEvent>>>,
    ) -> Result<Admission, SelectError> {
        let Some(waiter) = queue else { return Ok(Admission::Queued) };
        let id = request.id;
        let mut admissions = lock(&self.admissions);
        let admission = admissions.ledger.enqueue(request, now, self.cfg().queue_timeout)?;
        if let Some(waiter) = waiter {
            admissions.waiters.insert(id, waiter);
        }
        Ok(admission)
    }

    /// With one shard, candidates, pick and booking in one round trip
    /// (the shard runs the facade's code with the service's rng), not two.
    async fn pick_in_one_visit(
        &self,
        source: &impl ProducerSource,
        request: SelectRequest,
        now: Millis,
    ) -> Result<Picked, SelectError> {
        self.directory().check(request.model.as_deref())?;
        let id = request.id;
        // Taken before the shard books, as `reserve` does; the shard gives
        // it back when it books nothing.
        lock(&self.admissions).ledger.claim(id, 0)?;
        let job = Box::new(PickJob { request, now });
        let (tx, rx) = oneshot::channel();
        let (_in_flight, others) = InFlight::enter(&self.selections_in_flight);
        let scheduler = source.ring_scheduler().filter(|_| others > 0);
        let (pushed, pending) = source.with_producer(|p| {
            let pushed = p.push_bounded(0, Command::Pick(job, tx), self.runtime.selection_wait, scheduler.is_some());
            (pushed, p.take_to_schedule())
        });
        schedule_ring(scheduler, pending);
        let awake = match pushed {
            Ok(awake) => awake,
            Err(fail) => {
                lock(&self.admissions).ledger.release(id);
                return Err(match fail {
                    PushFail::Full(_) => SelectError::Overloaded,
                    PushFail::Gone => SelectError::ShuttingDown,
                });
            }
        };
        match self.reply(source, rx, awake).await {
            Ok(picked) => {
                if let Picked::Booked(selection) = &picked {
                    lock(&self.admissions).ledger.booked(selection);
                }
                Ok(picked)
            }
            Err(ShardGone) => {
                lock(&self.admissions).ledger.release(id);
                Err(SelectError::ShuttingDown)
            }
        }
    }

    /// Books a decided pick on its worker's shard.
    async fn book(
        &self,
        source: &impl ProducerSource,
        selection: Selection,
        booking: Booking,
    ) -> Result<Selection, SelectError> {
        let id = booking.id;
        // The worker may have left since the shards answered.
        let shard = self.directory().shard_of(selection.worker).ok_or(SelectError::NoEligibleWorkers)?;
        lock(&self.admissions).ledger.claim(id, shard)?;
        let booked = self.ask(source, shard, |r| Command::Booking(BookingEvent::Reserved(booking), r)).await;
        let error = match booked {
            Ok(Ok(())) => {
                lock(&self.admissions).ledger.booked(&selection);
                return Ok(selection);
            }
            // Not a duplicate: the owner entry above was ours.
            Ok(Err(_)) => SelectError::NoEligibleWorkers,
            Err(ShardGone) => SelectError::ShuttingDown,
        };
        lock(&self.admissions).ledger.release(id);
        Err(error)
    }

    /// See `SelectionService::prefill_complete`. Posted (see the module
    /// docs); then admits queued requests that now fit.
    pub async fn prefill_complete(
        &self,
        source: &impl ProducerSource,
        id: ReservationId,
        now: Millis,
    ) -> Result<(), BookingError> {
        self.post_prefill_complete(source, id)?;
        self.admit_waiting(source, now).await;
        Ok(())
    }

    /// See `SelectionService::free_reservation`. Posted (see the module
    /// docs); then admits queued requests that now fit.
    pub async fn free_reservation(
        &self,
        source: &impl ProducerSource,
        id: ReservationId,
        now: Millis,
    ) -> Result<(), BookingError> {
        if self.free_now(source, id)? == Freed::Booking {
            self.admit_waiting(source, now).await;
        }
        Ok(())
    }

    /// `prefill_complete` without waiting for anything: the change goes
    /// into the owning shard's ring and the answer comes from the owner
    /// map. Does not admit queued requests: when `has_waiting()`, follow
    /// it with `admit_waiting`.
    pub fn post_prefill_complete(&self, source: &impl ProducerSource, id: ReservationId) -> Result<(), BookingError> {
        let shard = lock(&self.admissions).ledger.owner(id).ok_or(BookingError::NotFound(id))?;
        self.post(source, shard, BookingEvent::PrefillComplete(id))
    }

    /// See `SelectionService::move_booking`. The ledger points at the new
    /// shard before either shard is asked, so a free that comes meanwhile
    /// goes where the booking is going (from the same thread, behind it).
    pub async fn move_booking(
        &self,
        source: &impl ProducerSource,
        id: ReservationId,
        to: SocketAddr,
    ) -> Result<Option<WorkerId>, BookingError> {
        let worker = self.directory().worker_at(to).ok_or(BookingError::UnknownEndpoint(to))?;
        let target = self.directory().shard_of(worker).ok_or(BookingError::UnknownEndpoint(to))?;
        let moved = self.rebook(source, id, Some((worker, target)), false).await?;
        Ok(moved.then_some(worker))
    }

    /// The request's prompt is prefill load on its worker again, as when
    /// it was booked: a plan's decode leg stopped counting it when the
    /// prefill went elsewhere, and then the decode side ran the request
    /// whole after all (the decode sidecar's fallback). Taken and booked
    /// anew on the same shard, so peers see a free and a reservation, as
    /// for a move. `NotFound` if it was freed meanwhile.
    pub async fn restore_prefill(&self, source: &impl ProducerSource, id: ReservationId) -> Result<(), BookingError> {
        self.rebook(source, id, None, true).await.map(|_| ())
    }

    /// Takes booking `id` from its shard and books it on `to` (worker and
    /// its shard; `None`: where it was), in prefill again when
    /// `restore_prefill`, else as it was. Says whether the worker changed.
    async fn rebook(
        &self,
        source: &impl ProducerSource,
        id: ReservationId,
        to: Option<(WorkerId, usize)>,
        restore_prefill: bool,
    ) -> Result<bool, BookingError> {
        let (from, target) = {
            let mut admissions = lock(&self.admissions);
            let from = admissions.ledger.release(id).ok_or(BookingError::NotFound(id))?;
            let target = to.map_or(from, |(_, shard)| shard);
            admissions.ledger.claim(id, target).expect("the id was just released");
            (from, target)
        };
        let taken = self.ask(source, from, |r| Command::Take(id, r)).await.map_err(|_| BookingError::ShuttingDown);
        let (mut booking, in_prefill) = match taken.and_then(|t| t) {
            Ok(taken) => taken,
            Err(error) => {
                // Freed or expired meanwhile: nothing to move.
                lock(&self.admissions).ledger.release(id);
                return Err(error);
            }
        };
        // Already there (the gateway's report agrees after all): it goes
        // back as it was.
        let moved = to.is_some_and(|(worker, _)| booking.worker != worker);
        if let Some((worker, _)) = to {
            booking.worker = worker;
        }
        let reserved = self.ask(source, target, |r| Command::Booking(BookingEvent::Reserved(booking), r)).await;
        match reserved {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                lock(&self.admissions).ledger.release(id);
                return Err(error);
            }
            Err(_) => return Err(BookingError::ShuttingDown),
        }
        if lock(&self.admissions).ledger.owner(id) != Some(target) {
            // Freed while it moved: that free found nothing on either
            // shard, so this one frees what just landed.
            self.post(source, target, BookingEvent::Freed(id))?;
            return Err(BookingError::NotFound(id));
        }
        if !in_prefill && !restore_prefill {
            self.post(source, target, BookingEvent::PrefillComplete(id))?;
        }
        Ok(moved)
    }

    /// `SelectionService::renew_lease` without waiting for anything.
    pub fn post_renew(&self, source: &impl ProducerSource, id: ReservationId, now: Millis) -> Result<(), BookingError> {
        let shard = lock(&self.admissions).ledger.owner(id).ok_or(BookingError::NotFound(id))?;
        self.post(source, shard, BookingEvent::Renewed { id, lease_until: now.after(self.cfg().lease) })
    }

    /// How long a booking lives without a free or a renewal.
    pub fn lease(&self) -> Duration {
        self.cfg().lease
    }

    /// `free_reservation` without waiting for anything (a queued request
    /// is withdrawn on the spot). Does not admit queued requests: when
    /// `has_waiting()`, follow it with `admit_waiting`.
    pub fn post_free(&self, source: &impl ProducerSource, id: ReservationId) -> Result<(), BookingError> {
        self.free_now(source, id).map(drop)
    }

    fn free_now(&self, source: &impl ProducerSource, id: ReservationId) -> Result<Freed, BookingError> {
        let shard = {
            let mut admissions = lock(&self.admissions);
            if admissions.ledger.withdraw(id) {
                admissions.waiters.remove(&id);
                return Ok(Freed::Withdrawn);
            }
            admissions.ledger.release(id).ok_or(BookingError::NotFound(id))?
        };
        self.post(source, shard, BookingEvent::Freed(id))?;
        Ok(Freed::Booking)
    }

    fn post(&self, source: &impl ProducerSource, shard: usize, event: BookingEvent) -> Result<(), BookingError> {
        source
            .with_producer(|p| p.push_posted(shard, Command::Posted(event)))
            .map_err(|_| BookingError::ShuttingDown)?;
        Ok(())
    }

    /// Has `observer` told of every change to this replica's own bookings
    /// from now on (see `BookingObserver`). False if one already is.
    pub fn observe_bookings(&self, observer: Arc<dyn BookingObserver>) -> bool {
        self.replicas.set_observer(observer)
    }

    /// Peer replicas' bookings held here now.
    pub fn peer_bookings(&self) -> usize {
        lock(&self.replicas.peers).len()
    }

    /// Whether `origin`'s booking `id` is held here now.
    pub fn holds_peer_booking(&self, origin: ReplicaId, id: ReservationId) -> bool {
        lock(&self.replicas.peers).get(&id).is_some_and(|(owner, _)| *owner == origin)
    }

    /// Applies a peer replica's booking change (see
    /// `SelectionService::apply_peer_booking`): a `Reserved` goes to its
    /// worker's shard and is refused for a worker this service does not
    /// have or an id already held here; any other change must come from the
    /// booking's origin. Never published to peers again. Every change waits
    /// for its shard's answer, so a peer's changes land in the order they
    /// are applied whichever thread the caller resumes on (a free and the
    /// booking again of a moved id). Admits no queued request: a caller
    /// applying frees follows them with one `admit_waiting`.
    pub async fn apply_peer_booking(
        &self,
        source: &impl ProducerSource,
        origin: ReplicaId,
        event: BookingEvent,
    ) -> Result<(), BookingError> {
        let id = event.id();
        if let BookingEvent::Reserved(booking) = event {
            {
                let admissions = lock(&self.admissions);
                if admissions.ledger.owner(id).is_some() || admissions.ledger.waiting(id).is_some() {
                    return Err(BookingError::Duplicate(id));
                }
            }
            let shard = self.directory().shard_of(booking.worker).ok_or(BookingError::UnknownWorker(booking.worker))?;
            match lock(&self.replicas.peers).entry(id) {
                // Held already (by this origin or another): only its own
                // origin's free ends it.
                std::collections::hash_map::Entry::Occupied(_) => return Err(BookingError::Duplicate(id)),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert((origin, shard));
                }
            }
            let booked = self.ask(source, shard, |r| Command::Peer(BookingEvent::Reserved(booking), r)).await;
            let error = match booked {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(error)) => error,
                Err(ShardGone) => BookingError::ShuttingDown,
            };
            lock(&self.replicas.peers).remove(&id);
            return Err(error);
        }
        let shard = {
            let mut peers = lock(&self.replicas.peers);
            match peers.get(&id) {
                Some(&(owner, shard)) if owner == origin => {
                    if matches!(event, BookingEvent::Freed(_)) {
                        peers.remove(&id);
                    }
                    shard
                }
                _ => return Err(BookingError::NotFound(id)),
            }
        };
        self.ask(source, shard, |r| Command::Peer(event, r)).await.map_err(|_| BookingError::ShuttingDown)?
    }

    /// See `SelectionService::observe_ttft`. A changed speed is posted to
    /// the worker's shard; nothing waits.
    pub fn observe_ttft(
        &self,
        source: &impl ProducerSource,
        worker: WorkerId,
        predicted_ns: f64,
        measured_ns: u64,
        now: Millis,
    ) -> Result<(), SampleError> {
        let changed = lock(&self.calibration).observe_ttft(worker, predicted_ns, measured_ns, now)?;
        for (worker, speed) in changed {
            self.post_speed(source, worker, speed);
        }
        Ok(())
    }

    /// See `SelectionService::observe_decode`.
    pub fn observe_decode(&self, worker: WorkerId, output_tokens: u64, decode_ns: u64, now: Millis) {
        lock(&self.calibration).observe_decode(worker, output_tokens, decode_ns, now);
    }

    /// Every worker's calibration and the fleet's scale, for metrics.
    pub fn calibration(&self) -> (Vec<WorkerCalibration>, Option<f64>, u64) {
        let calibration = lock(&self.calibration);
        (calibration.snapshot(), calibration.fleet_scale(), calibration.clipped())
    }

    fn post_speed(&self, source: &impl ProducerSource, worker: WorkerId, speed: f64) {
        let Some(shard) = self.directory().shard_of(worker) else { return };
        if source.with_producer(|p| p.push_posted(shard, Command::Speed(worker, speed))).is_err() {
            tracing::debug!(worker = worker.0, "shutting down: a calibrated speed was not passed on");
        }
    }

    /// Whether requests wait in the queue for capacity.
    pub fn has_waiting(&self) -> bool {
        self.cfg().queue_threshold.is_some() && lock(&self.admissions).ledger.has_waiting()
    }

    /// Expires stale calibration, leases (shards also do on their own
    /// timers) and queue deadlines up to `now`, then admits what fits.
    pub async fn tick(&self, source: &impl ProducerSource, now: Millis) {
        let reset: Vec<(WorkerId, f64)> = {
            let mut calibration = lock(&self.calibration);
            let mut reset = calibration.expire(now);
            // Changes are posted from many threads' rings and may reach a
            // shard out of order: every tick re-sends what is current.
            reset.extend(calibration.speeds());
            reset
        };
        for (worker, speed) in reset {
            self.post_speed(source, worker, speed);
        }
        if let Ok(expired) = self.ask_all(source, |r| Command::Expire(now, r)).await {
            let mut admissions = lock(&self.admissions);
            for id in expired.into_iter().flatten() {
                admissions.ledger.release(id);
            }
        }
        {
            let mut admissions = lock(&self.admissions);
            for refused in admissions.ledger.expire_waiting(now) {
                admissions.settle(refused);
            }
        }
        self.admit_waiting(source, now).await;
    }

    /// Outcomes of queued requests since the last call.
    pub fn take_admissions(&self) -> Vec<AdmissionEvent> {
        lock(&self.admissions).ledger.take_outcomes()
    }

    /// Admits queued requests that now fit, in queue order; what
    /// `prefill_complete`, `free_reservation` and `tick` end with.
    pub async fn admit_waiting(&self, source: &impl ProducerSource, now: Millis) {
        if self.cfg().queue_threshold.is_none() {
            return;
        }
        let ids = lock(&self.admissions).ledger.waiting_ids();
        for id in ids {
            let Some(request) = lock(&self.admissions).ledger.waiting(id).cloned() else { continue };
            let decision = match self
                .gather(source, &request.prompt, request.model.as_deref(), request.allowed.as_ref(), None)
                .await
            {
                Ok(mut candidates) => match self.picking.decide(&request, &mut candidates, &mut Vec::new(), now) {
                    Decision::Saturated => continue,
                    Decision::NoEligible => Err(SelectError::NoEligibleWorkers),
                    Decision::Book { selection, booking } => Ok((selection, booking)),
                },
                Err(error) => Err(error),
            };
            // Withdrawn (freed) while this pass awaited the shards.
            if !lock(&self.admissions).ledger.withdraw(id) {
                continue;
            }
            let outcome = match decision {
                Ok((selection, booking)) => match self.book(source, selection, booking).await {
                    Ok(selection) => lock(&self.admissions).ledger.admitted(selection),
                    Err(error) => AdmissionEvent::Refused { id, error },
                },
                Err(error) => AdmissionEvent::Refused { id, error },
            };
            lock(&self.admissions).settle(outcome);
        }
    }

    /// Every worker's load, by worker id.
    pub async fn loads(&self, source: &impl ProducerSource) -> Vec<LoadSnapshot> {
        let mut all: Vec<LoadSnapshot> =
            self.ask_all(source, Command::Loads).await.unwrap_or_default().into_iter().flatten().collect();
        all.sort_by_key(|l| l.worker);
        all
    }

    /// Overlap depth per worker holding a prefix of the prompt, by worker id.
    pub async fn overlap_scores(&self, source: &impl ProducerSource, prompt: &Prompt) -> Vec<(WorkerId, u32)> {
        let seq = prompt.seq_hashes.clone();
        let mut all: Vec<(WorkerId, u32)> = self
            .ask_all(source, |r| Command::Overlaps(seq.clone(), r))
            .await
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect();
        all.sort();
        all
    }

    pub async fn shard_stats(&self, source: &impl ProducerSource) -> ShardStats {
        self.ask_all(source, Command::Stats)
            .await
            .unwrap_or_default()
            .into_iter()
            .fold(ShardStats::default(), ShardStats::merge)
    }

    /// Stops accepting work, lets every shard drain its rings, and joins
    /// the threads. Idempotent; also run on drop.
    pub fn shutdown(&self) {
        for shard in &self.shards {
            shard.stop();
        }
        join_all(std::mem::take(&mut *lock(&self.threads)));
    }
}

impl Drop for ShardedService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn join_all(threads: Vec<ShardThread>) {
    for thread in threads {
        let joined = match thread {
            ShardThread::Glommio(handle) => handle.join().map_err(|e| e.to_string()),
            ShardThread::Std(handle) => handle.join().map_err(|_| "panicked".to_owned()),
        };
        if let Err(e) = joined {
            tracing::error!(error = %e, "shard thread ended badly");
        }
    }
}
