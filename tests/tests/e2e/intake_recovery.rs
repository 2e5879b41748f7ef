//! The registry's intake after the node leading its consumer dies: submissions published
//! afterwards are still applied promptly (the pull held by the dead leader is re-opened).

use std::time::{Duration, Instant};

use async_nats::jetstream;
use jetsched_shared::names::Names;
use jetsched_tests::{App, NatsCluster, eventually, init_test_logging};
use serde_json::json;

use crate::registry::config;

/// A submission must be applied well within the pull's own expiry (30 s + 5 s), the time a
/// stalled pull would take to recover on its own.
const APPLIED_WITHIN: Duration = Duration::from_secs(12);

/// Index of the node leading the intake consumer, by server name.
async fn consumer_leader(cluster: &NatsCluster, js: &jetstream::Context, names: &Names) -> Option<usize> {
    let mut consumer: jetstream::consumer::PullConsumer =
        js.get_stream(names.intake_stream()).await.ok()?.get_consumer(names.intake_consumer()).await.ok()?;
    let leader = consumer.info().await.ok()?.cluster.as_ref()?.leader.clone()?;
    (0..3).find(|&i| cluster.server_name(i) == leader)
}

#[tokio::test]
async fn one_shots_submitted_after_the_intake_consumer_leader_dies_are_applied() {
    init_test_logging();
    let mut cluster = NatsCluster::start().await;
    let names = Names::default();
    let setup = cluster.client().await;
    // The registry must be up (streams and its consumer exist) before the leader is known.
    let probe = App::registry(config(&cluster.urls(), 3)).await;
    let js = jetstream::new(setup.clone());
    let leader = eventually(Duration::from_secs(20), "intake consumer has a leader", || {
        consumer_leader(&cluster, &js, &names)
    })
    .await;
    probe.stop().await;
    // The registry connects to a node that survives, so only the consumer leader changes.
    let survivor = (leader + 1) % 3;
    let registry = App::registry(config(&cluster.url(survivor), 3)).await;
    let publisher = jetstream::new(cluster.client_to(survivor).await);

    // Before the fault: a submission is applied.
    let submit = |id: &str| {
        let at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
        let spec = json!({"schedule": {"at": at}, "executor": {"kind": "nats", "subject": "jobs.once"}});
        (names.submit_subject("default", id), serde_json::to_vec(&spec).unwrap())
    };
    let tasks = publisher.get_key_value(names.tasks_bucket()).await.unwrap();
    let stored = |key: String| {
        let tasks = tasks.clone();
        async move {
            tasks.entry(key).await.ok().flatten().filter(|e| e.operation == jetstream::kv::Operation::Put)
        }
    };
    let (subject, body) = submit("before");
    publisher.publish(subject, body.into()).await.unwrap().await.unwrap();
    eventually(Duration::from_secs(10), "submission before the fault applied", || {
        stored("default.before".into())
    })
    .await;

    cluster.kill_node(leader);
    let ids: Vec<String> = (0..4).map(|i| format!("after-{i}")).collect();
    let started = Instant::now();
    for id in &ids {
        let (subject, body) = submit(id);
        // The stream elects a new leader among the two survivors; the publish is retried
        // until it is acknowledged, as a publisher would.
        eventually(Duration::from_secs(20), "submission acknowledged", || {
            let (subject, body) = (subject.clone(), body.clone());
            let publisher = publisher.clone();
            async move { publisher.publish(subject, body.into()).await.ok()?.await.ok() }
        })
        .await;
    }
    for id in &ids {
        eventually(APPLIED_WITHIN, &format!("submission {id} applied after the leader died"), || {
            stored(format!("default.{id}"))
        })
        .await;
    }
    let took = started.elapsed();
    eprintln!("four submissions after the consumer leader died applied within {took:?}");
    assert!(took < APPLIED_WITHIN, "applied in {took:?}");
    registry.stop().await;
}
