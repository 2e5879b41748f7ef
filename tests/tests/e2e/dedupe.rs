//! De-duplication and debounce of triggers and submissions, end to end on a real nats-server
//! with real registries and a worker: the same `dedupe_key` from two clients at once gives one
//! execution and one run (and a new run once its time to live is over); a claim left by a
//! registry that died between claim and dispatch is carried out once; 200 triggers within 2 s
//! of a debounced task give one run with the last payload; `max_wait` bounds a never-ending
//! stream of triggers; an intake submission repeating a key applies nothing; bad input is
//! refused with every problem named.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use chrono::{DateTime, Utc};
use futures::future::join_all;
use jetsched_shared::names::{DedupeScope, Names, dedupe_key};
use jetsched_shared::wire::{DedupeClaim, EventKind, HDR_DEDUPE_KEY, HDR_DEDUPE_TTL};
use jetsched_tests::fixtures::{events_about, noting, spec};
use jetsched_tests::{Api, App, always, eventually};
use jetsched_worker::{Outcome, RunContext};
use serde_json::{Value, json};

use crate::cli::jetsched;
use crate::registry::{Served, config as registry_config, served};
use crate::worker_support::{WAIT, config};

/// How long reading the events stream may take.
const EVENTS: Duration = Duration::from_secs(5);

/// What the `note` handler saw of one run: its execution, its payload, when it started.
type Seen = Arc<Mutex<Vec<(String, Option<Value>, DateTime<Utc>)>>>;

/// A worker on `server` whose `note` handler records every run.
async fn noting_worker(served: &Served) -> (App, Seen) {
    let (handlers, seen) = noting(
        "note",
        |run: &RunContext| (run.execution_id.clone(), run.payload.clone(), Utc::now()),
        |_| async { Outcome::ok() },
    );
    (App::worker(config(&served.server, "dedupe-w"), handlers).await, seen)
}

fn runs(seen: &Seen) -> Vec<(String, Option<Value>, DateTime<Utc>)> {
    seen.lock().expect("notes").clone()
}

