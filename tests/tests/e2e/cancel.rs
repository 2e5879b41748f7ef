//! Cancelling runs, end to end on a real nats-server with a real registry and workers: a held
//! run cancelled never runs after its breaker's release time; a queued run cancelled never
//! runs once a worker starts; a running HTTP run, embedded handler and shell program (sent
//! `SIGTERM`) are stopped mid-run and end `cancelled` with one attempt, neither retried nor
//! dead-lettered; an unknown execution is a structured refusal; runs cancelled while workers
//! pull them either never start or end cancelled; the CLI's `jetsched cancel`; and the
//! console's Cancel button in a browser.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use jetsched_shared::names::{CANCEL_ENDPOINT, CANCEL_TASK_ENDPOINT, Names};
use jetsched_shared::wire::{AttemptOutcome, EventKind, RunStatus};
use jetsched_tests::fixtures::{
    dead_letters, dispatch, events_about, noting, open_breaker, run_record, spec, wait_run_status,
};
use jetsched_tests::{Api, App, always, eventually};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cli::jetsched;
use crate::registry::{Served, served};
use crate::worker_support::{WAIT, config};

/// `runs.cancel` of `execution_id` in `namespace`; the reply (a refusal too) as JSON.
async fn cancel(api: &Api, namespace: &str, execution_id: &str, reason: &str) -> Value {
    let subject = api.names().runs_api_namespaced(CANCEL_ENDPOINT, namespace);
    api.call(subject, json!({"execution_id": execution_id, "reason": reason, "by": "tests"})).await
}

