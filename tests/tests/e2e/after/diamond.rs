//! A diamond of hourly tasks (a → b, a → c, b + c → d) over 24 simulated hours (a backfill of
//! `a`), every service a real process: a worker, a registry and the leader scheduler killed
//! with SIGKILL at random points and the server restarted once. Every hour `d` runs exactly
//! once, after both `b` and `c`, with both results; nothing doubled, nothing lost.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use chrono::{DurationRound, TimeDelta, Utc};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{HDR_EXECUTION_ID, HDR_NOMINAL_TIME, HDR_PARENTS, HDR_STATUS, ParentRun};
use jetsched_tests::fixtures::spec;
use jetsched_tests::{Api, ChildProcess, NatsServer, always, eventually};
use rand::Rng;
use serde_json::{Value, json};

/// One request a downstream answered.
#[derive(Debug, Clone)]
struct Request {
    task: String,
    execution_id: String,
    nominal: String,
    parents: Vec<ParentRun>,
    received: Instant,
    answered: Instant,
}

/// Answers every `dag.<task>` request `ok` after a short while, with `{"task", "nominal"}`
/// as the run's result, and records each request.
async fn downstream(client: &async_nats::Client) -> (Arc<Mutex<Vec<Request>>>, tokio::task::JoinHandle<()>) {
    let mut sub = client.subscribe("dag.>").await.expect("subscribe");
    client.flush().await.expect("flush");
    let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
    let (log, client) = (seen.clone(), client.clone());
    let task = tokio::spawn(async move {
        while let Some(message) = sub.next().await {
            let (log, client) = (log.clone(), client.clone());
            tokio::spawn(async move {
                let received = Instant::now();
                let header = |name: &str| {
                    message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(name))
                        .map(|v| v.to_string())
                        .unwrap_or_default()
                };
                let task = message.subject.trim_start_matches("dag.").to_string();
                let nominal = header(HDR_NOMINAL_TIME);
                let parents: Vec<ParentRun> = serde_json::from_str(&header(HDR_PARENTS)).unwrap_or_default();
                let execution_id = header(HDR_EXECUTION_ID);
                let pause = Duration::from_millis(rand::rng().random_range(20..120));
                tokio::time::sleep(pause).await;
                let Some(reply) = message.reply else { return };
                let mut headers = HeaderMap::new();
                headers.insert(HDR_STATUS, "ok");
                let body = json!({"task": task, "nominal": nominal}).to_string();
                if client.publish_with_headers(reply, headers, body.into()).await.is_ok() {
                    let answered = Instant::now();
                    log.lock().expect("log").push(Request {
                        task,
                        execution_id,
                        nominal,
                        parents,
                        received,
                        answered,
                    });
                }
            });
        }
    });
    (seen, task)
}

fn service(url: &str, binary: &str, instance: &str) -> ChildProcess {
    let mut command = ChildProcess::command(binary);
    command.env("NATS_URL", url).env("RUST_LOG", "info").args([
        "--instance-id",
        instance,
        "--admin-addr",
        "127.0.0.1:0",
        "--lease",
        "2s",
    ]);
    if binary == "jetsched-worker" {
        command.args(["--ack-wait", "2s", "--pull-expires", "500ms"]);
    }
    ChildProcess::spawn_command(instance, command)
}

fn requests(seen: &Arc<Mutex<Vec<Request>>>) -> Vec<Request> {
    seen.lock().expect("log").clone()
}

