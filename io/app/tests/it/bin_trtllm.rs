//! `kvpick serve` in front of simulated `trtllm-serve` engines: no render
//! endpoint (a local tokenizer, the fixture model), KV events drained from
//! `POST /kv_cache_events`. Conversations stick to the engine holding their
//! prefix; an engine restart and an overflowed event buffer each clear the
//! worker's blocks and are counted.

use std::path::Path;

use kvpick_discovery::workers_file::{self, Entry};
use kvpick_sim::{EngineConfig, Flavour, Fleet};

use crate::bin_support::{
    Kvpick, TempDir, conversation, engine_config, fixture_model_dir, scrape, serve, until, value,
};

async fn trtllm_fleet(n: usize, event_buffer_max_size: usize) -> Fleet {
    let base = EngineConfig {
        flavour: Flavour::Trtllm,
        model_dir: Some(fixture_model_dir()),
        event_buffer_max_size,
        ..engine_config()
    };
    Fleet::start(n, &base).await.unwrap_or_else(|e| panic!("fleet: {e}"))
}

/// The fleet as a workers file of `engine: trtllm` entries, without
/// `kv_events`: their drain is found at their endpoint.
fn write_trtllm_workers(path: &Path, fleet: &Fleet) {
    let entries: Vec<Entry> = fleet.endpoints().iter().map(|e| Entry::for_engine("trtllm", e.http, "", None)).collect();
    workers_file::write(path, &entries).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn start(fleet: &Fleet, tag: &str, extra: &[&str]) -> (TempDir, Kvpick) {
    let dir = TempDir::new(tag);
    let file = dir.path("workers.json");
    write_trtllm_workers(&file, fleet);
    let local = format!("local:{}", fixture_model_dir().display());
    let mut args = vec!["--tokenizer", local.as_str()];
    args.extend_from_slice(extra);
    let kvpick = serve(&file, &args);
    (dir, kvpick)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_events_route_conversations_and_a_restart_clears_the_worker() {
    let fleet = trtllm_fleet(2, 1024).await;
    let (_dir, mut kvpick) = start(&fleet, "trtllm", &[]);
    let log = kvpick.drain_log();
    assert!(log.iter().any(|l| l.contains("TensorRT-LLM, which has no tokenizer endpoint")), "start-up lines: {log:?}");
    assert!(log.iter().any(|l| l.contains("\"engine\":\"trtllm\"") && l.contains("/kv_cache_events")), "{log:?}");

    let picked = conversation(&kvpick, &fleet, "geography", 4).await;
    assert!(picked[1..].iter().all(|e| *e == picked[0]), "turns moved: {picked:?}");
    let after = scrape(kvpick.metrics).await;
    assert!(value(&after, "kvpick_kv_event_drains_total", &[]) > 0.0);
    assert!(value(&after, "kvpick_kv_events_applied_total", &[]) > 0.0);
    assert!(value(&after, "kvpick_picked_overlap_tokens_total", &[]) > 0.0, "later turns overlapped");
    assert!(value(&after, "kvpick_prompt_cached_tokens_total", &[]) > 0.0, "the engine reported cache hits");
    assert_eq!(value(&after, "kvpick_kv_events_lost_total", &[]), 0.0);
    assert_eq!(value(&after, "kvpick_kv_event_drain_errors_total", &[]), 0.0);

    // The engine that served restarts: its next answer counts from 0.
    let index = fleet.endpoints().iter().position(|e| e.http == picked[0]).unwrap_or_else(|| panic!("engine"));
    let engine = fleet.get(index).unwrap_or_else(|| panic!("engine {index}"));
    engine.restart(true).await.unwrap_or_else(|e| panic!("restart: {e}"));
    until(&kvpick, "the restart", |s| value(s, "kvpick_kv_event_engine_restarts_total", &[]) >= 1.0).await;
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflowed_event_buffer_is_counted_and_clears_the_worker() {
    // One event kept between polls 3 s apart: a conversation's events
    // overflow it.
    let fleet = trtllm_fleet(1, 1).await;
    let (_dir, kvpick) = start(&fleet, "trtllm-overflow", &["--kv-event-drain-interval-ms", "3000"]);
    conversation(&kvpick, &fleet, "history", 8).await;
    until(&kvpick, "lost events", |s| value(s, "kvpick_kv_events_lost_total", &[]) >= 1.0).await;
    let stats = fleet.get(0).unwrap_or_else(|| panic!("engine")).stats().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.publisher.discarded >= 1, "{:?}", stats.publisher);
    fleet.shutdown().await;
}

/// `kvpick demo --engine mixed`: vLLM and TensorRT-LLM engines behind one
/// kvpick, the table printed, kvpick's own hit rate above round-robin's.
#[test]
fn the_demo_runs_on_a_mixed_fleet() {
    let output = crate::bin_support::binary()
        .args(["demo", "--quiet", "--engine", "mixed", "--engines", "3", "--conversations", "6", "--turns", "3"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("vLLM, TensorRT-LLM and SGLang (in turn)"), "{stdout}");
    let hit_rate = |policy: &str| -> f64 {
        // The table's row: the policy, then the request count.
        let row = |l: &&str| {
            l.strip_prefix(policy)
                .and_then(|rest| rest.split_whitespace().next())
                .is_some_and(|n| n.parse::<u32>().is_ok())
        };
        let line = stdout.lines().find(row).unwrap_or_else(|| panic!("no {policy} row: {stdout}"));
        let percent = line.split_whitespace().nth(2).unwrap_or_default().trim_end_matches('%');
        percent.parse().unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    assert!(hit_rate("kvpick ") > hit_rate("round-robin"), "{stdout}");
    let refused = crate::bin_support::binary()
        .args(["demo", "--engine", "trtllm", "--tokenizer", "builtin"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(refused.status.code(), Some(2), "{}", String::from_utf8_lossy(&refused.stderr));
}
