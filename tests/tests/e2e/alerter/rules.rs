//! Every rule end to end: event rules (run failed or dead, fire lag, leader changes and
//! flapping) and condition rules (no leader, queue backlog, DLQ growing or nearly full) reach
//! the webhook and NATS with their severities, subjects and metrics.

use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use jetsched_shared::alert::Severity;
use jetsched_shared::topology::TopologyArgs;
use jetsched_shared::wire::{Event, EventKind, LeaderRecord};
use jetsched_tests::{App, WithTopology, eventually, metric_value, server_with_topology};

use super::{
    Hook, HookMode, Setup, Subscriber, WAIT, alerted_exactly, count, hooked_config, leader_acquired,
    publish_event, rules_of, run_event, store, subscribed, suppressed_total,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_rules_reach_the_webhook_and_nats() {
    let Setup { server: _server, js, names, subscriber, mut config } = subscribed().await;
    let hook = Hook::start(HookMode::Ok).await;
    config.webhook_urls = vec![hook.url()];
    config.fire_lag = Duration::from_secs(1);
    config.flap_changes = 2;
    config.flap_window = Duration::from_secs(60);
    let alerter = App::alerter(config).await;

    publish_event(&js, &names, &run_event(EventKind::RunFailed, "billing", "report")).await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "billing", "invoice")).await;
    // Ordinary traffic raises nothing.
    publish_event(&js, &names, &run_event(EventKind::RunSucceeded, "billing", "report")).await;
    let on_time =
        Event { nominal_time: Some(Utc::now()), ..Event::new(EventKind::FireDispatched, "billing", "a") };
    publish_event(&js, &names, &on_time).await;
    let late = Event {
        nominal_time: Some(Utc::now() - chrono::Duration::seconds(10)),
        ..Event::new(EventKind::FireDispatched, "billing", "late")
    };
    publish_event(&js, &names, &late).await;
    for (term, instance) in [(1, "s1"), (2, "s2"), (3, "s1")] {
        publish_event(&js, &names, &leader_acquired(instance, term)).await;
    }

    let expected = ["run_failed", "run_dead", "fire_lag", "leader_changed", "leader_flapping"];
    eventually(WAIT, "every event rule on the webhook and NATS", || async {
        let hooked = hook.messages();
        let published = subscriber.rules();
        expected.iter().all(|rule| count(&hooked, rule) >= 1 && published.iter().any(|r| r == rule))
    })
    .await;
    // Severities and subjects.
    let published = subscriber.messages();
    let find = |rule: &str| published.iter().find(|(_, m)| m.rule == rule).expect(rule).clone();
    let (subject, dead) = find("run_dead");
    assert_eq!(subject, names.alert_subject("critical"));
    assert_eq!(dead.severity, Severity::Critical);
    assert_eq!((dead.alerts[0].namespace.as_str(), dead.alerts[0].task_id.as_str()), ("billing", "invoice"));
    assert!(dead.text.contains("billing/invoice"), "{}", dead.text);
    assert_eq!(find("run_failed").0, names.alert_subject("warning"));
    let (_, lag) = find("fire_lag");
    assert_eq!(lag.alerts[0].task_id, "late");
    assert!(lag.alerts[0].details["lag_ms"].parse::<i64>().unwrap() >= 9_000);
    assert_eq!(find("leader_flapping").0, names.alert_subject("critical"));
    // Leader changes are one subject: de-duplicated to a single alert.
    alerted_exactly(|| rules_of(hook.messages()), &[("leader_changed", 1), ("fire_lag", 1)]).await;

    // The alerts stream keeps the history.
    let mut stream = js.get_stream(names.alerts_stream()).await.unwrap();
    assert!(stream.info().await.unwrap().state.messages >= expected.len() as u64);

    let metrics = alerter.metrics().await;
    let channel = format!("webhook:127.0.0.1:{}", hook.addr.port());
    assert_eq!(
        metric_value(
            &metrics,
            &format!("jetsched_alerts_sent_total{{channel=\"{channel}\",rule=\"run_dead\"}}")
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"run_failed\"}"),
        Some(1.0)
    );
    assert_eq!(metric_value(&metrics, "jetsched_alerts_raised_total{rule=\"leader_changed\"}"), Some(3.0));
    assert_eq!(suppressed_total(&metrics, "dedup", "leader_changed"), Some(2.0));
    assert_eq!(metric_value(&metrics, "jetsched_alerter_events_total{kind=\"fire.dispatched\"}"), Some(2.0));
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condition_rules_fire_from_the_lease_queues_and_dlq() {
    let WithTopology { server, client, js, topology, names } =
        server_with_topology(TopologyArgs::default()).await;
    // The worker's queue consumer, with nobody pulling: dispatches pile up.
    let dispatch = js.get_stream(names.dispatch_stream()).await.unwrap();
    dispatch
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(names.worker_consumer("default")),
            filter_subject: names.dispatch_queue_filter("default"),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let hook = Hook::start(HookMode::Ok).await;
    let subscriber = Subscriber::start(&client, &names).await;
    let mut config = hooked_config(&server, &hook);
    config.no_leader_after = Duration::from_secs(1);
    config.backlog_threshold = 3;
    config.backlog_for = Duration::from_millis(500);
    let alerter = App::alerter(config).await;

    // No lease holder at all: fatal after a second.
    let fatal = eventually(WAIT, "no_leader alert", || async {
        subscriber.messages().into_iter().find(|(_, m)| m.rule == "no_leader")
    })
    .await;
    assert_eq!(fatal.0, names.alert_subject("fatal"));
    assert_eq!(fatal.1.severity, Severity::Fatal);

    for i in 0..5 {
        store(&js, names.dispatch_subject("default", "ns", &format!("t{i}")), "{}").await;
    }
    let backlog = eventually(WAIT, "queue_backlog alert", || async {
        hook.messages().into_iter().find(|m| m.rule == "queue_backlog")
    })
    .await;
    assert_eq!(backlog.alerts[0].details["queue"], "default");
    assert_eq!(backlog.alerts[0].details["pending"], "5");

    // The DLQ grows after the alerter has seen it (the no_leader alert took several checks).
    for i in 0..2 {
        store(&js, names.dlq_subject("default", "ns", &format!("t{i}")), "{}").await;
    }
    eventually(WAIT, "dlq_growing alert", || async { count(&hook.messages(), "dlq_growing") == 1 }).await;

    // A leader appears: the gauge follows the lease.
    let record = LeaderRecord { instance: "s1".into(), term: 1, acquired_at: Utc::now(), lease_ms: 3000 };
    topology.leader.put(names.leader_key(), serde_json::to_vec(&record).unwrap().into()).await.unwrap();
    eventually(WAIT, "leader_present 1", || async {
        metric_value(&alerter.metrics().await, "jetsched_leader_present") == Some(1.0)
    })
    .await;
    let metrics = alerter.metrics().await;
    assert_eq!(metric_value(&metrics, "jetsched_queue_depth{queue=\"default\"}"), Some(5.0), "{metrics}");
    assert_eq!(metric_value(&metrics, "jetsched_dlq_depth"), Some(2.0));
    assert_eq!(
        metric_value(&metrics, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"no_leader\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&metrics, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"queue_backlog\"}"),
        Some(1.0)
    );
    // One alert per episode, however many checks saw it.
    assert_eq!(count(&hook.messages(), "queue_backlog"), 1);
    assert_eq!(count(&hook.messages(), "no_leader"), 1);
    alerter.stop().await;
}

