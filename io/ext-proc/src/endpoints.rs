//! Endpoint lists the gateway or a test hands kvpick (`ip`, `ip:port`,
//! IPv6 with or without brackets), their intersection, and the
//! [`EndpointFilter`] the selection core takes.
//!
//! Used for the gateway's subset hint and the conformance selection header.
//! Entries that parse as neither form are skipped (and logged): a list of
//! only garbage is empty, which selects nothing. A list keeps its first
//! [`MAX_ENDPOINTS`] distinct entries: the message cap alone would let a
//! hint carry a million, and the intersection is quadratic.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use kvpick_core::EndpointFilter;

/// One allowed endpoint: a whole address, or any port of an IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Addr(SocketAddr),
    Ip(IpAddr),
}

impl Endpoint {
    fn allows(&self, addr: &SocketAddr) -> bool {
        match self {
            Endpoint::Addr(a) => a == addr,
            Endpoint::Ip(ip) => *ip == addr.ip(),
        }
    }
}

/// Parses `10.0.0.1`, `10.0.0.1:8000`, `::1`, `[::1]`, `[::1]:8000`.
pub fn parse_endpoint(text: &str) -> Option<Endpoint> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(Endpoint::Addr(addr));
    }
    let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(text);
    bare.parse::<IpAddr>().ok().map(Endpoint::Ip)
}

/// Most distinct endpoints a list keeps (a pool of more pods than this is
/// far past what one gateway routes to).
pub const MAX_ENDPOINTS: usize = 4096;

/// Every parseable entry, in order, without duplicates, up to
/// [`MAX_ENDPOINTS`]; empty entries are ignored.
pub fn parse_list<'a>(entries: impl IntoIterator<Item = &'a str>) -> Vec<Endpoint> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for entry in entries.into_iter().map(str::trim).filter(|e| !e.is_empty()) {
        match parse_endpoint(entry) {
            Some(_) if out.len() == MAX_ENDPOINTS => {
                tracing::debug!(max = MAX_ENDPOINTS, "endpoint list cut at its cap");
                break;
            }
            Some(endpoint) if seen.insert(endpoint) => out.push(endpoint),
            Some(_) => {}
            None => tracing::debug!(entry, "ignoring an endpoint that is neither ip nor ip:port"),
        }
    }
    out
}

/// A comma-separated list.
pub fn parse_csv(csv: &str) -> Vec<Endpoint> {
    parse_list(csv.split(','))
}

/// Endpoints allowed by both lists: an address both allow, or an IP both
/// allow on any port.
pub fn intersect(a: &[Endpoint], b: &[Endpoint]) -> Vec<Endpoint> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut keep = |e: Endpoint| {
        if seen.insert(e) {
            out.push(e);
        }
    };
    for x in a {
        for y in b {
            match (x, y) {
                (Endpoint::Addr(p), other) | (other, Endpoint::Addr(p)) if other.allows(p) => keep(Endpoint::Addr(*p)),
                (Endpoint::Ip(i), Endpoint::Ip(j)) if i == j => keep(Endpoint::Ip(*i)),
                _ => {}
            }
        }
    }
    out
}

/// The filter the selection core takes.
pub fn to_filter(endpoints: &[Endpoint]) -> EndpointFilter {
    let mut filter = EndpointFilter::new();
    for endpoint in endpoints {
        match endpoint {
            Endpoint::Addr(addr) => filter.allow_addr(*addr),
            Endpoint::Ip(ip) => filter.allow_ip(*ip),
        };
    }
    filter
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_every_form() {
        let ip = |s: &str| s.parse::<IpAddr>().ok().map(Endpoint::Ip);
        assert_eq!(parse_endpoint("10.0.0.1"), ip("10.0.0.1"));
        assert_eq!(parse_endpoint(" 10.0.0.1:8000 "), Some(Endpoint::Addr(addr("10.0.0.1:8000"))));
        assert_eq!(parse_endpoint("::1"), ip("::1"));
        assert_eq!(parse_endpoint("[::1]"), ip("::1"));
        assert_eq!(parse_endpoint("[fd00::2]:3000"), Some(Endpoint::Addr(addr("[fd00::2]:3000"))));
        assert_eq!(parse_endpoint("pod-a:80"), None);
    }

    #[test]
    fn csv_filter_matches_ip_and_addr() {
        let f = to_filter(&parse_csv("10.0.0.1, 10.0.0.2:3002,,junk,10.0.0.1"));
        assert!(f.allows(&addr("10.0.0.1:3000")));
        assert!(f.allows(&addr("10.0.0.2:3002")));
        assert!(!f.allows(&addr("10.0.0.2:3000")));
        assert_eq!(parse_csv("10.0.0.1,10.0.0.1").len(), 1);
        assert!(parse_csv(" , junk").is_empty());
    }

    #[test]
    fn a_list_keeps_its_first_distinct_entries_up_to_the_cap() {
        // A million entries, each twice: linear work, the first 4,096 kept.
        let hint: Vec<String> = (0..1_000_000u32)
            .flat_map(|i| [i, i])
            .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
            .collect();
        let list = parse_list(hint.iter().map(String::as_str));
        assert_eq!(list.len(), MAX_ENDPOINTS);
        assert_eq!(list[0], Endpoint::Ip(IpAddr::from([10, 0, 0, 0])));
        assert_eq!(list[MAX_ENDPOINTS - 1], Endpoint::Ip(IpAddr::from([10, 0, 15, 255])));
        assert_eq!(intersect(&list, &list), list);
    }

    #[test]
    fn intersection() {
        let a = parse_csv("10.0.0.1,10.0.0.2:80,10.0.0.3:80");
        let b = parse_csv("10.0.0.1:81,10.0.0.2,10.0.0.4");
        assert_eq!(intersect(&a, &b), parse_csv("10.0.0.1:81,10.0.0.2:80"));
        assert_eq!(intersect(&parse_csv("10.0.0.9"), &parse_csv("10.0.0.9")), parse_csv("10.0.0.9"));
        assert!(intersect(&a, &[]).is_empty());
    }
}
