//! Tests for the window of fires: every schedule kind against a reference that counts fires
//! one by one, and DST zones.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use proptest::prelude::*;

use super::*;
use crate::schedule::CronSchedule;

fn utc(s: &str) -> DateTime<Utc> {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn cron(expr: &str, tz: &str) -> Schedule {
    Schedule::Cron(Box::new(CronSchedule::parse(expr, tz).unwrap_or_else(|e| panic!("{expr}: {e}"))))
}

fn every(ms: u64, anchor: &str) -> Schedule {
    Schedule::Every { interval: Duration::from_millis(ms), anchor: utc(anchor) }
}

/// Every fire the window lets through after `after`, by walking it.
fn walk(window: &Window, schedule: &Schedule, after: DateTime<Utc>, cap: usize) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut cursor = after;
    while out.len() < cap {
        let Some(next) = window.next_after(schedule, cursor) else { break };
        out.push(next);
        cursor = next;
    }
    out
}

/// The reference: the schedule's fires from `start_at` on, before `end_at`, the first
/// `max_runs` of them, counted one by one.
fn reference(
    schedule: &Schedule,
    start: DateTime<Utc>,
    end_at: Option<DateTime<Utc>>,
    max_runs: Option<u32>,
    cap: usize,
) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut cursor = start - TimeDelta::milliseconds(1);
    while out.len() < cap && max_runs.is_none_or(|n| out.len() < n as usize) {
        let Some(next) = schedule.next_after(cursor) else { break };
        if end_at.is_some_and(|end| next >= end) {
            break;
        }
        out.push(next);
        cursor = next;
    }
    out
}

#[test]
fn a_fire_exactly_at_end_at_is_not_made_and_the_one_before_is() {
    let schedule = every(10_000, "2027-01-01T00:00:00Z");
    let window = Window::new(&schedule, None, Some(utc("2027-01-01T00:01:00Z")), None);
    let fires = walk(&window, &schedule, utc("2027-01-01T00:00:35Z"), 10);
    assert_eq!(fires, [utc("2027-01-01T00:00:40Z"), utc("2027-01-01T00:00:50Z")]);
    assert_eq!(window.last_fire(&schedule), Some(utc("2027-01-01T00:00:50Z")));
    assert_eq!(window.ends_by, Some(EndReason::EndAt));
}

#[test]
fn start_at_is_inclusive() {
    let schedule = every(10_000, "2027-01-01T00:00:00Z");
    let window = Window::new(&schedule, Some(utc("2027-01-01T00:00:30Z")), None, None);
    assert_eq!(window.next_after(&schedule, utc("2026-12-31T00:00:00Z")), Some(utc("2027-01-01T00:00:30Z")));
    assert_eq!(window.ends_by, None);
    assert_eq!(window.last_fire(&schedule), None, "nothing ends it");
}

#[test]
fn max_runs_ends_with_the_nth_fire_from_start_at() {
    let schedule = cron("0 0 9 * * *", "Europe/Paris");
    let window = Window::new(&schedule, Some(utc("2027-01-01T08:00:00Z")), None, Some(3));
    assert_eq!(window.ends_by, Some(EndReason::MaxRuns));
    assert_eq!(window.last_fire(&schedule), Some(utc("2027-01-03T08:00:00Z")));
    assert_eq!(walk(&window, &schedule, utc("2026-01-01T00:00:00Z"), 10).len(), 3);
    assert_eq!(window.remaining_runs(&schedule, None), Some(3));
    assert_eq!(window.remaining_runs(&schedule, Some(utc("2027-01-01T08:00:00Z"))), Some(2));
    assert_eq!(window.remaining_runs(&schedule, Some(utc("2027-01-03T08:00:00Z"))), Some(0));
    // An end_at before the third fire ends it first.
    let earlier =
        Window::new(&schedule, Some(utc("2027-01-01T08:00:00Z")), Some(utc("2027-01-02T12:00:00Z")), Some(3));
    assert_eq!(earlier.ends_by, Some(EndReason::EndAt));
    assert_eq!(earlier.last_fire(&schedule), Some(utc("2027-01-02T08:00:00Z")));
    assert_eq!(earlier.remaining_runs(&schedule, None), Some(2), "end_at leaves two of the three");
}

#[test]
fn a_one_shot_ends_with_its_fire() {
    let at = utc("2027-01-01T00:00:00Z");
    let schedule = Schedule::At(at);
    let window = Window::new(&schedule, None, None, None);
    assert_eq!(window.ends_by, Some(EndReason::OneShot));
    assert_eq!(window.last_fire(&schedule), Some(at));
    assert_eq!(window.next_after(&schedule, at - TimeDelta::seconds(1)), Some(at));
    assert_eq!(window.next_after(&schedule, at), None);
    assert_eq!(window.remaining_runs(&schedule, None), None, "no max_runs on a one-shot");
}

