//! One ext_proc stream driven message by message, with no gRPC server in
//! between: what the `ext_proc_stream` fuzz target feeds random message
//! orders to. Built only with the `fuzzing` feature; nothing in kvpick
//! uses it.

use std::sync::Arc;

use kvpick_proto::ext_proc::{ProcessingRequest, ProcessingResponse};

use crate::config::ExtProcConfig;
use crate::inflight::InflightLimiter;
use crate::metrics::ExtProcMetrics;
use crate::pick::Picks;
use crate::stream::{ExtProcStream, Shared};

/// A stream as the server runs it, minus the transport.
pub struct StreamUnderTest<P: Picks> {
    stream: ExtProcStream<P>,
}

impl<P: Picks> StreamUnderTest<P> {
    pub fn new(config: ExtProcConfig, picker: P) -> Self {
        let metrics = Arc::new(ExtProcMetrics::new());
        let inflight = InflightLimiter::new(config.max_inflight_requests, metrics.clone());
        let shared = Arc::new(Shared { config, picker, metrics, inflight, tracing: None });
        StreamUnderTest { stream: ExtProcStream::new(shared, None) }
    }

    /// Hands one gateway message to the stream and returns every answer it
    /// queued. `Err` is the status that would end the gRPC stream.
    pub async fn send(&mut self, message: ProcessingRequest) -> Result<Vec<ProcessingResponse>, tonic::Status> {
        self.stream.on_message(message).await?;
        Ok(std::iter::from_fn(|| self.stream.next_out()).collect())
    }
}
