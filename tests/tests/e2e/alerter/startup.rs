//! Start-up: readiness waits for the topology, a server without room for the streams stops
//! the alerter at once, invalid settings are a clear error, and each event kind gets a
//! single-filter consumer of its own.

use std::time::Duration;

use async_nats::jetstream;
use jetsched_alerter::{Config, build};
use jetsched_tests::{ChildProcess, NatsServer, ServerOpts, admin_get, eventually, init_test_logging};
use tokio_util::sync::CancellationToken;

use super::{WAIT, config, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_false_until_the_topology_is_ensured() {
    let (server, _client, js, names) = start().await;
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
    config.shared.common.admin_addr = Some(admin);
    let building = tokio::spawn(build(config));
    let not_ready = eventually(WAIT, "/readyz answers 503 during start-up", || async {
        admin_get(admin, "/readyz").await.ok().filter(|reply| reply.status == 503).map(|reply| reply.body)
    })
    .await;
    assert!(not_ready.contains("\"topology\":false"), "{not_ready}");
    assert!(admin_get(admin, "/healthz").await.expect("/healthz answers").is_ok());

    js.delete_stream(names.events_stream()).await.unwrap();
    let alerter =
        tokio::time::timeout(WAIT, building).await.expect("start-up completes").unwrap().expect("builds");
    let ready = admin_get(admin, "/readyz").await.expect("/readyz answers");
    assert!(ready.is_ok() && ready.body.contains("\"ready\":true"), "{ready:?}");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(alerter.run(shutdown.clone()));
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

/// Only a conflicting resource is waited out: a server without room for the streams'
/// `max_bytes` stops the process at once, saying what to change.
#[tokio::test]
async fn a_server_without_room_for_the_streams_stops_the_alerter_at_once_saying_what_to_change() {
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

/// Each event kind the rules read has a durable consumer of its own with a single subject
/// filter: a consumer with several filters that falls behind (after a server pause, say) costs
/// the server a walk of every subject of a stored block per message, enough to keep a busy
/// system from catching up. An earlier combined consumer is removed at start, and the events
/// still raise their alerts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_kind_is_read_through_a_single_filter_consumer_and_the_combined_one_is_removed() {
    use async_nats::jetstream::consumer::pull;
    use futures::StreamExt;
    use jetsched_shared::topology::TopologyArgs;
    use jetsched_shared::wire::EventKind;
    use jetsched_tests::{App, WithTopology, server_with_topology};

    use super::{Subscriber, publish_event, run_event};

    let WithTopology { server, client, js, names, .. } = server_with_topology(TopologyArgs::default()).await;
    let events = js.get_stream(names.events_stream()).await.unwrap();
    let kinds = [EventKind::RunFailed, EventKind::RunDead, EventKind::FireDispatched];
    events
        .create_consumer(pull::Config {
            durable_name: Some(names.alerter_combined_consumer().to_string()),
            filter_subjects: kinds.iter().map(|k| names.event_subject(k.as_str(), "*", "*")).collect(),
            ..Default::default()
        })
        .await
        .expect("the earlier combined consumer");
    let subscriber = Subscriber::start(&client, &names).await;
    let alerter = App::alerter(config(&server)).await;

    let mut names_found: Vec<String> = Vec::new();
    let mut listed = events.consumer_names();
    while let Some(name) = listed.next().await {
        names_found.push(name.unwrap());
    }
    names_found.retain(|name| name.starts_with("alerter"));
    names_found.sort();
    // Every kind the default rules read, leader changes aside (an ordered consumer per replica).
    let read = [
        EventKind::RunFailed,
        EventKind::RunDead,
        EventKind::FireDispatched,
        EventKind::BreakerOpened,
        EventKind::BreakerClosed,
        EventKind::SchedulerClockSkew,
        EventKind::AfterExpired,
    ];
    let mut expected: Vec<String> = read.iter().map(|k| names.alerter_consumer(k.as_str())).collect();
    expected.sort();
    assert_eq!(names_found, expected, "one consumer per kind, the combined one gone");
    for kind in read {
        let mut consumer: jetstream::consumer::PullConsumer =
            events.get_consumer(&names.alerter_consumer(kind.as_str())).await.unwrap();
        let config = &consumer.info().await.unwrap().config;
        assert_eq!(config.filter_subject, names.event_subject(kind.as_str(), "*", "*"));
        assert!(config.filter_subjects.is_empty(), "{kind:?}: {:?}", config.filter_subjects);
    }

    publish_event(&js, &names, &run_event(EventKind::RunFailed, "billing", "report")).await;
    publish_event(&js, &names, &run_event(EventKind::RunDead, "billing", "invoice")).await;
    eventually(WAIT, "both run alerts through their own consumers", || async {
        let rules = subscriber.rules();
        (rules.iter().any(|r| r == "run_failed") && rules.iter().any(|r| r == "run_dead")).then_some(())
    })
    .await;
    drop(alerter);
}
