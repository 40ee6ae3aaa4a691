//! `kvpick-bench-core`: kvpick-core's hot paths on one thread, on a
//! realistic KV population (see `kvpick_perf::workload`):
//!
//! 1. event apply throughput (`Shard::apply_event`), stores in batches of
//!    1, 16 and 64 blocks and a removal-heavy steady state, each index in a
//!    child process of its own (`apply.rs` says why);
//! 2. `find_matches` latency for an 8,192-token prompt, jump search against
//!    block-by-block scans of the same holders;
//! 3. selection latency (`select_and_reserve` + `free_reservation`), 1 and 2 shards;
//! 4. bytes per stored (block, worker) entry, by table size and by RSS
//!    (read in the same children);
//! 5. with `--features dynamo`, the same on Dynamo's `RadixTree` and
//!    `PositionalIndexer`, as ratios.
//!
//! Progress goes to stderr; the report (Markdown tables) to stdout.

use std::collections::{BTreeSet, VecDeque};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kvpick_app::app::HugePages;
use kvpick_core::hashing::next_sequence_hash;
use kvpick_core::shard::CandidateQuery;
use kvpick_core::slot_set::Slot;
use kvpick_core::{
    Admission, HashSeed, Millis, Prompt, ReservationId, SelectRequest, SelectionService, SequenceHash, Shard,
};
use kvpick_perf::args::{Args, ArgsError, Flags, usage};
use kvpick_perf::baseline::{HolderTable, HoldsScan};
use kvpick_perf::measure::{
    Budget, CpuTimes, Latencies, LatencySummary, Neighbours, Round, memory_latency_ns, run_queue_wait, time_each,
    time_each_after, timer_overhead,
};
use kvpick_perf::report::{self, Table, at_least, at_most, bytes, millions, ns, ratio, speedup, thousands};
use kvpick_perf::setup;

mod apply;
use apply::{ChildMemory, Isolated, Subject, apply_table, block_hashing_cost, stall_table};
use kvpick_perf::workload::{BLOCK_SIZE, BlockEvent, FreshConversations, Population, PopulationSpec};

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
    let parsed = OwnFlags::take(std::env::args().skip(1)).and_then(|(own, rest)| Ok((own, Args::parse(rest)?)));
    let (own, args) = match parsed {
        Ok(parsed) => parsed,
        Err(ArgsError::Help) => {
            print!("{}{OWN_USAGE}", usage(BIN));
            return ExitCode::SUCCESS;
        }
        Err(ArgsError::Invalid(message)) => return usage_error(&message),
    };
    // As `kvpick serve` runs by default (`--transparent-huge-pages never`):
    // mimalloc madvises its arenas for huge pages, and on a system in THP
    // `madvise` mode a fault may then compact memory for a 2 MiB page.
    // That stalled single events for ~5 ms here (and a table's first
    // touches for 35-60 ms), which is this bench's environment, not what
    // a router sees. Inherited by the apply children. `allowed` measures
    // what `kvpick serve --transparent-huge-pages allowed` would see.
    if let Err(e) = kvpick_app::app::huge_pages::apply(own.huge_pages) {
        kvpick_perf::progress!(BIN, "could not opt out of transparent huge pages: {e}");
    }
    let cfg = Config::new(&args);
    if let Some(name) = own.child {
        return apply::child(&name, &cfg);
    }
    let report = run(&cfg, own.apply_runs);
    println!("{report}");
    if report.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("{message}\n\n{}{OWN_USAGE}", usage(BIN));
    ExitCode::from(2)
}

const OWN_USAGE: &str = "  --apply-runs N interleaved runs of the event-apply children (default 1): medians and ranges
  --transparent-huge-pages never|allowed
                 as `kvpick serve`'s flag (default never, as its default)
";

/// This benchmark's own flags, taken out before the shared ones are parsed.
struct OwnFlags {
    /// `--apply-runs N`: rounds of event-apply children.
    apply_runs: usize,
    /// `--apply-child NAME`: this process is a child measuring one index.
    child: Option<String>,
    /// `--transparent-huge-pages never|allowed`, as `kvpick serve` takes it.
    huge_pages: HugePages,
}

