//! A soak of disaggregated serving through the decode sidecar, per engine
//! protocol: the gateway stand-in → kvpick (`App`, in this process) → two
//! `kvpick sidecar` processes (the binary beside this one) → a simulated
//! prefill engine and two decode engines speaking vLLM's, SGLang's or
//! TensorRT-LLM's P/D protocol. Clients send long and short prompts,
//! streamed or not, and give up on a share of them at a random moment
//! (during the prefill leg, during the answer). At the end nothing may be
//! left: no request running or waiting in an engine, no blocks held for a
//! transfer, no booking in kvpick, nothing in flight in a sidecar; and the
//! sidecars' resident memory must be flat after the warm-up.
//!
//! `cargo build --release -p kvpick-app -p kvpick-perf && target/release/kvpick-soak-pd [--seconds N] [--clients N] [--cancel-share F] [--engines vllm,sglang,trtllm]`
//!
//! Exits 1 when anything leaked or memory grew past the tolerance.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kvpick_app::app::settings::{self as var, Values};
use kvpick_app::app::{App, ServeConfig};
use kvpick_discovery::workers_file::{self, Entry};
use kvpick_perf::report::{Table, cpu, load_average, utc_date};
use kvpick_sim::{Engine, EngineConfig, Flavour, PdRole, TimeModel};
use kvpick_test_support::gateway::Gateway;
use serde_json::{Value, json};

const MODEL: &str = "sim-model";

struct Options {
    seconds: u64,
    clients: usize,
    cancel_share: f64,
    flavours: Vec<Flavour>,
    kvpick: PathBuf,
    /// Resident growth of a sidecar, after the warm-up, that counts as a leak.
    rss_tolerance: f64,
}

fn options() -> Options {
    let beside = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("kvpick")));
    let mut o = Options {
        seconds: 60,
        clients: 8,
        cancel_share: 0.2,
        flavours: vec![Flavour::Vllm, Flavour::Sglang, Flavour::Trtllm],
        kvpick: beside.unwrap_or_else(|| PathBuf::from("kvpick")),
        rss_tolerance: 0.05,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        let bad = || -> ! {
            eprintln!("kvpick-soak-pd: {flag} {value:?} is not valid (see the file's header)");
            std::process::exit(2);
        };
        match flag.as_str() {
            "--seconds" => o.seconds = value.parse().unwrap_or_else(|_| bad()),
            "--clients" => o.clients = value.parse().unwrap_or_else(|_| bad()),
            "--cancel-share" => o.cancel_share = value.parse().unwrap_or_else(|_| bad()),
            "--kvpick" => o.kvpick = PathBuf::from(&value),
            "--engines" => {
                o.flavours = value.split(',').map(|f| f.trim().parse::<Flavour>().unwrap_or_else(|_| bad())).collect()
            }
            _ => bad(),
        }
    }
    o
}

fn fixture_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer/chatml")
}

fn engine(flavour: Flavour, role: PdRole, name: &str, seed: u64) -> EngineConfig {
    let base = EngineConfig {
        name: name.into(),
        model: MODEL.into(),
        num_blocks: 2048,
        default_max_tokens: 16,
        seed,
        time: TimeModel { time_scale: 20.0, ..TimeModel::default() },
        pd_role: role,
        model_dir: Some(fixture_model()),
        kv_wait_ms: 5_000,
        kv_lease_ms: 2_000,
        ..EngineConfig::default()
    };
    if flavour == Flavour::Sglang { Flavour::sglang_events(base) } else { EngineConfig { flavour, ..base } }
}

/// A `kvpick sidecar` child process.
struct SidecarProcess {
    child: Child,
    listen: SocketAddr,
    metrics: SocketAddr,
}

