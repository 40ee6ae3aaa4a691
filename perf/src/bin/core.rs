//! `kvpick-bench-core`: kvpick-core's hot paths on one thread, on a
//! realistic KV population (see `kvpick_perf::workload`):
//!
//! 1. event apply throughput (`Shard::apply_event`), stores in batches of
//!    1, 16 and 64 blocks and a removal-heavy steady state;
//! 2. `find_matches` latency for an 8,192-token prompt, jump search against
//!    block-by-block scans of the same holders;
//! 3. selection latency (`select_and_reserve` + `free_reservation`), 1 and 2 shards;
//! 4. bytes per stored (block, worker) entry, by table size and by RSS;
//! 5. with `--features dynamo`, the same on Dynamo's `RadixTree` and
//!    `PositionalIndexer`, as ratios.
//!
//! Progress goes to stderr; the report (Markdown tables) to stdout.

use std::collections::{BTreeSet, VecDeque};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kvpick_core::hashing::{chain, local_block_hash};
use kvpick_core::shard::CandidateQuery;
use kvpick_core::slot_set::Slot;
use kvpick_core::{
    Admission, HashSeed, KvIndex, Millis, Prompt, ReservationId, SelectRequest, SelectionService, SequenceHash, Shard,
};
use kvpick_perf::args::{Args, ArgsError, usage};
use kvpick_perf::baseline::{HolderTable, HoldsScan};
use kvpick_perf::measure::{
    Budget, CpuTimes, Latencies, LatencySummary, Memory, MemoryDelta, Neighbours, Round, Throughput, memory_latency_ns,
    run_queue_wait, time_each, time_each_after, timed, timer_overhead,
};
use kvpick_perf::report::{self, Table, at_least, at_most, bytes, millions, ns, ratio, speedup, thousands};
use kvpick_perf::setup;
use kvpick_perf::workload::{BLOCK_SIZE, BlockEvent, EvictionMix, FreshConversations, Population, PopulationSpec};

const DEFAULT_ENTRIES: u64 = 1_000_000;
const QUICK_ENTRIES: u64 = 100_000;
const DEFAULT_WORKERS: u32 = 64;
const DEFAULT_SEED: u64 = 0x6b76_7069_636b;
const PROBES: usize = 16;
const PROMPT_BLOCKS: usize = 512;
/// Blocks per fresh conversation turn in the store benchmarks.
const TURN_BLOCKS: usize = 64;
/// Cold probes: new conversations of `TURN_BLOCKS` stored and removed again
/// (in events of 16) before each probe, 512 block events in all.
const COLD_TURNS: usize = 4;
/// Reservations outstanding during the selection benchmark.
const IN_FLIGHT: usize = 64;
/// Dynamo's jump for `PositionalIndexer`, the same as kvpick's `JUMP`.
#[cfg(feature = "dynamo")]
const POSITIONAL_JUMP: usize = 32;

/// The memory-latency probe: buffer size and timed loads.
const MEMORY_PROBE_BYTES: usize = 128 << 20;
const MEMORY_PROBE_LOADS: usize = 2_000_000;

const TARGET_EVENTS_PER_SEC: f64 = 5e6;
const TARGET_FIND_P99_NS: f64 = 5_000.0;
const TARGET_BYTES_PER_ENTRY: f64 = 48.0;

const BIN: &str = "kvpick-bench-core";

struct Config {
    quick: bool,
    spec: PopulationSpec,
    latency: Budget,
    /// Fresh-conversation rounds per store batch size, and turns per round.
    rounds: usize,
    turns_per_round: usize,
    /// Steady-state mix: chunks, and block events per chunk.
    mix_chunks: usize,
    mix_chunk_blocks: usize,
}

impl Config {
    fn new(args: &Args) -> Config {
        let quick = args.quick;
        let spec = PopulationSpec {
            workers: args.workers.unwrap_or(DEFAULT_WORKERS),
            entries: args.entries.unwrap_or(if quick { QUICK_ENTRIES } else { DEFAULT_ENTRIES }),
            probes: PROBES,
            prompt_blocks: PROMPT_BLOCKS,
            seed: args.seed.unwrap_or(DEFAULT_SEED),
        };
        let latency = if quick {
            Budget { warmup: 50, min_iters: 50, max_iters: 20_000, time: Duration::from_millis(100) }
        } else {
            Budget { warmup: 1_000, min_iters: 200, max_iters: 500_000, time: Duration::from_millis(1_500) }
        };
        Config {
            quick,
            spec,
            latency,
            rounds: if quick { 2 } else { 8 },
            turns_per_round: if quick { 256 } else { 1_024 },
            mix_chunks: if quick { 2 } else { 8 },
            mix_chunk_blocks: if quick { 16_384 } else { 65_536 },
        }
    }
}

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(ArgsError::Help) => {
            print!("{}", usage("kvpick-bench-core"));
            return ExitCode::SUCCESS;
        }
        Err(ArgsError::Invalid(message)) => {
            eprintln!("{message}\n\n{}", usage("kvpick-bench-core"));
            return ExitCode::from(2);
        }
    };
    let cfg = Config::new(&args);
    let report = run(&cfg);
    println!("{report}");
    if report.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// One index under test, with what building it took.
struct Built<T> {
    index: T,
    build: Duration,
    /// Growth once freed pages were purged (steady state).
    memory: Option<MemoryDelta>,
    /// Growth read as the build ends, freed pages (old tables) included.
    right_after: Option<MemoryDelta>,
    errors: u64,
}

/// kvpick's size right after the population was built (benchmarks grow it).
#[derive(Clone, Copy)]
struct KvpickSize {
    entries: u64,
    distinct: u64,
    approx_bytes: u64,
}

fn build<T>(
    population: &Population,
    new: impl FnOnce() -> T,
    mut apply: impl FnMut(&mut T, BlockEvent) -> bool,
) -> Built<T> {
    let before = Memory::purged();
    let (index, errors, build) = {
        let start = Instant::now();
        let mut index = new();
        let mut errors = 0;
        population.replay(16, |event| errors += u64::from(!apply(&mut index, event)));
        (index, errors, start.elapsed())
    };
    let right_after = MemoryDelta::between(before, Memory::now());
    let memory = MemoryDelta::between(before, Memory::purged());
    Built { index, build, memory, right_after, errors }
}

