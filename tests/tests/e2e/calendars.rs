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

    let removed = jetsched(&url, &["calendar", "rm", "team-a/de-holidays"]).await;
    assert!(removed.status.success(), "{}", String::from_utf8_lossy(&removed.stderr));
    let gone = jetsched(&url, &["calendar", "get", "team-a/de-holidays"]).await;
    assert_eq!(gone.status.code(), Some(1));
    registry.stop().await;
}
