//! Publishing events to `JETSCHED_EVENTS` (`jetsched.event.<kind>.<namespace>.<task_id>`).

use anyhow::Context;
use async_nats::jetstream::{self, context::PublishAckFuture};

use crate::names::Names;
use crate::wire::Event;

/// Publishes events; cheap to clone.
#[derive(Clone)]
pub struct EventPublisher {
    js: jetstream::Context,
    names: Names,
}

impl EventPublisher {
    pub fn new(js: jetstream::Context, names: Names) -> EventPublisher {
        EventPublisher { js, names }
    }

    /// Sends an event without waiting for the stream's ack; await the returned future (possibly
    /// later, to pipeline) to know it is stored.
    pub async fn send(&self, event: &Event) -> anyhow::Result<PublishAckFuture> {
        let subject = self.names.event_subject(event.kind.as_str(), &event.namespace, &event.task_id);
        let body = serde_json::to_vec(event).context("encode event")?;
        self.js
            .publish(subject, body.into())
            .await
            .with_context(|| format!("publish {} event", event.kind.as_str()))
    }

    /// Publishes an event and waits until the stream stored it.
    pub async fn publish(&self, event: &Event) -> anyhow::Result<()> {
        self.send(event).await?.await.with_context(|| format!("store {} event", event.kind.as_str()))?;
        Ok(())
    }
}
