//! Circuit breakers in the worker: a failing downstream opens the breaker shared by three
//! workers, only probes reach it while open, delayed runs come back once it recovers (none
//! lost, doubled or dead-lettered) while another task of the queue keeps running on time;
//! `on_open: skip` with a key shared by two tasks; a worker killed holding unmerged counts.
//!
//! Windows and open periods are short (window 2 s, open_for 1 s) to keep the tests fast.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use jetsched_shared::names::Names;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{BreakerRecord, BreakerState, EventKind, RunStatus};
use jetsched_tests::fixtures::{
    Responder, dead_letters, dispatch, events_about, run_record, spec, wait_run_status,
};
use jetsched_tests::{App, eventually};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;
use tokio::net::TcpListener;

use crate::worker_support::{
    WAIT, config, dispatch_pending, server_with_topology, wait_for_workers, worker_process,
};

/// One request the downstream received.
#[derive(Debug, Clone)]
struct Hit {
    at: DateTime<Utc>,
    execution: String,
    ok: bool,
}

/// An HTTP downstream that fails (503) every request until told to recover, recording each.
struct Downstream {
    addr: std::net::SocketAddr,
    healthy: Arc<AtomicBool>,
    hits: Arc<Mutex<Vec<Hit>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Downstream {
    async fn failing() -> Downstream {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind the downstream");
        let addr = listener.local_addr().expect("downstream address");
        let healthy = Arc::new(AtomicBool::new(false));
        let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
        let (h, seen) = (healthy.clone(), hits.clone());
        let app = axum::Router::new().fallback(axum::routing::any(move |headers: HeaderMap| {
            let (h, seen) = (h.clone(), seen.clone());
            async move {
                let ok = h.load(Ordering::SeqCst);
                let execution = headers
                    .get("jetsched-execution-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                seen.lock().unwrap().push(Hit { at: Utc::now(), execution, ok });
                if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
            }
        }));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Downstream { addr, healthy, hits, task }
    }

    fn url(&self) -> String {
        format!("http://{}/pay", self.addr)
    }

    fn recover(&self) {
        self.healthy.store(true, Ordering::SeqCst);
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn breakers(js: &jetstream::Context) -> kv::Store {
    js.get_key_value(Names::default().breakers_bucket()).await.expect("breakers bucket")
}

async fn breaker(store: &kv::Store, key: &str) -> Option<BreakerRecord> {
    let value = store.get(key).await.ok()??;
    Some(serde_json::from_slice(&value).expect("breaker record decodes"))
}

fn handlers() -> Handlers {
    Handlers::new().register("ok", |_run: RunContext| async move { Outcome::ok() })
}

/// A task calling the downstream behind its own breaker (window 2 s, open 1 s, doubling to 2 s).
fn payments(url: &str) -> TaskSpec {
    spec("brk", "payments")
        .executor(json!({"kind": "http", "method": "POST", "url": url}))
        .fast_retry(30)
        .field(
            "breaker",
            json!({"min_runs": 4, "failure_rate": 0.5, "window": "2s", "open_for": "1s", "max_open_for": "2s"}),
        )
        .task()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_open_the_breaker_only_probes_pass_and_delayed_runs_all_run_once() {
    let (server, _client, js) = server_with_topology().await;
    let names = Names::default();
    let downstream = Downstream::failing().await;
    let mut workers = Vec::new();
    for n in 1..=3 {
        workers.push(App::worker(config(&server, &format!("brk-w{n}")), handlers()).await);
    }
    let store = breakers(&js).await;
    let task = payments(&downstream.url());
    let steady = spec("brk", "steady").handler("ok").task();
    let base = Utc::now().timestamp_millis();
    let mut runs = Vec::new();
    for n in 0..8 {
        runs.push(dispatch(&js, &names, &task, base + n).await);
    }

    let key = "task.brk.payments";
    let opened_at = eventually(WAIT, "the breaker opens", || async {
        let record = breaker(&store, key).await?;
        (record.state != BreakerState::Closed).then_some(record.opened_at?)
    })
    .await;

    // Another task of the same queue runs on time while the breaker holds the delayed runs.
    for n in 0..3 {
        let started = Instant::now();
        let id = dispatch(&js, &names, &steady, base + 100 + n).await;
        wait_run_status(&js, &names, &id, RunStatus::Succeeded, WAIT).await;
        assert!(started.elapsed() < Duration::from_secs(2), "steady run {n} took {:?}", started.elapsed());
    }
    // Let at least one probe round fail (the open period doubles), then recover.
    eventually(WAIT, "a probe round failed", || async {
        breaker(&store, key).await.is_some_and(|r| r.probe_round >= 2)
    })
    .await;
    let rounds_before_recovery = breaker(&store, key).await.expect("record").probe_round;
    let recovered_at = Utc::now();
    downstream.recover();

    // While open and failing, only probes reached the downstream (one per half-open round;
    // attempts admitted before the open state reached every worker end within a few ms).
    let settled = opened_at + chrono::Duration::milliseconds(600);
    let while_open: Vec<Hit> =
        downstream.hits().into_iter().filter(|h| h.at > settled && h.at < recovered_at).collect();
    assert!(
        while_open.len() as u64 <= rounds_before_recovery,
        "{} requests while open, {rounds_before_recovery} probe rounds: {while_open:?}",
        while_open.len()
    );

    for id in &runs {
        let record = wait_run_status(&js, &names, id, RunStatus::Succeeded, Duration::from_secs(30)).await;
        let numbers: Vec<u32> = record.attempts.iter().map(|a| a.attempt).collect();
        let expected: Vec<u32> = (1..=numbers.len() as u32).collect();
        assert_eq!(numbers, expected, "delays spend no attempts: {id}");
    }
    let mut successes: HashMap<String, u32> = HashMap::new();
    for hit in downstream.hits().into_iter().filter(|h| h.ok) {
        *successes.entry(hit.execution).or_default() += 1;
    }
    for id in &runs {
        assert_eq!(successes.get(id), Some(&1), "run {id} reached the recovered downstream once");
    }
    assert_eq!(successes.len(), runs.len(), "no other execution: {successes:?}");
    assert!(dead_letters(&js, &names).await.is_empty(), "nothing dead-lettered");
    eventually(WAIT, "the breaker is closed", || async {
        breaker(&store, key).await.is_some_and(|r| r.state == BreakerState::Closed)
    })
    .await;

    // Each transition told once, by the worker whose write made it.
    let closed = eventually(WAIT, "breaker.closed told", || async {
        let closed = events_about(&js, EventKind::BreakerClosed, "brk", "payments", WAIT).await;
        (!closed.is_empty()).then_some(closed)
    })
    .await;
    assert_eq!(closed.len(), 1, "{closed:?}");
    let opened = events_about(&js, EventKind::BreakerOpened, "brk", "payments", WAIT).await;
    let half = events_about(&js, EventKind::BreakerHalfOpened, "brk", "payments", WAIT).await;
    assert!(opened.len() >= 2, "first opening and a failed probe round: {opened:?}");
    assert_eq!(opened.len(), half.len(), "every half-open round ended in one opening or the closing");
    let first = &opened[0];
    assert_eq!(first.key.as_deref(), Some(key));
    assert_eq!(first.state.as_deref(), Some("open"));
    assert!(
        first.runs.unwrap_or_default() >= 4 && first.failure_rate.unwrap_or_default() >= 0.5,
        "{first:?}"
    );
    assert!(first.open_until.is_some());
    eventually(WAIT, "no dispatch left behind", || async { dispatch_pending(&js).await == 0 }).await;
    let mut delayed = 0.0;
    for worker in &workers {
        let series = format!(r#"jetsched_worker_runs_short_circuited_total{{action="delay",key="{key}"}}"#);
        delayed += worker.metric(&series).await.unwrap_or_default();
    }
    assert!(delayed >= 1.0, "runs were delayed");
    for worker in workers {
        worker.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_open_skip_records_the_reason_and_tasks_sharing_a_key_share_the_breaker() {
    let (server, client, js) = server_with_topology().await;
    let names = Names::default();
    let downstream = Responder::start(&client, "jobs.shared-down", "fail").await;
    let worker = App::worker(config(&server, "brk-skip"), handlers()).await;
    let breaker_spec =
        json!({"key": "shared-api", "min_runs": 3, "window": "2s", "open_for": "30s", "on_open": "skip"});
    let first = spec("brk", "first")
        .nats("jobs.shared-down")
        .fast_retry(1)
        .field("breaker", breaker_spec.clone())
        .task();
    let second =
        spec("brk", "second").nats("jobs.shared-down").fast_retry(1).field("breaker", breaker_spec).task();
    let base = Utc::now().timestamp_millis();
    for n in 0..3 {
        let id = dispatch(&js, &names, &first, base + n).await;
        wait_run_status(&js, &names, &id, RunStatus::Dead, WAIT).await;
    }
    let store = breakers(&js).await;
    eventually(WAIT, "the shared breaker opens", || async {
        breaker(&store, "key.shared-api").await.is_some_and(|r| r.state == BreakerState::Open)
    })
    .await;
    assert!(breaker(&store, "task.brk.first").await.is_none(), "a named breaker is not the task's own");

    let mut skipped = Vec::new();
    for n in 0..3 {
        let id = dispatch(&js, &names, &second, base + 10 + n).await;
        let record = wait_run_status(&js, &names, &id, RunStatus::Skipped, WAIT).await;
        assert!(record.attempts.is_empty() && record.finished.is_some(), "{record:?}");
        skipped.push(id);
    }
    let reached = downstream.requests();
    assert!(skipped.iter().all(|id| !reached.contains(id)), "skipped runs never reached the downstream");
    let told = eventually(WAIT, "run.skipped told for each", || async {
        let told = events_about(&js, EventKind::RunSkipped, "brk", "second", WAIT).await;
        (told.len() == skipped.len()).then_some(told)
    })
    .await;
    for event in &told {
        assert_eq!(event.reason.as_deref(), Some("breaker_open"));
        assert!(skipped.contains(event.execution_id.as_ref().expect("execution id")));
    }
    let opened = eventually(WAIT, "breaker.opened under _breaker", || async {
        let opened = events_about(&js, EventKind::BreakerOpened, "_breaker", "shared-api", WAIT).await;
        (!opened.is_empty()).then_some(opened)
    })
    .await;
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].key.as_deref(), Some("key.shared-api"));
    let series = r#"jetsched_worker_runs_short_circuited_total{action="skip",key="key.shared-api"}"#;
    assert_eq!(worker.metric(series).await, Some(3.0));
    assert_eq!(worker.metric(r#"jetsched_worker_breaker_state{key="key.shared-api"}"#).await, Some(2.0));
    // A redelivered skipped run is not run again.
    assert_eq!(run_record(&js, &names, &skipped[0]).await.map(|r| r.status), Some(RunStatus::Skipped));
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_holding_unmerged_counts_still_lets_the_breaker_open() {
    let (server, client, js) = server_with_topology().await;
    let names = Names::default();
    let downstream = Responder::start(&client, "jobs.flaky", "retry").await;
    let flags = ["--ack-wait", "2s"];
    let mut first = worker_process(&server, "brk-p1", &flags);
    wait_for_workers(&client, 1).await;
    let task = spec("brk", "flaky")
        .nats("jobs.flaky")
        .retry(json!({"max_attempts": 50, "initial": "300ms", "multiplier": 1.0, "max_interval": "300ms", "jitter": 0.0}))
        .field("breaker", json!({"min_runs": 6, "failure_rate": 0.5, "window": "10s", "open_for": "1s", "max_open_for": "1s"}))
        .task();
    let base = Utc::now().timestamp_millis();
    let mut runs = Vec::new();
    for n in 0..3 {
        runs.push(dispatch(&js, &names, &task, base + n).await);
    }
    // The first attempts failed on the first worker: kill it before its next merge.
    eventually(WAIT, "the first worker tried", || async { downstream.requests().len() >= 3 }).await;
    first.kill9();
    let store = breakers(&js).await;
    let merged_before_kill = breaker(&store, "task.brk.flaky").await.map(|r| r.window_counts(Utc::now()).0);
    let _others = [worker_process(&server, "brk-p2", &flags), worker_process(&server, "brk-p3", &flags)];
    eventually(WAIT, "the breaker opens on the other workers' counts", || async {
        breaker(&store, "task.brk.flaky").await.is_some_and(|r| r.state != BreakerState::Closed)
    })
    .await;
    downstream.set_status("ok");
    for id in &runs {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, Duration::from_secs(30)).await;
    }
    eventually(WAIT, "nothing stuck in the dispatch stream", || async { dispatch_pending(&js).await == 0 })
        .await;
    eventually(WAIT, "the breaker closes", || async {
        breaker(&store, "task.brk.flaky").await.is_some_and(|r| r.state == BreakerState::Closed)
    })
    .await;
    assert!(dead_letters(&js, &names).await.is_empty(), "nothing dead-lettered");
    eprintln!("attempts the killed worker had merged: {merged_before_kill:?}");
}
