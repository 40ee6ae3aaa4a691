//! `kvpick serve`'s whole configuration, resolved from [`Values`] and
//! checked before anything starts.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use kvpick_core::{CostModel, EngineRates, RouterConfig};
use kvpick_runtime::{RuntimeChoice, RuntimeConfig, RuntimeKind};

use super::index_budget::default_max_bytes;
use super::otlp::TracingConfig;
use super::peers::{ListedPeer, parse_list};
use super::settings::{self as var, SettingError, Values};
use kvpick_discovery::{DiscoveryConfig, EngineSetting};
use kvpick_ext_proc::ExtProcConfig;
use kvpick_grpc::Tls;
use kvpick_kv_events::IngestConfig;
use kvpick_replica::PeerTls;
use kvpick_router::tokenizer::local::parse_local_spec;
use kvpick_router::tokenizer::{
    FallbackPolicy, LocalTokenizerConfig, TokenizerConfig, TokenizerConfigError, TokenizerField, TokenizerProtocol,
};
use kvpick_router::{DEFAULT_PREFILL_QUEUE_THRESHOLD, DisaggConfig, PickerConfig};

/// Where the workers come from.
#[derive(Clone, Debug, PartialEq)]
pub enum DiscoveryMode {
    Kubernetes(Box<DiscoveryConfig>),
    Static { file: PathBuf, poll: Duration },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Whether the process may be given transparent huge pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Opted out (the default): resident memory tracks live data.
    Never,
    /// As the allocator and the system's setting decide.
    Allowed,
}

impl HugePages {
    /// The values `--transparent-huge-pages` takes, in variant order.
    pub const NAMES: [&'static str; 2] = ["never", "allowed"];

    /// The choice a flag value names (`NAMES`); `None` for anything else.
    pub fn from_name(name: &str) -> Option<HugePages> {
        match name {
            "never" => Some(HugePages::Never),
            "allowed" => Some(HugePages::Allowed),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub discovery: DiscoveryMode,
    /// Facts every worker shares, for static entries that do not say.
    pub block_size: u32,
    pub model: Option<String>,
    pub max_num_batched_tokens: Option<u64>,
    pub total_kv_blocks: Option<u64>,
    pub router: RouterConfig,
    pub runtime: RuntimeConfig,
    pub ext_proc: ExtProcConfig,
    pub picker: PickerConfig,
    /// `None`: static mode picks the first worker's endpoint at start.
    pub tokenizer: Option<TokenizerConfig>,
    pub health_listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    pub io_threads: usize,
    pub shutdown_grace: Duration,
    pub log_format: LogFormat,
    pub log_filter: String,
    pub profile: Option<PathBuf>,
    pub huge_pages: HugePages,
    /// The debug view on the metrics port.
    pub debug_endpoints: bool,
    /// `None`: requests are not traced.
    pub tracing: Option<TracingConfig>,
    /// The KV-event ingest (ZMQ subscriptions and TensorRT-LLM drains).
    pub kv_events: IngestConfig,
    /// Disaggregated prefill/decode; `None`: roles are ignored.
    pub disagg: Option<DisaggSettings>,
    /// Sharing bookings with peer replicas; `None`: this replica is alone.
    pub replicas: Option<ReplicaSettings>,
}

/// The token peers present to each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerToken {
    Given(String),
    /// Read at start (a mounted Secret).
    File(PathBuf),
}

impl PeerToken {
    /// The token itself (reading the file).
    pub fn resolve(&self) -> Result<String, String> {
        match self {
            PeerToken::Given(token) => Ok(token.clone()),
            PeerToken::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!("{}={}: not a readable file holding the token ({e})", var::PEER_TOKEN_FILE, path.display())
                })?;
                check_token(&text).map_err(|allowed| format!("{}={}: {allowed}", var::PEER_TOKEN_FILE, path.display()))
            }
        }
    }
}

/// Trimmed; it must be a header value: printable ASCII, no spaces.
fn check_token(token: &str) -> Result<String, &'static str> {
    let token = token.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a token of printable ASCII without spaces");
    }
    Ok(token.to_owned())
}

/// Where this replica's peer certificate, key and CA are (read at start:
/// a rotated Secret takes effect on the next rollout, as the token does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTlsFiles {
    pub dir: PathBuf,
    pub server_name: Option<String>,
}

impl PeerTlsFiles {
    /// The certificate, key and CA as read now, checked to be usable.
    pub fn load(&self) -> Result<PeerTls, String> {
        let read = |name: &str| {
            let path = self.dir.join(name);
            std::fs::read(&path).map_err(|e| format!("{}: {} is not readable ({e})", var::PEER_TLS_DIR, path.display()))
        };
        let tls = PeerTls {
            cert_pem: read("tls.crt")?,
            key_pem: read("tls.key")?,
            ca_pem: read("ca.crt")?,
            server_name: self.server_name.clone(),
        };
        tls.check().map_err(|e| format!("{}={}: {e}", var::PEER_TLS_DIR, self.dir.display()))?;
        Ok(tls)
    }
}

/// Replica sync: on when peers are listed, a peer service is watched or
/// the `nats` transport is chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSettings {
    /// The replica-sync port.
    pub listen: SocketAddr,
    /// Peers listed at start (static mode; names looked up again while
    /// kvpick runs); Kubernetes mode adds those of the peer service.
    pub peers: Vec<ListedPeer>,
    /// `None`: derived from the host name and the bound port.
    pub replica_id: Option<u64>,
    pub token: Option<PeerToken>,
    pub tls: Option<PeerTlsFiles>,
    /// How long a warm start may hold readiness; `None`: no warm start.
    pub warm_start: Option<Duration>,
    pub peer_grace: Duration,
    pub batch_delay: Duration,
    /// The `nats` transport; `None`: `direct`.
    pub nats: Option<NatsSettings>,
}

/// The `nats` transport's settings (`kvpick_replica::nats`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsSettings {
    pub url: String,
    pub pool: String,
    pub credentials: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    pub stream_replicas: usize,
}

