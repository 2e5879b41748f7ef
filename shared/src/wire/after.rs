//! Dependencies between tasks: what a child's dispatch tells of its parents' runs, and a
//! child's wait for its parents for one nominal time (`JETSCHED_AFTER[<ns>.<id>.<ms>]`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{RunStatus, Trigger, millis};

/// The most bytes of one run's result kept with its record.
pub const MAX_RESULT_BYTES: usize = 4096;
/// The most bytes of parents' results one wait (and so one child's dispatch) carries; past it
/// a parent's result is left out (`result_omitted`) and stays in its run record.
pub const MAX_RESULTS_PER_CHILD: usize = 256 * 1024;

/// One parent's run, as a child's dispatch and its wait carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParentRun {
    /// `<namespace>/<id>`.
    pub task: String,
    pub execution_id: String,
    /// `succeeded`, `dead`, `skipped` or `cancelled`.
    pub status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub finished: Option<DateTime<Utc>>,
    /// What the run returned (its task keeps results), as its record holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The result was left out to keep the child's dispatch small; its run record has it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub result_omitted: bool,
}

/// Where a child's wait for one nominal time stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitState {
    /// Some parents' verdicts are still to come.
    Waiting,
    /// The rule held: the child was dispatched (`execution_id`).
    Dispatched,
    /// The rule can no longer hold (a parent's verdict is not the one asked for).
    NotMet,
    /// `within` passed before the rule held.
    Expired,
    /// The rule held while the child was paused: not run.
    Paused,
}

impl WaitState {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitState::Waiting => "waiting",
            WaitState::Dispatched => "dispatched",
            WaitState::NotMet => "not_met",
            WaitState::Expired => "expired",
            WaitState::Paused => "paused",
        }
    }

    /// Whether the wait is over (nothing changes it any more).
    pub fn is_over(self) -> bool {
        self != WaitState::Waiting
    }
}

/// A child's wait for its parents' runs of one nominal time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wait {
    pub namespace: String,
    pub task_id: String,
    #[serde(with = "millis")]
    pub nominal_time: DateTime<Utc>,
    pub state: WaitState,
    /// The child's execution id for this nominal time (derived: the same for every writer).
    pub execution_id: String,
    /// When the wait began: the first parent's verdict (or the child's own fire) reached it.
    #[serde(with = "millis")]
    pub since: DateTime<Utc>,
    /// When it gives up: `within` after it began, or for a child with a schedule of its own,
    /// after its fire (until the fire comes, it has no deadline).
    #[serde(with = "millis")]
    pub deadline: DateTime<Utc>,
    /// The parents' verdicts so far, by `<namespace>/<id>`.
    pub parents: BTreeMap<String, ParentRun>,
    /// A child with a schedule of its own: its fire of this nominal time, once it came (the
    /// fire's trigger, `schedule` or `catchup`). It runs once that and its parents' verdicts
    /// are in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fired: Option<Trigger>,
    /// Bytes of results the parents carry so far.
    #[serde(default)]
    pub result_bytes: usize,
    /// Why it is over, when it is (`not_met`: the parent and its verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub ended: Option<DateTime<Utc>>,
}

/// A run's result as its record keeps it: JSON when the bytes are JSON, otherwise their text
/// (invalid UTF-8 replaced); `None` when they are more than [`MAX_RESULT_BYTES`] or empty.
pub fn result_value(bytes: &[u8]) -> Option<serde_json::Value> {
    if bytes.is_empty() || bytes.len() > MAX_RESULT_BYTES {
        return None;
    }
    serde_json::from_slice(bytes)
        .ok()
        .or_else(|| Some(serde_json::Value::String(String::from_utf8_lossy(bytes).trim_end().to_string())))
}

/// The execution id of a child's run for its parents' nominal time `nominal_ms`: a UUID v5 of
/// `after:<namespace>.<task_id>:<nominal_ms>`, so every registry replica, and every redelivery
/// of a parent's verdict, derives the same one.
pub fn child_execution_id(namespace: &str, task_id: &str, nominal_ms: i64) -> String {
    let name = format!("after:{namespace}.{task_id}:{nominal_ms}");
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

/// A task's last run, as `graph` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastRun {
    pub execution_id: String,
    #[serde(with = "millis")]
    pub nominal_time: DateTime<Utc>,
    /// The run's status while its record is kept; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
}

/// One task of a graph: a parent or a child of the task asked about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphNode {
    /// `<namespace>/<id>`.
    pub task: String,
    /// False for a parent that was deleted (its children wait for runs it will not make).
    pub exists: bool,
    #[serde(default)]
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<LastRun>,
}

/// Parents or children `graph` describes at most (each with its last run); the rest are counted.
pub const GRAPH_NODES: usize = 100;

/// Reply of `graph`: a task's parents, its children, the last run of each, and its waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphReply {
    /// `<namespace>/<id>` of the task asked about.
    pub task: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<LastRun>,
    /// Its rule, as a sentence (`runs when all of ns/a, ns/b succeeded, within 1d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Its parents, at most [`GRAPH_NODES`] of them (`parents_total` says how many it has).
    pub parents: Vec<GraphNode>,
    /// Its children, at most [`GRAPH_NODES`] of them (`children_total` says how many it has).
    pub children: Vec<GraphNode>,
    #[serde(default)]
    pub parents_total: usize,
    #[serde(default)]
    pub children_total: usize,
    /// Its most recent waits for its parents, newest nominal time first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<Wait>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_result_is_json_when_it_is_json_text_otherwise_and_nothing_past_the_bound() {
        assert_eq!(result_value(br#"{"rows": 3}"#), Some(json!({"rows": 3})));
        assert_eq!(result_value(b"done\n"), Some(json!("done")));
        assert_eq!(result_value(b""), None);
        assert_eq!(
            result_value(&vec![b'x'; MAX_RESULT_BYTES]).map(|v| v.as_str().map(str::len)),
            Some(Some(MAX_RESULT_BYTES))
        );
        assert_eq!(result_value(&vec![b'x'; MAX_RESULT_BYTES + 1]), None);
    }

    #[test]
    fn a_childs_execution_id_depends_on_the_child_and_the_nominal_time_only() {
        let id = child_execution_id("ns", "d", 1_700_000_000_000);
        assert_eq!(id, child_execution_id("ns", "d", 1_700_000_000_000));
        assert_ne!(id, child_execution_id("ns", "d", 1_700_000_000_001));
        assert_ne!(id, child_execution_id("ns", "e", 1_700_000_000_000));
    }
}
