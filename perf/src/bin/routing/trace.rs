//! Mooncake-format traces (the FAST'25 release's convention): one JSON
//! object a line, `{"timestamp": ms, "input_length": n, "output_length": n,
//! "hash_ids": [..]}`, each hash id naming one 512-token block together
//! with everything before it, so requests sharing a prefix share its ids.
//!
//! Replay keeps the trace's inter-arrival pattern and scales its clock so
//! that the fleet runs at the asked load; `write_sample` makes the small
//! chat-like trace shipped in `perf/data/`.

use std::fmt::{self, Write as _};
use std::path::Path;
use std::sync::Arc;

use fastrand::Rng;
use serde_json::Value;

use kvpick_perf::sim::EngineConfig;

use super::workload::{Request, Tokens, WorkModel, Workload, fits};

/// Tokens per trace block (the Mooncake convention).
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// One trace line.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRecord {
    pub timestamp_ms: f64,
    pub input_length: usize,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
}

/// A trace that cannot be read, with the line to blame.
#[derive(Debug)]
pub enum TraceError {
    Io { path: String, source: std::io::Error },
    Line { path: String, line: usize, problem: String },
    Empty { path: String },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io { path, source } => write!(f, "cannot read trace {path}: {source}"),
            TraceError::Line { path, line, problem } => write!(f, "{path}:{line}: {problem}"),
            TraceError::Empty { path } => write!(f, "{path}: no requests"),
        }
    }
}

impl std::error::Error for TraceError {}

/// Parses a whole trace; blank lines are skipped.
pub fn parse(path: &str, text: &str) -> Result<Vec<TraceRecord>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |problem: String| TraceError::Line { path: path.into(), line: i + 1, problem };
        let value: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        out.push(record(&value).map_err(bad)?);
    }
    if out.is_empty() {
        return Err(TraceError::Empty { path: path.into() });
    }
    Ok(out)
}

fn record(value: &Value) -> Result<TraceRecord, String> {
    let field = |name: &str| value.get(name).ok_or_else(|| format!("missing {name:?}"));
    let count = |name: &str| -> Result<u64, String> {
        field(name)?.as_u64().ok_or_else(|| format!("{name:?} is not a non-negative integer"))
    };
    let timestamp_ms = field("timestamp")?.as_f64().ok_or("\"timestamp\" is not a number")?;
    if !timestamp_ms.is_finite() || timestamp_ms < 0.0 {
        return Err(format!("\"timestamp\" {timestamp_ms} is not a time"));
    }
    let input_length = usize::try_from(count("input_length")?).map_err(|_| "\"input_length\" is too large")?;
    let output_length = u32::try_from(count("output_length")?).map_err(|_| "\"output_length\" is too large")?;
    let hash_ids = field("hash_ids")?
        .as_array()
        .ok_or("\"hash_ids\" is not an array")?
        .iter()
        .map(|id| id.as_u64().ok_or_else(|| format!("hash id {id} is not a non-negative integer")))
        .collect::<Result<Vec<u64>, String>>()?;
    Ok(TraceRecord { timestamp_ms, input_length, output_length, hash_ids })
}

/// Reads and parses a trace file.
pub fn load(path: &Path) -> Result<Vec<TraceRecord>, TraceError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io { path: name.clone(), source })?;
    parse(&name, &text)
}

