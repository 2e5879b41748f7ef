//! The schema file is current, and it agrees with the spec reader on the examples and on
//! refused specs.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{SCHEMA_PATH, json_schema, json_schema_text};
use crate::spec::TaskSpec;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("shared sits in the workspace").to_owned()
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&json_schema()).expect("the generated schema compiles")
}

#[test]
fn the_schema_is_a_valid_draft_2020_12_schema() {
    jsonschema::meta::validate(&json_schema()).expect("the schema follows its meta-schema");
}

/// `JETSCHED_BLESS=1` writes the file instead of comparing.
#[test]
fn the_schema_file_is_current() {
    let path = workspace_root().join(SCHEMA_PATH);
    let text = json_schema_text();
    if std::env::var_os("JETSCHED_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &text).expect("write the schema");
        return;
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        kept == text,
        "{SCHEMA_PATH} differs from the spec types' schema; regenerate it with\n  \
         JETSCHED_BLESS=1 cargo test -p jetsched-shared --lib schema_file"
    );
}

#[test]
fn every_deploy_example_is_valid_for_the_schema_and_the_reader() {
    let validator = validator();
    let dir = workspace_root().join("deploy/examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("deploy/examples") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("an example");
        let spec: Value = serde_json::from_str(&text).expect("an example is JSON");
        let problems: Vec<String> =
            validator.iter_errors(&spec).map(|e| format!("{e} at {}", e.instance_path())).collect();
        assert!(problems.is_empty(), "{}: {problems:?}", path.display());
        let parsed = TaskSpec::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The canonical form, every default written out, is a valid spec too.
        assert!(validator.is_valid(&parsed.to_json()), "{}: canonical form", path.display());
        seen += 1;
    }
    assert!(seen >= 3, "expected the deploy examples in {}", dir.display());
}

/// A spec with every field given, in each executor kind.
fn full(executor: Value, schedule: Value) -> Value {
    json!({
        "version": 1, "id": "nightly-report", "namespace": "billing",
        "schedule": schedule, "queue": "reports", "priority": "high",
        "executor": executor,
        "timeout": "5m",
        "retry": {"max_attempts": 4, "initial": "1s", "multiplier": 2.0, "max_interval": "30s", "jitter": 0.3, "max_elapsed": "10m"},
        "misfire": "fire_all", "catchup_window": "1h", "overlap": "buffer_one",
        "jitter": {"spread": "10s", "max_random": "1s"},
        "paused": true, "paused_reason": "maintenance",
        "breaker": {"key": "reports-db", "failure_rate": 0.5, "min_runs": 10, "window": "1m",
                    "open_for": "30s", "max_open_for": "10m", "half_open_runs": 1, "on_open": "skip"},
        "pause_after_failures": 3,
        "labels": {"team": "billing"}
    })
}

#[test]
fn full_specs_of_every_kind_are_valid_for_both() {
    let validator = validator();
    let executors = [
        json!({"kind": "http", "method": "post", "url": "https://reports.internal/run", "headers": {"X-Team": "billing"}, "body": {"day": null}}),
        json!({"kind": "nats", "subject": "reports.run", "payload": [1, 2], "headers": {"Trace": "1"}}),
        json!({"kind": "shell", "command": ["echo", "hi"], "env": {"LANG": "C"}, "cwd": "/tmp"}),
        json!({"kind": "handler", "name": "reports.nightly", "payload": "x"}),
    ];
    let schedules = [
        json!({"cron": "0 30 2 * * *", "timezone": "Asia/Shanghai"}),
        json!({"every": "90s", "anchor": "2026-01-01T00:00:00Z"}),
        json!({"at": "2026-03-01T09:00:00.250+01:00"}),
        json!({"after": "1h 30m"}),
    ];
    for (executor, schedule) in executors.into_iter().zip(schedules) {
        let spec = full(executor, schedule);
        assert!(validator.is_valid(&spec), "schema refused {spec}");
        TaskSpec::parse_value(spec.clone()).unwrap_or_else(|e| panic!("reader refused {spec}: {e}"));
    }
}

#[test]
fn refused_specs_are_refused_by_both() {
    let validator = validator();
    let base =
        || json!({"id": "t", "schedule": {"every": "5s"}, "executor": {"kind": "handler", "name": "h"}});
    let with = |pointer: &str, value: Value| {
        let mut spec = base();
        *spec.pointer_mut(pointer).unwrap_or_else(|| panic!("{pointer}")) = value;
        spec
    };
    let cases = [
        ("unknown field", {
            let mut s = base();
            s["colour"] = json!("blue");
            s
        }),
        ("missing id", {
            let mut s = base();
            s.as_object_mut().map(|o| o.remove("id"));
            s
        }),
        ("bad id", with("/id", json!("no spaces"))),
        ("two schedule kinds", with("/schedule", json!({"every": "5s", "after": "1m"}))),
        ("timezone without cron", with("/schedule", json!({"every": "5s", "timezone": "UTC"}))),
        ("numeric duration", with("/schedule", json!({"every": 5}))),
        ("unknown executor kind", with("/executor", json!({"kind": "ftp"}))),
        (
            "executor field of another kind",
            with("/executor", json!({"kind": "handler", "name": "h", "url": "http://x"})),
        ),
        ("http without url", with("/executor", json!({"kind": "http"}))),
        ("bad method", with("/executor", json!({"kind": "http", "url": "http://x", "method": "BREW"}))),
        ("empty command", with("/executor", json!({"kind": "shell", "command": []}))),
        ("wildcard subject", with("/executor", json!({"kind": "nats", "subject": "a.>"}))),
        ("unknown misfire", {
            let mut s = base();
            s["misfire"] = json!("sometimes");
            s
        }),
        ("version 2", {
            let mut s = base();
            s["version"] = json!(2);
            s
        }),
        ("null id", with("/id", Value::Null)),
        ("null executor kind", with("/executor/kind", Value::Null)),
        ("empty jitter", {
            let mut s = base();
            s["jitter"] = json!({});
            s
        }),
        ("reason on a running task", {
            let mut s = base();
            s["paused_reason"] = json!("why");
            s
        }),
        ("retry jitter above 1", {
            let mut s = base();
            s["retry"] = json!({"jitter": 1.5});
            s
        }),
        ("breaker failure rate 0", {
            let mut s = base();
            s["breaker"] = json!({"failure_rate": 0});
            s
        }),
        ("bad label key", {
            let mut s = base();
            s["labels"] = json!({"no spaces": "x"});
            s
        }),
    ];
    assert!(validator.is_valid(&base()));
    // `null` is an absent field: an optional one takes its default.
    let nulls = json!({"id": "t", "schedule": {"every": "5s", "anchor": null}, "executor": {"kind": "handler", "name": "h", "payload": null},
                       "timeout": null, "retry": {"jitter": null}, "priority": null, "labels": null, "jitter": null});
    assert!(validator.is_valid(&nulls), "schema refused {nulls}");
    TaskSpec::parse_value(nulls).expect("the reader takes null for absent");
    for (what, spec) in cases {
        assert!(!validator.is_valid(&spec), "schema accepted {what}: {spec}");
        assert!(TaskSpec::parse_value(spec.clone()).is_err(), "reader accepted {what}: {spec}");
    }
}
