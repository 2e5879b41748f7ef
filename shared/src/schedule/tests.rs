//! Tests for schedules: DST behaviour, L/W/# forms, every/at/after, and a brute-force property test.

use std::sync::OnceLock;
use std::time::Duration;

use chrono::{
    DateTime, Datelike, NaiveDate, NaiveDateTime, Offset, TimeDelta, TimeZone, Timelike, Utc, Weekday,
};
use chrono_tz::Tz;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::error::ErrorCode;

fn utc(s: &str) -> DateTime<Utc> {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn cron(expr: &str, tz: &str) -> Schedule {
    Schedule::Cron(Box::new(CronSchedule::parse(expr, tz).unwrap_or_else(|e| panic!("{expr}: {e}"))))
}

/// The next `n` fires after `after`, as RFC 3339 strings for readable failures.
fn fires(schedule: &Schedule, after: &str, n: usize) -> Vec<String> {
    schedule
        .upcoming(utc(after), n)
        .into_iter()
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
        .collect()
}

fn next(schedule: &Schedule, after: &str) -> Option<String> {
    fires(schedule, after, 1).pop()
}

// ---------------------------------------------------------------------------------------------
// DST: America/New_York (gap 2026-03-08 02:00 EST -> 03:00 EDT at 07:00Z;
//                        fold 2026-11-01 02:00 EDT -> 01:00 EST at 06:00Z)

/// The last fires up to an instant are the ones `upcoming` finds forward, for an interval, a
/// zoned cron across a DST change, and a schedule with fewer fires than asked.
#[test]
fn the_last_fires_up_to_an_instant_match_the_forward_ones() {
    let text = |fires: Vec<DateTime<Utc>>| -> Vec<String> {
        fires.into_iter().map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)).collect()
    };
    let every = Schedule::Every { interval: Duration::from_secs(5), anchor: utc("2026-01-01T00:00:00Z") };
    let last = text(every.fires_up_to(utc("2026-01-01T00:01:00Z"), 3));
    assert_eq!(last, ["2026-01-01T00:00:50Z", "2026-01-01T00:00:55Z", "2026-01-01T00:01:00Z"]);
    assert_eq!(every.fires_up_to(utc("2026-01-01T00:00:07Z"), 10).len(), 2, "the anchor and 5 s later");
    let nightly = cron("0 30 2 * * *", "America/New_York");
    let forward = fires(&nightly, "2026-03-05T00:00:00Z", 6);
    assert_eq!(text(nightly.fires_up_to(utc(&forward[5]), 6)), forward);
    let once = Schedule::At(utc("2026-01-01T00:00:00Z"));
    assert_eq!(once.fires_up_to(utc("2026-06-01T00:00:00Z"), 10), [utc("2026-01-01T00:00:00Z")]);
}

#[test]
fn new_york_gap_fires_once_at_the_transition() {
    let s = cron("0 30 2 * * *", "America/New_York");
    assert_eq!(
        fires(&s, "2026-03-07T00:00:00Z", 3),
        ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
    );
    assert_eq!(next(&s, "2026-03-08T06:59:59.999Z").as_deref(), Some("2026-03-08T07:00:00Z"));
    assert_eq!(next(&s, "2026-03-08T07:00:00Z").as_deref(), Some("2026-03-09T06:30:00Z"));
}

#[test]
fn new_york_gap_collapses_every_fifteen_minutes() {
    let s = cron("0 */15 * * * *", "America/New_York");
    // 01:45 EST, then 02:00 02:15 02:30 02:45 (skipped) and 03:00 EDT all at 07:00Z, then 03:15 EDT.
    assert_eq!(
        fires(&s, "2026-03-08T06:40:00Z", 4),
        ["2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z", "2026-03-08T07:30:00Z"]
    );
    let s = cron("0 0,30 2,3 * * *", "America/New_York");
    assert_eq!(
        fires(&s, "2026-03-08T06:00:00Z", 3),
        ["2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z", "2026-03-09T06:00:00Z"]
    );
}

