//! 1. Event apply throughput, each index in a process of its own.
//!
//! With Dynamo's indexes in the same process as kvpick's, one index's layout
//! moved the other's figures by tens of percent: RadixTree's own 16-block
//! stores ran 30–45% slower beside kvpick's chunked record slab, its code
//! unchanged (perf/README, 2026-12-07). The indexes shared the allocator and
//! the caches. So this benchmark runs its own binary again once per index
//! (`--apply-child NAME`): each child plans the same population, builds its
//! one index, applies the same event rounds (the same seeds) and prints its
//! figures as one JSON line on stdout. A child also reads its index's RSS
//! growth, as built and after the rows, in a process holding nothing else.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use kvpick_core::hashing::{chain, local_block_hash};
use kvpick_core::{HashSeed, KvIndex, Shard};
use kvpick_perf::measure::{Memory, MemoryDelta, Throughput, median, range, run_queue_wait, timed};
use kvpick_perf::report::{Table, at_least, millions, ratio, thousands};
use kvpick_perf::setup;
use kvpick_perf::workload::{BLOCK_SIZE, BlockEvent, EvictionMix, FreshConversations, Population};
use serde::{Deserialize, Serialize};

use crate::{BIN, Config, TARGET_EVENTS_PER_SEC, TURN_BLOCKS};

/// The hidden flag that makes the binary a child: `--apply-child NAME`.
pub const CHILD_FLAG: &str = "--apply-child";

/// Blocks per stored event in the store and removal rows.
const BATCHES: [usize; 3] = [1, 16, 64];

/// Events are converted to each index's type (untimed) and applied (timed)
/// this many at a time, so that an applied event is as fresh in cache as one
/// a decoder has just produced, and the clock is read rarely.
const APPLY_BATCH: usize = 32;

/// An index measured in a child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    /// kvpick's `Shard::apply_event`, as a shard thread applies events.
    Shard,
    /// The same events on a bare `KvIndex` through `store`/`remove`.
    Direct,
    Radix,
    Positional,
}

impl Subject {
    /// The children a run starts, in order.
    pub fn measured() -> &'static [Subject] {
        if cfg!(feature = "dynamo") {
            &[Subject::Shard, Subject::Radix, Subject::Positional, Subject::Direct]
        } else {
            &[Subject::Shard, Subject::Direct]
        }
    }

    fn name(self) -> &'static str {
        match self {
            Subject::Shard => "kvpick",
            Subject::Direct => "direct",
            Subject::Radix => "radix",
            Subject::Positional => "positional",
        }
    }

    fn parse(name: &str) -> Option<Subject> {
        [Subject::Shard, Subject::Direct, Subject::Radix, Subject::Positional].into_iter().find(|s| s.name() == name)
    }
}

/// One row's totals, as a child measured them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    pub blocks: u64,
    pub events: u64,
    pub elapsed_ns: u64,
    /// The slowest batch of `APPLY_BATCH` events: a table resized in one
    /// go stalls the shard thread (and its picks) for that long.
    pub longest_ns: u64,
    /// Time the child waited for a CPU during the row: a slow batch with
    /// no wait is the index's own.
    pub waited_ns: u64,
}

impl Figures {
    pub fn blocks_per_sec(&self) -> f64 {
        self.throughput().blocks_per_sec()
    }

    fn throughput(&self) -> Throughput {
        Throughput { blocks: self.blocks, events: self.events, elapsed: Duration::from_nanos(self.elapsed_ns) }
    }

    /// Adds one timed batch.
    fn add(&mut self, blocks: u64, events: u64, elapsed: Duration) {
        let ns = elapsed.as_nanos() as u64;
        self.blocks += blocks;
        self.events += events;
        self.elapsed_ns += ns;
        self.longest_ns = self.longest_ns.max(ns);
    }
}

/// RSS growth over the child's baseline (read before the build), bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildMemory {
    /// Once the build ended and mimalloc purged what it freed.
    pub built: u64,
    /// As the build ended, freed pages (old tables) still resident.
    pub right_after: u64,
    /// VmHWM growth: resize transients included.
    pub peak: u64,
    /// Once the apply rows ended (same entries again), purged.
    pub after_rows: u64,
}

