//! Several kvpick replicas in one process (`App`s over the same simulated
//! engines), sharing bookings over the `direct` transport: a booking made
//! on one holds load on the other until it is freed, and the peer port
//! refuses what a peer must not send.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use kvpick_app::app::settings::{self as var, Values};
use kvpick_app::app::{App, ServeConfig};
use kvpick_core::booking::ReservationId;
use kvpick_core::replica::{Batch, Incarnation, PeerBooking, PeerEvent, ReplicaId};
use kvpick_core::{LoadSnapshot, WorkerId};
use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use kvpick_replica::codec::RawCodec;
use kvpick_replica::{Frame, encode};
use kvpick_runtime::ThreadProducers;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::bin_support::{TempDir, fleet, write_workers};
use crate::ext_proc_support::{Call, chat_headers, destination, finish_response, request_body, streamed, wait_for};

const TOKEN: &str = "replica-test-token";

/// A port free now, for a replica whose peers must know it before it
/// starts (each lists the other). Taken outside the kernel's ephemeral
/// range, which every bind to port 0 draws from: the apps' own listeners
/// (ext-proc, metrics) bind port 0 and could be given a port handed out
/// here before its replica binds it (a replica of the partition test once
/// failed to start). Below the range if there is room, else above it;
/// handed out once per process.
pub(crate) fn free_port() -> u16 {
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let mut next = NEXT.lock().unwrap_or_else(PoisonError::into_inner);
    let mut candidate = next.unwrap_or_else(|| {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
        let mut bounds = range.split_whitespace().map(|bound| bound.parse::<u16>().ok());
        let (low, high) = (bounds.next().flatten().unwrap_or(32_768), bounds.next().flatten().unwrap_or(60_999));
        // Apart from another test process's ports, should one run at once.
        let offset = (std::process::id() % 16) as u16 * 200;
        if low > 5_000 + offset { low - 1 - offset } else { high.saturating_add(4_000 + offset) }
    });
    loop {
        assert!(candidate > 1024, "no free port outside the ephemeral range");
        let port = candidate;
        candidate -= 1;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *next = Some(candidate);
            return port;
        }
    }
}

async fn replica(workers: &Path, port: u16, peers: &str) -> App {
    replica_with(workers, port, peers, &[]).await
}

