//! Turning a request body into the engine's own token ids.
//!
//! KV-aware routing needs exactly the tokens the engine will cache, so the
//! engine's tokenizer service is asked (vLLM's render endpoints, SGLang's
//! `/tokenize`). The clients live in submodules; the picker only sees
//! this trait.
//!
//! - [`TokenizerConfig`] (the app fills it from the `DYN_EPP_TOKENIZER_*`
//!   settings) builds
//!   the client for its [`TokenizerProtocol`]: [`VllmRenderTokenizer`]
//!   (`vllm-render`) or [`SglangTokenizer`] (`sglang-tokenize`).
//! - Both send through one [`HttpClient`]: pooled keep-alive HTTP/1, one
//!   timeout per round trip, a response cap enforced while streaming, and
//!   the transport → [`TokenizeError`] classification.
//! - [`TokenizerMetrics`]: call latency, errors by class, fallbacks.
//!
//! Runs on the ext_proc server's tokio runtime; never on a shard's core.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use bytes::Bytes;
use hyper::Uri;
use hyper::http::uri::Scheme;
/// Defined by the ext_proc server (a body's API, a tokenizer failure's
/// status and fallback class); the clients here produce them.
pub use kvpick_ext_proc::{Api, TokenizeError};

mod config;
mod http_client;
pub mod local;
mod metrics;
mod outage;
mod parity;
mod sglang;
mod vllm_render;

pub use config::{
    DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT, TokenizerConfig, TokenizerConfigError, TokenizerField,
    TokenizerProtocol,
};
pub use http_client::{ERROR_MESSAGE_MAX_BYTES, HttpClient};
pub use local::{LocalTokenizer, LocalTokenizerConfig};
pub use metrics::{ErrorClass, ParityOutcome, TokenizerMetrics, TokenizerMetricsSnapshot};
pub use outage::Outage;
pub use parity::{MAX_CHECKS_IN_FLIGHT, ParityChecked, ParityConfig};
pub use sglang::SglangTokenizer;
pub use vllm_render::VllmRenderTokenizer;

#[derive(Clone, Debug)]
pub struct TokenizeRequest {
    pub api: Api,
    /// The client's body, byte for byte.
    pub body: Bytes,
    pub model: String,
    /// A completion's prompt when it is one string (what `/tokenize`
    /// takes); `None` for chat bodies and token-array prompts.
    pub prompt: Option<String>,
}

pub type TokenizeFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<u32>, TokenizeError>> + Send + 'a>>;

pub trait Tokenizer: Send + Sync + 'static {
    fn tokenize(&self, request: TokenizeRequest) -> TokenizeFuture<'_>;
}

/// What to do when tokenizing fails or is not supported (`fail` |
/// `load-only`).
///
/// The default, for unsupported bodies and tokenizer outages alike, is
/// `LoadOnly`. The token ids only buy KV-cache overlap: the engines can
/// serve the request without them. Failing would turn a slow or down
/// tokenizer (often one render service for the pool) into an outage of the
/// whole pool, for a loss that is only cache affinity. An engine 4xx also
/// routes by load: the engine rejects the body itself, with its own message,
/// at the cost of one cheap round trip. Operators who prefer errors to
/// silent degradation set `fail`; either way every fallback is counted by
/// class in [`TokenizerMetrics`] (`record_fallback`). Under `fail`, bodies
/// the tokenizer cannot handle (chat on `sglang-tokenize`) are answered 400
/// too, which is why the one setting defaults to `load-only`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FallbackPolicy {
    /// Answer the gateway with the error's status.
    Fail,
    /// Route by load alone (no KV overlap), counted in a metric.
    #[default]
    LoadOnly,
}

/// `{base}{path}` as a URI: the base's path prefix is kept (one `/`
/// between them). Only `http://host[:port][/prefix]` is accepted; the error
/// says what is wrong.
pub(crate) fn endpoint(base: &str, path: &str) -> Result<Uri, String> {
    let uri: Uri = base.trim().parse().map_err(|e| format!("not a URL ({e}); expected http://host[:port][/prefix]"))?;
    match uri.scheme() {
        Some(scheme) if *scheme == Scheme::HTTP => {}
        Some(scheme) if *scheme == Scheme::HTTPS => {
            return Err("https is not supported yet; expected http://host[:port][/prefix]".into());
        }
        _ => return Err("expected an absolute http://host[:port][/prefix] URL".into()),
    }
    let authority = uri.authority().ok_or("expected a host: http://host[:port][/prefix]")?;
    if authority.as_str().contains('@') {
        return Err("credentials in the URL are not supported".into());
    }
    if uri.query().is_some() {
        return Err("a query string is not allowed in the base URL".into());
    }
    let prefix = uri.path().trim_end_matches('/');
    let path = path.trim_start_matches('/');
    format!("http://{authority}{prefix}/{path}").parse().map_err(|e| format!("joining the path {path:?}: {e}"))
}

/// Runs one tokenize call, timing it into `metrics` and logging a failure.
pub(crate) async fn metered(
    metrics: &TokenizerMetrics,
    protocol: &'static str,
    call: impl Future<Output = Result<Vec<u32>, TokenizeError>>,
) -> Result<Vec<u32>, TokenizeError> {
    let start = Instant::now();
    let result = call.await;
    metrics.record_call(start.elapsed(), &result);
    if let Err(error) = &result {
        tracing::debug!(protocol, class = ErrorClass::of(error).as_str(), %error, "tokenize failed");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_keep_the_prefix() {
        let join = |base: &str, path: &str| endpoint(base, path).map(|u| u.to_string());
        assert_eq!(join("http://vllm:8000", "/v1/x").as_deref(), Ok("http://vllm:8000/v1/x"));
        assert_eq!(join("http://vllm:8000/", "/v1/x").as_deref(), Ok("http://vllm:8000/v1/x"));
        assert_eq!(join("http://gw/a/b/", "/tokenize").as_deref(), Ok("http://gw/a/b/tokenize"));
        assert_eq!(join(" HTTP://gw/a ", "/t").as_deref(), Ok("http://gw/a/t"));
        for bad in ["vllm:8000", "/v1", "https://gw", "ftp://gw", "http://gw/?x=1", "http://u@gw", "not a url"] {
            assert!(endpoint(bad, "/t").is_err(), "{bad}");
        }
    }
}
