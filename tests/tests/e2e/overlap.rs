//! Overlap policies `replace` and `cancel_other`, end to end on a real nats-server with the
//! scheduler and workers: under `replace` each queued run is cancelled for the newest fire
//! (only the newest runs) and a running run finishes first while the newest waiting fire takes
//! the place of an older one; under `cancel_other` a running HTTP request is aborted and the
//! new fire's request comes only after; and both keep their promises when the leader
//! scheduler (a real process) is killed with SIGKILL, and the worker too.
//!
//! A run cancelled for a newer fire ends `cancelled` with a reason naming that fire (its
//! nominal time and execution id), told once as `run.cancelled`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::kv::Operation;
use chrono::{DateTime, Utc};
use jetsched_shared::names::Names;
use jetsched_shared::topology::Topology;
use jetsched_shared::wire::scheduled_execution_id;
use jetsched_shared::wire::{AttemptOutcome, EventKind, LeaderRecord, RunRecord, RunStatus, format_time};
use jetsched_tests::fixtures::{events_about, noting, run_records, write_task};
use jetsched_tests::{App, ChildProcess, WithTopology, eventually, server_with_topology, spec, with_lease};
use jetsched_worker::{Outcome, RunContext};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::scheduler::{spawn_scheduler, tasks_loaded};
use crate::worker_support::{WAIT, config, dispatch_pending, worker_process};

const NS: &str = "overlap";

/// The reason a run cancelled for the fire at `nominal` of task `id` records.
fn replaced_by(id: &str, nominal: DateTime<Utc>, policy: &str) -> String {
    let execution = scheduled_execution_id(NS, id, nominal.timestamp_millis());
    format!("replaced by the fire of {} (execution {execution}; overlap {policy})", format_time(nominal))
}

/// Now, as a spec's `start_at`: `max_runs` counts from it (the registry sets it so at
/// admission; these tests write the tasks bucket directly).
fn now() -> String {
    format_time(Utc::now())
}

/// An in-process scheduler on the real clock.
async fn scheduler(url: &str, instance: &str, lease: Duration) -> App {
    let mut config = jetsched_scheduler::Config::for_tests(url);
    config.shared.common.instance_id = Some(instance.to_string());
    config.shared.topology.lease = lease;
    config.lease_margin = lease / 4;
    App::scheduler(config).await
}

/// The run records of task `id`, by nominal time.
async fn records_of(topology: &Topology, id: &str) -> Vec<RunRecord> {
    let mut records: Vec<RunRecord> = run_records(&topology.runs)
        .await
        .unwrap_or_default()
        .into_values()
        .filter(|r| r.namespace == NS && r.task_id == id)
        .collect();
    records.sort_by_key(|r| r.nominal_time);
    records
}

/// The nominal times of the `fire.skipped` events of task `id`, with their reasons.
async fn skips_of(js: &jetstream::Context, id: &str) -> BTreeMap<i64, String> {
    events_about(js, EventKind::FireSkipped, NS, id, WAIT)
        .await
        .into_iter()
        .map(|e| {
            let nominal = e.nominal_time.expect("a skip names its fire").timestamp_millis();
            (nominal, e.reason.unwrap_or_default())
        })
        .collect()
}

