use super::*;
use crate::event::KvEvent;
use crate::hashing::sequence_hashes;

const BS: u32 = 4;

fn tokens(n_blocks: usize, base: u32) -> Vec<u32> {
    (0..n_blocks as u32 * BS).map(|t| base + t).collect()
}

fn prompt(tokens: &[u32]) -> Vec<SequenceHash> {
    sequence_hashes(tokens, BS, HashSeed::default())
}

fn matches(index: &KvIndex, seq: &[SequenceHash]) -> Vec<(Slot, u32)> {
    let mut out = Vec::new();
    index.find_matches(seq, &mut out);
    out.sort();
    out
}

/// Stores `toks` on `slot` as one chain with engine hashes `first..`.
fn store(index: &mut KvIndex, slot: Slot, parent: Option<u64>, first: u64, toks: &[u32]) -> Applied {
    let hashes: Vec<u64> = (0..(toks.len() as u32 / BS) as u64).map(|i| first + i).collect();
    index.store(slot, parent, &hashes, toks, BS, HashSeed::default()).unwrap()
}

/// Checks every worker's block links (`WorkerTable::assert_links_consistent`)
/// and that its orphan count is what they give.
fn assert_whole(index: &KvIndex) {
    for (slot, worker) in index.workers.iter().enumerate() {
        let Some(worker) = worker else { continue };
        assert_eq!(worker.blocks.assert_links_consistent(), worker.orphans, "worker {slot}'s orphans");
    }
}

#[test]
fn overlap_is_the_number_of_leading_blocks_held() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    index.add_worker(1);
    let toks = tokens(100, 0);
    store(&mut index, 0, None, 1000, &toks[..(70 * BS) as usize]);
    store(&mut index, 1, None, 5000, &toks[..(3 * BS) as usize]);
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 70), (1, 3)]);
    assert_eq!(matches(&index, &prompt(&toks[..(2 * BS) as usize])), vec![(0, 2), (1, 2)]);
    assert_eq!(matches(&index, &prompt(&tokens(5, 999))), vec![]);
    assert_eq!(matches(&index, &[]), vec![]);
    assert_eq!(index.entries(), 73);
    assert_eq!(index.distinct_blocks(), 70);
}

#[test]
fn every_depth_is_found_exactly_across_jump_boundaries() {
    let toks = tokens(3 * JUMP + 5, 0);
    let full = prompt(&toks);
    let mut index = KvIndex::default();
    // Worker d holds exactly the first d+1 blocks.
    for depth in 0..full.len() {
        index.add_worker(depth as Slot);
        store(&mut index, depth as Slot, None, 1 << 20 | (depth as u64) << 10, &toks[..(depth + 1) * BS as usize]);
    }
    let expected: Vec<(Slot, u32)> = (0..full.len()).map(|d| (d as Slot, d as u32 + 1)).collect();
    assert_eq!(matches(&index, &full), expected);
}

#[test]
fn extending_from_a_parent_chains_sequence_hashes() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let toks = tokens(6, 0);
    store(&mut index, 0, None, 10, &toks[..(2 * BS) as usize]);
    store(&mut index, 0, Some(11), 20, &toks[(2 * BS) as usize..]);
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 6)]);
}

#[test]
fn unknown_parent_is_rejected_and_changes_nothing() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let err = index.store(0, Some(42), &[1], &tokens(1, 0), BS, HashSeed::default()).unwrap_err();
    assert_eq!(err, EventError::UnknownParent(42));
    assert_eq!(index.entries(), 0);
    assert_eq!(index.distinct_blocks(), 0);
}

#[test]
fn malformed_stores_are_rejected() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let bad = index.store(0, None, &[1, 2], &tokens(1, 0), BS, HashSeed::default());
    assert!(matches!(bad, Err(EventError::TokenCountMismatch { blocks: 2, tokens: 4, block_size: 4 })));
    assert!(index.store(0, None, &[1], &[], 0, HashSeed::default()).is_err());
    assert_eq!(index.store(7, None, &[1], &tokens(1, 0), BS, HashSeed::default()), Err(EventError::UnknownWorker));
    assert_eq!(index.remove(7, &[1]), Err(EventError::UnknownWorker));
    assert_eq!(index.entries(), 0);
}

