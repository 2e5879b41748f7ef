//! End-to-end tests of jetsched-worker against a real nats-server: retries with backoff,
//! dead letters (verdict and crash-loop advisory paths), the http, nats, shell and handler
//! executors, sharing a queue between worker processes, kill -9 and graceful shutdown.
//!
//! Dispatch messages are published directly (the scheduler is not involved), with the same
//! body and headers the scheduler sends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, message::PublishMessage};
use futures::StreamExt;
use jetsched_shared::names::{self, Names};
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{
    Dispatch, HDR_ATTEMPT, HDR_EXECUTION_ID, HDR_LEADER_TERM, HDR_NOMINAL_TIME, HDR_STATUS, HDR_TASK,
    HDR_TRIGGER, Trigger, format_time,
};
use jetsched_tests::{ChildProcess, NatsServer, eventually, init_test_logging};
use jetsched_worker::dlq::{DeadLetter, DeadLetterSource};
use jetsched_worker::runs::{AttemptOutcome, RunRecord, RunStatus};
use jetsched_worker::{Config, Handlers, Outcome, RunContext, build};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

/// A worker running in-process; cancelled on Drop.
struct RunningWorker {
    shutdown: CancellationToken,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
    admin: std::net::SocketAddr,
}

impl RunningWorker {
    async fn start(config: Config, handlers: Handlers) -> RunningWorker {
        let worker = build(config, handlers).await.expect("worker builds");
        let admin = worker.admin_addr();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(worker.run(shutdown.clone()));
        RunningWorker { shutdown, handle: Some(handle), admin }
    }

    /// The admin server's `/metrics` text.
    async fn metrics(&self) -> String {
        let mut socket = tokio::net::TcpStream::connect(self.admin).await.expect("admin listener");
        socket
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        let mut text = String::new();
        socket.read_to_string(&mut text).await.expect("read");
        text
    }

    /// Graceful stop; returns how long it took.
    async fn stop(mut self) -> Duration {
        let started = Instant::now();
        self.shutdown.cancel();
        let handle = self.handle.take().expect("running");
        tokio::time::timeout(WAIT, handle)
            .await
            .expect("worker stops in time")
            .expect("no panic")
            .expect("clean stop");
        started.elapsed()
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn config(server: &NatsServer, instance: &str) -> Config {
    let mut config = Config::for_tests(&server.url(), instance);
    config.pull_expires = Duration::from_millis(500);
    config
}

/// A validated spec with the given executor and retry policy on `queue`.
fn spec(id: &str, queue: &str, executor: Value, retry: Value, timeout: &str) -> TaskSpec {
    TaskSpec::parse_value(json!({
        "id": id, "namespace": "wk", "queue": queue,
        "schedule": {"every": "1h"},
        "executor": executor, "retry": retry, "timeout": timeout,
    }))
    .unwrap_or_else(|e| panic!("test spec {id}: {e}"))
}

fn fast_retry(max_attempts: u32) -> Value {
    json!({"max_attempts": max_attempts, "initial": "100ms", "multiplier": 1.0, "max_interval": "100ms", "jitter": 0.0})
}

/// Publishes a dispatch the way the scheduler does; returns the execution id.
async fn dispatch(js: &jetstream::Context, spec: &TaskSpec, nominal_ms: i64) -> String {
    publish_dispatch(js, spec, nominal_ms).await.await.expect("dispatch stored");
    spec_execution(spec, nominal_ms)
}

fn spec_execution(spec: &TaskSpec, nominal_ms: i64) -> String {
    jetsched_shared::wire::scheduled_execution_id(&spec.namespace, &spec.id, nominal_ms)
}

async fn publish_dispatch(
    js: &jetstream::Context,
    spec: &TaskSpec,
    nominal_ms: i64,
) -> jetstream::context::PublishAckFuture {
    let names = Names::default();
    let nominal_time = chrono::DateTime::from_timestamp_millis(nominal_ms).expect("valid time");
    let body = Dispatch {
        execution_id: spec_execution(spec, nominal_ms),
        namespace: spec.namespace.clone(),
        task_id: spec.id.clone(),
        nominal_time,
        trigger: Trigger::Schedule,
        term: 1,
        revision: 1,
        spec: spec.clone(),
    };
    let message = PublishMessage::build()
        .payload(serde_json::to_vec(&body).expect("encode").into())
        .message_id(names::dispatch_msg_id(&spec.namespace, &spec.id, nominal_ms))
        .header(HDR_TASK, spec.key().as_str())
        .header(HDR_NOMINAL_TIME, format_time(nominal_time).as_str())
        .header(HDR_EXECUTION_ID, body.execution_id.as_str())
        .header(HDR_LEADER_TERM, "1")
        .header(HDR_TRIGGER, "schedule");
    js.send_publish(names.dispatch_subject(&spec.queue, &spec.namespace, &spec.id), message)
        .await
        .expect("publish dispatch")
}

async fn record(js: &jetstream::Context, execution_id: &str) -> Option<RunRecord> {
    let kv = js.get_key_value(Names::default().runs_bucket()).await.ok()?;
    let value = kv.get(execution_id).await.ok()??;
    Some(serde_json::from_slice(&value).expect("run record decodes"))
}

/// Waits until the run record of `execution_id` has `status`.
async fn wait_status(
    js: &jetstream::Context,
    execution_id: &str,
    status: RunStatus,
    timeout: Duration,
) -> RunRecord {
    eventually(timeout, &format!("run {execution_id} is {}", status.as_str()), || async {
        match record(js, execution_id).await {
            Some(r) if r.status == status => Ok(r),
            other => Err(other.map(|r| r.status)),
        }
    })
    .await
}

/// Every entry of the dead-letter stream.
async fn dead_letters(js: &jetstream::Context) -> Vec<DeadLetter> {
    let mut stream = js.get_stream(Names::default().dlq_stream()).await.expect("DLQ stream");
    let state = stream.info().await.expect("DLQ info").state.clone();
    let mut out = Vec::new();
    if state.messages == 0 {
        return out;
    }
    for seq in state.first_sequence..=state.last_sequence {
        if let Ok(message) = stream.get_raw_message(seq).await {
            out.push(serde_json::from_slice(&message.payload).expect("dead letter decodes"));
        }
    }
    out
}

async fn dead_letter_of(js: &jetstream::Context, execution_id: &str) -> DeadLetter {
    eventually(WAIT, &format!("dead letter of {execution_id}"), || async {
        dead_letters(js).await.into_iter().find(|d| d.execution_id == execution_id)
    })
    .await
}

async fn dispatch_pending(js: &jetstream::Context) -> u64 {
    let mut stream = js.get_stream(Names::default().dispatch_stream()).await.expect("dispatch stream");
    stream.info().await.expect("info").state.messages
}

fn outcomes(record: &RunRecord) -> Vec<AttemptOutcome> {
    record.attempts.iter().map(|a| a.outcome.expect("attempt closed")).collect()
}

#[tokio::test]
async fn worker_retries_with_backoff_and_jitter_then_succeeds() {
    init_test_logging();
    let server = NatsServer::start().await;
    let calls: Arc<Mutex<Vec<(u32, Instant)>>> = Arc::default();
    let seen = calls.clone();
    let handlers = Handlers::new().register("flaky", move |run: RunContext| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((run.attempt, Instant::now()));
            if run.attempt <= 2 {
                Outcome::retry(format!("attempt {} fails", run.attempt))
            } else {
                Outcome::ok()
            }
        }
    });
    let worker = RunningWorker::start(config(&server, "w-retry"), handlers).await;
    let js = jetstream::new(server.client().await);
    let retry = json!({"max_attempts": 5, "initial": "300ms", "multiplier": 2.0, "max_interval": "10s", "jitter": 0.3});
    let task = spec("flaky", "default", json!({"kind": "handler", "name": "flaky"}), retry, "5s");
    let id = dispatch(&js, &task, 1_000).await;

