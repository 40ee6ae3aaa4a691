//! A gateway in miniature, for the demo, end-to-end tests and load runs:
//! it asks an ext_proc server where a request goes, exactly as Envoy does
//! in FULL_DUPLEX_STREAMED mode, forwards the body the server echoed to
//! the picked endpoint over HTTP, and feeds the response back through the
//! same ext_proc stream, chunk by chunk, returning what the client would
//! receive.
//!
//! Not a proxy for production: one request per stream, no retries, no
//! header mutations applied beyond the destination.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvpick_proto::core::{HeaderMap, HeaderValue, Metadata};
use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use kvpick_proto::ext_proc::mode::BodySendMode;
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::processing_response::Response;
use kvpick_proto::ext_proc::{
    BodyMutation, CommonResponse, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
    body_mutation,
};
use kvpick_proto::protobuf::{Kind, Struct, Value};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

use kvpick_ext_proc::headers::{DESTINATION, DESTINATION_SERVED, PD_HANDOFF, PREFILL_MS, PREFILLER};
use kvpick_ext_proc::metadata::LB_NAMESPACE;

/// Longest the gateway waits for any one answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("ext_proc: {0}")]
    ExtProc(String),
    #[error("upstream {endpoint}: {message}")]
    Upstream { endpoint: SocketAddr, message: String },
    #[error("protocol: {0}")]
    Protocol(String),
}

/// What the client saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exchange {
    /// The endpoint kvpick picked (`None` when it refused).
    pub endpoint: Option<SocketAddr>,
    /// The prefill endpoint of a disaggregated pick (`x-prefiller-host-port`,
    /// sent upstream with the request as a gateway applies it).
    pub prefiller: Option<SocketAddr>,
    /// The HTTP status the client got: the engine's, or the refusal's.
    pub status: u16,
    /// `Some(status)` when kvpick answered with an ImmediateResponse.
    pub refused: Option<u16>,
    /// The response body as the client received it (after the echo).
    pub body: Vec<u8>,
    /// The engine's `x-sim-engine` header, when it sent one.
    pub engine: Option<String>,
    /// The decode sidecar's hand-off header (`x-kvpick-pd`), when the
    /// endpoint is a `kvpick sidecar`.
    pub handoff: Option<String>,
    /// The sidecar's prefill leg time (`x-kvpick-prefill-ms`), when split.
    pub prefill_ms: Option<f64>,
    /// From the request's first message to the pick.
    pub pick_time: Duration,
}

/// One gateway: an ext_proc client and an HTTP client to the engines.
#[derive(Clone)]
pub struct Gateway {
    ext_proc: ExternalProcessorClient<Channel>,
    http: Client<HttpConnector, Full<Bytes>>,
    /// Request body chunk size sent to the ext_proc server.
    pub chunk_bytes: usize,
}

impl Gateway {
    pub async fn connect(ext_proc: SocketAddr) -> Result<Gateway, GatewayError> {
        let channel = Channel::from_shared(format!("http://{ext_proc}"))
            .map_err(|e| GatewayError::ExtProc(e.to_string()))?
            .connect()
            .await
            .map_err(|e| GatewayError::ExtProc(format!("connect {ext_proc}: {e}")))?;
        let client = ExternalProcessorClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        Ok(Gateway {
            ext_proc: client,
            http: Client::builder(TokioExecutor::new()).build_http(),
            chunk_bytes: 16 * 1024,
        })
    }

    /// A POST of `body` to `path` (e.g. `/v1/chat/completions`) through
    /// kvpick to the endpoint it picks.
    pub async fn post(&self, path: &str, body: &[u8]) -> Result<Exchange, GatewayError> {
        self.post_with_headers(path, body, &[]).await
    }

