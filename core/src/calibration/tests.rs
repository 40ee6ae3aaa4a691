use super::*;

const T0: Millis = Millis(1_000);

/// Feeds `rounds` requests to each of `speeds.len()` workers: predicted
/// sizes from 1 to 400 ms, measured = predicted × the worker's speed ×
/// `bias`, with ±`noise` multiplicative jitter and a 2 ms jitter on top
/// (scaled by `bias` too).
fn feed(cal: &mut Calibration, speeds: &[f64], bias: f64, noise: f64, rounds: usize, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    for round in 0..rounds {
        for (w, speed) in speeds.iter().enumerate() {
            let predicted = 1e6 * (1.0 + 399.0 * rng.f64());
            let jitter = 1.0 + noise * (2.0 * rng.f64() - 1.0);
            let measured = (predicted * speed * jitter + 2e6 * rng.f64()) * bias;
            let now = Millis(T0.0 + round as u64);
            cal.observe_ttft(WorkerId(w as u64), predicted, measured as u64, now).unwrap();
        }
    }
}

#[test]
fn a_slow_worker_is_learned_and_its_peers_stay_at_one() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 1.0, 0.2, 100, 1);
    let slow = cal.speed(WorkerId(0));
    assert!((1.6..2.3).contains(&slow), "slow worker's factor {slow}");
    for w in 1..8 {
        assert_eq!(cal.speed(WorkerId(w)), 1.0, "worker {w}");
    }
    // A fast one too.
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[0.5, 1.0, 1.0, 1.0], 1.0, 0.2, 100, 2);
    let fast = cal.speed(WorkerId(0));
    assert!((0.4..0.65).contains(&fast), "fast worker's factor {fast}");
}

#[test]
fn a_uniform_error_in_the_priors_changes_no_factor() {
    // A simulator running 100× faster than the priors, or GPUs 3× slower.
    for bias in [0.01, 3.0] {
        let mut cal = Calibration::new(CalibrationConfig::default());
        feed(&mut cal, &[1.0; 6], bias, 0.3, 200, 3);
        let fleet = cal.fleet_scale().unwrap();
        assert!((fleet / bias - 1.0).abs() < 0.1, "fleet scale {fleet} for bias {bias}");
        for c in cal.snapshot() {
            assert_eq!(c.speed_factor, 1.0, "{c:?} for bias {bias}");
        }
    }
}

#[test]
fn noisy_short_requests_do_not_move_a_worker() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[1.0; 4], 1.0, 0.1, 50, 4);
    // Worker 0 then serves only cache hits: 1 ms predicted, measured 0.2 to
    // 5 ms (scheduling jitter dominates).
    let mut rng = fastrand::Rng::with_seed(5);
    for i in 0..200 {
        let measured = 2e5 + 4.8e6 * rng.f64();
        cal.observe_ttft(WorkerId(0), 1e6, measured as u64, Millis(T0.0 + 100 + i)).unwrap();
    }
    assert_eq!(cal.speed(WorkerId(0)), 1.0);
}

#[test]
fn a_wide_spread_is_not_significant() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[1.0; 4], 1.0, 0.05, 50, 10);
    // Twelve samples whose ratios swing between 0.2 and 4 (mean 1.4):
    // timing noise, not a slow engine.
    let ratios = [0.2, 4.0, 0.3, 3.5, 0.2, 0.4, 3.8, 0.5, 0.3, 2.0, 0.6, 0.9];
    for (i, r) in ratios.iter().enumerate() {
        cal.observe_ttft(WorkerId(0), 1e8, (1e8 * r) as u64, Millis(T0.0 + 100 + i as u64)).unwrap();
    }
    assert_eq!(cal.speed(WorkerId(0)), 1.0);
}

#[test]
fn one_outlier_is_clipped_and_barely_moves_the_fit() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[1.0; 4], 1.0, 0.1, 50, 6);
    let before = cal.snapshot()[1].ttft_scale.unwrap();
    // A 30-second stall on a 200 ms prediction.
    let changed = cal.observe_ttft(WorkerId(1), 2e8, 30_000_000_000, Millis(T0.0 + 60)).unwrap();
    assert_eq!(changed, vec![]);
    assert_eq!(cal.speed(WorkerId(1)), 1.0);
    assert_eq!(cal.clipped(), 1);
    let after = cal.snapshot()[1].ttft_scale.unwrap();
    assert!(after < before * 8.0 && after > before, "{before} → {after}");
}

