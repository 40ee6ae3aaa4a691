//! `kvpick-sim`: runs N simulated vLLM engines (`kvpick_sim`) on
//! 127.0.0.1 until Ctrl-C or SIGTERM.
//!
//! Once every engine listens, stdout gets one line per engine (name, HTTP
//! base URL, KV-event PUB endpoint, replay ROUTER endpoint), or with
//! `--json` a single JSON line `{"engines": [{"name", "http", "events",
//! "replay", "bootstrap"}, …]}` for tools. Logs go to stderr.

use std::io::Write;
use std::process::ExitCode;

use kvpick_sim::{EngineConfig, Fleet, PdRole};
use tracing::Level;

struct Options {
    engines: usize,
    http_ports: Option<Vec<u16>>,
    event_ports: Option<Vec<u16>>,
    replay_ports: Option<Vec<u16>>,
    bootstrap_ports: Option<Vec<u16>>,
    /// One role for every engine, or one per engine.
    pd_roles: Vec<PdRole>,
    drop_fraction: f64,
    json: bool,
    log_level: Level,
    base: EngineConfig,
}

fn usage() -> &'static str {
    "usage: kvpick-sim [flags]\n\
     \n  --engines N               engines to run (3)\
     \n  --http-ports P,P,...      fixed HTTP ports, one per engine (default: picked by the OS)\
     \n  --event-ports P,P,...     fixed KV-event PUB ports\
     \n  --replay-ports P,P,...    fixed replay ROUTER ports\
     \n  --bootstrap-ports P,P,... fixed KV transfer side-channel ports (prefill engines; SGLang's bootstrap port)\
     \n  --pd-role R[,R,...]       aggregated|prefill|decode, for every engine or one per engine (aggregated)\
     \n  --kv-transfer-ns-per-block N  virtual time a decode engine takes to receive a KV block (20000)\
     \n  --kv-lease-ms N           how long a prefill engine holds blocks nobody pulls (30000)\
     \n  --kv-wait-ms N            SGLang legs' longest wait for their peer (30000)\
     \n  --kv-load-failure-policy fail|recompute  vLLM decode: a failed pull fails the request or recomputes (fail)\
     \n  --model NAME              served model name (sim-model)\
     \n  --block-size N            tokens per KV block (16)\
     \n  --num-blocks N            KV blocks per engine (4096)\
     \n  --max-batched-tokens N    token budget of a step (8192)\
     \n  --max-num-seqs N          most running requests (256)\
     \n  --max-model-len N         longest prompt + completion (32768)\
     \n  --max-tokens N            completion length when a request names none (16)\
     \n  --time-scale X            virtual time per wall-clock time (1; 100 = 100x faster)\
     \n  --step-overhead-ns N      fixed cost of a step (5000000)\
     \n  --prefill-ns-per-token N  cost of one uncached prompt token (50000)\
     \n  --decode-ns-per-seq N     cost of one decoding request in a step (250000)\
     \n  --seed N                  seed of engine 0 (others derive theirs)\
     \n  --hash-seed N             one block-hash seed for every engine (default: each its own)\
     \n  --encoding map|array      KV event encoding (map)\
     \n  --replay-layout topic|legacy  replay reply frames (topic: vLLM >= 0.26)\
     \n  --hash-format int|bytes   block hashes as ints or 16-byte binaries (int)\
     \n  --topic T                 ZMQ topic frame (empty)\
     \n  --replay-buffer N         batches kept for replay (10000)\
     \n  --flavour vllm|trtllm|sglang  the engine played: vLLM (ZMQ events, render), trtllm-serve (/kv_cache_events,\
     \n                            no render) or SGLang (/tokenize, /generate; its event form needs --encoding array\
     \n                            --hash-format signed --replay-layout legacy)\
     \n  --event-buffer-max-size N trtllm: events kept until drained, oldest discarded (1024)\
     \n  --model-dir DIR           tokenize with this Hugging Face model directory\
     \n  --drop-fraction F         share of event batches lost (0)\
     \n  --json                    print the endpoints as one JSON line\
     \n  --log-level L             error, warn, info, debug (info)\n"
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        engines: 3,
        http_ports: None,
        event_ports: None,
        replay_ports: None,
        bootstrap_ports: None,
        pd_roles: Vec::new(),
        drop_fraction: 0.0,
        json: false,
        log_level: Level::INFO,
        base: EngineConfig::default(),
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        let mut value = || inline.clone().or_else(|| args.next()).ok_or_else(|| format!("{name} needs a value"));
        let b = &mut o.base;
        match name.as_str() {
            "-h" | "--help" => return Ok(None),
            "--json" => o.json = true,
            "--engines" => o.engines = num(&name, &value()?)?,
            "--http-ports" => o.http_ports = Some(ports(&name, &value()?)?),
            "--event-ports" => o.event_ports = Some(ports(&name, &value()?)?),
            "--replay-ports" => o.replay_ports = Some(ports(&name, &value()?)?),
            "--bootstrap-ports" => o.bootstrap_ports = Some(ports(&name, &value()?)?),
            "--pd-role" => {
                o.pd_roles = value()?.split(',').map(|r| r.trim().parse()).collect::<Result<_, String>>()?;
            }
            "--kv-transfer-ns-per-block" => b.kv_transfer_ns_per_block = num(&name, &value()?)?,
            "--kv-lease-ms" => b.kv_lease_ms = num(&name, &value()?)?,
            "--kv-wait-ms" => b.kv_wait_ms = num(&name, &value()?)?,
            "--kv-load-failure-policy" => b.kv_load_failure_policy = value()?.parse()?,
            "--model" => b.model = value()?,
            "--block-size" => b.block_size = num(&name, &value()?)?,
            "--num-blocks" => b.num_blocks = num(&name, &value()?)?,
            "--max-batched-tokens" => b.max_batched_tokens = num(&name, &value()?)?,
            "--max-num-seqs" => b.max_num_seqs = num(&name, &value()?)?,
            "--max-model-len" => b.max_model_len = num(&name, &value()?)?,
            "--max-tokens" => b.default_max_tokens = num(&name, &value()?)?,
            "--time-scale" => b.time.time_scale = num(&name, &value()?)?,
            "--step-overhead-ns" => b.time.step_overhead_ns = num(&name, &value()?)?,
            "--prefill-ns-per-token" => b.time.prefill_ns_per_token = num(&name, &value()?)?,
            "--decode-ns-per-seq" => b.time.decode_ns_per_seq = num(&name, &value()?)?,
            "--seed" => b.seed = num(&name, &value()?)?,
            "--hash-seed" => b.hash_seed = Some(num(&name, &value()?)?),
            "--encoding" => b.encoding = value()?.parse()?,
            "--replay-layout" => b.replay_layout = value()?.parse()?,
            "--hash-format" => b.hash_format = value()?.parse()?,
            "--topic" => b.topic = value()?,
            "--model-dir" => b.model_dir = Some(value()?.into()),
            "--flavour" => b.flavour = value()?.parse()?,
            "--event-buffer-max-size" => b.event_buffer_max_size = num(&name, &value()?)?,
            "--replay-buffer" => b.replay_buffer = num(&name, &value()?)?,
            "--drop-fraction" => {
                o.drop_fraction = num(&name, &value()?)?;
                if !(0.0..=1.0).contains(&o.drop_fraction) {
                    return Err(format!("{name}: {} is not in [0, 1]", o.drop_fraction));
                }
            }
            "--log-level" => {
                o.log_level = value()?.parse().map_err(|_| format!("{name}: error, warn, info or debug"))?;
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if o.engines == 0 {
        return Err("--engines must be at least 1".into());
    }
    if o.pd_roles.len() > 1 && o.pd_roles.len() != o.engines {
        return Err(format!("--pd-role: {} roles for {} engines", o.pd_roles.len(), o.engines));
    }
    for (flag, list) in [
        ("--http-ports", &o.http_ports),
        ("--event-ports", &o.event_ports),
        ("--replay-ports", &o.replay_ports),
        ("--bootstrap-ports", &o.bootstrap_ports),
    ] {
        if let Some(list) = list
            && list.len() != o.engines
        {
            return Err(format!("{flag}: {} ports for {} engines", list.len(), o.engines));
        }
    }
    o.base.validate().map_err(|e| e.to_string())?;
    Ok(Some(o))
}

fn num<T: std::str::FromStr>(name: &str, text: &str) -> Result<T, String> {
    text.replace('_', "").parse().map_err(|_| format!("{name}: {text:?} is not a valid number"))
}

fn ports(name: &str, text: &str) -> Result<Vec<u16>, String> {
    text.split(',').map(|p| num(name, p.trim())).collect()
}

fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("kvpick-sim: {message}\n\n{}", usage());
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(options.log_level).init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("kvpick-sim: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(options))
}

async fn run(o: Options) -> ExitCode {
    let mut configs = Fleet::configs(o.engines, &o.base);
    for (i, config) in configs.iter_mut().enumerate() {
        config.ports.http = o.http_ports.as_ref().map(|p| p[i]);
        config.ports.events = o.event_ports.as_ref().map(|p| p[i]);
        config.ports.replay = o.replay_ports.as_ref().map(|p| p[i]);
        config.bootstrap_port = o.bootstrap_ports.as_ref().map(|p| p[i]);
        config.pd_role = match o.pd_roles.as_slice() {
            [] => PdRole::Aggregated,
            [role] => *role,
            roles => roles[i],
        };
    }
    let fleet = match Fleet::start_with(configs).await {
        Ok(fleet) => fleet,
        Err(error) => {
            eprintln!("kvpick-sim: {error}");
            return ExitCode::FAILURE;
        }
    };
    for engine in fleet.engines() {
        engine.set_drop_fraction(o.drop_fraction);
    }
    let mut out = std::io::stdout().lock();
    let printed = if o.json {
        writeln!(out, "{}", fleet.endpoints_json())
    } else {
        fleet.endpoints().iter().try_for_each(|e| {
            write!(out, "{}  http={}  events={}  replay={}", e.name, e.base_url(), e.events, e.replay)?;
            match e.bootstrap {
                Some(addr) => writeln!(out, "  bootstrap={addr}"),
                None => writeln!(out),
            }
        })
    };
    if printed.and_then(|()| out.flush()).is_err() {
        tracing::warn!("stdout is closed; serving anyway");
    }
    drop(out);
    tracing::info!(engines = fleet.len(), "serving; Ctrl-C or SIGTERM stops");
    wait_for_stop().await;
    fleet.shutdown().await;
    ExitCode::SUCCESS
}

async fn wait_for_stop() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
