//! Events on `JETSCHED_EVENTS`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Trigger, millis};

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
    /// The task's last fire is handled (dispatched, or skipped by policy): nothing fires again.
    /// `reason` says what ended it (`end_at`, `max_runs`, `one_shot`), `nominal_time` is the
    /// last fire. One per task and last fire, whichever leader handles it.
    #[serde(rename = "task.completed")]
    TaskCompleted,
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
    /// A run not executed: its breaker was open (`on_open: skip`; reason `breaker_open`), or its
    /// task was paused before the scheduled run started (reason `paused`).
    #[serde(rename = "run.skipped")]
    RunSkipped,
    /// A run its open breaker holds (`on_open: delay`) until `release_at`.
    #[serde(rename = "run.held")]
    RunHeld,
    /// A run cancelled on request (`reason` says who asked and why): never retried, never
    /// dead-lettered.
    #[serde(rename = "run.cancelled")]
    RunCancelled,
    #[serde(rename = "breaker.opened")]
    BreakerOpened,
    #[serde(rename = "breaker.half_opened")]
    BreakerHalfOpened,
    #[serde(rename = "breaker.closed")]
    BreakerClosed,
    /// A rate limit began throttling (once per episode, by the worker whose decision began it):
    /// the task's namespace, its expanded key as the id, `key` (the bucket key), `execution_id`
    /// of the run that found it throttled.
    #[serde(rename = "limit.throttled")]
    LimitThrottled,
    #[serde(rename = "leader.acquired")]
    LeaderAcquired,
    #[serde(rename = "leader.lost")]
    LeaderLost,
    /// Operators paused a queue (namespace `_system`, the queue as the id, with its `reason` and
    /// who asked in `instance`): workers pull nothing from it until it is resumed.
    #[serde(rename = "queue.paused")]
    QueuePaused,
    #[serde(rename = "queue.resumed")]
    QueueResumed,
    /// A concurrency key reached its limit with runs waiting (`key`; the run that found it
    /// full names the task); told once per saturation.
    #[serde(rename = "limit.saturated")]
    LimitSaturated,
    /// A trigger (or an intake submission: trigger absent) whose de-duplication key (`key`)
    /// named an earlier one within its time to live: nothing run or applied; `execution_id` is
    /// the earlier trigger's run.
    #[serde(rename = "trigger.deduplicated")]
    TriggerDeduplicated,
    /// Triggers of a debounced task collapsed into one pending run (`execution_id`, starting
    /// at `release_at`): told for the trigger that opens the window and whenever the count of
    /// its triggers (`triggers`) reaches a power of two.
    #[serde(rename = "trigger.debounced")]
    TriggerDebounced,
    /// A scheduler replica's clock is off the server's by more than `--max-clock-skew`.
    #[serde(rename = "scheduler.clock_skew")]
    SchedulerClockSkew,
    /// A backfill was accepted (`backfill`: its id, range and counts).
    #[serde(rename = "backfill.started")]
    BackfillStarted,
    /// A running backfill's counts and cursor, told at most once per few seconds.
    #[serde(rename = "backfill.progress")]
    BackfillProgress,
    /// Every nominal time of a backfill was handled.
    #[serde(rename = "backfill.finished")]
    BackfillFinished,
    /// A backfill was stopped on request.
    #[serde(rename = "backfill.cancelled")]
    BackfillCancelled,
    /// A task with `after` gave up waiting for its parents' runs of `nominal_time`: `within`
    /// passed first (`reason` names the parents still missing; `execution_id` is the run it
    /// would have been).
    #[serde(rename = "after.expired")]
    AfterExpired,
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
            EventKind::TaskCompleted => "task.completed",
            EventKind::FireDispatched => "fire.dispatched",
            EventKind::FireSkipped => "fire.skipped",
            EventKind::FireMissed => "fire.missed",
            EventKind::RunStarted => "run.started",
            EventKind::RunSucceeded => "run.succeeded",
            EventKind::RunFailed => "run.failed",
            EventKind::RunRetrying => "run.retrying",
            EventKind::RunDead => "run.dead",
            EventKind::RunSkipped => "run.skipped",
            EventKind::RunHeld => "run.held",
            EventKind::RunCancelled => "run.cancelled",
            EventKind::BreakerOpened => "breaker.opened",
            EventKind::BreakerHalfOpened => "breaker.half_opened",
            EventKind::BreakerClosed => "breaker.closed",
            EventKind::LimitThrottled => "limit.throttled",
            EventKind::LeaderAcquired => "leader.acquired",
            EventKind::LeaderLost => "leader.lost",
            EventKind::QueuePaused => "queue.paused",
            EventKind::QueueResumed => "queue.resumed",
            EventKind::LimitSaturated => "limit.saturated",
            EventKind::TriggerDeduplicated => "trigger.deduplicated",
            EventKind::TriggerDebounced => "trigger.debounced",
            EventKind::SchedulerClockSkew => "scheduler.clock_skew",
            EventKind::BackfillStarted => "backfill.started",
            EventKind::BackfillProgress => "backfill.progress",
            EventKind::BackfillFinished => "backfill.finished",
            EventKind::BackfillCancelled => "backfill.cancelled",
            EventKind::AfterExpired => "after.expired",
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
    /// Run events: how long the attempt the event is about took (the last attempt's own time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Final run events: how long the whole run took, first attempt's start to the final
    /// status ([`super::RunRecord::duration`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_duration_ms: Option<u64>,
    /// Spec revision for task events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// Why a fire was skipped (`misfire`, `overlap`, `paused`) or a spec rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Scheduler instance for fire and leader events; who asked, for queue events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Leader term for fire and leader events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// Trace id of the execution (32 hex digits), from the dispatch's `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Breaker events: the breaker's key in the breakers bucket (`key.<key>`, `task.<ns>.<id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Breaker events: `closed`, `open` or `half_open`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Breaker events: the failure rate of the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_rate: Option<f64>,
    /// Breaker events: failed attempts in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u64>,
    /// Breaker events: attempts in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u64>,
    /// Breaker events: when an open breaker lets probes through.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub open_until: Option<DateTime<Utc>>,
    /// `run.held`: when the server hands the run back to its queue.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub release_at: Option<DateTime<Utc>>,
    /// Run events of a replay: the dead run whose dead letter it dispatched again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
    /// `trigger.debounced`: the triggers the pending run collapsed so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggers: Option<u64>,
    /// `fire.skipped` (reason `calendar`) and `fire.dispatched` of a shifted fire: the business
    /// calendar that refused the nominal time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<String>,
    /// With `calendar`: the date it refused (`YYYY-MM-DD`, in the calendar's zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar_date: Option<String>,
    /// `fire.dispatched` of a shifted fire: when it was dispatched instead of its nominal
    /// time; `fire.skipped` of a fire merged into another: when that one ran.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub shifted_to: Option<DateTime<Utc>>,
    /// Backfill events: the backfill's id, state, cursor and counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<BackfillSummary>,
}

