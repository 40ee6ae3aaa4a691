use std::net::SocketAddr;
use std::time::Duration;

use super::*;
use crate::hashing::HashSeed;
use crate::shard::LoadSnapshot;
use crate::worker::Lifecycle;

const BS: u32 = 4;
const T0: Millis = Millis(1_000);

fn addr(i: u64) -> SocketAddr {
    format!("10.0.0.{i}:8000").parse().unwrap()
}

fn spec(i: u64) -> WorkerSpec {
    WorkerSpec::new(WorkerId(i), addr(i), BS)
}

fn service(workers: u64, shards: usize, cfg: RouterConfig) -> SelectionService {
    let mut svc = SelectionService::new(cfg, BS, shards);
    for i in 1..=workers {
        svc.upsert_worker(spec(i), T0).unwrap();
    }
    svc
}

fn tokens(n: u32, base: u32) -> Vec<u32> {
    (base..base + n).collect()
}

fn request(svc: &SelectionService, id: u64, toks: &[u32]) -> SelectRequest {
    SelectRequest {
        id: ReservationId(id),
        prompt: svc.prompt(toks, HashSeed::default()),
        model: None,
        allowed: None,
        priority: 0,
        sticky: None,
    }
}

fn reserve(svc: &mut SelectionService, id: u64, toks: &[u32]) -> Selection {
    let req = request(svc, id, toks);
    match svc.select_and_reserve(req, T0).unwrap() {
        Admission::Reserved(sel) => sel,
        Admission::Queued => panic!("unexpectedly queued"),
    }
}

fn store(svc: &mut SelectionService, worker: u64, toks: &[u32]) {
    let blocks = toks.len() as u32 / BS;
    let event = KvEvent::Stored {
        block_hashes: (0..u64::from(blocks)).map(|b| worker << 32 | b).collect(),
        parent: None,
        token_ids: toks[..(blocks * BS) as usize].to_vec(),
        block_size: BS,
        seed: HashSeed::default(),
    };
    svc.apply_kv_event(WorkerId(worker), &event).unwrap();
}

fn load(svc: &SelectionService, worker: u64) -> LoadSnapshot {
    svc.loads().into_iter().find(|l| l.worker == WorkerId(worker)).unwrap()
}

#[test]
fn the_worker_holding_the_prefix_wins() {
    let mut svc = service(3, 2, RouterConfig::default());
    let toks = tokens(64, 0);
    store(&mut svc, 2, &toks);
    let sel = reserve(&mut svc, 1, &toks);
    assert_eq!((sel.worker, sel.endpoint, sel.overlap_blocks), (WorkerId(2), addr(2), 16));
    assert_eq!((sel.prefill_tokens, sel.isl_tokens, sel.candidates), (0, 64, 3));
}

#[test]
fn without_overlap_the_least_loaded_worker_wins() {
    let mut svc = service(2, 1, RouterConfig::default());
    let first = reserve(&mut svc, 1, &tokens(400, 0));
    let second = reserve(&mut svc, 2, &tokens(40, 10_000));
    assert_ne!(first.worker, second.worker);
    let busy = load(&svc, first.worker.0);
    assert_eq!((busy.prefill_tokens, busy.active_blocks, busy.requests), (400, 100, 1));
}

#[test]
fn reservation_lifecycle_moves_load_and_is_idempotent() {
    let mut svc = service(1, 1, RouterConfig::default());
    // 10 tokens: 2 full blocks and a partial one.
    let sel = reserve(&mut svc, 7, &tokens(10, 0));
    assert_eq!(
        load(&svc, 1),
        LoadSnapshot {
            worker: WorkerId(1),
            prefill_tokens: 10,
            active_blocks: 3,
            requests: 1,
            cached_blocks: 0,
            block_size_mismatch: None,
            schedulable: true,
        }
    );
    svc.prefill_complete(sel.id, T0).unwrap();
    svc.prefill_complete(sel.id, T0).unwrap();
    assert_eq!(load(&svc, 1).prefill_tokens, 0);
    assert_eq!(load(&svc, 1).active_blocks, 3);
    svc.free_reservation(sel.id, T0).unwrap();
    assert_eq!(svc.free_reservation(sel.id, T0), Err(BookingError::NotFound(sel.id)));
    assert_eq!(svc.prefill_complete(sel.id, T0), Err(BookingError::NotFound(sel.id)));
    assert_eq!(
        load(&svc, 1),
        LoadSnapshot {
            worker: WorkerId(1),
            prefill_tokens: 0,
            active_blocks: 0,
            requests: 0,
            cached_blocks: 0,
            block_size_mismatch: None,
            schedulable: true,
        }
    );
}

#[test]
fn freeing_during_prefill_releases_prefill_too() {
    let mut svc = service(1, 1, RouterConfig::default());
    reserve(&mut svc, 1, &tokens(32, 0));
    svc.free_reservation(ReservationId(1), T0).unwrap();
    assert_eq!(load(&svc, 1).prefill_tokens, 0);
}

