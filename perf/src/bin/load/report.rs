//! Outcomes tallied into a report shaped like ghz's: count, total time,
//! requests/s, average, fastest, slowest, a 10-bucket histogram, the
//! latency distribution (here from an hdrhistogram, p10 … p99.9), the
//! status and error distributions. Text by default; JSON with ghz's field
//! names (`count`, `total`, `average`, `fastest`, `slowest`, `rps`,
//! `histogram`, `latencyDistribution`, `statusCodeDistribution`,
//! `errorDistribution`; durations in nanoseconds as Go encodes them),
//! plus kvpick's own fields in camelCase beside them.
//!
//! The latency is the pick's: first message sent (or, open loop, its
//! scheduled time) → the answer carrying the destination, over the
//! streams that got one. Full-stream time and open-loop schedule lag are
//! reported beside it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde_json::json;

use crate::driver::Outcome;

/// ghz's percentiles, and p99.9.
pub const PERCENTILES: [f64; 8] = [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9];
const HISTOGRAM_BUCKETS: usize = 10;
/// Nanoseconds, 1 ns to one hour, 3 significant figures.
const MAX_NANOS: u64 = 3_600_000_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NANOS, 3).expect("1 ns to 1 h at 3 significant figures is a valid range")
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// Every stream's outcome, counted.
pub struct Tally {
    pub count: u64,
    pub statuses: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
    pub destinations: BTreeMap<String, u64>,
    pub pick: Histogram<u64>,
    pub stream: Histogram<u64>,
    pub lag: Histogram<u64>,
    pick_sum: u128,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            count: 0,
            statuses: BTreeMap::new(),
            errors: BTreeMap::new(),
            destinations: BTreeMap::new(),
            pick: histogram(),
            stream: histogram(),
            lag: histogram(),
            pick_sum: 0,
        }
    }
}

impl Tally {
    pub fn add(&mut self, outcome: Outcome, lag: Option<Duration>) {
        self.count += 1;
        *self.statuses.entry(outcome.status).or_default() += 1;
        if let Some(error) = outcome.error {
            *self.errors.entry(error).or_default() += 1;
        }
        if let Some(destination) = outcome.destination {
            *self.destinations.entry(destination).or_default() += 1;
        }
        if let Some(pick) = outcome.pick {
            self.pick.saturating_record(nanos(pick));
            self.pick_sum += pick.as_nanos();
        }
        if let Some(stream) = outcome.stream {
            self.stream.saturating_record(nanos(stream));
        }
        if let Some(lag) = lag {
            self.lag.saturating_record(nanos(lag));
        }
    }

    pub fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }

    fn average(&self) -> u64 {
        let n = self.pick.len();
        if n == 0 { 0 } else { u64::try_from(self.pick_sum / u128::from(n)).unwrap_or(u64::MAX) }
    }

    fn fastest(&self) -> u64 {
        if self.pick.is_empty() { 0 } else { self.pick.min() }
    }

    fn slowest(&self) -> u64 {
        if self.pick.is_empty() { 0 } else { self.pick.max() }
    }

    /// ghz's histogram: marks evenly spaced from fastest to slowest, each
    /// counting the latencies above the previous mark and at most its own.
    fn buckets(&self) -> Vec<(u64, u64)> {
        if self.pick.is_empty() {
            return Vec::new();
        }
        let (low, high) = (self.fastest(), self.slowest());
        let step = (high - low) as f64 / HISTOGRAM_BUCKETS as f64;
        let mut marks: Vec<u64> = (0..HISTOGRAM_BUCKETS).map(|i| low + (step * i as f64) as u64).collect();
        marks.push(high);
        let mut counts = vec![0u64; marks.len()];
        for value in self.pick.iter_recorded() {
            // The histogram stores a value at its bucket's highest equivalent; clamp it.
            let v = value.value_iterated_to().min(high);
            let at = marks.iter().position(|&m| v <= m).unwrap_or(marks.len() - 1);
            counts[at] += value.count_at_value();
        }
        marks.into_iter().zip(counts).collect()
    }
}