/// A replica with `extra` settings on top of the shared token.
pub(crate) async fn replica_with(workers: &Path, port: u16, peers: &str, extra: &[(&'static str, String)]) -> App {
    let mut values = Values::loopback_static(workers);
    values.set(var::SHARDS, "1");
    values.set(var::MODEL, "sim-model");
    values.set(var::REPLICA_SYNC_PORT, port.to_string());
    if !peers.is_empty() {
        values.set(var::PEERS, peers);
    }
    values.set(var::PEER_TOKEN, TOKEN);
    for (name, value) in extra {
        values.set(name, value.clone());
    }
    let config = ServeConfig::from_values(&values).unwrap_or_else(|e| panic!("config: {e}"));
    App::start(config).await.unwrap_or_else(|e| panic!("start: {e}"))
}

pub(crate) fn body(words: &str) -> String {
    serde_json::json!({"model": "sim-model", "messages": [{"role": "user", "content": words}], "stream": true})
        .to_string()
}

pub(crate) fn text(prefix: &str) -> String {
    (0..60).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>().join(" ")
}

pub(crate) async fn open(app: &App) -> (Call, ExternalProcessorClient<tonic::transport::Channel>) {
    open_at(app.ext_proc_addr()).await
}

pub(crate) async fn open_at(ext_proc: SocketAddr) -> (Call, ExternalProcessorClient<tonic::transport::Channel>) {
    let mut client =
        ExternalProcessorClient::connect(format!("http://{ext_proc}")).await.unwrap_or_else(|e| panic!("connect: {e}"));
    (Call::open(&mut client).await, client)
}

pub(crate) async fn pick(call: &mut Call, body: &str) -> String {
    call.send(chat_headers());
    call.send(request_body(body.as_bytes(), true));
    let headers = call.recv().await;
    let destination = destination(&headers).unwrap_or_else(|| panic!("no pick in {headers:?}"));
    assert!(streamed(&call.recv().await).is_some(), "body echoed");
    destination
}

pub(crate) async fn loads(app: &App) -> Vec<LoadSnapshot> {
    let producers = ThreadProducers::new(app.service().clone());
    app.service().loads(&producers).await
}

pub(crate) async fn prefill_on(app: &App, endpoint: &str) -> u64 {
    let worker = app.workers().all().into_iter().find(|(_, at)| at.to_string() == endpoint).map(|(id, _)| id);
    loads(app).await.iter().filter(|l| Some(l.worker) == worker).map(|l| l.prefill_tokens).sum()
}

pub(crate) async fn links_up(app: &App) -> bool {
    let replicas = app.replicas().unwrap_or_else(|| panic!("replica sync is off"));
    replicas.transport.links_up.load(std::sync::atomic::Ordering::Relaxed) == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_on_one_replica_holds_load_on_the_other_until_freed() {
    let fleet = fleet(2).await;
    let dir = TempDir::new("replicas");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1]);
    let ports = [free_port(), free_port()];
    // Both list both: each finds itself in the list and stops dialing it.
    // A by name (looked up while the replicas run; /etc/hosts answers).
    let peers = format!("localhost:{},127.0.0.1:{}", ports[0], ports[1]);
    let a = replica(&file, ports[0], &peers).await;
    let b = replica(&file, ports[1], &peers).await;
    wait_for("each replica streaming to the other", || async { links_up(&a).await && links_up(&b).await }).await;

    let (mut on_a, client_a) = open(&a).await;
    let picked_a = pick(&mut on_a, &body(&text("alpha"))).await;
    assert!(prefill_on(&a, &picked_a).await > 0, "booked on A");
    wait_for("A's booking held on B", || async { b.service().peer_bookings() == 1 }).await;
    // B lists a peer's booking before its shard has applied it (the
    // shard's answer comes after): wait for the load, not the list.
    wait_for("B counts A's booking on the worker A picked", || async { prefill_on(&b, &picked_a).await > 0 }).await;
    assert!(prefill_on(&b, &picked_a).await > 0, "B counts A's booking on the worker A picked");

    // B, asked for a cold prompt, goes where A's booking is not: the
    // herding sharing prevents.
    let (mut on_b, client_b) = open(&b).await;
    let picked_b = pick(&mut on_b, &body(&text("bravo"))).await;
    assert_ne!(picked_a, picked_b, "B picked the worker A just loaded");
    wait_for("B's booking held on A", || async { a.service().peer_bookings() == 1 }).await;

    finish_response(&mut on_a).await;
    finish_response(&mut on_b).await;
    wait_for("every booking freed on both", || async {
        a.service().active_reservations() == 0
            && b.service().active_reservations() == 0
            && a.service().peer_bookings() == 0
            && b.service().peer_bookings() == 0
    })
    .await;
    // Each one's view of the other, as reported once its sync has taken
    // the last frame: every change the other published, applied.
    let stats = |app: &App| app.replicas().map(|r| r.stats().snapshot()).unwrap_or_default();
    let caught_up = |from: &App, at: &App| {
        let published = stats(from).own_events;
        stats(at).origins.values().next().is_some_and(|o| o.stats.events_applied == published)
    };
    wait_for("each replica reported the other's last change", || async { caught_up(&a, &b) && caught_up(&b, &a) })
        .await;
    for (app, other) in [(&a, &b), (&b, &a)] {
        assert!(loads(app).await.iter().all(|l| l.prefill_tokens == 0 && l.requests == 0), "load left behind");
        let own = stats(app);
        assert_eq!(own.own_live, 0);
        // Reserved and freed (a response that ends in its first chunk
        // frees without a separate end of prefill).
        assert!(own.own_events >= 2, "{own:?}");
        let origin = own.origins.values().next().copied().unwrap_or_default();
        assert_eq!(origin.stats.events_applied, stats(other).own_events, "{origin:?}");
        assert_eq!((origin.live, origin.stats.gaps, origin.refused), (0, 0, 0), "{origin:?}");
    }
    // A gateway connection left open holds shutdown for its grace period.
    drop((on_a, on_b, client_a, client_b));
    a.shutdown().await;
    b.shutdown().await;
    fleet.shutdown().await;
}

/// One replica over one engine whose only peer never answers: it just
/// listens. Also its replica-sync address and the engine's worker id.
async fn listening_replica(tag: &str) -> (kvpick_sim::Fleet, TempDir, App, SocketAddr, WorkerId) {
    let fleet = fleet(1).await;
    let dir = TempDir::new(tag);
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0]);
    let app = replica(&file, 0, &format!("127.0.0.1:{}", free_port())).await;
    let port = app.replica_sync_addr().unwrap_or_else(|| panic!("no replica-sync port"));
    let worker = app.workers().all()[0].0;
    (fleet, dir, app, port, worker)
}

