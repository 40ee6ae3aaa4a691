//! `kvpick-bench-extproc`: ext_proc round trips through kvpick's real
//! server, as a gateway drives them, at concurrency 1, 16 and 64 on one
//! HTTP/2 connection, with a 1,000-token chat prompt and an in-process
//! tokenizer (`kvpick_test_support::WordTokenizer`).
//!
//! One round trip is a whole request's ext_proc life: request headers and
//! body (end of stream) → the pick (headers answer) and the body echoed →
//! response headers → a first-token chunk and a last chunk, each echoed →
//! the stream closed. The shortest streamed answer there is, so the pick's
//! share of the per-request work is as large as it gets.
//! Latency is the request path (headers sent → pick and echo received),
//! what a gateway adds to time-to-first-token; requests/s counts whole
//! round trips.
//!
//! Baselines, same process and same run: the same server with the null
//! picker (the first endpoint; no tokenizing, hashing or selection), and
//! with the null picker tokenizing each body and dropping the tokens. The
//! ratio of server CPU per request (the server's runtime thread plus the
//! shard thread, from `/proc/self/task/*/schedstat`) to the first is what
//! kvpick's pick costs on top of the protocol work; to the second, what
//! hashing, selection and the hand-off to the shard cost on top of the
//! tokenizer.
//!
//! kvpick runs twice, on the default shard kind and on the other one
//! (inline shards and a shard thread), in the same run: what decides
//! `RuntimeChoice::Auto`.
//!
//! Threads: the server's tokio runtime (1 thread, `kvpick-io`, which also
//! runs an inline shard), a shard thread for the threaded kind
//! (`kvpick-shard-0`, unpinned), the load generator's runtime (1 thread,
//! `bench-client`): on a 2-core machine they share both cores with
//! anything else running (the load average is printed).
//!
//! `KVPICK_BENCH_TRACING=1` measures request tracing instead (see
//! `tracing_cost.rs`), `KVPICK_BENCH_TOKENIZER=1` the in-process tokenizer
//! against the render round trip (see `tokenizer_cost.rs`).
//!
//! Progress goes to stderr; the report (Markdown tables) to stdout.

mod rounds;
mod tokenizer_cost;
mod tracing_cost;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvpick_core::{RouterConfig, WorkerId, WorkerSpec};
use kvpick_ext_proc::{ExtProcConfig, ExtProcMetrics, ExtProcServer};
use kvpick_perf::args::{TimeBudget, parse_or_exit};
use kvpick_perf::measure::{Latencies, LatencySummary};
use kvpick_perf::report::{self, Table, at_least, at_most, thousands};
use kvpick_perf::setup::raw_header_map;
use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use kvpick_proto::ext_proc::mode::BodySendMode;
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::processing_response::Response;
use kvpick_proto::ext_proc::{HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration};
use kvpick_router::tokenizer::Tokenizer;
use kvpick_router::{KvPicker, NullPicker, Picker, PickerConfig};
use kvpick_runtime::{Clock, RuntimeChoice, RuntimeConfig, RuntimeKind, ShardedService, ThreadProducers};
use kvpick_test_support::WordTokenizer;
use tokio::sync::mpsc;
use tonic::transport::Channel;

const BIN: &str = "kvpick-bench-extproc";
const CONCURRENCY: [usize; 3] = [1, 16, 64];
const PROMPT_TOKENS: usize = 1_000;
/// Of which a shared system prompt, cached on some workers.
const SYSTEM_TOKENS: usize = 600;
const SYSTEM_PROMPTS: usize = 4;
const WORKERS: u64 = 8;
const BLOCK_SIZE: u32 = 16;
/// Distinct request bodies cycled through.
const BODIES: usize = 512;
const FIRST_TOKEN: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const LAST_CHUNK: &[u8] =
    b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
/// A round trip slower than this counts as failed (a stuck shard, say).
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(5);

