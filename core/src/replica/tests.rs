use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::booking::{Booking, BookingEvent, ReservationId};
use crate::clock::Millis;
use crate::hashing::SequenceHash;
use crate::worker::WorkerId;

use super::*;

const A: ReplicaId = ReplicaId(1);
const FIRST: Incarnation = Incarnation(100);
const NOW: Millis = Millis(50_000);

fn booking(id: u64, worker: u64, lease_until: Millis) -> Booking {
    Booking {
        id: ReservationId(id),
        worker: WorkerId(worker),
        seq_hashes: Arc::from(vec![SequenceHash(id * 10), SequenceHash(id * 10 + 1)]),
        unhashed_blocks: 1,
        prefill_tokens: 40,
        lease_until,
    }
}

fn reserved(id: u64, worker: u64) -> BookingEvent {
    BookingEvent::Reserved(booking(id, worker, NOW.after(Duration::from_secs(300))))
}

fn everyone(_: WorkerId) -> bool {
    true
}

fn inbox() -> Inbox {
    Inbox::new(A, InboxConfig::default())
}

/// The shards of the replica the inbox feeds, checked to apply each
/// change exactly once.
#[derive(Default, Debug)]
struct Shards(ExactlyOnce);

impl Shards {
    fn apply(&mut self, events: &[BookingEvent]) {
        if let Err(defect) = self.0.apply(events) {
            panic!("{defect}");
        }
    }

    fn is_empty(&self) -> bool {
        self.0.live.is_empty()
    }

    fn matches(&self, outbox: &Outbox) -> bool {
        let theirs: HashMap<ReservationId, (WorkerId, bool)> =
            outbox.snapshot(NOW).bookings.iter().map(|b| (b.id, (b.worker, b.prefill_done))).collect();
        theirs == self.0.live
    }
}

#[test]
fn an_ordered_stream_is_applied_once_and_frees_everything() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    for event in [reserved(1, 7), reserved(2, 8), BookingEvent::PrefillComplete(ReservationId(1))] {
        assert!(outbox.record(&event, NOW));
    }
    let batch = outbox.take_batch().expect("three events");
    assert_eq!((batch.first_seq, batch.events.len()), (1, 3));
    let received = inbox.receive(&batch, NOW, everyone);
    assert_eq!(received.resync_from, None);
    shards.apply(&received.apply);
    assert!(shards.matches(&outbox));
    assert_eq!(inbox.check(&outbox.digest()).resync_from, None);

    // The same batch again changes nothing.
    assert_eq!(inbox.receive(&batch, NOW, everyone), Received::default());
    assert_eq!(inbox.stats().duplicate_events, 3);

    for id in [1, 2] {
        assert!(outbox.record(&BookingEvent::Freed(ReservationId(id)), NOW));
    }
    shards.apply(&inbox.receive(&outbox.take_batch().expect("two frees"), NOW, everyone).apply);
    assert!(shards.is_empty());
    assert_eq!((inbox.live(), inbox.last_seq()), (0, 5));
    assert_eq!(inbox.check(&outbox.digest()).resync_from, None);
}

#[test]
fn repeats_and_changes_to_unknown_bookings_are_not_published() {
    let mut outbox = Outbox::new(A, FIRST);
    assert!(outbox.record(&reserved(1, 7), NOW));
    assert!(!outbox.record(&reserved(1, 7), NOW));
    assert!(!outbox.record(&BookingEvent::Freed(ReservationId(9)), NOW));
    assert!(outbox.record(&BookingEvent::PrefillComplete(ReservationId(1)), NOW));
    assert!(!outbox.record(&BookingEvent::PrefillComplete(ReservationId(1)), NOW));
    // A renewal that does not extend the lease is not news.
    assert!(!outbox.record(&BookingEvent::Renewed { id: ReservationId(1), lease_until: NOW }, NOW));
    let later = NOW.after(Duration::from_secs(900));
    assert!(outbox.record(&BookingEvent::Renewed { id: ReservationId(1), lease_until: later }, NOW));
    let batch = outbox.take_batch().expect("three events");
    assert_eq!(batch.events.len(), 3);
    assert_eq!(batch.events[2], PeerEvent::Renewed { id: ReservationId(1), lease_left_ms: 900_000 });
    assert_eq!(outbox.take_batch(), None);
}

