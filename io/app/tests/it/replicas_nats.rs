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
use crate::ext_proc_support::{finish_response, wait_for};
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
    // origin answers its hello with a snapshot).
    let c = nats_replica(&file, &nats, 13).await;
    wait_for("A's and B's live bookings held on C", || async { c.service().peer_bookings() == 2 }).await;

    // An outage: NATS goes away while A books and B frees, then comes
    // back (same port, same store). The clients reconnect, the readers
    // replay from where they were, and a frame the stream never took is
    // a gap that asks its origin for a snapshot.
    nats.stop();
    let (mut on_a2, _client_a2) = open(&a).await;
    let _ = pick(&mut on_a2, &body(&text("charlie"))).await;
    finish_response(&mut on_b).await;
    nats.restart();
    wait_for("everyone holds A's two bookings and nothing of B's", || async {
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
