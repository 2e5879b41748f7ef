//! Backfill progress against reference models: batches driven to the end hand out exactly
//! the nominal times of the range, each once, in order, whatever the batch size, the runs in
//! flight and the restarts from a stored cursor; the request names every problem.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use proptest::prelude::*;

use super::*;

fn instant(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).expect("valid instant").to_utc()
}

fn every(interval_ms: u64, anchor: DateTime<Utc>) -> Schedule {
    Schedule::Every { interval: Duration::from_millis(interval_ms), anchor }
}

fn request(from: DateTime<Utc>, to: DateTime<Utc>) -> BackfillRequest {
    BackfillRequest {
        from,
        to,
        reprocess: Reprocess::None,
        max_active: DEFAULT_MAX_ACTIVE,
        backwards: false,
        overlap: BackfillOverlap::Allow,
        chain: true,
    }
}

fn start(request: BackfillRequest, schedule: &Schedule) -> BackfillProgress {
    let now = instant("2027-02-01T00:00:00Z");
    BackfillProgress::start("bf-1".into(), "billing".into(), "report".into(), request, schedule, now)
        .expect("a valid request")
}

/// Drives `progress` to its end as a leader does: each batch is written ahead (`begin`), its
/// starts become runs that end before the next batch, then it is committed. A restart
/// (`restart_every`) kills the leader after dispatching part of a batch and before committing
/// it: the next leader finds the pending batch and plans it again. Returns the times handed
/// out, each with the decision counted for it.
fn drive(
    progress: &mut BackfillProgress,
    schedule: &Schedule,
    runs: &mut BTreeMap<DateTime<Utc>, RunStatus>,
    limit: usize,
    restart_every: usize,
) -> Vec<Planned> {
    let now = instant("2027-02-01T00:00:00Z");
    let mut handed_out = Vec::new();
    for round in 1.. {
        assert!(round < 100_000, "a backfill ends");
        if progress.state != BackfillState::Running {
            break;
        }
        let in_flight = progress.settle(|_| true);
        assert!(progress.upcoming(schedule, limit).len() <= limit.max(1));
        let batch = progress.plan(schedule, |at| runs.get(&at).copied(), |_| false, in_flight, false, limit);
        progress.begin(&batch);
        let stored = progress.clone();
        let dispatch = |items: &[Planned], runs: &mut BTreeMap<DateTime<Utc>, RunStatus>| {
            for planned in items {
                match planned.decision {
                    Decision::Dispatch => {
                        assert!(
                            runs.insert(planned.time.at, RunStatus::Succeeded).is_none(),
                            "nothing doubled"
                        )
                    }
                    Decision::Rerun => {
                        runs.insert(planned.time.at, RunStatus::Succeeded);
                    }
                    Decision::Skip | Decision::Calendar | Decision::Overlap => {}
                }
            }
        };
        if restart_every > 1 && round % restart_every == 0 {
            // Half the batch dispatched, then the leader died; the next one reads the record.
            dispatch(&batch.items[..batch.items.len() / 2], runs);
            *progress = stored.clone();
            let again = progress.plan(schedule, |at| runs.get(&at).copied(), |_| false, 0, false, limit + 3);
            assert_eq!(
                again.items.iter().map(|p| p.time).collect::<Vec<_>>(),
                batch.items.iter().map(|p| p.time).collect::<Vec<_>>(),
                "a resumed batch is the lost one"
            );
            for (first, second) in batch.items.iter().zip(&again.items) {
                assert!(
                    second.decision == first.decision || second.decision == Decision::Skip,
                    "{first:?} {second:?}"
                );
            }
            progress.begin(&again);
            assert_eq!(progress.pending, stored.pending, "the counts decided first stay");
            dispatch(&again.items, runs);
        } else {
            dispatch(&batch.items, runs);
        }
        handed_out.extend(batch.items.iter().copied());
        progress.commit(now);
        assert!(progress.pending.is_none());
    }
    handed_out
}