/// A dead-letter stream close to its byte limit (it then refuses new dead letters) is critical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nearly_full_dead_letter_stream_alerts() {
    let Setup { server: _server, js, names, subscriber, mut config } = subscribed().await;
    config.shared.topology.dlq_max_bytes = 8 * 1024;
    let alerter = App::alerter(config).await;
    eventually(WAIT, "the limit is seen", || async {
        metric_value(&alerter.metrics().await, "jetsched_dlq_max_bytes") == Some(8192.0)
    })
    .await;
    let entry = "x".repeat(1024);
    let mut stored = 0;
    for i in 0..16 {
        let ack = js
            .publish(names.dlq_subject("default", "ns", &format!("t{i}")), entry.clone().into())
            .await
            .unwrap();
        match ack.await {
            Ok(_) => stored += 1,
            Err(_) => break, // full: discard new
        }
    }
    assert!(stored >= 6, "{stored}");
    let full = eventually(WAIT, "dlq_full alert", || async {
        subscriber.messages().into_iter().find(|(_, m)| m.rule == "dlq_full")
    })
    .await;
    assert_eq!(full.0, names.alert_subject("critical"));
    assert!(full.1.text.contains("% full"), "{}", full.1.text);
    let metrics = alerter.metrics().await;
    assert!(metric_value(&metrics, "jetsched_dlq_bytes") >= Some(0.9 * 8192.0), "{metrics}");
    alerter.stop().await;
}
