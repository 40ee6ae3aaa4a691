//! What `deploy/` ships is what the binary and the cluster accept: every
//! manifest, plain and rendered by the Helm chart (default values and each
//! `deploy/helm/kvpick/ci/*.yaml`), parses into its Kubernetes type with no
//! field left over (a typo in a field name fails here, not in a user's
//! cluster); the InferencePool parses with kvpick's own reader; kvpick's
//! container sets only settings `kvpick serve` has, with values it accepts;
//! and the pieces point at each other (pool → EPP Service, pool → model
//! server pods and ports, EPP → pool, route → pool).
//!
//! Rendering needs `helm` (`.ci/run` installs a pinned one; `HELM` names
//! another). Without it the chart is not checked: a note says so, and under
//! `CI` the test fails instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kvpick_app::app::ServeConfig;
use kvpick_app::app::settings::{self, SETTINGS, Values};
use serde::Deserialize;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One YAML document, where it came from.
struct Doc {
    origin: String,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }
    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }
}

fn docs_of(origin: &str, text: &str) -> Vec<Doc> {
    serde_yaml::Deserializer::from_str(text)
        .enumerate()
        .filter_map(|(i, doc)| {
            let yaml = serde_yaml::Value::deserialize(doc).unwrap_or_else(|e| panic!("{origin}: document {i}: {e}"));
            let value = serde_json::to_value(&yaml).unwrap_or_else(|e| panic!("{origin}: document {i}: {e}"));
            (!value.is_null()).then(|| Doc { origin: format!("{origin} #{i}"), value })
        })
        .collect()
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
}

fn plain_manifests() -> Vec<Doc> {
    let dir = repo().join("deploy/manifests");
    let files = yaml_files(&dir);
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            docs_of(&f.display().to_string(), &text)
        })
        .collect()
}

/// `helm`, if this machine has one.
fn helm() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HELM") {
        return Some(PathBuf::from(path));
    }
    let home_bin = std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/helm"));
    let on_path = Command::new("helm").arg("version").output().is_ok_and(|o| o.status.success());
    if on_path { Some(PathBuf::from("helm")) } else { home_bin.filter(|p| p.exists()) }
}

/// The chart rendered with each values file (`None`: its defaults).
fn rendered_charts(helm: &Path) -> Vec<(String, Vec<Doc>)> {
    let chart = repo().join("deploy/helm/kvpick");
    let mut values: Vec<Option<PathBuf>> = vec![None];
    values.extend(yaml_files(&chart.join("ci")).into_iter().map(Some));
    assert!(values.len() >= 3, "the chart needs two non-default values files in ci/");
    values
        .into_iter()
        .map(|file| {
            let mut cmd = Command::new(helm);
            cmd.args(["template", "kvpick"]).arg(&chart).args(["--namespace", "inference"]);
            if let Some(f) = &file {
                cmd.arg("-f").arg(f);
            }
            let out = cmd.output().unwrap_or_else(|e| panic!("running {}: {e}", helm.display()));
            let label = file.as_ref().map_or("default values".to_owned(), |f| f.display().to_string());
            assert!(out.status.success(), "helm template with {label}: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8(out.stdout).expect("helm writes UTF-8");
            (label.clone(), docs_of(&format!("chart with {label}"), &text))
        })
        .collect()
}

/// `null`s and empty objects dropped: what a typed round trip may omit
/// without losing anything a user wrote.
fn normalised(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), normalised(v)))
                .filter(|(_, v)| !v.as_object().is_some_and(|m| m.is_empty()))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalised).collect()),
        other => other.clone(),
    }
}

/// The first path where `typed` lost or changed what `written` says.
fn first_difference(written: &Value, typed: &Value, path: &str) -> Option<String> {
    match (written, typed) {
        (Value::Object(w), Value::Object(t)) => w.iter().find_map(|(k, v)| match t.get(k) {
            None => Some(format!("{path}.{k} is not a field of this kind (a typo?)")),
            Some(tv) => first_difference(v, tv, &format!("{path}.{k}")),
        }),
        (Value::Array(w), Value::Array(t)) if w.len() == t.len() => {
            w.iter().zip(t).enumerate().find_map(|(i, (a, b))| first_difference(a, b, &format!("{path}[{i}]")))
        }
        // Kubernetes accepts numbers where it keeps strings (quantities).
        (Value::Number(n), Value::String(s)) if n.to_string() == *s => None,
        (w, t) if w == t => None,
        (w, t) => Some(format!("{path}: wrote {w}, the type reads {t}")),
    }
}

