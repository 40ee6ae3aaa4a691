//! The simulated fleet the soak runs kvpick against: vLLM, SGLang and
//! TensorRT-LLM engines (real HTTP; KV events over ZMQ with replay, or
//! drained over HTTP for TensorRT-LLM; a prefix cache that evicts), a
//! render service kvpick tokenizes through, and how kvpick learns of them
//! ([`Members`]: a workers file, or pods on a fake API server).
//!
//! Unlike `kvpick_sim::Fleet` each engine sits behind a lock, so the chaos
//! schedule can kill one for good (its sockets closed) and start a new
//! process-alike on the same ports, as a pod restarted in place.

use std::net::SocketAddr;
use std::time::Duration;

use kvpick_perf::sim::{Engine, EngineConfig, EngineStats, Flavour, Fleet, Ports, RequestSpec, TimeModel};
use tokio::sync::RwLock;

use crate::members::{Listed, Members, pod_ip};
use crate::traffic::MODEL;

/// The engines and the render service, each restartable in place.
pub struct SoakFleet {
    engines: Vec<RwLock<Engine>>,
    render: RwLock<Engine>,
    members: Members,
}

/// The port of a `tcp://host:port` ZMQ endpoint.
fn zmq_port(endpoint: &str) -> Option<u16> {
    endpoint.rsplit_once(':').and_then(|(_, port)| port.parse().ok())
}

/// `engine`'s configuration pinned to the ports it has now, so a new start
/// takes its place.
fn pinned(engine: &Engine) -> EngineConfig {
    let ep = engine.endpoints();
    EngineConfig {
        ports: Ports { http: Some(ep.http.port()), events: zmq_port(&ep.events), replay: zmq_port(&ep.replay) },
        ..engine.config().clone()
    }
}

/// Stops the engine behind `slot`, waits `down`, and puts a new one on the
/// same ports in its place.
async fn restart_in_place(slot: &RwLock<Engine>, down: Duration) -> Result<(), String> {
    let config = {
        let engine = slot.read().await;
        let config = pinned(&engine);
        engine.shutdown().await;
        config
    };
    tokio::time::sleep(down).await;
    *slot.write().await = Engine::start(config).await.map_err(|e| e.to_string())?;
    Ok(())
}

impl SoakFleet {
    /// An engine of each of `flavours` with `num_blocks` KV blocks each
    /// (small, so caches fill and evict within the run), virtual time
    /// `time_scale` times the wall clock, all of them published through
    /// `members`. Under Kubernetes each engine is on a loopback address of
    /// its own and the ports of the first.
    pub async fn start(
        flavours: &[Flavour],
        num_blocks: usize,
        time_scale: f64,
        members: Members,
    ) -> Result<Self, String> {
        let base = EngineConfig {
            model: MODEL.into(),
            block_size: crate::BLOCK_SIZE,
            num_blocks,
            default_max_tokens: 16,
            time: TimeModel { time_scale, ..TimeModel::default() },
            ..EngineConfig::default()
        };
        let mut engines: Vec<RwLock<Engine>> = Vec::with_capacity(flavours.len());
        for (i, (config, &flavour)) in Fleet::configs(flavours.len(), &base).into_iter().zip(flavours).enumerate() {
            let mut config = match flavour {
                Flavour::Vllm => config,
                Flavour::Sglang => Flavour::sglang_events(config),
                Flavour::Trtllm => EngineConfig { flavour, ..config },
            };
            if members.is_kube() {
                config.host = pod_ip(i);
                if let Some(first) = engines.first() {
                    config.ports = pinned(&*first.read().await).ports;
                }
            }
            let engine = Engine::start(config).await.map_err(|e| format!("engine {i}: {e}"))?;
            engines.push(RwLock::new(engine));
        }
        let render_config = EngineConfig { name: "render".into(), ..base };
        let render = Engine::start(render_config).await.map_err(|e| format!("render service: {e}"))?;
        let fleet = SoakFleet { engines, render: RwLock::new(render), members };
        fleet.publish(None).await?;
        Ok(fleet)
    }

