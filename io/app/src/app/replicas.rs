//! Replica sync in `kvpick serve`: the peer port, the sync task over the
//! selectors, and the transport: the links to the peers listed at start or
//! found through the peer service (`direct`), or the pool's NATS JetStream
//! stream (`nats`). The peer port serves warm start's index either way.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use kvpick_core::replica::{Incarnation, ReplicaId};
use kvpick_grpc::{Http2, ServerHandle};
use kvpick_replica::{
    DirectConfig, DirectLinks, IndexSource, NatsConfig, NatsLink, PeerService, ReplicaSync, SyncConfig, SyncStats,
    TransportMetrics,
};
use kvpick_runtime::{Clock, ThreadProducers};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::ReplicaSettings;
use super::{StartError, bind, peers};

/// A running replica sync.
pub struct Replicas {
    pub id: ReplicaId,
    pub incarnation: Incarnation,
    sync: ReplicaSync,
    server: ServerHandle,
    merge: Option<JoinHandle<()>>,
    /// The `nats` transport's reader, snapshot-request and index tasks.
    nats_tasks: Vec<JoinHandle<()>>,
    nats: Option<NatsLink>,
    pub transport: Arc<TransportMetrics>,
    /// What the links dial (warm start asks the same peers).
    peers: watch::Receiver<BTreeSet<SocketAddr>>,
    direct: DirectConfig,
}

impl Replicas {
    /// Listens on the replica-sync port and dials `settings.peers` plus
    /// whatever `discovered` holds as it changes.
    pub async fn start(
        settings: &ReplicaSettings,
        selectors: Vec<ThreadProducers>,
        clock: Clock,
        discovered: Option<watch::Receiver<BTreeSet<SocketAddr>>>,
        index: Arc<dyn IndexSource>,
    ) -> Result<Replicas, StartError> {
        let listener = bind("replica-sync", settings.listen).await?;
        let port = listener.local_addr().map_err(|source| StartError::Listen { what: "replica-sync", source })?.port();
        let id = ReplicaId(settings.replica_id.unwrap_or_else(|| default_replica_id(port)));
        let incarnation = Incarnation(start_nanos());
        let token: Option<Arc<str>> = match &settings.token {
            Some(token) => Some(Arc::from(token.resolve().map_err(StartError::Replicas)?)),
            None => None,
        };
        let tls = match &settings.tls {
            Some(files) => Some(files.load().map_err(StartError::Replicas)?),
            None => None,
        };
        let mut direct = DirectConfig::new(id, token);
        direct.tls = tls.clone();
        let transport = Arc::new(TransportMetrics::default());

        // Listed names are looked up again while kvpick runs; Kubernetes
        // mode adds the peer service's replicas.
        let (peers_tx, peers_rx) = watch::channel(peers::numbered(&settings.peers));
        let merge = peers::follow(settings.peers.clone(), discovered, peers_tx);
        let peers = peers_rx.clone();
        let mut sync_config = SyncConfig::new(id, incarnation);
        sync_config.peer_grace = settings.peer_grace;
        sync_config.batch_delay = settings.batch_delay;
        let (sync, nats_tasks, nats_link) = match &settings.nats {
            None => {
                let links = {
                    let (direct, metrics) = (direct.clone(), transport.clone());
                    move |snapshots| DirectLinks::spawn(direct, peers_rx, snapshots, metrics)
                };
                let sync = ReplicaSync::spawn(sync_config, selectors, clock, links)
                    .map_err(|e| StartError::Replicas(e.into()))?;
                (sync, Vec::new(), None)
            }
            Some(nats) => {
                let config = NatsConfig {
                    credentials: nats.credentials.clone(),
                    ca: nats.ca.clone(),
                    stream_replicas: nats.stream_replicas,
                    ..NatsConfig::new(nats.url.clone(), nats.pool.clone(), id)
                };
                let link = NatsLink::connect(config).await.map_err(|e| StartError::Replicas(e.to_string()))?;
                // Batches and snapshots are split to what the server takes.
                let limits = sync_config.limits;
                sync_config.limits.max_frame_bytes = limits.max_frame_bytes.min(link.max_payload());
                let publisher = link.transport(transport.clone());
                let sync = ReplicaSync::spawn(sync_config, selectors, clock, |_| publisher)
                    .map_err(|e| StartError::Replicas(e.into()))?;
                let nats_error = |e: kvpick_replica::NatsError| StartError::Replicas(e.to_string());
                let requests =
                    link.serve_requests(sync.snapshot_requests(), transport.clone()).await.map_err(nats_error)?;
                let reader = link.consume(sync.inbound(), limits, transport.clone()).await.map_err(nats_error)?;
                let donor = link.serve_index(index.clone(), transport.clone());
                let url = kvpick_replica::nats::redact(&nats.url);
                tracing::info!(%url, pool = %nats.pool, "replica sync: bookings through NATS JetStream");
                (sync, vec![requests, reader, donor], Some(link))
            }
        };
        let service = match &settings.nats {
            None => PeerService::new(direct.clone(), sync.inbound(), transport.clone(), index),
            Some(_) => PeerService::index_only(direct.clone(), sync.inbound(), transport.clone(), index),
        };
        let mut builder = kvpick_grpc::server::builder(&Http2::default());
        if let Some(tls) = &tls {
            builder = builder.tls_config(tls.server()).map_err(|e| StartError::Replicas(format!("peer TLS: {e}")))?;
        }
        let router = builder.add_service(service);
        let server = kvpick_grpc::server::spawn_router(router, listener, None)?;
        tracing::info!(
            replica = id.0,
            incarnation = incarnation.0,
            listen = %server.local_addr(),
            peers = ?settings.peers,
            token = settings.token.is_some(),
            mutual_tls = tls.is_some(),
            "replica sync: sharing bookings with peer replicas"
        );
        Ok(Replicas { id, incarnation, sync, server, merge, nats_tasks, nats: nats_link, transport, peers, direct })
    }

    /// What a warm start asks: the direct peers, or through NATS.
    pub fn warm_sources(&self) -> super::warm_start::Sources {
        super::warm_start::Sources {
            config: self.direct.clone(),
            peers: self.peers.clone(),
            stats: self.transport.clone(),
            sync: self.sync.stats().clone(),
            nats: self.nats.clone(),
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    pub fn stats(&self) -> &Arc<SyncStats> {
        self.sync.stats()
    }

    pub async fn shutdown(self) {
        if let Some(merge) = self.merge {
            merge.abort();
        }
        self.sync.shutdown(std::time::Duration::from_secs(2)).await;
        for task in self.nats_tasks {
            task.abort();
        }
        if let Err(error) = self.server.shutdown_within(std::time::Duration::from_millis(500)).await {
            tracing::warn!(%error, "replica-sync server ended with an error");
        }
    }
}

/// Stable across restarts of the same pod (its host name) and distinct
/// for replicas sharing a host (their ports).
fn default_replica_id(port: u16) -> u64 {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_default();
    let id = xxhash_rust::xxh3::xxh3_64(format!("{}:{port}", host.trim()).as_bytes());
    id.max(1)
}

/// A later start has a larger incarnation (the wall clock, in ns).
fn start_nanos() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX).max(1)
}