#[test]
fn a_year_of_an_hourly_task_in_batches_is_every_nominal_time_once() {
    let (from, to) = (instant("2026-01-01T00:00:00Z"), instant("2027-01-01T00:00:00Z"));
    for tz in ["Europe/Berlin", "America/New_York"] {
        let schedule = Schedule::Cron(Box::new(
            crate::schedule::CronSchedule::parse("0 0 * * * *", tz).expect("valid cron"),
        ));
        let expected = nominal_times(&schedule, from, to, false).unwrap();
        let mut progress = start(request(from, to), &schedule);
        assert_eq!(progress.total, 8_759, "{tz}");
        let mut runs = BTreeMap::new();
        let handed_out = drive(&mut progress, &schedule, &mut runs, 500, 7);
        assert_eq!(handed_out.iter().map(|p| p.time).collect::<Vec<_>>(), expected, "{tz}");
        assert_eq!((progress.state, progress.cursor), (BackfillState::Finished, None), "{tz}");
        assert!(runs.keys().eq(expected.iter().map(|t| &t.at)), "each time ran once: {tz}");
        // A batch cut short by a restart keeps the counts decided for it: nothing is counted
        // as skipped that this backfill dispatched.
        assert_eq!((progress.dispatched, progress.skipped, progress.rerun), (8_759, 0, 0), "{tz}");
    }
}