    /// [`Gateway::post`] with `extra` request headers (a `traceparent`,
    /// a session token), sent to kvpick as the client sent them.
    pub async fn post_with_headers(
        &self,
        path: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Result<Exchange, GatewayError> {
        let started = Instant::now();
        let (tx, rx) = mpsc::unbounded_channel::<ProcessingRequest>();
        let outbound = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let mut client = self.ext_proc.clone();
        let mut answers =
            client.process(outbound).await.map_err(|s| GatewayError::ExtProc(s.message().to_owned()))?.into_inner();
        let send = |m: ProcessingRequest| tx.send(m).map_err(|_| GatewayError::ExtProc("stream closed".into()));

        let mut first = request_headers(path, extra);
        first.protocol_config = Some(ProtocolConfiguration {
            request_body_mode: BodySendMode::FullDuplexStreamed as i32,
            response_body_mode: BodySendMode::FullDuplexStreamed as i32,
            send_body_without_waiting_for_header_response: true,
        });
        send(first)?;
        let chunks: Vec<&[u8]> =
            if body.is_empty() { vec![&[]] } else { body.chunks(self.chunk_bytes.max(1)).collect() };
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            send(body_message(true, chunk, i == last))?;
        }

        let answer = next(&mut answers).await?;
        if let Some(Response::ImmediateResponse(r)) = &answer.response {
            let status = r.status.as_ref().map_or(0, |s| u16::try_from(s.code).unwrap_or(0));
            return Ok(Exchange {
                status,
                refused: Some(status),
                body: r.body.clone(),
                pick_time: started.elapsed(),
                ..Exchange::default()
            });
        }
        let pick_time = started.elapsed();
        let prefiller = header_value(&answer, PREFILLER);
        let endpoint = header_value(&answer, DESTINATION)
            .ok_or_else(|| GatewayError::Protocol(format!("no destination in the headers answer: {answer:?}")))?;
        let endpoint: SocketAddr =
            endpoint.parse().map_err(|_| GatewayError::Protocol(format!("destination {endpoint:?} is not ip:port")))?;
        // What goes upstream is what kvpick echoed, not what we sent.
        let mut upstream_body = Vec::with_capacity(body.len());
        loop {
            let (chunk, end) = streamed(&next(&mut answers).await?)
                .ok_or_else(|| GatewayError::Protocol("expected the request body echo".into()))?;
            upstream_body.extend_from_slice(&chunk);
            if end {
                break;
            }
        }

        let mut request =
            hyper::Request::post(format!("http://{endpoint}{path}")).header("content-type", "application/json");
        if let Some(prefiller) = &prefiller {
            request = request.header(PREFILLER, prefiller.as_str());
        }
        let request =
            request.body(Full::new(Bytes::from(upstream_body))).map_err(|e| GatewayError::Protocol(e.to_string()))?;
        let upstream = |message: String| GatewayError::Upstream { endpoint, message };
        let response = self.http.request(request).await.map_err(|e| upstream(e.to_string()))?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_owned();
        let engine = response.headers().get("x-sim-engine").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let handoff = response.headers().get(PD_HANDOFF).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let prefill_ms =
            response.headers().get(PREFILL_MS).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<f64>().ok());
        // Envoy hands kvpick the upstream's response headers as they came.
        let upstream_headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(name, _)| *name != "content-type")
            .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
            .collect();
        send(response_headers(status, &content_type, &upstream_headers, endpoint))?;
        let answer = next(&mut answers).await?;
        if !matches!(answer.response, Some(Response::ResponseHeaders(_))) {
            return Err(GatewayError::Protocol(format!("expected the response headers answer, got {answer:?}")));
        }
        let mut client_body = Vec::new();
        let mut body = response.into_body();
        loop {
            let frame = body.frame().await.transpose().map_err(|e| upstream(e.to_string()))?;
            let (data, end) = match frame {
                Some(frame) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => (data.to_vec(), false),
                    _ => continue,
                },
                None => (Vec::new(), true),
            };
            send(body_message(false, &data, end))?;
            let (echo, echo_end) = streamed(&next(&mut answers).await?)
                .ok_or_else(|| GatewayError::Protocol("expected the response body echo".into()))?;
            client_body.extend_from_slice(&echo);
            if end != echo_end {
                return Err(GatewayError::Protocol("the echo's end_of_stream differs from the chunk's".into()));
            }
            if end {
                break;
            }
        }
        drop(tx);
        // The server ends the stream once we close ours.
        while let Ok(Some(_)) = tokio::time::timeout(ANSWER_TIMEOUT, answers.message()).await.unwrap_or(Ok(None)) {}
        let prefiller = prefiller.and_then(|p| p.parse().ok());
        Ok(Exchange {
            endpoint: Some(endpoint),
            prefiller,
            status,
            refused: None,
            body: client_body,
            engine,
            handoff,
            prefill_ms,
            pick_time,
        })
    }
}

