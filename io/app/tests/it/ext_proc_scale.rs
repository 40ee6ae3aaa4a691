//! At scale on one HTTP/2 connection: 5,000 ext_proc streams, each
//! cancelled mid-response with RST_STREAM as gateways do when clients go
//! away, must all be served and freed, and the connection must live on (no
//! GOAWAY from a reset-stream limit). Between them, 10,000 more streams are
//! reset at once or mid-body: bursts of those are what trips h2's default
//! rapid-reset guard (20 pending-accept resets → GOAWAY ENHANCE_YOUR_CALM).

use std::time::{Duration, Instant};

use crate::ext_proc_support::h2_client::RawConnection;
use crate::ext_proc_support::*;
use futures::StreamExt;
use kvpick_core::RouterConfig;

/// Streams served then cancelled; as many again are reset at once, and as
/// many mid-body.
const SERVED: usize = 5_000;
const STREAMS: usize = 3 * SERVED;
const CONCURRENCY: usize = 64;

/// Of every three streams: one reset at once (before the server has even
/// read it), one after part of its body, one mid-response.
async fn cancelled(raw: &RawConnection, i: usize) {
    match i % 3 {
        0 => {
            let mut call = raw.open().await;
            call.send(&chat_headers());
            call.cancel();
        }
        1 => {
            let mut call = raw.open().await;
            call.send(&chat_headers());
            call.send(&request_body(b"{\"model\":\"m\",\"messages\":[", false));
            tokio::task::yield_now().await;
            call.cancel();
        }
        _ => served_then_cancelled(raw, i).await,
    }
}

/// One request: picked, body echoed, response started, first token echoed,
/// then reset.
async fn served_then_cancelled(raw: &RawConnection, i: usize) {
    let mut call = raw.open().await;
    call.send(&chat_headers());
    call.send(&request_body(chat(&format!("scale {i} {}", words("w", 8))).as_bytes(), true));
    assert!(destination(&call.recv().await).is_some(), "stream {i} picked");
    assert!(streamed(&call.recv().await).is_some_and(|(_, end)| end));
    call.send(&response_headers("200", "text/event-stream", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(&response_body(b"data: {\"choices\":[]}\n\n", false));
    assert!(streamed(&call.recv().await).is_some());
    call.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_cancelled_streams_on_one_connection() {
    // A short lease bounds how long a shard may park (it wakes for the next
    // lease end): should one miss its doorbell, the test fails in seconds
    // rather than after the default lease's 300 s.
    let router = RouterConfig { lease: Duration::from_secs(20), ..RouterConfig::default() };
    let h = Harness::start(Options { router, ..Options::default() }).await;
    let raw = RawConnection::connect(h.addr).await;
    let started = Instant::now();
    let run = futures::stream::iter(0..STREAMS)
        .map(|i| cancelled(&raw, i))
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<()>>();
    tokio::time::timeout(Duration::from_secs(120), run).await.expect("15,000 streams within two minutes");
    let served = started.elapsed();

    assert!(raw.is_alive(), "the connection survived");
    h.wait_all_freed().await;
    wait_for("every free counted", || async { h.metrics.snapshot().frees == SERVED as u64 }).await;
    wait_for("every stream closed", || async { h.metrics.snapshot().streams_open == 0 }).await;
    let m = h.metrics.snapshot();
    assert_eq!((m.requests(200), m.prefill_completes, m.frees, m.frees_not_found), (5_000, 5_000, 5_000, 0));
    assert_eq!(m.total_requests(), 5_000, "streams reset before their body ended get no answer");

    // The same connection still serves.
    let mut call = raw.open().await;
    call.send(&chat_headers());
    call.send(&request_body(chat("after the storm").as_bytes(), true));
    assert!(destination(&call.recv().await).is_some());
    call.cancel();
    h.wait_all_freed().await;
    assert!(raw.is_alive());
    eprintln!("{STREAMS} streams ({SERVED} served) cancelled in {served:?}");
    raw.close();
    h.stop().await;
}
