//! The engine's async loop: the only owner of its [`Scheduler`]. It takes
//! commands (requests, inspections, knobs), runs steps paced against the
//! wall clock, hands each step's tokens to the waiting requests and its KV
//! events to the publisher as one batch.
//!
//! A request whose caller went away (its progress receiver dropped: the
//! HTTP client disconnected) is aborted and its blocks released, as vLLM
//! aborts on disconnect.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::prefix_cache::CacheSnapshot;
use super::publisher::{Publisher, PublisherStats};
use super::scheduler::{Counters, Outcome, RequestId, RequestSpec, Scheduler, StepReport, Update};
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
}

pub(crate) enum Command {
    Submit { spec: RequestSpec, progress: UnboundedSender<Progress> },
    Stats(oneshot::Sender<EngineStats>),
    Cache(oneshot::Sender<CacheSnapshot>),
    Outcomes(oneshot::Sender<Vec<Outcome>>),
    SetStalled(bool),
    Restart { announce_clear: bool, done: oneshot::Sender<()> },
    Shutdown,
}

struct EngineLoop {
    name: String,
    scheduler: Scheduler,
    publisher: Arc<Publisher>,
    pacer: Pacer,
    replies: HashMap<RequestId, UnboundedSender<Progress>>,
    stalled: bool,
}

/// Runs until [`Command::Shutdown`] or until every command sender is gone.
pub(crate) async fn run(
    name: String,
    scheduler: Scheduler,
    mut commands: UnboundedReceiver<Command>,
    publisher: Arc<Publisher>,
    pacer: Pacer,
) {
    let mut engine = EngineLoop { name, scheduler, publisher, pacer, replies: HashMap::new(), stalled: false };
    let mut blocked = false;
    loop {
        loop {
            match commands.try_recv() {
                Ok(Command::Shutdown) | Err(TryRecvError::Disconnected) => return engine.shutdown(),
                Ok(command) => engine.handle(command),
                Err(TryRecvError::Empty) => break,
            }
        }
        engine.drop_abandoned();
        if blocked || engine.stalled || engine.scheduler.is_idle() {
            let Some(command) = commands.recv().await else { return engine.shutdown() };
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
            Command::Submit { spec, progress } => match self.scheduler.submit(spec) {
                Ok(id) => {
                    self.replies.insert(id, progress);
                }
                Err(reason) => {
                    let _ = progress.send(Progress::Rejected(reason));
                }
            },
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
                    if let Some(reply) = self.replies.remove(&outcome.id) {
                        let _ = reply.send(Progress::Finished(outcome));
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
