//! Determinism and sanity of the simulation on tiny fleets (debug builds
//! run these in well under a few seconds). No timing thresholds.

use super::args::{Args, PolicyName, WorkloadName};
use super::fleet::FleetConfig;
use super::workload::{Shape, synthetic};
use super::{engine_config, run_workload, trace};

fn small_args() -> Args {
    Args { requests: 150, engines: 3, kv_blocks: 2_048, seed: 7, ..Args::default() }
}

fn fleet(args: &Args) -> FleetConfig {
    FleetConfig { engines: args.engines, engine: engine_config(args), slow_engines: args.slow_engines }
}

#[test]
fn same_seed_same_results() {
    let args =
        Args { policies: vec![PolicyName::Kvpick, PolicyName::ApproxPrefix, PolicyName::Random], ..small_args() };
    let fleet = fleet(&args);
    let runs = || {
        let w = synthetic(Shape::Chat, args.requests, fleet.engines, &fleet.engine, args.load, args.seed);
        run_workload(w, &args, &fleet).runs.into_iter().map(|(_, r, s)| (r.records, s)).collect::<Vec<_>>()
    };
    assert_eq!(runs(), runs());
}

#[test]
fn cache_aware_policies_reuse_more_cache_than_round_robin_on_shared_prefixes() {
    let policies = vec![
        PolicyName::RoundRobin,
        PolicyName::Kvpick,
        PolicyName::ApproxPrefix,
        PolicyName::LlmdPrecise,
        PolicyName::SglangCacheAware,
        PolicyName::KvpickDynamoTuned,
        PolicyName::Oracle,
    ];
    let args = Args { policies, ..small_args() };
    let fleet = fleet(&args);
    let w = synthetic(Shape::Agentic, args.requests, fleet.engines, &fleet.engine, args.load, args.seed);
    let result = run_workload(w, &args, &fleet);
    let rr = result.runs[0].2.hit_rate;
    for (name, _, summary) in &result.runs[1..] {
        assert!(summary.hit_rate > rr, "{name:?} {} vs round-robin {rr}", summary.hit_rate);
    }
    for (name, run, summary) in &result.runs {
        assert!(summary.hit_rate <= result.bound + 1e-9, "{name:?} beats the bound");
        assert_eq!(summary.completed, run.records.len(), "{name:?} lost requests");
        assert!(!run.notes.iter().any(|n| n.contains("refused")), "{name:?}: {:?}", run.notes);
    }
}

#[test]
fn sample_trace_round_trips_and_bad_lines_name_their_line() {
    let text = trace::write_sample(50, 3);
    let records = trace::parse("sample", &text).expect("the generator writes valid lines");
    assert_eq!(records.len(), 50);
    let args = small_args();
    let w = trace::workload("sample", records, None, 2, &engine_config(&args), 0.8);
    assert_eq!(w.requests.len() + w.skipped, 50);
    let bad = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n{\"timestamp\": 1}\n";
    let err = trace::parse("t.jsonl", bad).expect_err("line 2 lacks fields").to_string();
    assert!(err.starts_with("t.jsonl:2:"), "{err}");
    assert!(trace::parse("t.jsonl", "not json").is_err());
}

#[test]
fn flags_parse() {
    let a = Args::parse(["--quick", "--workloads", "chat,trace", "--load=0.5"].map(String::from)).expect("valid flags");
    assert_eq!(a.requests, 2_000);
    assert_eq!(a.workloads, vec![WorkloadName::Chat, WorkloadName::Trace]);
    assert_eq!(a.out, None);
    assert!(Args::parse(["--policies", "magic"].map(String::from)).is_err());
    assert!(Args::parse(["--load", "-1"].map(String::from)).is_err());
}

#[test]
fn slow_engines_run_every_step_at_twice_the_cost() {
    let args = Args { slow_engines: 1, ..small_args() };
    let fleet = fleet(&args);
    let (slow, normal) = (fleet.engine_config(0).time, fleet.engine_config(1).time);
    assert_eq!(slow.step_ns(100, 4), 2 * normal.step_ns(100, 4));
    assert_eq!(normal, fleet.engine.time);
}
