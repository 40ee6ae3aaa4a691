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
/// The prefill endpoint (`ip:port`) of a disaggregated pick, for the
/// decode pod's sidecar: the form llm-d's sidecar and Dynamo's EPP use.
pub const PREFILLER: &str = "x-prefiller-host-port";
/// The decode sidecar's hand-off (`kvpick sidecar`), on a split request's
/// answer headers: `disaggregated` when the prefill leg is over (its
/// engine has handed the KV over, so the EPP releases the prefill booking
/// then, not at the first token), `aggregated` when the request ran whole
/// on the decode engine.
pub const PD_HANDOFF: &str = "x-kvpick-pd";
/// Why a request the EPP split ran whole (`prefill_failed`, …).
pub const PD_REASON: &str = "x-kvpick-pd-reason";
/// How long the prefill leg took at the sidecar, in milliseconds.
pub const PREFILL_MS: &str = "x-kvpick-prefill-ms";
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
    PREFILLER,
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
        self.strip_list_but(&[])
    }

    /// The client's system headers to remove, but those the pick sets:
    /// the destination always (set with overwrite, as is `set`), so no
    /// gateway's order of removals and sets can drop the pick's value.
    fn strip_list_but(&self, set: &[&str]) -> Option<Vec<String>> {
        let remove: Vec<String> = self
            .client_system_headers
            .iter()
            .filter(|name| **name != DESTINATION && !set.contains(name))
            .map(|name| (*name).to_owned())
            .collect();
        (!remove.is_empty()).then_some(remove)
    }

    /// The pick's headers (the destination and, for a disaggregated pick,
    /// the prefill endpoint) plus removal of the client's system headers.
    pub fn pick_mutation(&self, destination: &str, prefiller: Option<&str>) -> HeaderMutation {
        let mut set_headers = vec![set_header(DESTINATION, destination.as_bytes())];
        let mut set = Vec::new();
        if let Some(prefiller) = prefiller {
            set_headers.push(set_header(PREFILLER, prefiller.as_bytes()));
            set.push(PREFILLER);
        }
        HeaderMutation { set_headers, remove_headers: self.strip_list_but(&set).unwrap_or_default() }
    }
}

/// What the response path needs from the response headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeaders {
    pub status: Option<u16>,
    /// `content-type: text/event-stream`: usage comes in SSE `data:` lines.
    pub event_stream: bool,
    /// What the decode sidecar's hand-off header says, when there is one.
    pub pd: Option<PdRan>,
}

/// How the decode sidecar ran a request (`x-kvpick-pd`). Whichever, no
/// prefill leg is left running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdRan {
    /// Prefilled on the prefill engine, which has handed over.
    Disaggregated = 0,
    /// Run whole on the decode engine: no prefiller was named, or the
    /// sidecar fell back from a failed prefill leg (the reason is in
    /// `x-kvpick-pd-reason`).
    Aggregated = 1,
    /// Failed, or a value this kvpick does not know.
    Failed = 2,
}

impl PdRan {
    pub const LABELS: [&'static str; 3] = ["disaggregated", "aggregated", "failed"];

    fn parse(value: &[u8]) -> PdRan {
        let value = value.trim_ascii();
        if value.eq_ignore_ascii_case(b"disaggregated") {
            PdRan::Disaggregated
        } else if value.eq_ignore_ascii_case(b"aggregated") {
            PdRan::Aggregated
        } else {
            PdRan::Failed
        }
    }

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }
}

impl ResponseHeaders {
    pub fn read(map: Option<&HeaderMap>) -> Self {
        let status = find(map, ":status").and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| s.trim().parse().ok());
        let event_stream = find(map, "content-type")
            .is_some_and(|v| v.len() >= 17 && v[..17].eq_ignore_ascii_case(b"text/event-stream"));
        let pd = find(map, PD_HANDOFF).map(PdRan::parse);
        ResponseHeaders { status, event_stream, pd }
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
        let mutation = h.pick_mutation("10.0.0.1:8000", None);
        assert_eq!(mutation.remove_headers, vec!["x-prefiller-host-port".to_owned()]);
        let set = mutation.set_headers[0].header.as_ref().map(|h| (h.key.as_str(), h.raw_value.as_slice()));
        assert_eq!(set, Some((DESTINATION, b"10.0.0.1:8000".as_slice())));
        assert_eq!(mutation.set_headers[0].append_action, HeaderAppendAction::OverwriteIfExistsOrAdd as i32);

        // A disaggregated pick overwrites the client's prefiller with its own.
        let mutation = h.pick_mutation("10.0.0.1:8000", Some("10.0.0.9:8000"));
        assert!(mutation.remove_headers.is_empty(), "{:?}", mutation.remove_headers);
        let set: Vec<_> = mutation
            .set_headers
            .iter()
            .filter_map(|o| o.header.as_ref().map(|h| (h.key.as_str(), h.raw_value.as_slice(), o.append_action)))
            .collect();
        let overwrite = HeaderAppendAction::OverwriteIfExistsOrAdd as i32;
        assert_eq!(
            set,
            [
                (DESTINATION, b"10.0.0.1:8000".as_slice(), overwrite),
                (PREFILLER, b"10.0.0.9:8000".as_slice(), overwrite)
            ]
        );
    }

    #[test]
    fn event_stream_content_type() {
        let m = map(&[(":status", "200", false), ("content-type", "text/event-stream; charset=utf-8", true)]);
        assert_eq!(
            ResponseHeaders::read(Some(&m)),
            ResponseHeaders { status: Some(200), event_stream: true, pd: None }
        );
    }

    #[test]
    fn the_sidecars_hand_off_is_read() {
        for (value, pd) in [
            ("disaggregated", PdRan::Disaggregated),
            (" Disaggregated ", PdRan::Disaggregated),
            ("aggregated", PdRan::Aggregated),
            ("AGGREGATED", PdRan::Aggregated),
            ("failed", PdRan::Failed),
            ("", PdRan::Failed),
            ("split", PdRan::Failed),
        ] {
            let m = map(&[(":status", "200", false), (PD_HANDOFF, value, true)]);
            assert_eq!(ResponseHeaders::read(Some(&m)).pd, Some(pd), "{value}");
        }
        assert_eq!(ResponseHeaders::read(Some(&map(&[(":status", "200", false)]))).pd, None);
    }
}
