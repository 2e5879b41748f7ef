//! End-to-end tests of priorities inside a queue against a real nats-server: an urgent run
//! overtakes a backlog, the weighted policy shares starts by weight, the strict policy never
//! starts a low run while critical ones wait, reserved permits start urgent runs at once, and
//! manual triggers and replays keep or override the priority (older dispatches are `normal`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use chrono::Utc;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::names::Names;
use jetsched_shared::priority::Priority;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{self, DeadLetter, DeadLetterSource, RunStatus, Trigger};
use jetsched_tests::fixtures::{publish_dispatch, wait_run_status};
use jetsched_tests::{Api, App, WithTopology, eventually, server_with_topology, spec};
use jetsched_worker::{Handlers, Outcome, PolicyKind, RunContext};
use tokio_util::sync::CancellationToken;

use crate::worker_support::{WAIT, config};

/// Starts seen by the recording handler: the task id (named after its lane) and when.
type Starts = Arc<Mutex<Vec<(String, Instant)>>>;

/// A handler `rec` that records each start, then takes `work` (or, for tasks named in
/// `held`, waits for `release`).
fn recording(
    work: Duration,
    held: &'static [&'static str],
    release: CancellationToken,
) -> (Handlers, Starts) {
    let starts: Starts = Arc::default();
    let seen = starts.clone();
    let handlers = Handlers::new().register("rec", move |run: RunContext| {
        seen.lock().unwrap().push((run.task_id.clone(), Instant::now()));
        let release = release.clone();
        async move {
            if held.contains(&run.task_id.as_str()) {
                release.cancelled().await;
            } else {
                tokio::time::sleep(work).await;
            }
            Outcome::ok()
        }
    });
    (handlers, starts)
}

/// The task of a lane: id and priority are the lane's name.
fn lane_task(priority: Priority) -> TaskSpec {
    spec("prio", priority.as_str()).handler("rec").field("priority", priority.as_str()).task()
}

/// Queues `count` scheduled runs of `task` (nominal times from `from`), publishing them all
/// before waiting for the acks.
async fn queue_runs(js: &jetstream::Context, task: &TaskSpec, from: i64, count: i64) {
    let names = Names::default();
    for chunk in (from..from + count).collect::<Vec<_>>().chunks(1000) {
        let mut acks = Vec::with_capacity(chunk.len());
        for nominal in chunk {
            acks.push(publish_dispatch(js, &names, task, *nominal).await);
        }
        // Every publish is on its way; the acks come back in order.
        for ack in acks {
            ack.await.expect("dispatch stored");
        }
    }
}

/// The lanes of the recorded starts, in order.
fn lanes_started(starts: &Starts) -> Vec<String> {
    starts.lock().unwrap().iter().map(|(task, _)| task.clone()).collect()
}

