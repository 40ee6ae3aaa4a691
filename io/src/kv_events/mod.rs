//! KV-event ingest: engines' ZMQ KV-event streams into the shards.
//!
//! One thread ([`KvEventIngest`]) owns one ZMQ SUB socket per publisher
//! (an engine data-parallel rank, i.e. one worker), connected to the
//! engine's events endpoint (`tcp://podIP:5557` by default), and polls them
//! all in one `zmq_poll`: thousands of workers cost one thread. Publishers
//! come and go by commands over a channel (with an inproc PAIR to wake the
//! poll, see `waker`). libzmq redials dropped connections with back-off and
//! detects dead peers with ZMTP heartbeats ([`IngestConfig`]).
//!
//! Each message must be `[topic, seq (8-byte big-endian), payload]`;
//! anything else is counted and skipped (`kvpick_core::wire::frames`). Per
//! publisher, batches are applied strictly in sequence order
//! (`kvpick_core::wire::sequencer`): a gap is healed by
//! a replay from the engine's replay ROUTER through a DEALER (`replay`),
//! live batches being buffered meanwhile; a sequence going back means the
//! engine restarted and the worker's blocks are cleared; a first batch past
//! 0 triggers a catch-up replay from 0. Payloads are decoded by
//! `kvpick_core::wire` and the indexable events handed, in order, to a
//! [`KvEventSink`] (`apply`). Everything is counted in [`IngestMetrics`].
//!
//! Network data is never trusted: no frame, length or sequence number can
//! make this code panic or allocate beyond libzmq's `max_frame_bytes` and
//! the replay buffer limit.

mod apply;
mod config;
mod ingest;
mod metrics;
mod poll_loop;
mod replay;
mod sink;
mod subscription;
mod waker;

pub use config::{DEFAULT_EVENT_PORT, IngestConfig, Publisher};
pub use ingest::{IngestError, KvEventIngest};
pub use kvpick_core::wire::frames::END_SEQ;
pub use metrics::{IngestCounters, IngestMetrics, WorkerIngestStats};
pub use sink::{KvEventSink, ShardSink, SharedService, SinkOutcome};
