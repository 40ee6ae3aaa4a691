//! Every setting of `kvpick serve`: one environment variable and one flag
//! each, read once at start-up and validated before anything starts.
//!
//! The variables keep the names of Dynamo's standalone EPP
//! (`DYN_EPP_*`, `DYN_KV_CACHE_BLOCK_SIZE`, `DYN_ROUTER_*`), so a manifest
//! written for it works unchanged; kvpick's own settings are `KVPICK_*`.
//! A flag wins over its variable. A bad value stops start-up with one
//! message naming where it came from (the variable or the flag), the value
//! and what is allowed.
//!
//! The table ([`SETTINGS`]) is the single source of names, defaults and
//! help text: the clap command, `--help` and the lookups are all built
//! from it.

use std::collections::HashMap;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// One setting: its variable, its flag (without `--`), what it does and its
/// default as shown in `--help`.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub var: &'static str,
    pub flag: &'static str,
    pub help: &'static str,
    pub default: Option<&'static str>,
}

const fn s(var: &'static str, flag: &'static str, default: Option<&'static str>, help: &'static str) -> Setting {
    Setting { var, flag, help, default }
}

pub const DISCOVERY: &str = "KVPICK_DISCOVERY";
pub const WORKERS_FILE: &str = "KVPICK_WORKERS_FILE";
pub const WORKERS_FILE_POLL_MS: &str = "KVPICK_WORKERS_FILE_POLL_MS";
pub const POOL_NAME: &str = "DYN_EPP_INFERENCE_POOL_NAME";
pub const NAMESPACE: &str = "POD_NAMESPACE";
pub const MODEL: &str = "DYN_MODEL_NAME";
pub const BLOCK_SIZE: &str = "DYN_KV_CACHE_BLOCK_SIZE";
pub const KV_EVENT_PORT: &str = "DYN_EPP_KV_EVENT_PORT";
pub const ENGINE: &str = "KVPICK_ENGINE";
pub const KV_EVENT_DRAIN_INTERVAL_MS: &str = "KVPICK_KV_EVENT_DRAIN_INTERVAL_MS";
pub const DISAGGREGATION: &str = "KVPICK_DISAGGREGATION";
pub const ROLE_LABELS: &str = "KVPICK_ROLE_LABELS";
pub const PD_THRESHOLD_TOKENS: &str = "KVPICK_PD_THRESHOLD_TOKENS";
pub const PD_COMPARE_TTFT: &str = "KVPICK_PD_COMPARE_TTFT";
pub const PREFILL_SHARDS: &str = "KVPICK_PREFILL_SHARDS";
pub const PREFILL_QUEUE_THRESHOLD: &str = "KVPICK_PREFILL_QUEUE_THRESHOLD";
pub const KV_EVENT_REPLAY_PORT: &str = "DYN_EPP_KV_EVENT_REPLAY_PORT";
pub const MAX_NUM_BATCHED_TOKENS: &str = "DYN_EPP_MAX_NUM_BATCHED_TOKENS";
pub const TOTAL_KV_BLOCKS: &str = "DYN_EPP_TOTAL_KV_BLOCKS";
pub const PEER_SERVICE: &str = "DYN_EPP_PEER_SERVICE";
pub const POD_IP: &str = "POD_IP";
pub const REPLICA_SYNC_PORT: &str = "DYN_EPP_REPLICA_SYNC_PORT";
pub const PEERS: &str = "KVPICK_PEERS";
pub const REPLICA_ID: &str = "KVPICK_REPLICA_ID";
pub const PEER_TOKEN: &str = "KVPICK_PEER_TOKEN";
pub const PEER_TOKEN_FILE: &str = "KVPICK_PEER_TOKEN_FILE";
pub const PEER_TLS_DIR: &str = "KVPICK_PEER_TLS_DIR";
pub const PEER_TLS_SERVER_NAME: &str = "KVPICK_PEER_TLS_SERVER_NAME";
pub const PEER_GRACE_MS: &str = "KVPICK_PEER_GRACE_MS";
pub const WARM_START_TIMEOUT_MS: &str = "KVPICK_WARM_START_TIMEOUT_MS";
pub const PEER_BATCH_DELAY_US: &str = "KVPICK_PEER_BATCH_DELAY_US";
pub const PEER_TRANSPORT: &str = "KVPICK_PEER_TRANSPORT";
pub const PEER_NATS_URL: &str = "KVPICK_PEER_NATS_URL";
pub const PEER_NATS_POOL: &str = "KVPICK_PEER_NATS_POOL";
pub const PEER_NATS_CREDS: &str = "KVPICK_PEER_NATS_CREDS";
pub const PEER_NATS_CA: &str = "KVPICK_PEER_NATS_CA";
pub const PEER_NATS_REPLICAS: &str = "KVPICK_PEER_NATS_REPLICAS";
pub const EXT_PROC_PORT: &str = "KVPICK_EXT_PROC_PORT";
pub const TOKENIZER_URL: &str = "DYN_EPP_TOKENIZER_SERVICE_URL";
pub const TOKENIZER_PROTOCOL: &str = "DYN_EPP_TOKENIZER_PROTOCOL";
pub const TOKENIZATION_TIMEOUT_MS: &str = "DYN_EPP_TOKENIZATION_TIMEOUT_MS";
pub const TOKENIZER_MAX_RESPONSE_BYTES: &str = "DYN_EPP_TOKENIZER_MAX_RESPONSE_BYTES";
/// kvpick's own (Dynamo's EPP always fails): `fail` or `load-only`.
pub const TOKENIZER_FALLBACK: &str = "DYN_EPP_TOKENIZER_FALLBACK";
pub const TOKENIZER: &str = "KVPICK_TOKENIZER";
pub const CHAT_TEMPLATE: &str = "KVPICK_CHAT_TEMPLATE";
pub const TOKENIZER_PARITY_RATIO: &str = "KVPICK_TOKENIZER_PARITY_RATIO";
pub const TOKENIZER_PARITY_FALLBACK: &str = "KVPICK_TOKENIZER_PARITY_FALLBACK";
pub const MAX_INFLIGHT_REQUESTS: &str = "DYN_EPP_MAX_INFLIGHT_REQUESTS";
pub const MAX_REQUEST_BODY_BYTES: &str = "KVPICK_MAX_REQUEST_BODY_BYTES";
pub const SECURE_SERVING: &str = "DYN_SECURE_SERVING";
pub const CONFORMANCE_HOOKS: &str = "KVPICK_CONFORMANCE_HOOKS";
pub const HEALTH_PORT: &str = "KVPICK_HEALTH_PORT";
pub const METRICS_PORT: &str = "KVPICK_METRICS_PORT";
pub const LISTEN_ADDRESS: &str = "KVPICK_LISTEN_ADDRESS";
pub const COST: &str = "KVPICK_COST";
pub const STEP_OVERHEAD_US: &str = "KVPICK_STEP_OVERHEAD_US";
pub const PREFILL_US_PER_TOKEN: &str = "KVPICK_PREFILL_US_PER_TOKEN";
pub const DECODE_US_PER_SEQ: &str = "KVPICK_DECODE_US_PER_SEQ";
pub const COPY_WEIGHT: &str = "KVPICK_COPY_WEIGHT";
pub const CALIBRATE: &str = "KVPICK_CALIBRATE";
pub const CALIBRATION_STALE_SECS: &str = "KVPICK_CALIBRATION_STALE_SECS";
pub const TPOT_TARGET_MS: &str = "KVPICK_TPOT_TARGET_MS";
pub const SESSIONS: &str = "KVPICK_SESSIONS";
pub const SESSION_MARGIN: &str = "KVPICK_SESSION_MARGIN";
pub const PREFILL_LOAD_SCALE: &str = "DYN_ROUTER_PREFILL_LOAD_SCALE";
pub const OVERLAP_SCORE_WEIGHT: &str = "DYN_ROUTER_OVERLAP_SCORE_WEIGHT";
pub const TEMPERATURE: &str = "DYN_ROUTER_TEMPERATURE";
pub const QUEUE_THRESHOLD: &str = "DYN_ROUTER_QUEUE_THRESHOLD";
pub const QUEUE_CAPACITY: &str = "DYN_ROUTER_QUEUE_CAPACITY";
pub const QUEUE_TIMEOUT_MS: &str = "DYN_ROUTER_QUEUE_TIMEOUT_MS";
pub const LEASE_SECS: &str = "DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS";
pub const ROUTER_SEED: &str = "DYN_ROUTER_SEED";
pub const FALLBACK_ENDPOINTS: &str = "KVPICK_FALLBACK_ENDPOINTS";
pub const FALLBACKS_IN_HEADER: &str = "KVPICK_FALLBACKS_IN_HEADER";
pub const SHARDS: &str = "KVPICK_SHARDS";
pub const INDEX_MAX_BYTES: &str = "KVPICK_INDEX_MAX_BYTES";
pub const SHARD_CPUS: &str = "KVPICK_SHARD_CPUS";
pub const RUNTIME: &str = "KVPICK_RUNTIME";
pub const IO_THREADS: &str = "KVPICK_IO_THREADS";
pub const SHUTDOWN_GRACE_MS: &str = "KVPICK_SHUTDOWN_GRACE_MS";
pub const LOG_FORMAT: &str = "KVPICK_LOG_FORMAT";
pub const LOG_LEVEL: &str = "KVPICK_LOG";
pub const PROFILE: &str = "KVPICK_PROFILE";
pub const TRANSPARENT_HUGE_PAGES: &str = "KVPICK_TRANSPARENT_HUGE_PAGES";
pub const DEBUG_ENDPOINTS: &str = "KVPICK_DEBUG_ENDPOINTS";
/// OpenTelemetry's own names, so a collector's usual manifest applies.
pub const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const TRACE_SAMPLE_RATIO: &str = "KVPICK_TRACE_SAMPLE_RATIO";

