//! The sidecar's Prometheus metrics: requests by how they ran, why a
//! request was not split or its prefill failed, each leg's latency, bytes
//! streamed back and cancels. Relaxed atomics: counted on the request path.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use kvpick_ext_proc::buckets::{Buckets, LATENCY_BUCKETS};

/// How a request on a P/D route ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Prefilled on the named prefill engine, decoded here.
    Disaggregated,
    /// Run whole on the local engine (see [`Aggregated`] for why).
    Aggregated,
    /// Answered with an error (the policy is `fail`, or the decode engine
    /// is unreachable).
    Failed,
}

/// Why a P/D route's request ran whole on the local engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aggregated {
    /// The EPP named no prefill endpoint.
    NoPrefiller,
    /// The header was not a list of `ip:port`.
    InvalidPrefiller,
    /// The endpoint is outside the allowlist.
    DeniedPrefiller,
    /// The endpoint is this decode pod.
    PrefillerIsLocal,
    /// The body is not a JSON object: it goes to the engine as it came.
    BodyNotJson,
    /// The prefill leg failed and the policy is `aggregate`.
    PrefillFailed,
}

/// Why a prefill leg failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillFailure {
    Connect,
    Timeout,
    /// A status other than 2xx.
    Status,
    /// Unreadable, too large or not JSON.
    Answer,
    /// JSON without what the decode leg needs (no transfer parameters).
    Unusable,
}

/// Where a client's cancel found the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Before the answer's headers: the prefill leg (or both, for SGLang).
    Prefill,
    /// While the answer streamed.
    Decode,
}

macro_rules! labels {
    ($t:ty, $label:literal, [$($v:ident => $name:literal),+ $(,)?]) => {
        impl $t {
            const ALL: &'static [$t] = &[$(<$t>::$v),+];
            pub fn label(self) -> &'static str {
                match self { $(<$t>::$v => $name),+ }
            }
            fn index(self) -> usize {
                self as usize
            }
        }
        impl Labelled for $t {
            const LABEL: &'static str = $label;
            fn all() -> &'static [Self] { Self::ALL }
            fn name(self) -> &'static str { self.label() }
            fn slot(self) -> usize { self.index() }
        }
    };
}

trait Labelled: Copy + 'static {
    const LABEL: &'static str;
    fn all() -> &'static [Self];
    fn name(self) -> &'static str;
    fn slot(self) -> usize;
}

labels!(Mode, "mode", [Disaggregated => "disaggregated", Aggregated => "aggregated", Failed => "failed"]);
labels!(Aggregated, "reason", [
    NoPrefiller => "no_prefiller",
    InvalidPrefiller => "invalid_prefiller",
    DeniedPrefiller => "denied_prefiller",
    PrefillerIsLocal => "prefiller_is_local",
    BodyNotJson => "body_not_json",
    PrefillFailed => "prefill_failed",
]);
labels!(PrefillFailure, "reason", [
    Connect => "connect", Timeout => "timeout", Status => "status", Answer => "answer", Unusable => "unusable",
]);
labels!(Stage, "stage", [Prefill => "prefill", Decode => "decode"]);

/// One counter per label value.
#[derive(Debug)]
struct Family<L: Labelled> {
    counts: Box<[AtomicU64]>,
    _label: std::marker::PhantomData<L>,
}

impl<L: Labelled> Family<L> {
    fn new() -> Self {
        Family { counts: L::all().iter().map(|_| AtomicU64::new(0)).collect(), _label: std::marker::PhantomData }
    }
    fn add(&self, l: L) {
        self.counts[l.slot()].fetch_add(1, Relaxed);
    }
    fn get(&self, l: L) -> u64 {
        self.counts[l.slot()].load(Relaxed)
    }
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for l in L::all() {
            let _ = writeln!(out, "{name}{{{}=\"{}\"}} {}", L::LABEL, l.name(), self.get(*l));
        }
    }
}

#[derive(Debug)]
pub struct SidecarMetrics {
    requests: Family<Mode>,
    aggregated: Family<Aggregated>,
    prefill_failures: Family<PrefillFailure>,
    cancelled: Family<Stage>,
    passthrough: AtomicU64,
    decode_unreachable: AtomicU64,
    response_bytes: AtomicU64,
    inflight: AtomicI64,
    prefill_seconds: Buckets,
    decode_first_byte_seconds: Buckets,
    request_seconds: Buckets,
}

impl Default for SidecarMetrics {
    fn default() -> Self {
        SidecarMetrics {
            requests: Family::new(),
            aggregated: Family::new(),
            prefill_failures: Family::new(),
            cancelled: Family::new(),
            passthrough: AtomicU64::new(0),
            decode_unreachable: AtomicU64::new(0),
            response_bytes: AtomicU64::new(0),
            inflight: AtomicI64::new(0),
            prefill_seconds: Buckets::new(LATENCY_BUCKETS),
            decode_first_byte_seconds: Buckets::new(LATENCY_BUCKETS),
            request_seconds: Buckets::new(LATENCY_BUCKETS),
        }
    }
}

/// What tests and the demo read back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub disaggregated: u64,
    pub aggregated: u64,
    pub failed: u64,
    pub passthrough: u64,
    pub prefill_failures: u64,
    pub cancelled_prefill: u64,
    pub cancelled_decode: u64,
    pub decode_unreachable: u64,
    pub response_bytes: u64,
    pub inflight: i64,
    /// Completed requests (their answer streamed to its end).
    pub completed: u64,
}

