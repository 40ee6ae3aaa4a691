//! The decode sidecar's own cost: latency it adds to a streamed answer and
//! CPU per request, against the same requests without it, same run.
//!
//! Instant engines (in this process, on loopback) take the engines' time
//! out of it: a decode engine that streams a vLLM-shaped SSE answer at
//! once, and a prefill engine that answers NixlConnector's
//! `kv_transfer_params` at once. Five ways, interleaved request by
//! request so the machine's noise falls on all alike:
//! - `direct`: the client to the decode engine;
//! - `TCP relay`: through a bare byte relay to the decode engine (tokio's
//!   `copy_bidirectional`): what one more loopback hop each way costs,
//!   with no HTTP in it, the least any proxy adds;
//! - `sidecar, whole`: through the sidecar, no prefiller (one hop more);
//! - `two legs, direct`: the client runs both legs itself (what a proxy
//!   must do at the least);
//! - `sidecar, split`: through the sidecar with `x-prefiller-host-port`.
//!
//! Added latency = p50 (and p99) of the sidecar way minus its baseline's,
//! to the first body byte and to the answer's end; the whole way is also
//! set against the relay (the sidecar's own share of its hop).
//!
//! `cargo run --release -p kvpick-perf --bin kvpick-bench-sidecar [-- --requests N --tokens N]`

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kvpick_perf::measure::{CpuTimes, Latencies, LatencySummary, TICKS_PER_SEC};
use kvpick_perf::report::{Table, cpu, load_average, ns, utc_date};
use kvpick_sidecar::{Sidecar, SidecarConfig};
use serde_json::json;
use tokio::net::TcpListener;

#[derive(Clone, Copy)]
struct Args {
    requests: usize,
    tokens: usize,
    /// 0: the sidecar shares the client's and engines' runtime (two
    /// threads); else a runtime of its own, as `kvpick sidecar
    /// --io-threads`: 1 is a current-thread runtime, more a multi-thread one.
    sidecar_threads: usize,
}

fn args() -> Args {
    let mut args = Args { requests: 4000, tokens: 32, sidecar_threads: 0 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().and_then(|v| v.parse().ok());
        match (flag.as_str(), value) {
            ("--requests", Some(v)) => args.requests = v,
            ("--tokens", Some(v)) => args.tokens = v,
            ("--sidecar-threads", Some(v)) => args.sidecar_threads = v,
            _ => {
                eprintln!("usage: kvpick-bench-sidecar [--requests N] [--tokens N] [--sidecar-threads N]");
                std::process::exit(2);
            }
        }
    }
    args
}

/// An engine that answers at once: the decode one streams `tokens` SSE
/// chunks (or one JSON answer), the prefill one answers transfer params.
async fn instant_engine(prefill: bool, tokens: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| async move {
                    let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                    Ok::<_, Infallible>(answer(prefill, tokens, &body))
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

type Answer = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn answer(prefill: bool, tokens: usize, body: &[u8]) -> Response<Answer> {
    let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if prefill {
        let body = json!({
            "id": "cmpl-p", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
            "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[0, 1, 2, 3]],
                "remote_engine_id": "e", "remote_request_id": "r", "remote_host": "127.0.0.1", "remote_port": 5600,
                "tp_size": 1, "remote_num_tokens": 64, "remote_blocks_expiry_time": 0.0},
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())).boxed())
            .unwrap_or_default();
    }
    let stream = request.get("stream").and_then(serde_json::Value::as_bool).unwrap_or(false);
    let chunk = |i: usize| {
        format!(
            "data: {{\"id\":\"cmpl-d\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}},\"finish_reason\":null}}]}}\n\n"
        )
    };
    if stream {
        // One frame per token, as an engine flushes them.
        let frames: Vec<Result<hyper::body::Frame<Bytes>, Infallible>> = (0..tokens)
            .map(|i| Ok(hyper::body::Frame::data(Bytes::from(chunk(i)))))
            .chain([Ok(hyper::body::Frame::data(Bytes::from_static(b"data: [DONE]\n\n")))])
            .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        Response::builder().header("content-type", "text/event-stream").body(body.boxed()).unwrap_or_default()
    } else {
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"choices\":[]}")).boxed())
            .unwrap_or_default()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Direct,
    Relay,
    SidecarWhole,
    TwoLegs,
    SidecarSplit,
}

