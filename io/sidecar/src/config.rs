//! What the sidecar is configured with, and the checks that stop a start
//! with a bad value.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

/// Which engine the decode pod runs: it decides the P/D protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// vLLM with the NixlConnector: a prefill leg asking for remote decode,
    /// then the decode leg with the prefill's `kv_transfer_params`.
    #[default]
    Vllm,
    /// SGLang: the same body to both engines at once, with bootstrap fields.
    Sglang,
    /// TensorRT-LLM: a `context_only` leg, then `generation_only`.
    Trtllm,
}

impl EngineKind {
    pub const NAMES: &'static str = "vllm, sglang, trtllm";

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Trtllm => "trtllm",
        }
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "vllm" => Ok(EngineKind::Vllm),
            "sglang" => Ok(EngineKind::Sglang),
            "trtllm" | "tensorrt-llm" | "trt-llm" => Ok(EngineKind::Trtllm),
            other => Err(format!("{other:?} is not an engine: expected one of {}", EngineKind::NAMES)),
        }
    }
}

/// What to do when the prefill leg fails or times out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnPrefillFailure {
    /// Run the request whole on the local engine (the answer comes later,
    /// but it comes); the reason is in the response's hand-off header.
    #[default]
    Aggregate,
    /// Answer an error in the OpenAI shape (502, or 504 on a timeout).
    Fail,
}

impl FromStr for OnPrefillFailure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "aggregate" | "fallback" => Ok(OnPrefillFailure::Aggregate),
            "fail" => Ok(OnPrefillFailure::Fail),
            other => Err(format!("{other:?} is not a prefill failure policy: expected aggregate or fail")),
        }
    }
}

/// Which prefill endpoints a request may name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PrefillAllow {
    /// Any syntactically valid `ip:port` (the gateway strips client-sent
    /// copies of the header, so only the EPP sets it).
    #[default]
    Any,
    /// Only these addresses (a port of 0 allows any port of that IP).
    List(Vec<SocketAddr>),
}

impl PrefillAllow {
    pub fn allows(&self, endpoint: SocketAddr) -> bool {
        match self {
            PrefillAllow::Any => true,
            PrefillAllow::List(list) => {
                list.iter().any(|a| a.ip() == endpoint.ip() && (a.port() == 0 || a.port() == endpoint.port()))
            }
        }
    }
}

impl FromStr for PrefillAllow {
    type Err = String;
    /// A comma-separated list of `ip`, `ip:port` or `[ipv6]:port`; empty or
    /// `*` allows any.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() || s == "*" {
            return Ok(PrefillAllow::Any);
        }
        let mut list = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let addr = item
                .parse::<SocketAddr>()
                .or_else(|_| item.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
                .map_err(|_| format!("{item:?} is not an ip, ip:port or [ipv6]:port"))?;
            list.push(addr);
        }
        Ok(PrefillAllow::List(list))
    }
}

/// Everything `kvpick sidecar` runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct SidecarConfig {
    /// The front: where the gateway sends the decode pod's traffic.
    pub listen: SocketAddr,
    /// The local decode engine.
    pub decode: SocketAddr,
    pub engine: EngineKind,
    /// SGLang: the prefill engines' `--disaggregation-bootstrap-port`.
    pub bootstrap_port: u16,
    /// How long the prefill leg may take, from sending it to its answer.
    pub prefill_timeout: Duration,
    /// Connecting to an engine, either leg.
    pub connect_timeout: Duration,
    pub on_prefill_failure: OnPrefillFailure,
    pub prefill_allow: PrefillAllow,
    /// TensorRT-LLM servers before the `context_only` request type needed
    /// `max_tokens = 1` on the context leg as well.
    pub trtllm_context_max_tokens_1: bool,
    /// The largest request body read for a P/D route (others stream).
    pub max_request_bytes: usize,
    /// The largest prefill answer read (it carries one token and the
    /// transfer parameters, never the prompt).
    pub max_prefill_answer_bytes: usize,
    /// Prometheus metrics (`/metrics`); `None` serves none.
    pub metrics_listen: Option<SocketAddr>,
}

/// SGLang's default `--disaggregation-bootstrap-port`.
pub const SGLANG_BOOTSTRAP_PORT: u16 = 8998;

impl Default for SidecarConfig {
    fn default() -> Self {
        SidecarConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 8000)),
            decode: SocketAddr::from(([127, 0, 0, 1], 8200)),
            engine: EngineKind::default(),
            bootstrap_port: SGLANG_BOOTSTRAP_PORT,
            // A long prompt's prefill on a busy engine takes seconds; a
            // minute is past any healthy one and short of a client's own
            // timeout, so the fallback still has time to answer.
            prefill_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(2),
            on_prefill_failure: OnPrefillFailure::default(),
            prefill_allow: PrefillAllow::default(),
            trtllm_context_max_tokens_1: false,
            // The EPP's own cap (KVPICK_MAX_REQUEST_BODY_BYTES): the gateway
            // never sends it more. A body is held parsed, and twice as
            // JSON values for a split, so the cap bounds memory too.
            max_request_bytes: 16 << 20,
            max_prefill_answer_bytes: 4 << 20,
            metrics_listen: Some(SocketAddr::from(([0, 0, 0, 0], 9091))),
        }
    }
}

impl SidecarConfig {
    /// Refuses values that cannot work, naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.listen == self.decode {
            return Err(format!("the sidecar cannot listen on its decode engine's address {}", self.decode));
        }
        if self.prefill_timeout.is_zero() {
            return Err("the prefill timeout must be above 0".into());
        }
        if self.connect_timeout.is_zero() {
            return Err("the connect timeout must be above 0".into());
        }
        if self.bootstrap_port == 0 {
            return Err("the bootstrap port must be a port, not 0".into());
        }
        if self.max_request_bytes == 0 || self.max_prefill_answer_bytes == 0 {
            return Err("body limits must be above 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_lists_parse_or_say_what_is_allowed() {
        assert_eq!("SGLang".parse::<EngineKind>(), Ok(EngineKind::Sglang));
        assert_eq!("tensorrt-llm".parse::<EngineKind>(), Ok(EngineKind::Trtllm));
        assert!("tgi".parse::<EngineKind>().unwrap_err().contains("vllm, sglang, trtllm"));
        assert_eq!("fail".parse::<OnPrefillFailure>(), Ok(OnPrefillFailure::Fail));
        let allow: PrefillAllow = "10.0.0.1, 10.0.0.2:8000,[fd00::1]:9".parse().unwrap_or_default();
        assert!(allow.allows("10.0.0.1:1234".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!(allow.allows("10.0.0.2:8000".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!(!allow.allows("10.0.0.2:8001".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!(allow.allows("[fd00::1]:9".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!(!allow.allows("10.0.0.3:8000".parse().unwrap_or_else(|e| panic!("{e}"))));
        assert!("10.0.0.1,nonsense".parse::<PrefillAllow>().unwrap_err().contains("nonsense"));
        assert_eq!("*".parse::<PrefillAllow>(), Ok(PrefillAllow::Any));
    }

    #[test]
    fn a_bad_value_is_refused_with_its_name() {
        let config = SidecarConfig { prefill_timeout: Duration::ZERO, ..SidecarConfig::default() };
        assert!(config.validate().unwrap_err().contains("prefill timeout"));
        assert!(SidecarConfig::default().validate().is_ok());
    }
}
