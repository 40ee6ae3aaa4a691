//! kvpick's app: the `kvpick` binary and what wires the other crates
//! together. The parts live in crates of their own:
//!
//! - `kvpick-ext-proc` (`io/ext-proc`): the Envoy ext_proc server speaking
//!   the GAIE Endpoint Picker Protocol, generic over who picks.
//! - `kvpick-router` (`io/router`): the KV-aware picker, its bookings and
//!   the engines' tokenizer clients.
//! - `kvpick-grpc` (`io/grpc`): serving a gRPC port (HTTP/2, TLS,
//!   shutdown) and gRPC health.
//! - `kvpick-kv-events` (`io/kv-events`): KV-event ingest.
//! - `kvpick-discovery` (`io/discovery`): the InferencePool, its pods, the
//!   peer replicas, or a static workers file.
//!
//! What is left here:
//!
//! - [`app`]: the one settings table (every flag, environment variable and
//!   default: no other crate knows their names), the typed configs built
//!   from it, and all of it started in order and stopped in reverse
//!   (`kvpick serve`).
//! - [`metrics`]: Prometheus export of every part's counters.
//!
//! Nothing here runs on a shard's core; `kvpick-core` must never depend on
//! this crate, and nothing in it may touch a shard's state except through a
//! sink.

pub mod app;
pub mod metrics;
