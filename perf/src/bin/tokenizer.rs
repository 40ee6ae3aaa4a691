//! `kvpick-bench-tokenizer`: round trips per second and latency of
//! kvpick's tokenizer client (`vllm-render`, chat bodies) against a local
//! render stub, at concurrency 1 and 64, for a short and a long prompt;
//! then the in-process tokenizer (`local:PATH`) against that round trip.
//!
//! Baseline, measured in the same run against the same stub: raw HTTP POSTs
//! of the same body through a plain hyper-util pooled client that only
//! reads the answer's bytes (no JSON parsing, timeout, size cap or
//! metrics). The ratio and the added p50 are kvpick's own cost on top of
//! HTTP.
//!
//! The stub (hyper HTTP/1 on 127.0.0.1, OS-picked port) runs on its own
//! thread and single-threaded runtime, standing in for the engine; the
//! clients run on the main thread's single-threaded runtime: the numbers
//! are per client core. On a 2-core machine the two share the CPU with
//! anything else running (the load average is printed).
//!
//! The in-process tokenizer runs on a 32,000-entry byte-level BPE trained
//! at start-up (`kvpick_perf::hf_model`, a few seconds) with a ChatML
//! template; the render stub then answers that tokenizer's own ids for the
//! same body, so both paths produce the same tokens.
//!
//! Progress goes to stderr; the report (Markdown tables) to stdout.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kvpick_perf::args::{TimeBudget, parse_or_exit};
use kvpick_perf::hf_model::BenchModel;
use kvpick_perf::measure::{self, Latencies, LatencySummary, time_each};
use kvpick_perf::report::{self, Table, ratio, thousands};
use kvpick_perf::sim::{EngineConfig, Fleet};
use kvpick_router::tokenizer::{
    Api, LocalTokenizer, LocalTokenizerConfig, TokenizeRequest, Tokenizer, TokenizerConfig, TokenizerMetrics,
    TokenizerProtocol, VllmRenderTokenizer,
};
use tokio::net::TcpListener;

const BIN: &str = "kvpick-bench-tokenizer";
const CONCURRENCY: [usize; 2] = [1, 64];
/// Prompt lengths in tokens: a short chat turn and a long context.
const PROMPT_TOKENS: [usize; 2] = [1_024, 8_192];

/// Decoding alone: short, many samples.
const DECODE_BUDGET: measure::Budget =
    measure::Budget { warmup: 200, min_iters: 2_000, max_iters: 20_000, time: Duration::from_millis(200) };

type Budget = TimeBudget;

fn main() -> ExitCode {
    let args = parse_or_exit(BIN, "(only --quick applies here)");
    let budget = if args.quick {
        Budget { warmup: Duration::from_millis(100), time: Duration::from_millis(300) }
    } else {
        Budget { warmup: Duration::from_millis(500), time: Duration::from_secs(3) }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the client runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&budget)) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(problem) => {
            eprintln!("{problem}");
            ExitCode::FAILURE
        }
    }
}

/// One measured configuration.
struct Measured {
    round_trips: u64,
    elapsed: Duration,
    latency: LatencySummary,
}

impl Measured {
    fn per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 { self.round_trips as f64 / secs } else { 0.0 }
    }
}

