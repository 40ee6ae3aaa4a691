//! Warm start in `kvpick serve` (issue #22): a replica starting up takes
//! the KV index from a ready peer before it reports ready, instead of
//! routing blind until the engines' caches are relearned.
//!
//! From the ingest's start its new streams are held; discovery subscribes
//! them as usual. Then a ready replica is asked through NATS (with the
//! `nats` transport: `kvpick_replica::nats`), and the direct peers in turn
//! (`Peer/Index`); each
//! worker that arrives seeds its held stream (the import goes ahead of
//! every later event, and the stream continues from the peer's cut). When
//! a peer's whole index is in, when no peer can give one (none listed,
//! none reachable, all warming up themselves), or at the deadline, the
//! holds end (workers not seeded start cold).
//!
//! The peers' live bookings come from the peers themselves: each dials
//! this replica (its discovery lists replicas not yet ready: the peer
//! Service publishes them) and opens its stream with a snapshot of them.
//! Readiness also waits, within the same deadline, until every link this
//! replica dials has settled (up, failed once, or found itself) and every
//! peer it reached has sent them, so its first picks see the load the
//! others booked; through NATS, until every replica that
//! published on the pool's stream in the last 5 s has answered its hello
//! with its bookings. This replica serves its own index to others once it
//! is ready.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvpick_core::WorkerId;
use kvpick_core::replica::ReplicaId;
use kvpick_grpc::Readiness;
use kvpick_kv_events::{KvEventIngest, SeedRefused, StreamCut, WorkerSeed};
use kvpick_replica::{
    DirectConfig, IndexLimits, IndexSource, IndexSummary, LinkState, NatsLink, Pending, SyncStats, TransportMetrics,
    WarmError, WorkerIndex, fetch_index,
};
use tokio::sync::{mpsc, watch};

use crate::metrics::collect::WorkerNames;

/// A replica that published on NATS this recently is running.
const NATS_LIVE: Duration = Duration::from_secs(5);
/// How long a peer may stay silent in the middle of its index.
const IDLE: Duration = Duration::from_secs(5);
/// How long to wait for a first peer to be known (Kubernetes discovery
/// lists them shortly after start; a lone first replica has none).
const PEERS_WAIT: Duration = Duration::from_secs(2);
/// How long workers of a peer's index that discovery had not added yet
/// are given before their seeds are tried again, once.
const LATER: Duration = Duration::from_millis(500);

/// This replica's index, served to peers starting up.
pub struct AppIndex {
    pub ingest: Arc<KvEventIngest>,
    pub workers: WorkerNames,
    pub readiness: Readiness,
}

impl IndexSource for AppIndex {
    fn ready(&self) -> bool {
        !self.readiness.is_warming()
    }

    fn workers(&self) -> Vec<WorkerId> {
        self.workers.all().into_iter().map(|(id, _)| id).collect()
    }

    fn export(&self, worker: WorkerId) -> Pending<Option<WorkerIndex>> {
        let ingest = self.ingest.clone();
        Box::pin(async move {
            let (cut, snapshot) = ingest.export(worker).await.ok()??;
            Some(WorkerIndex { worker, last_seq: cut.last_seq, last_ts: cut.last_ts, groups: cut.groups, snapshot })
        })
    }
}

/// Where a warm start's index and bookings come from: the replica sync's
/// side of it (`Replicas::warm_sources`).
pub struct Sources {
    /// How to dial the direct peers, and which they are as they change.
    pub config: DirectConfig,
    pub peers: watch::Receiver<BTreeSet<SocketAddr>>,
    pub stats: Arc<TransportMetrics>,
    pub sync: Arc<SyncStats>,
    pub nats: Option<NatsLink>,
}

