//! What to subscribe to, and the socket and replay settings.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kvpick_core::WorkerId;

/// vLLM's default KV-event port (`DYN_EPP_KV_EVENT_PORT`).
pub const DEFAULT_EVENT_PORT: u16 = 5557;

/// TensorRT-LLM's drain endpoint on `trtllm-serve`'s HTTP port.
pub const TRTLLM_DRAIN_PATH: &str = "/kv_cache_events";

/// One engine data-parallel rank publishing KV events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publisher {
    /// The worker the events are applied to.
    pub worker: WorkerId,
    /// ZMQ endpoint of its PUB socket, e.g. `tcp://10.0.0.7:5557`, or
    /// TensorRT-LLM's drain URL, `http://10.0.0.7:8000/kv_cache_events`.
    pub endpoint: String,
    /// ZMQ endpoint of its replay ROUTER, if the engine has one; without it
    /// gaps are counted as lost.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to; empty takes every message.
    pub topic: Vec<u8>,
}

impl Publisher {
    /// A publisher at `addr` (IPv6 gets its brackets), replay on
    /// `replay_port` of the same host when given, all topics.
    pub fn tcp(worker: WorkerId, addr: SocketAddr, replay_port: Option<u16>) -> Self {
        Publisher {
            worker,
            endpoint: format!("tcp://{addr}"),
            replay_endpoint: replay_port.map(|port| format!("tcp://{}", SocketAddr::new(addr.ip(), port))),
            topic: Vec::new(),
        }
    }

    /// Data-parallel rank `rank` of an engine whose rank 0 publishes on
    /// `events_port` (and replays on `replay_port`): vLLM and SGLang add the
    /// rank to both ports. `None` if a port would pass 65535.
    pub fn for_dp_rank(
        worker: WorkerId,
        ip: IpAddr,
        events_port: u16,
        replay_port: Option<u16>,
        rank: u16,
    ) -> Option<Self> {
        let events = SocketAddr::new(ip, events_port.checked_add(rank)?);
        let replay = match replay_port {
            Some(port) => Some(port.checked_add(rank)?),
            None => None,
        };
        Some(Publisher::tcp(worker, events, replay))
    }

    /// TensorRT-LLM's `trtllm-serve` at `addr` (its HTTP port): events are
    /// drained by polling `POST http://addr/kv_cache_events`.
    pub fn trtllm_drain(worker: WorkerId, addr: SocketAddr) -> Self {
        Publisher {
            worker,
            endpoint: format!("http://{addr}{TRTLLM_DRAIN_PATH}"),
            replay_endpoint: None,
            topic: Vec::new(),
        }
    }

    /// Whether the endpoint is polled over HTTP (TensorRT-LLM's drain)
    /// rather than subscribed to over ZMQ.
    pub fn is_drain(&self) -> bool {
        self.endpoint.starts_with("http://")
    }

    pub fn with_topic(mut self, topic: impl Into<Vec<u8>>) -> Self {
        self.topic = topic.into();
        self
    }
}

/// Settings of the ingest thread, the same for every publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngestConfig {
    /// First reconnect delay after a connection drops (`ZMQ_RECONNECT_IVL`).
    pub reconnect_interval: Duration,
    /// Reconnect back-off doubles up to this (`ZMQ_RECONNECT_IVL_MAX`).
    pub reconnect_interval_max: Duration,
    /// A ZMTP PING is sent after this long without traffic
    /// (`ZMQ_HEARTBEAT_IVL`); zero disables heartbeats.
    pub heartbeat_interval: Duration,
    /// No traffic for this long after a PING: the peer is dead, the
    /// connection is dropped and redialled (`ZMQ_HEARTBEAT_TIMEOUT`; also
    /// sent to the publisher as its `ZMQ_HEARTBEAT_TTL` for us).
    pub heartbeat_timeout: Duration,
    /// A replay that sends nothing for this long (once it has answered
    /// something: at most 250 ms) ends; it is asked again from where it
    /// stopped, at once if it made progress, else up to
    /// `replay_attempts` times in a row before its gap is given up.
    pub replay_idle_timeout: Duration,
    /// Silent replays in a row (each `replay_idle_timeout` long) before
    /// the batches they were to heal are given up as lost: a replay socket
    /// down for a moment (the engine's pod busy, a network blip) is asked
    /// again rather than losing the gap at once.
    pub replay_attempts: u32,
    /// Most live batches buffered per publisher during a replay; one more
    /// gives the replay up.
    pub replay_buffer_limit: usize,
    /// Messages queued per SUB socket before libzmq drops (`ZMQ_RCVHWM`;
    /// 0 = unlimited). Drops show up as gaps.
    pub receive_high_water_mark: i32,
    /// Largest frame accepted (`ZMQ_MAXMSGSIZE`); a bigger one drops the
    /// connection. Bounds memory per message.
    pub max_frame_bytes: i64,
    /// Most messages taken from one socket per poll round, so one busy
    /// publisher cannot starve the others.
    pub messages_per_turn: usize,
    /// TensorRT-LLM's drain: time between the end of one poll and the next.
    /// The engine keeps at most `event_buffer_max_size` events between
    /// polls, discarding the oldest: poll often enough to drain them first.
    pub drain_interval: Duration,
    /// Longest poll round trip (older `trtllm-serve` waits up to 2 s for an
    /// event when its queue is empty).
    pub drain_timeout: Duration,
    /// A failed poll doubles the wait before the next one, from
    /// `drain_interval` up to this.
    pub drain_backoff_max: Duration,
    /// Largest drain answer accepted; a bigger one fails the poll.
    pub drain_max_body_bytes: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            reconnect_interval: Duration::from_millis(100),
            reconnect_interval_max: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(15),
            replay_idle_timeout: Duration::from_secs(2),
            // 10 s of silence in all.
            replay_attempts: 5,
            // The engines' own replay buffer holds 10,000 batches.
            replay_buffer_limit: 10_000,
            // vLLM's PUB high-water mark.
            receive_high_water_mark: 100_000,
            max_frame_bytes: 64 << 20,
            messages_per_turn: 256,
            drain_interval: Duration::from_millis(50),
            drain_timeout: Duration::from_secs(5),
            drain_backoff_max: Duration::from_secs(5),
            drain_max_body_bytes: 64 << 20,
        }
    }
}

/// A duration as the milliseconds libzmq options take.
#[cfg(feature = "ingest")]
pub(crate) fn millis_i32(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_per_data_parallel_rank() {
        let ip: IpAddr = "fd00::7".parse().unwrap();
        let p = Publisher::for_dp_rank(WorkerId(3), ip, DEFAULT_EVENT_PORT, Some(5600), 2).unwrap();
        assert_eq!(p.endpoint, "tcp://[fd00::7]:5559");
        assert_eq!(p.replay_endpoint.as_deref(), Some("tcp://[fd00::7]:5602"));
        assert!(Publisher::for_dp_rank(WorkerId(3), ip, 65535, None, 1).is_none());
    }
}
