//! When a task fires: the `schedule` part of a task spec and its next-fire computation.
//!
//! Four kinds: `cron` (on a zone's wall clock, see [`CronSchedule`] for the field semantics and
//! the DST rules), `every` (fixed interval from an anchor), `at` (one instant) and `after` (a delay
//! from registration, turned into `at` when the task spec is admitted). All instants are
//! UTC with millisecond precision; [`Schedule::next_after`] is a pure function of its input, so
//! every scheduler replica computes the same nominal fire times.

mod cron_expr;
#[cfg(test)]
mod tests;
mod window;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};

pub use self::cron_expr::CronSchedule;
pub(crate) use self::cron_expr::resolve;
pub use self::window::{EndReason, Window, nth_fire};
use crate::error::{ApiError, ApiErrors, ErrorCode};
use crate::field::{Obj, Problems, err, format_duration, format_instant};

/// A validated schedule.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// A cron expression evaluated on a zone's wall clock (boxed: the other kinds are small,
    /// and a scheduler keeps a million of them).
    Cron(Box<CronSchedule>),
    /// Fires at `anchor + k * interval` for every integer `k >= 0`. `interval` is a whole number
    /// of milliseconds; `anchor` defaults to the Unix epoch, so replicas agree on the phase.
    Every { interval: Duration, anchor: DateTime<Utc> },
    /// Fires once, at this instant.
    At(DateTime<Utc>),
    /// Fires once, this long after registration (admission turns it into `At`).
    After(Duration),
    /// Never fires on its own: the task runs from its parents' runs (the spec's `after`, with
    /// no `schedule`).
    Parents,
}

const KINDS: &[&str] = &["cron", "every", "at", "after"];

/// A cron expression on the zone `tz`. An unknown zone is one problem and the expression, read
/// on UTC meanwhile, may be another.
fn read_cron(expr: &str, tz: &str, problems: &mut Problems) -> Option<CronSchedule> {
    match CronSchedule::parse(expr, tz) {
        Ok(cron) => Some(cron),
        Err(error) if error.code == ErrorCode::UnknownTimezone => {
            problems.push(error);
            if let Err(error) = CronSchedule::parse(expr, "UTC") {
                problems.push(error);
            }
            None
        }
        Err(error) => {
            problems.push(error);
            None
        }
    }
}

/// An `every` interval is a whole number of milliseconds.
pub(crate) fn check_interval(interval: Duration) -> Result<(), ApiError> {
    if interval.subsec_nanos().is_multiple_of(1_000_000) {
        Ok(())
    } else {
        Err(err(ErrorCode::InvalidDuration, "schedule.every", "must be a whole number of milliseconds"))
    }
}

impl Schedule {
    /// Parses and validates the `schedule` object of a spec; errors name `schedule.*` fields.
    pub fn parse_value(value: &Value) -> Result<Schedule, ApiErrors> {
        Problems::collect(|problems| Schedule::read(value, problems))
    }

    /// Reads the `schedule` object, recording each of its problems; `None` when it has one.
    pub(crate) fn read(value: &Value, problems: &mut Problems) -> Option<Schedule> {
        let obj = problems.take(Obj::new(value, "schedule"))?;
        obj.deny_unknown(&["cron", "timezone", "every", "anchor", "at", "after"], problems);
        let kinds: Vec<&str> = obj.present_keys().filter(|k| KINDS.contains(k)).collect();
        let [kind] = kinds.as_slice() else {
            problems.push(err(
                ErrorCode::InvalidValue,
                "schedule",
                format!("give exactly one of cron, every, at, after (got {})", kinds.len()),
            ));
            return None;
        };
        if *kind != "cron" && obj.get("timezone").is_some() {
            problems.push(err(
                ErrorCode::InvalidValue,
                "schedule.timezone",
                "timezone is only allowed with cron",
            ));
        }
        if *kind != "every" && obj.get("anchor").is_some() {
            problems.push(err(
                ErrorCode::InvalidValue,
                "schedule.anchor",
                "anchor is only allowed with every",
            ));
        }
        match *kind {
            "cron" => {
                let expr = problems.take(obj.required_string("cron"));
                let tz = problems.take_opt(obj.string("timezone")).unwrap_or("UTC");
                read_cron(expr?, tz, problems).map(|cron| Schedule::Cron(Box::new(cron)))
            }
            "every" => {
                let interval = problems.take_opt(obj.duration("every"));
                let interval =
                    interval.and_then(|interval| problems.take(check_interval(interval).map(|()| interval)));
                let anchor = problems.take(obj.instant("anchor"))?.unwrap_or(DateTime::UNIX_EPOCH);
                Some(Schedule::Every { interval: interval?, anchor })
            }
            "at" => problems.take_opt(obj.instant("at")).map(Schedule::At),
            _ => problems.take_opt(obj.duration("after")).map(Schedule::After),
        }
    }