/// Every setting, in `--help` order. Only this module and `app::config`
/// (which turns [`Values`] into the typed configs) know these names.
pub const SETTINGS: &[Setting] = &[
    s(
        DISCOVERY,
        "discovery",
        None,
        "Where workers come from: `kubernetes` (watch the InferencePool) or `static` (a workers file). Default: kubernetes when DYN_EPP_INFERENCE_POOL_NAME is set, else static",
    ),
    s(
        WORKERS_FILE,
        "workers-file",
        None,
        "Static mode: YAML or JSON list of {endpoint: \"ip:port\", kv_events: \"tcp://ip:port\", replay?: \"tcp://ip:port\", block_size?, model?, engine?, role?}; re-read when it changes",
    ),
    s(
        WORKERS_FILE_POLL_MS,
        "workers-file-poll-ms",
        Some("1000"),
        "Static mode: how often the workers file is checked for changes, in ms",
    ),
    s(POOL_NAME, "pool-name", None, "Kubernetes mode: the InferencePool to serve"),
    s(NAMESPACE, "namespace", None, "Kubernetes mode: the pool's namespace (from the downward API)"),
    s(
        MODEL,
        "model",
        None,
        "The pool's base model; any other `model` in a request is a LoRA adapter (hashed with its own seed)",
    ),
    s(BLOCK_SIZE, "block-size", Some("16"), "Tokens per KV block: must equal every engine's --block-size"),
    s(
        ENGINE,
        "engine",
        Some("auto"),
        "Kubernetes mode: the engine of pods without a `kvpick.io/engine` label: `auto` (from their images, else vLLM), `vllm`, `sglang`, `trtllm` (KV events drained from /kv_cache_events) or `trtllm-zmq`",
    ),
    s(
        DISAGGREGATION,
        "disaggregation",
        Some("auto"),
        "Disaggregated prefill/decode: `auto` (workers with the prefill role get a selector of their own, and a request whose uncached prompt on the chosen decode worker is long enough is split: x-prefiller-host-port names the prefill worker) or `off` (roles are ignored: every worker serves whole requests)",
    ),
    s(
        ROLE_LABELS,
        "role-labels",
        Some("llm-d.ai/role,nvidia.com/dynamo-sub-component-type"),
        "Kubernetes mode: pod label keys naming a worker's role (`prefill`, `decode`, `prefill-decode`/`both`, `encode`: not a worker), first match wins; unlabelled pods serve both",
    ),
    s(
        PD_THRESHOLD_TOKENS,
        "pd-threshold-tokens",
        Some("256"),
        "Disaggregation decider: split a request only when at least this many of its prompt tokens are uncached on the chosen decode worker (shorter: prefilled there); 0 splits every request",
    ),
    s(
        PD_COMPARE_TTFT,
        "pd-compare-ttft",
        Some("true"),
        "Disaggregation decider: also keep a request whole when its decode worker, prefilling it there, is predicted to give the first token sooner than the prefill worker (latency cost only): better TTFT, somewhat worse TPOT in the routing simulator",
    ),
    s(
        PREFILL_SHARDS,
        "prefill-shards",
        Some("1"),
        "Disaggregation: shard threads of the prefill workers' selector (on the decode shards' cores, spinning while busy as they do)",
    ),
    s(
        PREFILL_QUEUE_THRESHOLD,
        "prefill-queue-threshold",
        Some("2"),
        "Disaggregation: a request is not split while every prefill worker has more than this × max_num_batched_tokens in prefill (it is prefilled on the decode worker instead; a prefill worker without --max-num-batched-tokens counts 8192)",
    ),
    s(KV_EVENT_PORT, "kv-event-port", Some("5557"), "Kubernetes mode: rank 0's KV-event PUB port on each pod"),
    s(
        KV_EVENT_DRAIN_INTERVAL_MS,
        "kv-event-drain-interval-ms",
        Some("50"),
        "TensorRT-LLM: ms between /kv_cache_events polls; the engine discards its oldest events beyond event_buffer_max_size between them",
    ),
    s(
        KV_EVENT_REPLAY_PORT,
        "kv-event-replay-port",
        None,
        "Kubernetes mode: rank 0's KV-event replay port on each pod (none: gaps are counted as lost)",
    ),
    s(
        MAX_NUM_BATCHED_TOKENS,
        "max-num-batched-tokens",
        None,
        "Every engine's --max-num-batched-tokens; required when queueing is on",
    ),
    s(TOTAL_KV_BLOCKS, "total-kv-blocks", None, "Every engine's KV blocks (num_gpu_blocks), for load reporting"),
    s(
        PEER_SERVICE,
        "peer-service",
        None,
        "The Service listing the kvpick replicas (their EndpointSlices are watched); requires POD_IP",
    ),
    s(POD_IP, "pod-ip", None, "This replica's own IP (from the downward API)"),
    s(
        REPLICA_SYNC_PORT,
        "replica-sync-port",
        Some("9092"),
        "The replica-sync port: this replica listens on it, and peers found through the peer service are dialed on it (0: any free port)",
    ),
    s(
        PEERS,
        "peers",
        None,
        "Other kvpick replicas to share bookings with, as host:port of their replica-sync port, comma-separated (static mode; this replica's own address may be listed; names are looked up again every 10 s)",
    ),
    s(
        REPLICA_ID,
        "replica-id",
        None,
        "This replica's name among its peers (default: a hash of the host name and the replica-sync port)",
    ),
    s(PEER_TOKEN, "peer-token", None, "A token peers must present (authorization: Bearer); the same on every replica"),
    s(
        PEER_TOKEN_FILE,
        "peer-token-file",
        None,
        "A file holding the peer token (a mounted Secret); wins over the token itself",
    ),
    s(
        PEER_TLS_DIR,
        "peer-tls-dir",
        None,
        "Mutual TLS between replicas: a directory holding tls.crt, tls.key and ca.crt (a mounted kubernetes.io/tls Secret, as cert-manager issues it); peers must present a certificate that CA signed",
    ),
    s(
        PEER_TLS_SERVER_NAME,
        "peer-tls-server-name",
        None,
        "The name every peer's certificate is checked against (e.g. the peer service's DNS name); default: the peer's IP, which its certificate must then carry",
    ),
    s(
        PEER_TRANSPORT,
        "peer-transport",
        Some("direct"),
        "How booking changes reach the peer replicas: direct (a gRPC stream to each) or nats (NATS JetStream, KVPICK_PEER_NATS_URL)",
    ),
    s(
        PEER_NATS_URL,
        "peer-nats-url",
        None,
        "The NATS servers of the nats transport (nats://host:4222, comma-separated; tls:// for TLS; user:password@ accepted)",
    ),
    s(
        PEER_NATS_POOL,
        "peer-nats-pool",
        None,
        "The pool's name in the nats transport's subjects and stream (letters, digits, - and _); default: the InferencePool's name, or kvpick",
    ),
    s(PEER_NATS_CREDS, "peer-nats-creds", None, "A NATS credentials file (JWT and NKey seed) for the nats transport"),
    s(
        PEER_NATS_CA,
        "peer-nats-ca",
        None,
        "A CA file the NATS servers' certificates are checked against (TLS then required)",
    ),
    s(
        PEER_NATS_REPLICAS,
        "peer-nats-replicas",
        Some("1"),
        "Copies JetStream keeps of the nats transport's stream and index store (1 to 5; 3 on a NATS cluster)",
    ),
    s(
        WARM_START_TIMEOUT_MS,
        "warm-start-timeout-ms",
        Some("10000"),
        "With peers: before reporting ready, take the KV index from a ready peer replica for at most this long, then start with whatever came (0: no warm start)",
    ),
    s(
        PEER_GRACE_MS,
        "peer-grace-ms",
        Some("30000"),
        "A peer replica heard nothing from for this long has its bookings freed here",
    ),
    s(
        PEER_BATCH_DELAY_US,
        "peer-batch-delay-us",
        Some("0"),
        "How long a booking change may wait for others to share its frame to the peers (µs; fewer frames, later news)",
    ),
    s(LISTEN_ADDRESS, "listen-address", Some("0.0.0.0"), "Address the ext_proc, health and metrics ports bind to"),
    s(EXT_PROC_PORT, "ext-proc-port", Some("9002"), "The ext_proc gRPC port (0: any free port)"),
    s(HEALTH_PORT, "health-port", Some("9003"), "The gRPC health port (0: any free port)"),
    s(METRICS_PORT, "metrics-port", Some("9090"), "The Prometheus /metrics port (0: any free port)"),
    s(
        TOKENIZER_URL,
        "tokenizer-url",
        None,
        "Tokenizer service, http://host[:port][/prefix]; static mode defaults to the first worker's endpoint (vllm serve renders itself)",
    ),
    s(TOKENIZER_PROTOCOL, "tokenizer-protocol", Some("vllm-render"), "`vllm-render` or `sglang-tokenize`"),
    s(TOKENIZATION_TIMEOUT_MS, "tokenization-timeout-ms", Some("5000"), "Bound on one tokenizer round trip, in ms"),
    s(TOKENIZER_MAX_RESPONSE_BYTES, "tokenizer-max-response-bytes", Some("16777216"), "Largest tokenizer answer read"),
    s(
        TOKENIZER_FALLBACK,
        "tokenizer-fallback",
        Some("load-only"),
        "When tokenizing fails: `load-only` (route by load, counted) or `fail` (answer with the error's status)",
    ),
    s(
        TOKENIZER,
        "tokenizer",
        Some("engine"),
        "`engine` (ask the tokenizer service) or `local:PATH` (tokenize in process with the model directory's tokenizer.json and chat template; the service, when set, checks it and takes what it cannot do)",
    ),
    s(
        CHAT_TEMPLATE,
        "chat-template",
        None,
        "With `local:`, a Jinja file replacing the model's chat template (the engine's --chat-template)",
    ),
    s(
        TOKENIZER_PARITY_RATIO,
        "tokenizer-parity-ratio",
        Some("0.01"),
        "With `local:`, the fraction of requests also tokenized by the engine in the background and compared",
    ),
    s(
        TOKENIZER_PARITY_FALLBACK,
        "tokenizer-parity-fallback",
        Some("true"),
        "With `local:`, after a parity mismatch let the engine tokenize every request",
    ),
    s(
        MAX_INFLIGHT_REQUESTS,
        "max-inflight-requests",
        Some("1024"),
        "Requests between their headers and their pick at once; more get 429",
    ),
    s(MAX_REQUEST_BODY_BYTES, "max-request-body-bytes", Some("16777216"), "Larger request bodies get 413"),
    s(
        SECURE_SERVING,
        "secure-serving",
        Some("false"),
        "TLS on the ext_proc port with a self-signed certificate made at start",
    ),
    s(
        CONFORMANCE_HOOKS,
        "conformance-hooks",
        Some("false"),
        "GAIE conformance hooks: test-epp-endpoint-selection and the served-endpoint echo",
    ),
    s(
        COST,
        "cost",
        Some("latency"),
        "How workers are costed: `latency` (the request's predicted time to first token there, from the engine step costs below) or `dynamo` (Dynamo's KvRouterConfig formula in blocks, with --prefill-load-scale)",
    ),
    s(
        STEP_OVERHEAD_US,
        "step-overhead-us",
        Some("5000"),
        "Latency cost: fixed cost of one engine scheduler step, in µs (only the ratios of the three step costs change a pick)",
    ),
    s(
        PREFILL_US_PER_TOKEN,
        "prefill-us-per-token",
        Some("50"),
        "Latency cost: cost of one uncached prompt token in a step, in µs",
    ),
    s(
        DECODE_US_PER_SEQ,
        "decode-us-per-seq",
        Some("250"),
        "Latency cost: cost of one decoding sequence in a step, in µs",
    ),
    s(
        COPY_WEIGHT,
        "copy-weight",
        Some("2"),
        "Latency cost: recomputations charged for copying a prompt prefix that another worker holds onto a worker whose cache is evicting, times how hard it evicts (0: never charged)",
    ),
    s(
        TPOT_TARGET_MS,
        "tpot-target-ms",
        None,
        "Latency cost: a worker where the request's decode step is predicted slower than this many ms (a step's overhead plus one decode per sequence running there, at the worker's learned speed) is chosen only when every worker is; unset: no TPOT guard",
    ),
    s(
        SESSIONS,
        "sessions",
        Some("100000"),
        "Session affinity: client sessions (x-session-token header, else a body `session_id`) whose last worker is remembered (0: no affinity)",
    ),
    s(
        SESSION_MARGIN,
        "session-margin",
        Some("0.25"),
        "Session affinity: a session stays on its last worker while that costs at most this fraction more than the cheapest",
    ),
    s(
        CALIBRATE,
        "calibrate",
        Some("true"),
        "Latency cost: learn each worker's speed relative to the fleet from the TTFTs of streamed responses (a worker found much slower than its peers gets less work)",
    ),
    s(
        CALIBRATION_STALE_SECS,
        "calibration-stale-secs",
        Some("600"),
        "Latency cost: a worker's learned speed is forgotten after this many seconds without a streamed response",
    ),
    s(
        PREFILL_LOAD_SCALE,
        "prefill-load-scale",
        Some("1.0"),
        "Dynamo cost: weight of prefill blocks against decode blocks",
    ),
    s(
        OVERLAP_SCORE_WEIGHT,
        "overlap-score-weight",
        None,
        "Older name of --prefill-load-scale (used when that is unset)",
    ),
    s(
        TEMPERATURE,
        "temperature",
        Some("0"),
        "0 picks the cheapest worker; above 0 samples a softmax over normalised costs",
    ),
    s(
        QUEUE_THRESHOLD,
        "queue-threshold",
        None,
        "Queue while every worker has more than this × max_num_batched_tokens in prefill (unset: never queue)",
    ),
    s(
        QUEUE_CAPACITY,
        "queue-capacity",
        Some("1024"),
        "Requests that may wait at once; more get 429 with Retry-After (0: no waiting, shed at once when every worker is past --queue-threshold)",
    ),
    s(QUEUE_TIMEOUT_MS, "queue-timeout-ms", Some("30000"), "How long a request may wait in the queue, in ms; then 429"),
    s(
        LEASE_SECS,
        "lease-secs",
        Some("300"),
        "A reservation frees itself this long after admission (a lost free cannot leak load)",
    ),
    s(ROUTER_SEED, "router-seed", None, "Seed of the tie-break and sampling generator (default: fixed)"),
    s(
        FALLBACK_ENDPOINTS,
        "fallback-endpoints",
        Some("0"),
        "Also send the next N cheapest endpoints, ranked, as `ip:port,ip:port,…` in the envoy.lb metadata, for gateways that try them in order (Envoy-based ones); the header keeps the pick alone unless --fallbacks-in-header",
    ),
    s(
        FALLBACKS_IN_HEADER,
        "fallbacks-in-header",
        Some("false"),
        "Put the fallback list in the x-gateway-destination-endpoint header too (agentgateway answers 503 to a list there: keep false for it)",
    ),
    s(
        INDEX_MAX_BYTES,
        "index-max-bytes",
        None,
        "Memory budget of the KV index, in bytes or with a suffix (`512Mi`, `2Gi`, `1G`); past it the blocks stored longest ago are evicted, leaves first, and stop matching, as do blocks the engine later stores after them. Each worker's fixed cost (12 KiB) comes out of it first: a budget under its shard's workers' cost keeps one entry per shard. With disaggregation the prefill workers' index has a budget of its own (default: a quarter of the memory kvpick may use: its cgroup's limit, else the machine's)",
    ),
    s(
        SHARDS,
        "shards",
        None,
        "Shards (default: 1 when inline, the default; with `threads` or `glommio` all cores but the I/O threads', at least 1)",
    ),
    s(
        SHARD_CPUS,
        "shard-cpus",
        None,
        "CPUs to pin the shards to, e.g. `1,2,3` (default: the highest-numbered cores; `none`: no pinning)",
    ),
    s(
        RUNTIME,
        "runtime",
        Some("auto"),
        "Shard executor: `auto` (the faster in kvpick's benchmarks: `inline` today), `inline` (no shard threads: the thread that picks or ingests runs the shard, one at a time), `threads` (pinned shard threads) or `glommio` (io_uring executors with prioritised task queues)",
    ),
    s(
        IO_THREADS,
        "io-threads",
        Some("1"),
        "Threads of the I/O runtime (ext_proc, health, metrics, tokenizer, watchers)",
    ),
    s(
        SHUTDOWN_GRACE_MS,
        "shutdown-grace-ms",
        Some("10000"),
        "On SIGTERM, how long open streams may finish before the rest are freed, in ms",
    ),
    s(LOG_FORMAT, "log-format", Some("text"), "`text` or `json`"),
    s(
        LOG_LEVEL,
        "log",
        Some("info"),
        "Log filter, e.g. `info` or `kvpick_app=debug,info` (per-request lines are at debug)",
    ),
    s(PROFILE, "profile", None, "Write a CPU flame graph (SVG) of the whole run to this file at exit"),
    s(
        TRANSPARENT_HUGE_PAGES,
        "transparent-huge-pages",
        Some("never"),
        "`never`: opt the process out of transparent huge pages (PR_SET_THP_DISABLE), so resident memory is what kvpick uses: mimalloc asks for huge pages for its arenas, and khugepaged later fills whole 2 MiB pages around a few live objects (a one-time step of about 20 MiB in a long run); `allowed`: leave it to the allocator and the system's setting",
    ),
    s(
        DEBUG_ENDPOINTS,
        "debug-endpoints",
        Some("false"),
        "Serve the debug view on the metrics port: GET /debug/workers and POST /debug/explain (a request body: every candidate's overlap, load and cost, and the pick; nothing booked); `kvpick inspect` reads them",
    ),
    s(
        OTLP_ENDPOINT,
        "otlp-endpoint",
        None,
        "Export a span per request (parse, tokenize, hash, select per shard, queue wait, booking) over OTLP/gRPC to this collector, e.g. http://otel-collector:4317, continuing the gateway's W3C trace context (unset: no tracing, no cost)",
    ),
    s(
        TRACE_SAMPLE_RATIO,
        "trace-sample-ratio",
        Some("1"),
        "Share of requests traced, 0 to 1, when the gateway sent no trace context; with one, its sampling decision is followed",
    ),
    s(SERVICE_NAME, "otel-service-name", Some("kvpick"), "The service name on exported spans"),
];

