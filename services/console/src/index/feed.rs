//! The index's feed: one ordered watch of the tasks bucket (last value per key, then every
//! change) applied to the shared index in chunks.

use anyhow::Context;
use async_nats::jetstream::kv::{self, Operation};
use futures::StreamExt;
use jetsched_shared::admin::Readiness;
use jetsched_shared::names::split_task_key;
use tokio_util::sync::CancellationToken;

use super::SharedIndex;
use super::summary::TaskSummary;

/// An opened watch of the tasks bucket and how many messages the bucket held when it opened.
pub(crate) struct IndexFeed {
    watch: kv::Watch,
    messages: u64,
    index: SharedIndex,
    /// Turns true once the initial load is complete.
    loaded: tokio::sync::watch::Sender<bool>,
}

impl IndexFeed {
    /// Opens the watch first, then reads the bucket's size: anything stored after arrives
    /// through the watch.
    pub(crate) async fn open(store: &kv::Store, index: SharedIndex) -> anyhow::Result<IndexFeed> {
        let watch = store.watch_with_history(">").await.context("watch the tasks bucket")?;
        let mut stream = store.stream.clone();
        let info = stream.info().await.context("read the tasks bucket's stream info")?;
        let (loaded, _) = tokio::sync::watch::channel(false);
        Ok(IndexFeed { watch, messages: info.state.messages, index, loaded })
    }

    /// Tells when the initial load is complete.
    pub(crate) fn loaded(&self) -> tokio::sync::watch::Receiver<bool> {
        self.loaded.subscribe()
    }

    /// Follows the bucket until `shutdown`; marks the `task_index` check ready once the initial
    /// load is complete. Write locks are taken per chunk of entries and never held across an
    /// await.
    pub(crate) async fn follow(
        self,
        readiness: Readiness,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let IndexFeed { watch, messages, index, loaded: done } = self;
        let mut loaded = messages == 0;
        readiness.set("task_index", loaded);
        done.send_replace(loaded);
        let mut chunks = watch.ready_chunks(1024);
        loop {
            let chunk = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                chunk = chunks.next() => chunk,
            };
            let Some(chunk) = chunk else { anyhow::bail!("the tasks bucket's watch ended") };
            let mut decoded = Vec::with_capacity(chunk.len());
            for entry in chunk {
                match entry {
                    Ok(entry) => {
                        loaded |= entry.delta == 0;
                        let Some((namespace, id)) = split_task_key(&entry.key) else { continue };
                        let summary = match entry.operation {
                            Operation::Put => TaskSummary::decode(&entry.key, &entry.value, entry.revision),
                            Operation::Delete | Operation::Purge => None,
                        };
                        decoded.push((namespace.to_string(), id.to_string(), summary));
                    }
                    Err(error) => tracing::warn!(%error, "tasks bucket watch"),
                }
            }
            {
                let mut index = index.write().expect("task index lock");
                for (namespace, id, summary) in decoded {
                    match summary {
                        Some(summary) => index.put(summary),
                        None => index.remove(&namespace, &id),
                    }
                }
            }
            if loaded {
                readiness.set("task_index", true);
                done.send_replace(true);
            }
        }
    }
}
