//! Tests for the task spec: the invalid-spec table, round trips and defaults.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::error::ApiErrors;
use crate::error::ErrorCode::{self, *};
use crate::schedule::Schedule;

fn now() -> DateTime<Utc> {
    "2026-06-15T12:00:00Z".parse().unwrap()
}

/// A valid spec every invalid case is derived from.
fn base() -> Value {
    json!({
        "id": "nightly-report",
        "namespace": "billing",
        "schedule": {"cron": "0 30 2 * * *", "timezone": "Asia/Shanghai"},
        "executor": {"kind": "http", "url": "http://reports.internal/run"}
    })
}

/// RFC 7396 merge patch: objects merge recursively, `null` removes a key.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn patched(patch: Value) -> Vec<u8> {
    let mut spec = base();
    merge(&mut spec, &patch);
    serde_json::to_vec(&spec).unwrap()
}

/// `base` with `schedule` or `executor` replaced wholesale.
fn replaced(key: &str, value: Value) -> Vec<u8> {
    let mut spec = base();
    spec[key] = value;
    serde_json::to_vec(&spec).unwrap()
}

/// Parses and admits; every problem found.
fn parse_and_admit(bytes: &[u8]) -> Result<TaskSpec, ApiErrors> {
    TaskSpec::parse(bytes).and_then(|spec| Ok(spec.admit(now())?))
}

#[test]
fn base_spec_is_valid() {
    parse_and_admit(&serde_json::to_vec(&base()).unwrap()).unwrap();
}

