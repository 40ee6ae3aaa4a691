//! Workers: one engine data-parallel rank reachable at one `ip:port`.

use std::net::{IpAddr, SocketAddr};

/// Unique across the whole process (all shards, all selection services).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u64);

/// Whether a worker may take new requests. Existing bookings stay valid in
/// every state until freed; only deletion drops them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lifecycle {
    #[default]
    Schedulable,
    /// Finishing its requests before it goes away: no new ones.
    Draining,
    Unschedulable,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSpec {
    pub id: WorkerId,
    pub endpoint: SocketAddr,
    /// Served model; `None` serves whatever it is asked for.
    pub model: Option<String>,
    /// The engine's `--block-size`.
    pub block_size: u32,
    pub total_kv_blocks: Option<u64>,
    /// The engine's `--max-num-batched-tokens`; needed for queueing.
    pub max_num_batched_tokens: Option<u64>,
    pub lifecycle: Lifecycle,
}

impl WorkerSpec {
    /// A schedulable worker with no model restriction and no capacity facts.
    pub fn new(id: WorkerId, endpoint: SocketAddr, block_size: u32) -> Self {
        WorkerSpec {
            id,
            endpoint,
            model: None,
            block_size,
            total_kv_blocks: None,
            max_num_batched_tokens: None,
            lifecycle: Lifecycle::Schedulable,
        }
    }

    pub fn serves(&self, model: Option<&str>) -> bool {
        match (model, &self.model) {
            (Some(asked), Some(served)) => asked == served,
            _ => true,
        }
    }
}

/// The candidates a caller allows (the gateway's subset hint, a conformance
/// test's header): each entry an `ip:port` or a bare `ip` matching any port.
/// Endpoints can also be avoided: picked only when no other allowed endpoint
/// is eligible, e.g. the decode workers that cannot run a request whole
/// when it cannot be split (they would refuse it; with nothing else, the
/// refusal is the answer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointFilter {
    addrs: Vec<SocketAddr>,
    ips: Vec<IpAddr>,
    /// Every endpoint is allowed, not only those listed.
    any: bool,
    avoided: Vec<SocketAddr>,
}

impl EndpointFilter {
    /// Allows nothing until told what.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allows every endpoint.
    pub fn any() -> Self {
        EndpointFilter { any: true, ..Self::default() }
    }

    pub fn allow_addr(&mut self, addr: SocketAddr) -> &mut Self {
        self.addrs.push(addr);
        self
    }

    pub fn allow_ip(&mut self, ip: IpAddr) -> &mut Self {
        self.ips.push(ip);
        self
    }

    /// Lets `addr` be picked only when no other allowed endpoint is
    /// eligible (`allows` still says yes: avoiding is up to the picker).
    pub fn avoid_addr(&mut self, addr: SocketAddr) -> &mut Self {
        self.avoided.push(addr);
        self
    }

    pub fn avoids(&self, endpoint: &SocketAddr) -> bool {
        self.avoided.contains(endpoint)
    }

    pub fn avoids_any(&self) -> bool {
        !self.avoided.is_empty()
    }

    /// Nothing is allowed: no endpoint is listed.
    pub fn is_empty(&self) -> bool {
        !self.any && self.addrs.is_empty() && self.ips.is_empty()
    }

    pub fn allows(&self, endpoint: &SocketAddr) -> bool {
        self.any || self.addrs.contains(endpoint) || self.ips.contains(&endpoint.ip())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_avoided_endpoint_stays_allowed_and_is_marked() {
        let (a, b): (SocketAddr, SocketAddr) = ("10.0.0.1:8000".parse().unwrap(), "10.0.0.1:8001".parse().unwrap());
        let mut by_ip = EndpointFilter::new();
        by_ip.allow_ip(a.ip());
        assert!(by_ip.allows(&a) && by_ip.allows(&b) && !by_ip.avoids_any());
        by_ip.avoid_addr(b);
        assert!(by_ip.allows(&b) && by_ip.avoids(&b) && !by_ip.avoids(&a) && by_ip.avoids_any());
        let mut any = EndpointFilter::any();
        assert!(!any.is_empty() && any.allows(&a) && any.allows(&b));
        any.avoid_addr(a);
        assert!(any.allows(&a) && any.avoids(&a) && !any.avoids(&b));
        let nothing = EndpointFilter::new();
        assert!(nothing.is_empty() && !nothing.allows(&a));
    }
}