fn nats(v: &Values, discovery: &DiscoveryMode) -> Result<Option<NatsSettings>, ConfigError> {
    match v.get(var::PEER_TRANSPORT).map(str::trim).unwrap_or("direct") {
        "direct" => return Ok(None),
        "nats" => {}
        _ => return Err(v.error(var::PEER_TRANSPORT, "direct or nats").into()),
    }
    let url = v.get(var::PEER_NATS_URL).map(str::trim).filter(|u| !u.is_empty());
    let url = url.ok_or_else(|| v.error(var::PEER_TRANSPORT, format!("nats needs {}", var::PEER_NATS_URL)))?;
    let pool = match (v.get(var::PEER_NATS_POOL).map(str::trim), discovery) {
        (Some(pool), _) => pool.to_owned(),
        (None, DiscoveryMode::Kubernetes(cfg)) => cfg.pool_name.clone(),
        (None, _) => "kvpick".to_owned(),
    };
    if !kvpick_replica::nats::pool_name_ok(&pool) {
        return Err(v.error(var::PEER_NATS_POOL, format!("letters, digits, '-' and '_' (got {pool:?})")).into());
    }
    Ok(Some(NatsSettings {
        url: url.to_owned(),
        pool,
        credentials: v.get(var::PEER_NATS_CREDS).map(PathBuf::from),
        ca: v.get(var::PEER_NATS_CA).map(PathBuf::from),
        stream_replicas: v.whole_in::<usize>(var::PEER_NATS_REPLICAS, 1, 5)?.unwrap_or(1),
    }))
}

fn replicas(v: &Values, listen: SocketAddr, discovery: &DiscoveryMode) -> Result<Option<ReplicaSettings>, ConfigError> {
    let peers = match v.get(var::PEERS) {
        None => Vec::new(),
        Some(list) => parse_list(list).map_err(|why| v.error(var::PEERS, why))?,
    };
    let watched = matches!(discovery, DiscoveryMode::Kubernetes(cfg) if cfg.peer_service.is_some());
    let nats = nats(v, discovery)?;
    if peers.is_empty() && !watched && nats.is_none() {
        return Ok(None);
    }
    let token = match (v.get(var::PEER_TOKEN_FILE), v.get(var::PEER_TOKEN)) {
        (Some(path), _) => Some(PeerToken::File(PathBuf::from(path))),
        (None, Some(token)) => {
            Some(PeerToken::Given(check_token(token).map_err(|allowed| v.error(var::PEER_TOKEN, allowed))?))
        }
        (None, None) => None,
    };
    let server_name = v.get(var::PEER_TLS_SERVER_NAME).map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned);
    let tls = match v.get(var::PEER_TLS_DIR) {
        Some(dir) => Some(PeerTlsFiles { dir: PathBuf::from(dir), server_name }),
        None if server_name.is_some() => {
            return Err(v
                .error(var::PEER_TLS_SERVER_NAME, format!("needs {} (the certificates)", var::PEER_TLS_DIR))
                .into());
        }
        None => None,
    };
    Ok(Some(ReplicaSettings {
        listen,
        peers,
        replica_id: v.whole::<u64>(var::REPLICA_ID, 1)?,
        token,
        tls,
        warm_start: match v.whole_in::<u64>(var::WARM_START_TIMEOUT_MS, 0, 600_000)?.unwrap_or(10_000) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        },
        peer_grace: Duration::from_millis(v.whole::<u64>(var::PEER_GRACE_MS, 1)?.unwrap_or(30_000)),
        batch_delay: Duration::from_micros(v.whole_in::<u64>(var::PEER_BATCH_DELAY_US, 0, 1_000_000)?.unwrap_or(0)),
        nats,
    }))
}

/// The prefill workers' selector and the decider.
#[derive(Clone, Debug)]
pub struct DisaggSettings {
    /// A prefill worker's `max_num_batched_tokens` when
    /// `DYN_EPP_MAX_NUM_BATCHED_TOKENS` does not say (the latency cost's
    /// prior): the saturation test needs one.
    pub batched_tokens: u64,
    pub decider: DisaggConfig,
    /// The prefill selector's policy: the decode side's, with its own
    /// queue threshold (past it a request is not split).
    pub router: RouterConfig,
    /// Its shards: on the decode shards' cores, spinning while busy as
    /// they do (the pair selection waits for the slower leg: a parked
    /// prefill shard's wake-up made it 4× a single selection in
    /// `kvpick-bench-runtime`, a spinning one 1.3×).
    pub runtime: RuntimeConfig,
}

fn disagg(v: &Values, router: &RouterConfig, runtime: &RuntimeConfig) -> Result<Option<DisaggSettings>, ConfigError> {
    if v.one_of(var::DISAGGREGATION, &["auto", "off"])? == Some("off") {
        return Ok(None);
    }
    let mut decider = DisaggConfig::default();
    if let Some(tokens) = v.whole::<u32>(var::PD_THRESHOLD_TOKENS, 0)? {
        decider.threshold_tokens = tokens;
    }
    if let Some(compare) = v.boolean(var::PD_COMPARE_TTFT)? {
        decider.compare_ttft = compare;
    }
    let threshold = v.number(var::PREFILL_QUEUE_THRESHOLD, 0.0)?;
    let prefill_router =
        RouterConfig { queue_threshold: Some(threshold.unwrap_or(DEFAULT_PREFILL_QUEUE_THRESHOLD)), ..router.clone() };
    let shards = v.whole_in::<usize>(var::PREFILL_SHARDS, 1, MAX_THREADS)?.unwrap_or(1);
    let runtime = RuntimeConfig { shards, ..runtime.clone() };
    let batched_tokens = match &router.cost {
        CostModel::Latency(rates) => rates.batched_tokens,
        CostModel::Dynamo => EngineRates::default().batched_tokens,
    };
    Ok(Some(DisaggSettings { batched_tokens, decider, router: prefill_router, runtime }))
}

/// Most shards, prefill shards or I/O threads: each is a thread (or a
/// core's share of one), so more than this is a mistake, and a huge value
/// an allocation that aborts (found by fuzzing `KVPICK_SHARDS`).
pub const MAX_THREADS: usize = 1024;

/// One message for the operator: what is wrong and what would work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Setting(#[from] SettingError),
    #[error("{0} is required: {1}")]
    Missing(String, &'static str),
    #[error("{0}")]
    Other(String),
}

