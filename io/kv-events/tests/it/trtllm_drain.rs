//! TensorRT-LLM's drain: the ingest polls a stand-in `trtllm-serve` on
//! 127.0.0.1 (`POST /kv_cache_events`, compact JSON as FastAPI's
//! `JSONResponse` writes `KVCacheEventSerializer`'s output) and applies
//! what it answers; overflowed buffers, restarts and failing polls.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvpick_core::WorkerId;
use kvpick_kv_events::{IngestConfig, KvEventIngest, Publisher};

use crate::common::events::{BLOCK_SIZE, block_tokens, engine_hash};
use crate::common::{Service, cached_blocks, overlap, service, spawn, wait_until};

/// What the stand-in answers to one poll.
enum Answer {
    Json(String),
    Status(u16),
}

/// A stand-in `trtllm-serve`: answers polls from a script, then `[]`.
struct FakeTrtllm {
    addr: SocketAddr,
    script: Arc<Mutex<VecDeque<Answer>>>,
    polls: Arc<AtomicU64>,
}

impl FakeTrtllm {
    fn start() -> FakeTrtllm {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let script: Arc<Mutex<VecDeque<Answer>>> = Arc::default();
        let polls: Arc<AtomicU64> = Arc::default();
        let (s, p) = (Arc::clone(&script), Arc::clone(&polls));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (s, p) = (Arc::clone(&s), Arc::clone(&p));
                std::thread::spawn(move || serve(stream, &s, &p));
            }
        });
        FakeTrtllm { addr, script, polls }
    }

    fn answer(&self, answer: Answer) {
        self.script.lock().expect("script").push_back(answer);
    }

    fn polls(&self) -> u64 {
        self.polls.load(Ordering::SeqCst)
    }

    /// Waits until the script is used up and one more poll has come.
    fn wait_drained(&self) {
        let start = self.polls();
        wait_until("the script is drained", || self.script.lock().map(|s| s.is_empty()).unwrap_or(false));
        let after = self.polls();
        wait_until("one more poll", || self.polls() > after.max(start));
    }
}

/// Keep-alive HTTP/1.1: each request is read to its end (headers and any
/// `Content-Length` body) and answered.
fn serve(stream: TcpStream, script: &Mutex<VecDeque<Answer>>, polls: &AtomicU64) {
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        assert!(request_line.starts_with("POST /kv_cache_events HTTP/1.1"), "{request_line}");
        let answer = script.lock().expect("script").pop_front().unwrap_or(Answer::Json("[]".into()));
        let (status, body) = match answer {
            Answer::Json(json) => ("200 OK".to_owned(), json),
            Answer::Status(code) => (format!("{code} Error"), r#"{"detail":"engine error"}"#.to_owned()),
        };
        polls.fetch_add(1, Ordering::SeqCst);
        let head =
            format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(body.as_bytes())).is_err() {
            return;
        }
    }
}

