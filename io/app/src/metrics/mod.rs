//! Prometheus export: the text exposition format of the fixed-bucket
//! histograms the request path records into (`kvpick_ext_proc::buckets`),
//! and the `/metrics` HTTP endpoint.
//!
//! Every subsystem keeps its own counters (plain atomics, read as
//! snapshots); [`collect`] reads them all at scrape time and writes one
//! exposition. Nothing is registered globally and nothing on the request
//! path formats text.
//!
//! Bucket bounds are constants ([`LATENCY_BUCKETS`], [`TOKEN_BUCKETS`]),
//! so two runs, two replicas or two versions can be compared bucket by
//! bucket.

pub mod collect;
pub mod debug;
mod exposition;
mod server;

pub use exposition::Exposition;
pub use kvpick_ext_proc::buckets::{BucketSnapshot, Buckets, LATENCY_BUCKETS, TOKEN_BUCKETS};
pub use server::{MetricsServer, MetricsSource};