#[test]
fn cached_prefix_is_not_booked_as_prefill() {
    let mut svc = service(1, 1, RouterConfig::default());
    let toks = tokens(40, 0);
    store(&mut svc, 1, &toks[..32]);
    let sel = reserve(&mut svc, 1, &toks);
    assert_eq!((sel.overlap_blocks, sel.prefill_tokens), (8, 8));
    assert_eq!(load(&svc, 1).prefill_tokens, 8);
}

#[test]
fn shared_prompt_blocks_count_once_in_decode_load() {
    let mut svc = service(1, 1, RouterConfig::default());
    let toks = tokens(32, 0);
    reserve(&mut svc, 1, &toks);
    reserve(&mut svc, 2, &toks);
    assert_eq!(load(&svc, 1).active_blocks, 8);
    assert_eq!(load(&svc, 1).requests, 2);
}

#[test]
fn duplicate_reservation_ids_are_refused() {
    let mut svc = service(1, 1, RouterConfig::default());
    reserve(&mut svc, 1, &tokens(8, 0));
    let again = request(&svc, 1, &tokens(8, 0));
    assert_eq!(svc.select_and_reserve(again, T0), Err(SelectError::DuplicateReservation(ReservationId(1))));
    assert_eq!(load(&svc, 1).requests, 1);
}

#[test]
fn errors_name_what_is_missing() {
    let mut empty = SelectionService::new(RouterConfig::default(), BS, 2);
    let req = request(&empty, 1, &tokens(8, 0));
    assert_eq!(empty.select_and_reserve(req.clone(), T0), Err(SelectError::NoWorkers));

    let mut svc = service(2, 2, RouterConfig::default());
    let mut llama = spec(1);
    llama.model = Some("llama".into());
    svc.upsert_worker(llama, T0).unwrap();
    let mut qwen = spec(2);
    qwen.model = Some("qwen".into());
    svc.upsert_worker(qwen, T0).unwrap();
    let unknown = SelectRequest { model: Some("mistral".into()), ..req.clone() };
    assert_eq!(svc.select_and_reserve(unknown, T0), Err(SelectError::UnknownModel("mistral".into())));
    let qwen_req = SelectRequest { model: Some("qwen".into()), ..req.clone() };
    assert!(matches!(svc.select_and_reserve(qwen_req, T0), Ok(Admission::Reserved(s)) if s.worker == WorkerId(2)));

    let mut nowhere = EndpointFilter::new();
    nowhere.allow_addr("10.9.9.9:1".parse().unwrap());
    let filtered = SelectRequest { id: ReservationId(2), allowed: Some(nowhere), ..req.clone() };
    assert_eq!(svc.select_and_reserve(filtered, T0), Err(SelectError::NoEligibleWorkers));

    let mut draining = spec(1);
    draining.lifecycle = Lifecycle::Draining;
    svc.upsert_worker(draining, T0).unwrap();
    let mut down = spec(2);
    down.lifecycle = Lifecycle::Unschedulable;
    svc.upsert_worker(down, T0).unwrap();
    let any = SelectRequest { id: ReservationId(3), ..req };
    assert_eq!(svc.select_and_reserve(any, T0), Err(SelectError::NoEligibleWorkers));
    assert_eq!(svc.delete_worker(WorkerId(9)), Err(WorkerError::NotFound(WorkerId(9))));
    let mut odd = spec(5);
    odd.block_size = 16;
    assert_eq!(svc.upsert_worker(odd, T0), Err(WorkerError::BlockSizeMismatch { worker: 16, service: BS }));
}

/// A worker whose pod leaves Ready and comes back is the same engine: it is
/// never picked meanwhile, and keeps its cache, its bookings and its place.
#[test]
fn an_unschedulable_worker_keeps_its_cache_and_load_until_schedulable_again() {
    let mut svc = service(2, 2, RouterConfig::default());
    let toks = tokens(64, 0);
    store(&mut svc, 2, &toks);
    let booked = reserve(&mut svc, 1, &toks);
    assert_eq!(booked.worker, WorkerId(2));
    let held = load(&svc, 2);
    assert!(held.schedulable && held.requests == 1 && held.cached_blocks == 16);

    let mut down = spec(2);
    down.lifecycle = Lifecycle::Unschedulable;
    svc.upsert_worker(down, T0).unwrap();
    assert_eq!(load(&svc, 2), LoadSnapshot { schedulable: false, ..held });
    // Its prefix is still known, but the request goes elsewhere.
    assert!(svc.overlap_scores(&request(&svc, 0, &toks).prompt).contains(&(WorkerId(2), 16)));
    assert_eq!(reserve(&mut svc, 2, &toks).worker, WorkerId(1));
    svc.prefill_complete(booked.id, T0).unwrap();

    svc.upsert_worker(spec(2), T0).unwrap();
    let back = load(&svc, 2);
    assert!(back.schedulable && back.requests == 1 && back.cached_blocks == 16);
    assert_eq!(reserve(&mut svc, 3, &toks).worker, WorkerId(2));
    svc.free_reservation(booked.id, T0).unwrap();
}

