use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use super::*;
use crate::worker_id;

const NS: &str = "llm";
const POOL: &str = "pool";

fn spec(labels: &[(&str, &str)], ports: &[u16]) -> Result<PoolSpec, PoolSpecError> {
    Ok(PoolSpec {
        match_labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        target_ports: ports.to_vec(),
    })
}

fn facts(labels: &[(&str, &str)], ip: Option<&str>, ready: bool) -> PodFacts {
    PodFacts {
        labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ip: ip.map(|s| s.parse().unwrap()),
        ready,
        terminating: false,
        images: vec!["vllm/vllm-openai:v0.26.0".into()],
        run: PodRun::default(),
    }
}

/// Applies updates the way the wiring will, checking the stream's
/// invariant: a new worker is schedulable, an upsert of a present id
/// changes its lifecycle and nothing else, no delete of an absent one.
#[derive(Default)]
struct Applied(BTreeMap<WorkerId, (SocketAddr, Lifecycle)>);

impl Applied {
    fn apply(&mut self, updates: &mut Vec<WorkerUpdate>) {
        for u in updates.drain(..) {
            match u {
                WorkerUpdate::Upsert(w) => {
                    let new = (w.spec.endpoint, w.spec.lifecycle);
                    match self.0.insert(w.id(), new) {
                        None => assert_eq!(new.1, Lifecycle::Schedulable, "new worker {:?} not schedulable", w.id()),
                        Some(old) => {
                            assert!(
                                old.0 == new.0 && old.1 != new.1,
                                "upsert of present {:?}: {old:?} -> {new:?}",
                                w.id()
                            )
                        }
                    }
                }
                WorkerUpdate::Delete(id) => assert!(self.0.remove(&id).is_some(), "delete of absent {id:?}"),
            }
        }
    }

    /// Every worker's endpoint, and the schedulable ones'.
    fn endpoints(&self) -> (Vec<String>, Vec<String>) {
        let list = |schedulable_only: bool| {
            let mut v: Vec<String> = (self.0.values())
                .filter(|(_, l)| !schedulable_only || *l == Lifecycle::Schedulable)
                .map(|(e, _)| e.to_string())
                .collect();
            v.sort();
            v
        };
        (list(false), list(true))
    }
}

struct Fixture {
    cat: Catalog,
    out: Vec<WorkerUpdate>,
    applied: Applied,
}

impl Fixture {
    fn new() -> Self {
        Fixture { cat: Catalog::new(DiscoveryConfig::new(NS, POOL, 16)), out: Vec::new(), applied: Applied::default() }
    }

    fn pool(&mut self, change: Change<Result<PoolSpec, PoolSpecError>>) -> &mut Self {
        self.cat.on_pool(change, &mut self.out);
        self.applied.apply(&mut self.out);
        self
    }

    fn pod(&mut self, change: Change<PodFacts>) -> &mut Self {
        self.cat.on_pod(change, &mut self.out);
        self.applied.apply(&mut self.out);
        self
    }

    fn listed_with(&mut self, pool: Option<Result<PoolSpec, PoolSpecError>>, pods: Vec<(&str, PodFacts)>) -> &mut Self {
        self.pool(Change::Init);
        if let Some(p) = pool {
            self.pool(Change::InitApply(POOL.into(), p));
        }
        self.pool(Change::InitDone);
        self.pod(Change::Init);
        for (name, f) in pods {
            self.pod(Change::InitApply(name.into(), f));
        }
        self.pod(Change::InitDone)
    }

    /// The workers' endpoints; all are schedulable.
    fn endpoints(&self) -> Vec<String> {
        let (all, schedulable) = self.all_endpoints();
        assert_eq!(all, schedulable, "unschedulable workers");
        all
    }

    /// Every worker's endpoint, and the schedulable ones'.
    fn all_endpoints(&self) -> (Vec<String>, Vec<String>) {
        assert_eq!(self.cat.state().workers, self.applied.0.len());
        self.applied.endpoints()
    }
}

