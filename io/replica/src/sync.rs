//! The replica sync: one task between this replica's shards and its peers.
//!
//! Out: the shards tell it of every change to this replica's own bookings
//! (`BookingObserver`, from their threads, never waiting); it numbers them
//! in its `Outbox` and publishes each run of them as one batch, plus a
//! digest every `digest_every` (anti-entropy, and a heartbeat). A peer
//! link that (re)connects or asks for a resync gets a snapshot, in order
//! with the batches.
//!
//! In: frames from peers, decoded and validated by the transport, go
//! through the origin's `Inbox` (exactly once, gaps and restarts found)
//! and what it says to apply goes to the shards of whichever selector has
//! the booking's worker. A gap or a digest mismatch asks the origin for a
//! snapshot; an origin silent for `peer_grace` has its bookings freed.
//!
//! Everything here runs on one task: no lock is held across an await, and
//! a slow peer only ever fills its own link's queue (see `Transport`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use kvpick_core::booking::{BookingEvent, ReservationId};
use kvpick_core::clock::Millis;
use kvpick_core::replica::{Batch, Inbox, InboxConfig, InboxStats, Incarnation, Outbox, PeerEvent, ReplicaId};
use kvpick_core::shard::BookingError;
use kvpick_core::worker::WorkerId;
use kvpick_runtime::{BookingObserver, Clock, ThreadProducers};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::wire::{Frame, Limits, ResyncRequest, encode, encode_snapshot};

/// An outbound link to one peer, named by the transport.
pub type LinkId = u64;

/// How this replica's own frames reach its peers.
pub trait Transport: Send + 'static {
    /// To every peer, in order (batches and digests). A peer whose queue is
    /// full misses it: the gap, or the next digest, makes it ask for a
    /// snapshot, so a slow peer never holds back the others or a pick.
    fn publish(&mut self, frame: &Bytes);
    /// To one peer, in order with what was published before.
    fn send_to(&mut self, link: LinkId, frame: Bytes) -> Sent;
    /// Stops taking frames and lets the links send what they hold; the
    /// tasks to wait for (with a timeout) before the process goes.
    fn close(&mut self) -> Vec<JoinHandle<()>> {
        Vec::new()
    }
}

/// What became of a frame for one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// Its queue is full: tried again at the next digest.
    Full,
    /// No such link (any more).
    Gone,
}

/// The way back to whoever sent an inbound frame (its origin's link):
/// returns false when that stream is full or gone.
#[derive(Clone)]
pub struct Answer(Arc<dyn Fn(Bytes) -> bool + Send + Sync>);

impl Answer {
    pub fn new(send: impl Fn(Bytes) -> bool + Send + Sync + 'static) -> Self {
        Answer(Arc::new(send))
    }

    fn send(&self, frame: Bytes) -> bool {
        (self.0)(frame)
    }
}

/// A peer's frame, decoded and validated.
pub struct Inbound {
    pub frame: Frame,
    pub answer: Answer,
}

#[derive(Clone, Debug)]
pub struct SyncConfig {
    pub replica: ReplicaId,
    pub incarnation: Incarnation,
    /// How often a digest goes to every peer (and overdue resyncs, silent
    /// origins and bookings waiting for their worker are looked at).
    pub digest_every: Duration,
    /// An origin heard nothing from for this long has its bookings freed.
    pub peer_grace: Duration,
    pub inbox: InboxConfig,
    /// What peers take in one frame (batches are split to fit).
    pub limits: Limits,
    /// How long a change may wait for others to share its batch (zero:
    /// each run of changes the shards hand over at once goes at once).
    pub batch_delay: Duration,
}

impl SyncConfig {
    pub fn new(replica: ReplicaId, incarnation: Incarnation) -> Self {
        SyncConfig {
            replica,
            incarnation,
            digest_every: Duration::from_secs(1),
            peer_grace: Duration::from_secs(30),
            inbox: InboxConfig::default(),
            limits: Limits::default(),
            batch_delay: Duration::ZERO,
        }
    }
}

/// One origin as this replica sees it, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OriginView {
    pub stats: InboxStats,
    /// Its live bookings as mirrored here.
    pub live: usize,
    pub last_seq: u64,
    /// The last sequence number its digests showed: `seen - last_seq` is
    /// how far behind this replica is.
    pub seen: u64,
    /// Freed after `peer_grace` of silence (until it is heard again).
    pub forgotten: bool,
    /// Changes of its that this replica's shards refused.
    pub refused: u64,
}