/// kvpick's own tables, which Dynamo's indexes do not report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tables {
    pub distinct_built: u64,
    /// The most distinct blocks held during the rows (fresh turns in flight).
    pub distinct_peak: u64,
    /// `KvIndex::approx_bytes` as built and after the rows.
    pub bytes_built: u64,
    pub bytes_after: u64,
}

/// What one child prints: one JSON line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildReport {
    pub subject: String,
    /// One per row, in `row_names` order.
    pub rows: Vec<Figures>,
    /// Entries held as built (`None`: the index does not count them).
    pub entries: Option<u64>,
    pub build_ns: u64,
    pub memory: Option<ChildMemory>,
    pub tables: Option<Tables>,
    /// What went wrong: refused events, entries that do not add up.
    pub problems: Vec<String>,
}

/// The rows' names, in the order children report them.
pub fn row_names() -> Vec<String> {
    let mut names = Vec::new();
    for batch in BATCHES {
        names.push(format!("store, {batch} block(s) per event"));
        names.push(format!("remove, {batch} block(s) per event"));
    }
    names.push("steady state: stores of 16 + evictions of 1–8 (≈80% removal events)".into());
    names
}

/// Whether a row is a removal row (no events/s target).
fn is_removal(row: usize) -> bool {
    row < 2 * BATCHES.len() && row % 2 == 1
}

/// Whether a row is a store row (the slowest of them is held to the target).
pub fn is_store(row: usize) -> bool {
    row < 2 * BATCHES.len() && row % 2 == 0
}

pub const MIX_ROW: usize = 2 * BATCHES.len();

// ---------------------------------------------------------------------------
// The child

/// An index the rows apply events to.
trait Target {
    /// Applies `events` as a decoder hands them over, timing the apply only;
    /// returns how many were refused.
    fn apply(&mut self, events: &[BlockEvent], timed: &mut Figures) -> u64;
    /// Entries held, if the index counts them.
    fn entries(&self) -> Option<u64>;
    /// kvpick's distinct blocks and table bytes.
    fn tables(&self) -> Option<(u64, u64)> {
        None
    }
    /// Removals of blocks the index did not hold (kvpick counts them).
    fn unknown_removals(&self) -> u64 {
        0
    }
}

impl Target for Shard {
    fn apply(&mut self, events: &[BlockEvent], timed: &mut Figures) -> u64 {
        let mut refused = 0;
        for batch in events.chunks(APPLY_BATCH) {
            let blocks = batch.iter().map(BlockEvent::blocks).sum::<usize>() as u64;
            let converted: Vec<_> = batch.iter().map(setup::kv_event).collect();
            let start = Instant::now();
            let mut rest = &converted[..];
            while !rest.is_empty() {
                let covered = self.prefetch_head(rest.iter().map(|(worker, event)| (*worker, event)));
                let (window, after) = rest.split_at(covered);
                rest = after;
                for (worker, event) in window {
                    refused += u64::from(self.apply_event(*worker, event).is_err());
                }
            }
            // Freeing the events is timed: a shard thread frees each one.
            drop(converted);
            timed.add(blocks, batch.len() as u64, start.elapsed());
        }
        refused
    }

    fn entries(&self) -> Option<u64> {
        Some(self.index().entries())
    }

    fn tables(&self) -> Option<(u64, u64)> {
        Some((self.index().distinct_blocks() as u64, self.index().approx_bytes() as u64))
    }

    fn unknown_removals(&self) -> u64 {
        self.stats().unknown_removals
    }
}

/// A bare `KvIndex` whose slot `w` is worker `w`, fed from borrowed slices:
/// no `Shard` bookkeeping, no event to build or free.
impl Target for KvIndex {
    fn apply(&mut self, events: &[BlockEvent], timed: &mut Figures) -> u64 {
        let mut refused = 0;
        for batch in events.chunks(APPLY_BATCH) {
            let blocks = batch.iter().map(BlockEvent::blocks).sum::<usize>() as u64;
            let start = Instant::now();
            for event in batch {
                let applied = match event {
                    BlockEvent::Stored { worker, parent, hashes, tokens, .. } => {
                        self.store(*worker, *parent, hashes, tokens, BLOCK_SIZE, HashSeed::default())
                    }
                    BlockEvent::Removed { worker, hashes } => self.remove(*worker, hashes),
                };
                refused += u64::from(applied.is_err());
            }
            timed.add(blocks, batch.len() as u64, start.elapsed());
        }
        refused
    }

