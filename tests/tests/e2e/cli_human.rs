//! End-to-end tests of the `jetsched` CLI's output for people against a real nats-server and
//! real services: readable text by default (`get`, `events`, `dlq show`), `rm` that asks, the
//! `ls` columns and filters, a fired one-shot shown `completed` (CLI and console), and `runs`
//! within 100 columns with each run's whole duration.

use std::process::Output;

use jetsched_tests::fixtures::{dead_letter_entry, store_dead_letter};
use jetsched_tests::{App, eventually, spec};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::{Value, json};

use crate::cli::jetsched;
use crate::console::browser::http_request;
use crate::registry::{Served, served};
use crate::worker_support::{WAIT, config};

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The command's standard output, after checking it succeeded.
async fn text(url: &str, args: &[&str]) -> String {
    let output = jetsched(url, args).await;
    assert!(output.status.success(), "jetsched {}: {}", args.join(" "), stderr(&output));
    stdout(&output)
}

/// `get`, `events` and `dlq show` print readable text; `--json` prints the JSON.
#[tokio::test]
async fn get_events_and_dlq_show_print_readable_text_and_json_on_request() {
    let Served { server, registry: _registry, api, js, .. } = served(|_| {}).await;
    let url = server.url();
    let nightly = spec("human", "nightly")
        .cron_in("0 30 2 * * *", "Asia/Shanghai")
        .labels(&[("team", "billing")])
        .field("priority", "high");
    api.store(&nightly.json()).await;

    let got = text(&url, &["get", "human/nightly"]).await;
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["task:", "human/nightly"], "{got}");
    for line in [
        "state:",
        "schedule:",
        "cron 0 30 2 * * * in Asia/Shanghai",
        "nats request to jobs.test",
        "priority:",
        "high",
        "team=billing",
    ] {
        assert!(got.contains(line), "{line} in:\n{got}");
    }
    // Aligned: every value starts in the same column.
    let column = |line: &str| {
        line.find(':').map(|colon| colon + line[colon + 1..].len() - line[colon + 1..].trim_start().len())
    };
    let columns: std::collections::BTreeSet<Option<usize>> = lines.iter().copied().map(column).collect();
    assert_eq!(columns.len(), 1, "values aligned:\n{got}");
    assert!(serde_json::from_str::<Value>(&got).is_err(), "not JSON:\n{got}");
    let json: Value =
        serde_json::from_str(&text(&url, &["get", "human/nightly", "--json"]).await).expect("JSON");
    assert_eq!(json["task"]["schedule"]["timezone"], "Asia/Shanghai");
    assert_eq!(json["status"]["state"], "active", "{json}");

    let events = text(&url, &["events", "--task", "human/nightly", "--last", "5"]).await;
    let registered =
        events.lines().find(|l| l.contains("task.registered")).unwrap_or_else(|| panic!("{events}"));
    assert!(registered.contains("human/nightly") && registered.contains("revision"), "{registered}");
    assert!(serde_json::from_str::<Value>(registered).is_err(), "a line of text: {registered}");
    let json_lines = text(&url, &["events", "--task", "human/nightly", "--last", "5", "--json"]).await;
    let first: Value = serde_json::from_str(json_lines.lines().next().expect("an event")).expect("JSON");
    assert_eq!(first["kind"], "task.registered");

    let entry = dead_letter_entry(&nightly.json(), "exec-dead-1");
    let subject = jetsched_shared::names::Names::default().dlq_subject("default", "human", "nightly");
    let sequence = store_dead_letter(&js, subject, &entry).await.expect("a dead letter stored");
    let shown = text(&url, &["dlq", "show", &sequence.to_string()]).await;
    for part in ["task:", "human/nightly", "execution:", "exec-dead-1", "reason:", "ATTEMPT", "OUTCOME"] {
        assert!(shown.contains(part), "{part} in:\n{shown}");
    }
    assert!(shown.contains("cron 0 30 2 * * * in Asia/Shanghai"), "the spec in words:\n{shown}");
    let json: Value =
        serde_json::from_str(&text(&url, &["dlq", "show", &sequence.to_string(), "--json"]).await)
            .expect("JSON");
    assert_eq!(json["entry"]["execution_id"], "exec-dead-1");
}