impl OwnFlags {
    fn take(words: impl Iterator<Item = String>) -> Result<(OwnFlags, Vec<String>), ArgsError> {
        let mut own = OwnFlags { apply_runs: 1, child: None, huge_pages: HugePages::Never };
        let mut rest = Vec::new();
        let mut flags = Flags::new(words);
        while let Some(flag) = flags.next_flag() {
            match flag.name.as_str() {
                "--apply-runs" => {
                    let value = flags.value(&flag)?;
                    own.apply_runs = value.parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                        ArgsError::Invalid(format!("--apply-runs: {value:?} is not a count of at least 1"))
                    })?;
                }
                "--transparent-huge-pages" => {
                    let value = flags.value(&flag)?;
                    own.huge_pages = HugePages::from_name(&value).ok_or_else(|| {
                        ArgsError::Invalid(format!(
                            "--transparent-huge-pages: {value:?} is neither `never` nor `allowed`"
                        ))
                    })?;
                }
                name if name == apply::CHILD_FLAG => own.child = Some(flags.value(&flag)?),
                _ => rest.push(flag.into_word()),
            }
        }
        Ok((own, rest))
    }
}

/// One index under test.
struct Built<T> {
    index: T,
    /// Population events it refused.
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
    let mut index = new();
    let mut errors = 0;
    population.replay(16, |event| errors += u64::from(!apply(&mut index, event)));
    Built { index, errors }
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

fn run(cfg: &Config, apply_runs: usize) -> Report {
    let mut report = Report::default();
    if cfg!(debug_assertions) {
        report.problems.push("debug build: run with --release".into());
    }
    let load_at_start = report::load_average();
    let (started, waited_before, cpu_before) = (Instant::now(), run_queue_wait(), CpuTimes::now());
    let overhead = timer_overhead();

    let memory_at_start = memory_latency_ns(MEMORY_PROBE_BYTES, MEMORY_PROBE_LOADS, 1);
    // First, while this process holds nothing: each index's children.
    let isolated = Isolated::measure(cfg, apply_runs, &mut report.problems);

    kvpick_perf::progress!(BIN, "planning {} entries over {} workers", thousands(cfg.spec.entries), cfg.spec.workers);
    let population = Population::plan(cfg.spec);
    let workers = population.workers();

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

    let hashing = block_hashing_cost(cfg);
    let kvpick_find_p99 = find.first().map_or(0, |row| row.latency.p99);
    report.tables.push(apply_table(&isolated, hashing));
    report.tables.push(stall_table(&isolated));
    report.tables.push(find_table(&find, &find_dynamo));
    report.tables.push(selection_table(&selection, find.first().map(|r| r.latency)));
    report.tables.push(memory_table(&isolated));

    let rate = |row| isolated.median_rate(Subject::Shard, row).unwrap_or(0.0);
    let slowest_store = (0..apply::MIX_ROW).filter(|&row| apply::is_store(row)).map(rate).fold(f64::MAX, f64::min);
    let mix = rate(apply::MIX_ROW);
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
    let per_entry = |bytes: u64| bytes as f64 / size.entries.max(1) as f64;
    let approx = per_entry(size.approx_bytes);
    let rss = isolated.median_memory(Subject::Shard).and_then(|r| r.memory).map(|m| per_entry(m.built));
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
        format!(
            "- date {} · {} · single thread · features: {features} · transparent huge pages {}",
            report::utc_date(),
            report::cpu(),
            if kvpick_app::app::huge_pages::disabled() { "off (as `kvpick serve` runs)" } else { "allowed" }
        ),
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
    // Its two halves apart, to show where the floor is: the local hashes
    // are independent (they overlap), the chain is not (each link hashes
    // the one before).
    let latency = time_each(&cfg.latency, |i| {
        kvpick_core::hashing::local_block_hashes(&probe(i).tokens, BLOCK_SIZE, HashSeed::default()).len()
    });
    rows.push(FindRow { name: LOCAL_ONLY_ROW.into(), latency });
    let locals: Vec<Vec<u64>> = probes
        .iter()
        .map(|p| kvpick_core::hashing::local_block_hashes(&p.tokens, BLOCK_SIZE, HashSeed::default()))
        .collect();
    let latency = time_each(&cfg.latency, |i| {
        let locals = &locals[i as usize % locals.len()];
        let first = SequenceHash(locals.first().copied().unwrap_or_default());
        let last = locals.iter().skip(1).fold(first, |parent, &local| next_sequence_hash(parent, local));
        last.0 as usize
    });
    rows.push(FindRow { name: CHAIN_ONLY_ROW.into(), latency });
    rows
}

const LOCAL_ONLY_ROW: &str = "context: its local hashes alone (512 xxh3 of 64 bytes)";
const CHAIN_ONLY_ROW: &str = "context: its chain alone (511 links on those local hashes)";

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
    let context_row = |name: &str| rows.iter().find(|r| r.name == name).map(|r| r.latency);
    if let Some((local, chain)) = context_row(LOCAL_ONLY_ROW).zip(context_row(CHAIN_ONLY_ROW)) {
        t.note(format!(
            "its chain alone takes {} ns at p50 ({:.1} ns a link), its local hashes {} ns: each link is xxh3 of the one before \
             (Dynamo's scheme), a floor no layout removes.",
            ns(chain.p50),
            chain.p50 as f64 / (PROMPT_BLOCKS - 1) as f64,
            ns(local.p50)
        ));
    }
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
// 4. Memory

/// The memory table's rows: each index's child, the run with the median
/// RSS growth.
fn memory_table(isolated: &Isolated) -> Table {
    let mut t = Table::new(
        "4. Memory per stored (block, worker) entry (bytes), each index in its own process",
        &[
            "index",
            "entries",
            "build",
            "table bytes/entry, built → after the apply rows",
            "RSS growth/entry",
            "RSS right after/entry",
            "peak RSS growth/entry",
            "RSS growth after the apply rows/entry",
            "vs kvpick / target ≤ 48 B",
        ],
    );
    let na = || "n/a".to_string();
    let kvpick = isolated.median_memory(Subject::Shard);
    let entries = kvpick.and_then(|r| r.entries).unwrap_or(0);
    let per = |bytes: u64| bytes as f64 / entries.max(1) as f64;
    let subjects = [
        (Subject::Shard, "kvpick KvIndex (Shard)"),
        (Subject::Radix, "Dynamo RadixTree"),
        (Subject::Positional, "Dynamo PositionalIndexer"),
    ];
    for (subject, name) in subjects {
        let Some(report) = isolated.median_memory(subject) else { continue };
        let rss = |pick: fn(&ChildMemory) -> u64| report.memory.as_ref().map_or_else(na, |m| bytes(per(pick(m))));
        let tables =
            report.tables.map_or_else(na, |t| format!("{} → {}", bytes(per(t.bytes_built)), bytes(per(t.bytes_after))));
        let verdict = match (subject, kvpick.and_then(|k| k.memory), report.memory) {
            (Subject::Shard, _, memory) => {
                let worst = report.tables.map_or(0.0, |t| per(t.bytes_built)).max(memory.map_or(0.0, |m| per(m.built)));
                at_most(worst, TARGET_BYTES_PER_ENTRY)
            }
            (_, Some(k), Some(o)) => format!("{} kvpick's RSS growth", ratio(o.built as f64, k.built as f64)),
            _ => String::new(),
        };
        t.row([
            name.to_string(),
            thousands(entries),
            format!("{:.2} s", report.build_ns as f64 / 1e9),
            tables,
            rss(|m| m.built),
            rss(|m| m.right_after),
            rss(|m| m.peak),
            rss(|m| m.after_rows),
            verdict,
        ]);
    }
    t.note("Table bytes: `KvIndex::approx_bytes()` (hash-table capacity, not length). RSS growth: VmRSS after − before replaying the");
    t.note("population into the index (each event freed as it is applied), both read once mimalloc has purged freed pages (it keeps them");
    t.note("resident for its purge delay, 1 s in v3: the steady state of a running router). Right after: the same read as the replay ends,");
    t.note(
        "old tables freed by resizes still resident. Peak: VmHWM growth, which includes hash-table resize transients.",
    );
    t.note("Each index is built in its own process (the event-apply children), so its growth is its own. Build = replay time, event generation included.");
    t.note("After the apply rows: the same index, holding the same entries again once the rows' fresh turns were stored and removed, read the same way.");
    t.note("Dynamo's PositionalIndexer keeps every key it ever saw (table 1's note), so its growth after the rows includes the rows' blocks.");
    if let Some(tables) = kvpick.and_then(|r| r.tables) {
        t.note(format!(
            "kvpick's distinct blocks went from {} as built to at most {} ({:+.1}%) while fresh turns were in flight. A hash table grows by",
            thousands(tables.distinct_built),
            thousands(tables.distinct_peak),
            (tables.distinct_peak as f64 / tables.distinct_built.max(1) as f64 - 1.0) * 100.0
        ));
    }
    t.note("doubling when 7/8 full (sooner when removals have left tombstones) and keeps its size until a quarter full, so its bytes per");
    t.note("entry follow the peak and where that falls between powers of two: run with other `--entries` to see the sawtooth");
    t.note("(perf/README, \"The holder table follows its peak\").");
    t
}

// ---------------------------------------------------------------------------
// 5. Dynamo

#[cfg(feature = "dynamo")]
struct Dynamo {
    radix: Built<kvpick_perf::dynamo::Radix>,
    positional: Built<kvpick_perf::dynamo::Positional>,
    next_id: u64,
    /// Cold-probe churn events RadixTree refused.
    refused: u64,
}

#[cfg(feature = "dynamo")]
impl Dynamo {
    fn check(&self, shard: &Shard, probes: &[Probe], problems: &mut Vec<String>) {
        use kvpick_core::hashing::local_block_hash;
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
        if this.refused > 0 || this.radix.index.entries() as u64 != population.entries() {
            problems.push(format!(
                "cold probes: RadixTree refused {} churn events and holds {} entries after",
                this.refused,
                this.radix.index.entries()
            ));
        }
        FindRow { name: cold_name("Dynamo RadixTree::find_matches"), latency }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(words: &[&str]) -> Result<(OwnFlags, Vec<String>), ArgsError> {
        OwnFlags::take(words.iter().map(|w| w.to_string()))
    }

    #[test]
    fn own_flags_come_out_and_the_rest_pass_on_as_written() {
        let (own, rest) = take(&["--workers", "256", "--transparent-huge-pages", "allowed", "--apply-runs=3"])
            .unwrap_or_else(|_| panic!("valid flags"));
        assert_eq!(own.huge_pages, HugePages::Allowed);
        assert_eq!(own.apply_runs, 3);
        assert_eq!(rest, ["--workers", "256"]);
        let (own, _) = take(&["--transparent-huge-pages=never"]).unwrap_or_else(|_| panic!("valid flag"));
        assert_eq!(own.huge_pages, HugePages::Never);
        let (own, rest) = take(&[]).unwrap_or_else(|_| panic!("no flags"));
        assert_eq!(own.huge_pages, HugePages::Never, "as `kvpick serve`'s default");
        assert!(rest.is_empty() && own.child.is_none());
    }

    #[test]
    fn a_huge_pages_choice_is_never_or_allowed() {
        match take(&["--transparent-huge-pages", "always"]) {
            Err(ArgsError::Invalid(message)) => assert!(message.contains("\"always\""), "{message}"),
            _ => panic!("`always` is not a choice"),
        }
    }
}
