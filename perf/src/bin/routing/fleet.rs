//! The discrete-event loop: a fleet of simulated engines (kvpick-sim's
//! `Scheduler`: its time model, prefix cache and KV events) fed a workload
//! through a routing policy, in virtual time, with no sockets and no clock.
//!
//! An engine step is computed when it starts, from the state at that
//! instant, but what it produced (KV events, first tokens, finished
//! requests) is delivered to the policy only when the step ends, as a real
//! engine publishes after its step. Requests arriving during a step wait
//! for the next one, exactly as in vLLM. At equal times, step ends are
//! delivered before arrivals, so a policy always knows everything that
//! had happened by the time it routes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use kvpick_perf::sim::scheduler::RequestId;
use kvpick_perf::sim::{CacheEvent, EngineConfig, EngineHasher, RequestSpec, Scheduler, StepReport, Update};

use super::workload::Request;

/// The fleet: `engines` copies of `engine`, each hashing blocks with a
/// seed of its own (as vLLM engines with random `NONE_HASH` do), so a
/// router can only learn their hashes from their events.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    pub engines: usize,
    pub engine: EngineConfig,
    /// The first this many engines run at half speed (every step cost
    /// doubled): a slower GPU or a noisy node that a router must notice.
    pub slow_engines: usize,
    /// How long an engine's KV events take to reach the router (ZMQ over
    /// the network and the router's ingest).
    pub event_delay_ns: u64,
    /// Disaggregated fleets: what moving a prompt's KV blocks from a
    /// prefill engine to a decode engine costs.
    pub transfer: Transfer,
}

/// The KV transfer of a split request, as a time cost: a fixed part (the
/// decode side's request to the prefill side and the connector's
/// handshake) and a part per block the decode engine does not hold (NIXL
/// pulls only those).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transfer {
    pub latency_ns: u64,
    pub ns_per_block: u64,
}

impl Transfer {
    pub fn ns(&self, blocks: usize) -> u64 {
        self.latency_ns + self.ns_per_block * blocks as u64
    }
}

impl FleetConfig {
    pub fn engine_config(&self, k: usize) -> EngineConfig {
        let mut time = self.engine.time;
        if k < self.slow_engines {
            time.step_overhead_ns *= 2;
            time.prefill_ns_per_token *= 2;
            time.decode_ns_per_seq *= 2;
        }
        EngineConfig {
            name: format!("engine-{k}"),
            time,
            seed: self.engine.seed.wrapping_add(k as u64 * 0x9e37_79b9),
            hash_seed: None,
            ..self.engine.clone()
        }
    }
}

/// A request about to be routed.
pub struct Arrival<'a> {
    /// Index of the request in the workload.
    pub id: usize,
    pub tokens: &'a [u32],
    pub output_tokens: u32,
    pub now_ns: u64,
}

/// Where a request goes: the engine that serves it (decodes it, when it
/// is split) and, for a split request, the engine that prefills it first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub engine: usize,
    pub prefill: Option<usize>,
}

/// A routing policy. Callbacks come in virtual-time order; every routed
/// request gets exactly one `on_finished` (also when the engine refused it).
pub trait Policy {
    /// Index of the engine that serves the request.
    fn route(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> usize;
    /// Where the request goes in a disaggregated fleet: by default whole
    /// to [`Policy::route`]'s engine.
    fn route_pd(&mut self, arrival: &Arrival<'_>, fleet: &FleetView<'_>) -> Route {
        Route { engine: self.route(arrival, fleet), prefill: None }
    }
    /// A split request's prefill engine finished its part (the KV transfer
    /// starts).
    fn on_prefill_done(&mut self, _id: usize, _now_ns: u64) {}
    /// An engine's KV events, at the end of the step that caused them.
    fn on_events(&mut self, _engine: usize, _events: &[CacheEvent], _now_ns: u64) {}
    /// The request's first token came out: its prefill is done.
    fn on_first_token(&mut self, _id: usize, _now_ns: u64) {}
    fn on_finished(&mut self, _id: usize, _now_ns: u64) {}
    /// Anything the report should say about this policy's run.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// A replica that joined mid-run, and the requests it picked.
    fn joined(&self) -> Option<Joined> {
        None
    }
}

/// A replica that joined mid-run (`replicas.rs`): when, and the requests
/// it picked, whose fate the ramp report follows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Joined {
    pub at_ns: u64,
    pub requests: Vec<usize>,
}

