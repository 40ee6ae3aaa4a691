//! End to end into the thread-per-core runtime: a real ZMQ publisher, the
//! ingest thread, its SPSC rings and the shard threads.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::common::events::{BLOCK_SIZE, chain_batch, prompt_tokens, removed_blocks};
use crate::common::publisher::TestPublisher;
use crate::common::{WAIT, config, wait_for_seq, wait_until};
use futures_lite::future::block_on;
use kvpick_core::{HashSeed, Millis, Prompt, RouterConfig, WorkerId, WorkerSpec};
use kvpick_kv_events::{KvEventIngest, ShardSink};
use kvpick_runtime::{Clock, RuntimeChoice, RuntimeConfig, RuntimeKind, ShardedService};

#[test]
fn events_reach_the_shard_threads_in_order() {
    let runtime = RuntimeConfig {
        shards: 2,
        cpus: Vec::new(),
        choice: RuntimeChoice::Force(RuntimeKind::StdThreads),
        ..RuntimeConfig::default()
    };
    let service =
        Arc::new(ShardedService::start(RouterConfig::default(), BLOCK_SIZE, runtime, Clock::system()).expect("starts"));
    let control = RefCell::new(service.producer());
    for id in [1, 2] {
        let endpoint: SocketAddr = format!("10.0.0.{id}:8000").parse().expect("test address");
        block_on(service.upsert_worker(&control, WorkerSpec::new(WorkerId(id), endpoint, BLOCK_SIZE), Millis(0)))
            .expect("upsert");
    }
    let ingest = KvEventIngest::spawn(config(WAIT), ShardSink::new(service.clone())).expect("ingest starts");
    let mut publishers = [TestPublisher::bind(""), TestPublisher::bind("")];
    for (i, publisher) in publishers.iter().enumerate() {
        ingest.add(publisher.publisher(WorkerId(i as u64 + 1), false)).expect("add");
        publisher.wait_subscribed();
    }
    for k in 0..6 {
        publishers[0].publish(k, chain_batch(k));
    }
    for k in 0..2 {
        publishers[1].publish(k, chain_batch(k));
    }
    publishers[0].publish(6, crate::common::events::batch(vec![removed_blocks(&[5])]));
    wait_for_seq(&ingest, 1, 6);
    wait_for_seq(&ingest, 2, 1);
    let prompt = Prompt::from_tokens(&prompt_tokens(6), BLOCK_SIZE, HashSeed::default());
    // The ingest has handed everything over; the shards apply it shortly.
    wait_until("the shards applied every event", || {
        block_on(service.overlap_scores(&control, &prompt)) == vec![(WorkerId(1), 5), (WorkerId(2), 2)]
    });
    let stats = block_on(service.shard_stats(&control));
    assert_eq!((stats.blocks_stored, stats.blocks_removed, stats.unknown_parent_events), (8, 1, 0));
    ingest.shutdown().expect("ingest stops");
    service.shutdown();
}
