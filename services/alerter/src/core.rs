//! The alerter's loop: one `select!` over a closed [`Event`] (shutdown first, then the rules'
//! and alerts' next deadline, the next check, lease changes, leader changes, and last the
//! shared event consumers, always ready under load), and `Core`, which holds the parts and
//! hands what they bring to the rules.
//!
//! Each part owns its state and its deadlines: [`Detector`] (the rules' episodes and the no
//! leader deadline), [`Alerts`] (de-duplication windows, groups, the rate limit, channels),
//! [`Checks`] (the next check), [`Lease`] and [`Leaders`] (their stream and when to reopen
//! it) and [`Feed`] (the shared consumers and the pause after a pull error).

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use jetsched_shared::names::Names;
use tokio::time::{sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::alerts::Alerts;
use crate::checks::Checks;
use crate::feed::Feed;
use crate::leaders::{Change, Leaders};
use crate::lease::{Holder, Lease, Seen};
use crate::metrics::Metrics;
use crate::rules::detector::Detector;

/// Everything the loop reacts to.
enum Event {
    Shutdown,
    /// The rules' or the alerts' deadline passed.
    Due,
    Check,
    Lease(Seen),
    Leader(Change),
    /// A message of the shared consumers; `None` once they all ended.
    Message(Option<Box<jetstream::Message>>),
}

/// The loop's owner: the parts and the NATS handles the checks use.
pub(crate) struct Core {
    pub(crate) js: jetstream::Context,
    pub(crate) names: Names,
    pub(crate) metrics: Metrics,
    pub(crate) detector: Detector,
    pub(crate) alerts: Alerts,
    pub(crate) checks: Checks,
    pub(crate) lease: Lease,
    pub(crate) leaders: Leaders,
    pub(crate) feed: Feed,
}

async fn sleep_opt(at: Option<DateTime<Utc>>) {
    match at {
        Some(at) => sleep((at - Utc::now()).to_std().unwrap_or_default()).await,
        None => std::future::pending().await,
    }
}

impl Core {
    /// Until `shutdown`; an error when the shared consumers' messages end.
    pub(crate) async fn run(&mut self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        loop {
            let due = self.next_deadline();
            // Work made due by the last wake-up (an alert to send now) runs at once: a zero
            // sleep would lose the race against an event stream that is always ready.
            if due.is_some_and(|due| due <= Utc::now()) {
                self.settle(Utc::now()).await;
                continue;
            }
            let check_at = self.checks.next_at();
            let event = tokio::select! {
                biased;
                _ = shutdown.cancelled() => Event::Shutdown,
                // Timers before the streams, so a flood of events cannot starve them.
                () = sleep_opt(due) => Event::Due,
                // Before the lease and leader streams: while JetStream is down their reopening
                // is always due (each waits out its request's timeout), and the checks are what
                // alert on it.
                () = sleep_until(check_at) => Event::Check,
                seen = self.lease.next() => Event::Lease(seen),
                change = self.leaders.next() => Event::Leader(change),
                message = self.feed.next() => Event::Message(message.map(Box::new)),
            };
            match event {
                Event::Shutdown => return Ok(()),
                Event::Due => self.settle(Utc::now()).await,
                Event::Check => self.check().await,
                Event::Lease(Seen::Holder(holder)) => self.on_holder(holder),
                Event::Lease(Seen::Reopen) => {
                    if let Some(holder) = self.lease.reopen().await {
                        self.on_holder(holder);
                    }
                }
                Event::Leader(Change::Acquired(event)) => {
                    self.metrics.events.with_label_values(&[event.kind.as_str()]).inc();
                    // Changes older than the dedup window (history replayed at start-up) only
                    // count towards flapping; newer ones raise alerts, which the dedup bucket
                    // keeps from repeating what was already sent.
                    let now = Utc::now();
                    if self.alerts.is_history(event.time, now) {
                        self.detector.record_leader_change(event.time);
                    } else {
                        let candidates = self.detector.on_event(&event);
                        self.alerts.raise(now, candidates).await;
                    }
                }
                Event::Leader(Change::Reopen) => self.leaders.reopen().await,
                Event::Message(Some(message)) => self.on_message(*message).await,
                Event::Message(None) => anyhow::bail!("event message stream ended"),
            }
        }
    }

    /// The earliest of the rules' and the alerts' deadlines.
    fn next_deadline(&self) -> Option<DateTime<Utc>> {
        [self.alerts.next_deadline(), self.detector.next_deadline()].into_iter().flatten().min()
    }

    /// Time-driven rules, then follow-ups and due messages.
    async fn settle(&mut self, now: DateTime<Utc>) {
        let candidates = self.detector.tick(now);
        self.alerts.raise(now, candidates).await;
        self.alerts.settle(now).await;
    }

    pub(crate) fn on_holder(&mut self, Holder { holder, since }: Holder) {
        self.metrics.leader_present.set(i64::from(holder.is_some()));
        self.detector.on_leader(holder.as_deref(), since);
    }

    async fn check(&mut self) {
        let seen = self.checks.run(&self.js, &self.names).await;
        let mut candidates = self.detector.on_jetstream(seen.at, seen.unavailable.as_deref());
        if let Some(depths) = &seen.depths {
            candidates.extend(self.detector.on_queue_depths(seen.at, depths));
        }
        if let Some(dlq) = seen.dlq {
            candidates.extend(self.detector.on_dlq(seen.at, dlq));
        }
        if let Some(waits) = &seen.limit_waits {
            candidates.extend(self.detector.on_limit_waits(seen.at, waits));
        }
        self.alerts.raise(Utc::now(), candidates).await;
    }

    async fn on_message(&mut self, message: jetstream::Message) {
        match serde_json::from_slice::<jetsched_shared::wire::Event>(&message.payload) {
            Ok(event) => {
                self.metrics.events.with_label_values(&[event.kind.as_str()]).inc();
                let candidates = self.detector.on_event(&event);
                self.alerts.raise(Utc::now(), candidates).await;
            }
            Err(error) => {
                self.metrics.events.with_label_values(&["undecodable"]).inc();
                tracing::warn!(%error, subject = %message.subject, "ignoring an undecodable event");
            }
        }
        // Acked once its alerts are claimed and queued: a crash before redelivers the event,
        // and the claimed window keeps it from alerting twice.
        if let Err(error) = message.ack().await {
            self.metrics.errors.with_label_values(&["ack"]).inc();
            tracing::warn!(%error, "ack event");
        }
    }
}
