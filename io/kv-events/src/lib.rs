//! kvpick-kv-events: the engines' KV events, from the wire to the shards.
//!
//! Two layers:
//! - [`wire`]: the decoder of the engines' msgpack payloads, the ZMQ frame
//!   layouts and the per-publisher sequencer. Pure (no I/O, no threads, no
//!   clock), never panics on any input; fuzzed as is (`fuzz/`). Always built.
//! - The ingest (feature `ingest`, on by default): one thread
//!   ([`KvEventIngest`]) owns one ZMQ SUB socket per publisher (an engine
//!   data-parallel rank, i.e. one worker), connected to the engine's events
//!   endpoint (`tcp://podIP:5557` by default), and polls them all in one
//!   `zmq_poll`: thousands of workers cost one thread. Publishers come and
//!   go by commands over a channel (with an inproc PAIR to wake the poll,
//!   see `waker`). libzmq redials dropped connections with back-off and
//!   detects dead peers with ZMTP heartbeats ([`IngestConfig`]).
//!
//! Each message must be `[topic, seq (8-byte big-endian), payload]`;
//! anything else is counted and skipped ([`wire::frames`]). Per publisher,
//! batches are applied strictly in sequence order ([`wire::sequencer`]): a
//! gap is healed by a replay from the engine's replay ROUTER through a
//! DEALER (`replay`), live batches being buffered meanwhile; a sequence
//! going back means the engine restarted and the worker's blocks are
//! cleared; a first batch past 0 triggers a catch-up replay from 0.
//! Payloads are decoded by [`wire`] and the indexable events handed, in
//! order, to a [`KvEventSink`] (`apply`). Everything is counted in
//! [`IngestMetrics`].
//!
//! Network data is never trusted: no frame, length or sequence number can
//! make this code panic or allocate beyond libzmq's `max_frame_bytes` and
//! the replay buffer limit. Without `ingest` the crate depends on nothing
//! but kvpick-core (no libzmq, no runtime): what the fuzzers and the
//! simulator's decoder tests link.

pub mod wire;

mod config;
pub use config::{DEFAULT_EVENT_PORT, IngestConfig, Publisher, TRTLLM_DRAIN_PATH};

#[cfg(feature = "ingest")]
mod apply;
#[cfg(feature = "ingest")]
mod drain;
#[cfg(feature = "ingest")]
mod ingest;
#[cfg(feature = "ingest")]
mod metrics;
#[cfg(feature = "ingest")]
mod poll_loop;
#[cfg(feature = "ingest")]
mod replay;
#[cfg(feature = "ingest")]
mod sink;
#[cfg(feature = "ingest")]
mod subscription;
#[cfg(feature = "ingest")]
mod waker;
#[cfg(feature = "ingest")]
mod warm;

#[cfg(feature = "ingest")]
pub use ingest::{IngestError, KvEventIngest};
#[cfg(feature = "ingest")]
pub use metrics::{IngestCounters, IngestMetrics, WorkerIngestStats};
#[cfg(feature = "ingest")]
pub use sink::{Exported, Imported, KvEventSink, RoleSink, ShardSink, SharedService, SinkOutcome};
#[cfg(feature = "ingest")]
pub use warm::{SeedRefused, StreamCut, WorkerSeed};
pub use wire::frames::END_SEQ;
