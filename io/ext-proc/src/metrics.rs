//! What the ext_proc server counts: requests by answered status, tokenize
//! and selection time, requests in flight, tokenizer fallbacks, reservation
//! lifecycle, served-endpoint mismatches and the usage engines report.
//!
//! Plain atomics (and two histograms behind briefly held locks) so the
//! request path only adds; a later exporter reads [`ExtProcMetrics::snapshot`]
//! and turns it into Prometheus text.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::buckets::{BucketSnapshot, Buckets, LATENCY_BUCKETS, TOKEN_BUCKETS};
use crate::error::TokenizeError;
use crate::headers::PdRan;
use crate::usage::Usage;

/// Distinct model names tracked with their own labels; later ones share
/// `other`, so a client sending random names cannot grow the exposition.
const MAX_MODELS: usize = 64;
const OTHER_MODEL: &str = "other";

/// Where a pick spends its time, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Parsing the JSON body.
    Parse,
    /// The tokenizer round trip.
    Tokenize,
    /// Cutting tokens into blocks and hashing them.
    Hash,
    /// Scatter–gather over the shards, the cost and the booking (and any
    /// queue wait).
    Select,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Parse, Phase::Tokenize, Phase::Hash, Phase::Select];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Parse => "parse",
            Phase::Tokenize => "tokenize",
            Phase::Hash => "hash",
            Phase::Select => "select",
        }
    }
}

/// Per model name: decisions and errors (by reason).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelCounts {
    pub requests: u64,
    /// `(error_code, count)`: the reason strings of `RequestError::details`.
    pub errors: BTreeMap<&'static str, u64>,
}

/// The bucketed histograms exported to Prometheus.
#[derive(Debug)]
struct Exported {
    request_duration: Buckets,
    scheduler: Buckets,
    phases: [Buckets; Phase::ALL.len()],
    input_tokens: Buckets,
    output_tokens: Buckets,
    models: Mutex<BTreeMap<String, ModelCounts>>,
    overlap_tokens: AtomicU64,
    prompt_tokens_picked: AtomicU64,
    /// Workers suspected of a cache kvpick's hashes never match (the
    /// router's prefix watch): times one was, and how many are now.
    prefix_suspicions: AtomicU64,
    prefix_suspected_workers: AtomicU64,
}

impl Default for Exported {
    fn default() -> Self {
        Exported {
            request_duration: Buckets::new(LATENCY_BUCKETS),
            scheduler: Buckets::new(LATENCY_BUCKETS),
            phases: std::array::from_fn(|_| Buckets::new(LATENCY_BUCKETS)),
            input_tokens: Buckets::new(TOKEN_BUCKETS),
            output_tokens: Buckets::new(TOKEN_BUCKETS),
            models: Mutex::default(),
            overlap_tokens: AtomicU64::new(0),
            prompt_tokens_picked: AtomicU64::new(0),
            prefix_suspicions: AtomicU64::new(0),
            prefix_suspected_workers: AtomicU64::new(0),
        }
    }
}

/// Copies of the exported histograms and per-model counts.
#[derive(Clone, Debug)]
pub struct ExportedSnapshot {
    pub request_duration: BucketSnapshot,
    pub scheduler: BucketSnapshot,
    pub phases: Vec<(Phase, BucketSnapshot)>,
    pub input_tokens: BucketSnapshot,
    pub output_tokens: BucketSnapshot,
    pub models: BTreeMap<String, ModelCounts>,
    /// Prompt tokens the picked workers already held (overlap × block size).
    pub overlap_tokens: u64,
    /// Prompt tokens of the requests picked with a prompt.
    pub prompt_tokens_picked: u64,
    /// Times a worker was suspected of a cache kvpick's hashes never match.
    pub prefix_suspicions: u64,
    /// Workers suspected now.
    pub prefix_suspected_workers: u64,
}

/// The statuses the server answers with, in export order; `200` is a pick
/// sent back to the gateway, everything else an `ImmediateResponse`.
pub const STATUSES: [u16; 10] = [200, 400, 404, 413, 429, 500, 502, 503, 504, 0];

fn status_index(status: u16) -> usize {
    STATUSES.iter().position(|&s| s == status).unwrap_or(STATUSES.len() - 1)
}

