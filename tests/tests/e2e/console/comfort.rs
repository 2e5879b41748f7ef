//! The console for a day on call, in a browser against a real system: the task list's columns
//! (next fire, last run and outcome, success rate, priority, breaker) and filters by priority
//! and state combined with the others; times redrawn in the zone the reader picks (remembered
//! across pages); trace links from `--trace-url`; a run's page updating itself without a
//! reload; the queues page's charts from real runs; and the pages in the dark scheme.

use std::time::Duration;

use chrono::{DateTime, Utc};
use fantoccini::Locator;
use jetsched_tests::{Api, App, NatsServer, eventually, spec};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use super::browser::Browser;
use super::{WAIT, screenshots, task_rows};

const TRACE_URL: &str = "http://jaeger.example:16686/trace/{trace_id}";

/// A registry, a scheduler, a worker (handlers `ok`, `slow` and `fails`) and a console with
/// `--trace-url`; three tasks of different priorities, one failing with a breaker.
async fn system() -> (NatsServer, Api, Vec<App>, String) {
    let server = NatsServer::start().await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let scheduler = App::scheduler(jetsched_scheduler::Config::for_tests(&server.url())).await;
    let handlers = Handlers::new()
        .register("ok", |_run: RunContext| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Outcome::ok()
        })
        .register("slow", |_run: RunContext| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Outcome::ok()
        })
        .register("fails", |_run: RunContext| async { Outcome::permanent("card declined") });
    let mut worker_config = jetsched_worker::Config::for_tests(&server.url(), "w-comfort");
    worker_config.pull_expires = Duration::from_millis(500);
    let worker = App::worker(worker_config, handlers).await;
    let api = Api::new(&server.client().await);
    eventually(WAIT, "the registry is ready", || registry.ready()).await;
    let breaker =
        json!({"key": "card-api", "min_runs": 1000, "failure_rate": 0.5, "window": "1m", "open_for": "1m"});
    for task in [
        spec("ops", "heartbeat").every("1s").handler("ok").field("priority", "high"),
        // Never fires during the test: its next fire is New Year in Tokyo.
        spec("ops", "report").cron_in("0 0 0 1 1 *", "Asia/Tokyo").handler("slow").field("priority", "low"),
        spec("billing", "charge").every("2s").handler("fails").fast_retry(1).field("breaker", breaker),
    ] {
        let stored = api.store(&task.json()).await;
        assert!(stored.get("error").is_none(), "{stored}");
    }
    let mut config = jetsched_console::Config::for_tests(&server.url());
    config.trace_url = Some(TRACE_URL.to_string());
    let console = jetsched_console::build(config).await.expect("the console builds");
    let base = format!("http://{}", console.http_addr());
    let app = App::spawn("console", console.admin_addr(), |shutdown| console.run(shutdown));
    eventually(WAIT, "the console is ready", || app.ready()).await;
    (server, api, vec![registry, scheduler, worker, app], base)
}

