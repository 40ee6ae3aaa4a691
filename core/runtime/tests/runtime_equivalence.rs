//! The thread-per-core runtime against the single-threaded facade: same
//! seed, same operations from one producer → the same answers, for 1, 2
//! and 4 shards (more than this machine's cores) on both executors and
//! inline (no shard threads); and
//! under several concurrent producers, every booking accounted for.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_lite::future::block_on;
use kvpick_core::hashing::HashSeed;
use kvpick_core::{
    Admission, EndpointFilter, KvEvent, Millis, Prompt, ReservationId, RouterConfig, SelectRequest, SelectionService,
    WorkerId, WorkerSpec,
};
use kvpick_runtime::{Clock, RuntimeChoice, RuntimeConfig, RuntimeKind, ShardedService, probe_glommio};

const BS: u32 = 4;

fn addr(id: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, id as u8], 8000))
}

fn runtime(shards: usize, kind: RuntimeKind) -> RuntimeConfig {
    RuntimeConfig {
        shards,
        cpus: vec![0, 1],
        choice: RuntimeChoice::Force(kind),
        ring_capacity: 64,
        selection_wait: Duration::from_secs(5),
        ..RuntimeConfig::default()
    }
}

/// The leak checks count this process's shard threads, so the tests here
/// take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Shard threads still alive, waiting up to 5 s: glommio's helper threads
/// (which inherit the executor's name) end on their own just after it.
fn shard_threads() -> usize {
    let give_up = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let live = live_shard_threads();
        if live == 0 || std::time::Instant::now() > give_up {
            return live;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn live_shard_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with("kvpick-shard"))
                .count()
        })
        .unwrap_or(0)
}

