//! `x-prefiller-host-port`: where the EPP says the prompt is prefilled,
//! read as the only thing the sidecar trusts it to be — one or a few
//! `ip:port` endpoints of the pool — and refused otherwise.

use std::net::SocketAddr;

use hyper::HeaderMap;
use kvpick_ext_proc::headers::PREFILLER;

use crate::config::PrefillAllow;

/// More endpoints than this in one request is not an EPP talking.
const MAX_ENDPOINTS: usize = 16;
/// `[ffff:…]:65535` is 47 bytes; anything much longer is not an endpoint.
const MAX_ITEM_BYTES: usize = 64;

/// What a request's header says about its prefill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prefiller {
    /// No header: the EPP kept the request whole.
    Absent,
    /// Prefill there.
    At(SocketAddr),
    /// The header names this decode pod itself: nothing to split.
    Local,
    /// A value that is not a list of `ip:port`; why.
    Invalid(&'static str),
    /// A well-formed endpoint outside the allowlist.
    Denied(SocketAddr),
}

impl Prefiller {
    /// Reads every value of the header. Several endpoints (as a list or as
    /// repeated headers, llm-d's sidecar takes both) are a choice: one is
    /// taken at random, as llm-d does, once all have been checked.
    pub fn read(headers: &HeaderMap, allow: &PrefillAllow, local: &[SocketAddr]) -> Prefiller {
        let mut found = Vec::new();
        for value in headers.get_all(PREFILLER) {
            let Ok(text) = value.to_str() else {
                return Prefiller::Invalid("not ASCII");
            };
            for item in text.split(',').map(str::trim) {
                if item.is_empty() {
                    return Prefiller::Invalid("an empty endpoint");
                }
                if item.len() > MAX_ITEM_BYTES {
                    return Prefiller::Invalid("an endpoint too long to be ip:port");
                }
                if found.len() == MAX_ENDPOINTS {
                    return Prefiller::Invalid("too many endpoints");
                }
                let Ok(endpoint) = item.parse::<SocketAddr>() else {
                    return Prefiller::Invalid("not ip:port");
                };
                if let Some(why) = unroutable(endpoint) {
                    return Prefiller::Invalid(why);
                }
                if !allow.allows(endpoint) {
                    return Prefiller::Denied(endpoint);
                }
                found.push(endpoint);
            }
        }
        match found.len() {
            0 => Prefiller::Absent,
            n => {
                let endpoint = found[fastrand::usize(..n)];
                if local.contains(&endpoint) { Prefiller::Local } else { Prefiller::At(endpoint) }
            }
        }
    }
}

/// Addresses no prefill engine can have.
fn unroutable(endpoint: SocketAddr) -> Option<&'static str> {
    let ip = endpoint.ip();
    if endpoint.port() == 0 {
        Some("port 0")
    } else if ip.is_unspecified() {
        Some("an unspecified address")
    } else if ip.is_multicast() || ip == std::net::Ipv4Addr::BROADCAST {
        Some("a multicast or broadcast address")
    } else if link_local(ip) {
        // Cloud metadata services live there (169.254.169.254); no pod does.
        Some("a link-local address")
    } else {
        None
    }
}

fn link_local(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_link_local(),
        std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    fn read(values: &[&[u8]], allow: &str) -> Prefiller {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(PREFILLER, HeaderValue::from_bytes(v).unwrap_or_else(|e| panic!("{e}")));
        }
        let local = ["10.0.0.9:8000".parse().unwrap_or_else(|e| panic!("{e}"))];
        Prefiller::read(&headers, &allow.parse().unwrap_or_default(), &local)
    }

    fn at(s: &str) -> Prefiller {
        Prefiller::At(s.parse().unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn endpoints_are_read_and_hostile_values_refused() {
        assert_eq!(read(&[], ""), Prefiller::Absent);
        assert_eq!(read(&[b"10.0.0.1:8000"], ""), at("10.0.0.1:8000"));
        assert_eq!(read(&[b" [fd00::1]:8000 "], ""), at("[fd00::1]:8000"));
        assert_eq!(read(&[b"10.0.0.9:8000"], ""), Prefiller::Local);
        // A list and repeated headers are a choice among checked endpoints.
        let two = read(&[b"10.0.0.1:8000, 10.0.0.2:8000"], "");
        assert!(two == at("10.0.0.1:8000") || two == at("10.0.0.2:8000"), "{two:?}");
        assert_eq!(read(&[b"10.0.0.1:8000", b"10.0.0.1:8000"], ""), at("10.0.0.1:8000"));
        for (value, why) in [
            (&b"prefill.svc:8000"[..], "not ip:port"),
            (b"10.0.0.1", "not ip:port"),
            (b"10.0.0.1:0", "port 0"),
            (b"0.0.0.0:8000", "an unspecified address"),
            (b"224.0.0.1:8000", "a multicast or broadcast address"),
            (b"169.254.169.254:80", "a link-local address"),
            (b"[fe80::1]:8000", "a link-local address"),
            (b"10.0.0.1:8000,", "an empty endpoint"),
            (b"10.0.0.1:8000\xff", "not ASCII"),
            (b"http://10.0.0.1:8000/", "not ip:port"),
            (b"10.0.0.1:8000/../admin", "not ip:port"),
            (b"10.0.0.1:80000", "not ip:port"),
        ] {
            assert_eq!(read(&[value], ""), Prefiller::Invalid(why), "{}", String::from_utf8_lossy(value));
        }
        let long = format!("10.0.0.1:{}", "0".repeat(70));
        assert_eq!(read(&[long.as_bytes()], ""), Prefiller::Invalid("an endpoint too long to be ip:port"));
        let many = vec!["10.0.0.1:8000"; 17].join(",");
        assert_eq!(read(&[many.as_bytes()], ""), Prefiller::Invalid("too many endpoints"));
        // The allowlist: an endpoint outside it is denied, even in a list.
        assert_eq!(read(&[b"10.0.0.1:8000"], "10.0.0.1"), at("10.0.0.1:8000"));
        assert_eq!(
            read(&[b"10.0.0.1:8000,10.0.0.7:8000"], "10.0.0.1"),
            Prefiller::Denied("10.0.0.7:8000".parse().unwrap_or_else(|e| panic!("{e}")))
        );
    }
}