impl SidecarMetrics {
    pub(crate) fn ran(&self, mode: Mode) {
        self.requests.add(mode);
    }
    pub(crate) fn aggregated(&self, why: Aggregated) {
        self.aggregated.add(why);
    }
    pub(crate) fn prefill_failed(&self, why: PrefillFailure) {
        self.prefill_failures.add(why);
    }
    pub(crate) fn cancelled(&self, stage: Stage) {
        self.cancelled.add(stage);
    }
    pub(crate) fn passthrough(&self) {
        self.passthrough.fetch_add(1, Relaxed);
    }
    pub(crate) fn decode_unreachable(&self) {
        self.decode_unreachable.fetch_add(1, Relaxed);
    }
    pub(crate) fn streamed(&self, bytes: usize) {
        self.response_bytes.fetch_add(bytes as u64, Relaxed);
    }
    pub(crate) fn enter(&self) {
        self.inflight.fetch_add(1, Relaxed);
    }
    pub(crate) fn leave(&self) {
        self.inflight.fetch_sub(1, Relaxed);
    }
    pub(crate) fn prefill_leg(&self, elapsed: std::time::Duration) {
        self.prefill_seconds.observe_duration(elapsed);
    }
    pub(crate) fn decode_first_byte(&self, elapsed: std::time::Duration) {
        self.decode_first_byte_seconds.observe_duration(elapsed);
    }
    pub(crate) fn request_done(&self, elapsed: std::time::Duration) {
        self.request_seconds.observe_duration(elapsed);
    }

    /// How many requests failed their prefill for `why`.
    pub fn prefill_failures(&self, why: PrefillFailure) -> u64 {
        self.prefill_failures.get(why)
    }

    /// How many ran whole for `why`.
    pub fn aggregated_for(&self, why: Aggregated) -> u64 {
        self.aggregated.get(why)
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            disaggregated: self.requests.get(Mode::Disaggregated),
            aggregated: self.requests.get(Mode::Aggregated),
            failed: self.requests.get(Mode::Failed),
            passthrough: self.passthrough.load(Relaxed),
            prefill_failures: PrefillFailure::ALL.iter().map(|w| self.prefill_failures.get(*w)).sum(),
            cancelled_prefill: self.cancelled.get(Stage::Prefill),
            cancelled_decode: self.cancelled.get(Stage::Decode),
            decode_unreachable: self.decode_unreachable.load(Relaxed),
            response_bytes: self.response_bytes.load(Relaxed),
            inflight: self.inflight.load(Relaxed),
            completed: self.request_seconds.snapshot().count(),
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.requests.render(&mut out, "kvpick_sidecar_requests_total", "Requests on the P/D routes, by how they ran.");
        self.aggregated.render(
            &mut out,
            "kvpick_sidecar_aggregated_total",
            "Requests on the P/D routes run whole on the local engine, by why.",
        );
        self.prefill_failures.render(
            &mut out,
            "kvpick_sidecar_prefill_failures_total",
            "Prefill legs that failed, by why.",
        );
        self.cancelled.render(&mut out, "kvpick_sidecar_cancelled_total", "Requests the client cancelled, by stage.");
        for (name, help, value) in [
            (
                "kvpick_sidecar_passthrough_total",
                "Requests on other routes, forwarded to the local engine unchanged.",
                self.passthrough.load(Relaxed),
            ),
            (
                "kvpick_sidecar_decode_unreachable_total",
                "Requests the local decode engine did not take (connect or send failed).",
                self.decode_unreachable.load(Relaxed),
            ),
            (
                "kvpick_sidecar_response_bytes_total",
                "Answer body bytes streamed back from the decode engine.",
                self.response_bytes.load(Relaxed),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP kvpick_sidecar_inflight Requests being served.\n# TYPE kvpick_sidecar_inflight gauge\nkvpick_sidecar_inflight {}",
            self.inflight.load(Relaxed)
        );
        for (name, help, buckets) in [
            (
                "kvpick_sidecar_prefill_leg_seconds",
                "The prefill leg, from sending it to its whole answer.",
                &self.prefill_seconds,
            ),
            (
                "kvpick_sidecar_decode_first_byte_seconds",
                "The decode leg, from sending it to its answer's first body byte.",
                &self.decode_first_byte_seconds,
            ),
            (
                "kvpick_sidecar_request_seconds",
                "A request, from its arrival to its answer's end.",
                &self.request_seconds,
            ),
        ] {
            let s = buckets.snapshot();
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (bound, count) in s.bounds.iter().zip(&s.cumulative) {
                let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
            }
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}",
                s.count(),
                s.sum,
                s.count()
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_value_is_exported_and_counts_add_up() {
        let m = SidecarMetrics::default();
        m.ran(Mode::Disaggregated);
        m.aggregated(Aggregated::PrefillFailed);
        m.prefill_failed(PrefillFailure::Timeout);
        m.request_done(std::time::Duration::from_millis(3));
        let text = m.render();
        assert!(text.contains("kvpick_sidecar_requests_total{mode=\"disaggregated\"} 1"), "{text}");
        assert!(text.contains("kvpick_sidecar_aggregated_total{reason=\"prefill_failed\"} 1"));
        assert!(text.contains("kvpick_sidecar_aggregated_total{reason=\"no_prefiller\"} 0"));
        assert!(text.contains("kvpick_sidecar_prefill_failures_total{reason=\"timeout\"} 1"));
        assert!(text.contains("kvpick_sidecar_request_seconds_count 1"));
        assert_eq!(m.snapshot().completed, 1);
        assert_eq!(m.snapshot().prefill_failures, 1);
    }
}
