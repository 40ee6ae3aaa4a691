//! Workers as discovery hands them out, and their stable ids.

use std::net::{IpAddr, SocketAddr};

use kvpick_core::{Lifecycle, WorkerId, WorkerSpec};
use xxhash_rust::xxh3::xxh3_64;

use super::config::DiscoveryConfig;
use super::engine::EngineKind;
use super::role::Role;
use kvpick_kv_events::Publisher;

/// The id of the worker serving `port` of pod `pod` in `namespace`:
/// xxh3-64 (seed 0) of the UTF-8 bytes of `"{namespace}/{pod}:{port}"`,
/// e.g. `"llm/vllm-0:8000"`.
///
/// It depends on nothing but those three, so it is the same in every kvpick
/// replica, across restarts and across relists: replicas agree on ids for
/// replica sync, and a pod that comes back under the same name (a
/// StatefulSet's) gets its old id. The pod IP is deliberately not part of it;
/// an IP change is a delete and an upsert of the same id. Collisions
/// (2^-64 per pair) are detected and logged by discovery, never merged.
pub fn worker_id(namespace: &str, pod: &str, port: u16) -> WorkerId {
    WorkerId(xxh3_64(format!("{namespace}/{pod}:{port}").as_bytes()))
}

/// A worker found in the cluster: what the selection service and the
/// KV-event ingest need to take it on.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoveredWorker {
    /// For `SelectionService::upsert_worker`: endpoint `podIP:targetPort`,
    /// block size, model and capacities from configuration.
    pub spec: WorkerSpec,
    /// For `KvEventIngest::add`: the rank's KV-event PUB endpoint
    /// (`tcp://podIP:(kv_event_port + rank)`) and replay endpoint
    /// (`tcp://podIP:(kv_event_replay_port + rank)`, if configured).
    pub publisher: Publisher,
    /// The pod's name (for logs and metrics).
    pub pod: String,
    /// Engine data-parallel rank = index of the port in `spec.targetPorts`.
    pub rank: u16,
    /// What it runs (decides `publisher`).
    pub engine: EngineKind,
    /// Its part in a disaggregated fleet (decides which selector has it).
    pub role: Role,
}

impl DiscoveredWorker {
    /// Rank `rank` of pod `pod` at `ip`, serving on `port`. vLLM and SGLang
    /// add the data-parallel rank to both the KV-event PUB port and the
    /// replay port (`offset_endpoint_port`), TensorRT-LLM adds its global
    /// rank: rank r publishes on `kv_event_port + r`. That assumes the pool
    /// lists its target ports in rank order, as GAIE's data-parallel pools
    /// do. `None` if an offset port would pass 65535. `trtllm-serve`
    /// drained over HTTP is asked on the port itself.
    /// A decode worker that cannot run a request whole: SGLang started
    /// with `--disaggregation-mode decode` refuses any request without a
    /// bootstrap room (`reference/engines.md`), so each of its requests
    /// needs a prefill worker. vLLM's and TensorRT-LLM's decode workers
    /// prefill locally when asked to.
    pub fn decodes_only(&self) -> bool {
        self.role == Role::Decode && self.engine == EngineKind::Sglang
    }

    pub(crate) fn new(
        cfg: &DiscoveryConfig,
        pod: &str,
        ip: IpAddr,
        port: u16,
        rank: u16,
        (engine, role): (EngineKind, Role),
    ) -> Option<Self> {
        let id = worker_id(&cfg.namespace, pod, port);
        let publisher = if engine.drains_events() {
            Publisher::trtllm_drain(id, SocketAddr::new(ip, port))
        } else {
            Publisher::for_dp_rank(id, ip, cfg.kv_event_port, cfg.kv_event_replay_port, rank)?
        };
        let spec = WorkerSpec {
            id,
            endpoint: SocketAddr::new(ip, port),
            model: cfg.model.clone(),
            block_size: cfg.block_size,
            total_kv_blocks: cfg.total_kv_blocks,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            lifecycle: Lifecycle::Schedulable,
        };
        Some(DiscoveredWorker { spec, publisher, pod: pod.to_owned(), rank, engine, role })
    }

    pub fn id(&self) -> WorkerId {
        self.spec.id
    }

