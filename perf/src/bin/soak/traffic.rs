//! The soak's clients: multi-turn chat conversations (each turn resends the
//! history; system prompts shared between conversations, so prefixes
//! repeat across requests and engines' caches fill and evict), sent
//! through a miniature gateway to kvpick and on to the engine it picks.
//!
//! A share of requests is cancelled at a random moment (before the pick,
//! while the body is echoed, while the answer streams), as clients who
//! hang up do. The chaos schedule can pause new requests (to check the
//! books once everything in flight has ended) and reset the gateway's
//! connection, cutting every stream open on it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kvpick_test_support::gateway::Gateway;
use serde_json::{Value, json};
use tokio::sync::watch;

pub const MODEL: &str = "sim-model";
/// Conversations per client before the client starts new ones.
const TURNS: usize = 6;
const SYSTEM_PROMPTS: usize = 8;
const SYSTEM_WORDS: usize = 180;
const USER_WORDS: usize = 24;
const MAX_TOKENS: u32 = 12;
/// Latest moment a cancelled request is cut, after it starts.
const CANCEL_WITHIN_MS: u64 = 40;

/// What happened to the requests, counted.
#[derive(Default)]
pub struct Counts {
    pub started: AtomicU64,
    pub ok: AtomicU64,
    pub cancelled: AtomicU64,
    /// Cut by a gateway connection reset.
    pub reset: AtomicU64,
    pub in_flight: AtomicU64,
    /// Failures by kind, with the first message of each.
    failures: Mutex<BTreeMap<String, (u64, String)>>,
}

impl Counts {
    fn fail(&self, kind: &str, message: String) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.entry(kind.to_owned()).or_insert((0, message)).0 += 1;
        }
    }

    /// Failures by kind: count and first message.
    pub fn failures(&self) -> BTreeMap<String, (u64, String)> {
        self.failures.lock().map(|f| f.clone()).unwrap_or_default()
    }

    pub fn failed(&self) -> u64 {
        self.failures().values().map(|(n, _)| n).sum()
    }

    pub fn snapshot(&self) -> CountsSnapshot {
        CountsSnapshot {
            started: self.started.load(Ordering::SeqCst),
            ok: self.ok.load(Ordering::SeqCst),
            cancelled: self.cancelled.load(Ordering::SeqCst),
            reset: self.reset.load(Ordering::SeqCst),
            failures: self.failures(),
        }
    }
}

/// [`Counts`] at one moment.
#[derive(Clone, Debug, Default)]
pub struct CountsSnapshot {
    pub started: u64,
    pub ok: u64,
    pub cancelled: u64,
    pub reset: u64,
    pub failures: BTreeMap<String, (u64, String)>,
}

/// Shared between the clients and the chaos schedule.
pub struct Traffic {
    gateway: RwLock<Gateway>,
    ext_proc: SocketAddr,
    /// Bumped on a gateway reset: streams open at that moment are cut.
    generation: watch::Sender<u64>,
    paused: AtomicBool,
    stopped: AtomicBool,
    pub counts: Counts,
    cancel_share: f64,
}

impl Traffic {
    pub async fn connect(ext_proc: SocketAddr, cancel_share: f64) -> Result<Arc<Traffic>, String> {
        let gateway = Gateway::connect(ext_proc).await.map_err(|e| format!("gateway: {e}"))?;
        Ok(Arc::new(Traffic {
            gateway: RwLock::new(gateway),
            ext_proc,
            generation: watch::channel(0).0,
            paused: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            counts: Counts::default(),
            cancel_share,
        }))
    }

    /// Starts `clients` client tasks.
    pub fn spawn(self: &Arc<Self>, clients: usize, seed: u64) -> Vec<tokio::task::JoinHandle<()>> {
        (0..clients).map(|c| tokio::spawn(Arc::clone(self).client(c, seed.wrapping_add(c as u64)))).collect()
    }

