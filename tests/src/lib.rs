//! The harness of kvpick's end-to-end tests (the scenarios are in `e2e/`).
//!
//! A [`Stack`] is a whole deployment on 127.0.0.1, in one process: N
//! simulated vLLM engines (real HTTP, real ZMQ KV events with replay, a
//! prefix cache, virtual time running [`TIME_SCALE`]× the wall clock), one
//! more simulated engine serving only `/render` as the tokenizer service,
//! a static workers file listing the engines, kvpick itself ([`App`], the
//! same wiring as `kvpick serve`) and the miniature [`Gateway`], which asks
//! kvpick over ext_proc, forwards each request to the engine it picked and
//! feeds the response back through ext_proc, like Envoy.
//!
//! Every wait is "until a condition holds or [`WAIT`] passes, then fail
//! with what was last seen", never a fixed sleep: the suite must hold on a
//! loaded 2-core machine. Assertions are about facts, not timings: which
//! engine served, what the engine reports as cached, what kvpick's shards
//! hold, what its counters say.
//!
//! Threads: everything here runs on the test's multi-thread tokio runtime,
//! except kvpick's shards and KV-event ingest and the engines' publishers,
//! which run on threads of their own.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvpick_app::app::settings::{self as var, Values};
use kvpick_app::app::{App, ServeConfig};
use kvpick_core::{HashSeed, LoadSnapshot, Prompt, WorkerId};
use kvpick_discovery::workers_file::{self, static_worker_id};
use kvpick_kv_events::IngestCounters;
use kvpick_runtime::ThreadProducers;
use kvpick_sim::{Engine, EngineConfig, Fleet, RequestSpec, TimeModel};
use kvpick_test_support::gateway::Gateway;
use serde_json::{Value, json};

/// The longest any condition is waited for.
pub const WAIT: Duration = Duration::from_secs(20);
/// Virtual time of the engines runs this much faster than the wall clock.
pub const TIME_SCALE: f64 = 50.0;
/// Tokens per KV block, on the engines and in kvpick.
pub const BLOCK_SIZE: u32 = 16;
pub const MODEL: &str = "sim-model";

/// The engines' configuration: fast virtual time, a cache large enough
/// that nothing a test sends is ever evicted (evictions would make "what
/// the engine holds" depend on timing).
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        model: MODEL.into(),
        block_size: BLOCK_SIZE,
        num_blocks: 4096,
        default_max_tokens: 8,
        time: TimeModel { time_scale: TIME_SCALE, ..TimeModel::default() },
        ..EngineConfig::default()
    }
}

/// Logs of kvpick and the engines, for debugging a failing run:
/// `KVPICK_E2E_LOG=debug cargo test -p kvpick-e2e -- --nocapture`.
fn init_logs() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let Ok(filter) = std::env::var("KVPICK_E2E_LOG") else { return };
    let Ok(targets) = filter.parse::<tracing_subscriber::filter::Targets>() else { return };
    // Several tests of one binary race to install it; one wins.
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .with(targets)
        .try_init();
}

/// Polls `check` every 25 ms until it returns `Ok`, and returns that; after
/// [`WAIT`], fails with `what` and the last `Err`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            panic!("{what}: not within {} s; last seen: {last}", WAIT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kvpick-e2e-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one request through the gateway came back with.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The endpoint kvpick picked and the gateway forwarded to.
    pub endpoint: SocketAddr,
    /// The assistant's text, as the client received it.
    pub text: String,
    /// The engine's own `usage`.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// A streamed chat completion body, asking for `usage` in the last chunk.