#[test]
fn an_overlapping_batch_applies_only_its_new_events() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    outbox.record(&reserved(1, 7), NOW);
    let first = outbox.take_batch().expect("one event");
    outbox.record(&reserved(2, 7), NOW);
    let second = outbox.take_batch().expect("one event");
    inbox.receive(&first, NOW, everyone);
    // A retransmission joining both: event 1 is skipped, event 2 applied.
    let joined = Batch { events: [first.events, second.events].concat(), ..first };
    let received = inbox.receive(&joined, NOW, everyone);
    assert_eq!(received.apply, vec![reserved(2, 7)]);
    assert_eq!(inbox.stats().duplicate_events, 1);
}

#[test]
fn a_gap_asks_for_a_snapshot_and_the_snapshot_applies_the_difference() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    outbox.record(&reserved(1, 7), NOW);
    outbox.record(&reserved(2, 7), NOW);
    shards.apply(&inbox.receive(&outbox.take_batch().expect("two"), NOW, everyone).apply);

    // Lost: 2 freed, 3 booked and its prefill done.
    outbox.record(&BookingEvent::Freed(ReservationId(2)), NOW);
    outbox.record(&reserved(3, 8), NOW);
    outbox.record(&BookingEvent::PrefillComplete(ReservationId(3)), NOW);
    outbox.take_batch();
    outbox.record(&reserved(4, 8), NOW);
    let after_gap = outbox.take_batch().expect("one");
    let received = inbox.receive(&after_gap, NOW, everyone);
    assert_eq!(received, Received { apply: vec![], resync_from: Some(3) });
    assert_eq!(inbox.awaiting_resync(), Some(3));
    // Until the snapshot comes, the stream is dropped.
    assert_eq!(inbox.receive(&after_gap, NOW, everyone), Received::default());
    assert_eq!(inbox.stats().dropped_while_resyncing, 1);

    let apply = inbox.resync(&outbox.snapshot(NOW), NOW, everyone);
    shards.apply(&apply);
    assert!(shards.matches(&outbox), "{shards:?}");
    assert!(apply.contains(&BookingEvent::Freed(ReservationId(2))));
    assert!(apply.contains(&BookingEvent::PrefillComplete(ReservationId(3))));
    assert_eq!((inbox.awaiting_resync(), inbox.last_seq()), (None, 6));
    // The batch that crossed the snapshot is a duplicate now.
    assert_eq!(inbox.receive(&after_gap, NOW, everyone), Received::default());
    outbox.record(&BookingEvent::Freed(ReservationId(1)), NOW);
    shards.apply(&inbox.receive(&outbox.take_batch().expect("one"), NOW, everyone).apply);
    assert!(shards.matches(&outbox));
    assert_eq!(inbox.stats().gaps, 1);
    assert_eq!(inbox.stats().resyncs, 1);
}

#[test]
fn a_new_incarnation_frees_what_the_old_one_booked_and_old_frames_are_stale() {
    let mut old = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    old.record(&reserved(1, 7), NOW);
    old.record(&reserved(2, 7), NOW);
    let old_batch = old.take_batch().expect("two");
    shards.apply(&inbox.receive(&old_batch, NOW, everyone).apply);

    let mut new = Outbox::new(A, Incarnation(FIRST.0 + 1));
    new.record(&reserved(5, 7), NOW);
    let received = inbox.receive(&new.take_batch().expect("one"), NOW, everyone);
    shards.apply(&received.apply);
    assert!(shards.matches(&new));
    assert_eq!(inbox.stats().new_incarnations, 1);

    assert_eq!(inbox.receive(&old_batch, NOW, everyone), Received::default());
    assert!(inbox.resync(&old.snapshot(NOW), NOW, everyone).is_empty());
    assert_eq!(inbox.check(&old.digest()).resync_from, None);
    assert_eq!(inbox.stats().stale_frames, 2);
    assert!(shards.matches(&new));
}

