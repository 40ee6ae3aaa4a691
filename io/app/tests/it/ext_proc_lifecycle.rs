//! The response path and the booking's lifetime: every response message
//! answered in order, prefill completed by the first body chunk, the
//! booking freed exactly once however the stream ends, usage and the
//! served endpoint read for metrics.

use std::time::Duration;

use crate::ext_proc_support::h2_client::RawConnection;
use crate::ext_proc_support::*;
use kvpick_core::{CostModel, EngineRates, RouterConfig};
use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use kvpick_proto::ext_proc::processing_response::Response;
use tonic::transport::Channel;

async fn prefill_tokens(h: &Harness) -> u64 {
    h.loads().await.iter().map(|l| l.prefill_tokens).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_body_chunk_completes_prefill_and_the_end_frees() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat(&words("life", 40))).await;
    assert!(prefill_tokens(&h).await > 0);
    assert_eq!(h.requests_booked().await, 1);

    call.send(response_headers("200", "text/event-stream", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    // An empty chunk is no token yet.
    call.send(response_body(b"", false));
    assert!(call.quiet(100).await, "an empty chunk that ends nothing has nothing to echo");
    assert!(prefill_tokens(&h).await > 0);

    let chunks: [&[u8]; 3] = [b"data: {\"choices\":[]}\n\n", b"data: {\"cho", b"ices\":[]}\n\n"];
    for chunk in chunks {
        call.send(response_body(chunk, false));
    }
    for chunk in chunks {
        assert_eq!(streamed(&call.recv().await), Some((chunk.to_vec(), false)), "echoed in order");
    }
    wait_for("prefill completed", || async { prefill_tokens(&h).await == 0 }).await;
    assert_eq!(h.requests_booked().await, 1, "still decoding");

    call.send(response_body(b"data: [DONE]\n\n", true));
    assert_eq!(streamed(&call.recv().await), Some((b"data: [DONE]\n\n".to_vec(), true)));
    h.wait_all_freed().await;
    // The gateway closing the stream afterwards frees nothing twice.
    call.close_send();
    assert!(matches!(call.next().await, Ok(None)));
    drop((call, client));
    wait_for("counted", || async { h.metrics.snapshot().frees == 1 }).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let m = h.metrics.snapshot();
    assert_eq!((m.prefill_completes, m.frees, m.frees_not_found), (1, 1, 0));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_trailers_and_bodiless_responses_free() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;

    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("trailers")).await;
    call.send(response_headers("200", "application/grpc", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(response_body(b"x", false));
    assert!(streamed(&call.recv().await).is_some());
    call.send(response_trailers());
    assert_eq!(kind(&call.recv().await), "response_trailers");
    h.wait_all_freed().await;
    drop(call);

    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("no content")).await;
    call.send(response_headers("204", "application/json", None, true));
    assert_eq!(kind(&call.recv().await), "response_headers");
    h.wait_all_freed().await;
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_cancel_frees() {
    let h = Harness::start(Options::default()).await;
    // tonic client: the gateway drops the whole stream mid-response.
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("cancel me")).await;
    call.send(response_headers("200", "text/event-stream", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    assert_eq!(h.requests_booked().await, 1);
    drop(call);
    h.wait_all_freed().await;

    // RST_STREAM before the body has even ended: nothing was booked, the
    // stream's state goes away with it.
    let raw = RawConnection::connect(h.addr).await;
    let mut call = raw.open().await;
    call.send(&chat_headers());
    call.send(&request_body(b"{\"model\":", false));
    tokio::time::sleep(Duration::from_millis(20)).await;
    call.cancel();
    // RST_STREAM mid-response.
    let mut call = raw.open().await;
    call.send(&chat_headers());
    call.send(&request_body(chat("raw cancel").as_bytes(), true));
    assert!(destination(&call.recv().await).is_some());
    assert!(streamed(&call.recv().await).is_some());
    assert_eq!(h.requests_booked().await, 1);
    call.cancel();
    h.wait_all_freed().await;
    wait_for("every stream closed", || async { h.metrics.snapshot().streams_open == 0 }).await;
    assert!(raw.is_alive());
    raw.close();
    wait_for("counted", || async { h.metrics.snapshot().frees == 2 }).await;
    drop(client);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_error_frees() {
    let h = Harness::start(Options::default()).await;
    let raw = RawConnection::connect(h.addr).await;
    let mut call = raw.open().await;
    call.send(&chat_headers());
    call.send(&request_body(chat("then garbage").as_bytes(), true));
    assert!(destination(&call.recv().await).is_some());
    assert!(streamed(&call.recv().await).is_some());
    assert_eq!(h.requests_booked().await, 1);
    // A message that is not a ProcessingRequest.
    call.send_raw(&[0xff, 0xff, 0xff, 0xff]);
    h.wait_all_freed().await;
    assert_eq!(h.metrics.snapshot().stream_errors, 1);
    assert!(call.status().await.is_some(), "the stream ends with a status, not a reset");
    assert!(raw.is_alive());
    raw.close();
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_while_queued_withdraws_the_request() {
    let h = Harness::start(Options::queue_at_any_prefill()).await;
    let mut client = h.client().await;
    let mut first = Call::open(&mut client).await;
    pick(&mut first, &chat(&words("first", 20))).await;

    let mut second = Call::open(&mut client).await;
    second.send(chat_headers());
    second.send(request_body(chat(&words("second", 20)).as_bytes(), true));
    wait_for("the second request queues", || async { h.service.queue_len() == 1 }).await;
    assert!(second.quiet(50).await);
    drop(second);
    wait_for("the queued request is withdrawn", || async { h.service.queue_len() == 0 }).await;
    drop(first);
    h.wait_all_freed().await;
    drop(client);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_usage_split_across_chunks_and_json_usage_are_counted() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("usage please")).await;
    call.send(response_headers("200", "text/event-stream", None, false));
    call.recv().await;
    let sse = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10,",
        "\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
        "data: [DONE]\n\n"
    );
    let cuts = [30, 95, 120, sse.len()];
    let mut start = 0;
    for (i, &cut) in cuts.iter().enumerate() {
        call.send(response_body(&sse.as_bytes()[start..cut], i + 1 == cuts.len()));
        call.recv().await;
        start = cut;
    }
    h.wait_all_freed().await;
    let m = h.metrics.snapshot();
    assert_eq!((m.usage_responses, m.prompt_tokens, m.completion_tokens, m.cached_tokens), (1, 7, 3, 4));
    drop(call);

    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("json usage")).await;
    call.send(response_headers("200", "application/json", None, false));
    call.recv().await;
    let json = br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
    call.send(response_body(&json[..10], false));
    call.send(response_body(&json[10..], true));
    call.recv().await;
    call.recv().await;
    h.wait_all_freed().await;
    let m = h.metrics.snapshot();
    assert_eq!((m.usage_responses, m.prompt_tokens, m.completion_tokens), (2, 12, 5));
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_endpoint_mismatch_is_counted() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let picked = pick(&mut call, &chat("served")).await;
    call.send(response_headers("200", "application/json", Some(&picked), true));
    call.recv().await;
    drop(call);
    let mut call = Call::open(&mut client).await;
    let picked = pick(&mut call, &chat("served elsewhere")).await;
    let other = (0..3).map(endpoint).find(|e| e.to_string() != picked).expect("another endpoint");
    call.send(response_headers("200", "application/json", Some(&format!("{picked},{other}")), true));
    call.recv().await;
    drop(call);
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("no metadata")).await;
    call.send(response_headers("200", "application/json", None, true));
    call.recv().await;
    let m = h.metrics.snapshot();
    assert_eq!((m.served_mismatches, m.served_missing), (1, 1));
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_booking_moves_to_the_endpoint_that_served() {
    let h = Harness::start(Options::default()).await;
    let booked_at = |loads: Vec<kvpick_core::LoadSnapshot>| {
        loads.iter().filter(|l| l.requests > 0).map(|l| (l.worker.0 - 1) as usize).collect::<Vec<_>>()
    };
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let picked = pick(&mut call, &chat(&words("moved", 30))).await;
    let picked_index = (0..3).find(|i| endpoint(*i).to_string() == picked).expect("a harness endpoint");
    assert_eq!(booked_at(h.loads().await), vec![picked_index]);
    let other = (picked_index + 1) % 3;
    // The gateway tried the pick, then served from `other` (a fallback).
    call.send(response_headers("200", "text/event-stream", Some(&format!("{picked},{}", endpoint(other))), false));
    call.recv().await;
    wait_for("the booking moved", || async { booked_at(h.loads().await) == vec![other] }).await;
    let moved = h.loads().await.into_iter().find(|l| l.worker.0 == other as u64 + 1).expect("the served worker");
    assert!(moved.prefill_tokens > 0, "still in prefill");
    // The first chunk completes prefill where the booking is now; the end frees it there.
    call.send(response_body(b"data: {\"choices\":[]}\n\n", false));
    call.recv().await;
    wait_for("prefill completed", || async { h.loads().await.iter().all(|l| l.prefill_tokens == 0) }).await;
    call.send(response_body(b"data: [DONE]\n\n", true));
    call.recv().await;
    h.wait_all_freed().await;
    let m = h.metrics.snapshot();
    assert_eq!((m.bookings_moved, m.bookings_not_moved, m.frees, m.frees_not_found), (1, 0, 1, 0));
    assert_eq!(ttft_samples(&h), 0, "another worker's times teach nothing");
    drop(call);

    // An endpoint outside the pool: counted, and the booking stays.
    let mut call = Call::open(&mut client).await;
    let picked = pick(&mut call, &chat("unknown server")).await;
    call.send(response_headers("200", "application/json", Some("10.9.9.9:8000"), false));
    call.recv().await;
    wait_for("counted", || async { h.metrics.snapshot().bookings_not_moved == 1 }).await;
    let picked_index = (0..3).find(|i| endpoint(*i).to_string() == picked).expect("a harness endpoint");
    assert_eq!(booked_at(h.loads().await), vec![picked_index]);
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}

/// Found by the `ext_proc_stream` fuzz target: a second set of response
/// headers told the booking where it was served a second time. Now it is
/// answered (the gateway may wait for that answer) and counted, and the
/// booking stays where the first set moved it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_sent_twice_are_answered_counted_and_not_acted_on() {
    let h = Harness::start(Options::default()).await;
    let booked_at = |loads: Vec<kvpick_core::LoadSnapshot>| {
        loads.iter().filter(|l| l.requests > 0).map(|l| (l.worker.0 - 1) as usize).collect::<Vec<_>>()
    };
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let picked = pick(&mut call, &chat("headers twice")).await;
    let picked_index = (0..3).find(|i| endpoint(*i).to_string() == picked).expect("a harness endpoint");
    let (first, second) = ((picked_index + 1) % 3, (picked_index + 2) % 3);
    call.send(response_headers("200", "text/event-stream", Some(&endpoint(first).to_string()), false));
    assert!(matches!(call.recv().await.response, Some(Response::ResponseHeaders(_))));
    wait_for("the booking moved", || async { booked_at(h.loads().await) == vec![first] }).await;
    call.send(response_headers("200", "text/event-stream", Some(&endpoint(second).to_string()), false));
    assert!(matches!(call.recv().await.response, Some(Response::ResponseHeaders(_))), "the second set is answered");
    assert_eq!(h.metrics.snapshot().out_of_order, 1);
    assert_eq!(booked_at(h.loads().await), vec![first], "the second set moves nothing");
    call.send(response_body(b"data: [DONE]\n\n", true));
    call.recv().await;
    h.wait_all_freed().await;
    let m = h.metrics.snapshot();
    assert_eq!((m.bookings_moved, m.frees, m.frees_not_found), (1, 1, 0));
    drop((call, client));
    h.stop().await;
}

/// TTFT samples calibration has taken, over every worker.
fn ttft_samples(h: &Harness) -> u64 {
    h.service.calibration().0.iter().map(|c| c.samples).sum()
}

/// Every worker's decode rate, as calibration has it.
fn decode_rates(h: &Harness) -> Vec<Option<f64>> {
    h.service.calibration().0.iter().map(|c| c.decode_ns_per_token).collect()
}

fn latency_cost() -> RouterConfig {
    RouterConfig { cost: CostModel::Latency(EngineRates::default()), ..RouterConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_streamed_answers_teach_calibration_and_a_cut_stream_teaches_no_decode() {
    let h = Harness::start(Options { router: latency_cost(), ..Options::default() }).await;
    let mut client = h.client().await;

    // A JSON answer in two chunks: its first chunk comes when the answer is
    // done, so it is no time to first token.
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat(&words("json", 30))).await;
    call.send(response_headers("200", "application/json", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(response_body(b"{\"choices\":", false));
    call.send(response_body(b"[]}", true));
    assert!(streamed(&call.recv().await).is_some() && streamed(&call.recv().await).is_some());
    h.wait_all_freed().await;
    drop(call);
    assert_eq!(ttft_samples(&h), 0);
    assert!(decode_rates(&h).is_empty());

    // An event stream: one TTFT sample at its first token, one decode
    // sample at its end (three token events, so two after the first).
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat(&words("sse", 30))).await;
    call.send(response_headers("200", "text/event-stream", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    for token in ["a", "b", "c"] {
        let event = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{token}\"}}}}]}}\n\n");
        call.send(response_body(event.as_bytes(), false));
        assert!(streamed(&call.recv().await).is_some());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    call.send(response_body(b"data: [DONE]\n\n", true));
    assert!(streamed(&call.recv().await).is_some());
    h.wait_all_freed().await;
    drop(call);
    assert_eq!(ttft_samples(&h), 1);
    let rates = decode_rates(&h);
    let decode: Vec<f64> = rates.iter().flatten().copied().collect();
    assert_eq!(decode.len(), 1, "{rates:?}");
    // Two tokens after the first, at least 5 ms apart each.
    assert!(decode[0] >= 5e6, "{decode:?} ns per token");

    // A stream cut after its first token: the TTFT counts, the decode does
    // not (it never ended), and the booking is freed.
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat(&words("cut", 30))).await;
    call.send(response_headers("200", "text/event-stream", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(response_body(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", false));
    assert!(streamed(&call.recv().await).is_some());
    drop(call);
    h.wait_all_freed().await;
    wait_for("the cut stream's TTFT sample", || async { ttft_samples(&h) == 2 }).await;
    let after: Vec<f64> = decode_rates(&h).into_iter().flatten().collect();
    assert_eq!(after, decode, "a cut stream has no decode to learn from");
    drop(client);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibration_can_be_turned_off() {
    let mut router = latency_cost();
    router.calibration.enabled = false;
    let h = Harness::start(Options { router, ..Options::default() }).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat(&words("off", 30))).await;
    call.send(response_headers("200", "text/event-stream", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(response_body(b"data: {\"choices\":[]}\n\n", false));
    assert!(streamed(&call.recv().await).is_some());
    call.send(response_body(b"data: [DONE]\n\n", true));
    assert!(streamed(&call.recv().await).is_some());
    h.wait_all_freed().await;
    drop((call, client));
    assert!(h.service.calibration().0.is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_the_lease_keeps_its_booking() {
    let router = RouterConfig { lease: Duration::from_secs(1), ..RouterConfig::default() };
    let h = Harness::start(Options { router, ..Options::default() }).await;
    let mut client = h.client().await;

    // Without response chunks, the lease frees the booking: the harness
    // really expires leases.
    let mut silent = Call::open(&mut client).await;
    pick(&mut silent, &chat("silent")).await;
    assert_eq!(h.requests_booked().await, 1);
    h.wait_all_freed().await;

    // A chunk every 150 ms for 2.4 s: more than twice the lease, booked
    // throughout.
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("a long answer")).await;
    call.send(response_headers("200", "text/event-stream", None, false));
    call.recv().await;
    for _ in 0..16 {
        call.send(response_body(b"data: {\"choices\":[]}\n\n", false));
        assert!(streamed(&call.recv().await).is_some());
        assert_eq!(h.requests_booked().await, 1, "the booking outlives its first lease");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    call.send(response_body(b"data: [DONE]\n\n", true));
    call.recv().await;
    h.wait_all_freed().await;
    drop((call, silent, client));
    wait_for("counted", || async { h.metrics.snapshot().frees + h.metrics.snapshot().frees_not_found == 2 }).await;
    let m = h.metrics.snapshot();
    // Renewed about every quarter lease; the long stream's own free found
    // its booking (the silent one's lease had taken it).
    assert!(m.leases_renewed >= 6, "{} renewals", m.leases_renewed);
    assert_eq!((m.frees, m.frees_not_found), (1, 1));
    h.stop().await;
}

/// Picks `body` with the request headers `extra`, ends the response, and
/// returns the destination once the booking is freed.
async fn pick_and_finish(
    h: &Harness,
    client: &mut ExternalProcessorClient<Channel>,
    extra: &[(&str, &str)],
    body: &str,
) -> String {
    let mut call = Call::open(client).await;
    call.send(request_headers("POST", "/v1/chat/completions", extra, false, full_duplex()));
    call.send(request_body(body.as_bytes(), true));
    let picked = destination(&call.recv().await).expect("a pick");
    call.recv().await;
    finish_response(&mut call).await;
    drop(call);
    h.wait_all_freed().await;
    picked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sticks_to_its_worker() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    // Idle workers tie: without a session, picks spread at random.
    let mut spread = std::collections::BTreeSet::new();
    for i in 0..12 {
        spread.insert(pick_and_finish(&h, &mut client, &[], &chat(&words(&format!("free{i}-"), 20))).await);
    }
    assert!(spread.len() > 1, "ties go to several workers");
    // With a session key (header), every turn goes where the first went.
    let header = [("x-session-token", "conversation-1")];
    let first = pick_and_finish(&h, &mut client, &header, &chat(&words("turn0-", 20))).await;
    for i in 1..12 {
        let again = pick_and_finish(&h, &mut client, &header, &chat(&words(&format!("turn{i}-"), 20))).await;
        assert_eq!(again, first, "turn {i}");
    }
    // The body's session_id works the same; a non-string one is ignored.
    let body = |i: usize, session: serde_json::Value| {
        serde_json::json!({"model": "test-model", "messages": [{"role": "user", "content": words(&format!("b{i}-"), 20)}],
            "session_id": session}).to_string()
    };
    let first = pick_and_finish(&h, &mut client, &[], &body(0, "conversation-2".into())).await;
    for i in 1..8 {
        assert_eq!(pick_and_finish(&h, &mut client, &[], &body(i, "conversation-2".into())).await, first);
    }
    pick_and_finish(&h, &mut client, &[], &body(99, serde_json::json!({"not": "a key"}))).await;
    let m = h.metrics.snapshot();
    assert_eq!(m.session_picks, [2, 18, 0], "new, kept, moved");
    drop(client);
    h.stop().await;
}

/// A worker whose cache never shows the prompts it served (here: its KV
/// events never arrive; a template or seed mismatch looks the same) is
/// suspected once the same first block has come back to it 20 times,
/// cleared by the first repeat that finds it, and forgotten when it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_cache_never_matches_is_suspected_then_cleared() {
    use kvpick_router::prefix_watch::MIN_REPEATS;
    let h = Harness::start(Options { workers: 1, ..Options::default() }).await;
    let mut client = h.client().await;
    let system = words("system", 8);
    let ask = |i: u64| chat(&format!("{system} {}", words(&format!("q{i}-"), 4)));
    for i in 0..=MIN_REPEATS {
        assert_eq!(h.metrics.exported().prefix_suspected_workers, 0, "not before {MIN_REPEATS} repeats");
        let mut call = Call::open(&mut client).await;
        pick(&mut call, &ask(i)).await;
        finish_response(&mut call).await;
    }
    let exported = h.metrics.exported();
    assert_eq!((exported.prefix_suspected_workers, exported.prefix_suspicions), (1, 1));
    // Its events arrive: the next repeat finds the first block there.
    h.cache_on(0, &ask(0)).await;
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &ask(99)).await;
    finish_response(&mut call).await;
    let exported = h.metrics.exported();
    assert_eq!((exported.prefix_suspected_workers, exported.prefix_suspicions), (0, 1));
    // Suspected again, then the worker leaves the pool: it stops counting.
    for i in 0..=MIN_REPEATS {
        let mut call = Call::open(&mut client).await;
        pick(&mut call, &chat(&format!("{} {}", words("other", 8), words(&format!("r{i}-"), 4)))).await;
        finish_response(&mut call).await;
    }
    assert_eq!(h.metrics.exported().prefix_suspected_workers, 1);
    h.kv.as_ref().expect("kvpick's picker").forget_worker(kvpick_core::WorkerId(1));
    assert_eq!(h.metrics.exported().prefix_suspected_workers, 0, "a departed worker is not counted");
    drop(call);
    h.wait_all_freed().await;
    drop(client);
    h.stop().await;
}
