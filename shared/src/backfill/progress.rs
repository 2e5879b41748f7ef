//! A backfill's execution, pure: the request checked at the edge (every problem named at
//! once), the durable progress record (state, cursor, counts) and the next bounded batch of
//! nominal times a leader dispatches from the cursor. The leader passes the schedule, the
//! clock, the existing runs and the runs in flight; it stores the record after each batch, so
//! a new leader resumes from the stored cursor.
//!
//! A batch is written ahead: the leader stores it as `pending` (its length, its counts, the
//! execution ids it starts and the cursor after it) before dispatching, and folds it into the
//! counts once every dispatch is acknowledged. A new leader that finds a pending batch plans
//! the same nominal times again and dispatches those still without a run record; their
//! dispatches carry the same derived ids (absorbed by the dispatch stream's de-duplication or
//! the worker's run-record check), and the counts stay those decided the first time, so a
//! leader's death neither doubles a run nor turns a dispatched time into a skipped one.
//!
//! Runs in flight (`--max-active`) are the execution ids the backfill started whose run record
//! is not final yet, kept in the record (`active`, at most `max_active`) and settled from the
//! run records before each batch.

#[cfg(test)]
mod tests;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use super::{BackfillOverlap, Decision, NominalTime, Reprocess, decide_with, nominal_times};
use crate::error::{ApiError, ApiErrors, ErrorCode};
use crate::schedule::Schedule;
use crate::wire::{BackfillSummary, RunStatus, millis};

/// The most runs of one backfill in flight that `--max-active` may ask for.
pub const MAX_ACTIVE_LIMIT: u32 = 1_000;
/// Runs in flight when `--max-active` is not given.
pub const DEFAULT_MAX_ACTIVE: u32 = 10;
/// `max_active` 0: no bound on the runs in flight. Every time is dispatched as fast as the
/// leader can and the runs wait in the work queue for the workers' permits; none is tracked.
pub const UNBOUNDED: u32 = 0;

/// What starting a backfill asks for, before it is checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillRequest {
    #[serde(with = "millis")]
    pub from: DateTime<Utc>,
    #[serde(with = "millis")]
    pub to: DateTime<Utc>,
    #[serde(default)]
    pub reprocess: Reprocess,
    #[serde(default = "default_max_active")]
    pub max_active: u32,
    #[serde(default)]
    pub backwards: bool,
    /// What a time does while a run of the task is going.
    #[serde(default)]
    pub overlap: BackfillOverlap,
    /// Whether the backfilled runs start the task's children (tasks with `after`) as its live
    /// runs do; default true (stored only when false).
    #[serde(default = "chained", skip_serializing_if = "is_chained")]
    pub chain: bool,
}

fn default_max_active() -> u32 {
    DEFAULT_MAX_ACTIVE
}

fn chained() -> bool {
    true
}

fn is_chained(chain: &bool) -> bool {
    *chain
}

impl BackfillRequest {
    /// The number of nominal times the request covers, or every problem with it: an unknown
    /// task (`schedule` is `None`; field `task`), an empty or reversed range or too many times
    /// (field `to`), `max_active` above [`MAX_ACTIVE_LIMIT`], or 0 (no bound) with an overlap
    /// other than `allow`.
    pub fn check(&self, schedule: Option<&Schedule>) -> Result<usize, ApiErrors> {
        let mut problems = Vec::new();
        let mut count = 0;
        match schedule {
            None => problems.push(ApiError::at(ErrorCode::NotFound, "task", "no such task")),
            Some(schedule) => match nominal_times(schedule, self.from, self.to, self.backwards) {
                Ok(times) => count = times.len(),
                Err(problem) => problems.push(problem),
            },
        }
        if schedule.is_none() && self.from >= self.to {
            problems.push(ApiError::at(ErrorCode::InvalidValue, "to", "must be after from"));
        }
        if self.max_active > MAX_ACTIVE_LIMIT {
            problems.push(ApiError::at(
                ErrorCode::InvalidValue,
                "max_active",
                format!("must be between 0 (no bound) and {MAX_ACTIVE_LIMIT}"),
            ));
        }
        if self.max_active == UNBOUNDED && self.overlap != BackfillOverlap::Allow {
            problems.push(ApiError::at(
                ErrorCode::InvalidValue,
                "max_active",
                "0 (no bound) tracks no run in flight: an overlap other than allow needs 1 or more",
            ));
        }
        match ApiErrors::from_vec(problems) {
            Some(errors) => Err(errors),
            None => Ok(count),
        }
    }
}

