//! Namespaces as a security boundary, on the shipped secured config (`deploy/secure/nats.conf`)
//! with real connections: `tenant-demo` reaches the tasks, dead letters, runs and events of
//! namespace `demo` and nothing of `billing`, refused either by the server (permission
//! violation) or by the registry (`namespace_mismatch`), and nothing changes in `billing`.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::push};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_tests::{App, init_test_logging, workspace_bin};
use serde_json::{Value, json};

use crate::deploy::{DENIED_WAIT, Probe, SecureServer, WAIT, password};

const TENANT: &str = "tenant-demo";

/// A request that is answered (the registry's reply as JSON).
async fn ask(client: &async_nats::Client, subject: String, body: Value) -> Value {
    let reply = tokio::time::timeout(WAIT, client.request(subject.clone(), body.to_string().into()))
        .await
        .unwrap_or_else(|_| panic!("no reply on {subject}"))
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    serde_json::from_slice(&reply.payload).expect("JSON reply")
}

/// A request the server refuses: no reply, and a permission violation naming the subject.
async fn refused(probe: &Probe, subject: String) {
    let request = probe.client.request(subject.clone(), "{}".into());
    let answered = tokio::time::timeout(DENIED_WAIT, request).await;
    assert!(!matches!(answered, Ok(Ok(_))), "{subject} was answered: {answered:?}");
    probe.expect_violation(&format!("publish to \"{subject}\"")).await;
}

fn mismatch(reply: &Value, what: &str) {
    assert_eq!(reply["error"]["code"], "namespace_mismatch", "{what}: {reply}");
    assert!(reply["error"]["field"].as_str().is_some_and(|f| f.ends_with("namespace")), "{what}: {reply}");
}

fn spec(namespace: Option<&str>, id: &str) -> Value {
    let mut spec = json!({
        "id": id, "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": "probe"},
    });
    if let Some(namespace) = namespace {
        spec["namespace"] = json!(namespace);
    }
    spec
}

/// A dead letter as a worker stores it, for a task of `namespace`.
fn dead_letter(namespace: &str, id: &str, execution_id: &str) -> Value {
    json!({
        "execution_id": execution_id, "namespace": namespace, "task_id": id, "queue": "default",
        "nominal_time": "2026-01-01T00:00:00.000Z", "trigger": "schedule", "term": 1, "revision": 1,
        "spec": {"id": id, "namespace": namespace, "schedule": {"every": "1h"},
                 "executor": {"kind": "handler", "name": "probe"}},
        "reason": "refused on purpose", "source": "verdict", "dead_at": "2026-01-01T00:00:01.000Z",
        "worker": "w", "attempts": [], "dispatch_sequence": 1,
    })
}

