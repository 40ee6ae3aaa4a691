use super::*;
use crate::hashing::HashSeed;
use crate::worker::WorkerSpec;

fn stored(blocks: usize) -> KvEvent {
    KvEvent::Stored {
        block_hashes: (1..=blocks as u64).collect(),
        parent: None,
        token_ids: vec![7; blocks * 4],
        block_size: 4,
        seed: HashSeed::default(),
    }
}

/// How many events from the head of `sizes` (blocks per event, on
/// `worker`) one prefetch window covers.
fn covered(shard: &Shard, worker: WorkerId, sizes: &[usize]) -> usize {
    let events: Vec<KvEvent> = sizes.iter().map(|&blocks| stored(blocks)).collect();
    shard.prefetch_head(events.iter().map(|event| (worker, event)))
}

#[test]
fn a_prefetch_window_covers_the_head_events_that_fit_its_blocks() {
    let mut shard = Shard::new();
    let known = WorkerId(1);
    shard.upsert_worker(WorkerSpec::new(known, "127.0.0.1:8000".parse().expect("literal address"), 4));
    assert_eq!(covered(&shard, known, &[]), 0);
    assert_eq!(covered(&shard, known, &[1, 1, 1]), 3);
    let half = PREFETCH_BLOCKS / 2;
    assert_eq!(covered(&shard, known, &[half, PREFETCH_BLOCKS - half, 1]), 2);
    // At least one event, however large; a large one after small ones
    // waits for the next window.
    assert_eq!(covered(&shard, known, &[PREFETCH_BLOCKS + 1, 1]), 1);
    assert_eq!(covered(&shard, known, &[1, PREFETCH_BLOCKS]), 1);
    // Clears and removals of nothing count as events of no blocks.
    let few = [KvEvent::Cleared, KvEvent::Removed { block_hashes: vec![] }, stored(PREFETCH_BLOCKS)];
    assert_eq!(shard.prefetch_head(few.iter().map(|event| (known, event))), 3);
    // Events applying refuses (an unknown worker's, a block size not the
    // worker's) are covered too: they are refused in order.
    assert_eq!(covered(&shard, WorkerId(9), &[1, 2]), 2);
    let mut wrong_size = stored(2);
    if let KvEvent::Stored { block_size, .. } = &mut wrong_size {
        *block_size = 2;
    }
    assert_eq!(shard.prefetch_head([(known, &wrong_size), (known, &stored(1))]), 2);
}

#[test]
fn applying_an_event_counts_its_outcome_and_marks_a_worker_whose_block_size_differs() {
    let mut shard = Shard::new();
    let known = WorkerId(1);
    shard.upsert_worker(WorkerSpec::new(known, "127.0.0.1:8000".parse().expect("literal address"), 4));
    let counted = |shard: &Shard| {
        let s = shard.stats();
        (s.events_applied, s.events_rejected, s.unknown_parent_events, s.blocks_stored, s.blocks_removed)
    };

    assert_eq!(shard.apply_event(WorkerId(9), &stored(2)), Err(EventError::UnknownWorker));
    assert_eq!(counted(&shard), (0, 1, 0, 0, 0));

    let mut wrong_size = stored(2);
    if let KvEvent::Stored { block_size, .. } = &mut wrong_size {
        *block_size = 2;
    }
    assert_eq!(shard.apply_event(known, &wrong_size), Err(EventError::BlockSizeMismatch { event: 2, worker: 4 }));
    assert_eq!(counted(&shard), (0, 2, 0, 0, 0));
    assert_eq!(shard.engine_block_size(known), Some(2));

    let orphan = KvEvent::Stored {
        block_hashes: vec![5],
        parent: Some(404),
        token_ids: vec![7; 4],
        block_size: 4,
        seed: HashSeed::default(),
    };
    assert!(matches!(shard.apply_event(known, &orphan), Err(EventError::UnknownParent(_))));
    assert_eq!(counted(&shard), (0, 2, 1, 0, 0));
    assert_eq!(shard.engine_block_size(known), Some(2), "only a stored event the index takes clears the mark");

    let short = KvEvent::Stored {
        block_hashes: vec![6, 7],
        parent: None,
        token_ids: vec![7; 5],
        block_size: 4,
        seed: HashSeed::default(),
    };
    assert!(matches!(shard.apply_event(known, &short), Err(EventError::TokenCountMismatch { .. })));
    assert_eq!(counted(&shard), (0, 3, 1, 0, 0));

    let applied = shard.apply_event(known, &stored(3)).expect("the worker's block size");
    assert_eq!(applied.stored, 3);
    assert_eq!(counted(&shard), (1, 3, 1, 3, 0));
    assert_eq!(shard.engine_block_size(known), None);

    let removed = shard.apply_event(known, &KvEvent::Removed { block_hashes: vec![3, 77] }).expect("known worker");
    assert_eq!((removed.removed, removed.unknown_removed), (1, 1));
    assert_eq!(counted(&shard), (2, 3, 1, 3, 1));
    assert_eq!(shard.stats().unknown_removals, 1);
}

#[test]
fn a_joining_worker_under_a_byte_budget_counts_what_its_fixed_cost_evicted() {
    use crate::index::{ENTRY_BYTES, WORKER_BYTES};
    let spec = |id: u64| WorkerSpec::new(WorkerId(id), "127.0.0.1:8000".parse().expect("literal address"), 4);
    let mut shard = Shard::with_max_index_bytes(Some(200 * ENTRY_BYTES + WORKER_BYTES));
    shard.record_evictions();
    shard.upsert_worker(spec(1));
    assert_eq!(shard.index().max_entries(), Some(200));
    let chain = KvEvent::Stored {
        block_hashes: (1..=200).collect(),
        parent: None,
        token_ids: (0..800).collect(),
        block_size: 4,
        seed: HashSeed::default(),
    };
    assert_eq!(shard.apply_event(WorkerId(1), &chain).map(|a| a.stored), Ok(200));
    shard.upsert_worker(spec(2));
    let evicted = 200 - (200 * ENTRY_BYTES - WORKER_BYTES) / ENTRY_BYTES;
    let stats = shard.stats();
    assert_eq!((stats.blocks_evicted, stats.index_entries), (evicted, 200 - evicted));
    let gone = shard.take_evictions();
    assert_eq!(gone.len() as u64, evicted);
    assert!(gone.iter().all(|&(worker, hash)| worker == WorkerId(1) && hash > 200 - evicted), "the chain's tail");
    // An update of a known worker changes nothing.
    shard.upsert_worker(spec(2));
    assert_eq!(shard.stats().blocks_evicted, evicted);
}
