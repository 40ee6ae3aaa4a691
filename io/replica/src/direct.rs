//! The `direct` transport: no infrastructure, one gRPC stream from this
//! replica to each peer (`kvpick.peer.v1.Peer/Exchange`, bidirectional).
//!
//! Each replica dials every peer it knows and sends its own frames down
//! that stream (a snapshot first, then batches and digests); the peer
//! answers on the same stream only to ask for a resync. A pair of
//! replicas so holds two streams, each carrying one origin: who dials
//! whom needs no agreement, and a stream's loss touches one direction.
//!
//! Every link has a bounded queue: a peer that reads slowly loses frames
//! (its inbox then finds a gap and asks for a snapshot) and never slows
//! the sync task, the other peers or a pick. Inbound frames are size-capped
//! by tonic and then decoded and validated by `wire::decode`; a frame that
//! fails ends that stream with INVALID_ARGUMENT (its sender reconnects and
//! starts again from a snapshot), and a caller without the shared token is
//! refused with UNAUTHENTICATED. With `tls` set, both ends of every stream
//! present a certificate the pool's CA signed (mutual TLS): a caller
//! without one never completes the handshake.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use kvpick_core::error_chain::error_chain;
use kvpick_core::replica::ReplicaId;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tonic::{Code, Status, Streaming};

use crate::codec::RawCodec;
use crate::endpoint::{DirectConfig, Donor, IndexSource, REPLICA_HEADER, ServerShared, admit, dial, introduce};
use crate::metrics::{LinkState, TransportMetrics};
use crate::sync::{Answer, Inbound, LinkId, Sent, Transport};
use crate::wire::{Frame, SnapshotParts, decode};

const SERVICE: &str = "kvpick.peer.v1.Peer";
const EXCHANGE: &str = "/kvpick.peer.v1.Peer/Exchange";
/// Frames queued for one peer before new ones are dropped.
const LINK_QUEUE: usize = 1024;

/// The server half: mount it on the peer port's router.
#[derive(Clone)]
pub struct PeerService {
    inner: Arc<ServerShared>,
}

impl PeerService {
    /// Serves the booking streams and, to replicas starting up, this
    /// replica's KV index.
    pub fn new(
        config: DirectConfig,
        inbound: mpsc::Sender<Inbound>,
        metrics: Arc<TransportMetrics>,
        index: Arc<dyn IndexSource>,
    ) -> Self {
        Self::serving(ServerShared { config, inbound, metrics, index: Donor::new(index), exchange: true })
    }

    /// Serves only the KV index: bookings travel another way (the `nats`
    /// transport), and a booking stream here would bypass its
    /// authentication.
    pub fn index_only(
        config: DirectConfig,
        inbound: mpsc::Sender<Inbound>,
        metrics: Arc<TransportMetrics>,
        index: Arc<dyn IndexSource>,
    ) -> Self {
        Self::serving(ServerShared { config, inbound, metrics, index: Donor::new(index), exchange: false })
    }

    fn serving(shared: ServerShared) -> Self {
        PeerService { inner: Arc::new(shared) }
    }
}

impl NamedService for PeerService {
    const NAME: &'static str = SERVICE;
}

impl<B> Service<http::Request<B>> for PeerService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == crate::warm::INDEX {
            return crate::warm::serve(self.inner.clone(), req);
        }
        if req.uri().path() != EXCHANGE {
            return Box::pin(async {
                Ok(Status::unimplemented("kvpick.peer.v1.Peer has Exchange and Index").into_http())
            });
        }
        let inner = self.inner.clone();
        let max = inner.config.limits.max_frame_bytes;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec).apply_max_message_size_config(Some(max), Some(max));
            Ok(grpc.streaming(Exchange(inner), req).await)
        })
    }
}

struct Exchange(Arc<ServerShared>);

type Answers = ReceiverStream<Result<Bytes, Status>>;

impl tonic::server::StreamingService<Bytes> for Exchange {
    type Response = Bytes;
    type ResponseStream = Answers;
    type Future = BoxFuture<tonic::Response<Answers>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let shared = self.0.clone();
        // Answers at once: the stream's frames are read by a task of its
        // own, so the dialer's first frame never waits on our headers.
        Box::pin(async move {
            let peer = request.remote_addr();
            admit(&shared, request.metadata(), peer)?;
            if !shared.exchange {
                shared.metrics.refused("exchange_off");
                return Err(Status::failed_precondition("this replica shares bookings through NATS, not here"));
            }
            let (answers, answers_rx) = mpsc::channel::<Result<Bytes, Status>>(64);
            let us = shared.config.replica.0;
            tokio::spawn(read_stream(shared, peer, request.into_inner(), answers));
            // Named back, so the dialer knows whose bookings to wait for
            // when it starts up.
            let mut response = tonic::Response::new(ReceiverStream::new(answers_rx));
            response.metadata_mut().insert(REPLICA_HEADER, tonic::metadata::MetadataValue::from(us));
            Ok(response)
        })
    }
}

