//! Interleaved rounds of one server at one concurrency, summed: what the
//! tracing and tokenizer comparisons report per server.

use std::time::Duration;

use super::Measured;

#[derive(Default)]
pub(super) struct Sum {
    pub round_trips: u64,
    pub elapsed: Duration,
    /// The server's I/O runtime and shard threads.
    pub server_cpu: Duration,
    /// The comparison's other threads: the span exporter's, or the engine's.
    pub side_cpu: Duration,
    pub failures: u64,
    pub p50s: Vec<u64>,
    pub p99s: Vec<u64>,
}

impl Sum {
    pub fn add(&mut self, m: &Measured, side_cpu: Duration) {
        self.round_trips += m.round_trips;
        self.elapsed += m.elapsed;
        self.server_cpu += m.io_cpu + m.shard_cpu;
        self.side_cpu += side_cpu;
        self.failures += m.failures;
        self.p50s.push(m.latency.p50);
        self.p99s.push(m.latency.p99);
    }

    pub fn per_sec(&self) -> f64 {
        self.round_trips as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Server CPU per round trip, µs.
    pub fn cpu_micros(&self) -> f64 {
        self.micros_per_request(self.server_cpu)
    }

    pub fn micros_per_request(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1e6 / (self.round_trips.max(1) as f64)
    }

    /// The median round's value.
    pub fn median(values: &[u64]) -> u64 {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied().unwrap_or(0)
    }
}
