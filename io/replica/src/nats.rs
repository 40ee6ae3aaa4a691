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
//! - **Security.** NATS authenticates (a credentials file or the URL's user
//!   and password) and its TLS encrypts; its subject permissions should let
//!   each replica publish only on its own subject. Every frame is checked
//!   besides: its size, its decoding, and that its origin is the replica
//!   its subject names.

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
        }
    }

    fn subject(&self, kind: &str, replica: ReplicaId) -> String {
        format!("kvpick.{}.{kind}.{}", self.pool, replica.0)
    }

    fn stream_name(&self) -> String {
        format!("KVPICK_{}", self.pool)
    }
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

/// A connection to NATS and the pool's stream, ready to carry bookings.
pub struct NatsLink {
    config: NatsConfig,
    client: async_nats::Client,
    stream: stream::Stream,
}

impl NatsLink {
    /// Connects and makes sure the pool's stream exists.
    pub async fn connect(config: NatsConfig) -> Result<NatsLink, NatsError> {
        let pool_ok =
            !config.pool.is_empty() && config.pool.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !pool_ok {
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
        let js = jetstream::new(client.clone());
        let name = config.stream_name();
        let stream = js
            .get_or_create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("kvpick.{}.bookings.*", config.pool)],
                // On disk: the stream outlives a NATS restart, so readers
                // pick up where they were.
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::Limits,
                discard: stream::DiscardPolicy::Old,
                max_age: config.max_age,
                max_bytes: config.max_bytes,
                ..Default::default()
            })
            .await
            .map_err(|e| NatsError::Stream { stream: name, reason: e.to_string() })?;
        Ok(NatsLink { config, client, stream })
    }

    /// The largest frame the server takes (its `max_payload`).
    pub fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
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
        let hellos = subscribe(format!("kvpick.{}.hello", self.config.pool)).await?;
        Ok(tokio::spawn(snapshot_requests(self.config.replica, resyncs, hellos, snapshots, metrics)))
    }

    /// Reads every peer's frames into `inbound` until the sync stops.
    /// Ready once the consumer is in place and every origin was asked for
    /// a snapshot.
    pub async fn consume(
        &self,
        inbound: mpsc::Sender<Inbound>,
        limits: Limits,
        metrics: Arc<TransportMetrics>,
    ) -> Result<JoinHandle<()>, NatsError> {
        let subscribe_error = |reason: String| NatsError::Subscribe {
            subject: format!("kvpick.{}.bookings.*", self.config.pool),
            reason,
        };
        let consumer = self
            .stream
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: self.client.new_inbox(),
                filter_subject: format!("kvpick.{}.bookings.*", self.config.pool),
                deliver_policy: consumer::DeliverPolicy::New,
                ..Default::default()
            })
            .await
            .map_err(|e| subscribe_error(e.to_string()))?;
        let messages = consumer.messages().await.map_err(|e| subscribe_error(e.to_string()))?;
        let hello = format!("kvpick.{}.hello", self.config.pool);
        self.client
            .publish(hello, Bytes::from(self.config.replica.0.to_string()))
            .await
            .map_err(|e| subscribe_error(e.to_string()))?;
        let reader = Reader {
            config: self.config.clone(),
            client: self.client.clone(),
            inbound,
            limits,
            metrics,
            parts: HashMap::new(),
        };
        Ok(tokio::spawn(reader.run(messages)))
    }
}

/// The URL without a password, for messages.
fn redact(url: &str) -> String {
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
/// replica starts.
async fn snapshot_requests(
    us: ReplicaId,
    mut resyncs: async_nats::Subscriber,
    mut hellos: async_nats::Subscriber,
    snapshots: mpsc::UnboundedSender<LinkId>,
    metrics: Arc<TransportMetrics>,
) {
    let limits = Limits::default();
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
            else => return,
        };
        if wanted && snapshots.send(NATS_LINK).is_err() {
            return; // the sync stopped
        }
    }
}

/// Every peer's frames, from the stream.
struct Reader {
    config: NatsConfig,
    client: async_nats::Client,
    inbound: mpsc::Sender<Inbound>,
    limits: Limits,
    metrics: Arc<TransportMetrics>,
    /// Snapshot parts being gathered, per origin (their frames interleave).
    parts: HashMap<u64, SnapshotParts>,
}

impl Reader {
    async fn run(mut self, mut messages: consumer::push::Ordered) {
        let prefix = format!("kvpick.{}.bookings.", self.config.pool);
        self.metrics.streams_in.store(1, Ordering::Relaxed);
        while let Some(next) = messages.next().await {
            let message = match next {
                Ok(message) => message,
                Err(error) => {
                    // The ordered consumer makes itself again; only a
                    // terminal error ends the stream.
                    tracing::warn!(%error, "replica sync: reading the NATS stream");
                    continue;
                }
            };
            let Some(origin) = message.subject.strip_prefix(prefix.as_str()).and_then(|o| o.parse::<u64>().ok()) else {
                self.metrics.refused("nats_subject");
                continue;
            };
            if origin == self.config.replica.0 {
                continue;
            }
            self.metrics.frames_in.fetch_add(1, Ordering::Relaxed);
            self.metrics.bytes_in.fetch_add(message.payload.len() as u64, Ordering::Relaxed);
            let parts = self.parts.entry(origin).or_default();
            let frame = match decode(&message.payload, &self.limits).and_then(|frame| parts.take(frame)) {
                Ok(Some(frame)) => frame,
                Ok(None) => continue,
                Err(error) => {
                    self.metrics.refused(error.kind());
                    tracing::warn!(origin, bytes = message.payload.len(), %error, "a peer's frame from NATS refused");
                    continue;
                }
            };
            let named = match &frame {
                Frame::Batch(b) => b.origin,
                Frame::Snapshot(s) => s.origin,
                Frame::Digest(d) => d.origin,
                Frame::Resync(_) | Frame::SnapshotPart(_) => {
                    self.metrics.refused("unexpected_resync");
                    continue;
                }
            };
            if named.0 != origin {
                // Published on another replica's subject: not trusted.
                self.metrics.refused("origin_mismatch");
                tracing::warn!(subject = %message.subject, origin = named.0, "a frame on another replica's NATS subject refused");
                continue;
            }
            let answer = self.answer(named);
            if self.inbound.send(Inbound { frame, answer }).await.is_err() {
                break; // the sync stopped
            }
        }
        self.metrics.streams_in.store(0, Ordering::Relaxed);
    }

    /// The way back to an origin: its resync subject.
    fn answer(&self, origin: ReplicaId) -> Answer {
        let (client, subject) = (self.client.clone(), self.config.subject("resync", origin));
        Answer::new(move |frame| {
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
        assert_eq!(config.stream_name(), "KVPICK_my-pool_1");
    }
}
