//! Which tasks use each breaker key, followed from the tasks bucket so that the breaker API
//! answers without reading every spec (a read of 100,000 specs took about 300 ms a request).
//!
//! Fed by the registry's one watch of the tasks bucket (its history first, then its changes,
//! [`crate::tasks_feed`]), it keeps for every task whose spec names a breaker or counts
//! consecutive failures the bucket keys it uses; a task without either costs nothing. A request
//! first reads the bucket stream's last sequence and waits until the feed has applied it, so an answer reflects every write made before the
//! request, as a full read would. While the watch lags further than [`CATCH_UP`] (it is being
//! re-opened after an outage, or the registry has just started), a request reads the bucket
//! itself instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use jetsched_shared::names::breaker_task_key;
use jetsched_shared::spec::TaskSpec;

use crate::tasks_feed::{Feed, Index};

/// How long a request waits for the watch to reach the bucket's last write before it reads
/// the bucket itself.
const CATCH_UP: Duration = Duration::from_secs(2);

/// Bucket key → `<namespace>/<id>` of the tasks using it.
pub(crate) type Users = BTreeMap<String, Vec<String>>;

/// A task using breakers: its `<namespace>/<id>` and the bucket keys it uses.
type Used = (String, Vec<String>);

/// The tasks using each breaker key, as the follower last saw the tasks bucket.
#[derive(Clone)]
pub(crate) struct BreakerUsers {
    /// Tasks-bucket key → the task's name and the breaker keys it uses (only tasks using one).
    by_entry: Arc<Mutex<HashMap<String, Used>>>,
    /// The tasks bucket's feed: how far it has applied the bucket.
    feed: Feed,
}

impl BreakerUsers {
    /// Empty; `feed` fills it (it is one of the feed's indexes).
    pub(crate) fn new(feed: Feed) -> Self {
        BreakerUsers { by_entry: Arc::default(), feed }
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
    pub(crate) async fn current(&self, store: &kv::Store) -> Option<Users> {
        if !self.feed.caught_up(store, CATCH_UP).await.ok()? {
            return None;
        }
        let mut users = Users::new();
        for (name, keys) in self.by_entry.lock().expect("not poisoned").values() {
            for key in keys {
                users.entry(key.clone()).or_default().push(name.clone());
            }
        }
        users.values_mut().for_each(|tasks| tasks.sort());
        Some(users)
    }
}

impl Index for BreakerUsers {
    fn apply(&self, entry: &kv::Entry, spec: Option<&Arc<TaskSpec>>) {
        let used = spec.and_then(|spec| {
            let keys = Self::keys_of(spec);
            (!keys.is_empty()).then(|| (format!("{}/{}", spec.namespace, spec.id), keys))
        });
        {
            let mut by_entry = self.by_entry.lock().expect("not poisoned");
            match used {
                Some(used) => by_entry.insert(entry.key.clone(), used),
                None => by_entry.remove(&entry.key),
            };
        }
    }
}
