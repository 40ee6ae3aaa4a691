//! `kvpick-soak`: `kvpick serve` (the release binary, a process of its own)
//! in front of a simulated fleet of vLLM, SGLang and TensorRT-LLM engines,
//! under chat traffic for a set time while a chaos schedule injects faults
//! one at a time; it samples the
//! server's memory, descriptors, threads, bookings and index against the
//! engines' own caches, checks the invariants below, and writes a report
//! with plots.
//!
//! Invariants (a broken one fails the run, exit 1):
//! - after every fault is healed, once the requests in flight have ended,
//!   kvpick holds no booking and its index holds, for every engine, as
//!   many blocks as the engine caches, within `--window`;
//! - the same when the load stops at the end;
//! - resident memory after warm-up grows by less than `--rss-tolerance`,
//!   open descriptors by at most `--fd-slack`;
//! - the server never dies, never panics, and exits 0 on SIGTERM;
//! - every WARN or ERROR line it logs is counted by a counter that rose
//!   (`accounts`);
//! - a fault that kvpick's inputs suffer shows in the counter an operator
//!   would see it by, and the counters of loss and leaks never move.
//!
//! Threads: a two-thread tokio runtime for the clients, the gateway, the
//! engines and the sampler; kvpick's own threads are in its process.

mod accounts;
mod chaos;
mod fleet;
mod members;
mod report;
mod serve;
mod traffic;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvpick_perf::args::{ArgsError, Flags, options_or_exit};

use chaos::Kind;
use fleet::SoakFleet;
use kvpick_perf::sim::Flavour;
use report::{Checkpoint, Report, Sample};
use serve::{Probe, Serve};
use traffic::Traffic;

/// Tokens per KV block, on the engines and in kvpick.
pub const BLOCK_SIZE: u32 = 16;

const USAGE: &str = "usage: kvpick-soak [flags]
  --kvpick PATH          the kvpick binary (default: `kvpick` beside this one)
  --duration D           how long the load runs (60s; 10m, 30m, 1h30m)
  --engines LIST|N       simulated engines by kind, vllm, sglang or trtllm
                         (vllm,vllm,sglang,trtllm); a number: that many vLLM
  --num-blocks N         KV blocks per engine, small so caches evict (1024)
  --time-scale X         engines' virtual time per wall-clock time (10)
  --clients N            concurrent clients (6)
  --cancel-share F       share of requests cut at a random moment (0.1)
  --discovery M          how kvpick learns the fleet: kubernetes (a fake API
                         server, pods on loopback addresses) or static (a
                         workers file) (kubernetes)
  --faults K,K,...|all|none  fault kinds, rotated (all that the discovery
                         mode allows): drop-events, stall-events,
                         reorder-events, replay-down,
                         restart-announced, restart-silent, kill,
                         worker-removed, watch-cut, watch-expired, api-errors
                         (the last three: kubernetes only), tokenizer-down,
                         tokenizer-slow, tokenizer-failing, gateway-reset
  --hold D               how long a lasting fault lasts (2s)
  --settle D             traffic before each fault, and after it heals before the books are checked (2s)
  --window D             time the books get to balance (10s)
  --sample D             sampling interval (1s)
  --warmup D             samples before this are not held to the memory bound (duration / 3)
  --rss-tolerance F      largest resident-memory growth after warm-up (0.05)
  --fd-slack N           most descriptors gained after warm-up (16)
  --out DIR              report, samples, plots and the server's log (target/soak)
  --seed N               clients' random choices (1)
";

#[derive(Clone, Debug)]
pub struct Options {
    pub kvpick: PathBuf,
    pub duration: Duration,
    pub engines: Vec<Flavour>,
    pub num_blocks: usize,
    pub time_scale: f64,
    pub clients: usize,
    pub cancel_share: f64,
    pub faults: Vec<Kind>,
    /// Kubernetes discovery (else a static workers file).
    pub kube: bool,
    pub hold: Duration,
    pub settle: Duration,
    pub window: Duration,
    pub sample: Duration,
    pub warmup: Option<Duration>,
    pub rss_tolerance: f64,
    pub fd_slack: u64,
    pub out: PathBuf,
    pub seed: u64,
}

