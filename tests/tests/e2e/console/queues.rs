//! The queues page in a browser: a queue paused from the page starts no run (the runs wait in
//! its lane, shown with their count and age), and resumed from the page it runs them all.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jetsched_tests::{Api, App, NatsServer, always, eventually, spec};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use super::browser::Browser;
use super::{WAIT, console, screenshots};

const PAUSED: &str = r#"jetsched_queue_paused{queue="default"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_paused_from_the_page_starts_nothing_until_resumed_from_the_page() {
    let server = NatsServer::start().await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let count = ran.clone();
    let handlers = Handlers::new().register("count", move |_run: RunContext| {
        count.fetch_add(1, Ordering::SeqCst);
        async { Outcome::ok() }
    });
    let mut worker_config = jetsched_worker::Config::for_tests(&server.url(), "w-queues");
    worker_config.pull_expires = Duration::from_millis(500);
    let worker = App::worker(worker_config, handlers).await;
    let api = Api::new(&server.client().await);
    eventually(WAIT, "the registry is ready", || registry.ready()).await;
    api.store(&spec("ops", "export").cron("0 0 0 1 1 *").handler("count").json()).await;
    let (_console, addr) = console(&server, None, true).await;
    let browser = Browser::start().await;
    let page = &browser.client;

    page.goto(&format!("http://{addr}/queues")).await.unwrap();
    let default = "#queues tr[data-queue='default']";
    assert!(browser.text(default).await.contains("running"), "{}", browser.text("main").await);
    browser.type_into("form[action='/queues/default/pause'] input[name=reason]", "nightly deploy").await;
    browser.click("form[action='/queues/default/pause'] button").await;
    eventually(WAIT, "the page shows the queue paused", || async {
        let row = browser.text(default).await;
        row.contains("paused") && row.contains("nightly deploy") && row.contains("by console")
    })
    .await;
    eventually(WAIT, "the worker follows the pause", || async { worker.metric(PAUSED).await == Some(1.0) })
        .await;

    for _ in 0..3 {
        let triggered = api.on("trigger", "ops", "export").await;
        assert!(triggered.get("execution_id").is_some(), "{triggered}");
    }
    // Time passing is the point: nothing may start while the queue is paused.
    always(Duration::from_secs(1), "no run starts in the paused queue", || async {
        ran.load(Ordering::SeqCst) == 0
    })
    .await;
    // A run a worker's pull had asked for before the pause is held there, in flight, not started.
    let normal = format!("{default}[data-lane='normal']");
    eventually(WAIT, "the page shows the three runs waiting or held", || async {
        let count = |css: String| {
            let browser = &browser;
            async move { browser.text(&css).await.trim().parse::<u32>().unwrap_or(0) }
        };
        let shown =
            count(format!("{normal} td.waiting")).await + count(format!("{normal} td.in-flight")).await;
        if shown != 3 {
            page.refresh().await.expect("refresh the page");
        }
        shown == 3
    })
    .await;
    browser.screenshot(screenshots().as_ref(), "queues").await;

    browser.click("form[action='/queues/default/resume'] button").await;
    eventually(WAIT, "the resume releases the three runs", || async { ran.load(Ordering::SeqCst) == 3 })
        .await;
    let listed = api.queue("list", json!({})).await;
    assert_eq!(listed["queues"][0]["paused"], false, "{listed}");
    assert!(browser.text(default).await.contains("running"), "{}", browser.text(default).await);
    browser.close().await;
}
