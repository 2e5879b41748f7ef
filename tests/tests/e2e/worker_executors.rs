//! End-to-end tests of the worker's executors against a real nats-server: HTTP status classes
//! and timeouts, the NATS request/reply contract, and the shell executor (off by default,
//! argv without a shell, a clean environment, the process group killed on timeout); and their
//! confinement: internal HTTP destinations refused (literals, names, redirects), reserved NATS
//! subjects refused even from specs that bypassed the registry, a namespace's NATS requests
//! sent as its own NATS user, shell programs allowed per namespace.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::names::{Names, task_key};
use jetsched_shared::wire::{
    HDR_ATTEMPT, HDR_EXECUTION_ID, HDR_NOMINAL_TIME, HDR_STATUS, HDR_TASK, scheduled_execution_id,
};
use jetsched_tests::fixtures::{SpecBuilder, dead_letter_of, dispatch, wait_run_status};
use jetsched_tests::{App, NatsServer, eventually, init_test_logging, spec};
use jetsched_worker::Handlers;
use jetsched_worker::runs::RunStatus;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::worker_support::{WAIT, config};

/// A tiny HTTP/1.1 server on 127.0.0.1: the path picks the answer.
async fn http_server() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    http_server_on("127.0.0.1", None).await
}

/// [`http_server`] on `ip`; with `target`, `/to-literal` and `/to-name` answer 302 to its
/// `/ok` as `http://<target ip>:<port>/ok` and `http://localhost:<port>/ok`.
async fn http_server_on(
    ip: &str,
    target: Option<std::net::SocketAddr>,
) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
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
                let location = match (path.as_str(), target) {
                    ("/to-literal", Some(target)) => format!("Location: http://{target}/ok\r\n"),
                    ("/to-name", Some(target)) => {
                        format!("Location: http://localhost:{}/ok\r\n", target.port())
                    }
                    _ => String::new(),
                };
                let (status, body) = match path.as_str() {
                    _ if !location.is_empty() => ("302 Found", String::new()),
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
                    "HTTP/1.1 {status}\r\n{location}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
    let server = NatsServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut closed = config(&server, "w-closed");
    closed.queues = vec!["closed".into()];
    let closed = App::worker(closed, Handlers::new()).await;
    let mut open = config(&server, "w-open");
    open.queues = vec!["open".into()];
    open.shell_allow = vec!["sh".into(), "echo".into(), "wk-dates=date".into()];
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

    // `wk-dates=date`: that namespace's tasks only.
    let date = json!({"kind": "shell", "command": ["date"]});
    let theirs = spec("wk-dates", "s-date").queue("open").executor(date.clone()).fast_retry(3);
    let theirs = send(&js, &names, theirs.timeout("2s")).await;
    wait_run_status(&js, &names, &theirs, RunStatus::Succeeded, WAIT).await;
    let other = spec("wk", "s-date").queue("open").executor(date).fast_retry(3).timeout("2s");
    let other = send(&js, &names, other).await;
    let e = dead_letter_of(&js, &names, &other, WAIT).await;
    assert_eq!(e.attempts.len(), 1, "a program not allowed to the namespace is a permanent failure");
    assert!(
        e.reason.contains("\"date\" is not on this worker's --shell-allow list for namespace \"wk\""),
        "{}",
        e.reason
    );

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

/// Without an allow-list entry for them, loopback destinations are refused whatever way the
/// task reaches them (a literal, a name, a redirect from an allowed host), before any request
/// is sent: the target listener hears nothing.
#[tokio::test]
async fn worker_http_executor_refuses_internal_destinations_after_resolution_and_redirects() {
    let server = NatsServer::start().await;
    let (target, target_requests) = http_server().await;
    // 127.0.0.2 is loopback too, and the only network the worker may reach.
    let (allowed, allowed_requests) = http_server_on("127.0.0.2", Some(target)).await;
    let mut confined = config(&server, "w-confined");
    confined.http_allow = vec!["*=127.0.0.2/32".into()];
    let worker = App::worker(confined, Handlers::new()).await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let get = |url: String| json!({"kind": "http", "method": "GET", "url": url});
    let port = target.port();

    let reachable =
        send(&js, &names, spec("wk", "h-allowed").executor(get(format!("http://{allowed}/ok")))).await;
    let r = wait_run_status(&js, &names, &reachable, RunStatus::Succeeded, WAIT).await;
    assert!(r.attempts[0].detail.as_deref().unwrap_or_default().contains("HTTP 200"), "{r:?}");

    let cases = [
        ("h-literal", format!("http://127.0.0.1:{port}/ok"), "127.0.0.1 is an internal address (loopback"),
        (
            "h-mapped",
            format!("http://[::ffff:127.0.0.1]:{port}/ok"),
            "::ffff:127.0.0.1 is an internal address",
        ),
        ("h-name", format!("http://localhost:{port}/ok"), "localhost resolves only to internal addresses"),
        ("h-redirect", format!("http://{allowed}/to-literal"), "127.0.0.1 is an internal address (loopback"),
        (
            "h-redirect-name",
            format!("http://{allowed}/to-name"),
            "localhost resolves only to internal addresses",
        ),
    ];
    let mut runs = Vec::new();
    for (id, url, _) in &cases {
        runs.push(
            send(&js, &names, spec("wk", id).executor(get(url.clone())).fast_retry(3).timeout("2s")).await,
        );
    }
    for ((id, url, why), execution) in cases.iter().zip(&runs) {
        let e = dead_letter_of(&js, &names, execution, WAIT).await;
        assert_eq!(e.attempts.len(), 1, "{id}: a refused destination is a permanent failure: {e:?}");
        let prefix = format!("executor.url {url:?} refused: ");
        assert!(e.reason.contains(&prefix) && e.reason.contains(why), "{id}: {}", e.reason);
        assert!(e.reason.contains("--http-allow"), "{id}: says how to allow it: {}", e.reason);
    }
    let heard = target_requests.lock().unwrap().clone();
    assert!(heard.is_empty(), "the loopback target received no request: {heard:?}");
    let redirected = allowed_requests.lock().unwrap().iter().filter(|h| h.starts_with("GET /to-")).count();
    assert_eq!(redirected, 2, "the redirects were asked for, and not followed");
    worker.stop().await;
}

/// A subscriber on `subject`, flushed so that it hears what is published from now on.
async fn listen(client: &async_nats::Client, subject: &str) -> async_nats::Subscriber {
    let subscriber = client.subscribe(subject.to_string()).await.expect("subscribe");
    client.flush().await.expect("flush");
    subscriber
}

/// Specs written straight into the tasks bucket (as a spec stored before the rule would be, or
/// by someone bypassing the registry) with subjects of the server's, the replies' and
/// jetsched's own spaces: the scheduler fires them, the worker refuses them before sending,
/// and the runs are dead-lettered naming `executor.subject`.
#[tokio::test]
async fn worker_nats_executor_refuses_reserved_subjects_of_specs_that_bypassed_the_registry() {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let scheduler = App::scheduler(jetsched_scheduler::Config::for_tests(&server.url())).await;
    let worker = App::worker(config(&server, "w-subjects"), Handlers::new()).await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let tasks = js.get_key_value(names.tasks_bucket()).await.expect("tasks bucket");
    let subjects = [
        "$JS.API.STREAM.INFO.KV_JETSCHED_RUNS",
        "$KV.JETSCHED_TASKS.x.y",
        "jetsched.control.pause.x",
        "_INBOX.x",
    ];
    let mut listeners = Vec::new();
    for subject in subjects {
        listeners.push(listen(&client, subject).await);
    }
    // A whole second a little ahead: every task's one fire.
    let at_ms = (chrono::Utc::now().timestamp() + 3) * 1000;
    let at = chrono::DateTime::from_timestamp_millis(at_ms).expect("time").to_rfc3339();
    let mut executions = Vec::new();
    for (n, subject) in subjects.iter().enumerate() {
        let id = format!("reserved-{n}");
        let spec = spec("wk", &id).nats(subject).schedule(json!({"at": at})).fast_retry(3).timeout("2s");
        tasks.put(task_key("wk", &id), spec.bytes().into()).await.expect("put the spec");
        executions.push(scheduled_execution_id("wk", &id, at_ms));
    }
    for (subject, execution) in subjects.iter().zip(&executions) {
        let e = dead_letter_of(&js, &names, execution, WAIT).await;
        assert_eq!(e.attempts.len(), 1, "{subject}: refused for good: {e:?}");
        assert!(
            e.reason.contains("nothing was sent")
                && e.reason.contains("at executor.subject")
                && e.reason.contains(&format!("{subject:?} is refused")),
            "{subject}: {}",
            e.reason
        );
    }
    for (subject, listener) in subjects.iter().zip(listeners.iter_mut()) {
        let heard = tokio::time::timeout(Duration::from_millis(300), listener.next()).await;
        assert!(heard.is_err(), "nothing was published on {subject}: {heard:?}");
    }
    worker.stop().await;
    scheduler.stop().await;
}

/// A server with two accounts: `JETSCHED` (JetStream, the services, `svc` by default) and
/// `TEAM` (user `team`), which share nothing.
async fn server_with_a_team_account() -> NatsServer {
    let accounts = r#"
accounts {
  JETSCHED {
    jetstream: enabled
    users: [{user: svc, password: svc}]
  }
  TEAM {
    users: [{user: team, password: team-local-only}]
  }
}
no_auth_user: svc
"#;
    NatsServer::start_with(jetsched_tests::ServerOpts::default().extra_config(accounts)).await
}

/// A namespace given `--executor-credentials` sends its requests as its own NATS user: its
/// handler, in the team's account, is reachable through that connection only. With
/// `--executor-credentials-required`, a namespace without credentials is refused.
#[tokio::test]
async fn worker_nats_executor_sends_a_namespaces_requests_with_its_own_credentials() {
    init_test_logging();
    let server = server_with_a_team_account().await;
    let client = server.client().await;
    let team = async_nats::ConnectOptions::with_user_and_password("team".into(), "team-local-only".into())
        .connect(server.url())
        .await
        .expect("connect as the team");
    let mut requests = team.subscribe("team.handler").await.expect("subscribe");
    team.flush().await.expect("flush");
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let log = seen.clone();
    let responder = team.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let Some(reply) = request.reply.clone() else { continue };
            let task = request.headers.as_ref().and_then(|h| h.get(HDR_TASK)).map(|v| v.to_string());
            log.lock().unwrap().push((task.unwrap_or_default(), reply.to_string()));
            let _ = responder.publish(reply, "answered in the team account".into()).await;
        }
    });
    // From the services' account, the team's handler does not exist.
    let error = client.request("team.handler", "".into()).await.expect_err("no responders");
    assert_eq!(error.kind(), async_nats::client::RequestErrorKind::NoResponders, "{error}");

    let dir = tempfile::tempdir().expect("temp dir");
    let credentials = dir.path().join("team.credentials");
    std::fs::write(&credentials, "team:team-local-only\n").expect("write credentials");
    let mut with_credentials = config(&server, "w-team");
    with_credentials.executor_credentials = vec![format!("team={}", credentials.display())];
    with_credentials.executor_credentials_required = true;
    let worker = App::worker(with_credentials, Handlers::new()).await;
    let js = jetstream::new(client.clone());
    let names = Names::default();

    let ours = spec("team", "n-team").nats("team.handler").fast_retry(2).timeout("2s");
    let ours = send(&js, &names, ours).await;
    let r = wait_run_status(&js, &names, &ours, RunStatus::Succeeded, WAIT).await;
    assert_eq!(r.attempts[0].detail.as_deref(), Some("answered in the team account"));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, "team.n-team");
    assert!(seen[0].1.starts_with("_INBOX.team."), "replies under the namespace's inbox: {seen:?}");

    let other = spec("other", "n-other").nats("team.handler").fast_retry(2).timeout("2s");
    let other = send(&js, &names, other).await;
    let e = dead_letter_of(&js, &names, &other, WAIT).await;
    assert_eq!(e.attempts.len(), 1, "refused for good: {e:?}");
    assert!(
        e.reason.contains("namespace \"other\" has no NATS credentials")
            && e.reason.contains("--executor-credentials-required"),
        "{}",
        e.reason
    );
    worker.stop().await;
}
