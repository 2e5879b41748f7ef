//! Cancelling runs: the marker a cancel leaves in `JETSCHED_CANCELS` for every worker, and the
//! requests and replies of `<prefix>.api.runs.cancel.<namespace>` and
//! `<prefix>.api.runs.cancel-task.<namespace>`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{RunStatus, millis};

/// The value of `JETSCHED_CANCELS[<execution_id>]`, written by the registry before it answers a
/// cancel. Every worker follows the bucket into memory: a delivery of a marked run ends
/// `cancelled` without running, and an attempt of it under way is stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelMarker {
    pub namespace: String,
    pub task_id: String,
    /// Who asked and why, as the run record's `reason` will say.
    pub reason: String,
    #[serde(with = "millis")]
    pub time: DateTime<Utc>,
}

/// `runs.cancel`: cancel one run by its execution id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    pub execution_id: String,
    /// When given, must be the namespace of the subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Why (free text, at most 200 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who asks (free text, at most 100 characters; default `api`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// `runs.cancel-task`: cancel a task's runs that have not started (held, queued or both).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelTaskRequest {
    /// When given, must be the namespace of the subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub id: String,
    /// Cancel the runs an open breaker holds. Neither `held` nor `queued`: both.
    #[serde(default)]
    pub held: bool,
    /// Cancel the runs waiting in their queue. Neither `held` nor `queued`: both.
    #[serde(default)]
    pub queued: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// What a cancel did to one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// The run had not started (queued, held, or waiting for a retry): it never will.
    Cancelled,
    /// The run is running: its worker stops it, and it ends `cancelled`.
    Cancelling,
    /// The run had ended already; `status` says how.
    Finished,
}

impl CancelOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelOutcome::Cancelled => "cancelled",
            CancelOutcome::Cancelling => "cancelling",
            CancelOutcome::Finished => "finished",
        }
    }
}

/// The reply of `runs.cancel`, and one entry of `runs.cancel-task`'s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelReply {
    pub execution_id: String,
    pub namespace: String,
    pub task_id: String,
    pub outcome: CancelOutcome,
    /// The run's status after the cancel (its final status when `finished`).
    pub status: RunStatus,
    /// `held` or `queued` for a run that had not started (`runs.cancel-task`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was: Option<String>,
}

/// The reply of `runs.cancel-task`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelTaskReply {
    pub namespace: String,
    pub id: String,
    /// Every run cancelled, in stream order (runs that had ended are left out).
    pub runs: Vec<CancelReply>,
}