/// The flag's id in clap is the variable's name.
pub fn command(name: &'static str, about: &'static str) -> Command {
    let mut command = Command::new(name).about(about);
    for setting in SETTINGS {
        let mut help = setting.help.to_owned();
        if let Some(default) = setting.default {
            help.push_str(&format!(" [default: {default}]"));
        }
        command = command.arg(
            Arg::new(setting.var)
                .long(setting.flag)
                .env(setting.var)
                .value_name("VALUE")
                .help(help)
                .action(ArgAction::Set),
        );
    }
    command
}

/// Where a value came from, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
}

/// The values set, by variable name.
#[derive(Clone, Debug, Default)]
pub struct Values {
    values: HashMap<&'static str, (String, Source)>,
}

/// A setting with a value kvpick cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?} is not valid: {allowed}")]
pub struct SettingError {
    /// `DYN_X` when it came from the environment, `--flag` from the
    /// command line (or the variable when nothing set it).
    pub name: String,
    pub value: String,
    pub allowed: String,
}

impl Values {
    pub fn from_matches(matches: &ArgMatches) -> Self {
        let mut values = HashMap::new();
        for setting in SETTINGS {
            let Some(value) = matches.get_one::<String>(setting.var) else { continue };
            let source = match matches.value_source(setting.var) {
                Some(ValueSource::CommandLine) => Source::Flag,
                _ => Source::Env,
            };
            // An empty variable counts as unset (manifests often template
            // `value: ""`).
            if !value.trim().is_empty() {
                values.insert(setting.var, (value.trim().to_owned(), source));
            }
        }
        Values { values }
    }