async fn run(budget: &Budget) -> Result<String, String> {
    let load_before = report::load_average();
    let mut out = String::new();
    // `KVPICK_BENCH_LOCAL_ONLY=1`: only the in-process tokenizer's table.
    for tokens in PROMPT_TOKENS.into_iter().filter(|_| std::env::var_os("KVPICK_BENCH_LOCAL_ONLY").is_none()) {
        let answer = Bytes::from(render_answer(tokens));
        let body = Bytes::from(chat_body(tokens));
        let stub = Stub::start(answer.clone())?;
        let url = format!("http://{}", stub.addr);

        let metrics = Arc::new(TokenizerMetrics::new());
        let tokenizer = TokenizerConfig::new(TokenizerProtocol::VllmRender, url.clone())
            .build(metrics.clone())
            .map_err(|e| format!("tokenizer config: {e}"))?;
        // Same pool and TCP_NODELAY as kvpick's client.
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let raw: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
        let uri: hyper::Uri =
            format!("{url}/v1/chat/completions/render").parse().map_err(|e| format!("stub URI: {e}"))?;

        let mut table = Table::new(
            format!(
                "Tokenizer round trips, vllm-render chat, {tokens}-token prompt ({} B request, {} B answer)",
                thousands(body.len() as u64),
                thousands(answer.len() as u64)
            ),
            &["client", "concurrency", "round trips/s", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "vs raw POST"],
        );
        for concurrency in CONCURRENCY {
            kvpick_perf::progress!(BIN, "{tokens} tokens, concurrency {concurrency}: raw POSTs");
            let baseline = measure(budget, concurrency, {
                let (raw, uri, body) = (raw.clone(), uri.clone(), body.clone());
                move || {
                    let (raw, uri, body) = (raw.clone(), uri.clone(), body.clone());
                    async move { raw_post(&raw, uri, body).await.map(|len| len > 0) }
                }
            })
            .await?;
            kvpick_perf::progress!(BIN, "{tokens} tokens, concurrency {concurrency}: kvpick vllm-render");
            let ours = measure(budget, concurrency, {
                let (tokenizer, body) = (tokenizer.clone(), body.clone());
                move || {
                    let (tokenizer, body) = (tokenizer.clone(), body.clone());
                    async move {
                        let request =
                            TokenizeRequest { api: Api::ChatCompletions, body, model: "m".into(), prompt: None };
                        match tokenizer.tokenize(request).await {
                            Ok(ids) if ids.len() == tokens => Ok(true),
                            Ok(ids) => Err(format!("expected {tokens} token ids, got {}", ids.len())),
                            Err(e) => Err(format!("tokenize failed: {e}")),
                        }
                    }
                }
            })
            .await?;
            let rows = [
                ("raw POST (baseline)", &baseline, "1.00×".to_string()),
                ("kvpick vllm-render", &ours, ratio(ours.per_sec(), baseline.per_sec())),
            ];
            for (name, m, vs) in rows {
                table.row([
                    name.to_string(),
                    concurrency.to_string(),
                    thousands(m.per_sec() as u64),
                    micros(m.latency.p50),
                    micros(m.latency.p99),
                    micros(m.latency.p999),
                    micros(m.latency.max),
                    vs,
                ]);
            }
            let added = ours.latency.p50 as f64 / 1e3 - baseline.latency.p50 as f64 / 1e3;
            table.note(format!(
                "- concurrency {concurrency}: kvpick adds {added:.1} µs at p50 over a raw POST \
                 ({:.1} µs vs {:.1} µs)",
                ours.latency.p50 as f64 / 1e3,
                baseline.latency.p50 as f64 / 1e3
            ));
        }
        // Where the added time goes: decoding the answer alone, on this thread.
        let decode = time_each(&DECODE_BUDGET, |_| VllmRenderTokenizer::decode_chat(&answer).map(|ids| ids.len()));
        table.note(format!(
            "- of which decoding the answer's JSON (`decode_chat`, no I/O): p50 {} µs, p99 {} µs",
            micros(decode.p50),
            micros(decode.p99)
        ));
        let snap = metrics.snapshot();
        if snap.total_errors() > 0 {
            return Err(format!("the tokenizer recorded {} errors", snap.total_errors()));
        }
        table.note(format!(
            "- connections the stub accepted: {} (kvpick and raw pools, both keep-alive)",
            stub.connections.load(std::sync::atomic::Ordering::Relaxed)
        ));
        out.push_str(&table.to_string());
        out.push('\n');
        stub.stop();
    }
    out.push_str(&local_vs_render(budget).await?);
    out.push('\n');
    out.push_str(&format!(
        "Measured {} on {}; load average before {load_before}, after {}. \
         Client: one current-thread tokio runtime; stub: another, on its own thread. \
         Each point: {:?} warmup, then {:?}.\n",
        report::utc_date(),
        report::cpu(),
        report::load_average(),
        budget.warmup,
        budget.time,
    ));
    Ok(out)
}