#[test]
fn removal_of_a_middle_block_cuts_the_overlap_there() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let toks = tokens(80, 0);
    store(&mut index, 0, None, 100, &toks);
    let full = prompt(&toks);
    // Block 10 is evicted while 11.. stay: the engine can only reuse 0..10.
    index.remove(0, &[110]).unwrap();
    assert_eq!(matches(&index, &full), vec![(0, 10)]);
    // Storing it again heals the hole and the whole prefix matches.
    store(&mut index, 0, Some(109), 110, &toks[(10 * BS) as usize..(11 * BS) as usize]);
    assert_eq!(matches(&index, &full), vec![(0, 80)]);
    // Removing the hole's descendants one by one keeps counts consistent.
    index.remove(0, &[110]).unwrap();
    let rest: Vec<u64> = (111..180).collect();
    index.remove(0, &rest).unwrap();
    assert_eq!(matches(&index, &full), vec![(0, 10)]);
    store(&mut index, 0, Some(109), 110, &toks[(10 * BS) as usize..(12 * BS) as usize]);
    assert_eq!(matches(&index, &full), vec![(0, 12)]);
}

#[test]
fn a_leaf_removed_and_stored_again_with_other_content_answers_for_the_new_content() {
    // The removed leaf's record is reused; nothing of the old one may leak.
    let mut index = KvIndex::default();
    index.add_worker(0);
    let toks = tokens(3, 0);
    store(&mut index, 0, None, 1, &toks);
    index.remove(0, &[3]).unwrap();
    let mut other = toks.clone();
    other[(2 * BS) as usize..].copy_from_slice(&tokens(1, 900));
    store(&mut index, 0, Some(2), 3, &other[(2 * BS) as usize..]);
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 2)]);
    assert_eq!(matches(&index, &prompt(&other)), vec![(0, 3)]);
    let export = index.export_worker(0).expect("worker 0").sorted();
    let seqs: Vec<(u64, SequenceHash)> = export.blocks.iter().map(|b| (b.engine, b.seq)).collect();
    let other_seqs = prompt(&other);
    assert_eq!(seqs, vec![(1, other_seqs[0]), (2, other_seqs[1]), (3, other_seqs[2])]);
    assert_eq!(index.entries(), 3);
}

#[test]
fn a_removed_parent_survives_a_slab_rebuild_and_takes_its_child_back() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let toks = tokens(2, 0);
    store(&mut index, 0, None, 1, &toks);
    // Enough one-block roots that removing them rebuilds the slab.
    for root in 0..1_500u64 {
        store(&mut index, 0, None, 10_000 + root, &tokens(1, 1_000 + 8 * root as u32));
    }
    index.remove(0, &[1]).unwrap();
    assert!(index.needs_scan.contains(0), "block 2 is an orphan");
    let export = index.export_worker(0).expect("worker 0");
    assert_eq!(export.orphaned, vec![OrphanRecord { engine: 1, chained_from: prompt(&toks)[0] }]);
    let records_before = index.workers[0].as_ref().map(|w| w.blocks.table_bytes());
    let roots: Vec<u64> = (10_000..11_500).collect();
    assert_eq!(index.remove(0, &roots).unwrap().removed, 1_500);
    assert!(index.workers[0].as_ref().map(|w| w.blocks.table_bytes()) < records_before, "rebuilt");
    assert_whole(&index);
    // The same content again: the child is adopted, the worker whole.
    store(&mut index, 0, None, 1, &toks[..BS as usize]);
    let worker = index.workers[0].as_ref().expect("worker 0");
    assert!(!worker.tainted && worker.orphans == 0 && !index.needs_scan.contains(0));
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 2)]);
    let export = index.export_worker(0).expect("worker 0");
    assert_eq!(export.blocks.iter().find(|b| b.engine == 2).and_then(|b| b.parent), Some(1));
    assert!(export.orphaned.is_empty());
    assert_whole(&index);
    index.remove(0, &[2, 1]).unwrap();
    assert_eq!((index.entries(), index.workers[0].as_ref().map(|w| w.blocks.gone().count())), (0, Some(0)));
    assert_whole(&index);
}

/// Lets the worker in `slot` (holding nothing yet) have at most `most`
/// block records, to reach the slab's limit in a test.
fn limit_records(index: &mut KvIndex, slot: Slot, most: usize) {
    let Some(Some(worker)) = index.workers.get_mut(slot as usize) else { panic!("no worker in slot {slot}") };
    assert_eq!(worker.blocks.len(), 0, "a limit is set before any block");
    worker.blocks = worker_table::WorkerTable::with_most_records(most);
}

