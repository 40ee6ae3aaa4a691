//! The KV-event publisher: a real ZMQ PUB socket and replay ROUTER, on a
//! thread of their own, like vLLM's `ZmqEventPublisher` (engines.md §1.4).
//!
//! Live messages are `[topic, seq (8 bytes, big-endian), payload]`, `seq`
//! counting from 0. Every batch is remembered in a bounded
//! [`ReplayBuffer`]; the ROUTER answers a DEALER's `["", start_seq]` with
//! each remembered batch with `seq ≥ start`, then an end marker, in the
//! configured [`ReplayLayout`]. Requests of another shape are ignored, as
//! vLLM does.
//!
//! Fault knobs:
//! - **drop**: a batch is lost with the given probability (seeded). Its
//!   sequence number is used and it is remembered for replay, but it never
//!   goes out on PUB: the subscriber sees a gap that replay can heal.
//! - **stall**: batches are held, without a sequence number, until the
//!   stall ends (vLLM's publisher queue behind a stuck thread).
//! - **reorder**: batches go out in swapped pairs, each numbered batch
//!   after the next one (N+1, then N): a batch overtaken on the way. A
//!   single ZMQ connection keeps order; this is the fault a relay or a
//!   second path would add, and what a subscriber must not take for a
//!   restart. An odd batch left when it ends goes out then.
//! - **restart**: sequence numbers start again at 0, the replay buffer and
//!   held batches are forgotten, and optionally `AllBlocksCleared` goes out
//!   first (as seq 0).
//!
//! The engine loop hands batches over a channel and rings an inproc
//! doorbell so the thread can sleep in `zmq::poll` on the ROUTER and the
//! doorbell together.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use super::config::{EngineConfig, Flavour, ReplayLayout};
use super::error::SimError;
use super::event_batch::{BatchEncoder, CacheEvent};
use super::event_drain::EventDrain;
use super::replay_buffer::ReplayBuffer;

/// Sequence number of the end-of-replay marker.
pub const END_SEQ: u64 = u64::MAX;

enum PublisherCommand {
    Batch(Vec<CacheEvent>),
    SetDropFraction(f64),
    SetStalled(bool),
    SetReordering(bool),
    SetReplayDown(bool),
    Restart { announce_clear: bool },
    Stop,
}

/// What the publisher has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches sent on the PUB socket.
    pub sent: u64,
    /// Batches lost on purpose (drop knob) or to the PUB high-water mark.
    pub dropped: u64,
    /// The sequence number the next batch gets.
    pub next_seq: u64,
    /// Batches in the replay buffer.
    pub buffered: u64,
    /// Batches held by a stall.
    pub held: u64,
    /// Batches sent after the one numbered next (reorder knob).
    pub overtaken: u64,
    /// Replay requests answered.
    pub replays: u64,
    /// Batches sent in replay answers.
    pub replayed: u64,
    /// Replay requests ignored for their shape.
    pub bad_replay_requests: u64,
    /// Replay requests left unanswered while the replay socket was down.
    pub unanswered_replays: u64,
    /// TensorRT-LLM flavour: events handed out by `/kv_cache_events`.
    pub drained: u64,
    /// TensorRT-LLM flavour: events discarded by a full buffer.
    pub discarded: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    dropped: AtomicU64,
    next_seq: AtomicU64,
    buffered: AtomicU64,
    held: AtomicU64,
    overtaken: AtomicU64,
    replays: AtomicU64,
    replayed: AtomicU64,
    bad_replay_requests: AtomicU64,
    unanswered_replays: AtomicU64,
}

/// The engine's handle on its publisher thread.
pub(crate) struct Publisher {
    commands: Sender<PublisherCommand>,
    doorbell: Mutex<zmq::Socket>,
    counters: Arc<Counters>,
    thread: Mutex<Option<JoinHandle<()>>>,
    events_endpoint: String,
    replay_endpoint: String,
    /// TensorRT-LLM's drained buffer: where batches go instead of PUB.
    drain: Option<Arc<EventDrain>>,
}

fn zmq_err(what: &'static str) -> impl FnOnce(zmq::Error) -> SimError {
    move |source| SimError::Zmq { what, source }
}

