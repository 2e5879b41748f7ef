//! End-to-end tests of jetsched-console against a real system (nats-server, registry,
//! scheduler and worker in-process) and a real browser (headless Chromium over WebDriver):
//! sign-in, the task list and its search, next fires across a DST change, pause from the task
//! page, replay from a dead letter's page, the live events tail; refusals of requests without
//! the token, without the form's CSRF token and without `--allow-actions`.
//!
//! `JETSCHED_CONSOLE_SCREENSHOTS=<dir>` writes a screenshot of each page into `<dir>`.

pub(crate) mod browser;
mod comfort;
mod dependencies;
mod operator_actions;
mod pages;
mod perf;
mod queues;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fantoccini::Locator;
use jetsched_tests::{Api, App, NatsServer, eventually, spec};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use browser::{Browser, csrf_of, http_request};

const WAIT: Duration = Duration::from_secs(20);
const TOKEN: &str = "console-test-token";

/// A console on the server, in-process; its pages' address.
pub(crate) async fn console(
    server: &NatsServer,
    token: Option<&str>,
    allow_actions: bool,
) -> (App, SocketAddr) {
    let mut config = jetsched_console::Config::for_tests(&server.url());
    config.auth_token = token.map(str::to_string);
    config.allow_actions = allow_actions;
    let console = jetsched_console::build(config).await.expect("the console builds");
    let addr = console.http_addr();
    let app = App::spawn("console", console.admin_addr(), |shutdown| console.run(shutdown));
    eventually(WAIT, "the console is ready", || app.ready()).await;
    (app, addr)
}

/// A registry, a scheduler and a worker whose handler `rejects` fails for good (counting its
/// calls), plus the specs the tests look at.
struct System {
    server: NatsServer,
    api: Api,
    rejected: Arc<AtomicUsize>,
    _apps: Vec<App>,
}

async fn system() -> System {
    let server = NatsServer::start().await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let scheduler = App::scheduler(jetsched_scheduler::Config::for_tests(&server.url())).await;
    let rejected = Arc::new(AtomicUsize::new(0));
    let calls = rejected.clone();
    let handlers = Handlers::new()
        .register("rejects", move |_run: RunContext| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Outcome::permanent("export refused: <b>quota</b> exceeded") }
        })
        .register("ok", |_run: RunContext| async { Outcome::ok() });
    let worker = App::worker(jetsched_worker::Config::for_tests(&server.url(), "w-console"), handlers).await;
    let api = Api::new(&server.client().await);
    eventually(WAIT, "the registry is ready", || registry.ready()).await;
    let tasks = [
        spec("billing", "monthly-close")
            .cron_in("0 0 12 1 * *", "Europe/Berlin")
            .handler("ok")
            .labels(&[("team", "billing"), ("tier", "gold")]),
        spec("billing", "nightly-report").cron("0 30 2 * * *").handler("ok").labels(&[("team", "billing")]),
        spec("ops", "cleanup")
            .every("10m")
            .handler("ok")
            .labels(&[("team", "ops"), ("note", "<script>alert(1)</script>")]),
        // Runs only when triggered (the test counts its calls): once a year, at New Year in
        // UTC, an hourly schedule would have fired too when the test crossed the hour.
        spec("ops", "flaky-export").cron("0 0 0 1 1 *").handler("rejects").fast_retry(1).timeout("5s"),
    ];
    for task in tasks {
        api.store(&task.json()).await;
    }
    System { server, api, rejected, _apps: vec![registry, scheduler, worker] }
}

fn screenshots() -> Option<PathBuf> {
    std::env::var_os("JETSCHED_CONSOLE_SCREENSHOTS").map(PathBuf::from)
}

