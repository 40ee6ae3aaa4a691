//! kvpick's I/O side: everything that talks to the network.
//!
//! For now this is the KV-event ingest ([`kv_events`]): one thread that
//! subscribes to every engine's ZMQ KV-event stream, keeps each stream in
//! order (replaying gaps from the engine), decodes the msgpack batches with
//! `kvpick_core::wire` and hands the events to the shard owning the worker
//! through a [`kv_events::KvEventSink`]. The ext_proc server, health service,
//! Kubernetes watchers, tokenizer clients, replica sync and metrics endpoint
//! will join it here, on a tokio runtime of their own cores.
//!
//! Threads: the ingest runs on one dedicated blocking thread (libzmq sockets
//! are not thread-safe and block); nothing here runs on a shard's core.
//! This crate depends on `kvpick-core`; `kvpick-core` must never depend on it,
//! and nothing in it may touch a shard's state except through a sink.

pub mod discovery;
pub mod ext_proc;
pub mod health;
pub mod kv_events;
pub mod testing;
pub mod tokenizer;
