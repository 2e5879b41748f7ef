//! The console's breakers page with a real open breaker (a failing HTTP downstream), reset from
//! the page; the run history paged back past one hour within a time range, from run events
//! written to the events stream with older times.

use chrono::{DateTime, Duration as Span, Utc};
use jetsched_shared::wire::{Event, EventKind, Trigger};
use jetsched_tests::{Api, App, NatsServer, WithTopology, eventually, server_with_topology, spec};
use jetsched_worker::Handlers;
use serde_json::json;

use super::browser::{Browser, http_request};
use super::{WAIT, console, screenshots};
use crate::breakers::Downstream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_browser_shows_an_open_breaker_and_resets_it() {
    let server = NatsServer::start().await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let mut worker_config = jetsched_worker::Config::for_tests(&server.url(), "w-breaker");
    worker_config.pull_expires = std::time::Duration::from_millis(500);
    let _worker = App::worker(worker_config, Handlers::new()).await;
    let api = Api::new(&server.client().await);
    eventually(WAIT, "the registry is ready", || registry.ready()).await;
    let downstream = Downstream::failing().await;
    let breaker =
        json!({"key": "card-api", "min_runs": 2, "failure_rate": 0.5, "window": "1m", "open_for": "10m"});
    let task = spec("payments", "charge")
        .cron("0 0 0 1 1 *")
        .executor(json!({"kind": "http", "method": "POST", "url": downstream.url()}))
        .fast_retry(1)
        .timeout("5s")
        .field("breaker", breaker)
        .field("priority", "high");
    api.store(&task.json()).await;
    let (_console, addr) = console(&server, None, true).await;
    let base = format!("http://{addr}");

    // Runs fail until the breaker opens.
    let reference = json!({"namespace": "payments", "key": "card-api"});
    eventually(WAIT, "the breaker opens", || async {
        if api.breaker("get", reference.clone()).await["state"] == "open" {
            return true;
        }
        api.on("trigger", "payments", "charge").await;
        false
    })
    .await;

    let browser = Browser::start().await;
    let page = &browser.client;
    page.goto(&format!("{base}/breakers")).await.unwrap();
    let row = "#breakers tr[data-key='key.payments.card-api']";
    let text = browser.text(row).await;
    assert!(text.contains("payments:card-api") && text.contains("open"), "{text}");
    assert!(text.contains("payments/charge") && text.contains("1m"), "tasks and window: {text}");
    let opened = browser.text(&format!("{row} td:nth-child(6)")).await;
    assert!(opened.starts_with("20"), "opened at: {opened}");
    browser.screenshot(screenshots().as_ref(), "breakers").await;

    // The task page names its breaker (linked), its priority; the breaker's page its events.
    page.goto(&format!("{base}/tasks/payments/charge")).await.unwrap();
    assert_eq!(browser.text("#task-priority").await, "high");
    browser.click("#task-breaker").await;
    browser
        .refresh_until(WAIT, "the breaker's page lists its opening", "#event-rows", |text| {
            text.contains("breaker.opened")
        })
        .await;
    assert_eq!(browser.text("#breaker-state").await, "open");
    assert!(browser.text("#breaker-tasks").await.contains("payments/charge"));

    // Reset from the page: the API confirms the breaker closed.
    browser.click("form[action='/breakers/key.payments.card-api/reset'] button").await;
    eventually(WAIT, "the page shows the breaker closed", || async {
        browser.text("#breaker-state").await == "closed"
    })
    .await;
    assert_eq!(api.breaker("get", reference).await["state"], "closed");
    browser.close().await;
}

/// A run event of `execution` for the task `hist/report`, at `time`.
fn run_event(execution: &str, time: DateTime<Utc>, failed: bool) -> Event {
    let kind = if failed { EventKind::RunFailed } else { EventKind::RunSucceeded };
    Event {
        time,
        nominal_time: Some(time),
        trigger: Some(Trigger::Schedule),
        execution_id: Some(execution.into()),
        attempt: Some(1),
        worker: Some("w-history".into()),
        duration_ms: Some(12),
        error: failed.then(|| "HTTP 503".to_string()),
        ..Event::new(kind, "hist", "report")
    }
}

/// The executions a history page lists, and its link to older runs.
fn listed(body: &str) -> (Vec<String>, Option<String>) {
    let executions = body
        .split("href=\"/runs/")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_string)
        .collect();
    let older = body
        .split_once("id=\"older\"")
        .and_then(|(_, rest)| rest.split_once("href=\""))
        .and_then(|(_, rest)| rest.split('"').next())
        .map(|href| href.replace("&amp;", "&"));
    (executions, older)
}

