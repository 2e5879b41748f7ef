//! End-to-end tests of concurrency limits against a real nats-server: three worker processes
//! and a downstream that records its concurrent calls, `limit: 2` on a key shared by three tasks
//! firing every 100 ms, one slot held by a long run whose worker is killed with `kill -9`; and
//! in-process, the order of waiting runs across priorities and a retry waiting like a first
//! attempt.
//!
//! `JETSCHED_LIMITS_SECONDS` sets how long the three tasks fire (default 15; 60 for the long
//! variant).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use futures::StreamExt;
use jetsched_shared::names::{Names, concurrency_key};
use jetsched_shared::wire::{EventKind, LimitRecord};
use jetsched_tests::fixtures::{
    dispatch, events_about, execution_id_header, execution_of, noting, publish_dispatch, run_record,
    wait_run_status,
};
use jetsched_tests::{App, WithTopology, eventually, server_with_topology, spec};
use jetsched_worker::Outcome;
use jetsched_worker::runs::RunStatus;
use serde_json::json;

use crate::cli::{jetsched, json_out};
use crate::registry::{Served, served};
use crate::worker_support::{config, wait_for_workers, worker_process};

/// The lease the tests give slots.
const LEASE: Duration = Duration::from_secs(3);

/// Calls in flight at a downstream, and the most seen at once (calls of killed workers, still
/// running at the downstream, set aside).
#[derive(Default)]
struct Downstream {
    in_flight: HashMap<u64, String>,
    abandoned: HashSet<u64>,
    max: usize,
    calls: HashMap<String, u32>,
    next: u64,
}

impl Downstream {
    fn live(&self) -> usize {
        self.in_flight.keys().filter(|call| !self.abandoned.contains(call)).count()
    }

    /// The calls of `execution_id` in flight now are a dead worker's: set aside.
    fn abandon(&mut self, execution_id: &str) {
        let calls: Vec<u64> =
            self.in_flight.iter().filter(|(_, id)| *id == execution_id).map(|(call, _)| *call).collect();
        self.abandoned.extend(calls);
    }
}

/// A responder on `subject` that answers after `delay`, noting the calls in flight.
async fn downstream(
    client: &async_nats::Client,
    subject: &str,
    delay: Duration,
    state: Arc<Mutex<Downstream>>,
) {
    let mut sub = client.subscribe(subject.to_string()).await.expect("subscribe the downstream");
    let client = client.clone();
    tokio::spawn(async move {
        while let Some(request) = sub.next().await {
            let id = execution_id_header(&request);
            let call = {
                let mut s = state.lock().unwrap();
                s.next += 1;
                let call = s.next;
                s.in_flight.insert(call, id.clone());
                *s.calls.entry(id).or_default() += 1;
                s.max = s.max.max(s.live());
                call
            };
            let Some(reply) = request.reply else { continue };
            let (client, state) = (client.clone(), state.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                state.lock().unwrap().in_flight.remove(&call);
                let _ = client.publish(reply, "ok".into()).await;
            });
        }
    });
}

async fn limit_record(kv: &kv::Store, key: &str) -> LimitRecord {
    match kv.get(key).await.expect("read the limits bucket") {
        Some(value) => serde_json::from_slice(&value).expect("a limit record"),
        None => LimitRecord::default(),
    }
}