/// Random operations applied to both services, answers compared one by one.
fn equivalent(seed: u64, shards: usize, kind: RuntimeKind, cfg: RouterConfig) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let budgeted = cfg.index_max_bytes.is_some();
    let mut facade = SelectionService::new(cfg.clone(), BS, shards);
    let threaded =
        ShardedService::start(cfg, BS, runtime(shards, kind), Clock::manual(Millis(0))).expect("runtime starts");
    assert_eq!(threaded.kind(), kind);
    let producer = RefCell::new(threaded.producer());
    let mut now = Millis(0);
    let mut next_hash = 1u64;
    let mut next_id = 0u64;
    let mut chains: Vec<(u64, u64, Vec<u32>)> = Vec::new(); // (worker, last engine hash, tokens)
    let mut prompts: Vec<Prompt> = Vec::new();
    for step in 0..300 {
        let worker = rng.u64(1..7);
        match rng.u8(0..100) {
            0..=7 => {
                let mut spec = WorkerSpec::new(WorkerId(worker), addr(worker), BS);
                spec.max_num_batched_tokens = rng.bool().then_some(64);
                spec.model = rng.bool().then(|| "m".to_owned());
                let a = facade.upsert_worker(spec.clone(), now);
                let b = block_on(threaded.upsert_worker(&producer, spec, now));
                assert_eq!(a, b, "upsert at step {step}");
            }
            8..=10 => {
                let a = facade.delete_worker(WorkerId(worker));
                let b = block_on(threaded.delete_worker(&producer, WorkerId(worker)));
                assert_eq!(a, b, "delete at step {step}");
                chains.retain(|c| c.0 != worker);
            }
            11..=40 => {
                // Extend a known chain of this worker or start a new one.
                let base = chains.iter().filter(|c| c.0 == worker).nth(rng.usize(0..3)).cloned();
                let blocks = rng.usize(1..12);
                let tokens: Vec<u32> = (0..blocks * BS as usize).map(|_| rng.u32(0..3)).collect();
                let hashes: Vec<u64> = (0..blocks as u64).map(|i| next_hash + i).collect();
                next_hash += blocks as u64;
                let (parent, mut all) = match &base {
                    Some((_, last, toks)) => (Some(*last), toks.clone()),
                    None => (None, Vec::new()),
                };
                let event = KvEvent::Stored {
                    block_hashes: hashes.clone(),
                    parent,
                    token_ids: tokens.clone(),
                    block_size: BS,
                    seed: HashSeed::default(),
                };
                let applied = facade.apply_kv_event(WorkerId(worker), &event).is_ok();
                let _ = threaded.apply_kv_event(&mut producer.borrow_mut(), WorkerId(worker), event);
                if applied {
                    all.extend(tokens);
                    chains.push((worker, *hashes.last().expect("at least one block"), all));
                }
            }
            41..=46 => {
                let victims: Vec<u64> = (0..rng.usize(1..4)).map(|_| rng.u64(1..next_hash.max(2))).collect();
                let event = KvEvent::Removed { block_hashes: victims };
                let _ = facade.apply_kv_event(WorkerId(worker), &event);
                let _ = threaded.apply_kv_event(&mut producer.borrow_mut(), WorkerId(worker), event);
            }
            47 => {
                let _ = facade.apply_kv_event(WorkerId(worker), &KvEvent::Cleared);
                let _ = threaded.apply_kv_event(&mut producer.borrow_mut(), WorkerId(worker), KvEvent::Cleared);
            }
            48..=75 => {
                let mut tokens = match chains.get(rng.usize(0..chains.len().max(1))) {
                    Some((_, _, toks)) => toks[..rng.usize(0..=toks.len())].to_vec(),
                    None => Vec::new(),
                };
                tokens.extend((0..rng.usize(0..40)).map(|_| rng.u32(0..3)));
                next_id += 1;
                let mut allowed = None;
                match rng.u8(0..10) {
                    0 => {
                        let mut filter = EndpointFilter::new();
                        filter.allow_ip(addr(rng.u64(1..7)).ip());
                        allowed = Some(filter);
                    }
                    // Workers a request avoids (decode-only ones, for a
                    // request that cannot be split): one, or most of them.
                    1 | 2 => {
                        let mut filter = EndpointFilter::any();
                        for avoided in 1..7 {
                            if rng.u8(0..3) > 0 {
                                filter.avoid_addr(addr(avoided));
                            }
                        }
                        allowed = Some(filter);
                    }
                    _ => {}
                }
                let request = SelectRequest {
                    id: ReservationId(next_id),
                    prompt: facade.prompt(&tokens, HashSeed::default()),
                    model: rng.bool().then(|| "m".to_owned()),
                    allowed,
                    priority: rng.i32(0..3),
                    // Session affinity to some worker, now and then.
                    sticky: rng.bool().then(|| WorkerId(rng.u64(1..7))),
                };
                prompts.push(request.prompt.clone());
                let a = facade.select_and_reserve(request.clone(), now);
                let b = block_on(threaded.select_and_reserve(&producer, request, now));
                assert_eq!(a, b, "select at step {step}");
            }
            76..=84 if next_id > 0 => {
                let id = ReservationId(rng.u64(1..=next_id));
                let a = facade.prefill_complete(id, now);
                let b = block_on(threaded.prefill_complete(&producer, id, now));
                assert_eq!(a, b, "prefill_complete at step {step}");
            }
            85..=94 if next_id > 0 => {
                let id = ReservationId(rng.u64(1..=next_id));
                let a = facade.free_reservation(id, now);
                let b = block_on(threaded.free_reservation(&producer, id, now));
                assert_eq!(a, b, "free at step {step}");
            }
            _ => {
                now = Millis(now.0 + rng.u64(0..40_000));
                facade.tick(now);
                block_on(threaded.tick(&producer, now));
            }
        }
        assert_eq!(facade.take_admissions(), threaded.take_admissions(), "admissions at step {step}");
        assert_eq!(facade.loads(), block_on(threaded.loads(&producer)), "loads at step {step}");
        for prompt in prompts.iter().rev().take(3) {
            assert_eq!(
                facade.overlap_scores(prompt),
                block_on(threaded.overlap_scores(&producer, prompt)),
                "overlaps at step {step}"
            );
        }
    }
    let stats = facade.shard_stats();
    assert_eq!(stats, block_on(threaded.shard_stats(&producer)));
    assert!(!budgeted || stats.blocks_evicted > 0, "the budget never bit: {stats:?}");
    assert_eq!(facade.stats(), threaded.stats());
    threaded.shutdown();
}