/// `run.cancelled` reasons of task `id` by execution; each execution told once.
async fn cancels_told(js: &jetstream::Context, id: &str) -> HashMap<String, String> {
    let told = events_about(js, EventKind::RunCancelled, NS, id, WAIT).await;
    let mut by_execution = HashMap::new();
    for event in told {
        let execution = event.execution_id.clone().expect("names its run");
        let again = by_execution.insert(execution.clone(), event.reason.clone().unwrap_or_default());
        assert!(again.is_none(), "run.cancelled told twice for {execution}");
    }
    by_execution
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_cancels_each_queued_run_for_the_newest_fire_and_only_the_newest_runs() {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let _scheduler = scheduler(&server.url(), "s-replace", lease).await;
    // No worker yet: every run queues.
    let task = spec(NS, "queued")
        .every("1s")
        .handler("note")
        .field("overlap", "replace")
        .field("start_at", now())
        .field("max_runs", 4);
    write_task(&topology.tasks, &task).await;
    let cancelled = eventually(WAIT, "three queued runs replaced", || async {
        let records = records_of(&topology, "queued").await;
        match records.len() == 3 && records.iter().all(|r| r.status == RunStatus::Cancelled) {
            true => Ok(records),
            false => Err(records.len()),
        }
    })
    .await;
    eventually(WAIT, "the fourth fire queued", || async { dispatch_pending(&js).await == 4 }).await;

    let (handlers, ran) =
        noting("note", |run: &RunContext| run.execution_id.clone(), |_| async { Outcome::ok() });
    let _worker = App::worker(config(&server, "w-replace"), handlers).await;
    let last = cancelled[2].nominal_time + chrono::Duration::seconds(1);
    let newest = scheduled_execution_id(NS, "queued", last.timestamp_millis());
    eventually(WAIT, "the newest run succeeded and every message is acked", || async {
        let records = records_of(&topology, "queued").await;
        let done = records.iter().any(|r| r.execution_id == newest && r.status == RunStatus::Succeeded);
        (done && dispatch_pending(&js).await == 0).then_some(())
    })
    .await;
    assert_eq!(*ran.lock().unwrap(), vec![newest], "only the newest fire ran");

    // Each replaced run never started, and names the fire that replaced it.
    let records = records_of(&topology, "queued").await;
    assert_eq!(records.len(), 4, "{records:?}");
    let told = cancels_told(&js, "queued").await;
    for pair in records.windows(2) {
        let (old, new) = (&pair[0], &pair[1]);
        assert_eq!((new.nominal_time - old.nominal_time).num_milliseconds(), 1000, "consecutive fires");
        let reason = replaced_by("queued", new.nominal_time, "replace");
        assert_eq!((old.status, old.reason.as_deref()), (RunStatus::Cancelled, Some(reason.as_str())));
        assert!(old.attempts.is_empty(), "a replaced run never started: {old:?}");
        assert_eq!(told.get(&old.execution_id), Some(&reason), "{told:?}");
    }
    assert_eq!(told.len(), 3, "{told:?}");
    assert!(skips_of(&js, "queued").await.is_empty(), "every fire was dispatched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_lets_a_running_run_finish_and_then_runs_only_the_newest_fire() {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    // The first run takes 7 s, the others none.
    let calls = Arc::new(AtomicUsize::new(0));
    let (handlers, ran) = noting(
        "busy",
        |run: &RunContext| (run.execution_id.clone(), Instant::now()),
        move |_| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    tokio::time::sleep(Duration::from_secs(7)).await;
                }
                Outcome::ok()
            }
        },
    );
    let _worker = App::worker(config(&server, "w-busy"), handlers).await;
    let _scheduler = scheduler(&server.url(), "s-busy", lease).await;
    let task = spec(NS, "busy")
        .every("2s")
        .handler("busy")
        .field("overlap", "replace")
        .field("start_at", now())
        .field("max_runs", 4);
    write_task(&topology.tasks, &task).await;

    let records = eventually(Duration::from_secs(30), "two runs succeeded", || async {
        let records = records_of(&topology, "busy").await;
        let done = records.iter().filter(|r| r.status == RunStatus::Succeeded).count();
        if done == 2 { Ok(records) } else { Err(records.len()) }
    })
    .await;
    // Fires 1 and 4 ran, one after the other; 2 and 3 waited in turn and gave way to a newer fire.
    assert_eq!(records.len(), 2, "{records:?}");
    let (first, last) = (&records[0], &records[1]);
    assert_eq!((last.nominal_time - first.nominal_time).num_milliseconds(), 6000, "{records:?}");
    let finished = first.finished.expect("the first run finished");
    assert!(last.started >= finished, "the newest fire ran after the running one: {records:?}");
    assert_eq!(ran.lock().unwrap().len(), 2);
    let skips = skips_of(&js, "busy").await;
    let base = first.nominal_time.timestamp_millis();
    let expected: BTreeMap<i64, String> =
        [(base + 2000, "replaced".to_string()), (base + 4000, "replaced".to_string())].into();
    assert_eq!(skips, expected, "the waiting fires each gave way to the newer one");
    assert!(cancels_told(&js, "busy").await.is_empty(), "a running run is never cancelled under replace");
}

