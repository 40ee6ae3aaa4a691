//! What the decode sidecar reads from a request and a prefill engine's
//! answer: `x-prefiller-host-port` values, a client's body (its own P/D
//! fields removed) and the rewrites of each engine's protocol, fed any
//! bytes.
//!
//! Invariants: no panic; an endpoint taken is a usable one (port not 0,
//! allowed); a body that passed the cleaning names none of the sidecar's
//! own fields at its top level; every prefill leg asks for what its
//! protocol needs (vLLM: remote decode, one token, unstreamed; TensorRT-LLM:
//! context only, unstreamed; SGLang: a room); a synthesized event stream
//! always ends with `[DONE]`.

#![no_main]

use std::net::SocketAddr;

use bytes::Bytes;
use hyper::HeaderMap;
use hyper::header::HeaderValue;
use kvpick_sidecar::PrefillAllow;
use kvpick_sidecar::flow::{OWN_FIELDS, own_fields_removed};
use kvpick_sidecar::prefiller::Prefiller;
use kvpick_sidecar::protocol::{Body, Route, sglang, trtllm, vllm};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    // The first line is the header's value(s), split on '\n' into repeats;
    // the rest is the body (and, parsed, a prefill's answer).
    let split = data.iter().position(|b| *b == 0).unwrap_or(data.len());
    let (header, body) = (&data[..split], data.get(split + 1..).unwrap_or_default());
    let mut headers = HeaderMap::new();
    for value in header.split(|b| *b == b'\n') {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append("x-prefiller-host-port", value);
        }
    }
    let allow: PrefillAllow = "10.0.0.1,127.0.0.1:8000".parse().unwrap_or_default();
    let local = [SocketAddr::from(([10, 0, 0, 9], 8000))];
    for allow in [PrefillAllow::Any, allow] {
        if let Prefiller::At(endpoint) = Prefiller::read(&headers, &allow, &local) {
            assert_ne!(endpoint.port(), 0);
            assert!(allow.allows(endpoint));
            assert!(!local.contains(&endpoint));
        }
    }

    // A body that may name the fields but cannot be read is refused.
    let Ok((cleaned, parsed)) = own_fields_removed(Bytes::copy_from_slice(body)) else { return };
    // Read as the sidecar reads it (a `Value` would refuse numbers past
    // f64's range, which JSON allows and the engines read).
    if let Ok(read) = Body::parse(&cleaned) {
        assert!(!OWN_FIELDS.iter().any(|f| read.contains_key(f)), "{:?}", read.keys().collect::<Vec<_>>());
    }
    let Some(body) = parsed.or_else(|| Body::parse(&cleaned).ok()) else {
        return;
    };
    for route in [Route::Chat, Route::Completions, Route::VllmGenerate, Route::SglangGenerate] {
        let prefill = vllm::prefill_body(&body, route);
        let vllm_rewrites = [
            "kv_transfer_params",
            "stream",
            "stream_options",
            "sampling_params",
            "max_tokens",
            "max_completion_tokens",
            "min_tokens",
            "min_completion_tokens",
        ];
        as_written_but(&body, &prefill, &vllm_rewrites);
        as_written_but(&prefill, &body, &vllm_rewrites);
        assert_eq!(prefill.get("stream"), Some(json!(false)));
        assert_eq!(
            prefill.get("kv_transfer_params").and_then(|p| p.get("do_remote_decode").cloned()),
            Some(json!(true))
        );
        let both = sglang::with_bootstrap(&body, route, [10, 0, 0, 1].into(), 8998);
        as_written_but(&both, &body, &["bootstrap_host", "bootstrap_port", "bootstrap_room"]);
        as_written_but(&body, &both, &["bootstrap_host", "bootstrap_port", "bootstrap_room"]);
        assert!(both.contains_key("bootstrap_room"));
        let answer = body.to_value();
        if let Ok(params) = vllm::transfer_params(&answer) {
            assert!(params.is_object());
        }
        if let Ok(trtllm::AfterContext::Generate(params)) = trtllm::after_context(&answer) {
            assert_eq!(params.get("request_type"), Some(&json!("generation_only")));
        }
        let stream = trtllm::as_event_stream(&answer, route, true);
        assert!(stream.ends_with(b"data: [DONE]\n\n"));
    }
    let context = trtllm::context_body(&body, true);
    assert_eq!(context.get("stream"), Some(json!(false)));
    assert_eq!(context.get("max_tokens"), Some(json!(1)));
    // What a leg sends is a JSON object, read back as the sidecar reads the
    // client's (a `Value` would refuse numbers past f64's range, which JSON
    // allows and the engines read), and the client's fields the leg does not
    // rewrite are as written.
    let rewritten = ["disaggregated_params", "stream", "stream_options", "max_tokens", "max_completion_tokens"];
    as_written_but(&body, &context, &rewritten);
    as_written_but(&context, &body, &rewritten);
});

/// What `leg` sends reads back as a JSON object, as the sidecar reads a
/// client's; every field of `from` but the `rewritten` ones is in it as
/// written, byte for byte. (Called both ways: the client's fields reach
/// the leg, and the leg adds none but its rewrites.)
fn as_written_but(from: &Body, leg: &Body, rewritten: &[&str]) {
    let sent = Body::parse(&leg.to_vec());
    assert!(sent.is_ok(), "{:?}", String::from_utf8_lossy(&leg.to_vec()));
    let sent = sent.unwrap_or_default();
    for key in from.keys().filter(|k| !rewritten.contains(k)) {
        assert_eq!(sent.raw(key), from.raw(key), "{key}");
    }
}
