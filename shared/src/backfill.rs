//! Backfill planning: every nominal time of a task's schedule in `[from, to)`, each with its
//! DST mark, its execution id and what an existing run of that time means for it. Pure: time
//! and run records are parameters.
//!
//! Identity: a backfilled nominal time is the same run as the live schedule's fire of that
//! time: the same `Nats-Msg-Id` ([`crate::names::dispatch_msg_id`]) and the same execution id
//! ([`crate::wire::scheduled_execution_id`]). The schedule promises one run per nominal time;
//! a backfill fills the times that have none, so a live fire and a backfill of one time must
//! not become two runs, and whichever comes second is absorbed by de-duplication (within the
//! duplicate window) or recognised by the worker from the run record keyed by that id (beyond
//! it). Only a rerun asked for with `--reprocess` is a run of its own: its ids derive from the
//! nominal time and the backfill's id ([`crate::names::backfill_rerun_msg_id`]), so the same
//! backfill resumed dispatches each rerun once and never masks the live run of that time.

pub mod progress;
#[cfg(test)]
mod tests;

use chrono::{DateTime, Offset, TimeDelta, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorCode};
use crate::names;
use crate::schedule::Schedule;
use crate::wire::{self, RunStatus};

/// The most nominal times one backfill covers.
pub const MAX_TIMES: usize = 1_000_000;

/// Which nominal times that already have a run are dispatched again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Reprocess {
    /// None: a time with a run is skipped.
    #[default]
    None,
    /// Times whose run failed (`failed` or `dead`) run again.
    Failed,
    /// Every time whose run has ended runs again (a run still in progress is left alone).
    All,
}

/// What a backfill does with a time whose turn comes while a run of the task is going (one
/// of the backfill's own, or the live schedule's latest run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum BackfillOverlap {
    /// Dispatched anyway: up to `max_active` of the backfill's runs at once, beside the live
    /// schedule's.
    #[default]
    Allow,
    /// Skipped (counted in `overlap`): only times whose turn comes while nothing of the task
    /// runs get a run, one at a time.
    Skip,
    /// Waits until nothing of the task runs, then is dispatched: the backfill's runs go one
    /// after another, nothing skipped.
    BufferOne,
}

impl BackfillOverlap {
    /// Reads the request's `overlap`; the task policies that cancel runs are refused by name.
    pub fn parse(text: &str) -> Result<BackfillOverlap, ApiError> {
        match text {
            "allow" => Ok(BackfillOverlap::Allow),
            "skip" => Ok(BackfillOverlap::Skip),
            "buffer_one" => Ok(BackfillOverlap::BufferOne),
            "cancel_other" | "replace" => Err(ApiError::at(
                ErrorCode::InvalidValue,
                "overlap",
                format!("{text:?} cancels runs, which a backfill never does: use allow, skip or buffer_one"),
            )),
            other => Err(ApiError::at(
                ErrorCode::InvalidValue,
                "overlap",
                format!("{other:?} is not an overlap policy for a backfill: use allow, skip or buffer_one"),
            )),
        }
    }
}

/// How a nominal time relates to a daylight-saving change of the schedule's zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DstMark {
    /// At the instant clocks jump forward: a matching wall time in the skipped hour fires here,
    /// once (together with a match at the first wall time after the gap).
    Gap,
    /// A wall time the fall-back change repeats: fires once, at its first occurrence.
    Fold,
}

/// One nominal time of a backfill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NominalTime {
    pub at: DateTime<Utc>,
    pub dst: Option<DstMark>,
}

/// What a backfill does with one nominal time, given the run record of its live id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// No run yet: dispatched with the live schedule's ids.
    Dispatch,
    /// A run exists and `--reprocess` leaves it.
    Skip,
    /// A run exists and `--reprocess` asks for another: dispatched with rerun ids.
    Rerun,
    /// The task's business calendars leave it out: an `exclude` calendar skips it, or it is
    /// shifted onto the schedule's previous fire and runs once, as that fire
    /// ([`crate::calendar::fate_of`]).
    Calendar,
    /// Its turn came while a run of the task was going, under `overlap: skip`.
    Overlap,
}

impl Decision {
    /// Whether the time is dispatched (a first run or a rerun).
    pub fn starts_run(self) -> bool {
        matches!(self, Decision::Dispatch | Decision::Rerun)
    }
}

/// Decides one nominal time from its calendars (`left_out`: they keep it from running on its
/// own) and the status of its existing run (`None`: no record).
pub fn decide_with(reprocess: Reprocess, left_out: bool, existing: Option<RunStatus>) -> Decision {
    if left_out { Decision::Calendar } else { decide(reprocess, existing) }
}

/// Decides one nominal time from the status of its existing run (`None`: no record).
pub fn decide(reprocess: Reprocess, existing: Option<RunStatus>) -> Decision {
    match (existing, reprocess) {
        (None, _) => Decision::Dispatch,
        (Some(RunStatus::Failed | RunStatus::Dead), Reprocess::Failed) => Decision::Rerun,
        (Some(status), Reprocess::All) if status.is_final() => Decision::Rerun,
        (Some(_), _) => Decision::Skip,
    }
}

/// The message id and execution id of a nominal time: the live schedule's for a first run, a
/// rerun's (derived from `backfill_id` too) for a rerun.
pub fn ids(namespace: &str, task_id: &str, nominal_ms: i64, rerun_by: Option<&str>) -> (String, String) {
    let msg_id = match rerun_by {
        None => names::dispatch_msg_id(namespace, task_id, nominal_ms),
        Some(backfill_id) => names::backfill_rerun_msg_id(namespace, task_id, nominal_ms, backfill_id),
    };
    let execution_id = wire::execution_id_of_fire(&msg_id);
    (msg_id, execution_id)
}

/// Every nominal time of `schedule` in `[from, to)`, oldest first (newest first when
/// `backwards`), each marked when a DST change touches it. Refused: an empty or reversed
/// range (`from`, `to`), and more than [`MAX_TIMES`] times (`to`).
pub fn nominal_times(
    schedule: &Schedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    backwards: bool,
) -> Result<Vec<NominalTime>, ApiError> {
    if from >= to {
        return Err(ApiError::at(ErrorCode::InvalidValue, "to", "must be after from"));
    }
    let mut times = Vec::new();
    // The first fire at or after `from`: `next_after` is strictly after.
    let mut cursor = from - TimeDelta::milliseconds(1);
    while let Some(next) = schedule.next_after(cursor).filter(|next| *next < to) {
        if times.len() == MAX_TIMES {
            return Err(ApiError::at(
                ErrorCode::InvalidValue,
                "to",
                format!("the range holds more than {MAX_TIMES} nominal times; split it"),
            ));
        }
        times.push(NominalTime { at: next, dst: dst_mark(schedule, next) });
        cursor = next;
    }
    if backwards {
        times.reverse();
    }
    Ok(times)
}

/// The DST mark of the nominal time `at` of `schedule` (cron schedules only: the others run
/// on UTC).
pub fn dst_mark(schedule: &Schedule, at: DateTime<Utc>) -> Option<DstMark> {
    let Schedule::Cron(cron) = schedule else { return None };
    let tz = cron.timezone();
    let offset = |t: DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix().local_minus_utc();
    let before = at - TimeDelta::seconds(1);
    if offset(before) < offset(at) {
        return Some(DstMark::Gap);
    }
    let local = at.with_timezone(&tz).naive_local();
    tz.from_local_datetime(&local).single().is_none().then_some(DstMark::Fold)
}
