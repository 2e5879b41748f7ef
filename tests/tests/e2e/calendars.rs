//! End-to-end tests of business calendars: the registry's calendar API (compare-and-set, every
//! problem named, cycles of bases, deletion refused while in use, namespaces kept apart), tasks
//! naming calendars, and the `jetsched calendar` CLI round trip.

use async_nats::HeaderMap;
use jetsched_shared::wire::{HDR_CREATE_ONLY, HDR_EXPECTED_REVISION};
use jetsched_tests::Api;
use jetsched_tests::spec;
use serde_json::{Value, json};

use crate::cli::{jetsched, json_out};
use crate::registry::{Served, served};

/// German public holidays of 2026 observed in Berlin, Monday to Friday working.
fn de_holidays(namespace: &str) -> Value {
    json!({
        "namespace": namespace, "name": "de-holidays", "zone": "Europe/Berlin",
        "holidays": ["2026-01-01", "2026-04-03", "2026-04-06", "2026-05-01", "2026-12-25", "2026-12-26"],
        "working_days": ["mon", "tue", "wed", "thu", "fri"],
    })
}

/// `put` of a calendar on its namespace's subject, with compare-and-set headers.
async fn put(api: &Api, calendar: &Value, headers: HeaderMap) -> Value {
    let namespace = calendar["namespace"].as_str().unwrap_or("default");
    api.call_with(api.names().calendar_api_namespaced("put", namespace), headers, calendar.clone()).await
}

async fn put_over(api: &Api, calendar: &Value, revision: u64) -> Value {
    let mut headers = HeaderMap::new();
    headers.insert(HDR_EXPECTED_REVISION, revision.to_string().as_str());
    put(api, calendar, headers).await
}

async fn calendar(api: &Api, endpoint: &str, namespace: &str, body: Value) -> Value {
    api.call(api.names().calendar_api_namespaced(endpoint, namespace), body).await
}

fn code(reply: &Value) -> &str {
    reply["error"]["code"].as_str().unwrap_or_else(|| panic!("expected an error, got {reply}"))
}

fn fields(reply: &Value) -> Vec<String> {
    let errors = reply["errors"].as_array().unwrap_or_else(|| panic!("expected errors, got {reply}"));
    errors.iter().filter_map(|e| e["field"].as_str().map(str::to_owned)).collect()
}

fn messages(reply: &Value) -> String {
    let errors = reply["errors"].as_array().unwrap_or_else(|| panic!("expected errors, got {reply}"));
    errors.iter().filter_map(|e| e["message"].as_str()).collect::<Vec<_>>().join(" | ")
}

