//! `SelectionService`: S shards driven from the caller's thread.
//!
//! This is the reference behaviour: hash once, ask every shard for its
//! candidates, pick with the shared cost code, book on the owning shard. The
//! thread-per-core runtime must return exactly what this returns for the
//! same seed and the same operations.

use crate::admission::AdmissionLedger;
use crate::booking::{Booking, BookingEvent, ReservationId};
use crate::calibration::{Calibration, SampleError};
use crate::clock::Millis;
use crate::cost::{Candidate, RouterConfig};
use crate::directory::Directory;
use crate::event::EngineBlockHash;
use crate::event::KvEvent;
use crate::hashing::HashSeed;
use crate::index::{Applied, EventError, ImportError, max_bytes_per_shard};
use crate::pick::{Decision, PickPolicy};
use crate::prompt::Prompt;
use crate::replica::ReplicaId;
use crate::request::{Admission, AdmissionEvent, SelectError, SelectRequest, Selection, ServiceStats, WorkerError};
use crate::shard::{BookingError, CandidateQuery, LoadSnapshot, Shard, ShardStats, WorkerSnapshot, skip_avoided};
use crate::worker::{EndpointFilter, WorkerId, WorkerSpec};

pub struct SelectionService {
    policy: PickPolicy,
    shards: Vec<Shard>,
    directory: Directory,
    ledger: AdmissionLedger,
    calibration: Calibration,
    rng: fastrand::Rng,
    candidates: Vec<Candidate>,
    costs: Vec<f64>,
    /// Bookings applied for peer replicas, and whose: only that origin may
    /// change them, and this replica's own calls may not.
    peer_owned: std::collections::HashMap<ReservationId, ReplicaId>,
}

/// Bookings whose lease ran out at a `tick`, this replica's own (its
/// `Outbox` records them as freed) and its peers' (their `Inbox` is told
/// its shards let them go: `Inbox::not_applied`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expired {
    pub own: Vec<ReservationId>,
    pub peers: Vec<(ReplicaId, ReservationId)>,
}

impl SelectionService {
    /// `shards` ≥ 1; `block_size` is the engines' `--block-size`, used to
    /// hash prompts.
    pub fn new(cfg: RouterConfig, block_size: u32, shards: usize) -> Self {
        let max_index_bytes = max_bytes_per_shard(cfg.index_max_bytes, shards);
        SelectionService {
            rng: fastrand::Rng::with_seed(cfg.seed),
            ledger: AdmissionLedger::new(cfg.queue_capacity),
            calibration: Calibration::new(cfg.calibration.clone()),
            policy: PickPolicy::new(cfg, block_size),
            shards: (0..shards.max(1)).map(|_| Shard::with_max_index_bytes(max_index_bytes)).collect(),
            directory: Directory::new(shards),
            candidates: Vec::new(),
            costs: Vec::new(),
            peer_owned: std::collections::HashMap::new(),
        }
    }

