//! A real `nats-server` (with JetStream) on 127.0.0.1, for the `nats`
//! transport's tests: started on a port it picks, its store in a directory
//! of its own, stopped and restarted at the same port (a NATS outage), and
//! killed when dropped.
//!
//! Debian's `nats-server` package provides the binary (`.ci/run` installs
//! it). Without it, [`NatsServer::start`] says so and returns `None` on a
//! developer's machine, so that `cargo test` runs there with only Rust
//! installed; under `CI` it panics instead: CI never skips these tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl NatsServer {
    /// A server on a free port; `None` when `nats-server` is not installed
    /// and the tests may skip (see the module docs).
    pub fn start() -> Option<NatsServer> {
        let found = Command::new("nats-server").arg("--version").stdout(Stdio::null()).status().is_ok();
        if !found {
            assert!(std::env::var_os("CI").is_none(), "CI must test the nats transport: .ci/run installs nats-server");
            eprintln!(
                "SKIPPED: nats-server is not installed (apt-get install nats-server); the nats transport is not tested here"
            );
            return None;
        }
        let dir = std::env::temp_dir().join(format!("kvpick-nats-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut server = NatsServer { child: None, dir, port: 0 };
        // Port -1: the server picks one and writes it to its ports file.
        server.spawn(-1);
        Some(server)
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (its clients see the connection drop).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again at the same port, with the same store (the streams
    /// it had are back).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn(i32::from(self.port));
    }

    fn spawn(&mut self, port: i32) {
        let ports = self.dir.join("ports");
        let _ = std::fs::remove_dir_all(&ports);
        std::fs::create_dir_all(&ports).unwrap_or_else(|e| panic!("{}: {e}", ports.display()));
        let log = std::fs::File::create(self.dir.join("log")).unwrap_or_else(|e| panic!("nats log: {e}"));
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(self.dir.join("store"))
            .arg("--ports_file_dir")
            .arg(&ports)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("nats-server: {e}"));
        self.child = Some(child);
        self.port = wait_for_port(&ports, &self.dir.join("log"));
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The client port from the server's ports file, once it is written.
fn wait_for_port(dir: &Path, log: &Path) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let written = std::fs::read_dir(dir).ok().into_iter().flatten().flatten().find_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let value: serde_json::Value = serde_json::from_str(&text).ok()?;
            let url = value.get("nats")?.get(0)?.as_str()?.to_owned();
            url.rsplit(':').next()?.parse::<u16>().ok()
        });
        if let Some(port) = written {
            return port;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nats-server did not start: {}", std::fs::read_to_string(log).unwrap_or_default());
}