#[tokio::test]
async fn calendars_are_stored_with_compare_and_set_and_every_problem_is_named() {
    let Served { server: _server, registry, api, .. } = served(|_| {}).await;

    let mut create_only = HeaderMap::new();
    create_only.insert(HDR_CREATE_ONLY, "true");
    let stored = put(&api, &de_holidays("team-a"), create_only.clone()).await;
    assert!(stored.get("error").is_none(), "{stored}");
    let revision = stored["revision"].as_u64().expect("revision");
    assert_eq!(stored["calendar"]["zone"], "Europe/Berlin");
    assert_eq!(code(&put(&api, &de_holidays("team-a"), create_only).await), "conflict");

    // An edit over the revision read goes through; one over a stale revision is refused with
    // the current revision.
    let mut edited = de_holidays("team-a");
    edited["holidays"].as_array_mut().unwrap().push(json!("2026-12-31"));
    let second = put_over(&api, &edited, revision).await;
    let second_revision = second["revision"].as_u64().unwrap_or_else(|| panic!("{second}"));
    let stale = put_over(&api, &de_holidays("team-a"), revision).await;
    assert_eq!(code(&stale), "conflict", "{stale}");
    assert_eq!(stale["error"]["current_revision"], second_revision, "{stale}");

    // A bad calendar: every problem named, nothing stored.
    let bad = json!({
        "namespace": "team-a", "name": "bad", "zone": "Mars/Olympus",
        "holidays": ["2026-02-30"], "working_days": ["mon", "funday"],
        "working_hours": {"start": "18:00", "end": "09:00"}, "colour": "red",
    });
    let refused = put(&api, &bad, HeaderMap::new()).await;
    let named = fields(&refused);
    for field in ["colour", "zone", "holidays[0]", "working_days[1]", "working_hours"] {
        assert!(named.iter().any(|f| f == field), "{field} not named: {refused}");
    }
    assert_eq!(code(&calendar(&api, "get", "team-a", json!({"name": "bad"})).await), "not_found");

    // Bases: unknown ones and cycles are refused, naming them.
    let office = json!({"namespace": "team-a", "name": "office", "zone": "Europe/Berlin",
                        "working_hours": {"start": "09:00", "end": "17:00"}, "base": ["de-holidays", "nowhere"]});
    let refused = put(&api, &office, HeaderMap::new()).await;
    assert!(fields(&refused).contains(&"base[1]".to_string()), "{refused}");
    assert!(messages(&refused).contains("nowhere"), "{refused}");
    let office = json!({"namespace": "team-a", "name": "office", "zone": "Europe/Berlin",
                        "working_hours": {"start": "09:00", "end": "17:00"}, "base": ["de-holidays"]});
    assert!(put(&api, &office, HeaderMap::new()).await.get("error").is_none());
    let mut cyclic = edited.clone();
    cyclic["base"] = json!(["office"]);
    let refused = put(&api, &cyclic, HeaderMap::new()).await;
    assert!(messages(&refused).contains("de-holidays -> office -> de-holidays"), "{refused}");

    // A task naming an unknown calendar is refused naming it; a known one is stored.
    let unknown = spec("team-a", "report")
        .cron_in("0 0 9 * * *", "Europe/Berlin")
        .field(
            "calendars",
            json!([{"name": "de-holidays", "rule": "exclude"}, {"name": "us-holidays", "rule": "exclude"}]),
        )
        .json();
    let refused = api.put(&unknown).await;
    assert_eq!(fields(&refused), ["calendars[1].name"], "{refused}");
    assert!(messages(&refused).contains("us-holidays"), "{refused}");
    let task = spec("team-a", "report")
        .cron_in("0 0 9 * * *", "Europe/Berlin")
        .field("calendars", json!([{"name": "office", "rule": "shift_next_business_day"}]))
        .json();
    let stored_task = api.store(&task).await;
    assert_eq!(
        stored_task["task"]["calendars"],
        json!([{"name": "office", "rule": "shift_next_business_day"}])
    );

    // Deleting a calendar in use is refused naming its users.
    let refused = calendar(&api, "delete", "team-a", json!({"name": "de-holidays"})).await;
    assert_eq!(code(&refused), "conflict", "{refused}");
    assert!(messages(&refused).contains("calendar team-a/office"), "{refused}");
    let refused = calendar(&api, "delete", "team-a", json!({"name": "office"})).await;
    assert!(messages(&refused).contains("task team-a/report"), "{refused}");
    let got = calendar(&api, "get", "team-a", json!({"name": "office"})).await;
    assert_eq!(got["used_by"], json!(["task team-a/report"]), "{got}");

    // Another namespace neither sees nor changes team-a's calendars.
    let other = calendar(&api, "get", "team-b", json!({"namespace": "team-a", "name": "office"})).await;
    assert_eq!(code(&other), "namespace_mismatch", "{other}");
    assert_eq!(code(&calendar(&api, "get", "team-b", json!({"name": "office"})).await), "not_found");
    let listed = calendar(&api, "list", "team-b", json!({})).await;
    assert_eq!(listed["calendars"], json!([]), "{listed}");
    let intruder =
        api.call(api.names().calendar_api_namespaced("put", "team-b"), de_holidays("team-a")).await;
    assert_eq!(code(&intruder), "namespace_mismatch", "{intruder}");
    let refused = calendar(&api, "delete", "team-b", json!({"namespace": "team-a", "name": "office"})).await;
    assert_eq!(code(&refused), "namespace_mismatch", "{refused}");
    // team-b's task cannot name team-a's calendar either.
    let borrowed =
        spec("team-b", "report").field("calendars", json!([{"name": "office", "rule": "exclude"}])).json();
    assert_eq!(fields(&api.put(&borrowed).await), ["calendars[0].name"]);

    // Once nothing uses them, they go.
    assert!(api.on("delete", "team-a", "report").await.get("error").is_none());
    let deleted = calendar(&api, "delete", "team-a", json!({"name": "office"})).await;
    assert_eq!(deleted["deleted"], true, "{deleted}");
    let deleted = calendar(&api, "delete", "team-a", json!({"name": "de-holidays"})).await;
    assert_eq!(deleted["deleted"], true, "{deleted}");
    let listed = api.call(api.names().calendar_api_subject("list"), json!({})).await;
    assert_eq!(listed["calendars"], json!([]), "{listed}");
    registry.stop().await;
}

