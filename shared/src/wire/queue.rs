//! A queue's state in the queues bucket and the queue API's requests and replies
//! (`jetsched.api.queue.{list,pause,resume}`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;

/// The value of a queue's key in the queues bucket: whether operators paused it, why, who and
/// when. No key (or `paused: false`) means the queue runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who asked (the request's `by`, `api` when it named nobody).
    #[serde(default)]
    pub by: String,
    #[serde(with = "millis")]
    pub at: DateTime<Utc>,
}

/// The body of `queue.pause` and `queue.resume`: `{"queue": "default", "reason": "...", "by":
/// "alice"}` (`reason` and `by` optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueRequest {
    pub queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// One lane of a queue as its durable consumer reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneInfo {
    /// `critical`, `high`, `normal` or `low`.
    pub priority: String,
    /// Runs stored and not yet delivered to any worker.
    pub waiting: u64,
    /// Runs delivered and not yet acknowledged (running, or held by a worker).
    pub in_flight: u64,
    /// When the oldest waiting run was stored (none waiting: absent).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub oldest_waiting: Option<DateTime<Utc>>,
}

/// A queue as `queue.list` shows it: its state, and its lanes' depths when workers have made
/// their consumers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueInfo {
    pub queue: String,
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When it was last paused or resumed.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub at: Option<DateTime<Utc>>,
    /// Revision of its key in the queues bucket (0: never paused).
    #[serde(default)]
    pub revision: u64,
    /// The sum of its lanes' `waiting`.
    #[serde(default)]
    pub waiting: u64,
    /// The sum of its lanes' `in_flight`.
    #[serde(default)]
    pub in_flight: u64,
    /// Most urgent first; empty when no worker has served the queue yet.
    #[serde(default)]
    pub lanes: Vec<LaneInfo>,
}

/// The reply of `queue.list`: every queue with a state or a consumer, by name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueListReply {
    pub queues: Vec<QueueInfo>,
}

/// The reply of `queue.pause` and `queue.resume`: the queue after the request, and whether it
/// changed anything (`false`: it was paused, or running, already).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueReply {
    pub queue: QueueInfo,
    pub changed: bool,
}
