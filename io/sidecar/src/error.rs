//! Errors the sidecar answers itself, in the OpenAI shape the engines use
//! (`{"error": {message, type, code}}`), so a client cannot tell a
//! sidecar's refusal from an engine's by its form.

use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use kvpick_ext_proc::headers::{PD_HANDOFF, PD_REASON};
use serde_json::json;

use crate::body::{Boxed, full};

pub fn openai_error(status: StatusCode, kind: &str, message: &str) -> Response<Boxed> {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}});
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A P/D request the sidecar gave up on: the error and, for the EPP, that
/// nothing is prefilled any more (its booking goes with the answer).
pub fn pd_failure(status: StatusCode, reason: &'static str, message: &str) -> Response<Boxed> {
    let mut response = openai_error(status, "kvpick_sidecar_error", message);
    response.headers_mut().insert(PD_HANDOFF, HeaderValue::from_static("failed"));
    response.headers_mut().insert(PD_REASON, HeaderValue::from_static(reason));
    response
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn errors_have_the_openai_shape() {
        let response = pd_failure(StatusCode::GATEWAY_TIMEOUT, "timeout", "the prefill leg took longer than 60 s");
        assert_eq!(response.status(), 504);
        assert_eq!(response.headers().get(PD_REASON).map(|v| v.as_bytes()), Some(&b"timeout"[..]));
        let bytes = response.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        assert_eq!(value.pointer("/error/code"), Some(&json!(504)));
        assert_eq!(value.pointer("/error/message"), Some(&json!("the prefill leg took longer than 60 s")));
    }
}
