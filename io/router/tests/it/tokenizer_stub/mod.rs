//! A stub engine for the tokenizer tests: a real hyper HTTP/1 server on
//! 127.0.0.1 (OS-picked port) that records what it is sent, counts the
//! connections it accepts, and answers what the test's handler says.
//! Stopped (with every connection) when dropped or by [`Stub::stop`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kvpick_router::tokenizer::{Api, TokenizeRequest, Tokenizer, TokenizerConfig, TokenizerMetrics, TokenizerProtocol};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// What the stub was sent.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub content_type: Option<String>,
    pub body: Bytes,
}

/// What the stub answers.
#[derive(Clone, Debug)]
pub enum Reply {
    /// With a `Content-Length`.
    Json(u16, Bytes),
    /// Chunked (no `Content-Length`), these chunks then the end.
    Chunked(u16, Vec<Bytes>),
    /// Chunked, this chunk forever (until the client goes away).
    Endless(Bytes),
    /// The reply after a pause.
    Delayed(Duration, Box<Reply>),
    /// Close the connection without answering.
    Close,
}

impl Reply {
    pub fn ok(json: &str) -> Reply {
        Reply::Json(200, Bytes::copy_from_slice(json.as_bytes()))
    }

    pub fn status(status: u16, body: &str) -> Reply {
        Reply::Json(status, Bytes::copy_from_slice(body.as_bytes()))
    }
}

type Handler = dyn Fn(&Seen) -> Reply + Send + Sync;

pub struct Stub {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: JoinHandle<()>,
}

impl Stub {
    /// Starts serving on 127.0.0.1 (never another address).
    pub async fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound address");
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let server = tokio::spawn({
            let (connections, seen) = (connections.clone(), seen.clone());
            async move {
                // Dropped with this task when the stub stops: aborts every connection.
                let mut open = JoinSet::new();
                while let Ok((stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (handler, seen) = (handler.clone(), seen.clone());
                    let service = service_fn(move |request| answer(request, handler.clone(), seen.clone()));
                    open.spawn(async move {
                        let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                    });
                    while open.try_join_next().is_some() {}
                }
            }
        });
        Stub { addr, connections, seen, server }
    }

    /// `http://127.0.0.1:port`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("stub lock").clone()
    }

    /// Stops accepting and closes every connection; returns once stopped.
    pub async fn stop(mut self) {
        self.server.abort();
        let _ = (&mut self.server).await;
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Debug)]
struct CloseConnection;

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("closing without an answer")
    }
}

impl std::error::Error for CloseConnection {}

async fn answer(
    request: Request<Incoming>,
    handler: Arc<Handler>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, CloseConnection> {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let content_type =
        request.headers().get(hyper::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = request.into_body().collect().await.map_err(|_| CloseConnection)?.to_bytes();
    let request = Seen { method, path, content_type, body };
    let mut reply = handler(&request);
    seen.lock().expect("stub lock").push(request);
    loop {
        let (status, body) = match reply {
            Reply::Delayed(pause, then) => {
                tokio::time::sleep(pause).await;
                reply = *then;
                continue;
            }
            Reply::Close => return Err(CloseConnection),
            Reply::Json(status, body) => (status, Full::new(body).boxed()),
            Reply::Chunked(status, chunks) => (status, Chunks { chunks: chunks.into(), forever: None }.boxed()),
            Reply::Endless(chunk) => (200, Chunks { chunks: VecDeque::new(), forever: Some(chunk) }.boxed()),
        };
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::from_u16(status).expect("test status code");
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, "application/json".parse().expect("header"));
        return Ok(response);
    }
}

/// A body of unknown length: hyper sends it chunked.
struct Chunks {
    chunks: VecDeque<Bytes>,
    forever: Option<Bytes>,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let next = this.chunks.pop_front().or_else(|| this.forever.clone());
        Poll::Ready(next.map(|chunk| Ok(Frame::data(chunk))))
    }
}

/// A rendered prompt as vLLM answers it (`GenerateRequest`), with the
/// fields kvpick ignores.
pub fn rendered(token_ids: &[u32]) -> String {
    let ids: Vec<String> = token_ids.iter().map(u32::to_string).collect();
    format!(
        r#"{{"request_id":"render-1","token_ids":[{}],"features":null,"sampling_params":{{"max_tokens":16,"temperature":0.0}},"model":"m","stream":false,"stream_options":null,"cache_salt":null,"priority":0,"kv_transfer_params":null}}"#,
        ids.join(",")
    )
}

/// A client built the way the server builds it: from a config.
pub fn client(
    protocol: TokenizerProtocol,
    url: &str,
    tweak: impl FnOnce(&mut TokenizerConfig),
) -> (Arc<dyn Tokenizer>, Arc<TokenizerMetrics>) {
    let mut config = TokenizerConfig::new(protocol, url);
    tweak(&mut config);
    let metrics = Arc::new(TokenizerMetrics::new());
    let tokenizer = config.build(metrics.clone()).expect("valid tokenizer config");
    (tokenizer, metrics)
}

pub fn vllm(url: &str) -> (Arc<dyn Tokenizer>, Arc<TokenizerMetrics>) {
    client(TokenizerProtocol::VllmRender, url, |_| {})
}

pub fn chat(body: &str) -> TokenizeRequest {
    TokenizeRequest {
        api: Api::ChatCompletions,
        body: Bytes::copy_from_slice(body.as_bytes()),
        model: "m".into(),
        prompt: None,
    }
}

pub fn completion(body: &str, prompt: Option<&str>) -> TokenizeRequest {
    TokenizeRequest {
        api: Api::Completions,
        body: Bytes::copy_from_slice(body.as_bytes()),
        model: "m".into(),
        prompt: prompt.map(str::to_owned),
    }
}

pub const CHAT_BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"Hello"}]}"#;
