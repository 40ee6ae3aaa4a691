//! The thread-per-core runtime against the single-threaded facade, same
//! run: KV-event ingest throughput, selection latency (the hand-off's
//! cost), and the SPSC ring choice.
//!
//! `cargo run --release -p kvpick-perf --bin kvpick-bench-runtime [-- --quick]`

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_lite::future::block_on;
use kvpick_core::hashing::HashSeed;
use kvpick_core::runtime::{Clock, RuntimeChoice, RuntimeConfig, RuntimeKind, ShardedService, probe_glommio};
use kvpick_core::{KvEvent, Millis, Prompt, ReservationId, RouterConfig, SelectRequest, SelectionService, WorkerId};
use kvpick_perf::measure::Latencies;
use kvpick_perf::report::{Table, cpu, load_average, millions, ns, utc_date};
use kvpick_perf::setup::worker_spec;
use kvpick_perf::workload::BLOCK_SIZE;

const WORKERS: u32 = 64;
const BLOCKS_PER_EVENT: usize = 16;
/// The runtime's default.
const SPIN: Duration = Duration::from_micros(50);

/// Events storing `BLOCKS_PER_EVENT`-block chains, round-robin over workers.
fn events(count: usize, seed: u64) -> Vec<(WorkerId, KvEvent)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..count)
        .map(|i| {
            let worker = WorkerId((i % WORKERS as usize) as u64);
            let tokens: Vec<u32> = (0..BLOCKS_PER_EVENT * BLOCK_SIZE as usize).map(|_| rng.u32(..50_000)).collect();
            let hashes = (0..BLOCKS_PER_EVENT as u64).map(|b| (i as u64) << 8 | b).collect();
            (
                worker,
                KvEvent::Stored {
                    block_hashes: hashes,
                    parent: None,
                    token_ids: tokens,
                    block_size: BLOCK_SIZE,
                    seed: HashSeed::default(),
                },
            )
        })
        .collect()
}

fn runtime(shards: usize, kind: RuntimeKind, spin: Duration) -> RuntimeConfig {
    // Shards on the highest cores, the caller (producer) free to run on core 0.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    RuntimeConfig {
        shards,
        cpus: (0..shards).map(|i| (cores - 1).saturating_sub(i % cores)).collect(),
        choice: RuntimeChoice::Force(kind),
        ring_capacity: 4096,
        selection_wait: Duration::from_secs(1),
        spin_before_park: spin,
    }
}

fn start(shards: usize, kind: RuntimeKind, spin: Duration) -> Arc<ShardedService> {
    let service =
        ShardedService::start(RouterConfig::default(), BLOCK_SIZE, runtime(shards, kind, spin), Clock::system())
            .expect("runtime starts");
    let producer = RefCell::new(service.producer());
    for w in 0..WORKERS {
        block_on(service.upsert_worker(&producer, worker_spec(w), Millis(0))).expect("upsert");
    }
    Arc::new(service)
}

/// Blocks per second applied by the facade on this thread.
fn facade_ingest(events: &[(WorkerId, KvEvent)]) -> f64 {
    let mut facade = SelectionService::new(RouterConfig::default(), BLOCK_SIZE, 1);
    for w in 0..WORKERS {
        facade.upsert_worker(worker_spec(w), Millis(0)).expect("upsert");
    }
    let start = Instant::now();
    for (worker, event) in events {
        facade.apply_kv_event(*worker, event).expect("worker exists");
    }
    (events.len() * BLOCKS_PER_EVENT) as f64 / start.elapsed().as_secs_f64()
}

/// Blocks per second from one producer thread through the rings until every
/// shard has applied everything.
fn threaded_ingest(service: &ShardedService, events: Vec<(WorkerId, KvEvent)>) -> f64 {
    let control = RefCell::new(service.producer());
    let before = block_on(service.shard_stats(&control)).blocks_stored;
    let blocks = (events.len() * BLOCKS_PER_EVENT) as u64;
    let mut producer = service.producer();
    let start = Instant::now();
    for (worker, event) in events {
        service.apply_kv_event(&mut producer, worker, event).expect("worker exists");
    }
    while block_on(service.shard_stats(&control)).blocks_stored < before + blocks {
        std::thread::yield_now();
    }
    blocks as f64 / start.elapsed().as_secs_f64()
}

