//! One watch of the tasks bucket per registry replica, feeding every index the registry keeps
//! of the specs (the breakers' users, the dependency graph): its history first, then each
//! change, each spec parsed once, the watch opened again from the next revision after it fails
//! or ends.
//!
//! The feed says how far it has applied the bucket (`seen`, a revision: the bucket stream's
//! sequence) and whether it has applied every spec stored when it first opened (`loaded`), so
//! that a reader can wait until the indexes reflect every write made before it asked.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv;
use futures::StreamExt;
use jetsched_shared::spec::TaskSpec;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A pause before the watch is opened again after it ended or failed.
const REOPEN: Duration = Duration::from_millis(500);

/// Something kept from the tasks bucket.
pub(crate) trait Index: Send + Sync {
    /// One entry of the bucket, in revision order: `spec` is its spec when it is a put whose
    /// value parses, `None` for a delete, a purge or a value that does not parse.
    fn apply(&self, entry: &kv::Entry, spec: Option<&Arc<TaskSpec>>);
}

/// How far the feed has applied the bucket. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Feed {
    /// The last revision applied.
    seen: Arc<watch::Sender<u64>>,
    /// True once every spec stored when the watch first opened was applied.
    loaded: Arc<watch::Sender<bool>>,
}

impl Default for Feed {
    fn default() -> Feed {
        Feed { seen: Arc::new(watch::Sender::new(0)), loaded: Arc::new(watch::Sender::new(false)) }
    }
}

impl Feed {
    /// Resolves once the specs stored when the watch first opened are all applied.
    pub(crate) async fn loaded(&self) {
        let mut loaded = self.loaded.subscribe();
        let _ = loaded.wait_for(|loaded| *loaded).await;
    }

    /// The last revision applied.
    pub(crate) fn seen(&self) -> u64 {
        *self.seen.borrow()
    }

    /// Whether, within `within`, the feed has applied every write `tasks` holds now: the bucket
    /// stream's last sequence, read from its leader (an empty bucket: at once). A reader that
    /// asks after a write was answered then finds it in the indexes.
    pub(crate) async fn caught_up(&self, tasks: &kv::Store, within: Duration) -> anyhow::Result<bool> {
        let mut stream = tasks.stream.clone();
        let state = &stream.info().await.context("read the tasks bucket's stream info")?.state;
        if state.messages == 0 {
            return Ok(true);
        }
        let last = state.last_sequence;
        let mut seen = self.seen.subscribe();
        let reached = tokio::time::timeout(within, seen.wait_for(|seen| *seen >= last)).await;
        Ok(matches!(reached, Ok(Ok(_))))
    }

    /// Follows `tasks` into `indexes` until `shutdown`.
    pub(crate) async fn follow(
        self,
        tasks: kv::Store,
        indexes: Vec<Arc<dyn Index>>,
        shutdown: CancellationToken,
    ) {
        loop {
            let followed = tokio::select! {
                _ = shutdown.cancelled() => return,
                followed = self.follow_once(&tasks, &indexes) => followed,
            };
            match followed {
                Ok(()) => tracing::debug!("tasks watch ended; opening it again"),
                Err(error) => tracing::warn!(error = format!("{error:#}"), "following the tasks bucket"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(REOPEN) => {}
            }
        }
    }

    async fn follow_once(&self, tasks: &kv::Store, indexes: &[Arc<dyn Index>]) -> anyhow::Result<()> {
        let seen = self.seen();
        let mut watch = if seen == 0 {
            tasks.watch_with_history(">").await
        } else {
            tasks.watch_all_from_revision(seen + 1).await
        }
        .context("open the tasks watch")?;
        if !*self.loaded.borrow() {
            // An empty bucket delivers nothing: loaded at once. Otherwise at the entry that is
            // the last one stored when the watch opened (`delta` 0).
            let mut stream = tasks.stream.clone();
            let info = stream.info().await.context("read the tasks bucket's stream info")?;
            if info.state.messages == 0 {
                self.loaded.send_replace(true);
            }
        }
        while let Some(entry) = watch.next().await {
            let entry = entry.context("read the tasks watch")?;
            if entry.revision > self.seen() {
                let spec = match entry.operation {
                    kv::Operation::Put => TaskSpec::parse(&entry.value).ok().map(Arc::new),
                    kv::Operation::Delete | kv::Operation::Purge => None,
                };
                for index in indexes {
                    index.apply(&entry, spec.as_ref());
                }
                self.seen.send_replace(entry.revision);
            }
            if entry.delta == 0 && !*self.loaded.borrow() {
                self.loaded.send_replace(true);
            }
        }
        Ok(())
    }
}
