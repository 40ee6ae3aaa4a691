//! What a simulated engine is: its model name, cache geometry, wire
//! choices, time model and ports.

use std::fmt;
use std::str::FromStr;

use super::time_model::TimeModel;

/// How the events inside a batch are encoded. The batch itself is always
/// the positional `[ts, events, data_parallel_rank]` (vLLM never changed it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventEncoding {
    /// Tagged maps with key `"type"` (vLLM ≥ #42892, v0.26 shape):
    /// `BlockStored` carries `extra_keys` (one nil per block), `group_idx` 0
    /// and `kv_cache_spec_kind` `"full_attention"`.
    #[default]
    Map,
    /// Positional arrays headed by the type name, as vLLM published them
    /// once `lora_name` was appended (#27577): `BlockStored` has 8 elements,
    /// `BlockRemoved` 3, `AllBlocksCleared` 1.
    Array,
}

/// The frames of a replay reply (engines.md §1.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplayLayout {
    /// vLLM ≥ 0.26 (#45177): `["", topic, seq, payload]`, ended by
    /// `["", "", END_SEQ, ""]`.
    #[default]
    WithTopic,
    /// Older vLLM and SGLang: `["", seq, payload]`, ended by `["", END_SEQ, ""]`.
    Legacy,
}

/// How block hashes go on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashFormat {
    /// msgpack unsigned ints: the digest's last 8 bytes, big-endian (vLLM's
    /// default, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`).
    #[default]
    Int,
    /// The whole 16-byte digest as msgpack bin (vLLM's xxhash option with
    /// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
    Bytes,
    /// Signed int64, negative for half of them (SGLang).
    SignedInt,
}

/// Which engine the simulator plays: its HTTP API and how its KV events
/// leave it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Flavour {
    /// `vllm serve`: OpenAI routes and render endpoints; KV events over ZMQ.
    #[default]
    Vllm,
    /// `trtllm-serve`: OpenAI routes, no render endpoint; KV events drained
    /// by `POST /kv_cache_events` (the ZMQ sockets stay bound, silent).
    Trtllm,
    /// SGLang's server: OpenAI routes, `/generate` and `/tokenize`, no
    /// render endpoint; KV events over ZMQ as configured (SGLang's own
    /// choices are `Flavour::sglang_events`).
    Sglang,
}

impl Flavour {
    /// SGLang's KV-event wire choices: positional array events (before
    /// sglang#37482), signed int64 hashes, the legacy replay layout.
    pub fn sglang_events(config: EngineConfig) -> EngineConfig {
        EngineConfig {
            flavour: Flavour::Sglang,
            encoding: EventEncoding::Array,
            hash_format: HashFormat::SignedInt,
            replay_layout: ReplayLayout::Legacy,
            ..config
        }
    }
}

/// An engine's part in disaggregated prefill/decode (P/D).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PdRole {
    /// Computes whole requests; P/D fields in requests are ignored.
    #[default]
    Aggregated,
    /// Computes prompts and keeps their KV for a decode engine to pull
    /// (vLLM `kv_producer`, SGLang `--disaggregation-mode prefill`,
    /// TensorRT-LLM's context server); serves the transfer side channel.
    Prefill,
    /// Pulls a prompt's KV from a prefill engine, then decodes (vLLM
    /// `kv_consumer`, SGLang `--disaggregation-mode decode`, TensorRT-LLM's
    /// generation server).
    Decode,
}

/// What a vLLM decode engine does when pulling the KV fails (vLLM's
/// `kv_transfer_config.kv_load_failure_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvLoadFailurePolicy {
    /// The request fails (vLLM's default: `Literal["recompute", "fail"] =
    /// "fail"` in `vllm/config/kv_transfer.py`): finish reason `error`,
    /// HTTP 500 or an error chunk.
    #[default]
    Fail,
    /// The request computes its whole prompt locally.
    Recompute,
}

/// Fixed ports of one engine; `None` lets the OS pick one on 127.0.0.1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ports {
    pub http: Option<u16>,
    pub events: Option<u16>,
    pub replay: Option<u16>,
}