/// What the sync has done, for metrics; read with `SyncStats::snapshot`.
#[derive(Debug, Default)]
pub struct SyncStats {
    inner: Mutex<SyncCounts>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SyncCounts {
    pub own_events: u64,
    pub own_live: usize,
    pub own_last_seq: u64,
    pub batches_published: u64,
    pub snapshots_sent: u64,
    pub snapshots_deferred: u64,
    pub resyncs_asked: u64,
    pub origins: HashMap<ReplicaId, OriginView>,
    /// From a peer's sending a batch (its wall clock) to its changes
    /// applied here, µs: the propagation delay, on one host exact, across
    /// hosts as good as their clocks' agreement (a negative gap counts 0).
    pub delay_micros: Histogram<u64>,
}

impl Default for SyncCounts {
    fn default() -> Self {
        SyncCounts {
            own_events: 0,
            own_live: 0,
            own_last_seq: 0,
            batches_published: 0,
            snapshots_sent: 0,
            snapshots_deferred: 0,
            resyncs_asked: 0,
            origins: HashMap::new(),
            // 1 µs to an hour, 3 significant digits: fixed, so it never
            // allocates while recording.
            delay_micros: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
        }
    }
}

impl SyncStats {
    pub fn snapshot(&self) -> SyncCounts {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn update(&self, f: impl FnOnce(&mut SyncCounts)) {
        f(&mut self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }
}

enum Observed {
    Own(BookingEvent, Millis),
    PeerDropped(ReplicaId, ReservationId),
}

/// The shards' side: hands what they apply to the sync task.
struct ChannelObserver {
    tx: mpsc::UnboundedSender<Observed>,
    /// XORed into this selector's own ids. A disaggregated request books
    /// its prefill and its decode leg under one id, one in each selector;
    /// on the wire the prefill leg's id has its top bit flipped, so the two
    /// are two bookings to the one stream peers follow (and to their
    /// shards, which hold the flipped id in the prefill selector).
    flip: u64,
}

/// The top bit: own ids are a random 32-bit prefix over a counter, so a
/// flipped one is no own id of this replica.
const PREFILL_ID_FLIP: u64 = 1 << 63;

impl BookingObserver for ChannelObserver {
    fn own(&self, event: &BookingEvent, now: Millis) {
        let mut event = event.clone();
        if self.flip != 0 {
            let flip = |id: &mut ReservationId| id.0 ^= self.flip;
            match &mut event {
                BookingEvent::Reserved(booking) => flip(&mut booking.id),
                BookingEvent::PrefillComplete(id) | BookingEvent::Freed(id) => flip(id),
                BookingEvent::Renewed { id, .. } => flip(id),
            }
        }
        let _ = self.tx.send(Observed::Own(event, now));
    }

    fn peer_dropped(&self, origin: ReplicaId, id: ReservationId) {
        // As held here: a peer's prefill leg already has its flipped id.
        let _ = self.tx.send(Observed::PeerDropped(origin, id));
    }
}

/// A running replica sync.
pub struct ReplicaSync {
    inbound: mpsc::Sender<Inbound>,
    snapshots: mpsc::UnboundedSender<LinkId>,
    stats: Arc<SyncStats>,
    task: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

impl ReplicaSync {
    /// Starts the sync task on the current tokio runtime, observing the
    /// bookings of `selectors`: the whole-request (decode) selector first,
    /// then the prefill one when disaggregation is on (its ids are flipped
    /// on the wire, see `ChannelObserver`). Fails if one is observed
    /// already.
    /// `transport` is made with the sender its links ask for snapshots on.
    pub fn spawn<T: Transport>(
        config: SyncConfig,
        selectors: Vec<ThreadProducers>,
        clock: Clock,
        transport: impl FnOnce(mpsc::UnboundedSender<LinkId>) -> T,
    ) -> Result<ReplicaSync, &'static str> {
        let (observed_tx, observed) = mpsc::unbounded_channel();
        for (i, selector) in selectors.iter().enumerate() {
            let observer = ChannelObserver { tx: observed_tx.clone(), flip: if i == 0 { 0 } else { PREFILL_ID_FLIP } };
            if !selector.service().observe_bookings(Arc::new(observer)) {
                return Err("a selector's bookings are observed already");
            }
        }
        let (inbound, inbound_rx) = mpsc::channel(1024);
        let (snapshots, snapshots_rx) = mpsc::unbounded_channel();
        let transport = transport(snapshots.clone());
        let stats = Arc::new(SyncStats::default());
        let state = State {
            outbox: Outbox::new(config.replica, config.incarnation),
            inboxes: HashMap::new(),
            selectors,
            clock,
            transport,
            deferred_snapshots: Vec::new(),
            pending_since: None,
            stats: stats.clone(),
            config,
        };
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(state.run(observed, inbound_rx, snapshots_rx, stop_rx));
        Ok(ReplicaSync { inbound, snapshots, stats, task, stop })
    }

    /// Where the transport hands peers' frames (bounded: a flood waits).
    pub fn inbound(&self) -> mpsc::Sender<Inbound> {
        self.inbound.clone()
    }

    /// Where the transport asks for a snapshot for one of its links (on
    /// connecting, and when the peer asks for a resync).
    pub fn snapshot_requests(&self) -> mpsc::UnboundedSender<LinkId> {
        self.snapshots.clone()
    }

    pub fn stats(&self) -> &Arc<SyncStats> {
        &self.stats
    }

    /// Publishes every change observed so far and a digest, then lets
    /// the links send what they hold, for up to `within`: the frees of the
    /// streams a stopping replica just cut reach its peers.
    pub async fn shutdown(self, within: Duration) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            tracing::warn!(
                within_ms = within.as_millis() as u64,
                "replica sync: peers not all told of the last changes in time"
            );
            task.abort();
        }
    }
}

struct Origin {
    inbox: Inbox,
    heard: Instant,
    /// Its link's way back, for asking again when a resync is overdue.
    answer: Option<Answer>,
    asked: Option<Instant>,
    seen: u64,
    forgotten: bool,
    refused: u64,
}

struct State<T: Transport> {
    config: SyncConfig,
    outbox: Outbox,
    inboxes: HashMap<ReplicaId, Origin>,
    selectors: Vec<ThreadProducers>,
    clock: Clock,
    transport: T,
    /// Links whose snapshot found their queue full.
    deferred_snapshots: Vec<LinkId>,
    /// When the oldest change not yet published reached this task (µs,
    /// wall clock).
    pending_since: Option<u64>,
    stats: Arc<SyncStats>,
}

impl<T: Transport> State<T> {
    async fn run(
        mut self,
        mut observed: mpsc::UnboundedReceiver<Observed>,
        mut inbound: mpsc::Receiver<Inbound>,
        mut snapshots: mpsc::UnboundedReceiver<LinkId>,
        mut stop: oneshot::Receiver<()>,
    ) {
        let mut digest = tokio::time::interval(self.config.digest_every);
        digest.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // With a batch delay, the first change of a batch sets when it goes.
        let mut flush_at: Option<tokio::time::Instant> = None;
        loop {
            let flush = async {
                match flush_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(first) = observed.recv() => {
                    // Whatever else is waiting goes in the same batch.
                    self.observe(first).await;
                    while let Ok(next) = observed.try_recv() {
                        self.observe(next).await;
                    }
                    if self.config.batch_delay.is_zero() {
                        self.publish_batch();
                    } else if flush_at.is_none() {
                        flush_at = Some(tokio::time::Instant::now() + self.config.batch_delay);
                    }
                }
                _ = flush => {
                    flush_at = None;
                    self.publish_batch();
                }
                Some(frame) = inbound.recv() => self.receive(frame).await,
                Some(link) = snapshots.recv() => self.send_snapshot(link),
                _ = digest.tick() => self.every_digest().await,
                _ = &mut stop => break,
                else => break,
            }
        }
        // Stopping: what the shards did last goes out, then the links
        // drain. Frees posted to the shards' rings are heard of only as the
        // shards apply them: read until the shards have been quiet for a
        // moment (at most 100 ms).
        let quiet_until = tokio::time::Instant::now() + Duration::from_millis(100);
        while let Ok(Some(next)) = tokio::time::timeout_at(
            quiet_until.min(tokio::time::Instant::now() + Duration::from_millis(5)),
            observed.recv(),
        )
        .await
        {
            self.observe(next).await;
        }
        self.publish_batch();
        self.transport.publish(&Bytes::from(encode(&Frame::Digest(self.outbox.digest()))));
        for link in self.transport.close() {
            let _ = link.await;
        }
    }

