//! The ext_proc server's settings and their defaults. Values only: the
//! flags and environment variables that set them are the app's
//! (`kvpick_app::app::settings`).

use std::net::SocketAddr;

use kvpick_grpc::{Http2, Tls};

pub const DEFAULT_MAX_INFLIGHT: usize = 1024;
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Largest body chunk sent back to the gateway (some Envoy builds cap a
/// streamed chunk at 64 KiB; GAIE uses the same number).
pub const BODY_CHUNK_BYTES: usize = 62_000;

/// What to assume when the gateway sends no `protocol_config` (Envoy older
/// than 1.32, some other gateways): GAIE requires full-duplex streaming.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AssumedBodyMode {
    #[default]
    FullDuplexStreamed,
    Buffered,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtProcConfig {
    pub listen: SocketAddr,
    /// Larger request bodies are refused with 413.
    pub max_body_bytes: usize,
    /// Requests between their headers and their pick, at once; more are
    /// refused with 429.
    pub max_inflight_requests: usize,
    /// GAIE conformance hooks: `test-epp-endpoint-selection` restricts the
    /// pick, and the served endpoint is echoed on the response.
    pub conformance_hooks: bool,
    /// The destination header carries the fallback list too, not only the
    /// `envoy.lb` metadata (agentgateway answers 503 to a list there).
    pub fallbacks_in_header: bool,
    pub assumed_body_mode: AssumedBodyMode,
    /// Largest JSON response body kept to read its `usage`.
    pub max_usage_body_bytes: usize,
    pub tls: Tls,
    pub http2: Http2,
}

impl Default for ExtProcConfig {
    fn default() -> Self {
        ExtProcConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 9002)),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_inflight_requests: DEFAULT_MAX_INFLIGHT,
            conformance_hooks: false,
            fallbacks_in_header: false,
            assumed_body_mode: AssumedBodyMode::default(),
            max_usage_body_bytes: 1024 * 1024,
            tls: Tls::Off,
            http2: Http2::default(),
        }
    }
}