/// Runs the warm start to its end (see the module docs).
pub async fn run(ingest: Arc<KvEventIngest>, readiness: Readiness, sources: Sources, deadline: Instant) {
    let Sources { config, mut peers, stats, sync, nats } = sources;
    // Readiness stops waiting however this ends, a panic included (the
    // ingest's holds end at their own deadline).
    let _warming = EndsWarming(readiness.clone());
    let started = Instant::now();
    let outcome = tokio::time::timeout_at(deadline.into(), async {
        // A first peer, if one comes soon; and this replica's first
        // workers (Kubernetes discovery lists them after start), whose
        // streams the seeds continue.
        let _ = tokio::time::timeout(PEERS_WAIT, peers.wait_for(|set| !set.is_empty())).await;
        let _ = tokio::time::timeout(PEERS_WAIT, workers_known(&readiness)).await;
        // Through NATS first when bookings go there (any ready replica of
        // the pool answers), then each direct peer in turn.
        if let Some(link) = &nats {
            let within = deadline.saturating_duration_since(Instant::now());
            let fetch = |out| link.fetch_index(IndexLimits::default(), within, out);
            match take_index("NATS", &ingest, &stats, fetch).await {
                Ok(()) => return Some("a peer through NATS".to_owned()),
                Err(why) => tracing::info!(%why, "warm start: no index through NATS"),
            }
        }
        let candidates: Vec<SocketAddr> = peers.borrow().iter().copied().collect();
        for peer in candidates {
            let fetch = |out| fetch_index(peer, &config, IndexLimits::default(), IDLE, out);
            match take_index(&peer.to_string(), &ingest, &stats, fetch).await {
                Ok(()) => return Some(peer.to_string()),
                Err(why) => tracing::info!(%peer, %why, "warm start: no index from this peer"),
            }
        }
        None
    })
    .await;
    let (warm, outcome) = match outcome {
        Ok(Some(peer)) => (true, format!("warm, from {peer}")),
        Ok(None) => (false, "cold: no peer gave its index".to_owned()),
        Err(_) => (false, "cold: the deadline passed".to_owned()),
    };
    stats.warm_outcome.store(if warm { 1 } else { 2 }, Ordering::Relaxed);
    if let Err(error) = ingest.release_holds() {
        tracing::warn!(%error, "warm start: could not end the holds");
    }
    // Through NATS, the replicas that published lately answer the hello
    // with their live bookings.
    let mut expected = Vec::new();
    if let Some(link) = &nats {
        match tokio::time::timeout_at(deadline.into(), link.live_origins(NATS_LIVE)).await {
            Ok(Ok(live)) => expected = live,
            Ok(Err(error)) => tracing::warn!(%error, "warm start: the replicas live on NATS not known"),
            Err(_) => {}
        }
    }
    let bookings = tokio::time::timeout_at(deadline.into(), peers_bookings(&stats, &sync, &expected)).await;
    let (dialing, missing) = without_bookings(&stats, &sync, &expected);
    if bookings.is_err() {
        let missing: Vec<u64> = missing.iter().map(|r| r.0).collect();
        tracing::warn!(
            dialing,
            ?missing,
            "warm start: not every peer this replica dials had sent its live bookings by the deadline"
        );
    }
    readiness.set_warming(false);
    let took = started.elapsed();
    stats.warm_took_ms.store(took.as_millis() as u64, Ordering::Relaxed);
    tracing::info!(
        %outcome,
        workers_seeded = stats.warm_workers_seeded.load(Ordering::Relaxed),
        blocks = stats.warm_blocks_imported.load(Ordering::Relaxed),
        peers_without_bookings = missing.len(),
        took_ms = took.as_millis() as u64,
        "warm start over"
    );
}

/// Clears readiness's `warming` gate when dropped.
struct EndsWarming(Readiness);

impl Drop for EndsWarming {
    fn drop(&mut self) {
        self.0.set_warming(false);
    }
}

/// What readiness still waits for: the links still dialing (each will
/// reach its peer, find it gone, or find itself), and the peers reached
/// whose live bookings have not come yet (each opens its own stream to
/// this replica with them).
fn without_bookings(stats: &TransportMetrics, sync: &SyncStats, expected: &[ReplicaId]) -> (usize, Vec<ReplicaId>) {
    let origins = sync.snapshot().origins;
    let sent = |peer: &ReplicaId| origins.get(peer).is_some_and(|o| o.stats.resyncs > 0 && !o.forgotten);
    let states = stats.links_state();
    let dialing = states.iter().filter(|s| **s == LinkState::Dialing).count();
    let reached = states.into_iter().filter_map(|s| match s {
        LinkState::Up(Some(peer)) => Some(peer),
        _ => None,
    });
    let missing = reached.chain(expected.iter().copied()).filter(|peer| !sent(peer)).collect();
    (dialing, missing)
}

