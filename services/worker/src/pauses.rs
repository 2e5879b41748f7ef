//! The tasks paused now ([`Pauses`]), followed with one watch of the tasks bucket, so a
//! delivery learns whether its task is paused without a KV read: only the keys of paused tasks
//! are kept (a worker beside 100,000 tasks, none paused, holds an empty set), and each spec's
//! JSON is read for its `paused` flag alone.
//!
//! The watch delivers the last value of every key, then every change; `build` waits for the
//! load to end (the entry whose `delta` is 0) before the worker takes any run.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::kv;
use futures::StreamExt;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::names::task_key;
use prometheus::IntCounter;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Watch entries applied under one write lock at most.
const CHUNK: usize = 1024;

/// The keys (`<namespace>.<task_id>`) of the tasks paused now.
pub(crate) struct Pauses {
    kv: kv::Store,
    paused: RwLock<HashSet<String>>,
    /// Counts errors of the watch (`jetsched_worker_errors_total{what="pause_watch"}`).
    errors: IntCounter,
}

/// The one field of a spec read here.
#[derive(Deserialize)]
struct Flag {
    #[serde(default)]
    paused: bool,
}

impl Pauses {
    pub(crate) fn new(kv: kv::Store, errors: IntCounter) -> Pauses {
        Pauses { kv, paused: RwLock::new(HashSet::new()), errors }
    }

    /// Whether the task is paused now, as far as the watch has told.
    pub(crate) fn is_paused(&self, namespace: &str, task_id: &str) -> bool {
        let paused = self.paused.read().unwrap_or_else(|p| p.into_inner());
        // The common case, nothing paused, builds no key.
        !paused.is_empty() && paused.contains(&task_key(namespace, task_id))
    }

    /// Opens the watch and loads the paused tasks (the load ends with the entry whose `delta`
    /// is 0, or at once when the bucket is empty); returns the watch to follow.
    pub(crate) async fn load(&self) -> anyhow::Result<kv::Watch> {
        let started = Instant::now();
        let mut watch = self.open().await?;
        let mut stream = self.kv.stream.clone();
        let info =
            stream.info().await.with_context(|| format!("read stream info of bucket {}", self.kv.name))?;
        let mut keys = 0u64;
        if info.state.messages > 0 {
            while let Some(entry) = watch.next().await {
                let entry = entry.with_context(|| format!("load bucket {}", self.kv.name))?;
                keys += 1;
                let last = entry.delta == 0;
                self.apply(std::slice::from_ref(&entry));
                if last {
                    break;
                }
            }
        }
        let paused = self.paused.read().unwrap_or_else(|p| p.into_inner()).len();
        tracing::info!(keys, paused, elapsed = ?started.elapsed(), "paused tasks loaded");
        Ok(watch)
    }

    /// Follows the bucket until `stop`, re-opening the watch after an error (a re-opened watch
    /// delivers every key's last value again, so nothing changed meanwhile is missed).
    pub(crate) async fn follow(self: Arc<Self>, watch: kv::Watch, stop: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut chunks = watch.ready_chunks(CHUNK);
        loop {
            let next = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                next = chunks.next() => next,
            };
            match next {
                Some(chunk) => {
                    let mut entries = Vec::with_capacity(chunk.len());
                    for entry in chunk {
                        match entry {
                            Ok(entry) => entries.push(entry),
                            Err(error) => {
                                self.errors.inc();
                                tracing::warn!(%error, "tasks watch error");
                            }
                        }
                    }
                    backoff.reset();
                    self.apply(&entries);
                    continue;
                }
                None => tracing::warn!("tasks watch ended; re-opening it"),
            }
            loop {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
                match self.open().await {
                    Ok(fresh) => {
                        chunks = fresh.ready_chunks(CHUNK);
                        break;
                    }
                    Err(error) => {
                        self.errors.inc();
                        tracing::warn!(error = format!("{error:#}"), "re-opening the tasks watch");
                    }
                }
            }
        }
    }

    async fn open(&self) -> anyhow::Result<kv::Watch> {
        self.kv.watch_with_history(">").await.with_context(|| format!("watch bucket {}", self.kv.name))
    }

    /// Applies watch entries: a spec's `paused` flag adds or removes its key, a deleted task
    /// is removed. A spec that does not decode counts as running (the registry stores only
    /// valid specs).
    fn apply(&self, entries: &[kv::Entry]) {
        if entries.is_empty() {
            return;
        }
        let flags: Vec<(&str, bool)> = entries
            .iter()
            .map(|entry| {
                let paused = entry.operation == kv::Operation::Put
                    && serde_json::from_slice::<Flag>(&entry.value).is_ok_and(|flag| flag.paused);
                (entry.key.as_str(), paused)
            })
            .collect();
        let mut set = self.paused.write().unwrap_or_else(|p| p.into_inner());
        for (key, paused) in flags {
            if paused {
                if !set.contains(key) {
                    set.insert(key.to_string());
                }
            } else {
                set.remove(key);
            }
        }
    }
}
