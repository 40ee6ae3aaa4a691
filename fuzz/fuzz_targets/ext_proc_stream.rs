//! Random sequences of ext_proc messages, in any order, against one stream's
//! state machine: request headers, body chunks, trailers, the response path,
//! flow-control messages, observability mode, protocol configurations
//! (valid or not) and a picker that books, does not book or refuses.
//! Dropping the stream at the end is the gateway cancelling at that point.
//!
//! What must hold: no panic; a booking is freed exactly once, whatever the
//! order, and only after the stream is gone or the response ended; nothing
//! is answered after an `ImmediateResponse` (in the same batch or later) or
//! to a message sent in observability mode; a message is answered on its own
//! path only (request messages with request answers, response messages with
//! response answers), or refused; `served_by` is told at most once.
//!
//! The input is a small byte format (below) rather than `Arbitrary`, so the
//! seed corpus can spell real exchanges (`fuzz/seeds/ext_proc_stream.py`).
//! Byte 0: the picker (0-1 book, 2 no booking, 3 refuse); byte 1: bit 7
//! set sends a `protocol_config` on the first message with request mode
//! `b & 7` and response mode `(b >> 3) & 7` (Envoy's `BodySendMode`: kvpick
//! takes request modes 2 and 4 only and ends the stream for the others; 5-7
//! are not modes at all); bit 6 lowers the body limit to 256 bytes. Then
//! messages, a tag byte (`tag % 8`) and a flags byte each, see `next_message`.
#![no_main]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvpick_ext_proc::fuzzing::StreamUnderTest;
use kvpick_ext_proc::headers::{DESTINATION_SERVED, DESTINATION_SUBSET, PREFILLER, SESSION_TOKEN};
use kvpick_ext_proc::metadata::{LB_NAMESPACE, SUBSET_NAMESPACE};
use kvpick_ext_proc::{Booking, ExtProcConfig, Pick, PickInput, Picks, RequestError};
use kvpick_proto::core::{HeaderMap, HeaderValue, Metadata};
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::processing_response::Response;
use kvpick_proto::ext_proc::{HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProtocolConfiguration};
use kvpick_proto::protobuf::{Kind, Struct, Value};
use libfuzzer_sys::fuzz_target;

const PICKED: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)), 8000);
const OTHER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)), 8000);

#[derive(Default)]
struct Ledger {
    booked: AtomicUsize,
    freed: AtomicUsize,
    served_by: AtomicUsize,
}

struct Counted(Arc<Ledger>);

impl Booking for Counted {
    fn prefill_complete(&mut self, _streamed: bool) {}
    fn response_finished(&mut self, _output_tokens: u64) {}
    fn response_progress(&mut self) {}
    fn served_by(&mut self, _endpoint: SocketAddr) {
        self.0.served_by.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.freed.fetch_add(1, Ordering::SeqCst);
    }
}

struct Picker {
    plan: u8,
    ledger: Arc<Ledger>,
}

impl Picks for Picker {
    type Booking = Counted;

    fn pick(&self, _input: PickInput) -> impl Future<Output = Result<Pick<Counted>, RequestError>> + Send {
        let reservation = match self.plan % 4 {
            0 | 1 => {
                self.ledger.booked.fetch_add(1, Ordering::SeqCst);
                Some(Counted(self.ledger.clone()))
            }
            _ => None,
        };
        let answer = match self.plan % 4 {
            3 => Err(RequestError::EmptySubset),
            _ => Ok(Pick { endpoint: PICKED, fallbacks: Vec::new(), prefill: None, reservation }),
        };
        std::future::ready(answer)
    }
}

/// Reads the input's bytes front to back; past the end, zeros.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }

    fn chunk(&mut self) -> Vec<u8> {
        let len = u16::from_le_bytes([self.byte(), self.byte()]) as usize;
        let (chunk, rest) = self.0.split_at(len.min(self.0.len()));
        self.0 = rest;
        chunk.to_vec()
    }
}

const PATHS: [&[u8]; 8] = [
    b"/v1/chat/completions",
    b"/v1/completions",
    b"/v1/models",
    b"/health",
    b"/v1/embeddings",
    b"/v1/chat/completions?x=1",
    b"",
    // Not UTF-8: Envoy passes raw header bytes through.
    b"/\x00\xff",
];
const STATUSES: [&str; 4] = ["200", "500", "429", "x"];

fn header_map(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let headers = pairs
        .iter()
        .map(|(k, v)| HeaderValue { key: (*k).into(), value: String::new(), raw_value: v.to_vec() })
        .collect();
    HeaderMap { headers }
}

fn string_value(s: &str) -> Value {
    Value { kind: Some(Kind::StringValue(s.into())) }
}

fn metadata(namespace: &str, key: &str, value: &str) -> Metadata {
    let fields = Struct { fields: [(key.to_owned(), string_value(value))].into_iter().collect() };
    Metadata { filter_metadata: [(namespace.to_owned(), fields)].into_iter().collect(), ..Default::default() }
}

