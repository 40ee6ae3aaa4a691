//! The memory budget: which blocks go, and that what stays is exactly an
//! unbudgeted index minus the evicted blocks.

use super::*;

fn budgeted(max: u64, workers: Slot) -> KvIndex {
    let mut index = KvIndex::with_max_entries(Some(max));
    index.record_evictions();
    for slot in 0..workers {
        index.add_worker(slot);
    }
    index
}

#[test]
fn the_longest_stored_conversation_goes_first_tail_to_root() {
    let mut index = budgeted(10, 1);
    store(&mut index, 0, None, 100, &tokens(4, 0));
    store(&mut index, 0, None, 200, &tokens(4, 1000));
    assert_eq!(index.take_evicted(), vec![]);
    let applied = store(&mut index, 0, None, 300, &tokens(4, 2000));
    assert_eq!(applied, Applied { stored: 4, evicted: 2, ..Applied::default() });
    // The first conversation's last two blocks: its head still matches.
    assert_eq!(index.take_evicted(), vec![(0, 103), (0, 102)]);
    assert_eq!(index.entries(), 10);
    assert_eq!(matches(&index, &prompt(&tokens(4, 0))), vec![(0, 2)]);
    assert_eq!(matches(&index, &prompt(&tokens(4, 1000))), vec![(0, 4)]);
    // Eviction never leaves a hole, so the jump search needs no scan.
    assert!(index.needs_scan.is_empty());
    store(&mut index, 0, None, 400, &tokens(3, 3000));
    assert_eq!(index.take_evicted(), vec![(0, 101), (0, 100), (0, 203)]);
    assert_eq!(matches(&index, &prompt(&tokens(4, 0))), vec![]);
}

#[test]
fn a_shared_prefix_outlives_the_conversations_on_it() {
    let mut index = budgeted(8, 1);
    let system = tokens(2, 0);
    store(&mut index, 0, None, 10, &system);
    for turn in 0..5u64 {
        store(&mut index, 0, Some(11), 100 * (turn + 1), &tokens(2, 1000 * (turn as u32 + 1)));
    }
    // The system prompt was stored first, yet only conversations went.
    assert!(index.take_evicted().iter().all(|&(_, hash)| hash >= 100));
    assert_eq!(matches(&index, &prompt(&system)), vec![(0, 2)]);
    assert_eq!(index.entries(), 8);
}

#[test]
fn the_budget_is_shared_by_the_workers_of_a_shard() {
    let mut index = budgeted(6, 2);
    store(&mut index, 0, None, 100, &tokens(4, 0));
    store(&mut index, 1, None, 200, &tokens(4, 0));
    assert_eq!(index.take_evicted(), vec![(0, 103), (0, 102)]);
    assert_eq!(matches(&index, &prompt(&tokens(4, 0))), vec![(0, 2), (1, 4)]);
}

