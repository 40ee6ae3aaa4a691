//! A booking's lifetime on the ext_proc stream that made it: unique ids,
//! and a guard that frees the booking exactly once, whenever and however
//! the stream ends.
//!
//! The guard frees on drop, so every way a stream can end (the response
//! finished, the gateway cancelled, the connection broke, the task was
//! dropped mid-selection while queued) releases the load it booked. Frees
//! and `prefill_complete` are posted to the owning shard without waiting
//! for it, so they run right there, on whatever thread drops the guard.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kvpick_core::{ReservationId, Selection, WorkerId};
use kvpick_ext_proc::Booking;

/// Who frees a booking and marks its prefill complete: the picker that made
/// it (`KvPicker`). A trait so this module needs nothing of the picker's;
/// generic, not `dyn`, so the calls stay static.
pub trait Release: Send + Sync + 'static {
    /// `ttft`: what the first token's arrival measured, when it did.
    fn prefill_complete(&self, id: ReservationId, ttft: Option<TtftSample>);
    fn free(&self, id: ReservationId);
    /// The request is still answering: its lease starts over.
    fn renew(&self, id: ReservationId);
    /// Another endpoint served the request: the booking moves there.
    fn moved(&self, id: ReservationId, to: std::net::SocketAddr);
    /// The request's prompt is prefill load on its worker again (see
    /// `Reservation::prefill_here`).
    fn prefill_restored(&self, id: ReservationId);
    /// `output_tokens` after the first took `decode` on `worker`.
    fn decode_observed(&self, worker: WorkerId, output_tokens: u64, decode: Duration);
}

/// A time to first token measured at the router, from the pick to the
/// first streamed chunk, and what the priors predicted for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TtftSample {
    pub worker: WorkerId,
    pub predicted_ns: f64,
    pub measured: Duration,
}

/// What a successful pick booked, for timing its response.
#[derive(Clone, Copy, Debug)]
struct Booked {
    worker: WorkerId,
    predicted_ns: Option<f64>,
    at: Instant,
    first_token: Option<Instant>,
}

/// Reservation ids unique across replicas: 32 random bits chosen once per
/// process (from the OS-seeded keys of std's `RandomState`) above a 32-bit
/// counter. Two replicas collide only if they draw the same prefix (one in
/// four billion), and a counter wraps only after four billion requests,
/// long after any lease has expired.
#[derive(Debug)]
pub struct ReservationIds {
    prefix: u64,
    next: AtomicU32,
}

impl Default for ReservationIds {
    fn default() -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let random = std::collections::hash_map::RandomState::new().hash_one((std::process::id(), now));
        ReservationIds { prefix: random << 32, next: AtomicU32::new(0) }
    }
}

impl ReservationIds {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn next_id(&self) -> ReservationId {
        ReservationId(self.prefix | u64::from(self.next.fetch_add(1, Ordering::Relaxed)))
    }
}

/// A booking made for one request; freed exactly once, on drop.
pub struct Reservation<R: Release> {
    id: ReservationId,
    picker: R,
    /// Nothing to free: the selection failed, so nothing was booked.
    disarmed: bool,
    prefill_completed: bool,
    booked: Option<Booked>,
    /// Renewals come at most this often (a quarter of the lease: three
    /// may be lost before the booking is).
    renew_every: Duration,
    last_renewed: Option<Instant>,
}

impl<R: Release> std::fmt::Debug for Reservation<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation").field("id", &self.id).field("disarmed", &self.disarmed).finish()
    }
}

impl<R: Release> Reservation<R> {
    /// Armed before the selection starts, so a selection dropped while
    /// queued is withdrawn too.
    pub(crate) fn new(id: ReservationId, picker: R, lease: Duration) -> Self {
        Reservation {
            id,
            picker,
            disarmed: false,
            prefill_completed: false,
            booked: None,
            renew_every: lease / 4,
            last_renewed: None,
        }
    }

    pub fn id(&self) -> ReservationId {
        self.id
    }

    /// The selection succeeded: its response is timed from now.
    pub(crate) fn booked(&mut self, selection: &Selection) {
        self.booked = Some(Booked {
            worker: selection.worker,
            predicted_ns: selection.predicted_ttft_ns,
            at: Instant::now(),
            first_token: None,
        });
        self.last_renewed = Some(Instant::now());
    }

    /// The selection failed: there is nothing to free.
    pub(crate) fn disarm(mut self) {
        self.disarmed = true;
    }

    /// A disaggregated plan's decode leg: its worker computes none of the
    /// prompt, so its prefill load goes now (posted; no time-to-first-token
    /// sample: the first token's time is the prefill worker's).
    pub(crate) fn prefill_elsewhere(&mut self) {
        if !std::mem::replace(&mut self.prefill_completed, true) {
            self.picker.prefill_complete(self.id, None);
        }
    }

    /// A plan's decode leg whose prefill was to run elsewhere computes the
    /// prompt after all (the decode sidecar ran the request whole): it is
    /// prefill load here again until the first token. That token's time
    /// is no sample of the prediction: it includes the prefill leg that
    /// did not run. Should the first token's `prefill_complete` reach the
    /// shard before the restore does (a whole prefill quicker than a shard
    /// round trip), the prompt counts as prefill until the booking is
    /// freed: an overcount bounded by this request's life.
    pub(crate) fn prefill_here(&mut self) {
        if std::mem::replace(&mut self.prefill_completed, false) {
            self.picker.prefill_restored(self.id);
        }
        if let Some(booked) = self.booked.as_mut() {
            booked.predicted_ns = None;
        }
    }