#[test]
fn a_worker_out_of_record_ids_keeps_its_chains_heads_and_counts_the_rest_evicted() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    index.add_worker(1);
    limit_records(&mut index, 0, 5);
    index.record_evictions();
    let toks = tokens(8, 0);
    let applied = store(&mut index, 0, None, 100, &toks);
    assert_eq!((applied.stored, applied.evicted), (5, 3));
    let mut evicted = index.take_evicted();
    evicted.sort_unstable();
    assert_eq!(evicted, vec![(0, 105), (0, 106), (0, 107)]);
    // The other worker is not limited.
    assert_eq!(store(&mut index, 1, None, 100, &toks).stored, 8);
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 5), (1, 8)]);
    // A removal frees a record for the next block.
    index.remove(0, &[104]).unwrap();
    let applied = store(&mut index, 0, Some(103), 104, &toks[(4 * BS) as usize..(6 * BS) as usize]);
    assert_eq!((applied.stored, applied.evicted), (1, 1));
    assert_eq!(index.take_evicted(), vec![(0, 105)]);
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 5), (1, 8)]);
    assert_eq!(index.entries(), 13);
    assert_whole(&index);
}

#[test]
fn a_full_worker_takes_back_a_gone_block_without_a_new_id() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    limit_records(&mut index, 0, 3);
    index.record_evictions();
    let toks = tokens(3, 0);
    assert_eq!(store(&mut index, 0, None, 100, &toks).stored, 3);
    // The middle block goes; its child keeps its record (gone): still 3.
    index.remove(0, &[101]).unwrap();
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 1)]);
    let applied = store(&mut index, 0, Some(100), 101, &toks[BS as usize..(2 * BS) as usize]);
    assert_eq!((applied.stored, applied.evicted), (1, 0));
    assert_eq!(index.take_evicted(), vec![]);
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 3)]);
    // Full, and a new block has nowhere to go.
    let applied = store(&mut index, 0, Some(102), 103, &tokens(1, 50));
    assert_eq!((applied.stored, applied.evicted), (0, 1));
    assert_eq!(index.entries(), 3);
    assert_whole(&index);
}

#[test]
fn engine_hash_reused_for_other_content_falls_back_to_scanning() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let toks = tokens(40, 0);
    store(&mut index, 0, None, 100, &toks);
    index.remove(0, &[105]).unwrap();
    // Same engine hash, different tokens: its old children now hang off a
    // block whose sequence hash changed.
    let other = tokens(1, 7777);
    index.store(0, Some(104), &[105], &other, BS, HashSeed::default()).unwrap();
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 5)]);
    index.clear(0);
    store(&mut index, 0, None, 100, &toks);
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 40)]);
}

#[test]
fn duplicate_sequence_hashes_are_reference_counted() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let toks = tokens(2, 0);
    store(&mut index, 0, None, 100, &toks);
    // Another engine chain with the same tokens (e.g. a salt the engine
    // hashes and we do not) maps onto the same sequence hashes.
    store(&mut index, 0, None, 200, &toks);
    assert_eq!(index.entries(), 4);
    index.remove(0, &[100, 101]).unwrap();
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 2)]);
    index.remove(0, &[200, 201]).unwrap();
    assert_eq!(matches(&index, &prompt(&toks)), vec![]);
    assert_eq!(index.distinct_blocks(), 0);
}

#[test]
fn restoring_a_held_block_is_a_no_op() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let toks = tokens(3, 0);
    assert_eq!(store(&mut index, 0, None, 100, &toks).stored, 3);
    assert_eq!(store(&mut index, 0, None, 100, &toks).stored, 0);
    assert_eq!(index.entries(), 3);
}

#[test]
fn unknown_removals_are_counted() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    store(&mut index, 0, None, 100, &tokens(2, 0));
    let applied = index.remove(0, &[100, 5, 6]).unwrap();
    assert_eq!((applied.removed, applied.unknown_removed), (1, 2));
}

#[test]
fn clear_and_remove_worker_forget_only_that_worker() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    index.add_worker(1);
    let toks = tokens(5, 0);
    store(&mut index, 0, None, 100, &toks);
    store(&mut index, 1, None, 200, &toks);
    assert_eq!(index.clear(0).removed, 5);
    assert_eq!(matches(&index, &prompt(&toks)), vec![(1, 5)]);
    index.remove_worker(1);
    assert_eq!(matches(&index, &prompt(&toks)), vec![]);
    assert_eq!((index.entries(), index.distinct_blocks()), (0, 0));
    assert_eq!(index.clear(9), Applied::default());
}

