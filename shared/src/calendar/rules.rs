//! What a task does with a fire outside its calendars' business time: the rules a task names
//! (`exclude`, `shift_next_business_day`, `shift_previous_business_day`), the decision for one
//! nominal fire, and the plan of a schedule's next fires under them.

use std::collections::BTreeSet;

use chrono::{
    DateTime, Days, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;
use schemars::JsonSchema;
use serde_json::{Value, json};

use super::{Calendars, MAX_SHIFT_DAYS, Refusal};
use crate::error::{ApiErrors, ErrorCode};
use crate::field::{Obj, Problems, err, wrong_type};
use crate::schedule::Schedule;
use crate::spec::validate_id;

/// What a task does with a fire outside a calendar's business time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub enum CalendarRule {
    Exclude,
    ShiftNextBusinessDay,
    ShiftPreviousBusinessDay,
}

impl CalendarRule {
    pub fn as_str(self) -> &'static str {
        match self {
            CalendarRule::Exclude => "exclude",
            CalendarRule::ShiftNextBusinessDay => "shift_next_business_day",
            CalendarRule::ShiftPreviousBusinessDay => "shift_previous_business_day",
        }
    }

    fn parse(text: &str) -> Option<CalendarRule> {
        [CalendarRule::Exclude, CalendarRule::ShiftNextBusinessDay, CalendarRule::ShiftPreviousBusinessDay]
            .into_iter()
            .find(|rule| rule.as_str() == text)
    }
}

/// One entry of a task's `calendars`: a calendar of the task's namespace and what a fire
/// outside its business time does.
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct CalendarRef {
    /// A calendar of the task's namespace, `[A-Za-z0-9_-]{1,128}`.
    #[schemars(pattern(r"^[A-Za-z0-9_-]{1,128}$"))]
    pub name: String,
    pub rule: CalendarRule,
}

impl CalendarRef {
    /// Reads a task's `calendars` array: names valid and distinct, rules known, shifts in one
    /// direction only (a fire cannot move both ways).
    pub fn read_list(value: &Value, path: &str) -> Result<Vec<CalendarRef>, ApiErrors> {
        Problems::collect(|problems| CalendarRef::read(value, path, problems))
    }

    /// [`read_list`](Self::read_list), recording each problem; `None` when there is one.
    pub(crate) fn read(value: &Value, path: &str, problems: &mut Problems) -> Option<Vec<CalendarRef>> {
        let Value::Array(items) = value else {
            problems.push(wrong_type(path, "an array", value));
            return None;
        };
        let mut ok = true;
        let mut refs = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let Some(obj) = problems.take(Obj::new(item, &at)) else {
                ok = false;
                continue;
            };
            obj.deny_unknown(&["name", "rule"], problems);
            let name = problems.take(obj.required_string("name"));
            let name = name.filter(|n| problems.take(validate_id(&obj.path("name"), n)).is_some());
            let rule = problems.take(obj.required_string("rule")).and_then(|text| {
                let rule = CalendarRule::parse(text);
                if rule.is_none() {
                    problems.push(err(
                        ErrorCode::InvalidValue,
                        &obj.path("rule"),
                        format!(
                            "{text:?} is not exclude, shift_next_business_day or shift_previous_business_day"
                        ),
                    ));
                }
                rule
            });
            if let Some(name) = name.filter(|n| refs.iter().any(|r: &CalendarRef| r.name == *n)) {
                problems.push(err(
                    ErrorCode::InvalidValue,
                    &obj.path("name"),
                    format!("{name:?} is named twice"),
                ));
                ok = false;
                continue;
            }
            match (name, rule) {
                (Some(name), Some(rule)) => refs.push(CalendarRef { name: name.to_owned(), rule }),
                _ => ok = false,
            }
        }
        let shifts: BTreeSet<&str> =
            refs.iter().filter(|r| r.rule != CalendarRule::Exclude).map(|r| r.rule.as_str()).collect();
        if shifts.len() > 1 {
            problems.push(err(ErrorCode::InvalidValue, path, "shift in one direction only"));
            ok = false;
        }
        ok.then_some(refs)
    }

    /// The canonical form: `{"name", "rule"}`.
    pub fn to_json(&self) -> Value {
        json!({"name": self.name, "rule": self.rule.as_str()})
    }
}

/// What happens to one nominal fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Fires at its nominal time.
    Fire,
    /// Skipped: `calendar` refused `date`.
    Skip(Refusal),
    /// Moved to `at` because `calendar` refused `date`.
    Shift { at: DateTime<Utc>, refusal: Refusal },
}