    fn entries(&self) -> Option<u64> {
        Some(KvIndex::entries(self))
    }
}

fn bare_index(workers: u32) -> KvIndex {
    let mut index = KvIndex::default();
    for worker in 0..workers {
        index.add_worker(worker);
    }
    index
}

/// One of Dynamo's indexes, with the event ids it has handed out.
#[cfg(feature = "dynamo")]
struct Dynamo<T> {
    index: T,
    next_id: u64,
}

#[cfg(feature = "dynamo")]
trait DynamoIndex {
    fn apply(&mut self, event: dynamo_kv_router::protocols::RouterEvent) -> bool;
    fn entries(&self) -> Option<u64>;
}

#[cfg(feature = "dynamo")]
impl DynamoIndex for kvpick_perf::dynamo::Radix {
    fn apply(&mut self, event: dynamo_kv_router::protocols::RouterEvent) -> bool {
        kvpick_perf::dynamo::Radix::apply(self, event)
    }

    fn entries(&self) -> Option<u64> {
        Some(kvpick_perf::dynamo::Radix::entries(self) as u64)
    }
}

#[cfg(feature = "dynamo")]
impl DynamoIndex for kvpick_perf::dynamo::Positional {
    fn apply(&mut self, event: dynamo_kv_router::protocols::RouterEvent) -> bool {
        kvpick_perf::dynamo::Positional::apply(self, event)
    }

    fn entries(&self) -> Option<u64> {
        None
    }
}

#[cfg(feature = "dynamo")]
impl<T: DynamoIndex> Target for Dynamo<T> {
    fn apply(&mut self, events: &[BlockEvent], timed: &mut Figures) -> u64 {
        let mut refused = 0;
        for batch in events.chunks(APPLY_BATCH) {
            let blocks = batch.iter().map(BlockEvent::blocks).sum::<usize>() as u64;
            let converted: Vec<_> = batch
                .iter()
                .map(|event| {
                    self.next_id += 1;
                    kvpick_perf::dynamo::router_event(event, self.next_id)
                })
                .collect();
            let start = Instant::now();
            for event in converted {
                refused += u64::from(!self.index.apply(event));
            }
            timed.add(blocks, batch.len() as u64, start.elapsed());
        }
        refused
    }

    fn entries(&self) -> Option<u64> {
        self.index.entries()
    }
}

/// The child's work: `NAME` is one of the subjects. Prints the report as
/// one JSON line on stdout.
pub fn child(name: &str, cfg: &Config) -> ExitCode {
    let Some(subject) = Subject::parse(name) else {
        eprintln!("{BIN}: {CHILD_FLAG}: no index called {name:?}");
        return ExitCode::from(2);
    };
    if !Subject::measured().contains(&subject) {
        eprintln!("{BIN}: {CHILD_FLAG} {name}: built without `--features dynamo`");
        return ExitCode::from(2);
    }
    kvpick_perf::progress!(BIN, "[{name}] planning the population, building, applying the rows");
    let population = Population::plan(cfg.spec);
    let workers = population.workers();
    let report = match subject {
        Subject::Shard => measure(cfg, &population, subject, || setup::shard(workers)),
        Subject::Direct => measure(cfg, &population, subject, || bare_index(workers)),
        #[cfg(feature = "dynamo")]
        Subject::Radix => {
            measure(cfg, &population, subject, || Dynamo { index: kvpick_perf::dynamo::Radix::default(), next_id: 0 })
        }
        #[cfg(feature = "dynamo")]
        Subject::Positional => measure(cfg, &population, subject, || Dynamo {
            index: kvpick_perf::dynamo::Positional::new(crate::POSITIONAL_JUMP),
            next_id: 0,
        }),
        #[cfg(not(feature = "dynamo"))]
        Subject::Radix | Subject::Positional => unreachable!("refused above: not measured without the feature"),
    };
    match serde_json::to_string(&report) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{BIN}: {CHILD_FLAG} {name}: cannot encode the report: {e}");
            ExitCode::FAILURE
        }
    }
}