#[test]
fn a_restarted_origin_met_first_by_a_later_event_resyncs() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    outbox.record(&reserved(1, 7), NOW);
    outbox.take_batch();
    outbox.record(&reserved(2, 7), NOW);
    // This replica started after the origin's first batch.
    let received = inbox.receive(&outbox.take_batch().expect("one"), NOW, everyone);
    assert_eq!(received.resync_from, Some(1));
    let mut shards = Shards::default();
    shards.apply(&inbox.resync(&outbox.snapshot(NOW), NOW, everyone));
    assert!(shards.matches(&outbox));
}

#[test]
fn digests_catch_a_lost_tail_and_a_diverged_mirror() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    outbox.record(&reserved(1, 7), NOW);
    shards.apply(&inbox.receive(&outbox.take_batch().expect("one"), NOW, everyone).apply);
    outbox.record(&reserved(2, 7), NOW);
    outbox.take_batch(); // lost, and nothing follows it
    assert_eq!(inbox.check(&outbox.digest()).resync_from, Some(2));
    shards.apply(&inbox.resync(&outbox.snapshot(NOW), NOW, everyone));
    assert!(shards.matches(&outbox));
    assert_eq!(inbox.check(&outbox.digest()).resync_from, None);

    // A frame that numbering cannot catch: event 3 with other content.
    let forged = Batch {
        sent_unix_micros: 0,
        origin: A,
        incarnation: FIRST,
        first_seq: 3,
        events: vec![PeerEvent::Freed(ReservationId(1))],
    };
    shards.apply(&inbox.receive(&forged, NOW, everyone).apply);
    outbox.record(&BookingEvent::PrefillComplete(ReservationId(2)), NOW);
    outbox.take_batch();
    assert_eq!(inbox.check(&outbox.digest()).resync_from, Some(4));
    assert_eq!(inbox.stats().digest_mismatches, 1);
    shards.apply(&inbox.resync(&outbox.snapshot(NOW), NOW, everyone));
    assert!(shards.matches(&outbox));
}

#[test]
fn a_peer_cannot_book_workers_this_replica_does_not_know() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    let known = |worker: WorkerId| worker == WorkerId(7);
    outbox.record(&reserved(1, 7), NOW);
    outbox.record(&reserved(2, 666), NOW);
    outbox.record(&BookingEvent::PrefillComplete(ReservationId(2)), NOW);
    let received = inbox.receive(&outbox.take_batch().expect("three"), NOW, known);
    assert_eq!(received.apply, vec![reserved(1, 7)]);
    shards.apply(&received.apply);
    assert_eq!(inbox.stats().unknown_worker, 1);
    // Still mirrored, so the digests agree.
    assert_eq!(inbox.check(&outbox.digest()).resync_from, None);

    // The worker joins this replica's pool; a resync applies the booking.
    let apply = inbox.resync(&outbox.snapshot(NOW), NOW, everyone);
    assert!(
        matches!(&apply[..], [BookingEvent::Renewed { .. }, BookingEvent::Reserved(b), BookingEvent::PrefillComplete(_)] | [BookingEvent::Reserved(b), BookingEvent::PrefillComplete(_), BookingEvent::Renewed { .. }] if b.id == ReservationId(2)),
        "{apply:?}"
    );
    shards.apply(&apply);
    assert!(shards.matches(&outbox));
}

#[test]
fn a_freed_stranger_booking_frees_nothing_here() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    outbox.record(&reserved(2, 666), NOW);
    outbox.record(&BookingEvent::Freed(ReservationId(2)), NOW);
    let received = inbox.receive(&outbox.take_batch().expect("two"), NOW, |_| false);
    assert!(received.apply.is_empty());
    assert_eq!(inbox.live(), 0);
    assert_eq!(inbox.check(&outbox.digest()).resync_from, None);
}

