//! A slot handed over to a waiting run: its parked message published back into its lane (the
//! subject it was dispatched on), then deleted. The copy's message id is derived from the
//! parked message (`<execution_id>:slot:<sequence>`), so a repeated hand-over is stored once.
//! A waiting run whose parked message is gone (cancelled, or come back by itself) gives its
//! reservation back at once; one that joined the key moments ago may still be parking (its entry
//! is written before its message is stored), so it is looked for again after short pauses, and
//! a run that finds itself dropped once parked wakes itself ([`Limits::parked`]).
//!
//! Why the worker publishes the run itself rather than have the server release the parked
//! message (a schedule due now): measured with three workers under `limit: 2`, releases by the
//! server's schedule took a quarter of a second each, and the same 451 runs took 65 s instead
//! of 24 s.

use std::sync::Arc;

use anyhow::Context;
use async_nats::HeaderMap;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use chrono::Utc;
use jetsched_shared::wire::{HDR_SCHEDULE_TARGET, Waiter};

use super::{Limits, rules};

/// Hand-overs of one key whose parked message was missing, chained, before the rest is left
/// to the deadline loop.
const MISSING_ROUNDS: usize = 8;

/// A waiter that joined this recently and whose parked message is not there yet may still be
/// parking (its entry is written before its message): it is looked for again after each pause
/// before its slot is given back.
const STILL_PARKING: chrono::TimeDelta = chrono::TimeDelta::seconds(10);
const PARKING_PAUSES: [std::time::Duration; 2] =
    [std::time::Duration::from_millis(25), std::time::Duration::from_millis(100)];

impl Limits {
    /// Delivers each waiter handed a slot of `key`; a waiter whose parked message is gone gives
    /// its slot back (and the next waiter gets it). Failures are logged and counted: the
    /// reservation's lease frees the slot, the parked message comes back by itself.
    pub(crate) async fn deliver_handed(self: &Arc<Self>, key: &str, mut handed: Vec<Waiter>) {
        for _ in 0..MISSING_ROUNDS {
            let mut missing = self.wake_all(key, handed).await;
            for pause in PARKING_PAUSES {
                let recent = Utc::now() - STILL_PARKING;
                if !missing.iter().any(|w| w.since >= recent) {
                    break;
                }
                tokio::time::sleep(pause).await;
                let (parking, gone): (Vec<_>, Vec<_>) = missing.into_iter().partition(|w| w.since >= recent);
                missing = self.wake_all(key, parking).await;
                missing.extend(gone);
            }
            if missing.is_empty() {
                return;
            }
            let missing: Vec<String> = missing.into_iter().map(|w| w.execution_id).collect();
            let lease = self.lease_chrono();
            let worker = self.worker.clone();
            let given_back = self
                .modify(key, move |record| {
                    let mut changed = false;
                    for id in &missing {
                        if record.holders.get(id).is_some_and(|h| h.seq.is_none()) {
                            record.holders.remove(id);
                            changed = true;
                        }
                    }
                    let next = rules::hand_over(record, &worker, Utc::now(), lease);
                    changed |= !next.is_empty();
                    (next, changed)
                })
                .await;
            handed = match given_back {
                Ok(next) => next,
                Err(error) => {
                    self.metrics.errors.with_label_values(&["limit"]).inc();
                    tracing::warn!(
                        error = format!("{error:#}"),
                        key,
                        "cannot give back a slot of a vanished run"
                    );
                    return;
                }
            };
        }
    }

    /// Wakes each waiter handed a slot; returns those whose parked message was not found.
    async fn wake_all(&self, key: &str, handed: Vec<Waiter>) -> Vec<Waiter> {
        let mut missing = Vec::new();
        for waiter in handed {
            match self.wake(&waiter.subject, &waiter.execution_id).await {
                Ok(true) => {
                    tracing::info!(key, execution_id = %waiter.execution_id, "concurrency slot handed over");
                }
                Ok(false) => missing.push(waiter),
                Err(error) => {
                    self.metrics.errors.with_label_values(&["limit_handover"]).inc();
                    tracing::warn!(
                        error = format!("{error:#}"), key, execution_id = %waiter.execution_id,
                        "cannot hand a concurrency slot over; the parked run comes back by itself"
                    );
                }
            }
        }
        missing
    }

    /// Called by a run once it is parked: unless it still waits on the key, it wakes itself, so
    /// it asks again at once instead of waiting to come back by itself. Its entry is gone when
    /// a hand-over looked for its parked message before it was stored and gave the slot back;
    /// and a slot reserved for it may be given back just after this read, by a hand-over whose
    /// last look came before the message was stored. A hand-over's wake and this one publish
    /// the same copy (one message id), so the run comes back once.
    pub(crate) async fn parked(&self, key: &str, execution_id: &str, subject: &str) -> anyhow::Result<()> {
        let current = self.read(key).await?;
        let waiting = current.record.waiters.iter().any(|w| w.execution_id == execution_id);
        if !waiting && self.wake(subject, execution_id).await? {
            tracing::info!(key, execution_id, "a hand-over missed the run while it parked: it asks again");
        }
        Ok(())
    }

    /// Publishes the parked message on `subject` into its lane and deletes it; false when it is
    /// not parked any more.
    async fn wake(&self, subject: &str, execution_id: &str) -> anyhow::Result<bool> {
        let parked = match self.dispatch.get_last_raw_message_by_subject(subject).await {
            Ok(message) => message,
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(false),
            Err(error) => return Err(error).with_context(|| format!("read parked run {subject}")),
        };
        let Some((target, headers)) = lane_copy(&parked, execution_id) else {
            anyhow::bail!("parked run {subject} names no lane");
        };
        let ack = self
            .js
            .publish_with_headers(target.clone(), headers, parked.payload.clone())
            .await
            .with_context(|| format!("publish handed-over run on {target}"))?;
        ack.await.with_context(|| format!("store handed-over run on {target}"))?;
        if let Err(error) = self.dispatch.delete_message(parked.sequence).await {
            // It comes back by itself later, and is recognised as a copy then.
            tracing::debug!(%error, subject, "parked run not deleted");
        }
        Ok(true)
    }
}

/// The lane a parked message goes back to, and the headers of its copy: the parked message's
/// own, but the server's (schedule, message id), with the copy's message id.
fn lane_copy(parked: &StreamMessage, execution_id: &str) -> Option<(String, HeaderMap)> {
    let original = &parked.headers;
    let target = original.get(HDR_SCHEDULE_TARGET)?.as_str().to_string();
    let mut headers = HeaderMap::new();
    for (name, values) in original.iter() {
        let name: &str = name.as_ref();
        if name.starts_with("Nats-") {
            continue;
        }
        for value in values {
            headers.append(name, value.clone());
        }
    }
    let id = format!("{execution_id}:slot:{}", parked.sequence);
    headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    Some((target, headers))
}
