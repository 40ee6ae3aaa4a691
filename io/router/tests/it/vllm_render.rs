//! vllm-render against a stub engine on 127.0.0.1: the body forwarded byte
//! for byte, chat and completion answers, several prompts, path prefixes.

use crate::tokenizer_stub::{CHAT_BODY, Reply, Stub, chat, client, completion, rendered, vllm};
use kvpick_router::tokenizer::{TokenizeError, TokenizerProtocol};

#[tokio::test]
async fn chat_body_is_forwarded_byte_for_byte() {
    let stub = Stub::start(|_| Reply::ok(&rendered(&[151644, 872, 198, 9707]))).await;
    let (tokenizer, metrics) = vllm(&stub.url());
    // Odd spacing, key order, escapes and non-ASCII: nothing may be re-encoded.
    let body = "{ \"messages\" : [ {\"content\":\"h\\u00e9llo — 你好\\n\",\"role\":\"user\"} ],\n\t\"model\":\"m\",\"stream\":true }  ";

    let tokens = tokenizer.tokenize(chat(body)).await;

    assert_eq!(tokens, Ok(vec![151644, 872, 198, 9707]));
    let seen = stub.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, "/v1/chat/completions/render");
    assert_eq!(seen[0].content_type.as_deref(), Some("application/json"));
    assert_eq!(seen[0].body.as_ref(), body.as_bytes());
    let snap = metrics.snapshot();
    assert_eq!((snap.calls, snap.tokenized, snap.total_errors()), (1, 1, 0));
    assert_eq!(snap.latency_micros.len(), 1);
    stub.stop().await;
}

#[tokio::test]
async fn completion_uses_the_render_list() {
    let stub = Stub::start(|_| Reply::ok(&format!("[{}]", rendered(&[1, 2, 3])))).await;
    let (tokenizer, metrics) = vllm(&stub.url());
    let body = r#"{"model":"m","prompt":"one two three","max_tokens":4}"#;

    assert_eq!(tokenizer.tokenize(completion(body, Some("one two three"))).await, Ok(vec![1, 2, 3]));

    let seen = stub.seen();
    assert_eq!(seen[0].path, "/v1/completions/render");
    assert_eq!(seen[0].body.as_ref(), body.as_bytes());
    assert_eq!(metrics.snapshot().multi_prompt, 0);
    stub.stop().await;
}

#[tokio::test]
async fn several_prompts_pick_on_the_first_and_are_counted() {
    let answer = format!("[{},{},{}]", rendered(&[10, 11]), rendered(&[20]), rendered(&[30, 31, 32]));
    let stub = Stub::start(move |_| Reply::ok(&answer)).await;
    let (tokenizer, metrics) = vllm(&stub.url());

    let tokens = tokenizer.tokenize(completion(r#"{"model":"m","prompt":["a","b","c"]}"#, None)).await;

    assert_eq!(tokens, Ok(vec![10, 11]));
    assert_eq!(metrics.snapshot().multi_prompt, 1);
    stub.stop().await;
}

#[tokio::test]
async fn an_empty_render_list_is_a_bad_answer() {
    let stub = Stub::start(|_| Reply::ok("[]")).await;
    let (tokenizer, _) = vllm(&stub.url());

    let err = tokenizer.tokenize(completion(r#"{"model":"m","prompt":[]}"#, None)).await.expect_err("no prompt");

    assert!(matches!(&err, TokenizeError::Upstream(m) if m.contains("empty")), "{err:?}");
    assert_eq!(err.http_status(), 502);
    stub.stop().await;
}

#[tokio::test]
async fn a_base_path_prefix_is_kept() {
    let stub = Stub::start(|seen| {
        if seen.path.ends_with("/v1/completions/render") {
            Reply::ok(&format!("[{}]", rendered(&[5])))
        } else {
            Reply::ok(&rendered(&[4]))
        }
    })
    .await;
    let (tokenizer, _) = client(TokenizerProtocol::VllmRender, &format!("{}/pool-a/vllm/", stub.url()), |_| {});

    assert_eq!(tokenizer.tokenize(chat(CHAT_BODY)).await, Ok(vec![4]));
    assert_eq!(tokenizer.tokenize(completion(r#"{"model":"m","prompt":"x"}"#, Some("x"))).await, Ok(vec![5]));

    let paths: Vec<String> = stub.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/pool-a/vllm/v1/chat/completions/render", "/pool-a/vllm/v1/completions/render"]);
    stub.stop().await;
}
