//! One peer's side, as this replica mirrors it: applying its numbered
//! booking changes exactly once, noticing what went missing, and turning
//! its snapshots into the difference to apply.

use std::collections::HashMap;
use std::sync::Arc;

use crate::booking::{Booking, BookingEvent, ReservationId};
use crate::clock::Millis;
use crate::worker::WorkerId;

use super::digest::LiveDigest;
use super::{Batch, Digest, InboxConfig, Incarnation, PeerBooking, PeerEvent, ReplicaId, Snapshot};

#[derive(Clone, Copy, Debug)]
struct Mirrored {
    worker: WorkerId,
    prefill_done: bool,
    /// Applied to this replica's shards. A booking on a worker this
    /// replica does not know is mirrored (the origin's digest counts it)
    /// but never applied: a peer cannot put load on a stranger.
    applied: bool,
}

/// Counts of what an origin's stream held, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxStats {
    pub events_applied: u64,
    /// Events already applied, sent again (a retransmission or a batch
    /// that crossed a snapshot).
    pub duplicate_events: u64,
    /// Frames of an earlier incarnation, or numbered before what is held.
    pub stale_frames: u64,
    /// Frames no origin could have sent (sequence number 0 or overflowing).
    pub invalid_frames: u64,
    pub gaps: u64,
    pub resyncs: u64,
    pub digest_mismatches: u64,
    /// Events dropped while a resync was awaited (the snapshot covers them
    /// or the stream after it does).
    pub dropped_while_resyncing: u64,
    /// The origin restarted: everything its old incarnation booked was freed.
    pub new_incarnations: u64,
    /// Bookings on workers this replica does not know (never applied).
    pub unknown_worker: u64,
    /// A `Reserved` for an id already live.
    pub duplicate_ids: u64,
    /// A change to a booking that is not live.
    pub unknown_ids: u64,
}

/// What a frame from the origin asks of this replica.
#[derive(Debug, Default, PartialEq)]
pub struct Received {
    /// To apply to this replica's shards, in order.
    pub apply: Vec<BookingEvent>,
    /// Ask the origin for a snapshot: events from this number on are missing.
    pub resync_from: Option<u64>,
}

/// Everything one origin booked, as far as its stream has told.
#[derive(Debug)]
pub struct Inbox {
    origin: ReplicaId,
    config: InboxConfig,
    incarnation: Option<Incarnation>,
    last_seq: u64,
    resyncing: bool,
    mirror: HashMap<ReservationId, Mirrored>,
    digest: LiveDigest,
    stats: InboxStats,
}

impl Inbox {
    pub fn new(origin: ReplicaId, config: InboxConfig) -> Self {
        Inbox {
            origin,
            config,
            incarnation: None,
            last_seq: 0,
            resyncing: false,
            mirror: HashMap::new(),
            digest: LiveDigest::default(),
            stats: InboxStats::default(),
        }
    }

    pub fn origin(&self) -> ReplicaId {
        self.origin
    }

    pub fn stats(&self) -> InboxStats {
        self.stats
    }

    /// The origin's live bookings as mirrored (applied or not).
    pub fn live(&self) -> usize {
        self.mirror.len()
    }

    /// The last event applied (0: none in this incarnation).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Waiting for a snapshot from this event number on: the transport
    /// asks again when the answer is overdue.
    pub fn awaiting_resync(&self) -> Option<u64> {
        self.resyncing.then_some(self.last_seq + 1)
    }

