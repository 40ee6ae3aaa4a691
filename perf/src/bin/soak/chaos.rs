//! The chaos schedule: faults injected one at a time, in a fixed rotation
//! over the fault kinds and the engines, each held for a while and then
//! healed. After each, the soak checks the books ([`crate::checkpoint`]).

use std::fmt;
use std::time::Duration;

use kvpick_perf::sim::Flavour;
use kvpick_test_support::fake_kube::Kind as Object;

use crate::fleet::SoakFleet;
use crate::traffic::Traffic;

/// Share of KV-event batches lost while [`Kind::DropEvents`] or
/// [`Kind::ReplayDown`] lasts.
const DROP_FRACTION: f64 = 0.5;

/// kvpick's tokenizer timeout in the soak (`DYN_EPP_TOKENIZATION_TIMEOUT_MS`):
/// short, so a slow render service makes some requests time out.
pub const TOKENIZER_TIMEOUT: Duration = Duration::from_millis(500);

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// The engine loses half its KV-event batches on the wire (still
    /// numbered, so replayable).
    DropEvents,
    /// The engine's publisher holds its batches, then sends them late.
    StallEvents,
    /// The engine's batches arrive in swapped pairs: each after the one
    /// numbered next.
    ReorderEvents,
    /// The engine's replay socket answers nothing while half its batches
    /// are lost: kvpick's replays go unanswered until it is back.
    ReplayDown,
    /// The engine restarts in place and says so (`AllBlocksCleared`).
    RestartAnnounced,
    /// The engine restarts in place without a word: sequence numbers go back.
    RestartSilent,
    /// The engine is killed (sockets closed, requests cut), stays down,
    /// and a new one starts on the same ports.
    Kill,
    /// The engine leaves the fleet (its workers file entry removed, or its
    /// pod not Ready), then comes back.
    WorkerRemoved,
    /// Kubernetes: every watch's connection is cut mid-stream, and the
    /// engine's pod is not Ready while the watches recover.
    WatchCut,
    /// Kubernetes: every watch expires (`410 Gone`, history compacted, so
    /// a relist), the engine's pod not Ready meanwhile.
    WatchExpired,
    /// Kubernetes: the watches expire and the relists of pods fail twice
    /// (HTTP 500) before one answers, the engine's pod not Ready meanwhile.
    ApiErrors,
    /// The render (tokenizer) service is down, then back.
    TokenizerDown,
    /// The render service answers late: alternately past kvpick's
    /// tokenizer timeout and within it.
    TokenizerSlow,
    /// The render service fails every request (HTTP 500).
    TokenizerFailing,
    /// The gateway's connection to kvpick is replaced; streams open on it
    /// are cut.
    GatewayReset,
}