fn bind(socket: &zmq::Socket, host: Ipv4Addr, port: Option<u16>, what: &'static str) -> Result<String, SimError> {
    let addr = match port {
        Some(p) => format!("tcp://{host}:{p}"),
        None => format!("tcp://{host}:*"),
    };
    socket.bind(&addr).map_err(zmq_err(what))?;
    match socket.get_last_endpoint().map_err(zmq_err(what))? {
        Ok(endpoint) => Ok(endpoint),
        Err(_) => Err(SimError::Zmq { what, source: zmq::Error::EINVAL }),
    }
}

impl Publisher {
    /// Binds the PUB and ROUTER sockets on the engine's host and starts the thread.
    pub(crate) fn start(cfg: &EngineConfig) -> Result<Publisher, SimError> {
        static DOORBELLS: AtomicU64 = AtomicU64::new(0);
        let ctx = zmq::Context::new();
        let publish = ctx.socket(zmq::PUB).map_err(zmq_err("PUB socket"))?;
        publish.set_linger(0).map_err(zmq_err("PUB linger"))?;
        publish.set_sndhwm(cfg.pub_hwm).map_err(zmq_err("PUB high-water mark"))?;
        let events_endpoint = bind(&publish, cfg.host, cfg.ports.events, "bind PUB")?;
        let replay = ctx.socket(zmq::ROUTER).map_err(zmq_err("ROUTER socket"))?;
        replay.set_linger(0).map_err(zmq_err("ROUTER linger"))?;
        let replay_endpoint = bind(&replay, cfg.host, cfg.ports.replay, "bind ROUTER")?;
        let bell_name = format!(
            "inproc://kvpick-sim-doorbell-{}-{}",
            std::process::id(),
            DOORBELLS.fetch_add(1, Ordering::Relaxed)
        );
        let bell = ctx.socket(zmq::PAIR).map_err(zmq_err("doorbell socket"))?;
        bell.bind(&bell_name).map_err(zmq_err("bind doorbell"))?;
        let doorbell = ctx.socket(zmq::PAIR).map_err(zmq_err("doorbell socket"))?;
        doorbell.set_linger(0).map_err(zmq_err("doorbell linger"))?;
        doorbell.connect(&bell_name).map_err(zmq_err("connect doorbell"))?;

        let (commands, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let worker = PublisherLoop {
            publish,
            replay,
            bell,
            commands: rx,
            encoder: BatchEncoder { encoding: cfg.encoding, hash_format: cfg.hash_format, dp_rank: cfg.dp_rank },
            topic: cfg.topic.clone().into_bytes(),
            layout: cfg.replay_layout,
            buffer: ReplayBuffer::new(cfg.replay_buffer),
            next_seq: 0,
            held: VecDeque::new(),
            stalled: false,
            reordering: false,
            overtaken: None,
            replay_down: false,
            drop_fraction: 0.0,
            rng: fastrand::Rng::with_seed(cfg.seed ^ 0xd809_ba7c_4e55_0000),
            counters: Arc::clone(&counters),
            name: cfg.name.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("sim-pub-{}", cfg.name))
            .spawn(move || worker.run())
            .map_err(SimError::Thread)?;
        Ok(Publisher {
            commands,
            doorbell: Mutex::new(doorbell),
            counters,
            thread: Mutex::new(Some(thread)),
            events_endpoint,
            replay_endpoint,
            drain: (cfg.flavour == Flavour::Trtllm).then(|| {
                let window = cfg.max_model_len;
                let rank = (cfg.dp_rank > 0).then_some(cfg.dp_rank);
                Arc::new(EventDrain::new(cfg.event_buffer_max_size, window, rank, cfg.num_blocks))
            }),
        })
    }

    /// TensorRT-LLM's event buffer, when the engine plays `trtllm-serve`.
    pub(crate) fn drain(&self) -> Option<&Arc<EventDrain>> {
        self.drain.as_ref()
    }

    /// `tcp://127.0.0.1:port` of the PUB socket.
    pub(crate) fn events_endpoint(&self) -> &str {
        &self.events_endpoint
    }

    /// `tcp://127.0.0.1:port` of the replay ROUTER.
    pub(crate) fn replay_endpoint(&self) -> &str {
        &self.replay_endpoint
    }

    /// Publishes one batch (one engine step's events).
    pub(crate) fn publish(&self, events: Vec<CacheEvent>) {
        match &self.drain {
            Some(drain) => drain.push(&events),
            None => self.send(PublisherCommand::Batch(events)),
        }
    }

    pub(crate) fn set_drop_fraction(&self, fraction: f64) {
        self.send(PublisherCommand::SetDropFraction(fraction.clamp(0.0, 1.0)));
    }

    pub(crate) fn set_stalled(&self, stalled: bool) {
        self.send(PublisherCommand::SetStalled(stalled));
    }

    pub(crate) fn set_reordering(&self, reordering: bool) {
        self.send(PublisherCommand::SetReordering(reordering));
    }

    pub(crate) fn set_replay_down(&self, down: bool) {
        self.send(PublisherCommand::SetReplayDown(down));
    }

    pub(crate) fn restart(&self, announce_clear: bool) {
        match &self.drain {
            // A new KV cache manager always announces itself (`created`).
            Some(drain) => drain.restart(),
            None => self.send(PublisherCommand::Restart { announce_clear }),
        }
    }

    pub(crate) fn stats(&self) -> PublisherStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PublisherStats {
            sent: get(&c.sent),
            dropped: get(&c.dropped),
            next_seq: get(&c.next_seq),
            buffered: get(&c.buffered),
            held: get(&c.held),
            overtaken: get(&c.overtaken),
            replays: get(&c.replays),
            replayed: get(&c.replayed),
            bad_replay_requests: get(&c.bad_replay_requests),
            unanswered_replays: get(&c.unanswered_replays),
            drained: self.drain.as_ref().map_or(0, |d| d.counts().0),
            discarded: self.drain.as_ref().map_or(0, |d| d.counts().1),
        }
    }