    async fn observe(&mut self, observed: Observed) {
        match observed {
            Observed::Own(event, now) => {
                if self.outbox.record(&event, now) && self.pending_since.is_none() {
                    self.pending_since = Some(unix_micros());
                }
            }
            Observed::PeerDropped(origin_id, id) => {
                // Booked again since (a renewal or a retry ran before this
                // news was read): it stands.
                if self.selectors.iter().any(|s| s.service().holds_peer_booking(origin_id, id)) {
                    return;
                }
                if let Some(origin) = self.inboxes.get_mut(&origin_id) {
                    origin.inbox.not_applied(id);
                }
            }
        }
    }

    fn publish_batch(&mut self) {
        let Some(mut batch) = self.outbox.take_batch() else { return };
        // Stamped with its first change's arrival, so a peer's delay counts
        // the batch delay too.
        batch.sent_unix_micros = self.pending_since.take().unwrap_or_else(unix_micros);
        let events = batch.events.len() as u64;
        // A backlog, a mass expiry or a busy worker's removal can gather
        // more than one frame may carry: consecutive batches then.
        for part in split_batch(batch, &self.config.limits) {
            self.transport.publish(&Bytes::from(encode(&Frame::Batch(part))));
        }
        let (live, last_seq) = (self.outbox.live(), self.outbox.digest().last_seq);
        self.stats.update(|s| {
            s.own_events += events;
            s.batches_published += 1;
            s.own_live = live;
            s.own_last_seq = last_seq;
        });
    }