/// Issue #24's targets for a co-located client: kvpick's server CPU per
/// request and requests/s against the "null picker + tokenize" server's,
/// and the `select` phase (hand-off, pick, booking, reply).
const TARGET_CPU_RATIO: f64 = 1.05;
const TARGET_RPS_RATIO: f64 = 0.97;
const TARGET_SELECT_P50_MICROS: f64 = 20.0;
const TARGET_SELECT_P99_MICROS: f64 = 200.0;

type Budget = TimeBudget;

fn main() -> ExitCode {
    let args = parse_or_exit(BIN, "(only --quick applies here)");
    let budget = if args.quick {
        Budget { warmup: Duration::from_millis(200), time: Duration::from_millis(500) }
    } else {
        Budget { warmup: Duration::from_millis(500), time: Duration::from_secs(3) }
    };
    let report = if std::env::var_os("KVPICK_BENCH_TRACING").is_some() {
        tracing_cost::run(&budget, if args.quick { 1 } else { 3 })
    } else if std::env::var_os("KVPICK_BENCH_TOKENIZER").is_some() {
        tokenizer_cost::run(&budget, if args.quick { 1 } else { 3 })
    } else {
        run(&budget)
    };
    match report {
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

fn runtime(name: &str) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the {name} runtime: {e}"))
}

fn endpoint(worker: u64) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 10 + worker as u8], 8000))
}

/// `n` words `{prefix}{i}`: one token each for the word tokenizer.
fn words(prefix: &str, n: usize) -> String {
    (0..n).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>().join(" ")
}

fn chat_body(content: &str) -> Bytes {
    let body = serde_json::json!({
        "model": "bench-model",
        "messages": [{"role": "user", "content": content}],
        "stream": true,
    });
    Bytes::from(body.to_string())
}

/// The workload: bodies sharing one of a few system prompts, and the
/// system prompts themselves (to cache on workers).
fn workload() -> (Vec<Bytes>, Vec<String>) {
    let systems: Vec<String> = (0..SYSTEM_PROMPTS).map(|s| words(&format!("sys{s}-"), SYSTEM_TOKENS)).collect();
    let bodies = (0..BODIES)
        .map(|i| {
            let question = words(&format!("q{i}-"), PROMPT_TOKENS - SYSTEM_TOKENS);
            chat_body(&format!("{} {question}", systems[i % SYSTEM_PROMPTS]))
        })
        .collect();
    (bodies, systems)
}

/// Total on-CPU time of this process's threads whose name starts with one
/// of `prefixes` (`/proc/self/task/*/schedstat`, nanoseconds).
fn cpu_nanos(prefixes: &[&str]) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| prefixes.iter().any(|p| comm.trim_end().starts_with(p)))
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The server's threads: its I/O runtime, and the span exporter's when
/// tracing is on (idle otherwise).
const SERVER_THREADS: [&str; 3] = ["kvpick-io", EXPORTER_THREADS[0], EXPORTER_THREADS[1]];
/// The OpenTelemetry SDK's batch thread (`comm` keeps the first 15 bytes
/// of "OpenTelemetry.Traces.BatchProcessor") and the exporter's gRPC
/// runtime.
const EXPORTER_THREADS: [&str; 2] = ["OpenTelemetry", "kvpick-otlp"];
const SHARD_THREADS: [&str; 1] = ["kvpick-shard"];

struct Measured {
    round_trips: u64,
    failures: u64,
    elapsed: Duration,
    latency: LatencySummary,
    io_cpu: Duration,
    shard_cpu: Duration,
    /// Of `io_cpu`, the span exporter's threads.
    exporter_cpu: Duration,
}

