//! `kvpick`: the KV-cache-aware Endpoint Picker.
//!
//! - `kvpick serve`: the EPP (ext_proc on 9002, gRPC health on 9003,
//!   Prometheus on 9090), workers from the InferencePool or a static file;
//!   every setting is a flag and an environment variable (`--help`).
//! - `kvpick demo`: a simulated vLLM fleet, kvpick in static mode in front
//!   of it and a multi-turn chat workload through the real ext_proc server,
//!   compared with round-robin and an approximate-prefix picker. Needs
//!   nothing installed.
//! - `kvpick sidecar`: the decode pod's prefill/decode sidecar (vLLM,
//!   SGLang and TensorRT-LLM protocols), `KVPICK_SIDECAR_*` settings.
//! - `kvpick inspect URL`: a running `kvpick serve`'s debug view (with
//!   `--debug-endpoints`) as tables: its workers, or `--explain FILE`.
//!
//! Exit codes: 0 after a clean stop, 1 when start-up fails, 2 for a bad
//! setting.

#[cfg(feature = "demo")]
mod approx_prefix;
#[cfg(feature = "demo")]
mod demo;
#[cfg(feature = "demo")]
mod demo_disagg;
#[cfg(feature = "demo")]
mod demo_model;

mod inspect;
mod logging;
mod profile;
mod sidecar;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Arg, ArgAction, Command};
use kvpick_app::app::settings::{self, Values};
use kvpick_app::app::{App, ServeConfig, huge_pages};

#[cfg(not(feature = "jemalloc"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const ALLOCATOR_NAME: &str = if cfg!(feature = "jemalloc") { "jemalloc" } else { "mimalloc" };

fn command() -> Command {
    let serve = settings::command("serve", "Run the Endpoint Picker (ext_proc gRPC server).");
    let demo = Command::new("demo")
        .about(
            "Route a multi-turn chat workload over a simulated vLLM fleet through kvpick, and compare with round-robin and an approximate-prefix picker (GAIE's default)",
        )
        .arg(Arg::new("engines").long("engines").value_name("N").default_value("3").help("Simulated engines"))
        .arg(
            Arg::new("engine")
                .long("engine")
                .value_name("vllm|trtllm|sglang|mixed")
                .default_value("vllm")
                .help("What the engines play: vLLM, trtllm-serve (KV events drained over HTTP), SGLang, or all three in turn; all but vLLM with kvpick tokenizing in-process"),
        )
        .arg(
            Arg::new("tokenizer")
                .long("tokenizer")
                .value_name("builtin|generated")
                .help("The simulator's built-in tokenizer (vllm only) or a generated model directory [default: builtin for vllm, else generated]"),
        )
        .arg(Arg::new("conversations").long("conversations").value_name("N").default_value("18").help("Conversations"))
        .arg(Arg::new("turns").long("turns").value_name("N").default_value("6").help("Turns per conversation"))
        .arg(
            Arg::new("concurrency")
                .long("concurrency")
                .value_name("N")
                .default_value("12")
                .help("Conversations at once"),
        )
        .arg(
            Arg::new("seed")
                .long("seed")
                .value_name("N")
                .default_value("7")
                .help("Seed of the workload and the engines"),
        )
        .arg(Arg::new("quiet").long("quiet").action(ArgAction::SetTrue).help("Only the final comparison"))
        .arg(
            Arg::new("disagg")
                .long("disagg")
                .action(ArgAction::SetTrue)
                .help("Disaggregated prefill/decode: a prefill engine, decode engines behind kvpick sidecar, long prompts (--conversations of them), the per-leg timeline next to an aggregated run"),
        );
    Command::new("kvpick")
        .version(env!("CARGO_PKG_VERSION"))
        .about("A KV-cache-aware, load-aware Endpoint Picker for the Gateway API Inference Extension")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(serve)
        .subcommand(demo)
        .subcommand(sidecar::command())
        .subcommand(
            Command::new("inspect")
                .about("Show a running kvpick's workers, or how it would pick for a request body (needs kvpick serve --debug-endpoints)")
                .arg(Arg::new("url").value_name("URL").help("Its metrics address [default: http://127.0.0.1:9090]"))
                .arg(Arg::new("explain").long("explain").value_name("FILE").help("A request body (JSON) to explain the pick of"))
                .arg(Arg::new("path").long("path").value_name("PATH").help("The route the body is for [default: /v1/chat/completions]")),
        )
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let matches = match command().try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match matches.subcommand() {
        Some(("serve", m)) => serve(&Values::from_matches(m)),
        Some(("inspect", m)) => inspect::run(m),
        Some(("sidecar", m)) => sidecar::run(m),
        #[cfg(feature = "demo")]
        Some(("demo", m)) => demo::run(m),
        #[cfg(not(feature = "demo"))]
        Some(("demo", _)) => {
            eprintln!("kvpick: this build has no demo (built without the `demo` feature)");
            ExitCode::from(2)
        }
        _ => ExitCode::from(2),
    }
}

fn serve(values: &Values) -> ExitCode {
    let config = match ServeConfig::from_values(values) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("kvpick: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = logging::init(config.log_format, &config.log_filter) {
        eprintln!("kvpick: {error}");
        return ExitCode::from(2);
    }
    if let Err(error) = huge_pages::apply(config.huge_pages) {
        tracing::warn!(%error, "could not opt out of transparent huge pages; resident memory may step up once khugepaged reaches kvpick");
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        allocator = ALLOCATOR_NAME,
        io_threads = config.io_threads,
        huge_pages_disabled = huge_pages::disabled(),
        index_max_bytes = config.router.index_max_bytes,
        "kvpick serve starting"
    );
    let profiler = match profile::Profiler::start(config.profile.as_deref()) {
        Ok(p) => p,
        Err(error) => {
            tracing::error!(%error, "profiling");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.io_threads)
        .thread_name("kvpick-io")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            tracing::error!(%error, "could not start the I/O runtime");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(async {
        let app = match App::start(config).await {
            Ok(app) => app,
            Err(error) => {
                tracing::error!(%error, "start-up failed");
                return ExitCode::from(1);
            }
        };
        let signal = wait_for_stop().await;
        tracing::info!(signal, "stop requested");
        app.shutdown().await;
        ExitCode::SUCCESS
    });
    if let Err(error) = profiler.finish() {
        tracing::error!(%error, "could not write the profile");
    }
    code
}

/// SIGTERM (Kubernetes) or SIGINT (a terminal).
async fn wait_for_stop() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::warn!("cannot listen for signals; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