fn measure<T: Target>(cfg: &Config, population: &Population, subject: Subject, new: impl FnOnce() -> T) -> ChildReport {
    let mut problems = Vec::new();
    let before = Memory::purged();
    let start = Instant::now();
    let mut index = new();
    let mut refused = 0;
    let mut untimed = Figures::default();
    population.replay(16, |event| refused += index.apply(std::slice::from_ref(&event), &mut untimed));
    let build = start.elapsed();
    let right_after = MemoryDelta::between(before, Memory::now());
    let built = MemoryDelta::between(before, Memory::purged());
    if refused > 0 {
        problems.push(format!("{} refused {refused} population events", subject.name()));
    }
    let entries = index.entries();
    if let Some(entries) = entries.filter(|&e| e != population.entries()) {
        problems.push(format!("{} holds {entries} entries, the population {}", subject.name(), population.entries()));
    }
    let tables_built = index.tables();

    let (rows, peak, refused) = apply_rows(cfg, population, &mut index);
    let after_rows = MemoryDelta::between(before, Memory::purged());
    let unknown = index.unknown_removals();
    if refused > 0 || unknown > 0 {
        problems
            .push(format!("{} refused {refused} benchmark events and saw {unknown} unknown removals", subject.name()));
    }
    if index.entries() != entries {
        problems.push(format!(
            "the rows changed {}'s entries from {entries:?} to {:?}",
            subject.name(),
            index.entries()
        ));
    }
    let memory = match (built, right_after, after_rows) {
        (Some(built), Some(right_after), Some(after_rows)) => Some(ChildMemory {
            built: built.rss,
            right_after: right_after.rss,
            peak: built.peak,
            after_rows: after_rows.rss,
        }),
        _ => None,
    };
    let tables = tables_built.zip(index.tables()).map(|((distinct_built, bytes_built), (_, bytes_after))| Tables {
        distinct_built,
        distinct_peak: peak.max(distinct_built),
        bytes_built,
        bytes_after,
    });
    ChildReport {
        subject: subject.name().into(),
        rows,
        entries,
        build_ns: build.as_nanos() as u64,
        memory,
        tables,
        problems,
    }
}

/// The rows on one index: fresh conversation turns stored then removed, in
/// events of each batch size, then the steady-state mix. Returns the rows,
/// the most distinct blocks kvpick held during them, and refused events.
fn apply_rows<T: Target>(cfg: &Config, population: &Population, index: &mut T) -> (Vec<Figures>, u64, u64) {
    let mut rows = Vec::new();
    let mut refused = 0;
    let mut peak = 0;
    let mut track_peak = |index: &T| peak = peak.max(index.tables().map_or(0, |(distinct, _)| distinct));
    let mut fresh = FreshConversations::new(population, cfg.spec.seed ^ 0xf1e5);
    // Untimed, a round at each batch size first: the tables grow to the
    // rows' peak here, as a running router's have, and the timed rows
    // measure a grown index (without it kvpick's first row, one-block
    // stores, read 2.3-4.5 M/s from run to run, paying for the growth).
    for batch in BATCHES {
        let (stores, removals) = fresh.round(cfg.turns_per_round, TURN_BLOCKS, batch);
        let mut untimed = Figures::default();
        refused += index.apply(&stores, &mut untimed);
        track_peak(index);
        refused += index.apply(&removals, &mut untimed);
    }
    for batch in BATCHES {
        let (mut store, mut remove) = (Figures::default(), Figures::default());
        for _ in 0..cfg.rounds {
            let (stores, removals) = fresh.round(cfg.turns_per_round, TURN_BLOCKS, batch);
            refused += apply_noting_waits(index, &stores, &mut store);
            // A round stores all its turns before removing any: its peak.
            track_peak(index);
            refused += apply_noting_waits(index, &removals, &mut remove);
        }
        rows.push(store);
        rows.push(remove);
    }
    let mut mix = Figures::default();
    let mut generator = EvictionMix::new(population, cfg.spec.seed ^ 0xe71c);
    for _ in 0..cfg.mix_chunks {
        let events = generator.chunk(cfg.mix_chunk_blocks);
        refused += apply_noting_waits(index, &events, &mut mix);
        track_peak(index);
    }
    rows.push(mix);
    (rows, peak, refused)
}