impl SidecarProcess {
    /// Waits for its "serving" log line without blocking the runtime the
    /// simulated engines run on.
    async fn start(
        kvpick: &Path,
        decode: SocketAddr,
        flavour: Flavour,
        bootstrap: u16,
        log: &Path,
    ) -> Result<Self, String> {
        let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(kvpick)
            .args([
                "sidecar",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--log",
                "warn,kvpick=info,kvpick_sidecar=info",
            ])
            .args([
                "--decode",
                &decode.to_string(),
                "--engine",
                &flavour.to_string(),
                "--bootstrap-port",
                &bootstrap.to_string(),
            ])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(|e| format!("cannot start {} sidecar: {e}", kvpick.display()))?;
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let serving = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["message"] == "kvpick sidecar serving");
            if let Some(v) = serving {
                let addr = |k: &str| v[k].as_str().and_then(|s| s.parse().ok()).ok_or(format!("no {k} in {v}"));
                return Ok(SidecarProcess { child, listen: addr("listen")?, metrics: addr("metrics")? });
            }
            if started.elapsed() > Duration::from_secs(20) {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the sidecar did not start; see {}", log.display()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn scrape(addr: SocketAddr) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let Ok(uri) = format!("http://{addr}/metrics").parse() else { return String::new() };
    match client.get(uri).await {
        Ok(r) => String::from_utf8_lossy(&r.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default())
            .into_owned(),
        Err(_) => String::new(),
    }
}

/// The sum of every sample of `name` (any labels).
fn family(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ') | Some(b'{')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[derive(Default)]
struct Counts {
    /// The first few failures, as the client saw them.
    failures: std::sync::Mutex<Vec<String>>,
    sent: AtomicU64,
    answered: AtomicU64,
    cancelled: AtomicU64,
    errors: AtomicU64,
    split: AtomicU64,
}

struct Outcome {
    flavour: Flavour,
    counts: Counts,
    leaks: Vec<String>,
    rss_after_warmup: u64,
    rss_end: u64,
}

async fn soak(o: &Options, flavour: Flavour, seed: u64) -> Result<Outcome, String> {
    let dir = std::env::temp_dir().join(format!("kvpick-soak-pd-{}-{flavour}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let prefill = Engine::start(engine(flavour, PdRole::Prefill, "prefill", seed)).await.map_err(|e| e.to_string())?;
    let bootstrap = prefill.endpoints().bootstrap.map_or(8998, |b| b.port());
    let mut decodes = Vec::new();
    let mut sidecars = Vec::new();
    for i in 0..2 {
        let decode = Engine::start(engine(flavour, PdRole::Decode, &format!("decode-{i}"), seed + 1 + i))
            .await
            .map_err(|e| e.to_string())?;
        let log = dir.join(format!("sidecar-{i}.log"));
        sidecars.push(SidecarProcess::start(&o.kvpick, decode.endpoints().http, flavour, bootstrap, &log).await?);
        decodes.push(decode);
    }
    let entry = |endpoint: SocketAddr, e: &Engine, role: &str| {
        let ep = e.endpoints();
        let base = Entry::for_engine(flavour, endpoint, ep.events.clone(), Some(ep.replay.clone()));
        Entry { role: Some(role.into()), ..base }
    };
    let mut entries = vec![entry(prefill.endpoints().http, &prefill, "prefill")];
    entries.extend(decodes.iter().zip(&sidecars).map(|(d, s)| entry(s.listen, d, "decode")));
    let file = dir.join("workers.json");
    workers_file::write(&file, &entries).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut values = Values::loopback_static(&file);
    values.set(var::SHARDS, "1");
    values.set(var::BLOCK_SIZE, "16");
    values.set(var::MODEL, MODEL);
    values.set(var::TOKENIZER, format!("local:{}", fixture_model().display()));
    // SGLang's decode workers (`role: decode`, `engine: sglang`) run
    // nothing whole: kvpick splits every request picked onto them itself.
    values.set(var::PD_THRESHOLD_TOKENS, "64");
    let app =
        App::start(ServeConfig::from_values(&values).map_err(|e| e.to_string())?).await.map_err(|e| e.to_string())?;
    let gateway = Gateway::connect(app.ext_proc_addr()).await.map_err(|e| e.to_string())?;

    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + Duration::from_secs(o.seconds);
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..o.clients {
        let (gateway, counts) = (gateway.clone(), counts.clone());
        let cancel_share = o.cancel_share;
        clients.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ (c as u64) << 32);
            while Instant::now() < deadline {
                let words = if rng.bool() { rng.usize(200..900) } else { rng.usize(2..40) };
                let text: Vec<String> = (0..words).map(|_| format!("w{}", rng.u32(0..3000))).collect();
                let body = json!({"model": MODEL, "messages": [{"role": "user", "content": text.join(" ")}],
                    "max_tokens": rng.u32(1..64), "stream": rng.bool()})
                .to_string();
                counts.sent.fetch_add(1, Relaxed);
                let post = gateway.post("/v1/chat/completions", body.as_bytes());
                if rng.f64() < cancel_share {
                    // Gives up somewhere between the pick and the answer's end.
                    let after = Duration::from_micros(rng.u64(0..60_000));
                    match tokio::time::timeout(after, post).await {
                        Err(_) => {
                            counts.cancelled.fetch_add(1, Relaxed);
                            continue;
                        }
                        Ok(done) => record(&counts, done),
                    }
                } else {
                    record(&counts, post.await);
                }
            }
        });
    }
    // Memory: after a fifth of the run (the pools, caches and buffers grown), and at the end.
    let warmup = Duration::from_secs(o.seconds / 5);
    tokio::time::sleep(warmup).await;
    let rss_after_warmup: u64 = sidecars.iter().map(SidecarProcess::rss).sum();
    while clients.join_next().await.is_some() {}
    let rss_end: u64 = sidecars.iter().map(SidecarProcess::rss).sum();

    // Everything must come back to nothing.
    let mut leaks = Vec::new();
    let settle = Instant::now() + Duration::from_secs(15);
    loop {
        leaks.clear();
        let kvpick = scrape(app.metrics_addr()).await;
        for family_name in ["kvpick_reservations_active", "kvpick_prefill_reservations_active"] {
            let v = family(&kvpick, family_name);
            if v != 0.0 {
                leaks.push(format!("{family_name} {v}"));
            }
        }
        for (i, s) in sidecars.iter().enumerate() {
            let v = family(&scrape(s.metrics).await, "kvpick_sidecar_inflight");
            if v != 0.0 {
                leaks.push(format!("sidecar {i} inflight {v}"));
            }
        }
        for e in std::iter::once(&prefill).chain(&decodes) {
            match e.stats().await {
                Ok(s) if s.running + s.waiting + s.held_transfers == 0 => {}
                Ok(s) => leaks.push(format!(
                    "{}: {} running, {} waiting, {} held for transfer",
                    e.name(),
                    s.running,
                    s.waiting,
                    s.held_transfers
                )),
                Err(err) => leaks.push(format!("{}: {err}", e.name())),
            }
        }
        if leaks.is_empty() || Instant::now() > settle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let splits: f64 = scrape(app.metrics_addr())
        .await
        .lines()
        .filter(|l| l.starts_with("kvpick_pd_routes_total{") && l.contains("route=\"disaggregated\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    counts.split.store(splits as u64, Relaxed);
    app.shutdown().await;
    drop(sidecars);
    prefill.shutdown().await;
    for d in &decodes {
        d.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let counts = Arc::try_unwrap(counts).unwrap_or_default();
    Ok(Outcome { flavour, counts, leaks, rss_after_warmup, rss_end })
}

fn record(
    counts: &Counts,
    done: Result<kvpick_test_support::gateway::Exchange, kvpick_test_support::gateway::GatewayError>,
) {
    match done {
        Ok(e) if e.status == 200 => {
            counts.answered.fetch_add(1, Relaxed);
        }
        other => {
            counts.errors.fetch_add(1, Relaxed);
            let seen = match other {
                Ok(e) => format!("{} {}", e.status, String::from_utf8_lossy(&e.body[..e.body.len().min(200)])),
                Err(e) => e.to_string(),
            };
            let mut failures = counts.failures.lock().unwrap_or_else(|e| e.into_inner());
            if failures.len() < 5 {
                failures.push(seen);
            }
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn main() {
    let o = options();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let outcomes = runtime.block_on(async {
        let mut all = Vec::new();
        for (i, flavour) in o.flavours.iter().enumerate() {
            match soak(&o, *flavour, 11 + i as u64).await {
                Ok(outcome) => all.push(outcome),
                Err(e) => {
                    eprintln!("kvpick-soak-pd: {flavour}: {e}");
                    std::process::exit(1);
                }
            }
        }
        all
    });
    let mut table = Table::new(
        format!(
            "P/D soak through kvpick sidecar, {} s per engine, {} clients, {:.0}% cancelled ({})",
            o.seconds,
            o.clients,
            o.cancel_share * 100.0,
            utc_date()
        ),
        &[
            "engine",
            "sent",
            "answered",
            "cancelled",
            "errors",
            "split",
            "sidecars' RSS after warm-up",
            "at the end",
            "growth",
            "left over",
        ],
    );
    let mut failed = false;
    for out in &outcomes {
        let c = &out.counts;
        let growth = out.rss_end as f64 / out.rss_after_warmup.max(1) as f64 - 1.0;
        let grew = growth > o.rss_tolerance;
        failed |= grew || !out.leaks.is_empty();
        table.row([
            out.flavour.to_string(),
            c.sent.load(Relaxed).to_string(),
            c.answered.load(Relaxed).to_string(),
            c.cancelled.load(Relaxed).to_string(),
            c.errors.load(Relaxed).to_string(),
            c.split.load(Relaxed).to_string(),
            mib(out.rss_after_warmup),
            mib(out.rss_end),
            format!("{:+.1}%{}", growth * 100.0, if grew { " (over)" } else { "" }),
            if out.leaks.is_empty() { "nothing".into() } else { out.leaks.join("; ") },
        ]);
    }
    table.note(format!(
        "memory tolerance {:+.0}% after the warm-up (a fifth of the run); {}; load average {}",
        o.rss_tolerance * 100.0,
        cpu(),
        load_average()
    ));
    println!("{table}");
    for out in &outcomes {
        for failure in out.counts.failures.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            println!("{}: a failed request: {failure}", out.flavour);
        }
    }
    if failed {
        std::process::exit(1);
    }
}