impl ServeConfig {
    pub fn from_values(v: &Values) -> Result<ServeConfig, ConfigError> {
        let block_size = v.whole::<u32>(var::BLOCK_SIZE, 1)?.unwrap_or(16);
        let model = v.get(var::MODEL).map(str::to_owned);
        let max_num_batched_tokens = v.whole::<u64>(var::MAX_NUM_BATCHED_TOKENS, 1)?;
        let total_kv_blocks = v.whole::<u64>(var::TOTAL_KV_BLOCKS, 1)?;
        let router = router(v, max_num_batched_tokens)?;
        let runtime = runtime(v)?;
        let io_threads = v.whole_in::<usize>(var::IO_THREADS, 1, MAX_THREADS)?.unwrap_or(1);
        let address = v.parse(var::LISTEN_ADDRESS, "expected an IP address", |t| t.parse::<IpAddr>().ok())?;
        let address = address.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let port = |name: &str, default: u16| -> Result<SocketAddr, SettingError> {
            let port = v.parse(name, "expected a port, 0 to 65535", |t| t.parse::<u16>().ok())?;
            Ok(SocketAddr::new(address, port.unwrap_or(default)))
        };
        let mut ext_proc = ext_proc(v)?;
        ext_proc.listen = port(var::EXT_PROC_PORT, 9002)?;
        let local = local_tokenizer(v)?;
        let tokenizer = match (v.get(var::TOKENIZER_URL), &local) {
            (None, None) => None,
            (url, _) => Some(tokenizer(v, url.unwrap_or(""), local.clone())?),
        };
        // The fallback rides in the tokenizer's settings but is applied by
        // the picker; read it even when the URL is left to static mode.
        let fallback = match v.one_of(var::TOKENIZER_FALLBACK, &["load-only", "fail"])? {
            Some("fail") => FallbackPolicy::Fail,
            _ => FallbackPolicy::LoadOnly,
        };
        let mut picker = PickerConfig { base_model: model.clone(), fallback, ..PickerConfig::default() };
        if let Some(n) = v.whole::<usize>(var::SESSIONS, 0)? {
            picker.sessions = n;
        }
        let discovery = discovery(v, block_size, &model, max_num_batched_tokens, total_kv_blocks)?;
        if tokenizer.is_none() && matches!(discovery, DiscoveryMode::Kubernetes(_)) {
            return Err(ConfigError::Missing(
                v.name_of(var::TOKENIZER_URL),
                "the tokenizer service in Kubernetes mode, e.g. http://vllm-render:8000",
            ));
        }
        let mut kv_events = IngestConfig::default();
        if let Some(ms) = v.whole::<u64>(var::KV_EVENT_DRAIN_INTERVAL_MS, 1)? {
            kv_events.drain_interval = Duration::from_millis(ms);
            // A slow poll rate backs off to at least itself.
            kv_events.drain_backoff_max = kv_events.drain_backoff_max.max(kv_events.drain_interval);
        }
        let disagg = disagg(v, &router, &runtime)?;
        let replicas = replicas(v, port(var::REPLICA_SYNC_PORT, 9092)?, &discovery)?;
        let grace = v.whole::<u64>(var::SHUTDOWN_GRACE_MS, 0)?.unwrap_or(10_000);
        let log_format = match v.one_of(var::LOG_FORMAT, &["text", "json"])? {
            Some("json") => LogFormat::Json,
            _ => LogFormat::Text,
        };
        Ok(ServeConfig {
            discovery,
            block_size,
            model,
            max_num_batched_tokens,
            total_kv_blocks,
            router,
            runtime,
            ext_proc,
            picker,
            tokenizer,
            health_listen: port(var::HEALTH_PORT, 9003)?,
            metrics_listen: port(var::METRICS_PORT, 9090)?,
            io_threads,
            shutdown_grace: Duration::from_millis(grace),
            log_format,
            log_filter: v.get(var::LOG_LEVEL).unwrap_or("info").to_owned(),
            profile: v.get(var::PROFILE).map(PathBuf::from),
            huge_pages: v
                .one_of(var::TRANSPARENT_HUGE_PAGES, &HugePages::NAMES)?
                .and_then(HugePages::from_name)
                .unwrap_or(HugePages::Never),
            debug_endpoints: v.boolean(var::DEBUG_ENDPOINTS)?.unwrap_or(false),
            tracing: tracing(v)?,
            kv_events,
            disagg,
            replicas,
        })
    }
}

/// OTLP tracing, when an endpoint is set.
fn tracing(v: &Values) -> Result<Option<TracingConfig>, ConfigError> {
    let endpoint =
        v.parse(var::OTLP_ENDPOINT, "expected an http:// or https:// URL, e.g. http://otel-collector:4317", |t| {
            let rest = t.strip_prefix("http://").or_else(|| t.strip_prefix("https://"))?;
            (!rest.is_empty()).then(|| t.to_owned())
        })?;
    let ratio = v.fraction(var::TRACE_SAMPLE_RATIO)?;
    Ok(endpoint.map(|endpoint| TracingConfig {
        endpoint,
        service_name: v.get(var::SERVICE_NAME).unwrap_or("kvpick").to_owned(),
        sample_ratio: ratio.unwrap_or(1.0),
    }))
}

fn ext_proc(v: &Values) -> Result<ExtProcConfig, ConfigError> {
    // No `_` separators here, unlike `Values::whole`: these took none before.
    let positive = |name: &str| {
        v.parse(name, "expected a whole number of at least 1", |t| t.parse::<usize>().ok().filter(|n| *n > 0))
    };
    let mut config = ExtProcConfig::default();
    if let Some(n) = positive(var::MAX_INFLIGHT_REQUESTS)? {
        config.max_inflight_requests = n;
    }
    if let Some(n) = positive(var::MAX_REQUEST_BODY_BYTES)? {
        config.max_body_bytes = n;
    }
    if v.boolean(var::SECURE_SERVING)? == Some(true) {
        config.tls = Tls::SelfSigned { names: vec!["localhost".into()] };
    }
    if let Some(on) = v.boolean(var::CONFORMANCE_HOOKS)? {
        config.conformance_hooks = on;
    }
    if let Some(on) = v.boolean(var::FALLBACKS_IN_HEADER)? {
        config.fallbacks_in_header = on;
    }
    Ok(config)
}

/// `--tokenizer local:PATH` with its template and parity settings, or
/// `None` for the engine's tokenizer.
fn local_tokenizer(v: &Values) -> Result<Option<LocalTokenizerConfig>, ConfigError> {
    let dir = v.parse(
        var::TOKENIZER,
        "expected `engine` or `local:PATH` (a model directory with tokenizer.json)",
        |t| match t.trim() {
            "engine" => Some(None),
            other => parse_local_spec(other).map(|p| Some(p.to_path_buf())),
        },
    )?;
    let chat_template = v.get(var::CHAT_TEMPLATE).map(PathBuf::from);
    match dir.flatten() {
        Some(dir) => Ok(Some(LocalTokenizerConfig { dir, chat_template })),
        None if chat_template.is_some() => Err(ConfigError::Other(format!(
            "{} is set but {} is not `local:PATH`: the engine applies its own template",
            v.name_of(var::CHAT_TEMPLATE),
            v.name_of(var::TOKENIZER)
        ))),
        None => Ok(None),
    }
}

