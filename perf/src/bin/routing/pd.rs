//! Policies of a disaggregated fleet: engines `0..prefill` prefill, the
//! rest decode. A split request is prefilled on a prefill engine, its KV
//! blocks move to the decode engine (a time cost, see `fleet::Transfer`)
//! and it decodes there; a request kept whole is served by a decode engine.
//!
//! - kvpick-pd: kvpick's two selectors (each the real selection core over
//!   its role's engines, fed their KV events) and its decider
//!   (`kvpick_router::DisaggConfig`), as `kvpick serve` runs them: both
//!   legs selected, split only when the uncached part on the decode pick
//!   reaches the threshold. The prefill booking is freed when the prefill
//!   engine finishes (the real one at the decode side's first chunk, a
//!   transfer later), the decode booking at the end.
//! - llm-d-pd: llm-d's `disagg-profile-handler`, decode first: the decode
//!   profile (precise prefix 3, queue 2, KV usage 2) over the decode pods,
//!   then `prefix-based-pd-decider` on the chosen pod (split when its
//!   uncached suffix is at least `nonCachedTokens`; llm-d's default is 0,
//!   which never splits, so its P/D guides' 16 is used), then the same
//!   profile over the prefill pods.
//! - random-pd: every request split, both engines drawn at random.

use std::collections::HashMap;

use kvpick_core::{
    Admission, CostModel, HashSeed, ReservationId, RouterConfig, SelectError, SelectRequest, SelectionService, WorkerId,
};
use kvpick_ext_proc::metrics::{PdRoute, ROUTE_CLASSES};
use kvpick_perf::sim::{CacheEvent, EngineConfig};
use kvpick_router::{DisaggConfig, Leg};

use super::approx_prefix::{Scraper, gaie_score};
use super::fleet::{Arrival, FleetView, Policy, Route};
use super::kvpick_policy::{kv_event, millis, selection_service};

/// llm-d's P/D guides' `nonCachedTokens`.
pub const LLMD_NON_CACHED_TOKENS: u32 = 16;

/// Which engines play which role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    pub prefill: usize,
    pub decode: usize,
}

impl Roles {
    fn prefill_engines(self) -> std::ops::Range<usize> {
        0..self.prefill
    }

    fn decode_engines(self) -> std::ops::Range<usize> {
        self.prefill..self.prefill + self.decode
    }
}

/// How many requests took each route, for the report.
#[derive(Default)]
struct RouteCounts([u64; ROUTE_CLASSES.len()]);

impl RouteCounts {
    fn note(&self, who: &str) -> String {
        let total: u64 = self.0.iter().sum::<u64>().max(1);
        let parts: Vec<String> = ROUTE_CLASSES
            .iter()
            .zip(self.0)
            .filter(|(_, n)| *n > 0)
            .map(|((route, reason), n)| {
                let what = if reason.is_empty() { (*route).to_owned() } else { format!("{route} ({reason})") };
                format!("{what} {:.1}%", n as f64 * 100.0 / total as f64)
            })
            .collect();
        format!("{who} routes: {}", parts.join(", "))
    }
}

pub struct KvpickPd {
    prefill: SelectionService,
    decode: SelectionService,
    decider: DisaggConfig,
    roles: Roles,
    /// Per split request: its prefill engine and the TTFT predicted there,
    /// and when it was picked (the first token's time calibrates it).
    split: HashMap<usize, (WorkerId, Option<f64>, u64)>,
    counts: RouteCounts,
}

impl KvpickPd {
    /// `prefill_cfg`: the decode side's policy with the prefill queue
    /// threshold (`kvpick serve --prefill-queue-threshold`).
    pub fn new(
        roles: Roles,
        engine: &EngineConfig,
        (prefill_cfg, cfg): (RouterConfig, RouterConfig),
        decider: DisaggConfig,
    ) -> Self {
        KvpickPd {
            prefill: selection_service(prefill_cfg, engine, roles.prefill_engines()),
            decode: selection_service(cfg, engine, roles.decode_engines()),
            decider,
            roles,
            split: HashMap::new(),
            counts: RouteCounts::default(),
        }
    }