/// How the run was set up, for the report.
pub struct RunInfo {
    pub host: String,
    pub call: &'static str,
    pub total: Option<u64>,
    pub concurrency: usize,
    pub connections: usize,
    pub connections_opened: u64,
    pub rps: Option<f64>,
    pub duration: Option<Duration>,
    pub timeout: Duration,
    pub data: Option<String>,
    pub pipeline: bool,
    pub request_body_bytes: usize,
    /// `normal` (the count was reached) or `timeout` (the duration ran out), as ghz says.
    pub end_reason: &'static str,
    /// Start of the first stream to the end of the last.
    pub total_time: Duration,
    pub date: String,
    /// What an in-process server counted, when there was one.
    pub server: Option<String>,
}

/// A duration for people: µs below a millisecond, ms below a second.
pub fn human(nanos: u64) -> String {
    let n = nanos as f64;
    if n < 1e6 {
        format!("{:.1} µs", n / 1e3)
    } else if n < 1e9 {
        format!("{:.2} ms", n / 1e6)
    } else {
        format!("{:.2} s", n / 1e9)
    }
}

fn rps(tally: &Tally, info: &RunInfo) -> f64 {
    let secs = info.total_time.as_secs_f64();
    if secs > 0.0 { tally.count as f64 / secs } else { 0.0 }
}

/// The ghz-style text summary.
pub fn text(tally: &Tally, info: &RunInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Summary:");
    let _ = writeln!(out, "  Count:\t{}", tally.count);
    let _ = writeln!(out, "  Total:\t{}", human(nanos(info.total_time)));
    let _ = writeln!(out, "  Slowest:\t{}", human(tally.slowest()));
    let _ = writeln!(out, "  Fastest:\t{}", human(tally.fastest()));
    let _ = writeln!(out, "  Average:\t{}", human(tally.average()));
    let _ = writeln!(out, "  Requests/sec:\t{:.2}", rps(tally, info));
    let _ = writeln!(
        out,
        "\nLatency: first message sent{} → pick received, over the {} streams with a pick.",
        if info.rps.is_some() { " (its scheduled time)" } else { "" },
        tally.pick.len()
    );
    let buckets = tally.buckets();
    if !buckets.is_empty() {
        let _ = writeln!(out, "\nResponse time histogram:");
        let widest = buckets.iter().map(|b| b.1).max().unwrap_or(1).max(1);
        for (mark, count) in &buckets {
            let bar = "∎".repeat(((*count as f64 / widest as f64) * 40.0).round() as usize);
            let _ = writeln!(out, "  {:>10} [{count}]\t|{bar}", human(*mark));
        }
        let _ = writeln!(out, "\nLatency distribution:");
        for p in PERCENTILES {
            let _ = writeln!(out, "  {p} % in {}", human(tally.pick.value_at_percentile(p)));
        }
    }
    if !tally.stream.is_empty() {
        let s = &tally.stream;
        let _ = writeln!(
            out,
            "\nFull stream (first message sent → stream closed): mean {}, p50 {}, p90 {}, p99 {}, p99.9 {}, slowest {}",
            human(s.mean() as u64),
            human(s.value_at_percentile(50.0)),
            human(s.value_at_percentile(90.0)),
            human(s.value_at_percentile(99.0)),
            human(s.value_at_percentile(99.9)),
            human(s.max()),
        );
    }
    if !tally.lag.is_empty() {
        let l = &tally.lag;
        let _ = writeln!(
            out,
            "Schedule lag (stream started after its scheduled time; counted in the latency): \
             p50 {}, p99 {}, max {}",
            human(l.value_at_percentile(50.0)),
            human(l.value_at_percentile(99.0)),
            human(l.max()),
        );
    }
    let _ = writeln!(out, "\nStatus code distribution:");
    for (status, n) in &tally.statuses {
        let _ = writeln!(out, "  [{status}]\t{n} responses");
    }
    if !tally.errors.is_empty() {
        let _ = writeln!(out, "\nError distribution:");
        for (error, n) in &tally.errors {
            let _ = writeln!(out, "  [{n}]\t{error}");
        }
    }
    if !tally.destinations.is_empty() {
        let _ = writeln!(out, "\nDestinations picked:");
        for (destination, n) in &tally.destinations {
            let _ = writeln!(out, "  [{destination}]\t{n}");
        }
    }
    let load = match info.rps {
        Some(rate) => format!("open loop at {rate} streams/s, at most {} at once", info.concurrency),
        None => format!("closed loop, {} streams at once", info.concurrency),
    };
    let _ = writeln!(
        out,
        "\nRun: {} {}; {load}; {} HTTP/2 connections asked, {} opened; {} B request body{}{}; ended: {}",
        info.host,
        info.call,
        info.connections,
        info.connections_opened,
        info.request_body_bytes,
        if info.pipeline { "; pipelined (whole stream sent up front)" } else { "" },
        info.data.as_deref().map(|d| format!("; messages from {d}")).unwrap_or_default(),
        info.end_reason,
    );
    if let Some(server) = &info.server {
        let _ = writeln!(out, "Server (in-process) counted: {server}");
    }
    out
}

