//! The `kvpick` binary as a user runs it: a child process in static mode
//! in front of simulated vLLM engines (real HTTP render tokenizer, real
//! ZMQ KV events), driven by a miniature gateway over ext_proc.

use std::time::{Duration, Instant};

use crate::bin_support::{TempDir, WAIT, binary, chat, fleet, scrape, serve, value, write_workers};
use kvpick_test_support::gateway::Gateway;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_requests_and_metrics_move() {
    let fleet = fleet(2).await;
    let dir = TempDir::new("serve");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let kvpick = serve(&file, &[]);
    let before = scrape(kvpick.metrics).await;
    assert_eq!(value(&before, "inference_pool_ready_pods", &[("name", "static")]), 2.0);
    assert_eq!(value(&before, "inference_objective_request_total", &[]), 0.0);

    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let endpoints: Vec<_> = fleet.endpoints().iter().map(|e| e.http).collect();
    let shared = "the same long system prompt every turn of this conversation repeats ".repeat(12);
    let mut picked = Vec::new();
    for turn in 0..4 {
        let text = format!("{shared} turn {turn}");
        let exchange = gateway.post("/v1/chat/completions", &chat(&text)).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exchange.status, 200, "{}", String::from_utf8_lossy(&exchange.body));
        let endpoint = exchange.endpoint.unwrap_or_else(|| panic!("no pick"));
        assert!(endpoints.contains(&endpoint), "picked {endpoint}, not an engine");
        assert!(String::from_utf8_lossy(&exchange.body).contains("[DONE]"), "the client got the whole stream");
        picked.push(endpoint);
        // Let the engine's KV events reach kvpick before the next turn.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Same prefix every turn: after the first, kvpick keeps it where it is cached.
    assert!(picked[1..].iter().all(|e| *e == picked[0]), "turns moved: {picked:?}");

    let after = scrape(kvpick.metrics).await;
    let model = [("model_name", "sim-model")];
    assert_eq!(value(&after, "inference_objective_request_total", &model), 4.0);
    assert_eq!(value(&after, "kvpick_requests_total", &[("code", "200")]), 4.0);
    assert!(value(&after, "inference_objective_input_tokens_count", &[]) >= 4.0);
    assert!(value(&after, "inference_extension_scheduler_e2e_duration_seconds_count", &[]) >= 4.0);
    assert!(value(&after, "kvpick_kv_events_applied_total", &[]) > 0.0, "KV events reached the shards");
    assert!(value(&after, "kvpick_index_entries", &[]) > 0.0);
    // serve always sets a budget; it leaves room for far more than a few turns.
    assert!(value(&after, "kvpick_index_max_entries", &[]) > value(&after, "kvpick_index_entries", &[]));
    assert!(value(&after, "kvpick_picked_overlap_tokens_total", &[]) > 0.0, "later turns overlapped");
    assert!(value(&after, "kvpick_prompt_cached_tokens_total", &[]) > 0.0, "the engine reported cache hits");
    // Every booking was freed when its response ended.
    let deadline = Instant::now() + WAIT;
    loop {
        let now = scrape(kvpick.metrics).await;
        if value(&now, "kvpick_reservations_active", &[]) == 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "bookings left after every response ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fleet.shutdown().await;
}

#[test]
fn a_bad_setting_stops_start_up_with_its_name() {
    let output = binary()
        .args(["serve", "--workers-file", "/nonexistent.yaml"])
        .env("DYN_EPP_MAX_INFLIGHT_REQUESTS", "lots")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.trim(),
        "kvpick: DYN_EPP_MAX_INFLIGHT_REQUESTS=\"lots\" is not valid: expected a whole number of at least 1"
    );

    let output = binary().args(["serve", "--workers-file", "w.yaml", "--block-size", "0"]).output();
    let output = output.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--block-size=\"0\" is not valid"));

    let output = binary()
        .args(["serve", "--workers-file", "w.yaml"])
        .env("DYN_ROUTER_QUEUE_THRESHOLD", "4")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("DYN_EPP_MAX_NUM_BATCHED_TOKENS is required"));

    // A workers file that does not exist is a start-up failure (exit 1).
    let output = binary()
        .args(["serve", "--workers-file", "/nonexistent/kvpick-workers.yaml", "--log-format", "json"])
        .args(["--ext-proc-port", "0", "--health-port", "0", "--metrics-port", "0", "--listen-address", "127.0.0.1"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("kvpick-workers.yaml"));
}