    /// Stops the thread, closing the sockets, and waits for it (blocking:
    /// call from a blocking context). Idempotent.
    pub(crate) fn stop(&self) {
        self.send(PublisherCommand::Stop);
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!(endpoint = %self.events_endpoint, "KV-event publisher thread panicked");
        }
    }

    fn send(&self, command: PublisherCommand) {
        // A send fails only once the thread is gone: nothing left to tell.
        if self.commands.send(command).is_ok()
            && let Ok(bell) = self.doorbell.lock()
        {
            // EAGAIN: the doorbell already rings, the thread will drain.
            let _ = bell.send(&[][..], zmq::DONTWAIT);
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Ends the thread without waiting for it.
        let _ = self.commands.send(PublisherCommand::Stop);
        if let Ok(bell) = self.doorbell.lock() {
            let _ = bell.send(&[][..], zmq::DONTWAIT);
        }
    }
}

struct PublisherLoop {
    publish: zmq::Socket,
    replay: zmq::Socket,
    bell: zmq::Socket,
    commands: Receiver<PublisherCommand>,
    encoder: BatchEncoder,
    topic: Vec<u8>,
    layout: ReplayLayout,
    buffer: ReplayBuffer,
    next_seq: u64,
    held: VecDeque<Vec<u8>>,
    stalled: bool,
    reordering: bool,
    /// A numbered batch waiting for the next one to overtake it.
    overtaken: Option<(u64, Vec<u8>)>,
    /// Replay requests are read and dropped, as if they never arrived.
    replay_down: bool,
    drop_fraction: f64,
    rng: fastrand::Rng,
    counters: Arc<Counters>,
    name: String,
}

impl PublisherLoop {
    fn run(mut self) {
        loop {
            let (replay_ready, bell_ready) = {
                let mut items = [self.replay.as_poll_item(zmq::POLLIN), self.bell.as_poll_item(zmq::POLLIN)];
                match zmq::poll(&mut items, -1) {
                    Ok(_) => {}
                    Err(zmq::Error::EINTR) => continue,
                    Err(error) => {
                        tracing::error!(engine = %self.name, %error, "KV-event publisher cannot poll; stopping");
                        return;
                    }
                }
                (items[0].is_readable(), items[1].is_readable())
            };
            if bell_ready {
                while self.bell.recv_bytes(zmq::DONTWAIT).is_ok() {}
            }
            loop {
                match self.commands.try_recv() {
                    Ok(PublisherCommand::Stop) | Err(TryRecvError::Disconnected) => return,
                    Ok(command) => self.handle(command),
                    Err(TryRecvError::Empty) => break,
                }
            }
            if replay_ready {
                self.serve_replays();
            }
        }
    }