/// `stored` of blocks `ks` (the test chain) under `parent`, as
/// `KVCacheEventSerializer` and FastAPI write it.
fn stored(id: u64, ks: &[u64], parent: Option<u64>, rank: Option<u32>) -> String {
    let blocks: Vec<String> = ks
        .iter()
        .map(|&k| {
            let tokens: Vec<String> = block_tokens(k)
                .iter()
                .map(|t| format!(r#"{{"type":"unique_token","token_id":{t},"token_extra_id":0}}"#))
                .collect();
            format!(
                r#"{{"type":"stored_block","block_hash":{},"tokens":[{}],"cache_level":0,"priority":35}}"#,
                engine_hash(k),
                tokens.join(",")
            )
        })
        .collect();
    let parent = parent.map_or("null".to_owned(), |k| engine_hash(k).to_string());
    envelope(id, &format!(r#"{{"type":"stored","parent_hash":{parent},"blocks":[{}]}}"#, blocks.join(",")), rank)
}

fn removed(id: u64, ks: &[u64]) -> String {
    let hashes: Vec<String> = ks.iter().map(|&k| engine_hash(k).to_string()).collect();
    envelope(id, &format!(r#"{{"type":"removed","block_hashes":[{}]}}"#, hashes.join(",")), None)
}

fn created(id: u64) -> String {
    envelope(id, r#"{"type":"created","num_blocks_per_cache_level":[2048,0]}"#, None)
}

fn envelope(id: u64, data: &str, rank: Option<u32>) -> String {
    let rank = rank.map_or(String::new(), |r| format!(r#","attention_dp_rank":{r}"#));
    format!(r#"{{"event_id":{id},"data":{data},"window_size":4096{rank}}}"#)
}

fn answer(events: &[String]) -> Answer {
    Answer::Json(format!("[{}]", events.join(",")))
}

fn quick() -> IngestConfig {
    IngestConfig {
        drain_interval: Duration::from_millis(5),
        drain_backoff_max: Duration::from_millis(50),
        drain_timeout: Duration::from_secs(2),
        ..IngestConfig::default()
    }
}

fn drained_worker(cfg: IngestConfig) -> (Service, KvEventIngest, FakeTrtllm) {
    let svc = service(&[1]);
    let ingest = spawn(&svc, cfg);
    let engine = FakeTrtllm::start();
    let publisher = Publisher::trtllm_drain(WorkerId(1), engine.addr);
    assert!(publisher.is_drain());
    assert_eq!(publisher.endpoint, format!("http://{}/kv_cache_events", engine.addr));
    ingest.add(publisher).expect("publisher added");
    (svc, ingest, engine)
}

#[test]
fn drained_events_are_indexed_in_order() {
    assert_eq!(BLOCK_SIZE, 4);
    let (svc, ingest, engine) = drained_worker(quick());
    engine.answer(answer(&[created(0), stored(1, &[0, 1], None, None)]));
    engine.answer(answer(&[stored(2, &[2], Some(1), None)]));
    wait_until("three blocks held", || overlap(&svc, 1, 3) == 3);
    engine.answer(answer(&[removed(3, &[2])]));
    wait_until("the last block evicted", || overlap(&svc, 1, 3) == 2);
    let c = ingest.metrics().snapshot();
    assert_eq!((c.lost_events, c.gaps, c.drain_errors), (0, 0, 0), "{c:?}");
    assert!(c.drains >= 3, "{c:?}");
    assert_eq!(c.events_applied, 4, "{c:?}");
    assert_eq!(ingest.metrics().worker(WorkerId(1)).and_then(|w| w.last_seq), Some(3));
}

#[test]
fn an_overflowed_buffer_clears_the_worker_and_counts_the_loss() {
    let (svc, ingest, engine) = drained_worker(quick());
    engine.answer(answer(&[created(0), stored(1, &[0, 1], None, None)]));
    wait_until("two blocks held", || overlap(&svc, 1, 2) == 2);
    // Events 2..=6 were discarded by the engine (one of them may have
    // evicted block 1): the worker's blocks are no longer trusted.
    engine.answer(answer(&[stored(7, &[5], None, None)]));
    wait_until("the loss counted", || ingest.metrics().snapshot().lost_events == 5);
    engine.wait_drained();
    assert_eq!(overlap(&svc, 1, 2), 0);
    assert_eq!(cached_blocks(&svc, 1), 1, "only the block stored after the loss");
    assert_eq!(ingest.metrics().snapshot().gaps, 1);
}

#[test]
fn a_restarted_engine_is_cleared_and_ranks_count_apart() {
    let (svc, ingest, engine) = drained_worker(quick());
    // Two attention-DP ranks, each counting from 0.
    engine.answer(answer(&[stored(0, &[0], None, Some(0)), stored(0, &[3], None, Some(1))]));
    engine.answer(answer(&[stored(1, &[1], Some(0), Some(0)), stored(1, &[4], Some(3), Some(1))]));
    wait_until("both ranks' blocks held", || cached_blocks(&svc, 1) == 4);
    assert_eq!(ingest.metrics().snapshot().lost_events, 0);
    // The engine restarted without a `created` event seen (drained by
    // someone else): its ids went back.
    engine.answer(answer(&[stored(0, &[0], None, Some(0))]));
    wait_until("the restart counted", || ingest.metrics().snapshot().engine_restarts == 1);
    engine.wait_drained();
    assert_eq!(cached_blocks(&svc, 1), 1);
}

#[test]
fn failing_polls_back_off_and_recover() {
    let (svc, ingest, engine) = drained_worker(IngestConfig {
        drain_interval: Duration::from_millis(5),
        drain_backoff_max: Duration::from_millis(400),
        ..quick()
    });
    for _ in 0..4 {
        engine.answer(Answer::Status(503));
    }
    engine.answer(Answer::Json("{not json".into()));
    engine.answer(answer(&[created(0), stored(1, &[0], None, None)]));
    wait_until("the block held after the failures", || overlap(&svc, 1, 1) == 1);
    let c = ingest.metrics().snapshot();
    // Four error statuses and a body that is not a JSON list; the waits
    // between them (20 to 320 ms) are `backoff`'s, unit-tested.
    assert_eq!(c.drain_errors, 5, "{c:?}");
    assert_eq!(c.drains, 1 + (engine.polls() - 6), "{c:?}");
    ingest.remove(WorkerId(1)).expect("removed");
    wait_until("the worker's gauges gone", || ingest.metrics().worker(WorkerId(1)).is_none());
    let polls = engine.polls();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(engine.polls(), polls, "no poll after removal");
}

#[test]
fn an_unreachable_engine_and_a_bad_url_are_counted_not_fatal() {
    let svc = service(&[1, 2]);
    let ingest = spawn(&svc, quick());
    // Nothing listens there (a port just released).
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port");
    ingest.add(Publisher::trtllm_drain(WorkerId(1), port)).expect("added");
    ingest.add(Publisher { endpoint: "http://".into(), ..Publisher::trtllm_drain(WorkerId(2), port) }).expect("added");
    wait_until("failed polls counted", || ingest.metrics().snapshot().drain_errors >= 2);
    wait_until("the bad URL counted", || ingest.metrics().snapshot().socket_errors == 1);
    assert!(ingest.metrics().worker(WorkerId(2)).is_none());
    ingest.shutdown().expect("clean shutdown");
}
