//! Warm start (issue #22): a replica starting up takes each worker's
//! index from a peer replica instead of relearning every engine's cache.
//!
//! The peer's export of a worker is taken on its ingest thread's own ring
//! to the shard, behind the events it handed over: the shard's answer is
//! exactly the index after the stream's last applied batch `S` (the cut).
//! Here, subscriptions opened while [`KvEventIngest::hold_for_seeds`]
//! holds keep their live batches; a seed imports the peer's export ahead
//! of every later event, then continues the stream from `S` (see
//! `wire::sequencer::hold`): batches the export covers are dropped, a gap
//! after `S` is replayed, an engine restarted since the cut clears it.
//!
//! [`KvEventIngest::hold_for_seeds`]: crate::KvEventIngest::hold_for_seeds

use kvpick_core::WorkerId;
use kvpick_core::index::ImportError;
use kvpick_core::shard::WorkerSnapshot;

/// Where a worker's stream stood when its index was exported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamCut {
    /// The last batch the export holds.
    pub last_seq: u64,
    /// Its stamp (the engine's wall clock), which tells a batch the export
    /// covers from a restarted engine's numbered alike.
    pub last_ts: Option<f64>,
    /// The groups' kinds the stream had learned, by index (removals that
    /// name only a group are judged by them).
    pub groups: Vec<Option<bool>>,
}

/// A worker's index from a peer and where its stream stood.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSeed {
    pub worker: WorkerId,
    pub cut: StreamCut,
    pub snapshot: WorkerSnapshot,
}

/// Why a seed was not taken (the worker's stream is as it was).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SeedRefused {
    /// The seed back, for a later try (discovery may still be adding the
    /// worker).
    #[error("the worker has no KV-event subscription here")]
    NotSubscribed(Box<WorkerSeed>),
    #[error("the worker's stream is not held (it started on its own)")]
    NotHeld,
    #[error("the export is malformed: {0}")]
    Malformed(ImportError),
    #[error("this ingest's sink cannot import")]
    CannotImport,
    #[error("the KV-event ingest has stopped")]
    Stopped,
}