#[test]
fn new_york_fold_fires_once_at_the_first_occurrence() {
    let s = cron("0 30 1 * * *", "America/New_York");
    assert_eq!(fires(&s, "2026-11-01T04:00:00Z", 2), ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]);
    // From inside the repeated hour (01:10 EST), the second 01:30 is not a fire.
    assert_eq!(next(&s, "2026-11-01T06:10:00Z").as_deref(), Some("2026-11-02T06:30:00Z"));

    let hourly = cron("0 0 * * * *", "America/New_York");
    assert_eq!(
        fires(&hourly, "2026-11-01T03:30:00Z", 4),
        ["2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"]
    );
    let quarter = cron("0 */15 * * * *", "America/New_York");
    assert_eq!(fires(&quarter, "2026-11-01T05:40:00Z", 2), ["2026-11-01T05:45:00Z", "2026-11-01T07:00:00Z"]);
}

// Europe/Berlin (gap 2026-03-29 02:00 CET -> 03:00 CEST at 01:00Z; fold 2026-10-25 03:00 CEST ->
// 02:00 CET at 01:00Z)

#[test]
fn berlin_gap_and_fold() {
    let s = cron("0 30 2 * * *", "Europe/Berlin");
    assert_eq!(
        fires(&s, "2026-03-28T00:00:00Z", 3),
        ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    );
    assert_eq!(
        fires(&s, "2026-10-24T12:00:00Z", 2),
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        "02:30 happens twice on 2026-10-25 and fires once, at CEST"
    );
    let quarter = cron("0 */15 * * * *", "Europe/Berlin");
    assert_eq!(fires(&quarter, "2026-03-29T00:50:00Z", 2), ["2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z"]);
    let hourly = cron("0 0 * * * *", "Europe/Berlin");
    assert_eq!(
        fires(&hourly, "2026-10-24T23:30:00Z", 3),
        ["2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"]
    );
}

// Australia/Lord_Howe: a 30-minute shift. Fold 2026-04-05 02:00 (+11) -> 01:30 (+10:30) at
// 2026-04-04T15:00Z; gap 2026-10-04 02:00 (+10:30) -> 02:30 (+11) at 2026-10-03T15:30Z.

#[test]
fn lord_howe_half_hour_gap() {
    let s = cron("0 15 2 * * *", "Australia/Lord_Howe");
    assert_eq!(next(&s, "2026-10-03T12:00:00Z").as_deref(), Some("2026-10-03T15:30:00Z"));
    let quarter = cron("0 */15 * * * *", "Australia/Lord_Howe");
    // 01:45 (+10:30); 02:00 and 02:15 (skipped) and 02:30 (+11) collapse; 02:45 (+11).
    assert_eq!(
        fires(&quarter, "2026-10-03T15:10:00Z", 3),
        ["2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"]
    );
}

#[test]
fn lord_howe_half_hour_fold() {
    let s = cron("0 45 1 * * *", "Australia/Lord_Howe");
    assert_eq!(fires(&s, "2026-04-04T12:00:00Z", 2), ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]);
    let quarter = cron("0 */15 * * * *", "Australia/Lord_Howe");
    // 01:45 (+11) fires; 01:30 and 01:45 (+10:30) repeat and do not; 02:00 (+10:30) is next.
    assert_eq!(
        fires(&quarter, "2026-04-04T14:40:00Z", 3),
        ["2026-04-04T14:45:00Z", "2026-04-04T15:30:00Z", "2026-04-04T15:45:00Z"]
    );
    let hourly = cron("0 0 * * * *", "Australia/Lord_Howe");
    assert_eq!(
        fires(&hourly, "2026-04-04T13:00:00Z", 3),
        ["2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z"]
    );
}

// ---------------------------------------------------------------------------------------------
// Field semantics, L / W / #, descriptors, years

#[test]
fn day_of_week_is_one_based_from_sunday_and_anded_with_day_of_month() {
    // 2026-01-05 is a Monday.
    assert_eq!(
        next(&cron("0 0 0 * * 2", "UTC"), "2026-01-01T00:00:00Z").as_deref(),
        Some("2026-01-05T00:00:00Z")
    );
    assert_eq!(
        next(&cron("0 0 0 * * MON", "UTC"), "2026-01-01T00:00:00Z").as_deref(),
        Some("2026-01-05T00:00:00Z")
    );
    assert_eq!(
        next(&cron("0 0 0 * * 7", "UTC"), "2026-01-01T00:00:00Z").as_deref(),
        Some("2026-01-03T00:00:00Z")
    );
    // Friday the 13th: both fields must match.
    assert_eq!(
        fires(&cron("0 0 0 13 * FRI", "UTC"), "2026-01-01T00:00:00Z", 3),
        ["2026-02-13T00:00:00Z", "2026-03-13T00:00:00Z", "2026-11-13T00:00:00Z"]
    );
    assert_eq!(fires(&cron("0 0 0 13 * 6", "UTC"), "2026-01-01T00:00:00Z", 1), ["2026-02-13T00:00:00Z"]);
}

