//! The pure part of discovery: watch events in, worker updates out.
//!
//! The catalog keeps what the three watches last reported (the pool's spec,
//! each pod's facts, each EndpointSlice's peers) and the workers it has
//! handed out, grouped by pod. After every change it recomputes the wanted
//! workers of the pods concerned (all pods after a pool change or a relist)
//! and emits the difference, so the update stream can never double or lose
//! a worker whatever order or repetition the events come in. No I/O, no
//! clock: `watch` feeds it, the tests drive it directly.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use kvpick_core::{Lifecycle, WorkerId};
use tracing::{debug, error, info, warn};

use super::DiscoveryState;
use super::config::DiscoveryConfig;
use super::engine::{ENGINE_LABEL, EngineKind};
use super::peers::{SliceFacts, peer_set};
use super::pod::{NotAWorker, PodFacts, PodRun};
use super::pool::{PoolSpec, PoolSpecError};
use super::role::Role;
use super::store::{Change, Effect, Store};
use super::worker::{DiscoveredWorker, WorkerUpdate};

/// What is known of the pool, for deciding what to log on a change.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PoolView {
    /// Not listed yet.
    Unknown,
    Missing,
    Invalid(PoolSpecError),
    Valid(PoolSpec),
}

pub(crate) struct Catalog {
    cfg: DiscoveryConfig,
    pool_objects: Store<Result<PoolSpec, PoolSpecError>>,
    pool: PoolView,
    pods: Store<PodFacts>,
    /// `None` without a peer service.
    slices: Option<Store<SliceFacts>>,
    peers: BTreeSet<SocketAddr>,
    /// Handed-out workers by pod name, with the run of the pod they are.
    workers: BTreeMap<String, (PodRun, BTreeMap<WorkerId, DiscoveredWorker>)>,
    /// Pod of each handed-out worker: the worker count, and the guard
    /// against two (pod, port) pairs hashing to one id.
    owners: HashMap<WorkerId, String>,
}

impl Catalog {
    pub fn new(cfg: DiscoveryConfig) -> Self {
        let slices = cfg.peer_service.as_ref().map(|_| Store::default());
        Catalog {
            cfg,
            pool_objects: Store::default(),
            pool: PoolView::Unknown,
            pods: Store::default(),
            slices,
            peers: BTreeSet::new(),
            workers: BTreeMap::new(),
            owners: HashMap::new(),
        }
    }

    pub fn state(&self) -> DiscoveryState {
        DiscoveryState {
            pool_present: matches!(self.pool, PoolView::Valid(_)),
            listed: self.pool_objects.listed() && self.pods.listed() && self.slices.as_ref().is_none_or(Store::listed),
            workers: self.owners.len(),
        }
    }

    pub fn peers(&self) -> &BTreeSet<SocketAddr> {
        &self.peers
    }

    /// A change of the pool watch (objects already parsed).
    pub fn on_pool(&mut self, change: Change<Result<PoolSpec, PoolSpecError>>, out: &mut Vec<WorkerUpdate>) {
        if self.pool_objects.apply(change) == Effect::None {
            return;
        }
        let view = match self.pool_objects.get(&self.cfg.pool_name) {
            Some(Ok(spec)) => PoolView::Valid(spec.clone()),
            Some(Err(e)) => PoolView::Invalid(e.clone()),
            None if self.pool_objects.listed() => PoolView::Missing,
            None => PoolView::Unknown,
        };
        if view == self.pool {
            return;
        }
        self.log_pool_change(&view);
        let old_spec = self.pool_spec().cloned();
        self.pool = view;
        if self.pool_spec() != old_spec.as_ref() {
            self.reconcile_all(out);
        }
    }

    /// A change of the pod watch.
    pub fn on_pod(&mut self, change: Change<PodFacts>, out: &mut Vec<WorkerUpdate>) {
        match self.pods.apply(change) {
            Effect::None => {}
            Effect::Names(names) => {
                for name in names {
                    self.reconcile_pod(&name, out);
                }
            }
            Effect::Replaced => self.reconcile_all(out),
        }
    }