pub fn chat_body(messages: &[Value], max_tokens: u32) -> Value {
    json!({
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// `n` deterministic words starting with `tag` (alphanumeric, so one
/// token each with the simulated tokenizer while short): texts with
/// different tags differ from their first word.
pub fn words(tag: &str, n: usize) -> String {
    (0..n).map(|j| format!("{tag}x{j}")).collect::<Vec<_>>().join(" ")
}

/// The prompt tokens of a chat body, exactly as the engines render them
/// (and as kvpick gets them from the render service).
pub fn prompt_tokens(body: &Value) -> Vec<u32> {
    kvpick_sim::tokenizer::render_chat(body).unwrap_or_else(|e| panic!("body does not render: {e}"))
}

/// Full blocks of a chat body's prompt: what an engine caches of it.
pub fn full_blocks(body: &Value) -> u32 {
    (prompt_tokens(body).len() / BLOCK_SIZE as usize) as u32
}

/// Sends a chat body through `gateway`; an answer other than a complete
/// 200 stream is an error with what the client saw.
pub async fn post_chat(gateway: &Gateway, body: &Value) -> Result<Reply, String> {
    let exchange =
        gateway.post("/v1/chat/completions", body.to_string().as_bytes()).await.map_err(|e| format!("gateway: {e}"))?;
    let text = String::from_utf8_lossy(&exchange.body).into_owned();
    if exchange.status != 200 {
        return Err(format!("status {} (refused: {:?}): {text}", exchange.status, exchange.refused));
    }
    let endpoint = exchange.endpoint.ok_or_else(|| "200 without a picked endpoint".to_owned())?;
    if !text.contains("data: [DONE]") {
        return Err(format!("the stream from {endpoint} did not finish: {text}"));
    }
    let mut reply = Reply { endpoint, text: String::new(), prompt_tokens: 0, cached_tokens: 0 };
    let mut usage_seen = false;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
        let Ok(chunk) = serde_json::from_str::<Value>(data) else { continue };
        if let Some(piece) = chunk.pointer("/choices/0/delta/content").and_then(Value::as_str) {
            reply.text.push_str(piece);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage_seen = true;
            reply.prompt_tokens = usage.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
            reply.cached_tokens =
                usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0);
        }
    }
    if !usage_seen {
        return Err(format!("no usage chunk from {endpoint}: {text}"));
    }
    Ok(reply)
}

/// One chat conversation: every turn resends the whole history, as chat
/// clients do, so each turn's prompt extends the previous one's.
#[derive(Clone, Debug)]
pub struct Conversation {
    tag: String,
    messages: Vec<Value>,
    max_tokens: u32,
    /// The body of the last turn asked.
    asked: Option<Value>,
}

impl Conversation {
    /// A conversation opened by a system prompt of `system_words` words
    /// unique to `tag`.
    pub fn new(tag: &str, system_words: usize, max_tokens: u32) -> Conversation {
        let system = json!({"role": "system", "content": words(&format!("{tag}s"), system_words)});
        Conversation { tag: tag.to_owned(), messages: vec![system], max_tokens, asked: None }
    }

    /// The body of the next turn, and `user_words` words added to the
    /// history as the user's message.
    pub fn ask(&mut self, turn: usize, user_words: usize) -> Value {
        let user = words(&format!("{}u{turn}", self.tag), user_words);
        self.messages.push(json!({"role": "user", "content": user}));
        let body = chat_body(&self.messages, self.max_tokens);
        self.asked = Some(body.clone());
        body
    }

    /// The body of the last turn asked (the prompt the next turn extends).
    pub fn last_asked(&self) -> &Value {
        self.asked.as_ref().unwrap_or_else(|| panic!("conversation {} has asked nothing yet", self.tag))
    }

    /// Adds the assistant's answer to the history.
    pub fn answered(&mut self, reply: &Reply) {
        self.messages.push(json!({"role": "assistant", "content": reply.text}));
    }
}

/// How to build a [`Stack`].
#[derive(Clone, Debug)]
pub struct StackOptions {
    pub engines: usize,
    /// kvpick's shard threads.
    pub shards: usize,
    /// Engine 0's step costs are multiplied by this (1: as fast as the
    /// others): a slow node kvpick must learn of by itself.
    pub first_engine_slowdown: u64,
    /// Virtual seconds per wall-clock second on every engine.
    pub time_scale: f64,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions { engines: 3, shards: 1, first_engine_slowdown: 1, time_scale: TIME_SCALE }
    }
}

/// A running deployment: engines, tokenizer service, workers file, kvpick
/// and a gateway. End it with [`Stack::finish`], which also checks that
/// nothing is left booked.
pub struct Stack {
    pub fleet: Fleet,
    /// The render (tokenizer) service; not a worker, so engines can be
    /// stopped and restarted without touching tokenization.
    render: Engine,
    /// Holds the workers file; removed on drop.
    _dir: TempDir,
    workers_file: PathBuf,
    app: Option<App>,
    pub gateway: Gateway,
    /// This harness's own rings into kvpick's shards, for its queries.
    producers: ThreadProducers,
}

