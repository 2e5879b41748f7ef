//! A child with a schedule of its own: it fires on its schedule, and each fire runs only once
//! its parents' runs of the same nominal time meet its rule. An hourly-style parent (every
//! second) and a child every three seconds: the child runs on its own times only, once each,
//! after its parent's run of that time, as the fire it is (its ids, trigger `schedule`). With
//! the parent paused, the child's fires wait, give up after `within` with `after.expired`, and
//! are told skipped; none runs.

use std::time::Duration;

use jetsched_shared::wire::{EventKind, RunStatus, Trigger, scheduled_execution_id};
use jetsched_tests::fixtures::{events_about, spec};
use jetsched_tests::{always, eventually};
use serde_json::json;

use super::{parent, runs_of, worker};
use crate::registry::served;
use crate::scheduler::{spawn_scheduler, tasks_loaded};
use crate::worker_support::WAIT;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_with_a_schedule_runs_on_its_own_times_once_its_parents_runs_allow_it() {
    let served = served(|_| {}).await;
    let (_worker, seen) = worker(&served).await;
    let mut parent = parent("source", "ok");
    parent["schedule"] = json!({"cron": "* * * * * *"});
    served.api.store(&parent).await;
    let child = spec("dag", "report")
        .field("schedule", json!({"cron": "*/3 * * * * *"}))
        .field("after", json!({"tasks": ["source"], "within": "2s"}))
        .handler("ok")
        .json();
    served.api.store(&child).await;
    let next = served.api.on("next", "dag", "report").await;
    let rule = next["waits_for"][0].as_str().unwrap_or_default();
    assert!(rule.starts_with("fires on its schedule, then runs when dag/source succeeded"), "{next}");

    let scheduler = spawn_scheduler(&served.server.url(), "after-held", Duration::from_secs(2));
    tasks_loaded(&scheduler).await;
    eventually(WAIT, "three runs of the child", || async { runs_of(&seen, "report").len() >= 3 }).await;

    let parents = runs_of(&seen, "source");
    let children = runs_of(&seen, "report");
    let mut nominal: Vec<i64> = children.iter().map(|run| run.nominal_time.timestamp_millis()).collect();
    nominal.sort();
    nominal.dedup();
    assert_eq!(nominal.len(), children.len(), "one run per nominal time: {children:?}");
    for run in &children {
        let ms = run.nominal_time.timestamp_millis();
        assert_eq!(ms % 3000, 0, "on the child's own times only: {run:?}");
        assert_eq!(run.trigger, Trigger::Schedule, "{run:?}");
        assert_eq!(run.execution_id, scheduled_execution_id("dag", "report", ms), "the fire's own id");
        let parent_run = parents
            .iter()
            .find(|p| p.nominal_time == run.nominal_time)
            .unwrap_or_else(|| panic!("the parent's run of {ms}: {parents:?}"));
        assert_eq!(run.parents.len(), 1, "{run:?}");
        assert_eq!(run.parents[0].execution_id, parent_run.execution_id);
        assert_eq!(run.parents[0].status, RunStatus::Succeeded);
        assert_eq!(run.parents[0].result, Some(json!({"from": "source", "n": ms})), "the parent's result");
    }

    // The parent paused: the child's fires wait for it, give up, and are told skipped.
    let paused = served.api.task("pause", json!({"namespace": "dag", "id": "source"})).await;
    assert_eq!(paused["waiting_children"], json!(["dag/report"]), "{paused}");
    let ran = runs_of(&seen, "report").len();
    let expired = eventually(WAIT, "after.expired of a held fire", || async {
        let told =
            events_about(&served.js, EventKind::AfterExpired, "dag", "report", Duration::from_secs(1)).await;
        (!told.is_empty()).then_some(told)
    })
    .await;
    let reason = expired[0].reason.as_deref().unwrap_or_default();
    assert!(reason.contains("dag/source"), "the missing parent is named: {reason}");
    let expired_id = expired[0].execution_id.clone();
    let skipped = eventually(WAIT, "fire.skipped of the held fire", || async {
        let told =
            events_about(&served.js, EventKind::FireSkipped, "dag", "report", Duration::from_secs(1)).await;
        let skipped: Vec<_> = told.into_iter().filter(|event| event.execution_id == expired_id).collect();
        (!skipped.is_empty()).then_some(skipped)
    })
    .await;
    assert_eq!(skipped.len(), 1, "told once: {skipped:?}");
    // At most the fire in flight when the parent was paused still ran.
    always(Duration::from_secs(3), "no run while the parent is paused", || async {
        runs_of(&seen, "report").len() <= ran + 1
    })
    .await;
    drop(scheduler);
}
