//! Dependencies between tasks, end to end on a real nats-server with a real registry and
//! worker: a child runs once per parent outcome with its parents' results; `when: failed` runs
//! a clean-up only after a dead-lettered parent; `any` fires on the first parent; `within`
//! expires with its event; cycles, unknown parents and other namespaces are refused with every
//! problem named; deleting or pausing a parent says what it leaves waiting.

mod diamond;
mod held;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, DurationRound, Utc};
use jetsched_shared::wire::{EventKind, ParentRun, RunStatus, Trigger};
use jetsched_tests::fixtures::{events_about, noting, run_record, spec};
use jetsched_tests::{App, always, eventually};
use jetsched_worker::{Outcome, RunContext};
use serde_json::{Value, json};

use crate::cli::jetsched;
use crate::registry::{Served, served};
use crate::scheduler::{spawn_scheduler, tasks_loaded};
use crate::worker_support::{WAIT, config};

/// What the handlers saw of one run.
#[derive(Debug, Clone)]
pub(crate) struct SeenRun {
    pub(crate) task: String,
    pub(crate) execution_id: String,
    pub(crate) nominal_time: DateTime<Utc>,
    pub(crate) trigger: Trigger,
    pub(crate) parents: Vec<ParentRun>,
}

type Seen = Arc<Mutex<Vec<SeenRun>>>;

/// A worker whose handler `ok` succeeds returning `{"from": <task>, "n": <nominal ms>}`, and
/// whose handler `fail` fails for good; both note every run.
async fn worker(served: &Served) -> (App, Seen) {
    let note = |run: &RunContext| SeenRun {
        task: run.task_id.clone(),
        execution_id: run.execution_id.clone(),
        nominal_time: run.nominal_time,
        trigger: run.trigger,
        parents: run.parents.clone(),
    };
    let (ok, seen) = noting("ok", note, |run: RunContext| async move {
        Outcome::ok_with_result(&json!({"from": run.task_id, "n": run.nominal_time.timestamp_millis()}))
    });
    let failing = seen.clone();
    let handlers = ok.register("fail", move |run: RunContext| {
        failing.lock().expect("notes").push(note(&run));
        async { Outcome::permanent("broken on purpose") }
    });
    (App::worker(config(&served.server, "after-w"), handlers).await, seen)
}

fn runs_of(seen: &Seen, task: &str) -> Vec<SeenRun> {
    seen.lock().expect("notes").iter().filter(|run| run.task == task).cloned().collect()
}

fn child(id: &str, after: Value, handler: &str) -> Value {
    spec("dag", id).without("schedule").field("after", after).handler(handler).json()
}

fn parent(id: &str, handler: &str) -> Value {
    spec("dag", id).handler(handler).field("keep_result", true).fast_retry(1).json()
}

