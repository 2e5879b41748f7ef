//! Deployment files checked against the real thing: the secured NATS config
//! (`deploy/secure/nats.conf`) enforced on real connections while the registry, scheduler,
//! worker, alerter and CLI run with their own users; YAML (compose, Kubernetes, KEDA, Helm
//! values) parses and has the promised shape; systemd units verify; the image's entry point
//! dispatches and health-checks; and every environment variable the deployment files set is
//! documented by the `--help` of the binary it is given to, so the files cannot drift from the
//! flags; every metric the alert rules and the dashboard use is one a service registers. A
//! check that needs a tool this machine lacks (docker compose, kubectl, systemd-analyze) says
//! `SKIPPED: ... because ...` on stderr. (That every `*.conf` passes `nats-server -t` is `harness.rs`'s
//! `shipped_configs_are_valid`, which covers `deploy/secure/` too.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::PullConsumer;
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{RunRecord, RunStatus, scheduled_execution_id};
use jetsched_tests::fixtures::noting;
use jetsched_tests::{
    Api, App, ChildProcess, SpecBuilder, eventually, init_test_logging, metric_value, spec, workspace_bin,
};
use jetsched_worker::Outcome;
use serde_json::{Value, json};

pub(crate) const WAIT: Duration = Duration::from_secs(20);
/// How long a denied request or delivery is given to (not) happen.
pub(crate) const DENIED_WAIT: Duration = Duration::from_millis(500);

/// Test-only passwords of `deploy/secure/nats.conf` (documented there as local-only).
const USERS: [(&str, &str); 11] = [
    ("registry", "registry-local-only"),
    ("scheduler", "scheduler-local-only"),
    ("worker", "worker-local-only"),
    ("alerter", "alerter-local-only"),
    ("client", "client-local-only"),
    ("operator", "operator-local-only"),
    ("tenant-demo", "tenant-demo-local-only"),
    ("tenant-billing", "tenant-billing-local-only"),
    ("executor-demo", "executor-demo-local-only"),
    ("executor-billing", "executor-billing-local-only"),
    ("console", "console-local-only"),
];

pub(crate) fn password(user: &str) -> &'static str {
    USERS.iter().find(|(u, _)| *u == user).map(|(_, p)| *p).expect("known user")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

fn deploy_file(relative: &str) -> PathBuf {
    let path = repo().join("deploy").join(relative);
    assert!(path.is_file(), "{} is missing", path.display());
    path
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

// ---- the secured server -----------------------------------------------------------------

/// `nats-server` running `deploy/secure/nats.conf` unchanged except for its addresses and
/// store: a random client port on loopback, no monitor port, the store in a temp dir.
pub(crate) struct SecureServer {
    process: ChildProcess,
    pub(crate) url: String,
    _dir: tempfile::TempDir,
}

impl SecureServer {
    pub(crate) async fn start() -> SecureServer {
        init_test_logging();
        let dir = tempfile::Builder::new().prefix("jetsched-secure-").tempdir().expect("temp dir");
        let store = dir.path().join("store");
        let mut replaced = BTreeMap::from([("listen:", 0), ("http:", 0), ("store_dir:", 0)]);
        let config: String = read(&deploy_file("secure/nats.conf"))
            .lines()
            .map(|line| {
                let trimmed = line.trim_start();
                let key = replaced.keys().copied().find(|key| trimmed.starts_with(key));
                match key {
                    Some(key) => {
                        *replaced.get_mut(key).expect("key") += 1;
                        match key {
                            "listen:" => "listen: \"127.0.0.1:-1\"".to_string(),
                            "http:" => String::new(),
                            _ => format!("store_dir: {:?}", store.display().to_string()),
                        }
                    }
                    None => line.to_string(),
                }
            })
            .map(|line| line + "\n")
            .collect();
        assert!(
            replaced.values().all(|n| *n == 1),
            "expected one of each of {replaced:?} in the secure config"
        );
        let path = dir.path().join("nats.conf");
        std::fs::write(&path, config).expect("write config");

        let bin = std::env::var_os("NATS_SERVER_BIN").unwrap_or_else(|| "nats-server".into());
        let mut command = Command::new(bin);
        command.arg("-c").arg(&path);
        let process = ChildProcess::spawn_command("nats-server-secure", command);
        let url = eventually(WAIT, "secured nats-server is ready", || async {
            let log = process.output();
            let ready = log.contains("Server is ready");
            log.lines()
                .find_map(|line| line.split("Listening for client connections on ").nth(1))
                .filter(|_| ready)
                .map(|addr| format!("nats://{}", addr.trim()))
        })
        .await;
        SecureServer { process, url, _dir: dir }
    }

    pub(crate) fn log(&self) -> String {
        self.process.output()
    }

    /// A connection as `user` that records the server's error messages (permission
    /// violations arrive as `-ERR` lines, not as errors of the publish call).
    /// Runs the CLI `jetsched args` as `user`, which must succeed; its standard output.
    pub(crate) async fn cli(&self, user: &str, args: &[&str]) -> String {
        let output = tokio::process::Command::new(workspace_bin("jetsched"))
            .args(args)
            .env("NATS_URL", &self.url)
            .env("NATS_USER", user)
            .env("NATS_PASSWORD", password(user))
            .output()
            .await
            .expect("run jetsched");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "jetsched {} as {user}: {stdout}{stderr}", args.join(" "));
        stdout
    }

    pub(crate) async fn connect(&self, user: &str) -> Probe {
        self.connect_with(user, async_nats::ConnectOptions::new()).await
    }

    /// As [`SecureServer::connect`], from `options` (an inbox prefix, say).
    pub(crate) async fn connect_with(&self, user: &str, options: async_nats::ConnectOptions) -> Probe {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let seen = errors.clone();
        let client = options
            .user_and_password(user.into(), password(user).into())
            .name(format!("probe-{user}"))
            .event_callback(move |event| {
                let seen = seen.clone();
                async move {
                    if let async_nats::Event::ServerError(error) = event {
                        seen.lock().expect("errors lock").push(error.to_string().to_lowercase());
                    }
                }
            })
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect as {user}: {e}"));
        Probe { api: Api::new(&client), client, errors }
    }

    pub(crate) fn nats_args(&self, user: &str) -> jetsched_shared::config::NatsArgs {
        let mut args = jetsched_shared::config::NatsArgs::plain(&self.url);
        args.user = Some(user.to_string());
        args.password = Some(password(user).to_string());
        args
    }
}