#[test]
fn last_day_forms() {
    let s = cron("0 0 12 L * *", "UTC");
    assert_eq!(
        fires(&s, "2026-01-31T13:00:00Z", 3),
        ["2026-02-28T12:00:00Z", "2026-03-31T12:00:00Z", "2026-04-30T12:00:00Z"]
    );
    assert_eq!(next(&s, "2028-02-01T00:00:00Z").as_deref(), Some("2028-02-29T12:00:00Z"));
    assert_eq!(
        next(&cron("0 0 12 L-3 * *", "UTC"), "2026-02-01T00:00:00Z").as_deref(),
        Some("2026-02-25T12:00:00Z")
    );
    // 2026-05-31 is a Sunday, 2026-02-28 a Saturday.
    let lw = cron("0 0 12 LW * *", "UTC");
    assert_eq!(next(&lw, "2026-05-01T00:00:00Z").as_deref(), Some("2026-05-29T12:00:00Z"));
    assert_eq!(next(&lw, "2026-02-01T00:00:00Z").as_deref(), Some("2026-02-27T12:00:00Z"));
    // In a zone: the last day of the month on the local calendar.
    assert_eq!(
        next(&cron("0 0 23 L * *", "Europe/Berlin"), "2026-01-01T00:00:00Z").as_deref(),
        Some("2026-01-31T22:00:00Z")
    );
}

#[test]
fn nearest_weekday_forms() {
    let w15 = cron("0 0 12 15W * *", "UTC");
    // 2026-08-15 is a Saturday, 2026-11-15 a Sunday, 2026-07-15 a Wednesday.
    assert_eq!(next(&w15, "2026-08-01T00:00:00Z").as_deref(), Some("2026-08-14T12:00:00Z"));
    assert_eq!(next(&w15, "2026-11-01T00:00:00Z").as_deref(), Some("2026-11-16T12:00:00Z"));
    assert_eq!(next(&w15, "2026-07-01T00:00:00Z").as_deref(), Some("2026-07-15T12:00:00Z"));
    // 2026-08-01 is a Saturday: never crosses back into July.
    assert_eq!(
        next(&cron("0 0 12 1W * *", "UTC"), "2026-07-31T13:00:00Z").as_deref(),
        Some("2026-08-03T12:00:00Z")
    );
    // 2026-05-31 is a Sunday: never crosses into June; 30-day months have no 31W.
    let w31 = cron("0 0 12 31W * *", "UTC");
    assert_eq!(fires(&w31, "2026-05-20T00:00:00Z", 2), ["2026-05-29T12:00:00Z", "2026-07-31T12:00:00Z"]);
    let list = cron("0 0 12 L,15W * *", "UTC");
    assert_eq!(fires(&list, "2026-08-01T00:00:00Z", 2), ["2026-08-14T12:00:00Z", "2026-08-31T12:00:00Z"]);
}

#[test]
fn nth_and_last_weekday_forms() {
    // January 2026: Fridays are 2, 9, 16, 23, 30.
    for expr in ["0 0 9 ? * 6L", "0 0 9 * * FRIL", "0 0 9 * * fril"] {
        assert_eq!(
            next(&cron(expr, "UTC"), "2026-01-01T00:00:00Z").as_deref(),
            Some("2026-01-30T09:00:00Z"),
            "{expr}"
        );
    }
    for expr in ["0 0 9 ? * 6#3", "0 0 9 ? * FRI#3"] {
        assert_eq!(
            fires(&cron(expr, "UTC"), "2026-01-01T00:00:00Z", 2),
            ["2026-01-16T09:00:00Z", "2026-02-20T09:00:00Z"],
            "{expr}"
        );
    }
    // Fifth Monday: none in January or February 2026, 2026-03-30 is one.
    assert_eq!(
        next(&cron("0 0 9 ? * 2#5", "UTC"), "2026-01-01T00:00:00Z").as_deref(),
        Some("2026-03-30T09:00:00Z")
    );
    // First Monday or last Friday.
    assert_eq!(
        fires(&cron("0 0 9 ? * MON#1,FRIL", "UTC"), "2026-01-01T00:00:00Z", 3),
        ["2026-01-05T09:00:00Z", "2026-01-30T09:00:00Z", "2026-02-02T09:00:00Z"]
    );
}

