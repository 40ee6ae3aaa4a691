//! The `nats` transport (issue #22): this replica's booking frames through
//! NATS JetStream, for deployments that run NATS already (Dynamo's do) or
//! outgrow a mesh of direct streams (each replica publishes once, whatever
//! the number of peers).
//!
//! One stream per pool, `KVPICK_<POOL>`, holding the subjects
//! `kvpick.<pool>.bookings.<replica>`: each replica publishes its frames
//! (batches, digests, snapshots) on its own subject, in order, and reads
//! every replica's through an ordered push consumer that starts with what
//! is published after it is made. The frames are the `direct` transport's
//! (`kvpick.peer.v1`), decoded with the same caps and validated by the same
//! inboxes.
//!
//! - **Replay from a sequence.** When the connection to NATS drops, the
//!   ordered consumer is made again from the stream sequence after the last
//!   one it delivered: what the stream took meanwhile arrives, in order.
//! - **Resync.** A frame the stream never took (published while the server
//!   was away, or dropped from a full queue) is a gap in its origin's own
//!   numbering; the replica asks the origin on `kvpick.<pool>.resync.<origin>`
//!   (core NATS), and the origin publishes a snapshot on its subject, in
//!   order with its batches.
//! - **Start.** A replica starting asks every origin for a snapshot on
//!   `kvpick.<pool>.hello` once its consumer is in place.
//! - **Warm start.** A replica starting up takes a ready peer's KV index
//!   through the pool's object store (`index`).
//! - **Security.** NATS authenticates (a credentials file or the URL's user
//!   and password) and its TLS encrypts. Every frame is checked besides:
//!   its size, its decoding, and that its origin is the replica its
//!   subject names. Replicas share one NATS user (`deploy/README.md` lists
//!   its rights), so that check catches mistakes, not a holder of the
//!   credentials in bad faith. The peer port refuses booking streams in
//!   this mode (they would bypass NATS's authentication).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use kvpick_core::replica::ReplicaId;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::metrics::TransportMetrics;
use crate::sync::{Answer, Inbound, LinkId, Sent, Transport};
use crate::wire::{Frame, Limits, SnapshotParts, decode};

/// The one "link" of this transport: the stream every peer reads.
pub const NATS_LINK: LinkId = 1;
/// Frames waiting for the publisher task: a full queue drops the frame
/// (its peers see the gap and ask for a snapshot).
const QUEUE: usize = 4096;

#[derive(Clone, Debug)]
pub struct NatsConfig {
    /// `nats://host:4222` (several separated by commas; `tls://` for TLS;
    /// `user:password@` accepted).
    pub url: String,
    /// The pool's name in subjects and the stream's name: letters, digits,
    /// `-` and `_`.
    pub pool: String,
    pub replica: ReplicaId,
    /// A NATS credentials file (JWT and NKey seed).
    pub credentials: Option<PathBuf>,
    /// A CA to check the server's certificate against (TLS then required).
    pub ca: Option<PathBuf>,
    /// How long the stream keeps frames (a replica reconnecting within it
    /// replays instead of resyncing).
    pub max_age: Duration,
    /// The stream's size cap.
    pub max_bytes: i64,
    /// Copies JetStream keeps of the stream and the index store (a NATS
    /// cluster: 3; at most 5).
    pub stream_replicas: usize,
}

impl NatsConfig {
    pub fn new(url: impl Into<String>, pool: impl Into<String>, replica: ReplicaId) -> Self {
        NatsConfig {
            url: url.into(),
            pool: pool.into(),
            replica,
            credentials: None,
            ca: None,
            max_age: Duration::from_secs(600),
            max_bytes: 256 << 20,
            stream_replicas: 1,
        }
    }

    /// `kvpick.<pool>.<kind>.<replica>`: a replica's bookings or resync
    /// requests.
    fn subject(&self, kind: &str, replica: ReplicaId) -> String {
        format!("{}{}", self.prefix(kind), replica.0)
    }