/// The tokenizer's settings, checked (so a config that loads also builds;
/// the local model's files are read at start).
fn tokenizer(v: &Values, url: &str, local: Option<LocalTokenizerConfig>) -> Result<TokenizerConfig, ConfigError> {
    let protocol = v.parse(var::TOKENIZER_PROTOCOL, "expected `vllm-render` or `sglang-tokenize`", |t| {
        t.parse::<TokenizerProtocol>().ok()
    })?;
    let mut config = TokenizerConfig::new(protocol.unwrap_or(TokenizerProtocol::VllmRender), url);
    // A whole number of at least 1, `_` separators allowed.
    let positive = |name: &str, unit: &str| {
        let allowed = format!("expected a whole number of {unit}, at least 1");
        v.parse(name, &allowed, |t| t.replace('_', "").parse::<u64>().ok().filter(|n| *n >= 1))
    };
    if let Some(ms) = positive(var::TOKENIZATION_TIMEOUT_MS, "milliseconds")? {
        config.timeout = Duration::from_millis(ms);
    }
    if let Some(bytes) = positive(var::TOKENIZER_MAX_RESPONSE_BYTES, "bytes")? {
        config.max_response_bytes = usize::try_from(bytes)
            .map_err(|_| v.error(var::TOKENIZER_MAX_RESPONSE_BYTES, "too large for this machine"))?;
    }
    let fallback =
        v.parse(var::TOKENIZER_FALLBACK, "expected `fail` or `load-only`", |t| t.parse::<FallbackPolicy>().ok())?;
    config.fallback = fallback.unwrap_or_default();
    config.local = local;
    if let Some(ratio) = v.fraction(var::TOKENIZER_PARITY_RATIO)? {
        config.parity.ratio = ratio;
    }
    if let Some(on) = v.boolean(var::TOKENIZER_PARITY_FALLBACK)? {
        config.parity.fallback_on_mismatch = on;
    }
    config.validate().map_err(|e| tokenizer_error(v, e))?;
    Ok(config)
}

/// The setting (its variable) that gives a tokenizer config field.
pub(crate) fn tokenizer_setting(field: TokenizerField) -> &'static str {
    match field {
        TokenizerField::BaseUrl => var::TOKENIZER_URL,
        TokenizerField::Protocol => var::TOKENIZER_PROTOCOL,
        TokenizerField::Timeout => var::TOKENIZATION_TIMEOUT_MS,
        TokenizerField::MaxResponseBytes => var::TOKENIZER_MAX_RESPONSE_BYTES,
        TokenizerField::Fallback => var::TOKENIZER_FALLBACK,
        TokenizerField::Local => var::TOKENIZER,
        TokenizerField::ParityRatio => var::TOKENIZER_PARITY_RATIO,
    }
}

/// A tokenizer config error named after the setting that gave the value.
fn tokenizer_error(v: &Values, e: TokenizerConfigError) -> ConfigError {
    let name = v.name_of(tokenizer_setting(e.field));
    ConfigError::Setting(SettingError { name, value: e.value, allowed: e.allowed })
}

/// The cost model; the latency cost is the default because it routes
/// better in `kvpick-bench-routing` (perf/README.md, routing).
fn cost(v: &Values, max_num_batched_tokens: Option<u64>) -> Result<CostModel, ConfigError> {
    if v.one_of(var::COST, &["latency", "dynamo"])? == Some("dynamo") {
        return Ok(CostModel::Dynamo);
    }
    let defaults = EngineRates::default();
    let us = |name: &str, default: f64| -> Result<f64, ConfigError> {
        Ok(v.number(name, 0.0)?.map_or(default, |micros| micros * 1e3))
    };
    Ok(CostModel::Latency(EngineRates {
        step_ns: us(var::STEP_OVERHEAD_US, defaults.step_ns)?,
        prefill_ns_per_token: us(var::PREFILL_US_PER_TOKEN, defaults.prefill_ns_per_token)?,
        decode_ns_per_seq: us(var::DECODE_US_PER_SEQ, defaults.decode_ns_per_seq)?,
        batched_tokens: max_num_batched_tokens.unwrap_or(defaults.batched_tokens),
    }))
}

/// A longer list only makes the header longer: gateways try a few.
const MAX_FALLBACK_ENDPOINTS: usize = 16;

fn router(v: &Values, max_num_batched_tokens: Option<u64>) -> Result<RouterConfig, ConfigError> {
    let mut router = RouterConfig { cost: cost(v, max_num_batched_tokens)?, ..RouterConfig::default() };
    let scale = match v.number(var::PREFILL_LOAD_SCALE, 0.0)? {
        Some(scale) => Some(scale),
        None => v.number(var::OVERLAP_SCORE_WEIGHT, 0.0)?,
    };
    if let Some(scale) = scale {
        router.prefill_load_scale = scale;
    }
    if let Some(t) = v.number(var::TEMPERATURE, 0.0)? {
        router.temperature = t;
    }
    router.queue_threshold = v.number(var::QUEUE_THRESHOLD, 0.0)?;
    if router.queue_threshold.is_some() && max_num_batched_tokens.is_none() {
        return Err(ConfigError::Missing(
            v.name_of(var::MAX_NUM_BATCHED_TOKENS),
            "queueing is on (DYN_ROUTER_QUEUE_THRESHOLD is set) and measures prefill against every engine's \
             --max-num-batched-tokens",
        ));
    }
    if let Some(n) = v.whole::<usize>(var::QUEUE_CAPACITY, 0)? {
        router.queue_capacity = n;
    }
    if let Some(ms) = v.whole::<u64>(var::QUEUE_TIMEOUT_MS, 1)? {
        router.queue_timeout = Duration::from_millis(ms);
    }
    if let Some(secs) = v.whole::<u64>(var::LEASE_SECS, 1)? {
        router.lease = Duration::from_secs(secs);
    }
    if let Some(seed) = v.whole::<u64>(var::ROUTER_SEED, 0)? {
        router.seed = seed;
    }
    if let Some(n) = v.whole::<usize>(var::FALLBACK_ENDPOINTS, 0)? {
        router.fallbacks = n.min(MAX_FALLBACK_ENDPOINTS);
    }
    if let Some(weight) = v.number(var::COPY_WEIGHT, 0.0)? {
        router.copy_weight = weight;
    }
    if let Some(margin) = v.number(var::SESSION_MARGIN, 0.0)? {
        router.session_margin = margin;
    }
    // A duration holds about 584 billion years: beyond that (or NaN) the
    // value is refused, not a panic (found by fuzzing).
    let tpot = v.parse(var::TPOT_TARGET_MS, "expected milliseconds, a number of at least 0", |t| {
        t.parse::<f64>().ok().filter(|ms| *ms >= 0.0).and_then(|ms| Duration::try_from_secs_f64(ms / 1e3).ok())
    })?;
    if tpot.is_some() {
        router.tpot_target = tpot;
    }
    // Below a mebibyte the cap is a few thousand blocks: a typo, not a plan.
    router.index_max_bytes = Some(v.bytes(var::INDEX_MAX_BYTES, 1 << 20)?.unwrap_or_else(default_max_bytes));
    if let Some(on) = v.boolean(var::CALIBRATE)? {
        router.calibration.enabled = on;
    }
    if let Some(secs) = v.whole::<u64>(var::CALIBRATION_STALE_SECS, 1)? {
        router.calibration.stale_after = Duration::from_secs(secs);
    }
    Ok(router)
}