async fn read_stream(
    shared: Arc<ServerShared>,
    peer: Option<SocketAddr>,
    mut frames: Streaming<Bytes>,
    answers: mpsc::Sender<Result<Bytes, Status>>,
) {
    // Weak: the sync keeps an origin's way back, which must not hold this
    // stream open once its peer has stopped sending.
    let back = answers.downgrade();
    let answer = Answer::new(move |frame| back.upgrade().is_some_and(|back| back.try_send(Ok(frame)).is_ok()));
    shared.metrics.streams_in.fetch_add(1, Ordering::Relaxed);
    let mut parts = SnapshotParts::default();
    loop {
        let bytes = match frames.message().await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => break,
            Err(status) => {
                // Over tonic's size cap, or the connection broke.
                if status.code() == Code::OutOfRange || status.code() == Code::ResourceExhausted {
                    shared.metrics.refused("too_large");
                    tracing::warn!(peer = ?peer, %status, "peer frame refused: over the size cap; its stream is ended");
                    let _ = answers.send(Err(Status::out_of_range(status.message().to_owned()))).await;
                } else {
                    tracing::debug!(peer = ?peer, %status, "peer stream ended");
                }
                break;
            }
        };
        shared.metrics.frames_in.fetch_add(1, Ordering::Relaxed);
        shared.metrics.bytes_in.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let frame = match decode(&bytes, &shared.config.limits).and_then(|frame| parts.take(frame)) {
            Ok(Some(Frame::Resync(_))) => {
                shared.metrics.refused("unexpected_resync");
                continue;
            }
            Ok(Some(frame)) => frame,
            // A part of a snapshot, kept until its last.
            Ok(None) => continue,
            Err(error) => {
                shared.metrics.refused(error.kind());
                tracing::warn!(peer = ?peer, bytes = bytes.len(), %error, "peer frame refused; its stream is ended (the peer starts again from a snapshot)");
                let _ = answers.send(Err(Status::invalid_argument(format!("peer frame refused: {error}")))).await;
                break;
            }
        };
        if shared.inbound.send(Inbound { frame, answer: answer.clone() }).await.is_err() {
            break; // the sync task stopped
        }
    }
    shared.metrics.streams_in.fetch_sub(1, Ordering::Relaxed);
}

/// The client half: a link per peer address, each with its own queue.
pub struct DirectLinks {
    links: Arc<Mutex<HashMap<LinkId, LinkQueue>>>,
    manager: JoinHandle<()>,
}

struct LinkQueue {
    addr: SocketAddr,
    queue: mpsc::Sender<Bytes>,
    task: JoinHandle<()>,
    /// Streaming now: only such a link has anything to drain at close.
    up: Arc<AtomicBool>,
}

impl DirectLinks {
    /// Dials every address `peers` holds (now and as it changes), asking
    /// `snapshots` for a snapshot whenever a link (re)connects or its peer
    /// asks for a resync.
    pub fn spawn(
        config: DirectConfig,
        mut peers: watch::Receiver<BTreeSet<SocketAddr>>,
        snapshots: mpsc::UnboundedSender<LinkId>,
        metrics: Arc<TransportMetrics>,
    ) -> DirectLinks {
        let links: Arc<Mutex<HashMap<LinkId, LinkQueue>>> = Arc::default();
        let held = links.clone();
        let manager = tokio::spawn(async move {
            let next_id = AtomicU64::new(1);
            loop {
                let wanted = peers.borrow_and_update().clone();
                {
                    let mut links = held.lock().unwrap_or_else(PoisonError::into_inner);
                    links.retain(|_, link| {
                        let keep = wanted.contains(&link.addr) && !link.task.is_finished();
                        if !keep {
                            link.task.abort();
                        }
                        keep
                    });
                    let have: BTreeSet<SocketAddr> = links.values().map(|l| l.addr).collect();
                    for addr in wanted.difference(&have) {
                        let id = next_id.fetch_add(1, Ordering::Relaxed);
                        let (queue, queue_rx) = mpsc::channel(LINK_QUEUE);
                        let up = Arc::new(AtomicBool::new(false));
                        let link = Link {
                            id,
                            addr: *addr,
                            config: config.clone(),
                            snapshots: snapshots.clone(),
                            metrics: metrics.clone(),
                            up: up.clone(),
                        };
                        let task = tokio::spawn(link.run(queue_rx));
                        links.insert(id, LinkQueue { addr: *addr, queue, task, up });
                        tracing::info!(peer = %addr, "replica sync: dialing a peer");
                    }
                    metrics.links.store(links.len() as u64, Ordering::Relaxed);
                }
                if peers.changed().await.is_err() {
                    break;
                }
            }
        });
        DirectLinks { links, manager }
    }

