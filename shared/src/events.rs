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

    /// Publishes an event (with `id` as its `Nats-Msg-Id`, if given, so a retry is stored once)
    /// until the stream stores it, retrying with backoff; fails with the last error once the
    /// next attempt would start after `deadline`.
    pub async fn store_until(
        &self,
        event: &Event,
        id: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> anyhow::Result<()> {
        let started = tokio::time::Instant::now();
        let mut backoff = std::time::Duration::from_millis(50);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let sent = match id {
                Some(id) => self.send_with_id(event, id).await,
                None => self.send(event).await,
            };
            let error = match sent {
                Ok(ack) => match ack.await {
                    Ok(_) => return Ok(()),
                    Err(error) => anyhow::Error::from(error),
                },
                Err(error) => error,
            };
            if tokio::time::Instant::now() + backoff > deadline {
                return Err(
                    error.context(format!("gave up after {attempts} attempts in {:?}", started.elapsed()))
                );
            }
            if attempts == 1 {
                tracing::debug!(
                    error = format!("{error:#}"),
                    kind = event.kind.as_str(),
                    "event not stored yet; retrying"
                );
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
        }
    }
}

/// How long the pump keeps retrying an event before it counts it as failed. A replicated
/// stream refuses writes while it elects a new leader (after a node died: seconds), and the
/// scheduler's fire state waits behind these events, so a skipped fire is only recorded as
/// handled once its event is stored.
pub const DEFAULT_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// Events handed to a background publisher: `emit` returns once the event is queued (waiting
/// only when the bounded queue is full; `try_emit` never waits), and the pump pipelines the
/// publishes with a bounded window of unacknowledged ones, retrying a failed publish with
/// backoff under the same `Nats-Msg-Id`, so a retry never stores an event twice (see
/// [`EventPump::without_dedup_ids`] for the cheaper variant). An event that
/// still cannot be stored is logged and counted, never silently dropped.
#[derive(Clone)]
pub struct EventSink {
    queue: tokio::sync::mpsc::Sender<Item>,
}

/// What travels to the pump: an event, or a barrier answered once everything queued before it
/// has settled.
enum Item {
    Event(Box<Event>),
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// Resolves once every event queued before it was created has been stored or has failed for
/// good (see [`EventSink::barrier`]).
pub struct Barrier(
    Option<tokio::sync::oneshot::Receiver<()>>,
    Option<(EventSink, tokio::sync::oneshot::Sender<()>)>,
);

impl Barrier {
    /// Waits for the barrier. Returns at once if the pump has stopped.
    pub async fn wait(mut self) {
        if let Some((sink, tx)) = self.1.take() {
            // The queue was full when the barrier was taken: queue it now (after more events
            // perhaps, which only makes the wait longer).
            if sink.queue.send(Item::Barrier(tx)).await.is_err() {
                return;
            }
        }
        if let Some(rx) = self.0.take() {
            let _ = rx.await;
        }
    }
}

/// The background half of an [`EventSink`]: runs until every sink is dropped and every queued
/// event has been stored (or failed).
pub struct EventPump {
    queue: tokio::sync::mpsc::Receiver<Item>,
    publisher: EventPublisher,
    window: usize,
    failures: Option<prometheus::IntCounter>,
    dedup_ids: bool,
    retry_for: std::time::Duration,
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
            EventPump {
                queue: receiver,
                publisher,
                window: window.max(1),
                failures,
                dedup_ids: true,
                retry_for: DEFAULT_RETRY_FOR,
            },
        )
    }

    /// Queues an event, waiting while the queue is full. Fails only when the pump has stopped.
    pub async fn emit(&self, event: Event) {
        if let Err(error) = self.queue.send(Item::Event(Box::new(event))).await
            && let Item::Event(event) = error.0
        {
            tracing::error!(kind = event.kind.as_str(), namespace = %event.namespace, task = %event.task_id, "event pump stopped; event not published");
        }
    }

    /// Queues an event without waiting; false when the queue is full (the caller counts it).
    pub fn try_emit(&self, event: Event) -> bool {
        self.queue.try_send(Item::Event(Box::new(event))).is_ok()
    }

    /// A barrier behind every event queued so far: [`Barrier::wait`] returns once each of them
    /// is stored (or failed for good). Taking it never waits, so a caller can mark the point
    /// synchronously and wait elsewhere: the scheduler writes fire state (which says "these
    /// fires are handled") only after the events that record skipped fires are stored.
    pub fn barrier(&self) -> Barrier {
        let (tx, rx) = tokio::sync::oneshot::channel();
        match self.queue.try_send(Item::Barrier(tx)) {
            Ok(()) => Barrier(Some(rx), None),
            Err(tokio::sync::mpsc::error::TrySendError::Full(Item::Barrier(tx))) => {
                Barrier(Some(rx), Some((self.clone(), tx)))
            }
            Err(_) => Barrier(None, None),
        }
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

    /// How long a publish is retried before the event counts as failed (default
    /// [`DEFAULT_RETRY_FOR`]).
    pub fn retry_for(mut self, retry_for: std::time::Duration) -> EventPump {
        self.retry_for = retry_for;
        self
    }

    /// Publishes queued events until every [`EventSink`] is dropped.
    pub async fn run(mut self) {
        use futures::StreamExt;
        let mut in_flight = futures::stream::FuturesUnordered::new();
        // Sequence numbers of the events in flight, and the barriers waiting behind them.
        let mut next_seq = 0u64;
        let mut outstanding = std::collections::BTreeSet::new();
        let mut barriers: std::collections::VecDeque<(u64, tokio::sync::oneshot::Sender<()>)> =
            std::collections::VecDeque::new();
        loop {
            tokio::select! {
                biased;
                Some((seq, kind, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    self.settle(kind, result);
                    outstanding.remove(&seq);
                }
                item = self.queue.recv(), if in_flight.len() < self.window => {
                    match item {
                        None => break,
                        Some(Item::Event(event)) => {
                            let seq = next_seq;
                            next_seq += 1;
                            outstanding.insert(seq);
                            let store = store(self.publisher.clone(), *event, self.dedup_ids, self.retry_for);
                            in_flight.push(async move {
                                let (kind, result) = store.await;
                                (seq, kind, result)
                            });
                        }
                        Some(Item::Barrier(tx)) => barriers.push_back((next_seq, tx)),
                    }
                }
                else => break,
            }
            // A barrier taken when `next_seq` was n waits for every event numbered below n.
            let lowest = outstanding.first().copied().unwrap_or(next_seq);
            while barriers.front().is_some_and(|(at, _)| *at <= lowest) {
                if let Some((_, tx)) = barriers.pop_front() {
                    let _ = tx.send(());
                }
            }
        }
        while let Some((_, kind, result)) = in_flight.next().await {
            self.settle(kind, result);
        }
        for (_, tx) in barriers {
            let _ = tx.send(());
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

/// Publishes one event until the stream stores it or `retry_for` has passed.
async fn store(
    publisher: EventPublisher,
    event: Event,
    dedup_id: bool,
    retry_for: std::time::Duration,
) -> (crate::wire::EventKind, anyhow::Result<()>) {
    let id = dedup_id.then(|| uuid::Uuid::now_v7().to_string());
    let deadline = tokio::time::Instant::now() + retry_for;
    (event.kind, publisher.store_until(&event, id.as_deref(), deadline).await)
}
