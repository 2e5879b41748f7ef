//! The one event publisher of every service: events to `JETSCHED_EVENTS`
//! (`jetsched.event.<kind>.<namespace>.<task_id>`), awaited, batched or queued.

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, context::PublishAckFuture};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::names::{self, Names};
use crate::wire::{Event, EventKind};

pub mod ingest;

/// The name of the counter every publishing service has.
pub const FAILED_METRIC: &str = "jetsched_events_failed_total";

/// The one way services publish events; cheap to clone. Three ways to use it:
/// - [`EventPublisher::queue`]: fire-and-forget through a bounded queue and a background pump
///   that pipelines and retries, with barriers (scheduler, registry);
/// - [`EventPublisher::batch`]: the events of one unit of work published as they come and
///   their acknowledgements awaited together at its end (worker; with
///   [`EventPublisher::with_batches`], the events of all its units in flight share
///   fast-ingest batches, see [`ingest`]);
/// - [`EventPublisher::publish`] / [`EventPublisher::store_until`]: one event, awaited.
///
/// An event given up for good (after its retries, or dropped from a full queue) is logged and
/// counted in `jetsched_events_failed_total`, never silently lost.
#[derive(Clone)]
pub struct EventPublisher {
    js: jetstream::Context,
    names: Names,
    failed: prometheus::IntCounter,
    /// Where [`EventBatch::emit`] sends events, when batches are on.
    ingest: Option<ingest::Ingest>,
}

impl EventPublisher {
    /// A publisher counting the events it gives up in `jetsched_events_failed_total`,
    /// registered on `metrics`.
    pub fn with_metrics(
        js: jetstream::Context,
        names: Names,
        metrics: &prometheus::Registry,
    ) -> prometheus::Result<EventPublisher> {
        let failed = prometheus::IntCounter::new(FAILED_METRIC, "Events given up after retries")?;
        metrics.register(Box::new(failed.clone()))?;
        Ok(EventPublisher { js, names, failed, ingest: None })
    }

    /// This publisher with the events of [`EventPublisher::batch`] stored through fast-ingest
    /// batches over `client` (one reply per batch instead of one per event; see [`ingest`]).
    pub async fn with_batches(self, client: async_nats::Client) -> anyhow::Result<EventPublisher> {
        let ingest =
            ingest::Ingest::start(client).await.context("subscribe to the event batches' replies")?;
        Ok(EventPublisher { ingest: Some(ingest), ..self })
    }

    /// Events given up so far.
    pub fn failed_total(&self) -> u64 {
        self.failed.get()
    }

    /// Logs and counts an event given up for good: the one place that does.
    pub fn give_up(&self, event: &Event, error: &anyhow::Error) {
        count_lost(&self.failed, event, &format!("{error:#}"));
    }

    /// Sends an event without waiting for the stream's ack; await the returned future (possibly
    /// later, to pipeline) to know it is stored.
    pub async fn send(&self, event: &Event) -> anyhow::Result<PublishAckFuture> {
        self.send_inner(event, None).await
    }

    /// Sends an event with a `Nats-Msg-Id`, so a retried publish is stored once.
    pub async fn send_with_id(&self, event: &Event, id: &str) -> anyhow::Result<PublishAckFuture> {
        self.send_inner(event, Some(id)).await
    }

    /// An event's subject and body.
    fn encode(&self, event: &Event) -> anyhow::Result<(String, Vec<u8>)> {
        let subject = self.names.event_subject(event.kind.as_str(), &event.namespace, &event.task_id);
        let body = serde_json::to_vec(event).context("encode event")?;
        Ok((subject, body))
    }

    async fn send_inner(&self, event: &Event, id: Option<&str>) -> anyhow::Result<PublishAckFuture> {
        let (subject, body) = self.encode(event)?;
        let sent = match id {
            Some(id) => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
                self.js.publish_with_headers(subject, headers, body.into()).await
            }
            None => self.js.publish(subject, body.into()).await,
        };
        sent.with_context(|| format!("publish {} event", event.kind.as_str()))
    }

    /// Publishes an event and waits until the stream stored it (one attempt).
    pub async fn publish(&self, event: &Event) -> anyhow::Result<()> {
        self.send(event).await?.await.with_context(|| format!("store {} event", event.kind.as_str()))?;
        Ok(())
    }

    /// Publishes an event (with `id` as its `Nats-Msg-Id`, if given, so a retry is stored once)
    /// until the stream stores it, retrying with backoff; fails with the last error once the
    /// next attempt would start after `deadline`. The caller decides whether that is final
    /// (then [`EventPublisher::give_up`]).
    pub async fn store_until(
        &self,
        event: &Event,
        id: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> anyhow::Result<()> {
        let attempt = |_| async move {
            let ack = self.send_inner(event, id).await?;
            ack.await.with_context(|| format!("store {} event", event.kind.as_str()))?;
            anyhow::Ok(())
        };
        let retryable = |error: &anyhow::Error, attempt: u32, _| {
            if attempt == 1 {
                tracing::debug!(
                    error = format!("{error:#}"),
                    kind = event.kind.as_str(),
                    "event not stored yet; retrying"
                );
            }
            true
        };
        Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
            .retry_until(deadline, attempt, retryable)
            .await
            .map_err(|gave_up| {
                let context = format!("gave up after {} attempts in {:?}", gave_up.attempts, gave_up.elapsed);
                gave_up.error.context(context)
            })
    }

    /// The events of one unit of work (see [`EventBatch`]).
    pub fn batch(&self) -> EventBatch<'_> {
        EventBatch { publisher: self, pending: Vec::new(), unsent: Vec::new() }
    }

    /// A background publisher: a queue of `capacity` events and a pump with at most `window`
    /// publishes awaiting their ack. Run the pump ([`EventPump::run`]) on a task of its own.
    pub fn queue(&self, capacity: usize, window: usize) -> (EventSink, EventPump) {
        let (queue, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        let sink = EventSink { queue, failed: self.failed.clone() };
        let pump = EventPump {
            queue: receiver,
            publisher: self.clone(),
            window: window.max(1),
            dedup_ids: true,
            retry_for: DEFAULT_RETRY_FOR,
        };
        (sink, pump)
    }
}