#[tokio::test]
async fn three_workers_never_exceed_a_keys_limit_and_a_killed_holders_slot_frees_within_the_lease() {
    let seconds: u64 =
        std::env::var("JETSCHED_LIMITS_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let WithTopology { server, client, js, .. } = server_with_topology(Default::default()).await;
    let names = Names::default();
    let limits = js.get_key_value(names.limits_bucket()).await.expect("limits bucket");
    let key = concurrency_key("lim", "downstream");
    let state = Arc::new(Mutex::new(Downstream::default()));
    downstream(&client, "jobs.limited", Duration::from_millis(20), state.clone()).await;
    downstream(&client, "jobs.slow", Duration::from_secs(6), state.clone()).await;
    // ack_wait longer than the lease: the killed worker's slot is freed by its lease, not by
    // the redelivery of its run.
    let lease = format!("{}s", LEASE.as_secs());
    let args = ["--concurrency", "8", "--ack-wait", "10s", "--limit-lease", &lease];
    let mut workers: HashMap<String, _> = ["l-1", "l-2", "l-3"]
        .into_iter()
        .map(|n| (n.to_string(), worker_process(&server, n, &args)))
        .collect();
    wait_for_workers(&client, 3).await;

    let limited = json!({"key": "downstream", "limit": 2});
    let tasks: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|id| {
            spec("lim", id).nats("jobs.limited").field("concurrency", limited.clone()).fast_retry(3).task()
        })
        .collect();
    let slow =
        spec("lim", "slow").nats("jobs.slow").field("concurrency", limited.clone()).timeout("20s").task();
    let slow_id = dispatch(&js, &names, &slow, 0).await;
    let holder = eventually(Duration::from_secs(20), "the slow run holds a slot", || async {
        let record = limit_record(&limits, &key).await;
        record.holders.get(&slow_id).filter(|h| h.seq.is_some()).map(|h| h.worker.clone())
    })
    .await;

    let mut ids = vec![slow_id.clone()];
    let mut waited = 0;
    let mut killed_at = None;
    let mut freed_after = None;
    let started = Instant::now();
    for tick in 0..seconds * 10 {
        for task in &tasks {
            let nominal = 1_000 + tick as i64 * 100;
            ids.push(dispatch(&js, &names, task, nominal).await);
        }
        if tick == 10 {
            // The slow run's worker dies mid-call.
            state.lock().unwrap().abandon(&slow_id);
            workers.get_mut(&holder).expect("the holder").kill9();
            killed_at = Some(Instant::now());
        }
        if let Some(at) = killed_at {
            let record = limit_record(&limits, &key).await;
            waited = waited.max(record.waiters.len());
            let held_by_victim = record.holders.get(&slow_id).is_some_and(|h| h.worker == holder);
            if held_by_victim {
                assert!(
                    at.elapsed() < LEASE + Duration::from_secs(2),
                    "the killed worker still holds its slot {:?} after the kill",
                    at.elapsed()
                );
            } else if freed_after.is_none() {
                freed_after = Some(at.elapsed());
            }
        }
        tokio::time::sleep_until((started + Duration::from_millis(100 * (tick + 1))).into()).await;
    }
    for id in &ids {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, Duration::from_secs(60)).await;
    }
    let freed_after = freed_after.expect("the killed worker's slot was freed");
    assert!(
        freed_after > LEASE - Duration::from_millis(1500),
        "freed by its lease, not earlier: {freed_after:?}"
    );
    {
        let s = state.lock().unwrap();
        println!(
            "{} runs in {seconds} s, at most {} calls at once, up to {waited} runs waiting; \
         the killed worker's slot freed {freed_after:?} after the kill (lease {LEASE:?})",
            ids.len(),
            s.max
        );
        assert!(s.max <= 2, "{} calls at once under a limit of 2", s.max);
        assert_eq!(s.max, 2, "the limit was reached");
        assert!(waited > 0, "runs waited for a slot");
        for id in &ids {
            assert!(s.calls.get(id).is_some_and(|n| *n >= 1), "run {id} called the downstream");
        }
    }
    let record = limit_record(&limits, &key).await;
    assert!(record.holders.is_empty() && record.waiters.is_empty(), "{record:?}");
    let mut saturated = 0;
    for task in ["a", "b", "c", "slow"] {
        saturated +=
            events_about(&js, EventKind::LimitSaturated, "lim", task, Duration::from_secs(2)).await.len();
    }
    assert!(saturated > 0, "limit.saturated told");
}