    /// The next nominal fire instant strictly after `after`, or `None` when there is none (a
    /// one-shot already past, a cron whose year range is exhausted). `After` gives `None`:
    /// admission turns it into `At`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Schedule::Cron(cron) => cron.next_after(after),
            Schedule::Every { interval, anchor } => {
                if after < *anchor {
                    return Some(*anchor);
                }
                let step = i64::try_from(interval.as_millis()).ok()?.max(1);
                let elapsed = (after - *anchor).num_milliseconds();
                let k = elapsed / step + 1;
                anchor.checked_add_signed(TimeDelta::try_milliseconds(k.checked_mul(step)?)?)
            }
            Schedule::At(at) => (*at > after).then_some(*at),
            Schedule::After(_) | Schedule::Parents => None,
        }
    }

    /// The next `n` fire instants after `after` (fewer when the schedule runs out).
    pub fn upcoming(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n.min(1024));
        let mut cursor = after;
        while out.len() < n {
            let Some(next) = self.next_after(cursor) else { break };
            out.push(next);
            cursor = next;
        }
        out
    }

    /// The last `n` fire instants at or before `up_to`, oldest first (fewer when the schedule
    /// has fewer). Searched forward over windows growing fourfold back from `up_to`, so the
    /// work stays near `n` steps for a regular schedule, and bounded for any.
    pub fn fires_up_to(&self, up_to: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        /// Most fire instants one search steps through.
        const MAX_STEPS: usize = 100_000;
        if n == 0 {
            return Vec::new();
        }
        let mut span = TimeDelta::seconds(1);
        let mut steps = 0;
        loop {
            let start = up_to.checked_sub_signed(span).unwrap_or(DateTime::<Utc>::MIN_UTC);
            let mut found = std::collections::VecDeque::with_capacity(n);
            let mut cursor = start;
            while let Some(next) = self.next_after(cursor).filter(|next| *next <= up_to) {
                steps += 1;
                if steps > MAX_STEPS {
                    return Vec::new();
                }
                if found.len() == n {
                    found.pop_front();
                }
                found.push_back(next);
                cursor = next;
            }
            // Enough, or back 400 days (no schedule in use is sparser than yearly).
            if found.len() == n || span > TimeDelta::days(400) {
                return found.into();
            }
            span = span * 4;
        }
    }

    /// The zone whose wall clock the schedule reads: a cron's timezone, UTC for the others.
    pub fn timezone(&self) -> chrono_tz::Tz {
        match self {
            Schedule::Cron(cron) => cron.timezone(),
            _ => chrono_tz::Tz::UTC,
        }
    }

    /// The canonical JSON form (timezone and anchor always present).
    pub fn to_json(&self) -> Value {
        match self {
            Schedule::Cron(cron) => json!({"cron": cron.source(), "timezone": cron.timezone().name()}),
            Schedule::Every { interval, anchor } => {
                json!({"every": format_duration(*interval), "anchor": format_instant(*anchor)})
            }
            Schedule::At(at) => json!({"at": format_instant(*at)}),
            Schedule::After(delay) => json!({"after": format_duration(*delay)}),
            Schedule::Parents => Value::Null,
        }
    }
}
