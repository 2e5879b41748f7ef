//! Every service binary checks all its settings before it connects: given two invalid
//! settings (one shared, one its own) it names both and exits with status 2 at once, while a
//! valid configuration that cannot reach NATS is a runtime failure (status 1).

use std::time::{Duration, Instant};

use jetsched_tests::{ChildProcess, init_test_logging};

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
async fn a_valid_configuration_that_cannot_reach_nats_exits_1() {
    init_test_logging();
    let url = dead_nats_url();
    let (code, output, _) = run("jetsched-registry", &["--nats-url", &url]).await;
    assert_eq!(code, Some(1), "a runtime failure after a valid configuration:\n{output}");
    assert!(output.contains("connect to NATS"), "{output}");
}
