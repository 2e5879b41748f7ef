//! Registry, scheduler, worker and alerter together: failing runs and a failover raise their
//! alerts, and every service's metrics tell the same story.

use std::time::Duration;

use jetsched_tests::{App, NatsServer, eventually, metric_value};

use super::{Hook, HookMode, Subscriber, WAIT, count, hooked_config, start};

async fn start_scheduler(server: &NatsServer, instance: &str) -> App {
    let mut config = jetsched_scheduler::Config::for_tests(&server.url());
    config.shared.common.instance_id = Some(instance.to_string());
    App::scheduler(config).await
}

/// Registry, scheduler, worker and alerter together: a task whose runs always fail raises
/// run_failed, run_dead and dlq_growing; stopping the only scheduler raises no_leader, and a
/// new one leader_changed; every service's /metrics tells the same story.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_stack_failures_and_failover_alert_and_show_in_every_services_metrics() {
    let (server, client, _, names) = start().await;
    let hook = Hook::start(HookMode::Ok).await;
    let subscriber = Subscriber::start(&client, &names).await;

    let mut scheduler = start_scheduler(&server, "sched-1").await;
    eventually(WAIT, "scheduler leads", || async {
        scheduler.metric("jetsched_scheduler_is_leader").await == Some(1.0)
    })
    .await;
    let mut config = hooked_config(&server, &hook);
    config.no_leader_after = Duration::from_secs(1);
    // Short windows: the failover below is a new leader change, not a repeat of sched-1's.
    config.dedup_window = Duration::from_secs(2);
    let alerter = App::alerter(config).await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let worker = App::worker(
        jetsched_worker::Config::for_tests(&server.url(), "worker-1"),
        jetsched_worker::Handlers::new(),
    )
    .await;

    // Every second, a POST to a port nobody listens on, with a single attempt.
    let closed = jetsched_tests::free_addr();
    let spec = serde_json::json!({
        "id": "broken", "namespace": "e2e",
        "schedule": {"every": "1s"},
        "executor": {"kind": "http", "method": "POST", "url": format!("http://{closed}/run")},
        "retry": {"max_attempts": 1},
        "timeout": "2s",
    });
    let reply = jetsched_tests::Api::new(&client).put(&spec).await;
    assert!(reply.get("revision").is_some(), "{reply}");

    eventually(
        Duration::from_secs(20),
        "run_failed, run_dead and dlq_growing on the webhook and NATS",
        || async {
            let hooked = hook.messages();
            let published = subscriber.rules();
            ["run_failed", "run_dead", "dlq_growing"]
                .iter()
                .all(|rule| count(&hooked, rule) >= 1 && published.iter().any(|r| r == rule))
        },
    )
    .await;
    let dead = hook.messages().into_iter().find(|m| m.rule == "run_dead").unwrap();
    assert_eq!((dead.alerts[0].namespace.as_str(), dead.alerts[0].task_id.as_str()), ("e2e", "broken"));
    assert!(dead.alerts[0].details.contains_key("execution_id"), "{dead:?}");

    // Failover: the only scheduler stops (releasing the lease); a new one takes over.
    std::mem::replace(&mut scheduler, start_scheduler(&server, "sched-2").await).stop().await;
    let rules = eventually(WAIT, "leader_changed on NATS", || async {
        let rules = subscriber.rules();
        rules.iter().any(|r| r == "leader_changed").then_some(rules)
    })
    .await;
    // sched-2 was waiting as a follower: it takes the lease at once, so no_leader stays quiet.
    assert!(!rules.iter().any(|r| r == "no_leader"), "{rules:?}");
    // sched-1's acquisition (before the alerter started) comes from the replayed history;
    // sched-2's follows.
    eventually(WAIT, "leader_changed to sched-2 on the webhook", || async {
        hook.messages()
            .iter()
            .filter(|m| m.rule == "leader_changed")
            .any(|m| m.alerts.iter().any(|a| a.details["instance"] == "sched-2"))
    })
    .await;

    // Now no scheduler at all: fatal after a second.
    scheduler.stop().await;
    let fatal = eventually(WAIT, "no_leader", || async {
        subscriber.messages().into_iter().find(|(_, m)| m.rule == "no_leader")
    })
    .await;
    assert_eq!(fatal.0, names.alert_subject("fatal"));

    // Every service's metrics after the scenario.
    let text = registry.metrics().await;
    assert_eq!(
        metric_value(&text, "jetsched_api_requests_total{endpoint=\"put\",outcome=\"ok\"}"),
        Some(1.0),
        "{text}"
    );
    let text = worker.metrics().await;
    assert!(
        metric_value(
            &text,
            "jetsched_worker_runs_total{outcome=\"failed\",priority=\"normal\",queue=\"default\"}"
        ) >= Some(1.0),
        "{text}"
    );
    assert!(
        metric_value(&text, "jetsched_worker_dead_letters_total{source=\"verdict\"}") >= Some(1.0),
        "{text}"
    );
    let text = alerter.metrics().await;
    assert_eq!(metric_value(&text, "jetsched_leader_present"), Some(0.0), "{text}");
    assert!(metric_value(&text, "jetsched_dlq_depth") >= Some(1.0), "{text}");
    assert!(metric_value(&text, "jetsched_alerts_raised_total{rule=\"run_failed\"}") >= Some(1.0), "{text}");
    assert!(
        metric_value(&text, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"run_dead\"}") >= Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"no_leader\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric_value(&text, "jetsched_queue_depth{queue=\"default\"}"), Some(0.0), "{text}");
    for service in [&registry, &worker, &alerter] {
        assert!(service.ready().await);
    }
    worker.stop().await;
    registry.stop().await;
    alerter.stop().await;
}
