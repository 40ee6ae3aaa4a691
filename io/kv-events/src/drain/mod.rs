//! TensorRT-LLM's KV events by polling: `trtllm-serve` answers `POST
//! /kv_cache_events` with the events produced since the previous call (a
//! destructive drain, engines.md §5).
//!
//! One thread (`kvpick-kv-drain`) runs a one-thread tokio runtime that
//! polls every drained engine concurrently over one keep-alive HTTP/1
//! client, and applies each answer, decoded by `wire::trtllm_json`, to the
//! sink on that thread, in answer order: a worker's events come only from
//! here, so they stay in order. A poll starts `drain_interval` after the
//! previous one ended; a failed one doubles the wait, up to
//! `drain_backoff_max`. Engines come and go by the same commands as the ZMQ
//! ingest's.
//!
//! Event ids are checked per attention-DP rank (`wire::event_ids`): ids
//! skipped because the engine's bounded buffer overflowed are counted in
//! `lost_events` and clear the worker's blocks. Every rank of one server
//! feeds its one worker (the gateway picks the server; the server picks
//! the rank), so a block any rank stores is indexed and a block any rank
//! removes is forgotten: the index can only under-report.
//!
//! Several kvpick replicas draining the same engine each get a part of its
//! events; the others' shares show up as lost. Run one replica per fleet
//! with this source, or use TensorRT-LLM's ZMQ publisher.

mod fetch;
mod stream;

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use hyper::Uri;
use kvpick_core::WorkerId;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::{AbortHandle, JoinSet};

use super::apply::Outlet;
use super::config::{IngestConfig, Publisher};
use super::metrics::{IngestMetrics, add};
use super::poll_loop::Command;
use super::sink::KvEventSink;
use fetch::DrainClient;
use stream::DrainStream;

/// The handle to the drain thread; dropping it stops the thread.
pub(crate) struct DrainPoller {
    commands: UnboundedSender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl DrainPoller {
    pub(crate) fn spawn<S: KvEventSink + 'static>(
        cfg: Arc<IngestConfig>,
        sink: S,
        metrics: Arc<IngestMetrics>,
    ) -> std::io::Result<Self> {
        let (commands, receiver) = unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name("kvpick-kv-drain".into()).spawn(move || {
            let drainer =
                Drainer { cfg, sink, metrics, client: fetch::client(), engines: HashMap::new(), polls: JoinSet::new() };
            runtime.block_on(drainer.run(receiver));
        })?;
        Ok(DrainPoller { commands, thread: Some(thread) })
    }

    /// False if the thread has stopped.
    pub(crate) fn send(&self, command: Command) -> bool {
        self.commands.send(command).is_ok()
    }

    /// Stops the thread and waits for it; false if it panicked.
    pub(crate) fn stop(&mut self) -> bool {
        let Some(thread) = self.thread.take() else { return true };
        let _ = self.commands.send(Command::Shutdown);
        thread.join().is_ok()
    }
}

impl Drop for DrainPoller {
    fn drop(&mut self) {
        if !self.stop() {
            tracing::error!("the KV-event drain thread panicked");
        }
    }
}

/// One drained engine.
struct Engine {
    publisher: Publisher,
    uri: Uri,
    /// Tells a finished poll of this engine from one of a replaced one.
    generation: u64,
    stream: DrainStream,
    failures: u32,
    poll: AbortHandle,
}

/// A finished poll: whose, of which generation, and its answer.
type Finished = (WorkerId, u64, Result<Bytes, String>);

struct Drainer<S> {
    cfg: Arc<IngestConfig>,
    sink: S,
    metrics: Arc<IngestMetrics>,
    client: DrainClient,
    engines: HashMap<WorkerId, Engine>,
    polls: JoinSet<Finished>,
}

