//! The in-process tokenizer against transformers: every case of
//! tests/fixtures/tokenizer/cases.json (made by `gen_fixtures.py` with
//! transformers' `apply_chat_template` and the Hugging Face tokenizer) must
//! render to the same prompt text and the same token ids; the templates'
//! own errors must come back as 400s with their message.
//!
//! Then the parity sampler against a stub engine on 127.0.0.1: agreement
//! counted as matches; a disagreeing engine counted, and every later
//! request tokenized by the engine (or not, with the fallback off); bodies
//! the local path cannot handle handed to the engine.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvpick_router::tokenizer::{
    Api, LocalTokenizer, LocalTokenizerConfig, ParityOutcome, TokenizeError, TokenizeRequest, Tokenizer,
    TokenizerConfig, TokenizerMetrics, TokenizerProtocol,
};
use serde_json::Value;

use crate::tokenizer_stub::{Reply, Stub, rendered};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

fn cases() -> Vec<Value> {
    let path = fixtures().join("cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<Vec<Value>>(&text).unwrap_or_else(|e| panic!("cases.json: {e}"))
}

fn local(model: &str) -> LocalTokenizer {
    let config = LocalTokenizerConfig { dir: fixtures().join(model), chat_template: None };
    LocalTokenizer::load(&config, Arc::new(TokenizerMetrics::new())).unwrap_or_else(|e| panic!("{model}: {e}"))
}

/// The case's request body, byte for byte, and its API.
fn body_of(case: &Value) -> (Vec<u8>, Api) {
    let text = case["request"].as_str().expect("request");
    let parsed: Value = serde_json::from_str(text).expect("request is JSON");
    let api = if parsed.get("messages").is_some() { Api::ChatCompletions } else { Api::Completions };
    (text.as_bytes().to_vec(), api)
}

#[test]
fn every_case_matches_transformers() {
    let cases = cases();
    assert!(cases.len() >= 16, "cases.json has {} cases", cases.len());
    for case in &cases {
        let name = format!("{}/{}", case["model"].as_str().unwrap_or("?"), case["name"].as_str().unwrap_or("?"));
        let tokenizer = local(case["model"].as_str().expect("model"));
        let (body, api) = body_of(case);
        if let Some(error) = case.get("error").and_then(Value::as_str) {
            match tokenizer.tokenize_body(api, &body) {
                Err(TokenizeError::Rejected { status: 400, message }) => assert_eq!(message, error, "{name}"),
                other => panic!("{name}: expected the template's error, got {other:?}"),
            }
            continue;
        }
        if api == Api::ChatCompletions {
            let text = tokenizer.render_chat(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(text, case["rendered"].as_str().expect("rendered"), "{name}: rendered prompt");
        }
        let ids = tokenizer.tokenize_body(api, &body).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want: Vec<u32> = serde_json::from_value(case["token_ids"].clone()).expect("token_ids");
        assert_eq!(ids, want, "{name}: token ids");
    }
}

#[test]
fn an_explicit_template_file_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("t.jinja");
    std::fs::write(&file, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}").expect("write");
    let config = LocalTokenizerConfig { dir: fixtures().join("chatml"), chat_template: Some(file) };
    let tokenizer = LocalTokenizer::load(&config, Arc::new(TokenizerMetrics::new())).expect("load");
    let body = br#"{"messages": [{"role": "user", "content": "hi"}]}"#;
    assert_eq!(tokenizer.render_chat(body).ok().as_deref(), Some("<user>hi"));
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let load = |d: &Path| {
        LocalTokenizer::load(&LocalTokenizerConfig { dir: d.to_path_buf(), chat_template: None }, Arc::default())
            .err()
            .map(|e| e.to_string())
    };
    assert!(load(&dir.path().join("absent")).is_some_and(|e| e.contains("not a directory")));
    assert!(load(dir.path()).is_some_and(|e| e.contains("tokenizer.json") && e.contains("cannot open")));
    std::fs::write(dir.path().join("tokenizer.json"), "{}").expect("write");
    assert!(load(dir.path()).is_some_and(|e| e.contains("not a Hugging Face tokenizer")));
    std::fs::copy(fixtures().join("chatml/tokenizer.json"), dir.path().join("tokenizer.json")).expect("copy");
    std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"chat_template": "{% for %}"}"#).expect("write");
    assert!(load(dir.path()).is_some_and(|e| e.contains("tokenizer_config.json") && e.contains("does not parse")));
    // No template at all: loads; chat is unsupported, completions work.
    std::fs::write(dir.path().join("tokenizer_config.json"), "{}").expect("write");
    let config = LocalTokenizerConfig { dir: dir.path().to_path_buf(), chat_template: None };
    let tokenizer = LocalTokenizer::load(&config, Arc::default()).expect("load without a template");
    assert!(matches!(
        tokenizer.tokenize_body(Api::ChatCompletions, br#"{"messages": []}"#),
        Err(TokenizeError::Unsupported(_))
    ));
    assert!(tokenizer.tokenize_body(Api::Completions, br#"{"prompt": "hi"}"#).is_ok_and(|ids| ids.len() >= 2));
}

/// The chat case the parity tests send, and the ids transformers gives.
fn plain_case() -> (Bytes, Vec<u32>) {
    let case = cases().into_iter().find(|c| c["model"] == "chatml" && c["name"] == "chat_plain").expect("chat_plain");
    let body = Bytes::from(body_of(&case).0);
    (body, serde_json::from_value(case["token_ids"].clone()).expect("ids"))
}

fn request(body: &Bytes) -> TokenizeRequest {
    TokenizeRequest { api: Api::ChatCompletions, body: body.clone(), model: "m".into(), prompt: None }
}

/// A `local:` tokenizer checked against a render stub at `url`.
fn checked(url: &str, ratio: f64, fallback: bool) -> (Arc<dyn Tokenizer>, Arc<TokenizerMetrics>) {
    let mut config = TokenizerConfig::new(TokenizerProtocol::VllmRender, url);
    config.local = Some(LocalTokenizerConfig { dir: fixtures().join("chatml"), chat_template: None });
    config.parity.ratio = ratio;
    config.parity.fallback_on_mismatch = fallback;
    let metrics = Arc::new(TokenizerMetrics::new());
    (config.build(metrics.clone()).expect("build"), metrics)
}

/// Waits until `done` holds for the metrics (the checks run in the
/// background), for at most 10 s.
async fn until(metrics: &TokenizerMetrics, done: impl Fn(&kvpick_router::tokenizer::TokenizerMetricsSnapshot) -> bool) {
    for _ in 0..1000 {
        if done(&metrics.snapshot()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("parity checks did not finish: {:?}", metrics.snapshot());
}

#[tokio::test]
async fn agreeing_engine_counts_matches_and_serves_nothing() {
    let (body, ids) = plain_case();
    let answer = rendered(&ids);
    let stub = Stub::start(move |_| Reply::ok(&answer)).await;
    let (tokenizer, metrics) = checked(&stub.url(), 1.0, true);
    for _ in 0..3 {
        assert_eq!(tokenizer.tokenize(request(&body)).await.ok().as_ref(), Some(&ids));
        until(&metrics, |s| s.parity(ParityOutcome::Match) + s.parity(ParityOutcome::Skipped) >= 1).await;
    }
    until(&metrics, |s| s.parity(ParityOutcome::Match) + s.parity(ParityOutcome::Skipped) == 3).await;
    let snap = metrics.snapshot();
    assert_eq!((snap.parity(ParityOutcome::Mismatch), snap.engine_fallback), (0, false));
    // The request path made no round trip: checks are not counted there.
    assert_eq!((snap.tokenized, snap.calls), (3, 3));
    assert!(stub.seen().iter().all(|s| s.path == "/v1/chat/completions/render"));
}

#[tokio::test]
async fn a_disagreeing_engine_is_caught_and_takes_over() {
    let (body, ids) = plain_case();
    let mut engine_ids = ids.clone();
    engine_ids[10] += 1;
    let answer = rendered(&engine_ids);
    let stub = Stub::start(move |_| Reply::ok(&answer)).await;
    let (tokenizer, metrics) = checked(&stub.url(), 1.0, true);
    // The first request is answered locally; its check finds the mismatch.
    assert_eq!(tokenizer.tokenize(request(&body)).await.ok().as_ref(), Some(&ids));
    until(&metrics, |s| s.parity(ParityOutcome::Mismatch) == 1).await;
    assert!(metrics.snapshot().engine_fallback);
    // From now on the engine's tokens, through the request path.
    let before = stub.seen().len();
    assert_eq!(tokenizer.tokenize(request(&body)).await.ok().as_ref(), Some(&engine_ids));
    assert_eq!(stub.seen().len(), before + 1);
    assert_eq!(metrics.snapshot().parity(ParityOutcome::Mismatch), 1, "no more checks once the engine tokenizes");
}

#[tokio::test]
async fn without_the_fallback_local_tokens_stay() {
    let (body, ids) = plain_case();
    let answer = rendered(&ids[..ids.len() - 1]);
    let stub = Stub::start(move |_| Reply::ok(&answer)).await;
    let (tokenizer, metrics) = checked(&stub.url(), 1.0, false);
    assert_eq!(tokenizer.tokenize(request(&body)).await.ok().as_ref(), Some(&ids));
    until(&metrics, |s| s.parity(ParityOutcome::Mismatch) == 1).await;
    assert_eq!(tokenizer.tokenize(request(&body)).await.ok().as_ref(), Some(&ids));
    until(&metrics, |s| s.parity(ParityOutcome::Mismatch) + s.parity(ParityOutcome::Skipped) == 2).await;
    assert!(!metrics.snapshot().engine_fallback);
}

#[tokio::test]
async fn what_local_cannot_do_goes_to_the_engine_and_ratio_zero_checks_nothing() {
    let stub = Stub::start(|_| Reply::ok(&rendered(&[7, 8, 9]))).await;
    let (tokenizer, metrics) = checked(&stub.url(), 0.0, true);
    let image = Bytes::from_static(
        br#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/i.png"}}]}]}"#,
    );
    assert_eq!(tokenizer.tokenize(request(&image)).await.ok(), Some(vec![7, 8, 9]));
    let (body, ids) = plain_case();
    assert_eq!(tokenizer.tokenize(request(&body)).await.ok(), Some(ids));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let snap = metrics.snapshot();
    assert_eq!(snap.local_handoffs, 1);
    assert_eq!(ParityOutcome::ALL.iter().map(|o| snap.parity(*o)).sum::<u64>(), 0);
    assert_eq!(stub.seen().len(), 1, "only the hand-off reached the engine");
}

#[tokio::test]
async fn engine_errors_during_checks_are_counted_not_fatal() {
    let stub = Stub::start(|_| Reply::status(500, r#"{"error":"boom"}"#)).await;
    let (tokenizer, metrics) = checked(&stub.url(), 1.0, true);
    let (body, ids) = plain_case();
    assert_eq!(tokenizer.tokenize(request(&body)).await.ok(), Some(ids));
    until(&metrics, |s| s.parity(ParityOutcome::EngineError) == 1).await;
    assert!(!metrics.snapshot().engine_fallback);
}

#[tokio::test]
async fn a_long_body_is_tokenized_off_the_calling_thread() {
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(local("chatml"));
    let text = "The weather in Lisbon today is sunny. ".repeat(600);
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]});
    let body = Bytes::from(serde_json::to_vec(&body).expect("body"));
    assert!(body.len() > kvpick_router::tokenizer::local::INLINE_MAX_BODY_BYTES);
    let ids = tokenizer.tokenize(request(&body)).await.expect("tokenized");
    assert_eq!(ids, local("chatml").tokenize_body(Api::ChatCompletions, &body).expect("inline"));
    assert!(ids.len() > 600, "{} tokens", ids.len());
}

/// With `KVPICK_REGEN_FIXTURES=1` and a `python3` that can import
/// transformers, tokenizers and jinja2, the generator runs into a temporary
/// directory and must reproduce the committed files byte for byte;
/// otherwise this check is skipped (said on stderr).
#[test]
fn fixtures_regenerate_identically() {
    if std::env::var("KVPICK_REGEN_FIXTURES").as_deref() != Ok("1") {
        eprintln!("KVPICK_REGEN_FIXTURES is not 1: tokenizer fixture regeneration not checked");
        return;
    }
    let python = std::env::var("KVPICK_PYTHON").unwrap_or_else(|_| "python3".into());
    let importable = std::process::Command::new(&python)
        .args(["-c", "import transformers, tokenizers, jinja2"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !importable {
        eprintln!(
            "{python} cannot import transformers, tokenizers and jinja2: tokenizer fixture regeneration not checked"
        );
        return;
    }
    let out = tempfile::tempdir().expect("tempdir");
    let status = std::process::Command::new(&python)
        .arg(fixtures().join("gen_fixtures.py"))
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("run gen_fixtures.py");
    assert!(status.success(), "gen_fixtures.py failed: {status}");
    let mut files = vec!["cases.json".to_owned()];
    for model in ["chatml", "llama", "mistral"] {
        for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
            if fixtures().join(model).join(name).exists() {
                files.push(format!("{model}/{name}"));
            }
        }
    }
    for name in files {
        let committed = std::fs::read(fixtures().join(&name)).expect("committed");
        let generated = std::fs::read(out.path().join(&name)).unwrap_or_default();
        assert!(committed == generated, "{name}: committed bytes differ from the generator's (rerun gen_fixtures.py)");
    }
}

/// Against SGLang's `/tokenize`: completions are checked (and agree); chat
/// bodies cannot be (the endpoint takes a prompt only) and say so.
#[tokio::test]
async fn sglang_checks_completions_and_says_chat_is_not_checkable() {
    let case = cases().into_iter().find(|c| c["name"] == "completion_string").expect("completion_string");
    let ids: Vec<u32> = serde_json::from_value(case["token_ids"].clone()).expect("ids");
    let answer = serde_json::json!({"tokens": ids, "count": ids.len(), "max_model_len": 4096}).to_string();
    let stub = Stub::start(move |_| Reply::ok(&answer)).await;
    let mut config = TokenizerConfig::new(TokenizerProtocol::SglangTokenize, stub.url());
    config.local = Some(LocalTokenizerConfig { dir: fixtures().join("chatml"), chat_template: None });
    config.parity.ratio = 1.0;
    let metrics = Arc::new(TokenizerMetrics::new());
    let tokenizer = config.build(metrics.clone()).expect("build");
    let body = Bytes::from(body_of(&case).0);
    let prompt = case["request"].as_str().and_then(|r| serde_json::from_str::<Value>(r).ok());
    let prompt = prompt.and_then(|r| r["prompt"].as_str().map(str::to_owned));
    let completion = TokenizeRequest { api: Api::Completions, body, model: "m".into(), prompt };
    assert_eq!(tokenizer.tokenize(completion).await.ok().as_ref(), Some(&ids));
    until(&metrics, |s| s.parity(ParityOutcome::Match) == 1).await;
    let (chat, chat_ids) = plain_case();
    assert_eq!(tokenizer.tokenize(request(&chat)).await.ok(), Some(chat_ids), "chat is tokenized locally");
    until(&metrics, |s| s.parity(ParityOutcome::Unsupported) == 1).await;
    assert_eq!(stub.seen().len(), 1, "the chat body never reached /tokenize");
}