impl Options {
    fn parse(words: impl IntoIterator<Item = String>) -> Result<Options, ArgsError> {
        let beside = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("kvpick")));
        let mut o = Options {
            kvpick: beside.unwrap_or_else(|| PathBuf::from("kvpick")),
            duration: Duration::from_secs(60),
            engines: vec![Flavour::Vllm, Flavour::Vllm, Flavour::Sglang, Flavour::Trtllm],
            num_blocks: 1024,
            time_scale: 10.0,
            clients: 6,
            cancel_share: 0.1,
            faults: Kind::ALL.to_vec(),
            kube: true,
            hold: Duration::from_secs(2),
            settle: Duration::from_secs(2),
            window: Duration::from_secs(10),
            sample: Duration::from_secs(1),
            warmup: None,
            rss_tolerance: 0.05,
            fd_slack: 16,
            out: PathBuf::from("target/soak"),
            seed: 1,
        };
        let bad = |what: &str, v: &str| ArgsError::Invalid(format!("{what}: cannot read {v:?}"));
        // `all` (or no --faults) means all the discovery mode allows.
        let mut all_faults = true;
        let mut flags = Flags::new(words);
        while let Some(flag) = flags.next_flag() {
            if flag.name == "--help" || flag.name == "-h" {
                return Err(ArgsError::Help);
            }
            let v = flags.value(&flag)?;
            let duration = || parse_duration(&v).ok_or_else(|| bad(&flag.name, &v));
            let number = || v.parse::<u64>().map_err(|_| bad(&flag.name, &v));
            let real =
                || v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(|| bad(&flag.name, &v));
            match flag.name.as_str() {
                "--kvpick" => o.kvpick = PathBuf::from(&v),
                "--duration" => o.duration = duration()?,
                "--engines" => o.engines = parse_engines(&v).ok_or_else(|| bad(&flag.name, &v))?,
                "--num-blocks" => o.num_blocks = number()?.max(64) as usize,
                "--time-scale" => o.time_scale = real()?.max(0.1),
                "--clients" => o.clients = number()?.max(1) as usize,
                "--cancel-share" => o.cancel_share = real()?.min(1.0),
                "--discovery" => {
                    o.kube = match v.as_str() {
                        "kubernetes" => true,
                        "static" => false,
                        _ => return Err(bad(&flag.name, &v)),
                    }
                }
                "--faults" => {
                    all_faults = v == "all";
                    o.faults = match v.as_str() {
                        "all" => Kind::ALL.to_vec(),
                        "none" => Vec::new(),
                        list => list
                            .split(',')
                            .map(|name| {
                                Kind::from_name(name)
                                    .ok_or_else(|| ArgsError::Invalid(format!("--faults: no fault kind {name:?}")))
                            })
                            .collect::<Result<_, _>>()?,
                    };
                }
                "--hold" => o.hold = duration()?,
                "--settle" => o.settle = duration()?,
                "--window" => o.window = duration()?,
                "--sample" => o.sample = duration()?.max(Duration::from_millis(100)),
                "--warmup" => o.warmup = Some(duration()?),
                "--rss-tolerance" => o.rss_tolerance = real()?,
                "--fd-slack" => o.fd_slack = number()?,
                "--out" => o.out = PathBuf::from(&v),
                "--seed" => o.seed = number()?,
                other => return Err(ArgsError::Invalid(format!("unknown flag {other}"))),
            }
        }
        if !o.kube {
            if all_faults {
                o.faults.retain(|k| !k.needs_kube());
            } else if let Some(k) = o.faults.iter().find(|k| k.needs_kube()) {
                return Err(ArgsError::Invalid(format!("--faults {}: needs --discovery kubernetes", k.name())));
            }
        }
        Ok(o)
    }

    pub fn warmup(&self) -> Duration {
        self.warmup.unwrap_or(self.duration / 3)
    }
}

/// `vllm,sglang,trtllm` (at least two), or a number of vLLM engines.
fn parse_engines(text: &str) -> Option<Vec<Flavour>> {
    let engines = match text.parse::<usize>() {
        Ok(n) => vec![Flavour::Vllm; n],
        Err(_) => text.split(',').map(|k| k.trim().parse::<Flavour>().ok()).collect::<Option<Vec<_>>>()?,
    };
    (engines.len() >= 2).then_some(engines)
}

/// `90s`, `500ms`, `10m`, `1h30m`, `1m30s`.
fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        total += match &rest[..unit] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            _ => return None,
        };
        rest = &rest[unit..];
    }
    Some(total)
}

fn main() -> ExitCode {
    let options = match options_or_exit("kvpick-soak", USAGE, Options::parse(std::env::args().skip(1))) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("kvpick-soak: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Interrupted, the run is dropped: `Serve`'s drop kills kvpick serve.
    let interrupted = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok()?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => Some("SIGINT"),
            _ = term.recv() => Some("SIGTERM"),
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = run(&options) => outcome,
            Some(signal) = interrupted => Err(format!("stopped by {signal}; kvpick serve stopped with it")),
        }
    });
    match outcome {
        Ok(report) => {
            print!("{}", report.summary());
            if report.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(problem) => {
            eprintln!("kvpick-soak: {problem}");
            ExitCode::FAILURE
        }
    }
}

