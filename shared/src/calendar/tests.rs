//! Tests for calendars: validation naming every problem, bases and cycles, exclude and shift
//! decisions across zones and DST, plans that run a shifted fire once, and property tests.

use chrono::{DateTime, Days, LocalResult, NaiveDate, NaiveDateTime, TimeDelta, TimeZone, Utc, Weekday};
use chrono_tz::Tz;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::schedule::{CronSchedule, Schedule};

fn utc(s: &str) -> DateTime<Utc> {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn date(s: &str) -> NaiveDate {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn calendar(doc: serde_json::Value) -> Calendar {
    Calendar::parse_value(&doc).unwrap_or_else(|e| panic!("{doc}: {e:?}"))
}

fn cron(expr: &str, tz: &str) -> Schedule {
    Schedule::Cron(Box::new(CronSchedule::parse(expr, tz).unwrap_or_else(|e| panic!("{expr}: {e}"))))
}

fn refs(list: serde_json::Value) -> Vec<CalendarRef> {
    CalendarRef::read_list(&list, "calendars").unwrap_or_else(|e| panic!("{list}: {e:?}"))
}

/// German public holidays of 2026 observed in Berlin, Monday to Friday working.
fn de_holidays() -> Calendar {
    calendar(json!({
        "namespace": "team-a", "name": "de-holidays", "zone": "Europe/Berlin",
        "holidays": ["2026-01-01", "2026-04-03", "2026-04-06", "2026-05-01", "2026-12-25", "2026-12-26"],
        "working_days": ["mon", "tue", "wed", "thu", "fri"],
    }))
}

#[test]
fn a_calendar_round_trips_through_its_canonical_form() {
    let cal = calendar(json!({
        "namespace": "team-a", "name": "office", "zone": "Europe/Berlin",
        "holidays": ["2026-12-25"], "working_days": ["Monday", "tue", "WED"],
        "working_hours": {"start": "09:00", "end": "17:30"}, "base": ["de-holidays"],
    }));
    assert_eq!(cal.key(), "team-a.office");
    let doc = cal.to_json();
    assert_eq!(doc["working_days"], json!(["mon", "tue", "wed"]));
    assert_eq!(doc["working_hours"], json!({"start": "09:00", "end": "17:30"}));
    assert_eq!(calendar(doc), cal);
    let default_days = calendar(json!({"namespace": "a", "name": "b", "zone": "UTC"}));
    assert_eq!(default_days.working_days, [true, true, true, true, true, false, false]);
}

#[test]
fn a_bad_calendar_is_refused_naming_every_problem() {
    let doc = json!({
        "namespace": "team a", "name": "x", "zone": "Mars/Olympus",
        "holidays": ["2026-02-30", 5], "working_days": ["mon", "funday", "mon"],
        "working_hours": {"start": "18:00", "end": "09:00"}, "base": ["x", "ok", "ok"], "colour": "red",
    });
    let errors = Calendar::parse_value(&doc).expect_err("refused").into_vec();
    let fields: Vec<&str> = errors.iter().filter_map(|e| e.field.as_deref()).collect();
    for field in [
        "colour",
        "namespace",
        "zone",
        "holidays[0]",
        "holidays[1]",
        "working_days[1]",
        "working_days[2]",
        "working_hours",
        "base[0]",
        "base[2]",
    ] {
        assert!(fields.contains(&field), "{field} not named in {errors:?}");
    }
    let zone = errors.iter().find(|e| e.field.as_deref() == Some("zone")).expect("zone");
    assert_eq!(zone.code, ErrorCode::UnknownTimezone);
    let none =
        Calendar::parse_value(&json!({"namespace": "a", "name": "b", "zone": "UTC", "working_days": []}));
    assert_eq!(none.expect_err("no working day").into_vec()[0].field.as_deref(), Some("working_days"));
}

#[test]
fn a_cycle_of_bases_is_refused_naming_it_and_unknown_bases_too() {
    let cal = |name: &str, base: &[&str]| {
        calendar(json!({"namespace": "n", "name": name, "zone": "UTC", "base": base}))
    };
    let stored = Calendars::new([cal("a", &["b"]), cal("b", &["c"]), cal("c", &[])]);
    assert_eq!(stored.find_cycle(), None);
    let errors = stored.check_bases(&cal("c", &["a", "zz"])).expect_err("cycle").into_vec();
    assert!(
        errors.iter().any(|e| e.field.as_deref() == Some("base[1]") && e.message.contains("zz")),
        "{errors:?}"
    );
    let cycle = errors.iter().find(|e| e.field.as_deref() == Some("base")).expect("cycle named");
    assert!(cycle.message.contains("a -> b -> c -> a"), "{}", cycle.message);
    assert_eq!(stored.based_on("b"), ["a"]);
    assert!(stored.based_on("a").is_empty());
}

#[test]
fn good_friday_and_christmas_in_berlin_are_excluded() {
    let calendars = Calendars::new([de_holidays()]);
    let daily = cron("0 0 9 * * *", "Europe/Berlin");
    let rules = refs(json!([{"name": "de-holidays", "rule": "exclude"}]));
    let skipped: Vec<(String, NaiveDate)> =
        plan(&daily, schedule_zone(&daily), &rules, &calendars, utc("2025-12-31T12:00:00Z"), 365)
            .into_iter()
            .filter_map(|p| match p.decision {
                Decision::Skip(refusal) => Some((refusal.calendar, refusal.date)),
                _ => None,
            })
            .collect();
    assert!(skipped.contains(&("de-holidays".to_owned(), date("2026-04-03"))), "Good Friday");
    assert!(skipped.contains(&("de-holidays".to_owned(), date("2026-12-25"))), "Christmas");
    assert!(!skipped.iter().any(|(_, d)| *d == date("2026-04-02")), "Maundy Thursday is a working day");
    // 2026: 261 weekdays, of which 5 listed holidays fall on one (Dec 26 is a Saturday).
    assert_eq!(365 - skipped.len(), 256);
}

#[test]
fn a_shift_that_lands_on_the_next_occurrence_runs_once() {
    let calendars = Calendars::new([de_holidays()]);
    let weekdays = cron("0 0 9 * * MON-FRI", "Europe/Berlin");
    let rules = refs(json!([{"name": "de-holidays", "rule": "shift_next_business_day"}]));
    let plans = plan(&weekdays, schedule_zone(&weekdays), &rules, &calendars, utc("2026-12-24T00:00:00Z"), 3);
    // Thu 24th fires; Fri 25th moves to Mon 28th 09:00 CET; Mon 28th's own fire merges into it.
    assert_eq!(plans[0].runs_at(), Some(utc("2026-12-24T08:00:00Z")));
    assert_eq!(plans[1].nominal, utc("2026-12-25T08:00:00Z"));
    assert_eq!(plans[1].runs_at(), Some(utc("2026-12-28T08:00:00Z")));
    let Decision::Shift { refusal, .. } = &plans[1].decision else { panic!("{:?}", plans[1]) };
    assert_eq!(
        (refusal.calendar.as_str(), refusal.date, refusal.why),
        ("de-holidays", date("2026-12-25"), Why::Holiday)
    );
    assert_eq!(plans[2].nominal, utc("2026-12-28T08:00:00Z"));
    assert_eq!(plans[2].runs_at(), None);
    assert_eq!(plans[2].merged_into, Some(utc("2026-12-25T08:00:00Z")));
}

#[test]
fn one_time_seen_alone_has_the_fate_the_live_schedule_gives_it() {
    let calendars = Calendars::new([de_holidays()]);
    let weekdays = cron("0 0 9 * * MON-FRI", "Europe/Berlin");
    let zone = schedule_zone(&weekdays);
    let shift = refs(json!([{"name": "de-holidays", "rule": "shift_next_business_day"}]));
    let fate = |rules: &[CalendarRef], at: &str| fate_of(&weekdays, zone, rules, &calendars, utc(at));
    assert_eq!(fate(&shift, "2026-12-24T08:00:00Z"), Fate::Runs { shifted: None });
    let Fate::Runs { shifted: Some((refusal, at)) } = fate(&shift, "2026-12-25T08:00:00Z") else {
        panic!("Christmas is shifted")
    };
    assert_eq!((refusal.date, at), (date("2026-12-25"), utc("2026-12-28T08:00:00Z")));
    let Fate::Merged { into, .. } = fate(&shift, "2026-12-28T08:00:00Z") else {
        panic!("Monday's own fire runs with Christmas's")
    };
    assert_eq!(into, utc("2026-12-25T08:00:00Z"));
    let exclude = refs(json!([{"name": "de-holidays", "rule": "exclude"}]));
    assert!(matches!(fate(&exclude, "2026-12-25T08:00:00Z"), Fate::Skipped(_)));
    assert_eq!(fate(&exclude, "2026-12-28T08:00:00Z"), Fate::Runs { shifted: None });
    assert_eq!(fate(&[], "2026-12-25T08:00:00Z"), Fate::Runs { shifted: None }, "no calendars");
}

#[test]
fn max_runs_counts_only_the_fires_that_run_on_their_own() {
    let calendars = Calendars::new([de_holidays()]);
    let weekdays = cron("0 0 9 * * MON-FRI", "Europe/Berlin");
    let shift = refs(json!([{"name": "de-holidays", "rule": "shift_next_business_day"}]));
    let fires = Fires {
        schedule: &weekdays,
        zone: schedule_zone(&weekdays),
        refs: &shift,
        calendars: &calendars,
        start: utc("2026-12-24T00:00:00Z"),
        end_at: None,
    };
    // Thu 24th, Fri 25th (runs Mon 28th), Mon 28th (merged), Tue 29th.
    let own: Vec<_> = fires.own_runs().take(3).collect();
    assert_eq!(own, [utc("2026-12-24T08:00:00Z"), utc("2026-12-25T08:00:00Z"), utc("2026-12-29T08:00:00Z")]);
    assert_eq!(fires.nth_run(3), Some(utc("2026-12-29T08:00:00Z")));
    // Shifted past `end_at`: Christmas does not run, so it does not count.
    let bounded = Fires { end_at: Some(utc("2026-12-28T00:00:00Z")), ..fires };
    assert_eq!(bounded.own_runs().collect::<Vec<_>>(), [utc("2026-12-24T08:00:00Z")]);
    assert_eq!(bounded.nth_run(2), None);
}

#[test]
fn shifting_back_skips_the_weekend_and_keeps_the_wall_clock() {
    let calendars = Calendars::new([de_holidays()]);
    let monthly = cron("0 30 7 1 * *", "Europe/Berlin");
    let rules = refs(json!([{"name": "de-holidays", "rule": "shift_previous_business_day"}]));
    // 2026-05-01 is a Friday holiday: back to Thursday 30 April, 07:30 CEST.
    let decision = decide(&rules, &calendars, utc("2026-05-01T05:30:00Z"), schedule_zone(&monthly));
    assert!(
        matches!(decision, Decision::Shift { at, .. } if at == utc("2026-04-30T05:30:00Z")),
        "{decision:?}"
    );
    // 2026-01-01 (Thursday holiday) back to Wednesday 31 December 2025, 07:30 CET.
    let decision = decide(&rules, &calendars, utc("2026-01-01T06:30:00Z"), schedule_zone(&monthly));
    assert!(
        matches!(decision, Decision::Shift { at, .. } if at == utc("2025-12-31T06:30:00Z")),
        "{decision:?}"
    );
}

#[test]
fn a_calendar_in_another_zone_judges_the_day_on_its_own_clock() {
    let tokyo = calendar(json!({
        "namespace": "n", "name": "jp", "zone": "Asia/Tokyo", "holidays": ["2026-12-25"],
        "working_days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
    }));
    let calendars = Calendars::new([tokyo]);
    let rules = refs(json!([{"name": "jp", "rule": "exclude"}]));
    // 20:00 UTC on the 24th is 05:00 on the 25th in Tokyo; 20:00 UTC on the 25th is the 26th.
    let first = decide(&rules, &calendars, utc("2026-12-24T20:00:00Z"), Tz::UTC);
    assert_eq!(
        first,
        Decision::Skip(Refusal { calendar: "jp".into(), date: date("2026-12-25"), why: Why::Holiday })
    );
    assert_eq!(decide(&rules, &calendars, utc("2026-12-25T20:00:00Z"), Tz::UTC), Decision::Fire);
    // 14:59:59 UTC on the 25th is still 23:59:59 on the 25th in Tokyo.
    let last = decide(&rules, &calendars, utc("2026-12-25T14:59:59Z"), Tz::UTC);
    assert_eq!(last, first);
}

#[test]
fn a_shift_onto_the_spring_gap_fires_at_the_end_of_the_gap() {
    let cal = calendar(json!({
        "namespace": "n", "name": "c", "zone": "Europe/Berlin", "holidays": ["2026-03-28"],
        "working_days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
    }));
    let calendars = Calendars::new([cal]);
    let nightly = cron("0 30 2 * * *", "Europe/Berlin");
    let rules = refs(json!([{"name": "c", "rule": "shift_next_business_day"}]));
    // 02:30 on 2026-03-28 (CET, 01:30Z) moves to the 29th, where 02:30 does not exist: 03:00 CEST.
    let decision = decide(&rules, &calendars, utc("2026-03-28T01:30:00Z"), schedule_zone(&nightly));
    assert!(
        matches!(decision, Decision::Shift { at, .. } if at == utc("2026-03-29T01:00:00Z")),
        "{decision:?}"
    );
}

#[test]
fn working_hours_exclude_fires_outside_them_and_bases_compose() {
    let office = calendar(json!({
        "namespace": "n", "name": "office", "zone": "Europe/Berlin",
        "working_hours": {"start": "09:00", "end": "17:00"}, "base": ["de-holidays"],
    }));
    let mut de = de_holidays();
    de.namespace = "n".into();
    let calendars = Calendars::new([office, de]);
    let rules = refs(json!([{"name": "office", "rule": "exclude"}]));
    assert_eq!(decide(&rules, &calendars, utc("2026-12-22T08:00:00Z"), Tz::UTC), Decision::Fire);
    let late = decide(&rules, &calendars, utc("2026-12-22T16:00:00Z"), Tz::UTC);
    assert!(matches!(late, Decision::Skip(Refusal { why: Why::OutsideWorkingHours, .. })), "{late:?}");
    let base = decide(&rules, &calendars, utc("2026-12-25T10:00:00Z"), Tz::UTC);
    assert!(matches!(&base, Decision::Skip(r) if r.calendar == "de-holidays"), "{base:?}");
}

#[test]
fn task_calendar_lists_are_refused_naming_every_problem() {
    let list = json!([
        {"name": "a", "rule": "exclude"},
        {"name": "a", "rule": "exclude"},
        {"name": "b c", "rule": "sometimes"},
        {"name": "d", "rule": "shift_next_business_day"},
        {"name": "e", "rule": "shift_previous_business_day"},
    ]);
    let errors = CalendarRef::read_list(&list, "calendars").expect_err("refused").into_vec();
    let fields: Vec<&str> = errors.iter().filter_map(|e| e.field.as_deref()).collect();
    for field in ["calendars[1].name", "calendars[2].name", "calendars[2].rule", "calendars"] {
        assert!(fields.contains(&field), "{field} not named in {errors:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Properties

const ZONES: &[&str] = &["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Lord_Howe"];

fn arb_calendar() -> impl Strategy<Value = Calendar> {
    (
        0..ZONES.len(),
        prop::array::uniform7(any::<bool>()).prop_filter("a working day", |d| d.contains(&true)),
        prop::collection::btree_set(0u64..400, 0..60),
    )
        .prop_map(|(zone, working_days, offsets)| Calendar {
            namespace: "n".into(),
            name: "c".into(),
            zone: ZONES[zone].parse().expect("zone"),
            holidays: offsets.into_iter().map(|d| date("2026-01-01") + Days::new(d)).collect(),
            working_days,
            working_hours: None,
            base: Vec::new(),
        })
}

fn arb_instant() -> impl Strategy<Value = DateTime<Utc>> {
    (0i64..365 * 24 * 60).prop_map(|m| utc("2026-01-01T00:00:00Z") + TimeDelta::minutes(m))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Exclude fires exactly on business days; a shift lands on one, on the right side of the
    /// nominal time, at the same wall-clock time (unless that time does not exist that day).
    #[test]
    fn shifts_land_on_business_days_and_exclude_never_fires_on_other_days(
        cal in arb_calendar(),
        nominal in arb_instant(),
        zone in 0..ZONES.len(),
        next in any::<bool>(),
    ) {
        let schedule_zone: Tz = ZONES[zone].parse().expect("zone");
        let calendars = Calendars::new([cal.clone()]);
        let business = calendars.check("c", nominal, true).is_ok();
        let exclude = [CalendarRef { name: "c".into(), rule: CalendarRule::Exclude }];
        prop_assert_eq!(decide(&exclude, &calendars, nominal, schedule_zone) == Decision::Fire, business);
        let rule = if next { CalendarRule::ShiftNextBusinessDay } else { CalendarRule::ShiftPreviousBusinessDay };
        let shift = [CalendarRef { name: "c".into(), rule }];
        match decide(&shift, &calendars, nominal, schedule_zone) {
            Decision::Fire => prop_assert!(business),
            Decision::Skip(_) => prop_assert!(false, "a calendar with a working day always has one within a year"),
            Decision::Shift { at, refusal } => {
                prop_assert!(!business);
                prop_assert_eq!(refusal.date, nominal.with_timezone(&cal.zone).date_naive());
                prop_assert!(calendars.check("c", at, false).is_ok(), "{at} is not a business day");
                let moved_right_way = if next { at > nominal } else { at < nominal };
                prop_assert!(moved_right_way, "{at} from {nominal}");
                let wall = |t: DateTime<Utc>| t.with_timezone(&schedule_zone).time();
                let nominal_wall = wall(nominal);
                let landed = NaiveDateTime::new(at.with_timezone(&schedule_zone).date_naive(), nominal_wall);
                let exists = !matches!(schedule_zone.from_local_datetime(&landed), LocalResult::None);
                prop_assert!(!exists || wall(at) == nominal_wall, "{} at {}", nominal, at);
            }
        }
    }

    /// A plan's fires run in strictly increasing order, each on a business day.
    #[test]
    fn planned_fires_increase_and_land_on_business_days(
        cal in arb_calendar(),
        start in arb_instant(),
        hour in 0u32..24,
        next in any::<bool>(),
    ) {
        let calendars = Calendars::new([cal]);
        let rule = if next { CalendarRule::ShiftNextBusinessDay } else { CalendarRule::ShiftPreviousBusinessDay };
        let rules = [CalendarRef { name: "c".into(), rule }];
        let daily = cron(&format!("0 15 {hour} * * *"), "Europe/Berlin");
        let mut last = start;
        for planned in plan(&daily, schedule_zone(&daily), &rules, &calendars, start, 40) {
            if let Some(at) = planned.runs_at() {
                prop_assert!(at > last, "{at} after {last}");
                prop_assert!(calendars.check("c", at, false).is_ok());
                last = at;
            }
        }
    }
}

proptest! {
    /// The fires counted towards `max_runs` are exactly the ones a plan runs.
    #[test]
    fn counted_fires_are_the_planned_runs(
        cal in arb_calendar(),
        start in arb_instant(),
        hour in 0u32..24,
        rule in prop_oneof![
            Just(CalendarRule::Exclude),
            Just(CalendarRule::ShiftNextBusinessDay),
            Just(CalendarRule::ShiftPreviousBusinessDay),
        ],
    ) {
        let calendars = Calendars::new([cal]);
        let rules = [CalendarRef { name: "c".into(), rule }];
        let daily = cron(&format!("0 15 {hour} * * *"), "Europe/Berlin");
        let zone = schedule_zone(&daily);
        let planned: Vec<_> = plan(&daily, zone, &rules, &calendars, start - TimeDelta::milliseconds(1), 60)
            .into_iter()
            .filter(|p| p.runs_at().is_some())
            .map(|p| p.nominal)
            .collect();
        let last = daily.upcoming(start - TimeDelta::milliseconds(1), 60).pop().expect("a daily schedule");
        let fires = Fires { schedule: &daily, zone, refs: &rules, calendars: &calendars, start, end_at: None };
        let counted: Vec<_> = fires.own_runs().take_while(|at| *at <= last).collect();
        prop_assert_eq!(counted, planned);
    }
}

#[test]
fn weekday_indexing_matches_chrono() {
    let cal = calendar(json!({"namespace": "n", "name": "c", "zone": "UTC", "working_days": ["sun"]}));
    assert_eq!(date("2026-12-27").weekday(), Weekday::Sun);
    assert!(cal.own_day(date("2026-12-27")).is_ok());
    assert_eq!(cal.own_day(date("2026-12-28")), Err(Why::NotAWorkingDay));
}