impl Stack {
    /// Starts everything and returns once kvpick serves every engine and
    /// has heard each one's KV events (see [`Stack::warm_up`]).
    pub async fn start(options: StackOptions) -> Stack {
        init_logs();
        let base = EngineConfig {
            time: TimeModel { time_scale: options.time_scale, ..engine_config().time },
            ..engine_config()
        };
        let mut configs = Fleet::configs(options.engines, &base);
        if let Some(first) = configs.first_mut() {
            let k = options.first_engine_slowdown;
            let t = &mut first.time;
            (t.step_overhead_ns, t.prefill_ns_per_token, t.decode_ns_per_seq) =
                (k * t.step_overhead_ns, k * t.prefill_ns_per_token, k * t.decode_ns_per_seq);
        }
        let fleet = Fleet::start_with(configs).await.unwrap_or_else(|e| panic!("fleet: {e}"));
        let render_config = EngineConfig { name: "render".into(), ..engine_config() };
        let render = Engine::start(render_config).await.unwrap_or_else(|e| panic!("render service: {e}"));
        let dir = TempDir::new();
        let workers_file = dir.0.join("workers.json");
        let all: Vec<usize> = (0..options.engines).collect();
        write_workers(&workers_file, &fleet, &all);

        let shards = options.shards.to_string();
        let mut values = Values::loopback_static(&workers_file);
        values.set(var::BLOCK_SIZE, "16");
        values.set(var::MODEL, MODEL);
        values.set(var::WORKERS_FILE_POLL_MS, "100");
        // No bookings are dropped by a shutdown mid-test: the grace only
        // matters for streams open at the end.
        values.set(var::SHUTDOWN_GRACE_MS, "2000");
        // A tokenizer failure must show as an error, not as a silent
        // load-only pick that would make overlaps vanish.
        values.set("DYN_EPP_TOKENIZER_FALLBACK", "fail");
        values.set(var::SHARDS, shards);
        values.set("DYN_EPP_TOKENIZER_SERVICE_URL", render.endpoints().base_url());
        let config = ServeConfig::from_values(&values).unwrap_or_else(|e| panic!("config: {e}"));
        let app = App::start(config).await.unwrap_or_else(|e| panic!("kvpick start: {e}"));
        let gateway = Gateway::connect(app.ext_proc_addr()).await.unwrap_or_else(|e| panic!("gateway: {e}"));
        let producers = ThreadProducers::new(app.service().clone());
        let stack = Stack { fleet, render, _dir: dir, workers_file, app: Some(app), gateway, producers };
        stack.wait_workers(&all).await;
        for i in all {
            stack.warm_up(i).await;
        }
        stack
    }

    pub fn app(&self) -> &App {
        self.app.as_ref().unwrap_or_else(|| panic!("the stack was shut down"))
    }

    pub fn engine(&self, i: usize) -> &Engine {
        &self.fleet[i]
    }

    pub fn endpoint(&self, i: usize) -> SocketAddr {
        self.fleet[i].endpoints().http
    }

    pub fn worker(&self, i: usize) -> WorkerId {
        static_worker_id(self.endpoint(i))
    }

    /// The index of the engine serving HTTP at `endpoint`.
    pub fn index_of(&self, endpoint: SocketAddr) -> usize {
        (0..self.fleet.len())
            .find(|i| self.endpoint(*i) == endpoint)
            .unwrap_or_else(|| panic!("{endpoint} is not an engine of this stack"))
    }

    /// Rewrites the workers file to list exactly the engines `which`.
    pub fn write_workers(&self, which: &[usize]) {
        write_workers(&self.workers_file, &self.fleet, which);
    }

    /// Waits until kvpick serves exactly the engines `which`.
    pub async fn wait_workers(&self, which: &[usize]) {
        let mut want: Vec<SocketAddr> = which.iter().map(|i| self.endpoint(*i)).collect();
        want.sort();
        eventually("kvpick serves the workers file's engines", || {
            let mut have: Vec<SocketAddr> = self.app().workers().all().into_iter().map(|(_, e)| e).collect();
            have.sort();
            let result = if have == want { Ok(()) } else { Err(format!("serving {have:?}, want {want:?}")) };
            async move { result }
        })
        .await;
    }

