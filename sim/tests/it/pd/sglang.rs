//! SGLang's bootstrap protocol: the same body to both engines at once
//! (engines.md §4, `mini_lb`).

use std::time::{Duration, Instant};

use kvpick_sim::{Engine, Flavour};
use serde_json::{Value, json};

use super::{PROMPT, pair, released, settles, transfers, url};
use crate::support::{Http, eventually, post_and_hold};

/// `body` with the bootstrap fields of `prefill` and `room` added.
fn with_bootstrap(body: &Value, prefill: &Engine, room: u64) -> Value {
    let bootstrap = prefill.endpoints().bootstrap.expect("side channel");
    let mut body = body.clone();
    body["bootstrap_host"] = json!(bootstrap.ip().to_string());
    body["bootstrap_port"] = json!(bootstrap.port());
    body["bootstrap_room"] = json!(room);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_legs_at_once_on_chat_and_generate() {
    let (prefill, decode) = pair(Flavour::Sglang, |_| {}).await;
    let http = Http::default();
    let room = (1u64 << 63) - 1;
    let body =
        with_bootstrap(&json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5}), &prefill, room);
    let (to_prefill, to_decode) = (url(&prefill, "/v1/chat/completions"), url(&decode, "/v1/chat/completions"));
    let (p, d) = tokio::join!(http.post(&to_prefill, &body), http.post(&to_decode, &body));
    assert_eq!(p.status, 200, "{}", p.text());
    assert_eq!(d.status, 200, "{}", d.text());
    let (p, d) = (p.json(), d.json());
    assert_eq!(p["usage"]["completion_tokens"], json!(1), "the prefill generates one token");
    assert_eq!(d["usage"]["completion_tokens"], json!(5));
    let prompt_tokens = d["usage"]["prompt_tokens"].clone();
    assert_eq!(
        d["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens,
        "the decode computed no prompt token"
    );
    let first = p["choices"][0]["message"]["content"].as_str().expect("prefill text").to_owned();
    let decoded = d["choices"][0]["message"]["content"].as_str().expect("decode text");
    assert!(decoded.starts_with(&first), "the decode starts from the prefill's token: {first:?} / {decoded:?}");
    assert_eq!(transfers(&http, &decode, "ok").await, 1.0);
    settles(&prefill).await;
    settles(&decode).await;

    // `/generate`, the decode leg asking before the prefill leg was sent.
    let body = with_bootstrap(
        &json!({"input_ids": (500u32..560).collect::<Vec<u32>>(), "sampling_params": {"max_new_tokens": 3}}),
        &prefill,
        42,
    );
    let (to_prefill, to_decode) = (url(&prefill, "/generate"), url(&decode, "/generate"));
    let decoding = http.post(&to_decode, &body);
    let prefilling = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        http.post(&to_prefill, &body).await
    };
    let (d, p) = tokio::join!(decoding, prefilling);
    assert_eq!((p.status.as_u16(), d.status.as_u16()), (200, 200), "{} / {}", p.text(), d.text());
    let (p, d) = (p.json(), d.json());
    assert_eq!(p["output_ids"].as_array().map(Vec::len), Some(1));
    assert_eq!(d["output_ids"].as_array().map(Vec::len), Some(3));
    assert_eq!(d["output_ids"][0], p["output_ids"][0]);
    assert_eq!(d["meta_info"]["cached_tokens"], json!(60));
    let cache = decode.cache().await.expect("cache");
    assert!(cache.blocks.iter().any(|b| b.token_ids[0] == 500), "the pulled blocks are cached on the decode engine");
    settles(&prefill).await;

    // The decode leg streamed.
    let body = with_bootstrap(&json!({"prompt": PROMPT, "max_tokens": 4, "stream": true}), &prefill, 7);
    let (to_prefill, to_decode) = (url(&prefill, "/v1/completions"), url(&decode, "/v1/completions"));
    let (p, d) = tokio::join!(http.post(&to_prefill, &body), http.post(&to_decode, &body));
    assert_eq!((p.status.as_u16(), d.status.as_u16()), (200, 200));
    let chunks = d.sse_data();
    assert_eq!(chunks.len(), 4 + 1 + 1, "four tokens, the finish chunk, [DONE]: {chunks:?}");
    assert_eq!(transfers(&http, &decode, "ok").await, 3.0);
    settles(&prefill).await;
    settles(&decode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_missing_fields_no_peer_and_unreachable() {
    let (prefill, decode) = pair(Flavour::Sglang, |c| c.kv_wait_ms = 300).await;
    let http = Http::default();
    let plain = json!({"prompt": PROMPT, "max_tokens": 2});
    for engine in [&prefill, &decode] {
        let answer = http.post(&url(engine, "/v1/completions"), &plain).await;
        assert_eq!(answer.status, 400, "no bootstrap room: {}", answer.text());
    }
    let mut bad = with_bootstrap(&plain, &prefill, 1);
    bad["bootstrap_room"] = json!(-4);
    assert_eq!(http.post(&url(&decode, "/v1/completions"), &bad).await.status, 400);

    // The decode leg alone: the room is never ready.
    let answer = http.post(&url(&decode, "/v1/completions"), &with_bootstrap(&plain, &prefill, 2)).await;
    assert_eq!(answer.status, 500, "{}", answer.text());
    let message = answer.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.starts_with("Decode transfer failed for request"), "{message}");
    assert_eq!(transfers(&http, &decode, "timeout").await, 1.0);

    // The prefill leg alone: nobody pulls, the request fails, nothing stays held.
    let answer = http.post(&url(&prefill, "/v1/completions"), &with_bootstrap(&plain, &prefill, 3)).await;
    assert_eq!(answer.status, 500, "{}", answer.text());
    settles(&prefill).await;
    assert_eq!(released(&http, &prefill, "abandoned").await, 1.0);

    // The prefill engine down.
    let body = with_bootstrap(&plain, &prefill, 4);
    prefill.shutdown().await;
    let generate = json!({
        "text": PROMPT,
        "bootstrap_host": body["bootstrap_host"],
        "bootstrap_port": body["bootstrap_port"],
        "bootstrap_room": 4,
    });
    let answer = http.post(&url(&decode, "/generate"), &generate).await;
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert_eq!(transfers(&http, &decode, "unreachable").await, 1.0);
    settles(&decode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_wait_leaves_nothing_held_or_running() {
    let (prefill, decode) = pair(Flavour::Sglang, |c| c.kv_wait_ms = 3_000).await;
    let http = Http::default();
    let body = with_bootstrap(&json!({"prompt": PROMPT, "max_tokens": 2}), &prefill, 11);

    // A prefill leg waiting for its pull, its client gone: the hold goes at
    // once, not when the 3 s wait would have ended.
    let client = post_and_hold(prefill.endpoints().http, "/v1/completions", &body).await;
    eventually("the prefill holds the room's blocks", || async { prefill.held_transfers().await.expect("stats") == 1 })
        .await;
    let left = Instant::now();
    drop(client);
    settles(&prefill).await;
    assert!(left.elapsed() < Duration::from_millis(1_500), "freed on the client's leaving");
    assert_eq!(released(&http, &prefill, "abandoned").await, 1.0);

    // A decode leg waiting for its room, its client gone: when the room
    // comes, no pull takes it (the prefill leg fails for want of one).
    let body = with_bootstrap(&body, &prefill, 12);
    let client = post_and_hold(decode.endpoints().http, "/v1/completions", &body).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(client);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answer = http.post(&url(&prefill, "/v1/completions"), &body).await;
    assert_eq!(answer.status, 500, "nobody pulled: {}", answer.text());
    assert_eq!(transfers(&http, &decode, "ok").await, 0.0);
    settles(&decode).await;
    settles(&prefill).await;
}
