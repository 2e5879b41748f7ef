//! Leader changes (`leader.acquired`) for this replica alone, through an ordered consumer that
//! starts a flapping window back: each replica counts every change towards flapping (the dedup
//! bucket keeps their alerts single). A consumer that ends is reopened after the latest event
//! seen.

use anyhow::Context;
use async_nats::jetstream::{
    self,
    consumer::{DeliverPolicy, pull},
};
use chrono::{DateTime, Utc};
use jetsched_shared::admin::Readiness;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{Event, EventKind};

use crate::metrics::Metrics;
use crate::reopen::{Next, Reopening};

/// What the leader events part brings to the loop.
pub(crate) enum Change {
    Acquired(Box<Event>),
    /// Time to reopen the consumer ([`Leaders::reopen`]).
    Reopen,
}

pub(crate) struct Leaders {
    js: jetstream::Context,
    names: Names,
    events: Reopening<pull::Ordered>,
    /// Time of the latest leader event seen (where a reopened consumer resumes).
    seen: DateTime<Utc>,
    metrics: Metrics,
}

impl Leaders {
    /// Every leader change since `since`.
    pub(crate) async fn open(
        js: jetstream::Context,
        names: Names,
        since: DateTime<Utc>,
        readiness: Readiness,
        metrics: Metrics,
    ) -> anyhow::Result<Leaders> {
        let consumer = consumer(&js, &names, since).await?;
        let events = Reopening::new("leader_events", Some(consumer), readiness, metrics.clone());
        Ok(Leaders { js, names, events, seen: since, metrics })
    }

    /// The next leader change, or the moment to reopen the consumer. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Change {
        loop {
            let message = match self.events.next().await {
                Next::Item(message) => message,
                Next::Reopen => return Change::Reopen,
            };
            match serde_json::from_slice::<Event>(&message.payload) {
                Ok(event) => {
                    self.seen = self.seen.max(event.time);
                    return Change::Acquired(Box::new(event));
                }
                Err(error) => {
                    self.metrics.events.with_label_values(&["undecodable"]).inc();
                    tracing::warn!(%error, "ignoring an undecodable leader event");
                }
            }
        }
    }

    /// Reopens the consumer just after the latest event seen.
    pub(crate) async fn reopen(&mut self) {
        let since = self.seen + chrono::Duration::milliseconds(1);
        let consumer = match consumer(&self.js, &self.names, since).await {
            Ok(consumer) => Some(consumer),
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "cannot reopen leader events; retrying");
                None
            }
        };
        self.events.opened(consumer);
    }
}

async fn consumer(
    js: &jetstream::Context,
    names: &Names,
    since: DateTime<Utc>,
) -> anyhow::Result<pull::Ordered> {
    let name = names.events_stream();
    let stream = js.get_stream(&name).await.with_context(|| format!("look up stream {name}"))?;
    let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(
        since.timestamp_nanos_opt().unwrap_or_default(),
    ))
    .context("leader events start time")?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: leader_filter(names),
            deliver_policy: DeliverPolicy::ByStartTime { start_time },
            ..Default::default()
        })
        .await
        .with_context(|| format!("ordered consumer of leader events on {name}"))?;
    consumer.messages().await.with_context(|| format!("read leader events from {name}"))
}

/// The subject filter of the leader events.
pub(crate) fn leader_filter(names: &Names) -> String {
    names.event_subject(LEADER_KIND.as_str(), "*", "*")
}

/// The kind read here, by every replica, rather than through the shared consumers.
pub(crate) const LEADER_KIND: EventKind = EventKind::LeaderAcquired;
