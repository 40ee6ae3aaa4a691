//! One scrape: every subsystem's snapshot written as Prometheus text.
//!
//! GAIE's names where the reference EPP has them (`inference_objective_*`,
//! `inference_pool_*`, `inference_extension_*`, labels as it uses them), so
//! its dashboards work unchanged; `kvpick_*` for the rest.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use kvpick_core::WorkerId;
use kvpick_runtime::{ShardedService, ThreadProducers};

use super::{BucketSnapshot, Exposition};
use kvpick_discovery::{DiscoveryMetrics, WatchCounts};
use kvpick_ext_proc::ExtProcMetrics;
use kvpick_ext_proc::metrics::{FALLBACK_CLASSES, STATUSES};
use kvpick_kv_events::IngestMetrics;
use kvpick_replica::{OriginView, SyncStats, TransportMetrics};
use kvpick_router::tokenizer::{ErrorClass, ParityOutcome, TokenizerMetrics};

/// The workers in service now, by id: kept by whoever applies the
/// discovery updates, read by the scrape for labels.
#[derive(Clone, Debug, Default)]
pub struct WorkerNames(Arc<RwLock<BTreeMap<WorkerId, SocketAddr>>>);

impl WorkerNames {
    pub fn insert(&self, id: WorkerId, endpoint: SocketAddr) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).insert(id, endpoint);
    }

    pub fn remove(&self, id: WorkerId) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).remove(&id);
    }

    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, id: WorkerId) -> Option<SocketAddr> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).get(&id).copied()
    }

    pub fn all(&self) -> Vec<(WorkerId, SocketAddr)> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// What a scrape reads.
#[derive(Clone)]
pub struct Sources {
    /// The `name` label of the pool families (the InferencePool's name, or
    /// `static`).
    pub pool: String,
    pub ext_proc: Arc<ExtProcMetrics>,
    pub tokenizer: Option<Arc<TokenizerMetrics>>,
    pub ingest: Option<Arc<IngestMetrics>>,
    pub service: Option<ThreadProducers>,
    /// The prefill workers' selector, when disaggregation is on.
    pub prefill: Option<ThreadProducers>,
    pub workers: WorkerNames,
    /// The debug view's picker, when `--debug-endpoints` is on.
    pub debug: Option<kvpick_router::KvPicker>,
    pub discovery: Option<Arc<DiscoveryMetrics>>,
    /// The replica sync and its transport, when peers share bookings.
    pub replicas: Option<(Arc<SyncStats>, Arc<TransportMetrics>)>,
}

pub async fn render(sources: &Sources) -> String {
    let mut e = Exposition::new();
    ext_proc(&mut e, sources);
    if let Some(tokenizer) = &sources.tokenizer {
        tokenizer_families(&mut e, tokenizer);
    }
    if let Some(ingest) = &sources.ingest {
        ingest_families(&mut e, ingest, &sources.workers);
    }
    if let Some((sync, transport)) = &sources.replicas {
        replica_families(&mut e, sync, transport);
    }
    if let Some(discovery) = &sources.discovery {
        discovery_families(&mut e, discovery);
    }
    if let Some(producers) = &sources.service {
        shard_families(&mut e, producers, sources.prefill.as_ref(), &sources.workers).await;
    }
    e.finish()
}

