//! Auto-pause and the breaker API end to end: a pause request published while the registry is
//! down pauses the task once with its reason when it comes back; `pause_after_failures: 3`
//! pauses an always-failing task after its third failed run in a row (a success in between
//! starts the count over), with every run event published and with failures only; resume
//! clears the reason; the breaker endpoints list, get and reset the breakers bucket, by
//! namespace and key, by a task, or by the key alone when that is not ambiguous.

use async_nats::jetstream;
use chrono::Utc;
use jetsched_shared::names::{Names, breaker_reason, pause_request_msg_id};
use jetsched_shared::wire::{BreakerRecord, BreakerState, EventKind, PauseRequest, RunStatus};
use jetsched_tests::fixtures::{Flaky, dispatch, events_about, spec, wait_run_status};
use jetsched_tests::{Api, App, WithTopology, eventually, server_with_topology};
use jetsched_worker::Handlers;
use jetsched_worker::RunEvents;
use serde_json::json;

use crate::registry::{Served, served};
use crate::worker_support::{WAIT, config as worker_config};

/// Publishes a pause request as a worker does, awaiting the stream's ack.
async fn request_pause(js: &jetstream::Context, namespace: &str, id: &str, execution: &str) {
    let names = Names::default();
    let request = PauseRequest {
        namespace: namespace.into(),
        task_id: id.into(),
        reason: breaker_reason::CONSECUTIVE_FAILURES.into(),
        count: 3,
        execution_id: Some(execution.into()),
        time: Utc::now(),
    };
    let message = jetstream::message::PublishMessage::build()
        .payload(serde_json::to_vec(&request).unwrap().into())
        .message_id(pause_request_msg_id(namespace, id, execution));
    js.send_publish(names.pause_request_subject(namespace, id), message)
        .await
        .expect("publish")
        .await
        .expect("stored");
}

