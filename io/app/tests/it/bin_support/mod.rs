//! Runs the real `kvpick` binary as a child process (static mode, JSON
//! logs on stderr) in front of simulated engines in this process, and
//! reads its ports from its `listening` log line.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvpick_discovery::workers_file::{self, Entry};
use kvpick_sim::{EngineConfig, Fleet, TimeModel};
use serde_json::{Value, json};

pub const WAIT: Duration = Duration::from_secs(20);

/// The simulated engines' base configuration: fast virtual time.
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        model: "sim-model".into(),
        num_blocks: 1024,
        default_max_tokens: 8,
        time: TimeModel { time_scale: 50.0, ..TimeModel::default() },
        ..EngineConfig::default()
    }
}

/// The ChatML fixture model of tests/fixtures/tokenizer (a Hugging Face
/// model directory made with transformers).
pub fn fixture_model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/chatml")
}

pub async fn fleet(n: usize) -> Fleet {
    Fleet::start(n, &engine_config()).await.unwrap_or_else(|e| panic!("fleet: {e}"))
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("kvpick-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the workers file for these engines (atomically: a rename, as
/// a ConfigMap update does).
pub fn write_workers(path: &Path, fleet: &Fleet, which: &[usize]) {
    let entries: Vec<Entry> = which
        .iter()
        .filter_map(|i| fleet.get(*i))
        .map(|e| {
            let ep = e.endpoints();
            Entry::new(ep.http, ep.events.clone(), Some(ep.replay.clone()))
        })
        .collect();
    workers_file::write(path, &entries).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Writes a workers file giving the first engine the prefill role and
/// the others decode.
pub fn write_roled_workers(path: &Path, fleet: &Fleet) {
    let entries: Vec<Entry> = fleet
        .endpoints()
        .iter()
        .enumerate()
        .map(|(i, e)| Entry {
            role: Some(if i == 0 { "prefill" } else { "decode" }.into()),
            ..Entry::new(e.http, e.events.clone(), Some(e.replay.clone()))
        })
        .collect();
    workers_file::write(path, &entries).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A running `kvpick serve`.
pub struct Kvpick {
    child: Child,
    pub ext_proc: SocketAddr,
    pub health: SocketAddr,
    pub metrics: SocketAddr,
    lines: mpsc::Receiver<String>,
    pub log: Vec<String>,
}

pub fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvpick"));
    // The test's own environment must not leak settings in.
    for (key, _) in std::env::vars() {
        if key.starts_with("DYN_")
            || key.starts_with("KVPICK_")
            || key.starts_with("OTEL_")
            || key == "POD_NAMESPACE"
            || key == "POD_IP"
        {
            command.env_remove(key);
        }
    }
    command
}

/// `kvpick serve` on 127.0.0.1 with OS-picked ports and `extra` flags.
pub fn serve(workers_file: &Path, extra: &[&str]) -> Kvpick {
    let mut command = binary();
    command
        .args(["serve", "--workers-file"])
        .arg(workers_file)
        .args(["--listen-address", "127.0.0.1", "--ext-proc-port", "0", "--health-port", "0", "--metrics-port", "0"])
        .args(["--log-format", "json", "--shards", "1", "--workers-file-poll-ms", "100", "--model", "sim-model"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    Kvpick::spawn(command)
}

impl Kvpick {
    /// Starts `command` (any `kvpick` subcommand with JSON logs on a piped
    /// stderr); its ports are left unset.
    pub fn spawn_unwaited(mut command: Command) -> Kvpick {
        let mut child = command.spawn().unwrap_or_else(|e| panic!("spawn kvpick: {e}"));
        let stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Kvpick { child, ext_proc: addr0(), health: addr0(), metrics: addr0(), lines, log: Vec::new() }
    }

    /// Starts `command` (a `kvpick serve` with JSON logs on a piped stderr)
    /// and waits for its `listening` line.
    pub fn spawn(command: Command) -> Kvpick {
        let mut kvpick = Kvpick::spawn_unwaited(command);
        let listening = kvpick.wait_log(|v| v["message"] == "listening");
        let field = |name: &str| -> SocketAddr {
            listening[name].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no {name} in {listening}"))
        };
        kvpick.ext_proc = field("ext_proc");
        kvpick.health = field("health");
        kvpick.metrics = field("metrics");
        kvpick
    }
}

fn addr0() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl Kvpick {
    /// Waits for a JSON log line matching `matches`; panics with the log
    /// so far after [`WAIT`].
    pub fn wait_log(&mut self, matches: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if let Ok(value) = serde_json::from_str::<Value>(&line) {
                        if matches(&value) {
                            return value;
                        }
                    }
                }
                Err(_) => panic!("log line not seen; log so far:\n{}", self.log.join("\n")),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args(["-s", name, &self.pid().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -s {name} failed");
    }

    /// Waits for the process to exit; kills it after [`WAIT`].
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                while let Ok(line) = self.lines.try_recv() {
                    self.log.push(line);
                }
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("kvpick did not exit; log:\n{}", self.log.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every log line read so far plus what is waiting.
    pub fn drain_log(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.log.push(line);
        }
        &self.log
    }
}

impl Drop for Kvpick {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `http://addr{path}` with a plain HTTP/1.0-style exchange.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_exchange(addr, "GET", path, None).await
}

/// POST a JSON `body` to `http://addr{path}`, as [`http_get`].
pub async fn http_post(addr: SocketAddr, path: &str, body: &[u8]) -> (u16, String) {
    http_exchange(addr, "POST", path, Some(body)).await
}

async fn http_exchange(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n").into_bytes();
    if let Some(body) = body {
        request.extend_from_slice(
            format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()).as_bytes(),
        );
    }
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body.unwrap_or_default());
    stream.write_all(&request).await.unwrap_or_else(|e| panic!("{e}"));
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// The samples of `/metrics`, parsed by `prometheus-parse`.
pub async fn scrape(addr: SocketAddr) -> prometheus_parse::Scrape {
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200, "GET /metrics: {body}");
    let body = dechunk(&body);
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    prometheus_parse::Scrape::parse(lines).unwrap_or_else(|e| panic!("not Prometheus text: {e}\n{body}"))
}

/// hyper answers HTTP/1.1 with chunked encoding when it does not know the
/// length up front; undo it.
fn dechunk(body: &str) -> String {
    let first = body.lines().next().unwrap_or_default();
    if !first.is_empty() && first.chars().all(|c| c.is_ascii_hexdigit()) && !body.starts_with('#') {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
            if n == 0 || after.len() < n {
                break;
            }
            out.push_str(&after[..n]);
            rest = after[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_owned()
    }
}

/// The value of a counter or gauge sample with these labels (0 when absent).
pub fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// A multi-turn-style chat body.
pub fn chat(text: &str) -> Vec<u8> {
    json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 8,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
    .into_bytes()
}

/// A conversation of `turns` turns sharing a long system prompt on `topic`,
/// through the miniature gateway to kvpick; the endpoints picked (each
/// checked to be one of the fleet's).
pub async fn conversation(kvpick: &Kvpick, fleet: &Fleet, topic: &str, turns: usize) -> Vec<SocketAddr> {
    let gateway =
        kvpick_test_support::gateway::Gateway::connect(kvpick.ext_proc).await.unwrap_or_else(|e| panic!("{e}"));
    let endpoints: Vec<_> = fleet.endpoints().iter().map(|e| e.http).collect();
    let shared = format!("You are a helpful assistant on {topic}. Answer briefly and precisely. ").repeat(16);
    let mut picked = Vec::new();
    for turn in 0..turns {
        let text = format!("{shared} Question {turn}: what is the capital of France?");
        let exchange = gateway.post("/v1/chat/completions", &chat(&text)).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exchange.status, 200, "{}", String::from_utf8_lossy(&exchange.body));
        let endpoint = exchange.endpoint.unwrap_or_else(|| panic!("no pick"));
        assert!(endpoints.contains(&endpoint), "picked {endpoint}, not an engine");
        picked.push(endpoint);
        // Let the engine's KV events reach kvpick before the next turn.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    picked
}

/// Waits until kvpick's metrics satisfy `done`; panics after [`WAIT`].
pub async fn until(kvpick: &Kvpick, what: &str, done: impl Fn(&prometheus_parse::Scrape) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        if done(&scrape(kvpick.metrics).await) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not seen in {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
