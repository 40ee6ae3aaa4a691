//! The `kvpick serve` under test, as a child process of its own, so its
//! memory, descriptors and threads are its own and a panic or a crash is
//! seen as it would be in a pod: its JSON log lines go to a file, which is
//! read for the addresses it listens on and, at the end, for panics and
//! error lines.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvpick_app::app::settings as var;
use serde_json::Value;

/// How long `kvpick serve` may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The running server.
pub struct Serve {
    child: Child,
    log: PathBuf,
    pub ext_proc: SocketAddr,
    pub probe: Probe,
}

/// Reads the server from outside, as a monitoring agent would: `/proc`
/// and `/metrics`. Cheap to clone, for the sampler's task.
#[derive(Clone)]
pub struct Probe {
    pid: u32,
    metrics: SocketAddr,
    http: Client<HttpConnector, Empty<Bytes>>,
}

/// What `/proc` says of the process.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcSample {
    pub rss_bytes: u64,
    pub fds: u64,
    pub threads: u64,
}

/// What the log file held at the end.
#[derive(Debug, Default)]
pub struct LogSummary {
    pub panics: Vec<String>,
    /// ERROR and WARN lines by level and message, with their counts.
    pub by_message: BTreeMap<(String, String), u64>,
    pub lines: u64,
}

/// `name{labels}` → value, from one scrape of `/metrics`.
pub type Scrape = BTreeMap<String, f64>;

