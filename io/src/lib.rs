//! kvpick's I/O side: everything that talks to the network, and the
//! `kvpick` binary that wires it to the selection core.
//!
//! - [`ext_proc`]: the Envoy ext_proc server speaking the GAIE Endpoint
//!   Picker Protocol. Serving a gRPC port (HTTP/2 settings, TLS, shutdown)
//!   and gRPC health are their own crate, `kvpick-grpc` (`io/grpc`).
//! - KV-event ingest lives in its own crate, `kvpick-kv-events` (`io/kv-events`).
//! - [`tokenizer`]: vLLM render and SGLang tokenize clients.
//! - Discovery (the InferencePool, its pods, the peer replicas, or a static
//!   workers file) is its own crate, `kvpick-discovery` (`io/discovery`).
//! - [`metrics`]: Prometheus export of every part's counters.
//! - [`app`]: all of it started in order and stopped in reverse
//!   (`kvpick serve`), with its configuration.
//! - `testing` (feature `testing`, on with `demo`): a word tokenizer and a
//!   miniature gateway, for tests, the demo and benchmarks.
//!
//! The ext_proc server, health, metrics, tokenizer clients and watchers
//! run on the tokio I/O runtime;
//! the ingest runs on one dedicated blocking thread (libzmq sockets
//! are not thread-safe and block); nothing here runs on a shard's core.
//! This crate depends on `kvpick-core`; `kvpick-core` must never depend on it,
//! and nothing in it may touch a shard's state except through a sink.

pub mod app;
pub mod ext_proc;
pub mod metrics;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;
