//! Endpoint lists the gateway or a test hands kvpick (`ip`, `ip:port`,
//! IPv6 with or without brackets), their intersection, and the
//! [`EndpointFilter`] the selection core takes.
//!
//! Used for the gateway's subset hint and the conformance selection header.
//! Entries that parse as neither form are skipped (and logged): a list of
//! only garbage is empty, which selects nothing.

use std::net::{IpAddr, SocketAddr};

use kvpick_core::EndpointFilter;

/// One allowed endpoint: a whole address, or any port of an IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Every parseable entry, in order, without duplicates; empty entries are
/// ignored.
pub fn parse_list<'a>(entries: impl IntoIterator<Item = &'a str>) -> Vec<Endpoint> {
    let mut out = Vec::new();
    for entry in entries.into_iter().map(str::trim).filter(|e| !e.is_empty()) {
        match parse_endpoint(entry) {
            Some(endpoint) if !out.contains(&endpoint) => out.push(endpoint),
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
    let mut keep = |e: Endpoint| {
        if !out.contains(&e) {
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
    fn intersection() {
        let a = parse_csv("10.0.0.1,10.0.0.2:80,10.0.0.3:80");
        let b = parse_csv("10.0.0.1:81,10.0.0.2,10.0.0.4");
        assert_eq!(intersect(&a, &b), parse_csv("10.0.0.1:81,10.0.0.2:80"));
        assert_eq!(intersect(&parse_csv("10.0.0.9"), &parse_csv("10.0.0.9")), parse_csv("10.0.0.9"));
        assert!(intersect(&a, &[]).is_empty());
    }
}
