//! What both ends of a peer call share: this replica's settings, the
//! peer port's state, admitting a caller (token, self-detection) and
//! dialing a peer (TLS, token, name). The booking streams (`direct`) and
//! warm start's index (`warm`) are both built on it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kvpick_core::replica::ReplicaId;
use kvpick_core::worker::WorkerId;
use tokio::sync::{Semaphore, mpsc};
use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::metrics::TransportMetrics;
use crate::sync::Inbound;
use crate::tls::PeerTls;
use crate::wire::{Limits, WorkerIndex};

/// Names the dialing replica, so a replica that finds itself in its own
/// peer list (a static list shared by all) stops dialing itself.
pub(crate) const REPLICA_HEADER: &str = "x-kvpick-replica";

/// What both ends of the transport are set with.
#[derive(Clone, Debug)]
pub struct DirectConfig {
    pub replica: ReplicaId,
    /// Callers must present it as `authorization: Bearer <token>`; `None`:
    /// no token (peer traffic is then only as private as the network).
    pub token: Option<Arc<str>>,
    /// Mutual TLS on the peer streams; `None`: plaintext HTTP/2.
    pub tls: Option<PeerTls>,
    pub limits: Limits,
    /// A link that cannot connect tries again after this, doubling up to
    /// `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    pub connect_timeout: Duration,
}

impl DirectConfig {
    pub fn new(replica: ReplicaId, token: Option<Arc<str>>) -> Self {
        DirectConfig {
            replica,
            token,
            tls: None,
            limits: Limits::default(),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// The peer port's state, shared by its calls.
pub(crate) struct ServerShared {
    pub(crate) config: DirectConfig,
    pub(crate) inbound: mpsc::Sender<Inbound>,
    pub(crate) metrics: Arc<TransportMetrics>,
    /// Warm start: what `Peer/Index` serves.
    pub(crate) index: Donor,
    /// Booking streams (`Peer/Exchange`) taken: not with the `nats`
    /// transport.
    pub(crate) exchange: bool,
}

/// A future this crate can hold across threads.
pub type Pending<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Where a replica's index comes from (the app: its ingest's exports).
pub trait IndexSource: Send + Sync + 'static {
    /// Ready to serve: not warming up itself.
    fn ready(&self) -> bool;
    /// The workers it may have an index of.
    fn workers(&self) -> Vec<WorkerId>;
    /// One worker's index at its stream's cut; `None` when it has none to
    /// give now (its stream replaying, held, or drained over HTTP).
    fn export(&self, worker: WorkerId) -> Pending<Option<WorkerIndex>>;
}

/// The serving side's state.
#[derive(Clone)]
pub(crate) struct Donor {
    pub(crate) source: Arc<dyn IndexSource>,
    pub(crate) serving: Arc<Semaphore>,
}

impl Donor {
    pub(crate) fn new(source: Arc<dyn IndexSource>) -> Self {
        Donor { source, serving: Arc::new(Semaphore::new(1)) }
    }
}

/// The token and the caller's name: refused calls are counted and logged.
pub(crate) fn admit(
    shared: &ServerShared,
    metadata: &tonic::metadata::MetadataMap,
    peer: Option<SocketAddr>,
) -> Result<(), Status> {
    if let Some(token) = &shared.config.token {
        let presented =
            metadata.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if !presented.is_some_and(|p| same_secret(p.as_bytes(), token.as_bytes())) {
            shared.metrics.refused("unauthenticated");
            tracing::warn!(peer = ?peer, "peer stream refused: no or wrong token");
            return Err(Status::unauthenticated("kvpick peer token missing or wrong"));
        }
    }
    let caller = metadata.get(REPLICA_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if caller == Some(shared.config.replica.0) {
        return Err(Status::already_exists("this is the replica itself"));
    }
    Ok(())
}

/// Compares without stopping at the first difference.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A client of a peer's replica-sync port, with this replica's TLS.
pub(crate) async fn dial(
    addr: SocketAddr,
    config: &DirectConfig,
    max_message: usize,
) -> Result<tonic::client::Grpc<tonic::transport::Channel>, Box<dyn std::error::Error + Send + Sync>> {
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))?;
    if let Some(tls) = &config.tls {
        endpoint = endpoint.tls_config(tls.client())?;
    }
    let endpoint = endpoint
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let channel = endpoint.connect().await?;
    let mut client =
        tonic::client::Grpc::new(channel).max_decoding_message_size(max_message).max_encoding_message_size(max_message);
    client.ready().await?;
    Ok(client)
}

/// The token and this replica's name, on a call to a peer.
pub(crate) fn introduce<T>(
    request: &mut tonic::Request<T>,
    config: &DirectConfig,
) -> Result<(), tonic::metadata::errors::InvalidMetadataValue> {
    if let Some(token) = &config.token {
        request.metadata_mut().insert("authorization", MetadataValue::try_from(format!("Bearer {token}"))?);
    }
    request.metadata_mut().insert(REPLICA_HEADER, MetadataValue::from(config.replica.0));
    Ok(())
}
