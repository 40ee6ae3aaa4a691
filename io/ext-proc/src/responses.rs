//! The `ProcessingResponse` messages kvpick sends back, one builder per
//! kind: header and body answers on either path, body chunks echoed as
//! `streamed_response` (at most [`BODY_CHUNK_BYTES`] each), trailers.

use std::collections::VecDeque;

use kvpick_proto::ext_proc::processing_response::Response;
use kvpick_proto::ext_proc::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ProcessingResponse,
    StreamedBodyResponse, TrailersResponse, body_mutation,
};
use kvpick_proto::protobuf::Struct;

use crate::config::BODY_CHUNK_BYTES;

/// Which HTTP message a response belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Request,
    Response,
}

/// `CONTINUE` with optional header changes (and route-cache clearing when
/// the destination changed).
fn common(mutation: Option<HeaderMutation>, clear_route_cache: bool) -> CommonResponse {
    CommonResponse { header_mutation: mutation, clear_route_cache, ..Default::default() }
}

fn message(response: Response, dynamic_metadata: Option<Struct>) -> ProcessingResponse {
    ProcessingResponse { response: Some(response), dynamic_metadata, ..Default::default() }
}

/// The answer to request or response headers.
pub fn headers(
    path: Path,
    mutation: Option<HeaderMutation>,
    clear_route_cache: bool,
    dynamic_metadata: Option<Struct>,
) -> ProcessingResponse {
    let answer = HeadersResponse { response: Some(common(mutation, clear_route_cache)) };
    let response = match path {
        Path::Request => Response::RequestHeaders(answer),
        Path::Response => Response::ResponseHeaders(answer),
    };
    message(response, dynamic_metadata)
}

/// The answer to a body message that leaves it unchanged (BUFFERED and
/// STREAMED modes). On the request path in BUFFERED mode it may carry the
/// pick: header mutations in a body answer apply to the held headers.
pub fn body_continue(
    path: Path,
    mutation: Option<HeaderMutation>,
    clear_route_cache: bool,
    dynamic_metadata: Option<Struct>,
) -> ProcessingResponse {
    let answer = BodyResponse { response: Some(common(mutation, clear_route_cache)) };
    let response = match path {
        Path::Request => Response::RequestBody(answer),
        Path::Response => Response::ResponseBody(answer),
    };
    message(response, dynamic_metadata)
}

fn streamed_chunk(path: Path, body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let streamed = StreamedBodyResponse { body, end_of_stream, ..Default::default() };
    let answer = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation { mutation: Some(body_mutation::Mutation::StreamedResponse(streamed)) }),
            ..Default::default()
        }),
    };
    let response = match path {
        Path::Request => Response::RequestBody(answer),
        Path::Response => Response::ResponseBody(answer),
    };
    message(response, None)
}

/// `body` as FULL_DUPLEX_STREAMED chunks of at most [`BODY_CHUNK_BYTES`],
/// `end_of_stream` on the last. An empty body still sends one (empty)
/// chunk when it ends the stream, so the gateway sees the end.
pub fn streamed_body(path: Path, body: &[u8], end_of_stream: bool, out: &mut VecDeque<ProcessingResponse>) {
    if body.is_empty() {
        if end_of_stream {
            out.push_back(streamed_chunk(path, Vec::new(), true));
        }
        return;
    }
    let count = body.len().div_ceil(BODY_CHUNK_BYTES);
    for (i, chunk) in body.chunks(BODY_CHUNK_BYTES).enumerate() {
        out.push_back(streamed_chunk(path, chunk.to_vec(), end_of_stream && i + 1 == count));
    }
}

/// Echoes one received chunk without copying when it fits in one message.
pub fn streamed_echo(path: Path, body: Vec<u8>, end_of_stream: bool, out: &mut VecDeque<ProcessingResponse>) {
    if body.len() <= BODY_CHUNK_BYTES && (!body.is_empty() || end_of_stream) {
        out.push_back(streamed_chunk(path, body, end_of_stream));
    } else {
        streamed_body(path, &body, end_of_stream, out);
    }
}

pub fn trailers(path: Path) -> ProcessingResponse {
    let answer = TrailersResponse { header_mutation: None };
    let response = match path {
        Path::Request => Response::RequestTrailers(answer),
        Path::Response => Response::ResponseTrailers(answer),
    };
    message(response, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(out: &VecDeque<ProcessingResponse>) -> Vec<(usize, bool)> {
        out.iter()
            .map(|m| match &m.response {
                Some(Response::RequestBody(BodyResponse { response: Some(c) })) => match &c.body_mutation {
                    Some(BodyMutation { mutation: Some(body_mutation::Mutation::StreamedResponse(s)) }) => {
                        (s.body.len(), s.end_of_stream)
                    }
                    other => panic!("not streamed: {other:?}"),
                },
                other => panic!("not a request body answer: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn chunks_at_most_62000_with_eos_on_the_last() {
        let mut out = VecDeque::new();
        streamed_body(Path::Request, &vec![7u8; 130_000], true, &mut out);
        assert_eq!(chunks(&out), vec![(62_000, false), (62_000, false), (6_000, true)]);
        out.clear();
        streamed_body(Path::Request, &vec![7u8; 124_000], false, &mut out);
        assert_eq!(chunks(&out), vec![(62_000, false), (62_000, false)]);
        out.clear();
        streamed_body(Path::Request, &[], true, &mut out);
        assert_eq!(chunks(&out), vec![(0, true)]);
        out.clear();
        streamed_echo(Path::Request, vec![], false, &mut out);
        assert!(out.is_empty());
    }
}
