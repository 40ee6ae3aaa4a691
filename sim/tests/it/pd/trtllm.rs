//! TensorRT-LLM's disaggregated serving: the disagg server's context and
//! generation requests (engines.md §5).

use kvpick_sim::Flavour;
use serde_json::{Value, json};

use super::{PROMPT, pair, settles, transfers, url};
use crate::support::Http;

fn generation_body(original: &Value, ctx_params: &Value) -> Value {
    let mut params = ctx_params.clone();
    params["request_type"] = json!("generation_only");
    let mut body = original.clone();
    body["disaggregated_params"] = params;
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_then_generation_json_and_stream() {
    let (ctx, gen_engine) = pair(Flavour::Trtllm, |_| {}).await;
    let http = Http::default();
    for stream in [false, true] {
        let original = json!({"model": "sim-model", "prompt": PROMPT, "max_tokens": 4, "stream": stream});
        let mut context = original.clone();
        context["disaggregated_params"] = json!({"request_type": "context_only"});
        context["stream"] = json!(false);
        let answer = http.post(&url(&ctx, "/v1/completions"), &context).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let v = answer.json();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "length");
        let params = &choice["disaggregated_params"];
        assert_eq!(params["request_type"], "context_only");
        assert!(params["ctx_request_id"].is_u64(), "{params}");
        assert_eq!(params["first_gen_tokens"].as_array().map(Vec::len), Some(1));
        assert!(params["encoded_opaque_state"].is_string());
        assert_eq!(params["draft_tokens"], Value::Null);
        assert_eq!(ctx.held_transfers().await.expect("stats"), 1);
        let first_text = choice["text"].as_str().expect("text").to_owned();

        let answer = http.post(&url(&gen_engine, "/v1/completions"), &generation_body(&original, params)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let text = if stream {
            let data = answer.sse_data();
            assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
            data[..data.len() - 1]
                .iter()
                .map(|d| {
                    serde_json::from_str::<Value>(d).expect("chunk")["choices"][0]["text"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned()
                })
                .collect::<String>()
        } else {
            let v = answer.json();
            assert_eq!(v["usage"]["completion_tokens"], json!(4));
            assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], v["usage"]["prompt_tokens"]);
            v["choices"][0]["text"].as_str().expect("text").to_owned()
        };
        assert!(text.starts_with(&first_text), "generation starts from first_gen_tokens: {first_text:?} / {text:?}");
        settles(&ctx).await;
        settles(&gen_engine).await;
    }
    assert_eq!(transfers(&http, &gen_engine, "ok").await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_params_and_unknown_context() {
    let (ctx, gen_engine) = pair(Flavour::Trtllm, |_| {}).await;
    let http = Http::default();
    let original = json!({"prompt": PROMPT, "max_tokens": 3});
    let mut context = original.clone();
    context["disaggregated_params"] = json!({"request_type": "context_only"});
    context["stream"] = json!(true);
    assert_eq!(http.post(&url(&ctx, "/v1/completions"), &context).await.status, 400, "context legs do not stream");
    context["stream"] = json!(false);
    context["max_tokens"] = json!(1);
    let v = http.post(&url(&ctx, "/v1/completions"), &context).await.json();
    let params = v["choices"][0]["disaggregated_params"].clone();

    for (field, value) in
        [("ctx_request_id", Value::Null), ("first_gen_tokens", json!([])), ("encoded_opaque_state", json!("%%%"))]
    {
        let mut bad = params.clone();
        bad[field] = value;
        let answer = http.post(&url(&gen_engine, "/v1/completions"), &generation_body(&original, &bad)).await;
        assert_eq!(answer.status, 400, "{field}: {}", answer.text());
    }
    let mut other = params.clone();
    other["request_type"] = json!("sideways");
    assert_eq!(
        http.post(&url(&gen_engine, "/v1/completions"), &{
            let mut b = original.clone();
            b["disaggregated_params"] = other;
            b
        })
        .await
        .status,
        400
    );

    let mut unknown = params.clone();
    unknown["ctx_request_id"] = json!(987_654);
    let answer = http.post(&url(&gen_engine, "/v1/completions"), &generation_body(&original, &unknown)).await;
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert_eq!(transfers(&http, &gen_engine, "unknown").await, 1.0);
    assert_eq!(ctx.held_transfers().await.expect("stats"), 1, "the real one is still held");

    let answer = http.post(&url(&gen_engine, "/v1/completions"), &generation_body(&original, &params)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    settles(&ctx).await;
    settles(&gen_engine).await;
}
