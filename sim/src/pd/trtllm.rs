//! TensorRT-LLM's P/D wire (engines.md §5): `disaggregated_params` in
//! requests and in `choices[0]` of answers.
//!
//! - Context engine (`PdRole::Prefill`): `{"request_type": "context_only"}`
//!   (sent with `stream: false`; a stream is refused with HTTP 400)
//!   computes the prompt and one token (older disagg servers also set
//!   `max_tokens: 1`; the same) and answers with finish reason `length`
//!   and `choices[0].disaggregated_params = {request_type: "context_only",
//!   first_gen_tokens: [token], ctx_request_id: <int>,
//!   encoded_opaque_state: <base64>, draft_tokens: null, …}`, holding the
//!   prompt's blocks under the lease. The opaque state is the base64 of
//!   the sim's JSON `{"host", "port", "block_ids"}`: where to pull from.
//! - Generation engine (`PdRole::Decode`): `request_type:
//!   "generation_only"` needs `ctx_request_id`, `first_gen_tokens` and
//!   `encoded_opaque_state` (else HTTP 400), pulls the KV and answers from
//!   `first_gen_tokens[0]` on. A failed pull fails the request (HTTP 500).
//! - `context_and_generation`, or a type this role does not serve, runs
//!   aggregated.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::legs::{DecodeLeg, FirstToken, Leg, OfferKey, PdReply, PrefillLeg, block_ids};
use super::side_channel::PullRequest;
use crate::config::{KvLoadFailurePolicy, PdRole};
use crate::http_server::{ApiError, HttpState};
use crate::scheduler::{RequestId, RequestSpec};

/// What a context answer's `disaggregated_params` is made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ContextReply {
    side_channel: Option<SocketAddr>,
    block_ids: Vec<u64>,
}

impl ContextReply {
    /// `choices[0].disaggregated_params` of the context answer of request
    /// `id`, whose first token was `first_token`.
    pub(crate) fn params(&self, id: RequestId, first_token: Option<u32>) -> Value {
        let (host, port) = match self.side_channel {
            Some(addr) => (addr.ip().to_string(), addr.port()),
            None => (String::new(), 0),
        };
        let opaque = json!({"host": host, "port": port, "block_ids": self.block_ids}).to_string();
        json!({
            "request_type": "context_only",
            "first_gen_tokens": first_token.into_iter().collect::<Vec<u32>>(),
            "ctx_request_id": id,
            "encoded_opaque_state": STANDARD.encode(opaque),
            "draft_tokens": null,
            "disagg_request_id": null,
            "ctx_dp_rank": 0,
            "ctx_info_endpoint": null,
            "schedule_style": null,
        })
    }
}

/// The side-channel key of a context request's blocks.
pub(crate) fn offer_key(ctx_request_id: RequestId) -> String {
    format!("ctx:{ctx_request_id}")
}

pub(crate) fn plan(
    state: &HttpState,
    body: &Value,
    spec: &mut RequestSpec,
    stream: bool,
) -> Result<(Leg, PdReply), ApiError> {
    let params = match body.get("disaggregated_params") {
        None | Some(Value::Null) => return Ok((Leg::Aggregated, PdReply::None)),
        Some(Value::Object(params)) => params,
        Some(_) => return Err(ApiError::bad_request("disaggregated_params must be an object")),
    };
    let request_type = match params.get("request_type") {
        Some(Value::String(t)) => t.as_str(),
        _ => return Err(ApiError::bad_request("disaggregated_params.request_type must be a string")),
    };
    match (request_type, state.config.pd_role) {
        ("context_only", PdRole::Prefill) => {
            if stream {
                return Err(ApiError::bad_request("context_only requests must be sent with stream false"));
            }
            // The context phase ends with its first token.
            spec.max_tokens = 1;
            let block_ids = block_ids(state, spec.prompt.len());
            let reply = ContextReply { side_channel: state.side_channel, block_ids: block_ids.clone() };
            let leg =
                PrefillLeg { key: OfferKey::CtxRequestId, block_ids, wait_for_pull: None, failure: String::new() };
            Ok((Leg::Prefill(leg), PdReply::Trtllm(reply)))
        }
        ("generation_only", PdRole::Decode) => Ok((Leg::Decode(generation_leg(params)?), PdReply::None)),
        ("context_only" | "generation_only" | "context_and_generation", _) => Ok((Leg::Aggregated, PdReply::None)),
        (other, _) => Err(ApiError::bad_request(format!(
            "disaggregated_params.request_type {other:?} is not one of context_only, generation_only, \
             context_and_generation"
        ))),
    }
}

fn generation_leg(params: &Map<String, Value>) -> Result<DecodeLeg, ApiError> {
    let bad = |what: &str| ApiError::bad_request(format!("generation_only requests need {what}"));
    let ctx_request_id =
        params.get("ctx_request_id").and_then(Value::as_u64).ok_or_else(|| bad("an integer ctx_request_id"))?;
    let first = params
        .get("first_gen_tokens")
        .and_then(Value::as_array)
        .and_then(|tokens| tokens.first())
        .and_then(Value::as_u64)
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| bad("first_gen_tokens, a non-empty list of token ids"))?;
    let opaque = params
        .get("encoded_opaque_state")
        .and_then(Value::as_str)
        .and_then(|s| STANDARD.decode(s).ok())
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .ok_or_else(|| bad("the encoded_opaque_state of the context answer"))?;
    let host = opaque.get("host").and_then(Value::as_str).filter(|h| !h.is_empty());
    let port = opaque.get("port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0);
    let block_ids = opaque
        .get("block_ids")
        .and_then(Value::as_array)
        .and_then(|ids| ids.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>());
    let (Some(host), Some(port), Some(block_ids)) = (host, port, block_ids) else {
        return Err(bad("the encoded_opaque_state of the context answer"));
    };
    Ok(DecodeLeg {
        host: host.to_owned(),
        port,
        pull: PullRequest { key: offer_key(ctx_request_id), block_ids: Some(block_ids), wait: Duration::ZERO },
        first_token: FirstToken::Given(first),
        recompute_last: false,
        on_failure: KvLoadFailurePolicy::Fail,
        failure: format!("KV cache transfer failed for ctx_request_id {ctx_request_id}: "),
    })
}