/// Distinct (task, nominal time) → execution ids answered.
fn executions(seen: &[Request]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in seen {
        out.entry((r.task.clone(), r.nominal.clone())).or_default().insert(r.execution_id.clone());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diamond_over_24_hours_runs_each_child_once_per_hour_through_kills_and_a_server_restart() {
    let mut server = NatsServer::start().await;
    let url = server.url();
    let mut registries =
        [service(&url, "jetsched-registry", "registry-1"), service(&url, "jetsched-registry", "registry-2")];
    let mut schedulers = [
        service(&url, "jetsched-scheduler", "scheduler-1"),
        service(&url, "jetsched-scheduler", "scheduler-2"),
    ];
    let mut workers =
        [service(&url, "jetsched-worker", "worker-1"), service(&url, "jetsched-worker", "worker-2")];
    let client = server.client().await;
    let api = Api::new(&client);
    let (seen, _downstream) = downstream(&client).await;

    let nats = |subject: &str| json!({"kind": "nats", "subject": subject});
    // A reply lost while the server restarts is waited for no longer than the timeout, then
    // the run is tried again (the same execution).
    let task = |id: &str| {
        spec("dag", id).executor(nats(&format!("dag.{id}"))).field("keep_result", true).timeout("3s")
    };
    let after = |parents: Value| json!({"tasks": parents});
    let specs = [
        task("a").every("1h").fast_retry(5).json(),
        task("b").without("schedule").field("after", after(json!(["a"]))).fast_retry(5).json(),
        task("c").without("schedule").field("after", after(json!(["a"]))).fast_retry(5).json(),
        task("d").without("schedule").field("after", after(json!(["b", "c"]))).fast_retry(5).json(),
    ];
    let names = Names::default();
    for spec in &specs {
        // The registries start meanwhile: the first puts may find none to answer.
        eventually(Duration::from_secs(20), "the registry stores the task", || async {
            let body = serde_json::to_vec(spec).unwrap();
            let reply = api.reply(names.task_api_subject("put"), HeaderMap::new(), body).await;
            reply.is_ok_and(|reply| reply.get("error").is_none())
        })
        .await;
    }
    // 24 simulated hours: a backfill of `a` over the last day.
    let to = Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap();
    let from = to - TimeDelta::hours(24);
    let backfill = api
        .call(
            names.backfill_api_subject("start"),
            json!({"namespace": "dag", "id": "a", "from": from.to_rfc3339(), "to": to.to_rfc3339(), "max_active": 4}),
        )
        .await;
    assert!(backfill.get("error").is_none(), "{backfill}");

    // Kills at random points of the flow: a worker, a registry (each runs the dependency
    // engine), the scheduler leader; and one restart of the server.
    let mut points: Vec<(usize, &str)> = {
        let mut rng = rand::rng();
        vec![
            (rng.random_range(4..20), "worker"),
            (rng.random_range(20..40), "registry"),
            (rng.random_range(10..30), "scheduler"),
            (rng.random_range(30..60), "server"),
        ]
    };
    points.sort();
    let started = Instant::now();
    let mut spawned = 2;
    // Killed processes are kept for their logs.
    let mut killed: Vec<ChildProcess> = Vec::new();
    for (after_requests, what) in points {
        eventually(
            Duration::from_secs(90),
            &format!("{after_requests} requests before killing the {what}"),
            || async { requests(&seen).len() >= after_requests },
        )
        .await;
        spawned += 1;
        match what {
            "worker" => {
                workers[0].kill9();
                let fresh = service(&url, "jetsched-worker", &format!("worker-{spawned}"));
                killed.push(std::mem::replace(&mut workers[0], fresh));
            }
            "registry" => {
                registries[0].kill9();
                let fresh = service(&url, "jetsched-registry", &format!("registry-{spawned}"));
                killed.push(std::mem::replace(&mut registries[0], fresh));
            }
            "scheduler" => {
                // Both are killed in turn, so the leader surely is.
                schedulers[0].kill9();
                let fresh = service(&url, "jetsched-scheduler", &format!("scheduler-{spawned}"));
                killed.push(std::mem::replace(&mut schedulers[0], fresh));
                tokio::time::sleep(Duration::from_millis(300)).await;
                schedulers[1].kill9();
                let fresh = service(&url, "jetsched-scheduler", &format!("scheduler-{spawned}b"));
                killed.push(std::mem::replace(&mut schedulers[1], fresh));
            }
            _ => server.restart().await,
        }
        eprintln!("killed the {what} after {after_requests} requests, {:?} in", started.elapsed());
    }

    // Every hour of the backfill reaches `d`.
    let hours: BTreeSet<String> =
        (0..24).map(|h| jetsched_shared::wire::format_time(from + TimeDelta::hours(h))).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = executions(&requests(&seen));
        let missing: Vec<(String, String)> = ["a", "b", "c", "d"]
            .iter()
            .flat_map(|task| hours.iter().map(move |hour| (task.to_string(), hour.clone())))
            .filter(|key| !done.contains_key(key))
            .collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for process in
                registries.iter().chain(schedulers.iter()).chain(workers.iter()).chain(killed.iter())
            {
                eprintln!("---- {:?}\n{}", process.log_path(), process.output());
            }
            // What the store says of each hour missing: the child's wait and its run's record.
            let js = async_nats::jetstream::new(client.clone());
            let waits = js.get_key_value(names.waits_bucket()).await.expect("waits bucket");
            let records = js.get_key_value(names.runs_bucket()).await.expect("runs bucket");
            for (task, hour) in &missing {
                let ms = chrono::DateTime::parse_from_rfc3339(hour).unwrap().timestamp_millis();
                let wait = waits.get(Names::wait_key("dag", task, ms)).await.ok().flatten();
                let id = jetsched_shared::wire::child_execution_id("dag", task, ms);
                let record = records.get(&id).await.ok().flatten();
                eprintln!(
                    "{task} at {hour}: wait {}; run {id}: {}",
                    wait.map(|w| String::from_utf8_lossy(&w).into_owned()).unwrap_or("none".into()),
                    record.map(|r| String::from_utf8_lossy(&r).into_owned()).unwrap_or("none".into())
                );
            }
            panic!("not every hour reached d within 120 s; missing {missing:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    always(Duration::from_secs(3), "nothing more runs", || async {
        let done = executions(&requests(&seen));
        done.keys().filter(|(task, _)| task == "d").count() == hours.len()
    })
    .await;

    let seen = requests(&seen);
    let runs = executions(&seen);
    for hour in &hours {
        for task in ["a", "b", "c", "d"] {
            let ids = runs
                .get(&(task.to_string(), hour.clone()))
                .unwrap_or_else(|| panic!("{task} never ran for {hour}"));
            assert_eq!(ids.len(), 1, "{task} at {hour}: one execution, got {ids:?}");
        }
        // `d` started after both `b` and `c` answered, and got both results.
        let answered = |task: &str| {
            seen.iter()
                .filter(|r| r.task == task && &r.nominal == hour)
                .map(|r| r.answered)
                .min()
                .expect("answered")
        };
        let first_d =
            seen.iter().filter(|r| r.task == "d" && &r.nominal == hour).map(|r| r.received).min().unwrap();
        assert!(
            first_d >= answered("b") && first_d >= answered("c"),
            "d at {hour} started before its parents ended"
        );
        let d = seen.iter().find(|r| r.task == "d" && &r.nominal == hour).unwrap();
        let results: BTreeMap<&str, Option<&Value>> =
            d.parents.iter().map(|p| (p.task.as_str(), p.result.as_ref())).collect();
        assert_eq!(results.len(), 2, "d at {hour}: {:?}", d.parents);
        for parent in ["b", "c"] {
            let result = results.get(format!("dag/{parent}").as_str()).copied().flatten();
            assert_eq!(
                result,
                Some(&json!({"task": parent, "nominal": hour})),
                "d at {hour}: {parent}'s result"
            );
        }
    }
    // No hour outside the backfill (a live fire of `a` may add one whole diamond at most).
    let extra: Vec<_> = runs.keys().filter(|(_, hour)| !hours.contains(hour)).collect();
    assert!(extra.len() <= 4, "{extra:?}");
    for process in registries.iter_mut().chain(schedulers.iter_mut()).chain(workers.iter_mut()) {
        if process.is_running() {
            process.sigterm();
        }
    }
}