fn prompt(i: u64) -> Prompt {
    // 1,024 tokens; a quarter of the prompts share a 512-token prefix.
    let tokens: Vec<u32> = (0..1024u32)
        .map(|t| if t < 512 && i % 4 == 0 { t } else { t ^ (i as u32).wrapping_mul(2_654_435_761) })
        .collect();
    Prompt::from_tokens(&tokens, BLOCK_SIZE, HashSeed::default())
}

fn request(i: u64, prompts: &[Prompt]) -> SelectRequest {
    SelectRequest {
        id: ReservationId(i),
        prompt: prompts[i as usize % prompts.len()].clone(),
        model: None,
        allowed: None,
        priority: 0,
    }
}

fn facade_selection(iters: u64, prompts: &[Prompt], warm: &[(WorkerId, KvEvent)]) -> Latencies {
    let mut facade = SelectionService::new(RouterConfig::default(), BLOCK_SIZE, 1);
    for w in 0..WORKERS {
        facade.upsert_worker(worker_spec(w), Millis(0)).expect("upsert");
    }
    for (worker, event) in warm {
        facade.apply_kv_event(*worker, event).expect("worker exists");
    }
    let mut latencies = Latencies::default();
    for i in 0..iters {
        let start = Instant::now();
        let admission = facade.select_and_reserve(request(i, prompts), Millis(0));
        latencies.record(start.elapsed());
        assert!(admission.is_ok());
        facade.free_reservation(ReservationId(i), Millis(0)).expect("booked");
    }
    latencies
}

fn threaded_selection(
    service: &ShardedService,
    iters: u64,
    prompts: &[Prompt],
    warm: Vec<(WorkerId, KvEvent)>,
) -> Latencies {
    threaded_ingest(service, warm);
    let producer = RefCell::new(service.producer());
    let mut latencies = Latencies::default();
    for i in 0..iters {
        let start = Instant::now();
        let selection = block_on(service.select_and_wait(&producer, request(i, prompts), Millis(0)));
        latencies.record(start.elapsed());
        assert!(selection.is_ok());
        block_on(service.free_reservation(&producer, ReservationId(i), Millis(0))).expect("booked");
    }
    latencies
}