    /// `kvpick.<pool>.<kind>.`, what every replica's subject of a kind
    /// starts with.
    fn prefix(&self, kind: &str) -> String {
        format!("kvpick.{}.{kind}.", self.pool)
    }

    /// Every replica's bookings: the stream's subjects.
    fn all_bookings(&self) -> String {
        format!("{}*", self.prefix("bookings"))
    }

    /// Where a replica starting up asks every origin for a snapshot.
    fn hello_subject(&self) -> String {
        format!("kvpick.{}.hello", self.pool)
    }

    fn stream_name(&self) -> String {
        format!("KVPICK_{}", self.pool)
    }
}

/// A pool name fit for subjects and stream names: letters, digits, `-`
/// and `_`.
pub fn pool_name_ok(pool: &str) -> bool {
    !pool.is_empty() && pool.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("the pool name {0:?} must be letters, digits, '-' or '_'")]
    Pool(String),
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("cannot set up the JetStream stream {stream}: {reason}")]
    Stream { stream: String, reason: String },
    #[error("cannot subscribe to {subject}: {reason}")]
    Subscribe { subject: String, reason: String },
}

mod index;

/// A connection to NATS and the pool's stream, ready to carry bookings.
#[derive(Clone)]
pub struct NatsLink {
    config: NatsConfig,
    client: async_nats::Client,
    stream: stream::Stream,
}

