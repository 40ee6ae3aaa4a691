//! The tokenizer HTTP client's transport behaviour (through vllm-render)
//! against stub engines on 127.0.0.1: timeout, refused connections, engine
//! errors, malformed answers, the response cap (declared and streamed),
//! keep-alive reuse and the one retry of an unanswered request.

use std::time::{Duration, Instant};

use crate::tokenizer_stub::{CHAT_BODY, Reply, Stub, chat, client, rendered, vllm};
use bytes::Bytes;
use kvpick_router::tokenizer::{ERROR_MESSAGE_MAX_BYTES, ErrorClass, TokenizeError, TokenizerProtocol};

#[tokio::test]
async fn a_slow_engine_times_out() {
    let stub = Stub::start(|_| Reply::Delayed(Duration::from_secs(5), Box::new(Reply::ok(&rendered(&[1]))))).await;
    let (tokenizer, metrics) =
        client(TokenizerProtocol::VllmRender, &stub.url(), |c| c.timeout = Duration::from_millis(150));

    let start = Instant::now();
    let err = tokenizer.tokenize(chat(CHAT_BODY)).await;

    assert_eq!(err, Err(TokenizeError::Timeout));
    assert_eq!(TokenizeError::Timeout.http_status(), 504);
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
    let snap = metrics.snapshot();
    assert_eq!(snap.errors(ErrorClass::Timeout), 1);
    assert!(snap.latency_micros.max() >= 150_000);
    stub.stop().await;
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.local_addr().expect("bound address").port()
    }; // closed here: nothing listens on it any more
    let (tokenizer, metrics) = vllm(&format!("http://127.0.0.1:{port}"));

    let err = tokenizer.tokenize(chat(CHAT_BODY)).await.expect_err("refused");

    assert!(matches!(&err, TokenizeError::Unreachable(m) if !m.is_empty()), "{err:?}");
    assert_eq!(err.http_status(), 503);
    assert_eq!(metrics.snapshot().errors(ErrorClass::Unreachable), 1);
}

