//! Turning a request body into the engine's own token ids.
//!
//! KV-aware routing needs exactly the tokens the engine will cache, so the
//! engine's tokenizer service is asked (vLLM's render endpoints, SGLang's
//! `/tokenize`). The clients live in submodules; the ext_proc server only
//! sees this trait.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

/// Which OpenAI API the body belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    ChatCompletions,
    Completions,
}

#[derive(Clone, Debug)]
pub struct TokenizeRequest {
    pub api: Api,
    /// The client's body, byte for byte.
    pub body: Bytes,
    pub model: String,
    /// A completion's prompt when it is one string (what `/tokenize`
    /// takes); `None` for chat bodies and token-array prompts.
    pub prompt: Option<String>,
}

/// What went wrong, classified by who is to blame and what the gateway is
/// told (mapped to a status in one place: `TokenizeError::http_status`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenizeError {
    /// This tokenizer cannot handle this kind of body (e.g. chat on
    /// SGLang's `/tokenize`): not a failure, the policy decides.
    #[error("tokenizer does not support this request: {0}")]
    Unsupported(&'static str),
    #[error("tokenizer unreachable: {0}")]
    Unreachable(String),
    #[error("tokenizer timed out")]
    Timeout,
    /// The engine refused the request (4xx): the client's fault.
    #[error("tokenizer rejected the request ({status}): {message}")]
    Rejected { status: u16, message: String },
    /// The engine failed (5xx), answered something unreadable, or too much.
    #[error("tokenizer failed: {0}")]
    Upstream(String),
}

impl TokenizeError {
    /// The status the gateway gets when the policy is to fail.
    pub fn http_status(&self) -> u16 {
        match self {
            TokenizeError::Unsupported(_) => 400,
            TokenizeError::Unreachable(_) => 503,
            TokenizeError::Timeout => 504,
            TokenizeError::Rejected { .. } => 400,
            TokenizeError::Upstream(_) => 502,
        }
    }
}

pub type TokenizeFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<u32>, TokenizeError>> + Send + 'a>>;

pub trait Tokenizer: Send + Sync + 'static {
    fn tokenize(&self, request: TokenizeRequest) -> TokenizeFuture<'_>;
}

/// What to do when tokenizing fails or is not supported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FallbackPolicy {
    /// Answer the gateway with the error's status.
    Fail,
    /// Route by load alone (no KV overlap), counted in a metric.
    #[default]
    LoadOnly,
}
