//! `jetsched ls` and `jetsched get`: stored tasks with the status the registry reports for each
//! (state, next and last fire, last outcome, recent success rate), as a table, aligned lines or
//! JSON.

use anyhow::Context;
use clap::ValueEnum;
use jetsched_shared::wire::{ListRequest, RECENT_RUNS, TaskState, TaskStatus, format_time};
use serde::Deserialize;
use serde_json::Value;

use crate::api::{Api, Failure, task_ref};
use crate::output;
use crate::text;

/// The fields of a stored task (`{"task": spec, "revision": n, "status": {...}}`) that `apply`,
/// `ls` and `get` show; tolerant of spec fields this CLI does not know.
#[derive(Deserialize)]
pub(crate) struct Stored {
    pub(crate) task: TaskView,
    pub(crate) revision: u64,
    #[serde(default)]
    status: Option<TaskStatus>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct TaskView {
    pub(crate) namespace: String,
    pub(crate) id: String,
    schedule: Value,
    executor: Value,
    queue: String,
    priority: Option<String>,
    paused: bool,
    paused_reason: Option<String>,
    breaker: Option<Value>,
    max_runs: Option<u32>,
}

/// A task state as `ls --state` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StateFilter {
    Active,
    Paused,
    Completed,
}

/// What `ls` keeps besides the registry's own filters (namespace, labels).
#[derive(Debug, Default)]
pub(crate) struct Filters {
    pub(crate) state: Option<StateFilter>,
    pub(crate) queue: Option<String>,
    pub(crate) priority: Option<String>,
}

impl Stored {
    /// The state by the shared rule: the registry's, or, from a registry that reports none,
    /// what the spec alone tells.
    fn state(&self) -> TaskState {
        self.status.as_ref().map(|s| s.state).unwrap_or_else(|| {
            TaskState::derive(TaskState::one_shot_at(&self.task.schedule), self.task.paused, None)
        })
    }

    fn priority(&self) -> &str {
        self.task.priority.as_deref().unwrap_or("normal")
    }

    /// `active`, `completed`, `paused` or `paused: <reason>`.
    fn state_text(&self) -> String {
        match (self.state(), &self.task.paused_reason) {
            (TaskState::Paused, Some(reason)) => format!("paused: {reason}"),
            (state, _) => state.as_str().to_string(),
        }
    }

    /// The breaker runs go through: its key, `own` (the task's own), or `-`.
    fn breaker(&self) -> String {
        match &self.task.breaker {
            Some(breaker) => breaker.get("key").and_then(Value::as_str).unwrap_or("own").to_string(),
            None => "-".into(),
        }
    }

    fn keep(&self, filters: &Filters) -> bool {
        let state = match filters.state {
            None => true,
            Some(StateFilter::Active) => self.state() == TaskState::Active,
            Some(StateFilter::Paused) => self.state() == TaskState::Paused,
            Some(StateFilter::Completed) => self.state() == TaskState::Completed,
        };
        state
            && filters.queue.as_ref().is_none_or(|queue| *queue == self.task.queue)
            && filters.priority.as_ref().is_none_or(|priority| priority == self.priority())
    }
}

/// `86% of 7`: the share of the last runs that succeeded, `-` before any ended.
fn success_rate(status: Option<&TaskStatus>) -> String {
    match status {
        Some(s) if s.recent_runs > 0 => {
            let percent = f64::from(s.recent_succeeded) * 100.0 / f64::from(s.recent_runs);
            format!("{percent:.0}% of {}", s.recent_runs)
        }
        _ => "-".into(),
    }
}

/// An instant compact (`12-05 14:30:00`, UTC), or `-`.
fn when(time: Option<chrono::DateTime<chrono::Utc>>) -> String {
    time.map_or_else(|| "-".into(), |t| t.format("%m-%d %H:%M:%S").to_string())
}

