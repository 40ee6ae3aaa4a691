//! Who picks the endpoint: kvpick's KV- and load-aware selection, or a null
//! picker (the first allowed endpoint) that runs the same server code minus
//! selection (and minus tokenizing, unless asked), as the benchmark's
//! baseline.
//!
//! An enum, not a trait object: two variants, static dispatch, no boxed
//! futures on the request path.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvpick_core::{
    BookingError, EndpointFilter, HashSeed, Prompt, ReservationId, SelectError, SelectRequest, WorkerId,
};
use kvpick_ext_proc::metrics::{ExtProcMetrics, Fallback, PdRoute, Phase, ROUTE_CLASSES, SessionPick};
use kvpick_ext_proc::trace::KeyValue;
use kvpick_ext_proc::{BodyInput, Pick, PickInput, Picks, RequestError, RequestTrace};
use kvpick_runtime::{Clock, PendingRings, RingScheduler, SelectTiming, ShardedService, ThreadProducers};

use crate::disagg::{DecodeOnly, DisaggConfig, Leg, PlanBooking};
use crate::prefix_watch::{PrefixWatch, Verdict};
use crate::reservation::{Release, Reservation, ReservationIds, TtftSample};
use crate::sessions::Sessions;
use crate::tokenizer::{Api, FallbackPolicy, Outage, TokenizeError, TokenizeRequest, Tokenizer};

/// What the tokenizer is asked for `body`, as `api`.
fn tokenize_request(body: &BodyInput, api: Api) -> TokenizeRequest {
    TokenizeRequest {
        api,
        body: body.bytes.clone(),
        model: body.parsed.model.clone(),
        prompt: body.parsed.prompt.clone(),
    }
}

/// A booking on the shards, freed through the [`KvPicker`] that made it.
pub type KvReservation = Reservation<KvPicker>;

/// A request's bookings: one reservation, or a split request's two.
pub type KvBooking = PlanBooking<KvPicker>;

/// A pick with kvpick's booking, if any.
pub type KvPick = Pick<KvBooking>;

#[derive(Clone)]
pub enum Picker {
    Kv(KvPicker),
    Null(NullPicker),
}

impl Picks for Picker {
    type Booking = KvBooking;

    async fn pick(&self, input: PickInput) -> Result<KvPick, RequestError> {
        match self {
            Picker::Kv(kv) => kv.pick(input).await,
            Picker::Null(null) => null.pick(&input).await,
        }
    }
}

/// The first allowed endpoint of a fixed list; books nothing.
#[derive(Clone)]
pub struct NullPicker {
    endpoints: Arc<[SocketAddr]>,
    /// Tokenizes each body and drops the tokens: a baseline that separates
    /// the tokenizer's cost from the selection's.
    tokenizer: Option<Arc<dyn Tokenizer>>,
}

impl NullPicker {
    pub fn new(endpoints: impl Into<Arc<[SocketAddr]>>) -> Self {
        NullPicker { endpoints: endpoints.into(), tokenizer: None }
    }

    /// The same picker, tokenizing every body it is given as kvpick would.
    pub fn tokenizing(self, tokenizer: Arc<dyn Tokenizer>) -> Self {
        NullPicker { tokenizer: Some(tokenizer), ..self }
    }

    async fn pick(&self, input: &PickInput) -> Result<KvPick, RequestError> {
        let tokenize = self.tokenizer.as_ref().zip(input.body.as_ref());
        if let Some((tokenizer, body, api)) = tokenize.and_then(|(t, b)| Some((t, b, b.parsed.api?))) {
            tokenizer.tokenize(tokenize_request(body, api)).await?;
        }
        let allowed = |e: &&SocketAddr| input.allowed.as_ref().is_none_or(|f| f.allows(e));
        let endpoint = self.endpoints.iter().find(allowed).ok_or(SelectError::NoEligibleWorkers)?;
        Ok(Pick { endpoint: *endpoint, fallbacks: Vec::new(), prefill: None, reservation: None })
    }
}

/// Rings a batch's shards from a task that first yields: tokio runs a
/// yielded task only after the tasks already ready (and a poll of the
/// driver), so every stream that became ready in this pass has pushed its
/// pick by then. Outside a runtime the ring happens at once (the handle is
/// dropped).
fn ring_after_ready_tasks() -> RingScheduler {
    Arc::new(|pending: PendingRings| {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::task::yield_now().await;
                pending.ring();
            });
        }
    })
}