fn apply_kvpick(shard: &mut Shard, event: BlockEvent) -> bool {
    let (worker, event) = setup::kv_event(&event);
    shard.apply_event(worker, &event).is_ok()
}

/// A probe prompt in each index's query form.
struct Probe {
    tokens: Vec<u32>,
    prompt: Prompt,
    #[cfg(feature = "dynamo")]
    locals: Vec<dynamo_kv_router::protocols::LocalBlockHash>,
}

#[derive(Default)]
struct Report {
    header: Vec<String>,
    tables: Vec<Table>,
    problems: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for line in &self.header {
            writeln!(f, "{line}")?;
        }
        writeln!(f)?;
        for table in &self.tables {
            writeln!(f, "{table}")?;
        }
        if self.problems.is_empty() {
            writeln!(f, "Validation: every index returned the same overlaps for every probe; no event was refused.")
        } else {
            writeln!(f, "VALIDATION PROBLEMS (numbers above are suspect):")?;
            self.problems.iter().try_for_each(|p| writeln!(f, "- {p}"))
        }
    }
}

fn run(cfg: &Config) -> Report {
    let mut report = Report::default();
    if cfg!(debug_assertions) {
        report.problems.push("debug build: run with --release".into());
    }
    let load_at_start = report::load_average();
    let (started, waited_before, cpu_before) = (Instant::now(), run_queue_wait(), CpuTimes::now());
    let overhead = timer_overhead();

    kvpick_perf::progress!(BIN, "planning {} entries over {} workers", thousands(cfg.spec.entries), cfg.spec.workers);
    let population = Population::plan(cfg.spec);
    let workers = population.workers();

    // Built first, with nothing freed yet, so that RSS growth is its own.
    kvpick_perf::progress!(BIN, "building kvpick Shard");
    let mut kvpick = build(&population, || setup::shard(workers), apply_kvpick);
    if kvpick.errors > 0 {
        report.problems.push(format!("kvpick refused {} population events", kvpick.errors));
    }
    let size = KvpickSize {
        entries: kvpick.index.index().entries(),
        distinct: kvpick.index.index().distinct_blocks() as u64,
        approx_bytes: kvpick.index.index().approx_bytes() as u64,
    };
    if kvpick.index.index().entries() != population.entries() {
        report.problems.push(format!(
            "kvpick holds {} entries, the population {}",
            kvpick.index.index().entries(),
            population.entries()
        ));
    }

    #[cfg(feature = "dynamo")]
    let mut dynamo = {
        use kvpick_perf::dynamo::{Positional, Radix, router_event};
        kvpick_perf::progress!(BIN, "building Dynamo RadixTree");
        let mut id = 0;
        let radix = build(&population, Radix::default, |tree, event| {
            id += 1;
            tree.apply(router_event(&event, id))
        });
        kvpick_perf::progress!(BIN, "building Dynamo PositionalIndexer");
        let positional = build(
            &population,
            || Positional::new(POSITIONAL_JUMP),
            |index, event| {
                id += 1;
                index.apply(router_event(&event, id))
            },
        );
        if radix.index.entries() as u64 != population.entries() {
            report.problems.push(format!("RadixTree holds {} entries", radix.index.entries()));
        }
        Dynamo { radix, positional, next_id: id, refused: 0 }
    };

    kvpick_perf::progress!(BIN, "building the naive holder table");
    let mut holders = HolderTable::default();
    population.replay(64, |event| {
        if let BlockEvent::Stored { worker, hashes, .. } = event {
            holders.store(worker, hashes.into_iter().map(SequenceHash));
        }
    });

    let probes: Vec<Probe> = population
        .probe_prompts()
        .into_iter()
        .map(|tokens| Probe {
            prompt: Prompt::from_tokens(&tokens, BLOCK_SIZE, HashSeed::default()),
            #[cfg(feature = "dynamo")]
            locals: kvpick_perf::dynamo::local_hashes(&tokens),
            tokens,
        })
        .collect();

    let shape = check_probes(&kvpick.index, &holders, &probes, &mut report.problems);
    #[cfg(feature = "dynamo")]
    dynamo.check(&kvpick.index, &probes, &mut report.problems);

    report.header = header(cfg, &population, size, &shape, &overhead);

    // After the builds: the probe's 136 MiB must not count in their peak RSS.
    let memory_at_start = memory_latency_ns(MEMORY_PROBE_BYTES, MEMORY_PROBE_LOADS, 1);
    kvpick_perf::progress!(BIN, "find_matches latency");
    let mut find = bench_find_matches(cfg, &mut kvpick.index, &holders, &probes);
    find.push(cold_find_matches(cfg, &population, &mut kvpick.index, &probes, &mut report.problems));
    #[cfg(feature = "dynamo")]
    let mut find_dynamo = dynamo.bench_find_matches(cfg, &probes);
    #[cfg(feature = "dynamo")]
    find_dynamo.push(dynamo.cold_find_matches(cfg, &population, &probes, &mut report.problems));
    #[cfg(not(feature = "dynamo"))]
    let find_dynamo = Vec::new();
    drop(holders);

    kvpick_perf::progress!(BIN, "selection latency");
    let selection: Vec<SelectionResult> =
        [1, 2].iter().map(|&shards| bench_selection(cfg, &population, shards, &probes, &mut report.problems)).collect();

    kvpick_perf::progress!(BIN, "event apply throughput");
    #[cfg(feature = "dynamo")]
    let (apply, peak_distinct) =
        bench_apply(cfg, &population, &mut kvpick.index, Some(&mut dynamo), &mut report.problems);
    #[cfg(not(feature = "dynamo"))]
    let (apply, peak_distinct) = bench_apply(cfg, &population, &mut kvpick.index, None, &mut report.problems);
    let hashing = block_hashing_cost(cfg);

    let kvpick_find_p99 = find.first().map_or(0, |row| row.latency.p99);
    // The apply rows stored and removed as many blocks again as they held:
    // the tables' size after that churn, at the same entries.
    let churned = Churned { bytes: kvpick.index.index().approx_bytes() as u64, peak_distinct };
    let kvpick_mem = bytes_per_entry(&kvpick, size);
    report.tables.push(apply_table(&apply, hashing));
    report.tables.push(find_table(&find, &find_dynamo));
    report.tables.push(selection_table(&selection, find.first().map(|r| r.latency)));
    #[cfg(feature = "dynamo")]
    let others = dynamo.memory_rows();
    #[cfg(not(feature = "dynamo"))]
    let others = Vec::new();
    report.tables.push(memory_table(&kvpick, size, churned, &others));

    let slowest_store = apply
        .iter()
        .filter(|row| row.kind == ApplyKind::Store)
        .map(|row| row.kvpick.blocks_per_sec())
        .fold(f64::MAX, f64::min);
    let mix = apply.iter().find(|row| row.kind == ApplyKind::Mix).map_or(0.0, |row| row.kvpick.blocks_per_sec());
    let mut targets = Table::new("Design targets (goals, not assertions)", &["target", "measured", "status"]);
    targets
        .row([
            "≥ 5 M block events/s per core (slowest store batch)".to_string(),
            format!("{} M/s", millions(slowest_store)),
            at_least(slowest_store, TARGET_EVENTS_PER_SEC),
        ])
        .row([
            "≥ 5 M block events/s per core (steady-state mix)".to_string(),
            format!("{} M/s", millions(mix)),
            at_least(mix, TARGET_EVENTS_PER_SEC),
        ])
        .row([
            "find_matches p99 ≤ 5 µs (8,192-token prompt)".to_string(),
            format!("{} ns", ns(kvpick_find_p99)),
            at_most(kvpick_find_p99 as f64, TARGET_FIND_P99_NS),
        ]);
    let (approx, rss) = kvpick_mem;
    targets.row([
        "≤ 48 bytes per stored entry (table size)".to_string(),
        bytes(approx),
        at_most(approx, TARGET_BYTES_PER_ENTRY),
    ]);
    if let Some(rss) = rss {
        targets.row([
            "≤ 48 bytes per stored entry (RSS growth)".to_string(),
            bytes(rss),
            at_most(rss, TARGET_BYTES_PER_ENTRY),
        ]);
    }
    report.tables.push(targets);
    report
        .header
        .push(format!("- load average (1/5/15 min) at start: {load_at_start}; at end: {}", report::load_average()));
    let wall = started.elapsed();
    let waited = waited_before.zip(run_queue_wait()).map(|(before, after)| after.saturating_sub(before));
    let neighbours = Neighbours::between(cpu_before, CpuTimes::now(), wall);
    let waited_share = waited.map_or(0.0, |w| w.as_secs_f64() / wall.as_secs_f64().max(1e-9));
    let mut conditions = format!("- run took {:.0} s", wall.as_secs_f64());
    if let Some(waited) = waited {
        conditions +=
            &format!("; waited for a CPU {:.0} ms ({:.1}%)", waited.as_secs_f64() * 1e3, waited_share * 100.0);
    }
    if let Some(n) = neighbours {
        conditions += &format!(
            "; other processes used {:.2} CPUs on average; hypervisor steal {:.1}%",
            n.other_cpus,
            n.steal * 100.0
        );
    }
    let disturbed = waited_share > 0.01 || neighbours.is_some_and(|n| n.other_cpus > 0.1 || n.steal > 0.01);
    if disturbed {
        conditions += " — the machine was not idle: numbers are suspect";
    }
    report.header.push(conditions);
    report.header.push(format!(
        "- memory latency (dependent random load in 128 MiB, TLB misses included): {memory_at_start:.0} ns before the timed benchmarks, {:.0} ns after; \
         the event-apply and cold rows scale with it, the warm find_matches rows (cache-resident) do not",
        memory_latency_ns(MEMORY_PROBE_BYTES, MEMORY_PROBE_LOADS, 2)
    ));
    report
}