/// A raw gRPC client of a replica-sync port, as a peer (or an impostor).
async fn peer_client(to: SocketAddr) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{to}"))
        .unwrap_or_else(|e| panic!("{e}"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let mut client = tonic::client::Grpc::new(channel).max_encoding_message_size(64 << 20);
    client.ready().await.unwrap_or_else(|e| panic!("{e}"));
    client
}

/// A raw peer stream to `to`, sending `frames` with `token`; returns how
/// the stream ended.
async fn exchange(to: SocketAddr, token: Option<&str>, frames: Vec<Bytes>) -> Result<(), tonic::Status> {
    let mut client = peer_client(to).await;
    let (tx, rx) = mpsc::channel(16);
    for frame in frames {
        tx.send(frame).await.unwrap_or_else(|e| panic!("{e}"));
    }
    drop(tx);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", MetadataValue::try_from(format!("Bearer {token}")).unwrap());
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/kvpick.peer.v1.Peer/Exchange");
    let mut answers = client.streaming(request, path, RawCodec).await?.into_inner();
    while answers.message().await?.is_some() {}
    Ok(())
}

pub(crate) fn booking(id: u64, worker: WorkerId) -> PeerBooking {
    PeerBooking {
        id: ReservationId(id),
        worker,
        seq_hashes: Arc::from(vec![]),
        unhashed_blocks: 4,
        prefill_tokens: 64,
        lease_left_ms: 60_000,
        prefill_done: false,
    }
}

pub(crate) fn batch(origin: u64, first_seq: u64, events: Vec<PeerEvent>) -> Bytes {
    Bytes::from(encode(&Frame::Batch(Batch {
        sent_unix_micros: 0,
        origin: ReplicaId(origin),
        incarnation: Incarnation(1),
        first_seq,
        events,
    })))
}

pub(crate) fn refused(app: &App, reason: &str) -> u64 {
    app.replicas().map_or(0, |r| r.transport.refusals().get(reason).copied().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_refuses_strangers_garbage_and_lies() {
    let (fleet, _dir, a, port, worker) = listening_replica("replica-port").await;

    let no_token = exchange(port, None, vec![batch(7, 1, vec![])]).await;
    assert_eq!(no_token.map_err(|s| s.code()), Err(Code::Unauthenticated));
    let wrong = exchange(port, Some("guess"), vec![batch(7, 1, vec![])]).await;
    assert_eq!(wrong.map_err(|s| s.code()), Err(Code::Unauthenticated));
    assert_eq!(refused(&a, "unauthenticated"), 2);

    let garbage = exchange(port, Some(TOKEN), vec![Bytes::from_static(b"\xff\xff\xff\xff not a frame")]).await;
    assert_eq!(garbage.map_err(|s| s.code()), Err(Code::InvalidArgument));
    assert_eq!(refused(&a, "malformed"), 1);
    let oversized = exchange(port, Some(TOKEN), vec![Bytes::from(vec![0u8; 17 << 20])]).await;
    assert_eq!(oversized.map_err(|s| s.code()), Err(Code::OutOfRange), "a frame over 16 MiB is refused");
    wait_for("the oversized frame counted", || async { refused(&a, "too_large") == 1 }).await;

    // A booking on a worker the pool does not have is never applied; one
    // on its worker is, and only its origin may free it.
    let lies = vec![
        batch(7, 1, vec![PeerEvent::Reserved(booking(100, WorkerId(0xdead_beef)))]),
        batch(7, 2, vec![PeerEvent::Reserved(booking(101, worker))]),
        batch(8, 1, vec![PeerEvent::Freed(ReservationId(101))]),
    ];
    exchange(port, Some(TOKEN), lies).await.unwrap_or_else(|s| panic!("{s}"));
    // The service holds the booking before the sync reports the frame,
    // and origin 8's frame comes after: wait for all three reported.
    let reported = || {
        let stats = a.replicas().map(|r| r.stats().snapshot()).unwrap_or_default();
        let seven = stats.origins.get(&ReplicaId(7)).map_or(0, |o| o.last_seq);
        let eight = stats.origins.get(&ReplicaId(8)).map_or(0, |o| o.last_seq);
        (seven, eight) == (2, 1)
    };
    wait_for("origin 7's real booking applied and both origins reported", || async {
        a.service().peer_bookings() == 1 && reported()
    })
    .await;
    let stats = a.replicas().map(|r| r.stats().snapshot()).unwrap_or_default();
    let seven = stats.origins.get(&ReplicaId(7)).copied().unwrap_or_default();
    assert_eq!(seven.stats.unknown_worker, 1, "{seven:?}");
    assert_eq!(seven.live, 2, "both mirrored, one applied");
    assert_eq!(loads(&a).await.iter().map(|l| l.prefill_tokens).sum::<u64>(), 64);
    let eight = stats.origins.get(&ReplicaId(8)).copied().unwrap_or_default();
    assert_eq!(eight.stats.unknown_ids, 1, "origin 8 cannot free 7's booking: {eight:?}");

    // Its origin frees it.
    exchange(port, Some(TOKEN), vec![batch(7, 3, vec![PeerEvent::Freed(ReservationId(101))])])
        .await
        .unwrap_or_else(|s| panic!("{s}"));
    wait_for("freed by its origin", || async { a.service().peer_bookings() == 0 }).await;
    assert_eq!(loads(&a).await.iter().map(|l| l.prefill_tokens).sum::<u64>(), 0);
    a.shutdown().await;
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_peer_frame_is_asked_for_again_as_a_snapshot() {
    let (fleet, _dir, a, port, worker) = listening_replica("replica-gap").await;
    let mut client = peer_client(port).await;
    let (tx, rx) = mpsc::channel(16);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert("authorization", MetadataValue::try_from(format!("Bearer {TOKEN}")).unwrap());
    // Event 1, then event 3: event 2 (a second booking) was lost.
    tx.send(batch(9, 1, vec![PeerEvent::Reserved(booking(200, worker))])).await.unwrap();
    tx.send(batch(9, 3, vec![PeerEvent::Freed(ReservationId(200))])).await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/kvpick.peer.v1.Peer/Exchange");
    let mut answers = client.streaming(request, path, RawCodec).await.unwrap_or_else(|s| panic!("{s}")).into_inner();
    let asked = answers.message().await.unwrap_or_else(|s| panic!("{s}")).unwrap_or_else(|| panic!("no answer"));
    match kvpick_replica::decode(&asked, &kvpick_replica::Limits::default()) {
        Ok(Frame::Resync(request)) => {
            assert_eq!((request.origin, request.incarnation, request.from_seq), (ReplicaId(9), Incarnation(1), 2));
        }
        other => panic!("expected a resync request, got {other:?}"),
    }
    assert_eq!(a.service().peer_bookings(), 1, "event 3 waits for the snapshot");
    // The snapshot after event 3: booking 201 (booked by the lost event 2)
    // is live, 200 is not.
    let snapshot = kvpick_core::replica::Snapshot {
        origin: ReplicaId(9),
        incarnation: Incarnation(1),
        last_seq: 3,
        bookings: vec![booking(201, worker)],
    };
    tx.send(Bytes::from(encode(&Frame::Snapshot(snapshot)))).await.unwrap();
    tx.send(batch(9, 4, vec![PeerEvent::Freed(ReservationId(201))])).await.unwrap();
    wait_for("the snapshot applied, then the stream after it", || async {
        let stats = a.replicas().map(|r| r.stats().snapshot()).unwrap_or_default();
        stats.origins.get(&ReplicaId(9)).is_some_and(|o| o.last_seq == 4 && o.live == 0 && o.stats.resyncs == 1)
    })
    .await;
    assert_eq!(a.service().peer_bookings(), 0);
    assert_eq!(loads(&a).await.iter().map(|l| l.prefill_tokens).sum::<u64>(), 0);
    drop(tx);
    a.shutdown().await;
    fleet.shutdown().await;
}