impl Measured {
    fn per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 { self.round_trips as f64 / secs } else { 0.0 }
    }

    fn per_request(&self, cpu: Duration) -> f64 {
        if self.round_trips == 0 { 0.0 } else { cpu.as_secs_f64() * 1e6 / self.round_trips as f64 }
    }

    /// Server CPU (I/O runtime and shards) per round trip, µs.
    fn cpu_micros_per_request(&self) -> f64 {
        self.per_request(self.io_cpu + self.shard_cpu)
    }

    /// Interleaved rounds of one server as one: counts, time and CPU
    /// summed, each latency quantile the median round's (a round that ran
    /// while the machine was busy moves it least).
    fn merge(rounds: &[Measured]) -> Measured {
        let quantile = |of: fn(&LatencySummary) -> u64| {
            rounds::Sum::median(&rounds.iter().map(|m| of(&m.latency)).collect::<Vec<_>>())
        };
        Measured {
            round_trips: rounds.iter().map(|m| m.round_trips).sum(),
            failures: rounds.iter().map(|m| m.failures).sum(),
            elapsed: rounds.iter().map(|m| m.elapsed).sum(),
            latency: LatencySummary {
                count: rounds.iter().map(|m| m.latency.count).sum(),
                p50: quantile(|l| l.p50),
                p99: quantile(|l| l.p99),
                p999: quantile(|l| l.p999),
                mean: rounds.iter().map(|m| m.latency.mean).sum::<f64>() / rounds.len().max(1) as f64,
                max: rounds.iter().map(|m| m.latency.max).max().unwrap_or(0),
            },
            io_cpu: rounds.iter().map(|m| m.io_cpu).sum(),
            shard_cpu: rounds.iter().map(|m| m.shard_cpu).sum(),
            exporter_cpu: rounds.iter().map(|m| m.exporter_cpu).sum(),
        }
    }
}

/// What every run of this benchmark starts from: the runtimes, one shard
/// with the workers and their cached system prompts, the workload, and
/// kvpick's picker over them.
struct Bench {
    server_rt: tokio::runtime::Runtime,
    client_rt: tokio::runtime::Runtime,
    service: Arc<ShardedService>,
    /// The same shard on the other kind (a shard thread when the default
    /// is inline, inline otherwise), measured beside `service` in the same
    /// run: what decides the default.
    other: Arc<ShardedService>,
    bodies: Vec<Bytes>,
    /// Shard runtime, spin before park.
    kind: RuntimeKind,
    spin: Duration,
    tokenizer: Arc<dyn Tokenizer>,
    picker: PickerConfig,
    clock: Clock,
}

impl Bench {
    fn kv_picker(&self, metrics: Arc<ExtProcMetrics>) -> KvPicker {
        self.kv_picker_on(&self.service, metrics)
    }

    fn kv_picker_on(&self, service: &Arc<ShardedService>, metrics: Arc<ExtProcMetrics>) -> KvPicker {
        KvPicker::new(service.clone(), self.clock.clone(), self.tokenizer.clone(), &self.picker, metrics)
    }

    fn shutdown(&self) {
        self.service.shutdown();
        self.other.shutdown();
    }

    fn server_config() -> ExtProcConfig {
        ExtProcConfig { listen: SocketAddr::from(([127, 0, 0, 1], 0)), ..ExtProcConfig::default() }
    }

    /// The setup line of the report.
    fn setup_note(&self) -> String {
        format!(
            "- {WORKERS} workers, block size {BLOCK_SIZE}, {SYSTEM_PROMPTS} system prompts of {SYSTEM_TOKENS} tokens each \
             cached on 2 workers; shard runtime: {:?}, 1 shard, spin before park {} µs; server runtime 1 thread, \
             client runtime 1 thread",
            self.kind,
            self.spin.as_micros()
        )
    }
}

