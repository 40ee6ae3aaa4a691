//! Headers on the way to an engine and back: what the sidecar strips
//! (orchestration headers no engine may see, hop-by-hop ones that belong to
//! one connection) and the hand-off header it adds for the EPP.

use hyper::HeaderMap;
use hyper::header::{self, HeaderName, HeaderValue};
use kvpick_ext_proc::headers::SYSTEM_HEADERS;

/// The request id both legs share (vLLM's proxy sets it; engines use it
/// as the request's id, so one id names the request on both engines).
pub const REQUEST_ID: &str = "x-request-id";

/// Hop-by-hop headers (RFC 9110 §7.6.1) and the length a rewritten body
/// changes: never forwarded.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::HOST,
    header::CONTENT_LENGTH,
];

/// Removes what no engine may see: the gateway's and the EPP's headers
/// (a client could have sent them too), `keep-alive`/`proxy-connection`,
/// hop-by-hop ones and any named by `Connection`.
pub fn strip_for_engine(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(str::trim).filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok()))
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    for name in SYSTEM_HEADERS.iter().copied().chain(["keep-alive", "proxy-connection"]) {
        headers.remove(name);
    }
}

/// Headers of an engine's answer that belong to its connection, not to the
/// answer the client gets.
pub fn strip_from_engine(headers: &mut HeaderMap) {
    for name in [header::CONNECTION, header::TRANSFER_ENCODING, header::UPGRADE, header::TRAILER] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

/// The request's id: the client's `x-request-id` when it is a sane token,
/// else a fresh random one.
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
    let given = headers.get(REQUEST_ID).filter(|v| {
        let b = v.as_bytes();
        !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
    });
    match given {
        Some(v) => v.clone(),
        None => {
            let id = format!("kvpick-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
            HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("kvpick"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orchestration_and_hop_by_hop_headers_never_reach_an_engine() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-prefiller-host-port", "10.0.0.1:8000"),
            ("x-gateway-destination-endpoint", "10.0.0.2:8000"),
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-length", "12"),
            ("authorization", "Bearer t"),
            ("x-request-id", "abc"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        strip_for_engine(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "x-request-id"]);
    }

    #[test]
    fn a_sane_request_id_is_kept_and_others_replaced() {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("chat-42_a.b:c"));
        assert_eq!(request_id(&h), "chat-42_a.b:c");
        h.insert(REQUEST_ID, HeaderValue::from_static("a b"));
        assert!(request_id(&h).to_str().is_ok_and(|v| v.starts_with("kvpick-") && v.len() == 39));
    }
}
