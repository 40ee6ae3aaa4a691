//! An OpenAI request body read as vLLM reads it before tokenizing.
//!
//! Chat: each message reduced to what vLLM hands the template (role;
//! content as one string, text parts joined with newlines, or as a list of
//! text parts for templates that loop over it; no content is `""`; an
//! assistant's `tool_calls` with each `function.arguments` parsed from its
//! JSON string; a tool's `tool_call_id`; `name`), plus `tools`,
//! `documents`, `add_generation_prompt` (default true),
//! `continue_final_message`, `chat_template_kwargs` and
//! `add_special_tokens` (default false: the template writes them).
//!
//! Completions: `prompt` as a string, a list of strings, a list of token
//! ids or a list of such lists; the first prompt counts (one engine serves
//! the body); `add_special_tokens` defaults to true.
//!
//! What cannot be done locally is `Unsupported` (the engine is asked
//! instead when one is configured): multimodal parts, a request's own
//! `chat_template`. A body the engine would refuse is `Rejected` (400).

use minijinja::Value;
use minijinja::value::ValueKind;
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::template::{ChatInput, ContentFormat};
use crate::tokenizer::TokenizeError;

/// A chat body, ready for the template.
pub struct Chat {
    pub input: ChatInput,
    pub add_special_tokens: bool,
}

/// A completion body's first prompt.
pub enum Completion {
    Text { text: String, add_special_tokens: bool, prompts: usize },
    Tokens { ids: Vec<u32>, prompts: usize },
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    documents: Option<Value>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    #[serde(default)]
    chat_template: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    tool_call_id: Option<Value>,
    #[serde(default)]
    name: Option<Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

fn rejected(message: impl Into<String>) -> TokenizeError {
    TokenizeError::Rejected { status: 400, message: message.into() }
}

/// Reads a chat body for a template taking content as `format`.
pub fn chat(body: &[u8], format: ContentFormat) -> Result<Chat, TokenizeError> {
    let body: ChatBody = serde_json::from_slice(body).map_err(|e| rejected(format!("invalid chat request: {e}")))?;
    if body.chat_template.is_some() {
        return Err(TokenizeError::Unsupported("a request's own chat_template"));
    }
    let continue_final = body.continue_final_message.unwrap_or(false);
    let add_generation_prompt = body.add_generation_prompt.unwrap_or(true);
    if continue_final && add_generation_prompt {
        return Err(rejected("continue_final_message and add_generation_prompt cannot both be true"));
    }
    let mut final_text = None;
    let mut messages = Vec::with_capacity(body.messages.len());
    let count = body.messages.len();
    for (i, message) in body.messages.into_iter().enumerate() {
        let texts = match message.content {
            None => Vec::new(),
            Some(Content::Text(text)) => vec![text],
            Some(Content::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for part in parts {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(text)) => texts.push(text),
                        ("text", None) => return Err(rejected("a text content part without `text`")),
                        _ => return Err(TokenizeError::Unsupported("content parts other than text (multimodal)")),
                    }
                }
                texts
            }
        };
        if continue_final && i + 1 == count {
            final_text = Some(match format {
                ContentFormat::String => texts.join("\n"),
                ContentFormat::OpenAi => texts.last().cloned().unwrap_or_default(),
            });
        }
        let content = match format {
            ContentFormat::String => Value::from(texts.join("\n")),
            ContentFormat::OpenAi => texts
                .into_iter()
                .map(|text| Value::from_pairs([("type", Value::from("text")), ("text", Value::from(text))]))
                .collect(),
        };
        let mut fields: Vec<(&str, Value)> = vec![("role", Value::from(message.role.as_str())), ("content", content)];
        if message.role == "assistant" {
            if let Some(calls) = message.tool_calls {
                let calls: Result<Vec<Value>, TokenizeError> = calls.into_iter().map(parse_arguments).collect();
                fields.push(("tool_calls", Value::from(calls?)));
            }
        }
        if message.role == "tool" {
            if let Some(id) = message.tool_call_id {
                fields.push(("tool_call_id", id));
            }
        }
        if let Some(name) = message.name.filter(|n| n.as_str().is_some()) {
            fields.push(("name", name));
        }
        messages.push(Value::from_pairs(fields));
    }
    if continue_final && final_text.is_none() {
        return Err(rejected("continue_final_message is set but there is no message"));
    }
    let mut kwargs = Vec::new();
    if let Some(map) = body.chat_template_kwargs.filter(|v| !v.is_none()) {
        let keys = map.try_iter().map_err(|_| rejected("chat_template_kwargs must be an object"))?;
        for key in keys {
            let Some(name) = key.as_str() else { return Err(rejected("chat_template_kwargs keys must be strings")) };
            let value = map.get_item(&key).map_err(|e| rejected(format!("chat_template_kwargs: {e}")))?;
            kwargs.push((name.to_owned(), value));
        }
    }
    Ok(Chat {
        input: ChatInput {
            messages: Value::from(messages),
            tools: body.tools.filter(|t| !t.is_none()),
            documents: body.documents.filter(|d| !d.is_none()),
            add_generation_prompt,
            continue_final: final_text,
            kwargs,
        },
        add_special_tokens: body.add_special_tokens.unwrap_or(false),
    })
}

/// vLLM parses each tool call's `function.arguments` from its JSON string,
/// so templates see an object (`arguments | tojson` re-serialises it).
fn parse_arguments(call: Value) -> Result<Value, TokenizeError> {
    with_entry(call, "function", |function| {
        with_entry(function, "arguments", |arguments| match arguments.as_str() {
            Some(text) => {
                serde_json::from_str(text).map_err(|e| rejected(format!("tool call arguments are not valid JSON: {e}")))
            }
            None => Ok(arguments),
        })
    })
}