// ---------------------------------------------------------------------------
// Population shape and cross-checks

struct ProbeShape {
    matched_mean: f64,
    matched_min: usize,
    matched_max: usize,
    depths_mean: f64,
    deepest: u32,
    at_system_prompt_only: f64,
}

fn sorted(mut v: Vec<(Slot, u32)>) -> Vec<(Slot, u32)> {
    v.sort_unstable();
    v
}

/// Checks that the naive scans agree with the index and describes how the
/// probes match.
fn check_probes(shard: &Shard, holders: &HolderTable, probes: &[Probe], problems: &mut Vec<String>) -> ProbeShape {
    let index = shard.index();
    let slots = shard.worker_count() as Slot;
    let (mut matched, mut depths, mut deepest, mut shallow) = (Vec::new(), 0usize, 0, 0usize);
    for (i, probe) in probes.iter().enumerate() {
        let seq = &probe.prompt.seq_hashes;
        let mut jump = Vec::new();
        index.find_matches(seq, &mut jump);
        let jump = sorted(jump);
        let mut naive = Vec::new();
        holders.find_matches(seq, &mut naive);
        let mut by_holds = Vec::new();
        HoldsScan::default().find_matches(index, slots, seq, &mut by_holds);
        if sorted(naive) != jump || sorted(by_holds) != jump {
            problems.push(format!("probe {i}: naive scans disagree with KvIndex::find_matches"));
        }
        let overlaps: Vec<(Slot, u32)> =
            sorted(shard.overlaps(seq).into_iter().map(|(w, d)| (w.0 as Slot, d)).collect());
        if overlaps != jump {
            problems.push(format!("probe {i}: slots are not worker ids"));
        }
        let distinct: BTreeSet<u32> = jump.iter().map(|&(_, d)| d).collect();
        let smallest = distinct.first().copied().unwrap_or(0);
        shallow += jump.iter().filter(|&&(_, d)| d == smallest).count();
        depths += distinct.len();
        deepest = deepest.max(distinct.last().copied().unwrap_or(0));
        matched.push(jump.len());
    }
    let n = probes.len().max(1) as f64;
    let total: usize = matched.iter().sum();
    ProbeShape {
        matched_mean: total as f64 / n,
        matched_min: matched.iter().copied().min().unwrap_or(0),
        matched_max: matched.iter().copied().max().unwrap_or(0),
        depths_mean: depths as f64 / n,
        deepest,
        at_system_prompt_only: if total == 0 { 0.0 } else { shallow as f64 / total as f64 },
    }
}

