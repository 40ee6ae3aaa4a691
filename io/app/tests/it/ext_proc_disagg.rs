//! Disaggregated prefill/decode through the gateway stand-in: the decode
//! worker in `x-gateway-destination-endpoint`, the prefill worker in
//! `x-prefiller-host-port`, both booked for a split request and each
//! released at its moment; the decider, the fallbacks to aggregated
//! routing with their reasons, and the compensation of a failed plan.

use crate::ext_proc_support::*;
use kvpick_core::{CostModel, EngineRates, RouterConfig};
use kvpick_ext_proc::body::RequestBody;
use kvpick_ext_proc::headers::PREFILLER;
use kvpick_ext_proc::metrics::{PdRoute, ROUTE_CLASSES};
use kvpick_ext_proc::{BodyInput, PickInput, RequestTrace};
use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use kvpick_router::DisaggConfig;
use tonic::transport::Channel;

/// Splits when 16 tokens (4 blocks) or more are uncached on the decode pick.
const THRESHOLD: u32 = 16;

fn disaggregated(prefill_workers: usize) -> Options {
    // The legs' predictions are compared in their own test.
    let decider = DisaggConfig { threshold_tokens: THRESHOLD, compare_ttft: false };
    Options { disagg: Some((prefill_workers, decider)), ..Options::default() }
}

fn routes(h: &Harness, route: PdRoute) -> u64 {
    h.metrics.snapshot().pd_routes[route as usize]
}

/// The prefiller a pick's answer names, if any.
fn prefiller(answer: &kvpick_proto::ext_proc::ProcessingResponse) -> Option<String> {
    set_header(answer, PREFILLER).map(|(value, _)| value)
}

/// Sends `body` with `extra` request headers; the pick's answer.
async fn send(call: &mut Call, body: &str, extra: &[(&str, &str)]) -> kvpick_proto::ext_proc::ProcessingResponse {
    call.send(request_headers("POST", "/v1/chat/completions", extra, false, full_duplex()));
    call.send(request_body(body.as_bytes(), true));
    let answer = call.recv().await;
    let (echo, end) = streamed(&call.recv().await).expect("body echoed");
    assert_eq!((echo.as_slice(), end), (body.as_bytes(), true));
    answer
}

/// Sends a chat request and does not wait for an answer (it waits in a
/// queue, or is refused).
fn send_unanswered(call: &mut Call, body: &str) {
    call.send(request_headers("POST", "/v1/chat/completions", &[], false, full_duplex()));
    call.send(request_body(body.as_bytes(), true));
}

/// A call whose long prompt `name` was split onto the first prefill worker.
async fn split_call(client: &mut ExternalProcessorClient<Channel>, name: &str) -> Call {
    let mut call = Call::open(client).await;
    let answer = send(&mut call, &chat(&words(name, 40)), &[]).await;
    assert_eq!(prefiller(&answer), Some(prefill_endpoint(0).to_string()), "{name} split");
    call
}

/// Sends a 40-word prompt named `name` and expects the 503 for a request
/// picked onto decode-only worker 0 with no prefill worker; the call.
async fn refused_for_no_prefill(client: &mut ExternalProcessorClient<Channel>, name: &str) -> Call {
    let mut call = Call::open(client).await;
    send_unanswered(&mut call, &chat(&words(name, 40)));
    let (status, error, _) = immediate(&call.recv().await).expect("refused");
    assert_eq!(status, 503);
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no prefill worker") && message.contains(&endpoint(0).to_string()), "{error}");
    call
}

