//! Shared by the ext_proc scenarios: a real server on 127.0.0.1 (port 0)
//! over a 2-shard `ShardedService` on plain threads, a real tonic ext_proc
//! client, message builders, answer readers, and a scriptable tokenizer.

pub mod h2_client;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvpick_core::{HashSeed, KvEvent, LoadSnapshot, Prompt, RouterConfig, WorkerId, WorkerSpec};
use kvpick_ext_proc::headers::DESTINATION;
use kvpick_ext_proc::metadata::{LB_NAMESPACE, SUBSET_NAMESPACE};
use kvpick_ext_proc::{ExtProcConfig, ExtProcMetrics, ExtProcServer, Tracing};
use kvpick_grpc::{Health, ServerHandle};
use kvpick_proto::core::Metadata;
use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use kvpick_proto::ext_proc::mode::BodySendMode;
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::processing_response::Response;
use kvpick_proto::ext_proc::{
    BodyMutation, CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration, body_mutation,
};
use kvpick_proto::protobuf::{Kind, ListValue, Struct, Value};
use kvpick_router::tokenizer::{TokenizeError, TokenizeFuture, TokenizeRequest, Tokenizer};
use kvpick_router::{DecodeOnly, DisaggConfig, KvPicker, NullPicker, Picker, PickerConfig};
use kvpick_runtime::{Clock, Producer, RuntimeChoice, RuntimeConfig, RuntimeKind, ShardedService, ThreadProducers};
use kvpick_test_support::WordTokenizer;
use kvpick_test_support::gateway::header_map;
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::Channel;
use tonic::{Status, Streaming};

/// Longest any test waits for one thing.
pub const WAIT: Duration = Duration::from_secs(10);
/// Tokens per KV block in these tests (small, so short prompts fill blocks).
pub const BLOCK_SIZE: u32 = 4;

pub fn endpoint(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 10 + i as u8], 8000))
}

/// Prefill worker `i`'s endpoint (disaggregated harnesses).
pub fn prefill_endpoint(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 100 + i as u8], 8000))
}

/// Prefill worker `i`'s id.
pub fn prefill_worker(i: usize) -> WorkerId {
    WorkerId(1_000 + i as u64)
}

/// A tokenizer that splits words ([`WordTokenizer`]), can be held shut,
/// and can be told to fail.
#[derive(Default)]
pub struct TestTokenizer {
    /// `Some`: each call waits for a permit.
    gate: Option<Arc<Semaphore>>,
    fail: Mutex<Option<TokenizeError>>,
    pub calls: AtomicUsize,
}

impl TestTokenizer {
    pub fn gated() -> (Self, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        (TestTokenizer { gate: Some(gate.clone()), ..Default::default() }, gate)
    }

    pub fn fail_with(&self, error: Option<TokenizeError>) {
        *self.fail.lock().unwrap_or_else(|e| e.into_inner()) = error;
    }
}

impl Tokenizer for TestTokenizer {
    fn tokenize(&self, request: TokenizeRequest) -> TokenizeFuture<'_> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = &self.gate {
                gate.acquire().await.map_err(|_| TokenizeError::Unreachable("gate closed".into()))?.forget();
            }
            if let Some(error) = self.fail.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                return Err(error);
            }
            WordTokenizer::tokens(&request.body)
        })
    }
}

pub struct Options {
    pub config: ExtProcConfig,
    pub picker: PickerConfig,
    pub workers: usize,
    /// Models the workers serve (`None`: any).
    pub model: Option<String>,
    pub null_picker: bool,
    pub tokenizer: TestTokenizer,
    pub router: RouterConfig,
    /// Every worker's `max_num_batched_tokens` (needed to queue).
    pub max_num_batched_tokens: Option<u64>,
    /// Requests traced with this (`None`: no tracing).
    pub tracing: Option<Tracing>,
    /// Disaggregation: a prefill selector with this many workers (and
    /// `router`'s policy but `prefill_queue_threshold`), and the decider.
    pub disagg: Option<(usize, DisaggConfig)>,
    pub prefill_queue_threshold: Option<f64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: ExtProcConfig { listen: SocketAddr::from(([127, 0, 0, 1], 0)), ..ExtProcConfig::default() },
            picker: PickerConfig::default(),
            workers: 3,
            model: None,
            null_picker: false,
            tokenizer: TestTokenizer::default(),
            router: RouterConfig::default(),
            max_num_batched_tokens: None,
            tracing: None,
            disagg: None,
            prefill_queue_threshold: None,
        }
    }
}

