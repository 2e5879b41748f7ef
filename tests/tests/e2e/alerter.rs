//! End-to-end tests of jetsched-alerter against a real nats-server: every rule, driven by
//! events, dead letters, queue consumers and the lease published straight to JetStream (and a
//! full-stack scenario with the registry, scheduler and worker), reaches a local webhook
//! receiver and a NATS subscriber; de-duplication, grouping, the rate limit, restarts, a down
//! or slow webhook, metrics and readiness.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use futures::StreamExt;
use jetsched_alerter::{Config, build};
use jetsched_shared::alert::{AlertMessage, RATE_LIMIT_SUMMARY, Severity};
use jetsched_shared::names::{Names, SYSTEM_NAMESPACE};
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_shared::wire::{Event, EventKind, LeaderRecord};
use jetsched_tests::{ChildProcess, NatsServer, ServerOpts, eventually, init_test_logging};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(15);

// ---- harness ------------------------------------------------------------------------------

/// An alerter running in-process; stopped (and awaited) by `stop`, cancelled on Drop.
struct RunningAlerter {
    shutdown: CancellationToken,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
    admin: SocketAddr,
}

impl RunningAlerter {
    async fn start(config: Config) -> RunningAlerter {
        let alerter = build(config).await.expect("alerter builds");
        let admin = alerter.admin_addr();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(alerter.run(shutdown.clone()));
        RunningAlerter { shutdown, handle: Some(handle), admin }
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        let handle = self.handle.take().expect("running");
        tokio::time::timeout(Duration::from_secs(20), handle)
            .await
            .expect("alerter stops in time")
            .expect("no panic")
            .expect("clean stop");
    }

    async fn metrics(&self) -> String {
        http_get(self.admin, "/metrics").await
    }
}

impl Drop for RunningAlerter {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Fast settings for tests: no grouping, a generous rate limit, quick checks.
fn config(server: &NatsServer) -> Config {
    let mut config = Config::for_tests(&server.url());
    config.group_wait = Duration::ZERO;
    config.rate_limit = 1000;
    config.check_interval = Duration::from_millis(200);
    config
}

/// How the webhook receiver answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HookMode {
    Ok,
    Slow(Duration),
}

/// A local webhook receiver recording every JSON body POSTed to it.
struct Hook {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<AlertMessage>>>,
    _server: JoinHandle<()>,
}

impl Hook {
    async fn start(mode: HookMode) -> Hook {
        let received = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind webhook");
        let addr = listener.local_addr().unwrap();
        let sink = received.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: bytes::Bytes| {
                let sink = sink.clone();
                async move {
                    if let HookMode::Slow(delay) = mode {
                        tokio::time::sleep(delay).await;
                    }
                    let message: AlertMessage =
                        serde_json::from_slice(&body).expect("webhook body is an alert");
                    assert!(!message.text.is_empty(), "Slack-compatible text present");
                    sink.lock().unwrap().push(message);
                    "ok"
                }
            }),
        );
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("webhook server");
        });
        Hook { addr, received, _server: server }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn messages(&self) -> Vec<AlertMessage> {
        self.received.lock().unwrap().clone()
    }
}

/// Every alert message published on `<prefix>.alert.>`, with its subject.
struct Subscriber {
    received: Arc<Mutex<Vec<(String, AlertMessage)>>>,
    _task: JoinHandle<()>,
}

impl Subscriber {
    async fn start(client: &async_nats::Client, names: &Names) -> Subscriber {
        let mut subscription = client.subscribe(names.alerts_wildcard()).await.expect("subscribe alerts");
        client.flush().await.expect("flush");
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        let task = tokio::spawn(async move {
            while let Some(message) = subscription.next().await {
                let alert: AlertMessage = serde_json::from_slice(&message.payload).expect("alert JSON");
                sink.lock().unwrap().push((message.subject.to_string(), alert));
            }
        });
        Subscriber { received, _task: task }
    }

    fn messages(&self) -> Vec<(String, AlertMessage)> {
        self.received.lock().unwrap().clone()
    }

    fn rules(&self) -> Vec<String> {
        self.messages().into_iter().map(|(_, m)| m.rule).collect()
    }
}

