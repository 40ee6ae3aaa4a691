//! kvpick: the real selection core (`SelectionService`), learning each
//! engine's cache only from its KV events, exactly as from a live engine:
//! engine hashes are opaque, so stored blocks are re-hashed from their
//! tokens and chained through the engine's parent hash. Reservations are
//! booked at the pick, moved to decode at the first token and freed when
//! the request finishes, at those virtual times. Each first token's TTFT,
//! measured from the pick, calibrates the worker's speed, as the router
//! does from the response stream.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use kvpick_core::{
    Admission, CostModel, HashSeed, KvEvent, Millis, ReservationId, RouterConfig, SelectRequest, Selection,
    SelectionService, WorkerId, WorkerSpec,
};
use kvpick_perf::sim::{CacheEvent, EngineConfig};

use super::fleet::{Arrival, FleetView, Policy};

pub struct Kvpick {
    svc: SelectionService,
    /// Per routed request: its worker, the TTFT the priors predicted and
    /// when it was picked.
    picked: HashMap<usize, (WorkerId, Option<f64>, u64)>,
    event_errors: u64,
    first_error: Option<String>,
}

/// kvpick's settings in these runs.
pub fn router_config(
    prefill_load_scale: f64,
    cost: CostModel,
    tpot_target: Option<Duration>,
    seed: u64,
) -> RouterConfig {
    RouterConfig {
        seed,
        prefill_load_scale,
        cost,
        tpot_target,
        // Virtual runs may keep a request longer than the default lease
        // when a policy overloads an engine; a lease expiry here would
        // be an artefact of the simulation, not kvpick's behaviour.
        lease: Duration::from_secs(24 * 3600),
        ..RouterConfig::default()
    }
}

/// A selection service whose workers are `engines` (worker id = engine
/// index), each with the engine's capacities.
pub fn selection_service(
    cfg: RouterConfig,
    engine: &EngineConfig,
    engines: std::ops::Range<usize>,
) -> SelectionService {
    let mut svc = SelectionService::new(cfg, engine.block_size, 1);
    for k in engines {
        let endpoint = SocketAddr::from(([10, 0, (k / 250) as u8, (k % 250) as u8 + 1], 8000));
        let spec = WorkerSpec {
            total_kv_blocks: Some(engine.num_blocks as u64),
            max_num_batched_tokens: Some(u64::from(engine.max_batched_tokens)),
            ..WorkerSpec::new(WorkerId(k as u64), endpoint, engine.block_size)
        };
        svc.upsert_worker(spec, Millis(0)).expect("every worker has the service's block size");
    }
    svc
}

impl Kvpick {
    pub fn new(
        engines: usize,
        engine: &EngineConfig,
        prefill_load_scale: f64,
        cost: CostModel,
        tpot_target: Option<Duration>,
        seed: u64,
    ) -> Self {
        let cfg = router_config(prefill_load_scale, cost, tpot_target, seed);
        let svc = selection_service(cfg, engine, 0..engines);
        Kvpick { svc, picked: HashMap::new(), event_errors: 0, first_error: None }
    }
}

/// The arrival as kvpick's router asks for it: its prompt hashed as
/// `svc` hashes, no model, endpoint filter, priority or session.
pub fn select_request(svc: &SelectionService, arrival: &Arrival<'_>) -> SelectRequest {
    SelectRequest {
        id: ReservationId(arrival.id as u64),
        prompt: svc.prompt(arrival.tokens, HashSeed::default()),
        model: None,
        allowed: None,
        priority: 0,
        sticky: None,
    }
}

/// Picks a worker for the arrival on `svc` and books it there.
pub fn reserve(svc: &mut SelectionService, arrival: &Arrival<'_>) -> Selection {
    match svc.select_and_reserve(select_request(svc, arrival), millis(arrival.now_ns)) {
        Ok(Admission::Reserved(selection)) => selection,
        other => unreachable!("schedulable workers, fresh ids and no queue threshold always reserve: {other:?}"),
    }
}

pub fn millis(ns: u64) -> Millis {
    Millis(ns / 1_000_000)
}

/// The engine's event in kvpick's engine-neutral form, with the hashes the
/// engine publishes (the digests' last 8 bytes), nothing more.
pub fn kv_event(event: &CacheEvent) -> KvEvent {
    match event {
        CacheEvent::Stored { hashes, parent, token_ids, block_size } => KvEvent::Stored {
            block_hashes: hashes.iter().map(|d| d.published()).collect(),
            parent: parent.map(|d| d.published()),
            token_ids: token_ids.clone(),
            block_size: *block_size,
            seed: HashSeed::default(),
        },
        CacheEvent::Removed { hashes } => {
            KvEvent::Removed { block_hashes: hashes.iter().map(|d| d.published()).collect() }
        }
        CacheEvent::Cleared => KvEvent::Cleared,
    }
}

impl Policy for Kvpick {
    fn route(&mut self, arrival: &Arrival<'_>, _: &FleetView<'_>) -> usize {
        let selection = reserve(&mut self.svc, arrival);
        self.picked.insert(arrival.id, (selection.worker, selection.predicted_ttft_ns, arrival.now_ns));
        selection.worker.0 as usize
    }

    fn on_events(&mut self, engine: usize, events: &[CacheEvent], _: u64) {
        for event in events {
            if let Err(e) = self.svc.apply_kv_event(WorkerId(engine as u64), &kv_event(event)) {
                self.event_errors += 1;
                self.first_error.get_or_insert_with(|| format!("engine {engine}: {e}"));
            }
        }
    }

    fn on_first_token(&mut self, id: usize, now_ns: u64) {
        if let Some((worker, Some(predicted), at)) = self.picked.get(&id).copied() {
            // Refused samples (zero TTFT) teach nothing; nothing to report.
            let _ = self.svc.observe_ttft(worker, predicted, now_ns - at, millis(now_ns));
        }
        // Unknown ids cannot happen (every routed request was reserved).
        let _ = self.svc.prefill_complete(ReservationId(id as u64), millis(now_ns));
    }

    fn on_finished(&mut self, id: usize, now_ns: u64) {
        self.picked.remove(&id);
        let _ = self.svc.free_reservation(ReservationId(id as u64), millis(now_ns));
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(first) = &self.first_error {
            notes.push(format!("kvpick refused {} KV events (first: {first})", self.event_errors));
        }
        let calibration = self.svc.calibration();
        let slowed: Vec<String> = calibration
            .snapshot()
            .iter()
            .filter(|c| c.speed_factor != 1.0)
            .map(|c| format!("engine {} ×{:.2}", c.worker.0, c.speed_factor))
            .collect();
        if let Some(fleet) = calibration.fleet_scale() {
            notes.push(format!(
                "kvpick calibration: fleet measured/predicted TTFT {fleet:.2}, {} clipped; speed factors: {}",
                calibration.clipped(),
                if slowed.is_empty() { "all 1".to_string() } else { slowed.join(", ") }
            ));
        }
        notes
    }
}
