//! Queue pause end to end, with worker processes on a real nats-server: a paused queue starts
//! no run on any worker once the pause is answered (the time from the reply to each worker's
//! last start is measured), its runs wait in the stream, and a resume releases every one of
//! them once; a worker started while its queue is paused pulls nothing until the resume; and a
//! team's account cannot reach the queue endpoints.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::spec::TaskSpec;
use jetsched_tests::fixtures::{dispatch, execution_id_header, execution_of, run_records};
use jetsched_tests::{
    Api, App, ChildProcess, WithTopology, admin_get, always, eventually, free_addr, metric_value,
    server_with_topology, spec,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::deploy::{DENIED_WAIT, SecureServer};
use crate::worker_support::{WAIT, dispatch_pending, wait_for_workers};

/// The longest a pause may take to reach every worker.
const FOLLOW_LATENCY: Duration = Duration::from_secs(1);

/// Each request the recorder saw: its execution id and when it came.
type Seen = Arc<Mutex<Vec<(String, DateTime<Utc>)>>>;

/// A downstream of the `nats` executor on `jobs.queue`: records when each execution's request
/// came (a run's start, seen from outside the workers) and answers `ok`.
async fn recorder(client: &async_nats::Client) -> Seen {
    let mut sub = client.subscribe("jobs.queue").await.expect("subscribe the recorder");
    client.flush().await.expect("flush the recorder's subscription");
    let seen: Seen = Arc::default();
    let (record, client) = (seen.clone(), client.clone());
    tokio::spawn(async move {
        while let Some(request) = sub.next().await {
            record.lock().expect("requests").push((execution_id_header(&request), Utc::now()));
            if let Some(reply) = request.reply {
                let _ = client.publish(reply, "ok".into()).await;
            }
        }
    });
    seen
}

/// Executions seen, with how many requests each got.
fn counted(seen: &Mutex<Vec<(String, DateTime<Utc>)>>) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (id, _) in seen.lock().expect("requests").iter() {
        *counts.entry(id.clone()).or_default() += 1;
    }
    counts
}

fn task() -> TaskSpec {
    spec("ops", "steady").nats("jobs.queue").task()
}

/// A worker process serving `default`, with its admin listener at `admin`.
fn worker(server_url: &str, instance: &str, admin: std::net::SocketAddr) -> ChildProcess {
    let mut command = ChildProcess::command("jetsched-worker");
    command.args(["--nats-url", server_url, "--instance-id", instance]).args([
        "--admin-addr",
        &admin.to_string(),
        "--pull-expires",
        "500ms",
    ]);
    ChildProcess::spawn_command(instance, command)
}

/// Publishes a run of `task` every 10 ms (a task firing 100 times a second) until `stop`;
/// returns the nominal times published.
async fn feed(js: jetstream::Context, task: TaskSpec, from: i64, stop: CancellationToken) -> Vec<i64> {
    let names = Names::default();
    let mut published = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut nominal = from;
    while !stop.is_cancelled() {
        tick.tick().await;
        dispatch(&js, &names, &task, nominal).await;
        published.push(nominal);
        nominal += 1;
    }
    published
}