/// How [`KvPicker`] picks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickerConfig {
    /// The pool's base model: any other `model` in a body is a LoRA adapter
    /// and hashes with its own seed, as the engine does. `None`: no request
    /// is treated as a LoRA.
    pub base_model: Option<String>,
    /// What to do when tokenizing fails or is not supported.
    pub fallback: FallbackPolicy,
    /// Picks made in one pass of the I/O thread wake the shard once, after
    /// that pass, rather than once each (`kvpick_runtime::RingScheduler`).
    /// Off only to measure what it saves.
    pub ring_per_batch: bool,
    /// Sessions whose last worker is remembered for session affinity
    /// (0: no affinity).
    pub sessions: usize,
}

impl Default for PickerConfig {
    fn default() -> Self {
        PickerConfig {
            base_model: None,
            fallback: FallbackPolicy::default(),
            ring_per_batch: true,
            sessions: DEFAULT_SESSIONS,
        }
    }
}

/// Sessions remembered by default: at a few hundred bytes of table each,
/// a hundred thousand conversations cost a few MB.
pub const DEFAULT_SESSIONS: usize = 100_000;

/// A pick explained: the prompt's size, every candidate with its cost
/// (in the cost model's unit: ns for the latency cost, blocks for
/// Dynamo's), and what would be chosen.
#[derive(Debug)]
pub struct Explained {
    pub isl_tokens: u32,
    /// False when the prompt's length is a guess (it was not tokenized).
    pub tokens_known: bool,
    /// The session's last worker, when the request named a session.
    pub sticky: Option<WorkerId>,
    pub candidates: Vec<(kvpick_core::Candidate, f64)>,
    pub selection: kvpick_core::Selection,
}

/// kvpick's pick: tokenize (or fall back to load only), hash once, select
/// and book on the shards.
#[derive(Clone)]
pub struct KvPicker(Arc<KvInner>);

struct KvInner {
    producers: ThreadProducers,
    clock: Clock,
    tokenizer: Arc<dyn Tokenizer>,
    /// Logs the tokenizer's outages, once each way.
    tokenizer_outage: Outage,
    fallback: FallbackPolicy,
    base_model: Option<String>,
    ids: ReservationIds,
    metrics: Arc<ExtProcMetrics>,
    /// `None`: affinity off.
    sessions: Option<Mutex<Sessions>>,
    prefix_watch: Mutex<PrefixWatch>,
    /// Held while a booking is taken and booked anew (a move to the
    /// served worker, a restored prefill): two at once on one booking
    /// would each release the other's claim and free it. Both are rare
    /// (a gateway's fallback, a sidecar's), so one lock for all is enough;
    /// in either order they end the same way (moved, in prefill).
    rebooks: tokio::sync::Mutex<()>,
    /// Disaggregated serving: the prefill workers' own picker (its own
    /// selection service), when to use it, and the decode workers that
    /// must use it. `None`: every request is served whole by this
    /// picker's workers.
    prefill: Option<(KvPicker, DisaggConfig, Arc<DecodeOnly>)>,
}

impl KvPicker {
    /// `metrics` should be the server's, so fallbacks and frees show up
    /// next to the statuses.
    pub fn new(
        service: Arc<ShardedService>,
        clock: Clock,
        tokenizer: Arc<dyn Tokenizer>,
        config: &PickerConfig,
        metrics: Arc<ExtProcMetrics>,
    ) -> Self {
        Self::build(service, clock, tokenizer, config, metrics, None)
    }

    /// A picker for a fleet split by role: `decode` holds the decode (and
    /// aggregated) workers, `prefill` the prefill workers; each request is
    /// booked on one or, when `disagg`'s decider says so, both.
    /// `decode_only`: the decode workers that cannot run a request whole
    /// (kept up to date by the caller as workers come and go).
    pub fn disaggregated(
        (decode, prefill): (Arc<ShardedService>, Arc<ShardedService>),
        clock: Clock,
        tokenizer: Arc<dyn Tokenizer>,
        (config, disagg, decode_only): (&PickerConfig, DisaggConfig, Arc<DecodeOnly>),
        metrics: Arc<ExtProcMetrics>,
    ) -> Self {
        // Sessions and the prefix watch are the decode side's: a session
        // returns to where it decoded, and a prefill worker's cache is
        // judged by the plans' hand-offs, not by first blocks.
        let prefill_config = PickerConfig { sessions: 0, ..config.clone() };
        let prefill_picker =
            Self::build(prefill, clock.clone(), tokenizer.clone(), &prefill_config, metrics.clone(), None);
        Self::build(decode, clock, tokenizer, config, metrics, Some((prefill_picker, disagg, decode_only)))
    }