#[test]
fn leases_travel_as_time_left_and_are_capped() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = Inbox::new(A, InboxConfig { max_lease: Duration::from_secs(60) });
    outbox.record(&BookingEvent::Reserved(booking(1, 7, NOW.after(Duration::from_secs(30)))), NOW);
    outbox.record(&BookingEvent::Reserved(booking(2, 7, NOW.after(Duration::from_secs(3600)))), NOW);
    // This replica's clock has another origin.
    let here = Millis(9_000_000);
    let received = inbox.receive(&outbox.take_batch().expect("two"), here, everyone);
    let leases: Vec<Millis> = received
        .apply
        .iter()
        .map(|event| match event {
            BookingEvent::Reserved(b) => b.lease_until,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(leases, vec![here.after(Duration::from_secs(30)), here.after(Duration::from_secs(60))]);
}

#[test]
fn a_gone_origin_is_forgotten_and_its_return_resyncs() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    outbox.record(&reserved(1, 7), NOW);
    outbox.record(&reserved(2, 8), NOW);
    shards.apply(&inbox.receive(&outbox.take_batch().expect("two"), NOW, everyone).apply);
    shards.apply(&inbox.forget());
    assert!(shards.is_empty());
    // The partition heals: the same incarnation goes on, and resyncs.
    outbox.record(&BookingEvent::Freed(ReservationId(1)), NOW);
    let received = inbox.receive(&outbox.take_batch().expect("one"), NOW, everyone);
    assert_eq!(received.resync_from, Some(1));
    shards.apply(&inbox.resync(&outbox.snapshot(NOW), NOW, everyone));
    assert!(shards.matches(&outbox));
}

#[test]
fn frames_no_origin_could_send_are_refused() {
    let mut inbox = inbox();
    let zero = Batch {
        sent_unix_micros: 0,
        origin: A,
        incarnation: FIRST,
        first_seq: 0,
        events: vec![PeerEvent::Freed(ReservationId(1))],
    };
    let overflow = Batch {
        sent_unix_micros: 0,
        origin: A,
        incarnation: FIRST,
        first_seq: u64::MAX,
        events: vec![PeerEvent::Freed(ReservationId(1)); 2],
    };
    let elsewhere =
        Batch { sent_unix_micros: 0, origin: ReplicaId(2), incarnation: FIRST, first_seq: 1, events: vec![] };
    for batch in [zero, overflow, elsewhere] {
        assert_eq!(inbox.receive(&batch, NOW, everyone), Received::default());
    }
    assert_eq!((inbox.stats().invalid_frames, inbox.stats().stale_frames), (2, 1));
}

