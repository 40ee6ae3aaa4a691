//! Refusals: each reason's status and JSON error body, and the gRPC stream
//! surviving every bad request.

use std::sync::atomic::Ordering;

use crate::ext_proc_support::*;
use kvpick_ext_proc::ExtProcConfig;
use kvpick_router::PickerConfig;
use kvpick_router::tokenizer::{FallbackPolicy, TokenizeError};

/// Sends headers and `body` in one chunk; returns the immediate response.
async fn refused(h: &Harness, body: &[u8]) -> Refusal {
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    call.send(chat_headers());
    call.send(request_body(body, true));
    let answer = call.recv().await;
    let refused = immediate(&answer).unwrap_or_else(|| panic!("expected a refusal, got {answer:?}"));
    // The gRPC stream is not ended by a bad request: later messages get no
    // answer, and it closes cleanly when the gateway closes it.
    call.send(response_headers("200", "application/json", None, false));
    assert!(call.quiet(50).await);
    call.close_send();
    assert!(matches!(call.next().await, Ok(None)), "the stream ends with OK");
    refused
}

fn assert_error_body(body: &serde_json::Value, status: u16, kind: &str) {
    assert_eq!(body["error"]["code"], status, "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_and_missing_model_are_400() {
    let h = Harness::start(Options::default()).await;
    let (status, body, headers) = refused(&h, br#"{"model":"m","messages":[{"role""#).await;
    assert_eq!(status, 400);
    assert_error_body(&body, 400, "invalid_request_error");
    assert!(headers.contains(&("content-type".into(), "application/json".into())));

    let (status, body, _) = refused(&h, br#"{"messages":[{"role":"user","content":"hi"}]}"#).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("model")), "{body}");
    assert_eq!(h.metrics.snapshot().requests(400), 2);
    assert_eq!(h.requests_booked().await, 0);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_413_as_soon_as_it_passes_the_limit() {
    let config = ExtProcConfig { max_body_bytes: 1000, ..Options::default().config };
    let h = Harness::start(Options { config, ..Options::default() }).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    call.send(chat_headers());
    call.send(request_body(&[b' '; 600], false));
    assert!(call.quiet(50).await);
    call.send(request_body(&[b' '; 600], false));
    let (status, body, _) = immediate(&call.recv().await).expect("refused before the body ends");
    assert_eq!(status, 413);
    assert_error_body(&body, 413, "invalid_request_error");
    call.send(request_body(&[b' '; 600], true));
    assert!(call.quiet(50).await, "the rest of the body is ignored");
    assert_eq!(h.tokenizer.calls.load(Ordering::SeqCst), 0);
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_limit_is_429_with_retry_after() {
    let (tokenizer, gate) = TestTokenizer::gated();
    let config = ExtProcConfig { max_inflight_requests: 2, ..Options::default().config };
    let h = Harness::start(Options { config, tokenizer, ..Options::default() }).await;
    let mut client = h.client().await;
    let mut waiting = Vec::new();
    for i in 0..2 {
        let call = Call::open(&mut client).await;
        call.send(chat_headers());
        call.send(request_body(chat(&format!("held {i}")).as_bytes(), true));
        waiting.push(call);
    }
    wait_for("both requests reach the tokenizer", || async { h.tokenizer.calls.load(Ordering::SeqCst) == 2 }).await;
    assert_eq!(h.metrics.snapshot().inflight, 2);

    let mut third = Call::open(&mut client).await;
    third.send(chat_headers());
    let (status, body, headers) = immediate(&third.recv().await).expect("refused at the headers");
    assert_eq!(status, 429);
    assert_error_body(&body, 429, "rate_limit_error");
    assert!(headers.contains(&("retry-after".into(), "1".into())));

    gate.add_permits(2);
    for call in &mut waiting {
        assert!(destination(&call.recv().await).is_some());
    }
    assert_eq!(h.metrics.snapshot().inflight, 0, "the limit counts the request path only");
    let mut fourth = Call::open(&mut client).await;
    gate.add_permits(1);
    pick(&mut fourth, &chat("after")).await;
    drop((waiting, third, fourth, client));
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_errors_fail_or_fall_back_by_policy() {
    let fail = PickerConfig { fallback: FallbackPolicy::Fail, ..PickerConfig::default() };
    let h = Harness::start(Options { picker: fail, ..Options::default() }).await;
    for (error, status) in [
        (TokenizeError::Timeout, 504),
        (TokenizeError::Upstream("engine said 500".into()), 502),
        (TokenizeError::Unreachable("connection refused".into()), 503),
        (TokenizeError::Rejected { status: 422, message: "bad".into() }, 400),
    ] {
        h.tokenizer.fail_with(Some(error.clone()));
        let (got, body, _) = refused(&h, chat("tokenize me").as_bytes()).await;
        assert_eq!(got, status, "{error:?}");
        assert_eq!(body["error"]["code"], status);
    }
    // Unsupported is never a failure: routed by load, counted.
    h.tokenizer.fail_with(Some(TokenizeError::Unsupported("chat on /tokenize")));
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("unsupported")).await;
    assert_eq!(h.metrics.snapshot().fallbacks("unsupported"), 1);
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;

    let h = Harness::start(Options::default()).await;
    h.tokenizer.fail_with(Some(TokenizeError::Timeout));
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("load only")).await;
    let m = h.metrics.snapshot();
    assert_eq!((m.fallbacks("timeout"), m.total_fallbacks(), m.requests(200)), (1, 1, 1));
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_model_is_404_and_no_workers_is_503() {
    let h = Harness::start(Options { model: Some("served-model".into()), ..Options::default() }).await;
    let (status, body, _) = refused(&h, chat("which model").as_bytes()).await;
    assert_eq!(status, 404);
    assert_error_body(&body, 404, "not_found_error");
    h.stop().await;

    let h = Harness::start(Options { workers: 0, ..Options::default() }).await;
    let (status, body, _) = refused(&h, chat("anyone").as_bytes()).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], 503);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_on_another_path_routes_by_load() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    call.send(request_headers("POST", "/v1/embeddings", &[], false, full_duplex()));
    call.send(request_body(br#"{"model":"m","input":"embed me"}"#, true));
    assert!(destination(&call.recv().await).is_some());
    assert_eq!(h.metrics.snapshot().fallbacks("unknown_api"), 1);
    assert_eq!(h.tokenizer.calls.load(Ordering::SeqCst), 0);
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}