fn setup() -> Result<Bench, String> {
    let server_rt = runtime("kvpick-io")?;
    let client_rt = runtime("bench-client")?;
    let clock = Clock::system();
    // `KVPICK_SHARD_RUNTIME=inline|std|glommio` forces the first kvpick's
    // shard kind (default: auto).
    let choice = match std::env::var("KVPICK_SHARD_RUNTIME").as_deref() {
        Ok("inline") => RuntimeChoice::Force(RuntimeKind::Inline),
        Ok("std") => RuntimeChoice::Force(RuntimeKind::StdThreads),
        Ok("glommio") => RuntimeChoice::Force(RuntimeKind::Glommio),
        _ => RuntimeChoice::Auto,
    };
    // `KVPICK_SHARD_SPIN_US=n` sets how long the shard (and a caller
    // waiting on it) polls before parking (default: the runtime's 50 µs).
    let mut shards = RuntimeConfig { shards: 1, cpus: Vec::new(), choice, ..RuntimeConfig::default() };
    if let Some(micros) = std::env::var("KVPICK_SHARD_SPIN_US").ok().and_then(|v| v.parse().ok()) {
        shards.spin_before_park = Duration::from_micros(micros);
    }
    let spin = shards.spin_before_park;
    let start = |runtime| {
        ShardedService::start(RouterConfig::default(), BLOCK_SIZE, runtime, clock.clone())
            .map(Arc::new)
            .map_err(|e| format!("shards: {e}"))
    };
    let service = start(shards.clone())?;
    let kind = service.kind();
    let other_kind = if kind == RuntimeKind::Inline { RuntimeKind::StdThreads } else { RuntimeKind::Inline };
    let other = start(RuntimeConfig { choice: RuntimeChoice::Force(other_kind), ..shards })?;
    let (bodies, systems) = workload();
    server_rt.block_on(populate(&service, &clock, &systems))?;
    server_rt.block_on(populate(&other, &clock, &systems))?;
    // `KVPICK_BENCH_RING_PER_PUSH=1`: every pick rings its shard (what
    // ringing once per batch saves).
    let ring_per_batch = std::env::var_os("KVPICK_BENCH_RING_PER_PUSH").is_none();
    let picker = PickerConfig { ring_per_batch, ..PickerConfig::default() };
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(WordTokenizer);
    Ok(Bench { server_rt, client_rt, service, other, bodies, kind, spin, tokenizer, picker, clock })
}

