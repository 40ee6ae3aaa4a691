//! SGLang's P/D wire (engines.md §4): the router sends the same body to a
//! prefill and a decode engine at once, with `bootstrap_host`,
//! `bootstrap_port` (the prefill's bootstrap server) and `bootstrap_room`
//! (a random u64 below 2^63) added, on `/v1/chat/completions`,
//! `/v1/completions` and `/generate`.
//!
//! - Prefill: needs `bootstrap_room` (else HTTP 400, as SGLang refuses a
//!   disaggregated request without a room), generates one token, offers
//!   the KV under the room on its bootstrap server (the side channel),
//!   waits up to `kv_wait_ms` for the decode to pull it, then answers. No
//!   pull in time: the request fails (HTTP 500, SGLang's "Prefill transfer
//!   failed") and its blocks are freed.
//! - Decode: needs the three fields (a missing port means SGLang's default,
//!   8998), asks the bootstrap server for the room, waiting up to
//!   `kv_wait_ms` for it to be ready, charges the transfer and decodes from
//!   the prefill's token. Unreachable or never ready: HTTP 500 or an error
//!   chunk, with SGLang's "Decode transfer failed for request …" message.

use std::time::Duration;

use serde_json::Value;

use super::legs::{DecodeLeg, FirstToken, Leg, OfferKey, PdReply, PrefillLeg, block_ids};
use super::side_channel::PullRequest;
use crate::config::{KvLoadFailurePolicy, PdRole};
use crate::http_server::{ApiError, HttpState};
use crate::scheduler::RequestSpec;

/// SGLang's `--disaggregation-bootstrap-port` default.
const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

pub(crate) fn plan(
    state: &HttpState,
    body: &Value,
    request_id: &str,
    spec: &mut RequestSpec,
) -> Result<(Leg, PdReply), ApiError> {
    let host = match body.get("bootstrap_host") {
        None | Some(Value::Null) => None,
        Some(Value::String(host)) if !host.is_empty() => Some(host.clone()),
        Some(_) => return Err(one_request("bootstrap_host must be a host name")),
    };
    let port = match body.get("bootstrap_port") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| one_request("bootstrap_port must be a port number"))?,
        ),
    };
    let room = match body.get("bootstrap_room") {
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request("Disaggregated request received without bootstrap room id"));
        }
        Some(v) => v
            .as_u64()
            .filter(|r| *r <= i64::MAX as u64)
            .ok_or_else(|| one_request("bootstrap_room must be an integer in [0, 2^63)"))?,
    };
    let key = format!("room:{room}");
    let wait = Duration::from_millis(state.config.kv_wait_ms);
    match state.config.pd_role {
        PdRole::Prefill => {
            // SGLang's prefill stops after the first token, whatever the
            // body asks: the decode generates the rest.
            spec.max_tokens = 1;
            let leg = PrefillLeg {
                key: OfferKey::Named(key),
                block_ids: block_ids(state, spec.prompt.len()),
                wait_for_pull: Some(wait),
                failure: format!(
                    "Prefill transfer failed for request rid={request_id} bootstrap_room={room} with exception \
                     KVTransferError(bootstrap_room={room}): "
                ),
            };
            Ok((Leg::Prefill(leg), PdReply::None))
        }
        PdRole::Decode => {
            let Some(host) = host else {
                return Err(ApiError::bad_request("Disaggregated request received without bootstrap host"));
            };
            let leg = DecodeLeg {
                host,
                port: port.unwrap_or(DEFAULT_BOOTSTRAP_PORT),
                pull: PullRequest { key, block_ids: None, wait },
                first_token: FirstToken::FromPrefill,
                recompute_last: false,
                on_failure: KvLoadFailurePolicy::Fail,
                failure: format!(
                    "Decode transfer failed for request rid={request_id} bootstrap_room={room} with exception \
                     KVTransferError(bootstrap_room={room}): "
                ),
            };
            Ok((Leg::Decode(leg), PdReply::None))
        }
        PdRole::Aggregated => Ok((Leg::Aggregated, PdReply::None)),
    }
}

/// A bootstrap field of the wrong type; lists (a batch) are not simulated.
fn one_request(problem: &str) -> ApiError {
    ApiError::bad_request(format!("{problem} (kvpick-sim serves one request per call, no lists)"))
}
