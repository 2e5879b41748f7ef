//! How a delivery ends ([`Ending`]) and the one path from there, [`Delivery::conclude`]: the
//! attempt closed in the run record, the answer to the dispatch message (Ack, Nak with a
//! delay, or the dead letter stored and then Term), the run metrics and the run event.
//!
//! What each ending does is one table ([`plan`]). The order is the guarantee: the record is
//! written before the message is answered, and a dead letter is acknowledged by its stream
//! before the message is terminated (a refused one leaves the message for a later delivery).

use std::pin::pin;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use chrono::{DateTime, Utc};
use jetsched_shared::wire::EventKind;

use crate::delivery::{Delivery, acknowledge, keeping_alive};
use crate::dlq::{DeadLetter, DeadLetterSource};
use crate::runs::{AttemptOutcome, RunRecord, RunStatus};

/// When a run whose record could not be written (before its attempt, or at its verdict) is
/// delivered again.
const RECORD_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The run record as last stored, and its revision (0: not stored yet, see lazy records).
pub(crate) struct Stored {
    pub(crate) record: RunRecord,
    pub(crate) revision: u64,
}

/// How a delivery ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// The attempt succeeded.
    Succeeded { detail: Option<String> },
    /// A retryable failure with attempts left: delivered again after `delay`.
    Retrying { error: String, delay: Duration },
    /// A permanent failure (`permanent`) or retries exhausted: dead-lettered.
    Failed { error: String, permanent: bool, reason: String },
    /// The shutdown grace period ran out mid-attempt: handed back at once to another worker.
    Interrupted,
    /// A redelivery of a run that already succeeded: not run again.
    Duplicate,
    /// A redelivery of a run already in the dead-letter stream.
    AlreadyDead,
    /// A final failure whose dead letter was refused earlier: stored now, not run again.
    DeadLetterPending { reason: String },
    /// The run record could not be written: not run, delivered again shortly.
    Unrecorded,
}

impl Ending {
    /// The ending's name (the `jetsched.outcome` of the run span).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Ending::Succeeded { .. } => "succeeded",
            Ending::Retrying { .. } => "retrying",
            Ending::Failed { .. } => "failed",
            Ending::Interrupted => "interrupted",
            Ending::Duplicate => "duplicate",
            Ending::AlreadyDead => "already_dead",
            Ending::DeadLetterPending { .. } => "dead_letter_pending",
            Ending::Unrecorded => "unrecorded",
        }
    }
}

/// How the dispatch message is answered.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Ack,
    Nak(Option<Duration>),
    Term,
    /// Store the dead letter, then `Term` (`Nak` after `--dlq-retry-delay` when refused, or
    /// after [`RECORD_RETRY_DELAY`] when the record of the failure could not be written).
    DeadLetter,
}

/// What an ending does, its texts aside.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Plan {
    /// How the attempt is closed in the run record (endings of an attempt that ran).
    close: Option<(AttemptOutcome, RunStatus)>,
    /// The `outcome` label counted in `jetsched_worker_runs_total`.
    counted: Option<&'static str>,
    /// The run event told.
    event: Option<EventKind>,
    answer: Answer,
}

fn plan(ending: &Ending) -> Plan {
    use AttemptOutcome as Attempt;
    let (close, counted, event, answer) = match ending {
        Ending::Succeeded { .. } => (
            Some((Attempt::Succeeded, RunStatus::Succeeded)),
            Some("succeeded"),
            Some(EventKind::RunSucceeded),
            Answer::Ack,
        ),
        Ending::Retrying { delay, .. } => (
            Some((Attempt::Failed, RunStatus::Retrying)),
            Some("retried"),
            Some(EventKind::RunRetrying),
            Answer::Nak(Some(*delay)),
        ),
        Ending::Failed { permanent, .. } => (
            Some((if *permanent { Attempt::Permanent } else { Attempt::Failed }, RunStatus::Failed)),
            Some("failed"),
            Some(EventKind::RunFailed),
            Answer::DeadLetter,
        ),
        Ending::Interrupted => {
            (Some((Attempt::Interrupted, RunStatus::Retrying)), Some("interrupted"), None, Answer::Nak(None))
        }
        Ending::Duplicate => (None, Some("duplicate"), None, Answer::Ack),
        Ending::AlreadyDead => (None, None, None, Answer::Term),
        Ending::DeadLetterPending { .. } => (None, None, None, Answer::DeadLetter),
        Ending::Unrecorded => (None, None, None, Answer::Nak(Some(RECORD_RETRY_DELAY))),
    };
    Plan { close, counted, event, answer }
}

/// The texts an ending carries: the attempt's error and detail, and the reason told in the
/// event and the dead letter.
#[derive(Debug, Default, PartialEq)]
struct Texts {
    error: Option<String>,
    detail: Option<String>,
    reason: Option<String>,
}

