//! End-to-end tests of losing a worker against a real nats-server: kill -9 mid-run (another
//! worker completes the run after ack_wait, progress acks keep the others), a graceful stop
//! under load that loses and repeats nothing, and runs outlasting the grace period handed back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use jetsched_shared::names::Names;
use jetsched_tests::fixtures::{dispatch, noting, publish_dispatch, run_record, wait_run_status};
use jetsched_tests::{App, ChildProcess, NatsServer, WithTopology, eventually, server_with_topology, spec};
use jetsched_worker::Outcome;
use jetsched_worker::runs::{AttemptOutcome, RunStatus};

use crate::worker_support::{
    WAIT, config, counting_responder, dispatch_pending, outcomes, wait_for_workers, worker_process,
};

#[tokio::test]
async fn kill9_mid_long_runs_they_complete_on_another_worker_after_ack_wait() {
    let WithTopology { server, client, js, .. } = server_with_topology(Default::default()).await;
    // Runs of 3 s against an ack_wait of 2 s: only progress acks keep them from redelivery.
    let counts = counting_responder(&client, Duration::from_secs(3)).await;
    let names = Names::default();
    let args = ["--concurrency", "3", "--ack-wait", "2s"];
    let mut workers: HashMap<String, ChildProcess> =
        ["k-1", "k-2"].into_iter().map(|n| (n.to_string(), worker_process(&server, n, &args))).collect();
    wait_for_workers(&client, 2).await;

    let task = spec("wk", "long").nats("jobs.count").fast_retry(3).timeout("10s").task();
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(dispatch(&js, &names, &task, n).await);
    }
    // Once every run is running, kill -9 the worker of the first one.
    let running = eventually(WAIT, "all six runs started", || async {
        let mut records = Vec::new();
        for id in &ids {
            match run_record(&js, &names, id).await {
                Some(r) if r.status == RunStatus::Running => records.push(r),
                _ => return None,
            }
        }
        Some(records)
    })
    .await;
    let victim = running[0].worker.clone();
    let victims: Vec<String> =
        running.iter().filter(|r| r.worker == victim).map(|r| r.execution_id.clone()).collect();
    workers.get_mut(&victim).expect("victim").kill9();
    let killed_at = Instant::now();

    for id in &ids {
        let r = wait_run_status(&js, &names, id, RunStatus::Succeeded, Duration::from_secs(30)).await;
        if victims.contains(id) {
            assert_eq!(outcomes(&r), [AttemptOutcome::Abandoned, AttemptOutcome::Succeeded], "{r:?}");
            assert_ne!(r.worker, victim);
            assert_eq!(r.reruns, 1);
        } else {
            assert_eq!(outcomes(&r), [AttemptOutcome::Succeeded], "progress acks prevent redelivery: {r:?}");
        }
    }
    assert!(killed_at.elapsed() >= Duration::from_secs(1), "redelivery waited for ack_wait");
    let counts = counts.lock().unwrap().clone();
    for id in &ids {
        let expected = if victims.contains(id) { 2 } else { 1 };
        assert_eq!(counts.get(id), Some(&expected), "executions of {id}");
    }
    assert_eq!(dispatch_pending(&js).await, 0);
}

#[tokio::test]
async fn graceful_shutdown_under_load_loses_nothing() {
    let server = NatsServer::start().await;
    let (handlers, started) = noting(
        "work",
        |run| run.execution_id.clone(),
        |_| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Outcome::ok()
        },
    );
    // Executions of each run (a graceful stop lets every started run finish: one each).
    let executed = || {
        let mut counts: HashMap<String, u32> = HashMap::new();
        for id in started.lock().unwrap().iter() {
            *counts.entry(id.clone()).or_default() += 1;
        }
        counts
    };
    let mut first = config(&server, "g-1");
    first.concurrency = 8;
    let first = App::worker(first, handlers.clone()).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let task = spec("wk", "graceful").handler("work").fast_retry(1).timeout("5s").task();
    for n in 0..300 {
        publish_dispatch(&js, &names, &task, n).await.await.expect("stored");
    }
    eventually(WAIT, "the first worker is busy", || async { executed().len() >= 16 }).await;
    let mut second = config(&server, "g-2");
    second.concurrency = 8;
    let second = App::worker(second, handlers).await;
    // Stop the first worker under load: in-flight runs finish, nothing is left unacked.
    let took = first.stop().await;
    assert!(took < Duration::from_secs(3), "stops promptly: {took:?}");
    eventually(Duration::from_secs(30), "all 300 runs executed", || async {
        let n = executed().len();
        if n == 300 { Ok(()) } else { Err(n) }
    })
    .await;
    eventually(WAIT, "all acked", || async { dispatch_pending(&js).await == 0 }).await;
    let twice: Vec<_> = executed().into_iter().filter(|(_, n)| *n != 1).map(|(k, _)| k).collect();
    assert!(twice.is_empty(), "a graceful stop executes nothing twice: {twice:?}");
    second.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_hands_back_runs_that_outlast_the_grace_period() {
    let server = NatsServer::start().await;
    let (handlers, executed) = noting(
        "slow",
        |run| (run.execution_id.clone(), run.attempt),
        |run| async move {
            let wait = if run.attempt == 1 { Duration::from_secs(30) } else { Duration::from_millis(10) };
            tokio::time::sleep(wait).await;
            Outcome::ok()
        },
    );
    let mut short = config(&server, "grace-1");
    short.shutdown_grace = Duration::from_millis(300);
    let short = App::worker(short, handlers.clone()).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let task = spec("wk", "slow").handler("slow").fast_retry(2).timeout("60s").task();
    let id = dispatch(&js, &names, &task, 1).await;
    eventually(WAIT, "the run started", || async { !executed.lock().unwrap().is_empty() }).await;
    let took = short.stop().await;
    assert!(took < Duration::from_secs(3), "grace period bounds the stop: {took:?}");
    let other = App::worker(config(&server, "grace-2"), handlers).await;
    let r = wait_run_status(&js, &names, &id, RunStatus::Succeeded, Duration::from_secs(5)).await;
    assert_eq!(outcomes(&r), [AttemptOutcome::Interrupted, AttemptOutcome::Succeeded], "{r:?}");
    assert_eq!(r.worker, "grace-2", "handed back at once, not after ack_wait");
    other.stop().await;
}