/// Messages per second between two threads through each queue kind.
fn ring_race(messages: u64) -> Vec<(&'static str, f64)> {
    type Msg = [u64; 8];
    fn run(messages: u64, push: impl FnMut(Msg) -> bool + Send, mut pop: impl FnMut() -> Option<Msg>) -> f64 {
        let done = AtomicBool::new(false);
        let sum = AtomicU64::new(0);
        let start = Instant::now();
        let done_ref = &done;
        std::thread::scope(|scope| {
            let mut push = push;
            scope.spawn(move || {
                for i in 0..messages {
                    let mut msg = [i; 8];
                    while !push(msg) {
                        msg = [i; 8];
                        std::hint::spin_loop();
                    }
                }
                done_ref.store(true, Ordering::Release);
            });
            let mut got = 0;
            while got < messages {
                match pop() {
                    Some(msg) => {
                        sum.fetch_add(msg[0], Ordering::Relaxed);
                        got += 1;
                    }
                    None => std::hint::spin_loop(),
                }
            }
        });
        assert!(done.load(Ordering::Acquire));
        messages as f64 / start.elapsed().as_secs_f64()
    }
    let (mut tx, mut rx) = rtrb::RingBuffer::<Msg>::new(4096);
    let rtrb = run(messages, move |m| tx.push(m).is_ok(), move || rx.pop().ok());
    let queue = Arc::new(crossbeam_queue::ArrayQueue::<Msg>::new(4096));
    let q2 = queue.clone();
    let array = run(messages, move |m| q2.push(m).is_ok(), move || queue.pop());
    let (ctx, crx) = crossbeam_channel::bounded::<Msg>(4096);
    let channel = run(messages, move |m| ctx.try_send(m).is_ok(), move || crx.try_recv().ok());
    vec![
        ("rtrb (SPSC, chosen)", rtrb),
        ("crossbeam ArrayQueue (MPMC)", array),
        ("crossbeam channel (bounded)", channel),
    ]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (ingest_events, select_iters, ring_messages) =
        if quick { (4_000, 2_000, 1_000_000) } else { (40_000, 20_000, 20_000_000) };
    println!("kvpick-bench-runtime — {} — {} — load {}\n", utc_date(), cpu(), load_average());
    let kinds: Vec<RuntimeKind> = match probe_glommio(None) {
        Ok(()) => vec![RuntimeKind::Glommio, RuntimeKind::StdThreads],
        Err(why) => {
            println!("glommio unavailable here ({why}); std threads only\n");
            vec![RuntimeKind::StdThreads]
        }
    };

    let mut table = Table::new(
        format!(
            "KV-event ingest: {ingest_events} BlockStored events of {BLOCKS_PER_EVENT} blocks over {WORKERS} workers"
        ),
        &["runtime", "shards", "M blocks/s", "vs facade", "vs 1 shard"],
    );
    let facade = facade_ingest(&events(ingest_events, 1));
    table.row([
        "facade (caller's thread)".to_owned(),
        "1".to_owned(),
        millions(facade),
        "1.00x".to_owned(),
        String::new(),
    ]);
    for &kind in &kinds {
        let mut one = 0.0;
        for shards in [1, 2] {
            let service = start(shards, kind, SPIN);
            let rate = threaded_ingest(&service, events(ingest_events, 1));
            service.shutdown();
            if shards == 1 {
                one = rate;
            }
            table.row([
                format!("{kind:?}"),
                shards.to_string(),
                millions(rate),
                format!("{:.2}x", rate / facade),
                format!("{:.2}x", rate / one),
            ]);
        }
    }
    table.note(
        "One producer thread pushes pre-built events; the clock stops when the shards report every block applied.",
    );
    table.note("Design target: two shards ≥ 1.8× one shard where the machine has a core per shard plus the producer.");
    println!("{table}");

    let prompts: Vec<Prompt> = (0..256).map(prompt).collect();
    let warm = events(if quick { 2_000 } else { 20_000 }, 2);
    let mut table = Table::new(
        format!("select_and_reserve (1,024-token prompt, {WORKERS} workers), one caller, closed loop"),
        &["runtime", "shards", "spin before park", "p50", "p99", "p999", "p50 added by hand-off"],
    );
    let base = facade_selection(select_iters, &prompts, &warm).summary();
    table.row([
        "facade".to_owned(),
        "1".to_owned(),
        String::new(),
        ns(base.p50),
        ns(base.p99),
        ns(base.p999),
        String::new(),
    ]);
    for &kind in &kinds {
        for (shards, spin) in [(1, Duration::ZERO), (1, SPIN), (2, Duration::ZERO), (2, SPIN)] {
            let service = start(shards, kind, spin);
            let s = threaded_selection(&service, select_iters, &prompts, warm.clone()).summary();
            service.shutdown();
            table.row([
                format!("{kind:?}"),
                shards.to_string(),
                format!("{} µs", spin.as_micros()),
                ns(s.p50),
                ns(s.p99),
                ns(s.p999),
                ns(s.p50.saturating_sub(base.p50)),
            ]);
        }
    }
    table.note("Threaded: scatter to every shard, gather, pick, book on the owner (two round trips), free (one).");
    table.note("Design target: the hand-off adds ≤ 1 µs at p50.");
    println!("{table}");

    let mut table = Table::new(
        format!("Ring choice: {ring_messages} 64-byte messages, one producer, one consumer thread"),
        &["queue", "M msgs/s", "vs rtrb"],
    );
    let results = ring_race(ring_messages);
    let rtrb = results[0].1;
    for (name, rate) in results {
        table.row([name.to_owned(), millions(rate), format!("{:.2}x", rate / rtrb)]);
    }
    println!("{table}");
}