#[tokio::test]
async fn the_cli_applies_gets_lists_and_removes_a_calendar_and_refuses_a_stale_revision() {
    let Served { server, registry, .. } = served(|_| {}).await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("de-holidays.yaml");
    std::fs::write(
        &file,
        "namespace: team-a\nname: de-holidays\nzone: Europe/Berlin\nholidays: [2026-04-03, 2026-12-25]\n\
         working_days: [mon, tue, wed, thu, fri]\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();

    let applied = json_out(&jetsched(&url, &["calendar", "apply", path, "--revision", "0", "--json"]).await);
    let revision = applied["revision"].as_u64().expect("revision");
    let text = jetsched(&url, &["calendar", "apply", path, "--revision", &revision.to_string()]).await;
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    assert!(String::from_utf8_lossy(&text.stdout).contains("calendar team-a/de-holidays stored"));

    // The first revision is stale now: refused, exit 1, saying so.
    let stale = jetsched(&url, &["calendar", "apply", path, "--revision", &revision.to_string()]).await;
    assert_eq!(stale.status.code(), Some(1));
    let said = String::from_utf8_lossy(&stale.stderr);
    assert!(said.contains("conflict") || said.contains("not "), "{said}");
    assert!(said.contains(&format!("not {revision}")), "{said}");

    let got = json_out(&jetsched(&url, &["calendar", "get", "team-a/de-holidays", "--json"]).await);
    assert_eq!(got["calendar"]["holidays"], json!(["2026-04-03", "2026-12-25"]));
    assert_eq!(got["used_by"], json!([]));
    let shown = jetsched(&url, &["calendar", "get", "team-a/de-holidays"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("Europe/Berlin") && shown.contains("mon,tue,wed,thu,fri"), "{shown}");

    let listed = json_out(&jetsched(&url, &["calendar", "ls", "team-a", "--json"]).await);
    assert_eq!(listed["calendars"].as_array().map(Vec::len), Some(1), "{listed}");
    let table = jetsched(&url, &["calendar", "ls"]).await;
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.starts_with("CALENDAR") && table.contains("team-a/de-holidays"), "{table}");

    // A bad file is refused naming each problem.
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"namespace": "team-a", "name": "bad", "zone": "Nowhere", "working_days": ["noday"]}"#,
    )
    .unwrap();
    let refused = jetsched(&url, &["calendar", "apply", bad.to_str().unwrap()]).await;
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("zone") && said.contains("working_days[0]"), "{said}");

    // `next` explains every time the calendar skips.
    let task = dir.path().join("report.yaml");
    std::fs::write(
        &task,
        "namespace: team-a\nid: report\nschedule: {cron: '0 0 9 * * *', timezone: Europe/Berlin}\n\
         executor: {kind: nats, subject: jobs.report}\ncalendars: [{name: de-holidays, rule: exclude}]\n",
    )
    .unwrap();
    let next = ["next", "--file", task.to_str().unwrap(), "-c", "4", "--after", "2026-12-23T12:00:00Z"];
    let preview = json_out(&jetsched(&url, &[&next[..], &["--json"]].concat()).await);
    assert_eq!(
        preview["notes"],
        json!([
            "",
            "skipped: calendar de-holidays (2026-12-25)",
            "skipped: calendar de-holidays (2026-12-26)",
            "skipped: calendar de-holidays (2026-12-27)"
        ]),
        "{preview}"
    );
    let table = String::from_utf8_lossy(&jetsched(&url, &next).await.stdout).into_owned();
    assert!(table.contains("skipped: calendar de-holidays (2026-12-25)"), "{table}");

    let removed = jetsched(&url, &["calendar", "rm", "team-a/de-holidays"]).await;
    assert!(removed.status.success(), "{}", String::from_utf8_lossy(&removed.stderr));
    let gone = jetsched(&url, &["calendar", "get", "team-a/de-holidays"]).await;
    assert_eq!(gone.status.code(), Some(1));
    registry.stop().await;
}

