//! A delivery that does not run: a run cancelled before it started (a final `cancelled`
//! record and a `run.cancelled` event); a paused task's scheduled run not started yet, skipped (a
//! final `skipped` run record and a `run.skipped` event, reason `paused`); or one its open
//! breaker does not let through: skipped (`on_open: skip`, reason `breaker_open`) or delayed
//! (`on_open: delay`: re-published as a message the server holds until the breaker lets calls
//! through again, then acked).
//!
//! A delayed run is a new message: it holds no place in `max_ack_pending`, its delivery count
//! starts again (so `max_deliver` and the dead-letter stream never see the delay), and it
//! carries the attempts executed so far ([`HDR_ATTEMPTS_SPENT`]), so delays spend none of
//! `retry.max_attempts`. It keeps its execution id and its headers; its `Nats-Msg-Id` is
//! `<execution_id>:delay:<n>` (the dispatch stream de-duplicates, and a retried publish of the
//! same delay is stored once).

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::AckKind;
use async_nats::{HeaderMap, HeaderValue};
use chrono::Utc;
use jetsched_shared::names::breaker_reason;
use jetsched_shared::spec::OnOpen;
use jetsched_shared::wire::{
    EventKind, HDR_ATTEMPTS_SPENT, HDR_DELAYS, HDR_RATE_START, HDR_SCHEDULE, HDR_SCHEDULE_TARGET, format_time,
};

use super::state::Delivery;
use crate::breaker::Gate;
use crate::runs::skip::Skip;
use crate::spans;

/// When a delivery whose skip or delay could not be stored is delivered again.
pub(super) const RETRY_DELAY: Duration = Duration::from_secs(1);

