//! Circuit breakers in the worker: a failing downstream opens the breaker shared by three
//! workers, only probes reach it while open, delayed runs come back once it recovers (none
//! lost, doubled or dead-lettered) while another task of the queue keeps running on time;
//! `on_open: skip` with a key shared by two tasks; a worker killed holding unmerged counts; the
//! same key in two namespaces, two breakers unless the workers declare the key shared.
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
use jetsched_tests::{App, WithTopology, eventually, server_with_topology};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;
use tokio::net::TcpListener;

use crate::worker_support::{WAIT, config, dispatch_pending, wait_for_workers, worker_process};

/// One request the downstream received.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) at: DateTime<Utc>,
    pub(crate) execution: String,
    pub(crate) ok: bool,
}

/// An HTTP downstream that fails (503) every request until told to recover, recording each.
pub(crate) struct Downstream {
    addr: std::net::SocketAddr,
    healthy: Arc<AtomicBool>,
    hits: Arc<Mutex<Vec<Hit>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Downstream {
    pub(crate) async fn failing() -> Downstream {
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

    pub(crate) fn url(&self) -> String {
        format!("http://{}/pay", self.addr)
    }

    pub(crate) fn recover(&self) {
        self.healthy.store(true, Ordering::SeqCst);
    }

    pub(crate) fn hits(&self) -> Vec<Hit> {
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
    let WithTopology { server, js, names, .. } = server_with_topology(Default::default()).await;
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
    let WithTopology { server, client, js, names, .. } = server_with_topology(Default::default()).await;
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
        breaker(&store, "key.brk.shared-api").await.is_some_and(|r| r.state == BreakerState::Open)
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
    let opened = eventually(WAIT, "breaker.opened under the namespace and the key", || async {
        let opened = events_about(&js, EventKind::BreakerOpened, "brk", "shared-api", WAIT).await;
        (!opened.is_empty()).then_some(opened)
    })
    .await;
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].key.as_deref(), Some("key.brk.shared-api"));
    let series = r#"jetsched_worker_runs_short_circuited_total{action="skip",key="key.brk.shared-api"}"#;
    assert_eq!(worker.metric(series).await, Some(3.0));
    assert_eq!(worker.metric(r#"jetsched_worker_breaker_state{key="key.brk.shared-api"}"#).await, Some(2.0));
    // A redelivered skipped run is not run again.
    assert_eq!(run_record(&js, &names, &skipped[0]).await.map(|r| r.status), Some(RunStatus::Skipped));
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_holding_unmerged_counts_still_lets_the_breaker_open() {
    let WithTopology { server, client, js, names, .. } = server_with_topology(Default::default()).await;
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

/// The calls a handler received, as `<namespace>/<id>`.
type Calls = Arc<Mutex<Vec<String>>>;

/// `down` fails every run for good, `up` succeeds; each records its calls.
fn recording_handlers() -> (Handlers, Calls, Calls) {
    let (down, up): (Calls, Calls) = Default::default();
    let (d, u) = (down.clone(), up.clone());
    let handlers = Handlers::new()
        .register("down", move |run: RunContext| {
            d.lock().unwrap().push(format!("{}/{}", run.namespace, run.task_id));
            async move { Outcome::permanent("downstream is down") }
        })
        .register("up", move |run: RunContext| {
            u.lock().unwrap().push(format!("{}/{}", run.namespace, run.task_id));
            async move { Outcome::ok() }
        });
    (handlers, down, up)
}

/// What [`same_key_in_two_namespaces`] leaves: the worker, the bucket key demo's breaker opened
/// under, billing's execution ids, and the handlers' calls.
struct TwoNamespaces {
    js: jetstream::Context,
    worker: App,
    store: kv::Store,
    opened_key: String,
    billing_runs: Vec<String>,
    up: Calls,
    down: Calls,
    _server: jetsched_tests::NatsServer,
}

/// Tasks of `demo` and `billing` name breaker key `pay` (on a worker sharing the keys
/// `shared`): demo's fails until its breaker opens (`min_runs: 1`, `open_for: 1h`) and its next
/// run is held, then billing's task is dispatched three times.
async fn same_key_in_two_namespaces(shared: &[&str]) -> TwoNamespaces {
    let WithTopology { server, js, names, .. } = server_with_topology(Default::default()).await;
    let (handlers, down, up) = recording_handlers();
    let mut config = config(&server, "brk-ns");
    config.shared_breakers = shared.iter().map(|key| key.to_string()).collect();
    let worker = App::worker(config, handlers).await;
    let demo = spec("demo", "charge")
        .handler("down")
        .fast_retry(1)
        .field("breaker", json!({"key": "pay", "min_runs": 1, "window": "10m", "open_for": "1h"}))
        .task();
    let billing = spec("billing", "charge")
        .handler("up")
        .fast_retry(1)
        .field("breaker", json!({"key": "pay", "min_runs": 3, "window": "10m", "open_for": "30s"}))
        .task();
    let opened_key = if shared.contains(&"pay") { "key.=shared.pay" } else { "key.demo.pay" };
    let store = breakers(&js).await;
    let base = Utc::now().timestamp_millis();
    let failed = dispatch(&js, &names, &demo, base).await;
    wait_run_status(&js, &names, &failed, RunStatus::Dead, WAIT).await;
    eventually(WAIT, "demo's breaker opens", || async {
        breaker(&store, opened_key).await.is_some_and(|r| r.state == BreakerState::Open)
    })
    .await;
    // The worker saw it open (its own merge opened it) before billing's runs come.
    let state = format!(r#"jetsched_worker_breaker_state{{key="{opened_key}"}}"#);
    eventually(WAIT, "the worker holds the breaker open", || async {
        worker.metric(&state).await == Some(2.0)
    })
    .await;
    // Demo's next run is held by its open breaker, whatever the key's scope.
    dispatch(&js, &names, &demo, base + 1).await;
    let held = format!(r#"jetsched_worker_runs_short_circuited_total{{action="delay",key="{opened_key}"}}"#);
    eventually(WAIT, "demo's next run is delayed", || async { worker.metric(&held).await == Some(1.0) })
        .await;
    let mut billing_runs = Vec::new();
    for n in 0..3 {
        billing_runs.push(dispatch(&js, &names, &billing, base + 10 + n).await);
    }
    TwoNamespaces {
        js,
        worker,
        store,
        opened_key: opened_key.to_string(),
        billing_runs,
        up,
        down,
        _server: server,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_breaker_key_belongs_to_its_namespace_another_namespace_naming_it_keeps_running() {
    let names = Names::default();
    let t = same_key_in_two_namespaces(&[]).await;
    let js = &t.js;
    for id in &t.billing_runs {
        let record = wait_run_status(js, &names, id, RunStatus::Succeeded, WAIT).await;
        assert_eq!(record.attempts.len(), 1, "run at once, not delayed: {record:?}");
    }
    assert_eq!(*t.up.lock().unwrap(), ["billing/charge"; 3], "every billing run reached its handler");
    assert_eq!(*t.down.lock().unwrap(), ["demo/charge"], "demo's second run is held");
    // Billing's breaker is its own: closed, its three successes counted; demo's stays open.
    let billing = eventually(WAIT, "billing's attempts are merged into its breaker", || async {
        breaker(&t.store, "key.billing.pay").await.filter(|r| r.window_counts(Utc::now()).0 == 3)
    })
    .await;
    assert_eq!(billing.state, BreakerState::Closed, "{billing:?}");
    assert_eq!(billing.window_counts(Utc::now()), (3, 0));
    let demo = breaker(&t.store, "key.demo.pay").await.expect("demo's breaker");
    assert_eq!((demo.state, demo.window_counts(Utc::now())), (BreakerState::Open, (1, 1)));
    assert!(breaker(&t.store, "key.=shared.pay").await.is_none(), "no shared breaker");
    let billing_held = r#"jetsched_worker_runs_short_circuited_total{action="delay",key="key.billing.pay"}"#;
    assert_eq!(t.worker.metric(billing_held).await, None, "no billing run held");
    eventually(WAIT, "the worker sees billing's breaker closed", || async {
        t.worker.metric(r#"jetsched_worker_breaker_state{key="key.billing.pay"}"#).await == Some(0.0)
    })
    .await;
    // The opening is told in demo's namespace, with the key; nothing in billing's.
    let opened = events_about(js, EventKind::BreakerOpened, "demo", "pay", WAIT).await;
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert_eq!(opened[0].key.as_deref(), Some(t.opened_key.as_str()));
    assert!(events_about(js, EventKind::BreakerOpened, "billing", "pay", WAIT).await.is_empty());
    t.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_breaker_key_declared_shared_is_one_breaker_for_every_namespace() {
    let names = Names::default();
    let t = same_key_in_two_namespaces(&["other", "pay"]).await;
    let js = &t.js;
    // Demo's failure opened the one breaker of `pay`: billing's runs are held behind it.
    let held = r#"jetsched_worker_runs_short_circuited_total{action="delay",key="key.=shared.pay"}"#;
    eventually(WAIT, "billing's three runs are delayed too", || async {
        t.worker.metric(held).await == Some(4.0)
    })
    .await;
    assert!(t.up.lock().unwrap().is_empty(), "no billing run reached its handler");
    for id in &t.billing_runs {
        let record = run_record(js, &names, id).await;
        let held = record.as_ref().filter(|r| r.status == RunStatus::Held && r.attempts.is_empty());
        assert!(held.is_some(), "billing's run {id} is held unrun: {record:?}");
    }
    for key in ["key.demo.pay", "key.billing.pay"] {
        assert!(breaker(&t.store, key).await.is_none(), "no breaker of one namespace: {key}");
    }
    let opened = events_about(js, EventKind::BreakerOpened, "=shared", "pay", WAIT).await;
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert_eq!(opened[0].key.as_deref(), Some("key.=shared.pay"));
    t.worker.stop().await;
}
