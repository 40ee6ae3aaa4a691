//! The GAIE `InferencePool` (`inference.networking.k8s.io/v1`): only what
//! discovery uses of its spec.
//!
//! The pool is read as a `kube::api::DynamicObject` and its `spec` parsed
//! here, rather than through a `#[derive(CustomResource)]` type:
//! - a pool whose spec does not parse (an old `v1alpha2` shape, a missing
//!   field) is then one logged, per-object error that empties the pool, not
//!   a LIST or watch-event deserialisation failure that the watcher would
//!   retry forever while the last good selector silently stayed in force;
//! - kvpick only reads two fields and never installs the CRD, so the derive
//!   (and the `schemars` schema generation it pulls in) buys nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Deserialize;
use thiserror::Error;

pub const GROUP: &str = "inference.networking.k8s.io";
pub const VERSION: &str = "v1";
pub const KIND: &str = "InferencePool";
pub const PLURAL: &str = "inferencepools";

/// The `ApiResource` the pool watch is made of.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// What the workers are made of: pods whose labels include every
/// `match_labels` entry, one worker per target port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    /// `spec.selector.matchLabels` (AND of equalities, never empty).
    pub match_labels: BTreeMap<String, String>,
    /// `spec.targetPorts[].number`, in the pool's order: index = engine
    /// data-parallel rank. Never empty, no duplicates.
    pub target_ports: Vec<u16>,
}

impl PoolSpec {
    /// True if `labels` satisfy the selector.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

impl fmt::Display for PoolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("selector {")?;
        for (i, (k, v)) in self.match_labels.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        write!(f, "}}, target ports {:?}", self.target_ports)
    }
}

/// Why a pool object cannot be used.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PoolSpecError {
    #[error("no spec")]
    NoSpec,
    #[error("spec does not parse: {0}")]
    Malformed(String),
    #[error("spec.selector.matchLabels is missing or empty (it would select every pod)")]
    EmptySelector,
    #[error("spec.selector.matchExpressions is not supported by InferencePool v1")]
    MatchExpressions,
    #[error("spec.targetPorts is missing or empty (v1alpha2's targetPortNumber is not read)")]
    NoTargetPorts,
    #[error("spec.targetPorts has {0}, not a port number in 1..=65535")]
    BadPort(i64),
    #[error("spec.targetPorts lists port {0} twice")]
    DuplicatePort(u16),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    #[serde(default)]
    selector: Option<RawSelector>,
    #[serde(default)]
    target_ports: Option<Vec<RawPort>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSelector {
    #[serde(default)]
    match_labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    match_expressions: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct RawPort {
    number: i64,
}

/// Reads and checks the pool's spec.
pub fn parse(pool: &DynamicObject) -> Result<PoolSpec, PoolSpecError> {
    let spec = pool.data.get("spec").filter(|v| !v.is_null()).ok_or(PoolSpecError::NoSpec)?;
    let raw = RawSpec::deserialize(spec).map_err(|e| PoolSpecError::Malformed(e.to_string()))?;
    let selector = raw.selector.ok_or(PoolSpecError::EmptySelector)?;
    if selector.match_expressions.is_some_and(|e| !e.is_empty()) {
        return Err(PoolSpecError::MatchExpressions);
    }
    let match_labels = selector.match_labels.filter(|m| !m.is_empty()).ok_or(PoolSpecError::EmptySelector)?;
    let raw_ports = raw.target_ports.filter(|p| !p.is_empty()).ok_or(PoolSpecError::NoTargetPorts)?;
    let mut seen = BTreeSet::new();
    let mut target_ports = Vec::with_capacity(raw_ports.len());
    for RawPort { number } in raw_ports {
        let port = u16::try_from(number).ok().filter(|p| *p != 0).ok_or(PoolSpecError::BadPort(number))?;
        if !seen.insert(port) {
            return Err(PoolSpecError::DuplicatePort(port));
        }
        target_ports.push(port);
    }
    Ok(PoolSpec { match_labels, target_ports })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(spec: serde_json::Value) -> DynamicObject {
        DynamicObject::new("p", &api_resource()).data(json!({ "spec": spec }))
    }

    #[test]
    fn reads_selector_and_ports_in_order() {
        let spec = json!({
            "selector": {"matchLabels": {"app": "vllm", "tier": "a"}},
            "targetPorts": [{"number": 8002}, {"number": 8000}],
            "appProtocol": "http",
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        });
        let parsed = parse(&pool(spec)).unwrap();
        assert_eq!(parsed.target_ports, vec![8002, 8000]);
        assert_eq!(parsed.match_labels.len(), 2);
        assert_eq!(parsed.to_string(), "selector {app=vllm,tier=a}, target ports [8002, 8000]");
        let mut labels: BTreeMap<String, String> =
            [("app", "vllm"), ("tier", "a"), ("x", "y")].map(|(k, v)| (k.into(), v.into())).into();
        assert!(parsed.selects(&labels));
        labels.insert("tier".into(), "b".into());
        assert!(!parsed.selects(&labels));
    }

    #[test]
    fn rejects_what_cannot_be_served() {
        let ports = json!([{"number": 8000}]);
        let sel = json!({"matchLabels": {"app": "vllm"}});
        let cases = [
            (json!(null), PoolSpecError::NoSpec),
            (json!({"targetPorts": ports}), PoolSpecError::EmptySelector),
            (json!({"selector": {"matchLabels": {}}, "targetPorts": ports}), PoolSpecError::EmptySelector),
            (
                json!({"selector": {"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "a"}]}, "targetPorts": ports}),
                PoolSpecError::MatchExpressions,
            ),
            (json!({"selector": sel, "targetPortNumber": 8000}), PoolSpecError::NoTargetPorts),
            (json!({"selector": sel, "targetPorts": []}), PoolSpecError::NoTargetPorts),
            (json!({"selector": sel, "targetPorts": [{"number": 0}]}), PoolSpecError::BadPort(0)),
            (json!({"selector": sel, "targetPorts": [{"number": 70000}]}), PoolSpecError::BadPort(70000)),
            (json!({"selector": sel, "targetPorts": [{"number": 1}, {"number": 1}]}), PoolSpecError::DuplicatePort(1)),
        ];
        for (spec, want) in cases {
            assert_eq!(parse(&pool(spec.clone())), Err(want), "{spec}");
        }
        let malformed = parse(&pool(json!({"selector": sel, "targetPorts": [{"number": "x"}]})));
        assert!(matches!(malformed, Err(PoolSpecError::Malformed(_))), "{malformed:?}");
    }
}