    fn build(
        service: Arc<ShardedService>,
        clock: Clock,
        tokenizer: Arc<dyn Tokenizer>,
        config: &PickerConfig,
        metrics: Arc<ExtProcMetrics>,
        prefill: Option<(KvPicker, DisaggConfig, Arc<DecodeOnly>)>,
    ) -> Self {
        let producers = ThreadProducers::new(service);
        let producers =
            if config.ring_per_batch { producers.with_ring_scheduler(ring_after_ready_tasks()) } else { producers };
        KvPicker(Arc::new(KvInner {
            producers,
            clock,
            tokenizer,
            tokenizer_outage: Outage::default(),
            fallback: config.fallback,
            base_model: config.base_model.clone(),
            ids: ReservationIds::new(),
            metrics,
            sessions: (config.sessions > 0).then(|| Mutex::new(Sessions::new(config.sessions))),
            prefix_watch: Mutex::default(),
            rebooks: tokio::sync::Mutex::const_new(()),
            prefill,
        }))
    }

    fn service(&self) -> &ShardedService {
        self.0.producers.service()
    }

    /// The prompt (tokenized and hashed, or load-only), the model the
    /// workers must serve, and the queue priority.
    async fn prepare(&self, input: &PickInput) -> Result<(Prompt, Option<String>, i32), RequestError> {
        let inner = &*self.0;
        Ok(match &input.body {
            None => {
                inner.metrics.record_header_only();
                (Prompt::load_only(0), None, 0)
            }
            Some(body) => {
                let lora = self.lora_of(&body.parsed.model);
                let prompt = self.prompt(body, lora, &input.trace).await?;
                // The workers serve the base model; an adapter is loaded on demand.
                let model = if lora.is_some() { inner.base_model.clone() } else { Some(body.parsed.model.clone()) };
                (prompt, model, body.parsed.priority)
            }
        })
    }

    /// What `pick` would do with `input`, booking nothing and remembering
    /// no session: the debug view's answer to "why that worker?".
    pub async fn explain(&self, input: PickInput) -> Result<Explained, RequestError> {
        let (prompt, model, priority) = self.prepare(&input).await?;
        let tokens_known = prompt.tokens_known;
        let isl_tokens = prompt.isl_tokens;
        let (_, sticky) = self.session_of(input.session.as_deref());
        // As `pick` does: avoiding decode-only workers when the request
        // cannot be split.
        let allowed = self.avoid_if_whole(input.allowed, isl_tokens, self.no_prefill_worker());
        let request = SelectRequest { id: ReservationId(0), prompt, model, allowed, priority, sticky };
        let explained = self.service().explain(&self.0.producers, &request).await;
        let (candidates, costs, selection) = explained.map_err(RequestError::from)?;
        Ok(Explained {
            isl_tokens,
            tokens_known,
            sticky,
            candidates: candidates.into_iter().zip(costs).collect(),
            selection,
        })
    }