impl Options {
    /// One worker that queues requests as soon as any prefill is booked on
    /// it (the queue tests' set-up).
    pub fn queue_at_any_prefill() -> Options {
        let router = RouterConfig { queue_threshold: Some(0.0), ..RouterConfig::default() };
        Options { workers: 1, router, max_num_batched_tokens: Some(1000), ..Options::default() }
    }
}

pub struct Harness {
    pub service: Arc<ShardedService>,
    pub producers: ThreadProducers,
    events: Mutex<Producer>,
    pub clock: Clock,
    pub metrics: Arc<ExtProcMetrics>,
    pub tokenizer: Arc<TestTokenizer>,
    pub health: Health,
    /// kvpick's picker (none with the null picker).
    pub kv: Option<KvPicker>,
    server: Option<ServerHandle>,
    pub addr: SocketAddr,
    pub model: Option<String>,
    max_num_batched_tokens: Option<u64>,
    /// The prefill selector, when disaggregated.
    pub prefill: Option<ThreadProducers>,
    /// The decode workers that cannot run a request whole, for the picker.
    pub decode_only: Arc<DecodeOnly>,
}

impl Harness {
    pub async fn start(options: Options) -> Harness {
        let clock = Clock::system();
        // The default's inline shards; `KVPICK_TEST_SHARDS=threads|glommio`
        // runs the same tests on shard threads or glommio executors.
        let kind = match std::env::var("KVPICK_TEST_SHARDS").as_deref() {
            Ok("glommio") => RuntimeKind::Glommio,
            Ok("threads") => RuntimeKind::StdThreads,
            _ => RuntimeKind::Inline,
        };
        let runtime = RuntimeConfig {
            shards: 2,
            cpus: Vec::new(),
            choice: RuntimeChoice::Force(kind),
            ..RuntimeConfig::default()
        };
        let prefill_service = options.disagg.as_ref().map(|_| {
            let router = RouterConfig { queue_threshold: options.prefill_queue_threshold, ..options.router.clone() };
            let prefill = ShardedService::start(router, BLOCK_SIZE, runtime.clone(), clock.clone());
            Arc::new(prefill.expect("prefill shards start"))
        });
        let prefill = prefill_service.clone().map(ThreadProducers::new);
        let service =
            Arc::new(ShardedService::start(options.router, BLOCK_SIZE, runtime, clock.clone()).expect("shards start"));
        let producers = ThreadProducers::new(service.clone());
        let events = Mutex::new(service.producer());
        let metrics = Arc::new(ExtProcMetrics::new());
        let tokenizer = Arc::new(options.tokenizer);
        let health = Health::start().await;
        let harness_tokenizer: Arc<dyn Tokenizer> = tokenizer.clone();
        let decode_only = Arc::new(DecodeOnly::default());
        let kv = (!options.null_picker).then(|| match (&prefill_service, &options.disagg) {
            (Some(prefill), Some((_, decider))) => KvPicker::disaggregated(
                (service.clone(), prefill.clone()),
                clock.clone(),
                harness_tokenizer,
                (&options.picker, decider.clone(), decode_only.clone()),
                metrics.clone(),
            ),
            _ => KvPicker::new(service.clone(), clock.clone(), harness_tokenizer, &options.picker, metrics.clone()),
        });
        let picker = match &kv {
            Some(kv) => Picker::Kv(kv.clone()),
            None => Picker::Null(NullPicker::new((0..options.workers).map(endpoint).collect::<Vec<_>>())),
        };
        let mut server = ExtProcServer::new(options.config, picker, metrics.clone()).with_health(&health);
        if let Some(tracing) = options.tracing {
            server = server.with_tracing(tracing);
        }
        let server = server.spawn().await.expect("ext_proc server starts");
        let addr = server.local_addr();
        assert!(addr.ip().is_loopback());
        let harness = Harness {
            service,
            producers,
            events,
            clock,
            metrics,
            tokenizer,
            health,
            kv,
            server: Some(server),
            addr,
            model: options.model,
            max_num_batched_tokens: options.max_num_batched_tokens,
            prefill,
            decode_only,
        };
        for i in 0..options.workers {
            harness.add_worker(i).await;
        }
        for i in 0..options.disagg.map_or(0, |(n, _)| n) {
            harness.add_prefill_worker(i).await;
        }
        harness
    }

    /// Adds prefill worker `i` to the prefill selector.
    pub async fn add_prefill_worker(&self, i: usize) {
        let prefill = self.prefill.as_ref().expect("a disaggregated harness");
        let mut spec = WorkerSpec::new(prefill_worker(i), prefill_endpoint(i), BLOCK_SIZE);
        spec.model = self.model.clone();
        spec.max_num_batched_tokens = self.max_num_batched_tokens;
        prefill.service().upsert_worker(prefill, spec, self.clock.now()).await.expect("prefill worker upserted");
    }