    /// A change of the EndpointSlice watch; true if the peer set changed.
    pub fn on_slice(&mut self, change: Change<SliceFacts>) -> bool {
        let Some(slices) = &mut self.slices else { return false };
        if slices.apply(change) == Effect::None {
            return false;
        }
        let peers = peer_set(slices.items().values());
        if peers == self.peers {
            return false;
        }
        for added in peers.difference(&self.peers) {
            info!(peer = %added, "peer replica added");
        }
        for removed in self.peers.difference(&peers) {
            info!(peer = %removed, "peer replica removed");
        }
        self.peers = peers;
        true
    }

    fn pool_spec(&self) -> Option<&PoolSpec> {
        match &self.pool {
            PoolView::Valid(spec) => Some(spec),
            _ => None,
        }
    }

    fn log_pool_change(&self, new: &PoolView) {
        let (ns, name) = (&self.cfg.namespace, &self.cfg.pool_name);
        let workers = self.owners.len();
        match (&self.pool, new) {
            (_, PoolView::Unknown) => {}
            (PoolView::Unknown, PoolView::Missing) => {
                warn!("InferencePool {ns}/{name} not found: no workers, readiness NOT_SERVING until it is created")
            }
            (_, PoolView::Missing) => {
                warn!("InferencePool {ns}/{name} deleted: removing its {workers} workers, readiness NOT_SERVING")
            }
            (_, PoolView::Invalid(e)) => error!(
                "InferencePool {ns}/{name} is unusable ({e}): removing its {workers} workers, readiness NOT_SERVING"
            ),
            (PoolView::Valid(old), PoolView::Valid(spec)) => {
                info!("InferencePool {ns}/{name} changed: {old} -> {spec}")
            }
            (_, PoolView::Valid(spec)) => info!("InferencePool {ns}/{name} found: {spec}"),
        }
    }

    fn reconcile_all(&mut self, out: &mut Vec<WorkerUpdate>) {
        let names: BTreeSet<String> = self.pods.items().keys().chain(self.workers.keys()).cloned().collect();
        for name in names {
            self.reconcile_pod(&name, out);
        }
    }

