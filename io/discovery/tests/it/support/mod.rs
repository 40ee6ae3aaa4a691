//! The discovery scenarios' harness: runs the real discovery against the
//! fake API server (kvpick-test-support) and applies its updates.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use kvpick_core::{Lifecycle, WorkerId};
use kvpick_discovery::{DiscoveredWorker, Discovery, DiscoveryConfig, DiscoveryState, WorkerUpdate};
use tokio::time::Instant;

pub use kvpick_test_support::fake_kube::objects::{pod, pool, slice, terminating};
pub use kvpick_test_support::fake_kube::{APP, FakeKube, Kind, NS, POOL};

/// Longest any test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(10);
/// How often [`Harness::wait_for`] re-checks its condition when nothing
/// arrives.
const POLL: Duration = Duration::from_millis(5);

/// Discovery of `POOL` in `NS`, retrying after 10–200 ms.
pub fn config() -> DiscoveryConfig {
    let mut cfg = DiscoveryConfig::new(NS, POOL, 16);
    cfg.backoff_min = Duration::from_millis(10);
    cfg.backoff_max = Duration::from_millis(200);
    cfg
}

/// Runs discovery against a fake API server and applies its updates the
/// way the wiring will, checking the stream's invariant on every update:
/// no upsert of a present id, no delete of an absent one.
pub struct Harness {
    pub fake: FakeKube,
    pub disc: Discovery,
    pub workers: BTreeMap<WorkerId, DiscoveredWorker>,
    /// Every update received, in order.
    pub log: Vec<WorkerUpdate>,
}

impl Harness {
    pub async fn start(cfg: DiscoveryConfig) -> Harness {
        Harness::with_fake(FakeKube::start(NS).await, cfg)
    }

    pub fn with_fake(fake: FakeKube, cfg: DiscoveryConfig) -> Harness {
        let disc = Discovery::spawn(fake.client(), cfg).expect("valid discovery config");
        Harness { fake, disc, workers: BTreeMap::new(), log: Vec::new() }
    }

    fn apply(&mut self, update: WorkerUpdate) {
        match &update {
            WorkerUpdate::Upsert(w) => match self.workers.insert(w.id(), (**w).clone()) {
                None => assert_eq!(w.spec.lifecycle, Lifecycle::Schedulable, "new worker {:?} unschedulable", w.id()),
                Some(mut old) => {
                    // Only a readiness change may upsert a present worker.
                    let was = old.spec.lifecycle;
                    old.spec.lifecycle = w.spec.lifecycle;
                    assert!(old == **w && was != w.spec.lifecycle, "upsert of present {:?}: had {old:?}", w.id());
                }
            },
            WorkerUpdate::Delete(id) => {
                assert!(self.workers.remove(id).is_some(), "delete of absent worker {id:?}");
            }
        }
        self.log.push(update);
    }

    fn drain(&mut self) {
        while let Ok(u) = self.disc.updates.try_recv() {
            self.apply(u);
        }
    }

    pub fn state(&self) -> DiscoveryState {
        *self.disc.state.borrow()
    }

    pub fn peers(&self) -> BTreeSet<SocketAddr> {
        self.disc.peers.borrow().clone()
    }

    /// Applied schedulable workers' endpoints, sorted (a worker whose pod
    /// left Ready is kept, unschedulable).
    pub fn endpoints(&self) -> Vec<String> {
        let mut v: Vec<String> = (self.workers.values())
            .filter(|w| w.spec.lifecycle == Lifecycle::Schedulable)
            .map(|w| w.spec.endpoint.to_string())
            .collect();
        v.sort();
        v
    }

    /// Applies updates until `cond` holds; panics after [`WAIT`].
    pub async fn wait_for(&mut self, what: &str, cond: impl Fn(&Harness) -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            // State first, then the updates: every update behind a published
            // state was sent before it, so both are then consistent.
            self.disc.state.borrow_and_update();
            self.disc.peers.borrow_and_update();
            self.drain();
            if cond(self) {
                return;
            }
            let update = tokio::select! {
                u = self.disc.updates.recv() => match u {
                    Some(u) => Some(u),
                    None => panic!("discovery ended while waiting for {what}"),
                },
                _ = self.disc.state.changed() => None,
                _ = self.disc.peers.changed() => None,
                // Conditions on the fake server change without discovery
                // saying anything: look again soon.
                () = tokio::time::sleep(POLL) => None,
                () = tokio::time::sleep_until(deadline) => panic!(
                    "timed out waiting for {what}: endpoints {:?}, state {:?}, peers {:?}",
                    self.endpoints(), self.state(), self.peers()
                ),
            };
            if let Some(u) = update {
                self.apply(u);
            }
        }
    }

    /// Waits until exactly `want` (sorted `ip:port`s) are the schedulable
    /// workers, and the published state counts every applied worker.
    pub async fn wait_endpoints(&mut self, want: &[&str]) {
        let what = format!("workers {want:?}");
        self.wait_for(&what, |h| h.endpoints() == want && h.state().workers == h.workers.len()).await;
    }

    pub async fn shutdown(self) {
        self.disc.shutdown().await;
        self.fake.shutdown().await;
    }
}