async fn trigger(served: &Served, id: &str) -> String {
    let reply = served.api.task("trigger", json!({"namespace": "dag", "id": id})).await;
    reply["execution_id"].as_str().unwrap_or_else(|| panic!("trigger {id}: {reply}")).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_runs_once_per_parent_run_with_the_parents_result() {
    let served = served(|_| {}).await;
    let (_worker, seen) = worker(&served).await;
    served.api.store(&parent("extract", "ok")).await;
    served.api.store(&child("load", json!({"tasks": ["extract"]}), "ok")).await;

    let first = trigger(&served, "extract").await;
    eventually(WAIT, "the child's run", || async { runs_of(&seen, "load").len() == 1 }).await;
    let parent_run = runs_of(&seen, "extract")[0].clone();
    let run = runs_of(&seen, "load")[0].clone();
    assert_eq!(run.trigger, Trigger::After);
    assert_eq!(run.nominal_time, parent_run.nominal_time, "the child runs for its parent's nominal time");
    assert_eq!(run.parents.len(), 1);
    let given = &run.parents[0];
    assert_eq!(
        (given.task.as_str(), given.execution_id.as_str(), given.status),
        ("dag/extract", first.as_str(), RunStatus::Succeeded)
    );
    let n = parent_run.nominal_time.timestamp_millis();
    assert_eq!(given.result, Some(json!({"from": "extract", "n": n})), "the parent's result is handed on");
    // The parent's result is kept with its record too.
    let record = run_record(&served.js, &Default::default(), &first).await.expect("the parent's record");
    assert_eq!(record.result, Some(json!({"from": "extract", "n": n})));

    // Each run of the parent starts the child once.
    trigger(&served, "extract").await;
    eventually(WAIT, "the second child run", || async { runs_of(&seen, "load").len() == 2 }).await;
    always(Duration::from_secs(2), "no third child run", || async { runs_of(&seen, "load").len() == 2 })
        .await;
    let ids: Vec<String> = runs_of(&seen, "load").iter().map(|r| r.execution_id.clone()).collect();
    assert_ne!(ids[0], ids[1]);

    // The graph shows both ends and the last run of each; the child's waits are dispatched.
    let graph = eventually(WAIT, "the child's last run succeeded", || async {
        let graph = served.api.on("graph", "dag", "load").await;
        (graph["last_run"]["status"] == "succeeded").then_some(graph)
    })
    .await;
    assert_eq!(graph["parents"][0]["task"], "dag/extract", "{graph}");
    assert_eq!(graph["parents"][0]["exists"], true, "{graph}");
    assert_eq!(graph["waits"].as_array().map(Vec::len), Some(2), "{graph}");
    assert!(graph["waits"].as_array().unwrap().iter().all(|w| w["state"] == "dispatched"), "{graph}");
    assert_eq!(graph["last_run"]["execution_id"], ids[1].as_str(), "the newest run: {graph}");
    let parent_graph = served.api.on("graph", "dag", "extract").await;
    assert_eq!(parent_graph["children"][0]["task"], "dag/load", "{parent_graph}");
    let url = served.server.url();
    let printed = jetsched(&url, &["graph", "dag/load"]).await;
    let text = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.status.success(), "{printed:?}");
    for expected in ["dag/load", "runs when dag/extract succeeded", "parent", "dag/extract", "dispatched"] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_runs_a_clean_up_only_after_a_dead_parent_and_any_fires_on_the_first() {
    let served = served(|_| {}).await;
    let (_worker, seen) = worker(&served).await;
    served.api.store(&parent("good", "ok")).await;
    served.api.store(&parent("bad", "fail")).await;
    served.api.store(&child("cleanup", json!({"tasks": ["good"], "when": "failed"}), "ok")).await;
    served.api.store(&child("cleanup-bad", json!({"tasks": ["bad"], "when": "failed"}), "ok")).await;
    served
        .api
        .store(&child("first", json!({"tasks": ["good", "bad"], "mode": "any", "when": "completed"}), "ok"))
        .await;

    trigger(&served, "good").await;
    eventually(WAIT, "the any child", || async { runs_of(&seen, "first").len() == 1 }).await;
    assert_eq!(runs_of(&seen, "first")[0].parents.len(), 1, "the first parent alone started it");
    always(Duration::from_secs(2), "no clean-up after a success", || async {
        runs_of(&seen, "cleanup").is_empty()
    })
    .await;

    let dead = trigger(&served, "bad").await;
    eventually(WAIT, "the clean-up of the dead run", || async { runs_of(&seen, "cleanup-bad").len() == 1 })
        .await;
    let run = runs_of(&seen, "cleanup-bad")[0].clone();
    assert_eq!(
        (run.parents[0].execution_id.as_str(), run.parents[0].status),
        (dead.as_str(), RunStatus::Dead)
    );
    assert!(runs_of(&seen, "cleanup").is_empty());
    // the dead run's own `any` child ran for its nominal time (a second nominal time)
    eventually(WAIT, "the any child of the dead run", || async { runs_of(&seen, "first").len() == 2 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_in_waits_for_every_parent_and_within_expires_with_its_event() {
    let served = served(|_| {}).await;
    let (_worker, seen) = worker(&served).await;
    for id in ["left", "right"] {
        served.api.store(&parent(id, "ok")).await;
    }
    served.api.store(&child("join", json!({"tasks": ["left", "right"], "within": "2s"}), "ok")).await;
    // Only one parent runs: the wait gives up after two seconds, told once.
    let lone = trigger(&served, "left").await;
    let nominal = eventually(WAIT, "the parent's run", || async {
        runs_of(&seen, "left").first().map(|run| run.nominal_time)
    })
    .await;
    let expired = eventually(WAIT, "after.expired", || async {
        let told =
            events_about(&served.js, EventKind::AfterExpired, "dag", "join", Duration::from_secs(2)).await;
        (!told.is_empty()).then_some(told)
    })
    .await;
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert_eq!(expired[0].nominal_time, Some(nominal));
    let reason = expired[0].reason.as_deref().unwrap_or_default();
    assert!(reason.contains("dag/right"), "the missing parent is named: {reason}");
    assert!(runs_of(&seen, "join").is_empty(), "no run after the wait gave up");
    let _ = lone;

    // `next` of a fan-in explains what it waits for: the rule, then each open wait.
    trigger(&served, "right").await;
    let next = eventually(WAIT, "a wait for left", || async {
        let next = served.api.on("next", "dag", "join").await;
        (next["waits_for"].as_array().map_or(0, Vec::len) == 2).then_some(next)
    })
    .await;
    assert_eq!(
        next["waits_for"][0],
        "runs when all of dag/left, dag/right succeeded for the same nominal time, waiting at most 2s after the first",
        "{next}"
    );
    assert!(next["waits_for"][1].as_str().unwrap().contains("waiting for dag/left"), "{next}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_unknown_parents_and_other_namespaces_are_refused_with_every_problem() {
    let served = served(|_| {}).await;
    served.api.store(&parent("a", "ok")).await;
    served.api.store(&child("b", json!({"tasks": ["a"]}), "ok")).await;
    served.api.store(&child("c", json!({"tasks": ["b"]}), "ok")).await;
    // a waiting for c closes a → c → b → a; ghost does not exist; other/x is another team's.
    let closing = spec("dag", "a")
        .without("schedule")
        .field("after", json!({"tasks": ["c", "ghost", "other/x"]}))
        .handler("ok")
        .json();
    let reply = served.api.put(&closing).await;
    let errors = reply["errors"].as_array().unwrap_or_else(|| panic!("refused with every problem: {reply}"));
    let text = serde_json::to_string(errors).unwrap();
    assert!(text.contains("dag/a → dag/c → dag/b → dag/a"), "the cycle's path: {text}");
    assert!(text.contains("no task dag/ghost"), "{text}");
    assert!(text.contains("other/x is in another namespace"), "{text}");
    assert_eq!(errors.len(), 3, "{text}");
    // nothing written: a keeps its schedule
    let stored = served.api.on("get", "dag", "a").await;
    assert!(stored["task"]["after"].is_null() && !stored["task"]["schedule"].is_null(), "{stored}");

    // Deleting and pausing a parent say what they leave waiting.
    let paused = served.api.task("pause", json!({"namespace": "dag", "id": "b"})).await;
    assert_eq!(paused["waiting_children"], json!(["dag/c"]), "{paused}");
    let deleted = served.api.on("delete", "dag", "a").await;
    assert_eq!(deleted["waiting_children"], json!(["dag/b"]), "{deleted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_with_after_is_read_and_refused_field_by_field() {
    let served = served(|_| {}).await;
    // A schedule and after together are a child whose fires wait for its parents: only the
    // unknown parent is refused.
    let both = spec("dag", "both").field("after", json!({"tasks": ["x"]})).json();
    let reply = served.api.put(&both).await;
    assert_eq!(reply["error"]["field"], "after.tasks[0]", "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap_or_default().contains("no task dag/x"), "{reply}");
    let bad = spec("dag", "bad")
        .without("schedule")
        .field("after", json!({"tasks": ["bad", "x", "x"], "when": "later", "within": "30d"}))
        .json();
    let reply = served.api.put(&bad).await;
    let fields: Vec<&str> =
        reply["errors"].as_array().unwrap().iter().filter_map(|e| e["field"].as_str()).collect();
    assert_eq!(fields, ["after.tasks[0]", "after.tasks[2]", "after.when", "after.within"], "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_backfill_starts_its_children_unless_it_asks_not_to() {
    let served = served(|_| {}).await;
    let (_worker, seen) = worker(&served).await;
    served.api.store(&parent("daily", "ok")).await;
    served.api.store(&child("report", json!({"tasks": ["daily"]}), "ok")).await;
    let url = served.server.url();
    let scheduler = spawn_scheduler(&url, "after-backfill", Duration::from_secs(2));
    tasks_loaded(&scheduler).await;
    let hour = |h: i64| {
        let top = Utc::now().duration_trunc(chrono::TimeDelta::hours(1)).unwrap();
        jetsched_shared::wire::format_time(top - chrono::TimeDelta::hours(h))
    };
    // Two hours backfilled without chaining (the CLI's --no-chain), two more chained.
    let unchained =
        jetsched(&url, &["backfill", "dag/daily", "--from", &hour(5), "--to", &hour(3), "--no-chain"]).await;
    assert!(unchained.status.success(), "{}", String::from_utf8_lossy(&unchained.stderr));
    eventually(WAIT, "the unchained backfill's runs", || async { runs_of(&seen, "daily").len() == 2 }).await;
    let chained = served
        .api
        .call(
            jetsched_shared::names::Names::default().backfill_api_subject("start"),
            json!({"namespace": "dag", "id": "daily", "from": hour(3), "to": hour(1)}),
        )
        .await;
    assert!(chained.get("error").is_none(), "{chained}");
    eventually(WAIT, "the chained backfill's children", || async { runs_of(&seen, "report").len() == 2 })
        .await;
    always(Duration::from_secs(2), "no child of the unchained runs", || async {
        runs_of(&seen, "report").len() == 2
    })
    .await;
    let mut nominal: Vec<String> = runs_of(&seen, "report")
        .iter()
        .map(|run| jetsched_shared::wire::format_time(run.nominal_time))
        .collect();
    nominal.sort();
    assert_eq!(nominal, [hour(3), hour(2)], "the children of the chained hours only");
}
