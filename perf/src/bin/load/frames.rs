//! One stream's messages as gRPC frames (1 byte compressed flag = 0,
//! 4 bytes big-endian length, the protobuf bytes), concatenated: the body
//! of a single HTTP/2 POST to `/envoy.service.ext_proc.v3.ExternalProcessor/Process`,
//! for tools that speak HTTP/2 but not gRPC (h2load's `-d`). The server
//! answers the bidi stream as it reads, so the whole stream in one
//! request body is a valid (pipelined) call.

use prost::Message as _;

use crate::script::Script;

pub const PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

/// Request number `n`'s stream, request then response path.
pub fn frames(script: &Script, n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for message in script.request_messages(n).iter().chain(&script.response) {
        let bytes = message.encode_to_vec();
        out.push(0);
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}
