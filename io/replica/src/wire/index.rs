//! Warm start's frames (`IndexFrame`): a ready replica's KV index, one
//! worker at a time, each at its stream's cut, for a replica starting up.
//!
//! Blocks travel as packed columns (engine hash, parent, sequence hash:
//! 24 bytes a block, against ~220 in memory). Every column's length is
//! checked against the others before anything is built, and a worker's
//! blocks over all its parts are capped; the import then rebuilds
//! everything derived (see `kvpick_core::index::snapshot`), so a peer can
//! send wrong hashes (wrong picks, as a lying peer's bookings would) but
//! never an index that breaks.

use kvpick_core::hashing::{HashSeed, SequenceHash};
use kvpick_core::index::{BlockRecord, OrphanRecord, WorkerExport};
use kvpick_core::shard::WorkerSnapshot;
use kvpick_core::worker::WorkerId;
use kvpick_proto::peer as pb;
use prost::Message;

use super::FrameError;

/// One worker's index as a ready replica sends it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerIndex {
    pub worker: WorkerId,
    /// The last KV-event batch the index holds, and its stamp.
    pub last_seq: u64,
    pub last_ts: Option<f64>,
    /// The stream's learned group kinds, by group index.
    pub groups: Vec<Option<bool>>,
    pub snapshot: WorkerSnapshot,
}

/// What an index stream may claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexLimits {
    pub max_frame_bytes: usize,
    /// Over all of a worker's parts (4M blocks, 64M tokens of 16: past
    /// any engine's cache; ~200 MB while a worker is put together).
    pub max_blocks_per_worker: usize,
    pub max_groups: usize,
}

impl Default for IndexLimits {
    fn default() -> Self {
        IndexLimits { max_frame_bytes: 16 << 20, max_blocks_per_worker: 1 << 22, max_groups: 256 }
    }
}

/// One decoded index frame.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexPiece {
    /// A whole worker, or part `part` of `parts` of one.
    Worker {
        index: WorkerIndex,
        part: u32,
        parts: u32,
    },
    End {
        workers: u64,
        blocks: u64,
    },
}

/// The frames of one worker: one, or consecutive parts, each with at most
/// `per_part` blocks and as many orphan records (under 3/4 of a frame
/// however many are seeded); taint and churn in the first.
pub fn encode_worker(index: &WorkerIndex, limits: &IndexLimits) -> Vec<Vec<u8>> {
    // A block is 24 bytes, a seeded one 36, an orphan record 16.
    let per_part = (limits.max_frame_bytes / 2 / 40).max(1);
    let blocks = &index.snapshot.blocks.blocks;
    let orphans = &index.snapshot.blocks.orphaned;
    let count = blocks.len().div_ceil(per_part).max(orphans.len().div_ceil(per_part)).max(1);
    let slice = |all_len: usize, i: usize| (i * per_part).min(all_len)..((i + 1) * per_part).min(all_len);
    let parts = if count > 1 { u32::try_from(count).unwrap_or(u32::MAX) } else { 0 };
    (0..count)
        .map(|i| (i, &blocks[slice(blocks.len(), i)], &orphans[slice(orphans.len(), i)]))
        .map(|(i, chunk, orphans)| {
            let first = i == 0;
            let blocks = &index.snapshot.blocks;
            let (seed_at, seed): (Vec<u32>, Vec<u64>) =
                chunk.iter().enumerate().filter_map(|(at, b)| Some((at as u32, b.seed?.0))).unzip();
            let mut roots = vec![0u8; chunk.len().div_ceil(8)];
            for (at, block) in chunk.iter().enumerate() {
                if block.parent.is_none() {
                    roots[at / 8] |= 1 << (at % 8);
                }
            }
            let worker = pb::IndexWorker {
                worker: index.worker.0,
                block_size: index.snapshot.block_size,
                last_seq: index.last_seq,
                last_ts: index.last_ts.unwrap_or(0.0),
                has_ts: index.last_ts.is_some(),
                group_kinds: index.groups.iter().map(|g| g.map_or(0, |full| if full { 1 } else { 2 })).collect(),
                engine: chunk.iter().map(|b| b.engine).collect(),
                parent: chunk.iter().map(|b| b.parent.unwrap_or(0)).collect(),
                roots,
                seq: chunk.iter().map(|b| b.seq.0).collect(),
                seed_at,
                seed,
                orphan_engine: orphans.iter().map(|o| o.engine).collect(),
                orphan_seq: orphans.iter().map(|o| o.chained_from.0).collect(),
                tainted: first && blocks.tainted,
                churn_stored: if first { index.snapshot.churn_stored } else { 0.0 },
                churn_removed: if first { index.snapshot.churn_removed } else { 0.0 },
                part: i as u32,
                parts,
            };
            pb::IndexFrame { body: Some(pb::index_frame::Body::Worker(worker)) }.encode_to_vec()
        })
        .collect()
}