    /// Parses `args` (the first is the program name) with the environment
    /// as fallback.
    pub fn parse_from<I, T>(command: Command, args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        command.try_get_matches_from(args).map(|m| Values::from_matches(&m))
    }

    /// `kvpick serve` on 127.0.0.1 with OS-picked ports over a static
    /// workers file: how the demo and the in-process tests run it; more
    /// settings can be `set` on top.
    pub fn loopback_static(workers_file: &std::path::Path) -> Self {
        let mut values = Values::from_pairs([
            (DISCOVERY, "static"),
            (LISTEN_ADDRESS, "127.0.0.1"),
            (EXT_PROC_PORT, "0"),
            (HEALTH_PORT, "0"),
            (METRICS_PORT, "0"),
        ]);
        values.set(WORKERS_FILE, workers_file.display().to_string());
        values
    }

    /// For tests and the demo: values as if set in the environment.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'static str, &'a str)>) -> Self {
        let values = pairs.into_iter().map(|(k, v)| (k, (v.to_owned(), Source::Env))).collect();
        Values { values }
    }

    pub fn set(&mut self, var: &'static str, value: impl Into<String>) {
        self.values.insert(var, (value.into(), Source::Flag));
    }

    pub fn get(&self, var: &str) -> Option<&str> {
        self.values.get(var).map(|(v, _)| v.as_str())
    }

    /// How a setting is named in an error: its flag if the command line set
    /// it, else its variable.
    pub fn name_of(&self, var: &str) -> String {
        match self.values.get(var) {
            Some((_, Source::Flag)) => {
                let flag = SETTINGS.iter().find(|s| s.var == var).map_or(var, |s| s.flag);
                format!("--{flag}")
            }
            _ => var.to_owned(),
        }
    }

    pub fn error(&self, var: &str, allowed: impl Into<String>) -> SettingError {
        SettingError {
            name: self.name_of(var),
            value: self.get(var).unwrap_or_default().to_owned(),
            allowed: allowed.into(),
        }
    }

    /// A value parsed by `parse`, or `None` when unset; `allowed` says what
    /// would have been accepted.
    pub fn parse<T>(
        &self,
        var: &str,
        allowed: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, SettingError> {
        match self.get(var) {
            None => Ok(None),
            Some(text) => parse(text).map(Some).ok_or_else(|| self.error(var, allowed)),
        }
    }

    pub fn whole<T>(&self, var: &str, min: T) -> Result<Option<T>, SettingError>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display,
    {
        let allowed = format!("expected a whole number of at least {min}");
        self.parse(var, &allowed, |t| t.replace('_', "").parse::<T>().ok().filter(|n| *n >= min))
    }

    /// A whole number from `min` to `max`: for counts that size something
    /// at start (threads, shards), where a huge value would be an
    /// allocation that cannot succeed.
    pub fn whole_in<T>(&self, var: &str, min: T, max: T) -> Result<Option<T>, SettingError>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display,
    {
        let allowed = format!("expected a whole number from {min} to {max}");
        self.parse(var, &allowed, |t| t.replace('_', "").parse::<T>().ok().filter(|n| *n >= min && *n <= max))
    }

    /// A byte count of at least `min`: digits, optionally followed by a
    /// decimal (`k`, `M`, `G`, `T`) or binary (`Ki`, `Mi`, `Gi`, `Ti`)
    /// suffix, as Kubernetes writes quantities.
    pub fn bytes(&self, var: &str, min: u64) -> Result<Option<u64>, SettingError> {
        let allowed = format!("expected bytes of at least {min}, e.g. 536870912, 512Mi or 2G");
        self.parse(var, &allowed, |t| parse_bytes(t).filter(|n| *n >= min))
    }

    pub fn number(&self, var: &str, min: f64) -> Result<Option<f64>, SettingError> {
        let allowed = format!("expected a number of at least {min}");
        self.parse(var, &allowed, |t| t.parse::<f64>().ok().filter(|n| n.is_finite() && *n >= min))
    }

    /// A number from 0 to 1 (a ratio).
    pub fn fraction(&self, var: &str) -> Result<Option<f64>, SettingError> {
        self.parse(var, "expected a number from 0 to 1", |t| t.parse::<f64>().ok().filter(|r| (0.0..=1.0).contains(r)))
    }

    pub fn boolean(&self, var: &str) -> Result<Option<bool>, SettingError> {
        self.parse(var, "expected true or false", |t| match t.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Some(true),
            "0" | "false" | "no" | "off" => Some(false),
            _ => None,
        })
    }

    pub fn one_of<'a>(&self, var: &str, choices: &[&'a str]) -> Result<Option<&'a str>, SettingError> {
        let allowed = format!("expected one of {}", choices.join(", "));
        self.parse(var, &allowed, |t| choices.iter().copied().find(|c| c.eq_ignore_ascii_case(t)))
    }
}