/// Everything one simulated engine is configured with.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Name in logs, in the `engine` metric label and in the
    /// `x-sim-engine` response header.
    pub name: String,
    /// The served model name (`model` in requests and answers).
    pub model: String,
    /// Tokens per KV block (vLLM's `--block-size`).
    pub block_size: u32,
    /// KV blocks in the cache (vLLM's `num_gpu_blocks`).
    pub num_blocks: usize,
    /// Token budget of one scheduler step (prefill chunks + one token per
    /// decoding request).
    pub max_batched_tokens: u32,
    /// Most requests running at once; the rest wait.
    pub max_num_seqs: usize,
    /// Longest prompt + completion accepted (longer: HTTP 400).
    pub max_model_len: u32,
    /// Completion length when a request names none.
    pub default_max_tokens: u32,
    pub time: TimeModel,
    /// Seed of every random choice: sampled tokens, dropped batches and,
    /// unless [`EngineConfig::hash_seed`] is set, the block hashes.
    pub seed: u64,
    /// Seed of the engine's block hashes. `None`: derived from
    /// [`EngineConfig::seed`], so engines hash differently, like vLLM with a
    /// random `NONE_HASH`; the same value on every engine makes them agree,
    /// like vLLM with a fixed `PYTHONHASHSEED`.
    pub hash_seed: Option<u64>,
    pub encoding: EventEncoding,
    pub replay_layout: ReplayLayout,
    pub hash_format: HashFormat,
    /// ZMQ topic frame of every message (vLLM's default: empty).
    pub topic: String,
    /// `data_parallel_rank` of every batch.
    pub dp_rank: u32,
    /// Batches kept for replay (vLLM's `buffer_steps`).
    pub replay_buffer: usize,
    /// Send high-water mark of the PUB socket (vLLM's `hwm`).
    pub pub_hwm: i32,
    pub ports: Ports,
    /// The address every socket binds: a loopback one (127.0.0.0/8), so
    /// engines can share port numbers on addresses of their own, as pods
    /// do.
    pub host: std::net::Ipv4Addr,
    pub flavour: Flavour,
    /// TensorRT-LLM's `event_buffer_max_size`: events kept until drained,
    /// the oldest discarded beyond it ([`Flavour::Trtllm`]).
    pub event_buffer_max_size: usize,
    /// This engine's part in disaggregated prefill/decode.
    pub pd_role: PdRole,
    /// Virtual time a decode engine spends receiving one KV block, scaled
    /// by `time.time_scale` like the step costs. 20 µs: a 16-token block of
    /// an 8B model (~2 MiB of KV in bf16) over a ~100 GB/s RDMA link.
    pub kv_transfer_ns_per_block: u64,
    /// How long (wall clock) a prefill engine keeps a finished request's
    /// blocks for a transfer before freeing them (vLLM's
    /// `kv_lease_duration`, 30 s).
    pub kv_lease_ms: u64,
    /// Longest wait (wall clock) of an SGLang leg for its peer: the
    /// decode's wait for the room to be ready and the prefill's wait for
    /// the decode to pull it (SGLang waits up to 300 s by default; tests
    /// want less).
    pub kv_wait_ms: u64,
    /// vLLM decode: what a failed pull does.
    pub kv_load_failure_policy: KvLoadFailurePolicy,
    /// Port of a prefill engine's transfer side channel (SGLang's
    /// `--disaggregation-bootstrap-port`, vLLM's NIXL side channel port,
    /// TensorRT-LLM's transfer endpoint); `None` lets the OS pick one. Not
    /// in [`Ports`], whose fields other crates list in full.
    pub bootstrap_port: Option<u16>,
    /// A Hugging Face model directory (`tokenizer.json`, chat template):
    /// prompts are tokenized with it, as a real engine serving that model
    /// would, instead of the built-in tokenizer. Loaded at start.
    pub model_dir: Option<std::path::PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            name: "engine-0".into(),
            model: "sim-model".into(),
            block_size: 16,
            num_blocks: 4096,
            max_batched_tokens: 8192,
            max_num_seqs: 256,
            max_model_len: 32_768,
            default_max_tokens: 16,
            time: TimeModel::default(),
            seed: 0x5eed,
            hash_seed: None,
            encoding: EventEncoding::default(),
            replay_layout: ReplayLayout::default(),
            hash_format: HashFormat::default(),
            topic: String::new(),
            dp_rank: 0,
            replay_buffer: 10_000,
            pub_hwm: 100_000,
            ports: Ports::default(),
            host: std::net::Ipv4Addr::LOCALHOST,
            model_dir: None,
            flavour: Flavour::default(),
            event_buffer_max_size: 1024,
            pd_role: PdRole::default(),
            kv_transfer_ns_per_block: 20_000,
            kv_lease_ms: 30_000,
            kv_wait_ms: 30_000,
            kv_load_failure_policy: KvLoadFailurePolicy::default(),
            bootstrap_port: None,
        }
    }
}