/// Slots 0-63 store into a one-word holder table, which slot 64 widens:
/// their blocks must still match after it.
#[test]
fn many_workers_spill_past_one_word() {
    let mut index = KvIndex::default();
    let toks = tokens(50, 0);
    for slot in 0..150 {
        index.add_worker(slot);
        let depth = 1 + slot as usize % 50;
        store(&mut index, slot, None, u64::from(slot) << 16, &toks[..depth * BS as usize]);
    }
    let found = matches(&index, &prompt(&toks));
    assert_eq!(found.len(), 150);
    for (slot, depth) in found {
        assert_eq!(depth, 1 + slot % 50);
    }
    assert!(index.approx_bytes() > 0);
}

/// Every lookup width (one word, 4, 16, a vector) and every holder-set
/// form (bits, a list, spilled) answers as a block-by-block scan does,
/// holes included.
#[test]
fn lookups_agree_with_a_scan_at_every_shard_width() {
    let mut rng = fastrand::Rng::with_seed(21);
    for workers in [40, 200, 700, 1_500] {
        let mut index = KvIndex::default();
        // A few shared prefixes, each stored by many workers to its own
        // depth: deep blocks have few holders, shallow ones many.
        let bases: Vec<Vec<u32>> = (0..4).map(|b| tokens(70, b * 1_000_000)).collect();
        for slot in 0..workers {
            if rng.u8(..) >= 120 {
                continue;
            }
            index.add_worker(slot);
            let toks = &bases[rng.usize(..bases.len())];
            let depth = rng.usize(1..=70);
            store(&mut index, slot, None, u64::from(slot) << 16, &toks[..depth * BS as usize]);
            if depth > 2 && rng.u8(..) < 30 {
                // A hole: the worker now needs scanning.
                let hole = u64::from(slot) << 16 | rng.u64(1..depth as u64 - 1);
                index.remove(slot, &[hole]).unwrap();
            }
        }
        let mut matched = 0;
        for toks in &bases {
            let seq = prompt(toks);
            let mut scan: Vec<(Slot, u32)> = (0..workers)
                .filter(|&slot| index.holds(slot, seq[0]))
                .map(|slot| (slot, seq.iter().take_while(|s| index.holds(slot, **s)).count() as u32))
                .collect();
            scan.sort();
            assert_eq!(matches(&index, &seq), scan, "{workers} workers");
            matched += scan.len();
        }
        assert!(matched > workers as usize / 4, "{workers} workers: {matched} matches, too few to tell");
    }
}

/// The search bisects a level of dropped groups at a time, at most 64 per
/// round; a level with more bisects the rest depth-first. Both must give
/// the same answer as a scan.
#[test]
fn a_level_with_more_dropped_groups_than_a_round_agrees_with_a_scan() {
    let mut rng = fastrand::Rng::with_seed(64);
    let blocks = 32 * JUMP;
    let toks = tokens(blocks, 0);
    let seq = prompt(&toks);
    for workers in [100, 300] {
        let mut index = KvIndex::default();
        let mut depths = Vec::new();
        for slot in 0..workers {
            index.add_worker(slot);
            let depth = rng.usize(1..=blocks);
            store(&mut index, slot, None, u64::from(slot) << 16, &toks[..depth * BS as usize]);
            depths.push((slot, depth as u32));
        }
        // Groups on the third level: one per 4-block stretch a worker
        // drops out in (fewer than all slots reach the end).
        let third_level: std::collections::BTreeSet<u32> =
            depths.iter().filter(|&&(_, d)| d < blocks as u32).map(|&(_, d)| (d - 1) / 4).collect();
        assert!(third_level.len() > 64, "{workers} workers: {} groups, the round never overflows", third_level.len());
        depths.sort();
        assert_eq!(matches(&index, &seq), depths, "{workers} workers");
    }
}

