//! Which part of a disaggregated fleet a worker plays: prefill, decode, or
//! both (an aggregated engine, the default).
//!
//! In Kubernetes a pod's role is the value of the first of the role label
//! keys it carries (`KVPICK_ROLE_LABELS`). The defaults are the keys the two
//! peers' deployments already set, so their pods need no relabelling:
//!
//! | key | values |
//! |---|---|
//! | `llm-d.ai/role` (llm-d) | `prefill`, `decode`, `prefill-decode` (also `both`), `encode` |
//! | `nvidia.com/dynamo-sub-component-type` (Dynamo's operator) | `prefill`, `decode`; absent on aggregated workers |
//!
//! An `encode` pod (llm-d's multimodal encoder) serves no generation and is
//! not a worker. Any other value is ignored with a warning and the pod is
//! taken as aggregated: routing it a whole request is what it would get
//! from a picker that knows no roles.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// llm-d's pod role label.
pub const LLM_D_ROLE_LABEL: &str = "llm-d.ai/role";
/// The Dynamo operator's pod role label.
pub const DYNAMO_ROLE_LABEL: &str = "nvidia.com/dynamo-sub-component-type";
/// The label keys read by default, in order.
pub const DEFAULT_ROLE_LABELS: [&str; 2] = [LLM_D_ROLE_LABEL, DYNAMO_ROLE_LABEL];

/// A worker's role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Serves whole requests, and is a decode worker of a disaggregated
    /// fleet too (it can prefill locally when the decider says so).
    #[default]
    Both,
    /// Only prefills, handing its KV blocks to a decode worker.
    Prefill,
    /// Decodes what a prefill worker computed (and prefills short
    /// uncached suffixes itself).
    Decode,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Both, Role::Prefill, Role::Decode];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }

    /// Whether the decode selector may choose it (every role but prefill).
    pub fn decodes(self) -> bool {
        self != Role::Prefill
    }

    /// The role a label value names: `Ok(None)` for a pod that serves no
    /// generation (llm-d's `encode`).
    pub fn from_label(value: &str) -> Result<Option<Role>, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "prefill" => Ok(Some(Role::Prefill)),
            "decode" => Ok(Some(Role::Decode)),
            "both" | "prefill-decode" | "aggregated" | "" => Ok(Some(Role::Both)),
            "encode" => Ok(None),
            other => {
                Err(format!("unknown role {other:?}: expected prefill, decode, prefill-decode (or both) or encode"))
            }
        }
    }

    /// The role of a pod with these labels: the first of `keys` it carries
    /// decides. `Err` carries the role it is taken as and why the label
    /// was not understood, for the caller's log.
    pub fn of_labels(keys: &[String], labels: &BTreeMap<String, String>) -> Result<Option<Role>, (Role, String)> {
        let Some((key, value)) = keys.iter().find_map(|k| labels.get(k).map(|v| (k, v))) else {
            return Ok(Some(Role::Both));
        };
        Role::from_label(value).map_err(|why| (Role::Both, format!("label {key}: {why}")))
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The workers file's `role`: `prefill`, `decode` or `both`, as the labels
/// spell them (an encoder is simply not listed).
impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match Role::from_label(s) {
            Ok(Some(role)) => Ok(role),
            Ok(None) => Err(format!("role {s:?} serves no generation: leave the worker out")),
            Err(why) => Err(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<String> {
        DEFAULT_ROLE_LABELS.iter().map(|k| (*k).to_owned()).collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn the_peers_labels_name_the_role() {
        let cases = [
            (labels(&[]), Ok(Some(Role::Both))),
            (labels(&[("app", "vllm")]), Ok(Some(Role::Both))),
            (labels(&[(LLM_D_ROLE_LABEL, "prefill")]), Ok(Some(Role::Prefill))),
            (labels(&[(LLM_D_ROLE_LABEL, "decode")]), Ok(Some(Role::Decode))),
            (labels(&[(LLM_D_ROLE_LABEL, "prefill-decode")]), Ok(Some(Role::Both))),
            (labels(&[(LLM_D_ROLE_LABEL, "encode")]), Ok(None)),
            (labels(&[(DYNAMO_ROLE_LABEL, "prefill")]), Ok(Some(Role::Prefill))),
            (labels(&[(DYNAMO_ROLE_LABEL, "Decode")]), Ok(Some(Role::Decode))),
            // The first key listed wins.
            (labels(&[(DYNAMO_ROLE_LABEL, "decode"), (LLM_D_ROLE_LABEL, "prefill")]), Ok(Some(Role::Prefill))),
        ];
        for (labels, want) in cases {
            assert_eq!(Role::of_labels(&keys(), &labels), want, "{labels:?}");
        }
        let bad = Role::of_labels(&keys(), &labels(&[(LLM_D_ROLE_LABEL, "router")]));
        assert!(
            matches!(&bad, Err((Role::Both, why)) if why.contains("router") && why.contains(LLM_D_ROLE_LABEL)),
            "{bad:?}"
        );
    }

    #[test]
    fn a_configured_key_replaces_the_defaults() {
        let keys = vec!["example.com/pd".to_owned()];
        assert_eq!(Role::of_labels(&keys, &labels(&[("example.com/pd", "prefill")])), Ok(Some(Role::Prefill)));
        assert_eq!(Role::of_labels(&keys, &labels(&[(LLM_D_ROLE_LABEL, "prefill")])), Ok(Some(Role::Both)));
    }

    #[test]
    fn the_workers_file_spells_roles_alike() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse(), Ok(role));
        }
        assert_eq!("prefill-decode".parse(), Ok(Role::Both));
        assert!("encode".parse::<Role>().unwrap_err().contains("no generation"));
        assert!("router".parse::<Role>().is_err());
        assert!(Role::Both.decodes() && Role::Decode.decodes() && !Role::Prefill.decodes());
    }
}