impl NatsLink {
    /// Connects and makes sure the pool's stream exists.
    pub async fn connect(config: NatsConfig) -> Result<NatsLink, NatsError> {
        if !pool_name_ok(&config.pool) {
            return Err(NatsError::Pool(config.pool.clone()));
        }
        let connect_error = |reason: String| NatsError::Connect { url: redact(&config.url), reason };
        // Once connected, it reconnects for ever (NATS coming back is the
        // replay's business); the first connection must succeed, or the
        // start fails with the reason.
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("kvpick-{}", config.replica.0))
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None);
        if let Some(path) = &config.credentials {
            options = options.credentials_file(path).await.map_err(|e| connect_error(e.to_string()))?;
        }
        if let Some(ca) = &config.ca {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        let client = tokio::time::timeout(Duration::from_secs(10), options.connect(config.url.as_str()))
            .await
            .map_err(|_| connect_error("no answer within 10 s".into()))?
            .map_err(|e| connect_error(e.to_string()))?;
        let stream = ensure_stream(&client, &config).await?;
        Ok(NatsLink { config, client, stream })
    }

    /// The largest frame the server and the stream take (`max_payload`,
    /// and the stream's `max_msg_size` when it has one).
    pub fn max_payload(&self) -> usize {
        let payload = self.client.server_info().max_payload;
        match usize::try_from(self.stream.cached_info().config.max_message_size) {
            Ok(cap) if cap > 0 => payload.min(cap),
            _ => payload,
        }
    }

    /// The transport the sync publishes through (its publisher task
    /// starts at once).
    pub fn transport(&self, metrics: Arc<TransportMetrics>) -> NatsTransport {
        let (queue, queue_rx) = mpsc::channel(QUEUE);
        let subject = self.config.subject("bookings", self.config.replica);
        let publisher = tokio::spawn(publish(self.client.clone(), subject, queue_rx, metrics.clone()));
        metrics.links.store(1, Ordering::Relaxed);
        metrics.links_up.store(1, Ordering::Relaxed);
        NatsTransport { queue: Some(queue), publisher: Some(publisher), metrics }
    }

    /// The task that asks the sync (`snapshots`) for a snapshot whenever a
    /// peer asks for a resync or a replica starts.
    pub async fn serve_requests(
        &self,
        snapshots: mpsc::UnboundedSender<LinkId>,
        metrics: Arc<TransportMetrics>,
    ) -> Result<JoinHandle<()>, NatsError> {
        let subscribe = |subject: String| {
            let client = self.client.clone();
            async move {
                client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|e| NatsError::Subscribe { subject, reason: e.to_string() })
            }
        };
        let resyncs = subscribe(self.config.subject("resync", self.config.replica)).await?;
        let hellos = subscribe(self.config.hello_subject()).await?;
        Ok(tokio::spawn(snapshot_requests(self.config.replica, resyncs, hellos, snapshots, metrics)))
    }

    /// Reads every peer's frames into `inbound` until the sync stops:
    /// from what is published once its consumer is in place, after which
    /// every origin is asked for a snapshot (a hello).
    pub async fn consume(
        &self,
        inbound: mpsc::Sender<Inbound>,
        limits: Limits,
        metrics: Arc<TransportMetrics>,
    ) -> Result<JoinHandle<()>, NatsError> {
        let prefix = self.config.prefix("bookings");
        let mut reader =
            Reader { link: self.clone(), prefix, inbound, limits, metrics, parts: HashMap::new(), last: 0 };
        let messages = reader
            .open()
            .await
            .map_err(|reason| NatsError::Subscribe { subject: self.config.all_bookings(), reason })?;
        Ok(tokio::spawn(reader.run(messages)))
    }

    /// The other replicas that published on the pool's stream within
    /// `within`: while it runs, each publishes a digest every second. A
    /// replica starting up waits for their live bookings (answers to its
    /// hello).
    pub async fn live_origins(&self, within: Duration) -> Result<Vec<ReplicaId>, String> {
        let prefix = self.config.prefix("bookings");
        let mut subjects =
            self.stream.info_with_subjects(self.config.all_bookings()).await.map_err(|e| e.to_string())?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let mut live = Vec::new();
        while let Some(next) = subjects.next().await {
            let (subject, _) = next.map_err(|e| e.to_string())?;
            let Some(id) = subject.strip_prefix(prefix.as_str()).and_then(|id| id.parse::<u64>().ok()) else {
                continue;
            };
            if id == self.config.replica.0 {
                continue;
            }
            let Ok(last) = self.stream.get_last_raw_message_by_subject(&subject).await else { continue };
            let at = u128::try_from(last.time.unix_timestamp_nanos()).unwrap_or(0);
            if now.saturating_sub(at) <= within.as_nanos() {
                live.push(ReplicaId(id));
            }
        }
        Ok(live)
    }

    async fn hello(&self) -> Result<(), String> {
        self.client
            .publish(self.config.hello_subject(), Bytes::from(self.config.replica.0.to_string()))
            .await
            .map_err(|e| e.to_string())
    }
}

/// The pool's stream, made if missing (a first replica, or a NATS that
/// lost it); one made by someone else must carry the pool's subjects and
/// keep frames by limits, or nothing would be stored; its age and size
/// limits are brought to this replica's.
async fn ensure_stream(client: &async_nats::Client, config: &NatsConfig) -> Result<stream::Stream, NatsError> {
    let js = jetstream::new(client.clone());
    let name = config.stream_name();
    let wanted = stream::Config {
        name: name.clone(),
        subjects: vec![config.all_bookings()],
        // On disk: the stream outlives a NATS restart, so readers pick up
        // where they were.
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        max_age: config.max_age,
        max_bytes: config.max_bytes,
        num_replicas: config.stream_replicas,
        ..Default::default()
    };
    let error = |reason: String| NatsError::Stream { stream: name.clone(), reason };
    let mut stream = js.get_or_create_stream(wanted.clone()).await.map_err(|e| error(e.to_string()))?;
    let have = stream.cached_info().config.clone();
    if have.subjects != wanted.subjects || have.retention != wanted.retention {
        return Err(error(format!(
            "it exists with subjects {:?} and {:?} retention; kvpick needs {:?} and limits (delete it, or name another pool)",
            have.subjects, have.retention, wanted.subjects
        )));
    }
    if have.max_age != wanted.max_age || have.max_bytes != wanted.max_bytes || have.num_replicas != wanted.num_replicas
    {
        let updated = stream::Config {
            max_age: wanted.max_age,
            max_bytes: wanted.max_bytes,
            num_replicas: wanted.num_replicas,
            ..have
        };
        js.update_stream(updated).await.map_err(|e| error(format!("cannot update its limits: {e}")))?;
        stream = js.get_stream(&name).await.map_err(|e| error(e.to_string()))?;
    }
    Ok(stream)
}