/// Where a backfill stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackfillState {
    /// Nominal times remain to be dispatched.
    Running,
    /// Every nominal time was dispatched or skipped.
    Finished,
    /// Stopped on request; the times before the cursor were handled, the rest never will be.
    Cancelled,
}

/// The durable progress of one backfill: what it covers, its state, the next nominal time to
/// handle (`cursor`, none once every time is handled) and its counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillProgress {
    pub id: String,
    pub namespace: String,
    pub task_id: String,
    #[serde(flatten)]
    pub request: BackfillRequest,
    pub state: BackfillState,
    #[serde(with = "millis::option")]
    pub cursor: Option<DateTime<Utc>>,
    pub total: u64,
    pub dispatched: u64,
    pub skipped: u64,
    pub rerun: u64,
    /// Times the task's business calendars leave out (excluded, or merged into the fire a
    /// shift lands on).
    #[serde(default)]
    pub calendar: u64,
    /// Times skipped because a run of the task was going (`overlap: skip`).
    #[serde(default)]
    pub overlapped: u64,
    #[serde(with = "millis")]
    pub started_at: DateTime<Utc>,
    #[serde(with = "millis::option")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Execution ids started by this backfill whose run has not ended (by its run record).
    #[serde(default)]
    pub active: Vec<String>,
    /// The batch being dispatched, written ahead of its dispatches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
}

/// A batch written ahead of its dispatches: how many nominal times from the cursor it covers,
/// what it decided for them, the execution ids it starts and the cursor after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub times: u32,
    #[serde(with = "millis::option")]
    pub next_cursor: Option<DateTime<Utc>>,
    pub dispatched: u64,
    pub skipped: u64,
    pub rerun: u64,
    #[serde(default)]
    pub calendar: u64,
    #[serde(default)]
    pub overlapped: u64,
    pub started: Vec<String>,
}

/// One nominal time of a batch and what is done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub time: NominalTime,
    pub decision: Decision,
}

/// The next nominal times to handle, in order, and the cursor after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub items: Vec<Planned>,
    pub next_cursor: Option<DateTime<Utc>>,
}

impl BackfillProgress {
    /// What the `backfill.*` events carry of it.
    pub fn summary(&self) -> BackfillSummary {
        BackfillSummary {
            id: self.id.clone(),
            state: format!("{:?}", self.state).to_lowercase(),
            cursor: self.cursor,
            total: self.total,
            dispatched: self.dispatched,
            skipped: self.skipped,
            rerun: self.rerun,
            calendar: self.calendar,
            overlapped: self.overlapped,
        }
    }

    /// A backfill that has handled nothing yet; `Finished` at once when the range is empty of
    /// nominal times.
    pub fn start(
        id: String,
        namespace: String,
        task_id: String,
        request: BackfillRequest,
        schedule: &Schedule,
        now: DateTime<Utc>,
    ) -> Result<BackfillProgress, ApiErrors> {
        let total = request.check(Some(schedule))?;
        let first = if request.backwards {
            last_before(schedule, request.from, request.to)
        } else {
            first_at_or_after(schedule, request.from, request.to)
        };
        let (state, finished_at) = if first.is_some() {
            (BackfillState::Running, None)
        } else {
            (BackfillState::Finished, Some(now))
        };
        Ok(BackfillProgress {
            id,
            namespace,
            task_id,
            request,
            state,
            cursor: first,
            total: total as u64,
            dispatched: 0,
            skipped: 0,
            rerun: 0,
            calendar: 0,
            overlapped: 0,
            started_at: now,
            finished_at,
            active: Vec::new(),
            pending: None,
        })
    }

