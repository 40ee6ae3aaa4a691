//! The simulated model's tokenizer and chat template: deterministic, pure,
//! the same for every engine, and used both by the render endpoints and by
//! the engine to fill its cache, so a router that tokenizes through render
//! sees exactly the tokens the engine caches.
//!
//! Text is cut into pieces: runs of alphanumeric characters (split every
//! [`MAX_PIECE_CHARS`] characters), single punctuation characters, and
//! newlines; other whitespace only separates pieces. A piece's id is an
//! xxh3-64 of its UTF-8 bytes folded into `[FIRST_PIECE_ID, VOCAB_SIZE)`.
//!
//! Chat template (ChatML-like): `BOS`, then per message
//! `IM_START role NEWLINE content… IM_END NEWLINE`, then, with
//! `add_generation_prompt` (default true), `IM_START assistant NEWLINE`.
//! `continue_final_message` leaves the last message open instead. Text
//! parts of a content list are concatenated with newlines; an image part
//! becomes one token derived from its URL.
//!
//! Generated text is drawn from [`OUTPUT_WORDS`], one token per word with a
//! leading space, so tokenizing a reply gives back the sampled ids (a
//! conversation's next turn reuses the assistant's tokens).

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// Size of the vocabulary; every id is below it.
pub const VOCAB_SIZE: u32 = 151_936;
/// Beginning of sequence (first token of every rendered prompt).
pub const BOS: u32 = 1;
/// End of sequence (never sampled: completions always run to `max_tokens`).
pub const EOS: u32 = 2;
/// Opens a chat message.
pub const IM_START: u32 = 3;
/// Closes a chat message.
pub const IM_END: u32 = 4;
/// A newline in text or in the template.
pub const NEWLINE: u32 = 5;
/// First id of ordinary pieces; ids below are special.
pub const FIRST_PIECE_ID: u32 = 256;
/// Longest piece, in characters.
pub const MAX_PIECE_CHARS: usize = 8;

/// Words the simulated model writes.
pub const OUTPUT_WORDS: [&str; 32] = [
    "the", "cache", "block", "prefix", "token", "router", "engine", "gateway", "request", "model", "fast", "warm",
    "reply", "stream", "batch", "queue", "hit", "miss", "pod", "shard", "load", "score", "reuse", "event", "replay",
    "sequence", "decode", "prefill", "window", "budget", "answer", "done",
];

/// Why a request body cannot be rendered: a client error (HTTP 400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RenderError(pub String);

/// The id of one piece of text.
pub fn piece_id(piece: &str) -> u32 {
    let span = u64::from(VOCAB_SIZE - FIRST_PIECE_ID);
    FIRST_PIECE_ID + (xxh3_64(piece.as_bytes()) % span) as u32
}

/// Tokens of plain text (no special tokens added).
pub fn encode_text(text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / 4 + 1);
    let mut word = String::new();
    let mut word_chars = 0;
    let flush = |word: &mut String, word_chars: &mut usize, out: &mut Vec<u32>| {
        if !word.is_empty() {
            out.push(piece_id(word));
            word.clear();
            *word_chars = 0;
        }
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            if word_chars == MAX_PIECE_CHARS {
                flush(&mut word, &mut word_chars, &mut out);
            }
            word.push(c);
            word_chars += 1;
            continue;
        }
        flush(&mut word, &mut word_chars, &mut out);
        if c == '\n' {
            out.push(NEWLINE);
        } else if !c.is_whitespace() {
            let mut buf = [0u8; 4];
            out.push(piece_id(c.encode_utf8(&mut buf)));
        }
    }
    flush(&mut word, &mut word_chars, &mut out);
    out
}

/// The token of output word `OUTPUT_WORDS[i]`, and its text as streamed.
pub fn output_word(i: usize) -> (u32, String) {
    let word = OUTPUT_WORDS[i % OUTPUT_WORDS.len()];
    (piece_id(word), format!(" {word}"))
}

