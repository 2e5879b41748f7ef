//! One delivery being handled ([`Delivery`]): the message and what it carries, the run record
//! as last stored, the breaker's admission, and the run events it tells.

use std::time::Duration;

use jetsched_shared::events::EventBatch;
use jetsched_shared::wire::{Dispatch, Event, EventKind};

use super::parts::Parts;
use crate::breaker::Gate;
use crate::message::Received;
use crate::runs::Stored;
use crate::slot::Slot;

/// How long a run event that JetStream did not store is published again (a replicated events
/// stream refuses writes while it elects a new leader, e.g. after a node died) before it is
/// counted in `jetsched_events_failed_total` and logged.
const EVENT_RETRY_FOR: Duration = Duration::from_secs(15);

/// One delivery being handled.
pub(crate) struct Delivery<'a> {
    pub(super) parts: &'a Parts,
    pub(super) queue: &'a str,
    pub(super) received: &'a Received,
    pub(super) dispatch: &'a Dispatch,
    /// The attempt number (1-based): the delivery count, plus the attempts made before a
    /// delay by the breaker.
    pub(super) attempt: u32,
    /// The run record as last stored, once the record store has answered.
    pub(super) stored: Option<Stored>,
    /// How long the attempt ran, if it ran.
    pub(super) elapsed: Option<Duration>,
    /// The breaker's admission of this delivery, if the task has a breaker.
    pub(super) gate: Option<Gate>,
    /// The concurrency slot this delivery holds (its key in the limits bucket).
    pub(super) slot: Option<String>,
    /// The slot is one of the worker's block for the key: no lease of its own, given back to
    /// the block at the end.
    pub(super) from_block: bool,
    /// The run's worker permit: given back while a rate limit holds the run for its start.
    pub(super) permit: &'a mut Slot,
    /// The run events told so far, their acknowledgements awaited at the end.
    events: EventBatch<'a>,
}

impl<'a> Delivery<'a> {
    pub(super) fn new(
        parts: &'a Parts,
        queue: &'a str,
        received: &'a Received,
        dispatch: &'a Dispatch,
        permit: &'a mut Slot,
    ) -> Self {
        Delivery {
            parts,
            queue,
            received,
            dispatch,
            attempt: received.attempt,
            stored: None,
            elapsed: None,
            gate: None,
            slot: None,
            from_block: false,
            permit,
            events: parts.events.batch(),
        }
    }

    /// Publishes a run event, if the worker tells events of its kind (`--run-events`).
    pub(super) async fn tell(&mut self, event: Event) {
        if self.parts.run_events.wants(event.kind) {
            self.events.emit(event).await;
        }
    }

    /// A run event of `kind` about this delivery (attempt `attempt`).
    pub(super) fn event(&self, kind: EventKind, attempt: u32) -> Event {
        let dispatch = self.dispatch;
        Event {
            execution_id: Some(dispatch.execution_id.clone()),
            nominal_time: Some(dispatch.nominal_time),
            trigger: Some(dispatch.trigger),
            attempt: Some(attempt),
            worker: Some(self.parts.worker.clone()),
            revision: Some(dispatch.revision),
            trace_id: dispatch.trace_id.clone(),
            replay_of: dispatch.replay_of.clone(),
            ..Event::new(kind, &dispatch.namespace, &dispatch.task_id)
        }
    }

    /// Ends the delivery: awaits the acknowledgements of the events told (retried through a
    /// leader election).
    pub(super) async fn flush_events(self) {
        self.events.flush(EVENT_RETRY_FOR, &self.parts.hard_stop).await;
    }
}
