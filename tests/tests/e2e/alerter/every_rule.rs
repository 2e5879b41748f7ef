//! Every default rule from the real event to the alert stored in the alerts stream: the
//! producing service raises the condition where that is cheap (a worker's failing runs, dead
//! letters and opened breaker, a scheduler's lease, late fires after a failover and skewed
//! clock, a queue nobody pulls, a restarted server), and the test reads `JETSCHED_ALERTS`
//! back. Only the nearly full dead-letter stream is filled by the test itself.

use std::process::Command;
use std::time::Duration;

use async_nats::jetstream;
use jetsched_alerter::{Config, rules::Rule};
use jetsched_shared::alert::AlertMessage;
use jetsched_shared::names::{Names, task_key};
use jetsched_tests::fixtures::{dispatch, spec};
use jetsched_tests::{App, ChildProcess, NatsServer, eventually, read_stream, workspace_bin};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use super::{config, start};

const WAIT: Duration = Duration::from_secs(30);

/// Where Debian's `faketime` package puts the library (the clock guard's tests use it too).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Every rule is on by default: each has its test below.
#[test]
fn every_rule_is_on_by_default() {
    assert_eq!(Config::for_tests("nats://127.0.0.1:1").rules, Rule::ALL);
}

/// The first alert message of `rule` stored in the alerts stream, once there is one.
async fn stored(js: &jetstream::Context, rule: &str) -> AlertMessage {
    let stream = Names::default().alerts_stream();
    eventually(WAIT, &format!("a {rule} alert stored in {stream}"), || async {
        let messages = read_stream(js, &stream, Duration::from_secs(2)).await.ok()?;
        messages
            .iter()
            .filter_map(|m| serde_json::from_slice::<AlertMessage>(&m.payload).ok())
            .find(|m| m.rule == rule)
    })
    .await
}

fn worker_config(server: &NatsServer, instance: &str) -> jetsched_worker::Config {
    let mut config = jetsched_worker::Config::for_tests(&server.url(), instance);
    config.pull_expires = Duration::from_millis(500);
    config
}