impl Kind {
    /// Every kind, in the order the schedule rotates through them.
    pub const ALL: [Kind; 15] = [
        Kind::DropEvents,
        Kind::StallEvents,
        Kind::ReorderEvents,
        Kind::ReplayDown,
        Kind::RestartAnnounced,
        Kind::RestartSilent,
        Kind::Kill,
        Kind::WorkerRemoved,
        Kind::WatchCut,
        Kind::WatchExpired,
        Kind::ApiErrors,
        Kind::TokenizerDown,
        Kind::TokenizerSlow,
        Kind::TokenizerFailing,
        Kind::GatewayReset,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::DropEvents => "drop-events",
            Kind::StallEvents => "stall-events",
            Kind::ReorderEvents => "reorder-events",
            Kind::ReplayDown => "replay-down",
            Kind::RestartAnnounced => "restart-announced",
            Kind::RestartSilent => "restart-silent",
            Kind::Kill => "kill",
            Kind::WorkerRemoved => "worker-removed",
            Kind::WatchCut => "watch-cut",
            Kind::WatchExpired => "watch-expired",
            Kind::ApiErrors => "api-errors",
            Kind::TokenizerDown => "tokenizer-down",
            Kind::TokenizerSlow => "tokenizer-slow",
            Kind::TokenizerFailing => "tokenizer-failing",
            Kind::GatewayReset => "gateway-reset",
        }
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether it needs kvpick on Kubernetes discovery (the fake API
    /// server).
    pub fn needs_kube(self) -> bool {
        matches!(self, Kind::WatchCut | Kind::WatchExpired | Kind::ApiErrors)
    }

    /// Whether it befalls one engine (rotated over those it applies to).
    fn per_engine(self) -> bool {
        !matches!(self, Kind::TokenizerDown | Kind::TokenizerSlow | Kind::TokenizerFailing | Kind::GatewayReset)
    }

    /// Whether it can befall an engine of `flavour`: TensorRT-LLM's events
    /// are drained over HTTP, with no ZMQ stream to drop from, stall or
    /// replay.
    fn applies_to(self, flavour: Flavour) -> bool {
        let zmq_only = matches!(self, Kind::DropEvents | Kind::StallEvents | Kind::ReorderEvents | Kind::ReplayDown);
        !(zmq_only && flavour == Flavour::Trtllm)
    }

    /// The counters an operator sees this fault by (any one of them), when
    /// there are some.
    pub fn seen_by(self) -> Option<&'static [&'static str]> {
        match self {
            Kind::DropEvents => Some(&["kvpick_kv_event_gaps_total"]),
            // Each overtaking batch opens a gap; the overtaken one is late.
            Kind::ReorderEvents => Some(&["kvpick_kv_event_batches_late_total"]),
            Kind::ReplayDown => Some(&["kvpick_kv_event_replays_retried_total"]),
            Kind::RestartAnnounced | Kind::RestartSilent => Some(&["kvpick_kv_event_engine_restarts_total"]),
            // Its sequence going back, or, when the new run has overtaken
            // the old one before kvpick reconnects, the rebuild on
            // reconnecting; a drained engine's polls fail meanwhile.
            Kind::Kill => Some(&[
                "kvpick_kv_event_engine_restarts_total",
                "kvpick_kv_event_rebuilds_total",
                "kvpick_kv_event_drain_errors_total",
            ]),
            Kind::TokenizerDown | Kind::TokenizerSlow | Kind::TokenizerFailing => {
                Some(&["kvpick_tokenizer_errors_total"])
            }
            Kind::WatchCut | Kind::ApiErrors => Some(&["kvpick_discovery_watch_errors_total"]),
            Kind::WatchExpired => Some(&["kvpick_discovery_watch_expired_total"]),
            // A late batch, a departure and a reset are not faults of
            // kvpick's inputs: nothing is counted for them.
            Kind::StallEvents | Kind::WorkerRemoved | Kind::GatewayReset => None,
        }
    }
}

impl Kind {
    /// Counters this fault must not move: what it would be mistaken for.
    /// A batch overtaken on the way is not an engine restart; clearing the
    /// worker for one would forget a cache the engine still holds.
    pub fn not_seen_by(self) -> &'static [&'static str] {
        match self {
            Kind::ReorderEvents => &["kvpick_kv_event_engine_restarts_total", "kvpick_kv_event_rebuilds_total"],
            _ => &[],
        }
    }
}

/// One fault: a kind, and the engine it befalls when it befalls one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: Kind,
    pub engine: Option<usize>,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.engine {
            Some(i) => write!(f, "{} engine-{i}", self.kind.name()),
            None => f.write_str(self.kind.name()),
        }
    }
}

/// Counters whose movement the report shows for each fault.
pub const WATCHED: [&str; 19] = [
    "kvpick_kv_event_gaps_total",
    "kvpick_kv_event_batches_late_total",
    "kvpick_kv_event_replays_total",
    "kvpick_kv_event_replays_resumed_total",
    "kvpick_kv_event_replays_retried_total",
    "kvpick_kv_event_replays_failed_total",
    "kvpick_kv_event_batches_lost_total",
    "kvpick_kv_event_engine_restarts_total",
    "kvpick_kv_event_rebuilds_total",
    "kvpick_kv_event_drain_errors_total",
    "kvpick_kv_events_lost_total",
    "kvpick_tokenizer_errors_total",
    "kvpick_ext_proc_stream_errors_total",
    "kvpick_reservations_expired_total",
    "kvpick_load_only_picks_total",
    "kvpick_queue_refused_total",
    "kvpick_discovery_lists_total",
    "kvpick_discovery_watch_errors_total",
    "kvpick_discovery_watch_expired_total",
];

/// Counters that must never move: a lost batch means the index was left
/// wrong (replay could not heal it); an expired booking means one was
/// leaked and only its lease took it back.
pub const NEVER: [&str; 2] = ["kvpick_kv_event_batches_lost_total", "kvpick_reservations_expired_total"];

/// The `n`th fault of a schedule over `kinds` and engines of `flavours`:
/// kinds in turn, and within each kind the engines it applies to in turn.
/// `None` when `kinds` is empty or a kind applies to no engine.
pub fn nth(n: usize, kinds: &[Kind], flavours: &[Flavour]) -> Option<Fault> {
    let kind = *kinds.get(n % kinds.len().max(1))?;
    if !kind.per_engine() {
        return Some(Fault { kind, engine: None });
    }
    let round = n / kinds.len();
    let engines: Vec<usize> = (0..flavours.len()).filter(|&i| kind.applies_to(flavours[i])).collect();
    let engine = *engines.get(round % engines.len().max(1))?;
    Some(Fault { kind, engine: Some(engine) })
}

