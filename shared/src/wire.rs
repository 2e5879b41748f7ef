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
    /// The leader's term: the revision of the `create` that won the lease. It stays the same
    /// while one leader holds the lease (renewals rewrite it unchanged) and grows with every
    /// new leadership. 0 in records written before the term was stored.
    #[serde(default)]
    pub term: u64,
    /// When this leader acquired the lease (renewals keep it).
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

/// At most this many attempts are kept in a record (the first and the latest ones).
pub const MAX_KEPT_ATTEMPTS: usize = 200;

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

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Succeeded,
    /// Retryable failure.
    Failed,
    /// Non-retryable failure.
    Permanent,
    /// No verdict: the worker died or stalled past ack_wait; found by the next delivery.
    Abandoned,
    /// Handed back (Nak) because the worker shut down before the attempt finished.
    Interrupted,
}

/// One attempt of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Delivery count of the dispatch message (1-based).
    pub attempt: u32,
    pub worker: String,
    #[serde(with = "millis")]
    pub started: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub finished: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<AttemptOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the executor reported (HTTP status and body excerpt, exit code and output tails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The value of `JETSCHED_RUNS[<execution_id>]`.
///
/// The top-level fields are the design's `{status, attempt, worker, started, finished, error}`
/// plus what the scheduler needs for overlap decisions (`namespace`, `task_id`,
/// `nominal_time`) and the attempt history the dead-letter entry copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub execution_id: String,
    pub namespace: String,
    pub task_id: String,
    pub queue: String,
    #[serde(with = "millis")]
    pub nominal_time: DateTime<Utc>,
    pub trigger: Trigger,
    pub status: RunStatus,
    /// The latest attempt number.
    pub attempt: u32,
    /// Worker of the latest attempt.
    pub worker: String,
    /// Start of the latest attempt.
    #[serde(with = "millis")]
    pub started: DateTime<Utc>,
    /// Start of the first attempt (for `retry.max_elapsed`).
    #[serde(with = "millis")]
    pub first_started: DateTime<Utc>,
    /// When the run reached a final status.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub finished: Option<DateTime<Utc>>,
    /// Error of the latest failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Attempts executed again because the one before was abandoned.
    #[serde(default)]
    pub reruns: u32,
    pub attempts: Vec<AttemptRecord>,
}

impl RunRecord {
    /// The record of a run's first attempt, written before it runs.
    pub fn new(dispatch: &Dispatch, attempt: u32, worker: &str, now: DateTime<Utc>) -> RunRecord {
        RunRecord {
            execution_id: dispatch.execution_id.clone(),
            namespace: dispatch.namespace.clone(),
            task_id: dispatch.task_id.clone(),
            queue: dispatch.spec.queue.clone(),
            nominal_time: dispatch.nominal_time,
            trigger: dispatch.trigger,
            status: RunStatus::Running,
            attempt,
            worker: worker.to_string(),
            started: now,
            first_started: now,
            finished: None,
            error: None,
            reruns: 0,
            attempts: vec![AttemptRecord::started(attempt, worker, now)],
        }
    }

    /// Records the start of attempt `attempt`; an attempt still open (no verdict) is marked
    /// abandoned. Returns whether this is a rerun after an abandoned attempt.
    pub fn start_attempt(&mut self, attempt: u32, worker: &str, now: DateTime<Utc>) -> bool {
        let mut rerun = false;
        if let Some(last) = self.attempts.last_mut()
            && last.outcome.is_none()
        {
            last.outcome = Some(AttemptOutcome::Abandoned);
            last.error = Some("no verdict before ack_wait: the worker died or stalled".to_string());
            rerun = true;
            self.reruns += 1;
        }
        self.status = RunStatus::Running;
        self.attempt = attempt;
        self.worker = worker.to_string();
        self.started = now;
        self.attempts.push(AttemptRecord::started(attempt, worker, now));
        if self.attempts.len() > MAX_KEPT_ATTEMPTS {
            self.attempts.remove(1);
        }
        rerun
    }

