//! The task that runs the three watches and drives the catalog.
//!
//! Each watch is kube-runtime's `watcher` rather than a hand-written
//! list+watch loop: it already does what the API server contract asks
//! (paginated LIST, WATCH from the list's resourceVersion with bookmarks,
//! resume from the last seen version when a watch ends, relist after
//! `410 Gone`) and reports a relist as `Init`…`InitDone`, which `store`
//! applies atomically. Errors come out of the stream; `StreamBackoff` with
//! [`WatchBackoff`] spaces the retries. One task owns the catalog and
//! `select!`s over the three streams, so no state is shared or locked.

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::{mpsc, watch as tokio_watch};
use tracing::{error, info, warn};

use super::backoff::WatchBackoff;
use super::catalog::Catalog;
use super::config::DiscoveryConfig;
use super::metrics::{DiscoveryMetrics, Resource};
use super::peers::SliceFacts;
use super::pod::PodFacts;
use super::pool;
use super::store::Change;
use super::{DiscoveryState, WorkerUpdate};

pub(crate) struct Outputs {
    pub updates: mpsc::Sender<WorkerUpdate>,
    pub state: tokio_watch::Sender<DiscoveryState>,
    pub peers: tokio_watch::Sender<std::collections::BTreeSet<std::net::SocketAddr>>,
    pub metrics: std::sync::Arc<DiscoveryMetrics>,
}

type Watch<T> = BoxStream<'static, Result<Change<T>, watcher::Error>>;

/// Runs until `outputs.updates` is closed (or the task is aborted).
pub(crate) async fn run(client: kube::Client, cfg: DiscoveryConfig, outputs: Outputs) {
    let mut pools = pool_watch(&client, &cfg);
    let mut pods = pod_watch(&client, &cfg);
    let mut slices = slice_watch(&client, &cfg);
    info!(
        namespace = %cfg.namespace, pool = %cfg.pool_name, peer_service = ?cfg.peer_service,
        "discovery started: watching the InferencePool, its pods{}",
        if cfg.peer_service.is_some() { " and the peer EndpointSlices" } else { "" }
    );
    let mut catalog = Catalog::new(cfg);
    let mut out = Vec::new();
    let metrics = &*outputs.metrics;
    loop {
        let peers_changed = tokio::select! {
            Some(ev) = pools.next() => {
                if let Some(change) = ok_or_log(ev, Resource::InferencePool, metrics) {
                    catalog.on_pool(change, &mut out);
                }
                false
            }
            Some(ev) = pods.next() => {
                if let Some(change) = ok_or_log(ev, Resource::Pods, metrics) {
                    catalog.on_pod(change, &mut out);
                }
                false
            }
            Some(ev) = slices.next() => {
                ok_or_log(ev, Resource::EndpointSlices, metrics).is_some_and(|c| catalog.on_slice(c))
            }
            () = outputs.updates.closed() => {
                info!("discovery stopped: its update receiver was dropped");
                return;
            }
            else => {
                // The watcher streams never end (the back-off never gives up).
                error!("discovery: every watch stream ended; no more worker updates");
                outputs.state.send_replace(DiscoveryState::default());
                return;
            }
        };
        for update in out.drain(..) {
            if outputs.updates.send(update).await.is_err() {
                info!("discovery stopped: its update receiver was dropped");
                return;
            }
        }
        let state = catalog.state();
        outputs.state.send_if_modified(|s| std::mem::replace(s, state) != state);
        if peers_changed {
            outputs.peers.send_replace(catalog.peers().clone());
        }
    }
}

fn watcher_config(cfg: &DiscoveryConfig) -> watcher::Config {
    // `MostRecent`: a (re)list is a consistent read, never an older view from
    // the watch cache than the one it replaces (which could resurrect a pod
    // seen deleted). Three watches per replica cost etcd little.
    watcher::Config::default().page_size(cfg.list_page_size).list_semantic(watcher::ListSemantic::MostRecent)
}

fn backoff(cfg: &DiscoveryConfig) -> WatchBackoff {
    WatchBackoff::new(cfg.backoff_min, cfg.backoff_max)
}

