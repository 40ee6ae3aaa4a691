//! One ext_proc stream (one HTTP request at the gateway) as a state
//! machine: every message the gateway sends goes in, the answers it must
//! get come out, in order.
//!
//! Request path: headers → body chunks buffered until the body ends (or
//! trailers come) → parse → pick → the headers answer carrying the pick,
//! then the body echoed back (FULL_DUPLEX_STREAMED), or the pick on the
//! body answer (BUFFERED). A request the server refuses gets one
//! `ImmediateResponse`; later messages of that stream are not answered
//! (the gateway has stopped waiting for them) and the gRPC stream stays
//! open until the gateway closes it. Response path: every headers, body
//! and trailers message is answered (body chunks echoed in full-duplex
//! mode); the first non-empty body chunk completes the prefill; the end of
//! the response frees the booking. However the stream ends, dropping it
//! frees the booking (see [`Booking`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kvpick_proto::core::Metadata;
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::{HeaderMutation, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse};
use opentelemetry::KeyValue;

use crate::body::{RequestBody, api_of_path};
use crate::config::ExtProcConfig;
use crate::endpoints::{Endpoint, intersect, parse_csv, to_filter};
use crate::error::RequestError;
use crate::headers::{CONFORMANCE_SERVED, RequestHeaders, ResponseHeaders, set_header};
use crate::inflight::{InflightLimiter, InflightPermit};
use crate::metadata::{Served, destination_metadata, served_endpoint, subset_hint};
use crate::metrics::{ExtProcMetrics, Phase};
use crate::pick::{BodyInput, Booking, Pick, PickInput, Picks};
use crate::protocol::Modes;
use crate::responses::{self, Path};
use crate::trace::{CallContext, RequestTrace, Tracing};
use crate::usage::UsageParser;

/// What every stream of one server shares.
pub(crate) struct Shared<P> {
    pub config: ExtProcConfig,
    pub picker: P,
    pub metrics: Arc<ExtProcMetrics>,
    pub inflight: Arc<InflightLimiter>,
    /// `None`: requests are not traced.
    pub tracing: Option<Tracing>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for the request headers.
    Headers,
    /// Buffering the request body.
    Body,
    /// The pick was sent; the response path follows.
    Answered,
    /// An `ImmediateResponse` was sent: nothing more is answered.
    Refused,
}

/// How the request body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The headers carried `end_of_stream`: no body at all.
    HeadersOnly,
    /// A body chunk carried `end_of_stream`.
    Body,
    /// Trailers followed the body.
    Trailers,
}

pub(crate) struct ExtProcStream<P: Picks> {
    shared: Arc<Shared<P>>,
    modes: Modes,
    first_message: bool,
    stage: Stage,
    out: VecDeque<ProcessingResponse>,
    headers: RequestHeaders,
    /// The request headers were already answered (BUFFERED mode).
    headers_answered: bool,
    body: Vec<u8>,
    subset: Option<Vec<Endpoint>>,
    permit: Option<InflightPermit>,
    picked: Option<Pick<P::Booking>>,
    usage: Option<UsageParser>,
    first_response_chunk_seen: bool,
    response_headers_seen: bool,
    /// The response is a 200 event stream (`text/event-stream`) from the
    /// picked endpoint: its chunks time the picked worker.
    response_streamed: bool,
    response_finished: bool,
    /// When the request headers came: the request's duration starts here.
    started: Option<Instant>,
    /// The body's `model`, for per-model metrics.
    model: String,
    /// The request's span (off unless tracing is on).
    trace: RequestTrace,
    /// The booking's span, from the pick to its release.
    booking_trace: RequestTrace,
    /// The gRPC call's trace context (read only when tracing is on).
    call: Option<CallContext>,
}

impl<P: Picks> ExtProcStream<P> {
    pub(crate) fn new(shared: Arc<Shared<P>>, call: Option<CallContext>) -> Self {
        shared.metrics.stream_opened();
        ExtProcStream {
            modes: Modes::assumed(shared.config.assumed_body_mode),
            shared,
            first_message: true,
            stage: Stage::Headers,
            out: VecDeque::new(),
            headers: RequestHeaders::default(),
            headers_answered: false,
            body: Vec::new(),
            subset: None,
            permit: None,
            picked: None,
            usage: None,
            first_response_chunk_seen: false,
            response_headers_seen: false,
            response_streamed: false,
            response_finished: false,
            started: None,
            model: String::new(),
            trace: RequestTrace::off(),
            booking_trace: RequestTrace::off(),
            call,
        }
    }