    /// Makes engine `i` publish (requests sent to it directly, not through
    /// kvpick) until kvpick has applied one of its batches, then waits
    /// until kvpick's index holds exactly what the engine caches.
    ///
    /// Why: a ZMQ subscription takes effect a moment after it is made, so
    /// batches published right after kvpick subscribes can be missed with
    /// no later batch to reveal the gap; once kvpick has a batch of its
    /// own, every later loss shows up as a gap that replay heals.
    pub async fn warm_up(&self, i: usize) {
        let worker = self.worker(i);
        let mut attempt = 0u32;
        eventually(&format!("kvpick hears engine {i}'s KV events"), || {
            let heard = self.app().ingest().metrics().worker(worker).and_then(|w| w.last_seq);
            attempt += 1;
            let n = attempt;
            async move {
                if heard.is_some() {
                    return Ok(());
                }
                // Two full blocks, distinct per engine and attempt, so each
                // attempt stores new blocks (one batch on the wire).
                let base = 100_000 + 1_000 * i as u32 + 40 * n;
                let prompt: Vec<u32> = (base..base + 2 * BLOCK_SIZE).collect();
                let spec = RequestSpec { prompt, max_tokens: 1, seed: Some(0) };
                self.engine(i).generate(spec).await.map_err(|e| format!("warm-up request: {e}"))?;
                Err(format!("no batch applied yet after {n} warm-up requests"))
            }
        })
        .await;
        self.wait_in_sync(i).await;
    }

    /// kvpick's shards' view of every worker's load, by worker id.
    pub async fn loads(&self) -> Vec<LoadSnapshot> {
        self.app().service().loads(&self.producers).await
    }

    /// kvpick's load of engine `i` (zero if it is not a worker).
    pub async fn load_of(&self, i: usize) -> LoadSnapshot {
        let worker = self.worker(i);
        self.loads().await.into_iter().find(|l| l.worker == worker).unwrap_or(LoadSnapshot {
            worker,
            prefill_tokens: 0,
            active_blocks: 0,
            requests: 0,
            cached_blocks: 0,
            block_size_mismatch: None,
            schedulable: false,
        })
    }

    /// kvpick's overlap of a chat body's prompt on engine `i`, in blocks.
    pub async fn overlap(&self, body: &Value, i: usize) -> u32 {
        let prompt = Prompt::from_tokens(&prompt_tokens(body), BLOCK_SIZE, HashSeed::default());
        let scores = self.app().service().overlap_scores(&self.producers, &prompt).await;
        let worker = self.worker(i);
        scores.into_iter().find(|(w, _)| *w == worker).map_or(0, |(_, depth)| depth)
    }

    /// Waits until kvpick's overlap of `body` on engine `i` is `blocks`
    /// (KV events travel asynchronously from the engine to the shards).
    pub async fn wait_overlap(&self, body: &Value, i: usize, blocks: u32) {
        eventually(&format!("kvpick's overlap on engine {i} reaches {blocks} blocks"), || async move {
            let now = self.overlap(body, i).await;
            if now == blocks { Ok(()) } else { Err(format!("{now} blocks")) }
        })
        .await;
    }

    /// Waits until kvpick indexes exactly as many blocks for engine `i`
    /// as the engine caches. With no evictions and no duplicate stores
    /// (the cache is large, prompts distinct), equal counts mean the
    /// index holds every block the engine announced, none it forgot.
    pub async fn wait_in_sync(&self, i: usize) {
        eventually(&format!("kvpick's index matches engine {i}'s cache"), || async move {
            let engine = self.engine(i).stats().await.map_err(|e| e.to_string())?.cached_blocks as u64;
            let indexed = self.load_of(i).await.cached_blocks;
            if engine == indexed {
                Ok(())
            } else {
                Err(format!("engine caches {engine} blocks, kvpick indexes {indexed}"))
            }
        })
        .await;
    }

    /// kvpick's KV-event ingest counters.
    pub fn ingest(&self) -> IngestCounters {
        self.app().ingest().metrics().snapshot()
    }

    /// Sends a chat body through the gateway; anything but a complete
    /// 200 stream fails the test.
    pub async fn chat(&self, body: &Value) -> Reply {
        post_chat(&self.gateway, body).await.unwrap_or_else(|e| panic!("chat request: {e}"))
    }

