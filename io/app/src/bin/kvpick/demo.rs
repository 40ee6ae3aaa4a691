//! `kvpick demo`: the whole product on one machine, in under a minute.
//!
//! Starts a small simulated vLLM fleet (real HTTP, real ZMQ KV events, a
//! prefix cache and a time model, from `kvpick-sim`), writes a static
//! workers file, starts kvpick (`App`, the same code as `kvpick serve`) in
//! front of it, and sends a multi-turn chat workload (conversations that
//! share system prompts, each turn resending the whole history) through
//! the real ext_proc server with a miniature gateway. Then it runs the same
//! workload on fresh, identical fleets routed by round-robin and by an
//! approximate-prefix picker (the GAIE default's scorers, see
//! `approx_prefix.rs`), and compares the three on what the engines
//! themselves report: prefix-cache hit rate
//! (`usage.prompt_tokens_details.cached_tokens`) and simulated time to
//! first token.
//!
//! `--disagg` runs disaggregated prefill/decode instead (`demo_disagg.rs`):
//! a prefill engine, decode engines behind `kvpick sidecar`, and the
//! per-leg timeline next to an aggregated run.
//!
//! `--engine trtllm` plays `trtllm-serve` instead (KV events drained from
//! `/kv_cache_events`, no render endpoint: kvpick tokenizes in-process with
//! the model directory `demo_model` writes, which the engines use too);
//! `--engine sglang` SGLang (its own event form over ZMQ; `/tokenize`
//! renders no chat, so kvpick tokenizes in-process there too); `--engine
//! mixed` rotates vLLM, TensorRT-LLM and SGLang engines behind one pool.
//! Any `--engine` but the default uses that model directory for every
//! engine; `--engine vllm --tokenizer generated` does too, to compare like
//! with like.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::ArgMatches;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvpick_app::app::settings::{self as var, Values};
use kvpick_app::app::{App, ServeConfig};
use kvpick_discovery::workers_file::{self, Entry};
use kvpick_sim::{EngineConfig, EngineEndpoints, Flavour, Fleet, TimeModel};
use kvpick_test_support::gateway::Gateway;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::approx_prefix::ApproxPrefix;
use crate::demo_model;

const MODEL: &str = "sim-model";
const SYSTEM_PROMPTS: usize = 3;
const SYSTEM_WORDS: usize = 260;
const USER_WORDS: usize = 64;
const REPLY_TOKENS: u32 = 32;
/// Virtual time runs this much faster than the wall clock.
const TIME_SCALE: f64 = 10.0;

/// Which engines the simulated fleet plays.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DemoEngine {
    Vllm,
    Trtllm,
    Sglang,
    Mixed,
}

impl DemoEngine {
    fn flavour(self, i: usize) -> Flavour {
        match self {
            DemoEngine::Vllm => Flavour::Vllm,
            DemoEngine::Trtllm => Flavour::Trtllm,
            DemoEngine::Sglang => Flavour::Sglang,
            DemoEngine::Mixed => [Flavour::Vllm, Flavour::Trtllm, Flavour::Sglang][i % 3],
        }
    }

    fn describe(self) -> &'static str {
        match self {
            DemoEngine::Vllm => "vLLM",
            DemoEngine::Trtllm => "TensorRT-LLM (trtllm-serve)",
            DemoEngine::Sglang => "SGLang",
            DemoEngine::Mixed => "vLLM, TensorRT-LLM and SGLang (in turn)",
        }
    }
}

struct Options {
    engine: DemoEngine,
    /// The generated word-level model directory instead of the simulator's
    /// built-in tokenizer.
    generated_model: bool,
    engines: usize,
    conversations: usize,
    turns: usize,
    concurrency: usize,
    seed: u64,
    quiet: bool,
}