#[test]
fn descriptors_and_years() {
    assert_eq!(
        next(&cron("@yearly", "UTC"), "2026-03-01T00:00:00Z").as_deref(),
        Some("2027-01-01T00:00:00Z")
    );
    assert_eq!(
        next(&cron("@annually", "UTC"), "2026-03-01T00:00:00Z").as_deref(),
        Some("2027-01-01T00:00:00Z")
    );
    assert_eq!(
        next(&cron("@monthly", "UTC"), "2026-03-01T00:00:00Z").as_deref(),
        Some("2026-04-01T00:00:00Z")
    );
    // 2026-03-01 is a Sunday: @weekly is Sunday midnight.
    assert_eq!(
        next(&cron("@weekly", "UTC"), "2026-03-01T00:00:00Z").as_deref(),
        Some("2026-03-08T00:00:00Z")
    );
    assert_eq!(next(&cron("@daily", "UTC"), "2026-03-01T00:00:00Z").as_deref(), Some("2026-03-02T00:00:00Z"));
    assert_eq!(
        next(&cron("@midnight", "Asia/Kolkata"), "2026-03-01T00:00:00Z").as_deref(),
        Some("2026-03-01T18:30:00Z")
    );
    assert_eq!(
        next(&cron("@hourly", "UTC"), "2026-03-01T00:00:00Z").as_deref(),
        Some("2026-03-01T01:00:00Z")
    );
    let once = cron("0 0 0 1 1 * 2027", "UTC");
    assert_eq!(fires(&once, "2026-03-01T00:00:00Z", 5), ["2027-01-01T00:00:00Z"]);
    assert_eq!(next(&once, "2027-01-01T00:00:00Z"), None);
    // The cron crate's year range ends in 2100.
    assert_eq!(next(&cron("0 0 0 1 1 *", "UTC"), "2100-01-01T00:00:00Z"), None);
}

#[test]
fn next_after_is_strict_and_sub_second_aware() {
    let s = cron("* * * * * *", "UTC");
    assert_eq!(next(&s, "2026-01-01T00:00:00Z").as_deref(), Some("2026-01-01T00:00:01Z"));
    assert_eq!(next(&s, "2026-01-01T00:00:00.999Z").as_deref(), Some("2026-01-01T00:00:01Z"));
}

#[test]
fn cron_parse_errors() {
    let err = |expr: &str, tz: &str| CronSchedule::parse(expr, tz).unwrap_err();
    let e = err("0 12 * * *", "UTC");
    assert_eq!((e.code, e.field.as_deref()), (ErrorCode::InvalidCron, Some("schedule.cron")));
    assert!(e.message.contains("seconds are required"));
    for bad in [
        "",
        "@reboot",
        "0 0 0 30 2 *",
        "0 0 0 ? * 8",
        "0 0 0 5L * *",
        "0 0 0 ? * 6#0",
        "0 0 0 32W * *",
        "0 0 0 1 1 * 2101",
    ] {
        assert_eq!(err(bad, "UTC").code, ErrorCode::InvalidCron, "{bad:?}");
    }
    let e = err("0 0 0 * * *", "Europe/Berlín");
    assert_eq!((e.code, e.field.as_deref()), (ErrorCode::UnknownTimezone, Some("schedule.timezone")));
}

// ---------------------------------------------------------------------------------------------
// every, at, after

#[test]
fn every_without_anchor_is_aligned_to_the_epoch() {
    let s = Schedule::parse_value(&json!({"every": "30s"})).unwrap();
    assert_eq!(s, Schedule::Every { interval: Duration::from_secs(30), anchor: DateTime::UNIX_EPOCH });
    assert_eq!(next(&s, "2026-01-01T00:00:10Z").as_deref(), Some("2026-01-01T00:00:30Z"));
    assert_eq!(next(&s, "2026-01-01T00:00:29.999Z").as_deref(), Some("2026-01-01T00:00:30Z"));
    assert_eq!(next(&s, "2026-01-01T00:00:30Z").as_deref(), Some("2026-01-01T00:01:00Z"));
    // An interval that does not divide a day: still anchor + k * interval.
    let seven = Schedule::parse_value(&json!({"every": "7m"})).unwrap();
    for after in ["2026-01-01T00:00:00Z", "2026-06-30T13:14:15.678Z"] {
        let t = seven.next_after(utc(after)).unwrap();
        assert_eq!(t.timestamp_millis() % 420_000, 0);
        assert!(t > utc(after) && t - utc(after) <= TimeDelta::minutes(7));
    }
    assert_eq!(s.to_json(), json!({"every": "30s", "anchor": "1970-01-01T00:00:00Z"}));
}