const APP: &[(&str, &str)] = &[("app", "vllm")];

#[test]
fn ready_selected_pods_with_an_ip_are_workers_one_per_port() {
    let mut f = Fixture::new();
    assert!(!f.cat.state().listed);
    f.listed_with(
        Some(spec(APP, &[8000, 8001])),
        vec![
            ("a", facts(APP, Some("10.0.0.1"), true)),
            ("b", facts(APP, Some("10.0.0.2"), false)),
            ("c", facts(APP, None, true)),
            ("d", facts(&[("app", "other")], Some("10.0.0.4"), true)),
        ],
    );
    assert_eq!(f.cat.state(), DiscoveryState { pool_present: true, listed: true, workers: 2 });
    assert_eq!(f.endpoints(), ["10.0.0.1:8000", "10.0.0.1:8001"]);
    assert!(f.applied.0.contains_key(&worker_id(NS, "a", 8001)));

    // b becomes ready; a unready stays a worker, unschedulable; c gets its
    // IP but, never Ready, is still none.
    f.pod(Change::Apply("b".into(), facts(APP, Some("10.0.0.2"), true)));
    f.pod(Change::Apply("a".into(), facts(APP, Some("10.0.0.1"), false)));
    f.pod(Change::Apply("c".into(), facts(APP, Some("10.0.0.3"), false)));
    let b = ["10.0.0.2:8000", "10.0.0.2:8001"];
    let a_and_b = ["10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"];
    assert_eq!(f.all_endpoints(), (a_and_b.map(String::from).to_vec(), b.map(String::from).to_vec()));

    // The same facts again change nothing.
    f.pod(Change::Apply("b".into(), facts(APP, Some("10.0.0.2"), true)));
    f.pod(Change::Apply("a".into(), facts(APP, Some("10.0.0.1"), false)));
    assert!(f.out.is_empty());

    // a Ready again: the same workers, schedulable (no delete: the applier
    // would panic on an upsert of a present id that changed more).
    f.pod(Change::Apply("a".into(), facts(APP, Some("10.0.0.1"), true)));
    assert_eq!(f.endpoints(), a_and_b);
    // Unready with a new IP: a new engine, not taken on until it is Ready.
    f.pod(Change::Apply("a".into(), facts(APP, Some("10.0.0.9"), false)));
    assert_eq!(f.endpoints(), b);
    f.pod(Change::Apply("a".into(), facts(APP, Some("10.0.0.9"), true)));
    assert_eq!(f.endpoints(), ["10.0.0.2:8000", "10.0.0.2:8001", "10.0.0.9:8000", "10.0.0.9:8001"]);
    f.pod(Change::Delete("a".into()));

    // Unready, then terminating, then deleted.
    f.pod(Change::Apply("b".into(), facts(APP, Some("10.0.0.2"), false)));
    assert_eq!(f.all_endpoints(), (b.map(String::from).to_vec(), Vec::new()));
    let mut dying = facts(APP, Some("10.0.0.2"), true);
    dying.terminating = true;
    f.pod(Change::Apply("b".into(), dying));
    assert!(f.endpoints().is_empty());
    f.pod(Change::Delete("b".into()));
    assert!(f.endpoints().is_empty());
}

