//! kvpick-load's tests: flags, the ghz data file, the per-stream checks
//! (against kvpick's real server and against a deliberately broken one),
//! the report's shape. Servers listen on 127.0.0.1, port 0; runs are a
//! few dozen streams; nothing asserts on timing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use futures_util::Stream;
use kvpick_proto::core::{HeaderValue, HeaderValueOption};
use kvpick_proto::ext_proc::external_processor_server::{ExternalProcessor, ExternalProcessorServer};
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::processing_response::Response;
use kvpick_proto::ext_proc::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpBody, ProcessingRequest,
    ProcessingResponse, StreamedBodyResponse, body_mutation,
};
use kvpick_proto::protobuf::{Kind, Struct, Value};
use prost::Message as _;

use crate::args::{ArgsError, Options, SpawnKind};
use crate::script::Script;
use crate::spawn::Spawned;
use crate::{data, driver, frames, load, prompts, report};

fn options(args: &[&str]) -> Options {
    match Options::parse(args.iter().map(|s| s.to_string())) {
        Ok(options) => options,
        Err(e) => panic!("{args:?}: {e:?}"),
    }
}

fn ghz_data_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ghz/data.json")
}

fn kinds(messages: &[ProcessingRequest]) -> Vec<&'static str> {
    messages
        .iter()
        .map(|m| match &m.request {
            Some(Request::RequestHeaders(_)) => "request_headers",
            Some(Request::RequestBody(_)) => "request_body",
            Some(Request::RequestTrailers(_)) => "request_trailers",
            Some(Request::ResponseHeaders(_)) => "response_headers",
            Some(Request::ResponseBody(_)) => "response_body",
            Some(Request::ResponseTrailers(_)) => "response_trailers",
            None => "none",
        })
        .collect()
}

