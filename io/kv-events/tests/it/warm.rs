//! Warm start over real libzmq: a replica starting up holds its new
//! stream, takes a peer's export of the worker with the peer's cut, and
//! continues from there (the gap after the cut from the engine's replay):
//! its index ends up the peer's, nothing lost or applied twice. Without a
//! seed, the hold's deadline starts the stream as usual.

use std::time::{Duration, Instant};

use futures_lite::future::block_on;
use kvpick_core::WorkerId;
use kvpick_kv_events::{KvEventIngest, SeedRefused, StreamCut, WorkerSeed};

use crate::common::events::chain_batch;
use crate::common::publisher::ReplayLayout;
use crate::common::{WAIT, config, one_publisher, overlap, service, spawn, wait_for_seq};

const WORKER: WorkerId = WorkerId(1);

fn export_of(ingest: &KvEventIngest) -> (StreamCut, kvpick_core::shard::WorkerSnapshot) {
    block_on(ingest.export(WORKER)).unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("nothing exported"))
}

#[test]
fn a_seeded_stream_continues_from_the_peers_cut_with_nothing_lost_or_doubled() {
    // The peer has followed the engine from its start.
    let (peer_svc, peer, mut engine) = one_publisher("kv", true, config(WAIT));
    for k in 0..6 {
        engine.publish(k, chain_batch(k));
    }
    wait_for_seq(&peer, 1, 5);
    let (cut, snapshot) = export_of(&peer);
    assert_eq!((cut.last_seq, snapshot.blocks.blocks.len()), (5, 6));
    assert!(cut.last_ts.is_some() && cut.groups == vec![Some(true)], "{cut:?}");
    // After the cut, before the replica listens: only a replay has them.
    engine.publish(6, chain_batch(6));
    engine.publish(7, chain_batch(7));

    let svc = service(&[1]);
    let replica = spawn(&svc, config(WAIT));
    replica.hold_for_seeds(Instant::now() + WAIT).unwrap_or_else(|e| panic!("{e}"));
    replica.add(engine.publisher(WORKER, true)).unwrap_or_else(|e| panic!("{e}"));
    engine.wait_subscribed();
    // Held at the replica (or, if it comes late, seen after the seed):
    // either way, after the cut.
    engine.publish(8, chain_batch(8));
    wait_for_seq(&peer, 1, 8);
    assert_eq!(block_on(replica.export(WORKER)).ok().flatten(), None, "a held stream has no cut to export");
    let applied = block_on(replica.seed(WorkerSeed { worker: WORKER, cut, snapshot }))
        .unwrap_or_else(|e| panic!("seed refused: {e}"))
        .unwrap_or_else(|e| panic!("import refused: {e}"));
    assert_eq!(applied.stored, 6);
    // Not a catch-up from 0: the replica asks only for what follows the cut.
    assert_eq!(engine.serve_replay(ReplayLayout::WithTopic), 6);
    wait_for_seq(&replica, 1, 8);
    engine.publish(9, chain_batch(9));
    wait_for_seq(&replica, 1, 9);
    wait_for_seq(&peer, 1, 9);

    // Any batch applied out of order, twice or not at all would show as an
    // unknown parent or a shorter chain.
    assert_eq!(overlap(&svc, 1, 10), 10);
    assert_eq!(overlap(&peer_svc, 1, 10), 10);
    let (mine, theirs) = (export_of(&replica), export_of(&peer));
    assert_eq!(mine.1.blocks.sorted(), theirs.1.blocks.sorted());
    assert_eq!(mine.0.last_seq, 9);
    let m = replica.metrics().snapshot();
    assert_eq!((m.streams_seeded, m.streams_released_cold, m.lost_batches, m.unknown_parent_events), (1, 0, 0, 0));
    assert_eq!(m.replays_started, 1, "the gap's only, no catch-up");
    assert_eq!(peer.metrics().snapshot().streams_exported, 2, "at the cut and at the end");
    replica.shutdown().unwrap_or_else(|e| panic!("{e}"));
    peer.shutdown().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn without_a_seed_the_deadline_starts_the_stream_as_usual() {
    let svc = service(&[1]);
    let replica = spawn(&svc, config(WAIT));
    let mut engine = crate::common::publisher::TestPublisher::bind("kv");
    for k in 0..3 {
        engine.record(k, chain_batch(k));
    }
    replica.hold_for_seeds(Instant::now() + Duration::from_millis(300)).unwrap_or_else(|e| panic!("{e}"));
    replica.add(engine.publisher(WORKER, true)).unwrap_or_else(|e| panic!("{e}"));
    engine.wait_subscribed();
    // The hold ends at its deadline: the catch-up an unheld stream asks
    // for at once, from 0.
    assert_eq!(engine.serve_replay(ReplayLayout::WithTopic), 0);
    wait_for_seq(&replica, 1, 2);
    assert_eq!(overlap(&svc, 1, 3), 3);
    let m = replica.metrics().snapshot();
    assert_eq!((m.streams_seeded, m.streams_released_cold), (0, 1));
    // Too late for a seed now.
    let seed = WorkerSeed { worker: WORKER, cut: StreamCut::default(), snapshot: Default::default() };
    assert_eq!(block_on(replica.seed(seed.clone())), Err(SeedRefused::NotHeld));
    let stranger = WorkerSeed { worker: WorkerId(9), ..seed };
    // The seed comes back whole, for a later try.
    assert_eq!(block_on(replica.seed(stranger.clone())), Err(SeedRefused::NotSubscribed(Box::new(stranger))));
    replica.shutdown().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_seed_its_shard_refuses_starts_the_stream_over() {
    let svc = service(&[1]);
    let replica = spawn(&svc, config(WAIT));
    let mut engine = crate::common::publisher::TestPublisher::bind("kv");
    for k in 0..3 {
        engine.record(k, chain_batch(k));
    }
    replica.hold_for_seeds(Instant::now() + WAIT).unwrap_or_else(|e| panic!("{e}"));
    replica.add(engine.publisher(WORKER, true)).unwrap_or_else(|e| panic!("{e}"));
    engine.wait_subscribed();
    // Hashed at 8 tokens a block; this replica's worker is at 4.
    let snapshot = kvpick_core::shard::WorkerSnapshot { block_size: 8, ..Default::default() };
    let cut = StreamCut { last_seq: 2, ..StreamCut::default() };
    let imported = block_on(replica.seed(WorkerSeed { worker: WORKER, cut, snapshot }));
    assert!(matches!(imported, Ok(Err(kvpick_core::index::ImportError::BlockSizeMismatch { .. }))), "{imported:?}");
    // Subscribed again, held again until the release, then caught up from
    // 0 as a new subscription is.
    engine.wait_subscribed();
    replica.release_holds().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(engine.serve_replay(ReplayLayout::WithTopic), 0);
    wait_for_seq(&replica, 1, 2);
    assert_eq!(overlap(&svc, 1, 3), 3);
    replica.shutdown().unwrap_or_else(|e| panic!("{e}"));
}
