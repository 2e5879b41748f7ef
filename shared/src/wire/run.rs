//! Run records in `JETSCHED_RUNS`, one per execution, with their attempts.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Dispatch, Trigger, millis};

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
    /// Held by its open breaker (`on_open: delay`) until `release_at`, when the server hands
    /// it back to its queue.
    Held,
    /// Not executed: its circuit breaker was open and the task says `on_open: skip`, or the
    /// task was paused before a scheduled run started (`reason` says which).
    Skipped,
    /// Cancelled on request (`reason` says who asked and why): a queued, held or retrying run
    /// never starts again, a running one was stopped cooperatively. Final: never retried,
    /// never dead-lettered; redeliveries are acked without running.
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Retrying => "retrying",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Dead => "dead",
            RunStatus::Skipped => "skipped",
            RunStatus::Held => "held",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// True once the run will not execute again (succeeded, failed for good, skipped or
    /// cancelled).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded
                | RunStatus::Failed
                | RunStatus::Dead
                | RunStatus::Skipped
                | RunStatus::Cancelled
        )
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
    /// Stopped because the run was cancelled while it ran.
    Cancelled,
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
/// The top-level fields are `{status, attempt, worker, started, finished, error}` plus what the
/// scheduler needs for overlap decisions (`namespace`, `task_id`, `nominal_time`) and the attempt
/// history the dead-letter entry copies.
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
    /// While `held`: when the server hands the run back to its queue.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub release_at: Option<DateTime<Utc>>,
    /// Why a run ended without executing (`skipped`): `breaker_open` or `paused`
    /// (`names::breaker_reason`); for a `cancelled` run, who asked and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Attempts executed again because the one before was abandoned.
    #[serde(default)]
    pub reruns: u32,
    /// Attempts that ended in a failure verdict (retryable or not): what the retry policy's
    /// `max_attempts` counts. Deliveries that never reached a verdict (a pull's answer lost, a
    /// worker that died mid-run) are not failures; `--max-deliver` bounds those.
    #[serde(default)]
    pub failures: u32,
    pub attempts: Vec<AttemptRecord>,
    /// Trace id of the execution (32 hex digits), from the dispatch's `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// A replay's dead run: the execution whose dead letter it dispatched again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
    /// What the run returned, when its task keeps results (`keep_result`): at most
    /// [`super::MAX_RESULT_BYTES`] of JSON (text that is not JSON is kept as a string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
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
            release_at: None,
            reason: None,
            reruns: 0,
            failures: 0,
            attempts: vec![AttemptRecord::started(attempt, worker, now)],
            trace_id: dispatch.trace_id.clone(),
            replay_of: dispatch.replay_of.clone(),
            result: None,
        }
    }

    /// How long the whole run took: from the start of its first attempt to its final status,
    /// or to `now` while it is not final (running, retrying, held). Not the latest attempt's
    /// time: a run that failed twice and then succeeded took all three attempts and the waits
    /// between them.
    pub fn duration(&self, now: DateTime<Utc>) -> chrono::Duration {
        let end = match (self.status.is_final(), self.finished) {
            (true, Some(finished)) => finished,
            (true, None) => self.attempts.last().and_then(|a| a.finished).unwrap_or(now),
            (false, _) => now,
        };
        (end - self.first_started).max(chrono::Duration::zero())
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
        self.release_at = None;
        self.attempt = attempt;
        self.worker = worker.to_string();
        self.started = now;
        self.attempts.push(AttemptRecord::started(attempt, worker, now));
        if self.attempts.len() > MAX_KEPT_ATTEMPTS {
            self.attempts.remove(1);
        }
        rerun
    }

    /// Closes attempt `attempt` with its outcome and sets the run's status, unless a later
    /// attempt holds the run or it ended already.
    /// Whether a later attempt than `attempt` holds the run (it is not final): the verdict of
    /// `attempt` closed its own entry only, and the run's message is that later attempt's.
    pub fn superseded(&self, attempt: u32) -> bool {
        self.attempt > attempt && !self.status.is_final()
    }

    pub fn end_attempt(
        &mut self,
        attempt: u32,
        outcome: AttemptOutcome,
        error: Option<String>,
        detail: Option<String>,
        status: RunStatus,
        now: DateTime<Utc>,
    ) {
        if matches!(outcome, AttemptOutcome::Failed | AttemptOutcome::Permanent) {
            self.failures += 1;
        }
        if let Some(entry) =
            self.attempts.iter_mut().rev().find(|a| a.attempt == attempt && a.outcome.is_none())
        {
            entry.finished = Some(now);
            entry.outcome = Some(outcome);
            entry.error = error.clone();
            entry.detail = detail;
        }
        // A stale attempt (a later delivery took the run over, or the run ended already)
        // closes its own entry only: the run's status is its newer holder's.
        if self.attempt > attempt || self.status.is_final() {
            return;
        }
        self.status = status;
        if error.is_some() {
            self.error = error;
        }
        if status.is_final() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).expect("an instant")
    }

    /// A run that failed twice and succeeded on its third attempt: its duration runs from the
    /// first attempt's start to the success, not over the last attempt alone.
    #[test]
    fn a_runs_duration_spans_every_attempt_and_runs_to_now_until_final() {
        let mut record = RunRecord {
            execution_id: "e".into(),
            namespace: "ns".into(),
            task_id: "t".into(),
            queue: "default".into(),
            nominal_time: at(0),
            trigger: Trigger::Schedule,
            status: RunStatus::Running,
            attempt: 1,
            worker: "w1".into(),
            started: at(1),
            first_started: at(1),
            finished: None,
            error: None,
            release_at: None,
            reason: None,
            reruns: 0,
            failures: 0,
            attempts: vec![AttemptRecord::started(1, "w1", at(1))],
            trace_id: None,
            replay_of: None,
            result: None,
        };
        assert_eq!(record.duration(at(4)).num_seconds(), 3, "running: to now");
        record.end_attempt(1, AttemptOutcome::Failed, Some("503".into()), None, RunStatus::Retrying, at(3));
        assert_eq!(record.duration(at(6)).num_seconds(), 5, "retrying: still to now");
        record.start_attempt(2, "w2", at(7));
        record.end_attempt(2, AttemptOutcome::Failed, Some("503".into()), None, RunStatus::Retrying, at(9));
        record.start_attempt(3, "w1", at(15));
        record.end_attempt(3, AttemptOutcome::Succeeded, None, None, RunStatus::Succeeded, at(17));
        assert_eq!(record.duration(at(100)).num_seconds(), 16, "first start to the success");
        let last = record.attempts.last().expect("an attempt");
        let last_attempt = last.finished.expect("finished") - last.started;
        assert_eq!(last_attempt.num_seconds(), 2, "the last attempt alone is shorter");
    }
}
