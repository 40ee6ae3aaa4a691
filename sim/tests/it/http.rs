//! The simulated engine over HTTP on 127.0.0.1: completions (JSON and SSE,
//! usage, cached tokens), render, metrics, errors, the stall knob, the time
//! model on a scaled clock, and seeded determinism.

use std::time::{Duration, Instant};

use crate::support::{DEADLINE, Http, fast_config};
use kvpick_sim::tokenizer::{render_chat, render_completion};
use kvpick_sim::{Engine, EngineConfig, Fleet, Progress, RequestSpec, TimeModel};
use serde_json::{Value, json};

fn conversation(turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content":
        "You are a helpful assistant for a team that routes LLM requests by KV cache overlap. \
         Answer briefly, cite the relevant block hashes, and never invent numbers you cannot check."})];
    for i in 0..turns {
        messages.push(json!({"role": "user", "content": format!("Question {i}: how warm is the cache now?")}));
        if i + 1 < turns {
            messages.push(json!({"role": "assistant", "content": " the cache block prefix hit"}));
        }
    }
    json!({"model": "sim-model", "messages": messages, "max_tokens": 5})
}

fn cached_tokens(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_json_and_sse_report_usage_with_growing_cached_tokens() {
    let engine = Engine::start(fast_config(16, 1024)).await.expect("engine starts");
    let url = format!("{}/v1/chat/completions", engine.endpoints().base_url());
    let http = Http::default();

    let turn1 = conversation(1);
    let prompt_len = render_chat(&turn1).expect("renders").len() as u64;
    let first = http.post(&url, &turn1).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.engine.as_deref(), Some("engine-0"));
    assert!(first.content_type.starts_with("application/json"));
    let v = first.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "sim-model");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(!v["choices"][0]["message"]["content"].as_str().expect("content").is_empty());
    assert_eq!(v["usage"]["prompt_tokens"], prompt_len);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], prompt_len + 5);
    assert_eq!(cached_tokens(&v["usage"]), 0);

    // The same prompt: every full block but the one holding the last token.
    let again = http.post(&url, &turn1).await.json();
    let c1 = cached_tokens(&again["usage"]);
    assert_eq!(c1, (prompt_len - 1) / 16 * 16);
    assert!(c1 > 0);

    // The next turn, streamed with usage: it extends the cached prefix.
    let mut turn2 = conversation(2);
    turn2["stream"] = json!(true);
    turn2["stream_options"] = json!({"include_usage": true});
    let sse = http.post(&url, &turn2).await;
    assert_eq!(sse.status, 200);
    assert!(sse.content_type.starts_with("text/event-stream"), "{}", sse.content_type);
    let data = sse.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("JSON chunk")).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let contents =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).filter(|s| !s.is_empty()).count();
    assert_eq!(contents, 5);
    let finish = chunks.iter().filter(|c| c["choices"][0]["finish_reason"] == "length").count();
    assert_eq!(finish, 1);
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert_eq!(chunks.last().expect("usage chunk")["choices"], json!([]));
    assert_eq!(usage["completion_tokens"], 5);
    let c2 = cached_tokens(usage);
    assert!(c2 >= c1, "turn 2 reuses turn 1's blocks: {c2} < {c1}");

    // Turn 3 reuses turn 2's longer prompt.
    let turn3 = http.post(&url, &conversation(3)).await.json();
    let c3 = cached_tokens(&turn3["usage"]);
    assert!(c3 > c2, "{c3} <= {c2}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_json_and_sse() {
    let engine = Engine::start(fast_config(4, 256)).await.expect("engine starts");
    let url = format!("{}/v1/completions", engine.endpoints().base_url());
    let http = Http::default();
    let body = json!({"prompt": "one two three four five six seven eight nine", "max_tokens": 3});
    let v = http.post(&url, &body).await.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 10);
    assert_eq!(v["usage"]["completion_tokens"], 3);

    let streamed = http.post(&url, &json!({"prompt": [5, 6, 7, 8, 9], "max_tokens": 2, "stream": true})).await;
    let data = streamed.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("JSON chunk")).collect();
    // Two tokens, then the finish chunk; no usage without include_usage.
    assert_eq!(chunks.len(), 3);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion" && c.get("usage").is_none()));
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_is_deterministic_matches_the_cache_and_has_vllm_shapes() {
    let fleet = Fleet::start(2, &fast_config(4, 256)).await.expect("fleet starts");
    let http = Http::default();
    let chat = conversation(2);
    let mut renders = Vec::new();
    for engine in fleet.engines() {
        let url = format!("{}/v1/chat/completions/render", engine.endpoints().base_url());
        renders.push(http.post(&url, &chat).await.json());
    }
    let ids: Vec<u32> = serde_json::from_value(renders[0]["token_ids"].clone()).expect("token_ids");
    assert_eq!(ids, render_chat(&chat).expect("renders"));
    assert_eq!(renders[0]["token_ids"], renders[1]["token_ids"], "every engine renders alike");
    for key in ["request_id", "features", "sampling_params", "model", "stream", "cache_salt", "priority"] {
        assert!(renders[0].get(key).is_some(), "GenerateRequest field {key}");
    }
    let url0 = format!("{}/v1/chat/completions/render", fleet[0].endpoints().base_url());
    assert_eq!(http.post(&url0, &chat).await.json()["token_ids"], renders[0]["token_ids"]);

    let completions = json!({"prompt": ["alpha beta", "gamma"]});
    let url = format!("{}/v1/completions/render", fleet[1].endpoints().base_url());
    let list = http.post(&url, &completions).await.json();
    let list = list.as_array().expect("completions render answers a list");
    assert_eq!(list.len(), 2);
    let expected = render_completion(&completions).expect("renders");
    for (answer, tokens) in list.iter().zip(&expected) {
        assert_eq!(answer["token_ids"], json!(tokens));
    }

    // The engine caches exactly the rendered tokens (full blocks).
    let chat_url = format!("{}/v1/chat/completions", fleet[0].endpoints().base_url());
    assert_eq!(http.post(&chat_url, &chat).await.status, 200);
    let cache = fleet[0].cache().await.expect("cache snapshot");
    let mut cached = Vec::new();
    let mut parent = None;
    while let Some(block) = cache.blocks.iter().find(|b| b.parent == parent) {
        cached.extend_from_slice(&block.token_ids);
        parent = Some(block.hash);
    }
    assert_eq!(cached, ids[..ids.len() / 4 * 4]);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_health_models_and_metrics() {
    let cfg = EngineConfig { max_model_len: 64, ..fast_config(16, 64) };
    let engine = Engine::start(cfg).await.expect("engine starts");
    let base = engine.endpoints().base_url();
    let http = Http::default();

    let bad = http.post_raw(&format!("{base}/v1/chat/completions"), "{not json").await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["code"], 400);
    let wrong_model = http.post(&format!("{base}/v1/completions"), &json!({"model": "other", "prompt": "x"})).await;
    assert_eq!(wrong_model.status, 404);
    let too_long = http.post(&format!("{base}/v1/completions"), &json!({"prompt": "x", "max_tokens": 100})).await;
    assert_eq!(too_long.status, 400);
    assert!(too_long.json()["error"]["message"].as_str().expect("message").contains("maximum context length"));
    let n2 = http.post(&format!("{base}/v1/completions"), &json!({"prompt": "x", "n": 2})).await;
    assert_eq!(n2.status, 400);
    let no_messages = http.post(&format!("{base}/v1/chat/completions/render"), &json!({"prompt": "x"})).await;
    assert_eq!(no_messages.status, 400);

    assert_eq!(http.get(&format!("{base}/health")).await.status, 200);
    assert_eq!(http.get(&format!("{base}/v1/models")).await.json()["data"][0]["id"], "sim-model");

    // A stalled engine queues: the metrics show it waiting.
    let prompt: Vec<u32> = (100..140).collect();
    engine.set_stalled(true).expect("stall");
    let mut rx = engine.submit(RequestSpec { prompt: prompt.clone(), max_tokens: 2, seed: None }).expect("submit");
    let metrics = http.get(&format!("{base}/metrics")).await.text();
    assert!(metrics.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"sim-model\"} 1.0"), "{metrics}");
    assert!(tokio::time::timeout(Duration::from_millis(100), rx.recv()).await.is_err(), "stalled: no token");
    engine.set_stalled(false).expect("resume");
    let mut ended = false;
    while let Some(p) = tokio::time::timeout(DEADLINE, rx.recv()).await.expect("progress in time") {
        ended = matches!(p, Progress::Finished(_));
    }
    assert!(ended);
    engine.generate(RequestSpec { prompt, max_tokens: 2, seed: None }).await.expect("repeat");

    let metrics = http.get(&format!("{base}/metrics")).await.text();
    let value = |name: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {metrics}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number")
    };
    assert_eq!(value("vllm:num_requests_running{"), 0.0);
    assert_eq!(value("vllm:num_requests_waiting{"), 0.0);
    assert_eq!(value("vllm:kv_cache_usage_perc{"), 0.0, "unreferenced cached blocks count as free");
    assert_eq!(value("vllm:prefix_cache_queries_total{"), 80.0);
    assert_eq!(value("vllm:prefix_cache_hits_total{"), 32.0);
    assert!(metrics.contains("# TYPE vllm:prefix_cache_hits counter"));

    engine.shutdown().await;
    assert!(tokio::net::TcpStream::connect(engine.endpoints().http).await.is_err(), "the port is closed");
}

