//! `kvpick sidecar`: the decode pod's P/D sidecar (`kvpick-sidecar`), with
//! its settings as flags and `KVPICK_SIDECAR_*` variables. The defaults
//! follow llm-d's sidecar layout: the front on 8000, the decode engine on
//! 127.0.0.1:8200 in the same pod.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Command};
use kvpick_app::app::LogFormat;
use kvpick_sidecar::{Sidecar, SidecarConfig};

/// (flag, variable, default, help)
const SETTINGS: &[(&str, &str, &str, &str)] = &[
    ("listen", "KVPICK_SIDECAR_LISTEN", "0.0.0.0:8000", "Where the gateway sends the decode pod's requests"),
    ("decode", "KVPICK_SIDECAR_DECODE", "127.0.0.1:8200", "The local decode engine (ip:port)"),
    ("engine", "KVPICK_SIDECAR_ENGINE", "vllm", "The engines' P/D protocol: vllm (NIXL), sglang (bootstrap), trtllm"),
    (
        "bootstrap-port",
        "KVPICK_SIDECAR_BOOTSTRAP_PORT",
        "8998",
        "SGLang: the prefill engines' --disaggregation-bootstrap-port",
    ),
    ("prefill-timeout-ms", "KVPICK_SIDECAR_PREFILL_TIMEOUT_MS", "60000", "Longest prefill leg, sent to answered"),
    ("connect-timeout-ms", "KVPICK_SIDECAR_CONNECT_TIMEOUT_MS", "2000", "Longest connect to an engine"),
    (
        "on-prefill-failure",
        "KVPICK_SIDECAR_ON_PREFILL_FAILURE",
        "aggregate",
        "aggregate: run the request whole on the local engine; fail: answer 502/504",
    ),
    (
        "prefill-allow",
        "KVPICK_SIDECAR_PREFILL_ALLOW",
        "*",
        "Prefill endpoints a request may name: * or a list of ip, ip:port, [ipv6]:port",
    ),
    ("max-request-bytes", "KVPICK_SIDECAR_MAX_REQUEST_BYTES", "16777216", "Largest request body on a P/D route"),
    ("metrics-listen", "KVPICK_SIDECAR_METRICS_LISTEN", "0.0.0.0:9091", "Prometheus /metrics (none: off)"),
    ("io-threads", "KVPICK_SIDECAR_IO_THREADS", "2", "Threads of the sidecar's runtime"),
    ("log", "KVPICK_LOG", "info", "Log filter: a level or target=level list"),
    ("log-format", "KVPICK_LOG_FORMAT", "json", "json or text"),
];

pub fn command() -> Command {
    let mut command = Command::new("sidecar").about(
        "Run the decode pod's P/D sidecar: the prefill leg on the engine in x-prefiller-host-port, the decode leg here",
    );
    for (flag, env, default, help) in SETTINGS {
        command = command.arg(Arg::new(*flag).long(*flag).env(*env).default_value(*default).help(*help));
    }
    command.arg(
        Arg::new("trtllm-context-max-tokens-1")
            .long("trtllm-context-max-tokens-1")
            .env("KVPICK_SIDECAR_TRTLLM_CONTEXT_MAX_TOKENS_1")
            .action(ArgAction::SetTrue)
            .help("TensorRT-LLM before the context_only request type: cap the context leg at one token"),
    )
}

fn value<T: FromStr>(m: &ArgMatches, flag: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    let (_, env, _, _) = SETTINGS.iter().find(|s| s.0 == flag).copied().unwrap_or((flag, "?", "", ""));
    let raw = m.get_one::<String>(flag).map(String::as_str).unwrap_or_default();
    raw.parse().map_err(|e| format!("--{flag} / {env}={raw:?}: {e}"))
}

fn config(m: &ArgMatches) -> Result<(SidecarConfig, usize), String> {
    let metrics: String = value(m, "metrics-listen")?;
    let metrics_listen = match metrics.as_str() {
        "none" | "" => None,
        _ => Some(value::<SocketAddr>(m, "metrics-listen")?),
    };
    let config = SidecarConfig {
        listen: value(m, "listen")?,
        decode: value(m, "decode")?,
        engine: value(m, "engine")?,
        bootstrap_port: value(m, "bootstrap-port")?,
        prefill_timeout: Duration::from_millis(value(m, "prefill-timeout-ms")?),
        connect_timeout: Duration::from_millis(value(m, "connect-timeout-ms")?),
        on_prefill_failure: value(m, "on-prefill-failure")?,
        prefill_allow: value(m, "prefill-allow")?,
        trtllm_context_max_tokens_1: m.get_flag("trtllm-context-max-tokens-1"),
        max_request_bytes: value(m, "max-request-bytes")?,
        metrics_listen,
        ..SidecarConfig::default()
    };
    config.validate()?;
    let threads: usize = value(m, "io-threads")?;
    if threads == 0 {
        return Err("--io-threads / KVPICK_SIDECAR_IO_THREADS must be at least 1".into());
    }
    Ok((config, threads))
}

pub fn run(m: &ArgMatches) -> ExitCode {
    let (config, threads) = match config(m) {
        Ok(c) => c,
        Err(error) => {
            eprintln!("kvpick sidecar: {error}");
            return ExitCode::from(2);
        }
    };
    let format = match m.get_one::<String>("log-format").map(String::as_str) {
        Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        other => {
            eprintln!("kvpick sidecar: --log-format / KVPICK_LOG_FORMAT={other:?}: expected json or text");
            return ExitCode::from(2);
        }
    };
    let filter = m.get_one::<String>("log").cloned().unwrap_or_default();
    if let Err(error) = crate::logging::init(format, &filter) {
        eprintln!("kvpick sidecar: {error}");
        return ExitCode::from(2);
    }
    // One thread: a current-thread runtime, so a request's tasks (the
    // front's connection, the engines' connections, the answer's relay)
    // wake each other without crossing threads.
    let built = if threads == 1 {
        tokio::runtime::Builder::new_current_thread().thread_name("kvpick-sidecar").enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("kvpick-sidecar")
            .enable_all()
            .build()
    };
    let runtime = match built {
        Ok(rt) => rt,
        Err(error) => {
            tracing::error!(%error, "could not start the runtime");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        let engine = config.engine.name();
        let decode = config.decode;
        let sidecar = match Sidecar::start(config).await {
            Ok(s) => s,
            Err(error) => {
                tracing::error!(%error, "start-up failed");
                return ExitCode::from(1);
            }
        };
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            listen = %sidecar.local_addr(),
            metrics = %sidecar.metrics_addr().map_or_else(|| "off".to_owned(), |a| a.to_string()),
            engine,
            %decode,
            "kvpick sidecar serving"
        );
        let signal = crate::wait_for_stop().await;
        tracing::info!(signal, "stop requested");
        sidecar.shutdown().await;
        ExitCode::SUCCESS
    })
}