/// Spring forward in New York (2027-03-14, 02:00 EST -> 03:00 EDT at 07:00Z): a daily 02:30
/// fires at the transition that day and counts once.
#[test]
fn max_runs_across_a_dst_gap_counts_the_gap_fire_once() {
    let schedule = cron("0 30 2 * * *", "America/New_York");
    let window = Window::new(&schedule, Some(utc("2027-03-13T00:00:00Z")), None, Some(3));
    let fires = walk(&window, &schedule, utc("2027-03-01T00:00:00Z"), 10);
    assert_eq!(
        fires,
        [utc("2027-03-13T07:30:00Z"), utc("2027-03-14T07:00:00Z"), utc("2027-03-15T06:30:00Z")]
    );
}

/// Fall back in New York (2027-11-07, 02:00 EDT -> 01:00 EST at 06:00Z): an hourly at :30
/// fires once in the repeated hour.
#[test]
fn max_runs_across_a_dst_fold_counts_the_fold_fire_once() {
    let schedule = cron("0 30 * * * *", "America/New_York");
    let window = Window::new(&schedule, Some(utc("2027-11-07T04:00:00Z")), None, Some(3));
    let fires = walk(&window, &schedule, utc("2027-11-01T00:00:00Z"), 10);
    // 00:30 EDT, 01:30 EDT (the fold's earlier instant), 02:30 EST.
    assert_eq!(
        fires,
        [utc("2027-11-07T04:30:00Z"), utc("2027-11-07T05:30:00Z"), utc("2027-11-07T07:30:00Z")]
    );
}

#[test]
fn the_nth_fire_of_an_interval_is_computed_not_counted() {
    let schedule = every(7_000, "2027-01-01T00:00:03Z");
    let start = utc("2027-01-01T00:00:00Z");
    assert_eq!(nth_fire(&schedule, start, 1), Some(utc("2027-01-01T00:00:03Z")));
    assert_eq!(
        nth_fire(&schedule, start, 10_000),
        Some(utc("2027-01-01T00:00:03Z") + TimeDelta::seconds(7 * 9_999))
    );
}

const ZONES: &[&str] = &["UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata"];
const CRONS: &[&str] = &["0 30 2 * * *", "0 */20 * * * *", "15 0 1 * * *", "0 0 0 L * *", "*/45 * * * * *"];

fn schedule_strategy() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        (0..CRONS.len(), 0..ZONES.len()).prop_map(|(c, z)| cron(CRONS[c], ZONES[z])),
        (1..200_000u64, 0..86_400_000i64).prop_map(|(ms, anchor)| Schedule::Every {
            interval: Duration::from_millis(ms),
            anchor: utc("2027-01-01T00:00:00Z") + TimeDelta::milliseconds(anchor),
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// The window lets through exactly the fires the reference counts: from `start_at` on,
    /// before `end_at`, at most `max_runs`; and its last fire and remaining runs agree.
    #[test]
    fn the_window_agrees_with_counting_fires_one_by_one(
        schedule in schedule_strategy(),
        // Around the DST changes of 2027 in the northern hemisphere, and any time of year.
        start_s in prop_oneof![Just(0i64), 0..(400 * 86_400i64)],
        length_s in prop::option::of(1..(20 * 86_400i64)),
        max_runs in prop::option::of(1..60u32),
        after_s in -(2 * 86_400i64)..(10 * 86_400),
    ) {
        let base = utc("2027-01-01T00:00:00Z");
        let start = base + TimeDelta::seconds(start_s);
        let end_at = length_s.map(|l| start + TimeDelta::seconds(l));
        let window = Window::new(&schedule, Some(start), end_at, max_runs);
        let all = reference(&schedule, start, end_at, max_runs, 2_000);
        let after = start + TimeDelta::seconds(after_s);
        let want: Vec<_> = match max_runs {
            Some(_) => all.iter().copied().filter(|t| *t > after).take(100).collect(),
            // Unbounded by count: the fires after `after`, counted from there.
            None => reference(&schedule, start.max(after + TimeDelta::milliseconds(1)), end_at, None, 100),
        };
        let got = walk(&window, &schedule, after, 100);
        prop_assert_eq!(&got, &want);
        if all.len() < 2_000 && (end_at.is_some() || max_runs.is_some()) {
            prop_assert_eq!(window.last_fire(&schedule), all.last().copied());
            if let Some(max) = max_runs {
                let made = all.iter().filter(|t| **t <= after).count() as u32;
                let cursor = (made > 0).then(|| all[made as usize - 1]);
                prop_assert_eq!(window.remaining_runs(&schedule, cursor), Some(all.len() as u32 - made));
                prop_assert!(all.len() as u32 <= max);
            }
        }
        prop_assert!(got.iter().all(|t| window.contains(*t)));
    }

    /// The computed `n`-th fire of an interval is the one counting reaches.
    #[test]
    fn the_nth_fire_is_the_counted_one(schedule in schedule_strategy(), start_s in 0..(400 * 86_400i64), n in 1..80u32) {
        let start = utc("2027-01-01T00:00:00Z") + TimeDelta::seconds(start_s);
        let counted = reference(&schedule, start, None, Some(n), 100);
        prop_assert_eq!(nth_fire(&schedule, start, n), counted.get(n as usize - 1).copied());
    }
}