#[tokio::test]
async fn a_max_runs_count_leaves_out_the_fires_the_calendars_skip_in_next_and_get() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let url = server.url();
    let stored = put(&api, &de_holidays("team-c"), HeaderMap::new()).await;
    assert!(stored.get("error").is_none(), "{stored}");
    // Daily at 09:00 Berlin from Mon 21 December, five runs, none on a holiday or a weekend:
    // 21, 22, 23, 24 and 28 December (from the spec alone the fifth would be the 25th).
    let task = spec("team-c", "report")
        .cron_in("0 0 9 * * *", "Europe/Berlin")
        .field("start_at", "2026-12-21T00:00:00Z")
        .field("max_runs", 5)
        .field("calendars", json!([{"name": "de-holidays", "rule": "exclude"}]))
        .json();
    api.store(&task).await;
    let next = json_out(
        &jetsched(&url, &["--json", "next", "team-c/report", "-c", "10", "--after", "2026-12-20T00:00:00Z"])
            .await,
    );
    assert_eq!(
        (&next["last_fire"], &next["ends_by"]),
        (&json!("2026-12-28T08:00:00.000Z"), &json!("max_runs")),
        "{next}"
    );
    assert_eq!(next["times"].as_array().map(Vec::len), Some(8), "21 to 28 December: {next}");

    // The scheduler has passed the 25th (skipped): one run is left, and the task is not
    // completed, though the spec's own fifth fire is behind it.
    let names = jetsched_shared::names::Names::default();
    let state = js.get_key_value(names.state_bucket()).await.unwrap();
    let fire = json!({"last_nominal_fire": "2026-12-25T08:00:00.000Z", "fires": 4, "revision": 1});
    state
        .put(jetsched_shared::names::task_key("team-c", "report"), fire.to_string().into_bytes().into())
        .await
        .unwrap();
    let got = json_out(&jetsched(&url, &["--json", "get", "team-c/report"]).await);
    let status = &got["status"];
    assert_eq!((&status["remaining_runs"], &status["state"]), (&json!(1), &json!("active")), "{got}");
}

// ---- the scheduler following calendars ------------------------------------------------------

mod scheduled {
    use std::sync::Arc;
    use std::time::Duration;

    use chrono::{DateTime, Datelike, Days, NaiveDate, SecondsFormat, Utc};
    use jetsched_scheduler::{Clock, Config, ManualClock, build_with_clock};
    use jetsched_shared::names::{Names, task_key};
    use jetsched_shared::schedule::Schedule;
    use jetsched_shared::topology::TopologyArgs;
    use jetsched_tests::fixtures::write_task;
    use jetsched_tests::{App, WithTopology, eventually, read_stream, server_with_topology, spec};
    use serde_json::{Value, json};

    use crate::scheduler::read_dispatches;

