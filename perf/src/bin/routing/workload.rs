//! The request streams the policies are compared on: synthetic sessions
//! (multi-turn chat, agentic tool loops, one-off random prompts) and
//! replayed traces, with arrival times calibrated to a fleet load.
//!
//! A *session* is a run of requests whose prompts extend one another (a
//! conversation, an agent's tool loop). Its requests are spaced by think
//! or tool times that do not depend on the load; only the rate at which
//! sessions start is calibrated, so a session looks the same at any load.

use std::sync::Arc;

use fastrand::Rng;

use kvpick_perf::sim::EngineConfig;

/// Token ids drawn from this range (any vocabulary works: only equality
/// of blocks matters to the caches).
const VOCAB: u32 = 100_000;

/// Longest prompt + completion a synthetic session grows to (below the
/// engines' `max_model_len`).
const MAX_CONTEXT: usize = 30_000;

/// Where a request's prompt tokens come from; materialised at arrival so
/// that 10,000 long prompts never sit in memory at once.
#[derive(Clone, Debug)]
pub enum Tokens {
    /// `head` (a system prompt, an agent's tool definitions: shared between
    /// sessions) followed by the first `len` tokens of `body` (the session's
    /// own turns, shared between its requests).
    Session { head: Arc<[u32]>, body: Arc<[u32]>, len: usize },
    /// `len` tokens no other request has.
    Unique { seed: u64, len: usize },
    /// A trace's blocks: block `i` is `block_tokens` tokens derived from
    /// `hash_ids[i]` alone (equal ids, equal tokens); the last block may be
    /// cut short, and tokens past the last id are unique to the request.
    Blocks { hash_ids: Arc<[u64]>, block_tokens: usize, len: usize, salt: u64 },
}

impl Tokens {
    pub fn len(&self) -> usize {
        match self {
            Tokens::Session { head, len, .. } => head.len() + len,
            Tokens::Unique { len, .. } | Tokens::Blocks { len, .. } => *len,
        }
    }

    pub fn materialise(&self) -> Vec<u32> {
        match self {
            Tokens::Session { head, body, len } => {
                let mut out = Vec::with_capacity(head.len() + len);
                out.extend_from_slice(head);
                out.extend_from_slice(&body[..*len]);
                out
            }
            Tokens::Unique { seed, len } => random_tokens(&mut Rng::with_seed(*seed), *len),
            Tokens::Blocks { hash_ids, block_tokens, len, salt } => {
                let mut out = Vec::with_capacity(*len);
                for id in hash_ids.iter() {
                    if out.len() >= *len {
                        break;
                    }
                    let take = (*len - out.len()).min(*block_tokens);
                    // Block content depends on the id only, so a shared id
                    // means a shared prefix, as the trace intends.
                    let mut rng = Rng::with_seed(id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x6d6f_6f6e);
                    out.extend((0..take).map(|_| rng.u32(..VOCAB)));
                }
                let mut rng = Rng::with_seed(*salt);
                while out.len() < *len {
                    out.push(rng.u32(..VOCAB));
                }
                out
            }
        }
    }
}

/// One request of a workload.
#[derive(Clone, Debug)]
pub struct Request {
    /// When it arrives (for a request that follows another, a closed-loop
    /// client's, when the run starts it: see `follows`).
    pub arrival_ns: u64,
    pub tokens: Tokens,
    /// Completion length (the simulated engine always reaches it).
    pub output_tokens: u32,
    /// The session it belongs to (a request of its own: its index).
    pub session: usize,
    /// Closed loop: it is sent this long after request `.0` finishes,
    /// not at `arrival_ns`.
    pub follows: Option<(usize, u64)>,
}

/// A workload ready to run: requests in arrival order.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    /// One line on how it was built, for the report.
    pub description: String,
    pub requests: Vec<Request>,
    /// Requests of the source left out because no engine could take them.
    pub skipped: usize,
}

/// The synthetic workload shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Agentic,
    Random,
    /// llm-d's prefix-cache benchmark: many customers' long shared
    /// prefixes, a ramp of offered load.
    SharedPrefix,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Chat => "chat",
            Shape::Agentic => "agentic",
            Shape::Random => "random",
            Shape::SharedPrefix => "shared-prefix",
        }
    }
}