/// What an engine runs of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leg {
    Whole,
    /// The prefill of a split request, to be decoded on that engine.
    Prefill {
        decode: usize,
    },
    /// The decode of a split request, its prompt transferred.
    Decode,
}

struct EngineSlot {
    sched: Scheduler,
    hasher: EngineHasher,
    block_size: usize,
    /// The step in flight, delivered at its `ended_ns`.
    pending: Option<StepReport>,
    /// Engine-local id → workload index and leg, while the request runs.
    requests: HashMap<RequestId, (usize, Leg)>,
    /// Uncached prompt tokens and output tokens computed.
    computed_tokens: u64,
}

/// What a policy may inspect of the fleet. Only the oracle reads the
/// engines' true caches; the approximate-prefix policy reads what an
/// engine's metrics endpoint would show.
pub struct FleetView<'a> {
    slots: &'a [EngineSlot],
}

impl FleetView<'_> {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// vLLM's `num_requests_waiting`.
    pub fn waiting(&self, k: usize) -> usize {
        self.slots[k].sched.waiting()
    }

    /// vLLM's `kv_cache_usage_perc` (0 to 1).
    pub fn kv_usage(&self, k: usize) -> f64 {
        self.slots[k].sched.cache().usage()
    }

    /// KV blocks held by running requests (cached blocks nobody references
    /// are free to evict, so they do not count).
    pub fn blocks_in_use(&self, k: usize) -> u64 {
        let cache = self.slots[k].sched.cache();
        (cache.used() - cache.evictable()) as u64
    }

    pub fn block_size(&self) -> usize {
        self.slots.first().map_or(16, |s| s.block_size)
    }

    /// Leading prompt blocks engine `k` holds right now, capped as the
    /// engine caps hits (the last prompt token is always computed).
    pub fn cached_prefix_blocks(&self, k: usize, tokens: &[u32]) -> usize {
        let slot = &self.slots[k];
        let cap = tokens.len().saturating_sub(1) / slot.block_size;
        let mut parent = None;
        let mut held = 0;
        for block in tokens.chunks_exact(slot.block_size).take(cap) {
            let digest = slot.hasher.block(parent, block);
            if slot.sched.cache().match_len(std::slice::from_ref(&digest)) == 0 {
                break;
            }
            held += 1;
            parent = Some(digest);
        }
        held
    }
}

/// One request's fate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub engine: usize,
    /// A split request's prefill engine.
    pub prefill_engine: Option<usize>,
    pub arrival_ns: u64,
    pub first_token_ns: Option<u64>,
    pub finished_ns: Option<u64>,
    pub prompt_tokens: u32,
    /// Prompt tokens the engine served from its prefix cache.
    pub cached_tokens: u32,
    pub output_tokens: u32,
    /// The engine refused it (too long for its context or cache).
    pub rejected: bool,
}

/// Everything a run measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub records: Vec<Record>,
    pub engine_tokens: Vec<u64>,
    pub steps: u64,
    pub wall: Duration,
    pub notes: Vec<String>,
    pub joined: Option<Joined>,
}

/// Requests waiting to arrive: those with a fixed time from the start,
/// closed-loop ones once the request they follow has finished.
struct Arrivals {
    due: BinaryHeap<Reverse<(u64, usize)>>,
    /// Request index → the request that follows it, and the think time.
    next_of: HashMap<usize, (usize, u64)>,
}

impl Arrivals {
    fn new(requests: &[Request]) -> Self {
        let mut due = BinaryHeap::new();
        let mut next_of = HashMap::new();
        for (i, r) in requests.iter().enumerate() {
            match r.follows {
                Some((previous, think)) => {
                    next_of.insert(previous, (i, think));
                }
                None => due.push(Reverse((r.arrival_ns, i))),
            }
        }
        Arrivals { due, next_of }
    }

    fn peek(&self) -> Option<u64> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }

    /// Request `i` is done (finished or refused) at `now`.
    fn done(&mut self, i: usize, now: u64) {
        if let Some((next, think)) = self.next_of.remove(&i) {
            self.due.push(Reverse((now + think, next)));
        }
    }
}

