//! The one pull loop of the registry's durable consumers (submissions, pause requests): each
//! pull is a fresh request with a short expiry, given up shortly after it, so a pull lost with
//! its consumer's leader (a partition, a node restarting) is replaced within seconds; the
//! consumers' `ack_wait` is short too, with progress acks while a message is handled, so a
//! message the server delivered to a pull given up is redelivered within seconds.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{
    self, AckKind,
    consumer::{AckPolicy, PullConsumer, pull},
};
use futures::StreamExt;
use jetsched_shared::backoff::Backoff;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long the server waits to redeliver a message not acked (nor progressed).
pub(crate) const ACK_WAIT: Duration = Duration::from_secs(5);
/// How often a message being handled is marked in progress: well within [`ACK_WAIT`].
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// The server ends each pull after this long; the next one goes out at once.
const PULL_EXPIRES: Duration = Duration::from_secs(2);
/// A pull the server has not ended this long after its expiry is given up: its request was
/// lost (with the consumer's leader, or on a cut route).
const PULL_GRACE: Duration = Duration::from_secs(1);
/// First pause after a pull error; doubles up to [`RETRY_MAX`] while errors last.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// When a message is to be retried, it (and the rest of its pull) comes back after this.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What became of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Done with (applied, or refused for good): acked.
    Done,
    /// Could not be applied now (the store unavailable): it and the rest of its pull are
    /// redelivered after [`RETRY_AFTER`], in order.
    Retry,
}

/// Handles one message of a consumer.
pub(crate) trait Handler: Send {
    fn handle(&mut self, message: &jetstream::Message) -> impl Future<Output = Verdict> + Send;
}

/// Creates a durable consumer of `stream`, or updates it (an older one may still have a long
/// `ack_wait`).
pub(crate) async fn consumer(
    js: &jetstream::Context,
    stream: &str,
    durable: &str,
    description: &str,
    filter_subject: String,
) -> anyhow::Result<PullConsumer> {
    let handle = js.get_stream(stream).await.with_context(|| format!("open stream {stream}"))?;
    handle
        .create_consumer(pull::Config {
            durable_name: Some(durable.to_string()),
            description: Some(description.to_string()),
            filter_subject,
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_ack_pending: 1000,
            ..Default::default()
        })
        .await
        .with_context(|| format!("ensure consumer {durable} on {stream}"))
}

/// Pulls `consumer` at most `batch` messages at a time and hands them to `handler` one at a
/// time, in order, until `shutdown`. `what` names the messages in logs.
pub(crate) async fn run(
    consumer: PullConsumer,
    what: &'static str,
    batch: usize,
    mut handler: impl Handler,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut pause = Backoff::new(RETRY_FIRST, RETRY_MAX);
    loop {
        let pulled = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            pulled = consumer.batch().max_messages(batch).expires(PULL_EXPIRES).messages() => pulled,
        };
        let failed = match pulled {
            Ok(messages) => match drain(messages, what, &mut handler, &shutdown).await {
                Drained::Stopped => return Ok(()),
                Drained::Ended { delivered } => {
                    if delivered {
                        pause.reset();
                    }
                    false
                }
                Drained::Failed(error) => {
                    tracing::warn!(%error, "{what} pull failed; pulling again");
                    true
                }
            },
            Err(error) => {
                tracing::warn!(%error, "{what} pull could not be sent; pulling again");
                true
            }
        };
        if failed {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(pause.next_delay()) => {}
            }
        }
    }
}

enum Drained {
    Stopped,
    Ended { delivered: bool },
    Failed(async_nats::Error),
}

/// Handles the messages of one pull until the server ends it, or until it is given up.
async fn drain(
    mut messages: pull::Batch,
    what: &'static str,
    handler: &mut impl Handler,
    shutdown: &CancellationToken,
) -> Drained {
    // The time spent handling does not count against the pull's wait.
    let mut give_up = Instant::now() + PULL_EXPIRES + PULL_GRACE;
    let mut delivered = false;
    let mut retrying = false;
    loop {
        let next = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Drained::Stopped,
            _ = tokio::time::sleep_until(give_up) => {
                tracing::debug!("{what} pull not ended by the server; given up");
                return Drained::Ended { delivered };
            }
            next = messages.next() => next,
        };
        let message = match next {
            None => return Drained::Ended { delivered },
            Some(Err(error)) => return Drained::Failed(error),
            Some(Ok(message)) => message,
        };
        delivered = true;
        let started = Instant::now();
        // Once one message must wait, those behind it in the pull wait too, in order.
        if !retrying {
            retrying = handle(handler, &message).await == Verdict::Retry;
        }
        let ack = if retrying { AckKind::Nak(Some(RETRY_AFTER)) } else { AckKind::Ack };
        if let Err(error) = message.ack_with(ack).await {
            tracing::warn!(%error, subject = %message.subject, "{what} ack failed; it will be redelivered");
        }
        give_up += started.elapsed();
    }
}

/// Runs the handler, marking the message in progress meanwhile so it is not redelivered
/// while it is being handled.
async fn handle(handler: &mut impl Handler, message: &jetstream::Message) -> Verdict {
    let handling = handler.handle(message);
    tokio::pin!(handling);
    let mut progress = tokio::time::interval_at(Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tokio::select! {
            verdict = &mut handling => return verdict,
            _ = progress.tick() => {
                if let Err(error) = message.ack_with(AckKind::Progress).await {
                    tracing::debug!(%error, subject = %message.subject, "progress ack failed");
                }
            }
        }
    }
}