/// The in-process tokenizer against the render round trip, same bodies,
/// same token ids: through the memory stub (the transport alone) and
/// through a simulated engine rendering with the same model directory (the
/// transport plus the engine tokenizing with the same library; vLLM's
/// render adds Python and jinja2 on top, so this is its lower bound).
async fn local_vs_render(budget: &Budget) -> Result<String, String> {
    kvpick_perf::progress!(BIN, "training the benchmark's tokenizer");
    let model = BenchModel::build(32_000)?;
    let metrics = Arc::new(TokenizerMetrics::new());
    let local_config = LocalTokenizerConfig { dir: model.dir().to_path_buf(), chat_template: None };
    let local = LocalTokenizer::load(&local_config, metrics.clone()).map_err(|e| format!("{e}"))?;
    let engine_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sim-engine")
        .enable_all()
        .build()
        .map_err(|e| format!("engine runtime: {e}"))?;
    let engine_config =
        EngineConfig { model: "m".into(), model_dir: Some(model.dir().to_path_buf()), ..EngineConfig::default() };
    // Started on (and kept to) its own runtime; this one is the client's.
    let fleet = engine_rt
        .spawn(async move { Fleet::start(1, &engine_config).await })
        .await
        .map_err(|e| format!("engine task: {e}"))?
        .map_err(|e| format!("engine: {e}"))?;
    let engine_url = format!("http://{}", fleet.endpoints()[0].http);
    let mut table = Table::new(
        format!(
            "In-process tokenizer (`local:`, {}-entry byte-level BPE, ChatML) against the vllm-render round trip, chat bodies",
            thousands(model.vocab_size as u64)
        ),
        &["prompt tokens", "path", "concurrency", "per s", "p50 µs", "p99 µs", "p50 ÷ local's"],
    );
    for (i, target) in PROMPT_TOKENS.into_iter().enumerate() {
        let body = |words: usize| {
            let text = model.language.text(words, 17 + i as u64);
            Bytes::from(
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 16})
                    .to_string(),
            )
        };
        // Words for about `target` tokens: measured, then scaled once.
        let probe = local.tokenize_body(Api::ChatCompletions, &body(target)).map_err(|e| format!("local: {e}"))?;
        let body = body(target * target / probe.len().max(1));
        let ids = local.tokenize_body(Api::ChatCompletions, &body).map_err(|e| format!("local: {e}"))?;
        let tokens = ids.len();
        let stub = Stub::start(Bytes::from(render_answer_of(&ids)))?;
        let client = |url: String| {
            TokenizerConfig::new(TokenizerProtocol::VllmRender, url)
                .build(Arc::new(TokenizerMetrics::new()))
                .map_err(|e| format!("tokenizer config: {e}"))
        };
        let (to_stub, to_engine) = (client(format!("http://{}", stub.addr))?, client(engine_url.clone())?);
        kvpick_perf::progress!(BIN, "{tokens} tokens: local, inline");
        let inline = time_each(&LOCAL_BUDGET, |_| local.tokenize_body(Api::ChatCompletions, &body).map(|v| v.len()));
        table.row([
            thousands(tokens as u64),
            "local, on the calling thread".into(),
            "1".into(),
            thousands((1e9 / inline.p50.max(1) as f64) as u64),
            micros(inline.p50),
            micros(inline.p99),
            "1.00×".into(),
        ]);
        for concurrency in CONCURRENCY {
            let mut local_p50 = None;
            for (name, tokenizer) in [
                ("local, through Tokenizer::tokenize", Arc::new(local.clone()) as Arc<dyn Tokenizer>),
                ("vllm-render, memory stub (transport only)", to_stub.clone()),
                ("vllm-render, engine tokenizing (sim, same model)", to_engine.clone()),
            ] {
                kvpick_perf::progress!(BIN, "{tokens} tokens, concurrency {concurrency}: {name}");
                let m = measure(budget, concurrency, {
                    let (tokenizer, body, want) = (tokenizer.clone(), body.clone(), ids.clone());
                    move || {
                        let (tokenizer, body, want) = (tokenizer.clone(), body.clone(), want.clone());
                        async move {
                            let request =
                                TokenizeRequest { api: Api::ChatCompletions, body, model: "m".into(), prompt: None };
                            match tokenizer.tokenize(request).await {
                                Ok(got) if got == want => Ok(true),
                                Ok(got) => Err(format!("expected the local ids ({tokens}), got {} others", got.len())),
                                Err(e) => Err(format!("tokenize failed: {e}")),
                            }
                        }
                    }
                })
                .await?;
                let base = *local_p50.get_or_insert(m.latency.p50);
                table.row([
                    thousands(tokens as u64),
                    name.into(),
                    concurrency.to_string(),
                    thousands(m.per_sec() as u64),
                    micros(m.latency.p50),
                    micros(m.latency.p99),
                    ratio(m.latency.p50 as f64, base as f64),
                ]);
            }
        }
        stub.stop();
    }
    let _ = engine_rt.spawn(async move { fleet.shutdown().await }).await;
    engine_rt.shutdown_background();
    table.note(format!(
        "- local bodies over {} B are tokenized on tokio's blocking pool, shorter ones inline (on the client's \
         one runtime thread here); the stub answers precomputed ids from memory on its own thread; the simulated \
         engine (its own runtime thread) renders the template and tokenizes with the same model directory and \
         library, so its row is a lower bound for a vLLM render (Python, jinja2)",
        kvpick_router::tokenizer::local::INLINE_MAX_BODY_BYTES
    ));
    Ok(table.to_string())
}

