//! Making room for a fire under `cancel_other` or `replace`: the previous run of the task is
//! cancelled as the policy says, and the check ends once nothing of it is going.
//!
//! Every step is decided from the previous run's record ([`rules::step`]), never from memory,
//! so a leader that takes over decides the same for the same fire:
//!
//! - a run that has not started (no record yet: every gated task's run is recorded before it
//!   starts; or `held`; or, under `cancel_other`, `retrying`) is settled `cancelled` by
//!   compare-and-set on its record. That write is what decides: a worker that starts the run
//!   meanwhile creates or advances the record first, the write fails, and the record is read
//!   again (now `running`). Once settled, the run can never start (a delivery that finds its
//!   record `cancelled` is acked without running), the marker in the cancels bucket releases a
//!   delivery waiting for a rate limit or a concurrency slot at once, and `run.cancelled` is
//!   told, named after the run so that telling it again stores one event (a leader that finds
//!   a queued run already settled for the same fire tells it again, in case the one that
//!   settled it died first);
//! - a running run under `cancel_other` gets a cancel marker: its worker stops the attempt and
//!   records `cancelled` with the marker's reason (or `succeeded`, when the attempt had
//!   finished first); under `replace` it is left to finish;
//! - then the run record is watched until final ([`rules::wait_idle`]), and only then does the
//!   new fire go: two runs of the task never run at once.
//!
//! A leader that took over knows the previous fire only from the fire state, and that fire may
//! have been skipped: a missing record then means a queued run only when the task's latest
//! message in the dispatch stream is that run's ([`Queued`]); one that is not found there is
//! taken as not dispatched.
//!
//! The reason recorded names the fire that replaced the run (its nominal time and execution
//! id), the same text whichever leader writes it.

use std::sync::Arc;

use anyhow::Context;
use async_nats::jetstream::kv;
use async_nats::jetstream::stream::{RawMessageErrorKind, Stream};
use chrono::{DateTime, Utc};
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch, live};
use jetsched_shared::events::EventSink;
use jetsched_shared::spec::OverlapPolicy;
use jetsched_shared::trace;
use jetsched_shared::wire::{
    CancelMarker, Event, HDR_EXECUTION_ID, RunRecord, RunStatus, Trigger, format_time,
};

use super::rules::{self, Previous, Prior, Step};

/// Compare-and-set rounds on the previous run's record before the check gives up.
const CAS_ROUNDS: usize = 8;

/// What a check under `cancel_other` or `replace` needs.
pub(crate) struct Room {
    pub(crate) runs: Arc<kv::Store>,
    pub(crate) cancels: kv::Store,
    pub(crate) events: EventSink,
    pub(crate) policy: OverlapPolicy,
    pub(crate) prior: Prior,
    /// The previous fire (Unix ms), its task and queue: a record written for a run that has
    /// none yet says so.
    pub(crate) prior_ms: i64,
    pub(crate) namespace: String,
    pub(crate) task_id: String,
    pub(crate) queue: String,
    /// The new fire: its nominal time (Unix ms) and execution id.
    pub(crate) fire_ms: i64,
    pub(crate) fire_execution: String,
    /// Where the task's dispatches wait.
    pub(crate) queued: Queued,
}

/// The dispatch stream and the subject the task's runs wait on.
pub(crate) struct Queued {
    pub(crate) stream: Stream<()>,
    pub(crate) subject: String,
}

impl Queued {
    /// Whether the latest message on the subject is the dispatch of `execution_id` (on a work
    /// queue a message stays until a worker acknowledges it: queued, or in flight).
    async fn holds(&self, execution_id: &str) -> anyhow::Result<bool> {
        let last = self.stream.raw_message_builder().last_by_subject(self.subject.clone()).send().await;
        match last {
            Ok(message) => {
                Ok(message.headers.get(HDR_EXECUTION_ID).is_some_and(|value| value.as_str() == execution_id))
            }
            Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => Ok(false),
            Err(error) => Err(error).context("read the task's latest dispatch"),
        }
    }
}

/// The reason a run cancelled to make room for the fire `execution` at `nominal` records.
pub(crate) fn reason(policy: OverlapPolicy, nominal: DateTime<Utc>, execution: &str) -> String {
    format!(
        "replaced by the fire of {} (execution {execution}; overlap {})",
        format_time(nominal),
        policy.as_str()
    )
}

