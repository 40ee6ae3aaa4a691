//! The loop every shard thread runs, whichever executor hosts it: drain the
//! rings, expire due leases, sleep on the doorbell when there is nothing
//! to do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use rtrb::Consumer;

use super::admissions::Admissions;
use super::clock::Clock;
use super::command::{Command, PickJob, Picked, Picking};
use super::doorbell::Doorbell;
use super::replicas::ReplicaHooks;
use super::spin_policy::SpinPolicy;
use kvpick_core::booking::BookingEvent;
use kvpick_core::cost::Candidate;
use kvpick_core::index::EventError;
use kvpick_core::pick::Decision;
use kvpick_core::request::SelectError;
use kvpick_core::shard::{BookingError, CandidateQuery, Shard};

/// The longest a posted booking change (`prefill_complete`, a free) waits
/// in a ring while its shard sleeps. Until then the worker's load counts
/// the booking, but no selection sees that: a selection rings, and each
/// pass runs the posted changes at the head of every ring first. Short
/// enough that a shard idle with bookings wakes at most 200 times a second.
pub(crate) const POSTED_DRAIN: Duration = Duration::from_millis(5);

/// Commands taken from one ring before moving to the next, so one busy
/// producer cannot starve the others.
const FAIR_SHARE: usize = 64;

/// What producers and the shard thread share. The doorbell, which the
/// shard writes whenever it sleeps or wakes, has a cache line of its own,
/// so that producers' reads of the other flags on every push stay hits.
#[derive(Default)]
pub(crate) struct ShardShared {
    pub doorbell: CachePadded<Doorbell>,
    new_rings: Mutex<Vec<Consumer<Command>>>,
    has_new_rings: AtomicBool,
    stop: AtomicBool,
    /// Set as the loop ends, before its last drain: a producer that sees
    /// it after pushing cannot count on an answer.
    exited: AtomicBool,
    /// Passes of a glommio shard's selection task (at least one every
    /// re-check period while it runs): the watchdog's sign of life.
    heartbeat: CachePadded<AtomicU64>,
    /// An inline shard's loop (`RuntimeKind::Inline`): no thread of its
    /// own; whoever pushes runs it (`combine`). Taken out when it stops,
    /// which also breaks the loop's reference back to this.
    inline: Mutex<Option<ShardLoop>>,
    is_inline: AtomicBool,
    /// Set by every push into an inline shard: the thread that holds the
    /// loop looks again after letting go, so a push that found it held is
    /// never left unrun.
    combine_pending: CachePadded<AtomicBool>,
}

impl ShardShared {
    pub(crate) fn add_ring(&self, ring: Consumer<Command>) {
        self.new_rings.lock().expect("ring registration never panics").push(ring);
        self.has_new_rings.store(true, Ordering::Release);
        self.doorbell.ring();
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.doorbell.ring();
        if self.is_inline() {
            let stopped = super::lock(&self.inline).take();
            if let Some(mut shard_loop) = stopped {
                shard_loop.finish();
            }
        }
    }

    /// Makes this an inline shard run by `shard_loop`.
    pub(crate) fn run_inline(&self, shard_loop: ShardLoop) {
        *super::lock(&self.inline) = Some(shard_loop);
        self.is_inline.store(true, Ordering::Release);
    }

    pub(crate) fn is_inline(&self) -> bool {
        self.is_inline.load(Ordering::Acquire)
    }