    let record = wait_status(&js, &id, RunStatus::Succeeded, WAIT).await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2, 3], "three attempts");
    assert_eq!(
        outcomes(&record),
        [AttemptOutcome::Failed, AttemptOutcome::Failed, AttemptOutcome::Succeeded]
    );
    assert_eq!(record.attempt, 3);
    assert_eq!(record.error.as_deref(), Some("attempt 2 fails"));
    // Delays within the jitter bounds: 300ms ±30% then 600ms ±30%, measured from the end of
    // the failed attempt to the start of the next (worker clocks, ms precision), with slack
    // for the record write, the Nak and the redelivery.
    for (n, (min, max)) in [(1usize, (210i64, 390i64)), (2, (420, 780))] {
        let ended = record.attempts[n - 1].finished.expect("finished");
        let delay = (record.attempts[n].started - ended).num_milliseconds();
        assert!(
            delay >= min - 2 && delay <= max + 400,
            "delay before attempt {}: {delay} ms not within [{min}, {max}] ms",
            n + 1
        );
        // The handler saw the same spacing.
        assert!(calls[n].1 - calls[n - 1].1 >= Duration::from_millis((min - 2) as u64));
    }
    assert_eq!(dispatch_pending(&js).await, 0, "acked: gone from the work queue");
    assert!(dead_letters(&js).await.is_empty());
    let metrics = worker.metrics().await;
    for line in [
        r#"jetsched_worker_runs_total{outcome="retried",queue="default"} 2"#,
        r#"jetsched_worker_runs_total{outcome="succeeded",queue="default"} 1"#,
        r#"jetsched_worker_retries_total{queue="default"} 2"#,
        "jetsched_worker_runs_in_flight 0",
        r#"jetsched_queue_depth{queue="default"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(metrics.contains("jetsched_worker_run_duration_seconds_count"), "{metrics}");
    worker.stop().await;
}

#[tokio::test]
async fn worker_dead_letters_exhausted_and_permanent_failures_with_their_history() {
    init_test_logging();
    let server = NatsServer::start().await;
    let handlers = Handlers::new()
        .register(
            "always-fails",
            |run: RunContext| async move { Outcome::retry(format!("boom {}", run.attempt)) },
        )
        .register("rejects", |_run: RunContext| async { Outcome::permanent("bad input") });
    let worker = RunningWorker::start(config(&server, "w-dlq"), handlers).await;
    let js = jetstream::new(server.client().await);

    let failing =
        spec("failing", "default", json!({"kind": "handler", "name": "always-fails"}), fast_retry(3), "5s");
    let rejected =
        spec("rejected", "default", json!({"kind": "handler", "name": "rejects"}), fast_retry(3), "5s");
    let unknown =
        spec("unknown", "default", json!({"kind": "handler", "name": "nobody"}), fast_retry(3), "5s");
    let failing_id = dispatch(&js, &failing, 2_000).await;
    let rejected_id = dispatch(&js, &rejected, 2_000).await;
    let unknown_id = dispatch(&js, &unknown, 2_000).await;

    let entry = dead_letter_of(&js, &failing_id).await;
    assert_eq!(entry.source, DeadLetterSource::Verdict);
    assert_eq!(entry.attempts.len(), 3, "every attempt recorded: {entry:?}");
    assert!(entry.attempts.iter().all(|a| a.outcome == Some(AttemptOutcome::Failed) && a.finished.is_some()));
    assert_eq!(entry.attempts[2].error.as_deref(), Some("boom 3"));
    assert!(entry.attempts.iter().all(|a| a.worker == "w-dlq"));
    assert!(entry.reason.contains("gave up after 3 attempts"), "{}", entry.reason);
    assert_eq!(entry.spec.as_ref().map(|s| s.id.as_str()), Some("failing"), "spec snapshot");
    assert_eq!(entry.nominal_time.timestamp_millis(), 2_000);

    let entry = dead_letter_of(&js, &rejected_id).await;
    assert_eq!(entry.attempts.len(), 1, "permanent: one attempt");
    assert_eq!(entry.attempts[0].outcome, Some(AttemptOutcome::Permanent));
    assert!(entry.reason.contains("bad input"), "{}", entry.reason);

    let entry = dead_letter_of(&js, &unknown_id).await;
    assert_eq!(entry.attempts.len(), 1);
    assert!(entry.reason.contains("no handler \"nobody\""), "{}", entry.reason);

    for id in [&failing_id, &rejected_id, &unknown_id] {
        wait_status(&js, id, RunStatus::Dead, WAIT).await;
    }
    eventually(WAIT, "terminated dispatches leave the work queue", || async {
        dispatch_pending(&js).await == 0
    })
    .await;
    // The events tell the story too.
    let names = Names::default();
    let events = js.get_stream(names.events_stream()).await.expect("events stream");
    let dead = events
        .get_last_raw_message_by_subject(&names.event_subject("run.dead", "wk", "failing"))
        .await
        .expect("run.dead event");
    let dead: Value = serde_json::from_slice(&dead.payload).unwrap();
    assert_eq!(dead["execution_id"], failing_id.as_str());
    worker.stop().await;
}

