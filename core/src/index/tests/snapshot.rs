//! Export and import of one worker's blocks (warm start): an imported
//! worker answers, and goes on answering under every later event, exactly
//! as the one it was exported from.

use super::*;

/// A random event for worker `slot`, applied to every index in `to`; the
/// results must agree. Stores chain off held blocks, reuse removed hashes
/// (adoption, taint, forged cycles) and sometimes carry a LoRA seed.
struct Events {
    rng: fastrand::Rng,
    held: Vec<Vec<u64>>,
    gone: Vec<u64>,
    next_hash: u64,
}

impl Events {
    fn new(seed: u64, workers: usize) -> Self {
        Events { rng: fastrand::Rng::with_seed(seed), held: vec![Vec::new(); workers], gone: Vec::new(), next_hash: 1 }
    }

    fn apply(&mut self, slot: Slot, to: &mut [&mut KvIndex]) {
        let rng = &mut self.rng;
        let mine = &mut self.held[slot as usize];
        let results: Vec<Result<Applied, EventError>> = match rng.u8(0..40) {
            0..=27 => {
                let parent = if mine.is_empty() || rng.bool() { None } else { Some(mine[rng.usize(..mine.len())]) };
                let n = rng.usize(1..6);
                let mut hashes: Vec<u64> = (0..n as u64).map(|i| self.next_hash + i).collect();
                self.next_hash += n as u64;
                if !self.gone.is_empty() && rng.u8(0..4) == 0 {
                    hashes[0] = self.gone[rng.usize(..self.gone.len())];
                }
                let toks = tokens(n, rng.u32(0..6) * 50 + rng.u32(0..3) * 4);
                let seed = if rng.u8(0..5) == 0 { HashSeed::new(Some("adapter"), None) } else { HashSeed::default() };
                let results: Vec<_> = to.iter_mut().map(|i| i.store(slot, parent, &hashes, &toks, BS, seed)).collect();
                if results[0].is_ok() {
                    mine.extend(&hashes);
                }
                results
            }
            28..=38 if !mine.is_empty() => {
                let out: Vec<u64> = (0..rng.usize(1..4)).map(|_| mine[rng.usize(..mine.len())]).collect();
                self.gone.extend(&out);
                to.iter_mut().map(|i| i.remove(slot, &out)).collect()
            }
            39 => {
                mine.clear();
                to.iter_mut().map(|i| Ok(i.clear(slot))).collect()
            }
            _ => return,
        };
        assert!(results.windows(2).all(|w| w[0] == w[1]), "the indexes answered differently: {results:?}");
        for index in to.iter() {
            assert_whole(index);
        }
    }
}

fn with_budget(max: u64) -> KvIndex {
    let mut index = KvIndex::with_max_entries(Some(max));
    index.add_worker(0);
    index
}

fn probes() -> Vec<Vec<SequenceHash>> {
    let mut probes: Vec<Vec<SequenceHash>> = (0..6).map(|p| prompt(&tokens(24, p * 50))).collect();
    probes.extend((0..6).map(|p| sequence_hashes(&tokens(24, p * 50), BS, HashSeed::new(Some("adapter"), None))));
    probes
}

/// Worker `slot` of `a` and of `b` answer alike in everything observable.
fn same_worker(a: &KvIndex, b: &KvIndex, slot: Slot, probes: &[Vec<SequenceHash>]) -> usize {
    assert_eq!(a.worker_blocks(slot), b.worker_blocks(slot));
    assert_eq!(a.needs_scan.contains(slot), b.needs_scan.contains(slot));
    assert_eq!(a.export_worker(slot).map(WorkerExport::sorted), b.export_worker(slot).map(WorkerExport::sorted));
    let mut hits = 0;
    for probe in probes {
        let only = |found: Vec<(Slot, u32)>| found.into_iter().filter(|(s, _)| *s == slot).collect::<Vec<_>>();
        let found = only(matches(a, probe));
        hits += found.len();
        assert_eq!(found, only(matches(b, probe)));
    }
    hits
}

