//! `kvpick demo --disagg`: disaggregated prefill/decode end to end on one
//! machine. One simulated vLLM prefill engine and two decode engines, each
//! decode engine behind a `kvpick sidecar` (in this process, the same code
//! as the subcommand), kvpick (`App`) in front with the roles in its
//! workers file, and long prompts through the miniature gateway: kvpick
//! splits them, the sidecar runs the NixlConnector legs (the prefill
//! engine computes the prompt, the decode engine pulls its KV and
//! answers). Each request's timeline is printed (pick, prefill leg, whole
//! answer), then the same requests on three aggregated engines, side by
//! side.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvpick_app::app::settings::{self as var, Values};
use kvpick_app::app::{App, ServeConfig};
use kvpick_discovery::workers_file::{self, Entry};
use kvpick_sidecar::{EngineKind, Sidecar, SidecarConfig};
use kvpick_sim::{Engine, EngineConfig, PdRole, TimeModel};
use kvpick_test_support::gateway::Gateway;
use serde_json::json;

const MODEL: &str = "sim-model";
/// Virtual time runs this much faster than the wall clock.
const TIME_SCALE: f64 = 10.0;
const PROMPT_WORDS: usize = 900;
const REPLY_TOKENS: u32 = 48;

/// One request as the client saw it.
struct Timeline {
    route: String,
    pick_ms: f64,
    prefill_ms: Option<f64>,
    total_ms: f64,
}

fn engine(name: &str, role: PdRole, seed: u64) -> EngineConfig {
    EngineConfig {
        name: name.into(),
        model: MODEL.into(),
        num_blocks: 2048,
        default_max_tokens: REPLY_TOKENS,
        seed,
        hash_seed: Some(7),
        time: TimeModel { time_scale: TIME_SCALE, ..TimeModel::default() },
        pd_role: role,
        ..EngineConfig::default()
    }
}

fn prompt(seed: u64) -> String {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..PROMPT_WORDS).map(|_| format!("w{}", rng.u32(0..5000))).collect::<Vec<_>>().join(" ")
}

/// Runs `requests` long prompts, `concurrency` at a time, through kvpick
/// on a fleet: disaggregated (1 prefill + 2 decode behind sidecars) or
/// aggregated (3 engines).
async fn run(
    disaggregated: bool,
    requests: usize,
    concurrency: usize,
    seed: u64,
) -> Result<(Vec<Timeline>, Duration), String> {
    let dir = std::env::temp_dir().join(format!("kvpick-demo-disagg-{}-{disaggregated}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let roles = if disaggregated { [PdRole::Prefill, PdRole::Decode, PdRole::Decode] } else { [PdRole::Aggregated; 3] };
    let mut engines = Vec::new();
    for (i, role) in roles.into_iter().enumerate() {
        engines.push(
            Engine::start(engine(&format!("{role}-{i}"), role, seed + i as u64)).await.map_err(|e| e.to_string())?,
        );
    }
    let mut sidecars = Vec::new();
    let mut entries = Vec::new();
    for (engine, role) in engines.iter().zip(roles) {
        let ep = engine.endpoints();
        let endpoint = if role == PdRole::Decode {
            let sidecar = Sidecar::start(SidecarConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                decode: ep.http,
                engine: EngineKind::Vllm,
                metrics_listen: None,
                ..SidecarConfig::default()
            })
            .await?;
            let front = sidecar.local_addr();
            sidecars.push(sidecar);
            front
        } else {
            ep.http
        };
        let role = match role {
            PdRole::Prefill => Some("prefill".to_owned()),
            PdRole::Decode => Some("decode".to_owned()),
            PdRole::Aggregated => None,
        };
        entries.push(Entry { role, ..Entry::new(endpoint, ep.events.clone(), Some(ep.replay.clone())) });
    }
    let file = dir.join("workers.yaml");
    workers_file::write(&file, &entries).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut values = Values::loopback_static(&file);
    values.set(var::SHARDS, "1");
    values.set(var::BLOCK_SIZE, "16");
    values.set(var::MODEL, MODEL);
    values.set(var::PD_THRESHOLD_TOKENS, "128");
    let app =
        App::start(ServeConfig::from_values(&values).map_err(|e| e.to_string())?).await.map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.workers().len() < 2 {
        if Instant::now() > deadline {
            return Err("kvpick did not take on the workers within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gateway = Gateway::connect(app.ext_proc_addr()).await.map_err(|e| e.to_string())?;
    let started = Instant::now();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..requests {
        let (gateway, gate) = (gateway.clone(), gate.clone());
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": prompt(seed ^ (n as u64) << 8)}],
            "max_tokens": REPLY_TOKENS, "stream": true})
        .to_string();
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.map_err(|e| e.to_string())?;
            let sent = Instant::now();
            let exchange = gateway.post("/v1/chat/completions", body.as_bytes()).await.map_err(|e| e.to_string())?;
            if exchange.status != 200 {
                return Err(format!("answered {}: {}", exchange.status, String::from_utf8_lossy(&exchange.body)));
            }
            Ok::<_, String>((
                n,
                Timeline {
                    route: exchange.handoff.unwrap_or_else(|| "whole".into()),
                    pick_ms: exchange.pick_time.as_secs_f64() * 1e3,
                    prefill_ms: exchange.prefill_ms,
                    total_ms: sent.elapsed().as_secs_f64() * 1e3,
                },
            ))
        });
    }
    let mut timelines: Vec<(usize, Timeline)> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        timelines.push(joined.map_err(|e| e.to_string())??);
    }
    let wall = started.elapsed();
    timelines.sort_by_key(|(n, _)| *n);
    app.shutdown().await;
    for sidecar in sidecars {
        sidecar.shutdown().await;
    }
    for engine in &engines {
        engine.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok((timelines.into_iter().map(|(_, t)| t).collect(), wall))
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[((v.len() - 1) as f64 * q).round() as usize] }
}

