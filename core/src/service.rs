//! `SelectionService`: S shards driven from the caller's thread.
//!
//! This is the reference behaviour: hash once, ask every shard for its
//! candidates, pick with the shared cost code, book on the owning shard. The
//! thread-per-core runtime must return exactly what this returns for the
//! same seed and the same operations.

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::booking::{Booking, BookingEvent, ReservationId};
use crate::clock::Millis;
use crate::cost::{Candidate, RouterConfig, pick};
use crate::directory::Directory;
use crate::event::KvEvent;
use crate::index::{Applied, EventError};
use crate::prompt::Prompt;
use crate::queue::AdmissionQueue;
use crate::shard::{BookingError, CandidateQuery, LoadSnapshot, Shard, ShardStats};
use crate::worker::{EndpointFilter, WorkerId, WorkerSpec};

#[derive(Clone, Debug, PartialEq)]
pub struct SelectRequest {
    pub id: ReservationId,
    pub prompt: Prompt,
    pub model: Option<String>,
    /// Only these endpoints may serve the request.
    pub allowed: Option<EndpointFilter>,
    /// Higher is admitted first from the queue.
    pub priority: i32,
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
    /// Eligible workers the pick was made among.
    pub candidates: usize,
    /// The next-cheapest other workers, cheapest first, at most
    /// `RouterConfig::fallbacks` of them: the ordered fallback list a
    /// gateway may try when the pick fails. Empty by default (no cost).
    pub fallbacks: Vec<SocketAddr>,
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
    pub queued: u64,
    pub admitted_from_queue: u64,
    pub refused_queue_full: u64,
    pub refused_queue_timeout: u64,
}

pub struct SelectionService {
    cfg: RouterConfig,
    block_size: u32,
    shards: Vec<Shard>,
    directory: Directory,
    owners: HashMap<ReservationId, usize>,
    queue: AdmissionQueue,
    admissions: Vec<AdmissionEvent>,
    rng: fastrand::Rng,
    candidates: Vec<Candidate>,
    costs: Vec<f64>,
    stats: ServiceStats,
}