    /// Applies a batch's new events; `in_pool` says which workers this
    /// replica knows.
    pub fn receive(&mut self, batch: &Batch, now: Millis, in_pool: impl Fn(WorkerId) -> bool) -> Received {
        let mut out = Received::default();
        let Some(end) = batch.first_seq.checked_add(batch.events.len() as u64).filter(|_| batch.first_seq > 0) else {
            self.stats.invalid_frames += 1;
            return out;
        };
        if batch.origin != self.origin || !self.meet(batch.incarnation, &mut out.apply) {
            self.stats.stale_frames += 1;
            return out;
        }
        if self.resyncing {
            self.stats.dropped_while_resyncing += batch.events.len() as u64;
            return out;
        }
        if end <= self.last_seq + 1 {
            self.stats.duplicate_events += batch.events.len() as u64;
            return out;
        }
        if batch.first_seq > self.last_seq + 1 {
            out.resync_from = Some(self.start_resync());
            return out;
        }
        let skip = (self.last_seq + 1 - batch.first_seq) as usize;
        self.stats.duplicate_events += skip as u64;
        for event in &batch.events[skip..] {
            self.apply(event, now, &in_pool, &mut out.apply);
            self.last_seq += 1;
        }
        out
    }

    /// Replaces the mirror with the origin's snapshot; returns what to
    /// apply to this replica's shards to match it.
    pub fn resync(
        &mut self,
        snapshot: &Snapshot,
        now: Millis,
        in_pool: impl Fn(WorkerId) -> bool,
    ) -> Vec<BookingEvent> {
        let mut apply = Vec::new();
        if snapshot.origin != self.origin || !self.meet(snapshot.incarnation, &mut apply) {
            self.stats.stale_frames += 1;
            return apply;
        }
        if snapshot.last_seq < self.last_seq {
            // Older than what the stream already told.
            self.stats.stale_frames += 1;
            return apply;
        }
        let mut wanted: HashMap<ReservationId, &PeerBooking> = HashMap::with_capacity(snapshot.bookings.len());
        for booking in &snapshot.bookings {
            if wanted.insert(booking.id, booking).is_some() {
                self.stats.duplicate_ids += 1;
            }
        }
        let gone: Vec<ReservationId> = self
            .mirror
            .iter()
            .filter(|(id, held)| wanted.get(id).is_none_or(|b| b.worker != held.worker))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.free(id, &mut apply);
        }
        for booking in &snapshot.bookings {
            if wanted.get(&booking.id).is_some_and(|b| !std::ptr::eq(*b, booking)) {
                continue; // a repeated id: the last one stands
            }
            match self.mirror.get(&booking.id).copied() {
                None => self.reserve(booking, now, &in_pool, &mut apply),
                Some(held) if !held.applied && in_pool(held.worker) => {
                    // Its worker joined this replica's pool since.
                    self.forget_one(booking.id);
                    self.reserve(booking, now, &in_pool, &mut apply);
                }
                Some(_) => {
                    if booking.prefill_done {
                        self.complete_prefill(booking.id, &mut apply);
                    }
                    self.renew(booking.id, booking.lease_left_ms, now, &mut apply);
                }
            }
        }
        self.last_seq = snapshot.last_seq;
        self.resyncing = false;
        self.stats.resyncs += 1;
        apply
    }

    /// Compares the origin's digest with the mirror; on a mismatch (or
    /// when the digest shows events this replica never got) returns the
    /// number to resync from.
    pub fn check(&mut self, digest: &Digest) -> Option<u64> {
        if digest.origin != self.origin || self.resyncing || Some(digest.incarnation) != self.incarnation {
            return None;
        }
        if digest.last_seq > self.last_seq {
            // The stream's tail was lost and nothing came after it.
            return Some(self.start_resync());
        }
        if digest.last_seq < self.last_seq || digest.live == self.digest {
            return None;
        }
        self.stats.digest_mismatches += 1;
        Some(self.start_resync())
    }

    /// The origin is gone (past the grace period): frees all it booked.
    pub fn forget(&mut self) -> Vec<BookingEvent> {
        let mut apply = Vec::new();
        self.clear(&mut apply);
        apply
    }

    /// Accepts a frame of `incarnation`: true if current, after clearing
    /// an older one; false if the frame is older than the current one.
    fn meet(&mut self, incarnation: Incarnation, apply: &mut Vec<BookingEvent>) -> bool {
        match self.incarnation {
            Some(current) if incarnation < current => false,
            Some(current) if incarnation == current => true,
            known => {
                if known.is_some() {
                    self.stats.new_incarnations += 1;
                }
                self.clear(apply);
                self.incarnation = Some(incarnation);
                true
            }
        }
    }

    fn clear(&mut self, apply: &mut Vec<BookingEvent>) {
        let mut ids: Vec<ReservationId> = self.mirror.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.free(id, apply);
        }
        self.last_seq = 0;
        self.resyncing = false;
    }

    fn start_resync(&mut self) -> u64 {
        self.stats.gaps += 1;
        self.resyncing = true;
        self.last_seq + 1
    }

    fn apply(
        &mut self,
        event: &PeerEvent,
        now: Millis,
        in_pool: &impl Fn(WorkerId) -> bool,
        apply: &mut Vec<BookingEvent>,
    ) {
        self.stats.events_applied += 1;
        match event {
            PeerEvent::Reserved(booking) if self.mirror.contains_key(&booking.id) => self.stats.duplicate_ids += 1,
            PeerEvent::Reserved(booking) => self.reserve(booking, now, in_pool, apply),
            PeerEvent::PrefillComplete(id) => self.complete_prefill(*id, apply),
            PeerEvent::Renewed { id, lease_left_ms } => self.renew(*id, *lease_left_ms, now, apply),
            PeerEvent::Freed(id) => self.free(*id, apply),
        }
    }

    fn reserve(
        &mut self,
        booking: &PeerBooking,
        now: Millis,
        in_pool: &impl Fn(WorkerId) -> bool,
        apply: &mut Vec<BookingEvent>,
    ) {
        let applied = in_pool(booking.worker);
        if applied {
            apply.push(BookingEvent::Reserved(Booking {
                id: booking.id,
                worker: booking.worker,
                seq_hashes: Arc::clone(&booking.seq_hashes),
                unhashed_blocks: booking.unhashed_blocks,
                prefill_tokens: booking.prefill_tokens,
                lease_until: self.lease_until(booking.lease_left_ms, now),
            }));
            if booking.prefill_done {
                apply.push(BookingEvent::PrefillComplete(booking.id));
            }
        } else {
            self.stats.unknown_worker += 1;
        }
        self.digest.add(booking.id, booking.worker, booking.prefill_done);
        self.mirror
            .insert(booking.id, Mirrored { worker: booking.worker, prefill_done: booking.prefill_done, applied });
    }

    fn complete_prefill(&mut self, id: ReservationId, apply: &mut Vec<BookingEvent>) {
        let Some(held) = self.mirror.get_mut(&id) else {
            self.stats.unknown_ids += 1;
            return;
        };
        if held.prefill_done {
            return;
        }
        self.digest.remove(id, held.worker, false);
        self.digest.add(id, held.worker, true);
        held.prefill_done = true;
        if held.applied {
            apply.push(BookingEvent::PrefillComplete(id));
        }
    }

    fn renew(&mut self, id: ReservationId, lease_left_ms: u64, now: Millis, apply: &mut Vec<BookingEvent>) {
        match self.mirror.get(&id) {
            None => self.stats.unknown_ids += 1,
            Some(held) if held.applied => {
                apply.push(BookingEvent::Renewed { id, lease_until: self.lease_until(lease_left_ms, now) })
            }
            Some(_) => {}
        }
    }

    fn free(&mut self, id: ReservationId, apply: &mut Vec<BookingEvent>) {
        match self.forget_one(id) {
            None => self.stats.unknown_ids += 1,
            Some(held) if held.applied => apply.push(BookingEvent::Freed(id)),
            Some(_) => {}
        }
    }

    fn forget_one(&mut self, id: ReservationId) -> Option<Mirrored> {
        let held = self.mirror.remove(&id)?;
        self.digest.remove(id, held.worker, held.prefill_done);
        Some(held)
    }

    fn lease_until(&self, lease_left_ms: u64, now: Millis) -> Millis {
        let most = self.config.max_lease.as_millis() as u64;
        Millis(now.0.saturating_add(lease_left_ms.min(most)))
    }
}
