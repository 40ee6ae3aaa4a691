//! `/v1/chat/completions` and `/v1/completions`: JSON answers and SSE
//! streams in vLLM's (OpenAI's) shapes, with `usage` including
//! `prompt_tokens_details.cached_tokens`; and vLLM's tokens-in/tokens-out
//! `/inference/v1/generate` (a `GenerateRequest` in, a `GenerateResponse`
//! or SSE chunks of it out). A P/D leg (see `pd`) runs behind the same
//! answers, which then carry its params.
//!
//! Streams send nothing before the first token (vLLM's first chunk, the
//! chat role, comes with it), then one chunk per token, a chunk with
//! `finish_reason`, with `stream_options.include_usage` a last chunk with
//! empty `choices` and the `usage`, and `data: [DONE]`. One prompt and one
//! choice per request (`n` > 1 and several completion prompts are refused).
//! A request aborted by a restart or a shutdown ends with 503 (JSON) or an
//! `{"error": …}` chunk (SSE); one failed by its KV transfer, with 500 or
//! such a chunk. A client that disconnects aborts its request.

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
use super::pd::legs::{self, PdReply};
use super::scheduler::{Outcome, RequestSpec, check_request};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
    /// `/inference/v1/generate`: token ids in and out.
    Tokens,
}

impl Api {
    fn id_prefix(self) -> &'static str {
        match self {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
            Api::Tokens => "generate",
        }
    }
}

/// A validated request.
struct Prepared {
    body: Value,
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
    /// What a P/D leg adds to the answer.
    pd: PdReply,
}

pub(crate) async fn chat(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    generate(state, headers, bytes, Api::Chat).await
}

pub(crate) async fn completions(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    generate(state, headers, bytes, Api::Completion).await
}

/// vLLM's `POST /inference/v1/generate`.
pub(crate) async fn tokens_generate(State(state): State<Arc<HttpState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    generate(state, headers, bytes, Api::Tokens).await
}

async fn generate(state: Arc<HttpState>, headers: HeaderMap, bytes: Bytes, api: Api) -> Response {
    let engine_header = state.engine_header();
    let mut prepared = match prepare(&state, &bytes, api) {
        Ok(prepared) => prepared,
        Err(error) => return ([engine_header], error).into_response(),
    };
    // `GenerateRequest` names its id; the others take `X-Request-Id`.
    let id = match prepared.body.get("request_id") {
        Some(Value::String(id)) if api == Api::Tokens && !id.is_empty() => id.clone(),
        _ => state.request_id(api.id_prefix(), &headers),
    };
    let (leg, pd) = match legs::plan(&state, &prepared.body, &id, &mut prepared.spec, prepared.stream) {
        Ok(planned) => planned,
        Err(error) => return ([engine_header], error).into_response(),
    };
    let envelope = Envelope {
        api,
        id,
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model: state.config.model.clone(),
        pd,
    };
    let rx = match legs::start(&state, prepared.spec, leg) {
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
        Api::Tokens => return prepare_tokens(state, body),
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
    let (stream, include_usage) = streaming(&body)?;
    check_request(&state.config, prompt.len(), max_tokens).map_err(ApiError::bad_request)?;
    Ok(Prepared { body, spec: RequestSpec { prompt, max_tokens, seed }, stream, include_usage })
}

/// `stream` (a boolean or absent) and `stream_options.include_usage`, as
/// both request shapes carry them.
fn streaming(body: &Value) -> Result<(bool, bool), ApiError> {
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("stream must be a boolean")),
    };
    let include_usage = body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    Ok((stream, include_usage))
}

