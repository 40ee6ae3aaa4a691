//! The local decode engine's client against a hand-written HTTP/1.1 engine
//! on loopback that counts its connections: a connection is reused once
//! its answer was read to the end; one the engine closed while idle is
//! replaced without failing the request; an answer dropped mid-stream
//! closes its connection (the engine sees the disconnect) and is never
//! reused; a target that is not a path is refused unsent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method};
use kvpick_sidecar::body::Boxed;
use kvpick_sidecar::local_engine::LocalEngine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// What the fake engine does after each answer.
#[derive(Clone, Copy, PartialEq)]
enum After {
    /// Waits for the next request on the same connection.
    KeepAlive,
    /// Closes the connection a little later, as an idle timeout would.
    CloseSoon,
}

struct FakeEngine {
    at: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// A message per connection the client closed mid-answer.
    disconnects: mpsc::UnboundedReceiver<()>,
}

/// Answers every request with `chunks` chunked SSE frames, 5 ms apart.
async fn fake_engine(after: After, chunks: usize) -> FakeEngine {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let at = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let (tx, disconnects) = mpsc::unbounded_channel();
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, after, chunks, tx.clone()));
        }
    });
    FakeEngine { at, accepted, disconnects }
}

async fn serve(mut stream: TcpStream, after: After, chunks: usize, disconnects: mpsc::UnboundedSender<()>) {
    let mut buffer = Vec::new();
    loop {
        // One request: its head, then a Content-Length body.
        let head_end = loop {
            if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        buffer.drain(..head_end + length);
        let start = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        if stream.write_all(start).await.is_err() {
            return;
        }
        for i in 0..chunks {
            let frame = format!("data: {i}\n\n");
            let chunk = format!("{:x}\r\n{frame}\r\n", frame.len());
            if stream.write_all(chunk.as_bytes()).await.is_err() {
                let _ = disconnects.send(());
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if stream.write_all(b"0\r\n\r\n").await.is_err() {
            let _ = disconnects.send(());
            return;
        }
        if after == After::CloseSoon {
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
    }
}

fn body(text: &'static str) -> Boxed {
    Full::new(Bytes::from_static(text.as_bytes())).map_err(|never| match never {}).boxed()
}

async fn read_all(engine: &Arc<LocalEngine>) -> String {
    let answer = engine
        .send(Method::POST, "/v1/chat/completions", &HeaderMap::new(), body("{\"stream\":true}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.status(), 200);
    let bytes = answer.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_read_to_its_end_is_reused() {
    let fake = fake_engine(After::KeepAlive, 3).await;
    let engine = LocalEngine::new(fake.at, Duration::from_secs(1));
    for _ in 0..5 {
        assert_eq!(read_all(&engine).await, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
        assert_eq!(engine.idle_connections(), 1);
    }
    assert_eq!(fake.accepted.load(Ordering::SeqCst), 1, "one connection for five requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_engine_closed_while_idle_is_replaced() {
    let fake = fake_engine(After::CloseSoon, 2).await;
    let engine = LocalEngine::new(fake.at, Duration::from_secs(1));
    for round in 1..=3 {
        assert_eq!(read_all(&engine).await, "data: 0\n\ndata: 1\n\n", "round {round}");
        // The engine closes it while it waits in the pool.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(fake.accepted.load(Ordering::SeqCst), 3, "a new connection each time, and no request failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_dropped_midway_closes_its_connection() {
    let mut fake = fake_engine(After::KeepAlive, 200).await;
    let engine = LocalEngine::new(fake.at, Duration::from_secs(1));
    let answer = engine
        .send(Method::POST, "/v1/completions", &HeaderMap::new(), body("{}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut streaming = answer.into_body();
    let first = streaming.frame().await.and_then(|f| f.ok()).and_then(|f| f.into_data().ok());
    assert_eq!(first.as_deref(), Some(&b"data: 0\n\n"[..]));
    drop(streaming);
    tokio::time::timeout(Duration::from_secs(5), fake.disconnects.recv())
        .await
        .expect("the engine saw the disconnect")
        .expect("open channel");
    assert_eq!(engine.idle_connections(), 0, "a cut answer's connection is never reused");
    // The next request gets a connection of its own.
    let answer = engine.send(Method::POST, "/v1/completions", &HeaderMap::new(), body("{}")).await;
    assert!(answer.is_ok());
    assert_eq!(fake.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_is_not_a_path_is_refused_unsent() {
    let fake = fake_engine(After::KeepAlive, 1).await;
    let engine = LocalEngine::new(fake.at, Duration::from_secs(1));
    for target in ["*", "http://10.0.0.1/v1/models", "v1/models"] {
        let refused = engine.send(Method::OPTIONS, target, &HeaderMap::new(), body("")).await;
        assert!(refused.is_err_and(|e| e.contains("is not a path")), "{target}");
    }
    assert_eq!(fake.accepted.load(Ordering::SeqCst), 0);
    // An engine that is not there: the error names it.
    let gone = LocalEngine::new("127.0.0.1:1".parse().expect("addr"), Duration::from_secs(1));
    let error = gone.send(Method::GET, "/v1/models", &HeaderMap::new(), body("")).await.err().unwrap_or_default();
    assert!(error.starts_with("127.0.0.1:1"), "{error}");
}
