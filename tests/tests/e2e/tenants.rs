//! Teams as a wall that holds, on the shipped secured config (`deploy/secure/nats.conf`) with
//! real connections: each team has an account of its own (`demo`, `billing`) that reaches
//! jetsched only through what the services' account `JETSCHED` exports to it. As `tenant-demo`:
//! everything of `demo` works (API, intake, dead letters, runs, event history, live events, the
//! CLI unchanged), and every attack on `billing` or on the system fails, checked on the other
//! side: `billing`'s tasks, fire state, run records, dead letters and events, the lease and the
//! services' durable consumers are untouched, and `billing`'s fires go on.

mod after;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::names::{CANCEL_ENDPOINT, CANCEL_TASK_ENDPOINT, Names};
use jetsched_shared::spec::Priority;
use jetsched_tests::fixtures::{dead_letter_entry, noting, store_dead_letter};
use jetsched_tests::{App, SpecBuilder, always, eventually, spec, stream_info};
use jetsched_worker::Outcome;
use serde_json::{Value, json};

use crate::deploy::{DENIED_WAIT, SecureServer, WAIT};

const TENANT: &str = "tenant-demo";

/// A request nobody answers in the team's account: no import reaches it.
async fn unanswered(client: &async_nats::Client, subject: String) {
    let answered = tokio::time::timeout(DENIED_WAIT, client.request(subject.clone(), "{}".into())).await;
    assert!(!matches!(answered, Ok(Ok(_))), "{subject} was answered: {answered:?}");
}

fn mismatch(reply: &Value, what: &str) {
    assert_eq!(reply["error"]["code"], "namespace_mismatch", "{what}: {reply}");
}

/// A task of the `probe` handler without a namespace: the subject it is sent on names it.
fn probe(id: &str) -> SpecBuilder {
    spec("", id).without("namespace").handler("probe")
}

/// A dead letter as a worker stores it, whose body names `namespace`/`id`.
fn dead_letter(namespace: &str, id: &str, execution_id: &str) -> Value {
    dead_letter_entry(&probe(id).field("namespace", namespace).every("1h").json(), execution_id)
}

/// The secured server with the registry, scheduler, worker and alerter on their own users; the
/// worker's `probe` handler records every run as `namespace/task`.
struct Deployment {
    server: SecureServer,
    names: Names,
    registry: App,
    scheduler: App,
    worker: App,
    alerter: App,
    runs: Arc<Mutex<Vec<String>>>,
}

impl Deployment {
    async fn start(quotas: &[&str], topology: jetsched_shared::topology::TopologyArgs) -> Deployment {
        let server = SecureServer::start().await;
        let mut registry_config = jetsched_registry::Config::for_tests(&server.url);
        registry_config.shared.nats = server.nats_args("registry");
        registry_config.quotas = quotas.iter().map(|q| q.to_string()).collect();
        registry_config.shared.topology = topology.clone();
        let registry = App::registry(registry_config).await;
        let mut scheduler_config = jetsched_scheduler::Config::for_tests(&server.url);
        scheduler_config.shared.nats = server.nats_args("scheduler");
        scheduler_config.shared.topology = topology.clone();
        let scheduler = App::scheduler(scheduler_config).await;
        let (handlers, runs) =
            noting("probe", |run| format!("{}/{}", run.namespace, run.task_id), |_| async { Outcome::ok() });
        let mut worker_config = jetsched_worker::Config::for_tests(&server.url, "tenants-worker");
        worker_config.shared.nats = server.nats_args("worker");
        worker_config.shared.topology = topology.clone();
        worker_config.pull_expires = Duration::from_millis(500);
        let worker = App::worker(worker_config, handlers).await;
        let mut alerter_config = jetsched_alerter::Config::for_tests(&server.url);
        alerter_config.shared.nats = server.nats_args("alerter");
        alerter_config.shared.topology = topology;
        let alerter = App::alerter(alerter_config).await;
        Deployment { server, names: Names::default(), registry, scheduler, worker, alerter, runs }
    }

    fn runs_of(&self, task: &str) -> usize {
        self.runs.lock().expect("runs").iter().filter(|r| *r == task).count()
    }

