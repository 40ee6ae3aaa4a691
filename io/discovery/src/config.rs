//! What discovery needs to know: which pool, and the facts every worker it
//! finds shares (they come from configuration, not from the cluster).

use std::net::IpAddr;
use std::time::Duration;

use thiserror::Error;

use super::engine::EngineSetting;
use kvpick_kv_events::DEFAULT_EVENT_PORT;

/// The replica-sync port (`DYN_EPP_REPLICA_SYNC_PORT`).
pub const DEFAULT_PEER_PORT: u16 = 9092;

/// Discovery settings. The environment variable each field mirrors is named
/// in its doc; reading the environment is the binary's job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// `POD_NAMESPACE`: the namespace of the pool, its pods and the peers.
    pub namespace: String,
    /// `DYN_EPP_INFERENCE_POOL_NAME`.
    pub pool_name: String,
    /// `DYN_KV_CACHE_BLOCK_SIZE`: every worker's `--block-size`.
    pub block_size: u32,
    /// `DYN_MODEL_NAME`; `None` lets every worker serve any model.
    pub model: Option<String>,
    /// `DYN_EPP_MAX_NUM_BATCHED_TOKENS`.
    pub max_num_batched_tokens: Option<u64>,
    /// `DYN_EPP_TOTAL_KV_BLOCKS`.
    pub total_kv_blocks: Option<u64>,
    /// `KVPICK_ENGINE`: the engine of pods without a `kvpick.io/engine`
    /// label (`auto`: guessed from their images).
    pub engine: EngineSetting,
    /// `KVPICK_ROLE_LABELS`: the pod label keys naming a worker's role in
    /// a disaggregated fleet, first match wins (default: llm-d's and
    /// Dynamo's, see `role`).
    pub role_labels: Vec<String>,
    /// `DYN_EPP_KV_EVENT_PORT`: rank 0's KV-event PUB port (5557).
    pub kv_event_port: u16,
    /// `DYN_EPP_KV_EVENT_REPLAY_PORT`: rank 0's replay ROUTER port, if the
    /// engines run one.
    pub kv_event_replay_port: Option<u16>,
    /// `DYN_EPP_PEER_SERVICE`: the Service whose EndpointSlices list the
    /// kvpick replicas; `None` runs alone.
    pub peer_service: Option<String>,
    /// `POD_IP`: this replica's own address, excluded from the peers (and
    /// fixing their address family). Required with `peer_service`.
    pub pod_ip: Option<IpAddr>,
    /// `DYN_EPP_REPLICA_SYNC_PORT`: the peers' sync port, unless their
    /// EndpointSlice names a port `replica-agg`.
    pub peer_port: u16,
    /// First delay after a watch error; doubles (with jitter) up to
    /// `backoff_max`, and resets once the watch yields again.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Objects per LIST page (`limit`); the watcher follows `continue`.
    pub list_page_size: u32,
    /// Capacity of the `updates` channel; a full channel holds the watches
    /// back (never drops an update).
    pub update_capacity: usize,
}

impl DiscoveryConfig {
    /// Defaults for everything but the pool's namespace and name and the
    /// engines' block size. The back-off is client-go's (0.8 s doubling to
    /// 30 s).
    pub fn new(namespace: impl Into<String>, pool_name: impl Into<String>, block_size: u32) -> Self {
        DiscoveryConfig {
            namespace: namespace.into(),
            pool_name: pool_name.into(),
            block_size,
            model: None,
            max_num_batched_tokens: None,
            total_kv_blocks: None,
            engine: EngineSetting::Auto,
            role_labels: super::role::DEFAULT_ROLE_LABELS.iter().map(|k| (*k).to_owned()).collect(),
            kv_event_port: DEFAULT_EVENT_PORT,
            kv_event_replay_port: None,
            peer_service: None,
            pod_ip: None,
            peer_port: DEFAULT_PEER_PORT,
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            list_page_size: 500,
            update_capacity: 1024,
        }
    }

    /// Checks what [`Discovery::spawn`](super::Discovery::spawn) checks, so
    /// a bad setting can stop start-up before any watch.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.namespace.is_empty() {
            return Err(ConfigError::Empty("namespace (POD_NAMESPACE)"));
        }
        if self.pool_name.is_empty() {
            return Err(ConfigError::Empty("pool_name (DYN_EPP_INFERENCE_POOL_NAME)"));
        }
        if self.block_size == 0 {
            return Err(ConfigError::Zero("block_size (DYN_KV_CACHE_BLOCK_SIZE)"));
        }
        if self.list_page_size == 0 {
            return Err(ConfigError::Zero("list_page_size"));
        }
        if self.update_capacity == 0 {
            return Err(ConfigError::Zero("update_capacity"));
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return Err(ConfigError::Backoff { min: self.backoff_min, max: self.backoff_max });
        }
        match &self.peer_service {
            Some(service) if service.is_empty() => Err(ConfigError::Empty("peer_service (DYN_EPP_PEER_SERVICE)")),
            Some(_) if self.pod_ip.is_none() => Err(ConfigError::PeerServiceWithoutPodIp),
            _ => Ok(()),
        }
    }
}

/// A discovery setting that cannot work.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("discovery: {0} must not be empty")]
    Empty(&'static str),
    #[error("discovery: {0} must be greater than zero")]
    Zero(&'static str),
    #[error("discovery: back-off must satisfy 0 < min <= max, got min {min:?}, max {max:?}")]
    Backoff { min: Duration, max: Duration },
    #[error("discovery: DYN_EPP_PEER_SERVICE is set but POD_IP is not (a replica must not sync with itself)")]
    PeerServiceWithoutPodIp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_cannot_work_are_refused() {
        let ok = DiscoveryConfig::new("ns", "pool", 16);
        assert_eq!(ok.validate(), Ok(()));
        let mut c = ok.clone();
        c.block_size = 0;
        assert_eq!(c.validate(), Err(ConfigError::Zero("block_size (DYN_KV_CACHE_BLOCK_SIZE)")));
        let mut c = ok.clone();
        c.pool_name.clear();
        assert!(matches!(c.validate(), Err(ConfigError::Empty(_))));
        let mut c = ok.clone();
        c.backoff_min = c.backoff_max * 2;
        assert!(matches!(c.validate(), Err(ConfigError::Backoff { .. })));
        let mut c = ok.clone();
        c.peer_service = Some("epp".into());
        assert_eq!(c.validate(), Err(ConfigError::PeerServiceWithoutPodIp));
        c.pod_ip = Some("10.0.0.1".parse().unwrap());
        assert_eq!(c.validate(), Ok(()));
    }
}