/// Limit 1: a critical run waiting is not passed by low runs that came before or after it,
/// low runs start in arrival order, and a retry gives its slot back and waits like a first
/// attempt.
#[tokio::test]
async fn waiting_runs_start_by_priority_then_arrival_and_a_retry_waits_for_a_slot() {
    let WithTopology { server, js, .. } = server_with_topology(Default::default()).await;
    let names = Names::default();
    let fail_once = Arc::new(Mutex::new(HashSet::new()));
    let failed = fail_once.clone();
    let (handlers, started) = noting(
        "work",
        |run| (run.task_id.clone(), run.attempt),
        move |run| {
            let first_failure =
                run.task_id == "flaky" && failed.lock().unwrap().insert(run.execution_id.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if first_failure { Outcome::retry("downstream busy") } else { Outcome::ok() }
            }
        },
    );
    let mut worker_config = config(&server, "p-1");
    worker_config.limit_lease = LEASE;
    let _worker = App::worker(worker_config, handlers).await;
    let one = json!({"key": "one", "limit": 1});
    let task = |id: &str, priority: &str| {
        spec("pri", id)
            .handler("work")
            .field("priority", priority)
            .field("concurrency", one.clone())
            .fast_retry(3)
            .task()
    };
    let limits = js.get_key_value(names.limits_bucket()).await.expect("limits bucket");
    let key = concurrency_key("pri", "one");
    let waiting = |n: usize| {
        let (limits, key) = (limits.clone(), key.clone());
        async move {
            eventually(Duration::from_secs(20), &format!("{n} runs wait"), || async {
                (limit_record(&limits, &key).await.waiters.len() == n).then_some(())
            })
            .await
        }
    };
    let flaky = task("flaky", "low");
    let first = dispatch(&js, &names, &flaky, 0).await;
    eventually(Duration::from_secs(20), "the first run started", || async {
        (!started.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    let mut ids = vec![first.clone()];
    for (n, (id, priority)) in
        [("low-1", "low"), ("critical", "critical"), ("low-2", "low")].into_iter().enumerate()
    {
        ids.push(dispatch(&js, &names, &task(id, priority), 0).await);
        waiting(n + 1).await;
    }
    for id in &ids {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, Duration::from_secs(30)).await;
    }
    let order = started.lock().unwrap().clone();
    let tasks: Vec<&str> = order.iter().map(|(task, _)| task.as_str()).collect();
    // The flaky run's retry waited behind the runs already waiting.
    assert_eq!(tasks, ["flaky", "critical", "low-1", "low-2", "flaky"], "{order:?}");
    assert_eq!(order[4].1, 2, "the retry is the second attempt: waiting spent none");
    let held = run_record(&js, &names, &ids[2]).await.expect("record");
    assert_eq!(held.status, RunStatus::Succeeded);
    let record = limit_record(&limits, &key).await;
    assert!(record.holders.is_empty() && record.waiters.is_empty(), "{record:?}");
}

/// `jetsched limits` lists a full key with its waiting runs; `limits set` raises its limit and
/// the waiting runs start at once; `limits clear` gives the specs' limit back; a spec whose key
/// names a label it does not have is refused at put, naming `concurrency.key`.
#[tokio::test]
async fn operators_see_a_key_and_override_its_limit_from_the_cli() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let url = server.url();
    let names = Names::default();
    let refused = api
        .put(
            &spec("ops", "bad")
                .handler("slow")
                .field("concurrency", json!({"key": "c-{labels.customer}", "limit": 1}))
                .json(),
        )
        .await;
    assert_eq!(refused["error"]["field"], "concurrency.key", "{refused}");

    let (handlers, started) = noting(
        "slow",
        |run| run.execution_id.clone(),
        |_| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Outcome::ok()
        },
    );
    let _worker = App::worker(config(&server, "o-1"), handlers).await;
    let task = spec("ops", "report")
        .handler("slow")
        .field("concurrency", json!({"key": "reports", "limit": 1}))
        .task();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(dispatch(&js, &names, &task, n).await);
    }
    let listed = eventually(Duration::from_secs(20), "one run holds the key, two wait", || async {
        let reply = json_out(&jetsched(&url, &["limits", "--json"]).await);
        let key = reply["limits"].as_array()?.first()?.clone();
        (key["in_use"] == 1 && key["waiting"] == 2).then_some(key)
    })
    .await;
    assert_eq!(
        (listed["key"].as_str(), listed["limit"].as_u64()),
        (Some("ops.reports"), Some(1)),
        "{listed}"
    );
    assert!(listed["oldest_wait"].is_string(), "{listed}");
    let table = String::from_utf8_lossy(&jetsched(&url, &["limits"]).await.stdout).into_owned();
    assert!(table.starts_with("KEY") && table.contains("ops.reports"), "{table}");

    let set = jetsched(&url, &["limits", "set", "ops.reports", "3"]).await;
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "limit of ops.reports set to 3 (declared 1)");
    // The two waiting runs start well before the first one ends.
    eventually(Duration::from_secs(2), "the waiting runs start after the raise", || async {
        (started.lock().unwrap().len() == 3).then_some(())
    })
    .await;
    let cleared = json_out(&jetsched(&url, &["limits", "clear", "ops.reports", "--json"]).await);
    assert_eq!((cleared["limit"].as_u64(), cleared.get("override")), (Some(1), None), "{cleared}");
    let bad = jetsched(&url, &["limits", "set", "nokey", "0"]).await;
    assert!(!bad.status.success());
    for id in &ids {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, Duration::from_secs(20)).await;
    }
}

