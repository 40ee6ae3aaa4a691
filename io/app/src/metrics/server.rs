//! The metrics port: `GET /metrics` answers the exposition, and with
//! `--debug-endpoints` the debug view (`debug.rs`); anything else 404.
//! HTTP/1 on hyper (already in the tree for the tokenizer client).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::collect::{Sources, render};
use super::exposition::CONTENT_TYPE;

pub type MetricsSource = Sources;

/// A running metrics endpoint; stops when shut down or dropped.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves on `listener` from the current tokio runtime.
    pub fn spawn(listener: TcpListener, sources: Sources) -> std::io::Result<MetricsServer> {
        let local_addr = listener.local_addr()?;
        let (stop, mut stopped) = watch::channel(false);
        let sources = Arc::new(sources);
        let task = tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = stopped.changed() => break,
                };
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        tracing::warn!(%error, "metrics port: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let sources = sources.clone();
                let mut conn_stopped = stopped.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| answer(request, sources.clone()));
                    let conn =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    tokio::select! {
                        result = conn.as_mut() => {
                            if let Err(error) = result {
                                tracing::debug!(%peer, %error, "metrics connection ended with an error");
                            }
                        }
                        _ = conn_stopped.changed() => {}
                    }
                });
            }
        });
        Ok(MetricsServer { local_addr, stop, task: Some(task) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn answer(request: Request<Incoming>, sources: Arc<Sources>) -> Result<Response<Full<Bytes>>, Infallible> {
    let json = |status: u16, value: serde_json::Value| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(format!("{value:#}\n"))))
    };
    let response = match (request.method(), request.uri().path(), &sources.debug) {
        (&hyper::Method::GET, "/metrics", _) => {
            let text = render(&sources).await;
            Response::builder().header(hyper::header::CONTENT_TYPE, CONTENT_TYPE).body(Full::new(Bytes::from(text)))
        }
        (&hyper::Method::GET, "/debug/workers", Some(_)) => json(200, super::debug::workers(&sources).await),
        (&hyper::Method::POST, "/debug/explain", Some(picker)) => {
            // `?path=/v1/completions` for a completions body; chat by default.
            let path = request
                .uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("path=")))
                .unwrap_or("/v1/chat/completions")
                .to_owned();
            let limited = http_body_util::Limited::new(request.into_body(), super::debug::MAX_EXPLAIN_BYTES);
            match http_body_util::BodyExt::collect(limited).await {
                Err(error) => json(413, serde_json::json!({ "error": error.to_string() })),
                Ok(body) => match super::debug::explain(&sources, picker, &path, body.to_bytes()).await {
                    Ok(value) => json(200, value),
                    Err((status, message)) => json(status, serde_json::json!({ "error": message })),
                },
            }
        }
        _ => Response::builder().status(StatusCode::NOT_FOUND).body(Full::new(Bytes::from_static(b"not found\n"))),
    };
    // Both builders above are given only valid parts.
    Ok(response.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}
