//! `kvpick serve` as a library: every part wired together, started in
//! order and stopped in reverse, so the binary, the demo and the tests run
//! the same thing.
//!
//! Start: shards (thread-per-core runtime) → KV-event ingest → tokenizer
//! client → health (NOT_SERVING) → ext_proc server → metrics → discovery
//! and the task applying its updates (workers into the shards and the
//! ingest; readiness SERVING once a worker is schedulable) → the tick that
//! expires queue deadlines. Stop: readiness NOT_SERVING, discovery stops,
//! the ext_proc port stops accepting and open streams get a grace period
//! (then are cut, which frees their bookings), then metrics, health, the
//! ingest and the shards.
//!
//! [`App::start`] runs on the caller's tokio runtime (the I/O runtime); the
//! shards and the ingest run on threads of their own.

pub mod config;
pub mod huge_pages;
mod index_budget;
pub mod otlp;
pub mod peers;
pub mod replicas;
pub mod settings;
pub mod warm_start;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvpick_core::Lifecycle;
use kvpick_core::shard::ShardStats;
use kvpick_runtime::{Clock, RuntimeError, ShardedService, ThreadProducers};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use config::{ConfigError, DiscoveryMode, HugePages, LogFormat, ReplicaSettings, ServeConfig};

use self::otlp::TraceExport;
use self::replicas::Replicas;
use self::warm_start::AppIndex;
use crate::metrics::MetricsServer;
use crate::metrics::collect::{Sources, WorkerNames};
use kvpick_discovery::workers_file::{Defaults, WorkersFile};
use kvpick_discovery::{Discovery, EngineKind, Role, WorkerUpdate};
use kvpick_ext_proc::{ExtProcMetrics, ExtProcServer};
use kvpick_grpc::{Health, Readiness, ServeError, ServerHandle};
use kvpick_kv_events::{IngestError, KvEventIngest, RoleSink, ShardSink};
use kvpick_router::tokenizer::{TokenizerConfig, TokenizerMetrics, TokenizerProtocol};
use kvpick_router::{DecodeOnly, KvPicker, Picker};

