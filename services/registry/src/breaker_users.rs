//! Which tasks use each breaker key, followed from the tasks bucket so that the breaker API
//! answers without reading every spec (a read of 100,000 specs took about 300 ms a request).
//!
//! One watch of the tasks bucket (its history first, then its changes) keeps, for every task
//! whose spec names a breaker or counts consecutive failures, the bucket keys it uses; a task
//! without either costs nothing. A request first reads the bucket stream's last sequence and
//! waits until the watch has seen it, so an answer reflects every write made before the
//! request, as a full read would. While the watch lags further than [`CATCH_UP`] (it is being
//! re-opened after an outage, or the registry has just started), a request reads the bucket
//! itself instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use jetsched_shared::names::breaker_task_key;
use jetsched_shared::spec::TaskSpec;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a request waits for the watch to reach the bucket's last write before it reads
/// the bucket itself.
const CATCH_UP: Duration = Duration::from_secs(2);

/// How long the follower waits before it opens the watch again after it failed or ended.
const REOPEN: Duration = Duration::from_millis(500);

/// Bucket key → `<namespace>/<id>` of the tasks using it.
pub(crate) type Users = BTreeMap<String, Vec<String>>;

/// A task using breakers: its `<namespace>/<id>` and the bucket keys it uses.
type Used = (String, Vec<String>);

/// The tasks using each breaker key, as the follower last saw the tasks bucket.
#[derive(Clone)]
pub(crate) struct BreakerUsers {
    /// Tasks-bucket key → the task's name and the breaker keys it uses (only tasks using one).
    by_entry: Arc<Mutex<HashMap<String, Used>>>,
    /// The last bucket revision (stream sequence) the watch has applied.
    seen: watch::Sender<u64>,
}

impl BreakerUsers {
    pub(crate) fn new() -> Self {
        BreakerUsers { by_entry: Arc::default(), seen: watch::Sender::new(0) }
    }

    /// The breaker keys a spec uses: its breaker's (a named key in the task's namespace; which
    /// keys the workers share is theirs to say, see `breakers::attribute`), and its own key when
    /// it counts consecutive failures.
    pub(crate) fn keys_of(spec: &TaskSpec) -> Vec<String> {
        let mut keys = Vec::new();
        if let Some(breaker) = &spec.breaker {
            keys.push(breaker.bucket_key(&spec.namespace, &spec.id, |_| false));
        }
        if spec.pause_after_failures.is_some() {
            keys.push(breaker_task_key(&spec.namespace, &spec.id));
        }
        keys.dedup();
        keys
    }

    /// Every breaker key's users (sorted), once the watch has applied every write the bucket had
    /// when asked; `None` when it has not within [`CATCH_UP`].
    pub(crate) async fn current(&self, js: &jetstream::Context, store: &kv::Store) -> Option<Users> {
        let mut stream = js.get_stream(&store.stream_name).await.ok()?;
        let state = &stream.info().await.ok()?.state;
        if state.messages == 0 {
            return Some(Users::new());
        }
        let last = state.last_sequence;
        let mut seen = self.seen.subscribe();
        tokio::time::timeout(CATCH_UP, seen.wait_for(|seen| *seen >= last)).await.ok()?.ok()?;
        let mut users = Users::new();
        for (name, keys) in self.by_entry.lock().expect("not poisoned").values() {
            for key in keys {
                users.entry(key.clone()).or_default().push(name.clone());
            }
        }
        users.values_mut().for_each(|tasks| tasks.sort());
        Some(users)
    }

    /// Follows the tasks bucket until `shutdown`: its history first, then every change, the
    /// watch opened again (from the next revision) after it fails or ends.
    pub(crate) async fn follow(self, store: kv::Store, shutdown: CancellationToken) {
        loop {
            let followed = tokio::select! {
                _ = shutdown.cancelled() => return,
                followed = self.follow_once(&store) => followed,
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

    async fn follow_once(&self, store: &kv::Store) -> anyhow::Result<()> {
        let seen = *self.seen.borrow();
        let mut watch = if seen == 0 {
            store.watch_with_history(">").await
        } else {
            store.watch_all_from_revision(seen + 1).await
        }
        .context("open the tasks watch")?;
        while let Some(entry) = watch.next().await {
            self.apply(&entry.context("read the tasks watch")?);
        }
        Ok(())
    }

    fn apply(&self, entry: &kv::Entry) {
        let used = match entry.operation {
            kv::Operation::Put => TaskSpec::parse(&entry.value).ok().and_then(|spec| {
                let keys = Self::keys_of(&spec);
                (!keys.is_empty()).then(|| (format!("{}/{}", spec.namespace, spec.id), keys))
            }),
            kv::Operation::Delete | kv::Operation::Purge => None,
        };
        {
            let mut by_entry = self.by_entry.lock().expect("not poisoned");
            match used {
                Some(used) => by_entry.insert(entry.key.clone(), used),
                None => by_entry.remove(&entry.key),
            };
        }
        self.seen.send_if_modified(|seen| {
            let newer = entry.revision > *seen;
            if newer {
                *seen = entry.revision;
            }
            newer
        });
    }
}
