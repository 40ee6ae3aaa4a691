//! HTTP headers in and out: what kvpick reads from the gateway's request
//! and response headers, and the header mutations it sends back.
//!
//! Incoming values are read from `raw_value` (current Envoy) or `value`
//! (pseudo headers, older gateways). Outgoing values always go in
//! `raw_value` with `OVERWRITE_IF_EXISTS_OR_ADD`: current Envoy reads only
//! `raw_value` in mutations, agentgateway reads either.

use kvpick_proto::core::{HeaderAppendAction, HeaderMap, HeaderValue, HeaderValueOption};
use kvpick_proto::ext_proc::HeaderMutation;

/// Where the gateway sends the request (`ip:port`).
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The gateway's candidate subset, as a header (system-owned).
pub const DESTINATION_SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// The endpoint that served the request, as a header (system-owned).
pub const DESTINATION_SERVED: &str = "x-gateway-destination-endpoint-served";
/// GAIE conformance: the endpoints a test allows (`ip[:port],…`).
pub const CONFORMANCE_SELECTION: &str = "test-epp-endpoint-selection";
/// GAIE conformance: echoed on the response with the served endpoint.
pub const CONFORMANCE_SERVED: &str = "x-conformance-test-served-endpoint";

/// A client's session key (llm-d's session affinity): requests carrying
/// the same one prefer the worker that served the last.
pub const SESSION_TOKEN: &str = "x-session-token";
/// Longer session keys (from the header or the body) are ignored: a key
/// is an id, and kvpick keeps a table of them.
pub const MAX_SESSION_KEY_BYTES: usize = 256;

/// A session key as kvpick keeps it: non-empty, at most
/// [`MAX_SESSION_KEY_BYTES`].
pub fn session_key(raw: &[u8]) -> Option<String> {
    let key = std::str::from_utf8(raw).ok()?.trim();
    (!key.is_empty() && key.len() <= MAX_SESSION_KEY_BYTES).then(|| key.to_owned())
}

/// Headers only the gateway and kvpick may set: when a client sends them
/// they are removed before the request goes upstream, never trusted.
pub const SYSTEM_HEADERS: [&str; 6] = [
    DESTINATION,
    DESTINATION_SUBSET,
    DESTINATION_SERVED,
    "x-gateway-destination-endpoint-fallback",
    "x-gateway-destination-endpoint-fallbacks",
    "x-prefiller-host-port",
];

/// A header's value as bytes: `raw_value` when set, else `value`.
pub fn value_bytes(header: &HeaderValue) -> &[u8] {
    if header.raw_value.is_empty() { header.value.as_bytes() } else { &header.raw_value }
}

/// The first value of `name` (lower-case) in the map.
pub fn find<'a>(map: Option<&'a HeaderMap>, name: &str) -> Option<&'a [u8]> {
    map?.headers.iter().find(|h| h.key.eq_ignore_ascii_case(name)).map(value_bytes)
}

/// A header set with overwrite, value in `raw_value`.
pub fn set_header(key: &str, value: &[u8]) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue { key: key.to_owned(), value: String::new(), raw_value: value.to_vec() }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        // `append` (deprecated) stays unset: `append_action` rules.
        ..Default::default()
    }
}

/// What the request path needs from the request headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestHeaders {
    pub method: String,
    pub path: String,
    /// `test-epp-endpoint-selection`, when present (read only when the
    /// conformance hooks are on).
    pub conformance_selection: Option<String>,
    /// System headers the client sent, to be removed.
    pub client_system_headers: Vec<&'static str>,
    /// `x-session-token`, when usable (see [`session_key`]).
    pub session: Option<String>,
}