fn header(
    cfg: &Config,
    population: &Population,
    size: KvpickSize,
    shape: &ProbeShape,
    overhead: &LatencySummary,
) -> Vec<String> {
    let features = if cfg!(feature = "dynamo") { "dynamo" } else { "none (add --features dynamo for the comparison)" };
    vec![
        "## kvpick-bench-core".into(),
        String::new(),
        format!("- date {} · {} · single thread · features: {features}", report::utc_date(), report::cpu()),
        format!(
            "- population{}: {} workers, {} (block, worker) entries, {} distinct blocks, {} conversations over 8 system prompts",
            if cfg.quick { " (--quick)" } else { "" },
            population.workers(),
            thousands(size.entries),
            thousands(size.distinct),
            thousands(population.conversations() as u64),
        ),
        format!(
            "- probes: {} prompts of {} tokens ({} blocks); each matches {:.1} workers (min {}, max {}) at {:.1} distinct depths, {:.0}% of them at the shallowest (system prompt) depth; deepest match {} blocks",
            PROBES,
            thousands((PROMPT_BLOCKS * BLOCK_SIZE as usize) as u64),
            PROMPT_BLOCKS,
            shape.matched_mean,
            shape.matched_min,
            shape.matched_max,
            shape.depths_mean,
            shape.at_system_prompt_only * 100.0,
            shape.deepest,
        ),
        format!("- timing one empty call costs {} ns (p50), included in every latency below", ns(overhead.p50)),
    ]
}

// ---------------------------------------------------------------------------
// 2. find_matches

struct FindRow {
    name: String,
    latency: LatencySummary,
}

fn bench_find_matches(cfg: &Config, shard: &mut Shard, holders: &HolderTable, probes: &[Probe]) -> Vec<FindRow> {
    let probe = |i: u64| &probes[i as usize % probes.len()];
    let mut rows = Vec::new();
    let mut out = Vec::with_capacity(256);
    let slots = shard.worker_count() as Slot;

    let latency = time_each(&cfg.latency, |i| {
        out.clear();
        shard.index().find_matches(&probe(i).prompt.seq_hashes, &mut out);
        out.len()
    });
    rows.push(FindRow { name: format!("KvIndex::find_matches (jump {})", kvpick_core::index::JUMP), latency });

    let mut candidates = Vec::with_capacity(slots as usize);
    let latency = time_each(&cfg.latency, |i| {
        candidates.clear();
        let query = CandidateQuery { seq_hashes: &probe(i).prompt.seq_hashes, model: None, allowed: None };
        shard.candidates(&query, &mut candidates);
        candidates.len()
    });
    rows.push(FindRow { name: format!("Shard::candidates (find_matches + {slots} candidates)"), latency });

    let latency = time_each(&cfg.latency, |i| {
        out.clear();
        holders.find_matches(&probe(i).prompt.seq_hashes, &mut out);
        out.len()
    });
    rows.push(FindRow { name: "baseline: linear scan, one lookup per block (holder-table copy)".into(), latency });

    let mut scan = HoldsScan::default();
    let latency = time_each(&cfg.latency.scaled_down(20), |i| {
        out.clear();
        scan.find_matches(shard.index(), slots, &probe(i).prompt.seq_hashes, &mut out);
        out.len()
    });
    rows.push(FindRow {
        name: "baseline: linear scan via KvIndex::holds, one lookup per (block, worker)".into(),
        latency,
    });

    let latency = time_each(&cfg.latency, |i| {
        Prompt::from_tokens(&probe(i).tokens, BLOCK_SIZE, HashSeed::default()).seq_hashes.len()
    });
    rows.push(FindRow { name: "context: Prompt::from_tokens (8,192 tokens → 512 sequence hashes)".into(), latency });
    rows
}

/// The churn before each cold probe: the same events, in the same order,
/// for every index (one seed), leaving each as it found it.
fn cold_churn(population: &Population) -> impl FnMut() -> Vec<BlockEvent> + '_ {
    let mut fresh = FreshConversations::new(population, 0xc01d);
    move || {
        let (mut events, removals) = fresh.round(COLD_TURNS, TURN_BLOCKS, 16);
        events.extend(removals);
        events
    }
}

fn cold_name(index: &str) -> String {
    format!("{index}, cold: {COLD_TURNS} new {TURN_BLOCKS}-block turns stored and removed before each probe")
}

/// Timed cold probes per index: a fixed count, so every index sees the same
/// churn (a time budget would stop the slower one earlier).
fn cold_budget(cfg: &Config) -> Budget {
    cfg.latency.exactly((cfg.latency.max_iters / COLD_SCALE).max(100))
}

/// `find_matches` between event rounds, as a live router runs it.
fn cold_find_matches(
    cfg: &Config,
    population: &Population,
    shard: &mut Shard,
    probes: &[Probe],
    problems: &mut Vec<String>,
) -> FindRow {
    let mut churn = cold_churn(population);
    let mut out = Vec::with_capacity(256);
    let mut refused = 0;
    let shard = std::cell::RefCell::new(shard);
    let latency = time_each_after(
        &cold_budget(cfg),
        |_| {
            for event in churn() {
                refused += u64::from(!apply_kvpick(&mut shard.borrow_mut(), event));
            }
        },
        |i| {
            out.clear();
            shard.borrow().index().find_matches(&probes[i as usize % probes.len()].prompt.seq_hashes, &mut out);
            out.len()
        },
    );
    let entries = shard.borrow().index().entries();
    if refused > 0 || entries != population.entries() {
        problems.push(format!("cold probes: kvpick refused {refused} churn events and holds {entries} entries after"));
    }
    FindRow { name: cold_name("KvIndex::find_matches (jump 32)"), latency }
}

/// Cold probes make fewer calls than warm ones (10,000 at full size): each
/// carries 512 untimed block events.
const COLD_SCALE: u64 = 50;

