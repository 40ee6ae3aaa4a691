//! `/v1/chat/completions` and `/v1/completions`: JSON answers and SSE
//! streams in vLLM's (OpenAI's) shapes, with `usage` including
//! `prompt_tokens_details.cached_tokens`.
//!
//! Streams send nothing before the first token (vLLM's first chunk, the
//! chat role, comes with it), then one chunk per token, a chunk with
//! `finish_reason`, with `stream_options.include_usage` a last chunk with
//! empty `choices` and the `usage`, and `data: [DONE]`. One prompt and one
//! choice per request (`n` > 1 and several completion prompts are refused).
//! A request aborted by a restart or a shutdown ends with 503 (JSON) or an
//! `{"error": …}` chunk (SSE). A client that disconnects aborts its request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::engine_loop::Progress;
use super::http_server::{ApiError, HttpState, parse_body};
use super::scheduler::{Outcome, RequestSpec, check_request};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
}

impl Api {
    fn id_prefix(self) -> &'static str {
        match self {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
        }
    }
}

/// A validated request.
struct Prepared {
    spec: RequestSpec,
    stream: bool,
    include_usage: bool,
}

/// What every chunk and answer repeats.
struct Envelope {
    api: Api,
    id: String,
    created: u64,
    model: String,
}

pub(crate) async fn chat(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    generate(state, headers, bytes, Api::Chat).await
}

pub(crate) async fn completions(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    generate(state, headers, bytes, Api::Completion).await
}

async fn generate(state: Arc<HttpState>, headers: HeaderMap, bytes: Bytes, api: Api) -> Response {
    let engine_header = state.engine_header();
    let prepared = match prepare(&state, &bytes, api) {
        Ok(prepared) => prepared,
        Err(error) => return ([engine_header], error).into_response(),
    };
    let envelope = Envelope {
        api,
        id: state.request_id(api.id_prefix(), &headers),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model: state.config.model.clone(),
    };
    let rx = match state.engine.submit(prepared.spec) {
        Ok(rx) => rx,
        Err(error) => {
            let error = ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: error.to_string() };
            return ([engine_header], error).into_response();
        }
    };
    if prepared.stream {
        ([engine_header], stream(envelope, rx, prepared.include_usage)).into_response()
    } else {
        ([engine_header], collect(envelope, rx).await).into_response()
    }
}

fn prepare(state: &HttpState, bytes: &[u8], api: Api) -> Result<Prepared, ApiError> {
    let body = parse_body(state, bytes)?;
    let prompt = match api {
        Api::Chat => state.chat_tokens(bytes, &body)?,
        Api::Completion => {
            let mut prompts = state.completion_tokens(bytes, &body)?;
            match (prompts.pop(), prompts.is_empty()) {
                (Some(prompt), true) => prompt,
                _ => return Err(ApiError::bad_request("kvpick-sim serves one prompt per request")),
            }
        }
    };
    match body.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => return Err(ApiError::bad_request("kvpick-sim serves n = 1 only")),
    }
    let max_tokens = match body.get("max_completion_tokens").filter(|v| !v.is_null()).or_else(|| body.get("max_tokens"))
    {
        None | Some(Value::Null) => state.config.default_max_tokens,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ApiError::bad_request(format!("max_tokens {v} is not a non-negative integer")))?,
    };
    let seed = match body.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|s| s as u64))
                .ok_or_else(|| ApiError::bad_request("seed must be an integer"))?,
        ),
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("stream must be a boolean")),
    };
    let include_usage = body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    check_request(&state.config, prompt.len(), max_tokens).map_err(ApiError::bad_request)?;
    Ok(Prepared { spec: RequestSpec { prompt, max_tokens, seed }, stream, include_usage })
}

fn usage(outcome: &Outcome) -> Value {
    json!({
        "prompt_tokens": outcome.prompt_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
        "completion_tokens": outcome.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens},
    })
}

