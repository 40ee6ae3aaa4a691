//! `--spawn null|kv`: kvpick's own ext_proc server in this process, on
//! 127.0.0.1 with a port the OS picks, on its own one-thread tokio
//! runtime (`kvpick-io`) so it does not share the load generator's.
//!
//! `null`: the null picker over the workers (first endpoint; no tokenize,
//! hash or selection): the protocol's own cost. `kv`: the real `KvPicker`
//! over a one-shard `ShardedService` with the in-process word tokenizer;
//! each system prompt of the workload is cached on two workers, so picks
//! follow the KV cache; its shard runs on a thread of its own. `kv-inline`: the same with the shard run inline
//! by the server's I/O thread (no shard thread).

use std::net::SocketAddr;
use std::sync::Arc;

use kvpick_core::{RouterConfig, WorkerId, WorkerSpec};
use kvpick_ext_proc::metrics::STATUSES;
use kvpick_ext_proc::{ExtProcConfig, ExtProcMetrics, ExtProcServer};
use kvpick_grpc::ServerHandle;
use kvpick_router::tokenizer::Tokenizer;
use kvpick_router::{KvPicker, NullPicker, Picker, PickerConfig};
use kvpick_runtime::{Clock, RuntimeChoice, RuntimeConfig, RuntimeKind, ShardedService, ThreadProducers};
use kvpick_test_support::WordTokenizer;

use crate::args::{Options, SpawnKind};
use crate::prompts;

const BLOCK_SIZE: u32 = 16;

pub fn endpoint(worker: u64) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 10 + (worker % 200) as u8], 8000))
}

pub struct Spawned {
    runtime: Option<tokio::runtime::Runtime>,
    handle: Option<ServerHandle>,
    service: Option<Arc<ShardedService>>,
    metrics: Arc<ExtProcMetrics>,
    pub addr: SocketAddr,
}

impl Spawned {
    pub fn start(kind: SpawnKind, options: &Options) -> Result<Spawned, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kvpick-io")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the server runtime: {e}"))?;
        let workers = options.workers as u64;
        let config = ExtProcConfig { listen: SocketAddr::from(([127, 0, 0, 1], 0)), ..ExtProcConfig::default() };
        let metrics = Arc::new(ExtProcMetrics::new());
        let (picker, service) = match kind {
            SpawnKind::Null => (Picker::Null(NullPicker::new((0..workers).map(endpoint).collect::<Vec<_>>())), None),
            SpawnKind::Kv | SpawnKind::KvInline => {
                let clock = Clock::system();
                let choice = RuntimeChoice::Force(match kind {
                    SpawnKind::KvInline => RuntimeKind::Inline,
                    _ => RuntimeKind::StdThreads,
                });
                let shards = RuntimeConfig { shards: 1, cpus: Vec::new(), choice, ..RuntimeConfig::default() };
                let service = Arc::new(
                    ShardedService::start(RouterConfig::default(), BLOCK_SIZE, shards, clock.clone())
                        .map_err(|e| format!("cannot start the shards: {e}"))?,
                );
                runtime.block_on(populate(&service, &clock, options))?;
                let tokenizer: Arc<dyn Tokenizer> = Arc::new(WordTokenizer);
                let picker =
                    KvPicker::new(service.clone(), clock, tokenizer, &PickerConfig::default(), metrics.clone());
                (Picker::Kv(picker), Some(service))
            }
        };
        let server = ExtProcServer::new(config, picker, metrics.clone());
        let handle = runtime.block_on(server.spawn()).map_err(|e| format!("cannot start the server: {e}"))?;
        let addr = handle.local_addr();
        Ok(Spawned { runtime: Some(runtime), handle: Some(handle), service, metrics, addr })
    }

    /// What the server counted: streams answered per status.
    pub fn counts(&self) -> String {
        let snapshot = self.metrics.snapshot();
        let mut parts: Vec<String> = STATUSES
            .iter()
            .filter(|&&s| snapshot.requests(s) > 0)
            .map(|&s| format!("{} × {}", snapshot.requests(s), if s == 0 { "other".into() } else { s.to_string() }))
            .collect();
        if parts.is_empty() {
            parts.push("no requests".into());
        }
        format!("{} (statuses); {} stream errors", parts.join(", "), snapshot.stream_errors)
    }

    pub fn shutdown(mut self) {
        if let (Some(runtime), Some(handle)) = (self.runtime.as_ref(), self.handle.take()) {
            let _ = runtime.block_on(handle.shutdown());
        }
        if let Some(service) = self.service.take() {
            service.shutdown();
        }
        self.runtime = None;
    }
}

/// The workers, and each system prompt's blocks stored on two of them.
async fn populate(service: &Arc<ShardedService>, clock: &Clock, options: &Options) -> Result<(), String> {
    let producers = ThreadProducers::new(service.clone());
    let workers = options.workers as u64;
    for w in 0..workers {
        let spec = WorkerSpec::new(WorkerId(w + 1), endpoint(w), BLOCK_SIZE);
        service.upsert_worker(&producers, spec, clock.now()).await.map_err(|e| format!("worker: {e}"))?;
    }
    let mut producer = service.producer();
    for s in 0..options.system_prompts {
        let tokens =
            WordTokenizer::tokens(&prompts::system_only_body(options, s)).map_err(|e| format!("tokenize: {e}"))?;
        for copy in 0..2u64.min(workers) {
            let worker = (s as u64 * 2 + copy) % workers + 1;
            let event = kvpick_perf::setup::cached_prompt(worker, s as u64, &tokens, BLOCK_SIZE);
            service.apply_kv_event(&mut producer, WorkerId(worker), event).map_err(|e| format!("event: {e}"))?;
        }
    }
    // Events are fire-and-forget: a query through the same ring is
    // answered only after them.
    let _ = producers.service().loads(&std::sync::Mutex::new(producer)).await;
    Ok(())
}
