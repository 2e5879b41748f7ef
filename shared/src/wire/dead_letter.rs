//! Dead-letter entries in `JETSCHED_DLQ`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{AttemptRecord, Dispatch, RunRecord, Trigger, millis};
use crate::priority::Priority;
use crate::spec::TaskSpec;

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
    /// The dispatch's subject and body name different runs (queue, namespace or task): nothing
    /// was run, the entry is addressed by the subject and keeps the body as it came.
    Mismatched,
}

impl DeadLetterSource {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterSource::Verdict => "verdict",
            DeadLetterSource::MaxDeliveries => "max_deliveries",
            DeadLetterSource::Undecodable => "undecodable",
            DeadLetterSource::Mismatched => "mismatched",
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
    /// The spec the run executed (absent for an undecodable dispatch, and for one whose subject
    /// and body disagree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<TaskSpec>,
    /// The dispatch body, when it could not be decoded or disagrees with its subject.
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
    /// Trace id of the execution (32 hex digits), from the dispatch's `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The lane the run was dispatched to (a replay keeps it unless asked otherwise); `normal`
    /// for entries stored before priorities.
    #[serde(default)]
    pub priority: Priority,
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
            trace_id: dispatch.trace_id.clone().or_else(|| record.and_then(|r| r.trace_id.clone())),
            priority: dispatch.priority,
        }
    }
}
