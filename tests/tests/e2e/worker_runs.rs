//! End-to-end tests of runs shared by worker processes against a real nats-server: three
//! processes on one queue execute each of 3000 runs once, run events published while the
//! events stream is gone are stored once it is back, and deferred run records: a long run is
//! recorded as running while it runs, a short one written once, at its verdict.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{Event, EventKind};
use jetsched_tests::fixtures::{dispatch, execution_of, publish_dispatch, run_record, wait_run_status};
use jetsched_tests::{
    App, ChildProcess, NatsServer, WithTopology, eventually, read_stream, server_with_topology, spec,
};
use jetsched_worker::runs::RunStatus;
use jetsched_worker::{Handlers, Outcome, RunContext, RunRecords};

use crate::worker_support::{
    WAIT, config, counting_responder, dispatch_pending, wait_for_workers, worker_process,
};

#[tokio::test]
async fn three_worker_processes_share_3000_runs_each_executed_once() {
    let WithTopology { server, client, js, .. } = server_with_topology(Default::default()).await;
    let counts = counting_responder(&client, Duration::from_millis(2)).await;
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
    let server = NatsServer::start().await;
    let handlers = Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() });
    // Eager records: every run tells its start as well as its outcome.
    let mut config = config(&server, "w-events");
    config.run_records = RunRecords::Eager;
    let worker = App::worker(config, handlers).await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    // Every event published, stored or not, as the server passes it on.
    let mut on_the_wire = client.subscribe(names.events_wildcard()).await.expect("subscribe to events");
    client.flush().await.expect("flush the subscription");
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
    // The outcome of each run was published while the stream was gone, and refused.
    let mut told = HashSet::new();
    let outage = async {
        while told.len() < ids.len() {
            let message = on_the_wire.next().await.expect("the subscription lives");
            if let Ok(event) = serde_json::from_slice::<Event>(&message.payload)
                && event.kind == EventKind::RunSucceeded
            {
                told.extend(event.execution_id);
            }
        }
    };
    if tokio::time::timeout(WAIT, outage).await.is_err() {
        panic!("the outcome of every run published during the outage; seen for {told:?} of {ids:?}");
    }
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

#[tokio::test]
async fn deferred_records_show_a_long_run_running_and_write_a_short_one_once_at_its_verdict() {
    let server = NatsServer::start().await;
    let handlers = Handlers::new().register("quick", |_run: RunContext| async { Outcome::ok() }).register(
        "slow",
        |_run: RunContext| async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Outcome::ok()
        },
    );
    let mut config = config(&server, "w-deferred");
    assert_eq!(config.run_records, RunRecords::Deferred, "deferred records are the default");
    config.running_after = Duration::from_millis(300);
    let worker = App::worker(config, handlers).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let quick = spec("wk", "quick").handler("quick").fast_retry(3).timeout("5s").task();
    let slow = spec("wk", "slow").handler("slow").fast_retry(3).timeout("5s").task();
    let slow_id = dispatch(&js, &names, &slow, 1).await;
    let started = Instant::now();
    let quick_id = dispatch(&js, &names, &quick, 1).await;

    // The long run is recorded as running once it has run --running-after, while it runs.
    let running = eventually(WAIT, "the long run recorded as running", || async {
        run_record(&js, &names, &slow_id).await.filter(|r| r.status == RunStatus::Running)
    })
    .await;
    assert!(started.elapsed() < Duration::from_millis(1400), "recorded as running only after it ended");
    assert_eq!(running.attempts.len(), 1);
    for id in [&slow_id, &quick_id] {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, WAIT).await;
    }
    // The short run's record was written once (at its verdict), the long run's twice: three
    // writes to the bucket in all (it keeps one value per key, its sequence counts writes).
    let mut runs = js.get_key_value(names.runs_bucket()).await.expect("runs bucket").stream;
    let writes = runs.info().await.expect("runs stream info").state.last_sequence;
    assert_eq!(writes, 3, "record writes of a short and a long run");
    // Only the long run tells its start, dated when it started.
    let events = eventually(WAIT, "both outcomes stored", || async {
        let events: Vec<Event> = read_stream(&js, &names.events_stream(), Duration::from_millis(500))
            .await
            .ok()?
            .iter()
            .filter_map(|m| serde_json::from_slice(&m.payload).ok())
            .collect();
        let outcomes = events.iter().filter(|e| e.kind == EventKind::RunSucceeded).count();
        (outcomes == 2).then_some(events)
    })
    .await;
    let of = |id: &str, kind: EventKind| {
        events.iter().find(|e| e.execution_id.as_deref() == Some(id) && e.kind == kind).cloned()
    };
    assert!(of(&quick_id, EventKind::RunStarted).is_none(), "a short run tells no start");
    let start = of(&slow_id, EventKind::RunStarted).expect("the long run tells its start");
    let end = of(&slow_id, EventKind::RunSucceeded).expect("the long run's outcome");
    let ran = (end.time - start.time).num_milliseconds();
    assert!((1400..3000).contains(&ran), "start dated when the run started: {ran} ms before its end");
    worker.stop().await;
}
