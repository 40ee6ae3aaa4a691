//! The client of the local decode engine: pooled HTTP/1.1 connections,
//! each driven in the task of the request that uses it.
//!
//! Why not hyper-util's pooled client, which the prefill leg uses: it runs
//! every connection on a task of its own, so before the first byte the
//! request, the answer's head and the first body frame each cross between
//! two tasks (the connection reads a body only once asked for it). On the
//! two-vCPU bench machine those hand-offs were most of the sidecar's own
//! share of its hop, and a third of its CPU (perf/README.md, "Decode
//! sidecar"). There is one decode engine, so there is one pool.
//!
//! Cancel: dropping the request's future or its answer drops the
//! connection, which closes it, and the engine aborts the request.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HOST, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::body::Boxed;

type Connection = http1::Connection<TokioIo<TcpStream>, Boxed>;

/// Idle connections kept at most: more than the engine's concurrent
/// requests is no use, and each holds a socket.
const MAX_IDLE: usize = 256;

/// An idle connection older than this is closed rather than kept: the
/// engines close theirs sooner (uvicorn after 5 s), and one the engine
/// closed would otherwise hold its socket until taken again.
const IDLE_FOR_AT_MOST: Duration = Duration::from_secs(30);

pub struct LocalEngine {
    at: SocketAddr,
    /// `Host` of every request (the engines ignore it; HTTP/1.1 wants one).
    host: HeaderValue,
    connect_timeout: Duration,
    idle: Mutex<Vec<Idle>>,
}

/// A connection between requests: its sender and the connection itself,
/// polled by nobody until the next request takes it.
struct Idle {
    sender: SendRequest<Boxed>,
    connection: Connection,
    since: Instant,
}

impl LocalEngine {
    pub fn new(at: SocketAddr, connect_timeout: Duration) -> Arc<Self> {
        let host = HeaderValue::from_str(&at.to_string()).unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        Arc::new(LocalEngine { at, host, connect_timeout, idle: Mutex::new(Vec::new()) })
    }

    /// Sends a request; the answer's body streams, driving its connection.
    /// A pooled connection that turns out unusable before the request was
    /// written is replaced by a new one.
    pub async fn send(
        self: &Arc<Self>,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Boxed,
    ) -> Result<Response<Boxed>, String> {
        // Origin-form only: an asterisk or absolute target is refused,
        // never sent.
        let uri: Uri = path_and_query
            .parse()
            .ok()
            .filter(|u: &Uri| u.scheme().is_none() && path_and_query.starts_with('/'))
            .ok_or_else(|| format!("{path_and_query:?} is not a path an engine can be asked for"))?;
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers.clone();
        request.headers_mut().insert(HOST, self.host.clone());
        loop {
            let (reused, Idle { mut sender, connection, .. }) = match self.checkout() {
                Some(idle) => (true, idle),
                None => (false, self.connect().await?),
            };
            let mut connection = Some(connection);
            let sent = sender.try_send_request(request);
            match drive(sent, &mut connection).await {
                Ok(answer) => {
                    let (parts, body) = answer.into_parts();
                    let body = Driven { body, connection, sender: Some(sender), engine: self.clone() };
                    return Ok(Response::from_parts(parts, Boxed::new(body)));
                }
                Err(mut error) => match error.take_message() {
                    // Never written: a pooled connection closed while idle.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(format!("{}: {}", self.at, error.error())),
                },
            }
        }
    }

    async fn connect(&self) -> Result<Idle, String> {
        let at = self.at;
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(at))
            .await
            .map_err(|_| format!("{at}: no connection within {} ms", self.connect_timeout.as_millis()))?
            .map_err(|e| format!("{at}: {e}"))?;
        // Tokens are small writes: no Nagle delay on them.
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("{at}: {e}"))?;
        Ok(Idle { sender, connection, since: Instant::now() })
    }

    /// The most recently used idle connection still open. Each is polled
    /// once (without a waker to call), outside the lock, so that one the
    /// engine closed while idle shows it and is dropped.
    fn checkout(&self) -> Option<Idle> {
        loop {
            let mut candidate = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop()?;
            let polled = Pin::new(&mut candidate.connection).poll(&mut Context::from_waker(Waker::noop()));
            if polled.is_pending() && candidate.sender.is_ready() {
                return Some(candidate);
            }
        }
    }

    /// Keeps `connection` for the next request, and closes those idle for
    /// too long (the oldest are first).
    fn checkin(&self, connection: Idle) {
        let now = connection.since;
        let stale = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            let stale = idle.iter().take_while(|i| now.duration_since(i.since) > IDLE_FOR_AT_MOST).count();
            let stale: Vec<Idle> = idle.drain(..stale).collect();
            if idle.len() < MAX_IDLE {
                idle.push(connection);
            }
            stale
        };
        // Closed outside the lock.
        drop(stale);
    }

    /// Idle connections now (for tests).
    pub fn idle_connections(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Polls the request's answer and its connection together until the
/// answer's head is in. The connection may end first (the engine closed
/// it): the answer then carries hyper's error.
async fn drive<F, T>(sent: F, connection: &mut Option<Connection>) -> T
where
    F: Future<Output = T>,
{
    let mut sent = std::pin::pin!(sent);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(answer) = sent.as_mut().poll(cx) {
            return Poll::Ready(answer);
        }
        if let Some(open) = connection.as_mut() {
            if Pin::new(open).poll(cx).is_ready() {
                *connection = None;
                // Ended: whatever it had to say the answer has now.
                return sent.as_mut().poll(cx);
            }
        }
        Poll::Pending
    })
    .await
}

/// The engine's answer body, driving its connection as it is read, and
/// giving the connection back to the pool once read to its end.
struct Driven {
    body: Incoming,
    connection: Option<Connection>,
    sender: Option<SendRequest<Boxed>>,
    engine: Arc<LocalEngine>,
}

impl Driven {
    fn give_back(&mut self, cx: &mut Context<'_>) {
        let (Some(mut connection), Some(sender)) = (self.connection.take(), self.sender.take()) else { return };
        // One more turn lets the connection finish the message and go idle.
        // One still busy (the engine answered before reading all of a
        // streamed request body) is closed, not kept: it would hold the
        // client's upload until taken again.
        if Pin::new(&mut connection).poll(cx).is_pending() && sender.is_ready() {
            self.engine.checkin(Idle { sender, connection, since: Instant::now() });
        }
    }
}

impl Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(open) = this.connection.as_mut() {
            if Pin::new(open).poll(cx).is_ready() {
                // Closed (after the answer, or broken: the body says which).
                this.connection = None;
            }
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.body.is_end_stream(),
            _ => false,
        };
        if ended {
            this.give_back(cx);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
