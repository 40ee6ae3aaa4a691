//! The Envoy `ext_proc` v3 server speaking the GAIE Endpoint Picker
//! Protocol: how every gateway asks kvpick where an LLM request should go.
//!
//! Per ext_proc stream (one HTTP request at the gateway, see [`stream`]):
//! request headers, then the body buffered until it ends, parsed
//! ([`body`]), tokenized and picked ([`picker`]); the answer is the
//! `x-gateway-destination-endpoint` header set with overwrite,
//! `clear_route_cache`, the same value in `envoy.lb` dynamic metadata, and
//! the body echoed back in chunks of at most 62,000 bytes ([`responses`]).
//! On the response path every message is answered, the first body chunk
//! completes the prefill, and the end of the response (or of the stream,
//! however it ends) frees the booking exactly once ([`reservation`]).
//! Refusals are `ImmediateResponse`s with one status per reason, chosen in
//! [`error`].
//!
//! Runs on the I/O tokio runtime; talks to the shards only through
//! `kvpick_runtime::ShardedService`. Must never block a runtime
//! thread or trust a client-supplied routing header.

pub mod body;
pub mod config;
pub mod endpoints;
pub mod error;
pub mod headers;
pub mod inflight;
pub mod metadata;
pub mod metrics;
pub mod picker;
pub mod protocol;
pub mod reservation;
pub mod responses;
pub mod server;
pub mod stream;
pub mod usage;

pub use config::{AssumedBodyMode, ExtProcConfig};
pub use error::RequestError;
pub use metrics::{ExtProcMetrics, ExtProcMetricsSnapshot};
pub use picker::{KvPicker, NullPicker, Picker, PickerConfig};
pub use server::ExtProcServer;
