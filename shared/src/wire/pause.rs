//! Pause requests on `JETSCHED_CONTROL`: a worker asks the registry to pause a task.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;

/// Published by the worker whose run brought a task's consecutive failures to its
/// `pause_after_failures`, on `Names::pause_request_subject(namespace, task_id)` with
/// `Nats-Msg-Id` = `names::pause_request_msg_id`. The registry pauses the task with
/// compare-and-set, sets its `paused_reason` to `reason` and publishes `task.paused`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRequest {
    pub namespace: String,
    pub task_id: String,
    /// `consecutive_failures` (`names::breaker_reason::CONSECUTIVE_FAILURES`).
    pub reason: String,
    /// The consecutive failed runs counted when the request was made.
    #[serde(default)]
    pub count: u32,
    /// The execution whose failure reached the count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(with = "millis")]
    pub time: DateTime<Utc>,
}
