//! Catch-up after a leader change or a restart: which missed fires of a task are dispatched,
//! which are skipped and which are counted as missed. Pure: the clock is a parameter.
//!
//! A fire at most `threshold` late is an ordinary fire (a failover takes a lease length, which
//! must not turn every task into a misfire). Older fires within the task's `catchup_window`
//! follow its misfire policy; fires older than the window are missed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use jetsched_shared::schedule::Schedule;
use jetsched_shared::spec::MisfirePolicy;
use jetsched_shared::wire::Trigger;

use crate::tasks::{Bounds, from_ms};

/// Fires examined per task at most; beyond it the plan jumps ahead (bounds the work after a
/// long outage of a fast schedule).
pub(crate) const SCAN_LIMIT: usize = 100_000;

/// Why a fire was not dispatched (the `reason` of `fire.skipped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SkipReason {
    /// Misfire policy `skip`.
    Misfire,
    /// Misfire policy `fire_once`: covered by the one catch-up run.
    Coalesced,
    /// Overlap policy `skip` (or a second waiting fire under `buffer_one`): the task's
    /// previous run was still going (see `overlap.rs`).
    Overlap,
    /// Overlap policy `cancel_other` or `replace`: a newer fire of the task took the place of
    /// this one while it waited for the previous run to end (see `overlap.rs`).
    Replaced,
}

impl SkipReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SkipReason::Misfire => "misfire",
            SkipReason::Coalesced => "coalesced",
            SkipReason::Overlap => "overlap",
            SkipReason::Replaced => "replaced",
        }
    }
}

/// Limits of one catch-up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Lateness up to which a fire is ordinary.
    pub(crate) threshold: Duration,
    /// Most catch-up dispatches and individually reported skips per task.
    pub(crate) max: usize,
}

/// What to do with the fires of one task in `(floor, now]`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Fires to dispatch, ascending nominal time (Unix ms).
    pub(crate) dispatch: Vec<(i64, Trigger)>,
    /// Skipped fires reported one by one (at most `max`).
    pub(crate) skipped: Vec<(i64, SkipReason)>,
    /// Skipped fires beyond `max`, counted only.
    pub(crate) skipped_more: u64,
    /// Fires older than the catch-up window (or beyond `max` under fire_all), counted.
    pub(crate) missed: u64,
    /// The latest nominal fire examined (dispatched, skipped or missed).
    pub(crate) last: Option<i64>,
}

/// Plans the fires of `schedule` within `bounds` in `(floor, now]` under `policy`: nothing
/// before the window's start or at or after its end is ever planned.
pub(crate) fn plan(
    schedule: &Schedule,
    bounds: Bounds,
    policy: MisfirePolicy,
    window: Duration,
    floor: DateTime<Utc>,
    now: DateTime<Utc>,
    limits: Limits,
) -> Plan {
    let mut plan = Plan::default();
    let ordinary_from = now - chrono::TimeDelta::from_std(limits.threshold).unwrap_or(chrono::TimeDelta::MAX);
    let window_from = now - chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX);
    // Fires in the policy region (late beyond the threshold, within the window).
    let mut late: Vec<i64> = Vec::new();
    let mut cursor = floor;
    let mut scanned = 0usize;
    while let Some(next) = bounds.next_after(schedule, cursor.timestamp_millis()).map(from_ms) {
        if next > now {
            break;
        }
        scanned += 1;
        if scanned > SCAN_LIMIT {
            // Count the rest as missed up to the ordinary region, then continue from there.
            plan.missed += 1;
            if next >= ordinary_from {
                break;
            }
            cursor = ordinary_from - chrono::TimeDelta::milliseconds(1);
            scanned = 0;
            continue;
        }
        let ms = next.timestamp_millis();
        plan.last = Some(ms);
        if next >= ordinary_from {
            plan.dispatch.push((ms, Trigger::Schedule));
        } else if next < window_from {
            plan.missed += 1;
        } else {
            late.push(ms);
        }
        cursor = next;
    }
    let mut catchup: Vec<(i64, Trigger)> = Vec::new();
    match policy {
        MisfirePolicy::FireAll => {
            let keep = late.len().min(limits.max);
            plan.missed += (late.len() - keep) as u64;
            catchup.extend(late[late.len() - keep..].iter().map(|&ms| (ms, Trigger::Catchup)));
        }
        MisfirePolicy::FireOnce => {
            if let Some((&last, rest)) = late.split_last() {
                catchup.push((last, Trigger::Catchup));
                record_skips(&mut plan, rest, SkipReason::Coalesced, limits.max);
            }
        }
        MisfirePolicy::Skip => record_skips(&mut plan, &late, SkipReason::Misfire, limits.max),
    }
    if !catchup.is_empty() {
        catchup.append(&mut plan.dispatch);
        plan.dispatch = catchup;
    }
    plan
}