    async fn stop(self) {
        self.alerter.stop().await;
        self.worker.stop().await;
        self.scheduler.stop().await;
        self.registry.stop().await;
    }
}

#[tokio::test]
async fn a_team_reaches_its_namespace_through_its_account_and_nothing_else() {
    let deployment = Deployment::start(&[], Default::default()).await;
    let (server, names) = (&deployment.server, &deployment.names);

    let billing = server.connect("tenant-billing").await;
    let put = billing
        .api
        .call(names.task_api_namespaced("put", "billing"), probe("payroll").every("1h").json())
        .await;
    assert_eq!(put["revision"], 1, "{put}");

    // The team's programs use the local subjects unchanged, with the default inbox prefix: its
    // account has `_INBOX.>` to itself.
    let tenant = server.connect(TENANT).await;
    let task = |endpoint: &str| names.task_api_namespaced(endpoint, "demo");
    let dlq = |endpoint: &str| names.dlq_api_namespaced(endpoint, "demo");
    let put = tenant.api.call(task("put"), probe("report").every("1h").json()).await;
    assert_eq!(put["task"]["namespace"], "demo", "{put}");
    let put =
        tenant.api.call(task("put"), probe("scratch").field("namespace", "demo").every("1h").json()).await;
    assert!(put["revision"].as_u64().is_some(), "{put}");
    let got = tenant.api.call(task("get"), json!({"id": "report"})).await;
    assert_eq!(got["task"]["id"], "report", "{got}");
    let listed = tenant.api.call(task("list"), json!({})).await;
    let listed: Vec<&str> = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["task"]["namespace"].as_str())
        .collect();
    assert_eq!(listed, ["demo", "demo"], "list shows demo only");
    let paused = tenant.api.call(task("pause"), json!({"id": "report"})).await;
    assert_eq!(paused["task"]["paused"], true, "{paused}");
    let resumed = tenant.api.call(task("resume"), json!({"id": "report"})).await;
    assert_eq!(resumed["task"]["paused"], false, "{resumed}");
    let next = tenant.api.call(task("next"), json!({"id": "report", "count": 2})).await;
    assert_eq!(next["times"].as_array().map(Vec::len), Some(2), "{next}");
    let deleted = tenant.api.call(task("delete"), json!({"id": "scratch"})).await;
    assert_eq!(deleted["deleted"], true, "{deleted}");

    // A trigger runs on the worker; its live events reach the team's account (a stream import),
    // its history comes through the registry, its run record too.
    let mut live = tenant.client.subscribe(names.namespace_events_filter("demo")).await.expect("subscribe");
    let triggered = tenant.api.call(task("trigger"), json!({"id": "report"})).await;
    let execution = triggered["execution_id"].as_str().expect("execution id").to_string();
    eventually(WAIT, "the triggered run ran", || async { deployment.runs_of("demo/report") >= 1 }).await;
    let event = tokio::time::timeout(WAIT, live.next()).await.expect("a live demo event").expect("event");
    let event: Value = serde_json::from_slice(&event.payload).expect("event JSON");
    assert_eq!(event["namespace"], "demo", "{event}");
    let record = eventually(WAIT, "the run record is final", || async {
        let reply = tenant
            .api
            .call(names.runs_api_namespaced("get", "demo"), json!({"execution_id": execution}))
            .await;
        (reply["run"]["status"] == "succeeded").then_some(reply)
    })
    .await;
    assert_eq!(record["run"]["namespace"], "demo", "{record}");
    let history = eventually(WAIT, "the event history shows the run", || async {
        let reply =
            tenant.api.call(names.events_api_namespaced("history", "demo"), json!({"last": 100})).await;
        let kinds: Vec<String> = reply["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or_default().to_string())
            .collect();
        kinds.iter().any(|k| k == "run.succeeded").then_some(reply)
    })
    .await;
    for event in history["events"].as_array().expect("events") {
        assert_eq!(event["namespace"], "demo", "history shows demo only: {event}");
    }
    let one = tenant
        .api
        .call(names.events_api_namespaced("history", "demo"), json!({"task_id": "report", "last": 1}))
        .await;
    assert_eq!(one["events"].as_array().map(Vec::len), Some(1), "{one}");
    mismatch(
        &tenant
            .api
            .call(names.events_api_namespaced("history", "demo"), json!({"namespace": "billing"}))
            .await,
        "events history",
    );

    // Fire-and-forget intake through the import: applied by the registry.
    tenant
        .client
        .publish(
            names.submit_subject("demo", "submitted"),
            probe("submitted").every("1h").json().to_string().into(),
        )
        .await
        .expect("submit");
    eventually(WAIT, "the submission was applied", || async {
        tenant.api.call(task("get"), json!({"id": "submitted"})).await["task"]["id"] == "submitted"
    })
    .await;

    // A body naming billing on a demo subject: refused by the registry on every endpoint.
    let other = json!({"namespace": "billing", "id": "payroll"});
    for endpoint in ["get", "list", "delete", "pause", "resume", "trigger", "next"] {
        mismatch(&tenant.api.call(task(endpoint), other.clone()).await, endpoint);
    }
    mismatch(
        &tenant
            .api
            .call(task("put"), probe("planted").field("namespace", "billing").every("1h").json())
            .await,
        "put",
    );
    for endpoint in ["list", "get", "replay", "purge"] {
        mismatch(
            &tenant.api.call(dlq(endpoint), json!({"namespace": "billing", "sequence": 1})).await,
            endpoint,
        );
    }

    // Nothing of billing or of the plain API exists in the team's account: no answer at all.
    for subject in [
        names.task_api_namespaced("put", "billing"),
        names.task_api_namespaced("list", "billing"),
        names.dlq_api_namespaced("purge", "billing"),
        names.runs_api_namespaced("get", "billing"),
        names.events_api_namespaced("history", "billing"),
        names.task_api_subject("list"),
        names.dlq_api_subject("list"),
        names.breaker_api_subject("list"),
    ] {
        unanswered(&tenant.client, subject).await;
    }
    // Its JetStream is its own: the services' streams do not exist there.
    let tenant_js = jetstream::new(tenant.client.clone());
    for stream in [
        names.events_stream(),
        names.dlq_stream(),
        names.dispatch_stream(),
        Names::kv_stream(&names.tasks_bucket()),
    ] {
        let error = tenant_js.get_stream(&stream).await.err().unwrap_or_else(|| panic!("{stream} reached"));
        assert!(error.to_string().to_lowercase().contains("not found"), "{stream}: {error}");
    }
    // Billing's live events never reach demo's account.
    let mut theirs =
        tenant.client.subscribe(names.namespace_events_filter("billing")).await.expect("subscribe");
    billing.api.call(names.task_api_namespaced("pause", "billing"), json!({"id": "payroll"})).await;
    let leaked = tokio::time::timeout(Duration::from_secs(1), theirs.next()).await;
    assert!(leaked.is_err(), "billing's event reached demo: {leaked:?}");
    let mut everything = tenant.client.subscribe(">").await.expect("subscribe");
    billing.api.call(names.task_api_namespaced("resume", "billing"), json!({"id": "payroll"})).await;
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(500), everything.next()).await {
        assert!(
            !message.subject.contains("billing"),
            "billing's traffic in demo's account: {}",
            message.subject
        );
    }

    // Dead letters: a worker stores one in demo and one in billing; the team sees its own.
    let worker = server.connect("worker").await;
    let worker_js = jetstream::new(worker.client.clone());
    let mut sequences = Vec::new();
    for (namespace, id) in [("demo", "report"), ("billing", "payroll")] {
        let execution = uuid::Uuid::new_v4().to_string();
        let sequence = store_dead_letter(
            &worker_js,
            names.dlq_subject("default", namespace, id),
            &dead_letter(namespace, id, &execution),
        )
        .await
        .expect("dead letter stored");
        sequences.push(sequence);
    }
    let [demo_seq, billing_seq] = sequences[..] else { unreachable!() };
    let listed = tenant.api.call(dlq("list"), json!({})).await;
    let listed: Vec<u64> = listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["sequence"].as_u64())
        .collect();
    assert_eq!(listed, [demo_seq], "dlq list shows demo's only");
    for endpoint in ["get", "replay", "purge"] {
        mismatch(&tenant.api.call(dlq(endpoint), json!({"sequence": billing_seq})).await, endpoint);
    }
    let replayed = tenant.api.call(dlq("replay"), json!({"sequence": demo_seq})).await;
    assert_eq!(replayed["replayed"][0]["sequence"], demo_seq, "{replayed}");
    let billing_entry =
        billing.api.call(names.dlq_api_namespaced("get", "billing"), json!({"sequence": billing_seq})).await;
    assert_eq!(billing_entry["entry"]["namespace"], "billing", "billing's dead letter kept: {billing_entry}");

    // The CLI as the tenant, unchanged: local subjects, its account's own inboxes.
    for args in [
        vec!["get", "demo/report"],
        vec!["ls", "--namespace", "demo"],
        vec!["next", "demo/report"],
        vec!["dlq", "ls", "--namespace", "demo"],
        vec!["events", "--namespace", "demo", "--last", "5"],
        vec!["runs", "demo/report", "--wide"],
    ] {
        let stdout = server.cli(TENANT, &args).await;
        assert!(!stdout.contains("billing"), "jetsched {} showed billing: {stdout}", args.join(" "));
        if args[0] == "runs" {
            assert!(stdout.contains(&execution), "jetsched runs shows the triggered run: {stdout}");
        }
    }

    let payroll =
        billing.api.call(names.task_api_namespaced("get", "billing"), json!({"id": "payroll"})).await;
    assert_eq!(payroll["task"]["paused"], false, "{payroll}");
    deployment.stop().await;
}

