//! `/v1/chat/completions/render` and `/v1/completions/render`: the prompt's
//! token ids, without generating, in vLLM's `GenerateRequest` shape (one
//! object for chat, a list with one object per prompt for completions;
//! engines.md §2). The tokens are the ones the engine would cache.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::http_server::{ApiError, HttpState, parse_body};

pub(crate) async fn chat(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    let answer = parse_body(&state, &bytes).and_then(|body| {
        let tokens = state.chat_tokens(&bytes, &body)?;
        Ok(generate_request(&state, &body, state.request_id("chatcmpl", &headers), tokens))
    });
    respond(&state, answer)
}

pub(crate) async fn completions(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    let answer = parse_body(&state, &bytes).and_then(|body| {
        let prompts = state.completion_tokens(&bytes, &body)?;
        let id = state.request_id("cmpl", &headers);
        let list = prompts
            .into_iter()
            .enumerate()
            .map(|(i, tokens)| generate_request(&state, &body, format!("{id}-{i}"), tokens))
            .collect();
        Ok(Value::Array(list))
    });
    respond(&state, answer)
}

fn respond(state: &HttpState, answer: Result<Value, ApiError>) -> Response {
    match answer {
        Ok(value) => ([state.engine_header()], axum::Json(value)).into_response(),
        Err(error) => ([state.engine_header()], error).into_response(),
    }
}

/// vLLM's `GenerateRequest` for one rendered prompt.
fn generate_request(state: &HttpState, body: &Value, request_id: String, token_ids: Vec<u32>) -> Value {
    let field = |key: &str| body.get(key).cloned().unwrap_or(Value::Null);
    let max_tokens = body
        .get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(u64::from(state.config.default_max_tokens));
    json!({
        "request_id": request_id,
        "token_ids": token_ids,
        "features": null,
        "sampling_params": {
            "max_tokens": max_tokens,
            "temperature": body.get("temperature").cloned().unwrap_or(json!(1.0)),
            "seed": field("seed"),
        },
        "model": state.config.model,
        "stream": body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        "stream_options": field("stream_options"),
        "cache_salt": field("cache_salt"),
        "priority": body.get("priority").cloned().unwrap_or(json!(0)),
        "kv_transfer_params": field("kv_transfer_params"),
    })
}