fn record_skips(plan: &mut Plan, fires: &[i64], reason: SkipReason, max: usize) {
    let reported = fires.len().min(max);
    plan.skipped.extend(fires[fires.len() - reported..].iter().map(|&ms| (ms, reason)));
    plan.skipped_more += (fires.len() - reported) as u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).expect("valid")
    }

    fn plan(
        schedule: &Schedule,
        policy: MisfirePolicy,
        window: Duration,
        floor: DateTime<Utc>,
        now: DateTime<Utc>,
        limits: Limits,
    ) -> Plan {
        super::plan(schedule, Bounds::NONE, policy, window, floor, now, limits)
    }

    #[test]
    fn catch_up_never_plans_past_the_window() {
        // Window [100 s, 130 s): fires 100..=129; floor 90, now 200.
        let bounds = Bounds { start_ms: 100_000, end_ms: 130_000, ends_by: None, ..Bounds::NONE };
        for policy in [MisfirePolicy::Skip, MisfirePolicy::FireOnce, MisfirePolicy::FireAll] {
            let plan = super::plan(&every(1), bounds, policy, HOUR, t(90), t(200), LIMITS);
            assert_eq!(plan.last, Some(129_000), "{policy:?}");
            assert!(plan.dispatch.iter().all(|&(ms, _)| (100_000..130_000).contains(&ms)), "{policy:?}");
            assert!(plan.skipped.iter().all(|&(ms, _)| (100_000..130_000).contains(&ms)), "{policy:?}");
        }
        let all = super::plan(
            &every(1),
            bounds,
            MisfirePolicy::FireAll,
            HOUR,
            t(90),
            t(200),
            Limits { max: 100, ..LIMITS },
        );
        assert_eq!(all.dispatch.len(), 30, "every fire of the window, none past it");
    }

    fn every(secs: u64) -> Schedule {
        Schedule::Every { interval: Duration::from_secs(secs), anchor: DateTime::UNIX_EPOCH }
    }

    const LIMITS: Limits = Limits { threshold: Duration::from_secs(10), max: 5 };
    const HOUR: Duration = Duration::from_secs(3600);

    fn nominal(plan: &Plan) -> Vec<(i64, Trigger)> {
        plan.dispatch.iter().map(|&(ms, trigger)| (ms / 1000, trigger)).collect()
    }

    #[test]
    fn nothing_missed_gives_an_empty_plan() {
        // Floor 1_000_020 s, now 1_000_030 s: no minute boundary in between.
        let plan = plan(&every(60), MisfirePolicy::FireAll, HOUR, t(1_000_020), t(1_000_030), LIMITS);
        assert_eq!(plan, Plan::default());
    }

    #[test]
    fn fires_within_the_threshold_are_ordinary_whatever_the_policy() {
        for policy in [MisfirePolicy::Skip, MisfirePolicy::FireOnce, MisfirePolicy::FireAll] {
            let plan = plan(&every(1), policy, HOUR, t(100), t(104), LIMITS);
            assert_eq!(
                nominal(&plan),
                (101..=104).map(|s| (s, Trigger::Schedule)).collect::<Vec<_>>(),
                "{policy:?}"
            );
            assert!(plan.skipped.is_empty() && plan.missed == 0);
        }
    }

    #[test]
    fn fire_all_dispatches_every_late_fire_up_to_max() {
        // Fires 101..=130; ordinary from 120 (threshold 10 s); late 101..=119: keep last 5.
        let plan = plan(&every(1), MisfirePolicy::FireAll, HOUR, t(100), t(130), LIMITS);
        let mut want: Vec<(i64, Trigger)> = (115..=119).map(|s| (s, Trigger::Catchup)).collect();
        want.extend((120..=130).map(|s| (s, Trigger::Schedule)));
        assert_eq!(nominal(&plan), want);
        assert_eq!(plan.missed, 14);
        assert!(plan.skipped.is_empty());
    }

    #[test]
    fn fire_once_runs_the_latest_late_fire_and_records_the_rest() {
        let plan = plan(&every(10), MisfirePolicy::FireOnce, HOUR, t(0), t(100), LIMITS);
        // Late: 10..=80 (90 and 100 are within the threshold).
        assert_eq!(
            nominal(&plan),
            vec![(80, Trigger::Catchup), (90, Trigger::Schedule), (100, Trigger::Schedule)]
        );
        assert_eq!(plan.skipped.len(), 5);
        assert_eq!(plan.skipped_more, 2);
        assert!(plan.skipped.iter().all(|&(_, r)| r == SkipReason::Coalesced));
        assert_eq!(plan.skipped.last().map(|&(ms, _)| ms / 1000), Some(70));
    }

    #[test]
    fn skip_records_each_skipped_fire() {
        let plan = plan(&every(10), MisfirePolicy::Skip, HOUR, t(0), t(45), Limits { max: 100, ..LIMITS });
        assert_eq!(nominal(&plan), vec![(40, Trigger::Schedule)]);
        assert_eq!(
            plan.skipped.iter().map(|&(ms, r)| (ms / 1000, r)).collect::<Vec<_>>(),
            vec![(10, SkipReason::Misfire), (20, SkipReason::Misfire), (30, SkipReason::Misfire)]
        );
        assert_eq!(plan.skipped_more, 0);
    }

    #[test]
    fn fires_older_than_the_window_are_missed() {
        let plan = plan(&every(60), MisfirePolicy::FireAll, Duration::from_secs(300), t(0), t(3600), LIMITS);
        // Window: [3300, 3600]; 3300..=3540 late (keep 5: all), 3600 ordinary; 60..=3240 missed.
        assert_eq!(plan.missed, 54);
        assert_eq!(plan.last, Some(3_600_000));
        assert_eq!(plan.dispatch.len(), 6);
        assert_eq!(plan.dispatch[0], (3_300_000, Trigger::Catchup));
    }

    #[test]
    fn a_one_shot_already_fired_is_not_planned_again() {
        let at = Schedule::At(t(50));
        assert_eq!(plan(&at, MisfirePolicy::FireAll, HOUR, t(50), t(60), LIMITS), Plan::default());
        assert_eq!(
            nominal(&plan(&at, MisfirePolicy::FireAll, HOUR, t(40), t(55), LIMITS)),
            vec![(50, Trigger::Schedule)]
        );
    }

    #[test]
    fn a_long_outage_of_a_fast_schedule_is_bounded() {
        let fast = Schedule::Every { interval: Duration::from_millis(1), anchor: DateTime::UNIX_EPOCH };
        let plan = plan(&fast, MisfirePolicy::Skip, Duration::from_secs(86_400), t(0), t(3600), LIMITS);
        assert_eq!(plan.dispatch.len(), 10_001);
        assert_eq!(plan.skipped.len(), 5);
        assert!(plan.missed > 0);
    }
}