/// `store` hashes an event's chain ahead assuming nothing is held; a block
/// already held under another prefix redirects the rest of the chain.
#[test]
fn a_chain_continues_from_a_held_block_it_did_not_expect() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    let (a, b) = (tokens(2, 0), tokens(3, 500));
    store(&mut index, 0, None, 1, &a);
    // Engine hashes 10, 2, 12: the middle one is `a`'s second block.
    let hashes = [10, 2, 12];
    index.store(0, None, &hashes, &b, BS, HashSeed::default()).unwrap();
    let redirected: Vec<u32> = a.iter().chain(&b[2 * BS as usize..]).copied().collect();
    let held = prompt(&redirected)[2];
    assert!(index.holds(0, held), "the third block chains from the held block's own prefix");
    assert!(!index.holds(0, prompt(&b)[2]), "not from the event's tokens before it");
    assert!(index.holds(0, prompt(&b)[0]));
    assert_eq!(index.entries(), 4);
}

#[test]
fn continuations_inherit_their_chains_seed() {
    // vLLM reports a cache salt only with a prompt's first block: later
    // events of the same chain carry no salt but must hash with it.
    let salted = HashSeed::new(None, Some("tenant-a"));
    let mut index = KvIndex::default();
    index.add_worker(0);
    let toks = tokens(6, 0);
    index.store(0, None, &[1, 2], &toks[..8], BS, salted).unwrap();
    index.store(0, Some(2), &[3, 4, 5, 6], &toks[8..], BS, HashSeed::default()).unwrap();
    let want = sequence_hashes(&toks, BS, salted);
    assert_eq!(matches(&index, &want), vec![(0, 6)]);
    assert_eq!(matches(&index, &prompt(&toks)), vec![]);
    // Evicted blocks forget their seed.
    index.remove(0, &[6]).unwrap();
    index.store(0, Some(5), &[6], &toks[20..], BS, HashSeed::default()).unwrap();
    assert_eq!(matches(&index, &want), vec![(0, 6)]);
    index.clear(0);
    index.store(0, None, &[1], &toks[..4], BS, HashSeed::default()).unwrap();
    assert_eq!(matches(&index, &prompt(&toks)), vec![(0, 1)]);
}

#[test]
fn a_worker_emptied_by_removals_keeps_no_map_of_its_blocks() {
    let salted = HashSeed::new(None, Some("tenant-a"));
    let mut index = KvIndex::default();
    index.add_worker(0);
    let hashes: Vec<u64> = (1..=300).collect();
    index.store(0, None, &hashes, &tokens(300, 0), BS, salted).unwrap();
    // Two engine hashes for one prefix: the second is a duplicate reference.
    index.store(0, None, &[1_000], &tokens(1, 7), BS, HashSeed::default()).unwrap();
    index.store(0, None, &[1_001], &tokens(1, 7), BS, HashSeed::default()).unwrap();
    let worker = index.worker(0).expect("added");
    assert_eq!((worker.seeds.len(), worker.dup_refs.len()), (300, 1));
    index.remove(0, &hashes).unwrap();
    index.remove(0, &[1_000]).unwrap();
    let worker = index.worker(0).expect("added");
    assert!(worker.seeds.capacity() > 0 && worker.dup_refs.capacity() > 0, "one block left: the maps keep their room");
    index.remove(0, &[1_001]).unwrap();
    let worker = index.worker(0).expect("added");
    assert_eq!((worker.blocks.len(), worker.seeds.capacity(), worker.dup_refs.capacity()), (0, 0, 0));
    assert_eq!(index.entries(), 0);
}

mod budget;
mod snapshot;

/// Every slot's export (sorted) and the matches of each prompt.
type IndexState = (Vec<Option<WorkerExport>>, Vec<Vec<(Slot, u32)>>);

/// Every slot's export, sorted, and the matches of `prompts`: what two
/// indexes must agree on to be the same.
fn state(index: &KvIndex, slots: &[Slot], prompts: &[Vec<SequenceHash>]) -> IndexState {
    let exports = slots.iter().map(|&slot| index.export_worker(slot).map(WorkerExport::sorted)).collect();
    (exports, prompts.iter().map(|p| matches(index, p)).collect())
}