    fn request(&self, arrival: &Arrival<'_>) -> SelectRequest {
        super::kvpick_policy::select_request(&self.decode, arrival)
    }
}

impl Policy for KvpickPd {
    fn route(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        self.route_pd(arrival, fleet).engine
    }

    fn route_pd(&mut self, arrival: &Arrival<'_>, _: &FleetView<'_>) -> Route {
        let (id, now) = (ReservationId(arrival.id as u64), millis(arrival.now_ns));
        let request = self.request(arrival);
        let isl = request.prompt.isl_tokens;
        let decode = match self.decode.select_and_reserve(request.clone(), now) {
            Ok(Admission::Reserved(selection)) => selection,
            other => unreachable!("decode workers, fresh ids and no queue threshold always reserve: {other:?}"),
        };
        let prefill = if self.decider.may_split(isl) {
            match self.prefill.select_and_reserve(request, now) {
                Ok(Admission::Reserved(selection)) => Ok(selection),
                Ok(Admission::Queued) => {
                    // As `kvpick serve`: a saturated prefill side queues nothing.
                    let _ = self.prefill.free_reservation(id, now);
                    Err(PdRoute::PrefillSaturated)
                }
                Err(SelectError::NoWorkers | SelectError::NoEligibleWorkers) => Err(PdRoute::NoPrefillWorker),
                Err(SelectError::QueueFull) => Err(PdRoute::PrefillSaturated),
                Err(_) => Err(PdRoute::PrefillFailed),
            }
        } else {
            Err(PdRoute::ShortUncached)
        };
        let route = self.decider.decide(Leg::of(&decode), prefill.as_ref().map(Leg::of).map_err(|why| *why));
        self.counts.0[route as usize] += 1;
        match (route, prefill) {
            (PdRoute::Disaggregated, Ok(prefill)) => {
                // The decode engine computes none of the prompt.
                let _ = self.decode.prefill_complete(id, now);
                self.split.insert(arrival.id, (prefill.worker, prefill.predicted_ttft_ns, arrival.now_ns));
                Route { engine: decode.worker.0 as usize, prefill: Some(prefill.worker.0 as usize) }
            }
            (_, prefill) => {
                if prefill.is_ok() {
                    let _ = self.prefill.free_reservation(id, now);
                }
                Route { engine: decode.worker.0 as usize, prefill: None }
            }
        }
    }

    fn on_events(&mut self, engine: usize, events: &[CacheEvent], _: u64) {
        let svc = if engine < self.roles.prefill { &mut self.prefill } else { &mut self.decode };
        for event in events {
            // The aggregated kvpick run reports refusals; the same events here.
            let _ = svc.apply_kv_event(WorkerId(engine as u64), &kv_event(event));
        }
    }

    fn on_prefill_done(&mut self, id: usize, now_ns: u64) {
        let _ = self.prefill.free_reservation(ReservationId(id as u64), millis(now_ns));
    }

    fn on_first_token(&mut self, id: usize, now_ns: u64) {
        match self.split.remove(&id) {
            // The time to first token, transfer included, is the prefill engine's sample.
            Some((worker, Some(predicted), at)) => {
                let _ = self.prefill.observe_ttft(worker, predicted, now_ns - at, millis(now_ns));
            }
            Some(_) => {}
            None => {
                let _ = self.decode.prefill_complete(ReservationId(id as u64), millis(now_ns));
            }
        }
    }

    fn on_finished(&mut self, id: usize, now_ns: u64) {
        let (id, now) = (ReservationId(id as u64), millis(now_ns));
        let _ = self.decode.free_reservation(id, now);
        // A split request the prefill engine refused still holds its leg.
        let _ = self.prefill.free_reservation(id, now);
    }

    fn notes(&self) -> Vec<String> {
        vec![self.counts.note("kvpick-pd")]
    }
}