#[tokio::test]
async fn engine_4xx_is_rejected_with_its_message() {
    let long = "x".repeat(5000);
    let stub = Stub::start(move |seen| {
        if seen.body.starts_with(b"{\"long") {
            Reply::status(422, &format!(r#"{{"detail":"{long}"}}"#))
        } else {
            Reply::status(
                400,
                r#"{"error":{"message":"messages: role 'robot' is not allowed","type":"BadRequestError","code":400}}"#,
            )
        }
    })
    .await;
    let (tokenizer, metrics) = vllm(&stub.url());

    let err = tokenizer.tokenize(chat(CHAT_BODY)).await.expect_err("400");
    assert_eq!(err, TokenizeError::Rejected { status: 400, message: "messages: role 'robot' is not allowed".into() });
    assert_eq!(err.http_status(), 400);

    let err = tokenizer.tokenize(chat(r#"{"long":true}"#)).await.expect_err("422");
    let TokenizeError::Rejected { status: 422, message } = &err else { panic!("expected a 422 rejection: {err:?}") };
    assert!(message.starts_with("xxxx") && message.ends_with('…'), "{message}");
    assert!(message.len() <= ERROR_MESSAGE_MAX_BYTES + '…'.len_utf8(), "{} bytes", message.len());
    assert_eq!(metrics.snapshot().errors(ErrorClass::Rejected), 2);
    stub.stop().await;
}

#[tokio::test]
async fn engine_5xx_is_upstream() {
    let stub = Stub::start(|_| Reply::status(500, r#"{"error":{"message":"CUDA out of memory"}}"#)).await;
    let (tokenizer, metrics) = vllm(&stub.url());

    let err = tokenizer.tokenize(chat(CHAT_BODY)).await.expect_err("500");

    assert!(
        matches!(&err, TokenizeError::Upstream(m) if m.contains("500") && m.contains("CUDA out of memory")),
        "{err:?}"
    );
    assert_eq!(err.http_status(), 502);
    assert_eq!(metrics.snapshot().errors(ErrorClass::Upstream), 1);
    stub.stop().await;
}

#[tokio::test]
async fn malformed_answers_are_upstream() {
    let stub = Stub::start(|seen| match seen.body.as_ref() {
        b"1" => Reply::ok("{\"token_ids\": [1, 2"),
        b"2" => Reply::ok(r#"{"prompt_token_ids":[1,2]}"#),
        b"3" => Reply::ok(r#"{"token_ids":[1,-2]}"#),
        _ => Reply::ok("<html>gateway</html>"),
    })
    .await;
    let (tokenizer, _) = vllm(&stub.url());

    for body in ["1", "2", "3", "4"] {
        let err = tokenizer.tokenize(chat(body)).await.expect_err(body);
        assert!(matches!(&err, TokenizeError::Upstream(m) if m.contains("malformed")), "{body}: {err:?}");
        assert_eq!(err.http_status(), 502);
    }
    stub.stop().await;
}

/// A render answer padded with JSON whitespace to exactly `size` bytes.
fn answer_of(size: usize) -> Bytes {
    let mut json = rendered(&[1, 2, 3]);
    assert!(json.len() <= size);
    json.extend(std::iter::repeat_n(' ', size - json.len()));
    Bytes::from(json)
}

#[tokio::test]
async fn the_cap_holds_for_declared_lengths() {
    const CAP: usize = 4096;
    let stub = Stub::start(|seen| {
        let size: usize = std::str::from_utf8(&seen.body).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
        Reply::Json(200, answer_of(size))
    })
    .await;
    let (tokenizer, _) = client(TokenizerProtocol::VllmRender, &stub.url(), |c| c.max_response_bytes = CAP);

    for size in [CAP - 1, CAP] {
        assert_eq!(tokenizer.tokenize(chat(&size.to_string())).await, Ok(vec![1, 2, 3]), "{size} bytes");
    }
    let err = tokenizer.tokenize(chat(&(CAP + 1).to_string())).await.expect_err("over the cap");
    assert!(matches!(&err, TokenizeError::Upstream(m) if m.contains("cap")), "{err:?}");
    assert_eq!(err.http_status(), 502);
    stub.stop().await;
}

#[tokio::test]
async fn the_cap_holds_while_a_chunked_answer_streams() {
    const CAP: usize = 64 * 1024;
    let stub = Stub::start(|seen| match seen.body.as_ref() {
        // Under the cap in small chunks: read whole.
        b"small" => {
            let body = answer_of(CAP - 10);
            Reply::Chunked(200, body.chunks(1000).map(Bytes::copy_from_slice).collect())
        }
        // One byte over, chunked: no length to check up front.
        b"over" => {
            let body = answer_of(CAP + 1);
            Reply::Chunked(200, body.chunks(1000).map(Bytes::copy_from_slice).collect())
        }
        // Never ends: only a cap enforced while reading stops it (before the timeout).
        _ => Reply::Endless(Bytes::from(vec![b' '; 16 * 1024])),
    })
    .await;
    let (tokenizer, _) = client(TokenizerProtocol::VllmRender, &stub.url(), |c| {
        c.max_response_bytes = CAP;
        c.timeout = Duration::from_secs(10);
    });

    assert_eq!(tokenizer.tokenize(chat("small")).await, Ok(vec![1, 2, 3]));
    for body in ["over", "endless"] {
        let start = Instant::now();
        let err = tokenizer.tokenize(chat(body)).await.expect_err(body);
        assert!(matches!(&err, TokenizeError::Upstream(m) if m.contains("cap")), "{body}: {err:?}");
        assert!(start.elapsed() < Duration::from_secs(5), "{body}: took {:?}", start.elapsed());
    }
    stub.stop().await;
}

#[tokio::test]
async fn one_connection_serves_many_requests() {
    let stub = Stub::start(|_| Reply::ok(&rendered(&[7, 8]))).await;
    let (tokenizer, metrics) = vllm(&stub.url());

    for _ in 0..50 {
        assert_eq!(tokenizer.tokenize(chat(CHAT_BODY)).await, Ok(vec![7, 8]));
    }
    // Errors the engine answers cleanly keep the connection too.
    let rejecting = Stub::start(|_| Reply::status(400, r#"{"message":"no"}"#)).await;
    let (rejected, _) = vllm(&rejecting.url());
    for _ in 0..5 {
        assert!(matches!(rejected.tokenize(chat(CHAT_BODY)).await, Err(TokenizeError::Rejected { .. })));
    }

    assert_eq!(stub.connections(), 1);
    assert_eq!(rejecting.connections(), 1);
    assert_eq!(metrics.snapshot().tokenized, 50);
    stub.stop().await;
    rejecting.stop().await;
}

#[tokio::test]
async fn a_connection_closed_before_answering_is_retried_once() {
    let stub = Stub::start(|seen| match seen.body.as_ref() {
        b"flaky" => Reply::Close, // every time: the retry fails too
        _ => Reply::ok(&rendered(&[3])),
    })
    .await;
    let (tokenizer, metrics) = vllm(&stub.url());

    let err = tokenizer.tokenize(chat("flaky")).await.expect_err("closed twice");
    assert!(matches!(&err, TokenizeError::Upstream(_)), "{err:?}");
    assert_eq!(stub.seen().len(), 2, "sent once more after the first close");
    assert_eq!(metrics.snapshot().retries, 1);

    assert_eq!(tokenizer.tokenize(chat(CHAT_BODY)).await, Ok(vec![3]));
    stub.stop().await;
}
