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
        let mut answer = Answer { inner, metrics, arrived, decode_sent, done: false };
        // An empty body (a 204, a HEAD's answer) is never polled: it is
        // over already, not cancelled when dropped.
        if answer.inner.is_end_stream() {
            answer.finish();
        }
        answer
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

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use http_body_util::BodyExt;

    use super::*;

    fn answer(metrics: &Arc<SidecarMetrics>, body: Boxed) -> Answer {
        Answer::new(body, metrics.clone(), Instant::now(), Some(Instant::now()))
    }

    #[tokio::test]
    async fn an_answer_is_completed_or_cancelled_once_and_leaves_the_count() {
        let metrics = Arc::new(SidecarMetrics::default());
        // Read to its end: completed, bytes counted.
        let whole = answer(&metrics, full("data: x\n\n"));
        let bytes = whole.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        assert_eq!(bytes.len(), 9);
        // Empty: never polled, still completed.
        drop(answer(&metrics, full(Bytes::new())));
        // Dropped before its end: cancelled.
        let first: Result<Frame<Bytes>, hyper::Error> = Ok(Frame::data(Bytes::from_static(b"data: 1\n\n")));
        let open_ended = futures_util::stream::iter([first]).chain(futures_util::stream::pending());
        let mut cut = answer(&metrics, Boxed::new(http_body_util::StreamBody::new(open_ended)));
        assert!(cut.frame().await.is_some());
        drop(cut);
        let s = metrics.snapshot();
        assert_eq!((s.completed, s.cancelled_decode, s.inflight, s.response_bytes), (2, 1, 0, 18));
    }
}
