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

#[derive(Clone, Debug)]
struct Mirrored {
    /// As the origin last described it (`prefill_done` kept current).
    booking: PeerBooking,
    /// Held by this replica's shards. A booking on a worker this replica
    /// does not know is mirrored (the origin's digest counts it) but not
    /// applied: a peer cannot put load on a stranger. Nor is one the shards
    /// let go of (its lease ran out here, its worker was deleted, the
    /// service refused it) until the origin renews it or the worker is
    /// known again (`retry_unapplied`).
    applied: bool,
    /// Where its lease ends on this replica's clock.
    lease_until: Millis,
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

    /// The origin's run this mirror follows (`None` before its first frame).
    pub fn incarnation(&self) -> Option<Incarnation> {
        self.incarnation
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
        if snapshot.last_seq == u64::MAX {
            // Nothing could follow it.
            self.stats.invalid_frames += 1;
            return apply;
        }
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
        // Gone, or changed in a way no event could have changed it (another
        // worker, prefill undone): freed, and booked again below.
        let gone: Vec<ReservationId> = self
            .mirror
            .iter()
            .filter(|(id, held)| {
                wanted
                    .get(id)
                    .is_none_or(|b| b.worker != held.booking.worker || (held.booking.prefill_done && !b.prefill_done))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.free(id, &mut apply);
        }
        for booking in &snapshot.bookings {
            if wanted.get(&booking.id).is_some_and(|b| !std::ptr::eq(*b, booking)) {
                continue; // a repeated id: the last one stands
            }
            if !self.mirror.contains_key(&booking.id) {
                self.reserve(booking, now, &in_pool, &mut apply);
                continue;
            }
            if booking.prefill_done {
                self.complete_prefill(booking.id, &mut apply);
            }
            self.renew(booking.id, booking.lease_left_ms, now, &in_pool, &mut apply);
        }
        self.last_seq = snapshot.last_seq;
        self.resyncing = false;
        self.stats.resyncs += 1;
        apply
    }

    /// Compares the origin's digest with the mirror. A mismatch, a digest
    /// showing events this replica never got, or one of a newer
    /// incarnation (the origin restarted and its first events were lost)
    /// asks for a snapshot.
    pub fn check(&mut self, digest: &Digest) -> Received {
        let mut out = Received::default();
        if digest.origin != self.origin || !self.meet(digest.incarnation, &mut out.apply) {
            return out;
        }
        if self.resyncing || digest.last_seq < self.last_seq {
            return out;
        }
        if digest.last_seq > self.last_seq {
            // The stream's tail was lost and nothing came after it.
            out.resync_from = Some(self.start_resync());
        } else if digest.live != self.digest {
            self.stats.digest_mismatches += 1;
            out.resync_from = Some(self.start_resync());
        }
        out
    }

    /// This replica's shards no longer hold `id` (its lease ran out here,
    /// its worker was deleted, or the service refused it): it is applied
    /// again when the origin renews it or `retry_unapplied` finds it
    /// applicable. False if `id` is not this origin's.
    pub fn not_applied(&mut self, id: ReservationId) -> bool {
        match self.mirror.get_mut(&id) {
            Some(held) => {
                held.applied = false;
                true
            }
            None => false,
        }
    }

    /// Applies the mirrored bookings not held here whose worker `in_pool`
    /// now knows (call it when workers join).
    pub fn retry_unapplied(&mut self, now: Millis, in_pool: impl Fn(WorkerId) -> bool) -> Vec<BookingEvent> {
        let mut apply = Vec::new();
        let mut waiting: Vec<ReservationId> = self
            .mirror
            .iter()
            .filter(|(_, held)| !held.applied && held.lease_until > now && in_pool(held.booking.worker))
            .map(|(id, _)| *id)
            .collect();
        waiting.sort_unstable();
        for id in waiting {
            self.apply_held(id, &mut apply);
        }
        apply
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
            PeerEvent::Renewed { id, lease_left_ms } => self.renew(*id, *lease_left_ms, now, in_pool, apply),
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
        self.digest.add(booking.id, booking.worker, booking.prefill_done);
        let lease_until = self.lease_until(booking.lease_left_ms, now);
        self.mirror.insert(booking.id, Mirrored { booking: booking.clone(), applied: false, lease_until });
        if in_pool(booking.worker) {
            self.apply_held(booking.id, apply);
        } else {
            self.stats.unknown_worker += 1;
        }
    }

    /// Books a mirrored booking on this replica's shards.
    fn apply_held(&mut self, id: ReservationId, apply: &mut Vec<BookingEvent>) {
        let Some(held) = self.mirror.get_mut(&id) else { return };
        let lease_until = held.lease_until;
        let booking = &held.booking;
        apply.push(BookingEvent::Reserved(Booking {
            id,
            worker: booking.worker,
            seq_hashes: Arc::clone(&booking.seq_hashes),
            unhashed_blocks: booking.unhashed_blocks,
            prefill_tokens: booking.prefill_tokens,
            lease_until,
        }));
        if booking.prefill_done {
            apply.push(BookingEvent::PrefillComplete(id));
        }
        held.applied = true;
    }

    fn complete_prefill(&mut self, id: ReservationId, apply: &mut Vec<BookingEvent>) {
        let Some(held) = self.mirror.get_mut(&id) else {
            self.stats.unknown_ids += 1;
            return;
        };
        if held.booking.prefill_done {
            return;
        }
        self.digest.complete_prefill(id, held.booking.worker);
        held.booking.prefill_done = true;
        if held.applied {
            apply.push(BookingEvent::PrefillComplete(id));
        }
    }

    /// A new lease for `id`: extended where it is held, booked again where
    /// it was let go of and its worker is known.
    fn renew(
        &mut self,
        id: ReservationId,
        lease_left_ms: u64,
        now: Millis,
        in_pool: &impl Fn(WorkerId) -> bool,
        apply: &mut Vec<BookingEvent>,
    ) {
        let lease_until = self.lease_until(lease_left_ms, now);
        let Some(held) = self.mirror.get_mut(&id) else {
            self.stats.unknown_ids += 1;
            return;
        };
        held.lease_until = held.lease_until.max(lease_until);
        if held.applied {
            apply.push(BookingEvent::Renewed { id, lease_until });
        } else if in_pool(held.booking.worker) {
            self.apply_held(id, apply);
        }
    }

    fn free(&mut self, id: ReservationId, apply: &mut Vec<BookingEvent>) {
        let Some(held) = self.mirror.remove(&id) else {
            self.stats.unknown_ids += 1;
            return;
        };
        self.digest.remove(id, held.booking.worker, held.booking.prefill_done);
        if held.applied {
            apply.push(BookingEvent::Freed(id));
        }
    }

    fn lease_until(&self, lease_left_ms: u64, now: Millis) -> Millis {
        let most = self.config.max_lease.as_millis() as u64;
        Millis(now.0.saturating_add(lease_left_ms.min(most)))
    }
}