fn ext_proc(e: &mut Exposition, sources: &Sources) {
    let m = sources.ext_proc.snapshot();
    let x = sources.ext_proc.exported();
    let pool = sources.pool.as_str();
    for (model, counts) in &x.models {
        let labels = [("model_name", model.as_str()), ("target_model_name", model.as_str())];
        e.counter(
            "inference_objective_request_total",
            "Requests decided (picked or refused), by model.",
            &labels,
            counts.requests,
        );
    }
    for (model, counts) in &x.models {
        for (code, n) in &counts.errors {
            let labels = [("model_name", model.as_str()), ("target_model_name", model.as_str()), ("error_code", code)];
            e.counter("inference_objective_request_error_total", "Requests refused, by model and reason.", &labels, *n);
        }
    }
    e.histogram(
        "inference_objective_request_duration_seconds",
        "A request's life at the gateway, from its headers to the end of its response.",
        &[],
        &x.request_duration,
    );
    e.histogram(
        "inference_objective_input_tokens",
        "Prompt tokens per response, as the engine reported them in usage.",
        &[],
        &x.input_tokens,
    );
    e.histogram(
        "inference_objective_output_tokens",
        "Completion tokens per response, from usage.",
        &[],
        &x.output_tokens,
    );
    e.gauge(
        "inference_objective_running_requests",
        "ext_proc streams open now (requests in flight at the gateway).",
        &[],
        m.streams_open as f64,
    );
    e.gauge(
        "inference_pool_ready_pods",
        "Workers (engine ranks) kvpick can route to now: those of Ready pods.",
        &[("name", pool)],
        // The selectors' directories know which workers are schedulable.
        sources.service.iter().chain(&sources.prefill).map(|p| p.service().schedulable_count()).sum::<usize>() as f64,
    );
    e.histogram(
        "inference_extension_scheduler_e2e_duration_seconds",
        "The pick: parse, tokenize, hash, shards and booking (queue wait included).",
        &[],
        &x.scheduler,
    );
    for (phase, h) in &x.phases {
        e.histogram(
            "kvpick_pick_phase_duration_seconds",
            "Time in each phase of a pick.",
            &[("phase", phase.as_str())],
            h,
        );
    }
    for status in STATUSES {
        let code = if status == 0 { "other".to_owned() } else { status.to_string() };
        e.counter(
            "kvpick_requests_total",
            "Requests by the status kvpick answered (200: picked).",
            &[("code", &code)],
            m.requests(status),
        );
    }
    e.gauge("kvpick_requests_inflight", "Requests between their headers and their pick.", &[], m.inflight as f64);
    e.counter("kvpick_header_only_picks_total", "Picks made without a body (GET and the like).", &[], m.header_only);
    for class in FALLBACK_CLASSES {
        e.counter(
            "kvpick_load_only_picks_total",
            "Picks made by load alone, by why the prompt was not tokenized.",
            &[("reason", class)],
            m.fallbacks(class),
        );
    }
    e.counter(
        "kvpick_prefill_completes_total",
        "Bookings moved from prefill to decode (first response chunk).",
        &[],
        m.prefill_completes,
    );
    e.counter(
        "kvpick_lease_renewals_total",
        "Lease renewals by responses still streaming (a stream longer than the lease keeps its booking).",
        &[],
        m.leases_renewed,
    );
    for (i, result) in ["new", "kept", "moved"].into_iter().enumerate() {
        e.counter(
            "kvpick_session_picks_total",
            "Picks of requests with a session key (x-session-token or session_id): no worker remembered, the session's worker kept, or left for a cheaper one.",
            &[("result", result)],
            m.session_picks[i],
        );
    }
    for ((route, reason), count) in kvpick_ext_proc::metrics::ROUTE_CLASSES.into_iter().zip(m.pd_routes) {
        let labels: &[(&str, &str)] =
            if reason.is_empty() { &[("route", route)] } else { &[("route", route), ("reason", reason)] };
        e.counter(
            "kvpick_pd_routes_total",
            "Picks of requests with a prompt while disaggregation is on (--disaggregation auto): disaggregated (prefill worker + decode worker), or served whole by the decode worker and why (no_prefill_worker for every request of a fleet without prefill workers).",
            labels,
            count,
        );
    }
    let moved = "Bookings moved to the worker the gateway reports as served (x-gateway-destination-endpoint-served).";
    e.counter("kvpick_bookings_moved_total", moved, &[("result", "moved")], m.bookings_moved);
    e.counter("kvpick_bookings_moved_total", moved, &[("result", "failed")], m.bookings_not_moved);
    for (ran, count) in kvpick_ext_proc::headers::PdRan::LABELS.into_iter().zip(m.pd_handoffs) {
        e.counter(
            "kvpick_pd_handoffs_total",
            "Responses carrying the decode sidecar's x-kvpick-pd hand-off header, by how it ran the request (disaggregated; aggregated: run whole on the decode engine; failed).",
            &[("ran", ran)],
            count,
        );
    }
    let restored = "Split requests the decode sidecar ran whole after all, whose prompt was booked back as prefill load on their decode worker (failed: the booking was already gone).";
    e.counter("kvpick_prefill_restored_total", restored, &[("result", "restored")], m.prefill_restores[0]);
    e.counter("kvpick_prefill_restored_total", restored, &[("result", "failed")], m.prefill_restores[1]);
    e.counter("kvpick_frees_total", "Bookings freed by their stream.", &[("found", "true")], m.frees);
    e.counter("kvpick_frees_total", "Bookings freed by their stream.", &[("found", "false")], m.frees_not_found);
    e.counter(
        "kvpick_served_endpoint_mismatch_total",
        "Responses served by another endpoint than the one picked.",
        &[],
        m.served_mismatches,
    );
    e.counter(
        "kvpick_served_endpoint_missing_total",
        "Responses without served-endpoint metadata.",
        &[],
        m.served_missing,
    );
    e.counter(
        "kvpick_ext_proc_messages_out_of_order_total",
        "ext_proc request or response headers sent twice on one stream (the second set is not acted on).",
        &[],
        m.out_of_order,
    );
    e.counter(
        "kvpick_ext_proc_stream_errors_total",
        "ext_proc streams that ended with a transport error.",
        &[],
        m.stream_errors,
    );
    e.counter(
        "kvpick_prompt_cached_tokens_total",
        "Cached prompt tokens the engines reported in usage.",
        &[],
        m.cached_tokens,
    );
    e.counter(
        "kvpick_picked_prompt_tokens_total",
        "Prompt tokens of the requests picked with a prompt.",
        &[],
        x.prompt_tokens_picked,
    );
    e.counter(
        "kvpick_picked_overlap_tokens_total",
        "Of those, tokens the picked worker already held in its KV cache.",
        &[],
        x.overlap_tokens,
    );
    let ratio = if x.prompt_tokens_picked == 0 { 0.0 } else { x.overlap_tokens as f64 / x.prompt_tokens_picked as f64 };
    e.gauge("kvpick_overlap_hit_ratio", "Overlap tokens over prompt tokens of every pick since start.", &[], ratio);
    e.gauge(
        "kvpick_prefix_mismatch_workers",
        "Workers whose cache kvpick's hashes never match: prompts they served come back and find nothing (template, tokenizer or seed differs, or their KV events are lost).",
        &[],
        x.prefix_suspected_workers as f64,
    );
    e.counter(
        "kvpick_prefix_mismatch_suspicions_total",
        "Times a worker was found matching none of the prompts it served.",
        &[],
        x.prefix_suspicions,
    );
}