/// A lossy, repeating, reordering link between one origin and one peer,
/// with snapshots and digests sent in-stream as the transport will: the
/// peer's shards must end with exactly the origin's live bookings, having
/// applied every change once.
#[test]
fn a_lossy_link_converges_and_applies_every_change_once() {
    let mut seen = InboxStats::default();
    for seed in 0..200 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut incarnation = FIRST;
        let mut outbox = Outbox::new(A, incarnation);
        let mut inbox = inbox();
        let mut shards = Shards::default();
        let mut next_id = 1;
        let mut in_flight: Vec<Batch> = Vec::new();
        let mut wants_snapshot = false;
        for _ in 0..300 {
            let now = Millis(NOW.0 + rng.u64(0..1000));
            let live: Vec<ReservationId> = outbox.snapshot(now).bookings.iter().map(|b| b.id).collect();
            let event = match rng.u8(0..10) {
                0..=3 => {
                    next_id += 1;
                    reserved(next_id, rng.u64(1..5))
                }
                4..=5 if !live.is_empty() => BookingEvent::PrefillComplete(live[rng.usize(..live.len())]),
                6 if !live.is_empty() => BookingEvent::Renewed {
                    id: live[rng.usize(..live.len())],
                    lease_until: now.after(Duration::from_secs(rng.u64(1..900))),
                },
                7..=8 if !live.is_empty() => BookingEvent::Freed(live[rng.usize(..live.len())]),
                9 if rng.u8(0..20) == 0 => {
                    // The origin restarts: its bookings are gone with it.
                    incarnation = Incarnation(incarnation.0 + 1);
                    outbox = Outbox::new(A, incarnation);
                    continue;
                }
                _ => reserved(next_id, 1), // a repeat or an unknown booking
            };
            outbox.record(&event, now);
            if rng.bool() {
                in_flight.extend(outbox.take_batch());
            }
            // Deliver some of what is in flight: lose, repeat or swap.
            while !in_flight.is_empty() && rng.u8(0..3) > 0 {
                if in_flight.len() > 1 && rng.u8(0..8) == 0 {
                    in_flight.swap(0, 1);
                }
                let batch = in_flight.remove(0);
                match rng.u8(0..10) {
                    0 => continue,
                    1 => in_flight.insert(0, batch.clone()),
                    _ => {}
                }
                let received = inbox.receive(&batch, now, everyone);
                shards.apply(&received.apply);
                wants_snapshot |= received.resync_from.is_some();
            }
            if wants_snapshot && rng.u8(0..4) == 0 {
                // The origin answers in-stream: what is in flight was sent first.
                for batch in in_flight.drain(..) {
                    shards.apply(&inbox.receive(&batch, now, everyone).apply);
                }
                in_flight.extend(outbox.take_batch());
                shards.apply(&inbox.resync(&outbox.snapshot(now), now, everyone));
                wants_snapshot = false;
            }
            if rng.u8(0..10) == 0 {
                let received = inbox.check(&outbox.digest());
                shards.apply(&received.apply);
                wants_snapshot |= received.resync_from.is_some();
            }
        }
        if seed % 5 == 0 {
            // The origin restarts at the very end and its first batch is
            // lost: only the digest of its new incarnation can tell.
            incarnation = Incarnation(incarnation.0 + 1);
            outbox = Outbox::new(A, incarnation);
            next_id += 1;
            outbox.record(&reserved(next_id, 2), NOW);
            outbox.take_batch();
            in_flight.clear();
        }
        // Quiet: everything is delivered, then a digest settles the rest.
        in_flight.extend(outbox.take_batch());
        for batch in in_flight.drain(..) {
            let received = inbox.receive(&batch, NOW, everyone);
            shards.apply(&received.apply);
            wants_snapshot |= received.resync_from.is_some();
        }
        let received = inbox.check(&outbox.digest());
        shards.apply(&received.apply);
        if wants_snapshot || received.resync_from.is_some() {
            shards.apply(&inbox.resync(&outbox.snapshot(NOW), NOW, everyone));
        }
        assert_eq!(inbox.check(&outbox.digest()).resync_from, None, "seed {seed}");
        assert_eq!(inbox.awaiting_resync(), None, "seed {seed}");
        assert!(shards.matches(&outbox), "seed {seed}: {shards:?}");
        assert_eq!(inbox.live(), outbox.live(), "seed {seed}");
        let stats = inbox.stats();
        seen.gaps += stats.gaps;
        seen.resyncs += stats.resyncs;
        seen.duplicate_events += stats.duplicate_events;
        seen.stale_frames += stats.stale_frames;
        seen.new_incarnations += stats.new_incarnations;
        seen.dropped_while_resyncing += stats.dropped_while_resyncing;
        shards.apply(&inbox.forget());
        assert!(shards.is_empty(), "seed {seed}");
    }
    // The link did lose, repeat and restart (the test is not vacuous).
    assert!(seen.gaps > 100 && seen.resyncs > 100, "{seen:?}");
    assert!(seen.duplicate_events > 100 && seen.dropped_while_resyncing > 100, "{seen:?}");
    assert!(seen.stale_frames > 0 && seen.new_incarnations > 10, "{seen:?}");
}

#[test]
fn a_digest_of_a_new_incarnation_frees_the_old_one_and_resyncs() {
    let mut old = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    old.record(&reserved(1, 7), NOW);
    shards.apply(&inbox.receive(&old.take_batch().expect("one"), NOW, everyone).apply);
    let mut new = Outbox::new(A, Incarnation(FIRST.0 + 1));
    new.record(&reserved(2, 7), NOW);
    new.take_batch(); // lost
    let received = inbox.check(&new.digest());
    assert_eq!(received.apply, vec![BookingEvent::Freed(ReservationId(1))]);
    assert_eq!(received.resync_from, Some(1));
    shards.apply(&received.apply);
    shards.apply(&inbox.resync(&new.snapshot(NOW), NOW, everyone));
    assert!(shards.matches(&new));

    // First contact through a digest works the same way.
    let mut fresh = Inbox::new(A, InboxConfig::default());
    assert_eq!(fresh.check(&new.digest()).resync_from, Some(1));
}

