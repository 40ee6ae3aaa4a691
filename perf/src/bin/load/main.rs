//! `kvpick-load`: a load generator for Envoy's ext_proc v3
//! `ExternalProcessor/Process` bidi stream, driven the way a GAIE gateway
//! drives an Endpoint Picker, reporting like ghz.
//!
//! Per stream ([`driver`]): request headers and the body in chunks, the
//! pick (and the body echoed), then the model server's response headers
//! and body chunks, every one answered, then the gateway's end of stream.
//! Streams run over N HTTP/2 connections, closed or open loop, for a count
//! or a duration ([`engine`]); messages come from the built-in chat
//! workload ([`prompts`]) or a ghz data file ([`data`]); the report is
//! ghz's, text or JSON ([`report`]). `--spawn` starts kvpick's own server
//! in-process ([`spawn`]); `--write-frames` turns one stream into gRPC
//! frames for h2load ([`frames`]).
//!
//! Threads: the client's tokio runtime (`--threads`, default 1,
//! `kvpick-load`), and with `--spawn` the server's (1 thread, `kvpick-io`)
//! plus its shard thread. The report goes to stdout, progress to stderr.

mod args;
mod data;
mod driver;
mod engine;
mod frames;
mod prompts;
mod report;
mod script;
mod spawn;
#[cfg(test)]
mod tests;

use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use args::{Format, Options, USAGE};
use engine::{Plan, Progress};
use kvpick_perf::args::options_or_exit;
use report::RunInfo;
use script::Script;
use spawn::Spawned;

const CALL: &str = "envoy.service.ext_proc.v3.ExternalProcessor.Process";

fn main() -> ExitCode {
    let options = match options_or_exit("kvpick-load", USAGE, Options::parse(std::env::args().skip(1))) {
        Ok(options) => options,
        Err(code) => return code,
    };
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("kvpick-load: {problem}");
            ExitCode::FAILURE
        }
    }
}

/// The streams to cycle through: the data file's one, or the workload's.
fn scripts(options: &Options) -> Result<Vec<Script>, String> {
    match &options.data {
        Some(path) => Ok(vec![data::read(path).map_err(|e| e.to_string())?]),
        None => Ok(prompts::scripts(options)),
    }
}

