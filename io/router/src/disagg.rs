//! Disaggregated prefill/decode: when a request is split, and the booking
//! that ties its two legs together.
//!
//! A pick in a fleet with prefill workers is a small saga, one plan per
//! request. Its id is minted once and qualifies a reservation in each
//! role's selection service (the services are separate ledgers, so the
//! same number names the prefill leg in one and the decode leg in the
//! other; logs say which by role). Both legs are selected at once; the
//! plan commits only when both are booked and the decider agrees, and
//! otherwise the leg that is not needed is compensated (freed, or
//! dropped before it booked; the prefill leg never queues) and the request
//! goes to the decode worker whole. Every leg is a lease-bounded reservation, so a leg
//! orphaned by a crash between the two is freed by its lease.
//!
//! Lifecycle: the decode booking stops counting prefill the moment the
//! plan commits (its worker receives the KV blocks instead of computing
//! them); the prefill booking is released at hand-off: the decode
//! sidecar's `x-kvpick-pd` response header when the decode pod runs
//! `kvpick sidecar` (it comes as the prefill leg ends), else the first
//! response chunk (the decode side has the KV blocks by then); the decode booking
//! lives to completion, cancel or error, renewed while the answer streams.
//! When the sidecar runs a split request whole after all (its prefill leg
//! failed, or it refused the prefiller), the decode booking counts the
//! prompt as prefill again from that header to the first token.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};

use kvpick_core::{EndpointFilter, WorkerId};
use kvpick_ext_proc::Booking;
use kvpick_ext_proc::headers::PdRan;
use kvpick_ext_proc::metrics::PdRoute;

use crate::reservation::{Release, Reservation};

/// Settings of disaggregated routing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisaggConfig {
    /// Split a request only when the part of its prompt the chosen decode
    /// worker does not hold is at least this many tokens; shorter suffixes
    /// are prefilled where they are decoded (llm-d's prefix-based decider;
    /// 0 splits every request a prefill worker can take).
    pub threshold_tokens: u32,
    /// Also keep a request whole when its decode worker, prefilling it
    /// there, is predicted to give the first token sooner than the prefill
    /// worker would (both legs' latency-cost predictions; without them,
    /// as with `--cost dynamo`, this test is skipped).
    pub compare_ttft: bool,
}

/// A few blocks of prefill cost less on the decode worker than a round
/// trip to a prefill worker and a KV transfer. llm-d's prefix-based
/// decider documents the same test with its own threshold; this default
/// is the one the routing simulator's P/D runs are measured with.
pub const DEFAULT_THRESHOLD_TOKENS: u32 = 256;

/// Whether the decider compares the two legs' predicted times to first
/// token by default. In the routing simulator's P/D runs at 120% load
/// (perf/results/2026-12-02-pd.md) it cut TTFT p90 by 14–30% on chat and
/// agentic work for 1–2 ms of TPOT p90, and on shared-prefix raised
/// goodput on 2+6 engines (16.4 → 19.5 requests/s) while costing 2% on
/// 4+4 (17.0 → 16.7).
pub const DEFAULT_COMPARE_TTFT: bool = true;

/// The prefill side's default queue threshold: a request is not split
/// while every prefill worker has more than this many steps' worth
/// (× `max_num_batched_tokens`) of prefill booked; it is prefilled on its
/// decode worker instead. Without it an undersized prefill side queues
/// without bound: in the routing simulator's shared-prefix workload at
/// 120% load on 2 prefill + 6 decode engines, this rule alone took TTFT
/// p90 from 126 s to 1.1 s and goodput from 0.3 to 16.4 requests/s
/// (perf/results/2026-12-02-pd.md).
pub const DEFAULT_PREFILL_QUEUE_THRESHOLD: f64 = 2.0;

impl Default for DisaggConfig {
    fn default() -> Self {
        DisaggConfig { threshold_tokens: DEFAULT_THRESHOLD_TOKENS, compare_ttft: DEFAULT_COMPARE_TTFT }
    }
}

