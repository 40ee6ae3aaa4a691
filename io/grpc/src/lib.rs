//! Serving gRPC the way every kvpick port does: the HTTP/2 settings a
//! gateway's long-lived connection needs ([`Http2`]), optional TLS
//! ([`Tls`]), binding, serving and stopping a port ([`builder`],
//! [`spawn_router`], [`ServerHandle`]), and `grpc.health.v1` ([`health`]),
//! which the ext_proc port answers too.
//!
//! Knows no service but health: it must never depend on the ext_proc
//! protocol, the picker, the core or the runtime; they build on it.

pub mod config;
pub mod health;
pub mod server;
pub mod tls;

pub use config::{Http2, Tls};
pub use health::{Health, Readiness};
pub use server::{SHUTDOWN_GRACE, ServeError, ServerHandle, builder, spawn_router};
pub use tls::{TlsError, server_tls};