    const WAIT: Duration = Duration::from_secs(20);
    const NS: &str = "cal";

    fn ms(text: &str) -> i64 {
        text.parse::<DateTime<Utc>>().expect("instant").timestamp_millis()
    }

    async fn start(with: &WithTopology, at: &str) -> (App, ManualClock) {
        start_as(with, at, "calendars").await
    }

    async fn start_as(with: &WithTopology, at: &str, instance: &str) -> (App, ManualClock) {
        let clock = ManualClock::at(ms(at) * 1000);
        let mut config = Config::for_tests(&with.server.url());
        config.shared.common.instance_id = Some(instance.to_string());
        let scheduler =
            Box::pin(build_with_clock(config, Arc::new(clock.clone()))).await.expect("scheduler builds");
        let app = App::spawn("scheduler", scheduler.admin_addr(), |shutdown| scheduler.run(shutdown));
        let leader = with.topology.leader.clone();
        eventually(WAIT, "the scheduler leads", || async {
            let value = leader.get(Names::default().leader_key()).await.ok().flatten();
            value
                .and_then(|v| serde_json::from_slice::<Value>(&v).ok())
                .is_some_and(|r| r["instance"] == instance)
        })
        .await;
        // The clock moves only once the leader has planned its catch-up at the start time:
        // moved before, the plan would see the first fires as days late.
        eventually(WAIT, "the leader has resumed from the fire state", || async {
            app.metrics().await.contains("jetsched_scheduler_resumed 1")
        })
        .await;
        (app, clock)
    }

    async fn put_calendar(with: &WithTopology, calendar: Value) {
        let key =
            format!("{}.{}", calendar["namespace"].as_str().unwrap(), calendar["name"].as_str().unwrap());
        with.topology.calendars.put(key, calendar.to_string().into()).await.expect("calendar stored");
    }

    /// The nominal times (ms) the task was dispatched with.
    async fn dispatched(with: &WithTopology, id: &str) -> Vec<i64> {
        let key = task_key(NS, id);
        read_dispatches(&with.js).await.into_iter().filter(|s| s.task == key).map(|s| s.nominal_ms).collect()
    }

    /// The task's `fire.skipped` events.
    async fn skipped(with: &WithTopology, id: &str) -> Vec<Value> {
        let names = Names::default();
        let subject = names.event_subject("fire.skipped", NS, id);
        let messages = read_stream(&with.js, &names.events_stream(), WAIT).await.expect("events");
        messages
            .into_iter()
            .filter(|m| m.subject.as_str() == subject)
            .filter_map(|m| serde_json::from_slice(&m.payload).ok())
            .collect()
    }

    async fn skip_at(with: &WithTopology, id: &str, nominal: &str) -> Value {
        let wanted = ms(nominal);
        eventually(WAIT, &format!("{id} skipped at {nominal}"), || async {
            skipped(with, id).await.into_iter().find(|e| {
                e["nominal_time"].as_str().and_then(|t| t.parse::<DateTime<Utc>>().ok())
                    == Some(DateTime::from_timestamp_millis(wanted).unwrap())
            })
        })
        .await
    }

    async fn dispatch_at(with: &WithTopology, id: &str, nominal: &str) {
        let wanted = ms(nominal);
        eventually(WAIT, &format!("{id} dispatched for {nominal}"), || async {
            dispatched(with, id).await.contains(&wanted)
        })
        .await;
    }

    fn advance_to(clock: &ManualClock, at: &str) {
        let by = ms(at) - clock.now_ms();
        clock.advance(Duration::from_millis(u64::try_from(by).expect("forward")));
    }