#[test]
fn prefetching_a_window_changes_nothing_and_passes_over_bad_events() {
    let toks = tokens(12, 0);
    let setup = |index: &mut KvIndex| {
        index.add_worker(0);
        index.add_worker(1);
        store(index, 0, None, 100, &toks[..(4 * BS) as usize]);
        store(index, 1, None, 200, &toks[..(2 * BS) as usize]);
    };
    let stored = |parent: Option<u64>, hashes: Vec<u64>, token_ids: Vec<u32>, block_size: u32| KvEvent::Stored {
        block_hashes: hashes,
        parent,
        token_ids,
        block_size,
        seed: HashSeed::default(),
    };
    let window = [
        // A chain continued by the next event, before either is stored.
        (0, stored(Some(103), vec![104, 105], toks[(4 * BS) as usize..(6 * BS) as usize].to_vec(), BS)),
        (0, stored(Some(105), vec![106], toks[(6 * BS) as usize..(7 * BS) as usize].to_vec(), BS)),
        (7, stored(None, vec![1], tokens(1, 0), BS)),
        (1, stored(None, vec![300], tokens(1, 50), 0)),
        (1, stored(None, vec![301, 302], tokens(1, 50), BS)),
        (1, stored(Some(999), vec![303], tokens(1, 50), BS)),
        (1, KvEvent::Removed { block_hashes: vec![201, 999] }),
        (7, KvEvent::Removed { block_hashes: vec![1] }),
        (0, KvEvent::Cleared),
    ];
    let slotted: Vec<(Slot, &KvEvent)> = window.iter().map(|(slot, event)| (*slot, event)).collect();
    let prompts = [prompt(&toks), prompt(&toks[..(3 * BS) as usize]), prompt(&tokens(1, 50))];

    let mut plain = KvIndex::default();
    setup(&mut plain);
    let mut prefetched = KvIndex::default();
    setup(&mut prefetched);
    prefetched.prefetch(&slotted);
    assert_eq!(state(&prefetched, &[0, 1, 7], &prompts), state(&plain, &[0, 1, 7], &prompts));

    // Applied after the prefetch, the window gives what it gives without.
    let apply = |index: &mut KvIndex| -> Vec<Result<Applied, EventError>> {
        slotted.iter().map(|&(slot, event)| index.apply(slot, event)).collect()
    };
    assert_eq!(apply(&mut prefetched), apply(&mut plain));
    assert_eq!(state(&prefetched, &[0, 1, 7], &prompts), state(&plain, &[0, 1, 7], &prompts));
    prefetched.prefetch(&[]);
}

/// The prefetch aims where applying the window reads: the sequence hashes
/// `store` records for each stored block (a chain continued across events
/// of the window, from a held parent, under a LoRA seed) and those of the
/// blocks a short removal names.
#[test]
fn a_window_prefetches_the_holder_keys_store_and_remove_use() {
    let lora = HashSeed::new(Some("adapter"), None);
    let toks = tokens(8, 0);
    let mut index = KvIndex::default();
    index.add_worker(0);
    index.add_worker(1);
    index.store(0, None, &[100, 101], &toks[..(2 * BS) as usize], BS, lora).expect("stored");
    store(&mut index, 1, None, 200, &toks[..(3 * BS) as usize]);
    let stored = |parent: Option<u64>, hashes: &[u64], from: u32, seed: HashSeed| KvEvent::Stored {
        block_hashes: hashes.to_vec(),
        parent,
        token_ids: toks[(from * BS) as usize..((from + hashes.len() as u32) * BS) as usize].to_vec(),
        block_size: BS,
        seed,
    };
    let window = [
        // Below a held block: its seed is the parent's, not the event's.
        (0, stored(Some(101), &[102, 103], 2, HashSeed::default())),
        // Below the previous event's last block, not stored yet.
        (0, stored(Some(103), &[104], 4, HashSeed::default())),
        (1, KvEvent::Removed { block_hashes: vec![201, 999] }),
        (1, stored(None, &[300], 5, lora)),
    ];
    let slotted: Vec<(Slot, &KvEvent)> = window.iter().map(|(slot, event)| (*slot, event)).collect();
    let mut keys = Vec::new();
    index.holder_keys(&slotted, |seq| keys.push(seq));

    let removed_seq = index.export_worker(1).expect("worker 1").blocks.iter().find(|b| b.engine == 201).map(|b| b.seq);
    for &(slot, event) in &slotted {
        index.apply(slot, event).expect("applied");
    }
    let seq_of = |slot: Slot, engine: u64| {
        index.export_worker(slot).and_then(|w| w.blocks.iter().find(|b| b.engine == engine).map(|b| b.seq))
    };
    let want: Vec<SequenceHash> =
        [seq_of(0, 102), seq_of(0, 103), seq_of(0, 104), removed_seq, seq_of(1, 300)].into_iter().flatten().collect();
    assert_eq!(want.len(), 5, "every block of the window is recorded");
    assert_eq!(keys, want);
    // Chained under the adapter's seed, they are not the plain chain's.
    assert_ne!(keys[..3], prompt(&toks)[2..5]);
}
