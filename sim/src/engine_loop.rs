//! The engine's async loop: the only owner of its [`Scheduler`]. It takes
//! commands (requests, inspections, knobs), runs steps paced against the
//! wall clock, hands each step's tokens to the waiting requests and its KV
//! events to the publisher as one batch.
//!
//! A request whose caller went away (its progress receiver dropped: the
//! HTTP client disconnected) is aborted and its blocks released, as vLLM
//! aborts on disconnect.
//!
//! Blocks a finished prefill holds for a transfer are under a lease: the
//! loop frees them when a decode engine takes them ([`Command::TakeHold`])
//! or when the lease ends, whichever comes first, so a transfer nobody
//! pulls never leaks blocks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::pd::PdCounters;
use super::prefix_cache::CacheSnapshot;
use super::publisher::{Publisher, PublisherStats};
use super::scheduler::{Counters, Outcome, PdOptions, RequestId, RequestSpec, Scheduler, StepReport, Update};
use super::time_model::Pacer;

/// What a request's caller hears, in order: tokens, then one end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    Token {
        token_id: u32,
        text: String,
    },
    Finished(Outcome),
    /// Refused at submission (limits): a client error.
    Rejected(String),
    /// Dropped by a restart or shutdown.
    Aborted(String),
    /// Failed by the engine: a KV transfer of a P/D leg that did not
    /// happen (HTTP 500, or an error chunk).
    Failed(String),
}

/// An engine's state at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// vLLM's `kv_cache_usage_perc` (0–1).
    pub kv_cache_usage: f64,
    pub cached_blocks: usize,
    pub counters: Counters,
    /// Virtual time of the scheduler.
    pub virtual_now_ns: u64,
    /// Whether the scheduler is stalled (the knob).
    pub stalled: bool,
    pub publisher: PublisherStats,
    /// Finished prefills holding blocks for a transfer (P/D).
    pub held_transfers: usize,
    /// Blocks those hold.
    pub held_blocks: usize,
}

/// What became of a hold a decode engine asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HoldTake {
    /// Released to the taker: the transfer goes ahead.
    Taken,
    /// Its lease ended before the pull.
    Expired,
    /// Never held, already taken, or dropped by a restart.
    Unknown,
}

/// Expired holds remembered, to tell "expired" from "unknown" to a late pull.
const EXPIRED_KEPT: usize = 4096;

pub(crate) enum Command {
    Submit {
        spec: RequestSpec,
        options: PdOptions,
        progress: UnboundedSender<Progress>,
    },
    /// A decode engine pulls the blocks request `id` holds.
    TakeHold {
        id: RequestId,
        reply: oneshot::Sender<HoldTake>,
    },
    /// The prefill side gives the hold up (its wait ended, its client left).
    ReleaseHold(RequestId),
    Stats(oneshot::Sender<EngineStats>),
    Cache(oneshot::Sender<CacheSnapshot>),
    Outcomes(oneshot::Sender<Vec<Outcome>>),
    SetStalled(bool),
    Restart {
        announce_clear: bool,
        done: oneshot::Sender<()>,
    },
    Shutdown,
}

struct EngineLoop {
    name: String,
    scheduler: Scheduler,
    publisher: Arc<Publisher>,
    pacer: Pacer,
    replies: HashMap<RequestId, UnboundedSender<Progress>>,
    stalled: bool,
    lease: Duration,
    /// When each hold's lease ends (wall clock, like vLLM's
    /// `kv_lease_duration`).
    leases: HashMap<RequestId, Instant>,
    expired: VecDeque<RequestId>,
    pd: Arc<PdCounters>,
}

/// What the loop is made of.
pub(crate) struct LoopParts {
    pub(crate) name: String,
    pub(crate) scheduler: Scheduler,
    pub(crate) publisher: Arc<Publisher>,
    pub(crate) pacer: Pacer,
    pub(crate) lease: Duration,
    pub(crate) pd: Arc<PdCounters>,
}

/// Runs until [`Command::Shutdown`] or until every command sender is gone.
pub(crate) async fn run(parts: LoopParts, mut commands: UnboundedReceiver<Command>) {
    let LoopParts { name, scheduler, publisher, pacer, lease, pd } = parts;
    let mut engine = EngineLoop {
        name,
        scheduler,
        publisher,
        pacer,
        replies: HashMap::new(),
        stalled: false,
        lease,
        leases: HashMap::new(),
        expired: VecDeque::new(),
        pd,
    };
    let mut blocked = false;
    loop {
        engine.expire_leases();
        loop {
            match commands.try_recv() {
                Ok(Command::Shutdown) | Err(TryRecvError::Disconnected) => return engine.shutdown(),
                Ok(command) => engine.handle(command),
                Err(TryRecvError::Empty) => break,
            }
        }
        engine.drop_abandoned();
        if blocked || engine.stalled || engine.scheduler.is_idle() {
            // Idle: wait for a command, or for the next lease to end.
            let next_lease = engine.leases.values().min().copied();
            let command = match next_lease {
                Some(deadline) => match tokio::time::timeout_at(deadline, commands.recv()).await {
                    Ok(command) => command,
                    Err(_) => continue,
                },
                None => commands.recv().await,
            };
            let Some(command) = command else { return engine.shutdown() };
            // Idle or stalled until now: virtual time went on meanwhile.
            engine.catch_up();
            if matches!(command, Command::Shutdown) {
                return engine.shutdown();
            }
            engine.handle(command);
            blocked = false;
            continue;
        }
        let Some(report) = engine.scheduler.step() else {
            // Nothing fits (cannot happen with validated requests): wait for
            // a command rather than spin.
            tracing::warn!(engine = %engine.name, "requests waiting but none can be scheduled");
            blocked = true;
            continue;
        };
        if let Some(deadline) = engine.pacer.deadline(report.ended_ns)
            && deadline > Instant::now()
        {
            tokio::time::sleep_until(deadline).await;
        }
        engine.deliver(report);
    }
}

