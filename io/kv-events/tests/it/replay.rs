//! Sequence gaps: healed by replay, or counted as lost.

use std::time::Duration;

use crate::common::events::{batch, chain_batch, removed_blocks};
use crate::common::publisher::{ReplayLayout, TestPublisher};
use crate::common::{Service, WAIT, cached_blocks, config, one_publisher, overlap, service, spawn, wait_for_seq};
use kvpick_core::WorkerId;
use kvpick_kv_events::{IngestConfig, KvEventIngest};

fn gap_is_healed_by_replay(layout: ReplayLayout) {
    let (svc, ingest, mut publisher) = one_publisher("kv", true, config(WAIT));

    publisher.publish(0, chain_batch(0));
    publisher.publish(1, chain_batch(1));
    // Lost on the way: the subscriber never sees 2 and 3.
    publisher.record(2, chain_batch(2));
    publisher.record(3, chain_batch(3));
    publisher.publish(4, chain_batch(4));
    // Live while the replay is being asked for: buffered, then a duplicate.
    publisher.publish(5, chain_batch(5));
    assert_eq!(publisher.serve_replay(layout), 2, "replay starts right after the last batch applied");
    publisher.publish(6, chain_batch(6));

    wait_for_seq(&ingest, 1, 6);
    // Any batch applied out of order would have had an unknown parent.
    assert_eq!(overlap(&svc, 1, 7), 7);
    let m = ingest.metrics().snapshot();
    // The catch-up on subscribing, then the gap's.
    assert_eq!((m.gaps, m.replays_started, m.replays_failed), (1, 2, 0));
    assert_eq!(m.replayed_batches, 4, "2, 3, 4 and 5 from the replay");
    assert_eq!(m.duplicate_batches, 2, "live 4 and 5");
    assert_eq!((m.lost_batches, m.unknown_parent_events, m.bad_frames), (0, 0, 0));
    ingest.shutdown().unwrap();
}

#[test]
fn gap_is_healed_by_replay_with_topic_frame() {
    gap_is_healed_by_replay(ReplayLayout::WithTopic);
}

#[test]
fn gap_is_healed_by_replay_in_legacy_layout() {
    gap_is_healed_by_replay(ReplayLayout::Legacy);
}

/// An engine that published batches `0..batches` before kvpick subscribed
/// to it (with a replay endpoint and this replay idle timeout).
fn engine_with_history(batches: u64, replay_idle: Duration) -> (Service, KvEventIngest, TestPublisher) {
    let svc = service(&[1]);
    let ingest = spawn(&svc, config(replay_idle));
    let mut publisher = TestPublisher::bind("");
    for k in 0..batches {
        publisher.record(k, chain_batch(k));
    }
    ingest.add(publisher.publisher(WorkerId(1), true)).unwrap();
    (svc, ingest, publisher)
}

#[test]
fn first_batch_past_zero_relearns_history_from_zero() {
    let (svc, ingest, mut publisher) = engine_with_history(3, WAIT);
    publisher.wait_subscribed();
    publisher.publish(3, chain_batch(3));
    assert_eq!(publisher.serve_replay(ReplayLayout::WithTopic), 0);
    publisher.publish(4, chain_batch(4));

    wait_for_seq(&ingest, 1, 4);
    assert_eq!(overlap(&svc, 1, 5), 5);
    let m = ingest.metrics().snapshot();
    assert_eq!((m.replays_started, m.replayed_batches, m.duplicate_batches), (1, 4, 1));
    assert_eq!((m.gaps, m.lost_batches), (0, 0), "history from before we listened is not a loss");
    ingest.shutdown().unwrap();
}

#[test]
fn gap_without_replay_endpoint_is_lost_and_later_batches_applied() {
    let (svc, ingest, mut publisher) = one_publisher("", false, config(WAIT));

    publisher.publish(0, chain_batch(0));
    publisher.publish(1, chain_batch(1));
    publisher.record(2, chain_batch(2));
    // Its parent went missing with batch 2: an orphan, not indexed.
    publisher.publish(3, chain_batch(3));
    publisher.publish(4, batch(vec![removed_blocks(&[1])]));

    wait_for_seq(&ingest, 1, 4);
    assert_eq!((overlap(&svc, 1, 4), cached_blocks(&svc, 1)), (1, 1));
    let m = ingest.metrics().snapshot();
    assert_eq!((m.gaps, m.lost_batches, m.replays_started), (1, 1, 0));
    assert_eq!((m.unknown_parent_events, m.orphan_blocks), (1, 1));
    assert_eq!(m.batches_applied, 4);
    ingest.shutdown().unwrap();
}