fn find_table(rows: &[FindRow], dynamo: &[FindRow]) -> Table {
    let mut t = Table::new(
        format!(
            "2. find_matches latency, {PROMPT_BLOCKS}-block prompt (ns; speedup = baseline time ÷ kvpick jump-search time)"
        ),
        &["path", "p50", "p99", "p99.9", "mean", "calls", "kvpick speedup p50", "kvpick speedup p99"],
    );
    let Some(reference) = rows.first().map(|r| r.latency) else { return t };
    for (i, row) in rows.iter().chain(dynamo).enumerate() {
        let l = row.latency;
        let context = row.name.starts_with("context");
        let (s50, s99) = if i == 0 {
            ("reference".to_string(), "reference".to_string())
        } else if context || row.name.starts_with("Shard") || row.name.contains("cold") {
            (String::new(), String::new())
        } else {
            (speedup(reference.p50, l.p50), speedup(reference.p99, l.p99))
        };
        t.row([row.name.clone(), ns(l.p50), ns(l.p99), ns(l.p999), ns(l.mean as u64), thousands(l.count), s50, s99]);
    }
    t.note("Probes rotate over 16 different prompts, back to back: their index entries stay cache-resident, so these are best cases. The `cold` rows");
    t.note("apply a round of events (untimed) before each probe, so the index is churned as a live router's is; the same events for every index.");
    let cold_row = |name: &str| {
        rows.iter().chain(dynamo).find(|r| r.name.contains(name) && r.name.contains("cold")).map(|r| r.latency)
    };
    if let Some(cold) = cold_row("KvIndex") {
        t.note(format!(
            "kvpick cold ÷ warm: p50 {:.2}×, p99 {:.2}× (#21's target: p99 at most 2× warm).",
            cold.p50 as f64 / reference.p50.max(1) as f64,
            cold.p99 as f64 / reference.p99.max(1) as f64
        ));
        if let Some(radix) = cold_row("RadixTree") {
            t.note(format!(
                "Cold, kvpick speedup over RadixTree: p50 {}, p99 {}.",
                speedup(cold.p50, radix.p50),
                speedup(cold.p99, radix.p99)
            ));
        }
    }
    t.note("kvpick is queried with the prompt's sequence hashes, hashed once per request (`context` row);");
    t.note("Dynamo with local block hashes (its `compute_block_hash_for_seq` row). `Shard::candidates` adds the per-worker load and cost inputs.");
    if dynamo.is_empty() {
        t.note("Dynamo rows: build with `--features dynamo`.");
    } else {
        t.note("RadixTree::find_matches takes its input by value: the 4 KiB copy is part of the call. PositionalIndexer recomputes sequence hashes as it probes.");
    }
    t
}

// ---------------------------------------------------------------------------
// 3. Selection

struct SelectionResult {
    shards: usize,
    pair: LatencySummary,
    reserve: LatencySummary,
    free: LatencySummary,
    build: Duration,
}

fn bench_selection(
    cfg: &Config,
    population: &Population,
    shards: usize,
    probes: &[Probe],
    problems: &mut Vec<String>,
) -> SelectionResult {
    let start = Instant::now();
    let mut service = setup::service(population.workers(), shards);
    let mut refused = 0u64;
    population.replay(16, |event| {
        let (worker, event) = setup::kv_event(&event);
        refused += u64::from(service.apply_kv_event(worker, &event).is_err());
    });
    let build = start.elapsed();
    if refused > 0 {
        problems.push(format!("selection service ({shards} shards) refused {refused} events"));
    }
    let (mut pair, mut reserve, mut free) = (Latencies::default(), Latencies::default(), Latencies::default());
    let mut in_flight: VecDeque<ReservationId> = VecDeque::with_capacity(IN_FLIGHT + 1);
    let mut failures = 0u64;
    let mut select = |service: &mut SelectionService, i: u64, in_flight: &mut VecDeque<ReservationId>| {
        let request = SelectRequest {
            id: ReservationId(i),
            prompt: probes[i as usize % probes.len()].prompt.clone(),
            model: None,
            allowed: None,
            priority: 0,
            sticky: None,
        };
        let t0 = Instant::now();
        let reserved = service.select_and_reserve(request, Millis(i));
        let t1 = Instant::now();
        let freed = if in_flight.len() >= IN_FLIGHT {
            in_flight.pop_front().map(|id| service.free_reservation(id, Millis(i)))
        } else {
            None
        };
        let t2 = Instant::now();
        match reserved {
            Ok(Admission::Reserved(_)) => in_flight.push_back(ReservationId(i)),
            _ => failures += 1,
        }
        failures += u64::from(matches!(freed, Some(Err(_))));
        (t1 - t0, t2 - t1, freed.is_some())
    };
    for round in cfg.latency.rounds() {
        let (r, f, did_free) = select(&mut service, round.index(), &mut in_flight);
        if let Round::Timed(_) = round {
            if did_free {
                reserve.record(r);
                free.record(f);
                pair.record(r + f);
            }
        }
    }
    if failures > 0 {
        problems.push(format!("selection ({shards} shards): {failures} selections or frees failed"));
    }
    SelectionResult { shards, pair: pair.summary(), reserve: reserve.summary(), free: free.summary(), build }
}

fn selection_table(rows: &[SelectionResult], find: Option<LatencySummary>) -> Table {
    let mut t = Table::new(
        format!("3. Selection latency, {PROMPT_BLOCKS}-block prompt, {IN_FLIGHT} reservations in flight (ns)"),
        &[
            "shards",
            "reserve+free p50",
            "p99",
            "p99.9",
            "select_and_reserve p50",
            "p99",
            "free_reservation p50",
            "p99",
            "p50 vs 1 shard",
        ],
    );
    let base = rows.first().map(|r| r.pair.p50).unwrap_or(0);
    for r in rows {
        t.row([
            r.shards.to_string(),
            ns(r.pair.p50),
            ns(r.pair.p99),
            ns(r.pair.p999),
            ns(r.reserve.p50),
            ns(r.reserve.p99),
            ns(r.free.p50),
            ns(r.free.p99),
            ratio(r.pair.p50 as f64, base as f64),
        ]);
    }
    t.note("Each timed call selects for a probe prompt (hashed beforehand) and frees the reservation made 64 calls earlier,");
    t.note("so every worker carries booked load. Booking and freeing walk the worker's booked-prefix tree: a step per branch or booking end on the prompt's path, not per block.");
    if let Some(find) = find {
        let share = rows.first().map_or(0.0, |r| find.p50 as f64 / r.pair.p50.max(1) as f64);
        t.note(format!("find_matches alone is {:.0}% of the 1-shard p50.", share * 100.0));
    }
    let builds: Vec<String> =
        rows.iter().map(|r| format!("{} shard(s) {:.2} s", r.shards, r.build.as_secs_f64())).collect();
    t.note(format!("Population replay through SelectionService::apply_kv_event: {}.", builds.join(", ")));
    t
}