const WAYS: [(Way, &str); 5] = [
    (Way::Direct, "direct"),
    (Way::Relay, "TCP relay"),
    (Way::SidecarWhole, "sidecar, whole"),
    (Way::TwoLegs, "two legs, direct"),
    (Way::SidecarSplit, "sidecar, split"),
];

struct Target {
    client: Client<HttpConnector, Full<Bytes>>,
    decode: SocketAddr,
    relay: SocketAddr,
    prefill: SocketAddr,
    sidecar: SocketAddr,
    body: Bytes,
}

/// One request one way; (first body byte, end).
async fn once(t: &Target, way: Way) -> (Duration, Duration) {
    let started = Instant::now();
    let post = |to: SocketAddr, body: Bytes, prefiller: Option<SocketAddr>| {
        let mut request =
            Request::post(format!("http://{to}/v1/chat/completions")).header("content-type", "application/json");
        if let Some(p) = prefiller {
            request = request.header("x-prefiller-host-port", p.to_string());
        }
        t.client.request(request.body(Full::new(body)).unwrap_or_default())
    };
    let response = match way {
        Way::Direct => post(t.decode, t.body.clone(), None).await,
        Way::Relay => post(t.relay, t.body.clone(), None).await,
        Way::SidecarWhole => post(t.sidecar, t.body.clone(), None).await,
        Way::SidecarSplit => post(t.sidecar, t.body.clone(), Some(t.prefill)).await,
        Way::TwoLegs => {
            let prefilled = post(t.prefill, t.body.clone(), None).await.unwrap_or_else(|e| panic!("prefill: {e}"));
            let answer = prefilled.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            let params: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
            let mut body: serde_json::Value = serde_json::from_slice(&t.body).unwrap_or_default();
            body["kv_transfer_params"] = params["kv_transfer_params"].clone();
            post(t.decode, Bytes::from(body.to_string()), None).await
        }
    }
    .unwrap_or_else(|e| panic!("request: {e}"));
    assert!(response.status().is_success(), "{}", response.status());
    let mut body = response.into_body();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap_or_else(|e| panic!("body: {e}"));
        if frame.data_ref().is_some_and(|d| !d.is_empty()) && first.is_none() {
            first = Some(started.elapsed());
        }
    }
    let end = started.elapsed();
    (first.unwrap_or(end), end)
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let decode = instant_engine(false, args.tokens).await;
    let prefill = instant_engine(true, args.tokens).await;
    let config = SidecarConfig {
        listen: "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
        decode,
        metrics_listen: None,
        ..SidecarConfig::default()
    };
    let (front, metrics) = if args.sidecar_threads == 0 {
        let sidecar = Sidecar::start(config).await.unwrap_or_else(|e| panic!("sidecar: {e}"));
        let started = (sidecar.local_addr(), sidecar.metrics().clone());
        // Serves on this runtime until the process ends.
        tokio::spawn(sidecar.wait());
        started
    } else {
        sidecar_on_its_own_runtime(config, args.sidecar_threads)
    };
    let prompt = "Summarise the history of the printing press in three paragraphs. ".repeat(40);
    let body = json!({"model": "m", "stream": true, "max_tokens": args.tokens,
        "messages": [{"role": "user", "content": prompt}]});
    let target = Target {
        client: Client::builder(TokioExecutor::new()).build_http(),
        decode,
        relay: tcp_relay(decode).await,
        prefill,
        sidecar: front,
        body: Bytes::from(body.to_string()),
    };
    // Warm every connection pool and code path.
    for _ in 0..200 {
        for (way, _) in WAYS {
            once(&target, way).await;
        }
    }
    let mut first: Vec<Latencies> = WAYS.iter().map(|_| Latencies::default()).collect();
    let mut end: Vec<Latencies> = WAYS.iter().map(|_| Latencies::default()).collect();
    for _ in 0..args.requests {
        for (i, (way, _)) in WAYS.iter().enumerate() {
            let (f, e) = once(&target, *way).await;
            first[i].record(f);
            end[i].record(e);
        }
    }
    // CPU: each way alone for the same number of requests.
    let mut cpu_per_request = Vec::new();
    for (way, _) in WAYS {
        let before = CpuTimes::now();
        for _ in 0..args.requests {
            once(&target, way).await;
        }
        let after = CpuTimes::now();
        let ticks = match (before, after) {
            (Some(b), Some(a)) => a.own.saturating_sub(b.own),
            _ => 0,
        };
        cpu_per_request.push(ticks as f64 / TICKS_PER_SEC / args.requests as f64 * 1e9);
    }
    let s: Vec<(LatencySummary, LatencySummary)> =
        first.iter().zip(&end).map(|(f, e)| (f.summary(), e.summary())).collect();
    let mut table = Table::new(
        format!(
            "Decode sidecar overhead, {} streamed answers of {} tokens per way, {} ({})",
            args.requests,
            args.tokens,
            match args.sidecar_threads {
                0 => "the sidecar on the client's and engines' runtime".to_owned(),
                n => format!("the sidecar on {n} thread(s) of its own"),
            },
            utc_date()
        ),
        &["way", "first byte p50", "p99", "end p50", "p99", "CPU / request (whole process)"],
    );
    for (i, (_, name)) in WAYS.iter().enumerate() {
        table.row([
            name.to_string(),
            ns(s[i].0.p50),
            ns(s[i].0.p99),
            ns(s[i].1.p50),
            ns(s[i].1.p99),
            ns(cpu_per_request[i] as u64),
        ]);
    }
    let added = |ours: usize, base: usize| {
        let d = |a: u64, b: u64| a as i64 - b as i64;
        format!(
            "first byte p50 {:+} ns, p99 {:+} ns; end p50 {:+} ns, p99 {:+} ns; CPU {:+.0} ns per request",
            d(s[ours].0.p50, s[base].0.p50),
            d(s[ours].0.p99, s[base].0.p99),
            d(s[ours].1.p50, s[base].1.p50),
            d(s[ours].1.p99, s[base].1.p99),
            cpu_per_request[ours] - cpu_per_request[base]
        )
    };
    table.note(format!("added by a bare TCP relay (against direct): {}", added(1, 0)));
    table.note(format!("added by the sidecar, whole (against direct): {}", added(2, 0)));
    table.note(format!("the sidecar's own share, whole (against the TCP relay): {}", added(2, 1)));
    table.note(format!("added by the sidecar, split (against two legs, direct): {}", added(4, 3)));
    table.note("target: at most 100 µs added at p50 for a streamed answer");
    table.note(format!("{}; load average {}", cpu(), load_average()));
    println!("{table}");
    let snapshot = metrics.snapshot();
    println!(
        "sidecar counted: {} split, {} whole, {} failed",
        snapshot.disaggregated, snapshot.aggregated, snapshot.failed
    );
}

