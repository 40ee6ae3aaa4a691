//! A producer thread's hand-off into the shards: one single-producer,
//! single-consumer ring per shard, owned by this producer alone.
//!
//! Rings are `rtrb`: wait-free SPSC with cached indices, so a push is a
//! couple of plain loads and one release store in the common case. A
//! crossbeam `ArrayQueue` is MPMC (CAS per push and pop) and a channel
//! allocates per message; `perf/` measures the three side by side.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rtrb::{PushError, RingBuffer};

use super::command::Command;
use super::deferred_ring::{DeferredRings, PendingRings, RingScheduler};
use super::shard_loop::ShardShared;

/// Counters of back-pressure, shared by every producer of a runtime.
#[derive(Debug, Default)]
pub struct RingCounters {
    /// Pushes that found a ring full and waited.
    pub full_waits: AtomicU64,
    /// Selections refused because a ring stayed full past the bound.
    pub selections_refused: AtomicU64,
    /// Glommio shards woken by a signal after a lost wake-up (`nudge`).
    pub glommio_nudges: AtomicU64,
}

/// Why a push did not happen.
pub(crate) enum PushFail {
    Full(Command),
    /// The shard stopped: nothing will answer.
    Gone,
}

#[derive(Clone, Copy)]
enum Wake {
    Ring,
    Quiet,
    /// Quiet now, rung once for the batch (see `deferred_ring`).
    Deferred,
}

/// The shard stopped: nothing will take the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShardGone;

pub struct Producer {
    rings: Vec<rtrb::Producer<Command>>,
    shards: Vec<Arc<ShardShared>>,
    counters: Arc<RingCounters>,
    deferred: Arc<DeferredRings>,
    /// A deferred push's ring, for the caller to schedule.
    to_schedule: Option<PendingRings>,
}

impl Producer {
    pub(crate) fn new(shards: &[Arc<ShardShared>], capacity: usize, counters: Arc<RingCounters>) -> Self {
        let rings = shards
            .iter()
            .map(|shard| {
                let (producer, consumer) = RingBuffer::new(capacity);
                shard.add_ring(consumer);
                producer
            })
            .collect();
        Producer { rings, shards: shards.to_vec(), counters, deferred: DeferredRings::new(shards), to_schedule: None }
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.rings.len()
    }

    /// The ring a deferred push left to schedule, if it fell to this push
    /// to schedule one.
    pub(crate) fn take_to_schedule(&mut self) -> Option<PendingRings> {
        self.to_schedule.take()
    }

    /// On success: whether the shard was awake (polling its rings) when
    /// the command went in, so its answer is worth spinning for. `Quiet`
    /// leaves a sleeping shard asleep (see `push_posted`).
    fn try_push(&mut self, shard: usize, command: Command, wake: Wake) -> Result<bool, PushFail> {
        let target = &self.shards[shard];
        if target.exited() {
            return Err(PushFail::Gone);
        }
        let is_event = command.is_event();
        match self.rings[shard].push(command) {
            Ok(()) if target.is_inline() => {
                // Run here and now: nothing sleeps, nothing is deferred,
                // and the answer is in its slot before the caller looks.
                target.combine(is_event);
                if target.exited() { Err(PushFail::Gone) } else { Ok(true) }
            }
            Ok(()) => {
                // `ring` fences, so the `exited` load is ordered after the push.
                let woken = match wake {
                    Wake::Ring => target.doorbell.ring(),
                    Wake::Quiet => {
                        std::sync::atomic::fence(Ordering::SeqCst);
                        false
                    }
                    Wake::Deferred => {
                        if let Some(pending) = self.deferred.defer(shard) {
                            self.to_schedule = Some(pending);
                        }
                        false
                    }
                };
                if target.exited() { Err(PushFail::Gone) } else { Ok(!woken) }
            }
            Err(PushError::Full(command)) => Err(PushFail::Full(command)),
        }
    }

    /// Pushes a command nobody waits for without waking a sleeping shard:
    /// the wake-up (a futex call and a context switch on each side, tens
    /// of µs on a VM) would cost more than the command. A sleeping shard
    /// that holds bookings wakes within `POSTED_DRAIN` on its own, and any
    /// command that rings drains every ring first. A full ring rings and
    /// waits, as `push_waiting` does.
    pub(crate) fn push_posted(&mut self, shard: usize, command: Command) -> Result<(), ShardGone> {
        match self.try_push(shard, command, Wake::Quiet) {
            Ok(_) => Ok(()),
            Err(PushFail::Gone) => Err(ShardGone),
            Err(PushFail::Full(command)) => self.push_waiting(shard, command).map(drop),
        }
    }

