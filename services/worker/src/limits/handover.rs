//! A slot handed over to a waiting run: its parked message published back into its lane (the
//! subject it was dispatched on), then deleted. The copy's message id is derived from the
//! parked message (`<execution_id>:slot:<sequence>`), so a repeated hand-over is stored once.
//! A waiting run whose parked message is gone (cancelled, or come back by itself) gives its
//! reservation back at once.
//!
//! Why the worker publishes the run itself rather than have the server release the parked
//! message (a schedule due now): measured with three workers under `limit: 2`, releases by the
//! server's schedule took a quarter of a second each, and the same 451 runs took 65 s instead
//! of 24 s.

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

impl Limits {
    /// Delivers each waiter handed a slot of `key`; a waiter whose parked message is gone gives
    /// its slot back (and the next waiter gets it). Failures are logged and counted: the
    /// reservation's lease frees the slot, the parked message comes back by itself.
    pub(crate) async fn deliver_handed(&self, key: &str, mut handed: Vec<Waiter>) {
        for _ in 0..MISSING_ROUNDS {
            let mut missing = Vec::new();
            for waiter in &handed {
                match self.wake(waiter).await {
                    Ok(true) => {
                        tracing::info!(key, execution_id = %waiter.execution_id, "concurrency slot handed over");
                    }
                    Ok(false) => missing.push(waiter.execution_id.clone()),
                    Err(error) => {
                        self.metrics.errors.with_label_values(&["limit_handover"]).inc();
                        tracing::warn!(
                            error = format!("{error:#}"), key, execution_id = %waiter.execution_id,
                            "cannot hand a concurrency slot over; the parked run comes back by itself"
                        );
                    }
                }
            }
            if missing.is_empty() {
                return;
            }
            let lease = self.lease_chrono();
            let given_back = self
                .modify(key, |record| {
                    let mut changed = false;
                    for id in &missing {
                        if record.holders.get(id).is_some_and(|h| h.seq.is_none()) {
                            record.holders.remove(id);
                            changed = true;
                        }
                    }
                    let next = rules::hand_over(record, &self.worker, Utc::now(), lease);
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

    /// Publishes the waiter's parked message into its lane and deletes it; false when it is
    /// not parked any more.
    async fn wake(&self, waiter: &Waiter) -> anyhow::Result<bool> {
        let parked = match self.dispatch.get_last_raw_message_by_subject(&waiter.subject).await {
            Ok(message) => message,
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(false),
            Err(error) => return Err(error).with_context(|| format!("read parked run {}", waiter.subject)),
        };
        let Some((target, headers)) = lane_copy(&parked, &waiter.execution_id) else {
            anyhow::bail!("parked run {} names no lane", waiter.subject);
        };
        let ack = self
            .js
            .publish_with_headers(target.clone(), headers, parked.payload.clone())
            .await
            .with_context(|| format!("publish handed-over run on {target}"))?;
        ack.await.with_context(|| format!("store handed-over run on {target}"))?;
        if let Err(error) = self.dispatch.delete_message(parked.sequence).await {
            // It comes back by itself later, and is recognised as a copy then.
            tracing::debug!(%error, subject = %waiter.subject, "parked run not deleted");
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
