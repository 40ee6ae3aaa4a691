//! `KVPICK_BENCH_TOKENIZER=1`: the ext_proc server's CPU per request with
//! the in-process tokenizer (`local:`) against the engine's render round
//! trip (`vllm-render`), on the same round trips as the rest of this
//! benchmark.
//!
//! Three servers over the same shard and workers, measured in interleaved
//! rounds (each round in a rotated order): the null picker, for context;
//! kvpick tokenizing in process with a 32,000-entry byte-level BPE trained
//! at start (`kvpick_perf::hf_model`); kvpick asking a simulated engine's
//! render endpoint, the engine tokenizing with the same model directory on
//! its own runtime thread (`sim-engine`, counted apart: the CPU the local
//! path moves from the engine into kvpick). Bodies are ChatML chats of
//! about 1,000 tokens sharing four system prompts, in the model's language.
//! Server CPU counts the I/O runtime's threads, which include tokio's
//! blocking pool (long bodies are tokenized there).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvpick_ext_proc::{ExtProcMetrics, ExtProcServer};
use kvpick_perf::hf_model::BenchModel;
use kvpick_perf::report::{self, Table, thousands};
use kvpick_perf::sim::{EngineConfig, Fleet};
use kvpick_router::tokenizer::{
    Api, LocalTokenizer, LocalTokenizerConfig, Tokenizer, TokenizerConfig, TokenizerMetrics, TokenizerProtocol,
};
use kvpick_router::{KvPicker, NullPicker, Picker};

use super::rounds::Sum;
use super::{BIN, Budget, CONCURRENCY, WORKERS, cpu_nanos, endpoint, machine_note, measure, micros, runtime, setup};

const SERVERS: [&str; 3] = ["null picker", "kvpick, local tokenizer", "kvpick, vllm-render to the engine"];
const LOCAL: usize = 1;
const RENDER: usize = 2;
const TOKENS: usize = 1_000;
const SYSTEM_TOKENS: usize = 600;
const BODIES: usize = 128;

/// Chat bodies of about `TOKENS` tokens, a shared system prompt each.
fn bodies(model: &BenchModel, local: &LocalTokenizer) -> Result<Vec<Bytes>, String> {
    let chat = |system: &str, user: &str| {
        Bytes::from(
            serde_json::json!({
                "model": "bench-model",
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "stream": true,
            })
            .to_string(),
        )
    };
    // Words per token of this language, measured once.
    let probe = model.language.text(1_000, 1);
    let probe_tokens =
        local.tokenize_body(Api::Completions, serde_json::json!({"prompt": probe}).to_string().as_bytes());
    let per_token = 1_000.0 / probe_tokens.map_err(|e| format!("probe: {e}"))?.len().max(1) as f64;
    let words = |tokens: usize| (tokens as f64 * per_token) as usize;
    let systems: Vec<String> = (0..4).map(|s| model.language.text(words(SYSTEM_TOKENS), 100 + s)).collect();
    Ok((0..BODIES)
        .map(|i| chat(&systems[i % 4], &model.language.text(words(TOKENS - SYSTEM_TOKENS), 1_000 + i as u64)))
        .collect())
}

