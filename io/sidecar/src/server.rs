//! The sidecar's ports: the front (HTTP/1.1 and h2c on one port, told
//! apart by the HTTP/2 preface) and the metrics port.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::body::full;
use crate::config::SidecarConfig;
use crate::engines::Engines;
use crate::flow::{Shared, handle};
use crate::local_engine::LocalEngine;
use crate::metrics::SidecarMetrics;

/// A running sidecar. Dropping it stops both ports and every connection.
pub struct Sidecar {
    front: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    metrics: Arc<SidecarMetrics>,
    tasks: JoinSet<()>,
}

impl Sidecar {
    /// Binds both ports and serves on the current tokio runtime.
    pub async fn start(config: SidecarConfig) -> Result<Sidecar, String> {
        config.validate()?;
        let front = TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {} (KVPICK_SIDECAR_LISTEN): {e}", config.listen))?;
        let front_addr = front.local_addr().map_err(|e| e.to_string())?;
        let metrics = Arc::new(SidecarMetrics::default());
        let mut tasks = JoinSet::new();
        let metrics_addr = match config.metrics_listen {
            Some(addr) => {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|e| format!("cannot listen on {addr} (KVPICK_SIDECAR_METRICS_LISTEN): {e}"))?;
                let bound = listener.local_addr().map_err(|e| e.to_string())?;
                tasks.spawn(serve_metrics(listener, metrics.clone()));
                Some(bound)
            }
            None => None,
        };
        let local = local_addresses(&config, front_addr);
        let shared = Arc::new(Shared {
            engines: Engines::new(config.connect_timeout),
            decode_engine: LocalEngine::new(config.decode, config.connect_timeout),
            config,
            metrics: metrics.clone(),
            local,
        });
        tasks.spawn(serve_front(front, shared));
        Ok(Sidecar { front: front_addr, metrics_addr, metrics, tasks })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.front
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn metrics(&self) -> &Arc<SidecarMetrics> {
        &self.metrics
    }

    /// Stops accepting and drops every connection.
    pub async fn shutdown(mut self) {
        self.tasks.shutdown().await;
    }

    /// Serves until a port's task ends (it does not, unless its listener
    /// fails for good).
    pub async fn wait(mut self) {
        self.tasks.join_next().await;
    }
}

/// The addresses a prefiller naming this pod could use: the decode engine,
/// and the front on its bound address, on loopback when it listens on all
/// addresses, and on the pod's IP (`POD_IP`, the downward API's).
fn local_addresses(config: &SidecarConfig, front: SocketAddr) -> Vec<SocketAddr> {
    let mut local = vec![config.decode, front];
    if front.ip().is_unspecified() {
        let port = front.port();
        local.push(SocketAddr::from(([127, 0, 0, 1], port)));
        local.push(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)));
        if let Some(ip) = std::env::var("POD_IP").ok().and_then(|v| v.parse::<std::net::IpAddr>().ok()) {
            local.push(SocketAddr::new(ip, port));
        }
    }
    local
}

/// How long a client may take to send a request's headers (slow-loris
/// connections are dropped after it).
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn serve_front(listener: TcpListener, shared: Arc<Shared>) {
    // Connections live in this set: dropping the front drops them all.
    let mut connections = JoinSet::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(pair) => pair,
            Err(error) => {
                // Out of descriptors, usually: back off rather than spin.
                tracing::warn!(%error, "sidecar front: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        connections.spawn(async move {
            let service = service_fn(move |request| handle(shared.clone(), request));
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // hyper enforces its header-read timeout only with a timer.
            builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
            if let Err(error) = builder.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%peer, %error, "sidecar front: connection ended with an error");
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
}

async fn serve_metrics(listener: TcpListener, metrics: Arc<SidecarMetrics>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let metrics = metrics.clone();
        connections.spawn(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let metrics = metrics.clone();
                async move {
                    let response = if request.method() == Method::GET && request.uri().path() == "/metrics" {
                        let mut r = Response::new(full(metrics.render()));
                        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
                        r
                    } else {
                        let mut r = Response::new(full("not found\n"));
                        *r.status_mut() = StatusCode::NOT_FOUND;
                        r
                    };
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
        while connections.try_join_next().is_some() {}
    }
}