    fn send_snapshot(&mut self, link: LinkId) {
        // Pending changes first, so the snapshot follows every batch.
        self.publish_batch();
        let snapshot = self.outbox.snapshot(self.clock.now());
        // In parts when large; a link whose queue fills midway gets the
        // whole snapshot again later (its peer drops the broken one).
        let mut sent = Sent::Queued;
        for part in encode_snapshot(&snapshot, &self.config.limits) {
            sent = self.transport.send_to(link, Bytes::from(part));
            if sent != Sent::Queued {
                break;
            }
        }
        if sent == Sent::Full && !self.deferred_snapshots.contains(&link) {
            self.deferred_snapshots.push(link);
        }
        self.stats.update(|s| match sent {
            Sent::Queued => s.snapshots_sent += 1,
            Sent::Full => s.snapshots_deferred += 1,
            Sent::Gone => {}
        });
    }

    async fn receive(&mut self, Inbound { frame, answer }: Inbound) {
        let now = self.clock.now();
        let origin_id = match &frame {
            Frame::Batch(b) => b.origin,
            Frame::Snapshot(s) => s.origin,
            Frame::Digest(d) => d.origin,
            // Asks for our snapshot: only meaningful on our own links; and
            // parts are put together by the transport.
            Frame::Resync(_) | Frame::SnapshotPart(_) => return,
        };
        if origin_id == self.config.replica {
            return;
        }
        let inbox_config = self.config.inbox;
        let origin = self.inboxes.entry(origin_id).or_insert_with(|| Origin {
            inbox: Inbox::new(origin_id, inbox_config),
            heard: Instant::now(),
            answer: None,
            asked: None,
            seen: 0,
            forgotten: false,
            refused: 0,
        });
        origin.heard = Instant::now();
        origin.forgotten = false;
        origin.answer = Some(answer);
        let (apply, resync_from) = match &frame {
            Frame::Batch(batch) => {
                let last = batch.first_seq.saturating_add(batch.events.len() as u64).saturating_sub(1);
                origin.seen = origin.seen.max(last);
                let received = origin.inbox.receive(batch, now, in_pool(&self.selectors));
                (received.apply, received.resync_from)
            }
            Frame::Snapshot(snapshot) => {
                origin.asked = None;
                origin.seen = origin.seen.max(snapshot.last_seq);
                (origin.inbox.resync(snapshot, now, in_pool(&self.selectors)), None)
            }
            Frame::Digest(digest) => {
                origin.seen = digest.last_seq;
                let received = origin.inbox.check(digest);
                (received.apply, received.resync_from)
            }
            Frame::Resync(_) | Frame::SnapshotPart(_) => return,
        };
        self.apply(origin_id, apply, now).await;
        if let Frame::Batch(batch) = &frame {
            if batch.sent_unix_micros > 0 {
                let delay = unix_micros().saturating_sub(batch.sent_unix_micros).max(1);
                self.stats.update(|s| s.delay_micros.saturating_record(delay));
            }
        }
        if let Some(from_seq) = resync_from {
            self.ask_resync(origin_id, from_seq);
        }
        self.report_origin(origin_id);
    }

