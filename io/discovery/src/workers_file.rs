//! Static discovery: the workers listed in a file, re-read when it changes.
//!
//! The file is YAML or JSON (JSON is YAML), a list of
//! `{endpoint: "ip:port", kv_events: "tcp://ip:port", replay: "tcp://ip:port"?,
//! block_size?, model?, engine?, role?}` (or a map with that list under
//! `workers`).
//! `engine` is `vllm` (the default), `sglang`, `trtllm` or `trtllm-zmq`
//! (`EngineKind`); a `trtllm` worker's `kv_events` may be left out: its
//! drain, `http://<endpoint>/kv_cache_events`, is polled. `role` is
//! `both` (the default), `prefill` or `decode` (`Role`). Each
//! change is diffed against what was handed out and sent as the same
//! [`WorkerUpdate`]s Kubernetes discovery sends, with the same invariant: an
//! id is upserted only when absent, deleted only when present, and a worker
//! whose facts change is deleted and upserted again.
//!
//! A file that cannot be read or parsed leaves the workers as they were
//! (logged once per distinct error): a half-written edit never empties the
//! pool.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kvpick_core::{Lifecycle, WorkerId, WorkerSpec};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use xxhash_rust::xxh3::xxh3_64;

use crate::{DiscoveredWorker, DiscoveryMetrics, EngineKind, Role, WorkerUpdate};
use kvpick_kv_events::Publisher;

/// Largest workers file read: a pool's list is a few hundred bytes per
/// worker; a file far past that is a mistake (or a hostile mount), not a
/// pool, and is refused before it is parsed.
pub const MAX_FILE_BYTES: u64 = 8 << 20;
/// Most workers one file may list.
pub const MAX_WORKERS: usize = 4096;

/// Reads the file whole, up to [`MAX_FILE_BYTES`]: a bigger one is an error.
fn read_capped(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "the file is over {MAX_FILE_BYTES} bytes; a workers file lists at most {MAX_WORKERS} workers"
        ));
    }
    Ok(text)
}

/// Facts every worker shares unless its entry says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Defaults {
    pub block_size: u32,
    pub model: Option<String>,
    pub max_num_batched_tokens: Option<u64>,
    pub total_kv_blocks: Option<u64>,
}

/// One worker as the file spells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// `ip:port` of the engine's HTTP server: what the gateway routes to.
    pub endpoint: String,
    /// The engine's KV-event PUB socket, `tcp://ip:port`, or TensorRT-LLM's
    /// drain URL, `http://ip:port/kv_cache_events`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kv_events: String,
    /// The engine's replay socket, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `vllm`, `sglang`, `trtllm` or `trtllm-zmq`; vLLM when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// `prefill`, `decode` or `both`; both when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

impl Entry {
    pub fn new(endpoint: SocketAddr, kv_events: impl Into<String>, replay: Option<String>) -> Entry {
        Entry { endpoint: endpoint.to_string(), kv_events: kv_events.into(), replay, ..Entry::default() }
    }

    /// A worker running `engine` (as the file spells it) at `endpoint`, with
    /// its ZMQ sockets; an engine whose events are drained over HTTP from
    /// the endpoint (`trtllm`) gets none, whatever is passed.
    pub fn for_engine(
        engine: impl std::fmt::Display,
        endpoint: SocketAddr,
        kv_events: impl Into<String>,
        replay: Option<String>,
    ) -> Entry {
        let engine = engine.to_string();
        let base = if engine.parse().is_ok_and(EngineKind::drains_events) {
            Entry { endpoint: endpoint.to_string(), ..Entry::default() }
        } else {
            Entry::new(endpoint, kv_events, replay)
        };
        Entry { engine: Some(engine), ..base }
    }
}

/// Writes a workers file (JSON, which is YAML too) atomically: a sibling
/// temporary file renamed over it, so a reader never sees half a file (a
/// ConfigMap update behaves the same way).
pub fn write(path: &Path, entries: &[Entry]) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(entries).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FileShape {
    List(Vec<Entry>),
    Map { workers: Vec<Entry> },
}

/// The id of a static worker: xxh3-64 of `"static/ip:port"`, stable across
/// restarts and edits that keep its endpoint.
pub fn static_worker_id(endpoint: SocketAddr) -> WorkerId {
    WorkerId(xxh3_64(format!("static/{endpoint}").as_bytes()))
}