/// The configurations each shard count runs with.
fn configs(shards: usize) -> Vec<RouterConfig> {
    // Workers 1 to 6 spread over the shards, fewest first: the budget
    // covers the fullest shard's workers' fixed cost, so its entries' room
    // is 24 split by the shards.
    let fixed = (shards * 6usize.div_ceil(shards)) as u64 * kvpick_core::index::WORKER_BYTES;
    vec![
        RouterConfig { lease: Duration::from_secs(60), ..RouterConfig::default() },
        RouterConfig {
            lease: Duration::from_secs(60),
            queue_threshold: Some(1.0),
            queue_capacity: 3,
            queue_timeout: Duration::from_secs(20),
            temperature: 0.5,
            ..RouterConfig::default()
        },
        // An index budget small enough that every run evicts.
        RouterConfig {
            lease: Duration::from_secs(60),
            index_max_bytes: Some(24 * kvpick_core::index::ENTRY_BYTES + fixed),
            ..RouterConfig::default()
        },
    ]
}

#[test]
fn std_threads_answer_exactly_like_the_facade() {
    let _turn = serial();
    for shards in [1, 2, 4] {
        for (seed, cfg) in configs(shards).into_iter().enumerate() {
            equivalent(seed as u64 + 1, shards, RuntimeKind::StdThreads, cfg);
        }
    }
    assert_eq!(shard_threads(), 0, "shard threads leaked");
}

#[test]
fn inline_shards_answer_exactly_like_the_facade() {
    let _turn = serial();
    for shards in [1, 2, 4] {
        for (seed, cfg) in configs(shards).into_iter().enumerate() {
            equivalent(seed as u64 + 20, shards, RuntimeKind::Inline, cfg);
        }
    }
    assert_eq!(live_shard_threads(), 0, "inline shards start no thread");
}

#[test]
fn glommio_executors_answer_exactly_like_the_facade() {
    let _turn = serial();
    // This workplace's machines allow io_uring; a machine that does not
    // must say so rather than pass silently.
    if let Err(why) = probe_glommio(Some(0)) {
        panic!("glommio cannot start on this machine ({why}); the std fallback is tested separately");
    }
    for shards in [1, 2, 4] {
        for (seed, cfg) in configs(shards).into_iter().enumerate() {
            equivalent(seed as u64 + 10, shards, RuntimeKind::Glommio, cfg);
        }
    }
    assert_eq!(shard_threads(), 0, "shard threads leaked");
}

/// Request `i` of a producer: `blocks` full blocks of tokens cycling
/// through `alphabet` values, so that requests share prefixes.
fn numbered_request(id: ReservationId, i: u64, blocks: u32, alphabet: u32) -> SelectRequest {
    let tokens: Vec<u32> = (0..BS * blocks).map(|x| (x + i as u32) % alphabet).collect();
    SelectRequest {
        id,
        prompt: Prompt::from_tokens(&tokens, BS, HashSeed::default()),
        model: None,
        allowed: None,
        priority: 0,
        sticky: None,
    }
}