fn run(budget: &Budget) -> Result<String, String> {
    let load_before = report::load_average();
    let bench = setup()?;
    let Bench { server_rt, client_rt, bodies, tokenizer, .. } = &bench;
    let config = Bench::server_config();
    let kv_metrics = Arc::new(ExtProcMetrics::new());
    let kv = Picker::Kv(bench.kv_picker(kv_metrics.clone()));
    let other_metrics = Arc::new(ExtProcMetrics::new());
    let other = Picker::Kv(bench.kv_picker_on(&bench.other, other_metrics.clone()));
    let names = [kvpick_name(bench.service.kind()), kvpick_name(bench.other.kind())];
    let null = NullPicker::new((0..WORKERS).map(endpoint).collect::<Vec<_>>());
    let null_tokenizing = Picker::Null(null.clone().tokenizing(tokenizer.clone()));
    let null = Picker::Null(null);
    let servers = server_rt.block_on(async {
        let spawn = |picker, metrics| ExtProcServer::new(config.clone(), picker, metrics).spawn();
        let null = spawn(null, Arc::new(ExtProcMetrics::new())).await;
        let tokenizing = spawn(null_tokenizing, Arc::new(ExtProcMetrics::new())).await;
        let kv = spawn(kv, kv_metrics.clone()).await;
        let other = spawn(other, other_metrics.clone()).await;
        [null, tokenizing, kv, other].map(|s| s.map_err(|e| format!("server: {e}")))
    });
    let [null_server, tokenizing_server, kv_server, other_server] = servers;
    let (null_server, tokenizing_server, kv_server, other_server) =
        (null_server?, tokenizing_server?, kv_server?, other_server?);

    let mut table = Table::new(
        format!(
            "ext_proc round trips, {PROMPT_TOKENS}-token chat prompt ({} B body), one HTTP/2 connection",
            thousands(bodies[0].len() as u64)
        ),
        &[
            "picker",
            "concurrency",
            "requests/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "server CPU µs/req",
            "of which shard",
            "failed",
        ],
    );
    // For profiling one side alone: `KVPICK_BENCH_PICKER=null|null+tokenize|kvpick|kvpick-other`,
    // `KVPICK_BENCH_CONCURRENCY=16` (ratios need all pickers).
    let only_picker = std::env::var("KVPICK_BENCH_PICKER").ok();
    let only_concurrency: Option<usize> = std::env::var("KVPICK_BENCH_CONCURRENCY").ok().and_then(|v| v.parse().ok());
    // `KVPICK_BENCH_ROUNDS=n` (default 3): interleaved rounds per point.
    let rounds: usize = std::env::var("KVPICK_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let mut ratios = Vec::new();
    for concurrency in CONCURRENCY.into_iter().filter(|c| only_concurrency.is_none_or(|o| o == *c)) {
        let mut runs = Vec::new();
        let pickers = [
            ("null picker (baseline)", "null", &null_server),
            ("null picker + tokenize", "null+tokenize", &tokenizing_server),
            (names[0], "kvpick", &kv_server),
            (names[1], "kvpick-other", &other_server),
        ];
        let pickers: Vec<_> = pickers.into_iter().filter(|p| only_picker.as_deref().is_none_or(|o| o == p.1)).collect();
        let mut measured: Vec<Vec<Measured>> = pickers.iter().map(|_| Vec::new()).collect();
        for round in 1..=rounds {
            for ((name, _, server), runs) in pickers.iter().zip(measured.iter_mut()) {
                kvpick_perf::progress!(BIN, "concurrency {concurrency}, round {round}/{rounds}: {name}");
                runs.push(client_rt.block_on(measure(server.local_addr(), concurrency, budget, bodies))?);
            }
        }
        for ((name, _, _), rounds) in pickers.iter().zip(measured) {
            let measured = Measured::merge(&rounds);
            table.row([
                name.to_string(),
                concurrency.to_string(),
                thousands(measured.per_sec() as u64),
                micros(measured.latency.p50),
                micros(measured.latency.p99),
                micros(measured.latency.p999),
                format!("{:.1}", measured.cpu_micros_per_request()),
                format!("{:.1}", measured.per_request(measured.shard_cpu)),
                measured.failures.to_string(),
            ]);
            runs.push(measured);
        }
        ratios.push((concurrency, runs));
    }
    let load_after = report::load_average();

    for (concurrency, runs) in ratios.iter() {
        let [null, tokenizing, default, other] = &runs[..] else { continue };
        for (name, ours) in names.into_iter().zip([default, other]) {
            table.note(ratio_note(*concurrency, name, ours, null, tokenizing));
        }
    }
    for (name, metrics) in names.into_iter().zip([&kv_metrics, &other_metrics]) {
        let snapshot = metrics.snapshot();
        let (tokenize, select) = (&snapshot.tokenize_micros, &snapshot.select_micros);
        let (p50, p99) = (select.value_at_quantile(0.5), select.value_at_quantile(0.99));
        table.note(format!(
            "- inside {name}'s pick, all concurrencies: tokenize p50 {} µs / p99 {} µs, select p50 {p50} µs ({}) / \
             p99 {p99} µs ({})",
            tokenize.value_at_quantile(0.5),
            tokenize.value_at_quantile(0.99),
            at_most(p50 as f64, TARGET_SELECT_P50_MICROS),
            at_most(p99 as f64, TARGET_SELECT_P99_MICROS),
        ));
    }
    table.note(format!(
        "- {rounds} interleaved rounds of {} ms per point: counts and CPU summed, latencies the median round's",
        budget.time.as_millis()
    ));
    table.note(bench.setup_note());
    table.note(machine_note(&load_before, &load_after));

    server_rt.block_on(async {
        for server in [other_server, kv_server, tokenizing_server, null_server] {
            let _ = server.shutdown().await;
        }
    });
    bench.shutdown();
    Ok(table.to_string())
}

/// Upserts the workers and caches each system prompt on two of them.
async fn populate(service: &Arc<ShardedService>, clock: &Clock, systems: &[String]) -> Result<(), String> {
    let producers = ThreadProducers::new(service.clone());
    for w in 0..WORKERS {
        let spec = WorkerSpec::new(WorkerId(w + 1), endpoint(w), BLOCK_SIZE);
        service.upsert_worker(&producers, spec, clock.now()).await.map_err(|e| format!("worker: {e}"))?;
    }
    let mut producer = service.producer();
    for (s, system) in systems.iter().enumerate() {
        let tokens = WordTokenizer::tokens(&chat_body(system)).map_err(|e| format!("tokenize: {e}"))?;
        for copy in 0..2u64 {
            let worker = (s as u64 * 2 + copy) % WORKERS + 1;
            let event = kvpick_perf::setup::cached_prompt(worker, s as u64, &tokens, BLOCK_SIZE);
            service.apply_kv_event(&mut producer, WorkerId(worker), event).map_err(|e| format!("event: {e}"))?;
        }
    }
    // Events are fire-and-forget: a query through the same ring is answered
    // only after them.
    let _ = producers.service().loads(&std::sync::Mutex::new(producer)).await;
    Ok(())
}

/// A kvpick row's name: its shard kind.
fn kvpick_name(kind: RuntimeKind) -> &'static str {
    match kind {
        RuntimeKind::Inline => "kvpick, inline shard",
        RuntimeKind::StdThreads => "kvpick, shard thread",
        RuntimeKind::Glommio => "kvpick, glommio shard",
    }
}

