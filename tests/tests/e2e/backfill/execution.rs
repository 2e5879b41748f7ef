//! Backfills executed end to end: a registry, two scheduler processes, a worker whose handler
//! counts every run. A year of an hourly task in two zones (both DST changes of each) runs each
//! nominal time exactly once under the live fire's execution id, though the leader is killed
//! with SIGKILL mid-backfill; the same backfill again adds nothing; `--reprocess failed` reruns
//! exactly the failed times; `status`, `list` and `cancel` through the CLI; bad requests are
//! refused naming every problem.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jetsched_shared::backfill::{self, nominal_times};
use jetsched_shared::names::Names;
use jetsched_shared::schedule::{CronSchedule, Schedule};
use jetsched_shared::wire::{LeaderRecord, Trigger};
use jetsched_tests::{App, eventually, spec};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::{Value, json};

use crate::cli::{jetsched, json_out};
use crate::registry::{Served, served};
use crate::scheduler::{spawn_scheduler, tasks_loaded};

const FROM: &str = "2025-01-01T00:00:00Z";
const TO: &str = "2026-01-01T00:00:00Z";
const NS: &str = "history";
const FINISH: Duration = Duration::from_secs(240);

/// The runs of one nominal time: (execution id, trigger) each.
type Runs = Vec<(String, Trigger)>;

/// Every run the handler saw, by task and nominal time (ms).
#[derive(Clone, Default)]
struct Ran(Arc<Mutex<BTreeMap<(String, i64), Runs>>>);

impl Ran {
    fn of(&self, task: &str) -> BTreeMap<i64, Runs> {
        let ran = self.0.lock().unwrap();
        ran.iter().filter(|((t, _), _)| t == task).map(|((_, ms), runs)| (*ms, runs.clone())).collect()
    }
}

/// The handler `count`: records the run; the first run of a time at 03:00 UTC on the 15th
/// fails for good (the task allows one attempt), a rerun of it succeeds.
fn handlers(ran: Ran) -> Handlers {
    Handlers::new().register("count", move |run: RunContext| {
        let ran = ran.clone();
        async move {
            let key = (run.task_id.clone(), run.nominal_time.timestamp_millis());
            let first = {
                let mut ran = ran.0.lock().unwrap();
                let runs = ran.entry(key).or_default();
                runs.push((run.execution_id.clone(), run.trigger));
                runs.len() == 1
            };
            if first && failing(run.nominal_time) {
                Outcome::permanent("the 15th at 03:00 fails once")
            } else {
                Outcome::ok()
            }
        }
    })
}

fn failing(at: DateTime<Utc>) -> bool {
    use chrono::{Datelike, Timelike};
    at.day() == 15 && at.hour() == 3
}

fn instant(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).unwrap().to_utc()
}

fn hourly(zone: &str) -> Schedule {
    Schedule::Cron(Box::new(CronSchedule::parse("0 0 * * * *", zone).unwrap()))
}

async fn start(url: &str, task: &str, extra: &[&str]) -> Value {
    let mut args = vec!["--json", "backfill", task, "--from", FROM, "--to", TO];
    args.extend_from_slice(extra);
    json_out(&jetsched(url, &args).await)
}

async fn status(url: &str, id: &str) -> Value {
    json_out(&jetsched(url, &["--json", "backfill", "status", id]).await)
}

async fn finished(url: &str, id: &str) -> Value {
    eventually(FINISH, &format!("backfill {id} finished"), || async {
        let status = status(url, id).await;
        (status["state"] == "finished").then_some(status)
    })
    .await
}

