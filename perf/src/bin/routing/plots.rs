//! The SVG plots of a run: per workload a TTFT CDF per policy, and across
//! workloads the hit rates and TTFT p90 per policy.

use super::WorkloadResult;
use kvpick_perf::svg::{self, Axis};

/// Points of a CDF, thinned to at most ~400 so a 10,000-request run stays small.
fn cdf(sorted: &[f64]) -> Vec<(f64, f64)> {
    let step = (sorted.len() / 400).max(1);
    let n = sorted.len() as f64;
    let mut points: Vec<(f64, f64)> =
        sorted.iter().enumerate().step_by(step).map(|(i, &v)| (v, (i + 1) as f64 / n)).collect();
    if let Some(&last) = sorted.last() {
        points.push((last, 1.0));
    }
    points
}

/// (file name, SVG document) of every plot.
pub fn all(results: &[WorkloadResult]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in results {
        let series: Vec<(&str, Vec<(f64, f64)>)> =
            r.runs.iter().map(|(name, _, s)| (name.as_str(), cdf(&s.ttfts_ms))).collect();
        let x = Axis::fit(series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)), true);
        let title = format!("TTFT CDF, {} ({} requests)", r.workload.name, r.workload.requests.len());
        let y = Axis { lo: 0.0, hi: 1.0, log: false };
        out.push((
            format!("{}-ttft-cdf.svg", r.workload.name),
            svg::lines(&title, "TTFT (ms, log)", "fraction of requests", x, y, &series),
        ));
    }
    let Some(first) = results.first() else { return out };
    let groups: Vec<&str> = results.iter().map(|r| r.workload.name.as_str()).collect();
    let per_policy = |value: fn(&super::Summary) -> f64| -> Vec<(&str, Vec<f64>)> {
        first
            .runs
            .iter()
            .enumerate()
            .map(|(i, (name, ..))| {
                (name.as_str(), results.iter().map(|r| r.runs.get(i).map_or(0.0, |x| value(&x.2))).collect())
            })
            .collect()
    };
    let mut hits = per_policy(|s| s.hit_rate * 100.0);
    hits.push(("bound", results.iter().map(|r| r.bound * 100.0).collect()));
    out.push((
        "hit-rate.svg".into(),
        svg::bars("Prefix hit rate by policy", "hit rate (%)", Axis { lo: 0.0, hi: 100.0, log: false }, &groups, &hits),
    ));
    let p90 = per_policy(|s| s.ttft_p90_ms);
    let y = Axis::fit(p90.iter().flat_map(|(_, v)| v.iter().copied()), true);
    out.push(("ttft-p90.svg".into(), svg::bars("TTFT p90 by policy", "TTFT p90 (ms, log)", y, &groups, &p90)));
    out
}