/// Without a terminal, `rm` deletes nothing and says to pass `--yes` (exit 2); with `--yes` it
/// deletes.
#[tokio::test]
async fn rm_without_a_terminal_refuses_unless_yes_is_given() {
    let Served { server, registry: _registry, api, .. } = served(|_| {}).await;
    let url = server.url();
    api.store(&spec("human", "doomed").json()).await;
    // The test's standard input is no terminal (`output()` gives the child none).
    let refused = jetsched(&url, &["rm", "human/doomed"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("--yes"), "{}", stderr(&refused));
    assert!(api.on("get", "human", "doomed").await.get("task").is_some(), "still stored");
    let removed = jetsched(&url, &["rm", "human/doomed", "--yes"]).await;
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert_eq!(api.on("get", "human", "doomed").await["error"]["code"], "not_found");
}

/// `ls` shows each task's columns and filters by state, queue and priority, combined with each
/// other and with the namespace and label filters.
#[tokio::test]
async fn ls_shows_status_columns_and_filters_by_state_queue_and_priority() {
    let Served { server, registry: _registry, api, .. } = served(|_| {}).await;
    let url = server.url();
    for task in [
        spec("lsf", "a").queue("reports").field("priority", "high").labels(&[("team", "x")]),
        spec("lsf", "b").queue("reports").paused(true).labels(&[("team", "x")]),
        spec("lsf", "c").field("priority", "high").field("breaker", json!({"key": "payments-api"})),
        spec("other", "d").queue("reports").field("priority", "high"),
    ] {
        api.store(&task.json()).await;
    }
    let table = text(&url, &["ls", "-n", "lsf"]).await;
    let header = table.lines().next().expect("a header");
    for column in [
        "TASK",
        "SCHEDULE",
        "STATE",
        "NEXT FIRE",
        "LAST FIRE",
        "LAST OUTCOME",
        "OK (LAST 10)",
        "PRIORITY",
        "BREAKER",
    ] {
        assert!(header.contains(column), "{column} in {header}");
    }
    let row = |name: &str| {
        table.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}:\n{table}"))
    };
    assert!(row("lsf/c").contains("payments-api") && row("lsf/c").contains("high"), "{table}");
    assert!(row("lsf/b").contains("paused"), "{table}");

    let tasks = |args: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let mut full = args.to_vec();
            full.push("--json");
            let listed: Value = serde_json::from_str(&text(&url, &full).await).expect("JSON");
            let mut names: Vec<String> = listed
                .as_array()
                .expect("a list")
                .iter()
                .map(|t| {
                    format!(
                        "{}/{}",
                        t["task"]["namespace"].as_str().unwrap(),
                        t["task"]["id"].as_str().unwrap()
                    )
                })
                .collect();
            names.sort();
            names
        }
    };
    assert_eq!(tasks(&["ls", "--state", "paused"]).await, ["lsf/b"]);
    assert_eq!(tasks(&["ls", "-n", "lsf", "--state", "active"]).await, ["lsf/a", "lsf/c"]);
    assert_eq!(tasks(&["ls", "--queue", "reports"]).await, ["lsf/a", "lsf/b", "other/d"]);
    assert_eq!(tasks(&["ls", "--queue", "reports", "--priority", "high"]).await, ["lsf/a", "other/d"]);
    assert_eq!(tasks(&["ls", "-n", "lsf", "--queue", "reports", "--priority", "high"]).await, ["lsf/a"]);
    assert_eq!(tasks(&["ls", "-l", "team=x", "--state", "active"]).await, ["lsf/a"]);
    assert_eq!(tasks(&["ls", "--state", "completed"]).await, Vec::<String>::new());
    let bad = jetsched(&url, &["ls", "--state", "sleeping"]).await;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