/// KV event batches on their way to the router, in send order (one delay
/// for all, so also in arrival order).
struct InTransit {
    delay_ns: u64,
    batches: VecDeque<(u64, usize, Vec<CacheEvent>)>,
}

impl InTransit {
    /// Without a delay the batch reaches the policy at once.
    fn send(&mut self, policy: &mut dyn Policy, engine: usize, events: Vec<CacheEvent>, now: u64) {
        if self.delay_ns == 0 {
            policy.on_events(engine, &events, now);
        } else {
            self.batches.push_back((now + self.delay_ns, engine, events));
        }
    }

    fn due(&self) -> Option<u64> {
        self.batches.front().map(|(at, ..)| *at)
    }

    fn deliver_one(&mut self, policy: &mut dyn Policy, now: u64) {
        if let Some((_, engine, events)) = self.batches.pop_front() {
            policy.on_events(engine, &events, now);
        }
    }
}

/// Runs `requests` through `policy` on a fresh fleet, each arriving at its
/// time or, closed loop, after the request it follows.
pub fn run(requests: &[Request], fleet: &FleetConfig, policy: &mut dyn Policy) -> RunResult {
    let started = Instant::now();
    let mut slots: Vec<EngineSlot> = (0..fleet.engines)
        .map(|k| {
            let cfg = fleet.engine_config(k);
            EngineSlot {
                hasher: EngineHasher::new(cfg.effective_hash_seed()),
                block_size: cfg.block_size as usize,
                sched: Scheduler::new(&cfg),
                pending: None,
                requests: HashMap::new(),
                computed_tokens: 0,
            }
        })
        .collect();
    let mut records = vec![Record::default(); requests.len()];
    let mut arrivals = Arrivals::new(requests);
    let mut in_transit = InTransit { delay_ns: fleet.event_delay_ns, batches: VecDeque::new() };
    // Split requests whose KV blocks are on their way: (due, request, decode engine).
    let mut transfers: BinaryHeap<Reverse<(u64, usize, usize)>> = BinaryHeap::new();
    let mut steps = 0;
    loop {
        let step_end = slots.iter().enumerate().filter_map(|(k, s)| s.pending.as_ref().map(|r| (r.ended_ns, k))).min();
        let transfer = transfers.peek().map(|Reverse(t)| *t);
        // Events due by the next step end, transfer or arrival reach the policy first.
        let next = [step_end.map(|(t, _)| t), transfer.map(|t| t.0), arrivals.peek()].into_iter().flatten().min();
        if let Some(due) = in_transit.due().filter(|due| next.is_none_or(|n| *due <= n)) {
            in_transit.deliver_one(policy, due);
            continue;
        }
        // At equal times: step ends, then transfers, then arrivals.
        let Some(next) = next else { break };
        if let Some((end, k)) = step_end.filter(|(end, _)| *end == next) {
            let handed = deliver(&mut slots[k], k, &mut records, policy, &mut steps, &mut arrivals, &mut in_transit);
            for (g, decode) in handed {
                let tokens = requests[g].tokens.materialise();
                let view = FleetView { slots: &slots };
                let missing =
                    (tokens.len() / view.block_size()).saturating_sub(view.cached_prefix_blocks(decode, &tokens));
                transfers.push(Reverse((end + fleet.transfer.ns(missing), g, decode)));
            }
        } else if let Some((at, g, k)) = transfer.filter(|t| t.0 == next) {
            transfers.pop();
            if receive(&mut slots[k], g, at, &requests[g], &mut records[g], policy) {
                arrivals.done(g, at);
            }
        } else {
            let Some(Reverse((at, i))) = arrivals.due.pop() else { break };
            if arrive(&mut slots, i, at, &requests[i], &mut records[i], policy) {
                arrivals.done(i, at);
            }
        }
    }
    RunResult {
        records,
        engine_tokens: slots.iter().map(|s| s.computed_tokens).collect(),
        steps,
        wall: started.elapsed(),
        notes: policy.notes(),
        joined: policy.joined(),
    }
}

