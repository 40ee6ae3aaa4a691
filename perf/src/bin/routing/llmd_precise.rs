//! llm-d's precise-prefix-cache profile: the GAIE scheduling profile with
//! the approximate prefix scorer swapped for the precise one, fed by the
//! engines' KV events. Weights as llm-d's precise-prefix guide sets them
//! (precise prefix 3, queue 2, KV-cache utilization 2), max-score picker
//! with random ties. Prefix score = longest run of leading prompt blocks
//! the engine holds (per its events) / the prompt's full blocks.
//!
//! The index here is kvpick's (an index of what the events say, re-hashed
//! from the blocks' tokens), standing in for llm-d's kv-cache indexer: both
//! learn the same facts from the same events. Queue and KV usage come from
//! scraped metrics, as in the approximate profile.

use kvpick_core::{HashSeed, RouterConfig, SelectionService, WorkerId, WorkerSpec};
use kvpick_perf::sim::{CacheEvent, EngineConfig};

use super::approx_prefix::{Scraper, gaie_score};
use super::fleet::{Arrival, FleetView, Policy};
use super::kvpick_policy::kv_event;

pub struct LlmdPrecise {
    index: SelectionService,
    scraper: Scraper,
    rng: fastrand::Rng,
}

impl LlmdPrecise {
    pub fn new(engines: usize, engine: &EngineConfig, seed: u64) -> Self {
        let mut index = SelectionService::new(RouterConfig::default(), engine.block_size, 1);
        for k in 0..engines {
            let endpoint = std::net::SocketAddr::from(([10, 1, (k / 250) as u8, (k % 250) as u8 + 1], 8000));
            let spec = WorkerSpec::new(WorkerId(k as u64), endpoint, engine.block_size);
            index.upsert_worker(spec, kvpick_core::Millis(0)).expect("every worker has the index's block size");
        }
        LlmdPrecise { index, scraper: Scraper::default(), rng: fastrand::Rng::with_seed(seed) }
    }
}

impl Policy for LlmdPrecise {
    fn route(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        let prompt = self.index.prompt(arrival.tokens, HashSeed::default());
        let blocks = prompt.seq_hashes.len();
        let mut depth = vec![0u32; fleet.len()];
        for (worker, d) in self.index.overlap_scores(&prompt) {
            depth[worker.0 as usize] = d;
        }
        let metrics = self.scraper.metrics(fleet, arrival.now_ns);
        let scores = (0..fleet.len()).map(|k| {
            let prefix = if blocks == 0 { 0.0 } else { (f64::from(depth[k]) / blocks as f64).min(1.0) };
            -gaie_score(metrics, k, prefix)
        });
        super::baselines::argmin_random(scores, &mut self.rng)
    }

    fn on_events(&mut self, engine: usize, events: &[CacheEvent], _: u64) {
        for event in events {
            // The same events kvpick applies; a refusal would show there.
            let _ = self.index.apply_kv_event(WorkerId(engine as u64), &kv_event(event));
        }
    }
}