    fn with_links<R>(&self, f: impl FnOnce(&HashMap<LinkId, LinkQueue>) -> R) -> R {
        f(&self.links.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for DirectLinks {
    fn drop(&mut self) {
        self.manager.abort();
        self.with_links(|links| links.values().for_each(|l| l.task.abort()));
    }
}

impl Transport for DirectLinks {
    fn publish(&mut self, frame: &Bytes) {
        self.with_links(|links| {
            for link in links.values() {
                // Full: its peer finds the gap and resyncs.
                let _ = link.queue.try_send(frame.clone());
            }
        });
    }

    fn send_to(&mut self, link: LinkId, frame: Bytes) -> Sent {
        self.with_links(|links| match links.get(&link).map(|l| l.queue.try_send(frame)) {
            Some(Ok(())) => Sent::Queued,
            Some(Err(mpsc::error::TrySendError::Full(_))) => Sent::Full,
            Some(Err(mpsc::error::TrySendError::Closed(_))) | None => Sent::Gone,
        })
    }

    /// Closes every queue: each streaming link sends what its queue
    /// holds, ends its stream and stops; the others (dialing, backing off,
    /// parked on this replica's own address) have no peer to tell and stop
    /// at once.
    fn close(&mut self) -> Vec<JoinHandle<()>> {
        self.manager.abort();
        let links = std::mem::take(&mut *self.links.lock().unwrap_or_else(PoisonError::into_inner));
        let mut draining = Vec::new();
        for link in links.into_values() {
            if link.up.load(Ordering::Acquire) {
                draining.push(link.task);
            } else {
                link.task.abort();
            }
        }
        draining
    }
}

struct Link {
    id: LinkId,
    addr: SocketAddr,
    config: DirectConfig,
    snapshots: mpsc::UnboundedSender<LinkId>,
    metrics: Arc<TransportMetrics>,
    up: Arc<AtomicBool>,
}

/// How a connection ended.
enum Ended {
    /// Try again after a pause.
    Retry,
    /// The peer is this replica: not dialed again while it is listed.
    Itself,
    /// The queue was closed (stopping): what it held was sent.
    Closed,
}

/// A stream that stayed up this long was healthy: the next failure starts
/// the backoff over. A peer that refuses at once keeps backing off.
const HEALTHY_STREAM: Duration = Duration::from_secs(10);

/// Removes a link's state when its task ends or is aborted (its address
/// left the peer set), so nothing waits for it and `links_up` stays true.
struct LinkStateGuard<'a>(&'a Link);

impl Drop for LinkStateGuard<'_> {
    fn drop(&mut self) {
        self.0.metrics.set_link(self.0.id, None);
    }
}

impl Link {
    async fn run(self, mut queue: mpsc::Receiver<Bytes>) {
        let _state = LinkStateGuard(&self);
        self.metrics.set_link(self.id, Some(LinkState::Dialing));
        let mut backoff = self.config.backoff;
        // The last failure logged at warn: the same one again (a peer
        // still down, a certificate still refused) goes to debug.
        let mut failing: Option<String> = None;
        loop {
            let started = std::time::Instant::now();
            match self.connect_and_send(&mut queue).await {
                Ok(Ended::Itself) => {
                    self.metrics.set_link(self.id, Some(LinkState::Itself));
                    tracing::info!(peer = %self.addr, "replica sync: that peer address is this replica; not dialing it");
                    // Parked rather than ended, so the manager does not
                    // dial it again; aborted when the address leaves.
                    std::future::pending::<()>().await;
                }
                Ok(Ended::Closed) => return,
                Ok(Ended::Retry) if started.elapsed() >= HEALTHY_STREAM => {
                    backoff = self.config.backoff;
                    failing = None;
                }
                Ok(Ended::Retry) => failing = None,
                Err(error) => {
                    self.metrics.set_link(self.id, Some(LinkState::Failing));
                    let why = error_chain(&*error);
                    if failing.as_deref() == Some(why.as_str()) {
                        tracing::debug!(peer = %self.addr, error = %why, "replica sync: peer still not reachable");
                    } else {
                        tracing::warn!(peer = %self.addr, error = %why, "replica sync: peer not reachable (retrying with backoff)");
                        failing = Some(why);
                    }
                }
            }
            self.metrics.reconnects.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.config.max_backoff);
        }
    }

