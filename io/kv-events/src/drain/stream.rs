//! One drained engine: what its answers mean for its worker's blocks.

use std::sync::Arc;

use kvpick_core::WorkerId;
use kvpick_core::outage::Outage;

use crate::apply::{Outlet, clear_worker, hand_over};
use crate::metrics::{WorkerMetrics, add};
use crate::wire::event_ids::EventIdTracker;
use crate::wire::trtllm_json::{Drain, decode_drain};

/// The stream state of one `trtllm-serve`, across its answers.
pub(crate) struct DrainStream {
    worker: WorkerId,
    ids: EventIdTracker,
    /// The largest attention window seen. With variable sliding-window
    /// attention the engine reports each window's blocks; only the largest
    /// (full attention) window holds whole prefixes, so the others are not
    /// indexed.
    largest_window: Option<u64>,
    gauges: Arc<WorkerMetrics>,
    /// The first failure of an outage is a warning, the rest are debug
    /// lines; [`kvpick_core::outage::ANSWERS_TO_RECOVER`] good answers in
    /// a row end it (an engine failing every other poll is one outage, not
    /// a warning each).
    outage: Outage,
}

impl DrainStream {
    pub(crate) fn new(worker: WorkerId, gauges: Arc<WorkerMetrics>) -> Self {
        DrainStream { worker, ids: EventIdTracker::default(), largest_window: None, gauges, outage: Outage::default() }
    }

    pub(crate) fn gauges(&self) -> &Arc<WorkerMetrics> {
        &self.gauges
    }

    /// Applies one answer. Lost events or a restart seen in its ids clear
    /// the worker's blocks first: what is left in the index could name
    /// blocks the engine no longer holds.
    pub(crate) fn apply(&mut self, body: &[u8], out: &mut Outlet<'_>) {
        let counters = &out.metrics.counters;
        let drain = match decode_drain(body) {
            Ok(drain) => drain,
            Err(error) => return self.failed(out, &error.to_string()),
        };
        add(&counters.drains, 1);
        if let Some(failures) = self.outage.answered() {
            tracing::info!(worker = self.worker.0, failures, "TensorRT-LLM KV event drain answering again");
        }
        let Drain { events, skipped, malformed, event_ids } = drain;
        add(&counters.events_skipped, u64::from(skipped));
        add(&counters.events_malformed, malformed.len() as u64);
        if let Some((id, why)) = malformed.first() {
            tracing::debug!(worker = self.worker.0, event_id = ?id, why, count = malformed.len(), "malformed TensorRT-LLM KV events dropped");
        }
        let verdict = self.ids.check(&event_ids);
        if verdict.index_is_stale() {
            add(&counters.gaps, u64::from(verdict.gaps));
            add(&counters.lost_events, verdict.lost);
            add(&counters.engine_restarts, u64::from(verdict.restarts));
            tracing::warn!(
                worker = self.worker.0,
                lost = verdict.lost,
                restarts = verdict.restarts,
                "TensorRT-LLM KV events lost (event buffer overflowed before a drain) or the engine restarted: its blocks cleared"
            );
            clear_worker(self.worker, out);
        }
        if let Some(largest) = events.iter().filter_map(|e| e.window_size).max() {
            self.largest_window = Some(self.largest_window.map_or(largest, |w| w.max(largest)));
        }
        for drained in events {
            let smaller_window = matches!((drained.window_size, self.largest_window), (Some(w), Some(max)) if w < max);
            if smaller_window || !drained.decoded.on_device() {
                add(&counters.events_skipped, 1);
                continue;
            }
            hand_over(self.worker, drained.decoded, out);
        }
        if let Some(last) = event_ids.last() {
            self.gauges.drained(last.id);
        }
    }

    /// The poll failed: the answer's events, if the engine sent one, are
    /// gone; the next answer's ids tell.
    pub(crate) fn failed(&mut self, out: &mut Outlet<'_>, why: &str) {
        add(&out.metrics.counters.drain_errors, 1);
        self.warn(why);
    }

    fn warn(&self, why: &str) {
        if self.outage.failed() {
            tracing::warn!(
                worker = self.worker.0,
                why,
                "TensorRT-LLM KV event drain failed (further failures logged at debug until it answers again)"
            );
        } else {
            tracing::debug!(worker = self.worker.0, why, "TensorRT-LLM KV event drain failed");
        }
    }
}
