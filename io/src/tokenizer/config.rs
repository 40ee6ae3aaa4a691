//! Which tokenizer to ask, and how: settings named after Dynamo's
//! standalone EPP variables (DESIGN.md §7), validated with errors that name
//! the setting, the bad value and what is allowed, and turned into a client.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::http_client::HttpClient;
use super::metrics::TokenizerMetrics;
use super::sglang::SglangTokenizer;
use super::vllm_render::VllmRenderTokenizer;
use super::{FallbackPolicy, Tokenizer};

pub const SERVICE_URL_VAR: &str = "DYN_EPP_TOKENIZER_SERVICE_URL";
pub const PROTOCOL_VAR: &str = "DYN_EPP_TOKENIZER_PROTOCOL";
pub const TIMEOUT_VAR: &str = "DYN_EPP_TOKENIZATION_TIMEOUT_MS";
pub const MAX_RESPONSE_BYTES_VAR: &str = "DYN_EPP_TOKENIZER_MAX_RESPONSE_BYTES";
/// kvpick's own (Dynamo's EPP always fails): `fail` or `load-only`.
pub const FALLBACK_VAR: &str = "DYN_EPP_TOKENIZER_FALLBACK";

pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5000);
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A setting's value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting}={value:?} is invalid: {allowed}")]
pub struct TokenizerConfigError {
    /// The environment variable (the flag of the same name says the same).
    pub setting: &'static str,
    pub value: String,
    /// What is wrong and what is allowed.
    pub allowed: String,
}

impl TokenizerConfigError {
    fn new(setting: &'static str, value: impl Into<String>, allowed: impl Into<String>) -> Self {
        TokenizerConfigError { setting, value: value.into(), allowed: allowed.into() }
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
            _ => Err(TokenizerConfigError::new(PROTOCOL_VAR, text, "expected `vllm-render` or `sglang-tokenize`")),
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
            _ => Err(TokenizerConfigError::new(FALLBACK_VAR, text, "expected `fail` or `load-only`")),
        }
    }
}