/// What of billing and of the system an attack could change, read in the services' account.
#[derive(Debug, PartialEq)]
struct Snapshot {
    /// Messages per subject of billing's tasks, the run record, breakers, dead letters and
    /// intake (fire state and the lease change as billing fires: checked by their content).
    subjects: BTreeMap<String, usize>,
    /// The services' durable consumers: their configuration as the server reports it.
    consumers: BTreeMap<String, String>,
}

async fn snapshot(js: &jetstream::Context, names: &Names) -> Snapshot {
    let mut subjects = BTreeMap::new();
    let tasks = Names::kv_stream(&names.tasks_bucket());
    let runs = Names::kv_stream(&names.runs_bucket());
    let breakers = Names::kv_stream(&names.breakers_bucket());
    for (stream, filter) in [
        (tasks, format!("$KV.{}.billing.>", names.tasks_bucket())),
        (runs, format!("$KV.{}.run-billing", names.runs_bucket())),
        (breakers, format!("$KV.{}.>", names.breakers_bucket())),
        (names.dlq_stream(), names.dlq_subject("*", "billing", ">")),
        (names.intake_stream(), names.submit_subject("billing", ">")),
    ] {
        let stream_handle = js.get_stream(&stream).await.unwrap_or_else(|e| panic!("{stream}: {e}"));
        let mut listed = stream_handle.info_with_subjects(&filter).await.expect("stream subjects");
        while let Some(entry) = listed.next().await {
            let (subject, count) = entry.expect("subject count");
            subjects.insert(subject, count);
        }
    }
    let mut consumers = BTreeMap::new();
    for (stream, consumer) in [
        (names.dispatch_stream(), "workers-default".to_string()),
        (names.intake_stream(), "registry-intake".to_string()),
        (names.events_stream(), names.alerter_consumer("run.failed")),
        (names.events_stream(), names.alerter_consumer("run.dead")),
    ] {
        let handle = js.get_stream(&stream).await.expect("stream");
        let info =
            handle.consumer_info(&consumer).await.unwrap_or_else(|e| panic!("{stream}/{consumer}: {e}"));
        let config = serde_json::to_value(&info.config).expect("consumer config");
        consumers.insert(format!("{stream}/{consumer}"), config.to_string());
    }
    Snapshot { subjects, consumers }
}

