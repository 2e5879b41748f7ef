//! The life of one delivery, as a straight line: the message read ([`Received`]: metadata,
//! headers, the trace context parsed once); a body that does not decode, or names another run
//! than its subject, dead-lettered and never run; the breaker's admission (a short-circuited
//! run skipped or delayed: [`shortcut`]); a slot of its concurrency key, or a wait for one
//! ([`limit`]); the run record's say and the attempt ([`attempt`]),
//! decided by the pure verdict ([`crate::verdict`]); and the one path from the ending to the
//! record, the answer, the metrics and the event ([`ending`]).
//!
//! Every file here `impl`s [`Delivery`] (its state is [`state`]); none imports this one.

mod attempt;
mod ending;
mod limit;
mod parts;
mod rate;
mod shortcut;
mod state;

use async_nats::jetstream::{self, AckKind};
use tracing::Instrument;

use self::state::Delivery;
use crate::breaker::Admission;
use crate::dlq::{DeadLetter, disagreement, mismatched, undecodable};
use crate::message::Received;
use crate::slot::Slot;
use crate::spans;

pub(crate) use self::parts::Parts;

/// Handles one delivery from its metadata to its ending.
pub(crate) async fn process(
    parts: &Parts,
    queue: &str,
    message: jetstream::Message,
    arrived: std::time::Instant,
    permit: &mut Slot,
) {
    let received = match Received::read(message, arrived) {
        Ok(received) => received,
        Err(error) => {
            parts.metrics.errors.with_label_values(&["message_info"]).inc();
            tracing::warn!(%error, "dispatch without JetStream metadata; ignored");
            return;
        }
    };
    let message = &received.message;
    let mut dispatch = match parts.dispatches.decode(&message.payload) {
        Ok(dispatch) => dispatch,
        Err(error) => {
            tracing::error!(%error, subject = %message.subject, "undecodable dispatch: dead-lettering it");
            let (subject, payload) = (&message.subject, &message.payload);
            let entry = undecodable(&parts.names, subject, payload, &error, &parts.worker, received.sequence);
            refuse(parts, message, &entry).await;
            return;
        }
    };
    // The subject is what the publisher's permissions were checked against: a body naming
    // another run (another namespace's task, say) is not run under it.
    if let Some(reason) = disagreement(&parts.names, &message.subject, &dispatch) {
        tracing::error!(subject = %message.subject, reason, "dispatch subject and body disagree: dead-lettering it");
        let entry = mismatched(
            &parts.names,
            &message.subject,
            &message.payload,
            &dispatch,
            reason,
            &parts.worker,
            received.sequence,
        );
        refuse(parts, message, &entry).await;
        return;
    }
    dispatch.trace_id.clone_from(&received.trace.trace_id);
    let span = spans::run(&dispatch, received.attempt, &message.subject, &received.trace);
    Delivery::new(parts, queue, &received, &dispatch, permit).deliver().instrument(span).await;
}

/// Ends a delivery that is not run: its dead letter stored (awaiting the stream's ack, counted
/// by source), then the message terminated; handed back for later when the entry is not stored.
async fn refuse(parts: &Parts, message: &jetstream::Message, entry: &DeadLetter) {
    let answer = match Box::pin(parts.dlq.store(entry)).await {
        Ok(()) => AckKind::Term,
        Err(_) => AckKind::Nak(Some(parts.dlq.retry_delay)),
    };
    parts.answers.send(message, answer).await;
}

impl Delivery<'_> {
    /// A paused task's scheduled run skipped; else the breaker's admission, then either its
    /// shortcut, or the rate limit's say, then the attempt and its ending; the run events told
    /// meanwhile are awaited last.
    async fn deliver(mut self) {
        let dispatch = self.dispatch;
        // A run cancelled before it started never starts (a released held run included).
        if let Some(reason) = self.parts.cancels.reason(&dispatch.execution_id) {
            self.end_cancelled(&reason).await;
            self.give_back_reservation();
            self.flush_events().await;
            return;
        }
        if dispatch.trigger.is_scheduled()
            && self.parts.pauses.is_paused(&dispatch.namespace, &dispatch.task_id)
            && self.skip_paused().await
        {
            self.give_back_reservation();
            self.flush_events().await;
            return;
        }
        let gate = self.parts.breakers.admit(self.dispatch).await;
        match gate {
            Some(gate) if gate.admission == Admission::ShortCircuit => {
                self.short_circuit(&gate).await;
                self.give_back_reservation();
            }
            // Its rate limit skipped it, delayed it or handed it back: a concurrency slot
            // handed over to it goes to the next waiting run meanwhile.
            _ if self.rate_limit().await => self.give_back_reservation(),
            gate => {
                self.gate = gate;
                if self.take_slot().await {
                    let parts = self.parts;
                    let ending = match self.slot.clone() {
                        // The block's lease is renewed for all its runs.
                        Some(_) if self.from_block => self.run().await,
                        Some(key) => {
                            let (id, seq) = (&dispatch.execution_id, self.received.sequence);
                            parts.limits.holding(&key, id, seq, self.run()).await
                        }
                        None => self.run().await,
                    };
                    self.conclude(ending).await;
                    self.free_slot();
                }
            }
        }
        self.flush_events().await;
    }
}