    /// Easter Sunday of `year` (Gregorian, the anonymous algorithm).
    fn easter(year: i32) -> NaiveDate {
        let (a, b, c) = (year % 19, year / 100, year % 100);
        let (d, e) = (b / 4, b % 4);
        let g = (8 * b + 13) / 25;
        let h = (19 * a + b - d - g + 15) % 30;
        let (i, k) = (c / 4, c % 4);
        let l = (32 + 2 * e + 2 * i - h - k) % 7;
        let m = (a + 11 * h + 22 * l) / 451;
        let month = (h + l - 7 * m + 114) / 31;
        let day = (h + l - 7 * m + 114) % 31 + 1;
        NaiveDate::from_ymd_opt(year, month as u32, day as u32).expect("Easter")
    }

    /// The dates are next year's: fires start after a task is stored, on the server's clock.
    fn next_year() -> i32 {
        Utc::now().year() + 1
    }

    /// 09:00 on Berlin's wall clock on `date`, as RFC 3339 UTC.
    fn nine_in_berlin(date: NaiveDate) -> String {
        let schedule = Schedule::parse_value(&json!({"cron": "0 0 9 * * *", "timezone": "Europe/Berlin"}))
            .expect("schedule");
        let midnight = date.and_hms_opt(0, 0, 0).expect("midnight").and_utc();
        let nine = schedule.next_after(midnight).expect("a fire that day");
        nine.to_rfc3339_opts(SecondsFormat::Secs, true)
    }

    /// Noon UTC on `date`, when the day's 09:00 Berlin fire has passed.
    fn noon(date: NaiveDate) -> String {
        format!("{date}T12:00:00Z")
    }

    #[tokio::test]
    async fn good_friday_and_christmas_in_berlin_are_skipped_and_a_live_calendar_edit_applies_to_the_next_fires()
     {
        let with = server_with_topology(TopologyArgs::default()).await;
        let year = next_year();
        let friday = easter(year) - Days::new(2);
        let christmas = NaiveDate::from_ymd_opt(year, 12, 25).expect("Christmas");
        let day = |n: u64| friday + Days::new(n);
        let mut calendar = json!({
            "namespace": NS, "name": "de-holidays", "zone": "Europe/Berlin",
            "holidays": [friday.to_string(), christmas.to_string()],
            "working_days": ["mon", "tue", "wed", "thu", "fri"],
        });
        put_calendar(&with, calendar.clone()).await;
        let task = spec(NS, "report")
            .nats("jobs.report")
            .cron_in("0 0 9 * * *", "Europe/Berlin")
            .field("calendars", json!([{"name": "de-holidays", "rule": "exclude"}]));
        write_task(&with.topology.tasks, &task).await;
        let (scheduler, clock) = start(&with, &noon(friday - Days::new(1))).await;

        // Good Friday: skipped, naming the calendar and the date.
        advance_to(&clock, &noon(friday));
        let skipped_friday = skip_at(&with, "report", &nine_in_berlin(friday)).await;
        assert_eq!(skipped_friday["reason"], "calendar", "{skipped_friday}");
        assert_eq!(skipped_friday["calendar"], "de-holidays", "{skipped_friday}");
        assert_eq!(skipped_friday["calendar_date"], friday.to_string(), "{skipped_friday}");
        advance_to(&clock, &noon(day(3)));
        dispatch_at(&with, "report", &nine_in_berlin(day(3))).await;
        let sunday = skip_at(&with, "report", &nine_in_berlin(day(2))).await;
        assert_eq!(sunday["calendar_date"], day(2).to_string(), "{sunday}");

        // A holiday added while the scheduler runs applies to the next fire.
        calendar["holidays"].as_array_mut().unwrap().push(json!(day(4).to_string()));
        put_calendar(&with, calendar.clone()).await;
        // The edit reaches the scheduler through its watch; nothing observable says when, so
        // give it a moment before the clock moves past the fire.
        tokio::time::sleep(Duration::from_secs(1)).await;
        advance_to(&clock, &noon(day(5)));
        dispatch_at(&with, "report", &nine_in_berlin(day(5))).await;
        let tuesday = skip_at(&with, "report", &nine_in_berlin(day(4))).await;
        assert_eq!(tuesday["calendar_date"], day(4).to_string(), "{tuesday}");

        // Christmas (CET, one hour from UTC).
        advance_to(&clock, &noon(christmas));
        let eve = christmas - Days::new(1);
        if eve.weekday().num_days_from_monday() < 5 {
            dispatch_at(&with, "report", &nine_in_berlin(eve)).await;
        }
        let skipped_christmas = skip_at(&with, "report", &nine_in_berlin(christmas)).await;
        assert_eq!(skipped_christmas["calendar_date"], christmas.to_string(), "{skipped_christmas}");
        let fires = dispatched(&with, "report").await;
        for date in [friday, day(1), day(4), christmas] {
            assert!(!fires.contains(&ms(&nine_in_berlin(date))), "{date} was dispatched");
        }
        scheduler.stop().await;
    }

