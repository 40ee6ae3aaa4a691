//! Workers leaving: an engine stopped mid-run, with a request of its own
//! in flight, gives back that request's booking as soon as its stream
//! ends, and gets no traffic once it leaves the workers file, even for a
//! conversation whose prefix only it held.

use kvpick_e2e::{BLOCK_SIZE, Conversation, Stack, StackOptions, chat_body, eventually, full_blocks, words};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_engine_gets_no_traffic_once_it_leaves_the_workers_file() {
    let owned = Stack::start(StackOptions { engines: 3, shards: 2, ..StackOptions::default() }).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    const GONE: usize = 2;

    // One conversation per engine (first turns booked one after the
    // other spread by load), so one of them lives on the engine to stop.
    let mut conversations: Vec<Conversation> = (0..3).map(|c| Conversation::new(&format!("m{c}"), 60, 8)).collect();
    let firsts: Vec<_> = conversations.iter_mut().map(|c| c.ask(0, 20)).collect();
    stack.stall_all(true);
    let tasks = stack.send_booked_in_order(firsts.clone()).await;
    stack.stall_all(false);
    let mut homes = Vec::new();
    for (c, task) in tasks.into_iter().enumerate() {
        let reply = task.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("conversation {c}: {e}"));
        homes.push(stack.index_of(reply.endpoint));
        conversations[c].answered(&reply);
    }
    let orphan =
        homes.iter().position(|h| *h == GONE).unwrap_or_else(|| panic!("no conversation on {GONE}: {homes:?}"));

    // Its next turn goes to the engine holding its prefix, which freezes
    // with the request in flight and is then stopped.
    let next = conversations[orphan].ask(1, 20);
    stack.wait_drained().await;
    stack.wait_overlap(&next, GONE, full_blocks(&firsts[orphan])).await;
    stack.engine(GONE).set_stalled(true).unwrap_or_else(|e| panic!("{e}"));
    let in_flight = {
        let gateway = stack.gateway.clone();
        let body = next.clone();
        tokio::spawn(async move { kvpick_e2e::post_chat(&gateway, &body).await })
    };
    eventually("the turn is booked on the engine about to stop", || async move {
        let load = stack.load_of(GONE).await;
        if load.requests == 1 { Ok(()) } else { Err(format!("{load:?}")) }
    })
    .await;
    stack.engine(GONE).shutdown().await;
    let cut = in_flight.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(cut.is_err(), "a request cut by its engine stopping cannot have completed: {cut:?}");
    // The stream ended with the request: its booking must go with it,
    // before and whatever discovery does.
    eventually("the cut request's booking is freed", || {
        let left = stack.app().service().active_reservations();
        async move { if left == 0 { Ok(()) } else { Err(format!("{left} reservations")) } }
    })
    .await;

    // The engine leaves the workers file: kvpick drops the worker, its
    // index and its KV-event subscription.
    let stayed: Vec<usize> = (0..3).filter(|i| *i != GONE).collect();
    stack.write_workers(&stayed);
    stack.wait_workers(&stayed).await;
    let gone = stack.worker(GONE);
    eventually("the stopped engine's KV events are unsubscribed", || {
        let subscribed = stack.app().ingest().metrics().worker(gone).is_some();
        async move { if subscribed { Err("still subscribed".to_owned()) } else { Ok(()) } }
    })
    .await;

    // The orphaned conversation starts over elsewhere, from nothing.
    let reply = stack.chat(&next).await;
    let new_home = stack.index_of(reply.endpoint);
    assert_ne!(new_home, GONE, "the removed engine got the orphaned conversation");
    assert_eq!(reply.cached_tokens, 0, "the conversation was cached only on the stopped engine");
    conversations[orphan].answered(&reply);

    // The survivors keep their conversations...
    for c in (0..3).filter(|c| *c != orphan) {
        let previous = conversations[c].last_asked().clone();
        let body = conversations[c].ask(1, 20);
        stack.wait_drained().await;
        stack.wait_overlap(&body, homes[c], full_blocks(&previous)).await;
        let reply = stack.chat(&body).await;
        assert_eq!(stack.index_of(reply.endpoint), homes[c], "conversation {c} left its engine");
        assert_eq!(reply.cached_tokens, u64::from(full_blocks(&previous) * BLOCK_SIZE));
    }
    // ...and a burst spreads over the two engines left, two each.
    let bodies: Vec<_> =
        (0..4).map(|p| chat_body(&[json!({"role": "user", "content": words(&format!("n{p}"), 300)})], 6)).collect();
    stack.stall_all(true);
    let tasks = stack.send_booked_in_order(bodies).await;
    for i in &stayed {
        let load = stack.load_of(*i).await;
        assert_eq!(load.requests, 2, "engine {i} should hold two of the four: {load:?}");
    }
    stack.stall_all(false);
    for (p, task) in tasks.into_iter().enumerate() {
        let reply = task.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("prompt {p}: {e}"));
        assert_ne!(stack.index_of(reply.endpoint), GONE, "prompt {p} went to the removed engine");
    }
    let loads = stack.loads().await;
    assert!(loads.iter().all(|l| l.worker != gone), "the removed worker is still in the shards: {loads:?}");
    owned.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_comes_back_is_relearnt_by_catch_up_replay() {
    let owned = Stack::start(StackOptions::default()).await;
    // Borrowed by the conditions waited on; `owned` is finished at the end.
    let stack = &owned;
    let mut conversation = Conversation::new("back", 60, 8);
    let body0 = conversation.ask(0, 20);
    let reply = stack.chat(&body0).await;
    let home = stack.index_of(reply.endpoint);
    conversation.answered(&reply);
    stack.wait_in_sync(home).await;

    // The engine leaves the pool (not stopped) and keeps serving others
    // meanwhile: kvpick hears none of it.
    let others: Vec<usize> = (0..3).filter(|i| *i != home).collect();
    stack.write_workers(&others);
    stack.wait_workers(&others).await;
    let worker = stack.worker(home);
    eventually("the leaving engine's KV events are unsubscribed", || {
        let subscribed = stack.app().ingest().metrics().worker(worker).is_some();
        async move { if subscribed { Err("still subscribed".to_owned()) } else { Ok(()) } }
    })
    .await;
    let away = chat_body(&[json!({"role": "user", "content": words("away", 80)})], 4);
    let spec = kvpick_sim::RequestSpec { prompt: kvpick_e2e::prompt_tokens(&away), max_tokens: 1, seed: Some(0) };
    stack.engine(home).generate(spec).await.unwrap_or_else(|e| panic!("{e}"));

    // Back in the file: kvpick starts the worker from nothing, and its
    // first batch (seq > 0) makes it replay the engine's buffer from 0,
    // relearning what the engine cached before and while it was away.
    let base = stack.ingest();
    stack.write_workers(&[0, 1, 2]);
    stack.wait_workers(&[0, 1, 2]).await;
    stack.warm_up(home).await;
    let now = stack.ingest();
    assert!(now.replays_started > base.replays_started, "no catch-up replay: {now:?}");
    assert_eq!(now.lost_batches, base.lost_batches, "a catch-up never reports loss: {now:?}");
    assert_eq!(stack.overlap(&away, home).await, full_blocks(&away), "blocks stored while away are known");

    let body1 = conversation.ask(1, 20);
    stack.wait_drained().await;
    assert_eq!(stack.overlap(&body1, home).await, full_blocks(&body0), "blocks stored before leaving are known");
    let reply = stack.chat(&body1).await;
    assert_eq!(stack.index_of(reply.endpoint), home, "the conversation goes back to its engine");
    assert_eq!(reply.cached_tokens, u64::from(full_blocks(&body0) * BLOCK_SIZE));
    owned.finish().await;
}
