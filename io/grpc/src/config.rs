//! The settings of a gRPC port: TLS and HTTP/2. Values only; where they
//! come from (flags, environment) is the app's business.

use std::time::Duration;

/// How a gRPC port speaks (the ext_proc port; health is always plaintext).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Tls {
    /// Plaintext HTTP/2 (h2c): the default, as gateways reach the EPP
    /// inside the cluster.
    #[default]
    Off,
    /// A self-signed certificate made at start for these DNS names.
    SelfSigned { names: Vec<String> },
    /// A certificate and key given as PEM.
    Pem { cert: Vec<u8>, key: Vec<u8> },
}

/// HTTP/2 settings of a gRPC port (the ext_proc port; the health port
/// uses the defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Http2 {
    /// Streams one gateway connection may have open (one per HTTP request
    /// in flight at the gateway; LLM requests live for seconds).
    pub max_concurrent_streams: u32,
    /// Streams the client resets before the server accepted them, allowed
    /// at once (h2's rapid-reset guard, CVE-2023-44487; h2's default is 20,
    /// which a busy gateway cancelling requests can exceed in a burst).
    pub max_pending_accept_reset_streams: usize,
    /// Resets h2 itself may send on one connection over its lifetime
    /// before it answers GOAWAY; `None`: no limit. hyper's default (1024)
    /// is a lifetime count: a gateway's connection that lives for days
    /// would be torn down for ordinary per-stream errors. Set explicitly
    /// here (tonic also passes `None` unless told) so it cannot change
    /// under us with a dependency bump.
    pub max_local_error_reset_streams: Option<usize>,
    pub keepalive_interval: Option<Duration>,
    pub keepalive_timeout: Option<Duration>,
}

impl Default for Http2 {
    fn default() -> Self {
        Http2 {
            max_concurrent_streams: 4096,
            max_pending_accept_reset_streams: 1024,
            max_local_error_reset_streams: None,
            keepalive_interval: Some(Duration::from_secs(30)),
            keepalive_timeout: Some(Duration::from_secs(10)),
        }
    }
}