impl DisaggConfig {
    /// Whether `uncached` tokens are enough to split for. Also asked of a
    /// whole prompt before any leg: with fewer than the threshold, no
    /// decode worker can miss enough of it, so the prefill leg is not even
    /// tried.
    pub fn may_split(&self, uncached: u32) -> bool {
        uncached >= self.threshold_tokens.max(1)
    }

    /// The decider, given what the decode leg found (how many prompt
    /// tokens its worker would compute itself, and its predicted time to
    /// first token doing so) and what the prefill leg came to (its
    /// predicted time to first token, or why there is none).
    pub fn decide(&self, decode: Leg, prefill: Result<Leg, PdRoute>) -> PdRoute {
        match prefill {
            Err(why) => why,
            Ok(_) if !self.may_split(decode.uncached) => PdRoute::ShortUncached,
            Ok(prefill) if self.compare_ttft && decode.sooner_than(&prefill) => PdRoute::DecodeSooner,
            Ok(_) => PdRoute::Disaggregated,
        }
    }
}

/// Decode workers that cannot run a request whole: SGLang's decode mode
/// (`--disaggregation-mode decode`) refuses any request without a
/// bootstrap room, so a request picked onto one is split whatever the
/// decider would say, waits for a prefill worker if every one is
/// saturated, and fails with 503 when there is none. When no split is
/// possible at all, picks avoid them (`avoid_in`). Kept by whoever
/// applies discovery's updates; read by every pick (uncontended reads:
/// it changes only when such a worker comes or goes).
#[derive(Debug, Default)]
pub struct DecodeOnly {
    /// Each decode-only worker's endpoint.
    workers: RwLock<HashMap<WorkerId, SocketAddr>>,
    /// Set while `workers` is not empty: a fleet without such workers
    /// never takes the lock.
    any: AtomicBool,
}

impl DecodeOnly {
    /// Marks `worker` as decode only, reachable at `endpoint` (`Some`), or
    /// as able to run a request whole (`None`).
    pub fn set(&self, worker: WorkerId, decode_only_at: Option<SocketAddr>) {
        let mut workers = self.workers.write().unwrap_or_else(PoisonError::into_inner);
        match decode_only_at {
            Some(endpoint) => workers.insert(worker, endpoint),
            None => workers.remove(&worker),
        };
        self.any.store(!workers.is_empty(), Ordering::Release);
    }

    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    pub fn contains(&self, worker: WorkerId) -> bool {
        self.any() && self.workers.read().unwrap_or_else(PoisonError::into_inner).contains_key(&worker)
    }

    /// `allowed` (every endpoint if `None`) avoiding the decode-only
    /// workers: the candidates of a request that must run whole.
    pub fn avoid_in(&self, allowed: Option<EndpointFilter>) -> EndpointFilter {
        let mut filter = allowed.unwrap_or_else(EndpointFilter::any);
        for endpoint in self.workers.read().unwrap_or_else(PoisonError::into_inner).values() {
            filter.avoid_addr(*endpoint);
        }
        filter
    }
}

/// What one leg's selection found, for the decider.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Leg {
    /// Prompt tokens its worker would compute.
    pub uncached: u32,
    /// The latency cost's predicted time to first token there.
    pub predicted_ttft_ns: Option<f64>,
}

impl Leg {
    pub fn of(selection: &kvpick_core::Selection) -> Leg {
        Leg { uncached: selection.prefill_tokens, predicted_ttft_ns: selection.predicted_ttft_ns }
    }

    fn sooner_than(&self, other: &Leg) -> bool {
        matches!((self.predicted_ttft_ns, other.predicted_ttft_ns), (Some(a), Some(b)) if a < b)
    }
}

/// What one request booked: its decode (or whole-request) reservation and,
/// while a split request's prefill has not handed over, the prefill one.
pub struct PlanBooking<R: Release> {
    pub(crate) decode: Reservation<R>,
    pub(crate) prefill: Option<Reservation<R>>,
    /// Prefilled elsewhere: the decode leg's first token is no prefill's end.
    split: bool,
}