pub async fn demo(requests: usize, concurrency: usize, seed: u64, quiet: bool) -> Result<(), String> {
    println!(
        "kvpick demo --disagg: {requests} long prompts ({PROMPT_WORDS} words, {REPLY_TOKENS}-token answers), {concurrency} at a time; simulated vLLM with the NixlConnector protocol, time ×{TIME_SCALE}"
    );
    println!("\ndisaggregated: 1 prefill engine + 2 decode engines, each behind kvpick sidecar");
    let (split, split_wall) = run(true, requests, concurrency, seed).await?;
    if !quiet {
        println!("{:>4}  {:<14} {:>9} {:>12} {:>14}", "req", "route", "pick ms", "prefill ms", "answer ms");
        for (n, t) in split.iter().enumerate() {
            let prefill = t.prefill_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1}"));
            println!("{n:>4}  {:<14} {:>9.2} {:>12} {:>14.1}", t.route, t.pick_ms, prefill, t.total_ms);
        }
    }
    println!("\naggregated: 3 engines");
    let (whole, whole_wall) = run(false, requests, concurrency, seed).await?;
    let split_count = split.iter().filter(|t| t.route == "disaggregated").count();
    let prefill: Vec<f64> = split.iter().filter_map(|t| t.prefill_ms).collect();
    println!(
        "\n{:<15} {:>9} {:>8} {:>16} {:>16} {:>16} {:>9}",
        "fleet", "requests", "split", "prefill leg p50", "answer ms p50", "answer ms p90", "wall s"
    );
    for (name, runs, wall, prefill_p50) in [
        ("disaggregated", &split, split_wall, Some(quantile(prefill.clone(), 0.5))),
        ("aggregated", &whole, whole_wall, None),
    ] {
        let totals: Vec<f64> = runs.iter().map(|t| t.total_ms).collect();
        println!(
            "{:<15} {:>9} {:>8} {:>16} {:>16.1} {:>16.1} {:>9.1}",
            name,
            runs.len(),
            if prefill_p50.is_some() { split_count.to_string() } else { "-".into() },
            prefill_p50.map_or_else(|| "-".to_owned(), |p| format!("{p:.1}")),
            quantile(totals.clone(), 0.5),
            quantile(totals, 0.9),
            wall.as_secs_f64()
        );
    }
    println!(
        "(wall-clock milliseconds of simulated engines running ×{TIME_SCALE}; the decode pods' sidecars added the prefill legs)"
    );
    Ok(())
}