    /// The first token of a request whose prefill ran elsewhere: what
    /// follows it times the decode.
    pub(crate) fn first_token(&mut self, streamed: bool) {
        if let Some(booked) = self.booked.as_mut().filter(|_| streamed) {
            booked.first_token.get_or_insert_with(Instant::now);
        }
    }
}

impl<R: Release> Booking for Reservation<R> {
    /// The engine started answering: its prompt is no longer prefill
    /// load. Posted, so it never delays the echo of the first token; only
    /// the first call does anything. The free that follows comes after it
    /// in the same ring when the same thread sends both; if another thread
    /// sends the free and it overtakes, the end state is the same.
    fn prefill_complete(&mut self, streamed: bool) {
        if std::mem::replace(&mut self.prefill_completed, true) {
            return;
        }
        let mut sample = None;
        if let Some(booked) = self.booked.as_mut().filter(|_| streamed) {
            let now = Instant::now();
            booked.first_token = Some(now);
            sample = booked.predicted_ns.map(|predicted_ns| TtftSample {
                worker: booked.worker,
                predicted_ns,
                measured: now.duration_since(booked.at),
            });
        }
        self.picker.prefill_complete(self.id, sample);
    }

    fn response_progress(&mut self) {
        self.renew_if_due(Instant::now());
    }

    fn served_by(&mut self, endpoint: std::net::SocketAddr) {
        if let Some(booked) = self.booked.as_mut().filter(|_| !self.disarmed) {
            // Its response times are the served worker's, not predicted.
            booked.predicted_ns = None;
            self.picker.moved(self.id, endpoint);
        }
    }

    fn response_finished(&mut self, output_tokens: u64) {
        let Some(booked) = &self.booked else { return };
        if let (Some(first), Some(after_first)) = (booked.first_token, output_tokens.checked_sub(1)) {
            if after_first > 0 {
                self.picker.decode_observed(booked.worker, after_first, first.elapsed());
            }
        }
    }
}

impl<R: Release> Reservation<R> {
    /// Renews when a quarter of the lease has passed since the booking or
    /// the last renewal.
    fn renew_if_due(&mut self, now: Instant) {
        let Some(last) = self.last_renewed else { return };
        if now.duration_since(last) >= self.renew_every {
            self.last_renewed = Some(now);
            self.picker.renew(self.id);
        }
    }
}

impl<R: Release> Drop for Reservation<R> {
    fn drop(&mut self) {
        if !self.disarmed {
            self.picker.free(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_share_a_prefix() {
        let ids = ReservationIds::new();
        let (a, b) = (ids.next_id(), ids.next_id());
        assert_ne!(a, b);
        assert_eq!(a.0 >> 32, b.0 >> 32);
        assert_eq!(b.0 - a.0, 1);
    }

    /// Counts renewals and frees.
    #[derive(Clone, Default)]
    struct Counting(std::sync::Arc<std::sync::Mutex<(u32, u32)>>);

    impl Release for Counting {
        fn prefill_complete(&self, _: ReservationId, _: Option<TtftSample>) {}
        fn free(&self, _: ReservationId) {
            self.0.lock().unwrap().1 += 1;
        }
        fn renew(&self, _: ReservationId) {
            self.0.lock().unwrap().0 += 1;
        }
        fn moved(&self, _: ReservationId, _: std::net::SocketAddr) {}
        fn prefill_restored(&self, _: ReservationId) {}
        fn decode_observed(&self, _: WorkerId, _: u64, _: Duration) {}
    }

    #[test]
    fn renewals_come_once_a_quarter_lease_and_only_for_a_booking() {
        let counts = Counting::default();
        let selection = Selection {
            id: ReservationId(1),
            worker: WorkerId(0),
            endpoint: "10.0.0.1:8000".parse().unwrap(),
            overlap_blocks: 0,
            prefill_tokens: 0,
            isl_tokens: 0,
            cost: 0.0,
            predicted_ttft_ns: None,
            candidates: 1,
            fallbacks: Vec::new(),
            past_tpot_target: false,
        };
        let mut unbooked = Reservation::new(ReservationId(2), counts.clone(), Duration::from_secs(4));
        unbooked.renew_if_due(Instant::now() + Duration::from_secs(60));
        unbooked.disarm();
        assert_eq!(*counts.0.lock().unwrap(), (0, 0), "nothing booked, nothing renewed or freed");

        let mut r = Reservation::new(ReservationId(1), counts.clone(), Duration::from_secs(4));
        r.booked(&selection);
        let start = r.last_renewed.unwrap();
        r.renew_if_due(start + Duration::from_millis(999));
        assert_eq!(counts.0.lock().unwrap().0, 0);
        r.renew_if_due(start + Duration::from_secs(1));
        r.renew_if_due(start + Duration::from_millis(1_500));
        assert_eq!(counts.0.lock().unwrap().0, 1, "once per second at most");
        r.renew_if_due(start + Duration::from_secs(2));
        drop(r);
        assert_eq!(*counts.0.lock().unwrap(), (2, 1));
    }
}