// ---------------------------------------------------------------------------
// 1. Event apply

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ApplyKind {
    Store,
    Remove,
    Mix,
}

struct ApplyRow {
    kind: ApplyKind,
    name: String,
    kvpick: Throughput,
    /// The same events through `KvIndex::store`/`remove` directly.
    direct: Throughput,
    radix: Option<Throughput>,
    positional: Option<Throughput>,
}

/// Events are converted to each index's type (untimed) and applied (timed)
/// this many at a time, so that an applied event is as fresh in cache as one
/// a decoder has just produced, and the clock is read rarely.
const APPLY_BATCH: usize = 32;

/// Applies events to kvpick, consuming them as a decoder hands them over.
fn apply_to_shard(shard: &mut Shard, events: &[BlockEvent], throughput: &mut Throughput) -> u64 {
    let mut refused = 0;
    for batch in events.chunks(APPLY_BATCH) {
        let blocks = batch.iter().map(BlockEvent::blocks).sum::<usize>() as u64;
        let converted: Vec<_> = batch.iter().map(setup::kv_event).collect();
        let start = Instant::now();
        let mut rest = &converted[..];
        while !rest.is_empty() {
            let covered = shard.prefetch_head(rest.iter().map(|(worker, event)| (*worker, event)));
            let (window, after) = rest.split_at(covered);
            rest = after;
            for (worker, event) in window {
                refused += u64::from(shard.apply_event(*worker, event).is_err());
            }
        }
        throughput.add(blocks, batch.len() as u64, start.elapsed());
    }
    refused
}

/// Applies events straight to a `KvIndex` whose slot `w` is worker `w`,
/// from borrowed slices: no `Shard` bookkeeping, no event to build or free.
fn apply_to_index(index: &mut KvIndex, events: &[BlockEvent], throughput: &mut Throughput) -> u64 {
    let mut refused = 0;
    for batch in events.chunks(APPLY_BATCH) {
        let blocks = batch.iter().map(BlockEvent::blocks).sum::<usize>() as u64;
        let start = Instant::now();
        for event in batch {
            let applied = match event {
                BlockEvent::Stored { worker, parent, hashes, tokens, .. } => {
                    index.store(*worker, *parent, hashes, tokens, BLOCK_SIZE, HashSeed::default())
                }
                BlockEvent::Removed { worker, hashes } => index.remove(*worker, hashes),
            };
            refused += u64::from(applied.is_err());
        }
        throughput.add(blocks, batch.len() as u64, start.elapsed());
    }
    refused
}

/// A bare `KvIndex` holding the population (slot `w` = worker `w`).
fn population_index(population: &Population) -> (KvIndex, u64) {
    let mut index = KvIndex::default();
    for worker in 0..population.workers() {
        index.add_worker(worker);
    }
    let mut refused = 0;
    population.replay(16, |event| refused += apply_to_index(&mut index, &[event], &mut Throughput::default()));
    (index, refused)
}

/// The apply rows, and the most distinct blocks the shard held during
/// them (its population plus the fresh turns in flight).
fn bench_apply(
    cfg: &Config,
    population: &Population,
    shard: &mut Shard,
    mut dynamo: Option<&mut Dynamo>,
    problems: &mut Vec<String>,
) -> (Vec<ApplyRow>, u64) {
    let mut rows = Vec::new();
    let mut peak_distinct = shard.index().distinct_blocks() as u64;
    let (mut direct, mut refused) = population_index(population);
    let mut fresh = FreshConversations::new(population, cfg.spec.seed ^ 0xf1e5);
    for batch in [1, 16, 64] {
        let mut store = ApplyRow::new(ApplyKind::Store, format!("store, {batch} block(s) per event"), dynamo.is_some());
        let mut remove =
            ApplyRow::new(ApplyKind::Remove, format!("remove, {batch} block(s) per event"), dynamo.is_some());
        for _ in 0..cfg.rounds {
            let (stores, removals) = fresh.round(cfg.turns_per_round, TURN_BLOCKS, batch);
            refused += apply_to_shard(shard, &stores, &mut store.kvpick);
            // A round stores all its turns before removing any: its peak.
            peak_distinct = peak_distinct.max(shard.index().distinct_blocks() as u64);
            refused += apply_to_index(&mut direct, &stores, &mut store.direct);
            if let Some(d) = dynamo.as_deref_mut() {
                d.apply(&stores, &mut store);
            }
            refused += apply_to_shard(shard, &removals, &mut remove.kvpick);
            refused += apply_to_index(&mut direct, &removals, &mut remove.direct);
            if let Some(d) = dynamo.as_deref_mut() {
                d.apply(&removals, &mut remove);
            }
        }
        rows.push(store);
        rows.push(remove);
    }
    let entries = shard.index().entries();
    let mut mix = ApplyRow::new(
        ApplyKind::Mix,
        "steady state: stores of 16 + evictions of 1–8 (≈80% removal events)".into(),
        dynamo.is_some(),
    );
    let mut generator = EvictionMix::new(population, cfg.spec.seed ^ 0xe71c);
    for _ in 0..cfg.mix_chunks {
        let events = generator.chunk(cfg.mix_chunk_blocks);
        refused += apply_to_shard(shard, &events, &mut mix.kvpick);
        peak_distinct = peak_distinct.max(shard.index().distinct_blocks() as u64);
        refused += apply_to_index(&mut direct, &events, &mut mix.direct);
        if let Some(d) = dynamo.as_deref_mut() {
            d.apply(&events, &mut mix);
        }
    }
    rows.push(mix);
    if shard.index().entries() != entries || direct.entries() != entries {
        problems
            .push(format!("steady-state mix changed kvpick's entries from {entries} to {}", shard.index().entries()));
    }
    if refused > 0 || shard.stats().unknown_removals > 0 {
        problems.push(format!(
            "kvpick refused {refused} benchmark events and saw {} unknown removals",
            shard.stats().unknown_removals
        ));
    }
    if let Some(refused) = dynamo.map(|d| d.refused()).filter(|&r| r > 0) {
        problems.push(format!("Dynamo refused {refused} benchmark events"));
    }
    (rows, peak_distinct)
}