#[test]
fn help_lists_every_variable_with_its_default() {
    let output = binary().args(["serve", "--help"]).output().unwrap_or_else(|e| panic!("{e}"));
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for setting in kvpick_app::app::settings::SETTINGS {
        assert!(help.contains(&format!("--{}", setting.flag)), "--{} missing from --help", setting.flag);
        assert!(help.contains(setting.var), "{} missing from --help", setting.var);
    }
    assert!(help.contains("[default: 1024]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_drains_and_exits_zero() {
    // Real time: the 300-token answer takes over a second.
    let base = kvpick_sim::EngineConfig {
        time: kvpick_sim::TimeModel { time_scale: 1.0, ..kvpick_sim::TimeModel::default() },
        ..crate::bin_support::engine_config()
    };
    let fleet = kvpick_sim::Fleet::start(1, &base).await.unwrap_or_else(|e| panic!("{e}"));
    let dir = TempDir::new("sigterm");
    let file = dir.path("workers.yaml");
    write_workers(&file, &fleet, &[0]);
    let mut kvpick = serve(&file, &["--shutdown-grace-ms", "10000"]);
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    // A request in flight while the stop comes: it must still complete.
    let request = tokio::spawn({
        let gateway = gateway.clone();
        async move {
            let body = serde_json::json!({
                "model": "sim-model", "max_tokens": 300, "stream": true,
                "messages": [{"role": "user", "content": "a slow answer please"}],
            });
            gateway.post("/v1/chat/completions", body.to_string().as_bytes()).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    kvpick.signal("TERM");
    let exchange = request.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exchange.status, 200);
    assert!(String::from_utf8_lossy(&exchange.body).contains("[DONE]"), "the stream finished during the drain");
    let status = tokio::task::spawn_blocking(move || {
        let status = kvpick.wait_exit();
        (status, kvpick.drain_log().join("\n"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.0.code(), Some(0), "log:\n{}", status.1);
    assert!(status.1.contains("stop requested") && status.1.contains("\"bookings_left\":0"), "log:\n{}", status.1);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_the_workers_file_adds_and_removes_workers() {
    let fleet = fleet(2).await;
    let endpoints: Vec<_> = fleet.endpoints().iter().map(|e| e.http).collect();
    let dir = TempDir::new("edit");
    let file = dir.path("workers.yaml");
    write_workers(&file, &fleet, &[0]);
    let kvpick = serve(&file, &[]);
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let ready = |n: f64| {
        let metrics = kvpick.metrics;
        async move {
            let deadline = Instant::now() + WAIT;
            while value(&scrape(metrics).await, "inference_pool_ready_pods", &[]) != n {
                assert!(Instant::now() < deadline, "ready pods never became {n}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    ready(1.0).await;
    let picks = |n: usize| {
        let gateway = gateway.clone();
        async move {
            let mut seen = Vec::new();
            for i in 0..n {
                let body = chat(&format!("distinct prompt number {i} {}", "x ".repeat(i * 7)));
                let exchange = gateway.post("/v1/chat/completions", &body).await.unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(exchange.status, 200);
                seen.extend(exchange.endpoint);
            }
            seen
        }
    };
    assert!(picks(4).await.iter().all(|e| *e == endpoints[0]));

    write_workers(&file, &fleet, &[0, 1]);
    ready(2.0).await;
    // Concurrent requests spread by load onto the newcomer.
    let (a, b) = tokio::join!(picks(6), picks(6));
    let all: Vec<_> = a.into_iter().chain(b).collect();
    assert!(all.contains(&endpoints[1]), "the added worker got no traffic: {all:?}");

    write_workers(&file, &fleet, &[1]);
    ready(1.0).await;
    assert!(picks(4).await.iter().all(|e| *e == endpoints[1]), "the removed worker still got traffic");

    // A broken edit keeps the workers as they were.
    std::fs::write(&file, "- endpoint: [this is not yaml").unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(value(&scrape(kvpick.metrics).await, "inference_pool_ready_pods", &[]), 1.0);
    assert!(picks(1).await.iter().all(|e| *e == endpoints[1]));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_writes_a_flame_graph_at_exit() {
    let fleet = fleet(1).await;
    let dir = TempDir::new("profile");
    let file = dir.path("workers.yaml");
    write_workers(&file, &fleet, &[0]);
    let svg = dir.path("run.svg");
    let svg_arg = svg.display().to_string();
    let mut kvpick = serve(&file, &["--profile", &svg_arg]);
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    for i in 0..20 {
        let exchange = gateway.post("/v1/chat/completions", &chat(&format!("profile me {i}"))).await;
        assert_eq!(exchange.unwrap_or_else(|e| panic!("{e}")).status, 200);
    }
    kvpick.signal("INT");
    let status = tokio::task::spawn_blocking(move || kvpick.wait_exit()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(&svg).unwrap_or_else(|e| panic!("{}: {e}", svg.display()));
    assert!(text.contains("<svg") && text.contains("</svg>"), "not an SVG: {}", &text[..text.len().min(200)]);
    fleet.shutdown().await;
}

/// An engine whose `--block-size` is not kvpick's: its events are refused,
/// the worker is flagged with its block size, a warning names both values,
/// and with no other worker kvpick stops being ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_with_another_block_size_is_named_and_not_ready() {
    use kvpick_proto::health::health_check_response::ServingStatus;
    use kvpick_proto::health::{HealthCheckRequest, health_client::HealthClient};

    let fleet = fleet(1).await;
    let dir = TempDir::new("block-size");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0]);
    // The simulated engines use blocks of 16 tokens.
    let mut kvpick = serve(&file, &["--block-size", "32"]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", kvpick.health))
        .unwrap_or_else(|e| panic!("{e}"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let health = HealthClient::new(channel);
    let readiness = |mut health: HealthClient<tonic::transport::Channel>| async move {
        let request = HealthCheckRequest { service: "readiness".into() };
        let status = health.check(request).await.unwrap_or_else(|e| panic!("{e}")).into_inner().status;
        ServingStatus::try_from(status).unwrap_or_else(|e| panic!("{e}"))
    };
    let deadline = Instant::now() + WAIT;
    while readiness(health.clone()).await != ServingStatus::Serving {
        assert!(Instant::now() < deadline, "never ready with one worker");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let text = "a prompt long enough to fill several blocks of sixteen tokens each ".repeat(6);
    let exchange = gateway.post("/v1/chat/completions", &chat(&text)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exchange.status, 200);
    let warning = kvpick.wait_log(|v| v["level"] == "WARN" && v["engine_block_size"] == 16);
    let message = warning["message"].as_str().unwrap_or_default().to_owned();
    let endpoint = fleet.endpoints()[0].http.to_string();
    assert!(
        message.contains(&format!("worker {endpoint} publishes KV blocks of 16 tokens but kvpick hashes blocks of 32")),
        "{message}"
    );
    let metrics = scrape(kvpick.metrics).await;
    assert_eq!(value(&metrics, "kvpick_worker_block_size_mismatch", &[("worker", &endpoint)]), 16.0);
    assert!(value(&metrics, "kvpick_index_events_rejected_total", &[]) > 0.0);
    let deadline = Instant::now() + WAIT;
    while readiness(health.clone()).await != ServingStatus::NotServing {
        assert!(Instant::now() < deadline, "still ready with its only worker unusable");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(health);
    fleet.shutdown().await;
}

/// Every query of the Grafana dashboard (deploy/grafana/kvpick.json) names
/// metrics the binary exports, after a little traffic (streamed answers, a
/// refused request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_queries_only_exported_metrics() {
    let dashboard_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/kvpick.json");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&dashboard_path).unwrap_or_else(|e| panic!("{}: {e}", dashboard_path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dashboard_path.display()));
    let mut queried = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap_or_else(|| panic!("no panels")) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_else(|| panic!("a target without expr in {panel}"));
            let mut rest = expr;
            while let Some(at) = rest.find("kvpick_").into_iter().chain(rest.find("inference_")).min() {
                let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                rest = &rest[at + name.len()..];
                queried.insert(name);
            }
        }
    }
    assert!(queried.len() > 20, "{queried:?}");

    let fleet = fleet(2).await;
    let dir = TempDir::new("dashboard");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let kvpick = serve(&file, &[]);
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    for turn in 0..3 {
        let text = format!("{} turn {turn}", "a system prompt repeated for the dashboard's sake ".repeat(8));
        let exchange = gateway.post("/v1/chat/completions", &chat(&text)).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exchange.status, 200);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let refused = gateway.post("/v1/chat/completions", b"{not json").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(refused.status, 400);

    let (status, text) = crate::bin_support::http_get(kvpick.metrics, "/metrics").await;
    assert_eq!(status, 200);
    let exported: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = queried.iter().filter(|name| !exported.contains(name.as_str())).collect();
    assert!(missing.is_empty(), "the dashboard queries metrics kvpick does not export: {missing:?}");
    fleet.shutdown().await;
}

/// The debug view: off by default; with `--debug-endpoints`, the workers
/// and an explained pick (the worker holding the prefix picked, nothing
/// booked), as JSON and as `kvpick inspect`'s tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_view_explains_a_pick_without_booking() {
    let fleet = fleet(2).await;
    let dir = TempDir::new("debug");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let off = serve(&file, &[]);
    assert_eq!(crate::bin_support::http_get(off.metrics, "/debug/workers").await.0, 404);
    drop(off);

    let kvpick = serve(&file, &["--debug-endpoints", "true"]);
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let text = "a long system prompt that the next request will share, word after word ".repeat(10);
    let exchange = gateway.post("/v1/chat/completions", &chat(&text)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exchange.status, 200);
    let served = exchange.endpoint.unwrap_or_else(|| panic!("no pick")).to_string();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (status, body) = crate::bin_support::http_get(kvpick.metrics, "/debug/workers").await;
    assert_eq!(status, 200, "{body}");
    let workers: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let rows = workers["workers"].as_array().unwrap_or_else(|| panic!("{workers}"));
    assert_eq!(rows.len(), 2);
    let holder = rows.iter().find(|w| w["worker"] == served.as_str()).unwrap_or_else(|| panic!("{workers}"));
    assert!(holder["cached_blocks"].as_u64().unwrap_or(0) > 0, "{workers}");

    // The same prompt, explained: the holder is picked for its overlap.
    let request = dir.path("request.json");
    std::fs::write(&request, chat(&format!("{text} and then a new question"))).unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://{}", kvpick.metrics);
    let out = binary().args(["inspect", &url, "--explain"]).arg(&request).output().unwrap_or_else(|e| panic!("{e}"));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains(&format!("{served} <- picked")), "{table}");
    assert!(table.contains("ns of predicted time to first token"), "{table}");
    let out = binary().args(["inspect", &url]).output().unwrap_or_else(|e| panic!("{e}"));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.contains(&served) && table.contains("cached blk"), "{table}");
    // Explaining booked nothing.
    let metrics = scrape(kvpick.metrics).await;
    assert_eq!(value(&metrics, "kvpick_reservations_active", &[]), 0.0);
    assert_eq!(value(&metrics, "kvpick_requests_total", &[("code", "200")]), 1.0);
    fleet.shutdown().await;
}
