//! Timing: per-call latency percentiles, batch throughput, process memory.

use std::hint::black_box;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// How long a latency measurement runs: `warmup` untimed calls, then timed
/// calls until `time` has passed (but at least `min_iters`, at most
/// `max_iters`).
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub warmup: u64,
    pub min_iters: u64,
    pub max_iters: u64,
    pub time: Duration,
}

impl Budget {
    /// Drives a timed loop: yields iteration numbers, warmup first
    /// (`Round::Warmup`), while the budget lasts.
    pub fn rounds(&self) -> Rounds {
        Rounds { budget: *self, next: 0, start: None }
    }

    /// Exactly `calls` timed calls after the warm-up, however long they
    /// take: for comparisons that must see the same inputs on both sides.
    pub fn exactly(&self, calls: u64) -> Budget {
        Budget { warmup: self.warmup.min(calls), min_iters: calls, max_iters: calls, time: Duration::MAX }
    }

    /// The same budget with its iteration counts divided by `by` (for
    /// baselines far slower than what they are compared with); the time
    /// stays, so a slow op may stop on time before `max_iters`.
    pub fn scaled_down(&self, by: u64) -> Budget {
        let by = by.max(1);
        Budget {
            warmup: (self.warmup / by).max(1),
            min_iters: (self.min_iters / by).max(10),
            max_iters: (self.max_iters / by).max(10),
            time: self.time,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    Warmup(u64),
    Timed(u64),
}

impl Round {
    /// The iteration number, warmup rounds included (for cycling inputs).
    pub fn index(self) -> u64 {
        match self {
            Round::Warmup(i) | Round::Timed(i) => i,
        }
    }
}

pub struct Rounds {
    budget: Budget,
    next: u64,
    start: Option<Instant>,
}

impl Iterator for Rounds {
    type Item = Round;

    fn next(&mut self) -> Option<Round> {
        let i = self.next;
        self.next += 1;
        if i < self.budget.warmup {
            return Some(Round::Warmup(i));
        }
        let timed = i - self.budget.warmup;
        let start = *self.start.get_or_insert_with(Instant::now);
        if timed >= self.budget.max_iters {
            return None;
        }
        // Reading the clock costs ~20 ns: check the time every 64 rounds only.
        if timed >= self.budget.min_iters && timed % 64 == 0 && start.elapsed() >= self.budget.time {
            return None;
        }
        Some(Round::Timed(i))
    }
}

/// Latencies of single calls, in nanoseconds.
pub struct Latencies(Histogram<u64>);

/// Longest latency recorded exactly; longer ones count as this (one hour).
const MAX_TRACKED_NS: u64 = 3_600_000_000_000;

impl Default for Latencies {
    fn default() -> Self {
        // Fixed bounds: `saturating_record` never resizes, it clamps.
        Latencies(
            Histogram::new_with_bounds(1, MAX_TRACKED_NS, 3)
                .expect("1 ns to 1 h at 3 significant figures is a valid histogram range"),
        )
    }
}

impl Latencies {
    pub fn record(&mut self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.0.saturating_record(nanos.max(1));
    }

    pub fn summary(&self) -> LatencySummary {
        let h = &self.0;
        if h.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            mean: h.mean(),
            max: h.max(),
        }
    }
}

/// Percentiles in nanoseconds (hdrhistogram, 3 significant figures).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub mean: f64,
    pub max: u64,
}

/// Times each call of `op` (given the round number) within `budget`.
pub fn time_each<R>(budget: &Budget, op: impl FnMut(u64) -> R) -> LatencySummary {
    time_each_after(budget, |_| {}, op)
}

/// Times each call of `op` like [`time_each`], with `before` run untimed
/// ahead of every call (warm-up ones too): what a call costs when other work
/// has just churned the caches.
pub fn time_each_after<R>(
    budget: &Budget,
    mut before: impl FnMut(u64),
    mut op: impl FnMut(u64) -> R,
) -> LatencySummary {
    let mut latencies = Latencies::default();
    for round in budget.rounds() {
        match round {
            Round::Warmup(i) => {
                before(i);
                black_box(op(i));
            }
            Round::Timed(i) => {
                before(i);
                let start = Instant::now();
                black_box(op(i));
                latencies.record(start.elapsed());
            }
        }
    }
    latencies.summary()
}

/// What timing one empty call costs (two clock reads), as a floor under
/// every latency printed.
pub fn timer_overhead() -> LatencySummary {
    let budget = Budget { warmup: 1_000, min_iters: 100_000, max_iters: 100_000, time: Duration::ZERO };
    time_each(&budget, |i| i)
}

/// Work done in timed batches: blocks and events applied, time spent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Throughput {
    pub blocks: u64,
    pub events: u64,
    pub elapsed: Duration,
}