    /// Brings pod `name`'s handed-out workers in line with what its facts
    /// and the pool say they should be.
    fn reconcile_pod(&mut self, name: &str, out: &mut Vec<WorkerUpdate>) {
        let wanted = self.wanted(name);
        let (old_run, mut current) = self.workers.remove(name).unwrap_or_default();
        let run = self.pods.get(name).map(|f| f.run.clone()).unwrap_or_default();
        // Restarted containers or a recreated pod: new engines, whose
        // workers are replaced even where nothing else changed.
        let restarted = !current.is_empty() && old_run != run;
        let why_not = wanted.as_ref().err().copied();
        let wanted = wanted.unwrap_or_default();

        current.retain(|id, old| {
            if wanted.contains_key(id) {
                return true;
            }
            let reason = why_not.map_or_else(|| "its port left the pool's targetPorts".to_owned(), |r| r.to_string());
            info!(worker = id.0, pod = name, endpoint = %old.spec.endpoint, "worker removed: {reason}");
            self.owners.remove(id);
            out.push(WorkerUpdate::Delete(*id));
            false
        });
        for (id, new) in wanted {
            let ready = new.spec.lifecycle == Lifecycle::Schedulable;
            match current.get(&id) {
                Some(old) if *old == new && !restarted => continue,
                // Readiness alone changed: the same engine, so its index,
                // bookings and event subscription stay; only picking stops
                // (or resumes).
                Some(old) if old.same_but_lifecycle(&new) && !restarted => {
                    let now = if ready { "schedulable again: pod Ready" } else { "unschedulable: pod not Ready" };
                    info!(worker = id.0, pod = name, endpoint = %new.spec.endpoint, "worker {now}");
                }
                Some(old) => {
                    info!(
                        worker = id.0,
                        pod = name,
                        rank = new.rank,
                        restarted,
                        "worker replaced: endpoint {} -> {}, kv events {} -> {}",
                        old.spec.endpoint,
                        new.spec.endpoint,
                        old.publisher.endpoint,
                        new.publisher.endpoint
                    );
                    out.push(WorkerUpdate::Delete(id));
                    if !ready {
                        // A new engine that is not Ready yet is not taken on
                        // until it is, like a new pod.
                        info!(worker = id.0, pod = name, "replacing worker waits for its pod to be Ready");
                        current.remove(&id);
                        self.owners.remove(&id);
                        continue;
                    }
                }
                None if !ready => {
                    debug!(worker = id.0, pod = name, "pod is not a worker until it is Ready");
                    continue;
                }
                None => {
                    if let Some(other) = self.owners.get(&id) {
                        error!(worker = id.0, pod = name, other, "worker id collision: the pod's port is not served");
                        continue;
                    }
                    info!(
                        worker = id.0, pod = name, endpoint = %new.spec.endpoint, rank = new.rank,
                        engine = %new.engine, role = %new.role, kv_events = %new.publisher.endpoint, "worker added"
                    );
                    self.owners.insert(id, name.to_owned());
                }
            }
            debug!(worker = id.0, spec = ?new.spec, publisher = ?new.publisher, "worker upserted");
            current.insert(id, new.clone());
            out.push(WorkerUpdate::Upsert(Box::new(new)));
        }
        // A selected pod waiting to become a worker (other pods are noise).
        if let Some(reason @ (NotAWorker::NoIp | NotAWorker::Terminating | NotAWorker::NoGeneration)) = why_not {
            debug!(pod = name, "pod is not a worker: {reason}");
        }
        if !current.is_empty() {
            self.workers.insert(name.to_owned(), (run, current));
        }
    }

    /// The workers pod `name` should be right now, or why it is none.
    fn wanted(&self, name: &str) -> Result<BTreeMap<WorkerId, DiscoveredWorker>, NotAWorker> {
        let pool = self.pool_spec();
        let facts = self.pods.get(name);
        let (ip, ready) = PodFacts::worker_ip(facts, pool)?;
        let engine = match facts.map(|f| self.cfg.engine.resolve(&f.labels, f.images.iter().map(String::as_str))) {
            Some(Ok(engine)) => engine,
            Some(Err((fallback, why))) => {
                warn!(pod = name, engine = %fallback, "{ENGINE_LABEL} label ignored: {why}");
                fallback
            }
            None => EngineKind::default(),
        };
        let role = match facts.map(|f| Role::of_labels(&self.cfg.role_labels, &f.labels)) {
            Some(Ok(Some(role))) => role,
            Some(Ok(None)) => return Err(NotAWorker::NoGeneration),
            Some(Err((role, why))) => {
                warn!(pod = name, %role, "role label ignored: {why}");
                role
            }
            None => Role::default(),
        };
        let mut wanted = BTreeMap::new();
        for (rank, &port) in pool.into_iter().flat_map(|p| p.target_ports.iter()).enumerate() {
            // At most 8 ports in a valid pool, far below u16::MAX.
            let rank = u16::try_from(rank).unwrap_or(u16::MAX);
            match DiscoveredWorker::new(&self.cfg, name, ip, port, rank, (engine, role)) {
                Some(mut w) => {
                    if !ready {
                        w.spec.lifecycle = Lifecycle::Unschedulable;
                    }
                    wanted.insert(w.id(), w);
                }
                None => warn!(
                    pod = name,
                    port, rank, "rank's KV-event port would pass 65535 (DYN_EPP_KV_EVENT_PORT + rank): port not served"
                ),
            }
        }
        Ok(wanted)
    }
}

#[cfg(test)]
mod tests;
