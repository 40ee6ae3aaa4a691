//! The KV index's memory budget: its default from the memory kvpick may
//! use, and the log line that says the budget is being enforced.

use std::time::{Duration, Instant};

use kvpick_core::index::ENTRY_BYTES;
use kvpick_core::shard::ShardStats;

/// The index may take this share of the memory kvpick may use: the rest
/// is the bookings, the ingest queues, the ext_proc streams and headroom.
const SHARE: u64 = 4;

/// When neither a cgroup limit nor the machine's memory can be read.
const FALLBACK: u64 = 1 << 30;

/// A quarter of the memory kvpick may use: its cgroup's limit (v2, else
/// v1) when it has one, else the machine's.
pub fn default_max_bytes() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|text| cgroup_limit(&text));
    let machine = read("/proc/meminfo").and_then(|text| mem_total(&text));
    budget_from(cgroup, machine)
}

fn budget_from(cgroup: Option<u64>, machine: Option<u64>) -> u64 {
    // cgroup v1 writes "no limit" as a number near i64::MAX: the machine's
    // memory bounds it.
    let usable = match (cgroup, machine) {
        (Some(c), Some(m)) => c.min(m),
        (one, other) => one.or(other).unwrap_or(FALLBACK * SHARE),
    };
    (usable / SHARE).max(1 << 20)
}

/// `memory.max` ("max" or bytes) or `memory.limit_in_bytes` (bytes).
fn cgroup_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `MemTotal:  16314204 kB` from /proc/meminfo, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Evictions are routine once a fleet's caches outgrow the budget: one
/// line a minute says so, with the counts, rather than one per eviction.
const LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub struct EvictionLog {
    logged_total: u64,
    logged_at: Option<Instant>,
}

impl EvictionLog {
    /// Logs when blocks were evicted since the last line and a minute has
    /// passed (or none was logged yet); returns whether it logged.
    /// `stats` are those of `indexes` indexes (a prefill selector's has a
    /// budget of its own), each with a budget of `max_bytes`.
    pub fn observe(&mut self, stats: &ShardStats, max_bytes: Option<u64>, indexes: u64, now: Instant) -> bool {
        let since = stats.blocks_evicted - self.logged_total.min(stats.blocks_evicted);
        if since == 0 || self.logged_at.is_some_and(|at| now.duration_since(at) < LOG_EVERY) {
            return false;
        }
        let message = if workers_take_most(stats, max_bytes.map(|b| b.saturating_mul(indexes))) {
            "the KV index is at its memory budget, and its workers' fixed cost (worker_bytes each) takes most of \
             the budget: blocks stored longest ago are forgotten (they stop matching); raise --index-max-bytes"
        } else {
            "the KV index is at its memory budget: blocks stored longest ago are forgotten (they stop matching); \
             raise --index-max-bytes if the workers' caches are larger"
        };
        tracing::warn!(
            evicted_since_last = since,
            evicted_total = stats.blocks_evicted,
            index_entries = stats.index_entries,
            index_max_entries = stats.index_max_entries,
            index_bytes = stats.index_bytes,
            index_max_bytes = max_bytes,
            worker_bytes = kvpick_core::index::WORKER_BYTES,
            "{message}"
        );
        self.logged_total = stats.blocks_evicted;
        self.logged_at = Some(now);
        true
    }
}

/// Whether the entries' room is under half of `total_bytes`: the rest goes
/// to the workers' fixed cost (`kvpick_core::index::WORKER_BYTES` each).
fn workers_take_most(stats: &ShardStats, total_bytes: Option<u64>) -> bool {
    total_bytes.is_some_and(|total| stats.index_max_entries.saturating_mul(ENTRY_BYTES) < total / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_quarter_of_the_tighter_limit() {
        assert_eq!(budget_from(Some(8 << 30), Some(64 << 30)), 2 << 30);
        assert_eq!(budget_from(Some(i64::MAX as u64 & !4095), Some(16 << 30)), 4 << 30);
        assert_eq!(budget_from(None, Some(16 << 30)), 4 << 30);
        assert_eq!(budget_from(None, None), FALLBACK);
        assert_eq!(budget_from(Some(1 << 20), None), 1 << 20, "never below 1 MiB");
        assert_eq!(cgroup_limit("max\n"), None);
        assert_eq!(cgroup_limit("4294967296\n"), Some(4 << 30));
        assert_eq!(mem_total("MemTotal:       16314204 kB\nMemFree: 1 kB\n"), Some(16_314_204 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert!(default_max_bytes() >= 1 << 20);
    }

    #[test]
    fn evictions_are_logged_once_a_minute_at_most() {
        let mut log = EvictionLog::default();
        let t0 = Instant::now();
        let stats = |evicted| ShardStats { blocks_evicted: evicted, ..ShardStats::default() };
        assert!(!log.observe(&stats(0), Some(1 << 20), 1, t0), "nothing evicted yet");
        assert!(log.observe(&stats(5), Some(1 << 20), 1, t0));
        assert!(!log.observe(&stats(9), Some(1 << 20), 1, t0 + Duration::from_secs(30)));
        assert!(log.observe(&stats(9), Some(1 << 20), 1, t0 + Duration::from_secs(61)));
        assert!(!log.observe(&stats(9), Some(1 << 20), 1, t0 + Duration::from_secs(200)), "none since");
    }

    #[test]
    fn the_warning_says_so_when_the_workers_fixed_cost_takes_most_of_the_budget() {
        use kvpick_core::index::{KvIndex, WORKER_BYTES};
        let budget = 1 << 20;
        let with_workers = |workers: u32| {
            let mut index = KvIndex::with_max_bytes(Some(budget));
            (0..workers).for_each(|slot| {
                index.add_worker(slot);
            });
            ShardStats { index_max_entries: index.max_entries().unwrap_or(0), ..ShardStats::default() }
        };
        // 1 MiB: 41 workers take 504 KiB, 43 take 516 KiB.
        assert_eq!(budget / 2 / WORKER_BYTES, 42);
        assert!(!workers_take_most(&with_workers(41), Some(budget)));
        assert!(workers_take_most(&with_workers(43), Some(budget)));
        // Two indexes (a prefill selector's beside), each with the budget.
        let two = with_workers(43).merge(with_workers(0));
        assert!(!workers_take_most(&two, Some(2 * budget)), "one index of two is half spent");
        assert!(!workers_take_most(&with_workers(500), None), "no budget");
    }
}
