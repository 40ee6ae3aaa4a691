//! The ext_proc server's settings, their defaults, and the environment
//! variables that set them (names kept from Dynamo's EPP where one exists,
//! so a manifest written for it works unchanged).

use std::net::SocketAddr;
use std::time::Duration;

use crate::tokenizer::FallbackPolicy;

pub const MAX_INFLIGHT_VAR: &str = "DYN_EPP_MAX_INFLIGHT_REQUESTS";
pub const SECURE_SERVING_VAR: &str = "DYN_SECURE_SERVING";
pub const MODEL_NAME_VAR: &str = "DYN_MODEL_NAME";
pub const MAX_BODY_BYTES_VAR: &str = "KVPICK_MAX_REQUEST_BODY_BYTES";
pub const CONFORMANCE_VAR: &str = "KVPICK_CONFORMANCE_HOOKS";

pub const DEFAULT_MAX_INFLIGHT: usize = 1024;
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Largest body chunk sent back to the gateway (some Envoy builds cap a
/// streamed chunk at 64 KiB; GAIE uses the same number).
pub const BODY_CHUNK_BYTES: usize = 62_000;

/// How the ext_proc port speaks.
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

/// HTTP/2 settings of the ext_proc port.
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
    /// The pool's base model (`DYN_MODEL_NAME`): any other `model` in a
    /// body is a LoRA adapter and hashes with its own seed, as the engine
    /// does. `None`: no request is treated as a LoRA.
    pub base_model: Option<String>,
    pub fallback: FallbackPolicy,
    pub assumed_body_mode: AssumedBodyMode,
    /// Largest JSON response body kept to read its `usage`.
    pub max_usage_body_bytes: usize,
    pub tls: Tls,
    pub http2: Http2,
    /// Picks made in one pass of the I/O thread wake the shard once, after
    /// that pass, rather than once each (`kvpick_runtime::RingScheduler`).
    /// Off only to measure what it saves.
    pub ring_per_batch: bool,
}

impl Default for ExtProcConfig {
    fn default() -> Self {
        ExtProcConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 9002)),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_inflight_requests: DEFAULT_MAX_INFLIGHT,
            conformance_hooks: false,
            base_model: None,
            fallback: FallbackPolicy::default(),
            assumed_body_mode: AssumedBodyMode::default(),
            max_usage_body_bytes: 1024 * 1024,
            tls: Tls::Off,
            http2: Http2::default(),
            ring_per_batch: true,
        }
    }
}

/// A setting with a value that is not allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?} is not valid: expected {allowed}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub allowed: &'static str,
}

impl ExtProcConfig {
    /// Defaults overridden by the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Defaults overridden by `lookup(name)`; unset or empty keeps a
    /// default.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |var: &str| lookup(var).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let mut config = ExtProcConfig::default();
        if let Some(v) = get(MAX_INFLIGHT_VAR) {
            config.max_inflight_requests = positive(MAX_INFLIGHT_VAR, &v)?;
        }
        if let Some(v) = get(MAX_BODY_BYTES_VAR) {
            config.max_body_bytes = positive(MAX_BODY_BYTES_VAR, &v)?;
        }
        if let Some(v) = get(SECURE_SERVING_VAR) {
            if boolean(SECURE_SERVING_VAR, &v)? {
                config.tls = Tls::SelfSigned { names: vec!["localhost".into()] };
            }
        }
        if let Some(v) = get(CONFORMANCE_VAR) {
            config.conformance_hooks = boolean(CONFORMANCE_VAR, &v)?;
        }
        config.base_model = get(MODEL_NAME_VAR);
        Ok(config)
    }
}

fn positive(var: &'static str, value: &str) -> Result<usize, ConfigError> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ConfigError { var, value: value.to_owned(), allowed: "a whole number of at least 1" }),
    }
}

fn boolean(var: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError { var, value: value.to_owned(), allowed: "true or false" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn defaults_and_overrides() {
        let c = ExtProcConfig::from_lookup(lookup(&[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.max_inflight_requests, c.max_body_bytes, c.tls.clone()), (1024, 16 << 20, Tls::Off));
        let c = ExtProcConfig::from_lookup(lookup(&[
            (MAX_INFLIGHT_VAR, "8"),
            (SECURE_SERVING_VAR, "true"),
            (MODEL_NAME_VAR, "llama"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.max_inflight_requests, 8);
        assert!(matches!(c.tls, Tls::SelfSigned { .. }));
        assert_eq!(c.base_model.as_deref(), Some("llama"));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = ExtProcConfig::from_lookup(lookup(&[(MAX_INFLIGHT_VAR, "0")])).err();
        assert_eq!(
            e.map(|e| e.to_string()),
            Some(format!("{MAX_INFLIGHT_VAR}=\"0\" is not valid: expected a whole number of at least 1"))
        );
        assert!(ExtProcConfig::from_lookup(lookup(&[(SECURE_SERVING_VAR, "maybe")])).is_err());
    }
}