/// A worker nobody routes to publishes nothing; its cache is learned from
/// its replay buffer as soon as kvpick subscribes.
#[test]
fn subscribing_relearns_history_without_waiting_for_a_batch() {
    let (svc, ingest, publisher) = engine_with_history(3, WAIT);
    assert_eq!(publisher.serve_replay(ReplayLayout::WithTopic), 0);

    wait_for_seq(&ingest, 1, 2);
    assert_eq!((overlap(&svc, 1, 3), cached_blocks(&svc, 1)), (3, 3));
    let m = ingest.metrics().snapshot();
    assert_eq!((m.replays_started, m.replayed_batches, m.lost_batches, m.replays_failed), (1, 3, 0, 0));
    ingest.shutdown().unwrap();
}

/// vLLM's replay ROUTER keeps ZMQ's default send high-water mark (1,000
/// messages) and drops what overflows it, end marker included: a long
/// answer stops short. kvpick asks again from where it stopped.
#[test]
fn replay_cut_short_is_asked_again_from_where_it_stopped() {
    // A second to start answering (the test publisher answers when the test
    // gets there); once answering, 250 ms of silence ends the answer.
    let (svc, ingest, mut publisher) = engine_with_history(6, Duration::from_secs(1));
    publisher.wait_subscribed();
    publisher.publish(6, chain_batch(6));
    assert_eq!(publisher.serve_replay_cut_short(ReplayLayout::WithTopic, 3), 0, "catch-up from 0");
    assert_eq!(publisher.serve_replay(ReplayLayout::WithTopic), 3, "asked again from the first batch missing");
    publisher.publish(7, chain_batch(7));

    wait_for_seq(&ingest, 1, 7);
    // Any batch applied out of order would have had an unknown parent.
    assert_eq!((overlap(&svc, 1, 8), cached_blocks(&svc, 1)), (8, 8));
    let m = ingest.metrics().snapshot();
    assert_eq!((m.replays_started, m.replays_resumed, m.replays_failed), (2, 1, 0));
    assert_eq!((m.replayed_batches, m.duplicate_batches), (7, 1), "0..=6 replayed, live 6 a duplicate");
    assert_eq!((m.lost_batches, m.unknown_parent_events), (0, 0));
    ingest.shutdown().unwrap();
}

/// A replay that answers nothing more after being asked again is given up.
#[test]
fn replay_cut_short_twice_without_progress_is_given_up() {
    let (svc, ingest, mut publisher) = one_publisher("", true, config(Duration::from_secs(1)));
    publisher.publish(0, chain_batch(0));
    for k in 1..5 {
        publisher.record(k, chain_batch(k));
    }
    publisher.publish(5, chain_batch(5));
    assert_eq!(publisher.serve_replay_cut_short(ReplayLayout::WithTopic, 2), 1);
    assert_eq!(publisher.ignore_replay(), 3, "asked again once");
    publisher.publish(6, chain_batch(6));

    wait_for_seq(&ingest, 1, 6);
    let m = ingest.metrics().snapshot();
    assert_eq!((m.replays_started, m.replays_resumed, m.replays_failed), (3, 1, 1), "with the catch-up on subscribing");
    assert_eq!(m.lost_batches, 2, "3 and 4 never came");
    assert_eq!(cached_blocks(&svc, 1), 3, "0, 1 and 2; 5 and 6 orphans of the lost 4");
    ingest.shutdown().unwrap();
}

#[test]
fn unanswered_replay_times_out_and_buffered_batches_are_applied() {
    let (svc, ingest, mut publisher) = one_publisher("", true, config(Duration::from_millis(200)));

    publisher.publish(0, chain_batch(0));
    publisher.publish(1, chain_batch(1));
    publisher.record(2, chain_batch(2));
    publisher.record(3, chain_batch(3));
    publisher.publish(4, chain_batch(4));
    assert_eq!(publisher.ignore_replay(), 2);
    publisher.publish(5, batch(vec![removed_blocks(&[0])]));

    wait_for_seq(&ingest, 1, 5);
    assert_eq!(cached_blocks(&svc, 1), 1, "block 1 left; 4 was an orphan");
    let m = ingest.metrics().snapshot();
    assert_eq!((m.gaps, m.replays_started, m.replays_failed), (1, 2, 1), "with the catch-up on subscribing");
    assert_eq!((m.lost_batches, m.replayed_batches, m.unknown_parent_events), (2, 0, 1));
    ingest.shutdown().unwrap();
}

