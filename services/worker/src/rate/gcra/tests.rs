//! The GCRA schedule against simple reference models: a sliding count of starts never exceeds
//! `burst + elapsed / T`, every run gets one decision, delayed runs are never skipped, and with
//! a burst of 1 each start is exactly `max(arrival, previous start + T)`.

use jetsched_shared::spec::OnLimit;
use proptest::prelude::*;

use super::{Decision, Gcra, KeyState};

/// Runs the batches `(gap before it, its runs)` through the limit; the starts (and arrivals)
/// of the runs that start, and how many were skipped.
fn play(gcra: Gcra, batches: &[(i64, Vec<OnLimit>)]) -> (Vec<(i64, i64)>, usize, usize) {
    let mut state = KeyState::default();
    let mut now = 1_000_000;
    let (mut starts, mut skipped, mut episodes) = (Vec::new(), 0, 0);
    for (gap, runs) in batches {
        now += gap;
        let batch = gcra.decide(state, now, runs);
        assert_eq!(batch.decisions.len(), runs.len(), "one decision per run");
        for (decision, on_limit) in batch.decisions.iter().zip(runs) {
            match decision {
                Decision::Start(at) => {
                    assert!(*at >= now, "a run never starts before it arrives");
                    if *on_limit == OnLimit::Skip {
                        assert_eq!(*at, now, "a run that may be skipped starts now or never");
                    }
                    starts.push((*at, now));
                }
                Decision::Skip => {
                    assert_eq!(*on_limit, OnLimit::Skip, "only on_limit: skip skips");
                    skipped += 1;
                }
            }
        }
        episodes += usize::from(batch.episode);
        assert_eq!(batch.changed, batch.state != state);
        state = batch.state;
    }
    (starts, skipped, episodes)
}

fn on_limit() -> impl Strategy<Value = OnLimit> {
    prop_oneof![3 => Just(OnLimit::Delay), 1 => Just(OnLimit::Skip)]
}

fn batches() -> impl Strategy<Value = Vec<(i64, Vec<OnLimit>)>> {
    prop::collection::vec((0i64..3_000, prop::collection::vec(on_limit(), 0..6)), 1..40)
}

proptest! {
    #[test]
    fn no_window_holds_more_than_burst_plus_elapsed_over_t(
        interval in 1i64..1_000, burst in 1u32..8, batches in batches()
    ) {
        let gcra = Gcra::new(interval, burst);
        let (mut starts, skipped, _) = play(gcra, &batches);
        let total: usize = batches.iter().map(|(_, runs)| runs.len()).sum();
        prop_assert_eq!(starts.len() + skipped, total, "nothing lost");
        starts.sort_unstable();
        for i in 0..starts.len() {
            for j in i..starts.len() {
                let (first, last) = (starts[i].0, starts[j].0);
                let allowed = i64::from(burst) + (last - first) / interval;
                prop_assert!(
                    i64::try_from(j - i + 1).unwrap() <= allowed,
                    "{} starts in [{first}, {last}], at most {allowed}", j - i + 1
                );
            }
        }
    }

    #[test]
    fn starts_reserved_ahead_keep_the_window_bound_and_start_at_once(
        interval in 1i64..1_000, burst in 1u32..30,
        batches in prop::collection::vec((0i64..3_000, 0usize..4, 0u32..12), 1..40)
    ) {
        // A worker's write: its runs decided, then a block reserved ahead; every start of the
        // block counts at the time it was reserved.
        let gcra = Gcra::new(interval, burst);
        let (mut state, mut now, mut starts) = (KeyState::default(), 1_000_000i64, Vec::new());
        for (gap, runs, most) in batches {
            now += gap;
            let batch = gcra.decide(state, now, &vec![OnLimit::Delay; runs]);
            starts.extend(batch.decisions.iter().map(|d| match d {
                Decision::Start(at) => *at,
                Decision::Skip => unreachable!("delay never skips"),
            }));
            let (ahead, after) = gcra.ahead(batch.state, now, most);
            prop_assert!(ahead <= most);
            prop_assert!(ahead <= burst, "never more than the burst allows");
            starts.extend(std::iter::repeat_n(now, ahead as usize));
            // What is left after a block would not start now.
            if ahead < most {
                prop_assert!(gcra.reserve(after.tat, now).0 > now);
            }
            state = after;
        }
        starts.sort_unstable();
        for i in 0..starts.len() {
            for j in i..starts.len() {
                let allowed = i64::from(burst) + (starts[j] - starts[i]) / interval;
                prop_assert!(i64::try_from(j - i + 1).unwrap() <= allowed);
            }
        }
    }

    #[test]
    fn with_a_burst_of_one_each_start_is_the_earliest_the_interval_allows(
        interval in 1i64..1_000, gaps in prop::collection::vec((0i64..3_000, 0usize..5), 1..40)
    ) {
        let gcra = Gcra::new(interval, 1);
        let batches: Vec<_> = gaps.iter().map(|(gap, n)| (*gap, vec![OnLimit::Delay; *n])).collect();
        let (starts, skipped, _) = play(gcra, &batches);
        prop_assert_eq!(skipped, 0);
        let mut previous: Option<i64> = None;
        for (start, arrival) in starts {
            let expected = previous.map_or(arrival, |p| arrival.max(p + interval));
            prop_assert_eq!(start, expected);
            previous = Some(start);
        }
    }

    #[test]
    fn an_idle_key_lets_a_whole_burst_start_at_once(interval in 1i64..1_000, burst in 1u32..20) {
        let gcra = Gcra::new(interval, burst);
        let runs = vec![OnLimit::Skip; burst as usize + 1];
        let batch = gcra.decide(KeyState::default(), 1_000_000, &runs);
        let started = batch.decisions.iter().filter(|d| matches!(d, Decision::Start(_))).count();
        prop_assert_eq!(started, burst as usize);
        prop_assert_eq!(batch.decisions.last(), Some(&Decision::Skip));
        prop_assert!(batch.episode);
    }
}

#[test]
fn an_episode_is_told_once_until_the_key_drains() {
    let gcra = Gcra::new(100, 1);
    let two = [OnLimit::Delay, OnLimit::Delay];
    let first = gcra.decide(KeyState::default(), 1_000, &two);
    assert!(first.episode);
    assert_eq!(first.decisions, vec![Decision::Start(1_000), Decision::Start(1_100)]);
    // Still throttled: no new episode.
    let second = gcra.decide(first.state, 1_050, &two);
    assert!(!second.episode);
    assert_eq!(second.decisions, vec![Decision::Start(1_200), Decision::Start(1_300)]);
    // Drained (TAT 1_400 not after now), throttled again: a new episode.
    let third = gcra.decide(second.state, 1_400, &two);
    assert!(third.episode);
    assert_eq!(third.state.throttled_since, Some(1_400));
    // A skipped run does not move the TAT; starting an episode still changes the state.
    let skip = gcra.decide(KeyState { tat: 5_000, throttled_since: None }, 4_000, &[OnLimit::Skip]);
    assert_eq!(skip.decisions, vec![Decision::Skip]);
    assert_eq!(skip.state.tat, 5_000);
    assert!(skip.changed && skip.episode);
}
