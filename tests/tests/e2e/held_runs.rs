//! Held runs are visible: runs an open breaker delays (`on_open: delay`) have a record `held`
//! with `release_at` (not `dispatched` with no attempt) and a `run.held` event; the dispatch
//! stream counts them per task and per queue, the console's overview and task page show the
//! counts, and `jetsched runs` shows each held run with its release time; once released they
//! run and the counts go back to 0.

use std::time::Duration;

use chrono::Utc;
use futures::TryStreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{EventKind, RunStatus};
use jetsched_tests::fixtures::{dispatch, events_about, open_breaker, spec, wait_run_status};
use jetsched_tests::{App, eventually};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use crate::cli::jetsched;
use crate::console::browser::http_request;
use crate::registry::{Served, served};
use crate::worker_support::{WAIT, config};

/// Runs of `namespace/id` held in the dispatch stream now, counted with the task's filter.
async fn held_of(js: &async_nats::jetstream::Context, namespace: &str, id: &str) -> usize {
    let names = Names::default();
    let Ok(stream) = js.get_stream(names.dispatch_stream()).await else { return 0 };
    let filter = names.delayed_task_filter(namespace, id);
    let Ok(subjects) = stream.info_with_subjects(filter).await else { return 0 };
    let listed: Vec<(String, usize)> = subjects.try_collect().await.unwrap_or_default();
    listed.iter().map(|(_, count)| count).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_runs_carry_their_release_time_in_records_events_counts_the_cli_and_the_console() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let task =
        spec("hd", "report").handler("ok").field("breaker", json!({"open_for": "1s", "on_open": "delay"}));
    api.store(&task.json()).await;
    let spec = task.task();
    // The task's breaker is open for 10 s, as a worker writes it (before the worker starts, so
    // the worker loads it): long enough for the checks below on a loaded machine.
    open_breaker(&js, "task.hd.report", Duration::from_secs(10)).await;
    let handlers = Handlers::new().register("ok", |_run: RunContext| async { Outcome::ok() });
    let _worker = App::worker(config(&server, "hd-w"), handlers).await;
    let (_console, addr) = crate::console::console(&server, None, false).await;

    let base = Utc::now().timestamp_millis();
    let runs = [dispatch(&js, &names, &spec, base).await, dispatch(&js, &names, &spec, base + 1).await];
    for execution in &runs {
        let record = wait_run_status(&js, &names, execution, RunStatus::Held, WAIT).await;
        let until = record.release_at.unwrap_or_else(|| panic!("no release_at: {record:?}"));
        assert!(until > Utc::now() - chrono::Duration::seconds(1), "{record:?}");
        assert!(record.attempts.is_empty(), "{record:?}");
    }
    let told = eventually(WAIT, "two run.held events", || async {
        let found = events_about(&js, EventKind::RunHeld, "hd", "report", WAIT).await;
        (found.len() >= 2).then_some(found)
    })
    .await;
    assert!(told.iter().all(|e| e.release_at.is_some()), "{told:?}");
    assert_eq!(held_of(&js, "hd", "report").await, 2);

    let overview = http_request(addr, "GET", "/", &[], "").await;
    assert!(overview.body.contains(r#"<td class="held">2</td>"#), "{}", overview.body);
    let page = http_request(addr, "GET", "/tasks/hd/report", &[], "").await;
    assert!(page.body.contains(r#"<span id="task-held">2</span>"#), "{}", page.body);
    let listed = jetsched(&server.url(), &["runs", "hd/report"]).await;
    let text = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(text.matches("held until").count(), 2, "{text}");

    // Released, both run once; nothing is held any more.
    for execution in &runs {
        wait_run_status(&js, &names, execution, RunStatus::Succeeded, WAIT).await;
    }
    assert_eq!(held_of(&js, "hd", "report").await, 0);
    let overview = http_request(addr, "GET", "/", &[], "").await;
    assert!(overview.body.contains(r#"<td class="held">0</td>"#), "{}", overview.body);
}
