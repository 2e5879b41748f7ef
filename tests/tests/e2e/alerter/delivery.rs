//! What happens to raised alerts on their way out: de-duplication with repeat counts, the
//! rate limit and its summary, grouping, a slow or down webhook, and a graceful stop that
//! sends what still waits.

use std::time::Duration;

use jetsched_shared::alert::RATE_LIMIT_SUMMARY;
use jetsched_shared::wire::EventKind;
use jetsched_tests::{App, eventually, metric_value};

use super::{
    Hook, HookMode, Setup, Subscriber, WAIT, alerted_exactly, config, count, hooked_config, publish_event,
    rules_of, run_event, start, subscribed, suppressed_total, times,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_failures_of_one_task_make_one_alert_with_a_repeat_count() {
    let (server, _client, js, names) = start().await;
    let hook = Hook::start(HookMode::Ok).await;
    let mut config = hooked_config(&server, &hook);
    config.dedup_window = Duration::from_secs(8);
    let alerter = App::alerter(config).await;

    for _ in 0..100 {
        publish_event(&js, &names, &run_event(EventKind::RunFailed, "billing", "flaky")).await;
    }
    eventually(WAIT, "all 100 failures consumed", || async {
        metric_value(&alerter.metrics().await, "jetsched_alerts_raised_total{rule=\"run_failed\"}")
            == Some(100.0)
    })
    .await;
    eventually(WAIT, "the first alert", || async { count(&hook.messages(), "run_failed") == 1 }).await;
    let first = hook.messages();
    assert_eq!(count(&first, "run_failed"), 1, "one alert inside the window");
    assert_eq!(first[0].alerts[0].repeats, 0);
    // When the window closes the repeats are reported in a follow-up.
    let follow_up = eventually(WAIT, "follow-up with the repeat count", || async {
        hook.messages().into_iter().find(|m| m.alerts.first().is_some_and(|a| a.repeats > 0))
    })
    .await;
    assert_eq!(follow_up.alerts[0].repeats, 99);
    assert!(follow_up.text.contains("repeated 99"), "{}", follow_up.text);
    let metrics = alerter.metrics().await;
    assert_eq!(suppressed_total(&metrics, "dedup", "run_failed"), Some(99.0));
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_is_rate_limited_with_a_summary_and_a_rule_is_grouped() {
    let (server, _client, js, names) = start().await;
    let hook = Hook::start(HookMode::Ok).await;
    let mut config = hooked_config(&server, &hook);
    config.rate_limit = 5;
    config.summary_interval = Duration::from_secs(4);
    let alerter = App::alerter(config).await;

    for i in 0..30 {
        publish_event(&js, &names, &run_event(EventKind::RunDead, "storm", &format!("t{i}"))).await;
    }
    let summary = eventually(WAIT, "rate limit summary", || async {
        hook.messages().into_iter().find(|m| m.rule == RATE_LIMIT_SUMMARY)
    })
    .await;
    let messages = hook.messages();
    assert_eq!(count(&messages, "run_dead"), 5, "at most the rate limit");
    let suppressed = summary.suppressed.expect("summary counts");
    assert_eq!(suppressed.total, 25);
    assert_eq!(suppressed.by_rule["run_dead"], 25);
    assert!(summary.text.contains("25"), "{}", summary.text);
    let metrics = alerter.metrics().await;
    assert_eq!(suppressed_total(&metrics, "rate_limit", "run_dead"), Some(25.0));
    alerter.stop().await;

    // Grouping: many alerts of one rule within group_wait become one message.
    let hook = Hook::start(HookMode::Ok).await;
    let mut config = hooked_config(&server, &hook);
    config.group_wait = Duration::from_secs(1);
    let alerter = App::alerter(config).await;
    for i in 0..20 {
        publish_event(&js, &names, &run_event(EventKind::RunFailed, "group", &format!("t{i}"))).await;
    }
    let grouped = eventually(WAIT, "grouped message", || async {
        hook.messages().into_iter().find(|m| m.rule == "run_failed")
    })
    .await;
    assert_eq!(grouped.alerts.len(), 20, "{}", grouped.text);
    assert!(grouped.text.contains("20 alerts"), "{}", grouped.text);
    alerted_exactly(|| rules_of(hook.messages()), &[("run_failed", 1)]).await;
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_or_slow_webhook_does_not_block_nats_alerts() {
    let (server, client, js, names) = start().await;
    let slow = Hook::start(HookMode::Slow(Duration::from_secs(8))).await;
    // A port nobody listens on.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let subscriber = Subscriber::start(&client, &names).await;
    let mut config = config(&server);
    config.webhook_urls = vec![slow.url(), format!("http://{down}/hook")];
    config.webhook_timeout = Duration::from_secs(30);
    config.webhook_attempts = 2;
    config.webhook_backoff = Duration::from_millis(100);
    config.webhook_queue = 4;
    let alerter = App::alerter(config).await;

    for i in 0..20 {
        publish_event(&js, &names, &run_event(EventKind::RunDead, "ns", &format!("t{i}"))).await;
    }
    eventually(WAIT, "all 20 alerts on NATS", || async { times(&subscriber.rules(), "run_dead") == 20 })
        .await;
    // All on NATS while the slow webhook still works on its first message.
    assert!(slow.messages().is_empty(), "the slow webhook is still on its first message");
    let down_channel = format!("webhook:127.0.0.1:{}", down.port());
    let slow_channel = format!("webhook:127.0.0.1:{}", slow.addr.port());
    eventually(WAIT, "the down webhook's failures are counted", || async {
        let metrics = alerter.metrics().await;
        metric_value(
            &metrics,
            &format!("jetsched_alert_channel_failures_total{{channel=\"{down_channel}\"}}"),
        ) >= Some(1.0)
    })
    .await;
    let metrics = alerter.metrics().await;
    // The slow webhook's queue (4) overflowed: the rest were dropped for it only.
    assert!(
        metric_value(
            &metrics,
            &format!("jetsched_alert_channel_dropped_total{{channel=\"{slow_channel}\"}}")
        ) >= Some(10.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"run_dead\"}"),
        Some(20.0)
    );
    // The slow webhook gets what it had queued.
    eventually(WAIT, "slow webhook delivers", || async { !slow.messages().is_empty() }).await;
    alerter.cancel();
    drop(alerter);
}

/// A graceful stop sends what still waits for its group, so a claimed window never hides an
/// alert that was not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_sends_waiting_groups() {
    let Setup { server: _server, js, names, subscriber, mut config } = subscribed().await;
    config.group_wait = Duration::from_secs(60);
    let alerter = App::alerter(config).await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "ns", "waiting")).await;
    eventually(WAIT, "the event is consumed", || async {
        metric_value(&alerter.metrics().await, "jetsched_alerts_raised_total{rule=\"run_dead\"}") == Some(1.0)
    })
    .await;
    assert!(subscriber.rules().is_empty(), "still grouping");
    alerter.stop().await;
    eventually(WAIT, "sent at shutdown", || async { subscriber.rules() == ["run_dead"] }).await;
}
