//! From a payload frame to events in the sink, counted.
//!
//! Decoding is `crate::wire::decode_batch`; which events are indexed
//! follows the decoder's rules: only full-attention groups (judged by a
//! per-publisher [`GroupKinds`]) and only blocks on the GPU. The seed of a
//! `Stored` event is the decoder's `HashSeed::new(lora_name, cache_salt)`.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::wire::{DecodedEvent, GroupKinds, decode_batch};
use kvpick_core::index::EventError;
use kvpick_core::{KvEvent, WorkerId};

use super::metrics::{IngestMetrics, WorkerMetrics, add};
use super::sink::{KvEventSink, SinkOutcome};

/// What every publisher's batches go to.
pub(crate) struct Outlet<'a> {
    pub sink: &'a mut dyn KvEventSink,
    pub metrics: &'a IngestMetrics,
}

/// One publisher's decoding state.
#[derive(Debug)]
pub(crate) struct BatchApplier {
    worker: WorkerId,
    groups: GroupKinds,
    /// The first undecodable payload is a warning, the rest debug lines
    /// (a misconfigured engine would otherwise flood the log).
    warned: bool,
}

impl BatchApplier {
    pub(crate) fn new(worker: WorkerId) -> Self {
        BatchApplier { worker, groups: GroupKinds::new(), warned: false }
    }

    /// Decodes batch `seq` and hands its indexable events to the sink in
    /// order. A payload that does not decode is counted and skipped.
    pub(crate) fn apply(&mut self, seq: u64, payload: &[u8], out: &mut Outlet<'_>, gauges: &WorkerMetrics) {
        let counters = &out.metrics.counters;
        let batch = match decode_batch(payload) {
            Ok(batch) => batch,
            Err(error) => {
                add(&counters.decode_errors, 1);
                if std::mem::replace(&mut self.warned, true) {
                    tracing::debug!(worker = self.worker.0, seq, %error, "undecodable KV event batch skipped");
                } else {
                    tracing::warn!(worker = self.worker.0, seq, %error, "undecodable KV event batch skipped (further ones logged at debug)");
                }
                return;
            }
        };
        add(&counters.batches_applied, 1);
        add(&counters.events_skipped, u64::from(batch.skipped_unknown));
        add(&counters.events_malformed, batch.malformed.len() as u64);
        for event in batch.events {
            if !self.groups.should_index(&event) || !event.on_device() {
                add(&counters.events_skipped, 1);
                continue;
            }
            hand_over(self.worker, event, out);
        }
        gauges.applied(seq, now_seconds() - batch.ts);
    }

    pub(crate) fn groups(&self) -> &GroupKinds {
        &self.groups
    }

    /// Groups' kinds as a peer replica's stream learned them (warm start).
    pub(crate) fn seed_groups(&mut self, groups: GroupKinds) {
        self.groups = groups;
    }

    /// The engine restarted: forget its blocks and its groups' kinds.
    pub(crate) fn clear(&mut self, out: &mut Outlet<'_>) {
        self.groups.clear();
        clear_worker(self.worker, out);
    }
}

/// Hands one indexable event to the sink and counts what became of it.
pub(crate) fn hand_over(worker: WorkerId, event: DecodedEvent, out: &mut Outlet<'_>) {
    let counters = &out.metrics.counters;
    let blocks = event.block_hashes().len() as u64;
    match out.sink.apply(worker, event.event) {
        SinkOutcome::Applied(_) | SinkOutcome::Queued => {
            add(&counters.events_applied, 1);
            add(&counters.blocks_applied, blocks);
        }
        SinkOutcome::Rejected(EventError::UnknownParent(_)) => {
            add(&counters.unknown_parent_events, 1);
            add(&counters.orphan_blocks, blocks);
        }
        SinkOutcome::Rejected(error) => {
            add(&counters.events_rejected, 1);
            tracing::debug!(worker = worker.0, %error, "KV event refused by the index");
        }
    }
}

/// Forgets every block of the worker (its engine restarted, or its events
/// were lost).
pub(crate) fn clear_worker(worker: WorkerId, out: &mut Outlet<'_>) {
    if let SinkOutcome::Rejected(error) = out.sink.apply(worker, KvEvent::Cleared) {
        add(&out.metrics.counters.events_rejected, 1);
        tracing::debug!(worker = worker.0, %error, "clearing a worker's blocks refused");
    }
}

pub(crate) fn now_seconds() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