/// The trace as a workload for `engines` engines like `engine` at `load`:
/// records in timestamp order, the first `limit` kept, those no engine
/// accepts (empty, or longer than the engine's context) skipped and counted.
pub fn workload(
    name: &str,
    mut records: Vec<TraceRecord>,
    limit: Option<usize>,
    engines: usize,
    engine: &EngineConfig,
    load: f64,
) -> Workload {
    records.sort_by(|a, b| a.timestamp_ms.total_cmp(&b.timestamp_ms));
    records.truncate(limit.unwrap_or(usize::MAX));
    let total = records.len();
    records.retain(|r| fits(engine, r.input_length, r.output_length));
    let skipped = total - records.len();
    let model = WorkModel::for_requests(engine, records.iter().map(|r| (r.input_length, r.output_length)));
    let work: f64 = records.iter().map(|r| model.request_ns(r.input_length, r.output_length)).sum();
    let first = records.first().map_or(0.0, |r| r.timestamp_ms);
    let span_ns = records.last().map_or(0.0, |r| r.timestamp_ms - first) * 1e6;
    // Stretch or squeeze the trace's clock so its work arrives at `load`
    // × the fleet's capacity over the trace's span.
    let scale = if span_ns > 0.0 { work / (load * engines as f64) / span_ns } else { 0.0 };
    let requests = records
        .into_iter()
        .enumerate()
        .map(|(i, r)| Request {
            arrival_ns: ((r.timestamp_ms - first) * 1e6 * scale) as u64,
            tokens: Tokens::Blocks {
                hash_ids: Arc::from(r.hash_ids),
                block_tokens: TRACE_BLOCK_TOKENS,
                len: r.input_length,
                salt: 0x7472_6163_6500_0000 ^ i as u64,
            },
            output_tokens: r.output_length,
            session: i,
            follows: None,
        })
        .collect();
    Workload {
        name: "trace".into(),
        description: format!(
            "Mooncake-format trace {name}: {total} records, {skipped} skipped (too long or empty), clock × {scale:.3}"
        ),
        requests,
        skipped,
    }
}

/// A chat-like trace of `lines` records in the Mooncake format: 8 shared
/// system prefixes of 1-6 blocks, conversations of 1-8 turns each adding
/// 1-3 blocks (last block partial), a fifth of the requests one-off.
pub fn write_sample(lines: usize, seed: u64) -> String {
    let mut rng = Rng::with_seed(seed);
    let mut next_id = 0u64;
    let mut fresh = |n: usize| -> Vec<u64> {
        let ids = (next_id..next_id + n as u64).collect();
        next_id += n as u64;
        ids
    };
    let systems: Vec<Vec<u64>> = (0..8).map(|_| fresh(rng.usize(1..=6))).collect();
    // Live conversations: (next turn's time ms, full-block ids, context tokens, turns left).
    let mut live: Vec<(f64, Vec<u64>, usize, usize)> = Vec::new();
    let mut out = String::new();
    let mut clock = 0.0f64;
    let mut written = 0;
    while written < lines {
        clock += -250.0 * (1.0 - rng.f64()).ln();
        let due = live.iter().position(|c| c.0 <= clock);
        let (ids, len) = if let Some(i) = due {
            let (_, mut ids, context, left) = live.swap_remove(i);
            let len = context + rng.usize(300..=1_500);
            ids.truncate(context / TRACE_BLOCK_TOKENS);
            ids.extend(fresh(len.div_ceil(TRACE_BLOCK_TOKENS) - ids.len()));
            if left > 1 {
                live.push((clock + 20_000.0 - 15_000.0 * (1.0 - rng.f64()).ln(), ids.clone(), len, left - 1));
            }
            (ids, len)
        } else if rng.f64() < 0.2 {
            let len = rng.usize(200..=6_000);
            (fresh(len.div_ceil(TRACE_BLOCK_TOKENS)), len)
        } else {
            let system = &systems[(rng.f64() * rng.f64() * systems.len() as f64) as usize];
            let len = system.len() * TRACE_BLOCK_TOKENS + rng.usize(100..=1_500);
            let mut ids = system.clone();
            ids.extend(fresh(len.div_ceil(TRACE_BLOCK_TOKENS) - ids.len()));
            let turns = rng.usize(1..=8);
            if turns > 1 {
                live.push((clock + 20_000.0 - 15_000.0 * (1.0 - rng.f64()).ln(), ids.clone(), len, turns - 1));
            }
            (ids, len)
        };
        let ids_text: Vec<String> = ids.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "{{\"timestamp\": {}, \"input_length\": {len}, \"output_length\": {}, \"hash_ids\": [{}]}}",
            clock as u64,
            rng.u32(20..=600),
            ids_text.join(", ")
        );
        written += 1;
    }
    out
}