#[test]
fn every_with_anchor_starts_at_the_anchor() {
    let s = Schedule::parse_value(&json!({"every": "1h", "anchor": "2026-01-01T00:15:00Z"})).unwrap();
    assert_eq!(next(&s, "2025-06-01T00:00:00Z").as_deref(), Some("2026-01-01T00:15:00Z"));
    assert_eq!(next(&s, "2026-01-01T00:14:59.999Z").as_deref(), Some("2026-01-01T00:15:00Z"));
    assert_eq!(
        fires(&s, "2026-03-01T10:20:00Z", 3),
        ["2026-03-01T11:15:00Z", "2026-03-01T12:15:00Z", "2026-03-01T13:15:00Z"]
    );
    let ms = Schedule::parse_value(&json!({"every": "250ms", "anchor": "2026-01-01T00:00:00.1Z"})).unwrap();
    assert_eq!(
        fires(&ms, "2026-01-01T00:00:00.2Z", 2),
        ["2026-01-01T00:00:00.350Z", "2026-01-01T00:00:00.600Z"]
    );
}

#[test]
fn at_and_after() {
    let s = Schedule::parse_value(&json!({"at": "2026-05-01T10:00:00+02:00"})).unwrap();
    assert_eq!(s, Schedule::At(utc("2026-05-01T08:00:00Z")));
    assert_eq!(fires(&s, "2026-04-01T00:00:00Z", 3), ["2026-05-01T08:00:00Z"]);
    assert_eq!(next(&s, "2026-05-01T08:00:00Z"), None);
    let s = Schedule::parse_value(&json!({"after": "10m"})).unwrap();
    assert_eq!(s, Schedule::After(Duration::from_secs(600)));
    assert_eq!(next(&s, "2026-04-01T00:00:00Z"), None);
    assert_eq!(s.to_json(), json!({"after": "10m"}));
}

// ---------------------------------------------------------------------------------------------
// Reference models

/// Days in the month of `date`, by probing.
fn month_len(date: NaiveDate) -> u32 {
    (28..=31).rev().find(|&d| NaiveDate::from_ymd_opt(date.year(), date.month(), d).is_some()).unwrap()
}

fn weekday_1_sun(n: u32) -> Weekday {
    [Weekday::Sun, Weekday::Mon, Weekday::Tue, Weekday::Wed, Weekday::Thu, Weekday::Fri, Weekday::Sat]
        [n as usize - 1]
}

fn month_days(date: NaiveDate) -> impl Iterator<Item = NaiveDate> {
    (1..=month_len(date)).map(move |d| date.with_day(d).unwrap())
}

fn is_workday(d: NaiveDate) -> bool {
    !matches!(d.weekday(), Weekday::Sat | Weekday::Sun)
}

#[derive(Debug, Clone)]
enum Item {
    Star,
    Point(u32),
    Range(u32, u32),
    StarStep(u32),
    RangeStep(u32, u32, u32),
}

#[derive(Debug, Clone)]
enum DomSpec {
    Plain(Vec<Item>),
    Last(u32),
    LastWeekday,
    Nearest(u32),
}

#[derive(Debug, Clone)]
enum DowSpec {
    Plain(Vec<Item>),
    Last(u32),
    Nth(u32, u32),
}

#[derive(Debug, Clone)]
struct CronCase {
    sec: Vec<Item>,
    min: Vec<Item>,
    hour: Vec<Item>,
    dom: DomSpec,
    month: Vec<Item>,
    dow: DowSpec,
}

fn render(items: &[Item]) -> String {
    let item = |i: &Item| match *i {
        Item::Star => "*".to_owned(),
        Item::Point(n) => n.to_string(),
        Item::Range(a, b) => format!("{a}-{b}"),
        Item::StarStep(k) => format!("*/{k}"),
        Item::RangeStep(a, b, k) => format!("{a}-{b}/{k}"),
    };
    items.iter().map(item).collect::<Vec<_>>().join(",")
}

fn item_matches(items: &[Item], min: u32, v: u32) -> bool {
    items.iter().any(|i| match *i {
        Item::Star => true,
        Item::Point(n) => v == n,
        Item::Range(a, b) => (a..=b).contains(&v),
        Item::StarStep(k) => (v - min).is_multiple_of(k),
        Item::RangeStep(a, b, k) => (a..=b).contains(&v) && (v - a).is_multiple_of(k),
    })
}