/// A one-shot 2 s ahead is `active`; once the real scheduler has fired it, `ls`, `get` and the
/// console say `completed`, and its run's outcome and the success rate show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fired_one_shot_is_completed_in_the_cli_and_the_console() {
    let Served { server, registry: _registry, api, .. } = served(|_| {}).await;
    let url = server.url();
    let _scheduler = App::scheduler(jetsched_scheduler::Config::for_tests(&url)).await;
    let handlers = Handlers::new().register("ok", |_run: RunContext| async { Outcome::ok() });
    let _worker = App::worker(config(&server, "once-w"), handlers).await;
    let (_console, addr) = crate::console::console(&server, None, false).await;
    let at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let once = spec("human", "once")
        .handler("ok")
        .schedule(json!({"at": at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)}));
    api.store(&once.json()).await;

    let row = |table: String| table.lines().find(|l| l.starts_with("human/once")).map(str::to_string);
    let before = row(text(&url, &["ls", "-n", "human"]).await).expect("listed");
    assert!(before.contains("active"), "{before}");
    let page = http_request(addr, "GET", "/tasks/human/once", &[], "").await;
    assert!(page.body.contains(r#"id="task-state" class="badge active">active<"#), "{}", page.body);

    let after = eventually(WAIT, "the one-shot listed completed with its run succeeded", || async {
        let line = row(text(&url, &["ls", "-n", "human"]).await)?;
        (line.contains("completed") && line.contains("succeeded")).then_some(line)
    })
    .await;
    assert!(after.contains("100% of 1"), "{after}");
    let got = text(&url, &["get", "human/once"]).await;
    assert!(got.lines().any(|l| l.starts_with("state:") && l.ends_with("completed")), "{got}");
    let completed = text(&url, &["ls", "--state", "completed", "--json"]).await;
    assert!(completed.contains("\"once\""), "{completed}");
    let page = http_request(addr, "GET", "/tasks/human/once", &[], "").await;
    assert!(page.body.contains(r#"id="task-state" class="badge completed">completed<"#), "{}", page.body);
    let list = http_request(addr, "GET", "/tasks?namespace=human", &[], "").await;
    assert!(list.body.contains(r#"<span class="badge completed">completed</span>"#), "{}", list.body);
}

/// With long names and a run that took three attempts, no line of `runs` is wider than 100
/// characters, and the duration shown is the whole run's (from the first attempt's start),
/// not the last attempt's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_fit_100_columns_and_show_the_whole_runs_duration() {
    let Served { server, registry: _registry, api, .. } = served(|_| {}).await;
    let url = server.url();
    let handlers = Handlers::new().register("flaky", |run: RunContext| async move {
        if run.attempt <= 2 {
            Outcome::retry(format!(
                "attempt {} met an upstream that answered 503 Service Unavailable",
                run.attempt
            ))
        } else {
            Outcome::ok()
        }
    });
    let worker = "worker-with-a-rather-long-instance-name-7d9f8b6c4-x2x9z";
    let _worker = App::worker(config(&server, worker), handlers).await;
    let namespace = "payments-reconciliation-eu-west";
    let id = "nightly-settlement-report-for-every-merchant-account-in-the-region";
    let task = format!("{namespace}/{id}");
    let retry = json!({"max_attempts": 5, "initial": "700ms", "multiplier": 1.0, "max_interval": "1s", "jitter": 0.0});
    api.store(&spec(namespace, id).handler("flaky").retry(retry).json()).await;
    for _ in 0..3 {
        assert!(jetsched(&url, &["trigger", &task]).await.status.success());
    }

    let runs = eventually(WAIT, "three runs succeeded", || async {
        let listed: Value = serde_json::from_str(&text(&url, &["runs", &task, "--json"]).await).ok()?;
        let runs = listed.as_array()?.clone();
        (runs.len() == 3 && runs.iter().all(|r| r["outcome"] == "succeeded")).then_some(runs)
    })
    .await;
    for run in &runs {
        let whole = run["duration_ms"].as_u64().unwrap_or_else(|| panic!("a duration: {run}"));
        let last = run["last_attempt_ms"].as_u64().unwrap_or_else(|| panic!("the last attempt's: {run}"));
        // Two waits of 700 ms between the three attempts.
        assert!(whole >= 1_400 && whole > last, "whole run {whole} ms, last attempt {last} ms: {run}");
    }
    let table = text(&url, &["runs", &task]).await;
    for line in table.lines() {
        assert!(line.chars().count() <= 100, "{} characters: {line}\n{table}", line.chars().count());
    }
    let first = runs[0]["execution_id"].as_str().expect("an id");
    assert!(table.contains(&first[..8]) && !table.contains(first), "short ids:\n{table}");
    assert!(table.lines().skip(1).all(|l| l.contains("succeeded")), "{table}");
    let wide = text(&url, &["runs", &task, "--wide"]).await;
    assert!(wide.contains(first) && wide.contains(worker), "{wide}");
}