/// What a request costs an engine, in virtual ns, with nothing cached:
/// the yardstick of the fleet load. Decode tokens carry their share of
/// the step overhead at the batch size the engine's KV cache sustains.
#[derive(Clone, Copy, Debug)]
pub struct WorkModel {
    prefill_ns_per_token: f64,
    ns_per_output_token: f64,
}

impl WorkModel {
    /// For engines like `engine`, serving requests of `mean_blocks` KV
    /// blocks (prompt + completion) on average.
    pub fn new(engine: &EngineConfig, mean_blocks: f64) -> Self {
        let t = &engine.time;
        let batch = (engine.num_blocks as f64 / mean_blocks.max(1.0)).clamp(1.0, engine.max_num_seqs as f64);
        WorkModel {
            prefill_ns_per_token: t.prefill_ns_per_token as f64,
            ns_per_output_token: t.decode_ns_per_seq as f64 + t.step_overhead_ns as f64 / batch,
        }
    }

    /// For engines like `engine`, serving requests like these.
    pub fn for_requests(engine: &EngineConfig, sizes: impl Iterator<Item = (usize, u32)>) -> Self {
        let bs = f64::from(engine.block_size.max(1));
        let (n, blocks) =
            sizes.fold((0usize, 0.0f64), |(n, b), (isl, osl)| (n + 1, b + (isl as f64 + f64::from(osl)) / bs));
        WorkModel::new(engine, blocks / n.max(1) as f64)
    }

    pub fn request_ns(&self, isl: usize, osl: u32) -> f64 {
        isl as f64 * self.prefill_ns_per_token + f64::from(osl) * self.ns_per_output_token
    }
}

/// Draws one session of a shape.
type SessionMaker = Box<dyn FnMut(&mut Rng) -> Session>;

/// A session before it is placed in time: requests at offsets from its start.
struct Session {
    requests: Vec<(u64, Tokens, u32)>,
}

/// Builds `requests` requests of `shape` for `engines` engines like
/// `engine`, arriving so that the fleet's load is `load` (see [`WorkModel`]).
pub fn synthetic(
    shape: Shape,
    requests: usize,
    engines: usize,
    engine: &EngineConfig,
    load: f64,
    seed: u64,
) -> Workload {
    let mut rng = Rng::with_seed(seed ^ shape as u64);
    let mut sessions = Vec::new();
    let mut total = 0;
    let (description, mut make): (String, SessionMaker) = match shape {
        Shape::Chat => {
            let systems = shared_heads(&mut rng, 16, 500, 4_000);
            (
                "multi-turn chat: 16 system prompts (500-4,000 tokens, Zipf), 2-10 turns, user 30-400 and \
                 answer 80-500 tokens per turn, 5 s + Exp(10 s) between turns"
                    .into(),
                Box::new(move |rng: &mut Rng| chat_session(rng, &systems)),
            )
        }
        Shape::Agentic => {
            let agents = shared_heads(&mut rng, 4, 4_000, 8_000);
            (
                "agentic tool loops: 4 agents' tool prompts (4,000-8,000 tokens, Zipf), a 200-1,000-token task, \
                 4-16 steps of a 30-200-token call and a 100-1,500-token tool result, 2 s + Exp(2 s) apart"
                    .into(),
                Box::new(move |rng: &mut Rng| agentic_session(rng, &agents)),
            )
        }
        Shape::SharedPrefix => {
            // 150 × 6,000 tokens: more than one engine's cache holds, less
            // than the fleet's, so where each customer lives matters.
            let customers: Vec<Arc<[u32]>> =
                (0..SHARED_PREFIX_CUSTOMERS).map(|_| random_tokens(&mut rng, SHARED_PREFIX_TOKENS).into()).collect();
            (
                "shared prefixes (llm-d's prefix-cache benchmark): 150 customers, each a 6,000-token prefix, \
                 a unique 1,200-token question, answers 100-500 tokens; offered load ramped linearly from 1/20 \
                 of its peak to its peak (llm-d's 3 → 60 QPS), averaging the load asked for"
                    .into(),
                Box::new(move |rng: &mut Rng| {
                    let head = customers[rng.usize(..customers.len())].clone();
                    let question: Arc<[u32]> = random_tokens(rng, SHARED_PREFIX_QUESTION).into();
                    let len = question.len();
                    Session { requests: vec![(0, Tokens::Session { head, body: question, len }, rng.u32(100..=500))] }
                }),
            )
        }
        Shape::Random => (
            "random, no sharing: prompts 200-4,000 tokens (log-uniform), completions 50-500, Poisson arrivals".into(),
            Box::new(|rng: &mut Rng| {
                let len = log_uniform(rng, 200, 4_000);
                Session { requests: vec![(0, Tokens::Unique { seed: rng.u64(..), len }, rng.u32(50..=500))] }
            }),
        ),
    };
    let ramp = shape == Shape::SharedPrefix;
    while total < requests {
        let session = make(&mut rng);
        total += session.requests.len();
        sessions.push(session);
    }
    let model = WorkModel::for_requests(
        engine,
        sessions.iter().flat_map(|s| s.requests.iter().map(|(_, t, osl)| (t.len(), *osl))),
    );
    let work: f64 =
        sessions.iter().flat_map(|s| s.requests.iter().map(|(_, t, osl)| model.request_ns(t.len(), *osl))).sum();
    // Sessions start as a Poisson process whose rate brings `load` × the
    // fleet's capacity of work.
    let session_rate_per_ns = load * engines as f64 / (work / sessions.len() as f64);
    let ramp = ramp.then(|| Ramp::new(session_rate_per_ns, sessions.len()));
    // Arrival times of a unit-rate Poisson process, mapped onto the rate.
    let mut unit = 0.0f64;
    let mut out = Vec::with_capacity(total);
    for (index, session) in sessions.into_iter().enumerate() {
        unit += exponential(&mut rng, 1.0);
        let start = match &ramp {
            Some(ramp) => ramp.time_of(unit),
            None => unit / session_rate_per_ns,
        };
        for (offset, tokens, output_tokens) in session.requests {
            out.push(Request {
                arrival_ns: start as u64 + offset,
                tokens,
                output_tokens,
                session: index,
                follows: None,
            });
        }
    }
    out.sort_by_key(|r| r.arrival_ns);
    out.truncate(requests);
    Workload { name: shape.name().into(), description, requests: out, skipped: 0 }
}

