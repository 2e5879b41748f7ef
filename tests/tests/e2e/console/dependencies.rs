//! A task's dependencies on its console page, in a real browser against a real registry,
//! scheduler and worker (the parents' runs of one nominal time come from backfills): a fan-in
//! child shows its rule, its parents with their last runs, the wait of the
//! nominal time one parent ran for (which parent is missing, until when), and after the other
//! parent's run the wait dispatched with a link to the child's run; a parent's page shows the
//! child.

use fantoccini::Locator;
use jetsched_tests::{Api, App, NatsServer, eventually, spec};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use super::browser::Browser;
use super::{WAIT, console, screenshots};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_a_tasks_parents_children_last_runs_and_waits() {
    let server = NatsServer::start().await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let _scheduler = App::scheduler(jetsched_scheduler::Config::for_tests(&server.url())).await;
    let handlers = Handlers::new().register("ok", |run: RunContext| async move {
        Outcome::ok_with_result(&json!({"rows": run.nominal_time.timestamp_millis() % 1000}))
    });
    let _worker = App::worker(jetsched_worker::Config::for_tests(&server.url(), "w-graph"), handlers).await;
    let api = Api::new(&server.client().await);
    eventually(WAIT, "the registry is ready", || registry.ready()).await;
    for id in ["extract", "audit"] {
        api.store(&spec("etl", id).cron("0 0 0 1 1 *").handler("ok").field("keep_result", true).json()).await;
    }
    let child = spec("etl", "load")
        .without("schedule")
        .field("after", json!({"tasks": ["extract", "audit"], "within": "1h"}))
        .handler("ok");
    api.store(&child.json()).await;
    let (_console, addr) = console(&server, None, true).await;

    // One parent's run of a nominal time (a backfill of its one fire of 2026): the child's wait
    // names the other parent as missing.
    let backfill = |id: &str| {
        let request = json!({"namespace": "etl", "id": id, "from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:01Z"});
        let api = &api;
        async move { api.call(api.names().backfill_api_namespaced("start", "etl"), request).await }
    };
    let extract = backfill("extract").await;
    assert!(extract.get("error").is_none(), "{extract}");
    let browser = Browser::start().await;
    let page = format!("http://{addr}/tasks/etl/load");
    browser.client.goto(&page).await.unwrap();
    browser
        .refresh_until(WAIT, "the child's wait", "#dependency-waits tbody tr", |row| row.contains("waiting"))
        .await;
    let rule = browser.text("#dependency-rule").await;
    assert_eq!(
        rule,
        "runs when all of etl/extract, etl/audit succeeded for the same nominal time, waiting at most 1h after the first"
    );
    let parents = browser.text("#dag-parents").await;
    // Backfilled runs are not a task's last fire: the parents show none yet.
    assert!(parents.contains("etl/extract") && parents.contains("etl/audit"), "{parents}");
    let wait = browser.text("#dependency-waits tbody tr").await;
    assert!(
        wait.contains("etl/extract succeeded") && wait.contains("etl/audit"),
        "the missing parent: {wait}"
    );
    browser.screenshot(screenshots().as_ref(), "dependencies").await;

    // The other parent's run of that time: the wait is dispatched, linking the child's run.
    let audit = backfill("audit").await;
    assert!(audit.get("error").is_none(), "{audit}");
    browser
        .refresh_until(WAIT, "the wait dispatched", "#dependency-waits tbody tr", |row| {
            row.contains("dispatched")
        })
        .await;
    let anchor =
        browser.client.find(Locator::Css("#dependency-waits tbody tr a")).await.expect("the run's link");
    let link = anchor.attr("href").await.expect("its href").unwrap_or_default();
    assert!(link.starts_with("/runs/"), "{link}");
    browser.client.goto(&format!("http://{addr}{link}")).await.unwrap();
    browser.refresh_until(WAIT, "the child's run page", "main", |text| text.contains("etl/load")).await;

    browser.client.goto(&format!("http://{addr}/tasks/etl/extract")).await.unwrap();
    let children = browser.text("#dag-children").await;
    assert!(children.contains("etl/load"), "{children}");
    assert_eq!(browser.text("#dag-parents").await, "No parent");
    browser.close().await;
}