    /// Applies an origin's changes to the selector that has each one's
    /// worker; a refused booking is left unapplied in the mirror (booked
    /// again on renewal or when its worker joins).
    async fn apply(&mut self, origin: ReplicaId, events: Vec<BookingEvent>, now: Millis) {
        let mut refused = 0;
        let mut released = false;
        for event in events {
            let id = event.id();
            let is_news = matches!(event, BookingEvent::Reserved(_) | BookingEvent::Renewed { .. });
            let result = match &event {
                BookingEvent::Reserved(booking) => {
                    match self.selectors.iter().find(|s| s.service().owns(booking.worker)) {
                        Some(selector) => selector.service().apply_peer_booking(selector, origin, event.clone()).await,
                        None => Err(BookingError::UnknownWorker(booking.worker)),
                    }
                }
                _ => {
                    let mut result = Err(BookingError::NotFound(id));
                    for selector in &self.selectors {
                        result = selector.service().apply_peer_booking(selector, origin, event.clone()).await;
                        if !matches!(result, Err(BookingError::NotFound(_))) {
                            break;
                        }
                    }
                    result
                }
            };
            released |= result.is_ok() && matches!(event, BookingEvent::Freed(_) | BookingEvent::PrefillComplete(_));
            if let Err(error) = result {
                // A free or a renewal of a booking the shards already let
                // go of is no news; anything else is counted.
                if is_news {
                    refused += 1;
                    tracing::debug!(origin = origin.0, id = id.0, %error, "a peer's booking was not applied here");
                    if let Some(origin) = self.inboxes.get_mut(&origin) {
                        origin.inbox.not_applied(id);
                    }
                }
            }
        }
        if let Some(origin) = self.inboxes.get_mut(&origin) {
            origin.refused += refused;
        }
        // Once per frame, not per free: queued requests that now fit.
        if released {
            for selector in &self.selectors {
                if selector.service().has_waiting() {
                    selector.service().admit_waiting(selector, now).await;
                }
            }
        }
    }

    fn ask_resync(&mut self, origin_id: ReplicaId, from_seq: u64) {
        let Some(origin) = self.inboxes.get_mut(&origin_id) else { return };
        let Some(answer) = &origin.answer else { return };
        let Some(incarnation) = origin.inbox.incarnation() else { return };
        let request = ResyncRequest { origin: origin_id, incarnation, from_seq };
        if answer.send(Bytes::from(encode(&Frame::Resync(request)))) {
            origin.asked = Some(Instant::now());
            self.stats.update(|s| s.resyncs_asked += 1);
        }
        tracing::debug!(origin = origin_id.0, from_seq, "asked a peer for a snapshot of its bookings");
    }

    async fn every_digest(&mut self) {
        self.publish_batch();
        self.transport.publish(&Bytes::from(encode(&Frame::Digest(self.outbox.digest()))));
        for link in std::mem::take(&mut self.deferred_snapshots) {
            self.send_snapshot(link);
        }
        let now = self.clock.now();
        let grace = self.config.peer_grace;
        let ids: Vec<ReplicaId> = self.inboxes.keys().copied().collect();
        for id in ids {
            let Some(origin) = self.inboxes.get_mut(&id) else { continue };
            if origin.forgotten && origin.heard.elapsed() >= grace * 2 {
                // Gone for good (a replaced pod's name is a new origin):
                // nothing of it is held, and its series leave the metrics.
                self.inboxes.remove(&id);
                self.stats.update(|s| {
                    s.origins.remove(&id);
                });
                continue;
            }
            if !origin.forgotten && origin.heard.elapsed() >= grace {
                origin.forgotten = true;
                let freed = origin.inbox.forget();
                tracing::warn!(
                    origin = id.0,
                    bookings = freed.len(),
                    grace_s = grace.as_secs(),
                    "peer replica silent past its grace period: its bookings are freed here"
                );
                self.apply(id, freed, now).await;
            } else if let Some(from_seq) = origin.inbox.awaiting_resync() {
                // The request or its answer was lost.
                if origin.asked.is_none_or(|at| at.elapsed() >= self.config.digest_every * 2) {
                    self.ask_resync(id, from_seq);
                }
            }
            let selectors = &self.selectors;
            let retry =
                self.inboxes.get_mut(&id).map(|o| o.inbox.retry_unapplied(now, in_pool(selectors))).unwrap_or_default();
            self.apply(id, retry, now).await;
            self.report_origin(id);
        }
        let (live, last_seq) = (self.outbox.live(), self.outbox.digest().last_seq);
        self.stats.update(|s| {
            s.own_live = live;
            s.own_last_seq = last_seq;
        });
    }