/// Routes and submits a request arriving at `now`; true when the engine
/// refused it (it is done at once).
fn arrive(
    slots: &mut [EngineSlot],
    id: usize,
    now: u64,
    request: &Request,
    record: &mut Record,
    policy: &mut dyn Policy,
) -> bool {
    let tokens = request.tokens.materialise();
    let arrival = Arrival { id, tokens: &tokens, output_tokens: request.output_tokens, now_ns: now };
    let route = policy.route_pd(&arrival, &FleetView { slots });
    *record = Record {
        engine: route.engine,
        prefill_engine: route.prefill,
        arrival_ns: now,
        prompt_tokens: tokens.len() as u32,
        output_tokens: request.output_tokens,
        ..Record::default()
    };
    // A split request's prefill engine computes the prompt and one token.
    let (k, leg, max_tokens) = match route.prefill {
        Some(p) => (p, Leg::Prefill { decode: route.engine }, 1),
        None => (route.engine, Leg::Whole, request.output_tokens),
    };
    submit(&mut slots[k], id, now, RequestSpec { prompt: tokens, max_tokens, seed: None }, leg, record, policy)
}

/// A split request's KV blocks reached its decode engine at `now`: it
/// decodes there; true when the engine refused it.
fn receive(
    slot: &mut EngineSlot,
    id: usize,
    now: u64,
    request: &Request,
    record: &mut Record,
    policy: &mut dyn Policy,
) -> bool {
    let spec = RequestSpec { prompt: request.tokens.materialise(), max_tokens: request.output_tokens, seed: None };
    submit(slot, id, now, spec, Leg::Decode, record, policy)
}

/// Hands `spec` to the engine at `now` (starting a step if it was idle);
/// true when it refused it, and the request is then done.
fn submit(
    slot: &mut EngineSlot,
    id: usize,
    now: u64,
    spec: RequestSpec,
    leg: Leg,
    record: &mut Record,
    policy: &mut dyn Policy,
) -> bool {
    let idle = slot.pending.is_none();
    if idle {
        slot.sched.advance_to(now);
    }
    let submitted = if leg == Leg::Decode { slot.sched.submit_prefilled(spec) } else { slot.sched.submit(spec) };
    let refused = match submitted {
        Ok(local) => {
            slot.requests.insert(local, (id, leg));
            false
        }
        Err(_) => {
            record.rejected = true;
            policy.on_finished(id, now);
            true
        }
    };
    if idle {
        slot.pending = slot.sched.step();
    }
    refused
}

/// Delivers engine `k`'s step in flight and starts its next; returns the
/// split requests whose prefill it finished, with their decode engines.
fn deliver(
    slot: &mut EngineSlot,
    k: usize,
    records: &mut [Record],
    policy: &mut dyn Policy,
    steps: &mut u64,
    arrivals: &mut Arrivals,
    in_transit: &mut InTransit,
) -> Vec<(usize, usize)> {
    let mut handed = Vec::new();
    let Some(mut report) = slot.pending.take() else { return handed };
    let now = report.ended_ns;
    *steps += 1;
    if !report.events.is_empty() {
        in_transit.send(policy, k, std::mem::take(&mut report.events), now);
    }
    for update in &report.updates {
        match update {
            Update::Token { id, .. } => {
                // A prefill engine's token is not the client's.
                let Some(&(g, Leg::Whole | Leg::Decode)) = slot.requests.get(id) else { continue };
                if records[g].first_token_ns.is_none() {
                    records[g].first_token_ns = Some(now);
                    policy.on_first_token(g, now);
                }
            }
            Update::Finished(outcome) => {
                let Some((g, leg)) = slot.requests.remove(&outcome.id) else { continue };
                slot.computed_tokens +=
                    u64::from(outcome.prompt_tokens - outcome.cached_tokens) + u64::from(outcome.completion_tokens);
                let record = &mut records[g];
                match leg {
                    Leg::Prefill { decode } => {
                        // The hit rate of a split request is its prefill engine's.
                        record.cached_tokens = outcome.cached_tokens;
                        policy.on_prefill_done(g, now);
                        handed.push((g, decode));
                        continue;
                    }
                    Leg::Whole => record.cached_tokens = outcome.cached_tokens,
                    Leg::Decode => {}
                }
                record.finished_ns = Some(outcome.finished_ns);
                policy.on_finished(g, now);
                arrivals.done(g, now);
            }
        }
    }
    slot.pending = slot.sched.step();
    handed
}
