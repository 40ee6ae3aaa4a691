//! SGLang's `/tokenize` (`sglang-tokenize`): `POST {base}/tokenize` with
//! `{"model", "prompt"}`, answer `{"tokens": [u32], "count", ...}`.
//!
//! The endpoint takes a prompt string only: chat bodies (no chat-messages
//! variant exists, and SGLang's chat template cannot be applied from here)
//! and completion prompts that are not one string are
//! [`TokenizeError::Unsupported`], for the fallback policy to decide.
//! `add_special_tokens` is left at SGLang's default (true), as its
//! `/v1/completions` does.

use std::sync::Arc;

use bytes::Bytes;
use hyper::Uri;
use serde::{Deserialize, Serialize};

use super::http_client::HttpClient;
use super::metrics::TokenizerMetrics;
use super::{Api, TokenizeError, TokenizeFuture, TokenizeRequest, Tokenizer, endpoint, metered};

pub const TOKENIZE_PATH: &str = "/tokenize";

/// The `sglang-tokenize` client. Cheap to share: one pool for every request.
#[derive(Debug)]
pub struct SglangTokenizer {
    http: HttpClient,
    tokenize: Uri,
    metrics: Arc<TokenizerMetrics>,
}

#[derive(Serialize)]
struct TokenizeBody<'a> {
    model: &'a str,
    prompt: &'a str,
}

#[derive(Deserialize)]
struct Tokens {
    tokens: Vec<u32>,
}

impl SglangTokenizer {
    /// `base_url`: `http://host[:port][/prefix]`. The error says what is
    /// wrong with it.
    pub fn new(base_url: &str, http: HttpClient, metrics: Arc<TokenizerMetrics>) -> Result<Self, String> {
        Ok(SglangTokenizer { tokenize: endpoint(base_url, TOKENIZE_PATH)?, http, metrics })
    }

    async fn call(&self, request: TokenizeRequest) -> Result<Vec<u32>, TokenizeError> {
        let prompt = match (request.api, &request.prompt) {
            (Api::ChatCompletions, _) => {
                return Err(TokenizeError::Unsupported("chat bodies (SGLang /tokenize takes only a prompt)"));
            }
            (Api::Completions, None) => {
                return Err(TokenizeError::Unsupported("completion prompts that are not one string"));
            }
            (Api::Completions, Some(prompt)) => prompt,
        };
        let body = serde_json::to_vec(&TokenizeBody { model: &request.model, prompt })
            .map_err(|e| TokenizeError::Upstream(format!("encoding the tokenize request: {e}")))?;
        let answer = self.http.post_json(&self.tokenize, Bytes::from(body), &self.metrics).await?;
        Self::decode_tokens(&answer)
    }

    /// The token ids out of a `/tokenize` answer (public for the fuzz target).
    pub fn decode_tokens(answer: &[u8]) -> Result<Vec<u32>, TokenizeError> {
        let tokens: Tokens = serde_json::from_slice(answer)
            .map_err(|e| TokenizeError::Upstream(format!("malformed tokenize answer: {e}")))?;
        Ok(tokens.tokens)
    }
}

impl Tokenizer for SglangTokenizer {
    fn tokenize(&self, request: TokenizeRequest) -> TokenizeFuture<'_> {
        Box::pin(metered(&self.metrics, "sglang-tokenize", self.call(request)))
    }
}
