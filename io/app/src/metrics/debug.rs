//! The debug view on the metrics port, off unless `--debug-endpoints`:
//! `GET /debug/workers` (each worker's bookings, cache, fitted speed,
//! event lag and block-size flag) and `POST /debug/explain` (for a request
//! body: every candidate's overlap, load and cost, and the pick, booking
//! nothing). JSON, for `kvpick inspect` and for people; it answers the
//! question users of KV routing ask most: why did it pick that pod?

use kvpick_ext_proc::body::{RequestBody, api_of_path};
use kvpick_ext_proc::{BodyInput, PickInput, RequestTrace};
use kvpick_router::KvPicker;
use serde_json::{Value, json};

use super::collect::Sources;

/// Largest body `/debug/explain` reads.
pub const MAX_EXPLAIN_BYTES: usize = 16 << 20;

/// `/debug/workers`: one object per worker, by endpoint.
pub async fn workers(sources: &Sources) -> Value {
    let Some(producers) = &sources.service else { return json!([]) };
    let service = producers.service();
    let mut loads: Vec<(&str, kvpick_core::LoadSnapshot)> =
        service.loads(producers).await.into_iter().map(|l| ("decode", l)).collect();
    if let Some(prefill) = &sources.prefill {
        loads.extend(prefill.service().loads(prefill).await.into_iter().map(|l| ("prefill", l)));
    }
    let (mut calibration, fleet_scale, _) = service.calibration();
    if let Some(prefill) = &sources.prefill {
        calibration.extend(prefill.service().calibration().0);
    }
    let lags = sources.ingest.as_ref().map(|i| i.workers()).unwrap_or_default();
    let mut rows: Vec<Value> = loads
        .iter()
        .map(|(role, l)| {
            let fit = calibration.iter().find(|c| c.worker == l.worker);
            let lag = lags.iter().find(|w| w.worker == l.worker).and_then(|w| w.lag_seconds);
            json!({
                "worker": sources.workers.get(l.worker).map_or_else(|| format!("{:016x}", l.worker.0), |a| a.to_string()),
                "id": format!("{:016x}", l.worker.0),
                "selector": role,
                "requests": l.requests,
                "prefill_tokens": l.prefill_tokens,
                "active_blocks": l.active_blocks,
                "cached_blocks": l.cached_blocks,
                "block_size_mismatch": l.block_size_mismatch,
                "speed_factor": fit.map_or(1.0, |f| f.speed_factor),
                "ttft_scale": fit.and_then(|f| f.ttft_scale),
                "ttft_samples": fit.map_or(0, |f| f.samples),
                "decode_seconds_per_token": fit.and_then(|f| f.decode_ns_per_token).map(|ns| ns / 1e9),
                "kv_event_lag_seconds": lag,
            })
        })
        .collect();
    rows.sort_by(|a, b| a["worker"].as_str().cmp(&b["worker"].as_str()));
    json!({ "fleet_ttft_scale": fleet_scale, "workers": rows })
}

/// `/debug/explain` for `body` sent to `path` (default the chat route):
/// `Err` is the status and message to answer with.
pub async fn explain(
    sources: &Sources,
    picker: &KvPicker,
    path: &str,
    body: bytes::Bytes,
) -> Result<Value, (u16, String)> {
    let parsed = RequestBody::parse(&body, api_of_path(path)).map_err(|e| (e.status(), e.to_string()))?;
    let session = parsed.session_id.clone();
    let input =
        PickInput { body: Some(BodyInput { bytes: body, parsed }), allowed: None, session, trace: RequestTrace::off() };
    let explained = picker.explain(input).await.map_err(|e| (e.status(), e.to_string()))?;
    let name =
        |w: kvpick_core::WorkerId| sources.workers.get(w).map_or_else(|| format!("{:016x}", w.0), |a| a.to_string());
    let candidates: Vec<Value> = explained
        .candidates
        .iter()
        .map(|(c, cost)| {
            json!({
                "worker": name(c.worker),
                "overlap_blocks": c.overlap_blocks,
                "booked_prefix_blocks": c.booked_prefix_blocks,
                "uncached_tokens": c.uncached_tokens(explained.isl_tokens),
                "prefill_tokens_booked": c.active_prefill_tokens,
                "active_blocks": c.active_blocks,
                "requests": c.active_requests,
                "total_kv_blocks": c.total_kv_blocks,
                "speed": c.speed,
                "eviction_pressure": c.eviction_pressure,
                "cost": cost,
                "picked": c.worker == explained.selection.worker,
            })
        })
        .collect();
    Ok(json!({
        "prompt_tokens": explained.isl_tokens,
        "tokenized": explained.tokens_known,
        "session_worker": explained.sticky.map(name),
        "cost_unit": cost_unit(sources),
        "picked": name(explained.selection.worker),
        "candidates": candidates,
    }))
}

/// What a cost is counted in, under the service's cost model.
fn cost_unit(sources: &Sources) -> &'static str {
    let latency = sources
        .service
        .as_ref()
        .is_some_and(|p| matches!(p.service().policy().config().cost, kvpick_core::CostModel::Latency(_)));
    if latency { "ns of predicted time to first token" } else { "blocks (Dynamo's cost)" }
}