    pub async fn pick(&self, input: PickInput) -> Result<KvPick, RequestError> {
        let inner = &*self.0;
        let (prompt, model, priority) = self.prepare(&input).await?;
        // The plan's id: the reservation's in each role's service.
        let id = inner.ids.next_id();
        // Why the prefill leg is not even tried, if it is not. With decode
        // workers that cannot run a request whole, it is tried for every
        // prompt: the decode pick is not known yet.
        let skip = inner.prefill.as_ref().map(|(_, config, decode_only)| {
            if self.no_prefill_worker() {
                Some(PdRoute::NoPrefillWorker)
            } else if !(config.may_split(prompt.isl_tokens) || decode_only.any() && prompt.isl_tokens > 0) {
                Some(PdRoute::ShortUncached)
            } else {
                None
            }
        });
        let prefill = inner.prefill.as_ref().filter(|_| matches!(skip, Some(None)));
        let Some((prefill, config, decode_only)) = prefill else {
            // A request with no prompt (headers only) is not a P/D decision.
            let has_prompt = prompt.isl_tokens > 0;
            if let Some(Some(why)) = skip.filter(|_| has_prompt) {
                inner.metrics.record_pd_route(why);
            }
            // It runs whole (with decode-only workers and a prompt, no split
            // is tried only for want of a prefill worker), and a decode-only
            // worker would refuse it: it is picked only if no other worker
            // is eligible, to be refused with a precise 503.
            // The decision taken above, not a fresh count: a prefill worker
            // arriving meanwhile must not let a decode-only one be picked.
            let no_prefill_worker = matches!(skip, Some(Some(PdRoute::NoPrefillWorker)));
            let mut input = input;
            input.allowed = self.avoid_if_whole(input.allowed.take(), prompt.isl_tokens, no_prefill_worker);
            let leg = self.decode_leg(id, (prompt, model, priority), input, false).await;
            let (selection, reservation, _) = leg?;
            if has_prompt && inner.prefill.as_ref().is_some_and(|(_, _, only)| only.contains(selection.worker)) {
                // Freed as `reservation` drops.
                return Err(self.no_prefill_for(id, &selection));
            }
            return Ok(Pick {
                endpoint: selection.endpoint,
                fallbacks: selection.fallbacks,
                prefill: None,
                reservation: Some(PlanBooking::aggregated(reservation)),
            });
        };
        // Both legs at once; a failed decode leg cancels the prefill leg
        // (dropping it withdraws or frees what it booked), a failed prefill
        // leg leaves the request whole to the decode worker.
        let trace = input.trace.clone();
        let start = Instant::now();
        let prefill_leg = prefill.prefill_leg(id, prompt.clone(), model.clone(), priority, false);
        let prefill_leg = async move { (prefill_leg.await, Instant::now()) };
        let decode_leg = self.decode_leg(id, (prompt.clone(), model.clone(), priority), input, true);
        tokio::pin!(prefill_leg, decode_leg);
        let (decoded, (mut prefilled, mut prefilled_at)) = tokio::select! {
            decoded = &mut decode_leg => (decoded?, prefill_leg.await),
            prefilled = &mut prefill_leg => (decode_leg.await?, prefilled),
        };
        let (selection, mut reservation, queued) = decoded;
        let must_split = decode_only.contains(selection.worker);
        if must_split {
            // Its worker will not prefill it, whatever comes next (a wait
            // for a prefill worker, or a refusal): no prefill load there.
            reservation.prefill_elsewhere();
        }
        if queued || (must_split && matches!(prefilled, Err((PdRoute::PrefillSaturated, _)))) {
            // The decode leg waited in its queue: a prefill booking made
            // before is stale (and held capacity meanwhile). Book anew.
            // A decode-only worker's request waits for a prefill worker
            // rather than be refused by its engine.
            drop(prefilled);
            prefilled = prefill.prefill_leg(id, prompt, model, priority, must_split).await;
            prefilled_at = Instant::now();
        }
        let route = if must_split {
            match &prefilled {
                Ok(_) => PdRoute::Disaggregated,
                Err((why, error)) => {
                    inner.metrics.record_pd_route(*why);
                    // The prefill side's queue refused it, as the decode
                    // side's would (429); otherwise there is no prefill
                    // worker for it.
                    return Err(match error {
                        Some(
                            error @ (SelectError::QueueFull
                            | SelectError::QueueTimeout
                            | SelectError::Overloaded
                            | SelectError::ShuttingDown),
                        ) => RequestError::Select(error.clone()),
                        _ => self.no_prefill_for(id, &selection),
                    });
                }
            }
        } else {
            config.decide(Leg::of(&selection), prefilled.as_ref().map(|(p, _)| Leg::of(p)).map_err(|(why, _)| *why))
        };
        inner.metrics.record_pd_route(route);
        trace.phase("select prefill", start, prefilled_at, || {
            let (label, reason) = ROUTE_CLASSES[route as usize];
            let mut attributes = vec![KeyValue::new("kvpick.pd_route", label)];
            if !reason.is_empty() {
                attributes.push(KeyValue::new("kvpick.pd_reason", reason));
            }
            if let Ok((prefill, _)) = &prefilled {
                attributes.push(KeyValue::new("kvpick.prefill_endpoint", prefill.endpoint.to_string()));
                attributes.push(KeyValue::new("kvpick.prefill_tokens", i64::from(prefill.prefill_tokens)));
            }
            attributes
        });
        let (prefill, booking) = match (route, prefilled) {
            (PdRoute::Disaggregated, Ok((prefill_selection, prefill_reservation))) => {
                tracing::debug!(
                    plan = id.0,
                    decode = %selection.endpoint,
                    prefill = %prefill_selection.endpoint,
                    uncached_on_decode = selection.prefill_tokens,
                    "disaggregated"
                );
                (Some(prefill_selection.endpoint), PlanBooking::disaggregated(reservation, prefill_reservation))
            }
            // The prefill leg, if booked, is freed as it drops here.
            _ => (None, PlanBooking::aggregated(reservation)),
        };
        Ok(Pick { endpoint: selection.endpoint, fallbacks: selection.fallbacks, prefill, reservation: Some(booking) })
    }

