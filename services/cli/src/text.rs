//! Readable text for what the API answers in JSON: a task's schedule and settings in words,
//! aligned `key: value` lines, one line per event, a dead letter with its attempts. `--json`
//! prints the JSON itself instead.

use serde_json::{Map, Value};

use crate::output::{self, outln};

/// A schedule object in words: `cron 0 30 2 * * * in Asia/Shanghai`, `every 5s`,
/// `once at 2027-01-15T08:00:00.000Z`, `once, 10m after registration`.
pub(crate) fn schedule(schedule: &Value) -> String {
    let text = |key: &str| schedule.get(key).and_then(Value::as_str);
    if let Some(cron) = text("cron") {
        format!("cron {cron} in {}", text("timezone").unwrap_or("UTC"))
    } else if let Some(every) = text("every") {
        format!("every {every}")
    } else if let Some(at) = text("at") {
        format!("once at {at}")
    } else if let Some(after) = text("after") {
        format!("once, {after} after registration")
    } else {
        schedule.to_string()
    }
}

/// An executor in words: `http POST <url>`, `nats request to <subject>`, `shell <command>`,
/// `handler <name>`, then its other settings (`headers`, `body`, ...) as `key=value`.
pub(crate) fn executor(executor: &Value) -> String {
    let Some(object) = executor.as_object() else { return words(executor) };
    let text = |key: &str| object.get(key).map(words).unwrap_or_default();
    let (head, shown): (String, &[&str]) = match text("kind").as_str() {
        "http" => (format!("http {} {}", text("method"), text("url")), &["kind", "method", "url"]),
        "nats" => (format!("nats request to {}", text("subject")), &["kind", "subject"]),
        "shell" => (format!("shell {}", text("command")), &["kind", "command"]),
        "handler" => (format!("handler {}", text("name")), &["kind", "name"]),
        _ => return words(executor),
    };
    let rest: Map<String, Value> = object
        .iter()
        .filter(|(key, _)| !shown.contains(&key.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match words(&Value::Object(rest)).as_str() {
        "-" => head,
        rest => format!("{head} ({rest})"),
    }
}

/// Any JSON value in words: a string as is, an array joined with spaces, an object as
/// `key=value, ...` (nothing left out), `-` for nothing.
pub(crate) fn words(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(text) => text.clone(),
        Value::Array(items) if items.is_empty() => "-".into(),
        Value::Array(items) => items.iter().map(words).collect::<Vec<_>>().join(" "),
        Value::Object(object) if object.values().all(is_empty) => "-".into(),
        Value::Object(object) => object
            .iter()
            .filter(|(_, v)| !is_empty(v))
            .map(|(k, v)| match v {
                Value::String(text) => format!("{k}={text}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(object) => object.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Prints `key: value` lines with the values aligned.
pub(crate) fn pairs(lines: &[(String, String)]) {
    let width = lines.iter().map(|(key, _)| key.chars().count()).max().unwrap_or(0) + 2;
    for (key, value) in lines {
        outln!("{:<width$}{value}", format!("{key}:"));
    }
}

/// One line of an event: time, kind, task, execution (short), and a short detail.
pub(crate) fn event_line(event: &Value) -> String {
    let text = |key: &str| event.get(key).and_then(Value::as_str).unwrap_or("");
    let number = |key: &str| event.get(key).and_then(Value::as_u64);
    let time = text("time").replace('T', " ").trim_end_matches('Z').to_string();
    let task = format!("{}/{}", text("namespace"), text("task_id"));
    let execution: String = text("execution_id").chars().take(8).collect();
    let mut detail = Vec::new();
    if let Some(attempt) = number("attempt") {
        detail.push(format!("attempt {attempt}"));
    }
    if !text("worker").is_empty() {
        detail.push(format!("on {}", text("worker")));
    }
    if let Some(ms) = number("run_duration_ms") {
        detail.push(format!("run took {}", output::short_duration(ms as i64)));
    } else if let Some(ms) = number("duration_ms") {
        detail.push(format!("attempt took {}", output::short_duration(ms as i64)));
    }
    for key in ["trigger", "reason", "state", "instance"] {
        if !text(key).is_empty() {
            detail.push(format!("{key} {}", text(key)));
        }
    }
    if let Some(term) = number("term") {
        detail.push(format!("term {term}"));
    }
    if let Some(revision) = number("revision") {
        detail.push(format!("revision {revision}"));
    }
    if !text("release_at").is_empty() {
        detail.push(format!("until {}", text("release_at")));
    }
    if !text("error").is_empty() {
        detail.push(format!("error: {}", output::cut(&text("error").replace('\n', " "), 60)));
    }
    let line = format!("{time:<23}  {:<16}  {task}  {execution:<8}  {}", text("kind"), detail.join(", "));
    line.trim_end().to_string()
}

/// Prints one event: its line of text, or its JSON with `json_out`.
pub(crate) fn print_event(event: &Value, json_out: bool) {
    if json_out {
        outln!("{event}");
    } else {
        outln!("{}", event_line(event));
    }
}

/// `dlq show`: the entry's facts, its spec in words, then every attempt as a table.
pub(crate) fn dead_letter(reply: &Value) {
    let entry = &reply["entry"];
    let text = |key: &str| entry.get(key).map(words).unwrap_or_else(|| "-".into());
    let mut lines = vec![
        ("sequence".to_string(), words(&reply["sequence"])),
        ("task".into(), format!("{}/{}", text("namespace"), text("task_id"))),
        ("execution".into(), text("execution_id")),
        ("queue".into(), text("queue")),
        ("priority".into(), text("priority")),
        ("nominal time".into(), text("nominal_time")),
        ("trigger".into(), text("trigger")),
        ("reason".into(), text("reason")),
        ("source".into(), text("source")),
        ("dead at".into(), text("dead_at")),
        ("worker".into(), text("worker")),
        ("trace id".into(), text("trace_id")),
    ];
    if let Some(spec) = entry.get("spec").filter(|s| s.is_object()) {
        lines.push(("schedule".into(), schedule(&spec["schedule"])));
        lines.push(("executor".into(), executor(&spec["executor"])));
        lines.push(("spec revision".into(), text("revision")));
    } else if let Some(raw) = entry.get("raw_dispatch").filter(|r| !r.is_null()) {
        lines.push(("raw dispatch".into(), words(raw)));
    }
    pairs(&lines);
    let attempts = entry.get("attempts").and_then(Value::as_array).cloned().unwrap_or_default();
    outln!();
    let rows: Vec<Vec<String>> = attempts
        .iter()
        .map(|a| {
            let field = |key: &str| a.get(key).map(words).unwrap_or_default();
            let detail = field("detail").replace('\n', " ");
            vec![
                field("attempt"),
                field("worker"),
                field("started"),
                field("finished"),
                field("outcome"),
                [field("error"), detail]
                    .into_iter()
                    .filter(|t| !t.is_empty() && t != "-")
                    .collect::<Vec<_>>()
                    .join(": "),
            ]
        })
        .collect();
    output::table(&["ATTEMPT", "WORKER", "STARTED", "FINISHED", "OUTCOME", "ERROR"], &rows);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn schedules_and_executors_read_as_words() {
        let cron = json!({"cron": "0 30 2 * * *", "timezone": "Asia/Shanghai"});
        assert_eq!(schedule(&cron), "cron 0 30 2 * * * in Asia/Shanghai");
        assert_eq!(schedule(&json!({"every": "5s", "anchor": "2026-01-01T00:00:00.000Z"})), "every 5s");
        assert_eq!(schedule(&json!({"at": "2027-01-15T08:00:00.000Z"})), "once at 2027-01-15T08:00:00.000Z");
        let http = json!({"kind": "http", "method": "POST", "url": "http://r/run", "headers": {}, "body": {"day": "y"}});
        assert_eq!(executor(&http), r#"http POST http://r/run (body={"day":"y"})"#);
        assert_eq!(
            executor(&json!({"kind": "nats", "subject": "jobs.x", "headers": {}})),
            "nats request to jobs.x"
        );
        let retry = json!({"max_attempts": 4, "initial": "1s", "multiplier": 2.0});
        assert_eq!(words(&retry), "initial=1s, max_attempts=4, multiplier=2.0");
        assert_eq!(words(&json!({})), "-");
    }

    #[test]
    fn an_event_is_one_line_with_its_detail() {
        let event = json!({"kind": "run.succeeded", "time": "2026-12-05T12:30:01.123Z", "namespace": "billing",
            "task_id": "nightly", "execution_id": "0194f3c2-7d1e-7b11", "attempt": 2, "worker": "w1",
            "duration_ms": 300, "run_duration_ms": 4200});
        assert_eq!(
            event_line(&event),
            "2026-12-05 12:30:01.123  run.succeeded     billing/nightly  0194f3c2  attempt 2, on w1, run took 4.2s"
        );
        let paused = json!({"kind": "task.paused", "time": "2026-12-05T12:30:01.123Z", "namespace": "ops",
            "task_id": "a", "revision": 3, "reason": "maintenance"});
        assert_eq!(
            event_line(&paused),
            "2026-12-05 12:30:01.123  task.paused       ops/a            reason maintenance, revision 3"
        );
    }
}
