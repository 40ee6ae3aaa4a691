//! `kvpick-load`'s command line: what to drive, how hard, with what.
//!
//! Hand-written (no argument-parsing crate in the tree): `--name value`
//! and `--name=value`, counts with `k`/`M` suffixes, durations in Go's
//! notation (`500ms`, `10s`, `1m30s`) because ghz users write them so.

use std::path::PathBuf;
use std::time::Duration;

pub use kvpick_perf::args::ArgsError;
use kvpick_perf::args::Flags;

/// Which in-process server `--spawn` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpawnKind {
    /// kvpick's ext_proc server with the null picker (first endpoint).
    Null,
    /// kvpick's ext_proc server with the real `KvPicker` over a shard
    /// thread and the in-process word tokenizer.
    Kv,
    /// `Kv` with its shard run inline (`RuntimeKind::Inline`): no shard
    /// thread, the server's I/O thread runs each pick.
    KvInline,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// What the simulated model server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseKind {
    /// `text/event-stream`: token deltas, then a usage event and `[DONE]`.
    Sse,
    /// One `application/json` chat completion with `usage`.
    Json,
}

/// The body modes the gateway announces in `protocol_config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyMode {
    /// What GAIE gateways use: bodies streamed both ways, every chunk echoed.
    FullDuplex,
    /// Whole bodies in one message, answered without echo.
    Buffered,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// An ext_proc server to drive (`host:port`).
    pub addr: Option<String>,
    /// Or an in-process one started on 127.0.0.1:0.
    pub spawn: Option<SpawnKind>,
    /// Only serve (`--spawn`) for this long, for an outside client such as h2load.
    pub serve_for: Option<Duration>,
    pub connections: usize,
    /// Streams open at once (closed loop), or at most (open loop); `None`:
    /// [`CLOSED_LOOP_CONCURRENCY`] or [`OPEN_LOOP_CONCURRENCY`].
    pub concurrency: Option<usize>,
    /// Open loop: streams started per second on a fixed schedule.
    pub rps: Option<f64>,
    pub total: Option<u64>,
    pub duration: Option<Duration>,
    /// Per stream, from its start (or scheduled start) to its end.
    pub timeout: Duration,
    /// A ghz data file (JSON array of `ProcessingRequest`s): sent instead of the workload.
    pub data: Option<PathBuf>,
    pub prompt_tokens: usize,
    pub system_tokens: usize,
    pub system_prompts: usize,
    pub conversations: usize,
    pub turns: usize,
    pub bodies: usize,
    pub chunk_bytes: usize,
    pub response: ResponseKind,
    pub response_chunks: usize,
    pub mode: BodyMode,
    /// Send the whole stream without waiting for the pick (as ghz and h2load do).
    pub pipeline: bool,
    pub format: Format,
    /// `None`: on when stderr is a terminal.
    pub progress: Option<bool>,
    /// Client runtime threads.
    pub threads: usize,
    /// Workers behind `--spawn`.
    pub workers: usize,
    /// Write one stream's messages gRPC-framed (for h2load's `-d`) and exit.
    pub write_frames: Option<PathBuf>,
    /// Write one stream of the workload as a ghz data file and exit.
    pub write_data: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            addr: None,
            spawn: None,
            serve_for: None,
            connections: 1,
            concurrency: None,
            rps: None,
            total: None,
            duration: None,
            timeout: Duration::from_secs(20),
            data: None,
            prompt_tokens: 1_000,
            system_tokens: 600,
            system_prompts: 4,
            conversations: 64,
            turns: 3,
            bodies: 256,
            chunk_bytes: 16_384,
            response: ResponseKind::Sse,
            response_chunks: 2,
            mode: BodyMode::FullDuplex,
            pipeline: false,
            format: Format::Text,
            progress: None,
            threads: 1,
            workers: 8,
            write_frames: None,
            write_data: None,
        }
    }
}

pub const CLOSED_LOOP_CONCURRENCY: usize = 16;
/// Open loop: high enough that the schedule, not the cap, sets the load
/// (kvpick refuses more than 1,024 requests in flight by default anyway).
pub const OPEN_LOOP_CONCURRENCY: usize = 4_096;

/// Requests run when neither `--total` nor `--duration` is given (ghz's default).
pub const DEFAULT_TOTAL: u64 = 200;

