//! A paused task's scheduled runs do not run: runs held by its open breaker (`on_open: delay`)
//! and runs waiting in the queue when the task is paused end `skipped` with reason `paused`
//! (record and `run.skipped` event) without calling the downstream, while a manual trigger made
//! while paused runs; once resumed, the task's scheduled runs run again.

use std::time::Duration;

use chrono::Utc;
use futures::TryStreamExt;
use jetsched_shared::names::{Names, breaker_reason};
use jetsched_shared::wire::{EventKind, RunStatus};
use jetsched_tests::eventually;
use jetsched_tests::fixtures::{dispatch, events_about, open_breaker, spec, wait_run_status};
use serde_json::json;

use crate::breakers::Downstream;
use crate::registry::{Served, served};
use crate::worker_support::{WAIT, wait_for_workers, worker_process};

/// Runs of the dispatch stream an open breaker holds now (every task's).
async fn held(js: &async_nats::jetstream::Context) -> usize {
    let names = Names::default();
    let Ok(stream) = js.get_stream(names.dispatch_stream()).await else { return 0 };
    let Ok(subjects) = stream.info_with_subjects(names.delayed_wildcard()).await else { return 0 };
    let listed: Vec<(String, usize)> = subjects.try_collect().await.unwrap_or_default();
    listed.iter().map(|(_, count)| count).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tasks_queued_and_held_runs_are_skipped_and_a_manual_trigger_runs() {
    let Served { server, registry: _registry, client, api, js } = served(|_| {}).await;
    let names = Names::default();
    let downstream = Downstream::failing().await;
    downstream.recover();
    let task = spec("pz", "report")
        .executor(json!({"kind": "http", "method": "POST", "url": downstream.url()}))
        .field("breaker", json!({"open_for": "1s", "on_open": "delay"}));
    api.store(&task.json()).await;
    let spec = task.task();

    // The task's breaker is open for 12 s, as a worker writes it (before the worker starts, so
    // the worker loads it): long enough to pause the task on a loaded machine.
    open_breaker(&js, "task.pz.report", Duration::from_secs(12)).await;

    // Two scheduled runs held by the open breaker, then the worker goes away.
    let flags = ["--http-allow", "*=127.0.0.0/8"];
    let mut first = worker_process(&server, "pz-w1", &flags);
    wait_for_workers(&client, 1).await;
    let base = Utc::now().timestamp_millis();
    let held_runs = [dispatch(&js, &names, &spec, base).await, dispatch(&js, &names, &spec, base + 1).await];
    eventually(WAIT, "both runs held by the breaker", || async { (held(&js).await == 2).then_some(()) })
        .await;
    first.sigterm();
    first.wait_exit(WAIT).await.expect("the first worker stops");

    // One more scheduled run waits in the queue; the task is paused; a person triggers a run.
    let queued = dispatch(&js, &names, &spec, base + 2).await;
    let paused = api.task("pause", json!({"namespace": "pz", "id": "report", "reason": "maintenance"})).await;
    assert_eq!(paused["task"]["paused"], json!(true), "{paused}");
    let triggered = api.on("trigger", "pz", "report").await;
    let manual = triggered["execution_id"].as_str().unwrap_or_else(|| panic!("{triggered}")).to_string();

    let _second = worker_process(&server, "pz-w2", &flags);
    for execution in held_runs.iter().chain([&queued]) {
        let record = wait_run_status(&js, &names, execution, RunStatus::Skipped, WAIT).await;
        assert_eq!(record.reason.as_deref(), Some(breaker_reason::PAUSED), "{record:?}");
        assert!(record.attempts.is_empty(), "never executed: {record:?}");
    }
    // The manual run waits for the breaker like any run, then runs (the probe that closes it).
    wait_run_status(&js, &names, &manual, RunStatus::Succeeded, WAIT).await;
    let skipped = eventually(WAIT, "three run.skipped events", || async {
        let found = events_about(&js, EventKind::RunSkipped, "pz", "report", WAIT).await;
        (found.len() >= 3).then_some(found)
    })
    .await;
    let mut told: Vec<&str> = skipped.iter().filter_map(|e| e.execution_id.as_deref()).collect();
    told.sort_unstable();
    let mut expected: Vec<&str> = held_runs.iter().chain([&queued]).map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(told, expected, "{skipped:?}");
    assert!(skipped.iter().all(|e| e.reason.as_deref() == Some(breaker_reason::PAUSED)), "{skipped:?}");
    let called: Vec<String> = downstream.hits().into_iter().map(|hit| hit.execution).collect();
    assert_eq!(called, std::slice::from_ref(&manual), "only the manual run reached the downstream");

    // Resumed, the task's scheduled runs run again.
    api.on("resume", "pz", "report").await;
    eventually(WAIT, "the worker sees the task resumed", || async {
        let run = dispatch(&js, &names, &spec, Utc::now().timestamp_millis()).await;
        let record = eventually(Duration::from_secs(5), "the run ends", || async {
            let record = jetsched_tests::fixtures::run_record(&js, &names, &run).await?;
            record.status.is_final().then_some(record)
        })
        .await;
        (record.status == RunStatus::Succeeded).then_some(())
    })
    .await;
    assert_eq!(downstream.hits().len(), 2, "the resumed task's run reached the downstream");
}