#[test]
fn invalid_specs_report_code_and_field() {
    let long = |n: usize| "a".repeat(n);
    let many_labels: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("l{i}"), json!("v"))).collect();
    let http = |extra: Value| {
        let mut e = json!({"kind": "http", "url": "http://x.internal/run"});
        merge(&mut e, &extra);
        replaced("executor", e)
    };
    let cases: Vec<(&str, Vec<u8>, ErrorCode, Option<&str>)> = vec![
        // JSON and top level
        ("malformed json", b"{\"id\": ".to_vec(), InvalidJson, None),
        ("not utf-8", b"\xff\xfe".to_vec(), InvalidJson, None),
        ("root is an array", b"[]".to_vec(), InvalidType, None),
        ("unknown top-level field", patched(json!({"owner": "me"})), UnknownField, Some("owner")),
        ("missing id", patched(json!({"id": null})), MissingField, Some("id")),
        ("missing schedule", patched(json!({"schedule": null})), MissingField, Some("schedule")),
        ("missing executor", patched(json!({"executor": null})), MissingField, Some("executor")),
        ("id is a number", patched(json!({"id": 7})), InvalidType, Some("id")),
        ("id with a space", patched(json!({"id": "nightly report"})), InvalidId, Some("id")),
        ("id with a dot", patched(json!({"id": "a.b"})), InvalidId, Some("id")),
        ("id of 129 chars", patched(json!({"id": long(129)})), InvalidId, Some("id")),
        ("empty id", patched(json!({"id": ""})), InvalidId, Some("id")),
        ("namespace with a slash", patched(json!({"namespace": "bill/ing"})), InvalidId, Some("namespace")),
        ("queue of 65 chars", patched(json!({"queue": long(65)})), InvalidId, Some("queue")),
        ("queue with a star", patched(json!({"queue": "q*"})), InvalidId, Some("queue")),
        ("version 2", patched(json!({"version": 2})), InvalidValue, Some("version")),
        ("version as a string", patched(json!({"version": "1"})), InvalidType, Some("version")),
        // schedule
        ("schedule is a string", replaced("schedule", json!("@daily")), InvalidType, Some("schedule")),
        ("schedule without a kind", replaced("schedule", json!({})), InvalidValue, Some("schedule")),
        (
            "two schedule kinds",
            replaced("schedule", json!({"cron": "0 * * * * *", "every": "1m"})),
            InvalidValue,
            Some("schedule"),
        ),
        (
            "unknown schedule field",
            patched(json!({"schedule": {"jitter": "1s"}})),
            UnknownField,
            Some("schedule.jitter"),
        ),
        (
            "timezone with every",
            replaced("schedule", json!({"every": "1m", "timezone": "UTC"})),
            InvalidValue,
            Some("schedule.timezone"),
        ),
        (
            "anchor with cron",
            patched(json!({"schedule": {"anchor": "2026-01-01T00:00:00Z"}})),
            InvalidValue,
            Some("schedule.anchor"),
        ),
        (
            "cron gibberish",
            patched(json!({"schedule": {"cron": "every day"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron with 5 fields",
            patched(json!({"schedule": {"cron": "30 2 * * *"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron with 8 fields",
            patched(json!({"schedule": {"cron": "0 0 0 1 1 * 2030 1"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron that never fires",
            patched(json!({"schedule": {"cron": "0 0 0 31 2 *"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron 5th Monday on the 1st",
            patched(json!({"schedule": {"cron": "0 0 0 1 * 2#5"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron minute 60",
            patched(json!({"schedule": {"cron": "0 60 * * * *"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron day-of-week 0",
            patched(json!({"schedule": {"cron": "0 0 9 * * 0"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron L-40",
            patched(json!({"schedule": {"cron": "0 0 0 L-40 * *"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron 6#6",
            patched(json!({"schedule": {"cron": "0 0 0 ? * 6#6"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron L mixed with days",
            patched(json!({"schedule": {"cron": "0 0 0 1,L * *"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "cron bare L in day-of-week",
            patched(json!({"schedule": {"cron": "0 0 0 ? * L"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        (
            "unknown descriptor",
            patched(json!({"schedule": {"cron": "@reboot"}})),
            InvalidCron,
            Some("schedule.cron"),
        ),
        ("cron is a number", patched(json!({"schedule": {"cron": 5}})), InvalidType, Some("schedule.cron")),
        (
            "unknown time zone",
            patched(json!({"schedule": {"timezone": "Mars/Olympus_Mons"}})),
            UnknownTimezone,
            Some("schedule.timezone"),
        ),
        ("zero every", replaced("schedule", json!({"every": "0s"})), InvalidDuration, Some("schedule.every")),
        (
            "negative every",
            replaced("schedule", json!({"every": "-5s"})),
            InvalidDuration,
            Some("schedule.every"),
        ),
        (
            "every as a number",
            replaced("schedule", json!({"every": 30})),
            InvalidType,
            Some("schedule.every"),
        ),
        (
            "sub-millisecond every",
            replaced("schedule", json!({"every": "1ms 500us"})),
            InvalidDuration,
            Some("schedule.every"),
        ),
        (
            "huge every",
            replaced("schedule", json!({"every": "1000years"})),
            InvalidDuration,
            Some("schedule.every"),
        ),
        (
            "anchor not RFC 3339",
            replaced("schedule", json!({"every": "1m", "anchor": "yesterday"})),
            InvalidValue,
            Some("schedule.anchor"),
        ),
        (
            "at with month 13",
            replaced("schedule", json!({"at": "2026-13-01T00:00:00Z"})),
            InvalidValue,
            Some("schedule.at"),
        ),
        (
            "at without offset",
            replaced("schedule", json!({"at": "2026-07-01T00:00:00"})),
            InvalidValue,
            Some("schedule.at"),
        ),
        (
            "after not a duration",
            replaced("schedule", json!({"after": "soon"})),
            InvalidDuration,
            Some("schedule.after"),
        ),
        (
            "at in the past (admit)",
            replaced("schedule", json!({"at": "2026-06-15T10:59:59Z"})),
            InThePast,
            Some("schedule.at"),
        ),
        (
            "cron years all past (admit)",
            patched(json!({"schedule": {"cron": "0 0 0 1 1 * 2020-2025"}})),
            InThePast,
            Some("schedule.cron"),
        ),
        // executor
        ("executor is a string", replaced("executor", json!("http")), InvalidType, Some("executor")),
        (
            "executor without kind",
            replaced("executor", json!({"url": "http://x/"})),
            MissingField,
            Some("executor.kind"),
        ),
        (
            "executor kind ftp",
            replaced("executor", json!({"kind": "ftp"})),
            InvalidValue,
            Some("executor.kind"),
        ),
        (
            "executor kind upper-case",
            replaced("executor", json!({"kind": "HTTP", "url": "http://x/"})),
            InvalidValue,
            Some("executor.kind"),
        ),
        (
            "http without url",
            replaced("executor", json!({"kind": "http"})),
            MissingField,
            Some("executor.url"),
        ),
        ("http ftp url", http(json!({"url": "ftp://x.internal/"})), InvalidValue, Some("executor.url")),
        ("http url without host", http(json!({"url": "http:///run"})), InvalidValue, Some("executor.url")),
        (
            "http url with bad port",
            http(json!({"url": "http://x:99999/"})),
            InvalidValue,
            Some("executor.url"),
        ),
        ("http url with a space", http(json!({"url": "http://x/a b"})), InvalidValue, Some("executor.url")),
        ("http method FETCH", http(json!({"method": "FETCH"})), InvalidValue, Some("executor.method")),
        ("http method number", http(json!({"method": 1})), InvalidType, Some("executor.method")),
        (
            "http header not a string",
            http(json!({"headers": {"X-A": 1}})),
            InvalidType,
            Some("executor.headers.X-A"),
        ),
        (
            "http header bad name",
            http(json!({"headers": {"X A": "1"}})),
            InvalidValue,
            Some("executor.headers.X A"),
        ),
        (
            "http header newline",
            http(json!({"headers": {"X-A": "1\r\nX-B: 2"}})),
            InvalidValue,
            Some("executor.headers.X-A"),
        ),
        ("http with subject", http(json!({"subject": "a.b"})), UnknownField, Some("executor.subject")),
        (
            "nats wildcard subject",
            replaced("executor", json!({"kind": "nats", "subject": "jobs.*"})),
            InvalidValue,
            Some("executor.subject"),
        ),
        (
            "nats full wildcard",
            replaced("executor", json!({"kind": "nats", "subject": "jobs.>"})),
            InvalidValue,
            Some("executor.subject"),
        ),
        (
            "nats empty token",
            replaced("executor", json!({"kind": "nats", "subject": "jobs..run"})),
            InvalidValue,
            Some("executor.subject"),
        ),
        (
            "nats subject of the JetStream API (admit)",
            replaced("executor", json!({"kind": "nats", "subject": "$JS.API.STREAM.INFO.KV_JETSCHED_RUNS"})),
            InvalidValue,
            Some("executor.subject"),
        ),
        (
            "nats subject of a KV bucket (admit)",
            replaced("executor", json!({"kind": "nats", "subject": "$KV.JETSCHED_TASKS.a.b"})),
            InvalidValue,
            Some("executor.subject"),
        ),
        (
            "nats reply subject (admit)",
            replaced("executor", json!({"kind": "nats", "subject": "_INBOX.abc"})),
            InvalidValue,
            Some("executor.subject"),
        ),
        (
            "nats with body",
            replaced("executor", json!({"kind": "nats", "subject": "a", "body": {}})),
            UnknownField,
            Some("executor.body"),
        ),
        (
            "shell empty command",
            replaced("executor", json!({"kind": "shell", "command": []})),
            InvalidValue,
            Some("executor.command"),
        ),
        (
            "shell empty program",
            replaced("executor", json!({"kind": "shell", "command": ["", "x"]})),
            InvalidValue,
            Some("executor.command.0"),
        ),
        (
            "shell command string",
            replaced("executor", json!({"kind": "shell", "command": "ls -l"})),
            InvalidType,
            Some("executor.command"),
        ),
        (
            "shell argument number",
            replaced("executor", json!({"kind": "shell", "command": ["ls", 1]})),
            InvalidType,
            Some("executor.command.1"),
        ),
        (
            "shell missing command",
            replaced("executor", json!({"kind": "shell"})),
            MissingField,
            Some("executor.command"),
        ),
        (
            "shell bad env name",
            replaced("executor", json!({"kind": "shell", "command": ["env"], "env": {"1X": "a"}})),
            InvalidValue,
            Some("executor.env.1X"),
        ),
        (
            "handler bad name",
            replaced("executor", json!({"kind": "handler", "name": "a b"})),
            InvalidId,
            Some("executor.name"),
        ),
        (
            "handler missing name",
            replaced("executor", json!({"kind": "handler"})),
            MissingField,
            Some("executor.name"),
        ),
        // durations and policies
        ("zero timeout", patched(json!({"timeout": "0s"})), InvalidDuration, Some("timeout")),
        ("timeout over 24h", patched(json!({"timeout": "25h"})), InvalidValue, Some("timeout")),
        ("timeout as a number", patched(json!({"timeout": 300})), InvalidType, Some("timeout")),
        (
            "timeout unparsable",
            patched(json!({"timeout": "5 minutes please"})),
            InvalidDuration,
            Some("timeout"),
        ),
        ("retry is a number", patched(json!({"retry": 3})), InvalidType, Some("retry")),
        ("unknown retry field", patched(json!({"retry": {"foo": 1}})), UnknownField, Some("retry.foo")),
        (
            "max_attempts 0",
            patched(json!({"retry": {"max_attempts": 0}})),
            InvalidValue,
            Some("retry.max_attempts"),
        ),
        (
            "max_attempts 1001",
            patched(json!({"retry": {"max_attempts": 1001}})),
            InvalidValue,
            Some("retry.max_attempts"),
        ),
        (
            "max_attempts negative",
            patched(json!({"retry": {"max_attempts": -1}})),
            InvalidValue,
            Some("retry.max_attempts"),
        ),
        (
            "max_attempts fractional",
            patched(json!({"retry": {"max_attempts": 2.5}})),
            InvalidType,
            Some("retry.max_attempts"),
        ),
        (
            "multiplier below 1",
            patched(json!({"retry": {"multiplier": 0.5}})),
            InvalidValue,
            Some("retry.multiplier"),
        ),
        (
            "multiplier over 100",
            patched(json!({"retry": {"multiplier": 101}})),
            InvalidValue,
            Some("retry.multiplier"),
        ),
        (
            "multiplier as a string",
            patched(json!({"retry": {"multiplier": "2"}})),
            InvalidType,
            Some("retry.multiplier"),
        ),
        ("retry jitter 1.5", patched(json!({"retry": {"jitter": 1.5}})), InvalidValue, Some("retry.jitter")),
        (
            "retry jitter negative",
            patched(json!({"retry": {"jitter": -0.1}})),
            InvalidValue,
            Some("retry.jitter"),
        ),
        (
            "zero initial",
            patched(json!({"retry": {"initial": "0ms"}})),
            InvalidDuration,
            Some("retry.initial"),
        ),
        (
            "max_interval below initial",
            patched(json!({"retry": {"initial": "10s", "max_interval": "1s"}})),
            InvalidValue,
            Some("retry.max_interval"),
        ),
        (
            "max_elapsed negative",
            patched(json!({"retry": {"max_elapsed": "-1m"}})),
            InvalidDuration,
            Some("retry.max_elapsed"),
        ),
        ("misfire unknown", patched(json!({"misfire": "sometimes"})), InvalidValue, Some("misfire")),
        ("misfire upper-case", patched(json!({"misfire": "SKIP"})), InvalidValue, Some("misfire")),
        ("overlap unknown", patched(json!({"overlap": "queue"})), InvalidValue, Some("overlap")),
        ("overlap boolean", patched(json!({"overlap": true})), InvalidType, Some("overlap")),
        ("overlap misspelt", patched(json!({"overlap": "cancel-other"})), InvalidValue, Some("overlap")),
        (
            "zero catchup_window",
            patched(json!({"catchup_window": "0s"})),
            InvalidDuration,
            Some("catchup_window"),
        ),
        ("empty jitter", patched(json!({"jitter": {}})), InvalidValue, Some("jitter")),
        (
            "jitter bad spread",
            patched(json!({"jitter": {"spread": "wide"}})),
            InvalidDuration,
            Some("jitter.spread"),
        ),
        (
            "unknown jitter field",
            patched(json!({"jitter": {"spread": "1s", "min": "1s"}})),
            UnknownField,
            Some("jitter.min"),
        ),
        ("paused as a string", patched(json!({"paused": "yes"})), InvalidType, Some("paused")),
        ("labels is an array", patched(json!({"labels": ["a"]})), InvalidType, Some("labels")),
        (
            "label key with a space",
            patched(json!({"labels": {"my team": "x"}})),
            InvalidId,
            Some("labels.my team"),
        ),
        (
            "label key of 64 chars",
            patched(json!({"labels": {long(64): "x"}})),
            InvalidId,
            Some(&*format!("labels.{}", long(64)).leak()),
        ),
        ("label value number", patched(json!({"labels": {"team": 1}})), InvalidType, Some("labels.team")),
        (
            "label value 257 chars",
            patched(json!({"labels": {"team": long(257)}})),
            InvalidValue,
            Some("labels.team"),
        ),
        ("65 labels", patched(json!({"labels": many_labels})), InvalidValue, Some("labels")),
        // concurrency limits
        ("concurrency is a number", patched(json!({"concurrency": 2})), InvalidType, Some("concurrency")),
        (
            "concurrency without a limit",
            patched(json!({"concurrency": {"key": "pay"}})),
            MissingField,
            Some("concurrency.limit"),
        ),
        (
            "concurrency limit 0",
            patched(json!({"concurrency": {"key": "pay", "limit": 0}})),
            InvalidValue,
            Some("concurrency.limit"),
        ),
        (
            "concurrency key with an unknown placeholder",
            patched(json!({"concurrency": {"key": "c-{customer}", "limit": 1}})),
            InvalidValue,
            Some("concurrency.key"),
        ),
        (
            "concurrency key naming a label the task lacks",
            patched(json!({"concurrency": {"key": "c-{labels.customer}", "limit": 1}})),
            InvalidValue,
            Some("concurrency.key"),
        ),
        (
            "concurrency key expanding to a bad key",
            patched(
                json!({"concurrency": {"key": "c-{labels.team}", "limit": 1}, "labels": {"team": "a b"}}),
            ),
            InvalidValue,
            Some("concurrency.key"),
        ),
        (
            "unknown concurrency field",
            patched(json!({"concurrency": {"key": "pay", "limit": 1, "lease": "5s"}})),
            UnknownField,
            Some("concurrency.lease"),
        ),
        // breaker, auto-pause and the pause reason
        ("breaker is a string", patched(json!({"breaker": "on"})), InvalidType, Some("breaker")),
        (
            "unknown breaker field",
            patched(json!({"breaker": {"colour": "red"}})),
            UnknownField,
            Some("breaker.colour"),
        ),
        (
            "breaker key with a dot",
            patched(json!({"breaker": {"key": "a.b"}})),
            InvalidId,
            Some("breaker.key"),
        ),
        (
            "breaker key of 65 chars",
            patched(json!({"breaker": {"key": long(65)}})),
            InvalidId,
            Some("breaker.key"),
        ),
        (
            "failure rate 0",
            patched(json!({"breaker": {"failure_rate": 0}})),
            InvalidValue,
            Some("breaker.failure_rate"),
        ),
        (
            "failure rate above 1",
            patched(json!({"breaker": {"failure_rate": 1.5}})),
            InvalidValue,
            Some("breaker.failure_rate"),
        ),
        (
            "failure rate as a string",
            patched(json!({"breaker": {"failure_rate": "half"}})),
            InvalidType,
            Some("breaker.failure_rate"),
        ),
        ("min runs 0", patched(json!({"breaker": {"min_runs": 0}})), InvalidValue, Some("breaker.min_runs")),
        (
            "window not a duration",
            patched(json!({"breaker": {"window": "soon"}})),
            InvalidDuration,
            Some("breaker.window"),
        ),
        (
            "window under a second",
            patched(json!({"breaker": {"window": "500ms"}})),
            InvalidValue,
            Some("breaker.window"),
        ),
        (
            "open for 0s",
            patched(json!({"breaker": {"open_for": "0s"}})),
            InvalidDuration,
            Some("breaker.open_for"),
        ),
        (
            "max open for below open for",
            patched(json!({"breaker": {"open_for": "30s", "max_open_for": "10s"}})),
            InvalidValue,
            Some("breaker.max_open_for"),
        ),
        (
            "half-open runs 0",
            patched(json!({"breaker": {"half_open_runs": 0}})),
            InvalidValue,
            Some("breaker.half_open_runs"),
        ),
        (
            "on open unknown",
            patched(json!({"breaker": {"on_open": "queue"}})),
            InvalidValue,
            Some("breaker.on_open"),
        ),
        (
            "pause after 0 failures",
            patched(json!({"pause_after_failures": 0})),
            InvalidValue,
            Some("pause_after_failures"),
        ),
        (
            "pause after failures as a string",
            patched(json!({"pause_after_failures": "3"})),
            InvalidType,
            Some("pause_after_failures"),
        ),
        (
            "paused reason on a running task",
            patched(json!({"paused_reason": "maintenance"})),
            InvalidValue,
            Some("paused_reason"),
        ),
        (
            "empty paused reason",
            patched(json!({"paused": true, "paused_reason": ""})),
            InvalidValue,
            Some("paused_reason"),
        ),
        (
            "paused reason of 257 chars",
            patched(json!({"paused": true, "paused_reason": long(257)})),
            InvalidValue,
            Some("paused_reason"),
        ),
        ("paused reason a number", patched(json!({"paused_reason": 1})), InvalidType, Some("paused_reason")),
    ];
    assert!(cases.len() >= 45, "{} cases", cases.len());
    let mut failures = Vec::new();
    for (name, bytes, code, field) in &cases {
        assert_fast_path_agrees(bytes);
        // Each case has one problem: one error, not a cascade.
        match parse_and_admit(bytes).as_ref().map_err(ApiErrors::as_slice) {
            Ok(_) => failures.push(format!("{name}: accepted")),
            Err([e]) if e.code != *code || e.field.as_deref() != *field => {
                failures.push(format!("{name}: expected {code} at {field:?}, got {e}"))
            }
            Err([e]) => assert!(!e.message.is_empty(), "{name}: empty message"),
            Err(errors) => failures.push(format!("{name}: expected one error, got {errors:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn nats_subjects_are_confined_outside_the_reserved_spaces() {
    use crate::names::Names;
    let names = Names::default();
    let custom = Names::new("acme").unwrap();
    // (subject, refused under the default prefix, refused at admission without names)
    let cases = [
        ("jobs.run", false, false),
        ("billing.invoices.send", false, false),
        ("$JS.API.STREAM.INFO.KV_JETSCHED_RUNS", true, true),
        ("$JS.API.CONSUMER.MSG.NEXT.JETSCHED_DISPATCH.workers", true, true),
        ("$KV.JETSCHED_TASKS.x.y", true, true),
        ("$O.bucket.C.x", true, true),
        ("$SYS.REQ.SERVER.PING", true, true),
        ("$SRV.PING", true, true),
        ("$JSC.R.x", true, true),
        ("$NRG.x", true, true),
        ("$MQTT.sess.x", true, true),
        ("$G", true, true),
        ("_INBOX.x", true, true),
        ("_INBOX", true, true),
        ("_INBOX_custom.x", true, true),
        ("_R_.abc.def", true, true),
        ("jetsched.control.pause.x", true, false),
        ("jetsched", true, false),
        ("jetsched.api.task.put", true, false),
        // Only the first token counts, and subjects are case-sensitive.
        ("jobs.jetsched.x", false, false),
        ("jobs.$JS.x", false, false),
        ("jetsched_other.x", false, false),
        ("JETSCHED.x", false, false),
        ("INBOX.x", false, false),
    ];
    for (subject, refused, refused_at_admission) in cases {
        let executor = Executor::Nats { subject: subject.into(), payload: None, headers: BTreeMap::new() };
        match executor.check_confined(&names) {
            Ok(()) => assert!(!refused, "{subject} accepted"),
            Err(e) => {
                assert!(refused, "{subject} refused: {e}");
                assert_eq!((e.code, e.field.as_deref()), (ErrorCode::InvalidValue, Some("executor.subject")));
                assert!(e.message.contains(subject) && e.message.contains("refused"), "{e}");
            }
        }
        assert_eq!(executor.check_admissible().is_err(), refused_at_admission, "{subject}");
        let spec = replaced("executor", json!({"kind": "nats", "subject": subject}));
        assert!(TaskSpec::parse(&spec).is_ok(), "{subject}: parsing stays structural");
        assert_eq!(parse_and_admit(&spec).is_err(), refused_at_admission, "{subject}");
    }
    // The prefix is the deployment's.
    assert!(confined_subject("jetsched.x", &custom).is_ok());
    let e = confined_subject("acme.control.pause.x", &custom).unwrap_err();
    assert!(e.message.contains("`acme.>`"), "{e}");
    let e = confined_subject("$JS.API.INFO", &names).unwrap_err();
    assert!(e.message.contains("NATS server"), "{e}");
    // The other kinds are confined by the worker.
    let http = Executor::Http {
        method: "POST".into(),
        url: "http://127.0.0.1/".into(),
        headers: BTreeMap::new(),
        body: None,
    };
    assert!(http.check_confined(&names).is_ok());
}

#[test]
fn five_field_cron_message_says_seconds_are_required() {
    let e = TaskSpec::parse(&patched(json!({"schedule": {"cron": "30 2 * * *"}}))).unwrap_err();
    assert!(e.first().message.contains("seconds are required"), "{e}");
}

#[test]
fn minimal_spec_gets_every_default() {
    let spec = TaskSpec::parse(
        br#"{"id": "t1", "schedule": {"every": "30s"}, "executor": {"kind": "handler", "name": "cleanup"}}"#,
    )
    .unwrap();
    assert_eq!(spec.version, 1);
    assert_eq!(spec.namespace, "default");
    assert_eq!(spec.queue, "default");
    assert_eq!(
        spec.schedule,
        Schedule::Every { interval: Duration::from_secs(30), anchor: DateTime::UNIX_EPOCH }
    );
    assert_eq!(spec.executor, Executor::Handler { name: "cleanup".into(), payload: None });
    assert_eq!(spec.timeout, Duration::from_secs(300));
    assert_eq!(spec.retry, RetryPolicy::default());
    // The documented defaults.
    let RetryPolicy { max_attempts, initial, multiplier, max_interval, jitter, max_elapsed } = spec.retry;
    let secs = Duration::from_secs;
    assert_eq!((max_attempts, initial, multiplier, max_interval, jitter), (3, secs(1), 2.0, secs(60), 0.2));
    assert_eq!(max_elapsed, None);
    assert_eq!(spec.misfire, MisfirePolicy::FireOnce);
    assert_eq!(spec.catchup_window, Duration::from_secs(3600));
    assert_eq!(spec.overlap, OverlapPolicy::Allow);
    assert_eq!(spec.jitter, None);
    assert!(!spec.paused);
    assert!(spec.labels.is_empty());
    assert_eq!(spec.key(), "default.t1");
    assert_eq!(spec.jitter_offset(), Duration::ZERO);
}

#[test]
fn canonical_json_of_defaults() {
    let spec = TaskSpec::parse(
        br#"{"id": "t1", "schedule": {"cron": "@daily"}, "executor": {"kind": "http", "url": "https://x/"}}"#,
    )
    .unwrap();
    assert_eq!(
        spec.to_json(),
        json!({
            "version": 1, "id": "t1", "namespace": "default",
            "schedule": {"cron": "@daily", "timezone": "UTC"},
            "queue": "default",
            "executor": {"kind": "http", "method": "POST", "url": "https://x/", "headers": {}},
            "timeout": "5m",
            "retry": {"max_attempts": 3, "initial": "1s", "multiplier": 2.0, "max_interval": "1m", "jitter": 0.2},
            "misfire": "fire_once", "catchup_window": "1h", "overlap": "allow", "paused": false, "labels": {}
        })
    );
}

#[test]
fn design_example_parses() {
    let spec = TaskSpec::parse(
        br#"{
          "id": "nightly-report", "namespace": "billing",
          "schedule": {"cron": "0 30 2 * * *", "timezone": "Asia/Shanghai"},
          "queue": "default",
          "executor": {"kind": "http", "method": "post", "url": "http://reports.internal/run", "body": {"day": "yesterday"}},
          "timeout": "5m",
          "retry": {"max_attempts": 4, "initial": "1s", "multiplier": 2.0, "max_interval": "30s", "jitter": 0.3, "max_elapsed": "10m"},
          "misfire": "fire_once", "catchup_window": "1h",
          "overlap": "skip",
          "paused": false,
          "labels": {"team": "billing"}
        }"#,
    )
    .unwrap();
    assert_eq!(spec.key(), "billing.nightly-report");
    let Executor::Http { method, body, .. } = &spec.executor else { panic!("{:?}", spec.executor) };
    assert_eq!(method, "POST");
    assert_eq!(body, &Some(json!({"day": "yesterday"})));
    assert_eq!(spec.retry.max_elapsed, Some(Duration::from_secs(600)));
    assert_eq!(spec.overlap, OverlapPolicy::Skip);
    assert_eq!(spec.labels, BTreeMap::from([("team".to_owned(), "billing".to_owned())]));
    let Schedule::Cron(cron) = &spec.schedule else { panic!() };
    assert_eq!(cron.timezone(), chrono_tz::Asia::Shanghai);
    assert_eq!(cron.source(), "0 30 2 * * *");
}

fn valid_specs() -> Vec<Value> {
    vec![
        base(),
        json!({
            "version": 1, "id": "n", "namespace": "ns-1", "queue": "fast_q",
            "schedule": {"every": "1h 30m", "anchor": "2026-01-01T09:00:00.250+01:00"},
            "executor": {"kind": "nats", "subject": "jobs.run", "payload": [1, 2.5, "x", null], "headers": {"Trace": "1"}},
            "timeout": "90s", "misfire": "fire_all", "catchup_window": "10m", "overlap": "buffer_one",
            "jitter": {"spread": "10s", "max_random": "2s"}, "paused": true,
            "rate_limit": {"key": "team-{labels.team}-{id}", "limit": 100, "period": "1m", "burst": 5, "on_limit": "skip"},
            "labels": {"team": "ops", "app.kubernetes.io/name": "x"}
        }),
        json!({
            "id": "s", "schedule": {"at": "2030-02-03T04:05:06Z"},
            "executor": {"kind": "shell", "command": ["sh", "-c", "echo hi"], "env": {"A_B": "1"}, "cwd": "/tmp"},
            "retry": {"max_attempts": 1, "initial": "250ms", "multiplier": 1, "jitter": 0, "max_elapsed": "1m"},
            "misfire": "skip", "overlap": "skip", "jitter": {"max_random": "500ms"}
        }),
        json!({
            "id": "a", "schedule": {"after": "10m"},
            "executor": {"kind": "handler", "name": "reports.daily-v2", "payload": {"k": {"nested": true}}},
            "retry": {"initial": "2m"}, "jitter": {"spread": "1m"}
        }),
        json!({
            "id": "h", "schedule": {"cron": "0 0 9 LW * ?", "timezone": "America/New_York"},
            "executor": {"kind": "http", "method": "delete", "url": "https://user@[::1]:8443/x?y=1#z",
                         "headers": {"Authorization": "Bearer t"}, "body": "text"}
        }),
        json!({
            "id": "h2", "schedule": {"cron": "0 15 10 ? * FRI#3 2027", "timezone": "Australia/Lord_Howe"},
            "executor": {"kind": "http", "method": "HEAD", "url": "http://h:80"}
        }),
        json!({
            "id": "b", "schedule": {"every": "10s"}, "executor": {"kind": "http", "url": "http://pay/x"},
            "paused": true, "paused_reason": "consecutive_failures",
            "breaker": {"key": "payments-api", "failure_rate": 0.25, "min_runs": 4, "window": "2s",
                        "open_for": "1s", "max_open_for": "8s", "half_open_runs": 2, "on_open": "skip"},
            "pause_after_failures": 3
        }),
        json!({
            "id": "b2", "schedule": {"every": "10s"}, "executor": {"kind": "nats", "subject": "x"},
            "breaker": {"open_for": "20m"}
        }),
        json!({
            "id": "c", "namespace": "shop", "schedule": {"every": "1s"},
            "executor": {"kind": "nats", "subject": "x"},
            "concurrency": {"key": "customer-{labels.customer}_{namespace}-{id}", "limit": 5},
            "labels": {"customer": "acme"}
        }),
    ]
}

/// The fast path accepts only what the reference reader accepts, and builds the same spec.
fn assert_fast_path_agrees(bytes: &[u8]) -> Option<TaskSpec> {
    let fast = fast::parse(bytes);
    let reference = TaskSpec::parse_reference(bytes);
    match (&fast, &reference) {
        (Some(fast), Ok(reference)) => assert_eq!(fast, reference, "{}", String::from_utf8_lossy(bytes)),
        (Some(_), Err(e)) => panic!("fast path accepted {} ({e})", String::from_utf8_lossy(bytes)),
        (None, _) => {}
    }
    fast
}

#[test]
fn the_fast_path_takes_every_valid_spec_and_agrees_with_the_reference() {
    for value in valid_specs() {
        // Shell executors are left to the reference reader.
        let taken = value["executor"]["kind"] != "shell";
        let bytes = serde_json::to_vec(&value).unwrap();
        assert_eq!(assert_fast_path_agrees(&bytes).is_some(), taken, "{value}");
        let canonical = serde_json::to_vec(&TaskSpec::parse(&bytes).unwrap().to_json()).unwrap();
        assert_eq!(assert_fast_path_agrees(&canonical).is_some(), taken, "the canonical form of {value}");
    }
    // Inputs a typed reader might take differently: arrays, duplicate keys, escapes, nulls.
    let tricky: &[&[u8]] = &[
        br#"[1, "t", "ns", {"every": "1m"}, "q", {"kind": "nats", "subject": "s"}]"#,
        br#" {"id": "t", "id": "u", "schedule": {"every": "1m"}, "executor": {"kind": "nats", "subject": "s"}}"#,
        br#"{"id": "t", "schedule": {"every": "1m"}, "executor": {"kind": "nats", "subject": "s"}}"#,
        br#"{"id": "t ", "schedule": {"every": "1m"}, "executor": {"kind": "nats", "subject": "s"}}"#,
        br#"{"id": "t", "schedule": null, "executor": {"kind": "nats", "subject": "s"}}"#,
        br#"{"id": "t", "version": 1.0, "schedule": {"every": "1m"}, "executor": {"kind": "nats", "subject": "s"}}"#,
        br#"{"id": "t", "labels": {"a": "1", "a": "2"}, "schedule": {"every": "1m"}, "executor": {"kind": "nats", "subject": "s"}}"#,
        br#"{"id": "t", "schedule": {"every": "1m"}, "executor": {"kind": "nats", "subject": "s"}} x"#,
        b"\x0c{\"id\": \"t\", \"schedule\": {\"every\": \"1m\"}, \"executor\": {\"kind\": \"nats\", \"subject\": \"s\"}}",
    ];
    for bytes in tricky {
        assert_fast_path_agrees(bytes);
    }
}

/// The fields of generated documents: JSON texts that are valid (`""`: absent) and texts that
/// are invalid, null where a value is required, or of the wrong type.
const FIELDS_FOR_TESTS: &[(&str, &[&str], &[&str])] = &[
    ("version", &["", "1", "null"], &["2", "1.0", "-1", "\"1\""]),
    ("id", &["\"t-1\"", "\"t\\u002d2\""], &["\"a b\"", "\"\"", "null", "7"]),
    ("namespace", &["", "\"ns\"", "null"], &["\"n.s\"", "[]"]),
    (
        "schedule",
        &[
            r#"{"every": "1m"}"#,
            r#"{"every": "1m", "anchor": "2026-01-01T00:00:00.5Z"}"#,
            r#"{"cron": "0 * * * * *", "timezone": "Europe/Paris"}"#,
            r#"{"at": "2030-01-01T00:00:00Z"}"#,
            r#"{"after": "5m"}"#,
        ],
        &[
            r#"{"cron": "* * * * *"}"#,
            r#"{"every": "1m", "at": "2030-01-01T00:00:00Z"}"#,
            r#"{"every": 60}"#,
            r#"{"every": "1m", "timezone": "UTC"}"#,
            r#"{"at": "2030-01-01T00:00:00Z", "anchor": "2030-01-01T00:00:00Z"}"#,
            r#"{"every": "1500us"}"#,
            r#"{"cron": "0 * * * * *", "timezone": "Mars/Base"}"#,
            r#"["0 * * * * *"]"#,
            r#"{"at": "tomorrow"}"#,
            r#"{}"#,
            "null",
            "\"1m\"",
        ],
    ),
    ("queue", &["", "\"q\"", "null"], &["\"q.x\"", "true", "\"\""]),
    ("priority", &["", "\"critical\"", "\"low\"", "\"normal\"", "null"], &["\"urgent\"", "\"High\"", "1"]),
    (
        "executor",
        &[
            r#"{"kind": "nats", "subject": "jobs.run"}"#,
            r#"{"kind": "http", "url": "http://h/x", "method": "get"}"#,
            r#"{"kind": "handler", "name": "h", "payload": {"a": [1, null]}}"#,
            r#"{"kind": "nats", "subject": "s", "payload": null, "headers": {"X-A": "1"}}"#,
            r#"{"kind": "http", "url": "https://h:8443/x?y", "headers": null, "body": {"k": "v"}}"#,
        ],
        &[
            r#"{"kind": "nats", "subject": "jobs.*"}"#,
            r#"{"kind": "nats", "subject": "s", "url": null}"#,
            r#"{"kind": "handler", "name": "h", "headers": null}"#,
            r#"{"kind": "http", "url": "http://h/", "method": "TRACE"}"#,
            r#"{"kind": "http", "url": "ftp://h/"}"#,
            r#"{"kind": "http", "url": "http://h/", "headers": {"bad name": "v"}}"#,
            r#"{"kind": "nats", "subject": "s", "headers": {"X": 1}}"#,
            r#"{"kind": "handler", "name": "a b"}"#,
            r#"{"kind": "shell", "command": ["true"]}"#,
            r#"{"kind": "cron", "subject": "s"}"#,
            r#"{"subject": "s"}"#,
            r#"["nats", null, null, null, null, "s"]"#,
            "null",
            "[]",
        ],
    ),
    ("timeout", &["", "\"90s\"", "null"], &["\"25h\"", "\"0s\"", "\"soon\"", "90"]),
    ("retry", &["", r#"{"max_attempts": 5}"#, "null"], &[r#"{"max_attempts": 0}"#, r#"{"bogus": 1}"#, "1"]),
    ("misfire", &["", "\"skip\"", "\"fire_all\"", "null"], &["\"never\"", "0"]),
    ("catchup_window", &["", "\"10m\"", "null"], &["\"-1m\"", "{}"]),
    (
        "overlap",
        &["", "\"buffer_one\"", "\"cancel_other\"", "\"replace\"", "null"],
        &["\"queue\"", "\"Allow\"", "\"cancel-other\"", "\"Replace\""],
    ),
    ("jitter", &["", r#"{"spread": "10s"}"#, "null"], &["{}", r#"{"max_random": "x"}"#, "\"1s\""]),
    ("paused", &["", "true", "null"], &["\"yes\"", "0"]),
    (
        "labels",
        &["", r#"{"team": "ops"}"#, "null"],
        &[r#"{"bad key": "x"}"#, r#"{"team": 1}"#, r#"{"team": null}"#, "[]"],
    ),
    (
        "rate_limit",
        &[
            "",
            r#"{"limit": 20, "period": "1s"}"#,
            r#"{"key": "t-{labels.team}", "limit": 5, "period": "1m", "burst": 3, "on_limit": "skip"}"#,
            "null",
        ],
        &[
            r#"{"limit": 0, "period": "1s"}"#,
            r#"{"key": "a.b", "limit": 1, "period": "1s"}"#,
            r#"{"limit": 1}"#,
            r#"{"key": "{labels.nope}", "limit": 1, "period": "1s"}"#,
            r#"{"limit": 1000000, "period": "100ms"}"#,
            "\"x\"",
        ],
    ),
    ("owner", &[""], &["\"me\"", "null"]),
];

#[test]
fn a_rate_limit_key_is_checked_against_the_task_naming_every_problem() {
    let mut value = base();
    value["labels"] = json!({"customer": "acme corp"});
    value["rate_limit"] =
        json!({"key": "c-{labels.customer}", "limit": 0, "period": "0s", "on_limit": "drop"});
    let errors = TaskSpec::parse_value(value.clone()).unwrap_err();
    let fields: Vec<_> = errors.as_slice().iter().map(|e| e.field.clone().unwrap_or_default()).collect();
    assert_eq!(fields, ["rate_limit.limit", "rate_limit.period", "rate_limit.on_limit"], "{errors:?}");
    value["rate_limit"] = json!({"key": "c-{labels.customer}", "limit": 10, "period": "1s"});
    let errors = TaskSpec::parse_value(value.clone()).unwrap_err();
    assert_eq!(errors.first().field.as_deref(), Some("rate_limit.key"), "{errors:?}");
    assert!(errors.first().message.contains("customer"), "{errors:?}");
    value["labels"] = json!({"customer": "acme"});
    let spec = TaskSpec::parse_value(value).unwrap();
    let rate = spec.rate_limit.as_ref().unwrap();
    assert_eq!(rate.expand_key(&spec.namespace, &spec.id, &spec.labels).unwrap(), "c-acme");
    assert_eq!((rate.burst, rate.interval_us()), (1, 100_000));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Valid documents with up to two fields replaced by invalid, null, mistyped or other valid
    /// values, in any order, sometimes with a repeated key: the fast path never disagrees with
    /// the reference reader, and it takes every valid document without repeated keys or a
    /// shell executor.
    #[test]
    fn the_fast_path_never_disagrees_with_the_reference(
        good in proptest::collection::vec(any::<proptest::sample::Index>(), FIELDS_FOR_TESTS.len()),
        changes in proptest::collection::vec(
            (0..FIELDS_FOR_TESTS.len(), any::<proptest::sample::Index>(), any::<bool>()),
            0..=2,
        ),
        repeat in proptest::option::of(any::<proptest::sample::Index>()),
        seed in any::<u64>(),
    ) {
        let mut texts: Vec<&str> =
            FIELDS_FOR_TESTS.iter().zip(&good).map(|((_, valid, _), pick)| *pick.get(valid)).collect();
        for (field, pick, bad) in changes {
            let (_, valid, invalid) = FIELDS_FOR_TESTS[field];
            texts[field] = if bad { *pick.get(invalid) } else { *pick.get(valid) };
        }
        let mut present: Vec<String> = FIELDS_FOR_TESTS
            .iter()
            .zip(texts)
            .filter(|(_, text)| !text.is_empty())
            .map(|((name, _, _), text)| format!("\"{name}\": {text}"))
            .collect();
        let repeated = repeat.map(|pick| pick.get(&present).clone());
        present.extend(repeated.clone());
        // A deterministic shuffle from the generated seed.
        let mut state = seed;
        for index in (1..present.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            present.swap(index, (state >> 33) as usize % (index + 1));
        }
        let text = format!("{{{}}}", present.join(", "));
        let fast = assert_fast_path_agrees(text.as_bytes());
        // Shell executors (and repeated keys) are left to the reference reader.
        let shell = text.contains(r#""kind": "shell""#);
        if repeated.is_none() && !shell && TaskSpec::parse_reference(text.as_bytes()).is_ok() {
            prop_assert!(fast.is_some(), "the fast path declined a valid spec: {}", text);
        }
    }
}

#[test]
fn valid_specs_round_trip_through_canonical_json() {
    for value in valid_specs() {
        let spec = TaskSpec::parse_value(value.clone()).unwrap_or_else(|e| panic!("{value}: {e}"));
        let canonical = spec.to_json();
        let again = TaskSpec::parse_value(canonical.clone()).unwrap_or_else(|e| panic!("{canonical}: {e}"));
        assert_eq!(again, spec, "{canonical}");
        assert_eq!(again.to_json(), canonical);
        // serde impls: the same canonical form, and back.
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), canonical);
        assert_eq!(serde_json::from_str::<TaskSpec>(&text).unwrap(), spec);
    }
}

/// A spec nested in another wire type (as in a dispatch) goes through `TaskSpec::parse`, from
/// text and from a `Value`, with the same structured error as on its own.
#[test]
fn a_nested_spec_deserializes_through_parse() {
    #[derive(serde::Deserialize)]
    struct Outer {
        spec: TaskSpec,
        after: u32,
    }
    for value in valid_specs() {
        let spec = TaskSpec::parse_value(value.clone()).unwrap();
        let outer = json!({"spec": value, "after": 7});
        let from_text: Outer = serde_json::from_slice(&serde_json::to_vec(&outer).unwrap()).unwrap();
        assert_eq!((from_text.spec, from_text.after), (spec.clone(), 7));
        let from_value: Outer = serde_json::from_value(outer).unwrap();
        assert_eq!(from_value.spec, spec);
    }
    let mut invalid = base();
    invalid["timeout"] = json!("-1s");
    let expected = TaskSpec::parse_value(invalid.clone()).unwrap_err().to_string();
    let text = serde_json::to_vec(&json!({"spec": invalid, "after": 1})).unwrap();
    let error = serde_json::from_slice::<Outer>(&text).err().expect("an invalid nested spec is refused");
    assert!(error.to_string().starts_with(&expected), "{error} / {expected}");
}

#[test]
fn canonical_forms_of_schedules_and_executors() {
    let specs: Vec<Value> =
        valid_specs().into_iter().map(|v| TaskSpec::parse_value(v).unwrap().to_json()).collect();
    assert_eq!(specs[1]["schedule"], json!({"every": "1h 30m", "anchor": "2026-01-01T08:00:00.250Z"}));
    assert_eq!(specs[1]["jitter"], json!({"spread": "10s", "max_random": "2s"}));
    assert_eq!(specs[2]["schedule"], json!({"at": "2030-02-03T04:05:06Z"}));
    assert_eq!(specs[2]["executor"]["cwd"], json!("/tmp"));
    assert_eq!(specs[2]["retry"]["max_interval"], json!("1m"));
    assert_eq!(specs[3]["schedule"], json!({"after": "10m"}));
    assert_eq!(specs[3]["retry"]["max_interval"], json!("2m"), "defaults to initial when initial > 60s");
    assert_eq!(specs[4]["executor"]["method"], json!("DELETE"));
}

#[test]
fn null_means_absent() {
    let spec = TaskSpec::parse(
        br#"{"id": "t", "namespace": null, "schedule": {"every": "1m", "anchor": null, "at": null},
             "executor": {"kind": "http", "url": "http://x/", "body": null, "headers": null},
             "retry": {"max_elapsed": null}, "jitter": null, "labels": null, "timeout": null}"#,
    )
    .unwrap();
    assert_eq!(spec.namespace, "default");
    assert_eq!(spec.jitter, None);
    assert_eq!(
        spec.executor,
        Executor::Http {
            method: "POST".into(),
            url: "http://x/".into(),
            headers: BTreeMap::new(),
            body: None
        }
    );
}

#[test]
fn deserialize_reports_the_api_error() {
    let e = serde_json::from_str::<TaskSpec>(r#"{"id": "x y"}"#).unwrap_err();
    assert!(e.to_string().contains("invalid_id at id"), "{e}");
}

#[test]
fn admit_turns_after_into_at_and_keeps_recent_at() {
    let spec = TaskSpec::parse_value(
        json!({"id": "a", "schedule": {"after": "10m"}, "executor": {"kind": "handler", "name": "h"}}),
    )
    .unwrap();
    let now: DateTime<Utc> = "2026-06-15T12:00:00.123456Z".parse().unwrap();
    let admitted = spec.admit(now).unwrap();
    assert_eq!(admitted.schedule, Schedule::At("2026-06-15T12:10:00.123Z".parse().unwrap()));

    // Within the catch-up window (default 1h) an `at` in the past is still admitted.
    let recent = TaskSpec::parse(&replaced("schedule", json!({"at": "2026-06-15T11:00:01Z"}))).unwrap();
    assert!(recent.clone().admit(now).is_ok());
    let narrow = TaskSpec::parse(&{
        let mut v = base();
        v["schedule"] = json!({"at": "2026-06-15T11:00:00Z"});
        v["catchup_window"] = json!("30m");
        serde_json::to_vec(&v).unwrap()
    })
    .unwrap();
    assert_eq!(narrow.admit(now).unwrap_err().code, ErrorCode::InThePast);
    // Cron and every pass through unchanged.
    let cron = TaskSpec::parse_value(base()).unwrap();
    assert_eq!(cron.clone().admit(now).unwrap(), cron);
}

#[test]
fn has_key_matches_exactly_the_built_key() {
    let spec = TaskSpec::parse(&serde_json::to_vec(&base()).unwrap()).unwrap();
    assert!(spec.has_key(&spec.key()));
    for other in
        ["billing.nightly-repor", "billing.nightly-report.x", "billing", "default.nightly-report", ""]
    {
        assert!(!spec.has_key(other), "{other}");
    }
}

#[test]
fn jitter_offset_is_a_stable_hash_of_the_key() {
    let mut v = base();
    v["jitter"] = json!({"spread": "10s"});
    let spec = TaskSpec::parse_value(v).unwrap();
    // FNV-1a 64 of "billing.nightly-report" = 729845311767235444; mod 10000 ms.
    assert_eq!(spec.jitter_offset(), Duration::from_millis(5444));
    let mut other = spec.clone();
    other.id = "other".into();
    assert!(other.jitter_offset() < Duration::from_secs(10));
    other.jitter = Some(Jitter { spread: None, max_random: Some(Duration::from_secs(1)) });
    assert_eq!(other.jitter_offset(), Duration::ZERO);
}

#[test]
fn backoff_grows_caps_and_jitters() {
    let retry = RetryPolicy::default();
    let secs = |(a, b): (Duration, Duration)| (a.as_secs_f64(), b.as_secs_f64());
    let close = |(a, b): (f64, f64), (x, y): (f64, f64)| (a - x).abs() < 1e-6 && (b - y).abs() < 1e-6;
    assert!(close(secs(retry.backoff(1)), (0.8, 1.2)));
    assert!(close(secs(retry.backoff(0)), (0.8, 1.2)), "0 is treated as 1");
    assert!(close(secs(retry.backoff(2)), (1.6, 2.4)));
    assert!(close(secs(retry.backoff(3)), (3.2, 4.8)));
    assert!(close(secs(retry.backoff(7)), (48.0, 72.0)), "64s capped at 60s");
    assert!(close(secs(retry.backoff(u32::MAX)), (48.0, 72.0)));
    assert_eq!(retry.delay_with(1, 0.0), retry.backoff(1).0);
    assert!((retry.delay_with(1, 0.5).as_secs_f64() - 1.0).abs() < 1e-6);
    assert!(retry.delay_with(1, 0.999_999) <= retry.backoff(1).1);
    assert_eq!(retry.delay_with(1, f64::NAN), retry.backoff(1).0);

    let exact = RetryPolicy { jitter: 0.0, multiplier: 3.0, ..RetryPolicy::default() };
    assert_eq!(exact.backoff(3), (Duration::from_secs(9), Duration::from_secs(9)));
    assert_eq!(exact.delay_with(5, 0.7), Duration::from_secs(60));

    assert!(retry.should_retry(1, Duration::from_secs(1)));
    assert!(!retry.should_retry(3, Duration::ZERO));
    let bounded = RetryPolicy { max_elapsed: Some(Duration::from_secs(10)), ..RetryPolicy::default() };
    assert!(!bounded.should_retry(1, Duration::from_secs(10)));
}

#[test]
fn validate_id_is_reusable() {
    assert!(validate_id("namespace", "billing_2-x").is_ok());
    let e = validate_id("namespace", "bad ns").unwrap_err();
    assert_eq!((e.code, e.field.as_deref()), (ErrorCode::InvalidId, Some("namespace")));
    assert!(validate_id("id", &"x".repeat(128)).is_ok());
}

/// Found by the `spec` fuzz target: a number in a payload must survive the canonical JSON
/// unchanged (serde_json's fast float parsing is not round-trip exact without
/// `float_roundtrip`).
#[test]
fn payload_numbers_round_trip_exactly() {
    let input = br#"{"id": "a", "schedule": {"every": "88s", "anchor": "2026-01-01T00:00:00.123Z"}, "executor": {"kind": "nats", "subject": "jo?l.a", "payload": {"x": 5555555555555555555544444444444444444444444444444444444445555551, "y": 0.1, "z": 1e-300}, "headers": {"K": "v"}}}"#;
    let spec = TaskSpec::parse(input).expect("valid spec");
    let canonical = serde_json::to_vec(&spec.to_json()).expect("serializes");
    assert_eq!(TaskSpec::parse(&canonical).expect("canonical form parses"), spec);
}

/// Specs with several problems: every one is reported with its field path, in the order the
/// reader meets them (unknown fields of an object first, then its fields in documented order,
/// which is the order these specs are written in).
#[test]
fn every_problem_of_a_spec_is_reported_with_its_path() {
    let nats = json!({"kind": "nats", "subject": "x"});
    type Expected = Vec<(ErrorCode, &'static str)>;
    let cases: Vec<(&str, Value, Expected)> = vec![
        (
            "three fields",
            json!({"id": "bad id", "schedule": {"cron": "nope"}, "executor": nats, "timeout": "forever"}),
            vec![(InvalidId, "id"), (InvalidCron, "schedule.cron"), (InvalidDuration, "timeout")],
        ),
        (
            "unknown fields and missing ones",
            json!({"colour": "red", "owner": "me"}),
            vec![
                (UnknownField, "colour"),
                (UnknownField, "owner"),
                (MissingField, "id"),
                (MissingField, "schedule"),
                (MissingField, "executor"),
            ],
        ),
        (
            "version, policies and the catch-up window",
            json!({"version": 2, "id": "t", "schedule": {"every": "1m"}, "executor": nats,
                   "misfire": "never", "catchup_window": "0s", "overlap": "queue"}),
            vec![
                (InvalidValue, "version"),
                (InvalidValue, "misfire"),
                (InvalidDuration, "catchup_window"),
                (InvalidValue, "overlap"),
            ],
        ),
        (
            "an unknown zone and a bad expression",
            json!({"id": "t", "schedule": {"cron": "0 60 * * * *", "timezone": "Mars/Base"}, "executor": nats}),
            vec![(UnknownTimezone, "schedule.timezone"), (InvalidCron, "schedule.cron")],
        ),
        (
            "schedule fields",
            json!({"id": "t", "schedule": {"every": "1ms 500us", "anchor": "yesterday", "timezone": "UTC",
                   "start": "now"}, "executor": nats}),
            vec![
                (UnknownField, "schedule.start"),
                (InvalidValue, "schedule.timezone"),
                (InvalidDuration, "schedule.every"),
                (InvalidValue, "schedule.anchor"),
            ],
        ),
        (
            "http executor",
            json!({"id": "t", "schedule": {"every": "1m"}, "executor": {"kind": "http", "method": "FETCH",
                   "url": "ftp://x/", "headers": {"X A": "1", "X-B": 2, "X-C": "ok"}, "subject": "s"}}),
            vec![
                (UnknownField, "executor.subject"),
                (InvalidValue, "executor.method"),
                (InvalidValue, "executor.url"),
                (InvalidValue, "executor.headers.X A"),
                (InvalidType, "executor.headers.X-B"),
            ],
        ),
        (
            "shell executor",
            json!({"id": "t", "schedule": {"every": "1m"}, "executor": {"kind": "shell",
                   "command": ["ls", 1, "a\u{0}"], "env": {"1X": "a", "OK": "b"}, "cwd": ""}}),
            vec![
                (InvalidType, "executor.command.1"),
                (InvalidValue, "executor.command.2"),
                (InvalidValue, "executor.env.1X"),
                (InvalidValue, "executor.cwd"),
            ],
        ),
        (
            "retry",
            json!({"id": "t", "schedule": {"every": "1m"}, "executor": nats, "retry": {"bogus": 1,
                   "max_attempts": 0, "initial": "0s", "multiplier": 0.5, "max_interval": "1s", "jitter": 2,
                   "max_elapsed": 5}}),
            vec![
                (UnknownField, "retry.bogus"),
                (InvalidValue, "retry.max_attempts"),
                (InvalidDuration, "retry.initial"),
                (InvalidValue, "retry.multiplier"),
                (InvalidValue, "retry.jitter"),
                (InvalidType, "retry.max_elapsed"),
            ],
        ),
        (
            "jitter, paused and labels",
            json!({"id": "t", "schedule": {"every": "1m"}, "executor": nats,
                   "jitter": {"spread": "wide", "max_random": "x"}, "paused": "yes",
                   "labels": {"bad key": "x", "team": 1, "ok": "fine"}}),
            vec![
                (InvalidDuration, "jitter.spread"),
                (InvalidDuration, "jitter.max_random"),
                (InvalidType, "paused"),
                (InvalidId, "labels.bad key"),
                (InvalidType, "labels.team"),
            ],
        ),
        (
            "breaker and auto-pause",
            json!({"id": "t", "schedule": {"every": "1m"}, "executor": nats, "paused_reason": "",
                   "breaker": {"mode": "x", "key": "a b", "failure_rate": 2, "min_runs": -1,
                   "window": "1h", "open_for": "1m", "max_open_for": "30s", "half_open_runs": 0,
                   "on_open": "wait"}, "pause_after_failures": 0}),
            vec![
                (InvalidValue, "paused_reason"),
                (UnknownField, "breaker.mode"),
                (InvalidId, "breaker.key"),
                (InvalidValue, "breaker.failure_rate"),
                (InvalidValue, "breaker.min_runs"),
                (InvalidValue, "breaker.max_open_for"),
                (InvalidValue, "breaker.half_open_runs"),
                (InvalidValue, "breaker.on_open"),
                (InvalidValue, "pause_after_failures"),
            ],
        ),
        (
            "a nested object of the wrong type and the fields after it",
            json!({"id": "t", "schedule": "@daily", "queue": "q*", "executor": [], "timeout": "25h"}),
            vec![
                (InvalidType, "schedule"),
                (InvalidId, "queue"),
                (InvalidType, "executor"),
                (InvalidValue, "timeout"),
            ],
        ),
    ];
    for (name, spec, expected) in cases {
        let bytes = serde_json::to_vec(&spec).unwrap();
        let errors = TaskSpec::parse(&bytes).expect_err(name);
        assert_eq!(
            TaskSpec::parse_reference(&bytes).as_ref(),
            Err(&errors),
            "{name}: parse and the reference"
        );
        let got: Vec<(ErrorCode, &str)> =
            errors.as_slice().iter().map(|e| (e.code, e.field.as_deref().unwrap_or(""))).collect();
        assert_eq!(got, expected, "{name}: {errors}");
        assert!(errors.as_slice().iter().all(|e| !e.message.is_empty()), "{name}: an empty message");
    }
}

/// The envelope of a refusal: `error` is the first of `errors`; a reply without `errors` (from
/// an older registry) still gives its one error.
#[test]
fn an_error_reply_carries_the_first_error_and_the_list() {
    let errors = TaskSpec::parse(br#"{"id": "a b", "schedule": {"every": "0s"}, "executor": {"kind": "x"}}"#)
        .unwrap_err();
    let reply = serde_json::to_value(crate::error::ErrorReply::new(&errors)).unwrap();
    assert_eq!(reply["error"], reply["errors"][0]);
    let fields: Vec<&str> =
        reply["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["id", "schedule.every", "executor.kind"]);
    let back: crate::error::ErrorReply = serde_json::from_value(reply).unwrap();
    assert_eq!(back.into_errors(), errors);
    let old: crate::error::ErrorReply =
        serde_json::from_value(json!({"error": {"code": "not_found", "message": "no task"}})).unwrap();
    assert_eq!(old.into_errors().as_slice().len(), 1);
    let each: Vec<String> = errors.as_slice().iter().map(ToString::to_string).collect();
    assert_eq!(errors.to_string(), each.join("; "));
}

#[test]
fn breaker_defaults_canonical_form_and_bucket_key() {
    let spec = TaskSpec::parse(&patched(json!({"breaker": {}, "pause_after_failures": 3}))).unwrap();
    let breaker = spec.breaker.clone().unwrap();
    assert_eq!(breaker, BreakerSpec::default());
    // The documented defaults.
    let BreakerSpec { key, failure_rate, min_runs, window, open_for, max_open_for, half_open_runs, on_open } =
        breaker.clone();
    let secs = Duration::from_secs;
    assert_eq!((key, failure_rate, min_runs, half_open_runs, on_open), (None, 0.5, 10, 1, OnOpen::Delay));
    assert_eq!((window, open_for, max_open_for), (secs(60), secs(30), secs(600)));
    assert_eq!(spec.pause_after_failures, Some(3));
    assert_eq!(spec.paused_reason, None);
    assert_eq!(
        spec.to_json()["breaker"],
        json!({"failure_rate": 0.5, "min_runs": 10, "window": "1m", "open_for": "30s",
               "max_open_for": "10m", "half_open_runs": 1, "on_open": "delay"})
    );
    assert_eq!(spec.to_json()["pause_after_failures"], json!(3));
    let (none_shared, all_shared) = (|_: &str| false, |_: &str| true);
    assert_eq!(breaker.bucket_key("billing", "nightly-report", none_shared), "task.billing.nightly-report");
    assert_eq!(breaker.bucket_key("billing", "nightly-report", all_shared), "task.billing.nightly-report");
    let named = BreakerSpec { key: Some("payments-api".into()), ..breaker };
    // A named breaker belongs to the task's namespace, unless its key is declared shared.
    assert_eq!(named.bucket_key("billing", "nightly-report", none_shared), "key.billing.payments-api");
    assert_eq!(named.bucket_key("demo", "nightly-report", none_shared), "key.demo.payments-api");
    assert_eq!(named.bucket_key("billing", "nightly-report", all_shared), "key.=shared.payments-api");
    assert_eq!(named.bucket_key("demo", "other", |k: &str| k == "payments-api"), "key.=shared.payments-api");
    // A long open period raises the default ceiling with it.
    let long = TaskSpec::parse(&patched(json!({"breaker": {"open_for": "20m"}}))).unwrap();
    assert_eq!(long.breaker.unwrap().max_open_for, Duration::from_secs(1200));
    // Without the new fields the canonical form has none of them.
    let plain = TaskSpec::parse(&serde_json::to_vec(&base()).unwrap()).unwrap().to_json();
    for key in ["breaker", "pause_after_failures", "paused_reason"] {
        assert!(plain.get(key).is_none(), "{key} in {plain}");
    }
    let paused = TaskSpec::parse(&patched(json!({"paused": true, "paused_reason": "maintenance"}))).unwrap();
    assert_eq!(paused.paused_reason.as_deref(), Some("maintenance"));
    assert_eq!(TaskSpec::parse_value(paused.to_json()).unwrap(), paused);
}

#[test]
fn priority_defaults_to_normal_and_is_validated() {
    let base = r#"{"id": "t1", "schedule": {"every": "1m"}, "executor": {"kind": "nats", "subject": "s"}"#;
    let spec = TaskSpec::parse(format!("{base}}}").as_bytes()).unwrap();
    assert_eq!(spec.priority, Priority::Normal);
    assert!(spec.to_json().get("priority").is_none(), "normal is not written");
    let spec = TaskSpec::parse(format!(r#"{base}, "priority": "critical"}}"#).as_bytes()).unwrap();
    assert_eq!(spec.priority, Priority::Critical);
    assert_eq!(spec.to_json()["priority"], "critical");
    assert_eq!(TaskSpec::parse_value(spec.to_json()).unwrap(), spec);
    let errors =
        TaskSpec::parse(format!(r#"{base}, "priority": "urgent", "queue": "a.b"}}"#).as_bytes()).unwrap_err();
    let fields: Vec<_> = errors.as_slice().iter().map(|e| e.field.clone().unwrap_or_default()).collect();
    assert_eq!(fields, ["queue", "priority"], "{errors:?}");
}

#[test]
fn a_concurrency_key_is_expanded_from_the_specs_own_values() {
    let spec = TaskSpec::parse(&patched(
        json!({"concurrency": {"key": "pay-{labels.team}", "limit": 2}, "labels": {"team": "billing"}}),
    ))
    .unwrap();
    let concurrency = spec.concurrency.clone().unwrap();
    assert_eq!(concurrency.limit, 2);
    assert_eq!(concurrency.expand(&spec.namespace, &spec.id, &spec.labels).unwrap(), "pay-billing");
    assert_eq!(spec.to_json()["concurrency"], json!({"key": "pay-{labels.team}", "limit": 2}));
}

// ---- bounds: start_at, end_at, max_runs --------------------------------------------------

fn bounded(patch: Value) -> Result<TaskSpec, ApiErrors> {
    let mut spec = json!({
        "id": "bounded",
        "schedule": {"every": "10s"},
        "executor": {"kind": "nats", "subject": "work.bounded"}
    });
    merge(&mut spec, &patch);
    parse_and_admit(&serde_json::to_vec(&spec).unwrap())
}

#[test]
fn bounds_refuse_every_problem_at_once() {
    let errors = bounded(json!({"start_at": "soon", "end_at": "2027-01-01T00:00:00", "max_runs": 0}))
        .expect_err("three problems");
    let fields: Vec<_> =
        errors.as_slice().iter().map(|e| (e.code, e.field.as_deref().unwrap_or(""))).collect();
    assert_eq!(fields, [(InvalidValue, "start_at"), (InvalidValue, "max_runs")]);
    let errors = bounded(json!({
        "start_at": "2027-02-01T00:00:00Z", "end_at": "2027-01-01T00:00:00Z", "max_runs": 10_001
    }))
    .expect_err("two problems");
    let fields: Vec<_> = errors.as_slice().iter().map(|e| e.field.as_deref().unwrap_or("")).collect();
    assert_eq!(fields, ["max_runs", "end_at"]);
    // Both readers refuse alike.
    let bytes = br#"{"id":"x","schedule":{"at":"2026-07-01T00:00:00Z"},"executor":{"kind":"nats","subject":"s"},"start_at":"2026-06-30T00:00:00Z","max_runs":3}"#;
    let fields = |r: Result<TaskSpec, ApiErrors>| -> Vec<String> {
        r.expect_err("one-shot bounds")
            .as_slice()
            .iter()
            .map(|e| e.field.clone().unwrap_or_default())
            .collect()
    };
    assert_eq!(fields(TaskSpec::parse(bytes)), ["start_at", "max_runs"]);
    assert_eq!(fields(TaskSpec::parse_reference(bytes)), ["start_at", "max_runs"]);
    let after = br#"{"id":"x","schedule":{"after":"5m"},"executor":{"kind":"nats","subject":"s"},"end_at":"2026-06-30T00:00:00Z"}"#;
    assert_eq!(fields(TaskSpec::parse(after)), ["end_at"]);
}

#[test]
fn bounds_read_wall_times_on_the_schedule_zone_and_keep_the_instant() {
    let spec = bounded(json!({
        "schedule": {"every": null, "cron": "0 0 9 * * *", "timezone": "Europe/Paris"},
        "start_at": "2026-07-01T00:00:00", "end_at": "2026-08-01T00:00:00+02:00", "max_runs": 5
    }))
    .expect("valid");
    assert_eq!(spec.start_at, Some("2026-06-30T22:00:00Z".parse().unwrap()));
    assert_eq!(spec.end_at, Some("2026-07-31T22:00:00Z".parse().unwrap()));
    assert_eq!(spec.max_runs, Some(5));
    let json = spec.to_json();
    assert_eq!(json["start_at"], "2026-06-30T22:00:00Z");
    assert_eq!(json["max_runs"], 5);
    assert_eq!(TaskSpec::parse_value(json.clone()), Ok(spec.clone()), "the canonical form reads back");
    assert_eq!(TaskSpec::parse(&serde_json::to_vec(&json).unwrap()), Ok(spec), "the fast path agrees");
}

#[test]
fn admission_anchors_max_runs_at_registration_and_refuses_a_spent_window() {
    let spec = bounded(json!({"max_runs": 3})).expect("valid");
    assert_eq!(spec.start_at, Some(now()), "the count starts at registration");
    // Admitting the stored form again keeps the anchor.
    let again = spec.clone().admit(now() + chrono::TimeDelta::hours(1)).expect("still has fires");
    assert_eq!(again.start_at, spec.start_at);
    let spent = bounded(json!({"end_at": "2026-06-15T10:00:00Z"})).expect_err("ended two hours ago");
    assert_eq!((spent.first().code, spent.first().field.as_deref()), (InThePast, Some("end_at")));
    let counted = bounded(json!({"start_at": "2026-06-14T00:00:00Z", "max_runs": 2})).expect_err("done");
    assert_eq!((counted.first().code, counted.first().field.as_deref()), (InThePast, Some("max_runs")));
}

#[test]
fn every_overlap_policy_reads_by_its_name_and_is_written_back_the_same() {
    use OverlapPolicy::*;
    for policy in [Allow, Skip, BufferOne, CancelOther, Replace] {
        let text = format!(
            r#"{{"id": "t", "schedule": {{"every": "1m"}}, "executor": {{"kind": "handler", "name": "h"}},
                "overlap": "{}"}}"#,
            policy.as_str()
        );
        let spec = TaskSpec::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e:?}", policy.as_str()));
        assert_eq!(spec.overlap, policy);
        let again = TaskSpec::parse(&serde_json::to_vec(&spec.to_json()).expect("json")).expect("reads back");
        assert_eq!(again.overlap, policy, "{}", policy.as_str());
    }
}