#[test]
fn a_second_identical_backfill_adds_nothing_and_reprocess_failed_reruns_exactly_the_failed() {
    let from = instant("2026-01-01T00:00:00Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let req = request(from, from + TimeDelta::minutes(30));
    let mut runs = BTreeMap::new();
    drive(&mut start(req.clone(), &schedule), &schedule, &mut runs, 4, 0);
    let failed: Vec<_> = (0..30).step_by(7).map(|m| from + TimeDelta::minutes(m)).collect();
    for at in &failed {
        runs.insert(*at, RunStatus::Failed);
    }
    let mut again = start(req.clone(), &schedule);
    let handed_out = drive(&mut again, &schedule, &mut runs, 4, 0);
    assert!(handed_out.iter().all(|p| p.decision == Decision::Skip));
    assert_eq!((again.dispatched, again.skipped, again.rerun), (0, 30, 0));

    let mut rerun = start(BackfillRequest { reprocess: Reprocess::Failed, ..req }, &schedule);
    let handed_out = drive(&mut rerun, &schedule, &mut runs, 4, 0);
    let reruns: Vec<_> =
        handed_out.iter().filter(|p| p.decision == Decision::Rerun).map(|p| p.time.at).collect();
    assert_eq!(reruns, failed);
    assert_eq!((rerun.dispatched, rerun.skipped, rerun.rerun), (0, 25, 5));
}

#[test]
fn max_active_stops_a_batch_before_the_run_that_would_exceed_it() {
    let from = instant("2026-01-01T00:00:00Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let mut progress =
        start(BackfillRequest { max_active: 3, ..request(from, from + TimeDelta::hours(1)) }, &schedule);
    let done = from + TimeDelta::minutes(1);
    let existing = |at: DateTime<Utc>| (at == done).then_some(RunStatus::Succeeded);
    let batch = progress.plan(&schedule, existing, |_| false, 1, false, 100);
    let decisions: Vec<_> = batch.items.iter().map(|p| p.decision).collect();
    assert_eq!(
        decisions,
        [Decision::Dispatch, Decision::Skip, Decision::Dispatch],
        "2 free slots; a skip takes none"
    );
    assert_eq!(batch.next_cursor, Some(from + TimeDelta::minutes(3)));
    assert!(
        progress.plan(&schedule, existing, |_| false, 3, false, 100).items.is_empty(),
        "no slot, no progress"
    );
    progress.apply(&batch, from);
    assert_eq!((progress.cursor, progress.dispatched, progress.skipped), (batch.next_cursor, 2, 1));
}

#[test]
fn times_the_calendars_leave_out_take_no_slot_and_are_counted_apart() {
    let from = instant("2026-01-01T00:00:00Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let mut progress =
        start(BackfillRequest { max_active: 2, ..request(from, from + TimeDelta::minutes(6)) }, &schedule);
    // Minutes 1 and 2 are left out; minute 3 has a run already.
    let left_out =
        |at: DateTime<Utc>| at == from + TimeDelta::minutes(1) || at == from + TimeDelta::minutes(2);
    let existing = |at: DateTime<Utc>| (at == from + TimeDelta::minutes(3)).then_some(RunStatus::Failed);
    let batch = progress.plan(&schedule, existing, left_out, 0, false, 100);
    let decisions: Vec<_> = batch.items.iter().map(|p| p.decision).collect();
    assert_eq!(
        decisions,
        [Decision::Dispatch, Decision::Calendar, Decision::Calendar, Decision::Skip, Decision::Dispatch],
        "two slots: the calendars' times and a skip take none"
    );
    progress.apply(&batch, from);
    assert_eq!((progress.dispatched, progress.skipped, progress.calendar), (2, 1, 2));
    assert_eq!(progress.active.len(), 2);
    assert_eq!(progress.summary().calendar, 2);
}

#[test]
fn under_overlap_skip_only_a_time_whose_turn_finds_nothing_running_gets_a_run() {
    let from = instant("2026-01-01T00:00:00Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let skip =
        BackfillRequest { overlap: BackfillOverlap::Skip, ..request(from, from + TimeDelta::minutes(4)) };
    let mut progress = start(skip.clone(), &schedule);
    let batch = progress.plan(&schedule, |_| None, |_| false, 0, false, 100);
    let decisions: Vec<_> = batch.items.iter().map(|p| p.decision).collect();
    assert_eq!(decisions, [Decision::Dispatch, Decision::Overlap, Decision::Overlap, Decision::Overlap]);
    progress.apply(&batch, from);
    assert_eq!((progress.dispatched, progress.overlapped, progress.state), (1, 3, BackfillState::Finished));

    let busy = start(skip, &schedule);
    let batch = busy.plan(&schedule, |_| None, |_| false, 0, true, 100);
    assert!(batch.items.iter().all(|p| p.decision == Decision::Overlap), "the live run is going");
}

#[test]
fn under_overlap_buffer_one_runs_go_one_after_another_and_wait_for_the_live_run() {
    let from = instant("2026-01-01T00:00:00Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let buffer = BackfillRequest {
        overlap: BackfillOverlap::BufferOne,
        ..request(from, from + TimeDelta::minutes(3))
    };
    let mut progress = start(buffer, &schedule);
    assert!(progress.plan(&schedule, |_| None, |_| false, 0, true, 100).items.is_empty(), "the live run");
    let mut dispatched = Vec::new();
    for _ in 0..3 {
        let waiting = progress.plan(&schedule, |_| None, |_| false, 1, false, 100);
        assert!(waiting.items.is_empty(), "its own run is going");
        let in_flight = progress.settle(|_| true);
        let batch = progress.plan(&schedule, |_| None, |_| false, in_flight, false, 100);
        assert_eq!(batch.items.len(), 1, "one run at a time");
        dispatched.push(batch.items[0].time.at);
        progress.apply(&batch, from);
    }
    assert_eq!(dispatched, [from, from + TimeDelta::minutes(1), from + TimeDelta::minutes(2)]);
    assert_eq!((progress.dispatched, progress.overlapped, progress.state), (3, 0, BackfillState::Finished));
}

#[test]
fn a_backfill_overlap_that_would_cancel_runs_is_refused_by_name() {
    assert_eq!(BackfillOverlap::parse("buffer_one"), Ok(BackfillOverlap::BufferOne));
    for policy in ["cancel_other", "replace", "buffer_all"] {
        let error = BackfillOverlap::parse(policy).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("overlap"));
        assert!(error.message.contains("use allow, skip or buffer_one"), "{error}");
    }
}

#[test]
fn max_active_zero_bounds_nothing_and_tracks_no_run() {
    let from = instant("2026-01-01T00:00:00Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let mut progress = start(
        BackfillRequest { max_active: UNBOUNDED, ..request(from, from + TimeDelta::hours(2)) },
        &schedule,
    );
    let batch = progress.plan(&schedule, |_| None, |_| false, 0, false, 1000);
    assert_eq!(batch.items.len(), 120, "every time at once");
    progress.apply(&batch, from);
    assert_eq!((progress.dispatched, progress.state), (120, BackfillState::Finished));
    assert!(progress.active.is_empty(), "nothing tracked");
    let with_overlap = BackfillRequest {
        max_active: UNBOUNDED,
        overlap: BackfillOverlap::Skip,
        ..request(from, from + TimeDelta::hours(1))
    };
    let fields: Vec<_> = with_overlap
        .check(Some(&schedule))
        .unwrap_err()
        .into_vec()
        .into_iter()
        .filter_map(|e| e.field)
        .collect();
    assert_eq!(fields, ["max_active"]);
}

#[test]
fn a_cancelled_backfill_plans_nothing_and_keeps_its_cursor() {
    let from = instant("2026-01-01T00:00:00Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let mut progress = start(request(from, from + TimeDelta::hours(1)), &schedule);
    let batch = progress.plan(&schedule, |_| None, |_| false, 0, false, 5);
    progress.apply(&batch, from);
    assert!(progress.cancel(from));
    assert!(!progress.cancel(from), "already ended");
    assert_eq!(progress.state, BackfillState::Cancelled);
    assert!(progress.plan(&schedule, |_| None, |_| false, 0, false, 5).items.is_empty());
    progress.apply(&batch, from);
    assert_eq!((progress.cursor, progress.dispatched), (Some(from + TimeDelta::minutes(5)), 5), "unchanged");
}

#[test]
fn a_range_without_nominal_times_is_finished_at_once() {
    let from = instant("2026-01-01T00:00:30Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let progress = start(request(from, from + TimeDelta::seconds(10)), &schedule);
    assert_eq!((progress.state, progress.cursor, progress.total), (BackfillState::Finished, None, 0));
}

#[test]
fn a_bad_request_names_every_problem() {
    let from = instant("2026-01-01T00:00:00Z");
    let bad = BackfillRequest { max_active: MAX_ACTIVE_LIMIT + 1, ..request(from, from) };
    let fields = |errors: ApiErrors| {
        errors.into_vec().into_iter().map(|e| e.field.unwrap_or_default()).collect::<Vec<_>>()
    };
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    assert_eq!(fields(bad.check(Some(&schedule)).unwrap_err()), ["to", "max_active"]);
    assert_eq!(fields(bad.check(None).unwrap_err()), ["task", "to", "max_active"]);
    let too_many =
        BackfillRequest { max_active: MAX_ACTIVE_LIMIT + 1, ..request(from, from + TimeDelta::hours(1)) };
    let every_ms = every(1, from);
    assert_eq!(fields(too_many.check(Some(&every_ms)).unwrap_err()), ["to", "max_active"]);
}

#[test]
fn the_record_round_trips_through_json() {
    let from = instant("2026-01-01T00:00:00Z");
    let schedule = every(60_000, DateTime::UNIX_EPOCH);
    let progress = start(request(from, from + TimeDelta::hours(1)), &schedule);
    let json = serde_json::to_value(&progress).unwrap();
    assert_eq!(json["state"], "running");
    assert_eq!(json["cursor"], "2026-01-01T00:00:00.000Z");
    assert_eq!(json["reprocess"], "none");
    assert_eq!(serde_json::from_value::<BackfillProgress>(json).unwrap(), progress);
}

proptest! {
    /// Whatever the batch size, direction and restarts, a backfill hands out exactly the
    /// plan's nominal times, each once, in the plan's order.
    #[test]
    fn batches_hand_out_exactly_the_plan(
        interval_ms in 1_000u64..3_600_000,
        from_ms in 1_700_000_000_000i64..1_800_000_000_000,
        count in 0i64..300,
        extra_ms in 1i64..1_000,
        limit in 1usize..50,
        restart_every in 0usize..5,
        backwards in any::<bool>(),
        max_active in 1u32..20,
    ) {
        let at = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap();
        let schedule = every(interval_ms, DateTime::UNIX_EPOCH);
        let (from, to) = (at(from_ms), at(from_ms + count * interval_ms as i64 + extra_ms));
        let expected = nominal_times(&schedule, from, to, backwards).unwrap();
        let mut progress = start(BackfillRequest { backwards, max_active, ..request(from, to) }, &schedule);
        let handed_out = drive(&mut progress, &schedule, &mut BTreeMap::new(), limit, restart_every);
        prop_assert_eq!(handed_out.iter().map(|p| p.time).collect::<Vec<_>>(), expected);
        prop_assert_eq!(progress.dispatched + progress.skipped, progress.total);
        prop_assert_eq!(progress.state, BackfillState::Finished);
    }
}
