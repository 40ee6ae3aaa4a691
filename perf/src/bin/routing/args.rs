//! The simulator's flags.

use std::path::PathBuf;

pub use kvpick_perf::args::ArgsError;
use kvpick_perf::args::Flags;

pub const USAGE: &str = "usage: kvpick-bench-routing [flags]

  --quick               2,000 requests per workload, nothing written (smoke test)
  --requests N          requests per synthetic workload (default 10,000); caps the trace when given
  --engines N           simulated engines (default 8)
  --slow-engines N      the first N engines run at half speed (default 0)
  --load F              offered load, a fraction of the fleet's capacity with nothing cached (default 0.8)
  --sweep LIST          a saturation sweep over these loads (e.g. 0.5,0.8,1,1.2,1.5): goodput, output
                        tokens/s and TTFT p90 per policy and load, and a goodput plot per workload
  --event-delay-ms F    how long KV events take from an engine to the router (default 1)
  --ttft-slo-ms F       the TTFT a request must meet to count towards goodput (default 1000)
  --tpot-target-ms F    kvpick's TPOT guard (kvpick serve --tpot-target-ms; default: none)
  --clients N           closed loop: N clients each send a session's requests one after the other,
                        each once the previous has finished (plus its think time), sessions back to back
  --kv-blocks N         KV blocks of 16 tokens per engine (default 16,384)
  --seed N              seed of the workloads, engines and policies (default 42)
  --workloads LIST      of chat, agentic, random, shared-prefix, trace (default: all)
  --policies LIST       of random, round-robin, least-loaded, approx-prefix, llm-d-precise,
                        sglang-cache-aware, kvpick, kvpick-dynamo, kvpick-dynamo-tuned,
                        kvpick-skewed-priors, oracle (default: all of these), and with --pd
                        kvpick-pd, llm-d-pd, random-pd; kvpick-x2, kvpick-x4: kvpick as 2 or 4
                        replicas behind a round-robin gateway, sharing bookings, and
                        kvpick-x2-unshared, kvpick-x4-unshared: the same without sharing;
                        kvpick-x2-join-warm, kvpick-x2-join-cold: 2 sharing replicas, the second
                        starting at --join-at-s with its peer's KV index or with none
  --peer-delay-ms F     the kvpick-x2/x4 replicas' booking changes reach their peers this late (default 1)
  --join-at-s F         when the joining replica starts, in seconds of the run (default: halfway
                        through the workload's arrivals)
  --ramp-window-s F     the joining replica's hit rate is reported over windows this long (default 2)
  --prefill-load-scale F  kvpick-dynamo's and the oracle's prefill_load_scale (default 1, Dynamo's default)
  --pd P+D              a disaggregated fleet: P prefill engines, then D decode engines (e.g. 2+6); the
                        policies default to kvpick (aggregated, on all P+D engines), kvpick-pd, llm-d-pd
                        and random-pd
  --pd-threshold-tokens N  kvpick-pd's decider (kvpick serve --pd-threshold-tokens; default 256)
  --pd-compare-ttft BOOL  kvpick-pd keeps a request whole when its decode worker is predicted to give the
                        first token sooner than the prefill worker (kvpick serve's; default true)
  --prefill-queue-threshold F  kvpick-pd keeps requests whole while every prefill engine has more than
                        F × max_num_batched_tokens of prefill booked (kvpick serve's; default 2)
  --kv-transfer-ms F    a split request's KV transfer, fixed part (default 2)
  --kv-transfer-us-per-block F  and per block the decode engine lacks (default 80: 2 MiB blocks of a
                        Llama-3-8B-class model at 25 GB/s)
  --trace FILE          Mooncake-format JSONL trace (default perf/data/mooncake-sample.jsonl)
  --out DIR             write results.md and SVG plots there (full runs default to perf/results/routing)
  --no-write            write nothing
  --write-sample-trace FILE [--sample-lines N]
                        write a generated Mooncake-format trace (default 1,000 lines) and exit
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyName {
    Random,
    RoundRobin,
    LeastLoaded,
    ApproxPrefix,
    /// llm-d's precise-prefix-cache profile.
    LlmdPrecise,
    /// SGLang's gateway, cache-aware policy.
    SglangCacheAware,
    /// kvpick as `kvpick serve` runs by default: the latency cost with its
    /// default priors.
    Kvpick,
    /// kvpick with `--cost dynamo` (Dynamo's formula).
    KvpickDynamo,
    /// Dynamo's formula with `prefill_load_scale` 32, the best value of
    /// Dynamo's own published sweep.
    KvpickDynamoTuned,
    /// The latency cost with priors 4× wrong in their ratios.
    KvpickSkewedPriors,
    Oracle,
    /// kvpick's two selectors and decider on a disaggregated fleet.
    KvpickPd,
    /// llm-d's decode-first P/D profile handler with its prefix decider.
    LlmdPd,
    /// Every request split, both engines at random.
    RandomPd,
    /// kvpick as replicas behind a round-robin gateway (`replicas.rs`).
    KvpickX2,
    KvpickX2Unshared,
    KvpickX4,
    KvpickX4Unshared,
    /// Two sharing replicas, the second joining mid-run with its peer's
    /// KV index (warm start) or with none.
    KvpickX2JoinWarm,
    KvpickX2JoinCold,
}

impl PolicyName {
    /// The policies of a disaggregated fleet's run by default.
    pub const PD: [PolicyName; 4] =
        [PolicyName::Kvpick, PolicyName::KvpickPd, PolicyName::LlmdPd, PolicyName::RandomPd];

    /// Every name `--policies` knows: the aggregated ones, then the
    /// disaggregated fleets' own.
    pub const ALL: [PolicyName; 20] = {
        let mut all = [PolicyName::Random; 20];
        let mut i = 0;
        while i < Self::AGGREGATED.len() {
            all[i] = Self::AGGREGATED[i];
            i += 1;
        }
        all[11] = PolicyName::KvpickPd;
        all[12] = PolicyName::LlmdPd;
        all[13] = PolicyName::RandomPd;
        let mut j = 0;
        while j < Self::REPLICAS.len() {
            all[14 + j] = Self::REPLICAS[j];
            j += 1;
        }
        all[18] = Self::JOINS[0];
        all[19] = Self::JOINS[1];
        all
    };

    /// kvpick as 2 and 4 replicas behind a round-robin gateway, sharing
    /// bookings and not (`--policies` only; compare with `kvpick`).
    pub const REPLICAS: [PolicyName; 4] =
        [PolicyName::KvpickX2, PolicyName::KvpickX2Unshared, PolicyName::KvpickX4, PolicyName::KvpickX4Unshared];

    /// Two sharing replicas, the second joining mid-run warm or cold
    /// (`--policies` only).
    pub const JOINS: [PolicyName; 2] = [PolicyName::KvpickX2JoinWarm, PolicyName::KvpickX2JoinCold];

    /// The policies of an aggregated fleet's run by default.
    pub const AGGREGATED: [PolicyName; 11] = [
        PolicyName::Random,
        PolicyName::RoundRobin,
        PolicyName::LeastLoaded,
        PolicyName::ApproxPrefix,
        PolicyName::LlmdPrecise,
        PolicyName::SglangCacheAware,
        PolicyName::Kvpick,
        PolicyName::KvpickDynamo,
        PolicyName::KvpickDynamoTuned,
        PolicyName::KvpickSkewedPriors,
        PolicyName::Oracle,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Random => "random",
            PolicyName::RoundRobin => "round-robin",
            PolicyName::LeastLoaded => "least-loaded",
            PolicyName::ApproxPrefix => "approx-prefix",
            PolicyName::LlmdPrecise => "llm-d-precise",
            PolicyName::SglangCacheAware => "sglang-cache-aware",
            PolicyName::KvpickDynamoTuned => "kvpick-dynamo-tuned",
            PolicyName::Kvpick => "kvpick",
            PolicyName::KvpickDynamo => "kvpick-dynamo",
            PolicyName::KvpickSkewedPriors => "kvpick-skewed-priors",
            PolicyName::Oracle => "oracle",
            PolicyName::KvpickPd => "kvpick-pd",
            PolicyName::LlmdPd => "llm-d-pd",
            PolicyName::RandomPd => "random-pd",
            PolicyName::KvpickX2 => "kvpick-x2",
            PolicyName::KvpickX2Unshared => "kvpick-x2-unshared",
            PolicyName::KvpickX4 => "kvpick-x4",
            PolicyName::KvpickX4Unshared => "kvpick-x4-unshared",
            PolicyName::KvpickX2JoinWarm => "kvpick-x2-join-warm",
            PolicyName::KvpickX2JoinCold => "kvpick-x2-join-cold",
        }
    }

    /// Whether it needs a disaggregated fleet.
    pub fn needs_roles(self) -> bool {
        matches!(self, PolicyName::KvpickPd | PolicyName::LlmdPd | PolicyName::RandomPd)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadName {
    Chat,
    Agentic,
    Random,
    SharedPrefix,
    Trace,
}

impl WorkloadName {
    pub const ALL: [WorkloadName; 5] = [
        WorkloadName::Chat,
        WorkloadName::Agentic,
        WorkloadName::Random,
        WorkloadName::SharedPrefix,
        WorkloadName::Trace,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadName::Chat => "chat",
            WorkloadName::Agentic => "agentic",
            WorkloadName::Random => "random",
            WorkloadName::SharedPrefix => "shared-prefix",
            WorkloadName::Trace => "trace",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    pub quick: bool,
    pub requests: usize,
    /// `--requests` was given (it then also caps the trace).
    pub requests_given: bool,
    pub engines: usize,
    pub slow_engines: usize,
    pub load: f64,
    pub kv_blocks: usize,
    pub seed: u64,
    pub prefill_load_scale: f64,
    pub workloads: Vec<WorkloadName>,
    pub policies: Vec<PolicyName>,
    pub trace: PathBuf,
    pub out: Option<PathBuf>,
    pub write_sample_trace: Option<PathBuf>,
    pub sample_lines: usize,
    /// Loads of a saturation sweep (empty: one run at `load`).
    pub sweep: Vec<f64>,
    /// The TTFT a request must meet to count towards goodput.
    pub ttft_slo_ms: f64,
    /// kvpick's TPOT guard, in ms.
    pub tpot_target_ms: Option<f64>,
    /// Closed-loop clients (0: open loop, Poisson session starts).
    pub clients: usize,
    /// How long KV events take from an engine to the router.
    pub event_delay_ms: f64,
    /// How long a replica's booking change takes to reach its peers.
    pub peer_delay_ms: f64,
    /// When the joining replica starts (None: halfway through the arrivals).
    pub join_at_s: Option<f64>,
    /// The ramp report's window.
    pub ramp_window_s: f64,
    /// A disaggregated fleet's roles.
    pub pd: Option<super::pd::Roles>,
    pub pd_threshold_tokens: u32,
    pub pd_compare_ttft: bool,
    pub prefill_queue_threshold: Option<f64>,
    pub kv_transfer_ms: f64,
    pub kv_transfer_us_per_block: f64,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            quick: false,
            requests: 10_000,
            requests_given: false,
            engines: 8,
            slow_engines: 0,
            load: 0.8,
            kv_blocks: 16_384,
            seed: 42,
            prefill_load_scale: kvpick_core::RouterConfig::default().prefill_load_scale,
            workloads: WorkloadName::ALL.to_vec(),
            policies: PolicyName::AGGREGATED.to_vec(),
            trace: super::crate_dir().join("data/mooncake-sample.jsonl"),
            out: None,
            write_sample_trace: None,
            sample_lines: 1_000,
            sweep: Vec::new(),
            ttft_slo_ms: 1_000.0,
            tpot_target_ms: None,
            clients: 0,
            event_delay_ms: 1.0,
            peer_delay_ms: 1.0,
            join_at_s: None,
            ramp_window_s: 2.0,
            pd: None,
            pd_threshold_tokens: kvpick_router::DisaggConfig::default().threshold_tokens,
            pd_compare_ttft: kvpick_router::DisaggConfig::default().compare_ttft,
            prefill_queue_threshold: Some(kvpick_router::DEFAULT_PREFILL_QUEUE_THRESHOLD),
            kv_transfer_ms: 2.0,
            kv_transfer_us_per_block: 80.0,
        }
    }
}

fn invalid(text: String) -> ArgsError {
    ArgsError::Invalid(text)
}

impl Args {
    /// Parses flags (without the program name); `--name value` and
    /// `--name=value` both work.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, ArgsError> {
        let mut out = Args::default();
        let (mut out_dir, mut no_write) = (None, false);
        let (mut engines_given, mut policies_given) = (false, false);
        let mut flags = Flags::new(args);
        while let Some(flag) = flags.next_flag() {
            let name = &flag.name;
            let mut value = || flags.value(&flag);
            match name.as_str() {
                "-h" | "--help" => return Err(ArgsError::Help),
                "--quick" => out.quick = true,
                "--requests" => {
                    out.requests = count(name, &value()?)?;
                    out.requests_given = true;
                }
                "--engines" => {
                    out.engines = count(name, &value()?)?;
                    engines_given = true;
                }
                "--pd" => {
                    let text = value()?;
                    let roles = text
                        .split_once('+')
                        .and_then(|(p, d)| Some((p.trim().parse::<usize>().ok()?, d.trim().parse::<usize>().ok()?)))
                        .filter(|(p, d)| *p > 0 && *d > 0)
                        .ok_or_else(|| invalid(format!("{name}: {text:?} is not P+D, e.g. 2+6")))?;
                    out.pd = Some(super::pd::Roles { prefill: roles.0, decode: roles.1 });
                }
                "--pd-threshold-tokens" => {
                    let text = value()?;
                    out.pd_threshold_tokens =
                        text.parse().map_err(|_| invalid(format!("{name}: {text:?} is not a whole number")))?;
                }
                "--kv-transfer-ms" => out.kv_transfer_ms = non_negative(name, &value()?)?,
                "--pd-compare-ttft" => {
                    let text = value()?;
                    out.pd_compare_ttft = match text.as_str() {
                        "true" | "on" => true,
                        "false" | "off" => false,
                        _ => return Err(invalid(format!("{name}: {text:?} is not true or false"))),
                    };
                }
                "--prefill-queue-threshold" => out.prefill_queue_threshold = Some(non_negative(name, &value()?)?),
                "--kv-transfer-us-per-block" => out.kv_transfer_us_per_block = non_negative(name, &value()?)?,
                "--slow-engines" => {
                    let text = value()?;
                    out.slow_engines =
                        text.parse().map_err(|_| invalid(format!("{name}: {text:?} is not a whole number")))?;
                }
                "--kv-blocks" => out.kv_blocks = count(name, &value()?)?,
                "--sample-lines" => out.sample_lines = count(name, &value()?)?,
                "--seed" => out.seed = count(name, &value()?)? as u64,
                "--load" => out.load = positive(name, &value()?)?,
                "--sweep" => {
                    out.sweep = value()?.split(',').map(|v| positive(name, v.trim())).collect::<Result<_, _>>()?
                }
                "--ttft-slo-ms" => out.ttft_slo_ms = positive(name, &value()?)?,
                "--tpot-target-ms" => out.tpot_target_ms = Some(positive(name, &value()?)?),
                "--clients" => out.clients = count(name, &value()?)?,
                "--event-delay-ms" => out.event_delay_ms = non_negative(name, &value()?)?,
                "--peer-delay-ms" => out.peer_delay_ms = non_negative(name, &value()?)?,
                "--join-at-s" => out.join_at_s = Some(non_negative(name, &value()?)?),
                "--ramp-window-s" => out.ramp_window_s = positive(name, &value()?)?,
                "--prefill-load-scale" => out.prefill_load_scale = positive(name, &value()?)?,
                "--workloads" => out.workloads = list(name, &value()?, &WorkloadName::ALL, |w| w.as_str())?,
                "--policies" => {
                    out.policies = list(name, &value()?, &PolicyName::ALL, |p| p.as_str())?;
                    policies_given = true;
                }
                "--trace" => out.trace = PathBuf::from(value()?),
                "--out" => out_dir = Some(PathBuf::from(value()?)),
                "--no-write" => no_write = true,
                "--write-sample-trace" => out.write_sample_trace = Some(PathBuf::from(value()?)),
                // `cargo bench` passes this to every bench binary.
                "--bench" => {}
                other => return Err(invalid(format!("unknown flag {other}"))),
            }
        }
        if out.quick && !out.requests_given {
            out.requests = 2_000;
        }
        match out.pd {
            Some(roles) => {
                let engines = roles.prefill + roles.decode;
                if engines_given && out.engines != engines {
                    return Err(invalid(format!("--engines {} differs from --pd's {engines}", out.engines)));
                }
                out.engines = engines;
                if !policies_given {
                    out.policies = PolicyName::PD.to_vec();
                }
            }
            None => {
                if let Some(p) = out.policies.iter().find(|p| p.needs_roles()) {
                    return Err(invalid(format!("{} needs a disaggregated fleet: --pd P+D", p.as_str())));
                }
            }
        }
        out.out = match (no_write, out_dir) {
            (true, _) => None,
            (false, Some(dir)) => Some(dir),
            (false, None) if !out.quick => Some(super::crate_dir().join("results/routing")),
            (false, None) => None,
        };
        Ok(out)
    }
}

fn non_negative(name: &str, text: &str) -> Result<f64, ArgsError> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| invalid(format!("{name}: {text:?} is not a number ≥ 0")))
}

fn positive(name: &str, text: &str) -> Result<f64, ArgsError> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| invalid(format!("{name}: {text:?} is not a positive number")))
}

/// A positive count, `_` separators and a `k` suffix allowed.
fn count(name: &str, text: &str) -> Result<usize, ArgsError> {
    let clean = text.replace('_', "");
    let (digits, scale) = match clean.strip_suffix(['k', 'K']) {
        Some(d) => (d, 1_000),
        None => (clean.as_str(), 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|n| *n > 0)
        .ok_or_else(|| invalid(format!("{name}: {text:?} is not a positive count")))
}

fn list<T: Copy>(name: &str, text: &str, all: &[T], label: fn(T) -> &'static str) -> Result<Vec<T>, ArgsError> {
    let picked = text
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            all.iter().copied().find(|t| label(*t) == s).ok_or_else(|| {
                let names: Vec<&str> = all.iter().map(|t| label(*t)).collect();
                invalid(format!("{name}: unknown {s:?} (one of {})", names.join(", ")))
            })
        })
        .collect::<Result<Vec<T>, ArgsError>>()?;
    if picked.is_empty() {
        return Err(invalid(format!("{name} needs at least one name")));
    }
    Ok(picked)
}
