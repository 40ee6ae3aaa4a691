//! SGLang's own routes (engines.md §4), for the `sglang` flavour:
//!
//! - `POST /tokenize` `{"model"?, "prompt": str | [str], "add_special_tokens"?}`
//!   → `{"tokens", "count", "max_model_len"}` (a list of lists and of
//!   counts for a list of prompts). The tokens are those `/v1/completions`
//!   caches for the same prompt: what kvpick's `sglang-tokenize` client
//!   routes by.
//! - `POST /generate` `{"text" | "input_ids", "sampling_params":
//!   {"max_new_tokens"}, "rid"?}` → `{"text", "output_ids", "meta_info":
//!   {"id", "finish_reason": {"type": "length", "length"}, "prompt_tokens",
//!   "completion_tokens", "cached_tokens"}}`, whole answers only (`stream`
//!   is refused: not simulated). With a P/D role, the bootstrap fields
//!   make it a prefill or decode leg (`pd::bootstrap`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::completions::run_to_end;
use super::http_server::{ApiError, HttpState, parse_body};
use super::pd::legs;
use super::scheduler::{RequestSpec, check_request};

pub(crate) async fn tokenize(State(state): State<Arc<HttpState>>, bytes: Bytes) -> Response {
    let answer = parse_body(&state, &bytes).and_then(|body| {
        let prompt = body.get("prompt").ok_or_else(|| ApiError::bad_request("prompt is required"))?;
        let add_special = body.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true);
        let max_model_len = state.config.max_model_len;
        Ok(match prompt {
            Value::Array(list) => {
                let tokens =
                    list.iter().map(|text| text_tokens(&state, text, add_special)).collect::<Result<Vec<_>, _>>()?;
                let counts: Vec<usize> = tokens.iter().map(Vec::len).collect();
                json!({"tokens": tokens, "count": counts, "max_model_len": max_model_len})
            }
            text => {
                let tokens = text_tokens(&state, text, add_special)?;
                json!({"count": tokens.len(), "tokens": tokens, "max_model_len": max_model_len})
            }
        })
    });
    match answer {
        Ok(value) => axum::Json(value).into_response(),
        Err(error) => error.into_response(),
    }
}

pub(crate) async fn generate(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    let engine_header = state.engine_header();
    let (body, mut spec) = match generate_spec(&state, &bytes) {
        Ok(parsed) => parsed,
        Err(error) => return ([engine_header], error).into_response(),
    };
    let id = match body.get("rid") {
        Some(Value::String(rid)) if !rid.is_empty() => rid.clone(),
        _ => state.request_id("generate", &headers),
    };
    let leg = match legs::plan(&state, &body, &id, &mut spec, false) {
        Ok((leg, _)) => leg,
        Err(error) => return ([engine_header], error).into_response(),
    };
    let rx = match legs::start(&state, spec, leg) {
        Ok(rx) => rx,
        Err(error) => {
            let error = ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: error.to_string() };
            return ([engine_header], error).into_response();
        }
    };
    let (text, output_ids, outcome) = match run_to_end(rx).await {
        Ok(done) => done,
        Err(error) => return ([engine_header], error).into_response(),
    };
    let answer = json!({
        "text": text,
        "output_ids": output_ids,
        "meta_info": {
            "id": id,
            "finish_reason": {"type": "length", "length": outcome.completion_tokens},
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "cached_tokens": outcome.cached_tokens,
        },
    });
    ([engine_header], axum::Json(answer)).into_response()
}

/// The tokens `/v1/completions` caches for the prompt `text`.
fn text_tokens(state: &HttpState, text: &Value, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
    let request = json!({"prompt": text, "add_special_tokens": add_special_tokens});
    let mut prompts = state.completion_tokens(request.to_string().as_bytes(), &request)?;
    prompts.pop().ok_or_else(|| ApiError::bad_request("an empty prompt"))
}

fn generate_spec(state: &HttpState, bytes: &[u8]) -> Result<(Value, RequestSpec), ApiError> {
    let body = parse_body(state, bytes)?;
    if body.get("stream").and_then(Value::as_bool).unwrap_or(false) {
        return Err(ApiError::bad_request("kvpick-sim: streaming /generate is not simulated"));
    }
    let prompt = match (body.get("input_ids"), body.get("text")) {
        (Some(Value::Array(ids)), _) => ids
            .iter()
            .map(|id| id.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| ApiError::bad_request("input_ids must be one list of token ids"))?,
        (_, Some(text @ Value::String(_))) => text_tokens(state, text, true)?,
        _ => return Err(ApiError::bad_request("one of text (a string) or input_ids (a list) is required")),
    };
    let max_tokens = match body.pointer("/sampling_params/max_new_tokens") {
        None | Some(Value::Null) => state.config.default_max_tokens,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ApiError::bad_request("max_new_tokens must be a non-negative integer"))?,
    };
    check_request(&state.config, prompt.len(), max_tokens).map_err(ApiError::bad_request)?;
    Ok((body, RequestSpec { prompt, max_tokens, seed: None }))
}
