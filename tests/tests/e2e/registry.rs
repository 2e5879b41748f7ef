//! End-to-end tests of jetsched-registry against a real nats-server (single node and a
//! 3-node cluster with R3 streams): the task API, compare-and-set, durable intake, events and
//! topology convergence.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use async_nats::service::NATS_SERVICE_ERROR_CODE;
use futures::StreamExt;
use jetsched_registry::Config;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, Change, Storage, TopologyArgs, TopologyError};
use jetsched_shared::wire::HDR_EXPECTED_REVISION;
use jetsched_tests::{
    Api, App, NatsCluster, NatsServer, ServerOpts, WithTopology, always, eventually, last_message,
    server_with_topology, spec, stream_info,
};
use serde_json::{Value, json};

mod listing;

const WAIT: Duration = Duration::from_secs(10);

pub(crate) fn config(url: &str, replicas: usize) -> Config {
    let mut config = Config::for_tests(url);
    config.shared.topology.replicas = replicas;
    config
}

/// The registry tests' task: at 02:30 in Berlin every night, labelled.
fn nightly(namespace: &str, id: &str) -> Value {
    spec(namespace, id)
        .cron_in("0 30 2 * * *", "Europe/Berlin")
        .nats("jobs.report")
        .labels(&[("team", "billing")])
        .json()
}

/// A server with a registry of `config` (changed by `adjust`), and a connection to both. The
/// server and the registry stop when dropped: a test binds both (`server: _server` at least).
pub(crate) struct Served {
    pub(crate) server: NatsServer,
    pub(crate) registry: App,
    pub(crate) client: async_nats::Client,
    pub(crate) api: Api,
    pub(crate) js: jetstream::Context,
}

pub(crate) async fn served(adjust: impl FnOnce(&mut Config)) -> Served {
    let server = NatsServer::start().await;
    let mut config = config(&server.url(), 1);
    adjust(&mut config);
    let registry = App::registry(config).await;
    let client = server.client().await;
    let (api, js) = (Api::new(&client), jetstream::new(client.clone()));
    Served { server, registry, client, api, js }
}

fn error_code(reply: &Value) -> &str {
    reply["error"]["code"].as_str().unwrap_or_else(|| panic!("expected an error, got {reply}"))
}

/// Publishes `body` to the intake `subject` and waits until the stream stored it.
async fn submit(js: &jetstream::Context, subject: &str, body: &Value) {
    js.publish(subject.to_string(), serde_json::to_vec(body).unwrap().into()).await.unwrap().await.unwrap();
}

async fn stored_revision(js: &jetstream::Context, key: &str) -> Option<u64> {
    let kv = js.get_key_value(Names::default().tasks_bucket()).await.expect("tasks bucket");
    kv.entry(key)
        .await
        .expect("read")
        .filter(|e| e.operation == jetstream::kv::Operation::Put)
        .map(|e| e.revision)
}

async fn last_event(js: &jetstream::Context, kind: &str, namespace: &str, id: &str) -> Option<Value> {
    let names = Names::default();
    let stream = js.get_stream(names.events_stream()).await.ok()?;
    let message =
        stream.get_last_raw_message_by_subject(&names.event_subject(kind, namespace, id)).await.ok()?;
    serde_json::from_slice(&message.payload).ok()
}

/// The event of `kind` about the task, waited for: the registry replies before its event pump
/// has published the event.
async fn event_of(js: &jetstream::Context, kind: &str, namespace: &str, id: &str) -> Value {
    eventually(WAIT, &format!("{kind} event of {namespace}/{id}"), || last_event(js, kind, namespace, id))
        .await
}