/// Parses into `T` and back: every field written must survive.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Doc) -> T {
    let parsed: T = serde_json::from_value(doc.value.clone())
        .unwrap_or_else(|e| panic!("{} ({} {}): {e}", doc.origin, doc.kind(), doc.name()));
    let back = serde_json::to_value(&parsed).expect("k8s-openapi types serialise");
    if let Some(diff) = first_difference(&normalised(&doc.value), &normalised(&back), "") {
        panic!("{} ({} {}): {diff}", doc.origin, doc.kind(), doc.name());
    }
    parsed
}

/// InferencePool v1's whole spec (GAIE `api/v1/inferencepool_types.go`),
/// strict: kvpick's reader takes only what discovery uses.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // read by serde: an unknown field is the error
struct PoolSpecV1 {
    selector: PoolSelector,
    target_ports: Vec<PortNumber>,
    app_protocol: Option<AppProtocol>,
    endpoint_picker_ref: Option<PickerRef>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct PoolSelector {
    match_labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortNumber {
    number: u16,
}

#[derive(Deserialize)]
enum AppProtocol {
    #[serde(rename = "http")]
    Http,
    #[serde(rename = "kubernetes.io/h2c")]
    H2c,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct PickerRef {
    group: Option<String>,
    kind: Option<String>,
    name: String,
    port: Option<PortNumber>,
    failure_mode: Option<FailureMode>,
}

#[derive(Deserialize)]
enum FailureMode {
    FailOpen,
    FailClose,
}

/// One set of manifests, as a user applies it: checks each object and how
/// they point at each other; returns what was checked, for the message.
fn check_set(origin: &str, docs: &[Doc]) -> Vec<String> {
    let mut seen = Vec::new();
    let mut deployments = Vec::new();
    let mut services = Vec::new();
    let mut pools = Vec::new();
    let mut routes = Vec::new();
    for doc in docs {
        let api = doc.value["apiVersion"].as_str().unwrap_or("");
        match (api, doc.kind()) {
            ("apps/v1", "Deployment") => deployments.push(typed::<Deployment>(doc)),
            ("v1", "Service") => services.push(typed::<Service>(doc)),
            ("v1", "ServiceAccount") => drop(typed::<ServiceAccount>(doc)),
            ("v1", "ConfigMap") => check_config_map(doc, &typed::<ConfigMap>(doc)),
            ("rbac.authorization.k8s.io/v1", "Role") => check_role(&typed::<Role>(doc)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => drop(typed::<RoleBinding>(doc)),
            ("policy/v1", "PodDisruptionBudget") => drop(typed::<PodDisruptionBudget>(doc)),
            ("inference.networking.k8s.io/v1", "InferencePool") => pools.push(check_pool(doc)),
            ("gateway.networking.k8s.io/v1", "HTTPRoute") => routes.push(doc),
            // A gateway's own policy objects ride along (documented in
            // deploy/README.md); their schemas are the gateway's.
            (api, _) if !api.starts_with("apps/") && api.contains('.') && api != "v1" => {}
            (api, kind) => panic!("{}: unexpected {api} {kind}", doc.origin),
        }
        seen.push(format!("{} {}", doc.kind(), doc.name()));
    }
    // kvpick's Deployment runs `kvpick serve` with settings it accepts,
    // serving a pool that is in the set.
    let epps: Vec<(&Deployment, &Container)> = deployments
        .iter()
        .flat_map(|d| pod_containers(d).iter().map(move |c| (d, c)))
        .filter(|(_, c)| c.args.as_ref().and_then(|a| a.first()).is_some_and(|a| a == "serve"))
        .collect();
    assert!(!epps.is_empty(), "{origin}: no container runs `kvpick serve`");
    for (deployment, container) in &epps {
        let config = check_kvpick_container(origin, container);
        let pool = env_value(container, settings::POOL_NAME);
        if let Some(pool) = pool.filter(|_| !pools.is_empty()) {
            assert!(
                pools.iter().any(|(name, _, _)| *name == pool),
                "{origin}: kvpick serves InferencePool {pool:?}, which the set does not hold"
            );
        }
        check_probes(origin, deployment, container, &config);
    }
    // Each pool names a Service of the set on its ext_proc port, and
    // selects pods of the set on their ports.
    for (name, spec, picker) in &pools {
        if let Some((svc, port)) = picker {
            let service = services
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(svc.as_str()))
                .unwrap_or_else(|| panic!("{origin}: pool {name} names Service {svc}, which the set does not hold"));
            let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref()).expect("the EPP Service has ports");
            assert!(ports.iter().any(|p| p.port == i32::from(*port)), "{origin}: Service {svc} has no port {port}");
        }
        let servers: Vec<&Deployment> = deployments
            .iter()
            .filter(|d| {
                let labels = d.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.clone());
                labels.is_some_and(|l| spec.selects(&l))
            })
            .collect();
        if !servers.is_empty() {
            for port in &spec.target_ports {
                let served = servers.iter().flat_map(|d| pod_containers(d)).any(|c| {
                    c.ports.iter().flatten().any(|p| p.container_port == i32::from(*port))
                        || c.args
                            .iter()
                            .flatten()
                            .chain(c.command.iter().flatten())
                            .any(|a| a.contains(&port.to_string()))
                });
                assert!(served, "{origin}: pool {name} targets port {port}, which no selected pod serves");
            }
        }
    }
    for route in routes {
        check_route(origin, route, &pools);
    }
    seen
}

fn pod_containers(d: &Deployment) -> &[Container] {
    d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map_or(&[], |s| s.containers.as_slice())
}

fn env_value(c: &Container, var: &str) -> Option<String> {
    c.env.iter().flatten().find(|e| e.name == var).and_then(|e| e.value.clone())
}

/// The container's env and args, as `kvpick serve` reads them: unknown
/// settings and bad values fail. Values from the downward API stand in as
/// a pod would see them.
fn check_kvpick_container(origin: &str, c: &Container) -> ServeConfig {
    let mut args: Vec<String> = vec!["kvpick".into()];
    args.extend(c.args.iter().flatten().skip(1).cloned());
    for env in c.env.iter().flatten() {
        let setting = SETTINGS
            .iter()
            .find(|s| s.var == env.name)
            .unwrap_or_else(|| panic!("{origin}: {} is not a setting of `kvpick serve`", env.name));
        let value = match (&env.value, &env.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.namespace") => "inference".into(),
                Some("status.podIP") => "10.0.0.9".into(),
                other => panic!("{origin}: {} comes from {other:?}, which kvpick cannot use", env.name),
            },
            (None, None) => String::new(),
        };
        args.push(format!("--{}={value}", setting.flag));
    }
    let command = settings::command("kvpick", "serve");
    let values = Values::parse_from(command, &args).unwrap_or_else(|e| panic!("{origin}: kvpick serve {args:?}: {e}"));
    ServeConfig::from_values(&values).unwrap_or_else(|e| panic!("{origin}: kvpick serve {args:?}: {e}"))
}

