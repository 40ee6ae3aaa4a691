//! The handle to the ingest thread.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use kvpick_core::WorkerId;

use super::config::{IngestConfig, Publisher};
use super::metrics::IngestMetrics;
use super::poll_loop::{Command, PollLoop};
use super::sink::KvEventSink;
use super::waker::Waker;

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
}

impl KvEventIngest {
    /// Starts the thread, with no publishers yet. Every decoded event goes
    /// to `sink`, on that thread.
    pub fn spawn<S: KvEventSink + 'static>(cfg: IngestConfig, sink: S) -> Result<Self, IngestError> {
        let ctx = zmq::Context::new();
        let (waker, wake) = Waker::pair(&ctx)?;
        let (commands, receiver) = crossbeam_channel::unbounded();
        let metrics = Arc::new(IngestMetrics::default());
        let poll_loop = PollLoop {
            ctx,
            cfg: Arc::new(cfg),
            sink,
            metrics: Arc::clone(&metrics),
            commands: receiver,
            wake,
            subscriptions: Vec::new(),
        };
        let thread = std::thread::Builder::new().name("kvpick-kv-ingest".into()).spawn(move || poll_loop.run())?;
        Ok(KvEventIngest { commands, waker, metrics, thread: Some(thread) })
    }

    /// Subscribes to `publisher`'s events for its worker, replacing the
    /// worker's previous publisher if it differs (same one: no-op, its
    /// stream state is kept).
    pub fn add(&self, publisher: Publisher) -> Result<(), IngestError> {
        self.send(Command::Add(publisher))
    }

    /// Unsubscribes the worker: its sockets close and nothing more is
    /// applied for it. Its index is left alone (deleting the worker from
    /// the shards is the caller's business).
    pub fn remove(&self, worker: WorkerId) -> Result<(), IngestError> {
        self.send(Command::Remove(worker))
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

    fn stop(&mut self) -> Result<(), IngestError> {
        let Some(thread) = self.thread.take() else { return Ok(()) };
        // A stopped thread no longer listens; joining tells how it ended.
        let _ = self.send(Command::Shutdown);
        thread.join().map_err(|_| IngestError::Panicked)
    }
}

impl Drop for KvEventIngest {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::error!(%error, "KV-event ingest ended badly");
        }
    }
}
