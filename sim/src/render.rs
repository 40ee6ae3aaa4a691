//! `/v1/chat/completions/render` and `/v1/completions/render`: the prompt's
//! token ids, without generating, in vLLM's `GenerateRequest` shape (one
//! object for chat, a list with one object per prompt for completions;
//! engines.md §2). The tokens are the ones the engine would cache.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::http_server::{ApiError, HttpState, parse_body};

/// Faults of the render service, set by the chaos tests: answers late,
/// or fails with HTTP 500, while the engine itself keeps serving.
#[derive(Debug, Default)]
pub(crate) struct RenderFault {
    /// Milliseconds; 0: no delay.
    delay_ms: AtomicU64,
    failing: AtomicBool,
    calls: AtomicU64,
}

impl RenderFault {
    /// Odd calls wait `delay`, even ones a quarter of it (a slow service
    /// is slow unevenly: with a client timeout between the two, some
    /// answers come late and some not at all).
    pub(crate) fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub(crate) fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// Waits out the delay, then fails if failing.
    async fn before_answer(&self) -> Result<(), ApiError> {
        let delay = self.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            let odd = self.calls.fetch_add(1, Ordering::Relaxed) % 2 == 1;
            tokio::time::sleep(Duration::from_millis(if odd { delay } else { delay / 4 })).await;
        }
        if self.failing.load(Ordering::Relaxed) {
            return Err(ApiError::internal("simulated render failure"));
        }
        Ok(())
    }
}

pub(crate) async fn chat(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    if let Err(error) = state.render_fault.before_answer().await {
        return respond(&state, Err(error));
    }
    let answer = parse_body(&state, &bytes).and_then(|body| {
        let tokens = state.chat_tokens(&bytes, &body)?;
        Ok(generate_request(&state, &body, state.request_id("chatcmpl", &headers), tokens))
    });
    respond(&state, answer)
}

pub(crate) async fn completions(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    if let Err(error) = state.render_fault.before_answer().await {
        return respond(&state, Err(error));
    }
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
