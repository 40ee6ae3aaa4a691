//! One `POST /kv_cache_events` round trip: bounded in time and size.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{ACCEPT, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kvpick_core::error_chain::error_chain;

/// Idle pooled connections are closed after this long: `trtllm-serve`
/// serves through uvicorn, whose keep-alive timeout is 5 s, so ours closes
/// first and no poll is sent on a connection the engine is closing.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// A keep-alive HTTP/1 client shared by every drained engine.
pub(crate) type DrainClient = Client<HttpConnector, Empty<Bytes>>;

pub(crate) fn client() -> DrainClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .build(connector)
}

/// Drains the engine's event buffer once: the answer's bytes, or why not.
/// Draining is destructive, so a failed round trip is not retried here: the
/// events it carried are gone, and the ids of the next answer tell how many.
pub(crate) async fn drain(
    client: &DrainClient,
    uri: &Uri,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Bytes, String> {
    let round_trip = async {
        let mut request = Request::new(Empty::new());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri.clone();
        request.headers_mut().insert(ACCEPT, HeaderValue::from_static("application/json"));
        let response = client.request(request).await.map_err(|e| format!("no answer: {}", error_chain(&e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        let body = Limited::new(response.into_body(), max_bytes).collect().await;
        body.map(|b| b.to_bytes()).map_err(|e| format!("reading the answer: {}", error_chain(e.as_ref())))
    };
    match tokio::time::timeout(timeout, round_trip).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}
