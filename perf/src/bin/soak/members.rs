//! How kvpick learns the fleet: a static workers file, or Kubernetes (a
//! fake API server in this process serving the InferencePool and one pod
//! per engine, each engine on a loopback address of its own as a pod on
//! its IP, all on the same ports). The chaos schedule takes an engine out
//! of the fleet and back through here (its entry removed, or its pod not
//! Ready), and breaks the API server's watches.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use kvpick_discovery::ENGINE_LABEL;
use kvpick_discovery::workers_file::{self, Entry};
use kvpick_perf::sim::Engine;
use kvpick_test_support::fake_kube::objects::{pod, pool};
use kvpick_test_support::fake_kube::{APP, FakeKube, Kind, NS, POOL};

/// The loopback address of engine `i`'s pod in Kubernetes mode.
pub fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 10 + (i % 240) as u8)
}

/// Where kvpick reads the fleet from.
pub enum Members {
    File(PathBuf),
    Kube { api: FakeKube, kubeconfig: PathBuf },
}

/// What one engine looks like to discovery.
pub struct Listed<'a> {
    pub engine: &'a Engine,
    /// Out of the fleet for now.
    pub out: bool,
}

impl Members {
    /// A workers file at `dir/workers.json`, or a fake API server with a
    /// kubeconfig at `dir/kubeconfig`.
    pub async fn start(kube: bool, dir: &Path) -> Result<Members, String> {
        if !kube {
            return Ok(Members::File(dir.join("workers.json")));
        }
        let api = FakeKube::start(NS).await;
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig()).map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
        Ok(Members::Kube { api, kubeconfig })
    }

    pub fn is_kube(&self) -> bool {
        matches!(self, Members::Kube { .. })
    }

    /// kvpick's discovery settings, given the engines' KV-event and replay
    /// ports (the same on every pod; the HTTP port is the pool's).
    pub fn settings(&self, events: u16, replay: u16) -> Vec<(&'static str, String)> {
        use kvpick_app::app::settings as var;
        match self {
            Members::File(path) => vec![
                (var::DISCOVERY, "static".into()),
                (var::WORKERS_FILE, path.display().to_string()),
                (var::WORKERS_FILE_POLL_MS, "200".into()),
            ],
            Members::Kube { kubeconfig, .. } => {
                vec![
                    ("KUBECONFIG", kubeconfig.display().to_string()),
                    (var::DISCOVERY, "kubernetes".into()),
                    (var::POOL_NAME, POOL.into()),
                    (var::NAMESPACE, NS.into()),
                    (var::KV_EVENT_PORT, events.to_string()),
                    (var::KV_EVENT_REPLAY_PORT, replay.to_string()),
                ]
            }
        }
    }

    /// Publishes the fleet: every engine, those `out` left out of the
    /// workers file or with their pod not Ready.
    pub fn publish(&self, engines: &[Listed<'_>]) -> Result<(), String> {
        match self {
            Members::File(path) => {
                let entries: Vec<Entry> = engines
                    .iter()
                    .filter(|l| !l.out)
                    .map(|l| {
                        let ep = l.engine.endpoints();
                        let flavour = l.engine.config().flavour;
                        Entry::for_engine(flavour, ep.http, ep.events.clone(), Some(ep.replay.clone()))
                    })
                    .collect();
                workers_file::write(path, &entries).map_err(|e| format!("{}: {e}", path.display()))
            }
            Members::Kube { api, .. } => {
                let port = engines.first().map_or(0, |l| l.engine.endpoints().http.port());
                api.edit(|state| {
                    state.put(Kind::InferencePool, pool(POOL, APP, &[port]));
                    for (i, l) in engines.iter().enumerate() {
                        let flavour = l.engine.config().flavour.to_string();
                        let labels = [APP[0], (ENGINE_LABEL, flavour.as_str())];
                        let ip = l.engine.endpoints().http.ip().to_string();
                        state.put(Kind::Pod, pod(&format!("engine-{i}"), &labels, Some(&ip), !l.out));
                    }
                });
                Ok(())
            }
        }
    }

    /// The fake API server, in Kubernetes mode.
    pub fn api(&self) -> Option<&FakeKube> {
        match self {
            Members::Kube { api, .. } => Some(api),
            Members::File(_) => None,
        }
    }
}
