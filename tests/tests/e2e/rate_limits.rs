//! Rate limits per key, shared by every worker: three worker processes keep a task to 20 calls
//! per second in every whole second (nothing dropped, nothing run twice); `on_limit: skip`
//! ends the excess runs `skipped` with reason `rate_limited` and tells `limit.throttled` once;
//! a retry waits for the limit like a first attempt; a run its open breaker skips takes no
//! start from the limit; a run the limit holds is recorded `held` with its start, and skipped
//! if its task is paused before it comes back; `jetsched limits` lists a rate key with its
//! limit and, while it throttles, the next start.
//!
//! The paced test runs 10 s in CI; `JETSCHED_RATE_SECONDS=30` runs it for 30 s.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jetsched_shared::names::Names;
use jetsched_shared::wire::{EventKind, RateRecord, RunStatus};
use jetsched_tests::fixtures::{dispatch, events_about, open_breaker, spec, wait_run_status};
use jetsched_tests::{App, WithTopology, eventually, server_with_topology};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use crate::breakers::Downstream;
use crate::cli::{jetsched, json_out};
use crate::registry::{Served, served};
use crate::worker_support::{WAIT, config, wait_for_workers, worker_process};

async fn rate_record(js: &async_nats::jetstream::Context, key: &str) -> Option<RateRecord> {
    let store = js.get_key_value(Names::default().rates_bucket()).await.expect("rates bucket");
    let value = store.get(key).await.ok()??;
    Some(serde_json::from_slice(&value).expect("rate record decodes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_worker_processes_hold_a_key_to_20_calls_in_every_second_none_dropped_or_doubled() {
    let seconds: usize =
        std::env::var("JETSCHED_RATE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let WithTopology { server, js, names, client, .. } = server_with_topology(Default::default()).await;
    let downstream = Downstream::failing().await;
    downstream.recover();
    let allow = ["--http-allow", "*=127.0.0.0/8"];
    let _workers: Vec<_> = (1..=3).map(|n| worker_process(&server, &format!("rl-w{n}"), &allow)).collect();
    wait_for_workers(&client, 3).await;
    let task = spec("rl", "export")
        .executor(json!({"kind": "http", "method": "POST", "url": downstream.url()}))
        .labels(&[("customer", "acme")])
        .field("rate_limit", json!({"key": "customer-{labels.customer}", "limit": 20, "period": "1s"}))
        .task();
    // Every run dispatched at once: the limit alone paces them.
    let total = 20 * seconds;
    let base = Utc::now().timestamp_millis();
    let mut runs = Vec::with_capacity(total);
    for n in 0..total {
        runs.push(dispatch(&js, &names, &task, base + n as i64).await);
    }
    for id in &runs {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, Duration::from_secs(seconds as u64 + 30))
            .await;
    }
    let hits = downstream.hits();
    let mut per_run: HashMap<&str, usize> = HashMap::new();
    for hit in &hits {
        *per_run.entry(hit.execution.as_str()).or_default() += 1;
    }
    for id in &runs {
        assert_eq!(per_run.get(id.as_str()), Some(&1), "run {id} called the downstream once");
    }
    assert_eq!(hits.len(), total, "no other call");
    let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
    for hit in &hits {
        *per_second.entry(hit.at.timestamp()).or_default() += 1;
    }
    let first = *per_second.keys().next().expect("calls");
    let last = *per_second.keys().next_back().expect("calls");
    let whole: Vec<(i64, usize)> =
        (first + 1..last).map(|s| (s - first, per_second.get(&s).copied().unwrap_or(0))).collect();
    assert!(whole.len() + 2 >= seconds, "{per_second:?}");
    for (second, calls) in &whole {
        assert!((18..=22).contains(calls), "second {second}: {calls} calls (20 ± 10%): {whole:?}");
    }
    eprintln!("calls in each whole second after the first: {whole:?}");
    // The key's state is in the bucket, namespaced; one throttling episode was told.
    let record = rate_record(&js, "rl.customer-acme").await.expect("the key's state");
    assert!(record.throttled_since_us.is_some(), "{record:?}");
    let told = events_about(&js, EventKind::LimitThrottled, "rl", "customer-acme", WAIT).await;
    assert_eq!(told.len(), 1, "{told:?}");
}

/// Each call a handler got: the execution, the attempt and when.
type Calls = Arc<Mutex<Vec<(String, u32, DateTime<Utc>)>>>;

/// A handler that fails its first `fail` calls (retryable), recording each call's time.
fn recording(fail: usize) -> (Handlers, Calls) {
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let handlers = Handlers::new().register("rec", move |run: RunContext| {
        let seen = seen.clone();
        async move {
            let mut calls = seen.lock().unwrap();
            calls.push((run.execution_id.clone(), run.attempt, Utc::now()));
            if calls.len() <= fail { Outcome::retry("not yet") } else { Outcome::ok() }
        }
    });
    (handlers, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_limit_skip_ends_the_excess_skipped_rate_limited_and_tells_the_episode_once() {
    let WithTopology { server, js, names, .. } = server_with_topology(Default::default()).await;
    let (handlers, calls) = recording(0);
    let _worker = App::worker(config(&server, "rls-w"), handlers).await;
    let task = spec("rls", "sync")
        .handler("rec")
        .field("rate_limit", json!({"limit": 1, "period": "1h", "burst": 2, "on_limit": "skip"}))
        .task();
    let base = Utc::now().timestamp_millis();
    let mut runs = Vec::new();
    for n in 0..5 {
        runs.push(dispatch(&js, &names, &task, base + n).await);
    }
    let mut statuses = HashMap::new();
    for id in &runs {
        let record = eventually(WAIT, "the run ends", || async {
            let record = jetsched_tests::fixtures::run_record(&js, &names, id).await?;
            record.status.is_final().then_some(record)
        })
        .await;
        if record.status == RunStatus::Skipped {
            assert_eq!(record.reason.as_deref(), Some("rate_limited"), "{record:?}");
            assert!(record.attempts.is_empty(), "{record:?}");
        }
        *statuses.entry(record.status).or_insert(0) += 1;
    }
    assert_eq!(statuses.get(&RunStatus::Succeeded), Some(&2), "the burst: {statuses:?}");
    assert_eq!(statuses.get(&RunStatus::Skipped), Some(&3), "{statuses:?}");
    assert_eq!(calls.lock().unwrap().len(), 2);
    let skipped = eventually(WAIT, "three run.skipped", || async {
        let found = events_about(&js, EventKind::RunSkipped, "rls", "sync", WAIT).await;
        (found.len() >= 3).then_some(found)
    })
    .await;
    assert!(skipped.iter().all(|e| e.reason.as_deref() == Some("rate_limited")), "{skipped:?}");
    assert!(skipped.iter().all(|e| e.key.as_deref() == Some("rls.sync")), "{skipped:?}");
    let told = events_about(&js, EventKind::LimitThrottled, "rls", "sync", WAIT).await;
    assert_eq!(told.len(), 1, "one episode: {told:?}");
    // Skipped runs took no start: the state holds the two that ran.
    let record = rate_record(&js, "rls.sync").await.expect("state");
    let now = Utc::now().timestamp_micros();
    assert!(record.tat_us > now + 3_600_000_000 && record.tat_us < now + 7_300_000_000, "{record:?}");
}

/// `jetsched limits` lists a rate-limit key with the limit it runs under; with its burst used
/// up it shows no start free and the earliest next one, and since when it throttles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetsched_limits_lists_a_rate_key_with_its_limit_and_next_start_while_it_throttles() {
    let Served { server, registry: _registry, js, .. } = served(|_| {}).await;
    let (url, names) = (server.url(), Names::default());
    let (handlers, calls) = recording(0);
    let _worker = App::worker(config(&server, "rll-w"), handlers).await;
    let rate = json!({"key": "partner-api", "limit": 1, "period": "1h", "burst": 2, "on_limit": "skip"});
    let task = spec("rll", "sync").handler("rec").field("rate_limit", rate).task();
    let base = Utc::now().timestamp_millis();
    let mut runs = Vec::new();
    for n in 0..3 {
        runs.push(dispatch(&js, &names, &task, base + n).await);
    }
    for id in &runs {
        eventually(WAIT, "the run ends", || async {
            let record = jetsched_tests::fixtures::run_record(&js, &names, id).await?;
            record.status.is_final().then_some(())
        })
        .await;
    }
    assert_eq!(calls.lock().unwrap().len(), 2, "the burst ran, the third was skipped");
    let listed = Utc::now();
    let reply = json_out(&jetsched(&url, &["limits", "--json"]).await);
    let rates = reply["rates"].as_array().expect("rates listed");
    assert_eq!(rates.len(), 1, "{reply}");
    let key = &rates[0];
    assert_eq!(key["key"], "rll.partner-api", "{key}");
    assert_eq!(key["declared"], json!({"limit": 1, "period_ms": 3_600_000, "burst": 2}), "{key}");
    assert_eq!(key["available"], 0, "{key}");
    // Two starts an hour apart in a burst of two: the next one is an hour after the first.
    let next: DateTime<Utc> = key["next_start"].as_str().expect("next start").parse().expect("an instant");
    let hour = chrono::TimeDelta::hours(1);
    assert!(next > listed + hour - chrono::TimeDelta::minutes(1) && next <= listed + hour, "{key}");
    assert!(key["throttled_since"].is_string(), "the third run began an episode: {key}");
    let table = String::from_utf8_lossy(&jetsched(&url, &["limits"]).await.stdout).into_owned();
    let line = table.lines().find(|l| l.starts_with("rll.partner-api")).unwrap_or_else(|| panic!("{table}"));
    let columns: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(columns[1..4], ["1/1h", "2", "0"], "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_for_the_limit_like_a_first_attempt_and_spends_no_attempt_waiting() {
    let WithTopology { server, js, names, .. } = server_with_topology(Default::default()).await;
    let (handlers, calls) = recording(1);
    let _worker = App::worker(config(&server, "rlr-w"), handlers).await;
    // One start per 2 s; the retry's backoff is 100 ms.
    let task = spec("rlr", "push")
        .handler("rec")
        .fast_retry(5)
        .field("rate_limit", json!({"limit": 1, "period": "2s"}))
        .task();
    let base = Utc::now().timestamp_millis();
    let first = dispatch(&js, &names, &task, base).await;
    let second = dispatch(&js, &names, &task, base + 1).await;
    for id in [&first, &second] {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, WAIT).await;
    }
    let mut calls = calls.lock().unwrap().clone();
    calls.sort_by_key(|(_, _, at)| *at);
    assert_eq!(calls.len(), 3, "{calls:?}");
    // The worker takes both deliveries at once: whichever reserves the key first starts first
    // (its call fails and is retried), the other waits.
    let (leader, waiter) =
        if calls[0].0 == first { (first.clone(), second.clone()) } else { (second.clone(), first.clone()) };
    // What the limit guarantees is the reserved starts: the waiting run and the retry each wait
    // for theirs (told as `release_at` by `run.held`), 2 s and 4 s after the first start, whose
    // reservation the key's TAT keeps (three starts: the first + 3 × 2 s).
    let held = eventually(WAIT, "two runs held", || async {
        let found = events_about(&js, EventKind::RunHeld, "rlr", "push", WAIT).await;
        (found.len() >= 2).then_some(found)
    })
    .await;
    let reserved = |id: &str, attempt: u32| {
        let event = held.iter().find(|e| e.execution_id.as_deref() == Some(id) && e.attempt == Some(attempt));
        event.and_then(|e| e.release_at).unwrap_or_else(|| panic!("no run.held for {id}/{attempt}: {held:?}"))
    };
    let tat = rate_record(&js, "rlr.push").await.expect("the key's state").tat_us;
    let first_start = DateTime::<Utc>::from_timestamp_micros(tat - 6_000_000).expect("a time");
    let mut starts = [
        (leader.clone(), 1, first_start),
        (waiter.clone(), 1, reserved(&waiter, 1)),
        (leader.clone(), 2, reserved(&leader, 2)),
    ];
    starts.sort_by_key(|(_, _, at)| *at);
    for pair in starts.windows(2) {
        // Times travel in milliseconds.
        let gap = pair[1].2 - pair[0].2;
        assert!((gap - chrono::Duration::seconds(2)).num_milliseconds().abs() <= 1, "{starts:?}");
    }
    // Each call came at or after its reserved start (a loaded machine only delays it).
    for (id, attempt, at) in &calls {
        let (_, _, start) =
            starts.iter().find(|(i, a, _)| i == id && a == attempt).expect("a reserved start");
        assert!(*at >= *start - chrono::Duration::milliseconds(2), "call {at} before its start {start}");
        assert!(*at < *start + chrono::Duration::seconds(5), "call {at} long after its start {start}");
    }
    // The failed first attempt was retried as attempt 2; the waits spent no attempt.
    let record = wait_run_status(&js, &names, &leader, RunStatus::Succeeded, WAIT).await;
    assert_eq!(record.attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(), vec![1, 2], "{record:?}");
    let record = wait_run_status(&js, &names, &waiter, RunStatus::Succeeded, WAIT).await;
    assert_eq!(record.attempts.len(), 1, "{record:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_its_open_breaker_skips_takes_no_start_from_the_limit() {
    let WithTopology { server, js, names, .. } = server_with_topology(Default::default()).await;
    let (handlers, calls) = recording(0);
    // The breaker is open before the worker starts, so its first look sees it.
    open_breaker(&js, "task.rlb.guarded", Duration::from_secs(3600)).await;
    let _worker = App::worker(config(&server, "rlb-w"), handlers).await;
    let limit = json!({"key": "shared", "limit": 1, "period": "1h", "on_limit": "skip"});
    let guarded = spec("rlb", "guarded")
        .handler("rec")
        .field("breaker", json!({"on_open": "skip"}))
        .field("rate_limit", limit.clone())
        .task();
    let free = spec("rlb", "free").handler("rec").field("rate_limit", limit).task();
    let base = Utc::now().timestamp_millis();
    let blocked = dispatch(&js, &names, &guarded, base).await;
    let record = wait_run_status(&js, &names, &blocked, RunStatus::Skipped, WAIT).await;
    assert_eq!(record.reason.as_deref(), Some("breaker_open"), "{record:?}");
    assert!(rate_record(&js, "rlb.shared").await.is_none(), "no start taken by the breaker's skip");
    // The start is still there for a run of another task sharing the key.
    let ran = dispatch(&js, &names, &free, base + 1).await;
    wait_run_status(&js, &names, &ran, RunStatus::Succeeded, WAIT).await;
    assert_eq!(calls.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_its_limit_holds_is_held_with_its_start_and_skipped_if_the_task_is_paused_meanwhile() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let (handlers, calls) = recording(0);
    let _worker = App::worker(config(&server, "rlp-w"), handlers).await;
    let task = spec("rlp", "sync").handler("rec").field("rate_limit", json!({"limit": 1, "period": "4s"}));
    api.store(&task.json()).await;
    let spec = task.task();
    let base = Utc::now().timestamp_millis();
    let first = dispatch(&js, &names, &spec, base).await;
    wait_run_status(&js, &names, &first, RunStatus::Succeeded, WAIT).await;
    // The next start is 4 s after the first: the run waits in the stream, its record held.
    let second = dispatch(&js, &names, &spec, base + 1).await;
    let held = wait_run_status(&js, &names, &second, RunStatus::Held, WAIT).await;
    let release = held.release_at.unwrap_or_else(|| panic!("no release_at: {held:?}"));
    assert!(release > Utc::now(), "{held:?}");
    let told = eventually(WAIT, "run.held told", || async {
        let found = events_about(&js, EventKind::RunHeld, "rlp", "sync", WAIT).await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(told[0].reason.as_deref(), Some("rate_limited"), "{told:?}");
    assert_eq!(told[0].key.as_deref(), Some("rlp.sync"), "{told:?}");
    // Paused meanwhile: the scheduled run is skipped when it comes back, never executed.
    let paused = api.task("pause", json!({"namespace": "rlp", "id": "sync", "reason": "maintenance"})).await;
    assert_eq!(paused["task"]["paused"], json!(true), "{paused}");
    let record = wait_run_status(&js, &names, &second, RunStatus::Skipped, WAIT).await;
    assert_eq!(record.reason.as_deref(), Some("paused"), "{record:?}");
    assert_eq!(calls.lock().unwrap().len(), 1);
}
