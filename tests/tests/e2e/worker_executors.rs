//! End-to-end tests of the worker's executors against a real nats-server: HTTP status classes
//! and timeouts, the NATS request/reply contract, and the shell executor (off by default,
//! argv without a shell, a clean environment, the process group killed on timeout).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{HDR_ATTEMPT, HDR_EXECUTION_ID, HDR_NOMINAL_TIME, HDR_STATUS, HDR_TASK};
use jetsched_tests::fixtures::{SpecBuilder, dead_letter_of, dispatch, wait_run_status};
use jetsched_tests::{App, NatsServer, eventually, init_test_logging, spec};
use jetsched_worker::Handlers;
use jetsched_worker::runs::RunStatus;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::worker_support::{WAIT, config};

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

/// Dispatches the first attempt of the task `spec` builds; returns its execution id.
async fn send(js: &jetstream::Context, names: &Names, spec: SpecBuilder) -> String {
    dispatch(js, names, &spec.task(), 1).await
}

#[tokio::test]
async fn worker_http_executor_classifies_status_classes_and_timeouts() {
    init_test_logging();
    let server = NatsServer::start().await;
    let (addr, requests) = http_server().await;
    let worker = App::worker(config(&server, "w-http"), Handlers::new()).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let http = |path: &str| json!({"kind": "http", "method": "POST", "url": format!("http://{addr}{path}"), "body": {"k": 1}});

    let ok = send(&js, &names, spec("wk", "h-ok").executor(http("/ok")).fast_retry(2).timeout("2s")).await;
    let bad = send(&js, &names, spec("wk", "h-bad").executor(http("/bad")).fast_retry(2).timeout("2s")).await;
    let boom =
        send(&js, &names, spec("wk", "h-boom").executor(http("/boom")).fast_retry(2).timeout("2s")).await;
    let busy =
        send(&js, &names, spec("wk", "h-busy").executor(http("/busy")).fast_retry(2).timeout("2s")).await;
    let slow =
        send(&js, &names, spec("wk", "h-slow").executor(http("/slow")).fast_retry(2).timeout("500ms")).await;
    let refused = spec("wk", "h-refused").executor(json!({"kind": "http", "url": "http://127.0.0.1:1/"}));
    let refused = send(&js, &names, refused.fast_retry(2).timeout("2s")).await;

    let r = wait_run_status(&js, &names, &ok, RunStatus::Succeeded, WAIT).await;
    assert!(r.attempts[0].detail.as_deref().unwrap_or_default().contains("HTTP 200 OK: done"), "{r:?}");
    let head =
        requests.lock().unwrap().iter().find(|h| h.starts_with("POST /ok")).cloned().expect("request seen");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains(&format!("jetsched-execution-id: {ok}")) && head.contains("jetsched-attempt: 1"),
        "{head}"
    );

    let e = dead_letter_of(&js, &names, &bad, WAIT).await;
    assert_eq!(e.attempts.len(), 1, "4xx is permanent");
    assert!(e.reason.contains("HTTP 400") && e.reason.contains("missing field"), "{}", e.reason);

    for (id, what) in
        [(&boom, "HTTP 500"), (&busy, "HTTP 429"), (&slow, "timed out"), (&refused, "request failed")]
    {
        let e = dead_letter_of(&js, &names, id, WAIT).await;
        assert_eq!(e.attempts.len(), 2, "{what} is retryable: {e:?}");
        assert!(
            e.attempts.iter().all(|a| a.error.as_deref().unwrap_or_default().contains(what)),
            "{what}: {e:?}"
        );
    }
    let e = dead_letter_of(&js, &names, &boom, WAIT).await;
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
    let worker = App::worker(config(&server, "w-nats"), Handlers::new()).await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let nats = |subject: &str| json!({"kind": "nats", "subject": subject, "payload": {"n": 1}, "headers": {"X-Team": "a"}});

    let ok =
        send(&js, &names, spec("wk", "n-ok").executor(nats("jobs.ok")).fast_retry(2).timeout("2s")).await;
    let retry =
        send(&js, &names, spec("wk", "n-retry").executor(nats("jobs.retry")).fast_retry(2).timeout("2s"))
            .await;
    let fail =
        send(&js, &names, spec("wk", "n-fail").executor(nats("jobs.fail")).fast_retry(2).timeout("2s")).await;
    let nobody =
        send(&js, &names, spec("wk", "n-nobody").executor(nats("nobody.home")).fast_retry(2).timeout("2s"))
            .await;

    let r = wait_run_status(&js, &names, &ok, RunStatus::Succeeded, WAIT).await;
    assert_eq!(r.attempts[0].detail.as_deref(), Some("fine"));
    let e = dead_letter_of(&js, &names, &retry, WAIT).await;
    assert_eq!(e.attempts.len(), 2);
    assert_eq!(e.attempts[0].error.as_deref(), Some("try later"));
    let e = dead_letter_of(&js, &names, &fail, WAIT).await;
    assert_eq!(e.attempts.len(), 1, "fail is permanent");
    assert!(e.reason.contains("unknown customer"), "{}", e.reason);
    let e = dead_letter_of(&js, &names, &nobody, WAIT).await;
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
    let closed = App::worker(closed, Handlers::new()).await;
    let mut open = config(&server, "w-open");
    open.queues = vec!["open".into()];
    open.shell_allow = vec!["sh".into(), "echo".into()];
    let open = App::worker(open, Handlers::new()).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();

    let echo = json!({"kind": "shell", "command": ["echo", "hello $HOME"]});
    let refused = spec("wk", "s-refused").queue("closed").executor(echo.clone()).fast_retry(3);
    let refused = send(&js, &names, refused.timeout("2s")).await;
    let e = dead_letter_of(&js, &names, &refused, WAIT).await;
    assert_eq!(e.attempts.len(), 1, "a disabled shell is a permanent failure");
    assert!(e.reason.contains("shell executor is disabled"), "{}", e.reason);

    let hello =
        send(&js, &names, spec("wk", "s-echo").queue("open").executor(echo).fast_retry(1).timeout("2s"))
            .await;
    let r = wait_run_status(&js, &names, &hello, RunStatus::Succeeded, WAIT).await;
    let detail = r.attempts[0].detail.clone().unwrap_or_default();
    assert!(detail.contains("hello $HOME"), "argv, no shell interpolation: {detail}");

    let script = "echo FOO=$FOO EXEC=$JETSCHED_EXECUTION_ID HOME=${HOME:-unset} PWD=$(pwd)";
    let env =
        json!({"kind": "shell", "command": ["sh", "-c", script], "env": {"FOO": "bar"}, "cwd": dir.path()});
    let env_id =
        send(&js, &names, spec("wk", "s-env").queue("open").executor(env).fast_retry(1).timeout("2s")).await;
    let detail = wait_run_status(&js, &names, &env_id, RunStatus::Succeeded, WAIT).await.attempts[0]
        .detail
        .clone()
        .unwrap_or_default();
    let expected = format!("FOO=bar EXEC={env_id} HOME=unset PWD={}", dir.path().display());
    assert!(detail.contains(&expected), "spec env, execution env, cwd, nothing inherited: {detail}");

    let not_allowed = json!({"kind": "shell", "command": ["ls", "/"]});
    let ls = spec("wk", "s-ls").queue("open").executor(not_allowed).fast_retry(3).timeout("2s");
    let ls = send(&js, &names, ls).await;
    let e = dead_letter_of(&js, &names, &ls, WAIT).await;
    assert!(e.reason.contains("not on this worker's --shell-allow list"), "{}", e.reason);

    // A background grandchild in the same group must die with the timed-out run.
    let pid_file = dir.path().join("pid");
    let script = format!("sleep 60 & echo $! > {}; echo started; wait", pid_file.display());
    let stuck =
        json!({"kind": "shell", "command": ["sh", "-c", script], "env": {"FOO": "bar"}, "cwd": dir.path()});
    let started = Instant::now();
    let stuck_id = spec("wk", "s-stuck").queue("open").executor(stuck).fast_retry(1);
    let stuck_id = send(&js, &names, stuck_id.timeout("1s")).await;
    let e = dead_letter_of(&js, &names, &stuck_id, WAIT).await;
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