impl CronCase {
    fn expr(&self) -> String {
        let dom = match &self.dom {
            DomSpec::Plain(items) => render(items),
            DomSpec::Last(0) => "L".to_owned(),
            DomSpec::Last(n) => format!("L-{n}"),
            DomSpec::LastWeekday => "LW".to_owned(),
            DomSpec::Nearest(n) => format!("{n}W"),
        };
        let dow = match &self.dow {
            DowSpec::Plain(items) => render(items),
            DowSpec::Last(n) => format!("{n}L"),
            DowSpec::Nth(n, k) => format!("{n}#{k}"),
        };
        format!(
            "{} {} {} {dom} {} {dow}",
            render(&self.sec),
            render(&self.min),
            render(&self.hour),
            render(&self.month)
        )
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        let dom = match &self.dom {
            DomSpec::Plain(items) => item_matches(items, 1, date.day()),
            DomSpec::Last(n) => date.day() + n == month_len(date),
            DomSpec::LastWeekday => month_days(date).filter(|d| is_workday(*d)).last() == Some(date),
            DomSpec::Nearest(n) => {
                *n <= month_len(date)
                    && month_days(date).filter(|d| is_workday(*d)).min_by_key(|d| d.day().abs_diff(*n))
                        == Some(date)
            }
        };
        let dow = match &self.dow {
            DowSpec::Plain(items) => item_matches(items, 1, date.weekday().number_from_sunday()),
            DowSpec::Last(n) => {
                date.weekday() == weekday_1_sun(*n)
                    && month_days(date).filter(|d| d.weekday() == date.weekday()).last() == Some(date)
            }
            DowSpec::Nth(n, k) => {
                date.weekday() == weekday_1_sun(*n)
                    && month_days(date).filter(|d| d.weekday() == date.weekday()).position(|d| d == date)
                        == Some(*k as usize - 1)
            }
        };
        dom && dow && item_matches(&self.month, 1, date.month())
    }

    fn matches(&self, t: NaiveDateTime) -> bool {
        item_matches(&self.sec, 0, t.second())
            && item_matches(&self.min, 0, t.minute())
            && item_matches(&self.hour, 0, t.hour())
            && self.day_matches(t.date())
    }
}

/// Fires by definition, second by second over `[floor(after) + 1s, floor(after) + 1s + horizon)`,
/// at most `want` of them. An instant fires when its wall time matches and this is that wall time's
/// first occurrence, or when it ends a gap (wall clock jumps forward) and a skipped wall time matches.
fn reference_fires(
    case: &CronCase,
    tz: Tz,
    after: DateTime<Utc>,
    horizon: i64,
    want: usize,
) -> Vec<DateTime<Utc>> {
    let wall = |s: i64| DateTime::from_timestamp(s, 0).unwrap().with_timezone(&tz).naive_local();
    let start = after.timestamp() + 1;
    let mut out = Vec::new();
    let mut prev = wall(start - 1);
    for s in start..start + horizon {
        let instant = DateTime::from_timestamp(s, 0).unwrap();
        let local = wall(s);
        let first_occurrence =
            || tz.from_local_datetime(&local).earliest().map(|t| t.to_utc()) == Some(instant);
        let mut fire = case.matches(local) && first_occurrence();
        if !fire && local - prev > TimeDelta::seconds(1) {
            let mut skipped = prev + TimeDelta::seconds(1);
            while skipped < local && !fire {
                fire = case.matches(skipped);
                skipped += TimeDelta::seconds(1);
            }
        }
        if fire {
            out.push(instant);
            if out.len() == want {
                break;
            }
        }
        prev = local;
    }
    out
}

const ZONES: [Tz; 6] = [
    Tz::UTC,
    Tz::America__New_York,
    Tz::Europe__Berlin,
    Tz::Australia__Lord_Howe,
    Tz::Asia__Kolkata,
    Tz::America__Sao_Paulo,
];