impl Room {
    /// Cancels the previous run as the policy says, then returns once nothing of it is going.
    pub(crate) async fn make(self) -> anyhow::Result<()> {
        let nominal = DateTime::from_timestamp_millis(self.fire_ms).context("fire time out of range")?;
        let reason = reason(self.policy, nominal, &self.fire_execution);
        let key = self.prior.execution_id.as_str();
        let mut previous = self.prior.previous;
        for _ in 0..CAS_ROUNDS {
            let entry = live(self.runs.entry(key).await.context("read run record")?);
            let stored = match &entry {
                Some(entry) => Some((
                    serde_json::from_slice::<RunRecord>(&entry.value).context("decode run record")?,
                    entry.revision,
                )),
                None => None,
            };
            let status = stored.as_ref().map(|(record, _)| record.status);
            if status.is_none() && previous == Previous::Inherited && self.queued.holds(key).await? {
                previous = Previous::Dispatched;
            }
            let (prior, policy) = (&self.prior, self.policy);
            match rules::step(policy, status, previous, prior.age, prior.ttl) {
                Step::Dispatch => {
                    // A queued run cancelled for this very fire by a leader that may have died
                    // before telling it: told again (one event, named after the run). A run a
                    // worker ended (it ran, or was delivered) was told by that worker.
                    if let Some((record, _)) =
                        stored.filter(|(r, _)| r.reason.as_deref() == Some(reason.as_str()))
                        && record.status == RunStatus::Cancelled
                        && record.worker.is_empty()
                        && record.attempts.is_empty()
                    {
                        self.tell(&record, &reason).await;
                    }
                    return Ok(());
                }
                Step::Settle => {
                    let settled = match stored {
                        Some((record, revision)) => self.settle_stored(record, revision, &reason).await?,
                        None => self.settle_queued(&reason).await?,
                    };
                    if let Some(record) = settled {
                        tracing::info!(
                            execution = key,
                            by = %self.fire_execution,
                            policy = policy.as_str(),
                            "previous run cancelled before it started"
                        );
                        // Settled, the run never starts: the marker only hurries a delivery
                        // waiting for a limit, so a marker not written is only logged.
                        if let Err(error) = self.mark(&reason).await {
                            tracing::warn!(
                                error = format!("{error:#}"),
                                execution = key,
                                "cancel marker not written"
                            );
                        }
                        self.tell(&record, &reason).await;
                        return Ok(());
                    }
                }
                Step::Stop => {
                    tracing::info!(
                        execution = key,
                        by = %self.fire_execution,
                        "previous run still running: cancelling it"
                    );
                    // Without its marker the run is not stopped, but the new fire still waits
                    // for it to end: two runs never run at once.
                    if let Err(error) = self.mark(&reason).await {
                        tracing::warn!(
                            error = format!("{error:#}"),
                            execution = key,
                            "cannot cancel the running run; the new fire waits for it to end"
                        );
                    }
                    return rules::wait_idle(self.runs.clone(), self.prior.clone()).await;
                }
                Step::Wait => return rules::wait_idle(self.runs.clone(), self.prior.clone()).await,
            }
        }
        anyhow::bail!("run record {key} kept changing")
    }

    /// `record` (held, or retrying) becomes `cancelled`; `None` when it changed meanwhile.
    async fn settle_stored(
        &self,
        mut record: RunRecord,
        revision: u64,
        reason: &str,
    ) -> anyhow::Result<Option<RunRecord>> {
        let now = Utc::now();
        record.status = RunStatus::Cancelled;
        record.reason = Some(reason.to_string());
        record.release_at = None;
        record.finished = Some(now);
        let body = serde_json::to_vec(&record).context("encode run record")?;
        match self.runs.update(&self.prior.execution_id, body.into(), revision).await {
            Ok(_) => Ok(Some(record)),
            Err(error) if is_revision_mismatch(&error) => Ok(None),
            Err(error) => Err(error).context("update run record"),
        }
    }

    /// A queued run without a record gets a `cancelled` one; `None` when a worker recorded it
    /// first (it has started).
    async fn settle_queued(&self, reason: &str) -> anyhow::Result<Option<RunRecord>> {
        let now = Utc::now();
        let nominal = DateTime::from_timestamp_millis(self.prior_ms).context("fire time out of range")?;
        let execution_id = self.prior.execution_id.clone();
        let record = RunRecord {
            trace_id: trace::trace_id_of(&execution_id).map(|id| id.to_string()),
            execution_id,
            namespace: self.namespace.clone(),
            task_id: self.task_id.clone(),
            queue: self.queue.clone(),
            nominal_time: nominal,
            trigger: Trigger::Schedule,
            status: RunStatus::Cancelled,
            attempt: 0,
            worker: String::new(),
            started: now,
            first_started: now,
            finished: Some(now),
            error: None,
            release_at: None,
            reason: Some(reason.to_string()),
            reruns: 0,
            failures: 0,
            attempts: Vec::new(),
            replay_of: None,
            result: None,
        };
        let body = serde_json::to_vec(&record).context("encode run record")?;
        match self.runs.create(&self.prior.execution_id, body.into()).await {
            Ok(_) => Ok(Some(record)),
            Err(error) if is_already_exists(&error) => Ok(None),
            Err(error) => Err(error).context("create run record"),
        }
    }

    /// The cancel marker every worker follows.
    async fn mark(&self, reason: &str) -> anyhow::Result<()> {
        let marker = CancelMarker {
            namespace: self.namespace.clone(),
            task_id: self.task_id.clone(),
            reason: reason.to_string(),
            time: Utc::now(),
        };
        let body = serde_json::to_vec(&marker).context("encode cancel marker")?;
        self.cancels.put(&self.prior.execution_id, body.into()).await.context("write cancel marker")?;
        Ok(())
    }

    /// `run.cancelled` about a run cancelled before it started.
    async fn tell(&self, record: &RunRecord, reason: &str) {
        self.events.emit(Event::run_cancelled(record, reason)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_names_the_replacing_fire_and_the_policy() {
        let nominal = DateTime::from_timestamp_millis(1_700_000_000_000).expect("time");
        assert_eq!(
            reason(OverlapPolicy::Replace, nominal, "e-2"),
            "replaced by the fire of 2023-11-14T22:13:20.000Z (execution e-2; overlap replace)"
        );
        assert!(reason(OverlapPolicy::CancelOther, nominal, "e-2").ends_with("overlap cancel_other)"));
    }
}
