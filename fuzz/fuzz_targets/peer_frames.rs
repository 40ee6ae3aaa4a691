//! Peer frames (`kvpick.peer.v1`) from a replica that may lie, through
//! `kvpick_replica::decode` into one origin's `Inbox`.
//!
//! The input is a sequence of frames, each a little-endian `u16` length
//! and that many bytes. Invariants: no panic; a frame that decodes
//! encodes back to bytes that decode to the same frame; the changes the
//! inbox hands the shards apply each booking change exactly once (never a
//! booking twice, never a change to one that is not live) and only on
//! workers this replica knows; an accepted snapshot leaves the shards
//! holding exactly its bookings on known workers; forgetting the origin
//! frees everything.

#![no_main]

use std::collections::HashMap;

use kvpick_core::clock::Millis;
use kvpick_core::replica::{ExactlyOnce, Inbox, InboxConfig, ReplicaId};
use kvpick_core::worker::WorkerId;
use kvpick_replica::{Frame, Limits, SnapshotParts, decode, encode, encode_snapshot};
use libfuzzer_sys::fuzz_target;

/// The workers this replica knows: the even ones.
fn known(worker: WorkerId) -> bool {
    worker.0 % 2 == 0
}

fuzz_target!(|data: &[u8]| {
    // Small caps so the fuzzer reaches them.
    let limits = Limits {
        max_frame_bytes: 4096,
        max_events_per_batch: 16,
        max_bookings_per_snapshot: 16,
        max_blocks_per_booking: 8,
        max_prefill_tokens: 1 << 16,
    };
    let mut inbox = Inbox::new(ReplicaId(1), InboxConfig::default());
    let mut shards = ExactlyOnce::default();
    let mut parts = SnapshotParts::default();
    let mut rest = data;
    let mut now = Millis(0);
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (bytes, tail) = rest[2..].split_at(len);
        rest = tail;
        now = Millis(now.0 + 7);
        let Ok(frame) = decode(bytes, &limits) else { continue };
        assert_eq!(decode(&encode(&frame), &limits).as_ref(), Ok(&frame), "re-encoding changed the frame");
        // Parts are put together as the transport does; a whole snapshot
        // re-encoded in parts must come back the same.
        let frame = match parts.take(frame) {
            Ok(Some(frame)) => frame,
            Ok(None) | Err(_) => continue,
        };
        if let Frame::Snapshot(snapshot) = &frame {
            let small = Limits { max_frame_bytes: 512, max_bookings_per_snapshot: 3, ..limits };
            let mut again = SnapshotParts::default();
            let mut whole = None;
            for bytes in encode_snapshot(snapshot, &small) {
                let part = decode(&bytes, &limits).expect("a part of ours decodes");
                whole = again.take(part).expect("our parts fit");
            }
            assert_eq!(whole.as_ref(), Some(&frame), "a snapshot in parts came back different");
        }
        let resyncs_before = inbox.stats().resyncs;
        let apply = match &frame {
            Frame::Batch(batch) => inbox.receive(batch, now, known).apply,
            Frame::Snapshot(snapshot) => inbox.resync(snapshot, now, known),
            Frame::Digest(digest) => inbox.check(digest).apply,
            Frame::Resync(_) | Frame::SnapshotPart(_) => Vec::new(),
        };
        if let Err(defect) = shards.apply(&apply) {
            panic!("{defect} after {frame:?}");
        }
        assert!(shards.live.values().all(|(worker, _)| known(*worker)), "a stranger was booked");
        assert!(shards.live.len() <= inbox.live());
        let accepted = inbox.stats().resyncs > resyncs_before;
        if let (Frame::Snapshot(snapshot), true) = (&frame, accepted) {
            // An accepted snapshot leaves the shards holding exactly its
            // bookings on known workers (of a repeated id, the last).
            let mut wanted = HashMap::new();
            for booking in &snapshot.bookings {
                wanted.insert(booking.id, (booking.worker, booking.prefill_done));
            }
            wanted.retain(|_, (worker, _)| known(*worker));
            assert_eq!(shards.live, wanted, "the shards differ from the snapshot just applied");
        }
    }
    shards.apply(&inbox.forget()).expect("forgetting frees what is live");
    assert!(shards.live.is_empty(), "forgetting the origin left {:?}", shards.live);
});
