//! Replicas sharing bookings through NATS JetStream (the `nats`
//! transport), against a real `nats-server` on loopback: a booking made on
//! one holds load on the others until freed; a replica started later gets
//! the live bookings at once; a gap asks the origin for a snapshot; what a
//! replica must not send is refused; and a NATS outage loses nothing once
//! the server is back.

use std::path::Path;

use bytes::Bytes;
use kvpick_app::app::App;
use kvpick_app::app::settings as var;
use kvpick_core::booking::ReservationId;
use kvpick_core::replica::{PeerEvent, ReplicaId};
use kvpick_test_support::nats_server::NatsServer;

use crate::bin_support::{TempDir, fleet, write_workers};
use crate::ext_proc_support::{finish_response, wait_for, wait_within};
use crate::replicas::{batch, body, booking, loads, open, pick, prefill_on, refused, replica_with, text};

const POOL: &str = "nats-test";

/// A replica whose bookings go through NATS (no `--peers`).
async fn nats_replica(workers: &Path, nats: &NatsServer, id: u64) -> App {
    let extra = [
        (var::PEER_TRANSPORT, "nats".to_owned()),
        (var::PEER_NATS_URL, nats.url()),
        (var::PEER_NATS_POOL, POOL.to_owned()),
        (var::REPLICA_ID, id.to_string()),
        (var::PEER_GRACE_MS, "60000".to_owned()),
    ];
    replica_with(workers, 0, "", &extra).await
}

