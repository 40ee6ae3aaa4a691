//! Arbitrary bytes as a TensorRT-LLM `/kv_cache_events` answer: the decoder
//! must never panic, and whatever it accepts must apply to a shard, and its
//! event ids go through the lost-event tracker, without panicking either.
#![no_main]

use kvpick_core::{Shard, WorkerId, WorkerSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(drain) = kvpick_kv_events::wire::trtllm_json::decode_drain(data) else { return };
    let mut ids = kvpick_kv_events::wire::event_ids::EventIdTracker::default();
    let verdict = ids.check(&drain.event_ids);
    // Twice: the second answer is checked against the first's positions.
    let _ = (verdict.index_is_stale(), ids.check(&drain.event_ids));
    let mut shard = Shard::new();
    let worker = WorkerId(7);
    shard.upsert_worker(WorkerSpec::new(worker, std::net::SocketAddr::from(([127, 0, 0, 1], 1)), 16));
    for event in &drain.events {
        if event.decoded.on_device() {
            let _ = shard.apply_event(worker, &event.decoded.event);
        }
    }
});
