//! Warm start's transport: `kvpick.peer.v1.Peer/Index`, a server stream
//! from a ready replica to one starting up, carrying the ready one's KV
//! index a worker at a time (`wire::index`), each at its KV-event
//! stream's cut, then an end with the counts.
//!
//! The same port, token and TLS as the booking streams. A replica serves
//! one index at a time (another asker gets RESOURCE_EXHAUSTED and asks
//! another peer) and none while it is warming up itself
//! (FAILED_PRECONDITION): replicas starting together do not wait on each
//! other. Workers are exported as the stream takes their frames (a
//! bounded channel), so gRPC's flow control paces the exports and a slow
//! asker holds at most one worker's frames here; one that stops reading
//! is dropped after [`SERVE_AT_MOST`], which frees the port for others.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use kvpick_core::error_chain::error_chain;
use kvpick_proto::peer as pb;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{BoxFuture, http};
use tonic::{Code, Status};

use crate::codec::RawCodec;
use crate::endpoint::{DirectConfig, IndexSource, ServerShared, admit, dial, introduce};
use crate::wire::{
    FrameError, IndexLimits, IndexPiece, WorkerIndex, WorkerParts, decode_piece, encode_end, encode_worker,
};

pub(crate) const INDEX: &str = "/kvpick.peer.v1.Peer/Index";

/// Longest one asker may hold this replica's index serving: past any warm
/// start's own deadline (at most 10 minutes), with room.
pub const SERVE_AT_MOST: Duration = Duration::from_secs(1200);

pub(crate) fn serve<B>(
    shared: Arc<ServerShared>,
    req: http::Request<B>,
) -> BoxFuture<http::Response<tonic::body::Body>, std::convert::Infallible>
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    Box::pin(async move {
        // The request is a replica id: a few bytes.
        let mut grpc = tonic::server::Grpc::new(RawCodec)
            .apply_max_message_size_config(Some(1024), Some(IndexLimits::default().max_frame_bytes));
        Ok(grpc.server_streaming(IndexCall(shared), req).await)
    })
}

struct IndexCall(Arc<ServerShared>);

type Frames = ReceiverStream<Result<Bytes, Status>>;

impl tonic::server::ServerStreamingService<Bytes> for IndexCall {
    type Response = Bytes;
    type ResponseStream = Frames;
    type Future = BoxFuture<tonic::Response<Frames>, Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let shared = self.0.clone();
        Box::pin(async move {
            let peer = request.remote_addr();
            admit(&shared, request.metadata(), peer)?;
            let donor = shared.index.clone();
            let asker = pb::IndexRequest::decode(request.into_inner())
                .map_err(|e| Status::invalid_argument(format!("not an IndexRequest: {e}")))?
                .replica;
            if !donor.source.ready() {
                return Err(Status::failed_precondition("this replica is warming up itself"));
            }
            let Ok(permit) = donor.serving.clone().try_acquire_owned() else {
                return Err(Status::resource_exhausted("this replica is serving its index to another replica"));
            };
            let (frames, frames_rx) = mpsc::channel(4);
            tokio::spawn(async move {
                let _serving = permit;
                let serving = export_frames(&*donor.source, |frame| {
                    let frames = frames.clone();
                    async move { frames.send(Ok(frame)).await.is_ok() }
                });
                match tokio::time::timeout(SERVE_AT_MOST, serving).await {
                    Ok(Ok(IndexSummary { workers, blocks })) => {
                        shared.metrics.indexes_served.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(
                            asker,
                            ?peer,
                            workers,
                            blocks,
                            "warm start: KV index served to a replica starting up"
                        );
                    }
                    Ok(Err(why)) => tracing::info!(asker, ?peer, why, "warm start: index not served to its end"),
                    Err(_) => tracing::warn!(
                        asker,
                        ?peer,
                        "warm start: an asker stopped reading this replica's index; dropped"
                    ),
                }
            });
            Ok(tonic::Response::new(ReceiverStream::new(frames_rx)))
        })
    }
}