/// [`Target::apply`], adding the time the thread waited for a CPU meanwhile.
fn apply_noting_waits<T: Target>(index: &mut T, events: &[BlockEvent], figures: &mut Figures) -> u64 {
    let before = run_queue_wait();
    let refused = index.apply(events, figures);
    if let Some((before, after)) = before.zip(run_queue_wait()) {
        figures.waited_ns += after.saturating_sub(before).as_nanos() as u64;
    }
    refused
}

// ---------------------------------------------------------------------------
// The parent

/// Every child's report, per subject in `Subject::measured` order, one per run.
pub struct Isolated {
    pub runs: Vec<(Subject, Vec<ChildReport>)>,
}

impl Isolated {
    /// Starts `runs` rounds of children, interleaved (each round runs every
    /// subject once), so that a slow minute of a shared machine falls on
    /// every index alike.
    pub fn measure(cfg: &Config, runs: usize, problems: &mut Vec<String>) -> Isolated {
        let mut out: Vec<(Subject, Vec<ChildReport>)> =
            Subject::measured().iter().map(|&s| (s, Vec::with_capacity(runs))).collect();
        for run in 0..runs {
            for (subject, reports) in &mut out {
                kvpick_perf::progress!(
                    BIN,
                    "event apply, run {} of {runs}: {} in its own process",
                    run + 1,
                    subject.name()
                );
                match run_child(cfg, *subject) {
                    Ok(report) => {
                        problems.extend(report.problems.iter().cloned());
                        reports.push(report);
                    }
                    Err(e) => problems.push(format!("event apply, {} child: {e}", subject.name())),
                }
            }
        }
        Isolated { runs: out }
    }

    fn reports(&self, subject: Subject) -> &[ChildReport] {
        self.runs.iter().find(|(s, _)| *s == subject).map_or(&[], |(_, r)| r.as_slice())
    }

    /// kvpick's (the Shard's) median report by RSS growth, for the memory table.
    pub fn median_memory(&self, subject: Subject) -> Option<&ChildReport> {
        let mut with: Vec<&ChildReport> = self.reports(subject).iter().filter(|r| r.memory.is_some()).collect();
        with.sort_by_key(|r| r.memory.map(|m| m.built));
        with.get(with.len() / 2).copied()
    }

    /// A row's median rate over the runs.
    pub fn median_rate(&self, subject: Subject, row: usize) -> Option<f64> {
        median(self.reports(subject).iter().filter_map(|r| r.rows.get(row)).map(Figures::blocks_per_sec).collect())
    }

    /// kvpick ÷ `other` per run (paired by run), for a row.
    fn ratios(&self, other: Subject, row: usize) -> Vec<f64> {
        let ours = self.reports(Subject::Shard);
        let theirs = self.reports(other);
        ours.iter()
            .zip(theirs)
            .filter_map(|(a, b)| Some(a.rows.get(row)?.blocks_per_sec() / b.rows.get(row)?.blocks_per_sec()))
            .filter(|r| r.is_finite())
            .collect()
    }
}

/// The flags that make a child plan the parent's population.
fn child_args(cfg: &Config, subject: Subject) -> Vec<String> {
    let mut args = vec![
        CHILD_FLAG.to_string(),
        subject.name().to_string(),
        "--entries".into(),
        cfg.spec.entries.to_string(),
        "--workers".into(),
        cfg.spec.workers.to_string(),
        "--seed".into(),
        cfg.spec.seed.to_string(),
    ];
    if cfg.quick {
        args.push("--quick".into());
    }
    // A child runs as the parent does (it would opt out by default).
    if !kvpick_app::app::huge_pages::disabled() {
        args.extend(["--transparent-huge-pages".into(), "allowed".into()]);
    }
    args
}

fn run_child(cfg: &Config, subject: Subject) -> Result<ChildReport, String> {
    let line = kvpick_perf::child::report_of_this_binary(&child_args(cfg, subject))?;
    let report: ChildReport = serde_json::from_str(&line).map_err(|e| format!("unreadable report {line:?}: {e}"))?;
    if report.rows.len() != row_names().len() {
        return Err(format!("reported {} rows, expected {}", report.rows.len(), row_names().len()));
    }
    Ok(report)
}