/// llm-d's decode-first P/D profile handler over its precise-prefix profile.
pub struct LlmdPd {
    index: SelectionService,
    scraper: Scraper,
    rng: fastrand::Rng,
    roles: Roles,
    non_cached_tokens: u32,
    counts: RouteCounts,
}

impl LlmdPd {
    pub fn new(roles: Roles, engine: &EngineConfig, non_cached_tokens: u32, seed: u64) -> Self {
        let engines = roles.prefill + roles.decode;
        let index =
            selection_service(RouterConfig { cost: CostModel::Dynamo, ..RouterConfig::default() }, engine, 0..engines);
        LlmdPd {
            index,
            scraper: Scraper::default(),
            rng: fastrand::Rng::with_seed(seed),
            roles,
            non_cached_tokens,
            counts: RouteCounts::default(),
        }
    }

    /// The profile's pick among `engines`: GAIE's weighted scores with the
    /// precise prefix score, the highest wins, ties at random.
    fn pick(
        &mut self,
        engines: std::ops::Range<usize>,
        depth: &[u32],
        blocks: usize,
        fleet: &FleetView<'_>,
        now: u64,
    ) -> usize {
        let metrics = self.scraper.metrics(fleet, now);
        let scores: Vec<f64> = engines
            .clone()
            .map(|k| {
                let prefix = if blocks == 0 { 0.0 } else { (f64::from(depth[k]) / blocks as f64).min(1.0) };
                -gaie_score(metrics, k, prefix)
            })
            .collect();
        engines.start + super::baselines::argmin_random(scores.into_iter(), &mut self.rng)
    }
}

impl Policy for LlmdPd {
    fn route(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        self.route_pd(arrival, fleet).engine
    }

    fn route_pd(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> Route {
        let prompt = self.index.prompt(arrival.tokens, HashSeed::default());
        let blocks = prompt.seq_hashes.len();
        let mut depth = vec![0u32; fleet.len()];
        for (worker, d) in self.index.overlap_scores(&prompt) {
            depth[worker.0 as usize] = d;
        }
        let decode = self.pick(self.roles.decode_engines(), &depth, blocks, fleet, arrival.now_ns);
        let cached = (depth[decode] as usize * fleet.block_size()).min(arrival.tokens.len());
        let uncached = (arrival.tokens.len() - cached) as u32;
        let split = self.non_cached_tokens > 0 && uncached >= self.non_cached_tokens && self.roles.prefill > 0;
        if !split {
            self.counts.0[PdRoute::ShortUncached as usize] += 1;
            return Route { engine: decode, prefill: None };
        }
        self.counts.0[PdRoute::Disaggregated as usize] += 1;
        let prefill = self.pick(self.roles.prefill_engines(), &depth, blocks, fleet, arrival.now_ns);
        Route { engine: decode, prefill: Some(prefill) }
    }

    fn on_events(&mut self, engine: usize, events: &[CacheEvent], _: u64) {
        for event in events {
            let _ = self.index.apply_kv_event(WorkerId(engine as u64), &kv_event(event));
        }
    }

    fn notes(&self) -> Vec<String> {
        vec![self.counts.note("llm-d-pd")]
    }
}

/// Random pairing: every request split, both engines at random.
pub struct RandomPd {
    roles: Roles,
    rng: fastrand::Rng,
}

impl RandomPd {
    pub fn new(roles: Roles, seed: u64) -> Self {
        RandomPd { roles, rng: fastrand::Rng::with_seed(seed) }
    }
}

impl Policy for RandomPd {
    fn route(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        self.route_pd(arrival, fleet).engine
    }

    fn route_pd(&mut self, _: &Arrival<'_>, _: &FleetView<'_>) -> Route {
        let engine = self.rng.usize(self.roles.decode_engines());
        let prefill = (self.roles.prefill > 0).then(|| self.rng.usize(self.roles.prefill_engines()));
        Route { engine, prefill }
    }
}
