//! The whole per-message path of the ingest thread without sockets — frame
//! parsing (live and both replay layouts), sequencing with replays (reading
//! each batch's stamp, as the ingest thread does, so late batches are told
//! from restarts), payload decoding and applying to a shard — driven by
//! arbitrary bytes. The shard's index has a budget of a few entries, so
//! hostile chains drive its eviction too.
#![no_main]

use kvpick_core::index::{ENTRY_BYTES, WORKER_BYTES};
use kvpick_core::{KvEvent, Shard, WorkerId, WorkerSpec};
use kvpick_kv_events::wire::frames::{ReplayReply, parse_live, parse_replay};
use kvpick_kv_events::wire::sequencer::{ReplayEnd, Sequencer, Step};
use kvpick_kv_events::wire::{batch_ts, decode_batch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(data));

/// The index budget, in entries: small enough for short frames to pass it.
/// Given in bytes, as `kvpick serve` gives it: the one worker's fixed cost
/// comes out first.
const INDEX_CAP: u64 = 8;
const INDEX_BYTES: u64 = INDEX_CAP * ENTRY_BYTES + WORKER_BYTES;

/// Splits `data` into messages: byte 0 of each picks live / replay / replay
/// end-failure / replay gone quiet (asked again) / subscribing (catch-up) /
/// live connection back (reconnect), byte 1 the frame count, then frames as `len (1 byte) +
/// bytes`. Panics only if an invariant of the ingest path breaks.
fn run(data: &[u8]) {
    let worker = WorkerId(1);
    let mut shard = Shard::with_max_index_bytes(Some(INDEX_BYTES));
    shard.upsert_worker(WorkerSpec::new(worker, std::net::SocketAddr::from(([127, 0, 0, 1], 8000)), 16));
    let mut sequencer: Sequencer<Vec<u8>> = Sequencer::new(true, 8).with_stamps(|payload| batch_ts(payload));
    let mut steps = Vec::new();
    let mut rest = data;
    let mut last_applied: Option<u64> = None;
    while rest.len() >= 2 {
        let (kind, count) = (rest[0] % 6, rest[1] % 6);
        rest = &rest[2..];
        let mut frames = Vec::new();
        for _ in 0..count {
            let Some((&len, tail)) = rest.split_first() else { break };
            let len = (len as usize).min(tail.len());
            frames.push(tail[..len].to_vec());
            rest = &tail[len..];
        }
        steps.clear();
        match kind {
            0 => {
                if let Ok(message) = parse_live(frames) {
                    sequencer.live(message.seq, message.payload, &mut steps);
                }
            }
            1 => match parse_replay(frames) {
                Ok(ReplayReply::Batch { seq, payload }) => sequencer.replayed(seq, payload, &mut steps),
                Ok(ReplayReply::End) => sequencer.end_replay(ReplayEnd::Completed, &mut steps),
                Err(_) => {}
            },
            2 => sequencer.end_replay(ReplayEnd::Failed, &mut steps),
            3 => sequencer.resume_replay(&mut steps),
            4 => sequencer.catch_up(&mut steps),
            _ => sequencer.reconnected(&mut steps),
        }
        for step in steps.drain(..) {
            match step {
                Step::Apply { seq, payload, .. } => {
                    assert!(last_applied.is_none_or(|last| seq > last), "batch {seq} applied after {last_applied:?}");
                    last_applied = Some(seq);
                    if let Ok(batch) = decode_batch(&payload) {
                        for event in batch.events {
                            let _ = shard.apply_event(worker, &event.event);
                            let held = shard.index().entries();
                            assert!(held <= INDEX_CAP, "{held} entries over a budget of {INDEX_CAP}");
                        }
                    }
                }
                Step::Clear | Step::Rebuild => {
                    last_applied = None;
                    let _ = shard.apply_event(worker, &KvEvent::Cleared);
                }
                _ => {}
            }
        }
    }
}