/// The engine's replay socket down for a moment: the replay is asked again
/// (up to `replay_attempts` silent ones in a row) and heals the gap once
/// the socket answers, losing nothing.
#[test]
fn unanswered_replay_is_asked_again_and_heals_the_gap_when_answered() {
    let cfg = IngestConfig { replay_attempts: 3, ..config(Duration::from_millis(200)) };
    let (svc, ingest, mut publisher) = one_publisher("", true, cfg);
    publisher.publish(0, chain_batch(0));
    publisher.record(1, chain_batch(1));
    publisher.record(2, chain_batch(2));
    publisher.publish(3, chain_batch(3));
    assert_eq!(publisher.ignore_replay(), 1, "the first ask, unanswered");
    assert_eq!(publisher.ignore_replay(), 1, "asked again from the same batch, unanswered");
    assert_eq!(publisher.serve_replay(ReplayLayout::WithTopic), 1, "the third ask, answered");
    publisher.publish(4, chain_batch(4));

    wait_for_seq(&ingest, 1, 4);
    assert_eq!((overlap(&svc, 1, 5), cached_blocks(&svc, 1)), (5, 5), "nothing lost, applied in order");
    let m = ingest.metrics().snapshot();
    assert_eq!((m.replays_started, m.replays_retried, m.replays_failed), (4, 2, 0), "with the catch-up on subscribing");
    assert_eq!((m.replayed_batches, m.duplicate_batches), (3, 1), "1..=3 replayed, live 3 a duplicate");
    assert_eq!((m.lost_batches, m.unknown_parent_events), (0, 0));
    ingest.shutdown().unwrap();
}

/// A replay socket that stays down: after `replay_attempts` silent replays
/// in a row the gap is given up as lost, and the live batches held
/// meanwhile are applied.
#[test]
fn a_replay_silent_every_time_is_given_up_after_its_attempts() {
    let cfg = IngestConfig { replay_attempts: 2, ..config(Duration::from_millis(200)) };
    let (svc, ingest, mut publisher) = one_publisher("", true, cfg);
    publisher.publish(0, chain_batch(0));
    publisher.record(1, chain_batch(1));
    publisher.publish(2, chain_batch(2));
    assert_eq!(publisher.ignore_replay(), 1);
    assert_eq!(publisher.ignore_replay(), 1, "asked once more, then no more");
    publisher.publish(3, batch(vec![removed_blocks(&[0])]));

    wait_for_seq(&ingest, 1, 3);
    let m = ingest.metrics().snapshot();
    assert_eq!((m.replays_started, m.replays_retried, m.replays_failed), (3, 1, 1), "with the catch-up on subscribing");
    assert_eq!(m.lost_batches, 1, "batch 1 never came");
    assert_eq!(cached_blocks(&svc, 1), 0, "block 0 removed; 2 an orphan of the lost 1");
    ingest.shutdown().unwrap();
}

/// A batch overtaken by the next one on the way: the overtaker opens a gap
/// that replay heals, and the late batch, stamped before the last one
/// applied, is dropped, not taken for a restart (which would clear blocks
/// the engine still holds).
#[test]
fn a_batch_overtaken_on_the_way_is_late_not_a_restart() {
    let (svc, ingest, mut publisher) = one_publisher("kv", true, config(WAIT));
    publisher.publish(0, chain_batch(0));
    publisher.publish(1, chain_batch(1));
    let overtaken = chain_batch(2);
    publisher.record(2, overtaken.clone());
    publisher.publish(3, chain_batch(3));
    assert_eq!(publisher.serve_replay(ReplayLayout::WithTopic), 2, "the gap's replay");
    wait_for_seq(&ingest, 1, 3);
    publisher.send_frames(&[b"kv", &2u64.to_be_bytes(), &overtaken]);
    publisher.publish(4, chain_batch(4));

    wait_for_seq(&ingest, 1, 4);
    assert_eq!((overlap(&svc, 1, 5), cached_blocks(&svc, 1)), (5, 5));
    let m = ingest.metrics().snapshot();
    assert_eq!((m.late_batches, m.engine_restarts, m.lost_batches, m.gaps), (1, 0, 0, 1));
    ingest.shutdown().unwrap();
}