async fn run(o: &Options) -> Result<Report, String> {
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let out = o.out.canonicalize().map_err(|e| format!("{}: {e}", o.out.display()))?;
    let members = members::Members::start(o.kube, &out).await?;
    let fleet = Arc::new(SoakFleet::start(&o.engines, o.num_blocks, o.time_scale, members).await?);
    let outcome = soak(o, &out, &fleet).await;
    fleet.shutdown().await;
    outcome
}

async fn soak(o: &Options, out: &std::path::Path, fleet: &Arc<SoakFleet>) -> Result<Report, String> {
    let discovery = fleet.discovery_settings().await;
    let serve = Serve::start(&o.kvpick, &discovery, &fleet.render_url().await, out).await?;
    eprintln!("kvpick-soak: kvpick serve (pid {}) on {}; {} engines", serve.pid(), serve.ext_proc, fleet.len());
    wait_workers(&serve.probe, fleet).await?;
    let first = serve.probe.scrape_surely().await?;
    let traffic = Traffic::connect(serve.ext_proc, o.cancel_share).await?;
    let clients = traffic.spawn(o.clients, o.seed);
    let started = Instant::now();
    let mut report = Report::new(o.clone());

    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (probe, fleet, traffic) = (serve.probe.clone(), Arc::clone(fleet), Arc::clone(&traffic));
        let (every, sampling) = (o.sample, Arc::clone(&sampling));
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(every);
            // A slow scrape delays the next sample instead of bunching them.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while sampling.load(Ordering::SeqCst) {
                tick.tick().await;
                samples.push(sample(&probe, &fleet, &traffic, started.elapsed()).await);
            }
            samples
        })
    };

    // Faults one after the other until the time is up, each followed by a
    // check of the books; with no faults, a check every few seconds.
    let mut n = 0;
    while started.elapsed() + 2 * o.settle + o.hold < o.duration {
        // Traffic first, so a fault that is an instant (a restart, a
        // reset) finds requests in flight.
        tokio::time::sleep(o.settle).await;
        let fault = chaos::nth(n, &o.faults, &o.engines);
        n += 1;
        let at = started.elapsed();
        let label = fault.map_or_else(|| "quiet".to_owned(), |f| f.to_string());
        eprintln!("kvpick-soak: {:>6.1}s {label}", at.as_secs_f64());
        let before = serve.probe.scrape_surely().await?;
        match fault {
            Some(fault) => chaos::inject(fault, o.hold, fleet, &traffic).await?,
            None => tokio::time::sleep(o.hold).await,
        }
        tokio::time::sleep(o.settle).await;
        let mut check = checkpoint(&label, at, o.window, &serve.probe, fleet, &traffic).await;
        let after = serve.probe.scrape_surely().await?;
        check.moved = moved(&before, &after);
        check.seen_by = fault.and_then(|f| f.kind.seen_by());
        check.not_seen_by = fault.map_or(&[], |f| f.kind.not_seen_by());
        if !check.balanced() {
            eprintln!("kvpick-soak: books did not balance after {label}: {}", check.detail);
        }
        report.checkpoints.push(check);
        if let Some(fault) = fault {
            report.injected.insert(fault.kind);
        }
    }
    let load_ended = started.elapsed();
    traffic.stop();
    // Each request ends within the gateway's 30 s answer timeout, or is
    // cut here.
    for client in clients {
        let _ = tokio::time::timeout(Duration::from_secs(40), client).await;
    }
    let end = checkpoint("end of load", load_ended, o.window, &serve.probe, fleet, &traffic).await;
    report.checkpoints.push(end);
    let last = serve.probe.scrape_surely().await?;
    report.moved = moved(&first, &last);
    sampling.store(false, Ordering::SeqCst);
    report.samples = sampler.await.map_err(|e| format!("sampler: {e}"))?;
    report.load_seconds = load_ended.as_secs_f64();
    report.counts = traffic.counts.snapshot();
    let log = serve.log_path().to_path_buf();
    report.exit = Some(serve.stop(Duration::from_secs(3)).await);
    report.log = serve::summarise_log(&log)?;
    report.accounts = accounts::accounts(&report.log, &last);
    report.write(out)?;
    Ok(report)
}

/// The watched counters that moved from `before` to `after`.
fn moved(before: &serve::Scrape, after: &serve::Scrape) -> Vec<(&'static str, f64)> {
    chaos::WATCHED
        .iter()
        .map(|family| (*family, serve::family_sum(after, family) - serve::family_sum(before, family)))
        .filter(|(_, delta)| *delta != 0.0)
        .collect()
}

