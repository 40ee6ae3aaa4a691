//! Arbitrary bytes as a KV-event payload: the decoder must never panic, and
//! whatever it accepts must apply to a shard without panicking either.
#![no_main]

use kvpick_core::{Shard, WorkerId, WorkerSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = kvpick_kv_events::wire::decode_batch(data) else { return };
    let mut shard = Shard::new();
    let worker = WorkerId(7);
    shard.upsert_worker(WorkerSpec::new(worker, std::net::SocketAddr::from(([127, 0, 0, 1], 1)), 16));
    for event in &batch.events {
        let _ = shard.apply_event(worker, &event.event);
    }
});