    /// The next answer to send, if any is ready.
    pub(crate) fn next_out(&mut self) -> Option<ProcessingResponse> {
        self.out.pop_front()
    }

    /// Handles one message from the gateway. An error ends the gRPC
    /// stream: only for a gateway configuration kvpick cannot work with,
    /// never for a bad HTTP request.
    pub(crate) async fn on_message(&mut self, message: ProcessingRequest) -> Result<(), tonic::Status> {
        if std::mem::take(&mut self.first_message) {
            if let Some(config) = &message.protocol_config {
                self.modes = Modes::from_protocol_config(config)?;
            }
        }
        let Some(request) = message.request else {
            // Flow-control only: nothing to answer.
            return Ok(());
        };
        let metadata = message.metadata_context.as_ref();
        let queued = self.out.len();
        match request {
            Request::RequestHeaders(headers) => self.on_request_headers(headers, metadata).await,
            Request::RequestBody(body) => self.on_request_body(body, metadata).await,
            Request::RequestTrailers(_) => self.on_request_trailers(metadata).await,
            Request::ResponseHeaders(headers) => self.on_response_headers(headers, metadata),
            Request::ResponseBody(body) => self.on_response_body(body),
            Request::ResponseTrailers(_) => self.on_response_trailers(),
        }
        if message.observability_mode {
            // The gateway ignores answers in observability mode.
            self.out.truncate(queued);
        }
        Ok(())
    }

    /// The gateway's stream failed (reset, broken connection, a message
    /// that does not decode). Dropping the stream frees the booking.
    pub(crate) fn on_stream_error(&mut self, status: &tonic::Status) {
        self.shared.metrics.record_stream_error();
        tracing::debug!(code = ?status.code(), message = status.message(), "ext_proc stream ended with an error");
    }

    fn note_subset(&mut self, metadata: Option<&Metadata>) {
        if let Some(subset) = subset_hint(metadata) {
            self.subset = Some(subset);
        }
    }

    async fn on_request_headers(&mut self, message: HttpHeaders, metadata: Option<&Metadata>) {
        if self.stage != Stage::Headers {
            // After a refusal nothing is answered or counted (the gateway
            // has stopped waiting); otherwise they came twice.
            if self.stage != Stage::Refused {
                tracing::debug!(stage = ?self.stage, "ignoring request headers sent twice");
                self.shared.metrics.record_out_of_order();
            }
            return;
        }
        self.note_subset(metadata);
        let started = Instant::now();
        self.started = Some(started);
        self.headers = RequestHeaders::read(message.headers.as_ref());
        self.start_trace(message.headers.as_ref(), started);
        if !self.admit() {
            return;
        }
        if message.end_of_stream {
            return self.finish_request(End::HeadersOnly).await;
        }
        self.stage = Stage::Body;
        if !self.modes.request_full_duplex() {
            // BUFFERED: the body comes only after this answer; the pick
            // rides on the body answer.
            let strip = self.headers.strip_mutation();
            self.out.push_back(responses::headers(Path::Request, strip, false, None));
            self.headers_answered = true;
        }
    }

    /// Starts the request's span (when tracing is on), continuing the
    /// gateway's trace context from `headers`.
    fn start_trace(&mut self, headers: Option<&kvpick_proto::core::HeaderMap>, at: Instant) {
        let Some(tracing) = &self.shared.tracing else {
            return;
        };
        self.trace = tracing.start_request(self.call.as_ref().unwrap_or(&CallContext::default()), headers, at);
        let (method, path) = (&self.headers.method, self.headers.route());
        self.trace.set(|| {
            vec![KeyValue::new("http.request.method", method.clone()), KeyValue::new("url.path", path.to_owned())]
        });
    }

    /// Takes an in-flight permit, or refuses the request.
    fn admit(&mut self) -> bool {
        match self.shared.inflight.try_acquire() {
            Some(permit) => {
                self.permit = Some(permit);
                true
            }
            None => {
                self.refuse(RequestError::InflightLimit { limit: self.shared.inflight.max() });
                false
            }
        }
    }

