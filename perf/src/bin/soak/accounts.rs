//! Every warning and error kvpick logs must be accounted for by a counter
//! an operator can alert on: the soak holds the log's WARN and ERROR lines
//! against the counters they stand for, and fails a run that logs one no
//! counter saw move.

use crate::serve::{LogSummary, Scrape, family_sum};

/// A log message (its start: some carry a reason after it) and the
/// counters that count what it tells (any one of them must move).
const ACCOUNTS: [(&str, &[&str]); 15] = [
    ("tokenizer failing", &["kvpick_tokenizer_errors_total"]),
    ("KV event batches lost", &["kvpick_kv_event_batches_lost_total"]),
    ("KV event replay ", &["kvpick_kv_event_replays_failed_total"]),
    ("KV event message skipped", &["kvpick_kv_event_bad_frames_total"]),
    ("undecodable KV event batch", &["kvpick_kv_event_decode_errors_total"]),
    ("KV event socket receive failed", &["kvpick_kv_event_socket_errors_total"]),
    ("cannot subscribe to KV events", &["kvpick_kv_event_socket_errors_total"]),
    ("TensorRT-LLM KV event drain failed", &["kvpick_kv_event_drain_errors_total"]),
    (
        "TensorRT-LLM KV events lost",
        &["kvpick_kv_events_lost_total", "kvpick_kv_event_engine_restarts_total", "kvpick_kv_event_gaps_total"],
    ),
    ("gateway served an endpoint kvpick could not move the booking to", &["kvpick_served_endpoint_mismatch_total"]),
    // Discovery's watches, by resource (`{resource} watch failed (…)`,
    // `… watch refused (…)`), and the kube client's own line for an API
    // server's error status.
    ("inferencepools watch", &["kvpick_discovery_watch_errors_total"]),
    ("pods watch", &["kvpick_discovery_watch_errors_total"]),
    ("endpointslices watch", &["kvpick_discovery_watch_errors_total"]),
    ("failed with status ", &["kvpick_discovery_watch_errors_total"]),
    ("workers file not applied", &["kvpick_discovery_workers_file_errors_total"]),
];

/// Counters of things gone wrong, summed in each sample.
pub const ERRORS: [&str; 10] = [
    "kvpick_tokenizer_errors_total",
    "kvpick_ext_proc_stream_errors_total",
    "kvpick_kv_event_bad_frames_total",
    "kvpick_kv_event_decode_errors_total",
    "kvpick_kv_event_replays_failed_total",
    "kvpick_kv_event_batches_lost_total",
    "kvpick_kv_event_drain_errors_total",
    "kvpick_kv_event_socket_errors_total",
    "kvpick_kv_events_lost_total",
    "kvpick_queue_refused_total",
];

/// One WARN or ERROR message of the log, and what accounts for it.
#[derive(Clone, Debug)]
pub struct Account {
    pub level: String,
    pub message: String,
    pub lines: u64,
    /// The counters that stand for it, `None` when none does.
    pub counters: Option<&'static [&'static str]>,
    /// How far they rose over the run, together (from 0: kvpick's
    /// counters start there, and a warning logged at start may move its
    /// counter before the soak's first scrape).
    pub rose: f64,
}

impl Account {
    pub fn settled(&self) -> bool {
        self.counters.is_some() && self.rose > 0.0
    }
}

/// The log's WARN and ERROR messages, each with its counters' values in
/// `last`, the scrape at the end of the run.
pub fn accounts(log: &LogSummary, last: &Scrape) -> Vec<Account> {
    log.by_message
        .iter()
        .map(|((level, message), &lines)| {
            let counters = ACCOUNTS.iter().find(|(start, _)| message.starts_with(start)).map(|(_, c)| *c);
            let rose =
                counters.unwrap_or_default().iter().map(|family| family_sum(last, family)).fold(0.0, |a, b| a + b);
            Account { level: level.clone(), message: message.clone(), lines, counters, rose }
        })
        .collect()
}

/// Σ of [`ERRORS`] in one scrape.
pub fn errors(scrape: &Scrape) -> f64 {
    ERRORS.iter().map(|family| family_sum(scrape, family)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_settled_by_its_counter_rising_and_only_then() {
        let mut log = LogSummary::default();
        log.by_message.insert(("WARN".into(), "KV event replay timed out".into()), 2);
        log.by_message.insert(("WARN".into(), "tokenizer failing: routing by load alone".into()), 1);
        log.by_message.insert(("ERROR".into(), "something nobody counts".into()), 1);
        let last = Scrape::from([
            ("kvpick_tokenizer_errors_total".to_owned(), 0.0),
            ("kvpick_kv_event_replays_failed_total".to_owned(), 2.0),
        ]);
        let settled: Vec<(String, bool)> =
            accounts(&log, &last).into_iter().map(|a| (a.message.clone(), a.settled())).collect();
        assert_eq!(
            settled,
            [
                ("something nobody counts".to_owned(), false),
                ("KV event replay timed out".to_owned(), true),
                ("tokenizer failing: routing by load alone".to_owned(), false),
            ]
        );
    }
}
