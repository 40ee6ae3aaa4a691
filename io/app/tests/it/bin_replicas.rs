//! Two `kvpick serve` processes sharing bookings over the `direct`
//! transport, behind gateway stand-ins that spread requests over them:
//! they converge under load, across a frozen replica (its streams stall,
//! then resume) and across a replica killed mid-booking and restarted;
//! and the same load and restart through NATS JetStream (the `nats`
//! transport, a real nats-server on loopback).

use std::time::Duration;

use futures::future::join_all;
use kvpick_test_support::gateway::Gateway;
use kvpick_test_support::nats_server::NatsServer;

use crate::bin_support::{
    Kvpick, TempDir, chat, fleet, scrape, serve, until, value, write_roled_workers, write_workers,
};
use crate::ext_proc_support::finish_response;
use crate::replicas::{body, free_port, open_at, pick, text};

const TOKEN: &str = "bin-replica-token";

fn replica(file: &std::path::Path, port: u16, peers: &str) -> Kvpick {
    let port = port.to_string();
    // A grace period far past the test: what converges, converges by the
    // protocol (frees, snapshots, a new incarnation), not by forgetting.
    let flags = ["--replica-sync-port", &port, "--peers", peers, "--peer-token", TOKEN, "--peer-grace-ms", "600000"];
    serve(file, &flags)
}

/// Waits for its first stream to a peer, which may already have been
/// logged before its `listening` line (read by `serve`).
fn wait_streaming(kvpick: &mut Kvpick) {
    const STREAMING: &str = "replica sync: streaming to a peer";
    let seen = kvpick.log.iter().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    if !seen.into_iter().any(|v| v["message"] == STREAMING) {
        kvpick.wait_log(|v| v["message"] == STREAMING);
    }
}

/// Requests spread round-robin over the replicas' gateways, `concurrency`
/// at a time; every one must succeed.
async fn load(gateways: &[Gateway], topic: &str, requests: usize, concurrency: usize) {
    let shared = format!("A long shared system prompt about {topic}, repeated to span blocks. ").repeat(8);
    for wave in 0..requests.div_ceil(concurrency) {
        let calls = (0..concurrency).map(|i| {
            let n = wave * concurrency + i;
            let gateway = &gateways[n % gateways.len()];
            let text = format!("{shared} question {n}");
            async move { gateway.post("/v1/chat/completions", &chat(&text)).await }
        });
        for exchange in join_all(calls).await {
            let exchange = exchange.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(exchange.status, 200, "{}", String::from_utf8_lossy(&exchange.body));
        }
    }
}

/// 24 requests over both replicas' gateways: each applied every change
/// of the other's, with no gap and none refused, and every booking freed.
async fn shared_load(a: &Kvpick, b: &Kvpick) -> [Gateway; 2] {
    let gateways = [
        Gateway::connect(a.ext_proc).await.unwrap_or_else(|e| panic!("{e}")),
        Gateway::connect(b.ext_proc).await.unwrap_or_else(|e| panic!("{e}")),
    ];
    load(&gateways, "rivers", 24, 6).await;
    converged_to_nothing(&[a, b]).await;
    for kvpick in [a, b] {
        let m = scrape(kvpick.metrics).await;
        let own = value(&m, "kvpick_replica_own_events_total", &[]);
        assert!(own >= 24.0, "each of its 12 requests reserved and freed: {own}");
        assert!(value(&m, "kvpick_replica_peer_events_applied_total", &[]) >= 24.0, "the other's applied");
        assert_eq!(value(&m, "kvpick_replica_peer_gaps_total", &[]), 0.0);
        assert_eq!(value(&m, "kvpick_replica_peer_refused_total", &[]), 0.0);
        let delays = value(&m, "kvpick_replica_peer_delay_seconds_count", &[]);
        assert!(delays >= 1.0, "the delay of the other's batches measured: {delays}");
    }
    gateways
}