fn tokenizer_families(e: &mut Exposition, tokenizer: &TokenizerMetrics) {
    let t = tokenizer.snapshot();
    e.counter("kvpick_tokenizer_calls_total", "Calls sent to the tokenizer service.", &[], t.calls);
    for class in ErrorClass::ALL {
        e.counter(
            "kvpick_tokenizer_errors_total",
            "Tokenizer calls that failed, by class.",
            &[("class", class.as_str())],
            t.errors(class),
        );
    }
    e.counter(
        "kvpick_tokenizer_retries_total",
        "Tokenizer requests resent once after their connection closed unanswered.",
        &[],
        t.retries,
    );
    e.counter(
        "kvpick_tokenizer_local_handoffs_total",
        "Bodies the local tokenizer could not handle (multimodal, a request's own template), tokenized by the engine.",
        &[],
        t.local_handoffs,
    );
    for outcome in ParityOutcome::ALL {
        e.counter(
            "kvpick_tokenizer_parity_checks_total",
            "Local tokenizations compared with the engine's, by outcome.",
            &[("outcome", outcome.as_str())],
            t.parity(outcome),
        );
    }
    e.gauge(
        "kvpick_tokenizer_engine_fallback",
        "1 when the local tokenizer disagreed with the engine's and the engine now tokenizes every request.",
        &[],
        f64::from(u8::from(t.engine_fallback)),
    );
}

