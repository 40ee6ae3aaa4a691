//! KV-event decode + apply throughput, from payload bytes to the index, for
//! realistic vLLM batches in both encodings (SGLang's two forms) and for
//! TensorRT-LLM's `/kv_cache_events` JSON answers of the same events,
//! against decode alone and apply alone in the same run.
//!
//! `cargo run --release -p kvpick-perf --bin kvpick-bench-kv-events [-- --quick]`

use std::time::Instant;

use kvpick_core::{Shard, WorkerId};
use kvpick_kv_events::wire;
use kvpick_perf::report::{Table, cpu, load_average, millions, utc_date};
use kvpick_perf::setup::worker_spec;
use kvpick_perf::sim::event_batch::{BatchEncoder, CacheEvent};
use kvpick_perf::sim::event_drain::EventDrain;
use kvpick_perf::sim::{EngineHasher, EventEncoding, HashFormat};

const BLOCK_SIZE: u32 = 16;
const WORKERS: u32 = 8;

/// How a batch goes on the wire.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// vLLM's msgpack batch (SGLang's too: map events since sglang#37482,
    /// positional arrays before).
    Msgpack(EventEncoding),
    /// One `trtllm-serve` drain answer per batch (JSON).
    TrtllmJson,
}

impl Form {
    fn name(self) -> String {
        match self {
            Form::Msgpack(e) => format!("{e:?}"),
            Form::TrtllmJson => "TRT-LLM JSON".into(),
        }
    }
}

/// A payload decoded into indexable events, whatever its form.
fn decode_payload(form: Form, payload: &[u8]) -> Vec<wire::DecodedEvent> {
    match form {
        Form::Msgpack(_) => wire::decode_batch(payload).expect("the simulator's batches decode").events,
        Form::TrtllmJson => {
            let drain = wire::trtllm_json::decode_drain(payload).expect("the simulator's answers decode");
            drain.events.into_iter().map(|e| e.decoded).collect()
        }
    }
}

/// One engine's stream: stores of `blocks` blocks extending a conversation,
/// with an eviction batch after every few stores (a cache at steady state).
fn stream(form: Form, blocks: usize, batches: usize, seed: u64) -> Vec<(WorkerId, Vec<u8>, u64)> {
    let encoding = match form {
        Form::Msgpack(e) => e,
        Form::TrtllmJson => EventEncoding::Map,
    };
    let encoder = BatchEncoder { encoding, hash_format: HashFormat::Int, dp_rank: 0 };
    // A buffer per worker, drained after every batch (one poll per step).
    let drains: Vec<EventDrain> = (0..WORKERS).map(|_| EventDrain::new(usize::MAX, 32_768, None, 4096)).collect();
    for d in &drains {
        d.drain(); // the `created` event
    }
    let hasher = EngineHasher::new(seed);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::with_capacity(batches);
    let mut chains: Vec<Vec<kvpick_perf::sim::BlockDigest>> = vec![Vec::new(); WORKERS as usize];
    for i in 0..batches {
        let worker = (i % WORKERS as usize) as u32;
        let chain = &mut chains[worker as usize];
        let tokens: Vec<u32> = (0..blocks * BLOCK_SIZE as usize).map(|_| rng.u32(..50_000)).collect();
        let mut events = Vec::new();
        if chain.len() > 512 {
            // Evict the conversation and start a new one.
            events.push(CacheEvent::Removed { hashes: std::mem::take(chain) });
        }
        let parent = chain.last().copied();
        let mut hashes = Vec::with_capacity(blocks);
        let mut previous = parent;
        for block in tokens.chunks_exact(BLOCK_SIZE as usize) {
            let digest = hasher.block(previous, block);
            hashes.push(digest);
            previous = Some(digest);
        }
        chain.extend(&hashes);
        let block_events = blocks as u64
            + events
                .iter()
                .map(|e| match e {
                    CacheEvent::Removed { hashes } => hashes.len() as u64,
                    _ => 0,
                })
                .sum::<u64>();
        events.push(CacheEvent::Stored { hashes, parent, token_ids: tokens, block_size: BLOCK_SIZE });
        let payload = match form {
            Form::Msgpack(_) => encoder.encode(i as f64, &events),
            Form::TrtllmJson => {
                let drain = &drains[worker as usize];
                drain.push(&events);
                drain.drain().into_bytes()
            }
        };
        out.push((WorkerId(u64::from(worker)), payload, block_events));
    }
    out
}

fn shard() -> Shard {
    let mut shard = Shard::new();
    for w in 0..WORKERS {
        let mut spec = worker_spec(w);
        spec.block_size = BLOCK_SIZE;
        shard.upsert_worker(spec);
    }
    shard
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let total_blocks: usize = if quick { 200_000 } else { 4_000_000 };
    println!("kvpick-bench-kv-events — {} — {} — load {}\n", utc_date(), cpu(), load_average());
    let mut table = Table::new(
        format!("Decode + apply, {total_blocks} stored blocks per row (plus evictions), one core"),
        &[
            "encoding",
            "blocks/event",
            "decode M blk/s",
            "apply M blk/s",
            "decode+apply M blk/s",
            "vs 2 M target",
            "bytes/block",
        ],
    );
    let forms = [Form::Msgpack(EventEncoding::Map), Form::Msgpack(EventEncoding::Array), Form::TrtllmJson];
    for form in forms {
        for blocks in [1usize, 16, 64] {
            let batches = total_blocks / blocks;
            let payloads = stream(form, blocks, batches, 7);
            let bytes: usize = payloads.iter().map(|p| p.1.len()).sum();
            let block_events: u64 = payloads.iter().map(|p| p.2).sum();

            let start = Instant::now();
            let mut decoded = Vec::with_capacity(payloads.len());
            for (worker, payload, _) in &payloads {
                decoded.push((*worker, decode_payload(form, payload)));
            }
            let decode = block_events as f64 / start.elapsed().as_secs_f64();

            let mut apply_only = shard();
            let start = Instant::now();
            for (worker, events) in &decoded {
                for event in events {
                    apply_only.apply_event(*worker, &event.event).expect("consistent stream");
                }
            }
            let apply = block_events as f64 / start.elapsed().as_secs_f64();
            drop(decoded);

            let mut end_to_end = shard();
            let start = Instant::now();
            for (worker, payload, _) in &payloads {
                for event in decode_payload(form, payload) {
                    end_to_end.apply_event(*worker, &event.event).expect("consistent stream");
                }
            }
            let both = block_events as f64 / start.elapsed().as_secs_f64();
            table.row([
                form.name(),
                blocks.to_string(),
                millions(decode),
                millions(apply),
                millions(both),
                format!("{:.2}x", both / 2e6),
                format!("{:.0}", bytes as f64 / block_events as f64),
            ]);
        }
    }
    table.note("Payloads are vLLM-shaped batches from the simulated engine's encoder (byte-identical to msgspec's),");
    table.note("and the same events as trtllm-serve answers them (KVCacheEventSerializer + FastAPI's compact JSON).");
    table.note("Block events: every stored and every removed block; apply includes hashing the tokens (xxh3).");
    println!("{table}");
}
