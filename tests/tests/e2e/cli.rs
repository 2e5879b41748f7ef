//! End-to-end tests of the `jetsched` CLI binary against a real registry and nats-server:
//! every subcommand, `--json` output parsed, error output and exit codes.

use std::process::Output;

use jetsched_tests::{App, NatsServer, workspace_bin};
use serde_json::{Value, json};

use crate::registry::{Served, config, served};

/// Runs the `jetsched` binary against the server at `url`.
pub(crate) async fn jetsched(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(workspace_bin("jetsched"))
        .arg("--nats-url")
        .arg(url)
        .args(args)
        .output()
        .await
        .expect("run jetsched")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub(crate) fn json_out(output: &Output) -> Value {
    assert!(output.status.success(), "exit {:?}: {}", output.status, stderr(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("JSON output ({e}): {}", stdout(output)))
}

#[tokio::test]
async fn every_subcommand_against_a_running_registry() {
    let Served { server, registry, .. } = served(|_| {}).await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();

    let specs = json!([
        {"id": "nightly", "namespace": "billing", "schedule": {"cron": "0 30 2 * * *", "timezone": "America/New_York"},
         "executor": {"kind": "nats", "subject": "jobs.nightly"}, "labels": {"team": "billing"}},
        {"id": "pulse", "namespace": "billing", "schedule": {"every": "1m"},
         "executor": {"kind": "nats", "subject": "jobs.pulse"}, "labels": {"team": "ops"}}
    ]);
    let file = dir.path().join("specs.json");
    std::fs::write(&file, specs.to_string()).unwrap();
    let applied = jetsched(&url, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(stdout(&applied).contains("billing/nightly applied"), "{}", stdout(&applied));
    assert!(stdout(&applied).contains("billing/pulse applied"), "{}", stdout(&applied));

    // A directory works too, and re-applying is idempotent.
    let again = jetsched(&url, &["apply", "-f", dir.path().to_str().unwrap()]).await;
    assert!(again.status.success(), "{}", stderr(&again));

    let listed = json_out(&jetsched(&url, &["ls", "--namespace", "billing", "--json"]).await);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    let ops = json_out(&jetsched(&url, &["ls", "--label", "team=ops", "--json"]).await);
    assert_eq!(ops[0]["task"]["id"], "pulse");
    let table = jetsched(&url, &["ls"]).await;
    assert!(stdout(&table).starts_with("TASK"), "{}", stdout(&table));
    assert!(stdout(&table).contains("cron 0 30 2 * * * in America/New_York"), "{}", stdout(&table));

    let got = json_out(&jetsched(&url, &["get", "billing/nightly", "--json"]).await);
    assert_eq!(got["task"]["schedule"]["timezone"], "America/New_York");

    // Next fires across the spring-forward day: 02:30 does not exist on 2026-03-08.
    let next = json_out(
        &jetsched(&url, &["next", "billing/nightly", "-c", "3", "--after", "2026-03-07T00:00:00Z", "--json"])
            .await,
    );
    assert_eq!(
        next["times"],
        json!(["2026-03-07T07:30:00.000Z", "2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z"]),
        "{next}"
    );
    let table = stdout(
        &jetsched(&url, &["next", "billing/nightly", "-c", "3", "--after", "2026-03-07T00:00:00Z"]).await,
    );
    assert!(table.contains("offset change -05:00 -> -04:00"), "{table}");

    let paused = jetsched(&url, &["pause", "billing/pulse", "--reason", "card processor maintenance"]).await;
    assert!(stdout(&paused).contains("billing/pulse paused"), "{}", stderr(&paused));
    let state = json_out(&jetsched(&url, &["get", "billing/pulse", "--json"]).await);
    assert_eq!(state["task"]["paused"], true);
    assert_eq!(state["task"]["paused_reason"], "card processor maintenance");
    let table = stdout(&jetsched(&url, &["ls", "--namespace", "billing"]).await);
    assert!(table.contains("paused: card processor maintenance"), "{table}");
    let resumed = jetsched(&url, &["resume", "billing/pulse"]).await;
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let state = json_out(&jetsched(&url, &["get", "billing/pulse", "--json"]).await);
    assert!(state["task"].get("paused_reason").is_none(), "resume clears the reason: {state}");

    // Breakers: the task's own breaker is listed (no record yet: closed), shown and reset.
    let breaker = json!({"id": "guarded", "namespace": "billing", "schedule": {"every": "1h"},
        "executor": {"kind": "nats", "subject": "jobs.x"}, "breaker": {"key": "payments-api"}});
    let mut file = tempfile::Builder::new().suffix(".json").tempfile().expect("temp file");
    std::io::Write::write_all(&mut file, breaker.to_string().as_bytes()).expect("write spec");
    let applied = jetsched(&url, &["apply", "-f", &file.path().display().to_string()]).await;
    assert!(applied.status.success(), "{}", stderr(&applied));
    let table = stdout(&jetsched(&url, &["breakers"]).await);
    assert!(table.contains("BREAKER") && table.contains("payments-api"), "{table}");
    assert!(table.contains("billing/guarded") && table.contains("closed"), "{table}");
    let listed = json_out(&jetsched(&url, &["breakers", "--json"]).await);
    assert_eq!(listed["breakers"][0]["key"], "key.billing.payments-api", "{listed}");
    assert_eq!(listed["breakers"][0]["name"], "billing:payments-api", "{listed}");
    let reset = jetsched(&url, &["breaker", "reset", "payments-api"]).await;
    assert!(stdout(&reset).contains("payments-api reset (was closed)"), "{}", stderr(&reset));
    let missing = jetsched(&url, &["breaker", "show", "no-such-breaker"]).await;
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("not_found"), "{}", stderr(&missing));

    let triggered = json_out(&jetsched(&url, &["trigger", "billing/pulse", "--json"]).await);
    assert!(triggered["execution_id"].as_str().is_some_and(|id| !id.is_empty()), "{triggered}");

    let runs = json_out(&jetsched(&url, &["runs", "billing/pulse", "--json"]).await);
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    assert_eq!(runs[0]["execution_id"], triggered["execution_id"]);
    assert_eq!(runs[0]["trigger"], "manual");
    assert_eq!(runs[0]["outcome"], "dispatched");
    let trace_id = runs[0]["trace_id"].as_str().unwrap_or_default();
    assert!(trace_id.len() == 32 && trace_id.chars().all(|c| c.is_ascii_hexdigit()), "{runs}");
    let table = stdout(&jetsched(&url, &["runs", "billing/pulse"]).await);
    assert!(table.starts_with("EXECUTION") && table.contains("manual"), "{table}");

    // No scheduler runs: the report is printed, and the exit code says the system cannot fire.
    let unhealthy = jetsched(&url, &["status", "--json"]).await;
    assert_eq!(unhealthy.status.code(), Some(1), "{}", stderr(&unhealthy));
    assert!(stderr(&unhealthy).contains("no scheduler holds the lease"), "{}", stderr(&unhealthy));
    let status: Value = serde_json::from_slice(&unhealthy.stdout).expect("the status report as JSON");
    assert_eq!(status["replicas"]["registry"].as_array().map(Vec::len), Some(1), "{status}");
    assert_eq!(status["leader"], Value::Null, "no scheduler runs: {status}");
    assert_eq!(status["dead_letters"], 0);
    let dispatch =
        status["streams"].as_array().unwrap().iter().find(|s| s["stream"] == "JETSCHED_DISPATCH").cloned();
    assert_eq!(
        dispatch.map(|s| s["messages"].clone()),
        Some(json!(1)),
        "the manual run waits in the queue: {status}"
    );
    let text = stdout(&jetsched(&url, &["status"]).await);
    assert!(text.contains("leader:       NONE"), "{text}");

    // YAML: several documents, one of them a list.
    let yaml = dir.path().join("more.yaml");
    std::fs::write(
        &yaml,
        "id: yaml-one\nnamespace: yaml\nschedule: {every: 10m}\nexecutor: {kind: nats, subject: jobs.y}\n---\n\
         - id: yaml-two\n  namespace: yaml\n  schedule: {at: '2099-01-01T00:00:00Z'}\n  executor: {kind: handler, name: noop}\n",
    )
    .unwrap();
    let applied = jetsched(&url, &["apply", "-f", yaml.to_str().unwrap()]).await;
    assert!(applied.status.success(), "{}", stderr(&applied));
    let listed = json_out(&jetsched(&url, &["ls", "--namespace", "yaml", "--json"]).await);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");

    let events =
        stdout(&jetsched(&url, &["events", "--task", "billing/pulse", "--last", "50", "--json"]).await);
    for kind in ["task.registered", "task.paused", "task.resumed", "fire.dispatched"] {
        assert!(events.contains(&format!("\"kind\":\"{kind}\"")), "{kind} in {events}");
    }

    let removed = jetsched(&url, &["rm", "billing/pulse", "--yes"]).await;
    assert!(removed.status.success(), "{}", stderr(&removed));
    let gone = jetsched(&url, &["get", "billing/pulse"]).await;
    assert_eq!(gone.status.code(), Some(1));
    assert!(stderr(&gone).contains("not_found"), "{}", stderr(&gone));

    // A bad spec: exit code 1, the code and the field on stderr, nothing stored.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"id": "broken", "schedule": {"cron": "0 0 25 * * *"}, "executor": {"kind": "nats", "subject": "x"}}"#)
        .unwrap();
    let rejected = jetsched(&url, &["apply", "-f", bad.to_str().unwrap()]).await;
    assert_eq!(rejected.status.code(), Some(1), "{}", stderr(&rejected));
    assert!(stderr(&rejected).contains("invalid_cron at schedule.cron"), "{}", stderr(&rejected));
    let missing = jetsched(&url, &["get", "default/broken"]).await;
    assert_eq!(missing.status.code(), Some(1));

    // A directory with a good spec and one with three problems: the good one is stored, each
    // problem is printed once with its file and field, then one summary line.
    let mixed = tempfile::tempdir().unwrap();
    std::fs::write(
        mixed.path().join("a-good.json"),
        json!({"id": "fine", "schedule": {"every": "1h"}, "executor": {"kind": "nats", "subject": "x"}})
            .to_string(),
    )
    .unwrap();
    let three = mixed.path().join("b-three.json");
    std::fs::write(
        &three,
        json!({"id": "bad id!", "schedule": {"cron": "0 0 25 * * *"},
               "executor": {"kind": "nats", "subject": "x"}, "colour": "blue"})
        .to_string(),
    )
    .unwrap();
    let rejected = jetsched(&url, &["apply", "-f", mixed.path().to_str().unwrap()]).await;
    let (out, err) = (stdout(&rejected), stderr(&rejected));
    assert_eq!(rejected.status.code(), Some(1), "{err}");
    assert!(out.contains("default/fine applied"), "{out}");
    let source = three.display().to_string();
    for problem in ["invalid_id at id", "invalid_cron at schedule.cron", "unknown_field at colour"] {
        let line = format!("{source}: {problem}");
        assert_eq!(err.matches(&line).count(), 1, "`{line}` once in:\n{err}");
    }
    let summary = format!("error: 1 of 2 specs rejected: {source}");
    assert_eq!(err.matches("error: ").count(), 1, "one summary line:\n{err}");
    assert!(err.contains(&summary), "{err}");
    registry.stop().await;
}

/// `status` reads the lease record: the term stored by the leader (not the key's revision,
/// which grows with every renewal), when it was acquired and when it was last renewed (the
/// entry's time); a record of an older scheduler without a term shows the revision as before.
#[tokio::test]
async fn status_shows_the_stored_term_acquisition_and_last_renewal() {
    use async_nats::jetstream;
    use jetsched_shared::names::Names;

    let server = NatsServer::start().await;
    // A lease bucket whose entries outlive the test (the records are written by hand).
    let mut registry_config = config(&server.url(), 1);
    registry_config.shared.topology.lease = std::time::Duration::from_secs(120);
    let registry = App::registry(registry_config).await;
    let url = server.url();
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let lease = js.get_key_value(names.leader_bucket()).await.expect("leader bucket");
    let record = json!({"instance": "sched-a", "term": 42, "acquired_at": "2026-01-01T00:00:00.000Z",
                        "lease_ms": 3000});
    let first = lease.create(names.leader_key(), record.to_string().into()).await.expect("acquire");
    // Renewals rewrite the same record: the revision grows, the term does not.
    let mut latest = first;
    for _ in 0..3 {
        latest = lease.update(names.leader_key(), record.to_string().into(), latest).await.expect("renew");
    }
    let status = json_out(&jetsched(&url, &["status", "--json"]).await);
    let leader = &status["leader"];
    assert_eq!(leader["instance"], "sched-a", "{status}");
    assert_eq!(leader["term"], 42, "{status}");
    assert_eq!(leader["revision"], latest, "{status}");
    assert_eq!(leader["acquired_at"], "2026-01-01T00:00:00.000Z");
    let renewed = leader["renewed_at"].as_str().expect("renewed_at");
    let renewed = chrono::DateTime::parse_from_rfc3339(renewed).expect("RFC 3339");
    let age = chrono::Utc::now().signed_duration_since(renewed);
    assert!(age < chrono::Duration::seconds(30), "renewed {age} ago: {status}");
    assert_eq!(status["replicas"]["registry"].as_array().map(Vec::len), Some(1), "{status}");
    assert_eq!(status["partitions"], 64, "the topology's partitions: {status}");

    let text = stdout(&jetsched(&url, &["status"]).await);
    assert!(text.contains("leader:       sched-a (term 42, lease 3000 ms)"), "{text}");
    assert!(text.contains("partitions:   64 (one lease for all)"), "{text}");
    assert!(text.contains("acquired:     2026-01-01T00:00:00.000Z ("), "{text}");
    assert!(text.contains("renewed:      "), "{text}");
    assert!(text.contains("registries:   1 ("), "{text}");
    for role in ["schedulers:   0", "workers:      0", "alerters:     0"] {
        assert!(text.contains(role), "{role} in:\n{text}");
    }

    // An older scheduler's record: no term stored, so the revision stands in for it.
    let old = json!({"instance": "sched-old", "acquired_at": "2026-01-01T00:00:00.000Z", "lease_ms": 3000});
    let revision = lease.put(names.leader_key(), old.to_string().into()).await.expect("old record");
    let status = json_out(&jetsched(&url, &["status", "--json"]).await);
    assert_eq!(status["leader"]["term"], revision, "{status}");
    let text = stdout(&jetsched(&url, &["status"]).await);
    let line =
        format!("leader:       sched-old (term {revision}, since 2026-01-01T00:00:00.000Z, lease 3000 ms)");
    assert!(text.contains(&line), "{text}");
    registry.stop().await;
}

#[tokio::test]
async fn without_a_registry_the_cli_says_so_and_exits_2() {
    let server = NatsServer::start().await;
    let output = jetsched(&server.url(), &["get", "x"]).await;
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("is jetsched-registry running?"), "{}", stderr(&output));
    let unreachable = jetsched("nats://127.0.0.1:1", &["ls"]).await;
    assert_eq!(unreachable.status.code(), Some(2));
    assert!(stderr(&unreachable).contains("connect to NATS"), "{}", stderr(&unreachable));
}

#[tokio::test]
async fn dlq_subcommands_list_show_replay_and_purge() {
    use async_nats::jetstream;
    use jetsched_shared::names::Names;
    use jetsched_shared::spec::TaskSpec;
    use jetsched_shared::wire::{AttemptOutcome, AttemptRecord, DeadLetter, DeadLetterSource, Trigger};

    let Served { server, registry, .. } = served(|_| {}).await;
    let url = server.url();
    let js = jetstream::new(server.client().await);
    let names = Names::default();

    // Three dead letters as a worker stores them: two of billing/report, one of ops/sync.
    let spec = |ns: &str, id: &str| {
        TaskSpec::parse(
            json!({"id": id, "namespace": ns, "schedule": {"every": "1h"}, "executor": {"kind": "nats", "subject": "jobs.x"}})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    };
    for (ns, id, execution) in
        [("billing", "report", "e1"), ("billing", "report", "e2"), ("ops", "sync", "e3")]
    {
        let now = chrono::Utc::now();
        let entry = DeadLetter {
            execution_id: execution.into(),
            namespace: ns.into(),
            task_id: id.into(),
            queue: "default".into(),
            nominal_time: now,
            trigger: Trigger::Schedule,
            term: 1,
            revision: 1,
            spec: Some(spec(ns, id)),
            raw_dispatch: None,
            priority: Default::default(),
            reason: "retries exhausted: HTTP 503".into(),
            source: DeadLetterSource::Verdict,
            dead_at: now,
            worker: "w1".into(),
            attempts: vec![AttemptRecord {
                attempt: 1,
                worker: "w1".into(),
                started: now,
                finished: Some(now),
                outcome: Some(AttemptOutcome::Failed),
                error: Some("HTTP 503".into()),
                detail: None,
            }],
            dispatch_sequence: 1,
            trace_id: None,
        };
        js.publish(names.dlq_subject("default", ns, id), serde_json::to_vec(&entry).unwrap().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    let listed = json_out(&jetsched(&url, &["dlq", "ls", "--json"]).await);
    assert_eq!(listed.as_array().map(Vec::len), Some(3), "{listed}");
    let of_task = json_out(&jetsched(&url, &["dlq", "ls", "--task", "billing/report", "--json"]).await);
    assert_eq!(of_task.as_array().map(Vec::len), Some(2), "{of_task}");
    let table = stdout(&jetsched(&url, &["dlq", "ls"]).await);
    assert!(table.starts_with("SEQ") && table.contains("ops/sync") && table.contains("HTTP 503"), "{table}");

    let first = listed[0]["sequence"].as_u64().unwrap();
    let shown = json_out(&jetsched(&url, &["dlq", "show", &first.to_string(), "--json"]).await);
    assert_eq!(shown["entry"]["execution_id"], "e1");
    assert_eq!(shown["entry"]["attempts"][0]["error"], "HTTP 503");

    // Replay one: a new execution with trigger replay in the dispatch stream; the entry is gone.
    let replayed = json_out(&jetsched(&url, &["dlq", "replay", &first.to_string(), "--json"]).await);
    let execution = replayed["replayed"][0]["execution_id"].as_str().expect("new execution id").to_string();
    assert_ne!(execution, "e1");
    let dispatch = js.get_stream(names.dispatch_stream()).await.unwrap();
    let message = dispatch
        .get_last_raw_message_by_subject(&names.dispatch_subject("default", "billing", "report"))
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(
        (body["execution_id"].as_str(), body["trigger"].as_str()),
        (Some(execution.as_str()), Some("replay"))
    );
    let left = json_out(&jetsched(&url, &["dlq", "ls", "--json"]).await);
    assert_eq!(left.as_array().map(Vec::len), Some(2));

    // Purge by filter, then everything; a bare purge is refused with exit code 2.
    let purged = jetsched(&url, &["dlq", "purge", "--namespace", "ops"]).await;
    assert!(stdout(&purged).contains("1 dead letter purged"), "{}", stderr(&purged));
    let refused = jetsched(&url, &["dlq", "purge"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let all = jetsched(&url, &["dlq", "purge", "--all"]).await;
    assert!(all.status.success(), "{}", stderr(&all));
    let empty = json_out(&jetsched(&url, &["dlq", "ls", "--json"]).await);
    assert_eq!(empty, json!([]));
    let missing = jetsched(&url, &["dlq", "show", "999"]).await;
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    registry.stop().await;
}

/// `jetsched ls | head -1` with more tasks than a pipe holds: the reader goes away while the
/// CLI still writes, and the CLI stops printing and exits 0 without a word on stderr.
#[tokio::test]
async fn a_reader_that_goes_away_ends_the_output_quietly_with_exit_0() {
    let Served { server, registry, .. } = served(|_| {}).await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    // Far more than a pipe's 64 KiB in the table and in the JSON.
    let specs: Vec<Value> = (0..1500)
        .map(|i| {
            json!({"id": format!("a-task-with-a-rather-long-name-{i:05}"), "namespace": "pipes",
                   "schedule": {"every": "1h"}, "executor": {"kind": "nats", "subject": "jobs.pipes"}})
        })
        .collect();
    let file = dir.path().join("specs.json");
    std::fs::write(&file, Value::Array(specs).to_string()).unwrap();
    let applied = jetsched(&url, &["apply", "-f", file.to_str().unwrap()]).await;
    assert!(applied.status.success(), "{}", stderr(&applied));

    let whole = jetsched(&url, &["ls", "--namespace", "pipes"]).await;
    assert!(whole.status.success() && whole.stdout.len() > 96 * 1024, "{} bytes", whole.stdout.len());

    for (args, reader) in [("ls --namespace pipes", "head -1"), ("ls --namespace pipes --json", "true")] {
        let piped = tokio::process::Command::new("bash")
            .arg("-c")
            .arg(format!("set -o pipefail; \"$0\" --nats-url \"$1\" {args} | {reader}"))
            .arg(workspace_bin("jetsched"))
            .arg(&url)
            .output()
            .await
            .expect("run bash");
        assert_eq!(piped.status.code(), Some(0), "{args} | {reader}: {}", stderr(&piped));
        assert_eq!(stderr(&piped), "", "{args} | {reader}");
        if reader == "head -1" {
            assert!(
                stdout(&piped).starts_with("TASK") && stdout(&piped).lines().count() == 1,
                "{}",
                stdout(&piped)
            );
        }
    }
    registry.stop().await;
}

#[tokio::test]
async fn queues_lists_queues_and_queue_pause_and_resume_change_them() {
    let Served { server, registry, js, .. } = served(|_| {}).await;
    let url = server.url();
    // A queue is listed once a worker has made its lanes' consumers, or once it has a state.
    let worker_config = jetsched_worker::Config::for_tests(&url, "cli-queues");
    jetsched_worker::ensure_queue_consumer(
        &js,
        &jetsched_shared::names::Names::default(),
        "default",
        &worker_config,
    )
    .await
    .expect("the default queue's consumer");

    let paused =
        jetsched(&url, &["queue", "pause", "reports", "--reason", "nightly load", "--by", "alice"]).await;
    assert!(paused.status.success(), "{}", stderr(&paused));
    assert_eq!(stdout(&paused).trim(), "queue reports paused");
    let again = jetsched(&url, &["queue", "pause", "reports"]).await;
    assert_eq!(stdout(&again).trim(), "queue reports was paused already", "{}", stderr(&again));

    let listed = json_out(&jetsched(&url, &["queues", "--json"]).await);
    let queues = listed["queues"].as_array().expect("queues");
    let names: Vec<&str> = queues.iter().filter_map(|q| q["queue"].as_str()).collect();
    assert_eq!(names, ["default", "reports"], "{listed}");
    assert_eq!(
        (queues[1]["paused"].as_bool(), queues[1]["reason"].as_str()),
        (Some(true), Some("nightly load"))
    );
    assert_eq!((queues[1]["by"].as_str(), queues[0]["paused"].as_bool()), (Some("alice"), Some(false)));
    assert_eq!(queues[0]["lanes"][0]["priority"], "normal", "{listed}");
    let table = stdout(&jetsched(&url, &["queues"]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("QUEUE") && lines[0].contains("WAITING"), "{table}");
    assert!(lines[1].starts_with("default") && lines[1].contains("running"), "{table}");
    let reports = lines[2];
    assert!(reports.starts_with("reports") && reports.contains("paused"), "{table}");
    assert!(reports.contains("nightly load") && reports.contains("alice"), "{table}");

    let resumed = json_out(&jetsched(&url, &["queue", "resume", "reports", "--json"]).await);
    assert_eq!(
        (resumed["changed"].as_bool(), resumed["queue"]["paused"].as_bool()),
        (Some(true), Some(false))
    );

    // Every problem of a bad request is named, exit 1.
    let bad = jetsched(&url, &["queue", "pause", "a b", "--reason", "", "--by", "x"]).await;
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("queue") && stderr(&bad).contains("reason"), "{}", stderr(&bad));
    registry.stop().await;
}