/// Tokenizer errors that led to a load-only pick, by class (the order of
/// [`FALLBACK_CLASSES`]).
pub const FALLBACK_CLASSES: [&str; 6] =
    ["unsupported", "unreachable", "timeout", "rejected", "upstream", "unknown_api"];

/// What session affinity did for a request with a session key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionPick {
    /// No worker remembered for the session.
    New,
    /// Picked the session's last worker.
    Kept,
    /// Left it: it cost more than the margin above the cheapest.
    Moved,
}

/// How a request was routed in a fleet with prefill workers, in the
/// order of [`ROUTE_CLASSES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdRoute {
    /// A prefill worker prefills, the decode worker decodes.
    Disaggregated,
    /// The decode worker does it all: the prompt's uncached part on it is
    /// below the decider's threshold.
    ShortUncached,
    /// No prefill worker could take it (none ready, none serving the model).
    NoPrefillWorker,
    /// Every prefill worker is past the queue threshold.
    PrefillSaturated,
    /// The prefill selection failed otherwise (overload, shutting down).
    PrefillFailed,
    /// The decode worker, prefilling the request itself, is predicted to
    /// answer sooner than the prefill worker would start (the latency
    /// cost's predictions of both).
    DecodeSooner,
}

/// `kvpick_pd_routes_total`'s `route` and `reason` labels, by [`PdRoute`].
pub const ROUTE_CLASSES: [(&str, &str); 6] = [
    ("disaggregated", ""),
    ("aggregated", "short_uncached"),
    ("aggregated", "no_prefill_worker"),
    ("aggregated", "prefill_saturated"),
    ("aggregated", "prefill_failed"),
    ("aggregated", "decode_sooner"),
];

/// Why a request was routed by load alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    Tokenizer(FallbackClass),
    /// Neither a chat nor a completions body: nothing to tokenize.
    UnknownApi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackClass {
    Unsupported,
    Unreachable,
    Timeout,
    Rejected,
    Upstream,
}

impl From<&TokenizeError> for Fallback {
    fn from(error: &TokenizeError) -> Self {
        Fallback::Tokenizer(match error {
            TokenizeError::Unsupported(_) => FallbackClass::Unsupported,
            TokenizeError::Unreachable(_) => FallbackClass::Unreachable,
            TokenizeError::Timeout => FallbackClass::Timeout,
            TokenizeError::Rejected { .. } => FallbackClass::Rejected,
            TokenizeError::Upstream(_) => FallbackClass::Upstream,
        })
    }
}

impl Fallback {
    fn index(self) -> usize {
        match self {
            Fallback::Tokenizer(class) => class as usize,
            Fallback::UnknownApi => 5,
        }
    }
}

/// Latencies in microseconds, 1 µs to one hour, 3 significant figures.
const MAX_TRACKED_MICROS: u64 = 3_600_000_000;

fn histogram() -> Mutex<Histogram<u64>> {
    Mutex::new(
        Histogram::new_with_bounds(1, MAX_TRACKED_MICROS, 3)
            .expect("1 µs to 1 h at 3 significant figures is a valid histogram range"),
    )
}

fn record(h: &Mutex<Histogram<u64>>, elapsed: Duration) {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX).max(1);
    h.lock().unwrap_or_else(PoisonError::into_inner).saturating_record(micros);
}

/// Shared by every stream of one server (behind an `Arc`).
#[derive(Debug)]
pub struct ExtProcMetrics {
    requests: [AtomicU64; STATUSES.len()],
    inflight: AtomicI64,
    streams_open: AtomicI64,
    header_only: AtomicU64,
    fallbacks: [AtomicU64; FALLBACK_CLASSES.len()],
    tokenize_micros: Mutex<Histogram<u64>>,
    select_micros: Mutex<Histogram<u64>>,
    prefill_completes: AtomicU64,
    leases_renewed: AtomicU64,
    bookings_moved: AtomicU64,
    session_picks: [AtomicU64; 3],
    pd_routes: [AtomicU64; ROUTE_CLASSES.len()],
    bookings_not_moved: AtomicU64,
    pd_handoffs: [AtomicU64; 3],
    prefill_restores: [AtomicU64; 2],
    frees: AtomicU64,
    frees_not_found: AtomicU64,
    served_mismatches: AtomicU64,
    served_missing: AtomicU64,
    out_of_order: AtomicU64,
    stream_errors: AtomicU64,
    usage_responses: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    exported: Exported,
}

