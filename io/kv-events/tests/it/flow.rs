//! The ingest applies a publisher's batches in order, by the decoder's rules.

use crate::common::events::{batch, chain_batch, cleared, removed_blocks, stored_block_positional, stored_with};
use crate::common::publisher::TestPublisher;
use crate::common::{WAIT, cached_blocks, config, one_publisher, overlap, service, spawn, wait_for_seq};
use kvpick_core::WorkerId;

#[test]
fn batches_are_applied_in_order_and_counted() {
    let (svc, ingest, mut publisher) = one_publisher("kv@10.0.0.1@model", true, config(WAIT));

    for k in 0..4 {
        publisher.publish(k, chain_batch(k));
    }
    // A mixed fleet: the older positional event form on the same stream.
    publisher.publish(4, batch(vec![stored_block_positional(4)]));
    wait_for_seq(&ingest, 1, 4);
    assert_eq!(overlap(&svc, 1, 5), 5);

    // Not indexed: a sliding-window group, and blocks offloaded to the CPU.
    publisher.publish(5, batch(vec![stored_with(5, "GPU", "sliding_window"), stored_with(5, "CPU", "full_attention")]));
    publisher.publish(6, batch(vec![removed_blocks(&[4])]));
    wait_for_seq(&ingest, 1, 6);
    assert_eq!(overlap(&svc, 1, 6), 4);
    assert_eq!(cached_blocks(&svc, 1), 4);

    // Another topic is filtered out by the SUB socket: were it seen, its
    // seq 7 would make the real batch 7 a duplicate.
    publisher.send_frames(&[b"kv@10.0.0.2@model", &7u64.to_be_bytes(), &chain_batch(4)]);
    publisher.publish(7, batch(vec![cleared()]));
    wait_for_seq(&ingest, 1, 7);
    assert_eq!(cached_blocks(&svc, 1), 0);

    let m = ingest.metrics().snapshot();
    assert_eq!(m.batches_applied, 8);
    assert_eq!(m.events_applied, 7, "5 stored, 1 removed, 1 cleared");
    assert_eq!(m.blocks_applied, 6);
    assert_eq!(m.events_skipped, 2);
    assert_eq!((m.bad_frames, m.decode_errors, m.gaps, m.replays_started, m.duplicate_batches), (0, 0, 0, 1, 0));
    let worker = ingest.metrics().worker(WorkerId(1)).unwrap();
    assert_eq!(worker.batches_applied, 8);
    let lag = worker.lag_seconds.unwrap();
    assert!((0.0..WAIT.as_secs_f64()).contains(&lag), "lag {lag}");
    ingest.shutdown().unwrap();
}

#[test]
fn each_worker_gets_its_own_publishers_events() {
    let svc = service(&[1, 2]);
    let ingest = spawn(&svc, config(WAIT));
    let mut publishers = [TestPublisher::bind(""), TestPublisher::bind("")];
    for (i, publisher) in publishers.iter().enumerate() {
        ingest.add(publisher.publisher(WorkerId(i as u64 + 1), false)).unwrap();
        publisher.wait_subscribed();
    }
    for k in 0..3 {
        publishers[0].publish(k, chain_batch(k));
    }
    publishers[1].publish(0, chain_batch(0));
    wait_for_seq(&ingest, 1, 2);
    wait_for_seq(&ingest, 2, 0);
    assert_eq!((overlap(&svc, 1, 3), overlap(&svc, 2, 3)), (3, 1));
    assert_eq!(ingest.metrics().workers().len(), 2);
    ingest.shutdown().unwrap();
}
