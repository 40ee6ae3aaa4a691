//! The ingest thread's loop: one `zmq_poll` over every publisher's sockets.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, TryRecvError};
use kvpick_core::{KvEvent, WorkerId};

use super::apply::Outlet;
use super::config::{IngestConfig, Publisher};
use super::metrics::{IngestMetrics, add};
use super::sink::{Exported, Imported, KvEventSink};
use super::subscription::Subscription;
use super::waker;
use super::warm::{SeedRefused, StreamCut, WorkerSeed};

pub(crate) enum Command {
    /// Subscribe, or resubscribe if the worker's publisher changed.
    Add(Publisher),
    Remove(WorkerId),
    /// Warm start: subscriptions opened from now until the release (or
    /// this deadline) are held for a seed.
    Hold(Instant),
    /// Releases every held stream and ends the hold.
    Release,
    Seed(Box<WorkerSeed>, oneshot::Sender<Result<Imported, SeedRefused>>),
    /// The worker's stream cut and the shard's answer to its export.
    Export(WorkerId, oneshot::Sender<Option<(StreamCut, Exported)>>),
    /// Forgets the worker's blocks and subscribes it again from scratch
    /// (a seed whose import the shard refused).
    Restart(WorkerId),
    Shutdown,
}

#[derive(Clone, Copy)]
enum Source {
    Live,
    Replay,
    Monitor,
}

pub(crate) struct PollLoop<S> {
    pub(crate) ctx: zmq::Context,
    pub(crate) cfg: Arc<IngestConfig>,
    pub(crate) sink: S,
    pub(crate) metrics: Arc<IngestMetrics>,
    pub(crate) commands: Receiver<Command>,
    pub(crate) wake: zmq::Socket,
    pub(crate) subscriptions: Vec<Subscription>,
    /// Warm start: new subscriptions are held until then.
    pub(crate) hold_until: Option<Instant>,
}

impl<S: KvEventSink> PollLoop<S> {
    /// Runs until told to shut down (or every handle is gone); all sockets
    /// close with it.
    pub(crate) fn run(mut self) {
        let mut ready: Vec<(usize, Source)> = Vec::new();
        loop {
            ready.clear();
            let woken = match self.poll(&mut ready) {
                Ok(woken) => woken,
                Err(zmq::Error::EINTR) => continue,
                Err(error) => {
                    tracing::error!(%error, "KV-event ingest poll failed; ingest stopped");
                    return;
                }
            };
            let mut out = Outlet { sink: &mut self.sink, metrics: &self.metrics };
            for &(index, source) in &ready {
                let subscription = &mut self.subscriptions[index];
                match source {
                    Source::Live => {
                        subscription.read_live(&mut out);
                    }
                    Source::Replay => subscription.read_replay(&mut out),
                    Source::Monitor => subscription.read_monitor(&mut out),
                }
            }
            let now = Instant::now();
            for subscription in &mut self.subscriptions {
                subscription.expire_replay(now, &mut out);
            }
            if self.hold_until.is_some_and(|until| until <= now) {
                tracing::info!("KV events: warm start's deadline passed; held streams start cold");
                self.release_holds();
            }
            if woken {
                waker::drain(&self.wake);
                if !self.run_commands() {
                    return;
                }
            }
        }
    }

    /// Waits for any socket to be readable or the next replay deadline;
    /// fills `ready` and says whether the waker fired.
    fn poll(&self, ready: &mut Vec<(usize, Source)>) -> Result<bool, zmq::Error> {
        let mut items = Vec::with_capacity(1 + self.subscriptions.len());
        let mut sources = Vec::with_capacity(self.subscriptions.len());
        items.push(self.wake.as_poll_item(zmq::POLLIN));
        let mut deadline: Option<Instant> = None;
        for (index, subscription) in self.subscriptions.iter().enumerate() {
            items.push(subscription.socket().as_poll_item(zmq::POLLIN));
            sources.push((index, Source::Live));
            items.push(subscription.monitor_socket().as_poll_item(zmq::POLLIN));
            sources.push((index, Source::Monitor));
            if let Some(replay) = subscription.replay_socket() {
                items.push(replay.as_poll_item(zmq::POLLIN));
                sources.push((index, Source::Replay));
            }
            if let Some(replay_deadline) = subscription.replay_deadline() {
                deadline = Some(deadline.map_or(replay_deadline, |d| d.min(replay_deadline)));
            }
        }
        if let Some(until) = self.hold_until {
            deadline = Some(deadline.map_or(until, |d| d.min(until)));
        }
        let timeout_ms = match deadline {
            // Rounded up, so a wake-up is never just before the deadline.
            Some(deadline) => deadline.saturating_duration_since(Instant::now()).as_micros().div_ceil(1000) as i64,
            None => -1,
        };
        zmq::poll(&mut items, timeout_ms)?;
        ready.extend(sources.iter().zip(&items[1..]).filter(|(_, item)| item.is_readable()).map(|(s, _)| *s));
        Ok(items[0].is_readable())
    }

