//! One simulated engine: its HTTP server, scheduler loop and KV-event
//! publisher, and the handle tests and tools drive it with.
//!
//! [`Engine::start`] must be called inside a tokio runtime (multi-threaded
//! or not); the HTTP server and the loop are tasks on it, the publisher a
//! thread of its own. Stop with [`Engine::shutdown`]; dropping the handle
//! also stops everything, without waiting.

use kvpick_router::tokenizer::{LocalTokenizer, LocalTokenizerConfig};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::config::{EngineConfig, PdRole};
use super::engine_loop::{self, Command, EngineStats, HoldTake, LoopParts, Progress};
use super::error::SimError;
use super::http_server::{self, HttpState};
use super::pd::side_channel::{self, SideChannel};
use super::pd::{PdCounters, TransferHub};
use super::prefix_cache::CacheSnapshot;
use super::publisher::Publisher;
use super::scheduler::{Outcome, PdOptions, RequestId, RequestSpec, Scheduler};
use super::time_model::Pacer;

/// Where an engine listens, all on its host (127.0.0.1 unless configured).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineEndpoints {
    pub name: String,
    /// The OpenAI-compatible HTTP server (also `/health`, `/metrics`, render).
    pub http: SocketAddr,
    /// The KV-event PUB socket, `tcp://host:port`.
    pub events: String,
    /// The replay ROUTER socket, `tcp://host:port`.
    pub replay: String,
    /// A prefill engine's KV transfer side channel: SGLang's bootstrap
    /// server (`bootstrap_host`/`bootstrap_port`), vLLM's NIXL side channel
    /// (`remote_host`/`remote_port`), TensorRT-LLM's transfer endpoint.
    /// `None` for the other roles.
    pub bootstrap: Option<SocketAddr>,
}

impl EngineEndpoints {
    /// `http://host:port`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// `{"name", "http", "events", "replay", "bootstrap"}`, `http` as a
    /// base URL, `bootstrap` as `host:port` or null.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "http": self.base_url(),
            "events": self.events,
            "replay": self.replay,
            "bootstrap": self.bootstrap.map(|a| a.to_string()),
        })
    }
}

/// A finished generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    pub token_ids: Vec<u32>,
    pub text: String,
    pub outcome: Outcome,
}

/// Sends commands to an engine's loop; shared by the handle and the HTTP
/// server.
#[derive(Clone, Debug)]
pub(crate) struct EngineClient {
    name: Arc<str>,
    commands: UnboundedSender<Command>,
}

impl EngineClient {
    /// Queues a request; its progress arrives on the returned receiver.
    pub(crate) fn submit(&self, spec: RequestSpec) -> Result<UnboundedReceiver<Progress>, SimError> {
        self.submit_pd(spec, PdOptions::default())
    }

    /// Queues one leg of a disaggregated request.
    pub(crate) fn submit_pd(
        &self,
        spec: RequestSpec,
        options: PdOptions,
    ) -> Result<UnboundedReceiver<Progress>, SimError> {
        let (progress, rx) = mpsc::unbounded_channel();
        self.send(Command::Submit { spec, options, progress })?;
        Ok(rx)
    }

    /// Releases request `id`'s held blocks to a pull, if still held.
    pub(crate) async fn take_hold(&self, id: RequestId) -> Result<HoldTake, SimError> {
        self.ask(|reply| Command::TakeHold { id, reply }).await
    }

    /// Frees request `id`'s held blocks, if any (callable from `Drop`).
    pub(crate) fn release_hold(&self, id: RequestId) {
        let _ = self.send(Command::ReleaseHold(id));
    }

    pub(crate) async fn stats(&self) -> Result<EngineStats, SimError> {
        self.ask(Command::Stats).await
    }

    fn send(&self, command: Command) -> Result<(), SimError> {
        self.commands.send(command).map_err(|_| SimError::Stopped(self.name.to_string()))
    }

    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, SimError> {
        let (tx, rx) = oneshot::channel();
        self.send(command(tx))?;
        rx.await.map_err(|_| SimError::Stopped(self.name.to_string()))
    }
}

struct Tasks {
    engine_loop: JoinHandle<()>,
    http: JoinHandle<()>,
    http_stop: oneshot::Sender<()>,
    side_channel: Option<SideChannel>,
}

/// A running simulated engine.
pub struct Engine {
    config: Arc<EngineConfig>,
    endpoints: EngineEndpoints,
    client: EngineClient,
    publisher: Arc<Publisher>,
    http_state: Arc<HttpState>,
    tasks: Mutex<Option<Tasks>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("endpoints", &self.endpoints).finish_non_exhaustive()
    }
}