#[test]
fn a_change_is_reported_once_and_undone_when_the_worker_recovers() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[1.0; 4], 1.0, 0.0, 30, 7);
    let mut reports = Vec::new();
    for i in 0..60 {
        for (w, f) in cal.observe_ttft(WorkerId(2), 1e8, 300_000_000, Millis(T0.0 + 100 + i)).unwrap() {
            assert_eq!(w, WorkerId(2), "only the slow worker changes");
            reports.push(f);
        }
    }
    // Reported as it converges, each a step of more than 5%, not per sample.
    assert!(!reports.is_empty() && reports.len() <= 15, "{reports:?}");
    assert!(cal.speed(WorkerId(2)) > 2.0, "{}", cal.speed(WorkerId(2)));
    for i in 0..200 {
        cal.observe_ttft(WorkerId(2), 1e8, 100_000_000, Millis(T0.0 + 200 + i)).unwrap();
    }
    assert_eq!(cal.speed(WorkerId(2)), 1.0);
}

#[test]
fn stale_fits_are_forgotten() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[3.0, 1.0, 1.0, 1.0], 1.0, 0.0, 50, 8);
    assert!(cal.speed(WorkerId(0)) > 2.0);
    let stale_after = cal.config().stale_after;
    assert!(cal.expire(T0.after(stale_after)).is_empty(), "fits are fresh until stale_after has passed");
    let later = Millis(T0.after(stale_after).0 + 100);
    assert_eq!(cal.expire(later), vec![(WorkerId(0), 1.0)]);
    assert_eq!(cal.speed(WorkerId(0)), 1.0);
    assert!(cal.snapshot().is_empty());
}

#[test]
fn bad_samples_are_refused_and_calibration_can_be_off() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    assert_eq!(cal.observe_ttft(WorkerId(0), 0.0, 5, T0), Err(SampleError::BadPrediction));
    assert_eq!(cal.observe_ttft(WorkerId(0), f64::NAN, 5, T0), Err(SampleError::BadPrediction));
    assert_eq!(cal.observe_ttft(WorkerId(0), 1e6, 0, T0), Err(SampleError::ZeroMeasurement));
    let mut off = Calibration::new(CalibrationConfig { enabled: false, ..CalibrationConfig::default() });
    assert_eq!(off.observe_ttft(WorkerId(0), 1e6, 5, T0), Err(SampleError::Disabled));
    off.observe_decode(WorkerId(0), 10, 1000, T0);
    assert!(off.snapshot().is_empty());
}

#[test]
fn decode_speed_is_a_moving_average_per_token() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    cal.observe_decode(WorkerId(4), 100, 1_000_000_000, T0);
    assert_eq!(cal.snapshot()[0].decode_ns_per_token, Some(1e7));
    cal.observe_decode(WorkerId(4), 100, 2_000_000_000, T0);
    assert_eq!(cal.snapshot()[0].decode_ns_per_token, Some(1.1e7));
    // No output after the first token: nothing to learn.
    cal.observe_decode(WorkerId(4), 0, 5, T0);
    assert_eq!(cal.snapshot()[0].decode_ns_per_token, Some(1.1e7));
}

#[test]
fn a_few_samples_never_move_a_worker() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[1.0; 4], 1.0, 0.0, 30, 9);
    // A new worker whose first requests all stalled 5×.
    for i in 0..4 {
        let changed = cal.observe_ttft(WorkerId(9), 1e8, 500_000_000, Millis(T0.0 + 100 + i)).unwrap();
        assert_eq!(changed, vec![], "sample {i}");
    }
    assert_eq!(cal.speed(WorkerId(9)), 1.0);
}

#[test]
fn a_cold_start_stall_is_clipped_against_the_priors() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    // The very first sample: a 50× stall.
    cal.observe_ttft(WorkerId(0), 4e8, 20_000_000_000, T0).unwrap();
    assert_eq!(cal.clipped(), 1, "clipped to 8× the priors, not taken whole");
    feed(&mut cal, &[1.0; 4], 1.0, 0.05, 40, 11);
    assert_eq!(cal.speed(WorkerId(0)), 1.0);
}

#[test]
fn one_long_sample_among_cache_hits_is_one_sample_not_six() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    feed(&mut cal, &[1.0; 4], 1.0, 0.05, 40, 12);
    // A stalled 400 ms prefill (3×) and five 1 ms cache hits: the fit is
    // all the long one, which is a single sample of evidence.
    cal.observe_ttft(WorkerId(9), 4e8, 1_200_000_000, Millis(T0.0 + 100)).unwrap();
    for i in 0..5 {
        cal.observe_ttft(WorkerId(9), 1e6, 1_000_000, Millis(T0.0 + 101 + i)).unwrap();
    }
    assert_eq!(cal.speed(WorkerId(9)), 1.0);
}

#[test]
fn absurd_predictions_are_refused_and_leave_the_fits_finite() {
    let mut cal = Calibration::new(CalibrationConfig::default());
    assert_eq!(cal.observe_ttft(WorkerId(0), 1e200, 5, T0), Err(SampleError::BadPrediction));
    cal.observe_ttft(WorkerId(0), 1e6, u64::MAX, T0).unwrap();
    feed(&mut cal, &[1.0; 3], 1.0, 0.0, 10, 13);
    assert!(cal.fleet_scale().is_some_and(f64::is_finite));
}