/// A configuration value that cannot work, with what is allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    pub field: &'static str,
    pub problem: String,
}

impl EngineConfig {
    /// Checks the values that would make the engine misbehave.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, problem: &str| Err(ConfigError { field, problem: problem.to_owned() });
        if self.block_size == 0 {
            return bad("block_size", "must be at least 1");
        }
        if self.num_blocks == 0 {
            return bad("num_blocks", "must be at least 1");
        }
        if self.max_batched_tokens == 0 {
            return bad("max_batched_tokens", "must be at least 1");
        }
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs", "must be at least 1");
        }
        if self.default_max_tokens == 0 {
            return bad("default_max_tokens", "must be at least 1");
        }
        if self.event_buffer_max_size == 0 {
            return bad("event_buffer_max_size", "must be at least 1");
        }
        if self.replay_buffer == 0 {
            return bad("replay_buffer", "must be at least 1");
        }
        if !self.host.is_loopback() {
            return bad("host", "must be a loopback address (127.0.0.0/8): the simulator serves no one else");
        }
        if self.kv_lease_ms == 0 {
            return bad("kv_lease_ms", "must be at least 1");
        }
        self.time.validate()
    }

    /// The block hash seed in force (see [`EngineConfig::hash_seed`]).
    pub fn effective_hash_seed(&self) -> u64 {
        self.hash_seed.unwrap_or_else(|| xxhash_rust::xxh3::xxh3_64_with_seed(b"kvpick-sim hash seed", self.seed))
    }
}

impl FromStr for Flavour {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vllm" => Ok(Flavour::Vllm),
            "trtllm" => Ok(Flavour::Trtllm),
            "sglang" => Ok(Flavour::Sglang),
            other => Err(format!("unknown engine flavour {other:?} (vllm, trtllm, sglang)")),
        }
    }
}

impl fmt::Display for Flavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavour::Vllm => "vllm",
            Flavour::Trtllm => "trtllm",
            Flavour::Sglang => "sglang",
        })
    }
}

impl FromStr for EventEncoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "map" => Ok(EventEncoding::Map),
            "array" => Ok(EventEncoding::Array),
            other => Err(format!("unknown event encoding {other:?} (map, array)")),
        }
    }
}

impl fmt::Display for EventEncoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EventEncoding::Map => "map",
            EventEncoding::Array => "array",
        })
    }
}

impl FromStr for ReplayLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "topic" => Ok(ReplayLayout::WithTopic),
            "legacy" => Ok(ReplayLayout::Legacy),
            other => Err(format!("unknown replay layout {other:?} (topic, legacy)")),
        }
    }
}

impl FromStr for HashFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "int" => Ok(HashFormat::Int),
            "bytes" => Ok(HashFormat::Bytes),
            "signed" => Ok(HashFormat::SignedInt),
            other => Err(format!("unknown hash format {other:?} (int, bytes, signed)")),
        }
    }
}

impl FromStr for PdRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "aggregated" => Ok(PdRole::Aggregated),
            "prefill" => Ok(PdRole::Prefill),
            "decode" => Ok(PdRole::Decode),
            other => Err(format!("unknown P/D role {other:?} (aggregated, prefill, decode)")),
        }
    }
}

impl fmt::Display for PdRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PdRole::Aggregated => "aggregated",
            PdRole::Prefill => "prefill",
            PdRole::Decode => "decode",
        })
    }
}

impl FromStr for KvLoadFailurePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail" => Ok(KvLoadFailurePolicy::Fail),
            "recompute" => Ok(KvLoadFailurePolicy::Recompute),
            other => Err(format!("unknown kv load failure policy {other:?} (fail, recompute)")),
        }
    }
}
