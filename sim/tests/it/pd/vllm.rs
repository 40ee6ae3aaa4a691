//! vLLM with the NixlConnector: the toy proxy's two legs (engines.md §3).

use kvpick_sim::{Flavour, KvLoadFailurePolicy};
use serde_json::{Value, json};

use super::{PROMPT, pair, released, settles, transfers, url};
use crate::support::Http;

/// The toy proxy's prefill leg of `original`.
fn prefill_body(original: &Value) -> Value {
    let mut body = original.clone();
    body["kv_transfer_params"] = json!({
        "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null,
    });
    body["stream"] = json!(false);
    body["max_tokens"] = json!(1);
    if body.get("messages").is_some() {
        body["max_completion_tokens"] = json!(1);
    }
    if let Some(map) = body.as_object_mut() {
        map.remove("stream_options");
    }
    body
}

/// The decode leg: the original body and the prefill's params, verbatim.
fn decode_body(original: &Value, params: &Value) -> Value {
    let mut body = original.clone();
    body["kv_transfer_params"] = params.clone();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_json_then_chat_stream_compute_only_the_last_token_on_decode() {
    let (prefill, decode) = pair(Flavour::Vllm, |_| {}).await;
    let http = Http::default();
    let original = json!({"model": "sim-model", "prompt": PROMPT, "max_tokens": 4});
    let id = [("x-request-id", "7d9f-aa01")];
    let answer = http.post_with(&url(&prefill, "/v1/completions"), &prefill_body(&original), &id).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let v = answer.json();
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens") as usize;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let params = &v["kv_transfer_params"];
    let side_channel = prefill.endpoints().bootstrap.expect("side channel");
    // Names and types as vLLM's NixlConnector sends them.
    assert_eq!(params["do_remote_prefill"], json!(true));
    assert_eq!(params["do_remote_decode"], json!(false));
    let blocks = params["remote_block_ids"].as_array().expect("remote_block_ids is a list");
    assert_eq!(blocks.len(), prompt_tokens.div_ceil(16), "every block of the prompt, the partial one too");
    assert!(blocks.iter().all(Value::is_u64));
    assert_eq!(params["remote_engine_id"].as_str().map(str::len), Some(36), "a UUID string: {params}");
    assert_eq!(params["remote_request_id"], json!("cmpl-7d9f-aa01"), "X-Request-Id names the request");
    assert_eq!(params["remote_host"], json!(side_channel.ip().to_string()));
    assert_eq!(params["remote_port"], json!(side_channel.port()));
    assert_eq!(params["tp_size"], json!(1));
    assert_eq!(params["remote_num_tokens"], json!(prompt_tokens));
    assert!(params["remote_blocks_expiry_time"].is_f64(), "a float of seconds: {params}");
    assert_eq!(prefill.held_transfers().await.expect("stats"), 1, "the blocks wait for the decode engine");
    let held = prefill.cache().await.expect("cache");
    assert!(held.blocks.iter().all(|b| b.refs == 1) && held.evictable == 0, "held blocks are pinned");

    let answer = http.post_with(&url(&decode, "/v1/completions"), &decode_body(&original, params), &id).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let v = answer.json();
    assert_eq!(v["usage"]["completion_tokens"], json!(4));
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"],
        json!(prompt_tokens - 1),
        "the decode engine computed the last prompt token only"
    );
    assert_eq!(v["kv_transfer_params"], Value::Null);
    let cache = decode.cache().await.expect("cache");
    assert_eq!(cache.blocks.len(), prompt_tokens / 16, "the transferred full blocks are cached on the decode engine");
    let stats = decode.stats().await.expect("stats");
    assert_eq!(stats.counters.prefix_cache_hits, 0, "transferred blocks are no local hits");
    assert_eq!(transfers(&http, &decode, "ok").await, 1.0);
    settles(&prefill).await;
    assert_eq!(released(&http, &prefill, "pulled").await, 1.0);

    // Chat, the decode leg streamed with usage.
    let original = json!({
        "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3,
        "stream": true, "stream_options": {"include_usage": true},
    });
    let id = [("x-request-id", "chat-2")];
    let answer = http.post_with(&url(&prefill, "/v1/chat/completions"), &prefill_body(&original), &id).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let v = answer.json();
    assert_eq!(v["kv_transfer_params"]["remote_request_id"], json!("chatcmpl-chat-2"));
    let decoded = http
        .post_with(&url(&decode, "/v1/chat/completions"), &decode_body(&original, &v["kv_transfer_params"]), &id)
        .await;
    assert_eq!(decoded.status, 200);
    assert!(decoded.content_type.starts_with("text/event-stream"), "{}", decoded.content_type);
    let data = decoded.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let usage: Value = serde_json::from_str(&data[data.len() - 2]).expect("usage chunk");
    let chat_prompt = usage["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], json!(chat_prompt - 1));
    assert_eq!(usage["usage"]["completion_tokens"], json!(3));
    assert_eq!(transfers(&http, &decode, "ok").await, 2.0);
    settles(&prefill).await;
    settles(&decode).await;

    // The same params again: already pulled, and vLLM's default policy
    // (`kv_load_failure_policy = "fail"`) fails the request.
    let again = http
        .post(
            &url(&decode, "/v1/chat/completions"),
            &decode_body(
                &json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3}),
                &v["kv_transfer_params"],
            ),
        )
        .await;
    assert_eq!(again.status, 500, "{}", again.text());
    let error = again.json();
    assert_eq!(error["error"]["type"], "InternalServerError");
    assert_eq!(error["error"]["code"], json!(500));
    assert_eq!(transfers(&http, &decode, "already_pulled").await, 1.0);
    settles(&decode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_in_tokens_out_generate_carries_the_params() {
    let (prefill, decode) = pair(Flavour::Vllm, |_| {}).await;
    let http = Http::default();
    let token_ids: Vec<u32> = (1000..1040).collect();
    let request = |max_tokens: u32, stream: bool, params: Value| {
        json!({
            "request_id": "gen-1", "token_ids": token_ids, "features": null,
            "sampling_params": {"max_tokens": max_tokens}, "model": "sim-model", "stream": stream,
            "stream_options": null, "cache_salt": null, "priority": 0, "kv_transfer_params": params,
        })
    };
    let answer = http
        .post(&url(&prefill, "/inference/v1/generate"), &request(1, false, json!({"do_remote_decode": true})))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let v = answer.json();
    assert_eq!(v["request_id"], "gen-1");
    assert_eq!(v["choices"][0]["index"], json!(0));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["token_ids"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["prompt_logprobs"], Value::Null);
    let params = v["kv_transfer_params"].clone();
    assert_eq!(params["remote_request_id"], "gen-1");
    assert_eq!(params["remote_num_tokens"], json!(40));

    let decoded = http.post(&url(&decode, "/inference/v1/generate"), &request(5, true, params)).await;
    assert_eq!(decoded.status, 200, "{}", decoded.text());
    let data = decoded.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("chunk")).collect();
    let tokens: usize = chunks.iter().map(|c| c["choices"][0]["token_ids"].as_array().map_or(0, Vec::len)).sum();
    assert_eq!(tokens, 5);
    assert_eq!(chunks.last().map(|c| c["choices"][0]["finish_reason"].clone()), Some(json!("length")));
    assert!(chunks.iter().all(|c| c["request_id"] == "gen-1"));
    let outcome = decode.outcomes().await.expect("outcomes").pop().expect("one outcome");
    assert_eq!(outcome.cached_tokens, 39, "40 tokens arrived, the last one is computed again");
    settles(&prefill).await;
    assert_eq!(transfers(&http, &decode, "ok").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_failures_follow_the_load_failure_policy() {
    let (prefill, decode) = pair(Flavour::Vllm, |c| c.kv_lease_ms = 300).await;
    let http = Http::default();
    let original = json!({"prompt": PROMPT, "max_tokens": 2});
    let leg = http.post(&url(&prefill, "/v1/completions"), &prefill_body(&original)).await.json();
    let params = leg["kv_transfer_params"].clone();

    // Missing or ill-typed fields: 400 in vLLM's error shape.
    for (field, value) in
        [("remote_request_id", Value::Null), ("remote_port", json!("x")), ("remote_block_ids", json!(3))]
    {
        let mut bad = params.clone();
        bad[field] = value;
        let answer = http.post(&url(&decode, "/v1/completions"), &decode_body(&original, &bad)).await;
        assert_eq!(answer.status, 400, "{field}: {}", answer.text());
        assert_eq!(answer.json()["error"]["type"], "BadRequestError");
    }
    let answer = http.post(&url(&decode, "/v1/completions"), &json!({"prompt": PROMPT, "kv_transfer_params": 5})).await;
    assert_eq!(answer.status, 400);

    // Unknown request id.
    let mut unknown = params.clone();
    unknown["remote_request_id"] = json!("cmpl-nobody");
    let answer = http.post(&url(&decode, "/v1/completions"), &decode_body(&original, &unknown)).await;
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert_eq!(transfers(&http, &decode, "unknown").await, 1.0);

    // Block ids that are not the held ones.
    let mut garbled = params.clone();
    garbled["remote_block_ids"] = json!([9999]);
    let answer = http.post(&url(&decode, "/v1/completions"), &decode_body(&original, &garbled)).await;
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert_eq!(transfers(&http, &decode, "mismatch").await, 1.0);

    // The lease ends: the prefill frees the blocks, the pull finds them gone.
    settles(&prefill).await;
    assert_eq!(released(&http, &prefill, "expired").await, 1.0);
    let answer = http.post(&url(&decode, "/v1/completions"), &decode_body(&original, &params)).await;
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert_eq!(transfers(&http, &decode, "expired").await, 1.0);

    // Streaming: the failure is an error chunk.
    let mut streamed = decode_body(&original, &params);
    streamed["stream"] = json!(true);
    let answer = http.post(&url(&decode, "/v1/completions"), &streamed).await;
    assert_eq!(answer.status, 200);
    let data = answer.sse_data();
    let error: Value = serde_json::from_str(&data[0]).expect("error chunk");
    assert_eq!(error["error"]["code"], json!(500), "{error}");

    // The prefill engine gone: unreachable.
    let leg = http.post(&url(&prefill, "/v1/completions"), &prefill_body(&original)).await.json();
    prefill.shutdown().await;
    let answer = http.post(&url(&decode, "/v1/completions"), &decode_body(&original, &leg["kv_transfer_params"])).await;
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert_eq!(transfers(&http, &decode, "unreachable").await, 1.0);

    // No params on a decode engine: aggregated.
    let answer = http.post(&url(&decode, "/v1/completions"), &original).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["usage"]["completion_tokens"], json!(2));
    settles(&decode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recompute_policy_computes_the_whole_prompt_after_a_failed_pull() {
    let (prefill, decode) = pair(Flavour::Vllm, |c| c.kv_load_failure_policy = KvLoadFailurePolicy::Recompute).await;
    let http = Http::default();
    let original = json!({"prompt": PROMPT, "max_tokens": 2});
    let leg = http.post(&url(&prefill, "/v1/completions"), &prefill_body(&original)).await.json();
    let mut unknown = leg["kv_transfer_params"].clone();
    unknown["remote_request_id"] = json!("cmpl-nobody");
    let answer = http.post(&url(&decode, "/v1/completions"), &decode_body(&original, &unknown)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"], json!(0));
    assert_eq!(transfers(&http, &decode, "unknown").await, 1.0);
    assert_eq!(prefill.held_transfers().await.expect("stats"), 1, "nobody pulled the real one");
}
