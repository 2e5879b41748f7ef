//! The dispatch message body and its execution ids.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;
use crate::priority::Priority;
use crate::spec::TaskSpec;

/// Why a run was dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Schedule,
    Manual,
    Catchup,
    Replay,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Manual => "manual",
            Trigger::Catchup => "catchup",
            Trigger::Replay => "replay",
        }
    }
}

/// The body of a message on `JETSCHED_DISPATCH`: everything a worker needs, so it never reads
/// `TASKS`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Dispatch {
    pub execution_id: String,
    pub namespace: String,
    pub task_id: String,
    #[serde(with = "millis")]
    pub nominal_time: DateTime<Utc>,
    pub trigger: Trigger,
    /// Leader term (lease revision) of the scheduler that dispatched it; 0 for API triggers.
    pub term: u64,
    /// Revision of the spec in `TASKS` this snapshot comes from.
    pub revision: u64,
    /// The lane the run was dispatched to; `normal` for dispatches sent before priorities.
    #[serde(default)]
    pub priority: Priority,
    pub spec: TaskSpec,
    /// Trace id of the execution (32 hex digits): not part of the body, filled in by the
    /// receiver from the message's `traceparent` header.
    #[serde(skip)]
    pub trace_id: Option<String>,
}

/// The execution id of a scheduled fire: a UUID v5 of `<namespace>.<task_id>:<nominal_ms>`, so
/// every leader derives the same id for the same fire and a worker's run record recognises a
/// duplicate that stream de-duplication could not.
pub fn scheduled_execution_id(namespace: &str, task_id: &str, nominal_unix_ms: i64) -> String {
    execution_id_of_fire(&crate::names::dispatch_msg_id(namespace, task_id, nominal_unix_ms))
}

/// [`scheduled_execution_id`] from the fire's message id ([`crate::names::dispatch_msg_id`]),
/// for a caller that has built it already.
pub fn execution_id_of_fire(dispatch_msg_id: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, dispatch_msg_id.as_bytes()).to_string()
}

/// The execution id of a manual trigger or replay: random, time-ordered.
pub fn fresh_execution_id() -> String {
    uuid::Uuid::now_v7().to_string()
}