fn options(m: &ArgMatches) -> Result<Options, String> {
    let number = |name: &str| -> Result<u64, String> {
        let text = m.get_one::<String>(name).map(String::as_str).unwrap_or_default();
        text.parse::<u64>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("--{name}={text:?}: expected a whole number of at least 1"))
    };
    let text = |name: &str| m.get_one::<String>(name).map(String::as_str).unwrap_or_default().to_owned();
    let engine = match text("engine").as_str() {
        "vllm" => DemoEngine::Vllm,
        "trtllm" => DemoEngine::Trtllm,
        "sglang" => DemoEngine::Sglang,
        "mixed" => DemoEngine::Mixed,
        other => return Err(format!("--engine={other:?}: expected vllm, trtllm, sglang or mixed")),
    };
    let generated_model = match (text("tokenizer").as_str(), engine) {
        ("builtin", DemoEngine::Vllm) => false,
        ("builtin", _) => {
            return Err("--tokenizer=builtin: TensorRT-LLM and SGLang need the generated model directory".into());
        }
        ("generated", _) => true,
        ("", engine) => engine != DemoEngine::Vllm,
        (other, _) => return Err(format!("--tokenizer={other:?}: expected builtin or generated")),
    };
    Ok(Options {
        engine,
        generated_model,
        engines: usize::try_from(number("engines")?).unwrap_or(3).min(16),
        conversations: usize::try_from(number("conversations")?).unwrap_or(18).min(500),
        turns: usize::try_from(number("turns")?).unwrap_or(4).min(20),
        concurrency: usize::try_from(number("concurrency")?).unwrap_or(6).min(64),
        seed: number("seed")?,
        quiet: m.get_flag("quiet"),
    })
}

pub fn run(m: &ArgMatches) -> ExitCode {
    let options = match options(m) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("kvpick demo: {e}");
            return ExitCode::from(2);
        }
    };
    // kvpick's own logs would drown the table: warnings only.
    let _ = crate::logging::init(kvpick_app::app::LogFormat::Text, "warn");
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvpick demo: could not start a runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let disagg = m.get_flag("disagg");
    if disagg && options.engine != DemoEngine::Vllm {
        eprintln!("kvpick demo: --disagg runs simulated vLLM engines; leave --engine out");
        return ExitCode::from(2);
    }
    let ran = if disagg {
        runtime.block_on(crate::demo_disagg::demo(
            options.conversations,
            options.concurrency,
            options.seed,
            options.quiet,
        ))
    } else {
        runtime.block_on(demo(&options))
    };
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvpick demo: {e}");
            ExitCode::from(1)
        }
    }
}

/// One policy's run, as the engines saw it.
struct RunResult {
    requests: usize,
    prompt_tokens: u64,
    cached_tokens: u64,
    ttft_ms: Vec<f64>,
    per_engine: Vec<usize>,
    wall: Duration,
}

impl RunResult {
    fn hit_rate(&self) -> f64 {
        if self.prompt_tokens == 0 { 0.0 } else { self.cached_tokens as f64 / self.prompt_tokens as f64 }
    }

    fn ttft(&self, q: f64) -> f64 {
        let mut v = self.ttft_ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return 0.0;
        }
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
}