/// A tiny HTTP/1.1 server: the path picks the answer.
async fn http_server() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_string();
                log.lock().unwrap().push(head.clone());
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, body) = match path.as_str() {
                    "/ok" => ("200 OK", "done".to_string()),
                    "/bad" => ("400 Bad Request", "missing field".to_string()),
                    "/boom" => ("500 Internal Server Error", "x".repeat(10_000)),
                    "/busy" => ("429 Too Many Requests", "slow down".to_string()),
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        ("200 OK", "late".to_string())
                    }
                    _ => ("404 Not Found", String::new()),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    (addr, requests)
}

#[tokio::test]
async fn worker_http_executor_classifies_status_classes_and_timeouts() {
    init_test_logging();
    let server = NatsServer::start().await;
    let (addr, requests) = http_server().await;
    let worker = RunningWorker::start(config(&server, "w-http"), Handlers::new()).await;
    let js = jetstream::new(server.client().await);
    let http = |path: &str| json!({"kind": "http", "method": "POST", "url": format!("http://{addr}{path}"), "body": {"k": 1}});

    let ok = dispatch(&js, &spec("h-ok", "default", http("/ok"), fast_retry(2), "2s"), 1).await;
    let bad = dispatch(&js, &spec("h-bad", "default", http("/bad"), fast_retry(2), "2s"), 1).await;
    let boom = dispatch(&js, &spec("h-boom", "default", http("/boom"), fast_retry(2), "2s"), 1).await;
    let busy = dispatch(&js, &spec("h-busy", "default", http("/busy"), fast_retry(2), "2s"), 1).await;
    let slow = dispatch(&js, &spec("h-slow", "default", http("/slow"), fast_retry(2), "500ms"), 1).await;
    let refused = dispatch(
        &js,
        &spec(
            "h-refused",
            "default",
            json!({"kind": "http", "url": "http://127.0.0.1:1/"}),
            fast_retry(2),
            "2s",
        ),
        1,
    )
    .await;

    let r = wait_status(&js, &ok, RunStatus::Succeeded, WAIT).await;
    assert!(r.attempts[0].detail.as_deref().unwrap_or_default().contains("HTTP 200 OK: done"), "{r:?}");
    let head =
        requests.lock().unwrap().iter().find(|h| h.starts_with("POST /ok")).cloned().expect("request seen");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains(&format!("jetsched-execution-id: {ok}")) && head.contains("jetsched-attempt: 1"),
        "{head}"
    );

    let e = dead_letter_of(&js, &bad).await;
    assert_eq!(e.attempts.len(), 1, "4xx is permanent");
    assert!(e.reason.contains("HTTP 400") && e.reason.contains("missing field"), "{}", e.reason);

    for (id, what) in
        [(&boom, "HTTP 500"), (&busy, "HTTP 429"), (&slow, "timed out"), (&refused, "request failed")]
    {
        let e = dead_letter_of(&js, id).await;
        assert_eq!(e.attempts.len(), 2, "{what} is retryable: {e:?}");
        assert!(
            e.attempts.iter().all(|a| a.error.as_deref().unwrap_or_default().contains(what)),
            "{what}: {e:?}"
        );
    }
    let e = dead_letter_of(&js, &boom).await;
    assert!(e.reason.len() < 4_000, "the body excerpt is bounded: {} bytes", e.reason.len());
    worker.stop().await;
}

#[tokio::test]
async fn worker_nats_executor_follows_the_reply_contract() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let mut requests = client.subscribe("jobs.>").await.expect("subscribe");
    let responder_client = client.clone();
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let seen_by_responder = seen.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let Some(reply) = request.reply.clone() else { continue };
            seen_by_responder.lock().unwrap().push(request.headers.clone().unwrap_or_default());
            let mut headers = HeaderMap::new();
            let body: &[u8] = match request.subject.as_str() {
                "jobs.ok" => b"fine",
                "jobs.retry" => {
                    headers.insert(HDR_STATUS, "retry");
                    b"try later"
                }
                "jobs.fail" => br#"{"status": "fail", "error": "unknown customer"}"#,
                _ => b"",
            };
            let _ = responder_client.publish_with_headers(reply, headers, body.to_vec().into()).await;
        }
    });
    let worker = RunningWorker::start(config(&server, "w-nats"), Handlers::new()).await;
    let js = jetstream::new(client.clone());
    let nats = |subject: &str| json!({"kind": "nats", "subject": subject, "payload": {"n": 1}, "headers": {"X-Team": "a"}});

    let ok = dispatch(&js, &spec("n-ok", "default", nats("jobs.ok"), fast_retry(2), "2s"), 1).await;
    let retry = dispatch(&js, &spec("n-retry", "default", nats("jobs.retry"), fast_retry(2), "2s"), 1).await;
    let fail = dispatch(&js, &spec("n-fail", "default", nats("jobs.fail"), fast_retry(2), "2s"), 1).await;
    let nobody =
        dispatch(&js, &spec("n-nobody", "default", nats("nobody.home"), fast_retry(2), "2s"), 1).await;

    let r = wait_status(&js, &ok, RunStatus::Succeeded, WAIT).await;
    assert_eq!(r.attempts[0].detail.as_deref(), Some("fine"));
    let e = dead_letter_of(&js, &retry).await;
    assert_eq!(e.attempts.len(), 2);
    assert_eq!(e.attempts[0].error.as_deref(), Some("try later"));
    let e = dead_letter_of(&js, &fail).await;
    assert_eq!(e.attempts.len(), 1, "fail is permanent");
    assert!(e.reason.contains("unknown customer"), "{}", e.reason);
    let e = dead_letter_of(&js, &nobody).await;
    assert_eq!(e.attempts.len(), 2, "no responders is retryable");
    assert!(e.reason.contains("no responders"), "{}", e.reason);

    let headers = seen.lock().unwrap().clone();
    let first = headers
        .iter()
        .find(|h| h.get(HDR_EXECUTION_ID).map(|v| v.as_str()) == Some(ok.as_str()))
        .expect("seen");
    assert_eq!(first.get(HDR_ATTEMPT).map(|v| v.as_str()), Some("1"));
    assert_eq!(first.get(HDR_TASK).map(|v| v.as_str()), Some("wk.n-ok"));
    assert_eq!(first.get("X-Team").map(|v| v.as_str()), Some("a"));
    assert!(first.get(HDR_NOMINAL_TIME).is_some());
    // The worker announces itself (`jetsched status`, `nats micro ls`).
    let names = Names::default();
    let replicas = jetsched_shared::presence::ping(
        &client,
        &names.presence_service("worker"),
        Duration::from_millis(500),
    )
    .await
    .expect("ping");
    assert!(
        replicas.iter().any(|r| r.metadata.get("instance").map(String::as_str) == Some("w-nats")),
        "{replicas:?}"
    );
    worker.stop().await;
}

