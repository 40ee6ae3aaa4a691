//! The simulated engine's KV events seen by a real ZMQ SUB socket and
//! decoded by kvpick's decoder: stored on a first request, removed on
//! eviction, cleared on restart; replay healing a gap of dropped batches in
//! both reply layouts; the bounded replay buffer; stalled events.

use std::time::{Duration, Instant};

use crate::support::{DEADLINE, Subscriber, fast_config, replay};
use kvpick_core::{HashSeed, KvEvent};
use kvpick_kv_events::wire::{DecodedBatch, decode_batch};
use kvpick_sim::{Engine, EngineConfig, EventEncoding, ReplayLayout, RequestSpec};

const TOPIC: &str = "kv@127.0.0.1@sim-model";
const QUIET: Duration = Duration::from_millis(250);

fn config(encoding: EventEncoding, layout: ReplayLayout) -> EngineConfig {
    EngineConfig { encoding, replay_layout: layout, topic: TOPIC.into(), ..fast_config(4, 8) }
}

fn tokens(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| 500 + seed * 1000 + i).collect()
}

async fn generate(engine: &Engine, prompt: Vec<u32>) {
    engine.generate(RequestSpec { prompt, max_tokens: 2, seed: None }).await.expect("generation");
}

fn events(batches: &[(u64, DecodedBatch)]) -> Vec<KvEvent> {
    batches.iter().flat_map(|(_, b)| b.events.iter().map(|e| e.event.clone())).collect()
}

