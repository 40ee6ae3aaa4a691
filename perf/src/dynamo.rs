//! NVIDIA Dynamo's indexers (`dynamo-kv-router` 1.6.1), driven through their
//! public API, as the baseline kvpick is compared with: the single-threaded
//! ones on the caller's thread, the threaded one (`ThreadPoolIndexer`) with
//! its own writer threads.
//!
//! Only Dynamo's public types and functions are called here; none of its
//! code is copied.

use std::collections::HashMap;

use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::nested_map::{LevelIndex, SearchMode};
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, OverlapScores, RouterEvent, WorkerWithDpRank, compute_block_hash_for_seq,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer, RadixTree};
use rustc_hash::FxBuildHasher;

use crate::workload::{BLOCK_SIZE, BlockEvent};

/// Dynamo's event for a workload event (`id` is the event id; no DP ranks).
pub fn router_event(event: &BlockEvent, id: u64) -> RouterEvent {
    let data = match event {
        BlockEvent::Stored { parent, hashes, locals, .. } => KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent.map(ExternalSequenceBlockHash),
            start_position: None,
            blocks: hashes
                .iter()
                .zip(locals)
                .map(|(&hash, &local)| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(hash),
                    tokens_hash: LocalBlockHash(local),
                    mm_extra_info: None,
                })
                .collect(),
        }),
        BlockEvent::Removed { hashes, .. } => KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: hashes.iter().copied().map(ExternalSequenceBlockHash).collect(),
        }),
    };
    RouterEvent::new(u64::from(event.worker()), KvCacheEvent { event_id: id, data, dp_rank: 0 })
}

/// Dynamo's `BlockStored` event for blocks with engine hashes `hashes`
/// holding `tokens`; the local hashes are Dynamo's own, from the tokens.
pub fn stored_event(worker: u64, id: u64, parent: Option<u64>, hashes: &[u64], tokens: &[u32]) -> RouterEvent {
    let data = KvCacheEventData::Stored(KvCacheStoreData {
        parent_hash: parent.map(ExternalSequenceBlockHash),
        start_position: None,
        blocks: hashes
            .iter()
            .zip(local_hashes(tokens))
            .map(|(&hash, local)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(hash),
                tokens_hash: local,
                mm_extra_info: None,
            })
            .collect(),
    });
    RouterEvent::new(worker, KvCacheEvent { event_id: id, data, dp_rank: 0 })
}

/// Dynamo's local block hashes of a prompt: what its indexers are queried with.
pub fn local_hashes(tokens: &[u32]) -> Vec<LocalBlockHash> {
    compute_block_hash_for_seq(tokens, BLOCK_SIZE, BlockHashOptions::default())
}

/// `(worker, depth)` pairs of Dynamo's scores, sorted.
pub fn sorted_scores(scores: &OverlapScores) -> Vec<(u64, u32)> {
    let mut out: Vec<(u64, u32)> = scores.scores.iter().map(|(w, &d)| (w.worker_id, d)).collect();
    out.sort_unstable();
    out
}

/// Dynamo's `PositionalIndexer` with the per-worker reverse lookup that its
/// thread pool normally keeps on each writer thread; here one map for all.
pub struct Positional {
    index: PositionalIndexer,
    worker_blocks: HashMap<WorkerWithDpRank, LevelIndex, FxBuildHasher>,
}

impl Positional {
    /// Strided jump search with Dynamo's usual jump of 32 (not read from the environment).
    pub fn new(jump: usize) -> Self {
        Positional {
            index: PositionalIndexer::new_with_mode(jump.max(1), SearchMode::Strided),
            worker_blocks: HashMap::default(),
        }
    }

    /// Whether the event applied.
    pub fn apply(&mut self, event: RouterEvent) -> bool {
        self.index.apply_event(&mut self.worker_blocks, event, None).is_ok()
    }

    pub fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        SyncIndexer::find_matches(&self.index, local_hashes, false)
    }
}

/// Dynamo's single-threaded `RadixTree`.
#[derive(Default)]
pub struct Radix {
    tree: RadixTree,
}

impl Radix {
    /// Whether the event applied.
    pub fn apply(&mut self, event: RouterEvent) -> bool {
        self.tree.apply_event(event).is_ok()
    }

    /// Its API takes the hashes by value: the copy is part of the call.
    pub fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        self.tree.find_matches(local_hashes.to_vec(), false)
    }

    /// (block, worker) pairs it holds.
    pub fn entries(&self) -> usize {
        self.tree.current_size()
    }
}

/// Dynamo's threaded indexer: a `ThreadPoolIndexer` over a thread-safe
/// backend, `threads` writer threads fed through flume channels (events go
/// to a thread chosen by worker, sticky), reads inline on the caller's
/// thread. The counterpart of kvpick's shard runtime with the same number
/// of threads.
pub struct ThreadPool<T: SyncIndexer> {
    pool: ThreadPoolIndexer<T>,
}

impl ThreadPool<ConcurrentRadixTreeCompressed> {
    /// Over Dynamo's concurrent compressed radix tree.
    pub fn compressed_radix(threads: usize) -> Self {
        ThreadPool { pool: ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), threads.max(1), BLOCK_SIZE) }
    }
}

impl ThreadPool<PositionalIndexer> {
    /// Over Dynamo's `PositionalIndexer`, strided jump search of `jump`.
    pub fn positional(threads: usize, jump: usize) -> Self {
        let backend = PositionalIndexer::new_with_mode(jump.max(1), SearchMode::Strided);
        ThreadPool { pool: ThreadPoolIndexer::new(backend, threads.max(1), BLOCK_SIZE) }
    }
}

impl<T: SyncIndexer> ThreadPool<T> {
    /// Hands the event to its worker's writer thread; false if refused.
    pub fn enqueue(&self, event: RouterEvent) -> bool {
        self.pool.enqueue_event(event).is_ok()
    }

    /// Waits until every writer thread has applied what was enqueued
    /// before the call (Dynamo's FIFO barrier); false if a thread is gone.
    pub fn flush(&self) -> bool {
        futures_lite::future::block_on(self.pool.flush_and_wait()).is_ok()
    }

    /// What `ThreadPoolIndexer::find_matches` runs inline on the caller's
    /// thread (without the async trait's boxed future and copied `Vec`).
    pub fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        SyncIndexer::find_matches(self.pool.backend(), local_hashes, false)
    }
}
