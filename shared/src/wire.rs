//! Every payload and header that crosses NATS: API requests and replies, dispatch messages,
//! events, fire state, run records and the leader lease.
//!
//! Times are RFC 3339 UTC with millisecond precision on the wire.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::spec::TaskSpec;

// ---- headers ------------------------------------------------------------------------------

/// Compare-and-set on `put`: the revision the client last saw (0 = must not exist).
pub const HDR_EXPECTED_REVISION: &str = "Jetsched-Expected-Revision";
/// `true` on `put`: fail with `conflict` when the task exists.
pub const HDR_CREATE_ONLY: &str = "Jetsched-Create-Only";
/// `<namespace>.<task_id>` on every dispatch.
pub const HDR_TASK: &str = "Jetsched-Task";
/// Nominal fire time (RFC 3339, ms) on every dispatch.
pub const HDR_NOMINAL_TIME: &str = "Jetsched-Nominal-Time";
pub const HDR_EXECUTION_ID: &str = "Jetsched-Execution-Id";
/// The leader's lease revision (fencing token) that dispatched the fire.
pub const HDR_LEADER_TERM: &str = "Jetsched-Leader-Term";
/// `schedule`, `manual`, `catchup` or `replay`.
pub const HDR_TRIGGER: &str = "Jetsched-Trigger";
/// Attempt number on executor requests (1-based).
pub const HDR_ATTEMPT: &str = "Jetsched-Attempt";

/// Formats an instant the way every jetsched payload and header does.
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Serde helpers for millisecond RFC 3339 timestamps.
pub mod millis {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_time(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text).map(|t| t.with_timezone(&Utc)).map_err(serde::de::Error::custom)
    }

    /// The same for `Option<DateTime<Utc>>`.
    pub mod option {
        use chrono::{DateTime, Utc};
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_str(&super::super::format_time(*t)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|text| {
                    DateTime::parse_from_rfc3339(&text)
                        .map(|t| t.with_timezone(&Utc))
                        .map_err(serde::de::Error::custom)
                })
                .transpose()
        }
    }
}

// ---- task API -----------------------------------------------------------------------------

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

/// A stored task and its revision: the reply of `put`, `get`, `pause`, `resume`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskReply {
    pub task: TaskSpec,
    pub revision: u64,
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
}

/// Reply of `delete`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeleteReply {
    pub namespace: String,
    pub id: String,
    pub deleted: bool,
}

/// Reply of `trigger`: the run dispatched now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TriggerReply {
    pub execution_id: String,
    pub namespace: String,
    pub id: String,
    #[serde(with = "millis")]
    pub nominal_time: DateTime<Utc>,
    /// Sequence of the dispatch message in the dispatch stream.
    pub stream_sequence: u64,
}

// ---- dispatch -----------------------------------------------------------------------------

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
    pub spec: TaskSpec,
}

/// The execution id of a scheduled fire: a UUID v5 of `<namespace>.<task_id>:<nominal_ms>`, so
/// every leader derives the same id for the same fire and a worker's run record recognises a
/// duplicate that stream de-duplication could not.
pub fn scheduled_execution_id(namespace: &str, task_id: &str, nominal_unix_ms: i64) -> String {
    let name = crate::names::dispatch_msg_id(namespace, task_id, nominal_unix_ms);
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

/// The execution id of a manual trigger or replay: random, time-ordered.
pub fn fresh_execution_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

// ---- events -------------------------------------------------------------------------------

/// Every kind of event on `JETSCHED_EVENTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "task.registered")]
    TaskRegistered,
    #[serde(rename = "task.updated")]
    TaskUpdated,
    #[serde(rename = "task.deleted")]
    TaskDeleted,
    #[serde(rename = "task.paused")]
    TaskPaused,
    #[serde(rename = "task.resumed")]
    TaskResumed,
    #[serde(rename = "task.rejected")]
    TaskRejected,
    #[serde(rename = "fire.dispatched")]
    FireDispatched,
    #[serde(rename = "fire.skipped")]
    FireSkipped,
    #[serde(rename = "fire.missed")]
    FireMissed,
    #[serde(rename = "run.started")]
    RunStarted,
    #[serde(rename = "run.succeeded")]
    RunSucceeded,
    #[serde(rename = "run.failed")]
    RunFailed,
    #[serde(rename = "run.retrying")]
    RunRetrying,
    #[serde(rename = "run.dead")]
    RunDead,
    #[serde(rename = "leader.acquired")]
    LeaderAcquired,
    #[serde(rename = "leader.lost")]
    LeaderLost,
}

