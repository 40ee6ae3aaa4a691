//! The client's OpenAI JSON body, read for what routing needs: `model`,
//! which API it is (`messages` or `prompt`), `stream`, `cache_salt` and
//! vLLM's `priority`. Message contents are skipped, never copied: the
//! tokenizer gets the body bytes unchanged.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::error::RequestError;

/// Which OpenAI API the body belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    ChatCompletions,
    Completions,
}

impl Api {
    /// The API's name in traces and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::ChatCompletions => "chat_completions",
            Api::Completions => "completions",
        }
    }
}

/// What routing reads from a request body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestBody {
    pub model: String,
    /// From the body's shape when the path does not say: `messages` →
    /// chat, `prompt` → completions.
    pub api: Option<Api>,
    /// A completion's prompt when it is one string.
    pub prompt: Option<String>,
    pub stream: bool,
    pub cache_salt: Option<String>,
    /// Queue priority for kvpick's core: higher is admitted first. vLLM's
    /// body `priority` is the other way round (lower runs first), so it is
    /// negated.
    pub priority: i32,
    /// A body `session_id` (llm-d's session affinity), when a usable
    /// string (see `headers::session_key`).
    pub session_id: Option<String>,
}

#[derive(Deserialize)]
struct Raw<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    messages: Option<IgnoredAny>,
    #[serde(borrow, default)]
    prompt: Option<Prompt<'a>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
    #[serde(default)]
    priority: Option<i64>,
    /// Any JSON: only a string is a session key, anything else is ignored
    /// rather than refused.
    #[serde(borrow, default)]
    session_id: Option<Prompt<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Other(IgnoredAny),
}

impl RequestBody {
    /// Parses `body`; the path's API (if known) wins over the body's shape.
    pub fn parse(body: &[u8], path_api: Option<Api>) -> Result<RequestBody, RequestError> {
        let raw: Raw<'_> = serde_json::from_slice(body).map_err(|e| RequestError::InvalidJson(e.to_string()))?;
        let model = match raw.model {
            Some(model) if !model.trim().is_empty() => model.into_owned(),
            _ => return Err(RequestError::MissingModel),
        };
        let shape_api = match (&raw.messages, &raw.prompt) {
            (Some(_), _) => Some(Api::ChatCompletions),
            (None, Some(_)) => Some(Api::Completions),
            (None, None) => None,
        };
        let api = path_api.or(shape_api);
        let prompt = match (api, raw.prompt) {
            (Some(Api::Completions), Some(Prompt::Text(text))) => Some(text.into_owned()),
            _ => None,
        };
        let priority = raw.priority.map_or(0, |p| {
            let clamped = p.saturating_neg().clamp(i64::from(i32::MIN), i64::from(i32::MAX));
            i32::try_from(clamped).unwrap_or_default()
        });
        Ok(RequestBody {
            model,
            api,
            prompt,
            stream: raw.stream.unwrap_or(false),
            cache_salt: raw.cache_salt.map(Cow::into_owned).filter(|s| !s.is_empty()),
            priority,
            session_id: match raw.session_id {
                Some(Prompt::Text(text)) => crate::headers::session_key(text.as_bytes()),
                _ => None,
            },
        })
    }
}

/// The API a request path names, if it is one kvpick can tokenize.
pub fn api_of_path(route: &str) -> Option<Api> {
    let route = route.trim_end_matches('/');
    if route.ends_with("/chat/completions") {
        Some(Api::ChatCompletions)
    } else if route.ends_with("/completions") {
        Some(Api::Completions)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