fn stored_hashes(events: &[KvEvent]) -> Vec<u64> {
    events
        .iter()
        .flat_map(|e| match e {
            KvEvent::Stored { block_hashes, .. } => block_hashes.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_the_cache_through_store_evict_and_restart() {
    for encoding in [EventEncoding::Map, EventEncoding::Array] {
        let engine = Engine::start(config(encoding, ReplayLayout::WithTopic)).await.expect("engine starts");
        let sub = Subscriber::connect(&engine.endpoints().events);

        // First request: 12 prompt tokens, 3 full blocks of 4, stored once.
        let p1 = tokens(1, 12);
        generate(&engine, p1.clone()).await;
        let (topic, seq, batch) = sub.recv_batch(DEADLINE).expect("a batch");
        assert_eq!((topic.as_slice(), seq), (TOPIC.as_bytes(), 0));
        assert!(sub.recv_batch(QUIET).is_none(), "{encoding:?}: one prefill step, one batch");
        let cache = engine.cache().await.expect("cache");
        assert_eq!(cache.blocks.len(), 3);
        let mut chain = Vec::new();
        while let Some(b) = cache.blocks.iter().find(|b| b.parent == chain.last().copied()) {
            chain.push(b.hash);
        }
        assert_eq!(chain.len(), 3);
        assert_eq!(
            batch.events.iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
            vec![KvEvent::Stored {
                block_hashes: chain.clone(),
                parent: None,
                token_ids: p1.clone(),
                block_size: 4,
                seed: HashSeed::new(None, None),
            }]
        );
        // The replay buffer holds the very same batch.
        let replies = replay(&engine.endpoints().replay, 0);
        assert_eq!(replies.len(), 2, "one batch and the end marker");
        assert_eq!(decode_batch(&replies[0][3]).expect("decodes"), batch);

        // Second request: 5 blocks + 1 for the completion; 8 - 3 cached = 5
        // free, so the first prompt's tail block is evicted.
        generate(&engine, tokens(2, 20)).await;
        let batches = sub.drain(QUIET);
        assert_eq!(batches.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1]);
        let evs = events(&batches);
        assert_eq!(evs[0], KvEvent::Removed { block_hashes: vec![chain[2]] }, "{encoding:?}: LRU tail first");
        assert_eq!(stored_hashes(&evs).len(), 5);
        let cache = engine.cache().await.expect("cache");
        assert!(!cache.contains(chain[2]) && cache.contains(chain[0]) && cache.contains(chain[1]));

        // Restart: seq 0 again, AllBlocksCleared, empty cache.
        engine.restart(true).await.expect("restart");
        let (_, seq, batch) = sub.recv_batch(DEADLINE).expect("the clear batch");
        assert_eq!(seq, 0);
        assert_eq!(batch.events.iter().map(|e| e.event.clone()).collect::<Vec<_>>(), vec![KvEvent::Cleared]);
        assert!(engine.cache().await.expect("cache").blocks.is_empty());

        // Relearned from scratch: the same hashes come back at seq 1.
        generate(&engine, p1).await;
        let batches = sub.drain(QUIET);
        assert_eq!(batches.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1]);
        assert_eq!(stored_hashes(&events(&batches)), chain);
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_heals_a_gap_of_dropped_batches() {
    for layout in [ReplayLayout::WithTopic, ReplayLayout::Legacy] {
        let engine = Engine::start(config(EventEncoding::Map, layout)).await.expect("engine starts");
        let sub = Subscriber::connect(&engine.endpoints().events);
        generate(&engine, tokens(0, 4)).await;
        assert_eq!(sub.drain(QUIET).iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![0]);

        engine.set_drop_fraction(1.0);
        generate(&engine, tokens(1, 4)).await;
        generate(&engine, tokens(2, 4)).await;
        assert!(sub.drain(QUIET).is_empty(), "dropped batches never go out");
        assert_eq!(engine.stats().await.expect("stats").publisher.dropped, 2);

        engine.set_drop_fraction(0.0);
        generate(&engine, tokens(3, 4)).await;
        let live = sub.drain(QUIET);
        assert_eq!(live.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![3], "a gap after seq 0");

        let replies = replay(&engine.endpoints().replay, 1);
        assert_eq!(replies.len(), 4, "{layout:?}: batches 1, 2, 3 and the end marker");
        let end = u64::MAX.to_be_bytes().to_vec();
        let mut healed = Vec::new();
        for (i, frames) in replies.iter().enumerate() {
            assert!(frames[0].is_empty(), "the ROUTER's delimiter comes first");
            let last = i + 1 == replies.len();
            match (layout, last) {
                (ReplayLayout::WithTopic, false) => {
                    assert_eq!(frames.len(), 4);
                    assert_eq!(frames[1], TOPIC.as_bytes());
                    healed.push((frames[2].clone(), frames[3].clone()));
                }
                (ReplayLayout::Legacy, false) => {
                    assert_eq!(frames.len(), 3);
                    healed.push((frames[1].clone(), frames[2].clone()));
                }
                (ReplayLayout::WithTopic, true) => assert_eq!(frames, &vec![vec![], vec![], end.clone(), vec![]]),
                (ReplayLayout::Legacy, true) => assert_eq!(frames, &vec![vec![], end.clone(), vec![]]),
            }
        }
        let seqs: Vec<u64> =
            healed.iter().map(|(s, _)| u64::from_be_bytes(s.as_slice().try_into().expect("8 bytes"))).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        // The replayed batches are the lost stores, and the live one again.
        let cache = engine.cache().await.expect("cache");
        let decoded: Vec<(u64, DecodedBatch)> =
            healed.iter().zip(&seqs).map(|((_, payload), s)| (*s, decode_batch(payload).expect("decodes"))).collect();
        assert_eq!(decoded[2].1, live[0].1);
        let replayed = stored_hashes(&events(&decoded[..2]));
        assert_eq!(replayed.len(), 2);
        assert!(replayed.iter().all(|h| cache.contains(*h)));
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_buffer_is_bounded_stalled_events_wait_and_bad_requests_are_ignored() {
    let cfg = EngineConfig { replay_buffer: 2, ..config(EventEncoding::Array, ReplayLayout::WithTopic) };
    let engine = Engine::start(cfg).await.expect("engine starts");
    let sub = Subscriber::connect(&engine.endpoints().events);

    // Held while stalled: no sequence number is used until released.
    engine.set_events_stalled(true);
    generate(&engine, tokens(0, 4)).await;
    assert!(sub.drain(QUIET).is_empty(), "stalled events are held");
    assert_eq!(engine.stats().await.expect("stats").publisher.held, 1);
    engine.set_events_stalled(false);
    assert_eq!(sub.drain(QUIET).iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![0]);

    for i in 1..4 {
        generate(&engine, tokens(i, 4)).await;
    }
    assert_eq!(sub.drain(QUIET).len(), 3);
    let replies = replay(&engine.endpoints().replay, 0);
    let seqs: Vec<u64> = replies[..replies.len() - 1]
        .iter()
        .map(|f| u64::from_be_bytes(f[2].as_slice().try_into().expect("8 bytes")))
        .collect();
    assert_eq!(seqs, vec![2, 3], "only the last two batches are kept");

    // A request of the wrong shape gets no answer and is counted.
    tokio::task::block_in_place(|| {
        let ctx = zmq::Context::new();
        let dealer = ctx.socket(zmq::DEALER).expect("DEALER");
        dealer.set_linger(0).expect("linger");
        dealer.connect(&engine.endpoints().replay).expect("connect");
        dealer.send_multipart([&b""[..], b"abc"], 0).expect("send");
        assert_eq!(dealer.poll(zmq::POLLIN, 300).expect("poll"), 0, "no answer");
    });
    let end = Instant::now() + DEADLINE;
    while engine.stats().await.expect("stats").publisher.bad_replay_requests != 1 {
        assert!(Instant::now() < end, "the bad request is counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_socket_down_answers_nothing_until_it_is_back() {
    let engine = Engine::start(config(EventEncoding::Map, ReplayLayout::WithTopic)).await.expect("engine starts");
    generate(&engine, tokens(0, 4)).await;
    engine.set_replay_down(true);
    tokio::task::block_in_place(|| {
        let ctx = zmq::Context::new();
        let dealer = ctx.socket(zmq::DEALER).expect("DEALER");
        dealer.set_linger(0).expect("linger");
        dealer.connect(&engine.endpoints().replay).expect("connect");
        dealer.send_multipart([&b""[..], &0u64.to_be_bytes()[..]], 0).expect("send");
        assert_eq!(dealer.poll(zmq::POLLIN, 300).expect("poll"), 0, "no answer while down");
    });
    let end = Instant::now() + DEADLINE;
    while engine.stats().await.expect("stats").publisher.unanswered_replays != 1 {
        assert!(Instant::now() < end, "the unanswered request is counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    engine.set_replay_down(false);
    assert_eq!(replay(&engine.endpoints().replay, 0).len(), 2, "batch 0 and the end marker once back");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordered_batches_go_out_in_swapped_pairs_and_an_odd_one_on_healing() {
    let engine = Engine::start(config(EventEncoding::Array, ReplayLayout::WithTopic)).await.expect("engine starts");
    let sub = Subscriber::connect(&engine.endpoints().events);
    engine.set_events_reordered(true);
    for i in 0..3 {
        generate(&engine, tokens(i, 4)).await;
    }
    let live = sub.drain(QUIET);
    assert_eq!(live.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 0], "2 waits for an overtaker");
    // Each batch is stamped when it is made: the overtaken one is older.
    assert!(live[1].1.ts < live[0].1.ts);
    engine.set_events_reordered(false);
    assert_eq!(sub.drain(QUIET).iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![2], "let go on healing");
    generate(&engine, tokens(3, 4)).await;
    assert_eq!(sub.drain(QUIET).iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![3], "in order again");
    let stats = engine.stats().await.expect("stats").publisher;
    assert_eq!((stats.overtaken, stats.sent, stats.dropped), (1, 4, 0));
    engine.shutdown().await;
}