#[test]
fn a_budget_in_bytes_leaves_each_workers_fixed_cost_out_and_a_new_worker_evicts_for_its_own() {
    // Room for 200 entries beside two workers.
    let mut index = KvIndex::with_max_bytes(Some(200 * ENTRY_BYTES + 2 * WORKER_BYTES));
    index.record_evictions();
    assert_eq!(index.max_entries(), Some(200 + 2 * WORKER_BYTES / ENTRY_BYTES), "no worker yet");
    assert_eq!((index.add_worker(0), index.add_worker(1)), (0, 0));
    assert_eq!(index.max_entries(), Some(200));
    assert_eq!(index.add_worker(1), 0, "a known worker is not counted twice");
    assert_eq!(index.max_entries(), Some(200));
    store(&mut index, 0, None, 1_000, &tokens(100, 0));
    store(&mut index, 1, None, 2_000, &tokens(100, 100_000));
    assert_eq!(index.entries(), 200);
    assert!(index.take_evicted().is_empty());
    // A third worker's fixed cost comes out of the entries' room: the
    // blocks stored longest ago go at once, tail first, as any eviction.
    let room = (200 * ENTRY_BYTES - WORKER_BYTES) / ENTRY_BYTES;
    let evicted = index.add_worker(2);
    assert_eq!(index.max_entries(), Some(room));
    assert_eq!((evicted, index.entries()), (200 - room, room));
    let gone = index.take_evicted();
    assert_eq!(gone.len() as u64, evicted);
    assert!(gone.iter().enumerate().all(|(i, &(slot, hash))| slot == 0 && hash == 1_099 - i as u64), "{gone:?}");
    assert_eq!(matches(&index, &prompt(&tokens(100, 0))), vec![(0, 100 - evicted as u32)]);
    assert_eq!(matches(&index, &prompt(&tokens(100, 100_000))), vec![(1, 100)]);
    // It leaves, and its room comes back; nothing evicted returns.
    index.remove_worker(2);
    assert_eq!((index.max_entries(), index.entries()), (Some(200), room));
    index.remove_worker(2);
    assert_eq!(index.max_entries(), Some(200), "an unknown worker is not counted off twice");
    // A budget the workers' fixed costs alone exceed keeps one entry.
    let mut tiny = KvIndex::with_max_bytes(Some(WORKER_BYTES));
    tiny.add_worker(0);
    tiny.add_worker(1);
    assert_eq!(tiny.max_entries(), Some(1));
    store(&mut tiny, 0, None, 100, &tokens(3, 0));
    assert_eq!(tiny.entries(), 1);
    // An entry cap is a cap in entries: workers do not change it.
    let mut capped = KvIndex::with_max_entries(Some(20));
    (0..5).for_each(|slot| assert_eq!(capped.add_worker(slot), 0));
    assert_eq!(capped.max_entries(), Some(20));
}

#[test]
fn stale_queue_entries_do_not_pile_up_without_pressure() {
    let mut index = budgeted(1_000_000, 1);
    for round in 0..2_000u64 {
        store(&mut index, 0, None, round * 10, &tokens(4, round as u32 * 100));
        // Compaction runs after a store past 2 × entries + 1024 queued.
        assert!(index.eviction.len() <= 2 * 4 + 1024, "{} queued", index.eviction.len());
        index.remove(0, &[round * 10, round * 10 + 1, round * 10 + 2, round * 10 + 3]).unwrap();
    }
    assert_eq!(index.entries(), 0);
}

#[test]
fn a_worker_with_forged_cycles_goes_first() {
    // Worker 0 re-stores A under its own child B: neither is ever a leaf,
    // and the re-stored content marks the worker tainted.
    let mut index = budgeted(4, 2);
    index.store(0, None, &[1], &tokens(1, 0), BS, HashSeed::default()).unwrap();
    index.store(0, Some(1), &[2], &tokens(1, 10), BS, HashSeed::default()).unwrap();
    index.remove(0, &[1]).unwrap();
    index.store(0, Some(2), &[1], &tokens(1, 20), BS, HashSeed::default()).unwrap();
    assert_eq!(index.entries(), 2);
    assert!(index.worker(0).is_some_and(|w| w.tainted));
    let applied = store(&mut index, 1, None, 100, &tokens(3, 500));
    assert_eq!(applied.evicted, 2);
    let mut evicted = index.take_evicted();
    evicted.sort_unstable();
    assert_eq!(evicted, vec![(0, 1), (0, 2)]);
    assert_eq!((index.worker_blocks(0), index.worker_blocks(1)), (0, 3));
    assert!(index.needs_scan.is_empty());
}

#[test]
fn one_event_never_stores_more_than_the_budget() {
    let mut index = budgeted(3, 1);
    let applied = store(&mut index, 0, None, 100, &tokens(10, 0));
    assert_eq!(applied, Applied { stored: 3, evicted: 7, ..Applied::default() });
    assert_eq!(matches(&index, &prompt(&tokens(10, 0))), vec![(0, 3)]);
    let mut evicted = index.take_evicted();
    evicted.sort_unstable();
    assert_eq!(evicted, (103..110).map(|hash| (0, hash)).collect::<Vec<_>>());
}

#[test]
fn tables_shrink_once_their_blocks_are_gone() {
    let mut index = budgeted(100_000, 1);
    store(&mut index, 0, None, 1 << 20, &tokens(50_000, 0));
    let full = index.approx_bytes();
    let hashes: Vec<u64> = (0..49_990).map(|i| (1 << 20) + 49_999 - i).collect();
    index.remove(0, &hashes).unwrap();
    assert_eq!(index.entries(), 10);
    assert!(index.approx_bytes() * 20 < full, "{} bytes left of {full}", index.approx_bytes());
}