/// The URL without a password, for messages.
pub fn redact(url: &str) -> String {
    url.split(',')
        .map(|one| match (one.find("://"), one.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => format!("{}***{}", &one[..scheme + 3], &one[at..]),
            _ => one.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Publishes the queue's frames on this replica's subject, in order. Core
/// NATS publishes into the stream without waiting for its acknowledgement:
/// a frame lost on the way shows to every reader as a gap, which asks for a
/// snapshot, so nothing here waits on a round trip.
async fn publish(
    client: async_nats::Client,
    subject: String,
    mut queue: mpsc::Receiver<Bytes>,
    metrics: Arc<TransportMetrics>,
) {
    while let Some(frame) = queue.recv().await {
        let len = frame.len() as u64;
        match client.publish(subject.clone(), frame).await {
            Ok(()) => {
                metrics.frames_out.fetch_add(1, Ordering::Relaxed);
                metrics.bytes_out.fetch_add(len, Ordering::Relaxed);
            }
            Err(error) => {
                metrics.refused("nats_publish");
                tracing::warn!(%error, "replica sync: a frame not published to NATS (peers resync)");
            }
        }
    }
    // Closed: what was published reaches the server before the process goes.
    if let Err(error) = client.flush().await {
        tracing::warn!(%error, "replica sync: NATS not flushed at close");
    }
}

/// Asks the sync for a snapshot whenever a peer asks for a resync or a
/// replica starts, at most once per [`SNAPSHOT_EVERY`]: every reader gets
/// each snapshot, so one answers every request made meanwhile (many
/// readers seeing the same gap ask together).
async fn snapshot_requests(
    us: ReplicaId,
    mut resyncs: async_nats::Subscriber,
    mut hellos: async_nats::Subscriber,
    snapshots: mpsc::UnboundedSender<LinkId>,
    metrics: Arc<TransportMetrics>,
) {
    let limits = Limits::default();
    let mut quiet_until = tokio::time::Instant::now();
    let mut owed = false;
    loop {
        let wanted = tokio::select! {
            Some(message) = resyncs.next() => match decode(&message.payload, &limits) {
                Ok(Frame::Resync(request)) if request.origin == us => true,
                Ok(_) => {
                    metrics.refused("unexpected_answer");
                    false
                }
                Err(error) => {
                    metrics.refused(error.kind());
                    false
                }
            },
            Some(message) = hellos.next() => {
                let from = std::str::from_utf8(&message.payload).ok().and_then(|s| s.parse::<u64>().ok());
                from.is_some_and(|from| from != us.0)
            }
            () = tokio::time::sleep_until(quiet_until), if owed => {
                owed = false;
                true
            }
            else => return,
        };
        if !wanted {
            continue;
        }
        if tokio::time::Instant::now() < quiet_until {
            owed = true;
            continue;
        }
        quiet_until = tokio::time::Instant::now() + SNAPSHOT_EVERY;
        if snapshots.send(NATS_LINK).is_err() {
            return; // the sync stopped
        }
    }
}

/// See [`snapshot_requests`].
const SNAPSHOT_EVERY: Duration = Duration::from_millis(250);

/// Every peer's frames, from the stream.
struct Reader {
    link: NatsLink,
    /// What its subjects start with (`kvpick.<pool>.bookings.`).
    prefix: String,
    inbound: mpsc::Sender<Inbound>,
    limits: Limits,
    metrics: Arc<TransportMetrics>,
    /// Snapshot parts being gathered, per origin (their frames interleave).
    parts: HashMap<u64, SnapshotParts>,
    /// The stream sequence of the last message read: a new consumer
    /// starts after it.
    last: u64,
}

/// Origins whose snapshot parts are gathered at once, at most (a peer
/// publishing parts under many names cannot grow this without bound;
/// a snapshot comes in parts only past a frame's worth of bookings).
const MAX_GATHERING: usize = 64;

impl Reader {
    /// A consumer from the message after `last`, or from now and a hello
    /// when there is no `last` or the stream no longer holds what follows
    /// it (made again, or past its limits): then only snapshots can tell.
    async fn open(&mut self) -> Result<consumer::push::Ordered, String> {
        let link = &self.link;
        let stream = ensure_stream(&link.client, &link.config).await.map_err(|e| e.to_string())?;
        // As `ensure_stream` just read it.
        let state = &stream.cached_info().state;
        let replay = self.last > 0 && state.first_sequence <= self.last + 1 && state.last_sequence >= self.last;
        let deliver_policy = if replay {
            consumer::DeliverPolicy::ByStartSequence { start_sequence: self.last + 1 }
        } else {
            consumer::DeliverPolicy::New
        };
        let consumer = stream
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: link.client.new_inbox(),
                filter_subject: link.config.all_bookings(),
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let messages = consumer.messages().await.map_err(|e| e.to_string())?;
        if !replay {
            link.hello().await?;
        }
        Ok(messages)
    }

    /// Reads until the sync stops. Any error of the consumer (a missed
    /// heartbeat, a consumer or stream lost, a failed recreation) makes
    /// a new one here, after a pause, from where this one was.
    async fn run(mut self, mut messages: consumer::push::Ordered) {
        let mut pause = Duration::from_millis(250);
        loop {
            self.metrics.streams_in.store(1, Ordering::Relaxed);
            let ended = loop {
                match messages.next().await {
                    Some(Ok(message)) => {
                        pause = Duration::from_millis(250);
                        if let Ok(info) = message.info() {
                            self.last = info.stream_sequence;
                        }
                        if !self.read(&message).await {
                            return; // the sync stopped
                        }
                    }
                    Some(Err(error)) => break error.to_string(),
                    None => break "the consumer ended".to_owned(),
                }
            };
            self.metrics.streams_in.store(0, Ordering::Relaxed);
            drop(messages);
            tracing::warn!(error = %ended, after = self.last, "replica sync: reading the NATS stream; reading again");
            messages = loop {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                if self.inbound.is_closed() {
                    return;
                }
                match self.open().await {
                    Ok(messages) => break messages,
                    Err(error) => tracing::debug!(%error, "replica sync: the NATS stream not read yet"),
                }
            };
        }
    }

    /// One message; false once the sync has stopped.
    async fn read(&mut self, message: &jetstream::Message) -> bool {
        let Some(origin) = message.subject.strip_prefix(self.prefix.as_str()).and_then(|o| o.parse::<u64>().ok())
        else {
            self.metrics.refused("nats_subject");
            return true;
        };
        if origin == self.link.config.replica.0 {
            return true;
        }
        self.metrics.frames_in.fetch_add(1, Ordering::Relaxed);
        self.metrics.bytes_in.fetch_add(message.payload.len() as u64, Ordering::Relaxed);
        let frame = match decode(&message.payload, &self.limits) {
            Ok(frame) => frame,
            Err(error) => {
                self.metrics.refused(error.kind());
                tracing::warn!(origin, bytes = message.payload.len(), %error, "a peer's frame from NATS refused");
                return true;
            }
        };
        let named = match &frame {
            Frame::Batch(b) => b.origin,
            Frame::Snapshot(s) => s.origin,
            Frame::Digest(d) => d.origin,
            Frame::SnapshotPart(p) => p.snapshot.origin,
            Frame::Resync(_) => {
                self.metrics.refused("unexpected_resync");
                return true;
            }
        };
        if named.0 != origin {
            // Published on another replica's subject: not taken, not even
            // as a part to gather.
            self.metrics.refused("origin_mismatch");
            tracing::warn!(subject = %message.subject, origin = named.0, "a frame on another replica's NATS subject refused");
            return true;
        }
        if !self.parts.contains_key(&origin) && self.parts.len() >= MAX_GATHERING {
            // Origins not gathering now hold nothing: they go first.
            self.parts.retain(|_, parts| parts.gathering());
            if self.parts.len() >= MAX_GATHERING {
                self.metrics.refused("too_many_origins");
                return true;
            }
        }
        let frame = match self.parts.entry(origin).or_default().take(frame) {
            Ok(Some(frame)) => frame,
            Ok(None) => return true,
            Err(error) => {
                self.metrics.refused(error.kind());
                tracing::warn!(origin, %error, "a peer's snapshot part from NATS refused");
                return true;
            }
        };
        let answer = self.answer(named);
        self.inbound.send(Inbound { frame, answer }).await.is_ok()
    }

    /// The way back to an origin: its resync subject (nothing while NATS
    /// is away: the sync asks again later).
    fn answer(&self, origin: ReplicaId) -> Answer {
        let (client, subject) = (self.link.client.clone(), self.link.config.subject("resync", origin));
        Answer::new(move |frame| {
            if client.connection_state() != async_nats::connection::State::Connected {
                return false;
            }
            let (client, subject) = (client.clone(), subject.clone());
            tokio::spawn(async move { client.publish(subject, frame).await });
            true
        })
    }
}

/// This replica's side of the stream (see the module docs).
pub struct NatsTransport {
    queue: Option<mpsc::Sender<Bytes>>,
    publisher: Option<JoinHandle<()>>,
    metrics: Arc<TransportMetrics>,
}

impl NatsTransport {
    fn queue(&self, frame: Bytes) -> Sent {
        match self.queue.as_ref().map(|q| q.try_send(frame)) {
            Some(Ok(())) => Sent::Queued,
            Some(Err(mpsc::error::TrySendError::Full(_))) => Sent::Full,
            Some(Err(mpsc::error::TrySendError::Closed(_))) | None => Sent::Gone,
        }
    }
}

impl Transport for NatsTransport {
    fn publish(&mut self, frame: &Bytes) {
        if self.queue(frame.clone()) == Sent::Full {
            self.metrics.refused("nats_queue_full");
        }
    }

    fn send_to(&mut self, _link: LinkId, frame: Bytes) -> Sent {
        self.queue(frame)
    }

    fn close(&mut self) -> Vec<JoinHandle<()>> {
        self.queue = None;
        self.metrics.links_up.store(0, Ordering::Relaxed);
        self.publisher.take().into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(redact("nats://kvpick:s3cret@nats:4222"), "nats://***@nats:4222");
        assert_eq!(redact("nats://a:4222,tls://u:p@b:4222"), "nats://a:4222,tls://***@b:4222");
        assert_eq!(redact("nats:4222"), "nats:4222");
    }

    #[test]
    fn subjects_and_stream_name() {
        let config = NatsConfig::new("nats://x", "my-pool_1", ReplicaId(7));
        assert_eq!(config.subject("bookings", ReplicaId(7)), "kvpick.my-pool_1.bookings.7");
        assert_eq!(config.subject("resync", ReplicaId(9)), "kvpick.my-pool_1.resync.9");
        assert_eq!(config.all_bookings(), "kvpick.my-pool_1.bookings.*");
        assert_eq!(config.hello_subject(), "kvpick.my-pool_1.hello");
        assert_eq!(config.stream_name(), "KVPICK_my-pool_1");
        assert!(pool_name_ok("my-pool_1") && !pool_name_ok("") && !pool_name_ok("a.b") && !pool_name_ok("a*"));
    }
}
