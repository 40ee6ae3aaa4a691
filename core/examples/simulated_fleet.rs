//! Routes a multi-turn chat workload over a simulated fleet of engines with
//! kvpick's selection core, and compares the engines' prefix-cache hit rate
//! with round-robin routing on the same workload.
//!
//! The engines here are deliberately small: an LRU prefix cache of fixed
//! size that hashes blocks its own way (like vLLM, opaque to the router)
//! and reports what it stores and evicts as `KvEvent`s.
//!
//! `cargo run --release -p kvpick-core --example simulated_fleet`

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use kvpick_core::hashing::HashSeed;
use kvpick_core::{
    Admission, KvEvent, Millis, ReservationId, RouterConfig, SelectRequest, SelectionService, WorkerId, WorkerSpec,
};
use xxhash_rust::xxh3::xxh3_64_with_seed;

const BLOCK: u32 = 16;
const ENGINES: u64 = 4;
const CACHE_BLOCKS: usize = 1_200;
const CONVERSATIONS: usize = 48;
const TURNS: usize = 6;
const IN_FLIGHT: usize = 8;

/// One engine's prefix cache.
struct Engine {
    /// engine block hash → last use
    cached: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
    clock: u64,
}

impl Engine {
    fn new() -> Self {
        Engine { cached: HashMap::new(), by_age: BTreeMap::new(), clock: 0 }
    }

    fn touch(&mut self, hash: u64) {
        self.clock += 1;
        if let Some(old) = self.cached.insert(hash, self.clock) {
            self.by_age.remove(&old);
        }
        self.by_age.insert(self.clock, hash);
    }

    /// Serves a prompt: returns the cached prefix in blocks and the events
    /// the engine publishes (new blocks stored, old ones evicted).
    fn serve(&mut self, tokens: &[u32]) -> (usize, Vec<KvEvent>) {
        // The engine's own chained hash: the router cannot recompute it.
        let mut hashes = Vec::new();
        let mut parent = 0u64;
        for block in tokens.chunks_exact(BLOCK as usize) {
            let mut bytes = parent.to_le_bytes().to_vec();
            bytes.extend(block.iter().flat_map(|t| t.to_le_bytes()));
            parent = xxh3_64_with_seed(&bytes, 0xe9);
            hashes.push(parent);
        }
        let hits = hashes.iter().take_while(|h| self.cached.contains_key(h)).count();
        let mut events = Vec::new();
        if hits < hashes.len() {
            events.push(KvEvent::Stored {
                token_ids: tokens[hits * BLOCK as usize..hashes.len() * BLOCK as usize].to_vec(),
                block_hashes: hashes[hits..].to_vec(),
                parent: hits.checked_sub(1).map(|i| hashes[i]),
                block_size: BLOCK,
                seed: HashSeed::default(),
            });
        }
        for hash in &hashes {
            self.touch(*hash);
        }
        let mut evicted = Vec::new();
        while self.cached.len() > CACHE_BLOCKS {
            let (_, hash) = self.by_age.pop_first().expect("cache over capacity is non-empty");
            self.cached.remove(&hash);
            evicted.push(hash);
        }
        if !evicted.is_empty() {
            events.push(KvEvent::Removed { block_hashes: evicted });
        }
        (hits, events)
    }
}

/// Request `i`: (conversation, turn, prompt tokens).
fn workload(seed: u64) -> Vec<(usize, usize, Vec<u32>)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let system: Vec<Vec<u32>> = (0..8).map(|_| (0..256).map(|_| rng.u32(..50_000)).collect()).collect();
    let mut histories: Vec<Vec<u32>> = (0..CONVERSATIONS).map(|c| system[c % 8].clone()).collect();
    let mut turns = vec![0; CONVERSATIONS];
    let mut out = Vec::new();
    while out.len() < CONVERSATIONS * TURNS {
        let c = rng.usize(..CONVERSATIONS);
        if turns[c] == TURNS {
            continue;
        }
        histories[c].extend((0..rng.usize(40..120)).map(|_| rng.u32(..50_000)));
        out.push((c, turns[c], histories[c].clone()));
        // The assistant's answer joins the history for the next turn.
        histories[c].extend((0..rng.usize(100..300)).map(|_| rng.u32(..50_000)));
        turns[c] += 1;
    }
    out
}

