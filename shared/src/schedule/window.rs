//! The window of a task's fires: the part of its schedule that `start_at`, `end_at` and
//! `max_runs` leave, computed from the spec alone.
//!
//! The window is `[start, end)`: `start` is `start_at`; `end` is `end_at`, or the instant just
//! after the `max_runs`-th nominal fire at or after `start_at`, whichever comes first. The
//! `max_runs`-th fire is computed from the schedule, never counted by a scheduler, so every
//! replica (and a new leader after a crash) agrees on the last fire without any memory of
//! what was dispatched: a fire past it is never made, and the last one is never lost.

use chrono::{DateTime, TimeDelta, Utc};

use super::Schedule;

/// What ends a task's fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// `end_at` comes before the `max_runs`-th fire (or there is no `max_runs`).
    EndAt,
    /// The `max_runs`-th fire is the last.
    MaxRuns,
    /// A one-shot (`at`) fires once.
    OneShot,
}

impl EndReason {
    /// The spelling in events (`reason` of `task.completed`) and replies.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::EndAt => "end_at",
            EndReason::MaxRuns => "max_runs",
            EndReason::OneShot => "one_shot",
        }
    }
}

/// The instants a task's fires may have. `Window::default()` lets every fire through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// No fire before this instant (inclusive bound).
    pub start: Option<DateTime<Utc>>,
    /// Every fire is before this instant (exclusive bound).
    pub end: Option<DateTime<Utc>>,
    /// What sets `end` (`None` when nothing ends the fires).
    pub ends_by: Option<EndReason>,
    /// The `max_runs`-th fire, when `max_runs` ends the window.
    last: Option<DateTime<Utc>>,
    /// `max_runs`, as given.
    max_runs: Option<u32>,
}

const MS: TimeDelta = TimeDelta::milliseconds(1);

impl Window {
    /// The window of `schedule` bounded by `start_at` (inclusive), `end_at` (exclusive) and
    /// `max_runs` (counted from `start_at`; without a `start_at`, which admission always
    /// fills in when `max_runs` is given, the count does not bound the window).
    pub fn new(
        schedule: &Schedule,
        start_at: Option<DateTime<Utc>>,
        end_at: Option<DateTime<Utc>>,
        max_runs: Option<u32>,
    ) -> Window {
        Window::counted_by(schedule, start_at, end_at, max_runs, |start, n| nth_fire(schedule, start, n))
    }

    /// [`new`](Self::new), with the `max_runs`-th fire found by `nth` (given `start_at` and
    /// `max_runs`): a task's business calendars leave out the fires that do not run on their own
    /// ([`crate::calendar::Fires::nth_run`]).
    pub fn counted_by(
        schedule: &Schedule,
        start_at: Option<DateTime<Utc>>,
        end_at: Option<DateTime<Utc>>,
        max_runs: Option<u32>,
        nth: impl FnOnce(DateTime<Utc>, u32) -> Option<DateTime<Utc>>,
    ) -> Window {
        if let Schedule::At(at) = schedule {
            return Window {
                end: at.checked_add_signed(MS),
                ends_by: Some(EndReason::OneShot),
                last: Some(*at),
                ..Window::default()
            };
        }
        let mut window = Window {
            start: start_at,
            end: end_at,
            ends_by: end_at.map(|_| EndReason::EndAt),
            last: None,
            max_runs,
        };
        if let (Some(n), Some(start)) = (max_runs, start_at)
            && let Some(nth) = nth(start, n)
            && end_at.is_none_or(|end| nth < end)
        {
            window.end = nth.checked_add_signed(MS);
            window.ends_by = Some(EndReason::MaxRuns);
            window.last = Some(nth);
        }
        window
    }

    /// Whether `at` lies in the window.
    pub fn contains(&self, at: DateTime<Utc>) -> bool {
        self.start.is_none_or(|start| at >= start) && self.end.is_none_or(|end| at < end)
    }

    /// The next fire of `schedule` in the window strictly after `after`.
    pub fn next_after(&self, schedule: &Schedule, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let after = match self.start {
            Some(start) if after < start => start.checked_sub_signed(MS).unwrap_or(start),
            _ => after,
        };
        schedule.next_after(after).filter(|next| self.end.is_none_or(|end| *next < end))
    }

    /// The last fire of `schedule` in the window, when something ends it and it holds a fire.
    pub fn last_fire(&self, schedule: &Schedule) -> Option<DateTime<Utc>> {
        if let Some(last) = self.last {
            return Some(last);
        }
        let end = self.end?;
        let last = schedule.fires_up_to(end.checked_sub_signed(MS)?, 1).pop()?;
        self.contains(last).then_some(last)
    }

    /// How many of the task's `max_runs` fires are left after `cursor` (the last fire made, or
    /// `None` before the first); `None` without `max_runs`.
    pub fn remaining_runs(&self, schedule: &Schedule, cursor: Option<DateTime<Utc>>) -> Option<u32> {
        let max = self.max_runs?;
        let mut cursor = match cursor {
            Some(cursor) => cursor,
            None => match self.start {
                Some(start) => start.checked_sub_signed(MS)?,
                None => return Some(max),
            },
        };
        let mut left = 0;
        while left < max {
            let Some(next) = self.next_after(schedule, cursor) else { break };
            left += 1;
            cursor = next;
        }
        Some(left)
    }

    /// [`remaining_runs`](Self::remaining_runs) counted over `runs`, the nominal times that run
    /// on their own from `start_at` on, in order (under business calendars,
    /// [`crate::calendar::Fires::own_runs`]).
    pub fn remaining_runs_of(
        &self,
        runs: impl Iterator<Item = DateTime<Utc>>,
        cursor: Option<DateTime<Utc>>,
    ) -> Option<u32> {
        let max = self.max_runs?;
        let left = runs
            .take_while(|at| self.end.is_none_or(|end| *at < end))
            .filter(|at| cursor.is_none_or(|cursor| *at > cursor))
            .take(max as usize)
            .count();
        Some(left as u32)
    }
}

/// The `n`-th fire (`n >= 1`) of `schedule` at or after `start`; `None` when it has fewer.
pub fn nth_fire(schedule: &Schedule, start: DateTime<Utc>, n: u32) -> Option<DateTime<Utc>> {
    let first = schedule.next_after(start.checked_sub_signed(MS)?)?;
    if let Schedule::Every { interval, .. } = schedule {
        let step = i64::try_from(interval.as_millis()).ok()?.max(1);
        let steps = i64::from(n.checked_sub(1)?);
        return first.checked_add_signed(TimeDelta::try_milliseconds(step.checked_mul(steps)?)?);
    }
    let mut fire = first;
    for _ in 1..n {
        fire = schedule.next_after(fire)?;
    }
    Some(fire)
}

#[cfg(test)]
mod tests;
