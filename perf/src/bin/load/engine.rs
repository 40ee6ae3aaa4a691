//! The load: N HTTP/2 connections, streams spread over them, run closed
//! loop (a fixed number at once, each starting when the last ended) or
//! open loop (started on a fixed schedule whatever the server does), for
//! a count or a duration.
//!
//! Each connection is its own tonic `Channel` made with its own
//! connector, so tonic cannot share one TCP connection between them; the
//! connector counts the connections it opens (the report shows it).
//! Open loop: stream n is due at `start + n / rps`; its latency counts from
//! then, not from when it actually went out, so a server that stalls the
//! client is charged for it (no coordinated omission), and the lag itself
//! is reported.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::driver::{self, Outcome};
use crate::report::Tally;
use crate::script::Script;

/// Largest answer accepted: the server echoes bodies in chunks of at most
/// 62,000 bytes, but another server may not.
const MAX_ANSWER_BYTES: usize = 64 << 20;

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<TcpStream>>> + Send>>;

/// A tonic connector that opens one TCP connection per call and counts them.
fn connector(
    opened: Arc<AtomicU64>,
) -> impl tower::Service<Uri, Response = TokioIo<TcpStream>, Error = std::io::Error, Future = Connecting>
+ Send
+ Clone
+ 'static {
    tower::service_fn(move |uri: Uri| {
        let opened = opened.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or("127.0.0.1").trim_start_matches('[').trim_end_matches(']').to_string();
            let port = uri.port_u16().unwrap_or(80);
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            opened.fetch_add(1, Ordering::Relaxed);
            Ok(TokioIo::new(stream))
        }) as Connecting
    })
}

/// `connections` channels to `addr`, each its own HTTP/2 connection.
pub async fn connect(addr: &str, connections: usize, opened: &Arc<AtomicU64>) -> Result<Vec<Channel>, String> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("{addr} is not a usable address: {e}"))?
        .connect_timeout(Duration::from_secs(10));
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        let channel = endpoint
            .connect_with_connector(connector(opened.clone()))
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        channels.push(channel);
    }
    Ok(channels)
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub total: Option<u64>,
    pub duration: Option<Duration>,
    pub concurrency: usize,
    pub rps: Option<f64>,
    pub timeout: Duration,
    pub pipeline: bool,
}

/// Shared with the progress line.
#[derive(Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub errors: AtomicU64,
}

pub struct Finished {
    pub tally: Tally,
    /// First stream started → last stream ended.
    pub total_time: Duration,
    /// ghz's words: `normal` (count reached) or `timeout` (duration over).
    pub end_reason: &'static str,
}

type Sink = mpsc::UnboundedSender<(Outcome, Option<Duration>)>;

async fn one(
    client: &mut ExternalProcessorClient<Channel>,
    script: &Script,
    n: u64,
    origin: Instant,
    plan: &Plan,
) -> Outcome {
    let left = plan.timeout.saturating_sub(origin.elapsed());
    match tokio::time::timeout(left, driver::drive(client, script, n, origin, plan.pipeline)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::timeout(plan.timeout),
    }
}

fn client(channel: &Channel) -> ExternalProcessorClient<Channel> {
    ExternalProcessorClient::new(channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES)
}

/// Runs the plan; must be called on a tokio runtime.
pub async fn run(channels: Vec<Channel>, scripts: Arc<[Script]>, plan: Plan, progress: Arc<Progress>) -> Finished {
    let (sink, mut outcomes) = mpsc::unbounded_channel();
    let start = Instant::now();
    let deadline = plan.duration.map(|d| start + d);
    let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = match plan.rps {
        None => tokio::spawn(closed_loop(channels, scripts, plan.clone(), sink, deadline, timed_out.clone())),
        Some(rps) => {
            tokio::spawn(open_loop(channels, scripts, plan.clone(), rps, sink, start, deadline, timed_out.clone()))
        }
    };
    let mut tally = Tally::default();
    let mut last = start;
    while let Some((outcome, lag)) = outcomes.recv().await {
        if outcome.error.is_some() {
            progress.errors.fetch_add(1, Ordering::Relaxed);
        }
        tally.add(outcome, lag);
        progress.done.fetch_add(1, Ordering::Relaxed);
        last = Instant::now();
    }
    // Every sender is gone: the load is over (a panicked task shows as missing streams).
    let _ = load.await;
    let end_reason = if timed_out.load(Ordering::Relaxed) { "timeout" } else { "normal" };
    Finished { tally, total_time: last.duration_since(start), end_reason }
}

async fn closed_loop(
    channels: Vec<Channel>,
    scripts: Arc<[Script]>,
    plan: Plan,
    sink: Sink,
    deadline: Option<Instant>,
    timed_out: Arc<std::sync::atomic::AtomicBool>,
) {
    let next = Arc::new(AtomicU64::new(0));
    let plan = Arc::new(plan);
    let mut workers = Vec::with_capacity(plan.concurrency);
    for w in 0..plan.concurrency {
        let mut client = client(&channels[w % channels.len()]);
        let (next, scripts, plan, sink, timed_out) =
            (next.clone(), scripts.clone(), plan.clone(), sink.clone(), timed_out.clone());
        workers.push(tokio::spawn(async move {
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    timed_out.store(true, Ordering::Relaxed);
                    break;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                if plan.total.is_some_and(|total| n >= total) {
                    break;
                }
                let script = &scripts[(n % scripts.len() as u64) as usize];
                let outcome = one(&mut client, script, n, Instant::now(), &plan).await;
                if sink.send((outcome, None)).is_err() {
                    break;
                }
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
}

/// Waits until `at`: tokio's timer has millisecond ticks, so the last
/// stretch is spent yielding, which keeps sub-millisecond schedules.
async fn wait_until(at: Instant) {
    let coarse = at.checked_sub(Duration::from_millis(1));
    if let Some(coarse) = coarse.filter(|c| *c > Instant::now()) {
        tokio::time::sleep_until(coarse.into()).await;
    }
    while Instant::now() < at {
        tokio::task::yield_now().await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn open_loop(
    channels: Vec<Channel>,
    scripts: Arc<[Script]>,
    plan: Plan,
    rps: f64,
    sink: Sink,
    start: Instant,
    deadline: Option<Instant>,
    timed_out: Arc<std::sync::atomic::AtomicBool>,
) {
    let plan = Arc::new(plan);
    let clients: Vec<_> = channels.iter().map(client).collect();
    // At most `concurrency` streams at once: a stream due while all are
    // busy starts late, and the lag counts in its latency.
    let slots = Arc::new(Semaphore::new(plan.concurrency));
    let mut n = 0u64;
    loop {
        if plan.total.is_some_and(|total| n >= total) {
            break;
        }
        let due = start + Duration::from_secs_f64(n as f64 / rps);
        if deadline.is_some_and(|d| due >= d) {
            timed_out.store(true, Ordering::Relaxed);
            break;
        }
        wait_until(due).await;
        let Ok(slot) = slots.clone().acquire_owned().await else { break };
        let lag = due.elapsed();
        let mut client = clients[(n % clients.len() as u64) as usize].clone();
        let (scripts, plan, sink) = (scripts.clone(), plan.clone(), sink.clone());
        tokio::spawn(async move {
            let script = &scripts[(n % scripts.len() as u64) as usize];
            let outcome = one(&mut client, script, n, due, &plan).await;
            let _ = sink.send((outcome, Some(lag)));
            drop(slot);
        });
        n += 1;
    }
}