/// Every booking freed, on both, as each sees its own and the other's.
async fn converged_to_nothing(replicas: &[&Kvpick]) {
    for kvpick in replicas {
        until(kvpick, "every booking freed, own and peers'", |m| {
            value(m, "kvpick_reservations_active", &[]) == 0.0
                && value(m, "kvpick_replica_own_bookings", &[]) == 0.0
                && value(m, "kvpick_replica_peer_bookings", &[]) == 0.0
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_processes_share_bookings_through_a_freeze_and_a_restart() {
    let fleet = fleet(2).await;
    let dir = TempDir::new("bin-replicas");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let ports = [free_port(), free_port()];
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let mut a = replica(&file, ports[0], &peers);
    let mut b = replica(&file, ports[1], &peers);
    wait_streaming(&mut a);
    wait_streaming(&mut b);

    let gateways = shared_load(&a, &b).await;

    // B frozen (SIGSTOP): A's stream to it stalls, A goes on booking and
    // freeing; thawed, B catches up to A's live set (nothing).
    b.signal("STOP");
    load(&gateways[..1], "lakes", 12, 4).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.signal("CONT");
    load(&gateways, "seas", 8, 4).await;
    converged_to_nothing(&[&a, &b]).await;

    kill_and_restart_b(&a, b, &gateways[0], || {
        let mut b = replica(&file, ports[1], &peers);
        wait_streaming(&mut b);
        b
    })
    .await;
    fleet.shutdown().await;
}

/// B killed while it holds a booking: A keeps it (no free came, the
/// grace period is long) until B's next incarnation (`restart`) replaces
/// it. Then the pair shares as before: a load over both, and a request
/// held on A across the end whose booking and free reach the new B.
async fn kill_and_restart_b(a: &Kvpick, mut b: Kvpick, gateway_a: &Gateway, restart: impl FnOnce() -> Kvpick) {
    let (mut on_b, client) = open_at(b.ext_proc).await;
    pick(&mut on_b, &body(&text("held"))).await;
    until(a, "B's booking held on A", |m| value(m, "kvpick_replica_peer_bookings", &[]) == 1.0).await;
    b.signal("KILL");
    b.wait_exit();
    drop((on_b, client));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = scrape(a.metrics).await;
    assert_eq!(value(&m, "kvpick_replica_peer_bookings", &[]), 1.0, "a killed peer's booking outlives its stream");
    let b = restart();
    until(a, "the restarted B's new incarnation clears its old booking", |m| {
        value(m, "kvpick_replica_peer_restarts_total", &[]) == 1.0
            && value(m, "kvpick_replica_peer_bookings", &[]) == 0.0
    })
    .await;
    let gateways = [gateway_a.clone(), Gateway::connect(b.ext_proc).await.unwrap_or_else(|e| panic!("{e}"))];
    load(&gateways, "glaciers", 8, 4).await;
    let (mut on_a, _client) = open_at(a.ext_proc).await;
    pick(&mut on_a, &body(&text("late"))).await;
    until(&b, "A's booking held on the new B", |m| value(m, "kvpick_replica_peer_bookings", &[]) == 1.0).await;
    finish_response(&mut on_a).await;
    converged_to_nothing(&[a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_requests_two_legs_reach_the_peer_as_two_bookings() {
    let fleet = fleet(3).await;
    let dir = TempDir::new("bin-replicas-disagg");
    let file = dir.path("workers.yaml");
    write_roled_workers(&file, &fleet);
    let ports = [free_port(), free_port()];
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let disagg = |port: u16| {
        let port = port.to_string();
        let flags =
            ["--replica-sync-port", &port, "--peers", &peers, "--peer-token", TOKEN, "--pd-threshold-tokens", "64"];
        serve(&file, &flags)
    };
    let (mut a, mut b) = (disagg(ports[0]), disagg(ports[1]));
    wait_streaming(&mut a);
    wait_streaming(&mut b);

    // A long prompt on A is split: its prefill and decode legs are both
    // booked on A until the response starts, and B holds both.
    let (mut call, _client) = open_at(a.ext_proc).await;
    pick(&mut call, &body(&text("a long prompt about tides and moons, word "))).await;
    until(&a, "A booked both legs", |m| {
        value(m, "kvpick_prefill_reservations_active", &[]) == 1.0 && value(m, "kvpick_reservations_active", &[]) == 1.0
    })
    .await;
    until(&b, "B holds both of A's legs", |m| value(m, "kvpick_replica_peer_bookings", &[]) == 2.0).await;
    finish_response(&mut call).await;
    converged_to_nothing(&[&a, &b]).await;
    let m = scrape(b.metrics).await;
    assert_eq!(value(&m, "kvpick_replica_peer_refused_total", &[]), 0.0, "every leg applied on B");
    assert!(value(&m, "kvpick_replica_peer_events_applied_total", &[]) >= 4.0, "two reserves, two frees");
    fleet.shutdown().await;
}

/// A replica sharing through NATS; its replica-sync port (which names it)
/// is fixed, so a restart is the same replica's next incarnation.
fn nats_replica(file: &std::path::Path, port: u16, nats: &NatsServer) -> Kvpick {
    let (port, url) = (port.to_string(), nats.url());
    let flags = [
        "--replica-sync-port",
        &port,
        "--peer-transport",
        "nats",
        "--peer-nats-url",
        &url,
        "--peer-nats-pool",
        "bin-test",
        "--peer-grace-ms",
        "600000",
    ];
    serve(file, &flags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_processes_share_bookings_through_nats_across_a_restart() {
    let Some(nats) = NatsServer::start() else { return };
    let fleet = fleet(2).await;
    let dir = TempDir::new("bin-replicas-nats");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let ports = [free_port(), free_port()];
    let a = nats_replica(&file, ports[0], &nats);
    let b = nats_replica(&file, ports[1], &nats);
    let gateways = shared_load(&a, &b).await;

    kill_and_restart_b(&a, b, &gateways[0], || nats_replica(&file, ports[1], &nats)).await;
    fleet.shutdown().await;
}