pub const USAGE: &str = "\
usage: kvpick-load (--addr HOST:PORT | --spawn null|kv|kv-inline) [options]

Drives Envoy's ext_proc ExternalProcessor/Process bidi stream the way a
gateway does (GAIE Endpoint Picker Protocol) and reports like ghz.

server:
  --addr HOST:PORT        any ext_proc server (plaintext HTTP/2)
  --spawn null|kv|kv-inline
                          start kvpick's server in-process on 127.0.0.1:0
                          (null picker, or KvPicker + word tokenizer over a
                          shard thread, or over an inline shard)
  --workers N             workers behind --spawn (default 8)
  --serve-for DURATION    with --spawn: only serve that long and print the
                          address (for h2load or ghz), then the server's counts

load:
  -c, --concurrency N     streams at once (default 16); with --rps, at most
                          (default 4096)
      --connections N     HTTP/2 connections, streams spread over them (default 1)
      --rps R             open loop: R streams/s on a fixed schedule; latency
                          counts from the scheduled start
  -n, --total N           streams to run (default 200 unless --duration)
  -z, --duration D        run for D (10s, 1m30s); with --total, whichever first
  -t, --timeout D         per stream (default 20s)
      --threads N         client runtime threads (default 1)

messages:
  -D, --data FILE         ghz data file (JSON array of ProcessingRequest in
                          protobuf JSON), sent as is instead of the workload
      --prompt-tokens N   words per chat prompt (default 1000)
      --system-tokens N   of which the shared system prompt (default 600)
      --system-prompts N  distinct system prompts (default 4)
      --conversations N   distinct conversations (default 64)
      --turns N           earlier turns in each prompt (default 3)
      --bodies N          distinct request bodies cycled (default 256)
      --chunk-bytes N     request body chunk size (default 16384)
      --response sse|json model-server answer (default sse)
      --response-chunks N response body chunks (default 2)
      --mode full-duplex|buffered   body modes in protocol_config
      --pipeline          send the whole stream without waiting for the pick
                          (what ghz and h2load do)

