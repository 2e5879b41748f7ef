//! Backfill planning against reference models: the nominal times of a range (interval grids by
//! property, a year of an hourly cron across both DST changes of two zones), the decision per
//! existing run, and ids that a live fire and a rerun never share.

use chrono::{DateTime, TimeDelta, Utc};
use proptest::prelude::*;

use super::*;

fn instant(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).expect("valid instant").to_utc()
}

fn cron(expr: &str, tz: &str) -> Schedule {
    Schedule::Cron(Box::new(crate::schedule::CronSchedule::parse(expr, tz).expect("valid cron")))
}

#[test]
fn a_year_of_an_hourly_task_across_both_dst_changes_of_two_zones() {
    let (from, to) = (instant("2026-01-01T00:00:00Z"), instant("2027-01-01T00:00:00Z"));
    // Berlin: 29 Mar 02:00 -> 03:00 (01:00 UTC), 25 Oct 03:00 -> 02:00 (00:00 and 01:00 UTC
    // both read 02:00). New York: 8 Mar 02:00 -> 03:00 (07:00 UTC), 1 Nov 02:00 -> 01:00.
    let zones = [
        ("Europe/Berlin", "2026-03-29T01:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z"),
        ("America/New_York", "2026-03-08T07:00:00Z", "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z"),
    ];
    for (tz, gap, fold, repeated) in zones {
        let schedule = cron("0 0 * * * *", tz);
        let times = nominal_times(&schedule, from, to, false).expect("a year fits");
        // Every UTC hour of the year but the repeated wall hour of the fold: 8,760 - 1.
        let reference: Vec<DateTime<Utc>> =
            (0..8760).map(|h| from + TimeDelta::hours(h)).filter(|t| *t != instant(repeated)).collect();
        assert_eq!(times.iter().map(|t| t.at).collect::<Vec<_>>(), reference, "{tz}");
        let marked: Vec<(DateTime<Utc>, DstMark)> =
            times.iter().filter_map(|t| t.dst.map(|mark| (t.at, mark))).collect();
        assert_eq!(marked, [(instant(gap), DstMark::Gap), (instant(fold), DstMark::Fold)], "{tz}");
        let backwards = nominal_times(&schedule, from, to, true).unwrap();
        assert!(backwards.iter().rev().eq(times.iter()), "backwards is the same times, newest first");
    }
}

#[test]
fn the_range_is_half_open_and_refused_when_empty_or_too_long() {
    let schedule =
        Schedule::Every { interval: std::time::Duration::from_secs(60), anchor: DateTime::UNIX_EPOCH };
    let from = instant("2026-01-01T00:00:00Z");
    let times = nominal_times(&schedule, from, from + TimeDelta::minutes(3), false).unwrap();
    let expected: Vec<_> = (0..3).map(|m| from + TimeDelta::minutes(m)).collect();
    assert_eq!(times.iter().map(|t| t.at).collect::<Vec<_>>(), expected, "from included, to not");
    assert!(times.iter().all(|t| t.dst.is_none()), "an interval runs on UTC");
    assert_eq!(nominal_times(&schedule, from, from, false).unwrap_err().field.as_deref(), Some("to"));
    let every_ms = Schedule::Every { interval: std::time::Duration::from_millis(1), anchor: from };
    let error = nominal_times(&every_ms, from, from + TimeDelta::hours(1), false).unwrap_err();
    assert!(error.message.contains("more than 1000000"), "{error:?}");
}

#[test]
fn an_existing_run_is_skipped_unless_reprocess_asks_for_it() {
    use Decision::*;
    use RunStatus as S;
    let statuses =
        [None, Some(S::Succeeded), Some(S::Failed), Some(S::Dead), Some(S::Running), Some(S::Skipped)];
    let table = [
        (Reprocess::None, [Dispatch, Skip, Skip, Skip, Skip, Skip]),
        (Reprocess::Failed, [Dispatch, Skip, Rerun, Rerun, Skip, Skip]),
        (Reprocess::All, [Dispatch, Rerun, Rerun, Rerun, Skip, Rerun]),
    ];
    for (reprocess, expected) in table {
        for (status, decision) in statuses.iter().zip(expected) {
            assert_eq!(decide(reprocess, *status), decision, "{reprocess:?} with {status:?}");
        }
    }
}

#[test]
fn a_first_run_has_the_live_fires_ids_and_a_rerun_its_own() {
    let ms = 1_767_225_600_000;
    let (msg_id, execution_id) = ids("billing", "report", ms, None);
    assert_eq!(msg_id, names::dispatch_msg_id("billing", "report", ms));
    assert_eq!(execution_id, wire::scheduled_execution_id("billing", "report", ms));
    let (rerun_msg, rerun_id) = ids("billing", "report", ms, Some("bf-1"));
    assert_ne!((&rerun_msg, &rerun_id), (&msg_id, &execution_id));
    assert_eq!(ids("billing", "report", ms, Some("bf-1")), (rerun_msg, rerun_id.clone()), "deterministic");
    assert_ne!(ids("billing", "report", ms, Some("bf-2")).1, rerun_id, "per backfill");
}

proptest! {
    /// An interval schedule's backfill is exactly its grid points in the range.
    #[test]
    fn interval_backfills_are_the_grid_points_in_the_range(
        interval_ms in 1_000i64..7_200_000,
        anchor_ms in 1_600_000_000_000i64..1_800_000_000_000,
        from_ms in 1_600_000_000_000i64..1_800_000_000_000,
        span_ms in 1i64..200_000_000,
    ) {
        let at = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap();
        let schedule = Schedule::Every {
            interval: std::time::Duration::from_millis(interval_ms as u64),
            anchor: at(anchor_ms),
        };
        let times = nominal_times(&schedule, at(from_ms), at(from_ms + span_ms), false).unwrap();
        let first_k = if from_ms <= anchor_ms { 0 } else { (from_ms - anchor_ms + interval_ms - 1) / interval_ms };
        let reference: Vec<_> = (first_k..)
            .map(|k| anchor_ms + k * interval_ms)
            .take_while(|ms| *ms < from_ms + span_ms)
            .map(at)
            .collect();
        prop_assert_eq!(times.iter().map(|t| t.at).collect::<Vec<_>>(), reference);
    }
}
