//! SGLang's bootstrap protocol (engines.md §4, after its `mini_lb` and the
//! gateway's PD mode): the same body goes to both engines at once, with
//! the prefill's bootstrap address and a random room that pairs the two
//! requests; only the decode engine's answer is returned.

use std::net::IpAddr;

use serde_json::{Value, json};

use super::{Body, Route};

/// A room is a random non-negative i64 (`random.randint(0, 2**63-1)`).
pub fn room() -> u64 {
    fastrand::u64(..=i64::MAX as u64)
}

/// How many prompts a body holds: on `/generate`, `text` as a list or
/// `input_ids` as a list of lists; on `/v1/completions`, `prompt` as a list
/// of strings or of token lists (a flat list of ids is one prompt). `None`
/// for a single prompt.
fn batch_size(body: &Body, route: Route) -> Option<usize> {
    // Parsed only when written as a list (a plain string prompt is not).
    let list = |key: &str| match body.raw(key).filter(|r| r.trim_start().starts_with('[')).and(body.get(key)) {
        Some(Value::Array(items)) => Some(items),
        _ => None,
    };
    match route {
        Route::SglangGenerate => {
            if let Some(texts) = list("text") {
                return Some(texts.len());
            }
            list("input_ids").filter(|ids| ids.first().is_some_and(Value::is_array)).map(|ids| ids.len())
        }
        Route::Completions => {
            list("prompt").filter(|p| p.first().is_some_and(|f| f.is_string() || f.is_array())).map(|p| p.len())
        }
        _ => None,
    }
}

/// The body both legs get. A batch gets one room per prompt and the
/// host and port repeated, as lists.
pub fn with_bootstrap(original: &Body, route: Route, host: IpAddr, port: u16) -> Body {
    let mut body = original.clone();
    let batch = batch_size(original, route);
    match batch {
        None => {
            body.insert("bootstrap_host", json!(host.to_string()));
            body.insert("bootstrap_port", json!(port));
            body.insert("bootstrap_room", json!(room()));
        }
        Some(n) => {
            body.insert("bootstrap_host", json!(vec![host.to_string(); n]));
            body.insert("bootstrap_port", json!(vec![port; n]));
            body.insert("bootstrap_room", json!((0..n).map(|_| room()).collect::<Vec<_>>()));
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::object;

    #[test]
    fn one_prompt_gets_one_room_and_the_prefills_bootstrap_address() {
        let original = object(json!({"model": "m", "messages": [], "stream": true, "max_tokens": 9}));
        let host: IpAddr = "10.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
        let body = with_bootstrap(&original, Route::Chat, host, 8998);
        assert_eq!(body.get("bootstrap_host"), Some(json!("10.0.0.1")));
        assert_eq!(body.get("bootstrap_port"), Some(json!(8998)));
        let room = body.get("bootstrap_room").and_then(|r| r.as_u64()).unwrap_or(u64::MAX);
        assert!(room <= i64::MAX as u64);
        // Everything the client sent is kept as it was.
        for key in ["model", "messages", "stream", "max_tokens"] {
            assert_eq!(body.raw(key), original.raw(key), "{key}");
        }
        let v6 = with_bootstrap(&original, Route::Chat, "fd00::1".parse().unwrap_or_else(|e| panic!("{e}")), 1);
        assert_eq!(v6.get("bootstrap_host"), Some(json!("fd00::1")));
    }

    #[test]
    fn a_native_batch_gets_a_room_per_prompt() {
        let host: IpAddr = "10.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
        for original in [json!({"text": ["a", "b", "c"]}), json!({"input_ids": [[1], [2], [3]]})] {
            let body = with_bootstrap(&object(original), Route::SglangGenerate, host, 8998);
            assert_eq!(body.get("bootstrap_host"), Some(json!(["10.0.0.1", "10.0.0.1", "10.0.0.1"])));
            assert_eq!(body.get("bootstrap_port"), Some(json!([8998, 8998, 8998])));
            let rooms = body.get("bootstrap_room").and_then(|r| r.as_array().map(Vec::len)).unwrap_or(0);
            assert_eq!(rooms, 3);
        }
        // An OpenAI completions batch, as SGLang's router sends it: a room each.
        let prompts = with_bootstrap(&object(json!({"prompt": ["a", "b"]})), Route::Completions, host, 8998);
        assert_eq!(prompts.get("bootstrap_room").and_then(|r| r.as_array().map(Vec::len)), Some(2));
        let ids = with_bootstrap(&object(json!({"prompt": [1, 2, 3]})), Route::Completions, host, 8998);
        assert!(ids.get("bootstrap_room").is_some_and(|r| r.is_u64()), "a flat id list is one prompt");
        // A flat input_ids list is one prompt.
        let single = with_bootstrap(&object(json!({"input_ids": [1, 2]})), Route::SglangGenerate, host, 8998);
        assert!(single.get("bootstrap_room").is_some_and(|r| r.is_u64()));
    }
}
