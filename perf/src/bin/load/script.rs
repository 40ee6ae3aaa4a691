//! One ext_proc stream's messages, as a gateway would send them, split
//! into the request path (sent first; the pick comes back after its end)
//! and the response path (sent once the pick is in, as the model server
//! answers). Built from the workload or read from a ghz data file.

use kvpick_proto::ext_proc::mode::BodySendMode;
use kvpick_proto::ext_proc::processing_request::Request;
use kvpick_proto::ext_proc::{ProcessingRequest, ProtocolConfiguration};

/// ghz's template for the request number; replaced in header values.
pub const REQUEST_NUMBER: &str = "{{.RequestNumber}}";

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Script {
    /// Request headers, body chunks, trailers, in order.
    pub request: Vec<ProcessingRequest>,
    /// Response headers, body chunks, trailers, in order.
    pub response: Vec<ProcessingRequest>,
    /// Header values (message index into `request`, header index) that
    /// carry [`REQUEST_NUMBER`].
    templated: Vec<(usize, usize)>,
}

/// What the gateway expects back for one path of the stream, derived
/// from the messages it sends on that path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    pub headers: bool,
    /// Body bytes sent, in order (echoed in full-duplex mode).
    pub body: Vec<u8>,
    /// Body messages sent (each answered in buffered mode).
    pub body_messages: usize,
    /// The last body message carried `end_of_stream`.
    pub body_ends: bool,
    pub trailers: bool,
}

impl Script {
    pub fn new(request: Vec<ProcessingRequest>, response: Vec<ProcessingRequest>) -> Script {
        let mut templated = Vec::new();
        for (m, message) in request.iter().enumerate() {
            if let Some(Request::RequestHeaders(headers)) = &message.request {
                for (h, header) in headers.headers.iter().flat_map(|map| map.headers.iter()).enumerate() {
                    if header.value.contains(REQUEST_NUMBER) || contains(&header.raw_value, REQUEST_NUMBER.as_bytes()) {
                        templated.push((m, h));
                    }
                }
            }
        }
        Script { request, response, templated }
    }

    /// The request-path messages for request number `n`, templates filled in.
    pub fn request_messages(&self, n: u64) -> Vec<ProcessingRequest> {
        let mut messages = self.request.clone();
        let number = n.to_string();
        for &(m, h) in &self.templated {
            if let Some(Request::RequestHeaders(headers)) = &mut messages[m].request {
                if let Some(header) = headers.headers.as_mut().and_then(|map| map.headers.get_mut(h)) {
                    header.value = header.value.replace(REQUEST_NUMBER, &number);
                    if !header.raw_value.is_empty() {
                        let raw = String::from_utf8_lossy(&header.raw_value).replace(REQUEST_NUMBER, &number);
                        header.raw_value = raw.into_bytes();
                    }
                }
            }
        }
        messages
    }

    /// The body modes the first message announces; without a
    /// `protocol_config`, full duplex (what kvpick assumes by default).
    pub fn modes(&self) -> (bool, bool) {
        let config = self.request.first().and_then(|m| m.protocol_config.as_ref());
        match config {
            Some(ProtocolConfiguration { request_body_mode, response_body_mode, .. }) => {
                let full = |mode: i32| mode == BodySendMode::FullDuplexStreamed as i32;
                (full(*request_body_mode), full(*response_body_mode))
            }
            None => (true, true),
        }
    }

    pub fn expect_request(&self) -> Expect {
        expect(&self.request)
    }

    pub fn expect_response(&self) -> Expect {
        expect(&self.response)
    }

    /// Request body bytes (the prompt), for reporting sizes.
    pub fn request_body_len(&self) -> usize {
        self.expect_request().body.len()
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn expect(messages: &[ProcessingRequest]) -> Expect {
    let mut out = Expect::default();
    for message in messages {
        match &message.request {
            Some(Request::RequestHeaders(_) | Request::ResponseHeaders(_)) => out.headers = true,
            Some(Request::RequestBody(body) | Request::ResponseBody(body)) => {
                out.body.extend_from_slice(&body.body);
                out.body_messages += 1;
                out.body_ends = body.end_of_stream;
            }
            Some(Request::RequestTrailers(_) | Request::ResponseTrailers(_)) => out.trailers = true,
            None => {}
        }
    }
    out
}

/// Whether a message belongs to the response path.
pub fn is_response_path(message: &ProcessingRequest) -> bool {
    matches!(
        message.request,
        Some(Request::ResponseHeaders(_) | Request::ResponseBody(_) | Request::ResponseTrailers(_))
    )
}
