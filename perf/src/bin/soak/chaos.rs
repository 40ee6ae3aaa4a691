//! The chaos schedule: faults injected one at a time, in a fixed rotation
//! over the fault kinds and the engines, each held for a while and then
//! healed. After each, the soak checks the books ([`crate::checkpoint`]).

use std::fmt;
use std::time::Duration;

use crate::fleet::SoakFleet;
use crate::traffic::Traffic;

/// Share of KV-event batches lost while [`Fault::DropEvents`] lasts.
const DROP_FRACTION: f64 = 0.5;

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The engine loses half its KV-event batches on the wire (still
    /// numbered, so replayable).
    DropEvents(usize),
    /// The engine's publisher holds its batches, then sends them late.
    StallEvents(usize),
    /// The engine restarts in place and says so (`AllBlocksCleared`).
    RestartAnnounced(usize),
    /// The engine restarts in place without a word: sequence numbers go back.
    RestartSilent(usize),
    /// The engine is killed (sockets closed, requests cut), stays down,
    /// and a new one starts on the same ports.
    Kill(usize),
    /// The engine leaves the workers file, then comes back.
    WorkerRemoved(usize),
    /// The render (tokenizer) service is down, then back.
    TokenizerDown,
    /// The gateway's connection to kvpick is replaced; streams open on it
    /// are cut.
    GatewayReset,
}

/// Every kind, in the order the schedule rotates through them.
pub const KINDS: [&str; 8] = [
    "drop-events",
    "stall-events",
    "restart-announced",
    "restart-silent",
    "kill",
    "worker-removed",
    "tokenizer-down",
    "gateway-reset",
];

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::DropEvents(i) => write!(f, "drop-events engine-{i}"),
            Fault::StallEvents(i) => write!(f, "stall-events engine-{i}"),
            Fault::RestartAnnounced(i) => write!(f, "restart-announced engine-{i}"),
            Fault::RestartSilent(i) => write!(f, "restart-silent engine-{i}"),
            Fault::Kill(i) => write!(f, "kill engine-{i}"),
            Fault::WorkerRemoved(i) => write!(f, "worker-removed engine-{i}"),
            Fault::TokenizerDown => write!(f, "tokenizer-down"),
            Fault::GatewayReset => write!(f, "gateway-reset"),
        }
    }
}

/// Counters whose movement the report shows for each fault.
pub const WATCHED: [&str; 11] = [
    "kvpick_kv_event_gaps_total",
    "kvpick_kv_event_replays_total",
    "kvpick_kv_event_replays_resumed_total",
    "kvpick_kv_event_replays_failed_total",
    "kvpick_kv_event_batches_lost_total",
    "kvpick_kv_event_engine_restarts_total",
    "kvpick_kv_event_rebuilds_total",
    "kvpick_tokenizer_errors_total",
    "kvpick_ext_proc_stream_errors_total",
    "kvpick_reservations_expired_total",
    "kvpick_load_only_picks_total",
];

/// Counters that must never move: a lost batch means the index was left
/// wrong (replay could not heal it); an expired booking means one was
/// leaked and only its lease took it back.
pub const NEVER: [&str; 2] = ["kvpick_kv_event_batches_lost_total", "kvpick_reservations_expired_total"];

impl Fault {
    /// Its name in [`KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::DropEvents(_) => KINDS[0],
            Fault::StallEvents(_) => KINDS[1],
            Fault::RestartAnnounced(_) => KINDS[2],
            Fault::RestartSilent(_) => KINDS[3],
            Fault::Kill(_) => KINDS[4],
            Fault::WorkerRemoved(_) => KINDS[5],
            Fault::TokenizerDown => KINDS[6],
            Fault::GatewayReset => KINDS[7],
        }
    }

    /// The counters an operator sees this fault by (any one of them), when
    /// there are some.
    pub fn seen_by(&self) -> Option<&'static [&'static str]> {
        match self {
            Fault::DropEvents(_) => Some(&["kvpick_kv_event_gaps_total"]),
            Fault::RestartAnnounced(_) | Fault::RestartSilent(_) => Some(&["kvpick_kv_event_engine_restarts_total"]),
            // Its sequence going back, or, when the new run has overtaken
            // the old one before kvpick reconnects, the rebuild on reconnecting.
            Fault::Kill(_) => Some(&["kvpick_kv_event_engine_restarts_total", "kvpick_kv_event_rebuilds_total"]),
            Fault::TokenizerDown => Some(&["kvpick_tokenizer_errors_total"]),
            // A late batch, a departure and a reset are not faults of
            // kvpick's inputs: nothing is counted for them.
            Fault::StallEvents(_) | Fault::WorkerRemoved(_) | Fault::GatewayReset => None,
        }
    }
}

/// The `n`th fault of a schedule over `kinds` (names from [`KINDS`]) and
/// `engines` engines: kinds in turn, engines in turn within each kind.
pub fn nth(n: usize, kinds: &[String], engines: usize) -> Option<Fault> {
    let kind = kinds.get(n % kinds.len().max(1))?;
    let engine = (n / kinds.len().max(1)) % engines.max(1);
    Some(match kind.as_str() {
        "drop-events" => Fault::DropEvents(engine),
        "stall-events" => Fault::StallEvents(engine),
        "restart-announced" => Fault::RestartAnnounced(engine),
        "restart-silent" => Fault::RestartSilent(engine),
        "kill" => Fault::Kill(engine),
        "worker-removed" => Fault::WorkerRemoved(engine),
        "tokenizer-down" => Fault::TokenizerDown,
        "gateway-reset" => Fault::GatewayReset,
        _ => return None,
    })
}

/// Injects `fault`, holds it for `hold` (faults that are an instant do
/// not wait), and heals it.
pub async fn inject(fault: Fault, hold: Duration, fleet: &SoakFleet, traffic: &Traffic) -> Result<(), String> {
    match fault {
        Fault::DropEvents(i) => {
            fleet.with(i, |e| e.set_drop_fraction(DROP_FRACTION)).await;
            tokio::time::sleep(hold).await;
            fleet.with(i, |e| e.set_drop_fraction(0.0)).await;
        }
        Fault::StallEvents(i) => {
            fleet.with(i, |e| e.set_events_stalled(true)).await;
            tokio::time::sleep(hold).await;
            fleet.with(i, |e| e.set_events_stalled(false)).await;
        }
        // Each restart is followed by one request straight to the engine,
        // so it publishes and kvpick has something to notice it by.
        Fault::RestartAnnounced(i) => {
            fleet.restart(i, true).await?;
            fleet.poke(i).await?;
        }
        Fault::RestartSilent(i) => {
            fleet.restart(i, false).await?;
            fleet.poke(i).await?;
        }
        Fault::Kill(i) => {
            fleet.kill_and_restart(i, hold).await?;
            fleet.poke(i).await?;
        }
        Fault::WorkerRemoved(i) => {
            fleet.write_workers(Some(i)).await?;
            tokio::time::sleep(hold).await;
            fleet.write_workers(None).await?;
        }
        Fault::TokenizerDown => fleet.render_down(hold).await?,
        Fault::GatewayReset => traffic.reset_gateway().await?,
    }
    Ok(())
}
