//! Which nominal fires of a schedule run on their own under a task's calendars: the count
//! behind `max_runs` (a fire the calendars skip, shift out of the task's bounds or merge into
//! another never runs on its own, so it does not count), and the fate of one nominal time seen
//! alone (what a backfill of that time does).
//!
//! Pure, like [`decide`]: every scheduler replica, the registry's previews and a backfill
//! compute the same answer from the same calendars.

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;

use super::rules::{CalendarRef, Decision, decide};
use super::{Calendars, Refusal};
use crate::schedule::Schedule;

/// The nominal fires a count looks at, at most: past them (a calendar refusing nearly every
/// fire for decades) a `max_runs` window ends at `end_at`, or never.
pub const MAX_COUNTED_FIRES: usize = 200_000;

const MS: TimeDelta = TimeDelta::milliseconds(1);

/// A task's schedule with its calendars and bounds: what decides whether a fire runs.
#[derive(Clone, Copy)]
pub struct Fires<'a> {
    pub schedule: &'a Schedule,
    pub zone: Tz,
    pub refs: &'a [CalendarRef],
    pub calendars: &'a Calendars,
    /// `start_at` (inclusive): a fire shifted before it does not run.
    pub start: DateTime<Utc>,
    /// `end_at` (exclusive): no nominal fire at or after it, and a fire shifted to or past it
    /// does not run.
    pub end_at: Option<DateTime<Utc>>,
}

impl Fires<'_> {
    /// The nominal times from `start` on that run on their own, in order: a fire the calendars
    /// skip, shift out of `[start, end_at)`, or shift to or before the effective time of the
    /// last fire that runs is left out. At most [`MAX_COUNTED_FIRES`] nominal fires are looked at.
    pub fn own_runs(self) -> impl Iterator<Item = DateTime<Utc>> {
        let end_at = self.end_at;
        let in_bounds = move |at: DateTime<Utc>| at >= self.start && end_at.is_none_or(|end| at < end);
        let mut after = self.start.checked_sub_signed(MS);
        let mut last_effective: Option<DateTime<Utc>> = None;
        let mut looked = 0;
        std::iter::from_fn(move || {
            while looked < MAX_COUNTED_FIRES {
                let nominal = self.schedule.next_after(after?)?;
                if end_at.is_some_and(|end| nominal >= end) {
                    return None;
                }
                looked += 1;
                after = Some(nominal);
                let runs_at = match decide(self.refs, self.calendars, nominal, self.zone) {
                    Decision::Fire => Some(nominal),
                    Decision::Shift { at, .. } => Some(at).filter(|at| in_bounds(*at)),
                    Decision::Skip(_) => None,
                };
                if let Some(at) = runs_at.filter(|at| last_effective.is_none_or(|last| *at > last)) {
                    last_effective = Some(at);
                    return Some(nominal);
                }
            }
            None
        })
    }

    /// The nominal time of the `n`-th fire (`n >= 1`) that runs on its own.
    pub fn nth_run(self, n: u32) -> Option<DateTime<Utc>> {
        self.own_runs().nth(usize::try_from(n.checked_sub(1)?).ok()?)
    }
}

/// What the calendars do with one nominal time seen alone (as a backfill sees it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// It runs, at its nominal time or shifted (`shifted` names the calendar and where to).
    Runs { shifted: Option<(Refusal, DateTime<Utc>)> },
    /// An `exclude` calendar refuses it, or no business day is near enough to shift it to.
    Skipped(Refusal),
    /// It would run (shifted or not) at or before the time the schedule's previous fire runs
    /// at: it runs once, as the fire of `into` (that previous nominal time), at `shifted_to`.
    Merged { into: DateTime<Utc>, shifted_to: DateTime<Utc> },
}

/// The fate of the fire at `nominal` under `refs`, judged as the live schedule judges it
/// right after its previous fire: merged when its effective time is not after the previous
/// fire's effective time (or that fire's nominal time, when the calendars skip it).
pub fn fate_of(
    schedule: &Schedule,
    zone: Tz,
    refs: &[CalendarRef],
    calendars: &Calendars,
    nominal: DateTime<Utc>,
) -> Fate {
    if refs.is_empty() {
        return Fate::Runs { shifted: None };
    }
    let (effective, shifted) = match decide(refs, calendars, nominal, zone) {
        Decision::Fire => (nominal, None),
        Decision::Skip(refusal) => return Fate::Skipped(refusal),
        Decision::Shift { at, refusal } => (at, Some((refusal, at))),
    };
    let previous = nominal.checked_sub_signed(MS).and_then(|before| schedule.fires_up_to(before, 1).pop());
    if let Some(previous) = previous {
        let floor = match decide(refs, calendars, previous, zone) {
            Decision::Shift { at, .. } => at,
            Decision::Fire | Decision::Skip(_) => previous,
        };
        if effective <= floor {
            return Fate::Merged { into: previous, shifted_to: floor };
        }
    }
    Fate::Runs { shifted }
}