    fn report_origin(&self, id: ReplicaId) {
        let Some(origin) = self.inboxes.get(&id) else { return };
        let view = OriginView {
            stats: origin.inbox.stats(),
            live: origin.inbox.live(),
            last_seq: origin.inbox.last_seq(),
            seen: origin.seen,
            forgotten: origin.forgotten,
            refused: origin.refused,
        };
        self.stats.update(|s| {
            s.origins.insert(id, view);
        });
    }
}

/// Whether one of `selectors` has `worker` (a peer's booking on any other
/// is mirrored, never applied).
fn in_pool(selectors: &[ThreadProducers]) -> impl Fn(WorkerId) -> bool + '_ {
    |worker| selectors.iter().any(|s| s.service().owns(worker))
}

fn unix_micros() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// `batch` as consecutive batches each within what a peer takes.
fn split_batch(batch: Batch, limits: &Limits) -> Vec<Batch> {
    let budget = limits.max_frame_bytes / 2;
    let fits = |events: &[PeerEvent]| {
        events.len() <= limits.max_events_per_batch && events.iter().map(event_bytes).sum::<usize>() <= budget
    };
    if fits(&batch.events) {
        return vec![batch];
    }
    let (origin, incarnation, sent_unix_micros) = (batch.origin, batch.incarnation, batch.sent_unix_micros);
    let part =
        |first_seq: u64, events: Vec<PeerEvent>| Batch { origin, incarnation, first_seq, events, sent_unix_micros };
    let mut parts = Vec::new();
    let mut first_seq = batch.first_seq;
    let mut current: Vec<PeerEvent> = Vec::new();
    let mut bytes = 0;
    for event in batch.events {
        let size = event_bytes(&event);
        if !current.is_empty() && (current.len() == limits.max_events_per_batch || bytes + size > budget) {
            let events = std::mem::take(&mut current);
            let next = first_seq + events.len() as u64;
            parts.push(part(first_seq, events));
            first_seq = next;
            bytes = 0;
        }
        bytes += size;
        current.push(event);
    }
    parts.push(part(first_seq, current));
    parts
}

/// An event's size on the wire, near enough (a booking is mostly its
/// block hashes).
fn event_bytes(event: &PeerEvent) -> usize {
    match event {
        PeerEvent::Reserved(booking) => 64 + 8 * booking.seq_hashes.len(),
        _ => 24,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvpick_core::hashing::SequenceHash;
    use kvpick_core::replica::PeerBooking;

    use super::*;

    fn reserved(id: u64, blocks: usize) -> PeerEvent {
        PeerEvent::Reserved(PeerBooking {
            id: ReservationId(id),
            worker: WorkerId(1),
            seq_hashes: Arc::from(vec![SequenceHash(1); blocks]),
            unhashed_blocks: 0,
            prefill_tokens: 16,
            lease_left_ms: 1_000,
            prefill_done: false,
        })
    }

    #[test]
    fn a_large_batch_goes_as_consecutive_batches_within_the_caps() {
        let limits = Limits { max_events_per_batch: 3, max_frame_bytes: 4_000, ..Limits::default() };
        let events: Vec<PeerEvent> = (0..7).map(|i| reserved(i, if i == 4 { 240 } else { 1 })).collect();
        let batch = Batch {
            origin: ReplicaId(5),
            incarnation: Incarnation(6),
            first_seq: 10,
            events: events.clone(),
            sent_unix_micros: 77,
        };
        let parts = split_batch(batch, &limits);
        // 3 by count; the 1,984-byte event 4 nearly fills half the frame cap
        // (the budget) alone.
        let sizes: Vec<usize> = parts.iter().map(|p| p.events.len()).collect();
        assert_eq!(sizes, vec![3, 1, 1, 2]);
        let firsts: Vec<u64> = parts.iter().map(|p| p.first_seq).collect();
        assert_eq!(firsts, vec![10, 13, 14, 15]);
        assert!(
            parts
                .iter()
                .all(|p| p.origin == ReplicaId(5) && p.incarnation == Incarnation(6) && p.sent_unix_micros == 77)
        );
        assert_eq!(parts.into_iter().flat_map(|p| p.events).collect::<Vec<_>>(), events);
        let small = Batch {
            origin: ReplicaId(5),
            incarnation: Incarnation(6),
            first_seq: 1,
            events: vec![reserved(1, 1)],
            sent_unix_micros: 0,
        };
        assert_eq!(split_batch(small.clone(), &limits), vec![small]);
    }
}
