//! Shared by the KV-event ingest scenarios: a real libzmq publisher, batch
//! builders, and a `SelectionService` to apply into.

pub mod events;
pub mod msgpack;
pub mod publisher;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvpick_core::{HashSeed, Millis, RouterConfig, SelectionService, WorkerId, WorkerSpec};
use kvpick_kv_events::{IngestConfig, KvEventIngest, SharedService};

use events::{BLOCK_SIZE, prompt_tokens};
use publisher::{ReplayLayout, TestPublisher};

/// Longest any test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(10);

pub type Service = Arc<Mutex<SelectionService>>;

pub fn service(workers: &[u64]) -> Service {
    let mut service = SelectionService::new(RouterConfig::default(), BLOCK_SIZE, 2);
    for &id in workers {
        let endpoint: SocketAddr = format!("10.0.0.{id}:8000").parse().expect("test address");
        service.upsert_worker(WorkerSpec::new(WorkerId(id), endpoint, BLOCK_SIZE), Millis(0)).expect("upsert");
    }
    Arc::new(Mutex::new(service))
}

/// Settings with quick reconnects; replays wait `replay_timeout`, and one
/// that stays silent that long is given up at once (the scenarios that
/// ask again set `replay_attempts`).
pub fn config(replay_timeout: Duration) -> IngestConfig {
    IngestConfig {
        reconnect_interval: Duration::from_millis(10),
        reconnect_interval_max: Duration::from_millis(100),
        replay_idle_timeout: replay_timeout,
        replay_attempts: 1,
        ..IngestConfig::default()
    }
}

pub fn spawn(service: &Service, cfg: IngestConfig) -> KvEventIngest {
    KvEventIngest::spawn(cfg, SharedService(Arc::clone(service))).expect("ingest starts")
}

/// The common start of a scenario: worker 1 in a service, the ingest with
/// `cfg`, and a test publisher on `topic` it has subscribed to (with a
/// replay endpoint or not).
pub fn one_publisher(topic: &str, with_replay: bool, cfg: IngestConfig) -> (Service, KvEventIngest, TestPublisher) {
    let svc = service(&[1]);
    let ingest = spawn(&svc, cfg);
    let publisher = TestPublisher::bind(topic);
    ingest.add(publisher.publisher(WorkerId(1), with_replay)).expect("publisher added");
    publisher.wait_subscribed();
    if with_replay {
        // The catch-up asked for on subscribing, answered with nothing
        // (the end marker alone): the test's own replays come next, and
        // `replays_started` counts this one.
        assert_eq!(publisher.serve_replay(ReplayLayout::WithTopic), 0, "catch-up on subscribing");
    }
    (svc, ingest, publisher)
}

/// How many leading blocks of the test prompt (`n` blocks) `worker` holds.
pub fn overlap(service: &Service, worker: u64, n: u64) -> u32 {
    let service = service.lock().expect("service lock");
    let prompt = service.prompt(&prompt_tokens(n), HashSeed::default());
    service.overlap_scores(&prompt).into_iter().find(|(w, _)| *w == WorkerId(worker)).map_or(0, |(_, depth)| depth)
}

pub fn cached_blocks(service: &Service, worker: u64) -> u64 {
    let service = service.lock().expect("service lock");
    service.loads().into_iter().find(|l| l.worker == WorkerId(worker)).map_or(0, |l| l.cached_blocks)
}

/// Polls `condition` until it holds; panics after [`WAIT`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out after {WAIT:?} waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until batch `seq` is the last applied for `worker` (every counter
/// of that batch is updated by then).
pub fn wait_for_seq(ingest: &KvEventIngest, worker: u64, seq: u64) {
    wait_until(&format!("worker {worker} applied batch {seq}"), || {
        ingest.metrics().worker(WorkerId(worker)).and_then(|w| w.last_seq) == Some(seq)
    });
}