#[test]
fn each_pod_gets_its_engine_from_its_label_or_images() {
    let mut f = Fixture::new();
    let trtllm = |ip| {
        let mut p = facts(APP, Some(ip), true);
        p.images = vec!["nvcr.io/nvidia/tensorrt-llm/release:1.2.0".into(), "busybox".into()];
        p
    };
    let labelled: &[(&str, &str)] = &[("app", "vllm"), (ENGINE_LABEL, "trtllm-zmq")];
    f.listed_with(
        Some(spec(APP, &[8000])),
        vec![
            ("v", facts(APP, Some("10.0.0.1"), true)),
            ("t", trtllm("10.0.0.2")),
            ("z", PodFacts { labels: facts(labelled, None, true).labels, ..trtllm("10.0.0.3") }),
        ],
    );
    assert_eq!(f.endpoints().len(), 3);
    let cat_workers: Vec<(String, EngineKind, String)> = f
        .cat
        .workers
        .values()
        .flat_map(|(_, ws)| ws.values())
        .map(|w| (w.pod.clone(), w.engine, w.publisher.endpoint.clone()))
        .collect();
    let mut got = cat_workers;
    got.sort();
    assert_eq!(
        got,
        [
            ("t".to_owned(), EngineKind::Trtllm, "http://10.0.0.2:8000/kv_cache_events".to_owned()),
            ("v".to_owned(), EngineKind::Vllm, "tcp://10.0.0.1:5557".to_owned()),
            ("z".to_owned(), EngineKind::TrtllmZmq, "tcp://10.0.0.3:5557".to_owned()),
        ]
    );
    // Relabelling a pod moves its worker to the other source: a delete and
    // an upsert of the same id.
    let relabelled = PodFacts {
        labels: facts(&[("app", "vllm"), (ENGINE_LABEL, "trtllm")], None, true).labels,
        ..trtllm("10.0.0.3")
    };
    f.cat.on_pod(Change::Apply("z".into(), relabelled), &mut f.out);
    let id = worker_id(NS, "z", 8000);
    assert!(
        matches!(&f.out[..], [WorkerUpdate::Delete(d), WorkerUpdate::Upsert(w)]
            if *d == id && w.publisher.endpoint == "http://10.0.0.3:8000/kv_cache_events"),
        "{:?}",
        f.out
    );
    f.applied.apply(&mut f.out);
}

#[test]
fn each_pod_gets_its_role_from_the_peers_labels() {
    let mut f = Fixture::new();
    let with = |extra: (&'static str, &'static str), ip| {
        let labels = [("app", "vllm"), extra];
        facts(&labels, Some(ip), true)
    };
    f.listed_with(
        Some(spec(APP, &[8000])),
        vec![
            ("agg", facts(APP, Some("10.0.0.1"), true)),
            ("p", with((crate::LLM_D_ROLE_LABEL, "prefill"), "10.0.0.2")),
            ("d", with((crate::DYNAMO_ROLE_LABEL, "decode"), "10.0.0.3")),
            ("enc", with((crate::LLM_D_ROLE_LABEL, "encode"), "10.0.0.4")),
            ("odd", with((crate::LLM_D_ROLE_LABEL, "router"), "10.0.0.5")),
        ],
    );
    let mut got: Vec<(String, Role)> =
        f.cat.workers.values().flat_map(|(_, ws)| ws.values()).map(|w| (w.pod.clone(), w.role)).collect();
    got.sort();
    let want = [("agg", Role::Both), ("d", Role::Decode), ("odd", Role::Both), ("p", Role::Prefill)];
    assert_eq!(got, want.map(|(p, r)| (p.to_owned(), r)), "an encoder is no worker; an unknown role is aggregated");
    // A relabelled pod moves to the other selector: a delete and an upsert.
    f.out.clear();
    f.cat.on_pod(Change::Apply("p".into(), with((crate::LLM_D_ROLE_LABEL, "decode"), "10.0.0.2")), &mut f.out);
    let id = worker_id(NS, "p", 8000);
    assert!(
        matches!(&f.out[..], [WorkerUpdate::Delete(d), WorkerUpdate::Upsert(w)] if *d == id && w.role == Role::Decode),
        "{:?}",
        f.out
    );
}