/// An HTTP server on 127.0.0.1: each request is answered after `hold(n)` (n counts requests
/// from 0) unless its client goes away first; every request seen, in order.
async fn downstream(hold: impl Fn(usize) -> Duration + Send + Sync + 'static) -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/run", listener.local_addr().expect("addr"));
    let seen: Seen = Arc::default();
    let requests = seen.clone();
    let hold = Arc::new(hold);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (requests, hold) = (requests.clone(), hold.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_lowercase();
                let execution = text
                    .lines()
                    .find_map(|line| line.strip_prefix("jetsched-execution-id:"))
                    .map(|v| v.trim().to_string())
                    .unwrap_or_default();
                let n = {
                    let mut requests = requests.lock().unwrap();
                    requests.push(Request {
                        execution,
                        opened: Instant::now(),
                        closed: None,
                        answered: false,
                    });
                    requests.len() - 1
                };
                let answered = tokio::select! {
                    () = tokio::time::sleep(hold(n)) => {
                        let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
                        socket.write_all(reply).await.is_ok()
                    }
                    // The client went away (its attempt was stopped, or its worker died).
                    _ = socket.read(&mut chunk) => false,
                };
                let mut requests = requests.lock().unwrap();
                requests[n].closed = Some(Instant::now());
                requests[n].answered = answered;
            });
        }
    });
    (url, seen)
}

#[derive(Debug, Clone)]
struct Request {
    execution: String,
    opened: Instant,
    closed: Option<Instant>,
    answered: bool,
}

type Seen = Arc<Mutex<Vec<Request>>>;

