//! What operators see is what happened: `jetsched events --task` shows that task's last events
//! (not the stream's last ones, filtered), `jetsched status` fails while nothing can fire, and
//! a console started before the registry waits for it, saying so, instead of exiting, and a
//! run's page reloads itself until the run has finished.

use std::time::Duration;

use jetsched_scheduler::Config as SchedulerConfig;
use jetsched_shared::names::Names;
use jetsched_tests::{App, NatsServer, eventually, init_test_logging};
use serde_json::{Value, json};

use crate::cli::jetsched;
use crate::console::browser::http_request;
use crate::registry::{Served, config, served};

#[tokio::test]
async fn events_of_a_task_are_its_last_ones_whatever_else_happened_in_between() {
    init_test_logging();
    let Served { server, registry: _registry, .. } = served(|_| {}).await;
    let url = server.url();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("specs.json");

    // Twelve updates of each of two tasks, interleaved: a, b, a, b, ...
    for round in 0..12 {
        let specs: Vec<Value> = ["a", "b"]
            .iter()
            .map(|id| {
                json!({"id": id, "namespace": "ops", "schedule": {"every": "1h"},
                       "executor": {"kind": "nats", "subject": "jobs.x"}, "labels": {"round": round.to_string()}})
            })
            .collect();
        std::fs::write(&file, Value::from(specs).to_string()).expect("write specs");
        let applied = jetsched(&url, &["apply", "-f", file.to_str().expect("path")]).await;
        assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
    }
    let client = async_nats::connect(&url).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let names = Names::default();
    eventually(Duration::from_secs(10), "24 task events stored", || async {
        let mut stream = js.get_stream(names.events_stream()).await.ok()?;
        (stream.info().await.ok()?.state.messages >= 24).then_some(())
    })
    .await;

    let out = jetsched(&url, &["events", "--task", "ops/a", "--last", "10", "--json"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert_eq!(events.len(), 10, "ten events of ops/a:\n{text}");
    assert!(events.iter().all(|e| e["task_id"] == "a"), "{text}");
}

#[tokio::test]
async fn status_fails_while_no_scheduler_holds_the_lease() {
    init_test_logging();
    let Served { server, registry: _registry, .. } = served(|_| {}).await;
    let url = server.url();

    let out = jetsched(&url, &["status"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no scheduler holds the lease"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("NONE"), "the report is printed too");

    let _scheduler = App::scheduler(SchedulerConfig::for_tests(&url)).await;
    eventually(Duration::from_secs(20), "status succeeds once a leader holds the lease", || async {
        jetsched(&url, &["status"]).await.status.success().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_console_started_before_the_registry_waits_for_it() {
    init_test_logging();
    let server = NatsServer::start().await;
    let url = server.url();
    let mut console = tokio::spawn(jetsched_console::build(jetsched_console::Config::for_tests(&url)));
    // No registry yet: for two seconds (the time is the point) the console keeps waiting for
    // the topology rather than failing.
    let early = tokio::time::timeout(Duration::from_secs(2), &mut console).await;
    assert!(early.is_err(), "the console finished (gave up) before the registry started");

    let _registry = App::registry(config(&url, 1)).await;
    let console = tokio::time::timeout(Duration::from_secs(30), console)
        .await
        .expect("the console starts once the registry created the topology")
        .expect("console task")
        .expect("the console builds");
    let pages = console.http_addr();
    let app = App::spawn("console", console.admin_addr(), |shutdown| console.run(shutdown));
    eventually(Duration::from_secs(10), "the console is ready", || app.ready()).await;

    // "Trigger now" lands on the page of a run that no worker has taken yet: the page says so
    // and reloads itself until the run has finished, rather than saying it does not exist.
    let page = http_request(pages, "GET", "/runs/ops.a.1733300000000", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(r#"http-equiv="refresh""#), "{}", page.body);
    assert!(page.body.contains("No record or event of this run yet"), "{}", page.body);
}
