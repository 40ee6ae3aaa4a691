//! One ext_proc stream driven as a gateway drives it, with every answer
//! checked.
//!
//! Request path first: headers and body chunks (`end_of_stream` on the
//! last) go out at once, as Envoy forwards them in FULL_DUPLEX_STREAMED
//! mode. Then the answers: the request-headers answer carrying the pick
//! (`x-gateway-destination-endpoint`, and the same value in `envoy.lb`
//! dynamic metadata), then the body echoed as `streamed_response` chunks;
//! in BUFFERED mode the headers answer comes first and the pick rides on
//! the body answer. Only then the response path (the model server's
//! headers and body chunks), every message answered (echoed in full
//! duplex), then the gateway closes its side and the server must end the
//! stream. With `pipeline` everything goes out up front, as ghz and h2load
//! send a stream.
//!
//! An `ImmediateResponse` ends the request with its HTTP status. Anything
//! a gateway could not use is an error: no destination, a destination
//! header and metadata that differ, an echo that is not the bytes sent, an
//! answer of the wrong kind or an extra one.

use std::time::{Duration, Instant};

use kvpick_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use kvpick_proto::ext_proc::processing_response::Response;
use kvpick_proto::ext_proc::{BodyResponse, CommonResponse, ProcessingRequest, ProcessingResponse, body_mutation};
use kvpick_proto::protobuf::Kind;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::script::{Expect, Script};

pub const DESTINATION: &str = "x-gateway-destination-endpoint";
const LB_NAMESPACE: &str = "envoy.lb";

/// The status-distribution key of a stream whose pick was correct.
pub const OK: &str = "OK";
/// The status-distribution key of a stream whose answers a gateway could not use.
pub const INVALID: &str = "invalid answer";

/// How one stream ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// `OK`, `ImmediateResponse <http status>`, `invalid answer`, or the
    /// gRPC code's name as ghz prints it (`Unavailable`, `DeadlineExceeded`).
    pub status: String,
    /// Why it failed, if it did (an `ImmediateResponse` is an answer, not an error).
    pub error: Option<String>,
    /// Origin (first message sent, or its scheduled time) → pick received.
    pub pick: Option<Duration>,
    /// Origin → the stream's end.
    pub stream: Option<Duration>,
    /// The endpoint picked.
    pub destination: Option<String>,
}

impl Outcome {
    pub fn failed(status: impl Into<String>, error: impl Into<String>) -> Outcome {
        Outcome { status: status.into(), error: Some(error.into()), pick: None, stream: None, destination: None }
    }

    pub fn timeout(after: Duration) -> Outcome {
        Outcome::failed("DeadlineExceeded", format!("timeout: the stream did not finish within {after:?}"))
    }
}

/// Go's names for gRPC codes (what ghz prints).
pub fn code_name(code: tonic::Code) -> String {
    match code {
        tonic::Code::Ok => "OK".into(),
        tonic::Code::Cancelled => "Canceled".into(),
        other => format!("{other:?}"),
    }
}

fn rpc_error(status: &tonic::Status) -> Outcome {
    Outcome::failed(
        code_name(status.code()),
        format!("rpc error: code = {} desc = {}", code_name(status.code()), status.message()),
    )
}

enum Failure {
    Rpc(tonic::Status),
    Invalid(String),
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Self {
        Failure::Rpc(status)
    }
}

fn invalid<T>(text: impl Into<String>) -> Result<T, Failure> {
    Err(Failure::Invalid(text.into()))
}

/// What one path (request or response) has had answered so far.
struct PathState<'a> {
    expect: &'a Expect,
    full_duplex: bool,
    headers: bool,
    echoed: usize,
    echo_ended: bool,
    body_answers: usize,
    trailers: bool,
}

impl<'a> PathState<'a> {
    fn new(expect: &'a Expect, full_duplex: bool) -> Self {
        PathState {
            expect,
            full_duplex,
            headers: false,
            echoed: 0,
            echo_ended: false,
            body_answers: 0,
            trailers: false,
        }
    }

