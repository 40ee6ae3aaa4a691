//! kvpick's index heals itself: event batches an engine lost on the wire
//! are fetched back from its replay socket, and an engine that restarts
//! (its sequence numbers back at 0, its cache empty) is cleared in kvpick
//! and learnt again from its new events.
//!
//! What the simulated publisher does (sim/src/publisher.rs): a
//! dropped batch still takes a sequence number and stays in the replay
//! buffer, so kvpick notices the loss only when the engine's next batch
//! arrives (the sequencer, core/src/wire/sequencer.rs, sees `seq > last+1`)
//! and replays from `last + 1`. A restart sets the sequence back to 0 and
//! empties the replay buffer; with `announce_clear` its first batch is
//! `AllBlocksCleared`, without it kvpick learns of the restart from the
//! next batch's sequence number going back.

use kvpick_e2e::{
    BLOCK_SIZE, Conversation, Stack, StackOptions, chat_body, eventually, full_blocks, prompt_tokens, words,
};
use kvpick_sim::RequestSpec;
use serde_json::json;

/// Runs a chat body on engine `i` directly, not through kvpick (as a
/// request from another gateway would): the engine caches it and
/// publishes its blocks.
async fn run_directly(stack: &Stack, i: usize, body: &serde_json::Value) {
    let spec = RequestSpec { prompt: prompt_tokens(body), max_tokens: 1, seed: Some(0) };
    stack.engine(i).generate(spec).await.unwrap_or_else(|e| panic!("engine {i}: {e}"));
}