/// Why kvpick could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("shard runtime: {0}")]
    Runtime(#[from] RuntimeError),
    #[error("KV-event ingest: {0}")]
    Ingest(#[from] IngestError),
    #[error("workers file {0}")]
    WorkersFile(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{what} port: {source}")]
    Listen { what: &'static str, source: std::io::Error },
    #[error("ext_proc server: {0}")]
    Serve(#[from] ServeError),
    #[error("Kubernetes: {0}")]
    Kubernetes(String),
    #[error("tracing: {0}")]
    Tracing(String),
    #[error("replica sync: {0}")]
    Replicas(String),
}

/// A running kvpick.
pub struct App {
    service: Arc<ShardedService>,
    /// The prefill workers' selector (disaggregation on).
    prefill: Option<Arc<ShardedService>>,
    ingest: Arc<KvEventIngest>,
    ext_proc: ServerHandle,
    health_server: ServerHandle,
    health: Health,
    metrics: MetricsServer,
    discovery: Option<Discovery>,
    tasks: Vec<JoinHandle<()>>,
    workers: WorkerNames,
    ext_proc_metrics: Arc<ExtProcMetrics>,
    grace: Duration,
    traces: Option<TraceExport>,
    replicas: Option<Replicas>,
}

impl App {
    pub async fn start(config: ServeConfig) -> Result<App, StartError> {
        let clock = Clock::system();
        let service = Arc::new(ShardedService::start(
            config.router.clone(),
            config.block_size,
            config.runtime.clone(),
            clock.clone(),
        )?);
        let producers = ThreadProducers::new(service.clone());
        // Disaggregation: the prefill workers' own selector, and events
        // routed to whichever of the two has their worker.
        let prefill = match &config.disagg {
            Some(disagg) => {
                let prefill = ShardedService::start(
                    disagg.router.clone(),
                    config.block_size,
                    disagg.runtime.clone(),
                    clock.clone(),
                )?;
                tracing::info!(
                    shards = prefill.shard_count(),
                    threshold_tokens = disagg.decider.threshold_tokens,
                    "disaggregation: prefill workers get a selector of their own"
                );
                Some(Arc::new(prefill))
            }
            None => None,
        };
        let ingest = Arc::new(match &prefill {
            Some(prefill) => {
                KvEventIngest::spawn(config.kv_events.clone(), RoleSink::new(service.clone(), prefill.clone()))?
            }
            None => KvEventIngest::spawn(config.kv_events.clone(), ShardSink::new(service.clone()))?,
        });
        let prefill_producers = prefill.clone().map(ThreadProducers::new);
        let health = Health::start().await;
        // Warm start: the streams discovery opens from here on wait for a
        // peer's index, and readiness with them (bounded by the deadline).
        let warm_deadline = config.replicas.as_ref().and_then(|r| r.warm_start).map(|t| Instant::now() + t);
        if let Some(deadline) = warm_deadline {
            ingest.hold_for_seeds(deadline)?;
            health.readiness().set_warming(true);
        }
        let workers = WorkerNames::default();
        let decode_only = Arc::new(DecodeOnly::default());
        let mut applier = Applier {
            decode_only: decode_only.clone(),
            producers: producers.clone(),
            prefill: prefill_producers.clone(),
            prefill_batched_tokens: config.disagg.as_ref().map_or(0, |d| d.batched_tokens),
            clock: clock.clone(),
            ingest: ingest.clone(),
            workers: workers.clone(),
            readiness: health.readiness(),
            picker: None,
        };

        // Discovery's first answer is needed before the tokenizer in static
        // mode (its default URL is the first worker).
        let mut tasks = Vec::new();
        let mut discovery = None;
        let discovery_metrics;
        let mut pool = "static".to_owned();
        let mut discovered_peers = None;
        let mut first_worker = None;
        let updates_rx = match &config.discovery {
            DiscoveryMode::Static { file, poll } => {
                let defaults = Defaults {
                    block_size: config.block_size,
                    model: config.model.clone(),
                    max_num_batched_tokens: config.max_num_batched_tokens,
                    total_kv_blocks: config.total_kv_blocks,
                };
                let (watcher, initial) = WorkersFile::open(file, defaults).map_err(StartError::WorkersFile)?;
                discovery_metrics = watcher.metrics();
                first_worker = watcher.workers().next().map(|w| (w.spec.endpoint, w.engine));
                tracing::info!(file = %file.display(), workers = initial.len(), poll_ms = poll.as_millis() as u64, "discovery: static workers file");
                // Applied before the ports open: the first request and the
                // first probe already see the file's workers.
                for update in initial {
                    applier.apply(update).await;
                }
                applier.report_readiness();
                let (updates_tx, updates_rx) = mpsc::channel::<WorkerUpdate>(1024);
                tasks.push(tokio::spawn(watcher.watch(*poll, updates_tx)));
                updates_rx
            }
            DiscoveryMode::Kubernetes(cfg) => {
                pool.clone_from(&cfg.pool_name);
                let client = kube::Client::try_default().await.map_err(|e| StartError::Kubernetes(e.to_string()))?;
                tracing::info!(namespace = %cfg.namespace, pool = %cfg.pool_name, "discovery: Kubernetes InferencePool");
                let mut running =
                    Discovery::spawn(client, (**cfg).clone()).map_err(|e| StartError::Kubernetes(e.to_string()))?;
                // The applier reads discovery's own channel; the handle
                // keeps the watch task.
                let updates_rx = std::mem::replace(&mut running.updates, mpsc::channel(1).1);
                discovered_peers = Some(running.peers.clone());
                discovery_metrics = Arc::clone(&running.metrics);
                discovery = Some(running);
                updates_rx
            }
        };

        let tokenizer_metrics = Arc::new(TokenizerMetrics::new());
        let tokenizer_config = tokenizer_for(&config, first_worker)?;
        // Reading a local model's files is blocking work: off the runtime.
        let built = {
            let (config, metrics) = (tokenizer_config.clone(), tokenizer_metrics.clone());
            tokio::task::spawn_blocking(move || config.build(metrics))
                .await
                .map_err(|e| StartError::Tokenizer(format!("loading the tokenizer failed: {e}")))?
        };
        let tokenizer = built.map_err(|e| {
            let setting = config::tokenizer_setting(e.field);
            StartError::Tokenizer(format!("{setting}={:?} is invalid: {}", e.value, e.allowed))
        })?;
        match &tokenizer_config.local {
            None => {
                tracing::info!(protocol = tokenizer_config.protocol.as_str(), url = %tokenizer_config.base_url, "tokenizer")
            }
            Some(local) if tokenizer_config.has_engine() => tracing::info!(
                dir = %local.dir.display(),
                parity_ratio = tokenizer_config.parity.ratio,
                parity_fallback = tokenizer_config.parity.fallback_on_mismatch,
                engine = %tokenizer_config.base_url,
                "tokenizer: local, checked against the engine's"
            ),
            Some(local) => tracing::warn!(
                dir = %local.dir.display(),
                "tokenizer: local with no engine tokenizer to check it against (set DYN_EPP_TOKENIZER_SERVICE_URL): a wrong tokenizer or template would go unnoticed"
            ),
        }

        let health_listener = bind("health", config.health_listen).await?;
        let health_server = health.spawn_on(health_listener)?;

        let ext_proc_metrics = Arc::new(ExtProcMetrics::new());
        let picker = match (&prefill, &config.disagg) {
            (Some(prefill), Some(disagg)) => KvPicker::disaggregated(
                (service.clone(), prefill.clone()),
                clock.clone(),
                tokenizer,
                (&config.picker, disagg.decider.clone(), decode_only),
                ext_proc_metrics.clone(),
            ),
            _ => KvPicker::new(service.clone(), clock.clone(), tokenizer, &config.picker, ext_proc_metrics.clone()),
        };
        let mut server =
            ExtProcServer::new(config.ext_proc.clone(), Picker::Kv(picker.clone()), ext_proc_metrics.clone())
                .with_health(&health);
        let traces = match &config.tracing {
            Some(tracing_config) => {
                let (export, tracing) = TraceExport::start(tracing_config).map_err(StartError::Tracing)?;
                server = server.with_tracing(tracing);
                tracing::info!(endpoint = %tracing_config.endpoint, sample_ratio = tracing_config.sample_ratio, "tracing: spans exported over OTLP");
                Some(export)
            }
            None => None,
        };
        // Before the ext_proc port opens: peers' bookings are applied from
        // here on, and ours are published from the first pick.
        let replicas = match &config.replicas {
            Some(settings) => {
                let selectors = std::iter::once(producers.clone()).chain(prefill_producers.clone()).collect();
                let index = Arc::new(AppIndex {
                    ingest: ingest.clone(),
                    workers: workers.clone(),
                    readiness: health.readiness(),
                });
                let replicas = Replicas::start(settings, selectors, clock.clone(), discovered_peers, index).await?;
                if let Some(deadline) = warm_deadline {
                    let sources = replicas.warm_sources();
                    tasks.push(tokio::spawn(warm_start::run(ingest.clone(), health.readiness(), sources, deadline)));
                }
                Some(replicas)
            }
            None => None,
        };

        let ext_proc_listener = bind("ext_proc", config.ext_proc.listen).await?;
        let ext_proc = server.spawn_on(ext_proc_listener)?;

        let sources = Sources {
            pool,
            ext_proc: ext_proc_metrics.clone(),
            tokenizer: Some(tokenizer_metrics),
            ingest: Some(ingest.metrics().clone()),
            service: Some(producers.clone()),
            prefill: prefill_producers.clone(),
            workers: workers.clone(),
            debug: config.debug_endpoints.then(|| picker.clone()),
            discovery: Some(discovery_metrics),
            replicas: replicas.as_ref().map(|r| (r.stats().clone(), r.transport.clone())),
        };
        let metrics_listener = bind("metrics", config.metrics_listen).await?;
        let metrics = MetricsServer::spawn(metrics_listener, sources)
            .map_err(|source| StartError::Listen { what: "metrics", source })?;
        tracing::info!(
            ext_proc = %ext_proc.local_addr(),
            health = %health_server.local_addr(),
            metrics = %metrics.local_addr(),
            tls = ext_proc.certificate_pem().is_some(),
            "listening"
        );

        // Departures from now on also leave the picker's per-worker state.
        applier.picker = Some(picker.clone());
        tasks.push(tokio::spawn(applier.run(updates_rx)));
        // Threaded shards expire leases on their own timers, inline ones
        // whenever they run and at this tick; queue deadlines and the
        // admissions they unblock need the tick too, and readiness the
        // count of workers whose events carry another block size.
        let tickers: Vec<ThreadProducers> = std::iter::once(producers.clone()).chain(prefill_producers).collect();
        let decode = producers.clone();
        let readiness = health.readiness();
        let index_max_bytes = config.router.index_max_bytes;
        tasks.push(tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(250));
            let mut evictions = index_budget::EvictionLog::default();
            for round in 0u64.. {
                every.tick().await;
                for ticker in &tickers {
                    ticker.service().tick(ticker, clock.now()).await;
                }
                // Every 10 s: the stats visit every shard of both selectors.
                if round % 40 == 0 {
                    let mut stats = ShardStats::default();
                    for ticker in &tickers {
                        stats = stats.merge(ticker.service().shard_stats(ticker).await);
                    }
                    evictions.observe(&stats, index_max_bytes, tickers.len() as u64, std::time::Instant::now());
                }
                // Readiness weighs it against the schedulable workers of
                // whole or decode requests, so it counts those alone.
                let loads = decode.service().loads(&decode).await;
                let unusable = loads.iter().filter(|l| l.schedulable && l.block_size_mismatch.is_some()).count();
                readiness.set_unusable_workers(unusable);
            }
        }));

        Ok(App {
            service,
            prefill,
            ingest,
            ext_proc,
            health_server,
            health,
            metrics,
            discovery,
            tasks,
            workers,
            ext_proc_metrics,
            grace: config.shutdown_grace,
            traces,
            replicas,
        })
    }

    pub fn ext_proc_addr(&self) -> SocketAddr {
        self.ext_proc.local_addr()
    }

    pub fn health_addr(&self) -> SocketAddr {
        self.health_server.local_addr()
    }

    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics.local_addr()
    }

    /// The ext_proc port's certificate (PEM) when TLS is on.
    pub fn certificate_pem(&self) -> Option<&str> {
        self.ext_proc.certificate_pem()
    }

    pub fn service(&self) -> &Arc<ShardedService> {
        &self.service
    }

    pub fn workers(&self) -> &WorkerNames {
        &self.workers
    }

    pub fn ext_proc_metrics(&self) -> &Arc<ExtProcMetrics> {
        &self.ext_proc_metrics
    }

    pub fn ingest(&self) -> &KvEventIngest {
        &self.ingest
    }

    /// The replica-sync port, when replicas share bookings.
    pub fn replica_sync_addr(&self) -> Option<SocketAddr> {
        self.replicas.as_ref().map(Replicas::local_addr)
    }

    /// The replica sync, when on.
    pub fn replicas(&self) -> Option<&Replicas> {
        self.replicas.as_ref()
    }

    /// Exports every span ended so far (when tracing is on).
    pub async fn flush_traces(&self) {
        if let Some(traces) = &self.traces {
            traces.flush().await;
        }
    }

    /// Stops in reverse order of start; see the module docs.
    pub async fn shutdown(mut self) {
        tracing::info!(grace_ms = self.grace.as_millis() as u64, "shutting down: draining open streams");
        self.health.readiness().set_schedulable_workers(0);
        if let Some(discovery) = self.discovery.take() {
            discovery.shutdown().await;
        }
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
        let open = self.ext_proc_metrics.snapshot().streams_open;
        if let Err(error) = self.ext_proc.shutdown_within(self.grace).await {
            tracing::warn!(%error, "ext_proc server ended with an error");
        }
        // Cut streams free their bookings from detached tasks: let them run.
        let (service, prefill) = (&self.service, &self.prefill);
        let booked = || service.active_reservations() + prefill.as_ref().map_or(0, |p| p.active_reservations());
        for _ in 0..50 {
            if booked() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = booked();
        tracing::info!(streams_open_at_stop = open, bookings_left = left, "ext_proc server stopped");
        // After the cut streams freed their bookings: those frees, and
        // everything before them, reach the peers before the links close.
        if let Some(replicas) = self.replicas.take() {
            replicas.shutdown().await;
        }
        self.metrics.shutdown().await;
        if let Err(error) = self.health_server.shutdown().await {
            tracing::warn!(%error, "health server ended with an error");
        }
        match Arc::try_unwrap(self.ingest) {
            Ok(ingest) => {
                if let Err(error) = ingest.shutdown() {
                    tracing::warn!(%error, "KV-event ingest ended with an error");
                }
            }
            Err(_) => tracing::warn!("KV-event ingest still shared at shutdown; its thread stops with the process"),
        }
        // The spans of the streams just ended, before the process goes.
        if let Some(traces) = self.traces.take() {
            traces.shutdown().await;
        }
        // Whatever is still booked goes with the shards.
        self.service.shutdown();
        if let Some(prefill) = &self.prefill {
            prefill.shutdown();
        }
        tracing::info!("stopped");
    }
}

pub(crate) async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr).await.map_err(|source| StartError::Listen { what, source })
}