pub(crate) struct Probe {
    pub(crate) client: async_nats::Client,
    /// The registry's API over `client`.
    pub(crate) api: Api,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Probe {
    /// Waits for an error from the server containing `what` (e.g. `maximum payload`).
    pub(crate) async fn expect_error(&self, what: &str) {
        let what = what.to_lowercase();
        eventually(WAIT, &format!("server error {what}"), || async {
            self.errors.lock().expect("errors lock").iter().any(|e| e.contains(&what))
        })
        .await;
    }

    /// Waits for the server's permissions violation naming `what` (e.g. `publish to
    /// "$kv.jetsched_tasks.x"`).
    pub(crate) async fn expect_violation(&self, what: &str) {
        let what = what.to_lowercase();
        eventually(WAIT, &format!("permissions violation for {what}"), || async {
            self.errors
                .lock()
                .expect("errors lock")
                .iter()
                .any(|e| e.contains("permissions violation") && e.contains(&what))
        })
        .await;
    }
}

/// A task of the secured deployment: the `probe` handler, one attempt.
fn secured(id: &str) -> SpecBuilder {
    spec("secure", id)
        .executor(json!({"kind": "handler", "name": "probe", "payload": {"from": id}}))
        .retry(json!({"max_attempts": 1}))
}

async fn next_dispatch(consumer: &PullConsumer) -> jetstream::Message {
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .expect("pull request as the worker user");
    batch.next().await.expect("a dispatch within 5 s").expect("dispatch message")
}

/// The shipped secured config, enforced: each service runs with its own user and has what it
/// needs for registration, intake, scheduled fires (overlap `replace` too), execution, dead letters and alerts (no
/// violation logged for them); a `client` can only use the API and the intake; a worker can
/// consume dispatches but cannot write the tasks bucket nor serve the API.
#[tokio::test]
async fn secured_config_gives_each_user_exactly_its_subjects() {
    let server = SecureServer::start().await;
    let names = Names::default();

    // No anonymous access at all.
    assert!(async_nats::connect(&server.url).await.is_err(), "anonymous connection accepted");

    // The registry with its own user creates the topology and serves a client's put.
    let mut registry_config = jetsched_registry::Config::for_tests(&server.url);
    registry_config.shared.nats = server.nats_args("registry");
    let registry = App::registry(registry_config).await;

    let client = server.connect("client").await;
    let api = &client.api;
    let put = api.task("put", secured("manual").every("1h").json()).await;
    assert_eq!(put["revision"], 1, "put as client: {put}");
    let got = api.task("get", json!({"namespace": "secure", "id": "manual"})).await;
    assert_eq!(got["task"]["id"], "manual", "{got}");

    // Fire-and-forget intake is open to the client too.
    let submit = names.submit_subject("secure", "submitted");
    client
        .client
        .publish(submit, serde_json::to_vec(&secured("submitted").every("1h").json()).expect("json").into())
        .await
        .expect("publish submission");
    eventually(WAIT, "submitted spec applied by the registry", || async {
        let reply = api.task("get", json!({"namespace": "secure", "id": "submitted"})).await;
        if reply["task"]["id"] == "submitted" { Ok(()) } else { Err(reply) }
    })
    .await;

    // The client can neither write the tasks bucket behind the registry's back...
    let forged_key = format!("$KV.{}.secure.forged", names.tasks_bucket());
    client.client.publish(forged_key.clone(), "{}".into()).await.expect("send");
    client.expect_violation(&format!("publish to \"{forged_key}\"")).await;
    // ...nor forge a dispatch, nor use the JetStream API...
    let forged_dispatch = names.dispatch_subject("default", "secure", "manual");
    client.client.publish(forged_dispatch.clone(), "{}".into()).await.expect("send");
    client.expect_violation(&format!("publish to \"{forged_dispatch}\"")).await;
    let stream_info = format!("$JS.API.STREAM.INFO.{}", names.dispatch_stream());
    client.client.publish(stream_info.clone(), "".into()).await.expect("send");
    client.expect_violation(&format!("publish to \"{stream_info}\"")).await;
    // ...nor watch dispatches go by.
    let mut snoop = client.client.subscribe(names.dispatch_wildcard()).await.expect("send sub");
    client.expect_violation(&format!("subscription to \"{}\"", names.dispatch_wildcard())).await;

    // The worker user reaches dispatches through its queue's durable consumer only.
    let worker_probe = server.connect("worker").await;
    let worker_js = jetstream::new(worker_probe.client.clone());
    let worker_config = {
        let mut config = jetsched_worker::Config::for_tests(&server.url, "secure-worker");
        config.shared.nats = server.nats_args("worker");
        config.pull_expires = Duration::from_millis(500);
        config
    };
    let consumer = jetsched_worker::ensure_queue_consumer(&worker_js, &names, "default", &worker_config)
        .await
        .expect("worker user creates its queue consumer");
    let triggered = api.task("trigger", json!({"namespace": "secure", "id": "manual"})).await;
    let execution_id = triggered["execution_id"].as_str().unwrap_or_else(|| panic!("trigger: {triggered}"));
    let dispatch = next_dispatch(&consumer).await;
    assert_eq!(dispatch.subject.as_str(), forged_dispatch, "the registry's dispatch, not the forged one");
    let body: Value = serde_json::from_slice(&dispatch.payload).expect("dispatch JSON");
    assert_eq!(body["execution_id"], execution_id);
    dispatch.double_ack().await.expect("the worker user acks a dispatch");
    let snooped = tokio::time::timeout(DENIED_WAIT, snoop.next()).await;
    assert!(!matches!(snooped, Ok(Some(_))), "the client saw a dispatch: {snooped:?}");

    // The worker cannot write the tasks bucket, neither raw nor through the KV API.
    let forged_by_worker = format!("$KV.{}.secure.worker-forged", names.tasks_bucket());
    worker_probe.client.publish(forged_by_worker.clone(), "{}".into()).await.expect("send");
    worker_probe.expect_violation(&format!("publish to \"{forged_by_worker}\"")).await;
    let short_js = jetstream::ContextBuilder::new().timeout(DENIED_WAIT).build(worker_probe.client.clone());
    let tasks = short_js.get_key_value(names.tasks_bucket()).await.expect("worker may read bucket info");
    assert!(tasks.put("secure.manual", "{}".into()).await.is_err(), "worker put into the tasks bucket");
    // Nor answer API requests in the registry's place.
    let _impostor = worker_probe.client.subscribe(names.api_wildcard()).await.expect("send sub");
    worker_probe.expect_violation(&format!("subscription to \"{}\"", names.api_wildcard())).await;
    for id in ["forged", "worker-forged"] {
        let reply = api.task("get", json!({"namespace": "secure", "id": id})).await;
        assert_eq!(reply["error"]["code"], "not_found", "{id} was stored: {reply}");
    }
    let manual = api.task("get", json!({"namespace": "secure", "id": "manual"})).await;
    assert_eq!(manual["revision"], 1, "tasks bucket changed: {manual}");
    // Breakers: the worker writes the breakers bucket, never the tasks, and asks the registry
    // for a pause through the control stream; the client cannot write either.
    let breakers = worker_js.get_key_value(names.breakers_bucket()).await.expect("breakers bucket");
    breakers
        .put("key.secure.secure-probe", "{}".into())
        .await
        .expect("the worker writes the breakers bucket");
    let forged_breaker = format!("$KV.{}.key.secure.secure-probe", names.breakers_bucket());
    client.client.publish(forged_breaker.clone(), "{}".into()).await.expect("send");
    client.expect_violation(&format!("publish to \"{forged_breaker}\"")).await;
    let forged_pause = names.pause_request_subject("secure", "manual");
    client.client.publish(forged_pause.clone(), "{}".into()).await.expect("send");
    client.expect_violation(&format!("publish to \"{forged_pause}\"")).await;

    // The whole system on its own users: a scheduled task fires and is executed.
    let mut scheduler_config = jetsched_scheduler::Config::for_tests(&server.url);
    scheduler_config.shared.nats = server.nats_args("scheduler");
    let scheduler = App::scheduler(scheduler_config).await;
    let (handlers, runs) = noting(
        "probe",
        |run| run.task_id.clone(),
        |run| async move {
            match run.task_id.as_str() {
                "doomed" => Outcome::permanent("refused on purpose"),
                // Longer than its schedule's period: the next fire waits for it.
                "replacing" => {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    Outcome::ok()
                }
                _ => Outcome::ok(),
            }
        },
    );
    let worker = App::worker(worker_config, handlers).await;
    let put = api.task("put", secured("ticking").every("1s").json()).await;
    assert!(put["revision"].is_u64(), "{put}");
    eventually(WAIT, "the scheduled task ran twice on the worker", || async {
        runs.lock().expect("runs lock").iter().filter(|task| *task == "ticking").count() >= 2
    })
    .await;
    // Overlap `replace` on the scheduler's user: a fire waits for the running run (a watch of
    // its record), and a run queued where no worker serves is cancelled for the next fire (its
    // record settled, a cancel marker written).
    let replacing = secured("replacing").every("1s").field("overlap", "replace");
    api.task("put", replacing.json()).await;
    let unserved = secured("unserved").every("1s").field("overlap", "replace").field("queue", "unserved");
    let put = api.task("put", unserved.json()).await;
    assert!(put["revision"].is_u64(), "{put}");
    // Read as the registry's user (direct gets of the records of the fires since the put).
    let registry_probe = server.connect("registry").await;
    let records = jetstream::new(registry_probe.client.clone())
        .get_key_value(names.runs_bucket())
        .await
        .expect("runs bucket");
    let since = chrono::Utc::now().timestamp_millis() / 1000 * 1000;
    eventually(WAIT, "replace waited for runs and cancelled a queued one", || async {
        let ran = runs.lock().expect("runs lock").iter().filter(|task| *task == "replacing").count();
        let mut cancelled = false;
        for nominal in (since..=chrono::Utc::now().timestamp_millis()).step_by(1000) {
            let key = scheduled_execution_id("secure", "unserved", nominal);
            let Ok(Some(value)) = records.get(&key).await else { continue };
            let record: RunRecord = serde_json::from_slice(&value).expect("a run record");
            cancelled |= record.status == RunStatus::Cancelled
                && record
                    .reason
                    .as_deref()
                    .is_some_and(|reason| reason.starts_with("replaced by the fire of"));
        }
        (ran >= 2 && cancelled).then_some(()).ok_or((ran, cancelled))
    })
    .await;
    for id in ["replacing", "unserved"] {
        api.task("delete", json!({"namespace": "secure", "id": id})).await;
    }

    let mut alerter_config = jetsched_alerter::Config::for_tests(&server.url);
    alerter_config.shared.nats = server.nats_args("alerter");
    alerter_config.check_interval = Duration::from_secs(1);
    alerter_config.group_wait = Duration::from_millis(100);
    let alerter = App::alerter(alerter_config).await;

    // A run that fails for good is dead-lettered by the worker; the registry's user reads it
    // the way the DLQ endpoints do; the alerter raises an alert for it. Behind a named breaker
    // and with `pause_after_failures: 1`, the worker counts it in the breakers bucket and its
    // pause request reaches the registry, which pauses the task.
    let mut doomed = secured("doomed").every("1h").json();
    doomed["breaker"] = json!({"key": "secure-downstream"});
    doomed["pause_after_failures"] = json!(1);
    let put = api.task("put", doomed).await;
    assert!(put["revision"].is_u64(), "{put}");
    api.task("trigger", json!({"namespace": "secure", "id": "doomed"})).await;
    let registry_probe = server.connect("registry").await;
    let registry_js = jetstream::new(registry_probe.client.clone());
    let dead_letter = eventually(WAIT, "the failed run is in the dead-letter stream", || async {
        let stream = registry_js.get_stream(names.dlq_stream()).await?;
        let filter = names.dlq_subject("default", "secure", "doomed");
        anyhow::Ok(stream.get_first_raw_message_by_subject(filter, 1).await?)
    })
    .await;
    let entry: Value = serde_json::from_slice(&dead_letter.payload).expect("dead letter JSON");
    assert!(entry.to_string().contains("refused on purpose"), "{entry}");
    eventually(WAIT, "the alerter published an alert", || async {
        let mut stream = registry_js.get_stream(names.alerts_stream()).await?;
        let messages = stream.info().await?.state.messages;
        anyhow::ensure!(messages > 0, "no alert yet");
        anyhow::Ok(())
    })
    .await;
    let paused = eventually(WAIT, "the doomed task is paused on the worker's request", || async {
        let reply = api.task("get", json!({"namespace": "secure", "id": "doomed"})).await;
        if reply["task"]["paused"] == json!(true) { Ok(reply) } else { Err(reply) }
    })
    .await;
    assert_eq!(paused["task"]["paused_reason"], "consecutive_failures", "{paused}");
    // The alerter's periodic checks (queue and DLQ depth) ran a round under its permissions
    // since the dead letter was stored.
    eventually(WAIT, "the alerter's checks counted the dead letter", || async {
        let metrics = alerter.metrics().await;
        metric_value(&metrics, "jetsched_dlq_depth").is_some_and(|depth| depth >= 1.0)
    })
    .await;
    // ... its read of the concurrency keys too.
    let metrics = alerter.metrics().await;
    assert_eq!(
        metric_value(&metrics, "jetsched_alerter_errors_total{what=\"limit_waits\"}"),
        None,
        "{metrics}"
    );

    // The CLI: API commands as `client`, inspection (JetStream reads) as `operator`.
    for (user, args) in [
        ("client", vec!["get", "secure/manual"]),
        ("client", vec!["ls", "--namespace", "secure"]),
        ("client", vec!["next", "secure/ticking"]),
        ("client", vec!["breakers"]),
        ("operator", vec!["status"]),
        ("operator", vec!["events", "--last", "5"]),
        ("operator", vec!["runs", "secure/ticking"]),
    ] {
        server.cli(user, &args).await;
    }

    alerter.stop().await;
    worker.stop().await;
    scheduler.stop().await;
    registry.stop().await;

    // Every violation in the server log is one of the probes above: the services' own
    // permissions are complete.
    let log = server.log();
    let unexpected: Vec<&str> = log
        .lines()
        .filter(|line| line.to_lowercase().contains("violation"))
        .filter(|line| !line.contains(":probe-client\"") && !line.contains(":probe-worker\""))
        .collect();
    assert!(unexpected.is_empty(), "services hit permission violations:\n{}", unexpected.join("\n"));
    assert!(log.contains("probe-client"), "probe violations not logged as expected:\n{log}");
}

// ---- YAML: compose, Kubernetes, KEDA --------------------------------------------------------

/// Every document of a YAML file, as JSON, with merge keys (`<<: *anchor`) applied.
fn yaml_docs(path: &Path) -> Vec<Value> {
    use serde::Deserialize;
    let invalid = |e: serde_norway::Error| -> ! { panic!("{} is not valid YAML: {e}", path.display()) };
    serde_norway::Deserializer::from_str(&read(path))
        .map(|document| {
            let mut document = serde_norway::Value::deserialize(document).unwrap_or_else(|e| invalid(e));
            document.apply_merge().unwrap_or_else(|e| invalid(e));
            serde_json::to_value(document).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

/// Says in the test's output that a check did not run, and why.
fn skipped(check: &str, because: &str) {
    eprintln!("SKIPPED: {check} because {because}");
}

fn yaml_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            yaml_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml") {
            found.push(path);
        }
    }
}

/// The jetsched services of the compose file and their binaries.
const COMPOSE_SERVICES: [(&str, &str); 4] = [
    ("registry", "jetsched-registry"),
    ("scheduler", "jetsched-scheduler"),
    ("worker", "jetsched-worker"),
    ("alerter", "jetsched-alerter"),
];

fn compose_file() -> Value {
    yaml_docs(&deploy_file("compose.yaml")).remove(0)
}

/// The Kubernetes objects of `deploy/kubernetes/jetsched/` (what `kubectl apply -k` applies).
fn kubernetes_objects() -> Vec<Value> {
    let dir = repo().join("deploy/kubernetes/jetsched");
    let kustomization = yaml_docs(&dir.join("kustomization.yaml")).remove(0);
    let resources = kustomization["resources"].as_array().expect("kustomization resources");
    resources
        .iter()
        .flat_map(|file| yaml_docs(&dir.join(file.as_str().expect("resource path"))))
        .filter(|doc| !doc.is_null())
        .collect()
}

#[test]
fn deployment_yaml_parses_and_keeps_its_promises() {
    // Every YAML file under deploy/ parses (compose, Kubernetes, KEDA, Helm values, and the
    // Prometheus files).
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    assert!(files.len() >= 8, "expected the deployment YAML files, found {files:?}");
    for file in &files {
        yaml_docs(file);
    }

    // Compose: NATS with JetStream on a volume and a health check; scalable jetsched services.
    let compose = compose_file();
    let services = &compose["services"];
    let nats = &services["nats"];
    let nats_args = nats["command"].to_string();
    assert!(nats_args.contains("--jetstream") && nats_args.contains("--store_dir=/data"), "{nats}");
    assert!(nats["volumes"].to_string().contains(":/data"), "no JetStream volume: {nats}");
    assert!(nats["healthcheck"]["test"].to_string().contains("8222/healthz"), "{nats}");
    for (name, _) in COMPOSE_SERVICES {
        let service = &services[name];
        assert!(service.is_object(), "compose has no service {name}");
        // `--scale` needs no fixed container name and no host port.
        assert!(service.get("container_name").is_none(), "{name} has a container_name");
        assert!(service.get("ports").is_none(), "{name} publishes host ports: cannot scale");
        assert_eq!(service["depends_on"]["nats"]["condition"], "service_healthy", "{name}");
        assert!(service["healthcheck"]["test"].to_string().contains("/readyz"), "{name} health check");
        assert_eq!(service["environment"]["NATS_URL"], "nats://nats:4222", "{name}");
    }
    assert_eq!(services["scheduler"]["deploy"]["replicas"], 2, "two schedulers");

    let docker_compose = Command::new("docker").args(["compose", "version"]).output();
    if docker_compose.is_ok_and(|output| output.status.success()) {
        let output = Command::new("docker")
            .args(["compose", "-f"])
            .arg(deploy_file("compose.yaml"))
            .args(["config", "--quiet"])
            .output()
            .expect("run docker compose config");
        assert!(
            output.status.success(),
            "docker compose config:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    } else {
        skipped(
            "`docker compose config` of compose.yaml (its YAML was checked)",
            "`docker compose` is not available here",
        );
    }

    // Kubernetes: probes on the admin port, resources, a PDB and a Service per Deployment,
    // Prometheus annotations, R3 topology.
    let objects = kubernetes_objects();
    let of_kind = |kind: &'static str| objects.iter().filter(move |o| o["kind"] == kind);
    let config = of_kind("ConfigMap").next().expect("the common ConfigMap");
    assert_eq!(config["data"]["JETSCHED_REPLICAS"], "3", "R3 in a 3-node cluster");
    let deployments: Vec<&Value> = of_kind("Deployment").collect();
    assert_eq!(deployments.len(), 5, "registry, scheduler, worker, alerter, console");
    for deployment in deployments {
        let name = deployment["metadata"]["name"].as_str().expect("name");
        let labels = &deployment["spec"]["selector"]["matchLabels"];
        let pod = &deployment["spec"]["template"];
        let container = &pod["spec"]["containers"][0];
        let port = container["ports"][0]["containerPort"].as_u64().expect("admin port");
        let admin_addr = container["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == "JETSCHED_ADMIN_ADDR")
            .map(|e| e["value"].clone());
        assert_eq!(admin_addr, Some(json!(format!("0.0.0.0:{port}"))), "{name} admin listener");
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin", "{name}");
        for bound in ["requests", "limits"] {
            assert!(container["resources"][bound]["memory"].is_string(), "{name} has no memory {bound}");
        }
        assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true, "{name}");
        let annotations = &pod["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"], "true", "{name}");
        assert_eq!(annotations["prometheus.io/port"], port.to_string(), "{name}");
        assert!(
            container["envFrom"].to_string().contains("jetsched-common"),
            "{name} does not load the common settings"
        );
        assert!(
            of_kind("PodDisruptionBudget").any(|pdb| pdb["spec"]["selector"]["matchLabels"] == *labels),
            "no PodDisruptionBudget for {name}"
        );
        assert!(of_kind("Service").any(|svc| svc["spec"]["selector"] == *labels), "no Service for {name}");
    }

    // KEDA scales workers on the pending count of the real consumer of the real stream.
    let names = Names::default();
    let scaler = yaml_docs(&deploy_file("kubernetes/keda/worker-scaledobject.yaml")).remove(0);
    let trigger = &scaler["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "nats-jetstream");
    assert_eq!(trigger["metadata"]["stream"], names.dispatch_stream());
    assert_eq!(trigger["metadata"]["consumer"], names.worker_consumer("default"));
    assert_eq!(scaler["spec"]["scaleTargetRef"]["name"], "jetsched-worker");

    // The NATS Helm values: a 3-node cluster with JetStream on persistent file storage.
    let values = yaml_docs(&deploy_file("kubernetes/nats-values.yaml")).remove(0);
    assert_eq!(values["config"]["cluster"]["replicas"], 3);
    assert_eq!(values["config"]["jetstream"]["fileStore"]["enabled"], true);
    assert_eq!(values["config"]["jetstream"]["fileStore"]["pvc"]["enabled"], true);
    assert_eq!(values["config"]["jetstream"]["merge"]["sync_interval"], "always");

    match Command::new("kubectl").arg("kustomize").arg(repo().join("deploy/kubernetes/jetsched")).output() {
        Ok(output) => assert!(
            output.status.success(),
            "kubectl kustomize deploy/kubernetes/jetsched:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(_) => skipped(
            "`kubectl kustomize deploy/kubernetes/jetsched` (its YAML was checked)",
            "kubectl is not available here",
        ),
    }
}

// ---- systemd ---------------------------------------------------------------------------------

/// `(key, value)` of every `KEY=value` line of an env file or every `Environment=KEY=value` of
/// a unit.
fn env_assignments(text: &str, prefix: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix(prefix))
        .filter_map(|rest| rest.split_once('='))
        .filter(|(key, _)| {
            !key.is_empty() && key.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

fn systemd_units() -> Vec<(PathBuf, String)> {
    let dir = repo().join("deploy/systemd");
    let mut units: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .expect("deploy/systemd")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "service"))
        .map(|path| {
            let text = read(&path);
            (path, text)
        })
        .collect();
    units.sort();
    units
}

/// The binary a unit starts (`ExecStart=/usr/local/bin/<binary>`).
fn unit_binary(text: &str) -> String {
    let exec = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let program = exec.split_whitespace().next().expect("program");
    Path::new(program).file_name().expect("binary name").to_string_lossy().into_owned()
}

#[test]
fn systemd_units_are_hardened_and_verify() {
    let units = systemd_units();
    let names: BTreeSet<String> = units
        .iter()
        .map(|(path, _)| path.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    let expected = [
        "jetsched-registry.service",
        "jetsched-scheduler@.service",
        "jetsched-worker@.service",
        "jetsched-alerter.service",
        "jetsched-console.service",
    ];
    assert_eq!(names, expected.iter().map(|n| n.to_string()).collect(), "systemd units");
    for (path, text) in &units {
        for line in [
            "EnvironmentFile=/etc/jetsched/jetsched.env",
            "Restart=always",
            "DynamicUser=yes",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "CapabilityBoundingSet=",
        ] {
            assert!(text.lines().any(|l| l == line), "{} lacks `{line}`", path.display());
        }
        let binary = unit_binary(text);
        assert!(
            text.contains(&format!("/usr/local/bin/{binary}")) && binary.starts_with("jetsched-"),
            "{}",
            path.display()
        );
    }

    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        skipped(
            "`systemd-analyze verify` of deploy/systemd (the units were checked by content)",
            "systemd-analyze is not available here",
        );
        return;
    };
    assert!(probe.status.success());
    // Verify copies that start the freshly built binaries and read the example env file
    // (verify insists that ExecStart exists and that a non-optional EnvironmentFile does).
    let dir = tempfile::tempdir().expect("temp dir");
    let env_file = dir.path().join("jetsched.env");
    std::fs::copy(deploy_file("systemd/jetsched.env.example"), &env_file).expect("copy env file");
    let mut instances = Vec::new();
    for (path, text) in &units {
        let binary = unit_binary(text);
        let built = workspace_bin(&binary);
        let text = text
            .replace(&format!("/usr/local/bin/{binary}"), &built.display().to_string())
            .replace("/etc/jetsched/jetsched.env", &env_file.display().to_string());
        let name = path.file_name().expect("name").to_string_lossy().into_owned();
        std::fs::write(dir.path().join(&name), text).expect("write unit");
        instances.push(dir.path().join(name.replace("@.", "@9190.")));
    }
    let output = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&instances)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .expect("run systemd-analyze verify");
    let complaints =
        String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && complaints.trim().is_empty(), "systemd-analyze verify:\n{complaints}");
}

