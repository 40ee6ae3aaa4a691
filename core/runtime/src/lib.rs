//! kvpick-runtime: the thread-per-core runtime over kvpick-core. S shard
//! threads, each owning one `Shard`, fed through per-producer SPSC rings,
//! answering through one-shot slots. The only crate of kvpick that spawns,
//! pins and parks threads; the decisions it makes are kvpick-core's
//! (`PickPolicy`), so it never decides differently from the facade.
//!
//! A shard runs inline, on whichever thread pushes to it, one thread at a
//! time (`ShardShared::combine`, flat combining over the same rings: the
//! default because it measures faster); or on a plain pinned thread
//! (`shard_loop`: drain the rings, spin briefly, park on a futex); or as a
//! glommio executor pinned to its core doing executor work
//! (`glommio_shard`: prioritised task queues, timers, glommio's own
//! cross-thread wake-up), which needs io_uring (Docker's and containerd's
//! default seccomp profiles block it). The choice is made once at start-up,
//! logged with its reason, and can be forced. `ShardedService` is the scatter–gather front: it returns
//! exactly what `SelectionService` returns for the same seed and the same
//! operations issued from one producer.

mod admissions;
mod clock;
mod command;
mod deferred_ring;
mod doorbell;
mod glommio_shard;
mod nudge;
mod producer;
mod replicas;
mod service;
mod shard_loop;
mod spin_policy;
mod timing;

use std::sync::Arc;
use std::time::Duration;

pub use clock::Clock;
pub use deferred_ring::{PendingRings, RingScheduler};
pub use producer::{Producer, ProducerSource, RingCounters, ThreadProducers};
pub use replicas::BookingObserver;
pub use service::ShardedService;
pub use timing::{SelectTiming, ShardAnswer};

/// Which executor hosts the shard loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    Glommio,
    StdThreads,
    /// No shard threads: a shard runs on whichever thread pushes to it,
    /// one at a time (flat combining, `ShardShared::combine`). A pick
    /// costs its own few µs on the caller's thread instead of a hand-off,
    /// a wake-up and a core given to spinning.
    Inline,
}

/// What `RuntimeChoice::Auto` runs (see there for why).
const AUTO_KIND: RuntimeKind = RuntimeKind::Inline;

/// How to choose the executor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RuntimeChoice {
    /// The executor that measured faster in the same run: today inline
    /// shards. In `kvpick-bench-extproc` (both kinds side by side) the
    /// select phase fell from 148 to 3 µs at p50 and from 2.6 ms to 8 µs
    /// at p99, and in open-loop runs (`perf/open-loop/run.sh`) a shard
    /// thread that sleeps between requests added 615 µs at p50 at 500
    /// requests/s where the inline shard adds 62. Between the threaded
    /// kinds, std threads beat glommio: a glommio shard's sleep and
    /// cross-thread wake-up (io_uring, eventfd, a process-wide memory
    /// barrier) cost a selection several times the CPU of a futex park.
    #[default]
    Auto,
    Force(RuntimeKind),
}

#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    pub shards: usize,
    /// CPUs to pin shard `i` to (`cpus[i % len]`); empty: no pinning.
    pub cpus: Vec<usize>,
    pub choice: RuntimeChoice,
    /// Commands each producer ring holds.
    pub ring_capacity: usize,
    /// How long a selection waits for room in a full ring before it is
    /// refused as overloaded.
    pub selection_wait: Duration,
    /// How long an idle shard polls its rings before parking: a parked
    /// shard costs a futex wake-up (tens of µs on a busy VM) per request,
    /// a spinning one a core. Zero parks at once. The shard spins only
    /// while its recent idle gaps were shorter than this (see
    /// `spin_policy`). Also how long a blocking caller polls for the
    /// answer of a shard that was awake when asked, before awaiting it.
    /// Both are off when shards outnumber the cores.
    pub spin_before_park: Duration,
}

impl Default for RuntimeConfig {
    /// One shard per core but one (left to the I/O runtime), at least one,
    /// pinned to the highest-numbered cores.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let shards = cores.saturating_sub(1).max(1);
        RuntimeConfig {
            shards,
            cpus: (cores - shards..cores).collect(),
            choice: RuntimeChoice::Auto,
            ring_capacity: 4096,
            selection_wait: Duration::from_millis(5),
            spin_before_park: Duration::from_micros(50),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("glommio was forced but cannot start here: {0}")]
    GlommioUnavailable(String),
    #[error("could not start shard thread {shard}: {source}")]
    Spawn { shard: usize, source: std::io::Error },
}

/// Whether a glommio executor can be built here (io_uring allowed, enough
/// locked memory, the CPU exists); the error says why not.
pub fn probe_glommio(cpu: Option<usize>) -> Result<(), String> {
    let placement = cpu.map_or(glommio::Placement::Unbound, glommio::Placement::Fixed);
    std::thread::spawn(move || {
        glommio::LocalExecutorBuilder::new(placement).make().map(drop).map_err(|e| e.to_string())
    })
    .join()
    .unwrap_or_else(|_| Err("the probe thread panicked".to_owned()))
}

pub(crate) fn choose_kind(config: &RuntimeConfig) -> Result<(RuntimeKind, String), RuntimeError> {
    let cpu = config.cpus.first().copied();
    match config.choice {
        RuntimeChoice::Force(kind @ (RuntimeKind::StdThreads | RuntimeKind::Inline)) => {
            Ok((kind, "forced by configuration".into()))
        }
        RuntimeChoice::Force(RuntimeKind::Glommio) => match probe_glommio(cpu) {
            Ok(()) => Ok((RuntimeKind::Glommio, "forced by configuration".into())),
            Err(why) => Err(RuntimeError::GlommioUnavailable(why)),
        },
        RuntimeChoice::Auto => Ok((
            AUTO_KIND,
            "the default: inline shards measure faster than shard threads (no hand-off, no wake-up)".into(),
        )),
    }
}

impl RuntimeConfig {
    /// Whether the shards will run inline (forced, or `Auto`'s choice).
    pub fn inline(&self) -> bool {
        matches!(self.choice, RuntimeChoice::Auto if AUTO_KIND == RuntimeKind::Inline)
            || self.choice == RuntimeChoice::Force(RuntimeKind::Inline)
    }
}

/// Polls before a thread parks for less.
const PURE_SPIN: Duration = Duration::from_micros(5);

/// Polls `ready` until it holds (true) or `budget` has passed (false).
/// After the first few µs the core is yielded between polls: on a machine
/// with more runnable threads than cores, the thread being waited for may
/// be queued behind this one on the same core, and a pure spin would hold
/// it off until the scheduler preempts (milliseconds).
pub(crate) fn spin_until(budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    if budget.is_zero() {
        return false;
    }
    let start = std::time::Instant::now();
    loop {
        if ready() {
            return true;
        }
        let spent = start.elapsed();
        if spent >= budget {
            return false;
        }
        if spent < PURE_SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Locks that are never held across a panic-prone call; a poisoned one
/// still holds consistent data.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn pin_current_thread(cpu: usize) {
    let pinned = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
    if !pinned {
        tracing::warn!(cpu, "could not pin shard thread; it runs unpinned");
    }
}

pub(crate) type SharedShards = Vec<Arc<shard_loop::ShardShared>>;