/// Parses the file's text into workers, by id.
pub fn parse(text: &str, defaults: &Defaults) -> Result<BTreeMap<WorkerId, DiscoveredWorker>, String> {
    let shape: FileShape = serde_yaml::from_str(text).map_err(|e| {
        format!("expected a list of {{endpoint, kv_events, replay?, block_size?, model?, engine?, role?}}: {e}")
    })?;
    let entries = match shape {
        FileShape::List(entries) | FileShape::Map { workers: entries } => entries,
    };
    if entries.len() > MAX_WORKERS {
        return Err(format!("{} workers listed; at most {MAX_WORKERS}", entries.len()));
    }
    let mut workers = BTreeMap::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let endpoint: SocketAddr = entry
            .endpoint
            .trim()
            .parse()
            .map_err(|_| format!("worker {i}: endpoint {:?} is not ip:port", entry.endpoint))?;
        let engine: EngineKind = match &entry.engine {
            None => EngineKind::default(),
            Some(name) => name.parse().map_err(|why| format!("worker {i} ({endpoint}): {why}"))?,
        };
        let role: Role = match &entry.role {
            None => Role::default(),
            Some(name) => name.parse().map_err(|why| format!("worker {i} ({endpoint}): {why}"))?,
        };
        let id = static_worker_id(endpoint);
        let publisher = match entry.kv_events.trim() {
            "" if engine.drains_events() => Publisher::trtllm_drain(id, endpoint),
            "" => {
                return Err(format!(
                    "worker {i} ({endpoint}): kv_events is missing (a {engine} worker publishes over ZMQ)"
                ));
            }
            given => Publisher {
                worker: id,
                endpoint: given.to_owned(),
                replay_endpoint: entry.replay.as_ref().map(|r| r.trim().to_owned()),
                topic: Vec::new(),
            },
        };
        let is_zmq = |e: &str| e.starts_with("tcp://") || e.starts_with("ipc://") || e.starts_with("inproc://");
        let (source_fits, want) = if engine.drains_events() {
            (publisher.is_drain(), "its drain, http://ip:port/kv_cache_events (engine trtllm-zmq subscribes to ZMQ)")
        } else {
            (is_zmq(&publisher.endpoint), "a ZMQ endpoint like tcp://ip:port")
        };
        if !source_fits {
            let kv_events = &publisher.endpoint;
            return Err(format!("worker {i} ({endpoint}): kv_events {kv_events:?} of a {engine} worker is not {want}"));
        }
        if engine.drains_events() && entry.replay.is_some() {
            return Err(format!("worker {i} ({endpoint}): a drained trtllm worker has no replay endpoint"));
        }
        if let Some(replay) = entry.replay.as_ref().filter(|r| !is_zmq(r)) {
            return Err(format!("worker {i} ({endpoint}): replay {replay:?} is not a ZMQ endpoint like tcp://ip:port"));
        }
        let block_size = entry.block_size.unwrap_or(defaults.block_size);
        if block_size != defaults.block_size {
            // Prompts are hashed once, with one block size, for every worker.
            return Err(format!(
                "worker {i} ({endpoint}): block_size {block_size} differs from DYN_KV_CACHE_BLOCK_SIZE {}; \
                 one kvpick serves engines of one block size",
                defaults.block_size
            ));
        }
        let spec = WorkerSpec {
            id,
            endpoint,
            model: entry.model.or_else(|| defaults.model.clone()),
            block_size,
            total_kv_blocks: defaults.total_kv_blocks,
            max_num_batched_tokens: defaults.max_num_batched_tokens,
            lifecycle: Lifecycle::Schedulable,
        };
        let worker = DiscoveredWorker { spec, publisher, pod: endpoint.to_string(), rank: 0, engine, role };
        if workers.insert(id, worker).is_some() {
            return Err(format!("worker {i}: endpoint {endpoint} is listed twice"));
        }
    }
    Ok(workers)
}

/// The updates that turn `current` into `wanted`, deletes first.
pub fn diff(
    current: &BTreeMap<WorkerId, DiscoveredWorker>,
    wanted: &BTreeMap<WorkerId, DiscoveredWorker>,
) -> Vec<WorkerUpdate> {
    let mut updates = Vec::new();
    for (id, worker) in current {
        if wanted.get(id) != Some(worker) {
            updates.push(WorkerUpdate::Delete(*id));
        }
    }
    for (id, worker) in wanted {
        if current.get(id) != Some(worker) {
            updates.push(WorkerUpdate::Upsert(Box::new(worker.clone())));
        }
    }
    updates
}