#[tokio::test]
async fn worker_shell_executor_is_off_by_default_and_kills_the_process_group_on_timeout() {
    init_test_logging();
    let server = NatsServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut closed = config(&server, "w-closed");
    closed.queues = vec!["closed".into()];
    let closed = RunningWorker::start(closed, Handlers::new()).await;
    let mut open = config(&server, "w-open");
    open.queues = vec!["open".into()];
    open.shell_allow = vec!["sh".into(), "echo".into()];
    let open = RunningWorker::start(open, Handlers::new()).await;
    let js = jetstream::new(server.client().await);

    let echo = json!({"kind": "shell", "command": ["echo", "hello $HOME"]});
    let refused = dispatch(&js, &spec("s-refused", "closed", echo.clone(), fast_retry(3), "2s"), 1).await;
    let e = dead_letter_of(&js, &refused).await;
    assert_eq!(e.attempts.len(), 1, "a disabled shell is a permanent failure");
    assert!(e.reason.contains("shell executor is disabled"), "{}", e.reason);

    let hello = dispatch(&js, &spec("s-echo", "open", echo, fast_retry(1), "2s"), 1).await;
    let r = wait_status(&js, &hello, RunStatus::Succeeded, WAIT).await;
    let detail = r.attempts[0].detail.clone().unwrap_or_default();
    assert!(detail.contains("hello $HOME"), "argv, no shell interpolation: {detail}");

    let script = "echo FOO=$FOO EXEC=$JETSCHED_EXECUTION_ID HOME=${HOME:-unset} PWD=$(pwd)";
    let env =
        json!({"kind": "shell", "command": ["sh", "-c", script], "env": {"FOO": "bar"}, "cwd": dir.path()});
    let env_id = dispatch(&js, &spec("s-env", "open", env, fast_retry(1), "2s"), 1).await;
    let detail = wait_status(&js, &env_id, RunStatus::Succeeded, WAIT).await.attempts[0]
        .detail
        .clone()
        .unwrap_or_default();
    let expected = format!("FOO=bar EXEC={env_id} HOME=unset PWD={}", dir.path().display());
    assert!(detail.contains(&expected), "spec env, execution env, cwd, nothing inherited: {detail}");

    let not_allowed = json!({"kind": "shell", "command": ["ls", "/"]});
    let e =
        dead_letter_of(&js, &dispatch(&js, &spec("s-ls", "open", not_allowed, fast_retry(3), "2s"), 1).await)
            .await;
    assert!(e.reason.contains("not on this worker's --shell-allow list"), "{}", e.reason);

    // A background grandchild in the same group must die with the timed-out run.
    let pid_file = dir.path().join("pid");
    let script = format!("sleep 60 & echo $! > {}; echo started; wait", pid_file.display());
    let stuck =
        json!({"kind": "shell", "command": ["sh", "-c", script], "env": {"FOO": "bar"}, "cwd": dir.path()});
    let started = Instant::now();
    let stuck_id = dispatch(&js, &spec("s-stuck", "open", stuck, fast_retry(1), "1s"), 1).await;
    let e = dead_letter_of(&js, &stuck_id).await;
    assert!(started.elapsed() < Duration::from_secs(8), "timeout enforced");
    let error = e.attempts[0].error.clone().unwrap_or_default();
    assert!(error.contains("timed out") && error.contains("process group killed"), "{error}");
    assert!(error.contains("started"), "stdout tail kept: {error}");
    let pid: i32 = std::fs::read_to_string(&pid_file).expect("pid file").trim().parse().expect("pid");
    eventually(Duration::from_secs(5), "the grandchild is gone", || async {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            // A zombie waiting for a reaper is dead too.
            Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        }
    })
    .await;
    closed.stop().await;
    open.stop().await;
}

/// A responder on `jobs.count` that counts requests per execution id, replying after `delay`.
fn counting_responder(
    client: async_nats::Client,
    mut sub: async_nats::Subscriber,
    delay: Duration,
) -> Arc<Mutex<HashMap<String, u32>>> {
    let counts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Some(request) = sub.next().await {
            let id = request
                .headers
                .as_ref()
                .and_then(|h| h.get(HDR_EXECUTION_ID))
                .map(|v| v.to_string())
                .unwrap_or_default();
            *seen.lock().unwrap().entry(id).or_default() += 1;
            let Some(reply) = request.reply else { continue };
            let client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = client.publish(reply, "ok".into()).await;
            });
        }
    });
    counts
}

fn worker_process(server: &NatsServer, instance: &str, extra: &[&str]) -> ChildProcess {
    let mut command = ChildProcess::command("jetsched-worker");
    command
        .args(["--nats-url", &server.url(), "--instance-id", instance, "--admin-addr", "127.0.0.1:0"])
        .args(["--pull-expires", "500ms"])
        .args(extra);
    ChildProcess::spawn_command(instance, command)
}

