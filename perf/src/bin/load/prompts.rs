//! The built-in workload: OpenAI chat requests as a gateway forwards them,
//! and the model server's answers.
//!
//! A prompt is a shared system prompt (one of a few), then the earlier
//! turns of its conversation (user and assistant, the same on every
//! request of that conversation), then a new user message unique to the
//! request: what a KV-cache-aware picker is for. Text is numbered words
//! (`sys0w17`), one token each for kvpick's in-process word tokenizer; a
//! real BPE tokenizer makes ~1.3 tokens of such a word.

use kvpick_perf::setup::raw_header_map;
use kvpick_proto::core::HeaderValue;
use kvpick_proto::ext_proc::mode::BodySendMode;
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::{HttpBody, HttpHeaders, ProcessingRequest, ProtocolConfiguration};

use crate::args::{BodyMode, Options, ResponseKind};
use crate::script::{REQUEST_NUMBER, Script};

pub const MODEL: &str = "kvpick-load";

/// `n` numbered words `{prefix}w{i}`.
fn words(prefix: &str, n: usize) -> String {
    let mut out = String::with_capacity(n * (prefix.len() + 5));
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(prefix);
        out.push('w');
        out.push_str(&i.to_string());
    }
    out
}

/// System prompt `s`'s text.
pub fn system_prompt(options: &Options, s: usize) -> String {
    words(&format!("sys{s}"), options.system_tokens)
}

/// A chat body holding only system prompt `s` (its tokens are the prefix
/// every request of its conversations starts with).
pub fn system_only_body(options: &Options, s: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": system_prompt(options, s)}],
    });
    body.to_string().into_bytes()
}

/// Request body `b`: conversation `b % conversations`, its system prompt,
/// its earlier turns, and a question of its own.
pub fn chat_body(options: &Options, b: usize) -> Vec<u8> {
    let conversation = b % options.conversations;
    let system = conversation % options.system_prompts;
    let history = 2 * options.turns;
    let rest = options.prompt_tokens - options.system_tokens;
    let per_message = rest / (history + 1);
    let mut messages = vec![serde_json::json!({"role": "system", "content": system_prompt(options, system)})];
    for m in 0..history {
        let role = if m % 2 == 0 { "user" } else { "assistant" };
        let text = words(&format!("c{conversation}t{m}"), per_message);
        messages.push(serde_json::json!({"role": role, "content": text}));
    }
    let question = words(&format!("q{b}"), rest - per_message * history);
    messages.push(serde_json::json!({"role": "user", "content": question}));
    let stream = options.response == ResponseKind::Sse;
    let mut body = serde_json::json!({
        "model": MODEL,
        "messages": messages,
        "max_tokens": 128,
        "stream": stream,
    });
    if stream {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body.to_string().into_bytes()
}

fn message(request: Request) -> ProcessingRequest {
    ProcessingRequest { request: Some(request), ..Default::default() }
}

/// `body` cut into chunks of `chunk` bytes, `end_of_stream` on the last.
fn body_chunks(body: &[u8], chunk: usize, response: bool) -> Vec<ProcessingRequest> {
    let count = body.len().div_ceil(chunk).max(1);
    (0..count)
        .map(|i| {
            let start = i * chunk;
            let part = body.get(start..start.saturating_add(chunk).min(body.len())).unwrap_or_default();
            let body = HttpBody { body: part.to_vec(), end_of_stream: i + 1 == count, ..Default::default() };
            message(if response { Request::ResponseBody(body) } else { Request::RequestBody(body) })
        })
        .collect()
}

/// The model server's answer, in `chunks` pieces.
pub fn response_body(options: &Options, prompt_tokens: usize) -> Vec<Vec<u8>> {
    let chunks = options.response_chunks;
    match options.response {
        ResponseKind::Sse => (0..chunks)
            .map(|k| {
                let delta = serde_json::json!({
                    "id": "chatcmpl-load", "object": "chat.completion.chunk", "model": MODEL,
                    "choices": [{"index": 0, "delta": {"content": format!("tok{k} ")}, "finish_reason": null}],
                });
                let mut text = format!("data: {delta}\n\n");
                if k + 1 == chunks {
                    let usage = serde_json::json!({
                        "id": "chatcmpl-load", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": chunks,
                                  "total_tokens": prompt_tokens + chunks},
                    });
                    text.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
                }
                text.into_bytes()
            })
            .collect(),
        ResponseKind::Json => {
            let content: Vec<String> = (0..16).map(|k| format!("tok{k}")).collect();
            let body = serde_json::json!({
                "id": "chatcmpl-load", "object": "chat.completion", "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content.join(" ")},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 16, "total_tokens": prompt_tokens + 16},
            })
            .to_string()
            .into_bytes();
            let size = body.len().div_ceil(chunks).max(1);
            body.chunks(size).map(<[u8]>::to_vec).collect()
        }
    }
}

fn protocol_config(mode: BodyMode) -> ProtocolConfiguration {
    let mode = match mode {
        BodyMode::FullDuplex => BodySendMode::FullDuplexStreamed,
        BodyMode::Buffered => BodySendMode::Buffered,
    };
    ProtocolConfiguration {
        request_body_mode: mode as i32,
        response_body_mode: mode as i32,
        send_body_without_waiting_for_header_response: true,
    }
}

/// The script of request body `b`.
pub fn script(options: &Options, b: usize) -> Script {
    let body = chat_body(options, b);
    let length = body.len().to_string();
    let mut map = raw_header_map(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "llm.example"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
        ("content-length", &length),
    ]);
    // In `value`, not `raw_value` as Envoy would: ghz fills its template
    // in a data file's text, which it cannot do inside base64; kvpick (like
    // every EPP) reads both.
    map.headers.push(HeaderValue {
        key: "x-request-id".into(),
        value: format!("kvpick-load-{REQUEST_NUMBER}"),
        raw_value: Vec::new(),
    });
    let mut headers = message(Request::RequestHeaders(HttpHeaders {
        headers: Some(map),
        end_of_stream: false,
        ..Default::default()
    }));
    headers.protocol_config = Some(protocol_config(options.mode));
    // Buffered mode delivers the whole body in one message.
    let chunk = match options.mode {
        BodyMode::FullDuplex => options.chunk_bytes,
        BodyMode::Buffered => body.len().max(1),
    };
    let mut request = vec![headers];
    request.extend(body_chunks(&body, chunk, false));

    let content_type = match options.response {
        ResponseKind::Sse => "text/event-stream",
        ResponseKind::Json => "application/json",
    };
    let mut response = vec![message(Request::ResponseHeaders(HttpHeaders {
        headers: Some(raw_header_map(&[(":status", "200"), ("content-type", content_type)])),
        end_of_stream: false,
        ..Default::default()
    }))];
    let parts = response_body(options, options.prompt_tokens);
    match options.mode {
        BodyMode::FullDuplex => {
            let count = parts.len();
            for (k, part) in parts.into_iter().enumerate() {
                let body = HttpBody { body: part, end_of_stream: k + 1 == count, ..Default::default() };
                response.push(message(Request::ResponseBody(body)));
            }
        }
        BodyMode::Buffered => response.extend(body_chunks(&parts.concat(), usize::MAX, true)),
    }
    Script::new(request, response)
}

/// The workload's distinct scripts, cycled by request number.
pub fn scripts(options: &Options) -> Vec<Script> {
    (0..options.bodies).map(|b| script(options, b)).collect()
}
