//! Bodies: the one boxed type both directions use, and the answer's body
//! wrapper that counts bytes, times the first one and notices a cancel.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

use crate::metrics::{SidecarMetrics, Stage};

pub type Boxed = BoxBody<Bytes, hyper::Error>;

pub fn full(bytes: impl Into<Bytes>) -> Boxed {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// The decode engine's answer on its way to the client. Frames pass
/// through one at a time as the client takes them (hyper polls this only
/// when it can write), so nothing is buffered here.
pub struct Answer {
    inner: Boxed,
    metrics: Arc<SidecarMetrics>,
    arrived: Instant,
    /// When the decode leg was sent; cleared at its first body byte.
    decode_sent: Option<Instant>,
    done: bool,
}

impl Answer {
    pub fn new(inner: Boxed, metrics: Arc<SidecarMetrics>, arrived: Instant, decode_sent: Option<Instant>) -> Self {
        metrics.enter();
        Answer { inner, metrics, arrived, decode_sent, done: false }
    }

    fn finish(&mut self) {
        if !std::mem::replace(&mut self.done, true) {
            self.metrics.request_done(self.arrived.elapsed());
        }
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !data.is_empty() {
                        if let Some(sent) = this.decode_sent.take() {
                            this.metrics.decode_first_byte(sent.elapsed());
                        }
                    }
                    this.metrics.streamed(data.len());
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
            }
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Err(error))) => {
                // The engine's connection broke mid-answer: the client sees
                // its stream cut, as it would talking to the engine.
                tracing::warn!(%error, "decode engine's answer broke off");
                this.done = true;
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Answer {
    /// Dropped before its end: the client went away (hyper drops the body
    /// of a reset stream or closed connection), and with it the engine's
    /// answer, which closes that connection and aborts the request there.
    fn drop(&mut self) {
        if !self.done {
            self.metrics.cancelled(Stage::Decode);
        }
        self.metrics.leave();
    }
}