#[tokio::test]
async fn a_critical_run_starts_at_once_behind_a_backlog_of_low_runs() {
    let WithTopology { server, js, .. } = server_with_topology(Default::default()).await;
    let (handlers, starts) = recording(Duration::from_millis(5), &[], CancellationToken::new());
    let mut config = config(&server, "w-backlog");
    config.concurrency = 2;
    let worker = App::worker(config, handlers).await;
    queue_runs(&js, &lane_task(Priority::Low), 1, 5_000).await;
    eventually(WAIT, "the backlog is being worked", || async {
        (lanes_started(&starts).len() >= 20).then_some(())
    })
    .await;

    let critical = lane_task(Priority::Critical);
    let sent = Instant::now();
    let origin = Origin::Manual { at: Utc::now() };
    let built =
        dispatch::build(&Names::default(), Target::of(&critical, 1), origin, SpecBody::Spec(&critical))
            .expect("encode");
    js.send_publish(built.subject, built.message).await.expect("publish").await.expect("stored");
    let started = eventually(WAIT, "the critical run started", || async {
        starts.lock().unwrap().iter().find(|(task, _)| task == "critical").map(|(_, at)| *at)
    })
    .await;
    let waited = started.duration_since(sent);
    let low_done = lanes_started(&starts).len();
    assert!(waited < Duration::from_millis(100), "the critical run waited {waited:?}");
    assert!(low_done < 2_500, "the critical run started after {low_done} of 5000 low runs");
    let wait_metric =
        worker.metric(r#"jetsched_worker_wait_seconds_count{priority="critical",queue="default"}"#).await;
    assert_eq!(wait_metric, Some(1.0));
    worker.stop().await;
}

#[tokio::test]
async fn the_weighted_policy_shares_starts_by_weight_and_starves_no_lane() {
    let WithTopology { server, js, .. } = server_with_topology(Default::default()).await;
    for priority in Priority::ALL {
        queue_runs(&js, &lane_task(priority), 1, 400).await;
    }
    let (handlers, starts) = recording(Duration::from_millis(2), &[], CancellationToken::new());
    let mut config = config(&server, "w-weighted");
    config.concurrency = 4;
    let worker = App::worker(config, handlers).await;
    // 600 starts: the critical lane (8 of 15) has not run out of its 400 by then.
    let first = eventually(WAIT, "600 runs started", || async {
        let lanes = lanes_started(&starts);
        (lanes.len() >= 600).then(|| lanes[..600].to_vec())
    })
    .await;
    worker.stop().await;
    let weights = [8.0, 4.0, 2.0, 1.0];
    for (priority, weight) in Priority::ALL.into_iter().zip(weights) {
        let got = first.iter().filter(|lane| *lane == priority.as_str()).count() as f64;
        let expected = 600.0 * weight / 15.0;
        assert!(
            (got - expected).abs() <= expected * 0.2,
            "{priority}: {got} of 600 starts, expected {expected} ± 20%"
        );
    }
}

#[tokio::test]
async fn the_strict_policy_starts_no_low_run_while_critical_runs_wait() {
    let WithTopology { server, js, .. } = server_with_topology(Default::default()).await;
    queue_runs(&js, &lane_task(Priority::Low), 1, 100).await;
    queue_runs(&js, &lane_task(Priority::Critical), 1, 100).await;
    let (handlers, starts) = recording(Duration::from_millis(1), &[], CancellationToken::new());
    let mut config = config(&server, "w-strict");
    config.concurrency = 2;
    config.priority_policy = PolicyKind::Strict;
    let worker = App::worker(config, handlers).await;
    let lanes = eventually(WAIT, "every run started", || async {
        let lanes = lanes_started(&starts);
        (lanes.len() >= 200).then_some(lanes)
    })
    .await;
    worker.stop().await;
    let last_critical = lanes.iter().rposition(|lane| lane == "critical").expect("critical runs");
    let first_low = lanes.iter().position(|lane| lane == "low").expect("low runs");
    assert!(first_low > last_critical, "a low run started at {first_low}, a critical one at {last_critical}");
}

#[tokio::test]
async fn a_reserved_permit_starts_a_critical_run_while_long_low_runs_hold_the_rest() {
    let WithTopology { server, js, .. } = server_with_topology(Default::default()).await;
    let release = CancellationToken::new();
    let (handlers, starts) = recording(Duration::ZERO, &["low"], release.clone());
    let mut config = config(&server, "w-reserve");
    config.concurrency = 3;
    config.reserve = "critical=1".to_string();
    let worker = App::worker(config, handlers).await;
    queue_runs(&js, &lane_task(Priority::Low), 1, 10).await;
    eventually(WAIT, "two long low runs hold the unreserved permits", || async {
        (lanes_started(&starts).len() >= 2).then_some(())
    })
    .await;

    let sent = Instant::now();
    queue_runs(&js, &lane_task(Priority::Critical), 1, 1).await;
    let started = eventually(WAIT, "the critical run started", || async {
        starts.lock().unwrap().iter().find(|(task, _)| task == "critical").map(|(_, at)| *at)
    })
    .await;
    let waited = started.duration_since(sent);
    assert!(waited < Duration::from_millis(500), "the critical run waited {waited:?}");
    let lanes = lanes_started(&starts);
    assert_eq!(lanes.iter().filter(|lane| *lane == "low").count(), 2, "{lanes:?}");
    release.cancel();
    worker.stop().await;
}

/// The lane subject and `Jetsched-Priority` header of the last dispatch of `task_id` on `lane`.
async fn last_dispatch(js: &jetstream::Context, task_id: &str, lane: Priority) -> (String, Trigger) {
    let names = Names::default();
    let subject = names.lane_subject("default", lane, "prio", task_id);
    let stream = js.get_stream(names.dispatch_stream()).await.expect("stream");
    let message = eventually(WAIT, &format!("a dispatch on {subject}"), || async {
        stream.get_last_raw_message_by_subject(&subject).await.ok()
    })
    .await;
    let header = message.headers.get(wire::HDR_PRIORITY).map(|v| v.to_string()).unwrap_or_default();
    let body: wire::Dispatch = serde_json::from_slice(&message.payload).expect("dispatch body");
    assert_eq!(body.priority, lane);
    (header, body.trigger)
}

#[tokio::test]
async fn triggers_and_replays_keep_or_override_the_priority_and_old_dispatches_are_normal() {
    let WithTopology { server, client, js, names, .. } = server_with_topology(Default::default()).await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let api = Api::new(&client);
    let task = spec("prio", "report").handler("rec").field("priority", "high").every("1h");
    let put = api.task("put", task.json()).await;
    assert!(put.get("error").is_none(), "{put}");

    // A manual trigger runs in the spec's lane unless it names another.
    let body = serde_json::json!({"namespace": "prio", "id": "report"});
    api.task("trigger", body.clone()).await;
    assert_eq!(last_dispatch(&js, "report", Priority::High).await, ("high".into(), Trigger::Manual));
    let mut critical = body.clone();
    critical["priority"] = "critical".into();
    api.task("trigger", critical).await;
    assert_eq!(last_dispatch(&js, "report", Priority::Critical).await, ("critical".into(), Trigger::Manual));
    let mut bad = body.clone();
    bad["priority"] = "urgent".into();
    let refused = api.task("trigger", bad).await;
    assert_eq!(refused["error"]["field"], "priority", "{refused}");

    // A replay keeps the dead run's lane, or takes the one asked for.
    for (execution, task_id) in [("dead-1", "kept"), ("dead-2", "moved")] {
        let task = spec("prio", task_id).handler("rec").every("1h").task();
        let entry = DeadLetter {
            execution_id: execution.into(),
            namespace: "prio".into(),
            task_id: task_id.into(),
            queue: "default".into(),
            nominal_time: Utc::now(),
            trigger: Trigger::Schedule,
            term: 1,
            revision: 1,
            spec: Some(task),
            raw_dispatch: None,
            reason: "retries exhausted".into(),
            source: DeadLetterSource::Verdict,
            dead_at: Utc::now(),
            worker: "w1".into(),
            attempts: Vec::new(),
            dispatch_sequence: 1,
            trace_id: None,
            priority: Priority::Low,
        };
        let subject = names.dlq_subject("default", "prio", task_id);
        js.publish(subject, serde_json::to_vec(&entry).unwrap().into()).await.unwrap().await.unwrap();
    }
    let replayed = api.dlq("replay", serde_json::json!({"task_id": "kept"})).await;
    assert_eq!(replayed["replayed"].as_array().map(Vec::len), Some(1), "{replayed}");
    assert_eq!(last_dispatch(&js, "kept", Priority::Low).await, ("low".into(), Trigger::Replay));
    let request = serde_json::json!({"task_id": "moved", "priority": "critical"});
    let replayed = api.dlq("replay", request).await;
    assert_eq!(replayed["replayed"].as_array().map(Vec::len), Some(1), "{replayed}");
    assert_eq!(last_dispatch(&js, "moved", Priority::Critical).await, ("critical".into(), Trigger::Replay));

    // A dispatch from before priorities (no header, no body field) runs as normal.
    let (handlers, starts) = recording(Duration::ZERO, &[], CancellationToken::new());
    let worker = App::worker(config(&server, "w-old"), handlers).await;
    let old = spec("prio", "old").handler("rec").every("1h").task();
    let origin = Origin::Manual { at: Utc::now() };
    let built = dispatch::build(&names, Target::of(&old, 1), origin, SpecBody::Spec(&old)).expect("encode");
    let outbound = built.message.clone().outbound_message(built.subject.clone());
    let mut body: serde_json::Value = serde_json::from_slice(&outbound.payload).unwrap();
    body.as_object_mut().unwrap().remove("priority");
    js.publish(names.dispatch_subject("default", "prio", "old"), serde_json::to_vec(&body).unwrap().into())
        .await
        .unwrap()
        .await
        .unwrap();
    wait_run_status(&js, &names, &built.execution_id, RunStatus::Succeeded, WAIT).await;
    assert!(lanes_started(&starts).contains(&"old".to_string()));
    let counted = worker
        .metric(r#"jetsched_worker_runs_total{outcome="succeeded",priority="normal",queue="default"}"#)
        .await;
    assert!(counted >= Some(1.0), "{counted:?}");
    worker.stop().await;
    registry.stop().await;
}