/// Waits until `n` worker replicas answer presence pings (their consumers are bound).
async fn wait_for_workers(client: &async_nats::Client, n: usize) {
    let name = Names::default().presence_service("worker");
    eventually(WAIT, &format!("{n} workers present"), || async {
        let found =
            jetsched_shared::presence::ping(client, &name, Duration::from_millis(200)).await.ok()?.len();
        (found >= n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn three_worker_processes_share_3000_runs_each_executed_once() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let sub = client.subscribe("jobs.count").await.expect("subscribe");
    let counts = counting_responder(client.clone(), sub, Duration::from_millis(2));
    let js = jetstream::new(client.clone());
    jetsched_shared::topology::ensure(&js, &Names::default(), &Default::default()).await.expect("topology");
    let _workers: Vec<ChildProcess> =
        (1..=3).map(|n| worker_process(&server, &format!("proc-{n}"), &["--concurrency", "16"])).collect();
    wait_for_workers(&client, 3).await;

    let task =
        spec("shared", "default", json!({"kind": "nats", "subject": "jobs.count"}), fast_retry(3), "5s");
    let mut acks = Vec::new();
    for n in 0..3000 {
        acks.push(publish_dispatch(&js, &task, n).await);
        if acks.len() >= 256 {
            for ack in acks.drain(..) {
                ack.await.expect("stored");
            }
        }
    }
    for ack in acks {
        ack.await.expect("stored");
    }
    let started = Instant::now();
    eventually(Duration::from_secs(45), "3000 runs executed", || async {
        let n = counts.lock().unwrap().len();
        if n == 3000 { Ok(()) } else { Err(n) }
    })
    .await;
    eventually(WAIT, "every run acked", || async { dispatch_pending(&js).await == 0 }).await;
    let elapsed = started.elapsed();
    let counts = counts.lock().unwrap().clone();
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "runs executed more than once: {twice:?}");
    let mut per_worker: HashMap<String, u32> = HashMap::new();
    for n in 0..3000 {
        let r = wait_status(&js, &spec_execution(&task, n), RunStatus::Succeeded, WAIT).await;
        assert_eq!(r.attempts.len(), 1);
        *per_worker.entry(r.worker).or_default() += 1;
    }
    assert_eq!(per_worker.len(), 3, "each worker takes part: {per_worker:?}");
    eprintln!("3000 runs over 3 worker processes in {elapsed:?}: {per_worker:?}");
}

#[tokio::test]
async fn kill9_mid_long_runs_they_complete_on_another_worker_after_ack_wait() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let sub = client.subscribe("jobs.count").await.expect("subscribe");
    // Runs of 3 s against an ack_wait of 2 s: only progress acks keep them from redelivery.
    let counts = counting_responder(client.clone(), sub, Duration::from_secs(3));
    let js = jetstream::new(client.clone());
    jetsched_shared::topology::ensure(&js, &Names::default(), &Default::default()).await.expect("topology");
    let args = ["--concurrency", "3", "--ack-wait", "2s"];
    let mut workers: HashMap<String, ChildProcess> =
        ["k-1", "k-2"].into_iter().map(|n| (n.to_string(), worker_process(&server, n, &args))).collect();
    wait_for_workers(&client, 2).await;

    let task =
        spec("long", "default", json!({"kind": "nats", "subject": "jobs.count"}), fast_retry(3), "10s");
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(dispatch(&js, &task, n).await);
    }
    // Once every run is running, kill -9 the worker of the first one.
    let running = eventually(WAIT, "all six runs started", || async {
        let mut records = Vec::new();
        for id in &ids {
            match record(&js, id).await {
                Some(r) if r.status == RunStatus::Running => records.push(r),
                _ => return None,
            }
        }
        Some(records)
    })
    .await;
    let victim = running[0].worker.clone();
    let victims: Vec<String> =
        running.iter().filter(|r| r.worker == victim).map(|r| r.execution_id.clone()).collect();
    workers.get_mut(&victim).expect("victim").kill9();
    let killed_at = Instant::now();

    for id in &ids {
        let r = wait_status(&js, id, RunStatus::Succeeded, Duration::from_secs(30)).await;
        if victims.contains(id) {
            assert_eq!(outcomes(&r), [AttemptOutcome::Abandoned, AttemptOutcome::Succeeded], "{r:?}");
            assert_ne!(r.worker, victim);
            assert_eq!(r.reruns, 1);
        } else {
            assert_eq!(outcomes(&r), [AttemptOutcome::Succeeded], "progress acks prevent redelivery: {r:?}");
        }
    }
    assert!(killed_at.elapsed() >= Duration::from_secs(1), "redelivery waited for ack_wait");
    let counts = counts.lock().unwrap().clone();
    for id in &ids {
        let expected = if victims.contains(id) { 2 } else { 1 };
        assert_eq!(counts.get(id), Some(&expected), "executions of {id}");
    }
    assert_eq!(dispatch_pending(&js).await, 0);
}