#[test]
fn subset_restricts_by_address_or_ip() {
    let mut svc = service(3, 2, RouterConfig::default());
    store(&mut svc, 1, &tokens(32, 0));
    let mut only_three = EndpointFilter::new();
    only_three.allow_ip(addr(3).ip());
    let req = SelectRequest { allowed: Some(only_three), ..request(&svc, 1, &tokens(32, 0)) };
    assert!(matches!(svc.select_and_reserve(req, T0), Ok(Admission::Reserved(s)) if s.worker == WorkerId(3)));
    let mut exact = EndpointFilter::new();
    exact.allow_addr(addr(2));
    let req = SelectRequest { allowed: Some(exact), ..request(&svc, 2, &tokens(32, 0)) };
    assert!(matches!(svc.select_and_reserve(req, T0), Ok(Admission::Reserved(s)) if s.worker == WorkerId(2)));
}

/// An avoided worker (a decode-only one for a request that cannot be
/// split) is left out while another is eligible, even holding the prefix,
/// and picked when it is the only one.
#[test]
fn an_avoided_worker_is_picked_only_when_no_other_is_eligible() {
    let mut svc = service(2, 2, RouterConfig::default());
    let toks = tokens(32, 0);
    store(&mut svc, 1, &toks);
    let mut avoid_one = EndpointFilter::any();
    avoid_one.avoid_addr(addr(1));
    let req = SelectRequest { allowed: Some(avoid_one.clone()), ..request(&svc, 1, &toks) };
    assert_eq!(svc.select(&req).unwrap().worker, WorkerId(2));
    assert!(matches!(svc.select_and_reserve(req, T0), Ok(Admission::Reserved(s)) if s.worker == WorkerId(2)));

    let mut down = spec(2);
    down.lifecycle = Lifecycle::Unschedulable;
    svc.upsert_worker(down, T0).unwrap();
    let req = SelectRequest { allowed: Some(avoid_one.clone()), ..request(&svc, 2, &toks) };
    assert!(matches!(svc.select_and_reserve(req, T0), Ok(Admission::Reserved(s)) if s.worker == WorkerId(1)));
    // What the filter does not allow stays out, avoided or not.
    let mut only_two = EndpointFilter::new();
    only_two.allow_addr(addr(2)).avoid_addr(addr(1));
    let req = SelectRequest { allowed: Some(only_two), ..request(&svc, 3, &toks) };
    assert_eq!(svc.select_and_reserve(req, T0), Err(SelectError::NoEligibleWorkers));
}

#[test]
fn leases_expire_and_free_their_load() {
    let cfg = RouterConfig { lease: Duration::from_secs(10), ..RouterConfig::default() };
    let mut svc = service(1, 1, cfg);
    reserve(&mut svc, 1, &tokens(16, 0));
    svc.tick(T0.after(Duration::from_millis(9_999)));
    assert_eq!(load(&svc, 1).requests, 1);
    svc.tick(T0.after(Duration::from_secs(10)));
    assert_eq!(load(&svc, 1).requests, 0);
    assert_eq!(svc.shard_stats().leases_expired, 1);
    assert_eq!(svc.free_reservation(ReservationId(1), T0), Err(BookingError::NotFound(ReservationId(1))));
    // A freed booking's stale lease entry does nothing.
    reserve(&mut svc, 2, &tokens(16, 0));
    svc.free_reservation(ReservationId(2), T0).unwrap();
    svc.tick(T0.after(Duration::from_secs(60)));
    assert_eq!(svc.shard_stats().leases_expired, 1);
}

#[test]
fn deleting_a_worker_drops_its_bookings() {
    let mut svc = service(2, 2, RouterConfig::default());
    let sel = reserve(&mut svc, 1, &tokens(16, 0));
    assert_eq!(svc.delete_worker(sel.worker), Ok(vec![ReservationId(1)]));
    assert_eq!(svc.active_reservations(), 0);
    assert_eq!(svc.free_reservation(ReservationId(1), T0), Err(BookingError::NotFound(ReservationId(1))));
}

#[test]
fn workers_are_spread_evenly_over_shards() {
    let svc = service(7, 3, RouterConfig::default());
    let counts: Vec<usize> = svc.shards().iter().map(Shard::worker_count).collect();
    assert_eq!(counts, vec![3, 2, 2]);
}

#[test]
fn same_seed_same_picks_whatever_the_shard_count() {
    let picks = |shards| {
        let mut svc = service(8, shards, RouterConfig::default());
        (0..200).map(|i| reserve(&mut svc, i, &tokens(16, 0)).worker).collect::<Vec<_>>()
    };
    let one = picks(1);
    assert_eq!(one, picks(2));
    assert_eq!(one, picks(4));
}