/// The events of one unit of work (a run's delivery): each is published as it comes, without
/// waiting (into the publisher's next fast-ingest batch when it has batches, see
/// [`EventPublisher::with_batches`]); [`EventBatch::flush`] then awaits every acknowledgement
/// together and publishes again, one by one, those not stored, until a deadline. Dropping a
/// batch without flushing it leaves its events' fate unknown.
pub struct EventBatch<'a> {
    publisher: &'a EventPublisher,
    pending: Vec<(Event, Pending)>,
    unsent: Vec<Event>,
}

/// An event sent, its acknowledgement to come.
enum Pending {
    Alone(PublishAckFuture),
    Batched(ingest::Pending),
}

impl EventBatch<'_> {
    /// Publishes `event` without waiting for its acknowledgement.
    pub async fn emit(&mut self, event: Event) {
        match self.send(&event).await {
            Ok(pending) => self.pending.push((event, pending)),
            Err(error) => {
                tracing::debug!(
                    error = format!("{error:#}"),
                    kind = event.kind.as_str(),
                    "event not sent yet"
                );
                self.unsent.push(event);
            }
        }
    }

    /// Sends `event` in the next batch while batches are on, else alone.
    async fn send(&self, event: &Event) -> anyhow::Result<Pending> {
        if let Some(ingest) = self.publisher.ingest.as_ref().filter(|ingest| ingest.accepting()) {
            let (subject, body) = self.publisher.encode(event)?;
            if let Some(pending) = ingest.send(subject.into(), body.into()).await {
                return Ok(Pending::Batched(pending));
            }
        }
        Ok(Pending::Alone(self.publisher.send(event).await?))
    }

    /// Waits until every event emitted is stored; one that is not is published again for up
    /// to `retry_for`, or until `stop` is cancelled, and then counted as failed.
    pub async fn flush(self, retry_for: Duration, stop: &CancellationToken) {
        let EventBatch { publisher, pending, mut unsent } = self;
        for (event, pending) in pending {
            let stored = match pending {
                Pending::Alone(ack) => ack.await.map(drop).map_err(|error| error.to_string()),
                Pending::Batched(batched) => batched.stored().await,
            };
            if let Err(error) = stored {
                tracing::debug!(%error, kind = event.kind.as_str(), "event not stored yet");
                unsent.push(event);
            }
        }
        if unsent.is_empty() {
            return;
        }
        let deadline = tokio::time::Instant::now() + retry_for;
        for event in unsent {
            let stored = tokio::select! {
                stored = publisher.store_until(&event, None, deadline) => stored,
                _ = stop.cancelled() => Err(anyhow::anyhow!("stopping")),
            };
            if let Err(error) = stored {
                publisher.give_up(&event, &error);
            }
        }
    }
}

/// How long the pump keeps retrying an event before it counts it as failed. A replicated
/// stream refuses writes while it elects a new leader (after a node died: seconds), and the
/// scheduler's fire state waits behind these events, so a skipped fire is only recorded as
/// handled once its event is stored.
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(60);

/// Events handed to a background publisher ([`EventPublisher::queue`]): `emit` returns once
/// the event is queued (waiting only when the bounded queue is full; `try_emit` never waits),
/// and the pump pipelines the publishes with a bounded window of unacknowledged ones, retrying
/// a failed publish with backoff under the same `Nats-Msg-Id`, so a retry never stores an event
/// twice (see [`EventPump::without_dedup_ids`] for the cheaper variant). An event that still
/// cannot be stored, or finds the queue full, is logged or counted, never silently dropped.
#[derive(Clone)]
pub struct EventSink {
    queue: tokio::sync::mpsc::Sender<Item>,
    /// The publisher's failure counter, for events that never reach the pump.
    failed: prometheus::IntCounter,
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
    dedup_ids: bool,
    retry_for: Duration,
}

impl EventSink {
    /// Queues an event, waiting while the queue is full. Fails (logged and counted) only when
    /// the pump has stopped.
    pub async fn emit(&self, event: Event) {
        if let Err(error) = self.queue.send(Item::Event(Box::new(event))).await
            && let Item::Event(event) = error.0
        {
            count_lost(&self.failed, &event, "event pump stopped");
        }
    }