/// Probes ask kvpick's gRPC health port for its own services, and the
/// container declares the ports kvpick listens on.
fn check_probes(origin: &str, d: &Deployment, c: &Container, config: &ServeConfig) {
    let name = d.metadata.name.as_deref().unwrap_or("");
    let health = i32::from(config.health_listen.port());
    for (probe, service) in [(&c.liveness_probe, "liveness"), (&c.readiness_probe, "readiness")] {
        let grpc = probe.as_ref().and_then(|p| p.grpc.as_ref());
        let grpc = grpc.unwrap_or_else(|| panic!("{origin}: Deployment {name} has no gRPC {service} probe"));
        assert_eq!(grpc.port, health, "{origin}: {service} probe port");
        assert_eq!(grpc.service.as_deref(), Some(service), "{origin}: {service} probe service");
    }
    let declared: Vec<i32> = c.ports.iter().flatten().map(|p| p.container_port).collect();
    for port in [config.ext_proc.listen.port(), config.health_listen.port(), config.metrics_listen.port()] {
        assert!(declared.contains(&i32::from(port)), "{origin}: Deployment {name} does not declare port {port}");
    }
    let security = c.security_context.as_ref().expect("kvpick's container has a securityContext");
    assert_eq!(security.run_as_non_root, Some(true), "{origin}: runAsNonRoot");
    assert_eq!(security.read_only_root_filesystem, Some(true), "{origin}: readOnlyRootFilesystem");
    assert_eq!(security.allow_privilege_escalation, Some(false), "{origin}: allowPrivilegeEscalation");
    let dropped = security.capabilities.as_ref().and_then(|c| c.drop.clone()).unwrap_or_default();
    assert!(dropped.iter().any(|c| c == "ALL"), "{origin}: capabilities are not all dropped");
}