    /// Requests booked on the prefill workers.
    pub async fn prefill_requests_booked(&self) -> u32 {
        let prefill = self.prefill.as_ref().expect("a disaggregated harness");
        prefill.service().loads(prefill).await.iter().map(|l| l.requests).sum()
    }

    pub async fn add_worker(&self, i: usize) {
        self.add_worker_at(i as u64 + 1, endpoint(i)).await;
    }

    pub async fn add_worker_at(&self, id: u64, at: SocketAddr) {
        assert!(at.ip().is_loopback());
        let mut spec = WorkerSpec::new(WorkerId(id), at, BLOCK_SIZE);
        spec.model = self.model.clone();
        spec.max_num_batched_tokens = self.max_num_batched_tokens;
        self.service.upsert_worker(&self.producers, spec, self.clock.now()).await.expect("worker upserted");
    }

    pub fn certificate_pem(&self) -> Option<String> {
        self.server.as_ref().and_then(|s| s.certificate_pem().map(str::to_owned))
    }

    pub async fn client(&self) -> ExternalProcessorClient<Channel> {
        ExternalProcessorClient::connect(format!("http://{}", self.addr)).await.expect("client connects")
    }

    /// Stops the server and the shards; every stream must be closed by
    /// then (a test that leaks one would wait out the shutdown grace).
    pub async fn stop(mut self) {
        wait_for("every ext_proc stream closed", || async { self.metrics.snapshot().streams_open == 0 }).await;
        if let Some(server) = self.server.take() {
            server.shutdown().await.expect("server stops cleanly");
        }
        self.service.shutdown();
        if let Some(prefill) = &self.prefill {
            prefill.service().shutdown();
        }
    }

    pub async fn loads(&self) -> Vec<LoadSnapshot> {
        self.service.loads(&self.producers).await
    }

    pub async fn requests_booked(&self) -> u32 {
        self.loads().await.iter().map(|l| l.requests).sum()
    }

    /// Waits until no request is booked on any worker.
    pub async fn wait_all_freed(&self) {
        wait_for("every booking freed", || async { self.requests_booked().await == 0 }).await;
    }

    /// Makes worker `i` hold the KV blocks of `body`'s full token blocks,
    /// as if it had served it, and waits until the index shows them.
    pub async fn cache_on(&self, i: usize, body: &str) {
        let tokens = WordTokenizer::tokens(body.as_bytes()).expect("test body tokenizes");
        let blocks = tokens.len() / BLOCK_SIZE as usize;
        let token_ids = tokens[..blocks * BLOCK_SIZE as usize].to_vec();
        let base = (i as u64 + 1) << 32;
        let event = KvEvent::Stored {
            block_hashes: (0..blocks as u64).map(|b| base + b).collect(),
            parent: None,
            token_ids,
            block_size: BLOCK_SIZE,
            seed: HashSeed::default(),
        };
        {
            let mut producer = self.events.lock().unwrap_or_else(|e| e.into_inner());
            self.service.apply_kv_event(&mut producer, WorkerId(i as u64 + 1), event).expect("event applied");
        }
        let prompt = Prompt::from_tokens(&tokens, BLOCK_SIZE, HashSeed::default());
        wait_for("the cached prefix is indexed", || async {
            self.service
                .overlap_scores(&self.producers, &prompt)
                .await
                .iter()
                .any(|(w, depth)| *w == WorkerId(i as u64 + 1) && *depth as usize == blocks)
        })
        .await;
    }
}

/// Polls `condition` every 5 ms until it holds; panics after [`WAIT`].
pub async fn wait_for<F, Fut>(what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_within(what, WAIT, condition).await;
}

