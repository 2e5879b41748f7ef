//! The README's run command, for real: `deploy/local.sh` starts NATS and every service with the
//! demo specs, the demo tasks fire and succeed, the failing one reaches the dead-letter stream,
//! the README's quickstart runs against it line by line, and SIGINT (Ctrl-C) leaves no process
//! behind.
//!
//! It uses the fixed local ports of `nats.conf` (4222, 8222) and the services' default admin
//! ports (9101-9113), like a person running the script would.

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream;
use jetsched_shared::names::Names;
use jetsched_tests::{ChildProcess, eventually, init_test_logging, workspace_bin};

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

fn pids(state: &Path) -> Vec<i32> {
    std::fs::read_to_string(state.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Kills whatever the script started if the test fails before the script stops them itself.
struct Leftovers<'a>(&'a Path);

impl Drop for Leftovers<'_> {
    fn drop(&mut self) {
        for pid in pids(self.0) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[tokio::test]
async fn local_script_runs_the_demo_and_stops_cleanly_on_ctrl_c() {
    init_test_logging();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf();
    assert!(
        std::net::TcpListener::bind("127.0.0.1:4222").is_ok(),
        "port 4222 is taken: this test runs deploy/local.sh, which needs the local NATS port free"
    );
    let state = tempfile::tempdir().expect("state dir");
    let _leftovers = Leftovers(state.path());
    let bin_dir = workspace_bin("jetsched").parent().expect("binary dir").to_path_buf();
    let mut command = std::process::Command::new("bash");
    command
        .arg(repo.join("deploy/local.sh"))
        .args(["--for", "150"])
        .current_dir(&repo)
        .env("JETSCHED_LOCAL_DIR", state.path())
        .env("JETSCHED_BIN_DIR", &bin_dir);
    let mut script = ChildProcess::spawn_command("local-sh", command);

    let client = eventually(Duration::from_secs(60), "local NATS accepts connections", || async {
        async_nats::connect("nats://127.0.0.1:4222").await.ok()
    })
    .await;
    let js = jetstream::new(client.clone());
    let names = Names::default();

    // The interval demo runs and succeeds.
    let events = eventually(Duration::from_secs(60), "the events stream exists", || async {
        js.get_stream(names.events_stream()).await.ok()
    })
    .await;
    eventually(Duration::from_secs(60), "demo/heartbeat succeeded", || async {
        events
            .get_last_raw_message_by_subject(&names.event_subject("run.succeeded", "demo", "heartbeat"))
            .await
            .is_ok()
    })
    .await;
    // The failing demo exhausts its retries and lands in the DLQ.
    let dlq = js.get_stream(names.dlq_stream()).await.expect("dlq stream");
    eventually(Duration::from_secs(90), "demo/always-failing dead-lettered", || async {
        dlq.get_last_raw_message_by_subject(&names.dlq_subject("default", "demo", "always-failing"))
            .await
            .is_ok()
    })
    .await;

    // The README's quickstart, line by line, as a person in a second terminal would run it.
    crate::docs::run_readme_quickstart(&bin_dir, &client).await;

    // `jetsched status` sees the whole system: a leader and every replica.
    let status = std::process::Command::new(bin_dir.join("jetsched"))
        .args(["--nats-url", "nats://127.0.0.1:4222", "status", "--json"])
        .output()
        .expect("run jetsched status");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert!(status["leader"]["instance"].as_str().is_some_and(|i| i.starts_with("scheduler-")), "{status}");
    for (role, count) in [("registry", 1), ("scheduler", 2), ("worker", 2), ("alerter", 1)] {
        assert_eq!(status["replicas"][role].as_array().map(Vec::len), Some(count), "{role}: {status}");
    }

    // Ctrl-C: everything the script started stops.
    let pids = pids(state.path());
    assert!(
        pids.len() >= 7,
        "nats-server, registry, 2 schedulers, 2 workers, alerter: {pids:?}\n{}",
        script.output()
    );
    script.sigint();
    let status = script.wait_exit(Duration::from_secs(30)).await.expect("the script exits after SIGINT");
    assert!(status.success(), "clean exit: {status:?}\n{}", script.output());
    eventually(Duration::from_secs(10), "no process of the script is left", || async {
        pids.iter().all(|pid| !alive(*pid))
    })
    .await;
}