/// Replica sync: this replica's own stream, each origin's as received
/// here (`origin` is the peer's replica id), and the transport's.
fn replica_families(e: &mut Exposition, sync: &SyncStats, transport: &TransportMetrics) {
    let c = sync.snapshot();
    let own: [(&str, &str, u64); 5] = [
        (
            "kvpick_replica_own_events_total",
            "Changes to this replica's own bookings published to its peers.",
            c.own_events,
        ),
        ("kvpick_replica_batches_published_total", "Batches of them published.", c.batches_published),
        (
            "kvpick_replica_snapshots_sent_total",
            "Snapshots of this replica's bookings sent to a peer (on connecting, or asked for).",
            c.snapshots_sent,
        ),
        (
            "kvpick_replica_snapshots_deferred_total",
            "Snapshots that found the peer's queue full (sent again at the next digest).",
            c.snapshots_deferred,
        ),
        (
            "kvpick_replica_resyncs_asked_total",
            "Snapshots this replica asked a peer for (a gap, a digest mismatch, a restart).",
            c.resyncs_asked,
        ),
    ];
    for (name, help, value) in own {
        e.counter(name, help, &[], value);
    }
    e.gauge(
        "kvpick_replica_own_bookings",
        "This replica's own live bookings, as its peers are told.",
        &[],
        c.own_live as f64,
    );
    let mut origins: Vec<(u64, OriginView)> = c.origins.iter().map(|(id, v)| (id.0, *v)).collect();
    origins.sort_unstable_by_key(|(id, _)| *id);
    type Family = (&'static str, &'static str, fn(&OriginView) -> u64);
    let per_origin: [Family; 9] = [
        ("kvpick_replica_peer_events_applied_total", "A peer's booking changes applied here.", |v| {
            v.stats.events_applied
        }),
        (
            "kvpick_replica_peer_duplicate_events_total",
            "A peer's changes received again (a retransmission or an overlap), not applied twice.",
            |v| v.stats.duplicate_events,
        ),
        ("kvpick_replica_peer_gaps_total", "Gaps in a peer's sequence (each asks for a snapshot).", |v| v.stats.gaps),
        ("kvpick_replica_peer_resyncs_total", "Snapshots of a peer applied.", |v| v.stats.resyncs),
        (
            "kvpick_replica_peer_digest_mismatches_total",
            "Digests of a peer that disagreed with its bookings as held here.",
            |v| v.stats.digest_mismatches,
        ),
        ("kvpick_replica_peer_restarts_total", "New incarnations of a peer (its old bookings freed).", |v| {
            v.stats.new_incarnations
        }),
        (
            "kvpick_replica_peer_unknown_worker_total",
            "A peer's bookings on workers this replica does not have (not applied).",
            |v| v.stats.unknown_worker,
        ),
        (
            "kvpick_replica_peer_stale_frames_total",
            "A peer's frames of an older incarnation or older than what is held.",
            |v| v.stats.stale_frames,
        ),
        (
            "kvpick_replica_peer_refused_total",
            "A peer's changes the shards refused (a duplicate id, a worker gone).",
            |v| v.refused,
        ),
    ];
    for (name, help, value) in per_origin {
        for (id, view) in &origins {
            e.counter(name, help, &[("origin", &id.to_string())], value(view));
        }
    }
    for (id, view) in &origins {
        let origin = id.to_string();
        e.gauge(
            "kvpick_replica_peer_bookings",
            "A peer's live bookings as mirrored here.",
            &[("origin", &origin)],
            view.live as f64,
        );
        e.gauge(
            "kvpick_replica_peer_lag_events",
            "How many of a peer's changes its last digest showed that are not applied here yet.",
            &[("origin", &origin)],
            view.seen.saturating_sub(view.last_seq) as f64,
        );
        e.gauge(
            "kvpick_replica_peer_forgotten",
            "1 while a peer is silent past its grace period (its bookings freed).",
            &[("origin", &origin)],
            f64::from(u8::from(view.forgotten)),
        );
    }
    e.histogram(
        "kvpick_replica_peer_delay_seconds",
        "From a peer's sending a batch of booking changes (its wall clock) to their being applied here.",
        &[],
        &delay_buckets(&c.delay_micros),
    );
    let get = TransportMetrics::get;
    e.gauge("kvpick_replica_links", "Peers this replica dials.", &[], get(&transport.links) as f64);
    e.gauge(
        "kvpick_warm_start_outcome",
        "This replica's warm start: 0 under way or off, 1 warm (a peer's whole KV index taken), 2 cold.",
        &[],
        get(&transport.warm_outcome) as f64,
    );
    e.gauge(
        "kvpick_warm_start_workers",
        "Workers whose KV index came from a peer at start, by result.",
        &[("result", "seeded")],
        get(&transport.warm_workers_seeded) as f64,
    );
    e.gauge("kvpick_warm_start_workers", "", &[("result", "refused")], get(&transport.warm_workers_refused) as f64);
    e.gauge(
        "kvpick_warm_start_blocks",
        "KV blocks imported from a peer at start.",
        &[],
        get(&transport.warm_blocks_imported) as f64,
    );
    e.gauge(
        "kvpick_warm_start_seconds",
        "How long the warm start took (readiness waited for it).",
        &[],
        get(&transport.warm_took_ms) as f64 / 1000.0,
    );
    e.gauge("kvpick_replica_links_up", "Of those, the links streaming now.", &[], get(&transport.links_up) as f64);
    e.gauge(
        "kvpick_replica_streams_in",
        "Peers' streams open on the replica-sync port.",
        &[],
        get(&transport.streams_in) as f64,
    );
    let transport_counters: [(&str, &str, u64); 6] = [
        (
            "kvpick_replica_reconnects_total",
            "Links that ended or failed to connect and tried again.",
            get(&transport.reconnects),
        ),
        ("kvpick_replica_frames_received_total", "Peer frames received.", get(&transport.frames_in)),
        ("kvpick_replica_received_bytes_total", "Their bytes.", get(&transport.bytes_in)),
        ("kvpick_replica_frames_sent_total", "Frames sent to peers.", get(&transport.frames_out)),
        ("kvpick_replica_sent_bytes_total", "Their bytes.", get(&transport.bytes_out)),
        (
            "kvpick_replica_indexes_served_total",
            "Warm start: this replica's KV index sent to a replica starting up.",
            get(&transport.indexes_served),
        ),
    ];
    for (name, help, value) in transport_counters {
        e.counter(name, help, &[], value);
    }
    for (reason, count) in transport.refusals() {
        e.counter(
            "kvpick_replica_frames_refused_total",
            "Peer frames and calls refused, by reason (nothing of them is applied).",
            &[("reason", reason)],
            count,
        );
    }
}