/// A run handed a slot whose task was paused meanwhile is skipped and gives the slot back at
/// once: the next waiting run starts when the holder ends, not a lease later.
#[tokio::test]
async fn a_paused_tasks_waiting_run_is_skipped_and_its_slot_goes_to_the_next_at_once() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let (handlers, started) = noting(
        "hold",
        |run| run.execution_id.clone(),
        |_| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Outcome::ok()
        },
    );
    let _worker = App::worker(config(&server, "z-1"), handlers).await;
    let shared = json!({"key": "shared", "limit": 1});
    let holder = spec("pz", "holder").handler("hold").field("concurrency", shared.clone());
    let paused = spec("pz", "paused").handler("hold").field("concurrency", shared);
    api.store(&holder.json()).await;
    api.store(&paused.json()).await;
    let first = dispatch(&js, &names, &holder.task(), 0).await;
    eventually(Duration::from_secs(20), "the holder runs", || async {
        (!started.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    let waiting = dispatch(&js, &names, &paused.task(), 0).await;
    let limits = js.get_key_value(names.limits_bucket()).await.expect("limits bucket");
    let key = concurrency_key("pz", "shared");
    eventually(Duration::from_secs(20), "the paused task's run waits", || async {
        (limit_record(&limits, &key).await.waiters.len() == 1).then_some(())
    })
    .await;
    let next = dispatch(&js, &names, &holder.task(), 1).await;
    let reply = api.task("pause", json!({"namespace": "pz", "id": "paused"})).await;
    assert_eq!(reply["task"]["paused"], json!(true), "{reply}");
    let skipped = wait_run_status(&js, &names, &waiting, RunStatus::Skipped, Duration::from_secs(20)).await;
    assert_eq!(skipped.reason.as_deref(), Some("paused"));
    // The default lease is 30 s: the next run starts well within it.
    wait_run_status(&js, &names, &first, RunStatus::Succeeded, Duration::from_secs(20)).await;
    wait_run_status(&js, &names, &next, RunStatus::Succeeded, Duration::from_secs(10)).await;
    assert_eq!(started.lock().unwrap().len(), 2, "the paused task's run never ran");
}

#[tokio::test]
async fn a_workers_runs_arriving_together_on_one_key_share_its_writes() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let (handlers, started) = noting(
        "hold",
        |run| run.execution_id.clone(),
        |_| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Outcome::ok()
        },
    );
    let _worker = App::worker(config(&server, "g-1"), handlers).await;
    let task =
        spec("pg", "many").handler("hold").field("concurrency", json!({"key": "many", "limit": 10000}));
    api.store(&task.json()).await;
    let runs = 96;
    let mut executions = Vec::new();
    for nominal in 0..runs {
        executions.push(dispatch(&js, &names, &task.task(), nominal * 1000).await);
    }
    for execution in &executions {
        wait_run_status(&js, &names, execution, RunStatus::Succeeded, Duration::from_secs(60)).await;
    }
    assert_eq!(started.lock().unwrap().len(), executions.len(), "every run ran once");
    let limits = js.get_key_value(names.limits_bucket()).await.expect("limits bucket");
    let key = concurrency_key("pg", "many");
    let entry = limits.entry(&key).await.expect("read the limits bucket").expect("the key's entry");
    let record: LimitRecord = serde_json::from_slice(&entry.value).expect("a limit record");
    assert!(record.holders.is_empty() && record.waiters.is_empty(), "every slot freed: {record:?}");
    // The key is the bucket's only one: its revision counts every write. One write per take and
    // one per free would be two per run; runs taking and freeing together share writes.
    let writes = entry.revision;
    assert!(
        writes < 2 * executions.len() as u64 * 3 / 4,
        "{writes} writes for {} takes and frees",
        2 * executions.len()
    );
}