    async fn on_request_body(&mut self, message: HttpBody, metadata: Option<&Metadata>) {
        match self.stage {
            Stage::Refused | Stage::Answered => return,
            // Request headers not sent to us (header mode SKIP).
            Stage::Headers => {
                self.start_trace(None, Instant::now());
                if !self.admit() {
                    return;
                }
                self.stage = Stage::Body;
                // No headers message to answer: the body answer carries all.
                self.headers_answered = true;
            }
            Stage::Body => {}
        }
        self.note_subset(metadata);
        let limit = self.shared.config.max_body_bytes;
        if self.body.len() + message.body.len() > limit {
            self.refuse(RequestError::BodyTooLarge { limit });
            return;
        }
        if self.body.is_empty() {
            self.body = message.body;
        } else {
            self.body.extend_from_slice(&message.body);
        }
        // BUFFERED sends the whole body in one message, trailers or not.
        if message.end_of_stream || !self.modes.request_full_duplex() {
            self.finish_request(End::Body).await;
        }
    }

    async fn on_request_trailers(&mut self, metadata: Option<&Metadata>) {
        match self.stage {
            Stage::Refused => return,
            Stage::Body => {
                self.note_subset(metadata);
                self.finish_request(End::Trailers).await;
                if self.stage == Stage::Refused {
                    return;
                }
            }
            Stage::Headers | Stage::Answered => {}
        }
        self.out.push_back(responses::trailers(Path::Request));
    }

    /// The candidates: the gateway's subset, narrowed by the conformance
    /// header when the hooks are on. Set but empty → 503.
    fn allowed(&self) -> Result<Option<Vec<Endpoint>>, RequestError> {
        let conformance = match &self.headers.conformance_selection {
            Some(csv) if self.shared.config.conformance_hooks => Some(parse_csv(csv)),
            _ => None,
        };
        let allowed = match (&self.subset, conformance) {
            (Some(subset), Some(test)) => Some(intersect(subset, &test)),
            (Some(subset), None) => Some(subset.clone()),
            (None, test) => test,
        };
        match allowed {
            Some(list) if list.is_empty() => Err(RequestError::EmptySubset),
            other => Ok(other),
        }
    }

    async fn pick(&mut self, body: &Bytes) -> Result<Pick<P::Booking>, RequestError> {
        let allowed = self.allowed()?.map(|list| to_filter(&list));
        let body = if body.is_empty() {
            None
        } else {
            let parsing = Instant::now();
            let parsed = RequestBody::parse(body, api_of_path(self.headers.route()));
            let parsed_at = Instant::now();
            self.shared.metrics.record_phase(Phase::Parse, parsed_at - parsing);
            self.trace.phase("parse", parsing, parsed_at, || match &parsed {
                Ok(p) => vec![
                    KeyValue::new("gen_ai.request.model", p.model.clone()),
                    KeyValue::new("kvpick.body_bytes", i64::try_from(body.len()).unwrap_or(i64::MAX)),
                    KeyValue::new("kvpick.api", p.api.map_or("none", |a| a.as_str())),
                ],
                Err(error) => vec![KeyValue::new("error.type", error.details())],
            });
            let parsed = parsed?;
            self.model.clone_from(&parsed.model);
            Some(BodyInput { bytes: body.clone(), parsed })
        };
        let session = self.headers.session.clone().or_else(|| body.as_ref().and_then(|b| b.parsed.session_id.clone()));
        let trace = self.trace.clone();
        let pick = self.shared.picker.pick(PickInput { body, allowed, session, trace }).await?;
        Ok(pick)
    }

    async fn finish_request(&mut self, end: End) {
        let body = Bytes::from(std::mem::take(&mut self.body));
        let deciding = Instant::now();
        let result = self.pick(&body).await;
        self.shared.metrics.record_scheduler(deciding.elapsed());
        self.permit = None;
        let picked = match result {
            Ok(picked) => picked,
            Err(error) => return self.refuse(error),
        };
        if self.trace.is_on() {
            self.trace_pick(&picked);
        }
        self.shared.metrics.record_status(200);
        self.shared.metrics.record_model_decision(&self.model, None);
        // The ranked list goes in the metadata; the header has the pick
        // alone unless asked (some gateways refuse a list there). Without
        // fallbacks both are the one string.
        let destination = picked.destination();
        let single;
        let header = if self.shared.config.fallbacks_in_header || picked.fallbacks.is_empty() {
            destination.as_str()
        } else {
            single = picked.endpoint.to_string();
            single.as_str()
        };
        let prefiller = picked.prefill.map(|p| p.to_string());
        let mut mutation = self.headers.pick_mutation(header, prefiller.as_deref());
        // The engine's spans (if it traces) go under this request's.
        for (key, value) in self.trace.context_headers() {
            mutation.set_headers.push(set_header(&key, value.as_bytes()));
        }
        let metadata = Some(destination_metadata(&destination));
        if !self.headers_answered {
            self.out.push_back(responses::headers(Path::Request, Some(mutation), true, metadata));
            self.echo_request_body(&body, end);
        } else if self.modes.request_full_duplex() {
            // The headers never came to kvpick (header mode SKIP): the
            // pick cannot reach the gateway, but the body must go on.
            tracing::warn!("request headers were not sent to kvpick: its pick cannot be applied");
            self.echo_request_body(&body, end);
        } else {
            // BUFFERED: the held headers take the pick from the body answer.
            self.out.push_back(responses::body_continue(Path::Request, Some(mutation), true, metadata));
        }
        self.picked = Some(picked);
        self.stage = Stage::Answered;
    }