    /// `allowed`, avoiding the decode-only workers for a request with a
    /// prompt that runs whole for want of a prefill worker: they would
    /// refuse it (with decode-only workers, every prompt is otherwise
    /// tried for a split).
    fn avoid_if_whole(
        &self,
        allowed: Option<EndpointFilter>,
        isl_tokens: u32,
        no_prefill_worker: bool,
    ) -> Option<EndpointFilter> {
        match &self.0.prefill {
            Some((_, _, only)) if no_prefill_worker && isl_tokens > 0 && only.any() => Some(only.avoid_in(allowed)),
            _ => allowed,
        }
    }

    /// A split fleet with no schedulable prefill worker.
    fn no_prefill_worker(&self) -> bool {
        self.0.prefill.as_ref().is_some_and(|(prefill, _, _)| prefill.service().schedulable_count() == 0)
    }

    /// A request picked onto a decode worker that cannot run it whole,
    /// with no prefill worker to take its prefill: refused (503) rather
    /// than sent to an engine that would refuse it.
    fn no_prefill_for(&self, id: ReservationId, selection: &kvpick_core::Selection) -> RequestError {
        tracing::warn!(
            plan = id.0,
            decode = %selection.endpoint,
            "no prefill worker for a request picked onto a decode-only worker (SGLang decode mode runs nothing whole)"
        );
        RequestError::NoPrefillWorker { decode: selection.endpoint }
    }

    /// The prefill leg of plan `id` on this (the prefill) picker's
    /// service: booked at once or not at all, unless `wait`. Every prefill
    /// worker past the queue threshold is a reason to prefill on the
    /// decode worker, not to wait: nothing is queued, except for a decode
    /// worker that cannot prefill (`wait`), where the request waits in
    /// the prefill side's queue as a whole request would in the decode
    /// side's.
    async fn prefill_leg(
        &self,
        id: ReservationId,
        prompt: Prompt,
        model: Option<String>,
        priority: i32,
        wait: bool,
    ) -> Result<(kvpick_core::Selection, KvReservation), (PdRoute, Option<SelectError>)> {
        let inner = &*self.0;
        let mut reservation = Reservation::new(id, self.clone(), self.service().lease());
        // The gateway's subset names where it may send the request (the
        // decode side); the prefill worker is reached by the decode side.
        let request = SelectRequest { id, prompt, model, allowed: None, priority, sticky: None };
        let (service, now) = (self.service(), inner.clock.now());
        let admitted = if wait {
            service.select_and_wait(&inner.producers, request, now).await.map(Some)
        } else {
            service.reserve_unless_saturated(&inner.producers, request, now).await
        };
        match admitted {
            Ok(Some(selection)) => {
                reservation.booked(&selection);
                Ok((selection, reservation))
            }
            Ok(None) => {
                reservation.disarm();
                Err((PdRoute::PrefillSaturated, None))
            }
            Err(error) => {
                reservation.disarm();
                tracing::debug!(plan = id.0, role = "prefill", %error, "no prefill leg");
                let route = match error {
                    SelectError::NoWorkers | SelectError::UnknownModel(_) | SelectError::NoEligibleWorkers => {
                        PdRoute::NoPrefillWorker
                    }
                    // Waited, and the queue refused it.
                    SelectError::QueueFull | SelectError::QueueTimeout | SelectError::Overloaded => {
                        PdRoute::PrefillSaturated
                    }
                    _ => PdRoute::PrefillFailed,
                };
                Err((route, Some(error)))
            }
        }
    }