impl Ending {
    fn into_texts(self) -> Texts {
        match self {
            Ending::Succeeded { detail } => Texts { detail, ..Texts::default() },
            Ending::Retrying { error, delay } => Texts {
                error: Some(error),
                reason: Some(format!("retry in {} ms", delay.as_millis())),
                ..Texts::default()
            },
            Ending::Failed { error, reason, .. } => {
                Texts { error: Some(error), reason: Some(reason), ..Texts::default() }
            }
            Ending::Interrupted => {
                Texts { error: Some("interrupted: the worker shut down".to_string()), ..Texts::default() }
            }
            Ending::DeadLetterPending { reason } => Texts { reason: Some(reason), ..Texts::default() },
            Ending::Duplicate | Ending::AlreadyDead | Ending::Unrecorded => Texts::default(),
        }
    }
}

/// The close of an attempt in its run record, applied again on a record re-read after a
/// concurrent write.
struct Closing<'a> {
    attempt: u32,
    outcome: AttemptOutcome,
    status: RunStatus,
    error: Option<&'a str>,
    detail: Option<String>,
    now: DateTime<Utc>,
}

impl Closing<'_> {
    fn apply(&self, record: &mut RunRecord) {
        let error = self.error.map(str::to_string);
        record.end_attempt(self.attempt, self.outcome, error, self.detail.clone(), self.status, self.now);
    }
}

