//! Shared by the simulated engine's socket tests: an HTTP client (JSON and
//! SSE) and ZMQ subscriber / replay helpers, all bounded in time.

// Each test binary uses a different part of this module.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvpick_kv_events::wire::{DecodedBatch, decode_batch};
use kvpick_sim::{EngineConfig, TimeModel};
use serde_json::Value;

/// Longest wait for anything in these tests.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A small, fast engine: 100× real time.
pub fn fast_config(block_size: u32, num_blocks: usize) -> EngineConfig {
    EngineConfig {
        block_size,
        num_blocks,
        default_max_tokens: 4,
        time: TimeModel { time_scale: 100.0, ..TimeModel::default() },
        ..EngineConfig::default()
    }
}

pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

pub struct Answer {
    pub status: StatusCode,
    pub engine: Option<String>,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        self.text().lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
    }
}

impl Default for Http {
    fn default() -> Self {
        Http { client: Client::builder(TokioExecutor::new()).build_http() }
    }
}

impl Http {
    pub async fn request(&self, method: Method, url: &str, body: Option<&Value>) -> Answer {
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let request = Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(bytes))
            .expect("valid request");
        self.exchange(request).await
    }

    /// Sends `request` and reads the whole answer, within the deadline.
    async fn exchange(&self, request: Request<Full<Bytes>>) -> Answer {
        let call = async {
            let response = self.client.request(request).await.expect("HTTP request");
            let status = response.status();
            let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let engine = header("x-sim-engine");
            let content_type = header("content-type").unwrap_or_default();
            let body = response.into_body().collect().await.expect("HTTP body").to_bytes().to_vec();
            Answer { status, engine, content_type, body }
        };
        tokio::time::timeout(DEADLINE, call).await.expect("HTTP answer in time")
    }

    pub async fn post(&self, url: &str, body: &Value) -> Answer {
        self.request(Method::POST, url, Some(body)).await
    }

    /// A POST with extra headers (e.g. `x-request-id`, as P/D proxies send).
    pub async fn post_with(&self, url: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
        let mut request = Request::builder().method(Method::POST).uri(url).header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::from(body.to_string()))).expect("valid request");
        self.exchange(request).await
    }

    pub async fn post_raw(&self, url: &str, body: &'static str) -> Answer {
        let request = Request::post(url).body(Full::new(Bytes::from_static(body.as_bytes()))).expect("valid request");
        let response =
            tokio::time::timeout(DEADLINE, self.client.request(request)).await.expect("in time").expect("HTTP request");
        let status = response.status();
        let body = response.into_body().collect().await.expect("body").to_bytes().to_vec();
        Answer { status, engine: None, content_type: String::new(), body }
    }

    pub async fn get(&self, url: &str) -> Answer {
        self.request(Method::GET, url, None).await
    }
}

/// A SUB socket on an engine's KV events, decoding with kvpick's decoder.
pub struct Subscriber {
    _ctx: zmq::Context,
    socket: zmq::Socket,
}

impl Subscriber {
    /// Connects, subscribes to everything and waits out ZMQ's slow-joiner
    /// window (a PUB drops what it sends before the subscription arrives).
    pub fn connect(endpoint: &str) -> Subscriber {
        let ctx = zmq::Context::new();
        let socket = ctx.socket(zmq::SUB).expect("SUB socket");
        socket.set_linger(0).expect("linger");
        socket.connect(endpoint).expect("connect SUB");
        socket.set_subscribe(b"").expect("subscribe");
        tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(300)));
        Subscriber { _ctx: ctx, socket }
    }

    /// The next message's frames, or `None` after `timeout`. Blocks the
    /// thread (`block_in_place`: the engine's tasks run on).
    pub fn recv_frames(&self, timeout: Duration) -> Option<Vec<Vec<u8>>> {
        let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        tokio::task::block_in_place(|| match self.socket.poll(zmq::POLLIN, ms).expect("poll SUB") {
            0 => None,
            _ => Some(self.socket.recv_multipart(0).expect("recv SUB")),
        })
    }

    /// The next batch, `(topic, seq, decoded)`, or `None` after `timeout`.
    pub fn recv_batch(&self, timeout: Duration) -> Option<(Vec<u8>, u64, DecodedBatch)> {
        let frames = self.recv_frames(timeout)?;
        assert_eq!(frames.len(), 3, "live messages are [topic, seq, payload]");
        let seq = u64::from_be_bytes(frames[1].as_slice().try_into().expect("8-byte seq"));
        let batch = decode_batch(&frames[2]).expect("kvpick decodes the batch");
        Some((frames[0].clone(), seq, batch))
    }

    /// Every batch arriving until `quiet` passes without one.
    pub fn drain(&self, quiet: Duration) -> Vec<(u64, DecodedBatch)> {
        let mut out = Vec::new();
        let end = Instant::now() + DEADLINE;
        while let Some((_, seq, batch)) = self.recv_batch(quiet) {
            out.push((seq, batch));
            assert!(Instant::now() < end, "batches keep coming");
        }
        out
    }
}

/// Asks a replay ROUTER for everything from `start` through a DEALER, as
/// kvpick does; returns the replies' frames (delimiter included), the end
/// marker last. Blocks the thread (`block_in_place`).
pub fn replay(endpoint: &str, start: u64) -> Vec<Vec<Vec<u8>>> {
    tokio::task::block_in_place(|| replay_blocking(endpoint, start))
}

fn replay_blocking(endpoint: &str, start: u64) -> Vec<Vec<Vec<u8>>> {
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).expect("DEALER socket");
    dealer.set_linger(0).expect("linger");
    dealer.connect(endpoint).expect("connect DEALER");
    dealer.send_multipart([&b""[..], &start.to_be_bytes()[..]], 0).expect("send replay request");
    let mut replies = Vec::new();
    let end = Instant::now() + DEADLINE;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "replay answer did not end in time");
        if dealer.poll(zmq::POLLIN, left.as_millis() as i64).expect("poll DEALER") == 0 {
            continue;
        }
        let frames = dealer.recv_multipart(0).expect("recv DEALER");
        // The end marker: [.., END_SEQ, ""]; a batch's payload is never empty.
        let is_end = frames.len() >= 2
            && frames[frames.len() - 1].is_empty()
            && frames[frames.len() - 2].as_slice() == u64::MAX.to_be_bytes();
        replies.push(frames);
        if is_end {
            return replies;
        }
    }
}

/// Sends a JSON POST on a raw connection and returns the open socket: the
/// test drops it to play a client that goes away before the answer.
pub async fn post_and_hold(addr: std::net::SocketAddr, path: &str, body: &Value) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("send head");
    stream.write_all(body.as_bytes()).await.expect("send body");
    stream
}

/// The value of the sample of `metric` whose labels contain `label` (e.g.
/// `result="ok"`) in a `/metrics` page.
pub fn metric(page: &str, metric: &str, label: &str) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{') && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Polls `check` every 20 ms until it holds, failing after [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < end, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
