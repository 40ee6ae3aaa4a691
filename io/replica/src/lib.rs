//! Sharing bookings between kvpick replicas.
//!
//! Core's `replica` module keeps the books (numbering, gaps, resyncs,
//! digests). This crate turns its values into `kvpick.peer.v1` frames and
//! back (`wire`, refusing any frame that is too large, malformed or claims
//! what no replica could send, before core sees it), runs the sync task
//! between the shards and the peers (`sync`), and carries the frames
//! (`direct`: a gRPC stream to each peer, with mutual TLS when `tls` is
//! set; or `nats`: one NATS JetStream stream per pool).

pub mod codec;
pub mod direct;
pub mod endpoint;
pub mod metrics;
pub mod nats;
pub mod sync;
pub mod tls;
pub mod warm;
pub mod wire;

pub use direct::{DirectLinks, PeerService};
pub use endpoint::{DirectConfig, IndexSource, Pending};
pub use metrics::{LinkState, TransportMetrics};
pub use nats::{NatsConfig, NatsError, NatsLink, NatsTransport};
pub use sync::{Answer, Inbound, LinkId, OriginView, ReplicaSync, Sent, SyncConfig, SyncCounts, SyncStats, Transport};
pub use tls::{PeerTls, PeerTlsError};
pub use warm::{IndexSummary, WarmError, fetch_index};
pub use wire::{
    Frame, FrameError, IndexLimits, Limits, ResyncRequest, SnapshotPart, SnapshotParts, WorkerIndex, decode, encode,
    encode_snapshot,
};
