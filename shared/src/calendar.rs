//! Business calendars: which days (and hours) count as business time, and what a task's fire
//! does when it falls outside them.
//!
//! A [`Calendar`] belongs to a namespace and has a zone, holidays (dates in that zone), working
//! days of the week, optional working hours and `base` calendars it composes with: an instant
//! is business time only if the calendar and every base (each on its own zone) say so.
//! [`Calendars`] holds the calendars of one namespace and answers for an instant; bases form no
//! cycle ([`Calendars::find_cycle`] names one).
//!
//! A task refers to calendars with a rule ([`CalendarRule`]): `exclude` skips a fire outside
//! business time; `shift_next_business_day` / `shift_previous_business_day` move it to the
//! nearest business day at the same wall-clock time in the schedule's zone. [`decide`] is a
//! pure function of the nominal instant, so every replica decides alike, and [`plan`] lists the
//! fires a schedule makes under its rules, a fire shifted onto one already made running once.

mod rules;
mod runs;
#[cfg(test)]
mod tests;

pub use self::rules::{CalendarRef, CalendarRule, Decision, Planned, decide, plan, schedule_zone};
pub use self::runs::{Fate, Fires, MAX_COUNTED_FIRES, fate_of};

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Datelike, NaiveDate, NaiveTime, Utc};
use chrono_tz::Tz;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiErrors, ErrorCode};
use crate::field::{Obj, Problems, err, wrong_type};
use crate::spec::validate_id;

/// Furthest a shift looks for a business day (a calendar with none in a year refuses the fire).
pub const MAX_SHIFT_DAYS: u64 = 366;

/// Day names as written in `working_days`, Monday first.
const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Working hours on the calendar's wall clock: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkingHours {
    pub start: NaiveTime,
    pub end: NaiveTime,
}

/// A validated calendar.
#[derive(Debug, Clone, PartialEq)]
pub struct Calendar {
    pub namespace: String,
    pub name: String,
    pub zone: Tz,
    pub holidays: BTreeSet<NaiveDate>,
    /// Indexed by days from Monday.
    pub working_days: [bool; 7],
    pub working_hours: Option<WorkingHours>,
    /// Names of calendars of the same namespace this one composes with.
    pub base: Vec<String>,
}

/// Why an instant is not business time, for one calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Holiday,
    NotAWorkingDay,
    OutsideWorkingHours,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Holiday => "holiday",
            Why::NotAWorkingDay => "not_a_working_day",
            Why::OutsideWorkingHours => "outside_working_hours",
        }
    }
}

/// The calendar that refused an instant, and the date it refused, in that calendar's zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub calendar: String,
    pub date: NaiveDate,
    pub why: Why,
}

fn read_date(path: &str, value: &Value) -> Result<NaiveDate, ApiError> {
    let Value::String(text) = value else { return Err(wrong_type(path, "a date string", value)) };
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map_err(|e| err(ErrorCode::InvalidValue, path, format!("{text:?} is not a YYYY-MM-DD date: {e}")))
}

fn read_time(path: &str, text: &str) -> Result<NaiveTime, ApiError> {
    NaiveTime::parse_from_str(text, "%H:%M")
        .map_err(|e| err(ErrorCode::InvalidValue, path, format!("{text:?} is not an HH:MM time: {e}")))
}

impl Calendar {
    /// Parses and validates a calendar document, naming every problem.
    pub fn parse_value(value: &Value) -> Result<Calendar, ApiErrors> {
        Problems::collect(|problems| Calendar::read(value, problems))
    }