impl Serve {
    /// Starts `binary serve` with `discovery` (the settings of its mode),
    /// tokenizing through `render` (a simulated engine's render endpoint),
    /// with every port picked by the OS, and waits until it logs where it
    /// listens.
    pub async fn start(
        binary: &Path,
        discovery: &[(&'static str, String)],
        render: &str,
        out: &Path,
    ) -> Result<Serve, String> {
        let log = out.join("serve.log");
        let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .env_clear()
            .envs(discovery.iter().map(|(k, v)| (k, v)))
            .env(var::LISTEN_ADDRESS, "127.0.0.1")
            .env(var::EXT_PROC_PORT, "0")
            .env(var::HEALTH_PORT, "0")
            .env(var::METRICS_PORT, "0")
            .env(var::TOKENIZER_URL, render)
            .env(var::TOKENIZATION_TIMEOUT_MS, crate::chaos::TOKENIZER_TIMEOUT.as_millis().to_string())
            .env(var::MODEL, crate::traffic::MODEL)
            .env(var::BLOCK_SIZE, crate::BLOCK_SIZE.to_string())
            .env(var::LOG_FORMAT, "json")
            .env(var::LOG_LEVEL, "info")
            .env(var::SHUTDOWN_GRACE_MS, "3000")
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file);
        let child = command.spawn().map_err(|e| format!("cannot start {} serve: {e}", binary.display()))?;
        let started = Instant::now();
        let unbound = SocketAddr::from(([127, 0, 0, 1], 0));
        let probe =
            Probe { pid: child.id(), metrics: unbound, http: Client::builder(TokioExecutor::new()).build_http() };
        let mut serve = Serve { child, log, ext_proc: unbound, probe };
        loop {
            if let Some((ext_proc, metrics)) = serve.listening() {
                (serve.ext_proc, serve.probe.metrics) = (ext_proc, metrics);
                return Ok(serve);
            }
            if let Ok(Some(status)) = serve.child.try_wait() {
                return Err(format!("kvpick serve exited at start ({status}); see {}", serve.log.display()));
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "kvpick serve did not listen within {START_TIMEOUT:?}; see {}",
                    serve.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The ext_proc and metrics addresses of the `listening` line.
    fn listening(&self) -> Option<(SocketAddr, SocketAddr)> {
        let text = std::fs::read_to_string(&self.log).ok()?;
        text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find_map(|line| {
            if line["message"] != "listening" {
                return None;
            }
            let addr = |key: &str| line[key].as_str().and_then(|s| s.parse::<SocketAddr>().ok());
            Some((addr("ext_proc")?, addr("metrics")?))
        })
    }

    /// SIGTERM, then waits for the exit (up to `grace` plus a margin):
    /// `Ok` with the exit status's description when it exited by itself.
    pub async fn stop(mut self, grace: Duration) -> Result<String, String> {
        // The signal a pod's stop sends; `kill(1)` spares the crate a libc binding.
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + grace + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return if status.success() { Ok(status.to_string()) } else { Err(format!("exited with {status}")) };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        Err("did not stop after SIGTERM; killed".into())
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Probe {
    /// Resident memory, open descriptors and threads, from `/proc`.
    /// An exited child not yet reaped is a zombie: gone, though `/proc`
    /// still lists it.
    pub fn sample(&self) -> Result<ProcSample, String> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).map_err(|e| e.to_string())?;
        if status.lines().any(|l| l.strip_prefix("State:").is_some_and(|s| s.trim_start().starts_with('Z'))) {
            return Err("the process has exited".into());
        }
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map_err(|e| e.to_string())?.count() as u64;
        Ok(ProcSample { rss_bytes: field("VmRSS:") * 1024, fds, threads: field("Threads:") })
    }

    /// A scrape, tried up to five times over about a second: a transient
    /// failure must not stand for "no counter moved".
    pub async fn scrape_surely(&self) -> Result<Scrape, String> {
        let mut last = String::new();
        for _ in 0..5 {
            match self.scrape().await {
                Ok(scrape) => return Ok(scrape),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!("kvpick's /metrics did not answer five times: {last}"))
    }

    /// One scrape of `/metrics`.
    pub async fn scrape(&self) -> Result<Scrape, String> {
        let uri = format!("http://{}/metrics", self.metrics);
        let get = self.http.get(uri.parse().map_err(|e| format!("{uri}: {e}"))?);
        let response = tokio::time::timeout(Duration::from_secs(5), get)
            .await
            .map_err(|_| "metrics scrape timed out".to_owned())?
            .map_err(|e| format!("metrics scrape: {e}"))?;
        let body = response.into_body().collect().await.map_err(|e| format!("metrics body: {e}"))?.to_bytes();
        Ok(parse_exposition(&String::from_utf8_lossy(&body)))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads a finished log: panics (the panic hook's lines, or any line that
/// says `panicked`), and ERROR and WARN lines by message.
pub fn summarise_log(path: &Path) -> Result<LogSummary, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut summary = LogSummary::default();
    for line in text.lines() {
        summary.lines += 1;
        if line.contains("panicked") {
            summary.panics.push(line.to_owned());
        }
        let Ok(json) = serde_json::from_str::<Value>(line) else { continue };
        let level = json["level"].as_str().unwrap_or_default();
        if level == "ERROR" || level == "WARN" {
            let message = json["message"].as_str().unwrap_or_default().to_owned();
            *summary.by_message.entry((level.to_owned(), message)).or_default() += 1;
        }
    }
    Ok(summary)
}

/// Prometheus text: each sample's `name{labels}` and value; comments and
/// unparsable lines skipped.
pub fn parse_exposition(text: &str) -> Scrape {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse::<f64>().ok()?))
        })
        .collect()
}

/// The sum of every sample of `family` (all label sets).
pub fn family_sum(scrape: &Scrape, family: &str) -> f64 {
    scrape
        .iter()
        .filter(|(k, _)| k.as_str() == family || k.strip_prefix(family).is_some_and(|rest| rest.starts_with('{')))
        .map(|(_, v)| v)
        .sum()
}

/// `family{worker="endpoint"}`'s value.
pub fn worker_value(scrape: &Scrape, family: &str, endpoint: SocketAddr) -> Option<f64> {
    scrape.get(&format!("{family}{{worker=\"{endpoint}\"}}")).copied()
}