/// One gateway message, or `None` for the end of the input, with its path
/// and whether it ends the response. Each tag's next byte is flags: bit 0
/// `end_of_stream`, bit 1 observability mode.
fn next_message(input: &mut Bytes<'_>) -> Option<(ProcessingRequest, Side, bool)> {
    if input.0.is_empty() {
        return None;
    }
    let tag = input.byte() % 8;
    let flags = input.byte();
    let end_of_stream = flags & 1 != 0;
    let mut message = ProcessingRequest { observability_mode: flags & 2 != 0, ..Default::default() };
    let side = match tag {
        // Request headers: bits 3-5 the path, bit 6 client headers kvpick
        // must not trust, bit 7 a subset hint (bit 2: one naming no pod).
        0 => {
            let path = PATHS[usize::from(flags >> 3) & 7];
            let mut pairs: Vec<(&str, &[u8])> =
                vec![(":method", b"POST"), (":path", path), ("content-type", b"application/json")];
            if flags & 0x40 != 0 {
                pairs.extend([
                    (PREFILLER, &b"evil:1"[..]),
                    (SESSION_TOKEN, b"s\xff"),
                    (DESTINATION_SUBSET, b"1.2.3.4:5"),
                ]);
            }
            if flags & 0x80 != 0 {
                let subset = if flags & 4 != 0 { "192.0.2.9:1" } else { "10.0.0.1:8000,10.0.0.2:8000" };
                message.metadata_context = Some(metadata(SUBSET_NAMESPACE, DESTINATION_SUBSET, subset));
            }
            message.request = Some(Request::RequestHeaders(HttpHeaders {
                headers: Some(header_map(&pairs)),
                end_of_stream,
                ..Default::default()
            }));
            Side::Request
        }
        1 | 4 => {
            let body = HttpBody { body: input.chunk(), end_of_stream, ..Default::default() };
            if tag == 1 {
                message.request = Some(Request::RequestBody(body));
                Side::Request
            } else {
                message.request = Some(Request::ResponseBody(body));
                Side::Response
            }
        }
        2 => {
            message.request = Some(Request::RequestTrailers(HttpTrailers::default()));
            Side::Request
        }
        // Response headers: bits 2-3 the status, bit 4 an event stream,
        // bit 5 the served endpoint in metadata (bit 6: not the pick).
        3 => {
            let status = STATUSES[usize::from(flags >> 2) & 3].as_bytes();
            let content_type: &[u8] = if flags & 0x10 != 0 { b"text/event-stream" } else { b"application/json" };
            if flags & 0x20 != 0 {
                let served = if flags & 0x40 != 0 { OTHER } else { PICKED };
                message.metadata_context = Some(metadata(LB_NAMESPACE, DESTINATION_SERVED, &served.to_string()));
            }
            message.request = Some(Request::ResponseHeaders(HttpHeaders {
                headers: Some(header_map(&[(":status", status), ("content-type", content_type)])),
                end_of_stream,
                ..Default::default()
            }));
            Side::Response
        }
        5 => {
            message.request = Some(Request::ResponseTrailers(HttpTrailers::default()));
            Side::Response
        }
        // Flow control only: no request at all.
        _ => Side::Neither,
    };
    let ends_response = side == Side::Response && (end_of_stream || tag == 5);
    Some((message, side, ends_response))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Request,
    Response,
    Neither,
}

fn side_of(response: &Option<Response>) -> Side {
    match response {
        Some(Response::RequestHeaders(_) | Response::RequestBody(_) | Response::RequestTrailers(_)) => Side::Request,
        Some(Response::ResponseHeaders(_) | Response::ResponseBody(_) | Response::ResponseTrailers(_)) => {
            Side::Response
        }
        _ => Side::Neither,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Bytes(data);
    let ledger = Arc::new(Ledger::default());
    let plan = input.byte();
    let modes = input.byte();
    let mut config = ExtProcConfig::default();
    if modes & 0x40 != 0 {
        config.max_body_bytes = 256;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a current-thread runtime");
    let mut stream = StreamUnderTest::new(config, Picker { plan, ledger: ledger.clone() });
    let mut first = true;
    let mut refused = false;
    let mut response_ended = false;
    while let Some((mut message, side, ends_response)) = next_message(&mut input) {
        if std::mem::take(&mut first) && modes & 0x80 != 0 {
            message.protocol_config = Some(ProtocolConfiguration {
                request_body_mode: i32::from(modes & 7),
                response_body_mode: i32::from((modes >> 3) & 7),
                send_body_without_waiting_for_header_response: true,
            });
        }
        let observed = message.observability_mode;
        let Ok(answers) = runtime.block_on(stream.send(message)) else {
            // The gRPC stream ends: the server drops the stream here.
            break;
        };
        assert!(!(observed && !answers.is_empty()), "answered a message sent in observability mode");
        assert!(!(refused && !answers.is_empty()), "answered after an ImmediateResponse");
        for answer in &answers {
            assert!(!refused, "answered after an ImmediateResponse");
            if matches!(answer.response, Some(Response::ImmediateResponse(_))) {
                refused = true;
            } else {
                assert!(side_of(&answer.response) == side, "a message answered on the other path");
            }
        }
        response_ended |= ends_response;
        let (booked, freed) = (ledger.booked.load(Ordering::SeqCst), ledger.freed.load(Ordering::SeqCst));
        assert!(booked <= 1, "one stream picked {booked} times");
        assert!(freed <= booked, "freed {freed} bookings of {booked}");
        assert!(freed == 0 || response_ended, "a booking freed while its stream and response went on");
    }
    assert!(ledger.served_by.load(Ordering::SeqCst) <= 1, "served_by told more than once");
    drop(stream);
    assert_eq!(
        ledger.freed.load(Ordering::SeqCst),
        ledger.booked.load(Ordering::SeqCst),
        "a booking outlived its stream, or was freed twice"
    );
});
