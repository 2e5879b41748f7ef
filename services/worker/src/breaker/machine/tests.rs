//! Tests of the breaker's rules: table-driven transitions and property tests of the merge.

use proptest::prelude::*;

use super::*;

fn spec() -> BreakerSpec {
    BreakerSpec {
        failure_rate: 0.5,
        min_runs: 4,
        window: Duration::from_secs(10),
        open_for: Duration::from_secs(1),
        max_open_for: Duration::from_secs(5),
        half_open_runs: 2,
        ..BreakerSpec::default()
    }
}

fn t(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
}

fn delta(spec: &BreakerSpec, at: DateTime<Utc>, runs: u64, failures: u64) -> Delta {
    let mut d = Delta::default();
    for i in 0..runs {
        d.count(spec.window, at, i < failures);
    }
    d
}

fn opened(spec: &BreakerSpec, now: DateTime<Utc>) -> BreakerRecord {
    let mut r = BreakerRecord::default();
    assert_eq!(merge(&mut r, &delta(spec, now, 4, 4), spec, now), Some(Transition::Opened));
    r
}

#[test]
fn opens_only_with_min_runs_and_the_failure_rate() {
    let spec = spec();
    let mut r = BreakerRecord::default();
    // 3 failures of 3: below min_runs.
    assert_eq!(merge(&mut r, &delta(&spec, t(0), 3, 3), &spec, t(0)), None);
    // 1 success more: 3 of 4 failed, 75% >= 50%: opens.
    assert_eq!(merge(&mut r, &delta(&spec, t(100), 1, 0), &spec, t(100)), Some(Transition::Opened));
    assert_eq!(r.state, BreakerState::Open);
    assert_eq!(r.open_until, Some(t(1100)));
    assert_eq!((r.opened_runs, r.opened_failures), (4, 3));

    let mut healthy = BreakerRecord::default();
    assert_eq!(merge(&mut healthy, &delta(&spec, t(0), 10, 4), &spec, t(0)), None);
    assert_eq!(healthy.window_counts(t(0)), (10, 4));
}

#[test]
fn the_window_slides() {
    let spec = spec();
    let mut r = BreakerRecord::default();
    assert_eq!(merge(&mut r, &delta(&spec, t(0), 3, 3), &spec, t(0)), None);
    // 11 s later the first slot left the window: 1 failure of 1 does not open.
    assert_eq!(merge(&mut r, &delta(&spec, t(11_000), 1, 1), &spec, t(11_000)), None);
    assert_eq!(r.window_counts(t(11_000)), (1, 1));
    assert_eq!(r.slots.len(), 1);
}

#[test]
fn counts_reaching_an_open_breaker_are_dropped() {
    let spec = spec();
    let mut r = opened(&spec, t(0));
    let before = r.clone();
    assert_eq!(merge(&mut r, &delta(&spec, t(10), 5, 5), &spec, t(10)), None);
    assert_eq!(r, before);
}

#[test]
fn open_short_circuits_until_open_until_then_one_round_of_probes() {
    let spec = spec();
    let probe_for = Duration::from_secs(3);
    let mut r = opened(&spec, t(0));
    assert_eq!(peek(&r, t(999)), Some(Admission::ShortCircuit));
    assert_eq!(peek(&r, t(1000)), None);
    assert_eq!(
        grant_probe(&mut r, &spec, probe_for, t(1000)),
        (Admission::Probe { round: 1 }, Some(Transition::HalfOpened))
    );
    assert_eq!(grant_probe(&mut r, &spec, probe_for, t(1001)), (Admission::Probe { round: 1 }, None));
    // half_open_runs = 2: the third asks in vain.
    assert_eq!(grant_probe(&mut r, &spec, probe_for, t(1002)), (Admission::ShortCircuit, None));
    assert_eq!(probe_verdict(&mut r, &spec, 1, true, t(1100)), None);
    assert_eq!(probe_verdict(&mut r, &spec, 1, true, t(1200)), Some(Transition::Closed));
    assert_eq!(r.state, BreakerState::Closed);
    assert!(r.slots.is_empty());
    assert_eq!(r.open_for_ms, 0);
    assert_eq!(peek(&r, t(1300)), Some(Admission::Run));
}