#[test]
fn concurrent_producers_leave_every_booking_accounted_for() {
    let _turn = serial();
    for kind in [RuntimeKind::StdThreads, RuntimeKind::Glommio, RuntimeKind::Inline] {
        let cfg = RouterConfig { lease: Duration::from_secs(600), ..RouterConfig::default() };
        let service =
            Arc::new(ShardedService::start(cfg.clone(), BS, runtime(2, kind), Clock::system()).expect("starts"));
        let mut facade = SelectionService::new(cfg, BS, 1);
        let setup = Mutex::new(service.producer());
        for w in 1..=6 {
            let spec = WorkerSpec::new(WorkerId(w), addr(w), BS);
            block_on(service.upsert_worker(&setup, spec.clone(), Millis(0))).expect("upsert");
            facade.upsert_worker(spec, Millis(0)).expect("upsert");
        }
        // One ingest thread streams events for every worker.
        let events: Vec<(WorkerId, KvEvent)> = (0..3_000u64)
            .map(|i| {
                let worker = WorkerId(i % 6 + 1);
                let tokens: Vec<u32> = (0..BS * 4).map(|t| (t + (i as u32 % 37)) % 5).collect();
                let hashes = (0..4).map(|b| i << 8 | b).collect();
                (
                    worker,
                    KvEvent::Stored {
                        block_hashes: hashes,
                        parent: None,
                        token_ids: tokens,
                        block_size: BS,
                        seed: HashSeed::default(),
                    },
                )
            })
            .collect();
        for (worker, event) in &events {
            facade.apply_kv_event(*worker, event).expect("worker exists");
        }
        std::thread::scope(|scope| {
            let ingest_service = service.clone();
            let events = events.clone();
            scope.spawn(move || {
                let mut producer = ingest_service.producer();
                for (worker, event) in events {
                    ingest_service.apply_kv_event(&mut producer, worker, event).expect("worker exists");
                }
            });
            for t in 0..3u64 {
                let service = service.clone();
                scope.spawn(move || {
                    let producer = RefCell::new(service.producer());
                    for i in 0..400u64 {
                        let id = ReservationId(t << 32 | i);
                        let request = numbered_request(id, i, 8, 5);
                        block_on(service.select_and_reserve(&producer, request, Millis(0))).expect("admitted");
                        if i % 2 == 0 {
                            block_on(service.prefill_complete(&producer, id, Millis(0))).expect("booked");
                        }
                        block_on(service.free_reservation(&producer, id, Millis(0))).expect("booked");
                    }
                });
            }
        });
        let check = Mutex::new(service.producer());
        let loads = block_on(service.loads(&check));
        assert!(loads.iter().all(|l| l.requests == 0 && l.prefill_tokens == 0 && l.active_blocks == 0), "{loads:?}");
        assert_eq!(service.active_reservations(), 0);
        for (_, event) in events.iter().step_by(97) {
            if let KvEvent::Stored { token_ids, .. } = event {
                let prompt = Prompt::from_tokens(token_ids, BS, HashSeed::default());
                assert_eq!(block_on(service.overlap_scores(&check, &prompt)), facade.overlap_scores(&prompt));
            }
        }
        assert_eq!(block_on(service.shard_stats(&check)).blocks_stored, facade.shard_stats().blocks_stored);
        service.shutdown();
    }
    assert_eq!(shard_threads(), 0, "shard threads leaked");
}

#[test]
fn auto_choice_runs_and_shutdown_refuses_new_work() {
    let _turn = serial();
    let cfg = RuntimeConfig { shards: 2, choice: RuntimeChoice::Auto, ..RuntimeConfig::default() };
    let service = ShardedService::start(RouterConfig::default(), BS, cfg, Clock::system()).expect("starts");
    let producer = RefCell::new(service.producer());
    block_on(service.upsert_worker(&producer, WorkerSpec::new(WorkerId(1), addr(1), BS), Millis(0))).expect("upsert");
    service.shutdown();
    let request = SelectRequest {
        id: ReservationId(1),
        prompt: Prompt::load_only(8),
        model: None,
        allowed: None,
        priority: 0,
        sticky: None,
    };
    assert!(block_on(service.select_and_reserve(&producer, request, Millis(0))).is_err());
}

