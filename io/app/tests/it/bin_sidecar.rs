//! Disaggregated serving end to end, per engine: the gateway stand-in →
//! `kvpick serve` (a prefill engine and a decode pod in its workers file)
//! → the decode pod's `kvpick sidecar` → simulated prefill and decode
//! engines speaking vLLM's, SGLang's or TensorRT-LLM's P/D protocol. A
//! long prompt is split, both legs run, the sidecar's hand-off releases
//! the prefill booking and the end of the answer the decode one; a dead
//! prefill engine falls back to a whole run. And `kvpick sidecar` as a
//! process: its settings, its log line, its metrics.

use std::net::SocketAddr;
use std::process::Stdio;

use kvpick_discovery::workers_file::{self, Entry};
use kvpick_sidecar::{EngineKind, Sidecar, SidecarConfig};
use kvpick_sim::{Engine, EngineConfig, Flavour, PdRole};
use kvpick_test_support::gateway::Gateway;
use serde_json::json;

use crate::bin_support::{
    Kvpick, TempDir, binary, engine_config, fixture_model_dir, http_get, scrape, serve, until, value,
};

fn engine(flavour: Flavour, role: PdRole, name: &str) -> EngineConfig {
    let base = EngineConfig {
        name: name.into(),
        pd_role: role,
        model_dir: Some(fixture_model_dir()),
        kv_wait_ms: 5_000,
        ..engine_config()
    };
    if flavour == Flavour::Sglang { Flavour::sglang_events(base) } else { EngineConfig { flavour, ..base } }
}

/// A prefill engine, a decode engine behind an in-process sidecar, and
/// `kvpick serve` with both in its workers file (the decode pod's endpoint
/// is the sidecar's, as a pod's port would be).
struct Chain {
    prefill: Engine,
    decode: Engine,
    sidecar: Sidecar,
    kvpick: Kvpick,
    _dir: TempDir,
}