/// A request run to its end: its text, its token ids and its outcome, or
/// the error answer (refused: 400; aborted or engine gone: 503).
pub(crate) async fn run_to_end(mut rx: UnboundedReceiver<Progress>) -> Result<(String, Vec<u32>, Outcome), ApiError> {
    let (mut text, mut token_ids) = (String::new(), Vec::new());
    loop {
        match rx.recv().await {
            Some(Progress::Token { token_id, text: piece }) => {
                text.push_str(&piece);
                token_ids.push(token_id);
            }
            Some(Progress::Finished(outcome)) => return Ok((text, token_ids, outcome)),
            Some(Progress::Rejected(reason)) => return Err(ApiError::bad_request(reason)),
            Some(Progress::Aborted(reason)) => {
                return Err(ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: reason });
            }
            None => return Err(ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: "engine stopped".into() }),
        }
    }
}

/// The whole JSON answer, once the request finished.
async fn collect(envelope: Envelope, rx: UnboundedReceiver<Progress>) -> Response {
    let (text, outcome) = match run_to_end(rx).await {
        Ok((text, _, outcome)) => (text, outcome),
        Err(error) => return error.into_response(),
    };
    let Envelope { api, id, created, model } = envelope;
    let answer = match api {
        Api::Chat => json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": null,
                "finish_reason": "length",
                "stop_reason": null,
            }],
            "usage": usage(&outcome),
            "prompt_logprobs": null,
            "kv_transfer_params": null,
        }),
        Api::Completion => json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": "length",
                "stop_reason": null,
                "prompt_logprobs": null,
            }],
            "usage": usage(&outcome),
            "kv_transfer_params": null,
        }),
    };
    axum::Json(answer).into_response()
}

/// The SSE answer; chunks are produced as tokens arrive.
fn stream(envelope: Envelope, rx: UnboundedReceiver<Progress>, include_usage: bool) -> Response {
    let state = ChunkStream { envelope, rx, include_usage, pending: VecDeque::new(), started: false, done: false };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.pending.pop_front() {
                return Some((Ok::<Event, Infallible>(event), s));
            }
            if s.done {
                return None;
            }
            match s.rx.recv().await {
                Some(Progress::Token { text, .. }) => s.token(&text),
                Some(Progress::Finished(outcome)) => s.finish(&outcome),
                Some(Progress::Rejected(reason) | Progress::Aborted(reason)) => s.fail(&reason),
                None => s.fail("engine stopped"),
            }
        }
    });
    Sse::new(events).into_response()
}

struct ChunkStream {
    envelope: Envelope,
    rx: UnboundedReceiver<Progress>,
    include_usage: bool,
    pending: VecDeque<Event>,
    started: bool,
    done: bool,
}

impl ChunkStream {
    fn chunk(&mut self, choices: Value, usage: Option<Value>) {
        let e = &self.envelope;
        let object = match e.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        };
        let mut chunk =
            json!({"id": e.id, "object": object, "created": e.created, "model": e.model, "choices": choices});
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        self.pending.push_back(Event::default().data(chunk.to_string()));
    }

    fn choice(&self, text: &str, finish_reason: Option<&str>) -> Value {
        match self.envelope.api {
            Api::Chat => {
                let delta = if finish_reason.is_some() { json!({}) } else { json!({"content": text}) };
                json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}])
            }
            Api::Completion => json!([{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason,
                "stop_reason": null,
            }]),
        }
    }

    fn token(&mut self, text: &str) {
        if !self.started && self.envelope.api == Api::Chat {
            let role = json!([{
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            }]);
            self.chunk(role, None);
        }
        self.started = true;
        let choice = self.choice(text, None);
        self.chunk(choice, None);
    }

    fn finish(&mut self, outcome: &Outcome) {
        let choice = self.choice("", Some("length"));
        self.chunk(choice, None);
        if self.include_usage {
            self.chunk(json!([]), Some(usage(outcome)));
        }
        self.pending.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }

    fn fail(&mut self, reason: &str) {
        let error = ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: reason.to_owned() };
        self.pending.push_back(Event::default().data(error.body().to_string()));
        self.pending.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }
}