/// `512Mi` → 536870912; `None` for anything else, or an overflow.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim().replace('_', "");
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let unit: u64 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_and_errors_name_their_source() {
        let values = Values::parse_from(command("kvpick", ""), ["kvpick", "--block-size", "0"])
            .unwrap_or_else(|e| panic!("{e}"));
        let error = values.whole::<u32>(BLOCK_SIZE, 1).err().map(|e| e.to_string());
        assert_eq!(error.as_deref(), Some("--block-size=\"0\" is not valid: expected a whole number of at least 1"));

        let values = Values::from_pairs([(BLOCK_SIZE, "sixteen")]);
        let error = values.whole::<u32>(BLOCK_SIZE, 1).err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("DYN_KV_CACHE_BLOCK_SIZE=\"sixteen\" is not valid: expected a whole number of at least 1")
        );
        assert_eq!(values.one_of(RUNTIME, &["auto", "threads"]), Ok(None));
    }

    #[test]
    fn every_setting_has_a_unique_flag_and_variable() {
        let mut vars: Vec<_> = SETTINGS.iter().map(|s| s.var).collect();
        let mut flags: Vec<_> = SETTINGS.iter().map(|s| s.flag).collect();
        vars.sort_unstable();
        flags.sort_unstable();
        let (nv, nf) = (vars.len(), flags.len());
        vars.dedup();
        flags.dedup();
        assert_eq!((vars.len(), flags.len()), (nv, nf));
        // clap itself checks the command is well formed.
        command("kvpick", "").debug_assert();
    }

    #[test]
    fn byte_counts_take_kubernetes_suffixes() {
        assert_eq!(parse_bytes("536870912"), Some(536_870_912));
        assert_eq!(parse_bytes("512Mi"), Some(512 << 20));
        assert_eq!(parse_bytes("2Gi"), Some(2 << 30));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("64k"), Some(64_000));
        assert_eq!(parse_bytes("1_000"), Some(1_000));
        for bad in ["", "Mi", "-1", "1.5Gi", "2GB", "1 Gi", "99999999999999999999", "20000000Ti"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
        // The budget's help names the workers' fixed cost the index uses.
        let help = SETTINGS.iter().find(|s| s.var == INDEX_MAX_BYTES).map(|s| s.help).unwrap_or_default();
        let kib = kvpick_core::index::WORKER_BYTES >> 10;
        assert!(help.contains(&format!("fixed cost ({kib} KiB)")), "{help}");
        let values = Values::from_pairs([(INDEX_MAX_BYTES, "1Ki")]);
        let error = values.bytes(INDEX_MAX_BYTES, 1 << 20).err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some(
                "KVPICK_INDEX_MAX_BYTES=\"1Ki\" is not valid: expected bytes of at least 1048576, e.g. 536870912, 512Mi or 2G"
            )
        );
    }
}