/// Offset transitions of each zone in 2025-2027, found by scanning (independent of the code under test).
fn transitions() -> &'static Vec<Vec<i64>> {
    static CACHE: OnceLock<Vec<Vec<i64>>> = OnceLock::new();
    CACHE.get_or_init(|| {
        let offset = |tz: Tz, s: i64| {
            tz.offset_from_utc_datetime(&DateTime::from_timestamp(s, 0).unwrap().naive_utc()).fix()
        };
        let (from, to) = (utc("2025-01-01T00:00:00Z").timestamp(), utc("2028-01-01T00:00:00Z").timestamp());
        ZONES
            .iter()
            .map(|&tz| {
                let mut found = Vec::new();
                let mut s = from;
                while s < to {
                    if offset(tz, s) != offset(tz, s + 3600) {
                        let (mut lo, mut hi) = (s, s + 3600);
                        while hi - lo > 1 {
                            let mid = (lo + hi) / 2;
                            if offset(tz, mid) == offset(tz, s) { lo = mid } else { hi = mid }
                        }
                        found.push(hi);
                    }
                    s += 3600;
                }
                found
            })
            .collect()
    })
}

#[test]
fn transitions_found_for_the_test_zones() {
    let t = transitions();
    assert_eq!(t[0].len(), 0);
    assert_eq!(t[1].len(), 6);
    assert!(t[1].contains(&utc("2026-03-08T07:00:00Z").timestamp()));
    assert_eq!(t[3].len(), 6);
    assert!(t[3].contains(&utc("2026-10-03T15:30:00Z").timestamp()));
    assert_eq!(t[4].len(), 0);
}

#[test]
fn day_forms_agree_with_the_reference_over_four_years() {
    let cases = [
        ("L", DomSpec::Last(0), DowSpec::Plain(vec![Item::Star])),
        ("L-2", DomSpec::Last(2), DowSpec::Plain(vec![Item::Star])),
        ("LW", DomSpec::LastWeekday, DowSpec::Plain(vec![Item::Star])),
        ("1W", DomSpec::Nearest(1), DowSpec::Plain(vec![Item::Star])),
        ("15W", DomSpec::Nearest(15), DowSpec::Plain(vec![Item::Star])),
        ("30W", DomSpec::Nearest(30), DowSpec::Plain(vec![Item::Star])),
        ("31W", DomSpec::Nearest(31), DowSpec::Plain(vec![Item::Star])),
        ("1L", DomSpec::Plain(vec![Item::Star]), DowSpec::Last(1)),
        ("6L", DomSpec::Plain(vec![Item::Star]), DowSpec::Last(6)),
        ("2#1", DomSpec::Plain(vec![Item::Star]), DowSpec::Nth(2, 1)),
        ("7#5", DomSpec::Plain(vec![Item::Star]), DowSpec::Nth(7, 5)),
        ("L & 6", DomSpec::Last(0), DowSpec::Plain(vec![Item::Point(6)])),
        ("1-7 & 4#1", DomSpec::Plain(vec![Item::Range(1, 7)]), DowSpec::Nth(4, 1)),
    ];
    for (name, dom, dow) in cases {
        let case = CronCase {
            sec: vec![Item::Point(0)],
            min: vec![Item::Point(0)],
            hour: vec![Item::Point(12)],
            dom,
            month: vec![Item::Star],
            dow,
        };
        let schedule = cron(&case.expr(), "UTC");
        let start = NaiveDate::from_ymd_opt(2025, 1, 1).unwrap();
        let expected: Vec<NaiveDate> =
            start.iter_days().take_while(|d| d.year() < 2029).filter(|d| case.day_matches(*d)).collect();
        let got: Vec<NaiveDate> = schedule
            .upcoming(utc("2024-12-31T23:00:00Z"), 2000)
            .into_iter()
            .take_while(|t| t.year() < 2029)
            .map(|t| t.date_naive())
            .collect();
        assert_eq!(got, expected, "{name}: {}", case.expr());
        assert!(!got.is_empty());
    }
}

fn item(min: u32, max: u32) -> impl Strategy<Value = Item> {
    let span = max - min;
    prop_oneof![
        2 => Just(Item::Star),
        3 => (min..=max).prop_map(Item::Point),
        2 => (min..=max, 0..=span).prop_map(move |(a, len)| Item::Range(a, (a + len).min(max))),
        2 => (1..=span.max(1)).prop_map(Item::StarStep),
        1 => (min..=max, 0..=span, 1..=span.max(1)).prop_map(move |(a, len, k)| Item::RangeStep(a, (a + len).min(max), k)),
    ]
}

fn field(min: u32, max: u32) -> impl Strategy<Value = Vec<Item>> {
    prop::collection::vec(item(min, max), 1..=3)
}