pub(super) fn run(budget: &Budget, rounds: usize) -> Result<String, String> {
    let load_before = report::load_average();
    let bench = setup()?;
    kvpick_perf::progress!(BIN, "training the benchmark's tokenizer");
    let model = BenchModel::build(32_000)?;
    let local_config = LocalTokenizerConfig { dir: model.dir().to_path_buf(), chat_template: None };
    let local = LocalTokenizer::load(&local_config, Arc::new(TokenizerMetrics::new())).map_err(|e| e.to_string())?;
    let bodies = bodies(&model, &local)?;
    let tokens = local.tokenize_body(Api::ChatCompletions, &bodies[0]).map_err(|e| e.to_string())?.len();

    let engine_rt = runtime("sim-engine")?;
    let engine_config = EngineConfig {
        model: "bench-model".into(),
        model_dir: Some(model.dir().to_path_buf()),
        ..EngineConfig::default()
    };
    let fleet = engine_rt.block_on(Fleet::start(1, &engine_config)).map_err(|e| format!("engine: {e}"))?;
    let render_url = format!("http://{}", fleet.endpoints()[0].http);
    let render = TokenizerConfig::new(TokenizerProtocol::VllmRender, render_url)
        .build(Arc::new(TokenizerMetrics::new()))
        .map_err(|e| format!("render client: {e}"))?;

    let kv = |tokenizer: Arc<dyn Tokenizer>, metrics: Arc<ExtProcMetrics>| {
        Picker::Kv(KvPicker::new(bench.service.clone(), bench.clock.clone(), tokenizer, &bench.picker, metrics))
    };
    let servers = bench.server_rt.block_on(async {
        let mut servers = Vec::new();
        for i in 0..SERVERS.len() {
            let metrics = Arc::new(ExtProcMetrics::new());
            let picker = match i {
                LOCAL => kv(Arc::new(local.clone()), metrics.clone()),
                RENDER => kv(render.clone(), metrics.clone()),
                _ => Picker::Null(NullPicker::new((0..WORKERS).map(endpoint).collect::<Vec<_>>())),
            };
            let server = ExtProcServer::new(super::Bench::server_config(), picker, metrics);
            servers.push(server.spawn().await.map_err(|e| format!("server: {e}"))?);
        }
        Ok::<_, String>(servers)
    })?;

    let mut table = Table::new(
        format!(
            "local tokenizer vs render round trip: ext_proc round trips, {}-token ChatML chat ({} B body), \
             {rounds} interleaved rounds per server",
            thousands(tokens as u64),
            thousands(bodies[0].len() as u64)
        ),
        &["server", "concurrency", "requests/s", "p50 µs", "server CPU µs/req", "engine CPU µs/req", "failed"],
    );
    for concurrency in CONCURRENCY.into_iter().filter(|c| *c <= 16) {
        let mut sums: Vec<Sum> = SERVERS.iter().map(|_| Sum::default()).collect();
        for round in 0..rounds {
            for k in 0..SERVERS.len() {
                let i = (k + round) % SERVERS.len();
                kvpick_perf::progress!(BIN, "concurrency {concurrency}, round {}: {}", round + 1, SERVERS[i]);
                let engine_before = cpu_nanos(&["sim-engine"]);
                let measured =
                    bench.client_rt.block_on(measure(servers[i].local_addr(), concurrency, budget, &bodies))?;
                let engine = Duration::from_nanos(cpu_nanos(&["sim-engine"]).saturating_sub(engine_before));
                sums[i].add(&measured, engine);
            }
        }
        for (name, sum) in SERVERS.iter().zip(&sums) {
            table.row([
                name.to_string(),
                concurrency.to_string(),
                thousands(sum.per_sec() as u64),
                micros(Sum::median(&sum.p50s)),
                format!("{:.1}", sum.cpu_micros()),
                format!("{:.1}", sum.micros_per_request(sum.side_cpu)),
                sum.failures.to_string(),
            ]);
        }
        let (local, render) = (&sums[LOCAL], &sums[RENDER]);
        table.note(format!(
            "- concurrency {concurrency}: local ÷ render = {:.2}× server CPU per request, {:.2}× server + engine CPU, \
             {:.2}× requests/s, {:.2}× p50",
            local.cpu_micros() / render.cpu_micros().max(f64::MIN_POSITIVE),
            local.micros_per_request(local.server_cpu + local.side_cpu)
                / render.micros_per_request(render.server_cpu + render.side_cpu).max(f64::MIN_POSITIVE),
            local.per_sec() / render.per_sec().max(f64::MIN_POSITIVE),
            Sum::median(&local.p50s) as f64 / Sum::median(&render.p50s).max(1) as f64,
        ));
    }
    table.note(format!(
        "- {}-entry byte-level BPE with a ChatML template; the engine (kvpick-sim --model-dir, its own runtime \
         thread) renders and tokenizes with the same files and library (a lower bound for vLLM's Python render); \
         {}",
        thousands(model.vocab_size as u64),
        bench.setup_note().trim_start_matches("- ")
    ));
    table.note(machine_note(&load_before, &report::load_average()));
    bench.server_rt.block_on(async {
        for server in servers {
            let _ = server.shutdown().await;
        }
    });
    engine_rt.block_on(fleet.shutdown());
    bench.shutdown();
    Ok(table.to_string())
}