/// [`wait_for`] with a bound of its own (recoveries that take reconnect
/// backoffs).
pub async fn wait_within<F, Fut>(what: &str, within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ----- one ext_proc stream, as the gateway drives it -----

/// A bidi stream: messages go in through `send`, answers come out of
/// `recv`.
pub struct Call {
    tx: Option<mpsc::UnboundedSender<ProcessingRequest>>,
    rx: Streaming<ProcessingResponse>,
}

impl Call {
    pub async fn open(client: &mut ExternalProcessorClient<Channel>) -> Call {
        Call::open_with_metadata(client, &[]).await
    }

    /// Opens the stream with gRPC metadata on the call (a `traceparent`,
    /// as Envoy sends for its ext_proc call span).
    pub async fn open_with_metadata(
        client: &mut ExternalProcessorClient<Channel>,
        metadata: &[(&'static str, &str)],
    ) -> Call {
        let (tx, rx) = mpsc::unbounded_channel();
        let outbound = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let mut request = tonic::Request::new(outbound);
        for (key, value) in metadata {
            request.metadata_mut().insert(*key, value.parse().expect("ASCII metadata"));
        }
        let rx = tokio::time::timeout(WAIT, client.process(request))
            .await
            .expect("stream opens in time")
            .expect("stream opens")
            .into_inner();
        Call { tx: Some(tx), rx }
    }

    pub fn send(&self, message: ProcessingRequest) {
        self.tx.as_ref().expect("send side open").send(message).expect("stream alive");
    }

    /// The next answer; panics on a timeout, an error or the end.
    pub async fn recv(&mut self) -> ProcessingResponse {
        match self.next().await {
            Ok(Some(answer)) => answer,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    pub async fn next(&mut self) -> Result<Option<ProcessingResponse>, Status> {
        tokio::time::timeout(WAIT, self.rx.message()).await.expect("an answer in time")
    }

    /// True when nothing arrives within `ms`.
    pub async fn quiet(&mut self, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), self.rx.message()).await.is_err()
    }

    /// The gateway closes its side.
    pub fn close_send(&mut self) {
        self.tx = None;
    }
}

// ----- messages the gateway sends -----

pub fn protocol(request: BodySendMode, response: BodySendMode) -> ProtocolConfiguration {
    ProtocolConfiguration {
        request_body_mode: request as i32,
        response_body_mode: response as i32,
        send_body_without_waiting_for_header_response: true,
    }
}

pub fn full_duplex() -> Option<ProtocolConfiguration> {
    Some(protocol(BodySendMode::FullDuplexStreamed, BodySendMode::FullDuplexStreamed))
}

pub fn request_headers(
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    end_of_stream: bool,
    protocol: Option<ProtocolConfiguration>,
) -> ProcessingRequest {
    let mut pairs =
        vec![(":method", method), (":path", path), (":authority", "gateway"), ("content-type", "application/json")];
    pairs.extend_from_slice(extra);
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(header_map(&pairs)),
            end_of_stream,
            ..Default::default()
        })),
        protocol_config: protocol,
        ..Default::default()
    }
}

/// POST /v1/chat/completions headers, full-duplex protocol announced.
pub fn chat_headers() -> ProcessingRequest {
    request_headers("POST", "/v1/chat/completions", &[], false, full_duplex())
}

pub fn request_body(body: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody { body: body.to_vec(), end_of_stream, ..Default::default() })),
        ..Default::default()
    }
}

pub fn request_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestTrailers(HttpTrailers { trailers: Some(header_map(&[])) })),
        ..Default::default()
    }
}

pub fn response_headers(
    status: &str,
    content_type: &str,
    served: Option<&str>,
    end_of_stream: bool,
) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(header_map(&[(":status", status), ("content-type", content_type)])),
            end_of_stream,
            ..Default::default()
        })),
        metadata_context: served.map(|s| metadata(LB_NAMESPACE, "x-gateway-destination-endpoint-served", string(s))),
        ..Default::default()
    }
}

pub fn response_body(body: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseBody(HttpBody { body: body.to_vec(), end_of_stream, ..Default::default() })),
        ..Default::default()
    }
}

pub fn response_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseTrailers(HttpTrailers { trailers: Some(header_map(&[])) })),
        ..Default::default()
    }
}

pub fn string(s: &str) -> Value {
    Value { kind: Some(Kind::StringValue(s.to_owned())) }
}

pub fn list(items: &[&str]) -> Value {
    Value { kind: Some(Kind::ListValue(ListValue { values: items.iter().map(|s| string(s)).collect() })) }
}

pub fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
    let fields = Struct { fields: [(key.to_owned(), value)].into_iter().collect() };
    Metadata { filter_metadata: [(namespace.to_owned(), fields)].into_iter().collect(), ..Default::default() }
}

/// `message` with the gateway's subset hint attached.
pub fn with_subset(mut message: ProcessingRequest, subset: Value) -> ProcessingRequest {
    message.metadata_context = Some(metadata(SUBSET_NAMESPACE, "x-gateway-destination-endpoint-subset", subset));
    message
}

/// A chat body whose user message is `words`.
pub fn chat(words: &str) -> String {
    serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": words}],
        "stream": true,
    })
    .to_string()
}

/// `n` distinct words starting with `prefix`.
pub fn words(prefix: &str, n: usize) -> String {
    (0..n).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>().join(" ")
}