async fn demo(o: &Options) -> Result<(), String> {
    println!(
        "kvpick demo: {} simulated {} engines, {} conversations × {} turns ({} at a time), {} shared system prompts, {} tokenizer",
        o.engines,
        o.engine.describe(),
        o.conversations,
        o.turns,
        o.concurrency,
        SYSTEM_PROMPTS,
        if o.generated_model { "a generated word-level" } else { "the simulator's built-in" }
    );
    let kv = run_policy(o, Policy::Kvpick).await?;
    let rr = run_policy(o, Policy::RoundRobin).await?;
    let ap = run_policy(o, Policy::ApproxPrefix).await?;
    println!();
    println!(
        "{:<14} {:>8} {:>16} {:>14} {:>14} {:>14}  requests per engine",
        "policy", "requests", "prefix hit rate", "TTFT p50 (ms)", "TTFT p90 (ms)", "TTFT p99 (ms)"
    );
    for (name, r) in [("kvpick", &kv), ("round-robin", &rr), ("approx-prefix", &ap)] {
        println!(
            "{:<14} {:>8} {:>15.1}% {:>14.1} {:>14.1} {:>14.1}  {:?}",
            name,
            r.requests,
            100.0 * r.hit_rate(),
            r.ttft(0.5),
            r.ttft(0.9),
            r.ttft(0.99),
            r.per_engine
        );
    }
    let ratio = |a: f64, b: f64| if a > 0.0 { b / a } else { f64::NAN };
    for (name, other) in [("round-robin", &rr), ("approx-prefix", &ap)] {
        println!(
            "\nkvpick against {name}: {:.2}× the cached prompt tokens; TTFT p50 {:.2}×, p90 {:.2}×, p99 {:.2}× lower",
            ratio(other.hit_rate(), kv.hit_rate()),
            ratio(kv.ttft(0.5), other.ttft(0.5)),
            ratio(kv.ttft(0.9), other.ttft(0.9)),
            ratio(kv.ttft(0.99), other.ttft(0.99)),
        );
    }
    println!(
        "(simulated time; wall {:.1} s + {:.1} s + {:.1} s)",
        kv.wall.as_secs_f64(),
        rr.wall.as_secs_f64(),
        ap.wall.as_secs_f64()
    );
    Ok(())
}

fn engine_configs(o: &Options, model_dir: Option<&Path>) -> Vec<EngineConfig> {
    let base = EngineConfig {
        model: MODEL.into(),
        num_blocks: 480,
        default_max_tokens: REPLY_TOKENS,
        seed: o.seed,
        time: TimeModel { time_scale: TIME_SCALE, ..TimeModel::default() },
        model_dir: model_dir.map(Path::to_path_buf),
        ..EngineConfig::default()
    };
    Fleet::configs(o.engines, &base)
        .into_iter()
        .enumerate()
        .map(|(i, config)| match o.engine.flavour(i) {
            Flavour::Sglang => Flavour::sglang_events(config),
            flavour => EngineConfig { flavour, ..config },
        })
        .collect()
}

