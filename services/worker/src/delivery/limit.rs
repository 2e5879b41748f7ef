//! A delivery and its task's concurrency limit ([`crate::limits`]): the slot asked for before
//! the attempt (taken, or the run parked to wait: its record `held` with reason
//! `concurrency_limit`, `run.held` with the key, and the first run to wait on a full key tells
//! `limit.saturated`), and the slot freed at the ending, whatever it is, and handed over.

use async_nats::jetstream::AckKind;
use chrono::Utc;
use jetsched_shared::names::{CONCURRENCY_LIMIT, concurrency_key};
use jetsched_shared::wire::{EventKind, HDR_ATTEMPTS_SPENT};

use super::state::Delivery;
use crate::dlq::{DeadLetter, DeadLetterSource};
use crate::limits::park::{comeback, park};
use crate::limits::rules::{Claim, Decision};
use crate::spans;

/// When a delivery whose slot could not be asked for (the bucket unreachable) comes again.
const RETRY_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

impl Delivery<'_> {
    /// Takes a slot of the task's concurrency key, if it has one. Returns whether the delivery
    /// goes on to its attempt; otherwise it has ended here (parked to wait, a copy of a run
    /// holding its slot, a key that does not expand, or handed back to ask again).
    pub(super) async fn take_slot(&mut self) -> bool {
        let (parts, dispatch) = (self.parts, self.dispatch);
        let Some(concurrency) = &dispatch.spec.concurrency else { return true };
        let expanded = concurrency.expand(&dispatch.namespace, &dispatch.task_id, &dispatch.spec.labels);
        let key = match expanded {
            Ok(key) => concurrency_key(&dispatch.namespace, &key),
            Err(problem) => {
                Box::pin(self.refuse_key(format!("concurrency.key {:?}: {problem}", concurrency.key))).await;
                return false;
            }
        };
        let message = &self.received.message;
        let parked = parts.names.delayed_subject(
            self.queue,
            &dispatch.namespace,
            &dispatch.task_id,
            &dispatch.execution_id,
        );
        let delivered = message.info().map(|info| info.delivered).unwrap_or(1).max(1) as u64;
        let claim = Claim {
            execution_id: &dispatch.execution_id,
            seq: self.received.sequence,
            delivered,
            worker: &parts.worker,
            priority: dispatch.priority,
            namespace: &dispatch.namespace,
            task_id: &dispatch.task_id,
            parked_subject: &parked,
            limit: concurrency.limit,
        };
        // Only a first delivery of a dispatch never parked nor delayed may hold a slot of the
        // worker's block: a run the key may know (a copy, a redelivery, a handed-over run) asks
        // with a write, so its own holder entry is found.
        let spent = message.headers.as_ref().is_some_and(|h| h.get(HDR_ATTEMPTS_SPENT).is_some());
        let eligible = delivered == 1 && !spent;
        if parts.limits.take_from_block(&key, &dispatch.execution_id, eligible, self.received.arrived).await {
            self.slot = Some(key);
            self.from_block = true;
            return true;
        }
        match parts.limits.acquire(&key, &claim, eligible).await {
            Ok(Decision::Hold) => {
                self.slot = Some(key);
                true
            }
            Ok(Decision::Block { .. }) => {
                self.slot = Some(key);
                self.from_block = true;
                true
            }
            Ok(Decision::Copy) => {
                spans::outcome("copy");
                tracing::info!(key, "another message of the run holds its concurrency slot: not run");
                parts.answers.send(message, AckKind::Ack).await;
                false
            }
            Ok(Decision::Wait { saturated }) => {
                Box::pin(self.wait_for_slot(&key, &parked, saturated)).await;
                false
            }
            Err(error) => {
                parts.metrics.errors.with_label_values(&["limit"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    key,
                    "cannot ask for a concurrency slot; handing the run back"
                );
                parts.answers.send(message, AckKind::Nak(Some(RETRY_DELAY))).await;
                false
            }
        }
    }

    /// Parks the run on `parked` until a slot is handed over (or it comes back by itself),
    /// records it held and acks the delivery.
    async fn wait_for_slot(&mut self, key: &str, parked: &str, saturated: bool) {
        let parts = self.parts;
        let dispatch = self.dispatch;
        let message = &self.received.message;
        spans::outcome("waiting_for_slot");
        let until = comeback(Utc::now(), parts.limits.lease);
        let sequence = self.received.sequence;
        let stored =
            park(&parts.js, message, sequence, &dispatch.execution_id, self.attempt, parked, until).await;
        if let Err(error) = stored {
            parts.metrics.errors.with_label_values(&["limit_park"]).inc();
            tracing::warn!(error = format!("{error:#}"), key, "cannot park the run; handing it back");
            parts.answers.send(message, AckKind::Nak(Some(RETRY_DELAY))).await;
            return;
        }
        tracing::info!(key, "concurrency limit reached: the run waits for a slot");
        if let Err(error) = parts.limits.parked(key, &dispatch.execution_id, parked).await {
            // It comes back by itself after two leases.
            parts.metrics.errors.with_label_values(&["limit"]).inc();
            tracing::warn!(error = format!("{error:#}"), key, "cannot check the parked run's place");
        }
        let name = jetsched_shared::names::limit_name(key).unwrap_or(key).to_string();
        match parts.runs.wait_for_slot(dispatch, self.attempt, &parts.worker).await {
            Ok(true) => {
                let mut event = self.event(EventKind::RunHeld, self.attempt);
                event.reason = Some(CONCURRENCY_LIMIT.to_string());
                event.key = Some(name.clone());
                self.tell(event).await;
            }
            Ok(false) => {}
            Err(error) => {
                parts.metrics.errors.with_label_values(&["run_record"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot record the waiting run");
            }
        }
        if saturated {
            let mut event = self.event(EventKind::LimitSaturated, self.attempt);
            event.key = Some(name);
            self.tell(event).await;
        }
        parts.answers.send(message, AckKind::Ack).await;
    }

    /// Frees the slot this delivery holds, if any, and hands it over, without holding the
    /// worker permit for the write ([`crate::limits::Limits::free`]).
    pub(super) fn free_slot(&mut self) {
        let Some(key) = self.slot.take() else { return };
        if std::mem::take(&mut self.from_block) {
            self.parts.limits.free_block(&key);
            return;
        }
        let execution_id = self.dispatch.execution_id.clone();
        self.parts.limits.free(key, execution_id, self.received.sequence);
    }

    /// A delivery that ends before asking for a slot (cancelled, its task paused, its breaker
    /// open) gives back a slot handed over to it, so the next waiting run need not wait for the
    /// reservation's lease. Costs nothing when the run holds none (the watched record says so).
    pub(super) fn give_back_reservation(&mut self) {
        let dispatch = self.dispatch;
        let Some(concurrency) = &dispatch.spec.concurrency else { return };
        let Ok(key) = concurrency.expand(&dispatch.namespace, &dispatch.task_id, &dispatch.spec.labels)
        else {
            return;
        };
        self.slot = Some(concurrency_key(&dispatch.namespace, &key));
        self.free_slot();
    }

    /// Dead-letters a run whose concurrency key does not expand (a spec stored before its rule):
    /// never run, the problem as its reason.
    async fn refuse_key(&mut self, reason: String) {
        let parts = self.parts;
        tracing::error!(%reason, "the run's concurrency key is invalid: dead-lettering it");
        let entry = DeadLetter::new(
            self.dispatch,
            None,
            reason,
            DeadLetterSource::Verdict,
            &parts.worker,
            self.received.sequence,
        );
        let answer = match parts.dlq.store(&entry).await {
            Ok(()) => AckKind::Term,
            Err(_) => AckKind::Nak(Some(parts.dlq.retry_delay)),
        };
        parts.answers.send(&self.received.message, answer).await;
    }
}