impl EngineLoop {
    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit { spec, options, progress } => match self.scheduler.submit_pd(spec, options) {
                Ok(id) => {
                    self.replies.insert(id, progress);
                }
                Err(reason) => {
                    let _ = progress.send(Progress::Rejected(reason));
                }
            },
            Command::TakeHold { id, reply } => {
                let taken = if self.scheduler.release_hold(id) {
                    self.leases.remove(&id);
                    self.pd.hold_released("pulled");
                    HoldTake::Taken
                } else if self.expired.contains(&id) {
                    HoldTake::Expired
                } else {
                    HoldTake::Unknown
                };
                let _ = reply.send(taken);
            }
            Command::ReleaseHold(id) => {
                if self.scheduler.release_hold(id) {
                    self.leases.remove(&id);
                    self.pd.hold_released("abandoned");
                }
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.stats());
            }
            Command::Cache(reply) => {
                let _ = reply.send(self.scheduler.cache().snapshot());
            }
            Command::Outcomes(reply) => {
                let _ = reply.send(self.scheduler.outcomes().copied().collect());
            }
            Command::SetStalled(stalled) => {
                self.stalled = stalled;
                tracing::info!(engine = %self.name, stalled, "scheduler stall knob");
            }
            Command::Restart { announce_clear, done } => {
                for id in self.scheduler.reset() {
                    if let Some(reply) = self.replies.remove(&id) {
                        let _ = reply.send(Progress::Aborted("engine restarted".into()));
                    }
                }
                // The restart dropped the holds with the cache.
                self.leases.clear();
                self.publisher.restart(announce_clear);
                tracing::info!(engine = %self.name, announce_clear, "engine restarted");
                let _ = done.send(());
            }
            // Handled by the caller: it ends the loop.
            Command::Shutdown => {}
        }
    }

    fn stats(&self) -> EngineStats {
        let cache = self.scheduler.cache();
        EngineStats {
            running: self.scheduler.running(),
            waiting: self.scheduler.waiting(),
            kv_cache_usage: cache.usage(),
            cached_blocks: cache.cached(),
            counters: self.scheduler.counters(),
            virtual_now_ns: self.scheduler.now_ns(),
            stalled: self.stalled,
            publisher: self.publisher.stats(),
            held_transfers: self.scheduler.held_transfers(),
            held_blocks: self.scheduler.held_blocks(),
        }
    }

    /// Frees the holds whose lease ended, remembering them as expired.
    fn expire_leases(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let now = Instant::now();
        let ended: Vec<RequestId> = self.leases.iter().filter(|(_, end)| **end <= now).map(|(id, _)| *id).collect();
        for id in ended {
            self.leases.remove(&id);
            if self.scheduler.release_hold(id) {
                self.pd.hold_released("expired");
                tracing::debug!(engine = %self.name, id, "transfer lease ended: held blocks freed");
            }
            if self.expired.len() == EXPIRED_KEPT {
                self.expired.pop_front();
            }
            self.expired.push_back(id);
        }
    }

    fn catch_up(&mut self) {
        if let Some(now) = self.pacer.virtual_now_ns() {
            self.scheduler.advance_to(now);
        }
    }

    /// Aborts the requests whose caller is gone.
    fn drop_abandoned(&mut self) {
        let gone: Vec<RequestId> = self.replies.iter().filter(|(_, r)| r.is_closed()).map(|(id, _)| *id).collect();
        for id in gone {
            self.replies.remove(&id);
            self.scheduler.abort(id);
            tracing::debug!(engine = %self.name, id, "request abandoned by its caller: aborted");
        }
    }

    /// Events first (vLLM publishes after the forward pass, before the
    /// tokens reach the client), then tokens.
    fn deliver(&mut self, report: StepReport) {
        if !report.events.is_empty() {
            self.publisher.publish(report.events);
        }
        let mut gone = Vec::new();
        for update in report.updates {
            match update {
                Update::Token { id, token_id, text } => {
                    if let Some(reply) = self.replies.get(&id)
                        && reply.send(Progress::Token { token_id, text }).is_err()
                    {
                        gone.push(id);
                    }
                }
                Update::Finished(outcome) => {
                    let id = outcome.id;
                    let holds = self.scheduler.holds(id);
                    if holds {
                        self.leases.insert(id, Instant::now() + self.lease);
                    }
                    let delivered =
                        self.replies.remove(&id).is_some_and(|r| r.send(Progress::Finished(outcome)).is_ok());
                    // Its caller left before the end (the step that finished
                    // it also sent its last token to nobody): an engine aborts
                    // such a request, so nothing is held for a transfer.
                    if holds && !delivered && self.scheduler.release_hold(id) {
                        self.leases.remove(&id);
                        self.pd.hold_released("abandoned");
                    }
                }
            }
        }
        for id in gone {
            if self.replies.remove(&id).is_some() {
                self.scheduler.abort(id);
            }
        }
    }

    fn shutdown(self) {
        for (_, reply) in self.replies {
            let _ = reply.send(Progress::Aborted("engine stopped".into()));
        }
        tracing::info!(engine = %self.name, "engine loop stopped");
    }
}