/// The row of the task list naming `id`.
async fn row_of(browser: &Browser, id: &str) -> String {
    task_rows(browser).await.into_iter().find(|row| row.contains(id)).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_for_a_day_on_call_columns_filters_zones_traces_live_runs_charts_and_dark_mode() {
    let (_server, api, _apps, base) = system().await;
    let shots = screenshots();
    // The browser's own zone is New York, so each of the three choices shows another time.
    let browser = Browser::start_with(&[], Some("America/New_York")).await;
    let page = &browser.client;

    // The list shows each task's next fire, last run and outcome, success rate, priority and
    // breaker with its state.
    page.goto(&format!("{base}/tasks")).await.unwrap();
    browser
        .refresh_until(WAIT, "heartbeat and charge have run", "#task-table", |text| {
            text.contains("succeeded") && text.contains("failed")
        })
        .await;
    let heartbeat = row_of(&browser, "heartbeat").await;
    assert!(
        heartbeat.contains("succeeded") && heartbeat.contains("100%") && heartbeat.contains("high"),
        "{heartbeat}"
    );
    assert_eq!(
        heartbeat.matches("Z (").count(),
        2,
        "the next fire and the last run, each relative: {heartbeat}"
    );
    let charge = row_of(&browser, "charge").await;
    assert!(charge.contains("failed") && charge.contains("0%") && charge.contains("normal"), "{charge}");
    assert!(charge.contains("billing:card-api closed"), "breaker and state: {charge}");
    let report = row_of(&browser, "report").await;
    assert!(report.contains("low") && report.contains("Z (in "), "the next fire, relative: {report}");
    browser.screenshot(shots.as_ref(), "task-list").await;

    // Filters: priority, state (failing, with a breaker), combined with queue and id.
    for (query, expected) in [
        ("priority=high", vec!["heartbeat"]),
        ("state=failing", vec!["charge"]),
        ("state=breaker&queue=default", vec!["charge"]),
        ("state=failing&priority=normal&q=char", vec!["charge"]),
        ("state=failing&priority=low", vec![]),
        ("priority=low&state=active", vec!["report"]),
    ] {
        page.goto(&format!("{base}/tasks?{query}")).await.unwrap();
        let rows = task_rows(&browser).await;
        assert_eq!(rows.len(), expected.len(), "{query}: {rows:?}");
        for (row, id) in rows.iter().zip(&expected) {
            assert!(row.contains(id), "{query}: {row}");
        }
    }

    // Times: UTC by default; the task's zone (Tokyo) and the browser's (New York) on request,
    // remembered on the next page.
    page.goto(&format!("{base}/tasks?q=report")).await.unwrap();
    let next = "#task-table td.next-fire time";
    let element = page.find(Locator::Css(next)).await.expect("a next fire");
    let at: DateTime<Utc> = element.attr("datetime").await.unwrap().unwrap().parse().unwrap();
    let shown = |offset_hours: i64| {
        (at + chrono::Duration::hours(offset_hours)).format("%Y-%m-%d %H:%M:%S").to_string()
    };
    assert_eq!(browser.text(next).await, format!("{}Z", shown(0)));
    let choice = page.find(Locator::Css("#zone-choice")).await.expect("the zone choice is shown");
    choice.select_by_value("task").await.unwrap();
    eventually(WAIT, "the next fire is shown in Tokyo time", || async {
        browser.text(next).await.starts_with(&shown(9))
    })
    .await;
    page.find(Locator::Css("#zone-choice")).await.unwrap().select_by_value("browser").await.unwrap();
    eventually(WAIT, "the next fire is shown in New York time", || async {
        browser.text(next).await.starts_with(&shown(-5))
    })
    .await;
    page.goto(&format!("{base}/tasks?priority=low")).await.unwrap();
    assert!(
        browser.text(next).await.starts_with(&shown(-5)),
        "the choice is remembered: {}",
        browser.text(next).await
    );
    page.find(Locator::Css("#zone-choice")).await.unwrap().select_by_value("utc").await.unwrap();

    // Trace links: a run's page and the events page link each execution to its trace.
    page.goto(&format!("{base}/tasks?q=heartbeat")).await.unwrap();
    browser.click("#task-table td.last-run a").await;
    let trace_id = browser.text_when(WAIT, "the run's page loads", "#trace-id", |t| !t.is_empty()).await;
    assert_eq!(trace_id.len(), 32, "a trace id: {trace_id}");
    let link = page.find(Locator::Css("dd a.trace")).await.expect("a trace link");
    assert_eq!(link.attr("href").await.unwrap().unwrap(), TRACE_URL.replace("{trace_id}", &trace_id));
    page.goto(&format!("{base}/events?kind=run&task=ops/heartbeat")).await.unwrap();
    let href = page
        .find(Locator::Css("#event-rows a.trace"))
        .await
        .expect("trace links")
        .attr("href")
        .await
        .unwrap();
    assert!(href.unwrap().starts_with("http://jaeger.example:16686/trace/"));

    // A run's page follows the run as it happens, without reloading.
    let triggered = api.on("trigger", "ops", "report").await;
    let execution = triggered["execution_id"].as_str().expect("an execution id").to_string();
    page.goto(&format!("{base}/runs/{execution}")).await.unwrap();
    assert!(
        page.find(Locator::Css("main[data-live]")).await.is_ok(),
        "the page is live while the run is not finished"
    );
    page.execute("window.sameDocument = true;", vec![]).await.unwrap();
    eventually(Duration::from_secs(30), "the run page shows the run succeeded", || async {
        browser.text("dl.facts").await.contains("succeeded")
    })
    .await;
    let same = page.execute("return window.sameDocument === true;", vec![]).await.unwrap();
    assert_eq!(same, json!(true), "the page updated itself in place, without a reload");
    assert!(
        page.find(Locator::Css("main[data-live]")).await.is_err(),
        "a finished run's page stops listening"
    );

    // The queues page charts each lane's last hour from the runs.
    page.goto(&format!("{base}/queues")).await.unwrap();
    let lane = "#queue-charts [data-queue='default'][data-lane='high']";
    browser
        .refresh_until(WAIT, "the high lane's charts count runs and waits", lane, |text| {
            text.contains("runs/s") && text.contains("(wait, ") && !text.contains("(wait, 0 runs)")
        })
        .await;
    for chart in ["rate-chart", "wait-chart", "duration-chart"] {
        assert!(page.find(Locator::Css(&format!("{lane} figure.{chart} svg"))).await.is_ok(), "{chart}");
    }
    assert!(page.find(Locator::Css(&format!("{lane} polyline.p99"))).await.is_ok(), "a p99 line");
    browser.screenshot(shots.as_ref(), "queue-charts").await;

    // Accessibility and destructive actions.
    page.goto(&format!("{base}/tasks/billing/charge")).await.unwrap();
    assert_eq!(browser.text("a.skip").await, "", "the skip link is off screen until focused");
    assert!(page.find(Locator::Css("a.skip[href='#content']")).await.is_ok());
    assert!(
        page.find(Locator::Css("form.danger[action$='/delete']")).await.is_ok(),
        "delete is styled as destructive"
    );
    assert!(page.find(Locator::Css("form.action:not(.danger)[action$='/trigger']")).await.is_ok());
    browser.close().await;

    // The dark scheme, as a browser preferring it shows the pages.
    let dark =
        Browser::start_with(&["--blink-settings=preferredColorScheme=0", "--force-dark-mode"], None).await;
    dark.client.goto(&format!("{base}/tasks")).await.unwrap();
    let scheme = dark
        .client
        .execute(
            "return [matchMedia('(prefers-color-scheme: dark)').matches, getComputedStyle(document.body).backgroundColor];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(scheme, json!([true, "rgb(13, 17, 23)"]), "the dark scheme's page background");
    dark.screenshot(shots.as_ref(), "dark").await;
    dark.close().await;
}