impl RequestHeaders {
    pub fn read(map: Option<&HeaderMap>) -> Self {
        let text = |name| find(map, name).map(|v| String::from_utf8_lossy(v).into_owned());
        let client_system_headers = SYSTEM_HEADERS.iter().copied().filter(|name| find(map, name).is_some()).collect();
        RequestHeaders {
            method: text(":method").unwrap_or_default(),
            path: text(":path").unwrap_or_default(),
            conformance_selection: text(CONFORMANCE_SELECTION),
            client_system_headers,
            session: find(map, SESSION_TOKEN).and_then(session_key),
        }
    }

    /// The path without its query string.
    pub fn route(&self) -> &str {
        self.path.split('?').next().unwrap_or_default()
    }

    /// Removal of the system headers the client sent; nothing to set.
    pub fn strip_mutation(&self) -> Option<HeaderMutation> {
        self.strip_list().map(|remove_headers| HeaderMutation { set_headers: Vec::new(), remove_headers })
    }

    fn strip_list(&self) -> Option<Vec<String>> {
        // The destination header is overwritten by the pick, not removed.
        let remove: Vec<String> = self
            .client_system_headers
            .iter()
            .filter(|name| **name != DESTINATION)
            .map(|name| (*name).to_owned())
            .collect();
        (!remove.is_empty()).then_some(remove)
    }

    /// The pick's header plus removal of the client's system headers.
    pub fn pick_mutation(&self, destination: &str) -> HeaderMutation {
        HeaderMutation {
            set_headers: vec![set_header(DESTINATION, destination.as_bytes())],
            remove_headers: self.strip_list().unwrap_or_default(),
        }
    }
}

/// What the response path needs from the response headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeaders {
    pub status: Option<u16>,
    /// `content-type: text/event-stream`: usage comes in SSE `data:` lines.
    pub event_stream: bool,
}

impl ResponseHeaders {
    pub fn read(map: Option<&HeaderMap>) -> Self {
        let status = find(map, ":status").and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| s.trim().parse().ok());
        let event_stream = find(map, "content-type")
            .is_some_and(|v| v.len() >= 17 && v[..17].eq_ignore_ascii_case(b"text/event-stream"));
        ResponseHeaders { status, event_stream }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str, bool)]) -> HeaderMap {
        HeaderMap {
            headers: pairs
                .iter()
                .map(|(k, v, raw)| HeaderValue {
                    key: (*k).to_owned(),
                    value: if *raw { String::new() } else { (*v).to_owned() },
                    raw_value: if *raw { v.as_bytes().to_vec() } else { Vec::new() },
                })
                .collect(),
        }
    }

    #[test]
    fn reads_raw_value_and_value() {
        let m = map(&[(":path", "/v1/chat/completions?x=1", false), (":method", "POST", true)]);
        let h = RequestHeaders::read(Some(&m));
        assert_eq!(h.method, "POST");
        assert_eq!(h.route(), "/v1/chat/completions");
    }

    #[test]
    fn client_system_headers_are_stripped_and_destination_overwritten() {
        let m = map(&[
            ("x-gateway-destination-endpoint", "6.6.6.6:80", true),
            ("x-prefiller-host-port", "6.6.6.6:81", true),
            ("hi", "mom", true),
        ]);
        let h = RequestHeaders::read(Some(&m));
        let mutation = h.pick_mutation("10.0.0.1:8000");
        assert_eq!(mutation.remove_headers, vec!["x-prefiller-host-port".to_owned()]);
        let set = mutation.set_headers[0].header.as_ref().map(|h| (h.key.as_str(), h.raw_value.as_slice()));
        assert_eq!(set, Some((DESTINATION, b"10.0.0.1:8000".as_slice())));
        assert_eq!(mutation.set_headers[0].append_action, HeaderAppendAction::OverwriteIfExistsOrAdd as i32);
    }

    #[test]
    fn event_stream_content_type() {
        let m = map(&[(":status", "200", false), ("content-type", "text/event-stream; charset=utf-8", true)]);
        assert_eq!(ResponseHeaders::read(Some(&m)), ResponseHeaders { status: Some(200), event_stream: true });
    }
}
