//! How fast each worker really is, learned from the times to first token
//! the router observes, so the latency cost stops assuming a uniform fleet.
//!
//! Every sample pairs the TTFT the priors predicted when the request was
//! booked (`EngineRates`, the worker's load then) with the TTFT measured
//! from the booking to the first streamed chunk. A worker's *scale* is the
//! least-squares slope of measured on predicted through the origin, with
//! old samples forgotten geometrically; the fleet's scale is the lower
//! median of the workers' scales (a slow minority does not move it; with
//! two workers it is the faster one's). Only a worker's scale *relative to
//! the fleet's* reaches the cost, because a uniform error in the priors (a
//! faster GPU, a time-scaled simulator, network delay) changes no ranking,
//! while a worker slower than its peers should get less work.
//!
//! Robustness, because these are noisy wall-clock samples:
//! - weighted by predicted², so short requests (whose TTFT is mostly step
//!   overhead, scheduling jitter and network) barely move a fit, and long
//!   prefills (which measure the engine's speed) dominate it;
//! - each sample's ratio is clipped to `clip`× the pooled fit's, so one stall
//!   or one clock hiccup cannot drag a fit;
//! - a worker's speed stays 1 until it has about five samples, and its
//!   fit is shrunk towards the fleet's by `prior_samples`
//!   pseudo-samples of the fleet's typical size, and a relative speed
//!   inside `dead_band`, or within two standard errors of the fleet's,
//!   counts as exactly the fleet's: noise among equal engines must never
//!   outweigh a cache hit (conversations would hop);
//! - fits with no sample for `stale_after` are forgotten (a replaced node,
//!   a recovered straggler).
//!
//! Decode speed (ns per output token after the first) is tracked per worker
//! as a moving average, for metrics and for whoever sizes the fleet.

use std::collections::HashMap;
use std::time::Duration;

use rustc_hash::FxBuildHasher;

use crate::clock::Millis;
use crate::worker::WorkerId;

/// How calibration learns; defaults suit a fleet serving a few requests a
/// second per worker or more.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationConfig {
    /// Off: every worker is costed at the priors.
    pub enabled: bool,
    /// Each new sample multiplies a worker's older ones' weight by this
    /// (0.97: about 33 samples of memory).
    pub forgetting: f64,
    /// The fleet fit's forgetting per sample (its memory spans workers).
    pub fleet_forgetting: f64,
    /// Weight of the fleet's scale in a worker's fit, in samples of the
    /// fleet's typical size.
    pub prior_samples: f64,
    /// Relative speeds within `[1/dead_band, dead_band]` count as 1.
    pub dead_band: f64,
    /// A sample's ratio is clipped to `[1/clip, clip]` × the fleet's, and
    /// a worker's relative speed to the same range.
    pub clip: f64,
    /// A worker's fit is forgotten after this long without a sample.
    pub stale_after: Duration,
}

impl Default for CalibrationConfig {
    fn default() -> Self {
        CalibrationConfig {
            enabled: true,
            forgetting: 0.97,
            fleet_forgetting: 0.995,
            prior_samples: 1.0,
            dead_band: 1.25,
            clip: 8.0,
            stale_after: Duration::from_secs(600),
        }
    }
}

/// Decayed least-squares sums of measured (`y`) on predicted (`x`), in ms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Fit {
    sxy: f64,
    sxx: f64,
    syy: f64,
    /// Σx⁴, for the effective number of samples under x² weights.
    sx4: f64,
    /// Effective number of samples (decayed like the sums).
    weight: f64,
}

impl Fit {
    fn add(&mut self, x: f64, y: f64, forgetting: f64) {
        self.sxy = forgetting * self.sxy + x * y;
        self.sxx = forgetting * self.sxx + x * x;
        self.syy = forgetting * self.syy + y * y;
        self.sx4 = forgetting * self.sx4 + x * x * x * x;
        self.weight = forgetting * self.weight + 1.0;
    }

    /// Measured over predicted; `None` before any sample.
    fn scale(&self) -> Option<f64> {
        (self.sxx > 0.0).then(|| self.sxy / self.sxx)
    }