pub fn encode_end(workers: u64, blocks: u64) -> Vec<u8> {
    pb::IndexFrame { body: Some(pb::index_frame::Body::End(pb::IndexEnd { workers, blocks })) }.encode_to_vec()
}

/// Packed columns allocate no more than the frame's own size, which is
/// checked first: only their agreement needs checking after.
pub fn decode_piece(bytes: &[u8], limits: &IndexLimits) -> Result<IndexPiece, FrameError> {
    if bytes.len() > limits.max_frame_bytes {
        return Err(FrameError::TooLarge { bytes: bytes.len(), max: limits.max_frame_bytes });
    }
    let frame = pb::IndexFrame::decode(bytes).map_err(|e| FrameError::Malformed(e.to_string()))?;
    let w = match frame.body.ok_or(FrameError::NoBody)? {
        pb::index_frame::Body::End(end) => return Ok(IndexPiece::End { workers: end.workers, blocks: end.blocks }),
        pb::index_frame::Body::Worker(worker) => worker,
    };
    let n = w.engine.len();
    let malformed = |what: &str| FrameError::Malformed(format!("worker {:#x}: {what}", w.worker));
    if w.parent.len() != n || w.seq.len() != n || w.roots.len() != n.div_ceil(8) {
        return Err(malformed("block columns of different lengths"));
    }
    if w.seed_at.len() != w.seed.len() || w.seed_at.iter().any(|&at| at as usize >= n) {
        return Err(malformed("seeds that name no block"));
    }
    if w.orphan_engine.len() != w.orphan_seq.len() {
        return Err(malformed("orphan columns of different lengths"));
    }
    super::cap("blocks of a worker", n, limits.max_blocks_per_worker)?;
    super::cap("orphan records of a worker", w.orphan_engine.len(), limits.max_blocks_per_worker)?;
    super::cap("cache groups of a worker", w.group_kinds.len(), limits.max_groups)?;
    let count = |x: f64| x.is_finite() && x >= 0.0;
    if w.group_kinds.iter().any(|&k| k > 2) || (w.has_ts && !w.last_ts.is_finite()) || w.block_size == 0 {
        return Err(malformed("a group kind, stamp or block size no stream has"));
    }
    if !count(w.churn_stored) || !count(w.churn_removed) {
        return Err(malformed("a churn that is not a count"));
    }
    // The live stream's end marker: no batch is numbered after it.
    if w.last_seq == u64::MAX {
        return Err(malformed("a cut at the end of all sequence numbers"));
    }
    if w.parts > 1 && w.part >= w.parts {
        return Err(FrameError::BadPart { part: w.part, parts: w.parts });
    }
    let mut seeds = vec![None; n];
    for (&at, &seed) in w.seed_at.iter().zip(&w.seed) {
        seeds[at as usize] = Some(HashSeed(seed));
    }
    let is_root = |i: usize| w.roots[i / 8] & (1 << (i % 8)) != 0;
    let blocks = (0..n)
        .map(|i| BlockRecord {
            engine: w.engine[i],
            parent: (!is_root(i)).then_some(w.parent[i]),
            seq: SequenceHash(w.seq[i]),
            seed: seeds[i],
        })
        .collect();
    let orphaned = w
        .orphan_engine
        .iter()
        .zip(&w.orphan_seq)
        .map(|(&engine, &seq)| OrphanRecord { engine, chained_from: SequenceHash(seq) })
        .collect();
    let index = WorkerIndex {
        worker: WorkerId(w.worker),
        last_seq: w.last_seq,
        last_ts: w.has_ts.then_some(w.last_ts),
        groups: w.group_kinds.iter().map(|&k| (k != 0).then_some(k == 1)).collect(),
        snapshot: WorkerSnapshot {
            block_size: w.block_size,
            blocks: WorkerExport { blocks, orphaned, tainted: w.tainted },
            churn_stored: w.churn_stored,
            churn_removed: w.churn_removed,
        },
    };
    Ok(IndexPiece::Worker { index, part: w.part, parts: w.parts })
}

/// Puts a worker's parts together: they come consecutively, in order;
/// anything else drops the worker being gathered (it is then not seeded:
/// that worker starts cold), and its blocks over all parts are capped.
#[derive(Debug, Default)]
pub struct WorkerParts {
    gathering: Option<(WorkerIndex, u32, u32)>,
}

