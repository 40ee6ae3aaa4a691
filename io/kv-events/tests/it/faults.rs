//! Engine restarts, garbage on the wire, and publishers coming and going.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::events::{batch, chain_batch, removed_blocks, stored_block};
use crate::common::msgpack::{Mp, s};
use crate::common::publisher::{ReplayLayout, TestPublisher};
use crate::common::{WAIT, cached_blocks, config, one_publisher, overlap, service, spawn, wait_for_seq, wait_until};
use kvpick_core::WorkerId;

#[test]
fn sequence_going_back_to_zero_clears_the_worker() {
    let (svc, ingest, mut publisher) = one_publisher("", true, config(WAIT));
    for k in 0..4 {
        publisher.publish(k, chain_batch(k));
    }
    wait_for_seq(&ingest, 1, 3);
    assert_eq!(cached_blocks(&svc, 1), 4);

    // The engine restarted with an empty cache and counts from 0 again.
    publisher.publish(0, chain_batch(0));
    publisher.publish(1, chain_batch(1));
    wait_until("the restart is handled", || ingest.metrics().snapshot().engine_restarts == 1);
    wait_for_seq(&ingest, 1, 1);
    assert_eq!((cached_blocks(&svc, 1), overlap(&svc, 1, 4)), (2, 2));
    let m = ingest.metrics().snapshot();
    assert_eq!((m.replays_started, m.gaps, m.lost_batches), (1, 0, 0), "the catch-up on subscribing only");
    ingest.shutdown().unwrap();
}

#[test]
fn restarted_publisher_is_redialled_and_its_new_run_replaces_the_old() {
    let (svc, ingest, mut publisher) = one_publisher("", false, config(WAIT));
    for k in 0..3 {
        publisher.publish(k, chain_batch(k));
    }
    wait_for_seq(&ingest, 1, 2);

    // The engine process goes away and comes back on the same port.
    let (endpoint, replay_endpoint) = (publisher.endpoint.clone(), publisher.replay_endpoint.clone());
    drop(publisher);
    let mut publisher = TestPublisher::rebind(&endpoint, &replay_endpoint, "");
    publisher.wait_subscribed();
    publisher.publish(0, chain_batch(0));
    wait_until("the restart is handled", || ingest.metrics().snapshot().engine_restarts == 1);
    wait_for_seq(&ingest, 1, 0);
    assert_eq!(cached_blocks(&svc, 1), 1);
    ingest.shutdown().unwrap();
}

/// An engine restarted in place can publish past its old sequence number
/// before kvpick's connection comes back: `seq < last` never shows. The
/// connection coming back asks for the history from 0; an answer from 0 is
/// the engine's whole history, and the worker is rebuilt from it.
#[test]
fn restart_in_place_that_overtakes_the_old_sequence_is_rebuilt_on_reconnect() {
    let (svc, ingest, mut publisher) = one_publisher("", true, config(WAIT));
    for k in 0..3 {
        publisher.publish(k, chain_batch(k));
    }
    wait_for_seq(&ingest, 1, 2);
    assert_eq!(cached_blocks(&svc, 1), 3);

    let (endpoint, replay_endpoint) = (publisher.endpoint.clone(), publisher.replay_endpoint.clone());
    drop(publisher);
    let mut publisher = TestPublisher::rebind(&endpoint, &replay_endpoint, "");
    // The new run's first batches, sent before kvpick was back: lost on the
    // wire, and already past the old run's last (2). It ends holding block 0.
    publisher.record(0, chain_batch(0));
    publisher.record(1, chain_batch(1));
    publisher.record(2, batch(vec![removed_blocks(&[1])]));
    publisher.record(3, batch(vec![removed_blocks(&[0])]));
    publisher.record(4, chain_batch(0));
    assert_eq!(publisher.serve_replay(ReplayLayout::WithTopic), 0, "the whole history, asked on reconnecting");
    publisher.wait_subscribed();
    publisher.publish(5, chain_batch(1));

    wait_for_seq(&ingest, 1, 5);
    assert_eq!((cached_blocks(&svc, 1), overlap(&svc, 1, 3)), (2, 2), "the new run's blocks 0 and 1 only");
    let m = ingest.metrics().snapshot();
    assert_eq!((m.rebuilds, m.engine_restarts, m.lost_batches), (1, 0, 0));
    ingest.shutdown().unwrap();
}

#[test]
fn malformed_frames_and_payloads_are_skipped_and_good_ones_applied() {
    let (svc, ingest, mut publisher) = one_publisher("kv", true, config(WAIT));

    publisher.publish(0, chain_batch(0));
    // Bad framing: counted, no effect on the sequence.
    publisher.send_frames(&[b"kv", &1u64.to_be_bytes()]);
    publisher.send_frames(&[b"kv", &1u64.to_be_bytes(), b"", b"extra"]);
    publisher.send_frames(&[b"kv", &[0, 0, 0, 0, 0, 0, 1], &chain_batch(1)]);
    publisher.send_frames(&[b"kv", &u64::MAX.to_be_bytes(), &chain_batch(1)]);
    // A payload that is not msgpack: the batch is skipped, its seq used.
    publisher.publish(1, b"\xc1 not msgpack".to_vec());
    // One bad event among good ones: only it is dropped.
    let bad_event = Mp::Map(vec![("type", s("BlockStored")), ("block_hashes", s("not a list"))]);
    publisher.publish(2, batch(vec![bad_event, stored_block(1)]));
    publisher.publish(3, chain_batch(2));

    wait_for_seq(&ingest, 1, 3);
    assert_eq!(overlap(&svc, 1, 3), 3);
    let m = ingest.metrics().snapshot();
    assert_eq!((m.bad_frames, m.decode_errors, m.events_malformed), (4, 1, 1));
    assert_eq!((m.gaps, m.lost_batches, m.replays_started), (0, 0, 1), "the catch-up on subscribing only");
    assert_eq!(m.events_applied, 3);
    ingest.shutdown().unwrap();
}

#[test]
fn worker_removed_while_streaming_stops_receiving() {
    let svc = service(&[1, 2]);
    let ingest = spawn(&svc, config(WAIT));
    let streaming = TestPublisher::bind("");
    let mut quiet = TestPublisher::bind("");
    ingest.add(streaming.publisher(WorkerId(1), false)).unwrap();
    streaming.wait_subscribed();
    ingest.add(quiet.publisher(WorkerId(2), false)).unwrap();
    quiet.wait_subscribed();

    let stop = Arc::new(AtomicBool::new(false));
    let streamer = {
        let (stop, mut publisher) = (Arc::clone(&stop), streaming);
        std::thread::spawn(move || {
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                publisher.publish(seq, chain_batch(seq));
                seq += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    wait_until("worker 1 streams", || cached_blocks(&svc, 1) >= 10);
    ingest.remove(WorkerId(1)).unwrap();
    wait_until("worker 1 is unsubscribed", || ingest.metrics().worker(WorkerId(1)).is_none());
    let frozen = cached_blocks(&svc, 1);
    // The other worker is unaffected: its batches still arrive.
    for k in 0..3 {
        quiet.publish(k, chain_batch(k));
    }
    wait_for_seq(&ingest, 2, 2);
    assert_eq!(overlap(&svc, 2, 3), 3);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(cached_blocks(&svc, 1), frozen, "nothing applied after removal");

    stop.store(true, Ordering::Relaxed);
    streamer.join().unwrap();
    assert_eq!(ingest.metrics().workers().len(), 1);
    ingest.shutdown().unwrap();
}
