//! A saturation sweep's report: per workload, each policy's goodput,
//! output tokens/s and TTFT p90 at every offered load, the goodput
//! target at 120% load, and a goodput-against-load plot.

use kvpick_perf::report::Table;

use super::WorkloadResult;
use super::args::PolicyName;
use kvpick_perf::svg::{self, Axis};

/// The load at which goodput is judged, and kvpick's margin over GAIE's
/// approximate-prefix scorer there.
const JUDGED_LOAD: f64 = 1.2;
const GOODPUT_VS_APPROX_PREFIX: f64 = 1.3;

fn policies(points: &[(f64, WorkloadResult)]) -> Vec<PolicyName> {
    points.first().map(|(_, r)| r.runs.iter().map(|(n, ..)| *n).collect()).unwrap_or_default()
}

fn value(result: &WorkloadResult, policy: PolicyName, f: fn(&super::Summary) -> f64) -> Option<f64> {
    result.runs.iter().find(|(n, ..)| *n == policy).map(|(_, _, s)| f(s))
}

/// Three tables (goodput, output tokens/s, TTFT p90) of policies × loads.
pub fn tables(points: &[(f64, WorkloadResult)], slo_ms: f64) -> String {
    let Some((_, first)) = points.first() else { return String::new() };
    let name = &first.workload.name;
    let loads: Vec<String> = points.iter().map(|(l, _)| format!("{:.0}%", l * 100.0)).collect();
    let mut header = vec!["policy"];
    header.extend(loads.iter().map(String::as_str));
    type Metric = (&'static str, fn(&super::Summary) -> f64, fn(f64) -> String);
    let metrics: [Metric; 3] = [
        ("goodput (requests/s with TTFT ≤ SLO)", |s| s.goodput_per_s, |v| format!("{v:.2}")),
        ("output tokens/s", |s| s.output_tokens_per_s, |v| format!("{v:.0}")),
        ("TTFT p90 ms", |s| s.ttft_p90_ms, |v| if v >= 100.0 { format!("{v:.0}") } else { format!("{v:.1}") }),
    ];
    let mut out = String::new();
    for (title, metric, format) in metrics {
        let mut t = Table::new(format!("{name}, saturation sweep: {title}, TTFT SLO {slo_ms:.0} ms"), &header);
        for policy in policies(points) {
            let mut row = vec![policy.as_str().to_string()];
            row.extend(points.iter().map(|(_, r)| value(r, policy, metric).map_or_else(String::new, format)));
            t.row(row);
        }
        out.push_str(&t.to_string());
        out.push('\n');
    }
    out.push_str(&target(points));
    out.push_str(&format!("- {}\n", first.workload.description));
    out
}

/// The goodput target's line, when the sweep has the judged load.
fn target(points: &[(f64, WorkloadResult)]) -> String {
    let Some((_, at)) = points.iter().find(|(l, _)| (*l - JUDGED_LOAD).abs() < 1e-9) else {
        return format!("- goodput target: not judged (the sweep has no {:.0}% load)\n", JUDGED_LOAD * 100.0);
    };
    let goodput = |p| value(at, p, |s| s.goodput_per_s);
    let Some(kv) = goodput(PolicyName::Kvpick) else { return String::new() };
    let mut line = format!("- goodput target at {:.0}% load: kvpick {kv:.2}/s", JUDGED_LOAD * 100.0);
    if let Some(ap) = goodput(PolicyName::ApproxPrefix) {
        let ratio = kv / ap.max(1e-12);
        let verdict = if ratio >= GOODPUT_VS_APPROX_PREFIX { "met" } else { "MISSED" };
        line.push_str(&format!("; ≥ {GOODPUT_VS_APPROX_PREFIX}× approx-prefix's ({ap:.2}/s): {ratio:.2}× → {verdict}"));
    }
    let best_other = at
        .runs
        .iter()
        .filter(|(n, ..)| !matches!(n, PolicyName::Kvpick | PolicyName::Oracle))
        .map(|(n, _, s)| (n.as_str(), s.goodput_per_s))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((best, g)) = best_other {
        let verdict = if kv >= g { "met" } else { "MISSED" };
        line.push_str(&format!("; ≥ every other policy's (best: {best} {g:.2}/s) → {verdict}"));
    }
    line.push('\n');
    line
}

/// (file name, SVG) of goodput against offered load, one line per policy.
pub fn plot(points: &[(f64, WorkloadResult)], slo_ms: f64) -> (String, String) {
    let name = points.first().map_or("sweep", |(_, r)| r.workload.name.as_str());
    let series: Vec<(&str, Vec<(f64, f64)>)> = policies(points)
        .into_iter()
        .map(|p| {
            let line =
                points.iter().filter_map(|(l, r)| value(r, p, |s| s.goodput_per_s).map(|g| (l * 100.0, g))).collect();
            (p.as_str(), line)
        })
        .collect();
    let x = Axis::fit(series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)), false);
    let y = Axis::fit(series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)).chain([0.0]), false);
    let title = format!("Goodput (TTFT ≤ {slo_ms:.0} ms) against offered load, {name}");
    (
        format!("{name}-goodput-sweep.svg"),
        svg::lines(&title, "offered load (% of no-cache capacity)", "goodput (requests/s)", x, y, &series),
    )
}
