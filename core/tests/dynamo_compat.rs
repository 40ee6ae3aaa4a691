use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::*;
use kvpick_core::hashing::HashSeed;
use kvpick_core::{KvEvent, RouterConfig, SelectionService, WorkerId, WorkerSpec};

const BS: u32 = 2;

fn ev(w: u64, id: u64, data: KvCacheEventData) -> RouterEvent {
    RouterEvent::new(w, KvCacheEvent { event_id: id, data, dp_rank: 0 })
}
fn store(parent: Option<u64>, blocks: &[(u64, [u32; 2])]) -> KvCacheEventData {
    KvCacheEventData::Stored(KvCacheStoreData {
        parent_hash: parent.map(ExternalSequenceBlockHash),
        start_position: None,
        blocks: blocks
            .iter()
            .map(|(h, t)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(*h),
                tokens_hash: compute_block_hash_for_seq(t, BS, BlockHashOptions::default())[0],
                mm_extra_info: None,
            })
            .collect(),
    })
}
fn rm(h: &[u64]) -> KvCacheEventData {
    KvCacheEventData::Removed(KvCacheRemoveData {
        block_hashes: h.iter().map(|h| ExternalSequenceBlockHash(*h)).collect(),
    })
}
fn q(t: &RadixTree, toks: &[u32]) -> Vec<(u64, u32)> {
    let mut v: Vec<_> = t
        .find_matches(compute_block_hash_for_seq(toks, BS, BlockHashOptions::default()), false)
        .scores
        .into_iter()
        .map(|(w, s)| (w.worker_id, s))
        .collect();
    v.sort();
    v
}

#[test]
fn explore() {
    // case 1: single edge, remove middle, restore
    let mut t = RadixTree::new();
    println!("{:?}", t.apply_event(ev(1, 0, store(None, &[(10, [1, 1]), (11, [2, 2]), (12, [3, 3])]))));
    println!("{:?}", t.apply_event(ev(1, 1, rm(&[11]))));
    println!("after rm {:?}", q(&t, &[1, 1, 2, 2, 3, 3]));
    println!("{:?}", t.apply_event(ev(1, 2, store(Some(10), &[(11, [2, 2])]))));
    println!("case1 {:?}", q(&t, &[1, 1, 2, 2, 3, 3]));
    println!("store off stale 12: {:?}", t.apply_event(ev(1, 3, store(Some(12), &[(13, [4, 4])]))));

    // case 2: w2 forces split
    let mut t = RadixTree::new();
    println!("{:?}", t.apply_event(ev(1, 0, store(None, &[(10, [1, 1]), (11, [2, 2])]))));
    println!("{:?}", t.apply_event(ev(2, 0, store(None, &[(10, [1, 1]), (11, [2, 2]), (20, [9, 9])]))));
    println!("{:?}", t.apply_event(ev(1, 1, store(Some(11), &[(12, [3, 3])]))));
    println!("{:?}", t.apply_event(ev(1, 2, rm(&[11]))));
    println!("{:?}", t.apply_event(ev(1, 3, store(Some(10), &[(11, [2, 2])]))));
    println!("case2 {:?}", q(&t, &[1, 1, 2, 2, 3, 3]));

    // case 3: different engine hashes across workers
    let mut t = RadixTree::new();
    println!("{:?}", t.apply_event(ev(1, 0, store(None, &[(10, [1, 1]), (11, [2, 2])]))));
    println!("{:?}", t.apply_event(ev(2, 0, store(None, &[(50, [1, 1])]))));
    println!("case3 store {:?}", t.apply_event(ev(2, 1, store(Some(50), &[(51, [2, 2])]))));
    println!("case3 {:?}", q(&t, &[1, 1, 2, 2, 3, 3]));

    // case 4: same worker, same content, different hash (dup)
    let mut t = RadixTree::new();
    println!("{:?}", t.apply_event(ev(1, 0, store(None, &[(10, [1, 1])]))));
    println!("{:?}", t.apply_event(ev(1, 1, store(None, &[(60, [1, 1])]))));
    println!("{:?}", t.apply_event(ev(1, 2, rm(&[10]))));
    println!("case4 {:?}", q(&t, &[1, 1, 2, 2, 3, 3]));

    let mut s = SelectionService::new(RouterConfig::default(), BS, 1);
    s.upsert_worker(WorkerSpec::new(WorkerId(1), "10.0.0.1:8000".parse().unwrap(), BS), kvpick_core::Millis(0))
        .unwrap();
    let _ = s.apply_kv_event(
        WorkerId(1),
        &KvEvent::Stored {
            block_hashes: vec![10],
            parent: None,
            token_ids: vec![1, 1],
            block_size: BS,
            seed: HashSeed::default(),
        },
    );
}