/// Watches the file; the first read happens before this returns, so the
/// caller knows the starting workers (or why there are none).
pub struct WorkersFile {
    path: PathBuf,
    defaults: Defaults,
    current: BTreeMap<WorkerId, DiscoveredWorker>,
    last_text: Option<String>,
    last_error: Option<String>,
    metrics: Arc<DiscoveryMetrics>,
}

impl WorkersFile {
    /// Reads the file once; an unreadable or invalid file at start is an
    /// error (the operator should hear of a typo at once).
    pub fn open(path: &Path, defaults: Defaults) -> Result<(WorkersFile, Vec<WorkerUpdate>), String> {
        let mut file = WorkersFile {
            path: path.to_owned(),
            defaults,
            current: BTreeMap::new(),
            last_text: None,
            last_error: None,
            metrics: Arc::default(),
        };
        let text = read_capped(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let updates = file.apply_text(text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((file, updates))
    }

    pub fn workers(&self) -> impl Iterator<Item = &DiscoveredWorker> {
        self.current.values()
    }

    fn apply_text(&mut self, text: String) -> Result<Vec<WorkerUpdate>, String> {
        if self.last_text.as_deref() == Some(text.as_str()) {
            return Ok(Vec::new());
        }
        let wanted = parse(&text, &self.defaults)?;
        let updates = diff(&self.current, &wanted);
        self.current = wanted;
        self.last_text = Some(text);
        Ok(updates)
    }

    /// Its counters (the refused reads).
    pub fn metrics(&self) -> Arc<DiscoveryMetrics> {
        Arc::clone(&self.metrics)
    }

    /// Re-reads the file: the updates since the last good read; nothing
    /// when it is unchanged, unreadable or invalid.
    pub fn reload(&mut self) -> Vec<WorkerUpdate> {
        let result = read_capped(&self.path).and_then(|text| self.apply_text(text));
        match result {
            Ok(updates) => {
                if !updates.is_empty() || self.last_error.is_some() {
                    tracing::info!(file = %self.path.display(), changes = updates.len(), workers = self.current.len(), "workers file re-read");
                }
                self.last_error = None;
                updates
            }
            Err(error) => {
                self.metrics.workers_file_refused();
                if self.last_error.as_deref() != Some(error.as_str()) {
                    tracing::error!(file = %self.path.display(), %error, "workers file not applied; keeping the previous workers");
                    self.last_error = Some(error);
                }
                Vec::new()
            }
        }
    }

    /// Polls every `every` until `updates` closes; the first updates are
    /// the caller's (from [`WorkersFile::open`]).
    pub async fn watch(mut self, every: Duration, updates: mpsc::Sender<WorkerUpdate>) {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            for update in self.reload() {
                if updates.send(update).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults { block_size: 16, model: Some("m".into()), max_num_batched_tokens: None, total_kv_blocks: None }
    }

    #[test]
    fn an_engine_entry_has_sockets_unless_it_is_drained() {
        let at: SocketAddr = "127.0.0.1:8000".parse().unwrap_or_else(|e| panic!("{e}"));
        let zmq = |engine| Entry::for_engine(engine, at, "tcp://127.0.0.1:5557", Some("tcp://127.0.0.1:5558".into()));
        for engine in ["vllm", "sglang", "trtllm-zmq"] {
            let entry = zmq(engine);
            assert_eq!((entry.kv_events.as_str(), entry.replay.is_some()), ("tcp://127.0.0.1:5557", true), "{engine}");
            assert_eq!(entry.engine.as_deref(), Some(engine));
        }
        let drained = zmq("trtllm");
        assert_eq!((drained.kv_events.as_str(), drained.replay.as_deref()), ("", None));
        let workers = parse(&serde_json::to_string(&[drained]).unwrap_or_default(), &defaults())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(workers.values().all(|w| w.publisher.is_drain()), "drained from its endpoint");
    }

    #[test]
    fn what_write_writes_parses_back() {
        let dir = std::env::temp_dir().join(format!("kvpick-wf-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("w.json");
        let entry =
            Entry::new("127.0.0.1:8000".parse().unwrap_or_else(|e| panic!("{e}")), "tcp://127.0.0.1:5557", None);
        write(&path, std::slice::from_ref(&entry)).unwrap_or_else(|e| panic!("{e}"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        let workers = parse(&text, &defaults()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            workers.values().map(|w| w.publisher.endpoint.as_str()).collect::<Vec<_>>(),
            ["tcp://127.0.0.1:5557"]
        );
    }

    #[test]
    fn yaml_and_json_lists_parse_alike() {
        let yaml = "- endpoint: 127.0.0.1:8000\n  kv_events: tcp://127.0.0.1:5557\n  replay: tcp://127.0.0.1:5558\n";
        let json = r#"{"workers": [{"endpoint": "127.0.0.1:8000", "kv_events": "tcp://127.0.0.1:5557",
                       "replay": "tcp://127.0.0.1:5558"}]}"#;
        let a = parse(yaml, &defaults()).unwrap_or_else(|e| panic!("{e}"));
        let b = parse(json, &defaults()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a, b);
        let w = a.values().next().map(|w| (w.spec.model.clone(), w.publisher.replay_endpoint.clone()));
        assert_eq!(w, Some((Some("m".into()), Some("tcp://127.0.0.1:5558".into()))));
    }

    #[test]
    fn bad_entries_say_which_and_why() {
        let e = parse("- endpoint: nowhere\n  kv_events: tcp://x:1\n", &defaults()).err().unwrap_or_default();
        assert!(e.contains("worker 0") && e.contains("not ip:port"), "{e}");
        let e = parse("- endpoint: 1.2.3.4:5\n  kv_events: tcp://x:1\n  block_size: 32\n", &defaults())
            .err()
            .unwrap_or_default();
        assert!(e.contains("block_size 32"), "{e}");
        let e = parse("- endpoint: 1.2.3.4:5\n  kv_event: tcp://x:1\n", &defaults()).err().unwrap_or_default();
        assert!(e.contains("expected a list"), "{e}");
        let twice =
            "- {endpoint: '1.2.3.4:5', kv_events: 'tcp://x:1'}\n- {endpoint: '1.2.3.4:5', kv_events: 'tcp://x:2'}\n";
        assert!(parse(twice, &defaults()).err().unwrap_or_default().contains("listed twice"));
    }

    #[test]
    fn oversized_files_and_lists_are_refused() {
        let entry = |i: usize| {
            format!("- {{endpoint: '10.0.{}.{}:8000', kv_events: 'tcp://10.0.0.1:5557'}}\n", i / 256, i % 256)
        };
        let most: String = (0..MAX_WORKERS).map(entry).collect();
        assert_eq!(parse(&most, &defaults()).map(|w| w.len()), Ok(MAX_WORKERS));
        let over = format!("{most}{}", entry(MAX_WORKERS));
        let e = parse(&over, &defaults()).err().unwrap_or_default();
        assert!(e.contains("4097 workers listed; at most 4096"), "{e}");

        let dir = std::env::temp_dir().join(format!("kvpick-workers-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("workers.yaml");
        let big = format!("# {}\n{most}", "x".repeat(MAX_FILE_BYTES as usize));
        std::fs::write(&path, big).unwrap_or_else(|e| panic!("{e}"));
        let e = WorkersFile::open(&path, defaults()).err().unwrap_or_default();
        assert!(e.contains("over 8388608 bytes"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_refused_reload_keeps_the_workers_and_is_counted() {
        let dir = std::env::temp_dir().join(format!("kvpick-workers-refused-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("workers.yaml");
        std::fs::write(&path, "- {endpoint: '10.0.0.1:8000', kv_events: 'tcp://10.0.0.1:5557'}\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let (mut file, initial) = WorkersFile::open(&path, defaults()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((initial.len(), file.metrics().workers_file_errors()), (1, 0));
        std::fs::write(&path, "- {endpoint: 'not an address'}\n").unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..2 {
            assert!(file.reload().is_empty(), "nothing applied");
        }
        assert_eq!(file.metrics().workers_file_errors(), 2, "each refused read counted");
        assert_eq!(file.workers().count(), 1, "the previous workers stay");
        std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn roles_are_read_and_default_to_both() {
        let text = "- {endpoint: '10.0.0.1:8000', kv_events: 'tcp://10.0.0.1:5557', role: prefill}\n\
                    - {endpoint: '10.0.0.2:8000', kv_events: 'tcp://10.0.0.2:5557', role: decode}\n\
                    - {endpoint: '10.0.0.3:8000', kv_events: 'tcp://10.0.0.3:5557'}\n";
        let workers = parse(text, &defaults()).unwrap_or_else(|e| panic!("{e}"));
        let mut got: Vec<(String, Role)> = workers.values().map(|w| (w.spec.endpoint.to_string(), w.role)).collect();
        got.sort();
        let want = [("10.0.0.1:8000", Role::Prefill), ("10.0.0.2:8000", Role::Decode), ("10.0.0.3:8000", Role::Both)];
        assert_eq!(got, want.map(|(e, r)| (e.to_owned(), r)));
    }

    #[test]
    fn engines_choose_the_event_source() {
        let text = "- {endpoint: '10.0.0.1:8000', engine: trtllm}\n\
                    - {endpoint: '10.0.0.2:8000', engine: trtllm-zmq, kv_events: 'tcp://10.0.0.2:5557'}\n\
                    - {endpoint: '10.0.0.3:8000', engine: sglang, kv_events: 'tcp://10.0.0.3:5557'}\n\
                    - {endpoint: '10.0.0.4:8000', engine: trtllm, kv_events: 'http://10.0.0.4:9000/kv_cache_events'}\n";
        let workers = parse(text, &defaults()).unwrap_or_else(|e| panic!("{e}"));
        let mut got: Vec<(String, EngineKind, String)> =
            workers.values().map(|w| (w.spec.endpoint.to_string(), w.engine, w.publisher.endpoint.clone())).collect();
        got.sort();
        let want = [
            ("10.0.0.1:8000", EngineKind::Trtllm, "http://10.0.0.1:8000/kv_cache_events"),
            ("10.0.0.2:8000", EngineKind::TrtllmZmq, "tcp://10.0.0.2:5557"),
            ("10.0.0.3:8000", EngineKind::Sglang, "tcp://10.0.0.3:5557"),
            ("10.0.0.4:8000", EngineKind::Trtllm, "http://10.0.0.4:9000/kv_cache_events"),
        ];
        let want: Vec<(String, EngineKind, String)> =
            want.iter().map(|(e, k, p)| ((*e).to_owned(), *k, (*p).to_owned())).collect();
        assert_eq!(got, want);

        let refused = [
            ("- {endpoint: '1.2.3.4:5'}\n", "kv_events is missing"),
            ("- {endpoint: '1.2.3.4:5', engine: tgi, kv_events: 'tcp://x:1'}\n", "unknown engine"),
            ("- {endpoint: '1.2.3.4:5', kv_events: 'http://x:1/kv_cache_events'}\n", "ZMQ endpoint"),
            ("- {endpoint: '1.2.3.4:5', engine: trtllm, kv_events: 'tcp://x:1'}\n", "trtllm-zmq"),
            ("- {endpoint: '1.2.3.4:5', engine: trtllm, replay: 'tcp://x:2'}\n", "no replay"),
            ("- {endpoint: '1.2.3.4:5', kv_events: 'tcp://x:1', replay: 'x:2'}\n", "replay"),
            ("- {endpoint: '1.2.3.4:5', kv_events: 'tcp://x:1', role: router}\n", "unknown role"),
            ("- {endpoint: '1.2.3.4:5', kv_events: 'tcp://x:1', role: encode}\n", "no generation"),
        ];
        for (text, why) in refused {
            let e = parse(text, &defaults()).err().unwrap_or_default();
            assert!(e.contains("worker 0") && e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn diff_deletes_before_upserting_and_replaces_changed_workers() {
        let one = parse("- {endpoint: '1.2.3.4:5', kv_events: 'tcp://x:1'}\n", &defaults()).unwrap_or_default();
        let changed = parse(
            "- {endpoint: '1.2.3.4:5', kv_events: 'tcp://x:9'}\n- {endpoint: '1.2.3.4:6', kv_events: 'tcp://x:2'}\n",
            &defaults(),
        )
        .unwrap_or_default();
        let updates = diff(&one, &changed);
        let kinds: Vec<_> = updates
            .iter()
            .map(|u| match u {
                WorkerUpdate::Delete(id) => format!("-{}", one.get(id).map(|w| w.spec.endpoint.port()).unwrap_or(0)),
                WorkerUpdate::Upsert(w) => format!("+{}", w.spec.endpoint.port()),
            })
            .collect();
        // Deletes first; upserts follow in id order.
        assert_eq!(kinds[0], "-5");
        let mut upserts = kinds[1..].to_vec();
        upserts.sort();
        assert_eq!(upserts, ["+5", "+6"]);
        assert!(diff(&changed, &changed).is_empty());
    }
}
