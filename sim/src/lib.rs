//! A simulated vLLM engine, for end-to-end tests, demos and benchmarks of
//! kvpick without GPUs.
//!
//! Each [`Engine`] speaks vLLM's wire:
//! - **HTTP** (axum, tokio): `/v1/chat/completions` and `/v1/completions`
//!   (JSON and SSE with `stream_options.include_usage`; `usage` with
//!   `prompt_tokens_details.cached_tokens`), `/v1/chat/completions/render`
//!   and `/v1/completions/render` (`token_ids` from the built-in
//!   [`tokenizer`], the one the engine caches with), `/health`,
//!   `/v1/models`, `/metrics` (vLLM's names), `/inference/v1/generate`
//!   (token ids in and out).
//! - **KV events**: a real ZMQ PUB socket, vLLM's three frames and msgpack
//!   payload (map or array events, byte-compatible with msgspec), and a
//!   replay ROUTER over a bounded buffer, on a thread of its own.
//!
//! Behind it, a [`scheduler`] works in virtual time: a [`prefix_cache`] of a
//! fixed number of blocks with LRU eviction of unreferenced blocks, block
//! hashes of its own that a router cannot derive ([`block_hash`]), chunked
//! prefill within `max_batched_tokens`, decoding slowed by the batch, and a
//! [`time_model`] whose virtual time runs `time_scale` times faster than
//! the wall clock. Same configuration and seed, same submissions in the
//! same order: same tokens, hashes, events and virtual timings.
//!
//! Disaggregated prefill/decode: an engine plays a [`PdRole`]. A prefill
//! engine keeps a finished prompt's blocks pinned under a lease and offers
//! them on a side channel of its own; a decode engine pulls them (the
//! sim's transfer: token ids over loopback TCP, the transfer time charged
//! per block), caches them and computes only the rest. Each flavour speaks
//! its engine's P/D wire: vLLM's NixlConnector `kv_transfer_params`,
//! SGLang's bootstrap fields, TensorRT-LLM's `disaggregated_params`.
//!
//! Fault knobs, per engine: drop a fraction of event batches (healable by
//! replay), send them out of order (swapped pairs), stall events or the
//! whole scheduler, restart (sequence numbers
//! from 0, cache emptied, optional `AllBlocksCleared`), shut down.
//!
//! Not modelled: preemption (a request reserves its prompt and completion
//! blocks on admission), caching of generated blocks, LoRA adapters and
//! `cache_salt` (ignored: they change neither hashes nor events), sampling
//! parameters other than `max_tokens` and `seed` (no EOS: every completion
//! is `max_tokens` long), several prompts or choices per request.
//!
//! Threads: the HTTP server and the engine loop are tasks on the caller's
//! tokio runtime; each engine's publisher is one std thread (blocking
//! libzmq). [`Fleet`] runs several engines in one process; the
//! `kvpick-sim` binary runs a fleet as its own process.

pub mod block_hash;
mod completions;
pub mod config;
pub mod engine;
mod engine_loop;
pub mod error;
pub mod event_batch;
pub mod event_drain;
pub mod fleet;
mod http_server;
mod metrics;
mod msgpack;
mod pd;
pub mod prefix_cache;
mod publisher;
mod render;
mod replay_buffer;
pub mod scheduler;
mod sglang_api;
pub mod time_model;
pub mod tokenizer;

pub use block_hash::{BlockDigest, EngineHasher};
pub use config::{EngineConfig, EventEncoding, Flavour, HashFormat, KvLoadFailurePolicy, PdRole, Ports, ReplayLayout};
pub use engine::{Engine, EngineEndpoints, Generation};
pub use engine_loop::{EngineStats, Progress};
pub use error::SimError;
pub use event_batch::{BatchEncoder, CacheEvent};
pub use fleet::Fleet;
pub use http_server::ENGINE_HEADER;
pub use prefix_cache::{CacheSnapshot, CachedBlockInfo, PrefixCache};
pub use publisher::{END_SEQ, PublisherStats};
pub use scheduler::{Counters, Outcome, PdOptions, RequestSpec, Scheduler, StepReport, Update};
pub use time_model::TimeModel;
