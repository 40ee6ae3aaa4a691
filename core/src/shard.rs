//! A shard: a set of workers and everything kvpick knows about them — their
//! part of the KV index, their slot tables, the reservations booked on them
//! and those reservations' leases. Touched by one thread only, so no locks;
//! the single-threaded facade and the thread-per-core runtime both drive it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;

use crate::booking::{Booking, BookingEvent, ReservationId};
use crate::clock::Millis;
use crate::cost::Candidate;
use crate::event::{EngineBlockHash, KvEvent};
use crate::hashing::SequenceHash;
use crate::index::{Applied, EventError, KvIndex};
use crate::load::WorkerLoad;
use crate::slot_set::Slot;

mod warm;

use crate::worker::{EndpointFilter, Lifecycle, WorkerId, WorkerSpec};
pub use warm::WorkerSnapshot;

/// Most blocks one prefetch window (`Shard::prefetch_head`) covers: enough
/// events for their cache misses to overlap, few enough that the lines
/// fetched first are still cached when applied. 128 against 64, medians
/// of three runs each: one-block events the same, 16-block stores +6%,
/// 16-block removals +11%, 64-block stores +24% and removals +7% (two
/// 64-block events now share a window), the steady state +8%. 32 was no
/// better than 64; larger sizes are untried (perf/README, "Prefetch
/// windows of 32, 64 and 128 blocks"). The runtime's shard loop also ends
/// a window at its fair share of 64 commands.
pub const PREFETCH_BLOCKS: usize = 128;

/// Who may serve a prompt, as every shard is asked.
#[derive(Clone, Copy, Debug)]
pub struct CandidateQuery<'a> {
    pub seq_hashes: &'a [SequenceHash],
    pub model: Option<&'a str>,
    pub allowed: Option<&'a EndpointFilter>,
}

/// Drops the candidates `allowed` avoids, unless nothing else is left:
/// done by a service once every shard has answered, since "nothing else"
/// spans them all. Each shard does it to its own answer first (a pick
/// may ask one shard only); the service's pass then gives what one pass
/// over all the answers would.
pub fn skip_avoided(candidates: &mut Vec<Candidate>, allowed: Option<&EndpointFilter>) {
    skip_avoided_from(candidates, 0, allowed);
}

/// `skip_avoided` on `candidates[from..]`, keeping their order.
fn skip_avoided_from(candidates: &mut Vec<Candidate>, from: usize, allowed: Option<&EndpointFilter>) {
    if let Some(filter) = allowed.filter(|f| f.avoids_any())
        && candidates[from..].iter().any(|c| !filter.avoids(&c.endpoint))
    {
        let mut i = 0;
        candidates.retain(|c| {
            i += 1;
            i <= from || !filter.avoids(&c.endpoint)
        });
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BookingError {
    #[error("reservation {0:?} already exists")]
    Duplicate(ReservationId),
    #[error("reservation {0:?} not found")]
    NotFound(ReservationId),
    #[error("worker {0:?} is not on this shard")]
    UnknownWorker(WorkerId),
    #[error("no worker serves at {0}")]
    UnknownEndpoint(std::net::SocketAddr),
    #[error("the selection service is shutting down")]
    ShuttingDown,
}

/// Counters a shard keeps for metrics; monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    pub events_applied: u64,
    pub events_rejected: u64,
    pub unknown_parent_events: u64,
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    pub unknown_removals: u64,
    /// Entries given up to the index's memory budget.
    pub blocks_evicted: u64,
    pub leases_expired: u64,
    /// (block, worker) entries in the index now (a gauge, not a counter).
    pub index_entries: u64,
    /// Approximate heap bytes of the index now (a gauge).
    pub index_bytes: u64,
    /// The most entries the index keeps now: its budget less its workers'
    /// fixed cost (a gauge; 0 with no budget).
    pub index_max_entries: u64,
    /// Blocks taken from a peer replica's export (warm start).
    pub blocks_imported: u64,
}

impl ShardStats {
    /// Sums two shards' counters.
    pub fn merge(self, other: ShardStats) -> ShardStats {
        ShardStats {
            events_applied: self.events_applied + other.events_applied,
            events_rejected: self.events_rejected + other.events_rejected,
            unknown_parent_events: self.unknown_parent_events + other.unknown_parent_events,
            blocks_stored: self.blocks_stored + other.blocks_stored,
            blocks_removed: self.blocks_removed + other.blocks_removed,
            unknown_removals: self.unknown_removals + other.unknown_removals,
            blocks_evicted: self.blocks_evicted + other.blocks_evicted,
            leases_expired: self.leases_expired + other.leases_expired,
            index_entries: self.index_entries + other.index_entries,
            index_bytes: self.index_bytes + other.index_bytes,
            index_max_entries: self.index_max_entries + other.index_max_entries,
            blocks_imported: self.blocks_imported + other.blocks_imported,
        }
    }
}

/// A worker's load as reported to callers and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSnapshot {
    pub worker: WorkerId,
    pub prefill_tokens: u64,
    pub active_blocks: u64,
    pub requests: u32,
    pub cached_blocks: u64,
    /// The block size the worker's KV events carry, when it differs from
    /// kvpick's: the most common silent misconfiguration (nothing matches).
    pub block_size_mismatch: Option<u32>,
    /// Its lifecycle is `Schedulable`: it may take new requests now.
    pub schedulable: bool,
}

