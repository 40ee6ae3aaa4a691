//! kvpick's benchmarks, and the helpers they share.
//!
//! Each benchmark is a binary (`src/bin/`). The core benchmarks build a
//! synthetic but realistic KV-cache population ([`workload`]), drive
//! kvpick-core on it ([`setup`]) on the caller's thread, time it
//! ([`measure`]) against a baseline measured in the same run (a naive scan
//! in [`baseline`], or NVIDIA Dynamo's indexers in [`dynamo`] behind the
//! `dynamo` feature), and print a table ([`report`]).
//!
//! Dynamo is used through its public API, for comparison only: this crate
//! must never copy Dynamo's code, and kvpick-core must never depend on it.

/// Every benchmark runs on the allocator the `kvpick` binary ships with
/// (mimalloc), so in-process servers and shard threads allocate as they do
/// in production; glibc's malloc made cross-thread frees a visible part of
/// the hand-off.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod args;
pub mod baseline;
pub mod child;
#[cfg(feature = "dynamo")]
pub mod dynamo;
pub mod hf_model;
pub mod measure;
pub mod report;
pub mod setup;
pub use kvpick_sim as sim;
pub mod svg;
pub mod workload;