/// One kvpick row against the two baselines of its concurrency.
fn ratio_note(concurrency: usize, name: &str, ours: &Measured, null: &Measured, tokenizing: &Measured) -> String {
    let cpu = |m: &Measured| m.cpu_micros_per_request().max(f64::MIN_POSITIVE);
    let rate = |m: &Measured| m.per_sec().max(f64::MIN_POSITIVE);
    let (cpu_ratio, rps_ratio) = (cpu(ours) / cpu(tokenizing), ours.per_sec() / rate(tokenizing));
    format!(
        "- concurrency {concurrency}: {name} / null + tokenize = {cpu_ratio:.2}× server CPU per request ({}), \
         {rps_ratio:.2}× requests/s ({}); / null = {:.2}× CPU, {:.2}× requests/s, +{:.1} µs at p50",
        at_most(cpu_ratio, TARGET_CPU_RATIO),
        at_least(rps_ratio, TARGET_RPS_RATIO),
        cpu(ours) / cpu(null),
        ours.per_sec() / rate(null),
        (ours.latency.p50 as f64 - null.latency.p50 as f64) / 1e3,
    )
}

/// The report's last line: the machine, its load around the run, the date.
fn machine_note(load_before: &str, load_after: &str) -> String {
    format!("- {}, load average before {load_before}, after {load_after}; {}", report::cpu(), report::utc_date())
}

fn micros(nanos: u64) -> String {
    format!("{:.0}", nanos as f64 / 1e3)
}

struct Shared {
    measuring: AtomicBool,
    stop: AtomicBool,
    done: AtomicU64,
    failures: AtomicU64,
}