#[derive(Debug)]
struct WorkerEntry {
    spec: WorkerSpec,
    load: WorkerLoad,
    /// Calibrated speed relative to the fleet (see `Calibration`).
    speed: f64,
    churn: Churn,
    /// The block size the worker's KV events carry, while it is not the
    /// one kvpick hashes with: none of its cache can match.
    engine_block_size: Option<u32>,
}

/// How hard a worker's cache is churning, from its own KV events: blocks
/// removed against blocks stored, over roughly the last few hundred
/// events. Near 0: the cache has room (copies cost nothing); near 1:
/// every block stored evicts one (a copy pushes out something else).
#[derive(Clone, Copy, Debug, Default)]
struct Churn {
    stored: f64,
    removed: f64,
}

/// Each event keeps this much of the older events' weight.
const CHURN_MEMORY: f64 = 0.995;

impl Churn {
    fn record(&mut self, applied: &Applied) {
        self.stored = CHURN_MEMORY * self.stored + applied.stored as f64;
        self.removed = CHURN_MEMORY * self.removed + (applied.removed + applied.unknown_removed) as f64;
    }

    fn pressure(&self) -> f64 {
        if self.stored <= 0.0 { 0.0 } else { (self.removed / self.stored).min(1.0) }
    }
}

#[derive(Debug)]
struct ActiveBooking {
    booking: Booking,
    slot: Slot,
    in_prefill: bool,
}

#[derive(Debug, Default)]
pub struct Shard {
    index: KvIndex,
    slots: Vec<Option<WorkerEntry>>,
    /// Looked up for every KV event, twice (window prefetch, apply). Ids
    /// are xxh3 hashes of the pod or endpoint (`kvpick-discovery`), so a
    /// one-multiply hasher is enough; SipHash took 5% of one-block stores
    /// at 256 workers (perf/README, "One worker lookup per event").
    by_id: HashMap<WorkerId, Slot, FxBuildHasher>,
    bookings: HashMap<ReservationId, ActiveBooking>,
    /// Lazily pruned: an entry whose booking is gone or renewed is skipped.
    leases: BinaryHeap<Reverse<(Millis, ReservationId)>>,
    stats: ShardStats,
    matches: Vec<(Slot, u32)>,
    overlap_by_slot: Vec<u32>,
}

impl Shard {
    pub fn new() -> Self {
        Self::default()
    }

    /// A shard whose index keeps within `max_index_bytes` (see
    /// [`KvIndex::with_max_bytes`]).
    pub fn with_max_index_bytes(max_index_bytes: Option<u64>) -> Self {
        Shard { index: KvIndex::with_max_bytes(max_index_bytes), ..Self::default() }
    }

    /// Keeps the index's evictions for [`Shard::take_evictions`].
    pub fn record_evictions(&mut self) {
        self.index.record_evictions();
    }

    /// The (worker, engine hash) pairs evicted since the last call.
    pub fn take_evictions(&mut self) -> Vec<(WorkerId, EngineBlockHash)> {
        let slots = &self.slots;
        self.index
            .take_evicted()
            .into_iter()
            .filter_map(|(slot, hash)| Some((slots.get(slot as usize)?.as_ref()?.spec.id, hash)))
            .collect()
    }