/// Applies discovery's updates, in order, to the shards and the ingest,
/// and reports readiness.
struct Applier {
    producers: ThreadProducers,
    /// The prefill selector's, when disaggregation is on: workers of the
    /// prefill role go there; without it every worker serves whole
    /// requests.
    prefill: Option<ThreadProducers>,
    /// A prefill worker's step size when its spec has none (the prefill
    /// side's saturation test needs one).
    prefill_batched_tokens: u64,
    /// Decode workers whose every request must be split (SGLang's decode
    /// mode), for the picker; empty without disaggregation.
    decode_only: Arc<DecodeOnly>,
    clock: Clock,
    ingest: Arc<KvEventIngest>,
    workers: WorkerNames,
    readiness: Readiness,
    /// Set once the picker exists (after the static file's first workers,
    /// which only add).
    picker: Option<KvPicker>,
}

impl Applier {
    async fn run(self, mut updates: mpsc::Receiver<WorkerUpdate>) {
        while let Some(update) = updates.recv().await {
            self.apply(update).await;
            self.report_readiness();
        }
    }

    /// Ready once a worker can take whole or decode requests: prefill
    /// workers alone serve none.
    fn report_readiness(&self) {
        self.readiness.set_schedulable_workers(self.producers.service().schedulable_count());
    }