    fn read(value: &Value, problems: &mut Problems) -> Option<Calendar> {
        let obj = problems.take(Obj::new(value, ""))?;
        obj.deny_unknown(
            &["namespace", "name", "zone", "holidays", "working_days", "working_hours", "base"],
            problems,
        );
        let namespace = problems.take(obj.required_string("namespace"));
        let namespace = namespace.filter(|ns| problems.take(validate_id("namespace", ns)).is_some());
        let name = problems.take(obj.required_string("name"));
        let name = name.filter(|name| problems.take(validate_id("name", name)).is_some());
        let zone = problems.take(obj.required_string("zone")).and_then(|zone| {
            let parsed = zone.parse::<Tz>().map_err(|e| {
                err(ErrorCode::UnknownTimezone, "zone", format!("{zone:?} is not an IANA time zone: {e}"))
            });
            problems.take(parsed)
        });

        let mut holidays = BTreeSet::new();
        if let Some(items) = problems.take_opt(obj.array("holidays")) {
            for (i, item) in items.iter().enumerate() {
                if let Some(date) = problems.take(read_date(&format!("holidays[{i}]"), item)) {
                    holidays.insert(date);
                }
            }
        }

        let working_days = match problems.take(obj.array("working_days")) {
            None => None,
            Some(None) => Some([true, true, true, true, true, false, false]),
            Some(Some(items)) => read_working_days(items, problems),
        };

        let working_hours = match problems.take(obj.object("working_hours")) {
            None => None,
            Some(None) => Some(None),
            Some(Some(hours)) => {
                hours.deny_unknown(&["start", "end"], problems);
                let start = problems.take(hours.required_string("start"));
                let start = start.and_then(|t| problems.take(read_time("working_hours.start", t)));
                let end = problems.take(hours.required_string("end"));
                let end = end.and_then(|t| problems.take(read_time("working_hours.end", t)));
                match (start, end) {
                    (Some(start), Some(end)) if start < end => Some(Some(WorkingHours { start, end })),
                    (Some(_), Some(_)) => {
                        problems.push(err(
                            ErrorCode::InvalidValue,
                            "working_hours",
                            "start must be before end",
                        ));
                        None
                    }
                    _ => None,
                }
            }
        };

        let mut base = Vec::new();
        if let Some(items) = problems.take_opt(obj.array("base")) {
            for (i, item) in items.iter().enumerate() {
                let path = format!("base[{i}]");
                let Value::String(other) = item else {
                    problems.push(wrong_type(&path, "a calendar name", item));
                    continue;
                };
                if problems.take(validate_id(&path, other)).is_none() {
                    continue;
                }
                if Some(other.as_str()) == name {
                    problems.push(err(ErrorCode::InvalidValue, &path, "a calendar cannot be its own base"));
                } else if base.contains(other) {
                    problems.push(err(ErrorCode::InvalidValue, &path, format!("{other:?} is named twice")));
                } else {
                    base.push(other.clone());
                }
            }
        }

        Some(Calendar {
            namespace: namespace?.to_owned(),
            name: name?.to_owned(),
            zone: zone?,
            holidays,
            working_days: working_days?,
            working_hours: working_hours?,
            base,
        })
    }

    /// The key in storage: `<namespace>.<name>`.
    pub fn key(&self) -> String {
        crate::names::calendar_key(&self.namespace, &self.name)
    }

    /// Whether `date` (in this calendar's zone) is a working day and not a holiday.
    pub fn own_day(&self, date: NaiveDate) -> Result<(), Why> {
        if self.holidays.contains(&date) {
            Err(Why::Holiday)
        } else if !self.working_days[date.weekday().num_days_from_monday() as usize] {
            Err(Why::NotAWorkingDay)
        } else {
            Ok(())
        }
    }

    /// Whether `instant` is business time by this calendar alone; `hours` also checks the
    /// working hours. The error names the local date.
    fn own_instant(&self, instant: DateTime<Utc>, hours: bool) -> Result<(), (NaiveDate, Why)> {
        let local = instant.with_timezone(&self.zone).naive_local();
        self.own_day(local.date()).map_err(|why| (local.date(), why))?;
        match self.working_hours {
            Some(wh) if hours && !(wh.start <= local.time() && local.time() < wh.end) => {
                Err((local.date(), Why::OutsideWorkingHours))
            }
            _ => Ok(()),
        }
    }

    /// The canonical JSON form.
    pub fn to_json(&self) -> Value {
        let days: Vec<&str> =
            DAY_NAMES.iter().zip(self.working_days).filter(|(_, on)| *on).map(|(name, _)| *name).collect();
        let mut doc = json!({
            "namespace": self.namespace,
            "name": self.name,
            "zone": self.zone.name(),
            "holidays": self.holidays.iter().map(|d| d.format("%Y-%m-%d").to_string()).collect::<Vec<_>>(),
            "working_days": days,
            "base": self.base,
        });
        if let Some(wh) = self.working_hours {
            doc["working_hours"] = json!({"start": wh.start.format("%H:%M").to_string(), "end": wh.end.format("%H:%M").to_string()});
        }
        doc
    }
}

impl serde::Serialize for Calendar {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

/// A calendar inside another wire type is validated like one on its own.
impl<'de> serde::Deserialize<'de> for Calendar {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Calendar::parse_value(&value).map_err(serde::de::Error::custom)
    }
}

fn read_working_days(items: &[Value], problems: &mut Problems) -> Option<[bool; 7]> {
    let mut days = [false; 7];
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = format!("working_days[{i}]");
        let Value::String(text) = item else {
            problems.push(wrong_type(&path, "a day name", item));
            ok = false;
            continue;
        };
        let lower = text.to_ascii_lowercase();
        let Some(index) =
            DAY_NAMES.iter().position(|d| lower.get(..3) == Some(*d) && is_day_spelling(&lower))
        else {
            problems.push(err(ErrorCode::InvalidValue, &path, format!("{text:?} is not a day (mon .. sun)")));
            ok = false;
            continue;
        };
        if days[index] {
            problems.push(err(ErrorCode::InvalidValue, &path, format!("{text:?} is named twice")));
            ok = false;
        }
        days[index] = true;
    }
    if ok && !days.contains(&true) {
        problems.push(err(ErrorCode::InvalidValue, "working_days", "name at least one working day"));
        ok = false;
    }
    ok.then_some(days)
}