/// A `GenerateRequest`: `token_ids`, `sampling_params.{max_tokens, seed}`,
/// `stream`, `stream_options.include_usage`.
fn prepare_tokens(state: &HttpState, body: Value) -> Result<Prepared, ApiError> {
    let prompt = match body.get("token_ids") {
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|id| id.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| ApiError::bad_request("token_ids must be a list of token ids"))?,
        _ => return Err(ApiError::bad_request("token_ids is required")),
    };
    let max_tokens = match body.pointer("/sampling_params/max_tokens") {
        None | Some(Value::Null) => state.config.default_max_tokens,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ApiError::bad_request(format!("max_tokens {v} is not a non-negative integer")))?,
    };
    let seed = body.pointer("/sampling_params/seed").and_then(|v| v.as_u64().or_else(|| v.as_i64().map(|s| s as u64)));
    let (stream, include_usage) = streaming(&body)?;
    check_request(&state.config, prompt.len(), max_tokens).map_err(ApiError::bad_request)?;
    Ok(Prepared { body, spec: RequestSpec { prompt, max_tokens, seed }, stream, include_usage })
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
            Some(Progress::Failed(reason)) => return Err(ApiError::internal(reason)),
            None => return Err(ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: "engine stopped".into() }),
        }
    }
}

/// The whole JSON answer, once the request finished.
async fn collect(envelope: Envelope, rx: UnboundedReceiver<Progress>) -> Response {
    let (text, token_ids, outcome) = match run_to_end(rx).await {
        Ok(done) => done,
        Err(error) => return error.into_response(),
    };
    let Envelope { api, id, created, model, pd } = envelope;
    let kv_transfer_params = match &pd {
        PdReply::Nixl(params) => params.clone(),
        PdReply::None | PdReply::Trtllm(_) => Value::Null,
    };
    let mut answer = match api {
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
            "kv_transfer_params": kv_transfer_params,
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
            "kv_transfer_params": kv_transfer_params,
        }),
        Api::Tokens => json!({
            "request_id": id,
            "choices": [{"index": 0, "logprobs": null, "finish_reason": "length", "token_ids": token_ids}],
            "prompt_logprobs": null,
            "kv_transfer_params": kv_transfer_params,
        }),
    };
    if let PdReply::Trtllm(reply) = &pd {
        answer["choices"][0]["disaggregated_params"] = reply.params(outcome.id, token_ids.first().copied());
    }
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
                Some(Progress::Token { token_id, text }) => s.token(token_id, &text),
                Some(Progress::Finished(outcome)) => s.finish(&outcome),
                Some(Progress::Rejected(reason) | Progress::Aborted(reason)) => {
                    s.fail(StatusCode::SERVICE_UNAVAILABLE, &reason)
                }
                Some(Progress::Failed(reason)) => s.fail(StatusCode::INTERNAL_SERVER_ERROR, &reason),
                None => s.fail(StatusCode::SERVICE_UNAVAILABLE, "engine stopped"),
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
            Api::Tokens => "",
        };
        let mut chunk = match e.api {
            Api::Tokens => json!({"request_id": e.id, "choices": choices, "prompt_logprobs": null,
                "kv_transfer_params": null}),
            Api::Chat | Api::Completion => {
                json!({"id": e.id, "object": object, "created": e.created, "model": e.model, "choices": choices})
            }
        };
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        self.pending.push_back(Event::default().data(chunk.to_string()));
    }

    fn choice(&self, token_id: Option<u32>, text: &str, finish_reason: Option<&str>) -> Value {
        match self.envelope.api {
            Api::Tokens => json!([{
                "index": 0,
                "logprobs": null,
                "finish_reason": finish_reason,
                "token_ids": token_id.into_iter().collect::<Vec<u32>>(),
            }]),
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

    fn token(&mut self, token_id: u32, text: &str) {
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
        let choice = self.choice(Some(token_id), text, None);
        self.chunk(choice, None);
    }

    fn finish(&mut self, outcome: &Outcome) {
        let choice = self.choice(None, "", Some("length"));
        self.chunk(choice, None);
        if self.include_usage {
            self.chunk(json!([]), Some(usage(outcome)));
        }
        self.pending.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }

    fn fail(&mut self, status: StatusCode, reason: &str) {
        let error = ApiError { status, message: reason.to_owned() };
        self.pending.push_back(Event::default().data(error.body().to_string()));
        self.pending.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }
}
