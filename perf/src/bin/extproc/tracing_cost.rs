//! `KVPICK_BENCH_TRACING=1`: what request tracing costs, on the same
//! round trips as the rest of this benchmark.
//!
//! Five servers over the same shard, workers and workload, measured in
//! interleaved rounds (each round in a rotated order, so drift and noise
//! hit every server alike):
//! - the null picker, for context;
//! - kvpick with tracing off, twice (A and B): identical servers, so the
//!   gap between them is this run's noise floor;
//! - kvpick tracing with a sampler that keeps nothing (ratio 0, no
//!   `traceparent` from the gateway): the cost of deciding, spans unbuilt;
//! - kvpick tracing every request to an OTLP collector stand-in on
//!   127.0.0.1 (its own runtime thread, not counted as kvpick's): spans
//!   built, batched by the SDK's exporter thread and sent over gRPC by the
//!   exporter's runtime thread (both counted), as in production.

use std::sync::Arc;

use kvpick_app::app::otlp::{TraceExport, TracingConfig};
use kvpick_ext_proc::{ExtProcMetrics, ExtProcServer};
use kvpick_perf::report::{self, Table, thousands};
use kvpick_router::{NullPicker, Picker};
use kvpick_test_support::otlp_collector::OtlpCollector;

use super::rounds::Sum;
use super::{BIN, Budget, CONCURRENCY, WORKERS, endpoint, machine_note, measure, micros, runtime, setup};

const SERVERS: [&str; 5] = [
    "null picker",
    "kvpick, tracing off (A)",
    "kvpick, tracing off (B)",
    "kvpick, tracing on, ratio 0",
    "kvpick, tracing on, ratio 1",
];
const OFF_A: usize = 1;
const OFF_B: usize = 2;
const SAMPLED_OUT: usize = 3;
const TRACED: usize = 4;

pub(super) fn run(budget: &Budget, rounds: usize) -> Result<String, String> {
    let load_before = report::load_average();
    let bench = setup()?;
    let collector_rt = runtime("otlp-collector")?;
    let collector = collector_rt.block_on(OtlpCollector::start_counting()).map_err(|e| format!("collector: {e}"))?;
    let config = |ratio| TracingConfig {
        endpoint: collector.endpoint(),
        service_name: "kvpick-bench".into(),
        sample_ratio: ratio,
    };
    let (traced_export, traced) = TraceExport::start(&config(1.0))?;
    let (sampled_out_export, sampled_out) = TraceExport::start(&config(0.0))?;
    let tracing = [None, None, None, Some(sampled_out), Some(traced)];
    let traced_metrics = Arc::new(ExtProcMetrics::new());
    let servers = bench.server_rt.block_on(async {
        let mut servers = Vec::new();
        for (i, tracing) in tracing.into_iter().enumerate() {
            let metrics = if i == TRACED { traced_metrics.clone() } else { Arc::new(ExtProcMetrics::new()) };
            let picker = if i == 0 {
                Picker::Null(NullPicker::new((0..WORKERS).map(endpoint).collect::<Vec<_>>()))
            } else {
                Picker::Kv(bench.kv_picker(metrics.clone()))
            };
            let mut server = ExtProcServer::new(super::Bench::server_config(), picker, metrics);
            if let Some(tracing) = tracing {
                server = server.with_tracing(tracing);
            }
            servers.push(server.spawn().await.map_err(|e| format!("server: {e}"))?);
        }
        Ok::<_, String>(servers)
    })?;

    let mut table = Table::new(
        format!("request tracing's cost: ext_proc round trips, {rounds} interleaved rounds per server"),
        &[
            "server",
            "concurrency",
            "requests/s",
            "p50 µs",
            "p99 µs",
            "server CPU µs/req",
            "of which exporter",
            "failed",
        ],
    );
    let mut notes = Vec::new();
    for concurrency in CONCURRENCY {
        let mut sums: Vec<Sum> = SERVERS.iter().map(|_| Sum::default()).collect();
        for round in 0..rounds {
            for k in 0..SERVERS.len() {
                let i = (k + round) % SERVERS.len();
                kvpick_perf::progress!(BIN, "concurrency {concurrency}, round {}: {}", round + 1, SERVERS[i]);
                let addr = servers[i].local_addr();
                let measured = bench.client_rt.block_on(measure(addr, concurrency, budget, &bench.bodies))?;
                sums[i].add(&measured, measured.exporter_cpu);
            }
        }
        for (name, sum) in SERVERS.iter().zip(&sums) {
            table.row([
                name.to_string(),
                concurrency.to_string(),
                thousands(sum.per_sec() as u64),
                micros(Sum::median(&sum.p50s)),
                micros(Sum::median(&sum.p99s)),
                format!("{:.1}", sum.cpu_micros()),
                format!("{:.1}", sum.micros_per_request(sum.side_cpu)),
                sum.failures.to_string(),
            ]);
        }
        let off = &sums[OFF_A];
        let vs_off = |s: &Sum| {
            format!(
                "{:+.1} µs CPU/req ({:.3}×), {:.3}× requests/s",
                s.cpu_micros() - off.cpu_micros(),
                s.cpu_micros() / off.cpu_micros().max(f64::MIN_POSITIVE),
                s.per_sec() / off.per_sec().max(f64::MIN_POSITIVE)
            )
        };
        notes.push(format!(
            "- concurrency {concurrency}, against tracing off (A): off (B) {}; ratio 0 {}; traced {}",
            vs_off(&sums[OFF_B]),
            vs_off(&sums[SAMPLED_OUT]),
            vs_off(&sums[TRACED])
        ));
    }
    bench.server_rt.block_on(traced_export.flush());
    bench.server_rt.block_on(sampled_out_export.flush());
    let traced_requests = traced_metrics.snapshot().requests(200);
    let spans = collector.span_count();
    let per_request = spans as f64 / (traced_requests.max(1) as f64);
    for note in notes {
        table.note(note);
    }
    table.note(format!(
        "- the collector received {} spans in {} exports for {} traced requests ({per_request:.2} per request; \
         a request makes 7 with one shard: request, parse, tokenize, hash, select, shard, booking — fewer \
         received means the exporter's queue dropped some)",
        thousands(spans as u64),
        collector.exports(),
        thousands(traced_requests)
    ));
    table.note(bench.setup_note());
    table.note(machine_note(&load_before, &report::load_average()));
    bench.server_rt.block_on(async {
        for server in servers {
            let _ = server.shutdown().await;
        }
        traced_export.shutdown().await;
        sampled_out_export.shutdown().await;
    });
    collector_rt.block_on(collector.shutdown());
    bench.shutdown();
    Ok(table.to_string())
}
