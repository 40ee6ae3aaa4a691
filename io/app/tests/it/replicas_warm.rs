//! Warm start in `kvpick serve`: a replica started after its peer takes
//! the peer's KV index before it reports ready, so it knows the engines'
//! caches at once; a cold one (warm start off) knows nothing of what was
//! cached before it subscribed (these engines have no replay endpoint,
//! as many fleets run). Its peers' live bookings are in before it reports
//! ready too. Readiness waits for the warm start, bounded by its deadline.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvpick_app::app::App;
use kvpick_app::app::settings as var;
use kvpick_core::WorkerId;
use kvpick_core::hashing::HashSeed;
use kvpick_core::prompt::Prompt;
use kvpick_discovery::workers_file::{self, Entry};
use kvpick_grpc::health::READINESS;
use kvpick_proto::health::HealthCheckRequest;
use kvpick_proto::health::health_check_response::ServingStatus;
use kvpick_proto::health::health_client::HealthClient;
use kvpick_runtime::ThreadProducers;
use kvpick_sim::{Fleet, RequestSpec};
use tokio::net::TcpListener;

use crate::bin_support::{TempDir, fleet};
use crate::ext_proc_support::wait_for;
use crate::replicas::{body, free_port, open, pick, prefill_on, replica_with, text};

/// The engines' workers file, without their replay endpoints.
pub(crate) fn write_workers_without_replay(path: &Path, fleet: &Fleet) {
    let entries: Vec<Entry> =
        fleet.engines().iter().map(|e| Entry::new(e.endpoints().http, e.endpoints().events.clone(), None)).collect();
    workers_file::write(path, &entries).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Prompts of 8 blocks of 16 tokens, distinct.
pub(crate) fn prompts() -> Vec<Vec<u32>> {
    (0..6u32).map(|p| (0..128).map(|t| p * 10_000 + t + 1).collect()).collect()
}

/// The workers holding a prefix of `tokens`, and how deep, as `app` knows.
pub(crate) async fn overlaps(app: &App, tokens: &[u32]) -> Vec<(WorkerId, u32)> {
    let producers = ThreadProducers::new(app.service().clone());
    let prompt = Prompt::from_tokens(tokens, 16, HashSeed::default());
    app.service().overlap_scores(&producers, &prompt).await
}

pub(crate) fn transport(app: &App) -> &kvpick_replica::TransportMetrics {
    &app.replicas().unwrap_or_else(|| panic!("replica sync is off")).transport
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_later_knows_the_engines_caches_at_once() {
    let fleet = fleet(2).await;
    let dir = TempDir::new("replicas-warm");
    let file = dir.path("workers.json");
    write_workers_without_replay(&file, &fleet);
    let ports = [free_port(), free_port(), free_port()];
    let peers = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let a = replica_with(&file, ports[0], &peers, &[]).await;
    wait_for("A's warm start over (cold: no peer yet)", || async {
        transport(&a).warm_outcome.load(Ordering::Relaxed) == 2
    })
    .await;
    // Wait for A's subscriptions before the engines publish: PUB drops
    // what is sent before a subscriber joins.
    wait_for("A subscribed to both engines", || async { a.ingest().metrics().workers().len() == 2 }).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The engines serve prompts directly: their caches fill and their KV
    // events reach A (no replay: whoever was not listening missed them).
    let prompts = prompts();
    for (i, tokens) in prompts.iter().enumerate() {
        let engine = fleet.get(i % 2).unwrap_or_else(|| panic!("engine {i}"));
        engine
            .generate(RequestSpec { prompt: tokens.clone(), max_tokens: 2, seed: None })
            .await
            .unwrap_or_else(|e| panic!("generate: {e}"));
    }
    for tokens in &prompts {
        wait_for("A learned the prompt's blocks", || async { overlaps(&a, tokens).await.iter().any(|(_, d)| *d >= 8) })
            .await;
    }

    // A request A picked and still serves: a booking live on A.
    let (mut on_a, _client) = open(&a).await;
    let picked = pick(&mut on_a, &body(&text("alpha"))).await;

    // B warm (the default), C cold.
    let b = replica_with(&file, ports[1], &peers, &[]).await;
    let c = replica_with(&file, ports[2], &peers, &[(var::WARM_START_TIMEOUT_MS, "0".to_owned())]).await;
    wait_for("B ready", || async { readiness(b.health_addr()).await == ServingStatus::Serving }).await;
    // Ready means A's live booking is in: B's first picks see that load.
    assert_eq!(b.service().peer_bookings(), 1, "B ready without A's live booking");
    assert!(prefill_on(&b, &picked).await > 0, "B does not count A's booking on the worker A picked");
    wait_for("B's warm start over", || async { transport(&b).warm_outcome.load(Ordering::Relaxed) != 0 }).await;
    assert_eq!(transport(&b).warm_outcome.load(Ordering::Relaxed), 1, "B started cold");
    assert_eq!(transport(&b).warm_workers_seeded.load(Ordering::Relaxed), 2);
    assert_eq!(transport(&c).warm_outcome.load(Ordering::Relaxed), 0, "C had no warm start");
    for tokens in &prompts {
        let at_a = overlaps(&a, tokens).await;
        assert_eq!(overlaps(&b, tokens).await, at_a, "B does not know what A knows");
        assert!(overlaps(&c, tokens).await.is_empty(), "a cold replica knew a cache it never heard of");
    }
    assert_eq!(transport(&a).indexes_served.load(Ordering::Relaxed), 1, "B took A's whole index");
    let m = b.ingest().metrics().snapshot();
    assert_eq!((m.streams_seeded, m.streams_released_cold, m.lost_batches), (2, 0, 0));

    // Later events reach B as they reach A: a new prompt on engine 0.
    let more: Vec<u32> = (0..64).map(|t| 900_000 + t).collect();
    fleet
        .get(0)
        .unwrap_or_else(|| panic!("engine 0"))
        .generate(RequestSpec { prompt: more.clone(), max_tokens: 2, seed: None })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for("B learned the new prompt as A did", || async {
        let at_a = overlaps(&a, &more).await;
        !at_a.is_empty() && overlaps(&b, &more).await == at_a
    })
    .await;
    crate::ext_proc_support::finish_response(&mut on_a).await;
    wait_for("A's booking freed on B", || async { b.service().peer_bookings() == 0 }).await;
    for app in [a, b, c] {
        app.shutdown().await;
    }
    fleet.shutdown().await;
}

pub(crate) async fn readiness(health: SocketAddr) -> ServingStatus {
    let channel = tonic::transport::Channel::from_shared(format!("http://{health}"))
        .unwrap_or_else(|e| panic!("{e}"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut client = HealthClient::new(channel);
    let status = client.check(HealthCheckRequest { service: READINESS.into() }).await;
    ServingStatus::try_from(status.unwrap_or_else(|e| panic!("{e}")).into_inner().status)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_warm_start_until_its_deadline() {
    let fleet = fleet(1).await;
    let dir = TempDir::new("replicas-warm-deadline");
    let file = dir.path("workers.json");
    write_workers_without_replay(&file, &fleet);
    // A peer that takes connections and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
    let silent_addr = silent.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    let started = Instant::now();
    let app =
        replica_with(&file, 0, &silent_addr.to_string(), &[(var::WARM_START_TIMEOUT_MS, "1500".to_owned())]).await;
    assert_eq!(readiness(app.health_addr()).await, ServingStatus::NotServing, "ready while warming up");
    wait_for("ready after the deadline", || async { readiness(app.health_addr()).await == ServingStatus::Serving })
        .await;
    assert!(started.elapsed() >= Duration::from_millis(1400), "ready before the deadline: {:?}", started.elapsed());
    assert_eq!(transport(&app).warm_outcome.load(Ordering::Relaxed), 2, "not cold");
    assert_eq!(app.ingest().metrics().snapshot().streams_released_cold, 1);
    hold.abort();
    app.shutdown().await;
    fleet.shutdown().await;
}
