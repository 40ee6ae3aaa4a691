//! The one pooled HTTP/1 client every tokenizer protocol shares.
//!
//! It keeps connections alive (one pool per process, per engine host), bounds
//! each round trip by one timeout (connect, send, headers and body
//! together), and caps the response size while the body streams in, frame by
//! frame, whether or not the engine sent a `Content-Length`. It is also the
//! one place where transport failures become [`TokenizeError`] classes:
//!
//! | what happened | class |
//! |---|---|
//! | no connection (refused, DNS, connect timeout) | `Unreachable` |
//! | the timeout elapsed anywhere in the round trip | `Timeout` |
//! | engine answered 4xx | `Rejected`, with the engine's message |
//! | engine answered 5xx (or 1xx/3xx), the connection broke mid-answer, the body is over the cap | `Upstream` |
//!
//! Malformed JSON is the protocols' to classify (`Upstream` too).
//!
//! Runs on the caller's tokio runtime; holds no lock across an await.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::metrics::TokenizerMetrics;
use kvpick_core::error_chain::error_chain;
use kvpick_ext_proc::TokenizeError;

/// The engine's error message is passed on to the client cut to this many
/// bytes (on a character boundary).
pub const ERROR_MESSAGE_MAX_BYTES: usize = 1024;

/// How much of an error body is read to find the message in; the rest is
/// dropped (with the connection).
const ERROR_BODY_READ_MAX: usize = 64 * 1024;

/// Idle pooled connections are closed after this long. vLLM and SGLang
/// serve through uvicorn, whose keep-alive timeout is 5 s: closing ours
/// first avoids sending on a connection the engine is closing.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// TCP keep-alive probes on pooled connections, so a vanished engine pod is
/// noticed on idle connections too.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

/// A pooled keep-alive HTTP/1 client with a per-request timeout and a
/// response size cap. Cheap to clone: clones share the pool.
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    max_response_bytes: usize,
}

impl HttpClient {
    /// `timeout` bounds each whole round trip; `max_response_bytes` bounds
    /// each successful response body. Needs a tokio runtime (with time and
    /// I/O enabled) only when a request is sent, not here.
    pub fn new(timeout: Duration, max_response_bytes: usize) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(TCP_KEEPALIVE));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .build(connector);
        HttpClient { client, timeout, max_response_bytes }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    /// POSTs `body` as JSON to `uri` and returns the 2xx response's body.
    ///
    /// A request that fails after the connection was made but before any
    /// answer (typically a pooled connection the engine closed as we sent
    /// on it) is sent once more on a fresh connection, within the same
    /// timeout: tokenizing has no side effects.
    pub async fn post_json(&self, uri: &Uri, body: Bytes, metrics: &TokenizerMetrics) -> Result<Bytes, TokenizeError> {
        let round_trips = async {
            match self.round_trip(uri, body.clone()).await {
                Err(Attempt::Retryable(first)) => {
                    metrics.record_retry();
                    tracing::debug!(%uri, error = %first, "tokenizer connection closed before an answer; retrying once");
                    self.round_trip(uri, body).await.map_err(Attempt::into_error)
                }
                other => other.map_err(Attempt::into_error),
            }
        };
        match tokio::time::timeout(self.timeout, round_trips).await {
            Ok(result) => result,
            Err(_elapsed) => Err(TokenizeError::Timeout),
        }
    }

    async fn round_trip(&self, uri: &Uri, body: Bytes) -> Result<Bytes, Attempt> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri.clone();
        request.headers_mut().insert(CONTENT_TYPE, APPLICATION_JSON);
        request.headers_mut().insert(ACCEPT, APPLICATION_JSON);

        let response = self.client.request(request).await.map_err(|e| {
            let detail = error_chain(&e);
            if e.is_connect() {
                Attempt::Failed(TokenizeError::Unreachable(detail))
            } else {
                Attempt::Retryable(TokenizeError::Upstream(format!("no answer from the tokenizer: {detail}")))
            }
        })?;
        let status = response.status();
        if status.is_success() {
            return read_capped(response.into_body(), self.max_response_bytes).await.map_err(Attempt::Failed);
        }
        let message = engine_message(&read_prefix(response.into_body(), ERROR_BODY_READ_MAX).await);
        Err(Attempt::Failed(if status.is_client_error() {
            TokenizeError::Rejected { status: status.as_u16(), message }
        } else {
            TokenizeError::Upstream(format!("tokenizer answered {}: {message}", status_text(status)))
        }))
    }
}