/// The same requests sent by `clients` closed-loop clients: each client
/// runs whole sessions one after another, and sends each request only
/// once its previous one has finished, after the think or tool time the
/// open-loop schedule had between the two (none between sessions). The
/// load is then whatever the clients and the fleet make it: a policy that
/// serves faster gets more done. Clients start 10 ms apart.
pub fn closed_loop(mut workload: Workload, clients: usize) -> Workload {
    let clients = clients.max(1);
    // Sessions in order of their first request.
    let mut order: Vec<usize> = Vec::new();
    let mut members: std::collections::HashMap<usize, Vec<usize>> = std::collections::HashMap::new();
    for (i, r) in workload.requests.iter().enumerate() {
        let list = members.entry(r.session).or_default();
        if list.is_empty() {
            order.push(r.session);
        }
        list.push(i);
    }
    let mut last: Vec<Option<usize>> = vec![None; clients];
    for (n, session) in order.iter().enumerate() {
        let client = n % clients;
        let mut previous_in_session: Option<usize> = None;
        for &i in &members[session] {
            let follows = match (previous_in_session, last[client]) {
                (Some(p), _) => {
                    let think = workload.requests[i].arrival_ns.saturating_sub(workload.requests[p].arrival_ns);
                    Some((p, think))
                }
                (None, Some(p)) => Some((p, 0)),
                (None, None) => None,
            };
            let request = &mut workload.requests[i];
            request.follows = follows;
            if follows.is_none() {
                request.arrival_ns = client as u64 * 10_000_000;
            }
            previous_in_session = Some(i);
            last[client] = Some(i);
        }
    }
    workload.description = format!("{}; closed loop: {clients} clients", workload.description);
    workload
}

const SHARED_PREFIX_CUSTOMERS: usize = 150;
const SHARED_PREFIX_TOKENS: usize = 6_000;
const SHARED_PREFIX_QUESTION: usize = 1_200;

/// A Poisson process whose rate rises linearly from `r0` to `r1 = 20 r0`
/// over the time `n` arrivals take at the mean rate.
struct Ramp {
    r0: f64,
    /// d(rate)/dt.
    slope: f64,
}

