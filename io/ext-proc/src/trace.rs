//! OpenTelemetry spans of one request: the request itself (from its
//! headers to the end of its response), and under it parse, tokenize,
//! hash, select (with each shard's answer, the queue wait and the
//! booking's acknowledgement) and the booking's life.
//!
//! Off unless the app hands the server a [`Tracing`]: a [`RequestTrace`]
//! is then `None` and every call on it returns at once, without reading a
//! clock. Phases are timed with the `Instant`s the metrics already take and
//! turned into wall-clock span times against one anchor per request, so a
//! traced request reads the clock about as often as an untraced one.
//!
//! The gateway's W3C trace context is continued: kvpick's request span is
//! a child of the gateway's span, and follows its sampling decision. Envoy
//! with tracing on sends the context of its ext_proc call span in the gRPC
//! stream's metadata (`traceparent`, `tracestate`), a child of its request
//! span even when the client sent no context: that is the parent when
//! present. Otherwise the HTTP request's own headers (a client's or an
//! earlier proxy's context, which gateways without call spans forward).
//!
//! This crate uses only the OpenTelemetry API; the app chooses the SDK,
//! the sampler and the exporter.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use kvpick_proto::core::HeaderMap;
use opentelemetry::Context;
/// Span attributes, re-exported so the picker builds them without naming
/// the OpenTelemetry crate's version itself.
pub use opentelemetry::KeyValue;
use opentelemetry::global::BoxedTracer;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};

use crate::headers::value_bytes;

/// The tracer and the propagator the server's requests use.
#[derive(Clone)]
pub struct Tracing {
    tracer: Arc<BoxedTracer>,
    propagator: Arc<dyn TextMapPropagator + Send + Sync>,
}

impl Tracing {
    /// `propagator` reads the gateway's context from the request headers
    /// (the W3C one: `opentelemetry_sdk::propagation::TraceContextPropagator`).
    pub fn new(tracer: BoxedTracer, propagator: impl TextMapPropagator + Send + Sync + 'static) -> Self {
        Tracing { tracer: Arc::new(tracer), propagator: Arc::new(propagator) }
    }

    /// Starts a request's span at `start`, as a child of the context the
    /// gateway sent with the gRPC stream (`call`) or else in the request's
    /// `headers` (a new trace when it sent none).
    pub fn start_request(&self, call: &CallContext, headers: Option<&HeaderMap>, start: Instant) -> RequestTrace {
        let from_call = self.propagator.extract(call);
        let parent = if from_call.span().span_context().is_valid() {
            from_call
        } else {
            self.propagator.extract(&Headers(headers))
        };
        let wall = SystemTime::now();
        let anchor = Anchor { wall, at: start.min(Instant::now()) };
        let span = self
            .tracer
            .span_builder("kvpick.request")
            .with_kind(SpanKind::Server)
            .with_start_time(anchor.wall_of(start))
            .start_with_context(&*self.tracer, &parent);
        let cx = parent.with_span(span);
        RequestTrace(Some(Arc::new(Active { tracing: self.clone(), cx, anchor })))
    }
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracing")
    }
}

/// The W3C trace context of the ext_proc gRPC call itself (its metadata),
/// kept only while tracing is on.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl CallContext {
    pub const TRACEPARENT: &str = "traceparent";
    pub const TRACESTATE: &str = "tracestate";

    /// From the call's metadata values (ASCII, as gRPC sends them).
    pub fn new(traceparent: Option<&str>, tracestate: Option<&str>) -> Self {
        CallContext { traceparent: traceparent.map(str::to_owned), tracestate: tracestate.map(str::to_owned) }
    }
}

impl Extractor for CallContext {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            Self::TRACEPARENT => self.traceparent.as_deref(),
            Self::TRACESTATE => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![Self::TRACEPARENT, Self::TRACESTATE]
    }
}

