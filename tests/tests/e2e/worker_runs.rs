//! End-to-end tests of runs shared by worker processes against a real nats-server: three
//! processes on one queue execute each of 3000 runs once, and run events published while
//! the events stream is gone are stored once it is back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use jetsched_shared::names::Names;
use jetsched_tests::fixtures::{dispatch, execution_of, publish_dispatch, wait_run_status};
use jetsched_tests::{App, ChildProcess, NatsServer, eventually, init_test_logging, spec};
use jetsched_worker::runs::RunStatus;
use jetsched_worker::{Handlers, Outcome, RunContext};

use crate::worker_support::{
    WAIT, config, counting_responder, dispatch_pending, server_with_topology, wait_for_workers,
    worker_process,
};

#[tokio::test]
async fn three_worker_processes_share_3000_runs_each_executed_once() {
    let (server, client, js) = server_with_topology().await;
    let sub = client.subscribe("jobs.count").await.expect("subscribe");
    let counts = counting_responder(client.clone(), sub, Duration::from_millis(2));
    let names = Names::default();
    let _workers: Vec<ChildProcess> =
        (1..=3).map(|n| worker_process(&server, &format!("proc-{n}"), &["--concurrency", "16"])).collect();
    wait_for_workers(&client, 3).await;

    let task = spec("wk", "shared").nats("jobs.count").fast_retry(3).timeout("5s").task();
    let mut acks = Vec::new();
    for n in 0..3000 {
        acks.push(publish_dispatch(&js, &names, &task, n).await);
        if acks.len() >= 256 {
            for ack in acks.drain(..) {
                ack.await.expect("stored");
            }
        }
    }
    for ack in acks {
        ack.await.expect("stored");
    }
    let started = Instant::now();
    eventually(Duration::from_secs(45), "3000 runs executed", || async {
        let n = counts.lock().unwrap().len();
        if n == 3000 { Ok(()) } else { Err(n) }
    })
    .await;
    eventually(WAIT, "every run acked", || async { dispatch_pending(&js).await == 0 }).await;
    let elapsed = started.elapsed();
    let counts = counts.lock().unwrap().clone();
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "runs executed more than once: {twice:?}");
    let mut per_worker: HashMap<String, u32> = HashMap::new();
    for n in 0..3000 {
        let r = wait_run_status(&js, &names, &execution_of(&task, n), RunStatus::Succeeded, WAIT).await;
        assert_eq!(r.attempts.len(), 1);
        *per_worker.entry(r.worker).or_default() += 1;
    }
    assert_eq!(per_worker.len(), 3, "each worker takes part: {per_worker:?}");
    eprintln!("3000 runs over 3 worker processes in {elapsed:?}: {per_worker:?}");
}

#[tokio::test]
async fn run_events_published_while_the_events_stream_is_gone_are_stored_once_it_is_back() {
    init_test_logging();
    let server = NatsServer::start().await;
    let handlers = Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() });
    let worker = App::worker(config(&server, "w-events"), handlers).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    // As when a replicated events stream elects a new leader after a node died.
    js.delete_stream(names.events_stream()).await.expect("delete the events stream");
    let task = spec("wk", "outage").handler("noop").fast_retry(3).timeout("5s").task();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(dispatch(&js, &names, &task, n).await);
    }
    for id in &ids {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, WAIT).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    jetsched_shared::topology::ensure(&js, &names, &Default::default()).await.expect("events stream back");
    let events = eventually(WAIT, "every run's events stored", || async {
        let events: Vec<jetsched_shared::wire::Event> =
            jetsched_tests::read_stream(&js, &names.events_stream(), Duration::from_millis(500))
                .await
                .ok()?
                .iter()
                .filter_map(|m| serde_json::from_slice(&m.payload).ok())
                .collect();
        (events.len() >= 2 * ids.len()).then_some(events)
    })
    .await;
    for id in &ids {
        let kinds: Vec<&str> = events
            .iter()
            .filter(|e| e.execution_id.as_deref() == Some(id.as_str()))
            .map(|e| e.kind.as_str())
            .collect();
        assert!(kinds.contains(&"run.started") && kinds.contains(&"run.succeeded"), "{id}: {kinds:?}");
    }
    let metrics = worker.metrics().await;
    assert!(metrics.contains("jetsched_events_failed_total 0"), "no event counted as lost: {metrics}");
    worker.stop().await;
}
