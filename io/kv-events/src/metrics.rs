//! Counters of the ingest thread, readable from any thread.
//!
//! The ingest thread is the only writer; readers (a metrics exporter,
//! tests) take [`IngestMetrics::snapshot`] and [`IngestMetrics::workers`].
//! All counters are monotonic. Relaxed atomics: each counter is exact, but
//! a snapshot is not one instant across counters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock};

use kvpick_core::WorkerId;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// A copy of every counter.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct IngestCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl Counters {
            fn snapshot(&self) -> IngestCounters {
                IngestCounters { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Batches decoded and handed to the sink, live or replayed.
    batches_applied,
    /// Events handed to the sink and applied or queued by it.
    events_applied,
    /// Block hashes in those events (stored and removed).
    blocks_applied,
    /// Events not indexed by rule: non-full-attention group, non-GPU medium,
    /// or a type the decoder does not know.
    events_skipped,
    /// Events dropped by the decoder for bad content (rest of batch kept).
    events_malformed,
    /// Events the sink refused (unknown worker, block size mismatch, …),
    /// unknown parents excepted.
    events_rejected,
    /// `BlockStored` events whose parent the worker does not hold: skipped.
    unknown_parent_events,
    /// Blocks of those events, never indexed.
    orphan_blocks,
    /// Payloads that failed to decode as a batch; the sequence advances.
    decode_errors,
    /// Messages whose frames were not `[topic, seq8, payload]` (or a bad
    /// replay reply); skipped.
    bad_frames,
    /// Sequence gaps detected on live streams.
    gaps,
    /// Replays requested (gap or catch-up).
    replays_started,
    /// Replays given up (`replay_attempts` silent ones, socket error, buffer full).
    replays_failed,
    /// Replays that went quiet after progress (an answer cut short) and
    /// were asked again from the first batch still missing.
    replays_resumed,
    /// Replays that went quiet without applying a batch (the replay socket
    /// down, the request lost) and were asked again, up to
    /// `replay_attempts` in a row.
    replays_retried,
    /// Batches applied from replays.
    replayed_batches,
    /// Batches known to be missed and never applied.
    lost_batches,
    /// Batches received twice and dropped.
    duplicate_batches,
    /// Batches overtaken by a later one on the way and dropped (their gap
    /// already healed or lost), not taken for a restart.
    late_batches,
    /// Sequence numbers going back: engine restarts (index cleared).
    engine_restarts,
    /// Live connections back after a drop whose replay held the engine's
    /// whole history: the worker's index rebuilt from it.
    rebuilds,
    /// Sockets that could not be opened or failed, and drain endpoints that
    /// are not a valid `http://` URI (publisher skipped).
    socket_errors,
    /// TensorRT-LLM `/kv_cache_events` answers decoded.
    drains,
    /// Drain polls that failed (no connection, timeout, error status, body
    /// over the cap or not a JSON list); the next one backs off.
    drain_errors,
    /// TensorRT-LLM events never received: ids skipped because the engine's
    /// event buffer overflowed before a drain (the worker is cleared).
    lost_events,
    /// Warm start: workers whose held stream was seeded with a peer's
    /// export and continued from its cut.
    streams_seeded,
    /// Warm start: held streams released without a seed (no peer, the
    /// deadline, the hold's buffer full): they started cold.
    streams_released_cold,
    /// Warm start: this replica's workers exported to a peer.
    streams_exported,
}

/// One publisher's state, as last seen by the ingest thread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkerIngestStats {
    pub worker: WorkerId,
    /// Sequence number of the last batch applied (TensorRT-LLM's drain:
    /// the last event id).
    pub last_seq: Option<u64>,
    pub batches_applied: u64,
    /// Wall clock at apply time minus the last applied batch's `ts`, in
    /// seconds (negative when the clocks disagree).
    pub lag_seconds: Option<f64>,
    pub replaying: bool,
}