/// No two requests were open at once: each opened after the one before had closed.
fn one_at_a_time(requests: &[Request]) {
    for pair in requests.windows(2) {
        let closed =
            pair[0].closed.unwrap_or_else(|| panic!("{:?} still open when {:?} came", pair[0], pair[1]));
        assert!(pair[1].opened >= closed, "two runs at once: {pair:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_other_aborts_the_running_http_request_and_sends_the_new_fires_after_it() {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let (url, seen) = downstream(|n| if n == 0 { Duration::from_secs(60) } else { Duration::ZERO }).await;
    let executor = json!({"kind": "http", "method": "POST", "url": url});
    let _worker = App::worker(config(&server, "w-http"), jetsched_worker::Handlers::new()).await;
    let _scheduler = scheduler(&server.url(), "s-http", lease).await;
    let task = spec(NS, "http")
        .every("2s")
        .executor(executor)
        .timeout("2m")
        .field("overlap", "cancel_other")
        .field("start_at", now())
        .field("max_runs", 2);
    write_task(&topology.tasks, &task).await;

    let records = eventually(Duration::from_secs(30), "the second run succeeded", || async {
        let records = records_of(&topology, "http").await;
        let done = records.len() == 2 && records[1].status == RunStatus::Succeeded;
        if done { Ok(records) } else { Err(records.len()) }
    })
    .await;
    let (first, second) = (&records[0], &records[1]);
    let reason = replaced_by("http", second.nominal_time, "cancel_other");
    assert_eq!((first.status, first.reason.as_deref()), (RunStatus::Cancelled, Some(reason.as_str())));
    assert_eq!(first.attempts.len(), 1, "{first:?}");
    assert_eq!(first.attempts[0].outcome, Some(AttemptOutcome::Cancelled), "{first:?}");
    assert!(second.started >= first.finished.expect("finished"), "{records:?}");

    // The downstream saw the first request go away unanswered, then the second one.
    let requests = seen.lock().unwrap().clone();
    let executions: Vec<&str> = requests.iter().map(|r| r.execution.as_str()).collect();
    assert_eq!(executions, [first.execution_id.as_str(), second.execution_id.as_str()]);
    assert!(!requests[0].answered && requests[1].answered, "{requests:?}");
    one_at_a_time(&requests);
    let told = cancels_told(&js, "http").await;
    assert_eq!(told, HashMap::from([(first.execution_id.clone(), reason)]));
}

/// The lease holder's instance.
async fn leader(topology: &Topology) -> Option<String> {
    let entry = topology.leader.entry(Names::default().leader_key()).await.ok()??;
    (entry.operation == Operation::Put)
        .then(|| serde_json::from_slice::<LeaderRecord>(&entry.value).ok().map(|r| r.instance))
        .flatten()
}

/// Waits until the downstream has seen `n` requests.
async fn requests_seen(seen: &Seen, n: usize) {
    let wait = Duration::from_secs(40);
    eventually(wait, &format!("{n} requests"), || async {
        let count = seen.lock().unwrap().len();
        (count >= n).then_some(()).ok_or(count)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_other_survives_a_killed_leader_and_a_killed_worker_without_two_runs_at_once() {
    // The default lease, which the worker processes' topology has too.
    let lease = Duration::from_secs(3);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    // Every request is held until its run is cancelled (or its worker dies).
    let (url, seen) = downstream(|_| Duration::from_secs(120)).await;
    let executor = json!({"kind": "http", "method": "POST", "url": url});
    let worker_flags = ["--ack-wait", "2s", "--http-allow", "*=127.0.0.0/8"];
    let mut worker = worker_process(&server, "w-1", &worker_flags);
    let task =
        spec(NS, "failover").every("2s").executor(executor).timeout("5m").field("overlap", "cancel_other");
    write_task(&topology.tasks, &task).await;
    let mut schedulers: HashMap<String, ChildProcess> = ["s-a", "s-b"]
        .into_iter()
        .map(|instance| (instance.to_string(), spawn_scheduler(&server.url(), instance, lease)))
        .collect();
    for process in schedulers.values() {
        tasks_loaded(process).await;
    }

    requests_seen(&seen, 2).await;
    let first_leader = eventually(WAIT, "a leader", || async { leader(&topology).await }).await;
    schedulers.get_mut(&first_leader).expect("the leader is ours").kill9();
    requests_seen(&seen, 4).await;
    worker.kill9();
    let _worker = worker_process(&server, "w-2", &worker_flags);
    requests_seen(&seen, 7).await;
    for process in schedulers.values_mut() {
        process.kill9();
    }
    let mut requests = seen.lock().unwrap().clone();
    // The request open when the schedulers stopped is still held: it is the last.
    let open = requests.pop().expect("requests");
    one_at_a_time(&requests);
    assert!(requests.iter().all(|r| r.closed.is_some() && !r.answered), "{requests:?} {open:?}");

    // Runs in fire order: a run's requests (a worker's death re-runs it) come before the next's.
    let records: HashMap<String, RunRecord> =
        records_of(&topology, "failover").await.into_iter().map(|r| (r.execution_id.clone(), r)).collect();
    let nominal = |execution: &str| records.get(execution).map(|r| r.nominal_time);
    let order: Vec<DateTime<Utc>> = requests
        .iter()
        .map(|r| nominal(&r.execution).unwrap_or_else(|| panic!("no record of {r:?}")))
        .collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "runs out of fire order: {order:?}");

    // Every fire from the first to the last run was either dispatched (a record) or skipped,
    // never both; every run before the last is cancelled, once, naming a later fire, and no
    // fire replaced two runs.
    let last = nominal(&open.execution).expect("the last run's record");
    let first = order[0];
    let skips = skips_of(&js, "failover").await;
    let told = cancels_told(&js, "failover").await;
    let mut replacing = HashSet::new();
    let mut at = first;
    while at <= last {
        let execution = scheduled_execution_id(NS, "failover", at.timestamp_millis());
        let skipped = skips.get(&at.timestamp_millis());
        match records.get(&execution) {
            Some(record) => {
                assert!(skipped.is_none(), "{at} both ran and was skipped ({skipped:?})");
                if at == last {
                    break;
                }
                assert_eq!(record.status, RunStatus::Cancelled, "{record:?}");
                let reason = record.reason.clone().expect("a cancelled run says why");
                assert!(
                    reason.starts_with("replaced by the fire of ")
                        && reason.ends_with("overlap cancel_other)")
                );
                assert!(replacing.insert(reason.clone()), "one fire replaced two runs: {reason}");
                assert_eq!(told.get(&execution), Some(&reason), "told once: {told:?}");
            }
            None => assert!(skipped.is_some(), "fire {at} neither dispatched nor skipped"),
        }
        at += chrono::Duration::seconds(2);
    }
    assert!(requests.len() >= 6, "{requests:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_survives_a_killed_leader_each_queued_run_cancelled_once_and_only_the_last_runs() {
    let lease = Duration::from_secs(3);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    // No worker until the task's last fire: every run queues.
    let task = spec(NS, "queued-failover")
        .every("1s")
        .handler("note")
        .field("overlap", "replace")
        .field("start_at", now())
        .field("max_runs", 10);
    write_task(&topology.tasks, &task).await;
    let mut schedulers: HashMap<String, ChildProcess> = ["s-c", "s-d"]
        .into_iter()
        .map(|instance| (instance.to_string(), spawn_scheduler(&server.url(), instance, lease)))
        .collect();
    for process in schedulers.values() {
        tasks_loaded(process).await;
    }
    eventually(Duration::from_secs(20), "three queued runs replaced", || async {
        let cancelled = records_of(&topology, "queued-failover").await.len();
        (cancelled >= 3).then_some(()).ok_or(cancelled)
    })
    .await;
    let first_leader = eventually(WAIT, "a leader", || async { leader(&topology).await }).await;
    schedulers.get_mut(&first_leader).expect("the leader is ours").kill9();

    // The task's tenth fire handled (the task completed): its run queued, every earlier fire
    // a cancelled record or a skip.
    eventually(Duration::from_secs(30), "the task completed", || async {
        let completed = events_about(&js, EventKind::TaskCompleted, NS, "queued-failover", WAIT).await;
        (!completed.is_empty()).then_some(())
    })
    .await;
    let skips = eventually(WAIT, "the last fire queued after the cancelled ones", || async {
        let records = records_of(&topology, "queued-failover").await;
        let skips = skips_of(&js, "queued-failover").await;
        let pending = dispatch_pending(&js).await as usize;
        let queued = records.len() + skips.len() == 9 && pending == records.len() + 1;
        if queued { Ok(skips) } else { Err((records.len(), skips.len(), pending)) }
    })
    .await;

    let (handlers, ran) =
        noting("note", |run: &RunContext| run.execution_id.clone(), |_| async { Outcome::ok() });
    let _worker = App::worker(config(&server, "w-queued"), handlers).await;
    eventually(WAIT, "every message acked", || async { dispatch_pending(&js).await == 0 }).await;
    let records = records_of(&topology, "queued-failover").await;
    let ran = ran.lock().unwrap().clone();
    assert_eq!(ran.len(), 1, "only the newest fire ran: {ran:?}");
    let newest = records.last().expect("records");
    assert_eq!((newest.status, &newest.execution_id), (RunStatus::Succeeded, &ran[0]), "{records:?}");

    // Each run before it was cancelled once, never started, naming a later fire that was
    // dispatched; no fire replaced two runs; no fire both dispatched and skipped.
    let told = cancels_told(&js, "queued-failover").await;
    let dispatched: HashSet<String> = records.iter().map(|r| r.execution_id.clone()).collect();
    let mut replacing = HashSet::new();
    for record in &records[..records.len() - 1] {
        assert_eq!(record.status, RunStatus::Cancelled, "{record:?}");
        assert!(record.attempts.is_empty(), "{record:?}");
        let reason = record.reason.clone().expect("a reason");
        let by = reason.split("(execution ").nth(1).and_then(|r| r.split(';').next()).expect("names a fire");
        assert!(dispatched.contains(by), "{reason} names a fire that was not dispatched");
        assert!(replacing.insert(by.to_string()), "one fire replaced two runs: {reason}");
        assert_eq!(told.get(&record.execution_id), Some(&reason), "told once: {told:?}");
        assert!(!skips.contains_key(&record.nominal_time.timestamp_millis()), "{record:?} also skipped");
    }
    assert_eq!(told.len(), records.len() - 1, "{told:?}");
    assert_eq!(records.len() + skips.len(), 10, "{records:?} {skips:?}");
}
