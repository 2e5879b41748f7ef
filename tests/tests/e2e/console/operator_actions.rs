//! The console's operator actions in a real browser against a real system: editing a spec in
//! a form (every problem at once, compare-and-set over the revision loaded, a conflicting edit
//! refused), retrying a dead run by replaying its dead letter with the links between run, dead
//! letter and replay, bulk replay of the dead letters a filter selects, a pause with its
//! reason, and a backfill started from a task's page.

use std::time::Duration;

use async_nats::jetstream;
use fantoccini::Locator;
use jetsched_shared::names::Names;
use jetsched_shared::wire::Trigger;
use jetsched_tests::fixtures::{dead_letter_entry, dead_letter_of, dead_letters, noting, store_dead_letter};
use jetsched_tests::{Api, App, NatsServer, eventually, spec};
use jetsched_worker::Outcome;
use serde_json::{Value, json};

use super::browser::Browser;
use super::console;

const WAIT: Duration = Duration::from_secs(20);

/// A server, a registry and the API on it.
async fn registry() -> (NatsServer, App, Api) {
    let server = NatsServer::start().await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    eventually(WAIT, "the registry is ready", || registry.ready()).await;
    let api = Api::new(&server.client().await);
    (server, registry, api)
}

/// Replaces the editor's text (a textarea keeps what a script sets as what the user typed).
async fn set_spec_text(browser: &Browser, text: &str) {
    browser
        .client
        .execute("document.querySelector('#spec').value = arguments[0];", vec![json!(text)])
        .await
        .expect("set the spec's text");
}

async fn spec_text(browser: &Browser) -> String {
    let element = browser.client.find(Locator::Css("#spec")).await.expect("the editor's textarea");
    element.prop("value").await.expect("its value").unwrap_or_default()
}