/// Everything needed to build the tokenizer client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerConfig {
    pub protocol: TokenizerProtocol,
    /// `http://host[:port][/prefix]`; the endpoint paths are appended to the
    /// prefix.
    pub base_url: String,
    /// Bounds each whole round trip (connect, send, answer). At least 1 ms.
    pub timeout: Duration,
    /// Largest successful answer read, enforced while it streams. At least 1.
    pub max_response_bytes: usize,
    /// What the ext_proc server does when tokenizing fails or is not
    /// supported (carried here, applied there).
    pub fallback: FallbackPolicy,
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
        }
    }

    /// From the process environment; see [`TokenizerConfig::from_lookup`].
    pub fn from_env() -> Result<TokenizerConfig, TokenizerConfigError> {
        TokenizerConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// From settings looked up by variable name. The URL is required; the
    /// protocol defaults to `vllm-render`, the timeout to 5000 ms, the cap
    /// to 16 MiB, the fallback to `load-only`. Empty values count as unset.
    /// The URL is checked too, so a config that loads also builds.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<TokenizerConfig, TokenizerConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let base_url = get(SERVICE_URL_VAR).ok_or_else(|| {
            TokenizerConfigError::new(SERVICE_URL_VAR, "", "required: the tokenizer service, e.g. http://vllm:8000")
        })?;
        let protocol = get(PROTOCOL_VAR).map_or(Ok(TokenizerProtocol::VllmRender), |v| v.parse())?;
        let timeout = match get(TIMEOUT_VAR) {
            None => DEFAULT_TIMEOUT,
            Some(text) => Duration::from_millis(positive(TIMEOUT_VAR, &text, "milliseconds")?),
        };
        let max_response_bytes = match get(MAX_RESPONSE_BYTES_VAR) {
            None => DEFAULT_MAX_RESPONSE_BYTES,
            Some(text) => usize::try_from(positive(MAX_RESPONSE_BYTES_VAR, &text, "bytes")?)
                .map_err(|_| TokenizerConfigError::new(MAX_RESPONSE_BYTES_VAR, text, "too large for this machine"))?,
        };
        let fallback = get(FALLBACK_VAR).map_or(Ok(FallbackPolicy::default()), |v| v.parse())?;
        let config = TokenizerConfig { protocol, base_url, timeout, max_response_bytes, fallback };
        config.validate()?;
        Ok(config)
    }

    /// Checks every value, naming the first bad one.
    pub fn validate(&self) -> Result<(), TokenizerConfigError> {
        super::endpoint(&self.base_url, "/")
            .map_err(|allowed| TokenizerConfigError::new(SERVICE_URL_VAR, &self.base_url, allowed))?;
        if self.timeout < Duration::from_millis(1) {
            return Err(TokenizerConfigError::new(
                TIMEOUT_VAR,
                self.timeout.as_millis().to_string(),
                "expected at least 1 ms",
            ));
        }
        if self.max_response_bytes == 0 {
            return Err(TokenizerConfigError::new(MAX_RESPONSE_BYTES_VAR, "0", "expected at least 1 byte"));
        }
        Ok(())
    }

    /// The client for this protocol, with its own connection pool, sharing
    /// `metrics` (the ext_proc server records fallbacks in the same one).
    pub fn build(&self, metrics: Arc<TokenizerMetrics>) -> Result<Arc<dyn Tokenizer>, TokenizerConfigError> {
        self.validate()?;
        let http = HttpClient::new(self.timeout, self.max_response_bytes);
        let bad_url = |allowed: String| TokenizerConfigError::new(SERVICE_URL_VAR, &self.base_url, allowed);
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

/// A whole number ≥ 1 (`_` separators allowed).
fn positive(setting: &'static str, text: &str, unit: &str) -> Result<u64, TokenizerConfigError> {
    match text.trim().replace('_', "").parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(TokenizerConfigError::new(setting, text, format!("expected a whole number of {unit}, at least 1"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn defaults() {
        let config = TokenizerConfig::from_lookup(lookup(&[(SERVICE_URL_VAR, "http://vllm:8000")]));
        assert_eq!(config, Ok(TokenizerConfig::new(TokenizerProtocol::VllmRender, "http://vllm:8000")));
        let config = TokenizerConfig::new(TokenizerProtocol::VllmRender, "http://x");
        assert_eq!((config.timeout.as_millis(), config.max_response_bytes), (5000, 16 << 20));
        assert_eq!(config.fallback, FallbackPolicy::LoadOnly);
    }

    #[test]
    fn every_setting_parses() {
        let config = TokenizerConfig::from_lookup(lookup(&[
            (SERVICE_URL_VAR, "http://sglang:30000/prefix/"),
            (PROTOCOL_VAR, "sglang-tokenize"),
            (TIMEOUT_VAR, "250"),
            (MAX_RESPONSE_BYTES_VAR, "1_048_576"),
            (FALLBACK_VAR, "fail"),
        ]));
        assert_eq!(
            config,
            Ok(TokenizerConfig {
                protocol: TokenizerProtocol::SglangTokenize,
                base_url: "http://sglang:30000/prefix/".into(),
                timeout: Duration::from_millis(250),
                max_response_bytes: 1 << 20,
                fallback: FallbackPolicy::Fail,
            })
        );
    }

    #[test]
    fn errors_name_the_setting_and_value() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let url = (SERVICE_URL_VAR, "http://vllm:8000");
        let cases: &[Case] = &[
            (&[], SERVICE_URL_VAR, ""),
            (&[url, (PROTOCOL_VAR, "trtllm")], PROTOCOL_VAR, "trtllm"),
            (&[url, (TIMEOUT_VAR, "0")], TIMEOUT_VAR, "0"),
            (&[url, (TIMEOUT_VAR, "5s")], TIMEOUT_VAR, "5s"),
            (&[url, (MAX_RESPONSE_BYTES_VAR, "-1")], MAX_RESPONSE_BYTES_VAR, "-1"),
            (&[url, (FALLBACK_VAR, "ignore")], FALLBACK_VAR, "ignore"),
            (&[(SERVICE_URL_VAR, "vllm:8000")], SERVICE_URL_VAR, "vllm:8000"),
            (&[(SERVICE_URL_VAR, "https://vllm")], SERVICE_URL_VAR, "https://vllm"),
            (&[(SERVICE_URL_VAR, "http://vllm/?q=1")], SERVICE_URL_VAR, "http://vllm/?q=1"),
            (&[(SERVICE_URL_VAR, "http://u:p@vllm")], SERVICE_URL_VAR, "http://u:p@vllm"),
        ];
        for (pairs, setting, value) in cases {
            let err = TokenizerConfig::from_lookup(lookup(pairs)).expect_err(value);
            assert_eq!((err.setting, err.value.as_str()), (*setting, *value), "{err}");
            assert!(err.to_string().contains(setting), "{err}");
        }
        let mut zero = TokenizerConfig::new(TokenizerProtocol::VllmRender, "http://x");
        zero.max_response_bytes = 0;
        assert_eq!(zero.validate().map_err(|e| e.setting), Err(MAX_RESPONSE_BYTES_VAR));
    }
}
