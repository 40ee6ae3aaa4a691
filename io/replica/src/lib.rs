//! Sharing bookings between kvpick replicas: the bytes peers exchange.
//!
//! Core's `replica` module keeps the books (numbering, gaps, resyncs,
//! digests); this crate turns its values into `kvpick.peer.v1` frames and
//! back, refusing any frame that is too large, malformed or claims what no
//! replica could send, before core sees it. The transports (a gRPC stream
//! per peer pair, NATS JetStream) will live here too.

pub mod wire;

pub use wire::{Frame, FrameError, Limits, ResyncRequest, decode, encode};
