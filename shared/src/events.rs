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

/// Events handed to a background publisher: `emit` returns once the event is queued (waiting
/// only when the bounded queue is full), and the publisher pipelines the publishes with a
/// bounded window of unacknowledged ones. Use it where an event must not add a round trip to
/// a request; a failed publish is logged and counted, never silently dropped.
#[derive(Clone)]
pub struct EventSink {
    queue: tokio::sync::mpsc::Sender<Event>,
}

/// The background half of an [`EventSink`]: runs until every sink is dropped and every queued
/// event has been stored (or failed).
pub struct EventPump {
    queue: tokio::sync::mpsc::Receiver<Event>,
    publisher: EventPublisher,
    window: usize,
    failures: Option<prometheus::IntCounter>,
}

impl EventSink {
    /// A sink with a queue of `capacity` events and at most `window` unacknowledged publishes.
    /// `failures` counts events that could not be stored.
    pub fn new(
        publisher: EventPublisher,
        capacity: usize,
        window: usize,
        failures: Option<prometheus::IntCounter>,
    ) -> (EventSink, EventPump) {
        let (queue, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        (EventSink { queue }, EventPump { queue: receiver, publisher, window: window.max(1), failures })
    }

    /// Queues an event. Fails only when the pump has stopped.
    pub async fn emit(&self, event: Event) {
        if let Err(error) = self.queue.send(event).await {
            let event = error.0;
            tracing::error!(kind = event.kind.as_str(), namespace = %event.namespace, task = %event.task_id, "event pump stopped; event not published");
        }
    }
}

impl EventPump {
    /// Publishes queued events in order until every [`EventSink`] is dropped.
    pub async fn run(mut self) {
        use futures::StreamExt;
        let mut in_flight = futures::stream::FuturesOrdered::new();
        loop {
            tokio::select! {
                biased;
                Some((kind, result)) = in_flight.next(), if !in_flight.is_empty() => self.settle(kind, result),
                event = self.queue.recv(), if in_flight.len() < self.window => {
                    let Some(event) = event else { break };
                    let kind = event.kind;
                    match self.publisher.send(&event).await {
                        Ok(ack) => in_flight.push_back(async move { (kind, ack.await.map(|_| ()).map_err(anyhow::Error::from)) }),
                        Err(error) => self.settle(kind, Err(error)),
                    }
                }
                else => break,
            }
        }
        while let Some((kind, result)) = in_flight.next().await {
            self.settle(kind, result);
        }
    }

    fn settle(&self, kind: crate::wire::EventKind, result: anyhow::Result<()>) {
        if let Err(error) = result {
            tracing::error!(error = format!("{error:#}"), kind = kind.as_str(), "event not stored");
            if let Some(failures) = &self.failures {
                failures.inc();
            }
        }
    }
}