#[test]
fn a_snapshot_that_undoes_a_prefill_books_again_and_converges() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    outbox.record(&reserved(1, 7), NOW);
    shards.apply(&inbox.receive(&outbox.take_batch().expect("one"), NOW, everyone).apply);
    // A forged event 2 says prefill is over; the origin never said so.
    let forged = Batch {
        sent_unix_micros: 0,
        origin: A,
        incarnation: FIRST,
        first_seq: 2,
        events: vec![PeerEvent::PrefillComplete(ReservationId(1))],
    };
    shards.apply(&inbox.receive(&forged, NOW, everyone).apply);
    outbox
        .record(&BookingEvent::Renewed { id: ReservationId(1), lease_until: NOW.after(Duration::from_secs(900)) }, NOW);
    outbox.take_batch();
    assert_eq!(inbox.check(&outbox.digest()).resync_from, Some(3));
    shards.apply(&inbox.resync(&outbox.snapshot(NOW), NOW, everyone));
    assert!(shards.matches(&outbox), "{shards:?}");
    assert_eq!(inbox.check(&outbox.digest()).resync_from, None, "one snapshot is enough");
}

#[test]
fn a_snapshot_nothing_could_follow_is_refused() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    outbox.record(&reserved(1, 7), NOW);
    let snapshot = Snapshot { last_seq: u64::MAX, ..outbox.snapshot(NOW) };
    assert!(inbox.resync(&snapshot, NOW, everyone).is_empty());
    assert_eq!((inbox.stats().invalid_frames, inbox.live(), inbox.last_seq()), (1, 0, 0));
}

#[test]
fn a_booking_let_go_of_here_is_booked_again_when_renewed_or_its_worker_joins() {
    let mut outbox = Outbox::new(A, FIRST);
    let mut inbox = inbox();
    let mut shards = Shards::default();
    let mut known = vec![WorkerId(7)];
    outbox.record(&reserved(1, 7), NOW);
    outbox.record(&reserved(2, 8), NOW);
    shards.apply(&inbox.receive(&outbox.take_batch().expect("two"), NOW, |w| known.contains(&w)).apply);
    assert_eq!(shards.0.live.keys().copied().collect::<Vec<_>>(), vec![ReservationId(1)]);

    // Worker 8 joins: booking 2 is applied with the lease it had left.
    known.push(WorkerId(8));
    let later = Millis(NOW.0 + 1_000);
    let apply = inbox.retry_unapplied(later, |w| known.contains(&w));
    assert!(
        matches!(&apply[..], [BookingEvent::Reserved(b)] if b.id == ReservationId(2) && b.lease_until == NOW.after(Duration::from_secs(300))),
        "{apply:?}"
    );
    shards.apply(&apply);
    assert!(shards.matches(&outbox));
    assert!(inbox.retry_unapplied(later, |_| true).is_empty(), "nothing left to apply");

    // Booking 1's lease runs out here (the shards free it): the origin's
    // renewal books it again.
    shards.apply(&[BookingEvent::Freed(ReservationId(1))]);
    assert!(inbox.not_applied(ReservationId(1)));
    assert!(!inbox.not_applied(ReservationId(99)));
    outbox
        .record(&BookingEvent::Renewed { id: ReservationId(1), lease_until: NOW.after(Duration::from_secs(900)) }, NOW);
    let apply = inbox.receive(&outbox.take_batch().expect("one"), NOW, |w| known.contains(&w)).apply;
    assert!(matches!(&apply[..], [BookingEvent::Reserved(b)] if b.id == ReservationId(1)), "{apply:?}");
    shards.apply(&apply);
    assert!(shards.matches(&outbox));
    assert_eq!(inbox.check(&outbox.digest()).resync_from, None);
}
