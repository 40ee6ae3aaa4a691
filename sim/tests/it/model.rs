//! The simulated engine's model, without sockets: tokenizer and render
//! determinism, the prefix cache's LRU with pinning, the scheduler's time
//! model, and seeded determinism.

use kvpick_sim::tokenizer::{
    BOS, IM_END, IM_START, NEWLINE, OUTPUT_WORDS, encode_text, output_word, piece_id, render_chat, render_completion,
};
use kvpick_sim::{
    BlockDigest, CacheEvent, EngineConfig, EngineHasher, Outcome, PdOptions, PrefixCache, RequestSpec, Scheduler,
    StepReport, TimeModel, Update,
};
use serde_json::json;

// ---------------------------------------------------------------- tokenizer

#[test]
fn text_tokenization_is_deterministic_and_piecewise() {
    let text = "Hello, world! Tokenization\nworks.";
    assert_eq!(encode_text(text), encode_text(text));
    let tokens = encode_text(text);
    // "Hello" "," "world" "!" "Tokeniza" "tion" NEWLINE "works" "."
    assert_eq!(tokens.len(), 9);
    assert_eq!(tokens[0], piece_id("Hello"));
    assert_eq!(tokens[4], piece_id("Tokeniza"));
    assert_eq!(tokens[6], NEWLINE);
    // Whitespace only separates.
    assert_eq!(encode_text("a  b"), encode_text("a b"));
    assert_ne!(piece_id("a"), piece_id("b"));
}

#[test]
fn generated_text_tokenizes_back_to_the_sampled_ids() {
    let (ids, text): (Vec<u32>, String) = (0..OUTPUT_WORDS.len()).map(output_word).unzip();
    assert_eq!(encode_text(&text), ids);
}

#[test]
fn chat_render_follows_the_template() {
    let body = json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
    ]});
    let tokens = render_chat(&body).expect("renders");
    let mut expected = vec![BOS, IM_START, piece_id("system"), NEWLINE];
    expected.extend(encode_text("Be brief."));
    expected.extend([IM_END, NEWLINE, IM_START, piece_id("user"), NEWLINE, piece_id("Hi"), NEWLINE, piece_id("there")]);
    expected.extend([IM_END, NEWLINE, IM_START, piece_id("assistant"), NEWLINE]);
    assert_eq!(tokens, expected);
    assert_eq!(render_chat(&body), render_chat(&body.clone()));

    let no_prompt = json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false});
    assert_eq!(render_chat(&no_prompt).expect("renders").last(), Some(&NEWLINE));
    assert!(render_chat(&json!({"messages": []})).is_err());
    assert!(render_chat(&json!({"prompt": "x"})).is_err());
    assert!(render_chat(&json!({"messages": [{"content": "no role"}]})).is_err());
}

#[test]
fn a_multi_turn_chat_extends_its_previous_render() {
    let turn1 = json!({"messages": [{"role": "user", "content": "Tell me about caches"}]});
    let turn2 = json!({"messages": [
        {"role": "user", "content": "Tell me about caches"},
        {"role": "assistant", "content": " the cache block"},
        {"role": "user", "content": "more"},
    ]});
    let (t1, t2) = (render_chat(&turn1).expect("turn 1"), render_chat(&turn2).expect("turn 2"));
    // Turn 1 without its generation prompt is a prefix of turn 2.
    assert_eq!(&t2[..t1.len() - 3], &t1[..t1.len() - 3]);
    assert!(t2.len() > t1.len());
}

#[test]
fn completion_render_accepts_every_prompt_shape() {
    let one = render_completion(&json!({"prompt": "a b"})).expect("string");
    assert_eq!(one, vec![vec![BOS, piece_id("a"), piece_id("b")]]);
    let two = render_completion(&json!({"prompt": ["a", "b c"]})).expect("strings");
    assert_eq!(two.len(), 2);
    assert_eq!(render_completion(&json!({"prompt": [7, 8, 9]})).expect("ids"), vec![vec![7, 8, 9]]);
    assert_eq!(render_completion(&json!({"prompt": [[7], [8, 9]]})).expect("id lists"), vec![vec![7], vec![8, 9]]);
    let raw = render_completion(&json!({"prompt": "a", "add_special_tokens": false})).expect("no BOS");
    assert_eq!(raw, vec![vec![piece_id("a")]]);
    assert!(render_completion(&json!({"prompt": []})).is_err());
    assert!(render_completion(&json!({"prompt": [1, "a"]})).is_err());
    assert!(render_completion(&json!({"prompt": [999_999_999]})).is_err());
    assert!(render_completion(&json!({})).is_err());
}