/// The workers file entry of an engine: vLLM's or SGLang's ZMQ sockets,
/// or `trtllm-serve`'s drain at its endpoint.
fn entry(flavour: Flavour, e: EngineEndpoints) -> Entry {
    Entry::for_engine(flavour, e.http, e.events, Some(e.replay))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Policy {
    Kvpick,
    RoundRobin,
    ApproxPrefix,
}

async fn run_policy(o: &Options, policy: Policy) -> Result<RunResult, String> {
    let dir = std::env::temp_dir().join(format!("kvpick-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let model_dir = dir.join("model");
    if o.generated_model {
        std::fs::create_dir_all(&model_dir).map_err(|e| format!("{}: {e}", model_dir.display()))?;
        demo_model::write(&model_dir)?;
    }
    let configs = engine_configs(o, o.generated_model.then_some(model_dir.as_path()));
    let flavours: Vec<Flavour> = configs.iter().map(|c| c.flavour).collect();
    let fleet = Fleet::start_with(configs).await.map_err(|e| e.to_string())?;
    let workers_file = dir.join("workers.yaml");
    let entries: Vec<Entry> = fleet.endpoints().into_iter().zip(&flavours).map(|(e, f)| entry(*f, e)).collect();
    workers_file::write(&workers_file, &entries).map_err(|e| format!("{}: {e}", workers_file.display()))?;

    let (route, app) = if policy == Policy::Kvpick {
        let mut values = Values::loopback_static(&workers_file);
        values.set(var::SHARDS, "1");
        values.set(var::BLOCK_SIZE, "16");
        values.set(var::MODEL, MODEL);
        // TensorRT-LLM has no render endpoint and SGLang's `/tokenize`
        // renders no chat: kvpick tokenizes in-process. A vLLM-only fleet
        // renders, as by default.
        if o.engine != DemoEngine::Vllm {
            values.set(var::TOKENIZER, format!("local:{}", model_dir.display()));
        }
        let config = ServeConfig::from_values(&values).map_err(|e| e.to_string())?;
        let app = App::start(config).await.map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while app.workers().len() < o.engines {
            if Instant::now() > deadline {
                return Err("kvpick did not take on every worker within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "\nkvpick: ext_proc {}, metrics http://{}/metrics, workers file {}",
            app.ext_proc_addr(),
            app.metrics_addr(),
            workers_file.display()
        );
        let gateway = Gateway::connect(app.ext_proc_addr()).await.map_err(|e| e.to_string())?;
        (Route::Kvpick(gateway), Some(app))
    } else if policy == Policy::RoundRobin {
        println!("\nround-robin over a fresh, identical fleet:");
        let targets = fleet.endpoints().iter().map(|e| e.http).collect();
        (Route::RoundRobin { targets, next: AtomicUsize::new(0), http: http_client() }, None)
    } else {
        println!("\napproximate prefix (GAIE's default scorers) over a fresh, identical fleet:");
        let targets: Vec<SocketAddr> = fleet.endpoints().iter().map(|e| e.http).collect();
        let picker = ApproxPrefix::new(targets.len());
        (Route::ApproxPrefix { targets, picker, http: http_client() }, None)
    };
    let started = Instant::now();
    let shared = Arc::new(Shared { route, quiet: o.quiet, done: AtomicUsize::new(0), hits: Mutex::new((0, 0)) });
    if !o.quiet {
        println!(
            "{:>5}  {:<10} {:>4}  {:<10} {:>7} {:>7} {:>6}  {:>9}",
            "req", "conv", "turn", "worker", "prompt", "cached", "hit", "hit so far"
        );
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(o.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..o.conversations {
        let (shared, gate) = (shared.clone(), gate.clone());
        let (turns, seed) = (o.turns, o.seed);
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.map_err(|e| e.to_string())?;
            conversation(&shared, c, turns, seed).await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| e.to_string())??;
    }
    let wall = started.elapsed();
    let mut result = RunResult {
        requests: 0,
        prompt_tokens: 0,
        cached_tokens: 0,
        ttft_ms: Vec::new(),
        per_engine: Vec::new(),
        wall,
    };
    for engine in fleet.engines() {
        let outcomes = engine.outcomes().await.map_err(|e| e.to_string())?;
        result.per_engine.push(outcomes.len());
        for out in outcomes {
            result.requests += 1;
            result.prompt_tokens += u64::from(out.prompt_tokens);
            result.cached_tokens += u64::from(out.cached_tokens);
            result.ttft_ms.push(out.ttft_ns() as f64 / 1e6);
        }
    }
    if let Some(app) = app {
        app.shutdown().await;
    }
    fleet.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(result)
}

enum Route {
    Kvpick(Gateway),
    RoundRobin { targets: Vec<SocketAddr>, next: AtomicUsize, http: Client<HttpConnector, Full<Bytes>> },
    ApproxPrefix { targets: Vec<SocketAddr>, picker: ApproxPrefix, http: Client<HttpConnector, Full<Bytes>> },
}

struct Shared {
    route: Route,
    quiet: bool,
    done: AtomicUsize,
    /// (prompt tokens, cached tokens) so far.
    hits: Mutex<(u64, u64)>,
}

fn http_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Deterministic words: `n` of them, from `seed`.
fn words(seed: u64, n: usize) -> String {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n).map(|_| format!("w{}", rng.u32(0..5000))).collect::<Vec<_>>().join(" ")
}

async fn conversation(shared: &Shared, c: usize, turns: usize, seed: u64) -> Result<(), String> {
    let system = words(seed ^ (c % SYSTEM_PROMPTS) as u64 ^ 0x5157, SYSTEM_WORDS);
    let mut messages = vec![json!({"role": "system", "content": system})];
    for turn in 0..turns {
        let user = words(seed ^ ((c as u64) << 20) ^ turn as u64, USER_WORDS);
        messages.push(json!({"role": "user", "content": user}));
        let body = json!({
            "model": MODEL,
            "messages": messages,
            "max_tokens": REPLY_TOKENS,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string();
        let (worker, sse) = send(shared, body.into_bytes()).await?;
        let (reply, prompt, cached) = read_sse(&sse);
        messages.push(json!({"role": "assistant", "content": reply}));
        let n = shared.done.fetch_add(1, Ordering::Relaxed) + 1;
        let so_far = {
            let mut hits = shared.hits.lock().await;
            hits.0 += prompt;
            hits.1 += cached;
            if hits.0 == 0 { 0.0 } else { hits.1 as f64 / hits.0 as f64 }
        };
        if !shared.quiet {
            let hit = if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 };
            println!(
                "{n:>5}  conv {c:<5} {turn:>4}  {worker:<10} {prompt:>7} {cached:>7} {:>5.0}%  {:>8.1}%",
                100.0 * hit,
                100.0 * so_far
            );
        }
    }
    Ok(())
}

/// Sends a chat body by the run's policy: (engine name, SSE body).
async fn send(shared: &Shared, body: Vec<u8>) -> Result<(String, Vec<u8>), String> {
    match &shared.route {
        Route::Kvpick(gateway) => {
            let exchange = gateway.post("/v1/chat/completions", &body).await.map_err(|e| e.to_string())?;
            if exchange.status != 200 {
                return Err(format!(
                    "kvpick answered {} ({})",
                    exchange.status,
                    String::from_utf8_lossy(&exchange.body)
                ));
            }
            Ok((exchange.engine.unwrap_or_else(|| "?".into()), exchange.body))
        }
        Route::RoundRobin { targets, next, http } => {
            let target = targets[next.fetch_add(1, Ordering::Relaxed) % targets.len()];
            post_direct(http, target, body).await
        }
        Route::ApproxPrefix { targets, picker, http } => {
            // Held until the answer is read: the queue scorer counts it.
            let in_flight = picker.pick(&body);
            let answer = post_direct(http, targets[in_flight.engine()], body).await;
            drop(in_flight);
            answer
        }
    }
}

/// Posts a chat body straight to an engine: (engine name, SSE body).
async fn post_direct(
    http: &Client<HttpConnector, Full<Bytes>>,
    target: SocketAddr,
    body: Vec<u8>,
) -> Result<(String, Vec<u8>), String> {
    let request = hyper::Request::post(format!("http://{target}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = http.request(request).await.map_err(|e| format!("{target}: {e}"))?;
    let engine = response.headers().get("x-sim-engine").and_then(|v| v.to_str().ok()).unwrap_or("?").to_owned();
    let status = response.status();
    let bytes = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    if !status.is_success() {
        return Err(format!("{target} answered {status}: {}", String::from_utf8_lossy(&bytes)));
    }
    Ok((engine, bytes.to_vec()))
}

/// The reply text and (prompt, cached) tokens from an OpenAI SSE stream.
fn read_sse(sse: &[u8]) -> (String, u64, u64) {
    let text = String::from_utf8_lossy(sse);
    let (mut reply, mut prompt, mut cached) = (String::new(), 0, 0);
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
        let Ok(chunk) = serde_json::from_str::<Value>(data) else { continue };
        if let Some(piece) = chunk.pointer("/choices/0/delta/content").and_then(Value::as_str) {
            reply.push_str(piece);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            prompt = usage.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
            cached = usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0);
        }
    }
    (reply, prompt, cached)
}