// ---------------------------------------------------------------------------
// The table

/// What hashing a stored block's 16 tokens (local hash, then chain) costs
/// kvpick inside `apply_event`; Dynamo's events arrive hashed.
pub fn block_hashing_cost(cfg: &Config) -> f64 {
    let blocks = if cfg.quick { 100_000 } else { 1_000_000 };
    let mut rng = fastrand::Rng::with_seed(1);
    let tokens: Vec<u32> = (0..blocks * BLOCK_SIZE as usize).map(|_| rng.u32(..128_000)).collect();
    let (last, elapsed) = timed(|| {
        let mut parent = None;
        for block in tokens.chunks_exact(BLOCK_SIZE as usize) {
            parent = Some(chain(parent, local_block_hash(block, HashSeed::default())));
        }
        parent
    });
    std::hint::black_box(last);
    elapsed.as_nanos() as f64 / blocks as f64
}

pub fn apply_table(isolated: &Isolated, hashing_ns: f64) -> Table {
    let runs = isolated.reports(Subject::Shard).len();
    let dynamo = !isolated.reports(Subject::Radix).is_empty();
    let mut t = Table::new(
        "1. Event apply throughput, single thread, each index in its own process (M block events/s; ratio = kvpick ÷ Dynamo)",
        &[
            "workload",
            "events",
            "blocks",
            "kvpick",
            "ns/block",
            "KvIndex direct",
            "Dynamo RadixTree",
            "kvpick/Radix",
            "Dynamo Positional",
            "kvpick/Positional",
            "target ≥ 5 M/s",
        ],
    );
    let dash = || "—".to_string();
    let first = isolated.reports(Subject::Shard).first();
    for (row, name) in row_names().into_iter().enumerate() {
        let figures = first.and_then(|r| r.rows.get(row)).copied().unwrap_or_default();
        let k = isolated.median_rate(Subject::Shard, row).unwrap_or(0.0);
        let cell = |s: Subject| isolated.median_rate(s, row).map_or_else(dash, millions);
        let vs = |s: Subject| ratio_cell(&isolated.ratios(s, row)).unwrap_or_else(dash);
        let target = if is_removal(row) { dash() } else { at_least(k, TARGET_EVENTS_PER_SEC) };
        t.row([
            name,
            thousands(figures.events),
            thousands(figures.blocks),
            millions(k),
            if k > 0.0 { format!("{:.0}", 1e9 / k) } else { dash() },
            cell(Subject::Direct),
            cell(Subject::Radix),
            vs(Subject::Radix),
            cell(Subject::Positional),
            vs(Subject::Positional),
            target,
        ]);
    }
    t.note(format!(
        "Each index is built and measured in a child process of its own (this binary, `{CHILD_FLAG}`), on the same population and the same events; \
         {runs} run(s), interleaved: rates are medians, ratios are per-run pairs (median, and the range when there are several runs; `--apply-runs N`)."
    ));
    t.note(format!(
        "kvpick: `Shard::apply_event` on the full population, each window of events prefetched first (`Shard::prefetch_head`) as a shard thread does; stores are new {TURN_BLOCKS}-block turns after a held system prompt, then removed leaf first."
    ));
    t.note("KvIndex direct: the same events on an identical bare `KvIndex` through `store`/`remove` from borrowed slices (no `Shard`, no `KvEvent`, no window prefetch).");
    t.note(format!("Events are converted untimed and applied timed {APPLY_BATCH} at a time, so each is cache-warm, as after decoding (so a window holds at most {APPLY_BATCH} events; a shard thread's, up to 64); freeing an event is timed."));
    t.note(format!(
        "kvpick hashes each stored block's tokens itself (local + chain xxh3: {hashing_ns:.0} ns/block of the store cost); Dynamo's events carry precomputed hashes."
    ));
    if dynamo {
        t.note("Dynamo 1.6.1's PositionalIndexer never deletes a (position, local hash) key once its last holder is removed (`remove_blocks_impl`");
        t.note("ignores `SeqEntry::remove`'s \"now empty\"), so its map grows by every block ever stored: later rows run on a larger map.");
    } else {
        t.note("Dynamo columns: build with `--features dynamo`.");
    }
    t
}

