//! `kvpick-bench-index-budget`: the KV index under a memory budget.
//!
//! The same population (`kvpick_perf::workload`) is replayed into a shard
//! with no budget and into one whose budget is a quarter of what the
//! population needs, so three quarters of the entries are evicted on the
//! way. It reports, in the same run:
//! - the budgeted build's resident-memory growth against its budget (the
//!   budget is what `--index-max-bytes` promises; the workers' fixed cost,
//!   `WORKER_BYTES` each, comes out of it before the entries');
//! - the apply rate of both builds, and of one whose budget never binds,
//!   as ratios (what the evictions cost, and what the queue alone costs),
//!   over rotating rounds;
//! - what the budgeted index still matches of the probe prompts.
//!
//! RSS is read with transparent huge pages off (as `kvpick serve` runs by
//! default) and after mimalloc has purged what it freed.
//!
//! Progress goes to stderr; the report (Markdown) to stdout.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use kvpick_app::app::{HugePages, huge_pages};
use kvpick_core::index::{ENTRY_BYTES, WORKER_BYTES};
use kvpick_core::shard::CandidateQuery;
use kvpick_core::{HashSeed, Prompt, Shard};
use kvpick_perf::args::{Args, ArgsError, usage};
use kvpick_perf::measure::{Memory, MemoryDelta};
use kvpick_perf::report::{Table, at_most, bytes, millions, ratio, thousands};
use kvpick_perf::setup;
use kvpick_perf::workload::{BLOCK_SIZE, Population, PopulationSpec};

const BIN: &str = "kvpick-bench-index-budget";
/// The budget is this fraction of the bytes the population needs.
const BUDGET_SHARE: u64 = 4;
const ROUNDS: usize = 3;

struct Build {
    shard: Shard,
    elapsed: Duration,
    memory: Option<MemoryDelta>,
    refused: u64,
}

fn build(population: &Population, workers: u32, max_bytes: Option<u64>) -> Build {
    let before = Memory::settled();
    let start = Instant::now();
    let mut shard = Shard::with_max_index_bytes(max_bytes);
    for worker in 0..workers {
        shard.upsert_worker(setup::worker_spec(worker));
    }
    let mut refused = 0;
    population.replay(16, |event| {
        let (worker, event) = setup::kv_event(&event);
        refused += u64::from(shard.apply_event(worker, &event).is_err());
    });
    let elapsed = start.elapsed();
    Build { shard, elapsed, memory: MemoryDelta::between(before, Memory::settled()), refused }
}