impl WorkerParts {
    /// A whole worker when `piece` completes one; the end's counts when it
    /// is the end.
    pub fn take(&mut self, piece: IndexPiece, limits: &IndexLimits) -> Result<Option<IndexPiece>, FrameError> {
        let (index, part, parts) = match piece {
            IndexPiece::End { .. } => {
                self.gathering = None;
                return Ok(Some(piece));
            }
            IndexPiece::Worker { index, part, parts } if parts <= 1 => {
                self.gathering = None;
                return Ok(Some(IndexPiece::Worker { index, part, parts }));
            }
            IndexPiece::Worker { index, part, parts } => (index, part, parts),
        };
        match self.gathering.take() {
            None if part == 0 => self.gathering = Some((index, part, parts)),
            Some((mut held, last, total)) if held.worker == index.worker && total == parts && last + 1 == part => {
                let blocks = held.snapshot.blocks.blocks.len() + index.snapshot.blocks.blocks.len();
                super::cap("blocks of a worker in parts", blocks, limits.max_blocks_per_worker)?;
                let orphans = held.snapshot.blocks.orphaned.len() + index.snapshot.blocks.orphaned.len();
                super::cap("orphan records of a worker in parts", orphans, limits.max_blocks_per_worker)?;
                held.snapshot.blocks.blocks.extend(index.snapshot.blocks.blocks);
                held.snapshot.blocks.orphaned.extend(index.snapshot.blocks.orphaned);
                if part + 1 == parts {
                    return Ok(Some(IndexPiece::Worker { index: held, part: 0, parts: 1 }));
                }
                self.gathering = Some((held, part, parts));
            }
            _ if part == 0 => self.gathering = Some((index, part, parts)),
            _ => return Err(FrameError::BadPart { part, parts }),
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(blocks: usize) -> WorkerIndex {
        let blocks = (0..blocks as u64)
            .map(|i| BlockRecord {
                engine: 1000 + i,
                parent: (i % 5 != 0).then(|| 999 + i),
                seq: SequenceHash(i * 31 + 7),
                seed: (i % 7 == 3).then_some(HashSeed(i)),
            })
            .collect();
        WorkerIndex {
            worker: WorkerId(0xabcd),
            last_seq: 41,
            last_ts: Some(1_764_800_000.25),
            groups: vec![Some(true), None, Some(false)],
            snapshot: WorkerSnapshot {
                block_size: 16,
                blocks: WorkerExport {
                    blocks,
                    orphaned: vec![OrphanRecord { engine: 7, chained_from: SequenceHash(8) }],
                    tainted: true,
                },
                churn_stored: 12.5,
                churn_removed: 3.25,
            },
        }
    }

    fn round_trip(index: &WorkerIndex, limits: &IndexLimits) -> (usize, WorkerIndex) {
        let frames = encode_worker(index, limits);
        let mut parts = WorkerParts::default();
        let mut whole = None;
        for frame in &frames {
            assert!(frame.len() <= limits.max_frame_bytes, "{} bytes", frame.len());
            let piece = decode_piece(frame, limits).unwrap_or_else(|e| panic!("{e}"));
            if let Some(IndexPiece::Worker { index, .. }) = parts.take(piece, limits).unwrap_or_else(|e| panic!("{e}"))
            {
                whole = Some(index);
            }
        }
        (frames.len(), whole.unwrap_or_else(|| panic!("no worker assembled")))
    }

    #[test]
    fn a_worker_survives_the_wire_whole_and_in_parts() {
        let small = index(50);
        assert_eq!(round_trip(&small, &IndexLimits::default()), (1, small.clone()));
        let big = index(10_000);
        let tight = IndexLimits { max_frame_bytes: 64 << 10, ..IndexLimits::default() };
        let (frames, back) = round_trip(&big, &tight);
        assert!(frames > 5, "{frames} frames");
        assert_eq!(back, big);
        // Orphan records past a part's worth go in parts too.
        let mut holes = index(10);
        holes.snapshot.blocks.orphaned =
            (0..5_000).map(|i| OrphanRecord { engine: 50_000 + i, chained_from: SequenceHash(i) }).collect();
        let (frames, back) = round_trip(&holes, &tight);
        assert!(frames > 5, "{frames} frames");
        assert_eq!(back, holes);
        let empty = index(0);
        assert_eq!(round_trip(&empty, &IndexLimits::default()).1, empty);
    }

    #[test]
    fn the_wire_form_is_pinned() {
        // One root block, one child with a seed, no orphans: field by field.
        let mut one = index(0);
        one.groups = vec![Some(true)];
        one.snapshot.blocks = WorkerExport {
            blocks: vec![
                BlockRecord { engine: 1, parent: None, seq: SequenceHash(2), seed: None },
                BlockRecord { engine: 3, parent: Some(1), seq: SequenceHash(4), seed: Some(HashSeed(5)) },
            ],
            orphaned: vec![],
            tainted: false,
        };
        let frame = encode_worker(&one, &IndexLimits::default()).remove(0);
        let expected: Vec<u8> = [
            &[0x0a, 117][..],                      // field 1 (worker), 117 bytes
            &[0x09, 0xcd, 0xab, 0, 0, 0, 0, 0, 0], // worker id, fixed64
            &[0x10, 16],                           // block size
            &[0x18, 41],                           // last seq
            &[0x21],
            &1_764_800_000.25f64.to_le_bytes(),
            &[0x28, 1],                                                  // stamp, has_ts
            &[0x32, 1, 1],                                               // group kinds: full
            &[0x3a, 16, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0], // engine hashes
            &[0x42, 16, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0], // parents
            &[0x4a, 1, 0b01],                                            // roots: block 0
            &[0x52, 16, 2, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0], // sequence hashes
            &[0x5a, 1, 1],                                               // seeded: block 1
            &[0x62, 8, 5, 0, 0, 0, 0, 0, 0, 0],                          // its seed
            &[0x81, 0x01],
            &12.5f64.to_le_bytes(), // churn stored (16)
            &[0x89, 0x01],
            &3.25f64.to_le_bytes(), // churn removed (17)
        ]
        .concat();
        assert_eq!(frame, expected);
        assert_eq!(encode_end(3, 9), vec![0x12, 4, 0x08, 3, 0x10, 9]);
    }

    #[test]
    fn frames_no_stream_could_send_are_refused() {
        let limits = IndexLimits::default();
        let worker = |edit: &dyn Fn(&mut pb::IndexWorker)| {
            let mut w = pb::IndexWorker { worker: 1, block_size: 16, ..Default::default() };
            w.engine = vec![1, 2];
            w.parent = vec![0, 1];
            w.seq = vec![5, 6];
            w.roots = vec![1];
            edit(&mut w);
            pb::IndexFrame { body: Some(pb::index_frame::Body::Worker(w)) }.encode_to_vec()
        };
        assert!(decode_piece(&worker(&|_| {}), &limits).is_ok());
        type Edit = Box<dyn Fn(&mut pb::IndexWorker)>;
        let refused: Vec<(&str, Edit)> = vec![
            (
                "short parents",
                Box::new(|w| {
                    w.parent.pop();
                }),
            ),
            ("short roots", Box::new(|w| w.roots.clear())),
            ("seed past the blocks", Box::new(|w| (w.seed_at, w.seed) = (vec![2], vec![9]))),
            ("seed without an index", Box::new(|w| w.seed = vec![9])),
            ("orphan columns", Box::new(|w| w.orphan_engine = vec![3])),
            ("group kind 3", Box::new(|w| w.group_kinds = vec![3])),
            ("block size 0", Box::new(|w| w.block_size = 0)),
            ("stamp not finite", Box::new(|w| (w.has_ts, w.last_ts) = (true, f64::NAN))),
            ("part past parts", Box::new(|w| (w.part, w.parts) = (2, 2))),
            ("too many groups", Box::new(|w| w.group_kinds = vec![1; 257])),
            ("churn not a number", Box::new(|w| w.churn_removed = f64::NAN)),
            ("churn below 0", Box::new(|w| w.churn_stored = -1.0)),
            ("a cut at u64::MAX", Box::new(|w| w.last_seq = u64::MAX)),
        ];
        for (what, edit) in refused {
            assert!(decode_piece(&worker(&*edit), &limits).is_err(), "{what} accepted");
        }
        let over = IndexLimits { max_blocks_per_worker: 1, ..limits };
        assert!(matches!(decode_piece(&worker(&|_| {}), &over), Err(FrameError::OverCap { .. })));
        assert!(matches!(decode_piece(&[0xff; 40], &limits), Err(FrameError::Malformed(_))));
        let small = IndexLimits { max_frame_bytes: 8, ..limits };
        assert!(matches!(decode_piece(&worker(&|_| {}), &small), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn parts_out_of_order_or_over_the_cap_are_refused() {
        let limits = IndexLimits { max_frame_bytes: 64 << 10, ..IndexLimits::default() };
        let frames = encode_worker(&index(10_000), &limits);
        let pieces: Vec<IndexPiece> =
            frames.iter().map(|f| decode_piece(f, &limits).unwrap_or_else(|e| panic!("{e}"))).collect();
        let mut parts = WorkerParts::default();
        assert_eq!(parts.take(pieces[0].clone(), &limits), Ok(None));
        assert!(matches!(parts.take(pieces[2].clone(), &limits), Err(FrameError::BadPart { .. })));
        let capped = IndexLimits { max_blocks_per_worker: 3_000, ..limits };
        let mut parts = WorkerParts::default();
        let mut result = Ok(None);
        for piece in &pieces {
            result = parts.take(piece.clone(), &capped);
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(FrameError::OverCap { .. })), "{result:?}");
    }
}
