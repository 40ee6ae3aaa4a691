//! The sim's own KV transfer: how a decode engine pulls a held prompt from
//! a prefill engine. It stands for NIXL reads (vLLM), the bootstrap server
//! and KV sender (SGLang) and the cache transceiver (TensorRT-LLM), which
//! move GPU memory; here only the token ids move, and the decode engine
//! charges the transfer time itself.
//!
//! Wire: one TCP connection per pull, one JSON line each way.
//! - Request: `{"key": "<kind>:<id>", "block_ids": [u64] | null, "wait_ms": u64}`.
//!   `key` is `vllm:<remote_request_id>`, `room:<bootstrap_room>` or
//!   `ctx:<ctx_request_id>`; `block_ids`, when given, must be the offer's;
//!   `wait_ms` > 0 waits that long for an offer not there yet (SGLang's
//!   decode may ask before its prefill finished).
//! - Answer: `{"result": "ok", "token_ids": [u32], "first_token": u32 | null,
//!   "block_ids": [u64]}`, or `{"result": "unknown" | "expired" |
//!   "already_pulled" | "mismatch" | "timeout", "message": str}`.
//!
//! A pull takes the offer: the prefill's blocks are released before the
//! answer is written (a decode that goes away meanwhile loses them, as a
//! failed NIXL read would). A waiting pull whose client closes the
//! connection stops waiting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::TransferHub;
use crate::engine::EngineClient;
use crate::engine_loop::HoldTake;

/// Longest request line accepted (the block ids of a long prompt fit).
const MAX_LINE: u64 = 1 << 20;

/// Time for a client to send its request, and for a pull without a wait
/// to be answered, beyond its `wait_ms`.
const IO_SLACK: Duration = Duration::from_secs(5);

/// What a decode engine asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PullRequest {
    pub(crate) key: String,
    pub(crate) block_ids: Option<Vec<u64>>,
    pub(crate) wait: Duration,
}

/// A successful pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pulled {
    pub(crate) token_ids: Vec<u32>,
    pub(crate) first_token: Option<u32>,
}

/// A failed pull: its `result` label (see `pd::TRANSFER_RESULTS`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PullFailure {
    pub(crate) result: &'static str,
    pub(crate) message: String,
}

impl PullFailure {
    fn new(result: &'static str, message: impl Into<String>) -> Self {
        PullFailure { result, message: message.into() }
    }
}

/// A running side-channel server.
pub(crate) struct SideChannel {
    pub(crate) addr: SocketAddr,
    pub(crate) task: JoinHandle<()>,
    pub(crate) stop: oneshot::Sender<()>,
}

/// Serves pulls of `hub`'s offers on `listener` until `stop`.
pub(crate) fn serve(listener: TcpListener, hub: Arc<TransferHub>, engine: EngineClient) -> SideChannel {
    let addr = listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let (stop, mut stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_pull(stream, Arc::clone(&hub), engine.clone()));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "side channel: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
            }
        }
    });
    SideChannel { addr, task, stop }
}

async fn serve_pull(stream: TcpStream, hub: Arc<TransferHub>, engine: EngineClient) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    let read = tokio::time::timeout(IO_SLACK, (&mut reader).take(MAX_LINE).read_line(&mut line)).await;
    let request = match read {
        Ok(Ok(n)) if n > 0 => parse_request(&line),
        _ => return,
    };
    let (answer, pulled) = match request {
        Ok(request) => match answer(&hub, &engine, &request, &mut reader).await {
            Some(done) => done,
            // The client went away while waiting.
            None => return,
        },
        Err(message) => (json!({"result": "mismatch", "message": message}), None),
    };
    let mut bytes = answer.to_string().into_bytes();
    bytes.push(b'\n');
    if write.write_all(&bytes).await.is_ok()
        && write.flush().await.is_ok()
        && let Some(pulled) = pulled
    {
        let _ = pulled.send(());
    }
}

fn parse_request(line: &str) -> Result<PullRequest, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("bad pull request: {e}"))?;
    let key = value.get("key").and_then(Value::as_str).ok_or("bad pull request: no key")?.to_owned();
    let block_ids = match value.get("block_ids") {
        None | Some(Value::Null) => None,
        Some(Value::Array(ids)) => {
            Some(ids.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>().ok_or("bad pull request: block_ids")?)
        }
        Some(_) => return Err("bad pull request: block_ids".into()),
    };
    let wait = Duration::from_millis(value.get("wait_ms").and_then(Value::as_u64).unwrap_or(0));
    Ok(PullRequest { key, block_ids, wait })
}