/// Until every link has settled and every peer reached (and `expected`)
/// has sent its live bookings.
async fn peers_bookings(stats: &TransportMetrics, sync: &SyncStats, expected: &[ReplicaId]) {
    loop {
        let (dialing, missing) = without_bookings(stats, sync, expected);
        if dialing == 0 && missing.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Until discovery has reported a worker.
async fn workers_known(readiness: &Readiness) {
    while readiness.schedulable_workers() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Seeds one worker; the index back when its stream is not subscribed
/// here yet (discovery may still be adding it).
async fn seed(ingest: &KvEventIngest, index: WorkerIndex, stats: &TransportMetrics) -> Option<WorkerIndex> {
    let WorkerIndex { worker, last_seq, last_ts, groups, snapshot } = index;
    let blocks = snapshot.blocks.blocks.len() as u64;
    let cut = StreamCut { last_seq, last_ts, groups };
    match ingest.seed(WorkerSeed { worker, cut, snapshot }).await {
        Ok(Ok(applied)) => {
            stats.warm_workers_seeded.fetch_add(1, Ordering::Relaxed);
            stats.warm_blocks_imported.fetch_add(applied.stored, Ordering::Relaxed);
        }
        // The ingest started the worker's stream over: it learns on its own.
        Ok(Err(error)) => {
            stats.warm_workers_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(worker = worker.0, blocks, %error, "warm start: a worker's index refused by its shard; its stream starts over");
        }
        Err(SeedRefused::NotSubscribed(seed)) => {
            let WorkerSeed { worker, cut, snapshot } = *seed;
            let StreamCut { last_seq, last_ts, groups } = cut;
            return Some(WorkerIndex { worker, last_seq, last_ts, groups, snapshot });
        }
        // Its stream started on its own already.
        Err(SeedRefused::NotHeld) => {}
        Err(error) => {
            stats.warm_workers_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(worker = worker.0, blocks, %error, "warm start: a worker's index not taken");
        }
    }
    None
}

/// One peer's whole index (`fetch` passes each worker on as it arrives),
/// each worker seeded as it arrives.
async fn take_index<F>(
    from: &str,
    ingest: &KvEventIngest,
    stats: &TransportMetrics,
    fetch: impl FnOnce(mpsc::Sender<WorkerIndex>) -> F,
) -> Result<(), String>
where
    F: std::future::Future<Output = Result<IndexSummary, WarmError>>,
{
    let (out, mut arrived) = mpsc::channel::<WorkerIndex>(2);
    let fetch = fetch(out);
    let seed_all = async {
        let mut later = Vec::new();
        while let Some(index) = arrived.recv().await {
            later.extend(seed(ingest, index, stats).await);
        }
        later
    };
    let seeded_before = stats.warm_workers_seeded.load(Ordering::Relaxed);
    let (fetched, mut later) = tokio::join!(fetch, seed_all);
    let summary = fetched.map_err(|e| e.to_string())?;
    // Workers discovery had not added yet: once more after a moment.
    if !later.is_empty() {
        tokio::time::sleep(LATER).await;
        let mut unknown = 0;
        for index in later.drain(..) {
            unknown += usize::from(seed(ingest, index, stats).await.is_some());
        }
        if unknown > 0 {
            tracing::info!(from, unknown, "warm start: workers of the peer's index not in this replica's pool");
        }
    }
    // A peer that started cold itself, with nothing learned yet: another
    // may know more.
    if stats.warm_workers_seeded.load(Ordering::Relaxed) == seeded_before {
        return Err(format!("its index had nothing for this replica's workers ({} workers)", summary.workers));
    }
    tracing::info!(from, workers = summary.workers, blocks = summary.blocks, "warm start: a peer's index taken");
    Ok(())
}
