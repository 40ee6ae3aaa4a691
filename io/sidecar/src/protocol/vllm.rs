//! vLLM with the NixlConnector (engines.md §3, after vLLM's own proxy in
//! `tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`): the
//! prefill leg asks for remote decode and stops after one token, so its
//! blocks are sent (vLLM sends them only for a length-capped finish); the
//! decode leg is the client's request plus the prefill's
//! `kv_transfer_params`, passed through verbatim.

use serde_json::{Value, json};

use super::{Body, Route, Unusable};

/// The prefill leg's body.
pub fn prefill_body(original: &Body, route: Route) -> Body {
    let mut body = original.clone();
    body.insert(
        "kv_transfer_params",
        json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null,
        }),
    );
    body.insert("stream", Value::Bool(false));
    body.remove("stream_options");
    if route == Route::VllmGenerate {
        // GenerateRequest carries resolved sampling parameters (a missing
        // or null one becomes an object: the cap must hold).
        let mut params = body.get("sampling_params").and_then(|p| p.as_object().cloned()).unwrap_or_default();
        params.insert("max_tokens".into(), json!(1));
        params.remove("min_tokens");
        body.insert("sampling_params", Value::Object(params));
    } else {
        body.insert("max_tokens", json!(1));
        if body.contains_key("max_completion_tokens") {
            body.insert("max_completion_tokens", json!(1));
        }
        body.remove("min_tokens");
        body.remove("min_completion_tokens");
    }
    body
}

/// The prefill's transfer parameters, from its answer (top level on every
/// route, including `/inference/v1/generate`'s `GenerateResponse`).
pub fn transfer_params(answer: &Value) -> Result<Value, Unusable> {
    match answer.get("kv_transfer_params") {
        Some(params @ Value::Object(map)) if !map.is_empty() => Ok(params.clone()),
        Some(Value::Null) | None => Err(Unusable(
            "the prefill answer has no kv_transfer_params (is the prefill engine's connector NixlConnector with kv_role kv_producer or kv_both?)"
                .into(),
        )),
        Some(other) => Err(Unusable(format!("the prefill answer's kv_transfer_params is not an object: {other}"))),
    }
}

/// The decode leg's body: the client's, with the transfer parameters.
pub fn decode_body(original: &Body, params: Value) -> Body {
    let mut body = original.clone();
    body.insert("kv_transfer_params", params);
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::object;

    #[test]
    fn the_prefill_leg_asks_for_remote_decode_and_one_token_unstreamed() {
        let original = object(json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true,
            "stream_options": {"include_usage": true}, "max_tokens": 300, "max_completion_tokens": 300,
            "min_tokens": 5, "temperature": 0.3, "tools": [], "kv_transfer_params": {"from": "client"}
        }));
        let body = prefill_body(&original, Route::Chat).to_value();
        assert_eq!(
            body,
            json!({
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false,
                "max_tokens": 1, "max_completion_tokens": 1, "temperature": 0.3, "tools": [],
                "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
                    "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}
            })
        );
        // Without max_completion_tokens, none is added.
        let plain = prefill_body(&object(json!({"prompt": "x"})), Route::Completions);
        assert!(!plain.contains_key("max_completion_tokens"));
        assert_eq!(plain.get("max_tokens"), Some(json!(1)));
    }

    #[test]
    fn generate_requests_cap_their_sampling_params() {
        let original = object(json!({
            "request_id": "r", "token_ids": [1, 2, 3], "model": "m", "stream": true,
            "sampling_params": {"max_tokens": 64, "min_tokens": 2, "temperature": 0.0}
        }));
        let body = prefill_body(&original, Route::VllmGenerate);
        assert_eq!(body.get("sampling_params"), Some(json!({"max_tokens": 1, "temperature": 0.0})));
        assert_eq!(body.get("stream"), Some(json!(false)));
        let null = prefill_body(&object(json!({"token_ids": [1], "sampling_params": null})), Route::VllmGenerate);
        assert_eq!(null.get("sampling_params"), Some(json!({"max_tokens": 1})), "a null one is capped too");
        assert!(!body.contains_key("max_tokens"), "GenerateRequest has no top-level max_tokens");
    }

    #[test]
    fn the_prefills_parameters_reach_the_decode_leg_verbatim() {
        // What a NixlConnector prefill answers (pull_scheduler.request_finished).
        let answer = json!({
            "id": "cmpl-1", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "length"}],
            "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
                "remote_block_ids": [[0, 1, 2, 3]], "remote_engine_id": "e-1", "remote_request_id": "r-1",
                "remote_host": "10.0.0.1", "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 61,
                "remote_blocks_expiry_time": 1_767_225_600.5, "a_field_from_the_future": [1]}
        });
        let params = transfer_params(&answer).unwrap_or_else(|e| panic!("{e}"));
        let original = object(json!({"model": "m", "stream": true, "max_tokens": 300}));
        let body = decode_body(&original, params.clone());
        assert_eq!(body.get("kv_transfer_params").as_ref(), answer.get("kv_transfer_params"));
        assert_eq!(body.get("max_tokens"), Some(json!(300)));
        assert_eq!(body.get("stream"), Some(json!(true)));
        for bad in [json!({}), json!({"kv_transfer_params": null}), json!({"kv_transfer_params": {}})] {
            assert!(transfer_params(&bad).is_err(), "{bad}");
        }
        assert!(transfer_params(&json!({"kv_transfer_params": "x"})).unwrap_err().0.contains("not an object"));
    }
}