#[test]
fn an_imported_worker_answers_as_the_exported_one_under_any_later_events() {
    let probes = probes();
    let (mut imports, mut hits, mut scanned) = (0, 0, 0);
    for seed in 0..8 {
        let mut events = Events::new(seed, 2);
        // `a` is the peer (two workers); `b` the replica starting up, which
        // takes worker 0 from `a` now and then, and from then on gets the
        // same events for it.
        let mut a = KvIndex::default();
        a.add_worker(0);
        a.add_worker(1);
        let mut b = KvIndex::default();
        b.add_worker(0);
        let mut imported = false;
        for step in 0..1_500 {
            if step % 300 == 150 {
                let export = a.export_worker(0).unwrap_or_default();
                let applied = b.import_worker(0, &export).unwrap_or_else(|e| panic!("import: {e}"));
                assert_eq!(applied.stored, a.worker_blocks(0) as u64);
                imported = true;
                imports += 1;
            }
            let slot = events.rng.u32(0..2);
            if slot == 0 && imported {
                events.apply(0, &mut [&mut a, &mut b]);
            } else {
                events.apply(slot, &mut [&mut a]);
            }
            if imported {
                hits += same_worker(&a, &b, 0, &probes);
                scanned += usize::from(b.needs_scan.contains(0));
                assert_eq!(b.entries(), a.worker_blocks(0) as u64);
            }
        }
    }
    // The runs reached what they claim to: matches, and workers with holes
    // or taint (scanned block by block) carried over.
    assert!(imports >= 32 && hits > 1_000 && scanned > 100, "{imports} imports, {hits} hits, {scanned} scanned");
}

#[test]
fn an_import_replaces_what_the_worker_held_and_leaves_the_others() {
    let mut a = KvIndex::default();
    a.add_worker(0);
    store(&mut a, 0, None, 100, &tokens(6, 0));
    let export = a.export_worker(0).unwrap_or_default();

    let mut b = KvIndex::default();
    b.add_worker(0);
    b.add_worker(1);
    store(&mut b, 0, None, 900, &tokens(3, 5000));
    store(&mut b, 1, None, 100, &tokens(4, 0));
    let applied = b.import_worker(0, &export).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((applied.stored, applied.removed, applied.evicted), (6, 3, 0));
    assert_eq!(matches(&b, &prompt(&tokens(6, 0))), vec![(0, 6), (1, 4)]);
    assert_eq!(matches(&b, &prompt(&tokens(3, 5000))), vec![]);
    assert_eq!(b.entries(), 10);
    // A continuation stored after the import chains onto the imported blocks.
    store(&mut b, 0, Some(105), 200, &tokens(2, 24));
    assert_eq!(matches(&b, &prompt(&tokens(8, 0))), vec![(0, 8), (1, 4)]);
}

#[test]
fn a_malformed_import_is_refused_and_changes_nothing() {
    let mut index = KvIndex::default();
    index.add_worker(0);
    store(&mut index, 0, None, 100, &tokens(3, 0));
    let block = |engine, parent| BlockRecord { engine, parent, seq: SequenceHash(engine * 7), seed: None };
    let twice = WorkerExport { blocks: vec![block(1, None), block(1, None)], ..WorkerExport::default() };
    assert_eq!(index.import_worker(0, &twice), Err(ImportError::DuplicateBlock(1)));
    let held_orphan = WorkerExport {
        blocks: vec![block(1, None)],
        orphaned: vec![OrphanRecord { engine: 1, chained_from: SequenceHash(3) }],
        tainted: false,
    };
    assert_eq!(index.import_worker(0, &held_orphan), Err(ImportError::BadOrphan(1)));
    let own_parent = WorkerExport { blocks: vec![block(1, Some(1))], ..WorkerExport::default() };
    assert_eq!(index.import_worker(0, &own_parent), Err(ImportError::OwnParent(1)));
    assert_eq!(index.import_worker(5, &WorkerExport::default()), Err(ImportError::UnknownWorker));
    // Four blocks and the missing parent two of them name: five records.
    let five = WorkerExport {
        blocks: vec![block(1, None), block(2, Some(1)), block(3, Some(9)), block(4, Some(9))],
        ..WorkerExport::default()
    };
    assert_eq!(five.check_within(5), Ok(()));
    assert_eq!(five.check_within(4), Err(ImportError::TooManyRecords { records: 5, most: 4 }));
    assert_eq!(index.entries(), 3);
    assert_eq!(matches(&index, &prompt(&tokens(3, 0))), vec![(0, 3)]);
}