/// Waits, saying `what`, until no prefill leg is booked.
async fn prefill_released(h: &Harness, what: &str) {
    wait_for(what, || async { h.prefill_requests_booked().await == 0 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_uncached_prompt_is_split_and_each_leg_released_at_its_moment() {
    let h = Harness::start(disaggregated(2)).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    // A client's own prefiller is never trusted: the pick's replaces it.
    let answer = send(&mut call, &chat(&words("long", 40)), &[(PREFILLER, "6.6.6.6:81")]).await;
    let decode = destination(&answer).expect("a decode pick");
    let prefill = prefiller(&answer).expect("a prefill pick");
    assert!((0..3).any(|i| endpoint(i).to_string() == decode), "{decode} is a decode worker");
    assert!((0..2).any(|i| prefill_endpoint(i).to_string() == prefill), "{prefill} is a prefill worker");
    assert!(!removed_headers(&answer).iter().any(|r| r == PREFILLER), "overwritten, not removed after the set");
    assert_eq!(routes(&h, PdRoute::Disaggregated), 1);

    // Both legs booked until the hand-off; the decode leg books no prefill.
    assert_eq!((h.requests_booked().await, h.prefill_requests_booked().await), (1, 1));
    // Posted at the commit: wait for the shard to apply it.
    wait_for("the decode worker prefills nothing", || async {
        h.loads().await.iter().map(|l| l.prefill_tokens).sum::<u64>() == 0
    })
    .await;
    call.send(response_headers("200", "text/event-stream", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(response_body(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", false));
    call.recv().await;
    prefill_released(&h, "the prefill leg released at the first chunk").await;
    assert_eq!(h.requests_booked().await, 1, "the decode leg lives on");
    call.send(response_body(b"data: [DONE]\n\n", true));
    call.recv().await;
    h.wait_all_freed().await;
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decode_sidecars_hand_off_header_releases_the_prefill_leg_before_any_chunk() {
    let h = Harness::start(disaggregated(2)).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let answer = send(&mut call, &chat(&words("handoff", 40)), &[]).await;
    assert!(prefiller(&answer).is_some(), "split");
    assert_eq!((h.requests_booked().await, h.prefill_requests_booked().await), (1, 1));
    // `kvpick sidecar` answers with its hand-off header once the prefill
    // leg is over; no body chunk has come yet.
    call.send(sidecar_headers(&[("x-kvpick-pd", "disaggregated"), ("x-kvpick-prefill-ms", "12.5")]));
    assert_eq!(kind(&call.recv().await), "response_headers");
    prefill_released(&h, "the prefill leg released at the hand-off").await;
    assert_eq!(h.requests_booked().await, 1, "the decode leg lives on");
    assert_eq!(h.loads().await.iter().map(|l| l.prefill_tokens).sum::<u64>(), 0, "the decode worker prefills nothing");
    call.send(response_body(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", false));
    call.recv().await;
    call.send(response_body(b"data: [DONE]\n\n", true));
    call.recv().await;
    h.wait_all_freed().await;
    let m = h.metrics.snapshot();
    assert_eq!((m.pd_handoffs, m.prefill_restores), ([1, 0, 0], [0, 0]));
    drop((call, client));
    h.stop().await;
}

/// A streamed answer's response headers with the decode sidecar's `extra`.
fn sidecar_headers(extra: &[(&str, &str)]) -> kvpick_proto::ext_proc::ProcessingRequest {
    sidecar_headers_served(extra, None)
}

/// The same, with the gateway's served-endpoint metadata.
fn sidecar_headers_served(extra: &[(&str, &str)], served: Option<&str>) -> kvpick_proto::ext_proc::ProcessingRequest {
    let mut headers = response_headers("200", "text/event-stream", served, false);
    if let Some(kvpick_proto::ext_proc::processing_request::Request::ResponseHeaders(h)) = headers.request.as_mut() {
        if let Some(map) = h.headers.as_mut() {
            map.headers.extend(kvpick_test_support::gateway::header_map(extra).headers);
        }
    }
    headers
}

/// The sidecar's prefill leg failed (or it refused the prefiller) and it
/// ran the split request whole: the prefill leg is released and the
/// decode worker's booking counts the prompt as prefill again, until the
/// first chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_the_sidecar_ran_whole_is_prefill_load_on_the_decode_worker_again() {
    let h = Harness::start(disaggregated(2)).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let answer = send(&mut call, &chat(&words("fallback", 40)), &[]).await;
    assert!(prefiller(&answer).is_some(), "split");
    // The decode side's only booking is this request's.
    let decode_prefill = || async { h.loads().await.iter().map(|l| l.prefill_tokens).sum::<u64>() };
    wait_for("the decode worker prefills nothing at the commit", || async { decode_prefill().await == 0 }).await;
    call.send(sidecar_headers(&[("x-kvpick-pd", "aggregated"), ("x-kvpick-pd-reason", "prefill_unreachable")]));
    assert_eq!(kind(&call.recv().await), "response_headers");
    prefill_released(&h, "the prefill leg released").await;
    wait_for("the decode worker prefills the prompt", || async { decode_prefill().await > 0 }).await;
    assert_eq!(h.requests_booked().await, 1, "the decode leg lives on");
    call.send(response_body(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", false));
    call.recv().await;
    wait_for("its prefill ends at the first chunk", || async { decode_prefill().await == 0 }).await;
    assert_eq!(h.requests_booked().await, 1);
    call.send(response_body(b"data: [DONE]\n\n", true));
    call.recv().await;
    h.wait_all_freed().await;
    let m = h.metrics.snapshot();
    assert_eq!((m.pd_handoffs, m.prefill_restores), ([0, 1, 0], [1, 0]));
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decider_keeps_short_or_cached_prompts_whole_on_the_decode_worker() {
    let h = Harness::start(disaggregated(1)).await;
    let mut client = h.client().await;
    // Shorter than the threshold: no prefill leg is even tried.
    let mut call = Call::open(&mut client).await;
    let answer = send(&mut call, &chat(&words("short", 8)), &[]).await;
    assert!(destination(&answer).is_some());
    assert_eq!(prefiller(&answer), None);
    assert_eq!(h.prefill_requests_booked().await, 0);
    assert_eq!(h.loads().await.iter().map(|l| l.prefill_tokens).sum::<u64>(), 8, "the decode worker prefills it");
    finish_response(&mut call).await;
    drop(call);

    // Long, but the decode worker holds all but a block of it.
    let prefix = words("held", 40);
    h.cache_on(1, &chat(&prefix)).await;
    let mut call = Call::open(&mut client).await;
    let answer = send(&mut call, &chat(&format!("{prefix} one two three")), &[]).await;
    assert_eq!(destination(&answer), Some(endpoint(1).to_string()), "the worker holding the prefix");
    assert_eq!(prefiller(&answer), None, "too little left to prefill to split it");
    finish_response(&mut call).await;
    h.wait_all_freed().await;
    prefill_released(&h, "the compensated prefill leg freed").await;
    assert_eq!(routes(&h, PdRoute::ShortUncached), 2);
    assert_eq!(routes(&h, PdRoute::Disaggregated), 0);
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_prefill_worker_requests_are_served_whole_and_counted() {
    let h = Harness::start(disaggregated(0)).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let answer = send(&mut call, &chat(&words("long", 40)), &[]).await;
    assert!(destination(&answer).is_some());
    assert_eq!(prefiller(&answer), None);
    finish_response(&mut call).await;
    drop(call);
    assert_eq!(routes(&h, PdRoute::NoPrefillWorker), 1);
    // A prefill worker joins: the next long prompt is split.
    h.add_prefill_worker(0).await;
    let mut call = Call::open(&mut client).await;
    let answer = send(&mut call, &chat(&words("later", 40)), &[]).await;
    assert_eq!(prefiller(&answer), Some(prefill_endpoint(0).to_string()));
    finish_response(&mut call).await;
    h.wait_all_freed().await;
    prefill_released(&h, "the prefill leg released").await;
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_prefill_side_sends_requests_whole_and_queues_no_leg() {
    // The prefill worker is saturated as soon as any prefill is booked.
    let options =
        Options { max_num_batched_tokens: Some(1_000), prefill_queue_threshold: Some(0.0), ..disaggregated(1) };
    let h = Harness::start(options).await;
    let mut client = h.client().await;
    let mut first = split_call(&mut client, "first").await;
    // The first request's prefill is still booked: the second is not split.
    let mut second = Call::open(&mut client).await;
    let answer = send(&mut second, &chat(&words("second", 40)), &[]).await;
    assert_eq!(prefiller(&answer), None);
    assert_eq!(routes(&h, PdRoute::PrefillSaturated), 1);
    let prefill = h.prefill.as_ref().expect("disaggregated");
    let stats = prefill.service().stats();
    assert_eq!((stats.selections, stats.queued), (1, 0), "the second leg neither booked nor queued");
    assert_eq!(h.prefill_requests_booked().await, 1, "only the first request's leg");
    finish_response(&mut first).await;
    finish_response(&mut second).await;
    h.wait_all_freed().await;
    prefill_released(&h, "every prefill leg released").await;
    drop((first, second, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_decode_leg_leaves_no_prefill_leg_and_a_cancel_frees_both() {
    // The gateway's subset names no decode worker: the decode leg fails
    // (the subset does not bind the prefill leg). Whether the prefill leg
    // had booked by then (freed) or not (cancelled), none is left.
    let h = Harness::start(disaggregated(1)).await;
    let mut client = h.client().await;
    for i in 0..10 {
        let mut call = Call::open(&mut client).await;
        call.send(with_subset(chat_headers(), list(&["127.0.0.99:8000"])));
        call.send(request_body(chat(&words(&format!("long{i}"), 40)).as_bytes(), true));
        let (status, body, _) = immediate(&call.recv().await).expect("refused");
        assert_eq!(status, 503, "{body}");
    }
    let prefill = h.prefill.as_ref().expect("disaggregated");
    wait_for("no prefill leg left booked", || async { prefill.service().active_reservations() == 0 }).await;
    assert_eq!(h.prefill_requests_booked().await, 0);
    assert_eq!(routes(&h, PdRoute::Disaggregated), 0, "no plan committed");

    // A split request cancelled before its first token frees both legs.
    let mut call = Call::open(&mut client).await;
    let answer = send(&mut call, &chat(&words("gone", 40)), &[]).await;
    assert!(prefiller(&answer).is_some());
    drop(call);
    h.wait_all_freed().await;
    prefill_released(&h, "the prefill leg freed with the stream").await;
    assert_eq!(ROUTE_CLASSES[PdRoute::Disaggregated as usize], ("disaggregated", ""));
    drop(client);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_prefill_worker_loses_to_a_decode_worker_predicted_sooner() {
    let decider = DisaggConfig { threshold_tokens: THRESHOLD, compare_ttft: true };
    // Predictions come from the latency cost (kvpick serve's default).
    let router = RouterConfig { cost: CostModel::Latency(EngineRates::default()), ..RouterConfig::default() };
    let h = Harness::start(Options { disagg: Some((1, decider)), router, ..Options::default() }).await;
    let mut client = h.client().await;
    // Both sides idle: the same prediction, and a tie splits.
    let mut first = Call::open(&mut client).await;
    let answer = send(&mut first, &chat(&words("first", 200)), &[]).await;
    assert_eq!(prefiller(&answer), Some(prefill_endpoint(0).to_string()));
    // The prefill worker still has the first prompt booked; an idle decode
    // worker computing the second itself is predicted to answer sooner.
    let mut second = Call::open(&mut client).await;
    let answer = send(&mut second, &chat(&words("second", 40)), &[]).await;
    assert_eq!(prefiller(&answer), None);
    assert_eq!(routes(&h, PdRoute::DecodeSooner), 1);
    finish_response(&mut first).await;
    finish_response(&mut second).await;
    h.wait_all_freed().await;
    prefill_released(&h, "the prefill leg released").await;
    drop((first, second, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_leg_that_waited_in_the_queue_gets_a_fresh_prefill_leg() {
    // One decode worker, saturated as soon as any prefill is booked on it.
    let options = Options {
        disagg: Some((1, DisaggConfig { threshold_tokens: THRESHOLD, compare_ttft: false })),
        ..Options::queue_at_any_prefill()
    };
    let h = Harness::start(options).await;
    let mut client = h.client().await;
    let mut first = Call::open(&mut client).await;
    let answer = send(&mut first, &chat(&words("short", 8)), &[]).await;
    assert_eq!(prefiller(&answer), None, "short: whole, its prefill booked on the decode worker");
    // The second request's decode leg queues behind it; its prefill leg books at once.
    let mut second = Call::open(&mut client).await;
    second.send(chat_headers());
    second.send(request_body(chat(&words("long", 40)).as_bytes(), true));
    let prefill = h.prefill.as_ref().expect("disaggregated");
    wait_for("the second's decode leg queued", || async { h.service.queue_len() == 1 }).await;
    wait_for("its first prefill leg booked", || async { prefill.service().stats().selections == 1 }).await;
    // The first request answers: the queue admits the second, whose prefill leg is booked anew.
    finish_response(&mut first).await;
    let answer = second.recv().await;
    assert_eq!(prefiller(&answer), Some(prefill_endpoint(0).to_string()));
    assert!(streamed(&second.recv().await).is_some(), "body echoed");
    assert_eq!(prefill.service().stats().selections, 2, "the stale leg dropped, a fresh one booked");
    assert_eq!(h.prefill_requests_booked().await, 1);
    finish_response(&mut second).await;
    h.wait_all_freed().await;
    prefill_released(&h, "the prefill leg released").await;
    drop((first, second, client));
    h.stop().await;
}

/// A decode worker that cannot run a request whole (SGLang's decode mode):
/// every prompt picked onto it is split, short ones too; with every
/// prefill worker saturated the request waits for one instead of going
/// whole; with none, it is refused with 503 and nothing stays booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_only_worker_gets_every_prompt_split_or_a_clear_refusal() {
    // One decode worker, decode only; the prefill worker is saturated as
    // soon as any prefill is booked on it.
    let options = Options {
        workers: 1,
        max_num_batched_tokens: Some(1_000),
        prefill_queue_threshold: Some(0.0),
        ..disaggregated(1)
    };
    let h = Harness::start(options).await;
    h.decode_only.set(kvpick_core::WorkerId(1), Some(endpoint(0)));
    let mut client = h.client().await;

    // Shorter than the threshold: split all the same.
    let mut first = Call::open(&mut client).await;
    let answer = send(&mut first, &chat(&words("short", 2)), &[]).await;
    assert_eq!(prefiller(&answer), Some(prefill_endpoint(0).to_string()), "a short prompt is split");
    assert_eq!((routes(&h, PdRoute::Disaggregated), routes(&h, PdRoute::ShortUncached)), (1, 0));

    // The prefill worker is saturated: the next request waits for it.
    let mut second = Call::open(&mut client).await;
    let body = chat(&words("second", 40));
    send_unanswered(&mut second, &body);
    wait_for("the second prefill leg queued", || async {
        h.prefill.as_ref().expect("disaggregated").service().stats().queued == 1
    })
    .await;
    assert_eq!(routes(&h, PdRoute::PrefillSaturated), 0, "not sent whole");
    wait_for("no prefill load on the decode worker while it waits", || async {
        h.loads().await.iter().map(|l| l.prefill_tokens).sum::<u64>() == 0
    })
    .await;
    finish_response(&mut first).await;
    let answer = second.recv().await;
    assert_eq!(prefiller(&answer), Some(prefill_endpoint(0).to_string()), "split once the prefill worker freed");
    let (echo, end) = streamed(&second.recv().await).expect("body echoed");
    assert_eq!((echo.as_slice(), end), (body.as_bytes(), true));
    finish_response(&mut second).await;
    h.wait_all_freed().await;
    prefill_released(&h, "every prefill leg released").await;

    // No prefill worker left: refused, counted, nothing booked.
    let prefill = h.prefill.as_ref().expect("disaggregated");
    prefill.service().delete_worker(prefill, prefill_worker(0)).await.expect("prefill worker removed");
    let third = refused_for_no_prefill(&mut client, "third").await;
    assert_eq!(routes(&h, PdRoute::NoPrefillWorker), 1);
    h.wait_all_freed().await;
    // A headers-only request (no prompt) is passed through, not refused.
    let mut listing = Call::open(&mut client).await;
    listing.send(request_headers("GET", "/v1/models", &[], true, full_duplex()));
    assert!(destination(&listing.recv().await).is_some(), "a request without a prompt is routed");
    drop((first, second, third, listing, client));
    h.wait_all_freed().await;
    h.stop().await;
}

/// With no prefill worker, no request can be split: each runs whole on a
/// worker that can run it whole, even where a decode-only worker holds its
/// prompt (SGLang's decode mode would refuse it). With only
/// decode-only workers left, the refusal is the precise 503 as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_prefill_worker_requests_run_whole_on_workers_that_can() {
    let h = Harness::start(Options { workers: 2, ..disaggregated(1) }).await;
    h.decode_only.set(kvpick_core::WorkerId(1), Some(endpoint(0)));
    let prefill = h.prefill.as_ref().expect("disaggregated");
    prefill.service().delete_worker(prefill, prefill_worker(0)).await.expect("prefill worker removed");
    // The decode-only worker holds all but a block of every prompt, and
    // stays idle: by cost, the pick every time.
    let prefix = words("held", 40);
    h.cache_on(0, &chat(&prefix)).await;
    let mut client = h.client().await;
    let mut open = Vec::new();
    for i in 0..4 {
        let body = chat(&format!("{prefix} one two three{i}"));
        let mut call = Call::open(&mut client).await;
        let answer = send(&mut call, &body, &[]).await;
        assert_eq!(destination(&answer), Some(endpoint(1).to_string()), "request {i}");
        assert_eq!(prefiller(&answer), None, "request {i} runs whole");
        open.push(call);
    }
    assert_eq!(routes(&h, PdRoute::NoPrefillWorker), 4);
    // The debug view explains the same pick.
    let body = chat(&format!("{prefix} one two explained"));
    let parsed = RequestBody::parse(body.as_bytes(), None).expect("a chat body");
    let input = PickInput {
        body: Some(BodyInput { bytes: body.into(), parsed }),
        allowed: None,
        session: None,
        trace: RequestTrace::off(),
    };
    let explained = h.kv.as_ref().expect("kvpick's picker").explain(input).await.expect("explained");
    assert_eq!(explained.selection.endpoint, endpoint(1));
    for call in &mut open {
        finish_response(call).await;
    }
    h.wait_all_freed().await;

    // Only the decode-only worker left: refused as before, nothing booked.
    h.service.delete_worker(&h.producers, kvpick_core::WorkerId(2)).await.expect("whole worker removed");
    let last = refused_for_no_prefill(&mut client, "last").await;
    h.wait_all_freed().await;
    drop((open, last, client));
    h.stop().await;
}

/// A decode-only worker's request that the prefill side's queue refuses
/// (it timed out there) gets the queue's 429, as a whole request refused
/// by the decode side's queue would, and leaves nothing booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_only_request_the_prefill_queue_refuses_gets_429() {
    let router = RouterConfig { queue_timeout: std::time::Duration::from_millis(200), ..RouterConfig::default() };
    let options = Options {
        workers: 1,
        router,
        max_num_batched_tokens: Some(1_000),
        prefill_queue_threshold: Some(0.0),
        ..disaggregated(1)
    };
    let h = Harness::start(options).await;
    h.decode_only.set(kvpick_core::WorkerId(1), Some(endpoint(0)));
    let mut client = h.client().await;
    let mut first = split_call(&mut client, "first").await;
    // The first request holds the only prefill worker past the timeout.
    let mut second = Call::open(&mut client).await;
    send_unanswered(&mut second, &chat(&words("second", 40)));
    let prefill = h.prefill.as_ref().expect("disaggregated");
    wait_for("the second prefill leg queued", || async { prefill.service().stats().queued == 1 }).await;
    // Past its timeout, the prefill side's tick (the app runs one every
    // few milliseconds) refuses it.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    prefill.service().tick(prefill, h.clock.now()).await;
    let (status, _, headers) = immediate(&second.recv().await).expect("refused");
    assert_eq!(status, 429);
    assert!(headers.iter().any(|(k, _)| k == "retry-after"), "{headers:?}");
    assert_eq!(routes(&h, PdRoute::PrefillSaturated), 1);
    finish_response(&mut first).await;
    h.wait_all_freed().await;
    prefill_released(&h, "every prefill leg released").await;
    drop((first, second, client));
    h.stop().await;
}

/// The gateway served another decode pod than the pick (a fallback), and
/// that pod's sidecar ran the split request whole: one set of response
/// headers both moves the booking and restores its prefill. The two are
/// taken one after the other, so the booking is neither lost nor doubled,
/// whichever runs first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_and_a_restored_prefill_from_one_answer_keep_the_booking() {
    let h = Harness::start(disaggregated(1)).await;
    let mut client = h.client().await;
    for round in 0..20 {
        let mut call = Call::open(&mut client).await;
        let answer = send(&mut call, &chat(&words(&format!("moved{round}"), 40)), &[]).await;
        assert!(prefiller(&answer).is_some(), "split");
        let picked = destination(&answer).expect("a decode pick");
        let other = (0..3).map(endpoint).find(|e| e.to_string() != picked).expect("another decode worker");
        let headers = sidecar_headers_served(
            &[("x-kvpick-pd", "aggregated"), ("x-kvpick-pd-reason", "prefill_connect")],
            Some(&other.to_string()),
        );
        call.send(headers);
        assert_eq!(kind(&call.recv().await), "response_headers");
        wait_for("moved and in prefill again", || async {
            let m = h.metrics.snapshot();
            m.bookings_moved + m.bookings_not_moved == round + 1
                && m.prefill_restores[0] + m.prefill_restores[1] == round + 1
        })
        .await;
        let m = h.metrics.snapshot();
        assert_eq!((m.bookings_moved, m.prefill_restores), (round + 1, [round + 1, 0]), "round {round}");
        assert_eq!(h.requests_booked().await, 1, "round {round}: the booking lives on");
        assert!(h.loads().await.iter().map(|l| l.prefill_tokens).sum::<u64>() > 0, "round {round}: in prefill");
        call.send(response_body(b"data: [DONE]\n\n", true));
        call.recv().await;
        h.wait_all_freed().await;
        drop(call);
    }
    drop(client);
    h.stop().await;
}