/// An alerter with the fast settings, then a worker whose `fail` handler always fails for
/// good; one run of `alerts/broken` is dispatched as the scheduler does. The worker records
/// the run as failed (`run.failed`) and dead-letters it (`run.dead`, one more DLQ entry).
async fn failing_run(rule: Rule) {
    let (server, _client, js, names) = start().await;
    let alerter = App::alerter(config(&server)).await;
    // The alerter sees the dead-letter stream empty before it grows.
    eventually(WAIT, "the alerter read the dead-letter stream", || async {
        alerter.metric("jetsched_dlq_depth").await == Some(0.0)
    })
    .await;
    let handlers = Handlers::new()
        .register("fail", |_run: RunContext| async move { Outcome::permanent("the downstream refused") });
    let worker = App::worker(worker_config(&server, "alert-w1"), handlers).await;
    let task = spec("alerts", "broken").handler("fail").fast_retry(1).task();
    dispatch(&js, &names, &task, chrono::Utc::now().timestamp_millis()).await;

    let message = stored(&js, rule.name()).await;
    assert_eq!(message.severity, rule.severity());
    if rule != Rule::DlqGrowing {
        assert_eq!(
            (message.alerts[0].namespace.as_str(), message.alerts[0].task_id.as_str()),
            ("alerts", "broken")
        );
    }
    worker.stop().await;
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_failed_from_a_workers_failed_run() {
    failing_run(Rule::RunFailed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_dead_from_a_workers_dead_letter() {
    failing_run(Rule::RunDead).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_growing_from_a_workers_dead_letter() {
    failing_run(Rule::DlqGrowing).await;
}

/// A real worker behind a failing HTTP downstream opens the task's breaker (four failed
/// attempts of four within the window); the worker publishes `breaker.opened`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_open_from_a_workers_opened_breaker() {
    let (server, _client, js, names) = start().await;
    let alerter = App::alerter(config(&server)).await;
    // Nobody listens on this port: every attempt fails.
    let closed = jetsched_tests::free_addr();
    let worker = App::worker(worker_config(&server, "alert-w1"), Handlers::new()).await;
    let task = spec("alerts", "payments")
        .executor(json!({"kind": "http", "method": "POST", "url": format!("http://{closed}/pay")}))
        .fast_retry(30)
        .field("breaker", json!({"min_runs": 4, "failure_rate": 0.5, "window": "10s", "open_for": "30s"}))
        .task();
    let base = chrono::Utc::now().timestamp_millis();
    for n in 0..6 {
        dispatch(&js, &names, &task, base + n).await;
    }

    let message = stored(&js, "breaker_open").await;
    let alert = &message.alerts[0];
    assert_eq!((alert.namespace.as_str(), alert.task_id.as_str()), ("alerts", "payments"));
    assert_eq!(alert.details.get("key").map(String::as_str), Some("task.alerts.payments"));
    assert!(message.text.contains("circuit breaker"), "{}", message.text);
    worker.stop().await;
    alerter.stop().await;
}

/// A scheduler process whose wall clock runs 5 s ahead (libfaketime, as the clock guard's
/// tests do) measures its offset from the server and publishes `scheduler.clock_skew`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skew_from_a_skewed_scheduler() {
    assert!(std::path::Path::new(LIBFAKETIME).exists(), "{LIBFAKETIME} is missing: apt-get install faketime");
    let (server, _client, js, _names) = start().await;
    let alerter = App::alerter(config(&server)).await;
    let mut command = Command::new(workspace_bin("jetsched-scheduler"));
    command
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME", "+5s")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("NATS_URL", server.url())
        .args(["--instance-id", "ahead", "--admin-addr", "127.0.0.1:0", "--fire-events", "false"]);
    let scheduler = ChildProcess::spawn_command("ahead", command);

    let message = stored(&js, "clock_skew").await;
    assert_eq!(message.alerts[0].task_id, "ahead");
    assert!(message.text.contains("clock skewed"), "{}", message.text);
    drop(scheduler);
    alerter.stop().await;
}

fn scheduler_config(server: &NatsServer, instance: &str) -> jetsched_scheduler::Config {
    let mut config = jetsched_scheduler::Config::for_tests(&server.url());
    config.shared.common.instance_id = Some(instance.to_string());
    config
}

/// A failover with a gap: scheduler `sched-1` leads and fires `alerts/tick` every second, stops
/// (releasing the lease), and `sched-2` starts three seconds later, taking the lease and
/// dispatching the fires of the gap late. On the way: two `leader.acquired` events (a change,
/// and flapping at more than one change), three seconds without a holder, late
/// `fire.dispatched` events.
async fn failover_with_a_gap(rule: Rule) {
    let (server, _client, js, names) = start().await;
    let mut config = config(&server);
    config.no_leader_after = Duration::from_secs(1);
    config.fire_lag = Duration::from_secs(1);
    config.flap_changes = 1;
    let alerter = App::alerter(config).await;
    let tasks = js.get_key_value(names.tasks_bucket()).await.expect("tasks bucket");
    let tick = spec("alerts", "tick").every("1s").misfire("fire_all");
    tasks.put(task_key("alerts", "tick"), tick.bytes().into()).await.expect("put task");

    let first = App::scheduler(scheduler_config(&server, "sched-1")).await;
    eventually(WAIT, "sched-1 leads", || async {
        first.metric("jetsched_scheduler_is_leader").await == Some(1.0)
    })
    .await;
    eventually(WAIT, "sched-1 dispatched two fires", || async {
        first.metric("jetsched_fires_dispatched_total{trigger=\"schedule\"}").await.is_some_and(|n| n >= 2.0)
    })
    .await;
    first.stop().await;
    // Three seconds without a leader: the gap itself is what the rules see.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = App::scheduler(scheduler_config(&server, "sched-2")).await;

    let message = stored(&js, rule.name()).await;
    assert_eq!(message.severity, rule.severity());
    if rule == Rule::FireLag {
        let alert = &message.alerts[0];
        assert_eq!((alert.namespace.as_str(), alert.task_id.as_str()), ("alerts", "tick"));
        assert!(alert.details["lag_ms"].parse::<i64>().expect("lag_ms") > 1_000, "{alert:?}");
    }
    second.stop().await;
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_changed_from_a_schedulers_lease() {
    failover_with_a_gap(Rule::LeaderChanged).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_flapping_from_a_failover() {
    failover_with_a_gap(Rule::LeaderFlapping).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leader_from_a_failover_gap() {
    failover_with_a_gap(Rule::NoLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_lag_from_the_fires_of_a_failover_gap() {
    failover_with_a_gap(Rule::FireLag).await;
}

/// A worker binds the queue's consumer and stops; dispatches then wait with nobody pulling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_backlog_from_dispatches_nobody_pulls() {
    let (server, _client, js, names) = start().await;
    let worker = App::worker(worker_config(&server, "alert-w1"), Handlers::new()).await;
    worker.stop().await;
    let mut config = config(&server);
    config.backlog_threshold = 3;
    config.backlog_for = Duration::from_millis(500);
    let alerter = App::alerter(config).await;
    let task = spec("alerts", "waiting").task();
    let base = chrono::Utc::now().timestamp_millis();
    for n in 0..5 {
        dispatch(&js, &names, &task, base + n).await;
    }

    let message = stored(&js, "queue_backlog").await;
    assert_eq!(message.alerts[0].details["queue"], "default");
    assert_eq!(message.alerts[0].details["pending"], "5");
    alerter.stop().await;
}

/// Two runs of one concurrency key of limit 1: the first holds its slot, the second waits
/// longer than the threshold; the alert goes to the waiting run's team and task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_waiting_from_a_run_waiting_for_a_slot() {
    let (server, _client, js, names) = start().await;
    let mut config = config(&server);
    config.limit_wait = Duration::from_secs(1);
    let alerter = App::alerter(config).await;
    let handlers = Handlers::new().register("hold", |_run: RunContext| async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        Outcome::ok()
    });
    let worker = App::worker(worker_config(&server, "alert-w1"), handlers).await;
    let one = serde_json::json!({"key": "payments", "limit": 1});
    let task = |id: &str| spec("alerts", id).handler("hold").field("concurrency", one.clone()).task();
    let now = chrono::Utc::now().timestamp_millis();
    dispatch(&js, &names, &task("first"), now).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = dispatch(&js, &names, &task("second"), now).await;

    let message = stored(&js, "limit_waiting").await;
    let alert = &message.alerts[0];
    assert_eq!(message.severity, Rule::LimitWaiting.severity());
    assert_eq!((alert.namespace.as_str(), alert.task_id.as_str()), ("alerts", "second"));
    assert_eq!(alert.details["key"], "alerts.payments");
    assert_eq!(alert.details["execution_id"], waiting);
    assert_eq!((alert.details["in_use"].as_str(), alert.details["limit"].as_str()), ("1", "1"));
    worker.stop().await;
    alerter.stop().await;
}

/// A real registry's fan-in whose second parent never runs: the wait gives up after `within`,
/// the registry publishes `after.expired`, and the alert names the child and the missing parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_expired_from_a_registrys_wait_that_gave_up() {
    let (server, client, js, _names) = start().await;
    let alerter = App::alerter(config(&server)).await;
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    eventually(WAIT, "the registry is ready", || registry.ready()).await;
    let handlers = Handlers::new().register("ok", |_run: RunContext| async move { Outcome::ok() });
    let worker = App::worker(worker_config(&server, "alert-w1"), handlers).await;
    let api = jetsched_tests::Api::new(&client);
    for id in ["left", "right"] {
        api.store(&spec("alerts", id).cron("0 0 0 1 1 *").handler("ok").json()).await;
    }
    let join = spec("alerts", "join")
        .without("schedule")
        .field("after", json!({"tasks": ["left", "right"], "within": "1s"}))
        .handler("ok");
    api.store(&join.json()).await;
    let triggered = api.task("trigger", json!({"namespace": "alerts", "id": "left"})).await;
    assert!(triggered.get("error").is_none(), "{triggered}");

    let message = stored(&js, "after_expired").await;
    assert_eq!(message.severity, Rule::AfterExpired.severity());
    let alert = &message.alerts[0];
    assert_eq!((alert.namespace.as_str(), alert.task_id.as_str()), ("alerts", "join"));
    let text = format!("{} {:?}", message.text, alert.details);
    assert!(text.contains("alerts/right"), "the missing parent is named: {text}");
    worker.stop().await;
    registry.stop().await;
    alerter.stop().await;
}

/// Dead letters fill the stream past nine tenths of its byte limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_full_from_a_nearly_full_dead_letter_stream() {
    let (server, _client, js, names) = start().await;
    let mut config = config(&server);
    config.shared.topology.dlq_max_bytes = 8 * 1024;
    let alerter = App::alerter(config).await;
    let entry = "x".repeat(1024);
    for i in 0..16 {
        let ack = js.publish(names.dlq_subject("default", "alerts", &format!("t{i}")), entry.clone().into());
        if ack.await.expect("publish dead letter").await.is_err() {
            break; // full: discard new
        }
    }

    let message = stored(&js, "dlq_full").await;
    assert!(message.text.contains("% full"), "{}", message.text);
    alerter.stop().await;
}

/// The server goes away: JetStream does not answer the alerter's checks. The alert is stored
/// once the server is back (the NATS channel retries its publish).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_unavailable_from_a_server_that_went_away() {
    let (mut server, _client, js, _names) = start().await;
    let alerter = App::alerter(config(&server)).await;
    eventually(WAIT, "the alerter ran a check", || async {
        alerter.metric("jetsched_dlq_depth").await == Some(0.0)
    })
    .await;
    server.kill();
    // Back once a check has found it gone (a check may wait behind the reopening of the
    // lease watch and the leader events, each waiting out its request's timeout).
    eventually(WAIT, "the alerter raised jetstream_unavailable", || async {
        alerter.metric("jetsched_alerts_raised_total{rule=\"jetstream_unavailable\"}").await == Some(1.0)
    })
    .await;
    server.restart().await;

    let message = stored(&js, "jetstream_unavailable").await;
    assert_eq!(message.alerts[0].task_id, "jetstream");
    alerter.stop().await;
}
