//! The one path from a delivery's [`Ending`] ([`Delivery::conclude`]): the attempt closed in
//! the run record, the answer to the dispatch message (Ack, Nak with a delay, or the dead
//! letter stored and then Term), the run metrics and the run event, as the ending's
//! [`plan`] says.
//!
//! The order is the guarantee: the record is written before the message is answered, and a
//! dead letter is acknowledged by its stream before the message is terminated (a refused one
//! leaves the message for a later delivery).

use std::pin::pin;

use async_nats::jetstream::AckKind;
use chrono::Utc;
use jetsched_shared::wire::{EventKind, result_value};

use super::state::Delivery;
use crate::dlq::{DeadLetter, DeadLetterSource};
use crate::runs::{Closing, RunStatus, Stored};
use crate::spans;
use crate::verdict::{Answer, Ending, RECORD_RETRY_DELAY, Texts, plan};

impl Delivery<'_> {
    /// The one path from an ending to the run record, the answer to the message, the metrics
    /// and the event.
    pub(super) async fn conclude(&mut self, ending: Ending) {
        let plan = plan(&ending);
        self.announce(&ending);
        // Auto-pause counts runs that ended for good (a success resets the count).
        let ended_failed = ending.run_failed();
        spans::outcome(ending.name());
        let mut ending = ending;
        let returned = ending.take_result();
        let result = returned.as_deref().filter(|_| self.dispatch.spec.keep_result).and_then(result_value);
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
                        reason: (status == RunStatus::Cancelled).then(|| reason.clone()).flatten(),
                        result: result.as_ref(),
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
        let parts = self.parts;
        if let Some(failed) = ended_failed {
            parts.breakers.run_ended(self.dispatch, failed).await;
        }
        if let Some(counted) = plan.counted {
            parts
                .metrics
                .runs
                .with_label_values(&[self.queue, counted, self.dispatch.priority.as_str()])
                .inc();
        }
        let mut reason = reason;
        // Built only when published (`--run-events failures` tells no success).
        if let Some(kind) = plan.event.filter(|kind| parts.run_events.wants(*kind)) {
            let mut event = self.event(kind, self.attempt);
            event.error = error;
            event.duration_ms = self.elapsed.map(|e| u64::try_from(e.as_millis()).unwrap_or(u64::MAX));
            event.run_duration_ms = stored
                .as_ref()
                .filter(|run| run.record.status.is_final())
                .map(|run| u64::try_from(run.record.duration(Utc::now()).num_milliseconds()).unwrap_or(0));
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
            parts.answers.send(&self.received.message, kind).await;
        }
    }

    /// Logs an ending and counts what only it counts.
    fn announce(&self, ending: &Ending) {
        match ending {
            Ending::Retrying { error, delay } => {
                self.parts.metrics.retries.with_label_values(&[self.queue]).inc();
                tracing::info!(%error, ?delay, "attempt failed; retrying");
            }
            Ending::Failed { reason, .. } => {
                tracing::warn!(%reason, "run failed for good: dead-lettering it")
            }
            Ending::Duplicate => {
                tracing::info!("redelivery of a run that already succeeded: acked without running")
            }
            Ending::Cancelled { reason } => tracing::info!(%reason, "run cancelled while it ran"),
            Ending::AlreadyCancelled => {
                tracing::info!("delivery of a run already cancelled: acked without running")
            }
            _ => {}
        }
    }

    /// Closes the attempt in the run record (progress acks meanwhile). A failed write is
    /// logged and counted; `None` then (a success is then handed back, not acknowledged).
    async fn close(&self, run: Stored, closing: Closing<'_>) -> Option<Stored> {
        let Stored { mut record, revision } = run;
        closing.apply(&mut record);
        let saved = pin!(self.parts.runs.save(record, revision, |r| closing.apply(r)));
        match self.parts.answers.keeping_alive(&self.received.message, saved).await {
            Ok((record, revision)) => Some(Stored { record, revision }),
            Err(error) => {
                self.parts.metrics.errors.with_label_values(&["run_record"]).inc();
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
        let parts = self.parts;
        let Stored { mut record, revision } = run;
        let entry = DeadLetter::new(
            self.dispatch,
            Some(&record),
            reason.clone(),
            DeadLetterSource::Verdict,
            &parts.worker,
            self.received.sequence,
        );
        if let Err(error) = parts.dlq.store(&entry).await {
            let mut event = self.event(EventKind::RunFailed, record.attempt);
            event.error = Some(format!("{error:#}"));
            event.reason = Some("dlq_rejected".to_string());
            self.tell(event).await;
            parts.answers.send(&self.received.message, AckKind::Nak(Some(parts.dlq.retry_delay))).await;
            return;
        }
        let attempt = record.attempt;
        record.status = RunStatus::Dead;
        let marked = pin!(parts.runs.save(record, revision, |r| r.status = RunStatus::Dead));
        if let Err(error) = parts.answers.keeping_alive(&self.received.message, marked).await {
            parts.metrics.errors.with_label_values(&["run_record"]).inc();
            tracing::warn!(error = format!("{error:#}"), "cannot mark the run record dead");
        }
        parts.answers.send(&self.received.message, AckKind::Term).await;
        let mut event = self.event(EventKind::RunDead, attempt);
        event.reason = Some(reason);
        self.tell(event).await;
        parts.dlq.measure().await;
    }
}
