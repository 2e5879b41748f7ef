//! The spec's bounds, `start_at`, `end_at` and `max_runs`: read and checked together (every
//! problem named), and the window of fires they leave ([`Window`]).
//!
//! A bound instant is RFC 3339 with its offset, or a wall time without one
//! (`"2027-01-01T00:00:00"`), read on the schedule's zone (a cron's `timezone`, UTC for
//! `every`): a wall time in a spring-forward gap is the transition instant, one in an autumn
//! fold the earlier of its two instants (the rules cron fires follow). The canonical form keeps
//! the UTC instant.

use chrono::{DateTime, NaiveDateTime, Utc};
use chrono_tz::Tz;

use crate::error::{ApiError, ErrorCode};
use crate::field::{Problems, err, format_instant, truncate_ms};
use crate::schedule::{Schedule, resolve};

/// The most fires `max_runs` may allow.
pub const MAX_RUNS: u32 = 10_000;

/// The three bounds as read (before admission, `start_at` may be absent with `max_runs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Bounds {
    pub(super) start_at: Option<DateTime<Utc>>,
    pub(super) end_at: Option<DateTime<Utc>>,
    pub(super) max_runs: Option<u32>,
}

/// A bound instant: RFC 3339 with its offset, or a wall time without one read in `tz`.
pub(super) fn parse_bound(path: &str, text: &str, tz: Tz) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(instant) = DateTime::parse_from_rfc3339(text) {
        return Ok(truncate_ms(instant.to_utc()));
    }
    match NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f") {
        Ok(local) => Ok(truncate_ms(resolve(&tz, local))),
        Err(_) => Err(err(
            ErrorCode::InvalidValue,
            path,
            format!(
                "{text:?} is neither an RFC 3339 instant (\"2027-01-01T00:00:00Z\") nor a wall time \
                 on the schedule's zone (\"2027-01-01T00:00:00\")"
            ),
        )),
    }
}

/// Reads and checks the bounds of a spec whose schedule is `schedule` (`None` when it is
/// invalid: wall times are then read on UTC, to report their own problems). Every problem is
/// recorded; `None` when there is one.
pub(super) fn read_bounds(
    schedule: Option<&Schedule>,
    start_at: Option<&str>,
    end_at: Option<&str>,
    max_runs: Option<u32>,
    problems: &mut Problems,
) -> Option<Bounds> {
    let mut ok = true;
    let tz = schedule.map_or(Tz::UTC, Schedule::timezone);
    let mut instant = |path: &str, text: Option<&str>, problems: &mut Problems| match text {
        Some(text) => parse_bound(path, text, tz).map(Some).unwrap_or_else(|error| {
            problems.push(error);
            ok = false;
            None
        }),
        None => None,
    };
    let start = instant("start_at", start_at, problems);
    let end = instant("end_at", end_at, problems);
    if let Some(n) = max_runs
        && !(1..=MAX_RUNS).contains(&n)
    {
        problems.push(err(ErrorCode::InvalidValue, "max_runs", format!("must be 1 to {MAX_RUNS} (got {n})")));
        ok = false;
    }
    if let (Some(start), Some(end)) = (start, end)
        && end <= start
    {
        problems.push(err(
            ErrorCode::InvalidValue,
            "end_at",
            format!(
                "must be after start_at ({} is not after {})",
                format_instant(end),
                format_instant(start)
            ),
        ));
        ok = false;
    }
    if matches!(schedule, Some(Schedule::At(_) | Schedule::After(_))) {
        let given = [
            ("start_at", start_at.is_some()),
            ("end_at", end_at.is_some()),
            ("max_runs", max_runs.is_some()),
        ];
        for (field, _) in given.iter().filter(|(_, given)| *given) {
            problems.push(err(
                ErrorCode::InvalidValue,
                field,
                "bounds apply to repeating schedules (cron, every); a one-shot fires once",
            ));
            ok = false;
        }
    }
    ok.then_some(Bounds { start_at: start, end_at: end, max_runs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        s.parse().expect("an instant")
    }

    #[test]
    fn a_bound_is_an_instant_or_a_wall_time_on_the_zone() {
        let ny: Tz = "America/New_York".parse().expect("a zone");
        assert_eq!(parse_bound("start_at", "2027-01-01T00:00:00+01:00", ny), Ok(utc("2026-12-31T23:00:00Z")));
        assert_eq!(parse_bound("start_at", "2027-01-01T00:00:00", ny), Ok(utc("2027-01-01T05:00:00Z")));
        assert_eq!(
            parse_bound("start_at", "2027-01-01T00:00:00.250", Tz::UTC),
            Ok(utc("2027-01-01T00:00:00.250Z"))
        );
        // Spring forward 2027-03-14 02:00 EST -> 03:00 EDT (07:00Z): 02:30 does not exist.
        assert_eq!(parse_bound("start_at", "2027-03-14T02:30:00", ny), Ok(utc("2027-03-14T07:00:00Z")));
        // Fall back 2027-11-07 02:00 EDT -> 01:00 EST: 01:30 happens twice, the first counts.
        assert_eq!(parse_bound("start_at", "2027-11-07T01:30:00", ny), Ok(utc("2027-11-07T05:30:00Z")));
        let error = parse_bound("end_at", "tomorrow", ny).expect_err("not a time");
        assert_eq!(error.field.as_deref(), Some("end_at"));
        assert!(parse_bound("end_at", "2027-01-01", ny).is_err(), "a date alone is refused");
    }
}
