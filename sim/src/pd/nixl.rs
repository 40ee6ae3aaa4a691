//! vLLM's P/D wire with the NixlConnector (engines.md §3): the top-level
//! `kv_transfer_params` of `/v1/completions`, `/v1/chat/completions` and
//! `/inference/v1/generate`, in requests and answers.
//!
//! - A prefill engine (`kv_producer`) given `do_remote_decode: true`
//!   computes the request; since it finishes capped by `max_tokens` (the
//!   sim has no EOS: always), it holds the prompt's blocks under the lease
//!   and answers (JSON only; a stream carries no params) with
//!   `{do_remote_prefill: true, do_remote_decode: false, remote_block_ids,
//!   remote_engine_id, remote_request_id, remote_host, remote_port,
//!   tp_size: 1, remote_num_tokens, remote_blocks_expiry_time}`.
//! - A decode engine (`kv_consumer`) given `do_remote_prefill: true` needs
//!   those fields (else HTTP 400), pulls the blocks from
//!   `remote_host:remote_port`, then computes only the prompt's last token
//!   (vLLM recomputes it even when every block arrived) and decodes. A
//!   failed pull follows `kv_load_failure_policy` (default `fail`).
//! - Anything else runs aggregated, as vLLM ignores params its connector
//!   role does not act on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use super::legs::{DecodeLeg, FirstToken, Leg, OfferKey, PdReply, PrefillLeg, block_ids};
use super::side_channel::PullRequest;
use crate::config::PdRole;
use crate::http_server::{ApiError, HttpState};
use crate::scheduler::RequestSpec;

/// The fields a decode engine needs from the prefill's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RemotePrefill {
    request_id: String,
    block_ids: Vec<u64>,
    host: String,
    port: u16,
}

pub(crate) fn plan(
    state: &HttpState,
    body: &Value,
    request_id: &str,
    spec: &RequestSpec,
    stream: bool,
) -> Result<(Leg, PdReply), ApiError> {
    let params = match body.get("kv_transfer_params") {
        None | Some(Value::Null) => return Ok((Leg::Aggregated, PdReply::None)),
        Some(Value::Object(params)) => params,
        Some(_) => return Err(ApiError::bad_request("kv_transfer_params must be an object")),
    };
    match state.config.pd_role {
        PdRole::Prefill if flag(params, "do_remote_decode")? => {
            let block_ids = block_ids(state, spec.prompt.len());
            let reply =
                if stream { PdReply::None } else { PdReply::Nixl(prefill_params(state, request_id, spec, &block_ids)) };
            let leg = PrefillLeg {
                key: OfferKey::Named(offer_key(request_id)),
                block_ids,
                wait_for_pull: None,
                failure: String::new(),
            };
            Ok((Leg::Prefill(leg), reply))
        }
        PdRole::Decode if flag(params, "do_remote_prefill")? => {
            let remote = RemotePrefill::parse(params)?;
            let leg = DecodeLeg {
                host: remote.host,
                port: remote.port,
                pull: PullRequest {
                    key: offer_key(&remote.request_id),
                    block_ids: Some(remote.block_ids),
                    wait: Duration::ZERO,
                },
                first_token: FirstToken::Own,
                recompute_last: true,
                on_failure: state.config.kv_load_failure_policy,
                failure: format!("KV load failed for request {request_id}: "),
            };
            Ok((Leg::Decode(leg), PdReply::None))
        }
        _ => Ok((Leg::Aggregated, PdReply::None)),
    }
}

/// The side-channel key of a vLLM prefill's blocks.
fn offer_key(request_id: &str) -> String {
    format!("vllm:{request_id}")
}

fn flag(params: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::bad_request(format!("kv_transfer_params.{name} must be a boolean, not {other}"))),
    }
}

/// The prefill's answer's `kv_transfer_params`.
fn prefill_params(state: &HttpState, request_id: &str, spec: &RequestSpec, block_ids: &[u64]) -> Value {
    let expiry = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
        + state.config.kv_lease_ms as f64 / 1000.0;
    let (host, port) = match state.side_channel {
        Some(addr) => (Value::String(addr.ip().to_string()), json!(addr.port())),
        None => (Value::Null, Value::Null),
    };
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": block_ids,
        "remote_engine_id": state.engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
        "remote_num_tokens": spec.prompt.len(),
        "remote_blocks_expiry_time": expiry,
    })
}

impl RemotePrefill {
    fn parse(params: &Map<String, Value>) -> Result<Self, ApiError> {
        let missing = |name: &str, what: &str| {
            ApiError::bad_request(format!("kv_transfer_params.{name} must be {what} when do_remote_prefill is set"))
        };
        let string = |name: &str| match params.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            _ => Err(missing(name, "a non-empty string")),
        };
        string("remote_engine_id")?;
        let request_id = string("remote_request_id")?;
        let host = string("remote_host")?;
        let port = params
            .get("remote_port")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .ok_or_else(|| missing("remote_port", "a port number"))?;
        let block_ids = match params.get("remote_block_ids") {
            Some(Value::Array(ids)) => {
                flat_block_ids(ids).ok_or_else(|| missing("remote_block_ids", "a list of block ids"))?
            }
            _ => return Err(missing("remote_block_ids", "a list of block ids")),
        };
        for (name, what) in [("tp_size", "an integer"), ("remote_num_tokens", "an integer")] {
            if params.get(name).is_some_and(|v| !v.is_null() && !v.is_u64()) {
                return Err(missing(name, what));
            }
        }
        if params.get("remote_blocks_expiry_time").is_some_and(|v| !v.is_null() && !v.is_number()) {
            return Err(missing("remote_blocks_expiry_time", "a number"));
        }
        Ok(RemotePrefill { request_id, block_ids, host, port })
    }
}

/// Block ids as a flat list, or per KV-cache group (`[[…]]`, vLLM's hybrid
/// KV cache manager) of which the sim has one.
fn flat_block_ids(ids: &[Value]) -> Option<Vec<u64>> {
    match ids.first() {
        Some(Value::Array(group)) if ids.len() == 1 => group.iter().map(Value::as_u64).collect(),
        _ => ids.iter().map(Value::as_u64).collect(),
    }
}