/// A workers file in a ConfigMap (static discovery) is one kvpick reads.
fn check_config_map(doc: &Doc, map: &ConfigMap) {
    for (key, text) in map.data.iter().flatten() {
        if key.ends_with(".yaml") || key.ends_with(".yml") || key.ends_with(".json") {
            let defaults = kvpick_discovery::workers_file::Defaults {
                block_size: 16,
                model: None,
                max_num_batched_tokens: None,
                total_kv_blocks: None,
            };
            let workers = kvpick_discovery::workers_file::parse(text, &defaults)
                .unwrap_or_else(|e| panic!("{}: {key} is not a workers file kvpick reads: {e}", doc.origin));
            assert!(!workers.is_empty(), "{}: {key} lists no workers", doc.origin);
        }
    }
}

/// Read-only, namespaced, nothing but what discovery watches.
fn check_role(role: &Role) {
    for rule in role.rules.iter().flatten() {
        for verb in &rule.verbs {
            assert!(["get", "list", "watch"].contains(&verb.as_str()), "Role grants {verb}");
        }
    }
}

type Pool = (String, kvpick_discovery::pool::PoolSpec, Option<(String, u16)>);

fn check_pool(doc: &Doc) -> Pool {
    let spec = &doc.value["spec"];
    let strict = PoolSpecV1::deserialize(spec).unwrap_or_else(|e| panic!("{}: InferencePool v1: {e}", doc.origin));
    let object: kube::api::DynamicObject = serde_json::from_value(doc.value.clone())
        .unwrap_or_else(|e| panic!("{}: not a Kubernetes object: {e}", doc.origin));
    let parsed = kvpick_discovery::pool::parse(&object)
        .unwrap_or_else(|e| panic!("{}: kvpick cannot use this pool: {e}", doc.origin));
    let picker = strict.endpoint_picker_ref.map(|r| (r.name, r.port.map_or(9002, |p| p.number)));
    (doc.name().to_owned(), parsed, picker)
}

/// The route's backends are pools of the set (when the set holds one).
fn check_route(origin: &str, route: &Doc, pools: &[Pool]) {
    let rules = route.value["spec"]["rules"].as_array().unwrap_or_else(|| panic!("{origin}: route without rules"));
    assert!(route.value["spec"]["parentRefs"].as_array().is_some_and(|p| !p.is_empty()), "{origin}: no parentRefs");
    for backend in rules.iter().filter_map(|r| r["backendRefs"].as_array()).flatten() {
        assert_eq!(backend["group"], "inference.networking.k8s.io", "{origin}: backendRef group");
        assert_eq!(backend["kind"], "InferencePool", "{origin}: backendRef kind");
        let name = backend["name"].as_str().unwrap_or("");
        if !pools.is_empty() {
            assert!(pools.iter().any(|(n, _, _)| n == name), "{origin}: route sends to pool {name:?}, not in the set");
        }
    }
}

#[test]
fn the_plain_manifests_parse_and_fit_together() {
    let docs = plain_manifests();
    let seen = check_set("deploy/manifests", &docs);
    for kind in ["Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget"] {
        assert!(seen.iter().any(|s| s.starts_with(&format!("{kind} "))), "deploy/manifests has no {kind}: {seen:?}");
    }
    assert!(seen.iter().any(|s| s.starts_with("InferencePool ")), "no InferencePool: {seen:?}");
    assert!(seen.iter().any(|s| s.starts_with("HTTPRoute ")), "no HTTPRoute: {seen:?}");
}

#[test]
fn the_chart_renders_what_the_binary_accepts() {
    let Some(helm) = helm() else {
        assert!(std::env::var_os("CI").is_none(), "CI must check the Helm chart: .ci/run installs helm");
        eprintln!("note: no helm on this machine (HELM, PATH or ~/go/bin): the chart is not checked");
        return;
    };
    for (label, docs) in rendered_charts(&helm) {
        assert!(!docs.is_empty(), "the chart rendered nothing with {label}");
        check_set(&format!("chart with {label}"), &docs);
    }
}

#[test]
fn a_typo_in_a_field_is_caught() {
    let docs = docs_of(
        "inline",
        "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 9002, targetProt: 9002}]\n",
    );
    let caught = std::panic::catch_unwind(|| typed::<Service>(&docs[0])).err();
    let message = caught.and_then(|p| p.downcast_ref::<String>().cloned()).unwrap_or_default();
    assert!(message.contains("targetProt is not a field"), "{message}");
}