// ---- the deployment files use only variables the binaries know --------------------------------

/// `--help` of a workspace binary.
fn help(binary: &str) -> String {
    let output = Command::new(workspace_bin(binary))
        .arg("--help")
        .env_remove("NATS_URL")
        .output()
        .unwrap_or_else(|e| panic!("run {binary} --help: {e}"));
    assert!(output.status.success(), "{binary} --help failed");
    String::from_utf8(output.stdout).expect("utf-8 help")
}

/// Whether `--help` documents variable `var` (`[env: VAR]` or `[env: VAR=...]`). RUST_LOG is
/// read by the logging setup, which the help mentions in prose; MIMALLOC_PURGE_DELAY by the
/// allocator as the process loads, which the README's "Deployment" documents.
fn documents(help: &str, var: &str) -> bool {
    if var == "RUST_LOG" {
        return help.contains("RUST_LOG");
    }
    if var == "MIMALLOC_PURGE_DELAY" {
        return true;
    }
    help.match_indices(&format!("env: {var}"))
        .any(|(at, m)| matches!(help[at + m.len()..].chars().next(), Some(']' | '=')))
}

#[test]
fn deployment_files_set_only_variables_the_binaries_document() {
    let service_binaries = [
        "jetsched-registry",
        "jetsched-scheduler",
        "jetsched-worker",
        "jetsched-alerter",
        "jetsched-console",
    ];
    let helps: BTreeMap<&str, String> =
        service_binaries.iter().chain(&["jetsched"]).map(|binary| (*binary, help(binary))).collect();
    // (file, binary, variable) for everything the deployment files set.
    let mut uses: Vec<(String, String, String)> = Vec::new();
    let mut add = |file: &str, binary: &str, var: &str| uses.push((file.into(), binary.into(), var.into()));

    // compose.yaml: the role is the command (or, for the CLI, the entrypoint).
    let compose = compose_file();
    for (service, definition) in compose["services"].as_object().expect("services") {
        let role = definition["command"][0].as_str().unwrap_or_default();
        let binary = match role {
            "registry" | "scheduler" | "worker" | "alerter" | "console" => format!("jetsched-{role}"),
            _ if definition["entrypoint"].to_string().contains("jetsched") => "jetsched".to_string(),
            _ => continue, // nats
        };
        for var in definition["environment"].as_object().expect("environment map").keys() {
            add(&format!("compose.yaml ({service})"), &binary, var);
        }
    }

    // Kubernetes: container args pick the role; the common ConfigMap goes to every service.
    let objects = kubernetes_objects();
    let common: Vec<String> = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .and_then(|c| c["data"].as_object())
        .expect("common ConfigMap")
        .keys()
        .cloned()
        .collect();
    for deployment in objects.iter().filter(|o| o["kind"] == "Deployment") {
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let binary = format!("jetsched-{}", container["args"][0].as_str().expect("role argument"));
        let file = format!("kubernetes ({})", deployment["metadata"]["name"].as_str().unwrap_or_default());
        for env in container["env"].as_array().expect("env") {
            add(&file, &binary, env["name"].as_str().expect("env name"));
        }
        for var in &common {
            add(&file, &binary, var);
        }
    }

    // systemd: each unit's Environment=, the shared env file for every service, the worker's.
    for (path, text) in systemd_units() {
        let binary = unit_binary(&text);
        for (var, _) in env_assignments(&text, "Environment=") {
            add(&path.display().to_string(), &binary, &var);
        }
    }
    let shared = read(&deploy_file("systemd/jetsched.env.example"));
    let commented: String =
        shared.lines().filter_map(|l| l.strip_prefix('#')).map(|l| format!("{l}\n")).collect();
    for (var, _) in env_assignments(&shared, "").into_iter().chain(env_assignments(&commented, "")) {
        for binary in service_binaries {
            add("jetsched.env.example", binary, &var);
        }
    }
    let worker_env = read(&deploy_file("systemd/worker.env.example"));
    for (var, _) in
        env_assignments(&worker_env, "").into_iter().chain(env_assignments(&worker_env.replace('#', ""), ""))
    {
        add("worker.env.example", "jetsched-worker", &var);
    }

    // The image's defaults apply to every service.
    for line in read(&deploy_file("Dockerfile")).lines().skip_while(|l| !l.starts_with("ENV ")) {
        let assignment = line.trim_start_matches("ENV ").trim().trim_end_matches('\\').trim();
        if let Some((var, _)) = assignment.split_once('=') {
            for binary in service_binaries {
                add("Dockerfile", binary, var);
            }
        }
        if !line.ends_with('\\') {
            break;
        }
    }

    assert!(uses.len() > 40, "too few variables found, is the parsing broken? {uses:?}");
    let unknown: Vec<String> = uses
        .iter()
        .filter(|(_, binary, var)| !documents(&helps[binary.as_str()], var))
        .map(|(file, binary, var)| format!("{file}: {var} is not in `{binary} --help`"))
        .collect();
    assert!(unknown.is_empty(), "deployment files drifted from the flags:\n{}", unknown.join("\n"));
}

