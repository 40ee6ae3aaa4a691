//! Four replicas in one process, requests spread over them as a gateway
//! does, and one of them partitioned: every stream to and from it cut (its
//! connections reset, new ones refused) while the others book and free,
//! then the network restored. Afterwards all four hold the same bookings,
//! and at the end of the load none.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kvpick_app::app::App;
use kvpick_runtime::ThreadProducers;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::bin_support::{TempDir, fleet, write_workers};
use crate::ext_proc_support::{Call, finish_response, wait_for};
use crate::replicas::{body, free_port, open, pick, replica_with, text};

/// A TCP relay to one replica-sync port that can be cut: its
/// connections reset and new ones closed as soon as they are accepted,
/// as a network partition looks to both ends.
struct Relay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    async fn to(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (is_cut, held) = (cut.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if is_cut.load(Ordering::Acquire) {
                    continue; // dropped: closed at once
                }
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                held.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
            }
        });
        Relay { addr, cut, conns, accept }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        for conn in self.conns.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            conn.abort();
        }
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::Release);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.conns.lock().unwrap_or_else(PoisonError::into_inner).drain(..).for_each(|c| c.abort());
    }
}

fn links_up(app: &App) -> u64 {
    app.replicas().map_or(0, |r| r.transport.links_up.load(Ordering::Relaxed))
}

/// What a replica counts on each worker (by endpoint): its own bookings
/// and those its peers told it of.
async fn load_by_endpoint(app: &App) -> BTreeMap<String, (u64, u64)> {
    let endpoints: BTreeMap<_, _> = app.workers().all().into_iter().map(|(id, at)| (id, at.to_string())).collect();
    let producers = ThreadProducers::new(app.service().clone());
    let loads = app.service().loads(&producers).await;
    loads
        .into_iter()
        .filter_map(|l| endpoints.get(&l.worker).map(|e| (e.clone(), (u64::from(l.requests), l.prefill_tokens))))
        .collect()
}

/// Every replica counts the same load on every worker, and each holds
/// all bookings but its own as peers'.
async fn converged(apps: &[App], live: usize) -> bool {
    let first = load_by_endpoint(&apps[0]).await;
    for app in apps {
        if load_by_endpoint(app).await != first
            || app.service().active_reservations() + app.service().peer_bookings() != live
        {
            return false;
        }
    }
    first.values().map(|(requests, _)| *requests as usize).sum::<usize>() == live
}

/// Snapshots the replicas applied, from all origins.
fn snapshots_applied(apps: &[App]) -> u64 {
    let of = |app: &App| app.replicas().map(|r| r.stats().snapshot()).unwrap_or_default();
    apps.iter().map(|app| of(app).origins.values().map(|o| o.stats.resyncs).sum::<u64>()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_converge_after_one_is_partitioned_and_restored() {
    let fleet = fleet(4).await;
    let dir = TempDir::new("replicas-partition");
    let file = dir.path("workers.json");
    write_workers(&file, &fleet, &[0, 1, 2, 3]);
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let at = |i: usize| SocketAddr::from(([127, 0, 0, 1], ports[i]));
    // D (the fourth) is reached, and reaches the others, only through
    // relays: cutting them partitions it.
    let to_d = Relay::to(at(3)).await;
    let from_d = [Relay::to(at(0)).await, Relay::to(at(1)).await, Relay::to(at(2)).await];
    let list = |addrs: Vec<SocketAddr>| addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let others_peers = list(vec![at(0), at(1), at(2), to_d.addr]);
    let d_peers = list(from_d.iter().map(|r| r.addr).chain([at(3)]).collect());
    let mut apps = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let peers = if i == 3 { &d_peers } else { &others_peers };
        apps.push(replica_with(&file, *port, peers, &[]).await);
    }
    wait_for("every replica streaming to the three others", || async { apps.iter().all(|a| links_up(a) == 3) }).await;

    // The gateway spreads requests round-robin: two on each replica, held
    // open (streaming).
    let mut calls: Vec<(usize, Call, _)> = Vec::new();
    for n in 0..8 {
        let i = n % 4;
        let (mut call, client) = open(&apps[i]).await;
        pick(&mut call, &body(&text(&format!("r{n}-")))).await;
        calls.push((i, call, client));
    }
    wait_for("all four hold the same 8 bookings", || converged(&apps, 8)).await;

    // Partition D.
    to_d.cut();
    from_d.iter().for_each(Relay::cut);
    wait_for("D's links and the links to D down", || async {
        links_up(&apps[3]) == 0 && apps[..3].iter().all(|a| links_up(a) == 2)
    })
    .await;
    // Meanwhile A frees one and books two, D frees one and books one.
    // (Each closed at once: an open gateway stream holds shutdown.)
    for index in [0, 2] {
        // A's first, then D's first (n = 3, now third).
        let (_, mut call, client) = calls.remove(index);
        finish_response(&mut call).await;
        drop((call, client));
    }
    for (i, n) in [(0, 8), (0, 9), (3, 10)] {
        let (mut call, client) = open(&apps[i]).await;
        pick(&mut call, &body(&text(&format!("r{n}-")))).await;
        calls.push((i, call, client));
    }
    // 9 live. A, B and C count 9, but not the same: D's new one is not
    // among them and its freed one still is. D counts 8: A's freed one
    // still, A's new ones not.
    wait_for("A, B and C agree without D's news", || converged(&apps[..3], 9)).await;
    assert_eq!(
        apps[3].service().active_reservations() + apps[3].service().peer_bookings(),
        8,
        "D heard through the cut"
    );
    assert!(!converged(&apps, 9).await, "the partition made no difference");
    let before = snapshots_applied(&apps);

    // Restored: the streams come back with a snapshot each way.
    to_d.restore();
    from_d.iter().for_each(Relay::restore);
    wait_for("every replica streaming to the three others again", || async { apps.iter().all(|a| links_up(a) == 3) })
        .await;
    wait_for("all four hold the same 9 bookings", || converged(&apps, 9)).await;
    // D's snapshot at A, B and C, and theirs at D.
    assert!(snapshots_applied(&apps) >= before + 6, "the partition healed without a snapshot each way");

    // The end of the load: every booking freed everywhere.
    for (_, call, _) in &mut calls {
        finish_response(call).await;
    }
    wait_for("every booking freed on all four", || converged(&apps, 0)).await;
    for app in &apps {
        let own = app.replicas().map(|r| r.stats().snapshot()).unwrap_or_default();
        assert_eq!(own.own_live, 0);
        assert!(own.origins.values().all(|o| o.live == 0 && o.refused == 0), "{own:?}");
    }
    drop(calls);
    for app in apps {
        app.shutdown().await;
    }
    drop((to_d, from_d));
    fleet.shutdown().await;
}