    /// The selector that has worker `id` now.
    fn selector_of(&self, id: kvpick_core::WorkerId) -> &ThreadProducers {
        match &self.prefill {
            Some(prefill) if prefill.service().owns(id) => prefill,
            _ => &self.producers,
        }
    }

    async fn apply(&self, update: WorkerUpdate) {
        match update {
            WorkerUpdate::Upsert(worker) => {
                let (id, endpoint) = (worker.id(), worker.spec.endpoint);
                let mut spec = worker.spec.clone();
                let producers = match &self.prefill {
                    Some(prefill) if !worker.role.decodes() => {
                        spec.max_num_batched_tokens.get_or_insert(self.prefill_batched_tokens);
                        prefill
                    }
                    _ => &self.producers,
                };
                let schedulable = spec.lifecycle == Lifecycle::Schedulable;
                let known = self.workers.get(id).is_some();
                let decodes_only = self.prefill.is_some() && worker.decodes_only();
                // Before the worker can be picked.
                self.decode_only.set(id, decodes_only.then_some(endpoint));
                match producers.service().upsert_worker(producers, spec, self.clock.now()).await {
                    // Its pod left or regained Ready: index, bookings and
                    // the event subscription are kept.
                    Ok(()) if known => {
                        let now =
                            if schedulable { "schedulable again" } else { "unschedulable until its pod is Ready" };
                        tracing::info!(%endpoint, "worker {now}");
                    }
                    Ok(()) => {
                        if let Err(error) = self.ingest.add(worker.publisher.clone()) {
                            tracing::error!(%endpoint, %error, "worker added without its KV events");
                        }
                        self.workers.insert(id, endpoint);
                        let role = if self.prefill.is_some() { worker.role } else { Role::Both };
                        tracing::info!(%endpoint, engine = %worker.engine, %role, decodes_only, events = %worker.publisher.endpoint, replay = ?worker.publisher.replay_endpoint, "worker added");
                    }
                    Err(error) => tracing::error!(%endpoint, %error, "worker not added"),
                }
            }
            WorkerUpdate::Delete(id) => {
                let endpoint = self.workers.get(id);
                self.workers.remove(id);
                self.decode_only.set(id, None);
                if let Some(picker) = &self.picker {
                    picker.forget_worker(id);
                }
                if let Err(error) = self.ingest.remove(id) {
                    tracing::warn!(worker = id.0, %error, "could not unsubscribe a removed worker's KV events");
                }
                let producers = self.selector_of(id);
                match producers.service().delete_worker(producers, id).await {
                    Ok(freed) => tracing::info!(endpoint = ?endpoint, bookings_dropped = freed.len(), "worker removed"),
                    Err(error) => tracing::warn!(endpoint = ?endpoint, %error, "worker removal"),
                }
            }
        }
    }
}