    /// Samples as the fit counts them: weights x² make one long prefill
    /// worth many cache hits (Kish's `(Σw)² / Σw²`).
    fn effective_samples(&self) -> f64 {
        if self.sx4 > 0.0 { self.sxx * self.sxx / self.sx4 } else { 0.0 }
    }

    /// The standard error of `scale`, relative to it: the spread of the
    /// samples' ratios (weighted as the fit weighs them) over the square
    /// root of the effective samples; infinite with one or none.
    fn relative_error(&self) -> f64 {
        let n = self.effective_samples();
        let Some(scale) = self.scale().filter(|s| *s > 0.0 && n > 1.0) else { return f64::INFINITY };
        // Σx²(r − s)² / Σx², with y = r·x.
        let variance = (self.syy / self.sxx - scale * scale).max(0.0);
        (variance / n).sqrt() / scale
    }

    /// The mean of predicted², the size of a typical sample.
    fn typical_sxx(&self) -> f64 {
        if self.weight > 0.0 { self.sxx / self.weight } else { 0.0 }
    }
}

#[derive(Clone, Debug)]
struct WorkerFit {
    ttft: Fit,
    samples: u64,
    last: Millis,
    /// The relative speed the cost uses now.
    applied: f64,
    decode_ns_per_token: Option<f64>,
}

impl WorkerFit {
    fn new(now: Millis) -> Self {
        WorkerFit { ttft: Fit::default(), samples: 0, last: now, applied: 1.0, decode_ns_per_token: None }
    }
}

/// A worker's calibration as exported to metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkerCalibration {
    pub worker: WorkerId,
    /// Measured TTFT over the priors' prediction, on this worker.
    pub ttft_scale: Option<f64>,
    /// The factor its predicted TTFT is multiplied by (1: as the fleet).
    pub speed_factor: f64,
    /// TTFT samples taken, ever.
    pub samples: u64,
    /// Moving average of the time per output token after the first.
    pub decode_ns_per_token: Option<f64>,
}

/// A sample that could not be used, and why (for the caller's metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("calibration is off")]
    Disabled,
    #[error("the prediction is not a positive finite time")]
    BadPrediction,
    #[error("the measured time is zero")]
    ZeroMeasurement,
}

/// Per-worker fits and the fleet's. Pure: the caller supplies the times.
#[derive(Clone, Debug)]
pub struct Calibration {
    cfg: CalibrationConfig,
    /// Every worker's samples in one fit: the clipping reference and the
    /// typical sample size.
    fleet: Fit,
    /// The fleet's scale every worker is compared with (see the module).
    reference: Option<f64>,
    /// Samples since `reference` was last computed.
    since_reference: u32,
    workers: HashMap<WorkerId, WorkerFit, FxBuildHasher>,
    /// Samples whose ratio was clipped (outliers), ever.
    clipped: u64,
}

const NS_PER_MS: f64 = 1e6;

/// Longer predictions or measurements (a day) are not TTFTs: refused or
/// capped, so the sums stay finite.
const MAX_PREDICTION_NS: f64 = 8.64e13;

/// Samples the pooled fit needs before it, not the priors, is what
/// samples are clipped against.
const MIN_FLEET_WEIGHT: f64 = 8.0;

/// The smallest change of a worker's applied factor worth telling the
/// shards about: fits drift a little with every sample.
const REPORTABLE_CHANGE: f64 = 0.05;

/// The fleet's reference is recomputed, and every worker compared with
/// it, every this many samples (a median over the workers: too dear for
/// every sample of a large fleet)...
const REFERENCE_EVERY: u32 = 32;

/// ...or at every sample in a fleet of at most this many workers.
const SMALL_FLEET: usize = 64;

/// Samples a worker needs before its scale counts towards the reference.
const MIN_REFERENCE_WEIGHT: f64 = 3.0;

/// Effective samples (decayed, and counted as the x² weights count them)
/// a worker needs before its speed may leave 1: a few samples of
/// wall-clock noise, or of a stall every engine shared, must not move a
/// conversation off its cache.
const MIN_WORKER_WEIGHT: f64 = 5.0;

impl Calibration {
    pub fn new(cfg: CalibrationConfig) -> Self {
        Calibration {
            cfg,
            fleet: Fit::default(),
            reference: None,
            since_reference: 0,
            workers: HashMap::default(),
            clipped: 0,
        }
    }