async fn leader(js: &async_nats::jetstream::Context) -> Option<String> {
    let names = Names::default();
    let bucket = js.get_key_value(names.leader_bucket()).await.ok()?;
    let value = bucket.get(names.leader_key()).await.ok()??;
    serde_json::from_slice::<LeaderRecord>(&value).ok().map(|record| record.instance)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_year_of_hourly_times_runs_once_each_across_dst_and_a_killed_leader() {
    let Served { server, registry: _registry, js, api, .. } = served(|_| {}).await;
    let url = server.url();
    let ran = Ran::default();
    let mut config = jetsched_worker::Config::for_tests(&url, "bf-worker");
    config.concurrency = 64;
    let _worker = App::worker(config, handlers(ran.clone())).await;
    let zones = [("berlin", "Europe/Berlin"), ("new-york", "America/New_York")];
    for (id, zone) in zones {
        api.store(&spec(NS, id).cron_in("0 0 * * * *", zone).handler("count").fast_retry(1).json()).await;
    }
    let lease = Duration::from_secs(2);
    let mut schedulers = vec![spawn_scheduler(&url, "bf-a", lease), spawn_scheduler(&url, "bf-b", lease)];
    for scheduler in &schedulers {
        tasks_loaded(scheduler).await;
    }

    let mut ids = Vec::new();
    for (id, _) in zones {
        let started = start(&url, &format!("{NS}/{id}"), &["--max-active", "400"]).await;
        assert_eq!((&started["state"], &started["total"]), (&json!("running"), &json!(8759)), "{started}");
        ids.push(started["id"].as_str().unwrap().to_string());
    }
    // Mid-backfill, the leader dies without a word.
    eventually(FINISH, "a third of the first backfill dispatched", || async {
        status(&url, &ids[0]).await["dispatched"].as_u64().is_some_and(|n| n > 3000)
    })
    .await;
    let victim = leader(&js).await.expect("a leader");
    let index = if victim == "bf-a" { 0 } else { 1 };
    schedulers[index].kill9();

    let (from, to) = (instant(FROM), instant(TO));
    for ((task, zone), id) in zones.iter().zip(&ids) {
        let done = finished(&url, id).await;
        let expected = nominal_times(&hourly(zone), from, to, false).unwrap();
        assert_eq!(expected.len(), 8759, "{zone}: every wall hour of 2025 once (the fold repeats one)");
        assert_eq!(
            (&done["dispatched"], &done["skipped"], &done["rerun"]),
            (&json!(8759), &json!(0), &json!(0)),
            "{zone}: every time counted once, as dispatched: {done}"
        );
        // Each nominal time ran once, under the live fire's execution id; no other time ran.
        let runs = eventually(FINISH, &format!("{task}: every run ended"), || async {
            let runs = ran.of(task);
            let in_range: BTreeMap<_, _> = runs
                .into_iter()
                .filter(|(ms, _)| *ms >= from.timestamp_millis() && *ms < to.timestamp_millis())
                .collect();
            (in_range.len() >= expected.len()).then_some(in_range)
        })
        .await;
        let times: Vec<i64> = expected.iter().map(|t| t.at.timestamp_millis()).collect();
        assert!(runs.keys().copied().eq(times.iter().copied()), "{zone}: exactly the nominal times ran");
        for (ms, runs) in &runs {
            let live = backfill::ids(NS, task, *ms, None).1;
            assert_eq!(
                runs,
                &vec![(live, Trigger::Backfill)],
                "{zone}: {ms} ran once as the live fire's run"
            );
        }
    }
    let killed = schedulers[index].output();
    assert!(!killed.is_empty());

    // The same backfill again: every time has a run, nothing is dispatched.
    let berlin_runs = ran.of("berlin");
    let again = start(&url, &format!("{NS}/berlin"), &["--max-active", "400"]).await;
    let again = finished(&url, again["id"].as_str().unwrap()).await;
    assert_eq!(
        (&again["dispatched"], &again["skipped"], &again["rerun"]),
        (&json!(0), &json!(8759), &json!(0))
    );

    // `--reprocess failed`: exactly the times whose run failed run again, under rerun ids.
    let failed: Vec<i64> = berlin_runs
        .keys()
        .copied()
        .filter(|ms| failing(DateTime::from_timestamp_millis(*ms).unwrap()))
        .collect();
    assert_eq!(failed.len(), 12, "the 15th at 03:00 UTC of each month");
    let rerun = start(&url, &format!("{NS}/berlin"), &["--reprocess", "failed", "--max-active", "400"]).await;
    let rerun_id = rerun["id"].as_str().unwrap().to_string();
    let rerun = finished(&url, &rerun_id).await;
    assert_eq!(
        (&rerun["dispatched"], &rerun["skipped"], &rerun["rerun"]),
        (&json!(0), &json!(8747), &json!(12))
    );
    let after = eventually(FINISH, "the reruns ran", || async {
        let after = ran.of("berlin");
        (failed.iter().all(|ms| after[ms].len() == 2)).then_some(after)
    })
    .await;
    for (ms, runs) in &after {
        if *ms < from.timestamp_millis() || *ms >= to.timestamp_millis() {
            continue;
        }
        let expected = if failed.contains(ms) { 2 } else { 1 };
        assert_eq!(runs.len(), expected, "{ms}: {runs:?}");
        if expected == 2 {
            let (_, rerun_execution) = backfill::ids(NS, "berlin", *ms, Some(&rerun_id));
            assert_eq!(runs[1].0, rerun_execution, "a rerun's own execution id");
        }
    }
    let listed = json_out(&jetsched(&url, &["--json", "backfill", "list", "history/berlin"]).await);
    assert_eq!(listed["backfills"].as_array().map(Vec::len), Some(3), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_and_cancel_through_the_cli_and_bad_requests_name_every_problem() {
    let Served { server, registry: _registry, api, .. } = served(|_| {}).await;
    let url = server.url();
    // A slow handler, one run in flight at a time: the backfill is still running when cancelled.
    let handlers = Handlers::new().register("slow", |_run: RunContext| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        Outcome::ok()
    });
    let _worker = App::worker(jetsched_worker::Config::for_tests(&url, "bf-cancel-worker"), handlers).await;
    api.store(&spec(NS, "slow").every("1h").handler("slow").json()).await;
    let scheduler = spawn_scheduler(&url, "bf-cancel", Duration::from_secs(2));
    tasks_loaded(&scheduler).await;

    let started =
        jetsched(&url, &["backfill", "history/slow", "--from", FROM, "--to", TO, "--max-active", "1"]).await;
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let id = String::from_utf8_lossy(&started.stdout).trim().to_string();
    assert!(id.starts_with("history.slow."), "prints its id: {id}");
    eventually(FINISH, "a few times dispatched", || async {
        status(&url, &id).await["dispatched"].as_u64().is_some_and(|n| n >= 3)
    })
    .await;
    let human = jetsched(&url, &["backfill", "status", &id]).await;
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("running") && text.contains("cursor"), "{text}");

    let cancelled = json_out(&jetsched(&url, &["--json", "backfill", "cancel", &id]).await);
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    // The batch under way finishes; no further one starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = status(&url, &id).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = status(&url, &id).await;
    assert_eq!(settled["dispatched"], later["dispatched"], "nothing dispatched after the cancel");
    assert!(later["dispatched"].as_u64().unwrap() < 8760, "cancelled before the end");
    let again = jetsched(&url, &["backfill", "cancel", &id]).await;
    assert_eq!(again.status.code(), Some(1), "an ended backfill is not cancelled twice");

    // Every problem at once: an unknown task, a reversed range, max-active out of range.
    let refused =
        jetsched(&url, &["backfill", "history/nope", "--from", TO, "--to", FROM, "--max-active", "1001"])
            .await;
    assert_eq!(refused.status.code(), Some(1));
    let errors = String::from_utf8_lossy(&refused.stderr);
    for field in ["task", "to", "max_active"] {
        assert!(errors.contains(field), "names {field}: {errors}");
    }
    let future =
        jetsched(&url, &["backfill", "history/slow", "--from", FROM, "--to", "2999-01-01T00:00:00Z"]).await;
    assert_eq!(future.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&future.stderr).contains("future"));
    let unknown = jetsched(&url, &["backfill", "status", "history.slow.nope"]).await;
    assert_eq!(unknown.status.code(), Some(1));
}