/// What a backfill event tells of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillSummary {
    pub id: String,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub cursor: Option<DateTime<Utc>>,
    pub total: u64,
    pub dispatched: u64,
    pub skipped: u64,
    pub rerun: u64,
    /// Times the task's business calendars left out.
    #[serde(default)]
    pub calendar: u64,
    /// Times skipped while a run of the task was going (`overlap: skip`).
    #[serde(default)]
    pub overlapped: u64,
}

impl Event {
    /// `run.cancelled` about a run cancelled before it started, told by whoever settled its
    /// record (the registry's cancel, or the scheduler's overlap policy).
    pub fn run_cancelled(record: &super::RunRecord, reason: &str) -> Event {
        Event {
            execution_id: Some(record.execution_id.clone()),
            nominal_time: Some(record.nominal_time),
            trigger: Some(record.trigger),
            reason: Some(reason.to_string()),
            trace_id: record.trace_id.clone(),
            ..Event::new(EventKind::RunCancelled, &record.namespace, &record.task_id)
        }
    }

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
            run_duration_ms: None,
            revision: None,
            reason: None,
            instance: None,
            term: None,
            trace_id: None,
            key: None,
            state: None,
            failure_rate: None,
            failures: None,
            runs: None,
            open_until: None,
            release_at: None,
            replay_of: None,
            triggers: None,
            backfill: None,
            calendar: None,
            calendar_date: None,
            shifted_to: None,
        }
    }
}