fn run(options: &Options) -> Result<(), String> {
    let scripts = scripts(options)?;
    if let Some(path) = &options.write_frames {
        let bytes = frames::frames(&scripts[0], 0);
        std::fs::write(path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let messages = scripts[0].request.len() + scripts[0].response.len();
        eprintln!(
            "wrote {} ({} B: {messages} gRPC-framed messages for POST {})",
            path.display(),
            bytes.len(),
            frames::PATH
        );
        return Ok(());
    }

    if let Some(path) = &options.write_data {
        let text = serde_json::to_string_pretty(&data::to_json(&scripts[0])).map_err(|e| format!("data file: {e}"))?;
        std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {} (one stream, ghz data format)", path.display());
        return Ok(());
    }

    let spawned = match options.spawn {
        Some(kind) => Some(Spawned::start(kind, options)?),
        None => None,
    };
    let host = match (&spawned, &options.addr) {
        (Some(server), _) => server.addr.to_string(),
        (None, Some(addr)) => addr.clone(),
        (None, None) => return Err("no server: give --addr or --spawn".into()),
    };
    if let (Some(server), Some(serve_for)) = (&spawned, options.serve_for) {
        println!("listening on {host} for {serve_for:?}");
        let _ = std::io::stdout().flush();
        std::thread::sleep(serve_for);
        println!("server counted: {}", server.counts());
        if let Some(server) = spawned {
            server.shutdown();
        }
        return Ok(());
    }

    let result = load(options, &host, scripts, spawned.as_ref());
    if let Some(server) = spawned {
        server.shutdown();
    }
    let (tally, info) = result?;
    match options.format {
        Format::Text => print!("{}", report::text(&tally, &info)),
        Format::Json => println!("{}", report::json(&tally, &info)),
    }
    Ok(())
}

fn plan(options: &Options) -> Plan {
    Plan {
        total: options.total(),
        duration: options.duration,
        concurrency: options.concurrency(),
        rps: options.rps,
        timeout: options.timeout,
        pipeline: options.pipeline,
    }
}

/// Connects, runs the load and tallies it.
pub fn load(
    options: &Options,
    host: &str,
    scripts: Vec<Script>,
    spawned: Option<&Spawned>,
) -> Result<(report::Tally, RunInfo), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.threads)
        .thread_name("kvpick-load")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the client runtime: {e}"))?;
    let plan = plan(options);
    let request_body_bytes = scripts[0].request_body_len();
    let scripts: Arc<[Script]> = scripts.into();
    let opened = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Progress::default());
    let show = options.progress.unwrap_or_else(|| std::io::stderr().is_terminal());
    let date = report::now_rfc3339();
    // All of it on the runtime's worker threads: run from `block_on`, the
    // tally would sit on this thread and every stream's outcome would cost
    // a cross-thread wake-up.
    let (addr, connections, run_plan, counter) = (host.to_string(), options.connections, plan.clone(), opened.clone());
    let finished = runtime.block_on(async move {
        let task = tokio::spawn(async move {
            let channels = engine::connect(&addr, connections, &counter).await?;
            let stop = Arc::new(AtomicBool::new(false));
            let line = show.then(|| tokio::spawn(progress_line(progress.clone(), run_plan.clone(), stop.clone())));
            let finished = engine::run(channels, scripts, run_plan, progress).await;
            stop.store(true, Ordering::Relaxed);
            if let Some(line) = line {
                let _ = line.await;
            }
            Ok::<_, String>(finished)
        });
        task.await.map_err(|e| format!("the load task failed: {e}"))?
    })?;
    let info = RunInfo {
        host: host.to_string(),
        call: CALL,
        total: plan.total,
        concurrency: plan.concurrency,
        connections: options.connections,
        connections_opened: opened.load(Ordering::Relaxed),
        rps: plan.rps,
        duration: plan.duration,
        timeout: plan.timeout,
        data: options.data.as_ref().map(|p| p.display().to_string()),
        pipeline: plan.pipeline,
        request_body_bytes,
        end_reason: finished.end_reason,
        total_time: finished.total_time,
        date,
        server: spawned.map(Spawned::counts),
    };
    Ok((finished.tally, info))
}

/// One stderr line, rewritten in place four times a second.
async fn progress_line(progress: Arc<Progress>, plan: Plan, stop: Arc<AtomicBool>) {
    let start = Instant::now();
    let mut stderr = std::io::stderr();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let done = progress.done.load(Ordering::Relaxed);
        let errors = progress.errors.load(Ordering::Relaxed);
        let elapsed = start.elapsed().as_secs_f64();
        let fraction = match (plan.total, plan.duration) {
            (Some(total), None) => done as f64 / total as f64,
            (None, Some(d)) => elapsed / d.as_secs_f64(),
            (Some(total), Some(d)) => (done as f64 / total as f64).max(elapsed / d.as_secs_f64()),
            (None, None) => 0.0,
        }
        .clamp(0.0, 1.0);
        let filled = (fraction * 30.0) as usize;
        let rate = if elapsed > 0.0 { done as f64 / elapsed } else { 0.0 };
        let _ = write!(
            stderr,
            "\r[{}{}] {:>3.0}%  {done} streams  {rate:.0}/s  {errors} errors  {elapsed:.1}s ",
            "=".repeat(filled),
            " ".repeat(30 - filled),
            fraction * 100.0
        );
        let _ = stderr.flush();
    }
    let _ = write!(stderr, "\r{}\r", " ".repeat(90));
    let _ = stderr.flush();
}