/// The slowest batch per row and index: where a table's resize, done in
/// one go, stalls the thread that owns the index.
pub fn stall_table(isolated: &Isolated) -> Table {
    let mut t = Table::new(
        format!(
            "1b. Slowest batch of {APPLY_BATCH} events per row, each index in its own process (µs; the most over the runs)"
        ),
        &["workload", "kvpick", "KvIndex direct", "Dynamo RadixTree", "Dynamo Positional"],
    );
    // "1,234", or "1,234 (waited 50)" when the child waited for a CPU
    // during that row: then the slow batch may be the machine's.
    let longest = |subject: Subject, row: usize| {
        let slowest = isolated.reports(subject).iter().filter_map(|r| r.rows.get(row)).max_by_key(|f| f.longest_ns);
        slowest.map_or_else(
            || "—".to_string(),
            |f| match f.waited_ns / 1_000 {
                0 => thousands(f.longest_ns / 1_000),
                waited => format!("{} (waited {})", thousands(f.longest_ns / 1_000), thousands(waited)),
            },
        )
    };
    for (row, name) in row_names().into_iter().enumerate() {
        t.row([
            name,
            longest(Subject::Shard, row),
            longest(Subject::Direct, row),
            longest(Subject::Radix, row),
            longest(Subject::Positional, row),
        ]);
    }
    t.note("A shard thread applies events and answers picks in turn: while one batch applies, its picks wait. A batch normally takes");
    t.note("tens to hundreds of µs; one that resizes a hash table in one go (copying every entry) takes as long as the copy.");
    t.note("(waited N): the child waited N µs for a CPU during that row (all its batches): the slowest batch may include it.");
    t
}

/// "2.31×", or "2.31× (2.20–2.45)" over several runs.
fn ratio_cell(ratios: &[f64]) -> Option<String> {
    let mid = median(ratios.to_vec())?;
    let text = ratio(mid, 1.0);
    if ratios.len() < 2 {
        return Some(text);
    }
    let (lo, hi) = range(ratios)?;
    Some(format!("{text} ({lo:.2}–{hi:.2})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_survives_the_pipe() {
        let report = ChildReport {
            subject: "kvpick".into(),
            rows: vec![
                Figures {
                    blocks: 65_536,
                    events: 65_536,
                    elapsed_ns: 13_107_200,
                    longest_ns: 20_000,
                    waited_ns: 0
                };
                7
            ],
            entries: Some(1_000_000),
            build_ns: 2_500_000_000,
            memory: Some(ChildMemory {
                built: 70_000_000,
                right_after: 90_000_000,
                peak: 95_000_000,
                after_rows: 80_000_000,
            }),
            tables: Some(Tables {
                distinct_built: 810_450,
                distinct_peak: 906_899,
                bytes_built: 58_000_000,
                bytes_after: 84_000_000,
            }),
            problems: vec!["radix refused 1 benchmark events".into()],
        };
        let line = serde_json::to_string(&report).expect("encodes");
        assert!(!line.contains('\n'), "one line per report");
        assert_eq!(serde_json::from_str::<ChildReport>(&line).expect("decodes"), report);
        assert_eq!(report.rows[0].blocks_per_sec(), 5e6);
    }

    #[test]
    fn subjects_round_trip_their_names() {
        for &subject in Subject::measured() {
            assert_eq!(Subject::parse(subject.name()), Some(subject));
        }
        assert_eq!(Subject::parse("btree"), None);
    }

    #[test]
    fn rows_are_stores_removals_then_the_mix() {
        let names = row_names();
        assert_eq!(names.len(), MIX_ROW + 1);
        for (row, name) in names.iter().enumerate() {
            assert_eq!(is_store(row), name.starts_with("store"), "{name}");
            assert_eq!(is_removal(row), name.starts_with("remove"), "{name}");
        }
        assert!(names[MIX_ROW].starts_with("steady state"));
    }

    #[test]
    fn ratio_cells_give_the_median_and_the_range() {
        assert_eq!(ratio_cell(&[]), None);
        let one = ratio_cell(&[2.0]).expect("one run");
        assert!(!one.contains('('), "{one}");
        let three = ratio_cell(&[2.5, 2.0, 2.2]).expect("three runs");
        assert!(three.ends_with("(2.00–2.50)"), "{three}");
    }
}