    /// The decode (or whole-request) leg: select and book, waiting in the
    /// queue if every worker is saturated; sessions and the prefix watch
    /// learn from it. Also says whether it waited in the queue (known
    /// when traced or `timed`).
    async fn decode_leg(
        &self,
        id: ReservationId,
        (prompt, model, priority): (Prompt, Option<String>, i32),
        input: PickInput,
        timed: bool,
    ) -> Result<(kvpick_core::Selection, KvReservation, bool), RequestError> {
        let inner = &*self.0;
        let mut reservation = Reservation::new(id, self.clone(), self.service().lease());
        let (session, sticky) = self.session_of(input.session.as_deref());
        let (isl_tokens, tokens_known) = (prompt.isl_tokens, prompt.tokens_known);
        let first_block = prompt.seq_hashes.first().copied();
        let request = SelectRequest { id, prompt, model, allowed: input.allowed, priority, sticky };
        let start = Instant::now();
        let mut timing = (timed || input.trace.is_on()).then(SelectTiming::default);
        let now = inner.clock.now();
        let result = self.service().select_and_wait_timed(&inner.producers, request, now, timing.as_mut()).await;
        let end = Instant::now();
        inner.metrics.record_select(end - start);
        if let Some(timing) = timing.as_ref().filter(|_| input.trace.is_on()) {
            trace_select(&input.trace, start, end, timing, &result, (isl_tokens, tokens_known), sticky);
        }
        let queued = timing.is_some_and(|t| t.queued.is_some());
        match result {
            Ok(selection) => {
                if selection.isl_tokens > 0 {
                    // What the worker holds of the prompt: everything not booked as prefill.
                    let overlap = u64::from(selection.isl_tokens - selection.prefill_tokens);
                    inner.metrics.record_overlap(u64::from(selection.isl_tokens), overlap);
                }
                reservation.booked(&selection);
                if let Some(first) = first_block {
                    self.watch_prefix(&selection, first);
                }
                if let Some(key) = session {
                    inner.metrics.record_session_pick(match sticky {
                        None => SessionPick::New,
                        Some(worker) if worker == selection.worker => SessionPick::Kept,
                        Some(_) => SessionPick::Moved,
                    });
                    if let Some(mut sessions) = self.sessions() {
                        sessions.insert(key, selection.worker);
                    }
                }
                Ok((selection, reservation, queued))
            }
            Err(error) => {
                reservation.disarm();
                Err(error.into())
            }
        }
    }

    /// A worker left the pool: its prefix-watch history goes with it (a
    /// suspected worker stops counting in `kvpick_prefix_mismatch_workers`).
    pub fn forget_worker(&self, worker: WorkerId) {
        let inner = &*self.0;
        let mut watch = inner.prefix_watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        watch.remove(worker);
        inner.metrics.record_prefix_suspects(watch.suspected(), false);
    }

    /// Feeds the prefix watch; says so when a worker's verdict changes.
    fn watch_prefix(&self, selection: &kvpick_core::Selection, first: kvpick_core::SequenceHash) {
        let inner = &*self.0;
        let mut watch = inner.prefix_watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(verdict) = watch.observe(selection.worker, first, selection.overlap_blocks) else {
            return;
        };
        inner.metrics.record_prefix_suspects(watch.suspected(), matches!(verdict, Verdict::Suspected { .. }));
        drop(watch);
        match verdict {
            Verdict::Suspected { repeats } => tracing::warn!(
                worker = %selection.endpoint,
                repeats,
                "prompts this worker served came back {repeats} times and its KV cache, as kvpick indexes it, held none of their first blocks: kvpick's tokens or hashes differ from the engine's (chat template, tokenizer, model, LoRA or cache_salt), or the worker's KV events do not reach kvpick; KV-aware routing is blind for it (it is still routed by load)"
            ),
            Verdict::Cleared => {
                tracing::info!(worker = %selection.endpoint, "a prompt this worker served before found its first block there again: its cache matches")
            }
        }
    }