    /// The nominal times the next [`plan`](Self::plan) examines: the pending batch's, or up
    /// to `limit` from the cursor. The leader reads their run records first.
    pub fn upcoming(&self, schedule: &Schedule, limit: usize) -> Vec<NominalTime> {
        let Some(cursor) = self.cursor else { return Vec::new() };
        match &self.pending {
            Some(pending) => self.window(schedule, cursor, pending.times as usize),
            None if self.state == BackfillState::Running => self.window(schedule, cursor, limit.max(1)),
            None => Vec::new(),
        }
    }

    /// The next batch from the cursor: at most `limit` nominal times (so the leader yields to
    /// due fires between batches), stopping before the first one that would start a run once
    /// `max_active` runs are in flight. `existing` is the status of a time's run under the
    /// live fire's id (`None`: no record); `left_out` says whether the task's calendars keep
    /// a time from running on its own; `live_going` whether the live schedule's latest run is
    /// going (read only under an `overlap` other than `allow`, which also takes the
    /// backfill's runs in flight as going: `skip` skips the times whose turn comes meanwhile,
    /// `buffer_one` stops the batch before them). A pending batch is planned again as it was:
    /// only the runs it recorded as started are dispatched, and a time that has a run record
    /// by now is not dispatched again, whatever the slots. Empty when the backfill is not
    /// running and has no pending batch.
    pub fn plan(
        &self,
        schedule: &Schedule,
        existing: impl Fn(DateTime<Utc>) -> Option<RunStatus>,
        left_out: impl Fn(DateTime<Utc>) -> bool,
        in_flight: u32,
        live_going: bool,
        limit: usize,
    ) -> Batch {
        let decide = |at| decide_with(self.request.reprocess, left_out(at), existing(at));
        let Some(cursor) = self.cursor else {
            return Batch { items: Vec::new(), next_cursor: None };
        };
        if let Some(pending) = &self.pending {
            let items = self
                .window(schedule, cursor, pending.times as usize)
                .into_iter()
                .map(|time| {
                    let mut planned = Planned { time, decision: decide(time.at) };
                    if planned.decision.starts_run() && !pending.started.contains(&self.ids_of(&planned).1) {
                        // Not started by the first plan (skipped, left out, or an overlap).
                        planned.decision = Decision::Skip;
                    }
                    planned
                })
                .collect();
            return Batch { items, next_cursor: pending.next_cursor };
        }
        if self.state != BackfillState::Running {
            return Batch { items: Vec::new(), next_cursor: self.cursor };
        }
        let window = self.window(schedule, cursor, limit.max(1) + 1);
        let overlap = self.request.overlap;
        let mut going = overlap != BackfillOverlap::Allow && (in_flight > 0 || live_going);
        let mut slots = match self.request.max_active {
            UNBOUNDED => u32::MAX,
            max_active => max_active.saturating_sub(in_flight),
        };
        let mut items = Vec::new();
        for time in window.iter().take(limit.max(1)) {
            let mut decision = decide(time.at);
            if decision.starts_run() {
                match overlap {
                    BackfillOverlap::Skip if going => decision = Decision::Overlap,
                    BackfillOverlap::BufferOne if going => {
                        return Batch { items, next_cursor: Some(time.at) };
                    }
                    _ if slots == 0 => return Batch { items, next_cursor: Some(time.at) },
                    _ => {
                        slots -= 1;
                        going = overlap != BackfillOverlap::Allow;
                    }
                }
            }
            items.push(Planned { time: *time, decision });
        }
        Batch { items, next_cursor: window.get(limit.max(1)).map(|time| time.at) }
    }

    /// The message id and execution id a planned time is dispatched with (a rerun's derive
    /// from this backfill's id too).
    pub fn ids_of(&self, planned: &Planned) -> (String, String) {
        let rerun_by = (planned.decision == Decision::Rerun).then_some(self.id.as_str());
        super::ids(&self.namespace, &self.task_id, planned.time.at.timestamp_millis(), rerun_by)
    }

