//! Where kvpick sends requests: by KV-cache overlap (multi-turn
//! conversations stay with the engine holding their prefix) and by load
//! (new conversations and bursts without overlap spread out), and that
//! every booking is given back once the responses end.

use std::collections::BTreeMap;

use kvpick_e2e::{
    BLOCK_SIZE, Conversation, Stack, StackOptions, chat_body, full_blocks, post_chat, prompt_tokens, words,
};
use serde_json::json;

/// How many requests each engine index served.
fn per_engine(stack: &Stack, replies: &[kvpick_e2e::Reply]) -> BTreeMap<usize, usize> {
    let mut counts = BTreeMap::new();
    for reply in replies {
        *counts.entry(stack.index_of(reply.endpoint)).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_stick_to_their_prefix_and_spread_across_engines() {
    // Two shards: the engines' index and load live on different threads,
    // so every pick is a real scatter-gather.
    let owned = Stack::start(StackOptions { engines: 3, shards: 2, ..StackOptions::default() }).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    let mut conversations: Vec<Conversation> = (0..3).map(|c| Conversation::new(&format!("c{c}"), 60, 8)).collect();

    // First turns: no overlap anywhere, so load decides. Held in flight
    // (engines stalled) and booked one after the other, each pick sees
    // the others' bookings: three conversations, three engines.
    stack.stall_all(true);
    let firsts: Vec<_> = conversations.iter_mut().map(|c| c.ask(0, 20)).collect();
    let tasks = stack.send_booked_in_order(firsts.clone()).await;
    for i in 0..3 {
        let load = stack.load_of(i).await;
        assert_eq!(load.requests, 1, "engine {i} should hold exactly one first turn: {load:?}");
    }
    stack.stall_all(false);
    let mut homes = Vec::new();
    for (c, task) in tasks.into_iter().enumerate() {
        let reply = task.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("conversation {c}: {e}"));
        assert_eq!(reply.cached_tokens, 0, "nothing of conversation {c} was cached anywhere yet");
        assert_eq!(reply.prompt_tokens, prompt_tokens(&firsts[c]).len() as u64);
        homes.push(stack.index_of(reply.endpoint));
        conversations[c].answered(&reply);
    }
    let mut distinct = homes.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "the three conversations should be on three engines: {homes:?}");

    // Later turns resend the history: each must go back to its home, and
    // the engine's own usage must confirm what kvpick predicted (its
    // overlap, in blocks, is what the engine serves from cache).
    for turn in 1..4 {
        for c in 0..3 {
            let previous = conversations[c].last_asked().clone();
            let body = conversations[c].ask(turn, 20);
            // The previous prompt's full blocks: its partial tail block
            // and the generated tokens are not cached.
            let expected = full_blocks(&previous);
            // Idle engines, so overlap alone separates them; and the
            // previous turn's events must have reached the shards.
            stack.wait_drained().await;
            stack.wait_overlap(&body, homes[c], expected).await;
            for other in (0..3).filter(|i| *i != homes[c]) {
                assert_eq!(stack.overlap(&body, other).await, 0, "engine {other} holds none of conversation {c}");
            }
            let reply = stack.chat(&body).await;
            assert_eq!(
                stack.index_of(reply.endpoint),
                homes[c],
                "conversation {c} turn {turn} left its home engine {}",
                homes[c]
            );
            assert_eq!(
                reply.cached_tokens,
                u64::from(expected * BLOCK_SIZE),
                "conversation {c} turn {turn}: the engine's cache hit should be kvpick's overlap"
            );
            conversations[c].answered(&reply);
        }
    }
    for i in 0..3 {
        stack.wait_in_sync(i).await;
    }
    owned.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_long_prompts_without_overlap_spreads_by_load() {
    let owned = Stack::start(StackOptions { engines: 3, shards: 1, ..StackOptions::default() }).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    // Six long prompts of exactly the same length, sharing nothing (their
    // first words differ): only the load kvpick booked tells engines apart.
    let bodies: Vec<_> =
        (0..6).map(|p| chat_body(&[json!({"role": "user", "content": words(&format!("b{p}"), 600)})], 8)).collect();
    let lengths: Vec<usize> = bodies.iter().map(|b| prompt_tokens(b).len()).collect();
    assert!(lengths.iter().all(|l| *l == lengths[0]), "the prompts should be equally long: {lengths:?}");

    stack.stall_all(true);
    let tasks = stack.send_booked_in_order(bodies).await;
    // While all six are in flight: two on each engine, equal prefill.
    let loads: Vec<_> = stack.loads().await;
    assert_eq!(loads.len(), 3);
    for load in &loads {
        assert_eq!(load.requests, 2, "each engine should hold two of the six: {loads:?}");
        assert_eq!(load.prefill_tokens, loads[0].prefill_tokens, "equal prompts, equal prefill: {loads:?}");
    }
    stack.stall_all(false);
    let mut replies = Vec::new();
    for (p, task) in tasks.into_iter().enumerate() {
        let reply = task.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("prompt {p}: {e}"));
        assert_eq!(reply.cached_tokens, 0, "prompt {p} shares nothing with anything");
        replies.push(reply);
    }
    // The first three picks filled each engine once, the last three again.
    let first: BTreeMap<usize, usize> = per_engine(stack, &replies[..3]);
    let second: BTreeMap<usize, usize> = per_engine(stack, &replies[3..]);
    assert_eq!(first.values().copied().collect::<Vec<_>>(), vec![1, 1, 1], "first three picks: {first:?}");
    assert_eq!(second.values().copied().collect::<Vec<_>>(), vec![1, 1, 1], "last three picks: {second:?}");
    owned.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_traffic_frees_every_booking_when_the_responses_end() {
    let owned = Stack::start(StackOptions { engines: 3, shards: 2, ..StackOptions::default() }).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    let before = stack.app().ext_proc_metrics().snapshot();
    // Four conversations of three turns each and twelve one-off prompts,
    // all at once: picks, prefill completions and frees interleave.
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..4 {
        let gateway = stack.gateway.clone();
        tasks.spawn(async move {
            let mut conversation = Conversation::new(&format!("k{c}"), 50, 12);
            for turn in 0..3 {
                let reply = post_chat(&gateway, &conversation.ask(turn, 15)).await?;
                conversation.answered(&reply);
            }
            Ok::<usize, String>(3)
        });
    }
    for p in 0..12 {
        let gateway = stack.gateway.clone();
        tasks.spawn(async move {
            let body = chat_body(&[json!({"role": "user", "content": words(&format!("o{p}"), 120 + 10 * p)})], 6);
            post_chat(&gateway, &body).await.map(|_| 1)
        });
    }
    let mut sent = 0u64;
    while let Some(joined) = tasks.join_next().await {
        sent += joined.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("request: {e}")) as u64;
    }
    assert_eq!(sent, 24);
    stack.wait_drained().await;
    let after = stack.app().ext_proc_metrics().snapshot();
    assert_eq!(after.requests(200) - before.requests(200), sent, "every request was picked");
    assert_eq!(after.frees - before.frees, sent, "every request's booking was freed by its stream");
    assert_eq!(after.frees_not_found, before.frees_not_found, "no booking had gone before its free");
    assert_eq!(after.prefill_completes - before.prefill_completes, sent, "every response's first chunk was seen");
    assert_eq!(after.usage_responses - before.usage_responses, sent, "kvpick read every response's usage");
    kvpick_e2e::eventually("no ext_proc stream left open", || {
        let snapshot = stack.app().ext_proc_metrics().snapshot();
        let result = if snapshot.streams_open == 0 && snapshot.inflight == 0 {
            Ok(())
        } else {
            Err(format!("{} streams open, {} picks in flight", snapshot.streams_open, snapshot.inflight))
        };
        async move { result }
    })
    .await;
    owned.finish().await;
}

