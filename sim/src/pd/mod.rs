//! Disaggregated prefill/decode (P/D): what the three engines' P/D legs
//! share. A prefill leg computes the prompt and leaves its blocks **held**
//! (pinned in its cache under a lease, see `engine_loop`) behind an
//! [`Offer`] in its [`TransferHub`]; a decode leg pulls the offer over the
//! prefill's side channel ([`side_channel`]), waits out the transfer time
//! and enters its scheduler with those tokens already computed.
//!
//! Each engine's own wire lives in its module: [`nixl`] (vLLM's
//! `kv_transfer_params`), [`bootstrap`] (SGLang's bootstrap fields),
//! [`trtllm`] (TensorRT-LLM's `disaggregated_params`). The legs run in
//! [`legs`], as tasks feeding the HTTP answer's progress channel, so that
//! a client that goes away drops its leg wherever it waits.

pub(crate) mod bootstrap;
pub(crate) mod legs;
pub(crate) mod nixl;
pub(crate) mod side_channel;
pub(crate) mod trtllm;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use super::scheduler::RequestId;

/// Results of a decode engine's pulls, as `sim:kv_transfers_total{result}`.
pub(crate) const TRANSFER_RESULTS: [&str; 7] =
    ["ok", "unknown", "expired", "already_pulled", "mismatch", "timeout", "unreachable"];

/// Why a prefill engine stopped holding blocks, as
/// `sim:kv_holds_released_total{reason}`.
pub(crate) const HOLD_RELEASES: [&str; 3] = ["pulled", "expired", "abandoned"];

/// P/D counters of one engine (both roles), read by `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct PdCounters {
    transfers: [AtomicU64; TRANSFER_RESULTS.len()],
    releases: [AtomicU64; HOLD_RELEASES.len()],
}

impl PdCounters {
    /// Counts a pull's result (one of [`TRANSFER_RESULTS`]).
    pub(crate) fn transfer(&self, result: &str) {
        if let Some(i) = TRANSFER_RESULTS.iter().position(|r| *r == result) {
            self.transfers[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a hold's end (one of [`HOLD_RELEASES`]).
    pub(crate) fn hold_released(&self, reason: &str) {
        if let Some(i) = HOLD_RELEASES.iter().position(|r| *r == reason) {
            self.releases[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn transfers(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        TRANSFER_RESULTS.iter().zip(&self.transfers).map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
    }

    pub(crate) fn releases(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        HOLD_RELEASES.iter().zip(&self.releases).map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
    }
}

/// A finished prefill's KV, ready to be pulled once.
#[derive(Debug)]
pub(crate) struct Offer {
    /// The prefill request holding the blocks in the engine loop.
    pub(crate) hold: RequestId,
    /// The block numbers the prefill announced (a pull naming others is
    /// refused as a mismatch).
    pub(crate) block_ids: Vec<u64>,
    /// The prompt tokens whose KV the blocks hold.
    pub(crate) token_ids: Vec<u32>,
    /// The token the prefill sampled (SGLang's decode starts from it).
    pub(crate) first_token: Option<u32>,
    /// Told once the pull's answer is written (SGLang's prefill answers
    /// only then).
    pub(crate) pulled: Option<oneshot::Sender<()>>,
    /// Past this, the offer is dropped by the next one published: its
    /// lease ended long ago (a pull then hears "unknown", not "expired").
    pub(crate) stale_after: Instant,
}

/// How long after its lease an unpulled offer is still answered "expired".
pub(crate) const STALE_AFTER_LEASE: Duration = Duration::from_secs(60);

/// Pulled offers remembered, to answer a second pull "already_pulled".
const PULLED_KEPT: usize = 4096;

/// A prefill engine's offers, by transfer key (`vllm:<request id>`,
/// `room:<bootstrap room>`, `ctx:<ctx_request_id>`). Offers whose hold
/// expired stay until pulled (then answered "expired") or replaced.
#[derive(Debug, Default)]
pub(crate) struct TransferHub {
    offers: Mutex<HashMap<String, Offer>>,
    pulled: Mutex<VecDeque<String>>,
    /// Woken on every new offer (SGLang decodes wait for their room).
    ready: Notify,
}

impl TransferHub {
    /// Publishes an offer; returns the hold of the one it replaced (the
    /// same key reused), for the caller to release. Stale offers go (their
    /// holds expired long ago), so offers nobody pulls do not pile up.
    pub(crate) fn offer(&self, key: String, offer: Offer) -> Option<RequestId> {
        let now = Instant::now();
        let replaced = self.offers.lock().ok().and_then(|mut offers| {
            offers.retain(|_, o| o.stale_after > now);
            offers.insert(key.clone(), offer)
        });
        if let Ok(mut pulled) = self.pulled.lock() {
            pulled.retain(|k| *k != key);
        }
        self.ready.notify_waiters();
        replaced.map(|o| o.hold)
    }

    /// Takes the offer under `key`, remembering it as pulled.
    pub(crate) fn take(&self, key: &str) -> Option<Offer> {
        let offer = self.offers.lock().ok()?.remove(key)?;
        if let Ok(mut pulled) = self.pulled.lock() {
            if pulled.len() == PULLED_KEPT {
                pulled.pop_front();
            }
            pulled.push_back(key.to_owned());
        }
        Some(offer)
    }

    /// Withdraws the offer under `key` if it is still for `hold`.
    pub(crate) fn withdraw(&self, key: &str, hold: RequestId) {
        if let Ok(mut offers) = self.offers.lock()
            && offers.get(key).is_some_and(|o| o.hold == hold)
        {
            offers.remove(key);
        }
    }

    pub(crate) fn was_pulled(&self, key: &str) -> bool {
        self.pulled.lock().map(|p| p.iter().any(|k| k == key)).unwrap_or(false)
    }

    /// Resolves on the next [`TransferHub::offer`] after the future is
    /// enabled (see [`tokio::sync::Notify::notified`]).
    pub(crate) fn ready(&self) -> &Notify {
        &self.ready
    }
}

/// An engine id shaped like vLLM's (a UUID string), stable for a name
/// and seed.
pub(crate) fn engine_uuid(name: &str, seed: u64) -> String {
    let a = xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), seed);
    let b = xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), seed ^ 0x5555);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}