// ---- the image's entry point -----------------------------------------------------------------

fn entrypoint() -> Command {
    let mut command = Command::new("bash");
    command.arg(deploy_file("docker-entrypoint.sh"));
    let bin_dir = workspace_bin("jetsched").parent().expect("bin dir").to_path_buf();
    command.env("JETSCHED_BIN_DIR", bin_dir).env_remove("JETSCHED_ADMIN_ADDR");
    command
}

#[tokio::test]
async fn image_entrypoint_picks_the_binary_and_probes_the_admin_port() {
    for (role, binary) in
        COMPOSE_SERVICES.iter().copied().chain([("jetsched", "jetsched"), ("cli", "jetsched")])
    {
        let output = entrypoint().args([role, "--help"]).output().expect("run entrypoint");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success() && text.contains(&format!("Usage: {binary}")), "{role}: {text}");
    }
    let output = entrypoint().output().expect("run entrypoint");
    assert_eq!(output.status.code(), Some(2), "no command is a usage error");

    // `healthcheck` (the compose health check) against a live registry's admin port.
    let server = jetsched_tests::NatsServer::start().await;
    let running = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let admin = running.admin();
    let probe = |path: &'static str, addr: String| async move {
        let mut command = entrypoint();
        command.args(["healthcheck", path]).env("JETSCHED_ADMIN_ADDR", addr);
        tokio::process::Command::from(command).output().await.expect("run healthcheck").status.success()
    };
    eventually(WAIT, "healthcheck /readyz passes", || probe("/readyz", admin.to_string())).await;
    assert!(probe("/healthz", admin.to_string()).await, "healthcheck /healthz");
    assert!(!probe("/no-such-page", admin.to_string()).await, "a 404 passed the health check");
    running.stop().await;
    assert!(!probe("/healthz", admin.to_string()).await, "health check passed with the registry stopped");
}

