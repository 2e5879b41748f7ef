//! State that outlives one alerter: a restarted alerter (in-process or a real process killed
//! with SIGKILL) does not resend, and two replicas send each alert once.

use std::net::SocketAddr;
use std::time::Duration;

use jetsched_shared::wire::EventKind;
use jetsched_tests::{App, ChildProcess, NatsServer, admin_get, eventually, metric_value};

use super::{
    Setup, Subscriber, WAIT, alerted_exactly, leader_acquired, publish_event, run_event, start, subscribed,
    suppressed_total, times,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_alerter_does_not_resend() {
    let Setup { server: _server, js, names, subscriber, mut config } = subscribed().await;
    config.no_leader_after = Duration::from_millis(500);
    config.flap_changes = 2;
    let alerter = App::alerter(config.clone()).await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "billing", "invoice")).await;
    publish_event(&js, &names, &leader_acquired("s1", 1)).await;
    publish_event(&js, &names, &leader_acquired("s2", 2)).await;
    eventually(WAIT, "first alerts", || async {
        let rules = subscriber.rules();
        ["run_dead", "no_leader", "leader_changed"].iter().all(|rule| rules.iter().any(|r| r == rule))
    })
    .await;
    assert!(!subscriber.rules().iter().any(|r| r == "leader_flapping"));
    alerter.stop().await;
    // The windows are in the alerter's bucket.
    let bucket = js.get_key_value(names.alerter_bucket()).await.expect("alerter bucket");
    assert!(bucket.get("run_dead.billing.invoice").await.unwrap().is_some());

    let alerter = App::alerter(config).await;
    // Same condition and same failure again: both within their windows.
    publish_event(&js, &names, &run_event(EventKind::RunDead, "billing", "invoice")).await;
    // The third change in the window: the restarted alerter replayed the first two.
    publish_event(&js, &names, &leader_acquired("s1", 3)).await;
    eventually(WAIT, "flapping from the replayed history", || async {
        subscriber.rules().iter().any(|r| r == "leader_flapping")
    })
    .await;
    eventually(WAIT, "the restarted alerter saw both", || async {
        let metrics = alerter.metrics().await;
        both_deduped(&metrics)
    })
    .await;
    alerted_exactly(|| subscriber.rules(), &[("run_dead", 1), ("no_leader", 1), ("leader_changed", 1)]).await;
    alerter.stop().await;
}

/// Two replicas share the durable consumer and the dedup bucket: each run failure is alerted
/// once, and a condition both replicas see (no leader) and a leader change both replicas read
/// are alerted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_each_alert_once() {
    let Setup { server: _server, js, names, subscriber, mut config } = subscribed().await;
    config.no_leader_after = Duration::from_millis(500);
    let mut second = config.clone();
    config.shared.common.instance_id = Some("alerter-a".into());
    second.shared.common.instance_id = Some("alerter-b".into());
    let a = App::alerter(config).await;
    let b = App::alerter(second).await;

    for i in 0..10 {
        publish_event(&js, &names, &run_event(EventKind::RunDead, "ns", &format!("t{i}"))).await;
    }
    publish_event(&js, &names, &leader_acquired("s1", 1)).await;
    eventually(WAIT, "ten dead runs, a leader change and no leader", || async {
        let rules = subscriber.rules();
        times(&rules, "run_dead") == 10
            && rules.iter().any(|r| r == "leader_changed")
            && rules.iter().any(|r| r == "no_leader")
    })
    .await;
    // Both replicas raised the leader change and the missing leader; one claimed each.
    eventually(WAIT, "both replicas raised them", || async {
        let (ma, mb) = (a.metrics().await, b.metrics().await);
        ["leader_changed", "no_leader"].iter().all(|rule| {
            let series = format!("jetsched_alerts_raised_total{{rule=\"{rule}\"}}");
            metric_value(&ma, &series) == Some(1.0) && metric_value(&mb, &series) == Some(1.0)
        })
    })
    .await;
    alerted_exactly(|| subscriber.rules(), &[("run_dead", 10), ("leader_changed", 1), ("no_leader", 1)])
        .await;
    let messages = subscriber.messages();
    let senders: std::collections::BTreeSet<_> =
        messages.iter().filter(|(_, m)| m.rule == "run_dead").map(|(_, m)| m.instance.clone()).collect();
    assert!(!senders.is_empty());
    a.stop().await;
    b.stop().await;
}

/// Whether one repeat of the dead run and one of the missing leader were suppressed.
fn both_deduped(metrics: &str) -> bool {
    suppressed_total(metrics, "dedup", "run_dead") == Some(1.0)
        && suppressed_total(metrics, "dedup", "no_leader") == Some(1.0)
}

/// Starts the real binary and waits until it is ready.
async fn start_alerter_process(server: &NatsServer, admin: SocketAddr, what: &str) -> ChildProcess {
    let mut command = ChildProcess::command("jetsched-alerter");
    command
        .env("NATS_URL", server.url())
        .env("JETSCHED_ADMIN_ADDR", admin.to_string())
        .env("JETSCHED_ALERTER_GROUP_WAIT", "0s")
        .env("JETSCHED_ALERTER_CHECK_INTERVAL", "200ms")
        .env("JETSCHED_ALERTER_NO_LEADER_AFTER", "500ms");
    let process = ChildProcess::spawn_command("jetsched-alerter", command);
    eventually(WAIT, what, || async { admin_get(admin, "/readyz").await.is_ok_and(|reply| reply.is_ok()) })
        .await;
    process
}

/// The real binary, killed with SIGKILL and started again, does not resend what it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_alerter_process_does_not_resend_after_restart() {
    let (server, client, js, names) = start().await;
    let subscriber = Subscriber::start(&client, &names).await;
    let admin = jetsched_tests::free_addr();
    let mut process = start_alerter_process(&server, admin, "the alerter process is ready").await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "billing", "invoice")).await;
    eventually(WAIT, "run_dead and no_leader from the process", || async {
        let rules = subscriber.rules();
        rules.iter().any(|r| r == "run_dead") && rules.iter().any(|r| r == "no_leader")
    })
    .await;
    process.kill9();

    let mut process = start_alerter_process(&server, admin, "the restarted process is ready").await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "billing", "invoice")).await;
    eventually(WAIT, "the restarted process suppressed both", || async {
        let metrics = admin_get(admin, "/metrics").await.map(|reply| reply.body).unwrap_or_default();
        both_deduped(&metrics)
    })
    .await;
    let rules = subscriber.rules();
    assert_eq!(times(&rules, "run_dead"), 1, "{rules:?}");
    assert_eq!(times(&rules, "no_leader"), 1, "{rules:?}");
    process.sigterm();
    let status = process.wait_exit(WAIT).await.expect("stops on SIGTERM");
    assert!(status.success(), "{}", process.output());
}
