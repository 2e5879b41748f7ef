//! The states of the queues this worker serves, followed from the queues bucket: whether
//! operators paused each one. A queue's lanes read their queue's flag ([`QueueStates::flag`])
//! and pull nothing while it is set; `jetsched_queue_paused{queue}` shows it.
//!
//! Loaded in `build`, before any lane pulls, so a worker starting while a queue is paused
//! never pulls from it; then followed by one watch (the shared follower), so a pause reaches
//! the lanes within the watch's latency.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::jetstream::kv;
use jetsched_shared::follow;
use jetsched_shared::wire::QueueState;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The paused flag of every queue this worker serves.
pub(crate) struct QueueStates {
    kv: kv::Store,
    flags: HashMap<String, watch::Sender<bool>>,
    metrics: Metrics,
}

impl QueueStates {
    /// Flags for `queues`, all running until [`QueueStates::load`] reads the bucket.
    pub(crate) fn new(kv: kv::Store, queues: &[String], metrics: Metrics) -> QueueStates {
        let flags = queues.iter().map(|queue| (queue.clone(), watch::Sender::new(false))).collect();
        let states = QueueStates { kv, flags, metrics };
        for queue in queues {
            states.metrics.queue_paused.with_label_values(&[queue]).set(0);
        }
        states
    }

    /// The paused flag of `queue` (a queue this worker does not serve is never paused here).
    pub(crate) fn flag(&self, queue: &str) -> watch::Receiver<bool> {
        self.flags.get(queue).map_or_else(|| watch::Sender::new(false).subscribe(), watch::Sender::subscribe)
    }

    /// Reads every queue's state; returns the watch to [`QueueStates::follow`].
    pub(crate) async fn load(&self) -> anyhow::Result<kv::Watch> {
        follow::load(&self.kv, |entry| self.seen(entry)).await
    }

    /// Follows the bucket until `stop`.
    pub(crate) async fn follow(self: Arc<Self>, watch: kv::Watch, stop: CancellationToken) {
        let errors = self.metrics.errors.with_label_values(&["queue_watch"]);
        follow::follow(self.kv.clone(), watch, stop, |entry| self.seen(entry), errors).await;
    }

    /// A key's new value: paused when it holds a state saying so. A deleted key, or a value
    /// that is not a state, leaves the queue running (a pause must be said clearly).
    fn seen(&self, entry: &kv::Entry) {
        let Some(flag) = self.flags.get(&entry.key) else { return };
        let state = (entry.operation == kv::Operation::Put)
            .then(|| serde_json::from_slice::<QueueState>(&entry.value))
            .transpose();
        let paused = match state {
            Ok(state) => state.is_some_and(|state| state.paused),
            Err(error) => {
                tracing::warn!(%error, queue = %entry.key, "queue state unreadable; the queue runs");
                false
            }
        };
        let changed = flag.send_if_modified(|now| std::mem::replace(now, paused) != paused);
        if changed {
            tracing::info!(queue = %entry.key, paused, "queue state changed");
        }
        self.metrics.queue_paused.with_label_values(&[&entry.key]).set(i64::from(paused));
    }
}