fn assert_send<T: Send>(t: T) -> T {
    t
}

#[test]
fn a_queued_request_is_awaited_until_capacity_frees() {
    let _turn = serial();
    let cfg =
        RouterConfig { queue_threshold: Some(1.0), queue_timeout: Duration::from_secs(30), ..RouterConfig::default() };
    let service = Arc::new(
        ShardedService::start(cfg, BS, runtime(2, RuntimeKind::StdThreads), Clock::manual(Millis(0))).expect("starts"),
    );
    let producers = kvpick_runtime::ThreadProducers::new(service.clone());
    let mut spec = WorkerSpec::new(WorkerId(1), addr(1), BS);
    spec.max_num_batched_tokens = Some(10);
    block_on(service.upsert_worker(&producers, spec, Millis(0))).expect("upsert");
    let request = |id| SelectRequest {
        id: ReservationId(id),
        prompt: Prompt::load_only(20),
        model: None,
        allowed: None,
        priority: 0,
        sticky: None,
    };
    let first =
        block_on(assert_send(service.select_and_wait(&producers, request(1), Millis(0)))).expect("admitted at once");
    assert_eq!(first.worker, WorkerId(1));
    let waiter = {
        let (service, producers) = (service.clone(), producers.clone());
        std::thread::spawn(move || block_on(service.select_and_wait(&producers, request(2), Millis(0))))
    };
    while service.queue_len() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    block_on(service.free_reservation(&producers, ReservationId(1), Millis(1))).expect("booked");
    let second = waiter.join().expect("no panic").expect("admitted once capacity freed");
    assert_eq!(second.id, ReservationId(2));
    assert!(service.take_admissions().is_empty(), "the waiter got the outcome, not the shared list");

    // Refused at its deadline.
    let late = {
        let (service, producers) = (service.clone(), producers.clone());
        std::thread::spawn(move || block_on(service.select_and_wait(&producers, request(3), Millis(1))))
    };
    while service.queue_len() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    block_on(service.tick(&producers, Millis(60_000)));
    assert_eq!(late.join().expect("no panic"), Err(kvpick_core::SelectError::QueueTimeout));
    service.shutdown();
}

/// `prefill_complete` and `free_reservation` are posted, not awaited: a
/// free sent through another thread's ring may overtake a posted
/// `prefill_complete`, and the shard must end in the same state either
/// way (nothing booked, nothing in prefill), with every answer decided as
/// the facade decides it.
#[test]
fn posted_booking_changes_from_different_rings_leave_nothing_behind() {
    let _turn = serial();
    for kind in [RuntimeKind::StdThreads, RuntimeKind::Glommio, RuntimeKind::Inline] {
        let cfg = RouterConfig { lease: Duration::from_secs(600), ..RouterConfig::default() };
        let service = ShardedService::start(cfg, BS, runtime(1, kind), Clock::system()).expect("starts");
        // Registered first, so the shard drains the free's ring before the
        // prefill's whenever both wait in the same pass.
        let frees = RefCell::new(service.producer());
        let books = RefCell::new(service.producer());
        for w in 1..=3 {
            block_on(service.upsert_worker(&books, WorkerSpec::new(WorkerId(w), addr(w), BS), Millis(0)))
                .expect("upsert");
        }
        for i in 0..300u64 {
            let id = ReservationId(i);
            let request = numbered_request(id, i, 6, 7);
            block_on(service.select_and_reserve(&books, request, Millis(0))).expect("admitted");
            assert_eq!(service.post_prefill_complete(&books, id), Ok(()));
            assert_eq!(service.post_free(&frees, id), Ok(()));
            assert_eq!(service.post_free(&frees, id), Err(kvpick_core::BookingError::NotFound(id)));
            assert_eq!(service.post_prefill_complete(&books, id), Err(kvpick_core::BookingError::NotFound(id)));
        }
        // Each ring's earlier commands are applied before its own query.
        let _ = block_on(service.loads(&books));
        let loads = block_on(service.loads(&frees));
        assert!(loads.iter().all(|l| l.requests == 0 && l.prefill_tokens == 0 && l.active_blocks == 0), "{loads:?}");
        assert_eq!(service.active_reservations(), 0);
        service.shutdown();
    }
    assert_eq!(shard_threads(), 0, "shard threads leaked");
}