impl SelectionService {
    /// `shards` ≥ 1; `block_size` is the engines' `--block-size`, used to
    /// hash prompts.
    pub fn new(cfg: RouterConfig, block_size: u32, shards: usize) -> Self {
        SelectionService {
            rng: fastrand::Rng::with_seed(cfg.seed),
            queue: AdmissionQueue::new(cfg.queue_capacity),
            cfg,
            block_size,
            shards: (0..shards.max(1)).map(|_| Shard::new()).collect(),
            directory: Directory::new(shards),
            owners: HashMap::new(),
            admissions: Vec::new(),
            candidates: Vec::new(),
            costs: Vec::new(),
            stats: ServiceStats::default(),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn config(&self) -> &RouterConfig {
        &self.cfg
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn stats(&self) -> ServiceStats {
        self.stats
    }

    pub fn shard_stats(&self) -> ShardStats {
        self.shards.iter().map(Shard::stats).fold(ShardStats::default(), ShardStats::merge)
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    pub fn active_reservations(&self) -> usize {
        self.owners.len()
    }

    /// Hashes a prompt the way this service's index does.
    pub fn prompt(&self, tokens: &[u32], seed: crate::hashing::HashSeed) -> Prompt {
        Prompt::from_tokens(tokens, self.block_size, seed)
    }

    pub fn upsert_worker(&mut self, spec: WorkerSpec, now: Millis) -> Result<(), WorkerError> {
        check_block_size(&spec, self.block_size)?;
        let shard = self.directory.place(&spec);
        self.shards[shard].upsert_worker(spec);
        self.admit_waiting(now);
        Ok(())
    }

    /// Removes a worker; its bookings are dropped and returned.
    pub fn delete_worker(&mut self, id: WorkerId) -> Result<Vec<ReservationId>, WorkerError> {
        let shard = self.directory.remove(id).ok_or(WorkerError::NotFound(id))?;
        let freed = self.shards[shard].delete_worker(id).unwrap_or_default();
        for r in &freed {
            self.owners.remove(r);
        }
        Ok(freed)
    }

    pub fn worker_spec(&self, id: WorkerId) -> Option<&WorkerSpec> {
        self.shards[self.directory.shard_of(id)?].worker_spec(id)
    }

    pub fn worker_ids(&self) -> Vec<WorkerId> {
        self.directory.worker_ids()
    }

    pub fn apply_kv_event(&mut self, worker: WorkerId, event: &KvEvent) -> Result<Applied, EventError> {
        let shard = self.directory.shard_of(worker).ok_or(EventError::UnknownWorker)?;
        self.shards[shard].apply_event(worker, event)
    }

    /// Candidates for a request, sorted by worker id, in `self.candidates`.
    fn gather(
        &mut self,
        prompt: &Prompt,
        model: Option<&str>,
        allowed: Option<&EndpointFilter>,
    ) -> Result<(), SelectError> {
        self.directory.check(model)?;
        let query = CandidateQuery { seq_hashes: &prompt.seq_hashes, model, allowed };
        self.candidates.clear();
        for shard in &mut self.shards {
            shard.candidates(&query, &mut self.candidates);
        }
        if self.candidates.is_empty() {
            return Err(SelectError::NoEligibleWorkers);
        }
        sort_candidates(&mut self.candidates);
        Ok(())
    }

    fn choose(&mut self, prompt: &Prompt) -> usize {
        choose(&self.candidates, prompt, self.block_size, &self.cfg, &mut self.rng, &mut self.costs)
    }

    /// Picks a worker without booking anything.
    pub fn select(&mut self, request: &SelectRequest) -> Result<Selection, SelectError> {
        self.gather(&request.prompt, request.model.as_deref(), request.allowed.as_ref())?;
        let chosen = self.choose(&request.prompt);
        Ok(self.selection(request, chosen))
    }

    fn selection(&self, request: &SelectRequest, chosen: usize) -> Selection {
        selection(request, &self.candidates, &self.costs, chosen, self.cfg.fallbacks)
    }

    /// Picks a worker and books the request on it, or queues the request
    /// when every eligible worker is saturated (see `RouterConfig`).
    pub fn select_and_reserve(&mut self, request: SelectRequest, now: Millis) -> Result<Admission, SelectError> {
        if self.owners.contains_key(&request.id) || self.queue.contains(request.id) {
            return Err(SelectError::DuplicateReservation(request.id));
        }
        self.gather(&request.prompt, request.model.as_deref(), request.allowed.as_ref())?;
        if let Some(threshold) = self.cfg.queue_threshold {
            if self.candidates.iter().all(|c| c.saturated(threshold)) {
                let deadline = now.after(self.cfg.queue_timeout);
                return match self.queue.push(request, deadline) {
                    Ok(()) => {
                        self.stats.queued += 1;
                        Ok(Admission::Queued)
                    }
                    Err(_) => {
                        self.stats.refused_queue_full += 1;
                        Err(SelectError::QueueFull)
                    }
                };
            }
        }
        Ok(Admission::Reserved(self.reserve(&request, now)))
    }

    /// Books the pick among the gathered candidates.
    fn reserve(&mut self, request: &SelectRequest, now: Millis) -> Selection {
        let chosen = self.choose(&request.prompt);
        let selection = self.selection(request, chosen);
        let shard = self.directory.shard_of(selection.worker).expect("candidates come from placed workers");
        let booking = booking(request, &selection, self.block_size, now.after(self.cfg.lease));
        self.shards[shard]
            .apply_booking(BookingEvent::Reserved(booking))
            .expect("the id is new and the worker was just gathered from this shard");
        self.owners.insert(request.id, shard);
        self.stats.selections += 1;
        selection
    }

    /// The request's prefill is done: its prompt tokens stop counting as
    /// prefill load (its blocks stay booked until freed). Idempotent.
    pub fn prefill_complete(&mut self, id: ReservationId, now: Millis) -> Result<(), BookingError> {
        let shard = *self.owners.get(&id).ok_or(BookingError::NotFound(id))?;
        self.shards[shard].apply_booking(BookingEvent::PrefillComplete(id))?;
        self.admit_waiting(now);
        Ok(())
    }

    /// Releases everything booked for the request, or withdraws it from
    /// the queue. Freeing twice is `NotFound` and changes nothing.
    pub fn free_reservation(&mut self, id: ReservationId, now: Millis) -> Result<(), BookingError> {
        if self.queue.remove(id).is_some() {
            return Ok(());
        }
        let shard = self.owners.remove(&id).ok_or(BookingError::NotFound(id))?;
        self.shards[shard].apply_booking(BookingEvent::Freed(id))?;
        self.admit_waiting(now);
        Ok(())
    }

    /// Expires leases and queue deadlines up to `now`, then admits what fits.
    pub fn tick(&mut self, now: Millis) {
        for shard in &mut self.shards {
            for id in shard.expire(now) {
                self.owners.remove(&id);
            }
        }
        for waiting in self.queue.expire(now) {
            self.stats.refused_queue_timeout += 1;
            self.admissions.push(AdmissionEvent::Refused { id: waiting.request.id, error: SelectError::QueueTimeout });
        }
        self.admit_waiting(now);
    }

    /// Outcomes of queued requests since the last call.
    pub fn take_admissions(&mut self) -> Vec<AdmissionEvent> {
        std::mem::take(&mut self.admissions)
    }

    fn admit_waiting(&mut self, now: Millis) {
        let Some(threshold) = self.cfg.queue_threshold else { return };
        if self.queue.is_empty() {
            return;
        }
        for id in self.queue.ids() {
            let waiting = self.queue.get(id).expect("id listed by the queue");
            let request = waiting.request.clone();
            match self.gather(&request.prompt, request.model.as_deref(), request.allowed.as_ref()) {
                Err(error) => {
                    self.queue.remove(id);
                    self.admissions.push(AdmissionEvent::Refused { id, error });
                }
                Ok(()) if self.candidates.iter().all(|c| c.saturated(threshold)) => {}
                Ok(()) => {
                    self.queue.remove(id);
                    let selection = self.reserve(&request, now);
                    self.stats.admitted_from_queue += 1;
                    self.admissions.push(AdmissionEvent::Admitted(selection));
                }
            }
        }
    }

    /// Overlap depth per worker holding a prefix of the prompt, by worker id.
    pub fn overlap_scores(&self, prompt: &Prompt) -> Vec<(WorkerId, u32)> {
        let mut all: Vec<(WorkerId, u32)> = self.shards.iter().flat_map(|s| s.overlaps(&prompt.seq_hashes)).collect();
        all.sort();
        all
    }

    /// Every worker's load, by worker id.
    pub fn loads(&self) -> Vec<LoadSnapshot> {
        let mut all: Vec<LoadSnapshot> = self.shards.iter().flat_map(Shard::loads).collect();
        all.sort_by_key(|l| l.worker);
        all
    }

    pub fn booking(&self, id: ReservationId) -> Option<&Booking> {
        self.shards[*self.owners.get(&id)?].booking(id)
    }
}

pub(crate) fn check_block_size(spec: &WorkerSpec, block_size: u32) -> Result<(), WorkerError> {
    if spec.block_size != block_size {
        return Err(WorkerError::BlockSizeMismatch { worker: spec.block_size, service: block_size });
    }
    Ok(())
}

/// Merges shards' candidates into the one order every pick is made in.
pub(crate) fn sort_candidates(candidates: &mut [Candidate]) {
    candidates.sort_unstable_by_key(|c| c.worker);
}

/// Costs every candidate (into `costs`) and picks one.
pub(crate) fn choose(
    candidates: &[Candidate],
    prompt: &Prompt,
    block_size: u32,
    cfg: &RouterConfig,
    rng: &mut fastrand::Rng,
    costs: &mut Vec<f64>,
) -> usize {
    let unhashed = prompt.unhashed_blocks(block_size);
    costs.clear();
    costs.extend(candidates.iter().map(|c| c.cost(prompt.isl_tokens, unhashed, cfg)));
    pick(costs, cfg.temperature, rng)
}

pub(crate) fn selection(
    request: &SelectRequest,
    candidates: &[Candidate],
    costs: &[f64],
    chosen: usize,
    fallbacks: usize,
) -> Selection {
    let c = &candidates[chosen];
    Selection {
        id: request.id,
        worker: c.worker,
        endpoint: c.endpoint,
        overlap_blocks: c.overlap_blocks,
        prefill_tokens: c.effective_prefill_tokens(request.prompt.isl_tokens),
        isl_tokens: request.prompt.isl_tokens,
        cost: costs[chosen],
        candidates: candidates.len(),
        fallbacks: ranked_others(candidates, costs, chosen, fallbacks),
    }
}

/// Up to `n` other candidates by cost, then by their (deterministic) order.
fn ranked_others(candidates: &[Candidate], costs: &[f64], chosen: usize, n: usize) -> Vec<SocketAddr> {
    if n == 0 {
        return Vec::new();
    }
    let mut others: Vec<usize> = (0..candidates.len()).filter(|i| *i != chosen).collect();
    others.sort_by(|a, b| costs[*a].total_cmp(&costs[*b]).then(a.cmp(b)));
    others.into_iter().take(n).map(|i| candidates[i].endpoint).collect()
}

pub(crate) fn booking(request: &SelectRequest, selection: &Selection, block_size: u32, lease_until: Millis) -> Booking {
    Booking {
        id: request.id,
        worker: selection.worker,
        seq_hashes: request.prompt.seq_hashes.clone(),
        unhashed_blocks: request.prompt.unhashed_blocks(block_size),
        prefill_tokens: selection.prefill_tokens,
        lease_until,
    }
}

#[cfg(test)]
mod tests;