async fn texts(browser: &Browser, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    for element in browser.client.find_all(Locator::Css(css)).await.unwrap_or_default() {
        out.push(element.text().await.unwrap_or_default());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_edits_a_spec_showing_every_problem_at_once_and_saves_only_over_the_revision_loaded() {
    let (server, _registry, api) = registry().await;
    let (_console, addr) = console(&server, None, true).await;
    let base = format!("http://{addr}");
    let original = spec("ops", "report").every("1h").handler("ok");
    let loaded = api.store(&original.json()).await["revision"].as_u64().expect("a revision");

    let browser = Browser::start().await;
    browser.client.goto(&format!("{base}/tasks/ops/report")).await.unwrap();
    browser.click("#edit-task").await;
    let revision = browser.text_when(WAIT, "the editor loads", "#editor-revision", |t| !t.is_empty()).await;
    assert_eq!(revision, loaded.to_string());
    let prefilled: Value = serde_json::from_str(&spec_text(&browser).await).expect("the stored spec as JSON");
    assert_eq!(prefilled["schedule"]["every"], "1h", "{prefilled}");

    // Three problems: all named at once, the text kept, nothing stored.
    let mut broken = prefilled.clone();
    broken["schedule"] = json!({"cron": "0 61 * * * *"});
    broken["executor"] = json!({"kind": "nats", "subject": "jobs.*"});
    broken["timeout"] = json!("forever");
    let broken_text = serde_json::to_string_pretty(&broken).unwrap();
    set_spec_text(&browser, &broken_text).await;
    browser.click("form.editor button[type=submit]").await;
    eventually(WAIT, "the refused edit's page lists its problems", || async {
        !texts(&browser, "#form-problems li").await.is_empty()
    })
    .await;
    let problems = texts(&browser, "#form-problems li").await;
    assert_eq!(problems.len(), 3, "{problems:?}");
    for field in ["schedule.cron", "executor.subject", "timeout"] {
        assert!(problems.iter().any(|p| p.contains(field)), "{field} named: {problems:?}");
    }
    assert_eq!(spec_text(&browser).await, broken_text, "the text is kept");
    assert_eq!(api.on("get", "ops", "report").await["revision"], loaded, "nothing stored");

    // Fixed: stored over the revision loaded, and the task's page shows it.
    let mut fixed = prefilled.clone();
    fixed["schedule"] = json!({"every": "2h"});
    set_spec_text(&browser, &serde_json::to_string_pretty(&fixed).unwrap()).await;
    browser.click("form.editor button[type=submit]").await;
    eventually(WAIT, "the save lands on the task's page", || async {
        browser.client.current_url().await.is_ok_and(|url| url.path() == "/tasks/ops/report")
    })
    .await;
    let stored = api.on("get", "ops", "report").await;
    assert_eq!(stored["task"]["schedule"]["every"], "2h", "{stored}");
    let saved = stored["revision"].as_u64().unwrap();
    assert!(saved > loaded, "{stored}");

    // A conflicting edit: someone else saves after the form was loaded; the console's save is
    // refused saying so, and their version stays.
    browser.click("#edit-task").await;
    let revision = browser.text_when(WAIT, "the editor loads", "#editor-revision", |t| !t.is_empty()).await;
    assert_eq!(revision, saved.to_string());
    let theirs = spec("ops", "report").every("2h").handler("ok").labels(&[("owner", "someone-else")]);
    let other = api.put_over(&theirs.json(), saved).await;
    let their_revision = other["revision"].as_u64().unwrap_or_else(|| panic!("their save: {other}"));
    let mut mine = fixed.clone();
    mine["schedule"] = json!({"every": "3h"});
    set_spec_text(&browser, &serde_json::to_string_pretty(&mine).unwrap()).await;
    browser.click("form.editor button[type=submit]").await;
    // The refusal is a new page: wait for it rather than read the form being submitted.
    eventually(WAIT, "the conflicting save is refused on the page", || async {
        browser.text("#form-problems").await.contains("someone else changed this task")
    })
    .await;
    let problems = browser.text("#form-problems").await;
    assert!(problems.contains(&format!("you loaded revision {saved}")), "{problems}");
    assert!(browser.text("#their-version").await.contains("someone-else"), "their version is shown");
    assert!(spec_text(&browser).await.contains("3h"), "my text is kept");
    let stored = api.on("get", "ops", "report").await;
    assert_eq!(stored["revision"], their_revision, "{stored}");
    assert_eq!(stored["task"]["labels"]["owner"], "someone-else", "{stored}");
    assert_eq!(stored["task"]["schedule"]["every"], "2h", "{stored}");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_pauses_a_task_with_its_reason_shown_on_its_page_and_by_jetsched_get() {
    let (server, _registry, api) = registry().await;
    let (_console, addr) = console(&server, None, true).await;
    api.store(&spec("ops", "cleanup").every("10m").handler("ok").json()).await;
    let browser = Browser::start().await;
    browser.client.goto(&format!("http://{addr}/tasks/ops/cleanup")).await.unwrap();
    let reason = "database migration until 15:00";
    browser.type_into("#pause-form input[name=reason]", reason).await;
    browser.click("#pause-form button").await;
    eventually(WAIT, "the page shows the task paused", || async {
        browser.text("#task-state").await == "paused"
    })
    .await;
    assert_eq!(browser.text("#pause-reason").await, format!("({reason})"));
    let stored = api.on("get", "ops", "cleanup").await;
    assert_eq!(stored["task"]["paused_reason"], reason, "{stored}");
    let output = crate::cli::jetsched(&server.url(), &["get", "ops/cleanup"]).await;
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && shown.contains(reason), "{shown}");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_retries_a_dead_run_by_replaying_its_dead_letter_and_links_run_dead_letter_and_replay() {
    let (server, _registry, api) = registry().await;
    let (handlers, runs) = noting(
        "rejects",
        |run| run.execution_id.clone(),
        |_run| async { Outcome::permanent("refused for good") },
    );
    let _worker = App::worker(jetsched_worker::Config::for_tests(&server.url(), "w-retry"), handlers).await;
    let (_console, addr) = console(&server, None, true).await;
    let base = format!("http://{addr}");
    api.store(
        &spec("ops", "export").cron("0 0 0 1 1 *").handler("rejects").fast_retry(1).timeout("5s").json(),
    )
    .await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let dead = api.on("trigger", "ops", "export").await["execution_id"].as_str().unwrap().to_string();
    dead_letter_of(&js, &names, &dead, WAIT).await;

    // The dead run links to its dead letter, which links back to the run.
    let browser = Browser::start().await;
    browser.client.goto(&format!("{base}/runs/{dead}")).await.unwrap();
    browser
        .refresh_until(WAIT, "the run page links its dead letter", "#dead-letter", |t| !t.is_empty())
        .await;
    browser.click("#dead-letter a").await;
    browser.text_when(WAIT, "the dead letter's page loads", "h1", |t| t.starts_with("Dead letter")).await;
    browser.click(&format!("a[href='/runs/{dead}']")).await;

    // Retry now: the dead letter is replayed (and so consumed), the new run executes.
    browser.click("#retry button").await;
    eventually(WAIT, "the replay lands on the new run's page", || async {
        browser.client.current_url().await.is_ok_and(|url| url.path() != format!("/runs/{dead}"))
    })
    .await;
    let replay = browser.client.current_url().await.unwrap().path().trim_start_matches("/runs/").to_string();
    browser
        .refresh_until(WAIT, "the new run's page names the dead run", "#replay-of", |t| t.contains(&dead))
        .await;
    eventually(WAIT, "the replay runs", || async { runs.lock().unwrap().contains(&replay) }).await;
    assert_eq!(*runs.lock().unwrap(), vec![dead.clone(), replay.clone()]);
    let left = dead_letters(&js, &names).await;
    assert!(left.iter().all(|entry| entry.execution_id != dead), "the dead letter was consumed");
    let record = dead_letter_of(&js, &names, &replay, WAIT).await;
    assert_eq!(record.trigger, Trigger::Replay);

    // And back: the dead run's page names its replay.
    browser.click("#replay-of a").await;
    browser.refresh_until(WAIT, "the dead run links its replay", "#replays", |t| t.contains(&replay)).await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_bulk_replays_exactly_the_dead_letters_a_filter_selects() {
    let (server, _registry, _api) = registry().await;
    let (handlers, runs) =
        noting("ok", |run| (run.task_id.clone(), run.trigger), |_run| async { Outcome::ok() });
    let _worker = App::worker(jetsched_worker::Config::for_tests(&server.url(), "w-bulk"), handlers).await;
    let (_console, addr) = console(&server, None, true).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    // Two dead letters of ops/a with a 503, one of ops/b without, one of billing/c with: the
    // filter namespace=ops, error=503 selects the two of ops/a only.
    let entries = [
        ("ops", "a", "e-a1", "HTTP 503 from upstream"),
        ("ops", "b", "e-b1", "quota exceeded"),
        ("ops", "a", "e-a2", "http 503 again"),
        ("billing", "c", "e-c1", "HTTP 503 from upstream"),
    ];
    for (namespace, id, execution, reason) in entries {
        let task = spec(namespace, id).cron("0 0 0 1 1 *").handler("ok").json();
        let mut entry = dead_letter_entry(&task, execution);
        entry["reason"] = json!(reason);
        store_dead_letter(&js, names.dlq_subject("default", namespace, id), &entry).await.expect("stored");
    }

    let browser = Browser::start().await;
    browser.client.goto(&format!("http://{addr}/dlq")).await.unwrap();
    browser.type_into("form.filters input[name=namespace]", "ops").await;
    browser.type_into("form.filters input[name=error]", "503").await;
    browser.click("form.filters button").await;
    eventually(WAIT, "the filter shows the two selected", || async {
        texts(&browser, "#dlq-entries tbody tr").await.len() == 2
    })
    .await;
    assert_eq!(browser.text("#dlq-bulk button[value=replay]").await, "Replay 2 selected…");
    browser.click("#dlq-bulk button[value=replay]").await;
    browser
        .text_when(WAIT, "the bulk form counts the selection", "#bulk-count", |t| {
            t.starts_with("2 dead letters selected")
        })
        .await;
    browser.click("#bulk-form input[name=confirm]").await;
    browser.click("#bulk-form button").await;
    let replayed =
        browser.text_when(WAIT, "the bulk result loads", "#replayed-count", |t| !t.is_empty()).await;
    assert_eq!(replayed, "2", "{}", browser.text("main").await);
    assert_eq!(browser.text("#refused-count").await, "0");

    eventually(WAIT, "both replayed runs run", || async { runs.lock().unwrap().len() == 2 }).await;
    assert_eq!(*runs.lock().unwrap(), vec![("a".to_string(), Trigger::Replay); 2]);
    let mut left: Vec<String> = dead_letters(&js, &names).await.into_iter().map(|e| e.execution_id).collect();
    left.sort();
    assert_eq!(left, ["e-b1", "e-c1"], "the others stay");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_starts_a_backfill_from_a_task_page_follows_it_and_names_every_problem() {
    let (server, _registry, api) = registry().await;
    let scheduler = crate::scheduler::spawn_scheduler(&server.url(), "console-bf", Duration::from_secs(2));
    crate::scheduler::tasks_loaded(&scheduler).await;
    let (_console, addr) = console(&server, None, true).await;
    api.store(&spec("ops", "hourly").every("1h").handler("ok").json()).await;
    let browser = Browser::start().await;
    let page = format!("http://{addr}/tasks/ops/hourly");
    browser.client.goto(&page).await.unwrap();
    assert_eq!(browser.text("#backfills p.empty").await, "No backfill of this task.");

    // A bad request: the page lists every problem, and nothing is started.
    browser.type_into("#backfill-form input[name=from]", "yesterday").await;
    browser.type_into("#backfill-form input[name=to]", "2999-01-01T00:00:00Z").await;
    browser.click("#backfill-form button").await;
    let problems = browser.text_when(WAIT, "the refusal's page", "div.error", |t| !t.is_empty()).await;
    assert!(problems.contains("from") && problems.contains("future"), "{problems}");
    let listed = api.call(api.names().backfill_api_namespaced("list", "ops"), json!({"id": "hourly"})).await;
    assert_eq!(listed["backfills"], json!([]), "nothing started: {listed}");

    // A day of hourly times, up to 100 runs in flight (no worker runs them here): all 24 are
    // dispatched, and the task's page shows the backfill finished with its counts.
    browser.client.goto(&page).await.unwrap();
    browser.type_into("#backfill-form input[name=from]", "2025-06-01T00:00:00Z").await;
    browser.type_into("#backfill-form input[name=to]", "2025-06-02T00:00:00Z").await;
    browser
        .client
        .execute("document.querySelector('#backfill-form input[name=max_active]').value = '100';", vec![])
        .await
        .expect("set max active");
    browser.click("#backfill-form button").await;
    browser
        .refresh_until(WAIT, "the backfill finished on the task's page", "#backfill-table td.state", |t| {
            t == "finished"
        })
        .await;
    assert_eq!(browser.text("#backfill-table td.dispatched").await, "24");
    let listed = api.call(api.names().backfill_api_namespaced("list", "ops"), json!({"id": "hourly"})).await;
    assert_eq!(listed["backfills"][0]["dispatched"], 24, "{listed}");
    assert_eq!(listed["backfills"][0]["max_active"], 100, "{listed}");
    browser.screenshot(super::screenshots().as_ref(), "backfill").await;
    browser.close().await;
}