fn runtime(v: &Values) -> Result<RuntimeConfig, ConfigError> {
    let choice = match v.one_of(var::RUNTIME, &["auto", "glommio", "threads", "inline"])? {
        Some("glommio") => RuntimeChoice::Force(RuntimeKind::Glommio),
        Some("threads") => RuntimeChoice::Force(RuntimeKind::StdThreads),
        Some("inline") => RuntimeChoice::Force(RuntimeKind::Inline),
        _ => RuntimeChoice::Auto,
    };
    let mut runtime = RuntimeConfig { choice, ..RuntimeConfig::default() };
    if runtime.inline() {
        // Inline shards add no parallelism (they run on the threads that
        // use them), and more than one turns every pick into a
        // scatter-gather: one, unless asked.
        runtime.shards = 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(shards) = v.whole_in::<usize>(var::SHARDS, 1, MAX_THREADS)? {
        runtime.shards = shards;
        // Keep the default's shape: the highest-numbered cores, wrapping
        // when there are more shards than cores.
        runtime.cpus = (0..shards).map(|i| cores - 1 - (i % cores)).rev().collect();
    }
    match v.get(var::SHARD_CPUS) {
        None => {}
        Some(t) if t.eq_ignore_ascii_case("none") => runtime.cpus.clear(),
        Some(t) => {
            let cpus: Option<Vec<usize>> = t.split(',').map(|c| c.trim().parse::<usize>().ok()).collect();
            runtime.cpus = cpus.filter(|c| !c.is_empty() && c.iter().all(|cpu| *cpu < cores)).ok_or_else(|| {
                v.error(var::SHARD_CPUS, format!("expected `none` or CPU numbers below {cores}, e.g. 1,2"))
            })?;
        }
    }
    Ok(runtime)
}

fn discovery(
    v: &Values,
    block_size: u32,
    model: &Option<String>,
    max_num_batched_tokens: Option<u64>,
    total_kv_blocks: Option<u64>,
) -> Result<DiscoveryMode, ConfigError> {
    let pool = v.get(var::POOL_NAME);
    let mode = v.one_of(var::DISCOVERY, &["kubernetes", "static"])?;
    let mode = mode.unwrap_or(if pool.is_some() { "kubernetes" } else { "static" });
    if mode == "static" {
        let file = v.get(var::WORKERS_FILE).ok_or_else(|| {
            ConfigError::Missing(v.name_of(var::WORKERS_FILE), "static discovery reads its workers from a file")
        })?;
        let poll = v.whole::<u64>(var::WORKERS_FILE_POLL_MS, 10)?.unwrap_or(1000);
        return Ok(DiscoveryMode::Static { file: PathBuf::from(file), poll: Duration::from_millis(poll) });
    }
    let pool = pool.ok_or_else(|| ConfigError::Missing(v.name_of(var::POOL_NAME), "the InferencePool to serve"))?;
    let namespace = v
        .get(var::NAMESPACE)
        .ok_or_else(|| ConfigError::Missing(v.name_of(var::NAMESPACE), "the pool's namespace (downward API)"))?;
    let mut cfg = DiscoveryConfig::new(namespace, pool, block_size);
    cfg.model.clone_from(model);
    cfg.max_num_batched_tokens = max_num_batched_tokens;
    cfg.total_kv_blocks = total_kv_blocks;
    if let Some(engine) =
        v.parse(var::ENGINE, "expected auto, vllm, sglang, trtllm or trtllm-zmq", |t| t.parse::<EngineSetting>().ok())?
    {
        cfg.engine = engine;
    }
    if let Some(keys) = v.get(var::ROLE_LABELS) {
        let keys: Vec<String> = keys.split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_owned).collect();
        if keys.is_empty() {
            return Err(v.error(var::ROLE_LABELS, "expected pod label keys, comma-separated".to_owned()).into());
        }
        cfg.role_labels = keys;
    }
    if let Some(port) = v.whole::<u16>(var::KV_EVENT_PORT, 1)? {
        cfg.kv_event_port = port;
    }
    cfg.kv_event_replay_port = v.whole::<u16>(var::KV_EVENT_REPLAY_PORT, 1)?;
    cfg.peer_service = v.get(var::PEER_SERVICE).map(str::to_owned);
    cfg.pod_ip = v.parse(var::POD_IP, "expected an IP address", |t| t.parse::<IpAddr>().ok())?;
    if let Some(port) = v.whole::<u16>(var::REPLICA_SYNC_PORT, 1)? {
        cfg.peer_port = port;
    }
    cfg.validate().map_err(|e| ConfigError::Other(e.to_string()))?;
    Ok(DiscoveryMode::Kubernetes(Box::new(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvpick_router::tokenizer::ParityConfig;

    fn config(pairs: &[(&'static str, &str)]) -> Result<ServeConfig, ConfigError> {
        ServeConfig::from_values(&Values::from_pairs(pairs.iter().copied()))
    }

    #[test]
    fn static_mode_needs_a_file_and_queueing_needs_batched_tokens() {
        let e = config(&[]).err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("KVPICK_WORKERS_FILE is required: static discovery reads its workers from a file")
        );
        let e = config(&[(var::WORKERS_FILE, "w.yaml"), (var::QUEUE_THRESHOLD, "2")]).err();
        assert!(matches!(e, Some(ConfigError::Missing(ref name, _)) if name == var::MAX_NUM_BATCHED_TOKENS));
        let c = config(&[
            (var::WORKERS_FILE, "w.yaml"),
            (var::QUEUE_THRESHOLD, "2"),
            (var::MAX_NUM_BATCHED_TOKENS, "8192"),
            (var::OVERLAP_SCORE_WEIGHT, "2.5"),
            (var::SHARDS, "3"),
            (var::QUEUE_CAPACITY, "0"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.router.queue_threshold, Some(2.0));
        assert_eq!(c.router.queue_capacity, 0, "no waiting: shed at once");
        assert_eq!(c.router.prefill_load_scale, 2.5);
        assert_eq!(c.runtime.shards, 3);
        assert_eq!(c.runtime.cpus.len(), 3);
        assert_eq!(c.ext_proc.listen.port(), 9002);
    }

    #[test]
    fn transparent_huge_pages_are_never_unless_allowed() {
        let huge_pages = |value: Option<&str>| {
            let mut pairs = vec![(var::WORKERS_FILE, "w.yaml")];
            pairs.extend(value.map(|v| (var::TRANSPARENT_HUGE_PAGES, v)));
            config(&pairs).map(|c| c.huge_pages)
        };
        assert_eq!(huge_pages(None).ok(), Some(HugePages::Never));
        assert_eq!(huge_pages(Some("never")).ok(), Some(HugePages::Never));
        assert_eq!(huge_pages(Some("allowed")).ok(), Some(HugePages::Allowed));
        assert!(huge_pages(Some("always")).is_err(), "not a choice");
        assert_eq!(HugePages::NAMES.map(HugePages::from_name), [Some(HugePages::Never), Some(HugePages::Allowed)]);
    }

    #[test]
    fn inline_shards_default_to_one_and_threads_to_the_cores_left() {
        let c = config(&[(var::WORKERS_FILE, "w.yaml")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.runtime.choice, RuntimeChoice::Auto);
        assert_eq!(c.runtime.shards, 1, "inline shards add no parallelism");
        let c = config(&[(var::WORKERS_FILE, "w.yaml"), (var::RUNTIME, "threads")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.runtime.choice, RuntimeChoice::Force(RuntimeKind::StdThreads));
        assert_eq!(c.runtime.shards, RuntimeConfig::default().shards);
        let c = config(&[(var::WORKERS_FILE, "w.yaml"), (var::RUNTIME, "inline"), (var::SHARDS, "2")])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.runtime.choice, c.runtime.shards), (RuntimeChoice::Force(RuntimeKind::Inline), 2));
    }

    #[test]
    fn kubernetes_mode_is_chosen_by_the_pool_name_and_checked() {
        let e = config(&[(var::POOL_NAME, "pool")]).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("POD_NAMESPACE is required: the pool's namespace (downward API)"));
        let e = config(&[(var::POOL_NAME, "pool"), (var::NAMESPACE, "ns")]).err();
        assert!(matches!(e, Some(ConfigError::Missing(ref n, _)) if n == "DYN_EPP_TOKENIZER_SERVICE_URL"));
        let c = config(&[
            (var::POOL_NAME, "pool"),
            (var::NAMESPACE, "ns"),
            ("DYN_EPP_TOKENIZER_SERVICE_URL", "http://render:8000"),
            (var::KV_EVENT_REPLAY_PORT, "5558"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        match c.discovery {
            DiscoveryMode::Kubernetes(d) => {
                assert_eq!((d.pool_name.as_str(), d.kv_event_replay_port), ("pool", Some(5558)));
                assert_eq!(d.engine, EngineSetting::Auto);
            }
            other => panic!("expected kubernetes, got {other:?}"),
        }
        let k8s = |engine| {
            config(&[
                (var::POOL_NAME, "pool"),
                (var::NAMESPACE, "ns"),
                ("DYN_EPP_TOKENIZER_SERVICE_URL", "http://render:8000"),
                (var::ENGINE, engine),
            ])
        };
        match k8s("trtllm").map(|c| c.discovery) {
            Ok(DiscoveryMode::Kubernetes(d)) => {
                assert_eq!(d.engine, EngineSetting::Fixed(kvpick_discovery::EngineKind::Trtllm))
            }
            other => panic!("expected kubernetes, got {other:?}"),
        }
        let e = k8s("tgi").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("KVPICK_ENGINE") && e.contains("trtllm-zmq"), "{e}");
    }

    #[test]
    fn the_latency_cost_is_the_default_and_dynamo_is_one_setting_away() {
        let c = config(&[(var::WORKERS_FILE, "w.yaml"), (var::MAX_NUM_BATCHED_TOKENS, "4096")])
            .unwrap_or_else(|e| panic!("{e}"));
        let rates = EngineRates { batched_tokens: 4096, ..EngineRates::default() };
        assert_eq!(c.router.cost, CostModel::Latency(rates));
        let c =
            config(&[(var::WORKERS_FILE, "w.yaml"), (var::PREFILL_US_PER_TOKEN, "12.5"), (var::STEP_OVERHEAD_US, "0")])
                .unwrap_or_else(|e| panic!("{e}"));
        match c.router.cost {
            CostModel::Latency(r) => assert_eq!((r.prefill_ns_per_token, r.step_ns), (12_500.0, 0.0)),
            other => panic!("expected the latency cost, got {other:?}"),
        }
        let c = config(&[(var::WORKERS_FILE, "w.yaml"), (var::COST, "dynamo")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.router.cost, CostModel::Dynamo);
        let e = config(&[(var::WORKERS_FILE, "w.yaml"), (var::COST, "cheapest")]).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("KVPICK_COST=\"cheapest\" is not valid: expected one of latency, dynamo"));
    }

    #[test]
    fn calibration_is_on_by_default_and_can_be_turned_off_or_retuned() {
        let c = config(&[(var::WORKERS_FILE, "w.yaml")]).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.router.calibration.enabled);
        assert_eq!(c.router.calibration.stale_after, Duration::from_secs(600));
        let c =
            config(&[(var::WORKERS_FILE, "w.yaml"), (var::CALIBRATE, "false"), (var::CALIBRATION_STALE_SECS, "60")])
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.router.calibration.enabled);
        assert_eq!(c.router.calibration.stale_after, Duration::from_secs(60));
        assert_eq!(c.router.copy_weight, kvpick_core::cost::DEFAULT_COPY_WEIGHT);
        let c = config(&[(var::WORKERS_FILE, "w.yaml"), (var::COPY_WEIGHT, "0")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.router.copy_weight, 0.0);
        assert_eq!(c.router.tpot_target, None);
        let c =
            config(&[(var::WORKERS_FILE, "w.yaml"), (var::TPOT_TARGET_MS, "12.5")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.router.tpot_target, Some(Duration::from_micros(12_500)));
        assert_eq!(c.router.session_margin, kvpick_core::cost::DEFAULT_SESSION_MARGIN);
        assert_eq!(c.picker.sessions, kvpick_router::picker::DEFAULT_SESSIONS);
        let c = config(&[(var::WORKERS_FILE, "w.yaml"), (var::SESSIONS, "0"), (var::SESSION_MARGIN, "1.5")])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.picker.sessions, c.router.session_margin), (0, 1.5));
    }

    #[test]
    fn bad_values_are_named() {
        let e = config(&[(var::WORKERS_FILE, "w"), ("DYN_EPP_MAX_INFLIGHT_REQUESTS", "lots")]).err();
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some("DYN_EPP_MAX_INFLIGHT_REQUESTS=\"lots\" is not valid: expected a whole number of at least 1")
        );
        let e = config(&[(var::WORKERS_FILE, "w"), (var::RUNTIME, "fibers")]).err();
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some("KVPICK_RUNTIME=\"fibers\" is not valid: expected one of auto, glommio, threads, inline")
        );
        let e = config(&[(var::WORKERS_FILE, "w"), ("DYN_EPP_TOKENIZER_SERVICE_URL", "ftp://x")]).err();
        assert!(matches!(e, Some(ConfigError::Setting(ref s)) if s.name == "DYN_EPP_TOKENIZER_SERVICE_URL"));
        // Past what a duration holds: refused (it panicked; found by the
        // `settings` fuzz target).
        for shards in [(var::SHARDS, "99999999999999"), (var::IO_THREADS, "1025")] {
            let e = config(&[(var::WORKERS_FILE, "w"), shards]).err();
            assert!(matches!(e, Some(ConfigError::Setting(ref s)) if s.name == shards.0), "{shards:?}");
        }
        for too_long in ["1.5e28", "-1", "NaN", "inf"] {
            let e = config(&[(var::WORKERS_FILE, "w"), (var::TPOT_TARGET_MS, too_long)]).err();
            assert!(matches!(e, Some(ConfigError::Setting(ref s)) if s.name == var::TPOT_TARGET_MS), "{too_long}");
        }
    }

    #[test]
    fn ext_proc_defaults_and_overrides() {
        let c = config(&[(var::WORKERS_FILE, "w")]).unwrap_or_else(|e| panic!("{e}"));
        let e = &c.ext_proc;
        assert_eq!((e.max_inflight_requests, e.max_body_bytes, e.tls.clone()), (1024, 16 << 20, Tls::Off));
        assert!(!e.fallbacks_in_header, "the header carries the pick alone by default");
        assert_eq!(c.picker, PickerConfig::default());
        let c = config(&[
            (var::WORKERS_FILE, "w"),
            (var::MAX_INFLIGHT_REQUESTS, "8"),
            (var::SECURE_SERVING, "true"),
            (var::MODEL, "llama"),
            (var::FALLBACKS_IN_HEADER, "true"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(c.ext_proc.fallbacks_in_header);
        assert_eq!(c.ext_proc.max_inflight_requests, 8);
        assert!(matches!(c.ext_proc.tls, Tls::SelfSigned { .. }));
        assert_eq!(c.picker.base_model.as_deref(), Some("llama"));
    }

    #[test]
    fn ext_proc_bad_values_name_the_variable() {
        let e = config(&[(var::WORKERS_FILE, "w"), (var::MAX_INFLIGHT_REQUESTS, "0")]).err();
        assert_eq!(
            e.map(|e| e.to_string()),
            Some(format!("{}=\"0\" is not valid: expected a whole number of at least 1", var::MAX_INFLIGHT_REQUESTS))
        );
        assert!(config(&[(var::WORKERS_FILE, "w"), (var::SECURE_SERVING, "maybe")]).is_err());
    }

    #[test]
    fn disaggregation_settings() {
        let c = config(&[(var::WORKERS_FILE, "w")]).unwrap_or_else(|e| panic!("{e}"));
        let d = c.disagg.unwrap_or_else(|| panic!("on by default"));
        assert_eq!(d.decider, DisaggConfig::default());
        assert_eq!(d.router.queue_threshold, Some(DEFAULT_PREFILL_QUEUE_THRESHOLD));
        assert_eq!((d.runtime.shards, d.runtime.spin_before_park), (1, c.runtime.spin_before_park));
        assert_eq!(d.batched_tokens, 8192, "the latency cost's prior");

        let c = config(&[
            (var::WORKERS_FILE, "w"),
            (var::PD_THRESHOLD_TOKENS, "0"),
            (var::PD_COMPARE_TTFT, "false"),
            (var::PREFILL_QUEUE_THRESHOLD, "1.5"),
            (var::PREFILL_SHARDS, "2"),
            (var::MAX_NUM_BATCHED_TOKENS, "2048"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let d = c.disagg.unwrap_or_else(|| panic!("on"));
        assert_eq!((d.decider.threshold_tokens, d.router.queue_threshold, d.runtime.shards), (0, Some(1.5), 2));
        assert!(!d.decider.compare_ttft);
        assert_eq!(d.batched_tokens, 2048);
        assert_eq!(c.router.queue_threshold, None, "the decode side's queue is its own");

        let off = config(&[(var::WORKERS_FILE, "w"), (var::DISAGGREGATION, "off")]).unwrap_or_else(|e| panic!("{e}"));
        assert!(off.disagg.is_none());
        assert!(config(&[(var::WORKERS_FILE, "w"), (var::DISAGGREGATION, "on")]).is_err());

        let k8s = |labels: &'static str| {
            config(&[
                (var::POOL_NAME, "pool"),
                (var::NAMESPACE, "llm"),
                (var::TOKENIZER_URL, "http://r:8000"),
                (var::ROLE_LABELS, labels),
            ])
        };
        match k8s(" example.com/pd , llm-d.ai/role ").map(|c| c.discovery) {
            Ok(DiscoveryMode::Kubernetes(cfg)) => assert_eq!(cfg.role_labels, ["example.com/pd", "llm-d.ai/role"]),
            other => panic!("{other:?}"),
        }
        assert!(k8s(" , ").is_err());
    }

    #[test]
    fn tokenizer_defaults() {
        let c = config(&[(var::WORKERS_FILE, "w"), (var::TOKENIZER_URL, "http://vllm:8000")]);
        let c = c.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.tokenizer, Some(TokenizerConfig::new(TokenizerProtocol::VllmRender, "http://vllm:8000")));
    }

    #[test]
    fn every_tokenizer_setting_parses() {
        let c = config(&[
            (var::WORKERS_FILE, "w"),
            (var::TOKENIZER_URL, "http://sglang:30000/prefix/"),
            (var::TOKENIZER_PROTOCOL, "sglang-tokenize"),
            (var::TOKENIZATION_TIMEOUT_MS, "250"),
            (var::TOKENIZER_MAX_RESPONSE_BYTES, "1_048_576"),
            (var::TOKENIZER_FALLBACK, "fail"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.tokenizer,
            Some(TokenizerConfig {
                protocol: TokenizerProtocol::SglangTokenize,
                base_url: "http://sglang:30000/prefix/".into(),
                timeout: Duration::from_millis(250),
                max_response_bytes: 1 << 20,
                fallback: FallbackPolicy::Fail,
                local: None,
                parity: ParityConfig::default(),
            })
        );
        assert_eq!(c.picker.fallback, FallbackPolicy::Fail);
    }

    #[test]
    fn local_tokenizer_settings() {
        // Static mode, no URL: local alone (the app points parity at the
        // first worker).
        let c = config(&[(var::WORKERS_FILE, "w"), (var::TOKENIZER, "local:/models/m")]);
        let t = c.unwrap_or_else(|e| panic!("{e}")).tokenizer.unwrap_or_else(|| panic!("no tokenizer config"));
        assert_eq!(t.local, Some(LocalTokenizerConfig { dir: "/models/m".into(), chat_template: None }));
        assert!(!t.has_engine());
        assert_eq!(t.parity, ParityConfig { ratio: 0.01, fallback_on_mismatch: true });
        // Everything set.
        let c = config(&[
            (var::WORKERS_FILE, "w"),
            (var::TOKENIZER, "local: /models/m "),
            (var::TOKENIZER_URL, "http://vllm:8000"),
            (var::CHAT_TEMPLATE, "/t/chat.jinja"),
            (var::TOKENIZER_PARITY_RATIO, "0.5"),
            (var::TOKENIZER_PARITY_FALLBACK, "false"),
        ]);
        let t = c.unwrap_or_else(|e| panic!("{e}")).tokenizer.unwrap_or_else(|| panic!("no tokenizer config"));
        let local = LocalTokenizerConfig { dir: "/models/m".into(), chat_template: Some("/t/chat.jinja".into()) };
        assert_eq!((t.local, t.base_url.as_str()), (Some(local), "http://vllm:8000"));
        assert_eq!(t.parity, ParityConfig { ratio: 0.5, fallback_on_mismatch: false });
        // `engine` is the default and leaves the config as before.
        let c = config(&[(var::WORKERS_FILE, "w"), (var::TOKENIZER, "engine")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.tokenizer, None);
        // Errors name the setting.
        for (pairs, name) in [
            (&[(var::TOKENIZER, "local:")][..], var::TOKENIZER),
            (&[(var::TOKENIZER, "hf:/m")], var::TOKENIZER),
            (&[(var::TOKENIZER, "local:/m"), (var::TOKENIZER_PARITY_RATIO, "2")], var::TOKENIZER_PARITY_RATIO),
            (
                &[(var::TOKENIZER, "local:/m"), (var::TOKENIZER_PARITY_FALLBACK, "sometimes")],
                var::TOKENIZER_PARITY_FALLBACK,
            ),
            (&[(var::CHAT_TEMPLATE, "/t.jinja")], var::CHAT_TEMPLATE),
        ] {
            let pairs: Vec<_> = [(var::WORKERS_FILE, "w")].into_iter().chain(pairs.iter().copied()).collect();
            let err = config(&pairs).expect_err(name);
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn tokenizer_errors_name_the_setting_and_value() {
        type Case<'a> = (&'a [(&'static str, &'a str)], &'a str, &'a str);
        let url = (var::TOKENIZER_URL, "http://vllm:8000");
        let cases: &[Case] = &[
            (&[url, (var::TOKENIZER_PROTOCOL, "trtllm")], var::TOKENIZER_PROTOCOL, "trtllm"),
            (&[url, (var::TOKENIZATION_TIMEOUT_MS, "0")], var::TOKENIZATION_TIMEOUT_MS, "0"),
            (&[url, (var::TOKENIZATION_TIMEOUT_MS, "5s")], var::TOKENIZATION_TIMEOUT_MS, "5s"),
            (&[url, (var::TOKENIZER_MAX_RESPONSE_BYTES, "-1")], var::TOKENIZER_MAX_RESPONSE_BYTES, "-1"),
            (&[url, (var::TOKENIZER_FALLBACK, "ignore")], var::TOKENIZER_FALLBACK, "ignore"),
            (&[(var::TOKENIZER_URL, "vllm:8000")], var::TOKENIZER_URL, "vllm:8000"),
            (&[(var::TOKENIZER_URL, "https://vllm")], var::TOKENIZER_URL, "https://vllm"),
            (&[(var::TOKENIZER_URL, "http://vllm/?q=1")], var::TOKENIZER_URL, "http://vllm/?q=1"),
            (&[(var::TOKENIZER_URL, "http://u:p@vllm")], var::TOKENIZER_URL, "http://u:p@vllm"),
        ];
        for (pairs, setting, value) in cases {
            let pairs: Vec<_> = [(var::WORKERS_FILE, "w")].into_iter().chain(pairs.iter().copied()).collect();
            let err = config(&pairs).expect_err(value);
            match &err {
                ConfigError::Setting(s) => assert_eq!((s.name.as_str(), s.value.as_str()), (*setting, *value), "{err}"),
                other => panic!("expected a setting error, got {other:?}"),
            }
            assert!(err.to_string().contains(setting), "{err}");
        }
        // Without a URL there is no tokenizer config in static mode (the
        // first worker renders); Kubernetes mode requires it, by name.
        let c = config(&[(var::WORKERS_FILE, "w")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.tokenizer, None);
        let e = config(&[(var::POOL_NAME, "pool"), (var::NAMESPACE, "ns")]).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains(var::TOKENIZER_URL)));
        assert_eq!(tokenizer_setting(TokenizerField::MaxResponseBytes), var::TOKENIZER_MAX_RESPONSE_BYTES);
    }
}
