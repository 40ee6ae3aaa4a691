//! Warm start through NATS (the `nats` transport): a replica starting up
//! asks on `kvpick.<pool>.index` (a request one ready replica of the queue
//! group `donors` answers). That donor writes its KV index (the frames
//! `Peer/Index` streams, `wire::index`, each after its length as 4 bytes
//! big-endian) as one object of the pool's object store
//! `KVPICK_<pool>_INDEX`, and answers with the object's name once it is
//! whole. The asker reads it back a worker at a time and deletes it; the
//! store drops what an asker left behind after an hour.
//!
//! Replicas join the donors once ready. A donor serving another asker
//! answers `busy` (one warming up, in a race, `warming`): the asker asks
//! again (the queue group picks a member at random) a few times, then
//! starts cold or asks its direct peers. With no donor at all the request
//! fails at once (NATS's no-responders).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, object_store};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use super::NatsLink;
use crate::endpoint::IndexSource;
use crate::metrics::TransportMetrics;
use crate::warm::{IndexSummary, IndexTaker, WarmError, export_frames};
use crate::wire::{IndexLimits, WorkerIndex};

/// How many times an asker asks before it gives up on NATS.
const ASKS: usize = 5;
/// An object an asker never took is gone after this.
const KEEP: Duration = Duration::from_secs(3600);

impl NatsLink {
    fn index_subject(&self) -> String {
        format!("kvpick.{}.index", self.config.pool)
    }

    fn index_bucket(&self) -> String {
        format!("{}_INDEX", self.config.stream_name())
    }

    async fn index_store(&self) -> Result<object_store::ObjectStore, String> {
        let js = jetstream::new(self.client.clone());
        let bucket = self.index_bucket();
        match js.get_object_store(&bucket).await {
            Ok(store) => Ok(store),
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket,
                    max_age: KEEP,
                    num_replicas: self.config.stream_replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Answers peers starting up with `source`'s index (see the module
    /// docs), one at a time. It joins the donors only once `source` is
    /// ready: a replica warming up is never asked, not even by itself.
    pub fn serve_index(&self, source: Arc<dyn IndexSource>, metrics: Arc<TransportMetrics>) -> JoinHandle<()> {
        let link = self.clone();
        tokio::spawn(async move {
            while !source.ready() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let subject = link.index_subject();
            let mut asks = match link.client.queue_subscribe(subject.clone(), "donors".to_owned()).await {
                Ok(asks) => asks,
                Err(error) => {
                    tracing::warn!(subject, %error, "warm start: cannot serve this replica's index through NATS");
                    return;
                }
            };
            let serving = Arc::new(Semaphore::new(1));
            while let Some(ask) = asks.next().await {
                let Some(reply) = ask.reply.clone() else { continue };
                let asker = String::from_utf8_lossy(&ask.payload).into_owned();
                let answer = |text: &str| link.client.publish(reply.clone(), Bytes::from(text.to_owned()));
                if !source.ready() {
                    let _ = answer("warming").await;
                    continue;
                }
                let Ok(permit) = serving.clone().try_acquire_owned() else {
                    let _ = answer("busy").await;
                    continue;
                };
                let (link, source, metrics) = (link.clone(), source.clone(), metrics.clone());
                tokio::spawn(async move {
                    let _serving = permit;
                    let text = match link.put_index(&*source, &asker).await {
                        Ok((name, got)) => {
                            metrics.indexes_served.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(
                                asker,
                                workers = got.workers,
                                blocks = got.blocks,
                                "warm start: KV index served through NATS"
                            );
                            format!("object {name}")
                        }
                        Err(why) => {
                            tracing::warn!(asker, %why, "warm start: KV index not served through NATS");
                            format!("error {why}")
                        }
                    };
                    let _ = link.client.publish(reply, Bytes::from(text)).await;
                });
            }
        })
    }

    /// Writes `source`'s index as one object; its name.
    async fn put_index(&self, source: &dyn IndexSource, asker: &str) -> Result<(String, IndexSummary), String> {
        let store = self.index_store().await?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let name = format!("index-{}-for-{asker}-{nanos}", self.config.replica.0);
        // Frames flow through a pipe as the workers are exported: the
        // store takes them in chunks, never the whole index in memory.
        let (mut writer, mut reader) = tokio::io::duplex(1 << 20);
        let (frames, mut to_write) = mpsc::channel::<Bytes>(4);
        let export = export_frames(source, move |frame| {
            let frames = frames.clone();
            async move { frames.send(frame).await.is_ok() }
        });
        let write = async move {
            while let Some(frame) = to_write.recv().await {
                let len = u32::try_from(frame.len()).unwrap_or(u32::MAX).to_be_bytes();
                if writer.write_all(&len).await.is_err() || writer.write_all(&frame).await.is_err() {
                    break; // the store stopped taking it: the export stops too
                }
            }
        };
        let (got, (), put) = tokio::join!(export, write, store.put(name.as_str(), &mut reader));
        put.map_err(|e| format!("the object store refused the index: {e}"))?;
        Ok((name, got.map_err(str::to_owned)?))
    }

    /// Asks a ready peer for its index through NATS and passes each worker
    /// to `out` as it is read. `within` bounds each ask (a donor answers
    /// once the whole index is stored).
    pub async fn fetch_index(
        &self,
        limits: IndexLimits,
        within: Duration,
        out: mpsc::Sender<WorkerIndex>,
    ) -> Result<IndexSummary, WarmError> {
        let mut last = String::from("nobody answered");
        for _ in 0..ASKS {
            let request = async_nats::Request::new()
                .payload(Bytes::from(self.config.replica.0.to_string()))
                .timeout(Some(within));
            let answer = match self.client.send_request(self.index_subject(), request).await {
                Ok(answer) => answer,
                Err(e) => return Err(WarmError::Unreachable(format!("no donor answered on NATS: {e}"))),
            };
            let text = String::from_utf8_lossy(&answer.payload).into_owned();
            let Some(name) = text.strip_prefix("object ") else {
                last = text;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let store = self.index_store().await.map_err(WarmError::Unreachable)?;
            let taken = self.read_index(&store, name, limits, &out).await;
            if let Err(error) = store.delete(name).await {
                tracing::debug!(%error, name, "warm start: the index object not deleted (the store drops it later)");
            }
            return taken;
        }
        Err(WarmError::Refused { code: tonic::Code::Unavailable, message: last })
    }

    async fn read_index(
        &self,
        store: &object_store::ObjectStore,
        name: &str,
        limits: IndexLimits,
        out: &mpsc::Sender<WorkerIndex>,
    ) -> Result<IndexSummary, WarmError> {
        let mut object = store.get(name).await.map_err(|e| WarmError::Broken(format!("object {name}: {e}")))?;
        let mut taker = IndexTaker::new(limits);
        loop {
            let len = match object.read_u32().await {
                Ok(len) => len as usize,
                Err(e) => return Err(WarmError::Broken(format!("object {name} ended without its end frame: {e}"))),
            };
            let cap = taker.limits().max_frame_bytes;
            if len > cap {
                return Err(WarmError::Frame(crate::wire::FrameError::TooLarge { bytes: len, max: cap }));
            }
            let mut frame = vec![0u8; len];
            object.read_exact(&mut frame).await.map_err(|e| WarmError::Broken(format!("object {name}: {e}")))?;
            if let Some(whole) = taker.take(&frame, out).await? {
                return Ok(whole);
            }
        }
    }
}
