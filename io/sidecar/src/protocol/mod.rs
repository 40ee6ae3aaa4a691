//! The three engines' P/D protocols as pure rewrites of the request's JSON
//! (engines.md §3–5): what each leg sends and what is taken from the
//! prefill's answer. No I/O here; `flow` runs the legs.

pub mod sglang;
pub mod trtllm;
pub mod vllm;

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

use crate::config::EngineKind;

/// The routes that are split; everything else goes to the decode engine
/// untouched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
    /// vLLM's tokens-in, tokens-out `/inference/v1/generate`.
    VllmGenerate,
    /// SGLang's native `/generate`.
    SglangGenerate,
}

impl Route {
    /// The route of a path as the engine's server routes it: percent
    /// escapes decoded first (uvicorn decodes them before routing, so
    /// `/v1/chat/%63ompletions` is chat to the engine and must be to the
    /// sidecar too).
    pub fn of(path: &str, engine: EngineKind) -> Option<Route> {
        let decoded;
        let path = if path.contains('%') {
            decoded = percent_decoded(path)?;
            decoded.as_str()
        } else {
            path
        };
        match (path, engine) {
            ("/v1/chat/completions", _) => Some(Route::Chat),
            ("/v1/completions", _) => Some(Route::Completions),
            ("/inference/v1/generate", EngineKind::Vllm) => Some(Route::VllmGenerate),
            ("/generate", EngineKind::Sglang) => Some(Route::SglangGenerate),
            _ => None,
        }
    }
}

/// `%XX` escapes decoded; `None` when they do not make UTF-8 (the engine
/// answers such a path itself).
fn percent_decoded(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Whether the client asked for a streamed answer.
pub fn streamed(body: &Body) -> bool {
    body.get("stream").and_then(|v| v.as_bool()).unwrap_or(false)
}

/// A request body's top-level fields, each value kept as the client wrote
/// it. The legs add, replace and remove top-level fields only; everything
/// below (a tool's JSON schema, a `response_format`) goes to the engines
/// byte for byte, in the client's key order, which the engines' chat
/// templates and structured output follow. (A parsed `serde_json::Value`
/// would sort every object's keys.)
#[derive(Clone, Debug, Default)]
pub struct Body(BTreeMap<String, Box<RawValue>>);

impl Body {
    /// A JSON object's fields; anything else is an error.
    pub fn parse(bytes: &[u8]) -> Result<Body, serde_json::Error> {
        serde_json::from_slice(bytes).map(Body)
    }

    /// A field, parsed.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.0.get(key).and_then(|raw| serde_json::from_str(raw.get()).ok())
    }

    /// A field as the client wrote it.
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|raw| raw.get())
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// The top-level field names, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Sets a field (a value of our own: it always serializes).
    pub fn insert(&mut self, key: &str, value: Value) {
        if let Ok(raw) = serde_json::value::to_raw_value(&value) {
            self.0.insert(key.to_owned(), raw);
        }
    }

    /// Removes a field; whether it was there.
    pub fn remove(&mut self, key: &str) -> bool {
        self.0.remove(key).is_some()
    }

    /// The body as JSON text.
    pub fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec(&self.0).unwrap_or_default()
    }

    /// The whole body parsed (tests, the fuzz target).
    pub fn to_value(&self) -> Value {
        serde_json::from_slice(&self.to_vec()).unwrap_or(Value::Null)
    }
}

/// Why a prefill leg's answer cannot be decoded from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(pub String);

/// A test's JSON literal as the body the rewrites take.
#[cfg(test)]
pub(crate) fn object(v: Value) -> Body {
    Body::parse(v.to_string().as_bytes()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_keeps_nested_key_order_and_values_as_written() {
        let text = br#"{"tools":[{"function":{"parameters":{"properties":{"zeta":{},"alpha":{}}}}}],"n":1.50}"#;
        let mut body = Body::parse(text).unwrap_or_default();
        assert_eq!(body.raw("tools"), Some(r#"[{"function":{"parameters":{"properties":{"zeta":{},"alpha":{}}}}}]"#));
        body.insert("stream", Value::Bool(false));
        assert!(body.remove("n") && !body.remove("n"));
        let out = String::from_utf8(body.to_vec()).unwrap_or_default();
        assert_eq!(
            out,
            r#"{"stream":false,"tools":[{"function":{"parameters":{"properties":{"zeta":{},"alpha":{}}}}}]}"#
        );
        assert!(Body::parse(b"[1]").is_err() && Body::parse(b"{").is_err());
    }

    #[test]
    fn a_number_past_f64_goes_to_the_engine_as_written() {
        // Found by fuzzing (`sidecar_request`): RFC 8259 sets no range on
        // numbers, and the engines' Python `json` reads this one as `inf`
        // and lets the engine answer for it, as it does when the request is
        // not split. A `serde_json::Value` (without serde_json's
        // `arbitrary_precision`) refuses it, so the sidecar must never pass
        // a client's value through one.
        let text = b"{\"\":\r8888888888888888e888888888880}";
        let body = Body::parse(text).unwrap_or_default();
        assert_eq!(body.raw(""), Some("8888888888888888e888888888880"));
        assert_eq!(body.keys().collect::<Vec<_>>(), [""]);
        assert_eq!(body.to_vec(), b"{\"\":8888888888888888e888888888880}");
        let leg = trtllm::context_body(&body, true);
        assert_eq!(Body::parse(&leg.to_vec()).ok().and_then(|b| b.raw("").map(str::to_owned)).as_deref(), body.raw(""));
    }

    #[test]
    fn only_the_generation_routes_are_split() {
        assert_eq!(Route::of("/v1/chat/completions", EngineKind::Sglang), Some(Route::Chat));
        assert_eq!(Route::of("/inference/v1/generate", EngineKind::Vllm), Some(Route::VllmGenerate));
        assert_eq!(Route::of("/inference/v1/generate", EngineKind::Trtllm), None);
        assert_eq!(Route::of("/generate", EngineKind::Sglang), Some(Route::SglangGenerate));
        assert_eq!(Route::of("/v1/models", EngineKind::Vllm), None);
        assert_eq!(Route::of("/v1/chat/completions/render", EngineKind::Vllm), None);
        // Escapes are the engine's server's business first: decoded alike.
        assert_eq!(Route::of("/v1/chat/%63ompletions", EngineKind::Vllm), Some(Route::Chat));
        assert_eq!(Route::of("/v1/%63ompletions", EngineKind::Vllm), Some(Route::Completions));
        assert_eq!(Route::of("/v1/models%", EngineKind::Vllm), None);
        assert_eq!(Route::of("/v1/%ff", EngineKind::Vllm), None);
    }
}
