//! Start-up: readiness waits for the topology, a server without room for the streams stops
//! the alerter at once, and invalid settings are a clear error.

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
    config.common.admin_addr = Some(admin);
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
