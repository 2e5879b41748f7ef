//! The breaker API's requests and replies (`jetsched.api.breaker.{list,get,reset}`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{BreakerState, millis};

/// Addresses one breaker: `{"namespace": "billing", "key": "payments-api"}` for a namespace's
/// named breaker, `{"namespace": "billing", "id": "nightly-report"}` for a task's own, `{"key":
/// ...}` alone for a bucket key as `list` shows it, or for a key that is shared or used by one
/// namespace only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// One breaker as the API shows it: its record in the breakers bucket read at `now`, and the
/// tasks whose spec uses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakerInfo {
    /// The key in the breakers bucket: `task.<namespace>.<id>`, `key.<namespace>.<key>`, or
    /// `key.=shared.<key>` for a key shared by every namespace.
    pub key: String,
    /// What a user calls it: `<namespace>/<id>` for a task's own, `<namespace>:<key>` for a
    /// namespace's named breaker, the bare key for a shared one.
    pub name: String,
    pub state: BreakerState,
    /// Failure rate of the sliding window (0 when nothing was counted).
    pub failure_rate: f64,
    /// Attempts and failed attempts in the sliding window.
    pub runs: u64,
    pub failures: u64,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub opened_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub open_until: Option<DateTime<Utc>>,
    /// While open or half-open: the attempts and failures of the window that opened it (the
    /// window itself may be empty by then: nothing runs through an open breaker).
    #[serde(default)]
    pub opened_runs: u64,
    #[serde(default)]
    pub opened_failures: u64,
    /// Runs of the task that ended `failed` or `dead` in a row (a task's own key only).
    #[serde(default)]
    pub consecutive_failures: u32,
    /// `<namespace>/<id>` of every task whose spec uses this breaker, sorted.
    #[serde(default)]
    pub tasks: Vec<String>,
    /// Revision of the record; 0 when no worker has written one yet (closed, nothing counted).
    #[serde(default)]
    pub revision: u64,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub updated_at: Option<DateTime<Utc>>,
}

/// The reply of `breaker.list`: every breaker in key order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BreakerListReply {
    pub breakers: Vec<BreakerInfo>,
}

/// The reply of `breaker.reset`: the breaker after the reset and the state it had before.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BreakerResetReply {
    pub breaker: BreakerInfo,
    pub previous_state: BreakerState,
}