#[tokio::test]
async fn graceful_shutdown_under_load_loses_nothing() {
    init_test_logging();
    let server = NatsServer::start().await;
    let executed: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handlers = |executed: Arc<Mutex<HashMap<String, u32>>>| {
        Handlers::new().register("work", move |run: RunContext| {
            let executed = executed.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                *executed.lock().unwrap().entry(run.execution_id).or_default() += 1;
                Outcome::ok()
            }
        })
    };
    let mut first = config(&server, "g-1");
    first.concurrency = 8;
    let first = RunningWorker::start(first, handlers(executed.clone())).await;
    let js = jetstream::new(server.client().await);
    let task = spec("graceful", "default", json!({"kind": "handler", "name": "work"}), fast_retry(1), "5s");
    for n in 0..300 {
        publish_dispatch(&js, &task, n).await.await.expect("stored");
    }
    eventually(WAIT, "the first worker is busy", || async { executed.lock().unwrap().len() >= 16 }).await;
    let mut second = config(&server, "g-2");
    second.concurrency = 8;
    let second = RunningWorker::start(second, handlers(executed.clone())).await;
    // Stop the first worker under load: in-flight runs finish, nothing is left unacked.
    let took = first.stop().await;
    assert!(took < Duration::from_secs(3), "stops promptly: {took:?}");
    eventually(Duration::from_secs(30), "all 300 runs executed", || async {
        let n = executed.lock().unwrap().len();
        if n == 300 { Ok(()) } else { Err(n) }
    })
    .await;
    eventually(WAIT, "all acked", || async { dispatch_pending(&js).await == 0 }).await;
    let twice: Vec<_> =
        executed.lock().unwrap().iter().filter(|(_, n)| **n != 1).map(|(k, _)| k.clone()).collect();
    assert!(twice.is_empty(), "a graceful stop executes nothing twice: {twice:?}");
    second.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_hands_back_runs_that_outlast_the_grace_period() {
    init_test_logging();
    let server = NatsServer::start().await;
    let executed: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let seen = executed.clone();
    let handlers = Handlers::new().register("slow", move |run: RunContext| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((run.execution_id.clone(), run.attempt));
            let wait = if run.attempt == 1 { Duration::from_secs(30) } else { Duration::from_millis(10) };
            tokio::time::sleep(wait).await;
            Outcome::ok()
        }
    });
    let mut short = config(&server, "grace-1");
    short.shutdown_grace = Duration::from_millis(300);
    let short = RunningWorker::start(short, handlers.clone()).await;
    let js = jetstream::new(server.client().await);
    let task = spec("slow", "default", json!({"kind": "handler", "name": "slow"}), fast_retry(2), "60s");
    let id = dispatch(&js, &task, 1).await;
    eventually(WAIT, "the run started", || async { !executed.lock().unwrap().is_empty() }).await;
    let took = short.stop().await;
    assert!(took < Duration::from_secs(3), "grace period bounds the stop: {took:?}");
    let other = RunningWorker::start(config(&server, "grace-2"), handlers).await;
    let r = wait_status(&js, &id, RunStatus::Succeeded, Duration::from_secs(5)).await;
    assert_eq!(outcomes(&r), [AttemptOutcome::Interrupted, AttemptOutcome::Succeeded], "{r:?}");
    assert_eq!(r.worker, "grace-2", "handed back at once, not after ack_wait");
    other.stop().await;
}

#[tokio::test]
async fn crash_looping_run_reaches_the_dlq_through_the_max_deliveries_advisory() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let mut sub = client.subscribe("jobs.crash").await.expect("subscribe");
    let js = jetstream::new(client.clone());
    jetsched_shared::topology::ensure(&js, &Names::default(), &Default::default()).await.expect("topology");
    let args = ["--ack-wait", "1s", "--max-deliver", "2"];
    let mut worker = worker_process(&server, "crash-1", &args);
    let task =
        spec("crashy", "default", json!({"kind": "nats", "subject": "jobs.crash"}), fast_retry(5), "30s");
    let id = dispatch(&js, &task, 1).await;
    // Every time the run reaches its handler, its worker dies.
    for n in 2..=3 {
        tokio::time::timeout(WAIT, sub.next()).await.expect("the run is delivered").expect("subscription");
        worker.kill9();
        worker = worker_process(&server, &format!("crash-{n}"), &args);
    }
    let entry = dead_letter_of(&js, &id).await;
    assert_eq!(entry.source, DeadLetterSource::MaxDeliveries);
    assert!(entry.reason.contains("no verdict after 2 deliveries"), "{}", entry.reason);
    assert_eq!(outcomes_of(&entry), [AttemptOutcome::Abandoned, AttemptOutcome::Abandoned], "{entry:?}");
    wait_status(&js, &id, RunStatus::Dead, WAIT).await;
    eventually(WAIT, "moved out of the dispatch stream", || async { dispatch_pending(&js).await == 0 }).await;
    drop(worker);
}

fn outcomes_of(entry: &DeadLetter) -> Vec<AttemptOutcome> {
    entry.attempts.iter().map(|a| a.outcome.expect("closed")).collect()
}

#[tokio::test]
async fn a_full_dlq_leaves_the_run_in_place_until_the_dead_letter_is_stored() {
    init_test_logging();
    let server = NatsServer::start().await;
    let executions: Arc<Mutex<u32>> = Arc::default();
    let count = executions.clone();
    let handlers = Handlers::new().register("rejects", move |_run: RunContext| {
        let count = count.clone();
        async move {
            *count.lock().unwrap() += 1;
            Outcome::permanent("bad input")
        }
    });
    let mut cfg = config(&server, "w-full");
    cfg.topology.dlq_max_bytes = 64;
    cfg.dlq_retry_delay = Duration::from_millis(300);
    let worker = RunningWorker::start(cfg, handlers).await;
    let js = jetstream::new(server.client().await);
    let id = dispatch(
        &js,
        &spec("full", "default", json!({"kind": "handler", "name": "rejects"}), fast_retry(3), "5s"),
        1,
    )
    .await;

    let r = wait_status(&js, &id, RunStatus::Failed, WAIT).await;
    assert_eq!(r.attempts.len(), 1);
    let names = Names::default();
    let events = js.get_stream(names.events_stream()).await.expect("events stream");
    let failed = eventually(WAIT, "run.failed event about the refused dead letter", || async {
        let message = events
            .get_last_raw_message_by_subject(&names.event_subject("run.failed", "wk", "full"))
            .await
            .ok()?;
        let event: Value = serde_json::from_slice(&message.payload).ok()?;
        (event["reason"] == "dlq_rejected").then_some(event)
    })
    .await;
    assert_eq!(failed["execution_id"], id.as_str());
    assert_eq!(dispatch_pending(&js).await, 1, "not terminated while the DLQ refuses it");

    // Room in the DLQ: the next redelivery stores the entry without running the task again.
    let mut dlq = js.get_stream(names.dlq_stream()).await.expect("DLQ");
    let mut dlq_config = dlq.info().await.expect("info").config.clone();
    dlq_config.max_bytes = 1 << 20;
    js.update_stream(dlq_config).await.expect("grow the DLQ");
    let entry = dead_letter_of(&js, &id).await;
    assert_eq!(entry.attempts.len(), 1);
    wait_status(&js, &id, RunStatus::Dead, WAIT).await;
    eventually(WAIT, "terminated", || async { dispatch_pending(&js).await == 0 }).await;
    assert_eq!(*executions.lock().unwrap(), 1, "the task ran once");
    worker.stop().await;
}