fn distribution(h: &Histogram<u64>) -> serde_json::Value {
    if h.is_empty() {
        return json!([]);
    }
    json!(
        PERCENTILES.iter().map(|&p| json!({"percentage": p, "latency": h.value_at_percentile(p)})).collect::<Vec<_>>()
    )
}

/// The JSON report: ghz's field names where ghz has the field.
pub fn json(tally: &Tally, info: &RunInfo) -> serde_json::Value {
    let total = tally.pick.len().max(1) as f64;
    let histogram: Vec<_> = tally
        .buckets()
        .into_iter()
        .map(|(mark, count)| json!({"mark": mark as f64 / 1e9, "count": count, "frequency": count as f64 / total}))
        .collect();
    let mut options = json!({
        "host": info.host,
        "call": info.call,
        "insecure": true,
        "concurrency": info.concurrency,
        "connections": info.connections,
        "timeout": nanos(info.timeout),
    });
    if let Some(n) = info.total {
        options["total"] = json!(n);
    }
    if let Some(rate) = info.rps {
        options["rps"] = json!(rate);
    }
    if let Some(d) = info.duration {
        options["duration"] = json!(nanos(d));
    }
    if let Some(data) = &info.data {
        options["data-file"] = json!(data);
    }
    let mut report = json!({
        "endReason": info.end_reason,
        "options": options,
        "date": info.date,
        "count": tally.count,
        "total": nanos(info.total_time),
        "average": tally.average(),
        "fastest": tally.fastest(),
        "slowest": tally.slowest(),
        "rps": rps(tally, info),
        "errorDistribution": tally.errors,
        "statusCodeDistribution": tally.statuses,
        "latencyDistribution": distribution(&tally.pick),
        "histogram": histogram,
        // kvpick-load's own fields.
        "latencyMeasures": "first message sent (open loop: its scheduled time) -> pick received",
        "picks": tally.pick.len(),
        "streamLatencyDistribution": distribution(&tally.stream),
        "streamAverage": tally.stream.mean() as u64,
        "destinationDistribution": tally.destinations,
        "connectionsOpened": info.connections_opened,
        "pipeline": info.pipeline,
        "requestBodyBytes": info.request_body_bytes,
    });
    if !tally.lag.is_empty() {
        report["scheduleLagDistribution"] = distribution(&tally.lag);
        report["scheduleLagMax"] = json!(tally.lag.max());
    }
    if let Some(server) = &info.server {
        report["server"] = json!(server);
    }
    report
}

/// Now as RFC 3339 in UTC (what ghz's `date` holds).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let day = secs % 86_400;
    format!("{}T{:02}:{:02}:{:02}Z", kvpick_perf::report::utc_date(), day / 3_600, day % 3_600 / 60, day % 60)
}
