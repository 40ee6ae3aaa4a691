//! The Envoy `ext_proc` v3 server speaking the GAIE Endpoint Picker
//! Protocol: how every gateway asks kvpick where an LLM request should go.
//!
//! Per ext_proc stream (one HTTP request at the gateway, see [`stream`]):
//! request headers, then the body buffered until it ends, parsed
//! ([`body`]) and handed to the picker ([`pick`]); the answer is the
//! `x-gateway-destination-endpoint` header set with overwrite,
//! `clear_route_cache`, the same value in `envoy.lb` dynamic metadata, and
//! the body echoed back in chunks of at most 62,000 bytes ([`responses`]).
//! On the response path every message is answered, the first body chunk
//! completes the prefill, and the end of the response (or of the stream,
//! however it ends) frees the booking exactly once ([`pick::Booking`]).
//! Refusals are `ImmediateResponse`s with one status per reason, chosen in
//! [`error`].
//!
//! Each request can be traced with OpenTelemetry ([`trace`]), continuing
//! the gateway's W3C context; off unless the app sets a tracer.
//!
//! Protocol only: who picks (kvpick's router in `kvpick-router`, or a
//! baseline) is behind the [`Picks`] trait, and the gRPC port itself is
//! `kvpick-grpc`'s. This crate must never depend on the picker, the
//! reservations, the tokenizer clients or the shard runtime; they depend
//! on it. Runs on the I/O tokio runtime; must never block a runtime
//! thread or trust a client-supplied routing header.

pub mod body;
pub mod buckets;
pub mod config;
pub mod endpoints;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod headers;
pub mod inflight;
pub mod metadata;
pub mod metrics;
pub mod pick;
pub mod protocol;
pub mod responses;
pub mod server;
pub mod stream;
pub mod trace;
pub mod usage;

pub use body::Api;
pub use config::{AssumedBodyMode, ExtProcConfig};
pub use error::{RequestError, TokenizeError};
pub use metrics::{ExtProcMetrics, ExtProcMetricsSnapshot};
pub use pick::{BodyInput, Booking, Pick, PickInput, Picks};
pub use server::ExtProcServer;
pub use trace::{RequestTrace, Tracing};
