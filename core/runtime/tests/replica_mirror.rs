//! A replica's own booking changes, as its shards tell the observer, carry
//! its whole booked state: random operations on one service (bookings,
//! prefill ends and restores, renewals, frees, moves, expiries, workers
//! leaving and joining), its observed changes numbered by an `Outbox`, received by an
//! `Inbox` and applied to a second service as a peer's, leave the second
//! with the same load on every worker after every step, on inline and
//! threaded shards, with one shard and two.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_lite::future::block_on;
use kvpick_core::booking::{BookingEvent, ReservationId};
use kvpick_core::hashing::HashSeed;
use kvpick_core::replica::{Inbox, InboxConfig, Incarnation, Outbox, ReplicaId};
use kvpick_core::{Millis, RouterConfig, SelectRequest, SelectionService, WorkerId, WorkerSpec};
use kvpick_runtime::{BookingObserver, Clock, RuntimeChoice, RuntimeConfig, RuntimeKind, ShardedService};

const BS: u32 = 4;
const ORIGIN: ReplicaId = ReplicaId(1);

#[derive(Default)]
struct Recorder {
    own: Mutex<Vec<(BookingEvent, Millis)>>,
    peer_dropped: Mutex<Vec<(ReplicaId, ReservationId)>>,
}

impl BookingObserver for Recorder {
    fn own(&self, event: &BookingEvent, now: Millis) {
        self.own.lock().unwrap().push((event.clone(), now));
    }

    fn peer_dropped(&self, origin: ReplicaId, id: ReservationId) {
        self.peer_dropped.lock().unwrap().push((origin, id));
    }
}

fn addr(id: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, id as u8], 8000))
}

fn start(shards: usize, kind: RuntimeKind, clock: &Clock) -> (ShardedService, Arc<Recorder>) {
    let runtime = RuntimeConfig {
        shards,
        cpus: vec![],
        choice: RuntimeChoice::Force(kind),
        ring_capacity: 64,
        selection_wait: Duration::from_secs(5),
        ..RuntimeConfig::default()
    };
    let cfg = RouterConfig { lease: Duration::from_secs(60), ..RouterConfig::default() };
    let service = ShardedService::start(cfg, BS, runtime, clock.clone()).expect("runtime starts");
    let recorder = Arc::new(Recorder::default());
    assert!(service.observe_bookings(recorder.clone()));
    assert!(!service.observe_bookings(recorder.clone()), "one observer only");
    (service, recorder)
}

fn mirrored(seed: u64, shards: usize, kind: RuntimeKind) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let clock = Clock::manual(Millis(0));
    let (origin, own) = start(shards, kind, &clock);
    let (peer, dropped) = start(shards, kind, &clock);
    let (a, b) = (origin.producer(), peer.producer());
    let (a, b) = (std::cell::RefCell::new(a), std::cell::RefCell::new(b));
    let prompts = SelectionService::new(RouterConfig::default(), BS, 1);
    let mut outbox = Outbox::new(ORIGIN, Incarnation(1));
    let mut inbox = Inbox::new(ORIGIN, InboxConfig::default());
    let mut now = Millis(0);
    let mut next_id = 0u64;
    let mut kinds = [0usize; 4];
    for w in 1..=4 {
        for service in [&origin, &peer] {
            let producer = if std::ptr::eq(service, &origin) { &a } else { &b };
            block_on(service.upsert_worker(producer, WorkerSpec::new(WorkerId(w), addr(w), BS), now)).unwrap();
        }
    }
    for step in 0..400 {
        let worker = rng.u64(1..6);
        match rng.u8(0..100) {
            0..=3 => {
                // Discovery tells both replicas.
                let _ = block_on(origin.delete_worker(&a, WorkerId(worker)));
                let _ = block_on(peer.delete_worker(&b, WorkerId(worker)));
            }
            4..=9 => {
                let spec = WorkerSpec::new(WorkerId(worker), addr(worker), BS);
                let _ = block_on(origin.upsert_worker(&a, spec.clone(), now));
                let _ = block_on(peer.upsert_worker(&b, spec, now));
            }
            10..=49 => {
                next_id += 1;
                let tokens: Vec<u32> = (0..rng.usize(1..40)).map(|_| rng.u32(0..5)).collect();
                let request = SelectRequest {
                    id: ReservationId(next_id),
                    prompt: prompts.prompt(&tokens, HashSeed::default()),
                    model: None,
                    allowed: None,
                    priority: 0,
                    sticky: None,
                };
                let _ = block_on(origin.select_and_reserve(&a, request, now));
            }
            50..=59 if next_id > 0 => {
                let _ = block_on(origin.prefill_complete(&a, ReservationId(rng.u64(1..=next_id)), now));
            }
            60..=65 if next_id > 0 => {
                let _ = origin.post_renew(&a, ReservationId(rng.u64(1..=next_id)), now);
            }
            66..=67 if next_id > 0 => {
                let _ = block_on(origin.restore_prefill(&a, ReservationId(rng.u64(1..=next_id))));
            }
            68..=71 if next_id > 0 => {
                let _ = block_on(origin.move_booking(&a, ReservationId(rng.u64(1..=next_id)), addr(worker)));
            }
            72..=89 if next_id > 0 => {
                let _ = block_on(origin.free_reservation(&a, ReservationId(rng.u64(1..=next_id)), now));
            }
            _ => {
                now = Millis(now.0 + rng.u64(0..30_000));
                clock.set(now);
                block_on(origin.tick(&a, now));
                block_on(peer.tick(&b, now));
            }
        }
        // Everything posted from `a` is applied (and observed) once a query
        // through the same ring is answered.
        let loads_a = block_on(origin.loads(&a));
        for (event, at) in std::mem::take(&mut *own.own.lock().unwrap()) {
            kinds[match event {
                BookingEvent::Reserved(_) => 0,
                BookingEvent::PrefillComplete(_) => 1,
                BookingEvent::Renewed { .. } => 2,
                BookingEvent::Freed(_) => 3,
            }] += 1;
            outbox.record(&event, at);
        }
        assert!(own.peer_dropped.lock().unwrap().is_empty(), "the origin holds no peer's booking");
        if let Some(batch) = outbox.take_batch() {
            let received = inbox.receive(&batch, now, |w| peer.owns(w));
            assert_eq!(received.resync_from, None, "no gap in an unbroken stream");
            for event in received.apply {
                let _ = block_on(peer.apply_peer_booking(&b, ORIGIN, event));
            }
        }
        // What the peer's shards dropped (expired, worker gone) is booked
        // again on its renewal or when its worker returns.
        for (origin_id, id) in std::mem::take(&mut *dropped.peer_dropped.lock().unwrap()) {
            assert_eq!(origin_id, ORIGIN);
            // As the sync does: news of a drop the peer has since undone
            // (booked again) changes nothing.
            if !peer.holds_peer_booking(origin_id, id) {
                inbox.not_applied(id);
            }
        }
        for event in inbox.retry_unapplied(now, |w| peer.owns(w)) {
            let _ = block_on(peer.apply_peer_booking(&b, ORIGIN, event));
        }
        assert!(dropped.own.lock().unwrap().is_empty(), "the peer published a booking of its own at step {step}");
        let loads_b = block_on(peer.loads(&b));
        let load = |l: &kvpick_core::LoadSnapshot| (l.worker, l.prefill_tokens, l.active_blocks, l.requests);
        assert_eq!(
            loads_a.iter().map(load).collect::<Vec<_>>(),
            loads_b.iter().map(load).collect::<Vec<_>>(),
            "the peer's view of the origin's load at step {step}"
        );
        assert_eq!(outbox.live(), origin.active_reservations(), "the outbox's live set at step {step}");
        assert_eq!(peer.peer_bookings(), origin.active_reservations(), "peer bookings held at step {step}");
        assert_eq!(outbox.digest().live, inbox_digest(&outbox, &mut inbox), "digests at step {step}");
    }
    assert!(kinds.iter().all(|k| *k > 0), "every kind of change was published: {kinds:?}");
    origin.shutdown();
    peer.shutdown();
}

