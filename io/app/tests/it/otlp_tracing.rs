//! OpenTelemetry tracing: each request's spans as an OTLP collector
//! receives them (an in-process stand-in on 127.0.0.1), continuing the
//! gateway's W3C trace context and following its sampling decision.

use std::collections::HashMap;
use std::time::Duration;

use crate::ext_proc_support::*;
use kvpick_app::app::otlp::{TraceExport, TracingConfig};
use kvpick_test_support::otlp_collector::{OtlpCollector, ReceivedSpan};

/// The gateway's span, as Envoy sends it: trace id, span id, sampled.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const GATEWAY_SPAN: &str = "00f067aa0ba902b7";

fn traceparent(flags: &str) -> String {
    format!("00-{TRACE_ID}-{GATEWAY_SPAN}-{flags}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SpanKind and status code values of the OTLP protobuf.
const KIND_SERVER: i32 = 2;
const STATUS_ERROR: i32 = 2;

/// A traced harness and the collector its spans go to.
struct Traced {
    collector: OtlpCollector,
    export: TraceExport,
    h: Harness,
}

impl Traced {
    async fn start(ratio: f64) -> Traced {
        Traced::with(ratio, Options::default()).await
    }

    async fn with(ratio: f64, options: Options) -> Traced {
        let collector = OtlpCollector::start().await.expect("collector listens");
        let config =
            TracingConfig { endpoint: collector.endpoint(), service_name: "kvpick-test".into(), sample_ratio: ratio };
        let (export, tracing) = TraceExport::start(&config).expect("exporter starts");
        let h = Harness::start(Options { tracing: Some(tracing), ..options }).await;
        Traced { collector, export, h }
    }

    /// Once every booking is freed, the spans exported, until `done`
    /// holds for them (or 10 s pass).
    async fn spans(&self, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        self.h.wait_all_freed().await;
        self.export.flush().await;
        self.collector.wait_for(Duration::from_secs(10), done).await
    }

    async fn stop(self) {
        self.h.stop().await;
        self.export.shutdown().await;
        self.collector.shutdown().await;
    }
}

/// A whole request on `call`: headers with `extra`, `body`, the pick, a
/// JSON answer, the end of the stream.
async fn whole_request(call: &mut Call, extra: &[(&str, &str)], body: &str) {
    call.send(request_headers("POST", "/v1/chat/completions", extra, false, full_duplex()));
    call.send(request_body(body.as_bytes(), true));
    assert!(destination(&call.recv().await).is_some());
    call.recv().await;
    finish_response(call).await;
    call.close_send();
    assert!(matches!(call.next().await, Ok(None)));
}

fn request_spans(spans: &[ReceivedSpan]) -> Vec<&ReceivedSpan> {
    spans.iter().filter(|s| s.span.name == "kvpick.request").collect()
}

/// The spans whose parent is `parent`, by name.
fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> HashMap<&'a str, &'a ReceivedSpan> {
    spans.iter().filter(|s| s.span.parent_span_id == parent.span.span_id).map(|s| (s.span.name.as_str(), s)).collect()
}

fn assert_within(child: &ReceivedSpan, parent: &ReceivedSpan) {
    let (c, p) = (&child.span, &parent.span);
    assert!(c.start_time_unix_nano <= c.end_time_unix_nano, "{} ends before it starts", c.name);
    assert!(
        p.start_time_unix_nano <= c.start_time_unix_nano && c.end_time_unix_nano <= p.end_time_unix_nano,
        "{} [{}, {}] is not within {} [{}, {}]",
        c.name,
        c.start_time_unix_nano,
        c.end_time_unix_nano,
        p.name,
        p.start_time_unix_nano,
        p.end_time_unix_nano
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_under_the_gateways_span() {
    let traced = Traced::start(1.0).await;
    let h = &traced.h;
    let body = chat(&words("traced", 12));
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let parent = traceparent("01");
    call.send(request_headers("POST", "/v1/chat/completions", &[("traceparent", &parent)], false, full_duplex()));
    call.send(request_body(body.as_bytes(), true));
    let headers = call.recv().await;
    let picked = destination(&headers).expect("a pick");
    // The request goes on with kvpick's span as its parent.
    let (forwarded, _) = set_header(&headers, "traceparent").expect("traceparent set on the request");
    assert!(streamed(&call.recv().await).is_some(), "body echoed");
    call.send(response_headers("200", "text/event-stream", Some(&picked), false));
    call.recv().await;
    call.send(response_body(b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n", false));
    call.recv().await;
    call.send(response_body(b"data: [DONE]\n\n", true));
    call.recv().await;
    call.close_send();
    assert!(matches!(call.next().await, Ok(None)));

    let spans = traced.spans(|s| !request_spans(s).is_empty()).await;
    let requests = request_spans(&spans);
    assert_eq!(requests.len(), 1, "{spans:#?}");
    let request = requests[0];
    // The gateway's trace, under the gateway's span.
    assert_eq!(hex(&request.span.trace_id), TRACE_ID);
    assert_eq!(hex(&request.span.parent_span_id), GATEWAY_SPAN);
    assert_eq!(request.span.kind, KIND_SERVER);
    assert_eq!(request.resource_attribute("service.name").as_deref(), Some("kvpick-test"));
    assert_eq!(request.attribute("kvpick.endpoint"), Some(picked.clone()));
    assert_eq!(request.attribute("http.response.status_code").as_deref(), Some("200"));
    assert_eq!(request.attribute("url.path").as_deref(), Some("/v1/chat/completions"));
    assert!(spans.iter().all(|s| hex(&s.span.trace_id) == TRACE_ID), "one trace");
    assert_eq!(forwarded, format!("00-{TRACE_ID}-{}-01", hex(&request.span.span_id)));

    let under_request = children(&spans, request);
    for name in ["parse", "tokenize", "hash", "select", "booking"] {
        let span = under_request.get(name).unwrap_or_else(|| panic!("no {name} span under the request: {spans:#?}"));
        assert_within(span, request);
    }
    assert_eq!(under_request["parse"].attribute("gen_ai.request.model").as_deref(), Some("test-model"));
    assert_eq!(under_request["tokenize"].attribute("kvpick.tokens").as_deref(), Some("12"));
    assert_eq!(under_request["hash"].attribute("kvpick.blocks").as_deref(), Some("3"));
    // The phases come in order.
    let start = |name: &str| under_request[name].span.start_time_unix_nano;
    assert!(
        start("parse") <= start("tokenize") && start("tokenize") <= start("hash") && start("hash") <= start("select")
    );

    let select = under_request["select"];
    assert_eq!(select.attribute("kvpick.endpoint"), Some(picked.clone()));
    assert_eq!(select.attribute("kvpick.isl_tokens").as_deref(), Some("12"));
    assert!(select.attribute("kvpick.cost").is_some());
    // Two shards: each answered with its candidates, then the booking.
    let under_select: Vec<_> = spans.iter().filter(|s| s.span.parent_span_id == select.span.span_id).collect();
    let shards: Vec<_> = under_select.iter().filter(|s| s.span.name == "shard").collect();
    assert_eq!(shards.len(), 2, "{under_select:#?}");
    let offered: u64 =
        shards.iter().map(|s| s.attribute("kvpick.candidates").and_then(|c| c.parse().ok()).unwrap_or(0)).sum();
    assert_eq!(offered, 3, "three workers over two shards");
    assert!(under_select.iter().any(|s| s.span.name == "book"));
    for span in &under_select {
        assert_within(span, select);
    }

    let booking = under_request["booking"];
    let events: Vec<_> = booking.span.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(events, ["prefill complete"]);
    assert_eq!(request.attribute("kvpick.sse_events").as_deref(), Some("1"));

    traced.stop().await;
}

/// Envoy with tracing on sends its ext_proc call span's context in the
/// gRPC metadata: kvpick's span goes under it, even when the HTTP request
/// carries the client's own context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_grpc_context_is_the_parent_when_envoy_sends_one() {
    let traced = Traced::start(1.0).await;
    let h = &traced.h;
    let envoy_span = "b7ad6b7169203331";
    let call_context = format!("00-{TRACE_ID}-{envoy_span}-01");
    let client_context = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
    let mut client = h.client().await;
    let metadata = [("traceparent", call_context.as_str())];
    let mut call = Call::open_with_metadata(&mut client, &metadata).await;
    whole_request(&mut call, &[("traceparent", client_context)], &chat(&words("envoy", 8))).await;
    let spans = traced.spans(|s| !request_spans(s).is_empty()).await;
    let requests = request_spans(&spans);
    assert_eq!(requests.len(), 1, "{spans:#?}");
    assert_eq!(hex(&requests[0].span.trace_id), TRACE_ID);
    assert_eq!(hex(&requests[0].span.parent_span_id), envoy_span);
    traced.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_and_a_stream_cut_short_end_their_spans() {
    let traced = Traced::start(1.0).await;
    let h = &traced.h;
    let mut client = h.client().await;
    // Refused: the body is not JSON.
    let mut call = Call::open(&mut client).await;
    call.send(chat_headers());
    call.send(request_body(b"{\"model\":", true));
    assert!(immediate(&call.recv().await).is_some());
    call.close_send();
    assert!(matches!(call.next().await, Ok(None)));
    // Picked, then the gateway goes away before any response.
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat(&words("cut", 8))).await;
    drop(call);

    let spans = traced.spans(|s| request_spans(s).len() >= 2).await;
    let requests = request_spans(&spans);
    assert_eq!(requests.len(), 2, "{spans:#?}");
    let refused = requests.iter().find(|s| s.attribute("http.response.status_code").as_deref() == Some("400"));
    let refused = refused.unwrap_or_else(|| panic!("no refused request: {requests:#?}"));
    assert_eq!(refused.span.status.as_ref().map(|s| s.code), Some(STATUS_ERROR));
    assert!(refused.attribute("error.type").is_some());
    // A new trace of its own: the gateway sent no context.
    assert!(refused.span.parent_span_id.is_empty());
    let parse = children(&spans, refused);
    assert!(parse["parse"].attribute("error.type").is_some(), "{parse:#?}");

    let cut = requests.iter().find(|s| s.attribute("kvpick.response_finished").as_deref() == Some("false"));
    let cut = cut.unwrap_or_else(|| panic!("no request cut short: {requests:#?}"));
    let booking = children(&spans, cut);
    assert_within(booking["booking"], cut);
    assert_ne!(cut.span.trace_id, refused.span.trace_id);

    traced.stop().await;
}

/// A request that waits for capacity shows the wait under its select span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_shows_its_wait() {
    let traced = Traced::with(1.0, Options::queue_at_any_prefill()).await;
    let h = &traced.h;
    let mut client = h.client().await;
    let mut first = Call::open(&mut client).await;
    pick(&mut first, &chat(&words("first", 20))).await;
    let mut second = Call::open(&mut client).await;
    second.send(chat_headers());
    second.send(request_body(chat(&words("second", 20)).as_bytes(), true));
    wait_for("the second request queues", || async { h.service.queue_len() == 1 }).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The first request's first token frees its prefill: the second is admitted.
    first.send(response_headers("200", "text/event-stream", None, false));
    first.recv().await;
    first.send(response_body(b"data: {}\n\n", false));
    first.recv().await;
    assert!(destination(&second.recv().await).is_some(), "admitted after the wait");
    drop(first);
    drop(second);
    let spans = traced.spans(|s| s.iter().any(|s| s.span.name == "queue wait")).await;
    let waited =
        spans.iter().find(|s| s.span.name == "queue wait").unwrap_or_else(|| panic!("no queue wait: {spans:#?}"));
    let select = spans.iter().find(|s| s.span.span_id == waited.span.parent_span_id).expect("its select span");
    assert_eq!(select.span.name, "select");
    assert_eq!(select.attribute("kvpick.queued").as_deref(), Some("true"));
    assert_within(waited, select);
    let waited_ns = waited.span.end_time_unix_nano - waited.span.start_time_unix_nano;
    assert!(waited_ns >= 20_000_000, "the wait lasted until the first token: {waited_ns} ns");
    traced.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_follows_the_gateway_then_the_ratio() {
    let traced = Traced::start(0.0).await;
    let h = &traced.h;
    let mut client = h.client().await;
    for (i, flags) in [None, Some("00"), Some("01")].into_iter().enumerate() {
        let parent = flags.map(traceparent);
        let extra: Vec<(&str, &str)> = parent.iter().map(|p| ("traceparent", p.as_str())).collect();
        let mut call = Call::open(&mut client).await;
        whole_request(&mut call, &extra, &chat(&words(&format!("sampled{i}"), 8))).await;
    }
    let spans = traced.spans(|s| !request_spans(s).is_empty()).await;
    // Ratio 0 drops the root request and the one the gateway did not
    // sample; the sampled gateway's request is traced whole.
    let requests = request_spans(&spans);
    assert_eq!(requests.len(), 1, "{spans:#?}");
    assert!(spans.iter().all(|s| hex(&s.span.trace_id) == TRACE_ID), "{spans:#?}");
    assert!(children(&spans, requests[0]).contains_key("select"));
    traced.stop().await;
}

/// The binary as deployed: `--otlp-endpoint` set, a request through the
/// miniature gateway to a simulated engine, then SIGTERM: the spans reach
/// the collector by the time the process has exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvpick_serve_exports_its_spans_before_it_exits() {
    use crate::bin_support::{TempDir, chat, fleet, serve, write_workers};
    use kvpick_test_support::gateway::Gateway;

    let collector = OtlpCollector::start().await.expect("collector listens");
    let fleet = fleet(2).await;
    let dir = TempDir::new("otlp");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let endpoint = collector.endpoint();
    let mut kvpick = serve(&file, &["--otlp-endpoint", &endpoint]);
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let parent = traceparent("01");
    let exchange = gateway
        .post_with_headers("/v1/chat/completions", &chat("a traced question"), &[("traceparent", &parent)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exchange.status, 200);
    let picked = exchange.endpoint.unwrap_or_else(|| panic!("no pick")).to_string();
    kvpick.signal("TERM");
    let (status, log) = tokio::task::spawn_blocking(move || {
        let status = kvpick.wait_exit();
        (status, kvpick.drain_log().join("\n"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.code(), Some(0), "log:\n{log}");
    assert!(log.contains("tracing: spans exported over OTLP"), "log:\n{log}");

    // Nothing waited for: the exporter flushed at shutdown.
    let spans = collector.spans();
    let requests = request_spans(&spans);
    assert_eq!(requests.len(), 1, "{spans:#?}\nlog:\n{log}");
    let request = requests[0];
    assert_eq!(hex(&request.span.trace_id), TRACE_ID);
    assert_eq!(hex(&request.span.parent_span_id), GATEWAY_SPAN);
    assert_eq!(request.resource_attribute("service.name").as_deref(), Some("kvpick"));
    assert_eq!(request.attribute("kvpick.endpoint"), Some(picked));
    assert!(request.attribute("gen_ai.usage.output_tokens").is_some(), "{request:#?}");
    let under = children(&spans, request);
    for name in ["parse", "tokenize", "hash", "select", "booking"] {
        assert!(under.contains_key(name), "no {name} span: {spans:#?}");
    }
    // One shard: it picked and booked in the same visit.
    let select = under["select"];
    assert!(spans.iter().any(|s| s.span.parent_span_id == select.span.span_id && s.span.name == "shard"));
    fleet.shutdown().await;
    collector.shutdown().await;
}

/// A split request's trace: both legs' selections under its span, the
/// prefill endpoint on the request span and on its leg's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_request_traces_both_legs() {
    let decider = kvpick_router::DisaggConfig { threshold_tokens: 16, compare_ttft: false };
    let traced = Traced::with(1.0, Options { disagg: Some((1, decider)), ..Options::default() }).await;
    let mut client = traced.h.client().await;
    let mut call = Call::open(&mut client).await;
    whole_request(&mut call, &[], &chat(&words("split", 40))).await;
    traced.h.wait_all_freed().await;
    let spans = traced.spans(|s| s.iter().any(|s| s.span.name == "kvpick.request")).await;
    let request = request_spans(&spans)[0];
    let prefill = prefill_endpoint(0).to_string();
    assert_eq!(request.attribute("kvpick.prefill_endpoint"), Some(prefill.clone()));
    let legs = children(&spans, request);
    let (decode_leg, prefill_leg) =
        (legs.get("select").expect("the decode leg"), legs.get("select prefill").expect("the prefill leg"));
    assert_within(decode_leg, request);
    assert_within(prefill_leg, request);
    assert_eq!(prefill_leg.attribute("kvpick.prefill_endpoint"), Some(prefill));
    assert_eq!(prefill_leg.attribute("kvpick.pd_route").as_deref(), Some("disaggregated"));
    drop((call, client));
    traced.stop().await;
}