/// `mon` or `monday` (and so on).
fn is_day_spelling(lower: &str) -> bool {
    const FULL: [&str; 7] = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"];
    DAY_NAMES.contains(&lower) || FULL.contains(&lower)
}

/// The calendars of one namespace, by name.
#[derive(Debug, Clone, Default)]
pub struct Calendars(BTreeMap<String, Calendar>);

impl Calendars {
    pub fn new(calendars: impl IntoIterator<Item = Calendar>) -> Calendars {
        Calendars(calendars.into_iter().map(|c| (c.name.clone(), c)).collect())
    }

    pub fn get(&self, name: &str) -> Option<&Calendar> {
        self.0.get(name)
    }

    pub fn insert(&mut self, calendar: Calendar) -> Option<Calendar> {
        self.0.insert(calendar.name.clone(), calendar)
    }

    pub fn remove(&mut self, name: &str) -> Option<Calendar> {
        self.0.remove(name)
    }

    /// Problems with `calendar`'s bases were it stored here: unknown bases and a cycle.
    pub fn check_bases(&self, calendar: &Calendar) -> Result<(), ApiErrors> {
        let mut problems = Vec::new();
        for (i, other) in calendar.base.iter().enumerate() {
            if !self.0.contains_key(other) {
                problems.push(err(
                    ErrorCode::InvalidValue,
                    &format!("base[{i}]"),
                    format!("no calendar {other:?} in namespace {:?}", calendar.namespace),
                ));
            }
        }
        let mut with = self.clone();
        with.insert(calendar.clone());
        if let Some(cycle) = with.find_cycle() {
            problems.push(err(
                ErrorCode::InvalidValue,
                "base",
                format!("bases form a cycle: {}", cycle.join(" -> ")),
            ));
        }
        ApiErrors::from_vec(problems).map_or(Ok(()), Err)
    }

    /// A cycle of bases, as names from a calendar back to itself, or `None`.
    pub fn find_cycle(&self) -> Option<Vec<String>> {
        // Depth-first, colouring: on the current path (in `path`) or finished (in `done`).
        fn visit<'a>(
            calendars: &'a Calendars,
            name: &'a str,
            path: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|n| *n == name) {
                let mut cycle: Vec<String> = path[at..].iter().map(|n| (*n).to_owned()).collect();
                cycle.push(name.to_owned());
                return Some(cycle);
            }
            if !done.insert(name) {
                return None;
            }
            path.push(name);
            for base in calendars.0.get(name).map(|c| c.base.as_slice()).unwrap_or_default() {
                if let Some(cycle) = visit(calendars, base, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            None
        }
        let mut done = BTreeSet::new();
        for name in self.0.keys() {
            let mut path = Vec::new();
            if let Some(cycle) = visit(self, name, &mut path, &mut done) {
                return Some(cycle);
            }
        }
        None
    }

    /// Calendars naming `name` as a base (deleting `name` is refused while there are any).
    pub fn based_on(&self, name: &str) -> Vec<String> {
        self.0.values().filter(|c| c.base.iter().any(|b| b == name)).map(|c| c.name.clone()).collect()
    }

    /// The calendars of `namespace` named in `names` and their bases, as stored in the
    /// calendars bucket (one missing, or stored unreadable, is left out: it refuses nothing).
    pub async fn stored<'a>(
        bucket: &async_nats::jetstream::kv::Store,
        namespace: &str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> anyhow::Result<Calendars> {
        let mut wanted: Vec<String> = names.into_iter().map(str::to_owned).collect();
        let mut found = Calendars::default();
        let mut seen = BTreeSet::new();
        while let Some(name) = wanted.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            let key = crate::names::calendar_key(namespace, &name);
            let entry = bucket.entry(&key).await?;
            let Some(entry) = crate::cas::live(entry) else { continue };
            let Ok(value) = serde_json::from_slice(&entry.value) else { continue };
            let Ok(calendar) = Calendar::parse_value(&value) else { continue };
            wanted.extend(calendar.base.iter().cloned());
            found.insert(calendar);
        }
        Ok(found)
    }

    /// Why `instant` is not business time by `name` and its bases (the first refusing calendar,
    /// depth first), or `Ok`. An unknown calendar refuses nothing: admission keeps them out.
    pub fn check(&self, name: &str, instant: DateTime<Utc>, hours: bool) -> Result<(), Refusal> {
        let mut seen = BTreeSet::new();
        self.check_inner(name, instant, hours, &mut seen)
    }

    fn check_inner<'a>(
        &'a self,
        name: &'a str,
        instant: DateTime<Utc>,
        hours: bool,
        seen: &mut BTreeSet<&'a str>,
    ) -> Result<(), Refusal> {
        if !seen.insert(name) {
            return Ok(());
        }
        let Some(calendar) = self.0.get(name) else { return Ok(()) };
        calendar.own_instant(instant, hours).map_err(|(date, why)| Refusal {
            calendar: name.to_owned(),
            date,
            why,
        })?;
        for base in &calendar.base {
            self.check_inner(base, instant, hours, seen)?;
        }
        Ok(())
    }
}