/// A booking whose prefill ended counts its prompt as prefill load again
/// once restored (the decode sidecar ran a split request whole), on the
/// same worker, until its prefill ends again or it is freed; a freed one
/// cannot be restored.
#[test]
fn a_restored_prefill_is_load_again_until_it_completes() {
    let _turn = serial();
    for kind in [RuntimeKind::StdThreads, RuntimeKind::Glommio, RuntimeKind::Inline] {
        let service =
            ShardedService::start(RouterConfig::default(), BS, runtime(2, kind), Clock::system()).expect("starts");
        let p = RefCell::new(service.producer());
        for w in 1..=3 {
            block_on(service.upsert_worker(&p, WorkerSpec::new(WorkerId(w), addr(w), BS), Millis(0))).expect("upsert");
        }
        let id = ReservationId(1);
        let Admission::Reserved(selection) =
            block_on(service.select_and_reserve(&p, numbered_request(id, 1, 6, 7), Millis(0))).expect("admitted")
        else {
            panic!("queued with every worker idle")
        };
        let booked = |loads: Vec<kvpick_core::LoadSnapshot>| {
            let load = loads.into_iter().find(|l| l.worker == selection.worker).expect("the booked worker");
            (load.requests, load.prefill_tokens, load.active_blocks)
        };
        let at_booking = booked(block_on(service.loads(&p)));
        assert_eq!(at_booking.0, 1);
        assert!(at_booking.1 > 0, "{at_booking:?}");
        assert_eq!(service.post_prefill_complete(&p, id), Ok(()));
        assert_eq!(booked(block_on(service.loads(&p))), (1, 0, at_booking.2));
        assert_eq!(block_on(service.restore_prefill(&p, id)), Ok(()));
        assert_eq!(booked(block_on(service.loads(&p))), at_booking, "{kind:?}: as booked");
        assert_eq!(block_on(service.restore_prefill(&p, id)), Ok(()), "restoring twice changes nothing");
        assert_eq!(booked(block_on(service.loads(&p))), at_booking, "{kind:?}: counted once");
        assert_eq!(service.post_prefill_complete(&p, id), Ok(()));
        assert_eq!(service.post_free(&p, id), Ok(()));
        assert_eq!(block_on(service.restore_prefill(&p, id)), Err(kvpick_core::BookingError::NotFound(id)));
        let loads = block_on(service.loads(&p));
        assert!(loads.iter().all(|l| l.requests == 0 && l.prefill_tokens == 0 && l.active_blocks == 0), "{loads:?}");
        assert_eq!(service.active_reservations(), 0);
        service.shutdown();
    }
    assert_eq!(shard_threads(), 0, "shard threads leaked");
}

