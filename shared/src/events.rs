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

    /// Sends an event with a `Nats-Msg-Id`, so a retried publish is stored once.
    pub async fn send_with_id(&self, event: &Event, id: &str) -> anyhow::Result<PublishAckFuture> {
        let subject = self.names.event_subject(event.kind.as_str(), &event.namespace, &event.task_id);
        let body = serde_json::to_vec(event).context("encode event")?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        self.js
            .publish_with_headers(subject, headers, body.into())
            .await
            .with_context(|| format!("publish {} event", event.kind.as_str()))
    }

    /// Publishes an event and waits until the stream stored it.
    pub async fn publish(&self, event: &Event) -> anyhow::Result<()> {
        self.send(event).await?.await.with_context(|| format!("store {} event", event.kind.as_str()))?;
        Ok(())
    }
}

/// How many times the pump publishes an event before it counts it as failed (a replicated
/// stream refuses writes for a moment while it elects a new leader).
const PUBLISH_ATTEMPTS: u32 = 6;

/// Events handed to a background publisher: `emit` returns once the event is queued (waiting
/// only when the bounded queue is full; `try_emit` never waits), and the pump pipelines the
/// publishes with a bounded window of unacknowledged ones, retrying a failed publish with
/// backoff under the same `Nats-Msg-Id`, so a retry never stores an event twice (see
/// [`EventPump::without_dedup_ids`] for the cheaper variant). An event that
/// still cannot be stored is logged and counted, never silently dropped.
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
    dedup_ids: bool,
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
        (
            EventSink { queue },
            EventPump { queue: receiver, publisher, window: window.max(1), failures, dedup_ids: true },
        )
    }

    /// Queues an event, waiting while the queue is full. Fails only when the pump has stopped.
    pub async fn emit(&self, event: Event) {
        if let Err(error) = self.queue.send(event).await {
            let event = error.0;
            tracing::error!(kind = event.kind.as_str(), namespace = %event.namespace, task = %event.task_id, "event pump stopped; event not published");
        }
    }

    /// Queues an event without waiting; false when the queue is full (the caller counts it).
    pub fn try_emit(&self, event: Event) -> bool {
        self.queue.try_send(event).is_ok()
    }
}

impl EventPump {
    /// Publishes without a `Nats-Msg-Id`: cheaper for the server (no de-duplication entry per
    /// event), at the price that a publish retried after a lost acknowledgement may store that
    /// event twice. For events whose duplicates mislead nobody (task changes); fire events keep
    /// their ids, since a doubled `fire.dispatched` would read as a doubled fire.
    pub fn without_dedup_ids(mut self) -> EventPump {
        self.dedup_ids = false;
        self
    }

    /// Publishes queued events until every [`EventSink`] is dropped.
    pub async fn run(mut self) {
        use futures::StreamExt;
        let mut in_flight = futures::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                biased;
                Some((kind, result)) = in_flight.next(), if !in_flight.is_empty() => self.settle(kind, result),
                event = self.queue.recv(), if in_flight.len() < self.window => {
                    let Some(event) = event else { break };
                    in_flight.push(store(self.publisher.clone(), event, self.dedup_ids));
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

/// Publishes one event until the stream stores it or the attempts run out.
async fn store(
    publisher: EventPublisher,
    event: Event,
    dedup_id: bool,
) -> (crate::wire::EventKind, anyhow::Result<()>) {
    let id = dedup_id.then(|| uuid::Uuid::now_v7().to_string());
    let mut backoff = std::time::Duration::from_millis(50);
    let mut last = None;
    for attempt in 1..=PUBLISH_ATTEMPTS {
        let sent = match &id {
            Some(id) => publisher.send_with_id(&event, id).await,
            None => publisher.send(&event).await,
        };
        match sent {
            Ok(ack) => match ack.await {
                Ok(_) => return (event.kind, Ok(())),
                Err(error) => last = Some(anyhow::Error::from(error)),
            },
            Err(error) => last = Some(error),
        }
        if attempt < PUBLISH_ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
        }
    }
    (event.kind, Err(last.unwrap_or_else(|| anyhow::anyhow!("no attempt made"))))
}