    /// Queues an event without waiting. When the queue is full (or the pump stopped) the event
    /// is dropped, logged, counted as failed, and false returned.
    pub fn try_emit(&self, event: Event) -> bool {
        use tokio::sync::mpsc::error::TrySendError;
        match self.queue.try_send(Item::Event(Box::new(event))) {
            Ok(()) => true,
            Err(TrySendError::Full(Item::Event(event))) => {
                count_lost(&self.failed, &event, "event queue full");
                false
            }
            Err(TrySendError::Closed(Item::Event(event))) => {
                count_lost(&self.failed, &event, "event pump stopped");
                false
            }
            Err(_) => false,
        }
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
    pub fn retry_for(mut self, retry_for: Duration) -> EventPump {
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
                Some(seq) = in_flight.next(), if !in_flight.is_empty() => {
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
                                store.await;
                                seq
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
        while in_flight.next().await.is_some() {}
        for (_, tx) in barriers {
            let _ = tx.send(());
        }
    }
}

/// Counts and logs an event that will never be stored, with what identifies the fire or run it
/// records: the one place that does.
fn count_lost(failed: &prometheus::IntCounter, event: &Event, error: &str) {
    failed.inc();
    tracing::error!(
        error,
        kind = event.kind.as_str(),
        namespace = %event.namespace,
        task = %event.task_id,
        execution_id = event.execution_id.as_deref().unwrap_or_default(),
        nominal_time = event.nominal_time.map(|t| t.timestamp_millis()).unwrap_or_default(),
        "event not stored"
    );
}

/// The `Nats-Msg-Id` of a queued event. A `fire.dispatched` event is named after its execution,
/// so that every scheduler learning that the fire's dispatch is stored can record it: the one
/// whose publish was acknowledged, and one whose publish of the same fire came back a
/// duplicate (a retry after a lost acknowledgement, a new leader re-publishing what its
/// predecessor stored before it stepped down). The stream keeps the first and absorbs the
/// others within its duplicate window. A `task.completed` is named after its task and last
/// fire, for the same reason; a `run.cancelled` after its run (a run ends cancelled once, and
/// a scheduler that cancelled a run its overlap policy replaced tells it again when its
/// predecessor may have died before telling it). Every other event gets an id of its own.
pub fn event_msg_id(event: &Event) -> String {
    match (event.kind, &event.execution_id) {
        (EventKind::FireDispatched, Some(execution_id)) => format!("fire.dispatched:{execution_id}"),
        (EventKind::RunCancelled, Some(execution_id)) => format!("run.cancelled:{execution_id}"),
        (EventKind::TaskCompleted, _) => format!(
            "task.completed:{}.{}:{}",
            event.namespace,
            event.task_id,
            event.nominal_time.map_or(0, |t| t.timestamp_millis())
        ),
        _ => names::event_msg_id(),
    }
}

/// Publishes one event until the stream stores it or `retry_for` has passed; an event given up
/// is logged and counted by the publisher.
async fn store(publisher: EventPublisher, event: Event, dedup_id: bool, retry_for: Duration) {
    let id = dedup_id.then(|| event_msg_id(&event));
    let deadline = tokio::time::Instant::now() + retry_for;
    if let Err(error) = publisher.store_until(&event, id.as_deref(), deadline).await {
        publisher.give_up(&event, &error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dispatched_event_is_named_after_its_execution_and_every_other_event_uniquely() {
        let dispatched = |task: &str, execution: &str| Event {
            execution_id: Some(execution.to_owned()),
            ..Event::new(EventKind::FireDispatched, "ns", task)
        };
        // Two schedulers recording the same dispatch: one id, so the stream keeps one.
        assert_eq!(event_msg_id(&dispatched("a", "e1")), event_msg_id(&dispatched("a", "e1")));
        assert_ne!(event_msg_id(&dispatched("a", "e1")), event_msg_id(&dispatched("a", "e2")));
        // A run ends cancelled once: every telling of it is one event.
        let cancelled = |execution: &str| Event {
            execution_id: Some(execution.to_owned()),
            ..Event::new(EventKind::RunCancelled, "ns", "a")
        };
        assert_eq!(event_msg_id(&cancelled("e1")), event_msg_id(&cancelled("e1")));
        assert_ne!(event_msg_id(&cancelled("e1")), event_msg_id(&cancelled("e2")));
        // Other events (and a dispatched event without an execution) never share an id.
        for kind in [
            EventKind::FireSkipped,
            EventKind::RunStarted,
            EventKind::FireDispatched,
            EventKind::RunCancelled,
        ] {
            let event = Event::new(kind, "ns", "a");
            assert_ne!(event_msg_id(&event), event_msg_id(&event), "{}", kind.as_str());
        }
        let skipped =
            Event { execution_id: Some("e1".to_owned()), ..Event::new(EventKind::FireSkipped, "ns", "a") };
        assert_ne!(event_msg_id(&skipped), event_msg_id(&dispatched("a", "e1")));
    }
}