    pub fn config(&self) -> &CalibrationConfig {
        &self.cfg
    }

    /// The fleet's measured over predicted TTFT: what a worker's is
    /// compared with.
    pub fn fleet_scale(&self) -> Option<f64> {
        self.reference.or(self.fleet.scale())
    }

    /// Samples clipped as outliers, ever.
    pub fn clipped(&self) -> u64 {
        self.clipped
    }

    /// Records one time to first token on `worker`: `predicted_ns` by the
    /// priors at booking, `measured_ns` from booking to the first chunk.
    /// Returns the workers whose speed factor changed enough to pass on to
    /// the cost, with their new factors, by worker id (usually none).
    pub fn observe_ttft(
        &mut self,
        worker: WorkerId,
        predicted_ns: f64,
        measured_ns: u64,
        now: Millis,
    ) -> Result<Vec<(WorkerId, f64)>, SampleError> {
        if !self.cfg.enabled {
            return Err(SampleError::Disabled);
        }
        if !(predicted_ns.is_finite() && predicted_ns > 0.0 && predicted_ns <= MAX_PREDICTION_NS) {
            return Err(SampleError::BadPrediction);
        }
        if measured_ns == 0 {
            return Err(SampleError::ZeroMeasurement);
        }
        let x = predicted_ns / NS_PER_MS;
        let mut ratio = (measured_ns as f64).min(MAX_PREDICTION_NS) / predicted_ns;
        // Until the pooled fit has a few samples, the priors are the
        // reference: a cold start's stall must not become the fleet's.
        let reference = self
            .fleet
            .scale()
            .filter(|s| self.fleet.weight >= MIN_FLEET_WEIGHT && s.is_finite() && *s > 0.0)
            .unwrap_or(1.0);
        let clipped = ratio.clamp(reference / self.cfg.clip, reference * self.cfg.clip);
        if clipped != ratio {
            self.clipped += 1;
            ratio = clipped;
        }
        let y = ratio * x;
        self.fleet.add(x, y, self.cfg.fleet_forgetting);
        let fit = self.workers.entry(worker).or_insert_with(|| WorkerFit::new(now));
        fit.ttft.add(x, y, self.cfg.forgetting);
        fit.samples += 1;
        fit.last = now;
        self.since_reference += 1;
        let mut changes = Vec::new();
        if self.workers.len() <= SMALL_FLEET || self.since_reference >= REFERENCE_EVERY {
            changes = self.reassess_all();
        } else {
            let fit = self.workers.get_mut(&worker).expect("inserted above");
            if let Some(speed) = reassess(&self.cfg, self.reference, self.fleet.typical_sxx(), fit) {
                changes.push((worker, speed));
            }
        }
        Ok(changes)
    }

    /// The lower median of the scales of workers with a few samples; none
    /// until two workers have them (a worker is slow only against others).
    fn refresh_reference(&mut self) {
        self.since_reference = 0;
        let mut scales: Vec<f64> = self
            .workers
            .values()
            .filter(|f| f.ttft.weight >= MIN_REFERENCE_WEIGHT)
            .filter_map(|f| f.ttft.scale())
            .collect();
        if scales.len() < 2 {
            self.reference = None;
            return;
        }
        scales.sort_by(f64::total_cmp);
        self.reference = Some(scales[(scales.len() - 1) / 2]);
    }

    /// Records a response's decode: `output_tokens` after the first took
    /// `decode_ns` in all.
    pub fn observe_decode(&mut self, worker: WorkerId, output_tokens: u64, decode_ns: u64, now: Millis) {
        if !self.cfg.enabled || output_tokens == 0 || decode_ns == 0 {
            return;
        }
        let per_token = decode_ns as f64 / output_tokens as f64;
        let fit = self.workers.entry(worker).or_insert_with(|| WorkerFit::new(now));
        fit.decode_ns_per_token = Some(match fit.decode_ns_per_token {
            // About the last ten responses.
            Some(old) => old + 0.1 * (per_token - old),
            None => per_token,
        });
    }

    /// The speed factor the cost uses for `worker` (1 when unknown).
    pub fn speed(&self, worker: WorkerId) -> f64 {
        self.workers.get(&worker).map_or(1.0, |f| f.applied)
    }

