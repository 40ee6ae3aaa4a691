//! The few facts of a pod that decide whether it is a worker. Only these
//! are kept (not the whole `Pod`), so watching every pod of a namespace
//! costs a few hundred bytes per pod.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use super::pool::PoolSpec;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodFacts {
    pub labels: BTreeMap<String, String>,
    /// `status.podIP`, if set and an IP address.
    pub ip: Option<IpAddr>,
    /// Condition `Ready` is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set: the pod is going away.
    pub terminating: bool,
    /// Its containers' images, to guess the engine from (`engine`).
    pub images: Vec<String>,
    /// Which run of its containers this is.
    pub run: PodRun,
}

/// A run of a pod's containers: its `metadata.uid` (a pod recreated under
/// the same name gets a new one) and its containers' restarts. A new run
/// is a new engine, its cache empty: a worker kept through a spell out of
/// Ready must not carry the old run's index over a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodRun {
    pub uid: Option<String>,
    pub restarts: u64,
}

/// Why a pod is not (or no longer) a worker; said in the log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotAWorker {
    NoPool,
    Deleted,
    NotSelected,
    Terminating,
    NoIp,
    /// Its role label says it serves no generation (an encoder).
    NoGeneration,
}

impl fmt::Display for NotAWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotAWorker::NoPool => "no usable InferencePool",
            NotAWorker::Deleted => "pod deleted",
            NotAWorker::NotSelected => "labels no longer match the pool's selector",
            NotAWorker::Terminating => "pod terminating",
            NotAWorker::NoIp => "no pod IP",
            NotAWorker::NoGeneration => "its role label says it serves no generation (encode)",
        })
    }
}

impl PodFacts {
    /// `None` for a pod without a name (which the API server never sends).
    pub fn from_pod(pod: &Pod) -> Option<(String, PodFacts)> {
        let name = pod.metadata.name.clone().filter(|n| !n.is_empty())?;
        let status = pod.status.as_ref();
        let ip = status.and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse().ok());
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let facts = PodFacts {
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ip,
            ready,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            images: pod
                .spec
                .as_ref()
                .map(|s| s.containers.iter().filter_map(|c| c.image.clone()).collect())
                .unwrap_or_default(),
            run: PodRun {
                uid: pod.metadata.uid.clone(),
                restarts: (status.and_then(|s| s.container_statuses.as_ref()).into_iter().flatten())
                    .map(|c| u64::try_from(c.restart_count).unwrap_or(0))
                    .sum(),
            },
        };
        Some((name, facts))
    }

    /// The pod's IP and whether it is Ready, if it is (or may become) a
    /// worker of `pool`, else why not. A not-Ready pod is still one: the
    /// catalog keeps a worker it already has, unschedulable, so a readiness
    /// blip does not throw away its KV index and event subscription.
    pub fn worker_ip(facts: Option<&PodFacts>, pool: Option<&PoolSpec>) -> Result<(IpAddr, bool), NotAWorker> {
        let pool = pool.ok_or(NotAWorker::NoPool)?;
        let facts = facts.ok_or(NotAWorker::Deleted)?;
        if !pool.selects(&facts.labels) {
            return Err(NotAWorker::NotSelected);
        }
        if facts.terminating {
            return Err(NotAWorker::Terminating);
        }
        let ip = facts.ip.ok_or(NotAWorker::NoIp)?;
        Ok((ip, facts.ready))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn facts_of_a_ready_pod_and_of_others() {
        let (name, facts) = PodFacts::from_pod(&pod(json!({
            "metadata": {"name": "vllm-0", "labels": {"app": "vllm"}, "uid": "4f1c"},
            "status": {"podIP": "10.1.2.3", "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
            ], "containerStatuses": [
                {"name": "vllm", "image": "vllm", "imageID": "", "ready": true, "restartCount": 2},
                {"name": "sidecar", "image": "s", "imageID": "", "ready": true, "restartCount": 1},
            ]},
        })))
        .unwrap();
        assert_eq!(name, "vllm-0");
        assert_eq!(facts.run, PodRun { uid: Some("4f1c".into()), restarts: 3 });
        assert_eq!(facts.ip, Some("10.1.2.3".parse().unwrap()));
        assert!(facts.ready && !facts.terminating);

        let (_, f) = PodFacts::from_pod(&pod(json!({
            "metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"podIP": "not-an-ip", "conditions": [{"type": "Ready", "status": "False"}]},
        })))
        .unwrap();
        assert_eq!(f.ip, None);
        assert!(!f.ready && f.terminating);
        assert!(PodFacts::from_pod(&pod(json!({"metadata": {}}))).is_none());
    }

    #[test]
    fn a_not_ready_pod_is_a_worker_candidate_said_not_ready() {
        let app = BTreeMap::from([("app".to_owned(), "vllm".to_owned())]);
        let pool = PoolSpec { match_labels: app.clone(), target_ports: vec![8000] };
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let facts = PodFacts {
            labels: app,
            ip: Some(ip),
            ready: false,
            terminating: false,
            images: Vec::new(),
            run: PodRun::default(),
        };
        assert_eq!(PodFacts::worker_ip(Some(&facts), Some(&pool)), Ok((ip, false)));
        let ready = PodFacts { ready: true, ..facts.clone() };
        assert_eq!(PodFacts::worker_ip(Some(&ready), Some(&pool)), Ok((ip, true)));
        let dying = PodFacts { terminating: true, ..facts.clone() };
        assert_eq!(PodFacts::worker_ip(Some(&dying), Some(&pool)), Err(NotAWorker::Terminating));
        let no_ip = PodFacts { ip: None, ..facts.clone() };
        assert_eq!(PodFacts::worker_ip(Some(&no_ip), Some(&pool)), Err(NotAWorker::NoIp));
        assert_eq!(PodFacts::worker_ip(Some(&facts), None), Err(NotAWorker::NoPool));
        assert_eq!(PodFacts::worker_ip(None, Some(&pool)), Err(NotAWorker::Deleted));
    }
}