// ------------------------------------------------------------------ hashing

#[test]
fn engine_hashes_chain_on_full_digests_and_depend_on_the_seed() {
    let tokens: Vec<u32> = (0..10).collect();
    let a = EngineHasher::new(1);
    let chain = a.chain(&tokens, 4);
    assert_eq!(chain.len(), 2, "the trailing partial block has no hash");
    assert_eq!(chain[1], a.block(Some(chain[0]), &tokens[4..8]));
    // Same published tail, different full parent digest: another child.
    let forged = BlockDigest(chain[0].0 ^ (1u128 << 100));
    assert_eq!(forged.published(), chain[0].published());
    assert_ne!(a.block(Some(forged), &tokens[4..8]), chain[1]);
    assert_ne!(EngineHasher::new(2).chain(&tokens, 4), chain);
    assert_eq!(EngineHasher::new(1).chain(&tokens, 4), chain);
}

// ------------------------------------------------------------- prefix cache

fn chain_of(seed: u64, tokens: &[u32], block_size: u32) -> Vec<BlockDigest> {
    EngineHasher::new(seed).chain(tokens, block_size)
}

/// A request's life in the cache: reserve, compute everything, keep refs.
fn fill(cache: &mut PrefixCache, chain: &[BlockDigest], tokens: &[u32]) -> bool {
    let hits = cache.match_len(chain);
    if !cache.reserve(&chain[..hits], chain.len() - hits) {
        return false;
    }
    cache.store(chain, tokens, hits..chain.len());
    true
}

#[test]
fn lru_evicts_unreferenced_blocks_tail_first_and_never_pinned_ones() {
    let mut cache = PrefixCache::new(4, 2);
    let (ta, tb, tc, td): (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) =
        ((0..4).collect(), (10..14).collect(), (20..22).collect(), (30..32).collect());
    let (a, b, c, d) = (chain_of(1, &ta, 2), chain_of(1, &tb, 2), chain_of(1, &tc, 2), chain_of(1, &td, 2));

    assert!(fill(&mut cache, &a, &ta));
    assert_eq!(
        cache.drain_events(),
        vec![CacheEvent::Stored { hashes: a.clone(), parent: None, token_ids: ta.clone(), block_size: 2 }]
    );
    cache.release(&a, 0);
    assert_eq!((cache.used(), cache.evictable()), (2, 2));
    assert!(fill(&mut cache, &b, &tb)); // pinned: never released
    cache.drain_events();
    assert_eq!(cache.used(), 4);

    // A needs room: A's tail goes first, then A's head.
    assert!(fill(&mut cache, &c, &tc));
    assert_eq!(cache.drain_events()[0], CacheEvent::Removed { hashes: vec![a[1]] });
    assert!(fill(&mut cache, &d, &td));
    assert_eq!(cache.drain_events()[0], CacheEvent::Removed { hashes: vec![a[0]] });

    // Everything left is pinned: no room, nothing changes.
    let te: Vec<u32> = (40..42).collect();
    let e = chain_of(1, &te, 2);
    assert!(!fill(&mut cache, &e, &te));
    assert!(cache.drain_events().is_empty());
    let snap = cache.snapshot();
    assert_eq!((snap.used, snap.evictable), (4, 0));
    assert!(snap.blocks.iter().all(|blk| blk.refs == 1));
    assert!(snap.contains(b[0].published()) && !snap.contains(a[0].published()));
    assert_eq!(snap.usage(), 1.0);
}

