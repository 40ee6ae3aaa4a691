//! TensorRT-LLM's disaggregated serving (engines.md §5, after
//! `trtllm-serve`'s disaggregated server): a `context_only` leg, unstreamed;
//! then the client's request as `generation_only`, carrying the context
//! answer's `disaggregated_params`. A context leg that already finished the
//! answer (a stop on its first token) is the answer.

use serde_json::{Value, json};

use super::{Body, Route, Unusable};

/// The context leg's body. `max_tokens_1`: servers older than the
/// `context_only` request type also needed the context leg capped.
pub fn context_body(original: &Body, max_tokens_1: bool) -> Body {
    let mut body = original.clone();
    body.insert("disaggregated_params", json!({"request_type": "context_only"}));
    body.insert("stream", Value::Bool(false));
    body.remove("stream_options");
    if max_tokens_1 {
        body.insert("max_tokens", json!(1));
        if body.contains_key("max_completion_tokens") {
            body.insert("max_completion_tokens", json!(1));
        }
    }
    body
}

/// What follows a context answer.
#[derive(Clone, Debug, PartialEq)]
pub enum AfterContext {
    /// Generate with these parameters (already `generation_only`).
    Generate(Value),
    /// The context leg finished the answer: return it.
    Finished,
}

/// Reads the context answer: `choices[0].disaggregated_params`, unless its
/// finish reason says generation is over (anything but `length` and
/// `not_finished`, as the disaggregated server decides).
pub fn after_context(answer: &Value) -> Result<AfterContext, Unusable> {
    let choice = answer.pointer("/choices/0").ok_or_else(|| Unusable("the context answer has no choices[0]".into()))?;
    match choice.get("finish_reason").and_then(Value::as_str) {
        None | Some("length") | Some("not_finished") => {}
        Some(_) => return Ok(AfterContext::Finished),
    }
    match choice.get("disaggregated_params") {
        Some(Value::Object(params)) => {
            let mut params = params.clone();
            params.insert("request_type".into(), json!("generation_only"));
            Ok(AfterContext::Generate(Value::Object(params)))
        }
        _ => Err(Unusable(
            "the context answer has no choices[0].disaggregated_params (is the context server started with a disaggregated cache transceiver?)"
                .into(),
        )),
    }
}

/// The generation leg's body: the client's, with the parameters.
pub fn generation_body(original: &Body, params: Value) -> Body {
    let mut body = original.clone();
    body.insert("disaggregated_params", params);
    body
}

/// A finished context answer as the event stream the client asked for:
/// one chunk per choice, then the usage if asked, then `[DONE]`.
pub fn as_event_stream(answer: &Value, route: Route, include_usage: bool) -> Vec<u8> {
    let chat = route == Route::Chat;
    let object = if chat { "chat.completion.chunk" } else { "text_completion" };
    let mut out = Vec::new();
    let mut event = |value: Value| {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(value.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    };
    let head = |choices: Value| {
        json!({
            "id": answer.get("id").cloned().unwrap_or(Value::Null),
            "object": object,
            "created": answer.get("created").cloned().unwrap_or(Value::Null),
            "model": answer.get("model").cloned().unwrap_or(Value::Null),
            "choices": choices,
        })
    };
    for choice in answer.get("choices").and_then(Value::as_array).into_iter().flatten() {
        let index = choice.get("index").cloned().unwrap_or(json!(0));
        let finish = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
        let piece = if chat {
            let content = choice.pointer("/message/content").cloned().unwrap_or(json!(""));
            json!({"index": index, "delta": {"role": "assistant", "content": content}, "finish_reason": finish})
        } else {
            let text = choice.get("text").cloned().unwrap_or(json!(""));
            json!({"index": index, "text": text, "finish_reason": finish})
        };
        event(head(json!([piece])));
    }
    if let Some(usage) = answer.get("usage").filter(|_| include_usage) {
        let mut last = head(json!([]));
        if let Some(o) = last.as_object_mut() {
            o.insert("usage".into(), usage.clone());
        }
        event(last);
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::object;

    #[test]
    fn the_context_leg_is_context_only_and_unstreamed() {
        let original = object(json!({"model": "m", "prompt": "p", "stream": true, "max_tokens": 50,
            "stream_options": {"include_usage": true}}));
        let body = context_body(&original, false).to_value();
        assert_eq!(
            body,
            json!({"model": "m", "prompt": "p", "stream": false, "max_tokens": 50,
                "disaggregated_params": {"request_type": "context_only"}})
        );
        let old = context_body(&original, true);
        assert_eq!(old.get("max_tokens"), Some(json!(1)));
    }

    #[test]
    fn the_context_answers_parameters_go_on_as_generation_only() {
        let answer = json!({"id": "c-1", "choices": [{"index": 0, "text": "x", "finish_reason": "length",
            "disaggregated_params": {"request_type": "context_only", "first_gen_tokens": [42],
                "ctx_request_id": 7, "encoded_opaque_state": "AAEC", "draft_tokens": null}}]});
        let AfterContext::Generate(params) = after_context(&answer).unwrap_or_else(|e| panic!("{e}")) else {
            panic!("must generate");
        };
        assert_eq!(
            params,
            json!({"request_type": "generation_only", "first_gen_tokens": [42], "ctx_request_id": 7,
                "encoded_opaque_state": "AAEC", "draft_tokens": null})
        );
        let body = generation_body(&object(json!({"stream": true})), params.clone());
        assert_eq!(body.get("disaggregated_params").as_ref(), Some(&params));
        let done = json!({"choices": [{"finish_reason": "stop", "text": "."}]});
        assert_eq!(after_context(&done), Ok(AfterContext::Finished));
        assert!(after_context(&json!({"choices": []})).is_err());
        assert!(after_context(&json!({"choices": [{"finish_reason": "length"}]})).is_err());
    }

    #[test]
    fn a_finished_context_answer_streams_as_the_client_asked() {
        let answer = json!({"id": "c-1", "created": 5, "model": "m", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}});
        let text = String::from_utf8(as_event_stream(&answer, Route::Chat, true)).unwrap_or_default();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 3, "{text}");
        let first: Value = serde_json::from_str(events[0].trim_start_matches("data: ")).unwrap_or_default();
        assert_eq!(first.pointer("/choices/0/delta/content"), Some(&json!("Hi")));
        assert_eq!(first.pointer("/object"), Some(&json!("chat.completion.chunk")));
        assert!(events[1].contains("\"usage\""));
        assert_eq!(events[2], "data: [DONE]");
    }
}