async fn publish_event(js: &jetstream::Context, names: &Names, event: &Event) {
    let subject = names.event_subject(event.kind.as_str(), &event.namespace, &event.task_id);
    js.publish(subject, serde_json::to_vec(event).unwrap().into())
        .await
        .expect("publish event")
        .await
        .expect("event stored");
}

fn run_event(kind: EventKind, namespace: &str, task: &str) -> Event {
    Event {
        execution_id: Some(uuid::Uuid::new_v4().to_string()),
        attempt: Some(3),
        worker: Some("worker-1".into()),
        error: Some("HTTP 500 from http://example.invalid".into()),
        ..Event::new(kind, namespace, task)
    }
}

fn leader_acquired(instance: &str, term: u64) -> Event {
    Event {
        instance: Some(instance.into()),
        term: Some(term),
        ..Event::new(EventKind::LeaderAcquired, SYSTEM_NAMESPACE, "scheduler")
    }
}

async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("admin port");
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}

/// The value of a metric line starting with `series` (name and labels as exposed).
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

fn count(messages: &[AlertMessage], rule: &str) -> usize {
    messages.iter().filter(|m| m.rule == rule).count()
}

// ---- tests --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_rules_reach_the_webhook_and_nats() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let hook = Hook::start(HookMode::Ok).await;
    let subscriber = Subscriber::start(&client, &names).await;
    let mut config = config(&server);
    config.webhook_urls = vec![hook.url()];
    config.fire_lag = Duration::from_secs(1);
    config.flap_changes = 2;
    config.flap_window = Duration::from_secs(60);
    let alerter = RunningAlerter::start(config).await;

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
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count(&hook.messages(), "leader_changed"), 1);
    assert_eq!(count(&hook.messages(), "fire_lag"), 1);

    // The alerts stream keeps the history.
    let mut stream = js.get_stream(names.alerts_stream()).await.unwrap();
    assert!(stream.info().await.unwrap().state.messages >= expected.len() as u64);

    let metrics = alerter.metrics().await;
    let channel = format!("webhook:127.0.0.1:{}", hook.addr.port());
    assert_eq!(
        metric(&metrics, &format!("jetsched_alerts_sent_total{{channel=\"{channel}\",rule=\"run_dead\"}}")),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"run_failed\"}"),
        Some(1.0)
    );
    assert_eq!(metric(&metrics, "jetsched_alerts_raised_total{rule=\"leader_changed\"}"), Some(3.0));
    assert_eq!(
        metric(&metrics, "jetsched_alerts_suppressed_total{reason=\"dedup\",rule=\"leader_changed\"}"),
        Some(2.0)
    );
    assert_eq!(metric(&metrics, "jetsched_alerter_events_total{kind=\"fire.dispatched\"}"), Some(2.0));
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condition_rules_fire_from_the_lease_queues_and_dlq() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let topology = topology::ensure(&js, &names, &TopologyArgs::default()).await.expect("topology");
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
    let mut config = config(&server);
    config.webhook_urls = vec![hook.url()];
    config.no_leader_after = Duration::from_secs(1);
    config.backlog_threshold = 3;
    config.backlog_for = Duration::from_millis(500);
    let alerter = RunningAlerter::start(config).await;

    // No lease holder at all: fatal after a second.
    let fatal = eventually(WAIT, "no_leader alert", || async {
        subscriber.messages().into_iter().find(|(_, m)| m.rule == "no_leader")
    })
    .await;
    assert_eq!(fatal.0, names.alert_subject("fatal"));
    assert_eq!(fatal.1.severity, Severity::Fatal);

    for i in 0..5 {
        js.publish(names.dispatch_subject("default", "ns", &format!("t{i}")), "{}".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let backlog = eventually(WAIT, "queue_backlog alert", || async {
        hook.messages().into_iter().find(|m| m.rule == "queue_backlog")
    })
    .await;
    assert_eq!(backlog.alerts[0].details["queue"], "default");
    assert_eq!(backlog.alerts[0].details["pending"], "5");

    // The DLQ grows after the alerter has seen it (the no_leader alert took several checks).
    for i in 0..2 {
        js.publish(names.dlq_subject("default", "ns", &format!("t{i}")), "{}".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    eventually(WAIT, "dlq_growing alert", || async { count(&hook.messages(), "dlq_growing") == 1 }).await;

    // A leader appears: the gauge follows the lease.
    let record = LeaderRecord { instance: "s1".into(), term: 1, acquired_at: Utc::now(), lease_ms: 3000 };
    topology.leader.put(names.leader_key(), serde_json::to_vec(&record).unwrap().into()).await.unwrap();
    eventually(WAIT, "leader_present 1", || async {
        metric(&alerter.metrics().await, "jetsched_leader_present") == Some(1.0)
    })
    .await;
    let metrics = alerter.metrics().await;
    assert_eq!(metric(&metrics, "jetsched_queue_depth{queue=\"default\"}"), Some(5.0), "{metrics}");
    assert_eq!(metric(&metrics, "jetsched_dlq_depth"), Some(2.0));
    assert_eq!(
        metric(&metrics, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"no_leader\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&metrics, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"queue_backlog\"}"),
        Some(1.0)
    );
    // One alert per episode, however many checks saw it.
    assert_eq!(count(&hook.messages(), "queue_backlog"), 1);
    assert_eq!(count(&hook.messages(), "no_leader"), 1);
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_failures_of_one_task_make_one_alert_with_a_repeat_count() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let hook = Hook::start(HookMode::Ok).await;
    let mut config = config(&server);
    config.webhook_urls = vec![hook.url()];
    config.dedup_window = Duration::from_secs(8);
    let alerter = RunningAlerter::start(config).await;

    for _ in 0..100 {
        publish_event(&js, &names, &run_event(EventKind::RunFailed, "billing", "flaky")).await;
    }
    eventually(WAIT, "all 100 failures consumed", || async {
        metric(&alerter.metrics().await, "jetsched_alerts_raised_total{rule=\"run_failed\"}") == Some(100.0)
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
    assert_eq!(
        metric(&metrics, "jetsched_alerts_suppressed_total{reason=\"dedup\",rule=\"run_failed\"}"),
        Some(99.0)
    );
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_is_rate_limited_with_a_summary_and_a_rule_is_grouped() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let hook = Hook::start(HookMode::Ok).await;
    let mut config = config(&server);
    config.webhook_urls = vec![hook.url()];
    config.rate_limit = 5;
    config.summary_interval = Duration::from_secs(4);
    let alerter = RunningAlerter::start(config).await;

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
    assert_eq!(
        metric(&metrics, "jetsched_alerts_suppressed_total{reason=\"rate_limit\",rule=\"run_dead\"}"),
        Some(25.0)
    );
    alerter.stop().await;

    // Grouping: many alerts of one rule within group_wait become one message.
    let hook = Hook::start(HookMode::Ok).await;
    let mut config = self::config(&server);
    config.webhook_urls = vec![hook.url()];
    config.group_wait = Duration::from_secs(1);
    let alerter = RunningAlerter::start(config).await;
    for i in 0..20 {
        publish_event(&js, &names, &run_event(EventKind::RunFailed, "group", &format!("t{i}"))).await;
    }
    let grouped = eventually(WAIT, "grouped message", || async {
        hook.messages().into_iter().find(|m| m.rule == "run_failed")
    })
    .await;
    assert_eq!(grouped.alerts.len(), 20, "{}", grouped.text);
    assert!(grouped.text.contains("20 alerts"), "{}", grouped.text);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&hook.messages(), "run_failed"), 1);
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_alerter_does_not_resend() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let subscriber = Subscriber::start(&client, &names).await;
    let mut config = config(&server);
    config.no_leader_after = Duration::from_millis(500);
    config.flap_changes = 2;
    let alerter = RunningAlerter::start(config.clone()).await;
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

    let alerter = RunningAlerter::start(config).await;
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
        metric(&metrics, "jetsched_alerts_suppressed_total{reason=\"dedup\",rule=\"run_dead\"}") == Some(1.0)
            && metric(&metrics, "jetsched_alerts_suppressed_total{reason=\"dedup\",rule=\"no_leader\"}")
                == Some(1.0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rules = subscriber.rules();
    assert_eq!(rules.iter().filter(|r| *r == "run_dead").count(), 1, "{rules:?}");
    assert_eq!(rules.iter().filter(|r| *r == "no_leader").count(), 1, "{rules:?}");
    assert_eq!(rules.iter().filter(|r| *r == "leader_changed").count(), 1, "{rules:?}");
    alerter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_or_slow_webhook_does_not_block_nats_alerts() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
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
    let alerter = RunningAlerter::start(config).await;

    for i in 0..20 {
        publish_event(&js, &names, &run_event(EventKind::RunDead, "ns", &format!("t{i}"))).await;
    }
    eventually(WAIT, "all 20 alerts on NATS", || async {
        subscriber.rules().iter().filter(|r| *r == "run_dead").count() == 20
    })
    .await;
    // All on NATS while the slow webhook still works on its first message.
    assert!(slow.messages().is_empty(), "the slow webhook is still on its first message");
    let down_channel = format!("webhook:127.0.0.1:{}", down.port());
    let slow_channel = format!("webhook:127.0.0.1:{}", slow.addr.port());
    eventually(WAIT, "the down webhook's failures are counted", || async {
        let metrics = alerter.metrics().await;
        metric(&metrics, &format!("jetsched_alert_channel_failures_total{{channel=\"{down_channel}\"}}"))
            >= Some(1.0)
    })
    .await;
    let metrics = alerter.metrics().await;
    // The slow webhook's queue (4) overflowed: the rest were dropped for it only.
    assert!(
        metric(&metrics, &format!("jetsched_alert_channel_dropped_total{{channel=\"{slow_channel}\"}}"))
            >= Some(10.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"run_dead\"}"),
        Some(20.0)
    );
    // The slow webhook gets what it had queued.
    eventually(WAIT, "slow webhook delivers", || async { !slow.messages().is_empty() }).await;
    alerter.shutdown.cancel();
    drop(alerter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_false_until_the_topology_is_ensured() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    // Something else holds the events stream with settings the topology cannot converge.
    js.create_stream(jetstream::stream::Config {
        name: names.events_stream(),
        subjects: vec![names.events_wildcard()],
        storage: jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap();
    let admin = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let mut config = config(&server);
    config.common.admin_addr = Some(admin);
    let building = tokio::spawn(build(config));
    let not_ready = eventually(WAIT, "/readyz answers 503 during start-up", || async {
        let body = match tokio::net::TcpStream::connect(admin).await {
            Ok(_) => http_get(admin, "/readyz").await,
            Err(_) => String::new(),
        };
        body.contains("503").then_some(body)
    })
    .await;
    assert!(not_ready.contains("\"topology\":false"), "{not_ready}");
    assert!(http_get(admin, "/healthz").await.contains("200 OK"));

    js.delete_stream(names.events_stream()).await.unwrap();
    let alerter =
        tokio::time::timeout(WAIT, building).await.expect("start-up completes").unwrap().expect("builds");
    let ready = http_get(admin, "/readyz").await;
    assert!(ready.contains("200 OK") && ready.contains("\"ready\":true"), "{ready}");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(alerter.run(shutdown.clone()));
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

/// Only a conflicting resource is waited out: a server without room for the streams'
/// `max_bytes` stops the process at once, saying what to change.
#[tokio::test]
async fn a_server_without_room_for_the_streams_stops_the_alerter_at_once_saying_what_to_change() {
    init_test_logging();
    let server =
        NatsServer::start_with(ServerOpts::default().jetstream_config("  max_file_store: 1536MB")).await;
    let mut command = ChildProcess::command("jetsched-alerter");
    command.env("NATS_URL", server.url()).args(["--admin-addr", "127.0.0.1:0"]);
    let mut process = ChildProcess::spawn_command("alerter", command);
    let status = process.wait_exit(Duration::from_secs(20)).await.expect("exits instead of retrying");
    assert!(!status.success());
    let output = process.output();
    for hint in ["JETSCHED_EVENTS", "max_file_store", "--events-max-bytes"] {
        assert!(output.contains(hint), "{hint} missing from:\n{output}");
    }
}

#[tokio::test]
async fn invalid_configuration_is_a_clear_start_up_error() {
    init_test_logging();
    let mut config = Config::for_tests("nats://127.0.0.1:1");
    config.rate_limit = 0;
    config.webhook_urls = vec!["ftp://example.invalid/hook".into()];
    let error = match build(config).await {
        Ok(_) => panic!("an invalid configuration must not start"),
        Err(error) => format!("{error:#}"),
    };
    assert!(error.contains("--rate-limit") && error.contains("ftp"), "{error}");

    let mut process = ChildProcess::spawn("jetsched-alerter", ["--rules", "run_failed,bogus"]);
    let status = process.wait_exit(WAIT).await.expect("exits");
    assert_eq!(status.code(), Some(2));
    assert!(process.output().contains("bogus"), "{}", process.output());
    let mut process = ChildProcess::spawn("jetsched-alerter", ["--rate-limit", "0", "--webhook-url", "nope"]);
    let status = process.wait_exit(WAIT).await.expect("exits");
    assert_eq!(status.code(), Some(2));
    let output = process.output();
    assert!(output.contains("--rate-limit") && output.contains("nope"), "{output}");
}

/// A service of another crate running in-process, for the full-stack scenario.
struct Service {
    shutdown: CancellationToken,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
    admin: SocketAddr,
}

impl Service {
    fn spawn<F>(admin: SocketAddr, run: impl FnOnce(CancellationToken) -> F) -> Service
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(run(shutdown.clone()));
        Service { shutdown, handle: Some(handle), admin }
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        let handle = self.handle.take().expect("running");
        tokio::time::timeout(Duration::from_secs(20), handle)
            .await
            .expect("service stops in time")
            .expect("no panic")
            .expect("clean stop");
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start_scheduler(server: &NatsServer, instance: &str) -> Service {
    let mut config = jetsched_scheduler::Config::for_tests(&server.url());
    config.common.instance_id = Some(instance.to_string());
    let scheduler = jetsched_scheduler::build(config).await.expect("scheduler builds");
    Service::spawn(scheduler.admin_addr(), |token| scheduler.run(token))
}

/// Registry, scheduler, worker and alerter together: a task whose runs always fail raises
/// run_failed, run_dead and dlq_growing; stopping the only scheduler raises no_leader, and a
/// new one leader_changed; every service's /metrics tells the same story.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_stack_failures_and_failover_alert_and_show_in_every_services_metrics() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let names = Names::default();
    let hook = Hook::start(HookMode::Ok).await;
    let subscriber = Subscriber::start(&client, &names).await;

    let mut scheduler = start_scheduler(&server, "sched-1").await;
    eventually(WAIT, "scheduler leads", || async {
        metric(&http_get(scheduler.admin, "/metrics").await, "jetsched_scheduler_is_leader") == Some(1.0)
    })
    .await;
    let mut config = config(&server);
    config.webhook_urls = vec![hook.url()];
    config.no_leader_after = Duration::from_secs(1);
    // Short windows: the failover below is a new leader change, not a repeat of sched-1's.
    config.dedup_window = Duration::from_secs(2);
    let alerter = RunningAlerter::start(config).await;
    let registry = jetsched_registry::build(jetsched_registry::Config::for_tests(&server.url()))
        .await
        .expect("registry builds");
    let registry = Service::spawn(registry.admin_addr(), |token| registry.run(token));
    let worker = jetsched_worker::build(
        jetsched_worker::Config::for_tests(&server.url(), "worker-1"),
        jetsched_worker::Handlers::new(),
    )
    .await
    .expect("worker builds");
    let worker = Service::spawn(worker.admin_addr(), |token| worker.run(token));

    // Every second, a POST to a port nobody listens on, with a single attempt.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let spec = serde_json::json!({
        "id": "broken", "namespace": "e2e",
        "schedule": {"every": "1s"},
        "executor": {"kind": "http", "method": "POST", "url": format!("http://{closed}/run")},
        "retry": {"max_attempts": 1},
        "timeout": "2s",
    });
    let reply = client
        .request(names.task_api_subject("put"), serde_json::to_vec(&spec).unwrap().into())
        .await
        .expect("put answered");
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
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
    let text = http_get(registry.admin, "/metrics").await;
    assert_eq!(
        metric(&text, "jetsched_api_requests_total{endpoint=\"put\",outcome=\"ok\"}"),
        Some(1.0),
        "{text}"
    );
    let text = http_get(worker.admin, "/metrics").await;
    assert!(
        metric(&text, "jetsched_worker_runs_total{outcome=\"failed\",queue=\"default\"}") >= Some(1.0),
        "{text}"
    );
    assert!(metric(&text, "jetsched_worker_dead_letters_total{source=\"verdict\"}") >= Some(1.0), "{text}");
    let text = alerter.metrics().await;
    assert_eq!(metric(&text, "jetsched_leader_present"), Some(0.0), "{text}");
    assert!(metric(&text, "jetsched_dlq_depth") >= Some(1.0), "{text}");
    assert!(metric(&text, "jetsched_alerts_raised_total{rule=\"run_failed\"}") >= Some(1.0), "{text}");
    assert!(
        metric(&text, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"run_dead\"}") >= Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "jetsched_alerts_sent_total{channel=\"nats\",rule=\"no_leader\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric(&text, "jetsched_queue_depth{queue=\"default\"}"), Some(0.0), "{text}");
    for readyz in [registry.admin, worker.admin, alerter.admin] {
        assert!(http_get(readyz, "/readyz").await.contains("\"ready\":true"));
    }
    worker.stop().await;
    registry.stop().await;
    alerter.stop().await;
}

/// Two replicas share the durable consumer and the dedup bucket: each run failure is alerted
/// once, and a condition both replicas see (no leader) and a leader change both replicas read
/// are alerted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_each_alert_once() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let subscriber = Subscriber::start(&client, &names).await;
    let mut config = config(&server);
    config.no_leader_after = Duration::from_millis(500);
    let mut second = config.clone();
    config.common.instance_id = Some("alerter-a".into());
    second.common.instance_id = Some("alerter-b".into());
    let a = RunningAlerter::start(config).await;
    let b = RunningAlerter::start(second).await;

    for i in 0..10 {
        publish_event(&js, &names, &run_event(EventKind::RunDead, "ns", &format!("t{i}"))).await;
    }
    publish_event(&js, &names, &leader_acquired("s1", 1)).await;
    eventually(WAIT, "ten dead runs, a leader change and no leader", || async {
        let rules = subscriber.rules();
        rules.iter().filter(|r| *r == "run_dead").count() == 10
            && rules.iter().any(|r| r == "leader_changed")
            && rules.iter().any(|r| r == "no_leader")
    })
    .await;
    // Both replicas raised the leader change and the missing leader; one claimed each.
    eventually(WAIT, "both replicas raised them", || async {
        let (ma, mb) = (a.metrics().await, b.metrics().await);
        ["leader_changed", "no_leader"].iter().all(|rule| {
            let series = format!("jetsched_alerts_raised_total{{rule=\"{rule}\"}}");
            metric(&ma, &series) == Some(1.0) && metric(&mb, &series) == Some(1.0)
        })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let messages = subscriber.messages();
    let senders: std::collections::BTreeSet<_> =
        messages.iter().filter(|(_, m)| m.rule == "run_dead").map(|(_, m)| m.instance.clone()).collect();
    let rules = subscriber.rules();
    assert_eq!(rules.iter().filter(|r| *r == "run_dead").count(), 10, "{rules:?}");
    assert_eq!(rules.iter().filter(|r| *r == "leader_changed").count(), 1, "{rules:?}");
    assert_eq!(rules.iter().filter(|r| *r == "no_leader").count(), 1, "{rules:?}");
    assert!(!senders.is_empty());
    a.stop().await;
    b.stop().await;
}

/// Every metric the Prometheus rules and the Grafana dashboard use is one a service registers
/// (histogram series by their base name).
#[test]
fn deploy_rules_and_dashboard_use_metrics_the_services_export() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources = String::new();
    let mut dirs = vec![root.join("services")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    for file in ["deploy/prometheus/alerts.yml", "deploy/grafana/jetsched.json"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let mut used: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("jetsched_"))
            .collect();
        used.sort();
        used.dedup();
        assert!(used.len() >= 10, "{file}: {used:?}");
        for name in used {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| sources.contains(&format!("\"{base}\"")))
                .unwrap_or(name);
            assert!(
                sources.contains(&format!("\"{base}\"")),
                "{file} uses {name}, which no service registers"
            );
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("deploy/grafana/jetsched.json")).unwrap())
            .unwrap();
    assert_eq!(dashboard["uid"], "jetsched-overview");
    assert!(dashboard["panels"].as_array().unwrap().len() > 10);
}

/// A graceful stop sends what still waits for its group, so a claimed window never hides an
/// alert that was not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_sends_waiting_groups() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let subscriber = Subscriber::start(&client, &names).await;
    let mut config = config(&server);
    config.group_wait = Duration::from_secs(60);
    let alerter = RunningAlerter::start(config).await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "ns", "waiting")).await;
    eventually(WAIT, "the event is consumed", || async {
        metric(&alerter.metrics().await, "jetsched_alerts_raised_total{rule=\"run_dead\"}") == Some(1.0)
    })
    .await;
    assert!(subscriber.rules().is_empty(), "still grouping");
    alerter.stop().await;
    eventually(WAIT, "sent at shutdown", || async { subscriber.rules() == ["run_dead"] }).await;
}

/// A dead-letter stream close to its byte limit (it then refuses new dead letters) is critical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nearly_full_dead_letter_stream_alerts() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let subscriber = Subscriber::start(&client, &names).await;
    let mut config = config(&server);
    config.topology.dlq_max_bytes = 8 * 1024;
    let alerter = RunningAlerter::start(config).await;
    eventually(WAIT, "the limit is seen", || async {
        metric(&alerter.metrics().await, "jetsched_dlq_max_bytes") == Some(8192.0)
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
    assert!(metric(&metrics, "jetsched_dlq_bytes") >= Some(0.9 * 8192.0), "{metrics}");
    alerter.stop().await;
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn spawn_alerter_process(server: &NatsServer, admin: SocketAddr) -> ChildProcess {
    let mut command = ChildProcess::command("jetsched-alerter");
    command
        .env("NATS_URL", server.url())
        .env("JETSCHED_ADMIN_ADDR", admin.to_string())
        .env("JETSCHED_ALERTER_GROUP_WAIT", "0s")
        .env("JETSCHED_ALERTER_CHECK_INTERVAL", "200ms")
        .env("JETSCHED_ALERTER_NO_LEADER_AFTER", "500ms");
    ChildProcess::spawn_command("jetsched-alerter", command)
}

/// The real binary, killed with SIGKILL and started again, does not resend what it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_alerter_process_does_not_resend_after_restart() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let subscriber = Subscriber::start(&client, &names).await;
    let admin = free_port();
    let mut process = spawn_alerter_process(&server, admin);
    eventually(WAIT, "the alerter process is ready", || async {
        tokio::net::TcpStream::connect(admin).await.is_ok()
            && http_get(admin, "/readyz").await.contains("\"ready\":true")
    })
    .await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "billing", "invoice")).await;
    eventually(WAIT, "run_dead and no_leader from the process", || async {
        let rules = subscriber.rules();
        rules.iter().any(|r| r == "run_dead") && rules.iter().any(|r| r == "no_leader")
    })
    .await;
    process.kill9();

    let mut process = spawn_alerter_process(&server, admin);
    eventually(WAIT, "the restarted process is ready", || async {
        tokio::net::TcpStream::connect(admin).await.is_ok()
            && http_get(admin, "/readyz").await.contains("\"ready\":true")
    })
    .await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "billing", "invoice")).await;
    eventually(WAIT, "the restarted process suppressed both", || async {
        let metrics = http_get(admin, "/metrics").await;
        metric(&metrics, "jetsched_alerts_suppressed_total{reason=\"dedup\",rule=\"run_dead\"}") == Some(1.0)
            && metric(&metrics, "jetsched_alerts_suppressed_total{reason=\"dedup\",rule=\"no_leader\"}")
                == Some(1.0)
    })
    .await;
    let rules = subscriber.rules();
    assert_eq!(rules.iter().filter(|r| *r == "run_dead").count(), 1, "{rules:?}");
    assert_eq!(rules.iter().filter(|r| *r == "no_leader").count(), 1, "{rules:?}");
    process.sigterm();
    let status = process.wait_exit(WAIT).await.expect("stops on SIGTERM");
    assert!(status.success(), "{}", process.output());
}