/// `date` at wall-clock `time` in `zone`: the earlier instant in a fold, the end of the gap in
/// a gap (as the cron schedule does).
fn at_wall_clock(zone: Tz, date: NaiveDate, time: NaiveTime) -> Option<DateTime<Utc>> {
    let mut local = NaiveDateTime::new(date, time);
    // Gaps are at most a few hours; step forward minute by minute to the first real time.
    for _ in 0..=24 * 60 {
        match zone.from_local_datetime(&local) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => return Some(t.with_timezone(&Utc)),
            LocalResult::None => {
                local = local.checked_add_signed(TimeDelta::minutes(1))?;
                local = local.with_second(0)?.with_nanosecond(0)?;
            }
        }
    }
    None
}

/// Decides the fate of the fire at `nominal` of a schedule on `schedule_zone` under `refs`.
///
/// An `exclude` calendar refusing the instant (working hours included) skips it. Otherwise a
/// shift calendar refusing the day moves the fire day by day, at the same wall-clock time in
/// the schedule's zone, to the first instant every shift calendar takes as a business day and
/// no exclude calendar refuses; none within [`MAX_SHIFT_DAYS`] skips it.
pub fn decide(
    refs: &[CalendarRef],
    calendars: &Calendars,
    nominal: DateTime<Utc>,
    schedule_zone: Tz,
) -> Decision {
    let accepts = |at: DateTime<Utc>| -> Result<(), Refusal> {
        for r in refs {
            match r.rule {
                CalendarRule::Exclude => calendars.check(&r.name, at, true)?,
                _ => calendars.check(&r.name, at, false)?,
            }
        }
        Ok(())
    };
    for r in refs.iter().filter(|r| r.rule == CalendarRule::Exclude) {
        if let Err(refusal) = calendars.check(&r.name, nominal, true) {
            return Decision::Skip(refusal);
        }
    }
    let Some((shift, refusal)) = refs
        .iter()
        .filter(|r| r.rule != CalendarRule::Exclude)
        .find_map(|r| calendars.check(&r.name, nominal, false).err().map(|refusal| (r.rule, refusal)))
    else {
        return Decision::Fire;
    };
    let local = nominal.with_timezone(&schedule_zone).naive_local();
    for k in 1..=MAX_SHIFT_DAYS {
        let date = match shift {
            CalendarRule::ShiftPreviousBusinessDay => local.date().checked_sub_days(Days::new(k)),
            _ => local.date().checked_add_days(Days::new(k)),
        };
        let Some(at) = date.and_then(|date| at_wall_clock(schedule_zone, date, local.time())) else { break };
        if accepts(at).is_ok() {
            return Decision::Shift { at, refusal };
        }
    }
    Decision::Skip(refusal)
}

/// One nominal fire and its fate under a task's calendars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The schedule's own time (the execution id derives from it).
    pub nominal: DateTime<Utc>,
    pub decision: Decision,
    /// For a shifted fire landing at or before a fire already made: that fire's nominal time
    /// (it runs once, as that fire); for one moved back to or before the start of the plan, its
    /// own nominal time (already past, it does not run).
    pub merged_into: Option<DateTime<Utc>>,
}

impl Planned {
    /// When it runs, or `None` when it does not run of its own (skipped or merged).
    pub fn runs_at(&self) -> Option<DateTime<Utc>> {
        match (&self.decision, self.merged_into) {
            (_, Some(_)) | (Decision::Skip(_), _) => None,
            (Decision::Fire, None) => Some(self.nominal),
            (Decision::Shift { at, .. }, None) => Some(*at),
        }
    }
}

/// The zone a schedule's wall clock is on: a cron's zone, UTC for the others.
pub fn schedule_zone(schedule: &Schedule) -> Tz {
    match schedule {
        Schedule::Cron(cron) => cron.timezone(),
        _ => Tz::UTC,
    }
}

/// The next `n` nominal fires of `schedule` after `after` with their fate. Fires run in a
/// strictly increasing order: one whose effective time is not after the last fire made runs
/// once, merged into that fire.
pub fn plan(
    schedule: &Schedule,
    schedule_zone: Tz,
    refs: &[CalendarRef],
    calendars: &Calendars,
    after: DateTime<Utc>,
    n: usize,
) -> Vec<Planned> {
    let mut out = Vec::with_capacity(n.min(1024));
    let mut last: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    for nominal in schedule.upcoming(after, n) {
        let decision = decide(refs, calendars, nominal, schedule_zone);
        let effective = match &decision {
            Decision::Fire => Some(nominal),
            Decision::Shift { at, .. } => Some(*at),
            Decision::Skip(_) => None,
        };
        let mut merged_into = None;
        if let Some(effective) = effective {
            match last {
                Some((last_at, last_nominal)) if effective <= last_at => merged_into = Some(last_nominal),
                _ if effective <= after => merged_into = Some(nominal),
                _ => last = Some((effective, nominal)),
            }
        }
        out.push(Planned { nominal, decision, merged_into });
    }
    out
}