impl Throughput {
    pub fn add(&mut self, blocks: u64, events: u64, elapsed: Duration) {
        self.blocks += blocks;
        self.events += events;
        self.elapsed += elapsed;
    }

    /// Blocks per second.
    pub fn blocks_per_sec(&self) -> f64 {
        rate(self.blocks, self.elapsed)
    }

    /// Events per second.
    pub fn events_per_sec(&self) -> f64 {
        rate(self.events, self.elapsed)
    }

    /// Nanoseconds per block.
    pub fn ns_per_block(&self) -> f64 {
        if self.blocks == 0 { 0.0 } else { self.elapsed.as_nanos() as f64 / self.blocks as f64 }
    }
}

fn rate(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

/// Times `op` once.
pub fn timed<R>(op: impl FnOnce() -> R) -> (R, Duration) {
    let start = Instant::now();
    let out = op();
    (out, start.elapsed())
}

/// Time this thread has spent runnable but waiting for a CPU, from
/// `/proc/thread-self/schedstat` (Linux only). Growth during a benchmark
/// means another process competed for the core: the numbers are suspect.
pub fn run_queue_wait() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let waited: u64 = stat.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(waited))
}

/// The middle value (the mean of the two middle ones for an even count);
/// `None` for none.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The smallest and the largest value; `None` for none.
pub fn range(values: &[f64]) -> Option<(f64, f64)> {
    let first = *values.first()?;
    Some(values.iter().fold((first, first), |(lo, hi), &v| (lo.min(v), hi.max(v))))
}

/// CPU time counters (clock ticks) of the whole machine and of this
/// process, to tell whether anything else ran during a benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Busy ticks of all CPUs (user, nice, system, irq, softirq).
    pub busy: u64,
    /// Ticks the hypervisor ran something else on our virtual CPUs.
    pub steal: u64,
    /// All ticks of all CPUs.
    pub total: u64,
    /// This process's user + system ticks, and its waited-for children's
    /// (a benchmark's own child processes are not neighbours).
    pub own: u64,
}

/// Clock ticks per second of `/proc` counters (`USER_HZ`, 100 on Linux).
pub const TICKS_PER_SEC: f64 = 100.0;

impl CpuTimes {
    /// `None` where `/proc/stat` or `/proc/self/stat` is missing.
    pub fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> =
            stat.lines().next()?.strip_prefix("cpu ")?.split_whitespace().map_while(|v| v.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let field = |i: usize| cpu.get(i).copied().unwrap_or(0);
        let own_stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name: state is field 3, utime 14, stime 15,
        // cutime 16, cstime 17.
        let after_name = own_stat.rsplit_once(')')?.1;
        let own_fields: Vec<&str> = after_name.split_whitespace().collect();
        let own = (11..=14).map(|i| own_fields.get(i)?.parse::<u64>().ok()).sum::<Option<u64>>()?;
        Some(CpuTimes {
            busy: field(0) + field(1) + field(2) + field(5) + field(6),
            steal: field(7),
            total: (0..8).map(field).sum(),
            own,
        })
    }
}

/// What else used the machine between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Neighbours {
    /// CPUs' worth of time other processes used on average (1.0 = one core).
    pub other_cpus: f64,
    /// Share of all CPU time stolen by the hypervisor.
    pub steal: f64,
}

impl Neighbours {
    pub fn between(before: Option<CpuTimes>, after: Option<CpuTimes>, wall: Duration) -> Option<Neighbours> {
        let (before, after) = (before?, after?);
        let others = (after.busy.saturating_sub(before.busy)).saturating_sub(after.own.saturating_sub(before.own));
        let total = after.total.saturating_sub(before.total).max(1);
        Some(Neighbours {
            other_cpus: others as f64 / TICKS_PER_SEC / wall.as_secs_f64().max(1e-9),
            steal: after.steal.saturating_sub(before.steal) as f64 / total as f64,
        })
    }
}

/// Average nanoseconds of a dependent load at a random 64-byte line of a
/// `bytes`-sized buffer (a pointer chase over one random cycle): the
/// machine's memory latency as a hash-table miss sees it, TLB misses
/// included. Printed beside throughput numbers that depend on it.
pub fn memory_latency_ns(bytes: usize, loads: usize, seed: u64) -> f64 {
    const LINE_WORDS: usize = 16; // 64 bytes of u32
    let lines = (bytes / (LINE_WORDS * 4)).max(2);
    // Sattolo's algorithm: a random permutation that is a single cycle.
    let mut next: Vec<u32> = (0..lines as u32).collect();
    let mut rng = fastrand::Rng::with_seed(seed);
    for i in (1..lines).rev() {
        next.swap(i, rng.usize(..i));
    }
    let mut buffer = vec![[0u32; LINE_WORDS]; lines];
    for (line, &to) in buffer.iter_mut().zip(&next) {
        line[0] = to;
    }
    drop(next);
    let mut at = 0usize;
    for _ in 0..loads / 10 {
        at = buffer[at][0] as usize;
    }
    let start = Instant::now();
    for _ in 0..loads {
        at = buffer[at][0] as usize;
    }
    let elapsed = start.elapsed();
    black_box(at);
    elapsed.as_nanos() as f64 / loads.max(1) as f64
}