    fn handle(&mut self, command: PublisherCommand) {
        match command {
            PublisherCommand::Batch(events) => self.submit(&events),
            PublisherCommand::SetDropFraction(fraction) => self.drop_fraction = fraction,
            PublisherCommand::SetReplayDown(down) => self.replay_down = down,
            PublisherCommand::SetReordering(reordering) => {
                self.reordering = reordering;
                if !reordering && let Some((seq, payload)) = self.overtaken.take() {
                    self.send_live(seq, &payload);
                }
            }
            PublisherCommand::SetStalled(stalled) => {
                self.stalled = stalled;
                while !self.stalled
                    && let Some(payload) = self.held.pop_front()
                {
                    self.emit(payload);
                }
                self.counters.held.store(self.held.len() as u64, Ordering::Relaxed);
            }
            PublisherCommand::Restart { announce_clear } => {
                self.next_seq = 0;
                self.buffer.clear();
                self.held.clear();
                self.overtaken = None;
                self.counters.next_seq.store(0, Ordering::Relaxed);
                self.counters.buffered.store(0, Ordering::Relaxed);
                self.counters.held.store(0, Ordering::Relaxed);
                if announce_clear {
                    self.submit(&[CacheEvent::Cleared]);
                }
            }
            PublisherCommand::Stop => {}
        }
    }

    fn submit(&mut self, events: &[CacheEvent]) {
        let payload = self.encoder.encode(unix_now(), events);
        if self.stalled {
            self.held.push_back(payload);
            self.counters.held.store(self.held.len() as u64, Ordering::Relaxed);
        } else {
            self.emit(payload);
        }
    }

    /// Numbers, remembers and sends (or drops) one batch.
    fn emit(&mut self, payload: Vec<u8>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.counters.next_seq.store(self.next_seq, Ordering::Relaxed);
        let dropped = self.drop_fraction > 0.0 && self.rng.f64() < self.drop_fraction;
        if dropped {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(engine = %self.name, seq, "dropping a KV-event batch (fault knob)");
        } else if self.reordering {
            match self.overtaken.take() {
                None => self.overtaken = Some((seq, payload.clone())),
                Some((earlier, held)) => {
                    self.send_live(seq, &payload);
                    self.send_live(earlier, &held);
                    self.counters.overtaken.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else {
            self.send_live(seq, &payload);
        }
        self.buffer.push(seq, payload);
        self.counters.buffered.store(self.buffer.len() as u64, Ordering::Relaxed);
    }

    fn send_live(&self, seq: u64, payload: &[u8]) {
        let frames: [&[u8]; 3] = [&self.topic, &seq.to_be_bytes(), payload];
        match self.publish.send_multipart(frames, zmq::DONTWAIT) {
            Ok(()) => {
                self.counters.sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(engine = %self.name, seq, %error, "KV-event batch not sent");
            }
        }
    }

    fn serve_replays(&mut self) {
        while let Ok(frames) = self.replay.recv_multipart(zmq::DONTWAIT) {
            if self.replay_down {
                self.counters.unanswered_replays.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // A DEALER's ["", start] arrives as [identity, "", start].
            let start = match frames.as_slice() {
                [_, delimiter, start] if delimiter.is_empty() => <[u8; 8]>::try_from(start.as_slice()).ok(),
                _ => None,
            };
            let Some(start) = start.map(u64::from_be_bytes) else {
                self.counters.bad_replay_requests.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(engine = %self.name, frames = frames.len(), "malformed replay request ignored");
                continue;
            };
            let identity = frames[0].as_slice();
            let mut sent = 0u64;
            for (seq, payload) in self.buffer.since(start) {
                let seq = seq.to_be_bytes();
                let result = match self.layout {
                    ReplayLayout::WithTopic => {
                        self.replay.send_multipart([identity, &[], &self.topic, &seq, payload], 0)
                    }
                    ReplayLayout::Legacy => self.replay.send_multipart([identity, &[], &seq, payload], 0),
                };
                if let Err(error) = result {
                    tracing::warn!(engine = %self.name, %error, "replay answer cut short");
                    break;
                }
                sent += 1;
            }
            let end = END_SEQ.to_be_bytes();
            let result = match self.layout {
                ReplayLayout::WithTopic => self.replay.send_multipart([identity, &[], &[], &end, &[]], 0),
                ReplayLayout::Legacy => self.replay.send_multipart([identity, &[], &end, &[]], 0),
            };
            if let Err(error) = result {
                tracing::warn!(engine = %self.name, %error, "replay end marker not sent");
            }
            self.counters.replays.fetch_add(1, Ordering::Relaxed);
            self.counters.replayed.fetch_add(sent, Ordering::Relaxed);
            tracing::debug!(engine = %self.name, start, sent, "replay answered");
        }
    }
}

/// Wall-clock seconds since the epoch (vLLM's `time.time()` batch stamp).
fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