impl<S: KvEventSink> Drainer<S> {
    async fn run(mut self, mut commands: UnboundedReceiver<Command>) {
        let mut generation = 0u64;
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    None | Some(Command::Shutdown) => break,
                    Some(Command::Add(publisher)) => {
                        generation += 1;
                        self.add(publisher, generation);
                    }
                    Some(Command::Remove(worker)) => self.remove(worker),
                    // Warm start is the ZMQ streams' alone (a drain has no
                    // sequence to continue from); never sent here.
                    Some(Command::Hold(_) | Command::Release | Command::Seed(..) | Command::Export(..) | Command::Restart(_)) => {}
                },
                Some(finished) = self.polls.join_next() => {
                    // A poll aborted by a removal ends as a join error.
                    if let Ok(finished) = finished {
                        self.finish(finished);
                    }
                }
            }
        }
        self.polls.shutdown().await;
        for engine in self.engines.values() {
            self.metrics.unregister(engine.stream.gauges());
        }
    }

    fn add(&mut self, publisher: Publisher, generation: u64) {
        let worker = publisher.worker;
        if self.engines.get(&worker).is_some_and(|e| e.publisher == publisher) {
            return;
        }
        self.remove(worker);
        let uri = match publisher.endpoint.parse::<Uri>() {
            Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => uri,
            _ => {
                add(&self.metrics.counters.socket_errors, 1);
                tracing::error!(worker = worker.0, endpoint = %publisher.endpoint, "not an http:// URL: KV events of this worker are not drained");
                return;
            }
        };
        let gauges = self.metrics.register(worker);
        tracing::info!(worker = worker.0, endpoint = %publisher.endpoint, "draining TensorRT-LLM KV events");
        let poll =
            start_poll(&mut self.polls, &self.client, &self.cfg, (worker, generation), uri.clone(), Duration::ZERO);
        let stream = DrainStream::new(worker, gauges);
        self.engines.insert(worker, Engine { publisher, uri, generation, stream, failures: 0, poll });
    }

    fn remove(&mut self, worker: WorkerId) {
        if let Some(engine) = self.engines.remove(&worker) {
            engine.poll.abort();
            self.metrics.unregister(engine.stream.gauges());
        }
    }

    fn finish(&mut self, (worker, generation, answer): Finished) {
        let Some(engine) = self.engines.get_mut(&worker).filter(|e| e.generation == generation) else { return };
        let mut out = Outlet { sink: &mut self.sink, metrics: &self.metrics };
        let delay = match answer {
            Ok(body) => {
                engine.failures = 0;
                engine.stream.apply(&body, &mut out);
                self.cfg.drain_interval
            }
            Err(why) => {
                engine.failures = engine.failures.saturating_add(1);
                engine.stream.failed(&mut out, &why);
                backoff(self.cfg.drain_interval, self.cfg.drain_backoff_max, engine.failures)
            }
        };
        let uri = engine.uri.clone();
        engine.poll = start_poll(&mut self.polls, &self.client, &self.cfg, (worker, generation), uri, delay);
    }
}

/// Polls `uri` once after `delay`; the answer comes back through `polls`
/// tagged with the engine's worker and generation.
fn start_poll(
    polls: &mut JoinSet<Finished>,
    client: &DrainClient,
    cfg: &IngestConfig,
    (worker, generation): (WorkerId, u64),
    uri: Uri,
    delay: Duration,
) -> AbortHandle {
    let client = client.clone();
    let (timeout, max_bytes) = (cfg.drain_timeout, cfg.drain_max_body_bytes);
    polls.spawn(async move {
        tokio::time::sleep(delay).await;
        (worker, generation, fetch::drain(&client, &uri, timeout, max_bytes).await)
    })
}

/// The wait after `failures` failed polls in a row: the interval doubled
/// per failure (at least 10 ms to start from), capped.
fn backoff(interval: Duration, max: Duration, failures: u32) -> Duration {
    let base = interval.max(Duration::from_millis(10));
    base.saturating_mul(1u32 << failures.min(16)).min(max.max(interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let ms = Duration::from_millis;
        let waits: Vec<Duration> = (1..=8).map(|n| backoff(ms(50), ms(1000), n)).collect();
        assert_eq!(waits, [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000), ms(1000), ms(1000)]);
        assert_eq!(backoff(ms(0), ms(1000), 1), ms(20));
        assert_eq!(backoff(ms(50), ms(1000), u32::MAX), ms(1000));
        // A cap below the interval never shortens the interval.
        assert_eq!(backoff(ms(500), ms(100), 3), ms(500));
    }
}