fn cron_case() -> impl Strategy<Value = CronCase> {
    let star = || vec![Item::Star];
    let sec = prop_oneof![2 => Just(vec![Item::Point(0)]), 1 => field(0, 59)];
    let hour = prop_oneof![1 => Just(star()), 2 => field(0, 23)];
    let dom = prop_oneof![
        6 => Just(DomSpec::Plain(star())),
        2 => field(1, 31).prop_map(DomSpec::Plain),
        1 => (0..=5u32).prop_map(DomSpec::Last),
        1 => Just(DomSpec::LastWeekday),
        1 => (1..=31u32).prop_map(DomSpec::Nearest),
    ];
    let month = prop_oneof![5 => Just(star()), 1 => field(1, 12)];
    let dow = prop_oneof![
        6 => Just(DowSpec::Plain(star())),
        2 => field(1, 7).prop_map(DowSpec::Plain),
        1 => (1..=7u32).prop_map(DowSpec::Last),
        1 => (1..=7u32, 1..=5u32).prop_map(|(n, k)| DowSpec::Nth(n, k)),
    ];
    (sec, field(0, 59), hour, dom, month, dow).prop_map(|(sec, min, hour, dom, month, dow)| CronCase {
        sec,
        min,
        hour,
        dom,
        month,
        dow,
    })
}

/// A start instant: uniform in 2025-2027 (mode 0), shortly before one of the zone's DST transitions
/// (1), near a month end (2), or shortly before a day the case's day fields match (3).
fn start_instant(
    case: &CronCase,
    zone: usize,
    mode: u8,
    pick: usize,
    offset: i64,
    millis: i64,
) -> DateTime<Utc> {
    let month = pick % 36;
    let first = NaiveDate::from_ymd_opt(2025 + (month / 12) as i32, (month % 12) as u32 + 1, 1).unwrap();
    let midnight = |d: NaiveDate| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp();
    let base = match mode {
        0 => utc("2025-01-01T00:00:00Z").timestamp() + (pick as i64 % (3 * 365 * 86_400)),
        1 if !transitions()[zone].is_empty() => {
            let t = &transitions()[zone];
            t[pick % t.len()] - 5400 + offset.rem_euclid(2 * 3600)
        }
        3 => match first.iter_days().take(400).find(|d| case.day_matches(*d)) {
            Some(day) => midnight(day) - offset.rem_euclid(30 * 3600),
            None => midnight(first),
        },
        _ => midnight(first) + offset % (3 * 86_400),
    };
    DateTime::from_timestamp(base, 0).unwrap() + TimeDelta::milliseconds(millis)
}

const HORIZON: i64 = 3 * 86_400;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn next_after_agrees_with_a_second_by_second_reference(
        case in cron_case(),
        zone in 0..ZONES.len(),
        dst_zone in 1..4usize,
        mode in prop_oneof![1 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8), 2 => Just(3u8)],
        pick in 0..usize::MAX / 2,
        offset in -(3 * 86_400i64)..(3 * 86_400),
        millis in prop_oneof![Just(0i64), 0..1000i64],
    ) {
        let mut case = case;
        let (zone, horizon, want) = if mode == 1 {
            // Around a transition: a zone that has them, any day, and every fire in a 4-hour window.
            case.dom = DomSpec::Plain(vec![Item::Star]);
            case.dow = DowSpec::Plain(vec![Item::Star]);
            case.month = vec![Item::Star];
            (dst_zone, 4 * 3600, usize::MAX)
        } else {
            (zone, HORIZON, 5)
        };
        let tz = ZONES[zone];
        let expr = case.expr();
        let schedule = match CronSchedule::parse(&expr, tz.name()) {
            Ok(cron) => Schedule::Cron(Box::new(cron)),
            Err(e) => {
                // Generated syntax is always valid; only impossible combinations are rejected.
                prop_assert!(e.message.contains("never fires"), "{expr}: {e}");
                return Ok(());
            }
        };
        let after = start_instant(&case, zone, mode, pick, offset, millis);
        let expected = reference_fires(&case, tz, after, horizon, want);
        let end = after.timestamp() + 1 + horizon;
        let mut got = Vec::new();
        let mut cursor = after;
        while got.len() < want {
            match schedule.next_after(cursor) {
                Some(t) if t.timestamp() < end => {
                    got.push(t);
                    cursor = t;
                }
                _ => break,
            }
        }
        prop_assert_eq!(got, expected, "{} in {} after {}", expr, tz, after);
    }
}
