//! The pull loop of one queue: permits, pull requests and the batches they return, each
//! message handed to [`crate::delivery::process`] on its own task.
//!
//! Back-pressure: a concurrency permit is taken before each pull, and a pull asks for exactly
//! as many messages as permits are held, so no message waits in a client buffer while its
//! ack_wait runs.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
use futures::StreamExt;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::Names;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::breaker::Breakers;
use crate::config::{RunEvents, RunRecords};
use crate::delivery::process;
use crate::dlq::DeadLetters;
use crate::executor::Executors;
use crate::metrics::Metrics;
use crate::runs::RunStore;

/// Everything a delivery needs, shared by the pull loops and run tasks.
pub(crate) struct Shared {
    pub(crate) names: Names,
    pub(crate) js: jetstream::Context,
    pub(crate) breakers: Arc<Breakers>,
    pub(crate) worker: String,
    pub(crate) runs: RunStore,
    pub(crate) dlq: DeadLetters,
    pub(crate) events: EventPublisher,
    pub(crate) executors: Executors,
    pub(crate) metrics: Metrics,
    pub(crate) progress_interval: Duration,
    pub(crate) dlq_retry_delay: Duration,
    pub(crate) run_events: RunEvents,
    pub(crate) run_records: RunRecords,
    /// Cancelled when the shutdown grace period is over: in-flight attempts stop and are
    /// handed back.
    pub(crate) hard_stop: CancellationToken,
}

/// Pull settings of a queue loop.
pub(crate) struct Pull {
    pub(crate) queue: String,
    pub(crate) consumer: PullConsumer,
    pub(crate) max_batch: usize,
    pub(crate) expires: Duration,
}

/// Pull requests one queue loop keeps outstanding at once. Two, so freed permits are put back
/// to work while the previous batch is still being filled; not more, so that under load
/// permits accumulate into larger batches: with 8, no-op runs averaged 4.5 messages per pull
/// and the server spent a sixth of its CPU on pull requests (2: 13 per pull, 17% more runs/s).
const MAX_OUTSTANDING_PULLS: usize = 2;

/// The wait after a failed pull request, doubling with each failure in a row up to the second.
const PULL_RETRY_FIRST: Duration = Duration::from_millis(200);
const PULL_RETRY_MAX: Duration = Duration::from_millis(6400);

/// Pulls and starts runs until `shutdown`; runs are spawned on `tracker`.
pub(crate) async fn run_queue(
    shared: Arc<Shared>,
    pull: Pull,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let queue: Arc<str> = Arc::from(pull.queue.as_str());
    let pulls = Arc::new(Semaphore::new(MAX_OUTSTANDING_PULLS));
    let batches = TaskTracker::new();
    let mut backoff = Backoff::new(PULL_RETRY_FIRST, PULL_RETRY_MAX);
    loop {
        let slot = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            slot = pulls.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let first = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let mut held: Vec<OwnedSemaphorePermit> = vec![first];
        while held.len() < pull.max_batch {
            match permits.clone().try_acquire_owned() {
                Ok(permit) => held.push(permit),
                Err(_) => break,
            }
        }
        let batch = pull.consumer.batch().max_messages(held.len()).expires(pull.expires).messages().await;
        let batch = match batch {
            Ok(batch) => {
                backoff.reset();
                batch
            }
            Err(error) => {
                shared.metrics.errors.with_label_values(&["pull"]).inc();
                tracing::warn!(%error, queue = %queue, "pull request failed");
                drop(held);
                let delay = backoff.next_delay();
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
        };
        let reader = BatchReader {
            shared: shared.clone(),
            queue: queue.clone(),
            tracker: tracker.clone(),
            shutdown: shutdown.clone(),
        };
        batches.spawn(async move {
            let _slot = slot;
            reader.read(batch, held).await;
        });
    }
    batches.close();
    batches.wait().await;
}

/// Starts a run for each message of one pull batch, with the permits taken for it.
struct BatchReader {
    shared: Arc<Shared>,
    queue: Arc<str>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl BatchReader {
    async fn read(self, mut batch: jetstream::consumer::pull::Batch, mut held: Vec<OwnedSemaphorePermit>) {
        // Read the batch to its end even after shutdown: what arrives then is handed back at
        // once (Nak), not left to wait for ack_wait.
        while let Some(message) = batch.next().await {
            let message = match message {
                Ok(message) => message,
                Err(error) => {
                    self.shared.metrics.errors.with_label_values(&["pull"]).inc();
                    tracing::warn!(%error, queue = %self.queue, "pull stream error");
                    continue;
                }
            };
            if self.shutdown.is_cancelled() {
                if let Err(error) = message.ack_with(AckKind::Nak(None)).await {
                    tracing::warn!(%error, "hand back a run at shutdown");
                }
                continue;
            }
            let Some(permit) = held.pop() else {
                // The server never sends more than asked; be safe anyway.
                let _ = message.ack_with(AckKind::Nak(None)).await;
                continue;
            };
            let shared = self.shared.clone();
            let queue = self.queue.clone();
            self.tracker.spawn(async move {
                let _permit = permit;
                // Boxed: a delivery's state machine is kilobytes, and an unboxed one was
                // copied several times per spawn (half of the 11% of a worker's CPU spent in memmove).
                Box::pin(process(&shared, &queue, message)).await;
            });
        }
    }
}