#[test]
fn a_hit_pins_its_block_out_of_the_lru() {
    let mut cache = PrefixCache::new(3, 2);
    let ta: Vec<u32> = (0..4).collect();
    let a = chain_of(1, &ta, 2);
    assert!(fill(&mut cache, &a, &ta));
    cache.drain_events();
    cache.release(&a, 0);
    // A request sharing A's first block: hits it, needs 2 new blocks (1 free
    // + 1 eviction): the eviction must take a[1], not the hit a[0].
    let mut tb = ta[..2].to_vec();
    tb.extend([50, 51]);
    let b = chain_of(1, &tb, 2);
    assert_eq!(b[0], a[0]);
    assert_eq!(cache.match_len(&b), 1);
    assert!(cache.reserve(&b[..1], 2));
    assert_eq!(cache.drain_events(), vec![CacheEvent::Removed { hashes: vec![a[1]] }]);
    cache.store(&b, &tb, 1..2);
    let events = cache.drain_events();
    assert_eq!(
        events,
        vec![CacheEvent::Stored { hashes: vec![b[1]], parent: Some(b[0]), token_ids: vec![50, 51], block_size: 2 }]
    );
    assert_eq!(cache.snapshot().blocks.iter().find(|blk| blk.digest == a[0]).map(|blk| blk.refs), Some(1));
    // Clear: everything gone, announced.
    cache.clear(true);
    assert_eq!(cache.drain_events(), vec![CacheEvent::Cleared]);
    assert_eq!((cache.used(), cache.cached()), (0, 0));
}

// ---------------------------------------------------------------- scheduler

fn config(block_size: u32, max_batched_tokens: u32) -> EngineConfig {
    EngineConfig {
        block_size,
        max_batched_tokens,
        num_blocks: 1024,
        time: TimeModel { time_scale: f64::INFINITY, ..TimeModel::default() },
        ..EngineConfig::default()
    }
}

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| 1000 + seed * 100_000 + i).collect()
}

fn spec(prompt: Vec<u32>, max_tokens: u32) -> RequestSpec {
    RequestSpec { prompt, max_tokens, seed: None }
}

/// Steps until idle; every report, and the outcomes by request id.
fn run(s: &mut Scheduler) -> (Vec<StepReport>, Vec<Outcome>) {
    let (mut reports, mut outcomes) = (Vec::new(), Vec::new());
    while let Some(report) = s.step() {
        outcomes.extend(report.updates.iter().filter_map(|u| match u {
            Update::Finished(o) => Some(*o),
            Update::Token { .. } => None,
        }));
        reports.push(report);
        assert!(reports.len() < 100_000, "the scheduler does not converge");
    }
    outcomes.sort_by_key(|o| o.id);
    (reports, outcomes)
}

fn solo(cfg: &EngineConfig, p: Vec<u32>, max_tokens: u32) -> Outcome {
    let mut s = Scheduler::new(cfg);
    s.submit(spec(p, max_tokens)).expect("accepted");
    run(&mut s).1[0]
}

#[test]
fn ttft_grows_with_uncached_prompt_tokens() {
    let cfg = config(16, 8192);
    let ttfts: Vec<u64> = [64, 512, 2048, 6000].iter().map(|&n| solo(&cfg, prompt(1, n), 4).ttft_ns()).collect();
    assert!(ttfts.windows(2).all(|w| w[0] < w[1]), "{ttfts:?}");

    // The same prompt again: cached, so faster; a longer one sharing it
    // pays only for its new tokens.
    let mut s = Scheduler::new(&cfg);
    s.submit(spec(prompt(1, 2048), 4)).expect("accepted");
    let cold = run(&mut s).1[0];
    s.submit(spec(prompt(1, 2048), 4)).expect("accepted");
    let warm = run(&mut s).1[0];
    assert_eq!(cold.cached_tokens, 0);
    assert_eq!(warm.cached_tokens, 2048 - 16, "all but the last block (vLLM computes the last token)");
    assert!(warm.ttft_ns() < cold.ttft_ns());
    s.submit(spec(prompt(1, 4096), 4)).expect("accepted");
    let extended = run(&mut s).1[0];
    assert_eq!(extended.cached_tokens, 2048);
    assert!(extended.ttft_ns() < solo(&cfg, prompt(1, 4096), 4).ttft_ns());
    let c = s.counters();
    assert_eq!(c.prefix_cache_queries, 2048 + 2048 + 4096);
    assert_eq!(c.prefix_cache_hits, u64::from(warm.cached_tokens + extended.cached_tokens));
}

#[test]
fn ttft_grows_with_queued_prefill_work_and_steps_respect_the_token_budget() {
    let cfg = config(16, 512);
    let alone = solo(&cfg, prompt(2, 200), 4).ttft_ns();
    let mut s = Scheduler::new(&cfg);
    s.submit(spec(prompt(1, 4000), 4)).expect("accepted");
    s.submit(spec(prompt(2, 200), 4)).expect("accepted");
    let (reports, outcomes) = run(&mut s);
    assert!(outcomes[1].ttft_ns() > alone, "queued behind a long prefill: {} <= {alone}", outcomes[1].ttft_ns());
    assert!(outcomes[1].ttft_ns() > outcomes[0].ttft_ns() / 2);
    for r in &reports {
        assert!(r.prefill_tokens + r.decoding <= 512, "step over budget: {r:?}");
        assert_eq!(r.ended_ns - r.started_ns, cfg.time.step_ns(r.prefill_tokens, r.decoding));
    }
}