pub(crate) async fn list(
    api: &Api,
    namespace: Option<String>,
    labels: &[String],
    filters: &Filters,
    json_out: bool,
) -> Result<(), Failure> {
    let mut request = ListRequest { namespace, limit: Some(1000), ..ListRequest::default() };
    for label in labels {
        let (k, v) =
            label.split_once('=').ok_or_else(|| anyhow::anyhow!("--label {label:?}: use key=value"))?;
        request.labels.insert(k.to_string(), v.to_string());
    }
    /// A page of `list`, its tasks kept as JSON for `--json`.
    #[derive(Deserialize)]
    struct Page {
        #[serde(default)]
        tasks: Vec<Value>,
        #[serde(default)]
        next_cursor: Option<String>,
    }
    let tasks = crate::api::every_page(async |cursor| {
        request.cursor = cursor;
        let page: Page = match request.namespace.clone() {
            Some(namespace) => api.task_in("list", &namespace, &request).await?,
            None => api.task("list", &request).await?,
        };
        Ok((page.tasks, page.next_cursor))
    })
    .await?;
    let mut kept = Vec::with_capacity(tasks.len());
    for value in tasks {
        let stored: Stored = serde_json::from_value(value.clone()).context("list reply")?;
        if stored.keep(filters) {
            kept.push((value, stored));
        }
    }
    if json_out {
        output::pretty(&Value::Array(kept.into_iter().map(|(value, _)| value).collect()));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = kept
        .iter()
        .map(|(_, t)| {
            let status = t.status.as_ref();
            vec![
                format!("{}/{}", t.task.namespace, t.task.id),
                text::schedule(&t.task.schedule),
                t.state_text(),
                when(status.and_then(|s| s.next_fire)),
                when(status.and_then(|s| s.last_fire)),
                status.and_then(|s| s.last_outcome).map_or_else(|| "-".into(), |o| o.as_str().to_string()),
                success_rate(status),
                t.priority().to_string(),
                t.breaker(),
                t.task.queue.clone(),
            ]
        })
        .collect();
    let ok = format!("OK (LAST {RECENT_RUNS})");
    output::table(
        &[
            "TASK",
            "SCHEDULE",
            "STATE",
            "NEXT FIRE (UTC)",
            "LAST FIRE (UTC)",
            "LAST OUTCOME",
            &ok,
            "PRIORITY",
            "BREAKER",
            "QUEUE",
        ],
        &rows,
    );
    Ok(())
}

/// `jetsched get`: the task as aligned lines (its status first, then every setting of its
/// spec in words), or the registry's reply as JSON.
pub(crate) async fn get(api: &Api, task: &str, json_out: bool) -> Result<(), Failure> {
    let reference = task_ref(task);
    let reply: Value = api.task_in("get", &reference.namespace, &reference).await?;
    if json_out {
        output::pretty(&reply);
        return Ok(());
    }
    let stored: Stored = serde_json::from_value(reply.clone()).context("get reply")?;
    let status = stored.status.as_ref();
    let instant = |t: Option<chrono::DateTime<chrono::Utc>>| t.map_or_else(|| "-".into(), format_time);
    let mut lines: Vec<(String, String)> = vec![
        ("task".into(), format!("{}/{}", stored.task.namespace, stored.task.id)),
        ("state".into(), stored.state_text()),
        ("schedule".into(), text::schedule(&stored.task.schedule)),
        ("next fire".into(), instant(status.and_then(|s| s.next_fire))),
        ("last fire".into(), instant(status.and_then(|s| s.last_fire))),
        (
            "remaining runs".into(),
            match status.and_then(|s| s.remaining_runs) {
                Some(left) => format!("{left} of {}", stored.task.max_runs.unwrap_or(left)),
                None => "-".into(),
            },
        ),
        (
            "last run".into(),
            match status.and_then(|s| s.last_execution_id.as_ref().map(|id| (id, s.last_outcome))) {
                Some((id, Some(outcome))) => format!("{id} {}", outcome.as_str()),
                Some((id, None)) => format!("{id} (no record kept)"),
                None => "-".into(),
            },
        ),
        (format!("ok (last {RECENT_RUNS})"), success_rate(status)),
        ("executor".into(), text::executor(&stored.task.executor)),
        ("breaker".into(), stored.breaker()),
    ];
    // Every other setting of the spec (by name), so nothing is left out.
    let shown = ["id", "namespace", "schedule", "executor", "paused", "paused_reason", "breaker"];
    if let Some(spec) = reply["task"].as_object() {
        for (key, value) in spec.iter().filter(|(key, _)| !shown.contains(&key.as_str())) {
            lines.push((key.replace('_', " "), text::words(value)));
        }
        if !spec.contains_key("priority") {
            lines.push(("priority".into(), "normal".into()));
        }
        if let Some(breaker) = spec.get("breaker") {
            lines.push(("breaker settings".into(), text::words(breaker)));
        }
    }
    lines.push(("revision".into(), stored.revision.to_string()));
    text::pairs(&lines);
    Ok(())
}