/// Longer than mimalloc v3's default purge delay (1,000 ms; v2's is 10 ms).
const PURGE_WAIT: Duration = Duration::from_millis(1_200);

/// The process's resident memory, from `/proc/self/status` (Linux only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`: resident now, bytes.
    pub rss: u64,
    /// `VmHWM`: the most ever resident, bytes.
    pub peak: u64,
}

impl Memory {
    /// [`Memory::now`] once mimalloc has returned what was freed: it
    /// purges lazily, on later allocator activity, so a reading straight
    /// after a burst of frees (a table's resize) counts dead pages.
    pub fn settled() -> Option<Memory> {
        // SAFETY: mi_collect takes no pointer and may be called at any
        // time from any thread; `force` also collects abandoned pages.
        unsafe { libmimalloc_sys::mi_collect(true) };
        Memory::now()
    }

    /// [`Memory::settled`] once mimalloc may purge what was freed just
    /// now: it keeps freed pages resident for `purge_delay` (1 s by default
    /// in mimalloc v3) before `mi_collect` returns them. A table's resize
    /// frees the old table; a long-running process gives it back a second
    /// later, so steady-state resident memory is this reading, not `now`'s.
    pub fn purged() -> Option<Memory> {
        Memory::settled();
        std::thread::sleep(PURGE_WAIT);
        Memory::settled()
    }

    /// `None` where `/proc` is missing or unreadable.
    pub fn now() -> Option<Memory> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib * 1024)
        };
        Some(Memory { rss: field("VmRSS:")?, peak: field("VmHWM:")? })
    }
}

/// Memory taken by building something: resident and peak growth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryDelta {
    pub rss: u64,
    pub peak: u64,
}

impl MemoryDelta {
    pub fn between(before: Option<Memory>, after: Option<Memory>) -> Option<MemoryDelta> {
        let (before, after) = (before?, after?);
        Some(MemoryDelta { rss: after.rss.saturating_sub(before.rss), peak: after.peak.saturating_sub(before.peak) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_even_and_no_values() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn ranges_of_some_and_no_values() {
        assert_eq!(range(&[]), None);
        assert_eq!(range(&[2.0]), Some((2.0, 2.0)));
        assert_eq!(range(&[2.5, 2.0, 2.2]), Some((2.0, 2.5)));
    }

    #[test]
    fn rounds_respect_the_budget() {
        let budget = Budget { warmup: 3, min_iters: 5, max_iters: 8, time: Duration::ZERO };
        let rounds: Vec<Round> = budget.rounds().collect();
        assert_eq!(rounds.iter().filter(|r| matches!(r, Round::Warmup(_))).count(), 3);
        // No time budget: stops at the first time check after min_iters (every 64 rounds), capped by max.
        assert_eq!(rounds.iter().filter(|r| matches!(r, Round::Timed(_))).count(), 8);
        assert_eq!(rounds.last().map(|r| r.index()), Some(10));
    }

    #[test]
    fn percentiles_of_known_values() {
        let mut lat = Latencies::default();
        for us in 1..=1000 {
            lat.record(Duration::from_micros(us));
        }
        let s = lat.summary();
        assert_eq!(s.count, 1000);
        // 3 significant figures: within 0.1%.
        assert!((499_000..=501_000).contains(&s.p50), "{s:?}");
        assert!((989_000..=991_000).contains(&s.p99), "{s:?}");
        assert!(s.max >= 999_000, "{s:?}");
    }

    #[test]
    fn a_cache_resident_chase_is_fast() {
        // 64 KiB stays in cache: far below any DRAM latency.
        let ns = memory_latency_ns(64 * 1024, 100_000, 1);
        assert!(ns > 0.0 && ns < 50.0, "{ns}");
    }

    #[test]
    fn throughput_rates() {
        let mut t = Throughput::default();
        t.add(500, 50, Duration::from_millis(250));
        t.add(500, 50, Duration::from_millis(250));
        assert_eq!(t.blocks_per_sec(), 2000.0);
        assert_eq!(t.events_per_sec(), 200.0);
        assert_eq!(t.ns_per_block(), 500_000.0);
    }
}