// ----- reading answers -----

pub fn kind(answer: &ProcessingResponse) -> &'static str {
    match &answer.response {
        Some(Response::RequestHeaders(_)) => "request_headers",
        Some(Response::RequestBody(_)) => "request_body",
        Some(Response::RequestTrailers(_)) => "request_trailers",
        Some(Response::ResponseHeaders(_)) => "response_headers",
        Some(Response::ResponseBody(_)) => "response_body",
        Some(Response::ResponseTrailers(_)) => "response_trailers",
        Some(Response::ImmediateResponse(_)) => "immediate_response",
        Some(Response::StreamedImmediateResponse(_)) => "streamed_immediate_response",
        None => "none",
    }
}

pub fn common(answer: &ProcessingResponse) -> Option<&CommonResponse> {
    match &answer.response {
        Some(Response::RequestHeaders(h) | Response::ResponseHeaders(h)) => h.response.as_ref(),
        Some(Response::RequestBody(b) | Response::ResponseBody(b)) => b.response.as_ref(),
        _ => None,
    }
}

/// A header the answer sets: (value, append action).
pub fn set_header(answer: &ProcessingResponse, key: &str) -> Option<(String, i32)> {
    let mutation = common(answer)?.header_mutation.as_ref()?;
    mutation.set_headers.iter().find_map(|o| {
        let h = o.header.as_ref()?;
        (h.key == key).then(|| (String::from_utf8_lossy(&h.raw_value).into_owned(), o.append_action))
    })
}

pub fn removed_headers(answer: &ProcessingResponse) -> Vec<String> {
    common(answer).and_then(|c| c.header_mutation.as_ref()).map(|m| m.remove_headers.clone()).unwrap_or_default()
}

/// The pick in the header (checked to equal the dynamic metadata's).
pub fn destination(answer: &ProcessingResponse) -> Option<String> {
    let (header, _) = set_header(answer, DESTINATION)?;
    let metadata = destination_metadata(answer).expect("the pick in the envoy.lb metadata too");
    // The metadata's ranked list starts with the pick; the header has the
    // pick alone, or the same list when fallbacks go in the header.
    assert!(metadata == header || metadata.starts_with(&format!("{header},")), "header {header}, metadata {metadata}");
    Some(header)
}

pub fn destination_metadata(answer: &ProcessingResponse) -> Option<String> {
    let lb = answer.dynamic_metadata.as_ref()?.fields.get(LB_NAMESPACE)?;
    let Some(Kind::StructValue(lb)) = &lb.kind else { return None };
    match &lb.fields.get(DESTINATION)?.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A streamed body chunk: (bytes, end_of_stream).
pub fn streamed(answer: &ProcessingResponse) -> Option<(Vec<u8>, bool)> {
    match &common(answer)?.body_mutation {
        Some(BodyMutation { mutation: Some(body_mutation::Mutation::StreamedResponse(s)) }) => {
            Some((s.body.clone(), s.end_of_stream))
        }
        _ => None,
    }
}

/// An immediate response: (status, JSON body, headers set).
pub type Refusal = (u16, serde_json::Value, Vec<(String, String)>);

pub fn immediate(answer: &ProcessingResponse) -> Option<Refusal> {
    let Some(Response::ImmediateResponse(r)) = &answer.response else { return None };
    let status = u16::try_from(r.status.as_ref()?.code).ok()?;
    let body = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
    let headers = r
        .headers
        .iter()
        .flat_map(|m| &m.set_headers)
        .filter_map(|o| o.header.as_ref())
        .map(|h| (h.key.clone(), String::from_utf8_lossy(&h.raw_value).into_owned()))
        .collect();
    Some((status, body, headers))
}

/// Sends a whole request (headers, body in one chunk) and reads the pick
/// and the echoed body; returns the destination.
pub async fn pick(call: &mut Call, body: &str) -> String {
    call.send(chat_headers());
    call.send(request_body(body.as_bytes(), true));
    let headers = call.recv().await;
    let destination = destination(&headers).unwrap_or_else(|| panic!("no pick in {headers:?}"));
    let (echo, end) = streamed(&call.recv().await).expect("body echoed");
    assert_eq!((echo.as_slice(), end), (body.as_bytes(), true));
    destination
}

/// Answers the response path: headers, one body chunk with the end.
pub async fn finish_response(call: &mut Call) {
    call.send(response_headers("200", "application/json", None, false));
    assert_eq!(kind(&call.recv().await), "response_headers");
    call.send(response_body(b"{}", true));
    assert_eq!(streamed(&call.recv().await), Some((b"{}".to_vec(), true)));
}
