use std::collections::BTreeSet;

use kvpick_core::{HashSeed, Prompt, Shard};

use super::*;
use crate::setup::{kv_event, shard};

fn spec(workers: u32, entries: u64) -> PopulationSpec {
    PopulationSpec { workers, entries, probes: 4, prompt_blocks: 512, seed: 7 }
}

fn apply(shard: &mut Shard, event: &BlockEvent) {
    let (worker, event) = kv_event(event);
    let applied = shard.apply_event(worker, &event).expect("generated events apply");
    assert_eq!(applied.unknown_removed, 0);
}

#[test]
fn a_population_stores_exactly_its_entries() {
    let population = Population::plan(spec(16, 50_000));
    assert_eq!(population.entries(), 50_000);
    let mut shard = shard(16);
    population.replay(16, |event| apply(&mut shard, &event));
    assert_eq!(shard.index().entries(), 50_000);
    // System prompts are shared: far fewer distinct blocks than entries.
    assert!(shard.index().distinct_blocks() < 50_000);
    assert_eq!(shard.stats().events_rejected + shard.stats().unknown_parent_events, 0);
}

#[test]
fn probes_match_many_workers_at_many_depths() {
    let population = Population::plan(spec(64, 200_000));
    let mut shard = shard(64);
    population.replay(16, |event| apply(&mut shard, &event));
    for tokens in population.probe_prompts() {
        assert_eq!(tokens.len(), 512 * BLOCK);
        let prompt = Prompt::from_tokens(&tokens, BLOCK_SIZE, HashSeed::default());
        let overlaps = shard.overlaps(&prompt.seq_hashes);
        let depths: BTreeSet<u32> = overlaps.iter().map(|&(_, d)| d).collect();
        assert!(overlaps.len() >= 8, "{overlaps:?}");
        assert!(depths.len() >= 6, "{depths:?}");
        assert_eq!(depths.last().copied(), Some(496));
    }
}

#[test]
fn fresh_rounds_and_the_eviction_mix_keep_the_index_consistent() {
    let population = Population::plan(spec(8, 20_000));
    let mut shard = shard(8);
    population.replay(64, |event| apply(&mut shard, &event));
    let mut fresh = FreshConversations::new(&population, 1);
    for batch in [1, 16, 64] {
        let (stores, removals) = fresh.round(10, 64, batch);
        assert_eq!(stores.len(), 10 * 64 / batch);
        stores.iter().for_each(|e| apply(&mut shard, e));
        assert_eq!(shard.index().entries(), 20_000 + 640);
        removals.iter().for_each(|e| apply(&mut shard, e));
        assert_eq!(shard.index().entries(), 20_000);
    }
    let mut mix = EvictionMix::new(&population, 2);
    for _ in 0..5 {
        let events = mix.chunk(5_000);
        let removals = events.iter().filter(|e| matches!(e, BlockEvent::Removed { .. })).count();
        assert!(removals * 2 > events.len(), "removal-heavy: {removals} of {}", events.len());
        events.iter().for_each(|e| apply(&mut shard, e));
        assert_eq!(shard.index().entries(), 20_000);
    }
    assert_eq!(shard.stats().unknown_removals, 0);
}