/// The answer to one pull, and whom to tell once it is written; `None` if
/// the client closed the connection while waiting.
async fn answer<R: AsyncRead + Unpin>(
    hub: &TransferHub,
    engine: &EngineClient,
    request: &PullRequest,
    client: &mut R,
) -> Option<(Value, Option<oneshot::Sender<()>>)> {
    let failed = |result: &str, message: String| Some((json!({"result": result, "message": message}), None));
    let deadline = Instant::now() + request.wait;
    let offer = loop {
        let notified = hub.ready().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(offer) = hub.take(&request.key) {
            break offer;
        }
        if hub.was_pulled(&request.key) {
            return failed("already_pulled", format!("{} was already pulled", request.key));
        }
        if request.wait.is_zero() {
            return failed("unknown", format!("no KV held for {}", request.key));
        }
        if Instant::now() >= deadline {
            return failed("timeout", format!("{} not ready within {:?}", request.key, request.wait));
        }
        let mut probe = [0u8; 1];
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline) => {}
            // The client sends nothing after its line: any read is its end.
            _ = client.read(&mut probe) => return None,
        }
    };
    if let Some(ids) = &request.block_ids
        && *ids != offer.block_ids
    {
        let message = format!("block ids {ids:?} are not those held for {}", request.key);
        let key = request.key.clone();
        if let Some(replaced) = hub.offer(key, offer) {
            engine.release_hold(replaced);
        }
        return failed("mismatch", message);
    }
    match engine.take_hold(offer.hold).await {
        Ok(HoldTake::Taken) => Some((
            json!({
                "result": "ok",
                "token_ids": offer.token_ids,
                "first_token": offer.first_token,
                "block_ids": offer.block_ids,
            }),
            offer.pulled,
        )),
        Ok(HoldTake::Expired) => failed("expired", format!("the lease on {} ended", request.key)),
        Ok(HoldTake::Unknown) | Err(_) => failed("unknown", format!("no KV held for {}", request.key)),
    }
}

/// Pulls `request` from the side channel at `host:port`.
pub(crate) async fn pull(host: &str, port: u16, request: &PullRequest) -> Result<Pulled, PullFailure> {
    let call = async {
        let mut stream = TcpStream::connect((host, port))
            .await
            .map_err(|e| PullFailure::new("unreachable", format!("cannot reach {host}:{port}: {e}")))?;
        let line = json!({
            "key": request.key,
            "block_ids": request.block_ids,
            "wait_ms": u64::try_from(request.wait.as_millis()).unwrap_or(u64::MAX),
        });
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        let lost = |e: std::io::Error| PullFailure::new("unreachable", format!("{host}:{port}: {e}"));
        stream.write_all(&bytes).await.map_err(lost)?;
        let mut answer = String::new();
        BufReader::new(&mut stream).take(MAX_LINE * 8).read_line(&mut answer).await.map_err(lost)?;
        parse_answer(&answer).map_err(|message| PullFailure::new("unreachable", format!("{host}:{port}: {message}")))?
    };
    match tokio::time::timeout(request.wait + IO_SLACK, call).await {
        Ok(result) => result,
        Err(_) => Err(PullFailure::new("timeout", format!("{host}:{port} did not answer in time"))),
    }
}

/// The server's answer: the pull's result, or why the answer is garbled.
fn parse_answer(line: &str) -> Result<Result<Pulled, PullFailure>, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("bad answer: {e}"))?;
    let result = value.get("result").and_then(Value::as_str).ok_or("bad answer: no result")?;
    if result != "ok" {
        let label = super::TRANSFER_RESULTS.iter().find(|r| **r == result).copied().unwrap_or("unknown");
        let message = value.get("message").and_then(Value::as_str).unwrap_or(result).to_owned();
        return Ok(Err(PullFailure { result: label, message }));
    }
    let token_ids = value
        .get("token_ids")
        .and_then(Value::as_array)
        .and_then(|ids| ids.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect())
        .ok_or("bad answer: token_ids")?;
    let first_token = value.get("first_token").and_then(Value::as_u64).and_then(|t| u32::try_from(t).ok());
    Ok(Ok(Pulled { token_ids, first_token }))
}