/// Runs at once under a handler, and the most seen at once.
#[derive(Default)]
struct Gauge {
    now: usize,
    max: usize,
}

/// When each run started, by execution id.
type Starts = Arc<Mutex<Vec<(String, Instant)>>>;

/// A handler `name` that notes when each run started, counts the runs at once in `gauge`, and
/// takes `delay`.
fn gauged(name: &str, delay: Duration, gauge: Arc<Mutex<Gauge>>) -> (jetsched_worker::Handlers, Starts) {
    noting(
        name,
        |run| (run.execution_id.clone(), Instant::now()),
        move |_| {
            let gauge = gauge.clone();
            async move {
                {
                    let mut g = gauge.lock().unwrap();
                    g.now += 1;
                    g.max = g.max.max(g.now);
                }
                tokio::time::sleep(delay).await;
                gauge.lock().unwrap().now -= 1;
                Outcome::ok()
            }
        },
    )
}

/// Publishes the fires `0..runs` of `task` together; returns their execution ids.
async fn burst(
    js: &async_nats::jetstream::Context,
    task: &jetsched_shared::spec::TaskSpec,
    runs: i64,
) -> Vec<String> {
    let names = Names::default();
    let mut acks = Vec::new();
    for nominal in 0..runs {
        acks.push(publish_dispatch(js, &names, task, nominal * 1000).await);
    }
    for ack in acks {
        ack.await.expect("dispatch stored");
    }
    (0..runs).map(|nominal| execution_of(task, nominal * 1000)).collect()
}

/// Two workers' runs of a key whose limit is never reached take their slots from blocks taken
/// ahead: far fewer writes of the key than runs, every run ran once, and soon after the last run
/// every block is given back (no holder, no block, no waiter left).
#[tokio::test]
async fn workers_under_a_limit_never_reached_take_blocks_ahead_and_give_every_slot_back() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let gauge = Arc::new(Mutex::new(Gauge::default()));
    let (first, started_first) = gauged("hold", Duration::from_millis(40), gauge.clone());
    let (second, started_second) = gauged("hold", Duration::from_millis(40), gauge.clone());
    let _workers =
        (App::worker(config(&server, "b-1"), first).await, App::worker(config(&server, "b-2"), second).await);
    let task =
        spec("pb", "wide").handler("hold").field("concurrency", json!({"key": "wide", "limit": 10000}));
    api.store(&task.json()).await;
    let executions = burst(&js, &task.task(), 400).await;
    for execution in &executions {
        wait_run_status(&js, &names, execution, RunStatus::Succeeded, Duration::from_secs(60)).await;
    }
    let ran = started_first.lock().unwrap().len() + started_second.lock().unwrap().len();
    assert_eq!(ran, executions.len(), "every run ran once");
    let limits = js.get_key_value(names.limits_bucket()).await.expect("limits bucket");
    let key = concurrency_key("pb", "wide");
    let record = eventually(Duration::from_secs(5), "every block given back", || async {
        let record = limit_record(&limits, &key).await;
        (record.holders.is_empty() && record.blocks.is_empty() && record.waiters.is_empty()).then_some(record)
    })
    .await;
    assert_eq!(record.in_use(chrono::Utc::now()), 0);
    // The key is the bucket's only one: its revision counts every write, the blocks' given
    // back included. Without blocks each run would cost a take and a free, grouped per write.
    let entry = limits.entry(&key).await.expect("read the limits bucket").expect("the key's entry");
    assert!(
        entry.revision < executions.len() as u64 / 4,
        "{} writes for {} runs",
        entry.revision,
        executions.len()
    );
}

