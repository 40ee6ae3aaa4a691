//! Cache-blind baselines: random, round-robin and least-loaded (fewest
//! requests in flight, as the router counts them: Envoy's LEAST_REQUEST).

use super::fleet::{Arrival, FleetView, Policy};

pub struct Random {
    rng: fastrand::Rng,
}

impl Random {
    pub fn new(seed: u64) -> Self {
        Random { rng: fastrand::Rng::with_seed(seed) }
    }
}

impl Policy for Random {
    fn route(&mut self, _: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        self.rng.usize(..fleet.len())
    }
}

#[derive(Default)]
pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    fn route(&mut self, _: &Arrival<'_>, fleet: &FleetView<'_>) -> usize {
        let k = self.next % fleet.len();
        self.next = k + 1;
        k
    }
}

pub struct LeastLoaded {
    in_flight: Vec<u32>,
    engine_of: Vec<usize>,
    rng: fastrand::Rng,
}

impl LeastLoaded {
    pub fn new(engines: usize, requests: usize, seed: u64) -> Self {
        LeastLoaded { in_flight: vec![0; engines], engine_of: vec![0; requests], rng: fastrand::Rng::with_seed(seed) }
    }
}

impl Policy for LeastLoaded {
    fn route(&mut self, arrival: &Arrival<'_>, _: &FleetView<'_>) -> usize {
        let k = argmin_random(self.in_flight.iter().map(|&n| f64::from(n)), &mut self.rng);
        self.in_flight[k] += 1;
        self.engine_of[arrival.id] = k;
        k
    }

    fn on_finished(&mut self, id: usize, _: u64) {
        let k = self.engine_of[id];
        self.in_flight[k] = self.in_flight[k].saturating_sub(1);
    }
}

/// Index of the smallest value, ties broken uniformly at random.
pub fn argmin_random(values: impl Iterator<Item = f64>, rng: &mut fastrand::Rng) -> usize {
    let (mut best, mut chosen, mut ties) = (f64::INFINITY, 0, 0);
    for (i, v) in values.enumerate() {
        if v < best {
            (best, chosen, ties) = (v, i, 1);
        } else if v == best {
            ties += 1;
            if rng.usize(..ties) == 0 {
                chosen = i;
            }
        }
    }
    chosen
}