fn pool_watch(client: &kube::Client, cfg: &DiscoveryConfig) -> Watch<Result<pool::PoolSpec, pool::PoolSpecError>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &cfg.namespace, &pool::api_resource());
    let wc = watcher_config(cfg).fields(&format!("metadata.name={}", cfg.pool_name));
    watcher(api, wc)
        .backoff(backoff(cfg))
        .filter_map(|ev| async move {
            map_event(ev, |obj: DynamicObject| Some((obj.metadata.name.clone()?, pool::parse(&obj))))
        })
        .boxed()
}

fn pod_watch(client: &kube::Client, cfg: &DiscoveryConfig) -> Watch<PodFacts> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &cfg.namespace);
    watcher(api, watcher_config(cfg))
        .backoff(backoff(cfg))
        .filter_map(|ev| async move { map_event(ev, |pod: Pod| PodFacts::from_pod(&pod)) })
        .boxed()
}

fn slice_watch(client: &kube::Client, cfg: &DiscoveryConfig) -> Watch<SliceFacts> {
    let (Some(service), Some(own_ip)) = (&cfg.peer_service, cfg.pod_ip) else {
        return stream::pending().boxed();
    };
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &cfg.namespace);
    let wc = watcher_config(cfg).labels(&format!("kubernetes.io/service-name={service}"));
    let port = cfg.peer_port;
    watcher(api, wc)
        .backoff(backoff(cfg))
        .filter_map(move |ev| async move {
            map_event(ev, |slice: EndpointSlice| SliceFacts::from_slice(&slice, own_ip, port))
        })
        .boxed()
}

/// A watcher event as a store change; `None` for an object without a name
/// (which a real API server never sends), logged.
fn map_event<K, T>(
    ev: Result<Event<K>, watcher::Error>,
    facts: impl Fn(K) -> Option<(String, T)>,
) -> Option<Result<Change<T>, watcher::Error>> {
    let change = match ev {
        Err(e) => return Some(Err(e)),
        Ok(Event::Init) => Change::Init,
        Ok(Event::InitDone) => Change::InitDone,
        Ok(Event::InitApply(obj)) => {
            let (name, t) = named(facts(obj))?;
            Change::InitApply(name, t)
        }
        Ok(Event::Apply(obj)) => {
            let (name, t) = named(facts(obj))?;
            Change::Apply(name, t)
        }
        Ok(Event::Delete(obj)) => Change::Delete(named(facts(obj))?.0),
    };
    Some(Ok(change))
}

fn named<T>(facts: Option<(String, T)>) -> Option<(String, T)> {
    if facts.is_none() {
        warn!("discovery: skipped an object without a name");
    }
    facts
}

/// Counts a completed list; counts and logs a watch error (the watcher
/// then backs off and recovers by itself).
fn ok_or_log<T>(
    ev: Result<Change<T>, watcher::Error>,
    resource: Resource,
    metrics: &DiscoveryMetrics,
) -> Option<Change<T>> {
    let err = match ev {
        Ok(change) => {
            if matches!(change, Change::InitDone) {
                metrics.listed(resource);
            }
            return Some(change);
        }
        Err(err) => err,
    };
    let what = resource.label();
    let code = match &err {
        watcher::Error::WatchError(resp) => Some(resp.code),
        watcher::Error::InitialListFailed(kube::Error::Api(resp))
        | watcher::Error::WatchStartFailed(kube::Error::Api(resp))
        | watcher::Error::WatchFailed(kube::Error::Api(resp)) => Some(resp.code),
        _ => None,
    };
    if code == Some(410) {
        metrics.expired(resource);
    } else {
        metrics.failed(resource);
    }
    match code {
        Some(410) => info!("{what} watch expired (410 Gone): relisting"),
        Some(401 | 403) => error!(
            "{what} watch refused ({err}): kvpick's ServiceAccount needs get/list/watch on it (deploy/manifests/00-rbac.yaml); retrying"
        ),
        _ => warn!("{what} watch failed ({err}); retrying with back-off"),
    }
    None
}