fn trigger_body(id: &str, more: Value) -> Value {
    let mut body = json!({"namespace": "flow", "id": id});
    body.as_object_mut().unwrap().extend(more.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_dedupe_key_from_two_clients_at_once_gives_one_execution_and_one_run() {
    let served = served(|_| {}).await;
    // A second registry: the requests spread over both, so the claim races across processes.
    let _second = App::registry(registry_config(&served.server.url(), 1)).await;
    let task = spec("flow", "charge").handler("note");
    served.api.store(&task.json()).await;
    let (_worker, seen) = noting_worker(&served).await;
    let other = served.server.client().await;
    let apis = [served.api.clone(), Api::new(&other)];

    let asks = (0..20).map(|n| {
        let api = apis[n % 2].clone();
        let body = trigger_body(
            "charge",
            json!({"dedupe_key": "invoice:2026/42", "dedupe_ttl": "3s", "payload": {"n": n}}),
        );
        async move { api.task("trigger", body).await }
    });
    let replies = join_all(asks).await;
    let executions: Vec<&str> =
        replies.iter().map(|r| r["execution_id"].as_str().unwrap_or_else(|| panic!("{r}"))).collect();
    assert!(executions.iter().all(|e| *e == executions[0]), "one execution id: {replies:?}");
    let first = replies.iter().filter(|r| r.get("deduplicated").is_none()).count();
    assert_eq!(first, 1, "one trigger is the first, every other is deduplicated: {replies:?}");

    eventually(WAIT, "the run", || async { runs(&seen).len() == 1 }).await;
    always(Duration::from_secs(2), "no second run", || async { runs(&seen).len() == 1 }).await;
    assert_eq!(runs(&seen)[0].0, executions[0]);
    let told = events_about(&served.js, EventKind::TriggerDeduplicated, "flow", "charge", EVENTS).await;
    assert_eq!(told.len(), 19, "each deduplicated trigger is told");

    // Once its time to live is over, the key runs again.
    tokio::time::sleep(Duration::from_secs(3)).await; // the key's TTL passing is the point
    let again = served
        .api
        .task(
            "trigger",
            trigger_body("charge", json!({"dedupe_key": "invoice:2026/42", "payload": {"n": 99}})),
        )
        .await;
    assert!(again.get("deduplicated").is_none(), "{again}");
    assert_ne!(again["execution_id"], executions[0]);
    eventually(WAIT, "the second run", || async { runs(&seen).len() == 2 }).await;
    assert_eq!(runs(&seen)[1].1, Some(json!({"n": 99})), "the trigger's payload is the run's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_by_a_registry_that_died_before_dispatch_is_carried_out_once() {
    let served = served(|_| {}).await;
    let task = spec("flow", "crashed").handler("note");
    served.api.store(&task.json()).await;
    let (_worker, seen) = noting_worker(&served).await;
    // What a registry leaves when it dies between claiming the key and dispatching.
    let claim = DedupeClaim {
        at: Utc::now(),
        ttl_s: 600,
        execution_id: Some("0190c0de-0000-7000-8000-00000000c1a1".into()),
        done: false,
        payload: Some(json!({"invoice": 42})),
        priority: None,
        intake_sequence: None,
    };
    let names = Names::default();
    let key = dedupe_key("flow", "crashed", DedupeScope::Trigger, "inv-42");
    let mut headers = HeaderMap::new();
    headers.insert("Nats-TTL", "600");
    headers.insert("Nats-Expected-Last-Subject-Sequence", "0");
    served
        .js
        .publish_with_headers(
            Names::kv_subject(&names.dedupe_bucket(), &key),
            headers,
            serde_json::to_vec(&claim).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .expect("claim stored");

    // The client retries, twice at once: the claim's run is dispatched, once.
    let retry = || {
        served.api.task(
            "trigger",
            trigger_body("crashed", json!({"dedupe_key": "inv-42", "payload": {"other": 1}})),
        )
    };
    let (a, b) = tokio::join!(retry(), retry());
    for reply in [&a, &b] {
        assert_eq!(reply["execution_id"], "0190c0de-0000-7000-8000-00000000c1a1", "{reply}");
        assert_eq!(reply["deduplicated"], true, "{reply}");
    }
    eventually(WAIT, "the claimed run", || async { runs(&seen).len() == 1 }).await;
    always(Duration::from_secs(2), "no second run", || async { runs(&seen).len() == 1 }).await;
    let (execution, payload, _) = runs(&seen).remove(0);
    assert_eq!(execution, "0190c0de-0000-7000-8000-00000000c1a1");
    assert_eq!(payload, Some(json!({"invoice": 42})), "the claim's payload, not the retry's");
    // Now done: one more trigger only answers.
    let third = retry().await;
    assert_eq!(third["deduplicated"], true, "{third}");
    always(Duration::from_secs(1), "still one run", || async { runs(&seen).len() == 1 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_triggers_within_two_seconds_of_a_debounced_task_give_one_run_with_the_last_payload() {
    let served = served(|_| {}).await;
    let task =
        spec("flow", "reindex").handler("note").field("debounce", json!({"period": "2s", "max_wait": "1m"}));
    served.api.store(&task.json()).await;
    let (_worker, seen) = noting_worker(&served).await;

    let start = tokio::time::Instant::now();
    let mut executions = Vec::new();
    let mut last = None;
    for n in 0..200 {
        let reply =
            served.api.task("trigger", trigger_body("reindex", json!({"payload": {"edit": n}}))).await;
        assert_eq!(reply["debounced"], true, "{reply}");
        assert_eq!(reply["triggers"], n + 1, "{reply}");
        executions.push(reply["execution_id"].as_str().expect("execution id").to_string());
        last = Some((Utc::now(), reply));
    }
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(2), "200 triggers took {elapsed:?}");
    assert!(executions.iter().all(|e| *e == executions[0]), "one window, one execution");
    let (last_at, last_reply) = last.expect("triggered");
    let starts_at: DateTime<Utc> = last_reply["nominal_time"].as_str().unwrap().parse().unwrap();
    assert!(starts_at >= last_at + chrono::TimeDelta::milliseconds(1900), "a period after the last trigger");
    assert!(runs(&seen).is_empty(), "nothing runs while triggers keep coming");

    eventually(WAIT, "the debounced run", || async { runs(&seen).len() == 1 }).await;
    let (execution, payload, ran_at) = runs(&seen).remove(0);
    assert_eq!(execution, executions[0]);
    assert_eq!(payload, Some(json!({"edit": 199})), "the last trigger's payload");
    let late = (ran_at - starts_at).num_milliseconds();
    println!("debounced run started {late} ms after its planned start");
    assert!(late > -100 && late < 2000, "started {late} ms after its planned start");
    always(Duration::from_secs(3), "a replaced window never fires", || async { runs(&seen).len() == 1 })
        .await;
    let debounced = events_about(&served.js, EventKind::TriggerDebounced, "flow", "reindex", EVENTS).await;
    let told: Vec<u64> = debounced.iter().filter_map(|e| e.triggers).collect();
    assert_eq!(told, [1, 2, 4, 8, 16, 32, 64, 128], "told at powers of two, not 200 times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_wait_bounds_a_never_ending_stream_of_triggers() {
    let served = served(|_| {}).await;
    let task =
        spec("flow", "stream").handler("note").field("debounce", json!({"period": "1s", "max_wait": "3s"}));
    served.api.store(&task.json()).await;
    let (_worker, seen) = noting_worker(&served).await;

    let first = served.api.task("trigger", trigger_body("stream", json!({"payload": {"n": 0}}))).await;
    let first_at: DateTime<Utc> = Utc::now();
    let window = first["execution_id"].as_str().expect("execution id").to_string();
    // A trigger every 300 ms (less than the period) for 6 s: without max_wait nothing would run.
    let mut n = 1;
    while Utc::now() < first_at + chrono::TimeDelta::seconds(6) {
        tokio::time::sleep(Duration::from_millis(300)).await; // the triggers' pace is the point
        served.api.task("trigger", trigger_body("stream", json!({"payload": {"n": n}}))).await;
        n += 1;
    }
    let seen_now = runs(&seen);
    assert!(!seen_now.is_empty(), "max_wait started a run while triggers kept coming");
    let (execution, _, ran_at) = &seen_now[0];
    assert_eq!(*execution, window, "the first window's run");
    let after = (*ran_at - first_at).num_milliseconds();
    println!("first run started {after} ms after the first trigger (max_wait 3000 ms)");
    assert!(after <= 3000 + 1000, "the run started {after} ms after the first trigger");
    assert!(seen_now.len() >= 2 || n > 0, "triggers after the run open a new window");
    eventually(WAIT, "the last window's run", || async { runs(&seen).len() >= 2 }).await;
    let all = runs(&seen);
    assert_ne!(all[0].0, all[1].0, "each window is its own execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_submission_repeating_a_dedupe_key_applies_nothing() {
    let served = served(|_| {}).await;
    let names = Names::default();
    let submit = |labels: Value, key: &'static str| {
        let mut body = spec("flow", "submitted").labels(&[]).json();
        body["labels"] = labels;
        let mut headers = HeaderMap::new();
        headers.insert(HDR_DEDUPE_KEY, key);
        headers.insert(HDR_DEDUPE_TTL, "10m");
        let js = served.js.clone();
        let subject = names.submit_subject("flow", "submitted");
        async move {
            js.publish_with_headers(subject, headers, serde_json::to_vec(&body).unwrap().into())
                .await
                .unwrap()
                .await
                .expect("submission stored");
        }
    };
    submit(json!({"v": "first"}), "deploy-7").await;
    let got = || served.api.task("get", json!({"namespace": "flow", "id": "submitted"}));
    eventually(WAIT, "the first submission applied", || async {
        got().await["task"]["labels"]["v"] == "first"
    })
    .await;
    submit(json!({"v": "second"}), "deploy-7").await;
    eventually(WAIT, "the repeat told", || async {
        !events_about(&served.js, EventKind::TriggerDeduplicated, "flow", "submitted", EVENTS)
            .await
            .is_empty()
    })
    .await;
    assert_eq!(got().await["task"]["labels"]["v"], "first", "the repeat applied nothing");
    submit(json!({"v": "third"}), "deploy-8").await;
    eventually(WAIT, "another key applied", || async { got().await["task"]["labels"]["v"] == "third" }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_triggers_and_debounce_specs_are_refused_with_every_problem_named() {
    let served = served(|_| {}).await;
    served.api.store(&spec("flow", "bad").json()).await;
    let huge = "x".repeat(70 * 1024);
    let reply = served
        .api
        .task(
            "trigger",
            trigger_body(
                "bad",
                json!({"dedupe_key": "k".repeat(300), "dedupe_ttl": "8d", "payload": {"blob": huge}}),
            ),
        )
        .await;
    let fields: Vec<&str> = reply["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|e| e["field"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(fields, ["payload", "dedupe_key", "dedupe_ttl"], "{reply}");
    let codes: Vec<&str> =
        reply["errors"].as_array().unwrap().iter().map(|e| e["code"].as_str().unwrap()).collect();
    assert_eq!(codes, ["payload_too_large", "invalid_value", "invalid_duration"]);
    let orphan = served.api.task("trigger", trigger_body("bad", json!({"dedupe_ttl": "1m"}))).await;
    assert_eq!(orphan["error"]["field"], "dedupe_ttl", "{orphan}");

    let bad =
        spec("flow", "bad-debounce").field("debounce", json!({"period": "10s", "max_wait": "5s"})).json();
    let reply = served.api.put(&bad).await;
    assert_eq!(reply["error"]["field"], "debounce.max_wait", "{reply}");
    let bad = spec("flow", "bad-debounce").field("debounce", json!({"max_wait": "5s", "every": "1s"})).json();
    let reply = served.api.put(&bad).await;
    let fields: Vec<&str> = reply["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|e| e["field"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(fields, ["debounce.every", "debounce.period"], "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_triggers_with_a_payload_file_and_a_dedupe_key_and_says_what_happened() {
    let served = served(|_| {}).await;
    served.api.store(&spec("flow", "cli").handler("note").json()).await;
    let (_worker, seen) = noting_worker(&served).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("payload.json");
    std::fs::write(&file, r#"{"invoice": 7}"#).expect("payload written");
    let payload = format!("@{}", file.display());
    let url = served.server.url();
    let args =
        ["trigger", "flow/cli", "--payload", payload.as_str(), "--dedupe-key", "inv 7", "--dedupe-ttl", "1m"];
    let first = jetsched(&url, &args).await;
    let said = String::from_utf8_lossy(&first.stdout).to_string();
    assert!(first.status.success() && said.contains("flow/cli triggered: execution "), "{said}");
    let again = jetsched(&url, &args).await;
    let said_again = String::from_utf8_lossy(&again.stdout).to_string();
    let execution = said.trim().rsplit(' ').next().expect("an execution id").to_string();
    assert!(said_again.contains("not triggered again") && said_again.contains(&execution), "{said_again}");
    eventually(WAIT, "the run", || async { runs(&seen).len() == 1 }).await;
    assert_eq!(runs(&seen)[0].1, Some(json!({"invoice": 7})));
    let bad = jetsched(&url, &["trigger", "flow/cli", "--dedupe-key", "k", "--dedupe-ttl", "8d"]).await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("dedupe_ttl"), "{bad:?}");
}