// ---- the metrics the rules and the dashboard use ----------------------------------------------

/// Every `.rs` file under `dir`, concatenated.
fn rust_sources(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&read(&path));
        }
    }
}

/// Every metric the Prometheus rules and the Grafana dashboard use is one a service (or the
/// shared crate, for what every service registers) registers; histogram series by their base
/// name.
#[test]
fn deploy_rules_and_dashboard_use_metrics_the_services_export() {
    let mut sources = String::new();
    rust_sources(&repo().join("services"), &mut sources);
    rust_sources(&repo().join("shared/src"), &mut sources);
    let registered = |name: &str| sources.contains(&format!("\"{name}\""));
    for file in ["prometheus/alerts.yml", "grafana/jetsched.json"] {
        let text = read(&deploy_file(file));
        let mut used: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("jetsched_"))
            .collect();
        used.sort();
        used.dedup();
        assert!(used.len() >= 10, "{file}: {used:?}");
        for name in used {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| registered(base))
                .unwrap_or(name);
            assert!(registered(base), "deploy/{file} uses {name}, which no service registers");
        }
    }
    let dashboard: Value =
        serde_json::from_str(&read(&deploy_file("grafana/jetsched.json"))).expect("dashboard JSON");
    assert_eq!(dashboard["uid"], "jetsched-overview");
    assert!(dashboard["panels"].as_array().expect("panels").len() > 10);
}
