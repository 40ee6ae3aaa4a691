//! `kvpick sidecar`: the decode pod's side of disaggregated prefill/decode.
//!
//! The gateway sends a split request to the decode pod with the prefill
//! endpoint the EPP chose in `x-prefiller-host-port`. The sidecar, in front
//! of the decode engine, runs that engine's P/D protocol ([`protocol`]):
//! vLLM's NixlConnector legs, SGLang's bootstrap pair or TensorRT-LLM's
//! context and generation legs, and streams the decode engine's answer
//! back. Requests without a valid header, and every other route, go to the
//! decode engine whole.
//!
//! Guarantees: orchestration headers never reach an engine; a client's
//! cancel drops both legs' connections, which aborts them in the engines;
//! a failed or slow prefill leg runs the request whole (or fails it, by
//! setting) with the reason on the answer and in a metric; the answer
//! streams frame by frame, never buffered; every answer says on its
//! headers how the request ran (`x-kvpick-pd`), which is when the EPP
//! releases the prefill booking.

pub mod body;
pub mod config;
pub mod engines;
pub mod error;
pub mod flow;
pub mod headers;
pub mod local_engine;
pub mod metrics;
pub mod prefiller;
pub mod protocol;
pub mod server;

pub use config::{EngineKind, OnPrefillFailure, PrefillAllow, SidecarConfig};
pub use metrics::{SidecarMetrics, Snapshot};
pub use server::Sidecar;
