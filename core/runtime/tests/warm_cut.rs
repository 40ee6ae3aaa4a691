//! Warm start's cut on the shard runtime: an export pushed between a
//! producer's events holds exactly the events before it, on every kind
//! of shard; an import pushed ahead of later events, then those events,
//! gives the worker the index of one that saw them all.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::Duration;

use futures_lite::future::block_on;
use kvpick_core::event::KvEvent;
use kvpick_core::hashing::HashSeed;
use kvpick_core::prompt::Prompt;
use kvpick_core::shard::Shard;
use kvpick_core::{Millis, RouterConfig, WorkerId, WorkerSpec};
use kvpick_runtime::{Clock, RuntimeChoice, RuntimeConfig, RuntimeKind, ShardedService, probe_glommio};

const BS: u32 = 4;
const WARM: WorkerId = WorkerId(2);

fn spec(id: u64) -> WorkerSpec {
    WorkerSpec::new(WorkerId(id), SocketAddr::from(([10, 0, 0, id as u8], 8000)), BS)
}

fn start(shards: usize, kind: RuntimeKind) -> ShardedService {
    let runtime = RuntimeConfig {
        shards,
        cpus: vec![],
        choice: RuntimeChoice::Force(kind),
        ring_capacity: 16,
        selection_wait: Duration::from_secs(5),
        ..RuntimeConfig::default()
    };
    let service = ShardedService::start(RouterConfig::default(), BS, runtime, Clock::manual(Millis(0)))
        .unwrap_or_else(|e| panic!("{kind:?} runtime: {e}"));
    let producer = RefCell::new(service.producer());
    for id in 1..=3 {
        block_on(service.upsert_worker(&producer, spec(id), Millis(0))).unwrap_or_else(|e| panic!("{e:?}"));
    }
    service
}

/// Random events for three workers: chains stored and extended, blocks
/// removed. Also every chain's tokens from its root, to probe with.
fn events(seed: u64) -> (Vec<(WorkerId, KvEvent)>, Vec<Vec<u32>>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut chains: Vec<(WorkerId, u64, Vec<u32>)> = Vec::new();
    let mut stored: Vec<(WorkerId, u64)> = Vec::new();
    let mut out = Vec::new();
    let mut next = 1u64;
    for _ in 0..200 {
        let worker = WorkerId(rng.u64(1..4));
        if rng.u8(0..5) == 0 {
            let mine: Vec<u64> = stored.iter().filter(|(w, _)| *w == worker).map(|(_, h)| *h).collect();
            if !mine.is_empty() {
                out.push((worker, KvEvent::Removed { block_hashes: vec![mine[rng.usize(..mine.len())]] }));
            }
            continue;
        }
        let n = rng.u64(1..4);
        let new: Vec<u32> = (0..n as u32 * BS).map(|_| rng.u32(0..1000)).collect();
        let extend = chains.iter().rposition(|c| c.0 == worker);
        let (parent, tokens) = match extend.filter(|_| rng.bool()) {
            Some(i) => {
                let mut tokens = chains[i].2.clone();
                tokens.extend(&new);
                (Some(chains[i].1), tokens)
            }
            None => (None, new.clone()),
        };
        let hashes: Vec<u64> = (next..next + n).collect();
        next += n;
        stored.extend(hashes.iter().map(|h| (worker, *h)));
        chains.push((worker, hashes[hashes.len() - 1], tokens));
        let event =
            KvEvent::Stored { block_hashes: hashes, parent, token_ids: new, block_size: BS, seed: HashSeed::default() };
        out.push((worker, event));
    }
    (out, chains.into_iter().map(|c| c.2).collect())
}

fn cut_and_continue(kind: RuntimeKind, shards: usize, seed: u64) {
    let (events, probes) = events(seed);
    let cut = events.len() / 2;
    let peer = start(shards, kind);
    let producer = RefCell::new(peer.producer());
    // What the peer's shard holds for WARM after the events before the cut.
    let mut reference = Shard::new();
    reference.upsert_worker(spec(WARM.0));
    let mut exported = None;
    for (i, (worker, event)) in events.iter().enumerate() {
        if i == cut {
            exported = Some(peer.export_worker(&mut producer.borrow_mut(), WARM).unwrap_or_else(|e| panic!("{e}")));
        }
        if i < cut && *worker == WARM {
            let _ = reference.apply_event(WARM, event);
        }
        let _ = peer.apply_kv_event(&mut producer.borrow_mut(), *worker, event.clone());
    }
    let exported = exported.unwrap_or_else(|| panic!("no export pushed"));
    let snapshot = exported
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{kind:?}: no export: {e}"))
        .unwrap_or_else(|| panic!("{kind:?}: the worker was not exported"));
    let want = reference.export_worker(WARM).unwrap_or_else(|| panic!("reference export"));
    assert_eq!(
        snapshot.blocks.clone().sorted(),
        want.blocks.clone().sorted(),
        "{kind:?}: the cut is not the events before it"
    );
    assert_eq!((snapshot.churn_stored, snapshot.churn_removed), (want.churn_stored, want.churn_removed));

    // A replica starting up: the import first, then the events after the cut.
    let replica = start(shards, kind);
    let replica_producer = RefCell::new(replica.producer());
    let imported =
        replica.import_worker(&mut replica_producer.borrow_mut(), WARM, snapshot).unwrap_or_else(|e| panic!("{e}"));
    for (worker, event) in events.iter().skip(cut).filter(|(w, _)| *w == WARM) {
        let _ = replica.apply_kv_event(&mut replica_producer.borrow_mut(), *worker, event.clone());
    }
    let applied = imported.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    assert_eq!(applied.map(|a| a.stored), Ok(want.blocks.blocks.len() as u64));
    let mut hits = 0;
    for tokens in &probes {
        let prompt = Prompt::from_tokens(tokens, BS, HashSeed::default());
        let only_warm = |found: Vec<(WorkerId, u32)>| found.into_iter().filter(|(w, _)| *w == WARM).collect::<Vec<_>>();
        let at_peer = only_warm(block_on(peer.overlap_scores(&producer, &prompt)));
        hits += at_peer.len();
        assert_eq!(only_warm(block_on(replica.overlap_scores(&replica_producer, &prompt))), at_peer, "{kind:?}");
    }
    assert!(hits > 5, "{kind:?}: only {hits} probes matched the warm worker");
    drop((producer, replica_producer));
    peer.shutdown();
    replica.shutdown();
}

#[test]
fn an_export_holds_exactly_the_events_before_it_on_every_kind_of_shard() {
    let mut kinds = vec![RuntimeKind::Inline, RuntimeKind::StdThreads];
    if let Err(why) = probe_glommio(None) {
        panic!("glommio cannot start on this machine ({why})");
    }
    kinds.push(RuntimeKind::Glommio);
    for kind in kinds {
        for (shards, seed) in [(1, 1), (2, 2), (2, 3)] {
            cut_and_continue(kind, shards, seed);
        }
    }
}