    async fn connect_and_send(
        &self,
        queue: &mut mpsc::Receiver<Bytes>,
    ) -> Result<Ended, Box<dyn std::error::Error + Send + Sync>> {
        let mut client = dial(self.addr, &self.config, self.config.limits.max_frame_bytes).await?;
        // What was queued for the last connection is stale: the snapshot
        // asked for next stands for all of it.
        while queue.try_recv().is_ok() {}
        let _ = self.snapshots.send(self.id);
        let (frames, frames_rx) = mpsc::channel::<Bytes>(64);
        // The first frame goes in before the call so the stream opens with
        // data (the snapshot, or a batch queued just before it).
        let Some(first) = queue.recv().await else { return Ok(Ended::Closed) };
        frames.send(first).await?;
        let mut request = tonic::Request::new(ReceiverStream::new(frames_rx));
        introduce(&mut request, &self.config)?;
        let path = http::uri::PathAndQuery::from_static(EXCHANGE);
        let response = match client.streaming(request, path, RawCodec).await {
            Ok(response) => response,
            Err(status) if status.code() == Code::AlreadyExists => return Ok(Ended::Itself),
            Err(status) => {
                self.metrics.set_link(self.id, Some(LinkState::Failing));
                tracing::warn!(peer = %self.addr, %status, "replica sync: peer refused the stream");
                return Ok(Ended::Retry);
            }
        };
        let named = response.metadata().get(REPLICA_HEADER).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        tracing::info!(peer = %self.addr, replica = ?named, "replica sync: streaming to a peer");
        self.metrics.set_link(self.id, Some(LinkState::Up(named.map(ReplicaId))));
        self.up.store(true, Ordering::Release);
        let ended = self.pump(queue, frames, response.into_inner()).await;
        self.up.store(false, Ordering::Release);
        self.metrics.set_link(self.id, Some(LinkState::Dialing));
        ended
    }

    /// Stopping: ends the stream once what was queued is in it, and waits
    /// (briefly) for the peer to have read it all.
    async fn finish(&self, frames: mpsc::Sender<Bytes>, answers: &mut Streaming<Bytes>) -> Ended {
        let drain = async {
            // All capacity free again: the stream has taken every frame.
            drop(frames.reserve_many(frames.max_capacity()).await);
            drop(frames);
            while let Ok(Some(_)) = answers.message().await {}
        };
        // A peer that stopped reading (its flow-control window shut) is
        // not waited for.
        let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
        Ended::Closed
    }

    /// Forwards the queue into the stream and the peer's resync requests
    /// to the sync task, until either side ends.
    async fn pump(
        &self,
        queue: &mut mpsc::Receiver<Bytes>,
        frames: mpsc::Sender<Bytes>,
        mut answers: Streaming<Bytes>,
    ) -> Result<Ended, Box<dyn std::error::Error + Send + Sync>> {
        loop {
            tokio::select! {
                next = queue.recv() => {
                    let Some(frame) = next else { return Ok(self.finish(frames, &mut answers).await) };
                    self.metrics.frames_out.fetch_add(1, Ordering::Relaxed);
                    self.metrics.bytes_out.fetch_add(frame.len() as u64, Ordering::Relaxed);
                    if frames.send(frame).await.is_err() {
                        return Ok(Ended::Retry);
                    }
                }
                answer = answers.message() => match answer {
                    Ok(Some(bytes)) => match decode(&bytes, &self.config.limits) {
                        Ok(Frame::Resync(request)) if request.origin == self.config.replica => {
                            let _ = self.snapshots.send(self.id);
                        }
                        Ok(_) => self.metrics.refused("unexpected_answer"),
                        Err(error) => {
                            self.metrics.refused(error.kind());
                            tracing::warn!(peer = %self.addr, %error, "replica sync: peer's answer refused");
                        }
                    },
                    Ok(None) => return Ok(Ended::Retry),
                    Err(status) => {
                        tracing::warn!(peer = %self.addr, %status, "replica sync: peer ended the stream");
                        return Ok(Ended::Retry);
                    }
                },
            }
        }
    }
}