/// Wall-clock time to the first token, and the engine's virtual TTFT.
async fn timed(engine: &Engine, prompt: Vec<u32>) -> (Duration, u64) {
    let start = Instant::now();
    let mut rx = engine.submit(RequestSpec { prompt, max_tokens: 2, seed: None }).expect("submit");
    let mut first = None;
    loop {
        match tokio::time::timeout(DEADLINE, rx.recv()).await.expect("progress in time") {
            Some(Progress::Token { .. }) => {
                first.get_or_insert_with(|| start.elapsed());
            }
            Some(Progress::Finished(outcome)) => return (first.expect("a token came first"), outcome.ttft_ns()),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_on_a_scaled_clock_grows_with_uncached_tokens() {
    let scale = 20.0;
    let cfg = EngineConfig { time: TimeModel { time_scale: scale, ..TimeModel::default() }, ..fast_config(16, 2048) };
    let engine = Engine::start(cfg.clone()).await.expect("engine starts");
    let long: Vec<u32> = (0..6000).map(|i| 300 + i).collect();
    let (short_wall, short_virtual) = timed(&engine, (0..64).map(|i| 20_000 + i).collect()).await;
    let (long_wall, long_virtual) = timed(&engine, long.clone()).await;
    let (warm_wall, warm_virtual) = timed(&engine, long).await;
    // Uncached tokens: warm 16 (all but the last block cached), short 64, long 6000.
    assert!(
        warm_virtual < short_virtual && short_virtual < long_virtual,
        "{warm_virtual} {short_virtual} {long_virtual}"
    );
    assert_eq!(long_virtual, cfg.time.step_ns(6000, 0));
    // Tokens are released when their step ends on the scaled clock.
    let floor = Duration::from_nanos((long_virtual as f64 / scale) as u64);
    assert!(long_wall >= floor.mul_f64(0.95), "{long_wall:?} < {floor:?}");
    assert!(long_wall > short_wall && long_wall > warm_wall, "{short_wall:?} {long_wall:?} {warm_wall:?}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_seed_same_run() {
    let cfg = fast_config(8, 64);
    let run = |cfg: EngineConfig| async move {
        let engine = Engine::start(cfg).await.expect("engine starts");
        let http = Http::default();
        let url = format!("{}/v1/chat/completions", engine.endpoints().base_url());
        let mut answers = Vec::new();
        for turns in [1, 2, 1, 3, 2] {
            let v = http.post(&url, &conversation(turns)).await.json();
            answers.push((v["choices"][0]["message"]["content"].clone(), v["usage"].clone()));
        }
        let hashes: Vec<u64> = engine.cache().await.expect("cache").blocks.iter().map(|b| b.hash).collect();
        let outcomes = engine.outcomes().await.expect("outcomes");
        let ttfts: Vec<u64> = outcomes.iter().map(|o| o.ttft_ns()).collect();
        engine.shutdown().await;
        (answers, hashes, ttfts)
    };
    let a = run(cfg.clone()).await;
    let b = run(cfg.clone()).await;
    assert_eq!(a, b, "same seed, same requests: same text, usage, hashes and virtual TTFTs");
    let c = run(EngineConfig { seed: 7, ..cfg }).await;
    assert_ne!(a.1, c.1, "another seed: other hashes");
    assert_ne!(a.0, c.0, "another seed: other samples");
}

/// The SGLang flavour: `/tokenize` gives the tokens `/v1/completions`
/// caches for the same prompt (one prompt or a list), `/generate` answers in
/// SGLang's shape with the cached tokens of a repeated prompt, refuses a
/// stream, and the render routes are not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_tokenize_and_generate() {
    let config = kvpick_sim::Flavour::sglang_events(fast_config(4, 256));
    let engine = Engine::start(config).await.expect("engine starts");
    let base = engine.endpoints().base_url();
    let http = Http::default();
    let prompt = "one two three four five six seven eight nine";

    let one = http.post(&format!("{base}/tokenize"), &json!({"prompt": prompt})).await.json();
    let want = render_completion(&json!({"prompt": prompt})).expect("renders").pop().expect("one prompt");
    assert_eq!(one["tokens"], json!(want));
    assert_eq!(one["count"], want.len());
    let list = http.post(&format!("{base}/tokenize"), &json!({"prompt": [prompt, "ten"]})).await.json();
    assert_eq!(list["tokens"][0], json!(want));
    assert_eq!(list["count"].as_array().map(Vec::len), Some(2));

    let generate = format!("{base}/generate");
    let body = json!({"text": prompt, "sampling_params": {"max_new_tokens": 3}});
    let first = http.post(&generate, &body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let v = first.json();
    assert_eq!(v["output_ids"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["meta_info"]["finish_reason"], json!({"type": "length", "length": 3}));
    assert_eq!(v["meta_info"]["prompt_tokens"], want.len());
    let again = http.post(&generate, &json!({"input_ids": want, "sampling_params": {"max_new_tokens": 1}})).await;
    assert!(again.json()["meta_info"]["cached_tokens"].as_u64().unwrap_or(0) >= 4, "{}", again.text());
    let streamed = http.post(&generate, &json!({"text": prompt, "stream": true})).await;
    assert_eq!(streamed.status, 400, "{}", streamed.text());
    let render = http.post(&format!("{base}/v1/completions/render"), &json!({"prompt": prompt})).await;
    assert_eq!(render.status, 404);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_can_be_made_slow_or_failing_while_generation_goes_on() {
    let engine = Engine::start(fast_config(4, 256)).await.expect("engine starts");
    let http = Http::default();
    let url = format!("{}/v1/chat/completions/render", engine.endpoints().base_url());
    let chat = conversation(1);

    engine.set_render_failing(true);
    let failed = http.post(&url, &chat).await;
    assert_eq!(failed.status.as_u16(), 500);
    assert_eq!(failed.json()["error"]["type"], "InternalServerError");
    let completion = format!("{}/v1/chat/completions", engine.endpoints().base_url());
    assert!(http.post(&completion, &chat).await.status.is_success(), "generation is not the render service");
    engine.set_render_failing(false);
    assert!(http.post(&url, &chat).await.status.is_success());

    // Alternately a quarter of the delay and the whole of it.
    engine.set_render_delay(Duration::from_millis(400));
    let mut took = Vec::new();
    for _ in 0..2 {
        let start = Instant::now();
        assert!(http.post(&url, &chat).await.status.is_success(), "slow, not failing");
        took.push(start.elapsed());
    }
    took.sort();
    assert!(took[0] >= Duration::from_millis(100) && took[1] >= Duration::from_millis(400), "{took:?}");
    engine.set_render_delay(Duration::ZERO);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_share_ports_on_loopback_addresses_of_their_own() {
    let first = Engine::start(EngineConfig { host: [127, 0, 0, 2].into(), ..fast_config(4, 64) })
        .await
        .expect("engine on 127.0.0.2");
    let ep = first.endpoints().clone();
    assert_eq!(ep.http.ip().to_string(), "127.0.0.2");
    assert!(ep.events.starts_with("tcp://127.0.0.2:") && ep.replay.starts_with("tcp://127.0.0.2:"));
    let port = |zmq: &str| zmq.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    let ports = kvpick_sim::Ports { http: Some(ep.http.port()), events: port(&ep.events), replay: port(&ep.replay) };
    let second = Engine::start(EngineConfig { host: [127, 0, 0, 3].into(), ports, ..fast_config(4, 64) })
        .await
        .expect("the same ports on 127.0.0.3");
    assert_eq!(second.endpoints().http.port(), ep.http.port());
    let http = Http::default();
    for engine in [&first, &second] {
        let url = format!("{}/v1/chat/completions", engine.endpoints().base_url());
        assert!(http.post(&url, &conversation(1)).await.status.is_success(), "{url}");
    }
    let elsewhere = EngineConfig { host: [10, 0, 0, 1].into(), ..fast_config(4, 64) };
    assert!(Engine::start(elsewhere).await.is_err(), "only loopback addresses");
    first.shutdown().await;
    second.shutdown().await;
}