/// The tokenizer settings once the workers are known: static mode with no
/// tokenizer URL asks the first worker, in its engine's protocol (vLLM's
/// render, SGLang's `/tokenize`); TensorRT-LLM has none, so it needs
/// `--tokenizer local:PATH`, and a local tokenizer is then not checked.
fn tokenizer_for(
    config: &ServeConfig,
    first_worker: Option<(SocketAddr, EngineKind)>,
) -> Result<TokenizerConfig, StartError> {
    let protocol = |engine: EngineKind| match engine {
        EngineKind::Sglang => TokenizerProtocol::SglangTokenize,
        _ => TokenizerProtocol::VllmRender,
    };
    Ok(match (&config.tokenizer, first_worker) {
        (Some(t), Some((_, engine))) if !t.has_engine() && engine.is_tensorrt_llm() => {
            tracing::info!(
                "tokenizer: local; the first worker is TensorRT-LLM, which has no tokenizer endpoint to check it against"
            );
            t.clone()
        }
        (Some(t), Some((endpoint, engine))) if !t.has_engine() => {
            // Local tokenizing, checked against the first worker's own.
            let mut t = t.clone();
            t.base_url = format!("http://{endpoint}");
            t.protocol = protocol(engine);
            tracing::info!(url = %t.base_url, protocol = t.protocol.as_str(), "tokenizer: local, checked against the first worker's");
            t
        }
        (Some(t), _) => t.clone(),
        (None, Some((_, engine))) if engine.is_tensorrt_llm() => {
            return Err(StartError::Tokenizer(format!(
                "the first worker is {engine}, which has no tokenizer endpoint: set KVPICK_TOKENIZER=local:PATH (its model directory)"
            )));
        }
        (None, Some((endpoint, engine))) => {
            let mut t = TokenizerConfig::new(protocol(engine), format!("http://{endpoint}"));
            t.fallback = config.picker.fallback;
            tracing::info!(url = %t.base_url, protocol = t.protocol.as_str(), "tokenizer: DYN_EPP_TOKENIZER_SERVICE_URL unset, asking the first worker");
            t
        }
        (None, None) => {
            return Err(StartError::Tokenizer(
                "DYN_EPP_TOKENIZER_SERVICE_URL is unset and the workers file lists no worker to render with".into(),
            ));
        }
    })
}