/// Every replica's own live bookings held on every other, and nothing else.
async fn converged(apps: &[&App], live: usize) -> bool {
    let peers = apps.iter().map(|a| a.service().peer_bookings()).collect::<Vec<_>>();
    let own: usize = apps.iter().map(|a| a.service().active_reservations()).sum();
    own == live && apps.iter().zip(&peers).all(|(a, p)| *p == own - a.service().active_reservations())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_bookings_through_nats_and_survive_an_outage() {
    let Some(mut nats) = NatsServer::start() else { return };
    let fleet = fleet(2).await;
    let dir = TempDir::new("replicas-nats");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let a = nats_replica(&file, &nats, 11).await;
    let b = nats_replica(&file, &nats, 12).await;

    // A's booking reaches B; B, asked for a cold prompt, goes elsewhere.
    let (mut on_a, _client_a) = open(&a).await;
    let picked_a = pick(&mut on_a, &body(&text("alpha"))).await;
    wait_for("A's booking held on B", || async { b.service().peer_bookings() == 1 }).await;
    assert!(prefill_on(&b, &picked_a).await > 0, "B counts A's booking on the worker A picked");
    let (mut on_b, _client_b) = open(&b).await;
    let picked_b = pick(&mut on_b, &body(&text("bravo"))).await;
    assert_ne!(picked_a, picked_b, "B picked the worker A just loaded");
    wait_for("B's booking held on A", || async { a.service().peer_bookings() == 1 }).await;

    // C starts later: the live bookings come to it as it starts (every
    // origin answers its hello with a snapshot), before it reports ready.
    let c = nats_replica(&file, &nats, 13).await;
    let serving = kvpick_proto::health::health_check_response::ServingStatus::Serving;
    wait_for("C ready", || async { crate::replicas_warm::readiness(c.health_addr()).await == serving }).await;
    assert_eq!(c.service().peer_bookings(), 2, "C ready without A's and B's live bookings");

    // An outage: NATS goes away while A books and B frees, then comes
    // back (same port, same store). The clients reconnect, the readers
    // replay from where they were, and a frame the stream never took is
    // a gap that asks its origin for a snapshot.
    nats.stop();
    let (mut on_a2, _client_a2) = open(&a).await;
    let _ = pick(&mut on_a2, &body(&text("charlie"))).await;
    finish_response(&mut on_b).await;
    nats.restart();
    // Within the clients' reconnect backoff and the readers' own.
    let recovered = std::time::Duration::from_secs(60);
    wait_within("everyone holds A's two bookings and nothing of B's", recovered, || async {
        converged(&[&a, &b, &c], 2).await && b.service().active_reservations() == 0
    })
    .await;

    finish_response(&mut on_a).await;
    finish_response(&mut on_a2).await;
    wait_for("every booking freed everywhere", || async { converged(&[&a, &b, &c], 0).await }).await;
    for app in [&a, &b, &c] {
        assert!(loads(app).await.iter().all(|l| l.prefill_tokens == 0 && l.requests == 0), "load left behind");
    }
    for app in [a, b, c] {
        app.shutdown().await;
    }
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_reader_refuses_garbage_impostors_and_lies_and_resyncs_a_gap() {
    let Some(nats) = NatsServer::start() else { return };
    let fleet = fleet(1).await;
    let dir = TempDir::new("replicas-nats-lies");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0]);
    let a = nats_replica(&file, &nats, 21).await;
    let worker = a.workers().all()[0].0;
    let client = async_nats::connect(nats.url()).await.unwrap_or_else(|e| panic!("connect: {e}"));
    let subject = |origin: u64| format!("kvpick.{POOL}.bookings.{origin}");
    let send = |subject: String, frame: Bytes| {
        let client = client.clone();
        async move {
            client.publish(subject, frame).await.unwrap_or_else(|e| panic!("publish: {e}"));
            client.flush().await.unwrap_or_else(|e| panic!("flush: {e}"));
        }
    };

    send(subject(7), Bytes::from_static(b"\xff\xff\xff\xff not a frame")).await;
    wait_for("garbage refused", || async { refused(&a, "malformed") == 1 }).await;
    // Origin 8 publishing on 7's subject: an impostor.
    send(subject(7), batch(8, 1, vec![PeerEvent::Reserved(booking(300, worker))])).await;
    wait_for("an impostor refused", || async { refused(&a, "origin_mismatch") == 1 }).await;
    // A booking on a worker the pool does not have is never applied.
    send(subject(7), batch(7, 1, vec![PeerEvent::Reserved(booking(301, kvpick_core::WorkerId(0xdead)))])).await;
    // Events 2 and then 4: event 3 was lost, so A asks origin 7 for a
    // snapshot on 7's resync subject.
    let mut resyncs = client.subscribe(format!("kvpick.{POOL}.resync.7")).await.unwrap_or_else(|e| panic!("{e}"));
    send(subject(7), batch(7, 2, vec![PeerEvent::Reserved(booking(302, worker))])).await;
    wait_for("origin 7's booking applied", || async { a.service().peer_bookings() == 1 }).await;
    send(subject(7), batch(7, 4, vec![PeerEvent::Freed(ReservationId(302))])).await;
    let asked = tokio::time::timeout(std::time::Duration::from_secs(10), futures_lite::StreamExt::next(&mut resyncs))
        .await
        .unwrap_or_else(|_| panic!("no resync asked"))
        .unwrap_or_else(|| panic!("resync subscription ended"));
    match kvpick_replica::decode(&asked.payload, &kvpick_replica::Limits::default()) {
        Ok(kvpick_replica::Frame::Resync(r)) => assert_eq!((r.origin, r.from_seq), (ReplicaId(7), 3)),
        other => panic!("not a resync request: {other:?}"),
    }
    let stats = a.replicas().map(|r| r.stats().snapshot()).unwrap_or_default();
    let seven = stats.origins.get(&ReplicaId(7)).copied().unwrap_or_default();
    assert_eq!((seven.stats.unknown_worker, seven.stats.gaps), (1, 1), "{seven:?}");
    a.shutdown().await;
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_later_takes_the_index_through_nats() {
    use std::sync::atomic::Ordering;

    use crate::replicas_warm::{overlaps, prompts, transport, write_workers_without_replay};

    let Some(nats) = NatsServer::start() else { return };
    let fleet = fleet(2).await;
    let dir = TempDir::new("replicas-nats-warm");
    let file = dir.path("workers.json");
    // No replay endpoints: what a replica did not hear, it cannot ask for.
    write_workers_without_replay(&file, &fleet);
    let a = nats_replica(&file, &nats, 31).await;
    wait_for("A's warm start over (cold: nobody to ask)", || async {
        transport(&a).warm_outcome.load(Ordering::Relaxed) == 2
    })
    .await;
    wait_for("A subscribed to both engines", || async { a.ingest().metrics().workers().len() == 2 }).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let prompts = prompts();
    for (i, tokens) in prompts.iter().enumerate() {
        let engine = fleet.get(i % 2).unwrap_or_else(|| panic!("engine {i}"));
        engine
            .generate(kvpick_sim::RequestSpec { prompt: tokens.clone(), max_tokens: 2, seed: None })
            .await
            .unwrap_or_else(|e| panic!("generate: {e}"));
    }
    for tokens in &prompts {
        wait_for("A learned the prompt's blocks", || async { overlaps(&a, tokens).await.iter().any(|(_, d)| *d >= 8) })
            .await;
    }

    // B has no direct peer at all: its index comes through NATS's object
    // store, from A.
    let b = nats_replica(&file, &nats, 32).await;
    wait_for("B's warm start over", || async { transport(&b).warm_outcome.load(Ordering::Relaxed) != 0 }).await;
    assert_eq!(transport(&b).warm_outcome.load(Ordering::Relaxed), 1, "B started cold");
    assert_eq!(transport(&b).warm_workers_seeded.load(Ordering::Relaxed), 2);
    for tokens in &prompts {
        assert_eq!(overlaps(&b, tokens).await, overlaps(&a, tokens).await, "B does not know what A knows");
    }
    let m = b.ingest().metrics().snapshot();
    assert_eq!((m.streams_seeded, m.streams_released_cold, m.lost_batches), (2, 0, 0));
    assert_eq!(transport(&a).indexes_served.load(Ordering::Relaxed), 1, "B took A's whole index");
    for app in [a, b] {
        app.shutdown().await;
    }
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_deleted_under_the_replicas_is_made_again_and_they_resync() {
    let Some(nats) = NatsServer::start() else { return };
    let fleet = fleet(2).await;
    let dir = TempDir::new("replicas-nats-deleted");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let a = nats_replica(&file, &nats, 41).await;
    let b = nats_replica(&file, &nats, 42).await;
    let (mut on_a, _client_a) = open(&a).await;
    pick(&mut on_a, &body(&text("alpha"))).await;
    wait_for("A's booking held on B", || async { b.service().peer_bookings() == 1 }).await;

    // An operator deletes the pool's stream (and with it every consumer):
    // the readers lose their consumers, make the stream again and start
    // over from snapshots.
    let client = async_nats::connect(nats.url()).await.unwrap_or_else(|e| panic!("connect: {e}"));
    let js = async_nats::jetstream::new(client);
    js.delete_stream(format!("KVPICK_{POOL}")).await.unwrap_or_else(|e| panic!("delete: {e}"));
    let (mut on_b, _client_b) = open(&b).await;
    pick(&mut on_b, &body(&text("bravo"))).await;
    finish_response(&mut on_a).await;
    let recovered = std::time::Duration::from_secs(60);
    wait_within("B's booking held on A and A's free on B", recovered, || async {
        a.service().peer_bookings() == 1 && b.service().peer_bookings() == 0
    })
    .await;
    finish_response(&mut on_b).await;
    wait_within("every booking freed on both", recovered, || async { converged(&[&a, &b], 0).await }).await;
    let m = js.get_stream(format!("KVPICK_{POOL}")).await;
    assert!(m.is_ok(), "the stream was made again");
    for app in [a, b] {
        app.shutdown().await;
    }
    fleet.shutdown().await;
}