#[test]
fn a_failed_probe_reopens_for_twice_as_long_up_to_the_maximum() {
    let spec = spec();
    let probe_for = Duration::from_secs(3);
    let mut r = opened(&spec, t(0));
    let mut now = 1000;
    for expected in [2000, 4000, 5000, 5000] {
        assert!(matches!(grant_probe(&mut r, &spec, probe_for, t(now)).0, Admission::Probe { .. }));
        let round = r.probe_round;
        assert_eq!(probe_verdict(&mut r, &spec, round, false, t(now)), Some(Transition::Opened));
        assert_eq!(r.open_for_ms, expected);
        assert_eq!(r.open_until, Some(t(now + expected as i64)));
        now += expected as i64;
    }
    // Closing resets the period: the next opening lasts open_for again.
    grant_probe(&mut r, &spec, probe_for, t(now));
    grant_probe(&mut r, &spec, probe_for, t(now));
    let round = r.probe_round;
    probe_verdict(&mut r, &spec, round, true, t(now));
    assert_eq!(probe_verdict(&mut r, &spec, round, true, t(now)), Some(Transition::Closed));
    assert_eq!(merge(&mut r, &delta(&spec, t(now), 4, 4), &spec, t(now)), Some(Transition::Opened));
    assert_eq!(r.open_for_ms, 1000);
}

#[test]
fn stale_verdicts_change_nothing_and_lost_probes_are_given_back() {
    let spec = spec();
    let probe_for = Duration::from_secs(3);
    let mut r = opened(&spec, t(0));
    grant_probe(&mut r, &spec, probe_for, t(1000));
    grant_probe(&mut r, &spec, probe_for, t(1000));
    // A verdict of another round (or after a reset) is ignored.
    assert_eq!(probe_verdict(&mut r, &spec, 7, false, t(1100)), None);
    assert_eq!(r.state, BreakerState::HalfOpen);
    // Both probes' workers died: after the deadline the round grants again.
    assert_eq!(grant_probe(&mut r, &spec, probe_for, t(3999)).0, Admission::ShortCircuit);
    assert_eq!(grant_probe(&mut r, &spec, probe_for, t(4000)).0, Admission::Probe { round: 1 });
}

#[test]
fn short_circuited_runs_come_back_after_the_open_period() {
    let spec = spec();
    let r = opened(&spec, t(0));
    assert_eq!(retry_at(&r, &spec, t(10)), t(1000));
    let mut half = r.clone();
    grant_probe(&mut half, &spec, Duration::from_secs(3), t(1000));
    assert_eq!(retry_at(&half, &spec, t(1500)), t(2500));
}

proptest! {
    /// However attempts are split between workers and merged, the window holds the same
    /// counts, and the breaker is open exactly when the whole window trips it.
    #[test]
    fn merges_commute(attempts in proptest::collection::vec((0u8..3, any::<bool>()), 0..40)) {
        let spec = BreakerSpec { min_runs: 1000, ..spec() };
        let now = t(500);
        let mut deltas = [Delta::default(), Delta::default(), Delta::default()];
        let mut whole = Delta::default();
        for (worker, failed) in &attempts {
            deltas[usize::from(*worker)].count(spec.window, now, *failed);
            whole.count(spec.window, now, *failed);
        }
        let mut split = BreakerRecord::default();
        for d in deltas.iter().rev() {
            merge(&mut split, d, &spec, now);
        }
        let mut one = BreakerRecord::default();
        merge(&mut one, &whole, &spec, now);
        prop_assert_eq!(split.window_counts(now), one.window_counts(now));
        let failures = attempts.iter().filter(|(_, f)| *f).count() as u64;
        prop_assert_eq!(one.window_counts(now), (attempts.len() as u64, failures));
    }

    /// Open exactly when the window trips it; never below min_runs.
    #[test]
    fn opens_exactly_at_the_threshold(runs in 0u64..20, failures in 0u64..20) {
        let failures = failures.min(runs);
        let spec = spec();
        let mut r = BreakerRecord::default();
        let opened = merge(&mut r, &delta(&spec, t(0), runs, failures), &spec, t(0)).is_some();
        let expected = runs >= 4 && failures * 2 >= runs;
        prop_assert_eq!(opened, expected);
    }

    /// Whatever happens, at most half_open_runs probes are out per round and the open period
    /// stays within [open_for, max_open_for].
    #[test]
    fn probes_and_periods_stay_bounded(steps in proptest::collection::vec((0u8..3, any::<bool>()), 1..60)) {
        let spec = spec();
        let mut r = opened(&spec, t(0));
        let mut now = 0i64;
        let mut out: Vec<u64> = Vec::new();
        for (step, ok) in steps {
            now += 700;
            match step {
                0 => if let (Admission::Probe { round }, _) = grant_probe(&mut r, &spec, Duration::from_secs(10), t(now)) {
                    out.push(round);
                },
                1 => if let Some(round) = out.pop() {
                    probe_verdict(&mut r, &spec, round, ok, t(now));
                },
                _ => { merge(&mut r, &delta(&spec, t(now), 4, 4), &spec, t(now)); }
            }
            prop_assert!(r.probes_granted <= spec.half_open_runs);
            if r.state != BreakerState::Closed {
                prop_assert!((1000..=5000).contains(&r.open_for_ms), "{}", r.open_for_ms);
            }
        }
    }
}