    /// The shard holding this replica's own booking `id`.
    fn own_booking(&self, id: ReservationId) -> Result<usize, BookingError> {
        match self.ledger.owner(id) {
            Some(shard) if !self.peer_owned.contains_key(&id) => Ok(shard),
            _ => Err(BookingError::NotFound(id)),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.policy.block_size()
    }

    pub fn config(&self) -> &RouterConfig {
        self.policy.config()
    }

    pub fn policy(&self) -> &PickPolicy {
        &self.policy
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn stats(&self) -> ServiceStats {
        self.ledger.stats()
    }

    /// Keeps every shard's index evictions for [`Self::take_evictions`].
    pub fn record_evictions(&mut self) {
        self.shards.iter_mut().for_each(Shard::record_evictions);
    }

    /// The (worker, engine hash) pairs the shards evicted since the last
    /// call, to stay within `RouterConfig::index_max_bytes`.
    pub fn take_evictions(&mut self) -> Vec<(WorkerId, EngineBlockHash)> {
        self.shards.iter_mut().flat_map(Shard::take_evictions).collect()
    }

    pub fn shard_stats(&self) -> ShardStats {
        self.shards.iter().map(Shard::stats).fold(ShardStats::default(), ShardStats::merge)
    }

    pub fn queue_len(&self) -> usize {
        self.ledger.queue_len()
    }

    pub fn active_reservations(&self) -> usize {
        self.ledger.active()
    }

    /// Hashes a prompt the way this service's index does.
    pub fn prompt(&self, tokens: &[u32], seed: HashSeed) -> Prompt {
        self.policy.prompt(tokens, seed)
    }

    pub fn upsert_worker(&mut self, spec: WorkerSpec, now: Millis) -> Result<(), WorkerError> {
        self.policy.check_worker(&spec)?;
        let shard = self.directory.place(&spec);
        self.shards[shard].upsert_worker(spec);
        self.admit_waiting(now);
        Ok(())
    }

    /// Removes a worker; its bookings are dropped and returned (peers'
    /// too: tell their `Inbox` with `not_applied`).
    pub fn delete_worker(&mut self, id: WorkerId) -> Result<Vec<ReservationId>, WorkerError> {
        let shard = self.directory.remove(id).ok_or(WorkerError::NotFound(id))?;
        let freed = self.shards[shard].delete_worker(id).unwrap_or_default();
        self.calibration.forget(id);
        for r in &freed {
            self.ledger.release(*r);
            self.peer_owned.remove(r);
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

    /// See `Shard::export_worker` (warm start).
    pub fn export_worker(&self, worker: WorkerId) -> Option<WorkerSnapshot> {
        self.shards[self.directory.shard_of(worker)?].export_worker(worker)
    }

    /// See `Shard::import_worker` (warm start).
    pub fn import_worker(&mut self, worker: WorkerId, snapshot: &WorkerSnapshot) -> Result<Applied, ImportError> {
        let shard = self.directory.shard_of(worker).ok_or(ImportError::UnknownWorker)?;
        self.shards[shard].import_worker(worker, snapshot)
    }

    /// Every shard's candidates for a request, in `self.candidates`.
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
        skip_avoided(&mut self.candidates, allowed);
        Ok(())
    }

    fn decide(&mut self, request: &SelectRequest, now: Millis) -> Decision {
        self.policy.decide(request, &mut self.candidates, &mut self.costs, &mut self.rng, now)
    }

    /// Picks a worker without booking anything.
    pub fn select(&mut self, request: &SelectRequest) -> Result<Selection, SelectError> {
        self.gather(&request.prompt, request.model.as_deref(), request.allowed.as_ref())?;
        if self.candidates.is_empty() {
            return Err(SelectError::NoEligibleWorkers);
        }
        Ok(self.policy.choose(request, &mut self.candidates, &mut self.costs, &mut self.rng))
    }

    /// Picks a worker and books the request on it, or queues the request
    /// when every eligible worker is saturated (see `RouterConfig`).
    pub fn select_and_reserve(&mut self, request: SelectRequest, now: Millis) -> Result<Admission, SelectError> {
        self.ledger.check_new(request.id)?;
        self.gather(&request.prompt, request.model.as_deref(), request.allowed.as_ref())?;
        match self.decide(&request, now) {
            Decision::Book { selection, booking } => Ok(Admission::Reserved(self.book(selection, booking))),
            Decision::NoEligible => Err(SelectError::NoEligibleWorkers),
            Decision::Saturated => self.ledger.enqueue(request, now, self.policy.config().queue_timeout),
        }
    }

    /// Books a decided pick on its worker's shard.
    fn book(&mut self, selection: Selection, booking: Booking) -> Selection {
        let shard = self.directory.shard_of(selection.worker).expect("candidates come from placed workers");
        let id = booking.id;
        self.shards[shard]
            .apply_booking(BookingEvent::Reserved(booking))
            .expect("the id is new and the worker was just gathered from this shard");
        self.ledger.claim(id, shard).expect("the id was checked new");
        self.ledger.booked(&selection);
        selection
    }

    /// The request's prefill is done: its prompt tokens stop counting as
    /// prefill load (its blocks stay booked until freed). Idempotent.
    pub fn prefill_complete(&mut self, id: ReservationId, now: Millis) -> Result<(), BookingError> {
        let shard = self.own_booking(id)?;
        self.shards[shard].apply_booking(BookingEvent::PrefillComplete(id))?;
        self.admit_waiting(now);
        Ok(())
    }

    /// The gateway reports that another worker served the request (a
    /// fallback, a retry, or a pick it ignored): the booking moves there,
    /// prefill state and lease kept. `Ok(None)` when it is there already;
    /// the new worker otherwise. Its prefill stays as booked for the pick
    /// (what the served worker caches of the prompt is not looked up).
    pub fn move_booking(
        &mut self,
        id: ReservationId,
        to: std::net::SocketAddr,
        now: Millis,
    ) -> Result<Option<WorkerId>, BookingError> {
        let from = self.own_booking(id)?;
        let worker = self.directory.worker_at(to).ok_or(BookingError::UnknownEndpoint(to))?;
        let target = self.directory.shard_of(worker).expect("the directory places every worker it knows");
        if self.shards[from].booked_worker(id) == Some(worker) {
            return Ok(None);
        }
        let (mut booking, in_prefill) = self.shards[from].take_booking(id)?;
        booking.worker = worker;
        self.ledger.release(id);
        self.ledger.claim(id, target).expect("the id was just released");
        self.shards[target].apply_booking(BookingEvent::Reserved(booking))?;
        if !in_prefill {
            self.shards[target].apply_booking(BookingEvent::PrefillComplete(id))?;
        }
        self.admit_waiting(now);
        Ok(Some(worker))
    }

    /// The request is still answering: its lease ends a full lease from
    /// `now` (a stream longer than the lease keeps its booking).
    pub fn renew_lease(&mut self, id: ReservationId, now: Millis) -> Result<(), BookingError> {
        let shard = self.own_booking(id)?;
        let lease_until = now.after(self.policy.config().lease);
        self.shards[shard].apply_booking(BookingEvent::Renewed { id, lease_until })
    }

    /// Releases everything booked for the request, or withdraws it from
    /// the queue. Freeing twice is `NotFound` and changes nothing.
    pub fn free_reservation(&mut self, id: ReservationId, now: Millis) -> Result<(), BookingError> {
        if self.ledger.withdraw(id) {
            return Ok(());
        }
        self.own_booking(id)?;
        let shard = self.ledger.release(id).ok_or(BookingError::NotFound(id))?;
        self.shards[shard].apply_booking(BookingEvent::Freed(id))?;
        self.admit_waiting(now);
        Ok(())
    }

    /// Applies a booking change replica `origin` made (as its `Inbox`
    /// hands it over), so this replica's picks count the load it booked.
    /// A `Reserved` goes to its worker's shard; the rest to the shard that
    /// holds the booking, and only if `origin` booked it. Freeing or
    /// finishing a prefill admits what waits. A refused `Reserved` should
    /// be told to the inbox (`Inbox::not_applied`).
    pub fn apply_peer_booking(
        &mut self,
        origin: ReplicaId,
        event: BookingEvent,
        now: Millis,
    ) -> Result<(), BookingError> {
        let id = event.id();
        if let BookingEvent::Reserved(booking) = event {
            let shard = self.directory.shard_of(booking.worker).ok_or(BookingError::UnknownWorker(booking.worker))?;
            // Also refused: an id this replica queued (ids are unique
            // across replicas, so that is a peer's defect).
            self.ledger.check_new(id).map_err(|_| BookingError::Duplicate(id))?;
            self.ledger.claim(id, shard).map_err(|_| BookingError::Duplicate(id))?;
            if let Err(e) = self.shards[shard].apply_booking(BookingEvent::Reserved(booking)) {
                self.ledger.release(id);
                return Err(e);
            }
            self.peer_owned.insert(id, origin);
            return Ok(());
        }
        if self.peer_owned.get(&id) != Some(&origin) {
            return Err(BookingError::NotFound(id));
        }
        let shard = self.ledger.owner(id).ok_or(BookingError::NotFound(id))?;
        if matches!(event, BookingEvent::Freed(_)) {
            self.ledger.release(id);
            self.peer_owned.remove(&id);
        }
        self.shards[shard].apply_booking(event)?;
        self.admit_waiting(now);
        Ok(())
    }

    /// A measured time to first token on `worker`, from booking to the
    /// first streamed chunk, against the selection's `predicted_ttft_ns`:
    /// calibrates the worker's speed (see `Calibration`).
    pub fn observe_ttft(
        &mut self,
        worker: WorkerId,
        predicted_ns: f64,
        measured_ns: u64,
        now: Millis,
    ) -> Result<(), SampleError> {
        for (worker, speed) in self.calibration.observe_ttft(worker, predicted_ns, measured_ns, now)? {
            self.set_speed(worker, speed);
        }
        Ok(())
    }

    /// A response's decode on `worker`: `output_tokens` after the first in
    /// `decode_ns`.
    pub fn observe_decode(&mut self, worker: WorkerId, output_tokens: u64, decode_ns: u64, now: Millis) {
        self.calibration.observe_decode(worker, output_tokens, decode_ns, now);
    }

    pub fn calibration(&self) -> &Calibration {
        &self.calibration
    }

    fn set_speed(&mut self, worker: WorkerId, speed: f64) {
        if let Some(shard) = self.directory.shard_of(worker) {
            self.shards[shard].set_speed(worker, speed);
        }
    }

    /// Expires leases, stale calibration and queue deadlines up to `now`,
    /// then admits what fits; returns the bookings whose lease ran out.
    pub fn tick(&mut self, now: Millis) -> Expired {
        for (worker, speed) in self.calibration.expire(now) {
            self.set_speed(worker, speed);
        }
        let mut expired = Expired::default();
        for shard in &mut self.shards {
            for id in shard.expire(now) {
                self.ledger.release(id);
                match self.peer_owned.remove(&id) {
                    Some(origin) => expired.peers.push((origin, id)),
                    None => expired.own.push(id),
                }
            }
        }
        for refused in self.ledger.expire_waiting(now) {
            self.ledger.keep(refused);
        }
        self.admit_waiting(now);
        expired
    }

    /// Outcomes of queued requests since the last call.
    pub fn take_admissions(&mut self) -> Vec<AdmissionEvent> {
        self.ledger.take_outcomes()
    }

    fn admit_waiting(&mut self, now: Millis) {
        if self.policy.config().queue_threshold.is_none() || !self.ledger.has_waiting() {
            return;
        }
        for id in self.ledger.waiting_ids() {
            let request = self.ledger.waiting(id).expect("id listed by the queue").clone();
            let decision = match self.gather(&request.prompt, request.model.as_deref(), request.allowed.as_ref()) {
                Err(error) => Err(error),
                Ok(()) => match self.decide(&request, now) {
                    Decision::NoEligible => Err(SelectError::NoEligibleWorkers),
                    decided => Ok(decided),
                },
            };
            match decision {
                Err(error) => {
                    self.ledger.withdraw(id);
                    self.ledger.keep(AdmissionEvent::Refused { id, error });
                }
                Ok(Decision::Book { selection, booking }) => {
                    self.ledger.withdraw(id);
                    let selection = self.book(selection, booking);
                    let admitted = self.ledger.admitted(selection);
                    self.ledger.keep(admitted);
                }
                Ok(_) => {}
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
        self.shards[self.ledger.owner(id)?].booking(id)
    }
}

#[cfg(test)]
mod tests;
