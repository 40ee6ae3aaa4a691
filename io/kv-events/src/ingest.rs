//! The handle to the ingest thread.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use std::time::Instant;

use kvpick_core::WorkerId;
use kvpick_core::index::{Applied, ImportError};
use kvpick_core::shard::WorkerSnapshot;

use super::config::{IngestConfig, Publisher};
use super::drain::DrainPoller;
use super::metrics::IngestMetrics;
use super::poll_loop::{Command, PollLoop};
use super::sink::KvEventSink;
use super::waker::Waker;
use super::warm::{SeedRefused, StreamCut, WorkerSeed};

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("ZMQ setup of the KV-event ingest failed: {0}")]
    Zmq(#[from] zmq::Error),
    #[error("could not start the KV-event ingest thread: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("the KV-event ingest thread has stopped")]
    Stopped,
    #[error("the KV-event ingest thread panicked")]
    Panicked,
}

/// The KV-event ingest: one thread, one ZMQ SUB socket per publisher.
///
/// Commands take effect asynchronously, in the order sent; a publisher
/// whose sockets cannot be opened is logged and counted in
/// `socket_errors`, not reported here. Dropping the handle stops the
/// thread and closes every socket, like [`KvEventIngest::shutdown`].
/// `Sync`: share it by reference or `Arc` (commands from several threads
/// are serialised).
pub struct KvEventIngest {
    commands: Sender<Command>,
    waker: Waker,
    metrics: Arc<IngestMetrics>,
    thread: Option<JoinHandle<()>>,
    /// TensorRT-LLM engines drained over HTTP (`http://` publishers).
    drains: DrainPoller,
}

impl KvEventIngest {
    /// Starts the threads, with no publishers yet: the ZMQ one, and the
    /// one polling TensorRT-LLM's drain endpoints (`http://` publishers),
    /// which gets a clone of `sink` (a clone must be usable from another
    /// thread alongside the original, as [`ShardSink`](crate::ShardSink)'s
    /// own ring is). Every decoded event goes to the sink of the thread
    /// that owns its publisher.
    pub fn spawn<S: KvEventSink + Clone + 'static>(cfg: IngestConfig, sink: S) -> Result<Self, IngestError> {
        let ctx = zmq::Context::new();
        let (waker, wake) = Waker::pair(&ctx)?;
        let (commands, receiver) = crossbeam_channel::unbounded();
        let metrics = Arc::new(IngestMetrics::default());
        let cfg = Arc::new(cfg);
        let drains = DrainPoller::spawn(Arc::clone(&cfg), sink.clone(), Arc::clone(&metrics))?;
        let poll_loop = PollLoop {
            ctx,
            cfg,
            sink,
            metrics: Arc::clone(&metrics),
            commands: receiver,
            wake,
            subscriptions: Vec::new(),
            hold_until: None,
        };
        let thread = std::thread::Builder::new().name("kvpick-kv-ingest".into()).spawn(move || poll_loop.run())?;
        Ok(KvEventIngest { commands, waker, metrics, thread: Some(thread), drains })
    }

    /// Subscribes to `publisher`'s events for its worker (or drains them,
    /// for an `http://` endpoint), replacing the worker's previous
    /// publisher if it differs (same one: no-op, its stream state is kept).
    pub fn add(&self, publisher: Publisher) -> Result<(), IngestError> {
        let worker = publisher.worker;
        if publisher.is_drain() {
            self.send(Command::Remove(worker))?;
            self.drain(Command::Add(publisher))
        } else {
            self.drain(Command::Remove(worker))?;
            self.send(Command::Add(publisher))
        }
    }

    /// Unsubscribes the worker: its sockets close (or its polls stop) and
    /// nothing more is applied for it. Its index is left alone (deleting
    /// the worker from the shards is the caller's business).
    pub fn remove(&self, worker: WorkerId) -> Result<(), IngestError> {
        self.drain(Command::Remove(worker))?;
        self.send(Command::Remove(worker))
    }

    /// Warm start: subscriptions opened from now on are held (live
    /// batches kept, nothing applied) until a seed or
    /// [`release_holds`](Self::release_holds), and at the latest at
    /// `deadline`, after which they start as usual. Drained (`http://`)
    /// publishers are never held: their drain has no sequence to continue.
    pub fn hold_for_seeds(&self, deadline: Instant) -> Result<(), IngestError> {
        self.send(Command::Hold(deadline))
    }

    /// Ends the hold: streams not seeded start as usual.
    pub fn release_holds(&self) -> Result<(), IngestError> {
        self.send(Command::Release)
    }

    /// Seeds a held worker with a peer's export (see the `warm` module);
    /// the answer is the shard's import.
    /// An import the shard refuses (another block size, the worker gone)
    /// starts the worker's stream over, as a new subscription: it went on
    /// from the peer's cut without the peer's blocks.
    pub async fn seed(&self, seed: WorkerSeed) -> Result<Result<Applied, ImportError>, SeedRefused> {
        // Checked here, not on the ingest thread: a large export's check
        // would pause every stream.
        seed.snapshot.blocks.check().map_err(SeedRefused::Malformed)?;
        let worker = seed.worker;
        let (reply, answer) = oneshot::channel();
        self.send(Command::Seed(Box::new(seed), reply)).map_err(|_| SeedRefused::Stopped)?;
        let imported = answer.await.map_err(|_| SeedRefused::Stopped)??;
        let imported = imported.await.map_err(|_| SeedRefused::Stopped)?;
        if imported.is_err() {
            self.send(Command::Restart(worker)).map_err(|_| SeedRefused::Stopped)?;
        }
        Ok(imported)
    }

    /// The worker's index and where its stream stood, for a peer starting
    /// up; `None` for a worker with no steady stream here (not
    /// subscribed, held, replaying, or drained over HTTP).
    pub async fn export(&self, worker: WorkerId) -> Result<Option<(StreamCut, WorkerSnapshot)>, IngestError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Export(worker, reply))?;
        let Some((cut, exported)) = answer.await.map_err(|_| IngestError::Stopped)? else { return Ok(None) };
        let snapshot = exported.await.map_err(|_| IngestError::Stopped)?;
        Ok(snapshot.map(|snapshot| (cut, snapshot)))
    }

    pub fn metrics(&self) -> &Arc<IngestMetrics> {
        &self.metrics
    }

    /// Stops the thread and waits for it: every socket is closed on return.
    pub fn shutdown(mut self) -> Result<(), IngestError> {
        self.stop()
    }

    fn send(&self, command: Command) -> Result<(), IngestError> {
        self.commands.send(command).map_err(|_| IngestError::Stopped)?;
        self.waker.wake();
        Ok(())
    }

    fn drain(&self, command: Command) -> Result<(), IngestError> {
        if self.drains.send(command) { Ok(()) } else { Err(IngestError::Stopped) }
    }

    fn stop(&mut self) -> Result<(), IngestError> {
        let drains_ended = self.drains.stop();
        let Some(thread) = self.thread.take() else { return Ok(()) };
        // A stopped thread no longer listens; joining tells how it ended.
        let _ = self.send(Command::Shutdown);
        let zmq_ended = thread.join().is_ok();
        if drains_ended && zmq_ended { Ok(()) } else { Err(IngestError::Panicked) }
    }
}

impl Drop for KvEventIngest {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::error!(%error, "KV-event ingest ended badly");
        }
    }
}
