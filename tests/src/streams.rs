//! Reading a stream back whole, for checks over what the services stored.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use async_nats::jetstream::{self, consumer::AckPolicy, consumer::pull};
use futures::StreamExt;
use tokio::time::Instant;

/// Pause between two attempts of a request JetStream could not answer yet.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What `stream` is now (its configuration and state); panics when JetStream cannot say.
pub async fn stream_info(js: &jetstream::Context, stream: &str) -> jetstream::stream::Info {
    let mut handle = js.get_stream(stream).await.unwrap_or_else(|e| panic!("stream {stream}: {e}"));
    handle.info().await.unwrap_or_else(|e| panic!("info of stream {stream}: {e}")).clone()
}

/// The last message `stream` holds on `subject`; panics when there is none.
pub async fn last_message(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> jetstream::message::StreamMessage {
    let handle = js.get_stream(stream).await.unwrap_or_else(|e| panic!("stream {stream}: {e}"));
    handle.get_last_raw_message_by_subject(subject).await.unwrap_or_else(|e| panic!("last of {subject}: {e}"))
}

/// Every message `stream` holds when the call starts, in stream order, through an ephemeral
/// pull consumer that never acks (so a work-queue stream keeps its messages); fails when fewer
/// than that arrive within `within`.
///
/// JetStream answering "unavailable" (a 503, no responders, no stream leader yet: a cluster
/// right after a node kill) is retried until the deadline, for the stream's info, the consumer
/// and every fetch.
pub async fn read_stream(
    js: &jetstream::Context,
    stream: &str,
    within: Duration,
) -> anyhow::Result<Vec<jetstream::Message>> {
    let deadline = Instant::now() + within;
    let handle =
        retry(deadline, || js.get_stream(stream)).await.with_context(|| format!("stream {stream}"))?;
    let total = retry(deadline, || handle.get_info())
        .await
        .with_context(|| format!("info of stream {stream}"))?
        .state
        .messages;
    let total = usize::try_from(total).context("message count")?;
    let config = pull::Config {
        ack_policy: AckPolicy::Explicit,
        max_ack_pending: i64::try_from(total).unwrap_or(i64::MAX).max(1),
        ack_wait: Duration::from_secs(600),
        inactive_threshold: Duration::from_secs(60),
        ..Default::default()
    };
    let consumer = retry(deadline, || handle.create_consumer(config.clone()))
        .await
        .with_context(|| format!("reader consumer on {stream}"))?;
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        if Instant::now() >= deadline {
            bail!("read only {} of the {total} messages of {stream} within {within:?}", out.len());
        }
        let batch = consumer.fetch().max_messages(5000).expires(Duration::from_millis(500)).messages().await;
        let mut batch = match batch {
            Ok(batch) => batch,
            Err(error) if unavailable(&error) => {
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(error) => return Err(anyhow!("fetch from {stream}: {error}")),
        };
        while let Some(message) = batch.next().await {
            match message {
                Ok(message) => out.push(message),
                // The rest of this batch is lost with the error; the next fetch asks again.
                Err(error) if unavailable(&error) => break,
                Err(error) => return Err(anyhow!("message of {stream}: {error}")),
            }
        }
    }
    let _ = handle.delete_consumer(&consumer.cached_info().name).await;
    Ok(out)
}

/// Runs `call` until it succeeds, fails otherwise than "unavailable", or `deadline` passes
/// (then the last error).
async fn retry<T, E, F, Fut>(deadline: Instant, mut call: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    loop {
        match call().await {
            Err(error) if unavailable(&error) && Instant::now() < deadline => {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            other => return other,
        }
    }
}

/// Whether `error` says JetStream cannot answer right now, rather than that the request is
/// wrong: a 503 status, no responders, JetStream (or the stream's leader) not available, a
/// timed-out request.
fn unavailable(error: &impl std::fmt::Display) -> bool {
    let text = error.to_string().to_lowercase();
    ["503", "no responders", "unavailable", "timed out", "timeout", "no leader", "not available"]
        .iter()
        .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod tests {
    #[test]
    fn unavailable_answers_are_told_apart_from_wrong_requests() {
        for text in [
            "jetstream error: 503 (no responders)",
            "no responders",
            "JetStream system temporarily unavailable (code 503, error code 10008)",
            "request timed out",
        ] {
            assert!(super::unavailable(&text), "{text}");
        }
        for text in ["stream not found (code 404, error code 10059)", "invalid JSON"] {
            assert!(!super::unavailable(&text), "{text}");
        }
    }
}
