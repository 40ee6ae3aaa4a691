//! The client of the prefill engines (any address a prefiller names): one
//! pooled HTTP/1.1 client (engines speak HTTP/1.1), a connect timeout, and
//! the prefill leg's bounded, timed read of a whole answer. The local
//! decode engine has a client of its own (`local_engine`).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::body::{Boxed, full};
use crate::metrics::PrefillFailure;

/// A failed leg: why (the metric's label) and what happened (the log's).
#[derive(Debug)]
pub struct LegError {
    pub why: PrefillFailure,
    pub detail: String,
}

impl LegError {
    pub fn new(why: PrefillFailure, detail: impl Into<String>) -> Self {
        LegError { why, detail: detail.into() }
    }
}

#[derive(Clone)]
pub struct Engines {
    client: Client<HttpConnector, Boxed>,
}

impl Engines {
    pub fn new(connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        // Tokens are small writes: no Nagle delay on them.
        connector.set_nodelay(true);
        Engines { client: Client::builder(TokioExecutor::new()).build(connector) }
    }

    /// Sends a request; the answer's body streams. Dropping the future or
    /// the answer closes that connection, which aborts the request in the
    /// engine (vLLM, SGLang and trtllm-serve all abort on disconnect).
    async fn send(
        &self,
        to: SocketAddr,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Boxed,
    ) -> Result<Response<Incoming>, String> {
        let mut request = Request::new(body);
        *request.method_mut() = method;
        // An asterisk-form (`OPTIONS *`) or otherwise odd target makes no
        // URI with the engine's address: refused, never sent elsewhere.
        *request.uri_mut() = format!("http://{to}{path_and_query}")
            .parse()
            .map_err(|_| format!("{path_and_query:?} is not a path an engine can be asked for"))?;
        *request.headers_mut() = headers.clone();
        self.client.request(request).await.map_err(|e| format!("{to}: {e}"))
    }

    /// A JSON POST whose whole answer is read, at most `limit` bytes, all
    /// within `timeout`; a status other than 2xx is a failure.
    pub async fn whole(
        &self,
        to: SocketAddr,
        path: &str,
        headers: &HeaderMap,
        body: Vec<u8>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, LegError> {
        let mut headers = headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let exchange = async {
            let answer = self.send(to, Method::POST, path, &headers, full(body)).await.map_err(|e| {
                LegError::new(PrefillFailure::Connect, format!("could not send to the prefill engine {to}: {e}"))
            })?;
            let status = answer.status();
            let bytes = Limited::new(answer.into_body(), limit).collect().await.map(|c| c.to_bytes()).map_err(|e| {
                LegError::new(
                    PrefillFailure::Answer,
                    format!("the prefill engine {to}'s answer could not be read: {e}"),
                )
            })?;
            if !status.is_success() {
                return Err(LegError::new(PrefillFailure::Status, status_detail(to, status, &bytes)));
            }
            Ok(bytes)
        };
        tokio::time::timeout(timeout, exchange).await.unwrap_or_else(|_| {
            Err(LegError::new(
                PrefillFailure::Timeout,
                format!("the prefill engine {to} did not answer within {} ms", timeout.as_millis()),
            ))
        })
    }
}

/// A refusal's status and the start of its body (the engine's own error).
fn status_detail(to: SocketAddr, status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
    format!("the prefill engine {to} answered {status}: {text}")
}