fn queueing(capacity: usize) -> SelectionService {
    let cfg = RouterConfig {
        queue_threshold: Some(1.0),
        queue_capacity: capacity,
        queue_timeout: Duration::from_secs(5),
        ..RouterConfig::default()
    };
    let mut svc = SelectionService::new(cfg, BS, 1);
    let mut small = spec(1);
    small.max_num_batched_tokens = Some(100);
    svc.upsert_worker(small, T0).unwrap();
    svc
}

#[test]
fn saturated_workers_queue_requests_until_capacity_frees() {
    let mut svc = queueing(2);
    reserve(&mut svc, 1, &tokens(101, 0));
    let low = request(&svc, 2, &tokens(8, 500));
    assert_eq!(svc.select_and_reserve(low, T0), Ok(Admission::Queued));
    let high = SelectRequest { priority: 5, ..request(&svc, 3, &tokens(8, 900)) };
    assert_eq!(svc.select_and_reserve(high, T0), Ok(Admission::Queued));
    let full = request(&svc, 4, &tokens(8, 0));
    assert_eq!(svc.select_and_reserve(full, T0), Err(SelectError::QueueFull));
    assert_eq!(svc.queue_len(), 2);
    let dup = request(&svc, 2, &tokens(8, 0));
    assert_eq!(svc.select_and_reserve(dup, T0), Err(SelectError::DuplicateReservation(ReservationId(2))));
    assert!(svc.take_admissions().is_empty());

    // Prefill completing frees capacity: the higher priority goes first,
    // and both fit under the threshold.
    svc.prefill_complete(ReservationId(1), T0).unwrap();
    let admitted: Vec<ReservationId> = svc
        .take_admissions()
        .into_iter()
        .map(|e| match e {
            AdmissionEvent::Admitted(sel) => sel.id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(admitted, vec![ReservationId(3), ReservationId(2)]);
    assert_eq!(svc.stats().admitted_from_queue, 2);
    assert_eq!(svc.stats().refused_queue_full, 1);
}

#[test]
fn queued_requests_time_out_or_can_be_withdrawn() {
    let mut svc = queueing(4);
    reserve(&mut svc, 1, &tokens(101, 0));
    for id in [2, 3] {
        let req = request(&svc, id, &tokens(8, 0));
        assert_eq!(svc.select_and_reserve(req, T0), Ok(Admission::Queued));
    }
    svc.free_reservation(ReservationId(3), T0).expect("withdrawn from the queue");
    svc.tick(T0.after(Duration::from_secs(5)));
    assert_eq!(
        svc.take_admissions(),
        vec![AdmissionEvent::Refused { id: ReservationId(2), error: SelectError::QueueTimeout }]
    );
    assert_eq!(svc.queue_len(), 0);
}

#[test]
fn queued_requests_are_refused_when_their_workers_vanish() {
    let mut svc = queueing(4);
    reserve(&mut svc, 1, &tokens(101, 0));
    let req = request(&svc, 2, &tokens(8, 0));
    assert_eq!(svc.select_and_reserve(req, T0), Ok(Admission::Queued));
    svc.delete_worker(WorkerId(1)).unwrap();
    svc.tick(T0);
    assert_eq!(
        svc.take_admissions(),
        vec![AdmissionEvent::Refused { id: ReservationId(2), error: SelectError::NoWorkers }]
    );
}

#[test]
fn without_a_threshold_nothing_queues() {
    let mut svc = service(1, 1, RouterConfig::default());
    let mut spec1 = spec(1);
    spec1.max_num_batched_tokens = Some(1);
    svc.upsert_worker(spec1, T0).unwrap();
    for id in 0..5 {
        reserve(&mut svc, id, &tokens(100, 0));
    }
    assert_eq!(svc.queue_len(), 0);
}

#[test]
fn load_only_prompts_book_blocks_without_hashes() {
    let mut svc = service(1, 1, RouterConfig::default());
    let req = SelectRequest { prompt: Prompt::load_only(10), ..request(&svc, 1, &[]) };
    assert!(matches!(svc.select_and_reserve(req, T0), Ok(Admission::Reserved(_))));
    assert_eq!(load(&svc, 1).active_blocks, 3);
    assert_eq!(load(&svc, 1).prefill_tokens, 10);
}

#[test]
fn select_alone_books_nothing() {
    let mut svc = service(2, 1, RouterConfig::default());
    let req = request(&svc, 1, &tokens(16, 0));
    svc.select(&req).unwrap();
    assert!(svc.loads().iter().all(|l| l.requests == 0));
    assert!(svc.booking(ReservationId(1)).is_none());
}

#[test]
fn a_worker_calibrated_slow_loses_ties_but_keeps_a_long_prompt_it_caches() {
    let cfg = RouterConfig { cost: crate::cost::CostModel::Latency(Default::default()), ..RouterConfig::default() };
    let mut svc = service(3, 2, cfg);
    // Workers 1 and 2 answer as predicted, worker 3 three times slower.
    for n in 0..12u64 {
        for (w, k) in [(1, 1.0), (2, 1.0), (3, 3.0)] {
            let predicted = 2e7 + 1e6 * n as f64;
            svc.observe_ttft(WorkerId(w), predicted, (predicted * k) as u64, T0).unwrap();
        }
    }
    let speed = svc.calibration().speed(WorkerId(3));
    assert!(speed > 2.0, "{speed}");
    // Idle and nothing cached: never the slow worker.
    for id in 0..20 {
        let sel = reserve(&mut svc, id, &tokens(64, 10_000 * (id as u32 + 1)));
        assert_ne!(sel.worker, WorkerId(3));
        svc.free_reservation(sel.id, T0).unwrap();
    }
    // A whole long prompt cached on it still wins: recomputing 400 tokens
    // elsewhere is dearer than a slow step there.
    let long = tokens(400, 7);
    store(&mut svc, 3, &long);
    assert_eq!(reserve(&mut svc, 100, &long).worker, WorkerId(3));
    // The predicted TTFT a selection carries is the priors', before speed.
    let sel = svc.select(&request(&svc, 101, &long)).unwrap();
    assert_eq!(sel.predicted_ttft_ns.map(|p| p * speed), Some(sel.cost));
}

#[test]
fn a_busy_holder_keeps_its_prefix_when_the_other_cache_churns() {
    let cfg = RouterConfig { cost: crate::cost::CostModel::Latency(Default::default()), ..RouterConfig::default() };
    let mut svc = service(2, 1, cfg);
    let prefix = tokens(64, 1);
    store(&mut svc, 1, &prefix);
    // 100 prefill tokens booked on worker 1, the prefix's holder.
    let ahead = reserve(&mut svc, 2, &[prefix.clone(), tokens(100, 60_000)].concat());
    assert_eq!((ahead.worker, ahead.prefill_tokens), (WorkerId(1), 100));
    let asked = [prefix.clone(), tokens(4, 70_000)].concat();
    // Worker 2's cache has room: copying the prefix there is free, and it
    // answers sooner than waiting behind worker 1's prefill.
    assert_eq!(svc.select(&request(&svc, 3, &asked)).unwrap().worker, WorkerId(2));
    // Worker 2 now evicts a block for every block it stores: a copy would
    // push out something else, so the prompt waits for its holder.
    store(&mut svc, 2, &tokens(40, 90_000));
    let evicted: Vec<u64> = (0..10).map(|b| 2 << 32 | b).collect();
    svc.apply_kv_event(WorkerId(2), &KvEvent::Removed { block_hashes: evicted }).unwrap();
    assert_eq!(svc.select(&request(&svc, 4, &asked)).unwrap().worker, WorkerId(1));
    // Cleared (a restart): an empty cache, not a churning one.
    svc.apply_kv_event(WorkerId(2), &KvEvent::Cleared).unwrap();
    assert_eq!(svc.select(&request(&svc, 5, &asked)).unwrap().worker, WorkerId(2));
}

#[test]
fn only_tokenized_prompts_carry_a_prediction_to_learn_from() {
    let cfg = RouterConfig { cost: crate::cost::CostModel::Latency(Default::default()), ..RouterConfig::default() };
    let mut svc = service(2, 1, cfg);
    assert!(svc.select(&request(&svc, 1, &tokens(40, 1))).unwrap().predicted_ttft_ns.is_some());
    let guessed = SelectRequest { prompt: Prompt::load_only(400), ..request(&svc, 2, &[]) };
    assert_eq!(svc.select(&guessed).unwrap().predicted_ttft_ns, None);
    // Dynamo's cost predicts no time at all.
    let mut dynamo = service(2, 1, RouterConfig::default());
    assert_eq!(dynamo.select(&request(&dynamo, 3, &tokens(40, 1))).unwrap().predicted_ttft_ns, None);
}

#[test]
fn the_tpot_guard_sends_a_prompt_past_its_busy_holder_only_when_asked() {
    let guarded = |target: Option<Duration>| RouterConfig {
        cost: crate::cost::CostModel::Latency(Default::default()),
        tpot_target: target,
        ..RouterConfig::default()
    };
    for (target, expected) in [(None, WorkerId(1)), (Some(Duration::from_millis(8)), WorkerId(2))] {
        let mut svc = service(2, 1, guarded(target));
        let prefix = tokens(400, 1);
        store(&mut svc, 1, &prefix);
        // Twelve short requests decoding on worker 1, the prefix's holder:
        // a decode step there takes 5 ms + 13 × 250 µs = 8.25 ms.
        for id in 0..12 {
            let sel = reserve(&mut svc, id, &[prefix.clone(), tokens(1, 50_000 + id as u32)].concat());
            assert_eq!(sel.worker, WorkerId(1));
            svc.prefill_complete(sel.id, T0).unwrap();
        }
        let asked = [prefix.clone(), tokens(16, 90_000)].concat();
        assert_eq!(svc.select(&request(&svc, 100, &asked)).unwrap().worker, expected, "target {target:?}");
    }
    // Every worker past the target: the guard orders nothing, TTFT decides.
    // The booking is counted: the fleet is too busy for the target.
    let mut svc = service(2, 1, guarded(Some(Duration::from_millis(1))));
    store(&mut svc, 1, &tokens(400, 1));
    let sel = reserve(&mut svc, 1, &tokens(400, 1));
    assert_eq!((sel.worker, sel.past_tpot_target), (WorkerId(1), true));
    assert_eq!(svc.stats().past_tpot_target, 1);
    let within = reserve(&mut service(2, 1, guarded(Some(Duration::from_millis(8)))), 1, &tokens(40, 1));
    assert!(!within.past_tpot_target);
}

#[test]
fn a_renewed_lease_outlives_the_first_and_ends_a_lease_after_the_last_renewal() {
    let cfg = RouterConfig { lease: Duration::from_secs(10), ..RouterConfig::default() };
    let mut svc = service(2, 1, cfg);
    let sel = reserve(&mut svc, 1, &tokens(40, 1));
    let at = |ms: u64| T0.after(Duration::from_millis(ms));
    svc.renew_lease(sel.id, at(8_000)).unwrap();
    // An earlier end never shortens it.
    svc.renew_lease(sel.id, at(1_000)).unwrap();
    svc.tick(at(12_000));
    assert_eq!(load(&svc, sel.worker.0).requests, 1, "renewed at 8 s: alive at 12 s");
    assert_eq!(svc.shard_stats().leases_expired, 0);
    svc.tick(at(18_000));
    assert_eq!(load(&svc, sel.worker.0).requests, 0);
    assert_eq!(svc.shard_stats().leases_expired, 1);
    assert_eq!(svc.renew_lease(sel.id, at(19_000)), Err(BookingError::NotFound(sel.id)));
}

#[test]
fn a_booking_moves_to_the_worker_the_gateway_says_served() {
    let mut svc = service(3, 2, RouterConfig::default());
    let sel = reserve(&mut svc, 1, &tokens(40, 1));
    let before = load(&svc, sel.worker.0);
    assert_eq!(before.requests, 1);
    assert!(before.prefill_tokens > 0);
    let other = (1..=3).find(|w| WorkerId(*w) != sel.worker).unwrap();
    // Where it is already: nothing moves.
    assert_eq!(svc.move_booking(sel.id, addr(sel.worker.0), T0), Ok(None));
    assert_eq!(svc.move_booking(sel.id, addr(other), T0), Ok(Some(WorkerId(other))));
    assert_eq!(load(&svc, sel.worker.0).requests, 0);
    assert_eq!(load(&svc, sel.worker.0).prefill_tokens, 0);
    let moved = load(&svc, other);
    assert_eq!((moved.requests, moved.prefill_tokens), (1, before.prefill_tokens));
    // Its lifecycle follows it: prefill completes and the free finds it there.
    svc.prefill_complete(sel.id, T0).unwrap();
    assert_eq!(load(&svc, other).prefill_tokens, 0);
    let elsewhere = (1..=3).find(|w| *w != other).unwrap();
    assert_eq!(svc.move_booking(sel.id, addr(elsewhere), T0), Ok(Some(WorkerId(elsewhere))));
    assert_eq!(load(&svc, elsewhere).prefill_tokens, 0, "prefill stays complete");
    svc.free_reservation(sel.id, T0).unwrap();
    assert!((1..=3).all(|w| load(&svc, w).requests == 0));
    // Unknown endpoints and freed bookings move nothing.
    let sel = reserve(&mut svc, 2, &tokens(40, 1));
    let nowhere: SocketAddr = "10.9.9.9:1".parse().unwrap();
    assert_eq!(svc.move_booking(sel.id, nowhere, T0), Err(BookingError::UnknownEndpoint(nowhere)));
    assert_eq!(load(&svc, sel.worker.0).requests, 1);
    svc.free_reservation(sel.id, T0).unwrap();
    assert_eq!(svc.move_booking(sel.id, addr(other), T0), Err(BookingError::NotFound(sel.id)));
}

#[test]
fn without_a_queue_saturated_workers_shed_at_once() {
    let mut svc = queueing(0);
    let under = request(&svc, 1, &tokens(101, 0));
    assert!(matches!(svc.select_and_reserve(under, T0), Ok(Admission::Reserved(_))));
    let over = request(&svc, 2, &tokens(8, 500));
    assert_eq!(svc.select_and_reserve(over, T0), Err(SelectError::QueueFull));
    assert_eq!((svc.queue_len(), svc.stats().refused_queue_full), (0, 1));
    // Capacity back: admitted again.
    svc.prefill_complete(ReservationId(1), T0).unwrap();
    assert!(matches!(svc.select_and_reserve(request(&svc, 3, &tokens(8, 900)), T0), Ok(Admission::Reserved(_))));
}

#[test]
fn a_session_sticks_to_its_worker_until_it_costs_a_margin_more() {
    let mut svc = service(2, 1, RouterConfig::default());
    // Worker 1 a little busier than worker 2: without affinity, worker 2.
    let busy = reserve(&mut svc, 1, &tokens(8, 100));
    assert_eq!(busy.worker, WorkerId(1));
    let asked = |svc: &SelectionService, id, sticky| SelectRequest { sticky, ..request(svc, id, &tokens(40, 7)) };
    assert_eq!(svc.select(&asked(&svc, 2, None)).unwrap().worker, WorkerId(2));
    assert_eq!(svc.select(&asked(&svc, 3, Some(WorkerId(1)))).unwrap().worker, WorkerId(1), "within the margin");
    // Sessions on worker 1 stay there while within the margin, then yield
    // to cost: load stays near balance instead of piling on.
    for id in 10..30 {
        let sticky = SelectRequest { sticky: Some(WorkerId(1)), ..request(&svc, id, &tokens(40, id as u32 * 1000)) };
        assert!(matches!(svc.select_and_reserve(sticky, T0), Ok(Admission::Reserved(_))));
    }
    let (one, two) = (load(&svc, 1).requests, load(&svc, 2).requests);
    assert!(two >= 5 && one > two, "{one} on worker 1, {two} on worker 2");
    // Much busier (a long prompt booked there alone): the session leaves.
    let mut only_one = EndpointFilter::default();
    only_one.allow_ip(addr(1).ip());
    let long = SelectRequest { allowed: Some(only_one), ..request(&svc, 40, &tokens(4_000, 5)) };
    assert_eq!(svc.select_and_reserve(long, T0).map(|_| ()), Ok(()));
    assert_eq!(svc.select(&asked(&svc, 41, Some(WorkerId(1)))).unwrap().worker, WorkerId(2), "past the margin");
    // A sticky worker that is not a candidate (gone, or outside the subset) is ignored.
    assert_eq!(svc.select(&asked(&svc, 31, Some(WorkerId(9)))).unwrap().worker, WorkerId(2));
}

#[test]
fn a_worker_whose_events_carry_another_block_size_is_flagged_until_they_agree() {
    let mut svc = service(2, 1, RouterConfig::default());
    let wrong = KvEvent::Stored {
        block_hashes: vec![1, 2],
        parent: None,
        token_ids: tokens(4 * BS, 1),
        block_size: 2 * BS,
        seed: HashSeed::default(),
    };
    assert_eq!(
        svc.apply_kv_event(WorkerId(1), &wrong),
        Err(crate::index::EventError::BlockSizeMismatch { event: 2 * BS, worker: BS })
    );
    assert_eq!(load(&svc, 1).block_size_mismatch, Some(2 * BS));
    assert_eq!((load(&svc, 1).cached_blocks, load(&svc, 2).block_size_mismatch), (0, None));
    // Fixed (an event of the right size): no longer flagged.
    store(&mut svc, 1, &tokens(2 * BS, 9));
    assert_eq!(load(&svc, 1).block_size_mismatch, None);
    assert_eq!(load(&svc, 1).cached_blocks, 2);
}

/// Two replicas of one fleet: what one books reaches the other through
/// its outbox and the other's inbox, and is applied there exactly as
/// booked, so both cost the fleet's load alike; freeing undoes it.
#[test]
fn a_peer_replicas_bookings_count_here_as_its_own_do() {
    use crate::replica::{Inbox, InboxConfig, Incarnation, Outbox, ReplicaId};

    for shards in [1, 2] {
        let cfg = RouterConfig::default();
        let (mut a, mut b) = (service(3, shards, cfg.clone()), service(3, shards, cfg));
        let mut outbox = Outbox::new(ReplicaId(1), Incarnation(1));
        let mut inbox = Inbox::new(ReplicaId(1), InboxConfig::default());
        let mut send = |a: &SelectionService, b: &mut SelectionService, event: BookingEvent| {
            assert!(outbox.record(&event, T0));
            let batch = outbox.take_batch().unwrap();
            let known: Vec<WorkerId> = b.worker_ids();
            for event in inbox.receive(&batch, T0, |w| known.contains(&w)).apply {
                b.apply_peer_booking(ReplicaId(1), event, T0).unwrap();
            }
            assert_eq!(a.loads(), b.loads(), "{shards} shards");
        };
        let toks = tokens(40, 0);
        let picked = reserve(&mut a, 7, &toks);
        let booking = a.booking(ReservationId(7)).unwrap().clone();
        send(&a, &mut b, BookingEvent::Reserved(booking));
        assert_eq!(b.active_reservations(), 1);
        assert_eq!(b.booking(ReservationId(7)).map(|bk| bk.worker), Some(picked.worker));
        // Without sharing, a replica puts the next request on the worker A
        // loaded (all look idle to it); sharing, B avoids it.
        let mut unshared = service(3, shards, RouterConfig::default());
        assert_eq!(reserve(&mut unshared, 8, &tokens(40, 1000)).worker, picked.worker);
        assert_ne!(reserve(&mut b, 8, &tokens(40, 1000)).worker, picked.worker);
        b.free_reservation(ReservationId(8), T0).unwrap();

        a.prefill_complete(ReservationId(7), T0).unwrap();
        send(&a, &mut b, BookingEvent::PrefillComplete(ReservationId(7)));
        a.free_reservation(ReservationId(7), T0).unwrap();
        send(&a, &mut b, BookingEvent::Freed(ReservationId(7)));
        assert_eq!(b.active_reservations(), 0);
    }
}

#[test]
fn a_peer_cannot_book_twice_on_an_unknown_worker_or_touch_what_it_did_not_book() {
    use crate::replica::ReplicaId;
    let (a, b) = (ReplicaId(1), ReplicaId(2));
    let mut svc = service(2, 1, RouterConfig::default());
    let mine = reserve(&mut svc, 1, &tokens(8, 0));
    let mut booking = svc.booking(ReservationId(1)).unwrap().clone();
    assert_eq!(
        svc.apply_peer_booking(a, BookingEvent::Reserved(booking.clone()), T0),
        Err(BookingError::Duplicate(ReservationId(1)))
    );
    // Refused, it gives the peer no hold on this replica's own booking.
    for event in [
        BookingEvent::PrefillComplete(ReservationId(1)),
        BookingEvent::Renewed { id: ReservationId(1), lease_until: T0.after(Duration::from_secs(9_000)) },
        BookingEvent::Freed(ReservationId(1)),
    ] {
        assert_eq!(svc.apply_peer_booking(a, event, T0), Err(BookingError::NotFound(ReservationId(1))));
    }
    assert_eq!(
        svc.booking(ReservationId(1)).map(|bk| (bk.worker, bk.lease_until)),
        Some((mine.worker, booking.lease_until))
    );

    booking.id = ReservationId(2);
    booking.worker = WorkerId(99);
    assert_eq!(
        svc.apply_peer_booking(a, BookingEvent::Reserved(booking.clone()), T0),
        Err(BookingError::UnknownWorker(WorkerId(99)))
    );
    assert_eq!(
        svc.apply_peer_booking(a, BookingEvent::Freed(ReservationId(2)), T0),
        Err(BookingError::NotFound(ReservationId(2)))
    );
    booking.worker = mine.worker;
    svc.apply_peer_booking(a, BookingEvent::Reserved(booking), T0).unwrap();
    assert_eq!(svc.active_reservations(), 2);
    // Neither another peer nor this replica's own calls may change it.
    assert_eq!(
        svc.apply_peer_booking(b, BookingEvent::Freed(ReservationId(2)), T0),
        Err(BookingError::NotFound(ReservationId(2)))
    );
    assert_eq!(svc.free_reservation(ReservationId(2), T0), Err(BookingError::NotFound(ReservationId(2))));
    assert_eq!(svc.prefill_complete(ReservationId(2), T0), Err(BookingError::NotFound(ReservationId(2))));
    assert_eq!(svc.renew_lease(ReservationId(2), T0), Err(BookingError::NotFound(ReservationId(2))));
    svc.apply_peer_booking(a, BookingEvent::Freed(ReservationId(2)), T0).unwrap();
    assert_eq!(svc.active_reservations(), 1);
}

/// A tick tells this replica's own expired bookings (for its outbox) from
/// its peers' (for their inboxes).
#[test]
fn a_tick_says_whose_leases_ran_out() {
    use crate::replica::ReplicaId;
    let cfg = RouterConfig { lease: Duration::from_secs(10), ..RouterConfig::default() };
    let mut svc = service(2, 2, cfg);
    reserve(&mut svc, 1, &tokens(8, 0));
    let mut peer = svc.booking(ReservationId(1)).unwrap().clone();
    peer.id = ReservationId(2);
    peer.lease_until = T0.after(Duration::from_secs(5));
    svc.apply_peer_booking(ReplicaId(3), BookingEvent::Reserved(peer), T0).unwrap();
    assert_eq!(
        svc.tick(T0.after(Duration::from_secs(6))),
        Expired { own: vec![], peers: vec![(ReplicaId(3), ReservationId(2))] }
    );
    assert_eq!(svc.tick(T0.after(Duration::from_secs(11))), Expired { own: vec![ReservationId(1)], peers: vec![] });
    assert_eq!(svc.active_reservations(), 0);
}