/// Waits until the registry's pause consumer has handled every request.
async fn pause_requests_drained(js: &jetstream::Context) {
    let names = Names::default();
    eventually(WAIT, "every pause request handled", || async {
        let mut consumer: jetstream::consumer::PullConsumer =
            js.get_consumer_from_stream(names.pause_consumer(), names.control_stream()).await.ok()?;
        let info = consumer.info().await.ok()?;
        (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_request_pauses_the_task_once_with_its_reason_even_sent_while_the_registry_was_down() {
    let Served { server, registry, api, js, .. } = served(|_| {}).await;
    let task = spec("ap", "report").field("pause_after_failures", 3).json();
    let put = api.task("put", task).await;
    let revision = put["revision"].as_u64().unwrap_or_else(|| panic!("{put}"));
    registry.stop().await;

    // Requests wait in the control stream while no registry runs.
    request_pause(&js, "ap", "report", "e3").await;
    request_pause(&js, "ap", "gone", "e9").await;
    js.publish(Names::default().pause_request_subject("ap", "report"), "{not json".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let registry = App::registry(crate::registry::config(&server.url(), 1)).await;
    let paused = eventually(WAIT, "the task is paused", || async {
        let got = api.task("get", json!({"namespace": "ap", "id": "report"})).await;
        (got["task"]["paused"] == json!(true)).then_some(got)
    })
    .await;
    assert_eq!(paused["task"]["paused_reason"], json!("consecutive_failures"), "{paused}");
    assert_eq!(paused["revision"].as_u64(), Some(revision + 1), "one write: {paused}");

    // A second request (another failing run) changes nothing: already paused.
    request_pause(&js, "ap", "report", "e4").await;
    pause_requests_drained(&js).await;
    let again = api.task("get", json!({"namespace": "ap", "id": "report"})).await;
    assert_eq!(again["revision"], paused["revision"], "{again}");
    let events = eventually(WAIT, "task.paused stored", || async {
        let found = events_about(&js, EventKind::TaskPaused, "ap", "report", WAIT).await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason.as_deref(), Some("consecutive_failures"));
    let metrics = registry.metrics().await;
    for (outcome, count) in [("paused", 2.0), ("gone", 1.0), ("invalid", 1.0)] {
        let series = format!("jetsched_registry_pause_requests_total{{outcome=\"{outcome}\"}}");
        assert_eq!(jetsched_tests::metric_value(&metrics, &series), Some(count), "{series}\n{metrics}");
    }

    // Resume clears the reason; a user's pause records theirs; a bad reason is refused by name.
    let resumed = api.task("resume", json!({"namespace": "ap", "id": "report"})).await;
    assert_eq!(resumed["task"]["paused"], json!(false), "{resumed}");
    assert!(resumed["task"].get("paused_reason").is_none(), "{resumed}");
    let by_user =
        api.task("pause", json!({"namespace": "ap", "id": "report", "reason": "maintenance"})).await;
    assert_eq!(by_user["task"]["paused_reason"], json!("maintenance"), "{by_user}");
    let refused = api.task("pause", json!({"namespace": "ap", "id": "nope id", "reason": ""})).await;
    let fields: Vec<&str> =
        refused["errors"].as_array().expect("errors").iter().filter_map(|e| e["field"].as_str()).collect();
    assert_eq!(fields, ["id", "reason"], "{refused}");
    registry.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_api_lists_gets_and_resets_breakers_with_the_tasks_using_them() {
    let WithTopology { server, client, js, .. } = server_with_topology(Default::default()).await;
    let api = Api::new(&client);
    let names = Names::default();
    let registry = App::registry(crate::registry::config(&server.url(), 1)).await;
    for (id, breaker) in [("a", json!({"key": "pay"})), ("b", json!({"key": "pay"})), ("c", json!({}))] {
        let put = api.task("put", spec("brapi", id).field("breaker", breaker).json()).await;
        assert!(put["revision"].as_u64().is_some(), "{put}");
    }
    let store = js.get_key_value(names.breakers_bucket()).await.expect("breakers bucket");
    let open_until = Utc::now() + chrono::Duration::seconds(30);
    // Open, as a worker writes it: the window that opened it (8 of 10 failed) is kept, the
    // window itself is empty (nothing runs through an open breaker).
    let record = BreakerRecord {
        state: BreakerState::Open,
        open_until: Some(open_until),
        opened_runs: 10,
        opened_failures: 8,
        ..BreakerRecord::default()
    };
    store.put("key.brapi.pay", serde_json::to_vec(&record).unwrap().into()).await.expect("record stored");

    let listed = api.breaker("list", json!({})).await;
    let breakers = listed["breakers"].as_array().unwrap_or_else(|| panic!("{listed}"));
    let keys: Vec<&str> = breakers.iter().filter_map(|b| b["key"].as_str()).collect();
    assert_eq!(keys, ["key.brapi.pay", "task.brapi.c"], "{listed}");
    assert_eq!(breakers[0]["name"], json!("brapi:pay"), "{listed}");
    assert_eq!(breakers[0]["state"], json!("open"));
    assert_eq!(breakers[0]["tasks"], json!(["brapi/a", "brapi/b"]));
    assert!(breakers[0]["open_until"].is_string(), "{listed}");
    assert_eq!((&breakers[0]["opened_runs"], &breakers[0]["opened_failures"]), (&json!(10), &json!(8)));
    // The CLI says what opened it rather than the empty window's 0% 0/0.
    let shown = crate::cli::jetsched(&server.url(), &["breaker", "show", "brapi:pay"]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("opened at 80%") && shown.contains("8/10"), "{shown}");
    assert_eq!((&breakers[1]["state"], &breakers[1]["revision"]), (&json!("closed"), &json!(0)));

    let got = api.breaker("get", json!({"namespace": "brapi", "id": "c"})).await;
    assert_eq!(got["name"], json!("brapi/c"), "{got}");
    let got = api.breaker("get", json!({"namespace": "brapi", "key": "pay"})).await;
    assert_eq!((&got["key"], &got["state"]), (&json!("key.brapi.pay"), &json!("open")), "{got}");
    // The key alone still names it: only one namespace uses it.
    let reset = api.breaker("reset", json!({"key": "pay"})).await;
    assert_eq!(reset["previous_state"], json!("open"), "{reset}");
    assert_eq!(reset["breaker"]["state"], json!("closed"), "{reset}");
    let stored: BreakerRecord =
        serde_json::from_slice(&store.get("key.brapi.pay").await.unwrap().unwrap()).unwrap();
    assert_eq!(stored.state, BreakerState::Closed);
    let closed = eventually(WAIT, "breaker.closed stored", || async {
        let found = events_about(&js, EventKind::BreakerClosed, "brapi", "pay", WAIT).await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(closed[0].reason.as_deref(), Some("reset"));
    assert_eq!(closed[0].key.as_deref(), Some("key.brapi.pay"));

    let missing = api.breaker("get", json!({"key": "nothing"})).await;
    assert_eq!(missing["error"]["code"], json!("not_found"), "{missing}");
    let bad = api.breaker("reset", json!({"key": "a b"})).await;
    assert_eq!(
        (&bad["error"]["code"], &bad["error"]["field"]),
        (&json!("invalid_id"), &json!("key")),
        "{bad}"
    );
    let both = api.breaker("get", json!({"key": "pay", "id": "a"})).await;
    assert_eq!(both["error"]["code"], json!("bad_request"), "{both}");

    // Another namespace naming the same key has a breaker of its own: the key alone is
    // ambiguous, the namespace and the key are not.
    let put = api.task("put", spec("brapi2", "d").field("breaker", json!({"key": "pay"})).json()).await;
    assert!(put["revision"].as_u64().is_some(), "{put}");
    let ambiguous = api.breaker("get", json!({"key": "pay"})).await;
    assert_eq!(
        (&ambiguous["error"]["code"], &ambiguous["error"]["field"]),
        (&json!("bad_request"), &json!("namespace")),
        "{ambiguous}"
    );
    let message = ambiguous["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("brapi:pay") && message.contains("brapi2:pay"), "{ambiguous}");
    let other = api.breaker("get", json!({"namespace": "brapi2", "key": "pay"})).await;
    assert_eq!((&other["key"], &other["tasks"]), (&json!("key.brapi2.pay"), &json!(["brapi2/d"])), "{other}");
    // Once a worker has stored the key's shared breaker, the key alone names it, with every
    // task naming the key; brapi's own record is still listed until it is gone.
    store.put("key.=shared.pay", serde_json::to_vec(&record).unwrap().into()).await.expect("record stored");
    let shared = api.breaker("get", json!({"key": "pay"})).await;
    assert_eq!((&shared["key"], &shared["name"]), (&json!("key.=shared.pay"), &json!("pay")), "{shared}");
    assert_eq!(shared["tasks"], json!(["brapi/a", "brapi/b", "brapi2/d"]), "{shared}");
    let listed = api.breaker("list", json!({})).await;
    let keys: Vec<&str> =
        listed["breakers"].as_array().expect("breakers").iter().filter_map(|b| b["key"].as_str()).collect();
    assert_eq!(keys, ["key.=shared.pay", "key.brapi.pay", "task.brapi.c"], "{listed}");
    let reset = api.breaker("reset", json!({"key": "pay"})).await;
    assert_eq!(
        (&reset["previous_state"], &reset["breaker"]["key"]),
        (&json!("open"), &json!("key.=shared.pay"))
    );
    let closed = eventually(WAIT, "the shared breaker's breaker.closed stored", || async {
        let found = events_about(&js, EventKind::BreakerClosed, "=shared", "pay", WAIT).await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(closed[0].key.as_deref(), Some("key.=shared.pay"));
    registry.stop().await;
}

/// `pause_after_failures: 3` on a task whose handler fails while `failing` is set: two
/// failures, a success, then three failures: paused after the last one, not before.
async fn auto_pause(run_events: RunEvents, id: &str) {
    let WithTopology { server, client, js, .. } = server_with_topology(Default::default()).await;
    let api = Api::new(&client);
    let names = Names::default();
    let registry = App::registry(crate::registry::config(&server.url(), 1)).await;
    let downstream = Flaky::failing("downstream is down");
    let handlers = Handlers::new().register("flaky", downstream.clone());
    let mut config = worker_config(&server, &format!("{id}-w1"));
    config.run_events = run_events;
    let worker = App::worker(config, handlers).await;
    let builder = spec("ap", id).handler("flaky").fast_retry(1).field("pause_after_failures", 3);
    let put = api.task("put", builder.json()).await;
    assert!(put["revision"].as_u64().is_some(), "{put}");
    let task = builder.task();
    let base = Utc::now().timestamp_millis();
    let breakers = js.get_key_value(names.breakers_bucket()).await.expect("breakers bucket");
    let count = || async {
        let value = breakers.get(format!("task.ap.{id}")).await.ok()??;
        Some(serde_json::from_slice::<BreakerRecord>(&value).ok()?.consecutive_failures)
    };
    let get = || api.task("get", json!({"namespace": "ap", "id": id}));

    let mut nominal = base;
    let mut run = |status: RunStatus| {
        nominal += 1;
        let (js, names, task) = (js.clone(), names.clone(), task.clone());
        async move {
            let execution = dispatch(&js, &names, &task, nominal).await;
            wait_run_status(&js, &names, &execution, status, WAIT).await;
        }
    };
    run(RunStatus::Dead).await;
    run(RunStatus::Dead).await;
    eventually(WAIT, "two failures counted", || async { (count().await == Some(2)).then_some(()) }).await;
    downstream.set_failing(false);
    run(RunStatus::Succeeded).await;
    eventually(WAIT, "the success resets the count", || async { (count().await == Some(0)).then_some(()) })
        .await;
    downstream.set_failing(true);
    run(RunStatus::Dead).await;
    run(RunStatus::Dead).await;
    eventually(WAIT, "two failures counted again", || async { (count().await == Some(2)).then_some(()) })
        .await;
    pause_requests_drained(&js).await;
    assert_eq!(get().await["task"]["paused"], json!(false), "not paused after a success and two failures");

    run(RunStatus::Dead).await;
    let paused = eventually(WAIT, "paused after the third failure in a row", || async {
        let got = get().await;
        (got["task"]["paused"] == json!(true)).then_some(got)
    })
    .await;
    assert_eq!(paused["task"]["paused_reason"], json!("consecutive_failures"), "{paused}");
    let events = eventually(WAIT, "task.paused stored", || async {
        let found = events_about(&js, EventKind::TaskPaused, "ap", id, WAIT).await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason.as_deref(), Some("consecutive_failures"));

    let resumed = api.task("resume", json!({"namespace": "ap", "id": id})).await;
    assert_eq!(resumed["task"]["paused"], json!(false), "{resumed}");
    assert!(resumed["task"].get("paused_reason").is_none(), "{resumed}");
    // Resumed, the count starts over: one more failure does not pause it again.
    assert_eq!(count().await, Some(0), "resume restarts the count");
    run(RunStatus::Dead).await;
    eventually(WAIT, "one failure counted after the resume", || async {
        (count().await == Some(1)).then_some(())
    })
    .await;
    pause_requests_drained(&js).await;
    assert_eq!(get().await["task"]["paused"], json!(false), "not paused by the first failure after resume");
    worker.stop().await;
    registry.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_after_failures_pauses_after_the_third_failed_run_in_a_row() {
    auto_pause(RunEvents::All, "flaky-all").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_after_failures_counts_the_same_with_only_failure_events() {
    auto_pause(RunEvents::Failures, "flaky-failures").await;
}

#[tokio::test]
async fn bad_breaker_specs_are_refused_with_every_field_path() {
    let Served { server: _server, registry: _registry, api, .. } = served(|_| {}).await;
    let bad = spec("ap", "bad")
        .field(
            "breaker",
            json!({"key": "a.b", "failure_rate": 0, "min_runs": 0, "window": "fast", "open_for": "1m",
                   "max_open_for": "10s", "half_open_runs": 0, "on_open": "wait", "colour": "red"}),
        )
        .field("pause_after_failures", 0)
        .field("paused_reason", "x")
        .json();
    let reply = api.task("put", bad).await;
    let fields: Vec<(&str, &str)> = reply["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|e| (e["code"].as_str().unwrap(), e["field"].as_str().unwrap()))
        .collect();
    assert_eq!(
        fields,
        [
            ("invalid_value", "paused_reason"),
            ("unknown_field", "breaker.colour"),
            ("invalid_id", "breaker.key"),
            ("invalid_value", "breaker.failure_rate"),
            ("invalid_value", "breaker.min_runs"),
            ("invalid_duration", "breaker.window"),
            ("invalid_value", "breaker.max_open_for"),
            ("invalid_value", "breaker.half_open_runs"),
            ("invalid_value", "breaker.on_open"),
            ("invalid_value", "pause_after_failures"),
        ],
        "{reply}"
    );
    let listed = api.task("list", json!({"namespace": "ap"})).await;
    assert_eq!(listed["tasks"], json!([]), "nothing stored: {listed}");
}

/// The tasks behind each breaker follow every change of the specs at once: a request made
/// right after a write sees it (a breaker dropped from a spec, a task deleted), and a spec
/// stored while the registry was down is listed as soon as it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_api_sees_every_spec_change_made_before_the_request() {
    let WithTopology { server, client, js, .. } = server_with_topology(Default::default()).await;
    let api = Api::new(&client);
    let names = Names::default();
    let tasks_using = |listed: &serde_json::Value, key: &str| {
        let breakers = listed["breakers"].as_array().unwrap_or_else(|| panic!("{listed}"));
        breakers.iter().find(|b| b["key"] == json!(key)).map(|b| b["tasks"].clone())
    };
    let registry = App::registry(crate::registry::config(&server.url(), 1)).await;
    for (id, field, value) in
        [("a", "breaker", json!({"key": "k1"})), ("b", "pause_after_failures", json!(3))]
    {
        let put = api.task("put", spec("bfollow", id).field(field, value).json()).await;
        assert!(put["revision"].as_u64().is_some(), "{put}");
    }
    let listed = api.breaker("list", json!({})).await;
    assert_eq!(tasks_using(&listed, "key.bfollow.k1"), Some(json!(["bfollow/a"])), "{listed}");
    assert_eq!(tasks_using(&listed, "task.bfollow.b"), Some(json!(["bfollow/b"])), "{listed}");

    let put = api.task("put", spec("bfollow", "a").json()).await;
    assert!(put["revision"].as_u64().is_some(), "{put}");
    let deleted = api.task("delete", json!({"namespace": "bfollow", "id": "b"})).await;
    assert!(deleted.get("error").is_none(), "{deleted}");
    let listed = api.breaker("list", json!({})).await;
    assert_eq!(tasks_using(&listed, "key.bfollow.k1"), None, "{listed}");
    assert_eq!(tasks_using(&listed, "task.bfollow.b"), None, "{listed}");

    registry.stop().await;
    let tasks = js.get_key_value(names.tasks_bucket()).await.expect("tasks bucket");
    let stored = spec("bfollow", "c").field("breaker", json!({"key": "k2"})).json();
    tasks
        .put(jetsched_shared::names::task_key("bfollow", "c"), serde_json::to_vec(&stored).unwrap().into())
        .await
        .expect("spec stored");
    let _registry = App::registry(crate::registry::config(&server.url(), 1)).await;
    let listed = api.breaker("list", json!({})).await;
    assert_eq!(tasks_using(&listed, "key.bfollow.k2"), Some(json!(["bfollow/c"])), "{listed}");
}