const NONE_U64: u64 = u64::MAX;
const NONE_I64: i64 = i64::MIN;

/// Per-publisher gauges, updated without locks by the ingest thread.
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    worker: WorkerId,
    last_seq: AtomicU64,
    batches_applied: AtomicU64,
    lag_micros: AtomicI64,
    replaying: AtomicBool,
}

impl WorkerMetrics {
    fn new(worker: WorkerId) -> Self {
        WorkerMetrics {
            worker,
            last_seq: AtomicU64::new(NONE_U64),
            batches_applied: AtomicU64::new(0),
            lag_micros: AtomicI64::new(NONE_I64),
            replaying: AtomicBool::new(false),
        }
    }

    pub(crate) fn applied(&self, seq: u64, lag_seconds: f64) {
        self.last_seq.store(seq, Relaxed);
        self.batches_applied.fetch_add(1, Relaxed);
        // `as` saturates, and NaN becomes 0; keep the "none" marker free.
        let micros = ((lag_seconds * 1e6) as i64).max(NONE_I64 + 1);
        self.lag_micros.store(micros, Relaxed);
    }

    /// A drained answer applied, up to event `last_id`. Drained events
    /// carry no timestamp: the lag is left unknown.
    pub(crate) fn drained(&self, last_id: u64) {
        self.last_seq.store(last_id, Relaxed);
        self.batches_applied.fetch_add(1, Relaxed);
    }

    pub(crate) fn set_replaying(&self, replaying: bool) {
        self.replaying.store(replaying, Relaxed);
    }

    fn stats(&self) -> WorkerIngestStats {
        let last_seq = self.last_seq.load(Relaxed);
        let lag = self.lag_micros.load(Relaxed);
        WorkerIngestStats {
            worker: self.worker,
            last_seq: (last_seq != NONE_U64).then_some(last_seq),
            batches_applied: self.batches_applied.load(Relaxed),
            lag_seconds: (lag != NONE_I64).then(|| lag as f64 / 1e6),
            replaying: self.replaying.load(Relaxed),
        }
    }
}

/// Everything the ingest counts; shared with readers through an `Arc`.
#[derive(Debug, Default)]
pub struct IngestMetrics {
    pub(crate) counters: Counters,
    workers: RwLock<HashMap<WorkerId, Arc<WorkerMetrics>>>,
}

impl IngestMetrics {
    pub fn snapshot(&self) -> IngestCounters {
        self.counters.snapshot()
    }

    /// Publishers currently subscribed, by worker id.
    pub fn workers(&self) -> Vec<WorkerIngestStats> {
        let workers = self.workers.read().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<WorkerIngestStats> = workers.values().map(|w| w.stats()).collect();
        all.sort_by_key(|w| w.worker);
        all
    }

    pub fn worker(&self, worker: WorkerId) -> Option<WorkerIngestStats> {
        let workers = self.workers.read().unwrap_or_else(PoisonError::into_inner);
        workers.get(&worker).map(|w| w.stats())
    }

    /// Fresh gauges for a (re)subscribed publisher.
    pub(crate) fn register(&self, worker: WorkerId) -> Arc<WorkerMetrics> {
        let metrics = Arc::new(WorkerMetrics::new(worker));
        let mut workers = self.workers.write().unwrap_or_else(PoisonError::into_inner);
        workers.insert(worker, Arc::clone(&metrics));
        metrics
    }

    /// Drops a publisher's gauges, unless its worker has been registered
    /// afresh since (by the other ingest thread: a worker moving between
    /// ZMQ and the HTTP drain is added on one while removed on the other).
    pub(crate) fn unregister(&self, gauges: &Arc<WorkerMetrics>) {
        let mut workers = self.workers.write().unwrap_or_else(PoisonError::into_inner);
        if workers.get(&gauges.worker).is_some_and(|current| Arc::ptr_eq(current, gauges)) {
            workers.remove(&gauges.worker);
        }
    }
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}