/// `GET /metrics` of kvpick, as text (a plain HTTP/1.0 exchange).
async fn scrape(stack: &Stack) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(stack.app().metrics_addr()).await.unwrap_or_else(|e| panic!("{e}"));
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: kvpick\r\n\r\n").await.unwrap_or_else(|e| panic!("{e}"));
    let mut text = String::new();
    conn.read_to_string(&mut text).await.unwrap_or_else(|e| panic!("{e}"));
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_engine_is_learned_from_the_response_stream_and_avoided() {
    // Engine 0 runs every step four times slower; nothing tells kvpick.
    // Virtual time at 5× the wall clock: a prefill takes milliseconds of
    // wall time, well above the harness's own scheduling noise.
    let options = StackOptions { engines: 4, shards: 2, first_engine_slowdown: 4, time_scale: 5.0 };
    let owned = Stack::start(options).await;
    let stack = &owned;
    let slow = stack.worker(0);
    // Long prompts sharing nothing, one at a time: every engine is idle at
    // each pick, so the priors tie them all and the tie-break spreads the
    // requests until calibration tells the slow engine apart.
    let ask = |n: usize| chat_body(&[json!({"role": "user", "content": words(&format!("s{n}"), 1500)})], 2);
    let mut served = BTreeMap::new();
    for n in 0..60 {
        let reply = stack.chat(&ask(n)).await;
        *served.entry(stack.index_of(reply.endpoint)).or_insert(0) += 1;
        stack.wait_drained().await;
    }
    let (fits, fleet_scale, _) = stack.app().service().calibration();
    let factor = |w| fits.iter().find(|c| c.worker == w).map_or(1.0, |c| c.speed_factor);
    // Past the dead band (1.25): once it is, the engine is avoided while
    // the others are idle, so its fit stops growing towards the full 4×.
    assert!(factor(slow) > 1.25, "engine 0's speed factor {} (fits {fits:?}, served {served:?})", factor(slow));
    // The fast engines are never taken for slow ones. One of them may be
    // judged faster than the fleet (a factor below 1/1.25): their TTFTs are
    // wall-clock measurements, and a loaded machine skews them either way.
    for i in 1..4 {
        let f = factor(stack.worker(i));
        assert!(f <= 1.0, "engine {i} is as fast as the fleet, yet its factor is {f}: {fits:?}");
    }
    assert!(fleet_scale.is_some_and(|s| s > 0.0), "{fleet_scale:?}");
    // Once learned, the slow engine is left out while the others are idle.
    let mut after = BTreeMap::new();
    for n in 60..80 {
        let reply = stack.chat(&ask(n)).await;
        *after.entry(stack.index_of(reply.endpoint)).or_insert(0) += 1;
        stack.wait_drained().await;
    }
    assert_eq!(after.get(&0), None, "the slow engine still got requests: {after:?} (before: {served:?})");
    // What was learned is exported, per worker.
    let metrics = scrape(stack).await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("kvpick_worker_speed_factor{") && l.contains(&stack.endpoint(0).to_string()))
        .unwrap_or_else(|| panic!("no speed factor for engine 0 in:\n{metrics}"));
    let exported: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(exported > 1.25, "{line}");
    assert!(metrics.contains("kvpick_worker_decode_seconds_per_token{"), "{metrics}");
    owned.finish().await;
}