/// The API round trip every deployment must pass: put, get, list, pause, resume, next,
/// trigger, delete, with their events.
async fn api_suite(client: async_nats::Client) {
    let (api, js) = (Api::new(&client), jetstream::new(client.clone()));

    let reply = api.put(&nightly("billing", "nightly")).await;
    let revision =
        reply["revision"].as_u64().unwrap_or_else(|| panic!("put replies with a revision: {reply}"));
    assert_eq!(reply["task"]["id"], "nightly");
    assert_eq!(reply["task"]["queue"], "default", "defaults are filled in");
    assert_eq!(stored_revision(&js, "billing.nightly").await, Some(revision));
    let event = event_of(&js, "task.registered", "billing", "nightly").await;
    assert_eq!(event["revision"].as_u64(), Some(revision));

    let got = api.task("get", json!({"namespace": "billing", "id": "nightly"})).await;
    assert_eq!(got["revision"].as_u64(), Some(revision));
    assert_eq!(got["task"]["schedule"]["timezone"], "Europe/Berlin");

    // Update: a new revision and task.updated.
    let mut changed = nightly("billing", "nightly");
    changed["labels"]["tier"] = json!("gold");
    let updated = api.put(&changed).await;
    let revision2 = updated["revision"].as_u64().expect("revision");
    assert!(revision2 > revision);
    event_of(&js, "task.updated", "billing", "nightly").await;

    // List: namespace and label filters, cursor paging.
    for i in 0..5 {
        let mut s = nightly("listing", &format!("t{i}"));
        s["labels"]["parity"] = json!(if i % 2 == 0 { "even" } else { "odd" });
        api.put(&s).await;
    }
    let page1 = api.task("list", json!({"namespace": "listing", "limit": 2})).await;
    let ids: Vec<&str> =
        page1["tasks"].as_array().unwrap().iter().map(|t| t["task"]["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["t0", "t1"]);
    let cursor = page1["next_cursor"].as_str().expect("more pages").to_string();
    let page2 = api.task("list", json!({"namespace": "listing", "limit": 2, "cursor": cursor})).await;
    let ids: Vec<&str> =
        page2["tasks"].as_array().unwrap().iter().map(|t| t["task"]["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["t2", "t3"]);
    let even = api.task("list", json!({"namespace": "listing", "labels": {"parity": "even"}})).await;
    let ids: Vec<&str> =
        even["tasks"].as_array().unwrap().iter().map(|t| t["task"]["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["t0", "t2", "t4"]);
    assert!(even.get("next_cursor").is_none());
    let all = api.task("list", json!({})).await;
    assert_eq!(all["tasks"].as_array().unwrap().len(), 6, "every namespace: {all}");

    // Pause and resume: CAS updates with events; pausing twice changes nothing.
    let paused = api.task("pause", json!({"namespace": "billing", "id": "nightly"})).await;
    assert_eq!(paused["task"]["paused"], true);
    let paused_again = api.task("pause", json!({"namespace": "billing", "id": "nightly"})).await;
    assert_eq!(paused_again["revision"], paused["revision"], "already paused: no new revision");
    event_of(&js, "task.paused", "billing", "nightly").await;
    let resumed = api.task("resume", json!({"namespace": "billing", "id": "nightly"})).await;
    assert_eq!(resumed["task"]["paused"], false);
    event_of(&js, "task.resumed", "billing", "nightly").await;

    // Next fires of the stored task: 02:30 Berlin = 01:30Z in winter, 00:30Z in summer.
    let next = api
        .task(
            "next",
            json!({"namespace": "billing", "id": "nightly", "count": 3, "after": "2026-01-10T00:00:00Z"}),
        )
        .await;
    assert_eq!(next["timezone"], "Europe/Berlin");
    assert_eq!(
        next["times"],
        json!(["2026-01-10T01:30:00.000Z", "2026-01-11T01:30:00.000Z", "2026-01-12T01:30:00.000Z"])
    );
    // ... and of an inline spec (not stored).
    let inline =
        json!({"id": "preview", "schedule": {"every": "15m"}, "executor": {"kind": "nats", "subject": "x"}});
    let next = api.task("next", json!({"spec": inline, "count": 2, "after": "2026-01-10T00:07:00Z"})).await;
    assert_eq!(next["times"], json!(["2026-01-10T00:15:00.000Z", "2026-01-10T00:30:00.000Z"]));
    assert_eq!(stored_revision(&js, "default.preview").await, None, "next never stores");

    // Trigger: a manual run in the dispatch stream with its own execution id.
    let trigger = api.task("trigger", json!({"namespace": "billing", "id": "nightly"})).await;
    let execution_id = trigger["execution_id"].as_str().expect("execution id").to_string();
    let names = Names::default();
    let message =
        last_message(&js, &names.dispatch_stream(), &names.dispatch_subject("default", "billing", "nightly"))
            .await;
    let body: Value = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(body["execution_id"], execution_id.as_str());
    assert_eq!(body["trigger"], "manual");
    assert_eq!(body["spec"]["id"], "nightly");
    let headers = message.headers;
    assert_eq!(headers.get("Jetsched-Trigger").map(|v| v.as_str()), Some("manual"));
    assert_eq!(headers.get("Jetsched-Execution-Id").map(|v| v.as_str()), Some(execution_id.as_str()));

    // Delete: gone, an event, and not found afterwards.
    let deleted = api.task("delete", json!({"namespace": "billing", "id": "nightly"})).await;
    assert_eq!(deleted["deleted"], true);
    assert_eq!(stored_revision(&js, "billing.nightly").await, None);
    event_of(&js, "task.deleted", "billing", "nightly").await;
    let missing = api.task("get", json!({"namespace": "billing", "id": "nightly"})).await;
    assert_eq!(error_code(&missing), "not_found");
    let missing = api.task("delete", json!({"namespace": "billing", "id": "nightly"})).await;
    assert_eq!(error_code(&missing), "not_found");
}

/// Two concurrent puts with the same expected revision: exactly one wins.
async fn cas_suite(client: async_nats::Client) {
    let api = Api::new(&client);
    let first = api.put(&nightly("cas", "job")).await;
    let revision = first["revision"].as_u64().unwrap();
    for round in 0..10 {
        let current =
            api.task("get", json!({"namespace": "cas", "id": "job"})).await["revision"].as_u64().unwrap();
        let mut a = nightly("cas", "job");
        a["labels"]["writer"] = json!("a");
        let mut b = nightly("cas", "job");
        b["labels"]["writer"] = json!("b");
        let (ra, rb) = tokio::join!(api.put_over(&a, current), api.put_over(&b, current));
        let wins = [&ra, &rb].iter().filter(|r| r.get("revision").is_some()).count();
        assert_eq!(wins, 1, "round {round}: exactly one CAS put wins: {ra} / {rb}");
        let loser = if ra.get("error").is_some() { &ra } else { &rb };
        assert_eq!(error_code(loser), "conflict");
        let winner_revision =
            if ra.get("revision").is_some() { &ra } else { &rb }["revision"].as_u64().unwrap();
        assert_eq!(
            loser["error"]["current_revision"].as_u64(),
            Some(winner_revision),
            "conflict carries the current revision"
        );
    }
    assert!(revision > 0);

    // Create-only on an existing task, and expected revision 0, are conflicts.
    let reply = api.create(&nightly("cas", "job")).await;
    assert_eq!(error_code(&reply), "conflict");
    let fresh = api.create(&nightly("cas", "fresh")).await;
    assert!(fresh["revision"].as_u64().is_some(), "create-only creates a new task: {fresh}");
    assert_eq!(error_code(&api.put_over(&nightly("cas", "fresh"), 0).await), "conflict");
    let mut headers = HeaderMap::new();
    headers.insert(HDR_EXPECTED_REVISION, "banana");
    let reply = api.put_with(&nightly("cas", "fresh"), headers).await;
    assert_eq!(error_code(&reply), "bad_request");
    assert_eq!(reply["error"]["field"], HDR_EXPECTED_REVISION);
}

#[tokio::test]
async fn registry_api_on_a_single_node() {
    let Served { server: _server, registry, client, .. } = served(|_| {}).await;
    api_suite(client.clone()).await;
    cas_suite(client).await;
    registry.stop().await;
}

#[tokio::test]
async fn registry_api_on_a_three_node_cluster_with_r3() {
    let cluster = NatsCluster::start().await;
    let registry = App::registry(config(&cluster.urls(), 3)).await;
    let client = cluster.client().await;
    let js = jetstream::new(client.clone());
    let replicas = stream_info(&js, &Names::default().dispatch_stream()).await.config.num_replicas;
    assert_eq!(replicas, 3, "streams are R3");
    api_suite(client.clone()).await;
    cas_suite(client).await;
    registry.stop().await;
}

#[tokio::test]
async fn bad_requests_get_structured_errors_and_store_nothing() {
    let Served { server: _server, registry, api, js, .. } =
        served(|config| config.max_spec_bytes = 4096).await;
    let names = Names::default();

    let raw = |body: &str| body.as_bytes().to_vec();
    let cases: Vec<(Vec<u8>, &str, Option<&str>)> = vec![
        (raw("{not json"), "invalid_json", None),
        (raw(r#"{"id":"x","schedule":{"every":"1m"},"executor":{"kind":"nats","subject":"a"},"colour":"red"}"#), "unknown_field", Some("colour")),
        (raw(r#"{"id":"x","schedule":{"cron":"61 * * * * *"},"executor":{"kind":"nats","subject":"a"}}"#), "invalid_cron", Some("schedule.cron")),
        (raw(r#"{"id":"x","schedule":{"cron":"0 * * * * *","timezone":"Mars/Olympus"},"executor":{"kind":"nats","subject":"a"}}"#), "unknown_timezone", Some("schedule.timezone")),
        (raw(r#"{"id":"x","schedule":{"at":"2001-01-01T00:00:00Z"},"executor":{"kind":"nats","subject":"a"}}"#), "in_the_past", Some("schedule.at")),
        (raw(r#"{"id":"x y","schedule":{"every":"1m"},"executor":{"kind":"nats","subject":"a"}}"#), "invalid_id", Some("id")),
        (raw(r#"{"id":"x","schedule":{"every":"0s"},"executor":{"kind":"nats","subject":"a"}}"#), "invalid_duration", Some("schedule.every")),
        (raw(r#"{"id":"x","schedule":{"every":"1m"},"executor":{"kind":"nats","subject":"a"},"timeout":30}"#), "invalid_type", Some("timeout")),
        (format!(r#"{{"id":"x","schedule":{{"every":"1m"}},"executor":{{"kind":"nats","subject":"a","payload":"{}"}}}}"#, "p".repeat(5000)).into_bytes(), "payload_too_large", None),
    ];
    for (body, code, field) in cases {
        let reply =
            api.reply(names.task_api_subject("put"), HeaderMap::new(), body.clone()).await.expect("a reply");
        assert_eq!(
            error_code(&reply),
            code,
            "{}: {reply}",
            String::from_utf8_lossy(&body[..body.len().min(120)])
        );
        if let Some(field) = field {
            assert_eq!(reply["error"]["field"], field, "{reply}");
        }
        assert!(reply["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    assert_eq!(stored_revision(&js, "default.x").await, None, "nothing stored");
    let keys = js.get_key_value(names.tasks_bucket()).await.unwrap().keys().await.unwrap().count().await;
    assert_eq!(keys, 0, "no key written by any bad request");

    // Requests other than put.
    let reply = api.task("get", json!({"namespace": "default"})).await;
    assert_eq!((error_code(&reply), reply["error"]["field"].as_str()), ("missing_field", Some("id")));
    let reply = api.task("get", json!({"id": "a.b"})).await;
    assert_eq!(error_code(&reply), "invalid_id");
    let reply = api.task("list", json!({"limit": 0})).await;
    assert_eq!(error_code(&reply), "bad_request");
    let reply = api.task("next", json!({"id": "x", "spec": {}})).await;
    assert_eq!(error_code(&reply), "bad_request");
    let reply = api.task("next", json!({"spec": {"id": "x", "schedule": {"cron": "bad"}, "executor": {"kind": "nats", "subject": "a"}}})).await;
    assert_eq!(
        (error_code(&reply), reply["error"]["field"].as_str()),
        ("invalid_cron", Some("spec.schedule.cron"))
    );
    for subject in [names.task_api_subject("frobnicate"), format!("{}.api.nothing.here", names.prefix())] {
        assert_eq!(error_code(&api.call(subject, json!({})).await), "unknown_endpoint");
    }

    // Still alive and serving after all that.
    let reply = api.put(&nightly("default", "ok")).await;
    assert!(reply["revision"].as_u64().is_some());
    registry.stop().await;
}

#[tokio::test]
async fn the_registry_is_a_discoverable_micro_service() {
    let Served { server: _server, registry, client, api, .. } = served(|_| {}).await;
    let names = Names::default();
    let info =
        client.request(format!("$SRV.INFO.{}", names.service_name()), "".into()).await.expect("service info");
    let info: Value = serde_json::from_slice(&info.payload).unwrap();
    let subjects: Vec<&str> =
        info["endpoints"].as_array().unwrap().iter().map(|e| e["subject"].as_str().unwrap()).collect();
    for endpoint in ["put", "get", "list", "delete", "pause", "resume", "trigger", "next"] {
        assert!(subjects.contains(&names.task_api_subject(endpoint).as_str()), "{endpoint} in {subjects:?}");
    }
    // The admin port answers, and counts requests by endpoint and outcome.
    let reply = api.task("get", json!({"namespace": "default", "id": "nothing"})).await;
    assert_eq!(error_code(&reply), "not_found");
    let metrics = registry.metrics().await;
    assert!(
        metrics.contains(r#"jetsched_api_requests_total{endpoint="get",outcome="not_found"} 1"#),
        "{metrics}"
    );
    assert!(registry.admin_get("/healthz").await.is_ok());
    let ready = registry.admin_get("/readyz").await.body;
    assert!(ready.contains("\"ready\":true"), "{ready}");
    // A refusal sets the micro-service error headers, a success none.
    for (body, refused) in [(json!({"id": "nothing"}), true), (json!({}), false)] {
        let endpoint = if refused { "get" } else { "list" };
        let reply = client
            .request(names.task_api_subject(endpoint), body.to_string().into())
            .await
            .expect("the registry answers");
        let error_header = reply.headers.as_ref().and_then(|h| h.get(NATS_SERVICE_ERROR_CODE)).is_some();
        assert_eq!(error_header, refused, "{endpoint}: {:?}", reply.headers);
    }
    registry.stop().await;
}

#[tokio::test]
async fn intake_applies_submissions_sent_while_the_registry_was_down() {
    // The topology exists (another service created it); no registry runs.
    let WithTopology { server, js, names, .. } = server_with_topology(TopologyArgs::default()).await;

    let valid = nightly("intake", "late");
    submit(&js, &names.submit_subject("intake", "late"), &valid).await;
    // The body may omit id and namespace: the subject names the task.
    let bare = json!({"schedule": {"every": "1h"}, "executor": {"kind": "nats", "subject": "x"}});
    submit(&js, &names.submit_subject("intake", "bare"), &bare).await;
    let invalid = json!({"schedule": {"cron": "not a cron"}, "executor": {"kind": "nats", "subject": "x"}});
    submit(&js, &names.submit_subject("intake", "broken"), &invalid).await;
    let mismatched = nightly("other", "late");
    submit(&js, &names.submit_subject("intake", "mismatch"), &mismatched).await;
    assert_eq!(stored_revision(&js, "intake.late").await, None, "nothing applied without a registry");

    let registry = App::registry(config(&server.url(), 1)).await;
    eventually(WAIT, "valid submissions are stored", || async {
        stored_revision(&js, "intake.late").await.is_some()
            && stored_revision(&js, "intake.bare").await.is_some()
    })
    .await;
    let rejected = eventually(WAIT, "task.rejected for the invalid spec", || {
        last_event(&js, "task.rejected", "intake", "broken")
    })
    .await;
    assert!(rejected["reason"].as_str().unwrap().contains("invalid_cron"), "{rejected}");
    let rejected = eventually(WAIT, "task.rejected for the mismatched subject", || {
        last_event(&js, "task.rejected", "intake", "mismatch")
    })
    .await;
    assert!(rejected["error"].as_str().unwrap().contains("subject"), "{rejected}");
    assert_eq!(stored_revision(&js, "intake.broken").await, None);
    assert_eq!(stored_revision(&js, "intake.mismatch").await, None);
    assert_eq!(stored_revision(&js, "other.late").await, None);
    // Every submission was acked: nothing left in the work-queue stream.
    eventually(WAIT, "intake stream drained", || async {
        js.get_stream(names.intake_stream()).await.unwrap().info().await.unwrap().state.messages == 0
    })
    .await;
    registry.stop().await;
}

#[tokio::test]
async fn topology_converges_and_names_conflicting_settings() {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let args = TopologyArgs::default();
    let first = topology::ensure(&js, &names, &args).await.expect("first run creates");
    assert_eq!(first.changes.len(), 21, "eight streams and thirteen buckets created: {:?}", first.changes);
    // Runs delayed by an open breaker wait in the dispatch stream as server-scheduled messages.
    let dispatch = js.get_stream(names.dispatch_stream()).await.unwrap().info().await.unwrap().config.clone();
    assert!(dispatch.allow_message_schedules, "{dispatch:?}");
    assert!(dispatch.subjects.contains(&names.delayed_wildcard()), "{:?}", dispatch.subjects);
    let second = topology::ensure(&js, &names, &args).await.expect("second run converges");
    assert!(second.changes.is_empty(), "nothing to change on a second run: {:?}", second.changes);
    // Two services starting at once.
    let (a, b) = tokio::join!(topology::ensure(&js, &names, &args), topology::ensure(&js, &names, &args));
    a.expect("concurrent a");
    b.expect("concurrent b");

    // A mutable setting converges.
    let changed =
        TopologyArgs { events_max_age: Duration::from_secs(3600), tasks_history: 10, ..args.clone() };
    topology::ensure(&js, &names, &changed).await.expect("converges");
    assert_eq!(stream_info(&js, &names.events_stream()).await.config.max_age, Duration::from_secs(3600));
    let history =
        stream_info(&js, &format!("KV_{}", names.tasks_bucket())).await.config.max_messages_per_subject;
    assert_eq!(history, 10);

    // An immutable one is a clear error naming the setting.
    let memory = TopologyArgs { storage: Storage::Memory, ..args.clone() };
    let error = topology::ensure(&js, &names, &memory).await.err().expect("storage cannot change");
    match &error {
        TopologyError::Conflict { setting, .. } => assert_eq!(*setting, "storage"),
        other => panic!("expected a conflict, got {other}"),
    }
    assert!(error.to_string().contains("storage"), "{error}");
    let error =
        topology::ensure(&js, &names, &TopologyArgs { replicas: 0, ..args }).await.err().expect("invalid");
    assert!(error.to_string().contains("replicas"), "{error}");
}

#[tokio::test]
async fn the_number_of_partitions_is_recorded_once_and_a_service_configured_otherwise_refuses_to_start() {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let args = TopologyArgs::default();
    let partitions_of = |config: &async_nats::jetstream::stream::Config| {
        config.metadata.get(jetsched_shared::partition::METADATA_KEY).cloned()
    };

    // A deployment made before partitions: its dispatch stream records no number.
    topology::ensure(&js, &names, &args).await.expect("created");
    let mut config = stream_info(&js, &names.dispatch_stream()).await.config;
    assert_eq!(partitions_of(&config).as_deref(), Some("64"), "the default is recorded at creation");
    config.metadata.remove(jetsched_shared::partition::METADATA_KEY);
    js.update_stream(&config).await.expect("an older deployment's stream");
    assert_eq!(partitions_of(&stream_info(&js, &names.dispatch_stream()).await.config), None);

    // Its first start after the upgrade records the number and says so.
    let upgraded = topology::ensure(&js, &names, &args).await.expect("upgrade");
    let recorded = upgraded.changes.iter().any(|change| {
        matches!(change, Change::Converged { resource, difference }
            if resource == &names.dispatch_stream() && difference.setting == "partitions"
                && difference.existing == "none" && difference.desired == "64")
    });
    assert!(recorded, "{:?}", upgraded.changes);
    assert_eq!(
        partitions_of(&stream_info(&js, &names.dispatch_stream()).await.config).as_deref(),
        Some("64")
    );

    // Another number is refused, naming both, and the recorded one stays.
    let other = TopologyArgs { partitions: 16, ..args.clone() };
    let error = topology::ensure(&js, &names, &other).await.err().expect("partitions cannot change");
    match &error {
        TopologyError::Conflict { resource, setting, existing, desired } => {
            assert_eq!((resource.as_str(), *setting), (names.dispatch_stream().as_str(), "partitions"));
            assert_eq!((existing.as_str(), desired.as_str()), ("64", "16"));
        }
        other => panic!("expected a conflict, got {other}"),
    }
    assert_eq!(
        partitions_of(&stream_info(&js, &names.dispatch_stream()).await.config).as_deref(),
        Some("64")
    );
    assert!(topology::ensure(&js, &names, &args).await.expect("the same number").changes.is_empty());

    // Out of range: named before anything is touched.
    for partitions in [0, 4097] {
        let error = topology::ensure(&js, &names, &TopologyArgs { partitions, ..args.clone() })
            .await
            .err()
            .expect("invalid");
        let message = error.to_string();
        assert!(message.contains("partitions") && message.contains("1..=4096"), "{message}");
    }
}

#[tokio::test]
async fn topology_on_a_server_without_room_for_the_stream_reservations_fails_at_once_and_says_what_to_change()
{
    // 1.5 GiB of file store: the 1 GiB DLQ reservation fits, the 1 GiB events one does not.
    let opts = ServerOpts::default().jetstream_config("  max_file_store: 1536MB");
    let server = NatsServer::start_with(opts).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let args = TopologyArgs::default();

    let started = std::time::Instant::now();
    let error = topology::ensure(&js, &names, &args).await.err().expect("no room for the events stream");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not retried for the topology wait: {:?}",
        started.elapsed()
    );
    match &error {
        TopologyError::NoRoom { resource, max_bytes, .. } => {
            assert_eq!(resource, &names.events_stream());
            assert_eq!(*max_bytes, 1 << 30);
        }
        other => panic!("expected NoRoom, got {other}"),
    }
    let message = format!("{:#}", anyhow::Error::from(error));
    for hint in ["max_file_store", "--events-max-bytes", "insufficient storage"] {
        assert!(message.contains(hint), "{hint} missing from: {message}");
    }

    // A smaller limit fits; growing the DLQ past the store afterwards is refused the same way
    // and leaves the stream as it was.
    let fitting = TopologyArgs { events_max_bytes: 256 << 20, ..args.clone() };
    topology::ensure(&js, &names, &fitting).await.expect("fits in 1.5 GiB");
    let grown = TopologyArgs { dlq_max_bytes: 2 << 30, ..fitting.clone() };
    let error = topology::ensure(&js, &names, &grown).await.err().expect("no room to grow the DLQ");
    assert!(
        matches!(&error, TopologyError::NoRoom { resource, .. } if *resource == names.dlq_stream()),
        "{error}"
    );
    let dlq = js.get_stream(names.dlq_stream()).await.unwrap().info().await.unwrap().config.max_bytes;
    assert_eq!(dlq, 1 << 30, "the DLQ keeps its limit");
}

#[tokio::test]
async fn topology_waits_for_a_cluster_without_quorum_and_gives_up_with_a_clear_error() {
    let mut cluster = NatsCluster::start().await;
    // Two of three nodes gone: no meta leader, so JetStream cannot answer.
    cluster.kill_node(1);
    cluster.kill_node(2);
    let js = jetstream::new(cluster.client_to(0).await);
    let names = Names::default();
    let args = TopologyArgs { replicas: 3, ..TopologyArgs::default() };

    let impatient = TopologyArgs { topology_wait: Duration::from_secs(1), ..args.clone() };
    let error = topology::ensure(&js, &names, &impatient).await.err().expect("no quorum, no topology");
    match &error {
        TopologyError::Unavailable { attempts, last, .. } => {
            assert!(*attempts >= 1);
            assert!(matches!(**last, TopologyError::Nats { .. }), "{last}");
        }
        other => panic!("expected Unavailable, got {other}"),
    }
    let message = format!("{:#}", anyhow::Error::from(error));
    assert!(message.contains("could not set up the topology within"), "{message}");

    // A service started now waits for the quorum to come back instead of failing.
    let waiting = tokio::spawn({
        let js = js.clone();
        async move { topology::ensure(&js, &Names::default(), &args).await }
    });
    always(Duration::from_secs(2), "ensure waits for the quorum", || async { !waiting.is_finished() }).await;
    cluster.restart_node(1).await;
    cluster.restart_node(2).await;
    let topology = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("ensure finishes once the cluster is back")
        .expect("no panic")
        .expect("topology ensured");
    assert_eq!(topology.tasks.status().await.expect("tasks bucket").info.config.num_replicas, 3);
    for config in topology::stream_configs(&names, &TopologyArgs::default()) {
        let info = js.get_stream(&config.name).await.unwrap().info().await.unwrap().clone();
        assert_eq!(info.config.num_replicas, 3, "{}", config.name);
    }
}

#[tokio::test]
async fn several_registry_replicas_share_the_api_and_the_intake() {
    let server = NatsServer::start().await;
    let mut first = config(&server.url(), 1);
    first.shared.common.instance_id = Some("registry-a".into());
    let mut second = config(&server.url(), 1);
    second.shared.common.instance_id = Some("registry-b".into());
    let (a, b) = tokio::join!(App::registry(first), App::registry(second));
    let client = server.client().await;
    let (api, js) = (Api::new(&client), jetstream::new(client.clone()));
    let names = Names::default();

    let puts = (0..40).map(|i| {
        let api = api.clone();
        async move { api.put(&nightly("replicas", &format!("api{i}"))).await }
    });
    for reply in futures::future::join_all(puts).await {
        assert!(reply["revision"].as_u64().is_some(), "{reply}");
    }
    for i in 0..40 {
        let subject = names.submit_subject("replicas", &format!("intake{i}"));
        submit(&js, &subject, &nightly("replicas", &format!("intake{i}"))).await;
    }
    eventually(WAIT, "every intake submission applied once", || async {
        let listed = api.task("list", json!({"namespace": "replicas", "limit": 1000})).await;
        listed["tasks"].as_array().map(|t| t.len()) == Some(80)
    })
    .await;

    // Both replicas answered requests (a queue group spreads them).
    let mut answered = Vec::new();
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply(format!("$SRV.STATS.{}", names.service_name()), inbox, "".into())
        .await
        .unwrap();
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(500), replies.next()).await {
        let stats: Value = serde_json::from_slice(&message.payload).unwrap();
        let put_requests = stats["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "put")
            .map(|e| e["num_requests"].as_u64().unwrap_or(0))
            .unwrap_or(0);
        answered.push(put_requests);
    }
    assert_eq!(answered.len(), 2, "two replicas answer $SRV.STATS: {answered:?}");
    assert_eq!(answered.iter().sum::<u64>(), 40, "every put answered exactly once: {answered:?}");
    assert!(answered.iter().all(|n| *n > 0), "both replicas served puts: {answered:?}");
    a.stop().await;
    b.stop().await;
}

/// A spec with three problems: `put`, an inline `next` and an intake submission each name all
/// three with their field paths (in the spec's order), `error` is the first and sets the
/// micro-service error headers, and nothing is stored.
#[tokio::test]
async fn a_spec_with_three_problems_is_refused_with_all_three() {
    let Served { server: _server, registry, client, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let broken = |id: &str| {
        json!({
            "id": id, "namespace": "many",
            "schedule": {"cron": "0 61 * * * *"},
            "executor": {"kind": "nats", "subject": "jobs.*"},
            "timeout": "forever"
        })
    };
    let expected = [
        ("invalid_cron", "schedule.cron"),
        ("invalid_value", "executor.subject"),
        ("invalid_duration", "timeout"),
    ];
    let problems = |reply: &Value| -> Vec<(String, String)> {
        reply["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("errors: {reply}"))
            .iter()
            .map(|e| (e["code"].as_str().unwrap().to_string(), e["field"].as_str().unwrap().to_string()))
            .collect()
    };
    let expected_with = |prefix: &str| -> Vec<(String, String)> {
        expected.iter().map(|(code, field)| (code.to_string(), format!("{prefix}{field}"))).collect()
    };

    let raw = client
        .request(names.task_api_subject("put"), broken("put").to_string().into())
        .await
        .expect("the registry answers");
    let reply: Value = serde_json::from_slice(&raw.payload).expect("a JSON reply");
    assert!(raw.headers.as_ref().and_then(|h| h.get(NATS_SERVICE_ERROR_CODE)).is_some(), "{reply}");
    assert_eq!(problems(&reply), expected_with(""), "{reply}");
    assert_eq!(reply["error"], reply["errors"][0], "error is the first of errors");
    assert!(reply["errors"].as_array().unwrap().iter().all(|e| !e["message"].as_str().unwrap().is_empty()));
    assert_eq!(stored_revision(&js, "many.put").await, None, "nothing stored");

    let next = api.task("next", json!({"spec": broken("next")})).await;
    assert_eq!(problems(&next), expected_with("spec."), "{next}");

    submit(&js, &names.submit_subject("many", "intake"), &broken("intake")).await;
    let rejected = eventually(WAIT, "task.rejected for the spec with three problems", || {
        last_event(&js, "task.rejected", "many", "intake")
    })
    .await;
    let reason: Value = serde_json::from_str(rejected["reason"].as_str().expect("a reason")).expect("JSON");
    assert_eq!(problems(&reason), expected_with(""), "{rejected}");
    assert_eq!(rejected["error"], reason["error"]["message"], "{rejected}");
    assert_eq!(stored_revision(&js, "many.intake").await, None, "nothing stored");
    registry.stop().await;
}

/// How long the DLQ API test waits for runs and replies.
const DLQ_WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn dead_letters_are_listed_replayed_and_purged_through_the_registry_api() {
    use jetsched_shared::wire::{RunStatus, Trigger};
    use jetsched_tests::fixtures::{Flaky, dead_letter_of, dead_letters, dispatch, wait_run_status};
    use jetsched_worker::Handlers;

    let Served { server, registry, api, js, .. } = served(|_| {}).await;
    // Fails until it recovers: dead letters first, successful replays after.
    let downstream = Flaky::failing("not yet");
    let handlers = Handlers::new().register("until-fixed", downstream.clone());
    let worker = App::worker(jetsched_worker::Config::for_tests(&server.url(), "w-replay"), handlers).await;
    let names = Names::default();
    let task = |id: &str| spec("wk", id).handler("until-fixed").fast_retry(1).timeout("5s").task();
    let one = dispatch(&js, &names, &task("replay-one"), 1).await;
    let mut bulk = Vec::new();
    for n in 0..3 {
        bulk.push(dispatch(&js, &names, &task("replay-bulk"), n).await);
    }
    let doomed = dispatch(&js, &names, &task("purge-me"), 1).await;
    for id in bulk.iter().chain([&one, &doomed]) {
        dead_letter_of(&js, &names, id, DLQ_WAIT).await;
    }

    let listed = api.dlq("list", json!({"namespace": "wk", "task_id": "replay-bulk", "limit": 2})).await;
    let entries = listed["entries"].as_array().unwrap_or_else(|| panic!("entries: {listed}"));
    assert_eq!(entries.len(), 2, "{listed}");
    assert!(entries.iter().all(|e| e["entry"]["task_id"] == "replay-bulk"));
    let cursor = listed["next_cursor"].as_u64().expect("a next page");
    let rest = api.dlq("list", json!({"namespace": "wk", "task_id": "replay-bulk", "cursor": cursor})).await;
    assert_eq!(rest["entries"].as_array().map(Vec::len), Some(1), "{rest}");
    assert!(rest.get("next_cursor").is_none());

    let all = api.dlq("list", json!({})).await;
    let sequence_of = |id: &str| {
        all["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["entry"]["execution_id"] == id)
            .and_then(|e| e["sequence"].as_u64())
    };
    let one_seq = sequence_of(&one).expect("listed");
    let got = api.dlq("get", json!({"sequence": one_seq})).await;
    assert_eq!(got["entry"]["execution_id"], one.as_str());
    assert_eq!(got["entry"]["attempts"].as_array().map(Vec::len), Some(1));

    downstream.set_failing(false);
    let replayed = api.dlq("replay", json!({"sequence": one_seq})).await;
    let new_id =
        replayed["replayed"][0]["execution_id"].as_str().unwrap_or_else(|| panic!("{replayed}")).to_string();
    assert_ne!(new_id, one);
    let r = wait_run_status(&js, &names, &new_id, RunStatus::Succeeded, DLQ_WAIT).await;
    assert_eq!(r.trigger, Trigger::Replay);
    let missing = api.dlq("get", json!({"sequence": one_seq})).await;
    assert_eq!(missing["error"]["code"], "not_found", "replayed entries leave the DLQ: {missing}");

    let bulk_reply =
        api.dlq("replay", json!({"namespace": "wk", "task_id": "replay-bulk", "rate": 20})).await;
    let news: Vec<String> = bulk_reply["replayed"]
        .as_array()
        .unwrap_or_else(|| panic!("{bulk_reply}"))
        .iter()
        .map(|r| r["execution_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(news.len(), 3, "{bulk_reply}");
    for id in &news {
        wait_run_status(&js, &names, id, RunStatus::Succeeded, DLQ_WAIT).await;
    }

    let purged = api.dlq("purge", json!({"task_id": "purge-me"})).await;
    assert_eq!(purged["purged"], 1, "{purged}");
    assert!(dead_letters(&js, &names).await.is_empty(), "the DLQ is empty");
    let bad = api.dlq("purge", json!({})).await;
    assert_eq!(bad["error"]["code"], "bad_request", "purging needs a target: {bad}");

    worker.stop().await;
    registry.stop().await;
}