/// Injects `fault`, holds it for `hold` (faults that are an instant do
/// not wait), and heals it.
pub async fn inject(fault: Fault, hold: Duration, fleet: &SoakFleet, traffic: &Traffic) -> Result<(), String> {
    let i = fault.engine.unwrap_or(0);
    match fault.kind {
        Kind::DropEvents => {
            fleet.with(i, |e| e.set_drop_fraction(DROP_FRACTION)).await;
            tokio::time::sleep(hold).await;
            fleet.with(i, |e| e.set_drop_fraction(0.0)).await;
        }
        Kind::StallEvents => {
            fleet.with(i, |e| e.set_events_stalled(true)).await;
            tokio::time::sleep(hold).await;
            fleet.with(i, |e| e.set_events_stalled(false)).await;
        }
        Kind::ReorderEvents => {
            fleet.with(i, |e| e.set_events_reordered(true)).await;
            tokio::time::sleep(hold).await;
            fleet.with(i, |e| e.set_events_reordered(false)).await;
        }
        Kind::ReplayDown => {
            fleet.with(i, |e| (e.set_replay_down(true), e.set_drop_fraction(DROP_FRACTION))).await;
            tokio::time::sleep(hold).await;
            fleet.with(i, |e| (e.set_drop_fraction(0.0), e.set_replay_down(false))).await;
        }
        // Each restart is followed by one request straight to the engine,
        // so it publishes and kvpick has something to notice it by.
        Kind::RestartAnnounced | Kind::RestartSilent => {
            fleet.restart(i, fault.kind == Kind::RestartAnnounced).await?;
            fleet.poke(i).await?;
        }
        Kind::Kill => {
            fleet.kill_and_restart(i, hold).await?;
            fleet.poke(i).await?;
        }
        Kind::WorkerRemoved => {
            fleet.publish(Some(i)).await?;
            tokio::time::sleep(hold).await;
            fleet.publish(None).await?;
        }
        Kind::WatchCut | Kind::WatchExpired | Kind::ApiErrors => {
            let api = fleet.members().api().ok_or_else(|| format!("{fault} needs Kubernetes discovery"))?;
            match fault.kind {
                Kind::WatchCut => api.edit(|s| s.drop_watches(true)),
                _ => {
                    if fault.kind == Kind::ApiErrors {
                        api.fail_next_lists(Object::Pod, 500, 2);
                    }
                    api.edit(|s| {
                        s.compact();
                        s.expire_watches();
                    });
                }
            }
            fleet.publish(Some(i)).await?;
            tokio::time::sleep(hold).await;
            fleet.publish(None).await?;
        }
        Kind::TokenizerDown => fleet.render_down(hold).await?,
        Kind::TokenizerSlow => {
            fleet.with_render(|r| r.set_render_delay(TOKENIZER_TIMEOUT * 8 / 5)).await;
            tokio::time::sleep(hold).await;
            fleet.with_render(|r| r.set_render_delay(Duration::ZERO)).await;
        }
        Kind::TokenizerFailing => {
            fleet.with_render(|r| r.set_render_failing(true)).await;
            tokio::time::sleep(hold).await;
            fleet.with_render(|r| r.set_render_failing(false)).await;
        }
        Kind::GatewayReset => traffic.reset_gateway().await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_rotation_skips_engines_a_kind_cannot_befall() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_name(kind.name()), Some(kind));
        }
        let flavours = [Flavour::Vllm, Flavour::Trtllm, Flavour::Sglang];
        let kinds = [Kind::DropEvents, Kind::Kill, Kind::GatewayReset];
        let schedule: Vec<String> = (0..9).filter_map(|n| nth(n, &kinds, &flavours)).map(|f| f.to_string()).collect();
        assert_eq!(
            schedule,
            [
                "drop-events engine-0",
                "kill engine-0",
                "gateway-reset",
                "drop-events engine-2",
                "kill engine-1",
                "gateway-reset",
                "drop-events engine-0",
                "kill engine-2",
                "gateway-reset"
            ]
        );
        assert_eq!(nth(0, &[Kind::StallEvents], &[Flavour::Trtllm]), None, "no engine it applies to");
        assert_eq!(nth(0, &[], &flavours), None);
    }
}