/// Messages stored in the dispatch stream now (queued, held or in flight).
async fn stored_dispatches(js: &async_nats::jetstream::Context) -> u64 {
    let mut stream = js.get_stream(Names::default().dispatch_stream()).await.expect("dispatch stream");
    stream.info().await.expect("dispatch stream info").state.messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_run_cancelled_never_runs_after_its_breakers_release_time() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let task =
        spec("cx", "held").handler("note").field("breaker", json!({"open_for": "1s", "on_open": "delay"}));
    api.store(&task.json()).await;
    open_breaker(&js, "task.cx.held", Duration::from_secs(6)).await;
    let (handlers, ran) =
        noting("note", |run: &RunContext| run.execution_id.clone(), |_| async { Outcome::ok() });
    let _worker = App::worker(config(&server, "cx-w"), handlers).await;

    let base = Utc::now().timestamp_millis();
    let execution = dispatch(&js, &names, &task.task(), base).await;
    let other = dispatch(&js, &names, &task.task(), base + 1).await;
    let held = wait_run_status(&js, &names, &execution, RunStatus::Held, WAIT).await;
    let release_at = held.release_at.expect("a held run has its release time");
    wait_run_status(&js, &names, &other, RunStatus::Held, WAIT).await;

    let reply = cancel(&api, "cx", &execution, "bad data upstream").await;
    assert_eq!(reply["outcome"], "cancelled", "{reply}");
    assert_eq!(reply["was"], "held", "{reply}");
    // The task's other held run, through the task-wide endpoint (the first is not listed again).
    let subject = api.names().runs_api_namespaced(CANCEL_TASK_ENDPOINT, "cx");
    let reply = api
        .call(subject, json!({"id": "held", "held": true, "reason": "bad data upstream", "by": "tests"}))
        .await;
    let runs = reply["runs"].as_array().expect("the runs cancelled");
    assert_eq!(runs.len(), 1, "{reply}");
    assert_eq!(
        (runs[0]["execution_id"].as_str(), runs[0]["was"].as_str()),
        (Some(other.as_str()), Some("held"))
    );
    let record = wait_run_status(&js, &names, &execution, RunStatus::Cancelled, WAIT).await;
    assert_eq!(record.reason.as_deref(), Some("cancelled by tests: bad data upstream"), "{record:?}");

    // Past the release time (the server hands the message back), the run still never runs.
    let until = (release_at - Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(3);
    always(until, "the cancelled held run never runs", || async { ran.lock().unwrap().is_empty() }).await;
    eventually(WAIT, "the released message is acked", || async { stored_dispatches(&js).await == 0 }).await;
    let record = run_record(&js, &names, &execution).await.expect("the record");
    assert_eq!(record.status, RunStatus::Cancelled, "{record:?}");
    assert!(record.attempts.is_empty(), "{record:?}");
    assert_eq!(run_record(&js, &names, &other).await.map(|r| r.status), Some(RunStatus::Cancelled));
    let told = events_about(&js, EventKind::RunCancelled, "cx", "held", WAIT).await;
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(told.iter().all(|e| e.reason.as_deref() == Some("cancelled by tests: bad data upstream")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_cancelled_never_runs_when_a_worker_starts() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let task = spec("cx", "queued").handler("note");
    api.store(&task.json()).await;
    let base = Utc::now().timestamp_millis();
    let cancelled = dispatch(&js, &names, &task.task(), base).await;
    let kept = dispatch(&js, &names, &task.task(), base + 1).await;

    let reply = cancel(&api, "cx", &cancelled, "not needed").await;
    assert_eq!(reply["outcome"], "cancelled", "{reply}");
    assert_eq!(reply["was"], "queued", "{reply}");
    assert_eq!(reply["task_id"], "queued", "{reply}");

    let (handlers, ran) =
        noting("note", |run: &RunContext| run.execution_id.clone(), |_| async { Outcome::ok() });
    let _worker = App::worker(config(&server, "cq-w"), handlers).await;
    wait_run_status(&js, &names, &kept, RunStatus::Succeeded, WAIT).await;
    eventually(WAIT, "both messages acked", || async { stored_dispatches(&js).await == 0 }).await;
    assert_eq!(*ran.lock().unwrap(), vec![kept.clone()], "only the run not cancelled ran");
    let record = run_record(&js, &names, &cancelled).await.expect("the record");
    assert_eq!(record.status, RunStatus::Cancelled, "{record:?}");
    assert!(record.attempts.is_empty(), "{record:?}");

    // Cancelling again, or cancelling the run that ran, answers what became of them.
    let again = cancel(&api, "cx", &cancelled, "").await;
    assert_eq!((again["outcome"].as_str(), again["status"].as_str()), (Some("finished"), Some("cancelled")));
    let done = cancel(&api, "cx", &kept, "").await;
    assert_eq!((done["outcome"].as_str(), done["status"].as_str()), (Some("finished"), Some("succeeded")));
}

/// An HTTP server on 127.0.0.1 that answers every request after `delay`; the requests seen.
async fn slow_http(delay: Duration) -> (std::net::SocketAddr, Arc<Mutex<u32>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Arc<Mutex<u32>> = Arc::default();
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            *count.lock().unwrap() += 1;
            tokio::spawn(async move {
                let mut chunk = [0u8; 4096];
                let _ = socket.read(&mut chunk).await;
                tokio::time::sleep(delay).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nlate")
                    .await;
            });
        }
    });
    (addr, seen)
}

