//! One publisher: its SUB socket, its replay in flight, its ordering.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::apply::{BatchApplier, Outlet, now_seconds};
use super::config::{IngestConfig, Publisher, millis_i32};
use super::metrics::{IngestMetrics, WorkerMetrics, add};
use super::replay::ReplaySession;
use super::sink::Imported;
use super::warm::{SeedRefused, StreamCut};
use crate::wire::GroupKinds;
use crate::wire::batch_ts;
use crate::wire::frames::{FrameError, ReplayReply, parse_live, parse_replay};
use crate::wire::sequencer::{ReplayEnd, ReplayKind, Sequencer, Step};
use kvpick_core::shard::WorkerSnapshot;

pub(crate) struct Subscription {
    publisher: Publisher,
    ctx: zmq::Context,
    cfg: Arc<IngestConfig>,
    socket: zmq::Socket,
    /// libzmq's events of `socket` (a PAIR on an inproc endpoint): a
    /// `CONNECTED` is the live connection made, or made again.
    monitor: zmq::Socket,
    replay: Option<ReplaySession>,
    sequencer: Sequencer<Vec<u8>>,
    applier: BatchApplier,
    gauges: Arc<WorkerMetrics>,
    /// Scratch list of steps; empty between calls.
    steps: Vec<Step<Vec<u8>>>,
    /// The first bad message is a warning, the rest debug lines.
    warned: bool,
    /// The live socket's first connection was seen: a later one is a
    /// reconnect.
    connected_once: bool,
}

impl Subscription {
    /// Connects a SUB socket (libzmq dials in the background and redials
    /// with back-off; a dead peer is noticed by heartbeats).
    pub(crate) fn open(
        ctx: &zmq::Context,
        cfg: &Arc<IngestConfig>,
        publisher: Publisher,
        metrics: &IngestMetrics,
    ) -> Result<Self, zmq::Error> {
        let socket = ctx.socket(zmq::SUB)?;
        socket.set_linger(0)?;
        socket.set_rcvhwm(cfg.receive_high_water_mark)?;
        socket.set_maxmsgsize(cfg.max_frame_bytes)?;
        socket.set_reconnect_ivl(millis_i32(cfg.reconnect_interval))?;
        socket.set_reconnect_ivl_max(millis_i32(cfg.reconnect_interval_max))?;
        if !cfg.heartbeat_interval.is_zero() {
            socket.set_heartbeat_ivl(millis_i32(cfg.heartbeat_interval))?;
            socket.set_heartbeat_timeout(millis_i32(cfg.heartbeat_timeout))?;
            // Lets the publisher drop us as fast if we die (libzmq's bound).
            socket.set_heartbeat_ttl(millis_i32(cfg.heartbeat_timeout).min(6_553_500))?;
        }
        socket.set_subscribe(&publisher.topic)?;
        // The monitor first, so the first connection is seen too.
        static MONITORS: AtomicU64 = AtomicU64::new(0);
        let monitor_endpoint =
            format!("inproc://kvpick-kv-events-{}-{}", publisher.worker.0, MONITORS.fetch_add(1, Ordering::Relaxed));
        socket.monitor(&monitor_endpoint, i32::from(zmq::SocketEvent::CONNECTED.to_raw()))?;
        let monitor = ctx.socket(zmq::PAIR)?;
        monitor.set_linger(0)?;
        monitor.connect(&monitor_endpoint)?;
        socket.connect(&publisher.endpoint)?;
        let can_replay = publisher.replay_endpoint.is_some();
        Ok(Subscription {
            applier: BatchApplier::new(publisher.worker),
            gauges: metrics.register(publisher.worker),
            sequencer: Sequencer::new(can_replay, cfg.replay_buffer_limit).with_stamps(|payload| batch_ts(payload)),
            publisher,
            ctx: ctx.clone(),
            cfg: Arc::clone(cfg),
            socket,
            monitor,
            replay: None,
            steps: Vec::new(),
            warned: false,
            connected_once: false,
        })
    }