/// Publishes the dispatch of `nominal_ms` again under another message id: what a lost
/// de-duplication memory (server restart on a work-queue stream) lets through.
async fn redispatch(js: &jetstream::Context, spec: &TaskSpec, nominal_ms: i64) {
    let names = Names::default();
    let body = Dispatch {
        execution_id: spec_execution(spec, nominal_ms),
        namespace: spec.namespace.clone(),
        task_id: spec.id.clone(),
        nominal_time: chrono::DateTime::from_timestamp_millis(nominal_ms).expect("valid time"),
        trigger: Trigger::Schedule,
        term: 2,
        revision: 1,
        spec: spec.clone(),
    };
    let message = PublishMessage::build()
        .payload(serde_json::to_vec(&body).expect("encode").into())
        .message_id(format!("again-{}-{nominal_ms}", spec.id));
    js.send_publish(names.dispatch_subject(&spec.queue, &spec.namespace, &spec.id), message)
        .await
        .expect("publish")
        .await
        .expect("stored");
}

#[tokio::test]
async fn a_redelivered_succeeded_run_is_acked_without_running_with_eager_and_lazy_records() {
    init_test_logging();
    let server = NatsServer::start().await;
    let executions: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handlers = |executions: Arc<Mutex<HashMap<String, u32>>>| {
        Handlers::new().register("count", move |run: RunContext| {
            let executions = executions.clone();
            async move {
                let mut executions = executions.lock().unwrap();
                let n = executions.entry(run.execution_id).or_default();
                *n += 1;
                // The first attempt of every run fails once.
                if run.attempt == 1 { Outcome::retry("first attempt fails") } else { Outcome::ok() }
            }
        })
    };
    let mut eager = config(&server, "w-eager");
    eager.queues = vec!["eager".into()];
    let eager = RunningWorker::start(eager, handlers(executions.clone())).await;
    let mut lazy = config(&server, "w-lazy");
    lazy.queues = vec!["lazy".into()];
    lazy.run_records = jetsched_worker::RunRecords::Lazy;
    let lazy = RunningWorker::start(lazy, handlers(executions.clone())).await;
    let js = jetstream::new(server.client().await);

    for queue in ["eager", "lazy"] {
        let task = spec(
            &format!("dup-{queue}"),
            queue,
            json!({"kind": "handler", "name": "count"}),
            fast_retry(3),
            "5s",
        );
        let id = dispatch(&js, &task, 7).await;
        let r = wait_status(&js, &id, RunStatus::Succeeded, WAIT).await;
        assert_eq!(outcomes(&r), [AttemptOutcome::Failed, AttemptOutcome::Succeeded], "{queue}: {r:?}");
        redispatch(&js, &task, 7).await;
        eventually(WAIT, "the duplicate is acked", || async { dispatch_pending(&js).await == 0 }).await;
        assert_eq!(executions.lock().unwrap().get(&id), Some(&2), "{queue}: two attempts, no third");
    }
    for worker in [&eager, &lazy] {
        let metrics = worker.metrics().await;
        assert!(metrics.contains(r#"outcome="duplicate""#), "{metrics}");
    }
    eager.stop().await;
    lazy.stop().await;
}

#[tokio::test]
async fn run_events_published_while_the_events_stream_is_gone_are_stored_once_it_is_back() {
    init_test_logging();
    let server = NatsServer::start().await;
    let handlers = Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() });
    let worker = RunningWorker::start(config(&server, "w-events"), handlers).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    // As when a replicated events stream elects a new leader after a node died.
    js.delete_stream(names.events_stream()).await.expect("delete the events stream");
    let task = spec("outage", "default", json!({"kind": "handler", "name": "noop"}), fast_retry(3), "5s");
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(dispatch(&js, &task, n).await);
    }
    for id in &ids {
        wait_status(&js, id, RunStatus::Succeeded, WAIT).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    jetsched_shared::topology::ensure(&js, &names, &Default::default()).await.expect("events stream back");
    let events = eventually(WAIT, "every run's events stored", || async {
        let events: Vec<jetsched_shared::wire::Event> =
            jetsched_tests::read_stream(&js, &names.events_stream(), Duration::from_millis(500))
                .await
                .ok()?
                .iter()
                .filter_map(|m| serde_json::from_slice(&m.payload).ok())
                .collect();
        (events.len() >= 2 * ids.len()).then_some(events)
    })
    .await;
    for id in &ids {
        let kinds: Vec<&str> = events
            .iter()
            .filter(|e| e.execution_id.as_deref() == Some(id.as_str()))
            .map(|e| e.kind.as_str())
            .collect();
        assert!(kinds.contains(&"run.started") && kinds.contains(&"run.succeeded"), "{id}: {kinds:?}");
    }
    let metrics = worker.metrics().await;
    assert!(!metrics.contains(r#"what="event""#), "no event counted as lost: {metrics}");
    worker.stop().await;
}

#[tokio::test]
async fn workers_on_a_three_node_cluster_with_r3_retry_and_recognise_duplicates() {
    init_test_logging();
    let cluster = jetsched_tests::NatsCluster::start().await;
    let executions: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handlers = |executions: Arc<Mutex<HashMap<String, u32>>>| {
        Handlers::new().register("once-flaky", move |run: RunContext| {
            let executions = executions.clone();
            async move {
                *executions.lock().unwrap().entry(run.execution_id).or_default() += 1;
                if run.attempt == 1 { Outcome::retry("first attempt fails") } else { Outcome::ok() }
            }
        })
    };
    let mut workers = Vec::new();
    for n in 0..2 {
        let mut config = Config::for_tests(&cluster.urls(), &format!("r3-{n}"));
        config.topology.replicas = 3;
        config.pull_expires = Duration::from_millis(500);
        workers.push(RunningWorker::start(config, handlers(executions.clone())).await);
    }
    let js = jetstream::new(cluster.client().await);
    let task = spec("r3", "default", json!({"kind": "handler", "name": "once-flaky"}), fast_retry(3), "5s");
    let mut ids = Vec::new();
    for n in 0..40 {
        ids.push(dispatch(&js, &task, n).await);
    }
    for id in &ids {
        let r = wait_status(&js, id, RunStatus::Succeeded, Duration::from_secs(30)).await;
        assert_eq!(outcomes(&r), [AttemptOutcome::Failed, AttemptOutcome::Succeeded], "{r:?}");
    }
    // Replicated buckets report lost compare-and-set races differently: duplicates are still
    // recognised.
    for n in 0..5 {
        redispatch(&js, &task, n).await;
    }
    eventually(WAIT, "duplicates acked", || async { dispatch_pending(&js).await == 0 }).await;
    let executions = executions.lock().unwrap().clone();
    assert!(ids.iter().all(|id| executions.get(id) == Some(&2)), "{executions:?}");
    for worker in workers {
        worker.stop().await;
    }
}

async fn dlq_call(client: &async_nats::Client, endpoint: &str, body: Value) -> Value {
    let subject = Names::default().dlq_api_subject(endpoint);
    let reply =
        tokio::time::timeout(WAIT, client.request(subject, serde_json::to_vec(&body).unwrap().into()))
            .await
            .expect("reply in time")
            .expect("request succeeds");
    serde_json::from_slice(&reply.payload)
        .unwrap_or_else(|e| panic!("reply is JSON ({e}): {:?}", reply.payload))
}

#[tokio::test]
async fn dead_letters_are_listed_replayed_and_purged_through_the_registry_api() {
    init_test_logging();
    let server = NatsServer::start().await;
    let registry = jetsched_registry::build(jetsched_registry::Config::for_tests(&server.url()))
        .await
        .expect("registry");
    let registry_stop = CancellationToken::new();
    let registry_task = tokio::spawn(registry.run(registry_stop.clone()));
    // Fails until `healed` is set: dead letters first, successful replays after.
    let healed: Arc<Mutex<bool>> = Arc::default();
    let fixed = healed.clone();
    let handlers = Handlers::new().register("until-fixed", move |_run: RunContext| {
        let fixed = fixed.clone();
        async move { if *fixed.lock().unwrap() { Outcome::ok() } else { Outcome::permanent("not yet") } }
    });
    let worker = RunningWorker::start(config(&server, "w-replay"), handlers).await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let executor = json!({"kind": "handler", "name": "until-fixed"});
    let one = dispatch(&js, &spec("replay-one", "default", executor.clone(), fast_retry(1), "5s"), 1).await;
    let mut bulk = Vec::new();
    for n in 0..3 {
        bulk.push(
            dispatch(&js, &spec("replay-bulk", "default", executor.clone(), fast_retry(1), "5s"), n).await,
        );
    }
    let doomed = dispatch(&js, &spec("purge-me", "default", executor, fast_retry(1), "5s"), 1).await;
    for id in bulk.iter().chain([&one, &doomed]) {
        dead_letter_of(&js, id).await;
    }

    let listed =
        dlq_call(&client, "list", json!({"namespace": "wk", "task_id": "replay-bulk", "limit": 2})).await;
    let entries = listed["entries"].as_array().unwrap_or_else(|| panic!("entries: {listed}"));
    assert_eq!(entries.len(), 2, "{listed}");
    assert!(entries.iter().all(|e| e["entry"]["task_id"] == "replay-bulk"));
    let cursor = listed["next_cursor"].as_u64().expect("a next page");
    let rest =
        dlq_call(&client, "list", json!({"namespace": "wk", "task_id": "replay-bulk", "cursor": cursor}))
            .await;
    assert_eq!(rest["entries"].as_array().map(Vec::len), Some(1), "{rest}");
    assert!(rest.get("next_cursor").is_none());

    let all = dlq_call(&client, "list", json!({})).await;
    let sequence_of = |id: &str| {
        all["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["entry"]["execution_id"] == id)
            .and_then(|e| e["sequence"].as_u64())
    };
    let one_seq = sequence_of(&one).expect("listed");
    let got = dlq_call(&client, "get", json!({"sequence": one_seq})).await;
    assert_eq!(got["entry"]["execution_id"], one.as_str());
    assert_eq!(got["entry"]["attempts"].as_array().map(Vec::len), Some(1));

    *healed.lock().unwrap() = true;
    let replayed = dlq_call(&client, "replay", json!({"sequence": one_seq})).await;
    let new_id =
        replayed["replayed"][0]["execution_id"].as_str().unwrap_or_else(|| panic!("{replayed}")).to_string();
    assert_ne!(new_id, one);
    let r = wait_status(&js, &new_id, RunStatus::Succeeded, WAIT).await;
    assert_eq!(r.trigger, Trigger::Replay);
    let missing = dlq_call(&client, "get", json!({"sequence": one_seq})).await;
    assert_eq!(missing["error"]["code"], "not_found", "replayed entries leave the DLQ: {missing}");

    let bulk_reply =
        dlq_call(&client, "replay", json!({"namespace": "wk", "task_id": "replay-bulk", "rate": 20})).await;
    let news: Vec<String> = bulk_reply["replayed"]
        .as_array()
        .unwrap_or_else(|| panic!("{bulk_reply}"))
        .iter()
        .map(|r| r["execution_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(news.len(), 3, "{bulk_reply}");
    for id in &news {
        wait_status(&js, id, RunStatus::Succeeded, WAIT).await;
    }

    let purged = dlq_call(&client, "purge", json!({"task_id": "purge-me"})).await;
    assert_eq!(purged["purged"], 1, "{purged}");
    assert!(dead_letters(&js).await.is_empty(), "the DLQ is empty");
    let bad = dlq_call(&client, "purge", json!({})).await;
    assert_eq!(bad["error"]["code"], "bad_request", "purging needs a target: {bad}");

    worker.stop().await;
    registry_stop.cancel();
    tokio::time::timeout(WAIT, registry_task)
        .await
        .expect("registry stops")
        .expect("no panic")
        .expect("clean stop");
}