#[tokio::test]
async fn a_team_attacking_from_its_account_changes_nothing_of_another_and_fires_go_on() {
    let deployment = Deployment::start(&[], Default::default()).await;
    let (server, names) = (&deployment.server, &deployment.names);
    let billing = server.connect("tenant-billing").await;
    let billing_task = |endpoint: &str| names.task_api_namespaced(endpoint, "billing");
    billing.api.call(billing_task("put"), probe("payroll").every("1h").json()).await;
    billing.api.call(billing_task("put"), probe("heartbeat").every("1s").json()).await;
    // Billing's run record and dead letter, as the worker writes them.
    let worker = server.connect("worker").await;
    let worker_js = jetstream::new(worker.client.clone());
    let runs = worker_js.get_key_value(names.runs_bucket()).await.expect("runs bucket");
    let record = json!({"execution_id": "run-billing", "namespace": "billing", "task_id": "payroll", "status": "succeeded"});
    runs.put("run-billing", record.to_string().into()).await.expect("run record");
    // A held run of billing, as the worker records it: a cancel from demo must leave it held.
    let held = json!({
        "execution_id": "held-billing", "namespace": "billing", "task_id": "payroll", "queue": "default",
        "nominal_time": "2026-01-01T00:00:00.000Z", "trigger": "schedule", "status": "held", "attempt": 1,
        "worker": "w1", "started": "2026-01-01T00:00:00.000Z", "first_started": "2026-01-01T00:00:00.000Z",
        "release_at": "2099-01-01T00:00:00.000Z", "attempts": [],
    });
    runs.put("held-billing", held.to_string().into()).await.expect("held run record");
    let (subject, entry) = (
        names.dlq_subject("default", "billing", "payroll"),
        dead_letter("billing", "payroll", "dead-billing"),
    );
    store_dead_letter(&worker_js, subject, &entry).await.expect("stored");
    eventually(WAIT, "billing's heartbeat fires", || async { deployment.runs_of("billing/heartbeat") >= 2 })
        .await;

    let operator = server.connect("operator").await;
    let operator_js = jetstream::new(operator.client.clone());
    let before = snapshot(&operator_js, names).await;
    let lease_bucket = operator_js.get_key_value(names.leader_bucket()).await.expect("lease bucket");
    let lease_before = lease_bucket.get(names.leader_key()).await.expect("lease").expect("a leader");
    let lease_before: Value = serde_json::from_slice(&lease_before).expect("lease JSON");

    // The attacks, as tenant-demo, for five seconds while billing's heartbeat fires.
    let tenant = server.connect(TENANT).await;
    let targets = [
        format!("$KV.{}.billing.payroll", names.tasks_bucket()),
        format!("$KV.{}.{}", names.leader_bucket(), names.leader_key()),
        format!("$KV.{}.billing.payroll", names.state_bucket()),
        format!("$KV.{}.run-billing", names.runs_bucket()),
        format!("$KV.{}.billing.payments", names.breakers_bucket()),
        names.dispatch_subject("default", "billing", "payroll"),
        names.lane_subject("default", Priority::High, "billing", "payroll"),
        names.delayed_subject("default", "billing", "payroll", "forged"),
        names.dlq_subject("default", "billing", "payroll"),
        names.event_subject("run.failed", "billing", "payroll"),
        names.submit_subject("billing", "planted"),
        names.pause_request_subject("billing", "payroll"),
        format!(
            "$JS.API.CONSUMER.CREATE.{}.{}.{}",
            names.events_stream(),
            names.alerter_consumer("run.failed"),
            names.namespace_events_filter("demo")
        ),
        format!("$JS.API.CONSUMER.CREATE.{}.workers-default", names.dispatch_stream()),
        format!("$JS.API.STREAM.PURGE.{}", names.dlq_stream()),
    ];
    // Requests the team may send, each answered to every target; and the targets published to
    // directly, in the team's own account.
    let requests = [
        (names.task_api_namespaced("get", "demo"), json!({"id": "nothing"})),
        (names.task_api_namespaced("list", "demo"), json!({})),
        (names.dlq_api_namespaced("list", "demo"), json!({})),
        (names.runs_api_namespaced("get", "demo"), json!({"execution_id": "x"})),
        (names.runs_api_namespaced(CANCEL_ENDPOINT, "demo"), json!({"execution_id": "held-billing"})),
        (names.runs_api_namespaced(CANCEL_TASK_ENDPOINT, "demo"), json!({"id": "payroll"})),
        (names.events_api_namespaced("history", "demo"), json!({"last": 5})),
        (names.submit_subject("demo", "echo"), probe("echo").every("1h").json()),
    ];
    let heartbeat_runs = deployment.runs_of("billing/heartbeat");
    let started = tokio::time::Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(5) {
        for target in &targets {
            for (subject, body) in &requests {
                tenant
                    .client
                    .publish_with_reply(subject.clone(), target.clone(), body.to_string().into())
                    .await
                    .expect("send");
                sent += 1;
            }
            let forged = json!({"namespace": "billing", "task_id": "payroll", "forged": true});
            tenant.client.publish(target.clone(), forged.to_string().into()).await.expect("send");
        }
        tenant.client.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!("sent {sent} requests with reply subjects aimed at the services' account");

    // Cancelling billing's run from demo: billing's subject is not imported, demo's subject
    // does not reach another namespace's run (answered like an unknown one), and a body
    // naming billing is refused; the run stays held.
    for endpoint in [CANCEL_ENDPOINT, CANCEL_TASK_ENDPOINT] {
        unanswered(&tenant.client, names.runs_api_namespaced(endpoint, "billing")).await;
    }
    let cancel = names.runs_api_namespaced(CANCEL_ENDPOINT, "demo");
    let reply = tenant.api.call(cancel.clone(), json!({"execution_id": "held-billing"})).await;
    assert_eq!(reply["error"]["code"], "not_found", "{reply}");
    let reply =
        tenant.api.call(cancel, json!({"execution_id": "held-billing", "namespace": "billing"})).await;
    mismatch(&reply, "cancel naming billing");
    let reply = tenant
        .api
        .call(
            names.runs_api_namespaced(CANCEL_TASK_ENDPOINT, "demo"),
            json!({"namespace": "billing", "id": "payroll"}),
        )
        .await;
    mismatch(&reply, "cancel-task naming billing");
    let still = runs.get("held-billing").await.expect("read").expect("the held run");
    let still: Value = serde_json::from_slice(&still).expect("a record");
    assert_eq!(still["status"], "held", "{still}");
    // demo cancels its own held run: the registry marks it and records it cancelled.
    let mut own = held.clone();
    own["execution_id"] = json!("held-demo");
    own["namespace"] = json!("demo");
    runs.put("held-demo", own.to_string().into()).await.expect("demo's held run");
    let cancel = names.runs_api_namespaced(CANCEL_ENDPOINT, "demo");
    let reply = tenant.api.call(cancel, json!({"execution_id": "held-demo", "reason": "mine"})).await;
    assert_eq!(
        (reply["outcome"].as_str(), reply["was"].as_str()),
        (Some("cancelled"), Some("held")),
        "{reply}"
    );
    let own = runs.get("held-demo").await.expect("read").expect("demo's run");
    let own: Value = serde_json::from_slice(&own).expect("a record");
    assert_eq!(own["status"], "cancelled", "{own}");

    // Fires went on: billing's heartbeat ran about once a second throughout.
    let during = deployment.runs_of("billing/heartbeat") - heartbeat_runs;
    assert!(during >= 4, "billing's heartbeat ran {during} times in 5 s of attacks");
    // Nothing of billing or of the system changed, and nothing sent late changes it.
    always(Duration::from_secs(1), "no attack changed billing or a service's consumer", || async {
        let after = snapshot(&operator_js, names).await;
        if after == before { Ok(()) } else { Err(format!("{after:?}")) }
    })
    .await;
    let state = operator_js.get_key_value(names.state_bucket()).await.expect("state bucket");
    for key in ["billing.payroll", "billing.heartbeat"] {
        if let Some(value) = state.get(key).await.expect("state") {
            let value: Value = serde_json::from_slice(&value).expect("fire state is JSON");
            for foreign in ["error", "forged", "task", "tasks", "entries", "events", "run"] {
                assert!(value.get(foreign).is_none(), "{key} holds something else than fire state: {value}");
            }
        }
    }
    let lease_after = lease_bucket.get(names.leader_key()).await.expect("lease").expect("a leader");
    let lease_after: Value = serde_json::from_slice(&lease_after).expect("the lease is still a lease record");
    assert_eq!(lease_after["instance"], lease_before["instance"], "{lease_after}");
    assert_eq!(lease_after["term"], lease_before["term"], "the lease changed hands: {lease_after}");
    // Every billing event stored is one the services wrote.
    let history =
        billing.api.call(names.events_api_namespaced("history", "billing"), json!({"last": 1000})).await;
    for event in history["events"].as_array().expect("events") {
        assert_eq!(event["namespace"], "billing", "{event}");
        assert!(event.get("forged").is_none() && event["kind"].is_string(), "a forged event: {event}");
    }
    let planted = billing.api.call(billing_task("get"), json!({"id": "planted"})).await;
    assert_eq!(planted["error"]["code"], "not_found", "{planted}");
    let payroll = billing.api.call(billing_task("get"), json!({"id": "payroll"})).await;
    assert_eq!(
        (payroll["revision"].as_u64(), &payroll["task"]["paused"]),
        (Some(1), &json!(false)),
        "{payroll}"
    );
    // demo's own echo submission went through, as it should.
    let echo = tenant.api.call(names.task_api_namespaced("get", "demo"), json!({"id": "echo"})).await;
    assert_eq!(echo["task"]["id"], "echo", "{echo}");
    deployment.stop().await;
}

#[tokio::test]
async fn nothing_a_team_shapes_is_trusted() {
    let deployment = Deployment::start(&[], Default::default()).await;
    let (server, names) = (&deployment.server, &deployment.names);
    let tenant = server.connect(TENANT).await;
    let put = |spec: Value| tenant.api.call(names.task_api_namespaced("put", "demo"), spec);

    // A `nats` executor aimed at the system's subjects is refused when the spec is stored.
    for subject in [
        format!("$JS.API.STREAM.INFO.KV_{}", names.runs_bucket()),
        format!("$KV.{}.billing.payroll", names.tasks_bucket()),
        "$SYS.REQ.SERVER.PING".to_string(),
        "_INBOX.anything".to_string(),
        names.pause_request_subject("billing", "payroll"),
        names.delayed_subject("default", "billing", "payroll", "x"),
    ] {
        let reply = put(json!({"id": "reach", "schedule": {"every": "1h"},
                               "executor": {"kind": "nats", "subject": subject}}))
        .await;
        assert_eq!(reply["error"]["field"], "executor.subject", "{subject}: {reply}");
    }

    // A dead letter stored on demo's subject whose body names billing (a dispatch a spec
    // shaped): its replay is refused, and nothing runs for billing.
    let worker = server.connect("worker").await;
    let worker_js = jetstream::new(worker.client.clone());
    let sequence = store_dead_letter(
        &worker_js,
        names.dlq_subject("default", "demo", "report"),
        &dead_letter("billing", "payroll", "crossed"),
    )
    .await
    .expect("stored");
    let reply =
        tenant.api.call(names.dlq_api_namespaced("replay", "demo"), json!({"sequence": sequence})).await;
    mismatch(&reply, "replay of an entry naming billing");
    assert!(reply["error"]["message"].as_str().unwrap_or_default().contains("subject"), "{reply}");
    always(Duration::from_secs(1), "no billing run started", || async {
        deployment.runs_of("billing/payroll") == 0
    })
    .await;
    let entry = tenant.api.call(names.dlq_api_namespaced("get", "demo"), json!({"sequence": sequence})).await;
    assert_eq!(entry["sequence"], sequence, "the refused entry stays for the operator: {entry}");
    deployment.stop().await;
}

#[tokio::test]
async fn quotas_hold_per_namespace() {
    let topology = jetsched_shared::topology::TopologyArgs { dlq_max_per_subject: 3, ..Default::default() };
    let deployment =
        Deployment::start(&["demo.tasks=5", "demo.spec_bytes=2048", "*.tasks=100"], topology).await;
    let (server, names) = (&deployment.server, &deployment.names);
    let tenant = server.connect(TENANT).await;
    let put = |id: String| {
        let subject = names.task_api_namespaced("put", "demo");
        tenant.api.call(subject, probe(&id).every("1h").json())
    };

    // Tasks: five fit, the sixth is refused naming the limit, and twenty at once change nothing.
    for i in 0..5 {
        assert!(put(format!("t{i}")).await["revision"].is_u64());
    }
    let refused = put("t5".to_string()).await;
    assert_eq!(
        (&refused["error"]["code"], &refused["error"]["field"]),
        (&json!("quota_exceeded"), &json!("quota.tasks")),
        "{refused}"
    );
    let burst = futures::future::join_all((10..30).map(|i| put(format!("b{i}")))).await;
    assert!(burst.iter().all(|r| r["error"]["code"] == "quota_exceeded"), "{burst:?}");
    let listed = tenant.api.call(names.task_api_namespaced("list", "demo"), json!({})).await;
    assert_eq!(listed["tasks"].as_array().map(Vec::len), Some(5), "{listed}");
    // Changing a task it holds is no new task; after a delete there is room again.
    assert!(put("t0".to_string()).await["revision"].is_u64(), "an update within the quota");
    tenant.api.call(names.task_api_namespaced("delete", "demo"), json!({"id": "t4"})).await;
    assert!(put("t5".to_string()).await["revision"].is_u64(), "room after a delete");
    // Another namespace is not counted against demo.
    let billing = server.connect("tenant-billing").await;
    let other = billing
        .api
        .call(names.task_api_namespaced("put", "billing"), probe("payroll").every("1h").json())
        .await;
    assert!(other["revision"].is_u64(), "{other}");

    // Spec size.
    let mut big = probe("t0").every("1h").json();
    big["executor"]["payload"] = json!({"padding": "x".repeat(3000)});
    let refused = tenant.api.call(names.task_api_namespaced("put", "demo"), big).await;
    assert_eq!(refused["error"]["field"], "quota.spec_bytes", "{refused}");

    // The team account's payload limit: an oversized submission is refused by the server,
    // nothing is stored in the intake.
    let operator = server.connect("operator").await;
    let operator_js = jetstream::new(operator.client.clone());
    let intake_before = stream_info(&operator_js, &names.intake_stream()).await.state.messages;
    // 100 KiB: within the server's limit (the client sends it), over the account's 64 KiB.
    let sender = server.connect(TENANT).await;
    let huge = vec![b'x'; 100 << 10];
    sender.client.publish(names.submit_subject("demo", "huge"), huge.into()).await.expect("sent");
    let _ = sender.client.flush().await;
    sender.expect_error("maximum payload").await;
    let intake_after = stream_info(&operator_js, &names.intake_stream()).await.state.messages;
    assert_eq!(intake_after, intake_before, "the oversized submission was stored");

    // The team's own JetStream is bounded: consumers past its limit are refused.
    let tenant_js = jetstream::new(tenant.client.clone());
    let mut own = tenant_js
        .create_stream(jetstream::stream::Config {
            name: "OWN".into(),
            subjects: vec!["own.>".into()],
            ..Default::default()
        })
        .await
        .expect("the team creates a stream of its own");
    let mut created = 0;
    let mut refusal = None;
    for i in 0..80 {
        match own
            .create_consumer(jetstream::consumer::pull::Config {
                durable_name: Some(format!("c{i}")),
                ..Default::default()
            })
            .await
        {
            Ok(_) => created += 1,
            Err(error) => {
                refusal = Some(error.to_string());
                break;
            }
        }
    }
    assert_eq!(created, 64, "consumers created before the account's limit: {refusal:?}");
    let _ = own.info().await.expect("own stream");

    // A task's share of the dead-letter stream: the fourth dead letter of one demo task is
    // refused by the server, billing's still fits.
    let worker = server.connect("worker").await;
    let worker_js = jetstream::new(worker.client.clone());
    let mut stored = 0;
    for i in 0..5 {
        let entry = dead_letter("demo", "t0", &format!("d{i}"));
        stored += usize::from(
            store_dead_letter(&worker_js, names.dlq_subject("default", "demo", "t0"), &entry).await.is_ok(),
        );
    }
    assert_eq!(stored, 3, "one task filled more than its share of the dead-letter stream");
    let (subject, entry) =
        (names.dlq_subject("default", "billing", "payroll"), dead_letter("billing", "payroll", "b"));
    store_dead_letter(&worker_js, subject, &entry)
        .await
        .expect("billing's dead letter is stored while demo's task is full");

    deployment.stop().await;
}