#[tokio::test]
async fn a_tenant_reaches_its_namespace_and_nothing_else() {
    init_test_logging();
    let server = SecureServer::start().await;
    let names = Names::default();
    let mut registry_config = jetsched_registry::Config::for_tests(&server.url);
    registry_config.nats = server.nats_args("registry");
    let registry = App::registry(registry_config).await;

    // An administrator (`client`, plain subjects) owns namespace billing.
    let admin = server.connect("client").await;
    let put = ask(&admin.client, names.task_api_subject("put"), spec(Some("billing"), "payroll")).await;
    assert_eq!(put["revision"], 1, "{put}");

    let tenant = server
        .connect_with(
            TENANT,
            async_nats::ConnectOptions::new().custom_inbox_prefix(Names::namespace_inbox_prefix("demo")),
        )
        .await;
    let task = |endpoint: &str| names.task_api_namespaced(endpoint, "demo");
    let dlq = |endpoint: &str| names.dlq_api_namespaced(endpoint, "demo");

    // Everything in demo works; a body without namespace takes the subject's.
    let put = ask(&tenant.client, task("put"), spec(None, "report")).await;
    assert_eq!(put["task"]["namespace"], "demo", "{put}");
    let put = ask(&tenant.client, task("put"), spec(Some("demo"), "scratch")).await;
    assert!(put["revision"].as_u64().is_some(), "{put}");
    let got = ask(&tenant.client, task("get"), json!({"id": "report"})).await;
    assert_eq!(got["task"]["id"], "report", "{got}");
    let listed = ask(&tenant.client, task("list"), json!({})).await;
    let listed: Vec<&str> = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["task"]["namespace"].as_str())
        .collect();
    assert_eq!(listed, ["demo", "demo"], "list shows demo only");
    let paused = ask(&tenant.client, task("pause"), json!({"id": "report"})).await;
    assert_eq!(paused["task"]["paused"], true, "{paused}");
    let resumed = ask(&tenant.client, task("resume"), json!({"namespace": "demo", "id": "report"})).await;
    assert_eq!(resumed["task"]["paused"], false, "{resumed}");
    let triggered = ask(&tenant.client, task("trigger"), json!({"id": "report"})).await;
    assert!(triggered["execution_id"].is_string(), "{triggered}");
    let next = ask(&tenant.client, task("next"), json!({"id": "report", "count": 2})).await;
    assert_eq!(next["times"].as_array().map(Vec::len), Some(2), "{next}");
    let deleted = ask(&tenant.client, task("delete"), json!({"id": "scratch"})).await;
    assert_eq!(deleted["deleted"], true, "{deleted}");

    // A body naming billing on a demo subject: refused by the registry on every endpoint.
    let other = json!({"namespace": "billing", "id": "payroll"});
    for endpoint in ["get", "list", "delete", "pause", "resume", "trigger", "next"] {
        mismatch(&ask(&tenant.client, task(endpoint), other.clone()).await, endpoint);
    }
    mismatch(&ask(&tenant.client, task("put"), spec(Some("billing"), "planted")).await, "put");
    mismatch(
        &ask(&tenant.client, task("next"), json!({"spec": spec(Some("billing"), "x")})).await,
        "next spec",
    );
    for endpoint in ["list", "get", "replay", "purge"] {
        mismatch(
            &ask(&tenant.client, dlq(endpoint), json!({"namespace": "billing", "sequence": 1})).await,
            endpoint,
        );
    }
    mismatch(
        &ask(
            &tenant.client,
            names.runs_api_namespaced("get", "demo"),
            json!({"namespace": "billing", "execution_id": "x"}),
        )
        .await,
        "runs get",
    );

    // The server refuses every subject outside demo, and the plain (all-namespace) API.
    refused(&tenant, names.task_api_namespaced("put", "billing")).await;
    refused(&tenant, names.task_api_namespaced("list", "billing")).await;
    refused(&tenant, names.dlq_api_namespaced("purge", "billing")).await;
    refused(&tenant, names.task_api_subject("list")).await;
    refused(&tenant, names.dlq_api_subject("list")).await;
    refused(&tenant, format!("$KV.{}.billing.payroll", names.tasks_bucket())).await;
    refused(&tenant, format!("$JS.API.DIRECT.GET.KV_{}", names.runs_bucket())).await;
    refused(&tenant, format!("$JS.API.STREAM.INFO.{}", names.events_stream())).await;
    refused(&tenant, format!("$JS.API.CONSUMER.MSG.NEXT.{}.alerter", names.events_stream())).await;
    refused(&tenant, format!("$JS.API.CONSUMER.CREATE.{}", names.events_stream())).await;
    refused(
        &tenant,
        format!("$JS.API.CONSUMER.CREATE.{}.sneak.{}", names.events_stream(), names.events_wildcard()),
    )
    .await;
    tenant
        .client
        .publish(names.submit_subject("billing", "planted"), spec(None, "planted").to_string().into())
        .await
        .expect("send");
    tenant.expect_violation(&format!("publish to \"{}\"", names.submit_subject("billing", "planted"))).await;
    for subject in ["_INBOX.>".to_string(), names.events_wildcard(), names.namespace_events_filter("billing")]
    {
        let _sub = tenant.client.subscribe(subject.clone()).await.expect("send sub");
        tenant.expect_violation(&format!("subscription to \"{subject}\"")).await;
    }

    // Events: the live subscription and an ordered push consumer show demo's only.
    let mut live = tenant.client.subscribe(names.namespace_events_filter("demo")).await.expect("subscribe");
    ask(&admin.client, names.task_api_subject("pause"), json!({"namespace": "billing", "id": "payroll"}))
        .await;
    let billing_before = ask(
        &admin.client,
        names.task_api_subject("resume"),
        json!({"namespace": "billing", "id": "payroll"}),
    )
    .await;
    ask(&tenant.client, task("pause"), json!({"id": "report"})).await;
    let event = tokio::time::timeout(WAIT, live.next()).await.expect("a live demo event").expect("event");
    let event: Value = serde_json::from_slice(&event.payload).expect("event JSON");
    assert_eq!(
        (event["namespace"].as_str(), event["kind"].as_str()),
        (Some("demo"), Some("task.paused")),
        "{event}"
    );
    let js = jetstream::new(tenant.client.clone());
    let history = js
        .create_consumer_on_stream(
            push::OrderedConfig {
                name: Some(format!("demo-history-{}", uuid::Uuid::new_v4().simple())),
                filter_subject: names.namespace_events_filter("demo"),
                deliver_subject: tenant.client.new_inbox(),
                ..Default::default()
            },
            names.events_stream(),
        )
        .await
        .expect("tenant creates an ordered consumer of its own events");
    let mut messages = history.messages().await.expect("history");
    let mut kinds = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(2), messages.next()).await {
        let message = message.expect("event");
        let event: Value = serde_json::from_slice(&message.payload).expect("event JSON");
        assert_eq!(event["namespace"], "demo", "{event}");
        kinds.push(event["kind"].as_str().unwrap_or_default().to_string());
        if message.info().map(|i| i.pending).unwrap_or(0) == 0 {
            break;
        }
    }
    assert!(
        kinds.iter().any(|k| k == "task.registered") && kinds.iter().any(|k| k == "fire.dispatched"),
        "{kinds:?}"
    );
    // The subject's filter is the one the server applies: a body asking for more is refused.
    let sneaky = format!(
        "$JS.API.CONSUMER.CREATE.{}.sneak.{}",
        names.events_stream(),
        names.namespace_events_filter("demo")
    );
    let body = json!({"stream_name": names.events_stream(), "config": {
        "name": "sneak", "filter_subject": names.events_wildcard(), "deliver_subject": tenant.client.new_inbox(),
        "ack_policy": "none"}});
    let reply = ask(&tenant.client, sneaky, body).await;
    assert!(reply["error"]["err_code"].is_u64(), "a wider filter than the subject's was accepted: {reply}");
    eprintln!("server refused a wider filter: {reply}");
    // The server does not check a push consumer's deliver subject against its creator's
    // permissions: one aimed at billing's intake is accepted. What it can deliver is demo's
    // own events, which no endpoint takes for a spec; and no submission reaches billing.
    let injected = names.submit_subject("billing", "injected");
    let reply = ask(
        &tenant.client,
        format!(
            "$JS.API.CONSUMER.CREATE.{}.inject.{}",
            names.events_stream(),
            names.namespace_events_filter("demo")
        ),
        json!({"stream_name": names.events_stream(), "config": {
            "name": "inject", "filter_subject": names.namespace_events_filter("demo"),
            "deliver_subject": injected, "ack_policy": "none"}}),
    )
    .await;
    assert_eq!(reply["config"]["deliver_subject"], injected.as_str(), "{reply}");
    let operator = server.connect("operator").await;
    let operator_js = jetstream::new(operator.client.clone());
    let rejected = names.event_subject("task.rejected", "billing", "injected");
    let found = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            let stream = operator_js.get_stream(names.events_stream()).await.expect("events stream");
            if let Ok(message) = stream.get_last_raw_message_by_subject(&rejected).await {
                return String::from_utf8_lossy(&message.payload).to_string();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(found.is_err(), "demo's events reached billing's intake: {found:?}");

    // Dead letters: a worker stores one in demo and one in billing.
    let worker = server.connect("worker").await;
    let worker_js = jetstream::new(worker.client.clone());
    let mut sequences = Vec::new();
    for (namespace, id) in [("demo", "report"), ("billing", "payroll"), ("demo", "report")] {
        let execution = uuid::Uuid::new_v4().to_string();
        let ack = worker_js
            .publish(
                names.dlq_subject("default", namespace, id),
                dead_letter(namespace, id, &execution).to_string().into(),
            )
            .await
            .expect("publish dead letter")
            .await
            .expect("dead letter stored");
        sequences.push(ack.sequence);
    }
    let [demo_seq, billing_seq, demo_seq2] = sequences[..] else { unreachable!() };
    let listed = ask(&tenant.client, dlq("list"), json!({})).await;
    let listed: Vec<u64> = listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["sequence"].as_u64())
        .collect();
    assert_eq!(listed, [demo_seq, demo_seq2], "dlq list shows demo's only");
    for endpoint in ["get", "replay", "purge"] {
        let reply = ask(&tenant.client, dlq(endpoint), json!({"sequence": billing_seq})).await;
        assert_eq!(reply["error"]["code"], "namespace_mismatch", "{endpoint} of billing's entry: {reply}");
    }
    let replayed = ask(&tenant.client, dlq("replay"), json!({"sequence": demo_seq})).await;
    assert_eq!(replayed["replayed"][0]["sequence"], demo_seq, "{replayed}");
    let purged = ask(&tenant.client, dlq("purge"), json!({"all": true})).await;
    assert_eq!(purged["purged"], 1, "purge all in demo purges demo's: {purged}");
    let billing_entry =
        ask(&admin.client, names.dlq_api_subject("get"), json!({"sequence": billing_seq})).await;
    assert_eq!(billing_entry["entry"]["namespace"], "billing", "billing's dead letter kept: {billing_entry}");

    // Run records: readable through the registry for demo's runs only.
    let runs = worker_js.get_key_value(names.runs_bucket()).await.expect("runs bucket");
    for (execution, namespace) in [("run-demo", "demo"), ("run-billing", "billing")] {
        let record =
            json!({"execution_id": execution, "namespace": namespace, "task_id": "t", "status": "succeeded"});
        runs.put(execution, record.to_string().into()).await.expect("run record");
    }
    let runs_get = names.runs_api_namespaced("get", "demo");
    let own = ask(&tenant.client, runs_get.clone(), json!({"execution_id": "run-demo"})).await;
    assert_eq!(own["run"]["namespace"], "demo", "{own}");
    let theirs = ask(&tenant.client, runs_get, json!({"execution_id": "run-billing"})).await;
    assert_eq!(theirs["error"]["code"], "not_found", "{theirs}");
    refused(&tenant, names.runs_api_namespaced("get", "billing")).await;

    // The CLI as the tenant: namespaced subjects, its own inbox prefix, its own events.
    for args in [
        vec!["get", "demo/report"],
        vec!["ls", "--namespace", "demo"],
        vec!["pause", "demo/report"],
        vec!["next", "demo/report"],
        vec!["dlq", "ls", "--namespace", "demo"],
        vec!["events", "--namespace", "demo", "--last", "5"],
        vec!["runs", "demo/report"],
    ] {
        let output = tokio::process::Command::new(workspace_bin("jetsched"))
            .args(&args)
            .env("NATS_URL", &server.url)
            .env("NATS_USER", TENANT)
            .env("NATS_PASSWORD", password(TENANT))
            .env("NATS_INBOX_PREFIX", Names::namespace_inbox_prefix("demo"))
            .output()
            .await
            .expect("run jetsched");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "jetsched {} as {TENANT}: {stdout}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!stdout.contains("billing"), "jetsched {} showed billing: {stdout}", args.join(" "));
    }

    // Nothing changed in billing.
    let billing_after =
        ask(&admin.client, names.task_api_subject("get"), json!({"namespace": "billing", "id": "payroll"}))
            .await;
    assert_eq!(billing_after["revision"], billing_before["revision"], "billing changed: {billing_after}");
    assert_eq!(billing_after["task"]["paused"], false);
    let planted =
        ask(&admin.client, names.task_api_subject("get"), json!({"namespace": "billing", "id": "planted"}))
            .await;
    assert_eq!(planted["error"]["code"], "not_found", "{planted}");

    registry.stop().await;
    // The registry never hit a violation: only the probes did, and the CLI's `runs`, which
    // asks for the events stream's information first and, refused, reads the task's events
    // through the tenant's own consumer.
    let log = server.log();
    let unexpected: Vec<&str> = log
        .lines()
        .filter(|line| line.to_lowercase().contains("violation"))
        .filter(|line| !line.contains(":probe-tenant-demo\""))
        .filter(|line| !(line.contains(":jetsched-cli\"") && line.contains("STREAM.INFO")))
        .collect();
    assert!(unexpected.is_empty(), "unexpected permission violations:\n{}", unexpected.join("\n"));
}
