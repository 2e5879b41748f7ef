//! Alert channels: the log, webhooks and the NATS alert subject. Each channel drains a bounded
//! queue of its own in its own task, so a slow or down webhook never blocks the consumer or
//! another channel: when a channel's queue is full, new messages for it are dropped and
//! counted (`jetsched_alert_channel_dropped_total`).

pub(crate) mod log;
pub(crate) mod nats;
pub(crate) mod webhook;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use jetsched_shared::alert::AlertMessage;
use jetsched_shared::backoff::Backoff;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// One way of delivering a message. `deliver` does its own retries; an error means the
/// channel gave up on the message.
pub(crate) trait Channel: Send + Sync + 'static {
    fn name(&self) -> String;
    fn deliver(&self, message: &AlertMessage) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Handles to every channel's queue.
pub(crate) struct Channels {
    queues: Vec<(String, mpsc::Sender<Arc<AlertMessage>>)>,
    metrics: Metrics,
}

impl Channels {
    pub(crate) fn new(metrics: Metrics) -> Channels {
        Channels { queues: Vec::new(), metrics }
    }

    /// Starts `channel`'s task on `tracker`; it ends once every sender is dropped and its
    /// queue is drained.
    pub(crate) fn add<C: Channel>(&mut self, channel: C, capacity: usize, tracker: &TaskTracker) {
        let name = channel.name();
        let (tx, mut rx) = mpsc::channel::<Arc<AlertMessage>>(capacity.max(1));
        let metrics = self.metrics.clone();
        let task_name = name.clone();
        tracker.spawn(async move {
            while let Some(message) = rx.recv().await {
                match channel.deliver(&message).await {
                    Ok(()) => metrics.sent.with_label_values(&[&message.rule, &task_name]).inc(),
                    Err(error) => {
                        metrics.channel_failures.with_label_values(&[&task_name]).inc();
                        tracing::warn!(channel = %task_name, alert = %message.id, rule = %message.rule, error = format!("{error:#}"), "alert channel gave up on a message");
                    }
                }
            }
        });
        self.queues.push((name, tx));
    }

    /// Queues `message` on every channel without waiting.
    pub(crate) fn send(&self, message: AlertMessage) {
        let message = Arc::new(message);
        for (name, queue) in &self.queues {
            if let Err(error) = queue.try_send(message.clone()) {
                self.metrics.channel_dropped.with_label_values(&[name]).inc();
                tracing::warn!(channel = %name, alert = %message.id, rule = %message.rule, %error, "alert channel queue full or closed: message dropped");
            }
        }
    }
}

/// Runs `attempt` up to `attempts` times, doubling `backoff` between tries (the shared
/// [`Backoff`], uncapped within the attempts given).
pub(crate) async fn with_retries<F, Fut>(
    attempts: u32,
    backoff: Duration,
    mut attempt: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let longest = backoff.saturating_mul(1 << attempts.clamp(1, 20));
    Backoff::new(backoff, longest)
        .retry_at_most(
            attempts,
            |_| attempt(),
            |error: &anyhow::Error, tried, _| {
                tracing::debug!(
                    error = format!("{error:#}"),
                    attempt = tried,
                    "alert delivery failed; retrying"
                );
                true
            },
        )
        .await
        .map_err(|gave_up| gave_up.error.context(format!("gave up after {} attempt(s)", gave_up.attempts)))
}