impl Engine {
    /// Binds the HTTP, PUB and ROUTER sockets (ports from
    /// [`EngineConfig::ports`], or picked by the OS) and starts serving.
    pub async fn start(config: EngineConfig) -> Result<Engine, SimError> {
        config.validate()?;
        let config = Arc::new(config);
        let publisher = Arc::new(Publisher::start(&config)?);
        let addr = SocketAddr::from((config.host, config.ports.http.unwrap_or(0)));
        let listener = TcpListener::bind(addr).await.map_err(|source| SimError::Listen {
            what: "HTTP",
            addr: addr.to_string(),
            source,
        })?;
        let http = listener.local_addr().map_err(|source| SimError::Listen {
            what: "HTTP",
            addr: addr.to_string(),
            source,
        })?;
        let (commands, rx) = mpsc::unbounded_channel();
        let client = EngineClient { name: config.name.as_str().into(), commands };
        let pd = Arc::new(PdCounters::default());
        let hub = Arc::new(TransferHub::default());
        let side_channel = match config.pd_role {
            PdRole::Prefill => {
                let addr = SocketAddr::from((config.host, config.bootstrap_port.unwrap_or(0)));
                let listener = TcpListener::bind(addr).await.map_err(|source| SimError::Listen {
                    what: "KV transfer side channel",
                    addr: addr.to_string(),
                    source,
                })?;
                Some(side_channel::serve(listener, Arc::clone(&hub), client.clone()))
            }
            PdRole::Aggregated | PdRole::Decode => None,
        };
        let engine_loop = tokio::spawn(engine_loop::run(
            LoopParts {
                name: config.name.clone(),
                scheduler: Scheduler::new(&config),
                publisher: Arc::clone(&publisher),
                pacer: Pacer::new(config.time.time_scale),
                lease: Duration::from_millis(config.kv_lease_ms),
                pd: Arc::clone(&pd),
            },
            rx,
        ));
        let (http_stop, stopped) = oneshot::channel::<()>();
        let tokenizer = match &config.model_dir {
            None => None,
            Some(dir) => {
                let local = LocalTokenizerConfig { dir: dir.clone(), chat_template: None };
                Some(LocalTokenizer::load(&local, Arc::default()).map_err(|e| SimError::Tokenizer(e.to_string()))?)
            }
        };
        let drain = publisher.drain().cloned();
        let bootstrap = side_channel.as_ref().map(|s| s.addr);
        let http_state = HttpState::new(
            client.clone(),
            Arc::clone(&config),
            tokenizer,
            drain,
            http_server::PdParts { hub, pd, bootstrap },
        );
        let app = http_server::router(Arc::clone(&http_state));
        let name = config.name.clone();
        let http_task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(error) = serve.await {
                tracing::error!(engine = %name, %error, "HTTP server failed");
            }
        });
        let endpoints = EngineEndpoints {
            name: config.name.clone(),
            http,
            events: publisher.events_endpoint().to_owned(),
            replay: publisher.replay_endpoint().to_owned(),
            bootstrap,
        };
        tracing::info!(engine = %config.name, http = %endpoints.http, events = %endpoints.events,
            replay = %endpoints.replay, role = %config.pd_role, bootstrap = ?endpoints.bootstrap,
            "simulated engine started");
        Ok(Engine {
            config,
            endpoints,
            client,
            publisher,
            http_state,
            tasks: Mutex::new(Some(Tasks { engine_loop, http: http_task, http_stop, side_channel })),
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn endpoints(&self) -> &EngineEndpoints {
        &self.endpoints
    }

    /// Whether [`Engine::shutdown`] has not been called.
    pub fn is_running(&self) -> bool {
        self.tasks.lock().map(|t| t.is_some()).unwrap_or(false)
    }

    /// Queues a request (as the HTTP server does, without HTTP): tokens,
    /// then `Finished`, `Rejected` or `Aborted`, arrive on the receiver.
    /// Dropping the receiver aborts the request.
    pub fn submit(&self, spec: RequestSpec) -> Result<UnboundedReceiver<Progress>, SimError> {
        self.client.submit(spec)
    }

    /// Runs a request to its end.
    pub async fn generate(&self, spec: RequestSpec) -> Result<Generation, SimError> {
        let mut rx = self.submit(spec)?;
        let (mut token_ids, mut text) = (Vec::new(), String::new());
        while let Some(progress) = rx.recv().await {
            match progress {
                Progress::Token { token_id, text: piece } => {
                    token_ids.push(token_id);
                    text.push_str(&piece);
                }
                Progress::Finished(outcome) => return Ok(Generation { token_ids, text, outcome }),
                Progress::Rejected(reason) => return Err(SimError::Rejected(reason)),
                Progress::Aborted(reason) | Progress::Failed(reason) => return Err(SimError::Aborted(reason)),
            }
        }
        Err(SimError::Stopped(self.name().to_owned()))
    }

    /// Queue, load, cache and publisher numbers.
    pub async fn stats(&self) -> Result<EngineStats, SimError> {
        self.client.stats().await
    }

    /// Finished prefills holding blocks for a transfer (0 once every
    /// transfer was pulled, expired or given up: nothing leaked).
    pub async fn held_transfers(&self) -> Result<usize, SimError> {
        Ok(self.client.stats().await?.held_transfers)
    }

    /// Every cached block, with its references.
    pub async fn cache(&self) -> Result<CacheSnapshot, SimError> {
        self.client.ask(Command::Cache).await
    }

    /// The last finished requests (up to 4,096), oldest first.
    pub async fn outcomes(&self) -> Result<Vec<Outcome>, SimError> {
        self.client.ask(Command::Outcomes).await
    }

    /// Freezes (or resumes) the scheduler: requests are accepted but make
    /// no progress, and no events are produced; virtual time goes on.
    pub fn set_stalled(&self, stalled: bool) -> Result<(), SimError> {
        self.client.send(Command::SetStalled(stalled))
    }

    /// Holds (or releases) KV-event batches in the publisher; the engine
    /// keeps serving.
    pub fn set_events_stalled(&self, stalled: bool) {
        self.publisher.set_stalled(stalled);
    }

    /// Sends KV-event batches in swapped pairs (each after the one numbered
    /// next) while `reordering`; on turning it off, a batch still waiting
    /// goes out.
    pub fn set_events_reordered(&self, reordering: bool) {
        self.publisher.set_reordering(reordering);
    }

    /// Loses this fraction (0–1) of the batches from now on; lost batches
    /// still use a sequence number and stay replayable.
    pub fn set_drop_fraction(&self, fraction: f64) {
        self.publisher.set_drop_fraction(fraction);
    }

    /// Leaves replay requests unanswered (as if lost on the way) while
    /// `down`; the live stream goes on.
    pub fn set_replay_down(&self, down: bool) {
        self.publisher.set_replay_down(down);
    }

    /// Render answers come late: alternately after `delay` and a quarter
    /// of it (`Duration::ZERO`: at once again).
    pub fn set_render_delay(&self, delay: Duration) {
        self.http_state.render_fault.set_delay(delay);
    }

    /// Render requests fail with HTTP 500 while `failing`.
    pub fn set_render_failing(&self, failing: bool) {
        self.http_state.render_fault.set_failing(failing);
    }

    /// Simulates an engine process restart on the same ports: running and
    /// waiting requests are aborted, the cache emptied, sequence numbers
    /// start again at 0 and the replay buffer is empty. With
    /// `announce_clear`, `AllBlocksCleared` is the first batch (seq 0).
    pub async fn restart(&self, announce_clear: bool) -> Result<(), SimError> {
        self.client.ask(|done| Command::Restart { announce_clear, done }).await
    }

    /// Stops the engine: requests in flight are aborted, the HTTP server
    /// closes (connections finish within 2 s or are cut), the ZMQ sockets
    /// close. Idempotent; the ports are free when it returns.
    pub async fn shutdown(&self) {
        let tasks = self.tasks.lock().ok().and_then(|mut t| t.take());
        let Some(tasks) = tasks else { return };
        let _ = self.client.send(Command::Shutdown);
        let _ = tasks.engine_loop.await;
        let _ = tasks.http_stop.send(());
        if let Some(side_channel) = tasks.side_channel {
            let _ = side_channel.stop.send(());
            let _ = side_channel.task.await;
        }
        let mut http = tasks.http;
        if tokio::time::timeout(Duration::from_secs(2), &mut http).await.is_err() {
            http.abort();
        }
        let publisher = Arc::clone(&self.publisher);
        if tokio::task::spawn_blocking(move || publisher.stop()).await.is_err() {
            tracing::error!(engine = %self.name(), "publisher stop panicked");
        }
        tracing::info!(engine = %self.name(), "simulated engine stopped");
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(tasks) = self.tasks.lock().ok().and_then(|mut t| t.take()) {
            let _ = self.client.send(Command::Shutdown);
            let _ = tasks.http_stop.send(());
            if let Some(side_channel) = tasks.side_channel {
                let _ = side_channel.stop.send(());
            }
        }
    }
}