fn one_off(tag: &str, n: usize) -> serde_json::Value {
    chat_body(&[json!({"role": "user", "content": words(tag, n)})], 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_dropped_on_the_wire_are_healed_by_replay() {
    let owned = Stack::start(StackOptions::default()).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    let mut conversation = Conversation::new("heal", 60, 8);
    let body0 = conversation.ask(0, 20);
    let reply = stack.chat(&body0).await;
    let home = stack.index_of(reply.endpoint);
    conversation.answered(&reply);
    let engine = stack.engine(home);

    // The engine loses every batch while the next turn runs.
    let body1 = conversation.ask(1, 20);
    stack.wait_drained().await;
    stack.wait_overlap(&body1, home, full_blocks(&body0)).await;
    let base = stack.ingest();
    let dropped = engine.stats().await.unwrap_or_else(|e| panic!("{e}")).publisher.dropped;
    engine.set_drop_fraction(1.0);
    let reply = stack.chat(&body1).await;
    assert_eq!(stack.index_of(reply.endpoint), home, "turn 1 follows its prefix");
    conversation.answered(&reply);
    eventually("the engine drops turn 1's batches", || async move {
        let now = engine.stats().await.map_err(|e| e.to_string())?.publisher.dropped;
        if now > dropped { Ok(()) } else { Err(format!("{now} dropped")) }
    })
    .await;
    engine.set_drop_fraction(0.0);

    // Nothing after the loss has reached kvpick yet, so it cannot know:
    // it still sees only turn 0's blocks, and no gap.
    let body2 = conversation.ask(2, 20);
    assert_eq!(stack.overlap(&body2, home).await, full_blocks(&body0), "kvpick cannot have learnt turn 1");
    assert_eq!(stack.ingest().gaps, base.gaps, "no gap can be seen before the next batch");
    let indexed = stack.load_of(home).await.cached_blocks;
    let cached = engine.stats().await.unwrap_or_else(|e| panic!("{e}")).cached_blocks as u64;
    assert!(indexed < cached, "kvpick indexes {indexed} blocks, the engine caches {cached}");

    // Turn 2 still goes home (turn 0's prefix is known) and the engine
    // serves turn 1's blocks from cache; its new batch reveals the gap.
    stack.wait_drained().await;
    let reply = stack.chat(&body2).await;
    assert_eq!(stack.index_of(reply.endpoint), home, "turn 2 follows its prefix");
    assert_eq!(reply.cached_tokens, u64::from(full_blocks(&body1) * BLOCK_SIZE), "the engine kept turn 1");
    conversation.answered(&reply);
    eventually("kvpick sees the gap and replays it", || async move {
        let now = stack.ingest();
        if now.gaps > base.gaps
            && now.replays_started > base.replays_started
            && now.replayed_batches > base.replayed_batches
        {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    stack.wait_in_sync(home).await;
    let healed = stack.ingest();
    assert_eq!(healed.lost_batches, 0, "every dropped batch was in the replay buffer: {healed:?}");
    assert_eq!(healed.replays_failed, base.replays_failed, "{healed:?}");

    // Healed: kvpick's overlap of the next turn is the whole history the
    // engine holds, and the engine's cache hit says the same.
    let body3 = conversation.ask(3, 20);
    stack.wait_drained().await;
    stack.wait_overlap(&body3, home, full_blocks(&body2)).await;
    let reply = stack.chat(&body3).await;
    assert_eq!(stack.index_of(reply.endpoint), home);
    assert_eq!(reply.cached_tokens, u64::from(full_blocks(&body2) * BLOCK_SIZE));
    owned.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_drops_on_every_engine_heal_to_an_exact_copy_of_each_cache() {
    let owned = Stack::start(StackOptions { engines: 3, shards: 2, ..StackOptions::default() }).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    let base = stack.ingest();
    for engine in stack.fleet.engines() {
        engine.set_drop_fraction(0.5);
    }
    // Routing while the index is partly wrong is allowed to be worse; it
    // must still be served.
    let mut conversations: Vec<Conversation> = (0..3).map(|c| Conversation::new(&format!("r{c}"), 40, 6)).collect();
    for turn in 0..4 {
        for conversation in &mut conversations {
            let reply = stack.chat(&conversation.ask(turn, 12)).await;
            conversation.answered(&reply);
        }
    }
    let mut dropped = 0;
    for engine in stack.fleet.engines() {
        engine.set_drop_fraction(0.0);
        dropped += engine.stats().await.unwrap_or_else(|e| panic!("{e}")).publisher.dropped;
    }
    assert!(dropped > 0, "the engines dropped nothing: the test tests nothing");
    // A loss at the end of a stream shows only with a later batch: one
    // more request on each engine.
    for i in 0..3 {
        run_directly(stack, i, &one_off(&format!("flush{i}"), 40)).await;
    }
    for i in 0..3 {
        stack.wait_in_sync(i).await;
    }
    let now = stack.ingest();
    assert!(now.gaps > base.gaps && now.replays_started > base.replays_started, "{now:?}");
    assert_eq!(now.lost_batches, 0, "{now:?}");
    owned.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_clears_its_worker_and_kvpick_relearns() {
    let owned = Stack::start(StackOptions::default()).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    let mut conversation = Conversation::new("restart", 60, 8);
    let body0 = conversation.ask(0, 20);
    let reply = stack.chat(&body0).await;
    let home = stack.index_of(reply.endpoint);
    conversation.answered(&reply);
    let body1 = conversation.ask(1, 20);
    stack.wait_drained().await;
    stack.wait_overlap(&body1, home, full_blocks(&body0)).await;
    let reply = stack.chat(&body1).await;
    assert_eq!(stack.index_of(reply.endpoint), home);
    conversation.answered(&reply);
    let body2 = conversation.ask(2, 20);
    stack.wait_overlap(&body2, home, full_blocks(&body1)).await;

    // The engine restarts and announces it (AllBlocksCleared as seq 0).
    let base = stack.ingest();
    stack.engine(home).restart(true).await.unwrap_or_else(|e| panic!("restart: {e}"));
    eventually("kvpick clears the restarted engine", || async move {
        let restarts = stack.ingest().engine_restarts;
        let indexed = stack.load_of(home).await.cached_blocks;
        if restarts > base.engine_restarts && indexed == 0 {
            Ok(())
        } else {
            Err(format!("{restarts} restarts, {indexed} blocks indexed"))
        }
    })
    .await;
    for i in 0..3 {
        assert_eq!(stack.overlap(&body2, i).await, 0, "engine {i}: the conversation is cached nowhere now");
    }

    // The next turn is a cold start wherever it goes; kvpick learns it
    // there and the turn after follows it.
    stack.wait_drained().await;
    let reply = stack.chat(&body2).await;
    assert_eq!(reply.cached_tokens, 0, "no engine holds the conversation after the restart");
    let new_home = stack.index_of(reply.endpoint);
    conversation.answered(&reply);
    let body3 = conversation.ask(3, 20);
    stack.wait_drained().await;
    stack.wait_overlap(&body3, new_home, full_blocks(&body2)).await;
    let reply = stack.chat(&body3).await;
    assert_eq!(stack.index_of(reply.endpoint), new_home);
    assert_eq!(reply.cached_tokens, u64::from(full_blocks(&body2) * BLOCK_SIZE));

    // The restarted engine itself is learnt again from its new events.
    let fresh = one_off("afterrestart", 80);
    run_directly(stack, home, &fresh).await;
    stack.wait_overlap(&fresh, home, full_blocks(&fresh)).await;
    stack.wait_in_sync(home).await;
    let now = stack.ingest();
    assert_eq!(now.lost_batches, 0, "a restart is not a loss: {now:?}");
    owned.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_restart_is_noticed_when_the_sequence_goes_back() {
    let owned = Stack::start(StackOptions::default()).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    let before = one_off("silent", 80);
    let reply = stack.chat(&before).await;
    let home = stack.index_of(reply.endpoint);
    stack.wait_overlap(&before, home, full_blocks(&before)).await;
    stack.wait_in_sync(home).await;

    // No AllBlocksCleared: until the engine publishes again, kvpick has
    // nothing to tell it and must still believe the old cache.
    let base = stack.ingest();
    stack.engine(home).restart(false).await.unwrap_or_else(|e| panic!("restart: {e}"));
    assert_eq!(stack.overlap(&before, home).await, full_blocks(&before), "kvpick cannot know yet");
    assert_eq!(stack.ingest().engine_restarts, base.engine_restarts);

    // Its next batch is seq 0 again: the old blocks go, the new ones stay.
    let after = one_off("silentnext", 80);
    run_directly(stack, home, &after).await;
    eventually("kvpick notices the restart", || async move {
        let restarts = stack.ingest().engine_restarts;
        if restarts > base.engine_restarts { Ok(()) } else { Err(format!("{restarts} restarts")) }
    })
    .await;
    stack.wait_in_sync(home).await;
    assert_eq!(stack.overlap(&before, home).await, 0, "the restarted engine's old blocks are gone");
    assert_eq!(stack.overlap(&after, home).await, full_blocks(&after), "its new blocks are indexed");
    owned.finish().await;
}
