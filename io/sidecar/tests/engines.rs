//! The sidecar in front of simulated engines with P/D roles (kvpick-sim),
//! per engine: the protocol's legs, streamed and not; the prefill engine
//! down or slow under each policy; hostile `x-prefiller-host-port` values;
//! client cancels at each stage; h2c and the routes passed through.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvpick_sidecar::metrics::{Aggregated, PrefillFailure};
use kvpick_sidecar::{EngineKind, OnPrefillFailure, PrefillAllow, Sidecar, SidecarConfig};
use kvpick_sim::{Engine, EngineConfig, Flavour, PdRole, TimeModel};
use serde_json::{Value, json};

const FLAVOURS: [(Flavour, EngineKind); 3] =
    [(Flavour::Vllm, EngineKind::Vllm), (Flavour::Sglang, EngineKind::Sglang), (Flavour::Trtllm, EngineKind::Trtllm)];

fn engine(flavour: Flavour, role: PdRole, name: &str) -> EngineConfig {
    let base = EngineConfig {
        name: name.into(),
        num_blocks: 1024,
        default_max_tokens: 8,
        time: TimeModel { time_scale: 50.0, ..TimeModel::default() },
        pd_role: role,
        kv_wait_ms: 5_000,
        ..EngineConfig::default()
    };
    if flavour == Flavour::Sglang { Flavour::sglang_events(base) } else { EngineConfig { flavour, ..base } }
}

struct Pair {
    prefill: Engine,
    decode: Engine,
    sidecar: Sidecar,
}

impl Pair {
    async fn start(flavour: Flavour, kind: EngineKind, tune: impl FnOnce(&mut SidecarConfig)) -> Pair {
        let prefill =
            Engine::start(engine(flavour, PdRole::Prefill, "prefill")).await.unwrap_or_else(|e| panic!("{e}"));
        let decode = Engine::start(engine(flavour, PdRole::Decode, "decode")).await.unwrap_or_else(|e| panic!("{e}"));
        let bootstrap = prefill.endpoints().bootstrap.map_or(8998, |b| b.port());
        let mut config = SidecarConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            decode: decode.endpoints().http,
            engine: kind,
            bootstrap_port: bootstrap,
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..SidecarConfig::default()
        };
        tune(&mut config);
        let sidecar = Sidecar::start(config).await.unwrap_or_else(|e| panic!("{e}"));
        Pair { prefill, decode, sidecar }
    }

    async fn stop(self) {
        self.sidecar.shutdown().await;
        self.prefill.shutdown().await;
        self.decode.shutdown().await;
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A chat request to the sidecar naming `prefiller`.
async fn split(pair: &Pair, tag: &str, stream: bool, prefiller: &str) -> Answer {
    post(pair.sidecar.local_addr(), "/v1/chat/completions", &chat(tag, stream), &[("x-prefiller-host-port", prefiller)])
        .await
}

async fn post(to: SocketAddr, path: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::post(format!("http://{to}{path}")).header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Full::new(Bytes::from(body.to_string()))).unwrap_or_else(|e| panic!("{e}"));
    let response = client.request(request).await.unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes().to_vec()).unwrap_or_else(|e| panic!("body: {e}"));
    Answer { status: parts.status, headers: parts.headers, body }
}

fn long_prompt(tag: &str) -> String {
    (0..300).map(|i| format!("{tag}{i}")).collect::<Vec<_>>().join(" ")
}

fn chat(tag: &str, stream: bool) -> Value {
    json!({"model": "sim-model", "messages": [{"role": "user", "content": long_prompt(tag)}], "max_tokens": 6, "stream": stream})
}

/// The value of the first sample of `name` whose labels include `label`
/// (0 if absent).
fn series(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

async fn scrape(addr: SocketAddr) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri = format!("http://{addr}/metrics").parse().unwrap_or_else(|e| panic!("{e}"));
    let response = client.get(uri).await.unwrap_or_else(|e| panic!("scrape: {e}"));
    let bytes = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never: {what}");
}