/// Waits until a run ends `cancelled` with one attempt, cancelled; then checks for a while
/// that it is neither run again nor dead-lettered.
async fn ends_cancelled_once(js: &async_nats::jetstream::Context, execution: &str, ran: impl Fn() -> u32) {
    let names = Names::default();
    let record = wait_run_status(js, &names, execution, RunStatus::Cancelled, WAIT).await;
    assert_eq!(record.attempts.len(), 1, "{record:?}");
    assert_eq!(record.attempts[0].outcome, Some(AttemptOutcome::Cancelled), "{record:?}");
    assert!(record.reason.as_deref().is_some_and(|r| r.contains("stop it")), "{record:?}");
    // The pause is the point: nothing happens to a cancelled run afterwards.
    always(Duration::from_secs(3), "no second attempt", || async { ran() == 1 }).await;
    let record = run_record(js, &names, execution).await.expect("the record");
    assert_eq!((record.status, record.attempts.len()), (RunStatus::Cancelled, 1), "{record:?}");
    assert!(dead_letters(js, &names).await.iter().all(|entry| entry.execution_id != execution));
    assert_eq!(stored_dispatches(js).await, 0, "the message is acked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_http_run_is_cancelled_mid_run_and_ends_cancelled_once() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let (addr, seen) = slow_http(Duration::from_secs(60)).await;
    let executor = json!({"kind": "http", "method": "POST", "url": format!("http://{addr}/slow")});
    let task = spec("cx", "http").executor(executor).timeout("2m").fast_retry(3);
    api.store(&task.json()).await;
    let _worker = App::worker(config(&server, "ch-w"), Handlers::new()).await;
    let execution = dispatch(&js, &names, &task.task(), Utc::now().timestamp_millis()).await;
    eventually(WAIT, "the request reaches the server", || async { *seen.lock().unwrap() == 1 }).await;

    let reply = cancel(&api, "cx", &execution, "stop it").await;
    assert_eq!(reply["outcome"], "cancelling", "{reply}");
    ends_cancelled_once(&js, &execution, || *seen.lock().unwrap()).await;
    let told = events_about(&js, EventKind::RunCancelled, "cx", "http", WAIT).await;
    assert_eq!(told.len(), 1, "{told:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_embedded_handler_is_cancelled_mid_run_and_ends_cancelled_once() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let task = spec("cx", "handler").handler("slow").timeout("2m").fast_retry(3);
    api.store(&task.json()).await;
    let stopped: Arc<Mutex<bool>> = Arc::default();
    let saw = stopped.clone();
    let (handlers, ran) = noting(
        "slow",
        |run: &RunContext| run.execution_id.clone(),
        move |run: RunContext| {
            let saw = saw.clone();
            async move {
                tokio::select! {
                    () = run.cancel.cancelled() => {
                        *saw.lock().unwrap() = true;
                        Outcome::retry("stopped")
                    }
                    () = tokio::time::sleep(Duration::from_secs(60)) => Outcome::ok(),
                }
            }
        },
    );
    let _worker = App::worker(config(&server, "ce-w"), handlers).await;
    let execution = dispatch(&js, &names, &task.task(), Utc::now().timestamp_millis()).await;
    eventually(WAIT, "the handler runs", || async { ran.lock().unwrap().len() == 1 }).await;
    // Once the deferred record is written, the registry sees the run running.
    wait_run_status(&js, &names, &execution, RunStatus::Running, WAIT).await;

    let reply = cancel(&api, "cx", &execution, "stop it").await;
    assert_eq!((reply["outcome"].as_str(), reply["status"].as_str()), (Some("cancelling"), Some("running")));
    ends_cancelled_once(&js, &execution, || ran.lock().unwrap().len() as u32).await;
    assert!(*stopped.lock().unwrap(), "the handler saw its cancellation token fire");
}

#[tokio::test]
async fn cancelling_an_unknown_run_or_with_bad_input_is_a_structured_refusal() {
    let Served { server: _server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let unknown = cancel(&api, "cx", "0b6e3f9e-0000-4000-8000-000000000000", "").await;
    assert_eq!(unknown["error"]["code"], "not_found", "{unknown}");
    assert_eq!(unknown["error"]["field"], "execution_id", "{unknown}");
    // Every problem named at once; nothing written.
    let subject = api.names().runs_api_namespaced(CANCEL_ENDPOINT, "cx");
    let bad = api
        .call(subject, json!({"execution_id": "no spaces", "namespace": "other", "reason": "x".repeat(300)}))
        .await;
    let fields: Vec<&str> =
        bad["errors"].as_array().expect("every problem").iter().filter_map(|e| e["field"].as_str()).collect();
    assert_eq!(fields, ["execution_id", "namespace", "reason"], "{bad}");
    let cancels = js.get_key_value(Names::default().cancels_bucket()).await.expect("cancels bucket");
    let keys: Vec<_> = futures::StreamExt::collect::<Vec<_>>(cancels.keys().await.expect("keys")).await;
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_cancelled_while_workers_pull_them_either_never_start_or_end_cancelled() {
    const RUNS: i64 = 60;
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let task = spec("cx", "race").handler("work").timeout("1m");
    api.store(&task.json()).await;
    // Each run notes its start and, when it ran to its end, its success.
    let succeeded: Arc<Mutex<HashSet<String>>> = Arc::default();
    let done = succeeded.clone();
    let (handlers, started) = noting(
        "work",
        |run: &RunContext| run.execution_id.clone(),
        move |run: RunContext| {
            let done = done.clone();
            async move {
                tokio::select! {
                    () = run.cancel.cancelled() => Outcome::retry("stopped"),
                    () = tokio::time::sleep(Duration::from_millis(30)) => {
                        done.lock().unwrap().insert(run.execution_id.clone());
                        Outcome::ok()
                    }
                }
            }
        },
    );
    let mut worker_config = config(&server, "cr-1");
    worker_config.concurrency = 2;
    let _first = App::worker(worker_config, handlers.clone()).await;
    let mut worker_config = config(&server, "cr-2");
    worker_config.concurrency = 2;
    let _second = App::worker(worker_config, handlers).await;

    let base = Utc::now().timestamp_millis();
    let mut executions = Vec::new();
    for n in 0..RUNS {
        executions.push(dispatch(&js, &names, &task.task(), base + n).await);
    }
    // Every run cancelled while the workers pull them.
    let cancels = executions
        .iter()
        .map(|execution| async { (execution.clone(), cancel(&api, "cx", execution, "race").await) });
    let replies: HashMap<String, Value> = futures::future::join_all(cancels).await.into_iter().collect();
    for (execution, reply) in &replies {
        assert!(reply.get("outcome").is_some(), "{execution}: {reply}");
    }
    eventually(WAIT, "every message acked", || async { stored_dispatches(&js).await == 0 }).await;
    let started: HashSet<String> = started.lock().unwrap().iter().cloned().collect();
    let succeeded = succeeded.lock().unwrap().clone();
    let mut cancelled = 0;
    for execution in &executions {
        let record = eventually(WAIT, "a final record", || async {
            run_record(&js, &names, execution).await.filter(|record| record.status.is_final())
        })
        .await;
        let reply = &replies[execution];
        match record.status {
            RunStatus::Cancelled => {
                cancelled += 1;
                assert!(
                    !succeeded.contains(execution),
                    "{execution} ran to success yet is cancelled: {record:?}"
                );
                let closed = record.attempts.iter().map(|a| a.outcome).collect::<Vec<_>>();
                assert!(
                    closed.iter().all(|outcome| *outcome == Some(AttemptOutcome::Cancelled)),
                    "{execution}: an attempt of a cancelled run ended otherwise: {record:?}"
                );
            }
            _ if reply["outcome"] == "cancelled" => {
                panic!("{execution} answered cancelled, yet ended {record:?}")
            }
            RunStatus::Succeeded => {
                assert!(started.contains(execution) && succeeded.contains(execution), "{record:?}");
                // The cancel came after its end, or as it ended (`cancelling`): never `cancelled`.
                assert_ne!(
                    reply["outcome"], "cancelled",
                    "{execution} succeeded, yet the cancel said {reply}"
                );
            }
            other => panic!("{execution} ended {other:?}: {record:?}"),
        }
    }
    let outcomes = replies.values().filter_map(|reply| reply["outcome"].as_str()).fold(
        HashMap::<&str, usize>::new(),
        |mut counts, outcome| {
            *counts.entry(outcome).or_default() += 1;
            counts
        },
    );
    eprintln!(
        "{RUNS} runs: {cancelled} ended cancelled, {} started by a handler, {} ran to success; replies {outcomes:?}",
        started.len(),
        succeeded.len()
    );
    assert!(cancelled > 0, "no run was cancelled");
}

#[tokio::test]
async fn the_cli_cancels_a_run_and_a_tasks_queued_runs_and_exits_non_zero_on_refusal() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let task = spec("cx", "cli").handler("note");
    api.store(&task.json()).await;
    let base = Utc::now().timestamp_millis();
    let one = dispatch(&js, &names, &task.task(), base).await;
    let two = dispatch(&js, &names, &task.task(), base + 1).await;
    let three = dispatch(&js, &names, &task.task(), base + 2).await;
    let url = server.url();

    let out = jetsched(&url, &["cancel", &format!("cx/{one}"), "--reason", "wrong day", "--by", "ops"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("run {one} of cx/cli cancelled (queued)")), "{text}");
    let record = wait_run_status(&js, &names, &one, RunStatus::Cancelled, WAIT).await;
    assert_eq!(record.reason.as_deref(), Some("cancelled by ops: wrong day"));

    let out = jetsched(&url, &["cancel", "--task", "cx/cli", "--queued"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("cx/cli: 2 runs cancelled"), "{text}");
    for execution in [&two, &three] {
        assert!(text.contains(execution.as_str()), "{text}");
        wait_run_status(&js, &names, execution, RunStatus::Cancelled, WAIT).await;
    }
    // Refusals: an unknown run, and a run that had ended (exit 1, said on stderr).
    let out = jetsched(&url, &["cancel", "cx/0b6e3f9e-0000-4000-8000-000000000000"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no run"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = jetsched(&url, &["cancel", &format!("cx/{one}")]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("had ended already (cancelled)"));
    // The task-wide endpoint answers through the API too (nothing left to cancel).
    let subject = api.names().runs_api_namespaced(CANCEL_TASK_ENDPOINT, "cx");
    let reply = api.call(subject, json!({"id": "cli"})).await;
    assert_eq!(reply["runs"].as_array().map(Vec::len), Some(0), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consoles_cancel_button_cancels_a_held_run_from_its_run_page() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let task =
        spec("cx", "page").handler("note").field("breaker", json!({"open_for": "1s", "on_open": "delay"}));
    api.store(&task.json()).await;
    // The browser starts before the hold does: a slow start on a loaded machine must not use
    // up the time the run is held, or the run is released and runs before the click. The
    // breaker is written before the worker starts, so the worker loads it.
    let browser = crate::console::browser::Browser::start().await;
    let page = &browser.client;
    open_breaker(&js, "task.cx.page", Duration::from_secs(8)).await;
    let (handlers, ran) =
        noting("note", |run: &RunContext| run.execution_id.clone(), |_| async { Outcome::ok() });
    let _worker = App::worker(config(&server, "cp-w"), handlers).await;
    let (_console, addr) = crate::console::console(&server, None, true).await;
    let execution = dispatch(&js, &names, &task.task(), Utc::now().timestamp_millis()).await;
    let held = wait_run_status(&js, &names, &execution, RunStatus::Held, WAIT).await;

    page.goto(&format!("http://{addr}/runs/{execution}")).await.expect("open the run page");
    assert!(browser.text("dd .badge").await.contains("held"), "{}", browser.text("main").await);
    browser.click("#run-actions input[name='confirm']").await;
    browser.click("#run-actions button").await;
    browser
        .refresh_until(WAIT, "the run page says cancelled", "dd .badge", |text| text.contains("cancelled"))
        .await;
    assert_eq!(browser.text("#run-reason").await, "cancelled by console");
    assert!(browser.text("#run-actions").await.is_empty(), "no Cancel button on a cancelled run");
    browser.close().await;

    // Past the release time the run still never runs.
    let until = (held.release_at.expect("release time") - Utc::now()).to_std().unwrap_or_default()
        + Duration::from_secs(2);
    always(until, "the cancelled held run never runs", || async { ran.lock().unwrap().is_empty() }).await;
    let record = run_record(&js, &names, &execution).await.expect("the record");
    assert_eq!(record.status, RunStatus::Cancelled, "{record:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_shell_program_is_sent_term_when_its_run_is_cancelled() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let names = Names::default();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (started, termed) = (dir.path().join("started"), dir.path().join("termed"));
    let script = format!(
        "trap 'echo term > {}; exit 3' TERM; echo up > {}; sleep 60 & wait",
        termed.display(),
        started.display()
    );
    let executor = json!({"kind": "shell", "command": ["sh", "-c", script]});
    let task = spec("cx", "shell").executor(executor).timeout("2m").fast_retry(3);
    api.store(&task.json()).await;
    let mut worker_config = config(&server, "cs-w");
    worker_config.shell_allow = vec!["sh".into()];
    let _worker = App::worker(worker_config, Handlers::new()).await;
    let execution = dispatch(&js, &names, &task.task(), Utc::now().timestamp_millis()).await;
    eventually(WAIT, "the program runs", || async { started.exists() }).await;

    let asked = std::time::Instant::now();
    let reply = cancel(&api, "cx", &execution, "stop it").await;
    assert_eq!(reply["outcome"], "cancelling", "{reply}");
    ends_cancelled_once(&js, &execution, || 1).await;
    let termed_text = std::fs::read_to_string(&termed).unwrap_or_default();
    assert_eq!(termed_text.trim(), "term", "the program got SIGTERM before any SIGKILL");
    // Ended by its TERM trap, not by the KILL after the 5 s grace (3 s of the wait are the
    // check that nothing follows).
    assert!(asked.elapsed() < Duration::from_secs(8), "{:?}", asked.elapsed());
}