impl Default for ExtProcMetrics {
    fn default() -> Self {
        ExtProcMetrics {
            requests: Default::default(),
            inflight: AtomicI64::new(0),
            streams_open: AtomicI64::new(0),
            header_only: AtomicU64::new(0),
            fallbacks: Default::default(),
            tokenize_micros: histogram(),
            select_micros: histogram(),
            prefill_completes: AtomicU64::new(0),
            leases_renewed: AtomicU64::new(0),
            bookings_moved: AtomicU64::new(0),
            session_picks: Default::default(),
            pd_routes: Default::default(),
            bookings_not_moved: AtomicU64::new(0),
            pd_handoffs: Default::default(),
            prefill_restores: Default::default(),
            frees: AtomicU64::new(0),
            frees_not_found: AtomicU64::new(0),
            served_mismatches: AtomicU64::new(0),
            served_missing: AtomicU64::new(0),
            out_of_order: AtomicU64::new(0),
            stream_errors: AtomicU64::new(0),
            usage_responses: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            exported: Exported::default(),
        }
    }
}

impl ExtProcMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// A request answered: `200` for a pick, else the immediate response's
    /// status. Called exactly once per request that reached a decision.
    pub fn record_status(&self, status: u16) {
        self.requests[status_index(status)].fetch_add(1, Relaxed);
    }

    pub(crate) fn inflight_add(&self, delta: i64) {
        self.inflight.fetch_add(delta, Relaxed);
    }

    pub(crate) fn stream_opened(&self) {
        self.streams_open.fetch_add(1, Relaxed);
    }

    pub(crate) fn stream_closed(&self) {
        self.streams_open.fetch_sub(1, Relaxed);
    }

    pub fn record_header_only(&self) {
        self.header_only.fetch_add(1, Relaxed);
    }

    pub fn record_fallback(&self, why: Fallback) {
        self.fallbacks[why.index()].fetch_add(1, Relaxed);
    }

    pub fn record_tokenize(&self, elapsed: Duration) {
        record(&self.tokenize_micros, elapsed);
        self.record_phase(Phase::Tokenize, elapsed);
    }

    pub fn record_select(&self, elapsed: Duration) {
        record(&self.select_micros, elapsed);
        self.record_phase(Phase::Select, elapsed);
    }

    pub fn record_prefill_complete(&self) {
        self.prefill_completes.fetch_add(1, Relaxed);
    }

    /// A streaming response renewed its booking's lease.
    pub fn record_lease_renewed(&self) {
        self.leases_renewed.fetch_add(1, Relaxed);
    }

    pub fn record_pd_route(&self, route: PdRoute) {
        self.pd_routes[route as usize].fetch_add(1, Relaxed);
    }

    pub fn record_session_pick(&self, pick: SessionPick) {
        self.session_picks[pick as usize].fetch_add(1, Relaxed);
    }

    /// A booking moved to the worker the gateway says served (`false`:
    /// it could not be: an unknown endpoint, or already freed).
    pub fn record_booking_moved(&self, moved: bool) {
        if moved { &self.bookings_moved } else { &self.bookings_not_moved }.fetch_add(1, Relaxed);
    }

    /// A response came with the decode sidecar's hand-off header.
    pub(crate) fn record_pd_handoff(&self, ran: PdRan) {
        self.pd_handoffs[ran as usize].fetch_add(1, Relaxed);
    }

    /// A split request's prompt booked back as prefill load on its decode
    /// worker, which ran it whole (`false`: the booking was gone).
    pub fn record_prefill_restored(&self, restored: bool) {
        self.prefill_restores[usize::from(!restored)].fetch_add(1, Relaxed);
    }

    /// A reservation freed; `found` is false when the shard no longer knew
    /// it (its lease expired, or its worker was deleted).
    pub fn record_free(&self, found: bool) {
        if found { &self.frees } else { &self.frees_not_found }.fetch_add(1, Relaxed);
    }

    pub(crate) fn record_served_mismatch(&self) {
        self.served_mismatches.fetch_add(1, Relaxed);
    }

    pub(crate) fn record_served_missing(&self) {
        self.served_missing.fetch_add(1, Relaxed);
    }

    /// Headers sent twice on one stream: answered or ignored, never acted
    /// on twice.
    pub(crate) fn record_out_of_order(&self) {
        self.out_of_order.fetch_add(1, Relaxed);
    }

    /// The gateway's stream failed (transport error or undecodable message).
    pub(crate) fn record_stream_error(&self) {
        self.stream_errors.fetch_add(1, Relaxed);
    }

    /// A request decided (picked, or refused with `error_code`) for
    /// `model` (`""` when the body named none or was never parsed).
    pub(crate) fn record_model_decision(&self, model: &str, error_code: Option<&'static str>) {
        let mut models = self.exported.models.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if models.contains_key(model) || models.len() < MAX_MODELS { model } else { OTHER_MODEL };
        // A name seen before (every request but a model's first) costs no
        // allocation.
        if !models.contains_key(key) {
            models.insert(key.to_owned(), ModelCounts::default());
        }
        let Some(counts) = models.get_mut(key) else { return };
        counts.requests += 1;
        if let Some(code) = error_code {
            *counts.errors.entry(code).or_default() += 1;
        }
    }

    pub fn record_phase(&self, phase: Phase, elapsed: Duration) {
        self.exported.phases[phase as usize].observe_duration(elapsed);
    }

    /// The whole pick, from the end of the body to the decision.
    pub(crate) fn record_scheduler(&self, elapsed: Duration) {
        self.exported.scheduler.observe_duration(elapsed);
    }

    /// The request's whole life at the gateway: from its headers to the end
    /// of its response.
    pub(crate) fn record_request_duration(&self, elapsed: Duration) {
        self.exported.request_duration.observe_duration(elapsed);
    }

    /// A pick made with a prompt of `prompt_tokens`, of which the chosen
    /// worker held `overlap_tokens`.
    pub fn record_overlap(&self, prompt_tokens: u64, overlap_tokens: u64) {
        self.exported.prompt_tokens_picked.fetch_add(prompt_tokens, Relaxed);
        self.exported.overlap_tokens.fetch_add(overlap_tokens.min(prompt_tokens), Relaxed);
    }

    pub fn exported(&self) -> ExportedSnapshot {
        let e = &self.exported;
        ExportedSnapshot {
            request_duration: e.request_duration.snapshot(),
            scheduler: e.scheduler.snapshot(),
            phases: Phase::ALL.iter().map(|p| (*p, e.phases[*p as usize].snapshot())).collect(),
            input_tokens: e.input_tokens.snapshot(),
            output_tokens: e.output_tokens.snapshot(),
            models: e.models.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            overlap_tokens: e.overlap_tokens.load(Relaxed),
            prompt_tokens_picked: e.prompt_tokens_picked.load(Relaxed),
            prefix_suspicions: e.prefix_suspicions.load(Relaxed),
            prefix_suspected_workers: e.prefix_suspected_workers.load(Relaxed),
        }
    }

    /// The prefix watch's verdict changed: `suspected_now` workers are
    /// suspected, one more of them than before when `newly`.
    pub fn record_prefix_suspects(&self, suspected_now: usize, newly: bool) {
        if newly {
            self.exported.prefix_suspicions.fetch_add(1, Relaxed);
        }
        self.exported.prefix_suspected_workers.store(suspected_now as u64, Relaxed);
    }

    pub(crate) fn record_usage(&self, usage: &Usage) {
        self.exported.input_tokens.observe(usage.prompt_tokens as f64);
        self.exported.output_tokens.observe(usage.completion_tokens as f64);
        self.usage_responses.fetch_add(1, Relaxed);
        self.prompt_tokens.fetch_add(usage.prompt_tokens, Relaxed);
        self.completion_tokens.fetch_add(usage.completion_tokens, Relaxed);
        self.cached_tokens.fetch_add(usage.cached_tokens.unwrap_or(0), Relaxed);
    }

    /// Each counter read once; they are not read atomically together.
    pub fn snapshot(&self) -> ExtProcMetricsSnapshot {
        let lock = |h: &Mutex<Histogram<u64>>| h.lock().unwrap_or_else(PoisonError::into_inner).clone();
        ExtProcMetricsSnapshot {
            requests: std::array::from_fn(|i| self.requests[i].load(Relaxed)),
            inflight: self.inflight.load(Relaxed),
            streams_open: self.streams_open.load(Relaxed),
            header_only: self.header_only.load(Relaxed),
            fallbacks: std::array::from_fn(|i| self.fallbacks[i].load(Relaxed)),
            tokenize_micros: lock(&self.tokenize_micros),
            select_micros: lock(&self.select_micros),
            prefill_completes: self.prefill_completes.load(Relaxed),
            leases_renewed: self.leases_renewed.load(Relaxed),
            bookings_moved: self.bookings_moved.load(Relaxed),
            session_picks: [0, 1, 2].map(|i| self.session_picks[i].load(Relaxed)),
            pd_routes: std::array::from_fn(|i| self.pd_routes[i].load(Relaxed)),
            bookings_not_moved: self.bookings_not_moved.load(Relaxed),
            pd_handoffs: std::array::from_fn(|i| self.pd_handoffs[i].load(Relaxed)),
            prefill_restores: std::array::from_fn(|i| self.prefill_restores[i].load(Relaxed)),
            frees: self.frees.load(Relaxed),
            frees_not_found: self.frees_not_found.load(Relaxed),
            served_mismatches: self.served_mismatches.load(Relaxed),
            served_missing: self.served_missing.load(Relaxed),
            out_of_order: self.out_of_order.load(Relaxed),
            stream_errors: self.stream_errors.load(Relaxed),
            usage_responses: self.usage_responses.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            completion_tokens: self.completion_tokens.load(Relaxed),
            cached_tokens: self.cached_tokens.load(Relaxed),
        }
    }
}

