//! The in-process tokenizer (`local:PATH`): the model's own Hugging Face
//! `tokenizer.json` and chat template, so a pick needs no round trip to a
//! tokenizer service. It computes what vLLM computes for the same body:
//! the chat template rendered as transformers renders it ([`template`]),
//! then the tokenizer (`add_special_tokens` false for chat, true for
//! completions, unless the body says otherwise); completion prompts given
//! as token ids are used as they are.
//!
//! - [`files`]: reading a model directory (size caps, clear errors).
//! - [`request`]: the body as vLLM reads it before tokenizing.
//! - [`template`]: the chat template engine (minijinja, jinja2's rules).
//! - [`pyjson`]: transformers' `tojson`.
//!
//! Tokenizing is CPU work (Hugging Face's library takes about 2–3 µs per
//! token on the benchmark machine, 20 ms for an 8k-token prompt): bodies
//! over [`INLINE_MAX_BODY_BYTES`] are tokenized on tokio's blocking pool,
//! not on the I/O threads that carry every other request's stream; short
//! ones inline, where a thread hop would cost more than the work. At most
//! one long body per core is tokenized at once (the others wait their
//! turn): more would only share the same cores, each taking longer, with a
//! thread and its memory per waiting request.
//!
//! The parity sampler (`parity.rs`, beside this module) checks this
//! against the engine.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::metrics::TokenizerMetrics;
use super::{Api, TokenizeError, TokenizeFuture, TokenizeRequest, Tokenizer};

pub mod files;
mod pyjson;
pub mod request;
pub mod template;

pub use files::{LoadError, ModelFiles};
use request::Completion;
use template::ChatTemplate;

/// Bodies up to this size are tokenized on the calling thread: about 150
/// tokens, a few hundred microseconds of an I/O thread at most (at 2–3 µs
/// a token); a hop to the blocking pool costs tens.
pub const INLINE_MAX_BODY_BYTES: usize = 1024;

/// Where the model's files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalTokenizerConfig {
    /// The model directory (`tokenizer.json`, `tokenizer_config.json`, …).
    pub dir: PathBuf,
    /// A Jinja file replacing the model's chat template (what the engine
    /// was given as `--chat-template`).
    pub chat_template: Option<PathBuf>,
}

/// The loaded tokenizer and template. Cheap to clone (shared).
#[derive(Clone)]
pub struct LocalTokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    metrics: Arc<TokenizerMetrics>,
    /// Long bodies tokenizing at once, at most one per core.
    long_bodies: tokio::sync::Semaphore,
}

impl std::fmt::Debug for LocalTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTokenizer").field("chat_template", &self.inner.template.is_some()).finish()
    }
}

impl LocalTokenizer {
    /// Reads and compiles the model's files; the error names the file.
    pub fn load(config: &LocalTokenizerConfig, metrics: Arc<TokenizerMetrics>) -> Result<LocalTokenizer, LoadError> {
        let files = ModelFiles::load(&config.dir, config.chat_template.as_deref())?;
        let tokenizer_path = files.dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_bytes(&files.tokenizer_json)
            .map_err(|e| LoadError::new(&tokenizer_path, format!("not a Hugging Face tokenizer: {e}")))?;
        let template_path = files.template_source.clone().unwrap_or_else(|| files.dir.clone());
        let template =
            ChatTemplate::new(&files.templates, &files.special).map_err(|e| LoadError::new(&template_path, e))?;
        match &files.template_source {
            Some(source) => tracing::info!(
                dir = %files.dir.display(),
                template = %source.display(),
                vocab = tokenizer.get_vocab_size(true),
                "local tokenizer loaded"
            ),
            None => tracing::warn!(
                dir = %files.dir.display(),
                "local tokenizer loaded without a chat template: chat requests will be handed to the engine's tokenizer, or routed by load"
            ),
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let long_bodies = tokio::sync::Semaphore::new(cores);
        Ok(LocalTokenizer { inner: Arc::new(Inner { tokenizer, template, metrics, long_bodies }) })
    }

    /// The token ids for `body` as `api`, on this thread (what the async
    /// path runs; public for benchmarks and the parity sampler).
    pub fn tokenize_body(&self, api: Api, body: &[u8]) -> Result<Vec<u32>, TokenizeError> {
        self.inner.tokenize(api, body)
    }

    /// The prompt text a chat body renders to (for diagnostics and tests).
    pub fn render_chat(&self, body: &[u8]) -> Result<String, TokenizeError> {
        self.inner.render(body).map(|(text, _)| text)
    }

    /// The text of `ids`, special tokens included (for log lines).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.tokenizer.decode(ids, false).unwrap_or_else(|e| format!("<undecodable: {e}>"))
    }
}

impl Inner {
    fn render(&self, body: &[u8]) -> Result<(String, bool), TokenizeError> {
        let Some(template) = &self.template else {
            return Err(TokenizeError::Unsupported("chat bodies (the model directory has no chat template)"));
        };
        let chat = request::chat(body, template.format)?;
        let text = template.render(chat.input).map_err(|message| TokenizeError::Rejected { status: 400, message })?;
        Ok((text, chat.add_special_tokens))
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::Upstream(format!("local tokenizer failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn tokenize(&self, api: Api, body: &[u8]) -> Result<Vec<u32>, TokenizeError> {
        match api {
            Api::ChatCompletions => {
                let (text, add_special_tokens) = self.render(body)?;
                self.encode(&text, add_special_tokens)
            }
            Api::Completions => {
                let (ids, prompts) = match request::completion(body)? {
                    Completion::Text { text, add_special_tokens, prompts } => {
                        (self.encode(&text, add_special_tokens)?, prompts)
                    }
                    Completion::Tokens { ids, prompts } => (ids, prompts),
                };
                if prompts > 1 {
                    self.metrics.record_multi_prompt();
                }
                Ok(ids)
            }
        }
    }

    /// Tokenizes, timing it into the metrics (as the RPC clients do).
    fn metered(&self, api: Api, body: &[u8]) -> Result<Vec<u32>, TokenizeError> {
        let start = Instant::now();
        let result = self.tokenize(api, body);
        self.metrics.record_call(start.elapsed(), &result);
        if let Err(error) = &result {
            tracing::debug!(protocol = "local", %error, "tokenize failed");
        }
        result
    }
}

impl Tokenizer for LocalTokenizer {
    fn tokenize(&self, request: TokenizeRequest) -> TokenizeFuture<'_> {
        if request.body.len() <= INLINE_MAX_BODY_BYTES {
            let result = self.inner.metered(request.api, &request.body);
            return Box::pin(std::future::ready(result));
        }
        let inner = self.inner.clone();
        Box::pin(async move {
            // Never closed, so acquiring only waits.
            let _turn = inner.long_bodies.acquire().await;
            let work = inner.clone();
            tokio::task::spawn_blocking(move || work.metered(request.api, &request.body))
                .await
                .unwrap_or_else(|e| Err(TokenizeError::Upstream(format!("local tokenizer task failed: {e}"))))
        })
    }
}

/// `local:PATH` → the path (the `--tokenizer` setting's form).
pub fn parse_local_spec(spec: &str) -> Option<&Path> {
    spec.trim().strip_prefix("local:").map(str::trim).filter(|p| !p.is_empty()).map(Path::new)
}