#[test]
fn flags_and_durations() {
    let o = options(&["--spawn", "kv", "-c", "8", "--connections=2", "-z", "1m30s", "--rps", "250.5"]);
    assert_eq!(o.spawn, Some(SpawnKind::Kv));
    assert_eq!((o.concurrency(), o.connections), (8, 2));
    assert_eq!(o.duration, Some(Duration::from_secs(90)));
    assert_eq!(o.rps, Some(250.5));
    assert_eq!(o.total(), None);
    assert_eq!(options(&["--addr", "127.0.0.1:9002"]).total(), Some(crate::args::DEFAULT_TOTAL));
    assert_eq!(options(&["--spawn", "null", "--rps", "10"]).concurrency(), crate::args::OPEN_LOOP_CONCURRENCY);
    assert_eq!(crate::args::duration("t", "250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(crate::args::duration("t", "1.5s"), Ok(Duration::from_millis(1500)));
    let refused =
        |args: &[&str]| matches!(Options::parse(args.iter().map(|s| s.to_string())), Err(ArgsError::Invalid(_)));
    assert!(refused(&[]), "a server is required");
    assert!(refused(&["--addr", "x:1", "--spawn", "null"]));
    assert!(refused(&["--spawn", "null", "-z", "10"]), "a duration needs a unit");
    assert!(refused(&["--spawn", "null", "--prompt-tokens", "100", "--system-tokens", "100"]));
    assert!(refused(&["--spawn", "maybe"]));
}

#[test]
fn the_ghz_data_file_is_one_gateway_stream() {
    let script = match data::read(&ghz_data_file()) {
        Ok(script) => script,
        Err(e) => panic!("perf/ghz/data.json: {e}"),
    };
    let request = kinds(&script.request);
    assert_eq!(request[0], "request_headers");
    assert!(request[1..].iter().all(|k| *k == "request_body") && request.len() >= 3, "{request:?}");
    let response = kinds(&script.response);
    assert_eq!(response[0], "response_headers");
    assert!(response[1..].iter().all(|k| *k == "response_body") && response.len() >= 3, "{response:?}");
    assert_eq!(script.modes(), (true, true), "full duplex both ways, as GAIE gateways run");

    let expect = script.expect_request();
    assert!(expect.body_ends);
    let body: serde_json::Value = serde_json::from_slice(&expect.body).unwrap_or_default();
    assert_eq!(body["model"], prompts::MODEL);
    assert!(body["messages"].as_array().is_some_and(|m| m.len() >= 3 && m[0]["role"] == "system"));
    assert!(script.expect_response().body_ends);

    // Headers as a gateway sends them; the request id takes the number.
    let messages = script.request_messages(42);
    let Some(Request::RequestHeaders(headers)) = &messages[0].request else { panic!("no headers") };
    let value = |key: &str| {
        headers.headers.as_ref().and_then(|m| m.headers.iter().find(|h| h.key == key)).map(|h| {
            if h.raw_value.is_empty() { h.value.clone() } else { String::from_utf8_lossy(&h.raw_value).into_owned() }
        })
    };
    assert_eq!(value(":method").as_deref(), Some("POST"));
    assert_eq!(value(":path").as_deref(), Some("/v1/chat/completions"));
    assert_eq!(value("content-type").as_deref(), Some("application/json"));
    assert_eq!(value("x-request-id").as_deref(), Some("kvpick-load-42"));
    assert_eq!(value("content-length"), Some(expect.body.len().to_string()));
}

#[test]
fn data_files_round_trip_and_bad_ones_are_refused() {
    let o = options(&["--spawn", "null", "--chunk-bytes", "1000"]);
    let script = prompts::script(&o, 3);
    let back = data::script(&data::to_json(&script));
    // Not assert_eq!: a mismatch would print kilobytes of body bytes.
    assert!(back.as_ref().ok() == Some(&script), "the data file does not round-trip");

    let parse = |text: &str| data::script(&serde_json::from_str(text).unwrap_or_default());
    // lowerCamelCase names and URL-safe, unpadded base64 are protobuf JSON too.
    let camel = parse(
        r#"[{"requestHeaders":{"headers":{"headers":[{"key":":path","rawValue":"L3YxL2NoYXQ"}]}},
            "protocolConfig":{"requestBodyMode":4,"responseBodyMode":"FULL_DUPLEX_STREAMED"}},
           {"requestBody":{"body":"e30","endOfStream":true}}]"#,
    );
    let camel = camel.ok();
    assert_eq!(camel.as_ref().map(|s| kinds(&s.request)), Some(vec!["request_headers", "request_body"]));
    assert_eq!(camel.map(|s| s.expect_request().body), Some(b"{}".to_vec()));
    assert!(parse(r#"[{"request_headers":{"headerz":{}}}]"#).is_err(), "unknown field");
    assert!(parse(r#"[{"request_body":{"body":"not base64!"}}]"#).is_err());
    assert!(parse(r#"{"request_body":{}}"#).is_err(), "a stream is an array");
    assert!(parse(r#"[{"request_body":{}, "request_headers":{}}]"#).is_err(), "one kind per message");
    assert!(parse(r#"[{"response_headers":{}},{"request_body":{}}]"#).is_err(), "request after response");
}

#[test]
fn frames_decode_back_to_the_stream() {
    let script = data::read(&ghz_data_file()).unwrap_or_else(|e| panic!("{e}"));
    let bytes = frames::frames(&script, 0);
    let mut decoded = Vec::new();
    let mut rest = &bytes[..];
    while rest.len() >= 5 {
        assert_eq!(rest[0], 0, "uncompressed");
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        decoded.push(ProcessingRequest::decode(&rest[5..5 + len]).unwrap_or_default());
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty());
    let mut sent = script.request_messages(0);
    sent.extend(script.response.clone());
    assert!(decoded == sent, "the frames are not the stream's messages");
}

fn run_against(options: &Options, addr: SocketAddr, scripts: Vec<Script>) -> (report::Tally, report::RunInfo) {
    match load(options, &addr.to_string(), scripts, None) {
        Ok(result) => result,
        Err(e) => panic!("load: {e}"),
    }
}

fn assert_all_picked(tally: &report::Tally, expected: u64) {
    assert_eq!(tally.count, expected);
    assert_eq!(tally.statuses.values().sum::<u64>(), tally.count, "every stream has one status");
    assert_eq!(tally.statuses.get(driver::OK), Some(&expected), "{:?} {:?}", tally.statuses, tally.errors);
    assert!(tally.errors.is_empty(), "{:?}", tally.errors);
    assert_eq!(tally.destinations.values().sum::<u64>(), expected, "every stream got a destination");
    assert_eq!(tally.pick.len(), expected);
    assert_eq!(tally.stream.len(), expected);
}

#[test]
fn null_picker_over_two_connections() {
    let o = options(&["--spawn", "null", "-n", "60", "-c", "6", "--connections", "2", "--chunk-bytes", "3000"]);
    let server = Spawned::start(SpawnKind::Null, &o).unwrap_or_else(|e| panic!("{e}"));
    let (tally, info) = run_against(&o, server.addr, prompts::scripts(&o));
    assert_all_picked(&tally, 60);
    assert_eq!(info.connections_opened, 2, "one TCP connection per channel");
    assert!(server.counts().starts_with("60 × 200"), "{}", server.counts());
    // The null picker always answers its first endpoint.
    assert_eq!(tally.destinations.keys().collect::<Vec<_>>(), vec![&crate::spawn::endpoint(0).to_string()]);

    let json = report::json(&tally, &info);
    for field in [
        "count",
        "total",
        "average",
        "fastest",
        "slowest",
        "rps",
        "histogram",
        "latencyDistribution",
        "statusCodeDistribution",
        "errorDistribution",
        "options",
        "date",
        "endReason",
    ] {
        assert!(json.get(field).is_some(), "ghz's {field} is missing");
    }
    assert_eq!(json["count"], 60);
    assert_eq!(json["statusCodeDistribution"]["OK"], 60);
    assert_eq!(json["options"]["connections"], 2);
    let percentiles: Vec<f64> = json["latencyDistribution"]
        .as_array()
        .map_or(vec![], |l| l.iter().filter_map(|p| p["percentage"].as_f64()).collect());
    assert_eq!(percentiles, report::PERCENTILES.to_vec());
    let histogram_total: u64 =
        json["histogram"].as_array().map_or(0, |h| h.iter().filter_map(|b| b["count"].as_u64()).sum());
    assert_eq!(histogram_total, 60);
    let text = report::text(&tally, &info);
    assert!(text.contains("Requests/sec:") && text.contains("[OK]\t60 responses"), "{text}");
    server.shutdown();
}

#[test]
fn kv_picker_with_the_ghz_data_file_buffered_and_open_loop() {
    let o = options(&["--spawn", "kv", "-n", "40", "-c", "4"]);
    let server = Spawned::start(SpawnKind::Kv, &o).unwrap_or_else(|e| panic!("{e}"));
    let workers: Vec<String> = (0..o.workers as u64).map(|w| crate::spawn::endpoint(w).to_string()).collect();

    let (tally, _) = run_against(&o, server.addr, prompts::scripts(&o));
    assert_all_picked(&tally, 40);
    assert!(tally.destinations.keys().all(|d| workers.contains(d)), "{:?}", tally.destinations);

    let data = data::read(&ghz_data_file()).unwrap_or_else(|e| panic!("{e}"));
    let (tally, _) = run_against(&o, server.addr, vec![data.clone()]);
    assert_all_picked(&tally, 40);
    let (tally, _) = run_against(&options(&["--spawn", "kv", "-n", "10", "--pipeline"]), server.addr, vec![data]);
    assert_all_picked(&tally, 10);

    let buffered = options(&["--spawn", "kv", "-n", "20", "--mode", "buffered", "--response", "json"]);
    let (tally, _) = run_against(&buffered, server.addr, prompts::scripts(&buffered));
    assert_all_picked(&tally, 20);

    let open = options(&["--spawn", "kv", "-n", "30", "--rps", "300"]);
    let (tally, info) = run_against(&open, server.addr, prompts::scripts(&open));
    assert_all_picked(&tally, 30);
    assert_eq!(tally.lag.len(), 30, "every scheduled stream's lag is measured");
    assert_eq!(info.end_reason, "normal");
    server.shutdown();
}

#[test]
fn immediate_responses_are_statuses_not_errors() {
    let o = options(&["--spawn", "null", "-n", "12", "-c", "3"]);
    let server = Spawned::start(SpawnKind::Null, &o).unwrap_or_else(|e| panic!("{e}"));
    let mut script = prompts::script(&o, 0);
    for message in &mut script.request {
        if let Some(Request::RequestBody(body)) = &mut message.request {
            body.body = b"{not json".to_vec();
        }
    }
    let script = Script::new(script.request, script.response);
    let (tally, _) = run_against(&o, server.addr, vec![script]);
    assert_eq!(tally.count, 12);
    assert_eq!(tally.statuses.get("ImmediateResponse 400"), Some(&12), "{:?}", tally.statuses);
    assert!(tally.errors.is_empty(), "{:?}", tally.errors);
    assert!(tally.pick.is_empty(), "no pick, no pick latency");
    server.shutdown();
}

/// How the fake server gets its answers wrong.
#[derive(Clone, Copy)]
enum Flaw {
    NoDestination,
    WrongEcho,
    MetadataDiffers,
}

struct Flawed(Flaw);

fn common(mutation: Option<HeaderMutation>) -> Option<CommonResponse> {
    Some(CommonResponse { header_mutation: mutation, ..Default::default() })
}

fn echo(body: Vec<u8>, end_of_stream: bool) -> Option<CommonResponse> {
    let streamed = StreamedBodyResponse { body, end_of_stream, ..Default::default() };
    Some(CommonResponse {
        body_mutation: Some(BodyMutation { mutation: Some(body_mutation::Mutation::StreamedResponse(streamed)) }),
        ..Default::default()
    })
}

fn lb_metadata(destination: &str) -> Struct {
    let lb = Struct {
        fields: [(driver::DESTINATION.to_string(), Value { kind: Some(Kind::StringValue(destination.into())) })].into(),
    };
    Struct { fields: [("envoy.lb".to_string(), Value { kind: Some(Kind::StructValue(lb)) })].into() }
}

impl Flawed {
    /// Answers each message at once (the body echo before the headers'
    /// answer would be wrong for a real EPP, but the flaw is what is tested).
    fn answer(&self, message: ProcessingRequest, body: &mut Vec<u8>) -> Vec<ProcessingResponse> {
        let reply = |response: Response, dynamic_metadata: Option<Struct>| ProcessingResponse {
            response: Some(response),
            dynamic_metadata,
            ..Default::default()
        };
        match message.request {
            Some(Request::RequestHeaders(_)) => vec![],
            Some(Request::RequestBody(HttpBody { body: chunk, end_of_stream, .. })) => {
                body.extend(chunk);
                if !end_of_stream {
                    return vec![];
                }
                let set = HeaderValueOption {
                    header: Some(HeaderValue {
                        key: driver::DESTINATION.into(),
                        raw_value: b"10.0.0.1:8000".to_vec(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let (mutation, metadata) = match self.0 {
                    Flaw::NoDestination => (None, None),
                    Flaw::MetadataDiffers => (
                        Some(HeaderMutation { set_headers: vec![set], remove_headers: vec![] }),
                        Some(lb_metadata("10.0.0.2:8000")),
                    ),
                    Flaw::WrongEcho => (
                        Some(HeaderMutation { set_headers: vec![set], remove_headers: vec![] }),
                        Some(lb_metadata("10.0.0.1:8000")),
                    ),
                };
                let mut echoed = std::mem::take(body);
                if matches!(self.0, Flaw::WrongEcho) {
                    echoed.reverse();
                }
                vec![
                    reply(Response::RequestHeaders(HeadersResponse { response: common(mutation) }), metadata),
                    reply(Response::RequestBody(BodyResponse { response: echo(echoed, true) }), None),
                ]
            }
            Some(Request::ResponseHeaders(_)) => {
                vec![reply(Response::ResponseHeaders(HeadersResponse { response: common(None) }), None)]
            }
            Some(Request::ResponseBody(b)) => {
                vec![reply(Response::ResponseBody(BodyResponse { response: echo(b.body, b.end_of_stream) }), None)]
            }
            _ => vec![],
        }
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Flawed {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: tonic::Request<tonic::Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Answers>, tonic::Status> {
        let flaw = Flawed(self.0);
        let inbound = request.into_inner();
        let answers = futures_util::stream::unfold(
            (inbound, Vec::<u8>::new(), std::collections::VecDeque::new()),
            move |(mut inbound, mut body, mut queue)| {
                let flaw = Flawed(flaw.0);
                async move {
                    loop {
                        if let Some(answer) = queue.pop_front() {
                            return Some((Ok(answer), (inbound, body, queue)));
                        }
                        match inbound.message().await {
                            Ok(Some(message)) => queue.extend(flaw.answer(message, &mut body)),
                            _ => return None,
                        }
                    }
                }
            },
        );
        Ok(tonic::Response::new(Box::pin(answers)))
    }
}

#[test]
fn answers_a_gateway_cannot_use_are_errors() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
    let runtime = runtime.unwrap_or_else(|e| panic!("runtime: {e}"));
    for (flaw, error) in [
        (Flaw::NoDestination, "no destination"),
        (Flaw::WrongEcho, "request body echo mismatch"),
        (Flaw::MetadataDiffers, "destination header and envoy.lb metadata differ"),
    ] {
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"));
        let listener = listener.unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(ExternalProcessorServer::new(Flawed(flaw)))
                .serve_with_incoming(incoming),
        );
        let o = options(&["--addr", &addr.to_string(), "-n", "8", "-c", "2"]);
        let (tally, _) = run_against(&o, addr, prompts::scripts(&o));
        assert_eq!(tally.count, 8);
        assert_eq!(tally.errors.get(error), Some(&8), "{:?}", tally.errors);
        assert_eq!(tally.statuses.get(driver::INVALID), Some(&8), "{:?}", tally.statuses);
        assert!(tally.pick.is_empty());
        server.abort();
    }
}
