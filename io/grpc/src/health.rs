//! `grpc.health.v1.Health` (Check and Watch) for the names gateways and
//! Kubernetes probe kvpick with.
//!
//! - `liveness` (and the overall `""`): SERVING as soon as the process
//!   answers.
//! - `readiness`, `inference-extension` (GAIE conformance probes) and
//!   `envoy.service.ext_proc.v3.ExternalProcessor` (Envoy's cluster health
//!   check): SERVING only while at least one worker is schedulable and
//!   usable (not all of them publish KV blocks of another size than
//!   kvpick's), so a gateway never sends traffic to a picker that can only
//!   answer 503, or one whose every cache lookup is bound to miss.
//!
//! Whoever knows the workers (the discovery wiring) reports their count
//! through [`Readiness`]; a task on the current tokio runtime mirrors it
//! into the statuses, which `Watch` streams to probes.

use std::sync::Arc;

use kvpick_proto::health::health_server::HealthServer;
use kvpick_proto::health::{HealthReporter, HealthService, ServingStatus};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Http2;
use crate::server::{ServeError, ServerHandle, builder, spawn_router};

pub const LIVENESS: &str = "liveness";
pub const READINESS: &str = "readiness";
pub const INFERENCE_EXTENSION: &str = "inference-extension";
pub const EXT_PROC: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// The names that are SERVING only with a schedulable worker.
pub const GATED: [&str; 3] = [READINESS, INFERENCE_EXTENSION, EXT_PROC];

/// Where the wiring reports how many workers can take requests.
#[derive(Clone, Debug)]
pub struct Readiness {
    /// Schedulable workers, how many of them are unusable, and whether a
    /// warm start (the KV index from a peer replica) is still under way.
    workers: Arc<watch::Sender<(usize, usize, bool)>>,
}

impl Readiness {
    pub fn set_schedulable_workers(&self, count: usize) {
        self.workers.send_if_modified(|w| std::mem::replace(&mut w.0, count) != count);
    }

    /// Workers whose KV events cannot be used (a block size other than
    /// kvpick's): ready only while some worker is not one of them.
    pub fn set_unusable_workers(&self, count: usize) {
        self.workers.send_if_modified(|w| std::mem::replace(&mut w.1, count) != count);
    }

    /// Not ready while warming up: a replica that routed before its index
    /// arrived would route blind (the warm start bounds the wait).
    pub fn set_warming(&self, warming: bool) {
        self.workers.send_if_modified(|w| std::mem::replace(&mut w.2, warming) != warming);
    }

    pub fn is_warming(&self) -> bool {
        self.workers.borrow().2
    }

    pub fn schedulable_workers(&self) -> usize {
        self.workers.borrow().0
    }

    pub fn is_ready(&self) -> bool {
        let (schedulable, unusable, warming) = *self.workers.borrow();
        !warming && schedulable > unusable
    }
}

/// The health statuses of one process.
#[derive(Clone, Debug)]
pub struct Health {
    reporter: HealthReporter,
    readiness: Readiness,
}

impl Health {
    /// Registers every name (`liveness` SERVING, the gated ones
    /// NOT_SERVING) and starts mirroring [`Readiness`] on the current
    /// tokio runtime; the mirror stops when the last `Health` and
    /// `Readiness` are dropped.
    pub async fn start() -> Health {
        let reporter = HealthReporter::new();
        reporter.set_service_status("", ServingStatus::Serving).await;
        reporter.set_service_status(LIVENESS, ServingStatus::Serving).await;
        for name in GATED {
            reporter.set_service_status(name, ServingStatus::NotServing).await;
        }
        let (workers, mut seen) = watch::channel((0usize, 0usize, false));
        let mirror = reporter.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let (schedulable, unusable, warming) = *seen.borrow_and_update();
                let ready = !warming && schedulable > unusable;
                if last != Some(ready) {
                    let status = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
                    for name in GATED {
                        mirror.set_service_status(name, status).await;
                    }
                    if warming {
                        tracing::info!(
                            "readiness NOT_SERVING until the KV index arrives from a peer replica (warm start)"
                        );
                    } else if !ready && schedulable > 0 {
                        tracing::warn!(
                            schedulable,
                            "readiness NOT_SERVING: every worker publishes KV blocks of another size than kvpick's \
                             --block-size (kvpick_worker_block_size_mismatch)"
                        );
                    }
                    tracing::info!(ready, "readiness changed");
                    last = Some(ready);
                }
                if seen.changed().await.is_err() {
                    break;
                }
            }
        });
        Health { reporter, readiness: Readiness { workers: Arc::new(workers) } }
    }

    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// The tonic service, for any server that should answer health too.
    pub fn service(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService::from_health_reporter(self.reporter.clone()))
    }

    /// Serves health alone (plaintext) on `listener`: the health port.
    pub fn spawn_on(&self, listener: TcpListener) -> Result<ServerHandle, ServeError> {
        let router = builder(&Http2::default()).add_service(self.service());
        spawn_router(router, listener, None)
    }
}