impl<R: Release> std::fmt::Debug for PlanBooking<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanBooking").field("decode", &self.decode).field("prefill", &self.prefill).finish()
    }
}

impl<R: Release> PlanBooking<R> {
    pub(crate) fn aggregated(decode: Reservation<R>) -> Self {
        PlanBooking { decode, prefill: None, split: false }
    }

    /// Commits a split: the decode worker computes none of the prompt.
    pub(crate) fn disaggregated(mut decode: Reservation<R>, prefill: Reservation<R>) -> Self {
        decode.prefill_elsewhere();
        PlanBooking { decode, prefill: Some(prefill), split: true }
    }

    /// Whether the prefill leg is still held.
    pub fn holds_prefill(&self) -> bool {
        self.prefill.is_some()
    }
}

impl<R: Release> Booking for PlanBooking<R> {
    /// The first chunk: a split request's prefill worker has handed over,
    /// so its booking goes (its time to first token, transfer included, is
    /// that worker's sample); an aggregated one's prompt is done.
    fn prefill_complete(&mut self, streamed: bool) {
        if let Some(mut prefill) = self.prefill.take() {
            prefill.prefill_complete(streamed);
        }
        if self.split {
            self.decode.first_token(streamed);
        } else {
            self.decode.prefill_complete(streamed);
        }
    }

    /// The decode sidecar's hand-off: the prefill leg is over (or never
    /// ran), so its booking goes now. Timed (split, and streamed from the
    /// pick): the time since the pick is the prefill worker's own time to first
    /// token, without the transfer and the decode worker's first step
    /// that the first chunk would add. Run whole after all (the sidecar
    /// fell back, or refused the prefiller) and streamed: the decode
    /// worker is computing the prompt, so its booking counts it again
    /// until the first chunk.
    fn prefill_handed_off(&mut self, ran: PdRan, event_stream: bool, timed: bool) {
        let Some(mut prefill) = self.prefill.take() else { return };
        prefill.prefill_complete(ran == PdRan::Disaggregated && timed);
        drop(prefill);
        // A non-streamed answer's headers come with the whole answer: its
        // prompt is long computed by now.
        if ran == PdRan::Aggregated && event_stream {
            self.decode.prefill_here();
            self.split = false;
        }
    }

    fn response_finished(&mut self, output_tokens: u64) {
        self.decode.response_finished(output_tokens);
    }

    fn response_progress(&mut self) {
        self.decode.response_progress();
    }

