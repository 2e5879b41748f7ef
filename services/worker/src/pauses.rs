//! The tasks paused now ([`Pauses`]), followed with one watch of the tasks bucket, so a
//! delivery learns whether its task is paused without a KV read: only the keys of paused tasks
//! are kept (a worker beside 100,000 tasks, none paused, holds an empty set), and each spec's
//! JSON is read for its `paused` flag alone.
//!
//! The watch delivers the last value of every key, then every change; `build` waits for the
//! load to end (the entry whose `delta` is 0) before the worker takes any run.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use async_nats::jetstream::kv;
use jetsched_shared::follow;
use jetsched_shared::names::task_key;
use prometheus::IntCounter;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

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

    /// Opens the watch and loads the paused tasks ([`follow::load`]); returns the watch to
    /// follow.
    pub(crate) async fn load(&self) -> anyhow::Result<kv::Watch> {
        let started = Instant::now();
        let mut keys = 0u64;
        let watch = follow::load(&self.kv, |entry| {
            keys += 1;
            self.apply(entry);
        })
        .await?;
        let paused = self.paused.read().unwrap_or_else(|p| p.into_inner()).len();
        tracing::info!(keys, paused, elapsed = ?started.elapsed(), "paused tasks loaded");
        Ok(watch)
    }

    /// Follows the bucket until `stop` ([`follow::follow`]: the watch is re-opened after an
    /// error, and a re-opened watch delivers every key's last value again).
    pub(crate) async fn follow(self: Arc<Self>, watch: kv::Watch, stop: CancellationToken) {
        follow::follow(self.kv.clone(), watch, stop, |entry| self.apply(entry), self.errors.clone()).await;
    }

    /// Applies a watch entry: a spec's `paused` flag adds or removes its key, a deleted task
    /// is removed. A spec that does not decode counts as running (the registry stores only
    /// valid specs).
    fn apply(&self, entry: &kv::Entry) {
        let paused = entry.operation == kv::Operation::Put
            && serde_json::from_slice::<Flag>(&entry.value).is_ok_and(|flag| flag.paused);
        let mut set = self.paused.write().unwrap_or_else(|p| p.into_inner());
        if paused {
            if !set.contains(&entry.key) {
                set.insert(entry.key.clone());
            }
        } else {
            set.remove(&entry.key);
        }
    }
}
