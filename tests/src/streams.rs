//! Reading a stream back whole, for checks over what the services stored.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use async_nats::jetstream::{self, consumer::AckPolicy, consumer::pull};
use futures::StreamExt;

/// Every message `stream` holds when the call starts, in stream order, through an ephemeral
/// pull consumer that never acks (so a work-queue stream keeps its messages); fails when fewer
/// than that arrive within `within`.
pub async fn read_stream(
    js: &jetstream::Context,
    stream: &str,
    within: Duration,
) -> anyhow::Result<Vec<jetstream::Message>> {
    let mut handle = js.get_stream(stream).await.with_context(|| format!("stream {stream}"))?;
    let total = handle.info().await.with_context(|| format!("info of stream {stream}"))?.state.messages;
    let total = usize::try_from(total).context("message count")?;
    let consumer = handle
        .create_consumer(pull::Config {
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: i64::try_from(total).unwrap_or(i64::MAX).max(1),
            ack_wait: Duration::from_secs(600),
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .with_context(|| format!("reader consumer on {stream}"))?;
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        if tokio::time::Instant::now() >= deadline {
            bail!("read only {} of the {total} messages of {stream} within {within:?}", out.len());
        }
        let mut batch = consumer
            .fetch()
            .max_messages(5000)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|e| anyhow!("fetch from {stream}: {e}"))?;
        while let Some(message) = batch.next().await {
            out.push(message.map_err(|e| anyhow!("message of {stream}: {e}"))?);
        }
    }
    let _ = handle.delete_consumer(&consumer.cached_info().name).await;
    Ok(out)
}