    pub fn stats(&self) -> ShardStats {
        ShardStats {
            index_entries: self.index.entries(),
            index_bytes: u64::try_from(self.index.approx_bytes()).unwrap_or(u64::MAX),
            index_max_entries: self.index.max_entries().unwrap_or(0),
            ..self.stats
        }
    }

    pub fn index(&self) -> &KvIndex {
        &self.index
    }

    pub fn worker_count(&self) -> usize {
        self.by_id.len()
    }

    pub fn has_worker(&self, id: WorkerId) -> bool {
        self.by_id.contains_key(&id)
    }

    pub fn booking_count(&self) -> usize {
        self.bookings.len()
    }

    /// Adds a worker or updates its facts. Its cache and load are kept
    /// across updates; a changed block size invalidates the cache.
    pub fn upsert_worker(&mut self, spec: WorkerSpec) {
        if let Some(&slot) = self.by_id.get(&spec.id) {
            let entry = self.slots[slot as usize].as_mut().expect("by_id points at live slots");
            if entry.spec.block_size != spec.block_size {
                self.index.clear(slot);
                entry.engine_block_size = None;
            }
            entry.spec = spec;
            return;
        }
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        } as Slot;
        self.by_id.insert(spec.id, slot);
        self.stats.blocks_evicted += self.index.add_worker(slot);
        self.slots[slot as usize] = Some(WorkerEntry {
            spec,
            load: WorkerLoad::default(),
            speed: 1.0,
            churn: Churn::default(),
            engine_block_size: None,
        });
    }

    /// Removes a worker, its cache and its bookings (returned: they are
    /// gone, and the caller must forget them too).
    pub fn delete_worker(&mut self, id: WorkerId) -> Option<Vec<ReservationId>> {
        let slot = self.by_id.remove(&id)?;
        self.index.remove_worker(slot);
        self.slots[slot as usize] = None;
        let mut freed: Vec<ReservationId> =
            self.bookings.iter().filter(|(_, b)| b.slot == slot).map(|(id, _)| *id).collect();
        freed.sort();
        for id in &freed {
            self.bookings.remove(id);
        }
        Some(freed)
    }

    pub fn apply_event(&mut self, worker: WorkerId, event: &KvEvent) -> Result<Applied, EventError> {
        let Some(&slot) = self.by_id.get(&worker) else {
            self.stats.events_rejected += 1;
            return Err(EventError::UnknownWorker);
        };
        let result = self.check_block_size(slot, event).and_then(|()| self.index.apply(slot, event));
        let entry = self.slots[slot as usize].as_mut().expect("by_id points at live slots");
        match &result {
            Ok(applied) => {
                // A cleared cache is an empty one, not one churning.
                match event {
                    KvEvent::Cleared => entry.churn = Churn::default(),
                    _ => entry.churn.record(applied),
                }
                if matches!(event, KvEvent::Stored { .. }) {
                    entry.engine_block_size = None;
                }
                self.stats.events_applied += 1;
                self.stats.blocks_stored += applied.stored;
                self.stats.blocks_removed += applied.removed;
                self.stats.unknown_removals += applied.unknown_removed;
                self.stats.blocks_evicted += applied.evicted;
            }
            Err(EventError::UnknownParent(_)) => self.stats.unknown_parent_events += 1,
            Err(EventError::BlockSizeMismatch { event, .. }) => {
                self.stats.events_rejected += 1;
                entry.engine_block_size = Some(*event);
            }
            Err(_) => self.stats.events_rejected += 1,
        }
        result
    }

    /// Prefetches what applying the events at the head of `events` will
    /// read, changing nothing (see `KvIndex::prefetch`), and returns how
    /// many it covered: those that fit in `PREFETCH_BLOCKS` blocks, at
    /// least one if there is any. They pay only if applied next, in order.
    /// A lone event is left alone: it has nothing to overlap with but its
    /// own blocks, which its store or removal prefetches. Events `apply_event`
    /// refuses before the index sees them (unknown worker, block size not
    /// the worker's) are covered but not prefetched: hashing the tokens of
    /// a misconfigured worker's every event would cost, for nothing.
    pub fn prefetch_head<'a>(&self, events: impl IntoIterator<Item = (WorkerId, &'a KvEvent)>) -> usize {
        let mut blocks = 0;
        let mut covered = 0;
        // Inline up to a window of one-block events: no allocation.
        let mut slotted: SmallVec<[(Slot, &KvEvent); PREFETCH_BLOCKS]> = SmallVec::new();
        for (worker, event) in events {
            blocks += event.blocks();
            if covered > 0 && blocks > PREFETCH_BLOCKS {
                break;
            }
            covered += 1;
            let Some(&slot) = self.by_id.get(&worker) else { continue };
            if self.check_block_size(slot, event).is_ok() {
                slotted.push((slot, event));
            }
        }
        if covered > 1 {
            self.index.prefetch(&slotted);
        }
        covered
    }

    /// A stored event's blocks must be the worker's size: the index hashes
    /// them as given and does not know the worker's.
    fn check_block_size(&self, slot: Slot, event: &KvEvent) -> Result<(), EventError> {
        match event {
            KvEvent::Stored { block_size, .. } if *block_size != self.entry(slot).spec.block_size => {
                Err(EventError::BlockSizeMismatch { event: *block_size, worker: self.entry(slot).spec.block_size })
            }
            _ => Ok(()),
        }
    }

    fn entry(&self, slot: Slot) -> &WorkerEntry {
        self.slots[slot as usize].as_ref().expect("slot taken from by_id")
    }

    fn entry_of_mut(&mut self, worker: WorkerId) -> Option<&mut WorkerEntry> {
        let slot = *self.by_id.get(&worker)?;
        Some(self.slots[slot as usize].as_mut().expect("by_id points at live slots"))
    }

    /// Appends one candidate per schedulable worker serving the query.
    pub fn candidates(&mut self, query: &CandidateQuery<'_>, out: &mut Vec<Candidate>) {
        let from = out.len();
        self.matches.clear();
        self.index.find_matches(query.seq_hashes, &mut self.matches);
        self.overlap_by_slot.clear();
        self.overlap_by_slot.resize(self.slots.len(), 0);
        for &(slot, depth) in &self.matches {
            self.overlap_by_slot[slot as usize] = depth;
        }
        for (slot, entry) in self.slots.iter().enumerate() {
            let Some(WorkerEntry { spec, load, speed, churn, .. }) = entry else { continue };
            if spec.lifecycle != Lifecycle::Schedulable
                || !spec.serves(query.model)
                || query.allowed.is_some_and(|f| !f.allows(&spec.endpoint))
            {
                continue;
            }
            let active_prefix = load.active_prefix(query.seq_hashes);
            out.push(Candidate {
                worker: spec.id,
                endpoint: spec.endpoint,
                block_size: spec.block_size,
                overlap_blocks: self.overlap_by_slot[slot],
                active_prefill_tokens: load.prefill_tokens(),
                active_blocks: load.active_blocks(),
                new_blocks: (query.seq_hashes.len() - active_prefix) as u64,
                active_requests: load.requests(),
                max_num_batched_tokens: spec.max_num_batched_tokens,
                total_kv_blocks: spec.total_kv_blocks,
                booked_prefix_blocks: active_prefix as u32,
                speed: *speed,
                eviction_pressure: churn.pressure(),
            });
        }
        skip_avoided_from(out, from, query.allowed);
    }

    /// Sets a worker's calibrated speed; false when it is not here.
    pub fn set_speed(&mut self, worker: WorkerId, speed: f64) -> bool {
        let Some(entry) = self.entry_of_mut(worker) else { return false };
        entry.speed = speed;
        true
    }

    /// Applies a booking change, whether decided here or by a peer.
    /// `PrefillComplete`, `Freed` and `Renewed` are idempotent: repeating
    /// one is `NotFound` (freed) or a no-op (prefill already complete, the
    /// lease already as long).
    pub fn apply_booking(&mut self, event: BookingEvent) -> Result<(), BookingError> {
        match event {
            BookingEvent::Reserved(booking) => {
                if self.bookings.contains_key(&booking.id) {
                    return Err(BookingError::Duplicate(booking.id));
                }
                let slot = *self.by_id.get(&booking.worker).ok_or(BookingError::UnknownWorker(booking.worker))?;
                let load = &mut self.slots[slot as usize].as_mut().expect("slot taken from by_id").load;
                load.book(&booking.seq_hashes, booking.unhashed_blocks, booking.prefill_tokens);
                self.leases.push(Reverse((booking.lease_until, booking.id)));
                self.bookings.insert(booking.id, ActiveBooking { booking, slot, in_prefill: true });
                Ok(())
            }
            BookingEvent::PrefillComplete(id) => {
                let active = self.bookings.get_mut(&id).ok_or(BookingError::NotFound(id))?;
                if active.in_prefill {
                    active.in_prefill = false;
                    let load =
                        &mut self.slots[active.slot as usize].as_mut().expect("bookings point at live slots").load;
                    load.complete_prefill(active.booking.prefill_tokens);
                }
                Ok(())
            }
            BookingEvent::Renewed { id, lease_until } => {
                let active = self.bookings.get_mut(&id).ok_or(BookingError::NotFound(id))?;
                // The old heap entry stays and is skipped when it comes
                // up (`expire` matches the booking's current end).
                if lease_until > active.booking.lease_until {
                    active.booking.lease_until = lease_until;
                    self.leases.push(Reverse((lease_until, id)));
                }
                Ok(())
            }
            BookingEvent::Freed(id) => {
                let active = self.bookings.remove(&id).ok_or(BookingError::NotFound(id))?;
                let still_prefill = if active.in_prefill { active.booking.prefill_tokens } else { 0 };
                let load = &mut self.slots[active.slot as usize].as_mut().expect("bookings point at live slots").load;
                load.release(&active.booking.seq_hashes, active.booking.unhashed_blocks, still_prefill);
                Ok(())
            }
        }
    }

    /// The worker holding booking `id`.
    pub fn booked_worker(&self, id: ReservationId) -> Option<WorkerId> {
        self.bookings.get(&id).map(|b| b.booking.worker)
    }

    /// Frees a booking and hands back what it booked and whether its
    /// prefill was still booked: the first half of moving it to another
    /// worker (the second is a `Reserved` on that worker's shard).
    pub fn take_booking(&mut self, id: ReservationId) -> Result<(Booking, bool), BookingError> {
        let active = self.bookings.get(&id).ok_or(BookingError::NotFound(id))?;
        let taken = (active.booking.clone(), active.in_prefill);
        self.apply_booking(BookingEvent::Freed(id))?;
        Ok(taken)
    }

    /// Frees every booking whose lease ended by `now`; returns their ids.
    pub fn expire(&mut self, now: Millis) -> Vec<ReservationId> {
        let mut expired = Vec::new();
        while let Some(&Reverse((until, id))) = self.leases.peek() {
            if until > now {
                break;
            }
            self.leases.pop();
            if self.bookings.get(&id).is_some_and(|b| b.booking.lease_until == until) {
                self.apply_booking(BookingEvent::Freed(id)).expect("booking checked present");
                self.stats.leases_expired += 1;
                expired.push(id);
            }
        }
        expired
    }

    /// The earliest lease end, for the caller's timer.
    pub fn next_lease_end(&self) -> Option<Millis> {
        self.leases.peek().map(|Reverse((until, _))| *until)
    }

    pub fn booking(&self, id: ReservationId) -> Option<&Booking> {
        self.bookings.get(&id).map(|b| &b.booking)
    }

    pub fn loads(&self) -> impl Iterator<Item = LoadSnapshot> + '_ {
        self.slots.iter().enumerate().filter_map(|(slot, entry)| {
            let entry = entry.as_ref()?;
            Some(LoadSnapshot {
                worker: entry.spec.id,
                prefill_tokens: entry.load.prefill_tokens(),
                active_blocks: entry.load.active_blocks(),
                requests: entry.load.requests(),
                cached_blocks: self.index.worker_blocks(slot as Slot) as u64,
                block_size_mismatch: entry.engine_block_size,
                schedulable: entry.spec.lifecycle == Lifecycle::Schedulable,
            })
        })
    }

    /// The block size the worker's KV events carry, when it is not the one
    /// kvpick hashes with.
    pub fn engine_block_size(&self, id: WorkerId) -> Option<u32> {
        self.by_id.get(&id).and_then(|&slot| self.entry(slot).engine_block_size)
    }

    /// Overlap depth of every worker holding a prefix of `seq_hashes`.
    pub fn overlaps(&self, seq_hashes: &[SequenceHash]) -> Vec<(WorkerId, u32)> {
        let mut matches = Vec::new();
        self.index.find_matches(seq_hashes, &mut matches);
        matches.into_iter().map(|(slot, depth)| (self.entry(slot).spec.id, depth)).collect()
    }

    pub fn worker_spec(&self, id: WorkerId) -> Option<&WorkerSpec> {
        self.by_id.get(&id).map(|&slot| &self.entry(slot).spec)
    }
}

#[cfg(test)]
mod tests;