    /// A Friday holiday in New York (a calendar in another zone than its Berlin task) shifts
    /// that Friday's fire to Monday 09:00 Berlin: the weekend's fires and Monday's own run once
    /// with it, under the Friday's nominal time.
    #[tokio::test]
    async fn a_shift_onto_the_next_occurrence_runs_once_with_a_calendar_in_another_zone() {
        let with = server_with_topology(TopologyArgs::default()).await;
        let first = NaiveDate::from_ymd_opt(next_year(), 12, 1).expect("1 December");
        let friday = first + Days::new(u64::from((4 + 7 - first.weekday().num_days_from_monday()) % 7));
        let day = |n: u64| friday + Days::new(n);
        put_calendar(
            &with,
            json!({"namespace": NS, "name": "us-holidays", "zone": "America/New_York",
                   "holidays": [friday.to_string()], "working_days": ["mon", "tue", "wed", "thu", "fri"]}),
        )
        .await;
        let task = spec(NS, "payroll")
            .nats("jobs.payroll")
            .cron_in("0 0 9 * * *", "Europe/Berlin")
            .field("calendars", json!([{"name": "us-holidays", "rule": "shift_next_business_day"}]));
        write_task(&with.topology.tasks, &task).await;
        let (scheduler, clock) = start(&with, &noon(friday - Days::new(1))).await;

        advance_to(&clock, &noon(day(3)));
        dispatch_at(&with, "payroll", &nine_in_berlin(friday)).await;
        let monday = format!("{}T08:00:00.000Z", day(3));
        for n in [1, 2, 3] {
            let merged = skip_at(&with, "payroll", &nine_in_berlin(day(n))).await;
            assert_eq!(merged["reason"], "calendar", "{merged}");
            assert_eq!(merged["shifted_to"], monday, "{merged}");
        }
        advance_to(&clock, &noon(day(4)));
        dispatch_at(&with, "payroll", &nine_in_berlin(day(4))).await;
        assert_eq!(
            dispatched(&with, "payroll").await,
            [ms(&nine_in_berlin(friday)), ms(&nine_in_berlin(day(4)))],
            "one run for the shifted fire, under its nominal time"
        );
        scheduler.stop().await;
    }