/// The request headers as a propagator reads them (lower-case keys).
struct Headers<'a>(Option<&'a HeaderMap>);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let header = self.0?.headers.iter().find(|h| h.key.eq_ignore_ascii_case(key))?;
        std::str::from_utf8(value_bytes(header)).ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.map(|map| map.headers.iter().map(|h| h.key.as_str()).collect()).unwrap_or_default()
    }
}

/// Maps the request's `Instant`s to wall-clock times: one `SystemTime`
/// read per request, not one per span.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    wall: SystemTime,
    at: Instant,
}

impl Anchor {
    fn wall_of(self, t: Instant) -> SystemTime {
        if t >= self.at { self.wall + (t - self.at) } else { self.wall - (self.at - t) }
    }
}

/// One span of a request (the request's own, or one under it), or nothing
/// when tracing is off. Cheap to clone (a reference count).
#[derive(Clone, Debug, Default)]
pub struct RequestTrace(Option<Arc<Active>>);

struct Active {
    tracing: Tracing,
    /// The context whose active span is this one.
    cx: Context,
    anchor: Anchor,
}

impl std::fmt::Debug for Active {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Active").field("span", self.cx.span().span_context()).finish()
    }
}

impl RequestTrace {
    /// No span: every call does nothing.
    pub fn off() -> Self {
        RequestTrace(None)
    }

    /// A span is recorded: worth building attributes for.
    pub fn is_on(&self) -> bool {
        self.0.as_ref().is_some_and(|a| a.cx.span().is_recording())
    }

    /// A span under this one, started at `start` and left open.
    pub fn child(&self, name: &'static str, start: Instant) -> RequestTrace {
        let Some(active) = self.on() else {
            return RequestTrace(None);
        };
        let tracer = &*active.tracing.tracer;
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(active.anchor.wall_of(start))
            .start_with_context(tracer, &active.cx);
        RequestTrace(Some(Arc::new(Active {
            tracing: active.tracing.clone(),
            cx: active.cx.with_span(span),
            anchor: active.anchor,
        })))
    }

    /// A finished step under this span, from `start` to `end`, with the
    /// attributes `attributes` builds (only called when recording).
    pub fn phase(&self, name: &'static str, start: Instant, end: Instant, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if self.on().is_none() {
            return;
        }
        let child = self.child(name, start);
        child.set(attributes);
        child.end(end);
    }

    /// Adds attributes to this span.
    pub fn set(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(active) = self.on() {
            active.cx.span().set_attributes(attributes());
        }
    }

    /// Something that happened at `at`, during this span.
    pub fn event(&self, name: &'static str, at: Instant, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(active) = self.on() {
            active.cx.span().add_event_with_timestamp(Cow::Borrowed(name), active.anchor.wall_of(at), attributes());
        }
    }

    /// Marks this span failed, with why.
    pub fn fail(&self, description: impl FnOnce() -> String) {
        if let Some(active) = self.on() {
            active.cx.span().set_status(Status::error(description()));
        }
    }

    /// Ends this span at `at`. Later calls (and `end` again) are ignored by
    /// the SDK: a span ends once.
    pub fn end(&self, at: Instant) {
        if let Some(active) = self.on() {
            active.cx.span().end_with_timestamp(active.anchor.wall_of(at));
        }
    }

    /// This span's context as W3C headers (`traceparent`, and
    /// `tracestate` when set), for the request kvpick sends on: the
    /// engine's own spans then nest under it. Empty when not recording.
    pub fn context_headers(&self) -> Vec<(String, String)> {
        let Some(active) = self.on() else {
            return Vec::new();
        };
        let mut headers = ContextHeaders(Vec::new());
        active.tracing.propagator.inject_context(&active.cx, &mut headers);
        headers.0
    }

    fn on(&self) -> Option<&Active> {
        self.0.as_deref().filter(|a| a.cx.span().is_recording())
    }
}

/// Headers a propagator writes.
struct ContextHeaders(Vec<(String, String)>);

impl Injector for ContextHeaders {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}
