//! `/metrics` in Prometheus text format, with vLLM's metric names and
//! labels (`model_name`, `engine`; engines.md §2).
//!
//! Counters are exposed the way vLLM's `prometheus_client` exposes them:
//! declared as `vllm:prefix_cache_queries`, sampled as
//! `vllm:prefix_cache_queries_total`.

use std::fmt::Write;

use super::config::EngineConfig;
use super::engine_loop::EngineStats;
use super::pd::PdCounters;

/// The whole `/metrics` page.
pub(crate) fn render(cfg: &EngineConfig, stats: &EngineStats, pd: &PdCounters) -> String {
    let labels = format!("engine=\"{}\",model_name=\"{}\"", cfg.dp_rank, escape(&cfg.model));
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {value:?}");
    };
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", stats.running as f64);
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.waiting as f64);
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage);
    let c = &stats.counters;
    let mut counter = |name: &str, help: &str, value: u64| {
        let _ =
            writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name}_total{{{labels}}} {:?}", value as f64);
    };
    counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        c.prefix_cache_queries,
    );
    counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", c.prefix_cache_hits);
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens);
    counter("vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens);
    counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", c.preemptions);
    // The sim's own P/D numbers, for leak checks (no engine exports these
    // names): holds and their blocks now, pulls by result, holds ended by
    // reason.
    let _ = writeln!(
        out,
        "# HELP sim:kv_transfers_held Finished prefills holding KV blocks for a transfer.\n\
         # TYPE sim:kv_transfers_held gauge\nsim:kv_transfers_held{{{labels}}} {:?}\n\
         # HELP sim:kv_blocks_held_for_transfer KV blocks held for transfers.\n\
         # TYPE sim:kv_blocks_held_for_transfer gauge\nsim:kv_blocks_held_for_transfer{{{labels}}} {:?}",
        stats.held_transfers as f64, stats.held_blocks as f64
    );
    let _ = writeln!(out, "# HELP sim:kv_transfers KV pulls of this (decode) engine, by result.");
    let _ = writeln!(out, "# TYPE sim:kv_transfers counter");
    for (result, n) in pd.transfers() {
        let _ = writeln!(out, "sim:kv_transfers_total{{{labels},result=\"{result}\"}} {:?}", n as f64);
    }
    let _ = writeln!(out, "# HELP sim:kv_holds_released Holds of this (prefill) engine ended, by reason.");
    let _ = writeln!(out, "# TYPE sim:kv_holds_released counter");
    for (reason, n) in pd.releases() {
        let _ = writeln!(out, "sim:kv_holds_released_total{{{labels},reason=\"{reason}\"}} {:?}", n as f64);
    }
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",engine=\"{}\",num_gpu_blocks=\"{}\"}} 1.0",
        cfg.block_size, cfg.dp_rank, cfg.num_blocks
    );
    out
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