#[test]
fn a_child_whose_parent_has_no_record_makes_the_worker_scanned() {
    // Block 2 hangs off block 1, which is neither held nor recorded as an
    // orphan: its chain cannot be checked, so the worker is scanned and
    // block 2 alone never matches as a prefix.
    let mut index = KvIndex::default();
    index.add_worker(0);
    let seqs = prompt(&tokens(2, 0));
    let export = WorkerExport {
        blocks: vec![BlockRecord { engine: 2, parent: Some(1), seq: seqs[1], seed: None }],
        ..WorkerExport::default()
    };
    index.import_worker(0, &export).unwrap_or_else(|e| panic!("{e}"));
    assert!(index.needs_scan.contains(0));
    assert_eq!(matches(&index, &seqs), vec![]);
    let out = index.export_worker(0).unwrap_or_default();
    assert!(out.tainted && out.orphaned == vec![OrphanRecord { engine: 1, chained_from: SequenceHash(0) }], "{out:?}");
}

#[test]
fn a_budgeted_import_keeps_the_newest_and_gives_up_the_oldest_leaves() {
    // The peer stored three conversations in turn; its export lists them
    // oldest first. An importer with room for 7 of their 12 blocks drops
    // the oldest conversation's tail first, as the peer itself would.
    let mut peer = with_budget(100);
    store(&mut peer, 0, None, 100, &tokens(4, 0));
    store(&mut peer, 0, None, 200, &tokens(4, 1000));
    store(&mut peer, 0, None, 300, &tokens(4, 2000));
    let export = peer.export_worker(0).unwrap_or_default();
    assert_eq!(
        export.blocks.iter().map(|b| b.engine).collect::<Vec<_>>(),
        [100, 101, 102, 103, 200, 201, 202, 203, 300, 301, 302, 303]
    );
    let mut replica = with_budget(7);
    let applied = replica.import_worker(0, &export).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((applied.stored, applied.evicted), (12, 5));
    assert_eq!(replica.entries(), 7);
    assert_eq!(matches(&replica, &prompt(&tokens(4, 0))), vec![]);
    assert_eq!(matches(&replica, &prompt(&tokens(4, 1000))), vec![(0, 3)]);
    assert_eq!(matches(&replica, &prompt(&tokens(4, 2000))), vec![(0, 4)]);
    assert!(replica.needs_scan.is_empty(), "eviction after import left a hole");
}

/// What a lying peer could send: random parent links (cycles, dangling
/// parents, shared sequence hashes), random orphan records and taint.
/// Whatever is accepted, later events never break the index's counts.
#[test]
fn any_accepted_import_keeps_the_index_whole_under_later_events() {
    let mut rng = fastrand::Rng::with_seed(11);
    let (mut accepted, mut refused) = (0, 0);
    for round in 0..300 {
        let n = rng.usize(0..40);
        let blocks: Vec<BlockRecord> = (0..n)
            .map(|_| BlockRecord {
                engine: rng.u64(1..60),
                parent: rng.bool().then(|| rng.u64(1..60)),
                seq: SequenceHash(rng.u64(0..30)),
                seed: rng.bool().then(|| HashSeed(rng.u64(0..3))),
            })
            .collect();
        let orphaned = (0..rng.usize(0..4))
            .map(|_| OrphanRecord { engine: rng.u64(1..60), chained_from: SequenceHash(rng.u64(0..30)) })
            .collect();
        let export = WorkerExport { blocks, orphaned, tainted: rng.u8(0..4) == 0 };
        let mut index = if round % 2 == 0 { KvIndex::default() } else { with_budget(rng.u64(1..30)) };
        index.add_worker(0);
        if index.import_worker(0, &export).is_err() {
            refused += 1;
            continue;
        }
        accepted += 1;
        let mut events = Events::new(round, 1);
        // The events' hashes start past the import's, then meet them.
        events.next_hash = 40;
        events.gone.extend(export.blocks.iter().map(|b| b.engine));
        // Removals and parents reach the imported blocks too.
        events.held[0].extend(export.blocks.iter().map(|b| b.engine));
        for _ in 0..200 {
            events.apply(0, &mut [&mut index]);
            assert_eq!(index.entries(), index.worker_blocks(0) as u64);
            let again = index.export_worker(0).unwrap_or_default();
            let mut copy = KvIndex::default();
            copy.add_worker(0);
            assert_eq!(copy.import_worker(0, &again).map(|a| a.stored), Ok(again.blocks.len() as u64));
        }
    }
    assert!(accepted > 50 && refused > 50, "{accepted} accepted, {refused} refused");
}