    /// The request's session key, when affinity is on, and the worker that
    /// served the session last.
    fn session_of<'a>(&self, key: Option<&'a str>) -> (Option<&'a str>, Option<WorkerId>) {
        let session = key.filter(|_| self.0.sessions.is_some());
        (session, session.and_then(|key| self.sessions().and_then(|mut s| s.get(key))))
    }

    /// The session table, when affinity is on (a poisoned lock is taken
    /// over: the table holds no invariant a panic could break).
    fn sessions(&self) -> Option<std::sync::MutexGuard<'_, Sessions>> {
        self.0.sessions.as_ref().map(|m| m.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// The adapter name when `model` is not the pool's base model.
    fn lora_of<'a>(&self, model: &'a str) -> Option<&'a str> {
        self.0.base_model.as_deref().filter(|base| *base != model).map(|_| model)
    }

    async fn prompt(&self, body: &BodyInput, lora: Option<&str>, trace: &RequestTrace) -> Result<Prompt, RequestError> {
        let inner = &*self.0;
        // About four bytes of JSON per token: what load-only routing books.
        let estimate = u32::try_from(body.bytes.len() / 4).unwrap_or(u32::MAX);
        let Some(api) = body.parsed.api else {
            inner.metrics.record_fallback(Fallback::UnknownApi);
            return Ok(Prompt::load_only(estimate));
        };
        let request = tokenize_request(body, api);
        let start = Instant::now();
        let result = inner.tokenizer.tokenize(request).await;
        let tokenized = Instant::now();
        trace.phase("tokenize", start, tokenized, || match &result {
            Ok(tokens) => vec![KeyValue::new("kvpick.tokens", i64::try_from(tokens.len()).unwrap_or(i64::MAX))],
            Err(error) => vec![KeyValue::new("error.type", error.to_string())],
        });
        match result {
            Ok(tokens) => {
                inner.tokenizer_outage.answered();
                inner.metrics.record_tokenize(tokenized - start);
                let seed = HashSeed::new(lora, body.parsed.cache_salt.as_deref());
                let prompt = self.service().policy().prompt(&tokens, seed);
                let hashed = Instant::now();
                inner.metrics.record_phase(Phase::Hash, hashed - tokenized);
                trace.phase("hash", tokenized, hashed, || {
                    vec![KeyValue::new("kvpick.blocks", i64::try_from(prompt.seq_hashes.len()).unwrap_or(i64::MAX))]
                });
                Ok(prompt)
            }
            Err(error) => {
                let unsupported = matches!(error, TokenizeError::Unsupported(_));
                inner.tokenizer_outage.failed(&error, inner.fallback == FallbackPolicy::LoadOnly);
                if !unsupported {
                    inner.metrics.record_tokenize(tokenized - start);
                }
                if unsupported || inner.fallback == FallbackPolicy::LoadOnly {
                    tracing::debug!(%error, "routing by load alone");
                    trace.set(|| vec![KeyValue::new("kvpick.load_only", true)]);
                    inner.metrics.record_fallback(Fallback::from(&error));
                    Ok(Prompt::load_only(estimate))
                } else {
                    Err(error.into())
                }
            }
        }
    }

    /// Capacity was released: requests queued for it are admitted on a
    /// task of their own, so the stream that released it never waits for
    /// them. Without a tokio runtime here, the next release does it.
    fn admit_queued(&self) {
        if !self.service().has_waiting() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("no tokio runtime here; queued requests are admitted at the next release");
            return;
        };
        let picker = self.clone();
        runtime.spawn(async move {
            let inner = &*picker.0;
            picker.service().admit_waiting(&inner.producers, inner.clock.now()).await;
        });
    }
}

impl Release for KvPicker {
    /// Posted to the owning shard, not awaited (see `ShardedService`).
    fn prefill_complete(&self, id: ReservationId, ttft: Option<TtftSample>) {
        let inner = &*self.0;
        if let Some(sample) = ttft {
            let measured_ns = u64::try_from(sample.measured.as_nanos()).unwrap_or(u64::MAX);
            let now = inner.clock.now();
            if let Err(error) =
                self.service().observe_ttft(&inner.producers, sample.worker, sample.predicted_ns, measured_ns, now)
            {
                tracing::debug!(reservation = id.0, %error, "TTFT sample not used for calibration");
            }
        }
        match self.service().post_prefill_complete(&inner.producers, id) {
            Ok(()) => {
                inner.metrics.record_prefill_complete();
                self.admit_queued();
            }
            Err(error) => tracing::debug!(reservation = id.0, %error, "prefill_complete on a booking already gone"),
        }
    }

    fn decode_observed(&self, worker: WorkerId, output_tokens: u64, decode: Duration) {
        let decode_ns = u64::try_from(decode.as_nanos()).unwrap_or(u64::MAX);
        self.service().observe_decode(worker, output_tokens, decode_ns, self.0.clock.now());
    }

