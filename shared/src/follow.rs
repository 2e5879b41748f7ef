//! Following a KV bucket: load every key's latest value, then hear of every change, and
//! re-open the watch after an error (the breakers and the queue states of the workers).
//!
//! One ordered watch delivers the last value per key and then the updates (no change is missed
//! between the load and the follow); an empty bucket delivers nothing, so the load first reads
//! the bucket's message count and ends at once on zero, otherwise at the entry whose `delta` is 0.

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv;
use futures::StreamExt;
use prometheus::IntCounter;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;

/// Opens the watch of `kv` and hands every key's latest entry to `seen` (deletes and purges
/// too); returns the watch, positioned after the load, for [`follow`].
pub async fn load(kv: &kv::Store, mut seen: impl FnMut(&kv::Entry)) -> anyhow::Result<kv::Watch> {
    let mut watch = kv.watch_with_history(">").await.with_context(|| format!("watch bucket {}", kv.name))?;
    let mut stream = kv.stream.clone();
    let info = stream.info().await.with_context(|| format!("read stream info of bucket {}", kv.name))?;
    if info.state.messages == 0 {
        return Ok(watch);
    }
    while let Some(entry) = watch.next().await {
        let entry = entry.with_context(|| format!("load bucket {}", kv.name))?;
        seen(&entry);
        if entry.delta == 0 {
            break;
        }
    }
    Ok(watch)
}

/// Hands every change of `kv` to `seen` until `stop`, starting from `watch` (from [`load`]).
/// An error or the end of the watch is logged and counted in `errors`, then the watch is
/// re-opened with backoff; a re-opened watch delivers every key's latest value again, so
/// nothing written meanwhile is missed.
pub async fn follow(
    kv: kv::Store,
    mut watch: kv::Watch,
    stop: CancellationToken,
    mut seen: impl FnMut(&kv::Entry),
    errors: IntCounter,
) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        let next = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            next = watch.next() => next,
        };
        match next {
            Some(Ok(entry)) => {
                backoff.reset();
                seen(&entry);
                continue;
            }
            Some(Err(error)) => tracing::warn!(%error, bucket = %kv.name, "watch failed; re-opening it"),
            None => tracing::warn!(bucket = %kv.name, "watch ended; re-opening it"),
        }
        errors.inc();
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
            match kv.watch_with_history(">").await {
                Ok(fresh) => {
                    watch = fresh;
                    break;
                }
                Err(error) => tracing::warn!(%error, bucket = %kv.name, "re-opening the watch"),
            }
        }
    }
}