    /// Stops new requests; those in flight go on.
    pub fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// Waits until nothing is in flight, up to `limit`: whether it got there.
    pub async fn drained(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while self.counts.in_flight.load(Ordering::SeqCst) != 0 {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// A new connection for the gateway, and every stream open on the old
    /// one cut (the old connection closes once they let go of it).
    pub async fn reset_gateway(&self) -> Result<(), String> {
        let fresh = Gateway::connect(self.ext_proc).await.map_err(|e| format!("gateway reconnect: {e}"))?;
        if let Ok(mut gateway) = self.gateway.write() {
            *gateway = fresh;
        }
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    async fn client(self: Arc<Self>, id: usize, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut generation = self.generation.subscribe();
        let mut conversation = 0u64;
        while !self.stopped.load(Ordering::SeqCst) {
            let mut history = vec![json!({
                "role": "system",
                "content": words(&format!("sys{}", rng.usize(..SYSTEM_PROMPTS)), SYSTEM_WORDS),
            })];
            conversation += 1;
            for turn in 0..TURNS {
                // Counted in flight before the pause is read, so a check that
                // waits for nothing in flight cannot miss a request starting.
                self.counts.in_flight.fetch_add(1, Ordering::SeqCst);
                while self.paused.load(Ordering::SeqCst) && !self.stopped.load(Ordering::SeqCst) {
                    self.counts.in_flight.fetch_sub(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    self.counts.in_flight.fetch_add(1, Ordering::SeqCst);
                }
                if self.stopped.load(Ordering::SeqCst) {
                    self.counts.in_flight.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                history.push(
                    json!({"role": "user", "content": words(&format!("c{id}n{conversation}t{turn}"), USER_WORDS)}),
                );
                let body = json!({
                    "model": MODEL,
                    "messages": history,
                    "max_tokens": MAX_TOKENS,
                    "stream": true,
                    "stream_options": {"include_usage": true},
                })
                .to_string();
                let cancel_after =
                    (rng.f64() < self.cancel_share).then(|| Duration::from_micros(rng.u64(..CANCEL_WITHIN_MS * 1000)));
                // The generation first: a reset after it is seen, even if the
                // gateway cloned next is already the new one.
                generation.borrow_and_update();
                let Ok(gateway) = self.gateway.read().map(|g| g.clone()) else {
                    self.counts.in_flight.fetch_sub(1, Ordering::SeqCst);
                    return;
                };
                self.counts.started.fetch_add(1, Ordering::SeqCst);
                let post = gateway.post("/v1/chat/completions", body.as_bytes());
                let cut = async {
                    match cancel_after {
                        Some(after) => tokio::time::sleep(after).await,
                        None => std::future::pending().await,
                    }
                };
                let answer = tokio::select! {
                    exchange = post => Some(exchange),
                    _ = cut => {
                        self.counts.cancelled.fetch_add(1, Ordering::SeqCst);
                        None
                    }
                    _ = generation.changed() => {
                        self.counts.reset.fetch_add(1, Ordering::SeqCst);
                        None
                    }
                };
                drop(gateway);
                self.counts.in_flight.fetch_sub(1, Ordering::SeqCst);
                let Some(exchange) = answer else { break };
                let text = match exchange {
                    Ok(e) if e.status == 200 => String::from_utf8_lossy(&e.body).into_owned(),
                    Ok(e) => {
                        let kind = match e.refused {
                            Some(status) => format!("refused by kvpick ({status})"),
                            None => format!("engine status {}", e.status),
                        };
                        self.counts.fail(&kind, String::from_utf8_lossy(&e.body).chars().take(300).collect());
                        break;
                    }
                    Err(error) => {
                        let message = error.to_string();
                        let kind = message.split(':').next().unwrap_or("error").to_owned();
                        self.counts.fail(&kind, message);
                        break;
                    }
                };
                if !text.contains("data: [DONE]") {
                    self.counts.fail("stream unfinished", text.chars().take(300).collect());
                    break;
                }
                self.counts.ok.fetch_add(1, Ordering::SeqCst);
                history.push(json!({"role": "assistant", "content": reply_text(&text)}));
            }
        }
    }
}

/// `n` words starting with `tag`: one token each to the simulated tokenizer.
fn words(tag: &str, n: usize) -> String {
    (0..n).map(|j| format!("{tag}x{j}")).collect::<Vec<_>>().join(" ")
}

/// The assistant's text from a streamed chat completion.
fn reply_text(sse: &str) -> String {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data:").map(str::trim))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| chunk.pointer("/choices/0/delta/content").and_then(Value::as_str).map(str::to_owned))
        .collect()
}