    /// On a task of its own: the stream's response goes on meanwhile.
    fn moved(&self, id: ReservationId, to: SocketAddr) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.0.metrics.record_booking_moved(false);
            tracing::warn!(reservation = id.0, %to, "no tokio runtime here: the booking stays on the picked worker");
            return;
        };
        let picker = self.clone();
        runtime.spawn(async move {
            let inner = &*picker.0;
            let _turn = inner.rebooks.lock().await;
            match picker.service().move_booking(&inner.producers, id, to).await {
                Ok(moved) => {
                    inner.metrics.record_booking_moved(true);
                    tracing::debug!(reservation = id.0, %to, ?moved, "booking moved to the served worker");
                    picker.admit_queued();
                }
                Err(error) => {
                    inner.metrics.record_booking_moved(false);
                    tracing::info!(reservation = id.0, %to, %error, "gateway served an endpoint kvpick could not move the booking to");
                }
            }
        });
    }

    /// On a task of its own, as a move is (it takes the booking and books
    /// it again).
    fn prefill_restored(&self, id: ReservationId) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.0.metrics.record_prefill_restored(false);
            tracing::warn!(reservation = id.0, "no tokio runtime here: the decode worker's prefill stays uncounted");
            return;
        };
        let picker = self.clone();
        runtime.spawn(async move {
            let inner = &*picker.0;
            let _turn = inner.rebooks.lock().await;
            match picker.service().restore_prefill(&inner.producers, id).await {
                Ok(()) => {
                    inner.metrics.record_prefill_restored(true);
                    tracing::debug!(
                        reservation = id.0,
                        "decode worker runs the split request whole: prefill booked again"
                    );
                }
                Err(error) => {
                    inner.metrics.record_prefill_restored(false);
                    tracing::debug!(reservation = id.0, %error, "prefill not booked again: the booking is gone");
                }
            }
        });
    }

    /// Posted to the owning shard, not awaited.
    fn renew(&self, id: ReservationId) {
        let inner = &*self.0;
        match self.service().post_renew(&inner.producers, id, inner.clock.now()) {
            Ok(()) => inner.metrics.record_lease_renewed(),
            Err(error) => tracing::debug!(reservation = id.0, %error, "lease renewal found no booking"),
        }
    }

    /// Posted to the owning shard, not awaited (see `ShardedService`).
    fn free(&self, id: ReservationId) {
        let inner = &*self.0;
        match self.service().post_free(&inner.producers, id) {
            Ok(()) => {
                inner.metrics.record_free(true);
                self.admit_queued();
            }
            Err(BookingError::NotFound(_)) => inner.metrics.record_free(false),
            Err(error) => {
                inner.metrics.record_free(false);
                tracing::warn!(reservation = id.0, %error, "could not free a booking; its lease will");
            }
        }
    }
}

/// The select span of a traced pick: what was chosen and why it cost
/// what it did, with each shard's answer, the queue wait and the booking
/// under it.
fn trace_select(
    trace: &RequestTrace,
    start: Instant,
    end: Instant,
    timing: &SelectTiming,
    result: &Result<kvpick_core::Selection, SelectError>,
    (isl_tokens, tokens_known): (u32, bool),
    sticky: Option<WorkerId>,
) {
    let span = trace.child("select", start);
    let mut from = start;
    for answer in &timing.shards {
        span.phase("shard", from.min(answer.at), answer.at, || {
            let mut attributes = vec![KeyValue::new("kvpick.shard", i64::try_from(answer.shard).unwrap_or(i64::MAX))];
            if let Some(n) = answer.candidates {
                attributes.push(KeyValue::new("kvpick.candidates", i64::try_from(n).unwrap_or(i64::MAX)));
            }
            attributes
        });
        from = answer.at;
    }
    if let (Some(decided), Some(booked)) = (timing.decided, timing.booked) {
        span.phase("book", decided, booked, Vec::new);
    }
    if let Some((queued, left)) = timing.queued {
        span.phase("queue wait", queued, left, Vec::new);
    }
    span.set(|| {
        let mut attributes = vec![
            KeyValue::new("kvpick.isl_tokens", i64::from(isl_tokens)),
            KeyValue::new("kvpick.tokens_known", tokens_known),
            KeyValue::new("kvpick.queued", timing.queued.is_some()),
        ];
        if let Some(worker) = sticky {
            attributes.push(KeyValue::new("kvpick.session_worker", i64::try_from(worker.0).unwrap_or(i64::MAX)));
        }
        if let Ok(selection) = result {
            attributes.extend([
                KeyValue::new("kvpick.worker", i64::try_from(selection.worker.0).unwrap_or(i64::MAX)),
                KeyValue::new("kvpick.cost", selection.cost),
                KeyValue::new("kvpick.candidates", i64::try_from(selection.candidates).unwrap_or(i64::MAX)),
                KeyValue::new("kvpick.endpoint", selection.endpoint.to_string()),
                KeyValue::new("kvpick.cached_tokens", i64::from(selection.isl_tokens - selection.prefill_tokens)),
                KeyValue::new("kvpick.prefill_tokens", i64::from(selection.prefill_tokens)),
            ]);
            if let Some(ns) = selection.predicted_ttft_ns {
                attributes.push(KeyValue::new("kvpick.predicted_ttft_ms", ns / 1e6));
            }
        }
        attributes
    });
    if let Err(error) = result {
        span.fail(|| error.to_string());
    }
    span.end(end);
}
