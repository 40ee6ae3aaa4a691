//! An OpenTelemetry collector stand-in: the OTLP/gRPC `TraceService` on
//! 127.0.0.1 (port picked at run time), keeping every span it receives
//! with its resource, so a test can check what kvpick exported.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

/// A span as received, with its resource's attributes.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    pub resource: Vec<KeyValue>,
    pub span: Span,
}

impl ReceivedSpan {
    /// A string, integer, float or boolean attribute, as text.
    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }

    pub fn resource_attribute(&self, key: &str) -> Option<String> {
        attribute(&self.resource, key)
    }
}

/// The value of `key` among `attributes`, as text.
pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    text(value)
}

fn text(value: &AnyValue) -> Option<String> {
    Some(match value.value.as_ref()? {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::DoubleValue(d) => d.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        _ => return None,
    })
}

#[derive(Clone, Default)]
struct Sink {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    /// Spans received (kept or not) and export calls.
    counts: Arc<Mutex<(usize, usize)>>,
    /// Count spans without keeping them (a benchmark's long run).
    count_only: bool,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut received = Vec::new();
        let mut count = 0;
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans.resource.map(|r| r.attributes).unwrap_or_default();
            for scope in resource_spans.scope_spans {
                count += scope.spans.len();
                if !self.count_only {
                    received
                        .extend(scope.spans.into_iter().map(|span| ReceivedSpan { resource: resource.clone(), span }));
                }
            }
        }
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).extend(received);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.0 += count;
        counts.1 += 1;
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// The running collector; stopped by [`OtlpCollector::shutdown`] or when
/// dropped.
pub struct OtlpCollector {
    addr: SocketAddr,
    sink: Sink,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl OtlpCollector {
    pub async fn start() -> std::io::Result<OtlpCollector> {
        OtlpCollector::start_with(Sink::default()).await
    }

    /// A collector that counts what it receives and keeps nothing, for a
    /// benchmark sending it millions of spans.
    pub async fn start_counting() -> std::io::Result<OtlpCollector> {
        OtlpCollector::start_with(Sink { count_only: true, ..Sink::default() }).await
    }

    async fn start_with(sink: Sink) -> std::io::Result<OtlpCollector> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tonic::transport::Server::builder().add_service(TraceServiceServer::new(sink.clone()));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ = server
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(OtlpCollector { addr, sink, stop: Some(stop), task: Some(task) })
    }

    /// The URL an exporter is given (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far (none when only counting).
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.sink.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Spans received so far, kept or not.
    pub fn span_count(&self) -> usize {
        self.sink.counts.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// Export calls received so far.
    pub fn exports(&self) -> usize {
        self.sink.counts.lock().unwrap_or_else(PoisonError::into_inner).1
    }

    /// Waits until `done` holds for the spans received, or `timeout`
    /// passes; returns the spans either way.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for OtlpCollector {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