    /// Every worker's applied speed factor, by worker id: what the shards
    /// should hold (re-sent now and then, so a change posted from one
    /// thread and overtaken by an older one from another heals).
    pub fn speeds(&self) -> Vec<(WorkerId, f64)> {
        let mut all: Vec<(WorkerId, f64)> = self.workers.iter().map(|(w, f)| (*w, f.applied)).collect();
        all.sort_by_key(|(w, _)| *w);
        all
    }

    /// Forgets a worker (deleted from the fleet).
    pub fn forget(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
        self.refresh_reference();
    }

    /// Forgets fits with no sample since `now − stale_after`; returns the
    /// workers whose speed factor changed (back to 1 for those forgotten,
    /// against the new reference for the others), by worker id.
    pub fn expire(&mut self, now: Millis) -> Vec<(WorkerId, f64)> {
        let stale_after = self.cfg.stale_after;
        let mut reset = Vec::new();
        self.workers.retain(|worker, fit| {
            let fresh = fit.last.after(stale_after) > now;
            if !fresh && fit.applied != 1.0 {
                reset.push((*worker, 1.0));
            }
            fresh
        });
        let mut changes = self.reassess_all();
        changes.append(&mut reset);
        changes.sort_by_key(|(w, _)| *w);
        changes
    }

    /// A new reference, and every worker compared with it anew.
    fn reassess_all(&mut self) -> Vec<(WorkerId, f64)> {
        self.refresh_reference();
        let Calibration { cfg, fleet, reference, workers, .. } = self;
        let mut changes = Vec::new();
        for (w, fit) in workers.iter_mut() {
            if let Some(speed) = reassess(cfg, *reference, fleet.typical_sxx(), fit) {
                changes.push((*w, speed));
            }
        }
        changes.sort_by_key(|(w, _)| *w);
        changes
    }

    /// Every worker's calibration, by worker id.
    pub fn snapshot(&self) -> Vec<WorkerCalibration> {
        let mut all: Vec<WorkerCalibration> = self
            .workers
            .iter()
            .map(|(worker, fit)| WorkerCalibration {
                worker: *worker,
                ttft_scale: fit.ttft.scale(),
                speed_factor: fit.applied,
                samples: fit.samples,
                decode_ns_per_token: fit.decode_ns_per_token,
            })
            .collect();
        all.sort_by_key(|c| c.worker);
        all
    }
}

/// The worker's speed against `reference`; `Some` when it changed enough
/// to report, and then it is the applied one.
fn reassess(cfg: &CalibrationConfig, reference: Option<f64>, typical_sxx: f64, fit: &mut WorkerFit) -> Option<f64> {
    let speed = reference.map_or(1.0, |r| relative_speed(cfg, r, typical_sxx, &fit.ttft));
    let changed = (speed == 1.0) != (fit.applied == 1.0) || (speed / fit.applied - 1.0).abs() > REPORTABLE_CHANGE;
    if changed {
        fit.applied = speed;
    }
    changed.then_some(speed)
}

/// A worker's scale over the fleet's, shrunk towards 1 by the prior (of
/// `typical_sxx`-sized samples), clipped, and 1 inside the dead band.
fn relative_speed(cfg: &CalibrationConfig, fleet_scale: f64, typical_sxx: f64, worker: &Fit) -> f64 {
    if worker.effective_samples() < MIN_WORKER_WEIGHT {
        return 1.0;
    }
    let prior = cfg.prior_samples * typical_sxx;
    let scale = (worker.sxy + prior * fleet_scale) / (worker.sxx + prior);
    let relative = scale / fleet_scale;
    if !relative.is_finite() {
        return 1.0;
    }
    let relative = relative.clamp(1.0 / cfg.clip, cfg.clip);
    let outside_band = relative > cfg.dead_band || relative < 1.0 / cfg.dead_band;
    // Two standard errors from the fleet, or it may be noise (the error
    // is relative to the worker's scale, so it scales with `relative`).
    let significant = (relative - 1.0).abs() > 2.0 * worker.relative_error() * relative;
    if outside_band && significant { relative } else { 1.0 }
}

#[cfg(test)]
mod tests;
