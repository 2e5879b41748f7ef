//! The task API's requests and replies (`jetsched.api.task.*`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{TaskStatus, millis};
use crate::spec::TaskSpec;

fn default_namespace() -> String {
    "default".to_string()
}

/// Addresses one task: `{"namespace": "billing", "id": "nightly-report"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRef {
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub id: String,
}

/// A stored task and its revision: the reply of `put`, `get`, `pause`, `resume`; `get` and
/// each task of `list` carry its status as well.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskReply {
    pub task: TaskSpec,
    pub revision: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskStatus>,
    /// `pause`: the tasks with `after` that name this one (`<namespace>/<id>`): their runs
    /// wait while it is paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_children: Vec<String>,
}

/// `list`: optional namespace and label filters, a page size and the cursor of the previous page.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRequest {
    #[serde(default)]
    pub namespace: Option<String>,
    /// Every label given must match exactly.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Page size, default 100, at most 1000.
    #[serde(default)]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListReply {
    pub tasks: Vec<TaskReply>,
    /// Present when more tasks follow: pass it as `cursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `next`: preview the next `count` fires of a stored task (`namespace` + `id`) or of an
/// inline `spec`, after `after` (default now).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextRequest {
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub spec: Option<serde_json::Value>,
    /// Default 10, at most 1000.
    #[serde(default)]
    pub count: Option<usize>,
    #[serde(default, with = "millis::option")]
    pub after: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NextReply {
    /// The schedule's time zone (UTC for intervals and one-shots).
    pub timezone: String,
    /// Nominal fire instants in UTC.
    pub times: Vec<String>,
    /// The same instants on the zone's wall clock, with offset.
    pub local_times: Vec<String>,
    /// Why the list stops short of the count asked: what ends the task's fires (`end_at`,
    /// `max_runs`, `one_shot`), when the last one is among them or already past.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_by: Option<String>,
    /// The task's last fire, when something ends its fires and it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fire: Option<String>,
    /// One per time, when the task names calendars: what they do with it (empty when it fires
    /// at its nominal time), e.g. `skipped: calendar de-holidays (2026-12-25)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// A task with `after` has no fires of its own: what it waits for instead (its rule, and
    /// each nominal time it is waiting for, with the parents still missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for: Vec<String>,
}

/// Reply of `delete`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeleteReply {
    pub namespace: String,
    pub id: String,
    pub deleted: bool,
    /// The tasks with `after` that name the deleted task (`<namespace>/<id>`): left waiting
    /// for runs it will not make.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_children: Vec<String>,
}

/// Reply of `trigger`: the run dispatched now, the earlier run a de-duplication key named
/// (`deduplicated`), or the debounced run the trigger joined (`debounced`, starting at
/// `nominal_time`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TriggerReply {
    pub execution_id: String,
    pub namespace: String,
    pub id: String,
    /// When the run was dispatched, or when a debounced run will start.
    #[serde(with = "millis")]
    pub nominal_time: DateTime<Utc>,
    /// Sequence of the dispatch message in the dispatch stream (a run dispatched now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_sequence: Option<u64>,
    /// The de-duplication key named an earlier trigger: its run, nothing dispatched now.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deduplicated: bool,
    /// The task debounces its triggers: this one joined the pending run (opened it when it
    /// was the first), which starts at `nominal_time`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub debounced: bool,
    /// A debounced trigger: how many triggers the pending run collapsed so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggers: Option<u64>,
}
