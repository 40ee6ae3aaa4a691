//! `kvpick serve --tokenizer local:PATH`, the binary as a user runs it, in
//! front of simulated engines that tokenize with a Hugging Face model
//! directory (the fixture model of tests/fixtures/tokenizer): picks need no
//! render round trip, conversations stick to the engine holding their
//! prefix, and the parity sampler agrees with the engine's render. Then the
//! same kvpick in front of engines with a different tokenizer: the sampler
//! catches it, says so once, and the engine tokenizes from then on.

use kvpick_sim::{EngineConfig, Fleet};

use crate::bin_support::{
    TempDir, conversation, engine_config, fixture_model_dir, scrape, serve, until, value, write_workers,
};

async fn fleet_with(n: usize, base: EngineConfig) -> Fleet {
    Fleet::start(n, &base).await.unwrap_or_else(|e| panic!("fleet: {e}"))
}

fn parity(scrape: &prometheus_parse::Scrape, outcome: &str) -> f64 {
    value(scrape, "kvpick_tokenizer_parity_checks_total", &[("outcome", outcome)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_tokens_match_the_engines_and_route_by_overlap() {
    let fleet = fleet_with(2, EngineConfig { model_dir: Some(fixture_model_dir()), ..engine_config() }).await;
    let dir = TempDir::new("local-tokenizer");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let local = format!("local:{}", fixture_model_dir().display());
    let mut kvpick = serve(&file, &["--tokenizer", &local, "--tokenizer-parity-ratio", "1"]);
    let started = kvpick.drain_log().iter().any(|l| l.contains("tokenizer: local, checked against the first worker's"));
    assert!(started, "no start-up line for the local tokenizer");

    let picked = conversation(&kvpick, &fleet, "geography", 4).await;
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
    let local = format!("local:{}", fixture_model_dir().display());
    let mut kvpick = serve(&file, &["--tokenizer", &local, "--tokenizer-parity-ratio", "1"]);

    conversation(&kvpick, &fleet, "geography", 4).await;
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
