//! Request spans exported over OTLP/gRPC: the SDK's batch processor (a
//! thread of its own, a bounded queue: a slow collector drops spans, never
//! slows a pick), a parent-based ratio sampler, and the W3C propagator the
//! ext_proc server continues the gateway's context with.
//!
//! The exporter's gRPC channel runs on a one-thread tokio runtime of its
//! own (`kvpick-otlp`), not on the I/O runtime: encoding and sending a
//! batch of spans then never holds up the thread that answers the
//! gateway (measured: on the I/O runtime, tracing every request cut
//! requests/s to 0.59× at concurrency 16; see perf/README.md).
//!
//! Off unless `--otlp-endpoint` is set; then every request's spans (see
//! `kvpick_ext_proc::trace`) go to the collector.

use std::thread::JoinHandle;
use std::time::Duration;

use kvpick_ext_proc::Tracing;
use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

/// What tracing is configured with.
#[derive(Clone, Debug, PartialEq)]
pub struct TracingConfig {
    /// The collector's OTLP/gRPC endpoint (`http://host:4317`).
    pub endpoint: String,
    /// Service name on every span's resource.
    pub service_name: String,
    /// Share of root requests sampled; a gateway's decision wins.
    pub sample_ratio: f64,
}

/// The running exporter: flushed and stopped at shutdown.
pub struct TraceExport {
    provider: SdkTracerProvider,
    /// Ends the exporter runtime's thread.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TraceExport {
    /// Starts the exporter and its runtime thread. The channel connects
    /// lazily: an unreachable collector does not stop start-up (spans for
    /// it are dropped, and the SDK logs why).
    pub fn start(config: &TracingConfig) -> Result<(TraceExport, Tracing), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("the OTLP exporter's runtime: {e}"))?;
        let exporter = {
            // The channel's tasks are spawned on the runtime entered here.
            let _inside = runtime.enter();
            SpanExporter::builder()
                .with_tonic()
                .with_endpoint(config.endpoint.clone())
                .with_timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| format!("OTLP exporter for {}: {e}", config.endpoint))?
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kvpick-otlp".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(|e| format!("the OTLP exporter's thread: {e}"))?;
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
        let resource = Resource::builder().with_service_name(config.service_name.clone()).build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = BoxedTracer::new(Box::new(provider.tracer("kvpick")));
        let export = TraceExport { provider, stop: Some(stop), thread: Some(thread) };
        Ok((export, Tracing::new(tracer, TraceContextPropagator::new())))
    }

    /// Sends every span ended so far (waiting for the exporter's thread,
    /// off the caller's runtime threads).
    pub async fn flush(&self) {
        let provider = self.provider.clone();
        off_runtime("flushing spans to the OTLP collector", move || provider.force_flush()).await;
    }

    /// Flushes and stops the exporter, then its runtime.
    pub async fn shutdown(mut self) {
        let provider = self.provider.clone();
        off_runtime("stopping the OTLP exporter", move || provider.shutdown()).await;
        self.stop_runtime();
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    fn stop_runtime(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Runs a call that blocks on the exporter's threads on tokio's blocking
/// pool, and logs its failure as `what`.
async fn off_runtime<E: std::fmt::Display + Send + 'static>(
    what: &str,
    call: impl FnOnce() -> Result<(), E> + Send + 'static,
) {
    match tokio::task::spawn_blocking(call).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, "{what} failed"),
        Err(error) => tracing::warn!(%error, "{what}: the task failed"),
    }
}

impl Drop for TraceExport {
    /// Not shut down (start-up failed later, a test ended): the runtime's
    /// thread still ends; spans not yet sent are lost.
    fn drop(&mut self) {
        self.stop_runtime();
    }
}