/// Nothing left running or held on either engine.
async fn settled(pair: &Pair) {
    for _ in 0..400 {
        let (p, d) = (pair.prefill.stats().await, pair.decode.stats().await);
        if matches!((&p, &d), (Ok(p), Ok(d)) if p.running + p.waiting + d.running + d.waiting == 0 && p.held_transfers == 0)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (p, d) = (pair.prefill.stats().await, pair.decode.stats().await);
    panic!("never idle, nothing held: prefill {p:?}, decode {d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_engine_runs_its_protocol_streamed_and_not() {
    for (flavour, kind) in FLAVOURS {
        let pair = Pair::start(flavour, kind, |_| {}).await;
        let prefiller = pair.prefill.endpoints().http.to_string();
        for stream in [false, true] {
            let tag = format!("{}-{stream}", kind.name());
            let answer = post(
                pair.sidecar.local_addr(),
                "/v1/chat/completions",
                &chat(&tag, stream),
                &[("x-prefiller-host-port", &prefiller)],
            )
            .await;
            assert_eq!(answer.status, 200, "{kind:?} stream={stream}: {}", answer.text());
            assert_eq!(answer.header("x-kvpick-pd"), Some("disaggregated"), "{kind:?}");
            assert!(answer.header("x-kvpick-prefill-ms").and_then(|v| v.parse::<f64>().ok()).is_some());
            if stream {
                assert!(answer.header("content-type").is_some_and(|c| c.starts_with("text/event-stream")));
                assert!(answer.text().trim_end().ends_with("data: [DONE]"), "{kind:?}: {}", answer.text());
            } else {
                let value: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
                let content = value.pointer("/choices/0/message/content").and_then(Value::as_str).unwrap_or("");
                assert!(!content.is_empty(), "{kind:?}: {value}");
            }
        }
        // Both legs' engines: one pull each, nothing held or running after.
        settled(&pair).await;
        let decode_metrics = scrape(pair.decode.endpoints().http).await;
        assert_eq!(
            series(&decode_metrics, "sim:kv_transfers_total", "result=\"ok\""),
            2.0,
            "{kind:?}\n{decode_metrics}"
        );
        let snapshot = pair.sidecar.metrics().snapshot();
        assert_eq!((snapshot.disaggregated, snapshot.aggregated, snapshot.failed), (2, 0, 0), "{kind:?}");
        assert_eq!(snapshot.inflight, 0);
        let exported = scrape(pair.sidecar.metrics_addr().unwrap_or_else(|| panic!("no metrics port"))).await;
        assert!(exported.contains("kvpick_sidecar_requests_total{mode=\"disaggregated\"} 2"), "{exported}");
        pair.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_native_routes_are_split_too() {
    // vLLM's tokens-in, tokens-out route.
    let pair = Pair::start(Flavour::Vllm, EngineKind::Vllm, |_| {}).await;
    let prefiller = pair.prefill.endpoints().http.to_string();
    let tokens: Vec<u32> = (0..200).map(|i| 100 + i).collect();
    let body = json!({"request_id": "g-1", "token_ids": tokens, "model": "sim-model", "stream": false,
        "sampling_params": {"max_tokens": 5, "temperature": 0.0}});
    let answer =
        post(pair.sidecar.local_addr(), "/inference/v1/generate", &body, &[("x-prefiller-host-port", &prefiller)])
            .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-kvpick-pd"), Some("disaggregated"));
    let value: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
    assert!(value.pointer("/choices/0/token_ids").and_then(Value::as_array).is_some_and(|t| !t.is_empty()), "{value}");
    settled(&pair).await;
    pair.stop().await;
    // SGLang's /generate, one prompt and a batch.
    let pair = Pair::start(Flavour::Sglang, EngineKind::Sglang, |_| {}).await;
    let prefiller = pair.prefill.endpoints().http.to_string();
    let one = json!({"text": long_prompt("native"), "sampling_params": {"max_new_tokens": 4}});
    let answer = post(pair.sidecar.local_addr(), "/generate", &one, &[("x-prefiller-host-port", &prefiller)]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-kvpick-pd"), Some("disaggregated"));
    settled(&pair).await;
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_engine_down_runs_the_request_whole_or_fails_by_setting() {
    // A port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string()
    };
    for (flavour, kind) in [(Flavour::Vllm, EngineKind::Vllm), (Flavour::Trtllm, EngineKind::Trtllm)] {
        let pair = Pair::start(flavour, kind, |_| {}).await;
        let answer = split(&pair, "down", true, &closed).await;
        assert_eq!(answer.status, 200, "{kind:?}: the decode engine ran it whole: {}", answer.text());
        assert_eq!(answer.header("x-kvpick-pd"), Some("aggregated"));
        assert_eq!(answer.header("x-kvpick-pd-reason"), Some("prefill_connect"));
        assert_eq!(pair.sidecar.metrics().prefill_failures(PrefillFailure::Connect), 1);
        assert_eq!(pair.sidecar.metrics().aggregated_for(Aggregated::PrefillFailed), 1);
        pair.stop().await;
        let pair = Pair::start(flavour, kind, |c| c.on_prefill_failure = OnPrefillFailure::Fail).await;
        let answer = split(&pair, "down", true, &closed).await;
        assert_eq!(answer.status, 502, "{kind:?}");
        let value: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        // The cause, not the engine's address or answer (those are logged).
        let message = value.pointer("/error/message").and_then(Value::as_str).unwrap_or("");
        assert_eq!(message, "the prefill leg failed (connect)", "{value}");
        assert_eq!(answer.header("x-kvpick-pd"), Some("failed"));
        pair.stop().await;
    }
    // SGLang's decode mode cannot run a request whole: the failure is the
    // answer whatever the policy, and the decode leg sent with it is aborted.
    let pair = Pair::start(Flavour::Sglang, EngineKind::Sglang, |_| {}).await;
    let answer = split(&pair, "down", true, &closed).await;
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert_eq!(answer.header("x-kvpick-pd"), Some("failed"));
    settled(&pair).await;
    pair.stop().await;
    // A prefill engine that never answers: the timeout.
    let pair = Pair::start(Flavour::Vllm, EngineKind::Vllm, |c| {
        c.prefill_timeout = Duration::from_millis(300);
        c.on_prefill_failure = OnPrefillFailure::Fail;
    })
    .await;
    pair.prefill.set_stalled(true).unwrap_or_else(|e| panic!("{e}"));
    let prefiller = pair.prefill.endpoints().http.to_string();
    let answer = post(
        pair.sidecar.local_addr(),
        "/v1/chat/completions",
        &chat("slow", false),
        &[("x-prefiller-host-port", &prefiller)],
    )
    .await;
    assert_eq!(answer.status, 504, "{}", answer.text());
    assert_eq!(answer.header("x-kvpick-pd-reason"), Some("timeout"));
    pair.prefill.set_stalled(false).unwrap_or_else(|e| panic!("{e}"));
    // The timed-out leg's connection was dropped: the prefill engine aborted it.
    settled(&pair).await;
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_prefiller_values_run_the_request_whole_and_are_counted() {
    let pair = Pair::start(Flavour::Vllm, EngineKind::Vllm, |c| {
        c.prefill_allow = PrefillAllow::List(vec![SocketAddr::from(([127, 0, 0, 1], 0))]);
    })
    .await;
    let front = pair.sidecar.local_addr();
    for (value, reason) in [
        ("prefill.example:8000", "invalid_prefiller"),
        ("http://127.0.0.1:1/", "invalid_prefiller"),
        ("0.0.0.0:8000", "invalid_prefiller"),
        ("127.0.0.1:1,", "invalid_prefiller"),
        ("10.1.2.3:8000", "denied_prefiller"),
    ] {
        let answer =
            post(front, "/v1/chat/completions", &chat("hostile", false), &[("x-prefiller-host-port", value)]).await;
        assert_eq!(answer.status, 200, "{value}: {}", answer.text());
        assert_eq!(
            (answer.header("x-kvpick-pd"), answer.header("x-kvpick-pd-reason")),
            (Some("aggregated"), Some(reason)),
            "{value}"
        );
    }
    // Naming the decode engine itself: nothing to split.
    let itself = pair.decode.endpoints().http.to_string();
    let answer = post(front, "/v1/chat/completions", &chat("self", false), &[("x-prefiller-host-port", &itself)]).await;
    assert_eq!(answer.header("x-kvpick-pd-reason"), Some("prefiller_is_local"));
    // No header: whole, as the EPP decided.
    let answer = post(front, "/v1/chat/completions", &chat("none", false), &[]).await;
    assert_eq!(answer.header("x-kvpick-pd-reason"), Some("no_prefiller"));
    // A client's own transfer parameters never reach the decode engine:
    // with them it would pull from wherever they point.
    let mut lying = chat("lying", false);
    lying["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_host": "10.9.9.9", "remote_port": 1,
        "remote_engine_id": "x", "remote_block_ids": [1], "remote_request_id": "x"});
    let answer = post(front, "/v1/chat/completions", &lying, &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let metrics = pair.sidecar.metrics();
    assert_eq!(metrics.aggregated_for(Aggregated::InvalidPrefiller), 4);
    assert_eq!(metrics.aggregated_for(Aggregated::DeniedPrefiller), 1);
    // Not JSON: passed as it came; the engine answers its own 400.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{front}/v1/chat/completions"))
        .header("x-prefiller-host-port", pair.prefill.endpoints().http.to_string())
        .body(Full::new(Bytes::from_static(b"{not json")))
        .unwrap_or_else(|e| panic!("{e}"));
    let response = client.request(request).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status(), 400);
    assert_eq!(metrics.aggregated_for(Aggregated::BodyNotJson), 1);
    settled(&pair).await;
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancel_aborts_both_legs_at_each_stage() {
    for (flavour, kind) in FLAVOURS {
        let pair = Pair::start(flavour, kind, |_| {}).await;
        let front = pair.sidecar.local_addr();
        let prefiller = pair.prefill.endpoints().http.to_string();
        // During the prefill leg: the prefill engine is stalled, the client gives up.
        pair.prefill.set_stalled(true).unwrap_or_else(|e| panic!("{e}"));
        let body = chat("cancel-early", true);
        let gave_up = tokio::time::timeout(
            Duration::from_millis(400),
            post(front, "/v1/chat/completions", &body, &[("x-prefiller-host-port", &prefiller)]),
        )
        .await;
        assert!(gave_up.is_err(), "{kind:?}: answered while the prefill engine was stalled");
        eventually("the sidecar saw the cancel", || async { pair.sidecar.metrics().snapshot().cancelled_prefill == 1 })
            .await;
        pair.prefill.set_stalled(false).unwrap_or_else(|e| panic!("{e}"));
        settled(&pair).await;
        // While the answer streams: read the first chunk, then hang up.
        let mut long = chat("cancel-late", true);
        long["max_tokens"] = json!(2_000);
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let request = Request::post(format!("http://{front}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-prefiller-host-port", &prefiller)
            .body(Full::new(Bytes::from(long.to_string())))
            .unwrap_or_else(|e| panic!("{e}"));
        let response = client.request(request).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let first = body.frame().await;
        assert!(first.is_some_and(|f| f.is_ok()), "{kind:?}: no first chunk");
        drop((body, client));
        eventually("the sidecar saw the late cancel", || async {
            pair.sidecar.metrics().snapshot().cancelled_decode == 1
        })
        .await;
        settled(&pair).await;
        assert_eq!(pair.sidecar.metrics().snapshot().inflight, 0);
        pair.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_routes_pass_through_and_h2c_clients_are_served() {
    let pair = Pair::start(Flavour::Vllm, EngineKind::Vllm, |_| {}).await;
    let front = pair.sidecar.local_addr();
    let h2 = Client::builder(TokioExecutor::new()).http2_only(true).build_http::<Full<Bytes>>();
    let uri: hyper::Uri = format!("http://{front}/v1/models").parse().unwrap_or_else(|e| panic!("{e}"));
    let response = h2.get(uri).await.unwrap_or_else(|e| panic!("h2c: {e}"));
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    let models: Value =
        serde_json::from_slice(&response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default())
            .unwrap_or_default();
    assert_eq!(models.pointer("/data/0/id"), Some(&json!("sim-model")), "{models}");
    // A split request over h2c.
    let request = Request::post(format!("http://{front}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-prefiller-host-port", pair.prefill.endpoints().http.to_string())
        .body(Full::new(Bytes::from(chat("h2", true).to_string())))
        .unwrap_or_else(|e| panic!("{e}"));
    let response = h2.request(request).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.headers().get("x-kvpick-pd").and_then(|v| v.to_str().ok()), Some("disaggregated"));
    let text = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    assert!(String::from_utf8_lossy(&text).contains("data: [DONE]"));
    assert_eq!(pair.sidecar.metrics().snapshot().passthrough, 1);
    settled(&pair).await;
    pair.stop().await;
}