/// Posted frees do not wake a sleeping shard. A query through another
/// ring, one the shard drains first, must still see every free posted
/// before it: the shard runs what nobody waits for at the head of every
/// ring before anything else in a pass.
#[test]
fn a_query_through_another_ring_sees_frees_that_did_not_ring() {
    let _turn = serial();
    for kind in [RuntimeKind::StdThreads, RuntimeKind::Glommio, RuntimeKind::Inline] {
        // No spin: the shard parks as soon as its rings are empty, so
        // the frees below wait unrung in their ring.
        let runtime = RuntimeConfig { spin_before_park: Duration::ZERO, ..runtime(1, kind) };
        let service = ShardedService::start(RouterConfig::default(), BS, runtime, Clock::system()).expect("starts");
        // Registered first: its query is in the ring the shard passes over first.
        let queries = RefCell::new(service.producer());
        let books = RefCell::new(service.producer());
        for w in 1..=2 {
            block_on(service.upsert_worker(&books, WorkerSpec::new(WorkerId(w), addr(w), BS), Millis(0)))
                .expect("upsert");
        }
        for i in 0..20u64 {
            let tokens: Vec<u32> = (0..BS * 4).map(|x| x * 31 + i as u32).collect();
            let request = SelectRequest {
                id: ReservationId(i),
                prompt: Prompt::from_tokens(&tokens, BS, HashSeed::default()),
                model: None,
                allowed: None,
                priority: 0,
                sticky: None,
            };
            block_on(service.select_and_reserve(&books, request, Millis(0))).expect("admitted");
            // Let the shard go to sleep before the free is posted.
            std::thread::sleep(Duration::from_millis(1));
            assert_eq!(service.post_free(&books, ReservationId(i)), Ok(()));
            let loads = block_on(service.loads(&queries));
            assert!(loads.iter().all(|l| l.requests == 0 && l.active_blocks == 0), "{kind:?}, round {i}: {loads:?}");
        }
        service.shutdown();
    }
    assert_eq!(shard_threads(), 0, "shard threads leaked");
}

/// Selections whose caller rings the shards once per batch, late (1 ms
/// after the batch's first push, from another thread), with shards that
/// park at once: every one is answered and every booking freed, through
/// one shard (one visit) and two (candidates, then booking).
#[test]
fn selections_that_ring_once_per_batch_are_all_answered() {
    let _turn = serial();
    for shards in [1, 2] {
        let cfg = RuntimeConfig { spin_before_park: Duration::ZERO, ..runtime(shards, RuntimeKind::StdThreads) };
        let service =
            Arc::new(ShardedService::start(RouterConfig::default(), BS, cfg, Clock::system()).expect("starts"));
        let (to_ringer, batches) = std::sync::mpsc::channel::<kvpick_runtime::PendingRings>();
        let ringer = std::thread::spawn(move || {
            let mut rung = 0usize;
            for pending in batches {
                std::thread::sleep(Duration::from_millis(1));
                pending.ring();
                rung += 1;
            }
            rung
        });
        let to_ringer = Mutex::new(to_ringer);
        let scheduler: kvpick_runtime::RingScheduler = Arc::new(move |pending| {
            // The test ends by dropping this sender: a send cannot fail before.
            let _ = to_ringer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send(pending);
        });
        let producers = kvpick_runtime::ThreadProducers::new(service.clone()).with_ring_scheduler(scheduler);
        for w in 1..=4 {
            block_on(service.upsert_worker(&producers, WorkerSpec::new(WorkerId(w), addr(w), BS), Millis(0)))
                .expect("upsert");
        }
        let start = std::sync::Barrier::new(6);
        std::thread::scope(|scope| {
            for t in 0..6u64 {
                let (service, producers, start) = (service.clone(), producers.clone(), &start);
                scope.spawn(move || {
                    start.wait();
                    for i in 0..100u64 {
                        let id = ReservationId(t << 32 | i);
                        let request = numbered_request(id, i, 4, 7);
                        block_on(service.select_and_wait(&producers, request, Millis(0))).expect("answered");
                        block_on(service.free_reservation(&producers, id, Millis(0))).expect("booked");
                    }
                });
            }
        });
        assert_eq!(service.active_reservations(), 0);
        let loads = block_on(service.loads(&producers));
        assert!(loads.iter().all(|l| l.requests == 0 && l.prefill_tokens == 0), "{loads:?}");
        drop(producers);
        service.shutdown();
        drop(service);
        let rung = ringer.join().expect("no panic");
        assert!(rung > 0, "{shards} shard(s): six threads at once never had a selection in flight beside another");
    }
    assert_eq!(shard_threads(), 0, "shard threads leaked");
}