    /// Freezes (or resumes) the schedulers of every engine still running:
    /// requests are accepted and stay in flight, holding their bookings
    /// in kvpick, until resumed.
    pub fn stall_all(&self, stalled: bool) {
        for engine in self.fleet.engines().iter().filter(|e| e.is_running()) {
            engine.set_stalled(stalled).unwrap_or_else(|e| panic!("stall {}: {e}", engine.name()));
        }
    }

    /// Sends `bodies` one after the other, each only once kvpick has
    /// booked the previous one, so every pick sees the bookings of all
    /// before it (concurrent picks could race past each other's). With
    /// the engines stalled, all stay in flight. Returns the requests'
    /// tasks; they finish once the engines run.
    ///
    /// "Booked" is read from the shards' loads (requests per worker), not
    /// from `active_reservations`: the service counts a reservation as
    /// soon as the pick starts, before the shard has booked it. It starts
    /// from a drained kvpick: the free of a response that just ended is
    /// posted to the shards, not awaited, so counting from a baseline
    /// that still includes it would wait for a booking that never comes.
    pub async fn send_booked_in_order(
        &self,
        bodies: Vec<Value>,
    ) -> Vec<tokio::task::JoinHandle<Result<Reply, String>>> {
        self.wait_drained().await;
        let mut tasks = Vec::with_capacity(bodies.len());
        for (k, body) in bodies.into_iter().enumerate() {
            let gateway = self.gateway.clone();
            tasks.push(tokio::spawn(async move { post_chat(&gateway, &body).await }));
            let want = k + 1;
            let ended_early = eventually(&format!("kvpick books request {k} of the burst"), || {
                let ended = tasks.iter().any(|t| t.is_finished());
                async move {
                    let now = self.booked_requests().await;
                    if now >= want {
                        Ok(false)
                    } else if ended {
                        // A request that ended before its booking was
                        // counted will never be counted: stop waiting.
                        Ok(true)
                    } else {
                        Err(format!("{now} booked"))
                    }
                }
            })
            .await;
            if ended_early {
                let ended = tasks.into_iter().filter(|t| t.is_finished()).collect::<Vec<_>>();
                let mut outcomes = Vec::new();
                for task in ended {
                    outcomes.push(task.await.map_err(|e| e.to_string()).and_then(|r| r));
                }
                panic!("request {k} of the burst: a request ended before it was booked: {outcomes:?}");
            }
        }
        tasks
    }

    /// Requests booked on the shards, over all workers.
    pub async fn booked_requests(&self) -> usize {
        self.loads().await.iter().map(|l| l.requests as usize).sum()
    }

    /// Waits until nothing is booked anywhere: no reservation left, every
    /// worker's prefill tokens, active blocks and requests zero.
    pub async fn wait_drained(&self) {
        eventually("every reservation is freed and every load is zero", || async move {
            let reservations = self.app().service().active_reservations();
            let busy: Vec<LoadSnapshot> = self
                .loads()
                .await
                .into_iter()
                .filter(|l| l.prefill_tokens != 0 || l.active_blocks != 0 || l.requests != 0)
                .collect();
            if reservations == 0 && busy.is_empty() {
                Ok(())
            } else {
                Err(format!("{reservations} reservations; loads not zero: {busy:?}"))
            }
        })
        .await;
    }

    /// Checks that nothing is left booked, then stops kvpick, the engines
    /// and the render service.
    pub async fn finish(mut self) {
        self.wait_drained().await;
        if let Some(app) = self.app.take() {
            app.shutdown().await;
        }
        self.fleet.shutdown().await;
        self.render.shutdown().await;
    }
}

/// Writes the workers file for the engines `which` of `fleet`: a JSON list
/// of `{endpoint, kv_events, replay}`, written to a temporary file and
/// renamed over the old one, so kvpick never reads half a file.
fn write_workers(path: &std::path::Path, fleet: &Fleet, which: &[usize]) {
    let entries: Vec<workers_file::Entry> = which
        .iter()
        .map(|i| {
            let ep = fleet[*i].endpoints();
            workers_file::Entry::new(ep.http, ep.events.clone(), Some(ep.replay.clone()))
        })
        .collect();
    workers_file::write(path, &entries).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
