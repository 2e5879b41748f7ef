//! End-to-end tests of jetsched-alerter against a real nats-server, by topic: every rule,
//! driven by events, dead letters, queue consumers and the lease published straight to
//! JetStream (`rules`); de-duplication, grouping, the rate limit and slow or down webhooks
//! (`delivery`); restarts, replicas and a killed process (`restarts`); readiness and start-up
//! errors (`startup`); and a full-stack scenario with the registry, scheduler and worker
//! (`full_stack`). This file holds what they share: a server to test against, fast settings,
//! a webhook receiver, an alert subscriber, event builders and metric readers.

mod delivery;
mod every_rule;
mod full_stack;
mod restarts;
mod rules;
mod startup;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use jetsched_alerter::Config;
use jetsched_shared::alert::AlertMessage;
use jetsched_shared::names::{Names, SYSTEM_NAMESPACE};
use jetsched_shared::wire::{Event, EventKind};
use jetsched_tests::{NatsServer, metric_value};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(15);

/// A fresh nats-server with a client, its JetStream context and the default names.
async fn start() -> (NatsServer, async_nats::Client, jetstream::Context, Names) {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    (server, client, js, Names::default())
}

/// A fresh server, a subscriber to its alerts and the fast settings for an alerter on it.
struct Setup {
    server: NatsServer,
    js: jetstream::Context,
    names: Names,
    subscriber: Subscriber,
    config: Config,
}

async fn subscribed() -> Setup {
    let (server, client, js, names) = start().await;
    let subscriber = Subscriber::start(&client, &names).await;
    let config = config(&server);
    Setup { server, js, names, subscriber, config }
}

/// Fast settings for tests: no grouping, a generous rate limit, quick checks.
fn config(server: &NatsServer) -> Config {
    let mut config = Config::for_tests(&server.url());
    config.group_wait = Duration::ZERO;
    config.rate_limit = 1000;
    config.check_interval = Duration::from_millis(200);
    config
}

/// The fast settings, sending to `hook` too.
fn hooked_config(server: &NatsServer, hook: &Hook) -> Config {
    let mut config = config(server);
    config.webhook_urls = vec![hook.url()];
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

fn count(messages: &[AlertMessage], rule: &str) -> usize {
    messages.iter().filter(|m| m.rule == rule).count()
}

/// How many of `rules` are `rule`.
fn times(rules: &[String], rule: &str) -> usize {
    rules.iter().filter(|r| *r == rule).count()
}

/// Publishes `payload` on `subject` and waits until a stream stored it.
async fn store(js: &jetstream::Context, subject: String, payload: &'static str) {
    js.publish(subject, payload.into()).await.expect("publish").await.expect("stored");
}

/// How long a test watches that no late duplicate of an alert arrives.
const QUIET: Duration = Duration::from_millis(500);

/// Watches for [`QUIET`] that each rule of `expected` was alerted exactly that many times
/// among the rules `alerted` reports: a late duplicate fails the test.
async fn alerted_exactly(alerted: impl Fn() -> Vec<String>, expected: &[(&str, usize)]) {
    jetsched_tests::always(QUIET, "each alert sent the expected number of times", || async {
        let rules = alerted();
        let wrong = expected.iter().any(|(rule, n)| times(&rules, rule) != *n);
        if wrong { Err(format!("expected {expected:?}, got {rules:?}")) } else { Ok(()) }
    })
    .await;
}

/// The rules of a webhook's messages.
fn rules_of(messages: Vec<AlertMessage>) -> Vec<String> {
    messages.into_iter().map(|m| m.rule).collect()
}

/// `jetsched_alerts_suppressed_total` for `rule` and `reason` in a metrics text.
fn suppressed_total(metrics: &str, reason: &str, rule: &str) -> Option<f64> {
    metric_value(metrics, &format!("jetsched_alerts_suppressed_total{{reason=\"{reason}\",rule=\"{rule}\"}}"))
}
