//! `kvpick serve` in Kubernetes mode, as a child process: a kubeconfig
//! pointing at the fake API server, the pool's pods in front of a
//! simulated engine (pod IP 127.0.0.1, its HTTP port as the pool's target
//! port, its KV-event and replay ports as `DYN_EPP_KV_EVENT_*`). Readiness,
//! routing and a pod leaving are seen through the ports a user sees.

use std::time::{Duration, Instant};

use crate::bin_support::{TempDir, WAIT, binary, chat, fleet, scrape, value};
use kvpick_test_support::fake_kube::objects::{pod, pool};
use kvpick_test_support::fake_kube::{APP, FakeKube, Kind, NS, POOL};
use kvpick_test_support::gateway::Gateway;
use serde_json::Value;

fn port_of(zmq: &str) -> String {
    zmq.rsplit(':').next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_to_the_pools_ready_pods_and_keeps_one_that_leaves_ready() {
    let fleet = fleet(1).await;
    let engine = fleet.endpoints()[0].clone();
    let kube = FakeKube::start(NS).await;
    kube.put(Kind::InferencePool, pool(POOL, APP, &[engine.http.port()]));
    kube.put(Kind::Pod, pod("vllm-0", APP, Some("127.0.0.1"), true));

    let dir = TempDir::new("kube");
    let kubeconfig = dir.path("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap_or_else(|e| panic!("{e}"));

    let mut command = binary();
    command
        .arg("serve")
        .env("KUBECONFIG", &kubeconfig)
        .env("DYN_EPP_INFERENCE_POOL_NAME", POOL)
        .env("POD_NAMESPACE", NS)
        .env("DYN_MODEL_NAME", "sim-model")
        .env("DYN_KV_CACHE_BLOCK_SIZE", "16")
        .env("DYN_EPP_TOKENIZER_SERVICE_URL", engine.base_url())
        .env("DYN_EPP_KV_EVENT_PORT", port_of(&engine.events))
        .env("DYN_EPP_KV_EVENT_REPLAY_PORT", port_of(&engine.replay))
        .args(["--listen-address", "127.0.0.1", "--ext-proc-port", "0", "--health-port", "0"])
        .args(["--metrics-port", "0", "--log-format", "json", "--shards", "1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut kvpick = crate::bin_support::Kvpick::spawn(command);
    // Logged before `listening`, so already read.
    let discovery = kvpick.log.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok());
    let discovery = discovery.into_iter().find(|v| v["message"] == "discovery: Kubernetes InferencePool");
    assert_eq!(discovery.map(|v| v["pool"].clone()), Some(Value::from(POOL)), "log:\n{}", kvpick.log.join("\n"));

    let ready = |n: f64| {
        let metrics = kvpick.metrics;
        async move {
            let deadline = Instant::now() + WAIT;
            while value(&scrape(metrics).await, "inference_pool_ready_pods", &[("name", POOL)]) != n {
                assert!(Instant::now() < deadline, "ready pods never became {n}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    ready(1.0).await;
    let gateway = Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    // Long enough to fill whole KV blocks.
    let prompt = "hello from the pool, ".repeat(20);
    let exchange = gateway.post("/v1/chat/completions", &chat(&prompt)).await;
    let exchange = exchange.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((exchange.status, exchange.endpoint), (200, Some(engine.http)));
    // The engine's KV events of that request reach the index.
    let worker = engine.http.to_string();
    let cached =
        || async { value(&scrape(kvpick.metrics).await, "kvpick_worker_cached_blocks", &[("worker", &worker)]) };
    let deadline = Instant::now() + WAIT;
    while cached().await == 0.0 {
        assert!(Instant::now() < deadline, "the engine's blocks never reached the index");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let blocks = cached().await;

    // The pod stops being Ready: no endpoint is left, so the gateway gets 503.
    kube.put(Kind::Pod, pod("vllm-0", APP, Some("127.0.0.1"), false));
    ready(0.0).await;
    let refused = gateway.post("/v1/chat/completions", &chat("anyone there")).await;
    assert_eq!(refused.unwrap_or_else(|e| panic!("{e}")).refused, Some(503));
    let schedulable = value(&scrape(kvpick.metrics).await, "kvpick_worker_schedulable", &[("worker", &worker)]);
    assert_eq!((schedulable, cached().await), (0.0, blocks), "kept, unschedulable, with its cache");

    // Ready again: the same worker, its cache and event subscription kept.
    kube.put(Kind::Pod, pod("vllm-0", APP, Some("127.0.0.1"), true));
    ready(1.0).await;
    assert!(cached().await >= blocks, "the index was cleared");
    let again = gateway.post("/v1/chat/completions", &chat(&prompt)).await;
    let again = again.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((again.status, again.endpoint), (200, Some(engine.http)));

    kvpick.signal("TERM");
    let (status, log) = tokio::task::spawn_blocking(move || (kvpick.wait_exit(), std::mem::take(&mut kvpick.log)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.code(), Some(0));
    let said = |what: &str| log.iter().any(|l| l.contains(what));
    assert!(said("worker unschedulable until its pod is Ready") && said("worker schedulable again"));
    assert!(!said("unsubscribed from KV events") && !said("worker removed"), "log:\n{}", log.join("\n"));
    kube.shutdown().await;
    fleet.shutdown().await;
}