async fn measure(addr: SocketAddr, concurrency: usize, budget: &Budget, bodies: &[Bytes]) -> Result<Measured, String> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("uri: {e}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let shared = Arc::new(Shared {
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        done: AtomicU64::new(0),
        failures: AtomicU64::new(0),
    });
    let bodies: Arc<[Bytes]> = bodies.into();
    let mut tasks = Vec::with_capacity(concurrency);
    for task in 0..concurrency {
        let (client, shared, bodies) = (ExternalProcessorClient::new(channel.clone()), shared.clone(), bodies.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = client;
            let mut latencies = Vec::new();
            let mut i = task * 7919;
            while !shared.stop.load(Ordering::Relaxed) {
                let body = bodies[i % bodies.len()].clone();
                i += 1;
                match tokio::time::timeout(ROUND_TRIP_TIMEOUT, round_trip(&mut client, body)).await {
                    Ok(Ok(request_path)) => {
                        if shared.measuring.load(Ordering::Relaxed) {
                            latencies.push(request_path);
                            shared.done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(Err(_)) | Err(_) => {
                        shared.failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies
        }));
    }
    tokio::time::sleep(budget.warmup).await;
    let (io_before, shard_before) = (cpu_nanos(&SERVER_THREADS), cpu_nanos(&SHARD_THREADS));
    let exporter_before = cpu_nanos(&EXPORTER_THREADS);
    let started = Instant::now();
    shared.measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(budget.time).await;
    shared.measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let (io_after, shard_after) = (cpu_nanos(&SERVER_THREADS), cpu_nanos(&SHARD_THREADS));
    let exporter_after = cpu_nanos(&EXPORTER_THREADS);
    let round_trips = shared.done.load(Ordering::Relaxed);
    shared.stop.store(true, Ordering::Relaxed);
    let mut all = Latencies::default();
    for task in tasks {
        for latency in task.await.map_err(|e| format!("client task: {e}"))? {
            all.record(latency);
        }
    }
    Ok(Measured {
        round_trips,
        failures: shared.failures.load(Ordering::Relaxed),
        elapsed,
        latency: all.summary(),
        io_cpu: Duration::from_nanos(io_after.saturating_sub(io_before)),
        shard_cpu: Duration::from_nanos(shard_after.saturating_sub(shard_before)),
        exporter_cpu: Duration::from_nanos(exporter_after.saturating_sub(exporter_before)),
    })
}

fn message(request: Request, protocol_config: Option<ProtocolConfiguration>) -> ProcessingRequest {
    ProcessingRequest { request: Some(request), protocol_config, ..Default::default() }
}

/// One request's whole ext_proc life; returns the request-path latency.
async fn round_trip(client: &mut ExternalProcessorClient<Channel>, body: Bytes) -> Result<Duration, String> {
    let (tx, rx) = mpsc::channel::<ProcessingRequest>(4);
    let outbound = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let protocol = ProtocolConfiguration {
        request_body_mode: BodySendMode::FullDuplexStreamed as i32,
        response_body_mode: BodySendMode::FullDuplexStreamed as i32,
        send_body_without_waiting_for_header_response: true,
    };
    let start = Instant::now();
    let send = |m| tx.try_send(m).map_err(|e| format!("send: {e}"));
    send(message(
        Request::RequestHeaders(HttpHeaders {
            headers: Some(raw_header_map(&[(":method", "POST"), (":path", "/v1/chat/completions")])),
            end_of_stream: false,
            ..Default::default()
        }),
        Some(protocol),
    ))?;
    send(message(
        Request::RequestBody(HttpBody { body: body.to_vec(), end_of_stream: true, ..Default::default() }),
        None,
    ))?;
    let mut answers = client.process(outbound).await.map_err(|e| format!("open: {e}"))?.into_inner();
    let mut next = async || -> Result<ProcessingResponse, String> {
        answers.message().await.map_err(|e| format!("answer: {e}"))?.ok_or_else(|| "stream ended early".to_string())
    };
    if !matches!(next().await?.response, Some(Response::RequestHeaders(_))) {
        return Err("expected the pick".into());
    }
    next().await?;
    let request_path = start.elapsed();
    send(message(
        Request::ResponseHeaders(HttpHeaders {
            headers: Some(raw_header_map(&[(":status", "200"), ("content-type", "text/event-stream")])),
            end_of_stream: false,
            ..Default::default()
        }),
        None,
    ))?;
    next().await?;
    // A short streamed answer: the first token (prefill done), then the end.
    for (chunk, end) in [(FIRST_TOKEN, false), (LAST_CHUNK, true)] {
        send(message(
            Request::ResponseBody(HttpBody { body: chunk.to_vec(), end_of_stream: end, ..Default::default() }),
            None,
        ))?;
        next().await?;
    }
    drop(tx);
    match answers.message().await {
        Ok(None) => Ok(request_path),
        other => Err(format!("expected the end of the stream, got {other:?}")),
    }
}
