//! The three engines' P/D protocols as pure rewrites of the request's JSON
//! (engines.md §3–5): what each leg sends and what is taken from the
//! prefill's answer. No I/O here; `flow` runs the legs.

pub mod sglang;
pub mod trtllm;
pub mod vllm;

use serde_json::Value;

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
pub fn streamed(body: &Value) -> bool {
    body.get("stream").and_then(Value::as_bool).unwrap_or(false)
}

/// Why a prefill leg's answer cannot be decoded from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(pub String);

/// A test's JSON literal as the body map the rewrites take.
#[cfg(test)]
pub(crate) fn object(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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