    /// Pushes, waiting as long as the shard needs: for messages that must
    /// not be lost (KV events, booking changes). Each wait is counted.
    /// Returns whether the shard was awake (see `try_push`).
    pub(crate) fn push_waiting(&mut self, shard: usize, command: Command) -> Result<bool, ShardGone> {
        let mut command = match self.try_push(shard, command, Wake::Ring) {
            Ok(awake) => return Ok(awake),
            Err(PushFail::Gone) => return Err(ShardGone),
            Err(PushFail::Full(command)) => command,
        };
        self.counters.full_waits.fetch_add(1, Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            command = match self.try_push(shard, command, Wake::Ring) {
                Ok(awake) => return Ok(awake),
                Err(PushFail::Gone) => return Err(ShardGone),
                Err(PushFail::Full(command)) => command,
            };
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Pushes, or gives the command back once `bound` has passed with the
    /// ring still full: selections fail fast rather than queue unseen.
    /// Returns whether the shard was awake (see `try_push`). `defer`: the
    /// push rings later, with the others of its batch (`take_to_schedule`);
    /// a full ring always rings at once.
    pub(crate) fn push_bounded(
        &mut self,
        shard: usize,
        command: Command,
        bound: Duration,
        defer: bool,
    ) -> Result<bool, PushFail> {
        let wake = if defer { Wake::Deferred } else { Wake::Ring };
        let mut command = match self.try_push(shard, command, wake) {
            Err(PushFail::Full(command)) => command,
            done => return done,
        };
        self.counters.full_waits.fetch_add(1, Ordering::Relaxed);
        let give_up = Instant::now() + bound;
        loop {
            if Instant::now() >= give_up {
                self.counters.selections_refused.fetch_add(1, Ordering::Relaxed);
                return Err(PushFail::Full(command));
            }
            std::thread::yield_now();
            command = match self.try_push(shard, command, Wake::Ring) {
                Err(PushFail::Full(command)) => command,
                done => return done,
            };
        }
    }
}

/// Lends a `Producer` to the runtime for the synchronous part of an
/// operation (never across an await, so an async task may resume on
/// another thread and use that thread's producer).
pub trait ProducerSource {
    fn with_producer<R>(&self, f: impl FnOnce(&mut Producer) -> R) -> R;

    /// Whether a caller waiting on an awake shard polls for the answer
    /// (up to `RuntimeConfig::spin_before_park`) before awaiting it. Yes
    /// for a thread that has nothing else to do; an async runtime's task
    /// says no, since its thread would stop serving every other task (in
    /// `kvpick-bench-extproc` at concurrency 64 the spin cost the I/O
    /// thread more than the wake-ups it saved).
    fn spins_for_replies(&self) -> bool {
        true
    }

    /// Where selections' doorbells are rung once per batch; `None` rings
    /// on every push.
    fn ring_scheduler(&self) -> Option<&RingScheduler> {
        None
    }
}

impl ProducerSource for std::cell::RefCell<Producer> {
    fn with_producer<R>(&self, f: impl FnOnce(&mut Producer) -> R) -> R {
        f(&mut self.borrow_mut())
    }
}

impl ProducerSource for std::sync::Mutex<Producer> {
    fn with_producer<R>(&self, f: impl FnOnce(&mut Producer) -> R) -> R {
        f(&mut self.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// One producer per thread and service, made on first use: what an async
/// runtime's tasks use, since a task may resume on any of its threads.
#[derive(Clone)]
pub struct ThreadProducers {
    service: std::sync::Arc<super::ShardedService>,
    scheduler: Option<RingScheduler>,
}

impl ThreadProducers {
    pub fn new(service: std::sync::Arc<super::ShardedService>) -> Self {
        ThreadProducers { service, scheduler: None }
    }

    /// Selections ring their shard once per batch, through `scheduler`
    /// (see `deferred_ring`).
    pub fn with_ring_scheduler(self, scheduler: RingScheduler) -> Self {
        ThreadProducers { scheduler: Some(scheduler), ..self }
    }

    pub fn service(&self) -> &super::ShardedService {
        &self.service
    }
}

thread_local! {
    static PRODUCERS: std::cell::RefCell<std::collections::HashMap<u64, Producer>> = Default::default();
}

impl ProducerSource for ThreadProducers {
    fn spins_for_replies(&self) -> bool {
        false
    }

    fn ring_scheduler(&self) -> Option<&RingScheduler> {
        self.scheduler.as_ref()
    }

    fn with_producer<R>(&self, f: impl FnOnce(&mut Producer) -> R) -> R {
        PRODUCERS.with(|producers| {
            let mut producers = producers.borrow_mut();
            let producer = producers.entry(self.service.id()).or_insert_with(|| self.service.producer());
            f(producer)
        })
    }
}