impl Delivery<'_> {
    /// The one path from an ending to the run record, the answer to the message, the metrics
    /// and the event.
    pub(crate) async fn conclude(&mut self, ending: Ending) {
        let plan = plan(&ending);
        self.announce(&ending);
        // Auto-pause counts runs that ended for good (a success resets the count).
        let ended_failed = match &ending {
            Ending::Succeeded { .. } => Some(false),
            Ending::Failed { .. } => Some(true),
            _ => None,
        };
        crate::spans::outcome(ending.name());
        let Texts { error, detail, reason } = ending.into_texts();
        let mut stored = self.stored.take();
        // The verdict's record could not be written: the run is not acknowledged but handed
        // back (redelivered, it is recognised by its record or its count and decided again).
        let mut unrecorded = false;
        if let Some((outcome, status)) = plan.close {
            stored = match stored {
                Some(run) => {
                    let closing = Closing {
                        attempt: self.attempt,
                        outcome,
                        status,
                        error: error.as_deref(),
                        detail,
                        now: Utc::now(),
                    };
                    self.close(run, closing).await
                }
                None => None,
            };
            unrecorded = stored.is_none();
        }
        // The record shows a later delivery holding the run (this attempt was abandoned:
        // its worker cut off or stalled past ack_wait): the message is that delivery's now.
        // Acknowledging it (or dead-lettering the run) would take it from under the attempt
        // in flight, whose own verdict (a retry, say) then had no message left to act on.
        let superseded = stored.as_ref().is_some_and(|run| run.record.superseded(self.attempt));
        if superseded {
            tracing::info!("a later delivery holds the run: its message is left to it");
        }
        let shared = self.shared;
        if let Some(failed) = ended_failed {
            shared.breakers.run_ended(self.dispatch, failed).await;
        }
        if let Some(counted) = plan.counted {
            shared
                .metrics
                .runs
                .with_label_values(&[self.queue, counted, self.dispatch.priority.as_str()])
                .inc();
        }
        let mut reason = reason;
        // Built only when published (`--run-events failures` tells no success).
        if let Some(kind) = plan.event.filter(|kind| shared.run_events.wants(*kind)) {
            let mut event = self.event(kind, self.attempt);
            event.error = error;
            event.duration_ms = self.elapsed.map(|e| u64::try_from(e.as_millis()).unwrap_or(u64::MAX));
            // The dead letter needs the reason too.
            event.reason = if plan.answer == Answer::DeadLetter { reason.clone() } else { reason.take() };
            self.tell(event).await;
        }
        let kind = match plan.answer {
            _ if superseded => None,
            Answer::Ack if unrecorded => Some(AckKind::Nak(Some(RECORD_RETRY_DELAY))),
            Answer::Ack => Some(AckKind::Ack),
            Answer::Nak(delay) => Some(AckKind::Nak(delay)),
            Answer::Term => Some(AckKind::Term),
            Answer::DeadLetter => match stored {
                Some(run) => {
                    // Boxed like every rare path, so the common one's future stays small.
                    Box::pin(self.dead_letter(run, reason.unwrap_or_default())).await;
                    None
                }
                None => Some(AckKind::Nak(Some(RECORD_RETRY_DELAY))),
            },
        };
        if let Some(kind) = kind {
            acknowledge(shared, self.message, kind).await;
        }
    }

    /// Logs an ending and counts what only it counts.
    fn announce(&self, ending: &Ending) {
        match ending {
            Ending::Retrying { error, delay } => {
                self.shared.metrics.retries.with_label_values(&[self.queue]).inc();
                tracing::info!(%error, ?delay, "attempt failed; retrying");
            }
            Ending::Failed { reason, .. } => {
                tracing::warn!(%reason, "run failed for good: dead-lettering it")
            }
            Ending::Duplicate => {
                tracing::info!("redelivery of a run that already succeeded: acked without running")
            }
            _ => {}
        }
    }

    /// Closes the attempt in the run record (progress acks meanwhile). A failed write is
    /// logged and counted; `None` then (a success is then handed back, not acknowledged).
    async fn close(&self, run: Stored, closing: Closing<'_>) -> Option<Stored> {
        let Stored { mut record, revision } = run;
        closing.apply(&mut record);
        let saved = pin!(self.shared.runs.save(record, revision, |r| closing.apply(r)));
        match keeping_alive(self.shared, self.message, saved).await {
            Ok((record, revision)) => Some(Stored { record, revision }),
            Err(error) => {
                self.shared.metrics.errors.with_label_values(&["run_record"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    status = closing.status.as_str(),
                    "cannot update the run record"
                );
                None
            }
        }
    }

    /// Stores the dead letter (awaiting the ack), then marks the record dead and `Term`s the
    /// message. A refused dead letter leaves the message (delayed Nak) and says so in an event.
    async fn dead_letter(&mut self, run: Stored, reason: String) {
        let shared = self.shared;
        let Stored { mut record, revision } = run;
        let entry = DeadLetter::new(
            self.dispatch,
            Some(&record),
            reason.clone(),
            DeadLetterSource::Verdict,
            &shared.worker,
            self.sequence,
        );
        if let Err(error) = shared.store_dead_letter(&entry).await {
            let mut event = self.event(EventKind::RunFailed, record.attempt);
            event.error = Some(format!("{error:#}"));
            event.reason = Some("dlq_rejected".to_string());
            self.tell(event).await;
            acknowledge(shared, self.message, AckKind::Nak(Some(shared.dlq_retry_delay))).await;
            return;
        }
        let attempt = record.attempt;
        record.status = RunStatus::Dead;
        let marked = pin!(shared.runs.save(record, revision, |r| r.status = RunStatus::Dead));
        if let Err(error) = keeping_alive(shared, self.message, marked).await {
            shared.metrics.errors.with_label_values(&["run_record"]).inc();
            tracing::warn!(error = format!("{error:#}"), "cannot mark the run record dead");
        }
        acknowledge(shared, self.message, AckKind::Term).await;
        let mut event = self.event(EventKind::RunDead, attempt);
        event.reason = Some(reason);
        self.tell(event).await;
        match shared.dlq.depth().await {
            Ok(depth) => shared.metrics.dlq_depth.set(i64::try_from(depth).unwrap_or(i64::MAX)),
            Err(error) => tracing::debug!(error = format!("{error:#}"), "read DLQ depth"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ending_has_one_plan() {
        use AttemptOutcome as A;
        let second = Duration::from_secs(1);
        let failed = |permanent| Ending::Failed { error: "e".into(), permanent, reason: "r".into() };
        let table = [
            (
                Ending::Succeeded { detail: None },
                Some((A::Succeeded, RunStatus::Succeeded)),
                Some("succeeded"),
                Some(EventKind::RunSucceeded),
                Answer::Ack,
            ),
            (
                Ending::Retrying { error: "e".into(), delay: second },
                Some((A::Failed, RunStatus::Retrying)),
                Some("retried"),
                Some(EventKind::RunRetrying),
                Answer::Nak(Some(second)),
            ),
            (
                failed(true),
                Some((A::Permanent, RunStatus::Failed)),
                Some("failed"),
                Some(EventKind::RunFailed),
                Answer::DeadLetter,
            ),
            (
                failed(false),
                Some((A::Failed, RunStatus::Failed)),
                Some("failed"),
                Some(EventKind::RunFailed),
                Answer::DeadLetter,
            ),
            (
                Ending::Interrupted,
                Some((A::Interrupted, RunStatus::Retrying)),
                Some("interrupted"),
                None,
                Answer::Nak(None),
            ),
            (Ending::Duplicate, None, Some("duplicate"), None, Answer::Ack),
            (Ending::AlreadyDead, None, None, None, Answer::Term),
            (Ending::DeadLetterPending { reason: "r".into() }, None, None, None, Answer::DeadLetter),
            (Ending::Unrecorded, None, None, None, Answer::Nak(Some(RECORD_RETRY_DELAY))),
        ];
        for (ending, close, counted, event, answer) in table {
            assert_eq!(plan(&ending), Plan { close, counted, event, answer }, "{ending:?}");
        }
    }

    #[test]
    fn texts_go_where_the_ending_says() {
        let retrying = Ending::Retrying { error: "boom".into(), delay: Duration::from_millis(250) };
        assert_eq!(
            retrying.into_texts(),
            Texts { error: Some("boom".into()), detail: None, reason: Some("retry in 250 ms".into()) }
        );
        let failed =
            Ending::Failed { error: "bad".into(), permanent: true, reason: "permanent failure: bad".into() };
        assert_eq!(failed.into_texts().reason.as_deref(), Some("permanent failure: bad"));
        assert_eq!(
            Ending::Succeeded { detail: Some("HTTP 200".into()) }.into_texts().detail.as_deref(),
            Some("HTTP 200")
        );
        assert!(Ending::Interrupted.into_texts().error.is_some_and(|e| e.contains("shut down")));
        assert_eq!(Ending::Duplicate.into_texts(), Texts::default());
    }
}