/// How an index fetch ended badly.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("peer not reachable: {0}")]
    Unreachable(String),
    #[error("peer refused ({code:?}): {message}")]
    Refused { code: Code, message: String },
    #[error("peer's index stream broke: {0}")]
    Broken(String),
    #[error("peer's index frame refused: {0}")]
    Frame(#[from] FrameError),
    #[error("peer sent nothing for {0:?}")]
    Idle(Duration),
    #[error("peer's index ended after {got} of {said} workers")]
    Incomplete { got: u64, said: u64 },
    #[error("the index's taker stopped")]
    Dropped,
}

/// What a whole index held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexSummary {
    pub workers: u64,
    pub blocks: u64,
}

/// Asks the replica at `addr` for its index and passes each worker to
/// `out` as it arrives (a full `out` slows the peer, never grows memory).
/// A frame not received within `idle` ends the fetch.
pub async fn fetch_index(
    addr: SocketAddr,
    config: &DirectConfig,
    limits: IndexLimits,
    idle: Duration,
    out: mpsc::Sender<WorkerIndex>,
) -> Result<IndexSummary, WarmError> {
    let mut client =
        dial(addr, config, limits.max_frame_bytes).await.map_err(|e| WarmError::Unreachable(error_chain(&*e)))?;
    let ask = pb::IndexRequest { replica: config.replica.0 }.encode_to_vec();
    let mut request = tonic::Request::new(Bytes::from(ask));
    introduce(&mut request, config).map_err(|e| WarmError::Unreachable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(INDEX);
    let mut frames = match client.server_streaming(request, path, RawCodec).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Err(WarmError::Refused { code: status.code(), message: status.message().to_owned() }),
    };
    let mut taker = IndexTaker::new(limits);
    loop {
        let next = tokio::time::timeout(idle, frames.message()).await.map_err(|_| WarmError::Idle(idle))?;
        let bytes = match next {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Err(WarmError::Broken("ended without its end frame".into())),
            Err(status) => return Err(WarmError::Broken(status.to_string())),
        };
        if let Some(whole) = taker.take(&bytes, &out).await? {
            return Ok(whole);
        }
    }
}

/// Puts a peer's index back together frame by frame, whatever carried it
/// (`Peer/Index`, or an object of the `nats` transport's store).
pub(crate) struct IndexTaker {
    limits: IndexLimits,
    parts: WorkerParts,
    got: IndexSummary,
}

impl IndexTaker {
    pub(crate) fn new(limits: IndexLimits) -> Self {
        IndexTaker { limits, parts: WorkerParts::default(), got: IndexSummary::default() }
    }

    pub(crate) fn limits(&self) -> &IndexLimits {
        &self.limits
    }

    /// Takes one frame: a whole worker goes to `out`; the summary once the
    /// end frame shows every worker came.
    pub(crate) async fn take(
        &mut self,
        bytes: &[u8],
        out: &mpsc::Sender<WorkerIndex>,
    ) -> Result<Option<IndexSummary>, WarmError> {
        match self.parts.take(decode_piece(bytes, &self.limits)?, &self.limits)? {
            None => Ok(None),
            Some(IndexPiece::Worker { index, .. }) => {
                self.got.workers += 1;
                self.got.blocks += index.snapshot.blocks.blocks.len() as u64;
                out.send(index).await.map_err(|_| WarmError::Dropped)?;
                Ok(None)
            }
            Some(IndexPiece::End { workers, .. }) if workers != self.got.workers => {
                Err(WarmError::Incomplete { got: self.got.workers, said: workers })
            }
            Some(IndexPiece::End { .. }) => Ok(Some(self.got)),
        }
    }
}

/// Every frame of this replica's index, a worker at a time, then the end
/// frame; `send` takes each (false: the taker left).
pub(crate) async fn export_frames<F, Fut>(source: &dyn IndexSource, mut send: F) -> Result<IndexSummary, &'static str>
where
    F: FnMut(Bytes) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let limits = IndexLimits::default();
    let mut got = IndexSummary::default();
    for worker in source.workers() {
        let Some(index) = source.export(worker).await else { continue };
        got.workers += 1;
        got.blocks += index.snapshot.blocks.blocks.len() as u64;
        for frame in encode_worker(&index, &limits) {
            if !send(Bytes::from(frame)).await {
                return Err("the asker left");
            }
        }
    }
    if !send(Bytes::from(encode_end(got.workers, got.blocks))).await {
        return Err("the asker left");
    }
    Ok(got)
}