/// The rows of the task table (their text).
async fn task_rows(browser: &Browser) -> Vec<String> {
    let Ok(rows) = browser.client.find_all(Locator::Css("#task-table tbody tr")).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for row in rows {
        out.push(row.text().await.unwrap_or_default());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_browser_lists_searches_pauses_replays_and_tails_events() {
    let system = system().await;
    let (_console, addr) = console(&system.server, Some(TOKEN), true).await;
    let base = format!("http://{addr}");
    let shots = screenshots();
    let browser = Browser::start().await;
    let page = &browser.client;

    // Without the token the console shows only the sign-in form; the token opens a session.
    page.goto(&format!("{base}/tasks")).await.unwrap();
    assert!(browser.text("main").await.contains("Sign in"), "{}", browser.text("main").await);
    assert!(task_rows(&browser).await.is_empty(), "no task is shown before signing in");
    browser.type_into("input[name=token]", TOKEN).await;
    browser.click("form[action='/login'] button").await;

    // The task list shows the applied tasks (back on /tasks after signing in).
    let rows = eventually(WAIT, "the task list shows the four tasks", || async {
        let rows = task_rows(&browser).await;
        (rows.len() == 4).then_some(rows)
    })
    .await;
    for id in ["monthly-close", "nightly-report", "cleanup", "flaky-export"] {
        assert!(rows.iter().any(|row| row.contains(id)), "{id} in {rows:?}");
    }
    let labels = browser.text("#task-table").await;
    assert!(labels.contains("note=<script>alert(1)</script>"), "a hostile label is shown as text: {labels}");
    browser.screenshot(shots.as_ref(), "tasks").await;

    // Searching filters as one types (htmx), and the label filter narrows further.
    browser.type_into("input[name=q]", "report").await;
    eventually(WAIT, "the search keeps only nightly-report", || async {
        let rows = task_rows(&browser).await;
        rows.len() == 1 && rows[0].contains("nightly-report")
    })
    .await;
    page.goto(&format!("{base}/tasks?label=team%3Dbilling&namespace=billing")).await.unwrap();
    let rows = task_rows(&browser).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(browser.text("#task-table .count").await.contains("2 of 4 tasks"));

    // The task page shows the next fires in UTC and Berlin time, with a DST change marked
    // (ten monthly fires always cross March or October).
    page.goto(&format!("{base}/tasks/billing/monthly-close")).await.unwrap();
    let fires = browser.text("#next-fires").await;
    assert_eq!(fires.matches("T11:00:00").count() + fires.matches("T10:00:00").count(), 10, "{fires}");
    assert!(fires.contains("Europe/Berlin") && fires.contains("DST change: offset"), "{fires}");
    browser.screenshot(shots.as_ref(), "task").await;

    // Pause from the page: the registry's API confirms.
    browser.click("form[action='/tasks/billing/monthly-close/pause'] button").await;
    eventually(WAIT, "the page shows the task paused", || async {
        browser.text("#task-state").await == "paused"
    })
    .await;
    let stored = system.api.on("get", "billing", "monthly-close").await;
    assert_eq!(stored["task"]["paused"], true, "{stored}");

    // A run that fails for good lands in the dead letters; replay from its page dispatches it
    // again (the handler runs a second time).
    let triggered = system.api.on("trigger", "ops", "flaky-export").await;
    assert!(triggered.get("execution_id").is_some(), "{triggered}");
    page.goto(&format!("{base}/dlq")).await.unwrap();
    browser
        .refresh_until(WAIT, "the dead letter is listed", "#dlq-entries", |text| {
            text.contains("flaky-export")
        })
        .await;
    assert!(browser.text("#dlq-entries").await.contains("export refused: <b>quota</b> exceeded"));
    browser.screenshot(shots.as_ref(), "dlq").await;
    browser.click("#dlq-entries tbody tr a").await;
    let attempts = browser.text("#attempts").await;
    assert!(attempts.contains("permanent") && attempts.contains("w-console"), "{attempts}");
    browser.screenshot(shots.as_ref(), "dlq-entry").await;
    assert_eq!(system.rejected.load(Ordering::SeqCst), 1);
    browser.click("form[action$='/replay'] button").await;
    eventually(WAIT, "the replayed run executes again", || async {
        system.rejected.load(Ordering::SeqCst) == 2
    })
    .await;
    // The replay lands on the new run's page: every attempt and the trace id.
    browser
        .refresh_until(WAIT, "the run page shows the replayed run's attempt", "#attempts", |text| {
            text.contains("permanent")
        })
        .await;
    assert_eq!(browser.text("#trace-id").await.len(), 32, "a trace id");
    browser.screenshot(shots.as_ref(), "run").await;

    // The live events page receives a new event without a reload.
    page.goto(&format!("{base}/events?kind=task")).await.unwrap();
    eventually(WAIT, "the live tail is connected", || async {
        browser.text("#live-status").await.starts_with("Live: connected")
    })
    .await;
    let before = browser.text("#event-rows").await;
    assert!(!before.contains("task.resumed"), "{before}");
    let resumed = system.api.on("resume", "billing", "monthly-close").await;
    assert!(resumed.get("error").is_none(), "{resumed}");
    eventually(WAIT, "the resume event appears live", || async {
        browser.text("#event-rows tr.fresh").await.contains("task.resumed")
    })
    .await;
    assert!(
        browser.text("#live-status").await.contains("1 new event"),
        "{}",
        browser.text("#live-status").await
    );
    browser.screenshot(shots.as_ref(), "events").await;

    // The other pages render for docs/console.md.
    page.goto(&format!("{base}/runs")).await.unwrap();
    assert!(browser.text("main").await.contains("flaky-export"));
    page.goto(&format!("{base}/")).await.unwrap();
    browser
        .refresh_until(WAIT, "the overview names the leader", "#leader", |text| !text.contains("no leader"))
        .await;
    assert!(browser.text("#dead-letters").await.contains('1'), "{}", browser.text("#dead-letters").await);
    browser.screenshot(shots.as_ref(), "overview").await;
    browser.close().await;
}

#[tokio::test]
async fn console_refuses_without_token_csrf_or_allowed_actions() {
    let system = system().await;
    let (_guarded, guarded) = console(&system.server, Some(TOKEN), true).await;
    let bearer = format!("Authorization: Bearer {TOKEN}");

    // Every page needs the token: 401 without it or with a wrong one, a session after /login.
    for path in [
        "/",
        "/tasks",
        "/tasks/ops/cleanup",
        "/runs",
        "/dlq",
        "/events",
        "/events/stream",
        "/breakers",
        "/queues",
    ] {
        assert_eq!(http_request(guarded, "GET", path, &[], "").await.status, 401, "{path}");
    }
    assert_eq!(
        http_request(guarded, "GET", "/tasks", &["Authorization: Bearer wrong"], "").await.status,
        401
    );
    assert_eq!(http_request(guarded, "GET", "/tasks", &[&bearer], "").await.status, 200);
    assert_eq!(http_request(guarded, "POST", "/login", &[], "token=wrong").await.status, 401);
    let login = http_request(guarded, "POST", "/login", &[], &format!("token={TOKEN}&next=/tasks")).await;
    assert_eq!((login.status, login.header("location")), (303, Some("/tasks")));
    let cookie = login.header("set-cookie").expect("a session cookie").split(';').next().unwrap().to_string();
    assert!(login.header("set-cookie").unwrap().contains("HttpOnly"));
    let cookie = format!("Cookie: {cookie}");
    let page = http_request(guarded, "GET", "/tasks/ops/cleanup", &[&cookie], "").await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;")
            && !page.body.contains("<script>alert(1)")
    );
    // The assets need no token.
    assert_eq!(http_request(guarded, "GET", "/assets/htmx-2.0.4.min.js", &[], "").await.status, 200);

    // Every action needs the form's CSRF token, whatever the authentication.
    let csrf = csrf_of(&page.body);
    let pause = "/tasks/ops/cleanup/pause";
    assert_eq!(http_request(guarded, "POST", pause, &[&bearer], "").await.status, 403);
    assert_eq!(http_request(guarded, "POST", pause, &[&cookie], "csrf=forged").await.status, 403);
    assert_eq!(http_request(guarded, "POST", pause, &[], &format!("csrf={csrf}")).await.status, 401);
    assert_eq!(system.api.on("get", "ops", "cleanup").await["task"]["paused"], false);
    let done = http_request(guarded, "POST", pause, &[&cookie], &format!("csrf={csrf}")).await;
    assert_eq!((done.status, done.header("location")), (303, Some("/tasks/ops/cleanup")));
    assert_eq!(system.api.on("get", "ops", "cleanup").await["task"]["paused"], true);
    // Delete needs its confirmation box.
    let delete = "/tasks/ops/cleanup/delete";
    assert_eq!(http_request(guarded, "POST", delete, &[&cookie], &format!("csrf={csrf}")).await.status, 400);
    assert!(system.api.on("get", "ops", "cleanup").await.get("task").is_some());

    // Without --allow-actions every action is refused, even with the right CSRF token, and the
    // buttons are disabled.
    let (_reader, reader) = console(&system.server, None, false).await;
    let page = http_request(reader, "GET", "/tasks/ops/cleanup", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("disabled"), "buttons are disabled");
    let csrf = csrf_of(&page.body);
    for (path, form) in [
        ("/tasks/ops/cleanup/resume", format!("csrf={csrf}")),
        ("/tasks/ops/cleanup/delete", format!("csrf={csrf}&confirm=yes")),
        ("/dlq/1/purge", format!("csrf={csrf}&confirm=yes")),
    ] {
        let refused = http_request(reader, "POST", path, &[], &form).await;
        assert_eq!(refused.status, 403, "{path}");
        assert!(refused.body.contains("--allow-actions"), "{}", refused.body);
    }
    assert_eq!(system.api.on("get", "ops", "cleanup").await["task"]["paused"], true);
}

#[tokio::test]
async fn console_user_of_the_secured_config_reads_every_page_without_a_violation() {
    let server = crate::deploy::SecureServer::start().await;
    let mut registry_config = jetsched_registry::Config::for_tests(&server.url);
    registry_config.shared.nats = server.nats_args("registry");
    let registry = App::registry(registry_config).await;
    eventually(WAIT, "the registry is ready", || registry.ready()).await;
    let api = Api::new(&server.connect("client").await.client);
    api.store(&spec("ops", "secured").every("1h").field("labels", json!({"team": "ops"})).json()).await;

    let mut config = jetsched_console::Config::for_tests(&server.url);
    config.shared.nats = server.nats_args("console");
    let console = jetsched_console::build(config).await.expect("the console builds as user console");
    let addr = console.http_addr();
    let app = App::spawn("console", console.admin_addr(), |shutdown| console.run(shutdown));
    eventually(WAIT, "the console is ready", || app.ready()).await;

    let tasks = http_request(addr, "GET", "/tasks", &[], "").await;
    assert!(tasks.status == 200 && tasks.body.contains("secured"), "{}", tasks.body);
    // A run of the task, told as a worker tells it: the task's history walks back to it.
    let worker = server.connect("worker").await.client;
    let event = jetsched_shared::wire::Event {
        execution_id: Some("secured-run-1".into()),
        ..jetsched_shared::wire::Event::new(jetsched_shared::wire::EventKind::RunSucceeded, "ops", "secured")
    };
    let names = jetsched_shared::names::Names::default();
    let subject = names.event_subject(event.kind.as_str(), "ops", "secured");
    worker.publish(subject, serde_json::to_vec(&event).unwrap().into()).await.unwrap();
    worker.flush().await.unwrap();
    eventually(WAIT, "the task's run is in its history", || async {
        http_request(addr, "GET", "/runs?task=secured", &[], "").await.body.contains("secured-run-1")
    })
    .await;
    let range = "/runs?from=2026-01-01T00:00&to=2099-01-01T00:00";
    let task = "/runs?namespace=ops&task=secured&from=2026-01-01T00:00&to=2099-01-01T00:00";
    for path in ["/", "/tasks/ops/secured", "/runs", range, task, "/dlq", "/events", "/breakers", "/queues"] {
        let page = http_request(addr, "GET", path, &[], "").await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(!page.body.contains(r#"role="alert""#), "{path} reports a problem: {}", page.body);
    }
    let log = server.log();
    assert!(!log.contains("User \"console\""), "violations of user console:\n{log}");
    app.stop().await;
}