    /// Closes attempt `attempt` with its outcome and sets the run's status.
    pub fn end_attempt(
        &mut self,
        attempt: u32,
        outcome: AttemptOutcome,
        error: Option<String>,
        detail: Option<String>,
        status: RunStatus,
        now: DateTime<Utc>,
    ) {
        if let Some(entry) =
            self.attempts.iter_mut().rev().find(|a| a.attempt == attempt && a.outcome.is_none())
        {
            entry.finished = Some(now);
            entry.outcome = Some(outcome);
            entry.error = error.clone();
            entry.detail = detail;
        }
        self.status = status;
        if error.is_some() {
            self.error = error;
        }
        if matches!(status, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Dead) {
            self.finished.get_or_insert(now);
        }
    }
}

impl AttemptRecord {
    pub fn started(attempt: u32, worker: &str, now: DateTime<Utc>) -> AttemptRecord {
        AttemptRecord {
            attempt,
            worker: worker.to_string(),
            started: now,
            finished: None,
            outcome: None,
            error: None,
            detail: None,
        }
    }
}

// ---- dead letters ---------------------------------------------------------------------------

/// How a run reached the dead-letter stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterSource {
    /// A worker's verdict: permanent failure or retries exhausted.
    Verdict,
    /// `max_deliver` reached without a verdict (the max-deliveries advisory).
    MaxDeliveries,
    /// The dispatch message could not be decoded.
    Undecodable,
}

impl DeadLetterSource {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterSource::Verdict => "verdict",
            DeadLetterSource::MaxDeliveries => "max_deliveries",
            DeadLetterSource::Undecodable => "undecodable",
        }
    }
}

/// One entry of `JETSCHED_DLQ` (subject `jetsched.dlq.<queue>.<namespace>.<task_id>`,
/// `Nats-Msg-Id = dlq:<execution_id>`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetter {
    pub execution_id: String,
    pub namespace: String,
    pub task_id: String,
    pub queue: String,
    #[serde(with = "millis")]
    pub nominal_time: DateTime<Utc>,
    pub trigger: Trigger,
    pub term: u64,
    /// Revision of the spec snapshot.
    pub revision: u64,
    /// The spec the run executed (absent only for an undecodable dispatch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<TaskSpec>,
    /// The dispatch body, when it could not be decoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_dispatch: Option<String>,
    /// Why the run is dead.
    pub reason: String,
    pub source: DeadLetterSource,
    #[serde(with = "millis")]
    pub dead_at: DateTime<Utc>,
    /// The worker that dead-lettered it.
    pub worker: String,
    /// Every attempt (start, end, worker, outcome, error, detail).
    pub attempts: Vec<AttemptRecord>,
    /// Sequence of the dispatch message in the dispatch stream.
    pub dispatch_sequence: u64,
}

impl DeadLetter {
    /// The entry of a run that will not execute again.
    pub fn new(
        dispatch: &Dispatch,
        record: Option<&RunRecord>,
        reason: String,
        source: DeadLetterSource,
        worker: &str,
        sequence: u64,
    ) -> DeadLetter {
        DeadLetter {
            execution_id: dispatch.execution_id.clone(),
            namespace: dispatch.namespace.clone(),
            task_id: dispatch.task_id.clone(),
            queue: dispatch.spec.queue.clone(),
            nominal_time: dispatch.nominal_time,
            trigger: dispatch.trigger,
            term: dispatch.term,
            revision: dispatch.revision,
            spec: Some(dispatch.spec.clone()),
            raw_dispatch: None,
            reason,
            source,
            dead_at: Utc::now(),
            worker: worker.to_string(),
            attempts: record.map(|r| r.attempts.clone()).unwrap_or_default(),
            dispatch_sequence: sequence,
        }
    }
}
