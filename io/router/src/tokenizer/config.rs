//! Which tokenizer to ask, and how: values validated with errors that name
//! the field, the bad value and what is allowed, and turned into a client.
//! The flags and environment variables that set them (named after Dynamo's
//! standalone EPP, DESIGN.md §7) are the app's: it names the setting when
//! it reports one of these errors.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::http_client::HttpClient;
use super::local::{LocalTokenizer, LocalTokenizerConfig};
use super::metrics::TokenizerMetrics;
use super::parity::{ParityChecked, ParityConfig};
use super::sglang::SglangTokenizer;
use super::vllm_render::VllmRenderTokenizer;
use super::{FallbackPolicy, Tokenizer};

pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5000);
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A field of [`TokenizerConfig`], as an error names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerField {
    BaseUrl,
    Protocol,
    Timeout,
    MaxResponseBytes,
    Fallback,
    /// The local tokenizer's model directory or chat template file.
    Local,
    ParityRatio,
}

impl TokenizerField {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenizerField::BaseUrl => "base_url",
            TokenizerField::Protocol => "protocol",
            TokenizerField::Timeout => "timeout",
            TokenizerField::MaxResponseBytes => "max_response_bytes",
            TokenizerField::Fallback => "fallback",
            TokenizerField::Local => "local",
            TokenizerField::ParityRatio => "parity_ratio",
        }
    }
}

impl fmt::Display for TokenizerField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tokenizer {field}={value:?} is invalid: {allowed}")]
pub struct TokenizerConfigError {
    /// Which value; the app names the setting (flag or variable) that gave it.
    pub field: TokenizerField,
    pub value: String,
    /// What is wrong and what is allowed.
    pub allowed: String,
}

impl TokenizerConfigError {
    fn new(field: TokenizerField, value: impl Into<String>, allowed: impl Into<String>) -> Self {
        TokenizerConfigError { field, value: value.into(), allowed: allowed.into() }
    }
}

/// The tokenizer service's wire protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerProtocol {
    /// vLLM's `/v1/chat/completions/render` and `/v1/completions/render`.
    VllmRender,
    /// SGLang's `/tokenize` (completion prompts only).
    SglangTokenize,
}

impl TokenizerProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenizerProtocol::VllmRender => "vllm-render",
            TokenizerProtocol::SglangTokenize => "sglang-tokenize",
        }
    }
}

impl fmt::Display for TokenizerProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TokenizerProtocol {
    type Err = TokenizerConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "vllm-render" => Ok(TokenizerProtocol::VllmRender),
            "sglang-tokenize" => Ok(TokenizerProtocol::SglangTokenize),
            _ => Err(TokenizerConfigError::new(
                TokenizerField::Protocol,
                text,
                "expected `vllm-render` or `sglang-tokenize`",
            )),
        }
    }
}

impl FallbackPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackPolicy::Fail => "fail",
            FallbackPolicy::LoadOnly => "load-only",
        }
    }
}

impl fmt::Display for FallbackPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FallbackPolicy {
    type Err = TokenizerConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "fail" => Ok(FallbackPolicy::Fail),
            "load-only" => Ok(FallbackPolicy::LoadOnly),
            _ => Err(TokenizerConfigError::new(TokenizerField::Fallback, text, "expected `fail` or `load-only`")),
        }
    }
}

/// Everything needed to build the tokenizer client.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizerConfig {
    pub protocol: TokenizerProtocol,
    /// `http://host[:port][/prefix]`; the endpoint paths are appended to the
    /// prefix. Empty only with `local`: no engine tokenizer then (no parity
    /// checks, no hand-offs).
    pub base_url: String,
    /// Bounds each whole round trip (connect, send, answer). At least 1 ms.
    pub timeout: Duration,
    /// Largest successful answer read, enforced while it streams. At least 1.
    pub max_response_bytes: usize,
    /// What the ext_proc server does when tokenizing fails or is not
    /// supported (carried here, applied there).
    pub fallback: FallbackPolicy,
    /// Tokenize in process with the model's files; the engine's tokenizer
    /// (above) then checks it and takes what it cannot handle.
    pub local: Option<LocalTokenizerConfig>,
    /// How the local tokenizer is checked against the engine's.
    pub parity: ParityConfig,
}

impl TokenizerConfig {
    /// The defaults of DESIGN.md §7 for this protocol and URL.
    pub fn new(protocol: TokenizerProtocol, base_url: impl Into<String>) -> TokenizerConfig {
        TokenizerConfig {
            protocol,
            base_url: base_url.into(),
            timeout: DEFAULT_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            fallback: FallbackPolicy::default(),
            local: None,
            parity: ParityConfig::default(),
        }
    }