impl Ramp {
    fn new(mean_rate: f64, n: usize) -> Self {
        // Mean of r0 and 20 r0 is the mean rate.
        let r0 = 2.0 * mean_rate / 21.0;
        let span = n as f64 / mean_rate;
        Ramp { r0, slope: 19.0 * r0 / span }
    }

    /// The time at which the expected count of arrivals reaches `count`:
    /// solves `r0 t + slope t² / 2 = count`.
    fn time_of(&self, count: f64) -> f64 {
        let a = self.slope / 2.0;
        (-self.r0 + (self.r0 * self.r0 + 4.0 * a * count).sqrt()) / (2.0 * a)
    }
}

fn chat_session(rng: &mut Rng, systems: &Heads) -> Session {
    let head = systems.pick(rng);
    let turns = rng.usize(2..=10);
    let mut body = Vec::new();
    let mut plan = Vec::new();
    let mut at = 0u64;
    for _ in 0..turns {
        let user = rng.usize(30..=400);
        body.extend(random_tokens(rng, user));
        let answer = rng.u32(80..=500);
        if head.len() + body.len() + answer as usize > MAX_CONTEXT {
            break;
        }
        plan.push((at, body.len(), answer));
        // The answer joins the conversation; the engine never caches
        // generated tokens, so their values need not match its output.
        body.extend(random_tokens(rng, answer as usize));
        at += secs(5.0 + exponential(rng, 10.0));
    }
    session(head, body, plan)
}

fn agentic_session(rng: &mut Rng, agents: &Heads) -> Session {
    let head = agents.pick(rng);
    let steps = rng.usize(4..=16);
    let task = rng.usize(200..=1_000);
    let mut body = random_tokens(rng, task);
    let mut plan = Vec::new();
    let mut at = 0u64;
    for _ in 0..steps {
        let call = rng.u32(30..=200);
        if head.len() + body.len() + call as usize > MAX_CONTEXT {
            break;
        }
        plan.push((at, body.len(), call));
        body.extend(random_tokens(rng, call as usize));
        let result = rng.usize(100..=1_500);
        body.extend(random_tokens(rng, result));
        at += secs(2.0 + exponential(rng, 2.0));
    }
    session(head, body, plan)
}

fn session(head: Arc<[u32]>, body: Vec<u32>, plan: Vec<(u64, usize, u32)>) -> Session {
    let body: Arc<[u32]> = body.into();
    Session {
        requests: plan
            .into_iter()
            .map(|(at, len, osl)| (at, Tokens::Session { head: head.clone(), body: body.clone(), len }, osl))
            .collect(),
    }
}

/// Shared prompt heads, picked Zipf-like (weight 1/rank).
struct Heads {
    heads: Vec<Arc<[u32]>>,
    total_weight: f64,
}

impl Heads {
    fn pick(&self, rng: &mut Rng) -> Arc<[u32]> {
        let mut target = rng.f64() * self.total_weight;
        for (rank, head) in self.heads.iter().enumerate() {
            target -= 1.0 / (rank + 1) as f64;
            if target < 0.0 {
                return head.clone();
            }
        }
        self.heads[self.heads.len() - 1].clone()
    }
}

fn shared_heads(rng: &mut Rng, count: usize, min: usize, max: usize) -> Heads {
    let heads: Vec<Arc<[u32]>> = (0..count)
        .map(|_| {
            let len = log_uniform(rng, min, max);
            random_tokens(rng, len).into()
        })
        .collect();
    Heads { total_weight: (1..=count).map(|r| 1.0 / r as f64).sum(), heads }
}

pub fn random_tokens(rng: &mut Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.u32(..VOCAB)).collect()
}

fn log_uniform(rng: &mut Rng, min: usize, max: usize) -> usize {
    let (lo, hi) = ((min as f64).ln(), (max as f64).ln());
    ((lo + rng.f64() * (hi - lo)).exp() as usize).clamp(min, max)
}

/// An exponential sample of the given mean (any unit).
fn exponential(rng: &mut Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.f64()).ln()
}

fn secs(s: f64) -> u64 {
    (s * 1e9) as u64
}

/// Whether an engine like `engine` accepts the request (the simulated
/// engine's own check, so a skipped request would have been refused).
pub fn fits(engine: &EngineConfig, isl: usize, osl: u32) -> bool {
    kvpick_perf::sim::scheduler::check_request(engine, isl, osl).is_ok()
}
