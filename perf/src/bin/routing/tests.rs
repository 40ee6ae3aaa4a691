//! Determinism and sanity of the simulation on tiny fleets (debug builds
//! run these in well under a few seconds). No timing thresholds.

use super::args::{Args, PolicyName, WorkloadName};
use super::fleet::FleetConfig;
use super::workload::{Shape, synthetic};
use super::{engine_config, fleet_config, run_workload, trace};

fn small_args() -> Args {
    Args { requests: 150, engines: 3, kv_blocks: 2_048, seed: 7, ..Args::default() }
}

fn fleet(args: &Args) -> FleetConfig {
    fleet_config(args)
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

#[test]
fn closed_loop_clients_send_each_request_after_the_one_before_finishes() {
    let args = Args { policies: vec![PolicyName::Kvpick], requests: 60, ..small_args() };
    let fleet = fleet(&args);
    let open = synthetic(Shape::Chat, args.requests, fleet.engines, &fleet.engine, args.load, args.seed);
    let closed = super::workload::closed_loop(open, 4);
    let firsts = closed.requests.iter().filter(|r| r.follows.is_none()).count();
    assert_eq!(firsts, 4, "one unchained request per client");
    let result = run_workload(closed.clone(), &args, &fleet);
    let records = &result.runs[0].1.records;
    assert_eq!(result.runs[0].2.completed, records.len());
    for (i, r) in closed.requests.iter().enumerate() {
        if let Some((previous, think)) = r.follows {
            let done = records[previous].finished_ns.expect("finished");
            assert_eq!(records[i].arrival_ns, done + think, "request {i}");
        }
    }
}

#[test]
fn goodput_counts_only_requests_within_the_slo() {
    let args = Args { policies: vec![PolicyName::RoundRobin], ..small_args() };
    let fleet = fleet(&args);
    let w = synthetic(Shape::Random, args.requests, fleet.engines, &fleet.engine, 1.5, args.seed);
    let result = run_workload(w, &args, &fleet);
    let run = &result.runs[0].1;
    let strict = super::summary::summarise(run, 1.0);
    let lax = super::summary::summarise(run, 1e12);
    assert!(strict.goodput_per_s < lax.goodput_per_s, "{} vs {}", strict.goodput_per_s, lax.goodput_per_s);
    assert_eq!(lax.goodput_per_s, lax.requests_per_s);
}

#[test]
fn disaggregated_fleets_split_prefill_and_decode_by_role() {
    let args = Args::parse(
        ["--pd", "1+2", "--requests", "120", "--kv-blocks", "2048", "--seed", "7", "--no-write"].map(String::from),
    )
    .expect("valid flags");
    assert_eq!(args.engines, 3);
    assert_eq!(args.policies, PolicyName::PD.to_vec());
    let fleet = fleet(&args);
    let w = synthetic(Shape::Agentic, args.requests, fleet.engines, &fleet.engine, args.load, args.seed);
    let result = run_workload(w, &args, &fleet);
    for (name, run, summary) in &result.runs {
        assert_eq!(summary.completed + summary.rejected, run.records.len(), "{}: every request ends", name.as_str());
        for r in &run.records {
            if let Some(p) = r.prefill_engine {
                assert!(p < 1 && r.engine >= 1, "{}: prefill on {p}, decode on {}", name.as_str(), r.engine);
            }
        }
        let split = run.records.iter().filter(|r| r.prefill_engine.is_some()).count();
        match name {
            PolicyName::Kvpick => assert_eq!(split, 0, "aggregated"),
            PolicyName::RandomPd => assert_eq!(split, run.records.len(), "always split"),
            _ => assert!(split > 0, "{}: long agentic prompts are split", name.as_str()),
        }
    }
    let again = run_workload(
        synthetic(Shape::Agentic, args.requests, fleet.engines, &fleet.engine, args.load, args.seed),
        &args,
        &fleet,
    );
    let records = |r: &super::WorkloadResult| r.runs.iter().map(|(_, run, _)| run.records.clone()).collect::<Vec<_>>();
    assert_eq!(records(&result), records(&again), "deterministic");
    assert!(Args::parse(["--policies", "kvpick-pd"].map(String::from)).is_err(), "P/D policies need --pd");
}

#[test]
fn replicas_share_every_booking_change_and_unshared_ones_none() {
    let policies = PolicyName::REPLICAS.to_vec();
    let args = Args { policies, ..small_args() };
    let fleet = fleet(&args);
    let w = synthetic(Shape::Chat, args.requests, fleet.engines, &fleet.engine, args.load, args.seed);
    let result = run_workload(w, &args, &fleet);
    for (name, run, summary) in &result.runs {
        assert_eq!(summary.completed, run.records.len(), "{name:?} lost requests");
        let note = run.notes.iter().find(|n| n.starts_with("kvpick ×")).expect("the replicas' note");
        assert!(!note.contains("refused"), "{name:?}: {note}");
        let changes: u64 =
            note.split(": ").nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
        let shared = matches!(name, PolicyName::KvpickX2 | PolicyName::KvpickX4);
        let peers = if matches!(name, PolicyName::KvpickX2 | PolicyName::KvpickX2Unshared) { 1 } else { 3 };
        // Shared: every request's reserve, prefill end and free reaches
        // every peer (the last few may still be on the wire at the end).
        if shared {
            let every = 3 * run.records.len() as u64 * peers;
            assert!(changes <= every && changes + 3 * 4 * peers >= every, "{name:?}: {changes} of {every}");
        } else {
            assert_eq!(changes, 0, "{name:?}");
        }
    }
}

#[test]
fn a_warm_joiner_routes_like_its_peer_at_once_and_a_cold_one_does_not() {
    let policies = PolicyName::JOINS.to_vec();
    let args = Args { policies, requests: 2_000, ..small_args() };
    let fleet = fleet(&args);
    let w = synthetic(Shape::Chat, args.requests, fleet.engines, &fleet.engine, args.load, args.seed);
    let join_at = super::join_at_ns(&w.requests, &args);
    let result = run_workload(w, &args, &fleet);
    // The first 20 s after the join, as one window per side.
    let first = |name: PolicyName| {
        let (_, run, summary) = result.runs.iter().find(|(n, ..)| *n == name).expect("ran");
        assert_eq!(summary.completed, run.records.len(), "{name:?} lost requests");
        let joined = run.joined.as_ref().expect("a replica joined");
        assert_eq!(joined.at_ns, join_at);
        assert!(!joined.requests.is_empty(), "{name:?}: the joiner picked nothing");
        assert!(
            joined.requests.iter().all(|&id| run.records[id].arrival_ns >= join_at),
            "{name:?}: the joiner picked before it joined"
        );
        let note = run.notes.iter().find(|n| n.starts_with("kvpick ×")).expect("the replicas' note");
        assert!(!note.contains("refused"), "{name:?}: {note}");
        super::ramp::windows(run, joined, 20_000_000_000)[0]
    };
    let (warm, warm_other) = first(PolicyName::KvpickX2JoinWarm);
    let (cold, cold_other) = first(PolicyName::KvpickX2JoinCold);
    assert!(warm.requests > 0 && cold.requests > 0 && warm_other.requests > 0 && cold_other.requests > 0);
    // Warm: as good as the replica that was there all along; cold: blind
    // to everything stored before it joined.
    assert!(warm.hit_rate >= 0.95 * warm_other.hit_rate, "warm {warm:?} against {warm_other:?}");
    assert!(cold.hit_rate < 0.9 * cold_other.hit_rate, "cold {cold:?} against {cold_other:?}");
    assert!(warm.hit_rate > cold.hit_rate + 0.05, "warm {warm:?} against cold {cold:?}");
}
