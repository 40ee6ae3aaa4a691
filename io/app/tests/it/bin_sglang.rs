//! `kvpick serve` in front of simulated SGLang servers: KV events over ZMQ
//! in SGLang's own form (positional array events, signed int64 hashes, the
//! legacy replay layout) and prompts tokenized by SGLang's `/tokenize`.
//! Completions stick to the engine holding their prefix; chat, which
//! `/tokenize` cannot render, is routed by load and counted; a local
//! tokenizer that disagrees with SGLang's is caught by the parity sampler.

use std::time::Duration;

use kvpick_discovery::workers_file::{self, Entry};
use kvpick_sim::{Flavour, Fleet};
use kvpick_test_support::gateway::Gateway;

use crate::bin_support::{Kvpick, TempDir, chat, engine_config, fixture_model_dir, scrape, serve, until, value};

/// Two simulated SGLang servers, and `kvpick serve` (with `extra`) in
/// front of them from a workers file of `engine: sglang` entries.
async fn start(tag: &str, extra: &[&str]) -> (Fleet, TempDir, Kvpick) {
    let fleet = Fleet::start(2, &Flavour::sglang_events(engine_config())).await.unwrap_or_else(|e| panic!("{e}"));
    let dir = TempDir::new(tag);
    let file = dir.path("workers.json");
    let entries: Vec<Entry> =
        fleet.endpoints().into_iter().map(|e| Entry::for_engine("sglang", e.http, e.events, Some(e.replay))).collect();
    workers_file::write(&file, &entries).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let kvpick = serve(&file, extra);
    (fleet, dir, kvpick)
}

fn completion(prompt: &str) -> Vec<u8> {
    serde_json::json!({"model": "sim-model", "prompt": prompt, "max_tokens": 8}).to_string().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_events_and_tokenize_route_by_overlap() {
    let (fleet, _dir, mut kvpick) = start("sglang", &[]).await;
    let log = kvpick.drain_log();
    assert!(log.iter().any(|l| l.contains("sglang-tokenize") && l.contains("asking the first worker")), "{log:?}");

    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let shared = "Summarise the following contract clause by clause, citing each one. ".repeat(20);
    let mut picked = Vec::new();
    for turn in 0..4 {
        let body = completion(&format!("{shared} Clause {turn}."));
        let exchange = gateway.post("/v1/completions", &body).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exchange.status, 200, "{}", String::from_utf8_lossy(&exchange.body));
        picked.push(exchange.endpoint.unwrap_or_else(|| panic!("no pick")));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(picked[1..].iter().all(|e| *e == picked[0]), "turns moved: {picked:?}");
    let after = scrape(kvpick.metrics).await;
    assert!(value(&after, "kvpick_picked_overlap_tokens_total", &[]) > 0.0, "later prompts overlapped");
    assert!(value(&after, "kvpick_kv_events_applied_total", &[]) > 0.0);
    assert_eq!(value(&after, "kvpick_kv_events_malformed_total", &[]), 0.0, "signed hashes decode");

    // Chat cannot be rendered by /tokenize: picked by load, still served.
    let exchange = gateway.post("/v1/chat/completions", &chat("hello")).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exchange.status, 200, "{}", String::from_utf8_lossy(&exchange.body));
    assert!(exchange.endpoint.is_some());
    fleet.shutdown().await;
}

/// kvpick tokenizing in-process (the fixture model) in front of SGLang
/// servers with another tokenizer: the parity sampler, asking SGLang's
/// `/tokenize` for completions, catches it and hands tokenizing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatched_local_tokenizer_is_caught_against_sglang_tokenize() {
    let local = format!("local:{}", fixture_model_dir().display());
    let (fleet, _dir, kvpick) = start("sglang-parity", &["--tokenizer", &local, "--tokenizer-parity-ratio", "1"]).await;
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    for turn in 0..4 {
        let body = completion(&format!("Translate the following sentence into French, turn {turn}."));
        let exchange = gateway.post("/v1/completions", &body).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exchange.status, 200, "{}", String::from_utf8_lossy(&exchange.body));
    }
    until(&kvpick, "the engine fallback", |s| value(s, "kvpick_tokenizer_engine_fallback", &[]) == 1.0).await;
    let after = scrape(kvpick.metrics).await;
    assert!(value(&after, "kvpick_tokenizer_parity_checks_total", &[("outcome", "mismatch")]) >= 1.0);
    fleet.shutdown().await;
}
