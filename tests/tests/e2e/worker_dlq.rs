//! End-to-end tests of the worker's dead letters against a real nats-server: exhausted and
//! permanent failures with their history, a crash-looping run moved by the max-deliveries
//! advisory, and a full dead-letter stream that leaves the run in place until it has room.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_tests::fixtures::{dead_letter_of, dispatch, wait_run_status};
use jetsched_tests::{App, NatsServer, WithTopology, eventually, last_message, server_with_topology, spec};
use jetsched_worker::dlq::DeadLetterSource;
use jetsched_worker::runs::{AttemptOutcome, RunStatus};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::Value;

use crate::worker_support::{WAIT, config, dispatch_pending, outcomes_of, worker_process};

#[tokio::test]
async fn worker_dead_letters_exhausted_and_permanent_failures_with_their_history() {
    let server = NatsServer::start().await;
    let handlers = Handlers::new()
        .register(
            "always-fails",
            |run: RunContext| async move { Outcome::retry(format!("boom {}", run.attempt)) },
        )
        .register("rejects", |_run: RunContext| async { Outcome::permanent("bad input") });
    let worker = App::worker(config(&server, "w-dlq"), handlers).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();

    let failing = spec("wk", "failing").handler("always-fails").fast_retry(3).timeout("5s").task();
    let rejected = spec("wk", "rejected").handler("rejects").fast_retry(3).timeout("5s").task();
    let unknown = spec("wk", "unknown").handler("nobody").fast_retry(3).timeout("5s").task();
    let failing_id = dispatch(&js, &names, &failing, 2_000).await;
    let rejected_id = dispatch(&js, &names, &rejected, 2_000).await;
    let unknown_id = dispatch(&js, &names, &unknown, 2_000).await;

    let entry = dead_letter_of(&js, &names, &failing_id, WAIT).await;
    assert_eq!(entry.source, DeadLetterSource::Verdict);
    assert_eq!(entry.attempts.len(), 3, "every attempt recorded: {entry:?}");
    assert!(entry.attempts.iter().all(|a| a.outcome == Some(AttemptOutcome::Failed) && a.finished.is_some()));
    assert_eq!(entry.attempts[2].error.as_deref(), Some("boom 3"));
    assert!(entry.attempts.iter().all(|a| a.worker == "w-dlq"));
    assert!(entry.reason.contains("gave up after 3 attempts"), "{}", entry.reason);
    assert_eq!(entry.spec.as_ref().map(|s| s.id.as_str()), Some("failing"), "spec snapshot");
    assert_eq!(entry.nominal_time.timestamp_millis(), 2_000);

    let entry = dead_letter_of(&js, &names, &rejected_id, WAIT).await;
    assert_eq!(entry.attempts.len(), 1, "permanent: one attempt");
    assert_eq!(entry.attempts[0].outcome, Some(AttemptOutcome::Permanent));
    assert!(entry.reason.contains("bad input"), "{}", entry.reason);

    let entry = dead_letter_of(&js, &names, &unknown_id, WAIT).await;
    assert_eq!(entry.attempts.len(), 1);
    assert!(entry.reason.contains("no handler \"nobody\""), "{}", entry.reason);

    for id in [&failing_id, &rejected_id, &unknown_id] {
        wait_run_status(&js, &names, id, RunStatus::Dead, WAIT).await;
    }
    eventually(WAIT, "terminated dispatches leave the work queue", || async {
        dispatch_pending(&js).await == 0
    })
    .await;
    // The events tell the story too.
    let dead =
        last_message(&js, &names.events_stream(), &names.event_subject("run.dead", "wk", "failing")).await;
    let dead: Value = serde_json::from_slice(&dead.payload).unwrap();
    assert_eq!(dead["execution_id"], failing_id.as_str());
    // And the metrics.
    eventually(WAIT, "the DLQ depth as seen after the last dead letter", || async {
        worker.metric("jetsched_dlq_depth").await == Some(3.0)
    })
    .await;
    let metrics = worker.metrics().await;
    for line in [
        r#"jetsched_worker_dead_letters_total{source="verdict"} 3"#,
        r#"jetsched_worker_runs_total{outcome="failed",priority="normal",queue="default"} 3"#,
        "jetsched_events_failed_total 0",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    worker.stop().await;
}

#[tokio::test]
async fn crash_looping_run_reaches_the_dlq_through_the_max_deliveries_advisory() {
    let WithTopology { server, client, js, .. } = server_with_topology(Default::default()).await;
    let mut sub = client.subscribe("jobs.crash").await.expect("subscribe");
    let names = Names::default();
    // Eager records: each attempt is recorded before it runs, so the entry lists both (under
    // deferred records, an attempt whose worker died at once leaves none).
    let args = ["--ack-wait", "1s", "--max-deliver", "2", "--run-records", "eager"];
    let mut worker = worker_process(&server, "crash-1", &args);
    let task = spec("wk", "crashy").nats("jobs.crash").fast_retry(5).timeout("30s").task();
    let id = dispatch(&js, &names, &task, 1).await;
    // Every time the run reaches its handler, its worker dies.
    for n in 2..=3 {
        tokio::time::timeout(WAIT, sub.next()).await.expect("the run is delivered").expect("subscription");
        worker.kill9();
        worker = worker_process(&server, &format!("crash-{n}"), &args);
    }
    let entry = dead_letter_of(&js, &names, &id, WAIT).await;
    assert_eq!(entry.source, DeadLetterSource::MaxDeliveries);
    assert!(entry.reason.contains("no verdict after 2 deliveries"), "{}", entry.reason);
    assert_eq!(outcomes_of(&entry), [AttemptOutcome::Abandoned, AttemptOutcome::Abandoned], "{entry:?}");
    wait_run_status(&js, &names, &id, RunStatus::Dead, WAIT).await;
    eventually(WAIT, "moved out of the dispatch stream", || async { dispatch_pending(&js).await == 0 }).await;
    drop(worker);
}

#[tokio::test]
async fn a_full_dlq_leaves_the_run_in_place_until_the_dead_letter_is_stored() {
    let server = NatsServer::start().await;
    let executions: Arc<Mutex<u32>> = Arc::default();
    let count = executions.clone();
    let handlers = Handlers::new().register("rejects", move |_run: RunContext| {
        let count = count.clone();
        async move {
            *count.lock().unwrap() += 1;
            Outcome::permanent("bad input")
        }
    });
    let mut cfg = config(&server, "w-full");
    cfg.shared.topology.dlq_max_bytes = 64;
    cfg.dlq_retry_delay = Duration::from_millis(300);
    let worker = App::worker(cfg, handlers).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let id =
        dispatch(&js, &names, &spec("wk", "full").handler("rejects").fast_retry(3).timeout("5s").task(), 1)
            .await;

    let r = wait_run_status(&js, &names, &id, RunStatus::Failed, WAIT).await;
    assert_eq!(r.attempts.len(), 1);
    let events = js.get_stream(names.events_stream()).await.expect("events stream");
    let failed = eventually(WAIT, "run.failed event about the refused dead letter", || async {
        let message = events
            .get_last_raw_message_by_subject(&names.event_subject("run.failed", "wk", "full"))
            .await
            .ok()?;
        let event: Value = serde_json::from_slice(&message.payload).ok()?;
        (event["reason"] == "dlq_rejected").then_some(event)
    })
    .await;
    assert_eq!(failed["execution_id"], id.as_str());
    assert_eq!(dispatch_pending(&js).await, 1, "not terminated while the DLQ refuses it");

    // Room in the DLQ: the next redelivery stores the entry without running the task again.
    let mut dlq = js.get_stream(names.dlq_stream()).await.expect("DLQ");
    let mut dlq_config = dlq.info().await.expect("info").config.clone();
    dlq_config.max_bytes = 1 << 20;
    js.update_stream(dlq_config).await.expect("grow the DLQ");
    let entry = dead_letter_of(&js, &names, &id, WAIT).await;
    assert_eq!(entry.attempts.len(), 1);
    wait_run_status(&js, &names, &id, RunStatus::Dead, WAIT).await;
    eventually(WAIT, "terminated", || async { dispatch_pending(&js).await == 0 }).await;
    assert_eq!(*executions.lock().unwrap(), 1, "the task ran once");
    worker.stop().await;
}
