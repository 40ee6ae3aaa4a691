//! The simulated fleet the soak runs kvpick against: vLLM engines (real
//! HTTP, ZMQ KV events and replay, a prefix cache that evicts), a render
//! service kvpick tokenizes through, and the workers file kvpick follows.
//!
//! Unlike `kvpick_sim::Fleet` each engine sits behind a lock, so the chaos
//! schedule can kill one for good (its sockets closed) and start a new
//! process-alike on the same ports, as a pod restarted in place.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kvpick_discovery::workers_file::{self, Entry};
use kvpick_perf::sim::{Engine, EngineConfig, EngineStats, Fleet, Ports, RequestSpec, TimeModel};
use tokio::sync::RwLock;

use crate::traffic::MODEL;

/// The engines and the render service, each restartable in place.
pub struct SoakFleet {
    engines: Vec<RwLock<Engine>>,
    render: RwLock<Engine>,
    workers_file: PathBuf,
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
    /// `n` engines with `num_blocks` KV blocks each (small, so caches
    /// fill and evict within the run), virtual time `time_scale` times the
    /// wall clock, and the workers file listing all of them.
    pub async fn start(n: usize, num_blocks: usize, time_scale: f64, workers_file: PathBuf) -> Result<Self, String> {
        let base = EngineConfig {
            model: MODEL.into(),
            block_size: crate::BLOCK_SIZE,
            num_blocks,
            default_max_tokens: 16,
            time: TimeModel { time_scale, ..TimeModel::default() },
            ..EngineConfig::default()
        };
        let mut engines = Vec::with_capacity(n);
        for config in Fleet::configs(n, &base) {
            engines.push(RwLock::new(Engine::start(config).await.map_err(|e| format!("engine: {e}"))?));
        }
        let render_config = EngineConfig { name: "render".into(), ..base };
        let render = Engine::start(render_config).await.map_err(|e| format!("render service: {e}"))?;
        let fleet = SoakFleet { engines, render: RwLock::new(render), workers_file };
        fleet.write_workers(None).await?;
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

    /// Rewrites the workers file with every engine but `except`.
    pub async fn write_workers(&self, except: Option<usize>) -> Result<(), String> {
        let mut entries = Vec::with_capacity(self.engines.len());
        for (i, engine) in self.engines.iter().enumerate() {
            if Some(i) == except {
                continue;
            }
            let ep = engine.read().await.endpoints().clone();
            entries.push(Entry::new(ep.http, ep.events.clone(), Some(ep.replay.clone())));
        }
        workers_file::write(&self.workers_file, &entries).map_err(|e| format!("{}: {e}", self.workers_file.display()))
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
