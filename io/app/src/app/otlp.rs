//! Request spans exported over OTLP/gRPC: the SDK's batch processor (a
//! thread of its own, a bounded queue: a slow collector drops spans, never
//! slows a pick), a parent-based ratio sampler, and the W3C propagator the
//! ext_proc server continues the gateway's context with.
//!
//! Off unless `--otlp-endpoint` is set; then every request's spans (see
//! `kvpick_ext_proc::trace`) go to the collector.

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
}

impl TraceExport {
    /// Starts the exporter. Must run inside the I/O tokio runtime: the
    /// gRPC channel's connection task lives there (it connects lazily, so
    /// an unreachable collector does not stop start-up; spans for it are
    /// dropped and logged).
    pub fn start(config: &TracingConfig) -> Result<(TraceExport, Tracing), String> {
        let exporter = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(config.endpoint.clone())
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("OTLP exporter for {}: {e}", config.endpoint))?;
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
        let resource = Resource::builder().with_service_name(config.service_name.clone()).build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = BoxedTracer::new(Box::new(provider.tracer("kvpick")));
        Ok((TraceExport { provider }, Tracing::new(tracer, TraceContextPropagator::new())))
    }

    /// Sends every span ended so far. Blocks on the exporter's thread: run
    /// it off the I/O runtime's threads (the export needs them).
    pub async fn flush(&self) {
        let provider = self.provider.clone();
        match tokio::task::spawn_blocking(move || provider.force_flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "flushing spans to the OTLP collector failed"),
            Err(error) => tracing::warn!(%error, "flushing spans: the task failed"),
        }
    }

    /// Flushes and stops the exporter.
    pub async fn shutdown(self) {
        let provider = self.provider;
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "stopping the OTLP exporter"),
            Err(error) => tracing::warn!(%error, "stopping the OTLP exporter: the task failed"),
        }
    }
}