/// Prompt tokens of a `/v1/chat/completions` body, as the engine computes
/// them (and as `/v1/chat/completions/render` returns them).
pub fn render_chat(body: &Value) -> Result<Vec<u32>, RenderError> {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| RenderError("`messages` must be a list of messages".into()))?;
    if messages.is_empty() {
        return Err(RenderError("`messages` is empty".into()));
    }
    let add_generation_prompt = flag(body, "add_generation_prompt", true)?;
    let continue_final = flag(body, "continue_final_message", false)?;
    if add_generation_prompt && continue_final {
        return Err(RenderError("`continue_final_message` and `add_generation_prompt` cannot both be true".into()));
    }
    let mut out = vec![BOS];
    for (i, message) in messages.iter().enumerate() {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| RenderError(format!("messages[{i}].role must be a string")))?;
        out.extend([IM_START, piece_id(role), NEWLINE]);
        content_tokens(message.get("content"), i, &mut out)?;
        if !(continue_final && i + 1 == messages.len()) {
            out.extend([IM_END, NEWLINE]);
        }
    }
    if add_generation_prompt {
        out.extend([IM_START, piece_id("assistant"), NEWLINE]);
    }
    Ok(out)
}

/// Prompt tokens of each prompt of a `/v1/completions` body (`prompt`: a
/// string, a list of strings, a list of token ids, or a list of such lists).
pub fn render_completion(body: &Value) -> Result<Vec<Vec<u32>>, RenderError> {
    let add_special = flag(body, "add_special_tokens", true)?;
    let text = |s: &str| {
        let mut tokens = if add_special { vec![BOS] } else { Vec::new() };
        tokens.extend(encode_text(s));
        tokens
    };
    let prompts = match body.get("prompt") {
        Some(Value::String(s)) => vec![text(s)],
        Some(Value::Array(items)) if items.is_empty() => return Err(RenderError("`prompt` is an empty list".into())),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            items.iter().filter_map(Value::as_str).map(text).collect()
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => vec![token_ids(items)?],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item.as_array() {
                Some(ids) => token_ids(ids),
                None => Err(RenderError("`prompt` mixes strings, token ids and lists".into())),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(RenderError("`prompt` must be a string, a list of strings or token ids".into())),
    };
    if prompts.iter().any(Vec::is_empty) {
        return Err(RenderError("a prompt renders to no tokens".into()));
    }
    Ok(prompts)
}

fn flag(body: &Value, key: &str, default: bool) -> Result<bool, RenderError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(RenderError(format!("`{key}` must be a boolean"))),
    }
}

fn content_tokens(content: Option<&Value>, i: usize, out: &mut Vec<u32>) -> Result<(), RenderError> {
    match content {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) => {
            out.extend(encode_text(s));
            Ok(())
        }
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                if j > 0 {
                    out.push(NEWLINE);
                }
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = part
                            .get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| RenderError(format!("messages[{i}].content[{j}].text must be a string")))?;
                        out.extend(encode_text(text));
                    }
                    Some("image_url") => {
                        let url = part.pointer("/image_url/url").and_then(Value::as_str).unwrap_or_default();
                        out.push(piece_id(&format!("<image:{url}>")));
                    }
                    _ => return Err(RenderError(format!("messages[{i}].content[{j}] has an unsupported type"))),
                }
            }
            Ok(())
        }
        Some(_) => Err(RenderError(format!("messages[{i}].content must be a string or a list of parts"))),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, RenderError> {
    items
        .iter()
        .map(|v| match v.as_u64() {
            Some(id) if id < u64::from(VOCAB_SIZE) => Ok(id as u32),
            _ => Err(RenderError(format!("token id {v} is not in [0, {VOCAB_SIZE})"))),
        })
        .collect()
}

/// The streamed text of an output token (empty for a token the simulated
/// model never writes, e.g. one named by a client).
pub fn token_text(token_id: u32) -> String {
    (0..OUTPUT_WORDS.len()).map(output_word).find(|(id, _)| *id == token_id).map(|(_, text)| text).unwrap_or_default()
}