    /// Whether an engine tokenizer is configured (always, unless local).
    pub fn has_engine(&self) -> bool {
        self.local.is_none() || !self.base_url.trim().is_empty()
    }

    /// Checks every value, naming the first bad one.
    pub fn validate(&self) -> Result<(), TokenizerConfigError> {
        if self.has_engine() {
            super::endpoint(&self.base_url, "/")
                .map_err(|allowed| TokenizerConfigError::new(TokenizerField::BaseUrl, &self.base_url, allowed))?;
        }
        if !(0.0..=1.0).contains(&self.parity.ratio) {
            return Err(TokenizerConfigError::new(
                TokenizerField::ParityRatio,
                self.parity.ratio.to_string(),
                "expected a fraction from 0 to 1",
            ));
        }
        if self.timeout < Duration::from_millis(1) {
            return Err(TokenizerConfigError::new(
                TokenizerField::Timeout,
                self.timeout.as_millis().to_string(),
                "expected at least 1 ms",
            ));
        }
        if self.max_response_bytes == 0 {
            return Err(TokenizerConfigError::new(TokenizerField::MaxResponseBytes, "0", "expected at least 1 byte"));
        }
        Ok(())
    }

    /// The tokenizer: the engine's client for this protocol, with its own
    /// connection pool, or with `local` the in-process tokenizer (checked
    /// against that client when there is one), sharing `metrics` (the
    /// ext_proc server records fallbacks in the same one). Loading the
    /// local model's files happens here: call it off the I/O threads.
    pub fn build(&self, metrics: Arc<TokenizerMetrics>) -> Result<Arc<dyn Tokenizer>, TokenizerConfigError> {
        self.validate()?;
        let Some(local_config) = &self.local else { return self.engine(metrics) };
        let local = LocalTokenizer::load(local_config, metrics.clone())
            .map_err(|e| TokenizerConfigError::new(TokenizerField::Local, e.path.display().to_string(), e.reason))?;
        if !self.has_engine() {
            return Ok(Arc::new(local));
        }
        let engine = self.engine(metrics.clone())?;
        // Checks count in metrics of their own: they are not request-path
        // round trips.
        let checker = self.engine(Arc::new(TokenizerMetrics::new()))?;
        Ok(Arc::new(ParityChecked::new(local, engine, checker, self.parity, metrics)))
    }

    /// The engine's tokenizer client.
    fn engine(&self, metrics: Arc<TokenizerMetrics>) -> Result<Arc<dyn Tokenizer>, TokenizerConfigError> {
        let http = HttpClient::new(self.timeout, self.max_response_bytes);
        let bad_url = |allowed: String| TokenizerConfigError::new(TokenizerField::BaseUrl, &self.base_url, allowed);
        Ok(match self.protocol {
            TokenizerProtocol::VllmRender => {
                Arc::new(VllmRenderTokenizer::new(&self.base_url, http, metrics).map_err(bad_url)?)
            }
            TokenizerProtocol::SglangTokenize => {
                Arc::new(SglangTokenizer::new(&self.base_url, http, metrics).map_err(bad_url)?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let config = TokenizerConfig::new(TokenizerProtocol::VllmRender, "http://x");
        assert_eq!((config.timeout.as_millis(), config.max_response_bytes), (5000, 16 << 20));
        assert_eq!(config.fallback, FallbackPolicy::LoadOnly);
    }

    #[test]
    fn errors_name_the_field_and_value() {
        let protocol = "trtllm".parse::<TokenizerProtocol>().err();
        assert_eq!(protocol.map(|e| (e.field, e.value)), Some((TokenizerField::Protocol, "trtllm".into())));
        let fallback = "ignore".parse::<FallbackPolicy>().err();
        assert_eq!(fallback.map(|e| (e.field, e.value)), Some((TokenizerField::Fallback, "ignore".into())));
        for url in ["vllm:8000", "https://vllm", "http://vllm/?q=1", "http://u:p@vllm"] {
            let err = TokenizerConfig::new(TokenizerProtocol::VllmRender, url).validate().expect_err(url);
            assert_eq!((err.field, err.value.as_str()), (TokenizerField::BaseUrl, url), "{err}");
        }
        let mut zero = TokenizerConfig::new(TokenizerProtocol::VllmRender, "http://x");
        zero.max_response_bytes = 0;
        assert_eq!(zero.validate().map_err(|e| e.field), Err(TokenizerField::MaxResponseBytes));
        let mut zero = TokenizerConfig::new(TokenizerProtocol::VllmRender, "http://x");
        zero.timeout = Duration::ZERO;
        assert_eq!(zero.validate().map_err(|e| e.field), Err(TokenizerField::Timeout));
    }
}
