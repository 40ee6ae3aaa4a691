//! The gRPC side: the `ExternalProcessor` service that turns each ext_proc
//! stream into an `ExtProcStream`, served on a port set up by
//! `kvpick-grpc` (HTTP/2 settings, TLS, shutdown).
//!
//! Each stream's answers are produced as hyper polls for them: no task and
//! no channel per stream. When the gateway resets a stream, hyper drops its
//! answer stream, which drops the state and frees its booking.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use kvpick_grpc::{Health, ServeError, ServerHandle, builder, server_tls, spawn_router};
use kvpick_proto::ext_proc::external_processor_server::{ExternalProcessor, ExternalProcessorServer};
use kvpick_proto::ext_proc::{ProcessingRequest, ProcessingResponse};
use kvpick_proto::health::HealthService;
use kvpick_proto::health::health_server::HealthServer;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, Streaming};

use crate::config::ExtProcConfig;
use crate::inflight::InflightLimiter;
use crate::metrics::ExtProcMetrics;
use crate::pick::Picks;
use crate::stream::{ExtProcStream, Shared};
use crate::trace::{CallContext, Tracing};

/// The `envoy.service.ext_proc.v3.ExternalProcessor` implementation.
pub struct ExtProcService<P> {
    shared: Arc<Shared<P>>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl<P: Picks> ExternalProcessor for ExtProcService<P> {
    type ProcessStream = Answers;

    async fn process(&self, request: Request<Streaming<ProcessingRequest>>) -> Result<Response<Answers>, Status> {
        let call = self.shared.tracing.as_ref().map(|_| {
            let value = |key: &str| request.metadata().get(key).and_then(|v| v.to_str().ok());
            CallContext::new(value(CallContext::TRACEPARENT), value(CallContext::TRACESTATE))
        });
        let state = ExtProcStream::new(self.shared.clone(), call);
        Ok(Response::new(Box::pin(answers(state, request.into_inner()))))
    }
}

/// Reads the gateway's messages as answers are asked for; ends when the
/// gateway closes its side (or it fails), or with an error status for a
/// configuration kvpick cannot serve.
fn answers<P: Picks>(
    state: ExtProcStream<P>,
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
pub struct ExtProcServer<P> {
    shared: Shared<P>,
    health: Option<HealthServer<HealthService>>,
}

impl<P: Picks> ExtProcServer<P> {
    pub fn new(config: ExtProcConfig, picker: P, metrics: Arc<ExtProcMetrics>) -> Self {
        let inflight = InflightLimiter::new(config.max_inflight_requests, metrics.clone());
        let shared = Shared { config, picker, metrics, inflight, tracing: None };
        ExtProcServer { shared, health: None }
    }

    /// Traces every request with `tracing` (see [`crate::trace`]).
    pub fn with_tracing(mut self, tracing: Tracing) -> Self {
        self.shared.tracing = Some(tracing);
        self
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
        let shared = Arc::new(self.shared);
        let config = &shared.config;
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
        let service = ExternalProcessorServer::new(ExtProcService { shared: shared.clone() })
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let router = builder.add_service(service).add_optional_service(self.health);
        spawn_router(router, listener, certificate_pem)
    }
}