    /// Applies every queued command; `false` once the loop must stop.
    fn run_commands(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(Command::Add(publisher)) => self.add(publisher),
                Ok(Command::Remove(worker)) => self.remove(worker),
                Ok(Command::Hold(until)) => self.hold_until = Some(until),
                Ok(Command::Release) => self.release_holds(),
                Ok(Command::Seed(seed, reply)) => {
                    let _ = reply.send(self.seed(seed));
                }
                Ok(Command::Export(worker, reply)) => {
                    let _ = reply.send(self.export(worker));
                }
                Ok(Command::Restart(worker)) => self.restart(worker),
                Ok(Command::Shutdown) | Err(TryRecvError::Disconnected) => return false,
                Err(TryRecvError::Empty) => return true,
            }
        }
    }

    fn add(&mut self, publisher: Publisher) {
        let existing = self.subscriptions.iter().position(|s| s.publisher().worker == publisher.worker);
        if let Some(index) = existing {
            if *self.subscriptions[index].publisher() == publisher {
                return;
            }
            let old = self.subscriptions.swap_remove(index);
            self.metrics.unregister(old.gauges());
        }
        let worker = publisher.worker.0;
        let endpoint = publisher.endpoint.clone();
        match Subscription::open(&self.ctx, &self.cfg, publisher, &self.metrics) {
            Ok(mut subscription) => {
                tracing::info!(worker, endpoint, "subscribed to KV events");
                // Held for a peer's index (warm start), or caught up now.
                if self.hold_until.is_none() || !subscription.hold() {
                    subscription.catch_up(&mut Outlet { sink: &mut self.sink, metrics: &self.metrics });
                }
                self.subscriptions.push(subscription);
            }
            Err(error) => {
                add(&self.metrics.counters.socket_errors, 1);
                tracing::error!(worker, endpoint, %error, "cannot subscribe to KV events");
            }
        }
    }

    fn release_holds(&mut self) {
        self.hold_until = None;
        let mut out = Outlet { sink: &mut self.sink, metrics: &self.metrics };
        for subscription in &mut self.subscriptions {
            subscription.release(&mut out);
        }
    }

    fn seed(&mut self, seed: Box<WorkerSeed>) -> Result<Imported, SeedRefused> {
        let Some(subscription) = self.subscriptions.iter_mut().find(|s| s.publisher().worker == seed.worker) else {
            return Err(SeedRefused::NotSubscribed(seed));
        };
        let seed = *seed;
        let mut out = Outlet { sink: &mut self.sink, metrics: &self.metrics };
        subscription.seed(seed.cut, seed.snapshot, &mut out)
    }

    /// `None` for a worker with no steady stream here (not subscribed,
    /// held, or replaying), or one the sink cannot export.
    fn export(&mut self, worker: WorkerId) -> Option<(StreamCut, Exported)> {
        let cut = self.subscriptions.iter().find(|s| s.publisher().worker == worker)?.cut()?;
        let exported = self.sink.export(worker)?;
        add(&self.metrics.counters.streams_exported, 1);
        Some((cut, exported))
    }

    fn restart(&mut self, worker: WorkerId) {
        let Some(publisher) =
            self.subscriptions.iter().find(|s| s.publisher().worker == worker).map(|s| s.publisher().clone())
        else {
            return;
        };
        tracing::warn!(
            worker = worker.0,
            "KV events: the peer's index of this worker was refused; its stream starts over"
        );
        let _ = self.sink.apply(worker, KvEvent::Cleared);
        self.remove(worker);
        self.add(publisher);
    }

    fn remove(&mut self, worker: WorkerId) {
        if let Some(index) = self.subscriptions.iter().position(|s| s.publisher().worker == worker) {
            let old = self.subscriptions.swap_remove(index);
            self.metrics.unregister(old.gauges());
            tracing::info!(worker = worker.0, "unsubscribed from KV events");
        }
    }
}
