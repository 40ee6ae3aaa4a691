//! Warm start's index frames (`IndexFrame`) from a replica that may lie,
//! through `kvpick_replica::decode_piece` and `WorkerParts` into a KV
//! index (`KvIndex::import_worker`).
//!
//! The input is a sequence of frames, each a little-endian `u16` length
//! and that many bytes. Invariants: no panic; a worker put together
//! re-encodes (in parts, under a small frame cap) to frames that put
//! together the same worker; an accepted import leaves the index whole
//! (its entries are the worker's blocks) and exports what an import of
//! that export gives again; any accepted import survives a removal of
//! every block it holds, one by one, back to an empty index.

#![no_main]

use kvpick_core::index::KvIndex;
use kvpick_replica::IndexLimits;
use kvpick_replica::wire::{IndexPiece, WorkerParts, decode_piece, encode_worker};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Small caps so the fuzzer reaches them.
    let limits = IndexLimits { max_frame_bytes: 4096, max_blocks_per_worker: 64, max_groups: 8 };
    let mut parts = WorkerParts::default();
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (bytes, tail) = rest[2..].split_at(len);
        rest = tail;
        let Ok(piece) = decode_piece(bytes, &limits) else { continue };
        let Ok(Some(IndexPiece::Worker { index, .. })) = parts.take(piece, &limits) else { continue };

        let small = IndexLimits { max_frame_bytes: 600, ..limits };
        let mut again = WorkerParts::default();
        let mut whole = None;
        for frame in encode_worker(&index, &small) {
            let piece = decode_piece(&frame, &limits).expect("a frame of ours decodes");
            if let Some(IndexPiece::Worker { index, .. }) = again.take(piece, &limits).expect("our parts go together") {
                whole = Some(index);
            }
        }
        assert_eq!(whole.as_ref(), Some(&index), "re-encoding changed the worker");

        for budget in [None, Some(16)] {
            let mut kv = KvIndex::with_max_entries(budget);
            kv.add_worker(0);
            if kv.import_worker(0, &index.snapshot.blocks).is_err() {
                continue;
            }
            assert_eq!(kv.entries(), kv.worker_blocks(0) as u64);
            let export = kv.export_worker(0).expect("the worker is there");
            let mut copy = KvIndex::default();
            copy.add_worker(0);
            copy.import_worker(0, &export).expect("an export of ours imports");
            assert_eq!(copy.export_worker(0).map(|e| e.sorted()), Some(export.clone().sorted()));
            let engines: Vec<u64> = export.blocks.iter().map(|b| b.engine).collect();
            for engine in engines {
                kv.remove(0, &[engine]).expect("the worker is there");
                assert_eq!(kv.entries(), kv.worker_blocks(0) as u64);
            }
            assert_eq!(kv.entries(), 0);
        }
    }
});