impl EventKind {
    /// The dotted name, also the kind part of the event subject.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::TaskRegistered => "task.registered",
            EventKind::TaskUpdated => "task.updated",
            EventKind::TaskDeleted => "task.deleted",
            EventKind::TaskPaused => "task.paused",
            EventKind::TaskResumed => "task.resumed",
            EventKind::TaskRejected => "task.rejected",
            EventKind::FireDispatched => "fire.dispatched",
            EventKind::FireSkipped => "fire.skipped",
            EventKind::FireMissed => "fire.missed",
            EventKind::RunStarted => "run.started",
            EventKind::RunSucceeded => "run.succeeded",
            EventKind::RunFailed => "run.failed",
            EventKind::RunRetrying => "run.retrying",
            EventKind::RunDead => "run.dead",
            EventKind::LeaderAcquired => "leader.acquired",
            EventKind::LeaderLost => "leader.lost",
        }
    }
}

/// One event. Optional fields are present where they apply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    #[serde(with = "millis")]
    pub time: DateTime<Utc>,
    pub namespace: String,
    pub task_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub nominal_time: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Spec revision for task events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// Why a fire was skipped (`misfire`, `overlap`, `paused`) or a spec rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Scheduler instance for fire and leader events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Leader term for fire and leader events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
}

impl Event {
    /// An event with only the mandatory fields set; fill the rest with struct update syntax.
    pub fn new(kind: EventKind, namespace: impl Into<String>, task_id: impl Into<String>) -> Event {
        Event {
            kind,
            time: Utc::now(),
            namespace: namespace.into(),
            task_id: task_id.into(),
            execution_id: None,
            nominal_time: None,
            trigger: None,
            attempt: None,
            worker: None,
            error: None,
            duration_ms: None,
            revision: None,
            reason: None,
            instance: None,
            term: None,
        }
    }
}

// ---- scheduler state ------------------------------------------------------------------------

/// Value of the leader lease key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaderRecord {
    pub instance: String,
    #[serde(with = "millis")]
    pub acquired_at: DateTime<Utc>,
    /// Lease length in milliseconds, so followers and tools know when it lapses.
    pub lease_ms: u64,
}

/// Per-task fire state in `JETSCHED_STATE`, written by the leader so a new leader resumes
/// exactly where the old one stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FireState {
    /// The last nominal fire that was dispatched or recorded as skipped.
    #[serde(with = "millis")]
    pub last_nominal_fire: DateTime<Utc>,
    #[serde(default, with = "millis::option")]
    pub next_fire: Option<DateTime<Utc>>,
    /// Fires dispatched so far by any leader.
    pub fires: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_execution_id: Option<String>,
    /// Spec revision the state was computed with.
    pub revision: u64,
}

// ---- executor replies ---------------------------------------------------------------------

/// Reply header of a responder to the worker's `nats` executor: `ok`, `retry` or `fail`
/// (a JSON body `{"status": ...}` works too; see the worker's `executor/nats.rs`).
pub const HDR_STATUS: &str = "Jetsched-Status";

// ---- run records ------------------------------------------------------------------------------

/// Where a run stands, as recorded in `JETSCHED_RUNS[<execution_id>].status` by the worker
/// that holds it. The scheduler reads it for the overlap policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// An attempt is executing (or its worker died: then the next delivery finds it so).
    Running,
    /// The last attempt failed; a retry is scheduled.
    Retrying,
    /// Done; redeliveries are acked without running.
    Succeeded,
    /// Final failure; the dead-letter entry is not stored yet (the DLQ refused it).
    Failed,
    /// Stored in the dead-letter stream.
    Dead,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Retrying => "retrying",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Dead => "dead",
        }
    }

    /// True once the run will not execute again (succeeded, or failed for good).
    pub fn is_final(self) -> bool {
        matches!(self, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Dead)
    }
}