    /// Equal to `other` in everything but `spec.lifecycle`: the same
    /// engine, whose index and bookings carry over a readiness change.
    pub(crate) fn same_but_lifecycle(&self, other: &DiscoveredWorker) -> bool {
        let mut other = other.clone();
        other.spec.lifecycle = self.spec.lifecycle;
        *self == other
    }
}

/// One change to the worker set, to be applied in order.
///
/// Invariant of the stream: `Upsert(w)` comes when `w.id()` is absent (new,
/// or deleted just before), or present with nothing changed but
/// `spec.lifecycle` (its pod left or regained Ready: the worker is kept,
/// only not picked meanwhile); `Delete(id)` only when `id` is present. A
/// new worker is always `Schedulable`: a pod becomes a worker when it is
/// first Ready. A worker whose endpoint or rank changes (pod IP change,
/// target ports reordered), or whose pod restarted its containers or was
/// recreated, is a `Delete` followed by an `Upsert` (the `Upsert` only once
/// the pod is Ready): its KV index and bookings belonged to the old engine.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerUpdate {
    /// Boxed: a worker is ~200 bytes, a delete 8, and updates are rare.
    Upsert(Box<DiscoveredWorker>),
    Delete(WorkerId),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(worker_id("llm", "vllm-0", 8000), worker_id("llm", "vllm-0", 8000));
        assert_eq!(worker_id("llm", "vllm-0", 8000).0, xxh3_64(b"llm/vllm-0:8000"));
        assert_ne!(worker_id("llm", "vllm-0", 8000), worker_id("llm", "vllm-0", 8001));
        assert_ne!(worker_id("llm", "vllm-0", 8000), worker_id("llm", "vllm-1", 8000));
        assert_ne!(worker_id("llm", "vllm-0", 8000), worker_id("other", "vllm-0", 8000));
    }

    #[test]
    fn ports_follow_the_rank() {
        let mut cfg = DiscoveryConfig::new("llm", "pool", 16);
        cfg.kv_event_replay_port = Some(5600);
        cfg.model = Some("m".into());
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        let w = DiscoveredWorker::new(&cfg, "vllm-0", ip, 8002, 2, (EngineKind::Vllm, Role::Both)).unwrap();
        assert_eq!(w.spec.endpoint, "10.0.0.9:8002".parse().unwrap());
        assert_eq!(w.publisher.endpoint, "tcp://10.0.0.9:5559");
        assert_eq!(w.publisher.replay_endpoint.as_deref(), Some("tcp://10.0.0.9:5602"));
        assert_eq!(w.spec.model.as_deref(), Some("m"));
        assert_eq!(w.id(), worker_id("llm", "vllm-0", 8002));
        // TensorRT-LLM's native publisher offsets its ports the same way;
        // its drain is on the serving port, whatever the rank.
        let z = DiscoveredWorker::new(&cfg, "t-0", ip, 8002, 2, (EngineKind::TrtllmZmq, Role::Both)).unwrap();
        assert_eq!(z.publisher.endpoint, "tcp://10.0.0.9:5559");
        let t = DiscoveredWorker::new(&cfg, "t-0", ip, 8002, 2, (EngineKind::Trtllm, Role::Both)).unwrap();
        assert!(!t.decodes_only() && !w.decodes_only());
        for (engine, role, decodes_only) in [
            (EngineKind::Sglang, Role::Decode, true),
            (EngineKind::Sglang, Role::Both, false),
            (EngineKind::Sglang, Role::Prefill, false),
            (EngineKind::Vllm, Role::Decode, false),
            (EngineKind::Trtllm, Role::Decode, false),
        ] {
            let d = DiscoveredWorker::new(&cfg, "d-0", ip, 8002, 0, (engine, role)).unwrap();
            assert_eq!(d.decodes_only(), decodes_only, "{engine:?} {role:?}");
        }
        assert_eq!(t.publisher.endpoint, "http://10.0.0.9:8002/kv_cache_events");
        assert_eq!(t.publisher.replay_endpoint, None);
        cfg.kv_event_port = 65535;
        assert!(DiscoveredWorker::new(&cfg, "vllm-0", ip, 8002, 1, (EngineKind::Vllm, Role::Both)).is_none());
        assert!(DiscoveredWorker::new(&cfg, "t-0", ip, 8002, 1, (EngineKind::Trtllm, Role::Both)).is_some());
    }
}