#[test]
fn an_ip_change_is_a_delete_then_an_upsert_of_the_same_id() {
    let mut f = Fixture::new();
    f.listed_with(Some(spec(APP, &[8000])), vec![("a", facts(APP, Some("10.0.0.1"), true))]);
    f.cat.on_pod(Change::Apply("a".into(), facts(APP, Some("10.0.0.9"), true)), &mut f.out);
    let id = worker_id(NS, "a", 8000);
    assert!(matches!(&f.out[..], [WorkerUpdate::Delete(d), WorkerUpdate::Upsert(w)] if *d == id && w.id() == id));
    f.applied.apply(&mut f.out);
    assert_eq!(f.endpoints(), ["10.0.0.9:8000"]);
}

/// Restarted containers (or the pod recreated under its name) are new
/// engines: the kept worker is replaced, never carried over Ready.
#[test]
fn a_restarted_pod_is_a_new_worker_whether_or_not_it_left_ready() {
    let mut f = Fixture::new();
    let run = |restarts, ready| PodFacts {
        run: PodRun { uid: Some("u1".into()), restarts },
        ..facts(APP, Some("10.0.0.1"), ready)
    };
    f.listed_with(Some(spec(APP, &[8000])), vec![("a", run(0, true))]);
    let id = worker_id(NS, "a", 8000);
    let replaced = |out: &[WorkerUpdate]| matches!(out, [WorkerUpdate::Delete(d), WorkerUpdate::Upsert(w)] if *d == id && w.id() == id);

    // Out of Ready, restarted meanwhile: dropped until Ready, then new.
    f.pod(Change::Apply("a".into(), run(0, false)));
    f.cat.on_pod(Change::Apply("a".into(), run(1, false)), &mut f.out);
    assert_eq!(f.out, [WorkerUpdate::Delete(id)]);
    f.applied.apply(&mut f.out);
    f.pod(Change::Apply("a".into(), run(1, true)));
    assert_eq!(f.endpoints(), ["10.0.0.1:8000"]);

    // Restarted without kvpick seeing it leave Ready.
    f.cat.on_pod(Change::Apply("a".into(), run(2, true)), &mut f.out);
    assert!(replaced(&f.out), "{:?}", f.out);
    f.applied.apply(&mut f.out);

    // Recreated under the same name (a new uid).
    let again = PodFacts { run: PodRun { uid: Some("u2".into()), restarts: 0 }, ..facts(APP, Some("10.0.0.1"), true) };
    f.cat.on_pod(Change::Apply("a".into(), again.clone()), &mut f.out);
    assert!(replaced(&f.out), "{:?}", f.out);
    f.applied.apply(&mut f.out);
    f.pod(Change::Apply("a".into(), again));
    assert!(f.out.is_empty());
}

#[test]
fn pool_edits_reconcile_every_pod() {
    let mut f = Fixture::new();
    let pods = vec![
        ("a", facts(&[("app", "vllm"), ("gen", "1")], Some("10.0.0.1"), true)),
        ("b", facts(&[("app", "vllm"), ("gen", "2")], Some("10.0.0.2"), true)),
    ];
    f.listed_with(Some(spec(APP, &[8000])), pods);
    assert_eq!(f.endpoints(), ["10.0.0.1:8000", "10.0.0.2:8000"]);

    f.pool(Change::Apply(POOL.into(), spec(&[("gen", "2")], &[8000])));
    assert_eq!(f.endpoints(), ["10.0.0.2:8000"]);

    // Ports added and reordered: ranks move, so 8000's worker is replaced.
    let id = worker_id(NS, "b", 8000);
    f.cat.on_pool(Change::Apply(POOL.into(), spec(&[("gen", "2")], &[8002, 8000])), &mut f.out);
    let ranks: Vec<(WorkerId, u16)> = f
        .out
        .iter()
        .filter_map(|u| match u {
            WorkerUpdate::Upsert(w) => Some((w.id(), w.rank)),
            WorkerUpdate::Delete(_) => None,
        })
        .collect();
    assert!(ranks.contains(&(id, 1)) && ranks.contains(&(worker_id(NS, "b", 8002), 0)), "{ranks:?}");
    f.applied.apply(&mut f.out);
    assert_eq!(f.endpoints(), ["10.0.0.2:8000", "10.0.0.2:8002"]);

    // A status-only update (same spec) is no change.
    f.pool(Change::Apply(POOL.into(), spec(&[("gen", "2")], &[8002, 8000])));
    assert!(f.out.is_empty());

    // Invalid, then valid again, then deleted.
    f.pool(Change::Apply(POOL.into(), Err(PoolSpecError::NoTargetPorts)));
    assert!(f.endpoints().is_empty());
    assert!(!f.cat.state().pool_present && !f.cat.state().is_ready());
    f.pool(Change::Apply(POOL.into(), spec(APP, &[8000])));
    assert_eq!(f.endpoints(), ["10.0.0.1:8000", "10.0.0.2:8000"]);
    assert!(f.cat.state().is_ready());
    f.pool(Change::Delete(POOL.into()));
    assert!(f.endpoints().is_empty());
    assert_eq!(f.cat.state(), DiscoveryState { pool_present: false, listed: true, workers: 0 });
}

