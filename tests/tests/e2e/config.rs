//! Every service binary checks all its settings before it connects: given two invalid
//! settings (one shared, one its own) it names both and exits with status 2 at once, while a
//! valid configuration that cannot reach NATS is tried again for `--topology-wait`, then a
//! runtime failure (status 1).

use std::time::{Duration, Instant};

use jetsched_shared::names::Names;
use jetsched_tests::{ChildProcess, NatsServer, init_test_logging};

/// A loopback URL where nothing listens.
fn dead_nats_url() -> String {
    format!("nats://{}", jetsched_tests::free_addr())
}

/// Runs `binary` with `args` (and nothing from this test's environment that it reads) until it
/// exits; returns its exit code, its output and how long it ran.
async fn run(binary: &str, args: &[&str]) -> (Option<i32>, String, Duration) {
    let mut command = ChildProcess::command(binary);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("JETSCHED_") || name.starts_with("NATS_") {
            command.env_remove(name);
        }
    }
    command.args(["--admin-addr", "127.0.0.1:0", "--nats-connect-timeout", "500ms"]).args(args);
    let started = Instant::now();
    let mut process = ChildProcess::spawn_command(binary, command);
    let status = process.wait_exit(Duration::from_secs(20)).await;
    let elapsed = started.elapsed();
    let output = process.output();
    let status = status.unwrap_or_else(|| panic!("{binary} still runs after 20s:\n{output}"));
    (status.code(), output, elapsed)
}

#[tokio::test]
async fn every_service_names_all_its_invalid_settings_and_exits_2_before_connecting() {
    init_test_logging();
    let url = dead_nats_url();
    let cases: [(&str, [&str; 4], [&str; 2]); 4] = [
        (
            "jetsched-registry",
            ["--prefix", "bad prefix", "--concurrency", "0"],
            ["--prefix", "--concurrency"],
        ),
        (
            "jetsched-scheduler",
            ["--replicas", "0", "--publish-window", "0"],
            [
                "--replicas (JETSCHED_REPLICAS) = 0",
                "--publish-window (JETSCHED_SCHEDULER_PUBLISH_WINDOW) = 0",
            ],
        ),
        (
            "jetsched-worker",
            ["--nats-user", "alice", "--queue", "a.b"],
            ["--nats-user (NATS_USER)", "--queue (JETSCHED_WORKER_QUEUES) = \"a.b\""],
        ),
        (
            "jetsched-alerter",
            ["--lease", "0s", "--rate-limit", "0"],
            ["--lease (JETSCHED_LEASE) = 0s", "--rate-limit (JETSCHED_ALERTER_RATE_LIMIT) = 0"],
        ),
    ];
    for (binary, invalid, named) in cases {
        let mut args = vec!["--nats-url", url.as_str()];
        args.extend(invalid);
        let (code, output, elapsed) = run(binary, &args).await;
        println!("{binary} {invalid:?}: exit {code:?} after {elapsed:?}\n{output}");
        assert_eq!(code, Some(2), "{binary}: bad settings exit with status 2:\n{output}");
        assert!(
            output.contains(&format!("{binary}: invalid configuration (2 problems)")),
            "{binary}: a header counting both problems:\n{output}"
        );
        for setting in named {
            assert!(output.contains(setting), "{binary}: {setting:?} is named:\n{output}");
        }
        assert!(!output.to_lowercase().contains("connect"), "{binary} did not try to connect:\n{output}");
        assert!(elapsed < Duration::from_secs(3), "{binary} exits at once, took {elapsed:?}");
    }
}

#[tokio::test]
async fn a_valid_configuration_that_cannot_reach_nats_exits_1_after_the_topology_wait() {
    init_test_logging();
    let url = dead_nats_url();
    let (code, output, elapsed) =
        run("jetsched-registry", &["--nats-url", &url, "--topology-wait", "2s"]).await;
    assert_eq!(code, Some(1), "a runtime failure after a valid configuration:\n{output}");
    assert!(output.contains("connect to NATS"), "{output}");
    assert!(output.contains("NATS cannot be reached yet; retrying"), "tried again meanwhile:\n{output}");
    assert!(output.contains("NATS could not be reached in"), "says how long it tried:\n{output}");
    assert!(elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(8), "{elapsed:?}");
}

#[tokio::test]
async fn a_service_started_before_nats_comes_up_with_it() {
    init_test_logging();
    let mut server = NatsServer::start().await;
    server.kill();
    let mut command = ChildProcess::command("jetsched-registry");
    command.args([
        "--nats-url",
        &server.url(),
        "--admin-addr",
        "127.0.0.1:0",
        "--nats-connect-timeout",
        "500ms",
    ]);
    command.args(["--topology-wait", "30s", "--instance-id", "early"]);
    let mut registry = ChildProcess::spawn_command("jetsched-registry", command);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(registry.is_running(), "still waiting for NATS:\n{}", registry.output());
    assert!(registry.output().contains("NATS cannot be reached yet; retrying"), "{}", registry.output());

    server.restart().await;
    let client = server.client().await;
    let subject = Names::default().task_api_subject("list");
    let answered = async {
        loop {
            let reply = client.request(subject.clone(), "{}".into()).await;
            if let Ok(reply) = reply
                && serde_json::from_slice::<serde_json::Value>(&reply.payload)
                    .is_ok_and(|v| v["tasks"].is_array())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), answered)
        .await
        .unwrap_or_else(|_| panic!("the registry never answered once NATS was up:\n{}", registry.output()));
    assert!(registry.is_running());
    registry.sigterm();
    assert!(
        registry.wait_exit(Duration::from_secs(10)).await.is_some_and(|s| s.success()),
        "{}",
        registry.output()
    );
}
