//! sglang-tokenize against a stub engine on 127.0.0.1: `{model, prompt}` to
//! `/tokenize`, `tokens` read back; chat bodies are unsupported.

use crate::tokenizer_stub::{CHAT_BODY, Reply, Stub, chat, client, completion};
use kvpick_router::tokenizer::{ErrorClass, TokenizeError, TokenizerProtocol};

#[tokio::test]
async fn completion_prompt_is_tokenized() {
    let stub = Stub::start(|_| Reply::ok(r#"{"tokens":[9906,1917,0],"count":3,"max_model_len":32768}"#)).await;
    let (tokenizer, metrics) = client(TokenizerProtocol::SglangTokenize, &format!("{}/sgl", stub.url()), |_| {});
    let body = r#"{"model":"qwen","prompt":"Hello \"world\"!","max_tokens":8}"#;

    let mut request = completion(body, Some("Hello \"world\"!"));
    request.model = "qwen".into();
    assert_eq!(tokenizer.tokenize(request).await, Ok(vec![9906, 1917, 0]));

    let seen = stub.seen();
    assert_eq!((seen[0].method.as_str(), seen[0].path.as_str()), ("POST", "/sgl/tokenize"));
    assert_eq!(seen[0].content_type.as_deref(), Some("application/json"));
    let sent: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("JSON request");
    assert_eq!(sent, serde_json::json!({"model": "qwen", "prompt": "Hello \"world\"!"}));
    assert_eq!(metrics.snapshot().tokenized, 1);
    stub.stop().await;
}

#[tokio::test]
async fn chat_and_token_prompts_are_unsupported() {
    let stub = Stub::start(|_| Reply::ok(r#"{"tokens":[1],"count":1}"#)).await;
    let (tokenizer, metrics) = client(TokenizerProtocol::SglangTokenize, &stub.url(), |_| {});

    let chat_err = tokenizer.tokenize(chat(CHAT_BODY)).await.expect_err("chat is unsupported");
    let tokens_err =
        tokenizer.tokenize(completion(r#"{"model":"m","prompt":[1,2,3]}"#, None)).await.expect_err("no string prompt");

    assert!(matches!(chat_err, TokenizeError::Unsupported(_)), "{chat_err:?}");
    assert!(matches!(tokens_err, TokenizeError::Unsupported(_)), "{tokens_err:?}");
    assert!(stub.seen().is_empty(), "nothing is sent for unsupported bodies");
    let snap = metrics.snapshot();
    assert_eq!(snap.errors(ErrorClass::Unsupported), 2);
    assert_eq!((snap.calls, snap.latency_micros.len()), (0, 0));
    stub.stop().await;
}

#[tokio::test]
async fn engine_rejection_is_passed_on() {
    let stub =
        Stub::start(|_| Reply::status(400, r#"{"object":"error","message":"model not found","code":400}"#)).await;
    let (tokenizer, _) = client(TokenizerProtocol::SglangTokenize, &stub.url(), |_| {});

    let err = tokenizer.tokenize(completion(r#"{"model":"m","prompt":"x"}"#, Some("x"))).await;

    assert_eq!(err, Err(TokenizeError::Rejected { status: 400, message: "model not found".into() }));
    stub.stop().await;
}

#[tokio::test]
async fn an_answer_without_tokens_is_malformed() {
    let stub = Stub::start(|_| Reply::ok(r#"{"token_ids":[1]}"#)).await;
    let (tokenizer, _) = client(TokenizerProtocol::SglangTokenize, &stub.url(), |_| {});

    let err = tokenizer.tokenize(completion(r#"{"model":"m","prompt":"x"}"#, Some("x"))).await.expect_err("malformed");

    assert!(matches!(&err, TokenizeError::Upstream(m) if m.contains("malformed")), "{err:?}");
    stub.stop().await;
}