    fn done(&self) -> bool {
        let body = if self.full_duplex {
            self.echoed == self.expect.body.len() && (!self.expect.body_ends || self.echo_ended)
        } else {
            self.body_answers == self.expect.body_messages
        };
        (!self.expect.headers || self.headers) && body && (!self.expect.trailers || self.trailers)
    }

    /// A body answer: in full duplex, an echo of the next bytes sent.
    fn body(&mut self, answer: &BodyResponse, path: &str) -> Result<(), Failure> {
        if !self.full_duplex {
            self.body_answers += 1;
            return Ok(());
        }
        let streamed =
            answer.response.as_ref().and_then(|c| c.body_mutation.as_ref()).and_then(|m| m.mutation.as_ref()).and_then(
                |m| match m {
                    body_mutation::Mutation::StreamedResponse(s) => Some(s),
                    _ => None,
                },
            );
        let Some(streamed) = streamed else {
            return invalid(format!("{path} body answer without streamed_response (full duplex needs the echo)"));
        };
        let end = self.echoed + streamed.body.len();
        if self.expect.body.get(self.echoed..end) != Some(&streamed.body[..]) {
            return invalid(format!("{path} body echo mismatch"));
        }
        self.echoed = end;
        self.echo_ended |= streamed.end_of_stream;
        Ok(())
    }
}

/// The destination set by an answer's header mutation, if any.
fn destination_header(common: Option<&CommonResponse>) -> Option<String> {
    let mutation = common?.header_mutation.as_ref()?;
    mutation.set_headers.iter().filter_map(|option| option.header.as_ref()).find_map(|header| {
        header.key.eq_ignore_ascii_case(DESTINATION).then(|| {
            if header.raw_value.is_empty() {
                header.value.clone()
            } else {
                String::from_utf8_lossy(&header.raw_value).into_owned()
            }
        })
    })
}

/// `envoy.lb` → `x-gateway-destination-endpoint` in the dynamic metadata.
fn destination_metadata(answer: &ProcessingResponse) -> Option<String> {
    let lb = answer.dynamic_metadata.as_ref()?.fields.get(LB_NAMESPACE)?;
    let Some(Kind::StructValue(lb)) = &lb.kind else { return None };
    match &lb.fields.get(DESTINATION)?.kind {
        Some(Kind::StringValue(value)) => Some(value.clone()),
        _ => None,
    }
}

fn kind(answer: &ProcessingResponse) -> &'static str {
    match &answer.response {
        Some(Response::RequestHeaders(_)) => "request_headers",
        Some(Response::ResponseHeaders(_)) => "response_headers",
        Some(Response::RequestBody(_)) => "request_body",
        Some(Response::ResponseBody(_)) => "response_body",
        Some(Response::RequestTrailers(_)) => "request_trailers",
        Some(Response::ResponseTrailers(_)) => "response_trailers",
        Some(Response::ImmediateResponse(_)) => "immediate_response",
        Some(Response::StreamedImmediateResponse(_)) => "streamed_immediate_response",
        None => "empty",
    }
}

enum Done {
    Picked { destination: String, pick: Duration },
    Immediate(u16),
}

/// Drives one stream; `origin` is when it should have started (its
/// scheduled time in an open loop), from which latencies count. The
/// caller bounds it with a timeout.
pub async fn drive(
    client: &mut ExternalProcessorClient<Channel>,
    script: &Script,
    request_number: u64,
    origin: Instant,
    pipeline: bool,
) -> Outcome {
    match run(client, script, request_number, origin, pipeline).await {
        Ok((Done::Picked { destination, pick }, stream)) => Outcome {
            status: OK.into(),
            error: None,
            pick: Some(pick),
            stream: Some(stream),
            destination: Some(destination),
        },
        Ok((Done::Immediate(status), stream)) => Outcome {
            status: format!("ImmediateResponse {status}"),
            error: None,
            pick: None,
            stream: Some(stream),
            destination: None,
        },
        Err(Failure::Rpc(status)) => rpc_error(&status),
        Err(Failure::Invalid(why)) => Outcome::failed(INVALID, why),
    }
}