    pub fn len(&self) -> usize {
        self.engines.len()
    }

    /// The render service's base URL (kvpick's tokenizer).
    pub async fn render_url(&self) -> String {
        self.render.read().await.endpoints().base_url()
    }

    pub async fn endpoint(&self, i: usize) -> SocketAddr {
        self.engines[i].read().await.endpoints().http
    }

    /// Publishes every engine, `out` (if any) out of the fleet for now.
    pub async fn publish(&self, out: Option<usize>) -> Result<(), String> {
        let mut guards = Vec::with_capacity(self.engines.len());
        for engine in &self.engines {
            guards.push(engine.read().await);
        }
        let listed: Vec<Listed<'_>> =
            guards.iter().enumerate().map(|(i, engine)| Listed { engine, out: Some(i) == out }).collect();
        self.members.publish(&listed)
    }

    pub fn members(&self) -> &Members {
        &self.members
    }

    /// kvpick's discovery settings for this fleet.
    pub async fn discovery_settings(&self) -> Vec<(&'static str, String)> {
        let first = self.engines[0].read().await;
        let ports = pinned(&first).ports;
        self.members.settings(ports.events.unwrap_or(0), ports.replay.unwrap_or(0))
    }

    /// Engine `i`'s own numbers (`None` while it is down, or when its loop
    /// does not answer within a second).
    pub async fn stats(&self, i: usize) -> Option<EngineStats> {
        let engine = self.engines[i].read().await;
        if !engine.is_running() {
            return None;
        }
        tokio::time::timeout(Duration::from_secs(1), engine.stats()).await.ok()?.ok()
    }

    /// One request sent to engine `i` directly, not through kvpick (as
    /// another gateway would): after a restart, kvpick may route nothing to
    /// an engine whose cache it believes empty, and a restart that publishes
    /// nothing cannot be seen. Two full blocks, new every time.
    pub async fn poke(&self, i: usize) -> Result<(), String> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static POKES: AtomicU32 = AtomicU32::new(0);
        let base = 1_000_000 + 64 * POKES.fetch_add(1, Ordering::Relaxed);
        let spec = RequestSpec { prompt: (base..base + 2 * crate::BLOCK_SIZE).collect(), max_tokens: 1, seed: Some(0) };
        let engine = self.engines[i].read().await;
        engine.generate(spec).await.map(|_| ()).map_err(|e| format!("a request to engine {i}: {e}"))
    }

    /// Runs `f` on engine `i`.
    pub async fn with<T>(&self, i: usize, f: impl FnOnce(&Engine) -> T) -> T {
        f(&*self.engines[i].read().await)
    }

    /// Runs `f` on the render service.
    pub async fn with_render<T>(&self, f: impl FnOnce(&Engine) -> T) -> T {
        f(&*self.render.read().await)
    }

    /// A restart of the engine process in place (cache emptied, sequence
    /// numbers from 0), announced with `AllBlocksCleared` or not.
    pub async fn restart(&self, i: usize, announce_clear: bool) -> Result<(), String> {
        self.engines[i].read().await.restart(announce_clear).await.map_err(|e| format!("restart engine {i}: {e}"))
    }

    /// Kills engine `i` (its HTTP server and ZMQ sockets close, requests
    /// in flight are cut), keeps it down for `down`, then starts a new one
    /// on the same ports.
    pub async fn kill_and_restart(&self, i: usize, down: Duration) -> Result<(), String> {
        restart_in_place(&self.engines[i], down).await.map_err(|e| format!("engine {i} back on its ports: {e}"))
    }

    /// The render service down for `down`, then back on its port.
    pub async fn render_down(&self, down: Duration) -> Result<(), String> {
        restart_in_place(&self.render, down).await.map_err(|e| format!("render service back on its port: {e}"))
    }

    pub async fn shutdown(&self) {
        for engine in &self.engines {
            engine.read().await.shutdown().await;
        }
        self.render.read().await.shutdown().await;
    }
}
