//! End-to-end tests of the worker's retries against a real nats-server: backoff with jitter
//! between attempts, redeliveries of a run that already succeeded recognised (eager and lazy
//! run records), and both on a three-node cluster with replicated streams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use jetsched_shared::names::Names;
use jetsched_tests::fixtures::{dead_letters, dispatch, noting, wait_run_status};
use jetsched_tests::{App, NatsServer, eventually, spec};
use jetsched_worker::runs::{AttemptOutcome, RunStatus};
use jetsched_worker::{Config, Handlers, Outcome, RunContext};
use serde_json::json;

use crate::worker_support::{WAIT, config, dispatch_pending, outcomes, redispatch};

#[tokio::test]
async fn worker_retries_with_backoff_and_jitter_then_succeeds() {
    let server = NatsServer::start().await;
    let (handlers, calls) = noting(
        "flaky",
        |run| (run.attempt, Instant::now()),
        |run| async move {
            if run.attempt <= 2 {
                Outcome::retry(format!("attempt {} fails", run.attempt))
            } else {
                Outcome::ok()
            }
        },
    );
    let worker = App::worker(config(&server, "w-retry"), handlers).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let retry = json!({"max_attempts": 5, "initial": "300ms", "multiplier": 2.0, "max_interval": "10s", "jitter": 0.3});
    let task = spec("wk", "flaky").handler("flaky").retry(retry).timeout("5s").task();
    let id = dispatch(&js, &names, &task, 1_000).await;

    let record = wait_run_status(&js, &names, &id, RunStatus::Succeeded, WAIT).await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2, 3], "three attempts");
    assert_eq!(
        outcomes(&record),
        [AttemptOutcome::Failed, AttemptOutcome::Failed, AttemptOutcome::Succeeded]
    );
    assert_eq!(record.attempt, 3);
    assert_eq!(record.error.as_deref(), Some("attempt 2 fails"));
    // Delays within the jitter bounds: 300ms ±30% then 600ms ±30%, measured from the end of
    // the failed attempt to the start of the next (worker clocks, ms precision), with slack
    // for the record write, the Nak and the redelivery.
    for (n, (min, max)) in [(1usize, (210i64, 390i64)), (2, (420, 780))] {
        let ended = record.attempts[n - 1].finished.expect("finished");
        let delay = (record.attempts[n].started - ended).num_milliseconds();
        assert!(
            delay >= min - 2 && delay <= max + 400,
            "delay before attempt {}: {delay} ms not within [{min}, {max}] ms",
            n + 1
        );
        // The handler saw the same spacing.
        assert!(calls[n].1 - calls[n - 1].1 >= Duration::from_millis((min - 2) as u64));
    }
    assert_eq!(dispatch_pending(&js).await, 0, "acked: gone from the work queue");
    assert!(dead_letters(&js, &names).await.is_empty());
    let metrics = worker.metrics().await;
    for line in [
        r#"jetsched_worker_runs_total{outcome="retried",priority="normal",queue="default"} 2"#,
        r#"jetsched_worker_runs_total{outcome="succeeded",priority="normal",queue="default"} 1"#,
        r#"jetsched_worker_retries_total{queue="default"} 2"#,
        "jetsched_worker_runs_in_flight 0",
        r#"jetsched_queue_depth{queue="default"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(metrics.contains("jetsched_worker_run_duration_seconds_count"), "{metrics}");
    worker.stop().await;
}

#[tokio::test]
async fn a_redelivered_succeeded_run_is_acked_without_running_with_eager_and_lazy_records() {
    let server = NatsServer::start().await;
    let executions: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handlers = |executions: Arc<Mutex<HashMap<String, u32>>>| {
        Handlers::new().register("count", move |run: RunContext| {
            let executions = executions.clone();
            async move {
                let mut executions = executions.lock().unwrap();
                let n = executions.entry(run.execution_id).or_default();
                *n += 1;
                // The first attempt of every run fails once.
                if run.attempt == 1 { Outcome::retry("first attempt fails") } else { Outcome::ok() }
            }
        })
    };
    let mut eager = config(&server, "w-eager");
    eager.queues = vec!["eager".into()];
    let eager = App::worker(eager, handlers(executions.clone())).await;
    let mut lazy = config(&server, "w-lazy");
    lazy.queues = vec!["lazy".into()];
    lazy.run_records = jetsched_worker::RunRecords::Lazy;
    let lazy = App::worker(lazy, handlers(executions.clone())).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();

    for queue in ["eager", "lazy"] {
        let task = spec("wk", &format!("dup-{queue}"))
            .queue(queue)
            .handler("count")
            .fast_retry(3)
            .timeout("5s")
            .task();
        let id = dispatch(&js, &names, &task, 7).await;
        let r = wait_run_status(&js, &names, &id, RunStatus::Succeeded, WAIT).await;
        assert_eq!(outcomes(&r), [AttemptOutcome::Failed, AttemptOutcome::Succeeded], "{queue}: {r:?}");
        redispatch(&js, &task, 7).await;
        eventually(WAIT, "the duplicate is acked", || async { dispatch_pending(&js).await == 0 }).await;
        assert_eq!(executions.lock().unwrap().get(&id), Some(&2), "{queue}: two attempts, no third");
    }
    for worker in [&eager, &lazy] {
        let metrics = worker.metrics().await;
        assert!(metrics.contains(r#"outcome="duplicate""#), "{metrics}");
    }
    eager.stop().await;
    lazy.stop().await;
}

#[tokio::test]
async fn workers_on_a_three_node_cluster_with_r3_retry_and_recognise_duplicates() {
    let cluster = jetsched_tests::NatsCluster::start().await;
    let executions: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handlers = |executions: Arc<Mutex<HashMap<String, u32>>>| {
        Handlers::new().register("once-flaky", move |run: RunContext| {
            let executions = executions.clone();
            async move {
                *executions.lock().unwrap().entry(run.execution_id).or_default() += 1;
                if run.attempt == 1 { Outcome::retry("first attempt fails") } else { Outcome::ok() }
            }
        })
    };
    let mut workers = Vec::new();
    for n in 0..2 {
        let mut config = Config::for_tests(&cluster.urls(), &format!("r3-{n}"));
        config.shared.topology.replicas = 3;
        config.pull_expires = Duration::from_millis(500);
        workers.push(App::worker(config, handlers(executions.clone())).await);
    }
    let js = jetstream::new(cluster.client().await);
    let names = Names::default();
    let task = spec("wk", "r3").handler("once-flaky").fast_retry(3).timeout("5s").task();
    let mut ids = Vec::new();
    for n in 0..40 {
        ids.push(dispatch(&js, &names, &task, n).await);
    }
    for id in &ids {
        let r = wait_run_status(&js, &names, id, RunStatus::Succeeded, Duration::from_secs(30)).await;
        assert_eq!(outcomes(&r), [AttemptOutcome::Failed, AttemptOutcome::Succeeded], "{r:?}");
    }
    // Replicated buckets report lost compare-and-set races differently: duplicates are still
    // recognised.
    for n in 0..5 {
        redispatch(&js, &task, n).await;
    }
    eventually(WAIT, "duplicates acked", || async { dispatch_pending(&js).await == 0 }).await;
    let executions = executions.lock().unwrap().clone();
    assert!(ids.iter().all(|id| executions.get(id) == Some(&2)), "{executions:?}");
    for worker in workers {
        worker.stop().await;
    }
}