/// `map` with its `key` entry replaced by `f` of it, keys kept in order;
/// anything but a map is returned as it is.
fn with_entry(
    map: Value,
    key: &str,
    f: impl FnOnce(Value) -> Result<Value, TokenizeError>,
) -> Result<Value, TokenizeError> {
    if map.kind() != ValueKind::Map {
        return Ok(map);
    }
    let Ok(keys) = map.try_iter() else { return Ok(map) };
    let mut f = Some(f);
    let mut fields = Vec::new();
    for k in keys {
        let mut value = map.get_item(&k).unwrap_or_default();
        if k.as_str() == Some(key) {
            if let Some(f) = f.take() {
                value = f(value)?;
            }
        }
        fields.push((k, value));
    }
    Ok(Value::from_pairs(fields))
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Prompt,
    #[serde(default)]
    add_special_tokens: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// Reads a completion body's first prompt.
pub fn completion(body: &[u8]) -> Result<Completion, TokenizeError> {
    let body: CompletionBody =
        serde_json::from_slice(body).map_err(|e| rejected(format!("invalid completion request: {e}")))?;
    let add_special_tokens = body.add_special_tokens.unwrap_or(true);
    let first_text = |prompts: Vec<String>| {
        let count = prompts.len();
        match prompts.into_iter().next() {
            Some(text) => Ok(Completion::Text { text, add_special_tokens, prompts: count }),
            None => Err(rejected("prompt is an empty list")),
        }
    };
    match body.prompt {
        Prompt::Text(text) => Ok(Completion::Text { text, add_special_tokens, prompts: 1 }),
        Prompt::Texts(texts) => first_text(texts),
        Prompt::Ids(ids) if ids.is_empty() => Err(rejected("prompt is an empty list")),
        Prompt::Ids(ids) => Ok(Completion::Tokens { ids, prompts: 1 }),
        Prompt::IdLists(lists) => {
            let count = lists.len();
            match lists.into_iter().next() {
                Some(ids) => Ok(Completion::Tokens { ids, prompts: count }),
                None => Err(rejected("prompt is an empty list")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_prompt_forms() {
        let text = |body: &str| match completion(body.as_bytes()) {
            Ok(Completion::Text { text, add_special_tokens, prompts }) => Some((text, add_special_tokens, prompts)),
            _ => None,
        };
        let ids = |body: &str| match completion(body.as_bytes()) {
            Ok(Completion::Tokens { ids, prompts }) => Some((ids, prompts)),
            _ => None,
        };
        assert_eq!(text(r#"{"prompt": "hi"}"#), Some(("hi".into(), true, 1)));
        assert_eq!(text(r#"{"prompt": ["a", "b"], "add_special_tokens": false}"#), Some(("a".into(), false, 2)));
        assert_eq!(ids(r#"{"prompt": [1, 2]}"#), Some((vec![1, 2], 1)));
        assert_eq!(ids(r#"{"prompt": [[3], [4, 5]]}"#), Some((vec![3], 2)));
        for bad in [r#"{"prompt": []}"#, r#"{"prompt": [-1]}"#, r#"{"prompt": 5}"#, r#"{}"#, "nope"] {
            assert!(matches!(completion(bad.as_bytes()), Err(TokenizeError::Rejected { status: 400, .. })), "{bad}");
        }
    }

    #[test]
    fn tool_call_arguments_become_objects_in_order() {
        let body = br#"{"messages": [{"role": "assistant", "content": null, "tool_calls": ["odd",
            {"id": "c1", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}, "type": "function"}]}]}"#;
        let parsed = chat(body, ContentFormat::String).unwrap_or_else(|e| panic!("{e}"));
        let message = parsed.input.messages.get_item_by_index(0).unwrap_or_default();
        assert_eq!(message.get_attr("content").ok().as_ref().and_then(Value::as_str), Some(""));
        let calls = message.get_attr("tool_calls").unwrap_or_default();
        assert_eq!(calls.get_item_by_index(0).ok().as_ref().and_then(Value::as_str), Some("odd"));
        let call = calls.get_item_by_index(1).unwrap_or_default();
        let keys: Vec<String> = call.try_iter().map(|k| k.map(|k| k.to_string()).collect()).unwrap_or_default();
        assert_eq!(keys, ["id", "function", "type"]);
        let arguments = call.get_attr("function").and_then(|f| f.get_attr("arguments")).unwrap_or_default();
        assert_eq!(arguments.kind(), ValueKind::Map);
        let keys: Vec<String> = arguments.try_iter().map(|k| k.map(|k| k.to_string()).collect()).unwrap_or_default();
        assert_eq!(keys, ["b", "a"]);
    }

    #[test]
    fn chat_refusals() {
        let err = |body: &str| chat(body.as_bytes(), ContentFormat::String).err().map(|e| e.to_string());
        let image =
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#;
        assert!(err(image).is_some_and(|e| e.contains("multimodal")));
        assert!(err(r#"{"messages": [], "chat_template": "{{ 1 }}"}"#).is_some_and(|e| e.contains("chat_template")));
        assert!(err(r#"{"messages": [{"role": "user", "content": "x"}], "continue_final_message": true}"#).is_some());
        assert!(err(r#"{"messages": [{"content": "no role"}]}"#).is_some());
        let args =
            r#"{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]}"#;
        assert!(err(args).is_some_and(|e| e.contains("not valid JSON")));
    }
}