impl Chain {
    async fn start(flavour: Flavour, kind: EngineKind) -> Chain {
        let prefill =
            Engine::start(engine(flavour, PdRole::Prefill, "prefill")).await.unwrap_or_else(|e| panic!("{e}"));
        let decode = Engine::start(engine(flavour, PdRole::Decode, "decode")).await.unwrap_or_else(|e| panic!("{e}"));
        let sidecar = Sidecar::start(SidecarConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            decode: decode.endpoints().http,
            engine: kind,
            bootstrap_port: prefill.endpoints().bootstrap.map_or(8998, |b| b.port()),
            metrics_listen: None,
            ..SidecarConfig::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let dir = TempDir::new(&format!("sidecar-{}", kind.name()));
        let file = dir.path("workers.json");
        // A drained engine (TensorRT-LLM) is drained through the sidecar.
        let entry = |endpoint: SocketAddr, e: &Engine, role: &str| {
            let ep = e.endpoints();
            let base = Entry::for_engine(kind.name(), endpoint, ep.events.clone(), Some(ep.replay.clone()));
            Entry { role: Some(role.into()), ..base }
        };
        let entries =
            [entry(prefill.endpoints().http, &prefill, "prefill"), entry(sidecar.local_addr(), &decode, "decode")];
        workers_file::write(&file, &entries).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let local = format!("local:{}", fixture_model_dir().display());
        let kvpick = serve(&file, &["--pd-threshold-tokens", "64", "--tokenizer", &local]);
        Chain { prefill, decode, sidecar, kvpick, _dir: dir }
    }

    async fn stop(self) {
        drop(self.kvpick);
        self.sidecar.shutdown().await;
        self.prefill.shutdown().await;
        self.decode.shutdown().await;
    }
}

fn long_chat(tag: &str, stream: bool) -> Vec<u8> {
    let text = format!("{tag}: walk me through the history of the printing press, step by step. ").repeat(20);
    json!({"model": "sim-model", "messages": [{"role": "user", "content": text}], "max_tokens": 6, "stream": stream})
        .to_string()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_engine_is_split_by_kvpick_and_run_by_the_sidecar_with_both_bookings_released() {
    for (flavour, kind) in [
        (Flavour::Vllm, EngineKind::Vllm),
        (Flavour::Sglang, EngineKind::Sglang),
        (Flavour::Trtllm, EngineKind::Trtllm),
    ] {
        let chain = Chain::start(flavour, kind).await;
        let gateway = Gateway::connect(chain.kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
        for stream in [true, false] {
            let exchange = gateway
                .post("/v1/chat/completions", &long_chat(&format!("{}-{stream}", kind.name()), stream))
                .await
                .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            assert_eq!(exchange.status, 200, "{kind:?}: {}", String::from_utf8_lossy(&exchange.body));
            assert_eq!(exchange.endpoint, Some(chain.sidecar.local_addr()), "{kind:?}: decoded on the decode pod");
            assert_eq!(
                exchange.prefiller,
                Some(chain.prefill.endpoints().http),
                "{kind:?}: prefilled on the prefill engine"
            );
            assert_eq!(exchange.handoff.as_deref(), Some("disaggregated"), "{kind:?}");
            let text = String::from_utf8_lossy(&exchange.body);
            if stream {
                assert!(text.contains("data: [DONE]"), "{kind:?}: {text}");
            } else {
                assert!(text.contains("\"content\""), "{kind:?}: {text}");
            }
        }
        until(&chain.kvpick, "both legs released", |s| {
            value(s, "kvpick_prefill_reservations_active", &[]) == 0.0
                && value(s, "kvpick_reservations_active", &[]) == 0.0
        })
        .await;
        let after = scrape(chain.kvpick.metrics).await;
        assert_eq!(value(&after, "kvpick_pd_routes_total", &[("route", "disaggregated")]), 2.0, "{kind:?}");
        let snapshot = chain.sidecar.metrics().snapshot();
        assert_eq!((snapshot.disaggregated, snapshot.aggregated, snapshot.failed), (2, 0, 0), "{kind:?}");
        // The prefill engine handed both prompts over and holds nothing.
        let held = chain.prefill.held_transfers().await.unwrap_or(usize::MAX);
        assert_eq!(held, 0, "{kind:?}");

        // A prompt shorter than the threshold is kept whole, except on
        // SGLang's decode worker, which cannot run it whole: kvpick knows
        // it from the workers file's role and engine, and splits it.
        let short = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        let exchange = gateway
            .post("/v1/chat/completions", short.to_string().as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_eq!(exchange.status, 200, "{kind:?}: {}", String::from_utf8_lossy(&exchange.body));
        let split = kind == EngineKind::Sglang;
        assert_eq!(exchange.prefiller.is_some(), split, "{kind:?}");
        assert_eq!(exchange.handoff.as_deref(), Some(if split { "disaggregated" } else { "aggregated" }), "{kind:?}");

        // The prefill engine dies: kvpick still names it until it learns,
        // the sidecar runs the request whole, and nothing stays booked.
        chain.prefill.shutdown().await;
        let exchange =
            gateway.post("/v1/chat/completions", &long_chat("after", true)).await.unwrap_or_else(|e| panic!("{e}"));
        let body = String::from_utf8_lossy(&exchange.body);
        match (exchange.prefiller.is_some(), kind) {
            // SGLang's decode mode cannot run a request whole: the error.
            (true, EngineKind::Sglang) => {
                assert_eq!(exchange.status, 502, "{body}");
                assert_eq!(exchange.handoff.as_deref(), Some("failed"));
                assert!(body.contains("the prefill leg failed (connect)"), "{body}");
            }
            (true, _) => {
                assert_eq!(exchange.status, 200, "{kind:?}: {body}");
                assert_eq!(exchange.handoff.as_deref(), Some("aggregated"), "{kind:?}");
            }
            (false, _) => assert_eq!(exchange.handoff.as_deref(), Some("aggregated"), "{kind:?}: {body}"),
        }
        // A split run whole: its prompt was booked back on the decode worker.
        let restored = if exchange.prefiller.is_some() && kind != EngineKind::Sglang { 1.0 } else { 0.0 };
        until(&chain.kvpick, "both legs released after the fallback", |s| {
            value(s, "kvpick_prefill_reservations_active", &[]) == 0.0
                && value(s, "kvpick_reservations_active", &[]) == 0.0
                && value(s, "kvpick_prefill_restored_total", &[("result", "restored")]) == restored
        })
        .await;
        chain.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvpick_sidecar_runs_as_a_process_and_refuses_bad_settings() {
    let prefill =
        Engine::start(engine(Flavour::Vllm, PdRole::Prefill, "prefill")).await.unwrap_or_else(|e| panic!("{e}"));
    let decode = Engine::start(engine(Flavour::Vllm, PdRole::Decode, "decode")).await.unwrap_or_else(|e| panic!("{e}"));
    let mut command = binary();
    command
        .args(["sidecar", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--decode", &decode.endpoints().http.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut sidecar = Kvpick::spawn_unwaited(command);
    let serving = sidecar.wait_log(|v| v["message"] == "kvpick sidecar serving");
    let listen: SocketAddr =
        serving["listen"].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{serving}"));
    let metrics: SocketAddr =
        serving["metrics"].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{serving}"));
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = hyper::Request::post(format!("http://{listen}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-prefiller-host-port", prefill.endpoints().http.to_string())
        .body(http_body_util::Full::new(bytes::Bytes::from(long_chat("process", false))))
        .unwrap_or_else(|e| panic!("{e}"));
    let response = client.request(request).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers().get("x-kvpick-pd").and_then(|v| v.to_str().ok()), Some("disaggregated"));
    let (status, text) = http_get(metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert!(text.contains("kvpick_sidecar_requests_total{mode=\"disaggregated\"} 1"), "{text}");
    sidecar.signal("TERM");
    assert!(sidecar.wait_exit().success(), "{:?}", sidecar.drain_log());

    // A bad value names its flag and variable, and exits 2.
    for (args, named) in [
        (vec!["sidecar", "--engine", "tgi"], "KVPICK_SIDECAR_ENGINE"),
        (vec!["sidecar", "--prefill-allow", "10.0.0.1,nonsense"], "KVPICK_SIDECAR_PREFILL_ALLOW"),
        (vec!["sidecar", "--decode", "localhost"], "KVPICK_SIDECAR_DECODE"),
    ] {
        let output = binary().args(&args).output().unwrap_or_else(|e| panic!("{e}"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[test]
fn the_demo_runs_disaggregated_next_to_aggregated() {
    let output = binary()
        .args(["demo", "--disagg", "--conversations", "6", "--concurrency", "3", "--quiet"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let row =
        |name: &str| stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} row: {stdout}"));
    let split: Vec<&str> = row("disaggregated ").split_whitespace().collect();
    assert_eq!(split[1], "6", "{stdout}");
    assert!(split[2].parse::<usize>().is_ok_and(|n| n >= 1), "at least one request split: {stdout}");
    assert!(row("aggregated ").split_whitespace().nth(1) == Some("6"), "{stdout}");
    let refused = binary().args(["demo", "--disagg", "--engine", "sglang"]).output().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(refused.status.code(), Some(2));
}