impl Delivery<'_> {
    /// Ends a delivery its breaker short-circuited, as the task's `on_open` says.
    pub(super) async fn short_circuit(&mut self, gate: &Gate) {
        spans::outcome("short_circuited");
        match gate.spec.on_open {
            OnOpen::Skip => self.skip(gate).await,
            OnOpen::Delay => self.delay(gate).await,
        }
    }

    /// Skips a scheduled run of a paused task, unless an attempt of it has executed already
    /// (a retry goes on). Returns whether the delivery ended here.
    pub(super) async fn skip_paused(&mut self) -> bool {
        let skipped = self.end_skipped(breaker_reason::PAUSED, None, true).await;
        if skipped == Some(Skip::Skipped) {
            spans::outcome("skipped_paused");
            tracing::info!("task paused: scheduled run skipped");
        }
        skipped != Some(Skip::Started)
    }

    async fn skip(&mut self, gate: &Gate) {
        if self.end_skipped(breaker_reason::BREAKER_OPEN, Some(gate.key.as_str()), false).await
            == Some(Skip::Skipped)
        {
            self.parts.metrics.short_circuited.with_label_values(&[&gate.key, "skip"]).inc();
            tracing::info!(key = gate.key, "breaker open: run skipped");
        }
    }

    /// Records the run skipped for `reason` (by the breaker `key`), tells `run.skipped` and
    /// acks the message; a run final already is acked; one whose record could not be written
    /// is handed back (`None`). `unstarted_only`: a run with an executed attempt is left as it
    /// is, its message unanswered.
    pub(super) async fn end_skipped(
        &mut self,
        reason: &str,
        key: Option<&str>,
        unstarted_only: bool,
    ) -> Option<Skip> {
        let parts = self.parts;
        let skipped =
            parts.runs.skip(self.dispatch, self.attempt, &parts.worker, reason, unstarted_only).await;
        let skip = match skipped {
            Ok(skip) => skip,
            Err(error) => {
                parts.metrics.errors.with_label_values(&["run_record"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot record the skipped run; handing it back"
                );
                parts.answers.send(&self.received.message, AckKind::Nak(Some(RETRY_DELAY))).await;
                return None;
            }
        };
        match skip {
            Skip::Started => return Some(skip),
            Skip::Skipped => {
                let priority = self.dispatch.priority.as_str();
                parts.metrics.runs.with_label_values(&[self.queue, "skipped", priority]).inc();
                let mut event = self.event(EventKind::RunSkipped, self.attempt);
                event.reason = Some(reason.to_string());
                event.key = key.map(str::to_string);
                self.tell(event).await;
            }
            Skip::Final => {}
        }
        parts.answers.send(&self.received.message, AckKind::Ack).await;
        Some(skip)
    }

    /// Ends a delivery of a run cancelled before it started: the record says `cancelled`
    /// with `reason` (unless the run had ended: then only acked), `run.cancelled` is told, and
    /// the message is acked. A record not written hands the message back.
    pub(super) async fn end_cancelled(&mut self, reason: &str) {
        spans::outcome("cancelled");
        let parts = self.parts;
        let cancelled = parts.runs.cancel(self.dispatch, self.attempt, &parts.worker, reason).await;
        match cancelled {
            Ok(Skip::Skipped) => {
                tracing::info!(reason, "run cancelled before it started: not run");
                let priority = self.dispatch.priority.as_str();
                parts.metrics.runs.with_label_values(&[self.queue, "cancelled", priority]).inc();
                let mut event = self.event(EventKind::RunCancelled, self.attempt);
                event.reason = Some(reason.to_string());
                self.tell(event).await;
            }
            Ok(_) => tracing::info!("delivery of a run cancelled or ended already: acked without running"),
            Err(error) => {
                parts.metrics.errors.with_label_values(&["run_record"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot record the cancelled run; handing it back"
                );
                parts.answers.send(&self.received.message, AckKind::Nak(Some(RETRY_DELAY))).await;
                return;
            }
        }
        parts.answers.send(&self.received.message, AckKind::Ack).await;
    }

    async fn delay(&mut self, gate: &Gate) {
        let parts = self.parts;
        let at = gate.comeback(Utc::now(), rand::random::<f64>());
        match self.republish(at, None).await {
            Ok(()) => {
                parts.metrics.short_circuited.with_label_values(&[&gate.key, "delay"]).inc();
                tracing::info!(key = gate.key, until = %format_time(at), "breaker open: run delayed");
                // The record and the event say the run is held, and until when; the message
                // held by the server is the run now, so a record not written is only logged.
                self.record_held(at, &gate.key, None).await;
                parts.answers.send(&self.received.message, AckKind::Ack).await;
            }
            Err(error) => {
                parts.metrics.errors.with_label_values(&["delay"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot delay the run; handing it back");
                parts.answers.send(&self.received.message, AckKind::Nak(Some(RETRY_DELAY))).await;
            }
        }
    }

    /// Records the run held until `release` by `key` (with `reason`, when not the breaker) and
    /// tells `run.held`; the message the server holds is the run now, so a record not written is
    /// only logged.
    pub(super) async fn record_held(
        &mut self,
        release: chrono::DateTime<Utc>,
        key: &str,
        reason: Option<&str>,
    ) {
        let parts = self.parts;
        match parts.runs.hold(self.dispatch, self.attempt, &parts.worker, release).await {
            Ok(true) => {
                let mut event = self.event(EventKind::RunHeld, self.attempt);
                event.release_at = Some(release);
                event.key = Some(key.to_string());
                event.reason = reason.map(str::to_string);
                self.tell(event).await;
            }
            Ok(false) => {}
            Err(error) => {
                parts.metrics.errors.with_label_values(&["run_record"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot record the held run");
            }
        }
    }

    /// Publishes the dispatch again as a message the server holds until `at`, on the queue's
    /// delayed subject, aimed at the original dispatch subject, with the start its rate limit
    /// reserved (`reserved`, [`HDR_RATE_START`]) if any; awaits the stream's ack.
    pub(super) async fn republish(
        &self,
        at: chrono::DateTime<Utc>,
        reserved: Option<String>,
    ) -> anyhow::Result<()> {
        let message = &self.received.message;
        let delays = self.received.delays() + 1;
        let mut headers = HeaderMap::new();
        if let Some(original) = message.headers.as_ref() {
            for (name, values) in original.iter() {
                let name: &str = name.as_ref();
                // Server headers (message id, a previous schedule's) are not carried over.
                if name.starts_with("Nats-")
                    || name == HDR_ATTEMPTS_SPENT
                    || name == HDR_DELAYS
                    || name == HDR_RATE_START
                {
                    continue;
                }
                for value in values {
                    headers.append(name, value.clone());
                }
            }
        }
        let id = format!("{}:delay:{delays}", self.dispatch.execution_id);
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        headers.insert(HDR_ATTEMPTS_SPENT, HeaderValue::from(self.attempt.saturating_sub(1).to_string()));
        headers.insert(HDR_DELAYS, HeaderValue::from(delays.to_string()));
        headers.insert(HDR_SCHEDULE, HeaderValue::from(format!("@at {}", format_time(at))));
        headers.insert(HDR_SCHEDULE_TARGET, HeaderValue::from(message.subject.to_string()));
        if let Some(reserved) = reserved {
            headers.insert(HDR_RATE_START, HeaderValue::from(reserved));
        }
        let dispatch = self.dispatch;
        let subject = self.parts.names.delayed_subject(
            self.queue,
            &dispatch.namespace,
            &dispatch.task_id,
            &dispatch.execution_id,
        );
        let js = &self.parts.js;
        let ack = js
            .publish_with_headers(subject.clone(), headers, message.payload.clone())
            .await
            .with_context(|| format!("publish delayed run on {subject}"))?;
        ack.await.with_context(|| format!("store delayed run on {subject}"))?;
        Ok(())
    }
}