async fn run(
    client: &mut ExternalProcessorClient<Channel>,
    script: &Script,
    request_number: u64,
    origin: Instant,
    pipeline: bool,
) -> Result<(Done, Duration), Failure> {
    let (request_fd, response_fd) = script.modes();
    let (expect_request, expect_response) = (script.expect_request(), script.expect_response());
    let capacity = script.request.len() + script.response.len() + 1;
    let (tx, rx) = mpsc::channel::<ProcessingRequest>(capacity);
    // The channel holds the whole stream, so sending never waits; a send
    // fails only once the call is gone, and reading the answers then
    // reports why.
    let send_all = |messages: Vec<ProcessingRequest>| {
        for message in messages {
            let _ = tx.try_send(message);
        }
    };
    send_all(script.request_messages(request_number));
    if pipeline {
        send_all(script.response.clone());
    }
    let outbound = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut answers = client.process(outbound).await?.into_inner();

    // Request path: the pick.
    let mut state = PathState::new(&expect_request, request_fd);
    let mut picked: Option<(String, Duration)> = None;
    while !state.done() {
        let Some(answer) = answers.message().await? else {
            return invalid("the stream ended before the request path was answered");
        };
        let carried = match &answer.response {
            Some(Response::RequestHeaders(h)) => {
                state.headers = true;
                destination_header(h.response.as_ref())
            }
            Some(Response::RequestBody(b)) => {
                state.body(b, "request")?;
                if request_fd { None } else { destination_header(b.response.as_ref()) }
            }
            Some(Response::RequestTrailers(_)) => {
                state.trailers = true;
                None
            }
            Some(Response::ImmediateResponse(i)) => {
                let status = i.status.as_ref().map_or(0, |s| u16::try_from(s.code).unwrap_or(0));
                return finish_immediate(tx, answers, status, origin).await;
            }
            _ => return invalid(format!("unexpected {} answer on the request path", kind(&answer))),
        };
        if let Some(destination) = carried {
            let at = origin.elapsed();
            match destination_metadata(&answer) {
                Some(meta) if meta == destination => {}
                Some(_) => return invalid("destination header and envoy.lb metadata differ"),
                None => return invalid("no destination in envoy.lb dynamic metadata"),
            }
            if picked.is_some() {
                return invalid("two picks on one request");
            }
            picked = Some((destination, at));
        }
    }
    let Some((destination, pick)) = picked else {
        return invalid("no destination");
    };

    // Response path: every message answered.
    if !pipeline {
        send_all(script.response.clone());
    }
    let mut state = PathState::new(&expect_response, response_fd);
    while !state.done() {
        let Some(answer) = answers.message().await? else {
            return invalid("the stream ended before the response path was answered");
        };
        match &answer.response {
            Some(Response::ResponseHeaders(_)) => state.headers = true,
            Some(Response::ResponseBody(b)) => state.body(b, "response")?,
            Some(Response::ResponseTrailers(_)) => state.trailers = true,
            Some(Response::ImmediateResponse(i)) => {
                let status = i.status.as_ref().map_or(0, |s| u16::try_from(s.code).unwrap_or(0));
                return finish_immediate(tx, answers, status, origin).await;
            }
            _ => return invalid(format!("unexpected {} answer on the response path", kind(&answer))),
        }
    }

    // The gateway closes its side; the server must end the stream.
    drop(tx);
    match answers.message().await? {
        None => Ok((Done::Picked { destination, pick }, origin.elapsed())),
        Some(extra) => invalid(format!("an extra {} answer after the response", kind(&extra))),
    }
}

/// After an `ImmediateResponse` the gateway stops; it closes its side and
/// the server ends the stream.
async fn finish_immediate(
    tx: mpsc::Sender<ProcessingRequest>,
    mut answers: tonic::Streaming<ProcessingResponse>,
    status: u16,
    origin: Instant,
) -> Result<(Done, Duration), Failure> {
    drop(tx);
    // Answers the server queued before it refused are of no interest now.
    while answers.message().await?.is_some() {}
    Ok((Done::Immediate(status), origin.elapsed()))
}