/// Propagation within a host takes tens of µs to a few ms: finer than
/// the latency ladder at the low end.
const DELAY_BUCKETS: &[f64] = &[
    0.000025, 0.00005, 0.000075, 0.0001, 0.00015, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

fn delay_buckets(h: &hdrhistogram::Histogram<u64>) -> BucketSnapshot {
    let mut cumulative: Vec<u64> = DELAY_BUCKETS.iter().map(|bound| h.count_between(0, (bound * 1e6) as u64)).collect();
    cumulative.push(h.len());
    BucketSnapshot { bounds: DELAY_BUCKETS, cumulative, sum: h.mean() * h.len() as f64 / 1e6 }
}

/// Zero in the mode that does not use them (the watches in static mode,
/// the workers file under Kubernetes).
fn discovery_families(e: &mut Exposition, m: &DiscoveryMetrics) {
    let watches = m.watches();
    type Family = (&'static str, &'static str, fn(&WatchCounts) -> u64);
    let families: [Family; 3] = [
        (
            "kvpick_discovery_lists_total",
            "Full lists of a watched resource completed (the first, then relists).",
            |w| w.lists,
        ),
        (
            "kvpick_discovery_watch_errors_total",
            "Watch or list requests to the API server that failed; each is retried with back-off.",
            |w| w.errors,
        ),
        ("kvpick_discovery_watch_expired_total", "Watches that expired (410 Gone), each followed by a relist.", |w| {
            w.expired
        }),
    ];
    for (name, help, value) in families {
        for w in &watches {
            e.counter(name, help, &[("resource", w.resource.label())], value(w));
        }
    }
    e.counter(
        "kvpick_discovery_workers_file_errors_total",
        "Reads of the workers file refused (unreadable, too big, invalid); the previous workers stay.",
        &[],
        m.workers_file_errors(),
    );
}

fn ingest_families(e: &mut Exposition, ingest: &IngestMetrics, workers: &WorkerNames) {
    let c = ingest.snapshot();
    let counters: [(&str, &str, u64); 28] = [
        (
            "kvpick_kv_event_batches_applied_total",
            "KV-event batches decoded and applied, live or replayed.",
            c.batches_applied,
        ),
        ("kvpick_kv_events_applied_total", "KV events handed to the shards.", c.events_applied),
        ("kvpick_kv_event_blocks_applied_total", "Block hashes in those events.", c.blocks_applied),
        (
            "kvpick_kv_events_skipped_total",
            "KV events not indexed by rule (other medium or group, unknown type).",
            c.events_skipped,
        ),
        (
            "kvpick_kv_events_malformed_total",
            "KV events dropped for bad content (the rest of the batch kept).",
            c.events_malformed,
        ),
        ("kvpick_kv_event_decode_errors_total", "Payloads that failed to decode as a batch.", c.decode_errors),
        ("kvpick_kv_event_bad_frames_total", "ZMQ messages not framed as [topic, seq, payload].", c.bad_frames),
        ("kvpick_kv_event_gaps_total", "Sequence gaps seen on live streams.", c.gaps),
        ("kvpick_kv_event_replays_total", "Replays requested (gap or catch-up).", c.replays_started),
        ("kvpick_kv_event_replays_failed_total", "Replays given up.", c.replays_failed),
        (
            "kvpick_kv_event_replays_resumed_total",
            "Replays cut short (an engine's send high-water mark) and asked again from where they stopped.",
            c.replays_resumed,
        ),
        (
            "kvpick_kv_event_replays_retried_total",
            "Replays unanswered (the engine's replay socket down) and asked again.",
            c.replays_retried,
        ),
        ("kvpick_kv_event_batches_lost_total", "Batches known missed and never applied.", c.lost_batches),
        (
            "kvpick_kv_event_engine_restarts_total",
            "Sequence numbers going back: engine restarts (index cleared).",
            c.engine_restarts,
        ),
        (
            "kvpick_kv_event_rebuilds_total",
            "Live connections back after a drop, each worker's index rebuilt from the engine's whole history.",
            c.rebuilds,
        ),
        ("kvpick_kv_event_drains_total", "TensorRT-LLM /kv_cache_events answers decoded.", c.drains),
        (
            "kvpick_kv_event_drain_errors_total",
            "TensorRT-LLM drain polls that failed (no answer, error status, bad body); the next one backs off.",
            c.drain_errors,
        ),
        (
            "kvpick_kv_events_lost_total",
            "TensorRT-LLM events discarded by the engine before a drain (its worker cleared).",
            c.lost_events,
        ),
        (
            "kvpick_kv_event_streams_seeded_total",
            "Warm start: workers whose stream continued from a peer replica's export.",
            c.streams_seeded,
        ),
        (
            "kvpick_kv_event_streams_released_cold_total",
            "Warm start: held streams that got no peer export and started cold.",
            c.streams_released_cold,
        ),
        (
            "kvpick_kv_event_streams_exported_total",
            "Warm start: workers' indexes exported to a peer replica.",
            c.streams_exported,
        ),
        (
            "kvpick_kv_event_orphan_blocks_total",
            "Stored blocks whose parent the worker did not hold (not indexed).",
            c.orphan_blocks,
        ),
        (
            "kvpick_kv_events_unknown_parent_total",
            "BlockStored events whose parent the worker did not hold (skipped).",
            c.unknown_parent_events,
        ),
        (
            "kvpick_kv_events_rejected_total",
            "KV events the index refused (unknown worker, block size mismatch), unknown parents excepted.",
            c.events_rejected,
        ),
        ("kvpick_kv_event_batches_replayed_total", "Batches applied from replays.", c.replayed_batches),
        ("kvpick_kv_event_batches_duplicate_total", "Batches received twice and dropped.", c.duplicate_batches),
        (
            "kvpick_kv_event_batches_late_total",
            "Batches overtaken by a later one on the way and dropped (their gap healed by replay or counted lost).",
            c.late_batches,
        ),
        (
            "kvpick_kv_event_socket_errors_total",
            "KV-event sockets that could not be opened or failed, and drain endpoints that are not http:// URIs.",
            c.socket_errors,
        ),
    ];
    for (name, help, value) in counters {
        e.counter(name, help, &[], value);
    }
    for w in ingest.workers() {
        let name = workers.get(w.worker).map_or_else(|| format!("{:016x}", w.worker.0), |a| a.to_string());
        if let Some(lag) = w.lag_seconds {
            e.gauge(
                "kvpick_kv_event_lag_seconds",
                "Now minus the timestamp of the worker's last applied batch.",
                &[("worker", &name)],
                lag,
            );
        }
    }
}

/// The selection service's families; with a prefill selector beside it,
/// its own few and its workers among the per-worker ones.
async fn shard_families(
    e: &mut Exposition,
    producers: &ThreadProducers,
    prefill: Option<&ThreadProducers>,
    workers: &WorkerNames,
) {
    let service = producers.service();
    let stats = service.shard_stats(producers).await;
    e.gauge("kvpick_shards", "Shard threads.", &[], service.shard_count() as f64);
    e.gauge("kvpick_index_entries", "(block, worker) entries in the KV index.", &[], stats.index_entries as f64);
    e.gauge("kvpick_index_bytes", "Approximate heap bytes of the KV index.", &[], stats.index_bytes as f64);
    e.gauge(
        "kvpick_index_max_entries",
        "Entries the KV index keeps at most: --index-max-bytes less each worker's fixed cost (0: no budget).",
        &[],
        stats.index_max_entries as f64,
    );
    e.counter("kvpick_index_blocks_stored_total", "Blocks stored into the index.", &[], stats.blocks_stored);
    e.counter("kvpick_index_blocks_removed_total", "Blocks removed from the index.", &[], stats.blocks_removed);
    // Each selector's index has its own budget; a prefill selector's
    // evictions count here too.
    let prefill_evicted = match prefill {
        Some(p) => p.service().shard_stats(p).await.blocks_evicted,
        None => 0,
    };
    e.counter(
        "kvpick_index_blocks_evicted_total",
        "Blocks the index forgot to stay within --index-max-bytes (the engine may still hold them).",
        &[],
        stats.blocks_evicted + prefill_evicted,
    );
    e.counter("kvpick_index_events_rejected_total", "KV events the shards refused.", &[], stats.events_rejected);
    e.counter(
        "kvpick_reservations_expired_total",
        "Bookings freed by their lease (a lost free).",
        &[],
        stats.leases_expired,
    );
    e.gauge("kvpick_reservations_active", "Bookings held now.", &[], service.active_reservations() as f64);
    e.gauge("kvpick_queue_depth", "Requests waiting for capacity.", &[], service.queue_len() as f64);
    let s = service.stats();
    e.counter("kvpick_selections_total", "Bookings made.", &[], s.selections);
    e.counter(
        "kvpick_selections_past_tpot_target_total",
        "Bookings made with every worker's predicted decode step past --tpot-target-ms.",
        &[],
        s.past_tpot_target,
    );
    e.counter("kvpick_queue_refused_total", "Queued requests refused.", &[("reason", "full")], s.refused_queue_full);
    e.counter(
        "kvpick_queue_refused_total",
        "Queued requests refused.",
        &[("reason", "timeout")],
        s.refused_queue_timeout,
    );
    let rings = service.counters();
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    e.counter(
        "kvpick_ring_full_waits_total",
        "Pushes that found a shard ring full and waited.",
        &[],
        rings.full_waits.load(relaxed),
    );
    e.counter(
        "kvpick_glommio_nudges_total",
        "Glommio shards woken by a signal after sleeping through a producer's wake-up.",
        &[],
        rings.glommio_nudges.load(relaxed),
    );
    e.counter(
        "kvpick_ring_selections_refused_total",
        "Selections refused because a ring stayed full past the bound.",
        &[],
        rings.selections_refused.load(relaxed),
    );
    let mut loads = service.loads(producers).await;
    if let Some(prefill) = prefill {
        let side = prefill.service();
        e.gauge("kvpick_prefill_workers", "Workers of the prefill role.", &[], side.worker_count() as f64);
        e.gauge(
            "kvpick_prefill_reservations_active",
            "Prefill legs of split requests held now (released at hand-off).",
            &[],
            side.active_reservations() as f64,
        );
        e.counter("kvpick_prefill_selections_total", "Prefill legs booked.", &[], side.stats().selections);
        loads.extend(side.loads(prefill).await);
    }
    let mut named: Vec<(String, kvpick_core::LoadSnapshot)> = loads
        .into_iter()
        .map(|l| (workers.get(l.worker).map_or_else(|| format!("{:016x}", l.worker.0), |a| a.to_string()), l))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    type Field = fn(&kvpick_core::LoadSnapshot) -> f64;
    let families: [(&str, &str, Field); 6] = [
        ("kvpick_worker_prefill_tokens", "Prefill tokens booked on the worker.", |l| l.prefill_tokens as f64),
        ("kvpick_worker_active_blocks", "Decode blocks booked on the worker.", |l| l.active_blocks as f64),
        ("kvpick_worker_requests", "Requests booked on the worker.", |l| f64::from(l.requests)),
        ("kvpick_worker_cached_blocks", "Blocks the worker holds, per the index.", |l| l.cached_blocks as f64),
        (
            "kvpick_worker_block_size_mismatch",
            "The block size the worker's KV events carry when it is not kvpick's --block-size (0: they agree); its events are refused.",
            |l| f64::from(l.block_size_mismatch.unwrap_or(0)),
        ),
        (
            "kvpick_worker_schedulable",
            "1 if the worker may take new requests, 0 while its pod is not Ready (index and bookings kept).",
            |l| f64::from(u8::from(l.schedulable)),
        ),
    ];
    for (family, help, field) in families {
        for (name, load) in &named {
            e.gauge(family, help, &[("worker", name)], field(load));
        }
    }
    calibration(e, service, workers);
}

/// What calibration learned of each worker from the response stream.
fn calibration(e: &mut Exposition, service: &ShardedService, workers: &WorkerNames) {
    let (fits, fleet_scale, clipped) = service.calibration();
    if let Some(scale) = fleet_scale {
        e.gauge(
            "kvpick_calibration_fleet_ttft_scale",
            "The fleet's measured over predicted TTFT (the priors' error).",
            &[],
            scale,
        );
    }
    e.counter("kvpick_calibration_clipped_total", "TTFT samples clipped as outliers.", &[], clipped);
    let mut named: Vec<(String, kvpick_core::WorkerCalibration)> = fits
        .into_iter()
        .map(|c| (workers.get(c.worker).map_or_else(|| format!("{:016x}", c.worker.0), |a| a.to_string()), c))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, fit) in &named {
        let labels = [("worker", name.as_str())];
        e.gauge(
            "kvpick_worker_speed_factor",
            "How much slower than the fleet the latency cost takes the worker to be (1: as the fleet).",
            &labels,
            fit.speed_factor,
        );
        e.counter("kvpick_worker_ttft_samples_total", "TTFT samples taken on the worker.", &labels, fit.samples);
        if let Some(scale) = fit.ttft_scale {
            e.gauge("kvpick_worker_ttft_scale", "Measured over predicted TTFT on the worker.", &labels, scale);
        }
        if let Some(ns) = fit.decode_ns_per_token {
            e.gauge(
                "kvpick_worker_decode_seconds_per_token",
                "Moving average of the time per output token after the first.",
                &labels,
                ns / 1e9,
            );
        }
    }
}
