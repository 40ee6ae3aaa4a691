//! What a caller asks of the selection service and what it gets back:
//! requests, selections, admissions and the errors of this boundary. Plain
//! types, shared by the facade, the pick policy, the directory, the queue
//! and the thread-per-core runtime, so none of them imports another.

use std::net::SocketAddr;

use crate::booking::ReservationId;
use crate::prompt::Prompt;
use crate::worker::{EndpointFilter, WorkerId};

#[derive(Clone, Debug, PartialEq)]
pub struct SelectRequest {
    pub id: ReservationId,
    pub prompt: Prompt,
    pub model: Option<String>,
    /// Only these endpoints may serve the request.
    pub allowed: Option<EndpointFilter>,
    /// Higher is admitted first from the queue.
    pub priority: i32,
    /// The worker that served this request's session last (session
    /// affinity): chosen when its cost is within `RouterConfig::
    /// session_margin` of the cheapest.
    pub sticky: Option<WorkerId>,
}

/// A pick, and what was booked for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    pub id: ReservationId,
    pub worker: WorkerId,
    pub endpoint: SocketAddr,
    pub overlap_blocks: u32,
    /// Prompt tokens booked as prefill on the worker (not cached there).
    pub prefill_tokens: u32,
    pub isl_tokens: u32,
    pub cost: f64,
    /// The latency cost's TTFT prediction at the priors' rates (without
    /// the worker's calibrated speed), which the caller pairs with the
    /// measured TTFT to calibrate (`observe_ttft`). `None` under the
    /// Dynamo cost and for load-only prompts.
    pub predicted_ttft_ns: Option<f64>,
    /// Eligible workers the pick was made among.
    pub candidates: usize,
    /// The next-cheapest other workers, cheapest first, at most
    /// `RouterConfig::fallbacks` of them: the ordered fallback list a
    /// gateway may try when the pick fails. Empty by default (no cost).
    pub fallbacks: Vec<SocketAddr>,
    /// The latency cost's TPOT guard found every worker past its target,
    /// this one included: the fleet is too busy for the target.
    pub past_tpot_target: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    Reserved(Selection),
    /// Waiting for capacity; the outcome comes from `take_admissions`.
    Queued,
}

/// The outcome of a queued request.
#[derive(Clone, Debug, PartialEq)]
pub enum AdmissionEvent {
    Admitted(Selection),
    Refused { id: ReservationId, error: SelectError },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("no workers are known")]
    NoWorkers,
    #[error("no worker serves model {0:?}")]
    UnknownModel(String),
    #[error("no eligible worker (all filtered out or not schedulable)")]
    NoEligibleWorkers,
    #[error("reservation {0:?} already exists")]
    DuplicateReservation(ReservationId),
    #[error("every eligible worker is saturated and the queue is full")]
    QueueFull,
    #[error("waited in the queue past its deadline")]
    QueueTimeout,
    #[error("the shards are overloaded (a hand-off ring stayed full)")]
    Overloaded,
    #[error("the selection service is shutting down")]
    ShuttingDown,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    #[error("worker block size {worker} differs from the service's {service}")]
    BlockSizeMismatch { worker: u32, service: u32 },
    #[error("worker {0:?} not found")]
    NotFound(WorkerId),
    #[error("the selection service is shutting down")]
    ShuttingDown,
}

/// Counters kept by the facade (shards keep their own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    pub selections: u64,
    /// Selections made with every worker past the TPOT target.
    pub past_tpot_target: u64,
    pub queued: u64,
    pub admitted_from_queue: u64,
    pub refused_queue_full: u64,
    pub refused_queue_timeout: u64,
}
