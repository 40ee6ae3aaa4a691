//! kvpick-core structures built from a workload: workers, shards, services,
//! and the `KvEvent` for each workload event.

use std::net::SocketAddr;

use kvpick_core::{EngineBlockHash, HashSeed, KvEvent, RouterConfig, SelectionService, Shard, WorkerId, WorkerSpec};

use crate::workload::{BLOCK_SIZE, BlockEvent};

/// Headers as Envoy sends them to an ext_proc server: every one,
/// pseudo-headers included, in `raw_value`.
pub fn raw_header_map(pairs: &[(&str, &str)]) -> kvpick_proto::core::HeaderMap {
    kvpick_proto::core::HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| kvpick_proto::core::HeaderValue {
                key: (*k).into(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// A `BlockStored` of the full blocks of `tokens` (prompt number `prompt`)
/// as worker `worker`'s engine would publish it: engine hashes unique to
/// the pair, no parent. For benchmarks that pre-cache prompts.
pub fn cached_prompt(worker: u64, prompt: u64, tokens: &[u32], block_size: u32) -> KvEvent {
    let blocks = tokens.len() / block_size as usize;
    let base: EngineBlockHash = (worker << 40) | (prompt << 20);
    KvEvent::Stored {
        block_hashes: (0..blocks as u64).map(|b| base + b).collect(),
        parent: None,
        token_ids: tokens[..blocks * block_size as usize].to_vec(),
        block_size,
        seed: HashSeed::default(),
    }
}

/// Workload worker `w` is `WorkerId(w)`, at `10.0.x.y:8000`.
pub fn worker_spec(worker: u32) -> WorkerSpec {
    let [_, _, hi, lo] = worker.to_be_bytes();
    let addr = SocketAddr::from(([10, 0, hi, lo], 8000));
    WorkerSpec::new(WorkerId(u64::from(worker)), addr, BLOCK_SIZE)
}

/// A shard holding workers `0..workers`; worker `w` gets slot `w`.
pub fn shard(workers: u32) -> Shard {
    let mut shard = Shard::new();
    for worker in 0..workers {
        shard.upsert_worker(worker_spec(worker));
    }
    shard
}

/// A service with `shards` shards holding workers `0..workers`.
pub fn service(workers: u32, shards: usize) -> SelectionService {
    let mut service = SelectionService::new(RouterConfig::default(), BLOCK_SIZE, shards);
    for worker in 0..workers {
        service
            .upsert_worker(worker_spec(worker), kvpick_core::Millis(0))
            .expect("every workload worker has the service's block size");
    }
    service
}

/// kvpick's form of a workload event.
pub fn kv_event(event: &BlockEvent) -> (WorkerId, KvEvent) {
    let worker = WorkerId(u64::from(event.worker()));
    let event = match event {
        BlockEvent::Stored { parent, hashes, tokens, .. } => KvEvent::Stored {
            block_hashes: hashes.clone(),
            parent: *parent,
            token_ids: tokens.clone(),
            block_size: BLOCK_SIZE,
            seed: HashSeed::default(),
        },
        BlockEvent::Removed { hashes, .. } => KvEvent::Removed { block_hashes: hashes.clone() },
    };
    (worker, event)
}
