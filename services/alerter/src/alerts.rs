//! From a raised candidate to queued messages: de-duplication and its windows claimed in the
//! alerter's bucket (shared by replicas), follow-ups of closed windows, grouping and the rate
//! limit ([`Throttle`]), then every channel. Owns when it has work next.

use chrono::{DateTime, Utc};

use crate::channels::Channels;
use crate::metrics::Metrics;
use crate::rules::Candidate;
use crate::rules::throttle::{Admission, DedupKey, Throttle};
use crate::state::{Claim, DedupStore};

pub(crate) struct Alerts {
    throttle: Throttle,
    store: DedupStore,
    channels: Channels,
    metrics: Metrics,
}

impl Alerts {
    pub(crate) fn new(throttle: Throttle, store: DedupStore, channels: Channels, metrics: Metrics) -> Alerts {
        Alerts { throttle, store, channels, metrics }
    }

    /// When [`Alerts::settle`] has work next.
    pub(crate) fn next_deadline(&self) -> Option<DateTime<Utc>> {
        self.throttle.next_deadline()
    }

    /// Whether an occurrence at `time` is history replayed at start-up (see
    /// [`Throttle::is_history`]).
    pub(crate) fn is_history(&self, time: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        self.throttle.is_history(time, now)
    }

    /// De-duplicates each candidate; those to send are claimed and wait in their group.
    pub(crate) async fn raise(&mut self, now: DateTime<Utc>, candidates: Vec<Candidate>) {
        for candidate in candidates {
            self.metrics.raised.with_label_values(&[candidate.rule.name()]).inc();
            match self.throttle.admit(now, &candidate) {
                Admission::Repeat => {
                    self.metrics.suppressed.with_label_values(&[candidate.rule.name(), "dedup"]).inc();
                }
                Admission::Send { repeats } => self.claim_and_record(now, &candidate, repeats).await,
            }
        }
    }

    /// Follow-ups of closed windows, then the messages due at `now` go to the channels.
    pub(crate) async fn settle(&mut self, now: DateTime<Utc>) {
        for (candidate, repeats) in self.throttle.due_followups(now) {
            self.claim_and_record(now, &candidate, repeats).await;
        }
        for message in self.throttle.flush(now) {
            self.channels.send(message);
        }
        for (rule, count) in self.throttle.take_rate_limited() {
            self.metrics.suppressed.with_label_values(&[rule.name(), "rate_limit"]).inc_by(count);
        }
    }

    /// At shutdown: everything still waiting goes to the channels; they then deliver their
    /// queues and end once this is dropped.
    pub(crate) fn drain(mut self, now: DateTime<Utc>) -> Channels {
        for message in self.throttle.drain(now) {
            self.channels.send(message);
        }
        self.channels
    }

    async fn claim_and_record(&mut self, now: DateTime<Utc>, candidate: &Candidate, repeats: u64) {
        let until = self.throttle.window_until(now);
        match self.store.claim(&DedupKey::of(candidate), now, until).await {
            Ok(Claim::Won) => self.throttle.record_sent(now, candidate, repeats, until),
            Ok(Claim::Lost { until }) => {
                self.metrics.suppressed.with_label_values(&[candidate.rule.name(), "dedup"]).inc();
                self.throttle.adopt(candidate, until);
            }
            Err(error) => {
                // Better a possible duplicate than a lost alert.
                self.metrics.errors.with_label_values(&["dedup_store"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    rule = candidate.rule.name(),
                    "cannot record the alert window; sending anyway"
                );
                self.throttle.record_sent(now, candidate, repeats, until);
            }
        }
    }
}
