//! `kvpick serve --tokenizer local:PATH`, the binary as a user runs it, in
//! front of simulated engines that tokenize with a Hugging Face model
//! directory (the fixture model of tests/fixtures/tokenizer): picks need no
//! render round trip, conversations stick to the engine holding their
//! prefix, and the parity sampler agrees with the engine's render. Then the
//! same kvpick in front of engines with a different tokenizer: the sampler
//! catches it, says so once, and the engine tokenizes from then on.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvpick_sim::{EngineConfig, Fleet};
use kvpick_test_support::gateway::Gateway;

use crate::bin_support::{Kvpick, TempDir, WAIT, chat, engine_config, scrape, serve, value, write_workers};

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/chatml")
}

async fn fleet_with(n: usize, base: EngineConfig) -> Fleet {
    Fleet::start(n, &base).await.unwrap_or_else(|e| panic!("fleet: {e}"))
}

/// Four turns sharing a long system prompt; the endpoints picked.
async fn conversation(kvpick: &Kvpick, fleet: &Fleet) -> Vec<std::net::SocketAddr> {
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let endpoints: Vec<_> = fleet.endpoints().iter().map(|e| e.http).collect();
    let shared = "You are a helpful assistant. Answer briefly and precisely. ".repeat(16);
    let mut picked = Vec::new();
    for turn in 0..4 {
        let text = format!("{shared} What is the capital of France? turn {turn}");
        let exchange = gateway.post("/v1/chat/completions", &chat(&text)).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exchange.status, 200, "{}", String::from_utf8_lossy(&exchange.body));
        let endpoint = exchange.endpoint.unwrap_or_else(|| panic!("no pick"));
        assert!(endpoints.contains(&endpoint), "picked {endpoint}, not an engine");
        picked.push(endpoint);
        // Let the engine's KV events reach kvpick before the next turn.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    picked
}

/// Waits until the scrape satisfies `done`.
async fn until(kvpick: &Kvpick, what: &str, done: impl Fn(&prometheus_parse::Scrape) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        if done(&scrape(kvpick.metrics).await) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not seen in {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn parity(scrape: &prometheus_parse::Scrape, outcome: &str) -> f64 {
    value(scrape, "kvpick_tokenizer_parity_checks_total", &[("outcome", outcome)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_tokens_match_the_engines_and_route_by_overlap() {
    let fleet = fleet_with(2, EngineConfig { model_dir: Some(model_dir()), ..engine_config() }).await;
    let dir = TempDir::new("local-tokenizer");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let local = format!("local:{}", model_dir().display());
    let mut kvpick = serve(&file, &["--tokenizer", &local, "--tokenizer-parity-ratio", "1"]);
    let started = kvpick.drain_log().iter().any(|l| l.contains("tokenizer: local, checked against the first worker's"));
    assert!(started, "no start-up line for the local tokenizer");

    let picked = conversation(&kvpick, &fleet).await;
    assert!(picked[1..].iter().all(|e| *e == picked[0]), "turns moved: {picked:?}");
    // Every request was checked against the engine's render and agreed
    // (a check still running or skipped is neither).
    until(&kvpick, "four parity checks", |s| parity(s, "match") + parity(s, "skipped") >= 4.0).await;
    let after = scrape(kvpick.metrics).await;
    assert_eq!(parity(&after, "mismatch"), 0.0);
    assert!(parity(&after, "match") >= 1.0);
    assert_eq!(value(&after, "kvpick_tokenizer_engine_fallback", &[]), 0.0);
    assert!(value(&after, "kvpick_picked_overlap_tokens_total", &[]) > 0.0, "later turns overlapped");
    assert!(value(&after, "kvpick_prompt_cached_tokens_total", &[]) > 0.0, "the engine reported cache hits");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatched_tokenizer_is_caught_and_the_engine_takes_over() {
    // The engines use the simulator's built-in tokenizer: a different model.
    let fleet = fleet_with(2, engine_config()).await;
    let dir = TempDir::new("local-tokenizer-mismatch");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let local = format!("local:{}", model_dir().display());
    let mut kvpick = serve(&file, &["--tokenizer", &local, "--tokenizer-parity-ratio", "1"]);

    conversation(&kvpick, &fleet).await;
    let warning = kvpick.wait_log(|v| v["message"].as_str().is_some_and(|m| m.contains("local tokenizer disagrees")));
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["position"], 0, "the built-in tokenizer differs from the first token: {warning}");
    until(&kvpick, "the engine fallback", |s| value(s, "kvpick_tokenizer_engine_fallback", &[]) == 1.0).await;
    let after = scrape(kvpick.metrics).await;
    assert!(parity(&after, "mismatch") >= 1.0);
    // Local tokens never overlap these engines' caches (their hashes are of
    // other tokens); after the switch the engine's own tokens do.
    assert!(value(&after, "kvpick_picked_overlap_tokens_total", &[]) > 0.0, "no overlap after the switch");
    fleet.shutdown().await;
}