    fn trace_pick(&mut self, picked: &Pick<P::Booking>) {
        let fallbacks = i64::try_from(picked.fallbacks.len()).unwrap_or(i64::MAX);
        self.trace.set(|| {
            vec![
                KeyValue::new("kvpick.endpoint", picked.endpoint.to_string()),
                KeyValue::new("kvpick.prefill_endpoint", picked.prefill.map_or_else(String::new, |p| p.to_string())),
                KeyValue::new("kvpick.fallbacks", fallbacks),
                KeyValue::new("http.response.status_code", 200),
            ]
        });
        if picked.reservation.is_some() {
            self.booking_trace = self.trace.child("booking", Instant::now());
        }
    }

    fn echo_request_body(&mut self, body: &[u8], end: End) {
        match end {
            End::HeadersOnly => {}
            End::Body => responses::streamed_body(Path::Request, body, true, &mut self.out),
            End::Trailers => responses::streamed_body(Path::Request, body, false, &mut self.out),
        }
    }

    fn refuse(&mut self, error: RequestError) {
        tracing::debug!(%error, status = error.status(), "refusing request");
        self.shared.metrics.record_status(error.status());
        self.shared.metrics.record_model_decision(&self.model, Some(error.details()));
        self.trace.set(|| {
            vec![
                KeyValue::new("http.response.status_code", i64::from(error.status())),
                KeyValue::new("error.type", error.details()),
            ]
        });
        self.trace.fail(|| error.to_string());
        self.trace.end(Instant::now());
        self.out.push_back(error.immediate_response());
        self.stage = Stage::Refused;
        self.permit = None;
        self.body = Vec::new();
        // Frees anything booked.
        self.picked = None;
    }

    fn on_response_headers(&mut self, message: HttpHeaders, metadata: Option<&Metadata>) {
        if self.stage == Stage::Refused {
            return;
        }
        if std::mem::replace(&mut self.response_headers_seen, true) {
            // Envoy sends them once. A second set must not tell `served_by`
            // again or restart the usage count of a response under way, but
            // it is still answered (the gateway may be waiting for that
            // answer) and may still end the response.
            tracing::debug!(stage = ?self.stage, "response headers sent twice: answered, otherwise ignored");
            self.shared.metrics.record_out_of_order();
            self.out.push_back(responses::headers(Path::Response, None, false, None));
            if message.end_of_stream {
                self.finish_response();
            }
            return;
        }
        let headers = ResponseHeaders::read(message.headers.as_ref());
        // Only a successful event stream's first chunk is a first token.
        self.response_streamed = headers.event_stream && headers.status == Some(200);
        let cap = self.shared.config.max_usage_body_bytes;
        self.usage = Some(if headers.event_stream { UsageParser::sse() } else { UsageParser::json(cap) });
        let served = served_endpoint(metadata);
        if let Some(picked) = &mut self.picked {
            match &served {
                Served::Endpoint(text) => {
                    let endpoint = text.parse::<SocketAddr>().ok();
                    if endpoint != Some(picked.endpoint) {
                        // Its times are another worker's (or a retry's).
                        self.response_streamed = false;
                        self.shared.metrics.record_served_mismatch();
                        tracing::debug!(picked = %picked.endpoint, served = %text, "gateway served another endpoint");
                        self.booking_trace.event("served by another endpoint", Instant::now(), || {
                            vec![KeyValue::new("kvpick.served_endpoint", text.clone())]
                        });
                        if let (Some(endpoint), Some(reservation)) = (endpoint, picked.reservation.as_mut()) {
                            reservation.served_by(endpoint);
                        }
                    }
                }
                Served::NoLbMetadata | Served::NoServedKey => self.shared.metrics.record_served_missing(),
            }
        }
        if let Some(ran) = headers.pd {
            // The sidecar says the prefill leg is over: its booking goes now.
            self.shared.metrics.record_pd_handoff(ran);
            if let Some(reservation) = self.picked.as_mut().and_then(|p| p.reservation.as_mut()) {
                reservation.prefill_handed_off(ran, headers.event_stream, self.response_streamed);
            }
            self.booking_trace
                .event("prefill handed off", Instant::now(), || vec![KeyValue::new("kvpick.pd", ran.label())]);
        }
        let mutation = self.shared.config.conformance_hooks.then(|| {
            let value = match &served {
                Served::Endpoint(text) => text.as_str(),
                Served::NoLbMetadata => "fail: missing envoy lb metadata",
                Served::NoServedKey => "fail: missing destination endpoint served metadata",
            };
            HeaderMutation {
                set_headers: vec![set_header(CONFORMANCE_SERVED, value.as_bytes())],
                remove_headers: vec![],
            }
        });
        self.out.push_back(responses::headers(Path::Response, mutation, false, None));
        if message.end_of_stream {
            self.finish_response();
        }
    }

