//! kvpick-discovery: which workers kvpick routes to, and which peer
//! replicas it syncs with; from Kubernetes, or from a static workers file
//! ([`workers_file`]).
//!
//! kvpick serves one GAIE `InferencePool` (`inference.networking.k8s.io/v1`,
//! named by `DYN_EPP_INFERENCE_POOL_NAME` in `POD_NAMESPACE`). Three watches
//! run on the I/O runtime, each a kube-runtime [`watcher`](kube::runtime::watcher)
//! (list, then watch from the list's resourceVersion, bookmarks on, relist
//! after `410 Gone`, back-off on errors):
//!
//! - the pool itself (field selector `metadata.name=<pool>`), read as a
//!   `DynamicObject` ([`pool`]);
//! - every pod of the namespace, filtered in memory against the pool's
//!   `spec.selector.matchLabels`, so a pool edit is reconciled without
//!   restarting any watch ([`pod`]);
//! - when `DYN_EPP_PEER_SERVICE` is set, the `EndpointSlice`s labelled
//!   `kubernetes.io/service-name=<service>`: the other kvpick replicas
//!   ([`peers`]).
//!
//! **Workers.** A pod becomes a worker when it matches the selector, has a
//! pod IP, condition `Ready=True` and no deletion timestamp, and stays one
//! until one of those but Ready fails: a worker whose pod leaves Ready is
//! kept, `Lifecycle::Unschedulable` (not picked; its KV index, bookings and
//! event subscription kept), so a failed readiness probe costs no cache.
//! A worker whose IP, rank, engine or role changes, or whose pod's
//! containers restarted (or the pod was recreated under its name), is a new
//! engine: replaced, and while the pod is not Ready, dropped until it is.
//! Each of the pool's `spec.targetPorts` is one worker (`podIP:port`, one
//! engine data-parallel rank), whose id is stable for (pod name, port): see
//! [`worker_id`]. The pure reconciliation lives in `catalog`; `watch` only
//! drives it.
//!
//! **Output.** A [`Discovery`] handle carries
//! - `updates`: a bounded channel of [`WorkerUpdate`]s (`Upsert` / `Delete`)
//!   for the wiring to apply to the selection service and the KV-event
//!   ingest. Replaying them in order from the start gives exactly the
//!   current worker set: an id is upserted again without a delete in
//!   between only to change its lifecycle (Ready lost or regained), and
//!   never deleted when absent.
//! - `state`: a `watch` of [`DiscoveryState`]; readiness is
//!   [`DiscoveryState::is_ready`] (first full list of every watch done and a
//!   valid pool present). A state is published only after every update that
//!   led to it was sent, so a consumer that sees a state and then drains
//!   `updates` has applied everything that state describes.
//! - `peers`: a `watch` of the peer replicas' sync addresses (never `POD_IP`).
//!
//! Nothing here touches a shard: updates go out through the channel only.
//! Data from the API server is never trusted: a malformed pool, pod or
//! slice is logged and skipped, never a panic.

mod backoff;
mod catalog;
mod config;
mod engine;
mod metrics;
mod peers;
mod pod;
pub mod pool;
mod role;
mod store;
mod watch;
mod worker;
pub mod workers_file;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::task::JoinHandle;

pub use config::{ConfigError, DEFAULT_PEER_PORT, DiscoveryConfig};
pub use engine::{ENGINE_LABEL, EngineKind, EngineSetting};
pub use metrics::{DiscoveryMetrics, Resource, WatchCounts};
pub use role::{DEFAULT_ROLE_LABELS, DYNAMO_ROLE_LABEL, LLM_D_ROLE_LABEL, Role};
pub use worker::{DiscoveredWorker, WorkerUpdate, worker_id};

/// What discovery knows right now, for readiness and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryState {
    /// A valid `InferencePool` of that name exists. False while it is
    /// missing, after it is deleted, and while its spec is invalid (the
    /// reason is logged).
    pub pool_present: bool,
    /// Every watch (pool, pods, and peers when configured) has completed its
    /// first full list. Stays true across later relists: the previous view
    /// stays in force until the relist completes.
    pub listed: bool,
    /// Workers currently upserted (sent and not deleted).
    pub workers: usize,
}

impl DiscoveryState {
    /// SERVING for the gRPC health `readiness` service: the first full list
    /// is done and the pool exists. Zero workers is still ready (requests then
    /// get 503 "no endpoint", as in the reference EPP).
    pub fn is_ready(&self) -> bool {
        self.listed && self.pool_present
    }
}

/// The running discovery: its outputs and the task behind them. Dropping it
/// stops the watches.
#[derive(Debug)]
pub struct Discovery {
    /// Worker changes, in the order they must be applied.
    pub updates: mpsc::Receiver<WorkerUpdate>,
    pub state: tokio_watch::Receiver<DiscoveryState>,
    /// Sync addresses of the other replicas (empty without a peer service).
    pub peers: tokio_watch::Receiver<BTreeSet<SocketAddr>>,
    /// Lists, watch failures and expiries of each watched resource.
    pub metrics: Arc<DiscoveryMetrics>,
    task: Option<JoinHandle<()>>,
}

impl Discovery {
    /// Starts the watches with `client` on the current tokio runtime.
    ///
    /// Panics if called outside a tokio runtime (like `tokio::spawn`).
    pub fn spawn(client: kube::Client, cfg: DiscoveryConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let (updates_tx, updates) = mpsc::channel(cfg.update_capacity);
        let (state_tx, state) = tokio_watch::channel(DiscoveryState::default());
        let (peers_tx, peers) = tokio_watch::channel(BTreeSet::new());
        let metrics = Arc::new(DiscoveryMetrics::default());
        let outputs =
            watch::Outputs { updates: updates_tx, state: state_tx, peers: peers_tx, metrics: Arc::clone(&metrics) };
        let task = tokio::spawn(watch::run(client, cfg, outputs));
        Ok(Discovery { updates, state, peers, metrics, task: Some(task) })
    }

    /// True once the watch task has ended: on shutdown, or when `updates`
    /// was dropped.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops the watches and waits for the task to end.
    pub async fn shutdown(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            // A cancelled task's JoinError is the expected outcome.
            let _ = task.await;
        }
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