/// Random stores, removals and clears on four workers, far past a small
/// budget: after every event the budgeted index holds no more than its
/// cap and answers exactly as an unbudgeted one that was told of each
/// eviction as a removal ("evicted blocks simply stop matching").
#[test]
fn a_budgeted_index_is_an_unbudgeted_one_minus_its_evictions() {
    const WORKERS: Slot = 4;
    let mut rng = fastrand::Rng::with_seed(7);
    for max in [1, 5, 40, 300] {
        let mut capped = budgeted(max, WORKERS);
        let mut mirror = KvIndex::default();
        (0..WORKERS).for_each(|slot| {
            mirror.add_worker(slot);
        });
        // Conversations: a few shared system prompts, then turns.
        let mut held: Vec<Vec<u64>> = vec![Vec::new(); WORKERS as usize];
        let mut gone: Vec<u64> = Vec::new();
        let mut next_hash = 1u64;
        let probes: Vec<Vec<SequenceHash>> = (0..6).map(|p| prompt(&tokens(24, p * 50))).collect();
        let (mut evicted, mut matched) = (0, 0);
        for _ in 0..3_000 {
            let slot = rng.u32(0..WORKERS);
            let mine = &mut held[slot as usize];
            match rng.u8(0..40) {
                0..=27 => {
                    let parent = if mine.is_empty() || rng.bool() { None } else { Some(mine[rng.usize(..mine.len())]) };
                    let n = rng.usize(1..6);
                    let mut hashes: Vec<u64> = (0..n as u64).map(|i| next_hash + i).collect();
                    next_hash += n as u64;
                    // Sometimes a hash removed earlier comes back, maybe
                    // with other tokens: adoption, taint and forged cycles.
                    if !gone.is_empty() && rng.u8(0..4) == 0 {
                        hashes[0] = gone[rng.usize(..gone.len())];
                    }
                    let toks = tokens(n, rng.u32(0..6) * 50 + rng.u32(0..3) * 4);
                    let a = capped.store(slot, parent, &hashes, &toks, BS, HashSeed::default());
                    let b = mirror.store(slot, parent, &hashes, &toks, BS, HashSeed::default());
                    // Stored counts differ when the event alone passes the
                    // cap; the states are compared below.
                    assert_eq!(a.is_ok(), b.is_ok());
                    if a.is_ok() {
                        mine.extend(&hashes);
                    }
                }
                28..=38 if !mine.is_empty() => {
                    let out: Vec<u64> = (0..rng.usize(1..4)).map(|_| mine[rng.usize(..mine.len())]).collect();
                    capped.remove(slot, &out).unwrap();
                    mirror.remove(slot, &out).unwrap();
                    gone.extend(&out);
                }
                39 => {
                    capped.clear(slot);
                    mirror.clear(slot);
                    mine.clear();
                }
                _ => {}
            }
            // Evicting leaves never opens a hole: no worker starts needing
            // a scan because of an eviction.
            let scanned_before = mirror.needs_scan.clone();
            for (slot, hash) in capped.take_evicted() {
                evicted += 1;
                assert_eq!(mirror.remove(slot, &[hash]).unwrap().removed, 1, "evicted a block it held");
            }
            let opened: Vec<_> = mirror.needs_scan.iter().filter(|slot| !scanned_before.contains(*slot)).collect();
            assert!(opened.is_empty(), "eviction left holes in {opened:?}");
            assert_whole(&capped);
            assert_whole(&mirror);
            assert!(capped.entries() <= max, "{} entries over a cap of {max}", capped.entries());
            assert_eq!(capped.entries(), mirror.entries());
            for slot in 0..WORKERS {
                assert_eq!(capped.worker_blocks(slot), mirror.worker_blocks(slot));
            }
            for probe in &probes {
                let found = matches(&capped, probe);
                matched += found.len();
                assert_eq!(found, matches(&mirror, probe));
            }
        }
        // The run exercised what it claims to: evictions, and probes that hit.
        assert!(evicted > 100 && matched > 100, "cap {max}: {evicted} evicted, {matched} matches");
    }
}
