//! `kvpick.peer.v1`: what kvpick replicas send each other to share
//! bookings (see `peer.proto` beside this crate's `Cargo.toml` for the
//! schema in protobuf syntax; the two must agree field for field, and the
//! byte-exact tests in kvpick-replica pin the encoding).
//!
//! Written with prost's derive rather than generated: the schema is small,
//! and deriving needs no `protoc` (see README.md).

/// One message on a peer stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerFrame {
    #[prost(oneof = "peer_frame::Body", tags = "1, 2, 3, 4")]
    pub body: Option<peer_frame::Body>,
}

pub mod peer_frame {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Body {
        #[prost(message, tag = "1")]
        Batch(super::Batch),
        #[prost(message, tag = "2")]
        Snapshot(super::Snapshot),
        #[prost(message, tag = "3")]
        Digest(super::Digest),
        #[prost(message, tag = "4")]
        Resync(super::ResyncRequest),
    }
}

/// Consecutive booking changes of one origin, numbered from `first_seq`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Batch {
    #[prost(fixed64, tag = "1")]
    pub origin: u64,
    #[prost(fixed64, tag = "2")]
    pub incarnation: u64,
    #[prost(uint64, tag = "3")]
    pub first_seq: u64,
    #[prost(message, repeated, tag = "4")]
    pub events: Vec<Event>,
    /// The origin's wall clock when it sent the batch, µs since the Unix
    /// epoch (0: not said); for measuring delay only.
    #[prost(fixed64, tag = "5")]
    pub sent_unix_micros: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(oneof = "event::Kind", tags = "1, 2, 3, 4")]
    pub kind: Option<event::Kind>,
}

pub mod event {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Reserved(super::Booking),
        /// A reservation id.
        #[prost(fixed64, tag = "2")]
        PrefillComplete(u64),
        #[prost(message, tag = "3")]
        Renewed(super::Renewed),
        /// A reservation id.
        #[prost(fixed64, tag = "4")]
        Freed(u64),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Booking {
    #[prost(fixed64, tag = "1")]
    pub id: u64,
    #[prost(fixed64, tag = "2")]
    pub worker: u64,
    #[prost(fixed64, repeated, tag = "3")]
    pub seq_hashes: Vec<u64>,
    #[prost(uint32, tag = "4")]
    pub unhashed_blocks: u32,
    #[prost(uint32, tag = "5")]
    pub prefill_tokens: u32,
    #[prost(uint64, tag = "6")]
    pub lease_left_ms: u64,
    #[prost(bool, tag = "7")]
    pub prefill_done: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Renewed {
    #[prost(fixed64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub lease_left_ms: u64,
}

/// The origin's live bookings right after its event `last_seq`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Snapshot {
    #[prost(fixed64, tag = "1")]
    pub origin: u64,
    #[prost(fixed64, tag = "2")]
    pub incarnation: u64,
    #[prost(uint64, tag = "3")]
    pub last_seq: u64,
    #[prost(message, repeated, tag = "4")]
    pub bookings: Vec<Booking>,
    /// A snapshot too large for one frame is sent as `parts` consecutive
    /// frames, `part` counting from 0, each holding some of the bookings;
    /// `parts` 0 or 1: whole.
    #[prost(uint32, tag = "5")]
    pub part: u32,
    #[prost(uint32, tag = "6")]
    pub parts: u32,
}

/// Count and wrapping sum of per-booking hashes of the origin's live set.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Digest {
    #[prost(fixed64, tag = "1")]
    pub origin: u64,
    #[prost(fixed64, tag = "2")]
    pub incarnation: u64,
    #[prost(uint64, tag = "3")]
    pub last_seq: u64,
    #[prost(uint64, tag = "4")]
    pub live: u64,
    #[prost(fixed64, tag = "5")]
    pub sum: u64,
}

/// Asks `origin` for a snapshot: the sender holds its events before `from_seq`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResyncRequest {
    #[prost(fixed64, tag = "1")]
    pub origin: u64,
    #[prost(fixed64, tag = "2")]
    pub incarnation: u64,
    #[prost(uint64, tag = "3")]
    pub from_seq: u64,
}

/// Warm start: the asker of an index.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IndexRequest {
    #[prost(fixed64, tag = "1")]
    pub replica: u64,
}

/// One message of an index stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IndexFrame {
    #[prost(oneof = "index_frame::Body", tags = "1, 2")]
    pub body: Option<index_frame::Body>,
}

pub mod index_frame {
    // One frame is decoded at a time: the unboxed worker's size costs
    // nothing, and boxing would add an allocation per frame.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Body {
        #[prost(message, tag = "1")]
        Worker(super::IndexWorker),
        #[prost(message, tag = "2")]
        End(super::IndexEnd),
    }
}

/// One worker's index at its stream's cut, or a part of it (see
/// `peer.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct IndexWorker {
    #[prost(fixed64, tag = "1")]
    pub worker: u64,
    #[prost(uint32, tag = "2")]
    pub block_size: u32,
    #[prost(uint64, tag = "3")]
    pub last_seq: u64,
    #[prost(double, tag = "4")]
    pub last_ts: f64,
    #[prost(bool, tag = "5")]
    pub has_ts: bool,
    #[prost(uint32, repeated, tag = "6")]
    pub group_kinds: Vec<u32>,
    #[prost(fixed64, repeated, tag = "7")]
    pub engine: Vec<u64>,
    #[prost(fixed64, repeated, tag = "8")]
    pub parent: Vec<u64>,
    #[prost(bytes = "vec", tag = "9")]
    pub roots: Vec<u8>,
    #[prost(fixed64, repeated, tag = "10")]
    pub seq: Vec<u64>,
    #[prost(uint32, repeated, tag = "11")]
    pub seed_at: Vec<u32>,
    #[prost(fixed64, repeated, tag = "12")]
    pub seed: Vec<u64>,
    #[prost(fixed64, repeated, tag = "13")]
    pub orphan_engine: Vec<u64>,
    #[prost(fixed64, repeated, tag = "14")]
    pub orphan_seq: Vec<u64>,
    #[prost(bool, tag = "15")]
    pub tainted: bool,
    #[prost(double, tag = "16")]
    pub churn_stored: f64,
    #[prost(double, tag = "17")]
    pub churn_removed: f64,
    #[prost(uint32, tag = "18")]
    pub part: u32,
    #[prost(uint32, tag = "19")]
    pub parts: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct IndexEnd {
    #[prost(uint64, tag = "1")]
    pub workers: u64,
    #[prost(uint64, tag = "2")]
    pub blocks: u64,
}