output:
      --format text|json  (default text; json uses ghz's field names)
      --progress | --no-progress   (default: on when stderr is a terminal)
      --write-frames FILE write one stream gRPC-framed (for h2load -d), exit
      --write-data FILE   write the workload's first stream as a ghz data file, exit
";

impl Options {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options, ArgsError> {
        let mut out = Options::default();
        let mut flags = Flags::new(args);
        while let Some(flag) = flags.next_flag() {
            let name = &flag.name;
            let mut value = || flags.value(&flag);
            match name.as_str() {
                "-h" | "--help" => return Err(ArgsError::Help),
                "--addr" | "--host" => out.addr = Some(value()?),
                "--spawn" => {
                    out.spawn = Some(match value()?.as_str() {
                        "null" => SpawnKind::Null,
                        "kv" => SpawnKind::Kv,
                        "kv-inline" => SpawnKind::KvInline,
                        other => return Err(invalid(name, other, "null, kv or kv-inline")),
                    })
                }
                "--serve-for" => out.serve_for = Some(duration(name, &value()?)?),
                "--workers" => out.workers = count(name, &value()?)?,
                "-c" | "--concurrency" => out.concurrency = Some(count(name, &value()?)?),
                "--connections" => out.connections = count(name, &value()?)?,
                "--rps" => {
                    let text = value()?;
                    let rps = text.parse::<f64>().ok().filter(|r| r.is_finite() && *r > 0.0);
                    out.rps = Some(rps.ok_or_else(|| invalid(name, &text, "a rate above 0"))?);
                }
                "-n" | "--total" => out.total = Some(count(name, &value()?)? as u64),
                "-z" | "--duration" => out.duration = Some(duration(name, &value()?)?),
                "-t" | "--timeout" => out.timeout = duration(name, &value()?)?,
                "--threads" => out.threads = count(name, &value()?)?,
                "-D" | "--data" => out.data = Some(PathBuf::from(value()?)),
                "--prompt-tokens" => out.prompt_tokens = count(name, &value()?)?,
                "--system-tokens" => out.system_tokens = count_or_zero(name, &value()?)?,
                "--system-prompts" => out.system_prompts = count(name, &value()?)?,
                "--conversations" => out.conversations = count(name, &value()?)?,
                "--turns" => out.turns = count_or_zero(name, &value()?)?,
                "--bodies" => out.bodies = count(name, &value()?)?,
                "--chunk-bytes" => out.chunk_bytes = count(name, &value()?)?,
                "--response" => {
                    out.response = match value()?.as_str() {
                        "sse" => ResponseKind::Sse,
                        "json" => ResponseKind::Json,
                        other => return Err(invalid(name, other, "sse or json")),
                    }
                }
                "--response-chunks" => out.response_chunks = count(name, &value()?)?,
                "--mode" => {
                    out.mode = match value()?.as_str() {
                        "full-duplex" => BodyMode::FullDuplex,
                        "buffered" => BodyMode::Buffered,
                        other => return Err(invalid(name, other, "full-duplex or buffered")),
                    }
                }
                "--pipeline" => out.pipeline = true,
                "--format" | "-O" => {
                    out.format = match value()?.as_str() {
                        "text" | "summary" => Format::Text,
                        "json" => Format::Json,
                        other => return Err(invalid(name, other, "text or json")),
                    }
                }
                "--progress" => out.progress = Some(true),
                "--no-progress" => out.progress = Some(false),
                "--write-frames" => out.write_frames = Some(PathBuf::from(value()?)),
                "--write-data" => out.write_data = Some(PathBuf::from(value()?)),
                other => return Err(ArgsError::Invalid(format!("unknown flag {other}"))),
            }
        }
        out.check()?;
        Ok(out)
    }

    fn check(&self) -> Result<(), ArgsError> {
        let server = self.addr.is_some() as u8 + self.spawn.is_some() as u8;
        let writes = self.write_frames.is_some() || self.write_data.is_some();
        if !writes && server != 1 {
            return Err(ArgsError::Invalid("give exactly one of --addr HOST:PORT and --spawn null|kv".into()));
        }
        if self.serve_for.is_some() && self.spawn.is_none() {
            return Err(ArgsError::Invalid("--serve-for needs --spawn".into()));
        }
        if self.system_tokens >= self.prompt_tokens {
            return Err(ArgsError::Invalid(format!(
                "--system-tokens ({}) must be below --prompt-tokens ({})",
                self.system_tokens, self.prompt_tokens
            )));
        }
        if self.total == Some(0) {
            return Err(ArgsError::Invalid("--total must be at least 1".into()));
        }
        if let Some(addr) = &self.addr {
            if !addr.contains(':') {
                return Err(invalid("--addr", addr, "host:port"));
            }
        }
        Ok(())
    }

    /// `--total`, or ghz's default of 200 when no duration bounds the run.
    pub fn total(&self) -> Option<u64> {
        match (self.total, self.duration) {
            (None, None) => Some(DEFAULT_TOTAL),
            (total, _) => total,
        }
    }

    pub fn concurrency(&self) -> usize {
        match (self.concurrency, self.rps) {
            (Some(c), _) => c,
            (None, None) => CLOSED_LOOP_CONCURRENCY,
            (None, Some(_)) => OPEN_LOOP_CONCURRENCY,
        }
    }
}

fn invalid(name: &str, value: &str, allowed: &str) -> ArgsError {
    ArgsError::Invalid(format!("{name}: {value:?} is not valid, expected {allowed}"))
}

fn count_or_zero(name: &str, text: &str) -> Result<usize, ArgsError> {
    kvpick_perf::args::parse_count(text)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| invalid(name, text, "a count (1000, 10k, 1M)"))
}

fn count(name: &str, text: &str) -> Result<usize, ArgsError> {
    match count_or_zero(name, text)? {
        0 => Err(invalid(name, text, "a count of at least 1")),
        n => Ok(n),
    }
}

/// Go's duration notation: one or more `<number><unit>`, units `ns`, `us`,
/// `µs`, `ms`, `s`, `m`, `h` (`1m30s`, `1.5s`, `250ms`).
pub fn duration(name: &str, text: &str) -> Result<Duration, ArgsError> {
    let bad = || invalid(name, text, "a duration such as 500ms, 10s or 1m30s");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3_600.0,
            _ => return Err(bad()),
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}