#[test]
fn a_prefilled_request_decodes_at_once_and_its_blocks_are_cached_and_announced() {
    let cfg = config(16, 8192);
    let mut s = Scheduler::new(&cfg);
    s.submit_prefilled(spec(prompt(1, 2048), 4)).expect("accepted");
    let (reports, outcomes) = run(&mut s);
    let done = outcomes[0];
    assert_eq!(reports[0].prefill_tokens, 0, "no prompt token computed");
    assert_eq!(done.ttft_ns(), cfg.time.step_ns(0, 1), "its first token after one decode step");
    assert_eq!(done.cached_tokens, 2048, "the whole prompt came transferred");
    let stored: usize = reports[0]
        .events
        .iter()
        .map(|e| match e {
            CacheEvent::Stored { hashes, .. } => hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(stored, 2048 / 16, "its full blocks announced as any computed block");
    assert_eq!(s.counters().prefix_cache_hits, 0, "transferred blocks are no hits of this cache");
    // The same prompt again, whole: served from the transferred blocks.
    s.submit(spec(prompt(1, 2048), 4)).expect("accepted");
    assert_eq!(run(&mut s).1[0].cached_tokens, 2048 - 16);
}

#[test]
fn a_held_prefill_pins_its_prompt_until_released() {
    let cfg = config(16, 8192);
    let mut s = Scheduler::new(&cfg);
    let id =
        s.submit_pd(spec(prompt(1, 100), 1), PdOptions { transferred_tokens: 0, hold_blocks: true }).expect("accepted");
    run(&mut s);
    assert!(s.holds(id));
    assert_eq!(s.held_transfers(), 1);
    assert_eq!(s.held_blocks(), 100usize.div_ceil(16), "the full blocks and the partial one");
    assert_eq!(s.cache().evictable(), 0, "held blocks are not evictable");
    assert_eq!(s.cache().used(), 7);
    assert!(s.release_hold(id));
    assert!(!s.release_hold(id), "released once");
    assert_eq!(s.cache().evictable(), 6, "the full blocks stay cached, now evictable");
    assert_eq!(s.cache().used(), 6);
}

#[test]
fn transferred_tokens_are_not_computed_again() {
    let cfg = config(16, 8192);
    let mut s = Scheduler::new(&cfg);
    s.submit_pd(spec(prompt(1, 100), 2), PdOptions { transferred_tokens: 99, hold_blocks: false }).expect("accepted");
    let (reports, outcomes) = run(&mut s);
    assert_eq!(reports[0].prefill_tokens, 1, "only the last prompt token");
    assert_eq!(outcomes[0].cached_tokens, 99);
    assert_eq!(s.counters().prefix_cache_hits, 0);
    assert!(s.submit_pd(spec(prompt(1, 10), 2), PdOptions { transferred_tokens: 11, hold_blocks: false }).is_err());
}

#[test]
fn decoding_slows_with_the_batch() {
    let cfg = config(16, 8192);
    let itl = |o: &Outcome| (o.finished_ns - o.first_token_ns) / u64::from(o.completion_tokens - 1);
    let single = itl(&solo(&cfg, prompt(1, 32), 50));
    let mut s = Scheduler::new(&cfg);
    for i in 0..16 {
        s.submit(spec(prompt(i, 32), 50)).expect("accepted");
    }
    let (_, outcomes) = run(&mut s);
    assert_eq!(outcomes.len(), 16);
    assert!(outcomes.iter().all(|o| o.completion_tokens == 50));
    let batched = itl(&outcomes[0]);
    assert_eq!(single, cfg.time.step_ns(0, 1));
    assert_eq!(batched, cfg.time.step_ns(0, 16));
}

#[test]
fn requests_beyond_the_limits_are_rejected() {
    let cfg = EngineConfig { max_model_len: 100, num_blocks: 4, block_size: 16, ..config(16, 8192) };
    let mut s = Scheduler::new(&cfg);
    assert!(s.submit(spec(prompt(1, 90), 20)).is_err(), "over max_model_len");
    assert!(s.submit(spec(prompt(1, 60), 10)).is_err(), "over the KV cache");
    assert!(s.submit(spec(Vec::new(), 10)).is_err(), "empty prompt");
    assert!(s.submit(spec(prompt(1, 10), 0)).is_err(), "no completion");
    assert!(s.submit(spec(prompt(1, 40), 20)).is_ok());
}

#[test]
fn a_full_cache_makes_requests_wait_then_evicts() {
    // 8 blocks of 4 tokens: each request takes 4 blocks (12 + 4 tokens).
    let cfg = EngineConfig { num_blocks: 8, ..config(4, 8192) };
    let mut s = Scheduler::new(&cfg);
    for i in 0..3 {
        s.submit(spec(prompt(i, 12), 4)).expect("accepted");
    }
    let (reports, outcomes) = run(&mut s);
    assert_eq!(outcomes.len(), 3);
    // The third waited for the first two to finish.
    assert!(outcomes[2].first_token_ns > outcomes[0].finished_ns);
    let removed: usize = reports
        .iter()
        .flat_map(|r| &r.events)
        .map(|e| match e {
            CacheEvent::Removed { hashes } => hashes.len(),
            _ => 0,
        })
        .sum();
    assert!(removed >= 1, "the third request evicted cached blocks");
    assert!(s.cache().used() <= 8);
}

#[test]
fn running_out_of_blocks_mid_decode_preempts_the_last_admitted_and_it_recomputes() {
    // 8 blocks of 4 tokens. Each request: 8 prompt tokens, 12 generated:
    // 3 blocks at admission, 5 by its end, so two cannot both finish
    // without one giving its blocks back.
    let cfg = EngineConfig { num_blocks: 8, ..config(4, 8192) };
    let mut s = Scheduler::new(&cfg);
    s.submit(spec(prompt(1, 8), 12)).expect("accepted");
    s.submit(spec(prompt(2, 8), 12)).expect("accepted");
    let (reports, outcomes) = run(&mut s);
    assert_eq!(outcomes.len(), 2);
    assert!(outcomes.iter().all(|o| o.completion_tokens == 12), "{outcomes:?}");
    assert!(s.counters().preemptions >= 1, "{:?}", s.counters());
    // Both started together; the second was preempted, so it finished
    // after the first, and its first token kept its time.
    assert_eq!(outcomes[0].first_token_ns, outcomes[1].first_token_ns);
    assert!(outcomes[1].finished_ns > outcomes[0].finished_ns);
    // The recompute ran a second prefill of the preempted prompt (from
    // what stayed cached: its first block, as vLLM computes the last).
    let prefills: u64 = reports.iter().map(|r| r.prefill_tokens).sum();
    assert!(prefills > 16, "{prefills} prefill tokens: no recompute");
    assert!(s.cache().used() <= 8);
}

#[test]
fn same_seed_same_run_other_seed_other_hashes() {
    let cfg = config(16, 1024);
    let script = |s: &mut Scheduler| {
        for i in 0..6 {
            s.submit(spec(prompt(i % 3, 300 + 100 * i), 8)).expect("accepted");
        }
        let first = run(s);
        s.submit(spec(prompt(0, 700), 8)).expect("accepted");
        let second = run(s);
        (first, second)
    };
    let (a, b) = (script(&mut Scheduler::new(&cfg)), script(&mut Scheduler::new(&cfg)));
    assert_eq!(a, b, "same seed, same submissions: same steps, tokens, events and times");

    let other = script(&mut Scheduler::new(&EngineConfig { seed: 99, ..cfg.clone() }));
    let stored = |run: &(Vec<StepReport>, Vec<Outcome>)| -> Vec<BlockDigest> {
        run.0
            .iter()
            .flat_map(|r| &r.events)
            .flat_map(|e| match e {
                CacheEvent::Stored { hashes, .. } => hashes.clone(),
                _ => Vec::new(),
            })
            .collect()
    };
    assert_ne!(stored(&a.0), stored(&other.0), "another engine seed hashes differently");
    // Timings and cache hits do not depend on the seed.
    assert_eq!(a.0.1, other.0.1);
    let same_hashes = EngineConfig { seed: 99, hash_seed: Some(cfg.effective_hash_seed()), ..cfg.clone() };
    assert_eq!(stored(&a.0), stored(&script(&mut Scheduler::new(&same_hashes)).0), "a shared hash seed agrees");
}