/// A byte relay to `to` on this runtime: each accepted connection copied
/// both ways to a connection of its own (no delay on small writes, as
/// the sidecar's).
async fn tcp_relay(to: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("relay: {e}"));
    let at = listener.local_addr().unwrap_or_else(|e| panic!("relay: {e}"));
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut engine) = tokio::net::TcpStream::connect(to).await else { return };
                let _ = (client.set_nodelay(true), engine.set_nodelay(true));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut engine).await;
            });
        }
    });
    at
}

/// The sidecar as it runs in its pod: a runtime of its own (on threads of
/// its own), not the client's and the engines'. Runs until the process ends.
fn sidecar_on_its_own_runtime(
    config: SidecarConfig,
    threads: usize,
) -> (SocketAddr, std::sync::Arc<kvpick_sidecar::SidecarMetrics>) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = if threads == 1 {
            tokio::runtime::Builder::new_current_thread().enable_all().build()
        } else {
            tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()
        }
        .unwrap_or_else(|e| panic!("sidecar runtime: {e}"));
        runtime.block_on(async move {
            let sidecar = Sidecar::start(config).await.unwrap_or_else(|e| panic!("sidecar: {e}"));
            let _ = tx.send((sidecar.local_addr(), sidecar.metrics().clone()));
            sidecar.wait().await;
        });
    });
    rx.recv().unwrap_or_else(|e| panic!("the sidecar did not start: {e}"))
}
