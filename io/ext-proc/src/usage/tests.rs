use super::*;

const SSE: &str = concat!(
    "data: {\"id\":\"1\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,",
    "\"total_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\r\n\r\n",
    "data: [DONE]\n\n",
);

fn expected() -> Option<Usage> {
    Some(Usage { prompt_tokens: 7, completion_tokens: 3, cached_tokens: Some(4) })
}

#[test]
fn sse_in_one_chunk() {
    let mut p = UsageParser::sse();
    p.push(SSE.as_bytes());
    // One token event; the usage-only event and `[DONE]` carry none.
    assert_eq!(p.sse_events(), 1);
    assert_eq!(p.finish(), expected());
}

#[test]
fn sse_events_count_token_events_whatever_the_chunking() {
    // vLLM's chat stream without `include_usage`: a role event, a token
    // per event, a last event with the finish reason, then `[DONE]`.
    let stream = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    for cut in 0..stream.len() {
        let mut p = UsageParser::sse();
        p.push(&stream.as_bytes()[..cut]);
        p.push(&stream.as_bytes()[cut..]);
        assert_eq!(p.sse_events(), 4, "cut at {cut}");
        assert_eq!(p.finish(), None);
    }
    let mut json = UsageParser::json(1024);
    json.push(b"{\"usage\":null}");
    assert_eq!(json.sse_events(), 0);
}

#[test]
fn sse_split_at_every_byte_boundary() {
    let bytes = SSE.as_bytes();
    for cut in 0..bytes.len() {
        let mut p = UsageParser::sse();
        p.push(&bytes[..cut]);
        p.push(&bytes[cut..]);
        assert_eq!(p.finish(), expected(), "cut at {cut}");
    }
    let mut p = UsageParser::sse();
    for b in bytes.chunks(1) {
        p.push(b);
    }
    assert_eq!(p.finish(), expected());
}

#[test]
fn sse_last_line_without_newline() {
    let mut p = UsageParser::sse();
    p.push(b"data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}");
    assert_eq!(p.finish(), Some(Usage { prompt_tokens: 1, completion_tokens: 2, cached_tokens: None }));
}

#[test]
fn sse_overlong_line_is_skipped_not_kept() {
    let mut p = UsageParser::sse();
    let long = vec![b'x'; MAX_SSE_LINE + 10];
    p.push(b"data: ");
    p.push(&long);
    p.push(b"\ndata: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n");
    assert_eq!(p.finish(), Some(Usage { prompt_tokens: 5, completion_tokens: 6, cached_tokens: None }));
}

#[test]
fn responses_api_event() {
    let mut p = UsageParser::sse();
    p.push(b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":");
    p.push(b"{\"input_tokens\":9,\"output_tokens\":2,\"input_tokens_details\":{\"cached_tokens\":8}}}}\n\n");
    assert_eq!(p.finish(), Some(Usage { prompt_tokens: 9, completion_tokens: 2, cached_tokens: Some(8) }));
}

#[test]
fn json_body_split_and_capped() {
    let body = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":1}}"#;
    let mut p = UsageParser::json(1024);
    p.push(&body[..20]);
    p.push(&body[20..]);
    assert_eq!(p.finish(), Some(Usage { prompt_tokens: 11, completion_tokens: 1, cached_tokens: None }));
    let mut p = UsageParser::json(10);
    p.push(body);
    assert_eq!(p.finish(), None);
    let mut p = UsageParser::json(1024);
    p.push(b"not json");
    assert_eq!(p.finish(), None);
}
