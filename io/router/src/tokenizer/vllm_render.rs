//! vLLM's render endpoints (`vllm-render`): the engine applies exactly the
//! preprocessing of `/v1/chat/completions` or `/v1/completions` (chat
//! template, special tokens, multimodal placeholders) and returns the token
//! ids, without generating.
//!
//! - Chat bodies: `POST {base}/v1/chat/completions/render`, the client's body
//!   byte for byte, answer `{"token_ids": [u32], ...}`.
//! - Completion bodies: `POST {base}/v1/completions/render`, the client's body
//!   byte for byte, answer a list of such objects, one per prompt.
//!
//! Several prompts in one completion body: the whole body goes to one
//! engine, so the pick is made on the **first** prompt's tokens; the others
//! are not parsed (only counted) and the request is counted in
//! [`TokenizerMetrics`]' `multi_prompt`. A single object instead of a list
//! is accepted as one prompt; an empty list is a bad answer (`Upstream`).
//!
//! Other fields of the answer are ignored. Any path prefix of the base URL
//! is kept (`http://gw/vllm` → `http://gw/vllm/v1/chat/completions/render`).

use std::fmt;
use std::sync::Arc;

use hyper::Uri;
use serde::de::value::MapAccessDeserializer;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::http_client::HttpClient;
use super::metrics::TokenizerMetrics;
use super::{Api, TokenizeError, TokenizeFuture, TokenizeRequest, Tokenizer, endpoint, metered};

pub const CHAT_RENDER_PATH: &str = "/v1/chat/completions/render";
pub const COMPLETIONS_RENDER_PATH: &str = "/v1/completions/render";

/// The `vllm-render` client. Cheap to share: one pool for every request.
#[derive(Debug)]
pub struct VllmRenderTokenizer {
    http: HttpClient,
    chat: Uri,
    completions: Uri,
    metrics: Arc<TokenizerMetrics>,
}

impl VllmRenderTokenizer {
    /// `base_url`: `http://host[:port][/prefix]`. The error says what is
    /// wrong with it.
    pub fn new(base_url: &str, http: HttpClient, metrics: Arc<TokenizerMetrics>) -> Result<Self, String> {
        Ok(VllmRenderTokenizer {
            chat: endpoint(base_url, CHAT_RENDER_PATH)?,
            completions: endpoint(base_url, COMPLETIONS_RENDER_PATH)?,
            http,
            metrics,
        })
    }

    async fn render(&self, request: TokenizeRequest) -> Result<Vec<u32>, TokenizeError> {
        match request.api {
            Api::ChatCompletions => {
                let answer = self.http.post_json(&self.chat, request.body, &self.metrics).await?;
                Self::decode_chat(&answer)
            }
            Api::Completions => {
                let answer = self.http.post_json(&self.completions, request.body, &self.metrics).await?;
                let (token_ids, prompts) = Self::decode_completions(&answer)?;
                if prompts > 1 {
                    self.metrics.record_multi_prompt();
                    tracing::debug!(prompts, "several prompts in one body: picking on the first");
                }
                Ok(token_ids)
            }
        }
    }

    /// The token ids out of a chat render answer (public for benchmarks).
    pub fn decode_chat(answer: &[u8]) -> Result<Vec<u32>, TokenizeError> {
        let rendered: Rendered = serde_json::from_slice(answer)
            .map_err(|e| TokenizeError::Upstream(format!("malformed chat render answer: {e}")))?;
        Ok(rendered.token_ids)
    }

    /// The first prompt's token ids out of a completions render answer, and
    /// how many prompts it held (public for benchmarks).
    pub fn decode_completions(answer: &[u8]) -> Result<(Vec<u32>, usize), TokenizeError> {
        let rendered: FirstRendered = serde_json::from_slice(answer)
            .map_err(|e| TokenizeError::Upstream(format!("malformed completions render answer: {e}")))?;
        match rendered.token_ids {
            Some(token_ids) => Ok((token_ids, rendered.prompts)),
            None => Err(TokenizeError::Upstream("completions render answered an empty list".into())),
        }
    }
}

impl Tokenizer for VllmRenderTokenizer {
    fn tokenize(&self, request: TokenizeRequest) -> TokenizeFuture<'_> {
        Box::pin(metered(&self.metrics, "vllm-render", self.render(request)))
    }
}

/// One rendered prompt (vLLM's `GenerateRequest`); only its tokens matter.
#[derive(Deserialize)]
struct Rendered {
    token_ids: Vec<u32>,
}

/// `/v1/completions/render`'s answer reduced to the first prompt's tokens
/// and the number of prompts; later prompts are skipped, not built.
struct FirstRendered {
    token_ids: Option<Vec<u32>>,
    prompts: usize,
}

impl<'de> Deserialize<'de> for FirstRendered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FirstVisitor;

        impl<'de> Visitor<'de> for FirstVisitor {
            type Value = FirstRendered;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of rendered prompts with `token_ids`")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstRendered, A::Error> {
                let first = seq.next_element::<Rendered>()?;
                let mut prompts = usize::from(first.is_some());
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    prompts += 1;
                }
                Ok(FirstRendered { token_ids: first.map(|r| r.token_ids), prompts })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<FirstRendered, A::Error> {
                let one = Rendered::deserialize(MapAccessDeserializer::new(map))?;
                Ok(FirstRendered { token_ids: Some(one.token_ids), prompts: 1 })
            }
        }

        deserializer.deserialize_any(FirstVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(json: &str) -> Result<(Option<Vec<u32>>, usize), serde_json::Error> {
        serde_json::from_str::<FirstRendered>(json).map(|r| (r.token_ids, r.prompts))
    }

    #[test]
    fn completions_answers() {
        let two = r#"[{"request_id":"a","token_ids":[1,2],"model":"m"},{"token_ids":[3],"features":null}]"#;
        assert_eq!(first(two).ok(), Some((Some(vec![1, 2]), 2)));
        assert_eq!(first(r#"{"token_ids":[7]}"#).ok(), Some((Some(vec![7]), 1)));
        assert_eq!(first("[]").ok(), Some((None, 0)));
        assert!(first(r#"[{"token_ids":[-1]}]"#).is_err());
        assert!(first(r#"[{"prompt_token_ids":[1]}]"#).is_err());
        assert!(first(r#""text""#).is_err());
    }
}