impl ApplyRow {
    fn new(kind: ApplyKind, name: String, with_dynamo: bool) -> ApplyRow {
        let measured = with_dynamo.then(Throughput::default);
        ApplyRow {
            kind,
            name,
            kvpick: Throughput::default(),
            direct: Throughput::default(),
            radix: measured,
            positional: measured,
        }
    }
}

/// What hashing a stored block's 16 tokens (local hash, then chain) costs
/// kvpick inside `apply_event`; Dynamo's events arrive hashed.
fn block_hashing_cost(cfg: &Config) -> f64 {
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

fn apply_table(rows: &[ApplyRow], hashing_ns: f64) -> Table {
    let dynamo = rows.first().is_some_and(|r| r.radix.is_some());
    let mut t = Table::new(
        "1. Event apply throughput, single thread (M block events/s; ratio = kvpick ÷ Dynamo)",
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
    for r in rows {
        let k = r.kvpick.blocks_per_sec();
        let cell = |t: Option<Throughput>| t.map_or_else(dash, |t| millions(t.blocks_per_sec()));
        let vs = |t: Option<Throughput>| t.map_or_else(dash, |t| ratio(k, t.blocks_per_sec()));
        let target = if r.kind == ApplyKind::Remove { dash() } else { at_least(k, TARGET_EVENTS_PER_SEC) };
        t.row([
            r.name.clone(),
            thousands(r.kvpick.events),
            thousands(r.kvpick.blocks),
            millions(k),
            format!("{:.0}", r.kvpick.ns_per_block()),
            millions(r.direct.blocks_per_sec()),
            cell(r.radix),
            vs(r.radix),
            cell(r.positional),
            vs(r.positional),
            target,
        ]);
    }
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

// ---------------------------------------------------------------------------
// 4. Memory

/// kvpick's bytes per entry: by table size, and by RSS growth when known.
fn bytes_per_entry(kvpick: &Built<Shard>, size: KvpickSize) -> (f64, Option<f64>) {
    let entries = size.entries.max(1) as f64;
    (size.approx_bytes as f64 / entries, kvpick.memory.map(|m| m.rss as f64 / entries))
}

/// Another index's build, for the memory table.
struct OtherBuild {
    name: &'static str,
    build: Duration,
    memory: Option<MemoryDelta>,
    right_after: Option<MemoryDelta>,
}

/// kvpick's index after the event-apply rows, at the same entries.
struct Churned {
    bytes: u64,
    /// The most distinct blocks it held during the rows.
    peak_distinct: u64,
}

fn memory_table(kvpick: &Built<Shard>, size: KvpickSize, churned: Churned, others: &[OtherBuild]) -> Table {
    let mut t = Table::new(
        "4. Memory per stored (block, worker) entry (bytes)",
        &[
            "index",
            "entries",
            "build",
            "table bytes/entry",
            "RSS growth/entry",
            "RSS right after/entry",
            "peak RSS growth/entry",
            "target ≤ 48 B",
        ],
    );
    let entries = size.entries;
    let per = |bytes: u64| bytes as f64 / entries.max(1) as f64;
    let mem = |m: Option<MemoryDelta>, right_after: Option<MemoryDelta>| {
        let rss = |m: Option<MemoryDelta>| m.map_or("n/a".to_string(), |m| bytes(per(m.rss)));
        (rss(m), rss(right_after), m.map_or("n/a".to_string(), |m| bytes(per(m.peak))))
    };
    let approx = per(size.approx_bytes);
    let (rss, right_after, peak) = mem(kvpick.memory, kvpick.right_after);
    let worst = kvpick.memory.map_or(approx, |m| approx.max(per(m.rss)));
    t.row([
        "kvpick KvIndex (Shard)".to_string(),
        thousands(entries),
        format!("{:.2} s", kvpick.build.as_secs_f64()),
        bytes(approx),
        rss,
        right_after,
        peak,
        at_most(worst, TARGET_BYTES_PER_ENTRY),
    ]);
    let na = || "n/a".to_string();
    t.row([
        "kvpick KvIndex (Shard), after the event-apply rows".to_string(),
        thousands(entries),
        na(),
        bytes(per(churned.bytes)),
        na(),
        na(),
        na(),
        at_most(per(churned.bytes), TARGET_BYTES_PER_ENTRY),
    ]);
    for other in others {
        let (rss, right_after, peak) = mem(other.memory, other.right_after);
        let vs = match (kvpick.memory, other.memory) {
            (Some(k), Some(o)) => format!("{} kvpick's RSS growth", ratio(o.rss as f64, k.rss as f64)),
            _ => String::new(),
        };
        t.row([
            other.name.to_string(),
            thousands(entries),
            format!("{:.2} s", other.build.as_secs_f64()),
            "n/a".into(),
            rss,
            right_after,
            peak,
            vs,
        ]);
    }
    t.note("Table bytes: `KvIndex::approx_bytes()` (hash-table capacity, not length). RSS growth: VmRSS after − before replaying the");
    t.note("population into the index (each event freed as it is applied), both read once mimalloc has purged freed pages (it keeps them");
    t.note("resident for its purge delay, 1 s in v3: the steady state of a running router). Right after: the same read as the replay ends,");
    t.note(
        "old tables freed by resizes still resident. Peak: VmHWM growth, which includes hash-table resize transients.",
    );
    t.note("Indexes are built one after the other before anything is freed, so each one's growth is its own. Build = replay time, event generation included.");
    t.note("After the event-apply rows: the same index, holding the same entries again once the rows' fresh turns were stored and removed");
    t.note(format!(
        "(table bytes only; RSS is not comparable after the other benchmarks). Its distinct blocks went from {} as built to at most {} ({:+.1}%)",
        thousands(size.distinct),
        thousands(churned.peak_distinct),
        (churned.peak_distinct as f64 / size.distinct.max(1) as f64 - 1.0) * 100.0
    ));
    t.note("while fresh turns were in flight. A hash table grows by doubling when 7/8 full (sooner when removals have left tombstones) and keeps");
    t.note("its size until a quarter full, so its bytes per entry follow the peak and where that falls between powers of two: run with");
    t.note("other `--entries` to see the sawtooth (perf/README, \"The holder table follows its peak\").");
    t
}

// ---------------------------------------------------------------------------
// 5. Dynamo

#[cfg(feature = "dynamo")]
struct Dynamo {
    radix: Built<kvpick_perf::dynamo::Radix>,
    positional: Built<kvpick_perf::dynamo::Positional>,
    next_id: u64,
    /// Benchmark events either index refused.
    refused: u64,
}

/// Without the feature there is no Dynamo to measure: no value of this type exists.
#[cfg(not(feature = "dynamo"))]
enum Dynamo {}

#[cfg(not(feature = "dynamo"))]
impl Dynamo {
    fn apply(&mut self, _: &[BlockEvent], _: &mut ApplyRow) {
        match *self {}
    }

    fn refused(&self) -> u64 {
        match *self {}
    }
}

#[cfg(feature = "dynamo")]
impl Dynamo {
    fn check(&self, shard: &Shard, probes: &[Probe], problems: &mut Vec<String>) {
        use kvpick_perf::dynamo::sorted_scores;
        if self.radix.errors + self.positional.errors > 0 {
            problems.push(format!(
                "Dynamo refused population events: RadixTree {}, PositionalIndexer {}",
                self.radix.errors, self.positional.errors
            ));
        }
        for (i, probe) in probes.iter().enumerate() {
            let same_hashes = probe
                .tokens
                .chunks_exact(BLOCK_SIZE as usize)
                .zip(&probe.locals)
                .all(|(block, theirs)| local_block_hash(block, HashSeed::default()) == theirs.0);
            if !same_hashes || probe.locals.len() != probe.prompt.seq_hashes.len() {
                problems.push(format!("probe {i}: Dynamo's local hashes differ from kvpick's"));
            }
            let mut ours: Vec<(u64, u32)> =
                shard.overlaps(&probe.prompt.seq_hashes).into_iter().map(|(w, d)| (w.0, d)).collect();
            ours.sort_unstable();
            if sorted_scores(&self.radix.index.find_matches(&probe.locals)) != ours {
                problems.push(format!("probe {i}: RadixTree overlaps differ from kvpick's"));
            }
            if sorted_scores(&self.positional.index.find_matches(&probe.locals)) != ours {
                problems.push(format!("probe {i}: PositionalIndexer overlaps differ from kvpick's"));
            }
        }
    }

    fn bench_find_matches(&self, cfg: &Config, probes: &[Probe]) -> Vec<FindRow> {
        let probe = |i: u64| &probes[i as usize % probes.len()];
        let radix = &self.radix.index;
        let positional = &self.positional.index;
        vec![
            FindRow {
                name: "Dynamo RadixTree::find_matches".into(),
                latency: time_each(&cfg.latency, |i| radix.find_matches(&probe(i).locals).scores.len()),
            },
            FindRow {
                name: format!("Dynamo PositionalIndexer::find_matches (strided, jump {POSITIONAL_JUMP})"),
                latency: time_each(&cfg.latency, |i| positional.find_matches(&probe(i).locals).scores.len()),
            },
            FindRow {
                name: "context: Dynamo compute_block_hash_for_seq (8,192 tokens → 512 local hashes)".into(),
                latency: time_each(&cfg.latency, |i| kvpick_perf::dynamo::local_hashes(&probe(i).tokens).len()),
            },
        ]
    }

    /// RadixTree's `find_matches` between the same event rounds as kvpick's
    /// cold row (applied to the RadixTree only).
    fn cold_find_matches(
        &mut self,
        cfg: &Config,
        population: &Population,
        probes: &[Probe],
        problems: &mut Vec<String>,
    ) -> FindRow {
        use kvpick_perf::dynamo::router_event;
        let mut churn = cold_churn(population);
        let this = std::cell::RefCell::new(self);
        let latency = time_each_after(
            &cold_budget(cfg),
            |_| {
                let mut this = this.borrow_mut();
                for event in churn() {
                    this.next_id += 1;
                    let event = router_event(&event, this.next_id);
                    this.refused += u64::from(!this.radix.index.apply(event));
                }
            },
            |i| this.borrow().radix.index.find_matches(&probes[i as usize % probes.len()].locals).scores.len(),
        );
        let this = this.into_inner();
        if this.radix.index.entries() as u64 != population.entries() {
            problems.push(format!("cold probes: RadixTree holds {} entries after", this.radix.index.entries()));
        }
        FindRow { name: cold_name("Dynamo RadixTree::find_matches"), latency }
    }

    /// Applies events to both Dynamo indexes, the same way as `apply_to_shard`.
    fn apply(&mut self, events: &[BlockEvent], row: &mut ApplyRow) {
        use kvpick_perf::dynamo::router_event;
        let (mut radix, mut positional) = (Throughput::default(), Throughput::default());
        for batch in events.chunks(APPLY_BATCH) {
            let blocks = batch.iter().map(BlockEvent::blocks).sum::<usize>() as u64;
            let mut convert = || -> Vec<_> {
                batch
                    .iter()
                    .map(|e| {
                        self.next_id += 1;
                        router_event(e, self.next_id)
                    })
                    .collect()
            };
            let (for_radix, for_positional) = (convert(), convert());
            let start = Instant::now();
            for event in for_radix {
                self.refused += u64::from(!self.radix.index.apply(event));
            }
            radix.add(blocks, batch.len() as u64, start.elapsed());
            let start = Instant::now();
            for event in for_positional {
                self.refused += u64::from(!self.positional.index.apply(event));
            }
            positional.add(blocks, batch.len() as u64, start.elapsed());
        }
        for (total, measured) in [(&mut row.radix, radix), (&mut row.positional, positional)] {
            if let Some(total) = total.as_mut() {
                total.add(measured.blocks, measured.events, measured.elapsed);
            }
        }
    }

    fn refused(&self) -> u64 {
        self.refused
    }

    fn memory_rows(&self) -> Vec<OtherBuild> {
        vec![
            OtherBuild {
                name: "Dynamo RadixTree",
                build: self.radix.build,
                memory: self.radix.memory,
                right_after: self.radix.right_after,
            },
            OtherBuild {
                name: "Dynamo PositionalIndexer",
                build: self.positional.build,
                memory: self.positional.memory,
                right_after: self.positional.right_after,
            },
        ]
    }
}
