//! The request path: bodies in one chunk or split anywhere, full-duplex and
//! buffered gateways, KV-aware and load-aware picks, header-only requests,
//! large bodies echoed in chunks, untrusted routing headers, TLS.

use crate::ext_proc_support::*;
use kvpick_ext_proc::ExtProcConfig;
use kvpick_ext_proc::headers::DESTINATION;
use kvpick_grpc::Tls;
use kvpick_proto::core::HeaderAppendAction;
use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use kvpick_proto::ext_proc::mode::BodySendMode;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_body_in_one_chunk() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let body = chat(&words("w", 20));
    call.send(chat_headers());
    call.send(request_body(body.as_bytes(), true));

    let headers = call.recv().await;
    assert_eq!(kind(&headers), "request_headers");
    let (value, action) = set_header(&headers, DESTINATION).expect("destination header");
    assert_eq!(action, HeaderAppendAction::OverwriteIfExistsOrAdd as i32);
    assert!((0..3).any(|i| endpoint(i).to_string() == value), "{value}");
    assert_eq!(destination(&headers), Some(value));
    assert!(common(&headers).is_some_and(|c| c.clear_route_cache));

    let echo = call.recv().await;
    assert_eq!(kind(&echo), "request_body");
    assert_eq!(streamed(&echo), Some((body.into_bytes(), true)));
    assert_eq!(h.tokenizer.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(h.requests_booked().await, 1);

    finish_response(&mut call).await;
    h.wait_all_freed().await;
    wait_for("the free is counted", || async { h.metrics.snapshot().frees == 1 }).await;
    let m = h.metrics.snapshot();
    assert_eq!((m.requests(200), m.frees, m.frees_not_found), (1, 1, 0));
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_body_split_mid_token_is_answered_after_the_end() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let body = chat(&words("split", 30));
    // Cut inside `"model"` and inside a word.
    let (a, rest) = body.split_at(5);
    let (b, c) = rest.split_at(rest.len() / 2 + 3);
    call.send(chat_headers());
    call.send(request_body(a.as_bytes(), false));
    assert!(call.quiet(100).await, "nothing is answered before the body ends");
    call.send(request_body(b.as_bytes(), false));
    call.send(request_body(c.as_bytes(), true));
    let headers = call.recv().await;
    assert!(destination(&headers).is_some());
    let (echo, end) = streamed(&call.recv().await).expect("echo");
    assert_eq!((echo, end), (body.clone().into_bytes(), true));

    // The same body in one chunk hashes the same: it lands on the same worker.
    finish_response(&mut call).await;
    h.wait_all_freed().await;
    let first = destination(&headers);
    let mut again = Call::open(&mut client).await;
    h.cache_on(1, &body).await;
    let second = pick(&mut again, &body).await;
    assert_eq!(second, endpoint(1).to_string());
    assert!(first.is_some());
    drop((call, again, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_gateway_gets_the_pick_on_the_body_answer() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let body = chat(&words("buf", 12));
    let buffered = Some(protocol(BodySendMode::Buffered, BodySendMode::Buffered));
    call.send(request_headers("POST", "/v1/chat/completions", &[], false, buffered));
    let headers = call.recv().await;
    assert_eq!(kind(&headers), "request_headers");
    assert_eq!(set_header(&headers, DESTINATION), None, "the pick waits for the body");

    call.send(request_body(body.as_bytes(), true));
    let answer = call.recv().await;
    assert_eq!(kind(&answer), "request_body");
    assert!(destination(&answer).is_some());
    assert!(common(&answer).is_some_and(|c| c.clear_route_cache && c.body_mutation.is_none()));

    // Buffered response: one body message, answered with CONTINUE.
    call.send(response_headers("200", "application/json", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(response_body(b"{\"ok\":true}", true));
    let answer = call.recv().await;
    assert_eq!(kind(&answer), "response_body");
    assert!(common(&answer).is_some_and(|c| c.body_mutation.is_none()));
    h.wait_all_freed().await;
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_sharing_request_lands_on_the_worker_holding_the_prefix() {
    let h = Harness::start(Options::default()).await;
    let system = words("sys", 40);
    h.cache_on(2, &chat(&system)).await;
    let mut client = h.client().await;
    for turn in 0..5 {
        let mut call = Call::open(&mut client).await;
        let body = chat(&format!("{system} {}", words(&format!("q{turn}-"), 8)));
        assert_eq!(pick(&mut call, &body).await, endpoint(2).to_string(), "turn {turn}");
        finish_response(&mut call).await;
        h.wait_all_freed().await;
    }
    drop(client);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_load_wins_without_overlap() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut held = Vec::new();
    let mut picked = Vec::new();
    // Each open request books its prefill on its worker: the next one,
    // sharing nothing, goes to a less loaded worker.
    for i in 0..3 {
        let mut call = Call::open(&mut client).await;
        picked.push(pick(&mut call, &chat(&words(&format!("load{i}-"), 40))).await);
        held.push(call);
    }
    picked.sort();
    picked.dedup();
    assert_eq!(picked.len(), 3, "three requests on three different workers: {picked:?}");
    drop(held);
    h.wait_all_freed().await;
    drop(client);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_only_get_is_picked_without_tokenizing() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    call.send(request_headers("GET", "/v1/models", &[], true, full_duplex()));
    let headers = call.recv().await;
    assert!(destination(&headers).is_some());
    assert!(call.quiet(50).await, "no body answer for a bodiless request");
    assert_eq!(h.tokenizer.calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    call.send(response_headers("200", "application/json", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(response_body(br#"{"data":[]}"#, true));
    assert!(streamed(&call.recv().await).is_some_and(|(_, end)| end));
    h.wait_all_freed().await;
    assert_eq!(h.metrics.snapshot().header_only, 1);
    drop((call, client));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_body_comes_back_in_62000_byte_chunks_byte_identical() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let body = chat(&words("large-body-word-", 12_000));
    assert!(body.len() > 150_000);
    call.send(chat_headers());
    for piece in body.as_bytes().chunks(16_384) {
        call.send(request_body(piece, false));
    }
    call.send(request_body(b"", true));
    assert!(destination(&call.recv().await).is_some());
    let mut echoed = Vec::new();
    loop {
        let (chunk, end) = streamed(&call.recv().await).expect("a body chunk");
        assert!(chunk.len() <= 62_000);
        echoed.extend_from_slice(&chunk);
        if end {
            break;
        }
        assert_eq!(chunk.len(), 62_000, "only the last chunk may be short");
    }
    assert!(echoed == body.as_bytes(), "echo differs from the body");
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_supplied_routing_headers_are_stripped() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let spoofed = [
        ("x-gateway-destination-endpoint", "127.0.0.99:1"),
        ("x-gateway-destination-endpoint-subset", "127.0.0.99:1"),
        ("x-gateway-destination-endpoint-served", "127.0.0.99:1"),
        ("x-prefiller-host-port", "127.0.0.99:2"),
        ("hi", "mom"),
    ];
    call.send(request_headers("POST", "/v1/chat/completions", &spoofed, false, full_duplex()));
    call.send(request_body(chat("hello there").as_bytes(), true));
    let headers = call.recv().await;
    let pick = destination(&headers).expect("pick");
    assert_ne!(pick, "127.0.0.99:1");
    let mut removed = removed_headers(&headers);
    removed.sort();
    assert_eq!(
        removed,
        ["x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-subset", "x-prefiller-host-port"]
    );
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_end_the_body() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    let mut call = Call::open(&mut client).await;
    let body = r#"{"model":"m","prompt":"one two three four five"}"#;
    call.send(request_headers("POST", "/v1/completions", &[], false, full_duplex()));
    call.send(request_body(body.as_bytes(), false));
    call.send(request_trailers());
    assert!(destination(&call.recv().await).is_some());
    assert_eq!(streamed(&call.recv().await), Some((body.as_bytes().to_vec(), false)));
    assert_eq!(kind(&call.recv().await), "request_trailers");
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_mode_that_cannot_work_is_refused_with_a_grpc_status() {
    let h = Harness::start(Options::default()).await;
    let mut client = h.client().await;
    for mode in [BodySendMode::None, BodySendMode::Streamed] {
        let mut call = Call::open(&mut client).await;
        let config = Some(protocol(mode, BodySendMode::FullDuplexStreamed));
        call.send(request_headers("POST", "/v1/chat/completions", &[], false, config));
        let status = call.next().await.expect_err("the stream ends with a status");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{mode:?}: {status:?}");
        assert!(status.message().contains("FULL_DUPLEX_STREAMED"));
    }
    drop(client);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_signed_tls() {
    let config =
        ExtProcConfig { tls: Tls::SelfSigned { names: vec!["localhost".into()] }, ..Options::default().config };
    let h = Harness::start(Options { config, ..Options::default() }).await;
    let pem = h.certificate_pem().expect("a certificate");
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)).domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{}", h.addr))
        .expect("uri")
        .tls_config(tls)
        .expect("tls config")
        .connect()
        .await
        .expect("TLS connects");
    let mut client = ExternalProcessorClient::new(channel);
    let mut call = Call::open(&mut client).await;
    pick(&mut call, &chat("over tls")).await;
    drop((call, client));
    h.wait_all_freed().await;
    h.stop().await;
}