/// A worker whose runs keep a key's every slot in its block gives them back as they end once a
/// run of another worker waits: that run starts promptly, long before the first worker's stream
/// of runs ends, and the two never run more than the limit at once.
#[tokio::test]
async fn a_run_waiting_on_a_key_makes_a_block_holder_give_its_slots_back_promptly() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let gauge = Arc::new(Mutex::new(Gauge::default()));
    let (busy, busy_started) = gauged("busy", Duration::from_millis(50), gauge.clone());
    let (other, other_started) = gauged("other", Duration::from_millis(50), gauge.clone());
    // Its runs never outnumber the limit: they never wait, so its block can take every slot.
    let mut busy_config = config(&server, "k-busy");
    busy_config.queues = vec!["busy".into()];
    busy_config.concurrency = 8;
    let mut other_config = config(&server, "k-other");
    other_config.queues = vec!["other".into()];
    let _workers = (App::worker(busy_config, busy).await, App::worker(other_config, other).await);
    let limit = json!({"key": "narrow", "limit": 8});
    let stream = spec("pk", "stream").queue("busy").handler("busy").field("concurrency", limit.clone());
    let single = spec("pk", "single").queue("other").handler("other").field("concurrency", limit);
    api.store(&stream.json()).await;
    api.store(&single.json()).await;
    let streamed = burst(&js, &stream.task(), 600).await;
    let limits = js.get_key_value(names.limits_bucket()).await.expect("limits bucket");
    let key = concurrency_key("pk", "narrow");
    // The busy worker's runs fill the key from its block.
    eventually(Duration::from_secs(20), "the busy worker holds a block", || async {
        let record = limit_record(&limits, &key).await;
        (busy_started.lock().unwrap().len() >= 40 && record.blocks.contains_key("k-busy")).then_some(())
    })
    .await;
    let asked = Instant::now();
    let waiting = dispatch(&js, &names, &single.task(), 0).await;
    wait_run_status(&js, &names, &waiting, RunStatus::Succeeded, Duration::from_secs(20)).await;
    let started = other_started.lock().unwrap()[0].1;
    let waited = started - asked;
    let still = streamed.len() - busy_started.lock().unwrap().iter().filter(|(_, at)| *at <= started).count();
    assert!(waited < Duration::from_millis(1500), "the waiting run started after {waited:?}");
    assert!(still > 0, "the busy worker's stream had ended before the waiting run started");
    // It found the key full: it waited, parked, until the busy worker gave a slot back.
    let held = events_about(&js, EventKind::RunHeld, "pk", "single", Duration::from_secs(2)).await;
    assert_eq!(held.len(), 1, "the run waited for a slot: {held:?}");
    for execution in &streamed {
        wait_run_status(&js, &names, execution, RunStatus::Succeeded, Duration::from_secs(60)).await;
    }
    assert!(gauge.lock().unwrap().max <= 8, "{} runs at once", gauge.lock().unwrap().max);
    eventually(Duration::from_secs(5), "every slot given back", || async {
        let record = limit_record(&limits, &key).await;
        (record.holders.is_empty() && record.blocks.is_empty() && record.waiters.is_empty()).then_some(())
    })
    .await;
}
