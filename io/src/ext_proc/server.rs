//! The gRPC side: the `ExternalProcessor` service that turns each ext_proc
//! stream into an [`ExtProcStream`], and binding, serving and stopping the
//! port with the HTTP/2 settings a gateway's long-lived connection needs.
//!
//! Each stream's answers are produced as hyper polls for them: no task and
//! no channel per stream. When the gateway resets a stream, hyper drops its
//! answer stream, which drops the state and frees its booking.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use kvpick_proto::ext_proc::external_processor_server::{ExternalProcessor, ExternalProcessorServer};
use kvpick_proto::ext_proc::{ProcessingRequest, ProcessingResponse};
use kvpick_proto::health::HealthService;
use kvpick_proto::health::health_server::HealthServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::{Router, TcpIncoming};
use tonic::{Request, Response, Status, Streaming};

use super::config::{ExtProcConfig, Http2};
use super::inflight::InflightLimiter;
use super::metrics::ExtProcMetrics;
use super::picker::Picker;
use super::stream::{ExtProcStream, Shared};
use super::tls::{TlsError, server_tls};
use crate::health::Health;

/// How long `shutdown` waits for open streams before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("could not listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("the server task panicked")]
    Panicked,
}

/// The `envoy.service.ext_proc.v3.ExternalProcessor` implementation.
pub struct ExtProcService {
    shared: Arc<Shared>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ExternalProcessor for ExtProcService {
    type ProcessStream = Answers;

    async fn process(&self, request: Request<Streaming<ProcessingRequest>>) -> Result<Response<Answers>, Status> {
        let state = ExtProcStream::new(self.shared.clone());
        Ok(Response::new(Box::pin(answers(state, request.into_inner()))))
    }
}

/// Reads the gateway's messages as answers are asked for; ends when the
/// gateway closes its side (or it fails), or with an error status for a
/// configuration kvpick cannot serve.
fn answers(
    state: ExtProcStream,
    inbound: Streaming<ProcessingRequest>,
) -> impl Stream<Item = Result<ProcessingResponse, Status>> + Send + 'static {
    futures::stream::unfold(Some((state, inbound)), |running| async move {
        let (mut state, mut inbound) = running?;
        loop {
            if let Some(answer) = state.next_out() {
                return Some((Ok(answer), Some((state, inbound))));
            }
            match inbound.message().await {
                Ok(Some(message)) => {
                    if let Err(status) = state.on_message(message).await {
                        return Some((Err(status), None));
                    }
                }
                Ok(None) => return None,
                Err(status) => {
                    state.on_stream_error(&status);
                    return None;
                }
            }
        }
    })
}

/// The ext_proc server, before it listens.
pub struct ExtProcServer {
    shared: Arc<Shared>,
    health: Option<HealthServer<HealthService>>,
}

impl ExtProcServer {
    pub fn new(config: ExtProcConfig, picker: Picker, metrics: Arc<ExtProcMetrics>) -> Self {
        let inflight = InflightLimiter::new(config.max_inflight_requests, metrics.clone());
        ExtProcServer { shared: Arc::new(Shared { config, picker, metrics, inflight }), health: None }
    }

    /// Also answers `grpc.health.v1` on the ext_proc port: Envoy
    /// health-checks an ext_proc cluster on the cluster's own port.
    pub fn with_health(mut self, health: &Health) -> Self {
        self.health = Some(health.service());
        self
    }

    pub fn metrics(&self) -> &Arc<ExtProcMetrics> {
        &self.shared.metrics
    }

    /// Binds `config.listen` (port 0: any free port) and starts serving on
    /// the current tokio runtime.
    pub async fn spawn(self) -> Result<ServerHandle, ServeError> {
        let addr = self.shared.config.listen;
        let listener = TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?;
        self.spawn_on(listener)
    }

    /// Starts serving on an already bound listener.
    pub fn spawn_on(self, listener: TcpListener) -> Result<ServerHandle, ServeError> {
        let config = &self.shared.config;
        // A BUFFERED body arrives in one message: allow the body limit plus
        // the envelope (headers, metadata).
        let max_message = config.max_body_bytes.saturating_add(1 << 20);
        let tls = server_tls(&config.tls)?;
        let mut builder = builder(&config.http2);
        let certificate_pem = match tls {
            Some((tls, pem)) => {
                builder = builder.tls_config(tls)?;
                Some(pem)
            }
            None => None,
        };
        let service = ExternalProcessorServer::new(ExtProcService { shared: self.shared.clone() })
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let router = builder.add_service(service).add_optional_service(self.health);
        spawn_router(router, listener, certificate_pem)
    }
}

/// A tonic server builder with kvpick's HTTP/2 settings.
pub(crate) fn builder(http2: &Http2) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(http2.max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(http2.max_pending_accept_reset_streams))
        .http2_max_local_error_reset_streams(http2.max_local_error_reset_streams)
        .http2_keepalive_interval(http2.keepalive_interval)
        .http2_keepalive_timeout(http2.keepalive_timeout)
        .tcp_nodelay(true)
}

pub(crate) fn spawn_router(
    router: Router,
    listener: TcpListener,
    certificate_pem: Option<String>,
) -> Result<ServerHandle, ServeError> {
    let local_addr = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr: SocketAddr::from(([0, 0, 0, 0], 0)), source })?;
    let (stop, stopped) = oneshot::channel::<()>();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let task = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, async {
                // A dropped handle stops the server too.
                let _ = stopped.await;
            })
            .await
            .map_err(ServeError::from)
    });
    Ok(ServerHandle { local_addr, certificate_pem, stop: Some(stop), task: Some(task) })
}

/// A running gRPC server.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    certificate_pem: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl ServerHandle {
    /// Where it listens (the OS's port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The certificate it presents, PEM; `None` when plaintext.
    pub fn certificate_pem(&self) -> Option<&str> {
        self.certificate_pem.as_deref()
    }

    /// Stops accepting, lets open streams finish for a few seconds, then
    /// cuts them.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        self.shutdown_within(SHUTDOWN_GRACE).await
    }

    /// Stops accepting, lets open streams finish for up to `grace`, then
    /// cuts them (dropping a stream frees its booking).
    pub async fn shutdown_within(mut self, grace: Duration) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(mut task) = self.task.take() else { return Ok(()) };
        match tokio::time::timeout(grace, &mut task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) if join.is_panic() => Err(ServeError::Panicked),
            Ok(Err(_)) => Ok(()),
            Err(_) => {
                tracing::warn!(addr = %self.local_addr, "streams still open after the grace period; cutting them");
                task.abort();
                Ok(())
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