/// Every execution the history lists from `path` on, following its links to older runs, and
/// how many pages that took.
async fn every_page(addr: std::net::SocketAddr, path: &str) -> (Vec<String>, usize) {
    let (mut path, mut seen, mut pages) = (path.to_string(), Vec::new(), 0);
    loop {
        let reply = http_request(addr, "GET", &path, &[], "").await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
        let (executions, older) = listed(&reply.body);
        assert!(executions.len() <= 50, "{}", executions.len());
        seen.extend(executions);
        pages += 1;
        match older {
            Some(older) => path = older,
            None => return (seen, pages),
        }
        assert!(pages < 10, "paging ends");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_browser_pages_run_history_back_past_one_hour_within_a_time_range() {
    let WithTopology { server, js, names, .. } = server_with_topology(Default::default()).await;
    // 130 runs a minute apart from 3 h to 50 min ago, every third failed, then 5 runs now; the
    // range asked for ends 1 h ago (120 runs).
    let now = Utc::now();
    let start = now - Span::hours(3);
    let mut events: Vec<Event> =
        (0..130).map(|n| run_event(&format!("old-{n:03}"), start + Span::minutes(n), n % 3 == 0)).collect();
    // old-003 failed for good: its run.dead follows its run.failed, and it is listed once.
    events.insert(
        4,
        Event { kind: EventKind::RunDead, ..run_event("old-003", start + Span::minutes(3), true) },
    );
    events.extend((0..5).map(|n| run_event(&format!("new-{n}"), now, false)));
    // The same task id in another namespace, and another task: a task filter without its
    // namespace finds the first, not the second.
    events.push(Event { namespace: "elsewhere".into(), ..run_event("far-0", now - Span::minutes(1), false) });
    events.push(Event { task_id: "digest".into(), ..run_event("digest-0", now - Span::minutes(1), false) });
    for event in &events {
        let subject = names.event_subject(event.kind.as_str(), &event.namespace, &event.task_id);
        let payload = serde_json::to_vec(event).unwrap();
        js.publish(subject, payload.into()).await.unwrap().await.unwrap();
    }
    let (_console, addr) = console(&server, None, false).await;

    // Without a range the newest runs come first.
    let newest = http_request(addr, "GET", "/runs?task=report", &[], "").await;
    assert_eq!(newest.status, 200, "{}", newest.body);
    let (executions, _) = listed(&newest.body);
    assert!(executions[..5].iter().all(|e| e.starts_with("new-")), "{executions:?}");
    assert_eq!(executions[5], "far-0", "the task's runs in every namespace");
    assert!(!executions.iter().any(|e| e == "digest-0"), "{executions:?}");
    let absent = http_request(addr, "GET", "/runs?task=absent", &[], "").await;
    assert_eq!(absent.status, 200, "{}", absent.body);
    assert!(listed(&absent.body).0.is_empty(), "{}", absent.body);

    // From 3 h 1 min to 1 h ago: the runs of that range, newest first, 50 a page.
    let format = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%S").to_string();
    let range = format!("from={}&to={}", format(start - Span::minutes(1)), format(now - Span::hours(1)));
    let expected: Vec<String> = (0..120).rev().map(|n| format!("old-{n:03}")).collect();
    // Read by windows (a namespace), and walked back by the task's subjects (a task, with or
    // without its namespace): the same runs, the same pages.
    for filter in ["namespace=hist", "task=report", "namespace=hist&task=report"] {
        let (seen, pages) = every_page(addr, &format!("/runs?{filter}&{range}")).await;
        assert_eq!(seen, expected, "{filter}: every run of the range once, newest first");
        assert_eq!(pages, 3, "{filter}");
    }

    // The outcome filter keeps the failed ones.
    let failed = http_request(addr, "GET", &format!("/runs?outcome=failed&{range}"), &[], "").await;
    let (executions, _) = listed(&failed.body);
    assert_eq!(executions.len(), 40, "{executions:?}");
    assert!(failed.body.contains("HTTP 503") && !failed.body.contains("badge succeeded"), "{}", failed.body);

    // A bad query names every problem.
    let bad = http_request(addr, "GET", "/runs?from=yesterday&task=a.b&outcome=won", &[], "").await;
    assert_eq!(bad.status, 400);
    for field in ["from:", "task:", "outcome:"] {
        assert!(bad.body.contains(field), "{field}: {}", bad.body);
    }

    let browser = Browser::start().await;
    browser.client.goto(&format!("http://{addr}/runs?namespace=hist&{range}")).await.unwrap();
    browser.click("#older").await;
    eventually(WAIT, "the older page follows the first one", || async {
        let text = browser.text("main").await;
        text.contains("old-069") && !text.contains("old-070")
    })
    .await;
    browser.screenshot(screenshots().as_ref(), "runs").await;
    browser.close().await;
}