    pub(crate) fn gauges(&self) -> &Arc<WorkerMetrics> {
        &self.gauges
    }

    pub(crate) fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    pub(crate) fn socket(&self) -> &zmq::Socket {
        &self.socket
    }

    pub(crate) fn monitor_socket(&self) -> &zmq::Socket {
        &self.monitor
    }

    /// Reads the live socket's connection events. A connection made asks
    /// the engine for its history from 0 (see `ReplayKind::Reconnect`): it
    /// may have restarted in place while the connection was down. On the
    /// first connection this is the catch-up already asked for (nothing
    /// more), or asks it again if that one failed while the engine was down.
    pub(crate) fn read_monitor(&mut self, out: &mut Outlet<'_>) {
        // Each event is two frames: 6 bytes (event id u16, value u32, in
        // the host's byte order), then the endpoint.
        while let Ok(frames) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            let event = frames.first().and_then(|f| f.get(..2)).map(|b| u16::from_ne_bytes([b[0], b[1]]));
            if event != Some(zmq::SocketEvent::CONNECTED.to_raw()) {
                continue;
            }
            // The old connection's messages first, so none is taken for the
            // new one's.
            while self.read_live(out) {}
            // A first connection of a held or seeded stream is not a
            // reconnect: its history is the peer's export (warm start).
            let first = !std::mem::replace(&mut self.connected_once, true);
            if first && (self.sequencer.is_held() || self.sequencer.last().is_some()) {
                continue;
            }
            if self.sequencer.last().is_some() {
                tracing::info!(worker = self.worker(), "KV event connection back: asking the engine for its history");
            }
            self.sequencer.reconnected(&mut self.steps);
            self.run_steps(out);
        }
    }

    pub(crate) fn replay_socket(&self) -> Option<&zmq::Socket> {
        self.replay.as_ref().map(ReplaySession::socket)
    }

    pub(crate) fn replay_deadline(&self) -> Option<Instant> {
        self.replay.as_ref().map(ReplaySession::deadline)
    }

    /// Asks the engine for its history at once (see [`Sequencer::catch_up`]).
    pub(crate) fn catch_up(&mut self, out: &mut Outlet<'_>) {
        self.sequencer.catch_up(&mut self.steps);
        self.run_steps(out);
    }

    /// Holds the stream for a seed (warm start); false once anything was
    /// applied or asked for.
    pub(crate) fn hold(&mut self) -> bool {
        self.sequencer.hold()
    }

    /// No seed came: the stream starts as an unheld one would have.
    pub(crate) fn release(&mut self, out: &mut Outlet<'_>) {
        if self.sequencer.is_held() {
            add(&out.metrics.counters.streams_released_cold, 1);
            tracing::info!(
                worker = self.worker(),
                "KV events: no index from a peer; learning this worker's cache from its engine"
            );
            self.sequencer.release(&mut self.steps);
            self.run_steps(out);
        }
    }

    /// Takes a peer's export of the worker: imported ahead of every event
    /// handed over after it, then the stream continues from the cut.
    pub(crate) fn seed(
        &mut self,
        cut: StreamCut,
        snapshot: WorkerSnapshot,
        out: &mut Outlet<'_>,
    ) -> Result<Imported, SeedRefused> {
        if !self.sequencer.is_held() {
            return Err(SeedRefused::NotHeld);
        }
        let blocks = snapshot.blocks.blocks.len();
        let imported = out.sink.import(self.publisher.worker, snapshot).ok_or(SeedRefused::CannotImport)?;
        self.applier.seed_groups(GroupKinds::from_learned(cut.groups));
        add(&out.metrics.counters.streams_seeded, 1);
        tracing::info!(
            worker = self.worker(),
            last_seq = cut.last_seq,
            blocks,
            "KV events: worker's index taken from a peer; continuing its stream from there"
        );
        self.gauges.applied(cut.last_seq, cut.last_ts.map_or(0.0, |ts| now_seconds() - ts));
        self.sequencer.seed(cut.last_seq, cut.last_ts, &mut self.steps);
        self.run_steps(out);
        Ok(imported)
    }

    /// Where the stream stands, for an export (`None` while it is held or
    /// a replay is in flight: the index is not at one batch's end then).
    pub(crate) fn cut(&self) -> Option<StreamCut> {
        let (last_seq, last_ts) = self.sequencer.cut()?;
        Some(StreamCut { last_seq, last_ts, groups: self.applier.groups().learned_all() })
    }

    /// Handles up to `messages_per_turn` live messages waiting on the
    /// socket; `true` when that many were read (more may wait).
    pub(crate) fn read_live(&mut self, out: &mut Outlet<'_>) -> bool {
        for _ in 0..self.cfg.messages_per_turn {
            let frames = match self.socket.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => frames,
                Err(zmq::Error::EAGAIN) => return false,
                Err(error) => {
                    add(&out.metrics.counters.socket_errors, 1);
                    tracing::warn!(worker = self.worker(), %error, "KV event socket receive failed");
                    return false;
                }
            };
            match parse_live(frames) {
                Ok(message) => {
                    let held = self.sequencer.is_held();
                    self.sequencer.live(message.seq, message.payload, &mut self.steps);
                    if held && !self.sequencer.is_held() {
                        // The hold's buffer was full: started as unheld.
                        add(&out.metrics.counters.streams_released_cold, 1);
                        tracing::warn!(
                            worker = self.worker(),
                            "KV events: too many batches held waiting for a peer's index; learning this worker's cache from its engine"
                        );
                    }
                    self.run_steps(out);
                }
                Err(error) => self.bad_frames(out, &error),
            }
        }
        true
    }

    /// Handles up to `messages_per_turn` replies of the replay in flight.
    pub(crate) fn read_replay(&mut self, out: &mut Outlet<'_>) {
        for _ in 0..self.cfg.messages_per_turn {
            let Some(replay) = &mut self.replay else { return };
            let frames = match replay.try_recv() {
                Ok(Some(frames)) => frames,
                Ok(None) => return,
                Err(error) => return self.fail_replay(out, &format!("receive failed: {error}")),
            };
            match parse_replay(frames) {
                Ok(ReplayReply::Batch { seq, payload }) => self.sequencer.replayed(seq, payload, &mut self.steps),
                Ok(ReplayReply::End) => {
                    self.replay = None;
                    self.sequencer.end_replay(ReplayEnd::Completed, &mut self.steps);
                }
                Err(error) => self.bad_frames(out, &error),
            }
            self.run_steps(out);
        }
    }

    /// A replay silent past its deadline is asked again from where it
    /// stopped: at once if it applied batches since it was (last) asked
    /// for (an answer cut short, see [`Sequencer::resume_replay`]); if it
    /// applied none, up to `replay_attempts` silent ones in a row (the
    /// replay socket down for a moment), then given up. Retries either
    /// make progress or are counted, so they end.
    pub(crate) fn expire_replay(&mut self, now: Instant, out: &mut Outlet<'_>) {
        if self.replay_deadline().is_none_or(|deadline| deadline > now) {
            return;
        }
        let worker = self.worker();
        let last_seq = self.sequencer.last();
        if self.sequencer.answered() {
            add(&out.metrics.counters.replays_resumed, 1);
            tracing::debug!(worker, ?last_seq, "KV event replay cut short: asking again");
        } else {
            // Only a batch applied starts the count again: a reply that
            // repeats what was applied must not keep a replay alive.
            let attempt = self.sequencer.silent_replays() + 1;
            if attempt >= self.cfg.replay_attempts.max(1) {
                return self.fail_replay(out, "timed out");
            }
            add(&out.metrics.counters.replays_retried, 1);
            tracing::debug!(worker, ?last_seq, attempt, "KV event replay unanswered: asking again");
        }
        self.replay = None;
        self.sequencer.resume_replay(&mut self.steps);
        self.run_steps(out);
    }

    fn fail_replay(&mut self, out: &mut Outlet<'_>, why: &str) {
        self.replay = None;
        add(&out.metrics.counters.replays_failed, 1);
        tracing::warn!(worker = self.worker(), last_seq = ?self.sequencer.last(), "KV event replay {why}");
        self.sequencer.end_replay(ReplayEnd::Failed, &mut self.steps);
        self.run_steps(out);
    }

    /// Executes the sequencer's steps in order. Executing one may queue
    /// more (a replay that cannot open ends at once); a `Replay` step is
    /// always the last of its batch, so those run after it, still in order.
    fn run_steps(&mut self, out: &mut Outlet<'_>) {
        loop {
            let mut steps = std::mem::take(&mut self.steps);
            if steps.is_empty() {
                break;
            }
            for step in steps.drain(..) {
                self.run_step(step, out);
            }
            if self.steps.is_empty() {
                // Keep the allocation for the next message.
                self.steps = steps;
            }
        }
        self.gauges.set_replaying(self.replay.is_some());
    }

    fn run_step(&mut self, step: Step<Vec<u8>>, out: &mut Outlet<'_>) {
        let counters = &out.metrics.counters;
        let worker = self.worker();
        match step {
            Step::Apply { seq, payload, replayed } => {
                if replayed {
                    add(&counters.replayed_batches, 1);
                }
                self.applier.apply(seq, &payload, out, &self.gauges);
            }
            Step::Clear => {
                add(&counters.engine_restarts, 1);
                tracing::info!(worker, "KV event sequence went back: engine restarted, its blocks cleared");
                self.applier.clear(out);
            }
            Step::Gap { from, to } => {
                add(&counters.gaps, 1);
                tracing::debug!(worker, from, to, "KV event sequence gap");
            }
            Step::Lost { from, to, cause } => {
                add(&counters.lost_batches, to - from + 1);
                tracing::warn!(worker, from, to, ?cause, "KV event batches lost");
            }
            Step::Replay { from, kind } => self.start_replay(from, kind, out),
            Step::AbandonReplay => {
                self.replay = None;
                add(&counters.replays_failed, 1);
                tracing::warn!(worker, "KV event replay given up: too many live batches buffered meanwhile");
            }
            Step::Duplicate { .. } => add(&counters.duplicate_batches, 1),
            Step::Late { seq } => {
                add(&counters.late_batches, 1);
                tracing::debug!(worker, seq, last_seq = ?self.sequencer.last(), "KV event batch overtaken by a later one: dropped");
            }
            Step::Rebuild => {
                add(&counters.rebuilds, 1);
                tracing::info!(
                    worker,
                    "KV events reconnected: the worker's blocks relearned from the engine's whole history"
                );
                self.applier.clear(out);
            }
        }
    }

    fn start_replay(&mut self, from: u64, kind: ReplayKind, out: &mut Outlet<'_>) {
        add(&out.metrics.counters.replays_started, 1);
        tracing::debug!(worker = self.worker(), from, ?kind, "KV event replay requested");
        let Some(endpoint) = &self.publisher.replay_endpoint else {
            // The sequencer asks only when an endpoint exists.
            return self.fail_replay(out, "has no endpoint");
        };
        match ReplaySession::start(&self.ctx, endpoint, from, self.cfg.replay_idle_timeout, self.cfg.max_frame_bytes) {
            Ok(session) => self.replay = Some(session),
            Err(error) => {
                add(&out.metrics.counters.socket_errors, 1);
                self.fail_replay(out, &format!("could not start: {error}"));
            }
        }
    }

    fn bad_frames(&mut self, out: &mut Outlet<'_>, error: &FrameError) {
        add(&out.metrics.counters.bad_frames, 1);
        if std::mem::replace(&mut self.warned, true) {
            tracing::debug!(worker = self.worker(), %error, "KV event message skipped");
        } else {
            tracing::warn!(worker = self.worker(), %error, "KV event message skipped (further ones logged at debug)");
        }
    }

    fn worker(&self) -> u64 {
        self.publisher.worker.0
    }
}