/// Probe prompts' total matched blocks over every worker.
fn matched(shard: &mut Shard, prompts: &[Prompt]) -> u64 {
    let mut total = 0;
    let mut out = Vec::new();
    for prompt in prompts {
        out.clear();
        shard.candidates(&CandidateQuery { seq_hashes: &prompt.seq_hashes, model: None, allowed: None }, &mut out);
        total += out.iter().map(|c| u64::from(c.overlap_blocks)).sum::<u64>();
    }
    total
}

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(ArgsError::Help) => {
            print!("{}", usage(BIN));
            return ExitCode::SUCCESS;
        }
        Err(ArgsError::Invalid(message)) => {
            eprintln!("{message}\n\n{}", usage(BIN));
            return ExitCode::from(2);
        }
    };
    let spec = PopulationSpec {
        workers: args.workers.unwrap_or(64),
        entries: args.entries.unwrap_or(if args.quick { 100_000 } else { 1_000_000 }),
        probes: 16,
        prompt_blocks: 512,
        seed: args.seed.unwrap_or(0x6b76_7069_636b),
    };
    let mut problems = Vec::new();
    // As `kvpick serve` runs by default: resident memory is what is used.
    if let Err(error) = huge_pages::apply(HugePages::Never) {
        problems.push(format!("could not opt out of transparent huge pages: {error}"));
    }
    if cfg!(debug_assertions) {
        problems.push("debug build: run with --release".to_string());
    }
    kvpick_perf::progress!(BIN, "planning {} entries over {} workers", thousands(spec.entries), spec.workers);
    let population = Population::plan(spec);
    let workers = population.workers();
    let max_bytes = population.entries() * ENTRY_BYTES / BUDGET_SHARE;

    // Budgeted first, into a fresh heap, so its growth is its own.
    kvpick_perf::progress!(BIN, "building under a budget of {} bytes", thousands(max_bytes));
    let mut capped = build(&population, workers, Some(max_bytes));
    kvpick_perf::progress!(BIN, "building with no budget");
    let mut free = build(&population, workers, None);
    // Twice the population's need: the queue is kept but never pops.
    let roomy = Some(population.entries() * ENTRY_BYTES * 2 + u64::from(workers) * WORKER_BYTES);
    let mut times = [vec![capped.elapsed], vec![free.elapsed], vec![]];
    let budgets = [Some(max_bytes), None, roomy];
    for round in 0..ROUNDS {
        kvpick_perf::progress!(BIN, "rate round {}", round + 1);
        // Rotate which goes first: the machine is shared.
        for k in 0..budgets.len() {
            let which = (round + k) % budgets.len();
            if times[which].len() < ROUNDS {
                times[which].push(build(&population, workers, budgets[which]).elapsed);
            }
        }
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let [capped_times, free_times, roomy_times] = &mut times;
    // Blocks offered, whether stored, evicted or refused: the same work.
    let events = population.entries() as f64;
    let rate = |d: Duration| events / d.as_secs_f64();
    let (capped_rate, free_rate, roomy_rate) =
        (rate(median(capped_times)), rate(median(free_times)), rate(median(roomy_times)));

    let prompts: Vec<Prompt> = population
        .probe_prompts()
        .iter()
        .map(|tokens| Prompt::from_tokens(tokens, BLOCK_SIZE, HashSeed::default()))
        .collect();
    let (capped_matched, free_matched) = (matched(&mut capped.shard, &prompts), matched(&mut free.shard, &prompts));
    let (cs, fs) = (capped.shard.stats(), free.shard.stats());
    if fs.index_entries != population.entries() {
        problems.push(format!("the unbudgeted shard holds {} entries of {}", fs.index_entries, population.entries()));
    }
    // The cap the budget leaves beside the workers' fixed costs, worked
    // out here too: the index's own figure is checked, not trusted.
    let expected = max_bytes.saturating_sub(u64::from(workers) * WORKER_BYTES) / ENTRY_BYTES;
    let max_entries = capped.shard.index().max_entries();
    if max_entries != Some(expected.max(1)) {
        problems.push(format!(
            "the budgeted shard's cap is {max_entries:?}, not {expected} (the budget less the workers' cost)"
        ));
    }
    if max_entries.is_none_or(|max| cs.index_entries > max) {
        problems.push(format!("the budgeted shard holds {} entries over its cap {max_entries:?}", cs.index_entries));
    }
    if free.refused > 0 {
        problems.push(format!("the unbudgeted shard refused {} events", free.refused));
    }

    let mut t = Table::new(
        format!(
            "Index memory budget: {} entries over {workers} workers, budget {} bytes ({} of the population's need at {ENTRY_BYTES} B/entry)",
            thousands(population.entries()),
            thousands(max_bytes),
            format_args!("1/{BUDGET_SHARE}"),
        ),
        &[
            "index",
            "entries held",
            "evicted",
            "events refused",
            "table bytes",
            "RSS growth",
            "RSS growth / budget",
            "apply M blocks/s (median of 3)",
            "probe blocks matched",
        ],
    );
    let growth = |m: Option<MemoryDelta>| m.map_or("n/a".to_string(), |m| thousands(m.rss));
    let share = capped.memory.map_or("n/a".to_string(), |m| format!("{:.2}", m.rss as f64 / max_bytes as f64));
    t.row([
        "budgeted".to_string(),
        thousands(cs.index_entries),
        thousands(cs.blocks_evicted),
        thousands(capped.refused),
        thousands(cs.index_bytes),
        growth(capped.memory),
        share,
        millions(capped_rate),
        thousands(capped_matched),
    ]);
    t.row([
        "no budget".to_string(),
        thousands(fs.index_entries),
        "0".to_string(),
        thousands(free.refused),
        thousands(fs.index_bytes),
        growth(free.memory),
        "—".to_string(),
        millions(free_rate),
        thousands(free_matched),
    ]);
    t.note(format!(
        "Apply rate (blocks offered per second, whether stored, evicted or refused) budgeted / unbudgeted: {}; with a budget that never binds (twice the need) / unbudgeted: {} ({} M/s). Budgeted RSS growth per entry held: {} B.",
        ratio(capped_rate, free_rate),
        ratio(roomy_rate, free_rate),
        millions(roomy_rate),
        capped.memory.map_or("n/a".to_string(), |m| bytes(m.rss as f64 / cs.index_entries.max(1) as f64)),
    ));
    if let Some(m) = capped.memory {
        t.note(format!("Target: RSS growth at most the budget: {}.", at_most(m.rss as f64, max_bytes as f64)));
    }
    t.note(format!(
        "The workers' fixed cost comes out of the budget first ({workers} × {WORKER_BYTES} B = {} B): the entries' cap is {}.",
        thousands(u64::from(workers) * WORKER_BYTES),
        max_entries.map_or("n/a".to_string(), thousands),
    ));
    t.note("Events refused under the budget: stores whose parent block was evicted (the engine still had it); they are counted as unknown-parent events, as a lost store is.");
    println!("{t}");
    if problems.is_empty() {
        println!(
            "Validation: the budgeted shard stayed within its cap; the unbudgeted one holds the whole population."
        );
        ExitCode::SUCCESS
    } else {
        println!("VALIDATION PROBLEMS (numbers above are suspect):");
        problems.iter().for_each(|p| println!("- {p}"));
        ExitCode::FAILURE
    }
}