/// One try's outcome: retry (once) or give up.
enum Attempt {
    Retryable(TokenizeError),
    Failed(TokenizeError),
}

impl Attempt {
    fn into_error(self) -> TokenizeError {
        match self {
            Attempt::Retryable(e) | Attempt::Failed(e) => e,
        }
    }
}

/// Reads a whole body, failing as soon as it is known to exceed `cap`: from
/// its declared length before reading, or from the bytes received so far.
async fn read_capped(mut body: Incoming, cap: usize) -> Result<Bytes, TokenizeError> {
    let too_large = |size: u64| TokenizeError::Upstream(format!("response of {size} bytes is over the {cap}-byte cap"));
    let cap_u64 = u64::try_from(cap).unwrap_or(u64::MAX);
    let declared = body.size_hint().lower();
    if declared > cap_u64 {
        return Err(too_large(declared));
    }
    // Most answers arrive in one frame: keep it without copying.
    let mut first: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    let mut received: usize = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| TokenizeError::Upstream(format!("reading the answer: {}", error_chain(&e))))?;
        let Ok(data) = frame.into_data() else { continue }; // trailers
        received = received.saturating_add(data.len());
        if received > cap {
            return Err(too_large(u64::try_from(received).unwrap_or(u64::MAX)));
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            None => joined.extend_from_slice(&data),
            Some(head) => {
                let size_hint = usize::try_from(declared).unwrap_or(0).max(head.len() + data.len());
                joined.reserve(size_hint.min(cap));
                joined.extend_from_slice(&head);
                joined.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| joined.freeze()))
}

/// The first `limit` bytes of an error body; a read error ends it early
/// (the status already tells what happened).
async fn read_prefix(mut body: Incoming, limit: usize) -> Bytes {
    let mut out = BytesMut::new();
    while out.len() < limit {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = data.len().min(limit - out.len());
                    out.extend_from_slice(&data[..take]);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    out.freeze()
}

/// The engine's error message out of its error body: OpenAI-style
/// `{"error": {"message"}}`, vLLM's older `{"message"}`, FastAPI's
/// `{"detail"}`, else the body as text; cut to [`ERROR_MESSAGE_MAX_BYTES`].
pub(crate) fn engine_message(body: &[u8]) -> String {
    let from_json = serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|json| {
        let found = json
            .pointer("/error/message")
            .or_else(|| json.get("message"))
            .or_else(|| json.get("detail"))
            .or_else(|| json.get("error"))?;
        Some(match found {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        })
    });
    let text = from_json.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text = text.trim();
    if text.is_empty() { "(empty body)".to_owned() } else { truncate(text, ERROR_MESSAGE_MAX_BYTES) }
}

/// `text` cut to at most `max` bytes on a character boundary, with `…`
/// appended when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_messages() {
        assert_eq!(engine_message(br#"{"error":{"message":"bad role","type":"BadRequestError"}}"#), "bad role");
        assert_eq!(engine_message(br#"{"object":"error","message":"too long","code":400}"#), "too long");
        assert_eq!(engine_message(br#"{"detail":[{"loc":["body"],"msg":"x"}]}"#), r#"[{"loc":["body"],"msg":"x"}]"#);
        assert_eq!(engine_message(b"plain text\n"), "plain text");
        assert_eq!(engine_message(b""), "(empty body)");
    }

    #[test]
    fn messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(ERROR_MESSAGE_MAX_BYTES);
        let cut = engine_message(long.as_bytes());
        assert!(cut.ends_with('…'));
        assert!(cut.len() <= ERROR_MESSAGE_MAX_BYTES + '…'.len_utf8());
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdef", 3), "abc…");
    }
}