struct Outcome {
    hit_tokens: usize,
    prompt_tokens: usize,
    per_engine: Vec<usize>,
}

fn run(workload: &[(usize, usize, Vec<u32>)], kv_aware: bool, print: usize) -> Outcome {
    let mut svc = SelectionService::new(RouterConfig::default(), BLOCK, 2);
    let now = Millis(0);
    for i in 0..ENGINES {
        let endpoint = SocketAddr::from(([10, 0, 0, i as u8 + 1], 8000));
        svc.upsert_worker(WorkerSpec::new(WorkerId(i), endpoint, BLOCK), now).expect("block sizes match");
    }
    let mut engines: Vec<Engine> = (0..ENGINES).map(|_| Engine::new()).collect();
    let mut outcome = Outcome { hit_tokens: 0, prompt_tokens: 0, per_engine: vec![0; ENGINES as usize] };
    if print > 0 {
        println!(
            "{:>4} {:>5} {:>4} {:>7} {:>12} {:>9} {:>13}",
            "req", "conv", "turn", "tokens", "worker", "overlap", "engine cached"
        );
    }
    for (i, (conv, turn, tokens)) in workload.iter().enumerate() {
        let id = ReservationId(i as u64);
        let (worker, predicted) = if kv_aware {
            let request = SelectRequest {
                id,
                prompt: svc.prompt(tokens, HashSeed::default()),
                model: None,
                allowed: None,
                priority: 0,
                sticky: None,
            };
            match svc.select_and_reserve(request, now) {
                Ok(Admission::Reserved(sel)) => (sel.worker, sel.overlap_blocks),
                other => panic!("the demo fleet always has a worker: {other:?}"),
            }
        } else {
            (WorkerId(i as u64 % ENGINES), 0)
        };
        let (hits, events) = engines[worker.0 as usize].serve(tokens);
        for event in &events {
            if let Err(e) = svc.apply_kv_event(worker, event) {
                eprintln!("event from worker {} not applied: {e}", worker.0);
            }
        }
        if kv_aware {
            let _ = svc.prefill_complete(id, now);
            if i >= IN_FLIGHT {
                let _ = svc.free_reservation(ReservationId((i - IN_FLIGHT) as u64), now);
            }
        }
        outcome.hit_tokens += hits * BLOCK as usize;
        outcome.prompt_tokens += tokens.len();
        outcome.per_engine[worker.0 as usize] += 1;
        if i < print {
            println!(
                "{i:>4} {conv:>5} {turn:>4} {:>7} {:>12} {predicted:>9} {hits:>13}",
                tokens.len(),
                format!("10.0.0.{}", worker.0 + 1)
            );
        }
    }
    outcome
}

fn main() {
    let workload = workload(42);
    println!(
        "kvpick selection core on a simulated fleet: {ENGINES} engines x {CACHE_BLOCKS} KV blocks of {BLOCK} tokens, \
         {CONVERSATIONS} conversations x {TURNS} turns sharing 8 system prompts\n"
    );
    let kv = run(&workload, true, 16);
    let rr = run(&workload, false, 0);
    println!("\n{:<12} {:>16} {:>24}", "policy", "prefix hit rate", "requests per engine");
    for (name, o) in [("kvpick", &kv), ("round-robin", &rr)] {
        let rate = o.hit_tokens as f64 / o.prompt_tokens as f64;
        println!("{name:<12} {:>15.1}% {:>24}", rate * 100.0, format!("{:?}", o.per_engine));
    }
    let ratio = kv.hit_tokens as f64 / rr.hit_tokens.max(1) as f64;
    println!("\nkvpick reuses {ratio:.2}x the cached prompt tokens of round-robin on the same workload.");
}