#[test]
fn a_missing_pool_is_listed_but_not_ready_until_created() {
    let mut f = Fixture::new();
    f.listed_with(None, vec![("a", facts(APP, Some("10.0.0.1"), true))]);
    assert_eq!(f.cat.state(), DiscoveryState { pool_present: false, listed: true, workers: 0 });
    f.pool(Change::Apply(POOL.into(), spec(APP, &[8000])));
    assert_eq!(f.endpoints(), ["10.0.0.1:8000"]);
    assert!(f.cat.state().is_ready());
}

#[test]
fn a_relist_keeps_the_view_until_done_then_applies_only_the_difference() {
    let mut f = Fixture::new();
    let pods = vec![("a", facts(APP, Some("10.0.0.1"), true)), ("b", facts(APP, Some("10.0.0.2"), true))];
    f.listed_with(Some(spec(APP, &[8000])), pods);

    // Relist (after 410): a unchanged, b gone, c new.
    f.pod(Change::Init);
    f.pod(Change::InitApply("a".into(), facts(APP, Some("10.0.0.1"), true)));
    f.pod(Change::InitApply("c".into(), facts(APP, Some("10.0.0.3"), true)));
    assert_eq!(f.endpoints(), ["10.0.0.1:8000", "10.0.0.2:8000"]);
    f.cat.on_pod(Change::InitDone, &mut f.out);
    assert_eq!(f.out.len(), 2, "only b's delete and c's upsert: {:?}", f.out);
    f.applied.apply(&mut f.out);
    assert_eq!(f.endpoints(), ["10.0.0.1:8000", "10.0.0.3:8000"]);
}

#[test]
fn peers_are_the_union_of_slices() {
    let mut cfg = DiscoveryConfig::new(NS, POOL, 16);
    cfg.peer_service = Some("epp".into());
    cfg.pod_ip = Some("10.0.0.9".parse().unwrap());
    let mut cat = Catalog::new(cfg);
    let addr = |s: &str| SocketAddr::new(s.parse::<IpAddr>().unwrap(), 9092);
    assert!(!cat.on_slice(Change::Init));
    assert!(!cat.on_slice(Change::InitApply("s1".into(), SliceFacts { peers: vec![addr("10.0.0.1")] })));
    assert!(cat.on_slice(Change::InitDone));
    assert!(cat.on_slice(Change::Apply("s2".into(), SliceFacts { peers: vec![addr("10.0.0.2")] })));
    assert!(!cat.on_slice(Change::Apply("s3".into(), SliceFacts { peers: vec![addr("10.0.0.2")] })));
    assert_eq!(cat.peers().len(), 2);
    assert!(cat.on_slice(Change::Delete("s1".into())));
    assert_eq!(cat.peers().iter().copied().collect::<Vec<_>>(), vec![addr("10.0.0.2")]);
    // Listed needs the slices too.
    assert!(!cat.state().listed);
}