/// Read-only copy of [`ExtProcMetrics`].
#[derive(Clone, Debug)]
pub struct ExtProcMetricsSnapshot {
    requests: [u64; STATUSES.len()],
    /// Requests between their headers and the pick (or error) sent back.
    pub inflight: i64,
    /// ext_proc streams open now (one per HTTP request at the gateway).
    pub streams_open: i64,
    /// Picks made without a body (GET and the like).
    pub header_only: u64,
    fallbacks: [u64; FALLBACK_CLASSES.len()],
    /// Tokenizer round trips, microseconds.
    pub tokenize_micros: Histogram<u64>,
    /// Selection (scatter–gather, queue wait, booking), microseconds.
    pub select_micros: Histogram<u64>,
    pub prefill_completes: u64,
    pub leases_renewed: u64,
    pub bookings_moved: u64,
    /// Picks with a session key: new, kept, moved (see [`SessionPick`]).
    pub session_picks: [u64; 3],
    /// Picks in a fleet with prefill workers, by [`ROUTE_CLASSES`].
    pub pd_routes: [u64; ROUTE_CLASSES.len()],
    pub bookings_not_moved: u64,
    /// Responses with the decode sidecar's `x-kvpick-pd`, by [`PdRan`]
    /// (disaggregated, aggregated, failed).
    pub pd_handoffs: [u64; 3],
    /// Split requests run whole by the decode sidecar whose prompt was
    /// booked back on the decode worker: restored, booking gone.
    pub prefill_restores: [u64; 2],
    /// Reservations freed by their stream.
    pub frees: u64,
    /// Frees the shards no longer knew (lease expired, worker deleted).
    pub frees_not_found: u64,
    /// Responses whose served endpoint differed from the pick.
    pub served_mismatches: u64,
    /// Responses without served-endpoint metadata.
    pub served_missing: u64,
    /// Request or response headers sent twice on one stream.
    pub out_of_order: u64,
    pub stream_errors: u64,
    /// Responses that carried a `usage` object.
    pub usage_responses: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

impl ExtProcMetricsSnapshot {
    /// Requests answered with `status` (`200`: picked; `0`: any status
    /// not listed in [`STATUSES`]).
    pub fn requests(&self, status: u16) -> u64 {
        self.requests[status_index(status)]
    }

    pub fn total_requests(&self) -> u64 {
        self.requests.iter().sum()
    }

    /// Load-only picks by class (a name from [`FALLBACK_CLASSES`]).
    pub fn fallbacks(&self, class: &str) -> u64 {
        FALLBACK_CLASSES.iter().position(|c| *c == class).map_or(0, |i| self.fallbacks[i])
    }

    pub fn total_fallbacks(&self) -> u64 {
        self.fallbacks.iter().sum()
    }
}