    /// A change of leader between a shifted fire's nominal time and the time it runs, and
    /// another right after it ran: the new leaders plan the shift from the fire state alone, so
    /// the Friday holiday's fire runs once, on Monday, under Friday's nominal time; the
    /// weekend's and Monday's own fires stay merged into it, and Tuesday's runs.
    #[tokio::test]
    async fn a_shifted_fire_runs_once_across_two_changes_of_leader() {
        let with = server_with_topology(TopologyArgs::default()).await;
        let first = NaiveDate::from_ymd_opt(next_year(), 11, 1).expect("1 November");
        let friday = first + Days::new(u64::from((4 + 7 - first.weekday().num_days_from_monday()) % 7));
        let day = |n: u64| friday + Days::new(n);
        put_calendar(
            &with,
            json!({"namespace": NS, "name": "bridge-day", "zone": "Europe/Berlin",
                   "holidays": [friday.to_string()], "working_days": ["mon", "tue", "wed", "thu", "fri"]}),
        )
        .await;
        let task = spec(NS, "ledger")
            .nats("jobs.ledger")
            .cron_in("0 0 9 * * *", "Europe/Berlin")
            .field("calendars", json!([{"name": "bridge-day", "rule": "shift_next_business_day"}]));
        write_task(&with.topology.tasks, &task).await;

        // The first leader sees Thursday's fire and Friday's nominal time pass; Friday's fire
        // waits for Monday when it stops.
        let thursday_date = friday - Days::new(1);
        let (first_leader, clock) = start_as(&with, &format!("{thursday_date}T06:00:00Z"), "first").await;
        advance_to(&clock, &noon(thursday_date));
        dispatch_at(&with, "ledger", &nine_in_berlin(thursday_date)).await;
        let thursday = ms(&nine_in_berlin(thursday_date));
        advance_to(&clock, &noon(friday));
        // Nothing observable says the loop has seen the clock move past Friday's nominal time.
        tokio::time::sleep(Duration::from_millis(500)).await;
        first_leader.stop().await;
        assert_eq!(dispatched(&with, "ledger").await, [thursday], "Friday's fire has not run yet");

        // The second leader runs it on Monday, once, and stops right after.
        let (second_leader, clock) = start_as(&with, &noon(friday), "second").await;
        advance_to(&clock, &noon(day(3)));
        dispatch_at(&with, "ledger", &nine_in_berlin(friday)).await;
        let monday = format!("{}T08:00:00.000Z", day(3));
        for n in [1, 2, 3] {
            let merged = skip_at(&with, "ledger", &nine_in_berlin(day(n))).await;
            assert_eq!(merged["shifted_to"], monday, "{merged}");
        }
        second_leader.stop().await;

        // The third goes on from there: Tuesday, and nothing of Friday again.
        let (third_leader, clock) = start_as(&with, &noon(day(3)), "third").await;
        advance_to(&clock, &noon(day(4)));
        dispatch_at(&with, "ledger", &nine_in_berlin(day(4))).await;
        assert_eq!(
            dispatched(&with, "ledger").await,
            [thursday, ms(&nine_in_berlin(friday)), ms(&nine_in_berlin(day(4)))],
            "the shifted fire once, under its nominal time, across two changes of leader"
        );
        third_leader.stop().await;
    }

    /// Good Friday and the weekend after it are excluded and do not count towards `max_runs`:
    /// three runs are Wednesday, Thursday and Easter Monday, and the task completes with the
    /// third.
    #[tokio::test]
    async fn excluded_fires_do_not_count_towards_max_runs() {
        let with = server_with_topology(TopologyArgs::default()).await;
        let friday = easter(next_year()) - Days::new(2);
        let day = |n: i64| friday.checked_add_signed(chrono::TimeDelta::days(n)).expect("date");
        put_calendar(
            &with,
            json!({"namespace": NS, "name": "de-holidays", "zone": "Europe/Berlin",
                   "holidays": [friday.to_string()], "working_days": ["mon", "tue", "wed", "thu", "fri"]}),
        )
        .await;
        let task = spec(NS, "counted")
            .nats("jobs.counted")
            .cron_in("0 0 9 * * *", "Europe/Berlin")
            .field("start_at", json!(format!("{}T00:00:00Z", day(-2))))
            .field("max_runs", json!(3))
            .field("calendars", json!([{"name": "de-holidays", "rule": "exclude"}]));
        write_task(&with.topology.tasks, &task).await;
        let (scheduler, clock) = start(&with, &noon(day(-3))).await;

        advance_to(&clock, &noon(day(4)));
        dispatch_at(&with, "counted", &nine_in_berlin(day(3))).await;
        skip_at(&with, "counted", &nine_in_berlin(friday)).await;
        let runs = [day(-2), day(-1), day(3)].map(|date| ms(&nine_in_berlin(date)));
        assert_eq!(dispatched(&with, "counted").await, runs, "three runs, none on Tuesday");
        scheduler.stop().await;
    }
}