/// Waits until kvpick lists every engine as a worker.
async fn wait_workers(probe: &Probe, fleet: &SoakFleet) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let scrape = probe.scrape().await.unwrap_or_default();
        let mut missing = Vec::new();
        for i in 0..fleet.len() {
            let endpoint = fleet.endpoint(i).await;
            if serve::worker_value(&scrape, "kvpick_worker_requests", endpoint).is_none() {
                missing.push(endpoint);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("kvpick does not serve {missing:?} after 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Index against the engines, over the engines up and listed.
struct Books {
    /// Σ |blocks the engine caches − blocks kvpick indexes for it|.
    diverged: u64,
    engine_blocks: u64,
    index_blocks: u64,
    /// Engines compared; one down, or not listed by kvpick, is not.
    compared: usize,
    /// Each engine apart, or not compared, in words.
    apart: Vec<String>,
}

/// Counts, not sets: with every store and removal announced, equal counts
/// after a quiet spell mean kvpick followed every change.
async fn books(scrape: &serve::Scrape, fleet: &SoakFleet) -> Books {
    let mut b = Books { diverged: 0, engine_blocks: 0, index_blocks: 0, compared: 0, apart: Vec::new() };
    for i in 0..fleet.len() {
        let endpoint = fleet.endpoint(i).await;
        let stats = fleet.stats(i).await;
        let index = serve::worker_value(scrape, "kvpick_worker_cached_blocks", endpoint);
        let (Some(stats), Some(index)) = (&stats, index) else {
            let why = if stats.is_none() { "its numbers did not come" } else { "kvpick does not list it" };
            b.apart.push(format!("engine-{i} not compared: {why}"));
            continue;
        };
        let (cached, index) = (stats.cached_blocks as u64, index as u64);
        b.compared += 1;
        b.diverged += cached.abs_diff(index);
        b.engine_blocks += cached;
        b.index_blocks += index;
        if cached != index {
            b.apart.push(format!("engine-{i} caches {cached}, indexed {index}"));
        }
    }
    b
}

async fn sample(probe: &Probe, fleet: &SoakFleet, traffic: &Traffic, at: Duration) -> Sample {
    let proc = probe.sample().ok();
    let scrape = probe.scrape().await.ok();
    let (diverged, engine_blocks, index_blocks) = match &scrape {
        Some(scrape) => {
            let b = books(scrape, fleet).await;
            (b.diverged, b.engine_blocks, b.index_blocks)
        }
        None => (0, 0, 0),
    };
    let bookings = scrape.as_ref().and_then(|s| s.get("kvpick_reservations_active").copied());
    Sample {
        seconds: at.as_secs_f64(),
        alive: proc.is_some(),
        rss_bytes: proc.map_or(0, |p| p.rss_bytes),
        fds: proc.map_or(0, |p| p.fds),
        threads: proc.map_or(0, |p| p.threads),
        bookings: bookings.unwrap_or(-1.0),
        in_flight: traffic.counts.in_flight.load(Ordering::SeqCst),
        diverged,
        engine_blocks,
        index_blocks,
        ok: traffic.counts.ok.load(Ordering::SeqCst),
        failed: traffic.counts.failed(),
        queue_depth: scrape.as_ref().map_or(-1.0, |s| serve::family_sum(s, "kvpick_queue_depth")),
        errors: scrape.as_ref().map_or(0.0, accounts::errors),
    }
}

/// New requests paused, those in flight ended, then the books polled
/// until they balance (no booking, index = engines' caches) or `window`
/// passes; the traffic resumes after.
async fn checkpoint(
    label: &str,
    fault_at: Duration,
    window: Duration,
    probe: &Probe,
    fleet: &SoakFleet,
    traffic: &Traffic,
) -> Checkpoint {
    traffic.pause(true);
    // The gateway gives up on any one answer after 30 s.
    let drained = traffic.drained(Duration::from_secs(35)).await;
    let quiet = Instant::now();
    let mut check =
        Checkpoint { label: label.to_owned(), fault_seconds: fault_at.as_secs_f64(), drained, ..Checkpoint::default() };
    loop {
        match probe.scrape().await {
            Ok(scrape) => {
                let bookings = scrape.get("kvpick_reservations_active").copied().unwrap_or(-1.0);
                let b = books(&scrape, fleet).await;
                check.bookings = bookings;
                check.diverged = b.diverged;
                check.detail = format!(
                    "{bookings} bookings; engines cache {} blocks, kvpick indexes {}",
                    b.engine_blocks, b.index_blocks
                );
                if !b.apart.is_empty() {
                    check.detail = format!("{} ({})", check.detail, b.apart.join("; "));
                }
                if drained && bookings == 0.0 && b.diverged == 0 && b.compared == fleet.len() {
                    check.balanced_after = Some(quiet.elapsed().as_secs_f64());
                    break;
                }
            }
            Err(e) => check.detail = e,
        }
        if quiet.elapsed() > window {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    traffic.pause(false);
    check
}
