//! A joining replica's ramp (issue #22's warm start): the prefix hit rate
//! and TTFT of the requests it picked, in windows after it joined, next to
//! those the replica already running picked in the same windows. A warm
//! replica should route like the cluster at once; a cold one climbs as
//! the engines' new blocks teach it.

use kvpick_perf::report::Table;
use kvpick_perf::svg::{self, Axis};

use super::WorkloadResult;
use super::fleet::{Joined, Record, RunResult};
use super::summary::{hit_rate, percentile, sorted_ttfts_ms};

/// The table shows this many windows one by one, then the rest as one.
const ROWS: usize = 15;
/// The joiner has caught up once its hit rate is within this fraction of
/// the other replica's in a window.
const CAUGHT_UP: f64 = 0.95;
/// The plot shows this many windows (a cold joiner's climb, not the
/// rest of the run).
const PLOT_WINDOWS: usize = 60;

/// Requests of one side (the joiner's or the other's) in one window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Side {
    pub requests: usize,
    pub hit_rate: f64,
    pub ttft_p90_ms: f64,
}

impl Side {
    fn of<'a>(records: impl Iterator<Item = &'a Record>) -> Side {
        let done: Vec<&Record> = records.filter(|r| r.finished_ns.is_some()).collect();
        Side { requests: done.len(), hit_rate: hit_rate(&done), ttft_p90_ms: percentile(&sorted_ttfts_ms(&done), 0.90) }
    }

    fn cell(&self) -> String {
        if self.requests == 0 {
            return "–".into();
        }
        format!("{:.1}% · {:.1}", self.hit_rate * 100.0, self.ttft_p90_ms)
    }
}

/// The requests arriving in `lo..hi`: (the joiner's, the other's).
fn split(run: &RunResult, by_joiner: &[bool], lo: u64, hi: u64) -> (Side, Side) {
    let inside = || run.records.iter().enumerate().filter(|(_, r)| (lo..hi).contains(&r.arrival_ns));
    (
        Side::of(inside().filter(|(i, _)| by_joiner[*i]).map(|(_, r)| r)),
        Side::of(inside().filter(|(i, _)| !by_joiner[*i]).map(|(_, r)| r)),
    )
}

/// Which requests the joiner picked, by request index.
fn by_joiner(run: &RunResult, joined: &Joined) -> Vec<bool> {
    let mut mine = vec![false; run.records.len()];
    for &id in &joined.requests {
        if let Some(m) = mine.get_mut(id) {
            *m = true;
        }
    }
    mine
}

/// A run's windows after the join: (joiner, other) per window, by arrival.
pub fn windows(run: &RunResult, joined: &Joined, window_ns: u64) -> Vec<(Side, Side)> {
    let mine = by_joiner(run, joined);
    let last = run.records.iter().map(|r| r.arrival_ns).max().unwrap_or(0);
    let count = last.saturating_sub(joined.at_ns) / window_ns.max(1) + 1;
    (0..count).map(|k| split(run, &mine, joined.at_ns + k * window_ns, joined.at_ns + (k + 1) * window_ns)).collect()
}

/// The first window whose joiner hit rate is within [`CAUGHT_UP`] of the
/// other replica's and stays so in the next one.
fn caught_up(windows: &[(Side, Side)]) -> Option<usize> {
    let ok = |(j, o): &(Side, Side)| j.requests > 0 && o.requests > 0 && j.hit_rate >= CAUGHT_UP * o.hit_rate;
    (0..windows.len()).find(|&k| ok(&windows[k]) && windows.get(k + 1).is_none_or(ok))
}

/// The runs of `result` that had a replica join.
fn joins(result: &WorkloadResult) -> Vec<(&str, &RunResult, &Joined)> {
    result.runs.iter().filter_map(|(name, run, _)| Some((name.as_str(), run, run.joined.as_ref()?))).collect()
}

/// The ramp table of a workload, when one of its runs had a replica join.
pub fn table(result: &WorkloadResult, window_s: f64) -> Option<String> {
    let runs = joins(result);
    let first = runs.first()?;
    let window_ns = (window_s * 1e9) as u64;
    let per_run: Vec<Vec<(Side, Side)>> = runs.iter().map(|(_, run, j)| windows(run, j, window_ns)).collect();
    let mut header = vec!["seconds after the join".to_owned()];
    for (name, ..) in &runs {
        header.push(format!("{name}: joiner"));
        header.push(format!("{name}: other"));
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(
        format!(
            "{}: the joining replica's ramp, joined at {:.1} s (prefix hit rate · TTFT p90 ms of the requests each replica picked, by arrival)",
            result.workload.name,
            first.2.at_ns as f64 / 1e9
        ),
        &header,
    );
    let rows = per_run.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..rows.min(ROWS) {
        let mut row = vec![format!("{:.0}–{:.0}", k as f64 * window_s, (k + 1) as f64 * window_s)];
        for windows in &per_run {
            let (j, o) = windows.get(k).copied().unwrap_or_default();
            row.extend([j.cell(), o.cell()]);
        }
        t.row(row);
    }
    if rows > ROWS {
        let mut row = vec![format!("{:.0}–end", ROWS as f64 * window_s)];
        for (_, run, joined) in &runs {
            let (j, o) = split(run, &by_joiner(run, joined), joined.at_ns + ROWS as u64 * window_ns, u64::MAX);
            row.extend([j.cell(), o.cell()]);
        }
        t.row(row);
    }
    for ((name, ..), windows) in runs.iter().zip(&per_run) {
        t.note(match caught_up(windows) {
            Some(k) => format!(
                "{name}: the joiner's hit rate is within {:.0}% of the other replica's from the window at {:.0} s",
                (1.0 - CAUGHT_UP) * 100.0,
                k as f64 * window_s
            ),
            None => format!(
                "{name}: the joiner's hit rate never came within {:.0}% of the other's",
                (1.0 - CAUGHT_UP) * 100.0
            ),
        });
    }
    Some(t.to_string())
}

/// The ramp plot of every workload that had a replica join: hit rate
/// against seconds after the join, the joiner's and the other's per run.
pub fn plots(results: &[WorkloadResult], window_s: f64) -> Vec<(String, String)> {
    let window_ns = (window_s * 1e9) as u64;
    let mut out = Vec::new();
    for result in results {
        let runs = joins(result);
        if runs.is_empty() {
            continue;
        }
        let mut names = Vec::new();
        let mut points = Vec::new();
        for (name, run, joined) in &runs {
            let mut windows = windows(run, joined, window_ns);
            windows.truncate(PLOT_WINDOWS);
            let at = |k: usize| (k as f64 + 0.5) * window_s;
            let side = |pick: fn(&(Side, Side)) -> Side| -> Vec<(f64, f64)> {
                windows
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| pick(w).requests > 0)
                    .map(|(k, w)| (at(k), pick(w).hit_rate * 100.0))
                    .collect()
            };
            names.push(format!("{name}: joiner"));
            points.push(side(|w| w.0));
            names.push(format!("{name}: other"));
            points.push(side(|w| w.1));
        }
        let series: Vec<(&str, Vec<(f64, f64)>)> = names.iter().map(String::as_str).zip(points).collect();
        let x = Axis::fit(series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)), false);
        let y = Axis { lo: 0.0, hi: 100.0, log: false };
        let title = format!("{}: a replica joining mid-run, warm and cold", result.workload.name);
        out.push((
            format!("{}-join-ramp.svg", result.workload.name),
            svg::lines(&title, "seconds after the join", "prefix hit rate of its requests (%)", x, y, &series),
        ));
    }
    out
}