/// The inbox's mirror agrees with the outbox: its digest check asks for
/// nothing.
fn inbox_digest(outbox: &Outbox, inbox: &mut Inbox) -> kvpick_core::replica::LiveDigest {
    let digest = outbox.digest();
    let checked = inbox.check(&digest);
    assert_eq!(checked.resync_from, None, "the digest disagrees");
    digest.live
}

#[test]
fn inline_shards_publish_every_own_booking_change() {
    for (seed, shards) in [(1, 1), (2, 2), (3, 2)] {
        mirrored(seed, shards, RuntimeKind::Inline);
    }
}

#[test]
fn threaded_shards_publish_every_own_booking_change() {
    for (seed, shards) in [(4, 1), (5, 2)] {
        mirrored(seed, shards, RuntimeKind::StdThreads);
    }
}

#[test]
fn a_peer_booking_is_only_its_origins_to_change() {
    let clock = Clock::manual(Millis(0));
    let (service, recorder) = start(1, RuntimeKind::Inline, &clock);
    let producer = std::cell::RefCell::new(service.producer());
    block_on(service.upsert_worker(&producer, WorkerSpec::new(WorkerId(1), addr(1), BS), Millis(0))).unwrap();
    let booking = kvpick_core::Booking {
        id: ReservationId(9),
        worker: WorkerId(1),
        seq_hashes: Arc::from(vec![]),
        unhashed_blocks: 2,
        prefill_tokens: 8,
        lease_until: Millis(1_000),
    };
    let reserve = |origin: u64, booking: kvpick_core::Booking| {
        block_on(service.apply_peer_booking(&producer, ReplicaId(origin), BookingEvent::Reserved(booking)))
    };
    assert!(reserve(1, booking.clone()).is_ok());
    assert!(reserve(2, booking.clone()).is_err(), "an id held already");
    let mut elsewhere = booking.clone();
    elsewhere.id = ReservationId(10);
    elsewhere.worker = WorkerId(7);
    assert!(reserve(1, elsewhere).is_err(), "a worker this replica does not have");
    let free = |origin: u64| {
        block_on(service.apply_peer_booking(&producer, ReplicaId(origin), BookingEvent::Freed(ReservationId(9))))
    };
    assert!(free(2).is_err(), "another origin's booking");
    assert!(
        block_on(service.free_reservation(&producer, ReservationId(9), Millis(0))).is_err(),
        "not this replica's own"
    );
    assert_eq!(service.peer_bookings(), 1);
    // Its lease runs out here: the shard drops it and says whose it was.
    clock.set(Millis(2_000));
    block_on(service.tick(&producer, Millis(2_000)));
    assert_eq!(service.peer_bookings(), 0);
    assert_eq!(*recorder.peer_dropped.lock().unwrap(), vec![(ReplicaId(1), ReservationId(9))]);
    assert!(recorder.own.lock().unwrap().is_empty(), "a peer's booking is never published as ours");
    assert!(free(1).is_err(), "gone already");
    service.shutdown();
}