    fn on_response_body(&mut self, message: HttpBody) {
        if self.stage == Stage::Refused {
            return;
        }
        // The first token: prefill is done. When the same chunk also ends
        // the response, the free that follows releases everything anyway
        // (one hand-off to the shard saved).
        if !message.body.is_empty()
            && !std::mem::replace(&mut self.first_response_chunk_seen, true)
            && !message.end_of_stream
        {
            if let Some(reservation) = self.picked.as_mut().and_then(|p| p.reservation.as_mut()) {
                reservation.prefill_complete(self.response_streamed);
            }
            let streamed = self.response_streamed;
            self.booking_trace
                .event("prefill complete", Instant::now(), || vec![KeyValue::new("kvpick.first_token", streamed)]);
        }
        if let Some(usage) = &mut self.usage {
            usage.push(&message.body);
        }
        let end = message.end_of_stream;
        if !end {
            if let Some(reservation) = self.picked.as_mut().and_then(|p| p.reservation.as_mut()) {
                reservation.response_progress();
            }
        }
        if self.modes.response_full_duplex() {
            responses::streamed_echo(Path::Response, message.body, end, &mut self.out);
        } else {
            self.out.push_back(responses::body_continue(Path::Response, None, false, None));
        }
        if end {
            self.finish_response();
        }
    }

    fn on_response_trailers(&mut self) {
        if self.stage == Stage::Refused {
            return;
        }
        self.out.push_back(responses::trailers(Path::Response));
        self.finish_response();
    }

    /// The response is over: record usage, free the booking.
    fn finish_response(&mut self) {
        if std::mem::replace(&mut self.response_finished, true) {
            return;
        }
        let events = self.usage.as_ref().map_or(0, UsageParser::sse_events);
        let usage = self.usage.take().and_then(UsageParser::finish);
        if let Some(usage) = &usage {
            self.shared.metrics.record_usage(usage);
        }
        if self.response_streamed && self.first_response_chunk_seen {
            // The engine's count when it sent one, else one token an event.
            let output_tokens = usage.map_or(events, |u| u.completion_tokens);
            if let Some(reservation) = self.picked.as_mut().and_then(|p| p.reservation.as_mut()) {
                reservation.response_finished(output_tokens);
            }
        }
        let now = Instant::now();
        if let Some(started) = self.started {
            self.shared.metrics.record_request_duration(now - started);
        }
        if let Some(picked) = &mut self.picked {
            // Dropping the guard frees the booking.
            picked.reservation = None;
        }
        self.booking_trace.end(now);
        self.trace.set(|| {
            let mut attributes = vec![KeyValue::new("kvpick.sse_events", i64::try_from(events).unwrap_or(i64::MAX))];
            if let Some(usage) = usage {
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                attributes.push(KeyValue::new("gen_ai.usage.input_tokens", count(usage.prompt_tokens)));
                attributes.push(KeyValue::new("gen_ai.usage.output_tokens", count(usage.completion_tokens)));
            }
            attributes
        });
        self.trace.end(now);
    }
}

impl<P: Picks> Drop for ExtProcStream<P> {
    fn drop(&mut self) {
        self.shared.metrics.stream_closed();
        if !self.response_finished && self.trace.is_on() {
            // The gateway went away first (or the response never came):
            // the booking is freed now, with the stream.
            let now = Instant::now();
            self.booking_trace.end(now);
            self.trace.set(|| vec![KeyValue::new("kvpick.response_finished", false)]);
            self.trace.end(now);
        }
    }
}
