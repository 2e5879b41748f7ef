//! A delivery's rate limit ([`crate::rate`]): the start its key allows, reserved once per
//! attempt; a run whose start is now goes on; a later one is skipped (`on_limit: skip`, reason
//! `rate_limited`, no reservation taken) or waits for it without holding a permit or spending
//! an attempt: held here, the message kept alive, when the start is near
//! ([`HOLD_WITHIN`]); otherwise re-published as a message the server holds until [`LEAD`]
//! before the start (as a breaker's delay, carrying the reservation: its next delivery does
//! not reserve again), then held here for the rest. The server releases scheduled messages on
//! a 250 ms tick, too coarse to pace runs by itself; the hold here starts each run at its
//! reserved time.

use std::pin::pin;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use chrono::{DateTime, Utc};
use jetsched_shared::names::{Names, breaker_reason};
use jetsched_shared::wire::{EventKind, RateDeclared, format_rate_start};

use super::shortcut::RETRY_DELAY;
use super::state::Delivery;
use crate::rate::gcra::{Decision, Gcra};
use crate::runs::skip::Skip;
use crate::spans;

/// A start at most this far ahead is waited for here (without a permit).
const HOLD_WITHIN: Duration = Duration::from_secs(1);

/// A run re-published for a later start comes back this long before it (the server's tick is
/// 250 ms), and waits here for the rest.
const LEAD: Duration = Duration::from_millis(500);

impl Delivery<'_> {
    /// The rate limit's say on this delivery; true when the delivery ended here (skipped,
    /// delayed, or handed back because the limit's bucket did not answer). A run held here for
    /// its start returns false once the start has come and its permit is back.
    pub(super) async fn rate_limit(&mut self) -> bool {
        let (parts, dispatch) = (self.parts, self.dispatch);
        let Some(rate) = dispatch.spec.rate_limit.as_ref() else { return false };
        let key = match rate.expand_key(&dispatch.namespace, &dispatch.task_id, &dispatch.spec.labels) {
            Ok(key) => Names::rate_key(&dispatch.namespace, &key),
            // Checked at `put`: a spec stored before that rule runs without its limit.
            Err(error) => {
                tracing::warn!(%error, "rate limit key does not expand: run not limited");
                return false;
            }
        };
        let start = match self.received.rate_start() {
            // This attempt's start was reserved before its delay.
            Some((attempt, start)) if attempt == self.attempt => start,
            _ => {
                let gcra = Gcra::new(rate.interval_us(), rate.burst);
                let period_ms = u64::try_from(rate.period.as_millis()).unwrap_or(u64::MAX);
                let declared = RateDeclared { limit: rate.limit, period_ms, burst: rate.burst };
                let about = self.event(EventKind::LimitThrottled, self.attempt);
                match parts.rates.admit(&key, gcra, declared, rate.on_limit, about).await {
                    Ok(Decision::Start(start)) => start,
                    Ok(Decision::Skip) => {
                        spans::outcome("rate_limited");
                        let reason = breaker_reason::RATE_LIMITED;
                        if self.end_skipped(reason, Some(&key), false).await == Some(Skip::Skipped) {
                            parts.rates.throttled.with_label_values(&[&key, "skip"]).inc();
                            tracing::info!(key, "rate limited: run skipped");
                        }
                        return true;
                    }
                    Err(error) => {
                        parts.metrics.errors.with_label_values(&["rate_limit"]).inc();
                        tracing::warn!(
                            error = format!("{error:#}"),
                            key,
                            "cannot reserve a start; handing the run back"
                        );
                        parts.answers.send(&self.received.message, AckKind::Nak(Some(RETRY_DELAY))).await;
                        return true;
                    }
                }
            }
        };
        let wait = wait_until(start);
        if wait.is_zero() {
            return false;
        }
        if self.received.rate_start().is_none_or(|(attempt, _)| attempt != self.attempt) {
            parts.rates.throttled.with_label_values(&[&key, "delay"]).inc();
        }
        if wait > HOLD_WITHIN {
            return self.delay_for_rate(&key, start).await;
        }
        // Held here: the permit goes back for the wait, the message is kept alive.
        self.permit.release();
        let message = &self.received.message;
        parts.answers.keeping_alive(message, pin!(tokio::time::sleep(wait_until(start)))).await;
        self.permit.reacquire().await;
        // Cancelled while it waited: it never starts.
        if let Some(reason) = parts.cancels.reason(&dispatch.execution_id) {
            self.end_cancelled(&reason).await;
            return true;
        }
        false
    }

    /// Re-publishes the run for the server to hand back [`LEAD`] before its reserved `start`,
    /// records it held until then with a `run.held` event, and acks this delivery. A publish
    /// that fails hands the message back (its next delivery reserves again: a start is lost,
    /// never doubled).
    async fn delay_for_rate(&mut self, key: &str, start: i64) -> bool {
        let parts = self.parts;
        let release = DateTime::<Utc>::from_timestamp_micros(start).unwrap_or_else(Utc::now);
        let at = release - chrono::Duration::from_std(LEAD).unwrap_or_default();
        match self.republish(at, Some(format_rate_start(self.attempt, start))).await {
            Ok(()) => {
                spans::outcome("rate_delayed");
                self.record_held(release, key, Some(breaker_reason::RATE_LIMITED)).await;
                parts.answers.send(&self.received.message, AckKind::Ack).await;
            }
            Err(error) => {
                parts.metrics.errors.with_label_values(&["delay"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot delay the run; handing it back");
                parts.answers.send(&self.received.message, AckKind::Nak(Some(RETRY_DELAY))).await;
            }
        }
        true
    }
}

/// How long until `start` (microseconds since the epoch); zero when it has come.
fn wait_until(start: i64) -> Duration {
    let micros = start.saturating_sub(Utc::now().timestamp_micros());
    Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}