    /// The gateway served another endpoint than the decode pick: the
    /// decode load is there now (the prefill leg is unaffected).
    fn served_by(&mut self, endpoint: SocketAddr) {
        self.decode.served_by(endpoint);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use kvpick_core::{ReservationId, Selection, WorkerId};

    use super::*;
    use crate::reservation::TtftSample;

    #[test]
    fn the_decider_splits_long_uncached_suffixes_only() {
        let config = DisaggConfig { threshold_tokens: 256, compare_ttft: false };
        let decode = |uncached| Leg { uncached, predicted_ttft_ns: Some(1e6) };
        let prefill = Ok(Leg { uncached: 4_000, predicted_ttft_ns: Some(9e6) });
        assert_eq!(config.decide(decode(256), prefill), PdRoute::Disaggregated);
        assert_eq!(config.decide(decode(255), prefill), PdRoute::ShortUncached);
        assert_eq!(config.decide(decode(4_000), Err(PdRoute::PrefillSaturated)), PdRoute::PrefillSaturated);
        assert!(config.may_split(256) && !config.may_split(255));
        // 0: every request a prefill worker takes is split, except an empty one.
        let always = DisaggConfig { threshold_tokens: 0, compare_ttft: false };
        assert_eq!(always.decide(decode(1), prefill), PdRoute::Disaggregated);
        assert!(always.may_split(1) && !always.may_split(0));
    }

    #[test]
    fn comparing_predictions_keeps_a_request_whole_where_it_would_start_sooner() {
        let config = DisaggConfig { threshold_tokens: 16, compare_ttft: true };
        let leg = |ns: Option<f64>| Leg { uncached: 1_000, predicted_ttft_ns: ns };
        assert_eq!(config.decide(leg(Some(1e6)), Ok(leg(Some(2e6)))), PdRoute::DecodeSooner);
        assert_eq!(config.decide(leg(Some(2e6)), Ok(leg(Some(2e6)))), PdRoute::Disaggregated, "a tie splits");
        assert_eq!(config.decide(leg(Some(3e6)), Ok(leg(Some(2e6)))), PdRoute::Disaggregated);
        assert_eq!(config.decide(leg(None), Ok(leg(None))), PdRoute::Disaggregated, "no predictions, no test");
        let off = DisaggConfig { compare_ttft: false, ..config };
        assert_eq!(off.decide(leg(Some(1e6)), Ok(leg(Some(2e6)))), PdRoute::Disaggregated);
    }

    /// What each leg's picker was told, as (role, event).
    #[derive(Clone)]
    struct Log(Arc<Mutex<Vec<(&'static str, &'static str)>>>, &'static str);

    impl Release for Log {
        fn prefill_complete(&self, _: ReservationId, ttft: Option<TtftSample>) {
            let event = if ttft.is_some() { "prefill_complete+ttft" } else { "prefill_complete" };
            self.0.lock().unwrap().push((self.1, event));
        }
        fn free(&self, _: ReservationId) {
            self.0.lock().unwrap().push((self.1, "free"));
        }
        fn renew(&self, _: ReservationId) {
            self.0.lock().unwrap().push((self.1, "renew"));
        }
        fn moved(&self, _: ReservationId, _: SocketAddr) {
            self.0.lock().unwrap().push((self.1, "moved"));
        }
        fn prefill_restored(&self, _: ReservationId) {
            self.0.lock().unwrap().push((self.1, "prefill_restored"));
        }
        fn decode_observed(&self, _: WorkerId, _: u64, _: Duration) {
            self.0.lock().unwrap().push((self.1, "decode_observed"));
        }
    }

    fn booked(log: &Log) -> Reservation<Log> {
        let mut r = Reservation::new(ReservationId(7), log.clone(), Duration::from_secs(300));
        r.booked(&Selection {
            id: ReservationId(7),
            worker: WorkerId(1),
            endpoint: "10.0.0.1:8000".parse().unwrap(),
            overlap_blocks: 0,
            prefill_tokens: 512,
            isl_tokens: 512,
            cost: 0.0,
            predicted_ttft_ns: Some(1e6),
            candidates: 1,
            fallbacks: Vec::new(),
            past_tpot_target: false,
        });
        r
    }

    #[test]
    fn a_split_releases_prefill_at_hand_off_and_decode_at_the_end() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let (decode, prefill) = (Log(events.clone(), "decode"), Log(events.clone(), "prefill"));
        let mut plan = PlanBooking::disaggregated(booked(&decode), booked(&prefill));
        assert_eq!(
            *events.lock().unwrap(),
            [("decode", "prefill_complete")],
            "decode stops counting prefill at commit"
        );
        assert!(plan.holds_prefill());
        plan.prefill_complete(true);
        assert!(!plan.holds_prefill());
        plan.prefill_complete(true);
        plan.response_progress();
        plan.response_finished(8);
        drop(plan);
        assert_eq!(
            *events.lock().unwrap(),
            [
                ("decode", "prefill_complete"),
                ("prefill", "prefill_complete+ttft"),
                ("prefill", "free"),
                ("decode", "decode_observed"),
                ("decode", "free"),
            ],
            "the prefill worker gets the first token's time and is freed at once; the decode worker its decode \
             time; the decode booking is freed once, at the end"
        );
    }

    #[test]
    fn the_sidecars_hand_off_releases_prefill_before_the_first_token() {
        for (ran, streamed, event) in [
            (PdRan::Disaggregated, true, "prefill_complete+ttft"),
            (PdRan::Disaggregated, false, "prefill_complete"),
            (PdRan::Failed, true, "prefill_complete"),
        ] {
            let events = Arc::new(Mutex::new(Vec::new()));
            let (decode, prefill) = (Log(events.clone(), "decode"), Log(events.clone(), "prefill"));
            let mut plan = PlanBooking::disaggregated(booked(&decode), booked(&prefill));
            plan.prefill_handed_off(ran, streamed, streamed);
            assert!(!plan.holds_prefill());
            assert_eq!(events.lock().unwrap()[1..], [("prefill", event), ("prefill", "free")], "{ran:?}");
            // The first token then times the decode only; nothing is released twice.
            plan.prefill_complete(true);
            plan.prefill_handed_off(PdRan::Aggregated, true, true);
            plan.response_finished(8);
            drop(plan);
            assert_eq!(events.lock().unwrap()[3..], [("decode", "decode_observed"), ("decode", "free")], "{ran:?}");
        }
        // Without a prefill leg, a hand-off changes nothing, whatever it says.
        for ran in [PdRan::Disaggregated, PdRan::Aggregated, PdRan::Failed] {
            let events = Arc::new(Mutex::new(Vec::new()));
            let mut plan = PlanBooking::aggregated(booked(&Log(events.clone(), "decode")));
            plan.prefill_handed_off(ran, true, true);
            assert!(events.lock().unwrap().is_empty());
            drop(plan);
        }
    }

    #[test]
    fn a_split_the_sidecar_ran_whole_is_prefill_load_on_its_decode_worker_again() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let (decode, prefill) = (Log(events.clone(), "decode"), Log(events.clone(), "prefill"));
        let mut plan = PlanBooking::disaggregated(booked(&decode), booked(&prefill));
        plan.prefill_handed_off(PdRan::Aggregated, true, false);
        assert!(!plan.holds_prefill());
        // The decode worker's first token ends its prefill, with no TTFT
        // sample (the time includes the prefill leg that did not run).
        plan.prefill_complete(true);
        plan.prefill_complete(true);
        plan.response_finished(8);
        drop(plan);
        assert_eq!(
            *events.lock().unwrap(),
            [
                ("decode", "prefill_complete"),
                ("prefill", "prefill_complete"),
                ("prefill", "free"),
                ("decode", "prefill_restored"),
                ("decode", "prefill_complete"),
                ("decode", "decode_observed"),
                ("decode", "free"),
            ]
        );
        // Not streamed: the headers come with the whole answer, so there
        // is nothing left to count.
        let events = Arc::new(Mutex::new(Vec::new()));
        let (decode, prefill) = (Log(events.clone(), "decode"), Log(events.clone(), "prefill"));
        let mut plan = PlanBooking::disaggregated(booked(&decode), booked(&prefill));
        plan.prefill_handed_off(PdRan::Aggregated, false, false);
        drop(plan);
        assert!(!events.lock().unwrap().iter().any(|(_, e)| *e == "prefill_restored"));
    }

    #[test]
    fn a_split_cancelled_before_its_first_token_frees_both_legs() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let (decode, prefill) = (Log(events.clone(), "decode"), Log(events.clone(), "prefill"));
        drop(PlanBooking::disaggregated(booked(&decode), booked(&prefill)));
        let mut got = events.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, [("decode", "free"), ("decode", "prefill_complete"), ("prefill", "free")]);
    }

    #[test]
    fn an_aggregated_plan_is_one_reservation() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let mut plan = PlanBooking::aggregated(booked(&Log(events.clone(), "decode")));
        plan.prefill_complete(true);
        plan.served_by("10.0.0.2:8000".parse().unwrap());
        drop(plan);
        assert_eq!(
            *events.lock().unwrap(),
            [("decode", "prefill_complete+ttft"), ("decode", "moved"), ("decode", "free")]
        );
    }
}
