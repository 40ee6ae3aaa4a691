//! What the engines receive, read off the wire by capturing servers: the
//! legs' bodies and headers, byte for byte where the protocol fixes them,
//! and no orchestration or hop-by-hop header on any of them.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvpick_sidecar::{EngineKind, Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request as it arrived: the head's lines and the body.
#[derive(Clone, Debug)]
struct Seen {
    head: Vec<String>,
    body: Value,
    /// The body as it came, byte for byte.
    raw: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<String> {
        self.head.iter().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

/// An HTTP/1.1 server that records each request and answers `answer`.
async fn capture(answer: &'static str) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    capture_with("200 OK", answer).await
}

/// [`capture`] with another status line.
async fn capture_with(status: &'static str, answer: &'static str) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    let Ok(n) = stream.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                    let head: Vec<String> = String::from_utf8_lossy(&buf[..end]).lines().map(str::to_owned).collect();
                    let length: usize = head
                        .iter()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    while buf.len() < end + 4 + length {
                        let Ok(n) = stream.read(&mut chunk).await else { return };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let bytes = &buf[end + 4..end + 4 + length];
                    let body = serde_json::from_slice(bytes).unwrap_or(Value::Null);
                    let raw = String::from_utf8_lossy(bytes).into_owned();
                    log.lock().unwrap_or_else(|e| e.into_inner()).push(Seen { head, body, raw });
                    buf.drain(..end + 4 + length);
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if stream.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

const NIXL_ANSWER: &str = r#"{"id":"cmpl-p","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[0,1,2,3]],"remote_engine_id":"e-1","remote_request_id":"r-1","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1,"remote_num_tokens":61,"remote_blocks_expiry_time":1767225600.5}}"#;

const TRTLLM_ANSWER: &str = r#"{"id":"c-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length","disaggregated_params":{"request_type":"context_only","first_gen_tokens":[42],"ctx_request_id":7,"encoded_opaque_state":"AAEC","draft_tokens":null}}]}"#;

async fn sidecar(decode: SocketAddr, engine: EngineKind) -> Sidecar {
    let config = SidecarConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        decode,
        engine,
        bootstrap_port: 8998,
        metrics_listen: None,
        ..SidecarConfig::default()
    };
    Sidecar::start(config).await.unwrap_or_else(|e| panic!("{e}"))
}

async fn send(front: SocketAddr, body: &Value, prefiller: Option<SocketAddr>) -> u16 {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::post(format!("http://{front}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-gateway-destination-endpoint", "10.0.0.2:8000")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "1")
        .header("authorization", "Bearer client")
        .header("x-request-id", "req-42");
    if let Some(p) = prefiller {
        request = request.header("x-prefiller-host-port", p.to_string());
    }
    let request = request.body(Full::new(Bytes::from(body.to_string()))).unwrap_or_else(|e| panic!("{e}"));
    let response = client.request(request).await.unwrap_or_else(|e| panic!("{e}"));
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

fn assert_clean(seen: &Seen) {
    for name in ["x-prefiller-host-port", "x-gateway-destination-endpoint", "x-hop", "keep-alive"] {
        assert_eq!(seen.header(name), None, "{name} reached an engine: {:?}", seen.head);
    }
    assert_eq!(seen.header("authorization").as_deref(), Some("Bearer client"), "end-to-end headers are kept");
    assert_eq!(seen.header("x-request-id").as_deref(), Some("req-42"), "both legs carry the client's id");
}

fn client_body() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true,
        "stream_options": {"include_usage": true}, "max_tokens": 300, "min_tokens": 2, "temperature": 0.5})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_legs_carry_exactly_what_the_nixl_proxy_sends() {
    let (prefill, prefill_seen) = capture(NIXL_ANSWER).await;
    let (decode, decode_seen) = capture(r#"{"choices":[]}"#).await;
    let sidecar = sidecar(decode, EngineKind::Vllm).await;
    assert_eq!(send(sidecar.local_addr(), &client_body(), Some(prefill)).await, 200);
    let p = prefill_seen.lock().unwrap_or_else(|e| e.into_inner())[0].clone();
    let d = decode_seen.lock().unwrap_or_else(|e| e.into_inner())[0].clone();
    assert_eq!(p.head[0], "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(
        p.body,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false, "max_tokens": 1,
            "temperature": 0.5, "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
            "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}})
    );
    let answer: Value = serde_json::from_str(NIXL_ANSWER).unwrap_or_default();
    let mut expected = client_body();
    expected["kv_transfer_params"] = answer["kv_transfer_params"].clone();
    assert_eq!(d.body, expected, "the client's request with the prefill's parameters, verbatim");
    assert_clean(&p);
    assert_clean(&d);
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_legs_are_context_only_then_generation_only() {
    let (prefill, prefill_seen) = capture(TRTLLM_ANSWER).await;
    let (decode, decode_seen) = capture(r#"{"choices":[]}"#).await;
    let sidecar = sidecar(decode, EngineKind::Trtllm).await;
    assert_eq!(send(sidecar.local_addr(), &client_body(), Some(prefill)).await, 200);
    let p = prefill_seen.lock().unwrap_or_else(|e| e.into_inner())[0].clone();
    let d = decode_seen.lock().unwrap_or_else(|e| e.into_inner())[0].clone();
    let mut context = client_body();
    context["stream"] = json!(false);
    context.as_object_mut().map(|o| o.remove("stream_options"));
    context["disaggregated_params"] = json!({"request_type": "context_only"});
    assert_eq!(p.body, context);
    let mut generation = client_body();
    generation["disaggregated_params"] = json!({"request_type": "generation_only", "first_gen_tokens": [42],
        "ctx_request_id": 7, "encoded_opaque_state": "AAEC", "draft_tokens": null});
    assert_eq!(d.body, generation);
    assert_clean(&p);
    assert_clean(&d);
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_sends_one_body_with_one_room_to_both() {
    let (prefill, prefill_seen) = capture(r#"{"choices":[]}"#).await;
    let (decode, decode_seen) = capture(r#"{"choices":[]}"#).await;
    let sidecar = sidecar(decode, EngineKind::Sglang).await;
    assert_eq!(send(sidecar.local_addr(), &client_body(), Some(prefill)).await, 200);
    let p = prefill_seen.lock().unwrap_or_else(|e| e.into_inner())[0].clone();
    let d = decode_seen.lock().unwrap_or_else(|e| e.into_inner())[0].clone();
    assert_eq!(p.body, d.body, "the same body to both");
    assert_eq!(p.body["bootstrap_host"], json!("127.0.0.1"));
    assert_eq!(p.body["bootstrap_port"], json!(8998));
    assert!(p.body["bootstrap_room"].as_u64().is_some_and(|r| r <= i64::MAX as u64));
    let mut rest = p.body.clone();
    for k in ["bootstrap_host", "bootstrap_port", "bootstrap_room"] {
        rest.as_object_mut().map(|o| o.remove(k));
    }
    assert_eq!(rest, client_body(), "otherwise the client's body");
    assert_clean(&p);
    assert_clean(&d);
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_and_passed_through_requests_reach_the_engine_clean() {
    let (decode, decode_seen) = capture(r#"{"data":[]}"#).await;
    let sidecar = sidecar(decode, EngineKind::Vllm).await;
    assert_eq!(send(sidecar.local_addr(), &client_body(), None).await, 200);
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::get(format!("http://{}/v1/models?x=1", sidecar.local_addr()))
        .header("x-prefiller-host-port", "10.0.0.1:8000")
        .header("x-request-id", "req-42")
        .header("authorization", "Bearer client")
        .body(Full::new(Bytes::new()))
        .unwrap_or_else(|e| panic!("{e}"));
    let response = client.request(request).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status(), 200);
    let seen = decode_seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, client_body(), "a whole request's body as the client sent it");
    assert_clean(&seen[0]);
    assert_eq!(seen[1].head[0], "GET /v1/models?x=1 HTTP/1.1");
    assert_clean(&seen[1]);
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_cap_is_refused_before_any_engine_sees_it() {
    let (decode, decode_seen) = capture(r#"{"choices":[]}"#).await;
    let config = SidecarConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        decode,
        max_request_bytes: 1024,
        metrics_listen: None,
        ..SidecarConfig::default()
    };
    let sidecar = Sidecar::start(config).await.unwrap_or_else(|e| panic!("{e}"));
    let big = json!({"model": "m", "prompt": "x".repeat(2048)});
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{}/v1/completions", sidecar.local_addr()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(big.to_string())))
        .unwrap_or_else(|e| panic!("{e}"));
    let response = client.request(request).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status(), 413);
    let body = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let error: Value = serde_json::from_slice(&body).unwrap_or_default();
    assert_eq!(error.pointer("/error/code"), Some(&json!(413)), "{error}");
    assert!(decode_seen.lock().unwrap_or_else(|e| e.into_inner()).is_empty());
    assert_eq!(sidecar.metrics().snapshot().failed, 1);
    sidecar.shutdown().await;
}

/// A server that takes connections and never answers.
async fn silent() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    addr
}

async fn post_to(front: SocketAddr, path: &str, prefiller: SocketAddr) -> (u16, Option<String>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{front}{path}"))
        .header("content-type", "application/json")
        .header("x-prefiller-host-port", prefiller.to_string())
        .body(Full::new(Bytes::from(client_body().to_string())))
        .unwrap_or_else(|e| panic!("{e}"));
    let response = client.request(request).await.unwrap_or_else(|e| panic!("{e}"));
    let handoff = response.headers().get("x-kvpick-pd").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    (status, handoff)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_engines_refusal_is_the_answer_marked_failed() {
    // vLLM: the prefill handed over, the decode engine refused (a failed pull).
    let (prefill, _) = capture(NIXL_ANSWER).await;
    let (decode, _) = capture_with("500 Internal Server Error", r#"{"error":{"message":"KV load failed"}}"#).await;
    let vllm = sidecar(decode, EngineKind::Vllm).await;
    assert_eq!(post_to(vllm.local_addr(), "/v1/chat/completions", prefill).await, (500, Some("failed".into())));
    assert_eq!(vllm.metrics().snapshot().failed, 1);
    vllm.shutdown().await;
    // SGLang: the decode engine refuses at once while the prefill would wait
    // for it forever: its refusal comes back now, not a timeout later.
    let (decode, _) = capture_with("400 Bad Request", r#"{"error":{"message":"no room"}}"#).await;
    let sglang = sidecar(decode, EngineKind::Sglang).await;
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        post_to(sglang.local_addr(), "/v1/chat/completions", silent().await),
    )
    .await;
    assert_eq!(answered.ok(), Some((400, Some("failed".into()))));
    sglang.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_path_is_the_route_the_engine_would_serve() {
    let (prefill, prefill_seen) = capture(NIXL_ANSWER).await;
    let (decode, decode_seen) = capture(r#"{"choices":[]}"#).await;
    let sidecar = sidecar(decode, EngineKind::Vllm).await;
    assert_eq!(
        post_to(sidecar.local_addr(), "/v1/chat/%63ompletions", prefill).await,
        (200, Some("disaggregated".into()))
    );
    assert_eq!(prefill_seen.lock().unwrap_or_else(|e| e.into_inner()).len(), 1, "split like the plain path");
    assert!(decode_seen.lock().unwrap_or_else(|e| e.into_inner())[0].body.get("kv_transfer_params").is_some());
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_legs_keep_the_clients_nested_key_order() {
    // A tool's schema, its properties in the client's order (not sorted):
    // the engines' chat templates render them in that order.
    let tools = r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"number"}}}}}]"#;
    let body =
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tools":{tools},"stream":true}}"#);
    for (engine, answer) in [(EngineKind::Vllm, NIXL_ANSWER), (EngineKind::Trtllm, TRTLLM_ANSWER)] {
        let (prefill, prefill_seen) = capture(answer).await;
        let (decode, decode_seen) = capture(r#"{"choices":[]}"#).await;
        let sidecar = sidecar(decode, engine).await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let request = Request::post(format!("http://{}/v1/chat/completions", sidecar.local_addr()))
            .header("x-prefiller-host-port", prefill.to_string())
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap_or_else(|e| panic!("{e}"));
        let response = client.request(request).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(response.status(), 200);
        let _ = response.into_body().collect().await;
        for seen in [&prefill_seen, &decode_seen] {
            let raw = seen.lock().unwrap_or_else(|e| e.into_inner())[0].raw.clone();
            assert!(raw.contains(tools), "{engine:?}: the tools as written: {raw}");
        }
        sidecar.shutdown().await;
    }
}