async fn paused_gauge(admin: std::net::SocketAddr) -> Option<f64> {
    let reply = admin_get(admin, "/metrics").await.ok()?;
    metric_value(&reply.body, r#"jetsched_queue_paused{queue="default"}"#)
}

#[tokio::test]
async fn a_paused_queue_starts_nothing_on_any_worker_and_its_resume_releases_every_run_once() {
    let WithTopology { server, client, js, topology, .. } = server_with_topology(Default::default()).await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let api = Api::new(&client);
    let seen = recorder(&client).await;
    let admins = [free_addr(), free_addr()];
    let workers: Vec<ChildProcess> = admins
        .iter()
        .enumerate()
        .map(|(n, admin)| worker(&server.url(), &format!("qw-{n}"), *admin))
        .collect();
    wait_for_workers(&client, 2).await;

    let stop = CancellationToken::new();
    let feeder = tokio::spawn(feed(js.clone(), task(), 1, stop.clone()));
    eventually(WAIT, "runs flow through both workers", || async { seen.lock().unwrap().len() >= 50 }).await;

    let reply = api.queue("pause", json!({"queue": "default", "reason": "maintenance", "by": "test"})).await;
    let paused_at = Utc::now();
    assert_eq!(
        (reply["changed"].as_bool(), reply["queue"]["paused"].as_bool()),
        (Some(true), Some(true)),
        "{reply}"
    );
    assert_eq!(reply["queue"]["reason"], "maintenance", "{reply}");
    let again = api.queue("pause", json!({"queue": "default", "reason": "maintenance"})).await;
    assert_eq!(again["changed"], false, "pausing a paused queue changes nothing: {again}");
    for admin in admins {
        eventually(WAIT, "every worker shows the queue paused", || async {
            paused_gauge(admin).await == Some(1.0)
        })
        .await;
    }
    // The feed goes on: the runs must wait in the stream, and no run may start.
    let quiet_from = paused_at + FOLLOW_LATENCY;
    always(Duration::from_secs(2), "no run starts once the pause has reached the workers", || async {
        let late: Vec<_> = seen.lock().unwrap().iter().filter(|(_, at)| *at > quiet_from).cloned().collect();
        if late.is_empty() { Ok(()) } else { Err(late) }
    })
    .await;
    let listed = api.queue("list", json!({})).await;
    let default = &listed["queues"][0];
    assert_eq!(
        (default["queue"].as_str(), default["paused"].as_bool()),
        (Some("default"), Some(true)),
        "{listed}"
    );
    assert!(default["waiting"].as_u64().unwrap_or(0) >= 100, "runs wait in the queue: {listed}");
    assert!(dispatch_pending(&js).await >= 100);

    // Runs may start as soon as the resume is stored, before its reply comes back.
    let resumed_at = Utc::now();
    let resumed = api.queue("resume", json!({"queue": "default"})).await;
    assert_eq!(
        (resumed["changed"].as_bool(), resumed["queue"]["paused"].as_bool()),
        (Some(true), Some(false))
    );
    stop.cancel();
    let published = feeder.await.expect("feeder");
    let expected: BTreeMap<String, usize> =
        published.iter().map(|n| (execution_of(&task(), *n), 1)).collect();
    eventually(WAIT, "every run published has run", || async {
        counted(&seen).len() == expected.len() && dispatch_pending(&js).await == 0
    })
    .await;
    let counts: BTreeMap<String, usize> = counted(&seen).into_iter().collect();
    assert_eq!(counts, expected, "every run once: none lost, none doubled");

    // Each worker's last start before the resume, from the run records (worker, start time).
    let records = eventually(WAIT, "every run recorded", || async {
        let records = run_records(&topology.runs).await?;
        if records.len() == expected.len() { Ok(records) } else { Err(format!("{} records", records.len())) }
    })
    .await;
    let mut last_start: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    for record in records.values() {
        let first = &record.attempts[0];
        if first.started < resumed_at {
            let last = last_start.entry(first.worker.clone()).or_insert(first.started);
            *last = (*last).max(first.started);
        }
    }
    assert_eq!(last_start.len(), 2, "both workers ran runs before the pause: {last_start:?}");
    for (worker, last) in &last_start {
        let after = (*last - paused_at).num_milliseconds();
        println!("queue pause: {worker}'s last run start was {after} ms after the pause reply");
        assert!(
            after < FOLLOW_LATENCY.as_millis() as i64,
            "{worker} started a run {after} ms after the pause"
        );
    }
    drop(workers);
    registry.stop().await;
}

#[tokio::test]
async fn a_worker_started_while_its_queue_is_paused_pulls_nothing_until_the_resume() {
    let WithTopology { server, client, js, .. } = server_with_topology(Default::default()).await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let api = Api::new(&client);
    let seen = recorder(&client).await;
    let admin = free_addr();
    let mut first = worker(&server.url(), "qr-1", admin);
    wait_for_workers(&client, 1).await;
    let reply = api.queue("pause", json!({"queue": "default", "reason": "restart test"})).await;
    assert_eq!(reply["changed"], true, "{reply}");
    eventually(WAIT, "the worker shows the queue paused", || async {
        paused_gauge(admin).await == Some(1.0)
    })
    .await;
    first.sigterm();
    first.wait_exit(WAIT).await.expect("the worker stops");

    let names = Names::default();
    for nominal in 1..=20 {
        dispatch(&js, &names, &task(), nominal).await;
    }
    let restarted_admin = free_addr();
    let _second = worker(&server.url(), "qr-2", restarted_admin);
    wait_for_workers(&client, 1).await;
    eventually(WAIT, "the new worker starts paused", || async {
        paused_gauge(restarted_admin).await == Some(1.0)
    })
    .await;
    // Time passing is the point: the new worker must not pull while the queue stays paused.
    always(Duration::from_millis(1500), "no run starts on the restarted worker", || async {
        seen.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(dispatch_pending(&js).await, 20, "every run waits in the stream");

    api.queue("resume", json!({"queue": "default"})).await;
    eventually(WAIT, "the restarted worker runs every waiting run", || async { counted(&seen).len() == 20 })
        .await;
    assert!(counted(&seen).values().all(|n| *n == 1), "none doubled");
    eventually(WAIT, "the gauge follows the resume", || async {
        paused_gauge(restarted_admin).await == Some(0.0)
    })
    .await;
    registry.stop().await;
}

#[tokio::test]
async fn a_team_cannot_reach_the_queue_endpoints() {
    let server = SecureServer::start().await;
    let mut config = jetsched_registry::Config::for_tests(&server.url);
    config.shared.nats = server.nats_args("registry");
    let registry = App::registry(config).await;
    let names = Names::default();

    let tenant = server.connect("tenant-demo").await;
    for endpoint in ["list", "pause", "resume"] {
        for subject in
            [names.queue_api_subject(endpoint), format!("{}.demo", names.queue_api_subject(endpoint))]
        {
            let body = serde_json::to_vec(&json!({"queue": "default"})).expect("encode");
            let answered =
                tokio::time::timeout(DENIED_WAIT, tenant.client.request(subject.clone(), body.into())).await;
            assert!(!matches!(answered, Ok(Ok(_))), "{subject} was answered for a team: {answered:?}");
        }
    }
    // The operator's user in the services' account reaches them, and the queue still runs.
    let operator = server.connect("operator").await;
    let listed = operator.api.queue("list", json!({})).await;
    let queues = listed["queues"].as_array().expect("a list");
    assert!(queues.iter().all(|queue| queue["paused"] == false), "{listed}");
    let paused = operator.api.queue("pause", json!({"queue": "default"})).await;
    assert_eq!(paused["changed"], true, "{paused}");
    registry.stop().await;
}