    /// Writes `batch` ahead of its dispatches: its counts, the runs it starts and the cursor
    /// after it, kept as `pending` until [`commit`](Self::commit). A pending batch planned
    /// again keeps what was decided the first time.
    pub fn begin(&mut self, batch: &Batch) {
        if self.pending.is_some() || (self.state != BackfillState::Running) {
            return;
        }
        let mut pending = Pending {
            times: batch.items.len() as u32,
            next_cursor: batch.next_cursor,
            dispatched: 0,
            skipped: 0,
            rerun: 0,
            calendar: 0,
            overlapped: 0,
            started: Vec::new(),
        };
        for planned in &batch.items {
            match planned.decision {
                Decision::Dispatch => pending.dispatched += 1,
                Decision::Skip => pending.skipped += 1,
                Decision::Rerun => pending.rerun += 1,
                Decision::Calendar => pending.calendar += 1,
                Decision::Overlap => pending.overlapped += 1,
            }
            if planned.decision.starts_run() {
                pending.started.push(self.ids_of(planned).1);
            }
        }
        self.pending = Some(pending);
    }

    /// The pending batch is dispatched: its counts are added, its runs are in flight, the
    /// cursor moves past it, and a running backfill with no time left is `Finished`. A
    /// cancelled backfill keeps its state (the batch under way when it was cancelled finishes).
    pub fn commit(&mut self, now: DateTime<Utc>) {
        let Some(pending) = self.pending.take() else { return };
        self.dispatched += pending.dispatched;
        self.skipped += pending.skipped;
        self.rerun += pending.rerun;
        self.calendar += pending.calendar;
        self.overlapped += pending.overlapped;
        if self.request.max_active != UNBOUNDED {
            self.active.extend(pending.started);
        }
        self.cursor = pending.next_cursor;
        if self.cursor.is_none() && self.state == BackfillState::Running {
            self.state = BackfillState::Finished;
            self.finished_at = Some(now);
        }
    }

    /// Records a batch as handled at once ([`begin`](Self::begin) then
    /// [`commit`](Self::commit)).
    pub fn apply(&mut self, batch: &Batch, now: DateTime<Utc>) {
        self.begin(batch);
        self.commit(now);
    }

    /// Drops the runs in flight whose run has ended (`ended` reads their run records); the
    /// number still in flight.
    pub fn settle(&mut self, ended: impl Fn(&str) -> bool) -> u32 {
        self.active.retain(|execution_id| !ended(execution_id));
        self.active.len() as u32
    }

    /// Stops a running backfill; `false` when it had already ended.
    pub fn cancel(&mut self, now: DateTime<Utc>) -> bool {
        if self.state != BackfillState::Running {
            return false;
        }
        self.state = BackfillState::Cancelled;
        self.finished_at = Some(now);
        true
    }

    /// Up to `count` nominal times from `cursor` on, in the backfill's direction.
    fn window(&self, schedule: &Schedule, cursor: DateTime<Utc>, count: usize) -> Vec<NominalTime> {
        let (from, to) = (self.request.from, self.request.to);
        if self.request.backwards {
            // Newest first: the times of `[from, cursor]`. Schedules only step forwards, so the
            // range is walked from `from`; it is bounded by `MAX_TIMES`.
            let end = (cursor + TimeDelta::milliseconds(1)).min(to);
            let mut times = nominal_times(schedule, from, end, true).unwrap_or_default();
            times.truncate(count);
            times
        } else {
            let mut times = Vec::with_capacity(count);
            let mut at = cursor - TimeDelta::milliseconds(1);
            while times.len() < count {
                let Some(next) = schedule.next_after(at).filter(|next| *next < to) else { break };
                times.push(NominalTime { at: next, dst: super::dst_mark(schedule, next) });
                at = next;
            }
            times
        }
    }
}

/// The first nominal time in `[from, to)`.
fn first_at_or_after(schedule: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule.next_after(from - TimeDelta::milliseconds(1)).filter(|next| *next < to)
}

/// The last nominal time in `[from, to)`.
fn last_before(schedule: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Option<DateTime<Utc>> {
    nominal_times(schedule, from, to, true).ok().and_then(|times| times.first().map(|time| time.at))
}