    /// An inline shard's turn, after a push (flat combining): the pushing
    /// thread runs the rings until they are empty, unless another thread
    /// is running the loop; that one then sees `combine_pending` when it
    /// lets go and runs again, so no push is left unrun. The state is
    /// still touched by one thread at a time, through the same rings in
    /// the same order, so every answer is the threaded shard's.
    ///
    /// KV events are throughput work and come in bursts (a worker's
    /// restart, an eviction storm): the thread that pushed one waits for
    /// the loop and applies them itself. Any other push runs everything
    /// but events, as a glommio shard's selection pass does, so an I/O
    /// thread is never kept applying another thread's burst while its
    /// streams wait.
    pub(crate) fn combine(&self, pushed_event: bool) {
        self.combine_pending.store(true, Ordering::SeqCst);
        // Orders the flag before the lock's state is read, so either this
        // thread takes the loop or its holder sees the flag.
        fence(Ordering::SeqCst);
        let mut wait = pushed_event;
        loop {
            let acquired = if wait { Ok(super::lock(&self.inline)) } else { self.inline.try_lock() };
            wait = false;
            let mut held = match acquired {
                Ok(held) => held,
                Err(TryLockError::WouldBlock) => return,
                // A pass that panicked left the state as consistent as a
                // threaded shard's would be; keep serving.
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            };
            let Some(shard_loop) = held.as_mut() else { return };
            self.combine_pending.store(false, Ordering::SeqCst);
            if pushed_event {
                while shard_loop.pass() > 0 {}
            } else {
                while shard_loop.pass_selections() > 0 {}
            }
            shard_loop.expire_due();
            drop(held);
            fence(Ordering::SeqCst);
            if !self.combine_pending.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// One more pass of the selection task.
    pub(crate) fn beat(&self) {
        self.heartbeat.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn heartbeat(&self) -> u64 {
        self.heartbeat.load(Ordering::Relaxed)
    }

    pub(crate) fn exited(&self) -> bool {
        self.exited.load(Ordering::SeqCst)
    }
}

pub(crate) struct ShardLoop {
    spin: SpinPolicy,
    shard: Shard,
    rings: Vec<Consumer<Command>>,
    shared: Arc<ShardShared>,
    clock: Clock,
    admissions: Admissions,
    /// The service's config and rng, for one-visit picks: held here
    /// rather than sent with each job, so no reference count moves
    /// between threads per selection.
    picking: Arc<Picking>,
    replicas: Arc<ReplicaHooks>,
    scratch: Scratch,
}

/// Buffers a one-visit pick reuses, as the facade does.
#[derive(Default)]
pub(crate) struct Scratch {
    candidates: Vec<Candidate>,
    costs: Vec<f64>,
}

/// What every shard loop of one service shares.
pub(crate) struct LoopShared {
    pub clock: Clock,
    pub admissions: Admissions,
    pub picking: Arc<Picking>,
    pub spin: Duration,
    /// Each shard's index budget, in bytes.
    pub max_index_bytes: Option<u64>,
    pub replicas: Arc<ReplicaHooks>,
}

impl ShardLoop {
    pub(crate) fn new(shared: Arc<ShardShared>, common: &LoopShared) -> Self {
        ShardLoop {
            spin: SpinPolicy::new(common.spin),
            shard: Shard::with_max_index_bytes(common.max_index_bytes),
            rings: Vec::new(),
            shared,
            clock: common.clock.clone(),
            admissions: common.admissions.clone(),
            picking: common.picking.clone(),
            replicas: common.replicas.clone(),
            scratch: Scratch::default(),
        }
    }

    /// Polls for work, for as long as the spin policy says, before the
    /// caller parks.
    fn spin_for_work(&self) -> bool {
        super::spin_until(self.spin.budget(), || self.has_work() || self.shared.stopping())
    }

    fn take_new_rings(&mut self) {
        // Load before swapping: a swap writes the line on every pass, and
        // the producers' hot flags would miss each time it moved.
        if self.shared.has_new_rings.load(Ordering::Acquire) && self.shared.has_new_rings.swap(false, Ordering::AcqRel)
        {
            let mut new = self.shared.new_rings.lock().expect("ring registration never panics");
            self.rings.append(&mut new);
        }
    }

    /// One fair pass over every ring; returns how many commands ran.
    fn pass(&mut self) -> usize {
        self.pass_where(Command::is_fire_and_forget, |_| true)
    }

    /// A pass that first runs what `first` accepts at the head of every
    /// ring, then what `then` accepts. First come what nobody waits for
    /// (posted booking changes, and on the std loop KV events): a selection
    /// later in the pass then sees every free pushed before it, whichever
    /// ring it came through. Posted frees do not ring, so without this a
    /// pick from an earlier-registered ring would count a finished request
    /// as load. Within one ring the order stays as pushed.
    fn pass_where(&mut self, first: impl Fn(&Command) -> bool, then: impl Fn(&Command) -> bool) -> usize {
        self.take_new_rings();
        let mut handled = 0;
        for i in 0..self.rings.len() {
            handled += self.drain(i, &first);
        }
        for i in 0..self.rings.len() {
            handled += self.drain(i, &then);
        }
        // A producer that went away leaves its ring behind once drained.
        self.rings.retain(|ring| !(ring.is_abandoned() && ring.is_empty()));
        handled
    }

    /// Runs up to `FAIR_SHARE` commands from the head of ring `i` while
    /// `take` accepts them; returns how many ran.
    /// A run of KV events at the head is prefetched first, a window at a
    /// time, so their cache misses overlap instead of queueing one by one.
    fn drain(&mut self, i: usize, take: impl Fn(&Command) -> bool) -> usize {
        let mut handled = 0;
        // Events at the head the current prefetch window covers.
        let mut ahead = 0;
        while handled < FAIR_SHARE && self.rings[i].peek().is_ok_and(&take) {
            if ahead == 0 {
                ahead = prefetch_events_at_head(&self.shard, &mut self.rings[i], FAIR_SHARE - handled);
            }
            ahead = ahead.saturating_sub(1);
            let Ok(command) = self.rings[i].pop() else { break };
            let context = PickContext {
                admissions: &self.admissions,
                picking: &self.picking,
                replicas: &self.replicas,
                clock: &self.clock,
            };
            handle(&mut self.shard, &context, &mut self.scratch, command);
            handled += 1;
        }
        handled
    }

    fn has_work(&self) -> bool {
        self.shared.has_new_rings.load(Ordering::Acquire) || self.rings.iter().any(|r| !r.is_empty())
    }

    /// A glommio shard's latency-sensitive pass: posted booking changes at
    /// every ring head first (as `pass`), then every command but KV events,
    /// which its background task applies. Returns how many ran.
    pub(crate) fn pass_selections(&mut self) -> usize {
        self.pass_where(|c| matches!(c, Command::Posted(_)), |c| !c.is_event())
    }

    /// A glommio shard's background pass: up to `FAIR_SHARE` KV events at
    /// the head of each ring. Returns how many ran.
    pub(crate) fn pass_events(&mut self) -> usize {
        (0..self.rings.len()).map(|i| self.drain(i, Command::is_event)).sum()
    }

    /// A command other than a KV event waits at a ring head (or a new ring).
    pub(crate) fn has_selection_work(&self) -> bool {
        self.shared.has_new_rings.load(Ordering::Acquire)
            || self.rings.iter().any(|r| r.peek().is_ok_and(|c| !c.is_event()))
    }

    /// A KV event waits at a ring head.
    pub(crate) fn has_event_work(&self) -> bool {
        self.rings.iter().any(|r| r.peek().is_ok_and(Command::is_event))
    }

    pub(crate) fn shared(&self) -> &ShardShared {
        &self.shared
    }

    /// Polls the rings for the spin policy's budget before a glommio shard
    /// sleeps, as the std loop does: while it polls, producers see it awake
    /// and do not ring, so a selection costs no wake-up. Returns whether
    /// work arrived, and records the idle gap either way from `since`.
    pub(crate) fn spin_before_sleep(&mut self, since: Instant) -> bool {
        let found = self.spin_for_work();
        if found {
            self.spin.work_arrived(since, Instant::now());
        }
        found
    }

    /// Work arrived at `at` after the shard went idle at `since`.
    pub(crate) fn work_arrived(&mut self, since: Instant, at: Instant) {
        self.spin.work_arrived(since, at);
    }

    pub(crate) fn shared_arc(&self) -> Arc<ShardShared> {
        self.shared.clone()
    }

    /// How long until the posted-change drain is due: while bookings are
    /// held, posted frees (which do not ring) must not wait longer.
    pub(crate) fn posted_drain_due(&self) -> Option<Duration> {
        (self.shard.booking_count() > 0).then_some(POSTED_DRAIN)
    }

    /// How long until the next lease ends, if the clock can say.
    pub(crate) fn until_next_lease_end(&self) -> Option<Duration> {
        let end = self.clock.instant_of(self.shard.next_lease_end()?)?;
        Some(end.saturating_duration_since(Instant::now()))
    }

    pub(crate) fn expire_due(&mut self) {
        let now = self.clock.now();
        if self.shard.next_lease_end().is_some_and(|end| end <= now) {
            let expired = self.shard.expire(now);
            if !expired.is_empty() {
                self.replicas.dropped(&expired, now);
                let mut admissions = super::lock(&self.admissions);
                for id in expired {
                    admissions.ledger.release(id);
                }
            }
        }
    }

    /// The next lease end; while bookings are held, no later than
    /// `POSTED_DRAIN` from now, since their posted changes do not ring.
    fn deadline(&self) -> Option<Instant> {
        let lease = self.shard.next_lease_end().and_then(|end| self.clock.instant_of(end));
        if self.shard.booking_count() == 0 {
            // Nothing can be posted to a shard without bookings but stale
            // changes that find nothing; the next ring drains them.
            return lease;
        }
        let drain = Instant::now() + POSTED_DRAIN;
        Some(lease.map_or(drain, |lease| lease.min(drain)))
    }

    /// Ready to park: nothing queued (the doorbell now armed), or stopping.
    fn idle(&mut self) -> Idle {
        if self.pass() > 0 {
            return Idle::Busy;
        }
        self.expire_due();
        if self.shared.stopping() && !self.has_work() {
            return Idle::Stop;
        }
        let since = Instant::now();
        if self.spin_for_work() || !self.shared.doorbell.prepare_sleep(|| self.has_work() || self.shared.stopping()) {
            self.spin.work_arrived(since, Instant::now());
            return Idle::Busy;
        }
        Idle::Sleep { deadline: self.deadline(), since }
    }

    /// Last drain: whatever a producer pushed before it could see `exited`
    /// is still answered.
    pub(crate) fn finish(&mut self) {
        self.shared.exited.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.pass();
    }

    /// The std-thread shard's loop: sleeping parks the thread on the
    /// doorbell's futex (a glommio shard runs `glommio_shard::run` instead).
    pub(crate) fn run(mut self) {
        loop {
            match self.idle() {
                Idle::Busy => {}
                Idle::Stop => return self.finish(),
                Idle::Sleep { deadline, since } => {
                    // Woken by the deadline: the gap is at least that long.
                    let at = self.shared.doorbell.sleep_blocking(deadline).unwrap_or_else(Instant::now);
                    self.spin.work_arrived(since, at);
                }
            }
        }
    }
}

/// Prefetches the run of KV events at the head of `ring` (at most `most`
/// commands), without taking them; returns how many the window covered.
fn prefetch_events_at_head(shard: &Shard, ring: &mut Consumer<Command>, most: usize) -> usize {
    if !ring.peek().is_ok_and(|command| matches!(command, Command::Event(..))) {
        return 0;
    }
    let Ok(chunk) = ring.read_chunk(ring.slots().min(most)) else { return 0 };
    let (first, second) = chunk.as_slices();
    // Dropped uncommitted: the commands stay in the ring for `pop`.
    shard.prefetch_head(first.iter().chain(second).map_while(|command| match command {
        Command::Event(worker, event) => Some((*worker, event)),
        _ => None,
    }))
}

enum Idle {
    Busy,
    Stop,
    /// Park until rung or `deadline`; idle since `since`.
    Sleep {
        deadline: Option<Instant>,
        since: Instant,
    },
}

/// What a one-visit pick reads besides the shard.
struct PickContext<'a> {
    admissions: &'a Admissions,
    picking: &'a Picking,
    /// Told of what happens to bookings (own ones published to peers).
    replicas: &'a ReplicaHooks,
    clock: &'a Clock,
}

/// Applies a change to one of this replica's own bookings and tells the
/// replica sync when it took (the copy is made only when one listens).
fn apply_own(shard: &mut Shard, context: &PickContext<'_>, event: BookingEvent) -> Result<(), BookingError> {
    let Some(observer) = context.replicas.observer() else { return shard.apply_booking(event) };
    let copy = event.clone();
    shard.apply_booking(event)?;
    observer.own(&copy, context.clock.now());
    Ok(())
}

/// Runs one command. A dropped reply means the asker gave up (its request
/// was cancelled): the work is done all the same, so state stays exact.
fn handle(shard: &mut Shard, context: &PickContext<'_>, scratch: &mut Scratch, command: Command) {
    match command {
        Command::Upsert(spec, reply) => {
            shard.upsert_worker(spec);
            let _ = reply.send(());
        }
        Command::Delete(id, reply) => {
            let freed = shard.delete_worker(id);
            if let Some(freed) = &freed {
                context.replicas.dropped(freed, context.clock.now());
            }
            let _ = reply.send(freed);
        }
        Command::Event(worker, event) => {
            // Failures are counted in the shard's stats; a block size that
            // disagrees is said once per worker, at warn: until it is
            // fixed nothing that worker caches can ever match.
            let before = shard.engine_block_size(worker);
            if let Err(EventError::BlockSizeMismatch { event, worker: ours }) = shard.apply_event(worker, &event) {
                if before != Some(event) {
                    let endpoint = shard.worker_spec(worker).map(|s| s.endpoint.to_string()).unwrap_or_default();
                    tracing::warn!(
                        worker = worker.0,
                        %endpoint,
                        engine_block_size = event,
                        kvpick_block_size = ours,
                        "worker {endpoint} publishes KV blocks of {event} tokens but kvpick hashes blocks of {ours} \
                         (--block-size / DYN_KV_CACHE_BLOCK_SIZE, or the worker's block_size): its events are refused \
                         and nothing it caches can match until both are the same (kvpick_worker_block_size_mismatch)"
                    );
                }
            }
        }
        Command::Candidates(query, reply) => {
            let mut out = Vec::with_capacity(shard.worker_count());
            let query = CandidateQuery {
                seq_hashes: &query.seq_hashes,
                model: query.model.as_deref(),
                allowed: query.allowed.as_ref(),
            };
            shard.candidates(&query, &mut out);
            let _ = reply.send(out);
        }
        Command::Pick(job, reply) => {
            let _ = reply.send(pick_and_book(shard, context, scratch, *job));
        }
        Command::Booking(event, reply) => {
            let _ = reply.send(apply_own(shard, context, event));
        }
        Command::Take(id, reply) => {
            let taken = shard.take_booking(id);
            if taken.is_ok() {
                context.replicas.own(&BookingEvent::Freed(id), context.clock.now());
            }
            let _ = reply.send(taken);
        }
        Command::Posted(event) => {
            // The poster already answered from the ledger; a miss here
            // means the lease expired or the worker left in between, and
            // then there is nothing left to change.
            if let Err(error) = apply_own(shard, context, event) {
                tracing::debug!(%error, "posted booking change found nothing to change");
            }
        }
        // A peer's change: the service checked whose it is; never
        // published again (each replica publishes only its own).
        Command::Peer(event, reply) => {
            let _ = reply.send(shard.apply_booking(event));
        }
        Command::Speed(worker, speed) => {
            shard.set_speed(worker, speed);
        }
        Command::Export(worker, reply) => {
            let _ = reply.send(shard.export_worker(worker));
        }
        Command::Import(worker, snapshot, reply) => {
            let _ = reply.send(shard.import_worker(worker, &snapshot));
        }
        Command::Expire(now, reply) => {
            let expired = shard.expire(now);
            context.replicas.dropped(&expired, now);
            let _ = reply.send(expired);
        }
        Command::Loads(reply) => {
            let _ = reply.send(shard.loads().collect());
        }
        Command::Overlaps(seq, reply) => {
            let _ = reply.send(shard.overlaps(&seq));
        }
        Command::Stats(reply) => {
            let _ = reply.send(shard.stats());
        }
    }
}

/// The facade's gather, pick and booking, on the shard that owns every
/// worker. The caller claimed the id in the ledger before sending; an
/// outcome that books nothing takes it out here, so the map stays exact
/// even when the caller has stopped waiting.
fn pick_and_book(shard: &mut Shard, context: &PickContext<'_>, scratch: &mut Scratch, job: PickJob) -> Picked {
    let PickJob { request, now } = job;
    let PickContext { admissions, picking, .. } = *context;
    let id = request.id;
    let Scratch { candidates, costs } = scratch;
    candidates.clear();
    let query = CandidateQuery {
        seq_hashes: &request.prompt.seq_hashes,
        model: request.model.as_deref(),
        allowed: request.allowed.as_ref(),
    };
    shard.candidates(&query, candidates);
    let outcome = match picking.decide(&request, candidates, costs, now) {
        Decision::NoEligible => Picked::Failed(SelectError::NoEligibleWorkers),
        Decision::Saturated => Picked::Saturated(request),
        Decision::Book { selection, booking } => match apply_own(shard, context, BookingEvent::Reserved(booking)) {
            Ok(()) => Picked::Booked(selection),
            // A booking of this id already here: the ledger would have
            // refused it first, so only a caller bypassing it gets here.
            Err(_) => Picked::Failed(SelectError::NoEligibleWorkers),
        },
    };
    if !matches!(outcome, Picked::Booked(_)) {
        super::lock(admissions).ledger.release(id);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpick_core::booking::{Booking, ReservationId};
    use kvpick_core::clock::Millis;
    use kvpick_core::worker::{WorkerId, WorkerSpec};

    fn shard_loop() -> ShardLoop {
        let common = LoopShared {
            clock: Clock::system(),
            admissions: Arc::new(Mutex::new(crate::admissions::Ledger::new(16))),
            picking: Arc::new(Picking::new(kvpick_core::PickPolicy::new(Default::default(), 16))),
            spin: Duration::ZERO,
            max_index_bytes: None,
            replicas: Default::default(),
        };
        ShardLoop::new(Arc::default(), &common)
    }

    #[test]
    fn a_shard_holding_bookings_sleeps_no_longer_than_the_posted_drain() {
        let mut shard_loop = shard_loop();
        let worker = WorkerId(1);
        shard_loop.shard.upsert_worker(WorkerSpec::new(worker, "10.0.0.1:8000".parse().unwrap(), 16));
        // Without bookings nothing posted can be waiting: sleep until rung.
        assert_eq!(shard_loop.deadline(), None);

        let lease_until = Millis(3_600_000);
        let booking = Booking {
            id: ReservationId(7),
            worker,
            seq_hashes: Arc::from(Vec::new()),
            unhashed_blocks: 1,
            prefill_tokens: 16,
            lease_until,
        };
        shard_loop.shard.apply_booking(BookingEvent::Reserved(booking)).unwrap();
        let before = Instant::now();
        let deadline = shard_loop.deadline().expect("a shard with bookings wakes on its own");
        assert!(deadline <= Instant::now() + POSTED_DRAIN, "the lease is an hour away; the drain comes first");
        assert!(deadline >= before + POSTED_DRAIN);

        shard_loop.shard.apply_booking(BookingEvent::Freed(ReservationId(7))).unwrap();
        // The freed lease stays in the heap until due; it is the only deadline left.
        assert_eq!(shard_loop.deadline(), shard_loop.clock.instant_of(lease_until));
    }

    /// A pass that finds many KV events queued applies them through
    /// prefetch windows (chains continued across events and windows,
    /// removals, refused events, a clear) exactly as one by one, and an
    /// export between them answers at its place in the ring.
    #[test]
    fn queued_events_apply_through_prefetch_windows_as_one_by_one() {
        use kvpick_core::event::KvEvent;
        use kvpick_core::hashing::{HashSeed, sequence_hashes};

        const BS: u32 = 4;
        let workers = [WorkerId(1), WorkerId(2), WorkerId(3)];
        let mut shard_loop = shard_loop();
        let mut reference = Shard::new();
        for (i, &worker) in workers.iter().enumerate() {
            let spec = WorkerSpec::new(worker, format!("10.0.0.{}:8000", i + 1).parse().unwrap(), BS);
            shard_loop.shard.upsert_worker(spec.clone());
            reference.upsert_worker(spec);
        }
        let tokens: Vec<u32> = (0..200 * BS).map(|t| t % 7).collect();
        let stored = |parent: Option<u64>, first: u64, from: usize, blocks: usize| KvEvent::Stored {
            block_hashes: (first..first + blocks as u64).collect(),
            parent,
            token_ids: tokens[from * BS as usize..(from + blocks) * BS as usize].to_vec(),
            block_size: BS,
            seed: HashSeed::default(),
        };
        let mut events = Vec::new();
        // Worker 1 stores one chain in one-block events (windows of many
        // events), worker 2 in 5-block ones interleaved with it.
        for b in 0..150usize {
            let parent = (b > 0).then(|| 1000 + b as u64 - 1);
            events.push((workers[0], stored(parent, 1000 + b as u64, b, 1)));
            if b % 5 == 0 && b < 100 {
                let parent = (b > 0).then(|| 2000 + b as u64 - 1);
                events.push((workers[1], stored(parent, 2000 + b as u64, b, 5)));
            }
        }
        events.push((workers[0], KvEvent::Removed { block_hashes: vec![1149, 1148, 77] }));
        events.push((workers[2], stored(Some(5), 3000, 0, 2))); // unknown parent: refused
        let mut wrong_size = stored(None, 3100, 0, 1);
        if let KvEvent::Stored { block_size, .. } = &mut wrong_size {
            *block_size = 8;
        }
        events.push((workers[2], wrong_size));
        events.push((WorkerId(9), stored(None, 3200, 0, 1))); // unknown worker
        let export_at = events.len();
        events.push((workers[1], KvEvent::Cleared));
        events.extend(
            (0..40usize).map(|b| (workers[2], stored((b > 0).then(|| 4000 + b as u64 - 1), 4000 + b as u64, b, 1))),
        );

        let (mut producer, consumer) = rtrb::RingBuffer::new(events.len() + 1);
        shard_loop.rings.push(consumer);
        let (export_reply, export) = oneshot::channel();
        let mut export_reply = Some(export_reply);
        for (i, (worker, event)) in events.iter().enumerate() {
            if let Some(reply) = export_reply.take_if(|_| i == export_at) {
                assert!(producer.push(Command::Export(workers[1], reply)).is_ok(), "room in the ring");
            }
            assert!(producer.push(Command::Event(*worker, event.clone())).is_ok(), "room in the ring");
        }
        let mut at_export = None;
        for (i, (worker, event)) in events.iter().enumerate() {
            if i == export_at {
                at_export = Some(reference.export_worker(workers[1]));
            }
            let _ = reference.apply_event(*worker, event);
        }
        while shard_loop.pass() > 0 {}

        assert_eq!(export.recv().expect("answered"), at_export.expect("exported"));
        let held_after = reference.export_worker(workers[1]).map_or(0, |snapshot| snapshot.blocks.blocks.len());
        assert_eq!(held_after, 0, "the clear after the export applied");
        assert_eq!(shard_loop.shard.stats(), reference.stats());
        for &worker in &workers {
            assert_eq!(shard_loop.shard.export_worker(worker), reference.export_worker(worker), "{worker:?}");
        }
        for end in [1, 40, 99, 148, 150, 200] {
            let probe = sequence_hashes(&tokens[..end * BS as usize], BS, HashSeed::default());
            assert_eq!(shard_loop.shard.overlaps(&probe), reference.overlaps(&probe), "prefix of {end} blocks");
        }
        assert_eq!(
            reference.overlaps(&sequence_hashes(&tokens[..150 * BS as usize], BS, HashSeed::default())).len(),
            2
        );
    }
}