/// Local tokenizing alone: fewer, longer samples than decoding.
const LOCAL_BUDGET: measure::Budget =
    measure::Budget { warmup: 20, min_iters: 200, max_iters: 5_000, time: Duration::from_millis(500) };

/// vLLM's render answer for these token ids.
fn render_answer_of(ids: &[u32]) -> String {
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    format!(
        r#"{{"request_id":"render-1","token_ids":[{}],"features":null,"sampling_params":{{"max_tokens":16}},"model":"m","stream":false,"stream_options":null,"cache_salt":null,"priority":0,"kv_transfer_params":null}}"#,
        ids.join(",")
    )
}

/// Runs `concurrency` tasks looping on `op` for the warmup, then for the
/// timed budget, recording each call's latency. Throughput counts until the
/// last task has finished its last call.
async fn measure<F, Fut>(budget: &Budget, concurrency: usize, op: F) -> Result<Measured, String>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<bool, String>> + Send + 'static,
{
    let mut measured = None;
    for time in [budget.warmup, budget.time] {
        let started = Instant::now();
        let deadline = started + time;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let op = op.clone();
            tasks.spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let start = Instant::now();
                    if !op().await? {
                        return Err("empty answer".to_string());
                    }
                    latencies.push(start.elapsed());
                }
                Ok::<_, String>(latencies)
            });
        }
        let mut all = Latencies::default();
        let mut round_trips = 0u64;
        while let Some(joined) = tasks.join_next().await {
            for latency in joined.map_err(|e| format!("benchmark task: {e}"))?? {
                all.record(latency);
                round_trips += 1;
            }
        }
        measured = Some(Measured { round_trips, elapsed: started.elapsed(), latency: all.summary() });
    }
    measured.ok_or_else(|| "nothing measured".to_string())
}

/// The baseline: POST and read the answer's bytes, nothing else.
async fn raw_post(client: &Client<HttpConnector, Full<Bytes>>, uri: hyper::Uri, body: Bytes) -> Result<usize, String> {
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = hyper::Method::POST;
    *request.uri_mut() = uri;
    request
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    let response = client.request(request).await.map_err(|e| format!("raw POST: {e}"))?;
    let bytes = response.into_body().collect().await.map_err(|e| format!("raw POST body: {e}"))?.to_bytes();
    Ok(bytes.len())
}

fn micros(nanos: u64) -> String {
    format!("{:.1}", nanos as f64 / 1e3)
}

/// A chat body whose user message is `tokens` short words.
fn chat_body(tokens: usize) -> String {
    let words: Vec<String> = (0..tokens).map(|i| format!("w{}", i % 997)).collect();
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}],"max_tokens":16}}"#, words.join(" "))
}

/// vLLM's render answer (`GenerateRequest`) for a `tokens`-token prompt.
fn render_answer(tokens: usize) -> String {
    let ids: Vec<String> = (0..tokens).map(|i| (100 + (i * 7919) % 150_000).to_string()).collect();
    format!(
        r#"{{"request_id":"render-1","token_ids":[{}],"features":null,"sampling_params":{{"max_tokens":16,"temperature":1.0,"top_p":1.0}},"model":"m","stream":false,"stream_options":null,"cache_salt":null,"priority":0,"kv_transfer_params":null}}"#,
        ids.join(",")
    )
}

/// The render stub: answers every POST with the same bytes, on its own
/// thread and runtime, on 127.0.0.1 only.
struct Stub {
    addr: SocketAddr,
    connections: Arc<std::sync::atomic::AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stub {
    fn start(answer: Bytes) -> Result<Stub, String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("stub bind: {e}"))?;
        listener.set_nonblocking(true).map_err(|e| format!("stub socket: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("stub address: {e}"))?;
        let connections = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let counted = connections.clone();
        let thread = std::thread::Builder::new()
            .name("render-stub".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    eprintln!("[{BIN}] the stub's runtime did not start");
                    return;
                };
                runtime.block_on(serve(listener, answer, counted, stopped));
            })
            .map_err(|e| format!("stub thread: {e}"))?;
        Ok(Stub { addr, connections, stop: Some(stop), thread: Some(thread) })
    }

    fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    answer: Bytes,
    connections: Arc<std::sync::atomic::AtomicU64>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else { return };
    let mut open = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { break };
                let _ = stream.set_nodelay(true);
                connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let answer = answer.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let answer = answer.clone();
                    async move {
                        // Read the request like an engine would, then answer.
                        let _ = request.into_body().collect().await;
                        Ok::<_, Infallible>(Response::new(Full::new(answer)))
                    }
                });
                open.spawn(async move {
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
                while open.try_join_next().is_some() {}
            }
        }
    }
    // Dropping the set aborts the open connections.
}