async fn next(answers: &mut Streaming<ProcessingResponse>) -> Result<ProcessingResponse, GatewayError> {
    match tokio::time::timeout(ANSWER_TIMEOUT, answers.message()).await {
        Err(_) => Err(GatewayError::ExtProc("no answer in time".into())),
        Ok(Err(status)) => Err(GatewayError::ExtProc(format!("{:?}: {}", status.code(), status.message()))),
        Ok(Ok(None)) => Err(GatewayError::ExtProc("stream ended early".into())),
        Ok(Ok(Some(answer))) => Ok(answer),
    }
}

/// Headers as Envoy sends them: pseudo headers in `value`, the rest in
/// `raw_value`.
pub fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    let headers = pairs
        .iter()
        .map(|(k, v)| {
            if k.starts_with(':') {
                HeaderValue { key: (*k).into(), value: (*v).into(), raw_value: vec![] }
            } else {
                HeaderValue { key: (*k).into(), value: String::new(), raw_value: v.as_bytes().to_vec() }
            }
        })
        .collect();
    HeaderMap { headers }
}

fn request_headers(path: &str, extra: &[(&str, &str)]) -> ProcessingRequest {
    let mut pairs =
        vec![(":method", "POST"), (":path", path), (":authority", "gateway"), ("content-type", "application/json")];
    pairs.extend_from_slice(extra);
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(header_map(&pairs)),
            end_of_stream: false,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn body_message(request: bool, chunk: &[u8], end_of_stream: bool) -> ProcessingRequest {
    let body = HttpBody { body: chunk.to_vec(), end_of_stream, ..Default::default() };
    let request = if request { Request::RequestBody(body) } else { Request::ResponseBody(body) };
    ProcessingRequest { request: Some(request), ..Default::default() }
}

fn response_headers(
    status: u16,
    content_type: &str,
    upstream: &[(String, String)],
    served: SocketAddr,
) -> ProcessingRequest {
    let status = status.to_string();
    let mut pairs = vec![(":status", status.as_str()), ("content-type", content_type)];
    pairs.extend(upstream.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let served = Value { kind: Some(Kind::StringValue(served.to_string())) };
    let fields = Struct { fields: [(DESTINATION_SERVED.to_owned(), served)].into_iter().collect() };
    ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(header_map(&pairs)),
            end_of_stream: false,
            ..Default::default()
        })),
        metadata_context: Some(Metadata {
            filter_metadata: [(LB_NAMESPACE.to_owned(), fields)].into_iter().collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn common(answer: &ProcessingResponse) -> Option<&CommonResponse> {
    match &answer.response {
        Some(Response::RequestHeaders(h)) | Some(Response::ResponseHeaders(h)) => h.response.as_ref(),
        Some(Response::RequestBody(b)) | Some(Response::ResponseBody(b)) => b.response.as_ref(),
        _ => None,
    }
}

/// The value a header mutation of `answer` sets `key` to.
fn header_value(answer: &ProcessingResponse, key: &str) -> Option<String> {
    let mutation = common(answer)?.header_mutation.as_ref()?;
    let header = mutation.set_headers.iter().filter_map(|o| o.header.as_ref()).find(|h| h.key == key)?;
    let raw = if header.raw_value.is_empty() { header.value.as_bytes() } else { &header.raw_value };
    String::from_utf8(raw.to_vec()).ok()
}

fn streamed(answer: &ProcessingResponse) -> Option<(Vec<u8>, bool)> {
    match &common(answer)?.body_mutation {
        Some(BodyMutation { mutation: Some(body_mutation::Mutation::StreamedResponse(s)) }) => {
            Some((s.body.clone(), s.end_of_stream))
        }
        _ => None,
    }
}
