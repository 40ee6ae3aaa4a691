//! What the server asks of whoever picks the endpoint: the Pick API.
//!
//! The server parses the body and knows the allowed endpoints; a [`Picks`]
//! implementor (kvpick's router, or a baseline) turns that into an
//! endpoint and, optionally, a [`Booking`] that the stream holds until the
//! request ends. The server is generic over the picker: static dispatch,
//! no boxed futures on the request path.

use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use kvpick_core::EndpointFilter;

use crate::body::RequestBody;
use crate::error::RequestError;
use crate::headers::PdRan;
use crate::trace::RequestTrace;

/// What a pick is made from.
#[derive(Debug)]
pub struct PickInput {
    /// `None`: a request without a body (GET `/v1/models`, a probe).
    pub body: Option<BodyInput>,
    /// Only these endpoints may serve (subset hint, conformance header).
    pub allowed: Option<EndpointFilter>,
    /// The client's session key (`x-session-token`, else the body's
    /// `session_id`), for session affinity.
    pub session: Option<String>,
    /// The request's span, for the picker's phases (off: does nothing).
    pub trace: RequestTrace,
}

#[derive(Debug)]
pub struct BodyInput {
    pub bytes: Bytes,
    pub parsed: RequestBody,
}

/// The endpoint, and the booking to release when the request ends.
#[derive(Debug)]
pub struct Pick<B> {
    pub endpoint: SocketAddr,
    /// Where the gateway may go next if `endpoint` fails, in order; empty
    /// unless fallbacks are configured (agentgateway rejects a list).
    pub fallbacks: Vec<SocketAddr>,
    /// Disaggregated serving: the prefill worker `endpoint` (the decode
    /// pod's sidecar) takes the prompt's KV blocks from, sent as
    /// `x-prefiller-host-port`. `None`: `endpoint` serves the whole request.
    pub prefill: Option<SocketAddr>,
    pub reservation: Option<B>,
}

impl<B> Pick<B> {
    /// `ip:port`, or `ip:port,ip:port,…` with the ordered fallbacks.
    pub fn destination(&self) -> String {
        let mut destination = self.endpoint.to_string();
        for fallback in &self.fallbacks {
            destination.push(',');
            destination.push_str(&fallback.to_string());
        }
        destination
    }
}

/// Load booked for one request. Dropping it frees the load, exactly once,
/// however the stream ends (response finished, gateway cancelled,
/// connection broken).
pub trait Booking: Send + 'static {
    /// The engine started answering: its prompt is no longer prefill load.
    /// `streamed`: the answer is an event stream, so this first chunk is
    /// the first token and the time since the pick is a time to first
    /// token (a JSON body's first chunk comes when the answer is done).
    /// Only the first call does anything.
    fn prefill_complete(&mut self, streamed: bool);

    /// A streamed response ended after its first token, with about
    /// `output_tokens` in all: the time since the first token is its
    /// decode. Not called for responses that did not stream.
    fn response_finished(&mut self, output_tokens: u64);

    /// A response chunk passed: the request is alive, so its booking must
    /// outlive a lease shorter than the answer. Called on every chunk;
    /// the booking decides how often that is worth a message.
    fn response_progress(&mut self);

    /// The gateway reports that `endpoint`, not the pick, served the
    /// request (a fallback, a retry, or a pick it ignored): the load is
    /// there now. Called at most once, with the response headers.
    fn served_by(&mut self, endpoint: SocketAddr);

    /// The decode sidecar's hand-off header (`x-kvpick-pd`) came with the
    /// response headers: the prefill leg is over, so a split request's
    /// prefill booking can go now rather than at the first token, and if
    /// the sidecar ran the request whole (`ran` is `Aggregated`) and the
    /// answer is an event stream still to come, its decode worker is
    /// computing the prompt after all. `timed`: the answer streams from
    /// the picked endpoint, so for a split the headers came as the prefill
    /// leg ended and the time since the pick is the prefill worker's.
    /// Bookings with no prefill leg ignore it.
    fn prefill_handed_off(&mut self, ran: PdRan, event_stream: bool, timed: bool) {
        let _ = (ran, event_stream, timed);
    }
}

/// Picks the endpoint for one request.
pub trait Picks: Send + Sync + 'static {
    type Booking: Booking;

    fn pick(&self, input: PickInput) -> impl Future<Output = Result<Pick<Self::Booking>, RequestError>> + Send;
}
