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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointFilter {
    addrs: Vec<SocketAddr>,
    ips: Vec<IpAddr>,
}

impl EndpointFilter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn allow_addr(&mut self, addr: SocketAddr) -> &mut Self {
        self.addrs.push(addr);
        self
    }

    pub fn allow_ip(&mut self, ip: IpAddr) -> &mut Self {
        self.ips.push(ip);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty() && self.ips.is_empty()
    }

    pub fn allows(&self, endpoint: &SocketAddr) -> bool {
        self.addrs.contains(endpoint) || self.ips.contains(&endpoint.ip())
    }
}
